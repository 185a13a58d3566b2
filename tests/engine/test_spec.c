// Model spec validation: the shipped specs parse; every kind of mistake is refused with
// a message naming the key path and its line.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    free(base);
    printf("test_spec: ok\n");
    return 0;
}
