// HaloExchange tests:
//  - for each layout below, in f64 and f32: after forward, every element of every
//    padded buffer (ghosts and corners included) equals the padded global tensor at the
//    matching global coordinate; the needed box is exactly the input range of the
//    rank's output share; the adjoint test over whole buffers; the adjoint leaves every
//    ghost zero; forward and adjoint allocate nothing;
//  - DistDL's example (examples/primitives/ex_halo_exchange.py) value by value;
//  - DistDL's pooling halo table (tests/test_halo_mixin.py) through the plan;
//  - the split phase (start, progress, finish) against the one-call exchange, bit for bit;
//  - refusals (same status on every rank, members or not), tensor checks, and the split
//    phase's misuse (finish with nothing in flight, a second start, a one-call exchange
//    while one is in flight).
// Layouts needing more ranks than the world has are skipped; np 1 runs the
// single-rank cases only.
#include <string.h>

#include "ddl/base.h"
#include "mpi_test.h"

static int world_size(void)
{
    int n;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
}

// ---- layouts -------------------------------------------------------------------

typedef struct hcase {
    const char *name;
    int         first;  // first world rank of the partition
    int         ndim;
    int         pshape[DDL_MAX_DIMS];
    int64_t     global[DDL_MAX_DIMS];
    int64_t     k[DDL_MAX_DIMS], s[DDL_MAX_DIMS], p[DDL_MAX_DIMS], d[DDL_MAX_DIMS];
} hcase;

static const hcase cases[] = {
    {"2d 3x3 pad 0", 0, 4, {1, 1, 3, 3}, {1, 1, 10, 7},
     {1, 1, 3, 3}, {1, 1, 1, 1}, {0, 0, 0, 0}, {1, 1, 1, 1}},
    {"2d 3x3 pad 1", 0, 4, {1, 1, 3, 3}, {1, 1, 10, 7},
     {1, 1, 3, 3}, {1, 1, 1, 1}, {0, 0, 1, 1}, {1, 1, 1, 1}},
    {"1d k2 s2", 0, 3, {1, 1, 3}, {1, 1, 10}, {1, 1, 2}, {1, 1, 2}, {0, 0, 0}, {1, 1, 1}},
    {"1d dilation 2", 0, 3, {1, 1, 3}, {1, 1, 14}, {1, 1, 3}, {1, 1, 1}, {0, 0, 2}, {1, 1, 2}},
    {"2d dilation 2", 0, 4, {1, 1, 2, 2}, {1, 1, 9, 8},
     {1, 1, 3, 3}, {1, 1, 1, 1}, {0, 0, 0, 1}, {1, 1, 2, 1}},
    {"2d even kernel", 0, 4, {1, 1, 2, 2}, {1, 1, 8, 9},
     {1, 1, 4, 2}, {1, 1, 1, 1}, {0, 0, 1, 0}, {1, 1, 1, 1}},
    {"1d stride 2 pad 1", 0, 3, {1, 1, 3}, {1, 1, 11}, {1, 1, 3}, {1, 1, 2}, {0, 0, 1}, {1, 1, 1}},
    {"2d stride 2 pad 1", 0, 4, {1, 1, 2, 2}, {1, 1, 9, 10},
     {1, 1, 3, 3}, {1, 1, 2, 2}, {0, 0, 1, 1}, {1, 1, 1, 1}},
    {"1d 3 ranks", 0, 1, {3}, {20}, {5}, {1}, {2}, {1}},
    {"1d idle ranks", 1, 1, {3}, {12}, {3}, {1}, {1}, {1}},
    {"negative right halo", 0, 2, {1, 2}, {2, 7}, {1, 3}, {1, 3}, {0, 0}, {1, 1}},
    {"batch split, no halo", 0, 3, {2, 1, 2}, {4, 3, 9}, {1, 1, 3}, {1, 1, 1}, {0, 0, 1}, {1, 1, 1}},
    {"3d 2x2x2", 0, 4, {1, 2, 2, 2}, {2, 7, 6, 5},
     {1, 3, 3, 3}, {1, 1, 1, 1}, {0, 1, 1, 1}, {1, 1, 1, 1}},
    // Wide rows: the row slabs are long strided runs (MPI datatypes), columns are packed.
    {"2d wide rows", 0, 4, {1, 1, 2, 2}, {1, 2, 10, 140},
     {1, 1, 3, 3}, {1, 1, 1, 1}, {0, 0, 1, 1}, {1, 1, 1, 1}},
    {"single rank", 0, 3, {1, 1, 1}, {1, 2, 6}, {1, 1, 3}, {1, 1, 1}, {0, 0, 1}, {1, 1, 1}},
};

