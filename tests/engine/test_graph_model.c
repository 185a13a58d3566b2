// Graph models (issue 10): a residual network whose tensors are consumed twice (r0 by c1
// and the add; r2 by c3 and the concat), f64, SGD with lr 0 so a training step leaves the
// weights alone and exposes the loss and the gradients.
//  1. The gradient of every parameter matches central finite differences of the model's
//     loss (a few elements of each, perturbed on the owner rank).
//  2. Fan-out sums: the same network with r0's skip written as a separate path (a second
//     stem from the input, stemB, given stem's weights) has the same loss, and
//     stem.grad == stemB.grad + stem'.grad: the gradient of a tensor consumed twice is the
//     sum of its consumers' gradients.
//  3. Distributed == single rank: on 2 and 4 ranks (the convolutions, the add and the
//     concat on feature partitions [1, 1, 2, 1] and [1, 1, 2, 2]; the global pooling over
//     channels split [1, P, 1, 1], the linear layer over [1, P] input features) the loss
//     and a checksum of every gradient equal the 1-rank model's.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddl/base.h"
#include "ddl/layers.h"
#include "ddl/model.h"
#include "mpi_test.h"

enum { B = 4, C_IN = 2, H = 8, W = 8, CLASSES = 3 };

// The residual network on `world` ranks; `split` writes r0's skip as a second stem.
static char *spec_text(int world, bool split)
{
    int  ps[3][2] = {{1, 1}, {2, 1}, {2, 2}};
    int *s        = ps[world == 1 ? 0 : world == 2 ? 1 : 2];
    char ranks[32];
    ddl_test_rank_list(world, ranks, sizeof ranks);
    const char *conv = "\"type\": \"conv2d\", \"out_channels\": 4, \"kernel\": [3, 3], "
                       "\"padding\": [1, 1]";
    char       *t    = malloc(8192);
    snprintf(t, 8192,
             "{\"world_size\": %d, \"seed\": 5, \"dtype\": \"f64\", \"batch_size\": %d,\n"
             " \"input\": {\"shape\": [%d, %d, %d], \"partition\": \"p\"},\n"
             " \"partitions\": {\"p\": {\"ranks\": [%s], \"shape\": [1, 1, %d, %d]},\n"
             "   \"chs\": {\"ranks\": [%s], \"shape\": [1, %d, 1, 1]},\n"
             "   \"flat\": {\"ranks\": [%s], \"shape\": [1, %d]},\n"
             "   \"out\": {\"ranks\": [0], \"shape\": [1, 1]}},\n"
             " \"layers\": [\n"
             "  {%s, \"name\": \"stem\"},\n"
             "  {\"type\": \"relu\", \"name\": \"r0\"},\n"
             "  {%s, \"name\": \"c1\"},\n"
             "  {\"type\": \"relu\", \"name\": \"r1\"},\n"
             "  {%s, \"name\": \"c2\"},\n"
             "%s"
             "  {\"type\": \"add\", \"name\": \"sum\", \"from\": [\"c2\", \"%s\"]},\n"
             "  {\"type\": \"relu\", \"name\": \"r2\"},\n"
             "  {%s, \"name\": \"c3\"},\n"
             "  {\"type\": \"concat\", \"name\": \"cat\", \"from\": [\"c3\", \"r2\"]},\n"
             "  {\"type\": \"repartition\", \"to\": \"chs\"},\n"
             "  {\"type\": \"adaptive_avgpool2d\", \"output_size\": 1},\n"
             "  {\"type\": \"flatten\", \"to\": \"flat\"},\n"
             "  {\"type\": \"linear\", \"name\": \"fc\", \"out_features\": %d, \"P_y\": \"out\", "
             "\"P_w\": \"flat\"}],\n"
             " \"loss\": {\"type\": \"cross_entropy\"},\n"
             " \"optimizer\": {\"type\": \"sgd\", \"lr\": 0}}\n",
             world, B, C_IN, H, W, ranks, s[0], s[1], ranks, world, ranks, world, conv, conv, conv,
             split ? "  {\"type\": \"conv2d\", \"out_channels\": 4, \"kernel\": [3, 3], "
                     "\"padding\": [1, 1], \"name\": \"stemB\", \"from\": \"input\"},\n"
                     "  {\"type\": \"relu\", \"name\": \"r0B\"},\n"
                   : "",
             split ? "r0B" : "r0", conv, CLASSES);
    return t;
}

