// Distributed loss tests. For every elementwise kind x valid reduction and for
// cross-entropy (classes split over P_x dimension 1, rows over dimension 0; and on N-d
// input [N, C, spatial...] split over the batch and spatial dims, one label per voxel),
// on 1, 2 and 4 ranks, including a P_x that leaves ranks idle and does not contain world
// rank 0:
//  - the value (on P_x rank 0), the elementwise losses (reduction none) and dx equal
//    the sequential kernels applied on one rank to the global tensors (1e-12 in f64,
//    1e-5 in f32); the upstream gradient is read on P_x rank 0 only;
//  - central finite differences of the distributed loss match dx (f64);
//  - ranks outside P_x get value 0 and a zero-volume gradient;
//  - labels out of range are refused with EINVAL on every rank of P_x; BCE input
//    outside [0, 1] fails on the offending rank and on P_x rank 0 without hanging;
//  - forward and backward allocate nothing; bad configurations are refused.
#include <string.h>

#include "ddl/base.h"
#include "ddl/collect.h"
#include "ddl/layers.h"
#include "mpi_test.h"

static int world;

enum { S_X = 1, S_T = 2, S_DEL = 3, LABEL_STREAM = 77 };
static const uint64_t SEED = 2024;

static const char *kind_names[] = {"mse",     "l1",          "bce",          "bce_with_logits",
                                   "kl_div",  "poisson_nll", "kl_div_log_target",
                                   "cross_entropy"};
static const char *red_names[]  = {"none", "sum", "mean", "batchmean"};

// Uniform [-1, 1) values mapped into each loss's domain.
static double map_x(ddl_loss_kind k, double u)
{
    return k == DDL_LOSS_BCE ? 0.05 + 0.45 * (u + 1.0) : u;
}

static double map_t(ddl_loss_kind k, double u)
{
    switch (k) {
    case DDL_LOSS_BCE:
    case DDL_LOSS_BCE_WITH_LOGITS:
        return 0.5 * (u + 1.0);
    case DDL_LOSS_KL_DIV:
        return 0.01 + 0.5 * (u + 1.0);
    case DDL_LOSS_POISSON_NLL:
        return 2.0 * (u + 1.0);
    default:
        return u;
    }
}

// A partition-invariant random piece (box of global g), mapped by fn.
static ddl_tensor_t *piece(ddl_dtype dt, const ddl_box *box, const ddl_shape *g, uint64_t stream,
                           ddl_loss_kind k, double (*fn)(ddl_loss_kind, double))
{
    ddl_tensor_t *t = NULL;
    ddl_shape     s = ddl_box_shape(box);
    ASSERT_OK(ddl_tensor_create(dt, &s, &t));
    ddl_fill_global_uniform(t, box, g, SEED, stream);
    for (int64_t i = 0; fn != NULL && i < ddl_tensor_numel(t); i++) {
        ddl_tensor_set(t, i, fn(k, ddl_tensor_get(t, i)));
    }
    return t;
}

// The label of a row, or on N-d input of a voxel (its flat index in [N, spatial...]).
static int64_t label_of(int64_t row, int64_t C)
{
    return (int64_t)(ddl_rng_u64(SEED, LABEL_STREAM, (uint64_t)row) % (uint64_t)C);
}

// x's global shape or box without dimension 1 (the classes): the labels' layout.
static ddl_shape drop_classes(const ddl_shape *g)
{
    ddl_shape s = {.ndim = g->ndim - 1};
    s.d[0]      = g->d[0];
    for (int d = 2; d < g->ndim; d++) {
        s.d[d - 1] = g->d[d];
    }
    return s;
}

static ddl_box drop_classes_box(const ddl_box *b)
{
    ddl_box r = {.ndim = b->ndim - 1};
    r.start[0] = b->start[0];
    r.stop[0]  = b->stop[0];
    for (int d = 2; d < b->ndim; d++) {
        r.start[d - 1] = b->start[d];
        r.stop[d - 1]  = b->stop[d];
    }
    return r;
}

