// tests/bench/bench_conv_paths.c: the direct convolution path (kernels/conv_direct.h)
// against the im2col + GEMM path on the same layers, in the same run: the 3-D U-Net's
// convolutions (deploy/specs/unet3d-*.json at 32^3, batch 2), two 2-D references
// (LeNet-5's conv1, a ResNet 16->16 block conv at 28^2) and ResNet's strided ones.
//
// Each layer runs forward, then backward (dx, dW, db), on one thread (BLAS and the kernel
// pool at width 1), once per path in turn, best of REPS rounds; the time is this thread's
// CPU time, so a descheduled interval is charged to neither path. The figures: the direct
// path's speed-up over the GEMM path, forward and backward, and each path's rate in
// GFLOP/s (2 Co Kc ov N per pass; backward counts dx and dW: twice that). The CPU, the
// vector width in use and the load average are printed beside them.
// Usage: bench-conv-paths [REPS]   (default 5)
//
// bench-conv-paths --times [REPS [THREADS]] reads geometries from standard input instead,
// one per line: "nsp N C_in C_out in0 in1 in2 k0 k1 k2 s0 s1 s2 p0 p1 p2 dx" (unused
// trailing spatial entries 1, 1, 0; dx 0: the backward computes no input gradient, as a
// model's first layer), and prints for each "fwd_s bwd_s": the default path's best
// forward and backward (dW, db and, with dx 1, dx) wall seconds with THREADS kernel
// threads (default 1), over at least REPS calls and 50 ms after a warm-up call. A line
// "up nsp B gin0 gin1 gin2 sf linear align out0 out1 out2" times the interpolation kernel
// of an upsample instead (ddl_interpolate_*: B = batch x channels, the global input extents
// gin, scale factor sf, linear 1 or nearest 0, align_corners 0 or 1) on the output box
// [0, out) and the input window it needs; its backward includes zeroing that window. The scaling
// model (tests/bench/scaling_model.py) costs each convolution of a network with these.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_host.h"
#include "ddl/base.h"
#include "ddl/kernels.h"
#include "ddl/kernels_pointwise.h"
#include "kernels/conv_direct.h"

static double cpu_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct layer {
    const char *name;
    int         nsp;
    int64_t     N, Ci, Co, in, k, pad, stride;
} layer;

static float *filled(int64_t n, uint64_t seed)
{
    float *p = ddl_malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        p[i] = (float)(ddl_rng_uniform(seed, 3, (uint64_t)i) - 0.5);
    }
    return p;
}