static ddl_model_t *make(MPI_Comm comm, int world, bool split)
{
    char        *t    = spec_text(world, split);
    ddl_spec_t  *spec = NULL;
    ddl_model_t *m    = NULL;
    ASSERT_OK(ddl_spec_parse(t, split ? "residual-split.json" : "residual.json", world, &spec));
    ASSERT_OK(ddl_model_create(comm, spec, &m));
    ddl_spec_destroy(&spec);
    free(t);
    return m;
}

static double  xs[B * C_IN * H * W];
static int64_t labels[B];

static double step(ddl_model_t *m)
{
    double  loss;
    int64_t correct;
    ASSERT_OK(ddl_model_train_step(m, xs, sizeof xs, labels, B, &loss, &correct));
    return loss;
}

static ddl_param *param_named(ddl_model_t *m, const char *name)
{
    for (int i = 0; i < ddl_model_nparams(m); i++) {
        if (strcmp(ddl_model_param_name(m, i), name) == 0) {
            return ddl_model_param(m, i);
        }
    }
    fprintf(stderr, "no parameter %s\n", name);
    exit(1);
}

// The global flat index of local element i of a parameter's box.
static int64_t global_index(const ddl_param *p, int64_t i)
{
    int64_t g = 0, rem = i;
    int64_t coord[DDL_MAX_DIMS];
    for (int d = p->box.ndim - 1; d >= 0; d--) {
        int64_t ext = p->box.stop[d] - p->box.start[d];
        coord[d]    = p->box.start[d] + rem % ext;
        rem /= ext;
    }
    for (int d = 0; d < p->box.ndim; d++) {
        g = g * p->global.d[d] + coord[d];
    }
    return g;
}

// A partition-invariant checksum of a parameter's gradient (each element has one owner).
static void checksum(const ddl_param *p, MPI_Comm comm, double out[2])
{
    double  loc[2] = {0, 0};
    int64_t n      = ddl_box_numel(&p->box);
    for (int64_t i = 0; n > 0 && i < n; i++) {
        double g = ddl_tensor_get(p->grad, i);
        loc[0] += g * g;
        loc[1] += g * sin(1.0 + (double)global_index(p, i));
    }
    MPI_Allreduce(loc, out, 2, MPI_DOUBLE, MPI_SUM, comm);
}

