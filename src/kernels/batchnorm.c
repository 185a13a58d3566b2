// kernels/batchnorm.c: batch-normalization statistics, normalization and backward.
//
// x, y, dx, dy are [N, C, S] (S = product of the spatial dims, 1 for [N, C]); the
// element (n, c, s) sits at (n*C + c)*S + s, so each (n, c) row of S values is
// contiguous. Per channel c, over V values (V = N*S locally, or the global count when
// the sums come from an all-reduce):
//   mean = sum(x)/V,  var = sum((x - mean)^2)/V,  invstd = 1/sqrt(var + eps)
//   xhat = (x - mean)*invstd,  y = gamma*xhat + beta
//   dx  += gamma*invstd*(dy - sum(dy)/V - xhat*sum(dy*xhat)/V)   (the _into form: dx = ...)
//   dgamma += sum(dy*xhat),  dbeta += sum(dy)
// The variance takes two passes (sum, then squared deviations about the mean), which
// is what DistDL does and avoids the cancellation of E[x^2] - E[x]^2. All sums are in
// double, each over BN_LANES independent lanes (element s of every row goes to lane
// s mod BN_LANES) added in a fixed order at the end: the loops vectorize and no add waits
// for the one before, and the result depends only on the shape, the same bits on every
// machine and vector width. Reference:
// https://pytorch.org/docs/stable/generated/torch.nn.BatchNorm2d.html and, for the backward, the
// batch_norm_backward_reduce / _elemt split of PyTorch's SyncBatchNorm, which is the same
// decomposition the distributed layer uses.
#include <math.h>
#include <string.h>

#include "base/check.h"
#include "ddl/base.h"
#include "ddl/kernels_pointwise.h"
#include "kernels/batchnorm.h"
#include "kernels/dtype.h"


static ddl_status check_dims(const char *who, ddl_dtype dt, int64_t N, int64_t C, int64_t S)
{
    DDL_REQUIRE(dt == DDL_F32 || dt == DDL_F64, DDL_EINVAL, "%s: unknown dtype %d", who, (int)dt);
    DDL_REQUIRE(N >= 0 && C >= 0 && S >= 0, DDL_EINVAL,
                "%s: negative size in [N, C, S] = [%lld, %lld, %lld]", who, (long long)N,
                (long long)C, (long long)S);
    return DDL_OK;
}

// ---- per-channel kernels ----------------------------------------------------------
// Each walks the N rows of S contiguous values of one channel c.

#define BN_LANES 8
// Channels whose sums one pass in memory order carries (their lanes: 2 KB).
#define BN_CBLOCK 32

// The entry points that sweep the data are built three times, for AVX-512F, AVX2 and the
// baseline (SSE2), and pick one per call by the CPU (BN_DISPATCH below: GCC's
// target_clones would do it, but clang 14 leaves the plain name undefined for other
// files). Without FMA (none of the three targets has it, so nothing is contracted) and
// with the lanes fixed above, all compute the same operations per element: the same bits
// (test_batchnorm_kernel's test_widths compares every entry at every width the CPU has).
// AVX2 halves the instructions of the float <-> double conversions, 1.5-1.7x per pass;
// AVX-512 halves them again (the vectors below are 8 doubles, one register there, two at
// AVX2).
static int bn_width_cap = -1;

static int bn_width(void)
{
    return cpu_width(bn_width_cap);
}

int ddl_batchnorm_width(void)
{
    return bn_width();
}

int ddl_batchnorm_set_width(int width)
{
    return cpu_width_set_cap(&bn_width_cap, width);
}

#define BN_DISPATCH(name, params, args)                                                            \
    __attribute__((target("avx512f"))) static ddl_status name##_avx512 params                      \
    {                                                                                              \
        return name##_body args;                                                                   \
    }                                                                                              \
    __attribute__((target("avx2"))) static ddl_status name##_avx2 params                           \
    {                                                                                              \
        return name##_body args;                                                                   \
    }                                                                                              \
    static ddl_status name##_base params                                                           \
    {                                                                                              \
        return name##_body args;                                                                   \
    }                                                                                              \
    ddl_status name params                                                                         \
    {                                                                                              \
        switch (bn_width()) {                                                                      \
        case 2:                                                                                    \
            return name##_avx512 args;                                                             \
        case 1:                                                                                    \
            return name##_avx2 args;                                                               \
        default:                                                                                   \
            return name##_base args;                                                               \
        }                                                                                          \
    }

