// Broadcast tests, over DistDL's layouts (tests/primitives/test_broadcast.py):
// overlapping, disjoint and disjoint-with-an-idle-rank partitions, single source,
// transposed variants, the group orders that deadlocked DistDL (its issue 87), and the
// sequential identity. For each layout and both dtypes:
//  - local shapes: S on members, zero-volume elsewhere;
//  - the adjoint test |<Bx, dy> - <x, B*dy>| / norms <= 1e-13 (f64) / 1e-5 (f32), with
//    y and dx pre-filled with garbage (forward and adjoint must overwrite);
//  - forward and adjoint allocate nothing;
//  - exact values: x = 1000(rank+1) + i gives each destination its source's values, and
//    the adjoint of such a dy sums, on each source, the values of its destinations.
//    Sources are computed here by hand from DistDL's rules, not by the library.
// Layouts that need more ranks than the world has are skipped; np 1 runs the
// sequential cases. Also: chunked messages, 0-d and empty shapes, invalid pairs and
// arguments (EINVAL on every rank), bad tensors (ESHAPE).
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
    // P_x position of the source of the P_y rank at coordinate c.
    int (*src_of)(const layout *L, const int *c);
};

// ---- sources by hand, from DistDL's broadcast rules --------------------------

// P_x == P_y: every rank is its own source.
static int src_self(const layout *L, const int *c)
{
    return (int)ddl_index_ravel(L->y_ndim, L->y_shape, c);
}

// A single source.
static int src_zero(const layout *L, const int *c)
{
    (void)L;
    (void)c;
    return 0;
}

// P_x [1, s...] -> P_y [n, s...]: destination (a, rest) <- source (0, rest).
static int src_drop_first(const layout *L, const int *c)
{
    return (int)ddl_index_ravel(L->y_ndim - 1, L->y_shape + 1, c + 1);
}

// P_x [2,2,1] -> P_y [2,2,3]: (a,b,k) <- (a,b,0).
static int src_ab_k(const layout *L, const int *c)
{
    (void)L;
    return c[0] * 2 + c[1];
}

// Transposed, P_y [3,2,2]: (k,a,b) <- (a,b,0) (DistDL's documented example).
static int src_k_ab(const layout *L, const int *c)
{
    (void)L;
    return c[1] * 2 + c[2];
}

// P_x [n,1] -> P_y [n,m]: (a,b) <- (a,0).
static int src_first(const layout *L, const int *c)
{
    (void)L;
    return c[0];
}

