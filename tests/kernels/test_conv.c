// tests/kernels/test_conv.c: 1-D/2-D/3-D convolution. The im2col + GEMM kernels against the
// library's direct reference and an independent one in this file (explicit zero padding),
// in f64 (1e-12) and f32 (1e-4); the backward against central finite differences (f64);
// accumulation, NULL gradients, hand-computed values and refused geometries.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ddl/base.h"
#include "ddl/kernels.h"
#include "gradcheck.h"
#include "kernel_util.h"
#include "kernels/conv_direct.h"
#include "test.h"

// ---- helpers -----------------------------------------------------------------

static double *rand_vec(int64_t n, uint64_t seed)
{
    return ddl_test_rand_vec(n, seed, 2);
}

static void *zeros(ddl_dtype dt, int64_t n)
{
    return calloc((size_t)(n > 0 ? n : 1), ddl_dtype_size(dt));
}

static int64_t prod3(const int64_t v[3])
{
    return v[0] * v[1] * v[2];
}

// ---- an independent reference: pad explicitly, then correlate -----------------
// Spatial dims are taken as three, leading ones of extent 1 (the user's dims last).

typedef struct dims3 {
    int64_t in[3], k[3], s[3], p[3], d[3], out[3];
} dims3;

static dims3 dims_of(const ddl_conv_geom *g)
{
    dims3 t;
    int   sh = 3 - g->nsp;
    for (int i = 0; i < 3; i++) {
        int j    = i - sh;
        t.in[i]  = j >= 0 ? g->in[j] : 1;
        t.k[i]   = j >= 0 ? g->k[j] : 1;
        t.s[i]   = j >= 0 ? g->s[j] : 1;
        t.p[i]   = j >= 0 ? g->p[j] : 0;
        t.d[i]   = j >= 0 ? g->d[j] : 1;
        t.out[i] = j >= 0 ? g->out[j] : 1;
    }
    return t;
}

static void conv_ref(const ddl_conv_geom *g, double *y, const double *x, const double *w,
                     const double *b)
{
    dims3   t = dims_of(g);
    int64_t P[3];
    for (int i = 0; i < 3; i++) {
        P[i] = t.in[i] + 2 * t.p[i];
    }
    int64_t pv = prod3(P), iv = prod3(t.in), ov = prod3(t.out), kv = prod3(t.k);
    double *xp = calloc((size_t)pv, sizeof(double));
    for (int64_t n = 0; n < g->N; n++) {
        for (int64_t co = 0; co < g->C_out; co++) {
            for (int64_t o = 0; o < ov; o++) {
                y[(n * g->C_out + co) * ov + o] = b ? b[co] : 0.0;
            }
        }
        for (int64_t ci = 0; ci < g->C_in; ci++) {
            // The zero-padded plane of channel ci.
            for (int64_t a = 0; a < t.in[0]; a++) {
                for (int64_t c = 0; c < t.in[1]; c++) {
                    for (int64_t e = 0; e < t.in[2]; e++) {
                        xp[((a + t.p[0]) * P[1] + c + t.p[1]) * P[2] + e + t.p[2]] =
                            x[(n * g->C_in + ci) * iv + (a * t.in[1] + c) * t.in[2] + e];
                    }
                }
            }
            for (int64_t co = 0; co < g->C_out; co++) {
                const double *wk = w + (co * g->C_in + ci) * kv;
                double       *yo = y + (n * g->C_out + co) * ov;
                for (int64_t o0 = 0; o0 < t.out[0]; o0++) {
                    for (int64_t o1 = 0; o1 < t.out[1]; o1++) {
                        for (int64_t o2 = 0; o2 < t.out[2]; o2++) {
                            double acc = 0.0;
                            for (int64_t a = 0; a < t.k[0]; a++) {
                                for (int64_t c = 0; c < t.k[1]; c++) {
                                    for (int64_t e = 0; e < t.k[2]; e++) {
                                        int64_t q0 = o0 * t.s[0] + a * t.d[0];
                                        int64_t q1 = o1 * t.s[1] + c * t.d[1];
                                        int64_t q2 = o2 * t.s[2] + e * t.d[2];
                                        acc += wk[(a * t.k[1] + c) * t.k[2] + e] *
                                               xp[(q0 * P[1] + q1) * P[2] + q2];
                                    }
                                }
                            }
                            yo[(o0 * t.out[1] + o1) * t.out[2] + o2] += acc;
                        }
                    }
                }
            }
        }
    }
    free(xp);
}

// ---- one case ----------------------------------------------------------------------

typedef struct conv_case {
    int     nsp;
    int64_t N, Ci, Co;
    int64_t in[3], k[3], s[3], p[3], d[3];
    bool    bias;
} conv_case;

typedef struct conv_ctx {
    const ddl_conv_geom *g;
    double              *x, *w, *b, *r, *y;
    void                *ws;
    size_t               ws_bytes;
} conv_ctx;

// L = <conv(x, w, b), r>, so dL/dy = r.
static double conv_loss(void *p)
{
    conv_ctx *c = p;
    ASSERT_OK(ddl_conv_forward(DDL_F64, c->g, c->y, c->x, c->w, c->b, c->ws, c->ws_bytes));
    int64_t ny = c->g->N * c->g->C_out * c->g->out[0] * c->g->out[1] * c->g->out[2];
    double  s  = 0.0;
    for (int64_t i = 0; i < ny; i++) {
        s += c->y[i] * c->r[i];
    }
    return s;
}

// DDL_CONV_DX_SET (ddl_conv_backward_ex) on dx filled with NaN sets it to what a call
// adding into zeros gives, value for value (both with the kernel width in force now);
// dw, computed in the same call, adds as without the flag.
static void check_dx_set(ddl_dtype dt, const ddl_conv_geom *g, const void *rd, const void *xd,
                         const void *wd, void *ws, size_t wsb)
{
    int64_t nx  = g->N * g->C_in * g->in[0] * g->in[1] * g->in[2];
    int64_t nw  = g->C_out * g->C_in * g->k[0] * g->k[1] * g->k[2];
    size_t  es  = ddl_dtype_size(dt);
    void   *add = zeros(dt, nx), *set = malloc((size_t)(nx + 1) * es);
    void   *dwa = zeros(dt, nw), *dws = zeros(dt, nw);
    ASSERT_OK(ddl_conv_backward(dt, g, add, dwa, NULL, rd, xd, wd, ws, wsb));
    memset(set, 0xff, (size_t)(nx + 1) * es); // NaN: none of it may be read
    ASSERT_OK(ddl_conv_backward_ex(dt, g, set, dws, NULL, rd, xd, wd, ws, wsb, DDL_CONV_DX_SET));
    for (int64_t i = 0; i < nx; i++) {
        if (!(ddl_test_at(dt, set, i) == ddl_test_at(dt, add, i))) {
            TEST_FAIL_("conv DDL_CONV_DX_SET %s nsp=%d: dx[%lld] = %g, adding into zeros gives %g",
                       ddl_dtype_name(dt), g->nsp, (long long)i, ddl_test_at(dt, set, i),
                       ddl_test_at(dt, add, i));
        }
    }
    ASSERT_TRUE(memcmp(dwa, dws, (size_t)nw * es) == 0);
    free(add), free(set), free(dwa), free(dws);
}

