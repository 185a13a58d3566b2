// Tests of the batch-norm kernels: a hand-checked batch, running statistics (momentum
// and cumulative), random batches against a naive reference, eval mode, f64
// finite-difference gradient checks on x, gamma and beta (batch and running
// statistics), the local pieces over simulated ranks equal to the sequential version,
// accumulation, the fused batch norm + ReLU against the unfused pair (bit for bit) and its
// own gradient check, every entry point at every vector width the CPU has (the same bits),
// and argument errors. x is [N, C, S].
#include <math.h>
#include <string.h>

#include "ddl/base.h"
#include "ddl/kernels_pointwise.h"
#include "gradcheck.h"
#include "kernels/batchnorm.h"
#include "test.h"

#define EPS 1e-5

static void fill_uniform(double *a, int64_t n, uint64_t seed, double lo, double hi)
{
    for (int64_t i = 0; i < n; i++) {
        a[i] = lo + (hi - lo) * ddl_rng_uniform(seed, 21, (uint64_t)i);
    }
}

static void to_f32(float *out, const double *in, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        out[i] = (float)in[i];
    }
}

// ---- hand-checked batch ---------------------------------------------------------------

static void test_hand(void)
{
    // One channel, x = {1, 3}: mean 2, biased var 1, unbiased var 2.
    const double x[2] = {1.0, 3.0};
    double       y[2], mean[1], invstd[1];
    double       rm[1] = {0.0}, rv[1] = {1.0};
    int64_t      nbt = 0;
    ddl_batchnorm_params p = ddl_batchnorm_params_default();
    ASSERT_NEAR(p.eps, 1e-5, 0.0);
    ASSERT_NEAR(p.momentum, 0.1, 0.0);
    ASSERT_TRUE(p.training && !p.cumulative);
    ASSERT_OK(ddl_batchnorm_forward(DDL_F64, y, mean, invstd, x, NULL, NULL, rm, rv, &nbt, &p, 2,
                                    1, 1));
    ASSERT_NEAR(mean[0], 2.0, 0.0);
    ASSERT_NEAR(invstd[0], 1.0 / sqrt(1.0 + EPS), 1e-16);
    ASSERT_NEAR(y[0], -1.0 / sqrt(1.0 + EPS), 1e-15);
    ASSERT_NEAR(y[1], 1.0 / sqrt(1.0 + EPS), 1e-15);
    ASSERT_NEAR(rm[0], 0.9 * 0.0 + 0.1 * 2.0, 1e-16);
    ASSERT_NEAR(rv[0], 0.9 * 1.0 + 0.1 * 2.0, 1e-15);
    ASSERT_EQ(nbt, 1);

    // Affine with gamma = 2, beta = -1 on [N=1, C=2, S=2].
    const double x2[4] = {0.0, 4.0, 10.0, 10.0 + 2.0};
    const double g2[2] = {2.0, 3.0}, b2[2] = {-1.0, 0.5};
    double       y2[4], m2[2], is2[2];
    ASSERT_OK(ddl_batchnorm_forward(DDL_F64, y2, m2, is2, x2, g2, b2, NULL, NULL, NULL, &p, 1, 2,
                                    2));
    // Channel 0: mean 2, var 4; channel 1: mean 11, var 1.
    ASSERT_NEAR(y2[0], 2.0 * (-2.0 / sqrt(4.0 + EPS)) - 1.0, 1e-15);
    ASSERT_NEAR(y2[1], 2.0 * (2.0 / sqrt(4.0 + EPS)) - 1.0, 1e-15);
    ASSERT_NEAR(y2[2], 3.0 * (-1.0 / sqrt(1.0 + EPS)) + 0.5, 1e-15);
    ASSERT_NEAR(y2[3], 3.0 * (1.0 / sqrt(1.0 + EPS)) + 0.5, 1e-15);
}

// ---- running statistics --------------------------------------------------------------

static void test_running(void)
{
    // Cumulative average (momentum=None): after two batches the running mean is the
    // mean of the two batch means, and the running variance the mean of their unbiased
    // variances; the first batch replaces the initial values entirely.
    const double a[3] = {1.0, 2.0, 6.0}; // mean 3, sum sq dev 14, unbiased 7
    const double b[3] = {0.0, 0.0, 3.0}; // mean 1, sum sq dev 6, unbiased 3
    double       y[3], mean[1], invstd[1], rm[1] = {5.0}, rv[1] = {9.0};
    int64_t      nbt = 0;
    ddl_batchnorm_params p = ddl_batchnorm_params_default();
    p.cumulative = true;
    ASSERT_OK(ddl_batchnorm_forward(DDL_F64, y, mean, invstd, a, NULL, NULL, rm, rv, &nbt, &p, 3,
                                    1, 1));
    ASSERT_NEAR(rm[0], 3.0, 1e-15);
    ASSERT_NEAR(rv[0], 7.0, 1e-14);
    ASSERT_OK(ddl_batchnorm_forward(DDL_F64, y, mean, invstd, b, NULL, NULL, rm, rv, &nbt, &p, 3,
                                    1, 1));
    ASSERT_EQ(nbt, 2);
    ASSERT_NEAR(rm[0], 2.0, 1e-15);
    ASSERT_NEAR(rv[0], 5.0, 1e-14);
    ASSERT_NEAR(ddl_batchnorm_update_factor(&p, 4), 0.25, 0.0);
    p.cumulative = false;
    ASSERT_NEAR(ddl_batchnorm_update_factor(&p, 4), 0.1, 0.0);

    // The piece on its own, f32: factor 0.5, V = 4.
    float  rmf[2] = {1.0f, 2.0f}, rvf[2] = {3.0f, 4.0f};
    double m[2] = {5.0, -1.0}, v[2] = {3.0, 0.75};
    ASSERT_OK(ddl_batchnorm_running_update(DDL_F32, rmf, rvf, m, v, 2, 4, 0.5));
    ASSERT_NEAR(rmf[0], 3.0, 0.0);
    ASSERT_NEAR(rmf[1], 0.5, 0.0);
    ASSERT_NEAR(rvf[0], 0.5 * 3.0 + 0.5 * 4.0, 1e-6);
    ASSERT_NEAR(rvf[1], 0.5 * 4.0 + 0.5 * 1.0, 1e-6);

    // Eval mode normalizes with the running statistics and leaves them alone.
    const double x[4] = {1.0, 2.0, 3.0, 4.0};
    const double g[1] = {2.0}, be[1] = {0.25};
    double       rm2[1] = {2.0}, rv2[1] = {4.0}, y4[4];
    p.training = false;
    nbt        = 7;
    ASSERT_OK(ddl_batchnorm_forward(DDL_F64, y4, mean, invstd, x, g, be, rm2, rv2, &nbt, &p, 4,
                                    1, 1));
    for (int i = 0; i < 4; i++) {
        ASSERT_NEAR(y4[i], (x[i] - 2.0) / sqrt(4.0 + EPS) * 2.0 + 0.25, 1e-15);
    }
    ASSERT_NEAR(rm2[0], 2.0, 0.0);
    ASSERT_NEAR(rv2[0], 4.0, 0.0);
    ASSERT_EQ(nbt, 7);
    // Eval without running statistics uses the batch's (track_running_stats=False).
    ASSERT_OK(ddl_batchnorm_forward(DDL_F64, y4, mean, invstd, x, NULL, NULL, NULL, NULL, NULL,
                                    &p, 4, 1, 1));
    ASSERT_NEAR(mean[0], 2.5, 0.0);
    ASSERT_NEAR(y4[0], -1.5 / sqrt(1.25 + EPS), 1e-15);
}