static const layout layouts[] = {
    {"sequential-identity", 1, 0, 1, {1}, 0, 1, {1}, false, false, src_self},
    {"identity-2x2", 4, 0, 2, {2, 2}, 0, 2, {2, 2}, false, false, src_self},
    {"overlap-3D-single_source", 3, 2, 1, {1}, 0, 3, {1, 1, 3}, false, false, src_zero},
    {"disjoint-3D-single_source", 4, 3, 1, {1}, 0, 3, {1, 1, 3}, false, false, src_zero},
    {"disjoint-inactive-3D-single_source", 5, 4, 1, {1}, 0, 3, {1, 1, 3}, false, false, src_zero},
    {"deadlock-2D", 4, 1, 2, {1, 2}, 0, 2, {2, 2}, false, false, src_drop_first},
    {"transpose_src-2D", 3, 0, 2, {1, 3}, 0, 2, {3, 1}, true, false, src_first},
    {"example-2x1-to-2x3", 6, 0, 2, {2, 1}, 0, 2, {2, 3}, false, false, src_first},
    {"deadlock-3D", 8, 2, 3, {1, 2, 2}, 0, 3, {2, 2, 2}, false, false, src_drop_first},
    {"overlap-3D", 12, 4, 3, {2, 2, 1}, 0, 3, {2, 2, 3}, false, false, src_ab_k},
    {"overlap-3D-transpose_src", 12, 4, 3, {2, 2, 1}, 0, 3, {3, 2, 2}, true, false, src_k_ab},
    {"overlap-3D-transpose_dest", 12, 4, 3, {2, 2, 1}, 0, 3, {3, 2, 2}, false, true, src_k_ab},
    {"overlap-3D-transpose_both", 12, 4, 3, {1, 2, 2}, 0, 3, {3, 2, 2}, true, true, src_k_ab},
    {"disjoint-3D", 16, 0, 3, {2, 2, 1}, 4, 3, {2, 2, 3}, false, false, src_ab_k},
    {"disjoint-3D-transpose_src", 16, 0, 3, {2, 2, 1}, 4, 3, {3, 2, 2}, true, false, src_k_ab},
    {"deadlock-4D", 16, 4, 4, {1, 2, 2, 2}, 0, 4, {2, 2, 2, 2}, false, false, src_drop_first},
    {"disjoint-inactive-3D", 17, 0, 3, {2, 2, 1}, 5, 3, {2, 2, 3}, false, false, src_ab_k},
    {"disjoint-inactive-3D-transpose_src", 17, 0, 3, {2, 2, 1}, 5, 3, {3, 2, 2}, true, false,
     src_k_ab},
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

// Runs layout L with local shape S in dtype dt: shapes, adjoint test, no allocation,
// exact values. Every rank of the world calls it.
static void run_layout(const layout *L, ddl_dtype dt, const ddl_shape *S)
{
    ddl_partition_t *Px = ddl_test_partition_range(L->x_first, L->x_ndim, L->x_shape);
    ddl_partition_t *Py = ddl_test_partition_range(L->y_first, L->y_ndim, L->y_shape);
    ddl_broadcast_t *b  = NULL;
    ASSERT_OK(ddl_broadcast_create(Px, Py, L->ts, L->td, dt, S, &b));
    ddl_shape xs = ddl_broadcast_x_shape(b), ys = ddl_broadcast_y_shape(b);
    bool      in_x = ddl_partition_active(Px), in_y = ddl_partition_active(Py);
    assert_local_shape(&xs, in_x, S);
    assert_local_shape(&ys, in_y, S);

    // Adjoint test; y and dx start as garbage that must be overwritten.
    ddl_tensor_t *x  = ddl_test_random(dt, &xs, 101);
    ddl_tensor_t *dy = ddl_test_random(dt, &ys, 202);
    ddl_tensor_t *y  = ddl_test_guarded(dt, &ys, 1e3);
    ddl_tensor_t *dx = ddl_test_guarded(dt, &xs, -1e3);
    uint64_t      a0 = ddl_alloc_count();
    ASSERT_OK(ddl_broadcast_forward(b, x, y));
    ASSERT_OK(ddl_broadcast_adjoint(b, dy, dx));
    ASSERT_EQ(ddl_alloc_count(), a0);
    double err = ddl_test_adjoint_error(MPI_COMM_WORLD, x, y, dy, dx);
    if (!(err <= ddl_test_adjoint_tol(dt))) {
        TEST_FAIL_("%s (%s): adjoint error %g", L->name, ddl_dtype_name(dt), err);
    }

    // Exact values: each destination gets its source's pattern.
    const int *xr = ddl_partition_ranks(Px), *yr = ddl_partition_ranks(Py);
    fill_pattern(x, ddl_test_rank);
    ASSERT_OK(ddl_broadcast_forward(b, x, y));
    if (in_y) {
        int src = L->src_of(L, ddl_partition_index(Py));
        for (int64_t i = 0; i < ddl_tensor_numel(y); i++) {
            ASSERT_NEAR(ddl_tensor_get(y, i), 1000.0 * (xr[src] + 1) + (double)i, 0.0);
        }
    }
    // Exact adjoint: each source receives the sum of its destinations' patterns.
    fill_pattern(dy, ddl_test_rank);
    ASSERT_OK(ddl_broadcast_adjoint(b, dy, dx));
    if (in_x) {
        int    me = ddl_partition_rank(Px), ndest = 0;
        double rsum = 0;
        for (int j = 0; j < ddl_partition_size(Py); j++) {
            int c[DDL_MAX_DIMS];
            ddl_index_unravel(L->y_ndim, L->y_shape, j, c);
            if (L->src_of(L, c) == me) {
                ndest++;
                rsum += 1000.0 * (yr[j] + 1);
            }
        }
        for (int64_t i = 0; i < ddl_tensor_numel(dx); i++) {
            ASSERT_NEAR(ddl_tensor_get(dx, i), rsum + (double)ndest * (double)i, 0.0);
        }
    }
    ddl_tensor_destroy(&x);
    ddl_test_free_guarded(&y);
    ddl_test_free_guarded(&dx);
    ddl_tensor_destroy(&dy);
    ddl_broadcast_destroy(&b);
    ASSERT_TRUE(b == NULL);
    ddl_broadcast_destroy(&b);  // NULL-safe
    ddl_partition_destroy(&Px);
    ddl_partition_destroy(&Py);
}

// ---- tests -------------------------------------------------------------------

static void test_layouts(void)
{
    ddl_shape S  = ddl_shape_make(3, (int64_t[]){1, 7, 5});  // DistDL's x_local_shape
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
        printf("broadcast: %d of %d layouts ran on %d ranks\n", ran, NLAYOUTS, world_size);
    }
}