static int case_ranks(const hcase *c)
{
    int n = 1;
    for (int i = 0; i < c->ndim; i++) {
        n *= c->pshape[i];
    }
    return c->first + n;
}

// Value of the padded global tensor at padded coordinate g: 0 in the padding, else
// 1 + the row-major index in the unpadded tensor (exact in f32 for these sizes).
static double padded_value(const hcase *c, const int64_t *g)
{
    int64_t flat = 0;
    for (int i = 0; i < c->ndim; i++) {
        int64_t u = g[i] - c->p[i];
        if (u < 0 || u >= c->global[i]) {
            return 0.0;
        }
        flat = flat * c->global[i] + u;
    }
    return 1.0 + (double)flat;
}

// Padded global coordinate of buffer element `flat` on this rank (dims of the plan).
static void buffer_to_global(const hcase *c, const ddl_halo_dim *hd, const int *index,
                             const ddl_shape *shape, int64_t flat, int64_t *g)
{
    for (int i = c->ndim - 1; i >= 0; i--) {
        int64_t b  = flat % shape->d[i];
        flat      /= shape->d[i];
        int64_t x0 = ddl_decomp_start(c->global[i], c->pshape[i], index[i]) +
                     (index[i] > 0 ? c->p[i] : 0);  // first held element, padded coords
        g[i]       = x0 - hd[i].ghost_lo + b;
    }
}

// True if element `flat` lies in a ghost slab of some dimension.
static bool in_ghost(const ddl_halo_dim *hd, const ddl_shape *shape, int64_t flat)
{
    for (int i = shape->ndim - 1; i >= 0; i--) {
        int64_t b  = flat % shape->d[i];
        flat      /= shape->d[i];
        if (b < hd[i].ghost_lo || b >= hd[i].buf - hd[i].ghost_hi) {
            return true;
        }
    }
    return false;
}

