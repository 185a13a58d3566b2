// kernels/gemm.c: GEMM over OpenBLAS (row-major cblas_?gemm), its naive reference, and
// the dense (linear) layer kernels built on it.
//
// C = alpha op(A) op(B) + beta C with BLAS semantics. The linear layer is
//   forward:  y [B, OC] = x [B, C] · W^T [C, OC] + b [OC]
//   backward: dx += dy W,  dW += dy^T x,  db += sum_b dy     (cs231n, "backprop for
//             a matrix multiply"; llm.c matmul_backward)
// B = batch, C = in_features, OC = out_features. Not collective; allocates nothing.
//
// Threads: the engine's kernel pool (kernels/threadpool.h) is the one owner of threads.
// OpenBLAS runs single-threaded for the whole process: its own thread server spins in
// sched_yield for about 2^28 cycles after every threaded call, and on a node where every
// core has a rank or a pool worker that spin takes a core from real work (issue 19: 35%
// of a ResNet step). The thread count callers set (ddl_blas_set_threads, OPENBLAS_NUM_THREADS)
// is the pool's width: large GEMMs are split here into blocks of rows or columns of C run
// as pool parts, and the convolutions split their block loops the same way.
#include <cblas.h>
#include <limits.h>
#include <pthread.h>
#include <string.h>

#include "base/check.h"
#include "ddl/kernels.h"
#include "kernels/threadpool.h"

// ---- validation ------------------------------------------------------------

