// tests/support/test_kit.c: the failure path and small helpers shared by unit and MPI tests.
#include <dirent.h>
#include <mpi.h>
#include <stdio.h>
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

static int by_name(const void *a, const void *b)
{
    return strcmp((const char *)a, (const char *)b);
}

int ddl_test_list_dir(const char *dir, const char *suffix, char (*names)[DDL_TEST_NAME_MAX],
                      int max)
{
    DIR *d = opendir(dir);
    if (d == NULL) {
        fprintf(stderr, "cannot read the directory %s\n", dir);
        ddl_test_fail();
    }
    size_t         sl = strlen(suffix);
    int            n  = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < max) {
        size_t len = strlen(e->d_name);
        if (len > sl && len < DDL_TEST_NAME_MAX && strcmp(e->d_name + len - sl, suffix) == 0) {
            snprintf(names[n++], DDL_TEST_NAME_MAX, "%s", e->d_name);
        }
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], by_name);
    return n;
}
