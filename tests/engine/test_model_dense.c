// Dense targets through the model (issue 18): every elementwise loss (mse, l1, bce after a
// sigmoid, bce_with_logits, kl_div with batchmean and with log_target, poisson_nll), the
// output [batch, 1, D, H, W] of a small 3-D network whose volume is split over the ranks,
// and targets of the same shape moved onto the output partition by the target plan:
//  - the distributed model equals the same spec on rank 0 alone (MPI_COMM_SELF), f64:
//    three SGD steps' losses and metrics, then eval and the predicted output (1e-12
//    relative);
//  - eval against a recomputation here, from the predicted output and PyTorch's formula
//    of each loss: the per-sample loss under the reduction, sum (p - t)^2, sum t^2 and the
//    side-of-1/2 hits, with a padding sample ignored;
//  - the gradient: one SGD step moves each weight by -lr * dL/dw; central differences of
//    the loss (by eval; the network has no batch norm, so eval's forward is training's)
//    agree to 1e-6 relative on the one-rank model;
//  - bad targets: a NaN at one value, a value outside [0, 1] for the binary losses, a
//    negative Poisson rate, too few bytes: refused on every rank with the same status and
//    message naming the sample and value, and nothing changes (the next step's loss is
//    the same); the label entry points refuse a dense model and the dense ones a
//    classifier.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddl/base.h"
#include "ddl/session.h"
#include "mpi_test.h"

enum { B = 3, D = 8, H = 6, W = 4, V = D * H * W };
#define LR 0.01

typedef struct kind {
    const char   *name, *loss_json;
    ddl_loss_kind k;
    bool          sigmoid; // the network ends with a sigmoid (bce)
    bool          mask;    // targets: the object mask (else the clean volume)
    double        shift;   // added to the clean targets (log_target: log-probabilities)
} kind;

static const kind kinds[] = {
    {"mse", "{\"type\": \"mse\"}", DDL_LOSS_MSE, false, false, 0},
    {"l1 sum", "{\"type\": \"l1\", \"reduction\": \"sum\"}", DDL_LOSS_L1, false, false, 0},
    {"bce", "{\"type\": \"bce\"}", DDL_LOSS_BCE, true, true, 0},
    {"bce_with_logits", "{\"type\": \"bce_with_logits\"}", DDL_LOSS_BCE_WITH_LOGITS, false, true,
     0},
    {"kl_div batchmean", "{\"type\": \"kl_div\", \"reduction\": \"batchmean\"}", DDL_LOSS_KL_DIV,
     false, false, 0},
    {"kl_div log_target", "{\"type\": \"kl_div\", \"log_target\": true}",
     DDL_LOSS_KL_DIV_LOG_TARGET, false, false, -1.0},
    {"poisson_nll", "{\"type\": \"poisson_nll\"}", DDL_LOSS_POISSON_NLL, false, false, 0},
};

// conv3d (4 channels), tanh, conv3d to 1 channel [, sigmoid] on a world of P ranks whose
// volume is split as `split`; SGD so that a step is -lr times the gradient.
static char *spec_text(int P, const char *split, const kind *k)
{
    const int vol[3] = {D, H, W};
    char      layers[512], rest[512];
    snprintf(layers, sizeof layers, "%s%s", ddl_test_conv3d_pair,
             k->sigmoid ? ", {\"type\": \"sigmoid\"}" : "");
    snprintf(rest, sizeof rest,
             " \"loss\": %s,\n"
             " \"optimizer\": {\"type\": \"sgd\", \"lr\": %g},\n"
             " \"data\": {\"synthetic\": {\"kind\": \"shapes3d\", \"train\": 12, \"test\": 5, "
             "\"noise\": 0.2}, \"target\": \"%s\"}",
             k->loss_json, LR, k->mask ? "mask" : "clean");
    return ddl_test_vol_spec(P, split, 3, "f64", B, vol, layers, rest);
}

static ddl_model_t *make_model(MPI_Comm comm, const char *text)
{
    ddl_model_t      *m = ddl_test_model(comm, text, "dense.json");
    const ddl_spec_t *s = ddl_model_spec(m);
    ASSERT_TRUE(ddl_spec_dense_targets(s) && ddl_spec_output_elems(s) == V);
    return m;
}

