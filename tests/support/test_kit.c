// tests/support/test_kit.c: the failure path and small helpers shared by unit and MPI tests.
#include <dirent.h>
#include <errno.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"

int ddl_test_rank = -1;

void ddl_test_fail(void)
{
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (inited && !finalized) {
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    exit(1);
}

static int by_path(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

// The paths live on the C heap, not ddl_malloc's: tests that count the engine's
// allocations (ddl_alloc_count, ddl_alloc_bytes_live) call fn while they are held.
int ddl_test_each_file(const char *dir, const char *suffix, int (*fn)(const char *path, void *ud),
                       void *ud)
{
    DIR *d = opendir(dir);
    if (d == NULL) {
        TEST_FAIL_("cannot read the directory %s: %s", dir, strerror(errno));
    }
    size_t         sl = strlen(suffix), dl = strlen(dir);
    char         **paths = NULL;
    int            n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len <= sl || strcmp(e->d_name + len - sl, suffix) != 0) {
            continue;
        }
        if (n == cap) {
            cap         = cap > 0 ? 2 * cap : 32;
            char **grow = realloc(paths, (size_t)cap * sizeof *paths);
            if (grow == NULL) {
                TEST_FAIL_("out of memory listing %s", dir);
            }
            paths = grow;
        }
        size_t bytes = dl + 1 + len + 1;
        if ((paths[n] = malloc(bytes)) == NULL) {
            TEST_FAIL_("out of memory listing %s", dir);
        }
        snprintf(paths[n++], bytes, "%s/%s", dir, e->d_name);
    }
    closedir(d);
    qsort(paths, (size_t)n, sizeof *paths, by_path); // one directory: the order of the names
    int checked = 0;
    for (int i = 0; i < n; i++) {
        checked += fn(paths[i], ud);
        free(paths[i]);
    }
    free(paths);
    return checked;
}

char *ddl_test_rank_list(int P, char *buf, size_t len)
{
    size_t n = 0;
    buf[0]   = '\0';
    for (int r = 0; r < P && n < len; r++) {
        n += (size_t)snprintf(buf + n, len - n, "%s%d", r ? ", " : "", r);
    }
    return buf;
}

char *ddl_test_vol_spec(int P, const char *split, int seed, const char *dtype, int batch,
                        const int vol[3], const char *layers, const char *rest)
{
    char  ranks[64];
    char *t = malloc(4096);
    if (t == NULL) {
        TEST_FAIL_("out of memory for a spec");
    }
    ddl_test_rank_list(P, ranks, sizeof ranks);
    int n = snprintf(t, 4096,
                     "{\"world_size\": %d, \"seed\": %d, \"dtype\": \"%s\", \"batch_size\": %d,\n"
                     " \"input\": {\"shape\": [1, %d, %d, %d], \"partition\": \"vol\"},\n"
                     " \"partitions\": {\"vol\": {\"ranks\": [%s], \"shape\": %s}},\n"
                     " \"layers\": [\n%s],\n%s}\n",
                     P, seed, dtype, batch, vol[0], vol[1], vol[2], ranks, split, layers, rest);
    if (n < 0 || n >= 4096) {
        TEST_FAIL_("a spec of %d bytes does not fit in 4096", n);
    }
    return t;
}

const char *const ddl_test_conv3d_pair =
    "  {\"type\": \"conv3d\", \"out_channels\": 4, \"kernel\": [3, 3, 3], "
    "\"padding\": [1, 1, 1]},\n"
    "  {\"type\": \"tanh\"},\n"
    "  {\"type\": \"conv3d\", \"out_channels\": 1, \"kernel\": [3, 3, 3], "
    "\"padding\": [1, 1, 1]}";
