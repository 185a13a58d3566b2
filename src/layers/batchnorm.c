// layers/batchnorm.c: distributed batch normalization (DistDL DistributedBatchNorm,
// torch.nn.BatchNorm{1,2,3}d semantics).
//
// Shapes. x and y are [N, C, spatial...] (N = batch, C = channels = num_features,
// S = product of the spatial dims), decomposed balanced over P_x of the same ndim,
// split along any dims (batch, channels, space, or several). P_c = P_x.shape[1]. This
// rank holds the block [n, c_loc, s] of x and y. gamma and beta are [C].
//
// Partitions. P_sum holds the ranks of P_x at coordinates [0, c, 0, ...], c < P_c, in
// that order, as a partition of shape [1, P_c, 1, ...]. P_sum rank c owns channel piece
// c of gamma and beta (the balanced piece of C over P_c, the same channels its x block
// has) and is the root of every per-channel reduction of the P_x ranks with channel
// coordinate c.
//
// Math, per channel c, over the V = N * prod(spatial) values of the global batch
// (https://pytorch.org/docs/stable/generated/torch.nn.BatchNorm2d.html):
//   R = SumReduce(P_x -> P_sum), B = Broadcast(P_sum -> P_x), both per channel piece;
//   mean   = sum(x) / V
//   var    = sum (x - mean)^2 / V                 (biased)
//   invstd = 1 / sqrt(var + eps),  xhat = (x - mean) * invstd
//   y      = gamma * xhat + beta                  (gamma = 1, beta = 0 without affine)
// Eval mode (L->training false) uses the running statistics for mean and var.
//
// The statistics in one round. Each rank sums its n_i values, s_i = sum x, and their
// squared deviations from its own mean m_i = s_i / n_i, q_i = sum (x - m_i)^2 (two local
// passes), and sends [s_i | q_i + n_i (m_i - K)^2], K the mean of the last training
// forward (the same on every rank: it came in the broadcast; 0 before the first). On
// P_sum, with S = R(s) and Q = R(q + n (m - K)^2):
//   mean = S / V,  var = Q / V - (mean - K)^2
// (since sum_i q_i + n_i (m_i - mean)^2 = Q - V (mean - K)^2)
// and [mean | var | gamma | beta] go back in one broadcast: one SumReduce and one
// Broadcast per forward, where the statistics one after the other (DistDL's second pass
// over the global mean) and gamma | beta took five. A rank that holds every value of its
// channels (n_i = V: only the channels are split, or nothing) sends [s | q] and its root
// takes var = q / V, the two passes over the global mean exactly. Split ranks cancel
// (mean - K)^2 against Q / V: var's relative error is about eps_f64 (mean - K)^2 / var,
// where K is the previous batch's mean (a few eps while the batches are alike; at the
// first step, K = 0, 1e-10 for data whose mean is 1000 standard deviations off zero).
//
// Backward (the reverse composition; the adjoint of a Broadcast is a SumReduce and
// that of a SumReduce a Broadcast). With the local sums s1 = sum dy, s2 = sum dy*xhat:
//   training  g = B(R([s1, s2]))                  (the adjoints of the statistics' B)
//             dx = B(gamma) * invstd * (dy - g1/V - xhat * g2/V)
//   eval      dx = B(gamma) * invstd * dy        (frozen statistics)
//   both      dgamma += R(s2), dbeta += R(s1) on P_sum (the adjoint of B(gamma), B(beta))
// The one SumReduce of [s1, s2] serves both the parameter gradients and, in training,
// the broadcast to P_x. Statistics move as f64 whatever the layer's dtype, and so do
// gamma and beta in the forward's broadcast (exact for f32 and f64). Per layer and
// training step: two SumReduces and two Broadcasts.
//
// Running statistics (state, not parameters). Every P_x rank keeps running_mean and
// running_var ([C_loc], dtype dt) for its own channels [c0, c0 + C_loc), initialized to
// 0 and 1 as in PyTorch. All copies of a channel are updated from the same broadcast
// mean and var, so they stay identical and eval mode needs no communication for them.
// The update uses PyTorch's unbiased variance (var * V / (V - 1)), not DistDL's biased
// one; momentum < 0 selects the cumulative average (PyTorch's momentum=None).
//
// Collectivity. Create is collective over P_x (it creates P_sum and the group
// communicators of the primitives). Forward and backward are collective over P_x;
// ranks outside P_x hold zero-volume x and y and return at once (they belong to no
// group of this layer). Forward and backward allocate nothing: every plan and buffer
// is built in create. Backward reads the caller's x of the last forward by reference,
// not from a copy (the saved-tensor contract of ddl/layers.h), and with a fused ReLU its y
// as well (the ReLU's mask).
//
// Fused ReLU (ddl_batchnorm_fuse_relu): y = relu(B(gamma) * xhat + B(beta)), and backward
// takes the gradient of that y: the formulas above with dy replaced by dy * [y > 0], which
// is what a ReLU layer's backward would have passed (the kernels' _relu forms).
#include <math.h>
#include <string.h>

