// kernels/join.c: the local math of the graph layers: the sum of n operands (add) and
// the mean over the trailing S values of each of R rows (global average pooling).
//
//   sum      y[i] = x_0[i] + ... + x_{n-1}[i]      (in double, in operand order, rounded
//            once: for two f32 operands exactly the f32 sum PyTorch computes, -0 included)
//   sum_relu y[i] = relu(the sum rounded)          (the residual add with its ReLU fused:
//            the bits of sum, then ddl_relu_forward)
//   rowmean  y[r] = scale * sum_s x[r*S + s]       dx[r*S + s] += scale * dy[r]
//
// A rank of a spatially split global pooling calls rowmean with scale = 1 / (the global
// spatial size), so the partial results of the ranks add up to the mean.
#include "base/check.h"
#include "ddl/base.h"
#include "ddl/kernels_pointwise.h"
#include "kernels/dtype.h"

static ddl_status check_dt(const char *who, ddl_dtype dt)
{
    DDL_REQUIRE(dt == DDL_F32 || dt == DDL_F64, DDL_EINVAL, "%s: unknown dtype %d", who, (int)dt);
    return DDL_OK;
}

// Two f32 operands (the residual add) in float: a float sum of two floats rounded once is
// the same as their exact double sum rounded to float (53 >= 2 * 24 + 2, so the double
// rounding is innocuous), so this gives sum_body's bits in a loop the compiler vectorizes.
// With relu, the ReLU of ddl_relu_forward on the rounded sum (x > 0 or NaN keeps x). No
// restrict: y may alias an operand, element by element.
KERNEL void sum2_f32(float *y, const float *a, const float *b, int64_t count, bool relu)
{
    for (int64_t i = 0; i < count; i++) {
        float v = a[i] + b[i];
        y[i]    = !relu || !(v <= 0.0f) ? v : 0.0f;
    }
}

KERNEL void sum_body(ddl_dtype dt, void *y, int n, const void *const *xs, int64_t count, bool relu)
{
    if (dt == DDL_F32 && n == 2) {
        if (relu) { // a constant in each call: each loop compiles without the select's branch
            sum2_f32(y, xs[0], xs[1], count, true);
        } else {
            sum2_f32(y, xs[0], xs[1], count, false);
        }
        return;
    }
    for (int64_t i = 0; i < count; i++) {
        double v = ld(dt, xs[0], i); // not 0.0 + ...: -0 + -0 stays -0, as IEEE (and PyTorch) add
        for (int k = 1; k < n; k++) {
            v += ld(dt, xs[k], i);
        }
        if (relu) {
            v = dt == DDL_F32 ? (double)(float)v : v; // the rounded sum, as the ReLU reads it
            v = !(v <= 0.0) ? v : 0.0;
        }
        st(dt, y, i, v);
    }
}

static ddl_status sum_run(const char *who, ddl_dtype dt, void *y, int n, const void *const *xs,
                          int64_t count, bool relu)
{
    DDL_CHECK(check_dt(who, dt));
    DDL_REQUIRE(n >= 1 && count >= 0, DDL_EINVAL,
                "%s: %d operands of %lld elements (need >= 1 and >= 0)", who, n, (long long)count);
    if (dt == DDL_F32) {
        sum_body(DDL_F32, y, n, xs, count, relu);
    } else {
        sum_body(DDL_F64, y, n, xs, count, relu);
    }
    return DDL_OK;
}

ddl_status ddl_sum_forward(ddl_dtype dt, void *y, int n, const void *const *xs, int64_t count)
{
    return sum_run("sum_forward", dt, y, n, xs, count, false);
}

ddl_status ddl_sum_relu_forward(ddl_dtype dt, void *y, int n, const void *const *xs, int64_t count)
{
    return sum_run("sum_relu_forward", dt, y, n, xs, count, true);
}

KERNEL void rowmean_fwd_body(ddl_dtype dt, void *y, const void *x, int64_t R, int64_t S,
                             double scale)
{
    for (int64_t r = 0; r < R; r++) {
        double v = 0.0;
        for (int64_t s = 0; s < S; s++) {
            v += ld(dt, x, r * S + s);
        }
        st(dt, y, r, scale * v);
    }
}

KERNEL void rowmean_bwd_body(ddl_dtype dt, void *dx, const void *dy, int64_t R, int64_t S,
                             double scale)
{
    for (int64_t r = 0; r < R; r++) {
        double g = scale * ld(dt, dy, r);
        for (int64_t s = 0; s < S; s++) {
            acc(dt, dx, r * S + s, g);
        }
    }
}

static ddl_status check_rows(const char *who, ddl_dtype dt, int64_t R, int64_t S)
{
    DDL_CHECK(check_dt(who, dt));
    DDL_REQUIRE(R >= 0 && S >= 0, DDL_EINVAL, "%s: negative size in [R, S] = [%lld, %lld]", who,
                (long long)R, (long long)S);
    return DDL_OK;
}

ddl_status ddl_rowmean_forward(ddl_dtype dt, void *y, const void *x, int64_t R, int64_t S,
                               double scale)
{
    DDL_CHECK(check_rows("rowmean_forward", dt, R, S));
    if (dt == DDL_F32) {
        rowmean_fwd_body(DDL_F32, y, x, R, S, scale);
    } else {
        rowmean_fwd_body(DDL_F64, y, x, R, S, scale);
    }
    return DDL_OK;
}

ddl_status ddl_rowmean_backward(ddl_dtype dt, void *dx, const void *dy, int64_t R, int64_t S,
                                double scale)
{
    DDL_CHECK(check_rows("rowmean_backward", dt, R, S));
    if (dt == DDL_F32) {
        rowmean_bwd_body(DDL_F32, dx, dy, R, S, scale);
    } else {
        rowmean_bwd_body(DDL_F64, dx, dy, R, S, scale);
    }
    return DDL_OK;
}