// Labels of the voxels of box `lb` of the label shape `lg`, drawn by global flat index.
static int64_t *nd_labels(const ddl_box *lb, const ddl_shape *lg, int64_t C)
{
    ddl_shape ls = ddl_box_shape(lb);
    int64_t   n  = ddl_shape_numel(&ls);
    int64_t  *l  = ddl_malloc(sizeof(int64_t) * (size_t)(n + 1));
    for (int64_t i = 0; i < n; i++) {
        int64_t rem = i, flat = 0, mul = 1, c[DDL_MAX_DIMS];
        for (int d = ls.ndim - 1; d >= 0; d--) {
            c[d] = rem % ls.d[d];
            rem /= ls.d[d];
        }
        for (int d = ls.ndim - 1; d >= 0; d--) {
            flat += (lb->start[d] + c[d]) * mul;
            mul *= lg->d[d];
        }
        l[i] = label_of(flat, C);
    }
    return l;
}

// Gathers a piece to world rank 0 (NULL elsewhere).
static ddl_tensor_t *gather(const ddl_tensor_t *local, const ddl_box *box, const ddl_shape *g)
{
    ddl_tensor_t *out = NULL;
    if (ddl_test_rank == 0) {
        ASSERT_OK(ddl_tensor_create(local->dtype, g, &out));
    }
    ASSERT_OK(ddl_gather_boxes(MPI_COMM_WORLD, 0, local, box, g, out));
    return out;
}

// max |a - b| / max(max |b|, 1e-300), on rank 0.
static double rel_err(const ddl_tensor_t *a, const ddl_tensor_t *b)
{
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < ddl_tensor_numel(b); i++) {
        num = fmax(num, fabs(ddl_tensor_get(a, i) - ddl_tensor_get(b, i)));
        den = fmax(den, fabs(ddl_tensor_get(b, i)));
    }
    return num / fmax(den, 1e-300);
}

