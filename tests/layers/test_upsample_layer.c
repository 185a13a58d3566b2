// tests/layers/test_upsample_layer.c: the distributed upsampling layer.
//
//  - generic checks (adjoint f64/f32, sequential equivalence f64/f32, gradcheck f64) for
//    nearest, linear and linear+align_corners over 1-D, 2-D and 3-D layouts: splits along
//    one and two spatial dims, batch and channel splits, upsampling by 2, non-integer
//    scales, a given size, downsampling (reads reaching past the neighbours), uneven and
//    empty pieces, and partitions with inactive ranks;
//  - PyTorch's values for a small 1-D case, worked out by hand, gathered from the ranks;
//  - forward/backward allocate nothing;
//  - ddl_upsample_scratch_bytes (the estimate's count) equals the largest shared scratch
//    a rank's layer asks for, in every case and mode;
//  - argument validation.
#include <math.h>
#include <string.h>

#include "ddl/base.h"
#include "ddl/collect.h"
#include "layer_test.h"
#include "layers/layer_impl.h"

typedef struct up_case {
    const char      *name;
    int              first;  // first world rank of P_x
    int              ndim;
    int              pshape[DDL_MAX_DIMS];
    int64_t          x[DDL_MAX_DIMS];
    double           scale[3];  // used when size[0] == 0
    int64_t          size[3];
    ddl_partition_t *P, *P_seq;
    ddl_shape        xg;
    // Set per run:
    ddl_upsample_mode mode;
    bool              align;
} up_case;

#define A(...) {__VA_ARGS__}
#define SCALE(nm, fr, nd, ps, xs, sc) \
    {.name = nm, .first = fr, .ndim = nd, .pshape = ps, .x = xs, .scale = sc}
#define SIZE(nm, fr, nd, ps, xs, sz) \
    {.name = nm, .first = fr, .ndim = nd, .pshape = ps, .x = xs, .size = sz}

static up_case cases[] = {
    // One rank (also the np1 run).
    SCALE("single-1d-x2", 0, 3, A(1, 1, 1), A(2, 3, 7), A(2.0)),
    SCALE("single-2d-x1.5", 0, 4, A(1, 1, 1, 1), A(1, 2, 5, 6), A(1.5, 1.5)),
    // 1-D, split along the spatial dim (DistDL's [1, 1, P] layouts).
    SCALE("1d-x1", 0, 3, A(1, 1, 4), A(2, 3, 17), A(1.0)),
    SCALE("1d-x2", 0, 3, A(1, 1, 4), A(2, 3, 17), A(2.0)),
    SCALE("1d-x1.5", 0, 3, A(1, 1, 4), A(2, 3, 17), A(1.5)),
    SCALE("1d-x0.3-down", 0, 3, A(1, 1, 4), A(2, 2, 17), A(0.3)),
    SIZE("1d-size2-down", 0, 3, A(1, 1, 4), A(1, 2, 16), A(2)),
    SIZE("1d-size23", 0, 3, A(1, 1, 4), A(2, 2, 9), A(23)),
    SCALE("1d-empty-x-piece", 0, 3, A(1, 1, 4), A(1, 2, 3), A(2.5)),
    // 2-D: one and two spatial dims split, non-integer and mixed scales, a size.
    SCALE("2d-x2-one-dim", 0, 4, A(1, 1, 4, 1), A(2, 2, 9, 5), A(2.0, 2.0)),
    SCALE("2d-x2", 0, 4, A(1, 1, 2, 2), A(2, 2, 7, 9), A(2.0, 2.0)),
    SCALE("2d-x1.5-x2.5", 0, 4, A(1, 1, 2, 2), A(1, 2, 7, 9), A(1.5, 2.5)),
    SIZE("2d-size-up-down", 0, 4, A(1, 1, 2, 2), A(1, 2, 13, 9), A(4, 13)),
    // 3-D.
    SCALE("3d-x2", 0, 5, A(1, 1, 1, 2, 2), A(1, 2, 3, 5, 6), A(2.0, 2.0, 2.0)),
    SIZE("3d-size", 0, 5, A(1, 1, 2, 1, 2), A(1, 1, 4, 3, 7), A(5, 3, 11)),
    // Batch and channel splits together with spatial ones.
    SCALE("batch-spatial", 0, 3, A(2, 1, 2), A(3, 2, 9), A(1.7)),
    SCALE("channel-spatial", 0, 4, A(1, 2, 1, 2), A(2, 3, 5, 7), A(2.0, 1.5)),
    // Inactive ranks: rank 0 outside P_x; rank 3 outside.
    SCALE("inactive-rank0", 1, 3, A(1, 1, 3), A(2, 2, 10), A(1.7)),
    SIZE("inactive-rank3", 0, 4, A(1, 1, 3, 1), A(1, 2, 8, 3), A(20, 2)),
};

