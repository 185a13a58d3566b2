// tests/support/kernel_util.c: helpers shared by the kernel tests.
#include <math.h>
#include <stdlib.h>

#include "ddl/base.h"
#include "kernel_util.h"

double *ddl_test_rand_vec(int64_t n, uint64_t seed, uint64_t stream)
{
    double *v = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    for (int64_t i = 0; i < n; i++) {
        v[i] = (double)(float)(2.0 * ddl_rng_uniform(seed, stream, (uint64_t)i) - 1.0);
    }
    return v;
}

void *ddl_test_as_dtype(ddl_dtype dt, const double *v, int64_t n)
{
    void *p = malloc((size_t)(n > 0 ? n : 1) * ddl_dtype_size(dt));
    for (int64_t i = 0; i < n; i++) {
        if (dt == DDL_F32) {
            ((float *)p)[i] = (float)v[i];
        } else {
            ((double *)p)[i] = v[i];
        }
    }
    return p;
}

double ddl_test_at(ddl_dtype dt, const void *p, int64_t i)
{
    return dt == DDL_F32 ? (double)((const float *)p)[i] : ((const double *)p)[i];
}

double ddl_test_rel_err(const double *ref, ddl_dtype dt, const void *got, int64_t n)
{
    double num = 0.0, den = 1e-300;
    for (int64_t i = 0; i < n; i++) {
        num = fmax(num, fabs(ddl_test_at(dt, got, i) - ref[i]));
        den = fmax(den, fabs(ref[i]));
    }
    return num / den;
}
