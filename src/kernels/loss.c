// kernels/loss.c: elementwise losses and softmax cross-entropy, forward and backward.
//
// Elementwise losses: x (input) and t (target) are [n]. Forward returns the local sum of
// the per-element losses in double and optionally writes them; the caller applies the
// reduction (divide by the global numel for "mean", by the batch for "batchmean"),
// after summing over ranks. Backward: dx += scale * g_i * dL_i/dx_i.
//
// Cross-entropy: logits [B, C], labels [B] (int64). B = batch, C = classes. With the
// class dimension split over ranks a rank holds [B, Cl], classes [c0, c0 + Cl), and
// the log-sum-exp is assembled from a max all-reduce and a sum all-reduce of the
// local pieces below. On N-d input (segmentation) logits are [B, C, V] and labels
// [B, V], V voxels per sample; the class dimension is then never split.
//
// The formulas follow PyTorch (docs of torch.nn.MSELoss, L1Loss, BCELoss,
// BCEWithLogitsLoss, KLDivLoss, PoissonNLLLoss, CrossEntropyLoss; ATen's
// aten/src/ATen/native/Loss.cpp for the BCE log clamp at -100, its input/target range
// check and its backward (x - t) / max(x (1 - x), 1e-12)).
#include <math.h>

#include "base/check.h"
#include "ddl/base.h"
#include "ddl/kernels_pointwise.h"
#include "kernels/dtype.h"


static ddl_status check_dtype(const char *who, ddl_dtype dt)
{
    DDL_REQUIRE(dt == DDL_F32 || dt == DDL_F64, DDL_EINVAL, "%s: unknown dtype %d", who, (int)dt);
    return DDL_OK;
}

// ---- elementwise losses -------------------------------------------------------------

#define BCE_LOG_MIN (-100.0) // PyTorch clamps each log term of BCE at -100
#define BCE_EPS     1e-12    // and the denominator of its gradient at 1e-12

// The kinds, for dispatch with a constant kind (X-macro, as in ddl/status.h).
#define LOSS_KINDS(X)           \
    X(DDL_LOSS_MSE)             \
    X(DDL_LOSS_L1)              \
    X(DDL_LOSS_BCE)             \
    X(DDL_LOSS_BCE_WITH_LOGITS) \
    X(DDL_LOSS_KL_DIV)          \
    X(DDL_LOSS_POISSON_NLL)     \
    X(DDL_LOSS_KL_DIV_LOG_TARGET)

static bool loss_kind_valid(ddl_loss_kind kind)
{
    switch (kind) {
#define X(k) case k:
        LOSS_KINDS(X)
#undef X
        return true;
    case DDL_LOSS_CROSS_ENTROPY:  // not elementwise: ddl_cross_entropy_*
        return false;
    }
    return false;
}

// L(x, t) for one element.
KERNEL double loss_f(ddl_loss_kind kind, double x, double t)
{
    switch (kind) {
    case DDL_LOSS_MSE:
        return (x - t) * (x - t);
    case DDL_LOSS_L1:
        return fabs(x - t);
    case DDL_LOSS_BCE:
        return (t - 1.0) * fmax(log1p(-x), BCE_LOG_MIN) - t * fmax(log(x), BCE_LOG_MIN);
    case DDL_LOSS_BCE_WITH_LOGITS:
        return fmax(x, 0.0) - x * t + log1p(exp(-fabs(x)));
    case DDL_LOSS_KL_DIV:
        // xlogy(t, t) - t x: the first term is 0 where t == 0.
        return (t == 0.0 ? 0.0 : t * log(t)) - t * x;
    case DDL_LOSS_POISSON_NLL:
        return exp(x) - t * x;
    case DDL_LOSS_KL_DIV_LOG_TARGET:
        return exp(t) * (t - x);
    case DDL_LOSS_CROSS_ENTROPY:
        break;
    }
    return 0.0;
}

// dL/dx for one element.
KERNEL double loss_df(ddl_loss_kind kind, double x, double t)
{
    switch (kind) {
    case DDL_LOSS_MSE:
        return 2.0 * (x - t);
    case DDL_LOSS_L1:
        return x > t ? 1.0 : (x < t ? -1.0 : 0.0);
    case DDL_LOSS_BCE:
        return (x - t) / fmax((1.0 - x) * x, BCE_EPS);
    case DDL_LOSS_BCE_WITH_LOGITS: {
        // sigmoid(x) - t, split by sign so exp never overflows.
        double s = x >= 0.0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x));
        return s - t;
    }
    case DDL_LOSS_KL_DIV:
        return -t;
    case DDL_LOSS_POISSON_NLL:
        return exp(x) - t;
    case DDL_LOSS_KL_DIV_LOG_TARGET:
        return -exp(t);
    case DDL_LOSS_CROSS_ENTROPY:
        break;
    }
    return 0.0;
}