static int world_size(void)
{
    int s;
    MPI_Comm_size(MPI_COMM_WORLD, &s);
    return s;
}

static int case_ranks(const up_case *c)
{
    int n = 1;
    for (int d = 0; d < c->ndim; d++) {
        n *= c->pshape[d];
    }
    return n;
}

static ddl_status build(void *ctx, bool sequential, ddl_dtype dt, ddl_layer_t **out)
{
    up_case *c = ctx;
    return ddl_upsample_create(sequential ? c->P_seq : c->P, dt, &c->xg, c->mode, c->align,
                               c->size[0] == 0 ? c->scale : NULL,
                               c->size[0] == 0 ? NULL : c->size, out);
}

// ---- PyTorch's values by hand --------------------------------------------------------
// x = [0, 1, 2, 3] (one batch, one channel), upsampled to 8 and downsampled to 3:
//   nearest x2            [0, 0, 1, 1, 2, 2, 3, 3]
//   linear x2             src = (j + 0.5)/2 - 0.5 clamped at 0:
//                         [0, 0.25, 0.75, 1.25, 1.75, 2.25, 2.75, 3]
//   linear x2, align      src = j * 3/7: [0, 3/7, 6/7, ..., 3]
//   linear size 3         src = (j + 0.5) * 4/3 - 0.5: [1/6, 1.5, 17/6]
//   nearest size 3        src = floor(j * 4/3): [0, 1, 2]

static void check_by_hand(ddl_upsample_mode mode, bool align, const double *scale,
                          const int64_t *size, const double *want, int64_t out_n)
{
    int              np = world_size() >= 4 ? 4 : 1;
    ddl_partition_t *P  = ddl_test_partition_range(0, 3, (int[]){1, 1, np});
    ddl_shape        g  = ddl_shape_make(3, (int64_t[]){1, 1, 4});
    ddl_layer_t     *L  = NULL;
    ASSERT_OK(ddl_upsample_create(P, DDL_F64, &g, mode, align, scale, size, &L));
    ASSERT_EQ(ddl_layer_y_global(L)->d[2], out_n);
    ddl_box       xb = ddl_partition_local_box(P, ddl_layer_x_global(L));
    ddl_box       yb = ddl_partition_local_box(P, ddl_layer_y_global(L));
    ddl_tensor_t *x = NULL, *y = NULL, *all = NULL;
    ASSERT_OK(ddl_tensor_create(DDL_F64, ddl_layer_x_shape(L), &x));
    ASSERT_OK(ddl_tensor_create(DDL_F64, ddl_layer_y_shape(L), &y));
    for (int64_t i = 0; i < ddl_tensor_numel(x); i++) {
        ddl_tensor_set(x, i, (double)(xb.start[2] + i));
    }
    uint64_t before = ddl_alloc_count();
    ASSERT_OK(ddl_layer_forward(L, x, y));
    ASSERT_EQ(ddl_alloc_count(), before);
    if (ddl_test_rank == 0) {
        ASSERT_OK(ddl_tensor_create(DDL_F64, ddl_layer_y_global(L), &all));
    }
    ASSERT_OK(ddl_gather_boxes(MPI_COMM_WORLD, 0, y, &yb, ddl_layer_y_global(L), all));
    if (ddl_test_rank == 0) {
        for (int64_t j = 0; j < out_n; j++) {
            ASSERT_NEAR(ddl_tensor_get(all, j), want[j], 1e-14);
        }
    }
    ddl_tensor_destroy(&all);
    ddl_tensor_destroy(&x);
    ddl_tensor_destroy(&y);
    ddl_layer_destroy(&L);
    ddl_partition_destroy(&P);
}