static double rel(double a, double b)
{
    return fabs(a - b) / fmax(fabs(b), 1e-300);
}

// PyTorch's per-element loss (torch.nn.functional, default arguments) and the prediction.
static double torch_loss(ddl_loss_kind k, double x, double t)
{
    switch (k) {
    case DDL_LOSS_MSE:
        return (x - t) * (x - t);
    case DDL_LOSS_L1:
        return fabs(x - t);
    case DDL_LOSS_BCE:
        return -(t * fmax(log(x), -100.0) + (1 - t) * fmax(log(1 - x), -100.0));
    case DDL_LOSS_BCE_WITH_LOGITS:
        return (1 - t) * x + log1p(exp(-x));
    case DDL_LOSS_KL_DIV:
        return t > 0 ? t * (log(t) - x) : 0.0;
    case DDL_LOSS_KL_DIV_LOG_TARGET:
        return exp(t) * (t - x);
    case DDL_LOSS_POISSON_NLL:
        return exp(x) - t * x;
    default:
        return NAN;
    }
}
static double prediction(ddl_loss_kind k, double y)
{
    return k == DDL_LOSS_BCE_WITH_LOGITS                       ? 1 / (1 + exp(-y))
           : k == DDL_LOSS_POISSON_NLL || k == DDL_LOSS_KL_DIV ? exp(y)
                                                               : y;
}

// eval's figures from the predicted output y [B, V] for the first n samples.
static ddl_dense_metrics reference(const kind *k, const char *red, const double *y, const double *t,
                                   int64_t n)
{
    ddl_dense_metrics r      = {0};
    bool              binary = k->k == DDL_LOSS_BCE || k->k == DDL_LOSS_BCE_WITH_LOGITS;
    for (int64_t b = 0; b < n; b++) {
        double per = 0;
        for (int64_t v = 0; v < V; v++) {
            double x = y[b * V + v], tv = t[b * V + v], p = prediction(k->k, x);
            per += torch_loss(k->k, x, tv);
            r.sq_err += (p - tv) * (p - tv);
            r.sq_target += tv * tv;
            r.hits += binary && (p > 0.5) == (tv > 0.5);
        }
        r.loss_sum += strcmp(red, "mean") == 0 ? per / V : per;
    }
    return r;
}

static const char *reduction_of(const kind *k)
{
    return strstr(k->loss_json, "\"sum\"")     ? "sum"
           : strstr(k->loss_json, "batchmean") ? "batchmean"
                                               : "mean";
}

// The training loss of the whole batch from eval's per-sample sum (same forward).
static double batch_loss(const kind *k, double loss_sum)
{
    const char *red = reduction_of(k);
    return strcmp(red, "sum") == 0 ? loss_sum : loss_sum / B;
}

// Central differences of the one-rank model's loss in a few weights of its first layer
// against -(w_after - w_before) / lr of one SGD step.
static void gradcheck(const kind *k, const char *t1, const double *x, const double *t, size_t xb,
                      size_t tb)
{
    ddl_model_t      *m    = make_model(MPI_COMM_SELF, t1);
    ddl_param        *p    = ddl_model_param(m, 0);
    double           *w    = p->value->data;
    int64_t           nw   = ddl_tensor_numel(p->value);
    int64_t           at[] = {0, 7, nw / 2, nw - 1};
    double            fd[4], h = 1e-5;
    ddl_dense_metrics dm;
    for (int i = 0; i < 4; i++) {
        double w0 = w[at[i]], lp, lm;
        w[at[i]]  = w0 + h;
        ASSERT_OK(ddl_model_eval_dense(m, x, xb, t, tb, B, &dm));
        lp       = batch_loss(k, dm.loss_sum);
        w[at[i]] = w0 - h;
        ASSERT_OK(ddl_model_eval_dense(m, x, xb, t, tb, B, &dm));
        lm       = batch_loss(k, dm.loss_sum);
        w[at[i]] = w0;
        fd[i]    = (lp - lm) / (2 * h);
    }
    double before[4], loss, worst = 0;
    for (int i = 0; i < 4; i++) {
        before[i] = w[at[i]];
    }
    ASSERT_OK(ddl_model_train_step_dense(m, x, xb, t, tb, B, &loss, &dm));
    for (int i = 0; i < 4; i++) {
        double g = -(w[at[i]] - before[i]) / LR;
        worst    = fmax(worst, fabs(g - fd[i]) / fmax(fabs(fd[i]), 1e-3));
    }
    printf("  %s: gradient against central differences, max rel diff %.2e\n", k->name, worst);
    ASSERT_TRUE(worst <= 1e-6);
    ddl_model_destroy(&m);
}