// The loops below hold the BN_LANES lanes of a sum in one vector of GCC/Clang's vector
// types (one register at AVX-512, two at AVX2) across all N rows of a channel, and take
// eight elements at a time. A row's tail (S mod 8 elements) goes to lanes 0.. of a vector
// whose other lanes are +0.0, which adds nothing: a lane starts at +0.0 and so is never
// -0.0, and x + +0.0 = x for every other x, NaN and infinities included. So each lane's
// sum is the same sequence of additions as the scalar loop's (element s of every row to
// lane s mod BN_LANES), whatever the width. Without the vectors GCC kept the lanes in
// memory and rebuilt them at every row, which cost more than the row on ResNet's 4 x 4 and
// 7 x 7 planes. Selects are written as masks: the compiler leaves scalar selects as
// branches (as in activation.c); the [y > 0] factor of a ReLU's gradient is the compare
// mask & 1.0, exactly 1.0 or 0.0 (a multiply, so a masked inf gives NaN as the ReLU's
// does), taken in the element type (its products with dy are exact in either type).
// The helpers pass vectors by value; they are always inlined, so the compilers' note that
// a 64-byte vector argument has another ABI without AVX-512F concerns no call that exists.
#if defined(__clang__)
#pragma clang diagnostic ignored "-Wpsabi"
#elif defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif
typedef double  bn_vd __attribute__((vector_size(8 * BN_LANES)));
typedef int64_t bn_vl __attribute__((vector_size(8 * BN_LANES)));
typedef float   bn_vf __attribute__((vector_size(4 * BN_LANES)));
typedef int32_t bn_vi __attribute__((vector_size(4 * BN_LANES)));

KERNEL bn_vd splat(double v)
{
    return (bn_vd){v, v, v, v, v, v, v, v};
}

// The lanes' total, in a fixed order (pairwise halves).
KERNEL double lanes_total(bn_vd v)
{
    double a[BN_LANES];
    memcpy(a, &v, sizeof a);
    for (int h = BN_LANES / 2; h >= 1; h /= 2) {
        for (int l = 0; l < h; l++) {
            a[l] += a[l + h];
        }
    }
    return a[0];
}

KERNEL bn_vd ldv(ddl_dtype dt, const void *p, int64_t i)
{
    bn_vd d;
    if (dt == DDL_F32) {
        bn_vf f;
        memcpy(&f, (const float *)p + i, sizeof f);
        d = __builtin_convertvector(f, bn_vd);
    } else {
        memcpy(&d, (const double *)p + i, sizeof d);
    }
    return d;
}

// p[i..i+n) in lanes 0..n-1 (n < BN_LANES), +0.0 in the others.
KERNEL bn_vd ldv_tail(ddl_dtype dt, const void *p, int64_t i, int64_t n)
{
    double a[BN_LANES] = {0};
    for (int64_t l = 0; l < n; l++) {
        a[l] = ld(dt, p, i + l);
    }
    bn_vd v;
    memcpy(&v, a, sizeof v);
    return v;
}

// Lanes l < n of v stored to p[i + l], rounded to dt.
KERNEL void stv_tail(ddl_dtype dt, void *p, int64_t i, bn_vd v, int64_t n)
{
    double a[BN_LANES];
    memcpy(a, &v, sizeof a);
    for (int64_t l = 0; l < n; l++) {
        st(dt, p, i + l, a[l]);
    }
}

KERNEL void stv(ddl_dtype dt, void *p, int64_t i, bn_vd v)
{
    if (dt == DDL_F32) {
        bn_vf f = __builtin_convertvector(v, bn_vf);
        memcpy((float *)p + i, &f, sizeof f);
    } else {
        memcpy((double *)p + i, &v, sizeof v);
    }
}

// Lanes where `keep` is all ones keep v; the others are +0.0.
KERNEL bn_vd keep_lanes(bn_vd v, bn_vl keep)
{
    return (bn_vd)((bn_vl)v & keep);
}

// All ones in lanes l < n.
KERNEL bn_vl lanes_below(int64_t n)
{
    const bn_vl idx = {0, 1, 2, 3, 4, 5, 6, 7};
    return idx < n;
}

// The per-channel loops take the rows [n0, n1) of channel c, and the sums among them add
// into their lanes *a (*b): a channel's sum is the same whether its rows come in one call
// or one per call, which lets the entry points below walk the data in memory order.

// *a += the lanes of x[n, c, s] over n in [n0, n1) and s.
KERNEL void ch_sum(ddl_dtype dt, const void *x, int64_t n0, int64_t n1, int64_t C, int64_t S,
                   int64_t c, bn_vd *acc)
{
    bn_vd a = *acc;
    for (int64_t n = n0; n < n1; n++) {
        int64_t row = (n * C + c) * S, s = 0;
        for (; s + BN_LANES <= S; s += BN_LANES) {
            a += ldv(dt, x, row + s);
        }
        if (s < S) {
            a += ldv_tail(dt, x, row + s, S - s);
        }
    }
    *acc = a;
}

// *a += the lanes of (x - mean)^2 over the rows [n0, n1) of channel c.
KERNEL void ch_sqdev(ddl_dtype dt, const void *x, double mean, int64_t n0, int64_t n1, int64_t C,
                     int64_t S, int64_t c, bn_vd *acc)
{
    bn_vd       a = *acc;
    const bn_vd m = splat(mean);
    const bn_vl t = lanes_below(S % BN_LANES);
    for (int64_t n = n0; n < n1; n++) {
        int64_t row = (n * C + c) * S, s = 0;
        for (; s + BN_LANES <= S; s += BN_LANES) {
            bn_vd d = ldv(dt, x, row + s) - m;
            a += d * d;
        }
        if (s < S) {
            bn_vd d = ldv_tail(dt, x, row + s, S - s) - m;
            a += keep_lanes(d * d, t);
        }
    }
    *acc = a;
}

