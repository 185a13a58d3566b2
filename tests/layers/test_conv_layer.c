// tests/layers/test_conv_layer.c: the distributed convolution (feature, channel and general
// partitions) against its sequential twin, the adjoint test with respect to the input,
// the weight and the bias, finite-difference gradient checks, and repeatability (a second
// forward/backward on one layer equals a fresh layer's), and for the feature layer the halo
// overlap on against off, bit for bit; plus the selector and the
// validation errors, DistDL's parameter placement, and no memory left behind.
//
// Layouts follow DistDL's tests (test_conv_feature.py, test_channel_conv_{1,2,3}d.py,
// test_general_conv{1,2}d.py), scaled to the 1, 4 and 6 ranks this test runs on: every
// case needing more ranks than the world has is skipped.

#include <string.h>

#include "ddl/base.h"
#include "layer_test.h"

#define MAXD 5

// A partition: `first` consecutive world ranks arranged as `shape` (ndim dims).
typedef struct part_spec {
    int first;
    int shape[MAXD];
} part_spec;

typedef struct conv_case {
    const char *name;
    int         nsp;
    int64_t     x[MAXD];  // [N, C_in, spatial...]
    int64_t     C_out;
    int64_t     k[3], s[3], p[3], d[3];
    bool        bias;
    part_spec   px, py, pw;  // py.shape[0] == 0: feature layer (P_x only)
} conv_case;

// The partitions a case builds once; they outlive the layers the checks build.
typedef struct conv_ctx {
    const conv_case  *cc;
    ddl_partition_t *P_x, *P_y, *P_w, *P_seq;
} conv_ctx;

static int part_size(int ndim, const int *shape)
{
    int n = 1;
    for (int i = 0; i < ndim; i++) {
        n *= shape[i];
    }
    return n;
}

static int world_size(void)
{
    int n;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
}

static ddl_status build_conv(void *ctx, bool seq, ddl_dtype dt, ddl_layer_t **out)
{
    const conv_ctx  *t  = ctx;
    const conv_case *cc = t->cc;
    ddl_conv_params  p  = {.nsp = cc->nsp, .in_channels = cc->x[1], .out_channels = cc->C_out,
                           .bias = cc->bias};
    for (int j = 0; j < 3; j++) {
        p.kernel[j]   = cc->k[j] ? cc->k[j] : 1;
        p.stride[j]   = cc->s[j] ? cc->s[j] : 1;
        p.padding[j]  = cc->p[j];
        p.dilation[j] = cc->d[j] ? cc->d[j] : 1;
    }
    ddl_shape              xg  = ddl_shape_make(2 + cc->nsp, cc->x);
    const ddl_partition_t *P_x = seq ? t->P_seq : t->P_x;
    const ddl_partition_t *P_y = t->P_y == NULL ? NULL : (seq ? t->P_seq : t->P_y);
    const ddl_partition_t *P_w = t->P_w == NULL ? NULL : (seq ? t->P_seq : t->P_w);
    return ddl_conv_create(P_x, P_y, P_w, dt, &xg, &p, out);
}

static ddl_partition_t *make_part(int ndim, const part_spec *ps)
{
    return ddl_test_partition_range(ps->first, ndim, ps->shape);
}

static int case_ranks(const conv_case *cc)
{
    int nd = 2 + cc->nsp, need = cc->px.first + part_size(nd, cc->px.shape);
    if (cc->py.shape[0] != 0) {
        int a = cc->py.first + part_size(nd, cc->py.shape);
        int b = cc->pw.first + part_size(nd, cc->pw.shape);
        need  = a > need ? a : need;
        need  = b > need ? b : need;
    }
    return need;
}

