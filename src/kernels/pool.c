// kernels/pool.c: 1-D, 2-D and 3-D max and average pooling (PyTorch MaxPool/AvgPool{1,2,3}d,
// floor mode), forward and backward.
//
//   max: y[n, c, o] = max_{kk} x[n, c, o*s - p + kk*d]      (padding taps are -inf)
//        argmax[n, c, o] = flat index in x of the first maximum (NaN wins, as in PyTorch)
//   avg: y[n, c, o] = (1 / prod(k)) sum_{kk} x[n, c, o*s - p + kk]   (padding taps are 0;
//        count_include_pad = True, PyTorch's default)
//   x [N, C, in...], y [N, C, out...], argmax [N, C, out...] int64 in the workspace.
// The backward is the adjoint of the forward for fixed argmax: max sends dy[o] to
// x[argmax[o]], avg spreads dy[o] / prod(k) over the window's input taps; both add into dx.
//
// For each window, the valid kernel offsets along each dimension form one interval
// [klo, khi) (taps inside the input), so the inner loops carry no bounds tests.
// Not collective; allocates nothing.
#include <limits.h>
#include <math.h>
#include <string.h>

#include "base/check.h"
#include "ddl/kernels.h"
#include "kernels/window.h"
#include "kernels/dtype.h"

// ---- geometry ----------------------------------------------------------------

// The spatial geometry as three dimensions, the leading ones padded with extent 1.
ddl_status ddl_pool_geom_init(ddl_pool_geom *g, ddl_pool_mode mode, int nsp, int64_t N,
                              int64_t C, const int64_t *in, const int64_t *k,
                              const int64_t *stride, const int64_t *pad,
                              const int64_t *dilation)
{
    DDL_REQUIRE(g != NULL, DDL_EINVAL, "pool: geometry pointer is NULL");
    DDL_REQUIRE(mode == DDL_POOL_MAX || mode == DDL_POOL_AVG, DDL_EINVAL,
                "pool: unknown mode %d", (int)mode);
    const char *name = mode == DDL_POOL_MAX ? "max_pool" : "avg_pool";
    DDL_REQUIRE(nsp >= 1 && nsp <= 3, DDL_EINVAL, "%s: %d spatial dimensions, expected 1..3",
                name, nsp);
    DDL_REQUIRE(in != NULL && k != NULL, DDL_EINVAL, "%s: input or kernel extents are NULL",
                name);
    DDL_REQUIRE(N >= 0 && C >= 0, DDL_EINVAL, "%s: negative size N=%lld C=%lld", name,
                (long long)N, (long long)C);
    ddl_pool_geom t = {.mode = mode, .nsp = nsp, .N = N, .C = C};
    int64_t       iv = 1, ov = 1;
    for (int i = 0; i < 3; i++) {
        t.in[i] = t.k[i] = t.s[i] = t.d[i] = t.out[i] = 1;
        t.p[i] = 0;
    }
    for (int i = 0; i < nsp; i++) {
        t.in[i] = in[i];
        t.k[i]  = k[i];
        t.s[i]  = (stride != NULL && stride[i] != 0) ? stride[i] : k[i]; // PyTorch default
        t.p[i]  = pad ? pad[i] : 0;
        t.d[i]  = dilation ? dilation[i] : 1;
        DDL_REQUIRE(t.in[i] >= 1 && t.in[i] <= INT_MAX, DDL_EINVAL,
                    "%s: input extent in[%d] = %lld, expected 1..INT_MAX", name, i,
                    (long long)t.in[i]);
        DDL_REQUIRE(t.k[i] >= 1 && t.k[i] <= INT_MAX, DDL_EINVAL,
                    "%s: kernel extent k[%d] = %lld, expected >= 1", name, i,
                    (long long)t.k[i]);
        DDL_REQUIRE(t.s[i] >= 1 && t.s[i] <= INT_MAX, DDL_EINVAL,
                    "%s: stride s[%d] = %lld, expected >= 1 (or 0 for the kernel size)", name,
                    i, (long long)t.s[i]);
        DDL_REQUIRE(t.d[i] >= 1 && t.d[i] <= INT_MAX, DDL_EINVAL,
                    "%s: dilation d[%d] = %lld, expected >= 1", name, i, (long long)t.d[i]);
        DDL_REQUIRE(mode == DDL_POOL_MAX || t.d[i] == 1, DDL_EINVAL,
                    "avg_pool: dilation d[%d] = %lld, average pooling has no dilation "
                    "(PyTorch AvgPool), expected 1",
                    i, (long long)t.d[i]);
        DDL_REQUIRE(t.p[i] >= 0, DDL_EINVAL, "%s: padding p[%d] = %lld, expected >= 0", name,
                    i, (long long)t.p[i]);
        DDL_REQUIRE(t.p[i] <= t.k[i] / 2, DDL_EINVAL,
                    "%s: padding p[%d] = %lld exceeds half the kernel size k/2 = %lld "
                    "(PyTorch's rule)",
                    name, i, (long long)t.p[i], (long long)(t.k[i] / 2));
        int64_t extent = t.d[i] * (t.k[i] - 1) + 1;
        int64_t padded = t.in[i] + 2 * t.p[i];
        DDL_REQUIRE(extent <= padded, DDL_EINVAL,
                    "%s: dim %d: dilated window %lld (k=%lld, d=%lld) exceeds the padded "
                    "input %lld (in=%lld + 2*pad=%lld): output would be empty",
                    name, i, (long long)extent, (long long)t.k[i], (long long)t.d[i],
                    (long long)padded, (long long)t.in[i], (long long)t.p[i]);
        t.out[i] = (padded - extent) / t.s[i] + 1;
        DDL_REQUIRE(mul_ok(iv, t.in[i], &iv) && mul_ok(ov, t.out[i], &ov), DDL_EINVAL,
                    "%s: spatial volume overflows", name);
    }
    int64_t tmp;
    DDL_REQUIRE(mul_ok(N, C, &tmp) && mul_ok(tmp, iv, &tmp) && mul_ok(N * C, ov, &tmp) &&
                    mul_ok(tmp, 8, &tmp),
                DDL_EINVAL, "%s: tensor sizes overflow int64", name);
    *g = t;
    return DDL_OK;
}

