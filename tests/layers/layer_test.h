// tests/layers/layer_test.h: runs the generic layer checks (src/tools/verify/
// layer_checks.h) on a builder and asserts their tolerances.
#ifndef DDL_LAYER_TEST_H
#define DDL_LAYER_TEST_H

#include <math.h>
#include <stdio.h>

#include "ddl/base.h"
#include "ddl/layers.h"
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

// t's local block (on partition P) of a seeded uniform tensor of shape global; the same
// global values on any partition.
static inline void layer_test_fill(ddl_tensor_t *t, const ddl_partition_t *P,
                                   const ddl_shape *global, uint64_t stream)
{
    ddl_box box = ddl_partition_local_box(P, global);
    ddl_fill_global_uniform(t, &box, global, 77, stream);
}

// max |a - b| over every rank's local block (collective).
static inline double layer_test_max_diff(const ddl_tensor_t *a, const ddl_tensor_t *b)
{
    double e = 0.0;
    for (int64_t i = 0; i < ddl_tensor_numel(a); i++) {
        e = fmax(e, fabs(ddl_tensor_get(a, i) - ddl_tensor_get(b, i)));
    }
    double g;
    MPI_Allreduce(&e, &g, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return g;
}

// Repeatability (f64): forward and backward depend only on their arguments (and the
// parameters): a layer run on (x1, dy1) and then on (x2, dy2) gives, on the second run,
// exactly what a fresh layer gives on (x2, dy2). This catches state left in the plan's
// buffers (ghosts, pads, staging blocks), which the single-pass checks cannot see. That
// second run also must not allocate.
static inline void layer_test_repeat(const char *name, ddl_layer_builder *b)
{
    ddl_layer_t  *L[2] = {NULL, NULL};
    ddl_tensor_t *x[2], *dy[2], *y[2], *dx[2];
    for (int i = 0; i < 2; i++) {
        ASSERT_OK(b->build(b->ctx, false, DDL_F64, &L[i]));
        ddl_layer_init_params(L[i], b->seed, 200);
    }
    for (int i = 0; i < 2; i++) {
        ASSERT_OK(ddl_tensor_create(DDL_F64, ddl_layer_x_shape(L[0]), &x[i]));
        ASSERT_OK(ddl_tensor_create(DDL_F64, ddl_layer_y_shape(L[0]), &dy[i]));
        ASSERT_OK(ddl_tensor_create(DDL_F64, ddl_layer_y_shape(L[0]), &y[i]));
        ASSERT_OK(ddl_tensor_create(DDL_F64, ddl_layer_x_shape(L[0]), &dx[i]));
        layer_test_fill(x[i], ddl_layer_P_in(L[0]), ddl_layer_x_global(L[0]), 10 + (uint64_t)i);
        layer_test_fill(dy[i], ddl_layer_P_out(L[0]), ddl_layer_y_global(L[0]), 20 + (uint64_t)i);
    }
    // L[0]: (x0, dy0) then (x1, dy1); L[1]: (x1, dy1) only.
    ASSERT_OK(ddl_layer_forward(L[0], x[0], y[0]));
    ASSERT_OK(ddl_layer_backward(L[0], dy[0], dx[0]));
    ddl_layer_zero_grad(L[0]);
    uint64_t allocs = ddl_alloc_count();
    ASSERT_OK(ddl_layer_forward(L[0], x[1], y[0]));
    ASSERT_OK(ddl_layer_backward(L[0], dy[1], dx[0]));
    ASSERT_EQ(ddl_alloc_count(), allocs); // the steady state allocates nothing
    ddl_layer_zero_grad(L[1]);
    ASSERT_OK(ddl_layer_forward(L[1], x[1], y[1]));
    ASSERT_OK(ddl_layer_backward(L[1], dy[1], dx[1]));
    double e = fmax(layer_test_max_diff(y[0], y[1]), layer_test_max_diff(dx[0], dx[1]));
    for (int k = 0; k < ddl_layer_nparams(L[0]); k++) {
        e = fmax(
            e, layer_test_max_diff(ddl_layer_param(L[0], k)->grad, ddl_layer_param(L[1], k)->grad));
    }
    if (e > 1e-12) {
        TEST_FAIL_("%s: a second forward/backward differs from a fresh layer's by %.3e", name, e);
    }
    for (int i = 0; i < 2; i++) {
        ddl_tensor_destroy(&x[i]);
        ddl_tensor_destroy(&dy[i]);
        ddl_tensor_destroy(&y[i]);
        ddl_tensor_destroy(&dx[i]);
        ddl_layer_destroy(&L[i]);
    }
}

#endif // DDL_LAYER_TEST_H
