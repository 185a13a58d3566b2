// Tests of the activation and dropout kernels: hand-checked values, random inputs
// against formulas written independently here (f32 and f64), f64 finite-difference
// gradient checks of every backward, accumulation, and argument errors.
#include <math.h>
#include <string.h>

#include "ddl/base.h"
#include "ddl/kernels_pointwise.h"
#include "gradcheck.h"
#include "test.h"

#define NMAX 4096

static void fill_uniform(double *a, int64_t n, uint64_t seed, double lo, double hi)
{
    for (int64_t i = 0; i < n; i++) {
        a[i] = lo + (hi - lo) * ddl_rng_uniform(seed, 11, (uint64_t)i);
    }
}

static void to_f32(float *out, const double *in, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        out[i] = (float)in[i];
    }
}

static const ddl_activation KINDS[] = {DDL_ACTIVATION_RELU, DDL_ACTIVATION_LEAKY_RELU,
                                       DDL_ACTIVATION_SIGMOID, DDL_ACTIVATION_TANH,
                                       DDL_ACTIVATION_GELU};
#define NKINDS 5
#define SLOPE  0.125

// Independent references: sigmoid through tanh, GELU through erfc.
static double ref_f(ddl_activation act, double x)
{
    switch (act) {
    case DDL_ACTIVATION_RELU:
        return x < 0.0 ? 0.0 : x;
    case DDL_ACTIVATION_LEAKY_RELU:
        return x < 0.0 ? SLOPE * x : x;
    case DDL_ACTIVATION_SIGMOID:
        return 0.5 * (1.0 + tanh(0.5 * x));
    case DDL_ACTIVATION_TANH:
        return (1.0 - exp(-2.0 * x)) / (1.0 + exp(-2.0 * x));
    case DDL_ACTIVATION_GELU:
        return 0.5 * x * erfc(-x / sqrt(2.0));
    }
    return NAN;
}

// ---- hand-checked values ------------------------------------------------------------

static void test_hand_values(void)
{
    const double x[5] = {-2.0, -0.5, 0.0, 0.5, 3.0};
    // Values from the definitions: sigmoid(v) = 1/(1+e^-v), tanh, v*Phi(v).
    const double want[NKINDS][5] = {
        {0.0, 0.0, 0.0, 0.5, 3.0},
        {-0.25, -0.0625, 0.0, 0.5, 3.0},
        {0.11920292202211755, 0.37754066879814541, 0.5, 0.62245933120185459, 0.95257412682243336},
        {-0.96402758007581690, -0.46211715726000974, 0.0, 0.46211715726000974,
         0.99505475368673046},
        {-0.045500263896358417, -0.15426876936299344, 0.0, 0.34573123063700656,
         2.9959503059051097},
    };
    for (int k = 0; k < NKINDS; k++) {
        double y[5];
        float  xf[5], yf[5];
        ASSERT_OK(ddl_activation_forward(KINDS[k], SLOPE, DDL_F64, y, x, 5));
        to_f32(xf, x, 5);
        ASSERT_OK(ddl_activation_forward(KINDS[k], SLOPE, DDL_F32, yf, xf, 5));
        for (int i = 0; i < 5; i++) {
            ASSERT_NEAR(y[i], want[k][i], 1e-15);
            ASSERT_NEAR(yf[i], want[k][i], 3e-7);
        }
    }
    // Named entry points agree with the dispatcher.
    double y1[5], y2[5];
    ASSERT_OK(ddl_leaky_relu_forward(DDL_F64, y1, x, 5, SLOPE));
    ASSERT_OK(ddl_gelu_forward(DDL_F64, y2, x, 5));
    ASSERT_NEAR(y1[0], -0.25, 0.0);
    ASSERT_NEAR(y2[4], 2.9959503059051097, 1e-15);
    // Derivatives at hand points: relu' = 0 at the kink, sigmoid'(0) = 1/4,
    // tanh'(0) = 1, gelu'(0) = 1/2, leaky' = slope for negative x.
    const double z[1] = {0.0}, one[1] = {1.0}, neg[1] = {-1.0};
    double       yz[1], dx[1];
    for (int k = 0; k < NKINDS; k++) {
        const double *xx = KINDS[k] == DDL_ACTIVATION_LEAKY_RELU ? neg : z;
        const double  d0[NKINDS] = {0.0, SLOPE, 0.25, 1.0, 0.5};
        ASSERT_OK(ddl_activation_forward(KINDS[k], SLOPE, DDL_F64, yz, xx, 1));
        dx[0] = 0.0;
        ASSERT_OK(ddl_activation_backward(KINDS[k], SLOPE, DDL_F64, dx, one, xx, yz, 1));
        ASSERT_NEAR(dx[0], d0[k], 1e-15);
    }
    // NaN propagates through ReLU, as clamp_min does.
    double nan_in[1] = {NAN}, nan_out[1];
    ASSERT_OK(ddl_relu_forward(DDL_F64, nan_out, nan_in, 1));
    ASSERT_TRUE(isnan(nan_out[0]));
    // Sigmoid does not overflow at the extremes.
    double ext[2] = {-800.0, 800.0}, se[2];
    ASSERT_OK(ddl_sigmoid_forward(DDL_F64, se, ext, 2));
    ASSERT_NEAR(se[0], 0.0, 0.0);
    ASSERT_NEAR(se[1], 1.0, 0.0);
}

