// tests/kernels/test_pool.c: 1-D/2-D/3-D max and average pooling against an independent
// reference (explicit -inf / zero padding, then plain window loops), in f64 and f32; the
// backward against central finite differences (f64, tie-free inputs) and the reference
// adjoint; accumulation, PyTorch's defaults and rules, NaN and all-padding windows.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ddl/base.h"
#include "ddl/kernels.h"
#include "gradcheck.h"
#include "kernel_util.h"
#include "test.h"

// ---- helpers -----------------------------------------------------------------

// n distinct values (no ties anywhere): a permutation of 0..n-1 scaled into [-1, 1), the
// gaps (2 / n) far larger than the finite-difference step. Exactly representable in f32.
static double *distinct_vec(int64_t n, uint64_t seed)
{
    double  *v = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    uint64_t m = 7919 + 2 * (seed % 50); // odd multiplier; retried until coprime with n
    while (n > 0) {
        uint64_t a = m, b = (uint64_t)n;
        while (b != 0) {
            uint64_t t = a % b;
            a          = b;
            b          = t;
        }
        if (a == 1) {
            break;
        }
        m += 2;
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t q = (int64_t)(((uint64_t)i * m + seed) % (uint64_t)n);
        v[i]      = (double)(float)(2.0 * (double)q / (double)n - 1.0);
    }
    return v;
}

static double *rand_vec(int64_t n, uint64_t seed)
{
    return ddl_test_rand_vec(n, seed, 3);
}

static int64_t out_elems(const ddl_pool_geom *g)
{
    return g->N * g->C * g->out[0] * g->out[1] * g->out[2];
}

static int64_t in_elems(const ddl_pool_geom *g)
{
    return g->N * g->C * g->in[0] * g->in[1] * g->in[2];
}

// ---- the reference: pad explicitly, then pool without padding ------------------
// y, and for max the argmax (flat input index, -1 if the window is all padding); the
// adjoint dx += pool^T(dy) is built from the same walk.

typedef struct dims3 {
    int64_t in[3], k[3], s[3], p[3], d[3], out[3];
} dims3;

static dims3 dims_of(const ddl_pool_geom *g)
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

static void pool_ref(const ddl_pool_geom *g, const double *x, double *y, int64_t *arg,
                     const double *dy, double *dx)
{
    dims3   t = dims_of(g);
    int64_t P[3];
    for (int i = 0; i < 3; i++) {
        P[i] = t.in[i] + 2 * t.p[i];
    }
    int64_t pv = P[0] * P[1] * P[2], iv = t.in[0] * t.in[1] * t.in[2];
    int64_t ov = t.out[0] * t.out[1] * t.out[2], kv = t.k[0] * t.k[1] * t.k[2];
    bool    is_max = g->mode == DDL_POOL_MAX;
    double *xp = malloc((size_t)pv * sizeof(double));
    int64_t *src = malloc((size_t)pv * sizeof(int64_t)); // padded cell -> input index or -1
    for (int64_t pl = 0; pl < g->N * g->C; pl++) {
        for (int64_t i = 0; i < pv; i++) {
            xp[i]  = is_max ? -INFINITY : 0.0;
            src[i] = -1;
        }
        for (int64_t a = 0; a < t.in[0]; a++) {
            for (int64_t c = 0; c < t.in[1]; c++) {
                for (int64_t e = 0; e < t.in[2]; e++) {
                    int64_t q = ((a + t.p[0]) * P[1] + c + t.p[1]) * P[2] + e + t.p[2];
                    src[q]    = pl * iv + (a * t.in[1] + c) * t.in[2] + e;
                    xp[q]     = x[src[q]];
                }
            }
        }
        int64_t oi = pl * ov;
        for (int64_t o0 = 0; o0 < t.out[0]; o0++) {
            for (int64_t o1 = 0; o1 < t.out[1]; o1++) {
                for (int64_t o2 = 0; o2 < t.out[2]; o2++, oi++) {
                    double  acc  = is_max ? -INFINITY : 0.0;
                    int64_t best = -1;
                    for (int64_t a = 0; a < t.k[0]; a++) {
                        for (int64_t c = 0; c < t.k[1]; c++) {
                            for (int64_t e = 0; e < t.k[2]; e++) {
                                int64_t q0 = o0 * t.s[0] + a * t.d[0];
                                int64_t q1 = o1 * t.s[1] + c * t.d[1];
                                int64_t q2 = o2 * t.s[2] + e * t.d[2];
                                int64_t q  = (q0 * P[1] + q1) * P[2] + q2;
                                if (!is_max) {
                                    acc += xp[q];
                                    if (dx != NULL && src[q] >= 0) {
                                        dx[src[q]] += dy[oi] / (double)kv;
                                    }
                                } else if (src[q] >= 0 && (best < 0 || xp[q] > acc)) {
                                    acc  = xp[q];
                                    best = src[q];
                                }
                            }
                        }
                    }
                    y[oi] = is_max ? acc : acc / (double)kv;
                    if (is_max) {
                        arg[oi] = best;
                        if (dx != NULL && best >= 0) {
                            dx[best] += dy[oi];
                        }
                    }
                }
            }
        }
    }
    free(xp);
    free(src);
}