// Every rank: status st with a message containing want.
static void refused(ddl_status st, const char *want)
{
    ASSERT_STATUS(st, DDL_EINVAL);
    if (strstr(ddl_last_error(), want) == NULL) {
        fprintf(stderr, "rank %d: \"%s\" lacks \"%s\"\n", ddl_test_rank, ddl_last_error(), want);
        exit(1);
    }
}

static void one_kind(const kind *k, const char *split)
{
    int size;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    char        *td = spec_text(size, split, k), *t1 = spec_text(1, "[1, 1, 1, 1, 1]", k);
    ddl_model_t *md = make_model(MPI_COMM_WORLD, td);
    ddl_model_t *m1 = ddl_test_rank == 0 ? make_model(MPI_COMM_SELF, t1) : NULL;
    double      *x = NULL, *t = NULL, *y = NULL, *y1 = NULL;
    size_t       xb = 0, tb = 0;
    if (ddl_test_rank == 0) {
        xb                  = sizeof(double) * B * V;
        tb                  = sizeof(double) * B * V;
        x                   = malloc(xb);
        t                   = malloc(tb);
        y                   = malloc(tb);
        y1                  = malloc(tb);
        int64_t         *lb = malloc(sizeof(int64_t) * B * V);
        ddl_synth_params p  = {DDL_SYNTH_SHAPES3D, {D, H, W}, 0.2, 9};
        ASSERT_OK(ddl_synth_batch_targets(&p, 0, (int64_t[]){0, 1, 2}, B, 0, 1, DDL_F64, x, lb,
                                          k->mask, t));
        for (int64_t i = 0; i < B * V; i++) {
            t[i] += k->shift;
        }
        free(lb);
    }
    double            worst = 0, l0 = 0;
    ddl_dense_metrics dm, dm1;
    for (int step = 0; step < 3; step++) {
        double l = 0, l1 = 0;
        ASSERT_OK(ddl_model_train_step_dense(md, x, xb, t, tb, B, &l, &dm));
        if (ddl_test_rank == 0) {
            ASSERT_OK(ddl_model_train_step_dense(m1, x, xb, t, tb, B, &l1, &dm1));
            worst = fmax(worst, rel(l, l1));
            worst = fmax(worst, rel(dm.sq_err, dm1.sq_err));
            ASSERT_TRUE(dm.hits == dm1.hits);
            ASSERT_TRUE(isfinite(l));
        }
        if (step == 0) {
            l0 = l;
        }
    }
    // Eval with one padding sample, and predict, against the recomputation.
    int64_t n = B - 1;
    ASSERT_OK(ddl_model_eval_dense(md, x, xb, t, tb, n, &dm));
    ASSERT_OK(ddl_model_predict(md, x, xb, B, y, tb));
    if (ddl_test_rank == 0) {
        ASSERT_OK(ddl_model_eval_dense(m1, x, xb, t, tb, n, &dm1));
        ASSERT_OK(ddl_model_predict(m1, x, xb, B, y1, tb));
        worst = fmax(worst, rel(dm.loss_sum, dm1.loss_sum));
        for (int64_t i = 0; i < B * V; i++) {
            worst = fmax(worst, fabs(y[i] - y1[i]) / fmax(fabs(y1[i]), 1.0));
        }
        ddl_dense_metrics r = reference(k, reduction_of(k), y, t, n);
        ASSERT_NEAR(dm.loss_sum, r.loss_sum, 1e-10 * fabs(r.loss_sum));
        ASSERT_NEAR(dm.sq_err, r.sq_err, 1e-10 * r.sq_err);
        ASSERT_NEAR(dm.sq_target, r.sq_target, 1e-12 * r.sq_target);
        ASSERT_EQ(dm.hits, r.hits);
        printf("%s on %s: distributed vs one rank max rel diff %.2e over 3 steps, eval and "
               "predict; loss %.6f -> eval %.6f, rel L2 %.4f\n",
               k->name, split, worst, l0, dm.loss_sum / (double)n, sqrt(dm.sq_err / dm.sq_target));
        ASSERT_TRUE(worst <= 1e-12);
        gradcheck(k, t1, x, t, xb, tb);
    }
    // Bad targets, found on rank 0 before any data moves: every rank refuses alike, and
    // the model is unchanged (the same step's loss after the refusals).
    double saved = 0, l = 0;
    if (ddl_test_rank == 0) {
        saved     = t[V + 17];
        t[V + 17] = NAN;
    }
    refused(ddl_model_train_step_dense(md, x, xb, t, tb, B, &l, &dm),
            "target nan of sample 1, value 17 is not finite");
    if (k->k == DDL_LOSS_BCE || k->k == DDL_LOSS_BCE_WITH_LOGITS || k->k == DDL_LOSS_POISSON_NLL) {
        if (ddl_test_rank == 0) {
            t[V + 17] = k->k == DDL_LOSS_POISSON_NLL ? -0.5 : 1.5;
        }
        refused(ddl_model_eval_dense(md, x, xb, t, tb, B, &dm),
                "of sample 1, value 17 is out of range");
    }
    if (ddl_test_rank == 0) {
        t[V + 17] = saved;
    }
    refused(ddl_model_train_step_dense(md, x, xb, t, ddl_test_rank == 0 ? tb - 8 : 0, B, &l, &dm),
            "need 4608 bytes, got 4600");
    refused(ddl_model_train_step(md, x, xb, NULL, B, &l, &(int64_t){0}),
            "trains on dense targets shaped like the output, not class labels");
    double a = 0, b = 0;
    ASSERT_OK(ddl_model_eval_dense(md, x, xb, t, tb, B, &dm));
    a = dm.loss_sum;
    ASSERT_OK(ddl_model_eval_dense(md, x, xb, t, tb, B, &dm));
    b = dm.loss_sum;
    ASSERT_TRUE(a == b);
    ddl_model_destroy(&md);
    ddl_model_destroy(&m1);
    free(x);
    free(t);
    free(y);
    free(y1);
    free(td);
    free(t1);
}

