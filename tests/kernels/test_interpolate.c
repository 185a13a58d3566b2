// Tests of the interpolation kernels: hand-checked 1-D and 2-D cases, the input ranges
// a local output needs, a naive global reference (1-D/2-D/3-D, nearest and linear,
// align_corners both ways, sizes and scale factors, up- and downsampling), windowed
// pieces equal to the same slice of the global result for many splits, the backward
// as the transpose (adjoint test and pieces), f64 finite differences, and errors.
#include <math.h>
#include <string.h>

#include "ddl/base.h"
#include "ddl/decomp.h"
#include "ddl/kernels_pointwise.h"
#include "gradcheck.h"
#include "kernels/interpolate.h"
#include "test.h"

#define MAXE 16384 // elements of the largest [B, spatial...] buffer used here

static void fill_uniform(double *a, int64_t n, uint64_t seed)
{
    for (int64_t i = 0; i < n; i++) {
        a[i] = 2.0 * ddl_rng_uniform(seed, 31, (uint64_t)i) - 1.0;
    }
}

static ddl_interpolate_params params_1d(ddl_interpolate_mode mode, bool align, int64_t in,
                                        int64_t out, double sf)
{
    ddl_interpolate_params p = {.mode = mode, .align_corners = align, .ndim = 1};
    p.in_global[0]           = in;
    p.out_global[0]          = sf > 0.0 ? ddl_interpolate_out_size(in, sf) : out;
    p.scale_factor[0]        = sf;
    return p;
}

// The window covering the whole global input and output.
static ddl_interpolate_window full_window(const ddl_interpolate_params *p)
{
    ddl_interpolate_window w;
    memset(&w, 0, sizeof w);
    for (int k = 0; k < p->ndim; k++) {
        w.in_n[k]  = p->in_global[k];
        w.out_n[k] = p->out_global[k];
    }
    return w;
}

// ---- hand-checked cases -------------------------------------------------------------------

static void run_1d(ddl_interpolate_params p, const double *x, double *y)
{
    ddl_interpolate_window w = full_window(&p);
    ASSERT_OK(ddl_interpolate_forward(DDL_F64, y, x, &p, &w, 1));
}

static void expect(const double *y, const double *want, int n, double tol)
{
    for (int i = 0; i < n; i++) {
        ASSERT_NEAR(y[i], want[i], tol);
    }
}

