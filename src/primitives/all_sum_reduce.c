// primitives/all_sum_reduce.c: AllSumReduce over some axes of a partition P.
//
// Math. For a rank with coordinate c in P, let G(c) be the ranks whose coordinates
// agree with c on every axis NOT listed in `axes` (the kept axes); |G| is the product
// of P's extents over `axes`. With x_c the local tensor of rank c (local shape S):
//
//     y_c = Σ_{c' ∈ G(c)} x_{c'}            (forward, A)
//
// A is symmetric (every rank of a group receives the same sum of the same terms), so
// A* = A and the adjoint runs the same reduction on dy. Equivalently A = B∘R: a
// sum-reduce onto one rank of each group followed by a broadcast back.
//
// Shapes. x and y are S on P's ranks and zero-volume elsewhere.
//
// Collectivity. Create is collective over P's ranks (MPI_Comm_split of P's
// communicator, colour = row-major index of c over the kept axes, key = rank in P, so a
// group's ranks are ordered as in P). Forward and adjoint are collective over each
// group (MPI_Allreduce, SUM, in chunks of at most ddl__mpi_max_count() elements). With
// naxes == 0, or when the listed axes all have extent 1, every group is a single rank:
// no communicator is made and forward and adjoint are local copies. Ranks outside P
// make no MPI call at all.
#include <string.h>

#include "ddl/agree.h"
#include "ddl/base.h"
#include "ddl/primitives.h"
#include "partition/mpi_check.h"
#include "primitives/bcast_reduce.h"
#include "primitives/traffic.h"

// Everything is decided in create; forward and adjoint only read the plan.
struct ddl_all_sum_reduce {
    bool         active;      // this rank is in P
    int          group_size;  // |G|: ranks summed together
    MPI_Comm     comm;        // over G; MPI_COMM_NULL when inactive or |G| == 1
    ddl_dtype    dt;
    MPI_Datatype mpi_dt;
    ddl_shape    shape;       // local shape: S when active, zero-volume otherwise
    int64_t      n;           // elements of S
    int64_t      max_count;   // elements per MPI call
};

// Validates axes against P's ndim: each in [0, ndim), none repeated; the order does
// not matter. Marks the reduced axes in `reduced` (ndim entries). Depends only on the
// arguments, so every rank (member of P or not) reaches the same verdict.
static ddl_status check_axes(int ndim, int naxes, const int *axes, bool *reduced)
{
    DDL_REQUIRE(naxes >= 0 && naxes <= ndim, DDL_EINVAL,
                "all_sum_reduce: naxes = %d outside [0, %d] (P has %d dims)", naxes, ndim, ndim);
    DDL_REQUIRE(naxes == 0 || axes != NULL, DDL_EINVAL,
                "all_sum_reduce: axes is NULL but naxes = %d", naxes);
    for (int i = 0; i < ndim; i++) {
        reduced[i] = false;
    }
    for (int k = 0; k < naxes; k++) {
        DDL_REQUIRE(axes[k] >= 0 && axes[k] < ndim, DDL_EINVAL,
                    "all_sum_reduce: axes[%d] = %d outside [0, %d)", k, axes[k], ndim);
        DDL_REQUIRE(!reduced[axes[k]], DDL_EINVAL,
                    "all_sum_reduce: axis %d is listed twice", axes[k]);
        reduced[axes[k]] = true;
    }
    return DDL_OK;
}

// Collective over P's ranks when the groups have more than one member (one
// MPI_Comm_split); ranks outside P return at once with a plan that does nothing.
ddl_status ddl_all_sum_reduce_create(const ddl_partition_t *P, int naxes, const int *axes,
                                     ddl_dtype dt, const ddl_shape *shape,
                                     ddl_all_sum_reduce_t **out)
{
    DDL_REQUIRE(P != NULL, DDL_EINVAL, "all_sum_reduce: P is NULL");
    DDL_REQUIRE(shape != NULL, DDL_EINVAL, "all_sum_reduce: shape is NULL");
    DDL_REQUIRE(out != NULL, DDL_EINVAL, "all_sum_reduce: out is NULL");
    int  ndim = ddl_partition_ndim(P);
    bool reduced[DDL_MAX_DIMS];
    DDL_CHECK(check_axes(ndim, naxes, axes, reduced));
    DDL_CHECK(ddl__check_plan_shape("all_sum_reduce", dt, shape));

    // Everything above depends only on the arguments, so every rank agrees; the group
    // size too, so either all members split P's communicator or none does.
    const int *pshape     = ddl_partition_shape(P);
    int        group_size = 1;
    for (int i = 0; i < ndim; i++) {
        if (reduced[i]) {
            group_size *= pshape[i];
        }
    }

    ddl_all_sum_reduce_t *a = ddl_calloc(1, sizeof *a);
    // P's members agree on the plan's allocation before the split, so that one member's
    // failure fails them all instead of leaving them in MPI_Comm_split.
    ddl_status ast =
        a != NULL ? DDL_OK : ddl_set_error(DDL_ENOMEM, "all_sum_reduce: out of memory for the plan");
    if (ddl_partition_active(P)) {
        ast = ddl_agree(ddl_partition_comm(P), ast);
    }
    if (ast != DDL_OK) {
        ddl_free(a);
        return ast;
    }
    a->active     = ddl_partition_active(P);
    a->group_size = group_size;
    a->comm       = MPI_COMM_NULL;
    a->dt         = dt;
    a->mpi_dt     = ddl__mpi_dtype(dt);
    a->shape      = a->active ? *shape : ddl__zero_shape(shape);
    a->n          = ddl_shape_numel(shape);
    a->max_count  = ddl__mpi_max_count();

    if (a->active && group_size > 1) {
        // Colour: row-major flat index of my coordinate over the kept axes, so two
        // ranks share a group exactly when they agree on every kept axis. The key
        // (my rank in P) keeps P's row-major order inside each group.
        const int *idx    = ddl_partition_index(P);
        int        colour = 0;
        for (int i = 0; i < ndim; i++) {
            if (!reduced[i]) {
                colour = colour * pshape[i] + idx[i];
            }
        }
        int rc = MPI_Comm_split(ddl_partition_comm(P), colour, ddl_partition_rank(P), &a->comm);
        if (rc == MPI_SUCCESS) {
            rc = MPI_Comm_set_errhandler(a->comm, MPI_ERRORS_RETURN);
        }
        if (rc != MPI_SUCCESS) {
            char msg[MPI_MAX_ERROR_STRING];
            int  len = 0;
            MPI_Error_string(rc, msg, &len);
            ddl_all_sum_reduce_destroy(&a);
            return ddl_set_error(DDL_EMPI, "all_sum_reduce: MPI_Comm_split failed: %s", msg);
        }
    }
    *out = a;
    return DDL_OK;
}