// ---- random batches against a naive reference ---------------------------------------------

// Straight from the definition: three separate passes per channel.
static void ref_forward(const double *x, const double *g, const double *b, double *y, int64_t N,
                        int64_t C, int64_t S)
{
    for (int64_t c = 0; c < C; c++) {
        double m = 0.0, v = 0.0;
        for (int64_t n = 0; n < N; n++) {
            for (int64_t s = 0; s < S; s++) {
                m += x[(n * C + c) * S + s];
            }
        }
        m /= (double)(N * S);
        for (int64_t n = 0; n < N; n++) {
            for (int64_t s = 0; s < S; s++) {
                double d = x[(n * C + c) * S + s] - m;
                v += d * d;
            }
        }
        v /= (double)(N * S);
        for (int64_t n = 0; n < N; n++) {
            for (int64_t s = 0; s < S; s++) {
                int64_t i = (n * C + c) * S + s;
                y[i]      = (x[i] - m) / sqrt(v + EPS) * g[c] + b[c];
            }
        }
    }
}

enum { RN = 3, RC = 4, RS = 5, RV = RN * RC * RS };

static void test_random(void)
{
    double x[RV], y[RV], yr[RV], g[RC], b[RC], mean[RC], invstd[RC];
    float  xf[RV], yf[RV], gf[RC], bf[RC];
    fill_uniform(x, RV, 1, -3.0, 5.0);
    fill_uniform(g, RC, 2, 0.5, 2.0);
    fill_uniform(b, RC, 3, -1.0, 1.0);
    ddl_batchnorm_params p = ddl_batchnorm_params_default();
    ASSERT_OK(ddl_batchnorm_forward(DDL_F64, y, mean, invstd, x, g, b, NULL, NULL, NULL, &p, RN,
                                    RC, RS));
    ref_forward(x, g, b, yr, RN, RC, RS);
    for (int i = 0; i < RV; i++) {
        ASSERT_NEAR(y[i], yr[i], 1e-14);
    }
    // Normalized output: per channel mean beta and variance gamma^2 var/(var + eps).
    for (int c = 0; c < RC; c++) {
        double m = 0.0, v = 0.0;
        for (int n = 0; n < RN; n++) {
            for (int s = 0; s < RS; s++) {
                m += y[(n * RC + c) * RS + s];
            }
        }
        m /= RN * RS;
        for (int n = 0; n < RN; n++) {
            for (int s = 0; s < RS; s++) {
                double d = y[(n * RC + c) * RS + s] - m;
                v += d * d;
            }
        }
        v /= RN * RS;
        double var = 1.0 / (invstd[c] * invstd[c]) - EPS;
        ASSERT_NEAR(m, b[c], 1e-14);
        ASSERT_NEAR(v, g[c] * g[c] * var / (var + EPS), 1e-13);
    }
    // f32 against the f64 result.
    to_f32(xf, x, RV);
    to_f32(gf, g, RC);
    to_f32(bf, b, RC);
    ASSERT_OK(ddl_batchnorm_forward(DDL_F32, yf, mean, invstd, xf, gf, bf, NULL, NULL, NULL, &p,
                                    RN, RC, RS));
    for (int i = 0; i < RV; i++) {
        ASSERT_NEAR(yf[i], yr[i], 2e-6);
    }
    // [N, C] (S = 1) works the same way.
    double x2[12], y2[12], r2[12];
    fill_uniform(x2, 12, 4, -1.0, 1.0);
    ASSERT_OK(ddl_batchnorm_forward(DDL_F64, y2, mean, invstd, x2, g, b, NULL, NULL, NULL, &p, 4,
                                    3, 1));
    ref_forward(x2, g, b, r2, 4, 3, 1);
    for (int i = 0; i < 12; i++) {
        ASSERT_NEAR(y2[i], r2[i], 1e-14);
    }
}

// ---- gradient checks ----------------------------------------------------------------------

typedef struct bn_ctx {
    double *x, *g, *b, *w, *y;
    double *rm, *rv; // non-NULL: eval with running statistics
    int64_t N, C, S;
} bn_ctx;

// f = sum w * y.
static double bn_objective(void *p)
{
    bn_ctx              *c   = p;
    ddl_batchnorm_params prm = ddl_batchnorm_params_default();
    prm.training             = c->rm == NULL;
    double mean[8], invstd[8];
    ASSERT_OK(ddl_batchnorm_forward(DDL_F64, c->y, mean, invstd, c->x, c->g, c->b, c->rm, c->rv,
                                    NULL, &prm, c->N, c->C, c->S));
    double s = 0.0;
    for (int64_t i = 0; i < c->N * c->C * c->S; i++) {
        s += c->w[i] * c->y[i];
    }
    return s;
}