KERNEL double loss_forward_kernel(ddl_dtype dt, ddl_loss_kind kind, void *loss, const void *x,
                                  const void *t, int64_t n)
{
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double l = loss_f(kind, ld(dt, x, i), ld(dt, t, i));
        if (loss) {
            st(dt, loss, i, l);
        }
        sum += l;
    }
    return sum;
}

KERNEL void loss_backward_kernel(ddl_dtype dt, ddl_loss_kind kind, void *dx, const void *dloss,
                                 double scale, const void *x, const void *t, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        double g = dloss ? scale * ld(dt, dloss, i) : scale;
        acc(dt, dx, i, g * loss_df(kind, ld(dt, x, i), ld(dt, t, i)));
    }
}

// PyTorch's BCE requires input and target in [0, 1] (NaN fails too).
KERNEL ddl_status bce_check(ddl_dtype dt, const char *who, const void *x, const void *t,
                            int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        double xi = ld(dt, x, i), ti = ld(dt, t, i);
        DDL_REQUIRE(xi >= 0.0 && xi <= 1.0, DDL_EINVAL,
                    "%s: all elements of input should be between 0 and 1, x[%lld] = %g", who,
                    (long long)i, xi);
        DDL_REQUIRE(ti >= 0.0 && ti <= 1.0, DDL_EINVAL,
                    "%s: all elements of target should be between 0 and 1, t[%lld] = %g", who,
                    (long long)i, ti);
    }
    return DDL_OK;
}

static ddl_status loss_check(const char *who, ddl_loss_kind kind, ddl_dtype dt, const void *x,
                             const void *t, int64_t n)
{
    DDL_CHECK(check_dtype(who, dt));
    DDL_REQUIRE(loss_kind_valid(kind), DDL_EINVAL, "%s: unknown loss kind %d", who, (int)kind);
    DDL_REQUIRE(n >= 0, DDL_EINVAL, "%s: element count %lld < 0", who, (long long)n);
    DDL_REQUIRE(n == 0 || (x && t), DDL_EINVAL, "%s: NULL input or target", who);
    if (kind == DDL_LOSS_BCE) {
        if (dt == DDL_F32) {
            DDL_CHECK(bce_check(DDL_F32, who, x, t, n));
        } else {
            DDL_CHECK(bce_check(DDL_F64, who, x, t, n));
        }
    }
    return DDL_OK;
}

ddl_status ddl_eloss_forward(ddl_loss_kind kind, ddl_dtype dt, void *loss, double *sum,
                            const void *x, const void *t, int64_t n)
{
    DDL_CHECK(loss_check("loss_forward", kind, dt, x, t, n));
    double s = 0.0;
    switch (kind) {
#define X(k)                                                                \
    case k:                                                                 \
        s = dt == DDL_F32 ? loss_forward_kernel(DDL_F32, k, loss, x, t, n)  \
                          : loss_forward_kernel(DDL_F64, k, loss, x, t, n); \
        break;
        LOSS_KINDS(X)
#undef X
    case DDL_LOSS_CROSS_ENTROPY:
        break;
    }
    if (sum) {
        *sum = s;
    }
    return DDL_OK;
}

ddl_status ddl_eloss_backward(ddl_loss_kind kind, ddl_dtype dt, void *dx, const void *dloss,
                             double scale, const void *x, const void *t, int64_t n)
{
    DDL_CHECK(loss_check("loss_backward", kind, dt, x, t, n));
    if (dx == NULL) {
        return DDL_OK;
    }
    switch (kind) {
#define X(k)                                                                 \
    case k:                                                                  \
        if (dt == DDL_F32) {                                                 \
            loss_backward_kernel(DDL_F32, k, dx, dloss, scale, x, t, n);     \
        } else {                                                             \
            loss_backward_kernel(DDL_F64, k, dx, dloss, scale, x, t, n);     \
        }                                                                    \
        break;
        LOSS_KINDS(X)
#undef X
    case DDL_LOSS_CROSS_ENTROPY:
        break;
    }
    return DDL_OK;
}