// The gradient a ReLU with output y passes back: dy * [y > 0], the value of relu_backward's
// dx (activation.c) as the unfused backward reads it. The ReLU stores +0 where this may
// give -0 (a masked -0 or negative dy); every use below either adds it to a sum that starts
// at +0 or ends in put's + 0.0, so the bits come out the same.
KERNEL double relu_dy(ddl_dtype dt, const void *dy, const void *y, int64_t i)
{
    return ld(dt, dy, i) * (ld(dt, y, i) > 0.0 ? 1.0 : 0.0);
}

// relu_dy on a vector: of eight elements at i, or of the n < 8 at i (+0.0 in the other
// lanes) with tail.
KERNEL bn_vd relu_dyv(ddl_dtype dt, const void *dy, const void *y, int64_t i, int64_t n, bool tail)
{
    if (dt == DDL_F32 && !tail) {
        bn_vf       g, v;
        const bn_vf zero = {0}, one = {1, 1, 1, 1, 1, 1, 1, 1};
        memcpy(&g, (const float *)dy + i, sizeof g);
        memcpy(&v, (const float *)y + i, sizeof v);
        return __builtin_convertvector(g * (bn_vf)((v > zero) & (bn_vi)one), bn_vd);
    }
    // In f64, or a tail (its zero lanes give 0 * [0 > 0] = +0.0).
    const bn_vd zero = {0}, one = splat(1.0);
    bn_vd       g = tail ? ldv_tail(dt, dy, i, n) : ldv(dt, dy, i);
    bn_vd       v = tail ? ldv_tail(dt, y, i, n) : ldv(dt, y, i);
    return g * (bn_vd)((v > zero) & (bn_vl)one);
}

// y = (x - mean)*invstd*g + b for channel c (y may alias x).
KERNEL void ch_normalize(ddl_dtype dt, void *y, const void *x, double mean, double invstd, double g,
                         double b, int64_t n0, int64_t n1, int64_t C, int64_t S, int64_t c)
{
    double      k  = invstd * g;
    const bn_vd mv = splat(mean), kv = splat(k), bv = splat(b);
    for (int64_t n = n0; n < n1; n++) {
        int64_t row = (n * C + c) * S, s = 0;
        for (; s + BN_LANES <= S; s += BN_LANES) {
            stv(dt, y, row + s, (ldv(dt, x, row + s) - mv) * kv + bv);
        }
        if (s < S) {
            stv_tail(dt, y, row + s, (ldv_tail(dt, x, row + s, S - s) - mv) * kv + bv, S - s);
        }
    }
}

// The same, then the ReLU on the value as stored, as relu_forward_kernel does: 0 where it
// is <= 0, NaN kept (the mask !(v <= 0) & v, in the element type).
KERNEL void ch_normalize_relu(ddl_dtype dt, void *y, const void *x, double mean, double invstd,
                              double g, double b, int64_t n0, int64_t n1, int64_t C, int64_t S,
                              int64_t c)
{
    double      k  = invstd * g;
    const bn_vd mv = splat(mean), kv = splat(k), bv = splat(b);
    for (int64_t n = n0; n < n1; n++) {
        int64_t row = (n * C + c) * S, s = 0;
        for (; s + BN_LANES <= S; s += BN_LANES) {
            bn_vd v = (ldv(dt, x, row + s) - mv) * kv + bv;
            if (dt == DDL_F32) {
                const bn_vf zero = {0};
                bn_vf       f    = __builtin_convertvector(v, bn_vf);
                f                = (bn_vf)((bn_vi)f & ~(f <= zero));
                memcpy((float *)y + row + s, &f, sizeof f);
            } else {
                const bn_vd zero = {0};
                v                = (bn_vd)((bn_vl)v & ~(v <= zero));
                memcpy((double *)y + row + s, &v, sizeof v);
            }
        }
        for (; s < S; s++) {
            st(dt, y, row + s, (ld(dt, x, row + s) - mean) * k + b);
            if (dt == DDL_F32) {
                float *v = (float *)y + row + s;
                *v       = !(*v <= 0.0f) ? *v : 0.0f;
            } else {
                double *v = (double *)y + row + s;
                *v        = !(*v <= 0.0) ? *v : 0.0;
            }
        }
    }
}

// *acc_dy += the lanes of dy, *acc_dyxc += those of dy*(x - mean) over the rows [n0, n1) of
// channel c (their totals, the latter times invstd, are sum(dy) and sum(dy*xhat)); with
// `relu` (y the ReLU's output): of the dy the ReLU passes back (relu_dy).
KERNEL void ch_reduce(ddl_dtype dt, const void *dy, const void *y, const void *x, double mean,
                      int64_t n0, int64_t n1, int64_t C, int64_t S, int64_t c, bn_vd *acc_dy,
                      bn_vd *acc_dyxc, bool relu)
{
    bn_vd       a = *acc_dy, b = *acc_dyxc;
    const bn_vd mv = splat(mean);
    const bn_vl t  = lanes_below(S % BN_LANES);
    for (int64_t n = n0; n < n1; n++) {
        int64_t row = (n * C + c) * S, s = 0;
        for (; s + BN_LANES <= S; s += BN_LANES) {
            bn_vd g = relu ? relu_dyv(dt, dy, y, row + s, 0, false) : ldv(dt, dy, row + s);
            a += g;
            b += g * (ldv(dt, x, row + s) - mv);
        }
        if (s < S) {
            bn_vd g =
                relu ? relu_dyv(dt, dy, y, row + s, S - s, true) : ldv_tail(dt, dy, row + s, S - s);
            a += g;
            b += keep_lanes(g * (ldv_tail(dt, x, row + s, S - s) - mv), t);
        }
    }
    *acc_dy   = a;
    *acc_dyxc = b;
}