static void test_gradcheck(void)
{
    for (int mode = 0; mode < 2; mode++) {
        bool   eval = mode == 1;
        double x[RV], y[RV], w[RV], g[RC], b[RC], rm[RC], rv[RC], mean[RC], invstd[RC];
        double dx[RV], dg[RC], db[RC];
        fill_uniform(x, RV, 10, -2.0, 3.0);
        fill_uniform(w, RV, 11, -1.0, 1.0);
        fill_uniform(g, RC, 12, 0.5, 1.5);
        fill_uniform(b, RC, 13, -0.5, 0.5);
        fill_uniform(rm, RC, 14, -0.5, 0.5);
        fill_uniform(rv, RC, 15, 0.5, 2.0);
        bn_ctx c = {.x = x, .g = g, .b = b, .w = w, .y = y, .rm = eval ? rm : NULL,
                    .rv = eval ? rv : NULL, .N = RN, .C = RC, .S = RS};
        ddl_batchnorm_params prm = ddl_batchnorm_params_default();
        prm.training             = !eval;
        ASSERT_OK(ddl_batchnorm_forward(DDL_F64, y, mean, invstd, x, g, b, c.rm, c.rv, NULL, &prm,
                                        RN, RC, RS));
        // Accumulation: start the gradients at known values.
        for (int i = 0; i < RV; i++) {
            dx[i] = 1.0;
        }
        for (int i = 0; i < RC; i++) {
            dg[i] = 2.0;
            db[i] = 3.0;
        }
        ASSERT_OK(ddl_batchnorm_backward(DDL_F64, dx, dg, db, w, x, mean, invstd, g, !eval, RN,
                                         RC, RS));
        for (int i = 0; i < RV; i++) {
            dx[i] -= 1.0;
        }
        for (int i = 0; i < RC; i++) {
            dg[i] -= 2.0;
            db[i] -= 3.0;
        }
        ASSERT_LE(ddl_test_gradcheck(RV, x, dx, bn_objective, &c, 1e-6, 0), 1e-7);
        ASSERT_LE(ddl_test_gradcheck(RC, g, dg, bn_objective, &c, 1e-6, 0), 1e-7);
        ASSERT_LE(ddl_test_gradcheck(RC, b, db, bn_objective, &c, 1e-6, 0), 1e-7);
        // In training the gradient w.r.t. x sums to zero per channel (the mean is removed).
        if (!eval) {
            for (int ch = 0; ch < RC; ch++) {
                double s = 0.0;
                for (int n = 0; n < RN; n++) {
                    for (int k = 0; k < RS; k++) {
                        s += dx[(n * RC + ch) * RS + k];
                    }
                }
                ASSERT_NEAR(s, 0.0, 1e-13);
            }
        }
        // f32 backward against f64.
        float xf[RV], wf[RV], gf[RC], dxf[RV], dgf[RC], dbf[RC];
        to_f32(xf, x, RV);
        to_f32(wf, w, RV);
        to_f32(gf, g, RC);
        double meanf[RC], invstdf[RC];
        float  yf[RV], rmf[RC], rvf[RC];
        to_f32(rmf, rm, RC);
        to_f32(rvf, rv, RC);
        ASSERT_OK(ddl_batchnorm_forward(DDL_F32, yf, meanf, invstdf, xf, gf, NULL,
                                        eval ? rmf : NULL, eval ? rvf : NULL, NULL, &prm, RN, RC,
                                        RS));
        memset(dxf, 0, sizeof dxf);
        memset(dgf, 0, sizeof dgf);
        memset(dbf, 0, sizeof dbf);
        ASSERT_OK(ddl_batchnorm_backward(DDL_F32, dxf, dgf, dbf, wf, xf, meanf, invstdf, gf, !eval,
                                         RN, RC, RS));
        for (int i = 0; i < RV; i++) {
            ASSERT_NEAR(dxf[i], dx[i], 1e-5);
        }
        for (int i = 0; i < RC; i++) {
            ASSERT_NEAR(dgf[i], dg[i], 1e-5);
            ASSERT_NEAR(dbf[i], db[i], 1e-5);
        }
    }
}

// ---- local pieces over simulated ranks ----------------------------------------------------

// Rank r holds the box n in [n0, n1), s in [s0, s1) of the global [N, C, S], packed as
// its own [n1-n0, C, s1-s0] array.
typedef struct piece {
    int64_t n0, n1, s0, s1;
} piece;

static void pack(const double *g, double *l, piece p, int64_t C, int64_t S)
{
    int64_t ls = p.s1 - p.s0, k = 0;
    for (int64_t n = p.n0; n < p.n1; n++) {
        for (int64_t c = 0; c < C; c++) {
            for (int64_t s = 0; s < ls; s++) {
                l[k++] = g[(n * C + c) * S + p.s0 + s];
            }
        }
    }
}

