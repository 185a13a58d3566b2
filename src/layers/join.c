// layers/join.c: the joins of a graph model: Add (residual connections) and Concat
// along the channels (U-Net skips). Both are multi-input layers (forward_n /
// backward_n) and local: every operand and the output are balanced over one partition
// P_x, so each rank combines the blocks it holds and nothing moves between ranks.
//
// Add. x_0 .. x_{n-1} and y share the global shape X:
//   y = sum_k x_k                      dx_k = dy  (for every k; the adjoint of a sum is a
//                                                  copy to each operand)
// Concat. x_k [N, C_k, S...] (equal except dim 1) -> y [N, C, S...], C = sum C_k, the
// channels of x_k at [o_k, o_k + C_k), o_k = C_0 + ... + C_{k-1}:
//   y[:, o_k:o_k+C_k] = x_k            dx_k = dy[:, o_k:o_k+C_k]
// P_x must not split dim 1: then every rank's block of y spans all channels and the
// same rows and spatial ranges as its block of each x_k (the other dims have one global
// size, so one balanced split), and the copy is a box copy. A split channel dim would
// need a repartition (the blocks of y and of the x_k would live on different ranks).
//
// Neither layer keeps a reference to its inputs, has parameters or allocates in forward
// or backward. Not collective (ranks outside P_x hold zero-volume tensors).
#include <string.h>

#include "base/check.h"
#include "ddl/base.h"
#include "layers/layer_impl.h"

// Pure checks shared by both constructors: the same verdict on every rank.
static ddl_status check_common(const char *kind, const ddl_partition_t *P_x, ddl_dtype dt, int n,
                               const ddl_shape *globals, ddl_layer_t **out)
{
    DDL_REQUIRE(out != NULL, DDL_EINVAL, "%s: out is NULL", kind);
    *out = NULL;
    DDL_REQUIRE(P_x != NULL && globals != NULL, DDL_EINVAL, "%s: P_x and the shapes are required",
                kind);
    DDL_REQUIRE(dt == DDL_F32 || dt == DDL_F64, DDL_EINVAL, "%s: unknown dtype %d", kind, (int)dt);
    DDL_REQUIRE(n >= 2, DDL_EINVAL, "%s: needs at least 2 operands, got %d", kind, n);
    int nd = ddl_partition_ndim(P_x);
    for (int k = 0; k < n; k++) {
        const ddl_shape *g = &globals[k];
        DDL_REQUIRE(g->ndim >= 1 && g->ndim <= DDL_MAX_DIMS && g->ndim == nd, DDL_EINVAL,
                    "%s: operand %d has %d dims, P_x has %d", kind, k, g->ndim, nd);
        for (int d = 0; d < g->ndim; d++) {
            DDL_REQUIRE(g->d[d] >= 1, DDL_EINVAL, "%s: operand %d has global shape[%d] = %lld < 1",
                        kind, k, d, (long long)g->d[d]);
        }
    }
    return DDL_OK;
}

// ---- Add ----------------------------------------------------------------------------

// A ReLU fused on the output (ddl_add_fuse_relu): y = relu(sum_k x_k), and backward takes
// the gradient of that: g = dy [y > 0] (ddl_activation_backward_into, the ReLU layer's own
// kernel), then dx_k = g. The bits of this layer followed by a ReLU layer; one pass over
// the activation fewer forward, and no buffer for the ReLU's output. Backward reads y of
// the last forward by reference (the saved-tensor contract of ddl/layers.h).
typedef struct add_impl {
    bool        relu;
    bool        ran;     // a forward has run (fusing is refused after it)
    const void *y_saved; // with relu: y of the last forward
    const void *ptr[];   // [n] operand pointers, filled per call
} add_impl;

static ddl_status add_forward(ddl_layer_t *L, int n, const ddl_tensor_t *const *xs, ddl_tensor_t *y)
{
    add_impl *a = L->impl;
    for (int k = 0; k < n; k++) {
        a->ptr[k] = xs[k]->data;
    }
    a->ran = true;
    if (!a->relu) {
        return ddl_sum_forward(L->dt, y->data, n, a->ptr, ddl_tensor_numel(y));
    }
    a->y_saved = y->data;
    return ddl_sum_relu_forward(L->dt, y->data, n, a->ptr, ddl_tensor_numel(y));
}