static void run_case(const conv_case *cc, uint64_t seed)
{
    ddl_conv_geom g;
    ASSERT_OK(ddl_conv_geom_init(&g, cc->nsp, cc->N, cc->Ci, cc->Co, cc->in, cc->k, cc->s,
                                 cc->p, cc->d));
    for (int i = 0; i < cc->nsp; i++) {
        int64_t want = (cc->in[i] + 2 * cc->p[i] - cc->d[i] * (cc->k[i] - 1) - 1) / cc->s[i] + 1;
        ASSERT_EQ(g.out[i], want);
    }
    int64_t kv = g.k[0] * g.k[1] * g.k[2];
    int64_t nx = g.N * g.C_in * g.in[0] * g.in[1] * g.in[2];
    int64_t ny = g.N * g.C_out * g.out[0] * g.out[1] * g.out[2];
    int64_t nw = g.C_out * g.C_in * kv, nb = g.C_out;
    double *x = rand_vec(nx, seed), *w = rand_vec(nw, seed + 1);
    double *b = cc->bias ? rand_vec(nb, seed + 2) : NULL, *r = rand_vec(ny, seed + 3);

    // Forward: the independent reference, then the library's direct one, then im2col.
    double *yref = calloc((size_t)(ny + 1), sizeof(double));
    conv_ref(&g, yref, x, w, b);
    double *ynaive = zeros(DDL_F64, ny);
    ASSERT_OK(ddl_conv_forward_naive(DDL_F64, &g, ynaive, x, w, b));
    ASSERT_LE(ddl_test_rel_err(yref, DDL_F64, ynaive, ny), 1e-12);

    // Backward reference: the library's direct loops in f64.
    double *dxr = zeros(DDL_F64, nx), *dwr = zeros(DDL_F64, nw), *dbr = zeros(DDL_F64, nb);
    ASSERT_OK(ddl_conv_backward_naive(DDL_F64, &g, dxr, dwr, dbr, r, x, w));

    for (int d = 0; d < 2; d++) {
        ddl_dtype dt  = d ? DDL_F64 : DDL_F32;
        double    tol = d ? 1e-12 : 1e-4;
        size_t    wsb = ddl_conv_workspace_bytes(dt, &g);
        void     *ws  = malloc(wsb > 0 ? wsb : 1);
        void *xd = ddl_test_as_dtype(dt, x, nx), *wd = ddl_test_as_dtype(dt, w, nw), *rd = ddl_test_as_dtype(dt, r, ny);
        void *bd = cc->bias ? ddl_test_as_dtype(dt, b, nb) : NULL;
        void *yd = zeros(dt, ny);
        memset(ws, 0xff, wsb > 0 ? wsb : 1); // scratch contents must not matter
        ASSERT_OK(ddl_conv_forward(dt, &g, yd, xd, wd, bd, ws, wsb));
        double e = ddl_test_rel_err(yref, dt, yd, ny);
        if (!(e <= tol)) {
            TEST_FAIL_("conv forward %s nsp=%d N=%lld: rel err %.3g > %g", ddl_dtype_name(dt),
                       cc->nsp, (long long)cc->N, e, tol);
        }
        void *dxd = zeros(dt, nx), *dwd = zeros(dt, nw), *dbd = zeros(dt, nb);
        ASSERT_OK(ddl_conv_backward(dt, &g, dxd, dwd, cc->bias ? dbd : NULL, rd, xd, wd, ws,
                                    wsb));
        ASSERT_LE(ddl_test_rel_err(dxr, dt, dxd, nx), tol);
        ASSERT_LE(ddl_test_rel_err(dwr, dt, dwd, nw), tol);
        if (cc->bias) {
            ASSERT_LE(ddl_test_rel_err(dbr, dt, dbd, nb), tol);
        }
        // Accumulation: more calls add on top (dx alone, then dw and db alone): 2x.
        ASSERT_OK(ddl_conv_backward(dt, &g, dxd, NULL, NULL, rd, NULL, wd, ws, wsb));
        ASSERT_OK(ddl_conv_backward(dt, &g, NULL, dwd, cc->bias ? dbd : NULL, rd, xd, NULL, ws,
                                    wsb));
        for (int64_t i = 0; i < nx; i++) {
            dxr[i] *= 2.0;
        }
        for (int64_t i = 0; i < nw; i++) {
            dwr[i] *= 2.0;
        }
        for (int64_t i = 0; i < nb; i++) {
            dbr[i] *= 2.0;
        }
        ASSERT_LE(ddl_test_rel_err(dxr, dt, dxd, nx), tol);
        ASSERT_LE(ddl_test_rel_err(dwr, dt, dwd, nw), tol);
        if (cc->bias) {
            ASSERT_LE(ddl_test_rel_err(dbr, dt, dbd, nb), tol);
        }
        check_dx_set(dt, &g, rd, xd, wd, ws, wsb);
        for (int64_t i = 0; i < nx; i++) {
            dxr[i] *= 0.5;
        }
        for (int64_t i = 0; i < nw; i++) {
            dwr[i] *= 0.5;
        }
        for (int64_t i = 0; i < nb; i++) {
            dbr[i] *= 0.5;
        }
        free(ws), free(xd), free(wd), free(rd), free(bd), free(yd), free(dxd), free(dwd),
            free(dbd);
    }

    // Finite differences (f64) of L = <y, r> against the im2col backward with dy = r. L is
    // linear in each of x, w and b, so the central difference is exact for any step: a
    // large one keeps the rounding of L (a sum of thousands of terms) out of the quotient.
    {
        size_t   wsb = ddl_conv_workspace_bytes(DDL_F64, &g);
        void    *ws  = malloc(wsb > 0 ? wsb : 1);
        double  *y   = zeros(DDL_F64, ny);
        double  *dx = zeros(DDL_F64, nx), *dw = zeros(DDL_F64, nw), *db = zeros(DDL_F64, nb);
        conv_ctx ctx = {&g, x, w, b, r, y, ws, wsb};
        ASSERT_OK(ddl_conv_backward(DDL_F64, &g, dx, dw, cc->bias ? db : NULL, r, x, w, ws, wsb));
        ASSERT_LE(ddl_test_gradcheck(nx, x, dx, conv_loss, &ctx, 1e-3, 40), 1e-8);
        ASSERT_LE(ddl_test_gradcheck(nw, w, dw, conv_loss, &ctx, 1e-3, 40), 1e-8);
        if (cc->bias) {
            ASSERT_LE(ddl_test_gradcheck(nb, b, db, conv_loss, &ctx, 1e-3, 40), 1e-8);
        }
        free(ws), free(y), free(dx), free(dw), free(db);
    }
    free(x), free(w), free(b), free(r), free(yref), free(ynaive), free(dxr), free(dwr),
        free(dbr);
}

// ddl_conv_forward_rows is batch-invariant: sample n of a batch of N has the bits of the
// same sample run alone and of the samples [n, N) run as a batch, at 1 and 2 kernel
// threads (the same bits at both), and equals the f64 reference within rounding.
static void run_rows_case(const conv_case *cc, uint64_t seed)
{
    ddl_conv_geom g;
    ASSERT_OK(
        ddl_conv_geom_init(&g, cc->nsp, cc->N, cc->Ci, cc->Co, cc->in, cc->k, cc->s, cc->p, cc->d));
    int64_t xs = g.C_in * g.in[0] * g.in[1] * g.in[2],
            ys = g.C_out * g.out[0] * g.out[1] * g.out[2];
    int64_t nw = g.C_out * g.C_in * g.k[0] * g.k[1] * g.k[2];
    double *x = rand_vec(g.N * xs, seed), *w = rand_vec(nw, seed + 1),
           *b  = rand_vec(g.C_out, seed + 2);
    double *yr = zeros(DDL_F64, g.N * ys);
    ASSERT_OK(ddl_conv_forward_naive(DDL_F64, &g, yr, x, w, cc->bias ? b : NULL));
    int prev = ddl_blas_set_threads(0);
    for (int d = 0; d < 2; d++) {
        ddl_dtype dt = d ? DDL_F64 : DDL_F32;
        size_t    es = ddl_dtype_size(dt);
        void     *xd = ddl_test_as_dtype(dt, x, g.N * xs), *wd = ddl_test_as_dtype(dt, w, nw);
        void     *bd = cc->bias ? ddl_test_as_dtype(dt, b, g.C_out) : NULL;
        void     *y[2], *yn = zeros(dt, g.N * ys);
        for (int t = 0; t < 2; t++) {
            ddl_blas_set_threads(t + 1);
            size_t wsb = ddl_conv_workspace_bytes(dt, &g);
            void  *ws  = wsb > 0 ? malloc(wsb) : NULL;
            y[t]       = zeros(dt, g.N * ys);
            ASSERT_OK(ddl_conv_forward_rows(dt, &g, y[t], xd, wd, bd, ws, wsb));
            for (int64_t n = 0; n < g.N; n++) {
                for (int k = 0; k < 2; k++) { // alone, then [n, N) as a batch
                    ddl_conv_geom h = g;
                    h.N             = k == 0 ? 1 : g.N - n;
                    ASSERT_OK(ddl_conv_forward_rows(dt, &h, yn, (char *)xd + (size_t)(n * xs) * es,
                                                    wd, bd, ws, wsb));
                    ASSERT_TRUE(memcmp(yn, (char *)y[t] + (size_t)(n * ys) * es, (size_t)ys * es) ==
                                0);
                }
            }
            free(ws);
        }
        ASSERT_TRUE(memcmp(y[0], y[1], (size_t)(g.N * ys) * es) == 0);
        for (int64_t i = 0; i < g.N * ys; i++) {
            double v = d ? ((double *)y[0])[i] : (double)((float *)y[0])[i];
            ASSERT_TRUE(fabs(v - yr[i]) <= (d ? 1e-12 : 1e-4) * (1.0 + fabs(yr[i])));
        }
        free(xd), free(wd), free(bd), free(y[0]), free(y[1]), free(yn);
    }
    ddl_blas_set_threads(prev);
    free(x), free(w), free(b), free(yr);
}