// ---- random inputs against the references -----------------------------------------

static void test_random_forward(void)
{
    static double x[NMAX], y[NMAX];
    static float  xf[NMAX], yf[NMAX];
    int64_t       n = 1000;
    fill_uniform(x, n, 1, -6.0, 6.0);
    to_f32(xf, x, n);
    for (int k = 0; k < NKINDS; k++) {
        ASSERT_OK(ddl_activation_forward(KINDS[k], SLOPE, DDL_F64, y, x, n));
        ASSERT_OK(ddl_activation_forward(KINDS[k], SLOPE, DDL_F32, yf, xf, n));
        for (int64_t i = 0; i < n; i++) {
            double r = ref_f(KINDS[k], x[i]);
            ASSERT_NEAR(y[i], r, 1e-14 * fmax(1.0, fabs(r)));
            double rf = ref_f(KINDS[k], (double)xf[i]);
            ASSERT_NEAR(yf[i], rf, 2e-7 * fmax(1.0, fabs(rf)));
        }
        // In place: y aliasing x gives the same result.
        static double xi[NMAX];
        memcpy(xi, x, sizeof(double) * (size_t)n);
        ASSERT_OK(ddl_activation_forward(KINDS[k], SLOPE, DDL_F64, xi, xi, n));
        ASSERT_TRUE(memcmp(xi, y, sizeof(double) * (size_t)n) == 0);
    }
}

// ---- gradient checks -------------------------------------------------------------------

typedef struct act_ctx {
    ddl_activation act;
    int64_t        n;
    double        *x;
    const double  *w;
    double        *y;
} act_ctx;

// f(x) = sum_i w_i act(x_i).
static double act_objective(void *p)
{
    act_ctx *c = p;
    ASSERT_OK(ddl_activation_forward(c->act, SLOPE, DDL_F64, c->y, c->x, c->n));
    double s = 0.0;
    for (int64_t i = 0; i < c->n; i++) {
        s += c->w[i] * c->y[i];
    }
    return s;
}

