// layers/reshape.c: layers that move or reshape data without arithmetic: Repartition
// (DistDL nn/repartition.py as a layer) and Flatten.
//
// Repartition. x (global shape X) balanced over P_x -> y (same X) balanced over P_y.
// forward = the Repartition primitive T, backward = its adjoint T* = T^{-1} (a
// permutation of entries). Collective over P_x ∪ P_y.
//
// Flatten. x [N, C, S_1 .. S_k] over P_x = [P_n, P_c, 1 .. 1] -> y [N, C*S] over
// P_y = [P_n, P_c] (S = S_1 ... S_k; the same ranks in the same order). Rank (a, c)
// holds channels [c_0, c_0 + C_c) of its batch rows; in row-major order those are the
// contiguous features [c_0 S, (c_0 + C_c) S) of the flat tensor, so the local reshape
// [n, C_c, S...] -> [n, C_c S] is the whole map, with no data movement, exactly when the
// channel split times S is the balanced split of C*S over P_c. Otherwise (C = 10 over 4:
// channels 3,3,2,2 -> features 75,75,50,50 for S = 25, where the balanced split of 250 is
// 63,63,62,62) a Repartition P_y -> P_y with that unbalanced input moves the features
// into the balanced layout:
//
//   y = T(reshape(x))            dx = reshape^{-1}(T* dy)
//
// Spatial dimensions of P_x must be 1 (a spatial split would interleave the features of
// different ranks). Collective over P_x (only when a Repartition is needed).
//
// Neither layer allocates in forward or backward.
#include <string.h>

#include "base/check.h"
#include "ddl/base.h"
#include "ddl/decomp.h"
#include "layers/layer_impl.h"

// ---- Repartition ------------------------------------------------------------------

typedef struct repartition_impl {
    ddl_repartition_t *t;
} repartition_impl;

static ddl_status repartition_forward(ddl_layer_t *L, const ddl_tensor_t *x, ddl_tensor_t *y)
{
    return ddl_repartition_forward(((repartition_impl *)L->impl)->t, x, y);
}

static ddl_status repartition_backward(ddl_layer_t *L, const ddl_tensor_t *dy, ddl_tensor_t *dx)
{
    return ddl_repartition_adjoint(((repartition_impl *)L->impl)->t, dy, dx);
}

static void repartition_destroy(ddl_layer_t *L)
{
    repartition_impl *m = L->impl;
    if (m != NULL) {
        ddl_repartition_destroy(&m->t);
        ddl_free(m);
        L->impl = NULL;
    }
}

static const ddl_layer_ops repartition_ops = {
    .forward  = repartition_forward,
    .backward = repartition_backward,
    .destroy  = repartition_destroy,
};

static ddl_status check_common(const char *who, ddl_dtype dt, const ddl_shape *x_global,
                               ddl_layer_t **out)
{
    DDL_REQUIRE(out != NULL, DDL_EINVAL, "%s: out is NULL", who);
    DDL_REQUIRE(dt == DDL_F32 || dt == DDL_F64, DDL_EINVAL, "%s: unknown dtype %d", who, (int)dt);
    DDL_REQUIRE(x_global != NULL, DDL_EINVAL, "%s: x_global is NULL", who);
    DDL_REQUIRE(x_global->ndim >= 1 && x_global->ndim <= DDL_MAX_DIMS, DDL_EINVAL,
                "%s: x_global has %d dims", who, x_global->ndim);
    for (int d = 0; d < x_global->ndim; d++) {
        DDL_REQUIRE(x_global->d[d] >= 1, DDL_EINVAL, "%s: x_global[%d] = %lld must be >= 1", who,
                    d, (long long)x_global->d[d]);
    }
    return DDL_OK;
}

