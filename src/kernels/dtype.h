// kernels/dtype.h: internal: element access by dtype for the pointwise kernels.
//
// Kernel bodies are written once over double arithmetic and specialised per dtype by
// forced inlining with a constant `dt`, so no dtype branch survives in the loops.
#ifndef DDL_KERNELS_DTYPE_H
#define DDL_KERNELS_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "ddl/tensor.h"

#include <stdbool.h>

#define KERNEL static inline __attribute__((always_inline))

// Bytes per element: ddl_dtype_size inlined (it is a library call, and im2col and the
// pointwise loops ask per row). dt is DDL_F32 or DDL_F64, validated by the caller.
KERNEL size_t dt_size(ddl_dtype dt)
{
    return dt == DDL_F64 ? sizeof(double) : sizeof(float);
}

KERNEL double ld(ddl_dtype dt, const void *p, int64_t i)
{
    return dt == DDL_F32 ? (double)((const float *)p)[i] : ((const double *)p)[i];
}

KERNEL void st(ddl_dtype dt, void *p, int64_t i, double v)
{
    if (dt == DDL_F32) {
        ((float *)p)[i] = (float)v;
    } else {
        ((double *)p)[i] = v;
    }
}

// p[i] += v, rounded once.
KERNEL void acc(ddl_dtype dt, void *p, int64_t i, double v)
{
    if (dt == DDL_F32) {
        ((float *)p)[i] = (float)((double)((float *)p)[i] + v);
    } else {
        ((double *)p)[i] += v;
    }
}

// p[i] = v, or p[i] += v when accumulating, rounded once. The store is of v + 0.0, which
// is what accumulating onto a zeroed p gives bit for bit (-0.0 becomes +0.0): a backward
// that overwrites its dx returns the same bits as one that adds into a zeroed dx.
KERNEL void put(ddl_dtype dt, void *p, int64_t i, double v, bool into)
{
    if (into) {
        st(dt, p, i, v + 0.0);
    } else {
        acc(dt, p, i, v);
    }
}

// The widest of the vector sets kernels are built for that the CPU has: 2 AVX-512F, 1
// AVX2, 0 the baseline (SSE2); at most cap when cap >= 0 (a test's setting).
KERNEL int cpu_width(int cap)
{
    int w = __builtin_cpu_supports("avx512f") ? 2 : __builtin_cpu_supports("avx2") ? 1 : 0;
    return cap >= 0 && cap < w ? cap : w;
}

// Sets *cap to width (a negative width: no cap) and returns the previous cap: the setter of
// each kernel's cap for tests (ddl_batchnorm_set_width, ddl_interpolate_set_width).
KERNEL int cpu_width_set_cap(int *cap, int width)
{
    int old = *cap;
    *cap    = width < 0 ? -1 : width;
    return old;
}

#endif // DDL_KERNELS_DTYPE_H