static double allsum(double v)
{
    double g;
    MPI_Allreduce(&v, &g, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return g;
}

// ---- one case ------------------------------------------------------------------------

typedef struct loss_case {
    const ddl_partition_t *P;
    const char            *pname;
    ddl_shape              g;
    ddl_loss_kind          kind;
    ddl_reduction          red;
} loss_case;

// Everything one evaluation needs on this rank.
typedef struct eval {
    ddl_loss_t   *l;
    ddl_box       xbox, elbox;
    ddl_shape     el_global;
    ddl_tensor_t *x, *t, *dx, *el, *del;
    int64_t      *labels;
    double        value;
} eval;

static void eval_setup(const loss_case *c, ddl_dtype dt, eval *e)
{
    memset(e, 0, sizeof *e);
    bool ce = c->kind == DDL_LOSS_CROSS_ENTROPY;
    ASSERT_OK(ddl_loss_create(c->P, dt, &c->g, c->kind, c->red, &e->l));
    e->xbox      = ddl_partition_local_box(c->P, &c->g);
    ddl_shape xs = ddl_loss_x_shape(e->l);
    ddl_shape bs = ddl_box_shape(&e->xbox);
    ASSERT_TRUE(ddl_shape_equal(&xs, &bs));
    e->x = piece(dt, &e->xbox, &c->g, S_X, c->kind, map_x);
    ASSERT_OK(ddl_tensor_create(dt, &xs, &e->dx));
    if (ce && c->g.ndim > 2) {
        // N-d: one label per voxel; elementwise losses on every rank, boxed like x
        // without the classes.
        e->el_global = drop_classes(&c->g);
        e->elbox     = drop_classes_box(&e->xbox);
        e->labels    = nd_labels(&e->elbox, &e->el_global, c->g.d[1]);
    } else if (ce) {
        int64_t rows = xs.d[0];
        e->labels    = ddl_malloc(sizeof(int64_t) * (size_t)(rows + 1));
        for (int64_t i = 0; i < rows; i++) {
            e->labels[i] = label_of(e->xbox.start[0] + i, c->g.d[1]);
        }
        e->el_global    = ddl_shape_make(1, (int64_t[]){c->g.d[0]});
        e->elbox        = (ddl_box){.ndim = 1};
        const int *idx  = ddl_partition_index(c->P);
        if (idx != NULL && idx[1] == 0) {
            e->elbox.start[0] = e->xbox.start[0];
            e->elbox.stop[0]  = e->xbox.stop[0];
        }
    } else {
        e->t         = piece(dt, &e->xbox, &c->g, S_T, c->kind, map_t);
        e->el_global = c->g;
        e->elbox     = e->xbox;
    }
    ddl_shape es = ddl_box_shape(&e->elbox);
    ASSERT_OK(ddl_tensor_create(dt, &es, &e->el));
    e->del = piece(dt, &e->elbox, &e->el_global, S_DEL, c->kind, NULL);
}

static ddl_status eval_forward(const loss_case *c, eval *e)
{
    return ddl_loss_forward(e->l, e->x, e->t, e->labels, &e->value,
                            c->red == DDL_REDUCTION_NONE ? e->el : NULL);
}

static void eval_free(eval *e)
{
    ddl_loss_destroy(&e->l);
    ddl_tensor_destroy(&e->x);
    ddl_tensor_destroy(&e->t);
    ddl_tensor_destroy(&e->dx);
    ddl_tensor_destroy(&e->el);
    ddl_tensor_destroy(&e->del);
    ddl_free(e->labels);
}

// The sequential reference on rank 0: the value, the elementwise losses and dx (for
// upstream gradient dvalue, or del for reduction none).
static void reference(const loss_case *c, ddl_dtype dt, const eval *e, double dvalue,
                      double *value, ddl_tensor_t **el, ddl_tensor_t **dx)
{
    bool    ce = c->kind == DDL_LOSS_CROSS_ENTROPY;
    ddl_box gb = ddl_box_full(&c->g), eb = ddl_box_full(&e->el_global);
    ddl_tensor_t *x = piece(dt, &gb, &c->g, S_X, c->kind, map_x);
    ddl_tensor_t *del = piece(dt, &eb, &e->el_global, S_DEL, c->kind, NULL);
    ASSERT_OK(ddl_tensor_create(dt, &e->el_global, el));
    ASSERT_OK(ddl_tensor_create(dt, &c->g, dx));
    bool    none = c->red == DDL_REDUCTION_NONE;
    int64_t n = ddl_shape_numel(&c->g), N = c->g.d[0];
    int64_t V    = ce ? n / N / c->g.d[1] : 1;  // voxels per sample (1 for [N, C])
    double  norm = c->red == DDL_REDUCTION_MEAN ? (ce ? (double)(N * V) : (double)n)
                   : c->red == DDL_REDUCTION_BATCHMEAN ? (double)N
                                                       : 1.0;
    double  sum = 0.0;
    if (ce && c->g.ndim > 2) {
        int64_t *labels = nd_labels(&eb, &e->el_global, c->g.d[1]);
        ASSERT_OK(ddl_cross_entropy_nd_forward(dt, (*el)->data, &sum, x->data, labels, N,
                                               c->g.d[1], V));
        ASSERT_OK(ddl_cross_entropy_nd_backward(dt, (*dx)->data, none ? del->data : NULL,
                                                none ? 1.0 : dvalue / norm, x->data, labels, N,
                                                c->g.d[1], V));
        ddl_free(labels);
    } else if (ce) {
        int64_t C       = c->g.d[1];
        int64_t *labels = ddl_malloc(sizeof(int64_t) * (size_t)N);
        for (int64_t i = 0; i < N; i++) {
            labels[i] = label_of(i, C);
        }
        ASSERT_OK(ddl_cross_entropy_forward(dt, (*el)->data, &sum, x->data, labels, N, C));
        ASSERT_OK(ddl_cross_entropy_backward(dt, (*dx)->data, none ? del->data : NULL,
                                             none ? 1.0 : dvalue / norm, x->data, labels, N, C));
        ddl_free(labels);
    } else {
        ddl_tensor_t *t = piece(dt, &gb, &c->g, S_T, c->kind, map_t);
        ASSERT_OK(ddl_eloss_forward(c->kind, dt, (*el)->data, &sum, x->data, t->data, n));
        ASSERT_OK(ddl_eloss_backward(c->kind, dt, (*dx)->data, none ? del->data : NULL,
                                     none ? 1.0 : dvalue / norm, x->data, t->data, n));
        ddl_tensor_destroy(&t);
    }
    *value = sum / norm;
    ddl_tensor_destroy(&x);
    ddl_tensor_destroy(&del);
}

static void check_case(const loss_case *c, ddl_dtype dt)
{
    const double dvalue = 0.7;
    double       tol    = dt == DDL_F64 ? 1e-12 : 1e-5;
    bool         none   = c->red == DDL_REDUCTION_NONE;
    eval         e;
    eval_setup(c, dt, &e);
    bool holder = ddl_partition_rank(c->P) == 0;
    // The upstream gradient counts on P_x rank 0 only: others pass garbage.
    double dv = holder ? dvalue : 123.0;
    ASSERT_OK(eval_forward(c, &e));
    ASSERT_OK(ddl_loss_backward(e.l, dv, e.del, e.dx));
    // Steady state: a second step allocates nothing and gives the same result.
    uint64_t before = ddl_alloc_count();
    ASSERT_OK(eval_forward(c, &e));
    ASSERT_OK(ddl_loss_backward(e.l, dv, e.del, e.dx));
    ASSERT_EQ(ddl_alloc_count(), before);
    if (!holder) {
        ASSERT_TRUE(e.value == 0.0);
    }
    if (!ddl_partition_active(c->P)) {
        ASSERT_EQ(ddl_tensor_numel(e.dx), 0);
    }
    double        value = allsum(e.value);
    ddl_tensor_t *gdx   = gather(e.dx, &e.xbox, &c->g);
    ddl_tensor_t *gel   = none ? gather(e.el, &e.elbox, &e.el_global) : NULL;
    if (ddl_test_rank == 0) {
        double        rv;
        ddl_tensor_t *rel, *rdx;
        reference(c, dt, &e, dvalue, &rv, &rel, &rdx);
        double err = rel_err(gdx, rdx);
        if (none) {
            err = fmax(err, rel_err(gel, rel));
        } else {
            err = fmax(err, fabs(value - rv) / fmax(fabs(rv), 1e-300));
        }
        if (!(err <= tol)) {
            TEST_FAIL_("%s/%s on %s (%s): error %.3e against the sequential kernels",
                       kind_names[c->kind], red_names[c->red], c->pname, ddl_dtype_name(dt), err);
        }
        ddl_tensor_destroy(&rel);
        ddl_tensor_destroy(&rdx);
    }
    ddl_tensor_destroy(&gdx);
    ddl_tensor_destroy(&gel);
    eval_free(&e);
}

// Central differences of the distributed loss (the value, or <elementwise, del>).
static double objective(const loss_case *c, eval *e)
{
    ASSERT_OK(eval_forward(c, e));
    if (c->red == DDL_REDUCTION_NONE) {
        return allsum(ddl_tensor_dot(e->el, e->del));
    }
    return allsum(e->value);
}

static void gradcheck_case(const loss_case *c)
{
    eval e;
    eval_setup(c, DDL_F64, &e);
    ASSERT_OK(eval_forward(c, &e));
    ASSERT_OK(ddl_loss_backward(e.l, 1.0, e.del, e.dx));
    int64_t n   = ddl_shape_numel(&c->g);
    double  err = 0.0;
    for (int k = 0; k < 6; k++) {
        int64_t gi = (int64_t)(ddl_rng_u64(SEED, 5, (uint64_t)k) % (uint64_t)n);
        // Local offset of gi in this rank's box, -1 when not here.
        int64_t rem = gi, coord[DDL_MAX_DIMS], off = 0;
        for (int d = c->g.ndim - 1; d >= 0; d--) {
            coord[d] = rem % c->g.d[d];
            rem /= c->g.d[d];
        }
        for (int d = 0; d < c->g.ndim && off >= 0; d++) {
            if (coord[d] < e.xbox.start[d] || coord[d] >= e.xbox.stop[d]) {
                off = -1;
            } else {
                off = off * (e.xbox.stop[d] - e.xbox.start[d]) + coord[d] - e.xbox.start[d];
            }
        }
        double keep = off >= 0 ? ddl_tensor_get(e.x, off) : 0.0, h = 1e-6;
        double ana  = allsum(off >= 0 ? ddl_tensor_get(e.dx, off) : 0.0);
        if (off >= 0) {
            ddl_tensor_set(e.x, off, keep + h);
        }
        double fp = objective(c, &e);
        if (off >= 0) {
            ddl_tensor_set(e.x, off, keep - h);
        }
        double fm = objective(c, &e);
        if (off >= 0) {
            ddl_tensor_set(e.x, off, keep);
        }
        double num = (fp - fm) / (2 * h);
        err        = fmax(err, fabs(num - ana) / fmax(1.0, fmax(fabs(num), fabs(ana))));
    }
    if (!(err <= 1e-6)) {
        TEST_FAIL_("%s/%s on %s: gradcheck error %.3e", kind_names[c->kind], red_names[c->red],
                   c->pname, err);
    }
    eval_free(&e);
}

static void run_all_kinds(const ddl_partition_t *P, const char *pname, ddl_shape g)
{
    for (int k = DDL_LOSS_MSE; k <= DDL_LOSS_KL_DIV_LOG_TARGET; k++) {
        bool kl = k == DDL_LOSS_KL_DIV || k == DDL_LOSS_KL_DIV_LOG_TARGET;
        for (int r = DDL_REDUCTION_NONE; r <= (kl ? DDL_REDUCTION_BATCHMEAN : DDL_REDUCTION_MEAN);
             r++) {
            loss_case c = {.P = P, .pname = pname, .g = g, .kind = (ddl_loss_kind)k,
                           .red = (ddl_reduction)r};
            check_case(&c, DDL_F64);
            check_case(&c, DDL_F32);
            gradcheck_case(&c);
        }
    }
    if (ddl_test_rank == 0) {
        printf("ok elementwise losses on %s\n", pname);
    }
}

static void run_cross_entropy(const ddl_partition_t *P, const char *pname, ddl_shape g)
{
    for (int r = DDL_REDUCTION_NONE; r <= DDL_REDUCTION_MEAN; r++) {
        loss_case c = {.P = P, .pname = pname, .g = g, .kind = DDL_LOSS_CROSS_ENTROPY,
                       .red = (ddl_reduction)r};
        check_case(&c, DDL_F64);
        check_case(&c, DDL_F32);
        gradcheck_case(&c);
    }
    if (ddl_test_rank == 0) {
        char sb[96];
        printf("ok cross-entropy on %s, x %s\n", pname, ddl_shape_str(&g, sb, sizeof sb));
    }
}

// ---- errors on data ---------------------------------------------------------------

// A label out of range on one rank: every rank (inside P_x or not) refuses with the
// same message naming the label and its batch index, before any collective, so nobody
// hangs in a later world collective (issue 7: a test-set label of 200 hung the job).
static void bad_labels(const ddl_partition_t *P, ddl_shape g, int bad_rank, int64_t bad_value)
{
    bool nd = g.ndim > 2;
    char want[64];
    snprintf(want, sizeof want, "label %lld at batch index ", (long long)bad_value);
    for (int r = DDL_REDUCTION_NONE; r <= DDL_REDUCTION_MEAN; r++) {
        loss_case c = {.P = P, .g = g, .kind = DDL_LOSS_CROSS_ENTROPY, .red = (ddl_reduction)r};
        eval      e;
        eval_setup(&c, DDL_F64, &e);
        bool here = ddl_tensor_numel(e.x) > 0;  // N-d: this rank holds labels
        if (ddl_test_rank == bad_rank && (nd ? here : ddl_loss_x_shape(e.l).d[0] > 0)) {
            e.labels[0] = bad_value;
        }
        ddl_status st = eval_forward(&c, &e);
        ASSERT_EQ(st, DDL_EINVAL);
        if (strstr(ddl_last_error(), want) == NULL) {
            TEST_FAIL_("message '%s' does not name the label ('%s...')", ddl_last_error(), want);
        }
        // A world collective right after: every rank must have left the loss.
        MPI_Barrier(MPI_COMM_WORLD);
        // The loss remains usable after a refusal.
        if (ddl_test_rank == bad_rank && (nd ? here : ddl_loss_x_shape(e.l).d[0] > 0)) {
            e.labels[0] = 0;
        }
        ASSERT_OK(eval_forward(&c, &e));
        ASSERT_OK(ddl_loss_backward(e.l, 1.0, e.del, e.dx));
        eval_free(&e);
    }
}

// A wrongly shaped x or dx on one rank only: every rank fails alike (ESHAPE) instead of
// the others blocking in the loss's collectives.
static void bad_shape_one_rank(const ddl_partition_t *P, ddl_shape g, int bad_rank)
{
    loss_case c = {.P = P, .g = g, .kind = DDL_LOSS_CROSS_ENTROPY, .red = DDL_REDUCTION_MEAN};
    eval      e;
    eval_setup(&c, DDL_F64, &e);
    ddl_tensor_t *wrong = NULL;
    ASSERT_OK(ddl_tensor_create(DDL_F64, &(ddl_shape){.ndim = 2, .d = {1, 1}}, &wrong));
    ddl_tensor_t *x = ddl_test_rank == bad_rank ? wrong : e.x;
    ASSERT_STATUS(ddl_loss_forward(e.l, x, NULL, e.labels, &e.value, NULL), DDL_ESHAPE);
    ASSERT_OK(eval_forward(&c, &e));
    ddl_tensor_t *dx = ddl_test_rank == bad_rank ? wrong : e.dx;
    ASSERT_STATUS(ddl_loss_backward(e.l, 1.0, NULL, dx), DDL_ESHAPE);
    ASSERT_OK(ddl_loss_backward(e.l, 1.0, NULL, e.dx));
    ddl_tensor_destroy(&wrong);
    eval_free(&e);
}

// BCE input outside [0, 1] on one rank: every rank fails with its message (no hang).
static void bad_bce(const ddl_partition_t *P, ddl_shape g, int bad_rank)
{
    for (int r = DDL_REDUCTION_NONE; r <= DDL_REDUCTION_MEAN; r++) {
        loss_case c = {.P = P, .g = g, .kind = DDL_LOSS_BCE, .red = (ddl_reduction)r};
        eval      e;
        eval_setup(&c, DDL_F64, &e);
        bool bad = ddl_test_rank == bad_rank && ddl_tensor_numel(e.x) > 0;
        if (bad) {
            ddl_tensor_set(e.x, 0, 1.5);
        }
        ASSERT_STATUS(eval_forward(&c, &e), DDL_EINVAL);
        MPI_Barrier(MPI_COMM_WORLD);
        eval_free(&e);
    }
}

// ---- configuration refusals -------------------------------------------------------

static void refusals(const ddl_partition_t *P2, const ddl_partition_t *P3)
{
    ddl_loss_t *l  = NULL;
    ddl_shape   g2 = ddl_shape_make(2, (int64_t[]){4, 5});
    ddl_shape   g3 = ddl_shape_make(3, (int64_t[]){4, 5, 2});
    ASSERT_STATUS(ddl_loss_create(P2, DDL_F64, &g2, DDL_LOSS_MSE, DDL_REDUCTION_BATCHMEAN, &l),
                  DDL_EINVAL);
    ASSERT_STATUS(ddl_loss_create(P2, DDL_F64, &g2, DDL_LOSS_CROSS_ENTROPY,
                                  DDL_REDUCTION_BATCHMEAN, &l),
                  DDL_EINVAL);
    // N-d input (segmentation) is valid when P_x keeps the classes whole.
    ASSERT_OK(ddl_loss_create(P3, DDL_F64, &g3, DDL_LOSS_CROSS_ENTROPY, DDL_REDUCTION_SUM, &l));
    ddl_loss_destroy(&l);
    ASSERT_STATUS(ddl_loss_create(P2, DDL_F64, &g3, DDL_LOSS_MSE, DDL_REDUCTION_SUM, &l),
                  DDL_EINVAL);
    ASSERT_STATUS(ddl_loss_create(P2, DDL_F64, &g2, (ddl_loss_kind)42, DDL_REDUCTION_SUM, &l),
                  DDL_EINVAL);
    ASSERT_STATUS(ddl_loss_create(P2, DDL_F64, &g2, DDL_LOSS_MSE, (ddl_reduction)9, &l),
                  DDL_EINVAL);
    ddl_shape g0 = ddl_shape_make(2, (int64_t[]){0, 5});
    ASSERT_STATUS(ddl_loss_create(P2, DDL_F64, &g0, DDL_LOSS_MSE, DDL_REDUCTION_MEAN, &l),
                  DDL_EINVAL);
    ASSERT_TRUE(l == NULL);
    // Wrong tensor shapes are refused locally (before any communication) on every rank
    // that holds data.
    ASSERT_OK(ddl_loss_create(P2, DDL_F64, &g2, DDL_LOSS_MSE, DDL_REDUCTION_SUM, &l));
    ddl_tensor_t *wrong = NULL;
    ASSERT_OK(ddl_tensor_create(DDL_F64, &g3, &wrong));
    ASSERT_STATUS(ddl_loss_forward(l, wrong, wrong, NULL, NULL, NULL), DDL_ESHAPE);
    ddl_tensor_destroy(&wrong);
    ddl_loss_destroy(&l);
    ddl_loss_destroy(&l);  // NULL-safe
    if (ddl_test_rank == 0) {
        printf("ok refusals\n");
    }
}

int main(int argc, char **argv)
{
    ddl_test_mpi_init(&argc, &argv);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    ddl_partition_t *P1 = ddl_test_partition_range(0, 2, (int[]){1, 1});
    ddl_partition_t *P3 = ddl_test_partition_range(0, 3, (int[]){1, 1, 1});
    refusals(P1, P3);
    ddl_shape g = ddl_shape_make(2, (int64_t[]){5, 7});
    ddl_shape h = ddl_shape_make(2, (int64_t[]){6, 9});
    if (world == 1) {
        run_all_kinds(P1, "[1,1]", g);
        run_all_kinds(P3, "[1,1,1]", ddl_shape_make(3, (int64_t[]){3, 4, 2}));
        run_cross_entropy(P1, "[1,1]", h);
        bad_labels(P1, h, 0, 9);
        bad_bce(P1, g, 0);
        bad_shape_one_rank(P1, h, 0);
        ddl_partition_t *P5 = ddl_test_partition_range(0, 5, (int[]){1, 1, 1, 1, 1});
        ddl_partition_t *P4 = ddl_test_partition_range(0, 4, (int[]){1, 1, 1, 1});
        run_cross_entropy(P5, "[1,1,1,1,1]", ddl_shape_make(5, (int64_t[]){2, 3, 3, 4, 5}));
        run_cross_entropy(P4, "[1,1,1,1]", ddl_shape_make(4, (int64_t[]){3, 4, 5, 2}));
        run_cross_entropy(P3, "[1,1,1]", ddl_shape_make(3, (int64_t[]){2, 3, 7}));
        bad_labels(P5, ddl_shape_make(5, (int64_t[]){2, 3, 3, 4, 5}), 0, 3);
        ddl_partition_destroy(&P5);
        ddl_partition_destroy(&P4);
    }
    if (world == 2) {
        // Segmentation layouts: the volume split along depth, or along width, or the
        // batch split; the classes never.
        ddl_shape        v  = ddl_shape_make(5, (int64_t[]){2, 3, 5, 4, 3});
        ddl_partition_t *D2 = ddl_test_partition_range(0, 5, (int[]){1, 1, 2, 1, 1});
        ddl_partition_t *W2 = ddl_test_partition_range(0, 5, (int[]){1, 1, 1, 1, 2});
        ddl_partition_t *N2 = ddl_test_partition_range(0, 5, (int[]){2, 1, 1, 1, 1});
        ddl_partition_t *C2 = ddl_test_partition_range(0, 5, (int[]){1, 2, 1, 1, 1});
        run_cross_entropy(D2, "[1,1,2,1,1]", v);
        run_cross_entropy(W2, "[1,1,1,1,2]", v);
        run_cross_entropy(N2, "[2,1,1,1,1]", v);
        bad_labels(D2, v, 1, 7);
        bad_labels(W2, v, 0, -2);
        // A class split of N-d input is refused on every rank, naming the fix.
        ddl_loss_t *l = NULL;
        ASSERT_STATUS(ddl_loss_create(C2, DDL_F64, &v, DDL_LOSS_CROSS_ENTROPY,
                                      DDL_REDUCTION_MEAN, &l),
                      DDL_EINVAL);
        ASSERT_TRUE(strstr(ddl_last_error(), "splits dimension 1 (classes)") != NULL);
        ddl_partition_destroy(&D2);
        ddl_partition_destroy(&W2);
        ddl_partition_destroy(&N2);
        ddl_partition_destroy(&C2);
    }
    if (world == 4) {
        ddl_partition_t *P22  = ddl_test_partition_range(0, 2, (int[]){2, 2});
        ddl_partition_t *P14  = ddl_test_partition_range(0, 2, (int[]){1, 4});
        ddl_partition_t *P12  = ddl_test_partition_range(0, 2, (int[]){1, 2});
        ddl_partition_t *P41  = ddl_test_partition_range(0, 2, (int[]){4, 1});
        ddl_partition_t *P122 = ddl_test_partition_range(0, 3, (int[]){1, 2, 2});
        ddl_partition_t *Q    = NULL;  // ranks 2, 1 (P_x rank 0 is world rank 2); 0, 3 idle
        ASSERT_OK(ddl_partition_create(MPI_COMM_WORLD, 2, (int[]){2, 1}, 2, (int[]){1, 2}, &Q));
        run_all_kinds(P22, "[2,2]", g);
        run_all_kinds(P122, "[1,2,2]", ddl_shape_make(3, (int64_t[]){3, 4, 5}));
        run_all_kinds(Q, "{2,1} [1,2] (idle 0, 3)", g);
        run_cross_entropy(P12, "[1,2]", h);
        run_cross_entropy(P14, "[1,4]", h);
        run_cross_entropy(P22, "[2,2]", h);
        run_cross_entropy(P41, "[4,1]", h);
        run_cross_entropy(P14, "[1,4]", ddl_shape_make(2, (int64_t[]){3, 3}));  // a class-less rank
        run_cross_entropy(Q, "{2,1} [1,2] (idle 0, 3)", h);
        bad_labels(P22, h, 3, 9);
        bad_labels(P22, h, 0, -1);
        bad_labels(Q, h, 1, 100);
        bad_labels(P41, h, 2, 200);
        bad_shape_one_rank(P22, h, 3);
        bad_shape_one_rank(Q, h, 1);
        bad_bce(P22, g, 3);
        bad_bce(Q, g, 1);
        // Segmentation: the volume over [1,1,2,2,1] (as the U-Net specs), over all four
        // spatial-and-batch layouts mixed, and on a 3-rank P_x leaving rank 0 idle.
        ddl_shape        v    = ddl_shape_make(5, (int64_t[]){2, 3, 5, 4, 3});
        ddl_partition_t *S22  = ddl_test_partition_range(0, 5, (int[]){1, 1, 2, 2, 1});
        ddl_partition_t *N2S2 = ddl_test_partition_range(0, 5, (int[]){2, 1, 1, 1, 2});
        ddl_partition_t *S3   = ddl_test_partition_range(1, 4, (int[]){1, 1, 3, 1});
        run_cross_entropy(S22, "[1,1,2,2,1]", v);
        run_cross_entropy(N2S2, "[2,1,1,1,2]", v);
        run_cross_entropy(S3, "{1,2,3} [1,1,3,1] (idle 0)", ddl_shape_make(4, (int64_t[]){2, 2, 7, 3}));
        bad_labels(S22, v, 3, 3);
        bad_labels(S3, ddl_shape_make(4, (int64_t[]){2, 2, 7, 3}), 2, 5);
        ddl_partition_destroy(&S22);
        ddl_partition_destroy(&N2S2);
        ddl_partition_destroy(&S3);
        if (ddl_test_rank == 0) {
            printf("ok data errors\n");
        }
        ddl_partition_destroy(&P22);
        ddl_partition_destroy(&P14);
        ddl_partition_destroy(&P12);
        ddl_partition_destroy(&P41);
        ddl_partition_destroy(&P122);
        ddl_partition_destroy(&Q);
    }
    ddl_partition_destroy(&P1);
    ddl_partition_destroy(&P3);
    return ddl_test_mpi_finalize();
}