// dx += g*invstd*(dy - k1 - xhat*k2) for channel c, with k1 = sum(dy)/V and
// k2 = sum(dy*xhat)/V (both 0 for frozen statistics); into: dx = ... (dtype.h's put,
// whose + 0.0 the vectors add too). With `relu` (y the ReLU's output): of the dy the ReLU
// passes back (relu_dy). dx may alias dy when overwriting.
KERNEL void ch_apply(ddl_dtype dt, void *dx, const void *dy, const void *y, const void *x,
                     double mean, double invstd, double g, double k1, double k2, int64_t n0,
                     int64_t n1, int64_t C, int64_t S, int64_t c, bool into, bool relu)
{
    double      k  = g * invstd;
    const bn_vd mv = splat(mean), iv = splat(invstd), kv = splat(k), k1v = splat(k1),
                k2v = splat(k2), zero = {0};
    for (int64_t n = n0; n < n1; n++) {
        int64_t row = (n * C + c) * S, s = 0;
        for (; s + BN_LANES <= S; s += BN_LANES) {
            bn_vd xhat = (ldv(dt, x, row + s) - mv) * iv;
            bn_vd d    = relu ? relu_dyv(dt, dy, y, row + s, 0, false) : ldv(dt, dy, row + s);
            bn_vd v    = kv * (d - k1v - xhat * k2v);
            // acc's rounding when accumulating: the old value widened, the sum rounded once.
            stv(dt, dx, row + s, into ? v + zero : ldv(dt, dx, row + s) + v);
        }
        for (; s < S; s++) {
            double xhat = (ld(dt, x, row + s) - mean) * invstd;
            double d    = relu ? relu_dy(dt, dy, y, row + s) : ld(dt, dy, row + s);
            put(dt, dx, row + s, k * (d - k1 - xhat * k2), into);
        }
    }
}

// running_mean[c], running_var[c] moved towards the batch's mean and unbiased variance.
KERNEL void ch_running(ddl_dtype dt, void *rm, void *rv, int64_t c, double mean, double var,
                       int64_t V, double f)
{
    double unbiased = var * (double)V / (double)(V - 1);
    st(dt, rm, c, (1.0 - f) * ld(dt, rm, c) + f * mean);
    st(dt, rv, c, (1.0 - f) * ld(dt, rv, c) + f * unbiased);
}

// ---- local pieces -------------------------------------------------------------------

ddl_batchnorm_params ddl_batchnorm_params_default(void)
{
    return (ddl_batchnorm_params){.eps = 1e-5, .momentum = 0.1, .cumulative = false,
                                  .training = true};
}

// out[c] = sum(x) over channel c's values, or with mean the sum of (x - mean[c])^2: in
// memory order, the lanes of BN_CBLOCK channels at a time.
KERNEL void channel_sums(ddl_dtype dt, double *out, const void *x, const double *mean, int64_t N,
                         int64_t C, int64_t S)
{
    bn_vd acc[BN_CBLOCK];
    for (int64_t c0 = 0; c0 < C; c0 += BN_CBLOCK) {
        const int64_t c1 = C - c0 < BN_CBLOCK ? C : c0 + BN_CBLOCK;
        memset(acc, 0, sizeof acc);
        for (int64_t n = 0; n < N; n++) {
            for (int64_t c = c0; c < c1; c++) {
                if (mean != NULL) {
                    ch_sqdev(dt, x, mean[c], n, n + 1, C, S, c, &acc[c - c0]);
                } else {
                    ch_sum(dt, x, n, n + 1, C, S, c, &acc[c - c0]);
                }
            }
        }
        for (int64_t c = c0; c < c1; c++) {
            out[c] = lanes_total(acc[c - c0]);
        }
    }
}

KERNEL ddl_status ddl_batchnorm_sum_body(ddl_dtype dt, double *sum, const void *x, int64_t N,
                                         int64_t C, int64_t S)
{
    DDL_CHECK(check_dims("batchnorm_sum", dt, N, C, S));
    DDL_REQUIRE(C == 0 || (sum && (x || N * S == 0)), DDL_EINVAL, "batchnorm_sum: NULL buffer");
    if (dt == DDL_F32) {
        channel_sums(DDL_F32, sum, x, NULL, N, C, S);
    } else {
        channel_sums(DDL_F64, sum, x, NULL, N, C, S);
    }
    return DDL_OK;
}

BN_DISPATCH(ddl_batchnorm_sum,
            (ddl_dtype dt, double *sum, const void *x, int64_t N, int64_t C, int64_t S),
            (dt, sum, x, N, C, S))