static ddl_status add_backward(ddl_layer_t *L, const ddl_tensor_t *dy, int n,
                               ddl_tensor_t *const *dxs)
{
    const add_impl     *a = L->impl;
    const ddl_tensor_t *g = dy; // the gradient every operand takes
    if (a->relu) {
        DDL_REQUIRE(a->y_saved != NULL || ddl_tensor_numel(dy) == 0, DDL_EINVAL,
                    "add: backward with a fused ReLU before any forward");
        // Into the first operand's gradient, which may be dy's own memory
        // (spec_grad_alias_of); dy is not read after this.
        DDL_CHECK(ddl_activation_backward_into(DDL_ACTIVATION_RELU, 0.0, L->dt, dxs[0]->data,
                                               dy->data, NULL, a->y_saved, ddl_tensor_numel(dy)));
        g = dxs[0];
    }
    for (int k = 0; k < n; k++) {
        if (dxs[k]->data != g->data) { // else the operand's gradient is g itself
            DDL_CHECK(ddl_tensor_copy(g, dxs[k]));
        }
    }
    return DDL_OK;
}

static void free_impl(ddl_layer_t *L)
{
    ddl_free(L->impl);
    L->impl = NULL;
}

static const ddl_layer_ops add_ops = {
    .forward_n  = add_forward,
    .backward_n = add_backward,
    .destroy    = free_impl,
};

ddl_status ddl_add_create(const ddl_partition_t *P_x, ddl_dtype dt, const ddl_shape *x_global,
                          int n, ddl_layer_t **out)
{
    DDL_REQUIRE(out != NULL && x_global != NULL, DDL_EINVAL, "add: x_global and out are required");
    DDL_REQUIRE(n >= 2 && n <= 1 << 20, DDL_EINVAL,
                "add: needs at least 2 operands (and at most %d), got %d", 1 << 20, n);
    ddl_shape *g = ddl_malloc(sizeof *g * (size_t)n);
    DDL_REQUIRE(g != NULL, DDL_ENOMEM, "add: out of memory");
    for (int k = 0; k < n; k++) {
        g[k] = *x_global;
    }
    ddl_status   st = check_common("add", P_x, dt, n, g, out);
    ddl_layer_t *L  = NULL;
    if (st == DDL_OK) {
        st = ddl_layer_alloc(&add_ops, "add", dt, &L);
    }
    if (st == DDL_OK) {
        st = ddl_layer_set_inputs(L, n, g, P_x);
    }
    if (st == DDL_OK) {
        L->impl = ddl_calloc(1, sizeof(add_impl) + (size_t)n * sizeof(const void *));
        st      = L->impl != NULL ? DDL_OK : ddl_set_error(DDL_ENOMEM, "add: out of memory");
    }
    ddl_free(g);
    if (st != DDL_OK) {
        ddl_layer_destroy(&L);
        return st;
    }
    L->y_global = *x_global;
    L->y_shape  = L->x_shape;
    L->P_out    = P_x;
    *out        = L;
    return DDL_OK;
}

ddl_status ddl_add_fuse_relu(ddl_layer_t *L, bool on)
{
    DDL_REQUIRE(L != NULL && L->ops == &add_ops, DDL_EINVAL,
                "add_fuse_relu: the layer is not an add layer");
    add_impl *a = L->impl;
    DDL_REQUIRE(!a->ran, DDL_EINVAL,
                "add_fuse_relu: the layer has already run a forward; fuse before the first");
    a->relu = on;
    return DDL_OK;
}

// ---- Concat -------------------------------------------------------------------------

typedef struct concat_impl {
    ddl_box *in_full; // [n]: the whole local block of x_k
    ddl_box *in_y;    // [n]: where it sits in the local block of y
} concat_impl;

static ddl_status concat_forward(ddl_layer_t *L, int n, const ddl_tensor_t *const *xs,
                                 ddl_tensor_t *y)
{
    const concat_impl *m = L->impl;
    if (ddl_tensor_numel(y) == 0) {
        return DDL_OK;
    }
    for (int k = 0; k < n; k++) {
        ddl_tensor_copy_box(xs[k], &m->in_full[k], y, &m->in_y[k]);
    }
    return DDL_OK;
}

