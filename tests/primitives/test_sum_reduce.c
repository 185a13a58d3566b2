// SumReduce tests, over DistDL's layouts (tests/primitives/test_sum_reduce.py, the
// mirror of the broadcast ones): overlapping, disjoint and disjoint-with-an-idle-rank
// partitions, single destination, transposed variants (including DistributedLinear's
// P_w [2,3] -> P_y [1,2] with transpose_src) and the sequential identity. For each
// layout and both dtypes:
//  - local shapes: S on members, zero-volume elsewhere;
//  - the adjoint test (<= 1e-13 f64, <= 1e-5 f32), with y and dx pre-filled with
//    garbage (forward and adjoint overwrite);
//  - forward and adjoint allocate nothing;
//  - exact values: x = 1000(rank+1) + i sums onto each destination the patterns of the
//    sources that reduce into it; the adjoint gives each source its destination's dy.
//    Destinations are computed here by hand from DistDL's rules, not by the library;
//  - without transposition, R equals the adjoint of the Broadcast P_y -> P_x (and R*
//    its forward), which checks that the two primitives share their groups.
// Layouts needing more ranks than the world has are skipped; np 1 runs the sequential
// cases. Also: large messages in both group orders, chunked messages, invalid pairs.
#include <string.h>

#include "ddl/base.h"
#include "ddl/decomp.h"
#include "mpi_test.h"
#include "primitives/bcast_reduce.h"  // the chunk-limit test hook

static int world_size;

typedef struct layout layout;
struct layout {
    const char *name;
    int         world;  // ranks the layout needs
    int         x_first, x_ndim, x_shape[4];
    int         y_first, y_ndim, y_shape[4];
    bool        ts, td;
    // P_y position of the destination of the P_x rank at coordinate c.
    int (*dst_of)(const layout *L, const int *c);
};

// ---- destinations by hand, from DistDL's reduction rules ---------------------

static int dst_self(const layout *L, const int *c)
{
    return (int)ddl_index_ravel(L->x_ndim, L->x_shape, c);
}

static int dst_zero(const layout *L, const int *c)
{
    (void)L;
    (void)c;
    return 0;
}

// P_x [n, s...] -> P_y [1, s...]: (a, rest) -> (0, rest).
static int dst_drop_first(const layout *L, const int *c)
{
    return (int)ddl_index_ravel(L->x_ndim - 1, L->x_shape + 1, c + 1);
}

// (a, ...) -> position a: P_x [n,m] -> P_y [n,1]; transposed [3,1] -> [1,3] and
// DistributedLinear's [2,3] -> [1,2] ((r,c) -> (0,r)).
static int dst_first(const layout *L, const int *c)
{
    (void)L;
    return c[0];
}

// P_x [2,2,3] -> P_y [2,2,1] (or [1,2,2] with transpose_dest): (a,b,k) -> a*2+b.
static int dst_ab_k(const layout *L, const int *c)
{
    (void)L;
    return c[0] * 2 + c[1];
}

// P_x [3,2,2] with transpose_src -> P_y [2,2,1]: (k,a,b) -> (a,b).
static int dst_k_ab(const layout *L, const int *c)
{
    (void)L;
    return c[1] * 2 + c[2];
}

static const layout layouts[] = {
    {"sequential-identity", 1, 0, 1, {1}, 0, 1, {1}, false, false, dst_self},
    {"identity-2x2", 4, 0, 2, {2, 2}, 0, 2, {2, 2}, false, false, dst_self},
    {"overlap-3D-single_dest", 3, 0, 3, {1, 1, 3}, 2, 1, {1}, false, false, dst_zero},
    {"disjoint-3D-single_dest", 4, 0, 3, {1, 1, 3}, 3, 1, {1}, false, false, dst_zero},
    {"disjoint-inactive-3D-single_dest", 5, 0, 3, {1, 1, 3}, 4, 1, {1}, false, false, dst_zero},
    {"deadlock-2D", 4, 0, 2, {2, 2}, 1, 2, {1, 2}, false, false, dst_drop_first},
    {"transpose_src-2D", 3, 0, 2, {3, 1}, 0, 2, {1, 3}, true, false, dst_first},
    {"example-2x3-to-2x1", 6, 0, 2, {2, 3}, 0, 2, {2, 1}, false, false, dst_first},
    {"linear-weight-transpose_src", 8, 0, 2, {2, 3}, 6, 2, {1, 2}, true, false, dst_first},
    {"deadlock-3D", 8, 0, 3, {2, 2, 2}, 2, 3, {1, 2, 2}, false, false, dst_drop_first},
    {"overlap-3D", 12, 0, 3, {2, 2, 3}, 4, 3, {2, 2, 1}, false, false, dst_ab_k},
    {"overlap-3D-transpose_src", 12, 0, 3, {3, 2, 2}, 4, 3, {2, 2, 1}, true, false, dst_k_ab},
    {"overlap-3D-transpose_dest", 12, 0, 3, {2, 2, 3}, 4, 3, {1, 2, 2}, false, true, dst_ab_k},
    {"overlap-3D-transpose_both", 12, 0, 3, {3, 2, 2}, 4, 3, {1, 2, 2}, true, true, dst_k_ab},
    {"disjoint-3D", 16, 4, 3, {2, 2, 3}, 0, 3, {2, 2, 1}, false, false, dst_ab_k},
    {"disjoint-3D-transpose_src", 16, 4, 3, {3, 2, 2}, 0, 3, {2, 2, 1}, true, false, dst_k_ab},
    {"deadlock-4D", 16, 0, 4, {2, 2, 2, 2}, 4, 4, {1, 2, 2, 2}, false, false, dst_drop_first},
    {"disjoint-inactive-3D", 17, 5, 3, {2, 2, 3}, 0, 3, {2, 2, 1}, false, false, dst_ab_k},
    {"disjoint-inactive-3D-transpose_src", 17, 5, 3, {3, 2, 2}, 0, 3, {2, 2, 1}, true, false,
     dst_k_ab},
};
#define NLAYOUTS ((int)(sizeof layouts / sizeof layouts[0]))

