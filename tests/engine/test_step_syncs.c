// tests/engine/test_step_syncs.c: the synchronisations a step makes (issue 19, item 4).
// For every shipped spec of this world size, a training step, an evaluation of a full
// batch and a prediction of one sample each make exactly two agreements on their status
// (ddl_agree_count): the rooted one on rank 0's checks of the batch, which carries the
// count, and the closing one, which carries the loss and the hits. A loss on dense targets
// adds one, on its values (BCE input outside [0, 1] fails on the rank that holds it). None
// per layer: the model's layers and loss take its own buffers without agreeing on them
// (ddl_layer_set_io_fixed, ddl_loss_set_io_fixed).
// The session (what the daemon runs for Predict, ModelInfer, Evaluate and Step) adds one
// to each: the rooted agreement on its own checks of rank 0's arguments, which carries
// the row count. It closes with the model's agreed status, not a round of its own.
// The MPI collectives and messages of each are counted by PMPI interposition
// (mpi_count.c) and printed, for docs/PERFORMANCE.md.
//
// Then the two folded agreements alone, with a failure on one rank: ddl_agree_sum with
// the last rank failing, and ddl_agree_root with the root failing, give every rank the
// failing rank's code and message, and the sums or data only on success.
// Usage: test_step_syncs SPEC_DIR
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddl/agree.h"
#include "ddl/base.h"
#include "ddl/model.h"
#include "ddl/session.h"
#include "mpi_count.h"
#include "mpi_test.h"

static int rank, size;

typedef struct counted {
    uint64_t   agreements;
    mpi_counts mpi;
} counted;

static void mark(counted *c)
{
    c->agreements = ddl_agree_count();
    mpi_count_get(&c->mpi);
}

// Prints and checks the agreements since *a; returns the collectives since.
static uint64_t report(const char *spec, const char *what, const counted *a, int nlayers,
                       uint64_t want)
{
    counted z;
    mark(&z);
    uint64_t   agreements = z.agreements - a->agreements;
    mpi_counts d          = mpi_count_sub(&z.mpi, &a->mpi);
    if (rank == 0) {
        printf(
            "%-26s %-8s %2d layers: agreements %llu; collectives %llu (allreduce %llu, "
            "bcast %llu, reduce %llu, gather %llu, scatter %llu, barrier %llu); messages "
            "sent %llu\n",
            spec, what, nlayers, (unsigned long long)agreements,
            (unsigned long long)mpi_count_collectives(&d),
            (unsigned long long)d.n[MPI_COUNT_ALLREDUCE], (unsigned long long)d.n[MPI_COUNT_BCAST],
            (unsigned long long)d.n[MPI_COUNT_REDUCE], (unsigned long long)d.n[MPI_COUNT_GATHER],
            (unsigned long long)d.n[MPI_COUNT_SCATTER], (unsigned long long)d.n[MPI_COUNT_BARRIER],
            (unsigned long long)d.n[MPI_COUNT_ISEND]);
        fflush(stdout);
    }
    // The count per call, whatever the number of layers (on every rank of the model).
    ASSERT_EQ(agreements, want);
    return mpi_count_collectives(&d);
}