// Best forward and backward CPU seconds of path `level` (0: GEMM, -1: the default direct).
static int run_layer(const layer *L, int reps)
{
    int64_t       in[3] = {L->in, L->in, L->in}, k[3] = {L->k, L->k, L->k};
    int64_t       p[3] = {L->pad, L->pad, L->pad}, s[3] = {L->stride, L->stride, L->stride};
    ddl_conv_geom g;
    if (ddl_conv_geom_init(&g, L->nsp, L->N, L->Ci, L->Co, in, k, s, p, NULL) != DDL_OK) {
        fprintf(stderr, "bench-conv-paths: %s: %s\n", L->name, ddl_last_error());
        return 1;
    }
    int64_t iv = g.in[0] * g.in[1] * g.in[2], ov = g.out[0] * g.out[1] * g.out[2];
    int64_t kv = g.k[0] * g.k[1] * g.k[2];
    int64_t nx = g.N * g.C_in * iv, ny = g.N * g.C_out * ov, nw = g.C_out * g.C_in * kv;
    float  *x = filled(nx, 1), *w = filled(nw, 2), *b = filled(g.C_out, 3), *dy = filled(ny, 4);
    float  *y = filled(ny, 5), *dx = filled(nx, 6), *dw = filled(nw, 7), *db = filled(g.C_out, 8);
    size_t  wsb        = ddl_conv_workspace_bytes(DDL_F32, &g);
    void   *ws         = ddl_malloc(wsb > 0 ? wsb : 1);
    double  best[2][2] = {{1e30, 1e30}, {1e30, 1e30}}; // [path][fwd, bwd]
    for (int r = 0; r < reps; r++) {
        for (int path = 0; path < 2; path++) {
            ddl_cdir_set(path == 0 ? 0 : -1);
            double     t0 = cpu_now();
            ddl_status st = ddl_conv_forward(DDL_F32, &g, y, x, w, b, ws, wsb);
            double     t1 = cpu_now();
            if (st == DDL_OK) {
                memset(dx, 0, (size_t)nx * sizeof(float));
                st = ddl_conv_backward(DDL_F32, &g, dx, dw, db, dy, x, w, ws, wsb);
            }
            double t2 = cpu_now();
            if (st != DDL_OK) {
                fprintf(stderr, "bench-conv-paths: %s: %s\n", L->name, ddl_last_error());
                return 1;
            }
            best[path][0] = t1 - t0 < best[path][0] ? t1 - t0 : best[path][0];
            best[path][1] = t2 - t1 < best[path][1] ? t2 - t1 : best[path][1];
        }
    }
    ddl_cdir_set(-1);
    double flop = 2.0 * (double)g.C_out * (double)(g.C_in * kv) * (double)ov * (double)g.N;
    double gf[2];
    for (int path = 0; path < 2; path++) {
        gf[path] = 3.0 * flop / (best[path][0] + best[path][1]) / 1e9;
    }
    printf("| %-26s | %7.2f / %7.2f | %5.2fx | %7.2f / %7.2f | %5.2fx | %6.1f -> %6.1f |\n",
           L->name, 1e3 * best[0][0], 1e3 * best[1][0], best[0][0] / best[1][0], 1e3 * best[0][1],
           1e3 * best[1][1], best[0][1] / best[1][1], gf[0], gf[1]);
    ddl_free(x), ddl_free(w), ddl_free(b), ddl_free(dy), ddl_free(y), ddl_free(dx), ddl_free(dw),
        ddl_free(db), ddl_free(ws);
    return 0;
}

// --times: the default path's best forward and backward seconds of each geometry on stdin.
static double wall_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// A kernel of --times: pass 0 its forward, pass 1 its backward.
typedef ddl_status (*timed_call)(void *ctx, int pass);

// Prints "fwd_s bwd_s" for line n: the best of a warm-up call (the buffers' first touch)
// and then at least REPS timed calls and at least 50 ms of them, at most 1000.
static int time_pair(int n, int reps, timed_call call, void *ctx)
{
    double best[2] = {1e30, 1e30}, spent = 0;
    for (int r = -1; r < reps || (spent < 0.05 && r < 1000); r++) {
        double     t0 = wall_now();
        ddl_status st = call(ctx, 0);
        double     t1 = wall_now();
        if (st == DDL_OK) {
            st = call(ctx, 1);
        }
        double t2 = wall_now();
        if (st != DDL_OK) {
            fprintf(stderr, "bench-conv-paths --times: line %d: %s\n", n, ddl_last_error());
            return 1;
        }
        if (r >= 0) {
            best[0] = t1 - t0 < best[0] ? t1 - t0 : best[0];
            best[1] = t2 - t1 < best[1] ? t2 - t1 : best[1];
            spent += t2 - t0;
        }
    }
    printf("%.9f %.9f\n", best[0], best[1]);
    fflush(stdout);
    return 0;
}

typedef struct up_call {
    ddl_interpolate_params p;
    ddl_interpolate_window w;
    int64_t                B, ni;
    float                 *x, *y, *dx, *dy;
} up_call;

static ddl_status up_pass(void *ctx, int pass)
{
    up_call *u = ctx;
    if (pass == 0) {
        return ddl_interpolate_forward(DDL_F32, u->y, u->x, &u->p, &u->w, u->B);
    }
    memset(u->dx, 0, (size_t)u->ni * sizeof(float));
    return ddl_interpolate_backward(DDL_F32, u->dx, u->dy, &u->p, &u->w, u->B);
}

typedef struct conv_call {
    ddl_conv_geom g;
    float        *x, *w, *y, *dx, *dw, *db, *dy;
    void         *ws;
    size_t        wsb;
} conv_call;