// ---- one case ----------------------------------------------------------------------

typedef struct pool_case {
    ddl_pool_mode mode;
    int           nsp;
    int64_t       N, C;
    int64_t       in[3], k[3], s[3], p[3], d[3];
} pool_case;

typedef struct pool_ctx {
    const ddl_pool_geom *g;
    double              *x, *r, *y;
    void                *ws;
    size_t               ws_bytes;
} pool_ctx;

// L = <pool(x), r>, so dL/dy = r.
static double pool_loss(void *p)
{
    pool_ctx *c = p;
    ASSERT_OK(ddl_pool_forward(DDL_F64, c->g, c->y, c->x, c->ws, c->ws_bytes));
    double s = 0.0;
    for (int64_t i = 0; i < out_elems(c->g); i++) {
        s += c->y[i] * c->r[i];
    }
    return s;
}

static void run_case(const pool_case *pc, uint64_t seed)
{
    ddl_pool_geom g;
    ASSERT_OK(ddl_pool_geom_init(&g, pc->mode, pc->nsp, pc->N, pc->C, pc->in, pc->k, pc->s,
                                 pc->p, pc->d));
    for (int i = 0; i < pc->nsp; i++) {
        int64_t s = pc->s[i] ? pc->s[i] : pc->k[i];
        ASSERT_EQ(g.s[i], s);
        ASSERT_EQ(g.out[i], (pc->in[i] + 2 * pc->p[i] - pc->d[i] * (pc->k[i] - 1) - 1) / s + 1);
    }
    const int64_t nx = in_elems(&g), ny = out_elems(&g);
    double       *x = distinct_vec(nx, seed), *r = rand_vec(ny, seed + 1);
    double       *yref = malloc((size_t)ny * 8), *dxref = calloc((size_t)nx, 8);
    int64_t      *aref = malloc((size_t)ny * 8);
    pool_ref(&g, x, yref, aref, r, dxref);

    size_t wsb = ddl_pool_workspace_bytes(&g);
    ASSERT_EQ(wsb, pc->mode == DDL_POOL_MAX ? (size_t)ny * 8 : 0);
    int64_t *ws = malloc(wsb > 0 ? wsb : 8);
    for (int d = 0; d < 2; d++) {
        ddl_dtype dt  = d ? DDL_F64 : DDL_F32;
        double    tol = d ? 1e-12 : 1e-5;
        void     *xd = ddl_test_as_dtype(dt, x, nx), *rd = ddl_test_as_dtype(dt, r, ny);
        void     *yd = malloc((size_t)ny * ddl_dtype_size(dt));
        void     *dxd = calloc((size_t)nx, ddl_dtype_size(dt));
        ASSERT_OK(ddl_pool_forward(dt, &g, yd, xd, ws, wsb));
        if (pc->mode == DDL_POOL_MAX) {
            // Max selects an input value: exact in either dtype, and the same argmax.
            for (int64_t i = 0; i < ny; i++) {
                ASSERT_EQ(ws[i], aref[i]);
                ASSERT_TRUE(ddl_test_at(dt, yd, i) == yref[i]);
            }
        } else {
            ASSERT_LE(ddl_test_rel_err(yref, dt, yd, ny), tol);
        }
        ASSERT_OK(ddl_pool_backward(dt, &g, dxd, rd, ws, wsb));
        ASSERT_LE(ddl_test_rel_err(dxref, dt, dxd, nx), tol);
        // A second call accumulates: 2x.
        ASSERT_OK(ddl_pool_backward(dt, &g, dxd, rd, ws, wsb));
        for (int64_t i = 0; i < nx; i++) {
            dxref[i] *= 2.0;
        }
        ASSERT_LE(ddl_test_rel_err(dxref, dt, dxd, nx), tol);
        for (int64_t i = 0; i < nx; i++) {
            dxref[i] *= 0.5;
        }
        free(xd), free(rd), free(yd), free(dxd);
    }

    // Finite differences (f64) of L = <pool(x), r>. The inputs are tie-free with gaps of
    // 2 / nx, so a step of 1e-6 never changes which element is a window's maximum.
    double  *y  = malloc((size_t)ny * 8), *dx = calloc((size_t)nx, 8);
    pool_ctx ctx = {&g, x, r, y, ws, wsb};
    ASSERT_OK(ddl_pool_forward(DDL_F64, &g, y, x, ws, wsb));
    ASSERT_OK(ddl_pool_backward(DDL_F64, &g, dx, r, ws, wsb));
    ASSERT_LE(ddl_test_gradcheck(nx, x, dx, pool_loss, &ctx, 1e-6, 300), 1e-7);
    free(x), free(r), free(yref), free(dxref), free(aref), free(ws), free(y), free(dx);
}

