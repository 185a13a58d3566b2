// bench-layers: forward + backward of a large distributed Linear and 2-D convolution,
// in GFLOP/s, against raw cblas_sgemm of the same work measured in the same run on the
// same ranks.
//
//   mpirun -np 1|2|4 build/bin/bench-layers [--threads N] [--reps 5] [--only linear|conv]
//                                           [--linear B,IN,OUT] [--conv N,C,H,W]
//
// Layouts (every rank does an equal share of the work):
//   linear  x [B, IN] over P_x = [1, P_fi], W [OUT, IN] over P_w = [P_fo, P_fi],
//           y [B, OUT] over P_y = [1, P_fo]; every factorization P_fo x P_fi of np is
//           measured. P_w holds ranks 0..np-1; P_x the first P_fi ranks; P_y the ranks after
//           P_x when both fit side by side (np 4, [2, 2]: P_x {0, 1}, P_y {2, 3}, as in
//           LeNet), otherwise the first P_fo ranks.
//   conv    feature-partitioned 3x3, padding 1, bias, C -> C channels; P_x = [1, 1, a, b]
//           with a * b = np, a >= b, b as large as possible (np 2: [1, 1, 2, 1]; np 4:
//           [1, 1, 2, 2]).
//
// Work: linear fwd+bwd = 3 x 2 B IN OUT flops (y = x W^T, dx = dy W, dW = dy^T x); conv
// fwd+bwd = 3 x 2 N C_out H_out W_out C_in k_h k_w (forward, dW, dx); bias terms are left
// out. Per-rank GFLOP/s = total / np / time. Every figure is the median over reps (after
// a warm-up) of the slowest rank's wall time; the references run on every rank at once,
// with the same BLAS threads, so contention on a shared node is alike on both sides:
//   raw sgemm     the rank's share of the work as bare cblas_sgemm calls on preallocated
//                 matrices: linear, the three GEMMs of its [B, fi] x [fo, fi] block;
//                 conv, a square n x n x n sgemm three times with 2 n^3 = share / 3.
//   im2col GEMMs  (conv) the three GEMM shapes of the im2col formulation, per sample, on
//                 whole [C_in k_h k_w, H_out W_out] column matrices (no im2col itself).
//   kernels       the sequential ddl_linear_* / ddl_conv_* kernels on the rank's local
//                 block, no MPI: layer vs kernels is the distributed overhead (messages,
//                 copies, waits), kernels vs raw the kernel's own (im2col, bias, zeroing).
// The detail line splits the layer's time into forward and backward, each its own median
// of the slowest rank, so the two need not add up to the total (ranks can be slowest in
// different phases). The ratio on the main line is layer / raw sgemm (target >= 0.70 at
// np 1). The distributed overhead (np 2 vs np 1 per-rank, target <= 15%) is read across
// runs: compare per-rank GFLOP/s (or the ratios, which remove a change of BLAS thread
// count) between an np 1 and an np 2 run with the same threads per rank
// (OPENBLAS_NUM_THREADS=1).
//
// Threads: ddl_runtime_divide_cores gives each rank of a node an equal share of its
// cores (OPENBLAS_NUM_THREADS, when set, wins); --threads N forces N per rank. The header
// also prints how many CPUs each rank may run on: mpirun binds a rank to one core by
// default when np <= 2, so at np 1 two BLAS threads then share one core (a warning says
// so; add --bind-to none to let them spread).
#define _GNU_SOURCE
#include <cblas.h>
#include <math.h>
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddl/base.h"
#include "ddl/blas.h"
#include "ddl/kernels.h"
#include "ddl/layers.h"
#include "ddl/model.h"

static int rank, nprocs;

#define CHECK(x)                                                                           \
    do {                                                                                   \
        ddl_status s_ = (x);                                                               \
        if (s_ != DDL_OK) {                                                                \
            fprintf(stderr, "rank %d: %s failed: %s: %s\n", rank, #x, ddl_status_name(s_), \
                    ddl_last_error());                                                     \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                  \
        }                                                                                  \
    } while (0)