// ---- cross-entropy: row kernels ------------------------------------------------------
// Row b of a [B, W] block starts at b*W.

KERNEL double row_max(ddl_dtype dt, const void *logits, int64_t b, int64_t W)
{
    double m = -INFINITY;
    for (int64_t j = 0; j < W; j++) {
        double v = ld(dt, logits, b * W + j);
        m        = v > m ? v : m;
    }
    return m;
}

// sum_j exp(x_bj - m).
KERNEL double row_sumexp(ddl_dtype dt, const void *logits, int64_t b, int64_t W, double m)
{
    double s = 0.0;
    for (int64_t j = 0; j < W; j++) {
        s += exp(ld(dt, logits, b * W + j) - m);
    }
    return s;
}

// dlogits_bj += g * (exp(x_bj - m)/s - [j == lj]); lj is the label's local column or -1.
KERNEL void row_backward(ddl_dtype dt, void *dlogits, const void *logits, int64_t b, int64_t W,
                         double m, double s, int64_t lj, double g)
{
    double inv = 1.0 / s;
    for (int64_t j = 0; j < W; j++) {
        double p = exp(ld(dt, logits, b * W + j) - m) * inv;
        acc(dt, dlogits, b * W + j, g * (j == lj ? p - 1.0 : p));
    }
}

static ddl_status check_labels(const char *who, const int64_t *labels, int64_t B, int64_t C)
{
    for (int64_t b = 0; b < B; b++) {
        DDL_REQUIRE(labels[b] >= 0 && labels[b] < C, DDL_EINVAL,
                    "%s: label %lld of row %lld is outside [0, %lld) (the number of classes)",
                    who, (long long)labels[b], (long long)b, (long long)C);
    }
    return DDL_OK;
}

static ddl_status ce_check(const char *who, ddl_dtype dt, int64_t B, int64_t c0, int64_t Cl,
                           int64_t C)
{
    DDL_CHECK(check_dtype(who, dt));
    DDL_REQUIRE(B >= 0 && C >= 0, DDL_EINVAL, "%s: negative size B = %lld, C = %lld", who,
                (long long)B, (long long)C);
    DDL_REQUIRE(c0 >= 0 && Cl >= 0 && c0 + Cl <= C, DDL_EINVAL,
                "%s: local classes [%lld, %lld) outside [0, %lld)", who, (long long)c0,
                (long long)(c0 + Cl), (long long)C);
    return DDL_OK;
}

// ---- cross-entropy: sequential -------------------------------------------------------

KERNEL double ce_forward_kernel(ddl_dtype dt, void *loss, const void *logits,
                                const int64_t *labels, int64_t B, int64_t C)
{
    double sum = 0.0;
    for (int64_t b = 0; b < B; b++) {
        double m = row_max(dt, logits, b, C);
        // (m - x_label) first: exact when the two are close, so no cancellation.
        double l = (m - ld(dt, logits, b * C + labels[b])) + log(row_sumexp(dt, logits, b, C, m));
        if (loss) {
            st(dt, loss, b, l);
        }
        sum += l;
    }
    return sum;
}

KERNEL void ce_backward_kernel(ddl_dtype dt, void *dlogits, const void *dloss, double scale,
                               const void *logits, const int64_t *labels, int64_t B, int64_t C)
{
    for (int64_t b = 0; b < B; b++) {
        double m = row_max(dt, logits, b, C);
        double s = row_sumexp(dt, logits, b, C, m);
        double g = dloss ? scale * ld(dt, dloss, b) : scale;
        row_backward(dt, dlogits, logits, b, C, m, s, labels[b], g);
    }
}

ddl_status ddl_cross_entropy_forward(ddl_dtype dt, void *loss, double *sum, const void *logits,
                                     const int64_t *labels, int64_t B, int64_t C)
{
    DDL_CHECK(ce_check("cross_entropy_forward", dt, B, 0, C, C));
    DDL_REQUIRE(B == 0 || (logits && labels), DDL_EINVAL,
                "cross_entropy_forward: NULL logits or labels");
    DDL_CHECK(check_labels("cross_entropy_forward", labels, B, C));
    double s = dt == DDL_F32 ? ce_forward_kernel(DDL_F32, loss, logits, labels, B, C)
                             : ce_forward_kernel(DDL_F64, loss, logits, labels, B, C);
    if (sum) {
        *sum = s;
    }
    return DDL_OK;
}

