// tests/engine/test_short_batch.c: short batches (issue 17, section 2). For every shipped
// spec of this world size, two models from one seed: the spec as shipped (its inference
// batches, by default the powers of two below batch_size) and the same spec with
// "inference_batches": [] (every prediction padded to the full batch, as before). After a
// training step on each (the same weights; batch norm's running statistics moved off
// their initial values):
//   - predictions and evaluations of n samples, for n = 1, 2, 3, 5, B/2, B/2 + 1, B - 1
//     and B (B = batch_size; those from 1 to B), agree bit for bit between the two; for
//     n < B the last n samples predicted alone have the bits of their rows in the padded
//     model's full batch (predicted once; batch-invariant: ddl_linear_forward_rows,
//     ddl_conv_forward_rows; both sides run in this process, on one kernel path), and
//     each evaluation's hits are the argmax hits of the same model's predicted logits;
//   - after a second step (of the model with copies) the short batches see the new
//     weights (they share them): one sample's prediction moved, and has the bits of its
//     row in the model's own full batch;
//   - at 2 ranks or more, predicting 1 sample moves fewer bytes than the padded model
//     (the short batch ran, not the full one);
//   - the short-batch copies cost less than half the memory of the model (they share its
//     parameters and activations; ddl_alloc_bytes_live, this rank);
//   - an allocation that fails on the last rank alone while the copies are built fails the
//     create on every rank with DDL_ENOMEM, and nothing it allocated survives.
// Usage: test_short_batch SPEC_DIR
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddl/base.h"
#include "ddl/model.h"
#include "mpi_test.h"

static int rank, size;

typedef struct batch {
    int64_t B, C, L, S;  // batch_size, classes, labels per sample, sample elements
                         // (dense targets: C 1 and L the output values per sample)
    size_t   es;         // element size
    void    *x, *lg;     // rank 0: B samples, B samples' logits
    int64_t *lab;
    bool     dense; // the loss takes dense targets: t, B * L values in [0, 1]
    void    *t;
} batch;

static double elem(const batch *b, const void *p, int64_t i)
{
    return b->es == 4 ? (double)((const float *)p)[i] : ((const double *)p)[i];
}

static ddl_model_t *make_model(const char *text, const char *path, int64_t *mem, double *secs,
                               uint64_t *allocs)
{
    ddl_spec_t  *spec = NULL;
    ddl_model_t *m    = NULL;
    ASSERT_OK(ddl_spec_parse(text, path, size, &spec));
    int64_t  before = ddl_alloc_bytes_live();
    double   t0     = MPI_Wtime();
    uint64_t n0     = ddl_alloc_count();
    ASSERT_OK(ddl_model_create(MPI_COMM_WORLD, spec, &m));
    *allocs = ddl_alloc_count() - n0;
    *secs   = MPI_Wtime() - t0;
    *mem    = ddl_alloc_bytes_live() - before;
    ddl_spec_destroy(&spec);
    return m;
}

// Predicts n samples on rank 0's buffer: logits into out (rank 0).
static void predict(ddl_model_t *m, const batch *b, int64_t n, void *out)
{
    size_t xb = rank == 0 ? (size_t)(n * b->S) * b->es : 0;
    size_t lb = rank == 0 ? (size_t)(n * b->C * b->L) * b->es : 0;
    ASSERT_OK(ddl_model_predict(m, rank == 0 ? b->x : NULL, xb, n, rank == 0 ? out : NULL, lb));
}

// The largest |a - b| over n samples' logits, against the largest |b| (rank 0; 0 elsewhere).
static double rel_diff(const batch *b, const void *a, const void *r, int64_t n)
{
    double d = 0, big = 0;
    for (int64_t i = 0; rank == 0 && i < n * b->C * b->L; i++) {
        d   = fmax(d, fabs(elem(b, a, i) - elem(b, r, i)));
        big = fmax(big, fabs(elem(b, r, i)));
    }
    return d / (1.0 + big);
}

