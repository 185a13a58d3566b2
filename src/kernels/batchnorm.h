// kernels/batchnorm.h: internal: the vector width of the batch-norm kernels, for tests.
#ifndef DDL_KERNELS_BATCHNORM_H
#define DDL_KERNELS_BATCHNORM_H

// Caps the width the batch-norm entry points (ddl/kernels_pointwise.h) run at: 0 the
// baseline (SSE2), 1 AVX2, 2 AVX-512F; -1 (the default) the CPU's widest. Every width
// gives the same bits, which is what the cap lets a test check. Returns the previous cap.
int ddl_batchnorm_set_width(int width);
// The width the entry points run at now (the CPU's widest, capped as above).
int ddl_batchnorm_width(void);

#endif // DDL_KERNELS_BATCHNORM_H
