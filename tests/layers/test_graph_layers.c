// tests/layers/test_graph_layers.c: the layers a graph model adds to a chain: Add
// (residual), Concat along the channels (U-Net skips) and global average pooling.
//
// All three are linear: each case runs the adjoint test, sequential equivalence (the
// layer on its partition against the same layer on rank 0 alone, gathered) and the
// finite-difference gradient check of layer_test.h, plus a steady-state run (a second
// forward/backward allocates nothing and repeats the first) and a check of the values
// against loops written here on one rank (sequential equivalence alone would accept a
// layer that is wrong the same way on every partition). Then the validation errors and
// the framework's multi-input entry points: arity, input shapes, and a wrong tensor on
// one rank failing every rank.
#include <math.h>
#include <string.h>

#include "ddl/base.h"
#include "ddl/kernels_pointwise.h"
#include "layer_test.h"

#define MAXD 5

typedef enum { G_ADD, G_CONCAT, G_GAP } gkind;

typedef struct gcase {
    const char *name;
    gkind       kind;
    int         nd;
    int         n;       // operands (add, concat)
    int64_t     x[MAXD]; // global shape (concat: dim 1 comes from ch)
    int64_t     ch[4];   // concat: channels of each operand
    int         first;   // first world rank of P_x
    int         shape[MAXD];
} gcase;

typedef struct gctx {
    const gcase     *gc;
    ddl_partition_t *P_x, *P_seq;
} gctx;

static int world_size(void)
{
    int n;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
}

static ddl_shape operand_shape(const gcase *gc, int k)
{
    ddl_shape s = ddl_shape_make(gc->nd, gc->x);
    if (gc->kind == G_CONCAT) {
        s.d[1] = gc->ch[k];
    }
    return s;
}

static ddl_status build_graph(void *ctx, bool seq, ddl_dtype dt, ddl_layer_t **out)
{
    const gctx      *t  = ctx;
    const gcase     *gc = t->gc;
    ddl_partition_t *P  = seq ? t->P_seq : t->P_x;
    ddl_shape        xg = operand_shape(gc, 0);
    switch (gc->kind) {
    case G_ADD:
        return ddl_add_create(P, dt, &xg, gc->n, out);
    case G_CONCAT: {
        ddl_shape g[4];
        for (int k = 0; k < gc->n; k++) {
            g[k] = operand_shape(gc, k);
        }
        return ddl_concat_create(P, dt, gc->n, g, out);
    }
    case G_GAP:
        return ddl_global_avgpool_create(P, dt, &xg, out);
    }
    return DDL_EINTERNAL;
}

// ---- helpers over the inputs of a layer (one or several) ----------------------------

static void make_inputs(ddl_layer_t *L, ddl_tensor_t **x, ddl_tensor_t **dx, uint64_t stream)
{
    for (int k = 0; k < ddl_layer_num_inputs(L); k++) {
        ddl_shape s = ddl_layer_input_shape(L, k), g = ddl_layer_input_global(L, k);
        ddl_box   b = ddl_partition_local_box(ddl_layer_P_in(L), &g);
        ASSERT_OK(ddl_tensor_create(DDL_F64, &s, &x[k]));
        ASSERT_OK(ddl_tensor_create(DDL_F64, &s, &dx[k]));
        ddl_fill_global_uniform(x[k], &b, &g, 5, stream + (uint64_t)k);
    }
}

static void free_all(int n, ddl_tensor_t **ts)
{
    for (int k = 0; k < n; k++) {
        ddl_tensor_destroy(&ts[k]);
    }
}

static void run_fb(ddl_layer_t *L, ddl_tensor_t **x, ddl_tensor_t *y, const ddl_tensor_t *dy,
                   ddl_tensor_t **dx)
{
    int n = ddl_layer_num_inputs(L);
    if (n == 1) {
        ASSERT_OK(ddl_layer_forward(L, x[0], y));
        ASSERT_OK(ddl_layer_backward(L, dy, dx[0]));
    } else {
        ASSERT_OK(ddl_layer_forward_n(L, n, (const ddl_tensor_t *const *)x, y));
        ASSERT_OK(ddl_layer_backward_n(L, dy, n, dx));
    }
}

static ddl_tensor_t *random_output(const ddl_layer_t *L, uint64_t stream)
{
    ddl_tensor_t *t = NULL;
    ASSERT_OK(ddl_tensor_create(DDL_F64, ddl_layer_y_shape(L), &t));
    ddl_box b = ddl_partition_local_box(ddl_layer_P_out(L), ddl_layer_y_global(L));
    ddl_fill_global_uniform(t, &b, ddl_layer_y_global(L), 5, stream);
    return t;
}