// The dense entry points refuse a classifier.
static void classifier_refuses(const char *split)
{
    int size;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    kind  k = kinds[0];
    char *t = spec_text(size, split, &k);
    char *c = strstr(t, "\"out_channels\": 1");
    memcpy(c, "\"out_channels\": 3", 17);
    char *l = strstr(t, "{\"type\": \"mse\"}");
    char  buf[4096];
    snprintf(buf, sizeof buf, "%.*s{\"type\": \"cross_entropy\"}%s", (int)(l - t), t,
             l + strlen("{\"type\": \"mse\"}"));
    char *tg = strstr(buf, ", \"target\": \"clean\"");
    memmove(tg, tg + strlen(", \"target\": \"clean\""),
            strlen(tg + strlen(", \"target\": \"clean\"")) + 1);
    ddl_spec_t  *s = NULL;
    ddl_model_t *m = NULL;
    ASSERT_OK(ddl_spec_parse(buf, "ce.json", size, &s));
    ASSERT_OK(ddl_model_create(MPI_COMM_WORLD, s, &m));
    ddl_spec_destroy(&s);
    double            x[B * V] = {0}, l2 = 0;
    ddl_dense_metrics dm;
    refused(ddl_model_train_step_dense(m, x, sizeof x, x, sizeof x, B, &l2, &dm),
            "the loss cross_entropy trains on class labels, not dense targets");
    ddl_model_destroy(&m);
    free(t);
}

int main(int argc, char **argv)
{
    ddl_test_mpi_init(&argc, &argv);
    int size;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const char *split = size == 1   ? "[1, 1, 1, 1, 1]"
                        : size == 2 ? "[1, 1, 2, 1, 1]"
                                    : "[1, 1, 2, 2, 1]";
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        one_kind(&kinds[i], split);
    }
    classifier_refuses(split);
    if (ddl_test_rank == 0) {
        printf("test_model_dense: ok\n");
    }
    return ddl_test_mpi_finalize();
}
