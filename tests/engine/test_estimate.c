// tests/engine/test_estimate.c: a spec's memory estimate (ddl/estimate.h) against what
// the model really holds. For every shipped spec (deploy/specs/*.json) written for this
// world size: the model is created, runs one training step and one short-batch evaluation
// on a batch of zeros, and the most any rank held at any moment of that (ddl_alloc
// high-water mark over its ddl_alloc_bytes_live growth) is the "allocated" figure. The
// estimate of the rank that needs the most lies within 1.2x of it either way (issue 19,
// item 6; the ratios are printed). A memory limit below the estimate (DDL_MEMORY_LIMIT)
// makes ddl_spec_check_memory and ddl_model_create refuse it with DDL_ENOMEM and the
// estimate in the message (with the share of the short-batch copies and how to drop
// them), on every rank, having allocated nothing that survives.
// Usage: test_estimate SPEC_DIR
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddl/base.h"
#include "ddl/estimate.h"
#include "ddl/model.h"
#include "mpi_test.h"

static int rank, size;

// One training step on a batch of zeros (labels 0, or dense targets 0: valid for every
// loss) and an evaluation of one sample (the smallest short-batch copy), from rank 0.
static void run_step(const ddl_spec_t *spec, ddl_model_t *m)
{
    int64_t   B = ddl_spec_batch_size(spec), sample = 1;
    ddl_shape in = ddl_spec_input_shape(spec);
    for (int d = 0; d < in.ndim; d++) {
        sample *= in.d[d];
    }
    size_t  item  = ddl_dtype_size(ddl_spec_dtype(spec));
    bool    dense = ddl_spec_dense_targets(spec);
    int64_t per   = dense ? ddl_spec_output_elems(spec) : ddl_spec_label_elems(spec);
    size_t  xb = 0, tb = 0;
    void   *x = NULL, *t = NULL;
    if (rank == 0) {
        xb = (size_t)(B * sample) * item;
        tb = (size_t)(B * per) * (dense ? item : sizeof(int64_t));
        x  = calloc(1, xb);
        t  = calloc(1, tb);
        ASSERT_TRUE(x != NULL && t != NULL);
    }
    double            loss;
    int64_t           hits;
    ddl_dense_metrics dm;
    if (dense) {
        ASSERT_OK(ddl_model_train_step_dense(m, x, xb, t, tb, B, &loss, &dm));
        ASSERT_OK(ddl_model_eval_dense(m, x, rank == 0 ? xb / (size_t)B : 0, t,
                                       rank == 0 ? tb / (size_t)B : 0, 1, &dm));
    } else {
        ASSERT_OK(ddl_model_train_step(m, x, xb, t, B, &loss, &hits));
        ASSERT_OK(ddl_model_eval(m, x, rank == 0 ? xb / (size_t)B : 0, t, 1, &loss, &hits));
    }
    free(x);
    free(t);
}

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
    ddl_alloc_bytes_peak_reset();
    ASSERT_OK(ddl_model_create(MPI_COMM_WORLD, spec, &m));
    run_step(spec, m);
    int64_t grown = ddl_alloc_bytes_peak_reset() - before, most = 0;
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
    ASSERT_TRUE(ratio >= 1 / 1.2 && ratio <= 1.2);

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
