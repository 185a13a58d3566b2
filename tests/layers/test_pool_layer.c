// tests/layers/test_pool_layer.c: distributed max and average pooling on feature
// partitions against the sequential layer, with the adjoint test for average pooling
// (linear), finite-difference gradient checks and repeatability for both, the padding
// values (-inf for max, counted zeros for average), and the validation errors.
//
// Layouts are DistDL's test_pooling.py cases (the 16- and 18-rank ones scaled to 4
// ranks), plus ranks with an empty output share and a partition on a subset of the
// world. Random inputs are distinct almost surely, so max pooling has no ties.

#include "ddl/base.h"
#include "layer_test.h"

#define MAXD 5

typedef struct pool_case {
    const char *name;
    int         nsp;
    int64_t     x[MAXD];  // [N, C, spatial...]
    int64_t     k[3], s[3], p[3], d[3];  // s 0: stride = kernel; d 0: 1
    int         first;                   // first world rank of P_x
    int         shape[MAXD];             // P_x
} pool_case;

typedef struct pool_ctx {
    const pool_case *pc;
    ddl_pool_mode    mode;
    ddl_partition_t *P_x, *P_seq;
} pool_ctx;

static int world_size(void)
{
    int n;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
}

static ddl_pool_params params_of(const pool_case *pc, ddl_pool_mode mode)
{
    ddl_pool_params p = {.nsp = pc->nsp, .kind = mode};
    for (int j = 0; j < 3; j++) {
        p.kernel[j]   = pc->k[j] ? pc->k[j] : 1;
        p.stride[j]   = pc->s[j];
        p.padding[j]  = pc->p[j];
        p.dilation[j] = pc->d[j] ? pc->d[j] : 1;
    }
    return p;
}

static ddl_status build_pool(void *ctx, bool seq, ddl_dtype dt, ddl_layer_t **out)
{
    const pool_ctx *t  = ctx;
    ddl_pool_params p  = params_of(t->pc, t->mode);
    ddl_shape       xg = ddl_shape_make(2 + t->pc->nsp, t->pc->x);
    return ddl_pool_create(seq ? t->P_seq : t->P_x, dt, &xg, &p, out);
}

static void run_case(const pool_case *pc)
{
    int nd = 2 + pc->nsp, n = 1;
    for (int i = 0; i < nd; i++) {
        n *= pc->shape[i];
    }
    if (pc->first + n > world_size()) {
        return;  // the layout needs more ranks than this run has
    }
    int      ones[MAXD] = {1, 1, 1, 1, 1};
    pool_ctx t          = {.pc = pc};
    t.P_x               = ddl_test_partition_range(pc->first, nd, pc->shape);
    t.P_seq             = ddl_test_partition_range(0, nd, ones);
    bool dilated        = false;
    for (int j = 0; j < pc->nsp; j++) {
        dilated = dilated || (pc->d[j] != 0 && pc->d[j] != 1);
    }
    for (int k = 0; k < 2; k++) {
        t.mode = k == 0 ? DDL_POOL_MAX : DDL_POOL_AVG;
        if (t.mode == DDL_POOL_AVG && dilated) {
            continue;  // average pooling has no dilation (as in DistDL's test)
        }
        char name[160];
        snprintf(name, sizeof name, "%s %s", t.mode == DDL_POOL_MAX ? "max" : "avg", pc->name);
        ddl_layer_builder b = {.build = build_pool, .ctx = &t, .seed = 99, .training = true};
        layer_test_run(name, &b, t.mode == DDL_POOL_AVG, true);
        layer_test_repeat(name, &b);
    }
    ddl_partition_destroy(&t.P_x);
    ddl_partition_destroy(&t.P_seq);
}

