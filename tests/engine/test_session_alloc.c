// tests/engine/test_session_alloc.c: no allocation per step. For every shipped spec
// (deploy/specs/*.json) written for this world size -- including lenet5-2-split, whose
// input partition spans two ranks -- a training step, an evaluation of a short batch and
// a prediction (of a full batch and of short ones, which run at the spec's inference
// batches), through the session and through the model, leave ddl_alloc_count()
// unchanged once warmed up. Batches and labels move through buffers and Repartition
// plans allocated when the model is built.
// Usage: test_session_alloc SPEC_DIR
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddl/base.h"
#include "ddl/session.h"
#include "mpi_test.h"

static int rank, size;

// Fails unless a steady-state round (round > 0) made no allocation since `before`.
static void no_allocation(const char *path, int round, uint64_t before)
{
    uint64_t made = ddl_alloc_count() - before;
    if (round > 0 && made != 0) {
        TEST_FAIL_("%s: %llu allocations in steady-state round %d", path, (unsigned long long)made,
                   round);
    }
}

// A dense-target spec (issue 18): training on its generated data through the session,
// and the model's dense step, short evaluations and predictions, allocate nothing once
// warmed up. Targets in [0, 1] suit every dense loss.
static void check_dense(const ddl_spec_t *spec, const char *path, ddl_session_t *s)
{
    ddl_model_t *m = ddl_session_model(s);
    int64_t      B = ddl_spec_batch_size(spec), E = ddl_spec_output_elems(spec);
    ddl_shape    in = ddl_spec_input_shape(spec);
    int64_t      S  = ddl_shape_numel(&in);
    size_t       es = ddl_dtype_size(ddl_spec_dtype(spec));
    void        *x = NULL, *t = NULL, *y = NULL;
    size_t       xb = 0, tb = 0;
    if (rank == 0) {
        xb = (size_t)(B * S) * es;
        tb = (size_t)(B * E) * es;
        x  = calloc(1, xb);
        t  = calloc(1, tb);
        y  = calloc(1, tb);
        ddl_test_fill(t, es, B * E, 6, 0.0, 1.0);
    }
    // A spec without generated data (its data comes from a file) trains inline only.
    bool synth = ddl_spec_synthetic(spec, NULL, NULL, NULL);
    if (synth) {
        ASSERT_OK(ddl_session_open_synthetic(s));
    }
    ddl_train_request req = {.steps = 1};
    ddl_train_result  tr;
    ddl_step_result   sr;
    ddl_eval_result   ev;
    ddl_dense_metrics dm;
    double            loss;
    int64_t           shortn = B > 3 ? B - 3 : 1;
    for (int round = 0; round < 3; round++) {
        uint64_t before = ddl_alloc_count();
        if (synth) {
            ASSERT_OK(ddl_session_train(s, &req, NULL, NULL, &tr));
        }
        // Inline dense targets through the session (the daemon's Step and Evaluate).
        ASSERT_OK(ddl_session_step(s, x, xb, t, tb, B, &sr));
        ASSERT_OK(ddl_session_evaluate_batch(s, x, rank == 0 ? (size_t)(shortn * S) * es : 0, t,
                                             rank == 0 ? (size_t)(shortn * E) * es : 0, shortn,
                                             &ev));
        ASSERT_OK(ddl_model_train_step_dense(m, x, xb, t, tb, B, &loss, &dm));
        ASSERT_OK(ddl_model_eval_dense(m, x, xb, t, tb, shortn, &dm));
        ASSERT_OK(ddl_model_eval_dense(m, x, xb, t, tb, 1, &dm));
        ASSERT_OK(ddl_model_predict(m, x, xb, B, y, tb));
        ASSERT_OK(ddl_model_predict(m, x, xb, 1, y, tb));
        no_allocation(path, round, before);
    }
    ASSERT_EQ(ddl_model_step(m), synth ? 9 : 6);
    free(x);
    free(t);
    free(y);
}