static void test_hand(void)
{
    double y[16];
    // Linear, align_corners: 3 -> 5 samples at 0, .5, 1, 1.5, 2.
    run_1d(params_1d(DDL_INTERPOLATE_LINEAR, true, 3, 5, 0), (double[]){0, 1, 4}, y);
    expect(y, (double[]){0, 0.5, 1, 2.5, 4}, 5, 1e-15);
    // Linear, half-pixel: 2 -> 4 samples at 0 (clamped), .25, .75, 1.25 (clamped to x[1]).
    run_1d(params_1d(DDL_INTERPOLATE_LINEAR, false, 2, 4, 0), (double[]){0, 1}, y);
    expect(y, (double[]){0, 0.25, 0.75, 1}, 4, 1e-15);
    // Nearest 3 -> 5: floor(j * 3/5) = 0 0 1 1 2.
    run_1d(params_1d(DDL_INTERPOLATE_NEAREST, false, 3, 5, 0), (double[]){10, 20, 30}, y);
    expect(y, (double[]){10, 10, 20, 20, 30}, 5, 0.0);
    // Nearest 7 -> 3 (downsampling): floor(j * 7/3) = 0 2 4.
    run_1d(params_1d(DDL_INTERPOLATE_NEAREST, false, 7, 3, 0), (double[]){0, 1, 2, 3, 4, 5, 6},
           y);
    expect(y, (double[]){0, 2, 4}, 3, 0.0);
    // Nearest with scale factor 2: 5 -> 10, x[j >> 1].
    run_1d(params_1d(DDL_INTERPOLATE_NEAREST, false, 5, 0, 2.0), (double[]){1, 2, 3, 4, 5}, y);
    expect(y, (double[]){1, 1, 2, 2, 3, 3, 4, 4, 5, 5}, 10, 0.0);
    // Scale factor 1.5: 5 -> floor(7.5) = 7; nearest uses 1/1.5, floor(j/1.5).
    ASSERT_EQ(ddl_interpolate_out_size(5, 1.5), 7);
    ASSERT_EQ(ddl_interpolate_out_size(7, 0.5), 3);
    run_1d(params_1d(DDL_INTERPOLATE_NEAREST, false, 5, 0, 1.5), (double[]){1, 2, 3, 4, 5}, y);
    expect(y, (double[]){1, 1, 2, 3, 3, 4, 5}, 7, 0.0);
    // ATen's shortcuts ignore a given scale factor: 5 * 2.1 -> 10 = 2*5 halves the index
    // (floor(8 / 2.1) would read x[3] for output 8), and 5 * 1.1 -> 5 copies.
    run_1d(params_1d(DDL_INTERPOLATE_NEAREST, false, 5, 0, 2.1), (double[]){1, 2, 3, 4, 5}, y);
    expect(y, (double[]){1, 1, 2, 2, 3, 3, 4, 4, 5, 5}, 10, 0.0);
    run_1d(params_1d(DDL_INTERPOLATE_LINEAR, false, 5, 0, 1.1), (double[]){1, 2, 3, 4, 5}, y);
    expect(y, (double[]){1, 2, 3, 4, 5}, 5, 0.0);
    // A single output: align_corners reads x[0]; half-pixel 4 -> 1 samples 1.5.
    run_1d(params_1d(DDL_INTERPOLATE_LINEAR, true, 4, 1, 0), (double[]){3, 5, 7, 9}, y);
    expect(y, (double[]){3}, 1, 0.0);
    run_1d(params_1d(DDL_INTERPOLATE_LINEAR, false, 4, 1, 0), (double[]){3, 5, 7, 9}, y);
    expect(y, (double[]){6}, 1, 1e-15);
    // Linear interpolation reproduces a ramp x_i = i: y_j is the clamped source coordinate.
    const int64_t sizes[][2] = {{5, 10}, {7, 3}, {6, 9}, {10, 4}, {3, 8}};
    for (int c = 0; c < 5; c++) {
        int64_t in = sizes[c][0], out = sizes[c][1];
        double  ramp[16];
        for (int i = 0; i < in; i++) {
            ramp[i] = i;
        }
        run_1d(params_1d(DDL_INTERPOLATE_LINEAR, false, in, out, 0), ramp, y);
        for (int j = 0; j < out; j++) {
            double src = fmax(0.0, (j + 0.5) * (double)in / (double)out - 0.5);
            ASSERT_NEAR(y[j], fmin(src, (double)(in - 1)), 1e-14);
        }
        run_1d(params_1d(DDL_INTERPOLATE_LINEAR, true, in, out, 0), ramp, y);
        for (int j = 0; j < out; j++) {
            ASSERT_NEAR(y[j], j * (double)(in - 1) / (double)(out - 1), 1e-14);
        }
    }
    // Bilinear, align_corners: 2x2 -> 3x3 averages neighbours.
    ddl_interpolate_params p2 = {.mode = DDL_INTERPOLATE_LINEAR, .align_corners = true,
                                 .ndim = 2, .in_global = {2, 2}, .out_global = {3, 3}};
    ddl_interpolate_window w2 = full_window(&p2);
    float                  x2f[4] = {0, 1, 2, 3}, y2f[9];
    ASSERT_OK(ddl_interpolate_forward(DDL_F32, y2f, x2f, &p2, &w2, 1));
    const double want2[9] = {0, 0.5, 1, 1, 1.5, 2, 2, 2.5, 3};
    for (int i = 0; i < 9; i++) {
        ASSERT_NEAR(y2f[i], want2[i], 0.0);
    }
}

