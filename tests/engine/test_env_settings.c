// The engine's settings from the environment (DDL_SHARE_SCRATCH, DDL_SHARE_MIN_BYTES,
// DDL_FUSE_BN_RELU, DDL_FUSE_ADD_RELU, DDL_SHARE_BN_GRAD, DDL_MEMORY_LIMIT, DDL_CONV_DIRECT,
// DDL_HALO_OVERLAP; engine/spec_internal.h, `tuning`):
//   - ddl_parse_bytes takes what a byte count is and nothing else;
//   - a bad value fails the spec parse and the model's creation with DDL_EINVAL, naming
//     the variable and the value, and leaves nothing allocated (each of them used to fall
//     back to its default in silence, and DDL_MEMORY_LIMIT=abc switched the memory check
//     to MemAvailable);
//   - a bad value on one rank only fails every rank alike;
//   - good values that differ between ranks fail every rank alike, with one message: the
//     ranks would otherwise build different layers (a conv sharing its scratch rebuilds its
//     padded input in backward with an exchange the other rank never makes);
//   - a good value reaches the layers: DDL_SHARE_MIN_BYTES=0 makes the split convs share
//     their padded buffers (a larger block), 1T keeps them their own.
// Run on 1 and 2 ranks (the one-rank cases are skipped on 1).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddl/base.h"
#include "ddl/model.h"
#include "engine/model_internal.h"
#include "mpi_test.h"

static int world;

// A small 2-D network whose convolutions are split over the world's ranks.
static char *spec_text(void)
{
    char *t = malloc(4096);
    snprintf(
        t, 4096,
        "{\"world_size\": %d, \"seed\": 3, \"dtype\": \"f32\", \"batch_size\": 4,\n"
        " \"input\": {\"shape\": [2, 16, 16], \"partition\": \"p\"},\n"
        " \"partitions\": {\"p\": {\"ranks\": [%s], \"shape\": [1, 1, %d, 1]},\n"
        "   \"one\": {\"ranks\": [0], \"shape\": [1, 1, 1, 1]},\n"
        "   \"out\": {\"ranks\": [0], \"shape\": [1, 1]}},\n"
        " \"layers\": [\n"
        "  {\"type\": \"conv2d\", \"name\": \"c0\", \"out_channels\": 4, \"kernel\": [3, 3], "
        "\"padding\": [1, 1]},\n"
        "  {\"type\": \"batchnorm\", \"name\": \"b0\"}, {\"type\": \"relu\", \"name\": \"r0\"},\n"
        "  {\"type\": \"conv2d\", \"name\": \"c1\", \"out_channels\": 4, \"kernel\": [3, 3], "
        "\"padding\": [1, 1]},\n"
        "  {\"type\": \"repartition\", \"to\": \"one\"},\n"
        "  {\"type\": \"flatten\", \"to\": \"out\"},\n"
        "  {\"type\": \"linear\", \"name\": \"fc\", \"out_features\": 3, \"P_y\": \"out\", "
        "\"P_w\": \"out\"}],\n"
        " \"loss\": {\"type\": \"cross_entropy\"},\n"
        " \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}\n",
        world, world == 2 ? "0, 1" : "0", world);
    return t;
}

static void check_parse_bytes(void)
{
    static const struct {
        const char *text;
        double      want;
    } good[] = {{"0", 0},        {"2097152", 2097152},    {"2M", 2097152},
                {"2m", 2097152}, {"512k", 524288},        {"1.5G", 1610612736},
                {"1e3", 1000},   {"3T", 3298534883328.0}, {".5K", 512}};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        double v = -1;
        ASSERT_TRUE(ddl_parse_bytes(good[i].text, &v));
        ASSERT_NEAR(v, good[i].want, 0);
    }
    static const char *const bad[] = {"",    "abc", "-1",   " 5", "5 ", "2MB",   "2MM", "M",
                                      "inf", "nan", "0x10", "+5", ".",  "1e999", "5\n", "1 K"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        double v = 42;
        if (ddl_parse_bytes(bad[i], &v)) {
            TEST_FAIL_("ddl_parse_bytes took \"%s\" as %g", bad[i], v);
        }
        ASSERT_NEAR(v, 42, 0); // untouched
    }
    ASSERT_TRUE(!ddl_parse_bytes(NULL, &(double){0}));
}

// With `var` set to `value` on the ranks where `here` is true: the spec parse (on those
// ranks) and the model's creation (on all) fail with DDL_EINVAL, every rank alike, and the
// ranks that have the value name it; nothing stays allocated.
static void check_refused(const char *var, const char *value, bool here)
{
    char *t = spec_text();
    if (here) {
        setenv(var, value, 1);
        ddl_spec_t *sp = NULL;
        ASSERT_STATUS(ddl_spec_parse(t, "env.json", world, &sp), DDL_EINVAL);
        ASSERT_TRUE(sp == NULL);
        if (strstr(ddl_last_error(), var) == NULL || strstr(ddl_last_error(), value) == NULL) {
            TEST_FAIL_("%s=\"%s\": the message does not name it: %s", var, value, ddl_last_error());
        }
        unsetenv(var);
    }
    ddl_spec_t *spec = NULL;
    ASSERT_OK(ddl_spec_parse(t, "env.json", world, &spec));
    if (here) {
        setenv(var, value, 1);
    }
    int64_t      live = ddl_alloc_bytes_live();
    ddl_model_t *m    = NULL;
    ddl_status   st   = ddl_model_create(MPI_COMM_WORLD, spec, &m);
    unsetenv(var);
    if (st != DDL_EINVAL || m != NULL) {
        TEST_FAIL_("%s=\"%s\"%s: ddl_model_create returned %s: %s", var, value,
                   here ? "" : " (on another rank)", ddl_status_name(st), ddl_last_error());
    }
    if (here && strstr(ddl_last_error(), var) == NULL) {
        TEST_FAIL_("%s=\"%s\": the model's message does not name it: %s", var, value,
                   ddl_last_error());
    }
    ASSERT_EQ(ddl_alloc_bytes_live(), live);
    ddl_spec_destroy(&spec);
    free(t);
}

