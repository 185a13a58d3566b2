// Model spec validation: the shipped specs parse; every kind of mistake is refused with
// a message naming the key path and its line.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ddl/model.h"
#include "test.h"

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    ASSERT_TRUE(f != NULL);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    ASSERT_TRUE(fread(b, 1, (size_t)n, f) == (size_t)n);
    b[n] = '\0';
    fclose(f);
    return b;
}

// Replaces the first occurrence of `from` in text by `to` (a new string).
static char *edit(const char *text, const char *from, const char *to)
{
    const char *at = strstr(text, from);
    if (at == NULL) {
        fprintf(stderr, "edit: \"%s\" not found\n", from);
        exit(1);
    }
    size_t n   = strlen(text) - strlen(from) + strlen(to);
    char  *out = malloc(n + 1);
    size_t pre = (size_t)(at - text);
    memcpy(out, text, pre);
    strcpy(out + pre, to);
    strcat(out, at + strlen(from));
    return out;
}

// Expects the edited spec to be refused with a message containing each of `want`.
static void refuse(const char *base, const char *from, const char *to, int world,
                   const char *want1, const char *want2)
{
    char       *t = edit(base, from, to);
    ddl_spec_t *s = NULL;
    ddl_status  st = ddl_spec_parse(t, "spec.json", world, &s);
    if (st != DDL_EINVAL || strstr(ddl_last_error(), want1) == NULL ||
        (want2 != NULL && strstr(ddl_last_error(), want2) == NULL)) {
        fprintf(stderr, "edit [%s -> %s]: got %s: \"%s\", wanted \"%s\" and \"%s\"\n", from, to,
                ddl_status_name(st), ddl_last_error(), want1, want2 ? want2 : "");
        exit(1);
    }
    printf("refused as expected: %s\n", ddl_last_error());
    ASSERT_TRUE(s == NULL);
    free(t);
}

// Segmentation specs (an output [batch, classes, D, H, W]) and their generated data.
static void segmentation(void)
{
    const char *seg =
        "{\"world_size\": 2, \"seed\": 9, \"batch_size\": 2,\n"
        " \"input\": {\"shape\": [1, 8, 8, 6], \"partition\": \"vol\"},\n"
        " \"partitions\": {\"vol\": {\"ranks\": [0, 1], \"shape\": [1, 1, 2, 1, 1]}},\n"
        " \"layers\": [{\"type\": \"conv3d\", \"out_channels\": 3, \"kernel\": [3, 3, 3], "
        "\"padding\": [1, 1, 1]}],\n"
        " \"loss\": {\"type\": \"cross_entropy\"},\n"
        " \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1},\n"
        " \"data\": {\"synthetic\": {\"kind\": \"shapes3d\", \"train\": 8, \"test\": 4}}}\n";
    ddl_spec_t *s = NULL;
    ASSERT_OK(ddl_spec_parse(seg, "seg.json", 2, &s));
    ASSERT_EQ(ddl_spec_label_elems(s), 8 * 8 * 6);
    ddl_shape o = ddl_spec_output_shape(s);
    ASSERT_TRUE(o.ndim == 4 && o.d[0] == 3 && o.d[1] == 8 && o.d[3] == 6);
    ASSERT_EQ(ddl_spec_num_classes(s), 3);
    ddl_synth_params p;
    int64_t          ntr = 0, nte = 0;
    ASSERT_TRUE(ddl_spec_synthetic(s, &p, &ntr, &nte));
    ASSERT_TRUE(ntr == 8 && nte == 4 && p.seed == 9 && p.noise == 0.3 && p.dims[2] == 6);
    ddl_spec_destroy(&s);
    refuse(seg, "\"shape\": [1, 1, 2, 1, 1]", "\"shape\": [1, 2, 1, 1, 1]", 2, "spec.json:5: loss",
           "splits dimension 1 (classes) over 2 ranks");
    refuse(seg, "\"kind\": \"shapes3d\"", "\"kind\": \"cubes\"", 2, "data.synthetic.kind",
           "not a known kind");
    refuse(seg, "\"train\": 8", "\"train\": 1", 2, "data.synthetic.train",
           "fewer than one batch (2)");
    refuse(seg, "\"test\": 4", "\"test\": 4, \"noise\": -1", 2, "data.synthetic.noise",
           "outside [0, 100]");
    refuse(seg, "\"test\": 4", "\"test\": 4, \"size\": 4", 2, "data.synthetic.size",
           "unknown key");
    refuse(seg, "\"out_channels\": 3", "\"out_channels\": 2", 2, "data.synthetic",
           "must be [batch, >= 3 classes, 8, 8, 6]");
    refuse(seg, "\"shape\": [1, 8, 8, 6]", "\"shape\": [2, 8, 8, 6]", 2, "data.synthetic",
           "the input shape must be [1, D, H, W]");
    refuse(seg, "\"padding\": [1, 1, 1]", "\"padding\": [0, 1, 1]", 2, "data.synthetic",
           "it is [2, 3, 6, 8, 6]");
    printf("segmentation specs: ok\n");
}