static void test_cases(void)
{
    // clang-format off
    const conv_case cases[] = {
        // Comments say what a case covers beyond the basics.
        // nsp N Ci Co in          k          s          p          d          bias
        {1, 2, 3, 4, {11},       {3},       {1},       {1},       {1},       true},
        {1, 3, 2, 3, {10},       {4},       {2},       {2},       {1},       false}, // even k, s 2
        {1, 2, 2, 2, {13},       {3},       {1},       {2},       {2},       true},  // dilation 2
        {1, 1, 1, 1, {5},        {5},       {3},       {0},       {1},       true},  // k = input
        {2, 2, 3, 2, {7, 9},     {3, 2},    {2, 1},    {1, 0},    {1, 2},    true},
        {2, 3, 2, 4, {8, 8},     {3, 3},    {1, 1},    {1, 1},    {1, 1},    true},  // shared block
        {2, 2, 4, 3, {6, 5},     {1, 1},    {1, 1},    {0, 0},    {1, 1},    true},  // 1x1 direct
        {2, 2, 4, 3, {6, 5},     {1, 1},    {2, 2},    {0, 0},    {1, 1},    false}, // 1x1, s 2
        {2, 1, 2, 2, {100, 100}, {3, 3},    {1, 1},    {1, 1},    {1, 1},    true},  // split sample
        {2, 1, 3, 2, {200, 120}, {4, 2},    {2, 3},    {2, 1},    {2, 1},    false}, // split, s 2/3
        {2, 40, 3, 2, {8, 8},    {3, 3},    {1, 1},    {1, 1},    {1, 1},    true}, // part. block
        {3, 2, 2, 3, {5, 6, 7},  {2, 3, 3}, {1, 2, 1}, {1, 1, 0}, {2, 1, 1}, true},
        {3, 1, 3, 2, {6, 6, 6},  {3, 3, 3}, {2, 2, 2}, {1, 1, 1}, {1, 1, 1}, false},
        {3, 2, 1, 2, {4, 7, 5},  {2, 2, 4}, {2, 1, 1}, {0, 1, 2}, {1, 3, 1}, true},
        // The wide layout (1-D/2-D, stride 1, several samples per block): padded and not,
        // p1 != p2, dilation, a partial last block (N not a multiple of the block).
        {2, 13, 1, 6, {28, 28},  {5, 5},    {1, 1},    {2, 2},    {1, 1},    true},  // conv1
        {2, 15, 6, 16, {14, 14}, {5, 5},    {1, 1},    {0, 0},    {1, 1},    true},  // conv2
        {2, 9, 2, 3, {9, 12},    {3, 4},    {1, 1},    {1, 2},    {2, 1},    false},
        {2, 5, 3, 2, {6, 7},     {2, 3},    {1, 1},    {0, 1},    {1, 2},    true},
        {1, 70, 2, 3, {17},      {5},       {1},       {3},       {1},       true},
        // Many input channels: the direct path at AVX-512 only (dx by gather, padded, and
        // by scatter, unpadded), the GEMM path otherwise.
        {2, 3, 19, 7, {9, 11},   {3, 3},    {1, 1},    {1, 1},    {1, 1},    true},
        {2, 2, 13, 9, {8, 8},    {3, 2},    {1, 1},    {0, 0},    {2, 1},    false},
        // 3-D with stride 1: the direct path on the grid over the padded volume. dx by
        // scatter (p0 != p1 != p2) and by gather (k0 = 1, little padding), dilation in
        // depth, and 12 input channels (AVX-512 only).
        {3, 2, 2, 3, {5, 6, 7},  {3, 3, 3}, {1, 1, 1}, {1, 0, 2}, {1, 1, 1}, true},
        {3, 2, 3, 4, {4, 10, 12}, {1, 3, 3}, {1, 1, 1}, {0, 1, 1}, {1, 1, 1}, false},
        {3, 1, 3, 2, {7, 5, 6},  {2, 2, 3}, {1, 1, 1}, {1, 1, 0}, {3, 1, 1}, true},
        {3, 2, 12, 5, {4, 5, 6}, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1}, true},
        // Small output planes with whole vectors of channels: the channel-vector kernels
        // (ddl_cvec) at either width, in f32 and f64 (test_cvec_taken checks that they
        // run). ResNet's 4x4 stage; 7x7 -> 4x4 with stride 2 and 3 vectors of C_out at
        // AVX-512 f32 (6 in f64: a tile of 4 and one of 2); the 1x1 stride-2 shortcut;
        // 3-D; 1-D with dilation; 5 vectors of C_out and unequal dims; 6 samples in
        // groups of 4 (the last one short); 16x16 outputs with stride 2 (one sample per
        // group).
        {2, 3, 32, 32, {4, 4},   {3, 3},    {1, 1},    {1, 1},    {1, 1},    true},
        {2, 5, 16, 48, {7, 7},   {3, 3},    {2, 2},    {1, 1},    {1, 1},    false},
        {2, 2, 32, 32, {7, 7},   {1, 1},    {2, 2},    {0, 0},    {1, 1},    true},
        {3, 2, 16, 32, {4, 4, 4}, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1}, false},
        {1, 4, 16, 32, {9},      {3},       {1},       {2},       {2},       true},
        {2, 2, 64, 80, {5, 6},   {2, 3},    {2, 1},    {1, 0},    {1, 2},    false},
        {2, 6, 16, 32, {8, 8},   {3, 3},    {1, 1},    {1, 1},    {1, 1},    true},
        {2, 3, 16, 32, {32, 32}, {3, 3},    {2, 2},    {1, 1},    {1, 1},    false},
    };
    // clang-format on
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        run_case(&cases[i], 1000 + 10 * i);
        run_rows_case(&cases[i], 5000 + 10 * i);
    }
}

