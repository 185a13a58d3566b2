// tests/engine/test_estimate.c: a spec's memory estimate (ddl/estimate.h) against what
// ddl_model_create really allocates. For every shipped spec (deploy/specs/*.json) written
// for this world size: the estimate of the rank that needs the most lies within 2x of the
// largest per-rank ddl_alloc_bytes_live() growth across the creation (the ratios are
// printed); a memory limit below the estimate (DDL_MEMORY_LIMIT) makes ddl_spec_check_memory
// and ddl_model_create refuse it with DDL_ENOMEM and the estimate in the message (with the
// share of the short-batch copies and how to drop them), on every rank, having allocated
// nothing that survives.
// Usage: test_estimate SPEC_DIR
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddl/base.h"
#include "ddl/estimate.h"
#include "mpi_test.h"

static int rank, size;

// One spec (ddl_test_each_file): returns 1 if it ran (its world size is ours), 0 otherwise.
static int check_spec(const char *path, void *unused)
{
    (void)unused;
    ddl_spec_t *spec = ddl_test_spec_for_world(path);
    if (spec == NULL) {
        return 0;
    }
    ddl_mem_estimate e;
    ASSERT_OK(ddl_spec_estimate(spec, &e));
    int64_t      before = ddl_alloc_bytes_live();
    ddl_model_t *m      = NULL;
    ASSERT_OK(ddl_model_create(MPI_COMM_WORLD, spec, &m));
    int64_t grown = ddl_alloc_bytes_live() - before, most = 0;
    MPI_Allreduce(&grown, &most, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
    ddl_model_destroy(&m);
    double ratio = e.total / (double)(most > 0 ? most : 1);
    if (rank == 0) {
        printf("%-22s estimate %10.0f B (rank %d: params %.0f grads %.0f optim %.0f act %.0f "
               "work %.0f; short-batch copies %.0f), allocated %10lld B at most per rank: "
               "ratio %.2f\n",
               strrchr(path, '/') + 1, e.total, e.rank, e.params, e.grads, e.optim, e.activations,
               e.workspace, e.copies, (long long)most, ratio);
        fflush(stdout);
    }
    ASSERT_TRUE(ratio >= 0.5 && ratio <= 2.0);

    // A limit below the estimate: refused before anything is allocated, on every rank.
    char lim[64];
    snprintf(lim, sizeof lim, "%.0f", e.total / 2);
    setenv("DDL_MEMORY_LIMIT", lim, 1);
    ASSERT_STATUS(ddl_spec_check_memory(spec, 0), DDL_ENOMEM);
    ASSERT_TRUE(strstr(ddl_last_error(), "spec needs an estimated") != NULL);
    ASSERT_TRUE(strstr(ddl_last_error(), "is available (DDL_MEMORY_LIMIT=") != NULL);
    // The short-batch copies are counted, and the message says how to drop them.
    bool copies = ddl_spec_inference_batches(spec, NULL) > 0;
    ASSERT_TRUE(copies == (e.copies > 0) && e.copies < e.total / 2);
    ASSERT_TRUE(copies == (strstr(ddl_last_error(), "\"inference_batches\": [] drops") != NULL));
    before = ddl_alloc_bytes_live();
    ASSERT_STATUS(ddl_model_create(MPI_COMM_WORLD, spec, &m), DDL_ENOMEM);
    ASSERT_TRUE(m == NULL);
    ASSERT_EQ(ddl_alloc_bytes_live(), before);
    snprintf(lim, sizeof lim, "%.0f", e.total * 1.01 + 4096);
    setenv("DDL_MEMORY_LIMIT", lim, 1);
    ASSERT_OK(ddl_spec_check_memory(spec, 0));
    unsetenv("DDL_MEMORY_LIMIT");
    ddl_spec_destroy(&spec);
    return 1;
}

int main(int argc, char **argv)
{
    ddl_test_mpi_init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    ASSERT_TRUE(argc == 2);
    int ran = ddl_test_each_file(argv[1], ".json", check_spec, NULL);
    if (ran == 0) {
        if (rank == 0) {
            printf("SKIP: no spec for %d ranks in %s\n", size, argv[1]);
        }
        MPI_Finalize();
        return 7;
    }
    return ddl_test_mpi_finalize();
}
