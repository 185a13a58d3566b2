// kernels/interpolate.c: nearest and (bi/tri)linear interpolation with global offsets.
//
// x is [B, in_n[0], .., in_n[nd-1]] and y is [B, out_n[0], .., out_n[nd-1]]: local boxes
// of a global input (in_global) and a global output (out_global) per spatial dim,
// starting at the global offsets in_start and out_start. Every output element is a
// weighted sum of at most 2^nd input elements; the weights of one output element are
// the product over dims of a per-dim tap pair (i0, w0), (i1, w1) computed from the
// *global* output index, so a piece of the output equals the same piece of the
// sequential result exactly (same arithmetic, same rounding).
//
// The per-dim coordinate rules are ATen's (aten/src/ATen/native/UpSample.h:
// area_pixel_compute_scale, area_pixel_compute_source_index, guard_index_and_lambda,
// compute_source_index_and_lambda; cpu/UpSampleKernel.cpp: nearest_idx), including its
// shortcuts (in == out copies; nearest with out == 2*in halves the index) and its
// precision (the scale and source coordinate in float for f32 tensors, and always in
// float for nearest). ATen floors the coordinate with floorf even for double; we use
// floor in double. Docs: https://pytorch.org/docs/stable/generated/torch.nn.Upsample.html
//
// Backward is the transpose of the same operator: dx[i] += w * dy[j] for every tap
// (i, w) of every output j (a scatter-add). In a distributed layer the input box
// includes halos; their gradient contributions go back through the halo adjoint.
#include <math.h>

#include "base/check.h"
#include "ddl/base.h"
#include "ddl/kernels_pointwise.h"
#include "kernels/dtype.h"
#include "kernels/interpolate.h"

#define MAXD DDL_INTERPOLATE_MAX_DIMS

// ---- per-dim coordinates ----------------------------------------------------------

// One spatial dim, in global coordinates, plus the local boxes.
typedef struct dim_spec {
    int64_t in, out;     // global sizes
    double  sf;          // scale factor as given (0: none)
    bool    linear;      // linear mode (else nearest)
    bool    align;       // align_corners
    int64_t in_start, in_n, out_start, out_n;
} dim_spec;

// The taps of one output index: input indices (global) and weights.
typedef struct tap {
    int     n;           // 1 or 2 taps
    int64_t i[2];
    double  w[2];
} tap;

static int64_t min64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

// nearest_idx: the source of output index j, always computed in float.
KERNEL int64_t nearest_src(const dim_spec *d, int64_t j)
{
    if (d->out == d->in) {
        return j;
    }
    if (d->out == 2 * d->in) {
        return j >> 1;
    }
    float scale = d->sf > 0.0 ? (float)(1.0 / d->sf) : (float)d->in / (float)d->out;
    return min64((int64_t)floorf((float)j * scale), d->in - 1);
}

// compute_source_index_and_lambda in float: (i0, lambda) of output index j.
KERNEL void linear_src_f32(const dim_spec *d, int64_t j, int64_t *i0, double *lambda)
{
    float scale, src;
    if (d->align) {
        scale = d->out > 1 ? (float)(d->in - 1) / (float)(d->out - 1) : 0.0f;
        src   = scale * (float)j;
    } else {
        scale = d->sf > 0.0 ? (float)(1.0 / d->sf) : (float)d->in / (float)d->out;
        src   = scale * ((float)j + 0.5f) - 0.5f;
        src   = src < 0.0f ? 0.0f : src;
    }
    *i0     = min64((int64_t)floorf(src), d->in - 1);
    float l = src - (float)*i0;
    l       = l < 0.0f ? 0.0f : (l > 1.0f ? 1.0f : l);
    *lambda = l;
}

// The same in double.
KERNEL void linear_src_f64(const dim_spec *d, int64_t j, int64_t *i0, double *lambda)
{
    double scale, src;
    if (d->align) {
        scale = d->out > 1 ? (double)(d->in - 1) / (double)(d->out - 1) : 0.0;
        src   = scale * (double)j;
    } else {
        scale = d->sf > 0.0 ? 1.0 / d->sf : (double)d->in / (double)d->out;
        src   = scale * ((double)j + 0.5) - 0.5;
        src   = src < 0.0 ? 0.0 : src;
    }
    *i0      = min64((int64_t)floor(src), d->in - 1);
    double l = src - (double)*i0;
    *lambda  = l < 0.0 ? 0.0 : (l > 1.0 ? 1.0 : l);
}