static const pool_case cases[] = {
    // One rank: the kernel's own padding.
    {"serial-2d", 2, {1, 3, 9, 8}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, 0, {1, 1, 1, 1}},
    {"serial-1d default stride", 1, {2, 2, 11}, {3}, {0}, {1}, {1}, 0, {1, 1, 1}},
    {"serial-3d", 3, {1, 2, 5, 6, 4}, {2, 3, 2}, {1, 2, 2}, {1, 1, 0}, {1, 1, 1}, 0,
     {1, 1, 1, 1, 1}},
    // DistDL's test_pooling.py.
    {"no-stride-ideal-padding", 2, {1, 5, 10, 10}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, 0,
     {1, 1, 2, 2}},
    {"stride-2-ideal-padding", 2, {1, 5, 10, 10}, {5, 5}, {2, 2}, {2, 2}, {1, 1}, 0,
     {1, 1, 2, 2}},
    {"odd-local-shape-with-stride", 2, {1, 5, 5, 5}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, 0,
     {1, 1, 2, 2}},
    {"kernel-needs-offset", 2, {1, 5, 6, 10}, {5, 5}, {4, 4}, {2, 2}, {1, 1}, 0,
     {1, 1, 2, 2}},
    {"non-ideal-padding", 2, {1, 5, 10, 8}, {5, 5}, {1, 1}, {1, 1}, {1, 1}, 0, {1, 1, 2, 2}},
    {"even-kernel-size", 2, {1, 5, 8, 8}, {4, 4}, {1, 1}, {1, 1}, {1, 1}, 0, {1, 1, 2, 2}},
    {"3d-input", 3, {1, 3, 5, 5, 6}, {5, 5, 5}, {2, 2, 1}, {2, 2, 2}, {1, 1, 1}, 0,
     {1, 1, 2, 1, 2}},
    {"1d-input", 1, {1, 3, 15}, {3}, {1}, {1}, {1}, 0, {1, 1, 4}},
    {"dilation-2", 2, {1, 3, 10, 10}, {5, 5}, {1, 1}, {1, 1}, {2, 2}, 0, {1, 1, 2, 2}},
    {"many-partitions-small-input (1x4)", 2, {1, 3, 10, 10}, {5, 5}, {2, 2}, {2, 2},
     {1, 1}, 0, {1, 1, 1, 4}},
    {"hard-test (scaled)", 3, {1, 2, 14, 12, 10}, {5, 4, 3}, {3, 1, 2}, {1, 1, 1},
     {3, 3, 1}, 0, {1, 1, 2, 1, 2}},
    {"common-resnet-case (scaled)", 2, {2, 4, 12, 30}, {7, 7}, {2, 2}, {3, 3}, {1, 1}, 0,
     {1, 1, 1, 4}},
    // Default stride (= kernel), ranks with an empty output share (3 outputs, 4 pieces).
    {"default-stride idle-output-ranks", 1, {2, 2, 6}, {2}, {0}, {0}, {1}, 0, {1, 1, 4}},
    // P_x on world ranks 2..3 only.
    {"subset-ranks", 2, {2, 3, 7, 6}, {3, 2}, {2, 1}, {1, 1}, {1, 1}, 2, {1, 1, 1, 2}},
    // Batch and channel splits (beyond DistDL's feature partitions): no halo in those
    // dims; alone, with a spatial split, and with a rank that holds no sample.
    {"batch-split [2,1,1,1]", 2, {4, 3, 8, 8}, {2, 2}, {0, 0}, {0, 0}, {1, 1}, 0,
     {2, 1, 1, 1}},
    {"batch-and-channels [2,2,1,1] padded", 2, {3, 5, 7, 6}, {3, 3}, {2, 2}, {1, 1}, {1, 1},
     0, {2, 2, 1, 1}},
    {"channels-and-space [1,2,1,2]", 2, {2, 3, 10, 10}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, 0,
     {1, 2, 1, 2}},
    {"batch-split idle rank [4,1,1]", 1, {3, 2, 9}, {2}, {0}, {0}, {1}, 0, {4, 1, 1}},
};