static sp3 sp3_from(const ddl_pool_geom *g)
{
    return sp3_make(g->nsp, g->in, g->k, g->s, g->p, g->d, g->out);
}

// Re-validates g (a public struct the caller may have edited) and its workspace.
static ddl_status pool_args(const char *who, ddl_dtype dt, const ddl_pool_geom *g,
                            const void *ws, size_t ws_bytes, sp3 *sp)
{
    DDL_REQUIRE(dt == DDL_F32 || dt == DDL_F64, DDL_EINVAL, "%s: unknown dtype %d", who,
                (int)dt);
    DDL_REQUIRE(g != NULL, DDL_EINVAL, "%s: geometry is NULL", who);
    ddl_pool_geom chk;
    DDL_CHECK(ddl_pool_geom_init(&chk, g->mode, g->nsp, g->N, g->C, g->in, g->k, g->s, g->p,
                                 g->d));
    for (int i = 0; i < 3; i++) {
        DDL_REQUIRE(chk.out[i] == g->out[i], DDL_EINVAL,
                    "%s: geometry out[%d] = %lld but in/k/s/p/d give %lld (use "
                    "ddl_pool_geom_init)",
                    who, i, (long long)g->out[i], (long long)chk.out[i]);
    }
    size_t need = ddl_pool_workspace_bytes(g);
    DDL_REQUIRE(ws_bytes >= need && (need == 0 || ws != NULL), DDL_EINVAL,
                "%s: workspace of %zu bytes%s, need %zu (ddl_pool_workspace_bytes)", who,
                ws_bytes, ws == NULL ? " (NULL)" : "", need);
    DDL_REQUIRE(need == 0 || (uintptr_t)ws % sizeof(int64_t) == 0, DDL_EINVAL,
                "%s: workspace %p is not 8-byte aligned (argmax is int64)", who, ws);
    *sp = sp3_from(g);
    return DDL_OK;
}

