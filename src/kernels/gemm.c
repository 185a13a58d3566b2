// kernels/gemm.c: GEMM over OpenBLAS (row-major cblas_?gemm), its naive reference, and
// the dense (linear) layer kernels built on it.
//
// C = alpha op(A) op(B) + beta C with BLAS semantics. The linear layer is
//   forward:  y [B, OC] = x [B, C] · W^T [C, OC] + b [OC]
//   backward: dx += dy W,  dW += dy^T x,  db += sum_b dy     (cs231n, "backprop for
//             a matrix multiply"; llm.c matmul_backward)
// B = batch, C = in_features, OC = out_features. Not collective; allocates nothing.
#include <cblas.h>
#include <limits.h>
#include <string.h>

#include "base/check.h"
#include "ddl/kernels.h"

// ---- validation ------------------------------------------------------------

static ddl_status gemm_check(const char *who, ddl_dtype dt, bool transA, bool transB,
                             int64_t M, int64_t N, int64_t K, const void *A, int64_t lda,
                             const void *B, int64_t ldb, const void *C, int64_t ldc)
{
    DDL_REQUIRE(dt == DDL_F32 || dt == DDL_F64, DDL_EINVAL, "%s: unknown dtype %d", who,
                (int)dt);
    DDL_REQUIRE(M >= 0 && N >= 0 && K >= 0, DDL_EINVAL,
                "%s: negative size M=%lld N=%lld K=%lld", who, (long long)M, (long long)N,
                (long long)K);
    // cblas takes int (blasint) sizes and leading dimensions.
    DDL_REQUIRE(M <= INT_MAX && N <= INT_MAX && K <= INT_MAX && lda <= INT_MAX &&
                    ldb <= INT_MAX && ldc <= INT_MAX,
                DDL_EINVAL, "%s: size or leading dimension exceeds INT_MAX (M=%lld N=%lld K=%lld)",
                who, (long long)M, (long long)N, (long long)K);
    int64_t acols = transA ? M : K;
    int64_t bcols = transB ? K : N;
    DDL_REQUIRE(lda >= (acols > 1 ? acols : 1), DDL_EINVAL,
                "%s: lda %lld < %lld (columns of A as stored)", who, (long long)lda,
                (long long)(acols > 1 ? acols : 1));
    DDL_REQUIRE(ldb >= (bcols > 1 ? bcols : 1), DDL_EINVAL,
                "%s: ldb %lld < %lld (columns of B as stored)", who, (long long)ldb,
                (long long)(bcols > 1 ? bcols : 1));
    DDL_REQUIRE(ldc >= (N > 1 ? N : 1), DDL_EINVAL, "%s: ldc %lld < N %lld", who,
                (long long)ldc, (long long)N);
    DDL_REQUIRE(M == 0 || N == 0 || C != NULL, DDL_EINVAL, "%s: C is NULL", who);
    DDL_REQUIRE(M == 0 || N == 0 || K == 0 || (A != NULL && B != NULL), DDL_EINVAL,
                "%s: A or B is NULL", who);
    return DDL_OK;
}

// C = beta C on an M x N block (beta == 0 writes zeros without reading C).
static void scale_block(ddl_dtype dt, int64_t M, int64_t N, double beta, void *C, int64_t ldc)
{
    for (int64_t i = 0; i < M; i++) {
        if (dt == DDL_F32) {
            float *c = (float *)C + i * ldc;
            for (int64_t j = 0; j < N; j++) {
                c[j] = beta == 0.0 ? 0.0f : (float)(beta * c[j]);
            }
        } else {
            double *c = (double *)C + i * ldc;
            for (int64_t j = 0; j < N; j++) {
                c[j] = beta == 0.0 ? 0.0 : beta * c[j];
            }
        }
    }
}

// ---- GEMM ------------------------------------------------------------------

ddl_status ddl_gemm(ddl_dtype dt, bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                    double alpha, const void *A, int64_t lda, const void *B, int64_t ldb,
                    double beta, void *C, int64_t ldc)
{
    DDL_CHECK(gemm_check("gemm", dt, transA, transB, M, N, K, A, lda, B, ldb, C, ldc));
    if (M == 0 || N == 0) {
        return DDL_OK;
    }
    if (K == 0 || alpha == 0.0) {
        // Nothing to multiply; some BLAS builds reject K == 0 leading dimensions.
        scale_block(dt, M, N, beta, C, ldc);
        return DDL_OK;
    }
    enum CBLAS_TRANSPOSE ta = transA ? CblasTrans : CblasNoTrans;
    enum CBLAS_TRANSPOSE tb = transB ? CblasTrans : CblasNoTrans;
    if (dt == DDL_F32) {
        cblas_sgemm(CblasRowMajor, ta, tb, (blasint)M, (blasint)N, (blasint)K, (float)alpha,
                    (const float *)A, (blasint)lda, (const float *)B, (blasint)ldb, (float)beta,
                    (float *)C, (blasint)ldc);
    } else {
        cblas_dgemm(CblasRowMajor, ta, tb, (blasint)M, (blasint)N, (blasint)K, alpha,
                    (const double *)A, (blasint)lda, (const double *)B, (blasint)ldb, beta,
                    (double *)C, (blasint)ldc);
    }
    return DDL_OK;
}

