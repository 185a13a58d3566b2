// tests/kernels/test_gemm.c: ddl_gemm against its naive reference, and the linear kernels
// against direct loops and central finite differences (f64) and in f32.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ddl/base.h"
#include "ddl/kernels.h"
#include "gradcheck.h"
#include "kernel_util.h"
#include "test.h"

// ---- helpers -----------------------------------------------------------------

static double *rand_vec(int64_t n, uint64_t seed)
{
    return ddl_test_rand_vec(n, seed, 1);
}

static double tol_for(ddl_dtype dt)
{
    return dt == DDL_F32 ? 1e-5 : 1e-12;
}

// ---- GEMM --------------------------------------------------------------------

// ddl_gemm == ddl_gemm_naive for one shape, with padded leading dimensions.
static void check_gemm(ddl_dtype dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                       double alpha, double beta, uint64_t seed)
{
    int64_t arows = ta ? K : M, acols = ta ? M : K;
    int64_t brows = tb ? N : K, bcols = tb ? K : N;
    int64_t lda = acols + 3, ldb = bcols + 1, ldc = N + 2;
    double *A = rand_vec(arows * lda, seed), *B = rand_vec(brows * ldb, seed + 1);
    double *C0 = rand_vec(M * ldc, seed + 2);
    if (beta == 0.0) {
        // BLAS semantics: with beta == 0, C is not read, so NaN in it must not leak out.
        for (int64_t i = 0; i < M * ldc; i++) {
            C0[i] = NAN;
        }
    }
    void *a = ddl_test_as_dtype(dt, A, arows * lda), *b = ddl_test_as_dtype(dt, B, brows * ldb);
    void *c_blas = ddl_test_as_dtype(dt, C0, M * ldc), *c_ref = ddl_test_as_dtype(dt, C0, M * ldc);
    ASSERT_OK(ddl_gemm(dt, ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, c_blas, ldc));
    ASSERT_OK(ddl_gemm_naive(dt, ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, c_ref, ldc));
    // Compare the M x N block only; the padding columns must be left untouched.
    double num = 0.0, den = 1e-300;
    for (int64_t i = 0; i < M; i++) {
        for (int64_t j = 0; j < ldc; j++) {
            double g = ddl_test_at(dt, c_blas, i * ldc + j), r = ddl_test_at(dt, c_ref, i * ldc + j);
            if (j >= N) {
                ASSERT_TRUE(memcmp(&g, &r, sizeof g) == 0 || (isnan(g) && isnan(r)));
                continue;
            }
            ASSERT_TRUE(!isnan(g) && !isnan(r));
            num = fmax(num, fabs(g - r));
            den = fmax(den, fabs(r));
        }
    }
    if (num / den > tol_for(dt)) {
        TEST_FAIL_("gemm %s ta=%d tb=%d M=%lld N=%lld K=%lld beta=%g: rel err %.3g",
                   ddl_dtype_name(dt), ta, tb, (long long)M, (long long)N, (long long)K, beta,
                   num / den);
    }
    // The naive reference itself, on one element, straight from the definition.
    if (M > 0 && N > 0 && beta != 0.0) {
        int64_t i = M - 1, j = N / 2;
        double  acc = 0.0;
        for (int64_t p = 0; p < K; p++) {
            double av = ta ? ddl_test_at(dt, a, p * lda + i) : ddl_test_at(dt, a, i * lda + p);
            double bv = tb ? ddl_test_at(dt, b, j * ldb + p) : ddl_test_at(dt, b, p * ldb + j);
            acc += av * bv;
        }
        double want = alpha * acc + beta * C0[i * ldc + j];
        ASSERT_NEAR(ddl_test_at(dt, c_ref, i * ldc + j), want, tol_for(dt) * 10.0 * (1.0 + fabs(want)));
    }
    free(A), free(B), free(C0), free(a), free(b), free(c_blas), free(c_ref);
}