static void test_need(void)
{
    int64_t lo, hi;
    // Linear, half-pixel, 5 -> 10 (scale 1/2): outputs 0..4 read [0, 3), 5..9 read [2, 5).
    ddl_interpolate_params p = params_1d(DDL_INTERPOLATE_LINEAR, false, 5, 10, 0);
    ASSERT_OK(ddl_interpolate_need(DDL_F64, &p, 0, 0, 5, &lo, &hi));
    ASSERT_EQ(lo, 0);
    ASSERT_EQ(hi, 3);
    ASSERT_OK(ddl_interpolate_need(DDL_F64, &p, 0, 5, 5, &lo, &hi));
    ASSERT_EQ(lo, 2);
    ASSERT_EQ(hi, 5);
    // Nearest 7 -> 3: outputs 1..2 read 2 and 4.
    p = params_1d(DDL_INTERPOLATE_NEAREST, false, 7, 3, 0);
    ASSERT_OK(ddl_interpolate_need(DDL_F32, &p, 0, 1, 2, &lo, &hi));
    ASSERT_EQ(lo, 2);
    ASSERT_EQ(hi, 5);
    // Linear, align_corners, 4 -> 7 (step 1/2): output 3 sits exactly on input 1.5.
    p = params_1d(DDL_INTERPOLATE_LINEAR, true, 4, 7, 0);
    ASSERT_OK(ddl_interpolate_need(DDL_F64, &p, 0, 3, 1, &lo, &hi));
    ASSERT_EQ(lo, 1);
    ASSERT_EQ(hi, 3);
    // An empty output range needs nothing.
    ASSERT_OK(ddl_interpolate_need(DDL_F64, &p, 0, 7, 0, &lo, &hi));
    ASSERT_EQ(hi - lo, 0);
    ASSERT_STATUS(ddl_interpolate_need(DDL_F64, &p, 0, 6, 2, &lo, &hi), DDL_EINVAL);
    ASSERT_STATUS(ddl_interpolate_need(DDL_F64, &p, 1, 0, 1, &lo, &hi), DDL_EINVAL);
}

// ---- naive global reference -----------------------------------------------------------------

// The documented per-dim rule for global output index j: taps (i0, w0), (i1, w1).
static void ref_taps(ddl_dtype dt, const ddl_interpolate_params *p, int k, int64_t j,
                     int64_t i[2], double w[2])
{
    int64_t in = p->in_global[k], out = p->out_global[k];
    double  sf = p->scale_factor[k];
    if (in == out) {
        i[0] = i[1] = j;
        w[0]        = 1.0;
        w[1]        = 0.0;
        return;
    }
    if (p->mode == DDL_INTERPOLATE_NEAREST) {
        if (out == 2 * in) {
            i[0] = j / 2;
        } else {
            float scale = sf > 0 ? (float)(1.0 / sf) : (float)in / (float)out;
            i[0]        = (int64_t)floorf((float)j * scale);
            i[0]        = i[0] > in - 1 ? in - 1 : i[0];
        }
        i[1] = i[0];
        w[0] = 1.0;
        w[1] = 0.0;
        return;
    }
    double src, l;
    if (dt == DDL_F32) {
        float s = p->align_corners ? (out > 1 ? (float)(in - 1) / (float)(out - 1) : 0.0f)
                                   : (sf > 0 ? (float)(1.0 / sf) : (float)in / (float)out);
        float fs = p->align_corners ? s * (float)j : fmaxf(0.0f, s * ((float)j + 0.5f) - 0.5f);
        i[0]     = (int64_t)floorf(fs);
        i[0]     = i[0] > in - 1 ? in - 1 : i[0];
        float lf = fminf(fmaxf(fs - (float)i[0], 0.0f), 1.0f);
        w[0]     = 1.0f - lf;
        w[1]     = lf;
    } else {
        double s = p->align_corners ? (out > 1 ? (double)(in - 1) / (double)(out - 1) : 0.0)
                                    : (sf > 0 ? 1.0 / sf : (double)in / (double)out);
        src  = p->align_corners ? s * (double)j : fmax(0.0, s * ((double)j + 0.5) - 0.5);
        i[0] = (int64_t)floor(src);
        i[0] = i[0] > in - 1 ? in - 1 : i[0];
        l    = fmin(fmax(src - (double)i[0], 0.0), 1.0);
        w[0] = 1.0 - l;
        w[1] = l;
    }
    i[1] = i[0] + 1 < in ? i[0] + 1 : in - 1;
}

