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
    refuse(base, "{\"type\": \"maxpool2d\",", "{\"type\": \"maxpool2d}\",", 4, "layers[3].type",
           "unknown layer type \"maxpool2d}\"");
    refuse(base, "{\"type\": \"conv2d\", \"name\": \"conv1\"",
           "{\"type\": \"conv2dx\", \"name\": \"conv1\"", 4, "layers[1].type",
           "unknown layer type");
    refuse(base, "{\"type\": \"maxpool2d\",", "{\"type\": \"maxpool4d\",", 4, "layers[3]",
           "only 1, 2 and 3 spatial dimensions");
    free(base);

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
    printf("test_spec: ok\n");
    return 0;
}
