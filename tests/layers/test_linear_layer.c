// Linear layer (DistDL DistributedLinear) tests, over DistDL's layouts and smaller
// ones that fit 1 and 4 ranks:
//  - adjoint with respect to the input, the weight and the bias; equivalence with the
//    layer on rank 0 alone; finite-difference gradients; bias on and off; even and
//    uneven feature splits (the padded-block path), overlapping, disjoint and
//    idle-rank layouts;
//  - exact values: integer weights, bias and inputs give y, dx, dW and db that a plain
//    triple loop reproduces bit for bit;
//  - forward and backward allocate nothing;
//  - the refusals (bad partition shapes, sizes), alike on every rank.
#include <string.h>

#include "ddl/base.h"
#include "ddl/decomp.h"
#include "layer_test.h"

static int world;

typedef struct lin_case {
    ddl_partition_t *Px, *Py, *Pw;
    ddl_partition_t *P0;  // rank 0 alone, [1, 1]: the sequential twin's partitions
    int64_t          batch, in, out;
    bool             bias;
} lin_case;

static ddl_status build_linear(void *ctx, bool seq, ddl_dtype dt, ddl_layer_t **out)
{
    lin_case *c = ctx;
    if (seq) {
        return ddl_linear_create(c->P0, c->P0, c->P0, dt, c->batch, c->in, c->out, c->bias, out);
    }
    return ddl_linear_create(c->Px, c->Py, c->Pw, dt, c->batch, c->in, c->out, c->bias, out);
}

static ddl_partition_t *partition_of(int n, const int *ranks, int d0, int d1)
{
    ddl_partition_t *P = NULL;
    ASSERT_OK(ddl_partition_create(MPI_COMM_WORLD, n, ranks, 2, (int[]){d0, d1}, &P));
    return P;
}

// ---- exact values --------------------------------------------------------------

// Integer-valued globals: W[o][i] = (o - 2 i) mod 5 - 2, b[o] = o - 1, x[n][i] = (n + i) mod 3 - 1,
// dy[n][o] = (2 n + o) mod 4 - 1. All sums stay small integers, exact in f32 and f64.
static double w_at(int64_t o, int64_t i)
{
    return (double)(((o - 2 * i) % 5 + 5) % 5) - 2.0;
}
static double b_at(int64_t o)
{
    return (double)o - 1.0;
}
static double x_at(int64_t n, int64_t i)
{
    return (double)((n + i) % 3) - 1.0;
}
static double dy_at(int64_t n, int64_t o)
{
    return (double)((2 * n + o) % 4) - 1.0;
}

// Element k of the piece `box` of a 2-D (or 1-D) global tensor: its global coordinates.
static void coords(const ddl_box *box, int64_t k, int64_t *r, int64_t *c)
{
    if (box->ndim == 1) {
        *r = box->start[0] + k;
        *c = 0;
        return;
    }
    int64_t w = box->stop[1] - box->start[1];
    *r        = box->start[0] + k / w;
    *c        = box->start[1] + k % w;
}