// Frees the group communicator (if any); NULL-safe; sets *a to NULL.
void ddl_all_sum_reduce_destroy(ddl_all_sum_reduce_t **a)
{
    if (a == NULL || *a == NULL) {
        return;
    }
    if ((*a)->comm != MPI_COMM_NULL) {
        MPI_Comm_free(&(*a)->comm);
    }
    ddl_free(*a);
    *a = NULL;
}

// S on P's ranks, zero-volume elsewhere (the shape of x, y, dy and dx alike).
ddl_shape ddl_all_sum_reduce_shape(const ddl_all_sum_reduce_t *a)
{
    return a->shape;
}

// y = Σ_G x, shared by forward and adjoint. In place (x and y the same memory) is
// allowed and uses MPI_IN_PLACE.
static ddl_status all_sum(const ddl_all_sum_reduce_t *a, const ddl_tensor_t *x, ddl_tensor_t *y,
                          const char *op, ddl_traffic_pass pass)
{
    DDL_REQUIRE(a != NULL, DDL_EINVAL, "%s: plan is NULL", op);
    DDL_CHECK(ddl__check_tensor(op, "input", x, a->dt, &a->shape));
    DDL_CHECK(ddl__check_tensor(op, "output", y, a->dt, &a->shape));
    // Traffic: my tensor to each of the g-1 others and theirs to me (traffic.c).
    uint64_t moved = a->active && a->comm != MPI_COMM_NULL
                         ? (uint64_t)(a->group_size - 1) * (uint64_t)a->n * ddl_dtype_size(a->dt)
                         : 0;
    ddl__traffic_add(DDL_TRAFFIC_ALL_SUM_REDUCE, pass, moved, moved);
    if (!a->active || a->n == 0) {
        return DDL_OK;  // nothing here, and every member of my group agrees on n
    }
    size_t esz = ddl_dtype_size(a->dt);
    if (a->comm == MPI_COMM_NULL) {
        // A group of one: the sum is my own tensor.
        if (x->data != y->data) {
            memcpy(y->data, x->data, (size_t)a->n * esz);
        }
        return DDL_OK;
    }
    bool in_place = x->data == y->data;
    for (int64_t off = 0; off < a->n; off += a->max_count) {
        int64_t     c = a->n - off < a->max_count ? a->n - off : a->max_count;
        const void *s = in_place ? MPI_IN_PLACE : (const char *)x->data + (size_t)off * esz;
        DDL_CHECK_MPI(MPI_Allreduce(s, (char *)y->data + (size_t)off * esz, (int)c, a->mpi_dt,
                                    MPI_SUM, a->comm));
    }
    return DDL_OK;
}

// y = A x. Collective over my group.
ddl_status ddl_all_sum_reduce_forward(const ddl_all_sum_reduce_t *a, const ddl_tensor_t *x,
                                      ddl_tensor_t *y)
{
    DDL_TRAFFIC_TIMED_RETURN(DDL_TRAFFIC_ALL_SUM_REDUCE, DDL_TRAFFIC_FORWARD,
                             all_sum(a, x, y, "all_sum_reduce forward", DDL_TRAFFIC_FORWARD));
}

ddl_status ddl_all_sum_reduce_adjoint(const ddl_all_sum_reduce_t *a, const ddl_tensor_t *dy,
                                      ddl_tensor_t *dx)
{
    // Self-adjoint: the same group sum applied to dy.
    DDL_TRAFFIC_TIMED_RETURN(DDL_TRAFFIC_ALL_SUM_REDUCE, DDL_TRAFFIC_ADJOINT,
                             all_sum(a, dy, dx, "all_sum_reduce adjoint", DDL_TRAFFIC_ADJOINT));
}
