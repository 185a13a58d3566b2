// primitives/sum_reduce.c: SumReduce P_x -> P_y, the adjoint of Broadcast.
//
// Math. DistDL's reduction rules give every P_x rank i a destination d(i) in P_y (the
// P_y rank of the same colour; see ddl_group_pair_reduce). With x_i the local tensor of
// P_x rank i and y_j that of P_y rank j, all of the same local shape S:
//
//     y_j  = Σ_{i : d(i) = j} x_i           (forward,  R; zero when no i maps to j)
//     dx_i = dy_{d(i)}                      (adjoint,  R*: a broadcast back onto P_x)
//
// <R x, dy> = Σ_j <Σ_{d(i)=j} x_i, dy_j> = Σ_i <x_i, dy_{d(i)}> = <x, R* dy>.
//
// Shapes. x is S on P_x ranks and zero-volume elsewhere; y is S on P_y ranks and
// zero-volume elsewhere.
//
// Collectivity. Create is collective over P_x ∪ P_y; forward and adjoint over the
// groups of each rank (one per P_y rank: it, at comm rank 0, and the P_x ranks that
// reduce into it), issued in root order as for Broadcast.
//
// The execution is Broadcast's, with the roles of the partitions swapped: the roots
// are the P_y ranks, so the forward is the fan-in (MPI_Reduce, SUM) and the adjoint the
// fan-out (MPI_Bcast) of primitives/bcast_reduce.h, written once in broadcast.c.
#include <stddef.h>

#include "ddl/base.h"
#include "ddl/primitives.h"
#include "partition/mpi_check.h"
#include "primitives/bcast_reduce.h"
#include "primitives/traffic.h"

struct ddl_sum_reduce {
    ddl__bcast_reduce br;  // roots = P_y ranks, leaves = P_x ranks
};

ddl_status ddl_sum_reduce_create(const ddl_partition_t *P_x, const ddl_partition_t *P_y,
                                 bool transpose_src, bool transpose_dest, ddl_dtype dt,
                                 const ddl_shape *shape, ddl_sum_reduce_t **out)
{
    DDL_REQUIRE(out != NULL, DDL_EINVAL, "sum_reduce: out is NULL");
    // Without the plan's memory this rank still joins the members' agreement (in the
    // group building), so they all fail with it.
    ddl_sum_reduce_t *r = ddl_calloc(1, sizeof *r);
    ddl__bcast_reduce none;
    ddl_status        local =
        r != NULL ? DDL_OK : ddl_set_error(DDL_ENOMEM, "sum_reduce: out of memory for the plan");
    ddl_status st = ddl__bcast_reduce_init(r != NULL ? &r->br : &none, "sum_reduce", P_x, P_y,
                                           transpose_src, transpose_dest, dt, shape, false, local);
    if (st == DDL_OK && r == NULL) {
        ddl__bcast_reduce_free(&none); // not reached: the members agreed on the failure
        st = local;
    }
    if (st != DDL_OK) {
        ddl_free(r);
        return st;
    }
    *out = r;
    return DDL_OK;
}

void ddl_sum_reduce_destroy(ddl_sum_reduce_t **r)
{
    if (r == NULL || *r == NULL) {
        return;
    }
    ddl__bcast_reduce_free(&(*r)->br);
    ddl_free(*r);
    *r = NULL;
}

// x lives on the leaves (P_x), y on the roots (P_y).
ddl_shape ddl_sum_reduce_x_shape(const ddl_sum_reduce_t *r)
{
    return r->br.leaf_shape;
}

ddl_shape ddl_sum_reduce_y_shape(const ddl_sum_reduce_t *r)
{
    return r->br.root_shape;
}

ddl_status ddl_sum_reduce_forward(const ddl_sum_reduce_t *r, const ddl_tensor_t *x,
                                  ddl_tensor_t *y)
{
    DDL_REQUIRE(r != NULL, DDL_EINVAL, "sum_reduce forward: plan is NULL");
    DDL_TRAFFIC_TIMED_RETURN(DDL_TRAFFIC_SUM_REDUCE, DDL_TRAFFIC_FORWARD,
                             ddl__bcast_reduce_sum(&r->br, x, y, "sum_reduce forward"));
}

ddl_status ddl_sum_reduce_adjoint(const ddl_sum_reduce_t *r, const ddl_tensor_t *dy,
                                  ddl_tensor_t *dx)
{
    DDL_REQUIRE(r != NULL, DDL_EINVAL, "sum_reduce adjoint: plan is NULL");
    DDL_TRAFFIC_TIMED_RETURN(DDL_TRAFFIC_SUM_REDUCE, DDL_TRAFFIC_ADJOINT,
                             ddl__bcast_reduce_bcast(&r->br, dy, dx, "sum_reduce adjoint"));
}

bool ddl_sum_reduce_in_place_ok(const ddl_sum_reduce_t *r)
{
    return r != NULL && r->br.same;
}