KERNEL ddl_status ddl_batchnorm_sqdev_body(ddl_dtype dt, double *sqdev, const void *x,
                                           const double *mean, int64_t N, int64_t C, int64_t S)
{
    DDL_CHECK(check_dims("batchnorm_sqdev", dt, N, C, S));
    DDL_REQUIRE(C == 0 || (sqdev && mean && (x || N * S == 0)), DDL_EINVAL,
                "batchnorm_sqdev: NULL buffer");
    if (dt == DDL_F32) {
        channel_sums(DDL_F32, sqdev, x, mean, N, C, S);
    } else {
        channel_sums(DDL_F64, sqdev, x, mean, N, C, S);
    }
    return DDL_OK;
}

BN_DISPATCH(ddl_batchnorm_sqdev,
            (ddl_dtype dt, double *sqdev, const void *x, const double *mean, int64_t N, int64_t C,
             int64_t S),
            (dt, sqdev, x, mean, N, C, S))

KERNEL ddl_status normalize(ddl_dtype dt, void *y, const void *x, const double *mean,
                            const double *invstd, const void *gamma, const void *beta, int64_t N,
                            int64_t C, int64_t S, bool relu)
{
    const char *who = relu ? "batchnorm_normalize_relu" : "batchnorm_normalize";
    DDL_CHECK(check_dims(who, dt, N, C, S));
    if (N * C * S == 0) {
        return DDL_OK;
    }
    DDL_REQUIRE(y && x && mean && invstd, DDL_EINVAL, "%s: NULL buffer", who);
    for (int64_t n = 0; n < N; n++) { // in memory order
        for (int64_t c = 0; c < C; c++) {
            double g = gamma ? ld(dt, gamma, c) : 1.0;
            double b = beta ? ld(dt, beta, c) : 0.0;
            if (relu && dt == DDL_F32) {
                ch_normalize_relu(DDL_F32, y, x, mean[c], invstd[c], g, b, n, n + 1, C, S, c);
            } else if (relu) {
                ch_normalize_relu(DDL_F64, y, x, mean[c], invstd[c], g, b, n, n + 1, C, S, c);
            } else if (dt == DDL_F32) {
                ch_normalize(DDL_F32, y, x, mean[c], invstd[c], g, b, n, n + 1, C, S, c);
            } else {
                ch_normalize(DDL_F64, y, x, mean[c], invstd[c], g, b, n, n + 1, C, S, c);
            }
        }
    }
    return DDL_OK;
}

KERNEL ddl_status ddl_batchnorm_normalize_body(ddl_dtype dt, void *y, const void *x,
                                               const double *mean, const double *invstd,
                                               const void *gamma, const void *beta, int64_t N,
                                               int64_t C, int64_t S)
{
    return normalize(dt, y, x, mean, invstd, gamma, beta, N, C, S, false);
}

KERNEL ddl_status ddl_batchnorm_normalize_relu_body(ddl_dtype dt, void *y, const void *x,
                                                    const double *mean, const double *invstd,
                                                    const void *gamma, const void *beta, int64_t N,
                                                    int64_t C, int64_t S)
{
    return normalize(dt, y, x, mean, invstd, gamma, beta, N, C, S, true);
}

#define BN_NORMALIZE_PARAMS                                                                        \
    (ddl_dtype dt, void *y, const void *x, const double *mean, const double *invstd,               \
     const void *gamma, const void *beta, int64_t N, int64_t C, int64_t S)
#define BN_NORMALIZE_ARGS (dt, y, x, mean, invstd, gamma, beta, N, C, S)
BN_DISPATCH(ddl_batchnorm_normalize, BN_NORMALIZE_PARAMS, BN_NORMALIZE_ARGS)
BN_DISPATCH(ddl_batchnorm_normalize_relu, BN_NORMALIZE_PARAMS, BN_NORMALIZE_ARGS)

// relu: dy is a ReLU's output gradient, y its output (relu_dy).
KERNEL ddl_status backward_reduce(ddl_dtype dt, double *sum_dy, double *sum_dy_xhat, const void *dy,
                                  const void *y, const void *x, const double *mean,
                                  const double *invstd, int64_t N, int64_t C, int64_t S, bool relu)
{
    const char *who = relu ? "batchnorm_backward_reduce_relu" : "batchnorm_backward_reduce";
    DDL_CHECK(check_dims(who, dt, N, C, S));
    DDL_REQUIRE(C == 0 || (sum_dy && sum_dy_xhat && mean && invstd &&
                           ((dy && x && (y || !relu)) || N * S == 0)),
                DDL_EINVAL, "%s: NULL buffer", who);
    bn_vd a[BN_CBLOCK], b[BN_CBLOCK];
    for (int64_t c0 = 0; c0 < C; c0 += BN_CBLOCK) {
        const int64_t c1 = C - c0 < BN_CBLOCK ? C : c0 + BN_CBLOCK;
        memset(a, 0, sizeof a);
        memset(b, 0, sizeof b);
        for (int64_t n = 0; n < N; n++) {
            for (int64_t c = c0; c < c1; c++) {
                if (dt == DDL_F32) {
                    ch_reduce(DDL_F32, dy, y, x, mean[c], n, n + 1, C, S, c, &a[c - c0], &b[c - c0],
                              relu);
                } else {
                    ch_reduce(DDL_F64, dy, y, x, mean[c], n, n + 1, C, S, c, &a[c - c0], &b[c - c0],
                              relu);
                }
            }
        }
        for (int64_t c = c0; c < c1; c++) {
            sum_dy[c]      = lanes_total(a[c - c0]);
            sum_dy_xhat[c] = lanes_total(b[c - c0]) * invstd[c];
        }
    }
    return DDL_OK;
}