size_t ddl_pool_workspace_bytes(const ddl_pool_geom *g)
{
    if (g == NULL || g->mode != DDL_POOL_MAX) {
        return 0;
    }
    int64_t ov = 1;
    for (int i = 0; i < g->nsp && i < 3; i++) {
        ov *= g->out[i];
    }
    return (size_t)(g->N * g->C * ov) * sizeof(int64_t);
}

// ---- window walking --------------------------------------------------------------

static inline int64_t floor_div(int64_t a, int64_t b) // b > 0
{
    int64_t q = a / b;
    return (a % b != 0 && a < 0) ? q - 1 : q;
}

// The window of output position o: along dimension i its taps are start[i] + kk*d[i] for
// kk in [klo[i], khi[i]) (those inside the input; the interval may be empty).
typedef struct window {
    int64_t start[3], klo[3], khi[3];
} window;

static inline void window_at(const sp3 *sp, const int64_t o[3], window *w)
{
    for (int i = 0; i < 3; i++) {
        int64_t st  = o[i] * sp->s[i] - sp->p[i];
        int64_t lo  = st < 0 ? -floor_div(st, sp->d[i]) : 0; // ceil(-st / d)
        int64_t hi  = floor_div(sp->in[i] - 1 - st, sp->d[i]) + 1;
        w->start[i] = st;
        w->klo[i]   = lo;
        w->khi[i]   = hi < sp->k[i] ? hi : sp->k[i];
        if (w->khi[i] < w->klo[i]) {
            w->khi[i] = w->klo[i];
        }
    }
}

static inline double ld_at(ddl_dtype dt, const void *p, int64_t i)
{
    return dt == DDL_F32 ? (double)((const float *)p)[i] : ((const double *)p)[i];
}

static inline void st_at(ddl_dtype dt, void *p, int64_t i, double v)
{
    if (dt == DDL_F32) {
        ((float *)p)[i] = (float)v;
    } else {
        ((double *)p)[i] = v;
    }
}

static inline void add_at(ddl_dtype dt, void *p, int64_t i, double v)
{
    if (dt == DDL_F32) {
        ((float *)p)[i] += (float)v;
    } else {
        ((double *)p)[i] += v;
    }
}

// ---- unpadded fast paths ------------------------------------------------------------
// With no padding and dilation 1 (MaxPool2d(2), AvgPool2d(k): the common case) every
// window lies inside the input (floor mode), so the loops need no window bounds, and
// the 2x2 stride-2 max window is unrolled. Written once over a constant dt (KERNEL) and
// instantiated per dtype. They compute exactly what the general loops compute: the same
// taps in the same order, the same comparisons (a float compares as its double does)
// and the same double sums.

static bool unpadded(const sp3 *sp)
{
    for (int i = 0; i < 3; i++) {
        if (sp->p[i] != 0 || sp->d[i] != 1) {
            return false;
        }
    }
    return true;
}

// Window element v at flat index i replaces the running maximum m (index b) when it is
// larger or NaN (PyTorch's rule: the first maximum, a NaN wins).
#define MAX_STEP(v, i)                                                                     \
    do {                                                                                   \
        double v_ = (v);                                                                   \
        if (v_ > m || isnan(v_)) {                                                         \
            m = v_;                                                                        \
            b = (i);                                                                       \
        }                                                                                  \
    } while (0)