// The halo overlap (ddl_halo_overlap): a layer's forward and backward with it on give
// what they give with it off, bit for bit (y, dx and every parameter gradient), in both
// dtypes, and the overlapped steady state allocates nothing.
static void check_overlap(const char *name, ddl_layer_builder *b)
{
    bool prev = ddl_halo_overlap();
    for (int di = 0; di < 2; di++) {
        ddl_dtype     dt = di ? DDL_F32 : DDL_F64;
        ddl_layer_t  *L  = NULL;
        ddl_tensor_t *x, *dy, *y[2], *dx[2], *g[2][2] = {{NULL, NULL}, {NULL, NULL}};
        ASSERT_OK(b->build(b->ctx, false, dt, &L));
        ddl_layer_init_params(L, b->seed, 200);
        ASSERT_OK(ddl_tensor_create(dt, ddl_layer_x_shape(L), &x));
        ASSERT_OK(ddl_tensor_create(dt, ddl_layer_y_shape(L), &dy));
        layer_test_fill(x, ddl_layer_P_in(L), ddl_layer_x_global(L), 31);
        layer_test_fill(dy, ddl_layer_P_out(L), ddl_layer_y_global(L), 32);
        int np = ddl_layer_nparams(L);
        ASSERT_TRUE(np <= 2);
        for (int on = 0; on < 2; on++) {
            ASSERT_OK(ddl_tensor_create(dt, ddl_layer_y_shape(L), &y[on]));
            ASSERT_OK(ddl_tensor_create(dt, ddl_layer_x_shape(L), &dx[on]));
            ddl_halo_overlap_set(on);
            ddl_layer_zero_grad(L);
            uint64_t allocs = ddl_alloc_count();
            ASSERT_OK(ddl_layer_forward(L, x, y[on]));
            ASSERT_OK(ddl_layer_backward(L, dy, dx[on]));
            ASSERT_EQ(ddl_alloc_count(), allocs);
            for (int k = 0; k < np; k++) {
                const ddl_tensor_t *gk = ddl_layer_param(L, k)->grad;
                ASSERT_OK(ddl_tensor_create(dt, &gk->shape, &g[on][k]));
                ASSERT_OK(ddl_tensor_copy(gk, g[on][k]));
            }
        }
        int differ = memcmp(y[0]->data, y[1]->data, ddl_tensor_bytes(y[0])) != 0 ||
                     memcmp(dx[0]->data, dx[1]->data, ddl_tensor_bytes(dx[0])) != 0;
        for (int k = 0; k < np; k++) {
            differ |= memcmp(g[0][k]->data, g[1][k]->data, ddl_tensor_bytes(g[0][k])) != 0;
        }
        MPI_Allreduce(MPI_IN_PLACE, &differ, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (differ) {
            TEST_FAIL_("%s (%s): the halo overlap changes the results", name, ddl_dtype_name(dt));
        }
        for (int on = 0; on < 2; on++) {
            ddl_tensor_destroy(&y[on]);
            ddl_tensor_destroy(&dx[on]);
            for (int k = 0; k < np; k++) {
                ddl_tensor_destroy(&g[on][k]);
            }
        }
        ddl_tensor_destroy(&x);
        ddl_tensor_destroy(&dy);
        ddl_layer_destroy(&L);
    }
    ddl_halo_overlap_set(prev);
}

static void run_case(const conv_case *cc)
{
    if (case_ranks(cc) > world_size()) {
        return;  // the layout needs more ranks than this run has
    }
    int      nd         = 2 + cc->nsp;
    int      ones[MAXD] = {1, 1, 1, 1, 1};
    conv_ctx t          = {.cc = cc};
    t.P_x               = make_part(nd, &cc->px);
    if (cc->py.shape[0] != 0) {
        t.P_y = make_part(nd, &cc->py);
        t.P_w = make_part(nd, &cc->pw);
    }
    t.P_seq             = ddl_test_partition_range(0, nd, ones);
    ddl_layer_builder b = {.build = build_conv, .ctx = &t, .seed = 2024, .training = true};
    layer_test_run(cc->name, &b, true, true);
    layer_test_repeat(cc->name, &b);
    if (cc->py.shape[0] == 0) {
        check_overlap(cc->name, &b);
    }
    ddl_partition_destroy(&t.P_x);
    ddl_partition_destroy(&t.P_y);
    ddl_partition_destroy(&t.P_w);
    ddl_partition_destroy(&t.P_seq);
}

// ---- cases ---------------------------------------------------------------------
// Each case: name, nsp, x_global, C_out, kernel, stride, padding, dilation (per spatial
// dim; 0 means the default), bias, then P_x, P_y, P_w as Pn(first rank, shape...).
#define P3(f, a, b, c)       {.first = (f), .shape = {a, b, c}}
#define P4(f, a, b, c, d)    {.first = (f), .shape = {a, b, c, d}}
#define P5(f, a, b, c, d, e) {.first = (f), .shape = {a, b, c, d, e}}
#define NOPART               {.first = 0}  // no P_y / P_w: the feature layer

static const conv_case feature_cases[] = {
    // Sequential-size layouts (one rank).
    {"feature serial-2d", 2, {1, 3, 16, 16}, 4, {3, 3}, {1, 1}, {1, 1}, {1, 1}, false,
     P4(0, 1, 1, 1, 1), NOPART, NOPART},
    {"feature serial-1d-bias", 1, {2, 3, 11}, 4, {4}, {2}, {1}, {1}, true, P3(0, 1, 1, 1),
     NOPART, NOPART},
    {"feature serial-3d-bias", 3, {1, 2, 5, 4, 6}, 3, {3, 2, 3}, {1, 1, 2}, {1, 0, 1},
     {1, 1, 1}, true, P5(0, 1, 1, 1, 1, 1), NOPART, NOPART},
    // DistDL's test_conv_feature.py layouts on [1, 1, 2, 2] (and the 1-D / 3-D ones).
    {"feature no-stride-ideal-padding k3 p1", 2, {1, 5, 10, 10}, 10, {3, 3}, {1, 1}, {1, 1},
     {1, 1}, false, P4(0, 1, 1, 2, 2), NOPART, NOPART},
    {"feature stride-2 k5 s2 p2 bias (acceptance)", 2, {1, 5, 10, 10}, 10, {5, 5}, {2, 2},
     {2, 2}, {1, 1}, true, P4(0, 1, 1, 2, 2), NOPART, NOPART},
    {"feature odd-local-shape-with-stride", 2, {1, 5, 5, 5}, 10, {3, 3}, {2, 2}, {1, 1},
     {1, 1}, false, P4(0, 1, 1, 2, 2), NOPART, NOPART},
    {"feature kernel-needs-offset", 2, {1, 5, 6, 10}, 10, {5, 5}, {4, 4}, {2, 2}, {1, 1},
     false, P4(0, 1, 1, 2, 2), NOPART, NOPART},
    {"feature non-ideal-padding", 2, {1, 5, 10, 8}, 10, {5, 5}, {1, 1}, {1, 1}, {1, 1}, false,
     P4(0, 1, 1, 2, 2), NOPART, NOPART},
    {"feature even-kernel-size-with-bias", 2, {1, 5, 8, 8}, 10, {4, 4}, {1, 1}, {1, 1},
     {1, 1}, true, P4(0, 1, 1, 2, 2), NOPART, NOPART},
    {"feature 3d-input", 3, {1, 3, 5, 5, 6}, 10, {5, 5, 5}, {2, 2, 1}, {2, 2, 2}, {1, 1, 1},
     false, P5(0, 1, 1, 2, 1, 2), NOPART, NOPART},
    {"feature 1d-input", 1, {1, 3, 15}, 10, {3}, {1}, {1}, {1}, false, P3(0, 1, 1, 4), NOPART,
     NOPART},
    {"feature dilation-2", 2, {1, 3, 10, 10}, 10, {5, 5}, {1, 1}, {1, 1}, {2, 2}, false,
     P4(0, 1, 1, 2, 2), NOPART, NOPART},
    {"feature many-partitions-small-input (1x4)", 2, {1, 3, 10, 10}, 10, {5, 5}, {2, 2},
     {2, 2}, {1, 1}, false, P4(0, 1, 1, 1, 4), NOPART, NOPART},
    {"feature with-bias", 2, {1, 5, 10, 10}, 10, {3, 3}, {1, 1}, {1, 1}, {1, 1}, true,
     P4(0, 1, 1, 2, 2), NOPART, NOPART},
    {"feature hard-test (scaled)", 3, {1, 2, 14, 12, 10}, 6, {5, 4, 3}, {3, 1, 2},
     {1, 1, 2}, {3, 3, 1}, true, P5(0, 1, 1, 2, 1, 2), NOPART, NOPART},
    {"feature common-resnet-test", 2, {1, 5, 20, 20}, 6, {7, 7}, {2, 2}, {3, 3}, {1, 1},
     false, P4(0, 1, 1, 2, 2), NOPART, NOPART},
    // Batch > 1, and ranks with an empty output share (3 outputs over 4 pieces).
    {"feature batch-2 idle-output-ranks", 1, {2, 2, 6}, 3, {2}, {2}, {0}, {1}, true,
     P3(0, 1, 1, 4), NOPART, NOPART},
    // P_x on a subset of the world (ranks 2..3; 0..1 hold nothing).
    {"feature subset-ranks", 2, {2, 3, 7, 6}, 4, {3, 3}, {1, 1}, {1, 1}, {1, 1}, true,
     P4(2, 1, 1, 1, 2), NOPART, NOPART},
    // Batch splits (data parallelism; beyond DistDL's [1, 1, S...]): the batch alone, the
    // batch with space (3 samples over 2 pieces: 2/1), more pieces than samples (a rank
    // with none), and a 3-D one on a subset of the world.
    {"feature batch-split [2,1,1,1] bias", 2, {4, 3, 6, 6}, 5, {3, 3}, {1, 1}, {1, 1},
     {1, 1}, true, P4(0, 2, 1, 1, 1), NOPART, NOPART},
    {"feature batch-and-space [2,1,2,1] k3 s2", 2, {3, 3, 9, 6}, 4, {3, 3}, {2, 2}, {1, 1},
     {1, 1}, true, P4(0, 2, 1, 2, 1), NOPART, NOPART},
    {"feature batch-split idle rank [4,1,1]", 1, {3, 2, 9}, 3, {3}, {1}, {1}, {1}, true,
     P3(0, 4, 1, 1), NOPART, NOPART},
    {"feature batch-and-space 3-D subset [2,1,1,1,2]", 3, {2, 2, 4, 5, 6}, 3, {3, 3, 3},
     {1, 1, 1}, {1, 1, 1}, {1, 1, 1}, false, P5(2, 2, 1, 1, 1, 2), NOPART, NOPART},
};

static const conv_case channel_cases[] = {
    {"channel serial", 2, {1, 4, 6, 6}, 5, {3, 3}, {1, 1}, {1, 1}, {1, 1}, true,
     P4(0, 1, 1, 1, 1), P4(0, 1, 1, 1, 1), P4(0, 1, 1, 1, 1)},
    // DistDL's test_channel_conv_2d.py.
    {"channel 2d co2_ci3", 2, {1, 8, 10, 10}, 10, {3, 3}, {1, 1}, {1, 1}, {1, 1}, true,
     P4(0, 1, 3, 1, 1), P4(0, 1, 2, 1, 1), P4(0, 2, 3, 1, 1)},
    {"channel 2d co3_ci2 (envelope)", 2, {1, 8, 10, 10}, 10, {3, 3}, {1, 1}, {0, 0}, {1, 1},
     true, P4(0, 1, 2, 1, 1), P4(0, 1, 3, 1, 1), P4(0, 3, 2, 1, 1)},
    {"channel 2d co1_ci2", 2, {1, 8, 10, 10}, 10, {3, 3}, {1, 1}, {1, 1}, {1, 1}, true,
     P4(0, 1, 2, 1, 1), P4(0, 1, 1, 1, 1), P4(0, 1, 2, 1, 1)},
    {"channel 2d co2_ci1", 2, {1, 8, 10, 10}, 10, {3, 3}, {1, 1}, {1, 1}, {1, 1}, true,
     P4(0, 1, 1, 1, 1), P4(0, 1, 2, 1, 1), P4(0, 2, 1, 1, 1)},
    {"channel 2d co2_ci2", 2, {1, 5, 10, 10}, 10, {3, 3}, {1, 1}, {1, 1}, {1, 1}, true,
     P4(0, 1, 2, 1, 1), P4(0, 1, 2, 1, 1), P4(0, 2, 2, 1, 1)},
    // Disjoint P_x and P_y, odd channel counts.
    {"channel 2d disjoint co2_ci2 odd channels", 2, {2, 5, 7, 6}, 7, {3, 2}, {2, 1}, {1, 0},
     {1, 2}, true, P4(0, 1, 2, 1, 1), P4(2, 1, 2, 1, 1), P4(0, 2, 2, 1, 1)},
    // DistDL's 1-D and 3-D channel layouts.
    {"channel 1d co2_ci3", 1, {1, 8, 10}, 10, {3}, {1}, {1}, {1}, true, P3(0, 1, 3, 1),
     P3(0, 1, 2, 1), P3(0, 2, 3, 1)},
    {"channel 1d co2_ci2", 1, {1, 5, 10}, 10, {3}, {1}, {1}, {1}, true, P3(0, 1, 2, 1),
     P3(0, 1, 2, 1), P3(0, 2, 2, 1)},
    {"channel 3d co2_ci3", 3, {1, 8, 5, 4, 4}, 10, {3, 3, 3}, {1, 1, 1}, {1, 1, 1},
     {1, 1, 1}, true, P5(0, 1, 3, 1, 1, 1), P5(0, 1, 2, 1, 1, 1), P5(0, 2, 3, 1, 1, 1)},
    {"channel 3d co2_ci2", 3, {1, 5, 5, 4, 4}, 10, {3, 3, 3}, {1, 1, 1}, {1, 1, 1},
     {1, 1, 1}, true, P5(0, 1, 2, 1, 1, 1), P5(0, 1, 2, 1, 1, 1), P5(0, 2, 2, 1, 1, 1)},
};

static const conv_case general_cases[] = {
    // P_w [2, 1, 1, 2]: co split, space split; P_x a subset.
    {"general 2d co2_ci1 P_w[2,1,1,2]", 2, {1, 5, 6, 10}, 10, {3, 3}, {1, 1}, {1, 1},
     {1, 1}, true, P4(0, 1, 1, 1, 2), P4(0, 1, 2, 1, 2), P4(0, 2, 1, 1, 2)},
    // P_w [1, 2, 1, 2]: ci split and space split; P_y on ranks 1..2, whose root and leaf
    // blocks differ in size (9 outputs over 2 pieces: 5 and 4) — the envelope path.
    {"general 2d co1_ci2 P_w[1,2,1,2] (envelope)", 2, {1, 5, 6, 9}, 4, {3, 3}, {1, 1},
     {1, 1}, {1, 1}, true, P4(0, 1, 2, 1, 2), P4(1, 1, 1, 1, 2), P4(0, 1, 2, 1, 2)},
    // Stride, dilation and an even kernel, space split along H; P_y on ranks 2..5.
    {"general 2d co2_ci1 P_w[2,1,2,1] stride/dilation/even kernel", 2, {2, 3, 11, 9}, 5,
     {4, 3}, {2, 1}, {2, 1}, {1, 2}, true, P4(0, 1, 1, 2, 1), P4(2, 1, 2, 2, 1),
     P4(0, 2, 1, 2, 1)},
    // DistDL's test_general_conv1d.py.
    {"general 1d co2_ci1", 1, {1, 5, 10}, 10, {3}, {1}, {0}, {1}, true, P3(0, 1, 1, 3),
     P3(0, 1, 2, 3), P3(0, 2, 1, 3)},
    {"general 1d co1_ci2", 1, {1, 5, 10}, 10, {3}, {1}, {0}, {1}, true, P3(0, 1, 2, 3),
     P3(0, 1, 1, 3), P3(0, 1, 2, 3)},
    {"general 1d co2_ci3 (6 ranks, x on 3)", 1, {1, 6, 12}, 5, {3}, {1}, {1}, {1}, true,
     P3(3, 1, 3, 1), P3(0, 1, 2, 1), P3(0, 2, 3, 1)},
};

// ---- validation ----------------------------------------------------------------

static void check_errors(void)
{
    int              nd4[4] = {1, 1, 1, 1};
    ddl_partition_t *P1     = ddl_test_partition_range(0, 4, nd4);
    ddl_shape        xg     = ddl_shape_make(4, (int64_t[]){1, 4, 8, 8});
    ddl_conv_params  p = {.nsp = 2, .in_channels = 4, .out_channels = 3, .kernel = {3, 3},
                          .stride = {1, 1}, .padding = {1, 1}, .dilation = {1, 1}};
    ddl_layer_t     *L = NULL;
    // DistDL's selector: exactly one of P_y / P_w is an error.
    ASSERT_STATUS(ddl_conv_create(P1, P1, NULL, DDL_F64, &xg, &p, &L), DDL_EINVAL);
    ASSERT_STATUS(ddl_conv_create(P1, NULL, P1, DDL_F64, &xg, &p, &L), DDL_EINVAL);
    ASSERT_TRUE(L == NULL);
    // in_channels against x_global[1].
    p.in_channels = 5;
    ASSERT_STATUS(ddl_conv_create(P1, NULL, NULL, DDL_F64, &xg, &p, &L), DDL_EINVAL);
    p.in_channels = 4;
    // Partition dims != x dims.
    int              nd3[3] = {1, 1, 1};
    ddl_partition_t *P3d    = ddl_test_partition_range(0, 3, nd3);
    ASSERT_STATUS(ddl_conv_create(P3d, NULL, NULL, DDL_F64, &xg, &p, &L), DDL_EINVAL);
    // Window larger than the padded input.
    p.kernel[0] = 11;
    ASSERT_STATUS(ddl_conv_create(P1, NULL, NULL, DDL_F64, &xg, &p, &L), DDL_EINVAL);
    p.kernel[0] = 3;
    // nsp out of range, bad dtype.
    p.nsp = 4;
    ASSERT_STATUS(ddl_conv_create(P1, NULL, NULL, DDL_F64, &xg, &p, &L), DDL_EINVAL);
    p.nsp = 2;
    ASSERT_STATUS(ddl_conv_create(P1, NULL, NULL, (ddl_dtype)7, &xg, &p, &L), DDL_EINVAL);
    // A valid one still builds after all that.
    ASSERT_OK(ddl_conv_create(P1, NULL, NULL, DDL_F64, &xg, &p, &L));
    ddl_layer_destroy(&L);
    ddl_partition_destroy(&P3d);

    if (world_size() >= 4) {
        // Halo beyond the neighbour: 8 over 4 pieces of 2 with a 7-wide window.
        int              fs[3] = {1, 1, 4};
        ddl_partition_t *Pf    = ddl_test_partition_range(0, 3, fs);
        ddl_shape        x1    = ddl_shape_make(3, (int64_t[]){1, 2, 8});
        ddl_conv_params  q     = {.nsp = 1, .in_channels = 2, .out_channels = 2, .kernel = {7},
                                  .stride = {1}, .padding = {3}, .dilation = {1}};
        ASSERT_STATUS(ddl_conv_create(Pf, NULL, NULL, DDL_F64, &x1, &q, &L), DDL_EINVAL);
        // A feature partition that splits the channels.
        int              cs[3] = {1, 2, 2};
        ddl_partition_t *Pc    = ddl_test_partition_range(0, 3, cs);
        q.kernel[0]            = 3;
        q.padding[0]           = 1;
        ASSERT_STATUS(ddl_conv_create(Pc, NULL, NULL, DDL_F64, &x1, &q, &L), DDL_EINVAL);
        // Channel layouts whose P_w does not match: P_w[1] != P_x[1], P_w[0] != P_y[1].
        int              s12[3] = {1, 2, 1}, s21[3] = {2, 1, 1}, s22[3] = {2, 2, 1};
        ddl_partition_t *Px = ddl_test_partition_range(0, 3, s12);
        ddl_partition_t *Pw = ddl_test_partition_range(0, 3, s21);
        ddl_partition_t *Pw22 = ddl_test_partition_range(0, 3, s22);
        ddl_partition_t *Py1  = ddl_test_partition_range(0, 3, nd3);
        ASSERT_STATUS(ddl_conv_create(Px, Py1, Pw, DDL_F64, &x1, &q, &L), DDL_EINVAL);
        ASSERT_STATUS(ddl_conv_create(Px, Py1, Pw22, DDL_F64, &x1, &q, &L), DDL_EINVAL);
        // More output-channel pieces than channels.
        ddl_partition_t *Py2 = ddl_test_partition_range(0, 3, s12);
        q.out_channels       = 1;
        ASSERT_STATUS(ddl_conv_create(Px, Py2, Pw22, DDL_F64, &x1, &q, &L), DDL_EINVAL);
        // General layout whose spatial splits differ between P_x and P_w.
        int              gx[3] = {1, 1, 2}, gw[3] = {2, 1, 2}, gy[3] = {1, 2, 1};
        ddl_partition_t *Gx = ddl_test_partition_range(0, 3, gx);
        ddl_partition_t *Gw = ddl_test_partition_range(0, 3, gw);
        ddl_partition_t *Gy = ddl_test_partition_range(0, 3, gy);
        q.out_channels      = 2;
        ASSERT_STATUS(ddl_conv_create(Gx, Gy, Gw, DDL_F64, &x1, &q, &L), DDL_EINVAL);
        ASSERT_TRUE(L == NULL);
        ddl_partition_t *all[] = {Pf, Pc, Px, Pw, Pw22, Py1, Py2, Gx, Gw, Gy};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
            ddl_partition_destroy(&all[i]);
        }
    }
    ddl_partition_destroy(&P1);
    if (ddl_test_rank == 0) {
        printf("ok validation errors\n");
    }
}