// The taps of global output index j. A copy (in == out) and nearest have one tap.
KERNEL tap dim_tap(ddl_dtype dt, const dim_spec *d, int64_t j)
{
    tap t;
    if (!d->linear || d->in == d->out) {
        t.n    = 1;
        t.i[0] = t.i[1] = d->linear ? j : nearest_src(d, j);
        t.w[0]          = 1.0;
        t.w[1]          = 0.0;
        return t;
    }
    int64_t i0;
    double  l1;
    if (dt == DDL_F32) {
        linear_src_f32(d, j, &i0, &l1);
        t.w[0] = (double)(1.0f - (float)l1); // lambda0 = 1 - lambda1 in the tensor's type
    } else {
        linear_src_f64(d, j, &i0, &l1);
        t.w[0] = 1.0 - l1;
    }
    t.n    = 2;
    t.i[0] = i0;
    t.i[1] = i0 < d->in - 1 ? i0 + 1 : i0;
    t.w[1] = l1;
    return t;
}

// [lo, hi) of global input read by outputs [out_start, out_start + out_n) (out_n > 0).
// Every source index is nondecreasing in j, but a loop costs little and assumes nothing.
static void dim_need(ddl_dtype dt, const dim_spec *d, int64_t out_start, int64_t out_n,
                     int64_t *lo, int64_t *hi)
{
    int64_t a = INT64_MAX, b = INT64_MIN;
    for (int64_t j = out_start; j < out_start + out_n; j++) {
        tap t = dt == DDL_F32 ? dim_tap(DDL_F32, d, j) : dim_tap(DDL_F64, d, j);
        for (int k = 0; k < t.n; k++) {
            a = t.i[k] < a ? t.i[k] : a;
            b = t.i[k] > b ? t.i[k] : b;
        }
    }
    *lo = a;
    *hi = b + 1;
}

// ---- validation --------------------------------------------------------------------

static ddl_status check_params(const char *who, ddl_dtype dt, const ddl_interpolate_params *p)
{
    DDL_REQUIRE(dt == DDL_F32 || dt == DDL_F64, DDL_EINVAL, "%s: unknown dtype %d", who, (int)dt);
    DDL_REQUIRE(p != NULL, DDL_EINVAL, "%s: NULL params", who);
    DDL_REQUIRE(p->mode == DDL_INTERPOLATE_NEAREST || p->mode == DDL_INTERPOLATE_LINEAR,
                DDL_EINVAL, "%s: unknown mode %d (nearest or linear)", who, (int)p->mode);
    DDL_REQUIRE(p->ndim >= 1 && p->ndim <= MAXD, DDL_EINVAL,
                "%s: %d spatial dims, expected 1 to %d", who, p->ndim, MAXD);
    for (int k = 0; k < p->ndim; k++) {
        DDL_REQUIRE(p->in_global[k] > 0 && p->out_global[k] > 0, DDL_EINVAL,
                    "%s: input and output sizes should be greater than 0, got %lld -> %lld in "
                    "spatial dim %d",
                    who, (long long)p->in_global[k], (long long)p->out_global[k], k);
        DDL_REQUIRE(p->scale_factor[k] >= 0.0 && isfinite(p->scale_factor[k]), DDL_EINVAL,
                    "%s: scale_factor %g in spatial dim %d (0 when a size is given)", who,
                    p->scale_factor[k], k);
        DDL_REQUIRE(p->scale_factor[k] == 0.0 ||
                        ddl_interpolate_out_size(p->in_global[k], p->scale_factor[k]) ==
                            p->out_global[k],
                    DDL_EINVAL,
                    "%s: scale_factor %g turns size %lld into %lld, not out_global %lld "
                    "(spatial dim %d)",
                    who, p->scale_factor[k], (long long)p->in_global[k],
                    (long long)ddl_interpolate_out_size(p->in_global[k], p->scale_factor[k]),
                    (long long)p->out_global[k], k);
    }
    return DDL_OK;
}

