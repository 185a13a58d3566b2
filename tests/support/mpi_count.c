// tests/support/mpi_count.c: PMPI interposition counting the calls that synchronise
// ranks (mpi_count.h).
#include "mpi_count.h"

#include <mpi.h>
#include <stdatomic.h>

static _Atomic uint64_t counts[MPI_COUNT_NKINDS];

static void count(mpi_count_kind k, MPI_Comm comm)
{
    int size = 1;
    if (comm != MPI_COMM_NULL && PMPI_Comm_size(comm, &size) == MPI_SUCCESS && size > 1) {
        atomic_fetch_add_explicit(&counts[k], 1, memory_order_relaxed);
    }
}

void mpi_count_get(mpi_counts *out)
{
    for (int k = 0; k < MPI_COUNT_NKINDS; k++) {
        out->n[k] = atomic_load_explicit(&counts[k], memory_order_relaxed);
    }
}

uint64_t mpi_count_collectives(const mpi_counts *c)
{
    uint64_t n = 0;
    for (int k = 0; k < MPI_COUNT_NKINDS; k++) {
        n += k != MPI_COUNT_ISEND ? c->n[k] : 0;
    }
    return n;
}

mpi_counts mpi_count_sub(const mpi_counts *b, const mpi_counts *a)
{
    mpi_counts d;
    for (int k = 0; k < MPI_COUNT_NKINDS; k++) {
        d.n[k] = b->n[k] - a->n[k];
    }
    return d;
}

int MPI_Allreduce(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm comm)
{
    count(MPI_COUNT_ALLREDUCE, comm);
    return PMPI_Allreduce(s, r, n, t, op, comm);
}

int MPI_Bcast(void *b, int n, MPI_Datatype t, int root, MPI_Comm comm)
{
    count(MPI_COUNT_BCAST, comm);
    return PMPI_Bcast(b, n, t, root, comm);
}

int MPI_Reduce(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, int root, MPI_Comm comm)
{
    count(MPI_COUNT_REDUCE, comm);
    return PMPI_Reduce(s, r, n, t, op, root, comm);
}

int MPI_Gather(const void *s, int sn, MPI_Datatype st, void *r, int rn, MPI_Datatype rt, int root,
               MPI_Comm comm)
{
    count(MPI_COUNT_GATHER, comm);
    return PMPI_Gather(s, sn, st, r, rn, rt, root, comm);
}

int MPI_Gatherv(const void *s, int sn, MPI_Datatype st, void *r, const int rn[], const int rd[],
                MPI_Datatype rt, int root, MPI_Comm comm)
{
    count(MPI_COUNT_GATHER, comm);
    return PMPI_Gatherv(s, sn, st, r, rn, rd, rt, root, comm);
}

int MPI_Allgather(const void *s, int sn, MPI_Datatype st, void *r, int rn, MPI_Datatype rt,
                  MPI_Comm comm)
{
    count(MPI_COUNT_GATHER, comm);
    return PMPI_Allgather(s, sn, st, r, rn, rt, comm);
}

int MPI_Scatterv(const void *s, const int sn[], const int sd[], MPI_Datatype st, void *r, int rn,
                 MPI_Datatype rt, int root, MPI_Comm comm)
{
    count(MPI_COUNT_SCATTER, comm);
    return PMPI_Scatterv(s, sn, sd, st, r, rn, rt, root, comm);
}

int MPI_Barrier(MPI_Comm comm)
{
    count(MPI_COUNT_BARRIER, comm);
    return PMPI_Barrier(comm);
}

int MPI_Isend(const void *b, int n, MPI_Datatype t, int dest, int tag, MPI_Comm comm,
              MPI_Request *req)
{
    int me = -1;
    if (dest != MPI_PROC_NULL && PMPI_Comm_rank(comm, &me) == MPI_SUCCESS && dest != me) {
        atomic_fetch_add_explicit(&counts[MPI_COUNT_ISEND], 1, memory_order_relaxed);
    }
    return PMPI_Isend(b, n, t, dest, tag, comm, req);
}