// ---- steady state: a second forward/backward allocates nothing and repeats the first -

static void check_steady(const char *name, gctx *t)
{
    ddl_layer_t *L = NULL;
    ASSERT_OK(build_graph(t, false, DDL_F64, &L));
    int           n    = ddl_layer_num_inputs(L);
    ddl_tensor_t *x[4] = {0}, *dx[4] = {0}, *dx2[4] = {0}, *y = NULL, *y2 = NULL;
    make_inputs(L, x, dx, 10);
    for (int k = 0; k < n; k++) {
        ddl_shape s = ddl_layer_input_shape(L, k);
        ASSERT_OK(ddl_tensor_create(DDL_F64, &s, &dx2[k]));
    }
    ddl_tensor_t *dy = random_output(L, 20);
    ASSERT_OK(ddl_tensor_create(DDL_F64, ddl_layer_y_shape(L), &y));
    ASSERT_OK(ddl_tensor_create(DDL_F64, ddl_layer_y_shape(L), &y2));
    run_fb(L, x, y, dy, dx);
    // dx2 starts filled with garbage: backward must overwrite it.
    for (int k = 0; k < n; k++) {
        for (int64_t i = 0; i < ddl_tensor_numel(dx2[k]); i++) {
            ddl_tensor_set(dx2[k], i, 1e6);
        }
    }
    uint64_t allocs = ddl_alloc_count();
    run_fb(L, x, y2, dy, dx2);
    ASSERT_EQ(ddl_alloc_count(), allocs);
    double e = layer_test_max_diff(y, y2);
    for (int k = 0; k < n; k++) {
        e = fmax(e, layer_test_max_diff(dx[k], dx2[k]));
    }
    if (e != 0.0) {
        TEST_FAIL_("%s: a second forward/backward differs from the first by %.3e", name, e);
    }
    free_all(n, x);
    free_all(n, dx);
    free_all(n, dx2);
    ddl_tensor_destroy(&y);
    ddl_tensor_destroy(&y2);
    ddl_tensor_destroy(&dy);
    ddl_layer_destroy(&L);
}

// ---- values on one rank against loops written here --------------------------------

static void check_values(const char *name, gctx *t)
{
    const gcase *gc = t->gc;
    ddl_layer_t *L  = NULL;
    ASSERT_OK(build_graph(t, true, DDL_F64, &L));
    int           n    = ddl_layer_num_inputs(L);
    ddl_tensor_t *x[4] = {0}, *dx[4] = {0}, *y = NULL;
    make_inputs(L, x, dx, 30);
    ddl_tensor_t *dy = random_output(L, 40);
    ASSERT_OK(ddl_tensor_create(DDL_F64, ddl_layer_y_shape(L), &y));
    run_fb(L, x, y, dy, dx);
    ASSERT_EQ(n, gc->kind == G_GAP ? 1 : gc->n);
    if (ddl_test_rank == 0) {
        double    e  = 0.0;
        ddl_shape xg = operand_shape(gc, 0);
        int64_t   N = xg.d[0], R = 1; // R: the elements after dim 1
        for (int d = 2; d < gc->nd; d++) {
            R *= xg.d[d];
        }
        if (gc->kind == G_ADD) {
            for (int64_t i = 0; i < ddl_tensor_numel(y); i++) {
                double want = 0.0;
                for (int k = 0; k < n; k++) {
                    want += ddl_tensor_get(x[k], i);
                    e = fmax(e, fabs(ddl_tensor_get(dx[k], i) - ddl_tensor_get(dy, i)));
                }
                e = fmax(e, fabs(ddl_tensor_get(y, i) - want));
            }
        } else if (gc->kind == G_CONCAT) {
            int64_t C = ddl_layer_y_global(L)->d[1], o = 0;
            for (int k = 0; k < n; k++) {
                int64_t Ck = gc->ch[k];
                for (int64_t a = 0; a < N; a++) {
                    for (int64_t c = 0; c < Ck; c++) {
                        for (int64_t r = 0; r < R; r++) {
                            int64_t iy = (a * C + o + c) * R + r, ix = (a * Ck + c) * R + r;
                            e = fmax(e, fabs(ddl_tensor_get(y, iy) - ddl_tensor_get(x[k], ix)));
                            e = fmax(e, fabs(ddl_tensor_get(dx[k], ix) - ddl_tensor_get(dy, iy)));
                        }
                    }
                }
                o += Ck;
            }
            ASSERT_EQ(o, C);
        } else {
            int64_t C = xg.d[1];
            for (int64_t i = 0; i < N * C; i++) {
                double sum = 0.0;
                for (int64_t r = 0; r < R; r++) {
                    sum += ddl_tensor_get(x[0], i * R + r);
                    e = fmax(e, fabs(ddl_tensor_get(dx[0], i * R + r) -
                                     ddl_tensor_get(dy, i) / (double)R));
                }
                e = fmax(e, fabs(ddl_tensor_get(y, i) - sum / (double)R));
            }
        }
        if (!(e <= 1e-14)) {
            TEST_FAIL_("%s: values differ from the reference loops by %.3e", name, e);
        }
    }
    free_all(n, x);
    free_all(n, dx);
    ddl_tensor_destroy(&y);
    ddl_tensor_destroy(&dy);
    ddl_layer_destroy(&L);
}