// Pads the params and window to 3 dims (leading dims of size 1, copied) and checks the
// window: boxes inside the global sizes, and the input box covering what the output
// box reads.
static ddl_status make_dims(const char *who, ddl_dtype dt, const ddl_interpolate_params *p,
                            const ddl_interpolate_window *w, dim_spec d[MAXD])
{
    DDL_CHECK(check_params(who, dt, p));
    DDL_REQUIRE(w != NULL, DDL_EINVAL, "%s: NULL window", who);
    int pad = MAXD - p->ndim;
    for (int k = 0; k < MAXD; k++) {
        d[k] = (dim_spec){.in = 1, .out = 1, .in_n = 1, .out_n = 1};
    }
    for (int k = 0; k < p->ndim; k++) {
        dim_spec *e = &d[pad + k];
        *e = (dim_spec){.in        = p->in_global[k],
                        .out       = p->out_global[k],
                        .sf        = p->scale_factor[k],
                        .linear    = p->mode == DDL_INTERPOLATE_LINEAR,
                        .align     = p->align_corners,
                        .in_start  = w->in_start[k],
                        .in_n      = w->in_n[k],
                        .out_start = w->out_start[k],
                        .out_n     = w->out_n[k]};
        DDL_REQUIRE(e->out_start >= 0 && e->out_n >= 0 && e->out_start + e->out_n <= e->out,
                    DDL_EINVAL, "%s: output box [%lld, %lld) outside [0, %lld) in spatial dim %d",
                    who, (long long)e->out_start, (long long)(e->out_start + e->out_n),
                    (long long)e->out, k);
        DDL_REQUIRE(e->in_start >= 0 && e->in_n >= 0 && e->in_start + e->in_n <= e->in,
                    DDL_EINVAL, "%s: input box [%lld, %lld) outside [0, %lld) in spatial dim %d",
                    who, (long long)e->in_start, (long long)(e->in_start + e->in_n),
                    (long long)e->in, k);
    }
    for (int k = 0; k < p->ndim; k++) {
        const dim_spec *e = &d[pad + k];
        if (e->out_n == 0) {
            continue;
        }
        int64_t lo, hi;
        dim_need(dt, e, e->out_start, e->out_n, &lo, &hi);
        DDL_REQUIRE(e->in_start <= lo && hi <= e->in_start + e->in_n, DDL_EINVAL,
                    "%s: output box [%lld, %lld) reads input [%lld, %lld) but the input box is "
                    "[%lld, %lld) in spatial dim %d",
                    who, (long long)e->out_start, (long long)(e->out_start + e->out_n),
                    (long long)lo, (long long)hi, (long long)e->in_start,
                    (long long)(e->in_start + e->in_n), k);
    }
    return DDL_OK;
}

// ---- kernel ---------------------------------------------------------------------------

// The taps of dims 1 and 2 are the same for every row and every plane: interp_run
// computes them once per call into tables when the local output extent fits (TAPS_MAX; a
// larger one computes them per row and per element). The same taps, so the same bits; the
// per-element coordinate arithmetic (a float division, floorf) would cost more than the
// interpolation itself.
#define TAPS_MAX 256
// Longest local input row (dim 2) the row path buffers (ROW_MAX doubles on the stack).
#define ROW_MAX 1024

// A tap made local: its inputs' offsets in the local x box (elements, the dim's stride
// applied) and their weights.
typedef struct ltap {
    int     n;
    int64_t off[2];
    double  w[2];
} ltap;

KERNEL ltap local_tap(ddl_dtype dt, const dim_spec *d, int64_t o, int64_t stride)
{
    tap  t = dim_tap(dt, d, d->out_start + o);
    ltap l = {.n = t.n};
    for (int k = 0; k < 2; k++) {
        l.off[k] = (t.i[k] - d->in_start) * stride;
        l.w[k]   = t.w[k];
    }
    return l;
}

// The taps of a call: dim 1's per row (t1, or NULL: computed per row) and dim 2's by tap
// rank, so that a row's loop reads arrays (n2 = 0: computed per element). Every tap of a
// dim has the same count (2 for linear with in != out, else 1).
typedef struct taps {
    const ltap *t1;
    int         n2;
    int64_t     off2[2][TAPS_MAX];
    double      w2[2][TAPS_MAX];
} taps;