static void test_gemm(void)
{
    const int64_t shapes[][3] = {{1, 1, 1}, {7, 13, 5}, {33, 17, 65}, {64, 3, 129},
                                 {5, 70, 1}, {2, 9, 0}};
    uint64_t      seed        = 10;
    for (int d = 0; d < 2; d++) {
        ddl_dtype dt = d ? DDL_F64 : DDL_F32;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            for (int t = 0; t < 4; t++) {
                check_gemm(dt, t & 1, t & 2, shapes[s][0], shapes[s][1], shapes[s][2], 1.0,
                           0.0, seed++);
                check_gemm(dt, t & 1, t & 2, shapes[s][0], shapes[s][1], shapes[s][2], -0.75,
                           0.5, seed++);
            }
        }
    }
    // Usage errors are refused with a message.
    double a[4] = {0}, b[4] = {0}, c[4] = {0};
    ASSERT_STATUS(ddl_gemm(DDL_F64, false, false, 2, 2, 2, 1.0, a, 1, b, 2, 0.0, c, 2),
                  DDL_EINVAL); // lda < K
    ASSERT_STATUS(ddl_gemm(DDL_F64, true, false, 2, 2, 2, 1.0, a, 2, b, 2, 0.0, c, 1),
                  DDL_EINVAL); // ldc < N
    ASSERT_STATUS(ddl_gemm(DDL_F64, false, false, -1, 2, 2, 1.0, a, 2, b, 2, 0.0, c, 2),
                  DDL_EINVAL);
    ASSERT_STATUS(ddl_gemm((ddl_dtype)7, false, false, 2, 2, 2, 1.0, a, 2, b, 2, 0.0, c, 2),
                  DDL_EINVAL);
    ASSERT_STATUS(ddl_gemm_naive(DDL_F64, false, true, 2, 2, 3, 1.0, a, 3, b, 2, 0.0, c, 2),
                  DDL_EINVAL); // ldb < K for B^T
    // A tiny product checked by hand: [1 2; 3 4] [5 6; 7 8] = [19 22; 43 50].
    double A2[4] = {1, 2, 3, 4}, B2[4] = {5, 6, 7, 8}, C2[4] = {1, 1, 1, 1};
    ASSERT_OK(ddl_gemm(DDL_F64, false, false, 2, 2, 2, 1.0, A2, 2, B2, 2, 1.0, C2, 2));
    ASSERT_EQ(C2[0], 20);
    ASSERT_EQ(C2[1], 23);
    ASSERT_EQ(C2[2], 44);
    ASSERT_EQ(C2[3], 51);
}

// ---- linear ------------------------------------------------------------------

// y [B, OC] = x [B, C] w^T + b by definition.
static void linear_ref(double *y, const double *x, const double *w, const double *b, int64_t B,
                       int64_t C, int64_t OC)
{
    for (int64_t r = 0; r < B; r++) {
        for (int64_t o = 0; o < OC; o++) {
            double acc = b ? b[o] : 0.0;
            for (int64_t i = 0; i < C; i++) {
                acc += x[r * C + i] * w[o * C + i];
            }
            y[r * OC + o] = acc;
        }
    }
}

typedef struct lin_ctx {
    double *x, *w, *b, *r, *y;
    int64_t B, C, OC;
} lin_ctx;

// L = <linear(x, w, b), r>, so dL/dy = r.
static double lin_loss(void *p)
{
    lin_ctx *c = p;
    ASSERT_OK(ddl_linear_forward(DDL_F64, c->y, c->x, c->w, c->b, c->B, c->C, c->OC));
    double s = 0.0;
    for (int64_t i = 0; i < c->B * c->OC; i++) {
        s += c->y[i] * c->r[i];
    }
    return s;
}