static void test_pieces(void)
{
    enum { N = 4, C = 3, S = 6, V = N * C * S, P = 4 };
    // A 2 x 2 split of (N, S), uneven in S, plus the box layout each rank holds.
    const piece pcs[P] = {{0, 2, 0, 4}, {0, 2, 4, 6}, {2, 4, 0, 4}, {2, 4, 4, 6}};
    double      x[V], dy[V], g[C], b[C];
    fill_uniform(x, V, 30, -2.0, 2.0);
    fill_uniform(dy, V, 31, -1.0, 1.0);
    fill_uniform(g, C, 32, 0.5, 1.5);
    fill_uniform(b, C, 33, -0.5, 0.5);

    // Sequential reference.
    ddl_batchnorm_params prm = ddl_batchnorm_params_default();
    double y[V], mean[C], invstd[C], dx[V] = {0}, dg[C] = {0}, db[C] = {0};
    double rm[C] = {0}, rv[C] = {1, 1, 1};
    int64_t nbt = 0;
    ASSERT_OK(ddl_batchnorm_forward(DDL_F64, y, mean, invstd, x, g, b, rm, rv, &nbt, &prm, N, C,
                                    S));
    ASSERT_OK(ddl_batchnorm_backward(DDL_F64, dx, dg, db, dy, x, mean, invstd, g, true, N, C, S));

    // Distributed: local sums -> "all-reduce" -> mean -> local sqdev -> "all-reduce".
    static double lx[P][V], ldy[P][V], ly[P][V], ldx[P][V];
    int64_t       ln[P], lsz[P];
    double        gsum[C] = {0}, gsq[C] = {0}, gm[C], gv[C], gis[C];
    for (int r = 0; r < P; r++) {
        ln[r]  = pcs[r].n1 - pcs[r].n0;
        lsz[r] = pcs[r].s1 - pcs[r].s0;
        pack(x, lx[r], pcs[r], C, S);
        pack(dy, ldy[r], pcs[r], C, S);
        double part[C];
        ASSERT_OK(ddl_batchnorm_sum(DDL_F64, part, lx[r], ln[r], C, lsz[r]));
        for (int c = 0; c < C; c++) {
            gsum[c] += part[c];
        }
    }
    for (int c = 0; c < C; c++) {
        gm[c] = gsum[c] / (N * S);
    }
    for (int r = 0; r < P; r++) {
        double part[C];
        ASSERT_OK(ddl_batchnorm_sqdev(DDL_F64, part, lx[r], gm, ln[r], C, lsz[r]));
        for (int c = 0; c < C; c++) {
            gsq[c] += part[c];
        }
    }
    for (int c = 0; c < C; c++) {
        gv[c]  = gsq[c] / (N * S);
        gis[c] = 1.0 / sqrt(gv[c] + EPS);
        ASSERT_NEAR(gm[c], mean[c], 1e-15);
        ASSERT_NEAR(gis[c], invstd[c], 1e-14);
    }
    double rm2[C] = {0}, rv2[C] = {1, 1, 1};
    ASSERT_OK(ddl_batchnorm_running_update(DDL_F64, rm2, rv2, gm, gv, C, N * S,
                                           ddl_batchnorm_update_factor(&prm, 1)));
    // Backward sums, "all-reduced".
    double gdy[C] = {0}, gdyx[C] = {0};
    for (int r = 0; r < P; r++) {
        ASSERT_OK(ddl_batchnorm_normalize(DDL_F64, ly[r], lx[r], gm, gis, g, b, ln[r], C, lsz[r]));
        double a[C], c2[C];
        ASSERT_OK(ddl_batchnorm_backward_reduce(DDL_F64, a, c2, ldy[r], lx[r], gm, gis, ln[r], C,
                                                lsz[r]));
        for (int c = 0; c < C; c++) {
            gdy[c] += a[c];
            gdyx[c] += c2[c];
        }
    }
    for (int r = 0; r < P; r++) {
        memset(ldx[r], 0, sizeof ldx[r]);
        ASSERT_OK(ddl_batchnorm_backward_apply(DDL_F64, ldx[r], ldy[r], lx[r], gm, gis, g, gdy,
                                               gdyx, N * S, ln[r], C, lsz[r]));
        // The overwriting form over NaN: the same bits as accumulating onto zeros.
        double odx[V];
        for (int i = 0; i < V; i++) {
            odx[i] = NAN;
        }
        ASSERT_OK(ddl_batchnorm_backward_apply_into(DDL_F64, odx, ldy[r], lx[r], gm, gis, g, gdy,
                                                    gdyx, N * S, ln[r], C, lsz[r]));
        ASSERT_TRUE(memcmp(odx, ldx[r], (size_t)(ln[r] * C * lsz[r]) * sizeof *odx) == 0);
        double wy[V], wdx[V];
        pack(y, wy, pcs[r], C, S);
        pack(dx, wdx, pcs[r], C, S);
        for (int64_t i = 0; i < ln[r] * C * lsz[r]; i++) {
            ASSERT_NEAR(ly[r][i], wy[i], 1e-14);
            ASSERT_NEAR(ldx[r][i], wdx[i], 1e-14);
        }
    }
    double dg2[C] = {0}, db2[C] = {0};
    ASSERT_OK(ddl_batchnorm_param_grads(DDL_F64, dg2, db2, gdy, gdyx, C));
    for (int c = 0; c < C; c++) {
        ASSERT_NEAR(dg2[c], dg[c], 1e-13);
        ASSERT_NEAR(db2[c], db[c], 1e-13);
        ASSERT_NEAR(rm2[c], rm[c], 1e-15);
        ASSERT_NEAR(rv2[c], rv[c], 1e-15);
    }
    // Frozen statistics: apply without sums is gamma*invstd*dy, accumulated.
    double fdx[V];
    for (int i = 0; i < V; i++) {
        fdx[i] = 0.5;
    }
    ASSERT_OK(ddl_batchnorm_backward_apply(DDL_F64, fdx, dy, x, gm, gis, g, NULL, NULL, 0, N, C,
                                           S));
    float odf[V], zdf[V], dyf[V], xf[V];
    for (int i = 0; i < V; i++) {
        odf[i] = NAN;
        zdf[i] = 0.0f;
        dyf[i] = (float)dy[i];
        xf[i]  = (float)x[i];
    }
    float gf[C];
    for (int c = 0; c < C; c++) {
        gf[c] = (float)g[c];
    }
    ASSERT_OK(
        ddl_batchnorm_backward_apply(DDL_F32, zdf, dyf, xf, gm, gis, gf, NULL, NULL, 0, N, C, S));
    ASSERT_OK(ddl_batchnorm_backward_apply_into(DDL_F32, odf, dyf, xf, gm, gis, gf, NULL, NULL, 0,
                                                N, C, S));
    ASSERT_TRUE(memcmp(odf, zdf, sizeof odf) == 0);
    for (int n = 0; n < N; n++) {
        for (int c = 0; c < C; c++) {
            for (int s = 0; s < S; s++) {
                int i = (n * C + c) * S + s;
                ASSERT_NEAR(fdx[i], 0.5 + g[c] * gis[c] * dy[i], 1e-15);
                ASSERT_NEAR(odf[i], g[c] * gis[c] * dy[i], 1e-5);
            }
        }
    }
}

// ---- batch norm fused with a ReLU -------------------------------------------------------

enum { FN = 3, FC = 4, FS = 13, FV = FN * FC * FS }; // S = 13: a tail past the 8 lanes