// The layer's parameters are placed as DistDL places them: a feature layer's weight and
// bias on P_x rank 0 only; a general layer's weight blocks on the spatial-0 slab of P_w.
static void check_placement(void)
{
    if (world_size() < 4) {
        return;
    }
    int              fs[4] = {1, 1, 2, 2};
    ddl_partition_t *Pf    = ddl_test_partition_range(0, 4, fs);
    ddl_shape        xg    = ddl_shape_make(4, (int64_t[]){1, 3, 6, 6});
    ddl_conv_params  p     = {.nsp = 2, .in_channels = 3, .out_channels = 4, .kernel = {3, 3},
                              .stride = {1, 1}, .padding = {1, 1}, .dilation = {1, 1},
                              .bias = true};
    ddl_layer_t     *L     = NULL;
    ASSERT_OK(ddl_conv_create(Pf, NULL, NULL, DDL_F64, &xg, &p, &L));
    ASSERT_EQ(ddl_layer_nparams(L), 2);
    int64_t expect_w = ddl_test_rank == 0 ? 4 * 3 * 3 * 3 : 0;
    int64_t expect_b = ddl_test_rank == 0 ? 4 : 0;
    ASSERT_EQ(ddl_box_numel(&ddl_layer_param(L, 0)->box), expect_w);
    ASSERT_EQ(ddl_box_numel(&ddl_layer_param(L, 1)->box), expect_b);
    ddl_layer_destroy(&L);
    // A batch split keeps one owner: P_x rank 0 (batch and spatial coordinates 0).
    int              bs[4] = {2, 1, 2, 1};
    ddl_partition_t *Pb    = ddl_test_partition_range(0, 4, bs);
    ddl_shape        xb    = ddl_shape_make(4, (int64_t[]){2, 3, 6, 6});
    ASSERT_OK(ddl_conv_create(Pb, NULL, NULL, DDL_F64, &xb, &p, &L));
    ASSERT_EQ(ddl_box_numel(&ddl_layer_param(L, 0)->box), expect_w);
    ASSERT_EQ(ddl_box_numel(&ddl_layer_param(L, 1)->box), expect_b);
    ddl_layer_destroy(&L);
    ddl_partition_destroy(&Pb);

    int              gx[4] = {1, 1, 1, 2}, gy[4] = {1, 2, 1, 2}, gw[4] = {2, 1, 1, 2};
    ddl_partition_t *Gx = ddl_test_partition_range(0, 4, gx);
    ddl_partition_t *Gy = ddl_test_partition_range(0, 4, gy);
    ddl_partition_t *Gw = ddl_test_partition_range(0, 4, gw);
    ASSERT_OK(ddl_conv_create(Gx, Gy, Gw, DDL_F64, &xg, &p, &L));
    // P_w rank r has coordinate (r / 2, 0, 0, r % 2): owners are ranks 0 and 2.
    bool owner = ddl_test_rank == 0 || ddl_test_rank == 2;
    ASSERT_EQ(ddl_box_numel(&ddl_layer_param(L, 0)->box), owner ? 2 * 3 * 3 * 3 : 0);
    ASSERT_EQ(ddl_box_numel(&ddl_layer_param(L, 1)->box), owner ? 2 : 0);
    ddl_layer_destroy(&L);
    ddl_partition_destroy(&Gx);
    ddl_partition_destroy(&Gy);
    ddl_partition_destroy(&Gw);
    ddl_partition_destroy(&Pf);
    if (ddl_test_rank == 0) {
        printf("ok parameter placement\n");
    }
}