// The channel-vector kernels run where test_cases and test_threads expect them: for
// their cvec cases, in f32 and f64, at each vector width the CPU has, forward and
// backward; not with ddl_cvec_set(false), nor where C_in is not whole vectors, nor where
// its workspace would be too large.
static void test_cvec_taken(void)
{
    // {nsp, N, Ci, Co, in, k, stride, pad}
    const int64_t cases[3][8] = {
        {2, 3, 32, 32, 4, 3, 1, 1}, {2, 5, 16, 48, 7, 3, 2, 1}, {2, 12, 16, 32, 8, 3, 1, 1}};
    for (int level = 2; level >= 1; level--) {
        ddl_cdir_set(level);
        if (ddl_cdir_level() != level) {
            continue;
        }
        for (int s = 0; s < 3; s++) {
            const int64_t *c     = cases[s];
            int64_t        in[2] = {c[4], c[4]}, k[2] = {c[5], c[5]}, st[2] = {c[6], c[6]},
                    p[2] = {c[7], c[7]};
            ddl_conv_geom g, h;
            ASSERT_OK(ddl_conv_geom_init(&g, (int)c[0], c[1], c[2], c[3], in, k, st, p, NULL));
            ASSERT_OK(ddl_conv_geom_init(&h, (int)c[0], c[1], c[2] + 1, c[3], in, k, st, p, NULL));
            for (int dd = 0; dd < 2; dd++) {
                ddl_dtype dt  = dd ? DDL_F64 : DDL_F32;
                size_t    wsb = ddl_conv_workspace_bytes(dt, &g);
                ASSERT_TRUE(ddl_cvec_taken(dt, &g, wsb, false) &&
                            ddl_cvec_taken(dt, &g, wsb, true));
                ASSERT_TRUE(!ddl_cvec_taken(dt, &h, ddl_conv_workspace_bytes(dt, &h), false));
                ddl_cvec_set(false);
                ASSERT_TRUE(!ddl_cvec_taken(dt, &g, wsb, false));
                ddl_cvec_set(true);
            }
        }
    }
    // A 4x4x4 output of a 64^3 input (stride 16): its padded copies (two of 64 MiB)
    // would pass DDL_CDIR_MAX_SLOT, so another path takes it.
    ddl_conv_geom big;
    ASSERT_OK(ddl_conv_geom_init(&big, 3, 1, 64, 64, (int64_t[]){64, 64, 64}, (int64_t[]){1, 1, 1},
                                 (int64_t[]){16, 16, 16}, NULL, NULL));
    ASSERT_TRUE(!ddl_cvec_taken(DDL_F32, &big, SIZE_MAX, false));
    ASSERT_TRUE(ddl_conv_workspace_bytes(DDL_F32, &big) < DDL_CDIR_MAX_SLOT);
    ddl_cdir_set(-1);
}

// Values worked out by hand: a 1-D cross-correlation (not flipped) with stride and padding.
static void test_hand(void)
{
    ddl_conv_geom g;
    ASSERT_OK(ddl_conv_geom_init(&g, 1, 1, 1, 1, (int64_t[]){5}, (int64_t[]){3},
                                 (int64_t[]){2}, (int64_t[]){1}, NULL));
    ASSERT_EQ(g.out[0], 3);
    double x[5] = {1, 2, 3, 4, 5}, w[3] = {1, 0, -1}, b[1] = {0.5}, y[3];
    // y[o] = x[2o-1] - x[2o+1] + 0.5 with x = 0 outside [0, 5). Without its workspace the
    // call is refused.
    ASSERT_STATUS(ddl_conv_forward(DDL_F64, &g, y, x, w, b, NULL, 0), DDL_EINVAL);
    size_t wsb = ddl_conv_workspace_bytes(DDL_F64, &g);
    void  *ws  = malloc(wsb);
    ASSERT_OK(ddl_conv_forward(DDL_F64, &g, y, x, w, b, ws, wsb));
    ASSERT_EQ(y[0] * 2, -3);
    ASSERT_EQ(y[1] * 2, -3);
    ASSERT_EQ(y[2] * 2, 9);
    // dx = conv^T(dy): dx[i] = sum_o dy[o] w[i - 2o + 1] (w index in [0, 3)).
    double dy[3] = {1, 10, 100}, dx[5] = {0}, dw[3] = {0}, db[1] = {0};
    ASSERT_OK(ddl_conv_backward(DDL_F64, &g, dx, dw, db, dy, x, w, ws, wsb));
    const double dx_want[5] = {0, -1 + 10, 0, -10 + 100, 0};
    for (int i = 0; i < 5; i++) {
        ASSERT_EQ(dx[i], dx_want[i]);
    }
    // dw[k] = sum_o dy[o] x[2o - 1 + k]: {0*1 + 2*10 + 4*100, 1 + 30 + 500, 2 + 40 + 0}.
    ASSERT_EQ(dw[0], 420);
    ASSERT_EQ(dw[1], 531);
    ASSERT_EQ(dw[2], 42);
    ASSERT_EQ(db[0], 111);
    free(ws);
}

static void test_errors(void)
{
    ddl_conv_geom g;
    const int64_t in[3] = {4, 4, 4}, k3[3] = {3, 3, 3};
    // Window larger than the padded input (k=7, pad 1, in 4).
    ASSERT_STATUS(ddl_conv_geom_init(&g, 1, 1, 1, 1, in, (int64_t[]){7}, NULL, (int64_t[]){1},
                                     NULL),
                  DDL_EINVAL);
    // Dilation makes the window too large (d=3: extent 7).
    ASSERT_STATUS(ddl_conv_geom_init(&g, 1, 1, 1, 1, in, k3, NULL, NULL, (int64_t[]){3}),
                  DDL_EINVAL);
    ASSERT_STATUS(ddl_conv_geom_init(&g, 2, 1, 1, 1, in, k3, (int64_t[]){1, 0}, NULL, NULL),
                  DDL_EINVAL);
    ASSERT_STATUS(ddl_conv_geom_init(&g, 2, 1, 1, 1, in, k3, NULL, (int64_t[]){0, -1}, NULL),
                  DDL_EINVAL);
    ASSERT_STATUS(ddl_conv_geom_init(&g, 4, 1, 1, 1, in, k3, NULL, NULL, NULL), DDL_EINVAL);
    ASSERT_STATUS(ddl_conv_geom_init(&g, 1, -1, 1, 1, in, k3, NULL, NULL, NULL), DDL_EINVAL);
    ASSERT_STATUS(ddl_conv_geom_init(&g, 1, 1, 1, 1, (int64_t[]){0}, k3, NULL, NULL, NULL),
                  DDL_EINVAL);
    ASSERT_STATUS(ddl_conv_geom_init(&g, 1, 1, 1, 1, in, (int64_t[]){0}, NULL, NULL, NULL),
                  DDL_EINVAL);

    // A valid geometry with too little workspace, or edited behind the API, is refused.
    // With the direct path off the query is the im2col path's exact need; with it on, a
    // workspace too small for both paths is refused (one too small for the direct path
    // alone takes the im2col path).
    ASSERT_OK(ddl_conv_geom_init(&g, 3, 2, 2, 2, in, k3, NULL, (int64_t[]){1, 1, 1}, NULL));
    ddl_cdir_set(0);
    size_t wsb = ddl_conv_workspace_bytes(DDL_F32, &g);
    ASSERT_TRUE(wsb > 0);
    ASSERT_TRUE(ddl_conv_workspace_bytes(DDL_F64, &g) > wsb);
    float *buf = calloc(4096, sizeof(float));
    void  *ws  = malloc(wsb);
    ASSERT_STATUS(ddl_conv_forward(DDL_F32, &g, buf, buf, buf, NULL, ws, wsb - 1), DDL_EINVAL);
    ddl_cdir_set(-1);
    ASSERT_STATUS(ddl_conv_forward(DDL_F32, &g, buf, buf, buf, NULL, ws, 64), DDL_EINVAL);
    ASSERT_STATUS(ddl_conv_backward(DDL_F32, &g, buf, NULL, NULL, buf, buf, buf, NULL, wsb),
                  DDL_EINVAL);
    ddl_conv_geom bad = g;
    bad.out[0]        = 5;
    ASSERT_STATUS(ddl_conv_forward(DDL_F32, &bad, buf, buf, buf, NULL, ws, wsb), DDL_EINVAL);
    ASSERT_STATUS(ddl_conv_forward((ddl_dtype)9, &g, buf, buf, buf, NULL, ws, wsb), DDL_EINVAL);
    // A negative tail past x (x_tail) is refused by every call, the message naming it; the
    // queries answer 0 (no workspace, nothing read in place).
    bad        = g;
    bad.x_tail = -1;
    ASSERT_STATUS(ddl_conv_forward(DDL_F32, &bad, buf, buf, buf, NULL, ws, wsb), DDL_EINVAL);
    ASSERT_TRUE(strstr(ddl_last_error(), "x_tail") != NULL);
    ddl_clear_error();
    ASSERT_STATUS(ddl_conv_backward(DDL_F32, &bad, buf, buf, NULL, buf, buf, buf, ws, wsb),
                  DDL_EINVAL);
    ddl_clear_error();
    ASSERT_EQ(ddl_conv_workspace_bytes(DDL_F32, &bad), 0);
    ddl_clear_error();
    ASSERT_EQ(ddl_conv_x_tail_need(DDL_F32, &bad), 0);

    // 1x1, stride 1, unpadded needs no workspace; zero batch and zero input channels work.
    ASSERT_OK(ddl_conv_geom_init(&g, 2, 1, 3, 2, in, (int64_t[]){1, 1}, NULL, NULL, NULL));
    ASSERT_EQ(ddl_conv_workspace_bytes(DDL_F64, &g), 0);
    ASSERT_OK(ddl_conv_geom_init(&g, 2, 0, 3, 2, in, k3, NULL, NULL, NULL));
    ASSERT_OK(ddl_conv_forward(DDL_F64, &g, NULL, NULL, NULL, NULL, NULL, 0));
    ASSERT_OK(ddl_conv_geom_init(&g, 1, 1, 0, 2, in, k3, NULL, NULL, NULL)); // y [1, 2, 2]
    double b[2] = {3, 4}, y[4] = {9, 9, 9, 9}, dy[4] = {1, 2, 3, 4}, db[2] = {0};
    ASSERT_OK(ddl_conv_forward(DDL_F64, &g, y, NULL, NULL, b, NULL, 0));
    ASSERT_EQ(y[0], 3);
    ASSERT_EQ(y[1], 3);
    ASSERT_EQ(y[2], 4);
    ASSERT_EQ(y[3], 4);
    ASSERT_OK(ddl_conv_backward(DDL_F64, &g, NULL, NULL, db, dy, NULL, NULL, NULL, 0));
    ASSERT_EQ(db[0], 1 + 2);
    ASSERT_EQ(db[1], 3 + 4);
    free(buf);
    free(ws);
}

