// kernels/conv_direct.c: direct convolution kernels for few input channels (see
// kernels/conv_direct.h), AVX2 + FMA, for f32 (8 lanes) and f64 (4 lanes), selected at
// run time by the CPU's flags.
#include "kernels/conv_direct.h"

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

// Register tiles (AVX2 has 16 vector registers): forward 6 channels x 2 vectors = 12
// accumulators (2 loads of x and 6 broadcasts per 12 FMAs); dW 4 channels x 3 taps = 12
// accumulators (4 loads of dy, 3 of x per 12 FMAs); dx 3 input channels x 4 vectors
// (4 loads of dy, 3 broadcasts per 12 FMAs), or 8 vectors of a lone channel (8
// independent FMA chains cover the FMA latency).
#define CDIR_CB    6
#define CDIR_DW_CB 4
#define CDIR_DW_TB 3
#define CDIR_DX_QV 8
#define CDIR_DX_ACC 12

#define CDIR_TGT    __attribute__((target("avx2,fma")))
#define CDIR_INLINE static inline __attribute__((always_inline))

#define T      float
#define V      __m256
#define L      8
#define SUF    f32
#define LOADU  _mm256_loadu_ps
#define STOREU _mm256_storeu_ps
#define BCAST  _mm256_broadcast_ss
#define FMA    _mm256_fmadd_ps
#define ZERO   _mm256_setzero_ps
#define AND    _mm256_and_ps
#include "kernels/conv_direct_t.h"
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
#include "kernels/conv_direct_t.h"
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

// -1: not decided yet; then 0 or 1. The override (ddl_cdir_set) is -1 when unset.
static int cdir_default = -1, cdir_override = -1;

static bool cdir_cpu_ok(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

bool ddl_cdir_enabled(void)
{
    if (cdir_default < 0) {
        const char *e = getenv("DDL_CONV_DIRECT");
        cdir_default  = cdir_cpu_ok() && !(e != NULL && strcmp(e, "0") == 0);
    }
    if (cdir_override >= 0) {
        return cdir_override == 1 && cdir_cpu_ok();
    }
    return cdir_default == 1;
}

int ddl_cdir_set(int on)
{
    int prev      = ddl_cdir_enabled() ? 1 : 0;
    cdir_override = on < 0 ? -1 : (on ? 1 : 0);
    return prev;
}

void ddl_cdir_forward(ddl_dtype dt, const ddl_cdir *c, void *yw, const void *xp, const void *w)
{
    if (dt == DDL_F32) {
        fwd_f32(c, yw, xp, w);
    } else {
        fwd_f64(c, yw, xp, w);
    }
}

void ddl_cdir_dw(ddl_dtype dt, const ddl_cdir *c, void *dw, const void *dyw, const void *xp,
                 const void *mask)
{
    if (dt == DDL_F32) {
        dw_f32(c, dw, dyw, xp, mask);
    } else {
        dw_f64(c, dw, dyw, xp, mask);
    }
}

void ddl_cdir_dx(ddl_dtype dt, const ddl_cdir *c, void *dxp, const void *dyw, const void *w)
{
    if (dt == DDL_F32) {
        dx_f32(c, dxp, dyw, w);
    } else {
        dx_f64(c, dxp, dyw, w);
    }
}