// ---- timing -------------------------------------------------------------------------

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *t, int n)
{
    qsort(t, (size_t)n, sizeof(double), cmp_double);
    return t[n / 2];
}

static int reps = 5, warmup = 1;

// Median over reps of the slowest rank's time of fn(ctx), after the warm-up calls.
typedef void (*bench_fn)(void *ctx);
static double bench(bench_fn fn, void *ctx)
{
    double *t = malloc(sizeof(double) * (size_t)reps);
    for (int w = 0; w < warmup; w++) {
        fn(ctx);
    }
    for (int r = 0; r < reps; r++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        fn(ctx);
        double dt = MPI_Wtime() - t0, mx;
        MPI_Allreduce(&dt, &mx, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        t[r] = mx;
    }
    double m = median(t, reps);
    free(t);
    return m;
}

// A layer's forward then backward (fixed dy): medians of the slowest rank's forward,
// backward and total times (each its own median).
typedef struct layer_times {
    double fwd, bwd, tot;
} layer_times;

static layer_times bench_layer(ddl_layer_t *L, const ddl_tensor_t *x, ddl_tensor_t *y,
                               const ddl_tensor_t *dy, ddl_tensor_t *dx)
{
    double *t = malloc(sizeof(double) * 3 * (size_t)reps);
    double *tf = t, *tb = t + reps, *tt = t + 2 * reps;
    for (int w = 0; w < warmup; w++) {
        CHECK(ddl_layer_forward(L, x, y));
        CHECK(ddl_layer_backward(L, dy, dx));
    }
    for (int r = 0; r < reps; r++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        CHECK(ddl_layer_forward(L, x, y));
        double t1 = MPI_Wtime();
        CHECK(ddl_layer_backward(L, dy, dx));
        double t2 = MPI_Wtime();
        double d[3] = {t1 - t0, t2 - t1, t2 - t0}, mx[3];
        MPI_Allreduce(d, mx, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        tf[r] = mx[0], tb[r] = mx[1], tt[r] = mx[2];
    }
    layer_times out = {median(tf, reps), median(tb, reps), median(tt, reps)};
    free(t);
    return out;
}

// Sum over ranks (flop counts of every rank's share).
static double sum_all(double v)
{
    double s;
    MPI_Allreduce(&v, &s, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return s;
}

// ---- buffers ------------------------------------------------------------------------

static float *filled(int64_t n, uint64_t stream)
{
    float *p = ddl_malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (p == NULL) {
        fprintf(stderr, "rank %d: out of memory (%lld floats)\n", rank, (long long)n);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (int64_t i = 0; i < n; i++) {
        p[i] = (float)(ddl_rng_uniform(7, stream + 100 * (uint64_t)rank, (uint64_t)i) - 0.5);
    }
    return p;
}

static ddl_tensor_t *tensor(const ddl_shape *s)
{
    ddl_tensor_t *t;
    CHECK(ddl_tensor_create(DDL_F32, s, &t));
    return t;
}

// A partition-invariant random tensor: this rank's piece of a global uniform tensor.
static ddl_tensor_t *random_piece(const ddl_partition_t *P, const ddl_shape *global,
                                  uint64_t stream)
{
    ddl_shape     s = ddl_partition_local_shape(P, global);
    ddl_box       b = ddl_partition_local_box(P, global);
    ddl_tensor_t *t = tensor(&s);
    ddl_fill_global_uniform(t, &b, global, 3, stream);
    return t;
}

static ddl_partition_t *part(int first, int n, int ndim, const int *shape)
{
    int ranks[64];
    for (int i = 0; i < n; i++) {
        ranks[i] = first + i;
    }
    ddl_partition_t *P;
    CHECK(ddl_partition_create(MPI_COMM_WORLD, n, ranks, ndim, shape, &P));
    return P;
}

static char *pshape_str(const int *s, int ndim, char *buf, size_t len)
{
    size_t o = 0;
    o += (size_t)snprintf(buf + o, len - o, "[");
    for (int i = 0; i < ndim && o < len; i++) {
        o += (size_t)snprintf(buf + o, len - o, "%s%d", i ? "," : "", s[i]);
    }
    if (o < len) {
        snprintf(buf + o, len - o, "]");
    }
    return buf;
}

// ---- linear -------------------------------------------------------------------------

// One rank's block: x [B, fi], W [fo, fi], y and dy [B, fo], dx [B, fi], dW [fo, fi].
typedef struct linear_ref {
    int    B, fi, fo;
    float *x, *w, *b, *y, *dy, *dx, *dw, *db;
} linear_ref;

// The three GEMMs of fwd+bwd as bare sgemm: y = x W^T, dx = dy W, dW += dy^T x.
static void raw_linear(void *p)
{
    linear_ref *r = p;
    if (r->B == 0 || r->fi == 0 || r->fo == 0) {
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r->B, r->fo, r->fi, 1.f, r->x, r->fi,
                r->w, r->fi, 0.f, r->y, r->fo);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r->B, r->fi, r->fo, 1.f, r->dy, r->fo,
                r->w, r->fi, 0.f, r->dx, r->fi);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r->fo, r->fi, r->B, 1.f, r->dy, r->fo,
                r->x, r->fi, 1.f, r->dw, r->fi);
}

// The engine's sequential kernels on the same block, as the layer calls them (bias,
// dx zeroed then accumulated).
static void kernels_linear(void *p)
{
    linear_ref *r = p;
    CHECK(ddl_linear_forward(DDL_F32, r->y, r->x, r->w, r->b, r->B, r->fi, r->fo));
    memset(r->dx, 0, sizeof(float) * (size_t)r->B * (size_t)r->fi);
    CHECK(ddl_linear_backward(DDL_F32, r->dx, r->dw, r->db, r->dy, r->x, r->w, r->B, r->fi,
                              r->fo));
}

static void bench_linear(int64_t B, int64_t IN, int64_t OUT, int P_fo, int P_fi)
{
    int              sx[2] = {1, P_fi}, sy[2] = {1, P_fo}, sw[2] = {P_fo, P_fi};
    int              y_first = P_fi + P_fo <= nprocs ? P_fi : 0;
    ddl_partition_t *P_x = part(0, P_fi, 2, sx);
    ddl_partition_t *P_y = part(y_first, P_fo, 2, sy);
    ddl_partition_t *P_w = part(0, P_fo * P_fi, 2, sw);
    ddl_layer_t     *L;
    CHECK(ddl_linear_create(P_x, P_y, P_w, DDL_F32, B, IN, OUT, true, &L));
    ddl_layer_init_params(L, 1, 0);
    ddl_shape     xg = *ddl_layer_x_global(L), yg = *ddl_layer_y_global(L);
    ddl_tensor_t *x = random_piece(P_x, &xg, 1), *dy = random_piece(P_y, &yg, 2);
    ddl_tensor_t *y = tensor(ddl_layer_y_shape(L)), *dx = tensor(ddl_layer_x_shape(L));
    layer_times   lt = bench_layer(L, x, y, dy, dx);

    // This rank's block of W (empty outside P_w) sizes the references.
    const ddl_box *wb = &ddl_layer_param(L, 0)->box;
    int64_t        fo = wb->stop[0] - wb->start[0], fi = wb->stop[1] - wb->start[1];
    linear_ref     r  = {.B = (int)B, .fi = (int)fi, .fo = (int)fo};
    r.x = filled(B * fi, 1), r.w = filled(fo * fi, 2), r.b = filled(fo, 3);
    r.dy = filled(B * fo, 4), r.y = filled(B * fo, 5), r.dx = filled(B * fi, 6);
    r.dw = filled(fo * fi, 7), r.db = filled(fo, 8);
    double t_raw = bench(raw_linear, &r);
    double t_ker = bench(kernels_linear, &r);

    double flops     = 3.0 * 2.0 * (double)B * (double)IN * (double)OUT;
    double raw_flops = sum_all(3.0 * 2.0 * (double)B * (double)fi * (double)fo);
    if (rank == 0) {
        char   ws[32];
        double gf = flops / lt.tot * 1e-9, per = gf / nprocs;
        double raw_per = raw_flops / t_raw * 1e-9 / nprocs;
        double ker_per = raw_flops / t_ker * 1e-9 / nprocs;
        printf("linear np=%d P_w=%-6s fwd+bwd %7.1f ms  total %6.1f GFLOP/s  per-rank %6.1f "
               "GFLOP/s  raw sgemm per-rank %6.1f GFLOP/s  ratio %.2f\n",
               nprocs, pshape_str(sw, 2, ws, sizeof ws), lt.tot * 1e3, gf, per, raw_per,
               per / raw_per);
        printf("    fwd %7.1f ms  bwd %7.1f ms | raw sgemm %7.1f ms | kernels only %7.1f ms "
               "(per-rank %6.1f GFLOP/s, layer/kernels %.2f, kernels/raw %.2f)\n",
               lt.fwd * 1e3, lt.bwd * 1e3, t_raw * 1e3, t_ker * 1e3, ker_per, per / ker_per,
               ker_per / raw_per);
        fflush(stdout);
    }
    ddl_free(r.x), ddl_free(r.w), ddl_free(r.b), ddl_free(r.dy), ddl_free(r.y);
    ddl_free(r.dx), ddl_free(r.dw), ddl_free(r.db);
    ddl_tensor_destroy(&x), ddl_tensor_destroy(&y), ddl_tensor_destroy(&dy);
    ddl_tensor_destroy(&dx);
    ddl_layer_destroy(&L);
    ddl_partition_destroy(&P_x), ddl_partition_destroy(&P_y), ddl_partition_destroy(&P_w);
}

// ---- convolution --------------------------------------------------------------------

typedef struct conv_ref {
    // square: n x n x n sgemm, three times
    int    n;
    float *A, *B, *C;
    // im2col-shaped: per sample w [Co, Kc] . col [Kc, ov] (forward), dy [Co, ov] . col^T
    // (dW), w^T . dy (dcol)
    int    N, Co, Kc, ov;
    float *w, *col, *y, *dy, *dw, *dcol;
    // kernels: the engine's conv kernels on this rank's block
    ddl_conv_geom g;
    float        *kx, *kdx, *ky, *kdy, *kw, *kdw, *kb, *kdb;
    void         *ws;
    size_t        ws_bytes;
} conv_ref;

static void raw_square(void *p)
{
    conv_ref *r = p;
    for (int i = 0; i < 3 && r->n > 0; i++) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r->n, r->n, r->n, 1.f, r->A, r->n,
                    r->B, r->n, 0.f, r->C, r->n);
    }
}

