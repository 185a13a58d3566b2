// Tests of the loss kernels: hand-checked values of every elementwise loss (clamps and
// extremes included), random inputs against formulas written independently here
// (f32 and f64), f64 finite-difference gradient checks of every backward (scalar scale
// and per-element upstream gradients), accumulation; softmax cross-entropy by hand, at
// extreme logits, against a direct reference, by finite differences, and split over
// 2 and 3 simulated ranks equal to the sequential result; on N-d input (one label per
// voxel) against the [B, C] kernel on transposed logits; and argument errors.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ddl/base.h"
#include "ddl/kernels_pointwise.h"
#include "gradcheck.h"
#include "test.h"

static void fill_uniform(double *a, int64_t n, uint64_t seed, double lo, double hi)
{
    for (int64_t i = 0; i < n; i++) {
        a[i] = lo + (hi - lo) * ddl_rng_uniform(seed, 41, (uint64_t)i);
    }
}

static void to_f32(float *out, const double *in, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        out[i] = (float)in[i];
    }
}

static const ddl_loss_kind KINDS[] = {DDL_LOSS_MSE,         DDL_LOSS_L1,
                                      DDL_LOSS_BCE,         DDL_LOSS_BCE_WITH_LOGITS,
                                      DDL_LOSS_KL_DIV,      DDL_LOSS_POISSON_NLL,
                                      DDL_LOSS_KL_DIV_LOG_TARGET};
#define NKINDS 7

// ---- hand-checked values ------------------------------------------------------------------

static void check_loss(ddl_loss_kind k, int n, const double *x, const double *t,
                       const double *want)
{
    double l[8], sum = 0.0, wsum = 0.0;
    float  xf[8], tf[8], lf[8];
    ASSERT_OK(ddl_eloss_forward(k, DDL_F64, l, &sum, x, t, n));
    to_f32(xf, x, n);
    to_f32(tf, t, n);
    double sumf = 0.0;
    ASSERT_OK(ddl_eloss_forward(k, DDL_F32, lf, &sumf, xf, tf, n));
    for (int i = 0; i < n; i++) {
        ASSERT_NEAR(l[i], want[i], 1e-15 * fmax(1.0, fabs(want[i])));
        ASSERT_NEAR(lf[i], want[i], 3e-7 * fmax(1.0, fabs(want[i])));
        wsum += want[i];
    }
    ASSERT_NEAR(sum, wsum, 1e-14 * fmax(1.0, fabs(wsum)));
    ASSERT_NEAR(sumf, wsum, 1e-6 * fmax(1.0, fabs(wsum)));
}

