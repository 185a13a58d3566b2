// Repartition tests: DistDL's test_repartition.py layouts (overlap, disjoint,
// disjoint-inactive, scatter, gather, identity, dtype) and smaller ones for small
// worlds, each in f64 and f32, with balanced and unbalanced input. Every case checks
//  - where values land: x holds each element's global flat index, and y must then
//    hold the indices of the balanced P_y decomposition, exactly;
//  - that the adjoint is the inverse: adjoint(forward(x)) == x bit for bit;
//  - the adjoint (dot-product) test on random data;
//  - that forward and adjoint allocate nothing.
// Plus: the refusals (partition/tensor dims, split dims of size 1, a wrong local shape
// on one rank), the identity shortcut, scatter-then-gather, and DistDL's buffer example.
#include <string.h>

#include "ddl/base.h"
#include "mpi_test.h"

static int world;

// ---- helpers --------------------------------------------------------------------

// The unbalanced extents used by the tests along a dim of n elements over p pieces:
// DistDL's test (the quotient everywhere, the remainder on coordinate 0), and when
// that happens to be balanced, one element moved from the last coordinate to the first.
static void unbalanced_extents(int64_t n, int p, int64_t *ext)
{
    bool same = true;
    for (int c = 0; c < p; c++) {
        ext[c] = n / p + (c == 0 ? n % p : 0);
        same   = same && ext[c] == ddl_decomp_size(n, p, c);
    }
    if (same && p > 1 && ext[p - 1] > 0) {
        ext[0]++;
        ext[p - 1]--;
    }
}

// The global box of this rank's input piece (empty outside P_x).
static ddl_box input_box(const ddl_partition_t *Px, const ddl_shape *g, bool balanced)
{
    if (balanced || !ddl_partition_active(Px)) {
        return ddl_partition_local_box(Px, g);
    }
    const int *ps = ddl_partition_shape(Px), *idx = ddl_partition_index(Px);
    ddl_box    b  = {.ndim = g->ndim};
    for (int d = 0; d < g->ndim; d++) {
        int64_t ext[64];
        unbalanced_extents(g->d[d], ps[d], ext);
        b.start[d] = 0;
        for (int c = 0; c < idx[d]; c++) {
            b.start[d] += ext[c];
        }
        b.stop[d] = b.start[d] + ext[idx[d]];
    }
    return b;
}

// True when the unbalanced extents of P differ from the balanced ones somewhere.
static bool unbalanced_differs(const ddl_partition_t *P, const ddl_shape *g)
{
    const int *ps = ddl_partition_shape(P);
    for (int d = 0; d < g->ndim; d++) {
        int64_t ext[64];
        unbalanced_extents(g->d[d], ps[d], ext);
        for (int c = 0; c < ps[d]; c++) {
            if (ext[c] != ddl_decomp_size(g->d[d], ps[d], c)) {
                return true;
            }
        }
    }
    return false;
}

// Global row-major flat index of local element i of the piece at global box b.
static int64_t global_flat(const ddl_box *b, const ddl_shape *g, int64_t i)
{
    ddl_shape s = ddl_box_shape(b);
    int64_t   f = 0, rem = i, coord[DDL_MAX_DIMS];
    for (int d = s.ndim - 1; d >= 0; d--) {
        coord[d] = rem % s.d[d];
        rem /= s.d[d];
    }
    for (int d = 0; d < g->ndim; d++) {
        f = f * g->d[d] + b->start[d] + coord[d];
    }
    return f;
}

static void fill_index(ddl_tensor_t *t, const ddl_box *b, const ddl_shape *g)
{
    for (int64_t i = 0; i < ddl_tensor_numel(t); i++) {
        ddl_tensor_set(t, i, (double)global_flat(b, g, i));
    }
}

static void fill_value(ddl_tensor_t *t, double v)
{
    for (int64_t i = 0; i < ddl_tensor_numel(t); i++) {
        ddl_tensor_set(t, i, v);
    }
}

static void check_index(const ddl_tensor_t *t, const ddl_box *b, const ddl_shape *g)
{
    for (int64_t i = 0; i < ddl_tensor_numel(t); i++) {
        int64_t want = global_flat(b, g, i);
        if (ddl_tensor_get(t, i) != (double)want) {
            TEST_FAIL_("element %lld holds %.17g, expected global index %lld", (long long)i,
                       ddl_tensor_get(t, i), (long long)want);
        }
    }
}