static void run_case(const gcase *gc)
{
    int n = 1;
    for (int i = 0; i < gc->nd; i++) {
        n *= gc->shape[i];
    }
    if (gc->first + n > world_size()) {
        return; // the layout needs more ranks than this run has
    }
    int  ones[MAXD]     = {1, 1, 1, 1, 1};
    gctx t              = {.gc = gc};
    t.P_x               = ddl_test_partition_range(gc->first, gc->nd, gc->shape);
    t.P_seq             = ddl_test_partition_range(0, gc->nd, ones);
    ddl_layer_builder b = {.build = build_graph, .ctx = &t, .seed = 17, .training = true};
    layer_test_run(gc->name, &b, true, true);
    check_steady(gc->name, &t);
    check_values(gc->name, &t);
    ddl_partition_destroy(&t.P_x);
    ddl_partition_destroy(&t.P_seq);
}

static const gcase cases[] = {
    {"add2 serial", G_ADD, 4, 2, {2, 3, 5, 4}, {0}, 0, {1, 1, 1, 1}},
    {"add2 [1,1,2,2]", G_ADD, 4, 2, {2, 3, 6, 5}, {0}, 0, {1, 1, 2, 2}},
    {"add3 [1,1,1,2]", G_ADD, 4, 3, {2, 3, 6, 5}, {0}, 0, {1, 1, 1, 2}},
    {"add2 [2,1,1,1]", G_ADD, 4, 2, {3, 2, 4, 4}, {0}, 0, {2, 1, 1, 1}},
    {"add4 [2,2] 2-d", G_ADD, 2, 4, {5, 7}, {0}, 0, {2, 2}},
    {"add2 subset ranks 2..3", G_ADD, 4, 2, {2, 3, 5, 5}, {0}, 2, {1, 1, 1, 2}},
    {"concat2 serial", G_CONCAT, 4, 2, {2, 0, 5, 4}, {3, 2}, 0, {1, 1, 1, 1}},
    {"concat2 [1,1,2,2]", G_CONCAT, 4, 2, {2, 0, 6, 5}, {3, 4}, 0, {1, 1, 2, 2}},
    {"concat3 [1,1,1,2]", G_CONCAT, 4, 3, {2, 0, 6, 5}, {2, 1, 3}, 0, {1, 1, 1, 2}},
    {"concat2 [2,1,1,1]", G_CONCAT, 4, 2, {3, 0, 4, 4}, {2, 5}, 0, {2, 1, 1, 1}},
    {"concat2 3-d subset ranks 1..3", G_CONCAT, 5, 2, {1, 0, 4, 3, 5}, {2, 3}, 1, {1, 1, 1, 1, 3}},
    {"global_avgpool serial", G_GAP, 4, 0, {2, 3, 5, 4}, {0}, 0, {1, 1, 1, 1}},
    {"global_avgpool [1,1,2,2]", G_GAP, 4, 0, {2, 3, 6, 5}, {0}, 0, {1, 1, 2, 2}},
    {"global_avgpool [1,1,1,2]", G_GAP, 4, 0, {2, 3, 6, 5}, {0}, 0, {1, 1, 1, 2}},
    {"global_avgpool [2,1,1,1]", G_GAP, 4, 0, {3, 2, 4, 4}, {0}, 0, {2, 1, 1, 1}},
    {"global_avgpool channels and space [1,2,2,1]",
     G_GAP,
     4,
     0,
     {2, 3, 5, 4},
     {0},
     0,
     {1, 2, 2, 1}},
    {"global_avgpool 3-d [1,1,2,1,2]", G_GAP, 5, 0, {1, 2, 4, 3, 5}, {0}, 0, {1, 1, 2, 1, 2}},
    {"global_avgpool 1-d [1,1,4]", G_GAP, 3, 0, {2, 3, 9}, {0}, 0, {1, 1, 4}},
    // Spatial dims of 1 split over 2: half the ranks hold no input at all.
    {"global_avgpool idle ranks [1,1,2,2]", G_GAP, 4, 0, {1, 2, 1, 5}, {0}, 0, {1, 1, 2, 2}},
    {"global_avgpool subset ranks 2..3", G_GAP, 4, 0, {2, 3, 5, 6}, {0}, 2, {1, 1, 1, 2}},
};