ddl_status ddl_repartition_layer_create(const ddl_partition_t *P_x, const ddl_partition_t *P_y,
                                        ddl_dtype dt, const ddl_shape *x_global,
                                        ddl_layer_t **out)
{
    DDL_CHECK(check_common("repartition layer", dt, x_global, out));
    DDL_REQUIRE(P_x != NULL && P_y != NULL, DDL_EINVAL,
                "repartition layer: P_x and P_y are required");
    int nd = x_global->ndim;
    DDL_REQUIRE(ddl_partition_ndim(P_x) == nd && ddl_partition_ndim(P_y) == nd, DDL_EINVAL,
                "repartition layer: P_x (%d dims) and P_y (%d dims) must have the %d dims of "
                "x_global",
                ddl_partition_ndim(P_x), ddl_partition_ndim(P_y), nd);
    ddl_layer_t *L = NULL;
    ddl_status        ast = ddl_layer_alloc(&repartition_ops, "repartition", dt, &L);
    repartition_impl *m   = ast == DDL_OK ? ddl_calloc(1, sizeof *m) : NULL;
    if (ast == DDL_OK && m == NULL) {
        ast = ddl_set_error(DDL_ENOMEM, "repartition layer: out of memory");
    }
    // The members agree on these allocations before any collective construction, so a
    // member whose allocation failed fails them all instead of leaving them waiting.
    ast = ddl_partition_agree_union(P_x, P_y, NULL, ast);
    if (ast != DDL_OK) {
        ddl_free(m);
        ddl_layer_destroy(&L);
        return ast;
    }
    L->impl       = m;
    ddl_status st = ddl_repartition_create(P_x, P_y, dt, x_global, NULL, &m->t);
    if (st != DDL_OK) {
        ddl_layer_destroy(&L);
        return st;
    }
    L->x_global = *x_global;
    L->y_global = *x_global;
    L->x_shape  = ddl_repartition_x_shape(m->t);
    L->y_shape  = ddl_repartition_y_shape(m->t);
    L->P_in     = P_x;
    L->P_out    = P_y;
    *out        = L;
    return DDL_OK;
}

// ---- Flatten ----------------------------------------------------------------------

typedef struct flatten_impl {
    ddl_shape          flat;  // this rank's reshaped x: [n, C_c * S] (zero-volume outside)
    ddl_repartition_t *t;     // P_y -> P_y rebalancing; NULL when the split is balanced
} flatten_impl;

static ddl_status flatten_forward(ddl_layer_t *L, const ddl_tensor_t *x, ddl_tensor_t *y)
{
    flatten_impl *m = L->impl;
    if (m->t == NULL) {
        size_t bytes = ddl_tensor_bytes(y);
        if (bytes > 0) {
            memcpy(y->data, x->data, bytes);
        }
        return DDL_OK;
    }
    ddl_tensor_t xv = *x;  // the same memory seen as [n, C_c * S]
    xv.shape        = m->flat;
    xv.owns         = false;
    return ddl_repartition_forward(m->t, &xv, y);
}

static ddl_status flatten_backward(ddl_layer_t *L, const ddl_tensor_t *dy, ddl_tensor_t *dx)
{
    flatten_impl *m = L->impl;
    if (m->t == NULL) {
        size_t bytes = ddl_tensor_bytes(dx);
        if (bytes > 0) {
            memcpy(dx->data, dy->data, bytes);
        }
        return DDL_OK;
    }
    ddl_tensor_t dxv = *dx;
    dxv.shape        = m->flat;
    dxv.owns         = false;
    return ddl_repartition_adjoint(m->t, dy, &dxv);
}

static void flatten_destroy(ddl_layer_t *L)
{
    flatten_impl *m = L->impl;
    if (m != NULL) {
        ddl_repartition_destroy(&m->t);
        ddl_free(m);
        L->impl = NULL;
    }
}

static const ddl_layer_ops flatten_ops = {
    .forward  = flatten_forward,
    .backward = flatten_backward,
    .destroy  = flatten_destroy,
};

