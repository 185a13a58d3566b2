// layers/global_pool.c: global average pooling over the spatial dims
// (torch.nn.AdaptiveAvgPool{1,2,3}d with output size 1).
//
// Shapes. x [N, C, S_1..S_k] (k >= 1) balanced over P_x = [P_n, P_c, s_1..s_k], split any
// way; y [N, C, 1..1] balanced over the same P_x, so only the ranks at spatial coordinate
// 0 hold y blocks (a dim of size 1 split over s ranks gives the whole to coordinate 0).
// V = S_1 ... S_k, the global spatial size. This rank holds x [n, c, box] and, at spatial
// coordinate 0, y [n, c, 1..1] of the same n and c.
//
// Partitions. P_root holds the ranks of P_x at coordinates [a, b, 0..0] (a < P_n, b <
// P_c), in that order, as a [P_n, P_c, 1..1] partition: the SumReduce P_x -> P_root adds
// up the ranks that share (a, b), i.e. reduces over the spatial dims of P_x.
//
// Math, with R = SumReduce(P_x -> P_root) and R* its adjoint (a Broadcast back):
//   y  = R(p),   p[n, c]       = (1/V) sum over the local box of x[n, c, .]
//   dx = (1/V) R*(dy) spread over every element of the local box
// so <y, dy> = <x, dx> (the layer is linear; the adjoint test checks it). The partial
// means p are in the layer's dtype and summed by R directly into y (the plan's local
// shape [n, c, 1..1] is y's block on the P_root ranks).
//
// Collectivity. Create is collective over P_x (P_root and the plan's group
// communicators); forward and backward are collective over P_x; ranks outside P_x hold
// zero-volume tensors and return at once. Forward and backward allocate nothing.
#include <string.h>

#include "base/check.h"
#include "ddl/agree.h"
#include "ddl/base.h"
#include "ddl/layers.h"

typedef struct gap_impl {
    ddl_partition_t  *P_root; // [P_n, P_c, 1..1]: the spatial-coordinate-0 ranks of P_x
    ddl_sum_reduce_t *sr;     // P_x -> P_root over [n, c, 1..1]
    ddl_tensor_t     *part;   // [n, c, 1..1]: partial means (forward), dy broadcast (backward)
    bool              active; // this rank is in P_x
    int64_t           R, S;   // local rows n*c and local spatial size
    double            scale;  // 1 / V
} gap_impl;

static ddl_status gap_forward(ddl_layer_t *L, const ddl_tensor_t *x, ddl_tensor_t *y)
{
    gap_impl *g = L->impl;
    if (!g->active) {
        return DDL_OK;
    }
    DDL_CHECK(ddl_rowmean_forward(L->dt, g->part->data, x->data, g->R, g->S, g->scale));
    return ddl_sum_reduce_forward(g->sr, g->part, y);
}

static ddl_status gap_backward(ddl_layer_t *L, const ddl_tensor_t *dy, ddl_tensor_t *dx)
{
    gap_impl *g = L->impl;
    if (!g->active) {
        return DDL_OK;
    }
    DDL_CHECK(ddl_sum_reduce_adjoint(g->sr, dy, g->part));
    ddl_tensor_zero(dx);
    return ddl_rowmean_backward(L->dt, dx->data, g->part->data, g->R, g->S, g->scale);
}

static void gap_destroy(ddl_layer_t *L)
{
    gap_impl *g = L->impl;
    if (g == NULL) {
        return;
    }
    ddl_sum_reduce_destroy(&g->sr);
    ddl_tensor_destroy(&g->part);
    ddl_partition_destroy(&g->P_root);
    ddl_free(g);
    L->impl = NULL;
}

static const ddl_layer_ops gap_ops = {
    .forward  = gap_forward,
    .backward = gap_backward,
    .destroy  = gap_destroy,
};