// y[B, out...] from x[B, in...] over the whole global tensors, corner by corner.
static void ref_forward(ddl_dtype dt, const ddl_interpolate_params *p, const double *x, double *y,
                        int64_t B)
{
    int     nd      = p->ndim;
    int64_t in_vol  = 1, out_vol = 1;
    for (int k = 0; k < nd; k++) {
        in_vol *= p->in_global[k];
        out_vol *= p->out_global[k];
    }
    for (int64_t b = 0; b < B; b++) {
        for (int64_t o = 0; o < out_vol; o++) {
            int64_t idx[3][2];
            double  wt[3][2];
            int64_t rem = o;
            for (int k = nd - 1; k >= 0; k--) {
                ref_taps(dt, p, k, rem % p->out_global[k], idx[k], wt[k]);
                rem /= p->out_global[k];
            }
            double v = 0.0;
            for (int corner = 0; corner < (1 << nd); corner++) {
                double  wc = 1.0;
                int64_t flat = 0;
                for (int k = 0; k < nd; k++) {
                    int bit = (corner >> k) & 1;
                    wc *= wt[k][bit];
                    flat = flat * p->in_global[k] + idx[k][bit];
                }
                v += wc * x[b * in_vol + flat];
            }
            y[b * out_vol + o] = v;
        }
    }
}

// ---- windows and boxes --------------------------------------------------------------------

// Pads per-dim values to 3 dims (leading dims of size 1) for the box helpers below.
static void pad3(int nd, const int64_t *v, int64_t fill, int64_t out[3])
{
    for (int k = 0; k < 3; k++) {
        out[k] = k < 3 - nd ? fill : v[k - (3 - nd)];
    }
}

// dst[B, dsh] = src[B, ssh] at offset off (add: dst += box of src, with roles swapped:
// dst is the big array and src the box).
static void box_copy(double *dst, const double *src, int64_t B, const int64_t dsh[3],
                     const int64_t ssh[3], const int64_t off[3], bool add)
{
    const int64_t *big = add ? dsh : ssh, *small = add ? ssh : dsh;
    int64_t        bv = big[0] * big[1] * big[2], sv = small[0] * small[1] * small[2];
    for (int64_t b = 0; b < B; b++) {
        for (int64_t i0 = 0; i0 < small[0]; i0++) {
            for (int64_t i1 = 0; i1 < small[1]; i1++) {
                for (int64_t i2 = 0; i2 < small[2]; i2++) {
                    int64_t s = b * sv + (i0 * small[1] + i1) * small[2] + i2;
                    int64_t g = b * bv +
                                ((i0 + off[0]) * big[1] + i1 + off[1]) * big[2] + i2 + off[2];
                    if (add) {
                        dst[g] += src[s];
                    } else {
                        dst[s] = src[g];
                    }
                }
            }
        }
    }
}

static void to_dt(ddl_dtype dt, void *out, const double *in, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        if (dt == DDL_F32) {
            ((float *)out)[i] = (float)in[i];
        } else {
            ((double *)out)[i] = in[i];
        }
    }
}

static void from_dt(ddl_dtype dt, double *out, const void *in, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        out[i] = dt == DDL_F32 ? (double)((const float *)in)[i] : ((const double *)in)[i];
    }
}

// ---- one configuration ----------------------------------------------------------------------