// 2x2 (NTAPS 4) or 2x2x2 (NTAPS 8) max windows of stride 2 in the last dim, four outputs
// of a row at a time: lane l holds window o2 + l, its taps taken in the rule's order
// (k0, k1, k2) and combined with MAX_STEP's rule as branch-free selects (the windows'
// maxima are data dependent, so branches mispredict). Rows k1 = 1 sit I2 further and the
// plane k0 = 1 PL = in[1] * in[2] further; code is the tap index of the maximum. The lanes
// are filled with scalar loads: portable, and cheap next to the mispredictions.
#define DEFINE_MAXWIN(name, T, VT, VI, NTAPS)                                                      \
    static int64_t name(const T *restrict r0, int64_t I2, int64_t PL, int64_t row, int64_t n,      \
                        T *restrict y, int64_t *restrict arg)                                      \
    {                                                                                              \
        int64_t o = 0;                                                                             \
        for (; o + 4 <= n; o += 4) {                                                               \
            const T *pl   = NTAPS > 4 ? r0 + PL : r0; /* no plane k0 = 1 for 2x2 */                \
            const T *p[4] = {r0 + 2 * o, r0 + I2 + 2 * o, pl + 2 * o, pl + I2 + 2 * o};            \
            VT       m    = {p[0][0], p[0][2], p[0][4], p[0][6]};                                  \
            VI       code = {0, 0, 0, 0}, t;                                                       \
            for (int k = 1; k < NTAPS; k++) {                                                      \
                const T *q = p[k >> 1] + (k & 1);                                                  \
                VT       v = {q[0], q[2], q[4], q[6]};                                             \
                t          = (v > m) | (v != v);                                                   \
                m          = (VT)((t & (VI)v) | (~t & (VI)m));                                     \
                code       = (t & k) | (~t & code);                                                \
            }                                                                                      \
            memcpy(y + o, &m, sizeof m);                                                           \
            for (int l = 0; l < 4; l++) {                                                          \
                arg[o + l] = row + 2 * (o + l) + (code[l] & 1) + ((code[l] >> 1) & 1) * I2 +       \
                             (code[l] >> 2) * PL;                                                  \
            }                                                                                      \
        }                                                                                          \
        return o;                                                                                  \
    }

typedef float   ddl_v4f __attribute__((vector_size(16)));
typedef int32_t ddl_v4i __attribute__((vector_size(16)));
typedef double  ddl_v4d __attribute__((vector_size(32)));
typedef int64_t ddl_v4l __attribute__((vector_size(32)));
DEFINE_MAXWIN(max22_f32, float, ddl_v4f, ddl_v4i, 4)
DEFINE_MAXWIN(max22_f64, double, ddl_v4d, ddl_v4l, 4)
DEFINE_MAXWIN(max222_f32, float, ddl_v4f, ddl_v4i, 8)
DEFINE_MAXWIN(max222_f64, double, ddl_v4d, ddl_v4l, 8)
#undef DEFINE_MAXWIN

// The f32 windows again at AVX2's width, for whole tensors: each row of taps is two
// contiguous loads split into its even and odd columns (the taps k2 = 0 and 1), instead of
// scalar loads into lanes, and the argmax offsets are formed in 64-bit lanes with masks
// (no 64-bit multiply in AVX2). A row of O2 >= 8 windows runs 8 at a time and one of
// 4 <= O2 < 8 runs 4 at a time, the last vector moved back to end at the row's end
// (windows computed twice get the same value and index twice), and one of O2 < 4 is one
// vector of which only O2 lanes are stored, so no scalar tail is left for short rows
// (LeNet's 14, 5; VGG's 14, 7, 3) but at the very end of x. The same taps in the same order with
// the same selects as DEFINE_MAXWIN and the rule: the same values and indices.
typedef float   ddl_v8f __attribute__((vector_size(32)));
typedef int32_t ddl_v8i __attribute__((vector_size(32)));