ddl_status ddl_cross_entropy_backward(ddl_dtype dt, void *dlogits, const void *dloss,
                                      double scale, const void *logits, const int64_t *labels,
                                      int64_t B, int64_t C)
{
    DDL_CHECK(ce_check("cross_entropy_backward", dt, B, 0, C, C));
    if (dlogits == NULL || B == 0) {
        return DDL_OK;
    }
    DDL_REQUIRE(logits && labels, DDL_EINVAL, "cross_entropy_backward: NULL logits or labels");
    DDL_CHECK(check_labels("cross_entropy_backward", labels, B, C));
    if (dt == DDL_F32) {
        ce_backward_kernel(DDL_F32, dlogits, dloss, scale, logits, labels, B, C);
    } else {
        ce_backward_kernel(DDL_F64, dlogits, dloss, scale, logits, labels, B, C);
    }
    return DDL_OK;
}

// ---- cross-entropy: N-d input (class dimension strided) --------------------------------
// Voxel (b, v) of logits [B, C, V] has its C logits at b*C*V + c*V + v. The loops run v
// innermost so each class's logits stream through memory in order.

// The voxels go in blocks of up to CE_ND_BLOCK: each pass over the classes then runs v
// innermost, in memory order, and the backward keeps the block's exp(x - m), which it
// needs twice (the sum, then each probability), in CE_ND_CACHE doubles (one class row per
// CE_ND_BLOCK voxels at most). Every voxel's operations are those of one voxel at a time,
// in the same order (max and sum over c ascending): the bits do not depend on the block.
#define CE_ND_BLOCK 256
#define CE_ND_CACHE 4096

// The block's voxels [v0, v0 + nv) of sample b: m[i] = max_c x, s[i] = sum_c exp(x - m),
// and with e != NULL e[c nv + i] = exp(x - m) (room for C nv doubles).
KERNEL void ce_nd_block_stats(ddl_dtype dt, const void *logits, int64_t base, int64_t C, int64_t V,
                              int64_t v0, int64_t nv, double *m, double *s, double *e)
{
    for (int64_t i = 0; i < nv; i++) {
        m[i] = -INFINITY;
        s[i] = 0.0;
    }
    for (int64_t c = 0; c < C; c++) {
        for (int64_t i = 0; i < nv; i++) {
            double x = ld(dt, logits, base + c * V + v0 + i);
            m[i]     = x > m[i] ? x : m[i];
        }
    }
    for (int64_t c = 0; c < C; c++) {
        for (int64_t i = 0; i < nv; i++) {
            double x = exp(ld(dt, logits, base + c * V + v0 + i) - m[i]);
            s[i] += x;
            if (e != NULL) {
                e[c * nv + i] = x;
            }
        }
    }
}

// Voxels per block: CE_ND_BLOCK, fewer when C classes of them pass the cache.
static int64_t ce_nd_block(int64_t C)
{
    int64_t nb = CE_ND_CACHE / C;
    return nb > CE_ND_BLOCK ? CE_ND_BLOCK : nb > 0 ? nb : 1;
}

KERNEL double ce_nd_forward_kernel(ddl_dtype dt, void *loss, const void *logits,
                                   const int64_t *labels, int64_t B, int64_t C, int64_t V)
{
    double sum = 0.0;
    double m[CE_ND_BLOCK], s[CE_ND_BLOCK];
    for (int64_t b = 0; b < B; b++) {
        int64_t base = b * C * V;
        for (int64_t v0 = 0; v0 < V; v0 += CE_ND_BLOCK) {
            int64_t nv = V - v0 < CE_ND_BLOCK ? V - v0 : CE_ND_BLOCK;
            ce_nd_block_stats(dt, logits, base, C, V, v0, nv, m, s, NULL);
            for (int64_t i = 0; i < nv; i++) {
                int64_t v = v0 + i;
                // (m - x_label) first, as in the [B, C] kernel.
                double l = (m[i] - ld(dt, logits, base + labels[b * V + v] * V + v)) + log(s[i]);
                if (loss) {
                    st(dt, loss, b * V + v, l);
                }
                sum += l;
            }
        }
    }
    return sum;
}