static ddl_status conv_pass(void *ctx, int pass)
{
    conv_call *c = ctx;
    if (pass == 0) {
        return ddl_conv_forward(DDL_F32, &c->g, c->y, c->x, c->w, NULL, c->ws, c->wsb);
    }
    return ddl_conv_backward(DDL_F32, &c->g, c->dx, c->dw, c->db, c->dy, c->x, c->w, c->ws, c->wsb);
}

// One "up ..." line of --times (see the header): prints "fwd_s bwd_s".
static int time_upsample(const char *line, int n, int reps)
{
    long long v[12];
    if (sscanf(line, "up %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld", &v[0], &v[1],
               &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9], &v[10]) != 11 ||
        v[0] < 1 || v[0] > 3 || v[1] < 1) {
        fprintf(stderr,
                "bench-conv-paths --times: line %d: expected \"up nsp B gin[3] sf linear "
                "align out[3]\", got \"%s\"\n",
                n, line);
        return 1;
    }
    up_call u = {.p = {.mode          = v[6] ? DDL_INTERPOLATE_LINEAR : DDL_INTERPOLATE_NEAREST,
                       .align_corners = v[7] != 0,
                       .ndim          = (int)v[0]},
                 .B = v[1]};
    ddl_interpolate_params *p  = &u.p;
    ddl_interpolate_window *w  = &u.w;
    int64_t                 ni = v[1], no = v[1];
    for (int j = 0; j < p->ndim; j++) {
        p->in_global[j]    = v[2 + j];
        p->scale_factor[j] = (double)v[5];
        p->out_global[j]   = ddl_interpolate_out_size(v[2 + j], (double)v[5]);
    }
    for (int j = 0; j < p->ndim; j++) {
        int64_t a, b;
        if (ddl_interpolate_need(DDL_F32, p, j, 0, v[8 + j], &a, &b) != DDL_OK) {
            fprintf(stderr, "bench-conv-paths --times: line %d: %s\n", n, ddl_last_error());
            return 1;
        }
        w->in_start[j] = a, w->in_n[j] = b - a, w->out_start[j] = 0, w->out_n[j] = v[8 + j];
        ni *= b - a, no *= v[8 + j];
    }
    u.ni = ni;
    u.x = filled(ni, 1), u.y = filled(no, 2), u.dx = filled(ni, 3), u.dy = filled(no, 4);
    int rc = time_pair(n, reps, up_pass, &u);
    ddl_free(u.x), ddl_free(u.y), ddl_free(u.dx), ddl_free(u.dy);
    return rc;
}