// One output row (fixed o0, o1). Its at most 4 input rows (dims 0 and 1's tap pairs, in the
// order a, c) start at base[k], with weight w01[k] = w0[a] * w1[c]. The dims are applied
// one after another:
//   z[i]  = sum over k of w01[k] * x[base[k] + i]        (dims 0 and 1, at dim-2 input i)
//   y[o2] = sum over e of w2[e] * z[off2[e]]             (dim 2)
// each sum in double from 0, in the order written, y rounded once: 2 terms per output
// where the 8 corners of the whole stencil cost 8. z of a position is the same whether
// it comes from the row buffer or is computed per tap (z_at), so every path gives the same
// bits, at every vector width (no multiply-add is contracted: see CMakeLists.txt), and a
// piece of the output equals the same piece of the whole. The backward is the transpose,
// in the reverse order:
//   h[i] = sum over o2, then e, with off2[e] = i, of w2[e] * dy[o2]   (dim 2, into buf)
//   dx[base[k] + i] += w01[k] * h[i]                               (dims 0 and 1)
// or, without the buffer, each term w01[k] * (w2[e] * dy[o2]) added on its own; dx is
// rounded once per add.
KERNEL double z_at(ddl_dtype dt, const void *x, const int64_t *base, const double *w01, int nk,
                   int64_t i)
{
    double z = 0.0;
    for (int k = 0; k < nk; k++) {
        z += w01[k] * ld(dt, x, base[k] + i);
    }
    return z;
}

// The row through the buffer, with dim 2's taps from the table (n2 taps each).
KERNEL void row_buffered(ddl_dtype dt, bool backward, void *y, const void *x, void *dx,
                         const void *dy, int64_t row, int64_t out2, int64_t in2, const taps *tt,
                         const int64_t *base, const double *w01, int nk, double *restrict buf)
{
    const int64_t *restrict oa = tt->off2[0], *restrict ob = tt->off2[1];
    const double *restrict wa = tt->w2[0], *restrict wb = tt->w2[1];
    if (!backward) {
        if (nk == 4) { // the 3-D linear case: one pass over the four rows
            const int64_t b0 = base[0], b1 = base[1], b2 = base[2], b3 = base[3];
            const double  u0 = w01[0], u1 = w01[1], u2 = w01[2], u3 = w01[3];
            for (int64_t i = 0; i < in2; i++) {
                buf[i] = (((0.0 + u0 * ld(dt, x, b0 + i)) + u1 * ld(dt, x, b1 + i)) +
                          u2 * ld(dt, x, b2 + i)) +
                         u3 * ld(dt, x, b3 + i);
            }
        } else {
            for (int64_t i = 0; i < in2; i++) {
                buf[i] = 0.0;
            }
            for (int k = 0; k < nk; k++) {
                const double  wk = w01[k];
                const int64_t bk = base[k];
                for (int64_t i = 0; i < in2; i++) {
                    buf[i] += wk * ld(dt, x, bk + i);
                }
            }
        }
        if (tt->n2 == 2) {
            for (int64_t o2 = 0; o2 < out2; o2++) {
                st(dt, y, row + o2, (0.0 + wa[o2] * buf[oa[o2]]) + wb[o2] * buf[ob[o2]]);
            }
        } else {
            for (int64_t o2 = 0; o2 < out2; o2++) {
                st(dt, y, row + o2, 0.0 + wa[o2] * buf[oa[o2]]);
            }
        }
        return;
    }
    for (int64_t i = 0; i < in2; i++) {
        buf[i] = 0.0;
    }
    for (int64_t o2 = 0; o2 < out2; o2++) {
        double g = ld(dt, dy, row + o2);
        buf[oa[o2]] += wa[o2] * g;
        if (tt->n2 == 2) {
            buf[ob[o2]] += wb[o2] * g;
        }
    }
    for (int k = 0; k < nk; k++) {
        const double  wk = w01[k];
        const int64_t bk = base[k];
        for (int64_t i = 0; i < in2; i++) {
            acc(dt, dx, bk + i, wk * buf[i]);
        }
    }
}