// Argmax hits of n samples' logits against the labels (per voxel for segmentation).
static int64_t hits(const batch *b, const void *lg, int64_t n)
{
    int64_t h = 0, V = b->L;
    for (int64_t s = 0; s < n; s++) {
        for (int64_t v = 0; v < V; v++) {
            int64_t best = 0;
            double  bv   = elem(b, lg, (s * b->C) * V + v);
            for (int64_t c = 1; c < b->C; c++) {
                double e = elem(b, lg, (s * b->C + c) * V + v);
                if (e > bv) {
                    bv   = e;
                    best = c;
                }
            }
            h += best == b->lab[s * V + v];
        }
    }
    return h;
}

static uint64_t bytes_moved(const ddl_traffic *a, const ddl_traffic *z)
{
    uint64_t n = 0;
    for (int k = 0; k < DDL_TRAFFIC_NKINDS; k++) {
        for (int p = 0; p < DDL_TRAFFIC_NPASSES; p++) {
            n += (z->c[k][p].sent - a->c[k][p].sent) + (z->c[k][p].received - a->c[k][p].received);
        }
    }
    return n;
}

static void step(ddl_model_t *m, const batch *b)
{
    double            loss;
    int64_t           correct;
    ddl_dense_metrics dm;
    size_t            xb = rank == 0 ? (size_t)(b->B * b->S) * b->es : 0;
    if (b->dense) {
        ASSERT_OK(ddl_model_train_step_dense(
            m, b->x, xb, b->t, rank == 0 ? (size_t)(b->B * b->L) * b->es : 0, b->B, &loss, &dm));
        return;
    }
    ASSERT_OK(ddl_model_train_step(m, b->x, xb, b->lab, b->B, &loss, &correct));
}

// The spec text with "inference_batches": LIST after its first brace (malloc'd).
static char *with_batches(const char *text, const char *list)
{
    const char *brace = strchr(text, '{');
    size_t      pre   = (size_t)(brace - text) + 1;
    char       *out   = malloc(strlen(text) + strlen(list) + 32);
    memcpy(out, text, pre);
    sprintf(out + pre, "\"inference_batches\": %s, %s", list, text + pre);
    return out;
}