#include "base/check.h"
#include "ddl/agree.h"
#include "ddl/base.h"
#include "ddl/decomp.h"
#include "layers/layer_impl.h"

typedef struct bn_impl {
    ddl_partition_t  *P_sum;       // [1, P_c, 1, ...]: the [0, c, 0, ...] ranks of P_x
    bool              active;      // this rank is in P_x
    bool              root;        // this rank is in P_sum (owns gamma/beta piece)
    bool              affine;
    double            eps;
    ddl_batchnorm_params bp;       // momentum / cumulative for the running update
    int64_t           N, C, S;     // local block [N, C_loc, S] of x
    int64_t           V;           // global count per channel
    int64_t           nbt;         // num_batches_tracked
    // Primitives, all f64: the SumReduce of a pair [2 C_loc] (the forward's
    // [s | q + n (m - K)^2], the backward's [s1 | s2]), its Broadcast (the backward's), and
    // the forward's Broadcast of [mean | var | gamma | beta] ([4 C_loc], [2 C_loc] without
    // affine).
    ddl_sum_reduce_t *sr2;
    ddl_broadcast_t  *bc2, *bcs;
    bool              shifted; // st holds a training forward's mean (the shift K)
    // Buffers (zero-volume where the rank holds no such piece).
    ddl_tensor_t     *mean, *var;    // [C_loc] f64: broadcast statistics
    ddl_tensor_t     *invstd;        // [C_loc] f64
    ddl_tensor_t     *loc2, *red2;   // [2 C_loc] f64: a pair local, reduced (P_sum)
    ddl_tensor_t     *g2;            // [2 C_loc] f64: [s1 | s2] global, on every P_x rank
    ddl_tensor_t     *st_src, *st;   // bcs's: mean | var | gamma | beta on P_sum, on P_x
    ddl_tensor_t     *ab;            // [2 C_loc] dt: gamma | beta on P_x
    const void       *x_saved;       // the caller's x of the last forward (not a copy)
    const void       *y_saved;       // and its y, with a fused ReLU (the ReLU's mask)
    ddl_tensor_t     *run_mean, *run_var;  // [C_loc] dt
    bool              have_forward;  // a forward has run (backward needs its state)
    bool              batch_stats;   // the last forward normalized with batch statistics
    bool              relu;          // a ReLU fused on the output (ddl_batchnorm_fuse_relu)
    bool              ran;           // a forward was called (on every rank, active or not)
} bn_impl;

static const char *const KIND = "batchnorm";

// ---- helpers -----------------------------------------------------------------

static ddl_status vec(ddl_dtype dt, int64_t n, ddl_tensor_t **out)
{
    ddl_shape s = ddl_shape_make(1, (int64_t[]){n});
    return ddl_tensor_create(dt, &s, out);
}

static double *f64(const ddl_tensor_t *t)
{
    return (double *)t->data;
}

// gamma and beta as broadcast to this rank (NULL without affine).
static const void *gamma_of(const bn_impl *b)
{
    return b->affine ? b->ab->data : NULL;
}

static const void *beta_of(const bn_impl *b, ddl_dtype dt)
{
    return b->affine ? (const char *)b->ab->data + (size_t)b->C * ddl_dtype_size(dt) : NULL;
}

// ---- forward -----------------------------------------------------------------