static void run_case(const hcase *c, ddl_dtype dt)
{
    int64_t              live = ddl_alloc_bytes_live();
    ddl_partition_t     *P    = ddl_test_partition_range(c->first, c->ndim, c->pshape);
    ddl_halo_exchange_t *h = NULL;
    ddl_shape            global = ddl_shape_make(c->ndim, c->global);
    ASSERT_OK(ddl_halo_exchange_create(P, dt, &global, c->k, c->s, c->p, c->d, &h));
    ddl_shape           shape = ddl_halo_exchange_shape(h);
    const ddl_halo_dim *hd    = ddl_halo_exchange_dims(h);
    const int          *index = ddl_partition_index(P);
    ASSERT_EQ(shape.ndim, c->ndim);
    if (!ddl_partition_active(P)) {
        ASSERT_TRUE(hd == NULL);
        ASSERT_EQ(ddl_shape_numel(&shape), 0);
    }

    // Geometry: bulk box and needed box against the global window arithmetic.
    ddl_box bulk = ddl_halo_exchange_bulk_box(h), need = ddl_halo_exchange_needed_box(h);
    for (int i = 0; hd != NULL && i < c->ndim; i++) {
        ASSERT_EQ(shape.d[i], hd[i].buf);
        ASSERT_EQ(bulk.stop[i] - bulk.start[i],
                  ddl_decomp_size(c->global[i], c->pshape[i], index[i]));
        ASSERT_EQ(bulk.start[i], hd[i].ghost_lo + hd[i].pad_lo);
        int64_t x0 = ddl_decomp_start(c->global[i], c->pshape[i], index[i]) +
                     (index[i] > 0 ? c->p[i] : 0) - hd[i].ghost_lo;  // buffer 0, padded
        if (hd[i].out_n > 0) {
            ASSERT_EQ(x0 + need.start[i], c->s[i] * hd[i].out_start);
            ASSERT_EQ(x0 + need.stop[i],
                      c->s[i] * (hd[i].out_start + hd[i].out_n - 1) + c->d[i] * (c->k[i] - 1) + 1);
        } else {
            ASSERT_EQ(need.stop[i] - need.start[i], 0);
        }
        ASSERT_TRUE(need.start[i] >= 0 && need.stop[i] <= hd[i].buf);
    }

    // Forward values: bulk and pads from the padded global tensor, ghosts poisoned.
    ddl_tensor_t *buf = NULL;
    ASSERT_OK(ddl_tensor_create(dt, &shape, &buf));
    int64_t n = ddl_tensor_numel(buf);
    int64_t g[DDL_MAX_DIMS];
    for (int64_t e = 0; e < n; e++) {
        buffer_to_global(c, hd, index, &shape, e, g);
        ddl_tensor_set(buf, e, in_ghost(hd, &shape, e) ? -7.0 : padded_value(c, g));
    }
    uint64_t allocs = ddl_alloc_count();
    ASSERT_OK(ddl_halo_exchange_forward(h, buf));
    ASSERT_EQ(ddl_alloc_count(), allocs);
    for (int64_t e = 0; e < n; e++) {
        buffer_to_global(c, hd, index, &shape, e, g);
        if (ddl_tensor_get(buf, e) != padded_value(c, g)) {
            TEST_FAIL_("%s (%s): element %lld is %g, expected %g", c->name, ddl_dtype_name(dt),
                       (long long)e, ddl_tensor_get(buf, e), padded_value(c, g));
        }
    }

    // The adjoint test over whole buffers, and zero ghosts after the adjoint.
    ddl_tensor_t *x   = ddl_test_random(dt, &shape, 11);
    ddl_tensor_t *dy  = ddl_test_random(dt, &shape, 12);
    ddl_tensor_t *Fx  = NULL, *Fty = NULL;
    ASSERT_OK(ddl_tensor_create(dt, &shape, &Fx));
    ASSERT_OK(ddl_tensor_create(dt, &shape, &Fty));
    ASSERT_OK(ddl_tensor_copy(x, Fx));
    ASSERT_OK(ddl_tensor_copy(dy, Fty));
    allocs = ddl_alloc_count();
    ASSERT_OK(ddl_halo_exchange_forward(h, Fx));
    ASSERT_OK(ddl_halo_exchange_adjoint(h, Fty));
    ASSERT_EQ(ddl_alloc_count(), allocs);
    double err = ddl_test_adjoint_error(MPI_COMM_WORLD, x, Fx, dy, Fty);
    if (!(err <= ddl_test_adjoint_tol(dt))) {
        TEST_FAIL_("%s (%s): adjoint error %g", c->name, ddl_dtype_name(dt), err);
    }
    for (int64_t e = 0; e < n; e++) {
        if (in_ghost(hd, &shape, e)) {
            ASSERT_TRUE(ddl_tensor_get(Fty, e) == 0.0);
        }
    }

    // Split phase: start, progress calls, finish give the one-call results bit for bit.
    ddl_tensor_t *Sx = NULL, *Sty = NULL;
    ASSERT_OK(ddl_tensor_create(dt, &shape, &Sx));
    ASSERT_OK(ddl_tensor_create(dt, &shape, &Sty));
    ASSERT_OK(ddl_tensor_copy(x, Sx));
    ASSERT_OK(ddl_tensor_copy(dy, Sty));
    allocs = ddl_alloc_count();
    for (int adj = 0; adj < 2; adj++) {
        ddl_tensor_t *t = adj ? Sty : Sx;
        ASSERT_OK(adj ? ddl_halo_exchange_adjoint_start(h, t)
                      : ddl_halo_exchange_forward_start(h, t));
        ASSERT_TRUE(ddl_halo_exchange_in_flight(h));
        for (int k = 0; k < 3 * adj; k++) { // none for forward, some for the adjoint
            ASSERT_OK(ddl_halo_exchange_progress(h));
        }
        ASSERT_OK(ddl_halo_exchange_finish(h));
        ASSERT_TRUE(!ddl_halo_exchange_in_flight(h));
        ASSERT_OK(ddl_halo_exchange_progress(h)); // nothing in flight: a no-op
    }
    ASSERT_EQ(ddl_alloc_count(), allocs);
    if (memcmp(Sx->data, Fx->data, ddl_tensor_bytes(Fx)) != 0 ||
        memcmp(Sty->data, Fty->data, ddl_tensor_bytes(Fty)) != 0) {
        TEST_FAIL_("%s (%s): split-phase results differ from the one-call exchange", c->name,
                   ddl_dtype_name(dt));
    }
    ddl_tensor_destroy(&Sx);
    ddl_tensor_destroy(&Sty);
    ddl_tensor_destroy(&x);
    ddl_tensor_destroy(&dy);
    ddl_tensor_destroy(&Fx);
    ddl_tensor_destroy(&Fty);
    ddl_tensor_destroy(&buf);
    ddl_halo_exchange_destroy(&h);
    ASSERT_TRUE(h == NULL);
    ddl_partition_destroy(&P);
    ASSERT_EQ(ddl_alloc_bytes_live(), live);  // the plan frees everything it allocated
}