static void exact_case(lin_case *c, ddl_dtype dt, const char *name)
{
    ddl_layer_t *L = NULL;
    ASSERT_OK(build_linear(c, false, dt, &L));
    ddl_box xb = ddl_partition_local_box(ddl_layer_P_in(L), ddl_layer_x_global(L));
    ddl_box yb = ddl_partition_local_box(ddl_layer_P_out(L), ddl_layer_y_global(L));
    ddl_param *w = ddl_layer_param(L, 0);
    for (int64_t k = 0; k < ddl_tensor_numel(w->value); k++) {
        int64_t o, i;
        coords(&w->box, k, &o, &i);
        ddl_tensor_set(w->value, k, w_at(o, i));
    }
    if (c->bias) {
        ddl_param *b = ddl_layer_param(L, 1);
        for (int64_t k = 0; k < ddl_tensor_numel(b->value); k++) {
            int64_t o, unused;
            coords(&b->box, k, &o, &unused);
            ddl_tensor_set(b->value, k, b_at(o));
        }
    }
    ddl_tensor_t *x, *y, *dy, *dx;
    ASSERT_OK(ddl_tensor_create(dt, ddl_layer_x_shape(L), &x));
    ASSERT_OK(ddl_tensor_create(dt, ddl_layer_y_shape(L), &y));
    ASSERT_OK(ddl_tensor_create(dt, ddl_layer_y_shape(L), &dy));
    ASSERT_OK(ddl_tensor_create(dt, ddl_layer_x_shape(L), &dx));
    for (int64_t k = 0; k < ddl_tensor_numel(x); k++) {
        int64_t n, i;
        coords(&xb, k, &n, &i);
        ddl_tensor_set(x, k, x_at(n, i));
    }
    for (int64_t k = 0; k < ddl_tensor_numel(dy); k++) {
        int64_t n, o;
        coords(&yb, k, &n, &o);
        ddl_tensor_set(dy, k, dy_at(n, o));
    }
    ddl_layer_zero_grad(L);
    ASSERT_OK(ddl_layer_forward(L, x, y));
    // Backward twice: dx is overwritten (same value), parameter gradients accumulate (2x).
    ASSERT_OK(ddl_layer_backward(L, dy, dx));
    ASSERT_OK(ddl_layer_backward(L, dy, dx));
    for (int64_t k = 0; k < ddl_tensor_numel(y); k++) {
        int64_t n, o;
        coords(&yb, k, &n, &o);
        double want = c->bias ? b_at(o) : 0.0;
        for (int64_t i = 0; i < c->in; i++) {
            want += x_at(n, i) * w_at(o, i);
        }
        ASSERT_NEAR(ddl_tensor_get(y, k), want, 0.0);
    }
    for (int64_t k = 0; k < ddl_tensor_numel(dx); k++) {
        int64_t n, i;
        coords(&xb, k, &n, &i);
        double want = 0.0;
        for (int64_t o = 0; o < c->out; o++) {
            want += dy_at(n, o) * w_at(o, i);
        }
        ASSERT_NEAR(ddl_tensor_get(dx, k), want, 0.0);
    }
    for (int64_t k = 0; k < ddl_tensor_numel(w->grad); k++) {
        int64_t o, i;
        coords(&w->box, k, &o, &i);
        double want = 0.0;
        for (int64_t n = 0; n < c->batch; n++) {
            want += dy_at(n, o) * x_at(n, i);
        }
        ASSERT_NEAR(ddl_tensor_get(w->grad, k), 2.0 * want, 0.0);
    }
    if (c->bias) {
        ddl_param *b = ddl_layer_param(L, 1);
        for (int64_t k = 0; k < ddl_tensor_numel(b->grad); k++) {
            int64_t o, unused;
            coords(&b->box, k, &o, &unused);
            double want = 0.0;
            for (int64_t n = 0; n < c->batch; n++) {
                want += dy_at(n, o);
            }
            ASSERT_NEAR(ddl_tensor_get(b->grad, k), 2.0 * want, 0.0);
        }
    }
    // Every element of every parameter is owned exactly once.
    for (int p = 0; p < ddl_layer_nparams(L); p++) {
        int64_t mine = ddl_box_numel(&ddl_layer_param(L, p)->box), total;
        MPI_Allreduce(&mine, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
        ASSERT_EQ(total, ddl_shape_numel(&ddl_layer_param(L, p)->global));
    }
    // The steady state allocates nothing.
    uint64_t before = ddl_alloc_count();
    ASSERT_OK(ddl_layer_forward(L, x, y));
    ASSERT_OK(ddl_layer_backward(L, dy, dx));
    ASSERT_EQ(ddl_alloc_count(), before);
    ddl_tensor_destroy(&x);
    ddl_tensor_destroy(&y);
    ddl_tensor_destroy(&dy);
    ddl_tensor_destroy(&dx);
    ddl_layer_destroy(&L);
    if (ddl_test_rank == 0) {
        printf("ok exact %s (%s)\n", name, ddl_dtype_name(dt));
    }
}

// Runs the generic checks (bias on and off) and the exact-value case.
static void run_case(lin_case *c, const char *name)
{
    for (int b = 0; b < 2; b++) {
        c->bias = b == 1;
        char full[128];
        snprintf(full, sizeof full, "%s, x [%lld, %lld] -> y [%lld, %lld], bias %s", name,
                 (long long)c->batch, (long long)c->in, (long long)c->batch, (long long)c->out,
                 c->bias ? "on" : "off");
        ddl_layer_builder bld = {.build = build_linear, .ctx = c, .seed = 42, .training = true};
        layer_test_run(full, &bld, true, true);
        exact_case(c, DDL_F64, full);
        exact_case(c, DDL_F32, full);
    }
}

static void free_case(lin_case *c)
{
    // A partition used twice in a case is destroyed once.
    if (c->Py == c->Px) {
        c->Py = NULL;
    }
    if (c->Pw == c->Px || c->Pw == c->Py) {
        c->Pw = NULL;
    }
    ddl_partition_destroy(&c->Px);
    ddl_partition_destroy(&c->Py);
    ddl_partition_destroy(&c->Pw);
}

// ---- refusals ------------------------------------------------------------------

static void refusals(ddl_partition_t *P0)
{
    ddl_layer_t *L = NULL;
    // P_x must be [1, P_fi]: a [2, 1] (or 1-D) partition is refused on every rank.
    int              r2[] = {0, 1};
    ddl_partition_t *P21  = NULL, *P1 = NULL;
    if (world >= 2) {
        ASSERT_OK(ddl_partition_create(MPI_COMM_WORLD, 2, r2, 2, (int[]){2, 1}, &P21));
        ASSERT_STATUS(ddl_linear_create(P21, P0, P0, DDL_F64, 2, 4, 3, true, &L), DDL_EINVAL);
        ASSERT_STATUS(ddl_linear_create(P0, P21, P0, DDL_F64, 2, 4, 3, true, &L), DDL_EINVAL);
        // P_w [2, 1] with P_y [1, 1]: P_w shape[0] != P_y shape[1].
        ASSERT_STATUS(ddl_linear_create(P0, P0, P21, DDL_F64, 2, 4, 3, true, &L), DDL_EINVAL);
        ddl_partition_destroy(&P21);
    }
    ASSERT_OK(ddl_partition_create(MPI_COMM_WORLD, 1, r2, 1, (int[]){1}, &P1));
    ASSERT_STATUS(ddl_linear_create(P1, P0, P0, DDL_F64, 2, 4, 3, true, &L), DDL_EINVAL);
    ASSERT_STATUS(ddl_linear_create(P0, P0, P1, DDL_F64, 2, 4, 3, true, &L), DDL_EINVAL);
    ddl_partition_destroy(&P1);
    ASSERT_STATUS(ddl_linear_create(P0, P0, P0, DDL_F64, 0, 4, 3, true, &L), DDL_EINVAL);
    ASSERT_STATUS(ddl_linear_create(P0, P0, P0, DDL_F64, 2, 0, 3, true, &L), DDL_EINVAL);
    ASSERT_STATUS(ddl_linear_create(P0, P0, P0, DDL_F64, 2, 4, -1, true, &L), DDL_EINVAL);
    ASSERT_STATUS(ddl_linear_create(NULL, P0, P0, DDL_F64, 2, 4, 3, true, &L), DDL_EINVAL);
    ASSERT_STATUS(ddl_linear_create(P0, P0, P0, (ddl_dtype)7, 2, 4, 3, true, &L), DDL_EINVAL);
    ASSERT_TRUE(L == NULL);
    // The local shapes and the parameter placement of the sequential layer.
    ASSERT_OK(ddl_linear_create(P0, P0, P0, DDL_F64, 2, 4, 3, true, &L));
    ASSERT_EQ(ddl_layer_nparams(L), 2);
    ASSERT_TRUE(strcmp(ddl_layer_param(L, 0)->name, "weight") == 0 &&
                strcmp(ddl_layer_param(L, 1)->name, "bias") == 0);
    ASSERT_EQ(ddl_layer_param(L, 0)->global.d[0], 3);
    ASSERT_EQ(ddl_layer_param(L, 0)->global.d[1], 4);
    ASSERT_EQ(ddl_box_numel(&ddl_layer_param(L, 0)->box), ddl_test_rank == 0 ? 12 : 0);
    ASSERT_EQ(ddl_shape_numel(ddl_layer_x_shape(L)), ddl_test_rank == 0 ? 8 : 0);
    ddl_layer_destroy(&L);
    if (ddl_test_rank == 0) {
        printf("ok refusals\n");
    }
}

// A wrongly shaped tensor on one rank only (here rank 3, which holds none of x): the
// generic forward/backward checks are agreed on before the layer's collectives, so every
// rank fails with that rank's message instead of the others blocking in them.
static void one_rank_bad_shape(void)
{
    ddl_partition_t *Px = ddl_test_partition_range(0, 2, (int[]){1, 2});
    ddl_partition_t *Py = ddl_test_partition_range(2, 2, (int[]){1, 2});
    ddl_partition_t *Pw = ddl_test_partition_range(0, 2, (int[]){2, 2});
    ddl_layer_t     *L  = NULL;
    ddl_tensor_t    *x = NULL, *y = NULL, *dx = NULL, *wrong = NULL;
    ASSERT_OK(ddl_linear_create(Px, Py, Pw, DDL_F64, 3, 7, 5, true, &L));
    ASSERT_OK(ddl_tensor_create(DDL_F64, ddl_layer_x_shape(L), &x));
    ASSERT_OK(ddl_tensor_create(DDL_F64, ddl_layer_y_shape(L), &y));
    ASSERT_OK(ddl_tensor_create(DDL_F64, ddl_layer_x_shape(L), &dx));
    ASSERT_OK(ddl_tensor_create(DDL_F64, &(ddl_shape){.ndim = 2, .d = {2, 2}}, &wrong));
    ASSERT_STATUS(ddl_layer_forward(L, ddl_test_rank == 3 ? wrong : x, y), DDL_ESHAPE);
    ASSERT_TRUE(strstr(ddl_last_error(), "input has local shape [2, 2]") != NULL);
    ASSERT_OK(ddl_layer_forward(L, x, y));
    ASSERT_STATUS(ddl_layer_backward(L, y, ddl_test_rank == 0 ? wrong : dx), DDL_ESHAPE);
    ASSERT_TRUE(strstr(ddl_last_error(), "input gradient") != NULL);
    ASSERT_OK(ddl_layer_backward(L, y, dx));
    ddl_tensor_destroy(&x);
    ddl_tensor_destroy(&y);
    ddl_tensor_destroy(&dx);
    ddl_tensor_destroy(&wrong);
    ddl_layer_destroy(&L);
    ddl_partition_destroy(&Px);
    ddl_partition_destroy(&Py);
    ddl_partition_destroy(&Pw);
    if (ddl_test_rank == 0) {
        printf("ok one-rank shape error fails every rank\n");
    }
}

int main(int argc, char **argv)
{
    ddl_test_mpi_init(&argc, &argv);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    ddl_partition_t *P0 = ddl_test_partition_range(0, 2, (int[]){1, 1});
    lin_case         c  = {.P0 = P0};

    refusals(P0);

    if (world == 1 || world == 4) {
        // Everything on one rank (DistDL's "sequential" case), plus uneven sizes.
        c = (lin_case){.P0 = P0, .Px = P0, .Py = P0, .Pw = P0, .batch = 1, .in = 12, .out = 6};
        run_case(&c, "sequential [1,1]");
        c = (lin_case){.P0 = P0, .Px = P0, .Py = P0, .Pw = P0, .batch = 3, .in = 5, .out = 7};
        run_case(&c, "sequential [1,1]");
    }
    if (world == 4) {
        one_rank_bad_shape();
        // LeNet's layout: P_w [2, 2] on 0..3, P_x on {0, 1}, P_y on {2, 3}. Uneven splits
        // (7 -> 4, 3 and 5 -> 3, 2), so rank 2 (P_y column 0, P_w row 1) sees two block sizes.
        c = (lin_case){.P0 = P0, .batch = 3, .in = 7, .out = 5};
        c.Px = ddl_test_partition_range(0, 2, (int[]){1, 2});
        c.Py = ddl_test_partition_range(2, 2, (int[]){1, 2});
        c.Pw = ddl_test_partition_range(0, 2, (int[]){2, 2});
        run_case(&c, "lenet P_x {0,1} P_y {2,3} P_w [2,2]");
        free_case(&c);

        // Overlapping and shifted: P_x {0, 1}, P_y {1, 2}, P_w [2, 2] on 0..3.
        c    = (lin_case){.P0 = P0, .batch = 2, .in = 9, .out = 11};
        c.Px = ddl_test_partition_range(0, 2, (int[]){1, 2});
        c.Py = ddl_test_partition_range(1, 2, (int[]){1, 2});
        c.Pw = ddl_test_partition_range(0, 2, (int[]){2, 2});
        run_case(&c, "overlap P_x {0,1} P_y {1,2} P_w [2,2]");
        free_case(&c);

        // Reordered ranks: P_x {3, 2}, P_y {1, 0}, P_w [2, 2] on 3, 1, 2, 0.
        c    = (lin_case){.P0 = P0, .batch = 2, .in = 6, .out = 4};
        c.Px = partition_of(2, (int[]){3, 2}, 1, 2);
        c.Py = partition_of(2, (int[]){1, 0}, 1, 2);
        c.Pw = partition_of(4, (int[]){3, 1, 2, 0}, 2, 2);
        run_case(&c, "reordered P_x {3,2} P_y {1,0} P_w {3,1,2,0}");
        free_case(&c);

        // Disjoint: P_x {0}, P_w [2, 1] on {1, 2}, P_y [1, 2] on {2, 3}.
        c    = (lin_case){.P0 = P0, .batch = 2, .in = 5, .out = 3};
        c.Px = ddl_test_partition_range(0, 2, (int[]){1, 1});
        c.Pw = ddl_test_partition_range(1, 2, (int[]){2, 1});
        c.Py = ddl_test_partition_range(2, 2, (int[]){1, 2});
        run_case(&c, "disjoint P_x {0} P_w {1,2} P_y {2,3}");
        free_case(&c);

        // Idle ranks 0 and 3: P_x = P_w = {1}, P_y = {2}.
        c    = (lin_case){.P0 = P0, .batch = 2, .in = 4, .out = 3};
        c.Px = ddl_test_partition_range(1, 2, (int[]){1, 1});
        c.Pw = c.Px;
        c.Py = ddl_test_partition_range(2, 2, (int[]){1, 1});
        run_case(&c, "idle ranks 0, 3: P_x = P_w {1}, P_y {2}");
        free_case(&c);

        // More input pieces than input features: 3 over 4 gives 1, 1, 1, 0.
        c    = (lin_case){.P0 = P0, .batch = 2, .in = 3, .out = 5};
        c.Px = ddl_test_partition_range(0, 2, (int[]){1, 4});
        c.Pw = c.Px;
        c.Py = ddl_test_partition_range(0, 2, (int[]){1, 1});
        run_case(&c, "empty piece P_x = P_w [1,4], in 3");
        free_case(&c);
    }
    if (world == 12) {
        // DistDL's "distributed" case: P_x 4..7 [1, 4], P_y 0..2 [1, 3], P_w 0..11 [3, 4].
        c    = (lin_case){.P0 = P0, .batch = 1, .in = 12, .out = 6};
        c.Px = ddl_test_partition_range(4, 2, (int[]){1, 4});
        c.Py = ddl_test_partition_range(0, 2, (int[]){1, 3});
        c.Pw = ddl_test_partition_range(0, 2, (int[]){3, 4});
        run_case(&c, "distdl P_x 4..7 P_y 0..2 P_w 0..11");
        // The same partitions with uneven splits (13 -> 4,3,3,3; 7 -> 3,2,2).
        c.batch = 2;
        c.in    = 13;
        c.out   = 7;
        run_case(&c, "distdl P_x 4..7 P_y 0..2 P_w 0..11, uneven");
        free_case(&c);
    }
    ddl_partition_destroy(&P0);
    return ddl_test_mpi_finalize();
}