// The forward's statistics of x in one SumReduce (see the top): this rank's
// [s | q + n (m - K)^2] (or [s | q] holding every value) into loc2, reduced onto P_sum,
// [mean | var] there into st_src.
static ddl_status stat_reduce(bn_impl *b, ddl_dtype dt, const void *x)
{
    const int64_t C = b->C, n = b->N * b->S;
    double       *s = f64(b->loc2), *m = f64(b->mean);
    const double *K     = b->shifted ? f64(b->st) : NULL;
    const bool    whole = n == b->V;
    DDL_CHECK(ddl_batchnorm_sum(dt, s, x, b->N, C, b->S));
    for (int64_t c = 0; c < C; c++) {
        m[c] = n > 0 ? s[c] / (double)n : 0.0; // this rank's own mean (scratch until the broadcast)
    }
    DDL_CHECK(ddl_batchnorm_sqdev(dt, s + C, x, m, b->N, C, b->S));
    for (int64_t c = 0; c < C && !whole; c++) {
        double d = m[c] - (K != NULL ? K[c] : 0.0);
        s[C + c] += (double)n * d * d;
    }
    DDL_CHECK(ddl_sum_reduce_forward(b->sr2, b->loc2, b->red2));
    if (b->root) {
        const double *r = f64(b->red2), V = (double)b->V;
        double       *o = f64(b->st_src);
        for (int64_t c = 0; c < C; c++) {
            double mean = r[c] / V, d = mean - (K != NULL ? K[c] : 0.0);
            double v = whole ? r[C + c] / V : r[C + c] / V - d * d;
            o[c]     = mean;
            o[C + c] = v < 0.0 ? 0.0 : v; // the cancellation can take a constant channel below 0
        }
    }
    return DDL_OK;
}

static ddl_status bn_forward(ddl_layer_t *L, const ddl_tensor_t *x, ddl_tensor_t *y)
{
    bn_impl *b = L->impl;
    // Same verdict on every rank: V is global.
    DDL_REQUIRE(!L->training || b->V > 1, DDL_EINVAL,
                "batchnorm: expected more than 1 value per channel when training, got "
                "N * prod(spatial) = %lld",
                (long long)b->V);
    b->ran = true;
    if (!b->active) {
        return DDL_OK;
    }
    ddl_dtype dt = L->dt;
    b->x_saved   = x->data;  // the caller keeps x unchanged until backward (layers.h)
    b->y_saved   = y->data;  // and y
    double       *mean = f64(b->mean), *var = f64(b->var), *invstd = f64(b->invstd);
    const int64_t C = b->C;
    // [mean | var | gamma | beta] in one broadcast from P_sum (the statistics only in
    // training, gamma | beta only with affine; eval without affine moves nothing).
    if (L->training) {
        DDL_CHECK(stat_reduce(b, dt, x->data));
    }
    if (b->affine && b->root) {
        double *o = f64(b->st_src) + 2 * C;
        for (int64_t c = 0; c < C; c++) {
            o[c]     = ddl_tensor_get(L->params[0].value, c);
            o[C + c] = ddl_tensor_get(L->params[1].value, c);
        }
    }
    if (L->training || b->affine) {
        DDL_CHECK(ddl_broadcast_forward(b->bcs, b->st_src, b->st));
    }
    const double *st = f64(b->st);
    if (L->training) {
        b->shifted = true; // every rank of the channel holds the same st
        for (int64_t c = 0; c < C; c++) {
            mean[c]   = st[c];
            var[c]    = st[C + c];
            invstd[c] = 1.0 / sqrt(var[c] + b->eps);
        }
        b->nbt++;
        double f = ddl_batchnorm_update_factor(&b->bp, b->nbt);
        DDL_CHECK(ddl_batchnorm_running_update(dt, b->run_mean->data, b->run_var->data, mean, var,
                                               C, b->V, f));
    } else {
        for (int64_t c = 0; c < C; c++) {
            mean[c]   = ddl_tensor_get(b->run_mean, c);
            invstd[c] = 1.0 / sqrt(ddl_tensor_get(b->run_var, c) + b->eps);
        }
    }
    if (b->affine) {
        for (int64_t c = 0; c < 2 * C; c++) {
            ddl_tensor_set(b->ab, c, st[2 * C + c]); // exact: the values came from dt
        }
    }
    DDL_CHECK((b->relu ? ddl_batchnorm_normalize_relu : ddl_batchnorm_normalize)(
        dt, y->data, x->data, mean, invstd, gamma_of(b), beta_of(b, dt), b->N, b->C, b->S));
    b->batch_stats  = L->training;
    b->have_forward = true;
    return DDL_OK;
}

// ---- backward ----------------------------------------------------------------

