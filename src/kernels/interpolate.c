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
// computes them once per call into these tables when the local output extent fits
// (TAPS_MAX; a larger one computes them per element as before). The same taps, so the
// same bits; the per-element coordinate arithmetic (a float division, floorf) was most
// of the kernel's time.
#define TAPS_MAX 256

typedef struct tap_tables {
    const tap *t1, *t2; // [d[1].out_n], [d[2].out_n], or NULL
} tap_tables;

KERNEL tap tap_of(ddl_dtype dt, const dim_spec *d, const tap *table, int64_t o)
{
    return table != NULL ? table[o] : dim_tap(dt, d, d->out_start + o);
}

// Forward: y = A x (dx, dy unused). Backward: dx += A^T dy (y, x unused).
// Dims are (D, H, W) after padding; taps are made local by subtracting in_start.
KERNEL void interp_kernel(ddl_dtype dt, bool backward, void *y, const void *x, void *dx,
                          const void *dy, const dim_spec *d, const tap_tables *tt, int64_t B)
{
    int64_t in_vol  = d[0].in_n * d[1].in_n * d[2].in_n;
    int64_t out_vol = d[0].out_n * d[1].out_n * d[2].out_n;
    for (int64_t b = 0; b < B; b++) {
        int64_t xb = b * in_vol, yb = b * out_vol;
        for (int64_t o0 = 0; o0 < d[0].out_n; o0++) {
            tap t0 = dim_tap(dt, &d[0], d[0].out_start + o0);
            for (int64_t o1 = 0; o1 < d[1].out_n; o1++) {
                tap     t1  = tap_of(dt, &d[1], tt->t1, o1);
                int64_t row = yb + (o0 * d[1].out_n + o1) * d[2].out_n;
                for (int64_t o2 = 0; o2 < d[2].out_n; o2++) {
                    tap    t2 = tap_of(dt, &d[2], tt->t2, o2);
                    double g  = backward ? ld(dt, dy, row + o2) : 0.0;
                    double v  = 0.0;
                    for (int a = 0; a < t0.n; a++) {
                        int64_t i0 = t0.i[a] - d[0].in_start;
                        for (int c = 0; c < t1.n; c++) {
                            int64_t i01 = xb + (i0 * d[1].in_n + t1.i[c] - d[1].in_start) *
                                                   d[2].in_n;
                            double  w01 = t0.w[a] * t1.w[c];
                            for (int e = 0; e < t2.n; e++) {
                                int64_t i = i01 + t2.i[e] - d[2].in_start;
                                double  w = w01 * t2.w[e];
                                if (backward) {
                                    acc(dt, dx, i, w * g);
                                } else {
                                    v += w * ld(dt, x, i);
                                }
                            }
                        }
                    }
                    if (!backward) {
                        st(dt, y, row + o2, v);
                    }
                }
            }
        }
    }
}

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
    tap        t1[TAPS_MAX], t2[TAPS_MAX]; // on the stack: a step allocates nothing
    tap_tables tt = {NULL, NULL};
    if (d[1].out_n <= TAPS_MAX) {
        for (int64_t o = 0; o < d[1].out_n; o++) {
            t1[o] = dim_tap(dt, &d[1], d[1].out_start + o);
        }
        tt.t1 = t1;
    }
    if (d[2].out_n <= TAPS_MAX) {
        for (int64_t o = 0; o < d[2].out_n; o++) {
            t2[o] = dim_tap(dt, &d[2], d[2].out_start + o);
        }
        tt.t2 = t2;
    }
    if (dt == DDL_F32) {
        if (backward) {
            interp_kernel(DDL_F32, true, NULL, NULL, dx, dy, d, &tt, B);
        } else {
            interp_kernel(DDL_F32, false, y, x, NULL, NULL, d, &tt, B);
        }
    } else {
        if (backward) {
            interp_kernel(DDL_F64, true, NULL, NULL, dx, dy, d, &tt, B);
        } else {
            interp_kernel(DDL_F64, false, y, x, NULL, NULL, d, &tt, B);
        }
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
