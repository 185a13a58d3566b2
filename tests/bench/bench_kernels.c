// tests/bench/bench_kernels.c: convolution forward + backward throughput against raw
// OpenBLAS sgemm of the same work, measured in the same run on one thread.
//
// The figure of merit is conv GFLOP/s / sgemm GFLOP/s, where the convolution's flops are
// those of its three GEMMs (forward, dW, dcol: 3 x 2 Co Kc ov per sample). Two sgemm
// references are timed: (1) the same three GEMM shapes per sample on preallocated
// matrices (no im2col), and (2) one square sgemm with the same total flops.
// Not registered with ctest; build by hand, for example:
//   cc -O2 -Isrc/include tests/bench/bench_kernels.c build/src/kernels/libddl_kernels.a
//      build/src/libddl_tensor.a build/src/libddl_base.a $(pkg-config --cflags --libs openblas)
//      -lm -o bench_kernels          (one command line)
// Usage: bench_kernels [N C H W K [reps]]   (default 32 64 56 56 3, pad K/2)
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ddl/base.h"
#include "ddl/kernels.h"

// CPU time of this thread: on a shared machine a descheduled interval is charged to
// neither side of the ratio. Everything runs on this thread (OpenBLAS is set to one
// thread, which runs in the caller), and idle OpenBLAS workers are not counted.
static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static float *filled(size_t n, unsigned seed)
{
    float *p = ddl_malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        p[i] = (float)(ddl_rng_uniform(seed, 9, i) - 0.5);
    }
    return p;
}

int main(int argc, char **argv)
{
    int64_t N = 32, C = 64, H = 56, W = 56, K = 3;
    int     reps = 5;
    if (argc >= 6) {
        N = atoll(argv[1]), C = atoll(argv[2]), H = atoll(argv[3]), W = atoll(argv[4]);
        K = atoll(argv[5]);
    }
    if (argc >= 7) {
        reps = atoi(argv[6]);
    }
    openblas_set_num_threads(1);

    ddl_conv_geom g;
    int64_t       pad[2] = {K / 2, K / 2};
    if (ddl_conv_geom_init(&g, 2, N, C, C, (int64_t[]){H, W}, (int64_t[]){K, K}, NULL, pad,
                           NULL) != DDL_OK) {
        fprintf(stderr, "bad geometry: %s\n", ddl_last_error());
        return 1;
    }
    const int64_t ov = g.out[0] * g.out[1], iv = H * W, Kc = C * K * K;
    const size_t  nx = (size_t)(N * C * iv), ny = (size_t)(N * C * ov), nw = (size_t)(C * Kc);
    size_t        wsb = ddl_conv_workspace_bytes(DDL_F32, &g);
    float *x = filled(nx, 1), *w = filled(nw, 2), *b = filled((size_t)C, 3), *dy = filled(ny, 4);
    float *y = ddl_calloc(ny, sizeof(float)), *dx = ddl_calloc(nx, sizeof(float));
    float *dw = ddl_calloc(nw, sizeof(float)), *db = ddl_calloc((size_t)C, sizeof(float));
    void  *ws = ddl_malloc(wsb > 0 ? wsb : 1);
    memset(ws, 0, wsb);
    const double flops = 3.0 * 2.0 * (double)C * (double)Kc * (double)ov * (double)N;

    // Reference 1 operands: the three GEMM shapes of one sample, on whole matrices.
    float *col = filled((size_t)(Kc * ov), 5), *yy = ddl_calloc((size_t)(C * ov), 4);
    // Reference 2 operands: one square sgemm of the same total flops.
    int    n2 = (int)cbrt(flops / 2.0);
    float *A = filled((size_t)n2 * n2, 6), *B = filled((size_t)n2 * n2, 7);
    float *Cm = ddl_calloc((size_t)n2 * n2, 4);

    // Warm up (first touch of every buffer). Then the three measurements are interleaved
    // and each keeps its best time, so a busy machine perturbs them alike.
    ddl_conv_forward(DDL_F32, &g, y, x, w, b, ws, wsb);
    ddl_conv_backward(DDL_F32, &g, dx, dw, db, dy, x, w, ws, wsb);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n2, n2, n2, 1.f, A, n2, B, n2, 0.f,
                Cm, n2);
    double t_fwd = 1e30, t_bwd = 1e30, t_conv = 1e30, t_ref1 = 1e30, t_ref2 = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        ddl_conv_forward(DDL_F32, &g, y, x, w, b, ws, wsb);
        double t1 = now();
        ddl_conv_backward(DDL_F32, &g, dx, dw, db, dy, x, w, ws, wsb);
        double t2 = now();
        t_fwd     = fmin(t_fwd, t1 - t0);
        t_bwd     = fmin(t_bwd, t2 - t1);
        t_conv    = fmin(t_conv, t2 - t0);

        t0 = now();
        for (int64_t n = 0; n < N; n++) {
            const float *dyn = dy + (size_t)(n * C * ov);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)C, (int)ov, (int)Kc, 1.f,
                        w, (int)Kc, col, (int)ov, 0.f, yy, (int)ov);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)C, (int)Kc, (int)ov, 1.f,
                        dyn, (int)ov, col, (int)ov, 1.f, dw, (int)Kc);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)Kc, (int)ov, (int)C, 1.f, w,
                        (int)Kc, dyn, (int)ov, 0.f, col, (int)ov);
        }
        t_ref1 = fmin(t_ref1, now() - t0);

        t0 = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n2, n2, n2, 1.f, A, n2, B, n2, 0.f,
                    Cm, n2);
        t_ref2 = fmin(t_ref2, now() - t0);
    }
    double conv_gf = flops / t_conv * 1e-9;
    double ref1_gf = flops / t_ref1 * 1e-9;
    double ref2_gf = 2.0 * n2 * (double)n2 * n2 / t_ref2 * 1e-9;

    printf("conv2d f32 N=%lld C=%lld->%lld %lldx%lld k=%lld pad=%lld, 1 thread, best of %d\n",
           (long long)N, (long long)C, (long long)C, (long long)H, (long long)W, (long long)K,
           (long long)pad[0], reps);
    printf("  workspace              %8.2f MiB\n", (double)wsb / (1 << 20));
    printf("  conv forward           %8.1f ms  %6.1f GFLOP/s\n", t_fwd * 1e3,
           flops / 3.0 / t_fwd * 1e-9);
    printf("  conv backward (dx,dw,db)%7.1f ms  %6.1f GFLOP/s\n", t_bwd * 1e3,
           flops * 2.0 / 3.0 / t_bwd * 1e-9);
    printf("  conv forward+backward  %8.1f ms  %6.1f GFLOP/s\n", t_conv * 1e3, conv_gf);
    printf("  sgemm, same 3 shapes   %8.1f ms  %6.1f GFLOP/s   conv/ref = %.2f\n", t_ref1 * 1e3,
           ref1_gf, conv_gf / ref1_gf);
    printf("  sgemm, square n=%-5d  %8.1f ms  %6.1f GFLOP/s   conv/ref = %.2f\n", n2,
           t_ref2 * 1e3, ref2_gf, conv_gf / ref2_gf);
    ddl_free(x), ddl_free(w), ddl_free(b), ddl_free(dy), ddl_free(y), ddl_free(dx);
    ddl_free(dw), ddl_free(db), ddl_free(ws), ddl_free(col), ddl_free(yy), ddl_free(A);
    ddl_free(B), ddl_free(Cm);
    return 0;
}