static void test_gradcheck(void)
{
    enum { N = 200 };
    static double x[N], w[N], y[N], dx[N], pre[N];
    static float  xf[N], wf[N], yf[N], dxf[N];
    fill_uniform(w, N, 3, -1.0, 1.0);
    fill_uniform(pre, N, 4, -1.0, 1.0);
    for (int k = 0; k < NKINDS; k++) {
        fill_uniform(x, N, 2, -4.0, 4.0);
        for (int i = 0; i < N; i++) {
            if (fabs(x[i]) < 0.05) {
                x[i] = 0.05; // keep finite differences away from the kinks at 0
            }
        }
        act_ctx c = {.act = KINDS[k], .n = N, .x = x, .w = w, .y = y};
        ASSERT_OK(ddl_activation_forward(KINDS[k], SLOPE, DDL_F64, y, x, N));
        // Accumulation: dx starts from pre and must end at pre + grad.
        memcpy(dx, pre, sizeof dx);
        ASSERT_OK(ddl_activation_backward(KINDS[k], SLOPE, DDL_F64, dx, w, x, y, N));
        for (int i = 0; i < N; i++) {
            dx[i] -= pre[i];
        }
        double err = ddl_test_gradcheck(N, x, dx, act_objective, &c, 1e-6, 0);
        ASSERT_LE(err, 1e-8);

        // f32 backward agrees with f64.
        to_f32(xf, x, N);
        to_f32(wf, w, N);
        ASSERT_OK(ddl_activation_forward(KINDS[k], SLOPE, DDL_F32, yf, xf, N));
        memset(dxf, 0, sizeof dxf);
        ASSERT_OK(ddl_activation_backward(KINDS[k], SLOPE, DDL_F32, dxf, wf, xf, yf, N));
        for (int i = 0; i < N; i++) {
            ASSERT_NEAR(dxf[i], dx[i], 1e-5 * fmax(1.0, fabs(dx[i])));
        }
        // A NULL gradient output is skipped.
        ASSERT_OK(ddl_activation_backward(KINDS[k], SLOPE, DDL_F64, NULL, w, x, y, N));
        ASSERT_OK(ddl_activation_backward_into(KINDS[k], SLOPE, DDL_F64, NULL, w, x, y, N));

        // The overwriting form: over a dx of NaN, the bits of accumulating onto zeros, in
        // both types (the f32 ReLU takes its vector loop and its tail), and in place.
        static double zd[N], od[N];
        static float  zf[N], of[N];
        double        nan = NAN;
        memset(zd, 0, sizeof zd);
        memset(zf, 0, sizeof zf);
        for (int i = 0; i < N; i++) {
            od[i] = nan;
            of[i] = (float)nan;
        }
        w[7]  = -0.0; // a signed zero: 0 + -0 is +0, which the overwriting form must keep
        wf[7] = -0.0f;
        ASSERT_OK(ddl_activation_backward(KINDS[k], SLOPE, DDL_F64, zd, w, x, y, N));
        ASSERT_OK(ddl_activation_backward_into(KINDS[k], SLOPE, DDL_F64, od, w, x, y, N));
        ASSERT_TRUE(memcmp(zd, od, sizeof zd) == 0);
        ASSERT_OK(ddl_activation_backward(KINDS[k], SLOPE, DDL_F32, zf, wf, xf, yf, N - 3));
        ASSERT_OK(ddl_activation_backward_into(KINDS[k], SLOPE, DDL_F32, of, wf, xf, yf, N - 3));
        ASSERT_TRUE(memcmp(zf, of, (N - 3) * sizeof *zf) == 0);
        ASSERT_TRUE(isnan(of[N - 3])); // nothing past n is written
        memcpy(of, wf, sizeof of);
        ASSERT_OK(ddl_activation_backward_into(KINDS[k], SLOPE, DDL_F32, of, of, xf, yf, N - 3));
        ASSERT_TRUE(memcmp(zf, of, (N - 3) * sizeof *zf) == 0);
        fill_uniform(w, N, 3, -1.0, 1.0);
    }
    ASSERT_STATUS(ddl_activation_backward_into((ddl_activation)99, 0, DDL_F64, dx, w, x, y, N),
                  DDL_EINVAL);
}

// ---- dropout ---------------------------------------------------------------------------