// The wide layout reads x at positions past each output row ("garbage" columns whose
// dy is 0), and in 3-D at the rows past each output plane. With an inf in x there, dW must
// still be exactly what the direct loops give (+inf where the inf is reached with dy > 0,
// finite elsewhere), never 0 * inf = NaN. x [3, 2, in], w [3, 2, k], stride s (NULL: 1),
// no padding; the inf at element inf_at of x.
static void run_nonfinite_case(int nsp, const int64_t *in, const int64_t *k, const int64_t *s,
                               int64_t inf_at)
{
    ddl_conv_geom g;
    ASSERT_OK(ddl_conv_geom_init(&g, nsp, 3, 2, 3, in, k, s, NULL, NULL));
    const int64_t nx = 3 * 2 * g.in[0] * g.in[1] * g.in[2];
    const int64_t ny = 3 * 3 * g.out[0] * g.out[1] * g.out[2];
    const int64_t nw = 3 * 2 * g.k[0] * g.k[1] * g.k[2];
    for (int d = 0; d < 2; d++) {
        ddl_dtype dt  = d ? DDL_F64 : DDL_F32;
        double   *x   = rand_vec(nx, 77), *one = malloc((size_t)ny * sizeof(double));
        x[inf_at] = INFINITY;
        for (int64_t i = 0; i < ny; i++) {
            one[i] = 1.0;
        }
        void  *xd = ddl_test_as_dtype(dt, x, nx), *dyd = ddl_test_as_dtype(dt, one, ny);
        void  *dw = zeros(dt, nw), *dwr = zeros(dt, nw);
        size_t wsb = ddl_conv_workspace_bytes(dt, &g);
        void  *ws  = malloc(wsb > 0 ? wsb : 1);
        ASSERT_OK(ddl_conv_backward(dt, &g, NULL, dw, NULL, dyd, xd, NULL, ws, wsb));
        ASSERT_OK(ddl_conv_backward_naive(dt, &g, NULL, dwr, NULL, dyd, xd, NULL));
        for (int64_t i = 0; i < nw; i++) {
            double a = ddl_test_at(dt, dw, i), b = ddl_test_at(dt, dwr, i);
            ASSERT_TRUE(!isnan(a) && isinf(a) == isinf(b));
        }
        free(x), free(one), free(xd), free(dyd), free(dw), free(dwr), free(ws);
    }
}

static void test_wide_nonfinite(void)
{
    // 2-D: sample 0, channel 1, row 2, the last column (read by the garbage columns).
    run_nonfinite_case(2, (int64_t[]){6, 7}, (int64_t[]){3, 3}, NULL, 1 * 42 + 2 * 7 + 6);
    // Stride 2 along the rows (the direct path's phase layout): 9 columns give 4 outputs
    // and a garbage column whose tap k2 = 0 reads column 8, which the valid outputs reach
    // with k2 = 2 only; the inf at sample 0, channel 1, row 2, column 8.
    run_nonfinite_case(2, (int64_t[]){6, 9}, (int64_t[]){3, 3}, (int64_t[]){1, 2},
                       1 * 54 + 2 * 9 + 8);
    // 3-D: sample 0, channel 1, plane 2, the last row, column 1: read with k1 = 0 only by
    // the garbage row past the output rows of plane 2 - k0 (k1 = 0 never reaches it from
    // a valid row), so an unmasked grid would give NaN where the loops give a finite dW.
    run_nonfinite_case(3, (int64_t[]){5, 6, 7}, (int64_t[]){3, 3, 3}, NULL,
                       1 * 210 + 2 * 42 + 5 * 7 + 1);
}