// ---- validation and the multi-input framework ---------------------------------------

static void expect_error(ddl_status got, ddl_status want, const char *fragment)
{
    ASSERT_STATUS(got, want);
    if (strstr(ddl_last_error(), fragment) == NULL) {
        TEST_FAIL_("error message \"%s\" does not mention \"%s\"", ddl_last_error(), fragment);
    }
}

static void check_errors(void)
{
    int              W       = world_size();
    int              ones[4] = {1, 1, 1, 1};
    ddl_partition_t *P1      = ddl_test_partition_range(0, 4, ones);
    ddl_shape        xg      = ddl_shape_make(4, (int64_t[]){2, 3, 4, 4});
    ddl_shape        x2      = ddl_shape_make(2, (int64_t[]){2, 3});
    ddl_layer_t     *L       = NULL;
    // Add: fewer than 2 operands; operands of the wrong rank for P_x.
    expect_error(ddl_add_create(P1, DDL_F64, &xg, 1, &L), DDL_EINVAL, "at least 2");
    expect_error(ddl_add_create(P1, DDL_F64, &x2, 2, &L), DDL_EINVAL, "P_x has 4");
    // Concat: shapes that differ outside dim 1, 2-d operands of a 4-d partition.
    ddl_shape g2[2] = {xg, xg};
    g2[1].d[2]      = 5;
    expect_error(ddl_concat_create(P1, DDL_F64, 2, g2, &L), DDL_EINVAL, "dim 2 differs");
    ddl_shape g1[2] = {x2, x2};
    expect_error(ddl_concat_create(P1, DDL_F64, 2, g1, &L), DDL_EINVAL, "P_x has 4");
    // Global pooling needs a spatial dim.
    int              two[2] = {1, 1};
    ddl_partition_t *P2     = ddl_test_partition_range(0, 2, two);
    expect_error(ddl_global_avgpool_create(P2, DDL_F64, &x2, &L), DDL_EINVAL, "spatial");
    ASSERT_TRUE(L == NULL);
    if (W >= 2) {
        // A partition that splits the channels cannot concatenate along them.
        int              cs[4] = {1, 2, 1, 1};
        ddl_partition_t *Pc    = ddl_test_partition_range(0, 4, cs);
        ddl_shape        g[2]  = {xg, xg};
        expect_error(ddl_concat_create(Pc, DDL_F64, 2, g, &L), DDL_EINVAL, "splits dim 1");
        ASSERT_TRUE(L == NULL);
        ddl_partition_destroy(&Pc);
    }

    // Arity: the one-input entry points on a 2-input layer and the reverse, a wrong n.
    ddl_layer_t *A = NULL, *R = NULL;
    ASSERT_OK(ddl_add_create(P1, DDL_F64, &xg, 2, &A));
    ASSERT_OK(ddl_activation_create(P1, DDL_F64, &xg, DDL_ACT_RELU, 0.0, 0, &R));
    ASSERT_EQ(ddl_layer_num_inputs(A), 2);
    ASSERT_EQ(ddl_layer_num_inputs(R), 1);
    ddl_shape s0 = ddl_layer_input_shape(R, 0), s9 = ddl_layer_input_shape(A, 9);
    ASSERT_TRUE(ddl_shape_equal(&s0, ddl_layer_x_shape(R)));
    ASSERT_EQ(ddl_shape_numel(&s9), 0);
    ddl_tensor_t *x[3] = {0}, *y = NULL;
    for (int k = 0; k < 3; k++) {
        ASSERT_OK(ddl_tensor_create(DDL_F64, ddl_layer_x_shape(A), &x[k]));
    }
    ASSERT_OK(ddl_tensor_create(DDL_F64, ddl_layer_y_shape(A), &y));
    expect_error(ddl_layer_forward(A, x[0], y), DDL_EINVAL, "ddl_layer_forward_n");
    expect_error(ddl_layer_backward(A, y, x[0]), DDL_EINVAL, "ddl_layer_backward_n");
    expect_error(ddl_layer_forward_n(R, 1, (const ddl_tensor_t *const *)x, y), DDL_EINVAL,
                 "takes one input");
    expect_error(ddl_layer_backward_n(R, y, 1, x), DDL_EINVAL, "takes one input");
    expect_error(ddl_layer_forward_n(A, 3, (const ddl_tensor_t *const *)x, y), DDL_EINVAL,
                 "given 3 inputs");
    ASSERT_OK(ddl_layer_forward_n(A, 2, (const ddl_tensor_t *const *)x, y));
    ASSERT_OK(ddl_layer_backward_n(A, y, 2, x));
    for (int k = 0; k < 3; k++) {
        ddl_tensor_destroy(&x[k]);
    }
    ddl_tensor_destroy(&y);
    ddl_layer_destroy(&A);
    ddl_layer_destroy(&R);

    // A wrong input 1 on the last rank only: every rank fails alike, nobody hangs.
    int              ws[4] = {1, 1, 1, W};
    ddl_partition_t *PW    = ddl_test_partition_range(0, 4, ws);
    ddl_shape        xw    = ddl_shape_make(4, (int64_t[]){2, 3, 4, 4 * W});
    ASSERT_OK(ddl_add_create(PW, DDL_F64, &xw, 2, &A));
    ddl_shape bad = *ddl_layer_x_shape(A);
    bad.d[3] += ddl_test_rank == W - 1 ? 1 : 0;
    ASSERT_OK(ddl_tensor_create(DDL_F64, ddl_layer_x_shape(A), &x[0]));
    ASSERT_OK(ddl_tensor_create(DDL_F64, &bad, &x[1]));
    ASSERT_OK(ddl_tensor_create(DDL_F64, ddl_layer_y_shape(A), &y));
    expect_error(ddl_layer_forward_n(A, 2, (const ddl_tensor_t *const *)x, y), DDL_ESHAPE,
                 "input 1");
    expect_error(ddl_layer_backward_n(A, y, 2, x), DDL_ESHAPE, "input gradient 1");
    for (int k = 0; k < 2; k++) {
        ddl_tensor_destroy(&x[k]);
    }
    ddl_tensor_destroy(&y);
    ddl_layer_destroy(&A);
    ddl_partition_destroy(&PW);
    ddl_partition_destroy(&P1);
    ddl_partition_destroy(&P2);
    if (ddl_test_rank == 0) {
        printf("ok validation errors and multi-input entry points\n");
    }
}