static void test_hand(void)
{
    const double LN2 = 0.69314718055994531;
    check_loss(DDL_LOSS_MSE, 2, (double[]){1, 2}, (double[]){0, 4}, (double[]){1, 4});
    check_loss(DDL_LOSS_L1, 3, (double[]){1, 2, 3}, (double[]){0, 4, 3}, (double[]){1, 2, 0});
    // BCE: the log clamp makes x = 0 with t = 1 cost exactly 100, and 0 * log 0 = 0.
    check_loss(DDL_LOSS_BCE, 5, (double[]){0.5, 0, 1, 0, 0.25}, (double[]){1, 1, 1, 0, 0},
               (double[]){LN2, 100, 0, 0, 0.2876820724517809});
    check_loss(DDL_LOSS_BCE, 1, (double[]){1}, (double[]){0}, (double[]){100});
    // BCE with logits: log 2 at 0 for any target, no overflow at +-100.
    check_loss(DDL_LOSS_BCE_WITH_LOGITS, 5, (double[]){0, 0, 100, -100, 2},
               (double[]){0, 1, 0, 1, 1}, (double[]){LN2, LN2, 100, 100, 0.1269280110429725});
    // KL divergence: 0 where t == 0, t (log t - x) elsewhere.
    check_loss(DDL_LOSS_KL_DIV, 3, (double[]){3, -1, 0.5}, (double[]){0, 0.5, 2},
               (double[]){0, 0.15342640972002736, 0.3862943611198906});
    check_loss(DDL_LOSS_POISSON_NLL, 2, (double[]){0, 1}, (double[]){1, 2},
               (double[]){1, 0.7182818284590451});
    check_loss(DDL_LOSS_KL_DIV_LOG_TARGET, 2, (double[]){1, 0.5}, (double[]){0, 1},
               (double[]){-1, 1.3591409142295225});

    // Gradients by hand, scale 1, accumulating onto 1.
    struct {
        ddl_loss_kind k;
        double        x, t, g;
    } cases[] = {
        {DDL_LOSS_MSE, 1, 4, -6},       {DDL_LOSS_L1, 2, 2, 0},
        {DDL_LOSS_L1, -1, 2, -1},       {DDL_LOSS_BCE, 0.25, 0, 0.25 / (0.25 * 0.75)},
        {DDL_LOSS_BCE_WITH_LOGITS, 0, 1, -0.5},
        {DDL_LOSS_KL_DIV, 7, 0.5, -0.5}, {DDL_LOSS_POISSON_NLL, 0, 3, -2},
        {DDL_LOSS_KL_DIV_LOG_TARGET, 3, 0, -1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        double dx = 1.0;
        ASSERT_OK(ddl_eloss_backward(cases[c].k, DDL_F64, &dx, NULL, 1.0, &cases[c].x, &cases[c].t,
                                    1));
        ASSERT_NEAR(dx, 1.0 + cases[c].g, 1e-15);
    }
    // BCE's gradient stays finite at x = 0 and 1 (denominator clamped at 1e-12).
    double x01[2] = {0, 1}, t01[2] = {1, 0}, d01[2] = {0, 0};
    ASSERT_OK(ddl_eloss_backward(DDL_LOSS_BCE, DDL_F64, d01, NULL, 1.0, x01, t01, 2));
    ASSERT_NEAR(d01[0], -1e12, 1.0);
    ASSERT_NEAR(d01[1], 1e12, 1.0);
}

// ---- random inputs against the references ---------------------------------------------------

static void domain(ddl_loss_kind k, double *xlo, double *xhi, double *tlo, double *thi)
{
    *xlo = -2, *xhi = 2, *tlo = -2, *thi = 2;
    switch (k) {
    case DDL_LOSS_BCE:
        *xlo = 0.05, *xhi = 0.95, *tlo = 0, *thi = 1;
        break;
    case DDL_LOSS_BCE_WITH_LOGITS:
        *xlo = -8, *xhi = 8, *tlo = 0, *thi = 1;
        break;
    case DDL_LOSS_KL_DIV:
        *xlo = -3, *xhi = 1, *tlo = 0.01, *thi = 2;
        break;
    case DDL_LOSS_POISSON_NLL:
        *tlo = 0, *thi = 5;
        break;
    case DDL_LOSS_KL_DIV_LOG_TARGET:
        *xlo = -3, *xhi = 1, *tlo = -3, *thi = 1;
        break;
    default:
        break;
    }
}

// Textbook forms (no clamps, no stabilisation: the domains above keep them finite).
static double ref_loss(ddl_loss_kind k, double x, double t)
{
    switch (k) {
    case DDL_LOSS_MSE:
        return pow(x - t, 2);
    case DDL_LOSS_L1:
        return x > t ? x - t : t - x;
    case DDL_LOSS_BCE:
        return -(t * log(x) + (1 - t) * log(1 - x));
    case DDL_LOSS_BCE_WITH_LOGITS: {
        double s = 1.0 / (1.0 + exp(-x));
        return -(t * log(s) + (1 - t) * log(1 - s));
    }
    case DDL_LOSS_KL_DIV:
        return t * (log(t) - x);
    case DDL_LOSS_POISSON_NLL:
        return exp(x) - t * x;
    case DDL_LOSS_KL_DIV_LOG_TARGET:
        return exp(t) * (t - x);
    case DDL_LOSS_CROSS_ENTROPY:
        break;
    }
    return NAN;
}

enum { RN = 500 };

static void test_random(void)
{
    for (int k = 0; k < NKINDS; k++) {
        double xlo, xhi, tlo, thi;
        domain(KINDS[k], &xlo, &xhi, &tlo, &thi);
        double x[RN], t[RN], l[RN], sum;
        float  xf[RN], tf[RN], lf[RN];
        fill_uniform(x, RN, 1 + (uint64_t)k, xlo, xhi);
        fill_uniform(t, RN, 100 + (uint64_t)k, tlo, thi);
        ASSERT_OK(ddl_eloss_forward(KINDS[k], DDL_F64, l, &sum, x, t, RN));
        to_f32(xf, x, RN);
        to_f32(tf, t, RN);
        double sumf;
        ASSERT_OK(ddl_eloss_forward(KINDS[k], DDL_F32, lf, &sumf, xf, tf, RN));
        double rsum = 0.0, rsumf = 0.0;
        for (int i = 0; i < RN; i++) {
            double r  = ref_loss(KINDS[k], x[i], t[i]);
            double rf = ref_loss(KINDS[k], xf[i], tf[i]);
            ASSERT_NEAR(l[i], r, 1e-13 * fmax(1.0, fabs(r)));
            ASSERT_NEAR(lf[i], rf, 5e-7 * fmax(1.0, fabs(rf)));
            rsum += r;
            rsumf += rf;
        }
        ASSERT_NEAR(sum, rsum, 1e-12 * fmax(1.0, fabs(rsum)));
        ASSERT_NEAR(sumf, rsumf, 1e-6 * fmax(1.0, fabs(rsumf)));
        // The sum alone (reduction sum/mean) and the losses alone (none) both work.
        double sum2;
        ASSERT_OK(ddl_eloss_forward(KINDS[k], DDL_F64, NULL, &sum2, x, t, RN));
        ASSERT_NEAR(sum2, sum, 0.0);
        ASSERT_OK(ddl_eloss_forward(KINDS[k], DDL_F64, l, NULL, x, t, RN));
    }
}

// ---- gradient checks ----------------------------------------------------------------------

typedef struct loss_ctx {
    ddl_loss_kind k;
    double       *x;
    const double *t, *g; // g NULL: scalar scale only
    double        scale;
    int64_t       n;
} loss_ctx;

// f = scale * sum_i g_i L_i.
static double loss_objective(void *p)
{
    loss_ctx *c = p;
    double    l[RN], s = 0.0;
    ASSERT_OK(ddl_eloss_forward(c->k, DDL_F64, l, NULL, c->x, c->t, c->n));
    for (int64_t i = 0; i < c->n; i++) {
        s += (c->g ? c->g[i] : 1.0) * l[i];
    }
    return c->scale * s;
}

static void test_gradcheck(void)
{
    enum { N = 100 };
    for (int k = 0; k < NKINDS; k++) {
        double xlo, xhi, tlo, thi;
        domain(KINDS[k], &xlo, &xhi, &tlo, &thi);
        double x[N], t[N], g[N], dx[N], pre[N];
        float  xf[N], tf[N], gf[N], dxf[N];
        fill_uniform(x, N, 200 + (uint64_t)k, xlo, xhi);
        fill_uniform(t, N, 300 + (uint64_t)k, tlo, thi);
        fill_uniform(g, N, 400, -1.0, 1.0);
        fill_uniform(pre, N, 500, -1.0, 1.0);
        for (int i = 0; i < N; i++) {
            if (KINDS[k] == DDL_LOSS_L1 && fabs(x[i] - t[i]) < 0.05) {
                x[i] = t[i] + 0.05; // away from the kink
            }
        }
        for (int mode = 0; mode < 2; mode++) {
            // mode 0: reduction "mean" (scale 1/N); mode 1: "none" with upstream g.
            loss_ctx c = {.k = KINDS[k], .x = x, .t = t, .g = mode ? g : NULL,
                          .scale = mode ? 0.5 : 1.0 / N, .n = N};
            memcpy(dx, pre, sizeof dx);
            ASSERT_OK(ddl_eloss_backward(KINDS[k], DDL_F64, dx, c.g, c.scale, x, t, N));
            for (int i = 0; i < N; i++) {
                dx[i] -= pre[i];
            }
            ASSERT_LE(ddl_test_gradcheck(N, x, dx, loss_objective, &c, 1e-6, 0), 1e-8);
            // f32 agrees with f64 (inputs rounded the same way).
            to_f32(xf, x, N);
            to_f32(tf, t, N);
            to_f32(gf, g, N);
            memset(dxf, 0, sizeof dxf);
            ASSERT_OK(ddl_eloss_backward(KINDS[k], DDL_F32, dxf, mode ? gf : NULL, c.scale, xf, tf,
                                        N));
            for (int i = 0; i < N; i++) {
                ASSERT_NEAR(dxf[i], dx[i], 1e-5 * fmax(1.0, fabs(dx[i])));
            }
        }
        ASSERT_OK(ddl_eloss_backward(KINDS[k], DDL_F64, NULL, NULL, 1.0, x, t, N));
    }
}

// ---- cross-entropy ----------------------------------------------------------------------------

// Direct reference: log(sum exp x) - x[label], without the max shift (moderate logits).
static double ref_ce(const double *row, int64_t C, int64_t label)
{
    double s = 0.0;
    for (int64_t c = 0; c < C; c++) {
        s += exp(row[c]);
    }
    return log(s) - row[label];
}

static void test_ce_hand(void)
{
    const double  x[6]  = {0, 0, 0, 1, 2, 3};
    const int64_t lab[2] = {1, 2};
    double        l[2], sum, dx[6];
    ASSERT_OK(ddl_cross_entropy_forward(DDL_F64, l, &sum, x, lab, 2, 3));
    ASSERT_NEAR(l[0], log(3.0), 1e-15);
    ASSERT_NEAR(l[1], 0.40760596444438013, 1e-15);
    ASSERT_NEAR(sum, log(3.0) + 0.40760596444438013, 1e-15);
    // Row 0: softmax is 1/3 everywhere, minus 1 at the label; scale 1/2 ("mean").
    memset(dx, 0, sizeof dx);
    ASSERT_OK(ddl_cross_entropy_backward(DDL_F64, dx, NULL, 0.5, x, lab, 2, 3));
    ASSERT_NEAR(dx[0], 0.5 / 3.0, 1e-16);
    ASSERT_NEAR(dx[1], 0.5 * (1.0 / 3.0 - 1.0), 1e-16);
    ASSERT_NEAR(dx[2], 0.5 / 3.0, 1e-16);
    // Extreme logits stay finite: the row max is subtracted first.
    const double  big[4]  = {1000, 0, -1000, -1000};
    const int64_t blab[2] = {1, 0};
    float         bigf[4] = {1000, 0, -1000, -1000}, lf[2];
    ASSERT_OK(ddl_cross_entropy_forward(DDL_F64, l, &sum, big, blab, 2, 2));
    ASSERT_NEAR(l[0], 1000.0, 1e-12);
    ASSERT_NEAR(l[1], log(2.0), 1e-15);
    ASSERT_OK(ddl_cross_entropy_forward(DDL_F32, lf, NULL, bigf, blab, 2, 2));
    ASSERT_NEAR(lf[0], 1000.0, 0.0);
    ASSERT_NEAR(lf[1], log(2.0), 1e-7);
    memset(dx, 0, sizeof dx);
    ASSERT_OK(ddl_cross_entropy_backward(DDL_F64, dx, NULL, 1.0, big, blab, 2, 2));
    ASSERT_NEAR(dx[0], 1.0, 1e-15);
    ASSERT_NEAR(dx[1], -1.0, 1e-15);
    ASSERT_NEAR(dx[2], -0.5, 1e-15);
    ASSERT_NEAR(dx[3], 0.5, 1e-15);
}

enum { CB = 7, CC = 9 };

typedef struct ce_ctx {
    double        *x;
    const int64_t *lab;
    const double  *g;
    double         scale;
} ce_ctx;

static double ce_objective(void *p)
{
    ce_ctx *c = p;
    double  l[CB], s = 0.0;
    ASSERT_OK(ddl_cross_entropy_forward(DDL_F64, l, NULL, c->x, c->lab, CB, CC));
    for (int b = 0; b < CB; b++) {
        s += (c->g ? c->g[b] : 1.0) * l[b];
    }
    return c->scale * s;
}

static void test_ce_random(void)
{
    double  x[CB * CC], l[CB], g[CB], dx[CB * CC], sum;
    float   xf[CB * CC], lf[CB], gf[CB], dxf[CB * CC];
    int64_t lab[CB];
    fill_uniform(x, CB * CC, 600, -4.0, 4.0);
    fill_uniform(g, CB, 601, -1.0, 1.0);
    for (int b = 0; b < CB; b++) {
        lab[b] = (int64_t)(ddl_rng_u64(602, 0, (uint64_t)b) % CC);
    }
    lab[0] = 0;
    lab[1] = CC - 1;
    ASSERT_OK(ddl_cross_entropy_forward(DDL_F64, l, &sum, x, lab, CB, CC));
    to_f32(xf, x, CB * CC);
    double sumf;
    ASSERT_OK(ddl_cross_entropy_forward(DDL_F32, lf, &sumf, xf, lab, CB, CC));
    double rsum = 0.0;
    for (int b = 0; b < CB; b++) {
        double r = ref_ce(x + b * CC, CC, lab[b]);
        ASSERT_NEAR(l[b], r, 1e-14);
        ASSERT_NEAR(lf[b], r, 2e-6);
        rsum += r;
    }
    ASSERT_NEAR(sum, rsum, 1e-13);
    ASSERT_NEAR(sumf, rsum, 1e-5);

    for (int mode = 0; mode < 2; mode++) {
        ce_ctx c = {.x = x, .lab = lab, .g = mode ? g : NULL, .scale = mode ? 2.0 : 1.0 / CB};
        for (int i = 0; i < CB * CC; i++) {
            dx[i] = 0.75; // accumulate onto a known value
        }
        ASSERT_OK(ddl_cross_entropy_backward(DDL_F64, dx, c.g, c.scale, x, lab, CB, CC));
        for (int i = 0; i < CB * CC; i++) {
            dx[i] -= 0.75;
        }
        ASSERT_LE(ddl_test_gradcheck(CB * CC, x, dx, ce_objective, &c, 1e-6, 0), 1e-8);
        // Each row's gradient sums to zero (softmax sums to one).
        for (int b = 0; b < CB; b++) {
            double s = 0.0;
            for (int j = 0; j < CC; j++) {
                s += dx[b * CC + j];
            }
            ASSERT_NEAR(s, 0.0, 1e-15);
        }
        to_f32(gf, g, CB);
        memset(dxf, 0, sizeof dxf);
        ASSERT_OK(ddl_cross_entropy_backward(DDL_F32, dxf, mode ? gf : NULL, c.scale, xf, lab,
                                             CB, CC));
        for (int i = 0; i < CB * CC; i++) {
            ASSERT_NEAR(dxf[i], dx[i], 2e-6);
        }
    }
}

// N-d cross-entropy: logits [NB, NC, NV] (classes NV apart) against the [B, C] kernel
// on the same logits transposed to [NB * NV, NC]: the same per-voxel losses and
// gradients; and its own finite-difference check with per-voxel upstream gradients.
enum { NB = 2, NC = 4, NV = 6 };

typedef struct nd_ctx {
    const double  *x;
    const int64_t *lab;
    const double  *g;
} nd_ctx;

static double nd_objective(void *p)
{
    nd_ctx *c = p;
    double  l[NB * NV], s = 0.0;
    ASSERT_OK(ddl_cross_entropy_nd_forward(DDL_F64, l, NULL, c->x, c->lab, NB, NC, NV));
    for (int i = 0; i < NB * NV; i++) {
        s += c->g[i] * l[i];
    }
    return s;
}

static void test_ce_nd(void)
{
    double  x[NB * NC * NV], xt[NB * NV * NC], l[NB * NV], lt[NB * NV], g[NB * NV];
    double  dx[NB * NC * NV], dxt[NB * NV * NC], sum, sumt;
    float   xf[NB * NC * NV], lf[NB * NV], dxf[NB * NC * NV];
    int64_t lab[NB * NV];
    fill_uniform(x, NB * NC * NV, 700, -5.0, 5.0);
    fill_uniform(g, NB * NV, 701, -1.0, 1.0);
    for (int i = 0; i < NB * NV; i++) {
        lab[i] = (int64_t)(ddl_rng_u64(702, 0, (uint64_t)i) % NC);
    }
    for (int b = 0; b < NB; b++) {
        for (int c = 0; c < NC; c++) {
            for (int v = 0; v < NV; v++) {
                xt[(b * NV + v) * NC + c] = x[(b * NC + c) * NV + v];
            }
        }
    }
    ASSERT_OK(ddl_cross_entropy_nd_forward(DDL_F64, l, &sum, x, lab, NB, NC, NV));
    ASSERT_OK(ddl_cross_entropy_forward(DDL_F64, lt, &sumt, xt, lab, NB * NV, NC));
    for (int i = 0; i < NB * NV; i++) {
        ASSERT_NEAR(l[i], lt[i], 1e-15);
    }
    ASSERT_NEAR(sum, sumt, 1e-13);
    memset(dx, 0, sizeof dx);
    memset(dxt, 0, sizeof dxt);
    ASSERT_OK(ddl_cross_entropy_nd_backward(DDL_F64, dx, g, 0.5, x, lab, NB, NC, NV));
    ASSERT_OK(ddl_cross_entropy_backward(DDL_F64, dxt, g, 0.5, xt, lab, NB * NV, NC));
    for (int b = 0; b < NB; b++) {
        for (int c = 0; c < NC; c++) {
            for (int v = 0; v < NV; v++) {
                ASSERT_NEAR(dx[(b * NC + c) * NV + v], dxt[(b * NV + v) * NC + c], 1e-15);
            }
        }
    }
    // Finite differences (scale 1, per-voxel g), accumulating onto a known value.
    nd_ctx c = {.x = x, .lab = lab, .g = g};
    for (int i = 0; i < NB * NC * NV; i++) {
        dx[i] = -0.25;
    }
    ASSERT_OK(ddl_cross_entropy_nd_backward(DDL_F64, dx, g, 1.0, x, lab, NB, NC, NV));
    for (int i = 0; i < NB * NC * NV; i++) {
        dx[i] += 0.25;
    }
    ASSERT_LE(ddl_test_gradcheck(NB * NC * NV, x, dx, nd_objective, &c, 1e-6, 0), 1e-8);
    // f32 within single precision; V = 1 is the [B, C] kernel itself.
    to_f32(xf, x, NB * NC * NV);
    ASSERT_OK(ddl_cross_entropy_nd_forward(DDL_F32, lf, NULL, xf, lab, NB, NC, NV));
    memset(dxf, 0, sizeof dxf);
    ASSERT_OK(ddl_cross_entropy_nd_backward(DDL_F32, dxf, NULL, 1.0, xf, lab, NB, NC, NV));
    for (int i = 0; i < NB * NV; i++) {
        ASSERT_NEAR(lf[i], l[i], 1e-5);
    }
    double l1[NB * NV], l1t[NB * NV];
    ASSERT_OK(ddl_cross_entropy_nd_forward(DDL_F64, l1, NULL, xt, lab, NB * NV, NC, 1));
    ASSERT_OK(ddl_cross_entropy_forward(DDL_F64, l1t, NULL, xt, lab, NB * NV, NC));
    ASSERT_TRUE(memcmp(l1, l1t, sizeof l1) == 0);
    // A bad label is refused, naming the sample and voxel; nothing is written.
    lab[7]   = NC;
    l[7]     = 42.0;
    ASSERT_STATUS(ddl_cross_entropy_nd_forward(DDL_F64, l, &sum, x, lab, NB, NC, NV), DDL_EINVAL);
    ASSERT_TRUE(strstr(ddl_last_error(), "of sample 1, voxel 1") != NULL);
    ASSERT_TRUE(l[7] == 42.0);
    ASSERT_STATUS(ddl_cross_entropy_nd_backward(DDL_F64, dx, NULL, 1.0, x, lab, NB, NC, NV),
                  DDL_EINVAL);
    ASSERT_STATUS(ddl_cross_entropy_nd_forward(DDL_F64, l, &sum, x, lab, NB, 0, NV), DDL_EINVAL);
}

// The N-d kernels go through the voxels in blocks (256, fewer past 16 classes, one voxel at
// a time past 4096) and the backward keeps each block's exps: the bits must equal the
// [B, C] kernels' on the transposed logits, whatever the block, its tail and the dtype.
static void check_nd_blocks(ddl_dtype dt, int64_t B, int64_t C, int64_t V)
{
    const int64_t n  = B * C * V;
    const size_t  es = dt == DDL_F32 ? sizeof(float) : sizeof(double);
    double *x = malloc((size_t)n * sizeof(double)), *g = malloc((size_t)(B * V) * sizeof(double));
    char   *xd = malloc((size_t)n * es), *xt = malloc((size_t)n * es);
    char *dx = malloc((size_t)n * es), *dxt = malloc((size_t)n * es), *dxb = malloc((size_t)n * es);
    char *l = malloc((size_t)(B * V) * es), *lt = malloc((size_t)(B * V) * es);
    char *gd     = malloc((size_t)(B * V) * es);
    int64_t *lab = malloc((size_t)(B * V) * sizeof(int64_t));
    fill_uniform(x, n, 710 + (uint64_t)C, -8.0, 8.0);
    fill_uniform(g, B * V, 711, -1.0, 1.0);
    for (int64_t i = 0; i < B * V; i++) {
        lab[i] = (int64_t)(ddl_rng_u64(712, 0, (uint64_t)i) % (uint64_t)C);
    }
    for (int64_t i = 0; i < n; i++) { // xd [B, C, V]; xt [B, V, C]; dx starts at -0.25
        int64_t b = i / (C * V), c = i / V % C, v = i % V, j = (b * V + v) * C + c;
        if (dt == DDL_F32) {
            ((float *)xd)[i] = (float)x[i];
            ((float *)xt)[j] = (float)x[i];
            ((float *)dx)[i] = ((float *)dxt)[i] = -0.25f;
        } else {
            ((double *)xd)[i] = ((double *)xt)[j] = x[i];
            ((double *)dx)[i] = ((double *)dxt)[i] = -0.25;
        }
    }
    for (int64_t i = 0; i < B * V; i++) {
        if (dt == DDL_F32) {
            ((float *)gd)[i] = (float)g[i];
        } else {
            ((double *)gd)[i] = g[i];
        }
    }
    double s, st;
    ASSERT_OK(ddl_cross_entropy_nd_forward(dt, l, &s, xd, lab, B, C, V));
    ASSERT_OK(ddl_cross_entropy_forward(dt, lt, &st, xt, lab, B * V, C));
    ASSERT_TRUE(memcmp(l, lt, (size_t)(B * V) * es) == 0 && s == st);
    ASSERT_OK(ddl_cross_entropy_nd_backward(dt, dx, gd, 0.75, xd, lab, B, C, V));
    ASSERT_OK(ddl_cross_entropy_backward(dt, dxt, gd, 0.75, xt, lab, B * V, C));
    for (int64_t i = 0; i < n; i++) { // dxb: dxt back in [B, C, V]
        int64_t b = i / (C * V), c = i / V % C, v = i % V, j = (b * V + v) * C + c;
        memcpy(dxb + (size_t)i * es, dxt + (size_t)j * es, es);
    }
    ASSERT_TRUE(memcmp(dx, dxb, (size_t)n * es) == 0);
    free(x), free(g), free(xd), free(xt), free(dx), free(dxt), free(dxb), free(l), free(lt);
    free(gd), free(lab);
}

static void test_ce_nd_blocks(void)
{
    for (int d = 0; d < 2; d++) {
        ddl_dtype dt = d ? DDL_F32 : DDL_F64;
        check_nd_blocks(dt, 2, 3, 600);  // 256-voxel blocks and a tail of 88
        check_nd_blocks(dt, 2, 20, 530); // 204-voxel blocks (4096 / 20)
        check_nd_blocks(dt, 1, 4097, 3); // past the cache: one voxel at a time
        check_nd_blocks(dt, 3, 2, 1);
    }
}

// The class dimension split over R simulated ranks with widths w[r] (summing to CC):
// the local pieces, "all-reduced" here, give the sequential loss and gradient.
static void check_split(ddl_dtype dt, int R, const int64_t *w)
{
    double  x[CB * CC], g[CB];
    int64_t lab[CB];
    fill_uniform(x, CB * CC, 700, -30.0, 30.0); // wide: the max shift matters
    fill_uniform(g, CB, 701, -1.0, 1.0);
    for (int b = 0; b < CB; b++) {
        lab[b] = (int64_t)(ddl_rng_u64(702, 0, (uint64_t)b) % CC);
    }
    // Typed copies.
    static double xd[CB * CC], gd[CB], dxs[CB * CC];
    static float  xs[CB * CC], gs[CB], dxsf[CB * CC];
    const void   *X = dt == DDL_F64 ? (const void *)xd : (const void *)xs;
    const void   *G = dt == DDL_F64 ? (const void *)gd : (const void *)gs;
    memcpy(xd, x, sizeof x);
    memcpy(gd, g, sizeof g);
    to_f32(xs, x, CB * CC);
    to_f32(gs, g, CB);
    double seq[CB], seqsum;
    float  seqf[CB];
    ASSERT_OK(ddl_cross_entropy_forward(dt, dt == DDL_F64 ? (void *)seq : (void *)seqf, &seqsum,
                                        X, lab, CB, CC));
    memset(dxs, 0, sizeof dxs);
    memset(dxsf, 0, sizeof dxsf);
    ASSERT_OK(ddl_cross_entropy_backward(dt, dt == DDL_F64 ? (void *)dxs : (void *)dxsf, G, 0.5,
                                         X, lab, CB, CC));

    // Each rank's [CB, w[r]] block.
    static double loc[3][CB * CC], dloc[3][CB * CC];
    static float  locf[3][CB * CC], dlocf[3][CB * CC];
    int64_t       c0[3];
    int64_t       start = 0;
    for (int r = 0; r < R; r++) {
        c0[r] = start;
        for (int b = 0; b < CB; b++) {
            for (int j = 0; j < w[r]; j++) {
                loc[r][b * w[r] + j]  = x[b * CC + start + j];
                locf[r][b * w[r] + j] = xs[b * CC + start + j];
            }
        }
        start += w[r];
    }
    ASSERT_EQ(start, CC);
    double gmax[CB], gsum[CB], glab[CB], part[CB];
    for (int b = 0; b < CB; b++) {
        gmax[b] = -INFINITY;
        gsum[b] = glab[b] = 0.0;
    }
    for (int r = 0; r < R; r++) { // all-reduce MAX
        const void *L = dt == DDL_F64 ? (const void *)loc[r] : (const void *)locf[r];
        ASSERT_OK(ddl_cross_entropy_local_max(dt, part, L, CB, w[r]));
        for (int b = 0; b < CB; b++) {
            gmax[b] = fmax(gmax[b], part[b]);
        }
    }
    for (int r = 0; r < R; r++) { // all-reduce SUM of the two other pieces
        const void *L = dt == DDL_F64 ? (const void *)loc[r] : (const void *)locf[r];
        ASSERT_OK(ddl_cross_entropy_local_sumexp(dt, part, L, gmax, CB, w[r]));
        for (int b = 0; b < CB; b++) {
            gsum[b] += part[b];
        }
        ASSERT_OK(ddl_cross_entropy_local_label_logit(dt, part, L, lab, CB, c0[r], w[r], CC));
        for (int b = 0; b < CB; b++) {
            glab[b] += part[b];
        }
    }
    double comb[CB], combsum;
    float  combf[CB];
    ASSERT_OK(ddl_cross_entropy_combine(dt, dt == DDL_F64 ? (void *)comb : (void *)combf,
                                        &combsum, gmax, gsum, glab, CB));
    for (int b = 0; b < CB; b++) {
        if (dt == DDL_F64) {
            ASSERT_NEAR(comb[b], seq[b], 1e-13);
        } else {
            ASSERT_NEAR(combf[b], seqf[b], 1e-5);
        }
    }
    ASSERT_NEAR(combsum, seqsum, dt == DDL_F64 ? 1e-12 : 1e-5);
    // Backward per rank, then the columns put side by side.
    for (int r = 0; r < R; r++) {
        const void *L = dt == DDL_F64 ? (const void *)loc[r] : (const void *)locf[r];
        memset(dloc[r], 0, sizeof dloc[r]);
        memset(dlocf[r], 0, sizeof dlocf[r]);
        ASSERT_OK(ddl_cross_entropy_local_backward(
            dt, dt == DDL_F64 ? (void *)dloc[r] : (void *)dlocf[r], G, 0.5, L, lab, gmax, gsum,
            CB, c0[r], w[r], CC));
        for (int b = 0; b < CB; b++) {
            for (int j = 0; j < w[r]; j++) {
                int64_t gi = b * CC + c0[r] + j, li = b * w[r] + j;
                if (dt == DDL_F64) {
                    ASSERT_NEAR(dloc[r][li], dxs[gi], 1e-15);
                } else {
                    ASSERT_NEAR(dlocf[r][li], dxsf[gi], 1e-6);
                }
            }
        }
    }
}

static void test_ce_split(void)
{
    check_split(DDL_F64, 2, (int64_t[]){5, 4});
    check_split(DDL_F64, 3, (int64_t[]){3, 3, 3});
    check_split(DDL_F64, 3, (int64_t[]){4, 0, 5}); // a rank without classes
    check_split(DDL_F32, 2, (int64_t[]){5, 4});
    check_split(DDL_F32, 3, (int64_t[]){2, 6, 1});
    double m[2];
    ASSERT_OK(ddl_cross_entropy_local_max(DDL_F64, m, NULL, 2, 0));
    ASSERT_TRUE(isinf(m[0]) && m[0] < 0);
}

static void test_errors(void)
{
    double  x[6] = {0}, l[2], dx[6], v[2];
    int64_t bad[2] = {0, 3}, neg[2] = {-1, 0};
    ASSERT_STATUS(ddl_cross_entropy_forward(DDL_F64, l, NULL, x, bad, 2, 3), DDL_EINVAL);
    ASSERT_TRUE(strstr(ddl_last_error(), "label 3") != NULL);
    ASSERT_TRUE(strstr(ddl_last_error(), "outside [0, 3)") != NULL);
    ASSERT_STATUS(ddl_cross_entropy_forward(DDL_F64, l, NULL, x, neg, 2, 3), DDL_EINVAL);
    ASSERT_TRUE(strstr(ddl_last_error(), "label -1") != NULL);
    ASSERT_STATUS(ddl_cross_entropy_backward(DDL_F64, dx, NULL, 1.0, x, bad, 2, 3), DDL_EINVAL);
    ASSERT_STATUS(ddl_cross_entropy_local_label_logit(DDL_F64, v, x, bad, 2, 0, 3, 3), DDL_EINVAL);
    ASSERT_STATUS(ddl_cross_entropy_local_backward(DDL_F64, dx, NULL, 1.0, x, neg, v, v, 2, 0, 3,
                                                   3),
                  DDL_EINVAL);
    // Local classes beyond C.
    int64_t ok[2] = {0, 1};
    ASSERT_STATUS(ddl_cross_entropy_local_label_logit(DDL_F64, v, x, ok, 2, 2, 3, 4), DDL_EINVAL);
    // BCE outside [0, 1], in input or target; nothing is written.
    double xb[2] = {0.5, 1.5}, tb[2] = {0.5, 0.5}, lb[2] = {7, 7}, s = 7;
    ASSERT_STATUS(ddl_eloss_forward(DDL_LOSS_BCE, DDL_F64, lb, &s, xb, tb, 2), DDL_EINVAL);
    ASSERT_TRUE(lb[0] == 7 && s == 7);
    xb[1] = 0.5;
    tb[0] = -0.5;
    ASSERT_STATUS(ddl_eloss_forward(DDL_LOSS_BCE, DDL_F64, lb, &s, xb, tb, 2), DDL_EINVAL);
    ASSERT_STATUS(ddl_eloss_forward((ddl_loss_kind)42, DDL_F64, lb, &s, xb, tb, 2), DDL_EINVAL);
    ASSERT_STATUS(ddl_eloss_forward(DDL_LOSS_MSE, (ddl_dtype)9, lb, &s, xb, tb, 2), DDL_EINVAL);
    ASSERT_STATUS(ddl_eloss_forward(DDL_LOSS_MSE, DDL_F64, lb, &s, xb, tb, -2), DDL_EINVAL);
}

int main(void)
{
    test_hand();
    test_random();
    test_gradcheck();
    test_ce_hand();
    test_ce_random();
    test_ce_split();
    test_ce_nd();
    test_ce_nd_blocks();
    test_errors();
    printf("test_loss_kernel: ok\n");
    return 0;
}