// The block loop split over threads (BLAS thread count 2): the same results as one thread
// and the direct loops within the usual tolerances, bitwise identical from run to run,
// accumulating on top of existing gradients, and a workspace sized for one thread still
// accepted (the kernels then fall back to fewer threads). Cases: several samples per
// block (stride 2), samples split into pieces (3-D), the wide layout (LeNet's conv2).
static void run_threads_case(const conv_case *cc, uint64_t seed)
{
    ddl_conv_geom g;
    ASSERT_OK(ddl_conv_geom_init(&g, cc->nsp, cc->N, cc->Ci, cc->Co, cc->in, cc->k, cc->s,
                                 cc->p, cc->d));
    int64_t kv = g.k[0] * g.k[1] * g.k[2];
    int64_t nx = g.N * g.C_in * g.in[0] * g.in[1] * g.in[2];
    int64_t ny = g.N * g.C_out * g.out[0] * g.out[1] * g.out[2];
    int64_t nw = g.C_out * g.C_in * kv, nb = g.C_out;
    double *x = rand_vec(nx, seed), *w = rand_vec(nw, seed + 1), *b = rand_vec(nb, seed + 2);
    double *r = rand_vec(ny, seed + 3), *dx0 = rand_vec(nx, seed + 4);
    double *dw0 = rand_vec(nw, seed + 5), *db0 = rand_vec(nb, seed + 6);
    // References in f64, accumulating on top of dx0, dw0, db0.
    double *yr = zeros(DDL_F64, ny), *dxr = malloc((size_t)nx * sizeof(double));
    double *dwr = malloc((size_t)nw * sizeof(double)), *dbr = malloc((size_t)nb * sizeof(double));
    memcpy(dxr, dx0, (size_t)nx * sizeof(double));
    memcpy(dwr, dw0, (size_t)nw * sizeof(double));
    memcpy(dbr, db0, (size_t)nb * sizeof(double));
    ASSERT_OK(ddl_conv_forward_naive(DDL_F64, &g, yr, x, w, b));
    ASSERT_OK(ddl_conv_backward_naive(DDL_F64, &g, dxr, dwr, dbr, r, x, w));
    int prev = ddl_blas_set_threads(1);
    for (int d = 0; d < 2; d++) {
        ddl_dtype dt  = d ? DDL_F64 : DDL_F32;
        double    tol = d ? 1e-12 : 1e-4;
        size_t    es  = ddl_dtype_size(dt);
        void *xd = ddl_test_as_dtype(dt, x, nx), *wd = ddl_test_as_dtype(dt, w, nw), *bd = ddl_test_as_dtype(dt, b, nb);
        void *rd = ddl_test_as_dtype(dt, r, ny);
        ddl_blas_set_threads(1);
        size_t ws1 = ddl_conv_workspace_bytes(dt, &g);
        ddl_blas_set_threads(2);
        size_t ws2 = ddl_conv_workspace_bytes(dt, &g);
        ASSERT_TRUE(ws2 > ws1); // room for a second thread: the threaded path is taken
        void *ws = malloc(ws2);
        // Runs 0 and 1 with 2 threads, run 2 with 1 thread, run 3 with 2 threads but the
        // one-thread workspace.
        void *y[4], *dx[4], *dw[4], *db[4];
        for (int run = 0; run < 4; run++) {
            ddl_blas_set_threads(run == 2 ? 1 : 2);
            size_t wsb = run < 2 ? ws2 : ws1;
            y[run]     = zeros(dt, ny);
            dx[run] = ddl_test_as_dtype(dt, dx0, nx), dw[run] = ddl_test_as_dtype(dt, dw0, nw);
            db[run] = ddl_test_as_dtype(dt, db0, nb);
            memset(ws, 0xff, ws2); // scratch contents must not matter
            ASSERT_OK(ddl_conv_forward(dt, &g, y[run], xd, wd, bd, ws, wsb));
            memset(ws, 0xff, ws2);
            ASSERT_OK(ddl_conv_backward(dt, &g, dx[run], dw[run], db[run], rd, xd, wd, ws, wsb));
            ASSERT_EQ(ddl_blas_set_threads(0), run == 2 ? 1 : 2); // restored
            ASSERT_LE(ddl_test_rel_err(yr, dt, y[run], ny), tol);
            ASSERT_LE(ddl_test_rel_err(dxr, dt, dx[run], nx), tol);
            ASSERT_LE(ddl_test_rel_err(dwr, dt, dw[run], nw), tol);
            ASSERT_LE(ddl_test_rel_err(dbr, dt, db[run], nb), tol);
        }
        // Two 2-thread runs agree bit for bit.
        ASSERT_TRUE(memcmp(y[0], y[1], (size_t)ny * es) == 0);
        ASSERT_TRUE(memcmp(dx[0], dx[1], (size_t)nx * es) == 0);
        ASSERT_TRUE(memcmp(dw[0], dw[1], (size_t)nw * es) == 0);
        ASSERT_TRUE(memcmp(db[0], db[1], (size_t)nb * es) == 0);
        // 2 threads against 1 thread: the same sums up to rounding.
        int64_t nmax = nx > nw ? nx : nw;
        nmax         = nmax > ny ? nmax : ny;
        for (int run = 0; run < 4; run += 3) {
            double *ref = malloc((size_t)nmax * sizeof(double));
            for (int64_t i = 0; i < ny; i++) {
                ref[i] = ddl_test_at(dt, y[2], i);
            }
            ASSERT_LE(ddl_test_rel_err(ref, dt, y[run], ny), tol);
            for (int64_t i = 0; i < nx; i++) {
                ref[i] = ddl_test_at(dt, dx[2], i);
            }
            ASSERT_LE(ddl_test_rel_err(ref, dt, dx[run], nx), tol);
            for (int64_t i = 0; i < nw; i++) {
                ref[i] = ddl_test_at(dt, dw[2], i);
            }
            ASSERT_LE(ddl_test_rel_err(ref, dt, dw[run], nw), tol);
            free(ref);
        }
        ddl_blas_set_threads(2); // the parts set their own samples
        check_dx_set(dt, &g, rd, xd, wd, ws, ws2);
        for (int run = 0; run < 4; run++) {
            free(y[run]), free(dx[run]), free(dw[run]), free(db[run]);
        }
        free(ws), free(xd), free(wd), free(bd), free(rd);
    }
    ddl_blas_set_threads(prev);
    free(x), free(w), free(b), free(r), free(dx0), free(dw0), free(db0), free(yr), free(dxr),
        free(dwr), free(dbr);
}

static void test_threads(void)
{
    // clang-format off
    const conv_case cases[] = {
        // nsp N Ci Co in            k          s          p          d          bias
        {2, 8, 8, 16, {32, 32},     {3, 3},    {2, 2},    {1, 1},    {1, 1},    true},  // nb > 1
        {3, 3, 4, 4, {16, 16, 16},  {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1}, true},  // pieces
        {2, 16, 6, 16, {14, 14},    {5, 5},    {1, 1},    {0, 0},    {1, 1},    true},  // wide
        {2, 8, 16, 16, {16, 16},    {3, 3},    {1, 1},    {1, 1},    {1, 1},    true},  // C_in 16
        {2, 12, 16, 32, {8, 8},     {3, 3},    {1, 1},    {1, 1},    {1, 1},    true},  // ddl_cvec
    };
    // clang-format on
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        run_threads_case(&cases[i], 5000 + 10 * i);
    }
}

