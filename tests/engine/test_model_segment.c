// Segmentation through the model and the session (output [batch, classes, D, H, W], one
// label per voxel), on 1, 2 and 4 ranks with the volume split spatially:
//  - the distributed model equals the same spec on rank 0 alone (MPI_COMM_SELF): train
//    step losses, voxel hits and per-class counts, eval, predicted logits [n, C, D, H, W]
//    (f64: the first step 1e-13 relative; after 4 Adam steps 1e-8);
//  - eval's loss is the per-sample mean over voxels of the cross-entropy of the predicted
//    logits, its hits and per-class intersection / union counts the argmax's, all
//    recomputed here, with padding samples ignored;
//  - synthetic data through the session: training lowers the loss, evaluation reports
//    voxel accuracy and a foreground IoU in [0, 1];
//  - errors: a label outside [0, classes) at one voxel (named), IDX data for a
//    segmentation model, predict into a buffer too small: refused on every rank;
//  - per-rank ingest (ddl_model_local_input, ddl_model_local_labels): every rank generates
//    its own boxes (ddl_synth_box) and the steps give the bits of rank 0's scattered
//    batch (losses, hits, class counts, eval with a padding row); a bad label on the
//    last rank only stops every rank before anything moves, and the next step still
//    matches.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddl/base.h"
#include "ddl/session.h"
#include "mpi_test.h"

enum { B = 3, C = 3, D = 8, H = 6, W = 5, V = D * H * W };

// A small segmentation chain (conv, batch norm, pool, upsample, conv to 3 classes) on a
// world of P ranks whose volume is split as `split` ([1, 1, a, b, c]).
static char *spec_text(int P, const char *split, const char *dtype)
{
    const int vol[3] = {D, H, W};
    char      layers[1024];
    snprintf(layers, sizeof layers,
             "  {\"type\": \"conv3d\", \"out_channels\": 4, \"kernel\": [3, 3, 3], "
             "\"padding\": [1, 1, 1]},\n"
             "  {\"type\": \"batchnorm\"}, {\"type\": \"relu\"},\n"
             "  {\"type\": \"maxpool3d\", \"kernel\": [2, 2, 1]},\n"
             "  {\"type\": \"conv3d\", \"out_channels\": 4, \"kernel\": [3, 3, 3], "
             "\"padding\": [1, 1, 1]},\n"
             "  {\"type\": \"upsample\", \"mode\": \"linear\", \"size\": [%d, %d, %d]},\n"
             "  {\"type\": \"conv3d\", \"out_channels\": %d, \"kernel\": [1, 1, 1]}",
             D, H, W, C);
    return ddl_test_vol_spec(P, split, 5, dtype, B, vol, layers,
                             " \"loss\": {\"type\": \"cross_entropy\"},\n"
                             " \"optimizer\": {\"type\": \"adam\", \"lr\": 0.01},\n"
                             " \"data\": {\"synthetic\": {\"kind\": \"shapes3d\", \"train\": "
                             "12, \"test\": 5, \"noise\": 0.2}}");
}

static ddl_model_t *make_model(MPI_Comm comm, const char *text)
{
    ddl_model_t      *m = ddl_test_model(comm, text, "seg.json");
    const ddl_spec_t *s = ddl_model_spec(m);
    ASSERT_EQ(ddl_spec_label_elems(s), V);
    ASSERT_EQ(ddl_spec_output_shape(s).ndim, 4);
    return m;
}

static double rel(double a, double b)
{
    return fabs(a - b) / fmax(fabs(b), 1e-300);
}

// Recomputes eval's figures from predicted logits [B, C, V] (f64) for the first n samples.
static void reference(const double *lg, const int64_t *lab, int64_t n, double *loss,
                      int64_t *hits, int64_t *inter, int64_t *uni)
{
    *loss = 0;
    *hits = 0;
    memset(inter, 0, sizeof(int64_t) * C);
    memset(uni, 0, sizeof(int64_t) * C);
    for (int64_t b = 0; b < n; b++) {
        double per = 0;
        for (int64_t v = 0; v < V; v++) {
            double  mx = lg[(b * C) * V + v];
            int64_t am = 0;
            for (int64_t c = 1; c < C; c++) {
                if (lg[(b * C + c) * V + v] > mx) {
                    mx = lg[(b * C + c) * V + v];
                    am = c;
                }
            }
            double se = 0;
            for (int64_t c = 0; c < C; c++) {
                se += exp(lg[(b * C + c) * V + v] - mx);
            }
            int64_t l = lab[b * V + v];
            per += mx + log(se) - lg[(b * C + l) * V + v];
            *hits += am == l;
            inter[l] += am == l;
            uni[l]++;
            uni[am] += am != l;
        }
        *loss += per / V;
    }
}

