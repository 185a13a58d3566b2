// kernels/conv_direct.c: direct convolution kernels (see kernels/conv_direct.h) for f32
// and f64, in AVX2 + FMA (8 / 4 lanes) and AVX-512F (16 / 8 lanes), selected at run time
// by the CPU's flags.
#include "kernels/conv_direct.h"

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

// Register tiles. AVX2 (16 registers), 12 accumulators each: forward 6 channels x 2
// vectors (2 loads of x and 6 broadcasts per 12 FMAs); dW 4 channels x 3 taps (4 loads
// of dy, 3 of x); dx gather 3 input channels x 4 vectors (4 loads of dy, 3 broadcasts)
// or 8 vectors of a lone channel (8 independent FMA chains cover the FMA latency); dx
// scatter 3 channels x 4 vectors. AVX-512 (32 registers), 24 accumulators: forward 6 x 4
// vectors, dW 6 x 4 taps, scatter 6 x 4, lone-channel gather 16 vectors. Each larger
// tile was measured faster on AMD EPYC (Zen 5): see docs/PERFORMANCE.md.
#define CDIR_DW_CB  4
#define CDIR_DW_TB  3
#define CDIR_DXS_TB 3
#define CDIR_DXS_JV 4
// Most vectors of positions the forward's tiles of several samples draw from at once.
#define CDIR_FWD_GROUP_VECTORS 32

#define CDIR_INLINE static inline __attribute__((always_inline))

// ---- AVX2 + FMA: 8 floats / 4 doubles per vector ----
#define CDIR_TGT     __attribute__((target("avx2,fma")))
#define CV_CBMAX 3
#define CV_ACC 12
#define DW_CB        CDIR_DW_CB
#define DW_TB        CDIR_DW_TB
#define FWD_JV       2
#define DX_QV1       8
#define DXS_TB       CDIR_DXS_TB
#define T        float
#define V        __m256
#define L        8
#define SUF      f32
#define LOADU    _mm256_loadu_ps
#define STOREU   _mm256_storeu_ps
#define BCAST    _mm256_broadcast_ss
#define FMA      _mm256_fmadd_ps
#define ZERO     _mm256_setzero_ps
#define AND      _mm256_and_ps
#define ADD      _mm256_add_ps
// The lanes of v summed in pairwise halves: lane l with l + L/2, then with l + L/4, ...
// (dw_finish's order; IEEE addition of two values is commutative, so these shuffles give
// the bits of the scalar loop they replace).
CDIR_TGT static inline float hsum_f32(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s        = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}
#define HSUM hsum_f32
#include "kernels/conv_cvec_t.h"
#include "kernels/conv_direct_t.h"
#undef HSUM
#undef T
#undef V
#undef L
#undef SUF
#undef LOADU
#undef STOREU
#undef BCAST
#undef FMA
#undef ZERO
#undef AND
#undef ADD

#define T      double
#define V      __m256d
#define L      4
#define SUF    f64
#define LOADU  _mm256_loadu_pd
#define STOREU _mm256_storeu_pd
#define BCAST  _mm256_broadcast_sd
#define FMA    _mm256_fmadd_pd
#define ZERO   _mm256_setzero_pd
#define AND    _mm256_and_pd
#define ADD    _mm256_add_pd
CDIR_TGT static inline double hsum_f64(__m256d v)
{
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}
#define HSUM hsum_f64
#include "kernels/conv_cvec_t.h"
#include "kernels/conv_direct_t.h"
#undef HSUM
#undef T
#undef V
#undef L
#undef SUF
#undef LOADU
#undef STOREU
#undef BCAST
#undef FMA
#undef ZERO
#undef AND
#undef ADD
#undef CDIR_TGT