// Dense losses: every kind with its reductions, the target's source and shape, and the
// mistakes a user makes (issue 18).
static void dense_losses(void)
{
    const char *vol =
        "{\"world_size\": 2, \"seed\": 9, \"batch_size\": 2,\n"
        " \"input\": {\"shape\": [1, 8, 8, 6], \"partition\": \"vol\"},\n"
        " \"partitions\": {\"vol\": {\"ranks\": [0, 1], \"shape\": [1, 1, 2, 1, 1]}},\n"
        " \"layers\": [{\"type\": \"conv3d\", \"out_channels\": 1, \"kernel\": [3, 3, 3], "
        "\"padding\": [1, 1, 1]}],\n"
        " \"loss\": {\"type\": \"mse\"},\n"
        " \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1},\n"
        " \"data\": {\"synthetic\": {\"kind\": \"shapes3d\", \"train\": 8, \"test\": 4}}}\n";
    static const struct {
        const char       *loss;
        ddl_loss_kind     kind;
        ddl_target_source target; // the default for generated volumes
    } kinds[] = {
        {"{\"type\": \"mse\"}", DDL_LOSS_MSE, DDL_TARGET_CLEAN},
        {"{\"type\": \"l1\", \"reduction\": \"sum\"}", DDL_LOSS_L1, DDL_TARGET_CLEAN},
        {"{\"type\": \"bce_with_logits\"}", DDL_LOSS_BCE_WITH_LOGITS, DDL_TARGET_MASK},
        {"{\"type\": \"kl_div\", \"reduction\": \"batchmean\"}", DDL_LOSS_KL_DIV, DDL_TARGET_CLEAN},
        {"{\"type\": \"kl_div\", \"log_target\": true}", DDL_LOSS_KL_DIV_LOG_TARGET,
         DDL_TARGET_CLEAN},
        {"{\"type\": \"poisson_nll\"}", DDL_LOSS_POISSON_NLL, DDL_TARGET_CLEAN},
    };
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        char       *t = edit(vol, "{\"type\": \"mse\"}", kinds[i].loss);
        ddl_spec_t *s = NULL;
        ASSERT_OK(ddl_spec_parse(t, "vol.json", 2, &s));
        ASSERT_TRUE(ddl_spec_loss(s) == kinds[i].kind && ddl_spec_dense_targets(s));
        ASSERT_TRUE(ddl_spec_target_source(s) == kinds[i].target);
        ASSERT_EQ(ddl_spec_output_elems(s), 8 * 8 * 6);
        ASSERT_EQ(ddl_spec_num_classes(s), 0);
        ASSERT_EQ(ddl_spec_label_elems(s), 0);
        ddl_spec_destroy(&s);
        free(t);
    }
    // bce with a sigmoid last; the mask target asked for by name.
    char       *bce  = edit(vol, "\"padding\": [1, 1, 1]}],",
                            "\"padding\": [1, 1, 1]}, {\"type\": \"sigmoid\"}],");
    char       *bce2 = edit(bce, "{\"type\": \"mse\"}", "{\"type\": \"bce\"}");
    char       *bce3 = edit(bce2, "\"test\": 4}}", "\"test\": 4}, \"target\": \"mask\"}");
    ddl_spec_t *s    = NULL;
    ASSERT_OK(ddl_spec_parse(bce3, "vol.json", 2, &s));
    ASSERT_TRUE(ddl_spec_loss(s) == DDL_LOSS_BCE && ddl_spec_target_source(s) == DDL_TARGET_MASK);
    ddl_spec_destroy(&s);
    free(bce);
    free(bce3);
    refuse(vol, "{\"type\": \"mse\"}", "{\"type\": \"bce\"}", 2, "spec.json:5: loss",
           "end the network with {\"type\": \"sigmoid\"}");
    free(bce2);
    refuse(vol, "{\"type\": \"mse\"}", "{\"type\": \"huber\"}", 2, "loss.type",
           "\"huber\" is not a known loss (cross_entropy, mse");
    refuse(vol, "{\"type\": \"mse\"}", "{\"type\": \"mse\", \"reduction\": \"batchmean\"}", 2,
           "loss.reduction", "\"batchmean\" is not mean or sum");
    refuse(vol, "{\"type\": \"mse\"}", "{\"type\": \"kl_div\", \"reduction\": \"none\"}", 2,
           "loss.reduction", "not mean or sum or batchmean");
    refuse(vol, "{\"type\": \"mse\"}", "{\"type\": \"mse\", \"log_target\": true}", 2,
           "loss.log_target", "only kl_div takes log_target");
    refuse(vol, "{\"type\": \"mse\"}", "{\"type\": \"kl_div\", \"log_target\": 1}", 2,
           "loss.log_target", NULL);
    refuse(vol, "\"out_channels\": 1", "\"out_channels\": 3", 2, "data.synthetic",
           "must be [batch, 1, 8, 8, 6]; it is [2, 3, 8, 8, 6]");
    refuse(vol, "\"test\": 4}}", "\"test\": 4}, \"target\": \"labels\"}", 2, "data.target",
           "mse trains on dense targets shaped like the output, not class labels");
    refuse(vol, "\"test\": 4}}", "\"test\": 4}, \"target\": \"image\"}", 2, "data.target",
           "generated volumes give \"clean\" or \"mask\"");
    refuse(vol, "\"test\": 4}}", "\"test\": 4}, \"target\": \"noisy\"}", 2, "data.target",
           "\"noisy\" is not labels, image, clean or mask");
    // A classifier asks for labels only.
    char *ce  = edit(vol, "{\"type\": \"mse\"}", "{\"type\": \"cross_entropy\"}");
    char *ce3 = edit(ce, "\"out_channels\": 1", "\"out_channels\": 3");
    refuse(ce3, "\"test\": 4}}", "\"test\": 4}, \"target\": \"clean\"}", 2, "data.target",
           "cross_entropy trains on class labels, not \"clean\"");
    free(ce);
    free(ce3);
    // IDX data: the image is the target (an autoencoder), as many values as the input.
    const char *ae =
        "{\"world_size\": 1, \"batch_size\": 4,\n"
        " \"input\": {\"shape\": [1, 28, 28], \"partition\": \"p\"},\n"
        " \"partitions\": {\"p\": {\"ranks\": [0], \"shape\": [1, 1, 1, 1]},\n"
        "                \"f\": {\"ranks\": [0], \"shape\": [1, 1]}},\n"
        " \"layers\": [{\"type\": \"flatten\", \"to\": \"f\"},\n"
        "   {\"type\": \"linear\", \"out_features\": 784, \"P_y\": \"f\", \"P_w\": \"f\"}],\n"
        " \"loss\": {\"type\": \"mse\"}}\n";
    ASSERT_OK(ddl_spec_parse(ae, "ae.json", 1, &s));
    ASSERT_TRUE(ddl_spec_target_source(s) == DDL_TARGET_IMAGE && ddl_spec_output_elems(s) == 784);
    ddl_spec_destroy(&s);
    refuse(ae, "\"out_features\": 784", "\"out_features\": 783", 1, "data.target",
           "the output must hold as many; it is [783] (783)");
    refuse(ae, "\"loss\": {\"type\": \"mse\"}}",
           "\"loss\": {\"type\": \"mse\"}, \"data\": {\"target\": \"mask\"}}", 1, "data.target",
           "\"mask\" needs generated volumes");
    printf("dense losses: ok\n");
}