// 1. Central differences of the loss against the gradient, for a few elements of each
// parameter (every rank takes part in every step; the owner perturbs).
static void finite_differences(ddl_model_t *m)
{
    const double h = 1e-6;
    step(m); // the gradients at the unperturbed weights
    int np = ddl_model_nparams(m);
    for (int i = 0; i < np; i++) {
        ddl_param *p     = ddl_model_param(m, i);
        int64_t    total = ddl_shape_numel(&p->global);
        // The gradients of this parameter, before perturbing (a step overwrites them).
        int64_t picks[3] = {0, total / 2, total - 1};
        double  g[3]     = {0, 0, 0}, fd[3];
        int64_t n        = ddl_box_numel(&p->box);
        for (int k = 0; k < 3; k++) {
            for (int64_t e = 0; e < n; e++) {
                if (global_index(p, e) == picks[k]) {
                    g[k] = ddl_tensor_get(p->grad, e);
                }
            }
        }
        MPI_Allreduce(MPI_IN_PLACE, g, 3, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        for (int k = 0; k < 3; k++) {
            int64_t at = -1;
            for (int64_t e = 0; e < n; e++) {
                at = global_index(p, e) == picks[k] ? e : at;
            }
            double v = at >= 0 ? ddl_tensor_get(p->value, at) : 0;
            if (at >= 0) {
                ddl_tensor_set(p->value, at, v + h);
            }
            double lp = step(m);
            if (at >= 0) {
                ddl_tensor_set(p->value, at, v - h);
            }
            double lm = step(m);
            if (at >= 0) {
                ddl_tensor_set(p->value, at, v);
            }
            fd[k] = (lp - lm) / (2 * h);
        }
        step(m); // restore the gradients of the unperturbed weights for the next parameter
        for (int k = 0; k < 3; k++) {
            if (ddl_test_rank == 0) {
                printf("  %-12s [%6lld] grad % .10e  fd % .10e\n", ddl_model_param_name(m, i),
                       (long long)picks[k], g[k], fd[k]);
            }
            ASSERT_NEAR(g[k], fd[k], 1e-6 * (1 + fabs(g[k])));
        }
    }
}

// 2. stem.grad (r0 consumed by c1 and the add) == the split network's stem.grad +
// stemB.grad; every other gradient and the loss are equal.
static void fan_out_sum(ddl_model_t *a, int world)
{
    ddl_model_t *b = make(MPI_COMM_WORLD, world, true);
    for (int i = 0; i < ddl_model_nparams(b); i++) {
        char from[64];
        snprintf(from, sizeof from, "%s", ddl_model_param_name(b, i));
        if (strncmp(from, "stemB.", 6) == 0) {
            memmove(from + 4, from + 5, strlen(from + 5) + 1);
        }
        ASSERT_OK(ddl_tensor_copy(param_named(a, from)->value, ddl_model_param(b, i)->value));
    }
    double la = step(a), lb = step(b);
    ASSERT_NEAR(la, lb, 1e-13 * fabs(la));
    double worst = 0;
    for (int i = 0; i < ddl_model_nparams(a); i++) {
        const char      *name = ddl_model_param_name(a, i);
        const ddl_param *pa   = ddl_model_param(a, i);
        const ddl_param *pb   = param_named(b, name);
        const ddl_param *pb2  = NULL;
        if (strncmp(name, "stem.", 5) == 0) {
            char other[64];
            snprintf(other, sizeof other, "stemB.%s", name + 5);
            pb2 = param_named(b, other);
        }
        for (int64_t e = 0; e < ddl_box_numel(&pa->box); e++) {
            double want = ddl_tensor_get(pb->grad, e) + (pb2 ? ddl_tensor_get(pb2->grad, e) : 0);
            double got  = ddl_tensor_get(pa->grad, e);
            ASSERT_NEAR(got, want, 1e-12 * (1 + fabs(want)));
            if (pb2 != NULL) {
                // Both paths contribute: neither alone is the gradient.
                worst = fmax(worst, fabs(ddl_tensor_get(pb2->grad, e)));
            }
        }
    }
    double any = 0;
    MPI_Allreduce(&worst, &any, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    ASSERT_TRUE(any > 1e-6);
    ddl_model_destroy(&b);
}

int main(int argc, char **argv)
{
    ddl_test_mpi_init(&argc, &argv);
    int world;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (world != 1 && world != 2 && world != 4) {
        return ddl_test_mpi_finalize();
    }
    for (int i = 0; i < B * C_IN * H * W; i++) {
        xs[i] = 2.0 * ddl_rng_uniform(11, 0, (uint64_t)i) - 1.0;
    }
    for (int b = 0; b < B; b++) {
        labels[b] = b % CLASSES;
    }
    ddl_model_t *m = make(MPI_COMM_WORLD, world, false);
    finite_differences(m);
    fan_out_sum(m, world);
    if (world > 1) {
        // 3. Each rank also runs the 1-rank network alone: same loss, same gradients.
        ddl_model_t *one = make(MPI_COMM_SELF, 1, false);
        double       l1 = step(one), ln = step(m);
        ASSERT_NEAR(ln, l1, 1e-12 * fabs(l1));
        for (int i = 0; i < ddl_model_nparams(m); i++) {
            double cn[2], c1[2];
            checksum(ddl_model_param(m, i), MPI_COMM_WORLD, cn);
            checksum(param_named(one, ddl_model_param_name(m, i)), MPI_COMM_SELF, c1);
            ASSERT_NEAR(cn[0], c1[0], 1e-10 * c1[0]);
            ASSERT_NEAR(cn[1], c1[1], 1e-10 * (1 + fabs(c1[1])));
        }
        if (ddl_test_rank == 0) {
            printf("distributed on %d ranks == single rank: loss %.15f vs %.15f\n", world, ln, l1);
        }
        ddl_model_destroy(&one);
    }
    ddl_model_destroy(&m);
    if (ddl_test_rank == 0) {
        printf("test_graph_model: ok on %d ranks\n", world);
    }
    return ddl_test_mpi_finalize();
}