static ddl_status gemm_check(const char *who, ddl_dtype dt, bool transA, bool transB, int64_t M,
                             int64_t N, int64_t K, const void *A, int64_t lda, const void *B,
                             int64_t ldb, const void *C, int64_t ldc)
{
    DDL_REQUIRE(dt == DDL_F32 || dt == DDL_F64, DDL_EINVAL, "%s: unknown dtype %d", who, (int)dt);
    DDL_REQUIRE(M >= 0 && N >= 0 && K >= 0, DDL_EINVAL, "%s: negative size M=%lld N=%lld K=%lld",
                who, (long long)M, (long long)N, (long long)K);
    // cblas takes int (blasint) sizes and leading dimensions.
    DDL_REQUIRE(M <= INT_MAX && N <= INT_MAX && K <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX &&
                    ldc <= INT_MAX,
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
    DDL_REQUIRE(ldc >= (N > 1 ? N : 1), DDL_EINVAL, "%s: ldc %lld < N %lld", who, (long long)ldc,
                (long long)N);
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

// ---- threads ---------------------------------------------------------------

// Kernel threads per call, and so parts per split GEMM (0 until the first use).
static int            width;
static pthread_once_t width_once = PTHREAD_ONCE_INIT;

// The first use takes over OpenBLAS's count (OPENBLAS_NUM_THREADS, or the cores it saw at
// load) as the pool's width and sets OpenBLAS to one thread. Its server threads, created
// at load, then run out their spin once and sleep for good: nothing queues work to them.
static void width_init(void)
{
    int n = openblas_get_num_threads();
    __atomic_store_n(&width, n >= 1 ? n : 1, __ATOMIC_RELAXED);
    openblas_set_num_threads(1);
}

int ddl_blas_set_threads(int n)
{
    pthread_once(&width_once, width_init);
    int prev = __atomic_load_n(&width, __ATOMIC_RELAXED);
    if (n >= 1) {
        __atomic_store_n(&width, n, __ATOMIC_RELAXED);
    }
    return prev;
}

// ---- GEMM ------------------------------------------------------------------

// Fewest multiply-adds per part of a split GEMM: below this, waking a worker (a few
// microseconds) costs more than the part gains.
#define GEMM_PART_MACS ((int64_t)1 << 21)
// Part boundaries fall on multiples of this many rows or columns of C: whole register
// tiles of every OpenBLAS x86-64 sgemm/dgemm kernel (at most 16 wide).
#define GEMM_PART_ALIGN 16

// One GEMM and how it is split: part p owns rows (or columns) [p chunk, (p + 1) chunk)
// of C, and computes each of its elements whole (all of K), so no partial sums are added
// across parts. The split depends only on the shape and the part count, never on which
// thread runs a part, so the bits repeat for a given width. Across widths they differ by
// rounding: OpenBLAS 0.3.21's Haswell/Zen sgemm gives about 6% of the elements of a
// 256^3 product other bits when the same rows are computed in two blocks (as its own
// threads' split did before).
typedef struct gemm_job {
    // The arguments of ddl_gemm, in its order.
    ddl_dtype   dt;
    bool        transA, transB;
    int64_t     M, N, K;
    double      alpha;
    const void *A;
    int64_t     lda;
    const void *B;
    int64_t     ldb;
    double      beta;
    void       *C;
    int64_t     ldc;
    // The split (gemm_split): along rows of C or columns, chunk of them per part.
    bool    rows;
    int64_t chunk;
} gemm_job;

// C[i0 : i0 + m, j0 : j0 + n] of the job, by OpenBLAS on the calling thread.
static void gemm_block(const gemm_job *g, int64_t i0, int64_t m, int64_t j0, int64_t n)
{
    size_t               es = ddl_dtype_size(g->dt);
    int64_t              ao = g->transA ? i0 : i0 * g->lda; // rows i0.. of op(A)
    int64_t              bo = g->transB ? j0 * g->ldb : j0; // columns j0.. of op(B)
    const char          *A  = (const char *)g->A + (size_t)ao * es;
    const char          *B  = (const char *)g->B + (size_t)bo * es;
    char                *C  = (char *)g->C + (size_t)(i0 * g->ldc + j0) * es;
    enum CBLAS_TRANSPOSE ta = g->transA ? CblasTrans : CblasNoTrans;
    enum CBLAS_TRANSPOSE tb = g->transB ? CblasTrans : CblasNoTrans;
    if (g->dt == DDL_F32) {
        cblas_sgemm(CblasRowMajor, ta, tb, (blasint)m, (blasint)n, (blasint)g->K, (float)g->alpha,
                    (const float *)A, (blasint)g->lda, (const float *)B, (blasint)g->ldb,
                    (float)g->beta, (float *)C, (blasint)g->ldc);
    } else {
        cblas_dgemm(CblasRowMajor, ta, tb, (blasint)m, (blasint)n, (blasint)g->K, g->alpha,
                    (const double *)A, (blasint)g->lda, (const double *)B, (blasint)g->ldb, g->beta,
                    (double *)C, (blasint)g->ldc);
    }
}

static ddl_status gemm_part(void *arg, int p, int nparts)
{
    (void)nparts;
    const gemm_job *g   = arg;
    int64_t         len = g->rows ? g->M : g->N;
    int64_t         lo  = (int64_t)p * g->chunk;
    int64_t         n   = len - lo < g->chunk ? len - lo : g->chunk;
    if (n <= 0) {
        return DDL_OK;
    }
    if (g->rows) {
        gemm_block(g, lo, n, 0, g->N);
    } else {
        gemm_block(g, 0, g->M, lo, n);
    }
    return DDL_OK;
}

// Parts for g with T threads: along the longer of M and N, no more than T, each with at
// least GEMM_PART_MACS of work and GEMM_PART_ALIGN rows or columns. Sets g->rows and
// g->chunk; 1 means run whole.
static int gemm_split(gemm_job *g, int T)
{
    g->rows     = g->M >= g->N;
    int64_t len = g->rows ? g->M : g->N;
    // In double: M N K may exceed int64 (each factor only fits an int).
    double  by_work = (double)g->M * (double)g->N * (double)g->K / (double)GEMM_PART_MACS;
    int64_t parts   = T < DDL_POOL_MAX_PARTS ? T : DDL_POOL_MAX_PARTS;
    if (parts > len / GEMM_PART_ALIGN) {
        parts = len / GEMM_PART_ALIGN;
    }
    if ((double)parts > by_work) {
        parts = (int64_t)by_work;
    }
    if (parts <= 1) {
        g->chunk = len;
        return 1;
    }
    int64_t chunk = (len + parts - 1) / parts;
    g->chunk      = (chunk + GEMM_PART_ALIGN - 1) / GEMM_PART_ALIGN * GEMM_PART_ALIGN;
    return (int)((len + g->chunk - 1) / g->chunk);
}

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
    gemm_job g     = {dt, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, false, 0};
    int      parts = gemm_split(&g, ddl_blas_set_threads(0));
    if (parts <= 1) {
        gemm_block(&g, 0, M, 0, N);
        return DDL_OK;
    }
    return ddl_pool_run("gemm", parts, gemm_part, &g);
}

// Element (i, j) of op(X), X stored row-major with leading dimension ld.
static inline double op_at(ddl_dtype dt, const void *X, bool trans, int64_t ld, int64_t i,
                           int64_t j)
{
    int64_t off = trans ? j * ld + i : i * ld + j;
    return dt == DDL_F32 ? (double)((const float *)X)[off] : ((const double *)X)[off];
}

ddl_status ddl_gemm_naive(ddl_dtype dt, bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                          double alpha, const void *A, int64_t lda, const void *B, int64_t ldb,
                          double beta, void *C, int64_t ldc)
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
    DDL_REQUIRE(dt == DDL_F32 || dt == DDL_F64, DDL_EINVAL, "%s: unknown dtype %d", who, (int)dt);
    DDL_REQUIRE(B >= 0 && C >= 0 && OC >= 0, DDL_EINVAL,
                "%s: negative size batch=%lld in=%lld out=%lld", who, (long long)B, (long long)C,
                (long long)OC);
    return DDL_OK;
}