typedef struct gc_ctx {
    const ddl_interpolate_params *p;
    const ddl_interpolate_window *w;
    double                       *x, *y;
    const double                 *dy;
    int64_t                       B, out_vol;
} gc_ctx;

static double gc_objective(void *q)
{
    gc_ctx *c = q;
    ASSERT_OK(ddl_interpolate_forward(DDL_F64, c->y, c->x, c->p, c->w, c->B));
    double s = 0.0;
    for (int64_t i = 0; i < c->B * c->out_vol; i++) {
        s += c->dy[i] * c->y[i];
    }
    return s;
}

static void check_config(ddl_dtype dt, const ddl_interpolate_params *p)
{
    const int64_t B  = 2;
    int           nd = p->ndim;
    int64_t       in_vol = 1, out_vol = 1;
    for (int k = 0; k < nd; k++) {
        in_vol *= p->in_global[k];
        out_vol *= p->out_global[k];
    }
    ASSERT_LE(B * in_vol, MAXE);
    ASSERT_LE(B * out_vol, MAXE);
    static double x[MAXE], dy[MAXE], y[MAXE], yr[MAXE], dx[MAXE], dxa[MAXE], tmp[MAXE];
    static double bx[MAXE], by[MAXE], bdx[MAXE], bdy[MAXE];
    static double gx[MAXE], gy[MAXE], gdx[MAXE], gdy[MAXE]; // typed by dt
    fill_uniform(x, B * in_vol, 40 + (uint64_t)nd);
    fill_uniform(dy, B * out_vol, 50 + (uint64_t)nd);
    double tol = dt == DDL_F64 ? 1e-14 : 2e-6;

    // Whole tensors against the reference.
    ddl_interpolate_window full = full_window(p);
    to_dt(dt, gx, x, B * in_vol);
    to_dt(dt, gdy, dy, B * out_vol);
    from_dt(dt, x, gx, B * in_vol); // the values actually used (rounded for f32)
    from_dt(dt, dy, gdy, B * out_vol);
    ASSERT_OK(ddl_interpolate_forward(dt, gy, gx, p, &full, B));
    from_dt(dt, y, gy, B * out_vol);
    ref_forward(dt, p, x, yr, B);
    for (int64_t i = 0; i < B * out_vol; i++) {
        ASSERT_NEAR(y[i], yr[i], tol);
    }
    // Adjoint (dot-product) test: <A x, dy> = <x, A^T dy>; dx accumulates onto 0.
    memset(gdx, 0, sizeof gdx);
    ASSERT_OK(ddl_interpolate_backward(dt, gdx, gdy, p, &full, B));
    from_dt(dt, dx, gdx, B * in_vol);
    double ax_y = 0, x_aty = 0, nax = 0, ny = 0, nx = 0, naty = 0;
    for (int64_t i = 0; i < B * out_vol; i++) {
        ax_y += y[i] * dy[i];
        nax += y[i] * y[i];
        ny += dy[i] * dy[i];
    }
    for (int64_t i = 0; i < B * in_vol; i++) {
        x_aty += x[i] * dx[i];
        nx += x[i] * x[i];
        naty += dx[i] * dx[i];
    }
    double den = fmax(sqrt(nax) * sqrt(ny), sqrt(nx) * sqrt(naty));
    ASSERT_LE(fabs(ax_y - x_aty) / den, dt == DDL_F64 ? 1e-13 : 1e-5);

    // Pieces: every split of every dim into P balanced parts, with 0 or 1 extra input
    // element of margin around the needed range. Forward pieces equal the global slice
    // exactly; backward pieces scatter-added together equal the global backward.
    for (int64_t P = 1; P <= 4; P++) {
        int64_t npieces = 1;
        for (int k = 0; k < nd; k++) {
            npieces *= P;
        }
        memset(dxa, 0, sizeof(double) * (size_t)(B * in_vol));
        for (int64_t piece = 0; piece < npieces; piece++) {
            ddl_interpolate_window w;
            memset(&w, 0, sizeof w);
            int64_t rem = piece, ovol = 1, ivol = 1;
            for (int k = nd - 1; k >= 0; k--) {
                int64_t i    = rem % P;
                rem /= P;
                w.out_start[k] = ddl_decomp_start(p->out_global[k], P, i);
                w.out_n[k]     = ddl_decomp_size(p->out_global[k], P, i);
                int64_t lo, hi, margin = (piece + k) % 2;
                ASSERT_OK(ddl_interpolate_need(dt, p, k, w.out_start[k], w.out_n[k], &lo, &hi));
                if (w.out_n[k] == 0) {
                    lo = hi = 0;
                }
                lo            = lo - margin < 0 ? 0 : lo - margin;
                hi            = hi + margin > p->in_global[k] ? p->in_global[k] : hi + margin;
                w.in_start[k] = lo;
                w.in_n[k]     = hi - lo;
                ovol *= w.out_n[k];
                ivol *= w.in_n[k];
            }
            int64_t gin[3], gout[3], lin[3], lout[3], oin[3], oout[3];
            pad3(nd, p->in_global, 1, gin);
            pad3(nd, p->out_global, 1, gout);
            pad3(nd, w.in_n, 1, lin);
            pad3(nd, w.out_n, 1, lout);
            pad3(nd, w.in_start, 0, oin);
            pad3(nd, w.out_start, 0, oout);
            // Forward.
            box_copy(bx, x, B, lin, gin, oin, false);
            to_dt(dt, gx, bx, B * ivol);
            ASSERT_OK(ddl_interpolate_forward(dt, gy, gx, p, &w, B));
            from_dt(dt, by, gy, B * ovol);
            box_copy(tmp, y, B, lout, gout, oout, false);
            for (int64_t i = 0; i < B * ovol; i++) {
                ASSERT_NEAR(by[i], tmp[i], 0.0);
            }
            // Backward, accumulated into the piece's input box, then into the whole.
            box_copy(bdy, dy, B, lout, gout, oout, false);
            to_dt(dt, gdy, bdy, B * ovol);
            memset(gdx, 0, sizeof gdx);
            ASSERT_OK(ddl_interpolate_backward(dt, gdx, gdy, p, &w, B));
            from_dt(dt, bdx, gdx, B * ivol);
            box_copy(dxa, bdx, B, gin, lin, oin, true);
        }
        for (int64_t i = 0; i < B * in_vol; i++) {
            ASSERT_NEAR(dxa[i], dx[i], dt == DDL_F64 ? 1e-13 : 1e-5);
        }
    }

    // Finite differences (f64): f(x) = <dy, A x>.
    if (dt == DDL_F64) {
        gc_ctx c = {.p = p, .w = &full, .x = x, .y = y, .dy = dy, .B = B, .out_vol = out_vol};
        ASSERT_LE(ddl_test_gradcheck(B * in_vol, x, dx, gc_objective, &c, 1e-5, 200), 1e-9);
    }
}

