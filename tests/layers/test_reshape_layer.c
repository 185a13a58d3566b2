// Repartition layer, Flatten and activation layer tests.
//  - Repartition and Flatten: adjoint, sequential equivalence, gradcheck, and exact
//    values: x holds each element's global flat index, so y must hold the flat indices
//    of the balanced output layout (Flatten keeps row-major flat indices), and backward
//    must bring them back; Flatten with and without the rebalancing Repartition
//    (C = 10 over 4 channel pieces: features 75,75,50,50 -> 63,63,62,62).
//  - Activations (ReLU, LeakyReLU, Sigmoid, Tanh, GELU) on 2-D and 3-D partitions:
//    sequential equivalence and gradcheck.
//  - Dropout: the mask equals [U(seed, k, global index) >= p] for the k-th training
//    forward on every partition (exactly), the sequential twin agrees, backward applies
//    the forward's mask, eval mode is the identity, nothing is allocated per step.
//  - Refusals.
#include <string.h>

#include "ddl/base.h"
#include "layer_test.h"

static int world;

// A partition of world ranks [0, prod(shape)) with the given shape.
static ddl_partition_t *part(int ndim, const int *shape)
{
    return ddl_test_partition_range(0, ndim, shape);
}

// rank 0 alone, [1, ..., 1] with ndim dims.
static ddl_partition_t *part0(int ndim)
{
    int ones[DDL_MAX_DIMS];
    for (int d = 0; d < ndim; d++) {
        ones[d] = 1;
    }
    return ddl_test_partition_range(0, ndim, ones);
}

// Global row-major flat index of local element k of the piece at global box b.
static int64_t global_flat(const ddl_box *b, const ddl_shape *g, int64_t k)
{
    int64_t coord[DDL_MAX_DIMS];
    for (int d = b->ndim - 1; d >= 0; d--) {
        int64_t ext = b->stop[d] - b->start[d];
        coord[d]    = b->start[d] + k % ext;
        k /= ext;
    }
    int64_t f = 0;
    for (int d = 0; d < g->ndim; d++) {
        f = f * g->d[d] + coord[d];
    }
    return f;
}

// ---- data-movement layers: exact flat indices ----------------------------------------

// x[i] = flat index; y must be the flat indices of the y layout (same global order), and
// backward of dy = flat indices must give x's flat indices back. Also: no allocation.
static void exact_indices(ddl_layer_builder *b, ddl_dtype dt, const char *name)
{
    ddl_layer_t *L = NULL;
    ASSERT_OK(b->build(b->ctx, false, dt, &L));
    ddl_box       xb = ddl_partition_local_box(ddl_layer_P_in(L), ddl_layer_x_global(L));
    ddl_box       yb = ddl_partition_local_box(ddl_layer_P_out(L), ddl_layer_y_global(L));
    ddl_tensor_t *x, *y, *dy, *dx;
    ASSERT_OK(ddl_tensor_create(dt, ddl_layer_x_shape(L), &x));
    ASSERT_OK(ddl_tensor_create(dt, ddl_layer_y_shape(L), &y));
    ASSERT_OK(ddl_tensor_create(dt, ddl_layer_y_shape(L), &dy));
    ASSERT_OK(ddl_tensor_create(dt, ddl_layer_x_shape(L), &dx));
    ASSERT_EQ(ddl_box_numel(&xb), ddl_tensor_numel(x));
    ASSERT_EQ(ddl_box_numel(&yb), ddl_tensor_numel(y));
    for (int64_t k = 0; k < ddl_tensor_numel(x); k++) {
        ddl_tensor_set(x, k, (double)global_flat(&xb, ddl_layer_x_global(L), k));
    }
    for (int64_t k = 0; k < ddl_tensor_numel(dy); k++) {
        ddl_tensor_set(dy, k, (double)global_flat(&yb, ddl_layer_y_global(L), k));
    }
    uint64_t before = ddl_alloc_count();
    ASSERT_OK(ddl_layer_forward(L, x, y));
    ASSERT_OK(ddl_layer_backward(L, dy, dx));
    ASSERT_EQ(ddl_alloc_count(), before);
    for (int64_t k = 0; k < ddl_tensor_numel(y); k++) {
        ASSERT_EQ(ddl_tensor_get(y, k), global_flat(&yb, ddl_layer_y_global(L), k));
    }
    for (int64_t k = 0; k < ddl_tensor_numel(dx); k++) {
        ASSERT_EQ(ddl_tensor_get(dx, k), global_flat(&xb, ddl_layer_x_global(L), k));
    }
    ddl_tensor_destroy(&x);
    ddl_tensor_destroy(&y);
    ddl_tensor_destroy(&dy);
    ddl_tensor_destroy(&dx);
    ddl_layer_destroy(&L);
    if (ddl_test_rank == 0) {
        printf("ok exact %s (%s)\n", name, ddl_dtype_name(dt));
    }
}