static int check_spec(const char *path, void *unused)
{
    (void)unused;
    ddl_spec_t *spec = ddl_test_spec_for_world(path);
    if (spec == NULL) {
        return 0;
    }
    const char  *name  = strrchr(path, '/') != NULL ? strrchr(path, '/') + 1 : path;
    int64_t      B     = ddl_spec_batch_size(spec);
    size_t       es    = ddl_dtype_size(ddl_spec_dtype(spec));
    bool         dense = ddl_spec_dense_targets(spec);
    int64_t      C = ddl_spec_num_classes(spec), L = ddl_spec_label_elems(spec);
    int64_t      O  = ddl_spec_output_elems(spec);
    ddl_shape    in = ddl_spec_input_shape(spec);
    int64_t      S  = ddl_shape_numel(&in);
    ddl_model_t *m  = NULL;
    ASSERT_OK(ddl_model_create(MPI_COMM_WORLD, spec, &m));
    int      nl = ddl_spec_num_layers(spec);
    void    *x = NULL, *t = NULL, *out = NULL;
    int64_t *lab = NULL;
    if (rank == 0) {
        x   = calloc((size_t)(B * S), es);
        out = calloc((size_t)O, es);
        lab = calloc((size_t)(B * L), sizeof(int64_t));
        t   = calloc((size_t)(B * O), es);
        ddl_test_fill(x, es, B * S, 3, -1.0, 1.0);
        ddl_test_fill(t, es, B * O, 4, 0.0, 1.0);
        for (int64_t i = 0; i < B * L; i++) {
            lab[i] = (i * 5 + 1) % C;
        }
    }
    size_t            xb = rank == 0 ? (size_t)(B * S) * es : 0;
    size_t            tb = rank == 0 ? (size_t)(B * O) * es : 0;
    double            loss;
    int64_t           hits;
    ddl_dense_metrics dm;
    counted           c;
    for (int k = 0; k < 2; k++) { // the first step opens every plan; the second is counted
        mark(&c);
        if (dense) {
            ASSERT_OK(ddl_model_train_step_dense(m, x, xb, t, tb, B, &loss, &dm));
        } else {
            ASSERT_OK(ddl_model_train_step(m, x, xb, lab, B, &loss, &hits));
        }
    }
    uint64_t ctrain = report(name, "train", &c, nl, dense ? 3 : 2);
    mark(&c);
    if (dense) {
        ASSERT_OK(ddl_model_eval_dense(m, x, xb, t, tb, B, &dm));
    } else {
        ASSERT_OK(ddl_model_eval(m, x, xb, lab, B, &loss, &hits));
    }
    uint64_t ceval = report(name, "eval", &c, nl, dense ? 3 : 2);
    mark(&c);
    ASSERT_OK(ddl_model_predict(m, x, rank == 0 ? (size_t)S * es : 0, 1, out,
                                rank == 0 ? (size_t)O * es : 0));
    uint64_t cpred = report(name, "predict", &c, nl, 2);
    ddl_model_destroy(&m);
    // The same through a session.
    char          *text = NULL;
    ddl_session_t *s    = NULL;
    if (rank == 0) {
        FILE *f = fopen(path, "rb");
        ASSERT_TRUE(f != NULL);
        ASSERT_TRUE(fseek(f, 0, SEEK_END) == 0);
        long len = ftell(f);
        ASSERT_TRUE(len > 0 && fseek(f, 0, SEEK_SET) == 0);
        text = calloc((size_t)len + 1, 1);
        ASSERT_TRUE(text != NULL && fread(text, 1, (size_t)len, f) == (size_t)len);
        fclose(f);
    }
    ASSERT_OK(ddl_session_create(MPI_COMM_WORLD, text, name, NULL, &s));
    const void     *tg  = dense ? t : (const void *)lab;
    size_t          tgb = rank == 0 ? ddl_session_target_bytes(s, B) : 0;
    ddl_step_result sr;
    for (int k = 0; k < 2; k++) {
        mark(&c);
        ASSERT_OK(ddl_session_step(s, x, xb, tg, tgb, B, &sr));
    }
    uint64_t one = size > 1 ? 1 : 0; // the session's own collective, on more than one rank
    ASSERT_EQ(report(name, "s.step", &c, nl, dense ? 4 : 3), ctrain + one);
    ddl_eval_result er;
    mark(&c);
    ASSERT_OK(ddl_session_evaluate_batch(s, x, xb, tg, tgb, B, &er));
    ASSERT_EQ(report(name, "s.eval", &c, nl, dense ? 4 : 3), ceval + one);
    mark(&c);
    ASSERT_OK(ddl_session_predict(s, x, rank == 0 ? (size_t)S * es : 0, 1, out,
                                  rank == 0 ? (size_t)O * es : 0));
    ASSERT_EQ(report(name, "s.pred", &c, nl, 3), cpred + one);
    ddl_session_destroy(&s);
    free(text);
    free(x);
    free(t);
    free(out);
    free(lab);
    ddl_spec_destroy(&spec);
    return 1;
}

// The folded agreements alone, on MPI_COMM_WORLD.
static void check_folded(void)
{
    // ddl_agree_sum: sums on success.
    double v[3] = {1.0, (double)rank, 0.5};
    ASSERT_OK(ddl_agree_sum(MPI_COMM_WORLD, DDL_OK, v, 3));
    ASSERT_TRUE(v[0] == (double)size && v[1] == (double)(size * (size - 1) / 2) &&
                v[2] == 0.5 * size);
    // The last rank fails: every rank gets its code and message.
    ddl_status st = DDL_OK;
    if (rank == size - 1) {
        st = ddl_set_error(DDL_ENOMEM, "rank %d ran out", rank);
    }
    char want[64];
    snprintf(want, sizeof want, "rank %d ran out", size - 1);
    ASSERT_STATUS(ddl_agree_sum(MPI_COMM_WORLD, st, v, 3), DDL_ENOMEM);
    ASSERT_TRUE(strcmp(ddl_last_error(), want) == 0);
    // ddl_agree_root: root's data on success, root's failure on every rank.
    int64_t n = rank == 0 ? 42 : -1;
    ASSERT_OK(ddl_agree_root(MPI_COMM_WORLD, 0, DDL_OK, &n, (int)sizeof n));
    ASSERT_EQ(n, 42);
    int root = size - 1;
    st       = DDL_OK;
    if (rank == root) {
        st = ddl_set_error(DDL_EINVAL, "root says no");
    }
    n = rank;
    ASSERT_STATUS(ddl_agree_root(MPI_COMM_WORLD, root, st, &n, (int)sizeof n), DDL_EINVAL);
    ASSERT_TRUE(strcmp(ddl_last_error(), "root says no") == 0);
    ASSERT_EQ(n, rank); // left as it was
    // Each is one collective when every rank succeeds.
    mpi_counts a, z, d;
    mpi_count_get(&a);
    ASSERT_OK(ddl_agree_sum(MPI_COMM_WORLD, DDL_OK, v, 3));
    ASSERT_OK(ddl_agree_root(MPI_COMM_WORLD, 0, DDL_OK, &n, (int)sizeof n));
    mpi_count_get(&z);
    d = mpi_count_sub(&z, &a);
    ASSERT_EQ(mpi_count_collectives(&d), size > 1 ? 2 : 0);
}

int main(int argc, char **argv)
{
    ddl_test_mpi_init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    ASSERT_TRUE(argc == 2);
    check_folded();
    ASSERT_TRUE(ddl_test_each_file(argv[1], ".json", check_spec, NULL) > 0);
    return ddl_test_mpi_finalize();
}