static void raw_im2col(void *p)
{
    conv_ref *r = p;
    if (r->ov == 0 || r->Co == 0) {
        return;
    }
    for (int s = 0; s < r->N; s++) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r->Co, r->ov, r->Kc, 1.f, r->w,
                    r->Kc, r->col, r->ov, 0.f, r->y, r->ov);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r->Co, r->Kc, r->ov, 1.f, r->dy,
                    r->ov, r->col, r->ov, 1.f, r->dw, r->Kc);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r->Kc, r->ov, r->Co, 1.f, r->w,
                    r->Kc, r->dy, r->ov, 0.f, r->dcol, r->ov);
    }
}

static void kernels_conv(void *p)
{
    conv_ref      *r  = p;
    ddl_conv_geom *g  = &r->g;
    int64_t        nx = g->N * g->C_in * g->in[0] * g->in[1];
    CHECK(ddl_conv_forward(DDL_F32, g, r->ky, r->kx, r->kw, r->kb, r->ws, r->ws_bytes));
    memset(r->kdx, 0, sizeof(float) * (size_t)nx);
    CHECK(ddl_conv_backward(DDL_F32, g, r->kdx, r->kdw, r->kdb, r->kdy, r->kx, r->kw, r->ws,
                            r->ws_bytes));
}