static void run_movement(ddl_layer_builder *b, const char *name)
{
    layer_test_run(name, b, true, true);
    exact_indices(b, DDL_F64, name);
    exact_indices(b, DDL_F32, name);
}

// ---- Repartition ---------------------------------------------------------------------

typedef struct rep_case {
    ddl_partition_t *Px, *Py, *P0;
    ddl_shape        g;
} rep_case;

static ddl_status build_rep(void *ctx, bool seq, ddl_dtype dt, ddl_layer_t **out)
{
    rep_case *c = ctx;
    return seq ? ddl_repartition_layer_create(c->P0, c->P0, dt, &c->g, out)
               : ddl_repartition_layer_create(c->Px, c->Py, dt, &c->g, out);
}

static void repartition_tests(void)
{
    ddl_partition_t  *P0  = part0(2);
    rep_case          c   = {.P0 = P0, .g = ddl_shape_make(2, (int64_t[]){5, 7})};
    ddl_layer_builder bld = {.build = build_rep, .ctx = &c, .seed = 3};
    if (world == 1) {
        c.Px = c.Py = P0;
        run_movement(&bld, "repartition [1,1] -> [1,1]");
    }
    if (world == 4) {
        ddl_partition_t *P22 = part(2, (int[]){2, 2}), *P41 = part(2, (int[]){4, 1});
        ddl_partition_t *P14 = part(2, (int[]){1, 4});
        ddl_partition_t *Q   = ddl_test_partition_range(2, 2, (int[]){2, 1});
        c.Px = P22, c.Py = P41;
        run_movement(&bld, "repartition [2,2] -> [4,1]");
        c.Px = P14, c.Py = Q;
        run_movement(&bld, "repartition [1,4] -> {2,3} [2,1]");
        c.Px = P0, c.Py = P22;
        run_movement(&bld, "repartition scatter {0} -> [2,2]");
        ddl_partition_t *R3 = ddl_test_partition_range(3, 2, (int[]){1, 1});
        c.Px = P22, c.Py = R3;
        run_movement(&bld, "repartition gather [2,2] -> {3}");
        ddl_partition_destroy(&P22);
        ddl_partition_destroy(&P41);
        ddl_partition_destroy(&P14);
        ddl_partition_destroy(&Q);
        ddl_partition_destroy(&R3);
    }
    // Refusals: dims of the partitions vs the tensor.
    ddl_layer_t *L  = NULL;
    ddl_shape    g3 = ddl_shape_make(3, (int64_t[]){2, 3, 4});
    ASSERT_STATUS(ddl_repartition_layer_create(P0, P0, DDL_F64, &g3, &L), DDL_EINVAL);
    ASSERT_STATUS(ddl_repartition_layer_create(P0, NULL, DDL_F64, &c.g, &L), DDL_EINVAL);
    ASSERT_TRUE(L == NULL);
    ddl_partition_destroy(&P0);
}

// ---- Flatten -------------------------------------------------------------------------

typedef struct flat_case {
    ddl_partition_t *Px, *Py, *P0x, *P0y;
    ddl_shape        g;
} flat_case;

static ddl_status build_flat(void *ctx, bool seq, ddl_dtype dt, ddl_layer_t **out)
{
    flat_case *c = ctx;
    return seq ? ddl_flatten_create(c->P0x, c->P0y, dt, &c->g, out)
               : ddl_flatten_create(c->Px, c->Py, dt, &c->g, out);
}

