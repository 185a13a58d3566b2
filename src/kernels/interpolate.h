// kernels/interpolate.h: internal: the vector width of the interpolation kernel, for tests.
#ifndef DDL_KERNELS_INTERPOLATE_H
#define DDL_KERNELS_INTERPOLATE_H

// Caps the width ddl_interpolate_forward and _backward run at: 0 the baseline (SSE2), 1
// AVX2, 2 AVX-512F; -1 (the default) the CPU's widest. Every width gives the same bits,
// which is what the cap lets a test check. Returns the previous cap.
int ddl_interpolate_set_width(int width);
// The width they run at now (the CPU's widest, capped as above).
int ddl_interpolate_width(void);

#endif // DDL_KERNELS_INTERPOLATE_H