KERNEL void ce_nd_backward_kernel(ddl_dtype dt, void *dlogits, const void *dloss, double scale,
                                  const void *logits, const int64_t *labels, int64_t B,
                                  int64_t C, int64_t V)
{
    const int64_t nb = ce_nd_block(C);
    double        m[CE_ND_BLOCK], s[CE_ND_BLOCK], g[CE_ND_BLOCK], e[CE_ND_CACHE];
    // A class count past the cache: one voxel at a time, its exps computed twice.
    const bool cached = C <= CE_ND_CACHE;
    for (int64_t b = 0; b < B; b++) {
        int64_t base = b * C * V;
        for (int64_t v0 = 0; v0 < V; v0 += nb) {
            int64_t nv = V - v0 < nb ? V - v0 : nb;
            ce_nd_block_stats(dt, logits, base, C, V, v0, nv, m, s, cached ? e : NULL);
            for (int64_t i = 0; i < nv; i++) { // per voxel: 1 / sum and its upstream factor
                s[i] = 1.0 / s[i];
                g[i] = dloss ? scale * ld(dt, dloss, b * V + v0 + i) : scale;
            }
            for (int64_t c = 0; c < C; c++) {
                for (int64_t i = 0; i < nv; i++) {
                    int64_t v = v0 + i;
                    double  x =
                        cached ? e[c * nv + i] : exp(ld(dt, logits, base + c * V + v) - m[i]);
                    double p = x * s[i];
                    acc(dt, dlogits, base + c * V + v,
                        g[i] * (c == labels[b * V + v] ? p - 1.0 : p));
                }
            }
        }
    }
}

static ddl_status check_nd(const char *who, ddl_dtype dt, const int64_t *labels, int64_t B,
                           int64_t C, int64_t V)
{
    DDL_CHECK(check_dtype(who, dt));
    DDL_REQUIRE(B >= 0 && C >= 1 && V >= 0, DDL_EINVAL,
                "%s: sizes B = %lld, C = %lld, V = %lld (need B, V >= 0 and C >= 1)", who,
                (long long)B, (long long)C, (long long)V);
    for (int64_t i = 0; i < B * V; i++) {
        DDL_REQUIRE(labels[i] >= 0 && labels[i] < C, DDL_EINVAL,
                    "%s: label %lld of sample %lld, voxel %lld is outside [0, %lld) (the number "
                    "of classes)",
                    who, (long long)labels[i], (long long)(i / V), (long long)(i % V),
                    (long long)C);
    }
    return DDL_OK;
}

ddl_status ddl_cross_entropy_nd_forward(ddl_dtype dt, void *loss, double *sum, const void *logits,
                                        const int64_t *labels, int64_t B, int64_t C, int64_t V)
{
    DDL_REQUIRE(B * V == 0 || (logits && labels), DDL_EINVAL,
                "cross_entropy_nd_forward: NULL logits or labels");
    DDL_CHECK(check_nd("cross_entropy_nd_forward", dt, labels, B, C, V));
    double s = dt == DDL_F32 ? ce_nd_forward_kernel(DDL_F32, loss, logits, labels, B, C, V)
                             : ce_nd_forward_kernel(DDL_F64, loss, logits, labels, B, C, V);
    if (sum) {
        *sum = s;
    }
    return DDL_OK;
}

ddl_status ddl_cross_entropy_nd_backward(ddl_dtype dt, void *dlogits, const void *dloss,
                                         double scale, const void *logits, const int64_t *labels,
                                         int64_t B, int64_t C, int64_t V)
{
    if (dlogits == NULL || B * V == 0) {
        return check_dtype("cross_entropy_nd_backward", dt);
    }
    DDL_REQUIRE(logits && labels, DDL_EINVAL, "cross_entropy_nd_backward: NULL logits or labels");
    DDL_CHECK(check_nd("cross_entropy_nd_backward", dt, labels, B, C, V));
    if (dt == DDL_F32) {
        ce_nd_backward_kernel(DDL_F32, dlogits, dloss, scale, logits, labels, B, C, V);
    } else {
        ce_nd_backward_kernel(DDL_F64, dlogits, dloss, scale, logits, labels, B, C, V);
    }
    return DDL_OK;
}

// ---- cross-entropy: local pieces for a split class dimension --------------------------

ddl_status ddl_cross_entropy_local_max(ddl_dtype dt, double *rowmax, const void *logits,
                                       int64_t B, int64_t Cl)
{
    DDL_CHECK(ce_check("cross_entropy_local_max", dt, B, 0, Cl, Cl));
    DDL_REQUIRE(B == 0 || (rowmax && (logits || Cl == 0)), DDL_EINVAL,
                "cross_entropy_local_max: NULL buffer");
    for (int64_t b = 0; b < B; b++) {
        rowmax[b] = dt == DDL_F32 ? row_max(DDL_F32, logits, b, Cl)
                                  : row_max(DDL_F64, logits, b, Cl);
    }
    return DDL_OK;
}