// Element i of two arrays of dt holds the same bits, or NaN in both.
static void assert_same(ddl_dtype dt, const void *a, const void *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        if (dt == DDL_F32) {
            float u = ((const float *)a)[i], v = ((const float *)b)[i];
            ASSERT_TRUE(isnan(u) ? isnan(v) : memcmp(&u, &v, sizeof u) == 0);
        } else {
            double u = ((const double *)a)[i], v = ((const double *)b)[i];
            ASSERT_TRUE(isnan(u) ? isnan(v) : memcmp(&u, &v, sizeof u) == 0);
        }
    }
}

static void put_dt(ddl_dtype dt, void *p, int64_t i, double v)
{
    if (dt == DDL_F32) {
        ((float *)p)[i] = (float)v;
    } else {
        ((double *)p)[i] = v;
    }
}

// out[0..n) = in[0..n) in dt.
static void to_dt(ddl_dtype dt, void *out, const double *in, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        put_dt(dt, out, i, in[i]);
    }
}

// One comparison of test_fused_relu: forward, reduce and apply (batch and frozen
// statistics, and in place), fused against unfused, on [FN, FC, FS] data of dtype dt.
static void fused_vs_unfused(ddl_dtype dt, const void *x, const void *dy, const double *mean,
                             const double *invstd, const void *g, const void *b)
{
    size_t item = dt == DDL_F32 ? sizeof(float) : sizeof(double);
    char   y1[FV * 8], y2[FV * 8], yf[FV * 8];
    ASSERT_OK(ddl_batchnorm_normalize(dt, y1, x, mean, invstd, g, b, FN, FC, FS));
    ASSERT_OK(ddl_activation_forward(DDL_ACTIVATION_RELU, 0, dt, y2, y1, FV));
    ASSERT_OK(ddl_batchnorm_normalize_relu(dt, yf, x, mean, invstd, g, b, FN, FC, FS));
    ASSERT_TRUE(memcmp(y2, yf, FV * item) == 0);
    ASSERT_TRUE(dt == DDL_F64 || ((float *)yf)[0] == 0.0f); // 1e-50 rounds to 0 in f32
    ASSERT_TRUE(dt == DDL_F32 || ((double *)yf)[0] == 1e-50);
    if (g != NULL) { // -0 from gamma < 0 and beta -0 on channel 1, made +0 by the ReLU
        ASSERT_TRUE(dt == DDL_F64 ? !signbit(((double *)yf)[FS]) && ((double *)y1)[FS] == 0 &&
                                        signbit(((double *)y1)[FS])
                                  : !signbit(((float *)yf)[FS]) && signbit(((float *)y1)[FS]));
    }
    // Backward: the unfused one reads the ReLU's dx.
    char   dr[FV * 8];
    double s1[FC], s2[FC], f1[FC], f2[FC];
    ASSERT_OK(ddl_activation_backward_into(DDL_ACTIVATION_RELU, 0, dt, dr, dy, y1, y2, FV));
    ASSERT_OK(ddl_batchnorm_backward_reduce(dt, s1, s2, dr, x, mean, invstd, FN, FC, FS));
    ASSERT_OK(ddl_batchnorm_backward_reduce_relu(dt, f1, f2, dy, yf, x, mean, invstd, FN, FC, FS));
    assert_same(DDL_F64, s1, f1, FC);
    assert_same(DDL_F64, s2, f2, FC);
    ASSERT_TRUE(isnan(f1[0]) && !isnan(f1[1]) && !isnan(f2[FC - 1]));
    for (int frozen = 0; frozen < 2; frozen++) {
        const double *a1 = frozen ? NULL : s1, *a2 = frozen ? NULL : s2;
        char          dxu[FV * 8], dxf[FV * 8];
        memset(dxu, 0xff, sizeof dxu); // NaN: overwritten, never read
        memset(dxf, 0xff, sizeof dxf);
        ASSERT_OK(ddl_batchnorm_backward_apply_into(dt, dxu, dr, x, mean, invstd, g, a1, a2,
                                                    FN * FS, FN, FC, FS));
        ASSERT_OK(ddl_batchnorm_backward_apply_relu_into(dt, dxf, dy, yf, x, mean, invstd, g, a1,
                                                         a2, FN * FS, FN, FC, FS));
        assert_same(dt, dxu, dxf, FV);
        // In place (dx over dy).
        memcpy(dxf, dy, FV * item);
        ASSERT_OK(ddl_batchnorm_backward_apply_relu_into(dt, dxf, dxf, yf, x, mean, invstd, g, a1,
                                                         a2, FN * FS, FN, FC, FS));
        assert_same(dt, dxu, dxf, FV);
    }
}

// The fused kernels against the unfused sequence (normalize, ReLU forward; ReLU backward,
// reduce, apply) fed the same data: the same bits in f32 and f64, with batch and frozen
// statistics, in place, and without affine parameters. Channel 0 (n = 0) holds edge cases:
// an x that normalizes to 1e-50 (positive in double, +0 once rounded to f32, so masked
// there), a NaN x (kept by the forward, masked by the backward), a dy of -0 and one of
// +inf at masked places (the ReLU gives +0 and NaN), and a negative dy kept. gamma is
// negative on channel 1, where an x at the mean and beta -0 normalize to -0 (the ReLU's
// output is +0). S = 13 leaves a tail after the vector loops.
static void test_fused_relu(void)
{
    for (int k = 0; k < 2; k++) {
        ddl_dtype dt = k == 0 ? DDL_F32 : DDL_F64;
        double    xd[FV], dyd[FV], mean[FC], invstd[FC], gd[FC], bd[FC];
        fill_uniform(xd, FV, 30, -2.0, 2.0);
        fill_uniform(dyd, FV, 31, -1.0, 1.0);
        fill_uniform(mean, FC, 32, -0.3, 0.3);
        fill_uniform(invstd, FC, 33, 0.5, 2.0);
        fill_uniform(gd, FC, 34, 0.5, 1.5);
        fill_uniform(bd, FC, 35, -0.5, 0.5);
        gd[1] = -gd[1];
        // Channel 0, n = 0: s = 0..4 edge cases.
        mean[0]   = -1e-50;
        invstd[0] = 1.0;
        gd[0]     = 1.0;
        bd[0]     = 0.0;
        xd[0]     = 0.0;      // normalizes to 1e-50
        xd[1]     = NAN;      // kept forward, masked backward
        xd[2]     = -1.0;     // masked
        xd[3]     = -0.5;     // masked
        xd[4]     = 0.5;      // kept
        dyd[2]    = -0.0;     // a masked -0
        dyd[3]    = INFINITY; // a masked inf: NaN through the ReLU
        dyd[4]    = -0.3;     // a kept negative dy
        // Channel 1 (gamma < 0), n = 0, s = 0: x at the mean and beta -0 normalize to
        // -0 * |k| + -0 = -0, which the ReLU turns into +0.
        bd[1]   = -0.0;
        xd[FS]  = 0.25;
        mean[1] = 0.25;
        char x[FV * 8], dy[FV * 8], g[FC * 8], b[FC * 8];
        to_dt(dt, x, xd, FV);
        to_dt(dt, dy, dyd, FV);
        to_dt(dt, g, gd, FC);
        to_dt(dt, b, bd, FC);
        fused_vs_unfused(dt, x, dy, mean, invstd, g, b);
        fused_vs_unfused(dt, x, dy, mean, invstd, NULL, NULL); // gamma 1, beta 0
    }
}