static ddl_tensor_t *tensor_of(ddl_dtype dt, const ddl_shape *s)
{
    ddl_tensor_t *t = NULL;
    ASSERT_OK(ddl_tensor_create(dt, s, &t));
    return t;
}

static void assert_same_bytes(const ddl_tensor_t *a, const ddl_tensor_t *b)
{
    ASSERT_TRUE(ddl_shape_equal(&a->shape, &b->shape));
    ASSERT_TRUE(ddl_tensor_bytes(a) == 0 || memcmp(a->data, b->data, ddl_tensor_bytes(a)) == 0);
}

static void assert_error_mentions(const char *what)
{
    if (strstr(ddl_last_error(), what) == NULL) {
        TEST_FAIL_("error message \"%s\" does not mention \"%s\"", ddl_last_error(), what);
    }
}

// ---- the layout cases ----------------------------------------------------------

typedef struct layout {
    const char *name;
    int         need;  // world size it needs
    int         ndim;
    int64_t     global[DDL_MAX_DIMS];
    int         x_first, x_shape[DDL_MAX_DIMS];
    int         y_first, y_shape[DDL_MAX_DIMS];
} layout;

static const layout layouts[] = {
    // DistDL's parametrised cases (tests/primitives/test_repartition.py).
    {"distributed-overlap", 12, 2, {77, 55}, 4, {4, 1}, 0, {3, 4}},
    {"distributed-disjoint", 16, 2, {77, 55}, 0, {4, 1}, 4, {3, 4}},
    {"distributed-disjoint-inactive", 17, 2, {77, 55}, 0, {4, 1}, 5, {3, 4}},
    {"sequential-identity", 1, 2, {77, 55}, 0, {1, 1}, 0, {1, 1}},
    {"as_scatter-overlap", 12, 2, {77, 55}, 4, {1, 1}, 0, {3, 4}},
    {"as_scatter-disjoint", 13, 2, {77, 55}, 0, {1, 1}, 1, {3, 4}},
    {"as_scatter-disjoint-inactive", 14, 2, {77, 55}, 0, {1, 1}, 2, {3, 4}},
    {"as_gather-overlap", 12, 2, {77, 55}, 0, {3, 4}, 4, {1, 1}},
    {"as_gather-disjoint", 13, 2, {77, 55}, 1, {3, 4}, 0, {1, 1}},
    {"as_gather-disjoint-inactive", 14, 2, {77, 55}, 2, {3, 4}, 0, {1, 1}},
    {"dtype", 4, 2, {77, 55}, 0, {4, 1}, 0, {2, 2}},
    {"identity-2D", 12, 2, {77, 55}, 0, {3, 4}, 0, {3, 4}},
    {"identity-1D", 4, 2, {77, 55}, 0, {1, 4}, 0, {1, 4}},
    // Smaller layouts of the same kinds, for worlds of 4 and 13.
    {"small-general", 4, 2, {77, 55}, 0, {2, 1}, 0, {2, 2}},
    {"small-scatter", 4, 2, {77, 55}, 0, {1, 1}, 0, {2, 2}},
    {"small-gather", 4, 2, {77, 55}, 0, {2, 2}, 3, {1, 1}},
    {"small-disjoint", 4, 2, {77, 55}, 0, {2, 1}, 2, {1, 2}},
    {"small-scatter-disjoint-inactive", 4, 2, {77, 55}, 0, {1, 1}, 2, {1, 2}},
    {"small-gather-disjoint-inactive", 4, 2, {77, 55}, 2, {1, 2}, 0, {1, 1}},
    {"leading-dims-only", 4, 2, {77, 55}, 0, {4, 1}, 1, {3, 1}},
    {"zero-volume-pieces", 4, 2, {2, 9}, 0, {2, 1}, 1, {3, 1}},
    {"3d", 4, 3, {9, 10, 11}, 0, {1, 2, 2}, 1, {3, 1, 1}},
    {"4d", 4, 4, {6, 7, 5, 4}, 0, {2, 1, 2, 1}, 0, {1, 2, 1, 2}},
    {"general-disjoint-inactive", 13, 2, {77, 55}, 0, {4, 1}, 5, {2, 4}},
    {"4d-disjoint", 13, 4, {6, 7, 5, 4}, 1, {2, 3, 2, 1}, 0, {1, 1, 2, 2}},
};

