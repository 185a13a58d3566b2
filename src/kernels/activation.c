// kernels/activation.c: elementwise activations and dropout, forward and backward.
//
// n = number of elements; every array is [n] of the dtype given. The math is done in
// double per element and rounded once on store. Backward accumulates (dx += ...); the
// _into form overwrites (dx = ...), with the same bits as accumulating onto zeros.
//
// Each kernel body is written once with the dtype as a parameter and force-inlined
// into a call with a constant dtype (and activation kind), so the compiler emits one
// specialised loop per (kind, dtype) with no per-element branching on either.
// References: the PyTorch docs of torch.nn.ReLU, LeakyReLU, Sigmoid, Tanh, GELU and Dropout
// (https://pytorch.org/docs/stable/nn.html, "Non-linear Activations").
#include <math.h>
#include <string.h>

#include "base/check.h"
#include "ddl/base.h"
#include "ddl/kernels_pointwise.h"
#include "kernels/dtype.h"


static ddl_status check_common(const char *who, ddl_dtype dt, int64_t n)
{
    DDL_REQUIRE(dt == DDL_F32 || dt == DDL_F64, DDL_EINVAL, "%s: unknown dtype %d", who, (int)dt);
    DDL_REQUIRE(n >= 0, DDL_EINVAL, "%s: element count %lld < 0", who, (long long)n);
    return DDL_OK;
}

// ---- elementwise math -----------------------------------------------------------

#define INV_SQRT2    0.70710678118654752440
#define INV_SQRT_2PI 0.39894228040143267794

KERNEL double sigmoid(double x)
{
    // Split by sign so exp never overflows.
    if (x >= 0.0) {
        return 1.0 / (1.0 + exp(-x));
    }
    double e = exp(x);
    return e / (1.0 + e);
}

KERNEL double act_f(ddl_activation act, double a, double x)
{
    switch (act) {
    case DDL_ACTIVATION_RELU:
        return (x > 0.0 || isnan(x)) ? x : 0.0; // NaN propagates, as in clamp_min
    case DDL_ACTIVATION_LEAKY_RELU:
        return x > 0.0 ? x : a * x;
    case DDL_ACTIVATION_SIGMOID:
        return sigmoid(x);
    case DDL_ACTIVATION_TANH:
        return tanh(x);
    case DDL_ACTIVATION_GELU:
        return 0.5 * x * (1.0 + erf(x * INV_SQRT2));
    }
    return 0.0;
}

// f'(x) from the saved input x or output y (whichever the kind uses).
KERNEL double act_df(ddl_activation act, double a, double x, double y)
{
    switch (act) {
    case DDL_ACTIVATION_RELU:
        return y > 0.0 ? 1.0 : 0.0;
    case DDL_ACTIVATION_LEAKY_RELU:
        return x > 0.0 ? 1.0 : a;
    case DDL_ACTIVATION_SIGMOID:
        return y * (1.0 - y);
    case DDL_ACTIVATION_TANH:
        return 1.0 - y * y;
    case DDL_ACTIVATION_GELU:
        return 0.5 * (1.0 + erf(x * INV_SQRT2)) + x * INV_SQRT_2PI * exp(-0.5 * x * x);
    }
    return 0.0;
}

KERNEL bool act_needs_x(ddl_activation act)
{
    return act == DDL_ACTIVATION_LEAKY_RELU || act == DDL_ACTIVATION_GELU;
}

static const char *act_name(ddl_activation act)
{
    switch (act) {
    case DDL_ACTIVATION_RELU:
        return "relu";
    case DDL_ACTIVATION_LEAKY_RELU:
        return "leaky_relu";
    case DDL_ACTIVATION_SIGMOID:
        return "sigmoid";
    case DDL_ACTIVATION_TANH:
        return "tanh";
    case DDL_ACTIVATION_GELU:
        return "gelu";
    }
    return "activation";
}

// ---- generic kernels ------------------------------------------------------------

// y = f(x); x, y [n].
KERNEL void act_forward_kernel(ddl_dtype dt, ddl_activation act, double a, void *y,
                               const void *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        st(dt, y, i, act_f(act, a, ld(dt, x, i)));
    }
}

// dx += dy * f'(x) (into: dx = ...); dx, dy, x, y [n] (only the one the kind needs is read).
KERNEL void act_backward_kernel(ddl_dtype dt, ddl_activation act, double a, void *dx,
                                const void *dy, const void *x, const void *y, int64_t n, bool into)
{
    for (int64_t i = 0; i < n; i++) {
        double xi = act_needs_x(act) ? ld(dt, x, i) : 0.0;
        double yi = act_needs_x(act) ? 0.0 : ld(dt, y, i);
        put(dt, dx, i, ld(dt, dy, i) * act_df(act, a, xi, yi), into);
    }
}