static void equivalence(const char *split)
{
    int size;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    char        *td = spec_text(size, split, "f64"), *t1 = spec_text(1, "[1, 1, 1, 1, 1]", "f64");
    ddl_model_t *md = make_model(MPI_COMM_WORLD, td);
    ddl_model_t *m1 = ddl_test_rank == 0 ? make_model(MPI_COMM_SELF, t1) : NULL;
    double      *x = NULL, *lg = NULL, *lg1 = NULL;
    int64_t     *lab = NULL;
    size_t       xb = 0, lb = 0;
    if (ddl_test_rank == 0) {
        xb  = sizeof(double) * B * V;
        lb  = sizeof(double) * B * C * V;
        x   = malloc(xb);
        lg  = malloc(lb);
        lg1 = malloc(lb);
        lab = malloc(sizeof(int64_t) * B * V);
        ddl_synth_params p = {DDL_SYNTH_SHAPES3D, {D, H, W}, 0.2, 9};
        ASSERT_OK(ddl_synth_batch(&p, 0, (int64_t[]){0, 1, 2}, B, 0, 1, DDL_F64, x, lab));
    }
    double  worst = 0;
    int64_t inter[C], uni[C], inter1[C], uni1[C];
    for (int step = 0; step < 4; step++) {
        double  l = 0, l1 = 0;
        int64_t c = 0, c1 = 0;
        ASSERT_OK(ddl_model_train_step(md, x, xb, lab, B, &l, &c));
        ASSERT_TRUE(ddl_model_class_counts(md, inter, uni));
        if (ddl_test_rank == 0) {
            ASSERT_OK(ddl_model_train_step(m1, x, xb, lab, B, &l1, &c1));
            ASSERT_TRUE(ddl_model_class_counts(m1, inter1, uni1));
            // The first step sees identical weights: only summation order differs. Adam
            // then divides by the root of small second moments, which magnifies those
            // last-bit differences a little each step.
            if (step == 0) {
                ASSERT_TRUE(rel(l, l1) <= 1e-13);
            }
            worst = fmax(worst, rel(l, l1));
            ASSERT_TRUE(labs(c - c1) <= 1);  // an argmax tie may fall either way
            ASSERT_TRUE(c >= 0 && c <= B * V);
        }
    }
    // Eval with one padding sample, and predict, against the recomputation.
    int64_t n = B - 1, hits, hits1;
    double  loss, loss1;
    ASSERT_OK(ddl_model_eval(md, x, xb, lab, n, &loss, &hits));
    ASSERT_TRUE(ddl_model_class_counts(md, inter, uni));
    ASSERT_OK(ddl_model_predict(md, x, xb, B, lg, lb));
    if (ddl_test_rank == 0) {
        ASSERT_OK(ddl_model_eval(m1, x, xb, lab, n, &loss1, &hits1));
        ASSERT_OK(ddl_model_predict(m1, x, xb, B, lg1, lb));
        worst = fmax(worst, rel(loss, loss1));
        for (int64_t i = 0; i < B * C * V; i++) {
            worst = fmax(worst, fabs(lg[i] - lg1[i]) / fmax(fabs(lg1[i]), 1.0));
        }
        double  rl;
        int64_t rh, ri[C], ru[C];
        reference(lg, lab, n, &rl, &rh, ri, ru);
        ASSERT_NEAR(loss, rl, 1e-10 * rl);
        ASSERT_EQ(hits, rh);
        for (int k = 0; k < C; k++) {
            ASSERT_EQ(inter[k], ri[k]);
            ASSERT_EQ(uni[k], ru[k]);
        }
        printf("segmentation on %s: distributed vs one rank max rel diff %.2e over 4 steps, "
               "eval and predict; eval loss %.6f, voxel acc %.4f\n",
               split, worst, loss, (double)hits / (double)(n * V));
        ASSERT_TRUE(worst <= 1e-8);
    }
    // A label out of range at one voxel: refused everywhere, naming sample and voxel.
    if (ddl_test_rank == 0) {
        lab[V + 17] = C;
    }
    ASSERT_STATUS(ddl_model_train_step(md, x, xb, lab, B, &loss, &hits), DDL_EINVAL);
    ASSERT_TRUE(strstr(ddl_last_error(), "label 3 of sample 1, voxel 17") != NULL);
    // Predict into too small a buffer.
    ASSERT_STATUS(ddl_model_predict(md, x, xb, B, lg, ddl_test_rank == 0 ? lb - 8 : 0),
                  DDL_EINVAL);
    ddl_model_destroy(&md);
    ddl_model_destroy(&m1);
    free(x);
    free(lg);
    free(lg1);
    free(lab);
    free(td);
    free(t1);
}