// f64 finite differences of f = sum w * relu(batchnorm(x)) with batch statistics, through
// the fused kernels alone (the statistics from ddl_batchnorm_sum and _sqdev).
typedef struct fr_ctx {
    double *x, *g, *b, *w, *y, *mean, *invstd;
} fr_ctx;

static void fr_stats(fr_ctx *c)
{
    double var[FC];
    ASSERT_OK(ddl_batchnorm_sum(DDL_F64, c->mean, c->x, FN, FC, FS));
    for (int ch = 0; ch < FC; ch++) {
        c->mean[ch] /= FN * FS;
    }
    ASSERT_OK(ddl_batchnorm_sqdev(DDL_F64, var, c->x, c->mean, FN, FC, FS));
    for (int ch = 0; ch < FC; ch++) {
        c->invstd[ch] = 1.0 / sqrt(var[ch] / (FN * FS) + EPS);
    }
}

static double fr_objective(void *p)
{
    fr_ctx *c = p;
    fr_stats(c);
    ASSERT_OK(ddl_batchnorm_normalize_relu(DDL_F64, c->y, c->x, c->mean, c->invstd, c->g, c->b, FN,
                                           FC, FS));
    double s = 0.0;
    for (int i = 0; i < FV; i++) {
        s += c->w[i] * c->y[i];
    }
    return s;
}

static void test_fused_relu_gradcheck(void)
{
    double x[FV], w[FV], y[FV], g[FC], b[FC], mean[FC], invstd[FC], dx[FV], s1[FC], s2[FC];
    fill_uniform(x, FV, 40, -2.0, 2.0);
    fill_uniform(w, FV, 41, -1.0, 1.0);
    fill_uniform(g, FC, 42, 0.5, 1.5);
    fill_uniform(b, FC, 43, -0.3, 0.3);
    fr_ctx c = {x, g, b, w, y, mean, invstd};
    fr_objective(&c); // y, mean and invstd
    ASSERT_OK(
        ddl_batchnorm_backward_reduce_relu(DDL_F64, s1, s2, w, y, x, mean, invstd, FN, FC, FS));
    ASSERT_OK(ddl_batchnorm_backward_apply_relu_into(DDL_F64, dx, w, y, x, mean, invstd, g, s1, s2,
                                                     FN * FS, FN, FC, FS));
    // dgamma and dbeta are the sums (ddl_batchnorm_param_grads adds them).
    double dg[FC] = {0}, db[FC] = {0};
    ASSERT_OK(ddl_batchnorm_param_grads(DDL_F64, dg, db, s1, s2, FC));
    ASSERT_LE(ddl_test_gradcheck(FV, x, dx, fr_objective, &c, 1e-6, 0), 1e-7);
    ASSERT_LE(ddl_test_gradcheck(FC, g, dg, fr_objective, &c, 1e-6, 0), 1e-7);
    ASSERT_LE(ddl_test_gradcheck(FC, b, db, fr_objective, &c, 1e-6, 0), 1e-7);
}

// Every entry point at every vector width the CPU has (baseline, AVX2, AVX-512F), on rows
// shorter than a vector, with a tail past the lanes and exactly two vectors long, with
// NaN, -0 and a masked inf among the data: the same bits as the baseline's.
enum { WN = 3, WC = 5, WMAX = WN * WC * 49 };

typedef struct width_out {
    double sum[WC], sqdev[WC], r1[WC], r2[WC], f1[WC], f2[WC];
    char   y[WMAX * 8], yr[WMAX * 8], dx[WMAX * 8], dxa[WMAX * 8], dxr[WMAX * 8];
} width_out;

static void width_run(ddl_dtype dt, int64_t S, const void *x, const void *dy, const void *yrelu,
                      const double *mean, const double *invstd, const void *g, const void *b,
                      width_out *o)
{
    size_t item = dt == DDL_F32 ? sizeof(float) : sizeof(double);
    ASSERT_OK(ddl_batchnorm_sum(dt, o->sum, x, WN, WC, S));
    ASSERT_OK(ddl_batchnorm_sqdev(dt, o->sqdev, x, mean, WN, WC, S));
    ASSERT_OK(ddl_batchnorm_normalize(dt, o->y, x, mean, invstd, g, b, WN, WC, S));
    ASSERT_OK(ddl_batchnorm_normalize_relu(dt, o->yr, x, mean, invstd, g, b, WN, WC, S));
    ASSERT_OK(ddl_batchnorm_backward_reduce(dt, o->r1, o->r2, dy, x, mean, invstd, WN, WC, S));
    ASSERT_OK(ddl_batchnorm_backward_reduce_relu(dt, o->f1, o->f2, dy, yrelu, x, mean, invstd, WN,
                                                 WC, S));
    ASSERT_OK(ddl_batchnorm_backward_apply_into(dt, o->dx, dy, x, mean, invstd, g, o->r1, o->r2,
                                                WN * S, WN, WC, S));
    memcpy(o->dxa, dy, (size_t)(WN * WC * S) * item); // accumulating onto dy's values
    ASSERT_OK(ddl_batchnorm_backward_apply(dt, o->dxa, dy, x, mean, invstd, g, o->r1, o->r2, WN * S,
                                           WN, WC, S));
    ASSERT_OK(ddl_batchnorm_backward_apply_relu_into(dt, o->dxr, dy, yrelu, x, mean, invstd, g,
                                                     o->f1, o->f2, WN * S, WN, WC, S));
}

