// A batch norm or an add and the ReLU after it run fused (spec_fused_relu_source,
// ddl_batchnorm_fuse_relu, ddl_add_fuse_relu), and a layer read only by a batch norm or an
// add takes that layer's gradient as its own (spec_grad_alias_of: the batch norm then
// writes its dx over its dy): the model with both must give exactly the bits of the model
// without either (DDL_FUSE_BN_RELU=0 DDL_FUSE_ADD_RELU=0 DDL_SHARE_BN_GRAD=0), and so must
// the model with the shared gradients only (the batch norms' backward without a ReLU, in
// place), in f32 (where the ReLU reads the rounded normalized value or sum) and in f64, on
// 1, 2 and 4 ranks (the spatial dims split, so the statistics cross ranks). The network has:
//   - b0 -> r0, fused, whose output r0 is read twice (c1 and the add): the gradient of a
//     fused ReLU's output is a sum of two consumers'; c0's gradient is b0's;
//   - b1 -> r1, fused;
//   - b2 read by r2 and by the add: not fused (the batch norm's own output is needed);
//   - the add -> r3, fused; the add's operand r2 has no other reader, so its gradient is
//     the add's own (spec_grad_alias_of), which the fused add masks in place before the
//     other two operands take it;
//   - b3, read only by add2 (with r3, which has another reader): its gradient is add2's,
//     and c3's is b3's: b3 writes its dx over add2's gradient once add2 has copied it to r3;
//   - b4 and b5, both read only by add3: both take add3's gradient. b5's backward runs
//     first and reads it, so only b4, the last to read it, writes over it: c4's gradient
//     is b4's, c5's its own.
// Compared, bit for bit: the loss and the hits of three Adam steps, every parameter after
// them, an evaluation (running statistics: the frozen-statistics backward path is not
// taken, but the eval forward is), and a prediction of a short batch (a forward-only
// copy, which fuses on its own). The models must report their fused layers (5, or 0) and
// their shared gradients (9 with DDL_SHARE_BN_GRAD, fused or not; 4 without: the adds'):
// equal bits from two models that both skipped the change would prove nothing.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddl/base.h"
#include "ddl/model.h"
#include "engine/model_internal.h"
#include "mpi_test.h"

enum { B = 4, C_IN = 2, H = 8, W = 8, CLASSES = 3, STEPS = 3 };

static char *spec_text(int world, const char *dtype)
{
    int  ps[3][2] = {{1, 1}, {2, 1}, {2, 2}};
    int *s        = ps[world == 1 ? 0 : world == 2 ? 1 : 2];
    char ranks[32];
    ddl_test_rank_list(world, ranks, sizeof ranks);
    const char *conv = "\"type\": \"conv2d\", \"out_channels\": 4, \"kernel\": [3, 3], "
                       "\"padding\": [1, 1], \"bias\": false";
    char       *t    = malloc(8192);
    snprintf(t, 8192,
             "{\"world_size\": %d, \"seed\": 7, \"dtype\": \"%s\", \"batch_size\": %d,\n"
             " \"inference_batches\": [2],\n"
             " \"input\": {\"shape\": [%d, %d, %d], \"partition\": \"p\"},\n"
             " \"partitions\": {\"p\": {\"ranks\": [%s], \"shape\": [1, 1, %d, %d]},\n"
             "   \"chs\": {\"ranks\": [%s], \"shape\": [1, %d, 1, 1]},\n"
             "   \"flat\": {\"ranks\": [%s], \"shape\": [1, %d]},\n"
             "   \"out\": {\"ranks\": [0], \"shape\": [1, 1]}},\n"
             " \"layers\": [\n"
             "  {%s, \"name\": \"c0\"},\n"
             "  {\"type\": \"batchnorm\", \"name\": \"b0\"},\n"
             "  {\"type\": \"relu\", \"name\": \"r0\"},\n"
             "  {%s, \"name\": \"c1\"},\n"
             "  {\"type\": \"batchnorm\", \"name\": \"b1\"},\n"
             "  {\"type\": \"relu\", \"name\": \"r1\"},\n"
             "  {%s, \"name\": \"c2\"},\n"
             "  {\"type\": \"batchnorm\", \"name\": \"b2\"},\n"
             "  {\"type\": \"relu\", \"name\": \"r2\"},\n"
             "  {\"type\": \"add\", \"name\": \"sum\", \"from\": [\"r2\", \"r0\", \"b2\"]},\n"
             "  {\"type\": \"relu\", \"name\": \"r3\"},\n"
             "  {%s, \"name\": \"c3\"},\n"
             "  {\"type\": \"batchnorm\", \"name\": \"b3\"},\n"
             "  {\"type\": \"add\", \"name\": \"add2\", \"from\": [\"b3\", \"r3\"]},\n"
             "  {\"type\": \"relu\", \"name\": \"r4\"},\n"
             "  {%s, \"name\": \"c4\"},\n"
             "  {\"type\": \"batchnorm\", \"name\": \"b4\"},\n"
             "  {%s, \"name\": \"c5\", \"from\": \"r4\"},\n"
             "  {\"type\": \"batchnorm\", \"name\": \"b5\"},\n"
             "  {\"type\": \"add\", \"name\": \"add3\", \"from\": [\"b4\", \"b5\"]},\n"
             "  {\"type\": \"relu\", \"name\": \"r5\"},\n"
             "  {\"type\": \"repartition\", \"to\": \"chs\"},\n"
             "  {\"type\": \"adaptive_avgpool2d\", \"output_size\": 1},\n"
             "  {\"type\": \"flatten\", \"to\": \"flat\"},\n"
             "  {\"type\": \"linear\", \"name\": \"fc\", \"out_features\": %d, \"P_y\": \"out\", "
             "\"P_w\": \"flat\"}],\n"
             " \"loss\": {\"type\": \"cross_entropy\"},\n"
             " \"optimizer\": {\"type\": \"adam\", \"lr\": 0.05}}\n",
             world, dtype, B, C_IN, H, W, ranks, s[0], s[1], ranks, world, ranks, world, conv, conv,
             conv, conv, conv, conv, CLASSES);
    return t;
}