// The row tap by tap: dim 2's taps computed per element, z per tap.
KERNEL void row_direct(ddl_dtype dt, bool backward, void *y, const void *x, void *dx,
                       const void *dy, int64_t row, const dim_spec *d2, const int64_t *base,
                       const double *w01, int nk)
{
    for (int64_t o2 = 0; o2 < d2->out_n; o2++) {
        const ltap e = local_tap(dt, d2, o2, 1);
        if (backward) {
            double g = ld(dt, dy, row + o2);
            for (int k = 0; k < nk; k++) {
                for (int q = 0; q < e.n; q++) {
                    acc(dt, dx, base[k] + e.off[q], w01[k] * (e.w[q] * g));
                }
            }
        } else {
            double v = 0.0;
            for (int q = 0; q < e.n; q++) {
                v += e.w[q] * z_at(dt, x, base, w01, nk, e.off[q]);
            }
            st(dt, y, row + o2, v);
        }
    }
}

// Forward: y = A x (dx, dy unused). Backward: dx += A^T dy (y, x unused).
// Dims are (D, H, W) after padding.
KERNEL void interp_kernel(ddl_dtype dt, bool backward, void *y, const void *x, void *dx,
                          const void *dy, const dim_spec *d, const taps *tt, int64_t B)
{
    const int64_t s1 = d[2].in_n, s0 = d[1].in_n * s1;
    const int64_t in_vol = d[0].in_n * s0, out_vol = d[0].out_n * d[1].out_n * d[2].out_n;
    double        buf[ROW_MAX];
    const bool    buffered = tt->n2 > 0 && d[2].in_n <= ROW_MAX;
    for (int64_t b = 0; b < B; b++) {
        int64_t xb = b * in_vol, yb = b * out_vol;
        for (int64_t o0 = 0; o0 < d[0].out_n; o0++) {
            const ltap t0 = local_tap(dt, &d[0], o0, s0);
            for (int64_t o1 = 0; o1 < d[1].out_n; o1++) {
                const ltap tc = tt->t1 != NULL ? tt->t1[o1] : local_tap(dt, &d[1], o1, s1);
                int64_t    base[4];
                double     w01[4];
                int        nk = 0;
                for (int a = 0; a < t0.n; a++) {
                    for (int c = 0; c < tc.n; c++, nk++) {
                        base[nk] = xb + t0.off[a] + tc.off[c];
                        w01[nk]  = t0.w[a] * tc.w[c];
                    }
                }
                int64_t row = yb + (o0 * d[1].out_n + o1) * d[2].out_n;
                if (buffered) {
                    row_buffered(dt, backward, y, x, dx, dy, row, d[2].out_n, d[2].in_n, tt, base,
                                 w01, nk, buf);
                } else {
                    row_direct(dt, backward, y, x, dx, dy, row, &d[2], base, w01, nk);
                }
            }
        }
    }
}

// The kernel built at three vector widths, for AVX-512F, AVX2 and the baseline, one picked
// per call by the CPU (as batch norm's, kernels/batchnorm.c): the same operations per
// element at each, so the same bits (test_interpolate's test_widths).
static int interp_width_cap = -1;

static int interp_width(void)
{
    return cpu_width(interp_width_cap);
}

int ddl_interpolate_width(void)
{
    return interp_width();
}

int ddl_interpolate_set_width(int width)
{
    return cpu_width_set_cap(&interp_width_cap, width);
}

#define INTERP_AT(name, attr)                                                                      \
    attr static void name(ddl_dtype dt, bool backward, void *y, const void *x, void *dx,           \
                          const void *dy, const dim_spec *d, const taps *tt, int64_t B)            \
    {                                                                                              \
        if (dt == DDL_F32) {                                                                       \
            if (backward) {                                                                        \
                interp_kernel(DDL_F32, true, NULL, NULL, dx, dy, d, tt, B);                        \
            } else {                                                                               \
                interp_kernel(DDL_F32, false, y, x, NULL, NULL, d, tt, B);                         \
            }                                                                                      \
        } else if (backward) {                                                                     \
            interp_kernel(DDL_F64, true, NULL, NULL, dx, dy, d, tt, B);                            \
        } else {                                                                                   \
            interp_kernel(DDL_F64, false, y, x, NULL, NULL, d, tt, B);                             \
        }                                                                                          \
    }
INTERP_AT(interp_avx512, __attribute__((target("avx512f"))))
INTERP_AT(interp_avx2, __attribute__((target("avx2"))))
INTERP_AT(interp_base, )