// ---- helpers -----------------------------------------------------------------

// The value pattern of base rank r: 1000(r+1) + i (exact in f32 for these sizes).
static void fill_pattern(ddl_tensor_t *t, int r)
{
    for (int64_t i = 0; i < ddl_tensor_numel(t); i++) {
        ddl_tensor_set(t, i, 1000.0 * (r + 1) + (double)i);
    }
}

static void assert_local_shape(const ddl_shape *got, bool member, const ddl_shape *S)
{
    if (member) {
        ASSERT_TRUE(ddl_shape_equal(got, S));
    } else {
        ASSERT_EQ(ddl_shape_numel(got), 0);
        ASSERT_EQ(got->ndim, S->ndim > 0 ? S->ndim : 1);
    }
}

static void assert_close(const ddl_tensor_t *a, const ddl_tensor_t *b, double rtol)
{
    ASSERT_EQ(ddl_tensor_numel(a), ddl_tensor_numel(b));
    for (int64_t i = 0; i < ddl_tensor_numel(a); i++) {
        double u = ddl_tensor_get(a, i), v = ddl_tensor_get(b, i);
        ASSERT_NEAR(u, v, rtol * fabs(v));
    }
}

// Without transposition R is the adjoint of the Broadcast P_y -> P_x, and R* is that
// broadcast itself.
static void check_against_broadcast(const ddl_partition_t *Px, const ddl_partition_t *Py,
                                    const ddl_sum_reduce_t *r, ddl_dtype dt, const ddl_shape *S)
{
    ddl_broadcast_t *b = NULL;
    ASSERT_OK(ddl_broadcast_create(Py, Px, false, false, dt, S, &b));
    ddl_shape xs = ddl_sum_reduce_x_shape(r), ys = ddl_sum_reduce_y_shape(r);
    ddl_shape bx = ddl_broadcast_x_shape(b), by = ddl_broadcast_y_shape(b);
    ASSERT_TRUE(ddl_shape_equal(&xs, &by) && ddl_shape_equal(&ys, &bx));
    double        rtol = dt == DDL_F64 ? 1e-14 : 1e-6;
    ddl_tensor_t *x = ddl_test_random(dt, &xs, 303), *dy = ddl_test_random(dt, &ys, 404);
    ddl_tensor_t *y1 = ddl_test_filled(dt, &ys, 0), *y2 = ddl_test_filled(dt, &ys, 0);
    ddl_tensor_t *dx1 = ddl_test_filled(dt, &xs, 0), *dx2 = ddl_test_filled(dt, &xs, 0);
    ASSERT_OK(ddl_sum_reduce_forward(r, x, y1));
    ASSERT_OK(ddl_broadcast_adjoint(b, x, y2));
    assert_close(y1, y2, rtol);
    ASSERT_OK(ddl_sum_reduce_adjoint(r, dy, dx1));
    ASSERT_OK(ddl_broadcast_forward(b, dy, dx2));
    assert_close(dx1, dx2, 0.0);
    ddl_tensor_destroy(&x);
    ddl_tensor_destroy(&dy);
    ddl_tensor_destroy(&y1);
    ddl_tensor_destroy(&y2);
    ddl_tensor_destroy(&dx1);
    ddl_tensor_destroy(&dx2);
    ddl_broadcast_destroy(&b);
}