static ddl_partition_t *layout_px(const layout *L)
{
    return ddl_test_partition_range(L->x_first, L->ndim, L->x_shape);
}

static ddl_partition_t *layout_py(const layout *L)
{
    return ddl_test_partition_range(L->y_first, L->ndim, L->y_shape);
}

static void run_case(const layout *L, ddl_dtype dt, bool balanced)
{
    ddl_partition_t *Px = layout_px(L), *Py = layout_py(L);
    ddl_shape        g  = ddl_shape_make(L->ndim, L->global);
    ddl_box          xb = input_box(Px, &g, balanced);
    ddl_box          yb = ddl_partition_local_box(Py, &g);
    ddl_shape        xs = ddl_box_shape(&xb), ys = ddl_box_shape(&yb);

    ddl_repartition_t *T = NULL;
    ASSERT_OK(ddl_repartition_create(Px, Py, dt, &g, balanced ? NULL : &xs, &T));
    ddl_shape px = ddl_repartition_x_shape(T), py = ddl_repartition_y_shape(T);
    ASSERT_TRUE(ddl_shape_equal(&px, &xs));
    ASSERT_TRUE(ddl_shape_equal(&py, &ys));
    bool member = ddl_partition_active(Px) || ddl_partition_active(Py);
    bool ident  = ddl_partition_equal(Px, Py) && (balanced || !unbalanced_differs(Px, &g));
    // An inactive plan moves nothing; members agree on whether any rank sends.
    ASSERT_EQ(ddl_repartition_is_local(T), member ? ident : true);

    // Where values land, and the exact inverse.
    ddl_tensor_t *x = tensor_of(dt, &xs), *y = tensor_of(dt, &ys), *dx = tensor_of(dt, &xs);
    fill_index(x, &xb, &g);
    fill_value(y, -1.0);
    fill_value(dx, -1.0);
    uint64_t allocs = ddl_alloc_count();
    ASSERT_OK(ddl_repartition_forward(T, x, y));
    ASSERT_OK(ddl_repartition_adjoint(T, y, dx));
    ASSERT_EQ(ddl_alloc_count(), allocs);
    check_index(y, &yb, &g);
    assert_same_bytes(dx, x);

    // The adjoint test on random data (forward overwrites y, adjoint overwrites dx).
    ddl_tensor_t *xr = ddl_test_random(dt, &xs, 11), *dyr = ddl_test_random(dt, &ys, 12);
    fill_value(y, 7.0);
    fill_value(dx, 7.0);
    allocs = ddl_alloc_count();
    ASSERT_OK(ddl_repartition_forward(T, xr, y));
    ASSERT_OK(ddl_repartition_adjoint(T, dyr, dx));
    ASSERT_EQ(ddl_alloc_count(), allocs);
    double err = ddl_test_adjoint_error(MPI_COMM_WORLD, xr, y, dyr, dx);
    if (!(err <= ddl_test_adjoint_tol(dt))) {
        TEST_FAIL_("%s %s %s: adjoint error %g", L->name, ddl_dtype_name(dt),
                   balanced ? "balanced" : "unbalanced", err);
    }

    ddl_tensor_destroy(&xr);
    ddl_tensor_destroy(&dyr);
    ddl_tensor_destroy(&x);
    ddl_tensor_destroy(&y);
    ddl_tensor_destroy(&dx);
    ddl_repartition_destroy(&T);
    ASSERT_TRUE(T == NULL);
    ddl_partition_destroy(&Px);
    ddl_partition_destroy(&Py);
}

static void test_layouts(void)
{
    int ran = 0;
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
        if (layouts[i].need > world) {
            continue;
        }
        for (int b = 0; b < 2; b++) {
            run_case(&layouts[i], DDL_F64, b == 0);
            run_case(&layouts[i], DDL_F32, b == 0);
        }
        ran++;
    }
    if (ddl_test_rank == 0) {
        fprintf(stderr, "repartition: %d layouts x {f64, f32} x {balanced, unbalanced}\n", ran);
    }
}

// ---- refusals --------------------------------------------------------------------