// Sizes (out > 0) or scale factors (sf > 0), each run in nearest, linear and linear with
// align_corners, f32 and f64.
typedef struct shape_case {
    int     ndim;
    int64_t in[3], out[3];
    double  sf[3];
} shape_case;

// The params of a case in the given mode.
static ddl_interpolate_params case_params(const shape_case *sc, ddl_interpolate_mode mode,
                                          bool align)
{
    ddl_interpolate_params p = {.mode = mode, .align_corners = align, .ndim = sc->ndim};
    for (int k = 0; k < p.ndim; k++) {
        p.in_global[k]    = sc->in[k];
        p.scale_factor[k] = sc->sf[k];
        p.out_global[k] =
            sc->sf[k] > 0 ? ddl_interpolate_out_size(sc->in[k], sc->sf[k]) : sc->out[k];
    }
    return p;
}

static void test_configs(void)
{
    const shape_case cases[] = {
        {1, {5}, {10}, {0}},  // upsampling by a size
        {1, {5}, {0}, {2.0}}, // scale factor 2
        {1, {7}, {3}, {0}},   // downsampling
        {1, {5}, {0}, {1.5}}, // fractional scale factor
        {1, {3}, {8}, {0}},
        {1, {6}, {6}, {0}},   // same size: a copy
        {1, {4}, {1}, {0}},   // a single output
        {1, {1}, {5}, {0}},   // a single input
        {1, {9}, {0}, {0.5}}, // scale factor below 1
        {2, {5, 4}, {10, 7}, {0, 0}},
        {2, {7, 3}, {3, 6}, {0, 0}},
        {2, {4, 5}, {0, 0}, {2.0, 1.5}},
        {3, {3, 4, 5}, {6, 3, 7}, {0, 0, 0}},
        {3, {2, 3, 4}, {0, 0, 0}, {2.0, 2.0, 2.0}},
        {3, {4, 2, 3}, {3, 5, 3}, {0, 0, 0}},
        // Outputs wider than the kernel's tap tables (256): the whole computes the taps per
        // element, its pieces from the tables, and the forward pieces must equal it exactly.
        {1, {150}, {300}, {0}},
        {2, {3, 130}, {0, 0}, {1.5, 2.0}},
        {2, {131, 2}, {262, 3}, {0, 0}},
        // An input row longer than the kernel's row buffer (1024): the whole computes per
        // tap, its pieces (1000 inputs and fewer) through the buffer.
        {1, {2000}, {200}, {0}},
        // 3-D (four input rows per output row) with rows past the tables: the whole per
        // tap, its pieces through the buffer.
        {3, {2, 2, 150}, {0, 0, 0}, {2.0, 2.0, 2.0}},
    };
    const int ncases = (int)(sizeof cases / sizeof cases[0]);
    for (int c = 0; c < ncases; c++) {
        for (int m = 0; m < 3; m++) {
            ddl_interpolate_params p = case_params(
                &cases[c], m == 0 ? DDL_INTERPOLATE_NEAREST : DDL_INTERPOLATE_LINEAR, m == 2);
            check_config(DDL_F64, &p);
            check_config(DDL_F32, &p);
        }
    }
}