static void test_cases(void)
{
    const ddl_pool_mode M = DDL_POOL_MAX, A = DDL_POOL_AVG;
    // clang-format off
    const pool_case cases[] = {
        // mode nsp N  C  in           k          s          p          d
        {M, 1, 2, 3, {11},        {3},       {2},       {1},       {1}},
        {A, 1, 2, 3, {11},        {3},       {2},       {1},       {1}},
        {M, 1, 1, 2, {10},        {2},       {0},       {0},       {1}},        // default stride
        {A, 1, 1, 2, {9},         {4},       {1},       {2},       {1}},        // even k, p = k/2
        {M, 1, 2, 2, {12},        {3},       {1},       {1},       {2}},        // dilation 2
        {M, 2, 2, 3, {7, 9},      {3, 2},    {2, 0},    {1, 1},    {2, 1}},
        {A, 2, 2, 3, {7, 9},      {3, 2},    {2, 0},    {1, 1},    {1, 1}},
        {M, 2, 3, 2, {8, 8},      {2, 2},    {0, 0},    {0, 0},    {1, 1}},     // MaxPool2d(2)
        {A, 2, 3, 2, {9, 6},      {3, 3},    {1, 1},    {1, 1},    {1, 1}},
        {M, 3, 2, 2, {5, 6, 7},   {2, 3, 2}, {1, 2, 2}, {1, 1, 0}, {2, 1, 2}},
        {A, 3, 2, 2, {5, 6, 7},   {2, 3, 2}, {1, 2, 2}, {1, 1, 0}, {1, 1, 1}},
        {M, 3, 1, 3, {6, 6, 6},   {3, 3, 3}, {2, 2, 2}, {1, 1, 1}, {1, 1, 1}},
        {A, 3, 1, 3, {4, 6, 5},   {2, 2, 2}, {0, 0, 0}, {1, 0, 1}, {1, 1, 1}},
        // Unpadded, dilation 1: the fast paths. 2x2 stride 2 runs four windows of a row
        // at a time, then a scalar tail (out[2] = 14, 7, 5, 1), odd extents floor; with
        // AVX2 (f32) rows of 8 or more, of 4 to 7, and of fewer by the rule.
        {M, 2, 2, 6, {28, 28},    {2, 2},    {0, 0},    {0, 0},    {1, 1}},     // LeNet pool1
        {M, 2, 3, 16, {10, 10},   {2, 2},    {0, 0},    {0, 0},    {1, 1}},     // LeNet pool2
        {M, 2, 2, 3, {6, 7},      {2, 2},    {0, 0},    {0, 0},    {1, 1}},     // out[2] = 3
        {M, 3, 2, 2, {4, 5, 5},   {2, 2, 2}, {0, 0, 0}, {0, 0, 0}, {1, 1, 1}},  // 2x2x2, out 2
        {M, 3, 1, 2, {5, 4, 18},  {2, 2, 2}, {2, 1, 2}, {0, 0, 0}, {1, 1, 1}},  // out[2] = 9
        {M, 2, 2, 3, {7, 15},     {2, 2},    {2, 2},    {0, 0},    {1, 1}},
        {M, 1, 2, 3, {9},         {2},       {0},       {0},       {1}},        // 1-D: no k22
        {M, 3, 2, 2, {3, 6, 9},   {1, 2, 2}, {0, 0, 0}, {0, 0, 0}, {1, 1, 1}},  // 3-D k22
        {M, 2, 2, 3, {9, 11},     {3, 2},    {2, 1},    {0, 0},    {1, 1}},     // general
        {M, 3, 1, 2, {5, 6, 7},   {2, 3, 2}, {1, 2, 3}, {0, 0, 0}, {1, 1, 1}},
        {A, 2, 2, 3, {8, 9},      {2, 2},    {0, 0},    {0, 0},    {1, 1}},
        {A, 1, 2, 2, {11},        {3},       {2},       {0},       {1}},
        {A, 3, 1, 2, {4, 5, 6},   {2, 2, 3}, {1, 2, 1}, {0, 0, 0}, {1, 1, 1}},
    };
    // clang-format on
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        run_case(&cases[i], 500 + 7 * i);
    }
}