// Rule violations are refused with EINVAL on every rank, member or not.
static void test_refusals(void)
{
    ddl_repartition_t *T  = NULL;
    ddl_partition_t   *Px = NULL, *Py = NULL;
    ddl_shape          g3 = ddl_shape_make(3, (int64_t[]){16, 5, 5});
    ddl_shape          g2 = ddl_shape_make(2, (int64_t[]){4, 4});
    if (world >= 4) {
        // DistDL test_excepts_mismatched_input_partition_tensor.
        Px = ddl_test_partition_range(0, 4, (int[]){1, 4, 1, 1});
        Py = ddl_test_partition_range(world - 2, 4, (int[]){1, 1, 1, 2});
        ASSERT_STATUS(ddl_repartition_create(Px, Py, DDL_F64, &g3, NULL, &T), DDL_EINVAL);
        assert_error_mentions("P_x has 4 dims, tensor has 3");
        ddl_partition_destroy(&Px);
        // test_excepts_mismatched_output_partition_tensor.
        Px = ddl_test_partition_range(0, 3, (int[]){4, 1, 1});
        ASSERT_STATUS(ddl_repartition_create(Px, Py, DDL_F64, &g3, NULL, &T), DDL_EINVAL);
        assert_error_mentions("P_x has 3 dims but P_y has 4");
        ddl_partition_destroy(&Px);
        // test_excepts_mismatched_nondivisible_tensor: P_y splits a dim of size 1.
        Px               = ddl_test_partition_range(0, 4, (int[]){1, 4, 1, 1});
        ddl_shape g_one  = ddl_shape_make(4, (int64_t[]){1, 16, 5, 1});
        ASSERT_STATUS(ddl_repartition_create(Px, Py, DDL_F64, &g_one, NULL, &T), DDL_EINVAL);
        assert_error_mentions("P_y splits dim 3 of global size 1");
        ddl_partition_destroy(&Px);
        ddl_partition_destroy(&Py);
        // test_excepts_mismatched_partitions: P_x and P_y of different dims.
        Px = ddl_test_partition_range(0, 4, (int[]){1, 4, 1, 1});
        Py = ddl_test_partition_range(world - 2, 2, (int[]){1, 2});
        ASSERT_STATUS(ddl_repartition_create(Px, Py, DDL_F64, &g2, NULL, &T), DDL_EINVAL);
        assert_error_mentions("P_x has 4 dims but P_y has 2");
        ddl_partition_destroy(&Px);
        ddl_partition_destroy(&Py);
        // P_x splits a dim of size 1.
        Px              = ddl_test_partition_range(0, 2, (int[]){2, 1});
        Py              = ddl_test_partition_range(2, 2, (int[]){1, 2});
        ddl_shape g_row = ddl_shape_make(2, (int64_t[]){1, 5});
        ASSERT_STATUS(ddl_repartition_create(Px, Py, DDL_F64, &g_row, NULL, &T), DDL_EINVAL);
        assert_error_mentions("P_x splits dim 0 of global size 1 over 2 ranks");
        ddl_partition_destroy(&Px);
        ddl_partition_destroy(&Py);
    }
    // One rank suffices for these.
    Px = ddl_test_partition_range(0, 3, (int[]){1, 1, 1});
    Py = ddl_test_partition_range(0, 3, (int[]){1, 1, 1});
    ASSERT_STATUS(ddl_repartition_create(Px, Py, DDL_F64, &g2, NULL, &T), DDL_EINVAL);
    assert_error_mentions("P_x has 3 dims, tensor has 2");
    ASSERT_STATUS(ddl_repartition_create(Px, Py, (ddl_dtype)7, &g3, NULL, &T), DDL_EINVAL);
    assert_error_mentions("dtype 7");
    ASSERT_STATUS(ddl_repartition_create(Px, Py, DDL_F64, NULL, NULL, &T), DDL_EINVAL);
    ASSERT_TRUE(T == NULL);
    ddl_partition_destroy(&Px);
    ddl_partition_destroy(&Py);
}