// Every vector width the CPU has gives the bits of the widest, forward and backward, f32
// and f64: 3-D upsampling as the U-Net's (rows through the buffer), 2-D downsampling, and a
// row too long for the buffer.
static void test_widths(void)
{
    const shape_case cases[] = {
        {3, {5, 6, 7}, {0, 0, 0}, {2.0, 2.0, 2.0}},
        {2, {9, 13}, {4, 6}, {0, 0}},
        {1, {1100}, {1700}, {0}},
    };
    const int ncases = (int)(sizeof cases / sizeof cases[0]);
    ddl_interpolate_set_width(-1);
    const int top = ddl_interpolate_width(); // the CPU's widest
    enum { N = 3 * 16 * 14 * 12 };
    static double x[N], dy[N];
    static char   gx[N * 8], gdy[N * 8], y[3][N * 8], dx[3][N * 8];
    fill_uniform(x, N, 71);
    fill_uniform(dy, N, 72);
    for (int c = 0; c < ncases; c++) {
        for (int m = 1; m < 3; m++) {
            for (int f = 0; f < 2; f++) {
                ddl_dtype              dt = f ? DDL_F64 : DDL_F32;
                ddl_interpolate_params p  = case_params(&cases[c], DDL_INTERPOLATE_LINEAR, m == 2);
                int64_t                ni = 3, no = 3; // B = 3
                for (int k = 0; k < p.ndim; k++) {
                    ni *= p.in_global[k];
                    no *= p.out_global[k];
                }
                ASSERT_LE(ni, N);
                ASSERT_LE(no, N);
                ddl_interpolate_window w = full_window(&p);
                to_dt(dt, gx, x, ni);
                to_dt(dt, gdy, dy, no);
                size_t es = dt == DDL_F64 ? 8 : 4;
                for (int width = top; width >= 0; width--) {
                    ddl_interpolate_set_width(width);
                    ASSERT_EQ(ddl_interpolate_width(), width);
                    ASSERT_OK(ddl_interpolate_forward(dt, y[width], gx, &p, &w, 3));
                    memset(dx[width], 0, (size_t)ni * es);
                    ASSERT_OK(ddl_interpolate_backward(dt, dx[width], gdy, &p, &w, 3));
                    ASSERT_TRUE(memcmp(y[width], y[top], (size_t)no * es) == 0);
                    ASSERT_TRUE(memcmp(dx[width], dx[top], (size_t)ni * es) == 0);
                }
                ddl_interpolate_set_width(-1);
            }
        }
    }
}