// One spec (ddl_test_each_file): returns 1 if it ran (its world size is ours), 0 otherwise.
static int check_spec(const char *path, void *unused)
{
    (void)unused;
    ddl_spec_t *spec = ddl_test_spec_for_world(path);
    if (spec == NULL) {
        return 0;
    }
    batch b = {.B     = ddl_spec_batch_size(spec),
               .C     = ddl_spec_num_classes(spec),
               .L     = ddl_spec_label_elems(spec),
               .es    = ddl_dtype_size(ddl_spec_dtype(spec)),
               .dense = ddl_spec_dense_targets(spec)};
    if (b.dense) {
        b.C = 1;
        b.L = ddl_spec_output_elems(spec);
    }
    ddl_shape in = ddl_spec_input_shape(spec);
    b.S          = ddl_shape_numel(&in);
    const char *text = ddl_spec_text(spec);
    if (b.B > 1 && ddl_spec_inference_batches(spec, NULL) == 0) {
        // No default short size: a partition splits the batch over all of it (the U-Net's
        // batch of 2 over 2 ranks), so no size below batch_size gives every rank a row.
        // Then a short size of 1 is refused, and there is nothing here to compare.
        char       *one = with_batches(text, "[1]");
        ddl_spec_t *sp  = NULL;
        ASSERT_STATUS(ddl_spec_parse(one, path, size, &sp), DDL_EINVAL);
        free(one);
        if (rank == 0) {
            printf("%s: no inference batches (the batch is split %lld ways); a short size of "
                   "1 refused\n", path, (long long)b.B);
        }
        ddl_spec_destroy(&spec);
        return 1;
    }
    double tol = b.es == 4 ? 1e-4 : 1e-10;
    char *padded = with_batches(text, "[]"); // the padded twin: no short sizes
    int64_t      mem_s, mem_p;
    double       t_s, t_p;
    uint64_t     n_s, n_p;
    ddl_model_t *ms = make_model(text, path, &mem_s, &t_s, &n_s);
    ddl_model_t *mp = make_model(padded, path, &mem_p, &t_p, &n_p);
    // One rank out of memory while the copies are built (its last allocations are the
    // last copy's; a quarter back lands in an earlier one): every rank fails alike.
    for (int k = 0; k < 2 && n_s > n_p; k++) {
        uint64_t     at     = k == 0 ? n_s : n_s - (n_s - n_p) / 4;
        int64_t      before = ddl_alloc_bytes_live();
        ddl_spec_t  *sp     = NULL;
        ddl_model_t *mf     = NULL;
        ASSERT_OK(ddl_spec_parse(text, path, size, &sp));
        if (rank == size - 1) {
            ddl_alloc_fail_after(at, 0);
        }
        ASSERT_STATUS(ddl_model_create(MPI_COMM_WORLD, sp, &mf), DDL_ENOMEM);
        ddl_alloc_fail_after(0, 0);
        ASSERT_TRUE(mf == NULL);
        ddl_spec_destroy(&sp);
        ASSERT_EQ(ddl_alloc_bytes_live(), before);
    }
    ASSERT_EQ(ddl_spec_inference_batches(ddl_model_spec(mp), NULL), 0);
    void *lg2 = NULL;
    if (rank == 0) {
        b.x   = calloc((size_t)(b.B * b.S), b.es);
        b.lg  = calloc((size_t)(b.B * b.C * b.L), b.es);
        lg2   = calloc((size_t)(b.B * b.C * b.L), b.es);
        b.lab = calloc((size_t)(b.B * b.L), sizeof(int64_t));
        ddl_test_fill(b.x, b.es, b.B * b.S, 11, -1.0, 1.0);
        for (int64_t i = 0; i < b.B * b.L; i++) {
            b.lab[i] = (i * 7 + i / 3) % b.C;
        }
        if (b.dense) {
            b.t = calloc((size_t)(b.B * b.L), b.es);
            ddl_test_fill(b.t, b.es, b.B * b.L, 12, 0.0, 1.0);
        }
    }
    step(ms, &b);
    step(mp, &b);
    // The padded model's full batch, once (nothing below changes either model until the
    // second step): the rows every short batch is checked against.
    void *full = rank == 0 ? calloc((size_t)(b.B * b.C * b.L), b.es) : NULL;
    predict(mp, &b, b.B, full);
    int64_t     ns[]     = {1, 2, 3, 5, b.B / 2, b.B / 2 + 1, b.B - 1, b.B};
    double      worst    = 0;
    uint64_t    moved[2] = {0, 0}; // bytes predict(1) moved: the short batch, the padded one
    size_t      row      = (size_t)(b.C * b.L) * b.es;
    ddl_traffic t0, t1, t2;
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        int64_t n = ns[k];
        if (n < 1 || n > b.B || (k > 0 && n <= ns[k - 1])) {
            continue;
        }
        ddl_traffic_snapshot(&t0);
        predict(ms, &b, n, b.lg);
        ddl_traffic_snapshot(&t1);
        predict(mp, &b, n, lg2);
        ddl_traffic_snapshot(&t2);
        if (n == 1) {
            moved[0] = bytes_moved(&t0, &t1);
            moved[1] = bytes_moved(&t1, &t2);
        }
        double d = rel_diff(&b, b.lg, lg2, n);
        worst    = fmax(worst, d);
        if (rank == 0 && memcmp(b.lg, lg2, (size_t)n * row) != 0) {
            TEST_FAIL_("%s: %lld samples: the short batch's logits differ from the padded "
                       "batch's by %.3g (relative; expected the same bits)",
                       path, (long long)n, d);
        }
        // The same rows anywhere in a batch: samples [o, o + n) of the full batch against
        // those n samples predicted alone (into lg2; b.lg keeps the first n for the hits).
        int64_t o = b.B - n;
        if (o > 0) {
            batch sub = b;
            sub.x     = rank == 0 ? (char *)b.x + (size_t)(o * b.S) * b.es : NULL;
            predict(ms, &sub, n, lg2);
            if (rank == 0 && memcmp(lg2, (char *)full + (size_t)o * row, (size_t)n * row) != 0) {
                TEST_FAIL_("%s: samples [%lld, %lld) predicted alone differ from the same rows "
                           "of a full batch (relative %.3g; expected the same bits)",
                           path, (long long)o, (long long)b.B,
                           rel_diff(&b, lg2, (char *)full + (size_t)o * row, n));
            }
        }
        double  ls, lp;
        int64_t cs, cp;
        size_t  xb = rank == 0 ? (size_t)(n * b.S) * b.es : 0;
        if (b.dense) {
            ddl_dense_metrics ds, dp;
            size_t            tb = rank == 0 ? (size_t)(n * b.L) * b.es : 0;
            ASSERT_OK(ddl_model_eval_dense(ms, b.x, xb, b.t, tb, n, &ds));
            ASSERT_OK(ddl_model_eval_dense(mp, b.x, xb, b.t, tb, n, &dp));
            ASSERT_TRUE(ds.loss_sum == dp.loss_sum && ds.sq_err == dp.sq_err);
            continue;
        }
        ASSERT_OK(ddl_model_eval(ms, b.x, xb, b.lab, n, &ls, &cs));
        ASSERT_OK(ddl_model_eval(mp, b.x, xb, b.lab, n, &lp, &cp));
        ASSERT_TRUE(ls == lp); // the same rows' losses, summed in the same order
        if (rank == 0) {
            ASSERT_EQ(cs, hits(&b, b.lg, n));
            ASSERT_EQ(cp, hits(&b, b.lg, n));
        }
    }
    // The copies share the weights: after another step (of the model with copies alone),
    // one sample predicted by its copy has moved, and has the bits of that sample's row
    // in the model's own full batch.
    predict(ms, &b, 1, lg2);
    step(ms, &b);
    predict(ms, &b, 1, b.lg);
    double moved_by = rel_diff(&b, b.lg, lg2, 1);
    if (rank == 0) {
        ASSERT_TRUE(moved_by > tol); // a step changed the prediction
    }
    predict(ms, &b, b.B, full);
    if (rank == 0 && memcmp(b.lg, full, row) != 0) {
        TEST_FAIL_("%s: after a step, one sample predicted alone differs from its row of a full "
                   "batch (relative %.3g): the copy does not see the new weights",
                   path, rel_diff(&b, b.lg, full, 1));
    }
    // At 2 ranks or more the padded prediction moves a full batch, the short one less.
    MPI_Allreduce(MPI_IN_PLACE, moved, 2, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    if (size > 1 && b.B > 1) {
        ASSERT_TRUE(moved[0] < moved[1]);
    }
    // The copies (mem_s - mem_p) cost less than half of the model itself (mem_p).
    ASSERT_TRUE(mem_s - mem_p < mem_p / 2);
    if (rank == 0) {
        printf("%s: %d inference batches; logits the padded model's bits (%.2g); predict(1) "
               "moves %llu bytes (padded %llu); copies +%.0f%% of the model's %lld B (rank 0); "
               "create %.1f ms (padded %.1f ms); a step moved predict(1) by %.2g (> %g)\n",
               path, ddl_spec_inference_batches(spec, NULL), worst, (unsigned long long)moved[0],
               (unsigned long long)moved[1], 100.0 * (double)(mem_s - mem_p) / (double)mem_p,
               (long long)mem_p, t_s * 1e3, t_p * 1e3, moved_by, tol);
    }
    ddl_model_destroy(&ms);
    ddl_model_destroy(&mp);
    free(padded);
    free(b.x);
    free(b.lg);
    free(lg2);
    free(full);
    free(b.lab);
    free(b.t);
    ddl_spec_destroy(&spec);
    return 1;
}

int main(int argc, char **argv)
{
    ddl_test_mpi_init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    ASSERT_TRUE(argc == 2);
    ASSERT_TRUE(ddl_test_each_file(argv[1], ".json", check_spec, NULL) > 0);
    return ddl_test_mpi_finalize();
}
