// AllSumReduce tests, after DistDL's tests/primitives/test_all_sum_reduce.py:
//  - every subset of the axes of a [2,2,3] partition (12 ranks), both dtypes:
//    DistDL's exact values (x = 10 gives y = 10·Π_{k∈axes} P_k; dy = 0.1 gives
//    dx = 0.1·Π), exact group sums of a rank pattern computed here from the
//    coordinates, the adjoint test (<= 1e-13 f64, <= 1e-5 f32), in place, no
//    allocation in forward/adjoint;
//  - DistDL's mock weight reduction: P [12], axes {0}, local [30, 344];
//  - a partition on ranks 4..7 only (the others are idle and hold empty tensors);
//  - chunked messages; invalid axes refused with EINVAL on every rank; bad tensors.
// With fewer ranks the layouts that do not fit are skipped; np 1 runs the identity
// cases ([1] and [1,1,1] over every subset of axes).
#include <string.h>

#include "ddl/base.h"
#include "ddl/decomp.h"
#include "mpi_test.h"
#include "primitives/bcast_reduce.h"  // the chunk-limit test hook

static int world_size;

// Base rank r's pattern: 100(r+1) + i.
static void fill_pattern(ddl_tensor_t *t, int r)
{
    for (int64_t i = 0; i < ddl_tensor_numel(t); i++) {
        ddl_tensor_set(t, i, 100.0 * (r + 1) + (double)i);
    }
}

// Runs one plan over P (first rank `first`, shape pshape) reducing over the axes in
// `mask` (bit k = axis k), local shape S, dtype dt. Every rank of the world calls it.
static void run_case(int first, int ndim, const int *pshape, unsigned mask, ddl_dtype dt,
                     const ddl_shape *S)
{
    ddl_partition_t *P = ddl_test_partition_range(first, ndim, pshape);
    int              axes[DDL_MAX_DIMS], naxes = 0, prod = 1;
    // List the axes in descending order: the order must not matter.
    for (int k = ndim - 1; k >= 0; k--) {
        if (mask & (1u << k)) {
            axes[naxes++] = k;
            prod *= pshape[k];
        }
    }
    ddl_all_sum_reduce_t *a = NULL;
    ASSERT_OK(ddl_all_sum_reduce_create(P, naxes, axes, dt, S, &a));
    ddl_shape ls     = ddl_all_sum_reduce_shape(a);
    bool      active = ddl_partition_active(P);
    if (active) {
        ASSERT_TRUE(ddl_shape_equal(&ls, S));
    } else {
        ASSERT_EQ(ddl_shape_numel(&ls), 0);
    }
    double rtol = dt == DDL_F64 ? 1e-15 : 1e-6;

    // DistDL's exact values.
    ddl_tensor_t *x = ddl_test_filled(dt, &ls, 10.0), *y = ddl_test_guarded(dt, &ls, -7.0);
    ddl_tensor_t *dy = ddl_test_filled(dt, &ls, 0.1), *dx = ddl_test_guarded(dt, &ls, -7.0);
    uint64_t      a0 = ddl_alloc_count();
    ASSERT_OK(ddl_all_sum_reduce_forward(a, x, y));
    ASSERT_OK(ddl_all_sum_reduce_adjoint(a, dy, dx));
    ASSERT_EQ(ddl_alloc_count(), a0);
    double dyv = ddl_tensor_numel(dy) > 0 ? ddl_tensor_get(dy, 0) : 0.0;  // 0.1 rounded to dt
    for (int64_t i = 0; i < ddl_tensor_numel(y); i++) {
        ASSERT_NEAR(ddl_tensor_get(y, i), 10.0 * prod, 0.0);
        ASSERT_NEAR(ddl_tensor_get(dx, i), dyv * prod, rtol * prod);
    }

    // Adjoint test on random data.
    ddl_tensor_destroy(&x);
    ddl_tensor_destroy(&dy);
    x  = ddl_test_random(dt, &ls, 31);
    dy = ddl_test_random(dt, &ls, 32);
    ASSERT_OK(ddl_all_sum_reduce_forward(a, x, y));
    ASSERT_OK(ddl_all_sum_reduce_adjoint(a, dy, dx));
    double err = ddl_test_adjoint_error(MPI_COMM_WORLD, x, y, dy, dx);
    if (!(err <= ddl_test_adjoint_tol(dt))) {
        TEST_FAIL_("P %d-d mask %u (%s): adjoint error %g", ndim, mask, ddl_dtype_name(dt), err);
    }

    // Exact group sums, the group computed here from the coordinates: the ranks that
    // agree with mine on every axis not in the mask. Checked again in place.
    for (int pass = 0; pass < 2; pass++) {
        fill_pattern(x, ddl_test_rank);
        ddl_tensor_t *out = pass == 0 ? y : x;
        a0                = ddl_alloc_count();
        ASSERT_OK(ddl_all_sum_reduce_forward(a, x, out));
        ASSERT_EQ(ddl_alloc_count(), a0);
        if (!active) {
            continue;
        }
        const int *me = ddl_partition_index(P), *ranks = ddl_partition_ranks(P);
        double     rsum = 0;
        int        cnt  = 0;
        for (int p = 0; p < ddl_partition_size(P); p++) {
            int  c[DDL_MAX_DIMS];
            bool same = true;
            ddl_index_unravel(ndim, pshape, p, c);
            for (int k = 0; k < ndim; k++) {
                if (!(mask & (1u << k)) && c[k] != me[k]) {
                    same = false;
                }
            }
            if (same) {
                rsum += 100.0 * (ranks[p] + 1);
                cnt++;
            }
        }
        ASSERT_EQ(cnt, prod);
        for (int64_t i = 0; i < ddl_tensor_numel(out); i++) {
            ASSERT_NEAR(ddl_tensor_get(out, i), rsum + (double)cnt * (double)i, 0.0);
        }
    }
    ddl_tensor_destroy(&x);
    ddl_test_free_guarded(&y);
    ddl_test_free_guarded(&dx);
    ddl_tensor_destroy(&dy);
    ddl_all_sum_reduce_destroy(&a);
    ASSERT_TRUE(a == NULL);
    ddl_all_sum_reduce_destroy(&a);  // NULL-safe
    ddl_partition_destroy(&P);
}