static void test_dropout(void)
{
    enum { N = 100000 };
    static double  x[N], y[N], dy[N], dx[N], dx2[N], y2[N];
    static uint8_t mask[N], mask2[N];
    static float   xf[N], yf[N];
    const double   p    = 0.3;
    const uint64_t seed = 42, stream = 7, off = 1000;
    fill_uniform(x, N, 5, -2.0, 2.0);
    ASSERT_OK(ddl_dropout_forward(DDL_F64, y, mask, x, N, p, seed, stream, off));
    int64_t kept = 0;
    for (int64_t i = 0; i < N; i++) {
        int want = ddl_rng_uniform(seed, stream, off + (uint64_t)i) >= p;
        ASSERT_EQ(mask[i], want);
        ASSERT_NEAR(y[i], want ? x[i] / (1.0 - p) : 0.0, 1e-15);
        kept += want;
    }
    // Keep rate 1 - p within 5 sigma (sigma = sqrt(p(1-p)/N) ~ 0.0014).
    ASSERT_NEAR((double)kept / N, 1.0 - p, 0.008);

    // A piece with its global offset draws the same mask as the whole.
    int64_t split = 33333;
    ASSERT_OK(ddl_dropout_forward(DDL_F64, y2, mask2, x, split, p, seed, stream, off));
    ASSERT_OK(ddl_dropout_forward(DDL_F64, y2 + split, mask2 + split, x + split, N - split, p,
                                  seed, stream, off + (uint64_t)split));
    ASSERT_TRUE(memcmp(mask, mask2, N) == 0);
    ASSERT_TRUE(memcmp(y, y2, sizeof y) == 0);

    // f32 and NULL mask.
    to_f32(xf, x, N);
    ASSERT_OK(ddl_dropout_forward(DDL_F32, yf, NULL, xf, N, p, seed, stream, off));
    for (int64_t i = 0; i < N; i++) {
        ASSERT_NEAR(yf[i], mask[i] ? (double)xf[i] / (1.0 - p) : 0.0, 4e-7);
    }

    // Backward with the stored mask and with a recomputed one, accumulating.
    fill_uniform(dy, N, 6, -1.0, 1.0);
    for (int64_t i = 0; i < N; i++) {
        dx[i] = dx2[i] = 0.5;
    }
    ASSERT_OK(ddl_dropout_backward(DDL_F64, dx, dy, mask, N, p, seed, stream, off));
    ASSERT_OK(ddl_dropout_backward(DDL_F64, dx2, dy, NULL, N, p, seed, stream, off));
    ASSERT_TRUE(memcmp(dx, dx2, sizeof dx) == 0);
    for (int64_t i = 0; i < N; i++) {
        ASSERT_NEAR(dx[i], 0.5 + (mask[i] ? dy[i] / (1.0 - p) : 0.0), 1e-15);
    }

    // The same mask makes dropout linear in x: check its gradient by finite differences
    // through the activation harness's objective shape (sum w_i y_i).
    enum { M = 64 };
    double xs[M], ws[M], ys[M], g[M];
    fill_uniform(xs, M, 8, -1.0, 1.0);
    fill_uniform(ws, M, 9, -1.0, 1.0);
    memset(g, 0, sizeof g);
    ASSERT_OK(ddl_dropout_backward(DDL_F64, g, ws, NULL, M, p, seed, stream, 0));
    for (int i = 0; i < M; i++) {
        double keep = xs[i];
        xs[i]       = keep + 1e-3;
        ASSERT_OK(ddl_dropout_forward(DDL_F64, ys, NULL, xs, M, p, seed, stream, 0));
        double fp = 0.0;
        for (int j = 0; j < M; j++) {
            fp += ws[j] * ys[j];
        }
        xs[i] = keep - 1e-3;
        ASSERT_OK(ddl_dropout_forward(DDL_F64, ys, NULL, xs, M, p, seed, stream, 0));
        double fm = 0.0;
        for (int j = 0; j < M; j++) {
            fm += ws[j] * ys[j];
        }
        xs[i] = keep;
        ASSERT_NEAR((fp - fm) / 2e-3, g[i], 1e-10);
    }

    // p = 0 is the identity; p = 1 drops everything without NaN.
    ASSERT_OK(ddl_dropout_forward(DDL_F64, y, mask, x, 1000, 0.0, seed, stream, 0));
    ASSERT_TRUE(memcmp(y, x, 1000 * sizeof(double)) == 0);
    ASSERT_OK(ddl_dropout_forward(DDL_F64, y, mask, x, 1000, 1.0, seed, stream, 0));
    for (int i = 0; i < 1000; i++) {
        ASSERT_TRUE(y[i] == 0.0 && mask[i] == 0);
    }
    ASSERT_STATUS(ddl_dropout_forward(DDL_F64, y, mask, x, 10, 1.5, seed, stream, 0), DDL_EINVAL);
    ASSERT_STATUS(ddl_dropout_forward(DDL_F64, y, mask, x, 10, -0.1, seed, stream, 0), DDL_EINVAL);
    ASSERT_STATUS(ddl_dropout_backward(DDL_F64, dx, dy, NULL, 10, NAN, seed, stream, 0),
                  DDL_EINVAL);
}