// ---- DistDL's example, value by value ----------------------------------------

// P [1,1,2,2] over [1,1,5,4], 3x3 kernel: each rank's bulk holds rank + 1.
static void test_distdl_example(ddl_dtype dt)
{
    static const double fwd[4][12] = {
        {1, 1, 2, 1, 1, 2, 1, 1, 2, 3, 3, 4},
        {1, 2, 2, 1, 2, 2, 1, 2, 2, 3, 4, 4},
        {1, 1, 2, 3, 3, 4, 3, 3, 4},
        {1, 2, 2, 3, 4, 4, 3, 4, 4},
    };
    static const double adj[4][12] = {
        {1, 3, 0, 1, 3, 0, 4, 10, 0, 0, 0, 0},
        {0, 3, 2, 0, 3, 2, 0, 10, 6, 0, 0, 0},
        {0, 0, 0, 4, 10, 0, 3, 7, 0},
        {0, 0, 0, 0, 10, 6, 0, 7, 4},
    };
    static const int64_t rows[4] = {4, 4, 3, 3};
    ddl_partition_t     *P       = ddl_test_partition_range(0, 4, (int[]){1, 1, 2, 2});
    ddl_halo_exchange_t *h       = NULL;
    ddl_shape            global  = ddl_shape_make(4, (int64_t[]){1, 1, 5, 4});
    ASSERT_OK(ddl_halo_exchange_create(P, dt, &global, (int64_t[]){1, 1, 3, 3},
                                       (int64_t[]){1, 1, 1, 1}, (int64_t[]){0, 0, 0, 0},
                                       (int64_t[]){1, 1, 1, 1}, &h));
    ddl_shape     shape = ddl_halo_exchange_shape(h);
    ddl_tensor_t *buf   = NULL;
    ASSERT_OK(ddl_tensor_create(dt, &shape, &buf));
    int r = ddl_partition_rank(P);
    if (r >= 0) {
        ASSERT_EQ(shape.d[2], rows[r]);
        ASSERT_EQ(shape.d[3], 3);
        ddl_box bulk = ddl_halo_exchange_bulk_box(h);
        for (int64_t i = bulk.start[2]; i < bulk.stop[2]; i++) {
            for (int64_t j = bulk.start[3]; j < bulk.stop[3]; j++) {
                ddl_tensor_set(buf, i * 3 + j, r + 1);
            }
        }
    }
    ASSERT_OK(ddl_halo_exchange_forward(h, buf));
    for (int64_t e = 0; r >= 0 && e < rows[r] * 3; e++) {
        if (ddl_tensor_get(buf, e) != fwd[r][e]) {
            TEST_FAIL_("example forward (%s): rank %d element %lld is %g, expected %g",
                       ddl_dtype_name(dt), r, (long long)e, ddl_tensor_get(buf, e), fwd[r][e]);
        }
    }
    for (int64_t e = 0; r >= 0 && e < rows[r] * 3; e++) {
        ddl_tensor_set(buf, e, r + 1);
    }
    ASSERT_OK(ddl_halo_exchange_adjoint(h, buf));
    for (int64_t e = 0; r >= 0 && e < rows[r] * 3; e++) {
        if (ddl_tensor_get(buf, e) != adj[r][e]) {
            TEST_FAIL_("example adjoint (%s): rank %d element %lld is %g, expected %g",
                       ddl_dtype_name(dt), r, (long long)e, ddl_tensor_get(buf, e), adj[r][e]);
        }
    }
    ddl_tensor_destroy(&buf);
    ddl_halo_exchange_destroy(&h);
    ddl_partition_destroy(&P);
}