// Hand-worked values, PyTorch's semantics at the edges.
static void test_semantics(void)
{
    ddl_pool_geom g;
    // MaxPool1d(3, stride=2, padding=1) over [1, 5, 2, 4, 3]: windows {pad,1,5} {5,2,4}
    // {4,3,pad} -> [5, 5, 4] at indices [1, 1, 3].
    ASSERT_OK(ddl_pool_geom_init(&g, DDL_POOL_MAX, 1, 1, 1, (int64_t[]){5}, (int64_t[]){3},
                                 (int64_t[]){2}, (int64_t[]){1}, NULL));
    ASSERT_EQ(g.out[0], 3);
    double  x[5] = {1, 5, 2, 4, 3}, y[3], dy[3] = {1, 10, 100}, dx[5] = {0};
    int64_t arg[3];
    ASSERT_OK(ddl_pool_forward(DDL_F64, &g, y, x, arg, sizeof arg));
    ASSERT_EQ(y[0], 5);
    ASSERT_EQ(y[1], 5);
    ASSERT_EQ(y[2], 4);
    ASSERT_EQ(arg[0], 1);
    ASSERT_EQ(arg[1], 1);
    ASSERT_EQ(arg[2], 3);
    ASSERT_OK(ddl_pool_backward(DDL_F64, &g, dx, dy, arg, sizeof arg));
    ASSERT_EQ(dx[1], 11);
    ASSERT_EQ(dx[3], 100);
    ASSERT_EQ(dx[0] + dx[2] + dx[4], 0);
    // Ties take the first maximum; NaN wins and propagates (as PyTorch's max_pool).
    x[2] = 5;
    ASSERT_OK(ddl_pool_forward(DDL_F64, &g, y, x, arg, sizeof arg));
    ASSERT_EQ(arg[1], 1);
    x[3] = NAN;
    ASSERT_OK(ddl_pool_forward(DDL_F64, &g, y, x, arg, sizeof arg));
    ASSERT_TRUE(isnan(y[1]) && isnan(y[2]));
    ASSERT_EQ(arg[1], 3);
    ASSERT_EQ(arg[2], 3);

    // AvgPool1d(3, stride=2, padding=1), count_include_pad: [1+5, 5+2+4, 4+3] / 3.
    x[2] = 2, x[3] = 4;
    ASSERT_OK(ddl_pool_geom_init(&g, DDL_POOL_AVG, 1, 1, 1, (int64_t[]){5}, (int64_t[]){3},
                                 (int64_t[]){2}, (int64_t[]){1}, NULL));
    ASSERT_EQ(ddl_pool_workspace_bytes(&g), 0);
    ASSERT_OK(ddl_pool_forward(DDL_F64, &g, y, x, NULL, 0));
    ASSERT_NEAR(y[0], 6.0 / 3, 1e-15);
    ASSERT_NEAR(y[1], 11.0 / 3, 1e-15);
    ASSERT_NEAR(y[2], 7.0 / 3, 1e-15);
    memset(dx, 0, sizeof dx);
    ASSERT_OK(ddl_pool_backward(DDL_F64, &g, dx, dy, NULL, 0));
    ASSERT_NEAR(dx[0], 1.0 / 3, 1e-15);
    ASSERT_NEAR(dx[2], 10.0 / 3, 1e-15);
    ASSERT_NEAR(dx[3], 110.0 / 3, 1e-15);

    // Default stride = kernel (NULL, or 0 per dimension).
    ASSERT_OK(ddl_pool_geom_init(&g, DDL_POOL_MAX, 2, 1, 1, (int64_t[]){8, 9},
                                 (int64_t[]){2, 3}, NULL, NULL, NULL));
    ASSERT_EQ(g.s[0], 2);
    ASSERT_EQ(g.s[1], 3);
    ASSERT_EQ(g.out[0], 4);
    ASSERT_EQ(g.out[1], 3);
    ASSERT_OK(ddl_pool_geom_init(&g, DDL_POOL_AVG, 2, 1, 1, (int64_t[]){8, 9},
                                 (int64_t[]){2, 3}, (int64_t[]){1, 0}, NULL, NULL));
    ASSERT_EQ(g.s[0], 1);
    ASSERT_EQ(g.s[1], 3);

    // A window entirely in the padding (in 1, k 2, pad 1, dilation 2: taps -1 and 1):
    // -inf with index -1, and no gradient.
    ASSERT_OK(ddl_pool_geom_init(&g, DDL_POOL_MAX, 1, 1, 1, (int64_t[]){1}, (int64_t[]){2},
                                 (int64_t[]){1}, (int64_t[]){1}, (int64_t[]){2}));
    ASSERT_EQ(g.out[0], 1);
    float x1 = 3.0f, y1 = 0.0f, dy1 = 1.0f, dx1 = 0.0f;
    ASSERT_OK(ddl_pool_forward(DDL_F32, &g, &y1, &x1, arg, sizeof arg));
    ASSERT_TRUE(isinf(y1) && y1 < 0);
    ASSERT_EQ(arg[0], -1);
    ASSERT_OK(ddl_pool_backward(DDL_F32, &g, &dx1, &dy1, arg, sizeof arg));
    ASSERT_TRUE(dx1 == 0.0f);
}