// ---- public API -----------------------------------------------------------------------

int64_t ddl_interpolate_out_size(int64_t in, double scale_factor)
{
    return (int64_t)floor((double)in * scale_factor);
}

ddl_status ddl_interpolate_need(ddl_dtype dt, const ddl_interpolate_params *p, int dim,
                                int64_t out_start, int64_t out_n, int64_t *need_start,
                                int64_t *need_stop)
{
    DDL_CHECK(check_params("interpolate_need", dt, p));
    DDL_REQUIRE(dim >= 0 && dim < p->ndim, DDL_EINVAL,
                "interpolate_need: spatial dim %d outside [0, %d)", dim, p->ndim);
    DDL_REQUIRE(need_start && need_stop, DDL_EINVAL, "interpolate_need: NULL output");
    DDL_REQUIRE(out_start >= 0 && out_n >= 0 && out_start + out_n <= p->out_global[dim],
                DDL_EINVAL, "interpolate_need: output range [%lld, %lld) outside [0, %lld)",
                (long long)out_start, (long long)(out_start + out_n),
                (long long)p->out_global[dim]);
    if (out_n == 0) {
        *need_start = *need_stop = 0;
        return DDL_OK;
    }
    dim_spec d = {.in     = p->in_global[dim],
                  .out    = p->out_global[dim],
                  .sf     = p->scale_factor[dim],
                  .linear = p->mode == DDL_INTERPOLATE_LINEAR,
                  .align  = p->align_corners};
    dim_need(dt, &d, out_start, out_n, need_start, need_stop);
    return DDL_OK;
}

// Validates, then runs the kernel specialised for (dtype, direction).
static ddl_status interp_run(const char *who, ddl_dtype dt, bool backward, void *y,
                             const void *x, void *dx, const void *dy,
                             const ddl_interpolate_params *p, const ddl_interpolate_window *w,
                             int64_t B)
{
    dim_spec d[MAXD];
    DDL_CHECK(make_dims(who, dt, p, w, d));
    DDL_REQUIRE(B >= 0, DDL_EINVAL, "%s: batch*channel count %lld < 0", who, (long long)B);
    int64_t out_vol = B * d[0].out_n * d[1].out_n * d[2].out_n;
    if (out_vol == 0 || (backward && dx == NULL)) {
        return DDL_OK;
    }
    DDL_REQUIRE(backward ? dy != NULL : (x && y), DDL_EINVAL, "%s: NULL buffer", who);
    ltap t1[TAPS_MAX]; // on the stack: a step allocates nothing
    taps tt = {.t1 = NULL, .n2 = 0};
    if (d[1].out_n <= TAPS_MAX) {
        for (int64_t o = 0; o < d[1].out_n; o++) {
            t1[o] = local_tap(dt, &d[1], o, d[2].in_n);
        }
        tt.t1 = t1;
    }
    if (d[2].out_n <= TAPS_MAX) {
        for (int64_t o = 0; o < d[2].out_n; o++) {
            ltap e = local_tap(dt, &d[2], o, 1);
            tt.n2  = e.n;
            for (int q = 0; q < 2; q++) {
                tt.off2[q][o] = e.off[q];
                tt.w2[q][o]   = e.w[q];
            }
        }
    }
    switch (interp_width()) {
    case 2:
        interp_avx512(dt, backward, y, x, dx, dy, d, &tt, B);
        break;
    case 1:
        interp_avx2(dt, backward, y, x, dx, dy, d, &tt, B);
        break;
    default:
        interp_base(dt, backward, y, x, dx, dy, d, &tt, B);
        break;
    }
    return DDL_OK;
}

ddl_status ddl_interpolate_forward(ddl_dtype dt, void *y, const void *x,
                                   const ddl_interpolate_params *p,
                                   const ddl_interpolate_window *w, int64_t B)
{
    return interp_run("interpolate_forward", dt, false, y, x, NULL, NULL, p, w, B);
}

ddl_status ddl_interpolate_backward(ddl_dtype dt, void *dx, const void *dy,
                                    const ddl_interpolate_params *p,
                                    const ddl_interpolate_window *w, int64_t B)
{
    return interp_run("interpolate_backward", dt, true, NULL, NULL, dx, dy, p, w, B);
}