// Rows [start, stop) of a box [batch, 1, D, H, W]: samples idx[r] generated, x or lab.
static void fill_box(const ddl_synth_params *p, const int64_t *idx, int64_t count, const ddl_box *b,
                     double *x, int64_t *lab)
{
    if (b->ndim != 5 || ddl_box_numel(b) == 0) {
        return;
    }
    int64_t lo[3] = {b->start[2], b->start[3], b->start[4]};
    int64_t hi[3] = {b->stop[2], b->stop[3], b->stop[4]};
    int64_t per   = (hi[0] - lo[0]) * (hi[1] - lo[1]) * (hi[2] - lo[2]);
    for (int64_t r = b->start[0]; r < b->stop[0]; r++) {
        int64_t o = (r - b->start[0]) * per;
        if (r < count) {
            ASSERT_OK(ddl_synth_box(p, 0, &idx[r], 1, lo, hi, 0, 1, DDL_F64, x ? x + o : NULL,
                                    lab ? lab + o : NULL));
        } else if (x != NULL) {
            memset(x + o, 0, sizeof(double) * (size_t)per);
        } else {
            memset(lab + o, 0, sizeof(int64_t) * (size_t)per);
        }
    }
}

static void local_ingest(const char *split)
{
    int size;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    char            *td = spec_text(size, split, "f64");
    ddl_model_t     *md = make_model(MPI_COMM_WORLD, td), *ml = make_model(MPI_COMM_WORLD, td);
    ddl_synth_params p      = {DDL_SYNTH_SHAPES3D, {D, H, W}, 0.2, 9};
    const int64_t    idx[B] = {5, 1, 2};
    double          *x      = NULL;
    int64_t         *lab    = NULL;
    size_t           xb     = 0;
    if (ddl_test_rank == 0) {
        xb  = sizeof(double) * B * V;
        x   = malloc(xb);
        lab = malloc(sizeof(int64_t) * B * V);
        ASSERT_OK(ddl_synth_batch(&p, 0, idx, B, 0, 1, DDL_F64, x, lab));
    }
    ddl_box  bx, by;
    void    *px;
    int64_t *py;
    ddl_model_local_input(ml, &bx, &px);
    ddl_model_local_labels(ml, &by, &py);
    ASSERT_EQ(by.ndim, 5);
    ASSERT_TRUE(by.start[1] == 0 && by.stop[1] == 1);
    int64_t in_d[C], un_d[C], in_l[C], un_l[C];
    for (int step = 0; step < 4; step++) {
        fill_box(&p, idx, B, &bx, px, NULL);
        fill_box(&p, idx, B, &by, NULL, py);
        double  l = 0, l2 = 0;
        int64_t c = 0, c2 = 0;
        if (step == 2) {
            // A label outside [0, classes) on the last rank's first voxel only: every rank
            // fails, before anything moves (the step below still matches).
            int64_t keep = 0;
            if (ddl_test_rank == size - 1 && ddl_box_numel(&by) > 0) {
                keep  = py[0];
                py[0] = C;
            }
            ASSERT_STATUS(ddl_model_train_step_local_labels(ml, &l2, &c2), DDL_EINVAL);
            if (ddl_test_rank == size - 1) {
                // (On one rank the box is the whole volume: no "of this rank's box".)
                ASSERT_TRUE(strstr(ddl_last_error(), size > 1 ? "label 3 of sample 0, voxel 0 "
                                                                "of this rank's box is outside"
                                                              : "label 3 of sample 0, voxel 0 "
                                                                "is outside [0, 3)") != NULL);
                py[0] = ddl_box_numel(&by) > 0 ? keep : 0;
            }
            ASSERT_EQ(ddl_model_step(ml), ddl_model_step(md));
        }
        ASSERT_OK(ddl_model_train_step(md, x, xb, lab, B, &l, &c));
        ASSERT_OK(ddl_model_train_step_local_labels(ml, &l2, &c2));
        ASSERT_TRUE(ddl_model_class_counts(md, in_d, un_d) &&
                    ddl_model_class_counts(ml, in_l, un_l));
        ASSERT_TRUE(memcmp(&l, &l2, sizeof l) == 0); // the same data, the same bits
        ASSERT_EQ(c, c2);
        for (int k = 0; k < C; k++) {
            ASSERT_EQ(in_d[k], in_l[k]);
            ASSERT_EQ(un_d[k], un_l[k]);
        }
    }
    // Eval of B - 1 samples: the last row of each box is zero.
    fill_box(&p, idx, B - 1, &bx, px, NULL);
    fill_box(&p, idx, B - 1, &by, NULL, py);
    double  l = 0, l2 = 0;
    int64_t c = 0, c2 = 0;
    ASSERT_OK(ddl_model_eval(md, x, xb, lab, B - 1, &l, &c));
    ASSERT_OK(ddl_model_eval_local_labels(ml, B - 1, &l2, &c2));
    ASSERT_TRUE(ddl_model_class_counts(md, in_d, un_d) && ddl_model_class_counts(ml, in_l, un_l));
    ASSERT_TRUE(rel(l, l2) <= 1e-12);
    ASSERT_EQ(c, c2);
    for (int k = 0; k < C; k++) {
        ASSERT_EQ(in_d[k], in_l[k]);
        ASSERT_EQ(un_d[k], un_l[k]);
    }
    ASSERT_STATUS(ddl_model_eval_local_labels(ml, ddl_test_rank == 0 ? B + 1 : 1, &l2, &c2),
                  DDL_EINVAL);
    // Per-rank dense targets are not labels, nor the reverse.
    ASSERT_STATUS(ddl_model_train_step_local(ml, &l2, NULL), DDL_EINVAL);
    if (ddl_test_rank == 0) {
        printf("per-rank ingest on %s: 4 steps and an eval bit for bit as rank 0's batch\n", split);
    }
    ddl_model_destroy(&md);
    ddl_model_destroy(&ml);
    free(x);
    free(lab);
    free(td);
}