static void test_by_hand(void)
{
    const double two[1] = {2.0};
    const double near2[8] = {0, 0, 1, 1, 2, 2, 3, 3};
    const double lin2[8]  = {0, 0.25, 0.75, 1.25, 1.75, 2.25, 2.75, 3};
    double       ali2[8];
    for (int j = 0; j < 8; j++) {
        ali2[j] = j * 3.0 / 7.0;
    }
    const int64_t three[1]  = {3};
    const double  lin3[3]   = {1.0 / 6.0, 1.5, 17.0 / 6.0};
    const double  near3[3]  = {0, 1, 2};
    check_by_hand(DDL_UPSAMPLE_NEAREST, false, two, NULL, near2, 8);
    check_by_hand(DDL_UPSAMPLE_LINEAR, false, two, NULL, lin2, 8);
    check_by_hand(DDL_UPSAMPLE_LINEAR, true, two, NULL, ali2, 8);
    check_by_hand(DDL_UPSAMPLE_LINEAR, false, NULL, three, lin3, 3);
    check_by_hand(DDL_UPSAMPLE_NEAREST, false, NULL, three, near3, 3);
    if (ddl_test_rank == 0) {
        printf("ok values by hand\n");
    }
}

// ---- no allocation in the step -----------------------------------------------------------

static void test_no_alloc(void)
{
    up_case *c = &cases[6];  // downsampling: remote reads, several peers
    if (c->first + case_ranks(c) > world_size()) {
        c = &cases[0];
    }
    c->mode  = DDL_UPSAMPLE_LINEAR;
    c->align = false;
    int ones[DDL_MAX_DIMS] = {1, 1, 1, 1, 1};
    c->P     = ddl_test_partition_range(c->first, c->ndim, c->pshape);
    c->P_seq = ddl_test_partition_range(0, c->ndim, ones);
    c->xg    = ddl_shape_make(c->ndim, c->x);
    ddl_layer_t *L = NULL;
    ASSERT_OK(build(c, false, DDL_F32, &L));
    ddl_tensor_t *x = NULL, *y = NULL;
    ASSERT_OK(ddl_tensor_create(DDL_F32, ddl_layer_x_shape(L), &x));
    ASSERT_OK(ddl_tensor_create(DDL_F32, ddl_layer_y_shape(L), &y));
    uint64_t before = ddl_alloc_count();
    for (int k = 0; k < 3; k++) {
        ASSERT_OK(ddl_layer_forward(L, x, y));
        ASSERT_OK(ddl_layer_backward(L, y, x));
    }
    ASSERT_EQ(ddl_alloc_count(), before);
    ddl_tensor_destroy(&x);
    ddl_tensor_destroy(&y);
    ddl_layer_destroy(&L);
    ddl_partition_destroy(&c->P);
    ddl_partition_destroy(&c->P_seq);
    if (ddl_test_rank == 0) {
        printf("ok no allocation in forward/backward\n");
    }
}

// ---- the estimate's count ------------------------------------------------------------------