// Runs layout L with local shape S in dtype dt. Every rank of the world calls it.
static void run_layout(const layout *L, ddl_dtype dt, const ddl_shape *S)
{
    ddl_partition_t  *Px = ddl_test_partition_range(L->x_first, L->x_ndim, L->x_shape);
    ddl_partition_t  *Py = ddl_test_partition_range(L->y_first, L->y_ndim, L->y_shape);
    ddl_sum_reduce_t *r  = NULL;
    ASSERT_OK(ddl_sum_reduce_create(Px, Py, L->ts, L->td, dt, S, &r));
    ddl_shape xs = ddl_sum_reduce_x_shape(r), ys = ddl_sum_reduce_y_shape(r);
    bool      in_x = ddl_partition_active(Px), in_y = ddl_partition_active(Py);
    assert_local_shape(&xs, in_x, S);
    assert_local_shape(&ys, in_y, S);

    // Adjoint test; y and dx start as garbage that must be overwritten.
    ddl_tensor_t *x  = ddl_test_random(dt, &xs, 101);
    ddl_tensor_t *dy = ddl_test_random(dt, &ys, 202);
    ddl_tensor_t *y  = ddl_test_guarded(dt, &ys, 1e3);
    ddl_tensor_t *dx = ddl_test_guarded(dt, &xs, -1e3);
    uint64_t      a0 = ddl_alloc_count();
    ASSERT_OK(ddl_sum_reduce_forward(r, x, y));
    ASSERT_OK(ddl_sum_reduce_adjoint(r, dy, dx));
    ASSERT_EQ(ddl_alloc_count(), a0);
    double err = ddl_test_adjoint_error(MPI_COMM_WORLD, x, y, dy, dx);
    if (!(err <= ddl_test_adjoint_tol(dt))) {
        TEST_FAIL_("%s (%s): adjoint error %g", L->name, ddl_dtype_name(dt), err);
    }

    // Exact forward: each destination holds the sum of its sources' patterns.
    const int *xr = ddl_partition_ranks(Px), *yr = ddl_partition_ranks(Py);
    fill_pattern(x, ddl_test_rank);
    ASSERT_OK(ddl_sum_reduce_forward(r, x, y));
    if (in_y) {
        int    me = ddl_partition_rank(Py), nsrc = 0;
        double rsum = 0;
        for (int p = 0; p < ddl_partition_size(Px); p++) {
            int c[DDL_MAX_DIMS];
            ddl_index_unravel(L->x_ndim, L->x_shape, p, c);
            if (L->dst_of(L, c) == me) {
                nsrc++;
                rsum += 1000.0 * (xr[p] + 1);
            }
        }
        for (int64_t i = 0; i < ddl_tensor_numel(y); i++) {
            ASSERT_NEAR(ddl_tensor_get(y, i), rsum + (double)nsrc * (double)i, 0.0);
        }
    }
    // Exact adjoint: each source receives its destination's dy.
    fill_pattern(dy, ddl_test_rank);
    ASSERT_OK(ddl_sum_reduce_adjoint(r, dy, dx));
    if (in_x) {
        int dst = L->dst_of(L, ddl_partition_index(Px));
        for (int64_t i = 0; i < ddl_tensor_numel(dx); i++) {
            ASSERT_NEAR(ddl_tensor_get(dx, i), 1000.0 * (yr[dst] + 1) + (double)i, 0.0);
        }
    }
    if (!L->ts && !L->td) {
        check_against_broadcast(Px, Py, r, dt, S);
    }
    ddl_tensor_destroy(&x);
    ddl_test_free_guarded(&y);
    ddl_test_free_guarded(&dx);
    ddl_tensor_destroy(&dy);
    ddl_sum_reduce_destroy(&r);
    ASSERT_TRUE(r == NULL);
    ddl_sum_reduce_destroy(&r);  // NULL-safe
    ddl_partition_destroy(&Px);
    ddl_partition_destroy(&Py);
}

// ---- tests -------------------------------------------------------------------

static void test_layouts(void)
{
    ddl_shape S   = ddl_shape_make(3, (int64_t[]){1, 7, 5});  // DistDL's x_local_shape
    int       ran = 0;
    for (int k = 0; k < NLAYOUTS; k++) {
        if (layouts[k].world > world_size) {
            continue;
        }
        run_layout(&layouts[k], DDL_F64, &S);
        run_layout(&layouts[k], DDL_F32, &S);
        ran++;
    }
    if (ddl_test_rank == 0) {
        printf("sum_reduce: %d of %d layouts ran on %d ranks\n", ran, NLAYOUTS, world_size);
    }
}

// Messages split into chunks: 35 elements in chunks of 8.
static void test_chunks(void)
{
    ddl_shape S   = ddl_shape_make(3, (int64_t[]){1, 7, 5});
    int64_t   old = ddl__mpi_set_max_count(8);
    for (int k = 0; k < NLAYOUTS; k++) {
        if (layouts[k].world <= world_size && layouts[k].world >= 3) {
            run_layout(&layouts[k], DDL_F64, &S);
        }
    }
    ddl__mpi_set_max_count(old);
}