KERNEL ddl_status ddl_batchnorm_backward_reduce_body(ddl_dtype dt, double *sum_dy,
                                                     double *sum_dy_xhat, const void *dy,
                                                     const void *x, const double *mean,
                                                     const double *invstd, int64_t N, int64_t C,
                                                     int64_t S)
{
    return backward_reduce(dt, sum_dy, sum_dy_xhat, dy, NULL, x, mean, invstd, N, C, S, false);
}

KERNEL ddl_status ddl_batchnorm_backward_reduce_relu_body(ddl_dtype dt, double *sum_dy,
                                                          double *sum_dy_xhat, const void *dy,
                                                          const void *y, const void *x,
                                                          const double *mean, const double *invstd,
                                                          int64_t N, int64_t C, int64_t S)
{
    return backward_reduce(dt, sum_dy, sum_dy_xhat, dy, y, x, mean, invstd, N, C, S, true);
}

BN_DISPATCH(ddl_batchnorm_backward_reduce,
            (ddl_dtype dt, double *sum_dy, double *sum_dy_xhat, const void *dy, const void *x,
             const double *mean, const double *invstd, int64_t N, int64_t C, int64_t S),
            (dt, sum_dy, sum_dy_xhat, dy, x, mean, invstd, N, C, S))

BN_DISPATCH(ddl_batchnorm_backward_reduce_relu,
            (ddl_dtype dt, double *sum_dy, double *sum_dy_xhat, const void *dy, const void *y,
             const void *x, const double *mean, const double *invstd, int64_t N, int64_t C,
             int64_t S),
            (dt, sum_dy, sum_dy_xhat, dy, y, x, mean, invstd, N, C, S))

KERNEL ddl_status backward_apply(ddl_dtype dt, void *dx, const void *dy, const void *y,
                                 const void *x, const double *mean, const double *invstd,
                                 const void *gamma, const double *sum_dy, const double *sum_dy_xhat,
                                 int64_t V, int64_t N, int64_t C, int64_t S, bool into, bool relu)
{
    const char *who = relu ? "batchnorm_backward_apply_relu" : "batchnorm_backward_apply";
    DDL_CHECK(check_dims(who, dt, N, C, S));
    DDL_REQUIRE((sum_dy == NULL) == (sum_dy_xhat == NULL), DDL_EINVAL,
                "%s: pass both sum_dy and sum_dy_xhat, or neither", who);
    DDL_REQUIRE(sum_dy == NULL || V > 0, DDL_EINVAL, "%s: global count V = %lld must be positive",
                who, (long long)V);
    if (dx == NULL || N * C * S == 0) {
        return DDL_OK;
    }
    DDL_REQUIRE(dy && x && mean && invstd && (y || !relu), DDL_EINVAL, "%s: NULL buffer", who);
    for (int64_t n = 0; n < N; n++) { // in memory order
        for (int64_t c = 0; c < C; c++) {
            double g  = gamma ? ld(dt, gamma, c) : 1.0;
            double k1 = sum_dy ? sum_dy[c] / (double)V : 0.0;
            double k2 = sum_dy ? sum_dy_xhat[c] / (double)V : 0.0;
            if (dt == DDL_F32) {
                ch_apply(DDL_F32, dx, dy, y, x, mean[c], invstd[c], g, k1, k2, n, n + 1, C, S, c,
                         into, relu);
            } else {
                ch_apply(DDL_F64, dx, dy, y, x, mean[c], invstd[c], g, k1, k2, n, n + 1, C, S, c,
                         into, relu);
            }
        }
    }
    return DDL_OK;
}

KERNEL ddl_status ddl_batchnorm_backward_apply_body(ddl_dtype dt, void *dx, const void *dy,
                                                    const void *x, const double *mean,
                                                    const double *invstd, const void *gamma,
                                                    const double *sum_dy, const double *sum_dy_xhat,
                                                    int64_t V, int64_t N, int64_t C, int64_t S)
{
    return backward_apply(dt, dx, dy, NULL, x, mean, invstd, gamma, sum_dy, sum_dy_xhat, V, N, C, S,
                          false, false);
}

KERNEL ddl_status ddl_batchnorm_backward_apply_into_body(ddl_dtype dt, void *dx, const void *dy,
                                                         const void *x, const double *mean,
                                                         const double *invstd, const void *gamma,
                                                         const double *sum_dy,
                                                         const double *sum_dy_xhat, int64_t V,
                                                         int64_t N, int64_t C, int64_t S)
{
    return backward_apply(dt, dx, dy, NULL, x, mean, invstd, gamma, sum_dy, sum_dy_xhat, V, N, C, S,
                          true, false);
}

KERNEL ddl_status ddl_batchnorm_backward_apply_relu_into_body(
    ddl_dtype dt, void *dx, const void *dy, const void *y, const void *x, const double *mean,
    const double *invstd, const void *gamma, const double *sum_dy, const double *sum_dy_xhat,
    int64_t V, int64_t N, int64_t C, int64_t S)
{
    return backward_apply(dt, dx, dy, y, x, mean, invstd, gamma, sum_dy, sum_dy_xhat, V, N, C, S,
                          true, true);
}