static ddl_status bn_backward(ddl_layer_t *L, const ddl_tensor_t *dy, ddl_tensor_t *dx)
{
    bn_impl *b = L->impl;
    DDL_REQUIRE(b->have_forward || !b->active, DDL_EINVAL,
                "batchnorm: backward called before any forward");
    if (!b->active) {
        return DDL_OK;
    }
    ddl_dtype     dt     = L->dt;
    const double *mean   = f64(b->mean), *invstd = f64(b->invstd);
    double       *s      = f64(b->loc2);
    bool          reduce = b->batch_stats || b->affine;
    if (reduce) {
        // Local [s1 | s2], summed onto P_sum: the parameter gradients there. With a fused
        // ReLU, of dy masked by the ReLU (recomputed from x).
        DDL_CHECK(b->relu ? ddl_batchnorm_backward_reduce_relu(dt, s, s + b->C, dy->data,
                                                               b->y_saved, b->x_saved, mean, invstd,
                                                               b->N, b->C, b->S)
                          : ddl_batchnorm_backward_reduce(dt, s, s + b->C, dy->data, b->x_saved,
                                                          mean, invstd, b->N, b->C, b->S));
        DDL_CHECK(ddl_sum_reduce_forward(b->sr2, b->loc2, b->red2));
        if (b->root && b->affine) {
            const double *r = f64(b->red2);
            DDL_CHECK(ddl_batchnorm_param_grads(dt, L->params[0].grad->data,
                                                L->params[1].grad->data, r, r + b->C, b->C));
        }
    }
    // dx is overwritten by the kernel (no zeroing pass).
    const double *g = NULL;
    if (b->batch_stats) {
        DDL_CHECK(ddl_broadcast_forward(b->bc2, b->red2, b->g2));
        g = f64(b->g2);
    }
    if (b->relu) {
        return ddl_batchnorm_backward_apply_relu_into(dt, dx->data, dy->data, b->y_saved,
                                                      b->x_saved, mean, invstd, gamma_of(b), g,
                                                      g ? g + b->C : NULL, b->V, b->N, b->C, b->S);
    }
    return ddl_batchnorm_backward_apply_into(dt, dx->data, dy->data, b->x_saved, mean, invstd,
                                             gamma_of(b), g, g ? g + b->C : NULL, b->V, b->N, b->C,
                                             b->S);
}

// ---- lifecycle ---------------------------------------------------------------

static void bn_destroy(ddl_layer_t *L)
{
    bn_impl *b = L->impl;
    if (b == NULL) {
        return;
    }
    ddl_sum_reduce_destroy(&b->sr2);
    ddl_broadcast_destroy(&b->bc2);
    ddl_broadcast_destroy(&b->bcs);
    ddl_tensor_t **ts[] = {&b->mean,   &b->var, &b->invstd, &b->loc2,     &b->red2,   &b->g2,
                           &b->st_src, &b->st,  &b->ab,     &b->run_mean, &b->run_var};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
        ddl_tensor_destroy(ts[i]);
    }
    ddl_partition_destroy(&b->P_sum);
    ddl_free(b);
    L->impl = NULL;
}

static const ddl_layer_ops bn_ops = {
    .forward  = bn_forward,
    .backward = bn_backward,
    .destroy  = bn_destroy,
};

// Pure checks of the arguments: the same verdict on every rank, before any MPI call.
static ddl_status validate(const ddl_partition_t *P_x, ddl_dtype dt, const ddl_shape *x_global,
                           double eps, double momentum, ddl_layer_t **out)
{
    DDL_REQUIRE(P_x != NULL && x_global != NULL && out != NULL, DDL_EINVAL,
                "batchnorm: P_x, x_global and out must not be NULL");
    DDL_REQUIRE(dt == DDL_F32 || dt == DDL_F64, DDL_EINVAL, "batchnorm: unknown dtype %d",
                (int)dt);
    int nd = x_global->ndim;
    DDL_REQUIRE(nd >= 2 && nd <= DDL_MAX_DIMS, DDL_EINVAL,
                "batchnorm: x has %d dims, expected [N, C, spatial...] with 2 to %d dims", nd,
                DDL_MAX_DIMS);
    DDL_REQUIRE(ddl_partition_ndim(P_x) == nd, DDL_EINVAL,
                "batchnorm: P_x has %d dims but x has %d", ddl_partition_ndim(P_x), nd);
    for (int d = 0; d < nd; d++) {
        DDL_REQUIRE(x_global->d[d] >= 0, DDL_EINVAL, "batchnorm: x_global[%d] = %lld < 0", d,
                    (long long)x_global->d[d]);
    }
    DDL_REQUIRE(x_global->d[1] >= 1, DDL_EINVAL,
                "batchnorm: num_features (x_global[1]) = %lld must be at least 1",
                (long long)x_global->d[1]);
    DDL_REQUIRE(isfinite(eps) && eps >= 0.0, DDL_EINVAL,
                "batchnorm: eps = %g must be finite and >= 0", eps);
    DDL_REQUIRE(isfinite(momentum) && momentum <= 1.0, DDL_EINVAL,
                "batchnorm: momentum = %g must be <= 1 (or < 0 for the cumulative average)",
                momentum);
    return DDL_OK;
}