#define MAX2X_VEC(VF, VI, W, NST, SPLIT_EV, SPLIT_OD)                                              \
    do {                                                                                           \
        const float *p_[4] = {r0 + 2 * o, r0 + I2 + 2 * o, pl + 2 * o, pl + I2 + 2 * o};           \
        VF           m_    = {0}, v_;                                                              \
        VI           code_ = {0}, t_;                                                              \
        for (int r_ = 0; r_ < NTAPS / 2; r_++) {                                                   \
            VF lo_, hi_;                                                                           \
            memcpy(&lo_, p_[r_], sizeof lo_);                                                      \
            memcpy(&hi_, p_[r_] + W, sizeof hi_);                                                  \
            const VF ev_ = SPLIT_EV, od_ = SPLIT_OD;                                               \
            if (r_ == 0) {                                                                         \
                m_ = ev_;                                                                          \
            } else {                                                                               \
                v_    = ev_;                                                                       \
                t_    = (v_ > m_) | (v_ != v_);                                                    \
                m_    = (VF)((t_ & (VI)v_) | (~t_ & (VI)m_));                                      \
                code_ = (t_ & (2 * r_)) | (~t_ & code_);                                           \
            }                                                                                      \
            v_    = od_;                                                                           \
            t_    = (v_ > m_) | (v_ != v_);                                                        \
            m_    = (VF)((t_ & (VI)v_) | (~t_ & (VI)m_));                                          \
            code_ = (t_ & (2 * r_ + 1)) | (~t_ & code_);                                           \
        }                                                                                          \
        memcpy(yr + o, &m_, (size_t)(NST) * sizeof(float));                                        \
        for (int h_ = 0; 4 * h_ < (NST); h_++) {                                                   \
            int32_t c4_[4];                                                                        \
            memcpy(c4_, (const int32_t *)&code_ + 4 * h_, sizeof c4_);                             \
            const ddl_v4l c_ = {c4_[0], c4_[1], c4_[2], c4_[3]};                                   \
            const ddl_v4l a_ = (row + 2 * (o + 4 * h_)) + l4 + (c_ & one) +                        \
                               (-((c_ >> 1) & one) & I2) + (-(c_ >> 2) & PL);                      \
            const int64_t n_ = (NST)-4 * h_ < 4 ? (NST)-4 * h_ : 4;                                \
            memcpy(ar + o + 4 * h_, &a_, (size_t)n_ * sizeof(int64_t));                            \
        }                                                                                          \
    } while (0)

__attribute__((target("avx2"))) static inline __attribute__((always_inline)) void
max2x_f32_avx2_t(const sp3 *sp, int64_t planes, const float *restrict x, float *restrict y,
                 int64_t *restrict arg, const int NTAPS)
{
    const int64_t I1 = sp->in[1], I2 = sp->in[2], PL = I1 * I2;
    const int64_t S0 = sp->s[0], S1 = sp->s[1];
    const int64_t O0 = sp->out[0], O1 = sp->out[1], O2 = sp->out[2];
    const ddl_v4l l4 = {0, 2, 4, 6}, one = {1, 1, 1, 1};
    const int64_t total = planes * sp->iv; // x's elements
    int64_t       oi    = 0;
    for (int64_t q = 0; q < planes; q++) {
        for (int64_t o0 = 0; o0 < O0; o0++) {
            for (int64_t o1 = 0; o1 < O1; o1++, oi += O2) {
                const int64_t row = q * sp->iv + (o0 * S0 * I1 + o1 * S1) * I2;
                const float  *r0  = x + row;
                const float  *pl  = NTAPS > 4 ? r0 + PL : r0;
                float        *yr  = y + oi;
                int64_t      *ar  = arg + oi;
                if (O2 >= 8) {
                    for (int64_t o = 0;; o += 8) {
                        o = o + 8 > O2 ? O2 - 8 : o;
                        MAX2X_VEC(ddl_v8f, ddl_v8i, 8, 8,
                                  __builtin_shufflevector(lo_, hi_, 0, 2, 4, 6, 8, 10, 12, 14),
                                  __builtin_shufflevector(lo_, hi_, 1, 3, 5, 7, 9, 11, 13, 15));
                        if (o + 8 == O2) {
                            break;
                        }
                    }
                } else if (O2 >= 4) {
                    for (int64_t o = 0;; o += 4) {
                        o = o + 4 > O2 ? O2 - 4 : o;
                        MAX2X_VEC(ddl_v4f, ddl_v4i, 4, 4,
                                  __builtin_shufflevector(lo_, hi_, 0, 2, 4, 6),
                                  __builtin_shufflevector(lo_, hi_, 1, 3, 5, 7));
                        if (o + 4 == O2) {
                            break;
                        }
                    }
                } else if (pl - x + I2 + 8 <= total) {
                    // Fewer than 4 windows (VGG's 7 -> 3): one vector of 4 whose last
                    // taps read past the row into the next one (inside x: checked), only
                    // the O2 real windows stored.
                    const int64_t o = 0;
                    MAX2X_VEC(ddl_v4f, ddl_v4i, 4, O2,
                              __builtin_shufflevector(lo_, hi_, 0, 2, 4, 6),
                              __builtin_shufflevector(lo_, hi_, 1, 3, 5, 7));
                } else {
                    for (int64_t o = 0; o < O2; o++) { // the rule, tap by tap
                        double  m = r0[2 * o];
                        int64_t b = row + 2 * o;
                        for (int k = 1; k < NTAPS; k++) {
                            const int64_t off = (k & 1) + ((k >> 1) & 1) * I2 + (k >> 2) * PL;
                            MAX_STEP(r0[2 * o + off], row + 2 * o + off);
                        }
                        yr[o] = (float)m;
                        ar[o] = b;
                    }
                }
            }
        }
    }
}
#undef MAX2X_VEC