// Messages split into chunks: 35 elements in chunks of 8 (4 full and one of 3).
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
    ASSERT_EQ(ddl__mpi_max_count(), old);
}

// Large messages (2 MiB, past every eager limit) on the layouts whose ranks root one
// group and receive in another: blocking collectives issued in the wrong order would
// deadlock here (the test then times out).
static void test_large(void)
{
    ddl_shape S = ddl_shape_make(2, (int64_t[]){256, 1024});
    for (int k = 0; k < NLAYOUTS; k++) {
        const layout *L = &layouts[k];
        if (L->world <= world_size && L->world <= 8 && L->x_first > 0 && L->y_first == 0) {
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
    ddl_broadcast_t *b  = NULL;
    ddl_shape        S  = ddl_shape_make(3, (int64_t[]){1, 7, 5});
    ddl_partition_t *P1 = ddl_test_partition_range(0, 1, (int[]){1});
    ddl_partition_t *P11 = ddl_test_partition_range(0, 2, (int[]){1, 1});
    // The source may not have more dimensions than the destination.
    ASSERT_STATUS(ddl_broadcast_create(P11, P1, false, false, DDL_F64, &S, &b), DDL_EINVAL);
    ASSERT_TRUE(strstr(ddl_last_error(), "dims") != NULL);
    ddl_shape bad = ddl_shape_make(2, (int64_t[]){3, -1});
    ASSERT_STATUS(ddl_broadcast_create(P1, P1, false, false, DDL_F64, &bad, &b), DDL_EINVAL);
    ASSERT_TRUE(strstr(ddl_last_error(), "-1") != NULL);
    bad.ndim = 9;
    ASSERT_STATUS(ddl_broadcast_create(P1, P1, false, false, DDL_F64, &bad, &b), DDL_EINVAL);
    ASSERT_STATUS(ddl_broadcast_create(P1, P1, false, false, (ddl_dtype)7, &S, &b), DDL_EINVAL);
    ASSERT_TRUE(strstr(ddl_last_error(), "7") != NULL);
    ASSERT_STATUS(ddl_broadcast_create(NULL, P1, false, false, DDL_F64, &S, &b), DDL_EINVAL);
    ASSERT_STATUS(ddl_broadcast_create(P1, P1, false, false, DDL_F64, NULL, &b), DDL_EINVAL);
    ASSERT_TRUE(b == NULL);
    if (world_size >= 3) {
        // DistDL's documented invalid pair: 1x3 -> 3x1 without a transpose flag.
        ddl_partition_t *P13 = ddl_test_partition_range(0, 2, (int[]){1, 3});
        ddl_partition_t *P31 = ddl_test_partition_range(0, 2, (int[]){3, 1});
        ASSERT_STATUS(ddl_broadcast_create(P13, P31, false, false, DDL_F64, &S, &b), DDL_EINVAL);
        ASSERT_TRUE(strstr(ddl_last_error(), "dimension") != NULL);
        ASSERT_TRUE(b == NULL);
        // ... valid with either flag.
        ASSERT_OK(ddl_broadcast_create(P13, P31, false, true, DDL_F64, &S, &b));
        ddl_broadcast_destroy(&b);
        ddl_partition_destroy(&P13);
        ddl_partition_destroy(&P31);
    }
    ddl_partition_destroy(&P1);
    ddl_partition_destroy(&P11);
}

// Bad tensors are refused before any communication. The plan is the identity on
// rank 0 (no communicator), so a refusal on some ranks cannot strand the others.
static void test_bad_tensors(void)
{
    ddl_shape        S = ddl_shape_make(2, (int64_t[]){2, 3});
    ddl_partition_t *P = ddl_test_partition_range(0, 1, (int[]){1});
    ddl_broadcast_t *b = NULL;
    ASSERT_OK(ddl_broadcast_create(P, P, false, false, DDL_F64, &S, &b));
    ddl_shape     xs = ddl_broadcast_x_shape(b);
    ddl_tensor_t *x = ddl_test_filled(DDL_F64, &xs, 1.0), *y = ddl_test_filled(DDL_F64, &xs, 0.0);
    ddl_tensor_t *y32 = ddl_test_filled(DDL_F32, &xs, 0.0);
    ASSERT_STATUS(ddl_broadcast_forward(b, x, y32), DDL_ESHAPE);
    ASSERT_STATUS(ddl_broadcast_adjoint(b, y32, x), DDL_ESHAPE);
    ASSERT_STATUS(ddl_broadcast_forward(b, x, NULL), DDL_EINVAL);
    if (ddl_partition_active(P)) {
        ddl_shape     w  = ddl_shape_make(2, (int64_t[]){3, 2});
        ddl_tensor_t *yw = ddl_test_filled(DDL_F64, &w, 0.0);
        ASSERT_STATUS(ddl_broadcast_forward(b, x, yw), DDL_ESHAPE);
        ASSERT_TRUE(strstr(ddl_last_error(), "[3, 2]") != NULL);
        ASSERT_TRUE(strstr(ddl_last_error(), "[2, 3]") != NULL);
        ASSERT_OK(ddl_broadcast_forward(b, x, x));  // in place: the root is its own destination
        ddl_tensor_destroy(&yw);
    }
    // The identity: a copy.
    ASSERT_OK(ddl_broadcast_forward(b, x, y));
    for (int64_t i = 0; i < ddl_tensor_numel(y); i++) {
        ASSERT_NEAR(ddl_tensor_get(y, i), 1.0, 0.0);
    }
    ddl_tensor_destroy(&x);
    ddl_tensor_destroy(&y);
    ddl_tensor_destroy(&y32);
    ddl_broadcast_destroy(&b);
    ddl_partition_destroy(&P);
}

// In place on the root that is also a destination (rank 0 of P_x = [1] -> P_y = all):
// forward and adjoint agree with the out-of-place results.
static void test_in_place(void)
{
    int ranks[64];
    for (int i = 0; i < world_size; i++) {
        ranks[i] = i;
    }
    ddl_partition_t *Px = NULL, *Py = NULL;
    ASSERT_OK(ddl_partition_create(MPI_COMM_WORLD, 1, ranks, 1, (int[]){1}, &Px));
    ASSERT_OK(ddl_partition_create(MPI_COMM_WORLD, world_size, ranks, 1, (int[]){world_size}, &Py));
    ddl_shape        S = ddl_shape_make(1, (int64_t[]){33});
    ddl_broadcast_t *b = NULL;
    ASSERT_OK(ddl_broadcast_create(Px, Py, false, false, DDL_F64, &S, &b));
    ddl_tensor_t *buf = ddl_test_filled(DDL_F64, &S, 0.0);
    for (int i = 0; i < 33; i++) {
        ddl_tensor_set(buf, i, ddl_test_rank == 0 ? i + 0.5 : -1.0);
    }
    ddl_shape     xs = ddl_broadcast_x_shape(b);
    ddl_tensor_t *x  = ddl_test_rank == 0 ? buf : ddl_test_filled(DDL_F64, &xs, 0.0);
    ASSERT_OK(ddl_broadcast_forward(b, x, buf));
    for (int i = 0; i < 33; i++) {
        ASSERT_EQ(ddl_tensor_get(buf, i), i + 0.5);
    }
    // Adjoint in place on the root: the sum of every rank's copy.
    ASSERT_OK(ddl_broadcast_adjoint(b, buf, x));
    if (ddl_test_rank == 0) {
        for (int i = 0; i < 33; i++) {
            ASSERT_EQ(ddl_tensor_get(buf, i), (i + 0.5) * world_size);
        }
    } else {
        ddl_tensor_destroy(&x);
    }
    ddl_tensor_destroy(&buf);
    ddl_broadcast_destroy(&b);
    ddl_partition_destroy(&Px);
    ddl_partition_destroy(&Py);
}

int main(int argc, char **argv)
{
    ddl_test_mpi_init(&argc, &argv);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    int64_t live0 = ddl_alloc_bytes_live();
    test_invalid();
    test_bad_tensors();
    test_layouts();
    test_odd_shapes();
    test_chunks();
    test_large();
    test_in_place();
    ASSERT_EQ(ddl_alloc_bytes_live(), live0);  // every plan and tensor was freed
    return ddl_test_mpi_finalize();
}