// The line (1-based) of the first occurrence of needle in text.
static int line_at(const char *text, const char *needle)
{
    const char *at = strstr(text, needle);
    ASSERT_TRUE(at != NULL);
    int line = 1;
    for (const char *p = text; p < at; p++) {
        line += *p == '\n';
    }
    return line;
}

// A residual network on 4 ranks (feature partition [1, 1, 2, 2]): r0 feeds both c1 and
// the add, one layer per line so the tests can name lines.
static const char graph_spec[] =
    "{\n"
    "  \"world_size\": 4,\n"
    "  \"batch_size\": 4,\n"
    "  \"input\": {\"shape\": [2, 6, 6], \"partition\": \"p\"},\n"
    "  \"partitions\": {\"p\": {\"ranks\": [0, 1, 2, 3], \"shape\": [1, 1, 2, 2]},\n"
    "                 \"one\": {\"ranks\": [0], \"shape\": [1, 1, 1, 1]},\n"
    "                 \"ch\": {\"ranks\": [0, 1], \"shape\": [1, 2, 1, 1]},\n"
    "                 \"flat\": {\"ranks\": [0], \"shape\": [1, 1]}},\n"
    "  \"layers\": [\n"
    "    {\"type\": \"conv2d\", \"name\": \"stem\", \"out_channels\": 4, \"kernel\": [3, 3], \"padding\": [1, 1]},\n"
    "    {\"type\": \"relu\", \"name\": \"r0\"},\n"
    "    {\"type\": \"conv2d\", \"name\": \"c1\", \"out_channels\": 4, \"kernel\": [3, 3], \"padding\": [1, 1]},\n"
    "    {\"type\": \"relu\", \"name\": \"r1\"},\n"
    "    {\"type\": \"conv2d\", \"name\": \"c2\", \"out_channels\": 4, \"kernel\": [3, 3], \"padding\": [1, 1]},\n"
    "    {\"type\": \"add\", \"name\": \"sum\", \"from\": [\"c2\", \"r0\"]},\n"
    "    {\"type\": \"relu\"},\n"
    "    {\"type\": \"repartition\", \"to\": \"one\"},\n"
    "    {\"type\": \"adaptive_avgpool2d\", \"output_size\": 1},\n"
    "    {\"type\": \"flatten\", \"to\": \"flat\"},\n"
    "    {\"type\": \"linear\", \"out_features\": 3, \"P_y\": \"flat\", \"P_w\": \"flat\"}\n"
    "  ],\n"
    "  \"loss\": {\"type\": \"cross_entropy\"}\n"
    "}\n";