static void test_linear(int64_t B, int64_t C, int64_t OC, bool bias, uint64_t seed)
{
    double *x = rand_vec(B * C, seed), *w = rand_vec(OC * C, seed + 1);
    double *b = bias ? rand_vec(OC, seed + 2) : NULL, *r = rand_vec(B * OC, seed + 3);
    double *ref = calloc((size_t)(B * OC + 1), sizeof(double));
    linear_ref(ref, x, w, b, B, C, OC);
    // Forward in both dtypes against the definition.
    for (int d = 0; d < 2; d++) {
        ddl_dtype dt = d ? DDL_F64 : DDL_F32;
        void     *xd = ddl_test_as_dtype(dt, x, B * C), *wd = ddl_test_as_dtype(dt, w, OC * C);
        void     *bd = bias ? ddl_test_as_dtype(dt, b, OC) : NULL;
        void     *yd = calloc((size_t)(B * OC + 1), ddl_dtype_size(dt));
        ASSERT_OK(ddl_linear_forward(dt, yd, xd, wd, bd, B, C, OC));
        ASSERT_LE(ddl_test_rel_err(ref, dt, yd, B * OC), dt == DDL_F32 ? 1e-5 : 1e-13);
        // Backward in f32 against the f64 result below (computed from the same values).
        if (dt == DDL_F32) {
            void *rd  = ddl_test_as_dtype(dt, r, B * OC);
            void *dxd = calloc((size_t)(B * C + 1), 4), *dwd = calloc((size_t)(OC * C + 1), 4);
            void *dbd = calloc((size_t)(OC + 1), 4);
            ASSERT_OK(ddl_linear_backward(dt, dxd, dwd, dbd, rd, xd, wd, B, C, OC));
            double *dx = calloc((size_t)(B * C + 1), 8), *dw = calloc((size_t)(OC * C + 1), 8);
            double *db = calloc((size_t)(OC + 1), 8);
            ASSERT_OK(ddl_linear_backward(DDL_F64, dx, dw, db, r, x, w, B, C, OC));
            ASSERT_LE(ddl_test_rel_err(dx, dt, dxd, B * C), 1e-5);
            ASSERT_LE(ddl_test_rel_err(dw, dt, dwd, OC * C), 1e-5);
            ASSERT_LE(ddl_test_rel_err(db, dt, dbd, OC), 1e-5);
            free(rd), free(dxd), free(dwd), free(dbd), free(dx), free(dw), free(db);
        }
        free(xd), free(wd), free(bd), free(yd);
    }
    // Backward (f64) against central differences of L = <y, r>. L is linear in each of x,
    // w and b, so the central difference is exact for any step; a large one keeps the
    // rounding of L out of the quotient.
    double *dx = calloc((size_t)(B * C + 1), 8), *dw = calloc((size_t)(OC * C + 1), 8);
    double *db = calloc((size_t)(OC + 1), 8), *y = calloc((size_t)(B * OC + 1), 8);
    ASSERT_OK(ddl_linear_backward(DDL_F64, dx, dw, bias ? db : NULL, r, x, w, B, C, OC));
    lin_ctx ctx = {x, w, b, r, y, B, C, OC};
    ASSERT_LE(ddl_test_gradcheck(B * C, x, dx, lin_loss, &ctx, 1e-3, 200), 1e-8);
    ASSERT_LE(ddl_test_gradcheck(OC * C, w, dw, lin_loss, &ctx, 1e-3, 200), 1e-8);
    if (bias) {
        ASSERT_LE(ddl_test_gradcheck(OC, b, db, lin_loss, &ctx, 1e-3, 200), 1e-8);
    }
    // Backward accumulates: a second call doubles every gradient; NULL skips a gradient.
    double *dx2 = malloc((size_t)(B * C + 1) * 8), *dw2 = malloc((size_t)(OC * C + 1) * 8);
    double *db2 = malloc((size_t)(OC + 1) * 8);
    memcpy(dx2, dx, (size_t)(B * C) * 8);
    memcpy(dw2, dw, (size_t)(OC * C) * 8);
    memcpy(db2, db, (size_t)OC * 8);
    ASSERT_OK(ddl_linear_backward(DDL_F64, dx2, NULL, NULL, r, NULL, w, B, C, OC));
    ASSERT_OK(ddl_linear_backward(DDL_F64, NULL, dw2, bias ? db2 : NULL, r, x, NULL, B, C, OC));
    for (int64_t i = 0; i < B * C; i++) {
        ASSERT_NEAR(dx2[i], 2.0 * dx[i], 1e-14 * (1.0 + fabs(dx[i])));
    }
    for (int64_t i = 0; i < OC * C; i++) {
        ASSERT_NEAR(dw2[i], 2.0 * dw[i], 1e-14 * (1.0 + fabs(dw[i])));
    }
    for (int64_t i = 0; i < OC; i++) {
        ASSERT_NEAR(db2[i], 2.0 * db[i], 1e-14 * (1.0 + fabs(db[i])));
        if (bias) {
            double s = 0.0;
            for (int64_t rr = 0; rr < B; rr++) {
                s += r[rr * OC + i];
            }
            ASSERT_NEAR(db[i], s, 1e-13);
        }
    }
    free(x), free(w), free(b), free(r), free(ref), free(dx), free(dw), free(db), free(y);
    free(dx2), free(dw2), free(db2);
}