// Built to share scratch, the layer asks each rank for its buffers' bytes; the pure count
// (no MPI) must be the largest of them, for both dtypes.
static void check_scratch_bytes(up_case *c)
{
    for (int k = 0; k < 2; k++) {
        ddl_dtype    dt = k == 0 ? DDL_F32 : DDL_F64;
        ddl_layer_t *L  = NULL;
        ddl_layer_share_scratch(true, 0);
        ddl_status st = build(c, false, dt, &L);
        ddl_layer_share_scratch(false, 0);
        ASSERT_OK(st);
        unsigned long long mine = L->scratch_bytes, most = 0;
        MPI_Allreduce(&mine, &most, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
        size_t count = 0;
        ASSERT_OK(ddl_upsample_scratch_bytes(dt, &c->xg, c->pshape, c->mode, c->align,
                                             c->size[0] == 0 ? c->scale : NULL,
                                             c->size[0] == 0 ? NULL : c->size, &count));
        if (count != most) {
            fprintf(stderr, "%s %s: ddl_upsample_scratch_bytes %zu, the layers' largest %llu\n",
                    c->name, ddl_dtype_name(dt), count, most);
        }
        ASSERT_EQ(count, most);
        ddl_layer_destroy(&L);
    }
}

// ---- validation ------------------------------------------------------------------------

static void test_validation(void)
{
    ddl_partition_t *P  = ddl_test_partition_range(0, 3, (int[]){1, 1, 1});
    ddl_shape        g  = ddl_shape_make(3, (int64_t[]){2, 3, 5});
    ddl_layer_t     *L  = NULL;
    double           s2[1] = {2.0}, s0[1] = {0.0}, sn[1] = {NAN}, sd[1] = {0.1};
    int64_t          z[1] = {0}, f[1] = {4};
    ddl_upsample_mode lin = DDL_UPSAMPLE_LINEAR, nea = DDL_UPSAMPLE_NEAREST;
    ASSERT_STATUS(ddl_upsample_create(P, DDL_F64, &g, lin, false, NULL, NULL, &L), DDL_EINVAL);
    ASSERT_TRUE(strstr(ddl_last_error(), "neither") != NULL);
    ASSERT_STATUS(ddl_upsample_create(P, DDL_F64, &g, lin, false, s2, f, &L), DDL_EINVAL);
    ASSERT_STATUS(ddl_upsample_create(P, DDL_F64, &g, nea, true, s2, NULL, &L), DDL_EINVAL);
    ASSERT_STATUS(ddl_upsample_create(P, DDL_F64, &g, lin, false, s0, NULL, &L), DDL_EINVAL);
    ASSERT_STATUS(ddl_upsample_create(P, DDL_F64, &g, lin, false, sn, NULL, &L), DDL_EINVAL);
    // 5 * 0.1 = 0.5 floors to an empty output.
    ASSERT_STATUS(ddl_upsample_create(P, DDL_F64, &g, lin, false, sd, NULL, &L), DDL_EINVAL);
    ASSERT_STATUS(ddl_upsample_create(P, DDL_F64, &g, lin, false, NULL, z, &L), DDL_EINVAL);
    ASSERT_STATUS(ddl_upsample_create(P, DDL_F64, &g, (ddl_upsample_mode)5, false, s2, NULL, &L),
                  DDL_EINVAL);
    ddl_shape g4 = ddl_shape_make(4, (int64_t[]){2, 3, 5, 5});
    ASSERT_STATUS(ddl_upsample_create(P, DDL_F64, &g4, lin, false, s2, NULL, &L), DDL_EINVAL);
    ASSERT_TRUE(strstr(ddl_last_error(), "P_x has 3 dims") != NULL);
    ddl_shape g2 = ddl_shape_make(2, (int64_t[]){2, 3});
    ASSERT_STATUS(ddl_upsample_create(P, DDL_F64, &g2, lin, false, s2, NULL, &L), DDL_EINVAL);
    ddl_shape ge = ddl_shape_make(3, (int64_t[]){2, 3, 0});
    ASSERT_STATUS(ddl_upsample_create(P, DDL_F64, &ge, lin, false, s2, NULL, &L), DDL_EINVAL);
    // Unbounded scales: 1e8 used to build a layer that spun for minutes, 1e300 overflowed.
    double big[1] = {1e8}, huge[1] = {1e300}, edge[1] = {DDL_UPSAMPLE_MAX_SCALE * 1.0001};
    ASSERT_STATUS(ddl_upsample_create(P, DDL_F64, &g, nea, false, big, NULL, &L), DDL_EINVAL);
    ASSERT_TRUE(strstr(ddl_last_error(), "scale_factor[0] = 1e+08") != NULL);
    ASSERT_STATUS(ddl_upsample_create(P, DDL_F64, &g, nea, false, huge, NULL, &L), DDL_EINVAL);
    ASSERT_STATUS(ddl_upsample_create(P, DDL_F64, &g, nea, false, edge, NULL, &L), DDL_EINVAL);
    // A given size past the per-tensor cap.
    int64_t far[1] = {(int64_t)1 << 40};
    ASSERT_STATUS(ddl_upsample_create(P, DDL_F64, &g, nea, false, NULL, far, &L), DDL_EINVAL);
    ASSERT_TRUE(strstr(ddl_last_error(), "2^34") != NULL);
    ASSERT_TRUE(L == NULL);
    // The estimate's count (pure, no MPI: nothing to agree on) refuses what create refuses,
    // and a block count below 1 or a missing argument, naming it; it leaves *bytes alone.
    int    p1[3] = {1, 1, 2}, p0[3] = {1, 1, 0};
    size_t nb = 7;
    ASSERT_STATUS(ddl_upsample_scratch_bytes(DDL_F64, &g, p1, lin, false, NULL, NULL, &nb),
                  DDL_EINVAL);
    ASSERT_TRUE(strstr(ddl_last_error(), "neither") != NULL);
    ASSERT_STATUS(ddl_upsample_scratch_bytes(DDL_F64, &g, p1, nea, false, big, NULL, &nb),
                  DDL_EINVAL);
    ASSERT_STATUS(ddl_upsample_scratch_bytes(DDL_F64, &g2, p1, lin, false, s2, NULL, &nb),
                  DDL_EINVAL);
    ASSERT_STATUS(ddl_upsample_scratch_bytes(DDL_F64, &g, p0, lin, false, s2, NULL, &nb),
                  DDL_EINVAL);
    ASSERT_TRUE(strstr(ddl_last_error(), "0 blocks of dim 2") != NULL);
    ASSERT_STATUS(ddl_upsample_scratch_bytes(DDL_F64, &g, NULL, lin, false, s2, NULL, &nb),
                  DDL_EINVAL);
    ASSERT_STATUS(ddl_upsample_scratch_bytes(DDL_F64, NULL, p1, lin, false, s2, NULL, &nb),
                  DDL_EINVAL);
    ASSERT_STATUS(ddl_upsample_scratch_bytes(DDL_F64, &g, p1, lin, false, s2, NULL, NULL),
                  DDL_EINVAL);
    ASSERT_EQ(nb, 7);
    ddl_clear_error();
    ASSERT_OK(ddl_upsample_create(P, DDL_F64, &g, lin, false, NULL, f, &L));
    ASSERT_EQ(ddl_layer_y_global(L)->d[2], 4);
    ASSERT_EQ(ddl_layer_nparams(L), 0);
    ddl_layer_destroy(&L);
    ddl_partition_destroy(&P);
    if (ddl_test_rank == 0) {
        printf("ok validation\n");
    }
}

int main(int argc, char **argv)
{
    ddl_test_mpi_init(&argc, &argv);
    int64_t live = ddl_alloc_bytes_live();
    test_validation();
    test_by_hand();
    test_no_alloc();
    int ws = world_size();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        up_case *c = &cases[i];
        if (c->first + case_ranks(c) > ws) {
            continue;
        }
        int ones[DDL_MAX_DIMS] = {1, 1, 1, 1, 1};
        c->P     = ddl_test_partition_range(c->first, c->ndim, c->pshape);
        c->P_seq = ddl_test_partition_range(0, c->ndim, ones);
        c->xg    = ddl_shape_make(c->ndim, c->x);
        static const struct {
            ddl_upsample_mode mode;
            bool              align;
            const char       *name;
        } modes[] = {{DDL_UPSAMPLE_NEAREST, false, "nearest"},
                     {DDL_UPSAMPLE_LINEAR, false, "linear"},
                     {DDL_UPSAMPLE_LINEAR, true, "linear-align"}};
        for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
            c->mode  = modes[m].mode;
            c->align = modes[m].align;
            char name[128];
            snprintf(name, sizeof name, "%s %s", c->name, modes[m].name);
            ddl_layer_builder b = {.build = build, .ctx = c, .seed = 11, .training = true};
            layer_test_run(name, &b, true, true);
            check_scratch_bytes(c);
        }
        ddl_partition_destroy(&c->P);
        ddl_partition_destroy(&c->P_seq);
    }
    ASSERT_EQ(ddl_alloc_bytes_live(), live);  // every layer and partition freed everything
    return ddl_test_mpi_finalize();
}
