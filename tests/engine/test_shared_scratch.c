// The layers' shared scratch (ddl_layer_share_scratch, the model's give_scratch): the
// model whose spatially split convolutions and pools keep their halo-padded buffers, crops
// and kernel workspaces in one shared block must give exactly the bits of the model whose
// layers own them (DDL_SHARE_SCRATCH=0), in f32 and f64, 2-D and 3-D, on 1, 2 and 4 ranks.
// What sharing changes, and what the network covers:
//   - a conv's padded input is rebuilt in backward from the x of its forward, and its
//     gradient is computed over it after dw (conv_backward's two kernel calls): c0, c1,
//     c3 (k 3, padding 1: zero pads restored on the boundary ranks before each use);
//   - a conv whose window needs a crop of the padded buffer (stride 2: c2);
//   - a max pool with padding (its pads hold -inf, restored before each forward: every
//     other layer writes zeros or data there) and an average pool with padding (pads 0);
//   - an upsample (its gathered input and staging, within one call);
//   - a concat, a fused batch norm, and a channel-split linear layer: layers that keep
//     their own buffers;
//   - a short-batch prediction (a forward-only copy, which uses the same block).
// The network is small: DDL_SHARE_MIN_BYTES=0 makes every split conv share its padded
// buffers. A third model, with DDL_SHARE_MIN_BYTES=1T, shares only the convs' kernel
// workspaces (and the pools' and upsample's buffers): a small input keeps its padded
// buffers for the step, as the default does under 2 MiB per rank.
// Compared bit for bit: the loss and hits of three Adam steps, every parameter after
// them, an evaluation, a prediction. The sharing model must report a scratch block and
// its users, the other none: two models that both skipped sharing would prove nothing.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddl/base.h"
#include "ddl/model.h"
#include "engine/model_internal.h"
#include "mpi_test.h"

enum { B = 3, C_IN = 2, S = 8, CLASSES = 3, STEPS = 3 };

static char *spec_text(int world, int nsp, const char *dtype)
{
    // The first spatial dims split: [1, 1, 1 | 2 | 2 x 2, ...].
    int  sp[3] = {1, 1, 1};
    if (world == 2) {
        sp[0] = 2;
    } else if (world == 4) {
        sp[0] = sp[1] = 2;
    }
    char ranks[32], in[64], part[64], k3[32], p1[32], s2[32], k1[32], one[32];
    const char *s1 = nsp == 2 ? "[1, 1]" : "[1, 1, 1]";
    ddl_test_rank_list(world, ranks, sizeof ranks);
    snprintf(in, sizeof in, nsp == 2 ? "%d, %d, %d" : "%d, %d, %d, %d", C_IN, S, S, S);
    snprintf(part, sizeof part, nsp == 2 ? "1, 1, %d, %d" : "1, 1, %d, %d, %d", sp[0], sp[1],
             sp[2]);
    snprintf(k3, sizeof k3, nsp == 2 ? "[3, 3]" : "[3, 3, 3]");
    snprintf(p1, sizeof p1, nsp == 2 ? "[1, 1]" : "[1, 1, 1]");
    snprintf(s2, sizeof s2, nsp == 2 ? "[2, 2]" : "[2, 2, 2]");
    snprintf(k1, sizeof k1, nsp == 2 ? "[1, 1]" : "[1, 1, 1]");
    snprintf(one, sizeof one, nsp == 2 ? "1, 1" : "1, 1, 1");
    char *t = malloc(16384);
    snprintf(
        t, 16384,
        "{\"world_size\": %d, \"seed\": 5, \"dtype\": \"%s\", \"batch_size\": %d,\n"
        " \"inference_batches\": [2],\n"
        " \"input\": {\"shape\": [%s], \"partition\": \"p\"},\n"
        " \"partitions\": {\"p\": {\"ranks\": [%s], \"shape\": [%s]},\n"
        "   \"chs\": {\"ranks\": [%s], \"shape\": [1, %d, %s]},\n"
        "   \"flat\": {\"ranks\": [%s], \"shape\": [1, %d]},\n"
        "   \"out\": {\"ranks\": [0], \"shape\": [1, 1]}},\n"
        " \"layers\": [\n"
        "  {\"type\": \"conv%dd\", \"name\": \"c0\", \"out_channels\": 4, \"kernel\": %s, "
        "\"padding\": %s},\n"
        "  {\"type\": \"batchnorm\", \"name\": \"b0\"}, {\"type\": \"relu\", \"name\": \"r0\"},\n"
        "  {\"type\": \"maxpool%dd\", \"name\": \"mp\", \"kernel\": %s, \"stride\": %s, "
        "\"padding\": %s},\n"
        "  {\"type\": \"conv%dd\", \"name\": \"c1\", \"out_channels\": 4, \"kernel\": %s, "
        "\"padding\": %s, \"bias\": false},\n"
        "  {\"type\": \"avgpool%dd\", \"name\": \"ap\", \"kernel\": %s, \"stride\": %s, "
        "\"padding\": %s},\n"
        "  {\"type\": \"conv%dd\", \"name\": \"c2\", \"out_channels\": 4, \"kernel\": %s, "
        "\"stride\": %s, \"padding\": %s},\n"
        "  {\"type\": \"upsample\", \"name\": \"up\", \"mode\": \"linear\", \"scale_factor\": 2},\n"
        "  {\"type\": \"concat\", \"name\": \"cat\", \"from\": [\"up\", \"ap\"]},\n"
        "  {\"type\": \"conv%dd\", \"name\": \"c3\", \"out_channels\": 4, \"kernel\": %s, "
        "\"padding\": %s},\n"
        "  {\"type\": \"relu\", \"name\": \"r3\"},\n"
        "  {\"type\": \"conv%dd\", \"name\": \"c4\", \"out_channels\": 4, \"kernel\": %s},\n"
        "  {\"type\": \"repartition\", \"to\": \"chs\"},\n"
        "  {\"type\": \"adaptive_avgpool%dd\", \"output_size\": 1},\n"
        "  {\"type\": \"flatten\", \"to\": \"flat\"},\n"
        "  {\"type\": \"linear\", \"name\": \"fc\", \"out_features\": %d, \"P_y\": \"out\", "
        "\"P_w\": \"flat\"}],\n"
        " \"loss\": {\"type\": \"cross_entropy\"},\n"
        " \"optimizer\": {\"type\": \"adam\", \"lr\": 0.05}}\n",
        world, dtype, B, in, ranks, part, ranks, world, one, ranks, world, nsp, k3, p1, nsp, k3,
        s2, p1, nsp, k3, p1, nsp, k3, s1, p1, nsp, k3, s2, p1, nsp,
        k3, p1, nsp, k1, nsp, CLASSES);
    return t;
}