// Pure checks of the arguments: the same verdict on every rank, before any MPI call.
static ddl_status validate(const ddl_partition_t *P_x, ddl_dtype dt, const ddl_shape *x_global,
                           ddl_layer_t **out)
{
    DDL_REQUIRE(P_x != NULL && x_global != NULL && out != NULL, DDL_EINVAL,
                "global_avgpool: P_x, x_global and out must not be NULL");
    *out = NULL;
    DDL_REQUIRE(dt == DDL_F32 || dt == DDL_F64, DDL_EINVAL, "global_avgpool: unknown dtype %d",
                (int)dt);
    int nd = x_global->ndim;
    DDL_REQUIRE(nd >= 3 && nd <= DDL_MAX_DIMS, DDL_EINVAL,
                "global_avgpool: x has %d dims, expected [N, C, spatial...] with 3 to %d dims", nd,
                DDL_MAX_DIMS);
    DDL_REQUIRE(ddl_partition_ndim(P_x) == nd, DDL_EINVAL,
                "global_avgpool: P_x has %d dims but x has %d", ddl_partition_ndim(P_x), nd);
    for (int d = 0; d < nd; d++) {
        DDL_REQUIRE(x_global->d[d] >= 1, DDL_EINVAL,
                    "global_avgpool: x_global[%d] = %lld must be >= 1", d,
                    (long long)x_global->d[d]);
    }
    int64_t n = 0;
    DDL_CHECK(ddl_shape_numel_checked(x_global, &n));
    return DDL_OK;
}

ddl_status ddl_global_avgpool_create(const ddl_partition_t *P_x, ddl_dtype dt,
                                     const ddl_shape *x_global, ddl_layer_t **out)
{
    DDL_CHECK(validate(P_x, dt, x_global, out));
    int        nd  = x_global->ndim;
    const int *pxs = ddl_partition_shape(P_x);
    int        Pn = pxs[0], Pc = pxs[1];

    ddl_layer_t *L   = NULL;
    ddl_status   ast = ddl_layer_alloc(&gap_ops, "global_avgpool", dt, &L);
    gap_impl    *g   = ast == DDL_OK ? ddl_calloc(1, sizeof *g) : NULL;
    int         *rr  = ast == DDL_OK ? ddl_malloc(sizeof(int) * (size_t)(Pn * Pc)) : NULL;
    if (ast == DDL_OK && (g == NULL || rr == NULL)) {
        ast = ddl_set_error(DDL_ENOMEM, "global_avgpool: out of memory");
    }
    // The members agree on these allocations before any collective construction.
    ast = ddl_partition_agree_union(P_x, NULL, NULL, ast);
    if (ast != DDL_OK) {
        ddl_free(g);
        ddl_free(rr);
        ddl_layer_destroy(&L);
        return ast;
    }
    L->impl     = g;
    L->x_global = *x_global;
    L->y_global = *x_global;
    double V    = 1.0;
    for (int d = 2; d < nd; d++) {
        V *= (double)x_global->d[d];
        L->y_global.d[d] = 1;
    }
    L->x_shape = ddl_partition_local_shape(P_x, x_global);
    L->y_shape = ddl_partition_local_shape(P_x, &L->y_global);
    L->P_in    = P_x;
    L->P_out   = P_x;
    g->active  = ddl_partition_active(P_x);
    g->scale   = 1.0 / V;
    g->R       = g->active ? L->x_shape.d[0] * L->x_shape.d[1] : 0;
    g->S       = 1;
    for (int d = 2; d < nd; d++) {
        g->S *= L->x_shape.d[d];
    }

    // P_root: the P_x ranks at [a, b, 0..0], as a [P_n, P_c, 1..1] partition.
    int coord[DDL_MAX_DIMS] = {0}, rshape[DDL_MAX_DIMS];
    for (int d = 0; d < nd; d++) {
        rshape[d] = d < 2 ? pxs[d] : 1;
    }
    for (int a = 0; a < Pn; a++) {
        for (int b = 0; b < Pc; b++) {
            coord[0]       = a;
            coord[1]       = b;
            rr[a * Pc + b] = ddl_partition_rank_at(P_x, coord);
        }
    }
    // Every collective step ends agreed over P_x (U), which holds all the layer's ranks.
    MPI_Comm   U = ddl_partition_comm(P_x);
    ddl_status st =
        ddl_partition_create(ddl_partition_base(P_x), Pn * Pc, rr, nd, rshape, &g->P_root);
    ddl_free(rr);
    DDL_CHECK_GOTO(ddl_agree(U, st), st, fail);
    // The plan's local shape [n, c, 1..1] on every P_x rank (zero-volume elsewhere).
    ddl_shape ps = {.ndim = nd};
    for (int d = 0; d < nd; d++) {
        ps.d[d] = d < 2 ? (g->active ? L->x_shape.d[d] : 0) : 1;
    }
    DDL_CHECK_GOTO(
        ddl_agree(U, ddl_sum_reduce_create(P_x, g->P_root, false, false, dt, &ps, &g->sr)), st,
        fail);
    DDL_CHECK_GOTO(ddl_agree(U, ddl_tensor_create(dt, &ps, &g->part)), st, fail);
    *out = L;
    return DDL_OK;
fail:
    ddl_layer_destroy(&L);
    return st;
}