// Expects the edited graph spec refused at `key` on the line of `line_of` in the base, the
// message containing want.
static void refuse_graph(const char *from, const char *to, const char *line_of, const char *key,
                         const char *want)
{
    char head[160];
    snprintf(head, sizeof head, "spec.json:%d: %s: ", line_at(graph_spec, line_of), key);
    refuse(graph_spec, from, to, 4, head, want);
}

static void graph_tests(void)
{
    ddl_spec_t *s = NULL;
    ASSERT_OK(ddl_spec_parse(graph_spec, "spec.json", 4, &s));
    ASSERT_EQ(ddl_spec_num_classes(s), 3);
    ddl_spec_destroy(&s);
    // Layers may name later layers: the model runs them in topological order.
    {
        char *t = edit(graph_spec, "\"name\": \"r0\"}", "\"name\": \"r0\", \"from\": \"stem\"}");
        char *u = edit(t, "\"name\": \"stem\",", "\"name\": \"stem\", \"from\": \"input\",");
        ASSERT_OK(ddl_spec_parse(u, "spec.json", 4, &s));
        ddl_spec_destroy(&s);
        free(t);
        free(u);
    }
    // A cycle, named layer by layer from the lowest index.
    refuse_graph("\"name\": \"c1\",", "\"name\": \"c1\", \"from\": \"sum\",", "\"name\": \"c1\"",
                 "layers[2].from",
                 "the layers form a cycle: \"c1\" -> \"r1\" -> \"c2\" -> \"sum\" -> \"c1\"");
    refuse_graph("\"name\": \"c1\",", "\"name\": \"c1\", \"from\": \"c1\",", "\"name\": \"c1\"",
                 "layers[2].from", "takes its own output (a cycle)");
    // A dangling name.
    refuse_graph("[\"c2\", \"r0\"]", "[\"c2\", \"r9\"]", "\"name\": \"sum\"", "layers[5].from[1]",
                 "no layer is named \"r9\"");
    // Several inputs to a one-input layer; a join with one.
    refuse_graph("{\"type\": \"relu\"},", "{\"type\": \"relu\", \"from\": [\"sum\", \"r0\"]},",
                 "{\"type\": \"relu\"},", "layers[6].from", "relu takes one input, \"from\" names 2");
    refuse_graph("\"from\": [\"c2\", \"r0\"]", "\"from\": \"c2\"", "\"name\": \"sum\"",
                 "layers[5].from", "add joins at least 2 operands");
    // An add of different shapes names both operands, their shapes and partitions.
    refuse_graph("\"name\": \"c2\", \"out_channels\": 4", "\"name\": \"c2\", \"out_channels\": 5",
                 "\"name\": \"sum\"", "layers[5].from",
                 "add operands must have the same shape: \"c2\" [4, 5, 6, 6] on \"p\" and \"r0\" "
                 "[4, 4, 6, 6] on \"p\" differ");
    // ... and of different partitions.
    refuse_graph("{\"type\": \"add\", \"name\": \"sum\", \"from\": [\"c2\", \"r0\"]}",
                 "{\"type\": \"repartition\", \"name\": \"r0one\", \"from\": \"r0\", \"to\": \"one\"}, "
                 "{\"type\": \"add\", \"name\": \"sum\", \"from\": [\"c2\", \"r0\", \"r0one\"]}",
                 "\"name\": \"sum\"", "layers[6].from",
                 "add operands must be on one partition: \"c2\" [4, 4, 6, 6] on \"p\" and \"r0one\" "
                 "[4, 4, 6, 6] on \"one\" differ");
    // Concat along channels refuses a partition that splits them.
    {
        char *t = edit(graph_spec, "\"partition\": \"p\"}", "\"partition\": \"ch\"}");
        char *u = edit(t, "    {\"type\": \"conv2d\", \"name\": \"stem\"",
                       "    {\"type\": \"concat\", \"from\": [\"input\", \"input\"]}, "
                       "{\"type\": \"conv2d\", \"name\": \"stem\"");
        char head[96];
        snprintf(head, sizeof head, "spec.json:%d: layers[0].from: ",
                 line_at(graph_spec, "\"name\": \"stem\""));
        refuse(u, "\"world_size\"", "\"world_size\"", 4, head,
               "concat joins along dim 1 (channels), which partition \"ch\" splits 2 ways");
        free(t);
        free(u);
    }
    // An output no layer uses (r1's, once c2 reads r0).
    refuse_graph("\"name\": \"c2\",", "\"name\": \"c2\", \"from\": \"r0\",", "\"name\": \"r1\"",
                 "layers[3]", "the output of \"r1\" is used by no layer");
    // Adaptive pooling: output sizes that do not divide the input are refused.
    refuse_graph("\"output_size\": 1", "\"output_size\": [4, 4]", "\"output_size\"",
                 "layers[8].output_size", "output size 4 does not divide the input size 6");
    // Global pooling on the spatially split partition leaves dims of size 1 split, which
    // no repartition can move (DistDL's rule): refused at the repartition.
    refuse_graph("{\"type\": \"repartition\", \"to\": \"one\"},\n    {\"type\": \"adaptive_avgpool2d\", "
                 "\"output_size\": 1},",
                 "{\"type\": \"adaptive_avgpool2d\", \"output_size\": 1},\n    {\"type\": \"repartition\", "
                 "\"to\": \"one\"},",
                 "\"output_size\": 1", "layers[8]",
                 "the tensor [4, 4, 1, 1] has size 1 in dim 2, which partition \"p\" splits 2 ways");
    refuse_graph("\"name\": \"r0\"", "\"name\": \"input\"", "\"name\": \"r0\"", "layers[1].name",
                 "\"input\" is reserved");
    refuse_graph("[\"c2\", \"r0\"]", "[\"c2\", 7]", "\"name\": \"sum\"", "layers[5].from[1]",
                 "must be a layer name");
    // A divisible adaptive pool is an average pool (output 3x3 here).
    {
        char *t = edit(graph_spec, "\"output_size\": 1", "\"output_size\": 3");
        ASSERT_OK(ddl_spec_parse(t, "spec.json", 4, &s));
        ddl_spec_destroy(&s);
        free(t);
    }
}

