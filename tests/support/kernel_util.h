// tests/support/kernel_util.h: helpers shared by the kernel tests: reference vectors in
// double, their copies in a kernel dtype, and the norm-wise relative error.
#ifndef DDL_KERNEL_UTIL_H
#define DDL_KERNEL_UTIL_H

#include <stdint.h>

#include "ddl/tensor.h"

// n values uniform in [-1, 1) from (seed, stream), rounded to float so the same numbers
// exist in f32. Caller frees.
double *ddl_test_rand_vec(int64_t n, uint64_t seed, uint64_t stream);
// v converted to dtype dt (a new malloc'd buffer).
void   *ddl_test_as_dtype(ddl_dtype dt, const double *v, int64_t n);
// Element i of a dt buffer, as double.
double  ddl_test_at(ddl_dtype dt, const void *p, int64_t i);
// max |got - ref| / max |ref|.
double  ddl_test_rel_err(const double *ref, ddl_dtype dt, const void *got, int64_t n);

#endif // DDL_KERNEL_UTIL_H