// Unbalanced input whose local shapes are wrong on ONE rank: every rank of the union
// (here the whole world) fails with ESHAPE, and nothing hangs.
static void test_bad_local_shape(void)
{
    // P_x covers the world as [a, b]; P_y is one rank.
    int a = world >= 12 ? 4 : (world >= 4 ? 2 : 1);
    int b = world >= 12 ? 3 : (world >= 4 ? 2 : 1);
    ddl_partition_t *Px = ddl_test_partition_range(0, 2, (int[]){a, b});
    ddl_partition_t *Py = ddl_test_partition_range(world - 1, 2, (int[]){1, 1});
    ddl_shape        g  = ddl_shape_make(2, (int64_t[]){23, 17});
    ddl_shape        xs = ddl_partition_local_shape(Px, &g);
    int              bad = a * b - 1;  // the last member of P_x
    ddl_repartition_t *T = NULL;
    if (ddl_test_rank >= a * b && ddl_test_rank != world - 1) {
        // Outside the union (only in worlds other than 1, 4, 12, 13): no part in it.
        ddl_partition_destroy(&Px);
        ddl_partition_destroy(&Py);
        return;
    }

    // A sanity run: the correct shapes are accepted.
    ASSERT_OK(ddl_repartition_create(Px, Py, DDL_F64, &g, &xs, &T));
    ddl_repartition_destroy(&T);

    // 1. One rank's extent disagrees with its row (or, on one rank, the sum is off).
    ddl_shape wrong = xs;
    if (ddl_test_rank == bad) {
        wrong.d[1] += 1;
    }
    ASSERT_STATUS(ddl_repartition_create(Px, Py, DDL_F64, &g, &wrong, &T), DDL_ESHAPE);
    ASSERT_TRUE(T == NULL);
    assert_error_mentions(a * b > 1 ? "do not form a grid" : "sum to 18");

    // 2. A consistent grid whose extents do not add up to the global shape.
    ddl_shape bigger = xs;
    bigger.d[0] += 1;
    ASSERT_STATUS(ddl_repartition_create(Px, Py, DDL_F64, &g, &bigger, &T), DDL_ESHAPE);
    assert_error_mentions("along dim 0 sum to");

    // 3. One rank's local shape has the wrong number of dims.
    ddl_shape flat = xs;
    if (ddl_test_rank == bad) {
        flat = ddl_shape_make(1, (int64_t[]){xs.d[0] * xs.d[1]});
    }
    ASSERT_STATUS(ddl_repartition_create(Px, Py, DDL_F64, &g, &flat, &T), DDL_ESHAPE);
    assert_error_mentions("passed a local shape");

    // 4. One rank says balanced (NULL) while the others give shapes.
    if (world > 1) {
        const ddl_shape *xl = ddl_test_rank == bad ? NULL : &xs;
        ASSERT_STATUS(ddl_repartition_create(Px, Py, DDL_F64, &g, xl, &T), DDL_EINVAL);
        assert_error_mentions("x_local is given on some ranks");
    }

    // Nothing was left behind: the next creation works.
    ASSERT_OK(ddl_repartition_create(Px, Py, DDL_F32, &g, &xs, &T));
    ddl_repartition_destroy(&T);
    ddl_partition_destroy(&Px);
    ddl_partition_destroy(&Py);
}

// Tensors of the wrong shape or dtype are refused before any message is posted.
static void test_bad_tensors(void)
{
    int              n  = world >= 4 ? 4 : 1;
    ddl_partition_t *Px = ddl_test_partition_range(0, 2, (int[]){n, 1});
    ddl_partition_t *Py = ddl_test_partition_range(0, 2, (int[]){1, n});
    ddl_shape        g  = ddl_shape_make(2, (int64_t[]){77, 55});
    ddl_repartition_t *T = NULL;
    ASSERT_OK(ddl_repartition_create(Px, Py, DDL_F64, &g, NULL, &T));
    ddl_shape     xs = ddl_repartition_x_shape(T), ys = ddl_repartition_y_shape(T);
    ddl_shape     one = ddl_shape_make(2, (int64_t[]){1, 1});
    ddl_tensor_t *x = tensor_of(DDL_F64, &xs), *y = tensor_of(DDL_F64, &ys);
    ddl_tensor_t *w = tensor_of(DDL_F64, &one), *x32 = tensor_of(DDL_F32, &xs);
    ASSERT_STATUS(ddl_repartition_forward(T, w, y), DDL_ESHAPE);
    assert_error_mentions("x has shape [1, 1]");
    ASSERT_STATUS(ddl_repartition_adjoint(T, w, x), DDL_ESHAPE);
    ASSERT_STATUS(ddl_repartition_forward(T, x32, y), DDL_EINVAL);
    assert_error_mentions("x is f32, the plan is f64");
    ddl_tensor_destroy(&x);
    ddl_tensor_destroy(&y);
    ddl_tensor_destroy(&w);
    ddl_tensor_destroy(&x32);
    ddl_repartition_destroy(&T);
    ddl_partition_destroy(&Px);
    ddl_partition_destroy(&Py);
}

// ---- identity, scatter/gather, DistDL's buffer example ---------------------------