// The direct path for few input channels (kernels/conv_direct.h), at both vector widths,
// against the im2col + GEMM path on the same data: within rounding, and bit for bit from
// run to run; and a
// workspace sized while it was off still serves when it is on (the query covers both).
static void test_direct_vs_gemm(void)
{
    ddl_cdir_set(1);
    if (!ddl_cdir_enabled()) {
        printf("test_conv: CPU without AVX2/FMA, direct path not tested\n");
        ddl_cdir_set(-1);
        return;
    }
    // LeNet's conv1 shape, N = 5, a 1-D case with dilation, a 3-D case, ResNet's strided
    // convolutions: 3x3 stride 2 (padding 1) and the 1x1 stride-2 shortcut, a 4x4 plane
    // (ResNet's last stage, its grid twice its outputs: direct both ways), and an
    // unpadded 4x4 plane (a split rank's block of it: a grid 8 times its 4 outputs),
    // whose backward takes the GEMM path while its forward stays direct.
    // {nsp, N, Ci, Co, in, k, stride, pad}
    ddl_conv_geom g;
    const int64_t shapes[7][8] = {{2, 5, 1, 6, 28, 5, 1, 2},  {1, 7, 3, 4, 23, 4, 1, 2},
                                  {3, 2, 4, 5, 10, 3, 1, 2},  {2, 3, 8, 16, 28, 3, 2, 1},
                                  {2, 3, 8, 16, 28, 1, 2, 0}, {2, 3, 8, 8, 4, 3, 1, 1},
                                  {2, 3, 8, 8, 4, 3, 1, 0}};
    for (int s = 0; s < 7; s++) {
        const int64_t *c     = shapes[s];
        int64_t        in[3] = {c[4], c[4], c[4]}, k[3] = {c[5], c[5], c[5]};
        int64_t        st[3] = {c[6], c[6], c[6]}, p[3] = {c[7], c[7], c[7]}, d[3] = {1, 2, 1};
        ASSERT_OK(
            ddl_conv_geom_init(&g, (int)c[0], c[1], c[2], c[3], in, k, st, p, s == 1 ? d : NULL));
        int64_t ov = g.out[0] * g.out[1] * g.out[2], iv = g.in[0] * g.in[1] * g.in[2];
        int64_t nx = g.N * g.C_in * iv, ny = g.N * g.C_out * ov;
        int64_t nw = g.C_out * g.C_in * g.k[0] * g.k[1] * g.k[2];
        double *x = rand_vec(nx, 91), *w = rand_vec(nw, 92), *r = rand_vec(ny, 93);
        for (int dd = 0; dd < 2; dd++) {
            ddl_dtype dt  = dd ? DDL_F64 : DDL_F32;
            double    tol = dd ? 1e-12 : 1e-5;
            size_t    es  = ddl_dtype_size(dt);
            void *xd = ddl_test_as_dtype(dt, x, nx), *wd = ddl_test_as_dtype(dt, w, nw);
            void *rd = ddl_test_as_dtype(dt, r, ny);
            // A workspace sized with the direct path off: the im2col path's block covers
            // the direct one's slot, except on the 4x4 planes, whose im2col workspace is
            // smaller; those are sized with the path on (else every call takes GEMM).
            ddl_cdir_set(s >= 5 ? 2 : 0);
            size_t wsb = ddl_conv_workspace_bytes(dt, &g);
            void  *ws  = malloc(wsb);
            // 0: GEMM; 1 and 2: the widest direct kernels; 3: AVX2 (capped by the CPU).
            const int level[4] = {0, 2, 2, 1};
            void     *y[4], *dx[4], *dw[4];
            for (int run = 0; run < 4; run++) {
                ddl_cdir_set(level[run]);
                y[run] = zeros(dt, ny), dx[run] = zeros(dt, nx), dw[run] = zeros(dt, nw);
                memset(ws, 0xff, wsb);
                ASSERT_OK(ddl_conv_forward(dt, &g, y[run], xd, wd, NULL, ws, wsb));
                ASSERT_OK(ddl_conv_backward(dt, &g, dx[run], dw[run], NULL, rd, xd, wd, ws, wsb));
            }
            ASSERT_TRUE(memcmp(y[1], y[2], (size_t)ny * es) == 0);
            ASSERT_TRUE(memcmp(dx[1], dx[2], (size_t)nx * es) == 0);
            ASSERT_TRUE(memcmp(dw[1], dw[2], (size_t)nw * es) == 0);
            // Which path ran (the bits cannot tell: on such short sums the direct
            // kernels and the GEMM can add in the same order): direct but for the 1x1
            // stride-2 shortcut (one phase of four read) and the unpadded 4x4 plane's
            // backward.
            // Where the channel counts are whole vectors (f64 at AVX-512, or AVX2), the
            // channel-vector kernels take the small planes instead (test_cvec checks them).
            ddl_cdir_set(2); // the widest the CPU has, whatever DDL_CONV_DIRECT says
            bool cv = ddl_cvec_taken(dt, &g, wsb, false);
            ASSERT_TRUE(cv == ddl_cvec_taken(dt, &g, wsb, true));
            ASSERT_TRUE(!cv ||
                        (g.C_in % ddl_cvec_lanes(dt) == 0 && g.C_out % ddl_cvec_lanes(dt) == 0));
            ASSERT_TRUE(cv || ddl_cdir_taken(dt, &g, wsb, false) == (s != 4));
            ASSERT_TRUE(cv || ddl_cdir_taken(dt, &g, wsb, true) == (s != 4 && s != 6));
            double *ref = malloc((size_t)(nx + ny + nw) * sizeof(double));
            void   *want[3] = {y[0], dx[0], dw[0]};
            int64_t cnt[3]  = {ny, nx, nw};
            for (int run = 1; run < 4; run += 2) {
                void *got[3] = {y[run], dx[run], dw[run]};
                for (int q = 0; q < 3; q++) {
                    for (int64_t i = 0; i < cnt[q]; i++) {
                        ref[i] = ddl_test_at(dt, want[q], i);
                    }
                    ASSERT_LE(ddl_test_rel_err(ref, dt, got[q], cnt[q]), tol);
                }
            }
            free(ref);
            for (int run = 0; run < 4; run++) {
                free(y[run]), free(dx[run]), free(dw[run]);
            }
            free(ws), free(xd), free(wd), free(rd);
        }
        free(x), free(w), free(r);
    }
    ddl_cdir_set(-1);
}

// Groups of samples (ddl_cdir_dw's and ddl_cdir_forward's ns, conv_plan_make): the direct
// path sums the dW of up to ddl_cdir_dw_group() samples per kernel call where a sample's
// grid is short next to the accumulators, and its forward fills a tile with several
// samples' grids. Every output is bit for bit the one of one sample per call
// (the group set to 1), at both widths, f32 and f64, with 1 and 2 threads, padded (the
// group's xp copies) and read in place (x's samples themselves), with a last group
// shorter than the others; and the group is in use (the workspace holds its copies).
static void test_dw_groups(void)
{
    bool cv_prev = ddl_cvec_set(false); // the kernels of conv_direct_t.h on these planes
    // {N, Ci, Co, in, pad}: ResNet's 7x7 stage at 8 channels (the AVX2 width's limit) and
    // at 32 (AVX-512 only), 3x3 kernels; an unpadded 9x9 read in place; a 4x4 plane, whose
    // grid (32 positions) is shorter than the AVX-512 forward's tile, so that the forward
    // fills its tiles with the vectors of several samples.
    const int64_t shapes[4][5] = {
        {7, 8, 8, 7, 1}, {7, 32, 32, 7, 1}, {5, 8, 16, 9, 0}, {7, 8, 8, 4, 1}};
    for (int s = 0; s < 4; s++) {
        const int64_t *c = shapes[s];
        ddl_conv_geom  g;
        ASSERT_OK(ddl_conv_geom_init(&g, 2, c[0], c[1], c[2], (int64_t[]){c[3], c[3]},
                                     (int64_t[]){3, 3}, NULL, (int64_t[]){c[4], c[4]}, NULL));
        int64_t iv = c[3] * c[3], ov = g.out[0] * g.out[1];
        int64_t nx = g.N * g.C_in * iv, ny = g.N * g.C_out * ov, nw = g.C_out * g.C_in * 9;
        double *x = rand_vec(nx, 31), *w = rand_vec(nw, 32), *r = rand_vec(ny, 33);
        for (int level = 1; level <= 2; level++) {
            ddl_cdir_set(level);
            if (ddl_cdir_level() != level || (level == 1 && g.C_in > DDL_CDIR_MAX_CIN)) {
                continue; // the CPU lacks the width, or the width does not take this case
            }
            for (int dd = 0; dd < 2; dd++) {
                ddl_dtype dt = dd ? DDL_F64 : DDL_F32;
                size_t    es = ddl_dtype_size(dt);
                g.x_tail     = c[4] == 0 ? ddl_conv_x_tail_need(dt, &g) : 0;
                ASSERT_TRUE(c[4] != 0 || g.x_tail > 0);
                // x with room for the tail the in-place path reads.
                void *xd = ddl_test_as_dtype(dt, x, nx);
                void *xt = zeros(dt, nx + g.x_tail);
                memcpy(xt, xd, (size_t)nx * es);
                void *wd = ddl_test_as_dtype(dt, w, nw), *rd = ddl_test_as_dtype(dt, r, ny);
                for (int threads = 1; threads <= 2; threads++) {
                    int     prev_t = ddl_blas_set_threads(threads);
                    void   *y[2], *dx[2], *dw[2];
                    size_t  wsb[2];
                    int64_t group[2];
                    for (int run = 0; run < 2; run++) {
                        ddl_cdir_set_dw_group(run == 0 ? 1 : 0); // 1, then the default
                        wsb[run] = ddl_conv_workspace_bytes(dt, &g);
                        void *ws = malloc(wsb[run]);
                        memset(ws, 0xff, wsb[run]);
                        ASSERT_TRUE(ddl_cdir_taken(dt, &g, wsb[run], true));
                        group[run] = ddl_cdir_dw_group_of(dt, &g, wsb[run]);
                        y[run] = zeros(dt, ny), dx[run] = zeros(dt, nx), dw[run] = zeros(dt, nw);
                        ASSERT_OK(ddl_conv_forward(dt, &g, y[run], xt, wd, NULL, ws, wsb[run]));
                        ASSERT_OK(ddl_conv_backward(dt, &g, dx[run], dw[run], NULL, rd, xt, wd, ws,
                                                    wsb[run]));
                        free(ws);
                    }
                    ddl_cdir_set_dw_group(0);
                    ddl_blas_set_threads(prev_t);
                    // The default groups these samples (N / 2 at most), the last group
                    // shorter than the others.
                    ASSERT_TRUE(group[0] == 1 && group[1] >= 2 && group[1] <= g.N / 2);
                    ASSERT_TRUE(g.N % group[1] != 0);
                    ASSERT_TRUE(memcmp(y[0], y[1], (size_t)ny * es) == 0);
                    ASSERT_TRUE(memcmp(dx[0], dx[1], (size_t)nx * es) == 0);
                    ASSERT_TRUE(memcmp(dw[0], dw[1], (size_t)nw * es) == 0);
                    for (int run = 0; run < 2; run++) {
                        free(y[run]), free(dx[run]), free(dw[run]);
                    }
                }
                free(xd), free(xt), free(wd), free(rd);
            }
        }
        free(x), free(w), free(r);
    }
    ddl_cdir_set(-1);
    ddl_cvec_set(cv_prev);
}