// ---- DistDL's pooling table through the plan ---------------------------------

// P [1,1,4] over [1,1,10], kernel 2, stride 2: halos (0,1),(-1,0),(0,0),(0,0), sends
// (0,0),(1,0),(0,0),(0,0), needed ranges [0,4),[1,3),[0,2),[0,2).
static void test_pool_table(void)
{
    static const int64_t halo[4][2] = {{0, 1}, {-1, 0}, {0, 0}, {0, 0}};
    static const int64_t send[4][2] = {{0, 0}, {1, 0}, {0, 0}, {0, 0}};
    static const int64_t need[4][2] = {{0, 4}, {1, 3}, {0, 2}, {0, 2}};
    ddl_partition_t     *P          = ddl_test_partition_range(0, 3, (int[]){1, 1, 4});
    ddl_halo_exchange_t *h          = NULL;
    ddl_shape            global     = ddl_shape_make(3, (int64_t[]){1, 1, 10});
    ASSERT_OK(ddl_halo_exchange_create(P, DDL_F64, &global, (int64_t[]){1, 1, 2},
                                       (int64_t[]){1, 1, 2}, (int64_t[]){0, 0, 0},
                                       (int64_t[]){1, 1, 1}, &h));
    int r = ddl_partition_rank(P);
    if (r >= 0) {
        const ddl_halo_dim *hd = ddl_halo_exchange_dims(h);
        ddl_box             nb = ddl_halo_exchange_needed_box(h);
        ASSERT_EQ(hd[2].halo_lo, halo[r][0]);
        ASSERT_EQ(hd[2].halo_hi, halo[r][1]);
        ASSERT_EQ(hd[2].ghost_lo, halo[r][0] > 0 ? halo[r][0] : 0);
        ASSERT_EQ(hd[2].ghost_hi, halo[r][1] > 0 ? halo[r][1] : 0);
        ASSERT_EQ(hd[2].send_lo, send[r][0]);
        ASSERT_EQ(hd[2].send_hi, send[r][1]);
        ASSERT_EQ(nb.start[2], need[r][0]);
        ASSERT_EQ(nb.stop[2], need[r][1]);
        ASSERT_EQ(nb.start[0], 0);
        ASSERT_EQ(nb.stop[0], 1);
        ddl_shape s = ddl_halo_exchange_shape(h);
        ASSERT_EQ(s.d[2], r < 2 ? 3 + (r == 0) : 2);
    } else {
        ASSERT_TRUE(ddl_halo_exchange_dims(h) == NULL);
    }
    ddl_halo_exchange_destroy(&h);
    ddl_partition_destroy(&P);
}