static void flatten_case(int nd, const int *pshape, const int64_t *g, const char *name)
{
    flat_case c = {.g = ddl_shape_make(nd, g)};
    c.Px        = part(nd, pshape);
    c.Py        = part(2, pshape);
    c.P0x       = part0(nd);
    c.P0y       = part0(2);
    ddl_layer_builder bld = {.build = build_flat, .ctx = &c, .seed = 5};
    run_movement(&bld, name);
    ddl_partition_destroy(&c.Px);
    ddl_partition_destroy(&c.Py);
    ddl_partition_destroy(&c.P0x);
    ddl_partition_destroy(&c.P0y);
}

static void flatten_refusals(void)
{
    ddl_layer_t *L   = NULL;
    ddl_shape    g   = ddl_shape_make(4, (int64_t[]){2, 4, 3, 3});
    ddl_partition_t *P0x = part0(4), *P0y = part0(2), *P03 = part0(3);
    ASSERT_STATUS(ddl_flatten_create(P0x, P03, DDL_F64, &g, &L), DDL_EINVAL);  // P_y not 2-D
    ASSERT_STATUS(ddl_flatten_create(P03, P0y, DDL_F64, &g, &L), DDL_EINVAL);  // dims differ
    ddl_shape g1 = ddl_shape_make(1, (int64_t[]){5});
    ddl_partition_t *P01 = part0(1);
    ASSERT_STATUS(ddl_flatten_create(P01, P0y, DDL_F64, &g1, &L), DDL_EINVAL);  // no channels
    if (world >= 2) {
        // A spatial split of P_x is refused; so are P_y with other ranks or another shape.
        ddl_partition_t *Ps  = part(4, (int[]){1, 1, 2, 1});
        ddl_partition_t *P12 = part(2, (int[]){1, 2}), *P21 = part(2, (int[]){2, 1});
        ddl_partition_t *Pc  = part(4, (int[]){1, 2, 1, 1});
        ddl_partition_t *Q   = NULL;
        ASSERT_OK(ddl_partition_create(MPI_COMM_WORLD, 2, (int[]){1, 0}, 2, (int[]){1, 2}, &Q));
        ASSERT_STATUS(ddl_flatten_create(Ps, P21, DDL_F64, &g, &L), DDL_EINVAL);
        ASSERT_STATUS(ddl_flatten_create(Pc, P21, DDL_F64, &g, &L), DDL_EINVAL);
        ASSERT_STATUS(ddl_flatten_create(Pc, Q, DDL_F64, &g, &L), DDL_EINVAL);
        ASSERT_OK(ddl_flatten_create(Pc, P12, DDL_F64, &g, &L));
        ddl_layer_destroy(&L);
        ddl_partition_destroy(&Ps);
        ddl_partition_destroy(&P12);
        ddl_partition_destroy(&P21);
        ddl_partition_destroy(&Pc);
        ddl_partition_destroy(&Q);
    }
    ASSERT_TRUE(L == NULL);
    ddl_partition_destroy(&P0x);
    ddl_partition_destroy(&P0y);
    ddl_partition_destroy(&P03);
    ddl_partition_destroy(&P01);
    if (ddl_test_rank == 0) {
        printf("ok flatten refusals\n");
    }
}

static void flatten_tests(void)
{
    if (world == 1) {
        flatten_case(4, (int[]){1, 1, 1, 1}, (int64_t[]){2, 3, 4, 5}, "flatten [1,1,1,1]");
        flatten_case(2, (int[]){1, 1}, (int64_t[]){3, 4}, "flatten [N, C] (no spatial dims)");
    }
    if (world == 4) {
        // C = 10 over 4: channels 3,3,2,2 -> features 75,75,50,50 -> rebalanced 63,63,62,62.
        flatten_case(4, (int[]){1, 4, 1, 1}, (int64_t[]){2, 10, 5, 5},
                     "flatten [1,4,1,1] C=10 S=25 (rebalanced)");
        // Channels 2,2 -> features 6,6: already balanced, a local reshape.
        flatten_case(3, (int[]){2, 2, 1}, (int64_t[]){5, 4, 3}, "flatten [2,2,1] (balanced)");
        // Batch split too, channels 3,2 -> features 18,12 -> 15,15.
        flatten_case(4, (int[]){2, 2, 1, 1}, (int64_t[]){3, 5, 2, 3},
                     "flatten [2,2,1,1] C=5 S=6 (rebalanced)");
        // A piece with no channels: 3 over 4 -> 1,1,1,0 channels; features 2,2,2,0 -> 2,2,1,1.
        flatten_case(3, (int[]){1, 4, 1}, (int64_t[]){2, 3, 2},
                     "flatten [1,4,1] C=3 (empty piece, rebalanced)");
    }
    flatten_refusals();
}

