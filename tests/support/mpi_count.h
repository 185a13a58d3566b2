// tests/support/mpi_count.h: counts of the MPI calls that synchronise ranks, taken by
// PMPI interposition (mpi_count.c defines MPI_Allreduce & co. and forwards each to its
// PMPI_ twin). Compile mpi_count.c into the executable itself: its definitions then take
// the place of libmpi's for every caller, the engine's static libraries included.
//
// Only calls on a communicator of more than one rank count: a broadcast to oneself
// synchronises nothing. Point-to-point messages count by MPI_Isend to another rank.
#ifndef DDL_TEST_MPI_COUNT_H
#define DDL_TEST_MPI_COUNT_H

#include <stdint.h>

typedef enum {
    MPI_COUNT_ALLREDUCE,
    MPI_COUNT_BCAST,
    MPI_COUNT_REDUCE,
    MPI_COUNT_GATHER,  // MPI_Gather, MPI_Gatherv, MPI_Allgather
    MPI_COUNT_SCATTER, // MPI_Scatterv
    MPI_COUNT_BARRIER,
    MPI_COUNT_ISEND, // messages to another rank
    MPI_COUNT_NKINDS
} mpi_count_kind;

typedef struct mpi_counts {
    uint64_t n[MPI_COUNT_NKINDS];
} mpi_counts;

// The counts so far in this process.
void mpi_count_get(mpi_counts *out);
// The collectives among them (every kind but MPI_COUNT_ISEND).
uint64_t mpi_count_collectives(const mpi_counts *c);
// b - a, kind by kind.
mpi_counts mpi_count_sub(const mpi_counts *b, const mpi_counts *a);

#endif
