// tests/support/gradcheck.c: central finite differences against analytic gradients.
#include <math.h>

#include "gradcheck.h"

double ddl_test_gradcheck(int64_t n, double *x, const double *grad, ddl_test_scalar_fn f,
                          void *ctx, double eps, int64_t max_points)
{
    double  worst = 0.0;
    int64_t step  = (max_points > 0 && n > max_points) ? n / max_points : 1;
    for (int64_t i = 0; i < n; i += step) {
        double keep = x[i];
        x[i]        = keep + eps;
        double fp   = f(ctx);
        x[i]        = keep - eps;
        double fm   = f(ctx);
        x[i]        = keep;
        double num  = (fp - fm) / (2.0 * eps);
        double den  = fmax(1.0, fmax(fabs(num), fabs(grad[i])));
        double err  = fabs(num - grad[i]) / den;
        if (err > worst) {
            worst = err;
        }
    }
    return worst;
}
