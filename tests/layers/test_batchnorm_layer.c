// tests/layers/test_batchnorm_layer.c: the distributed batch-norm layer.
//
//  - generic checks (sequential equivalence f64/f32, gradcheck f64) in training and eval
//    mode, affine and not, over DistDL's layouts: batch only, channels only, spatial
//    only, mixed, and partitions with inactive ranks;
//  - two training steps with non-trivial gamma/beta against the sequential layer: y, dx,
//    dgamma, dbeta after each step (gradients accumulating), running statistics, then an
//    eval-mode forward/backward; forward/backward allocate nothing;
//  - with a fused ReLU: the same checks, and the bits of the unfused layer followed by a
//    ReLU layer (training and eval);
//  - the one-round statistics of split ranks on values far from zero, and a variance
//    whose cancellation goes below zero;
//  - PyTorch's running-statistics rule (unbiased variance, momentum and cumulative
//    average) against values worked out by hand on a tiny case;
//  - argument validation.
#include <math.h>
#include <string.h>

#include "ddl/base.h"
#include "ddl/collect.h"
#include "layer_test.h"

typedef struct bn_case {
    const char      *name;
    int              first;      // first world rank of P_x
    int              ndim;
    int              pshape[DDL_MAX_DIMS];
    int64_t          x[DDL_MAX_DIMS];
    double           eps, momentum;
    bool             affine;
    bool             relu; // a ReLU fused on the output (ddl_batchnorm_fuse_relu)
    ddl_partition_t *P, *P_seq;
    ddl_shape        xg;
} bn_case;

static int world_size(void)
{
    int s;
    MPI_Comm_size(MPI_COMM_WORLD, &s);
    return s;
}

static int case_ranks(const bn_case *c)
{
    int n = 1;
    for (int d = 0; d < c->ndim; d++) {
        n *= c->pshape[d];
    }
    return n;
}

static void case_setup(bn_case *c)
{
    int ones[DDL_MAX_DIMS];
    for (int d = 0; d < c->ndim; d++) {
        ones[d] = 1;
    }
    c->P     = ddl_test_partition_range(c->first, c->ndim, c->pshape);
    c->P_seq = ddl_test_partition_range(0, c->ndim, ones);
    c->xg    = ddl_shape_make(c->ndim, c->x);
}

static void case_teardown(bn_case *c)
{
    ddl_partition_destroy(&c->P);
    ddl_partition_destroy(&c->P_seq);
}

static ddl_status build(void *ctx, bool sequential, ddl_dtype dt, ddl_layer_t **out)
{
    bn_case *c = ctx;
    ddl_status st = ddl_batchnorm_create(sequential ? c->P_seq : c->P, dt, &c->xg, c->eps,
                                         c->momentum, c->affine, out);
    if (st == DDL_OK && (st = ddl_batchnorm_fuse_relu(*out, c->relu)) != DDL_OK) {
        ddl_layer_destroy(out);
    }
    return st;
}

// ---- helpers -------------------------------------------------------------------

static ddl_tensor_t *global_random(const ddl_partition_t *P, ddl_dtype dt, const ddl_shape *g,
                                   uint64_t stream)
{
    ddl_box       b = ddl_partition_local_box(P, g);
    ddl_shape     s = ddl_box_shape(&b);
    ddl_tensor_t *t = NULL;
    ASSERT_OK(ddl_tensor_create(dt, &s, &t));
    ddl_fill_global_uniform(t, &b, g, 4242, stream);
    return t;
}