// Element (i, j) of op(X), X stored row-major with leading dimension ld.
static inline double op_at(ddl_dtype dt, const void *X, bool trans, int64_t ld, int64_t i,
                           int64_t j)
{
    int64_t off = trans ? j * ld + i : i * ld + j;
    return dt == DDL_F32 ? (double)((const float *)X)[off] : ((const double *)X)[off];
}

ddl_status ddl_gemm_naive(ddl_dtype dt, bool transA, bool transB, int64_t M, int64_t N,
                          int64_t K, double alpha, const void *A, int64_t lda, const void *B,
                          int64_t ldb, double beta, void *C, int64_t ldc)
{
    DDL_CHECK(gemm_check("gemm_naive", dt, transA, transB, M, N, K, A, lda, B, ldb, C, ldc));
    for (int64_t i = 0; i < M; i++) {
        for (int64_t j = 0; j < N; j++) {
            double acc = 0.0;
            for (int64_t p = 0; p < K; p++) {
                acc += op_at(dt, A, transA, lda, i, p) * op_at(dt, B, transB, ldb, p, j);
            }
            if (dt == DDL_F32) {
                float *c = (float *)C + i * ldc + j;
                *c       = (float)(alpha * acc + (beta == 0.0 ? 0.0 : beta * (double)*c));
            } else {
                double *c = (double *)C + i * ldc + j;
                *c        = alpha * acc + (beta == 0.0 ? 0.0 : beta * *c);
            }
        }
    }
    return DDL_OK;
}

// ---- linear ----------------------------------------------------------------

static ddl_status linear_check(const char *who, ddl_dtype dt, int64_t B, int64_t C, int64_t OC)
{
    DDL_REQUIRE(dt == DDL_F32 || dt == DDL_F64, DDL_EINVAL, "%s: unknown dtype %d", who,
                (int)dt);
    DDL_REQUIRE(B >= 0 && C >= 0 && OC >= 0, DDL_EINVAL,
                "%s: negative size batch=%lld in=%lld out=%lld", who, (long long)B,
                (long long)C, (long long)OC);
    return DDL_OK;
}

// A leading dimension BLAS accepts for a row of v elements (BLAS wants >= 1 even when
// the matrix is empty).
static inline int64_t ld1(int64_t v)
{
    return v > 0 ? v : 1;
}

// y [B, OC] = x [B, C] · w^T + b.
ddl_status ddl_linear_forward(ddl_dtype dt, void *y, const void *x, const void *w,
                              const void *b, int64_t B, int64_t C, int64_t OC)
{
    DDL_CHECK(linear_check("linear_forward", dt, B, C, OC));
    if (B == 0 || OC == 0) {
        return DDL_OK;
    }
    DDL_REQUIRE(y != NULL && (C == 0 || (x != NULL && w != NULL)), DDL_EINVAL,
                "linear_forward: y, x or w is NULL");
    double beta = 0.0;
    if (b != NULL) {
        // Broadcast the bias into every row first, then accumulate the product on top.
        size_t row = (size_t)OC * ddl_dtype_size(dt);
        for (int64_t r = 0; r < B; r++) {
            memcpy((char *)y + (size_t)r * row, b, row);
        }
        beta = 1.0;
    }
    return ddl_gemm(dt, false, true, B, OC, C, 1.0, x, ld1(C), w, ld1(C), beta, y, OC);
}

// dx [B, C] += dy [B, OC] · w [OC, C];  dw [OC, C] += dy^T · x [B, C];  db [OC] += colsum(dy).
ddl_status ddl_linear_backward(ddl_dtype dt, void *dx, void *dw, void *db, const void *dy,
                               const void *x, const void *w, int64_t B, int64_t C, int64_t OC)
{
    DDL_CHECK(linear_check("linear_backward", dt, B, C, OC));
    if (B == 0 || OC == 0) {
        return DDL_OK; // every gradient term is an empty sum
    }
    DDL_REQUIRE(dy != NULL, DDL_EINVAL, "linear_backward: dy is NULL");
    if (dx != NULL) {
        DDL_CHECK(
            ddl_gemm(dt, false, false, B, C, OC, 1.0, dy, ld1(OC), w, ld1(C), 1.0, dx, ld1(C)));
    }
    if (dw != NULL) {
        DDL_CHECK(
            ddl_gemm(dt, true, false, OC, C, B, 1.0, dy, ld1(OC), x, ld1(C), 1.0, dw, ld1(C)));
    }
    if (db != NULL) {
        // Row by row so dy is read contiguously; the sum accumulates in db's own type.
        for (int64_t r = 0; r < B; r++) {
            if (dt == DDL_F32) {
                const float *g = (const float *)dy + r * OC;
                float       *o = db;
                for (int64_t j = 0; j < OC; j++) {
                    o[j] += g[j];
                }
            } else {
                const double *g = (const double *)dy + r * OC;
                double       *o = db;
                for (int64_t j = 0; j < OC; j++) {
                    o[j] += g[j];
                }
            }
        }
    }
    return DDL_OK;
}

int ddl_blas_set_threads(int n)
{
    int prev = openblas_get_num_threads();
    if (n >= 1) {
        openblas_set_num_threads(n);
    }
    return prev;
}