// One spec (ddl_test_each_file): returns 1 if it ran (its world size is ours), 0
// otherwise; *split counts the specs that ran whose name says "split".
static int check_spec(const char *path, void *split)
{
    ddl_spec_t *spec = ddl_test_spec_for_world(path);
    if (spec == NULL) {
        return 0;
    }
    // L labels per sample (one per output voxel for a segmentation spec); C * L logits.
    int64_t        B = ddl_spec_batch_size(spec), C = ddl_spec_num_classes(spec);
    int64_t        L  = ddl_spec_label_elems(spec);
    ddl_shape      in = ddl_spec_input_shape(spec);
    int64_t        S  = ddl_shape_numel(&in);
    size_t         es = ddl_dtype_size(ddl_spec_dtype(spec));
    ddl_session_t *s  = NULL;
    ASSERT_OK(
        ddl_session_create(MPI_COMM_WORLD, rank == 0 ? ddl_spec_text(spec) : NULL, path, NULL, &s));
    if (ddl_spec_dense_targets(spec)) {
        check_dense(spec, path, s);
        ddl_session_destroy(&s);
        ddl_spec_destroy(&spec);
        if (rank == 0) {
            printf("%s: no allocation per step (session and model), eval or predict\n", path);
        }
        return 1;
    }
    ddl_model_t *m = ddl_session_model(s);
    void        *x = NULL, *lg = NULL;
    int64_t     *lab = NULL;
    size_t       xb = 0, lb = 0;
    if (rank == 0) {
        xb  = (size_t)(B * S) * es;
        lb  = (size_t)(B * C * L) * es;
        x   = calloc(1, xb);
        lg  = calloc(1, lb);
        lab = calloc((size_t)(B * L), sizeof(int64_t));
        ddl_test_fill(x, es, B * S, 5, -1.0, 1.0);
        for (int64_t b = 0; b < B * L; b++) {
            lab[b] = (b * 7) % C;
        }
    }
    int64_t         shortn = B > 3 ? B - 3 : 1;
    int64_t         np     = B < 5 ? B : 5; // samples predicted (x holds B)
    ddl_step_result sr;
    ddl_eval_result ev;
    double          loss;
    int64_t         correct;
    for (int round = 0; round < 3; round++) {
        uint64_t before = ddl_alloc_count();
        ASSERT_OK(ddl_session_step(s, x, xb, lab, rank == 0 ? (size_t)(B * L) * 8 : 0, B, &sr));
        ASSERT_OK(ddl_session_evaluate_batch(s, x, rank == 0 ? (size_t)shortn * (size_t)S * es : 0,
                                             lab, rank == 0 ? (size_t)(shortn * L) * 8 : 0, shortn,
                                             &ev));
        ASSERT_OK(ddl_session_predict(s, x, rank == 0 ? (size_t)(np * S) * es : 0, np, lg,
                                      rank == 0 ? (size_t)(np * C * L) * es : 0));
        ASSERT_OK(ddl_model_train_step(m, x, xb, lab, B, &loss, &correct));
        ASSERT_OK(ddl_model_eval(m, x, xb, lab, shortn, &loss, &correct));
        ASSERT_OK(ddl_model_predict(m, x, xb, B, lg, lb));
        // Short batches (the spec's inference batches) allocate nothing either.
        ASSERT_OK(ddl_model_eval(m, x, xb, lab, 1, &loss, &correct));
        ASSERT_OK(ddl_model_predict(m, x, xb, 1, lg, lb));
        ASSERT_OK(ddl_model_predict(m, x, xb, B > 3 ? 3 : 1, lg, lb));
        no_allocation(path, round, before);
    }
    ASSERT_EQ(ddl_model_step(m), 6);
    free(x);
    free(lg);
    free(lab);
    ddl_session_destroy(&s);
    ddl_spec_destroy(&spec);
    if (rank == 0) {
        printf("%s: no allocation per step, eval or predict\n", path);
    }
    *(int *)split += strstr(strrchr(path, '/') + 1, "split") != NULL;
    return 1;
}

int main(int argc, char **argv)
{
    ddl_test_mpi_init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    ASSERT_TRUE(argc == 2);
    int split = 0;
    int ran   = ddl_test_each_file(argv[1], ".json", check_spec, &split);
    // Every world size we run at has at least one spec; at 2 ranks the split input too.
    ASSERT_TRUE(ran > 0);
    if (size == 2) {
        ASSERT_TRUE(split > 0);
    }
    return ddl_test_mpi_finalize();
}
