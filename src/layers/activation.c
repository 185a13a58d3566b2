// layers/activation.c: pointwise activation layers on any partition (local, no
// communication): ReLU, LeakyReLU(alpha), Sigmoid, Tanh, GELU and Dropout(p = alpha).
//
// x and y have the same global shape X, both balanced over P_x, so every rank applies
// the sequential kernel (kernels_pointwise.h) to its local block:
//
//   y_i = f(x_i)                 dx_i = f'(x_i) dy_i   (dx overwritten)
//
// What the backward needs is not copied: forward records a reference to the caller's
// output y (ReLU, Sigmoid, Tanh) or input x (LeakyReLU, GELU), which the caller keeps
// unchanged until the matching backward (the saved-tensor contract of ddl/layers.h).
//
// Dropout (torch.nn.Dropout). Not training: the identity. Training: y_i = x_i keep_i /
// (1 - p), dx_i = dy_i keep_i / (1 - p), with keep_i = [U(seed, stream, g_i) >= p] drawn
// from the counter-based generator at the GLOBAL row-major flat index g_i of element i,
// so the mask is the same whatever the partition. The local block is not contiguous in
// the global tensor in general: it is walked as runs that are contiguous in both
// (the last dimension, extended over trailing dimensions the block spans entirely), and
// the kernel is called once per run with offset = the global index of the run's start.
// `stream` counts the layer's training forwards (0, 1, 2, ...): each step draws a fresh
// mask, and a layer and its sequential twin driven alike draw the same masks. The mask
// of the last forward is kept for backward.
//
// Not collective (ranks outside P_x hold zero-volume tensors). Forward and backward
// allocate nothing.
#include <math.h>
#include <string.h>

#include "base/check.h"
#include "ddl/base.h"
#include "layers/layer_impl.h"

typedef struct activation_impl {
    ddl_act_kind  kind;
    double        alpha;
    uint64_t      seed;
    uint64_t      calls;    // training forwards so far (the next dropout stream)
    uint64_t      stream;   // stream of the last dropout forward
    bool          dropped;  // the last forward applied a mask (training dropout)
    bool          have_forward;  // a forward has run (backward needs its state)
    const void   *saved;    // the caller's x or y of the last forward (not dropout)
    uint8_t      *mask;     // dropout: [local numel]
    ddl_box       box;      // this rank's block of the global tensor
    int           run_dim;  // runs are contiguous from this dim on (see run_offset)
    int64_t       run_len;  // elements per run
} activation_impl;

// The global flat index of the first element of run r of the local block.
static uint64_t run_offset(const ddl_layer_t *L, const activation_impl *m, int64_t r)
{
    const ddl_shape *g = &L->x_global;
    int              nd = g->ndim;
    // Coordinates of the run start: dims [0, run_dim) from r, the rest at the box start.
    int64_t coord[DDL_MAX_DIMS];
    for (int d = nd - 1; d >= 0; d--) {
        if (d >= m->run_dim) {
            coord[d] = m->box.start[d];
        } else {
            int64_t ext = m->box.stop[d] - m->box.start[d];
            coord[d]    = m->box.start[d] + r % ext;
            r /= ext;
        }
    }
    int64_t off = 0;
    for (int d = 0; d < nd; d++) {
        off = off * g->d[d] + coord[d];
    }
    return (uint64_t)off;
}

static ddl_activation kernel_kind(ddl_act_kind k)
{
    switch (k) {
    case DDL_ACT_LEAKY_RELU:
        return DDL_ACTIVATION_LEAKY_RELU;
    case DDL_ACT_SIGMOID:
        return DDL_ACTIVATION_SIGMOID;
    case DDL_ACT_TANH:
        return DDL_ACTIVATION_TANH;
    case DDL_ACT_GELU:
        return DDL_ACTIVATION_GELU;
    default:
        return DDL_ACTIVATION_RELU;
    }
}

// Backward of LeakyReLU and GELU reads x; of ReLU, Sigmoid and Tanh, y.
static bool saves_input(ddl_act_kind k)
{
    return k == DDL_ACT_LEAKY_RELU || k == DDL_ACT_GELU;
}

static ddl_status activation_forward(ddl_layer_t *L, const ddl_tensor_t *x, ddl_tensor_t *y)
{
    activation_impl *m     = L->impl;
    int64_t          n     = ddl_tensor_numel(x);
    size_t           bytes = ddl_tensor_bytes(x);
    size_t           esz   = ddl_dtype_size(L->dt);
    m->have_forward        = true;
    if (m->kind != DDL_ACT_DROPOUT) {
        DDL_CHECK(ddl_activation_forward(kernel_kind(m->kind), m->alpha, L->dt, y->data, x->data,
                                         n));
        m->saved = saves_input(m->kind) ? x->data : y->data;
        return DDL_OK;
    }
    m->dropped = L->training;
    if (!L->training) {
        if (bytes > 0) {
            memcpy(y->data, x->data, bytes);
        }
        return DDL_OK;
    }
    m->stream = L->rng_step_set ? L->rng_step : m->calls++;
    for (int64_t r = 0, i = 0; i < n; r++, i += m->run_len) {
        DDL_CHECK(ddl_dropout_forward(L->dt, (char *)y->data + (size_t)i * esz, m->mask + i,
                                      (const char *)x->data + (size_t)i * esz, m->run_len,
                                      m->alpha, m->seed, m->stream, run_offset(L, m, r)));
    }
    return DDL_OK;
}

