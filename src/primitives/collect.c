// primitives/collect.c: gathering the boxed pieces of a distributed tensor onto one
// rank and scattering them back (parameters for checkpoints and exports, test data).
// Not on any training path: it allocates a staging buffer on the root per call. A
// failure on the root (an allocation) is agreed on before each exchange, so it fails
// every rank instead of leaving them in MPI_Gather(v)/MPI_Scatterv.
#include <limits.h>

#include "ddl/agree.h"
#include "ddl/base.h"
#include "ddl/collect.h"
#include "partition/mpi_check.h"

// ---- gather / scatter of boxes -------------------------------------------------

static MPI_Datatype mpi_type(ddl_dtype dt)
{
    return dt == DDL_F64 ? MPI_DOUBLE : MPI_FLOAT;
}

// Exchanges every rank's box with root; fills counts/displacements (elements) on root.
static ddl_status gather_box_table(MPI_Comm comm, int root, const ddl_box *box, int64_t **table,
                                   int **counts, int **displs, int *size_out)
{
    int size, rank;
    DDL_CHECK_MPI(MPI_Comm_size(comm, &size));
    DDL_CHECK_MPI(MPI_Comm_rank(comm, &rank));
    int64_t mine[2 * DDL_MAX_DIMS + 1] = {0};
    mine[0]                            = box->ndim;
    for (int d = 0; d < box->ndim; d++) {
        mine[1 + d]               = box->start[d];
        mine[1 + DDL_MAX_DIMS + d] = box->stop[d];
    }
    *table        = NULL;
    *counts       = NULL;
    *displs       = NULL;
    ddl_status st = DDL_OK;
    if (rank == root) {
        *table  = ddl_malloc(sizeof(int64_t) * (size_t)size * (2 * DDL_MAX_DIMS + 1));
        *counts = ddl_malloc(sizeof(int) * (size_t)size);
        *displs = ddl_malloc(sizeof(int) * (size_t)size);
        if (*table == NULL || *counts == NULL || *displs == NULL) {
            st = ddl_set_error(DDL_ENOMEM, "gather: out of memory");
        }
    }
    // The root's failures reach every rank before the exchanges (ddl_agree), so no rank
    // waits in a collective the root never joins.
    st = ddl_agree(comm, st);
    if (st == DDL_OK &&
        MPI_Gather(mine, 2 * DDL_MAX_DIMS + 1, MPI_INT64_T, *table, 2 * DDL_MAX_DIMS + 1,
                   MPI_INT64_T, root, comm) != MPI_SUCCESS) {
        st = ddl_set_error(DDL_EMPI, "gather: MPI_Gather of the boxes failed");
    }
    if (st == DDL_OK && rank == root) {
        int64_t off = 0;
        for (int r = 0; r < size && st == DDL_OK; r++) {
            const int64_t *e = *table + (size_t)r * (2 * DDL_MAX_DIMS + 1);
            int64_t        n = 1;
            for (int d = 0; d < e[0]; d++) {
                int64_t ext = e[1 + DDL_MAX_DIMS + d] - e[1 + d];
                n *= ext > 0 ? ext : 0;
            }
            if (off + n > INT_MAX) {
                st = ddl_set_error(DDL_EINVAL, "gather: more than INT_MAX elements");
            } else {
                (*counts)[r] = (int)n;
                (*displs)[r] = (int)off;
                off += n;
            }
        }
    }
    st = ddl_agree(comm, st);
    if (st != DDL_OK) {
        ddl_free(*table);
        ddl_free(*counts);
        ddl_free(*displs);
        *table  = NULL;
        *counts = NULL;
        *displs = NULL;
        return st;
    }
    *size_out = size;
    return DDL_OK;
}