// ReLU in the element type: the double round trip of the generic kernel is exact for
// it (a comparison, and dx + dy * {0, 1} rounds the same in float as through double),
// so these give the same bits, in loops the compiler vectorizes. No restrict: y may
// alias x, and dx may alias dy.
KERNEL void relu_forward_kernel(ddl_dtype dt, void *y, const void *x, int64_t n)
{
    if (dt == DDL_F32) {
        const float *xs = x;
        float       *ys = y;
        for (int64_t i = 0; i < n; i++) {
            ys[i] = !(xs[i] <= 0.0f) ? xs[i] : 0.0f; // x > 0 or NaN keeps x
        }
    } else {
        const double *xs = x;
        double       *ys = y;
        for (int64_t i = 0; i < n; i++) {
            ys[i] = !(xs[i] <= 0.0) ? xs[i] : 0.0;
        }
    }
}

// Eight (four) lanes at a time through GCC/Clang vector types (GCC leaves the scalar
// select as a branch); memcpy does the unaligned loads and stores. The mask of y > 0 is
// all ones or zero per lane, so mask & 1.0 is exactly the factor 1.0 or 0.0.
typedef float   ddl_v8f __attribute__((vector_size(32)));
typedef int32_t ddl_v8i __attribute__((vector_size(32)));
typedef double  ddl_v4d __attribute__((vector_size(32)));
typedef int64_t ddl_v4l __attribute__((vector_size(32)));

// into: dx = 0 + dy * [y > 0] without reading dx (the same bits: the zero is added after).
KERNEL void relu_backward_kernel(ddl_dtype dt, void *dx, const void *dy, const void *y, int64_t n,
                                 bool into)
{
    int64_t i = 0;
    if (dt == DDL_F32) {
        const float  *g = dy, *ys = y;
        float        *d   = dx;
        const ddl_v8f one = {1, 1, 1, 1, 1, 1, 1, 1}, zero = {0};
        for (; i + 8 <= n; i += 8) {
            ddl_v8f a = zero, b, c;
            if (!into) {
                memcpy(&a, d + i, sizeof a);
            }
            memcpy(&b, g + i, sizeof b);
            memcpy(&c, ys + i, sizeof c);
            a += b * (ddl_v8f)((c > zero) & (ddl_v8i)one);
            memcpy(d + i, &a, sizeof a);
        }
        for (; i < n; i++) {
            d[i] = (into ? 0.0f : d[i]) + g[i] * (ys[i] > 0.0f ? 1.0f : 0.0f);
        }
    } else {
        const double  *g = dy, *ys = y;
        double        *d   = dx;
        const ddl_v4d one = {1, 1, 1, 1}, zero = {0};
        for (; i + 4 <= n; i += 4) {
            ddl_v4d a = zero, b, c;
            if (!into) {
                memcpy(&a, d + i, sizeof a);
            }
            memcpy(&b, g + i, sizeof b);
            memcpy(&c, ys + i, sizeof c);
            a += b * (ddl_v4d)((c > zero) & (ddl_v4l)one);
            memcpy(d + i, &a, sizeof a);
        }
        for (; i < n; i++) {
            d[i] = (into ? 0.0 : d[i]) + g[i] * (ys[i] > 0.0 ? 1.0 : 0.0);
        }
    }
}

KERNEL ddl_status act_forward(ddl_activation act, double a, ddl_dtype dt, void *y,
                              const void *x, int64_t n)
{
    DDL_CHECK(check_common(act_name(act), dt, n));
    DDL_REQUIRE(n == 0 || (x && y), DDL_EINVAL, "%s_forward: NULL x or y with n = %lld",
                act_name(act), (long long)n);
    if (act == DDL_ACTIVATION_RELU) {
        relu_forward_kernel(dt, y, x, n);
    } else if (dt == DDL_F32) {
        act_forward_kernel(DDL_F32, act, a, y, x, n);
    } else {
        act_forward_kernel(DDL_F64, act, a, y, x, n);
    }
    return DDL_OK;
}

KERNEL ddl_status act_backward(ddl_activation act, double a, ddl_dtype dt, void *dx, const void *dy,
                               const void *x, const void *y, int64_t n, bool into)
{
    DDL_CHECK(check_common(act_name(act), dt, n));
    if (dx == NULL || n == 0) {
        return DDL_OK;
    }
    const void *saved = act_needs_x(act) ? x : y;
    DDL_REQUIRE(dy && saved, DDL_EINVAL, "%s_backward: NULL dy or saved %s", act_name(act),
                act_needs_x(act) ? "input x" : "output y");
    if (act == DDL_ACTIVATION_RELU) {
        relu_backward_kernel(dt, dx, dy, y, n, into);
    } else if (dt == DDL_F32) {
        act_backward_kernel(DDL_F32, act, a, dx, dy, x, y, n, into);
    } else {
        act_backward_kernel(DDL_F64, act, a, dx, dy, x, y, n, into);
    }
    return DDL_OK;
}