// The unpadded fast paths against the rule itself, on data full of ties and NaNs: 2x2
// windows (nd 2) and 2x2x2 ones (nd 3), per window the first maximum in tap order, a NaN
// replacing whatever came before (so the last NaN wins), in f32 and f64, with a scalar tail
// (I2 = 47: 23 windows a row, 8 + 8 at AVX2 width, 4, then 3 by the rule; I2 = 7: 3, all
// by the rule); then the backward scatters to those indices.
static void test_fast_ties_nan(int nd, int64_t I2)
{
    ddl_pool_geom g;
    const int64_t C = 3, I0 = nd == 3 ? 4 : 1, I1 = 4, O0 = I0 / 2 + (nd == 2);
    const int64_t O1 = 2, O2 = I2 / 2, K0 = nd == 3 ? 2 : 1;
    const int64_t nx = C * I0 * I1 * I2, ny = C * O0 * O1 * O2;
    if (nd == 3) {
        ASSERT_OK(ddl_pool_geom_init(&g, DDL_POOL_MAX, 3, 1, C, (int64_t[]){I0, I1, I2},
                                     (int64_t[]){2, 2, 2}, NULL, NULL, NULL));
    } else {
        ASSERT_OK(ddl_pool_geom_init(&g, DDL_POOL_MAX, 2, 1, C, (int64_t[]){I1, I2},
                                     (int64_t[]){2, 2}, NULL, NULL, NULL));
    }
    double  *x   = malloc((size_t)nx * sizeof(double)), *yref = malloc((size_t)ny * 8);
    int64_t *aref = malloc((size_t)ny * 8), *arg = malloc((size_t)ny * 8);
    for (int64_t i = 0; i < nx; i++) {
        uint64_t r = (uint64_t)(ddl_rng_uniform(7, (uint64_t)nd, (uint64_t)i) * 16.0);
        x[i]       = r == 0 ? NAN : (double)(r % 3); // values 0, 1, 2 and one NaN in 16
    }
    for (int64_t c = 0, oi = 0; c < C; c++) {
        for (int64_t o0 = 0; o0 < O0; o0++) {
            for (int64_t o1 = 0; o1 < O1; o1++) {
                for (int64_t o2 = 0; o2 < O2; o2++, oi++) {
                    int64_t best = -1;
                    for (int64_t k = 0; k < K0 * 4; k++) { // (k0, k1, k2) in order
                        int64_t k0 = k / 4, k1 = k / 2 % 2, k2 = k % 2;
                        int64_t i = ((c * I0 + 2 * o0 + k0) * I1 + 2 * o1 + k1) * I2 + 2 * o2 + k2;
                        if (best < 0 || x[i] > x[best] || isnan(x[i])) {
                            best = i;
                        }
                    }
                    aref[oi] = best;
                    yref[oi] = x[best];
                }
            }
        }
    }
    for (int d = 0; d < 2; d++) {
        ddl_dtype dt = d ? DDL_F64 : DDL_F32;
        void     *xd = ddl_test_as_dtype(dt, x, nx), *yd = malloc((size_t)ny * 8);
        void     *dy = ddl_test_as_dtype(dt, yref, ny), *dx = calloc((size_t)nx, 8);
        ASSERT_OK(ddl_pool_forward(dt, &g, yd, xd, arg, (size_t)ny * 8));
        for (int64_t i = 0; i < ny; i++) {
            ASSERT_EQ(arg[i], aref[i]);
            ASSERT_TRUE(isnan(yref[i]) ? isnan(ddl_test_at(dt, yd, i)) : ddl_test_at(dt, yd, i) == yref[i]);
        }
        // dy = 1 + window index, so each input gets the sum of the windows it won.
        for (int64_t i = 0; i < ny; i++) {
            if (dt == DDL_F32) {
                ((float *)dy)[i] = (float)(1 + i);
            } else {
                ((double *)dy)[i] = (double)(1 + i);
            }
        }
        ASSERT_OK(ddl_pool_backward(dt, &g, dx, dy, arg, (size_t)ny * 8));
        for (int64_t i = 0; i < nx; i++) {
            double want = 0.0;
            for (int64_t o = 0; o < ny; o++) {
                want += aref[o] == i ? (double)(1 + o) : 0.0;
            }
            ASSERT_TRUE(ddl_test_at(dt, dx, i) == want);
        }
        free(xd), free(yd), free(dy), free(dx);
    }
    free(x), free(yref), free(aref), free(arg);
}