#define BN_APPLY_PARAMS                                                                            \
    (ddl_dtype dt, void *dx, const void *dy, const void *x, const double *mean,                    \
     const double *invstd, const void *gamma, const double *sum_dy, const double *sum_dy_xhat,     \
     int64_t V, int64_t N, int64_t C, int64_t S)
#define BN_APPLY_ARGS (dt, dx, dy, x, mean, invstd, gamma, sum_dy, sum_dy_xhat, V, N, C, S)
BN_DISPATCH(ddl_batchnorm_backward_apply_into, BN_APPLY_PARAMS, BN_APPLY_ARGS)
BN_DISPATCH(ddl_batchnorm_backward_apply, BN_APPLY_PARAMS, BN_APPLY_ARGS)

BN_DISPATCH(ddl_batchnorm_backward_apply_relu_into,
            (ddl_dtype dt, void *dx, const void *dy, const void *y, const void *x,
             const double *mean, const double *invstd, const void *gamma, const double *sum_dy,
             const double *sum_dy_xhat, int64_t V, int64_t N, int64_t C, int64_t S),
            (dt, dx, dy, y, x, mean, invstd, gamma, sum_dy, sum_dy_xhat, V, N, C, S))

ddl_status ddl_batchnorm_param_grads(ddl_dtype dt, void *dgamma, void *dbeta,
                                     const double *sum_dy, const double *sum_dy_xhat, int64_t C)
{
    DDL_CHECK(check_dims("batchnorm_param_grads", dt, 0, C, 0));
    DDL_REQUIRE(C == 0 || ((!dgamma || sum_dy_xhat) && (!dbeta || sum_dy)), DDL_EINVAL,
                "batchnorm_param_grads: NULL sums");
    for (int64_t c = 0; c < C; c++) {
        if (dgamma) {
            acc(dt, dgamma, c, sum_dy_xhat[c]);
        }
        if (dbeta) {
            acc(dt, dbeta, c, sum_dy[c]);
        }
    }
    return DDL_OK;
}

ddl_status ddl_batchnorm_running_update(ddl_dtype dt, void *running_mean, void *running_var,
                                        const double *mean, const double *var, int64_t C,
                                        int64_t V, double factor)
{
    DDL_CHECK(check_dims("batchnorm_running_update", dt, 0, C, 0));
    DDL_REQUIRE(V > 1, DDL_EINVAL,
                "batchnorm_running_update: expected more than 1 value per channel, got V = %lld",
                (long long)V);
    DDL_REQUIRE(C == 0 || (running_mean && running_var && mean && var), DDL_EINVAL,
                "batchnorm_running_update: NULL buffer");
    for (int64_t c = 0; c < C; c++) {
        if (dt == DDL_F32) {
            ch_running(DDL_F32, running_mean, running_var, c, mean[c], var[c], V, factor);
        } else {
            ch_running(DDL_F64, running_mean, running_var, c, mean[c], var[c], V, factor);
        }
    }
    return DDL_OK;
}

double ddl_batchnorm_update_factor(const ddl_batchnorm_params *p, int64_t num_batches_tracked)
{
    if (p->cumulative) {
        return num_batches_tracked > 0 ? 1.0 / (double)num_batches_tracked : 1.0;
    }
    return p->momentum;
}

// ---- sequential batch norm ------------------------------------------------------------

// One channel of the forward: statistics (batch or running), optional running update,
// normalization. Separate from the public function so the dtype folds into the loops.
KERNEL void bn_forward_channel(ddl_dtype dt, void *y, double *mean, double *invstd,
                               const void *x, const void *gamma, const void *beta, void *rm,
                               void *rv, bool batch, bool update, double factor, double eps,
                               int64_t N, int64_t C, int64_t S, int64_t c)
{
    int64_t V = N * S;
    double  m, var;
    if (batch) {
        bn_vd a = {0}, q = {0};
        ch_sum(dt, x, 0, N, C, S, c, &a);
        m = lanes_total(a) / (double)V;
        ch_sqdev(dt, x, m, 0, N, C, S, c, &q);
        var = lanes_total(q) / (double)V;
        if (update) {
            ch_running(dt, rm, rv, c, m, var, V, factor);
        }
    } else {
        m   = ld(dt, rm, c);
        var = ld(dt, rv, c);
    }
    mean[c]   = m;
    invstd[c] = 1.0 / sqrt(var + eps);
    double g  = gamma ? ld(dt, gamma, c) : 1.0;
    double b  = beta ? ld(dt, beta, c) : 0.0;
    ch_normalize(dt, y, x, m, invstd[c], g, b, 0, N, C, S, c);
}