// ---- activations ---------------------------------------------------------------------

typedef struct act_case {
    ddl_partition_t *P, *P0;
    ddl_shape        g;
    ddl_act_kind     kind;
    double           alpha;
    uint64_t         seed;
} act_case;

static ddl_status build_act(void *ctx, bool seq, ddl_dtype dt, ddl_layer_t **out)
{
    act_case *c = ctx;
    return ddl_activation_create(seq ? c->P0 : c->P, dt, &c->g, c->kind, c->alpha, c->seed, out);
}

static const char *act_names[] = {"relu", "leaky_relu", "sigmoid", "tanh", "gelu", "dropout"};

// Dropout: exact mask by global index, backward with the same mask, a new mask per
// training forward, identity in eval mode, no allocation per step.
static void dropout_exact(act_case *c, ddl_dtype dt)
{
    ddl_layer_t *L = NULL;
    ASSERT_OK(build_act(c, false, dt, &L));
    ddl_box       b = ddl_partition_local_box(ddl_layer_P_in(L), ddl_layer_x_global(L));
    ddl_tensor_t *x, *y, *dy, *dx;
    ASSERT_OK(ddl_tensor_create(dt, ddl_layer_x_shape(L), &x));
    ASSERT_OK(ddl_tensor_create(dt, ddl_layer_x_shape(L), &y));
    ASSERT_OK(ddl_tensor_create(dt, ddl_layer_x_shape(L), &dy));
    ASSERT_OK(ddl_tensor_create(dt, ddl_layer_x_shape(L), &dx));
    ddl_fill_global_uniform(x, &b, ddl_layer_x_global(L), 11, 1);
    ddl_fill_global_uniform(dy, &b, ddl_layer_x_global(L), 11, 2);
    int64_t n     = ddl_tensor_numel(x);
    double  p     = c->alpha, scale = 1.0 / (1.0 - p);
    double  tol   = dt == DDL_F64 ? 1e-15 : 1e-6;
    int64_t kept  = 0;
    int64_t diffs = 0;  // elements whose mask differs between streams 0 and 1
    for (uint64_t k = 0; k < 3; k++) {
        uint64_t before = ddl_alloc_count();
        ASSERT_OK(ddl_layer_forward(L, x, y));
        ASSERT_OK(ddl_layer_backward(L, dy, dx));
        ASSERT_EQ(ddl_alloc_count(), before);
        for (int64_t i = 0; i < n; i++) {
            uint64_t gi    = (uint64_t)global_flat(&b, ddl_layer_x_global(L), i);
            bool     keep  = ddl_rng_uniform(c->seed, k, gi) >= p;
            bool     keep0 = ddl_rng_uniform(c->seed, 0, gi) >= p;
            ASSERT_NEAR(ddl_tensor_get(y, i), keep ? ddl_tensor_get(x, i) * scale : 0.0, tol);
            ASSERT_NEAR(ddl_tensor_get(dx, i), keep ? ddl_tensor_get(dy, i) * scale : 0.0, tol);
            kept += k == 0 && keep;
            diffs += k == 1 && keep != keep0;
        }
    }
    // Eval mode: the identity both ways.
    ddl_layer_set_training(L, false);
    ASSERT_OK(ddl_layer_forward(L, x, y));
    ASSERT_OK(ddl_layer_backward(L, dy, dx));
    for (int64_t i = 0; i < n; i++) {
        ASSERT_TRUE(ddl_tensor_get(y, i) == ddl_tensor_get(x, i));
        ASSERT_TRUE(ddl_tensor_get(dx, i) == ddl_tensor_get(dy, i));
    }
    // Globally some elements are kept, some dropped, and the masks of steps 0 and 1 differ.
    int64_t loc[3] = {kept, n, diffs}, glob[3];
    MPI_Allreduce(loc, glob, 3, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    ASSERT_TRUE(glob[0] > 0 && glob[0] < glob[1]);
    ASSERT_TRUE(glob[2] > 0);
    ASSERT_EQ(glob[1], ddl_shape_numel(ddl_layer_x_global(L)));
    ddl_tensor_destroy(&x);
    ddl_tensor_destroy(&y);
    ddl_tensor_destroy(&dy);
    ddl_tensor_destroy(&dx);
    ddl_layer_destroy(&L);
}

static void activation_case(int nd, const int *pshape, const int64_t *g)
{
    act_case c = {.g = ddl_shape_make(nd, g), .seed = 99};
    c.P        = part(nd, pshape);
    c.P0       = part0(nd);
    char shp[64], buf[160];
    ddl_shape ps = {.ndim = nd};
    for (int d = 0; d < nd; d++) {
        ps.d[d] = pshape[d];
    }
    ddl_shape_str(&ps, shp, sizeof shp);
    for (int k = DDL_ACT_RELU; k <= DDL_ACT_DROPOUT; k++) {
        c.kind  = (ddl_act_kind)k;
        c.alpha = k == DDL_ACT_LEAKY_RELU ? 0.1 : (k == DDL_ACT_DROPOUT ? 0.3 : 0.0);
        snprintf(buf, sizeof buf, "%s on P %s", act_names[k], shp);
        ddl_layer_builder bld = {.build = build_act, .ctx = &c, .seed = 7, .training = true};
        if (k == DDL_ACT_DROPOUT) {
            // Training dropout draws a new mask per forward, so the finite differences
            // (many forwards) do not apply; the sequential check runs one forward on
            // each side, which must draw the same mask on any partition.
            layer_test_run(buf, &bld, false, false);
            dropout_exact(&c, DDL_F64);
            dropout_exact(&c, DDL_F32);
            bld.training = false;
            snprintf(buf, sizeof buf, "dropout (eval) on P %s", shp);
            layer_test_run(buf, &bld, true, true);
        } else {
            layer_test_run(buf, &bld, false, true);
        }
    }
    ddl_partition_destroy(&c.P);
    ddl_partition_destroy(&c.P0);
}

static void activation_tests(void)
{
    if (world == 1) {
        activation_case(2, (int[]){1, 1}, (int64_t[]){5, 6});
    }
    if (world == 4) {
        activation_case(2, (int[]){2, 2}, (int64_t[]){5, 6});
        activation_case(3, (int[]){1, 2, 2}, (int64_t[]){3, 5, 4});
        activation_case(3, (int[]){4, 1, 1}, (int64_t[]){6, 3, 2});  // whole-block runs
    }
    ddl_partition_t *P0 = part0(2);
    ddl_layer_t     *L  = NULL;
    ddl_shape        g  = ddl_shape_make(2, (int64_t[]){2, 3});
    ddl_shape        g3 = ddl_shape_make(3, (int64_t[]){2, 3, 4});
    ASSERT_STATUS(ddl_activation_create(P0, DDL_F64, &g, DDL_ACT_DROPOUT, 1.5, 1, &L), DDL_EINVAL);
    ASSERT_STATUS(ddl_activation_create(P0, DDL_F64, &g, DDL_ACT_DROPOUT, -0.1, 1, &L), DDL_EINVAL);
    ASSERT_STATUS(ddl_activation_create(P0, DDL_F64, &g, (ddl_act_kind)17, 0.0, 1, &L), DDL_EINVAL);
    ASSERT_STATUS(ddl_activation_create(P0, DDL_F64, &g3, DDL_ACT_RELU, 0.0, 1, &L), DDL_EINVAL);
    ASSERT_STATUS(ddl_activation_create(P0, DDL_F64, &g, DDL_ACT_LEAKY_RELU, INFINITY, 1, &L),
                  DDL_EINVAL);
    ASSERT_TRUE(L == NULL);
    ddl_partition_destroy(&P0);
}

int main(int argc, char **argv)
{
    ddl_test_mpi_init(&argc, &argv);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    repartition_tests();
    flatten_tests();
    activation_tests();
    return ddl_test_mpi_finalize();
}