// ---- AVX-512F: 16 floats / 8 doubles per vector (the same tiles) ----
#define CDIR_TGT     __attribute__((target("avx512f")))
#undef CV_CBMAX
#undef CV_ACC
#define CV_CBMAX 4
#define CV_ACC 24
#undef DW_CB
#undef DW_TB
#undef FWD_JV
#undef DX_QV1
#define DX_QV1 16
#undef DXS_TB
#define DW_CB  6
#define DW_TB  4
#define FWD_JV 4
#define DXS_TB 6
#define T        float
#define V        __m512
#define L        16
#define SUF      f32_512
#define LOADU    _mm512_loadu_ps
#define STOREU   _mm512_storeu_ps
#define BCAST(p) _mm512_set1_ps(*(p))
#define FMA      _mm512_fmadd_ps
#define ZERO     _mm512_setzero_ps
#define ADD _mm512_add_ps
#define AND(a, m)                                                                            \
    _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(a), _mm512_castps_si512(m)))
CDIR_TGT static inline float hsum_f32_512(__m512 v)
{
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s        = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}
#define HSUM hsum_f32_512
#include "kernels/conv_cvec_t.h"
#include "kernels/conv_direct_t.h"
#undef HSUM
#undef T
#undef V
#undef L
#undef SUF
#undef LOADU
#undef STOREU
#undef BCAST
#undef FMA
#undef ZERO
#undef AND
#undef ADD

#define T        double
#define V        __m512d
#define L        8
#define SUF      f64_512
#define LOADU    _mm512_loadu_pd
#define STOREU   _mm512_storeu_pd
#define BCAST(p) _mm512_set1_pd(*(p))
#define FMA      _mm512_fmadd_pd
#define ZERO     _mm512_setzero_pd
#define ADD _mm512_add_pd
#define AND(a, m)                                                                            \
    _mm512_castsi512_pd(_mm512_and_si512(_mm512_castpd_si512(a), _mm512_castpd_si512(m)))
CDIR_TGT static inline double hsum_f64_512(__m512d v)
{
    __m256d h = _mm256_add_pd(_mm512_castpd512_pd256(v), _mm512_extractf64x4_pd(v, 1));
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(h), _mm256_extractf128_pd(h, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}
#define HSUM hsum_f64_512
#include "kernels/conv_cvec_t.h"
#include "kernels/conv_direct_t.h"
#undef HSUM
#undef T
#undef V
#undef L
#undef SUF
#undef LOADU
#undef STOREU
#undef BCAST
#undef FMA
#undef ZERO
#undef AND
#undef ADD
#undef CDIR_TGT

// The vector width in use: 0 none (the im2col path), 1 AVX2 + FMA, 2 AVX-512F; decided
// once from the CPU and DDL_CONV_DIRECT (0: off, avx2: at most AVX2, 1: the CPU's
// widest). -1: not decided.
static int cdir_default = -1, cdir_override = -1;

static int cdir_cpu_level(void)
{
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
        return 0;
    }
    return __builtin_cpu_supports("avx512f") ? 2 : 1;
}

static int cdir_level(void)
{
    if (cdir_default < 0) {
        const char *e = getenv("DDL_CONV_DIRECT");
        int         l = cdir_cpu_level();
        if (e != NULL && strcmp(e, "0") == 0) {
            l = 0;
        } else if (e != NULL && strcmp(e, "avx2") == 0 && l > 1) {
            l = 1;
        }
        cdir_default = l;
    }
    if (cdir_override >= 0) {
        int cpu = cdir_cpu_level();
        return cdir_override < cpu ? cdir_override : cpu;
    }
    return cdir_default;
}

bool ddl_conv_direct_setting_ok(const char *value)
{
    return value != NULL &&
           (strcmp(value, "0") == 0 || strcmp(value, "1") == 0 || strcmp(value, "avx2") == 0);
}

int ddl_cdir_level(void)
{
    return cdir_level();
}

const char *ddl_conv_path(void)
{
    static const char *const names[] = {"im2col + GEMM", "direct AVX2", "direct AVX-512"};
    return names[cdir_level()];
}