static void bench_conv(int64_t N, int64_t C, int64_t H, int64_t W)
{
    const int64_t K = 3;
    int           b = 1;
    for (int d = 1; d * d <= nprocs; d++) {
        if (nprocs % d == 0) {
            b = d;
        }
    }
    int              sx[4] = {1, 1, nprocs / b, b};
    ddl_partition_t *P_x   = part(0, nprocs, 4, sx);
    ddl_shape        xg    = ddl_shape_make(4, (int64_t[]){N, C, H, W});
    ddl_conv_params  cp    = {.nsp = 2, .in_channels = C, .out_channels = C, .bias = true,
                              .kernel = {K, K}, .stride = {1, 1}, .padding = {1, 1},
                              .dilation = {1, 1}};
    ddl_layer_t     *L;
    CHECK(ddl_conv_create(P_x, NULL, NULL, DDL_F32, &xg, &cp, &L));
    ddl_layer_init_params(L, 1, 0);
    ddl_shape     yg = *ddl_layer_y_global(L);
    ddl_tensor_t *x = random_piece(P_x, &xg, 1), *dy = random_piece(P_x, &yg, 2);
    ddl_tensor_t *y = tensor(ddl_layer_y_shape(L)), *dx = tensor(ddl_layer_x_shape(L));
    layer_times   lt = bench_layer(L, x, y, dy, dx);

    // This rank's share: its output block [N, C, oh, ow].
    const int64_t *ys = ddl_layer_y_shape(L)->d;
    int64_t        oh = ys[2], ow = ys[3], Kc = C * K * K;
    double         share = 3.0 * 2.0 * (double)N * (double)C * (double)(oh * ow) * (double)Kc;
    conv_ref       r     = {.N = (int)N, .Co = (int)C, .Kc = (int)Kc, .ov = (int)(oh * ow)};
    r.n = (int)llround(cbrt(share / 6.0));
    int64_t nn = (int64_t)r.n * r.n;
    r.A = filled(nn, 1), r.B = filled(nn, 2), r.C = filled(nn, 3);
    r.w = filled(C * Kc, 4), r.col = filled(Kc * r.ov, 5), r.y = filled(C * r.ov, 6);
    r.dy = filled(C * r.ov, 7), r.dw = filled(C * Kc, 8), r.dcol = filled(Kc * r.ov, 9);
    // The kernels on the local block as the layer runs them: the full input with padding
    // 1 when the layer is not split, else the halo'd block [oh + 2, ow + 2], padding 0.
    bool    split  = nprocs > 1;
    int64_t in[2]  = {split ? oh + K - 1 : H, split ? ow + K - 1 : W};
    int64_t pad[2] = {split ? 0 : 1, split ? 0 : 1};
    CHECK(ddl_conv_geom_init(&r.g, 2, N, C, C, in, (int64_t[]){K, K}, NULL, pad, NULL));
    int64_t nx = N * C * in[0] * in[1], ny = N * C * oh * ow;
    r.kx = filled(nx, 10), r.kdx = filled(nx, 11), r.ky = filled(ny, 12), r.kdy = filled(ny, 13);
    r.kw = filled(C * Kc, 14), r.kdw = filled(C * Kc, 15), r.kb = filled(C, 16);
    r.kdb      = filled(C, 17);
    r.ws_bytes = ddl_conv_workspace_bytes(DDL_F32, &r.g);
    r.ws       = ddl_calloc(r.ws_bytes > 0 ? r.ws_bytes : 1, 1);
    double t_sq  = bench(raw_square, &r);
    double t_i2c = bench(raw_im2col, &r);
    double t_ker = bench(kernels_conv, &r);

    double flops = 3.0 * 2.0 * (double)N * (double)C * (double)(yg.d[2] * yg.d[3]) * (double)Kc;
    double sq_fl = sum_all(6.0 * (double)r.n * (double)r.n * (double)r.n);
    double sh_fl = sum_all(share);
    if (rank == 0) {
        char   ps[32];
        double gf = flops / lt.tot * 1e-9, per = gf / nprocs;
        double sq_per  = sq_fl / t_sq * 1e-9 / nprocs;
        double i2c_per = sh_fl / t_i2c * 1e-9 / nprocs;
        double ker_per = sh_fl / t_ker * 1e-9 / nprocs;
        printf("conv   np=%d P_x=%-9s fwd+bwd %7.1f ms  total %6.1f GFLOP/s  per-rank %6.1f "
               "GFLOP/s  raw sgemm per-rank %6.1f GFLOP/s  ratio %.2f\n",
               nprocs, pshape_str(sx, 4, ps, sizeof ps), lt.tot * 1e3, gf, per, sq_per,
               per / sq_per);
        printf("    fwd %7.1f ms  bwd %7.1f ms | raw sgemm = square n=%d x3 %7.1f ms | im2col "
               "GEMMs (3 per sample: %dx%dx%d) per-rank %6.1f GFLOP/s, ratio %.2f\n",
               lt.fwd * 1e3, lt.bwd * 1e3, r.n, t_sq * 1e3, r.Co, r.ov, r.Kc, i2c_per,
               per / i2c_per);
        printf("    kernels only %7.1f ms (per-rank %6.1f GFLOP/s, layer/kernels %.2f, "
               "kernels/raw sgemm %.2f, kernels/im2col GEMMs %.2f)\n",
               t_ker * 1e3, ker_per, per / ker_per, ker_per / sq_per, ker_per / i2c_per);
        fflush(stdout);
    }
    ddl_free(r.A), ddl_free(r.B), ddl_free(r.C), ddl_free(r.w), ddl_free(r.col);
    ddl_free(r.y), ddl_free(r.dy), ddl_free(r.dw), ddl_free(r.dcol);
    ddl_free(r.kx), ddl_free(r.kdx), ddl_free(r.ky), ddl_free(r.kdy), ddl_free(r.kw);
    ddl_free(r.kdw), ddl_free(r.kb), ddl_free(r.kdb), ddl_free(r.ws);
    ddl_tensor_destroy(&x), ddl_tensor_destroy(&y), ddl_tensor_destroy(&dy);
    ddl_tensor_destroy(&dx);
    ddl_layer_destroy(&L);
    ddl_partition_destroy(&P_x);
}