// The short batch sizes Predict and Evaluate run at (issue 17): by default the powers of
// two below batch_size, from the most ranks that split the batch; or the spec's list.
static void expect_batches(const char *base, const char *from, const char *to, int n,
                           const int64_t *want)
{
    char       *t = edit(base, from, to);
    ddl_spec_t *s = NULL;
    ASSERT_OK(ddl_spec_parse(t, "spec.json", 4, &s));
    const int64_t *got = NULL;
    ASSERT_EQ(ddl_spec_inference_batches(s, &got), n);
    for (int i = 0; i < n; i++) {
        ASSERT_EQ(got[i], want[i]);
    }
    ddl_spec_destroy(&s);
    free(t);
}

static void check_inference_batches(const char *base)
{
    const char *at = "\"batch_size\": 64";
    expect_batches(base, at, at, 6, (int64_t[]){1, 2, 4, 8, 16, 32});
    expect_batches(base, at, "\"batch_size\": 64, \"inference_batches\": [3, 10, 63]", 3,
                   (int64_t[]){3, 10, 63});
    expect_batches(base, at, "\"batch_size\": 64, \"inference_batches\": []", 0, NULL);
    expect_batches(base, at, "\"batch_size\": 1", 0, NULL);
    expect_batches(base, at, "\"batch_size\": 5", 3, (int64_t[]){1, 2, 4});
    // A partition that splits the batch over 2 ranks: each needs a row of a short batch.
    const char *conv = "\"ranks\": [0, 1, 2, 3], \"shape\": [1, 1, 2, 2]";
    char       *dp   = edit(base, conv, "\"ranks\": [0, 1, 2, 3], \"shape\": [2, 1, 2, 1]");
    expect_batches(dp, at, at, 5, (int64_t[]){2, 4, 8, 16, 32});
    refuse(dp, at, "\"batch_size\": 64, \"inference_batches\": [1, 8]", 4, "inference_batches[0]",
           "1 samples are fewer than the 2 ranks partition \"conv\"");
    free(dp);
    refuse(base, at, "\"batch_size\": 64, \"inference_batches\": 8", 4, "inference_batches",
           "must be an array");
    refuse(base, at, "\"batch_size\": 64, \"inference_batches\": [8, \"16\"]", 4,
           "inference_batches[1]", "must be an integer");
    refuse(base, at, "\"batch_size\": 64, \"inference_batches\": [1, 64]", 4,
           "inference_batches[1]", "64 is not a short batch: it must be in [1, 64)");
    refuse(base, at, "\"batch_size\": 64, \"inference_batches\": [0]", 4, "inference_batches[0]",
           "0 is not a short batch");
    refuse(base, at, "\"batch_size\": 64, \"inference_batches\": [8, 8]", 4, "inference_batches[1]",
           "8 after 8: the sizes must be ascending");
    refuse(base, at, "\"batch_size\": 64, \"inference_batches\": [8, 4]", 4, "inference_batches[1]",
           "ascending");
}