static ddl_status flatten_validate(const ddl_partition_t *P_x, const ddl_partition_t *P_y,
                                   ddl_dtype dt, const ddl_shape *x_global, ddl_layer_t **out)
{
    DDL_CHECK(check_common("flatten", dt, x_global, out));
    DDL_REQUIRE(P_x != NULL && P_y != NULL, DDL_EINVAL, "flatten: P_x and P_y are required");
    int nd = x_global->ndim;
    DDL_REQUIRE(nd >= 2, DDL_EINVAL, "flatten: x_global has %d dims, expected [N, C, spatial...]",
                nd);
    DDL_REQUIRE(ddl_partition_ndim(P_x) == nd, DDL_EINVAL,
                "flatten: P_x has %d dims, x_global has %d", ddl_partition_ndim(P_x), nd);
    DDL_REQUIRE(ddl_partition_ndim(P_y) == 2, DDL_EINVAL,
                "flatten: P_y has %d dims, expected 2 ([P_n, P_c])", ddl_partition_ndim(P_y));
    const int *sx = ddl_partition_shape(P_x), *sy = ddl_partition_shape(P_y);
    for (int d = 2; d < nd; d++) {
        DDL_REQUIRE(sx[d] == 1, DDL_EINVAL,
                    "flatten: P_x splits spatial dim %d over %d ranks; spatial dims of P_x "
                    "must be 1 (repartition first)",
                    d, sx[d]);
    }
    DDL_REQUIRE(sy[0] == sx[0] && sy[1] == sx[1], DDL_EINVAL,
                "flatten: P_y shape [%d, %d] != [P_n, P_c] = [%d, %d] of P_x", sy[0], sy[1], sx[0],
                sx[1]);
    int        n  = ddl_partition_size(P_x);
    const int *rx = ddl_partition_ranks(P_x), *ry = ddl_partition_ranks(P_y);
    DDL_REQUIRE(ddl_partition_size(P_y) == n &&
                    ddl_partition_base(P_x) == ddl_partition_base(P_y),
                DDL_EINVAL,
                "flatten: P_x and P_y must hold the same ranks of one base communicator");
    for (int i = 0; i < n; i++) {
        DDL_REQUIRE(rx[i] == ry[i], DDL_EINVAL,
                    "flatten: P_x and P_y must list the same ranks in the same order (position "
                    "%d: %d vs %d)",
                    i, rx[i], ry[i]);
    }
    return DDL_OK;
}

ddl_status ddl_flatten_create(const ddl_partition_t *P_x, const ddl_partition_t *P_y, ddl_dtype dt,
                              const ddl_shape *x_global, ddl_layer_t **out)
{
    DDL_CHECK(flatten_validate(P_x, P_y, dt, x_global, out));
    int     nd = x_global->ndim, pc = ddl_partition_shape(P_x)[1];
    int64_t C = x_global->d[1], S = 1;
    for (int d = 2; d < nd; d++) {
        S *= x_global->d[d];
    }
    // Balanced already? The same answer on every rank (pure index math).
    bool balanced = true;
    for (int j = 0; j < pc; j++) {
        balanced = balanced && ddl_decomp_size(C, pc, j) * S == ddl_decomp_size(C * S, pc, j);
    }

    ddl_layer_t *L = NULL;
    ddl_status    ast = ddl_layer_alloc(&flatten_ops, "flatten", dt, &L);
    flatten_impl *m   = ast == DDL_OK ? ddl_calloc(1, sizeof *m) : NULL;
    if (ast == DDL_OK && m == NULL) {
        ast = ddl_set_error(DDL_ENOMEM, "flatten: out of memory");
    }
    // The members agree on these allocations before any collective construction, so a
    // member whose allocation failed fails them all instead of leaving them waiting.
    ast = ddl_partition_agree_union(P_x, P_y, NULL, ast);
    if (ast != DDL_OK) {
        ddl_free(m);
        ddl_layer_destroy(&L);
        return ast;
    }
    L->impl     = m;
    L->x_global = *x_global;
    L->y_global = ddl_shape_make(2, (int64_t[]){x_global->d[0], C * S});
    L->x_shape  = ddl_partition_local_shape(P_x, x_global);
    L->y_shape  = ddl_partition_local_shape(P_y, &L->y_global);
    L->P_in     = P_x;
    L->P_out    = P_y;
    int64_t fl  = 1;
    for (int d = 1; d < nd; d++) {
        fl *= L->x_shape.d[d];
    }
    m->flat = ddl_shape_make(2, (int64_t[]){L->x_shape.d[0], fl});
    if (!balanced) {
        ddl_status st = ddl_repartition_create(P_y, P_y, dt, &L->y_global, &m->flat, &m->t);
        if (st != DDL_OK) {
            ddl_layer_destroy(&L);
            return st;
        }
    }
    *out = L;
    return DDL_OK;
}