static void test_errors(void)
{
    double                 x[16] = {0}, y[16];
    ddl_interpolate_params p     = params_1d(DDL_INTERPOLATE_LINEAR, false, 5, 10, 0);
    ddl_interpolate_window w     = full_window(&p);
    // Output 5..9 reads input [2, 5); an input box [3, 5) is short by one.
    w.out_start[0] = 5;
    w.out_n[0]     = 5;
    w.in_start[0]  = 3;
    w.in_n[0]      = 2;
    ASSERT_STATUS(ddl_interpolate_forward(DDL_F64, y, x, &p, &w, 1), DDL_EINVAL);
    ASSERT_STATUS(ddl_interpolate_backward(DDL_F64, y, x, &p, &w, 1), DDL_EINVAL);
    w.in_start[0] = 2;
    w.in_n[0]     = 3;
    ASSERT_OK(ddl_interpolate_forward(DDL_F64, y, x, &p, &w, 1));
    // An input box beyond the global input.
    w.in_n[0] = 4;
    ASSERT_STATUS(ddl_interpolate_forward(DDL_F64, y, x, &p, &w, 1), DDL_EINVAL);
    // A scale factor that does not give out_global.
    ddl_interpolate_params q = params_1d(DDL_INTERPOLATE_NEAREST, false, 5, 0, 2.0);
    q.out_global[0]          = 9;
    w                        = full_window(&q);
    ASSERT_STATUS(ddl_interpolate_forward(DDL_F64, y, x, &q, &w, 1), DDL_EINVAL);
    // Bad dims, sizes and modes.
    q = params_1d(DDL_INTERPOLATE_NEAREST, false, 5, 10, 0);
    q.ndim = 0;
    ASSERT_STATUS(ddl_interpolate_forward(DDL_F64, y, x, &q, &w, 1), DDL_EINVAL);
    q.ndim = 4;
    ASSERT_STATUS(ddl_interpolate_forward(DDL_F64, y, x, &q, &w, 1), DDL_EINVAL);
    q = params_1d(DDL_INTERPOLATE_NEAREST, false, 0, 10, 0);
    ASSERT_STATUS(ddl_interpolate_forward(DDL_F64, y, x, &q, &w, 1), DDL_EINVAL);
    q      = params_1d(DDL_INTERPOLATE_NEAREST, false, 5, 10, 0);
    q.mode = (ddl_interpolate_mode)5;
    ASSERT_STATUS(ddl_interpolate_forward(DDL_F64, y, x, &q, &w, 1), DDL_EINVAL);
    q = params_1d(DDL_INTERPOLATE_NEAREST, false, 5, 10, 0);
    ASSERT_STATUS(ddl_interpolate_forward(DDL_F64, y, x, &q, &w, -1), DDL_EINVAL);
    ASSERT_STATUS(ddl_interpolate_forward(DDL_F64, y, x, &q, NULL, 1), DDL_EINVAL);
    // Zero volume is fine, with NULL buffers.
    ASSERT_OK(ddl_interpolate_forward(DDL_F64, NULL, NULL, &q, &w, 0));
}

int main(void)
{
    test_hand();
    test_need();
    test_configs();
    test_widths();
    test_errors();
    printf("test_interpolate: ok\n");
    return 0;
}