// The session on the spec's generated data: a few epochs lower the loss; evaluation
// reports a voxel accuracy and a foreground IoU; IDX data is refused for this model.
static void session(const char *split)
{
    int size;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    char          *t = spec_text(size, split, "f32");
    ddl_session_t *s = NULL;
    ASSERT_OK(ddl_session_create(MPI_COMM_WORLD, ddl_test_rank == 0 ? t : NULL, "seg.json", NULL,
                                 &s));
    ddl_status st = ddl_session_open_data(s, ddl_test_rank == 0 ? "/usr/share/datasets/fashion-mnist"
                                                                : NULL);
    ASSERT_EQ(st, DDL_EINVAL);
    ASSERT_TRUE(strstr(ddl_last_error(), "one label per output voxel") != NULL);
    ASSERT_OK(ddl_session_open_synthetic(s));
    ASSERT_EQ(ddl_session_steps_per_epoch(s), 4);
    ddl_eval_result e0, e1;
    ASSERT_OK(ddl_session_evaluate(s, DDL_SPLIT_TEST, &e0));
    ddl_train_request req = {.epochs = 5};
    ddl_train_result  res;
    ASSERT_OK(ddl_session_train(s, &req, NULL, NULL, &res));
    ASSERT_EQ(res.steps_done, 20);
    ASSERT_OK(ddl_session_evaluate(s, DDL_SPLIT_TEST, &e1));
    ASSERT_EQ(e1.count, 5);
    ASSERT_TRUE(e1.loss < e0.loss);
    ASSERT_TRUE(e1.accuracy > 0 && e1.accuracy <= 1);
    ASSERT_TRUE(e1.fg_iou >= 0 && e1.fg_iou <= 1);
    if (ddl_test_rank == 0) {
        printf("session on %s: test loss %.4f -> %.4f, voxel acc %.4f, fg IoU %.4f\n", split,
               e0.loss, e1.loss, e1.accuracy, e1.fg_iou);
    }
    ddl_session_destroy(&s);
    free(t);
}

int main(int argc, char **argv)
{
    ddl_test_mpi_init(&argc, &argv);
    int size;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const char *splits[] = {"[1, 1, 1, 1, 1]", "[1, 1, 2, 1, 1]", "[1, 1, 1, 1, 2]",
                            "[1, 1, 2, 2, 1]", "[1, 1, 1, 2, 2]"};
    for (int i = 0; i < 5; i++) {
        int p = 1;
        for (const char *c = splits[i]; *c; c++) {
            p *= (*c >= '2' && *c <= '9') ? *c - '0' : 1;
        }
        if (p == size) {
            equivalence(splits[i]);
            local_ingest(splits[i]);
            session(splits[i]);
        }
    }
    return ddl_test_mpi_finalize();
}
