// tests/support/gradcheck.h: central finite-difference gradient checks (f64).
#ifndef DDL_GRADCHECK_H
#define DDL_GRADCHECK_H

#include <stdint.h>

// A scalar function of the current contents of the parameter being checked.
typedef double (*ddl_test_scalar_fn)(void *ctx);

// Compares grad (the analytic gradient of f with respect to x[0..n)) against the
// central difference (f(x + eps e_i) - f(x - eps e_i)) / (2 eps), perturbing x in place
// and restoring it. Checks at most max_points indices (spread evenly; all when n is
// small). Returns the largest relative error |num - ana| / max(1, |num|, |ana|).
double ddl_test_gradcheck(int64_t n, double *x, const double *grad, ddl_test_scalar_fn f,
                          void *ctx, double eps, int64_t max_points);

#endif // DDL_GRADCHECK_H