// ---- refusals and tensor checks ------------------------------------------------

static void expect_refused(const ddl_partition_t *P, const ddl_shape *global, const int64_t *k,
                           const int64_t *s, const int64_t *p, const int64_t *d, const char *what)
{
    ddl_halo_exchange_t *h = (ddl_halo_exchange_t *)(uintptr_t)1;  // must be reset to NULL
    ASSERT_STATUS(ddl_halo_exchange_create(P, DDL_F64, global, k, s, p, d, &h), DDL_EINVAL);
    ASSERT_TRUE(h == NULL);
    if (strstr(ddl_last_error(), what) == NULL) {
        TEST_FAIL_("message \"%s\" does not mention \"%s\"", ddl_last_error(), what);
    }
    // Every rank of the world refused with the same message.
    char msg[256] = {0}, root[256];
    snprintf(msg, sizeof msg, "%s", ddl_last_error());
    memcpy(root, msg, sizeof msg);
    MPI_Bcast(root, sizeof root, MPI_CHAR, 0, MPI_COMM_WORLD);
    ASSERT_TRUE(strcmp(root, msg) == 0);
}

static void test_refusals(void)
{
    const int64_t one[3] = {1, 1, 1}, zero[3] = {0, 0, 0};
    // One rank: window larger than the padded input; bad kernel; ndim mismatch.
    ddl_partition_t *P1 = ddl_test_partition_range(0, 1, (int[]){1});
    ddl_shape        g3 = ddl_shape_make(1, (int64_t[]){3});
    expect_refused(P1, &g3, (int64_t[]){5}, one, zero, one, "larger than the padded input");
    expect_refused(P1, &g3, (int64_t[]){0}, one, zero, one, "kernel[0] = 0");
    expect_refused(P1, &g3, one, one, (int64_t[]){-1}, one, "padding[0] = -1");
    ddl_shape g2 = ddl_shape_make(2, (int64_t[]){3, 3});
    expect_refused(P1, &g2, one, one, zero, one, "2 dims but the partition has 1");
    ddl_partition_destroy(&P1);
    if (world_size() < 3) {
        return;
    }
    // Three ranks over length 6, kernel 5: piece 0 needs 3 elements of piece 1, which
    // holds 2. Refused on every rank, including those outside the partition.
    ddl_partition_t *P3 = ddl_test_partition_range(0, 3, (int[]){1, 1, 3});
    ddl_shape        g  = ddl_shape_make(3, (int64_t[]){1, 1, 6});
    expect_refused(P3, &g, (int64_t[]){1, 1, 5}, one, zero, one, "immediate neighbour");
    ddl_partition_destroy(&P3);
}