// Every subset of the axes of P, both dtypes.
static void run_all_subsets(int first, int ndim, const int *pshape, const ddl_shape *S)
{
    for (unsigned mask = 0; mask < (1u << ndim); mask++) {
        run_case(first, ndim, pshape, mask, DDL_F64, S);
        run_case(first, ndim, pshape, mask, DDL_F32, S);
    }
}

static void test_layouts(void)
{
    ddl_shape S = ddl_shape_make(2, (int64_t[]){3, 4});  // DistDL's x_global_shape
    run_all_subsets(0, 1, (int[]){1}, &S);
    run_all_subsets(0, 3, (int[]){1, 1, 1}, &S);
    if (world_size >= 8) {
        run_all_subsets(4, 2, (int[]){2, 2}, &S);  // ranks 0..3 and 8.. are idle
    }
    if (world_size >= 12) {
        run_all_subsets(0, 3, (int[]){2, 2, 3}, &S);
        // DistDL's mock weight reduction.
        ddl_shape W = ddl_shape_make(2, (int64_t[]){30, 344});
        run_case(0, 1, (int[]){12}, 1u, DDL_F64, &W);
        run_case(0, 1, (int[]){12}, 1u, DDL_F32, &W);
    }
}

// 0-d and empty local shapes, and chunked messages (12 elements in chunks of 5).
static void test_shapes_and_chunks(void)
{
    ddl_shape scalar = ddl_shape_make(0, NULL);
    ddl_shape empty  = ddl_shape_make(3, (int64_t[]){2, 0, 3});
    ddl_shape S      = ddl_shape_make(2, (int64_t[]){3, 4});
    int       big    = world_size >= 12;
    int       shape3[3] = {big ? 2 : 1, big ? 2 : 1, big ? 3 : 1};
    run_case(0, 3, shape3, 5u, DDL_F64, &scalar);
    run_case(0, 3, shape3, 7u, DDL_F32, &empty);
    int64_t old = ddl__mpi_set_max_count(5);
    run_all_subsets(0, 3, shape3, &S);
    ddl__mpi_set_max_count(old);
}