// ddl_layer_set_dx_add: a convolution whose kernel writes its input block in place adds
// its dx into the argument (a model's later consumer of a tensor); one with a halo
// refuses and keeps overwriting. Added: base + dx within rounding (the direct kernels add
// each finished element once, the same bits as a copy added in; im2col's col2im adds tap
// by tap), and never the overwritten dx alone.
static void check_dx_add(void)
{
    int             one[4] = {1, 1, 1, 1}, split[4] = {1, 1, 2, 1};
    ddl_shape       xg = ddl_shape_make(4, (int64_t[]){3, 4, 9, 9});
    ddl_conv_params p  = {.nsp          = 2,
                          .in_channels  = 4,
                          .out_channels = 5,
                          .kernel       = {3, 3},
                          .stride       = {1, 1},
                          .padding      = {1, 1},
                          .dilation     = {1, 1}};
    for (int halo = 0; halo < 2 && (halo == 0 || world_size() >= 2); halo++) {
        ddl_partition_t *P = ddl_test_partition_range(0, 4, halo ? split : one);
        ddl_layer_t     *L = NULL;
        ASSERT_OK(ddl_conv_create(P, NULL, NULL, DDL_F64, &xg, &p, &L));
        ddl_layer_init_params(L, 5, 300);
        ddl_tensor_t *x, *y, *dy, *set, *sum;
        ASSERT_OK(ddl_tensor_create(DDL_F64, ddl_layer_x_shape(L), &x));
        ASSERT_OK(ddl_tensor_create(DDL_F64, ddl_layer_y_shape(L), &y));
        ASSERT_OK(ddl_tensor_create(DDL_F64, ddl_layer_y_shape(L), &dy));
        ASSERT_OK(ddl_tensor_create(DDL_F64, ddl_layer_x_shape(L), &set));
        ASSERT_OK(ddl_tensor_create(DDL_F64, ddl_layer_x_shape(L), &sum));
        layer_test_fill(x, P, &xg, 41);
        layer_test_fill(dy, ddl_layer_P_out(L), ddl_layer_y_global(L), 42);
        layer_test_fill(set, P, &xg, 43); // overwritten
        layer_test_fill(sum, P, &xg, 44); // the base added into
        ASSERT_OK(ddl_layer_forward(L, x, y));
        ASSERT_OK(ddl_layer_backward(L, dy, set));
        ASSERT_TRUE(ddl_layer_set_dx_add(L, true) == !halo);
        ddl_tensor_t *base = NULL;
        ASSERT_OK(ddl_tensor_create(DDL_F64, ddl_layer_x_shape(L), &base));
        ASSERT_OK(ddl_tensor_copy(sum, base));
        ASSERT_OK(ddl_layer_backward(L, dy, sum));
        double err = 0.0, moved = 0.0;
        for (int64_t i = 0; i < ddl_tensor_numel(sum); i++) {
            double b = ddl_tensor_get(base, i), d = ddl_tensor_get(set, i);
            double want = halo ? d : b + d, got = ddl_tensor_get(sum, i);
            err   = fmax(err, fabs(got - want) / fmax(1.0, fabs(want)));
            moved = fmax(moved, fabs(got - d));
        }
        ASSERT_TRUE(err <= 1e-13);
        ASSERT_TRUE(halo ? moved == 0.0 : ddl_tensor_numel(sum) == 0 || moved > 0.1);
        ASSERT_TRUE(!ddl_layer_set_dx_add(L, false));
        ddl_tensor_t *ts[] = {x, y, dy, set, sum, base};
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
            ddl_tensor_destroy(&ts[i]);
        }
        ddl_layer_destroy(&L);
        ddl_partition_destroy(&P);
    }
    if (ddl_test_rank == 0) {
        printf("ok dx added into its argument (and refused with a halo)\n");
    }
}

int main(int argc, char **argv)
{
    ddl_test_mpi_init(&argc, &argv);
    int64_t live = ddl_alloc_bytes_live();
    check_errors();
    check_placement();
    check_dx_add();
    for (size_t i = 0; i < sizeof feature_cases / sizeof feature_cases[0]; i++) {
        run_case(&feature_cases[i]);
    }
    for (size_t i = 0; i < sizeof channel_cases / sizeof channel_cases[0]; i++) {
        run_case(&channel_cases[i]);
    }
    for (size_t i = 0; i < sizeof general_cases / sizeof general_cases[0]; i++) {
        run_case(&general_cases[i]);
    }
    // Every layer, plan, partition and buffer built above has been freed again.
    ASSERT_EQ(ddl_alloc_bytes_live(), live);
    return ddl_test_mpi_finalize();
}