// ddl_linear_forward_rows: row i of a batch of B has the bits of row i run alone and of
// rows [i, B) run as a batch, at 1 and 2 kernel threads, and equals the f64 reference
// within rounding.
static void test_linear_rows(int64_t B, int64_t C, int64_t OC, bool bias, uint64_t seed)
{
    double *x = rand_vec(B * C, seed), *w = rand_vec(OC * C, seed + 1), *b = rand_vec(OC, seed + 2);
    double *yr = calloc((size_t)(B * OC), sizeof(double));
    linear_ref(yr, x, w, bias ? b : NULL, B, C, OC);
    int prev = ddl_blas_set_threads(0);
    for (int d = 0; d < 2; d++) {
        ddl_dtype dt = d ? DDL_F64 : DDL_F32;
        size_t    es = ddl_dtype_size(dt);
        void     *xd = ddl_test_as_dtype(dt, x, B * C), *wd = ddl_test_as_dtype(dt, w, OC * C);
        void     *bd = bias ? ddl_test_as_dtype(dt, b, OC) : NULL;
        void     *y[2], *yi = calloc((size_t)(B * OC), es);
        for (int t = 0; t < 2; t++) {
            ddl_blas_set_threads(t + 1);
            y[t] = calloc((size_t)(B * OC), es);
            ASSERT_OK(ddl_linear_forward_rows(dt, y[t], xd, wd, bd, B, C, OC));
            for (int64_t i = 0; i < B; i++) {
                for (int k = 0; k < 2; k++) {
                    ASSERT_OK(ddl_linear_forward_rows(dt, yi, (char *)xd + (size_t)(i * C) * es, wd,
                                                      bd, k == 0 ? 1 : B - i, C, OC));
                    ASSERT_TRUE(memcmp(yi, (char *)y[t] + (size_t)(i * OC) * es, (size_t)OC * es) ==
                                0);
                }
            }
        }
        ASSERT_TRUE(memcmp(y[0], y[1], (size_t)(B * OC) * es) == 0);
        for (int64_t i = 0; i < B * OC; i++) {
            double v = d ? ((double *)y[0])[i] : (double)((float *)y[0])[i];
            ASSERT_TRUE(fabs(v - yr[i]) <= tol_for(dt) * (1.0 + fabs(yr[i])) * (double)(C + 1));
        }
        free(xd), free(wd), free(bd), free(y[0]), free(y[1]), free(yi);
    }
    ddl_blas_set_threads(prev);
    free(x), free(w), free(b), free(yr);
}

static void test_linear_edges(void)
{
    // No input features: y is the bias, and the backward still fills db.
    double b[3] = {1, 2, 3}, y[6] = {9, 9, 9, 9, 9, 9}, dy[6] = {1, 1, 1, 1, 1, 1}, db[3] = {0};
    ASSERT_OK(ddl_linear_forward(DDL_F64, y, NULL, NULL, b, 2, 0, 3));
    for (int i = 0; i < 6; i++) {
        ASSERT_EQ(y[i], b[i % 3]);
    }
    ASSERT_OK(ddl_linear_backward(DDL_F64, NULL, NULL, db, dy, NULL, NULL, 2, 0, 3));
    ASSERT_EQ(db[0], 2);
    // An empty batch is a no-op; negative sizes are refused.
    ASSERT_OK(ddl_linear_forward(DDL_F64, NULL, NULL, NULL, NULL, 0, 4, 3));
    ASSERT_STATUS(ddl_linear_forward(DDL_F64, y, y, y, NULL, 2, -1, 3), DDL_EINVAL);
}

int main(void)
{
    test_gemm();
    test_linear(5, 7, 3, true, 100);
    test_linear(1, 1, 1, false, 200);
    test_linear(17, 33, 9, true, 300);
    test_linear(4, 65, 130, false, 400);
    test_linear_edges();
    test_linear_rows(5, 7, 3, true, 500);
    test_linear_rows(1, 1, 1, false, 600);
    test_linear_rows(96, 512, 128, true, 700); // rows split over the pool
    printf("test_gemm: ok\n");
    return 0;
}
