// tests/layers/layer_test.h: runs the generic layer checks (src/tools/verify/
// layer_checks.h) on a builder and asserts their tolerances.
#ifndef DDL_LAYER_TEST_H
#define DDL_LAYER_TEST_H

#include <stdio.h>

#include "layer_checks.h"
#include "mpi_test.h"

// Tolerances: adjoint 1e-13 (f64) / 1e-5 (f32); sequential 1e-12 (f64) / 1e-5 (f32);
// gradcheck 1e-6 (f64 only).
static inline void layer_test_run(const char *name, ddl_layer_builder *b, bool linear,
                                  bool gradcheck)
{
    ddl_check_result r;
    for (int k = 0; k < 2; k++) {
        ddl_dtype dt = k == 0 ? DDL_F64 : DDL_F32;
        if (linear) {
            ASSERT_OK(ddl_check_adjoint(b, dt, &r));
            if (r.max > ddl_test_adjoint_tol(dt)) {
                TEST_FAIL_("%s (%s): adjoint error %.3e (input %.3e)", name, ddl_dtype_name(dt),
                           r.max, r.err_input);
            }
        }
        ASSERT_OK(ddl_check_sequential(b, dt, &r));
        double tol = dt == DDL_F64 ? 1e-12 : 1e-5;
        if (r.max > tol) {
            TEST_FAIL_("%s (%s): sequential error %.3e (input/output %.3e)", name,
                       ddl_dtype_name(dt), r.max, r.err_input);
        }
    }
    if (gradcheck) {
        ASSERT_OK(ddl_check_gradcheck(b, 12, &r));
        if (r.max > 1e-6) {
            TEST_FAIL_("%s: gradcheck error %.3e (input %.3e)", name, r.max, r.err_input);
        }
    }
    if (ddl_test_rank == 0) {
        printf("ok %s\n", name);
        fflush(stdout);
    }
}

#endif // DDL_LAYER_TEST_H