__attribute__((target("avx2"))) static void
max2x_f32_avx2(const sp3 *sp, int64_t planes, const float *x, float *y, int64_t *arg, bool three)
{
    if (three) {
        max2x_f32_avx2_t(sp, planes, x, y, arg, 8);
    } else {
        max2x_f32_avx2_t(sp, planes, x, y, arg, 4);
    }
}

KERNEL void pool_fwd_unpadded_t(ddl_dtype dt, bool is_max, const sp3 *sp, int64_t planes,
                                void *y, const void *x, int64_t *restrict arg)
{
    const int64_t I1 = sp->in[1], I2 = sp->in[2];
    const int64_t K0 = sp->k[0], K1 = sp->k[1], K2 = sp->k[2];
    const int64_t S0 = sp->s[0], S1 = sp->s[1], S2 = sp->s[2];
    const int64_t O0 = sp->out[0], O1 = sp->out[1], O2 = sp->out[2];
    const bool    k22  = is_max && K0 == 1 && K1 == 2 && K2 == 2 && S2 == 2;
    const bool    k222 = is_max && K0 == 2 && K1 == 2 && K2 == 2 && S2 == 2;
    const double  kv  = (double)sp->kv;
    if ((k22 || k222) && dt == DDL_F32 && __builtin_cpu_supports("avx2")) {
        max2x_f32_avx2(sp, planes, x, y, arg, k222);
        return;
    }
    int64_t oi = 0;
    for (int64_t pl = 0; pl < planes; pl++) {
        const int64_t xoff = pl * sp->iv;
        for (int64_t o0 = 0; o0 < O0; o0++) {
            for (int64_t o1 = 0; o1 < O1; o1++) {
                const int64_t row = xoff + (o0 * S0 * I1 + o1 * S1) * I2;
                // Four windows at a time on the fast paths; the rest below, by the rule itself.
                int64_t o2 = 0;
                if (k22 || k222) {
                    const int64_t PL = I1 * I2;
                    if (dt == DDL_F32) {
                        float       *yf = (float *)y + oi;
                        const float *xf = (const float *)x + row;
                        o2              = k22 ? max22_f32(xf, I2, PL, row, O2, yf, arg + oi)
                                              : max222_f32(xf, I2, PL, row, O2, yf, arg + oi);
                    } else {
                        double       *yd = (double *)y + oi;
                        const double *xd = (const double *)x + row;
                        o2               = k22 ? max22_f64(xd, I2, PL, row, O2, yd, arg + oi)
                                               : max222_f64(xd, I2, PL, row, O2, yd, arg + oi);
                    }
                    oi += o2;
                }
                for (; o2 < O2; o2++, oi++) {
                    const int64_t start = row + o2 * S2;
                    double        m = is_max ? ld(dt, x, start) : 0.0;
                    int64_t       b = start;
                    for (int64_t k0 = 0; k0 < K0; k0++) {
                        for (int64_t k1 = 0; k1 < K1; k1++) {
                            const int64_t r = start + (k0 * I1 + k1) * I2;
                            for (int64_t k2 = 0; k2 < K2; k2++) {
                                if (is_max) {
                                    MAX_STEP(ld(dt, x, r + k2), r + k2);
                                } else {
                                    m += ld(dt, x, r + k2);
                                }
                            }
                        }
                    }
                    if (is_max) {
                        st(dt, y, oi, m);
                        arg[oi] = b;
                    } else {
                        st(dt, y, oi, m / kv);
                    }
                }
            }
        }
    }
}