// ---- named activations ------------------------------------------------------------

ddl_status ddl_relu_forward(ddl_dtype dt, void *y, const void *x, int64_t n)
{
    return act_forward(DDL_ACTIVATION_RELU, 0.0, dt, y, x, n);
}

ddl_status ddl_relu_backward(ddl_dtype dt, void *dx, const void *dy, const void *y, int64_t n)
{
    return act_backward(DDL_ACTIVATION_RELU, 0.0, dt, dx, dy, NULL, y, n, false);
}

ddl_status ddl_leaky_relu_forward(ddl_dtype dt, void *y, const void *x, int64_t n,
                                  double negative_slope)
{
    return act_forward(DDL_ACTIVATION_LEAKY_RELU, negative_slope, dt, y, x, n);
}

ddl_status ddl_leaky_relu_backward(ddl_dtype dt, void *dx, const void *dy, const void *x,
                                   int64_t n, double negative_slope)
{
    return act_backward(DDL_ACTIVATION_LEAKY_RELU, negative_slope, dt, dx, dy, x, NULL, n, false);
}

ddl_status ddl_sigmoid_forward(ddl_dtype dt, void *y, const void *x, int64_t n)
{
    return act_forward(DDL_ACTIVATION_SIGMOID, 0.0, dt, y, x, n);
}

ddl_status ddl_sigmoid_backward(ddl_dtype dt, void *dx, const void *dy, const void *y, int64_t n)
{
    return act_backward(DDL_ACTIVATION_SIGMOID, 0.0, dt, dx, dy, NULL, y, n, false);
}

ddl_status ddl_tanh_forward(ddl_dtype dt, void *y, const void *x, int64_t n)
{
    return act_forward(DDL_ACTIVATION_TANH, 0.0, dt, y, x, n);
}

ddl_status ddl_tanh_backward(ddl_dtype dt, void *dx, const void *dy, const void *y, int64_t n)
{
    return act_backward(DDL_ACTIVATION_TANH, 0.0, dt, dx, dy, NULL, y, n, false);
}

ddl_status ddl_gelu_forward(ddl_dtype dt, void *y, const void *x, int64_t n)
{
    return act_forward(DDL_ACTIVATION_GELU, 0.0, dt, y, x, n);
}

ddl_status ddl_gelu_backward(ddl_dtype dt, void *dx, const void *dy, const void *x, int64_t n)
{
    return act_backward(DDL_ACTIVATION_GELU, 0.0, dt, dx, dy, x, NULL, n, false);
}

ddl_status ddl_activation_forward(ddl_activation act, double param, ddl_dtype dt, void *y,
                                  const void *x, int64_t n)
{
    switch (act) {
    case DDL_ACTIVATION_RELU:
        return ddl_relu_forward(dt, y, x, n);
    case DDL_ACTIVATION_LEAKY_RELU:
        return ddl_leaky_relu_forward(dt, y, x, n, param);
    case DDL_ACTIVATION_SIGMOID:
        return ddl_sigmoid_forward(dt, y, x, n);
    case DDL_ACTIVATION_TANH:
        return ddl_tanh_forward(dt, y, x, n);
    case DDL_ACTIVATION_GELU:
        return ddl_gelu_forward(dt, y, x, n);
    }
    return ddl_set_error(DDL_EINVAL, "activation_forward: unknown activation %d", (int)act);
}

ddl_status ddl_activation_backward(ddl_activation act, double param, ddl_dtype dt, void *dx,
                                   const void *dy, const void *x, const void *y, int64_t n)
{
    switch (act) {
    case DDL_ACTIVATION_RELU:
        return ddl_relu_backward(dt, dx, dy, y, n);
    case DDL_ACTIVATION_LEAKY_RELU:
        return ddl_leaky_relu_backward(dt, dx, dy, x, n, param);
    case DDL_ACTIVATION_SIGMOID:
        return ddl_sigmoid_backward(dt, dx, dy, y, n);
    case DDL_ACTIVATION_TANH:
        return ddl_tanh_backward(dt, dx, dy, y, n);
    case DDL_ACTIVATION_GELU:
        return ddl_gelu_backward(dt, dx, dy, x, n);
    }
    return ddl_set_error(DDL_EINVAL, "activation_backward: unknown activation %d", (int)act);
}