ddl_status ddl_batchnorm_create(const ddl_partition_t *P_x, ddl_dtype dt,
                                const ddl_shape *x_global, double eps, double momentum,
                                bool affine, ddl_layer_t **out)
{
    DDL_CHECK(validate(P_x, dt, x_global, eps, momentum, out));
    int        nd  = x_global->ndim;
    const int *pxs = ddl_partition_shape(P_x);
    int        Pc  = pxs[1];

    ddl_layer_t *L = NULL;
    ddl_status ast = ddl_layer_alloc(&bn_ops, KIND, dt, &L);
    bn_impl   *b   = ast == DDL_OK ? ddl_calloc(1, sizeof *b) : NULL;
    int       *sr  = ast == DDL_OK ? ddl_malloc(sizeof(int) * (size_t)Pc) : NULL;
    ddl_status st  = DDL_OK;
    if (ast == DDL_OK && (b == NULL || sr == NULL)) {
        ast = ddl_set_error(DDL_ENOMEM, "batchnorm: out of memory");
    }
    // The members agree on these allocations before any collective construction, so a
    // member whose allocation failed fails them all instead of leaving them waiting.
    ast = ddl_partition_agree_union(P_x, NULL, NULL, ast);
    if (ast != DDL_OK) {
        ddl_free(b);
        ddl_free(sr);
        ddl_layer_destroy(&L);
        return ast;
    }
    L->impl     = b;
    L->x_global = *x_global;
    L->y_global = *x_global;
    L->x_shape  = ddl_partition_local_shape(P_x, x_global);
    L->y_shape  = L->x_shape;
    L->P_in     = P_x;
    L->P_out    = P_x;

    b->affine        = affine;
    b->eps           = eps;
    b->bp            = ddl_batchnorm_params_default();
    b->bp.eps        = eps;
    b->bp.cumulative = momentum < 0.0;
    b->bp.momentum   = momentum < 0.0 ? 0.0 : momentum;
    b->V             = x_global->d[0];
    for (int d = 2; d < nd; d++) {
        b->V *= x_global->d[d];
    }
    b->active = ddl_partition_active(P_x);
    b->N      = L->x_shape.d[0];
    b->C      = L->x_shape.d[1];
    b->S      = 1;
    for (int d = 2; d < nd; d++) {
        b->S *= L->x_shape.d[d];
    }

    // P_sum: the P_x ranks at [0, c, 0, ...], as a [1, P_c, 1, ...] partition.
    int coord[DDL_MAX_DIMS] = {0}, sshape[DDL_MAX_DIMS];
    for (int d = 0; d < nd; d++) {
        sshape[d] = d == 1 ? Pc : 1;
    }
    for (int c = 0; c < Pc; c++) {
        coord[1] = c;
        sr[c]    = ddl_partition_rank_at(P_x, coord);
    }
    // Every collective construction below ends agreed over P_x (U), which holds all
    // the layer's ranks, so a step that failed on some of them stops all of them there.
    MPI_Comm U = ddl_partition_comm(P_x);
    st         = ddl_partition_create(ddl_partition_base(P_x), Pc, sr, nd, sshape, &b->P_sum);
    ddl_free(sr);
    DDL_CHECK_GOTO(ddl_agree(U, st), st, fail);
    b->root = ddl_partition_active(b->P_sum);

    // Primitives and buffers: [C_loc] on P_x ranks (zero elsewhere); the reduced
    // vectors and the owned parameters only on P_sum.
    int64_t   Cx = b->C, Cr = b->root ? b->C : 0;
    int64_t   W  = affine ? 4 : 2; // [mean | var | gamma | beta], or [mean | var]
    ddl_shape s2 = ddl_shape_make(1, (int64_t[]){2 * Cx});
    ddl_shape sw = ddl_shape_make(1, (int64_t[]){W * Cx});
    DDL_CHECK_GOTO(ddl_agree(U, ddl_sum_reduce_create(P_x, b->P_sum, false, false, DDL_F64, &s2, &b->sr2)), st,
                   fail);
    DDL_CHECK_GOTO(ddl_agree(U, ddl_broadcast_create(b->P_sum, P_x, false, false, DDL_F64, &s2, &b->bc2)), st,
                   fail);
    DDL_CHECK_GOTO(
        ddl_agree(U, ddl_broadcast_create(b->P_sum, P_x, false, false, DDL_F64, &sw, &b->bcs)), st,
        fail);
    DDL_CHECK_GOTO(vec(DDL_F64, Cx, &b->mean), st, fail);
    DDL_CHECK_GOTO(vec(DDL_F64, Cx, &b->var), st, fail);
    DDL_CHECK_GOTO(vec(DDL_F64, Cx, &b->invstd), st, fail);
    DDL_CHECK_GOTO(vec(DDL_F64, 2 * Cx, &b->loc2), st, fail);
    DDL_CHECK_GOTO(vec(DDL_F64, 2 * Cr, &b->red2), st, fail);
    DDL_CHECK_GOTO(vec(DDL_F64, 2 * Cx, &b->g2), st, fail);
    DDL_CHECK_GOTO(vec(DDL_F64, W * Cr, &b->st_src), st, fail);
    DDL_CHECK_GOTO(vec(DDL_F64, W * Cx, &b->st), st, fail);
    DDL_CHECK_GOTO(vec(dt, affine ? 2 * Cx : 0, &b->ab), st, fail);
    DDL_CHECK_GOTO(vec(dt, Cx, &b->run_mean), st, fail);
    DDL_CHECK_GOTO(vec(dt, Cx, &b->run_var), st, fail);
    for (int64_t c = 0; c < Cx; c++) {
        ddl_tensor_set(b->run_var, c, 1.0);
    }

    if (affine) {
        // gamma ("weight") and beta ("bias"), [C]: piece c on P_sum rank c.
        ddl_shape pg  = ddl_shape_make(1, (int64_t[]){x_global->d[1]});
        ddl_box   box = {.ndim = 1};
        if (b->root) {
            box.start[0] = ddl_decomp_start(x_global->d[1], Pc, ddl_partition_index(b->P_sum)[1]);
            box.stop[0]  = box.start[0] + Cr;
        }
        DDL_CHECK_GOTO(ddl_layer_add_param(L, "weight", &pg, &box, DDL_INIT_ONES, x_global->d[1]),
                       st, fail);
        DDL_CHECK_GOTO(ddl_layer_add_param(L, "bias", &pg, &box, DDL_INIT_ZEROS, x_global->d[1]),
                       st, fail);
        // PyTorch's initial values, so the layer is usable without ddl_layer_init_params
        // (not in a copy: its values are another layer's, ddl_layer_lend_params).
        if (!L->borrowed) {
            ddl_init_fill(L->params[0].value, &box, &pg, DDL_INIT_ONES, 0, 0, 0);
        }
    }
    *out = L;
    return DDL_OK;
fail:
    ddl_layer_destroy(&L);
    return st;
}

ddl_status ddl_batchnorm_running_stats(const ddl_layer_t *L, ddl_tensor_t **mean,
                                       ddl_tensor_t **var)
{
    DDL_REQUIRE(L != NULL && L->ops == &bn_ops, DDL_EINVAL,
                "batchnorm_running_stats: the layer is not a batch-norm layer");
    bn_impl *b = L->impl;
    if (mean != NULL) {
        *mean = b->run_mean;
    }
    if (var != NULL) {
        *var = b->run_var;
    }
    return DDL_OK;
}

ddl_status ddl_batchnorm_fuse_relu(ddl_layer_t *L, bool on)
{
    DDL_REQUIRE(L != NULL && L->ops == &bn_ops, DDL_EINVAL,
                "batchnorm_fuse_relu: the layer is not a batch-norm layer");
    bn_impl *b = L->impl;
    DDL_REQUIRE(!b->ran, DDL_EINVAL,
                "batchnorm_fuse_relu: the layer has already run a forward; fuse before the first");
    b->relu = on;
    return DDL_OK;
}