static ddl_model_t *make(int world, const char *dtype, bool fuse, bool share)
{
    char        *t    = spec_text(world, dtype);
    ddl_spec_t  *spec = NULL;
    ddl_model_t *m    = NULL;
    if (!fuse) {
        setenv("DDL_FUSE_BN_RELU", "0", 1);
        setenv("DDL_FUSE_ADD_RELU", "0", 1);
    }
    if (!share) {
        setenv("DDL_SHARE_BN_GRAD", "0", 1);
    }
    ASSERT_OK(ddl_spec_parse(t, "fuse.json", world, &spec));
    ASSERT_OK(ddl_model_create(MPI_COMM_WORLD, spec, &m));
    unsetenv("DDL_FUSE_BN_RELU");
    unsetenv("DDL_FUSE_ADD_RELU");
    unsetenv("DDL_SHARE_BN_GRAD");
    ddl_spec_destroy(&spec);
    free(t);
    ASSERT_EQ(ddl__model_fused_count(m), fuse ? 5 : 0);
    ASSERT_EQ(ddl__model_grad_alias_count(m), share ? 9 : 4);
    return m;
}

static void compare(int world, const char *dtype)
{
    size_t  item = strcmp(dtype, "f32") == 0 ? sizeof(float) : sizeof(double);
    size_t  xn   = (size_t)B * C_IN * H * W;
    char   *xs   = ddl_test_uniform_batch(xn, item, 11);
    int64_t labels[B];
    for (int b = 0; b < B; b++) {
        labels[b] = b % CLASSES;
    }
    static const char *const what[2] = {"the fused model with shared gradients and the plain one",
                                        "the model with shared gradients and the plain one"};
    for (int k = 0; k < 2; k++) {
        ddl_model_t *f = make(world, dtype, k == 0, true), *u = make(world, dtype, false, false);
        double       loss =
            ddl_test_same_bits(f, u, xs, xn * item, labels, B, STEPS, CLASSES, item, what[k]);
        if (ddl_test_rank == 0) {
            printf("%s on %d ranks: %s: the same bits (last loss %.9g)\n", dtype, world, what[k],
                   loss);
        }
        ddl_model_destroy(&f);
        ddl_model_destroy(&u);
    }
    free(xs);
}

int main(int argc, char **argv)
{
    ddl_test_mpi_init(&argc, &argv);
    int world;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (world != 1 && world != 2 && world != 4) {
        return ddl_test_mpi_finalize();
    }
    compare(world, "f32");
    compare(world, "f64");
    if (ddl_test_rank == 0) {
        printf("test_fuse_bn_relu: ok on %d ranks\n", world);
    }
    return ddl_test_mpi_finalize();
}