// Invalid axes and arguments: EINVAL on every rank (validation needs no messages).
static void test_invalid(void)
{
    ddl_partition_t      *P = ddl_test_partition_range(0, 3, (int[]){1, 1, 1});
    ddl_all_sum_reduce_t *a = NULL;
    ddl_shape             S = ddl_shape_make(2, (int64_t[]){3, 4});
    ASSERT_STATUS(ddl_all_sum_reduce_create(P, 1, (int[]){3}, DDL_F64, &S, &a), DDL_EINVAL);
    ASSERT_TRUE(strstr(ddl_last_error(), "axes[0] = 3") != NULL);
    ASSERT_STATUS(ddl_all_sum_reduce_create(P, 1, (int[]){-1}, DDL_F64, &S, &a), DDL_EINVAL);
    ASSERT_TRUE(strstr(ddl_last_error(), "-1") != NULL);
    ASSERT_STATUS(ddl_all_sum_reduce_create(P, 2, (int[]){2, 2}, DDL_F64, &S, &a), DDL_EINVAL);
    ASSERT_TRUE(strstr(ddl_last_error(), "axis 2 is listed twice") != NULL);
    ASSERT_STATUS(ddl_all_sum_reduce_create(P, 4, (int[]){0, 1, 2, 0}, DDL_F64, &S, &a),
                  DDL_EINVAL);
    ASSERT_STATUS(ddl_all_sum_reduce_create(P, -1, NULL, DDL_F64, &S, &a), DDL_EINVAL);
    ASSERT_STATUS(ddl_all_sum_reduce_create(P, 1, NULL, DDL_F64, &S, &a), DDL_EINVAL);
    ASSERT_STATUS(ddl_all_sum_reduce_create(P, 0, NULL, (ddl_dtype)9, &S, &a), DDL_EINVAL);
    ddl_shape bad = ddl_shape_make(2, (int64_t[]){3, -2});
    ASSERT_STATUS(ddl_all_sum_reduce_create(P, 0, NULL, DDL_F64, &bad, &a), DDL_EINVAL);
    ASSERT_STATUS(ddl_all_sum_reduce_create(NULL, 0, NULL, DDL_F64, &S, &a), DDL_EINVAL);
    ASSERT_TRUE(a == NULL);

    // Bad tensors: the plan is an identity (no communicator), so a refusal on some
    // ranks cannot strand others.
    ASSERT_OK(ddl_all_sum_reduce_create(P, 3, (int[]){0, 1, 2}, DDL_F64, &S, &a));
    ddl_shape     ls  = ddl_all_sum_reduce_shape(a);
    ddl_tensor_t *x   = ddl_test_filled(DDL_F64, &ls, 1.0);
    ddl_tensor_t *y32 = ddl_test_filled(DDL_F32, &ls, 0.0);
    ASSERT_STATUS(ddl_all_sum_reduce_forward(a, x, y32), DDL_ESHAPE);
    ASSERT_STATUS(ddl_all_sum_reduce_adjoint(a, y32, x), DDL_ESHAPE);
    if (ddl_partition_active(P)) {
        ddl_shape     w  = ddl_shape_make(2, (int64_t[]){4, 3});
        ddl_tensor_t *yw = ddl_test_filled(DDL_F64, &w, 0.0);
        ASSERT_STATUS(ddl_all_sum_reduce_forward(a, x, yw), DDL_ESHAPE);
        ASSERT_TRUE(strstr(ddl_last_error(), "[4, 3]") != NULL);
        ddl_tensor_destroy(&yw);
    }
    ddl_tensor_destroy(&x);
    ddl_tensor_destroy(&y32);
    ddl_all_sum_reduce_destroy(&a);
    ddl_partition_destroy(&P);
}

int main(int argc, char **argv)
{
    ddl_test_mpi_init(&argc, &argv);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    int64_t live0 = ddl_alloc_bytes_live();
    test_invalid();
    test_layouts();
    test_shapes_and_chunks();
    ASSERT_EQ(ddl_alloc_bytes_live(), live0);  // every plan and tensor was freed
    if (ddl_test_rank == 0) {
        printf("all_sum_reduce: %s layouts ran on %d ranks\n",
               world_size >= 12 ? "all" : "the fitting", world_size);
    }
    return ddl_test_mpi_finalize();
}