KERNEL ddl_status ddl_batchnorm_forward_body(ddl_dtype dt, void *y, double *mean, double *invstd,
                                             const void *x, const void *gamma, const void *beta,
                                             void *running_mean, void *running_var,
                                             int64_t                    *num_batches_tracked,
                                             const ddl_batchnorm_params *p, int64_t N, int64_t C,
                                             int64_t S)
{
    DDL_CHECK(check_dims("batchnorm_forward", dt, N, C, S));
    DDL_REQUIRE(p != NULL, DDL_EINVAL, "batchnorm_forward: NULL params");
    DDL_REQUIRE((running_mean == NULL) == (running_var == NULL), DDL_EINVAL,
                "batchnorm_forward: pass both running_mean and running_var, or neither");
    DDL_REQUIRE(p->eps >= 0.0, DDL_EINVAL, "batchnorm_forward: eps %g < 0", p->eps);
    bool    running = running_mean != NULL;
    bool    batch   = p->training || !running;
    bool    update  = p->training && running;
    int64_t V       = N * S;
    DDL_REQUIRE(!p->training || V > 1, DDL_EINVAL,
                "batchnorm_forward: expected more than 1 value per channel when training, "
                "got N*S = %lld",
                (long long)V);
    DDL_REQUIRE(!batch || V > 0 || C == 0, DDL_EINVAL,
                "batchnorm_forward: batch statistics of an empty batch");
    DDL_REQUIRE(!(update && p->cumulative) || num_batches_tracked, DDL_EINVAL,
                "batchnorm_forward: cumulative running statistics need num_batches_tracked");
    DDL_REQUIRE(C == 0 || (mean && invstd && (V == 0 || (x && y))), DDL_EINVAL,
                "batchnorm_forward: NULL buffer");
    if (update && num_batches_tracked) {
        (*num_batches_tracked)++;
    }
    double factor = ddl_batchnorm_update_factor(p, num_batches_tracked ? *num_batches_tracked : 0);
    for (int64_t c = 0; c < C; c++) {
        if (dt == DDL_F32) {
            bn_forward_channel(DDL_F32, y, mean, invstd, x, gamma, beta, running_mean,
                               running_var, batch, update, factor, p->eps, N, C, S, c);
        } else {
            bn_forward_channel(DDL_F64, y, mean, invstd, x, gamma, beta, running_mean,
                               running_var, batch, update, factor, p->eps, N, C, S, c);
        }
    }
    return DDL_OK;
}

BN_DISPATCH(ddl_batchnorm_forward,
            (ddl_dtype dt, void *y, double *mean, double *invstd, const void *x, const void *gamma,
             const void *beta, void *running_mean, void *running_var, int64_t *num_batches_tracked,
             const ddl_batchnorm_params *p, int64_t N, int64_t C, int64_t S),
            (dt, y, mean, invstd, x, gamma, beta, running_mean, running_var, num_batches_tracked, p,
             N, C, S))

// One channel of the backward.
KERNEL void bn_backward_channel(ddl_dtype dt, void *dx, void *dgamma, void *dbeta,
                                const void *dy, const void *x, double mean, double invstd,
                                double g, bool batch_stats, int64_t N, int64_t C, int64_t S,
                                int64_t c)
{
    double sdy = 0.0, sdyxh = 0.0;
    if (batch_stats || dgamma || dbeta) {
        bn_vd a = {0}, b = {0};
        ch_reduce(dt, dy, NULL, x, mean, 0, N, C, S, c, &a, &b, false);
        sdy   = lanes_total(a);
        sdyxh = lanes_total(b) * invstd;
    }
    if (dx) {
        double V  = (double)(N * S);
        double k1 = batch_stats ? sdy / V : 0.0;
        double k2 = batch_stats ? sdyxh / V : 0.0;
        ch_apply(dt, dx, dy, NULL, x, mean, invstd, g, k1, k2, 0, N, C, S, c, false, false);
    }
    if (dgamma) {
        acc(dt, dgamma, c, sdyxh);
    }
    if (dbeta) {
        acc(dt, dbeta, c, sdy);
    }
}

KERNEL ddl_status ddl_batchnorm_backward_body(ddl_dtype dt, void *dx, void *dgamma, void *dbeta,
                                              const void *dy, const void *x, const double *mean,
                                              const double *invstd, const void *gamma,
                                              bool batch_stats, int64_t N, int64_t C, int64_t S)
{
    DDL_CHECK(check_dims("batchnorm_backward", dt, N, C, S));
    if (C == 0 || (dx == NULL && dgamma == NULL && dbeta == NULL)) {
        return DDL_OK;
    }
    DDL_REQUIRE(mean && invstd && (N * S == 0 || (dy && x)), DDL_EINVAL,
                "batchnorm_backward: NULL buffer");
    for (int64_t c = 0; c < C; c++) {
        double g = gamma ? ld(dt, gamma, c) : 1.0;
        if (dt == DDL_F32) {
            bn_backward_channel(DDL_F32, dx, dgamma, dbeta, dy, x, mean[c], invstd[c], g,
                                batch_stats, N, C, S, c);
        } else {
            bn_backward_channel(DDL_F64, dx, dgamma, dbeta, dy, x, mean[c], invstd[c], g,
                                batch_stats, N, C, S, c);
        }
    }
    return DDL_OK;
}

BN_DISPATCH(ddl_batchnorm_backward,
            (ddl_dtype dt, void *dx, void *dgamma, void *dbeta, const void *dy, const void *x,
             const double *mean, const double *invstd, const void *gamma, bool batch_stats,
             int64_t N, int64_t C, int64_t S),
            (dt, dx, dgamma, dbeta, dy, x, mean, invstd, gamma, batch_stats, N, C, S))