// P_x == P_y with balanced input: local copies only (DistDL issue 232). Two separately
// created but equal partitions; the copy is exact; and since the plan makes no MPI
// call, rank 0 may run it alone.
static void test_identity(void)
{
    int shape[2] = {1, 1};
    if (world >= 12) {
        shape[0] = 3;
        shape[1] = 4;
    } else if (world >= 4) {
        shape[1] = 4;
    }
    ddl_partition_t *Px = ddl_test_partition_range(0, 2, shape);
    ddl_partition_t *Py = ddl_test_partition_range(0, 2, shape);
    ASSERT_TRUE(ddl_partition_equal(Px, Py));
    ddl_shape g = ddl_shape_make(2, (int64_t[]){77, 55});
    for (int k = 0; k < 2; k++) {
        ddl_dtype          dt = k == 0 ? DDL_F64 : DDL_F32;
        ddl_repartition_t *T  = NULL;
        ASSERT_OK(ddl_repartition_create(Px, Py, dt, &g, NULL, &T));
        ASSERT_TRUE(ddl_repartition_is_local(T));
        ddl_shape xs = ddl_repartition_x_shape(T), ys = ddl_repartition_y_shape(T);
        ASSERT_TRUE(ddl_shape_equal(&xs, &ys));
        ddl_tensor_t *x = ddl_test_random(dt, &xs, 5), *y = tensor_of(dt, &ys);
        ddl_tensor_t *dx = tensor_of(dt, &xs);
        uint64_t      allocs = ddl_alloc_count();
        ASSERT_OK(ddl_repartition_forward(T, x, y));
        assert_same_bytes(y, x);
        ASSERT_OK(ddl_repartition_adjoint(T, y, dx));
        assert_same_bytes(dx, x);
        if (ddl_test_rank == 0) {
            for (int i = 0; i < 3; i++) {
                ASSERT_OK(ddl_repartition_forward(T, x, y));
                ASSERT_OK(ddl_repartition_adjoint(T, y, dx));
            }
        }
        ASSERT_EQ(ddl_alloc_count(), allocs);
        MPI_Barrier(MPI_COMM_WORLD);
        ddl_tensor_destroy(&x);
        ddl_tensor_destroy(&y);
        ddl_tensor_destroy(&dx);
        ddl_repartition_destroy(&T);
    }
    ddl_partition_destroy(&Px);
    ddl_partition_destroy(&Py);
}

// Scatter a global tensor from rank 0, gather it onto the last rank: bit for bit.
static void test_scatter_gather(void)
{
    int shape[2] = {1, 1};
    if (world >= 12) {
        shape[0] = 3;
        shape[1] = 4;
    } else if (world >= 4) {
        shape[0] = 2;
        shape[1] = 2;
    }
    ddl_partition_t *Proot = ddl_test_partition_range(0, 2, (int[]){1, 1});
    ddl_partition_t *Pdst  = ddl_test_partition_range(world - 1, 2, (int[]){1, 1});
    ddl_partition_t *Pmid  = ddl_test_partition_range(0, 2, shape);
    ddl_shape        g     = ddl_shape_make(2, (int64_t[]){77, 55});
    for (int k = 0; k < 2; k++) {
        ddl_dtype          dt = k == 0 ? DDL_F64 : DDL_F32;
        ddl_repartition_t *S = NULL, *G = NULL;
        ASSERT_OK(ddl_repartition_create(Proot, Pmid, dt, &g, NULL, &S));
        ASSERT_OK(ddl_repartition_create(Pmid, Pdst, dt, &g, NULL, &G));
        ddl_shape xs = ddl_repartition_x_shape(S), ms = ddl_repartition_y_shape(S);
        ddl_shape gs = ddl_repartition_y_shape(G);
        ddl_tensor_t *x = tensor_of(dt, &xs), *m = tensor_of(dt, &ms), *z = tensor_of(dt, &gs);
        ddl_tensor_t *ref = tensor_of(dt, &gs);
        ddl_tensor_fill_uniform(x, 99, 0);    // the global tensor, on rank 0
        ddl_tensor_fill_uniform(ref, 99, 0);  // the same values, on the last rank
        ASSERT_OK(ddl_repartition_forward(S, x, m));
        ASSERT_OK(ddl_repartition_forward(G, m, z));
        assert_same_bytes(z, ref);
        ddl_tensor_destroy(&x);
        ddl_tensor_destroy(&m);
        ddl_tensor_destroy(&z);
        ddl_tensor_destroy(&ref);
        ddl_repartition_destroy(&S);
        ddl_repartition_destroy(&G);
    }
    ddl_partition_destroy(&Proot);
    ddl_partition_destroy(&Pdst);
    ddl_partition_destroy(&Pmid);
}