// Large messages (2 MiB, past the eager limits) where a rank roots one group and
// contributes to another: a wrong order of the blocking collectives deadlocks here.
static void test_large(void)
{
    ddl_shape S = ddl_shape_make(2, (int64_t[]){256, 1024});
    for (int k = 0; k < NLAYOUTS; k++) {
        const layout *L = &layouts[k];
        if (L->world <= world_size && L->world <= 8 && L->y_first > 0 && L->x_first == 0) {
            run_layout(L, DDL_F64, &S);
        }
    }
}

// A 0-d shape (one element; outsiders get shape [0]) and an empty shape.
static void test_odd_shapes(void)
{
    ddl_shape scalar = ddl_shape_make(0, NULL);
    ddl_shape empty  = ddl_shape_make(2, (int64_t[]){0, 5});
    for (int k = 0; k < NLAYOUTS; k++) {
        if (layouts[k].world <= world_size && layouts[k].world <= 5) {
            run_layout(&layouts[k], DDL_F64, &scalar);
            run_layout(&layouts[k], DDL_F32, &empty);
        }
    }
}

// Invalid plans are refused with EINVAL on every rank, without hanging.
static void test_invalid(void)
{
    ddl_sum_reduce_t *r   = NULL;
    ddl_shape         S   = ddl_shape_make(3, (int64_t[]){1, 7, 5});
    ddl_partition_t  *P1  = ddl_test_partition_range(0, 1, (int[]){1});
    ddl_partition_t  *P11 = ddl_test_partition_range(0, 2, (int[]){1, 1});
    // The destination may not have more dimensions than the source.
    ASSERT_STATUS(ddl_sum_reduce_create(P1, P11, false, false, DDL_F64, &S, &r), DDL_EINVAL);
    ASSERT_TRUE(strstr(ddl_last_error(), "dims") != NULL);
    ddl_shape bad = ddl_shape_make(2, (int64_t[]){-4, 1});
    ASSERT_STATUS(ddl_sum_reduce_create(P1, P1, false, false, DDL_F64, &bad, &r), DDL_EINVAL);
    ASSERT_TRUE(strstr(ddl_last_error(), "-4") != NULL);
    ASSERT_STATUS(ddl_sum_reduce_create(P1, P1, false, false, (ddl_dtype)5, &S, &r), DDL_EINVAL);
    ASSERT_STATUS(ddl_sum_reduce_create(P1, NULL, false, false, DDL_F64, &S, &r), DDL_EINVAL);
    ASSERT_STATUS(ddl_sum_reduce_create(P1, P1, false, false, DDL_F64, &S, NULL), DDL_EINVAL);
    ASSERT_TRUE(r == NULL);
    if (world_size >= 3) {
        // DistDL's documented invalid pair: 1x3 -> 3x1 without a transpose flag.
        ddl_partition_t *P13 = ddl_test_partition_range(0, 2, (int[]){1, 3});
        ddl_partition_t *P31 = ddl_test_partition_range(0, 2, (int[]){3, 1});
        ASSERT_STATUS(ddl_sum_reduce_create(P13, P31, false, false, DDL_F64, &S, &r), DDL_EINVAL);
        ASSERT_TRUE(strstr(ddl_last_error(), "dimension") != NULL);
        ASSERT_TRUE(r == NULL);
        // 3x3x2 -> 1x1x3 is invalid too (DistDL's docs).
        if (world_size >= 18) {
            ddl_partition_t *P332 = ddl_test_partition_range(0, 3, (int[]){3, 3, 2});
            ddl_partition_t *P113 = ddl_test_partition_range(0, 3, (int[]){1, 1, 3});
            ASSERT_STATUS(ddl_sum_reduce_create(P332, P113, false, false, DDL_F64, &S, &r),
                          DDL_EINVAL);
            ddl_partition_destroy(&P332);
            ddl_partition_destroy(&P113);
        }
        // ... valid with either flag.
        ASSERT_OK(ddl_sum_reduce_create(P13, P31, true, false, DDL_F64, &S, &r));
        ddl_sum_reduce_destroy(&r);
        ddl_partition_destroy(&P13);
        ddl_partition_destroy(&P31);
    }
    ddl_partition_destroy(&P1);
    ddl_partition_destroy(&P11);
}

int main(int argc, char **argv)
{
    ddl_test_mpi_init(&argc, &argv);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    int64_t live0 = ddl_alloc_bytes_live();
    test_invalid();
    test_layouts();
    test_odd_shapes();
    test_chunks();
    test_large();
    ASSERT_EQ(ddl_alloc_bytes_live(), live0);  // every plan and tensor was freed
    return ddl_test_mpi_finalize();
}