// Reading x in place (ddl_conv_geom.x_tail): without padding or strides the direct path
// can read the sample itself instead of a padded copy. With the tail it asks for, every
// result is bit for bit the one of the padded copy (the garbage positions it reads past
// each plane, in the next channel or sample or the tail, are masked or discarded), with 1
// and 2 threads, whatever the tail holds (NaN, inf); the workspace is smaller by the copy;
// dx overlapping x in a call that also computes dw is refused, dx alone over x is not.
// At direct-path width `level` (capped by the CPU's).
static void test_in_place(int level)
{
    // {nsp, N, Ci, Co, in, k, dilation}: U-Net-like 3-D, LeNet-like 2-D, 1-D dilated;
    // samples large enough for the direct path's slot to outweigh the im2col block.
    const int64_t shapes[3][7] = {
        {3, 2, 4, 5, 40, 3, 1}, {2, 3, 2, 6, 300, 5, 1}, {1, 3, 3, 4, 100000, 3, 2}};
    int prev = ddl_blas_set_threads(1);
    for (int s = 0; s < 3; s++) {
        const int64_t *c     = shapes[s];
        int64_t        in[3] = {c[4], c[4], c[4]}, k[3] = {c[5], c[5], c[5]};
        int64_t        d[3] = {c[6], c[6], c[6]};
        ddl_conv_geom  g0, g1;
        ASSERT_OK(ddl_conv_geom_init(&g0, (int)c[0], c[1], c[2], c[3], in, k, NULL, NULL, d));
        g1         = g0;
        int64_t ov = g0.out[0] * g0.out[1] * g0.out[2], iv = g0.in[0] * g0.in[1] * g0.in[2];
        int64_t nx = g0.N * g0.C_in * iv, ny = g0.N * g0.C_out * ov;
        int64_t nw = g0.C_out * g0.C_in * g0.k[0] * g0.k[1] * g0.k[2];
        double *x = rand_vec(nx, 31), *w = rand_vec(nw, 32), *r = rand_vec(ny, 33);
        for (int dd = 0; dd < 2; dd++) {
            ddl_dtype dt = dd ? DDL_F64 : DDL_F32;
            size_t    es = ddl_dtype_size(dt);
            ddl_cdir_set(0);
            ASSERT_EQ(ddl_conv_x_tail_need(dt, &g0), 0); // the im2col path copies anyway
            ddl_cdir_set(level);
            if (!ddl_cdir_enabled()) {
                continue;
            }
            int64_t tail = ddl_conv_x_tail_need(dt, &g0);
            ASSERT_TRUE(tail > 0 && tail <= (g0.k[g0.nsp - 1] - 1) * g0.d[g0.nsp - 1] + 31);
            g1.x_tail = tail;
            for (int T = 1; T <= 2; T++) {
                ddl_blas_set_threads(T);
                size_t wa = ddl_conv_workspace_bytes(dt, &g0),
                       wb = ddl_conv_workspace_bytes(dt, &g1);
                ASSERT_TRUE(ddl_cdir_taken(dt, &g1, wb, false) &&
                            ddl_cdir_taken(dt, &g1, wb, true));
                // Smaller by at least one padded copy of a sample (C_in planes), less
                // what only the in-place slots hold: dx's own tap offsets (Kc of them,
                // rounded to DDL_ALIGN), one slot per thread.
                size_t taps = (size_t)(g0.C_in * g0.k[0] * g0.k[1] * g0.k[2]) * sizeof(int64_t);
                ASSERT_TRUE(wb + (size_t)(g0.C_in * iv) * es <=
                            wa + (size_t)T * (taps + DDL_ALIGN));
                g1.x_tail = tail - 1; // one short: the copy again
                ASSERT_EQ(ddl_conv_workspace_bytes(dt, &g1), wa);
                g1.x_tail = tail;
                void *xd = ddl_test_as_dtype(dt, x, nx), *wd = ddl_test_as_dtype(dt, w, nw);
                void *rd = ddl_test_as_dtype(dt, r, ny);
                // x with its tail: NaN, then inf, then -inf.
                char *xt = malloc((size_t)(nx + tail) * es);
                memcpy(xt, xd, (size_t)nx * es);
                for (int64_t i = 0; i < tail; i++) {
                    double v = i % 3 == 0 ? NAN : i % 3 == 1 ? INFINITY : -INFINITY;
                    if (dt == DDL_F32) {
                        ((float *)(void *)xt)[nx + i] = (float)v;
                    } else {
                        ((double *)(void *)xt)[nx + i] = v;
                    }
                }
                void *ws = malloc(wa);
                void *y[2], *dx[2], *dw[2];
                for (int run = 0; run < 2; run++) {
                    const ddl_conv_geom *g   = run ? &g1 : &g0;
                    size_t               wsb = run ? wb : wa;
                    y[run] = zeros(dt, ny), dx[run] = zeros(dt, nx), dw[run] = zeros(dt, nw);
                    memset(ws, 0xff, wa);
                    ASSERT_OK(ddl_conv_forward(dt, g, y[run], run ? xt : xd, wd, NULL, ws, wsb));
                    memset(ws, 0xff, wa);
                    ASSERT_OK(ddl_conv_backward(dt, g, dx[run], dw[run], NULL, rd, run ? xt : xd,
                                                wd, ws, wsb));
                }
                ASSERT_TRUE(memcmp(y[0], y[1], (size_t)ny * es) == 0);
                ASSERT_TRUE(memcmp(dx[0], dx[1], (size_t)nx * es) == 0);
                ASSERT_TRUE(memcmp(dw[0], dw[1], (size_t)nw * es) == 0);
                // dx over x: refused with dw, computed alone (the layers' two calls).
                ASSERT_EQ(ddl_conv_backward(dt, &g1, xt, dw[1], NULL, rd, xt, wd, ws, wb),
                          DDL_EINVAL);
                ddl_clear_error();
                memset(xt, 0, (size_t)nx * es);
                ASSERT_OK(ddl_conv_backward(dt, &g1, xt, NULL, NULL, rd, NULL, wd, ws, wb));
                ASSERT_TRUE(memcmp(xt, dx[0], (size_t)nx * es) == 0);
                for (int run = 0; run < 2; run++) {
                    free(y[run]), free(dx[run]), free(dw[run]);
                }
                free(ws), free(xt), free(xd), free(wd), free(rd);
            }
            g1.x_tail = 0;
        }
        free(x), free(w), free(r);
    }
    ddl_blas_set_threads(prev);
}

int main(void)
{
    test_hand();
    test_errors();
    // Every case with the direct path for few input channels at each vector width the CPU
    // has (AVX-512, AVX2), then with the im2col + GEMM path alone.
    for (int level = 2; level >= 0; level--) {
        ddl_cdir_set(level);
        test_cases();
        test_wide_nonfinite();
        test_threads();
    }
    ddl_cdir_set(-1);
    test_direct_vs_gemm();
    test_cvec_taken();
    test_dw_groups();
    for (int level = 2; level >= 1; level--) {
        test_in_place(level); // at each vector width the CPU has
    }
    ddl_cdir_set(-1);
    printf("test_conv: ok\n");
    return 0;
}