// The model of the spec, built with DDL_SHARE_MIN_BYTES = min_bytes (NULL: unset) on every
// rank: its scratch block's bytes.
static size_t scratch_with(const char *min_bytes)
{
    char *t = spec_text();
    if (min_bytes != NULL) {
        setenv("DDL_SHARE_MIN_BYTES", min_bytes, 1);
    }
    ddl_spec_t  *spec = NULL;
    ddl_model_t *m    = NULL;
    ASSERT_OK(ddl_spec_parse(t, "env.json", world, &spec));
    ASSERT_OK(ddl_model_create(MPI_COMM_WORLD, spec, &m));
    unsetenv("DDL_SHARE_MIN_BYTES");
    int    users = 0;
    size_t bytes = ddl__model_scratch_bytes(m, &users);
    ddl_model_destroy(&m);
    ddl_spec_destroy(&spec);
    free(t);
    return bytes;
}

int main(int argc, char **argv)
{
    ddl_test_mpi_init(&argc, &argv);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (world > 2) {
        return ddl_test_mpi_finalize();
    }
    check_parse_bytes();

    // Bad values, on every rank.
    static const char *const bad[][2] = {
        {"DDL_SHARE_SCRATCH", "yes"},   {"DDL_SHARE_SCRATCH", "2"},
        {"DDL_FUSE_BN_RELU", "off"},    {"DDL_FUSE_ADD_RELU", "-1"},
        {"DDL_SHARE_MIN_BYTES", "abc"}, {"DDL_SHARE_MIN_BYTES", "-1"},
        {"DDL_SHARE_MIN_BYTES", "2MB"}, {"DDL_MEMORY_LIMIT", "abc"},
        {"DDL_MEMORY_LIMIT", "0"},      {"DDL_CONV_DIRECT", "avx512x"},
        {"DDL_CONV_DIRECT", "off"},     {"DDL_HALO_OVERLAP", "2"},
        {"DDL_HALO_OVERLAP", "on"},     {"DDL_SHARE_BN_GRAD", "yes"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        check_refused(bad[i][0], bad[i][1], true);
    }

    // The default and a good value reach the layers (the split convs share their padded
    // buffers from 0 bytes on, not from 1 TiB); "" is unset.
    size_t shared = scratch_with("0"), owned = scratch_with("1T"), dflt = scratch_with("");
    ASSERT_EQ(dflt, owned); // 16x16 planes: far under the default 2 MiB
    if (world == 2) {
        ASSERT_TRUE(shared > owned);
    } else {
        ASSERT_TRUE(owned > 0); // the workspaces; no halo, so no padded buffer to share
        ASSERT_EQ(shared, owned);
    }

    if (world == 2) {
        // A bad value on rank 1 only: both ranks fail alike.
        check_refused("DDL_SHARE_MIN_BYTES", "12 MiB", ddl_test_rank == 1);
        check_refused("DDL_FUSE_BN_RELU", "true", ddl_test_rank == 1);
        check_refused("DDL_FUSE_ADD_RELU", "no", ddl_test_rank == 1);
        check_refused("DDL_SHARE_BN_GRAD", "2", ddl_test_rank == 1);
        // Good values that differ: both fail, with one message.
        static const char *const differ[][2] = {{"DDL_SHARE_SCRATCH", "0"},
                                                {"DDL_SHARE_MIN_BYTES", "1M"},
                                                {"DDL_FUSE_BN_RELU", "0"},
                                                {"DDL_FUSE_ADD_RELU", "0"},
                                                {"DDL_SHARE_BN_GRAD", "0"}};
        for (size_t i = 0; i < sizeof differ / sizeof differ[0]; i++) {
            char *t = spec_text();
            if (ddl_test_rank == 1) {
                setenv(differ[i][0], differ[i][1], 1);
            }
            ddl_spec_t *spec = NULL;
            ASSERT_OK(ddl_spec_parse(t, "env.json", world, &spec));
            int64_t      live = ddl_alloc_bytes_live();
            ddl_model_t *m    = NULL;
            ASSERT_STATUS(ddl_model_create(MPI_COMM_WORLD, spec, &m), DDL_EINVAL);
            unsetenv(differ[i][0]);
            ASSERT_TRUE(m == NULL);
            ASSERT_EQ(ddl_alloc_bytes_live(), live);
            const char *msg = ddl_last_error();
            if (strstr(msg, differ[i][0]) == NULL ||
                strstr(msg, "differs between the ranks") == NULL) {
                TEST_FAIL_("%s differing: %s", differ[i][0], msg);
            }
            char mine[512], root[512];
            snprintf(mine, sizeof mine, "%s", msg);
            memcpy(root, mine, sizeof root);
            MPI_Bcast(root, sizeof root, MPI_CHAR, 0, MPI_COMM_WORLD);
            ASSERT_TRUE(strcmp(mine, root) == 0); // the same message on both ranks
            ddl_spec_destroy(&spec);
            free(t);
        }
    }
    if (ddl_test_rank == 0) {
        printf("test_env_settings: ok on %d rank%s (scratch: %zu bytes sharing from 0 B, %zu "
               "from 1T, %zu by default)\n",
               world, world == 1 ? "" : "s", shared, owned, dflt);
    }
    return ddl_test_mpi_finalize();
}