static void check_errors(void)
{
    int              ones[4] = {1, 1, 1, 1};
    ddl_partition_t *P1      = ddl_test_partition_range(0, 4, ones);
    ddl_shape        xg      = ddl_shape_make(4, (int64_t[]){1, 2, 8, 8});
    ddl_pool_params  p       = {.nsp = 2, .kind = DDL_POOL_AVG, .kernel = {3, 3},
                                .stride = {1, 1}, .padding = {1, 1}, .dilation = {2, 1}};
    ddl_layer_t     *L       = NULL;
    // Average pooling refuses dilation.
    ASSERT_STATUS(ddl_pool_create(P1, DDL_F64, &xg, &p, &L), DDL_EINVAL);
    // Padding above kernel / 2.
    p.dilation[0] = 1;
    p.padding[0]  = 2;
    ASSERT_STATUS(ddl_pool_create(P1, DDL_F64, &xg, &p, &L), DDL_EINVAL);
    p.padding[0] = 1;
    // Window larger than the input.
    p.kernel[1]  = 12;
    p.padding[1] = 0;
    ASSERT_STATUS(ddl_pool_create(P1, DDL_F64, &xg, &p, &L), DDL_EINVAL);
    p.kernel[1] = 3;
    // Unknown kind, wrong dims.
    p.kind = (ddl_pool_mode)5;
    ASSERT_STATUS(ddl_pool_create(P1, DDL_F64, &xg, &p, &L), DDL_EINVAL);
    p.kind           = DDL_POOL_MAX;
    ddl_shape x3     = ddl_shape_make(3, (int64_t[]){1, 2, 8});
    ASSERT_STATUS(ddl_pool_create(P1, DDL_F64, &x3, &p, &L), DDL_EINVAL);
    ASSERT_TRUE(L == NULL);
    ASSERT_OK(ddl_pool_create(P1, DDL_F64, &xg, &p, &L));
    ddl_layer_destroy(&L);
    if (world_size() >= 4) {
        // A partition that splits the input over more pieces than a spatial dim can take
        // (8 rows over 4 pieces with a window of 9 rows reaching past the neighbour).
        int              cs[4] = {1, 1, 4, 1};
        ddl_partition_t *Pc    = ddl_test_partition_range(0, 4, cs);
        ddl_pool_params  w     = p;
        w.kernel[0]            = 9;
        w.padding[0]           = 4;
        w.stride[0]            = 1;
        ASSERT_STATUS(ddl_pool_create(Pc, DDL_F64, &xg, &w, &L), DDL_EINVAL);
        // A halo reaching past the neighbour: 8 over 4 pieces of 2, kernel 7, stride 1.
        int              fs[3] = {1, 1, 4};
        ddl_partition_t *Pf    = ddl_test_partition_range(0, 3, fs);
        ddl_pool_params  q = {.nsp = 1, .kind = DDL_POOL_MAX, .kernel = {7}, .stride = {1},
                              .padding = {3}, .dilation = {1}};
        ASSERT_STATUS(ddl_pool_create(Pf, DDL_F64, &x3, &q, &L), DDL_EINVAL);
        ASSERT_TRUE(L == NULL);
        ddl_partition_destroy(&Pc);
        ddl_partition_destroy(&Pf);
    }
    ddl_partition_destroy(&P1);
    if (ddl_test_rank == 0) {
        printf("ok validation errors\n");
    }
}

// Max pooling pads with -inf: on an all-negative input the boundary outputs are real
// input values, never the (zero) padding; average pooling divides by the whole window.
static void check_padding_values(void)
{
    int n = world_size() >= 4 ? 4 : 1;
    int fs[3] = {1, 1, n};
    ddl_partition_t *P  = ddl_test_partition_range(0, 3, fs);
    ddl_shape        xg = ddl_shape_make(3, (int64_t[]){1, 1, 8});
    for (int k = 0; k < 2; k++) {
        ddl_pool_params p = {.nsp = 1, .kind = k == 0 ? DDL_POOL_MAX : DDL_POOL_AVG,
                             .kernel = {3}, .stride = {1}, .padding = {1}, .dilation = {1}};
        ddl_layer_t    *L = NULL;
        ASSERT_OK(ddl_pool_create(P, DDL_F64, &xg, &p, &L));
        ddl_tensor_t *x = NULL, *y = NULL;
        ASSERT_OK(ddl_tensor_create(DDL_F64, ddl_layer_x_shape(L), &x));
        ASSERT_OK(ddl_tensor_create(DDL_F64, ddl_layer_y_shape(L), &y));
        ddl_box xb = ddl_partition_local_box(P, &xg);
        ddl_box yb = ddl_partition_local_box(P, ddl_layer_y_global(L));
        for (int64_t i = 0; i < ddl_tensor_numel(x); i++) {
            ddl_tensor_set(x, i, -1.0 - (double)(xb.start[2] + i));  // x[g] = -1 - g
        }
        ASSERT_OK(ddl_layer_forward(L, x, y));
        for (int64_t i = 0; i < ddl_tensor_numel(y); i++) {
            int64_t g = yb.start[2] + i;  // window [g - 1, g + 1] clipped to [0, 7]
            double  want;
            if (k == 0) {
                want = -1.0 - (double)(g > 0 ? g - 1 : 0);
            } else {
                double sum = 0;
                for (int64_t t = g - 1; t <= g + 1; t++) {
                    sum += (t >= 0 && t < 8) ? -1.0 - (double)t : 0.0;
                }
                want = sum / 3.0;
            }
            ASSERT_NEAR(ddl_tensor_get(y, i), want, 1e-14);
        }
        ddl_tensor_destroy(&x);
        ddl_tensor_destroy(&y);
        ddl_layer_destroy(&L);
    }
    ddl_partition_destroy(&P);
    if (ddl_test_rank == 0) {
        printf("ok padding values\n");
    }
}

int main(int argc, char **argv)
{
    ddl_test_mpi_init(&argc, &argv);
    int64_t live = ddl_alloc_bytes_live();
    check_errors();
    check_padding_values();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        run_case(&cases[i]);
    }
    // Every layer, plan, partition and buffer built above has been freed again.
    ASSERT_EQ(ddl_alloc_bytes_live(), live);
    return ddl_test_mpi_finalize();
}