static ddl_box table_box(const int64_t *table, int r)
{
    const int64_t *e = table + (size_t)r * (2 * DDL_MAX_DIMS + 1);
    ddl_box        b = {.ndim = (int)e[0]};
    for (int d = 0; d < b.ndim; d++) {
        b.start[d] = e[1 + d];
        b.stop[d]  = e[1 + DDL_MAX_DIMS + d];
    }
    return b;
}

ddl_status ddl_gather_boxes(MPI_Comm comm, int root, const ddl_tensor_t *local, const ddl_box *box,
                            const ddl_shape *global, ddl_tensor_t *global_out)
{
    int64_t   *table;
    int       *counts, *displs, size, rank;
    ddl_status st = gather_box_table(comm, root, box, &table, &counts, &displs, &size);
    if (st != DDL_OK) {
        return st;
    }
    MPI_Comm_rank(comm, &rank);
    void *flat = NULL;
    if (rank == root) {
        flat = ddl_malloc((size_t)(displs[size - 1] + counts[size - 1]) * ddl_dtype_size(local->dtype) + 1);
        if (flat == NULL) {
            st = ddl_set_error(DDL_ENOMEM, "gather: out of memory");
        }
    }
    st = ddl_agree(comm, st);
    if (st != DDL_OK) {
        ddl_free(table);
        ddl_free(counts);
        ddl_free(displs);
        return st;
    }
    int n = (int)ddl_box_numel(box);
    int rc = MPI_Gatherv(local->data, n, mpi_type(local->dtype), flat, counts, displs,
                         mpi_type(local->dtype), root, comm);
    if (rc != MPI_SUCCESS && st == DDL_OK) {
        st = ddl_set_error(DDL_EMPI, "gather: MPI_Gatherv failed");
    }
    if (rank == root && st == DDL_OK) {
        (void)global;
        size_t es = ddl_dtype_size(local->dtype);
        for (int r = 0; r < size; r++) {
            ddl_box b = table_box(table, r);
            if (counts[r] > 0) {
                ddl_tensor_unpack(global_out, &b, (char *)flat + (size_t)displs[r] * es);
            }
        }
    }
    ddl_free(flat);
    ddl_free(table);
    ddl_free(counts);
    ddl_free(displs);
    return st;
}

ddl_status ddl_scatter_boxes(MPI_Comm comm, int root, const ddl_tensor_t *global_in,
                             const ddl_box *box, const ddl_shape *global, ddl_tensor_t *local)
{
    (void)global;
    int64_t   *table;
    int       *counts, *displs, size, rank;
    ddl_status st = gather_box_table(comm, root, box, &table, &counts, &displs, &size);
    if (st != DDL_OK) {
        return st;
    }
    MPI_Comm_rank(comm, &rank);
    void  *flat = NULL;
    size_t es   = ddl_dtype_size(local->dtype);
    if (rank == root) {
        flat = ddl_malloc((size_t)(displs[size - 1] + counts[size - 1]) * es + 1);
        if (flat == NULL) {
            st = ddl_set_error(DDL_ENOMEM, "scatter: out of memory");
        } else {
            for (int r = 0; r < size; r++) {
                ddl_box b = table_box(table, r);
                if (counts[r] > 0) {
                    ddl_tensor_pack(global_in, &b, (char *)flat + (size_t)displs[r] * es);
                }
            }
        }
    }
    st = ddl_agree(comm, st);
    if (st != DDL_OK) {
        ddl_free(table);
        ddl_free(counts);
        ddl_free(displs);
        return st;
    }
    int n  = (int)ddl_box_numel(box);
    int rc = MPI_Scatterv(flat, counts, displs, mpi_type(local->dtype), local->data, n,
                          mpi_type(local->dtype), root, comm);
    if (rc != MPI_SUCCESS && st == DDL_OK) {
        st = ddl_set_error(DDL_EMPI, "scatter: MPI_Scatterv failed");
    }
    ddl_free(flat);
    ddl_free(table);
    ddl_free(counts);
    ddl_free(displs);
    return st;
}