#undef MAX_STEP

static void pool_fwd_unpadded(ddl_dtype dt, bool is_max, const sp3 *sp, int64_t planes,
                              void *y, const void *x, int64_t *arg)
{
    if (dt == DDL_F32) {
        if (is_max) {
            pool_fwd_unpadded_t(DDL_F32, true, sp, planes, y, x, arg);
        } else {
            pool_fwd_unpadded_t(DDL_F32, false, sp, planes, y, x, arg);
        }
    } else {
        if (is_max) {
            pool_fwd_unpadded_t(DDL_F64, true, sp, planes, y, x, arg);
        } else {
            pool_fwd_unpadded_t(DDL_F64, false, sp, planes, y, x, arg);
        }
    }
}

// dx[arg[oi]] += dy[oi] for every recorded argmax (arg already validated).
KERNEL void max_bwd_t(ddl_dtype dt, int64_t n_out, void *dx, const void *dy,
                      const int64_t *restrict arg)
{
    for (int64_t oi = 0; oi < n_out; oi++) {
        if (arg[oi] >= 0) {
            if (dt == DDL_F32) {
                ((float *)dx)[arg[oi]] += ((const float *)dy)[oi];
            } else {
                ((double *)dx)[arg[oi]] += ((const double *)dy)[oi];
            }
        }
    }
}

// ---- forward ----------------------------------------------------------------------

ddl_status ddl_pool_forward(ddl_dtype dt, const ddl_pool_geom *g, void *y, const void *x,
                            void *ws, size_t ws_bytes)
{
    sp3 sp;
    DDL_CHECK(pool_args("pool_forward", dt, g, ws, ws_bytes, &sp));
    const int64_t planes = g->N * g->C;
    if (planes == 0) {
        return DDL_OK;
    }
    DDL_REQUIRE(y != NULL && x != NULL, DDL_EINVAL, "pool_forward: x or y is NULL");
    const bool is_max = g->mode == DDL_POOL_MAX;
    int64_t   *arg    = ws;
    if (unpadded(&sp)) {
        pool_fwd_unpadded(dt, is_max, &sp, planes, y, x, arg);
        return DDL_OK;
    }
    int64_t o[3];
    window     w;
    for (int64_t pl = 0; pl < planes; pl++) {
        const int64_t xoff = pl * sp.iv;
        int64_t       oi   = pl * sp.ov;
        for (o[0] = 0; o[0] < sp.out[0]; o[0]++) {
            for (o[1] = 0; o[1] < sp.out[1]; o[1]++) {
                for (o[2] = 0; o[2] < sp.out[2]; o[2]++, oi++) {
                    window_at(&sp, o, &w);
                    double  acc  = is_max ? -INFINITY : 0.0;
                    int64_t best = -1;
                    for (int64_t k0 = w.klo[0]; k0 < w.khi[0]; k0++) {
                        int64_t i0 = w.start[0] + k0 * sp.d[0];
                        for (int64_t k1 = w.klo[1]; k1 < w.khi[1]; k1++) {
                            int64_t i1  = w.start[1] + k1 * sp.d[1];
                            int64_t row = xoff + (i0 * sp.in[1] + i1) * sp.in[2] + w.start[2];
                            for (int64_t k2 = w.klo[2]; k2 < w.khi[2]; k2++) {
                                int64_t xi = row + k2 * sp.d[2];
                                double  v  = ld_at(dt, x, xi);
                                if (!is_max) {
                                    acc += v;
                                } else if (best < 0 || v > acc || isnan(v)) {
                                    acc  = v;
                                    best = xi;
                                }
                            }
                        }
                    }
                    if (is_max) {
                        arg[oi] = best;
                        st_at(dt, y, oi, acc);
                    } else {
                        st_at(dt, y, oi, acc / (double)sp.kv);
                    }
                }
            }
        }
    }
    return DDL_OK;
}