// ---- main ---------------------------------------------------------------------------

// Parses "a,b,c[,d]" into n int64 values; false unless exactly n positive values.
static int parse_list(const char *s, int64_t *v, int n)
{
    char *end;
    for (int i = 0; i < n; i++) {
        v[i] = strtoll(s, &end, 10);
        if (end == s || v[i] < 1 || (i < n - 1 && *end != ',')) {
            return 0;
        }
        s = end + 1;
    }
    return *end == '\0';
}

int main(int argc, char **argv)
{
    ddl_blas_startup(argc, argv); // may re-execute: before anything else
    ddl_malloc_tune_for_streaming();
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nprocs);

    int         threads = 0;
    const char *only    = NULL;
    int64_t     lin[3]  = {256, 4096, 4096}, cv[4] = {32, 64, 56, 56};
    int         ok      = nprocs <= 64;
    for (int i = 1; i < argc && ok; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v != NULL && strcmp(a, "--threads") == 0) {
            threads = atoi(v), ok = threads >= 1, i++;
        } else if (v != NULL && strcmp(a, "--reps") == 0) {
            reps = atoi(v), ok = reps >= 1, i++;
        } else if (v != NULL && strcmp(a, "--only") == 0) {
            only = v, ok = strcmp(v, "linear") == 0 || strcmp(v, "conv") == 0, i++;
        } else if (v != NULL && strcmp(a, "--linear") == 0) {
            ok = parse_list(v, lin, 3), i++;
        } else if (v != NULL && strcmp(a, "--conv") == 0) {
            ok = parse_list(v, cv, 4), i++;
        } else {
            ok = 0;
        }
    }
    if (!ok) {
        if (rank == 0) {
            fprintf(stderr, "usage: mpirun -np P bench-layers [--threads N] [--reps N] "
                            "[--only linear|conv] [--linear B,IN,OUT] [--conv N,C,H,W]\n"
                            "(P <= 64)\n");
        }
        MPI_Finalize();
        return 2;
    }

    int divided = ddl_runtime_divide_cores(MPI_COMM_WORLD);
    if (threads > 0) {
        ddl_blas_set_threads(threads);
    }
    if (rank == 0) {
        ddl_blas_log("bench-layers", 0);
    }
    // Threads per rank and CPUs each rank may run on (its affinity mask).
    cpu_set_t set;
    int       ncpu = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    int       mine[4] = {ddl_blas_set_threads(0), ncpu}, agg[4];
    mine[2] = -mine[0], mine[3] = -mine[1];
    MPI_Allreduce(mine, agg, 4, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    int lo = agg[0], hi = -agg[2], cpu_lo = agg[1], cpu_hi = -agg[3];
    int oversub = 0, over_mine = mine[0] > ncpu && ncpu > 0;
    MPI_Allreduce(&over_mine, &oversub, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) {
        const char *env = getenv("OPENBLAS_NUM_THREADS");
        char        range[32], cpus[32];
        snprintf(range, sizeof range, lo == hi ? "%d" : "%d..%d", lo, hi);
        snprintf(cpus, sizeof cpus, cpu_lo == cpu_hi ? "%d" : "%d..%d", cpu_lo, cpu_hi);
        printf("bench-layers np=%d: BLAS threads per rank %s (%s; divide_cores gave %d), "
               "CPUs in each rank's affinity mask %s; f32; median of %d reps after %d "
               "warm-up, slowest rank\n",
               nprocs, range,
               threads > 0 ? "--threads" : env != NULL ? "OPENBLAS_NUM_THREADS" : "cores / ranks",
               divided, cpus, reps, warmup);
        if (oversub) {
            printf("WARNING: more BLAS threads than CPUs a rank may run on (bound by mpirun?): "
                   "its threads share cores; run with --bind-to none to spread them\n");
        }
        printf("OpenBLAS: %s\n", openblas_get_config());
        fflush(stdout);
    }

    if (only == NULL || strcmp(only, "linear") == 0) {
        if (rank == 0) {
            printf("linear B=%lld in=%lld out=%lld bias: %.2f GFLOP fwd+bwd (3 x 2 B in out); "
                   "raw = the rank's 3 GEMMs (x W^T, dy W, dy^T x) on its [B,fi]x[fo,fi] block\n",
                   (long long)lin[0], (long long)lin[1], (long long)lin[2],
                   6.0 * (double)lin[0] * (double)lin[1] * (double)lin[2] * 1e-9);
            fflush(stdout);
        }
        for (int P_fo = 1; P_fo <= nprocs; P_fo++) {
            if (nprocs % P_fo == 0) {
                bench_linear(lin[0], lin[1], lin[2], P_fo, nprocs / P_fo);
            }
        }
    }
    if (only == NULL || strcmp(only, "conv") == 0) {
        if (rank == 0) {
            double fl = 6.0 * (double)(cv[0] * cv[1] * cv[2] * cv[3]) * (double)(cv[1] * 9);
            printf("conv2d N=%lld %lld->%lld %lldx%lld k=3 pad=1 bias, feature-partitioned: "
                   "%.2f GFLOP fwd+bwd (3 x 2 N Co Ho Wo Ci 9); raw = square sgemm of the "
                   "rank's share\n",
                   (long long)cv[0], (long long)cv[1], (long long)cv[1], (long long)cv[2],
                   (long long)cv[3], fl * 1e-9);
            fflush(stdout);
        }
        bench_conv(cv[0], cv[1], cv[2], cv[3]);
    }
    MPI_Finalize();
    return 0;
}