// ReLU runs in the element type (vector lanes plus a scalar tail). It must give the bits
// of the definition computed in double and rounded once: y = x if x > 0 or NaN, else +0;
// dx += dy * [y > 0] (so 0 * inf = NaN and -0 + +0 = +0 as in the arithmetic), with dx
// aliasing dy allowed. Lengths 0..37 cover every tail.
static void test_relu_exact(void)
{
    enum { N = 37 };
    const double special[] = {NAN, INFINITY, -INFINITY, 0.0, -0.0, 1e-40, -1e-40, 3.5, -2.0};
    double       x[N], dy[N], dx0[N];
    for (int64_t i = 0; i < N; i++) {
        x[i]   = i % 3 == 0 ? special[i / 3 % 9] : ddl_rng_uniform(5, 0, (uint64_t)i) - 0.5;
        dy[i]  = i % 4 == 1 ? special[(i / 4 + 3) % 9] : ddl_rng_uniform(5, 1, (uint64_t)i) - 0.5;
        dx0[i] = i % 5 == 2 ? -0.0 : ddl_rng_uniform(5, 2, (uint64_t)i) - 0.5;
    }
    for (int d = 0; d < 2; d++) {
        for (int64_t n = 0; n <= N; n++) {
            float  xf[N], yf[N], dyf[N], dxf[N];
            double xd[N], yd[N], dyd[N], dxd[N];
            for (int64_t i = 0; i < n; i++) {
                xf[i] = (float)x[i], dyf[i] = (float)dy[i], dxf[i] = (float)dx0[i];
                xd[i] = x[i], dyd[i] = dy[i], dxd[i] = dx0[i];
            }
            if (d == 0) {
                ASSERT_OK(ddl_relu_forward(DDL_F32, yf, xf, n));
                ASSERT_OK(ddl_relu_backward(DDL_F32, dxf, dyf, yf, n));
            } else {
                ASSERT_OK(ddl_relu_forward(DDL_F64, yd, xd, n));
                ASSERT_OK(ddl_relu_backward(DDL_F64, dxd, dyd, yd, n));
            }
            for (int64_t i = 0; i < n; i++) {
                double xv = d ? x[i] : (double)(float)x[i];
                double yw = (xv > 0.0 || isnan(xv)) ? xv : 0.0;
                double gv = d ? dy[i] : (double)(float)dy[i];
                double dw = (d ? dx0[i] : (double)(float)dx0[i]) + gv * (yw > 0.0 ? 1.0 : 0.0);
                double yg = d ? yd[i] : (double)yf[i];
                double dg = d ? dxd[i] : (double)dxf[i];
                if (d == 0) {
                    yw = (double)(float)yw, dw = (double)(float)dw;
                }
                ASSERT_TRUE(memcmp(&yg, &yw, sizeof yw) == 0 || (isnan(yg) && isnan(yw)));
                ASSERT_TRUE(memcmp(&dg, &dw, sizeof dw) == 0 || (isnan(dg) && isnan(dw)));
            }
        }
        // In place: dx aliasing dy (dx = dy + dy * [y > 0]).
        double a[N];
        float  af[N], yv[N];
        for (int64_t i = 0; i < N; i++) {
            a[i]  = dy[i];
            af[i] = (float)dy[i];
            yv[i] = (float)x[i];
        }
        if (d == 0) {
            ASSERT_OK(ddl_relu_backward(DDL_F32, af, af, yv, N));
        } else {
            ASSERT_OK(ddl_relu_backward(DDL_F64, a, a, x, N));
        }
        for (int64_t i = 0; i < N; i++) {
            double g = d ? dy[i] : (double)(float)dy[i];
            double w = g + g * ((d ? x[i] : (double)yv[i]) > 0.0 ? 1.0 : 0.0);
            double got = d ? a[i] : (double)af[i];
            ASSERT_TRUE(got == w || (isnan(got) && isnan(w)));
        }
    }
}

static void test_errors(void)
{
    double x[2] = {1.0, 2.0}, y[2];
    ASSERT_STATUS(ddl_relu_forward((ddl_dtype)7, y, x, 2), DDL_EINVAL);
    ASSERT_STATUS(ddl_tanh_forward(DDL_F64, y, x, -1), DDL_EINVAL);
    ASSERT_STATUS(ddl_sigmoid_forward(DDL_F64, NULL, x, 2), DDL_EINVAL);
    ASSERT_STATUS(ddl_gelu_backward(DDL_F64, y, x, NULL, 2), DDL_EINVAL);
    ASSERT_STATUS(ddl_activation_forward((ddl_activation)99, 0.0, DDL_F64, y, x, 2), DDL_EINVAL);
    ASSERT_OK(ddl_relu_forward(DDL_F64, NULL, NULL, 0));
}

int main(void)
{
    test_hand_values();
    test_random_forward();
    test_gradcheck();
    test_dropout();
    test_relu_exact();
    test_errors();
    printf("test_pointwise: ok\n");
    return 0;
}