static void test_errors(void)
{
    ddl_pool_geom g;
    const int64_t in[3] = {8, 8, 8}, k[3] = {3, 3, 3};
    // Average pooling has no dilation.
    ASSERT_STATUS(ddl_pool_geom_init(&g, DDL_POOL_AVG, 1, 1, 1, in, k, NULL, NULL,
                                     (int64_t[]){2}),
                  DDL_EINVAL);
    // Padding must be at most k / 2.
    ASSERT_STATUS(ddl_pool_geom_init(&g, DDL_POOL_MAX, 1, 1, 1, in, (int64_t[]){3}, NULL,
                                     (int64_t[]){2}, NULL),
                  DDL_EINVAL);
    ASSERT_STATUS(ddl_pool_geom_init(&g, DDL_POOL_AVG, 2, 1, 1, in, (int64_t[]){2, 2}, NULL,
                                     (int64_t[]){1, 2}, NULL),
                  DDL_EINVAL);
    ASSERT_STATUS(ddl_pool_geom_init(&g, DDL_POOL_MAX, 1, 1, 1, in, k, (int64_t[]){-1}, NULL,
                                     NULL),
                  DDL_EINVAL);
    ASSERT_STATUS(ddl_pool_geom_init(&g, DDL_POOL_MAX, 1, 1, 1, in, (int64_t[]){0}, NULL, NULL,
                                     NULL),
                  DDL_EINVAL);
    ASSERT_STATUS(ddl_pool_geom_init(&g, DDL_POOL_MAX, 1, 1, 1, (int64_t[]){2}, k, NULL, NULL,
                                     NULL),
                  DDL_EINVAL); // window larger than the input
    ASSERT_STATUS(ddl_pool_geom_init(&g, DDL_POOL_MAX, 0, 1, 1, in, k, NULL, NULL, NULL),
                  DDL_EINVAL);
    ASSERT_STATUS(ddl_pool_geom_init(&g, (ddl_pool_mode)5, 1, 1, 1, in, k, NULL, NULL, NULL),
                  DDL_EINVAL);

    // Too small a workspace, and an argmax workspace not from the forward, are refused
    // before dx is touched.
    ASSERT_OK(ddl_pool_geom_init(&g, DDL_POOL_MAX, 2, 1, 2, in, (int64_t[]){2, 2}, NULL, NULL,
                                 NULL));
    size_t   wsb = ddl_pool_workspace_bytes(&g);
    int64_t *ws  = malloc(wsb);
    double   x[128], y[32], dx[128] = {0};
    for (int i = 0; i < 128; i++) {
        x[i] = i;
    }
    ASSERT_STATUS(ddl_pool_forward(DDL_F64, &g, y, x, ws, wsb - 8), DDL_EINVAL);
    ASSERT_OK(ddl_pool_forward(DDL_F64, &g, y, x, ws, wsb));
    ws[20] = 3; // output 20 lies in plane 1; input 3 in plane 0
    ASSERT_STATUS(ddl_pool_backward(DDL_F64, &g, dx, y, ws, wsb), DDL_EINVAL);
    for (int i = 0; i < 128; i++) {
        ASSERT_TRUE(dx[i] == 0.0);
    }
    ddl_pool_geom bad = g;
    bad.out[1]        = 3;
    ASSERT_STATUS(ddl_pool_forward(DDL_F64, &bad, y, x, ws, wsb), DDL_EINVAL);
    // Zero batch is a no-op.
    ASSERT_OK(ddl_pool_geom_init(&g, DDL_POOL_MAX, 2, 0, 2, in, (int64_t[]){2, 2}, NULL, NULL,
                                 NULL));
    ASSERT_EQ(ddl_pool_workspace_bytes(&g), 0);
    ASSERT_OK(ddl_pool_forward(DDL_F64, &g, NULL, NULL, NULL, 0));
    free(ws);
}

int main(void)
{
    test_semantics();
    test_errors();
    test_cases();
    test_fast_ties_nan(2, 47);
    test_fast_ties_nan(3, 47);
    test_fast_ties_nan(2, 7);
    test_fast_ties_nan(3, 7);
    printf("test_pool: ok\n");
    return 0;
}