int main(int argc, char **argv)
{
    ASSERT_TRUE(argc == 2);  // the directory of the shipped specs
    const char *names[] = {"lenet5-1.json", "lenet5-2.json", "lenet5-4.json", "mlp-4.json"};
    const int   worlds[] = {1, 2, 4, 4};
    for (int i = 0; i < 4; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", argv[1], names[i]);
        ddl_spec_t *s = NULL;
        ASSERT_OK(ddl_spec_load(path, worlds[i], &s));
        ASSERT_EQ(ddl_spec_world_size(s), worlds[i]);
        ASSERT_EQ(ddl_spec_num_classes(s), 10);
        char want[64];
        snprintf(want, sizeof want, "%.*s", (int)(strlen(names[i]) - 5), names[i]);
        ASSERT_TRUE(strcmp(ddl_spec_name(s), want) == 0); // the file's top-level "name"
        ddl_spec_destroy(&s);
    }
    char  path[1024];
    snprintf(path, sizeof path, "%s/lenet5-4.json", argv[1]);
    char *base = slurp(path);
    // Line numbers: "world_size" is on line 3 of the shipped file.
    refuse(base, "\"world_size\": 4", "\"world_size\": 4, \"world_sise\": 4", 4,
           "spec.json:3: world_sise: unknown key", NULL);
    refuse(base, "\"seed\": 1", "\"seed\": \"one\"", 4, "spec.json:4: seed", "integer");
    refuse(base, "\"seed\": 1", "\"seed\": 1, \"seed\": 2", 4, "duplicate", NULL);
    refuse(base, "\"world_size\": 4", "\"world_size\": 4", 2, "world_size", "mpirun -np 4");
    refuse(base, "\"ranks\": [0, 1, 2, 3], \"shape\": [1, 1, 2, 2]",
           "\"ranks\": [0, 1, 2, 7], \"shape\": [1, 1, 2, 2]", 4, "partitions.conv.ranks[3]",
           "outside the world of 4");
    refuse(base, "\"kernel\": [5, 5], \"padding\": [2, 2]", "\"kernel\": [5, 5, 5], \"padding\": [2, 2]",
           4, "layers[1].kernel", "expected 2 entries, got 3");
    refuse(base, "\"out_features\": 120,", "\"in_features\": 300, \"out_features\": 120,", 4,
           "layers[10].in_features", "does not match the 400 features");
    refuse(base, "{\"type\": \"relu\"},", "{\"type\": \"relu6\"},", 4, "layers[2].type",
           "unknown layer type");
    refuse(base, "\"P_y\": \"fc_out\", \"P_w\": \"fc_mtx\"}", "\"P_y\": \"fc_outt\", \"P_w\": \"fc_mtx\"}",
           4, "layers[10].P_y", "no partition named");
    refuse(base, "\"type\": \"adam\"", "\"type\": \"adagrad\"", 4, "optimizer.type", "adagrad");
    refuse(base, "{\"type\": \"repartition\", \"to\": \"flat\"},", "", 4, "layers[7]",
           "insert a repartition");
    refuse(base, "\"lr\": 0.002", "\"lr\": -1", 4, "optimizer.lr", "outside");
    refuse(base, "\"batch_size\": 64", "\"batch_size\": 0", 4, "batch_size", "outside");
    refuse(base, "\"layers\": [", "\"layers\": [{\"type\": \"linear\", \"out_features\": 3, "
                                  "\"P_y\": \"fc_out\", \"P_w\": \"fc_mtx\"},",
           4, "layers[0]", "flatten it first");
    refuse(base, "{", "[", 4, "spec.json:", NULL);  // not JSON at all
    check_inference_batches(base);

    // ---- hostile sizes (issue 7): bounded before anything is multiplied or sized ----
    // Dimensions up to 2^40 were accepted and their products overflowed.
    refuse(base, "\"shape\": [1, 28, 28]", "\"shape\": [1, 1099511627776, 1099511627776]", 4,
           "input.shape[1]", "outside [1, 17179869184]");
    refuse(base, "\"shape\": [1, 28, 28]", "\"shape\": [16384, 16384, 28]", 4, "input.shape",
           "more than 2^34 elements");
    refuse(base, "\"kernel\": [5, 5], \"padding\": [2, 2]",
           "\"kernel\": [5, 2097152], \"padding\": [2, 2]", 4, "layers[1].kernel[1]",
           "outside [1, 1048576]");
    refuse(base, "\"out_features\": 120,", "\"out_features\": 17179869184,", 4, "layers[10]",
           "the weight [17179869184, 400] has more than 2^34");
    refuse(base, "\"out_channels\": 6,", "\"out_channels\": 1073741824,", 4, "layers[1]",
           "has more than 2^34 elements");
    refuse(base, "\"ranks\": [0, 1, 2, 3], \"shape\": [1, 1, 2, 2]",
           "\"ranks\": [0, 1, 2, 3], \"shape\": [65536, 65536, 65536, 65536]", 4,
           "partitions.conv.shape[0]", "outside [1, 4096]");
    // Upsample's scale_factor is bounded (1e8 spun for minutes, 1e300 was undefined).
    refuse(base, "{\"type\": \"relu\"},", "{\"type\": \"upsample\", \"scale_factor\": 1e8},", 4,
           "layers[2].scale_factor", "outside (0, 1024]");
    refuse(base, "{\"type\": \"relu\"},", "{\"type\": \"upsample\", \"scale_factor\": 1e300},",
           4, "layers[2].scale_factor", "outside (0, 1024]");
    // At most DDL_MAX_LAYERS layers.
    {
        size_t n    = 4097;
        char  *many = malloc(n * 18 + 32);
        strcpy(many, "\"layers\": [");
        for (size_t i = 0; i < n; i++) {
            strcat(many, "{\"type\": \"relu\"},");
        }
        refuse(base, "\"layers\": [", many, 4, "layers", "at most 4096");
        free(many);
    }
    // ---- names and types, checked up front -------------------------------------------
    refuse(base, "\"name\": \"conv2\"", "\"name\": \"conv1\"", 4, "layers[4].name",
           "\"conv1\" is also the name of layers[1]");
    refuse(base, "\"name\": \"fc2\"", "\"name\": \"fc/2\"", 4, "layers[12].name",
           "not a valid layer name");
    refuse(base, "\"name\": \"fc2\"", "\"name\": \"\"", 4, "layers[12].name",
           "not a valid layer name");
    // The model's name is served (KServe paths) and names a replacement's checkpoint
    // directory: letters, digits, '.', '_', '-', not leading '.', at most 63.
    static const char *const bad_model_names[] = {
        "\"name\": \"\"",
        "\"name\": \"a b\"",
        "\"name\": \".hidden\"",
        "\"name\": \"a/b\"",
        "\"name\": \"a\\u0000b\"",
        "\"name\": 5",
        "\"name\": \"n123456789012345678901234567890123456789012345678901234567890123\""};
    for (size_t i = 0; i < sizeof bad_model_names / sizeof *bad_model_names; i++) {
        refuse(base, "\"name\": \"lenet5-4\"", bad_model_names[i], 4,
               i == 4 ? "spec.json:2" : "name",
               i == 4   ? "\\u0000 is not allowed"
               : i == 5 ? "must be a string"
                        : "not a valid model name");
    }
    refuse(base, "{\"type\": \"maxpool2d\",", "{\"type\": \"maxpool2d}\",", 4, "layers[3].type",
           "unknown layer type \"maxpool2d}\"");
    refuse(base, "{\"type\": \"conv2d\", \"name\": \"conv1\"",
           "{\"type\": \"conv2dx\", \"name\": \"conv1\"", 4, "layers[1].type",
           "unknown layer type");
    refuse(base, "{\"type\": \"maxpool2d\",", "{\"type\": \"maxpool4d\",", 4, "layers[3]",
           "only 1, 2 and 3 spatial dimensions");
    free(base);
    graph_tests();

    // A FIFO as the spec path is refused at once instead of blocking in open/read.
    {
        char fifo[64];
        snprintf(fifo, sizeof fifo, "/tmp/ddl-spec-fifo-%ld", (long)getpid());
        unlink(fifo);
        ASSERT_TRUE(mkfifo(fifo, 0600) == 0);
        ddl_spec_t *sp = NULL;
        ASSERT_STATUS(ddl_spec_load(fifo, 4, &sp), DDL_EINVAL);
        ASSERT_TRUE(strstr(ddl_last_error(), "not a regular file") != NULL && sp == NULL);
        unlink(fifo);
        ASSERT_STATUS(ddl_spec_load("/", 4, &sp), DDL_EINVAL);
    }
    segmentation();
    dense_losses();
    printf("test_spec: ok\n");
    return 0;
}