// A leading dimension BLAS accepts for a row of v elements (BLAS wants >= 1 even when
// the matrix is empty).
static inline int64_t ld1(int64_t v)
{
    return v > 0 ? v : 1;
}

// y [B, OC] = x [B, C] · w^T + b.
ddl_status ddl_linear_forward(ddl_dtype dt, void *y, const void *x, const void *w, const void *b,
                              int64_t B, int64_t C, int64_t OC)
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

// ---- batch-invariant linear (inference) -------------------------------------

// Rows [lo, hi) of ddl_linear_forward_rows: one GEMV per row, the bias first.
typedef struct rows_job {
    ddl_dtype   dt;
    void       *y;
    const void *x, *w, *b;
    int64_t     B, C, OC, chunk;
} rows_job;

static ddl_status rows_part(void *arg, int p, int nparts)
{
    (void)nparts;
    const rows_job *r  = arg;
    size_t          es = ddl_dtype_size(r->dt);
    int64_t         lo = (int64_t)p * r->chunk, hi = lo + r->chunk < r->B ? lo + r->chunk : r->B;
    for (int64_t i = lo; i < hi; i++) {
        char       *yi   = (char *)r->y + (size_t)(i * r->OC) * es;
        const char *xi   = (const char *)r->x + (size_t)(i * r->C) * es;
        double      beta = 0.0;
        if (r->b != NULL) {
            memcpy(yi, r->b, (size_t)r->OC * es);
            beta = 1.0;
        }
        if (r->C == 0) {
            if (r->b == NULL) {
                memset(yi, 0, (size_t)r->OC * es);
            }
        } else if (r->dt == DDL_F32) {
            cblas_sgemv(CblasRowMajor, CblasNoTrans, (blasint)r->OC, (blasint)r->C, 1.0f, r->w,
                        (blasint)r->C, (const float *)xi, 1, (float)beta, (float *)yi, 1);
        } else {
            cblas_dgemv(CblasRowMajor, CblasNoTrans, (blasint)r->OC, (blasint)r->C, 1.0, r->w,
                        (blasint)r->C, (const double *)xi, 1, beta, (double *)yi, 1);
        }
    }
    return DDL_OK;
}

// Every row is the same call on its own x row, whichever part and thread runs it, so a
// row's bits depend on that row alone (OpenBLAS runs single-threaded, see above).
ddl_status ddl_linear_forward_rows(ddl_dtype dt, void *y, const void *x, const void *w,
                                   const void *b, int64_t B, int64_t C, int64_t OC)
{
    DDL_CHECK(linear_check("linear_forward_rows", dt, B, C, OC));
    if (B == 0 || OC == 0) {
        return DDL_OK;
    }
    DDL_REQUIRE(y != NULL && (C == 0 || (x != NULL && w != NULL)), DDL_EINVAL,
                "linear_forward_rows: y, x or w is NULL");
    DDL_REQUIRE(C <= INT_MAX && OC <= INT_MAX, DDL_EINVAL,
                "linear_forward_rows: in %lld or out %lld features exceed INT_MAX", (long long)C,
                (long long)OC);
    rows_job r     = {dt, y, x, w, b, B, C, OC, B};
    int64_t  parts = ddl_blas_set_threads(0);
    double   work  = (double)B * (double)C * (double)OC / (double)GEMM_PART_MACS;
    parts          = parts < DDL_POOL_MAX_PARTS ? parts : DDL_POOL_MAX_PARTS;
    parts          = parts < B ? parts : B;
    parts          = (double)parts < work ? parts : (int64_t)work;
    if (parts <= 1) {
        return rows_part(&r, 0, 1);
    }
    r.chunk = (B + parts - 1) / parts;
    return ddl_pool_run("linear_forward_rows", (int)((B + r.chunk - 1) / r.chunk), rows_part, &r);
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