// Add with its ReLU fused (ddl_add_fuse_relu): forward relu(sum) and backward dy [y > 0]
// to every operand, bit for bit against the add and the ReLU kernels unfused, with each
// operand's gradient its own buffer and with one of them dy's own memory (the model's
// operand read only by the add, spec_grad_alias_of), whose dy the others must still see
// masked. Sums of exactly +0 and -0 (the ReLU gives +0 for both) and both signs are among
// the values.
static void check_add_relu(ddl_dtype dt, int n_op)
{
    int              ones[4] = {1, 1, 1, 1};
    ddl_partition_t *P1      = ddl_test_partition_range(0, 4, ones);
    ddl_shape        xg      = ddl_shape_make(4, (int64_t[]){2, 3, 4, 4});
    ddl_layer_t     *A = NULL, *C = NULL;
    ASSERT_OK(ddl_add_create(P1, dt, &xg, n_op, &A));
    ASSERT_OK(ddl_add_fuse_relu(A, true));
    const ddl_shape *xs   = ddl_layer_x_shape(A);
    int64_t          n    = ddl_shape_numel(xs);
    size_t           es   = ddl_dtype_size(dt);
    ddl_tensor_t    *x[3] = {0}, *dx[3] = {0}, *y, *yr, *zr, *dy, *g;
    for (int k = 0; k < n_op; k++) {
        ASSERT_OK(ddl_tensor_create(dt, xs, &x[k]));
        ASSERT_OK(ddl_tensor_create(dt, xs, &dx[k]));
        layer_test_fill(x[k], P1, &xg, 30 + (uint64_t)k);
    }
    ASSERT_OK(ddl_tensor_create(dt, xs, &y));
    ASSERT_OK(ddl_tensor_create(dt, xs, &yr));
    ASSERT_OK(ddl_tensor_create(dt, xs, &zr));
    ASSERT_OK(ddl_tensor_create(dt, xs, &dy));
    ASSERT_OK(ddl_tensor_create(dt, xs, &g));
    layer_test_fill(dy, P1, &xg, 40);
    for (int64_t i = 0; i < n && n > 0; i += 7) { // sums of exactly 0 and -0
        for (int k = 0; k < n_op; k++) {
            double v = i % 2 ? -0.0 : k == 2 ? 0.0 : k ? -0.5 : 0.5; // -0, or +0
            if (dt == DDL_F32) {
                ((float *)x[k]->data)[i] = (float)v;
            } else {
                ((double *)x[k]->data)[i] = v;
            }
        }
    }
    const void *ptr[3] = {x[0]->data, x[1]->data, n_op > 2 ? x[2]->data : NULL};
    ASSERT_OK(ddl_sum_forward(dt, yr->data, n_op, ptr, n));
    ASSERT_OK(ddl_relu_forward(dt, zr->data, yr->data, n));
    ASSERT_OK(ddl_activation_backward_into(DDL_ACTIVATION_RELU, 0.0, dt, g->data, dy->data, NULL,
                                           zr->data, n));
    ASSERT_OK(ddl_layer_forward_n(A, n_op, (const ddl_tensor_t *const *)x, y));
    ASSERT_TRUE(memcmp(y->data, zr->data, (size_t)n * es) == 0);
    // Every operand's gradient its own buffer (filled with garbage first).
    for (int k = 0; k < n_op; k++) {
        memset(dx[k]->data, 0x7f, (size_t)n * es);
    }
    ASSERT_OK(ddl_layer_backward_n(A, dy, n_op, dx));
    for (int k = 0; k < n_op; k++) {
        ASSERT_TRUE(memcmp(dx[k]->data, g->data, (size_t)n * es) == 0);
    }
    // Operand 1's gradient is dy's memory, the others' their own.
    ddl_tensor_t *view = NULL, *dxa[3] = {dx[0], NULL, dx[2]};
    ASSERT_OK(ddl_tensor_view(dt, xs, dy->data, &view));
    dxa[1] = view;
    memset(dx[0]->data, 0x7f, (size_t)n * es);
    if (n_op > 2) {
        memset(dx[2]->data, 0x7f, (size_t)n * es);
    }
    ASSERT_OK(ddl_layer_backward_n(A, dy, n_op, dxa));
    for (int k = 0; k < n_op; k++) {
        ASSERT_TRUE(memcmp(dxa[k]->data, g->data, (size_t)n * es) == 0);
    }
    // Fusing after a forward, or on another kind of layer, is refused.
    expect_error(ddl_add_fuse_relu(A, false), DDL_EINVAL, "already run a forward");
    ddl_shape g2[2] = {xg, xg};
    ASSERT_OK(ddl_concat_create(P1, dt, 2, g2, &C));
    expect_error(ddl_add_fuse_relu(C, true), DDL_EINVAL, "not an add layer");
    ddl_tensor_destroy(&view);
    for (int k = 0; k < n_op; k++) {
        ddl_tensor_destroy(&x[k]);
        ddl_tensor_destroy(&dx[k]);
    }
    ddl_tensor_destroy(&y);
    ddl_tensor_destroy(&yr);
    ddl_tensor_destroy(&zr);
    ddl_tensor_destroy(&dy);
    ddl_tensor_destroy(&g);
    ddl_layer_destroy(&A);
    ddl_layer_destroy(&C);
    ddl_partition_destroy(&P1);
    if (ddl_test_rank == 0) {
        printf("ok add of %d operands with a fused ReLU (%s)\n", n_op,
               dt == DDL_F32 ? "f32" : "f64");
    }
}

int main(int argc, char **argv)
{
    ddl_test_mpi_init(&argc, &argv);
    int64_t live = ddl_alloc_bytes_live();
    check_errors();
    check_add_relu(DDL_F32, 2); // the residual add's own loop
    check_add_relu(DDL_F32, 3);
    check_add_relu(DDL_F64, 2);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        run_case(&cases[i]);
    }
    // Every layer, plan, partition and buffer built above has been freed again.
    ASSERT_EQ(ddl_alloc_bytes_live(), live);
    return ddl_test_mpi_finalize();
}