static void test_widths(void)
{
    static const int64_t sizes[] = {5, 13, 16, 49};
    int                  cpu     = ddl_batchnorm_width();
    static width_out     ref, got;
    for (int k = 0; k < 2; k++) {
        ddl_dtype dt = k == 0 ? DDL_F32 : DDL_F64;
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
            int64_t S = sizes[si], V = WN * WC * S;
            double  xd[WMAX], dyd[WMAX], yd[WMAX], mean[WC], invstd[WC], gd[WC], bd[WC];
            fill_uniform(xd, V, 50 + si, -2.0, 2.0);
            fill_uniform(dyd, V, 60 + si, -1.0, 1.0);
            fill_uniform(yd, V, 70 + si, -1.0, 1.0); // the ReLU's output: <= 0 masks dy
            fill_uniform(mean, WC, 80 + si, -0.3, 0.3);
            fill_uniform(invstd, WC, 90 + si, 0.5, 2.0);
            fill_uniform(gd, WC, 100 + si, -1.5, 1.5);
            fill_uniform(bd, WC, 110 + si, -0.5, 0.5);
            xd[1]  = NAN;
            dyd[2] = -0.0;
            dyd[3] = INFINITY;
            yd[3]  = -1.0;
            char x[WMAX * 8], dy[WMAX * 8], y[WMAX * 8], g[WC * 8], b[WC * 8];
            to_dt(dt, x, xd, V);
            to_dt(dt, dy, dyd, V);
            to_dt(dt, y, yd, V);
            to_dt(dt, g, gd, WC);
            to_dt(dt, b, bd, WC);
            ddl_batchnorm_set_width(0);
            ASSERT_EQ(ddl_batchnorm_width(), 0);
            width_run(dt, S, x, dy, y, mean, invstd, g, b, &ref);
            for (int w = 1; w <= cpu; w++) {
                ddl_batchnorm_set_width(w);
                ASSERT_EQ(ddl_batchnorm_width(), w);
                memset(&got, 0x5a, sizeof got);
                width_run(dt, S, x, dy, y, mean, invstd, g, b, &got);
                assert_same(DDL_F64, ref.sum, got.sum, WC);
                assert_same(DDL_F64, ref.sqdev, got.sqdev, WC);
                assert_same(DDL_F64, ref.r1, got.r1, WC);
                assert_same(DDL_F64, ref.r2, got.r2, WC);
                assert_same(DDL_F64, ref.f1, got.f1, WC);
                assert_same(DDL_F64, ref.f2, got.f2, WC);
                assert_same(dt, ref.y, got.y, V);
                assert_same(dt, ref.yr, got.yr, V);
                assert_same(dt, ref.dx, got.dx, V);
                assert_same(dt, ref.dxa, got.dxa, V);
                assert_same(dt, ref.dxr, got.dxr, V);
            }
            ddl_batchnorm_set_width(-1);
        }
    }
    ASSERT_EQ(ddl_batchnorm_width(), cpu);
    printf("test_widths: widths 0..%d the same bits\n", cpu);
}

// The entry points walk the data in memory order, carrying the sums of BN_CBLOCK (32)
// channels at a time; the sequential ddl_batchnorm_forward / _backward walk one channel at
// a time. With 37 channels (a block and a part) and rows with and without a tail, the
// pieces give the sequential version's bits: mean, invstd, y, dx and the parameter sums.
static void test_blocks(void)
{
    enum { BN_ = 3, BC = 37, BSMAX = 13, BVMAX = BN_ * BC * BSMAX };
    static const int64_t sizes[] = {5, 13, 8};
    for (int k = 0; k < 2; k++) {
        ddl_dtype dt   = k == 0 ? DDL_F32 : DDL_F64;
        size_t    item = dt == DDL_F32 ? sizeof(float) : sizeof(double);
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
            int64_t S = sizes[si], V = BN_ * BC * S;
            double  xd[BVMAX], dyd[BVMAX], gd[BC], bd[BC];
            fill_uniform(xd, V, 120 + si, -2.0, 3.0);
            fill_uniform(dyd, V, 130 + si, -1.0, 1.0);
            fill_uniform(gd, BC, 140 + si, 0.5, 1.5);
            fill_uniform(bd, BC, 150 + si, -0.5, 0.5);
            char x[BVMAX * 8], dy[BVMAX * 8], g[BC * 8], b[BC * 8];
            to_dt(dt, x, xd, V);
            to_dt(dt, dy, dyd, V);
            to_dt(dt, g, gd, BC);
            to_dt(dt, b, bd, BC);
            // Sequential.
            ddl_batchnorm_params p = ddl_batchnorm_params_default();
            double               m1[BC], is1[BC];
            char                 y1[BVMAX * 8], dx1[BVMAX * 8], dg1[BC * 8], db1[BC * 8];
            memset(dx1, 0, sizeof dx1);
            memset(dg1, 0, sizeof dg1);
            memset(db1, 0, sizeof db1);
            ASSERT_OK(
                ddl_batchnorm_forward(dt, y1, m1, is1, x, g, b, NULL, NULL, NULL, &p, BN_, BC, S));
            ASSERT_OK(
                ddl_batchnorm_backward(dt, dx1, dg1, db1, dy, x, m1, is1, g, true, BN_, BC, S));
            // The pieces, as one rank of the distributed layer runs them.
            double m2[BC], is2[BC], sq[BC], s1[BC], s2[BC];
            char   y2[BVMAX * 8], dx2[BVMAX * 8], dg2[BC * 8], db2[BC * 8];
            memset(dx2, 0, sizeof dx2);
            memset(dg2, 0, sizeof dg2);
            memset(db2, 0, sizeof db2);
            ASSERT_OK(ddl_batchnorm_sum(dt, m2, x, BN_, BC, S));
            for (int c = 0; c < BC; c++) {
                m2[c] /= (double)(BN_ * S);
            }
            ASSERT_OK(ddl_batchnorm_sqdev(dt, sq, x, m2, BN_, BC, S));
            for (int c = 0; c < BC; c++) {
                is2[c] = 1.0 / sqrt(sq[c] / (double)(BN_ * S) + p.eps);
            }
            ASSERT_OK(ddl_batchnorm_normalize(dt, y2, x, m2, is2, g, b, BN_, BC, S));
            ASSERT_OK(ddl_batchnorm_backward_reduce(dt, s1, s2, dy, x, m2, is2, BN_, BC, S));
            ASSERT_OK(ddl_batchnorm_backward_apply(dt, dx2, dy, x, m2, is2, g, s1, s2, BN_ * S, BN_,
                                                   BC, S));
            ASSERT_OK(ddl_batchnorm_param_grads(dt, dg2, db2, s1, s2, BC));
            assert_same(DDL_F64, m1, m2, BC);
            assert_same(DDL_F64, is1, is2, BC);
            ASSERT_TRUE(memcmp(y1, y2, (size_t)V * item) == 0);
            ASSERT_TRUE(memcmp(dx1, dx2, (size_t)V * item) == 0);
            ASSERT_TRUE(memcmp(dg1, dg2, BC * item) == 0);
            ASSERT_TRUE(memcmp(db1, db2, BC * item) == 0);
        }
    }
}