// A wrong tensor is refused locally, before any communication (so all ranks may do it).
static void test_tensor_checks(void)
{
    ddl_partition_t     *P      = ddl_test_partition_range(0, 1, (int[]){1});
    ddl_shape            global = ddl_shape_make(1, (int64_t[]){8});
    ddl_halo_exchange_t *h      = NULL;
    ASSERT_OK(ddl_halo_exchange_create(P, DDL_F64, &global, (int64_t[]){3}, (int64_t[]){1},
                                       (int64_t[]){1}, (int64_t[]){1}, &h));
    ddl_shape     shape = ddl_halo_exchange_shape(h);
    ddl_tensor_t *t     = NULL;
    if (ddl_partition_active(P)) {
        ASSERT_EQ(shape.d[0], 10);  // pad | 8 | pad
        ddl_shape bad = ddl_shape_make(1, (int64_t[]){8});
        ASSERT_OK(ddl_tensor_create(DDL_F64, &bad, &t));
        ASSERT_STATUS(ddl_halo_exchange_forward(h, t), DDL_ESHAPE);
        ASSERT_TRUE(strstr(ddl_last_error(), "[8]") != NULL);
        ddl_tensor_destroy(&t);
        ASSERT_OK(ddl_tensor_create(DDL_F32, &shape, &t));
        ASSERT_STATUS(ddl_halo_exchange_adjoint(h, t), DDL_EINVAL);
        ddl_tensor_destroy(&t);
        // Split-phase misuse: refused, nothing left in flight.
        ASSERT_STATUS(ddl_halo_exchange_finish(h), DDL_EINVAL);
        ASSERT_TRUE(strstr(ddl_last_error(), "no exchange in flight") != NULL);
        ASSERT_STATUS(ddl_halo_exchange_finish(NULL), DDL_EINVAL);
        ASSERT_STATUS(ddl_halo_exchange_forward_start(h, NULL), DDL_EINVAL);
        ASSERT_TRUE(!ddl_halo_exchange_in_flight(h));
        ddl_tensor_destroy(&t);
        ASSERT_OK(ddl_tensor_create(DDL_F64, &shape, &t));
        ASSERT_OK(ddl_halo_exchange_adjoint_start(h, t));
        ASSERT_STATUS(ddl_halo_exchange_forward_start(h, t), DDL_EINVAL);
        ASSERT_TRUE(strstr(ddl_last_error(), "in flight") != NULL);
        ASSERT_STATUS(ddl_halo_exchange_forward(h, t), DDL_EINVAL);
        ASSERT_STATUS(ddl_halo_exchange_adjoint(h, t), DDL_EINVAL);
        ASSERT_TRUE(ddl_halo_exchange_in_flight(h));
        ASSERT_OK(ddl_halo_exchange_finish(h));
        ASSERT_TRUE(!ddl_halo_exchange_in_flight(NULL));
        ddl_tensor_destroy(&t);
        // One rank: no neighbours, so forward and adjoint change nothing.
        t = ddl_test_random(DDL_F64, &shape, 5);
        ddl_tensor_t *ref = ddl_test_random(DDL_F64, &shape, 5);
        ASSERT_OK(ddl_halo_exchange_forward(h, t));
        ASSERT_OK(ddl_halo_exchange_adjoint(h, t));
        for (int64_t e = 0; e < ddl_tensor_numel(t); e++) {
            ASSERT_TRUE(ddl_tensor_get(t, e) == ddl_tensor_get(ref, e));
        }
        ddl_tensor_destroy(&ref);
    } else {
        ASSERT_EQ(ddl_shape_numel(&shape), 0);
        ASSERT_OK(ddl_halo_exchange_forward(h, NULL));
        ASSERT_OK(ddl_tensor_create(DDL_F64, &shape, &t));
        ASSERT_OK(ddl_halo_exchange_adjoint(h, t));
        ddl_shape bad = ddl_shape_make(1, (int64_t[]){2});
        ddl_tensor_destroy(&t);
        ASSERT_OK(ddl_tensor_create(DDL_F64, &bad, &t));
        ASSERT_STATUS(ddl_halo_exchange_forward(h, t), DDL_ESHAPE);
    }
    ddl_tensor_destroy(&t);
    ddl_halo_exchange_destroy(&h);
    ddl_halo_exchange_destroy(&h);  // NULL-safe
    ddl_partition_destroy(&P);
}

int main(int argc, char **argv)
{
    ddl_test_mpi_init(&argc, &argv);
    int world = world_size();
    test_refusals();
    test_tensor_checks();
    int ran = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (case_ranks(&cases[i]) > world) {
            continue;
        }
        run_case(&cases[i], DDL_F64);
        run_case(&cases[i], DDL_F32);
        ran++;
    }
    if (world >= 4) {
        test_distdl_example(DDL_F64);
        test_distdl_example(DDL_F32);
        test_pool_table();
    }
    if (ddl_test_rank == 0) {
        printf("test_halo_exchange: %d of %zu layouts on %d ranks: ok\n", ran,
               sizeof cases / sizeof cases[0], world);
    }
    return ddl_test_mpi_finalize();
}