// DistDL tests/test_buffer.py: [1,10] on [1,1] -> [1,4] gives 3,3,2,2; then
// [1,4] -> [1,3] on ranks 1..3 gives 4,3,3 and rank 0 holds nothing.
static void test_buffer_example(void)
{
    if (world < 4) {
        return;
    }
    ddl_partition_t *P1 = ddl_test_partition_range(0, 2, (int[]){1, 1});
    ddl_partition_t *P4 = ddl_test_partition_range(0, 2, (int[]){1, 4});
    ddl_partition_t *P3 = ddl_test_partition_range(1, 2, (int[]){1, 3});
    ddl_shape        g  = ddl_shape_make(2, (int64_t[]){1, 10});
    ddl_repartition_t *A = NULL, *B = NULL;
    ASSERT_OK(ddl_repartition_create(P1, P4, DDL_F64, &g, NULL, &A));
    ASSERT_OK(ddl_repartition_create(P4, P3, DDL_F64, &g, NULL, &B));
    const int64_t a_len[] = {3, 3, 2, 2}, b_len[] = {0, 4, 3, 3};
    ddl_shape     as = ddl_repartition_y_shape(A), bs = ddl_repartition_y_shape(B);
    if (ddl_test_rank < 4) {
        ASSERT_EQ(as.d[0], 1);
        ASSERT_EQ(as.d[1], a_len[ddl_test_rank]);
        ASSERT_EQ(ddl_shape_numel(&bs), ddl_test_rank == 0 ? 0 : b_len[ddl_test_rank]);
        if (ddl_test_rank > 0) {
            ASSERT_EQ(bs.d[1], b_len[ddl_test_rank]);
        }
    }
    ddl_shape     xs = ddl_repartition_x_shape(A);
    ddl_tensor_t *x = tensor_of(DDL_F64, &xs), *m = tensor_of(DDL_F64, &as);
    ddl_tensor_t *y = tensor_of(DDL_F64, &bs);
    ddl_box       xb = ddl_partition_local_box(P1, &g), yb = ddl_partition_local_box(P3, &g);
    fill_index(x, &xb, &g);
    ASSERT_OK(ddl_repartition_forward(A, x, m));
    ASSERT_OK(ddl_repartition_forward(B, m, y));
    check_index(y, &yb, &g);
    ddl_tensor_destroy(&x);
    ddl_tensor_destroy(&m);
    ddl_tensor_destroy(&y);
    ddl_repartition_destroy(&A);
    ddl_repartition_destroy(&B);
    ddl_partition_destroy(&P1);
    ddl_partition_destroy(&P4);
    ddl_partition_destroy(&P3);
}

// Plans free what they create: many create/destroy cycles exhaust neither MPI's
// communicator ids nor memory.
static void test_no_leak(void)
{
    int              n  = world >= 4 ? 4 : 1;
    ddl_partition_t *Px = ddl_test_partition_range(0, 2, (int[]){n, 1});
    ddl_partition_t *Py = ddl_test_partition_range(0, 2, (int[]){1, n});
    ddl_shape        g  = ddl_shape_make(2, (int64_t[]){9, 8});
    ddl_shape        xs = ddl_partition_local_shape(Px, &g);
    int64_t          live = ddl_alloc_bytes_live();
    for (int i = 0; i < 3000; i++) {
        ddl_repartition_t *T = NULL;
        ASSERT_OK(ddl_repartition_create(Px, Py, DDL_F32, &g, (i % 2) ? &xs : NULL, &T));
        ddl_repartition_destroy(&T);
    }
    ASSERT_EQ(ddl_alloc_bytes_live(), live);
    ddl_partition_destroy(&Px);
    ddl_partition_destroy(&Py);
}

int main(int argc, char **argv)
{
    ddl_test_mpi_init(&argc, &argv);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    test_refusals();
    test_bad_local_shape();
    test_bad_tensors();
    test_identity();
    test_scatter_gather();
    test_buffer_example();
    test_layouts();
    test_no_leak();
    ASSERT_EQ(ddl_alloc_bytes_live(), 0);
    return ddl_test_mpi_finalize();
}