ddl_status ddl_cross_entropy_local_sumexp(ddl_dtype dt, double *sumexp, const void *logits,
                                          const double *gmax, int64_t B, int64_t Cl)
{
    DDL_CHECK(ce_check("cross_entropy_local_sumexp", dt, B, 0, Cl, Cl));
    DDL_REQUIRE(B == 0 || (sumexp && gmax && (logits || Cl == 0)), DDL_EINVAL,
                "cross_entropy_local_sumexp: NULL buffer");
    for (int64_t b = 0; b < B; b++) {
        sumexp[b] = dt == DDL_F32 ? row_sumexp(DDL_F32, logits, b, Cl, gmax[b])
                                  : row_sumexp(DDL_F64, logits, b, Cl, gmax[b]);
    }
    return DDL_OK;
}

ddl_status ddl_cross_entropy_local_label_logit(ddl_dtype dt, double *label_logit,
                                               const void *logits, const int64_t *labels,
                                               int64_t B, int64_t c0, int64_t Cl, int64_t C)
{
    DDL_CHECK(ce_check("cross_entropy_local_label_logit", dt, B, c0, Cl, C));
    DDL_REQUIRE(B == 0 || (label_logit && labels && (logits || Cl == 0)), DDL_EINVAL,
                "cross_entropy_local_label_logit: NULL buffer");
    DDL_CHECK(check_labels("cross_entropy_local_label_logit", labels, B, C));
    for (int64_t b = 0; b < B; b++) {
        int64_t j      = labels[b] - c0;
        label_logit[b] = (j >= 0 && j < Cl) ? ld(dt, logits, b * Cl + j) : 0.0;
    }
    return DDL_OK;
}

ddl_status ddl_cross_entropy_combine(ddl_dtype dt, void *loss, double *sum, const double *gmax,
                                     const double *gsum, const double *glabel, int64_t B)
{
    DDL_CHECK(ce_check("cross_entropy_combine", dt, B, 0, 0, 0));
    DDL_REQUIRE(B == 0 || (gmax && gsum && glabel), DDL_EINVAL,
                "cross_entropy_combine: NULL row statistics");
    double s = 0.0;
    for (int64_t b = 0; b < B; b++) {
        double l = (gmax[b] - glabel[b]) + log(gsum[b]);
        if (loss) {
            st(dt, loss, b, l);
        }
        s += l;
    }
    if (sum) {
        *sum = s;
    }
    return DDL_OK;
}

KERNEL void ce_local_backward_kernel(ddl_dtype dt, void *dlogits, const void *dloss,
                                     double scale, const void *logits, const int64_t *labels,
                                     const double *gmax, const double *gsum, int64_t B,
                                     int64_t c0, int64_t Cl)
{
    for (int64_t b = 0; b < B; b++) {
        int64_t j = labels[b] - c0;
        double  g = dloss ? scale * ld(dt, dloss, b) : scale;
        row_backward(dt, dlogits, logits, b, Cl, gmax[b], gsum[b], (j >= 0 && j < Cl) ? j : -1, g);
    }
}

ddl_status ddl_cross_entropy_local_backward(ddl_dtype dt, void *dlogits, const void *dloss,
                                            double scale, const void *logits,
                                            const int64_t *labels, const double *gmax,
                                            const double *gsum, int64_t B, int64_t c0,
                                            int64_t Cl, int64_t C)
{
    DDL_CHECK(ce_check("cross_entropy_local_backward", dt, B, c0, Cl, C));
    if (dlogits == NULL || B == 0) {
        return DDL_OK;
    }
    DDL_REQUIRE(labels && gmax && gsum && (logits || Cl == 0), DDL_EINVAL,
                "cross_entropy_local_backward: NULL buffer");
    DDL_CHECK(check_labels("cross_entropy_local_backward", labels, B, C));
    if (dt == DDL_F32) {
        ce_local_backward_kernel(DDL_F32, dlogits, dloss, scale, logits, labels, gmax, gsum, B,
                                 c0, Cl);
    } else {
        ce_local_backward_kernel(DDL_F64, dlogits, dloss, scale, logits, labels, gmax, gsum, B,
                                 c0, Cl);
    }
    return DDL_OK;
}