// Gathers a distributed tensor onto rank 0 and returns max|a - ref| / max|ref| there
// (broadcast to every rank). ref is the sequential tensor, valid on rank 0.
static double gather_err(const ddl_tensor_t *local, const ddl_box *box, const ddl_shape *g,
                         const ddl_tensor_t *ref)
{
    ddl_tensor_t *all = NULL;
    if (ddl_test_rank == 0) {
        ASSERT_OK(ddl_tensor_create(local->dtype, g, &all));
    }
    ASSERT_OK(ddl_gather_boxes(MPI_COMM_WORLD, 0, local, box, g, all));
    double e = 0.0;
    if (ddl_test_rank == 0) {
        double num = 0.0, den = 0.0;
        for (int64_t i = 0; i < ddl_tensor_numel(ref); i++) {
            num = fmax(num, fabs(ddl_tensor_get(all, i) - ddl_tensor_get(ref, i)));
            den = fmax(den, fabs(ddl_tensor_get(ref, i)));
        }
        e = den > 0 ? num / den : num;
    }
    ddl_tensor_destroy(&all);
    MPI_Bcast(&e, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    return e;
}

// gamma = 1 + u/2 and beta = u' by global index, the same on every decomposition.
static void set_params(ddl_layer_t *L)
{
    for (int i = 0; i < ddl_layer_nparams(L); i++) {
        ddl_param *p = ddl_layer_param(L, i);
        ddl_fill_global_uniform(p->value, &p->box, &p->global, 99, 300 + (uint64_t)i);
        if (i == 0) {
            for (int64_t k = 0; k < ddl_tensor_numel(p->value); k++) {
                ddl_tensor_set(p->value, k, 1.0 + 0.5 * ddl_tensor_get(p->value, k));
            }
        }
    }
}

// Compares the running statistics of the distributed layer (every P_x rank, its own
// channels) with the sequential layer's (rank 0), which are broadcast to every rank.
static double running_err(ddl_layer_t *Ld, ddl_layer_t *Ls, int64_t C)
{
    double ref[2 * 64] = {0};
    ASSERT_TRUE(C <= 64);
    if (ddl_test_rank == 0) {
        ddl_tensor_t *m, *v;
        ASSERT_OK(ddl_batchnorm_running_stats(Ls, &m, &v));
        for (int64_t c = 0; c < C; c++) {
            ref[c]     = ddl_tensor_get(m, c);
            ref[C + c] = ddl_tensor_get(v, c);
        }
    }
    MPI_Bcast(ref, (int)(2 * C), MPI_DOUBLE, 0, MPI_COMM_WORLD);
    ddl_tensor_t *m, *v;
    ASSERT_OK(ddl_batchnorm_running_stats(Ld, &m, &v));
    ddl_box b   = ddl_partition_local_box(ddl_layer_P_in(Ld), ddl_layer_x_global(Ld));
    double  err = 0.0;
    ASSERT_EQ(ddl_tensor_numel(m), b.stop[1] - b.start[1]);
    for (int64_t c = 0; c < ddl_tensor_numel(m); c++) {
        int64_t g = b.start[1] + c;
        err       = fmax(err, fabs(ddl_tensor_get(m, c) - ref[g]) / fmax(1.0, fabs(ref[g])));
        err = fmax(err, fabs(ddl_tensor_get(v, c) - ref[C + g]) / fmax(1.0, fabs(ref[C + g])));
    }
    double all;
    MPI_Allreduce(&err, &all, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return all;
}

// ---- two training steps, then eval, against the sequential layer -------------------

typedef struct step_io {
    ddl_tensor_t *x, *y, *dy, *dx;
} step_io;

static void io_make(const ddl_layer_t *L, ddl_dtype dt, uint64_t stream, step_io *io)
{
    io->x  = global_random(ddl_layer_P_in(L), dt, ddl_layer_x_global(L), stream);
    io->dy = global_random(ddl_layer_P_out(L), dt, ddl_layer_y_global(L), stream + 1000);
    ASSERT_OK(ddl_tensor_create(dt, ddl_layer_y_shape(L), &io->y));
    ASSERT_OK(ddl_tensor_create(dt, ddl_layer_x_shape(L), &io->dx));
}

static void io_free(step_io *io)
{
    ddl_tensor_destroy(&io->x);
    ddl_tensor_destroy(&io->y);
    ddl_tensor_destroy(&io->dy);
    ddl_tensor_destroy(&io->dx);
}

static void compare_step(const char *what, ddl_layer_t *Ld, ddl_layer_t *Ls, step_io *d,
                         step_io *s, double tol)
{
    ddl_box xb = ddl_partition_local_box(ddl_layer_P_in(Ld), ddl_layer_x_global(Ld));
    double  ey = gather_err(d->y, &xb, ddl_layer_y_global(Ld), s->y);
    double  ex = gather_err(d->dx, &xb, ddl_layer_x_global(Ld), s->dx);
    if (ey > tol || ex > tol) {
        TEST_FAIL_("%s: y error %.3e, dx error %.3e (tol %.1e)", what, ey, ex, tol);
    }
    for (int i = 0; i < ddl_layer_nparams(Ld); i++) {
        ddl_param *p = ddl_layer_param(Ld, i);
        double     e = gather_err(p->grad, &p->box, &p->global, ddl_layer_param(Ls, i)->grad);
        if (e > tol) {
            TEST_FAIL_("%s: d%s error %.3e (tol %.1e)", what, p->name, e, tol);
        }
    }
}

static void run_both(ddl_layer_t *Ld, ddl_layer_t *Ls, step_io *d, step_io *s)
{
    uint64_t before = ddl_alloc_count();
    ASSERT_OK(ddl_layer_forward(Ld, d->x, d->y));
    ASSERT_OK(ddl_layer_backward(Ld, d->dy, d->dx));
    ASSERT_EQ(ddl_alloc_count(), before);  // the step allocates nothing
    ASSERT_OK(ddl_layer_forward(Ls, s->x, s->y));
    ASSERT_OK(ddl_layer_backward(Ls, s->dy, s->dx));
}

static void check_steps(bn_case *c, ddl_dtype dt)
{
    double       tol = dt == DDL_F64 ? 1e-12 : 1e-5;
    ddl_layer_t *Ld = NULL, *Ls = NULL;
    ASSERT_OK(build(c, false, dt, &Ld));
    ASSERT_OK(build(c, true, dt, &Ls));
    ASSERT_EQ(ddl_layer_nparams(Ld), c->affine ? 2 : 0);
    set_params(Ld);
    set_params(Ls);
    char what[160];
    for (int step = 0; step < 2; step++) {
        step_io d, s;
        io_make(Ld, dt, 10 + (uint64_t)step, &d);
        io_make(Ls, dt, 10 + (uint64_t)step, &s);
        run_both(Ld, Ls, &d, &s);
        snprintf(what, sizeof what, "%s (%s) training step %d", c->name, ddl_dtype_name(dt), step);
        compare_step(what, Ld, Ls, &d, &s, tol);
        io_free(&d);
        io_free(&s);
    }
    double er = running_err(Ld, Ls, c->xg.d[1]);
    if (er > tol) {
        TEST_FAIL_("%s (%s): running statistics error %.3e", c->name, ddl_dtype_name(dt), er);
    }
    ddl_layer_set_training(Ld, false);
    ddl_layer_set_training(Ls, false);
    step_io d, s;
    io_make(Ld, dt, 30, &d);
    io_make(Ls, dt, 30, &s);
    run_both(Ld, Ls, &d, &s);
    snprintf(what, sizeof what, "%s (%s) eval", c->name, ddl_dtype_name(dt));
    compare_step(what, Ld, Ls, &d, &s, tol);
    io_free(&d);
    io_free(&s);
    ddl_layer_destroy(&Ld);
    ddl_layer_destroy(&Ls);
}

// ---- fused ReLU: the bits of the batch-norm layer followed by a ReLU layer ------------

static void same_local(const char *what, const ddl_tensor_t *a, const ddl_tensor_t *b)
{
    ASSERT_EQ(ddl_tensor_bytes(a), ddl_tensor_bytes(b));
    if (ddl_tensor_bytes(a) > 0 && memcmp(a->data, b->data, ddl_tensor_bytes(a)) != 0) {
        TEST_FAIL_("%s: the fused layer's bits differ from batch norm + ReLU", what);
    }
}

// Two training steps and an eval step of the fused layer (c->relu) against the unfused
// layer and a ReLU layer on the same partition, fed the same x and dy: y, dx and the
// parameter gradients bit for bit (the same kernels' arithmetic, one pass fewer).
// Backward before any forward is refused on every rank alike, the ranks outside the
// layer's partition as well (the layer's own check holds on its active ranks only).
static void check_backward_first(bn_case *c)
{
    ddl_layer_t *L = NULL;
    ASSERT_OK(build(c, false, DDL_F64, &L));
    step_io io;
    io_make(L, DDL_F64, 90, &io);
    ASSERT_STATUS(ddl_layer_backward(L, io.dy, io.dx), DDL_EINVAL);
    ASSERT_TRUE(strstr(ddl_last_error(), "backward called before any forward") != NULL);
    ASSERT_OK(ddl_layer_forward(L, io.x, io.y));
    ASSERT_OK(ddl_layer_backward(L, io.dy, io.dx));
    io_free(&io);
    ddl_layer_destroy(&L);
}

static void check_fused_bits(bn_case *c, ddl_dtype dt)
{
    ddl_layer_t *F = NULL, *U = NULL, *R = NULL;
    ASSERT_OK(build(c, false, dt, &F));
    bool relu = c->relu;
    c->relu   = false;
    ASSERT_OK(build(c, false, dt, &U));
    c->relu = relu;
    ASSERT_OK(ddl_activation_create(c->P, dt, &c->xg, DDL_ACT_RELU, 0.0, 0, &R));
    set_params(F);
    set_params(U);
    char what[160];
    for (int step = 0; step < 3; step++) {
        bool train = step < 2;
        ddl_layer_set_training(F, train);
        ddl_layer_set_training(U, train);
        step_io f, u;
        io_make(F, dt, 50 + (uint64_t)step, &f);
        io_make(U, dt, 50 + (uint64_t)step, &u);
        ddl_tensor_t *y1 = NULL, *dr = NULL;
        ASSERT_OK(ddl_tensor_create(dt, ddl_layer_y_shape(U), &y1));
        ASSERT_OK(ddl_tensor_create(dt, ddl_layer_y_shape(U), &dr));
        ASSERT_OK(ddl_layer_forward(F, f.x, f.y));
        ASSERT_OK(ddl_layer_backward(F, f.dy, f.dx));
        ASSERT_OK(ddl_layer_forward(U, u.x, y1));
        ASSERT_OK(ddl_layer_forward(R, y1, u.y));
        ASSERT_OK(ddl_layer_backward(R, u.dy, dr));
        ASSERT_OK(ddl_layer_backward(U, dr, u.dx));
        snprintf(what, sizeof what, "%s (%s) fused step %d", c->name, ddl_dtype_name(dt), step);
        same_local(what, f.y, u.y);
        same_local(what, f.dx, u.dx);
        for (int i = 0; i < ddl_layer_nparams(F); i++) {
            same_local(what, ddl_layer_param(F, i)->grad, ddl_layer_param(U, i)->grad);
        }
        ddl_tensor_destroy(&y1);
        ddl_tensor_destroy(&dr);
        io_free(&f);
        io_free(&u);
    }
    // Fusing once the layer has run is refused, and changes nothing.
    ASSERT_STATUS(ddl_batchnorm_fuse_relu(F, false), DDL_EINVAL);
    ASSERT_STATUS(ddl_batchnorm_fuse_relu(R, true), DDL_EINVAL);
    ddl_layer_destroy(&F);
    ddl_layer_destroy(&U);
    ddl_layer_destroy(&R);
}

// ---- PyTorch's running-statistics rule, by hand --------------------------------------
// x [4, 2]: channel 0 = 1, 2, 3, 4 (mean 2.5, biased var 1.25, unbiased 5/3); channel 1 =
// 2, 0, -2, 4 (mean 1, biased var 5, unbiased 20/3). Decomposed over [2, 2] on 4 ranks
// (each rank: 2 samples of 1 channel) or [1, 1] on one.

static double hand_x(int64_t n, int64_t c)
{
    static const double ch1[4] = {2, 0, -2, 4};
    return c == 0 ? (double)(n + 1) : ch1[n];
}

static void hand_fill(ddl_tensor_t *x, const ddl_box *b, double scale)
{
    int64_t k = 0;
    for (int64_t n = b->start[0]; n < b->stop[0]; n++) {
        for (int64_t c = b->start[1]; c < b->stop[1]; c++) {
            ddl_tensor_set(x, k++, scale * hand_x(n, c));
        }
    }
}

static void check_running_by_hand(double momentum, const double want_mean[2],
                                  const double want_var[2])
{
    int              four = world_size() >= 4;
    int              ps[2] = {four ? 2 : 1, four ? 2 : 1};
    ddl_partition_t *P  = ddl_test_partition_range(0, 2, ps);
    ddl_shape        g  = ddl_shape_make(2, (int64_t[]){4, 2});
    ddl_layer_t     *L  = NULL;
    ASSERT_OK(ddl_batchnorm_create(P, DDL_F64, &g, 1e-5, momentum, true, &L));
    ddl_box       b = ddl_partition_local_box(P, &g);
    ddl_tensor_t *x = NULL, *y = NULL, *dy = NULL, *dx = NULL;
    ASSERT_OK(ddl_tensor_create(DDL_F64, ddl_layer_x_shape(L), &x));
    ASSERT_OK(ddl_tensor_create(DDL_F64, ddl_layer_y_shape(L), &y));
    ASSERT_OK(ddl_tensor_create(DDL_F64, ddl_layer_y_shape(L), &dy));
    ASSERT_OK(ddl_tensor_create(DDL_F64, ddl_layer_x_shape(L), &dx));
    for (int step = 0; step < 2; step++) {
        // The cumulative case doubles x in step 2 so the two batches differ.
        hand_fill(x, &b, momentum < 0 && step == 1 ? 2.0 : 1.0);
        ASSERT_OK(ddl_layer_forward(L, x, y));
        if (step == 0) {
            // y = (x - mean) / sqrt(var_biased + eps) with gamma 1, beta 0.
            int64_t k = 0;
            for (int64_t n = b.start[0]; n < b.stop[0]; n++) {
                for (int64_t c = b.start[1]; c < b.stop[1]; c++) {
                    double m = c == 0 ? 2.5 : 1.0, v = c == 0 ? 1.25 : 5.0;
                    ASSERT_NEAR(ddl_tensor_get(y, k), (hand_x(n, c) - m) / sqrt(v + 1e-5), 1e-14);
                    k++;
                }
            }
        }
        ASSERT_OK(ddl_layer_backward(L, dy, dx));
    }
    ddl_tensor_t *rm, *rv;
    ASSERT_OK(ddl_batchnorm_running_stats(L, &rm, &rv));
    for (int64_t c = 0; c < ddl_tensor_numel(rm); c++) {
        int64_t gc = b.start[1] + c;
        ASSERT_NEAR(ddl_tensor_get(rm, c), want_mean[gc], 1e-14);
        ASSERT_NEAR(ddl_tensor_get(rv, c), want_var[gc], 1e-14);
    }
    ddl_tensor_destroy(&x);
    ddl_tensor_destroy(&y);
    ddl_tensor_destroy(&dy);
    ddl_tensor_destroy(&dx);
    ddl_layer_destroy(&L);
    ddl_partition_destroy(&P);
}

static void test_running_by_hand(void)
{
    // momentum 0.1, the same batch twice: r1 = 0.1 * stat (+ 0.9 * 1 for var), then
    // r2 = 0.9 r1 + 0.1 stat. Biased (DistDL) variance would give var 1.0025 / 1.2925.
    const double m01[2] = {0.475, 0.19};
    const double v01[2] = {0.9 * (0.9 + 0.1 * 5.0 / 3.0) + 0.1 * 5.0 / 3.0,
                           0.9 * (0.9 + 0.1 * 20.0 / 3.0) + 0.1 * 20.0 / 3.0};
    ASSERT_NEAR(v01[0], 1.1266666666666667, 1e-15);
    ASSERT_NEAR(v01[1], 2.0766666666666667, 1e-15);
    check_running_by_hand(0.1, m01, v01);
    // Cumulative average (momentum=None): batches x and 2x, means (2.5, 1) and (5, 2),
    // unbiased variances (5/3, 20/3) and (20/3, 80/3): averages of the two.
    const double mc[2] = {3.75, 1.5};
    const double vc[2] = {25.0 / 6.0, 50.0 / 3.0};
    check_running_by_hand(-1.0, mc, vc);
    if (ddl_test_rank == 0) {
        printf("ok running statistics by hand\n");
    }
}

// ---- the one-round statistics of split ranks, far from zero ---------------------------
// x [12, 1] split by the batch over every rank (3 samples each on 4), against the
// sequential layer, which holds every value and takes the two passes over the global
// mean. Split ranks send their sums of squares about the last training mean K (0 at
// first): step 0's values lie 1000 std 3.5 (mean^2 / var 8e4), step 1's 1000 std 3.5e-4
// (8e12), where without the shift var would keep about 3 of its digits. eps 0, so y shows
// var's error. Then values 131.99 + 1e-9 rank, where the first step's cancellation takes
// var below 0 on 4 ranks: var is clamped at 0 (y finite, running var at least 0.9).

static double offset_x(int step, int64_t n)
{
    double u = (double)n - 5.5; // sums to 0, exactly
    return step < 2 ? 1000.0 + (step == 0 ? 1.0 : 1e-4) * u : 131.99 + 1e-9 * (double)(n / 3);
}

static void offset_fill(ddl_tensor_t *x, const ddl_box *b, int step)
{
    for (int64_t n = b->start[0], k = 0; n < b->stop[0]; n++, k++) {
        ddl_tensor_set(x, k, offset_x(step, n));
    }
}

static void test_offset_statistics(void)
{
    int              ws = world_size(), one[2] = {1, 1}, split[2] = {ws >= 4 ? 4 : 1, 1};
    ddl_partition_t *P = ddl_test_partition_range(0, 2, split);
    ddl_partition_t *S = ddl_test_partition_range(0, 2, one);
    ddl_shape        g = ddl_shape_make(2, (int64_t[]){12, 1});
    for (int layer = 0; layer < 2; layer++) {
        double       eps = layer == 0 ? 0.0 : 1e-12;
        ddl_layer_t *Ld = NULL, *Ls = NULL;
        ASSERT_OK(ddl_batchnorm_create(P, DDL_F64, &g, eps, 0.1, false, &Ld));
        ASSERT_OK(ddl_batchnorm_create(S, DDL_F64, &g, eps, 0.1, false, &Ls));
        step_io d, s;
        io_make(Ld, DDL_F64, 50, &d);
        io_make(Ls, DDL_F64, 50, &s);
        ddl_box db = ddl_partition_local_box(P, &g), sb = ddl_partition_local_box(S, &g);
        for (int step = layer == 0 ? 0 : 2; step < (layer == 0 ? 2 : 3); step++) {
            offset_fill(d.x, &db, step);
            offset_fill(s.x, &sb, step);
            run_both(Ld, Ls, &d, &s);
            if (layer == 0) {
                double e = gather_err(d.y, &db, &g, s.y);
                if (e > 1e-9) {
                    TEST_FAIL_("offset statistics, step %d: y error %.3e (tol 1e-9)", step, e);
                }
                continue;
            }
            for (int64_t k = 0; k < ddl_tensor_numel(d.y); k++) {
                ASSERT_TRUE(isfinite(ddl_tensor_get(d.y, k)));
            }
            ddl_tensor_t *rm, *rv;
            ASSERT_OK(ddl_batchnorm_running_stats(Ld, &rm, &rv));
            ASSERT_TRUE(ddl_tensor_numel(rv) == 0 || ddl_tensor_get(rv, 0) >= (1.0 - 0.1) * 1.0);
        }
        io_free(&d);
        io_free(&s);
        ddl_layer_destroy(&Ld);
        ddl_layer_destroy(&Ls);
    }
    ddl_partition_destroy(&P);
    ddl_partition_destroy(&S);
    if (ddl_test_rank == 0) {
        printf("ok statistics of split ranks far from zero\n");
    }
}

// ---- validation ----------------------------------------------------------------------

static void test_validation(void)
{
    int              one[3] = {1, 1, 1};
    ddl_partition_t *P      = ddl_test_partition_range(0, 3, one);
    ddl_shape        g      = ddl_shape_make(3, (int64_t[]){4, 3, 5});
    ddl_layer_t     *L      = NULL;
    ASSERT_STATUS(ddl_batchnorm_create(P, DDL_F64, &g, -1e-5, 0.1, true, &L), DDL_EINVAL);
    ASSERT_STATUS(ddl_batchnorm_create(P, DDL_F64, &g, NAN, 0.1, true, &L), DDL_EINVAL);
    ASSERT_STATUS(ddl_batchnorm_create(P, DDL_F64, &g, 1e-5, 1.5, true, &L), DDL_EINVAL);
    ASSERT_STATUS(ddl_batchnorm_create(P, (ddl_dtype)7, &g, 1e-5, 0.1, true, &L), DDL_EINVAL);
    ddl_shape g2 = ddl_shape_make(2, (int64_t[]){4, 3});
    ASSERT_STATUS(ddl_batchnorm_create(P, DDL_F64, &g2, 1e-5, 0.1, true, &L), DDL_EINVAL);
    ddl_shape g0 = ddl_shape_make(3, (int64_t[]){4, 0, 5});
    ASSERT_STATUS(ddl_batchnorm_create(P, DDL_F64, &g0, 1e-5, 0.1, true, &L), DDL_EINVAL);
    ASSERT_TRUE(L == NULL);
    ASSERT_TRUE(strstr(ddl_last_error(), "num_features") != NULL);
    // One value per channel: training refuses on every rank, eval works.
    ddl_shape g1 = ddl_shape_make(3, (int64_t[]){1, 3, 1});
    ASSERT_OK(ddl_batchnorm_create(P, DDL_F64, &g1, 1e-5, 0.1, true, &L));
    ddl_tensor_t *x = NULL, *y = NULL;
    ASSERT_OK(ddl_tensor_create(DDL_F64, ddl_layer_x_shape(L), &x));
    ASSERT_OK(ddl_tensor_create(DDL_F64, ddl_layer_y_shape(L), &y));
    ASSERT_STATUS(ddl_layer_forward(L, x, y), DDL_EINVAL);
    ddl_layer_set_training(L, false);
    ASSERT_OK(ddl_layer_forward(L, x, y));
    ddl_tensor_destroy(&x);
    ddl_tensor_destroy(&y);
    // The running-stats accessor refuses other layers.
    ddl_layer_t *U = NULL;
    ASSERT_OK(ddl_upsample_create(P, DDL_F64, &g, DDL_UPSAMPLE_NEAREST, false,
                                  (double[]){2.0}, NULL, &U));
    ddl_tensor_t *m = NULL;
    ASSERT_STATUS(ddl_batchnorm_running_stats(U, &m, NULL), DDL_EINVAL);
    ddl_layer_destroy(&U);
    ddl_layer_destroy(&L);
    ddl_partition_destroy(&P);
    if (ddl_test_rank == 0) {
        printf("ok validation\n");
    }
}

// ---- layouts ---------------------------------------------------------------------------

#define CASE(nm, fr, nd, ps, xs, ep, mo, af)                                                   \
    {                                                                                         \
        .name = nm, .first = fr, .ndim = nd, .pshape = ps, .x = xs, .eps = ep, .momentum = mo, \
        .affine = af                                                                          \
    }
// The same with a ReLU fused on the output.
#define RELU_CASE(nm, fr, nd, ps, xs, ep, mo, af)                                                  \
    {                                                                                              \
        .name = nm, .first = fr, .ndim = nd, .pshape = ps, .x = xs, .eps = ep, .momentum = mo,     \
        .affine = af, .relu = true                                                                 \
    }
#define A(...) {__VA_ARGS__}

static bn_case cases[] = {
    // One rank (also the np1 run).
    CASE("single-1d", 0, 2, A(1, 1), A(6, 5), 1e-5, 0.1, true),
    CASE("single-2d", 0, 4, A(1, 1, 1, 1), A(3, 4, 3, 5), 1e-5, 0.1, true),
    // DistDL's layouts on 4 ranks.
    CASE("batch", 0, 3, A(4, 1, 1), A(9, 3, 5), 1e-5, 0.1, true),
    CASE("channels", 0, 3, A(1, 4, 1), A(4, 4, 10), 1e-3, 0.01, true),
    CASE("channels-uneven", 0, 3, A(1, 4, 1), A(3, 6, 4), 1e-5, 0.1, true),
    CASE("spatial", 0, 3, A(1, 1, 4), A(3, 3, 10), 1e-5, 0.1, true),
    CASE("spatial-2d", 0, 4, A(1, 1, 2, 2), A(2, 3, 5, 6), 1e-5, 0.1, true),
    CASE("batch-spatial", 0, 3, A(2, 1, 2), A(4, 3, 10), 1e-5, 0.1, true),
    CASE("channel-spatial", 0, 3, A(1, 2, 2), A(7, 13, 11), 1e-5, 0.01, true),
    CASE("batch-channel-1d", 0, 2, A(2, 2), A(7, 13), 1e-5, 0.1, true),
    CASE("mixed-2d", 0, 4, A(2, 2, 1, 1), A(3, 5, 2, 3), 1e-5, -1.0, true),
    CASE("no-affine", 0, 3, A(1, 2, 2), A(7, 13, 11), 1e-5, 0.1, false),
    CASE("no-affine-cumulative", 0, 3, A(2, 2, 1), A(5, 4, 3), 1e-5, -1.0, false),
    // Partitions with inactive ranks (rank 0 outside P_x; rank 3 outside).
    CASE("inactive-rank0", 1, 3, A(1, 3, 1), A(4, 5, 3), 1e-5, 0.1, true),
    CASE("inactive-rank3", 0, 3, A(3, 1, 1), A(7, 2, 3), 1e-5, 0.1, true),
    // A fused ReLU (ResNet's and VGG's batch norm + ReLU).
    RELU_CASE("relu-single-2d", 0, 4, A(1, 1, 1, 1), A(3, 4, 3, 5), 1e-5, 0.1, true),
    RELU_CASE("relu-spatial-2d", 0, 4, A(1, 1, 2, 2), A(2, 3, 5, 6), 1e-5, 0.1, true),
    RELU_CASE("relu-channel-spatial", 0, 3, A(1, 2, 2), A(7, 13, 11), 1e-5, 0.01, true),
    RELU_CASE("relu-no-affine", 0, 3, A(2, 2, 1), A(5, 4, 3), 1e-5, 0.1, false),
    RELU_CASE("relu-inactive-rank0", 1, 3, A(1, 3, 1), A(4, 5, 3), 1e-5, 0.1, true),
};

int main(int argc, char **argv)
{
    ddl_test_mpi_init(&argc, &argv);
    int64_t live = ddl_alloc_bytes_live();
    test_validation();
    test_running_by_hand();
    test_offset_statistics();
    int ws = world_size();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bn_case *c = &cases[i];
        if (c->first + case_ranks(c) > ws) {
            continue;
        }
        case_setup(c);
        char name[128];
        for (int mode = 0; mode < 2; mode++) {
            ddl_layer_builder b = {.build = build, .ctx = c, .seed = 7, .training = mode == 0};
            snprintf(name, sizeof name, "%s %s", c->name, mode == 0 ? "train" : "eval");
            layer_test_run(name, &b, false, true);
        }
        check_steps(c, DDL_F64);
        check_steps(c, DDL_F32);
        check_backward_first(c);
        if (c->relu) {
            check_fused_bits(c, DDL_F64);
            check_fused_bits(c, DDL_F32);
        }
        if (ddl_test_rank == 0) {
            printf("ok %s steps\n", c->name);
        }
        case_teardown(c);
    }
    ASSERT_EQ(ddl_alloc_bytes_live(), live);  // every layer and partition freed everything
    return ddl_test_mpi_finalize();
}