static ddl_status activation_backward(ddl_layer_t *L, const ddl_tensor_t *dy, ddl_tensor_t *dx)
{
    activation_impl *m     = L->impl;
    int64_t          n     = ddl_tensor_numel(dx);
    size_t           bytes = ddl_tensor_bytes(dx);
    size_t           esz   = ddl_dtype_size(L->dt);
    if (m->kind == DDL_ACT_DROPOUT && !m->dropped) {
        if (bytes > 0) {
            memcpy(dx->data, dy->data, bytes);
        }
        return DDL_OK;
    }
    DDL_REQUIRE(m->have_forward, DDL_EINVAL, "%s: backward called before any forward",
                L->kind);
    if (n == 0) {
        return DDL_OK;
    }
    if (m->kind != DDL_ACT_DROPOUT) {
        const void *s = m->saved; // the kernel overwrites dx: no zeroing pass
        return ddl_activation_backward_into(kernel_kind(m->kind), m->alpha, L->dt, dx->data,
                                            dy->data, saves_input(m->kind) ? s : NULL,
                                            saves_input(m->kind) ? NULL : s, n);
    }
    ddl_tensor_zero(dx); // the dropout kernel accumulates
    for (int64_t r = 0, i = 0; i < n; r++, i += m->run_len) {
        DDL_CHECK(ddl_dropout_backward(L->dt, (char *)dx->data + (size_t)i * esz,
                                       (const char *)dy->data + (size_t)i * esz, m->mask + i,
                                       m->run_len, m->alpha, m->seed, m->stream,
                                       run_offset(L, m, r)));
    }
    return DDL_OK;
}

static void activation_destroy(ddl_layer_t *L)
{
    activation_impl *m = L->impl;
    if (m != NULL) {
        ddl_free(m->mask);
        ddl_free(m);
        L->impl = NULL;
    }
}

static const ddl_layer_ops activation_ops = {
    .forward  = activation_forward,
    .backward = activation_backward,
    .destroy  = activation_destroy,
};

static const char *kind_name(ddl_act_kind k)
{
    static const char *names[] = {"relu", "leaky_relu", "sigmoid", "tanh", "gelu", "dropout"};
    return names[k];
}

ddl_status ddl_activation_create(const ddl_partition_t *P_x, ddl_dtype dt,
                                 const ddl_shape *x_global, ddl_act_kind kind, double alpha,
                                 uint64_t seed, ddl_layer_t **out)
{
    DDL_REQUIRE(out != NULL, DDL_EINVAL, "activation: out is NULL");
    DDL_REQUIRE(P_x != NULL && x_global != NULL, DDL_EINVAL,
                "activation: P_x and x_global are required");
    DDL_REQUIRE(dt == DDL_F32 || dt == DDL_F64, DDL_EINVAL, "activation: unknown dtype %d",
                (int)dt);
    DDL_REQUIRE(kind >= DDL_ACT_RELU && kind <= DDL_ACT_DROPOUT, DDL_EINVAL,
                "activation: unknown kind %d", (int)kind);
    DDL_REQUIRE(x_global->ndim >= 1 && x_global->ndim <= DDL_MAX_DIMS &&
                    x_global->ndim == ddl_partition_ndim(P_x),
                DDL_EINVAL, "activation: x_global has %d dims, P_x has %d", x_global->ndim,
                ddl_partition_ndim(P_x));
    for (int d = 0; d < x_global->ndim; d++) {
        DDL_REQUIRE(x_global->d[d] >= 1, DDL_EINVAL,
                    "activation: x_global[%d] = %lld must be >= 1", d, (long long)x_global->d[d]);
    }
    DDL_REQUIRE(kind != DDL_ACT_DROPOUT || (alpha >= 0.0 && alpha <= 1.0), DDL_EINVAL,
                "activation: dropout probability %g outside [0, 1]", alpha);
    DDL_REQUIRE(kind != DDL_ACT_LEAKY_RELU || isfinite(alpha), DDL_EINVAL,
                "activation: leaky_relu negative slope %g is not finite", alpha);

    ddl_layer_t *L = NULL;
    DDL_CHECK(ddl_layer_alloc(&activation_ops, kind_name(kind), dt, &L));
    activation_impl *m = ddl_calloc(1, sizeof *m);
    if (m == NULL) {
        ddl_layer_destroy(&L);
        return ddl_set_error(DDL_ENOMEM, "activation: out of memory");
    }
    L->impl     = m;
    L->x_global = *x_global;
    L->y_global = *x_global;
    L->x_shape  = ddl_partition_local_shape(P_x, x_global);
    L->y_shape  = L->x_shape;
    L->P_in     = P_x;
    L->P_out    = P_x;
    m->kind     = kind;
    m->alpha    = alpha;
    m->seed     = seed;
    m->box      = ddl_partition_local_box(P_x, x_global);

    // Only dropout keeps state of its own (the mask); the others reference x or y.
    if (kind == DDL_ACT_DROPOUT) {
        int64_t n = ddl_shape_numel(&L->x_shape);
        // Runs: the last dim, extended leftwards while the block spans a dim entirely.
        int nd      = x_global->ndim;
        m->run_dim  = nd - 1;
        m->run_len  = L->x_shape.d[nd - 1];
        while (m->run_dim > 0 && L->x_shape.d[m->run_dim] == x_global->d[m->run_dim]) {
            m->run_dim--;
            m->run_len *= L->x_shape.d[m->run_dim];
        }
        m->mask = ddl_malloc((size_t)(n > 0 ? n : 1));
        if (m->mask == NULL) {
            ddl_layer_destroy(&L);
            return ddl_set_error(DDL_ENOMEM, "activation: out of memory for the dropout mask");
        }
    }
    *out = L;
    return DDL_OK;
}
