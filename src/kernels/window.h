// kernels/window.h: internal: the sliding-window geometry shared by convolution and
// pooling, padded to three spatial dimensions (leading dimensions of size 1).
#ifndef DDL_KERNELS_WINDOW_H
#define DDL_KERNELS_WINDOW_H

#include <stdbool.h>
#include <stdint.h>

typedef struct sp3 {
    int64_t in[3], k[3], s[3], p[3], d[3], out[3];
    int64_t iv, ov, kv; // prod(in), prod(out), prod(k)
} sp3;

static inline bool mul_ok(int64_t a, int64_t b, int64_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}

// The nsp user dimensions right-aligned in three (missing ones: extent 1, stride 1,
// padding 0, dilation 1).
static inline sp3 sp3_make(int nsp, const int64_t *in, const int64_t *k, const int64_t *s,
                           const int64_t *p, const int64_t *d, const int64_t *out)
{
    sp3 sp;
    int sh = 3 - nsp;
    sp.iv = sp.ov = sp.kv = 1;
    for (int i = 0; i < 3; i++) {
        int j     = i - sh; // user dimension, or < 0 for a padding dimension
        sp.in[i]  = j >= 0 ? in[j] : 1;
        sp.k[i]   = j >= 0 ? k[j] : 1;
        sp.s[i]   = j >= 0 ? s[j] : 1;
        sp.p[i]   = j >= 0 ? p[j] : 0;
        sp.d[i]   = j >= 0 ? d[j] : 1;
        sp.out[i] = j >= 0 ? out[j] : 1;
        sp.iv *= sp.in[i];
        sp.ov *= sp.out[i];
        sp.kv *= sp.k[i];
    }
    return sp;
}

#endif // DDL_KERNELS_WINDOW_H