static ddl_status concat_backward(ddl_layer_t *L, const ddl_tensor_t *dy, int n,
                                  ddl_tensor_t *const *dxs)
{
    const concat_impl *m = L->impl;
    if (ddl_tensor_numel(dy) == 0) {
        return DDL_OK;
    }
    for (int k = 0; k < n; k++) {
        ddl_tensor_copy_box(dy, &m->in_y[k], dxs[k], &m->in_full[k]);
    }
    return DDL_OK;
}

static void concat_destroy(ddl_layer_t *L)
{
    concat_impl *m = L->impl;
    if (m != NULL) {
        ddl_free(m->in_full);
        ddl_free(m->in_y);
        ddl_free(m);
        L->impl = NULL;
    }
}

static const ddl_layer_ops concat_ops = {
    .forward_n  = concat_forward,
    .backward_n = concat_backward,
    .destroy    = concat_destroy,
};

ddl_status ddl_concat_create(const ddl_partition_t *P_x, ddl_dtype dt, int n,
                             const ddl_shape *x_globals, ddl_layer_t **out)
{
    DDL_CHECK(check_common("concat", P_x, dt, n, x_globals, out));
    int nd = x_globals[0].ndim;
    DDL_REQUIRE(nd >= 2, DDL_EINVAL,
                "concat: operands have %d dim, need [N, C, ...] (concatenation along dim 1)", nd);
    DDL_REQUIRE(ddl_partition_shape(P_x)[1] == 1, DDL_EINVAL,
                "concat: P_x splits dim 1 (channels) over %d ranks; concatenation along the "
                "channels needs a partition that does not split them (shape[1] = 1)",
                ddl_partition_shape(P_x)[1]);
    int64_t C = 0;
    for (int k = 0; k < n; k++) {
        for (int d = 0; d < nd; d++) {
            if (d != 1 && x_globals[k].d[d] != x_globals[0].d[d]) {
                char a[96], b[96];
                return ddl_set_error(
                    DDL_EINVAL,
                    "concat: operand %d has global shape %s, operand 0 %s: they may differ "
                    "only in dim 1 (dim %d differs)",
                    k, ddl_shape_str(&x_globals[k], a, sizeof a),
                    ddl_shape_str(&x_globals[0], b, sizeof b), d);
            }
        }
        DDL_REQUIRE(x_globals[k].d[1] <= DDL_MAX_TENSOR_ELEMENTS - C, DDL_EINVAL,
                    "concat: the total of the channels overflows");
        C += x_globals[k].d[1];
    }

    ddl_layer_t *L  = NULL;
    concat_impl *m  = NULL;
    ddl_status   st = ddl_layer_alloc(&concat_ops, "concat", dt, &L);
    if (st == DDL_OK) {
        st = ddl_layer_set_inputs(L, n, x_globals, P_x);
    }
    if (st == DDL_OK) {
        m       = ddl_calloc(1, sizeof *m);
        L->impl = m;
        if (m != NULL) {
            m->in_full = ddl_calloc((size_t)n, sizeof *m->in_full);
            m->in_y    = ddl_calloc((size_t)n, sizeof *m->in_y);
        }
        if (m == NULL || m->in_full == NULL || m->in_y == NULL) {
            st = ddl_set_error(DDL_ENOMEM, "concat: out of memory");
        }
    }
    if (st != DDL_OK) {
        ddl_layer_destroy(&L);
        return st;
    }
    L->y_global      = x_globals[0];
    L->y_global.d[1] = C;
    L->y_shape       = ddl_partition_local_shape(P_x, &L->y_global);
    L->P_out         = P_x;
    // Local boxes: input k's whole block, and the channels [o_k, o_k + C_k) of y's block
    // (zero-volume blocks on ranks outside P_x are never copied).
    int64_t o = 0;
    for (int k = 0; k < n; k++) {
        m->in_full[k]       = ddl_box_full(&L->in_shape[k]);
        m->in_y[k]          = ddl_box_full(&L->y_shape);
        m->in_y[k].start[1] = o;
        m->in_y[k].stop[1]  = o + L->in_shape[k].d[1];
        o += L->in_shape[k].d[1];
    }
    *out = L;
    return DDL_OK;
}