static int run_times(int reps)
{
    char line[512];
    int  n = 0;
    while (fgets(line, sizeof line, stdin) != NULL) {
        if (strncmp(line, "up ", 3) == 0) {
            if (time_upsample(line, ++n, reps) != 0) {
                return 1;
            }
            continue;
        }
        long long v[17];
        if (sscanf(line,
                   "%lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld "
                   "%lld %lld %lld",
                   &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9], &v[10],
                   &v[11], &v[12], &v[13], &v[14], &v[15], &v[16]) != 17) {
            fprintf(stderr,
                    "bench-conv-paths --times: line %d: expected 17 integers "
                    "(nsp N C_in C_out in[3] k[3] s[3] p[3] dx), got \"%s\"\n",
                    n + 1, line);
            return 1;
        }
        n++;
        int64_t in[3], k[3], st[3], p[3];
        for (int j = 0; j < 3; j++) {
            in[j] = v[4 + j], k[j] = v[7 + j], st[j] = v[10 + j], p[j] = v[13 + j];
        }
        conv_call      c = {0};
        ddl_conv_geom *g = &c.g;
        if (ddl_conv_geom_init(g, (int)v[0], v[1], v[2], v[3], in, k, st, p, NULL) != DDL_OK) {
            fprintf(stderr, "bench-conv-paths --times: line %d: %s\n", n, ddl_last_error());
            return 1;
        }
        int64_t iv = g->in[0] * g->in[1] * g->in[2], ov = g->out[0] * g->out[1] * g->out[2];
        int64_t kv = g->k[0] * g->k[1] * g->k[2];
        int64_t nx = g->N * g->C_in * iv, ny = g->N * g->C_out * ov, nw = g->C_out * g->C_in * kv;
        c.x = filled(nx, 1), c.w = filled(nw, 2), c.dy = filled(ny, 4), c.y = filled(ny, 5);
        c.dw = filled(nw, 7), c.db = filled(g->C_out, 8);
        c.dx   = v[16] ? filled(nx, 6) : NULL;
        c.wsb  = ddl_conv_workspace_bytes(DDL_F32, g);
        c.ws   = ddl_malloc(c.wsb > 0 ? c.wsb : 1);
        int rc = time_pair(n, reps, conv_pass, &c);
        ddl_free(c.x), ddl_free(c.w), ddl_free(c.dy), ddl_free(c.y), ddl_free(c.dx), ddl_free(c.dw),
            ddl_free(c.db), ddl_free(c.ws);
        if (rc != 0) {
            return rc;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--times") == 0) {
        int reps = argc > 2 ? atoi(argv[2]) : 5, threads = argc > 3 ? atoi(argv[3]) : 1;
        if (reps < 1 || reps > 1000 || threads < 1 || threads > 1024) {
            fprintf(stderr, "usage: bench-conv-paths --times [REPS: 1..1000 [THREADS: 1..1024]] "
                            "< geometries\n");
            return 2;
        }
        ddl_blas_set_threads(threads);
        return run_times(reps);
    }
    int reps = argc > 1 ? atoi(argv[1]) : 5;
    if (reps < 1 || reps > 1000) {
        fprintf(stderr, "usage: bench-conv-paths [REPS: 1..1000]\n");
        return 2;
    }
    ddl_blas_set_threads(1);
    if (ddl_cdir_level() == 0) {
        fprintf(stderr, "bench-conv-paths: the direct path is off on this machine (no AVX2 "
                        "and FMA, or DDL_CONV_DIRECT=0): nothing to compare\n");
        return 1;
    }
    // clang-format off
    static const layer layers[] = {
        // name                        nsp N   Ci  Co  in  k  pad stride
        {"U-Net enc1a 1->8, 32^3",     3,  2,  1,  8,  32, 3, 1, 1},
        {"U-Net enc1b 8->8, 32^3",     3,  2,  8,  8,  32, 3, 1, 1},
        {"U-Net enc2b 16->16, 16^3",   3,  2,  16, 16, 16, 3, 1, 1},
        {"U-Net midb 32->32, 8^3",     3,  2,  32, 32, 8,  3, 1, 1},
        {"U-Net dec2a 48->16, 16^3",   3,  2,  48, 16, 16, 3, 1, 1},
        {"U-Net dec1a 24->8, 32^3",    3,  2,  24, 8,  32, 3, 1, 1},
        {"LeNet-5 conv1 1->6, 28^2",   2,  64, 1,  6,  28, 5, 2, 1},
        {"ResNet 16->16, 28^2",        2,  64, 16, 16, 28, 3, 1, 1},
        {"ResNet s2 8->16, 28^2, s2",  2,  64, 8,  16, 28, 3, 1, 2},
        {"ResNet 1x1 8->16, 28^2, s2", 2,  64, 8,  16, 28, 1, 0, 2},
        {"ResNet s4 32->64, 7^2, s2",  2,  64, 32, 64, 7,  3, 1, 2},
        {"ResNet s4 64->64, 4^2",      2,  64, 64, 64, 4,  3, 1, 1},
    };
    // clang-format on
    char cpu[256];
    bench_cpu_name(cpu, sizeof cpu);
    printf("bench-conv-paths: %s, direct path at %s, 1 thread, thread CPU time, best of %d; "
           "%s\n",
           cpu, ddl_cdir_level() == 2 ? "AVX-512" : "AVX2", reps, bench_load_average());
    printf("| layer (f32)                | fwd ms GEMM / direct | speed-up | bwd ms GEMM / "
           "direct | speed-up | GFLOP/s GEMM -> direct |\n|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < sizeof layers / sizeof layers[0]; i++) {
        if (run_layer(&layers[i], reps) != 0) {
            return 1;
        }
    }
    return 0;
}
