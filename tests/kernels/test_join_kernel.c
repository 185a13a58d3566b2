// tests/kernels/test_join_kernel.c: the graph layers' local math (kernels/join.c) against
// naive references: the n-operand sum (double sum in operand order, rounded once), its
// two-operand f32 loop bit for bit (extreme exponents, signed zeros, NaN and inf, in place,
// every tail length), and the row mean with the adjoint identity of its backward.
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ddl/base.h"
#include "ddl/kernels_pointwise.h"
#include "test.h"

static uint64_t rng = 88172645463325252ull;

static double draw(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

// Floats over the whole exponent range, with both signs.
static float wide(void)
{
    double m = 1.0 + draw();
    int    e = (int)(draw() * 250.0) - 125;
    return (float)((draw() < 0.5 ? -m : m) * ldexp(1.0, e));
}

static void test_sum(void)
{
    enum { N = 1037 };
    static float  a[N], b[N], c[N], y[N], want[N];
    static double ad[N], bd[N], cd[N], yd[N];
    for (int i = 0; i < N; i++) {
        a[i] = wide();
        b[i] = i % 3 == 0 ? -a[i] * (float)(1.0 + draw() * 1e-6) : wide();
        c[i] = wide();
    }
    a[0] = -0.0f, b[0] = -0.0f; // -0 + -0 = -0
    a[1] = -0.0f, b[1] = 0.0f;  // +0
    a[2] = INFINITY, b[2] = -INFINITY;
    a[3] = NAN;
    a[4] = FLT_MAX, b[4] = FLT_MAX;
    a[5] = FLT_TRUE_MIN, b[5] = -FLT_TRUE_MIN;
    // Two f32 operands: the double sum rounded once, bit for bit, for every count's tail.
    for (int i = 0; i < N; i++) {
        want[i] = (float)((double)a[i] + (double)b[i]);
    }
    for (int64_t count = 0; count <= 40; count++) {
        memset(y, 0x7f, sizeof y);
        const void *xs[2] = {a, b};
        ASSERT_OK(ddl_sum_forward(DDL_F32, y, 2, xs, count));
        ASSERT_TRUE(memcmp(y, want, (size_t)count * sizeof *y) == 0);
        ASSERT_TRUE(count == N || y[count] == y[N - 1]); // nothing past count
    }
    const void *xs2[2] = {a, b};
    ASSERT_OK(ddl_sum_forward(DDL_F32, y, 2, xs2, N));
    ASSERT_TRUE(memcmp(y, want, sizeof y) == 0);
    // In place, over either operand.
    float t[N];
    memcpy(t, a, sizeof t);
    const void *xs3[2] = {t, b};
    ASSERT_OK(ddl_sum_forward(DDL_F32, t, 2, xs3, N));
    ASSERT_TRUE(memcmp(t, want, sizeof t) == 0);
    memcpy(t, b, sizeof t);
    const void *xs4[2] = {a, t};
    ASSERT_OK(ddl_sum_forward(DDL_F32, t, 2, xs4, N));
    ASSERT_TRUE(memcmp(t, want, sizeof t) == 0);
    // Three f32 operands: in double, in operand order, rounded once.
    const void *xs5[3] = {a, b, c};
    ASSERT_OK(ddl_sum_forward(DDL_F32, y, 3, xs5, N));
    for (int i = 0; i < N; i++) {
        float w = (float)(((double)a[i] + (double)b[i]) + (double)c[i]);
        ASSERT_TRUE(memcmp(&y[i], &w, sizeof w) == 0);
    }
    // f64, two and one operand.
    for (int i = 0; i < N; i++) {
        ad[i] = (double)a[i] * (1.0 + draw());
        bd[i] = (double)b[i];
        cd[i] = 0;
    }
    const void *xs6[2] = {ad, bd};
    ASSERT_OK(ddl_sum_forward(DDL_F64, yd, 2, xs6, N));
    for (int i = 0; i < N; i++) {
        double w = ad[i] + bd[i];
        ASSERT_TRUE(memcmp(&yd[i], &w, sizeof w) == 0);
    }
    const void *xs7[1] = {ad};
    ASSERT_OK(ddl_sum_forward(DDL_F64, cd, 1, xs7, N));
    ASSERT_TRUE(memcmp(cd, ad, sizeof cd) == 0); // one operand: a copy, -0 included
    // The sign of a zero sum is IEEE's on both paths: -0 + -0 = -0, -0 + 0 = +0.
    ASSERT_TRUE(signbit(want[0]) && !signbit(want[1]));
    ASSERT_OK(ddl_sum_forward(DDL_F32, y, 3, xs5, 2));
    ASSERT_TRUE(signbit(y[0]) == signbit(c[0]) && y[0] == c[0]);
    // Errors.
    ASSERT_STATUS(ddl_sum_forward(DDL_F32, y, 0, xs2, N), DDL_EINVAL);
    ASSERT_STATUS(ddl_sum_forward(DDL_F32, y, 2, xs2, -1), DDL_EINVAL);
    ASSERT_STATUS(ddl_sum_forward((ddl_dtype)77, y, 2, xs2, N), DDL_EINVAL);
    // The fused add + ReLU refuses the same, naming itself, and writes nothing.
    float keep = y[0];
    ASSERT_STATUS(ddl_sum_relu_forward(DDL_F32, y, 0, xs2, N), DDL_EINVAL);
    ASSERT_TRUE(strstr(ddl_last_error(), "sum_relu_forward") != NULL);
    ASSERT_STATUS(ddl_sum_relu_forward(DDL_F32, y, 2, xs2, -1), DDL_EINVAL);
    ASSERT_STATUS(ddl_sum_relu_forward((ddl_dtype)77, y, 2, xs2, N), DDL_EINVAL);
    ASSERT_TRUE(strstr(ddl_last_error(), "sum_relu_forward") != NULL);
    ASSERT_TRUE(memcmp(&y[0], &keep, sizeof keep) == 0);
}

static void test_rowmean(void)
{
    enum { R = 7, S = 13 };
    double x[R * S], y[R], w[R], dx[R * S];
    for (int i = 0; i < R * S; i++) {
        x[i] = draw() * 2 - 1;
    }
    for (int r = 0; r < R; r++) {
        w[r] = draw() * 2 - 1;
    }
    double scale = 1.0 / 20.0; // a piece of a larger global pooling
    ASSERT_OK(ddl_rowmean_forward(DDL_F64, y, x, R, S, scale));
    for (int r = 0; r < R; r++) {
        double v = 0;
        for (int s = 0; s < S; s++) {
            v += x[r * S + s];
        }
        ASSERT_NEAR(y[r], scale * v, 1e-15);
    }
    // <rowmean(x), w> = <x, rowmean_backward(w)>, the backward accumulating.
    for (int i = 0; i < R * S; i++) {
        dx[i] = 0.25;
    }
    ASSERT_OK(ddl_rowmean_backward(DDL_F64, dx, w, R, S, scale));
    double lhs = 0, rhs = 0;
    for (int r = 0; r < R; r++) {
        lhs += y[r] * w[r];
    }
    for (int i = 0; i < R * S; i++) {
        rhs += x[i] * (dx[i] - 0.25);
    }
    ASSERT_NEAR(lhs, rhs, 1e-14);
}

int main(void)
{
    test_sum();
    test_rowmean();
    printf("test_join_kernel: ok\n");
    return 0;
}