ddl_status ddl_activation_backward_into(ddl_activation act, double param, ddl_dtype dt, void *dx,
                                        const void *dy, const void *x, const void *y, int64_t n)
{
    switch (act) {
    case DDL_ACTIVATION_RELU:
    case DDL_ACTIVATION_LEAKY_RELU:
    case DDL_ACTIVATION_SIGMOID:
    case DDL_ACTIVATION_TANH:
    case DDL_ACTIVATION_GELU:
        // The named forms pass NULL for the operand their kind does not read; so does this.
        return act_backward(act, act == DDL_ACTIVATION_LEAKY_RELU ? param : 0.0, dt, dx, dy,
                            act_needs_x(act) ? x : NULL, act_needs_x(act) ? NULL : y, n, true);
    }
    return ddl_set_error(DDL_EINVAL, "activation_backward_into: unknown activation %d", (int)act);
}

// ---- dropout ------------------------------------------------------------------------

// Element i is kept when its counter draw is at least p; draws are in [0, 1), so p = 0
// keeps everything and p = 1 drops everything.
KERNEL bool dropout_keep(double p, uint64_t seed, uint64_t stream, uint64_t offset, int64_t i)
{
    return ddl_rng_uniform(seed, stream, offset + (uint64_t)i) >= p;
}

// y = x * keep / (1 - p); mask [n] written when non-NULL.
KERNEL void dropout_forward_kernel(ddl_dtype dt, void *y, uint8_t *mask, const void *x,
                                   int64_t n, double p, double scale, uint64_t seed,
                                   uint64_t stream, uint64_t offset)
{
    for (int64_t i = 0; i < n; i++) {
        bool keep = dropout_keep(p, seed, stream, offset, i);
        if (mask) {
            mask[i] = keep ? 1 : 0;
        }
        st(dt, y, i, keep ? ld(dt, x, i) * scale : 0.0);
    }
}

// dx += dy * keep / (1 - p), keep from mask or recomputed.
KERNEL void dropout_backward_kernel(ddl_dtype dt, void *dx, const void *dy, const uint8_t *mask,
                                    int64_t n, double p, double scale, uint64_t seed,
                                    uint64_t stream, uint64_t offset)
{
    for (int64_t i = 0; i < n; i++) {
        bool keep = mask ? mask[i] != 0 : dropout_keep(p, seed, stream, offset, i);
        if (keep) {
            acc(dt, dx, i, ld(dt, dy, i) * scale);
        }
    }
}

static ddl_status dropout_check(const char *who, ddl_dtype dt, int64_t n, double p)
{
    DDL_CHECK(check_common(who, dt, n));
    DDL_REQUIRE(p >= 0.0 && p <= 1.0, DDL_EINVAL,
                "%s: dropout probability has to be between 0 and 1, but got %g", who, p);
    return DDL_OK;
}

ddl_status ddl_dropout_forward(ddl_dtype dt, void *y, uint8_t *mask, const void *x, int64_t n,
                               double p, uint64_t seed, uint64_t stream, uint64_t offset)
{
    DDL_CHECK(dropout_check("dropout_forward", dt, n, p));
    DDL_REQUIRE(n == 0 || (x && y), DDL_EINVAL, "dropout_forward: NULL x or y with n = %lld",
                (long long)n);
    double scale = p < 1.0 ? 1.0 / (1.0 - p) : 0.0;
    if (dt == DDL_F32) {
        dropout_forward_kernel(DDL_F32, y, mask, x, n, p, scale, seed, stream, offset);
    } else {
        dropout_forward_kernel(DDL_F64, y, mask, x, n, p, scale, seed, stream, offset);
    }
    return DDL_OK;
}

ddl_status ddl_dropout_backward(ddl_dtype dt, void *dx, const void *dy, const uint8_t *mask,
                                int64_t n, double p, uint64_t seed, uint64_t stream,
                                uint64_t offset)
{
    DDL_CHECK(dropout_check("dropout_backward", dt, n, p));
    if (dx == NULL || n == 0) {
        return DDL_OK;
    }
    DDL_REQUIRE(dy != NULL, DDL_EINVAL, "dropout_backward: NULL dy with n = %lld", (long long)n);
    double scale = p < 1.0 ? 1.0 / (1.0 - p) : 0.0;
    if (dt == DDL_F32) {
        dropout_backward_kernel(DDL_F32, dx, dy, mask, n, p, scale, seed, stream, offset);
    } else {
        dropout_backward_kernel(DDL_F64, dx, dy, mask, n, p, scale, seed, stream, offset);
    }
    return DDL_OK;
}