static void test_errors(void)
{
    double               x[4] = {1, 2, 3, 4}, y[4], m[4], is[4], rm[4], rv[4];
    ddl_batchnorm_params p    = ddl_batchnorm_params_default();
    // One value per channel while training.
    ASSERT_STATUS(ddl_batchnorm_forward(DDL_F64, y, m, is, x, NULL, NULL, NULL, NULL, NULL, &p, 1,
                                        4, 1),
                  DDL_EINVAL);
    ASSERT_STATUS(ddl_batchnorm_forward(DDL_F64, y, m, is, x, NULL, NULL, rm, NULL, NULL, &p, 4,
                                        1, 1),
                  DDL_EINVAL);
    p.cumulative = true;
    ASSERT_STATUS(ddl_batchnorm_forward(DDL_F64, y, m, is, x, NULL, NULL, rm, rv, NULL, &p, 4, 1,
                                        1),
                  DDL_EINVAL);
    ASSERT_STATUS(ddl_batchnorm_forward(DDL_F64, y, m, is, x, NULL, NULL, NULL, NULL, NULL, NULL,
                                        4, 1, 1),
                  DDL_EINVAL);
    ASSERT_STATUS(ddl_batchnorm_sum((ddl_dtype)3, m, x, 4, 1, 1), DDL_EINVAL);
    ASSERT_STATUS(ddl_batchnorm_sum(DDL_F64, m, x, -1, 1, 1), DDL_EINVAL);
    ASSERT_STATUS(ddl_batchnorm_running_update(DDL_F64, rm, rv, m, is, 1, 1, 0.1), DDL_EINVAL);
    ASSERT_STATUS(ddl_batchnorm_backward_apply(DDL_F64, y, x, x, m, is, NULL, m, NULL, 4, 4, 1, 1),
                  DDL_EINVAL);
    // The overwriting form refuses the same arguments, and writes nothing when it does.
    double keep[4] = {7, 7, 7, 7};
    ASSERT_STATUS(
        ddl_batchnorm_backward_apply_into(DDL_F64, keep, x, x, m, is, NULL, m, NULL, 4, 4, 1, 1),
        DDL_EINVAL);
    ASSERT_STATUS(
        ddl_batchnorm_backward_apply_into(DDL_F64, keep, x, x, m, is, NULL, m, m, 0, 4, 1, 1),
        DDL_EINVAL);
    ASSERT_STATUS(ddl_batchnorm_backward_apply_into(DDL_F64, keep, x, NULL, m, is, NULL, NULL, NULL,
                                                    0, 4, 1, 1),
                  DDL_EINVAL);
    ASSERT_STATUS(ddl_batchnorm_backward_apply_into((ddl_dtype)3, keep, x, x, m, is, NULL, NULL,
                                                    NULL, 0, 4, 1, 1),
                  DDL_EINVAL);
    // The fused forms refuse bad arguments alike, writing nothing.
    ASSERT_STATUS(ddl_batchnorm_backward_apply_relu_into(DDL_F64, keep, x, NULL, x, m, is, NULL,
                                                         NULL, NULL, 0, 4, 1, 1),
                  DDL_EINVAL);
    ASSERT_STATUS(ddl_batchnorm_backward_apply_relu_into(DDL_F64, keep, x, x, x, m, is, NULL, m,
                                                         NULL, 4, 4, 1, 1),
                  DDL_EINVAL);
    ASSERT_STATUS(ddl_batchnorm_normalize_relu(DDL_F64, keep, NULL, m, is, NULL, NULL, 4, 1, 1),
                  DDL_EINVAL);
    ASSERT_STATUS(ddl_batchnorm_normalize_relu((ddl_dtype)3, keep, x, m, is, NULL, NULL, 4, 1, 1),
                  DDL_EINVAL);
    double s1[1] = {7}, s2[1] = {7};
    ASSERT_STATUS(ddl_batchnorm_backward_reduce_relu(DDL_F64, s1, s2, x, NULL, x, m, is, 4, 1, 1),
                  DDL_EINVAL);
    ASSERT_STATUS(ddl_batchnorm_backward_reduce_relu(DDL_F64, s1, s2, x, x, x, m, is, -1, 1, 1),
                  DDL_EINVAL);
    ASSERT_TRUE(s1[0] == 7 && s2[0] == 7);
    for (int i = 0; i < 4; i++) {
        ASSERT_TRUE(keep[i] == 7);
    }
}

int main(void)
{
    test_hand();
    test_running();
    test_random();
    test_gradcheck();
    test_pieces();
    // The fused kernels against the unfused ones at every width.
    for (int w = ddl_batchnorm_width(); w >= 0; w--) {
        ddl_batchnorm_set_width(w);
        test_fused_relu();
    }
    ddl_batchnorm_set_width(-1);
    test_fused_relu_gradcheck();
    test_widths();
    test_blocks();
    test_errors();
    printf("test_batchnorm_kernel: ok\n");
    return 0;
}