// min_bytes NULL: nothing shared (DDL_SHARE_SCRATCH=0); else DDL_SHARE_MIN_BYTES.
static ddl_model_t *make(int world, int nsp, const char *dtype, const char *min_bytes)
{
    char        *t    = spec_text(world, nsp, dtype);
    ddl_spec_t  *spec = NULL;
    ddl_model_t *m    = NULL;
    if (min_bytes == NULL) {
        setenv("DDL_SHARE_SCRATCH", "0", 1);
    } else {
        setenv("DDL_SHARE_MIN_BYTES", min_bytes, 1);
    }
    ASSERT_OK(ddl_spec_parse(t, "shared.json", world, &spec));
    ASSERT_OK(ddl_model_create(MPI_COMM_WORLD, spec, &m));
    unsetenv("DDL_SHARE_SCRATCH");
    unsetenv("DDL_SHARE_MIN_BYTES");
    ddl_spec_destroy(&spec);
    free(t);
    return m;
}

static void compare(int world, int nsp, const char *dtype)
{
    size_t  item = strcmp(dtype, "f32") == 0 ? sizeof(float) : sizeof(double);
    size_t  xn   = (size_t)B * C_IN * S * S * (nsp == 3 ? S : 1);
    char   *xs   = ddl_test_uniform_batch(xn, item, 13);
    int64_t labels[B];
    for (int b = 0; b < B; b++) {
        labels[b] = b % CLASSES;
    }
    ddl_model_t *f = make(world, nsp, dtype, "0"), *u = make(world, nsp, dtype, NULL);
    int          fu, uu;
    size_t       fb = ddl__model_scratch_bytes(f, &fu), ub = ddl__model_scratch_bytes(u, &uu);
    ASSERT_TRUE(fb > 0 && fu >= (world > 1 ? 8 : 4)); // convs and pools, model and copy
    ASSERT_TRUE(ub == 0 && uu == 0);
    double loss = ddl_test_same_bits(f, u, xs, xn * item, labels, B, STEPS, CLASSES, item,
                                     "the sharing and the owning model");
    ddl_model_destroy(&f);
    // Only the workspaces: every conv still a user (its kernel's workspace), the block no
    // larger than with the padded buffers in it.
    ddl_model_t *w = make(world, nsp, dtype, "1T");
    int          wu;
    size_t       wb = ddl__model_scratch_bytes(w, &wu);
    ASSERT_TRUE(wb > 0 && wb <= fb && wu >= (world > 1 ? 8 : 4));
    ddl_model_t *u2 = make(world, nsp, dtype, NULL);
    double       wl = ddl_test_same_bits(w, u2, xs, xn * item, labels, B, STEPS, CLASSES, item,
                                         "the workspace-sharing and the owning model");
    if (ddl_test_rank == 0) {
        printf("%dd %s on %d ranks: shared == owned bit for bit (scratch %zu bytes, %d users; "
               "workspaces only %zu bytes, %d users; last loss %.9g, %.9g)\n",
               nsp, dtype, world, fb, fu, wb, wu, loss, wl);
    }
    ddl_model_destroy(&w);
    ddl_model_destroy(&u2);
    ddl_model_destroy(&u);
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
    for (int nsp = 2; nsp <= 3; nsp++) {
        compare(world, nsp, "f32");
        compare(world, nsp, "f64");
    }
    if (ddl_test_rank == 0) {
        printf("test_shared_scratch: ok on %d ranks\n", world);
    }
    return ddl_test_mpi_finalize();
}