bool ddl_cdir_enabled(void)
{
    return cdir_level() > 0;
}

static int cdir_group_most = DDL_CDIR_DW_GROUP;

int ddl_cdir_dw_group(void)
{
    return cdir_group_most;
}

int ddl_cdir_set_dw_group(int most)
{
    int prev        = cdir_group_most;
    cdir_group_most = most < 1 ? DDL_CDIR_DW_GROUP : most;
    return prev;
}

int ddl_cdir_set(int level)
{
    int prev      = cdir_level();
    cdir_override = level < 0 ? -1 : level;
    return prev;
}

// The instance of kernel `name` for dt at the level in use (AVX-512 or AVX2).
#define CDIR_CALL(dt, name, ...)                                                                   \
    do {                                                                                           \
        const bool w512_ = cdir_level() == 2;                                                      \
        if ((dt) == DDL_F32) {                                                                     \
            (w512_ ? name##_f32_512 : name##_f32)(__VA_ARGS__);                                    \
        } else {                                                                                   \
            (w512_ ? name##_f64_512 : name##_f64)(__VA_ARGS__);                                    \
        }                                                                                          \
    } while (0)

void ddl_cdir_forward(ddl_dtype dt, const ddl_cdir *c, void *yw, const void *xp, const void *w,
                      const void *b, int64_t ns, int64_t sy, int64_t sx)
{
    CDIR_CALL(dt, fwd_n, c, yw, xp, w, b, ns, sy, sx);
}

// dW at AVX-512 uses a larger tile (6 channels x 4 taps: 24 of the 32 registers), which
// amortises the x loads (at any offset, so each 512-bit one spans two cache lines) over
// twice the FMAs: measured on AMD EPYC (Zen 5; LeNet's conv1 / conv2, batch 256, CPU
// time): 0.61 / 1.36 ms, against 0.94 / 1.78 at AVX2 and 1.33 / 2.73 at AVX-512 with
// the AVX2 tile.
void ddl_cdir_dw(ddl_dtype dt, const ddl_cdir *c, void *acc, const void *dyw, const void *xp,
                 const void *mask, int64_t ns, int64_t sdy, int64_t sx, bool fresh)
{
    CDIR_CALL(dt, dw, c, acc, dyw, xp, mask, ns, sdy, sx, fresh);
}

void ddl_cdir_dw_finish(ddl_dtype dt, const ddl_cdir *c, void *dw, const void *acc)
{
    CDIR_CALL(dt, dw_finish, c, dw, acc);
}

void ddl_cdir_dx(ddl_dtype dt, const ddl_cdir *c, void *dxp, const void *dyw, const void *w)
{
    CDIR_CALL(dt, dx, c, dxp, dyw, w);
}

void ddl_cdir_dx_scatter_pack(ddl_dtype dt, const ddl_cdir *c, void *wp, const void *w)
{
    CDIR_CALL(dt, dxs_pack, c, wp, w);
}

void ddl_cdir_dx_scatter(ddl_dtype dt, const ddl_cdir *c, void *dxp, const void *dyw,
                         const void *wp)
{
    CDIR_CALL(dt, dxs, c, dxp, dyw, wp);
}

static bool cvec_on = true;

bool ddl_cvec_set(bool on)
{
    bool prev = cvec_on;
    cvec_on   = on;
    return prev;
}

int64_t ddl_cvec_lanes(ddl_dtype dt)
{
    int l = cdir_level();
    if (l == 0 || !cvec_on) {
        return 0;
    }
    int64_t bytes = l == 2 ? 64 : 32;
    return bytes / (dt == DDL_F64 ? 8 : 4);
}

void ddl_cvec_forward(ddl_dtype dt, const ddl_cvec *c, void *yT, const void *xp, const void *wT,
                      const void *b, int64_t ns)
{
    CDIR_CALL(dt, cv_fwd, c, yT, xp, wT, b, ns);
}

void ddl_cvec_dw(ddl_dtype dt, const ddl_cvec *c, void *dWT, const void *xp, const void *dyT,
                 int64_t ns)
{
    CDIR_CALL(dt, cv_dw, c, dWT, xp, dyT, ns);
}

void ddl_cvec_dx(ddl_dtype dt, const ddl_cvec *c, void *dxpT, const void *dy, const void *wK,
                 int64_t ns)
{
    CDIR_CALL(dt, cv_dx, c, dxpT, dy, wK, ns);
}

// dst[j ldd + i] = (or +=) src[i lds + j] for i < r, j < c.
#define CVEC_TRANSPOSE_LOOP(T_)                                                                    \
    do {                                                                                           \
        T_       *d = (T_ *)dst;                                                                   \
        const T_ *a = (const T_ *)src;                                                             \
        for (int64_t i = i0; i < r; i++) {                                                         \
            for (int64_t j = j0; j < j1; j++) {                                                    \
                d[j * ldd + i] = add ? d[j * ldd + i] + a[i * lds + j] : a[i * lds + j];           \
            }                                                                                      \
        }                                                                                          \
    } while (0)

static void cvec_transpose_rest(ddl_dtype dt, void *dst, int64_t ldd, const void *src, int64_t lds,
                                int64_t i0, int64_t r, int64_t j0, int64_t j1, bool add)
{
    if (dt == DDL_F32) {
        CVEC_TRANSPOSE_LOOP(float);
    } else {
        CVEC_TRANSPOSE_LOOP(double);
    }
}
#undef CVEC_TRANSPOSE_LOOP

// A 16 x 16 block of floats transposed in registers: pairs of rows interleaved by 32-bit,
// then 64-bit elements, then 128-bit lanes twice (64 shuffles for 256 elements, against
// a load and a store each one at a time: 7x faster on Zen 5).
__attribute__((target("avx512f"))) static void tr16_f32(float *d, int64_t ldd, const float *s,
                                                        int64_t lds, bool add)
{
    __m512 r[16], t[16];
    for (int i = 0; i < 16; i++) {
        r[i] = _mm512_loadu_ps(s + i * lds);
    }
    for (int i = 0; i < 16; i += 2) {
        t[i]     = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        __m512d a = _mm512_castps_pd(t[i]), b = _mm512_castps_pd(t[i + 1]);
        __m512d c = _mm512_castps_pd(t[i + 2]), e = _mm512_castps_pd(t[i + 3]);
        r[i]     = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, e));
        r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, e));
    }
    for (int i = 0; i < 4; i++) {
        t[i]      = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
        t[i + 4]  = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
        t[i + 8]  = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 4; i++) {
        r[i]      = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8]  = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
        r[i + 4]  = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0x88);
        r[i + 12] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0xdd);
    }
    for (int i = 0; i < 16; i++) {
        float *o = d + i * ldd;
        _mm512_storeu_ps(o, add ? _mm512_add_ps(_mm512_loadu_ps(o), r[i]) : r[i]);
    }
}

void ddl_cvec_transpose(ddl_dtype dt, void *dst, int64_t ldd, const void *src, int64_t lds,
                        int64_t r, int64_t c, bool add)
{
    int64_t rb = 0, cb = 0;
    if (dt == DDL_F32 && cdir_level() == 2) {
        rb = r / 16 * 16, cb = c / 16 * 16;
        for (int64_t i = 0; i < rb; i += 16) {
            for (int64_t j = 0; j < cb; j += 16) {
                tr16_f32((float *)dst + j * ldd + i, ldd, (const float *)src + i * lds + j, lds,
                         add);
            }
        }
    }
    // The rows past the blocks (all columns), then the columns past them (the blocks' rows).
    cvec_transpose_rest(dt, dst, ldd, src, lds, rb, r, 0, c, add);
    cvec_transpose_rest(dt, dst, ldd, src, lds, 0, rb, cb, c, add);
}