// ---- backward ---------------------------------------------------------------------

ddl_status ddl_pool_backward(ddl_dtype dt, const ddl_pool_geom *g, void *dx, const void *dy,
                             const void *ws, size_t ws_bytes)
{
    sp3 sp;
    DDL_CHECK(pool_args("pool_backward", dt, g, ws, ws_bytes, &sp));
    const int64_t planes = g->N * g->C;
    if (planes == 0 || dx == NULL) {
        return DDL_OK;
    }
    DDL_REQUIRE(dy != NULL, DDL_EINVAL, "pool_backward: dy is NULL");
    if (g->mode == DDL_POOL_MAX) {
        const int64_t *arg   = ws;
        const int64_t  n_out = planes * sp.ov;
        // Validate every index before touching dx (a workspace not filled by
        // ddl_pool_forward with this geometry must not cause stray writes): an argmax
        // lies in its output's own plane, or is -1 for a window entirely in the padding.
        // Plane by plane, so the test is two compares per element (no division).
        for (int64_t pl = 0, oi = 0; pl < planes; pl++) {
            const int64_t lo = pl * sp.iv, hi = lo + sp.iv;
            bool          ok = true;
            for (int64_t e = oi + sp.ov; oi < e; oi++) {
                ok &= arg[oi] == -1 || (arg[oi] >= lo && arg[oi] < hi);
            }
            if (!ok) {
                for (oi -= sp.ov; arg[oi] == -1 || (arg[oi] >= lo && arg[oi] < hi); oi++) {
                }
                return ddl_set_error(DDL_EINVAL,
                                     "pool_backward: argmax %lld of output %lld is outside "
                                     "its plane (workspace not from ddl_pool_forward?)",
                                     (long long)arg[oi], (long long)oi);
            }
        }
        if (dt == DDL_F32) {
            max_bwd_t(DDL_F32, n_out, dx, dy, arg);
        } else {
            max_bwd_t(DDL_F64, n_out, dx, dy, arg);
        }
        return DDL_OK;
    }
    const double scale = 1.0 / (double)sp.kv;
    int64_t      o[3];
    window       w;
    for (int64_t pl = 0; pl < planes; pl++) {
        const int64_t xoff = pl * sp.iv;
        int64_t       oi   = pl * sp.ov;
        for (o[0] = 0; o[0] < sp.out[0]; o[0]++) {
            for (o[1] = 0; o[1] < sp.out[1]; o[1]++) {
                for (o[2] = 0; o[2] < sp.out[2]; o[2]++, oi++) {
                    window_at(&sp, o, &w);
                    double gy = ld_at(dt, dy, oi) * scale;
                    for (int64_t k0 = w.klo[0]; k0 < w.khi[0]; k0++) {
                        int64_t i0 = w.start[0] + k0 * sp.d[0];
                        for (int64_t k1 = w.klo[1]; k1 < w.khi[1]; k1++) {
                            int64_t i1  = w.start[1] + k1 * sp.d[1];
                            int64_t row = xoff + (i0 * sp.in[1] + i1) * sp.in[2] + w.start[2];
                            for (int64_t k2 = w.klo[2]; k2 < w.khi[2]; k2++) {
                                add_at(dt, dx, row + k2 * sp.d[2], gy);
                            }
                        }
                    }
                }
            }
        }
    }
    return DDL_OK;
}
