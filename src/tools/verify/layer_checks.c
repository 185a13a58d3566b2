// tools/verify/layer_checks.c: adjoint, sequential-equivalence and finite-difference
// checks of distributed layers, generic over the layer framework.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ddl/agree.h"
#include "ddl/base.h"
#include "ddl/collect.h"
#include "ddl/npy.h"
#include "layer_checks.h"

// Every rank runs the same sequence of steps, so each step's status is agreed on over
// the world: a step failing on one rank (an allocation) fails every rank before the next
// collective, instead of leaving the others blocked in it.
#define CK(expr)                                       \
    do {                                               \
        st = ddl_agree(MPI_COMM_WORLD, (expr));        \
        if (st != DDL_OK) {                            \
            goto done;                                 \
        }                                              \
    } while (0)

// Streams of the random tensors used by the checks.
enum { S_X = 101, S_DY = 102, S_PARAM = 200 };

static int world_rank(void)
{
    int r;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

// Inputs: a one-input layer has input 0 = x; a multi-input layer (add, concat) has
// ddl_layer_num_inputs(L) inputs, each balanced over P_in. Input 0 keeps stream S_X
// (so the figures of one-input layers do not change); input k >= 1 draws S_XK + k.
enum { S_XK = 300 };

static int nin(const ddl_layer_t *L)
{
    return ddl_layer_num_inputs(L);
}

static ddl_box in_box(const ddl_layer_t *L, int k)
{
    ddl_shape g = ddl_layer_input_global(L, k);
    return ddl_partition_local_box(L->P_in, &g);
}

static ddl_box out_box(const ddl_layer_t *L)
{
    return ddl_partition_local_box(L->P_out, &L->y_global);
}

// A local tensor holding this rank's piece of a partition-invariant random global tensor.
static ddl_status global_random(ddl_dtype dt, const ddl_shape *local, const ddl_box *box,
                                const ddl_shape *global, uint64_t seed, uint64_t stream,
                                ddl_tensor_t **out)
{
    ddl_status st = ddl_tensor_create(dt, local, out);
    if (st == DDL_OK) {
        ddl_fill_global_uniform(*out, box, global, seed, stream);
    }
    return st;
}

// An array of one tensor per input of L (NULL-filled), freed by free_inputs.
static ddl_status alloc_inputs(const ddl_layer_t *L, ddl_tensor_t ***out)
{
    *out = ddl_calloc((size_t)nin(L), sizeof **out);
    return *out != NULL ? DDL_OK : ddl_set_error(DDL_ENOMEM, "layer check: out of memory");
}

static void free_inputs(int n, ddl_tensor_t ***ts)
{
    if (*ts == NULL) {
        return;
    }
    for (int k = 0; k < n; k++) {
        ddl_tensor_destroy(&(*ts)[k]);
    }
    ddl_free(*ts);
    *ts = NULL;
}

// Fills ts with the inputs' local tensors: random (partition-invariant) or zero.
static ddl_status make_inputs(const ddl_layer_t *L, ddl_dtype dt, uint64_t seed, bool random,
                              ddl_tensor_t **ts)
{
    for (int k = 0; k < nin(L); k++) {
        ddl_shape s = ddl_layer_input_shape(L, k), g = ddl_layer_input_global(L, k);
        ddl_box   b = in_box(L, k);
        ddl_status st = random ? global_random(dt, &s, &b, &g, seed,
                                               k == 0 ? S_X : S_XK + (uint64_t)k, &ts[k])
                               : ddl_tensor_create(dt, &s, &ts[k]);
        if (st != DDL_OK) {
            return st;
        }
    }
    return DDL_OK;
}

static ddl_status fwd(ddl_layer_t *L, ddl_tensor_t *const *xs, ddl_tensor_t *y)
{
    if (nin(L) == 1) {
        return ddl_layer_forward(L, xs[0], y);
    }
    return ddl_layer_forward_n(L, nin(L), (const ddl_tensor_t *const *)xs, y);
}

static ddl_status bwd(ddl_layer_t *L, const ddl_tensor_t *dy, ddl_tensor_t *const *dxs)
{
    if (nin(L) == 1) {
        return ddl_layer_backward(L, dy, dxs[0]);
    }
    return ddl_layer_backward_n(L, dy, nin(L), dxs);
}

static ddl_status build(const ddl_layer_builder *b, bool seq, ddl_dtype dt, ddl_layer_t **L)
{
    ddl_status st = b->build(b->ctx, seq, dt, L);
    if (st == DDL_OK) {
        ddl_layer_init_params(*L, b->seed, S_PARAM);
        ddl_layer_set_training(*L, b->training);
    }
    return st;
}

static double allsum(double v)
{
    double g;
    MPI_Allreduce(&v, &g, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return g;
}

// |<a, b> - <c, d>| / max(|a||b|, |c||d|) with global sums, where c and d may be n
// tensors each (a multi-input layer's inputs and their gradients: the sum of the dots).
static double adjoint_ratio_n(const ddl_tensor_t *Jv, const ddl_tensor_t *dy, int n,
                              ddl_tensor_t *const *v, ddl_tensor_t *const *Jtdy)
{
    double loc[6] = {ddl_tensor_dot(Jv, dy), 0.0, ddl_tensor_dot(Jv, Jv), ddl_tensor_dot(dy, dy),
                     0.0, 0.0};
    for (int k = 0; k < n; k++) {
        loc[1] += ddl_tensor_dot(v[k], Jtdy[k]);
        loc[4] += ddl_tensor_dot(v[k], v[k]);
        loc[5] += ddl_tensor_dot(Jtdy[k], Jtdy[k]);
    }
    double g[6];
    MPI_Allreduce(loc, g, 6, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    double d = fmax(sqrt(g[2] * g[3]), sqrt(g[4] * g[5]));
    return d == 0.0 ? fabs(g[0] - g[1]) : fabs(g[0] - g[1]) / d;
}

static double adjoint_ratio(const ddl_tensor_t *Jv, const ddl_tensor_t *dy, ddl_tensor_t *v,
                            ddl_tensor_t *Jtdy)
{
    return adjoint_ratio_n(Jv, dy, 1, &v, &Jtdy);
}

static void sub_inplace(ddl_tensor_t *a, const ddl_tensor_t *b)
{
    int64_t n = ddl_tensor_numel(a);
    for (int64_t i = 0; i < n; i++) {
        ddl_tensor_set(a, i, ddl_tensor_get(a, i) - ddl_tensor_get(b, i));
    }
}

static void finish(ddl_check_result *r, const ddl_layer_t *L)
{
    r->nparams = L->nparams;
    r->max     = r->err_input;
    for (int i = 0; i < L->nparams; i++) {
        snprintf(r->param_names[i], sizeof r->param_names[i], "%s", L->params[i].name);
        r->max = fmax(r->max, r->err_param[i]);
    }
}

ddl_status ddl_check_adjoint(const ddl_layer_builder *b, ddl_dtype dt, ddl_check_result *out)
{
    memset(out, 0, sizeof *out);
    ddl_layer_t   *L  = NULL;
    ddl_tensor_t **x = NULL, **zero_x = NULL, **dx = NULL;
    ddl_tensor_t  *y1 = NULL, *y0 = NULL, *dy = NULL, *keep = NULL;
    int            n  = 0;
    ddl_status     st;
    CK(build(b, false, dt, &L));
    n          = nin(L);
    ddl_box yb = out_box(L);
    CK(alloc_inputs(L, &x));
    CK(alloc_inputs(L, &zero_x));
    CK(alloc_inputs(L, &dx));
    CK(make_inputs(L, dt, b->seed, true, x));
    CK(make_inputs(L, dt, b->seed, false, zero_x));
    CK(make_inputs(L, dt, b->seed, false, dx));
    CK(global_random(dt, &L->y_shape, &yb, &L->y_global, b->seed, S_DY, &dy));
    CK(ddl_tensor_create(dt, &L->y_shape, &y1));
    CK(ddl_tensor_create(dt, &L->y_shape, &y0));
    // Inputs: J x = F(x) - F(0) with the parameters as they are (all inputs at once).
    CK(fwd(L, x, y1));
    CK(fwd(L, zero_x, y0));
    sub_inplace(y1, y0);
    ddl_layer_zero_grad(L);
    CK(fwd(L, x, y0));
    CK(bwd(L, dy, dx));
    out->err_input = adjoint_ratio_n(y1, dy, n, x, dx);
    // Each parameter p: J_p p = F(p) - F(p = 0) at the same x; gradient from backward.
    for (int i = 0; i < L->nparams; i++) {
        ddl_param *p = &L->params[i];
        ddl_tensor_destroy(&keep);
        CK(ddl_tensor_create(dt, &p->value->shape, &keep));
        CK(ddl_tensor_copy(p->value, keep));
        CK(fwd(L, x, y1));
        ddl_tensor_zero(p->value);
        CK(fwd(L, x, y0));
        CK(ddl_tensor_copy(keep, p->value));
        sub_inplace(y1, y0);
        ddl_layer_zero_grad(L);
        CK(fwd(L, x, y0));
        CK(bwd(L, dy, dx));
        out->err_param[i] = adjoint_ratio(y1, dy, p->value, p->grad);
    }
    finish(out, L);
done:
    ddl_tensor_destroy(&keep);
    free_inputs(n, &x);
    free_inputs(n, &zero_x);
    free_inputs(n, &dx);
    ddl_tensor_destroy(&y1);
    ddl_tensor_destroy(&y0);
    ddl_tensor_destroy(&dy);
    ddl_layer_destroy(&L);
    return st;
}

// One run of a layer: forward then backward on the global random inputs and dy.
typedef struct run {
    ddl_layer_t   *L;
    int            n;        // inputs
    ddl_tensor_t **x, **dx;  // [n]
    ddl_tensor_t  *y, *dy;
} run;

static void run_free(run *r)
{
    free_inputs(r->n, &r->x);
    free_inputs(r->n, &r->dx);
    ddl_tensor_destroy(&r->y);
    ddl_tensor_destroy(&r->dy);
    ddl_layer_destroy(&r->L);
}

static ddl_status run_layer(const ddl_layer_builder *b, bool seq, ddl_dtype dt, run *r)
{
    memset(r, 0, sizeof *r);
    ddl_status st;
    CK(build(b, seq, dt, &r->L));
    ddl_layer_t *L  = r->L;
    ddl_box      yb = out_box(L);
    r->n            = nin(L);
    CK(alloc_inputs(L, &r->x));
    CK(alloc_inputs(L, &r->dx));
    CK(make_inputs(L, dt, b->seed, true, r->x));
    CK(make_inputs(L, dt, b->seed, false, r->dx));
    CK(global_random(dt, &L->y_shape, &yb, &L->y_global, b->seed, S_DY, &r->dy));
    CK(ddl_tensor_create(dt, &L->y_shape, &r->y));
    ddl_layer_zero_grad(L);
    CK(fwd(L, r->x, r->y));
    CK(bwd(L, r->dy, r->dx));
done:
    return st;
}

// Gathers a distributed piece to rank 0 into a new global tensor (NULL elsewhere).
static ddl_status gather(const ddl_tensor_t *local, const ddl_box *box, const ddl_shape *global,
                         ddl_tensor_t **out)
{
    *out          = NULL;
    ddl_status st = DDL_OK;
    if (world_rank() == 0) {
        st = ddl_tensor_create(local->dtype, global, out);
    }
    int ok = st == DDL_OK, all;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all) {
        ddl_tensor_destroy(out);
        return st != DDL_OK ? st : ddl_set_error(DDL_ENOMEM, "gather: root out of memory");
    }
    return ddl_gather_boxes(MPI_COMM_WORLD, 0, local, box, global, *out);
}

// max |a - b| / max(max |b|, 1e-30) on rank 0, broadcast to all.
static double compare(const ddl_tensor_t *a, const ddl_tensor_t *b)
{
    double e = 0.0;
    if (world_rank() == 0) {
        double num = 0, den = 0;
        int64_t n  = ddl_tensor_numel(b);
        for (int64_t i = 0; i < n; i++) {
            num = fmax(num, fabs(ddl_tensor_get(a, i) - ddl_tensor_get(b, i)));
            den = fmax(den, fabs(ddl_tensor_get(b, i)));
        }
        e = den > 0 ? num / den : num;
    }
    MPI_Bcast(&e, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    return e;
}

ddl_status ddl_check_sequential(const ddl_layer_builder *b, ddl_dtype dt, ddl_check_result *out)
{
    memset(out, 0, sizeof *out);
    run           d = {0}, s = {0};
    ddl_tensor_t *g = NULL;
    ddl_status    st;
    CK(run_layer(b, false, dt, &d));
    CK(run_layer(b, true, dt, &s));
    ddl_box yb = out_box(d.L);
    CK(gather(d.y, &yb, &d.L->y_global, &g));
    out->err_input = compare(g, s.y);
    ddl_tensor_destroy(&g);
    for (int k = 0; k < d.n; k++) {
        ddl_box   xb = in_box(d.L, k);
        ddl_shape xg = ddl_layer_input_global(d.L, k);
        CK(gather(d.dx[k], &xb, &xg, &g));
        out->err_input = fmax(out->err_input, compare(g, s.dx[k]));
        ddl_tensor_destroy(&g);
    }
    for (int i = 0; i < d.L->nparams; i++) {
        ddl_param *p = &d.L->params[i];
        CK(gather(p->grad, &p->box, &p->global, &g));
        out->err_param[i] = compare(g, s.L->params[i].grad);
        ddl_tensor_destroy(&g);
    }
    finish(out, d.L);
done:
    ddl_tensor_destroy(&g);
    run_free(&d);
    run_free(&s);
    return st;
}

// <F(x), r> summed over the world.
static ddl_status objective(run *r, double *out)
{
    ddl_status st = fwd(r->L, r->x, r->y);
    if (st == DDL_OK) {
        *out = allsum(ddl_tensor_dot(r->y, r->dy));
    }
    return st;
}

// Local flat offset of global flat index g inside box (or -1 if not inside).
static int64_t local_offset(const ddl_box *box, const ddl_shape *global, int64_t g)
{
    int64_t coord[DDL_MAX_DIMS];
    for (int d = global->ndim - 1; d >= 0; d--) {
        coord[d] = g % global->d[d];
        g /= global->d[d];
    }
    int64_t off = 0;
    for (int d = 0; d < global->ndim; d++) {
        if (coord[d] < box->start[d] || coord[d] >= box->stop[d]) {
            return -1;
        }
        off = off * (box->stop[d] - box->start[d]) + (coord[d] - box->start[d]);
    }
    return off;
}

// Finite differences over `points` sampled global indices of one distributed tensor
// (t holds this rank's piece `box`; grad its analytic gradient).
static ddl_status fd_tensor(run *r, ddl_tensor_t *t, const ddl_tensor_t *grad, const ddl_box *box,
                            const ddl_shape *global, int points, double *err)
{
    const double eps = 1e-6;
    int64_t      n   = ddl_shape_numel(global);
    *err             = 0.0;
    for (int k = 0; k < points && n > 0; k++) {
        int64_t g   = (int64_t)(ddl_rng_u64(12345, 7, (uint64_t)k) % (uint64_t)n);
        int64_t off = local_offset(box, global, g);
        double  keep = off >= 0 ? ddl_tensor_get(t, off) : 0.0;
        double  ana  = allsum(off >= 0 ? ddl_tensor_get(grad, off) : 0.0);
        double  fp, fm;
        if (off >= 0) {
            ddl_tensor_set(t, off, keep + eps);
        }
        ddl_status st = objective(r, &fp);
        if (off >= 0) {
            ddl_tensor_set(t, off, keep - eps);
        }
        if (st == DDL_OK) {
            st = objective(r, &fm);
        }
        if (off >= 0) {
            ddl_tensor_set(t, off, keep);
        }
        if (st != DDL_OK) {
            return st;
        }
        double num = (fp - fm) / (2 * eps);
        *err       = fmax(*err, fabs(num - ana) / fmax(1.0, fmax(fabs(num), fabs(ana))));
    }
    return DDL_OK;
}

ddl_status ddl_check_gradcheck(const ddl_layer_builder *b, int points, ddl_check_result *out)
{
    memset(out, 0, sizeof *out);
    run        r = {0};
    ddl_status st;
    CK(run_layer(b, false, DDL_F64, &r));
    for (int k = 0; k < r.n; k++) {
        ddl_box   xb = in_box(r.L, k);
        ddl_shape xg = ddl_layer_input_global(r.L, k);
        double    e  = 0.0;
        CK(fd_tensor(&r, r.x[k], r.dx[k], &xb, &xg, points, &e));
        out->err_input = fmax(out->err_input, e);
    }
    for (int i = 0; i < r.L->nparams; i++) {
        ddl_param *p = &r.L->params[i];
        CK(fd_tensor(&r, p->value, p->grad, &p->box, &p->global, points, &out->err_param[i]));
    }
    finish(out, r.L);
done:
    run_free(&r);
    return st;
}

static ddl_status dump_one(const char *dir, const char *name, const ddl_tensor_t *local,
                           const ddl_box *box, const ddl_shape *global)
{
    ddl_tensor_t *g  = NULL;
    ddl_status    st = gather(local, box, global, &g);
    if (st == DDL_OK && world_rank() == 0) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s.npy", dir, name);
        st = ddl_npy_write(path, g);
    }
    ddl_tensor_destroy(&g);
    int ok = st == DDL_OK, all;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return all ? DDL_OK : (st != DDL_OK ? st : ddl_set_error(DDL_EIO, "dump failed on rank 0"));
}

ddl_status ddl_check_dump(const ddl_layer_builder *b, ddl_dtype dt, const char *dir)
{
    run        r = {0};
    ddl_status st;
    CK(run_layer(b, false, dt, &r));
    ddl_box yb = out_box(r.L);
    for (int k = 0; k < r.n; k++) {
        // One input: x, dx; several: x0, x1, ... and dx0, dx1, ...
        char      xn[24], dxn[24];
        ddl_box   xb = in_box(r.L, k);
        ddl_shape xg = ddl_layer_input_global(r.L, k);
        if (r.n == 1) {
            snprintf(xn, sizeof xn, "x");
            snprintf(dxn, sizeof dxn, "dx");
        } else {
            snprintf(xn, sizeof xn, "x%d", k);
            snprintf(dxn, sizeof dxn, "dx%d", k);
        }
        CK(dump_one(dir, xn, r.x[k], &xb, &xg));
        CK(dump_one(dir, dxn, r.dx[k], &xb, &xg));
    }
    CK(dump_one(dir, "dy", r.dy, &yb, &r.L->y_global));
    CK(dump_one(dir, "y", r.y, &yb, &r.L->y_global));
    for (int i = 0; i < r.L->nparams; i++) {
        ddl_param *p = &r.L->params[i];
        char       dname[40];
        snprintf(dname, sizeof dname, "d%s", p->name);
        CK(dump_one(dir, p->name, p->value, &p->box, &p->global));
        CK(dump_one(dir, dname, p->grad, &p->box, &p->global));
    }
done:
    run_free(&r);
    return st;
}

// ---- losses ------------------------------------------------------------------

// Maps uniform [-1, 1) values into the domain each loss expects.
static double map_input(ddl_loss_kind k, double u)
{
    switch (k) {
    case DDL_LOSS_BCE:
        return 0.05 + 0.45 * (u + 1.0);  // probabilities in (0, 1)
    default:
        return u;
    }
}

static double map_target(ddl_loss_kind k, double u)
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

// One evaluation of a loss: inputs, labels, outputs.
typedef struct loss_run {
    ddl_loss_t            *l;
    const ddl_partition_t *P;
    ddl_tensor_t          *x, *t, *dx, *el, *del;  // el/del: elementwise loss, its upstream
    int64_t               *labels;
    ddl_box                xbox, elbox;
    ddl_shape              el_global;
    double                 value;
} loss_run;

static void loss_run_free(loss_run *r)
{
    ddl_tensor_destroy(&r->x);
    ddl_tensor_destroy(&r->t);
    ddl_tensor_destroy(&r->dx);
    ddl_tensor_destroy(&r->el);
    ddl_tensor_destroy(&r->del);
    ddl_free(r->labels);
    ddl_loss_destroy(&r->l);
}

static void map_tensor(ddl_tensor_t *t, ddl_loss_kind k, bool target)
{
    int64_t n = ddl_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) {
        double u = ddl_tensor_get(t, i);
        ddl_tensor_set(t, i, target ? map_target(k, u) : map_input(k, u));
    }
}

static ddl_status loss_eval(loss_run *r, const ddl_loss_builder *b)
{
    return ddl_loss_forward(r->l, r->x, b->kind == DDL_LOSS_CROSS_ENTROPY ? NULL : r->t,
                            r->labels, &r->value, b->reduction == DDL_REDUCTION_NONE ? r->el : NULL);
}

static ddl_status loss_setup(const ddl_loss_builder *b, bool seq, ddl_dtype dt, loss_run *r)
{
    memset(r, 0, sizeof *r);
    ddl_status st;
    CK(b->build(b->ctx, seq, dt, &r->l, &r->P));
    ddl_shape xs = ddl_loss_x_shape(r->l);
    r->xbox      = ddl_partition_local_box(r->P, &b->x_global);
    CK(global_random(dt, &xs, &r->xbox, &b->x_global, b->seed, S_X, &r->x));
    map_tensor(r->x, b->kind, false);
    CK(ddl_tensor_create(dt, &xs, &r->dx));
    bool ce = b->kind == DDL_LOSS_CROSS_ENTROPY;
    if (ce) {
        // Labels of this rank's rows, drawn by global row index.
        int64_t rows = xs.d[0], C = b->x_global.d[1];
        r->labels    = ddl_malloc(sizeof(int64_t) * (size_t)(rows > 0 ? rows : 1));
        CK(r->labels != NULL ? DDL_OK
                             : ddl_set_error(DDL_ENOMEM, "loss check: out of memory"));
        for (int64_t i = 0; i < rows; i++) {
            r->labels[i] = (int64_t)(ddl_rng_u64(b->seed, 77, (uint64_t)(r->xbox.start[0] + i)) %
                                     (uint64_t)C);
        }
        // Elementwise losses live on the column-0 ranks, one per local row.
        r->el_global = ddl_shape_make(1, (int64_t[]){b->x_global.d[0]});
        r->elbox     = (ddl_box){.ndim = 1};
        const int *idx = ddl_partition_index(r->P);
        if (idx != NULL && idx[1] == 0) {
            r->elbox.start[0] = r->xbox.start[0];
            r->elbox.stop[0]  = r->xbox.stop[0];
        }
    } else {
        CK(global_random(dt, &xs, &r->xbox, &b->x_global, b->seed, S_DY + 7, &r->t));
        map_tensor(r->t, b->kind, true);
        r->el_global = b->x_global;
        r->elbox     = r->xbox;
    }
    ddl_shape es = ddl_box_shape(&r->elbox);
    CK(ddl_tensor_create(dt, &es, &r->el));
    CK(global_random(dt, &es, &r->elbox, &r->el_global, b->seed, S_DY, &r->del));
    CK(loss_eval(r, b));
    CK(ddl_loss_backward(r->l, 1.0, r->del, r->dx));
done:
    return st;
}

ddl_status ddl_check_loss_sequential(const ddl_loss_builder *b, ddl_dtype dt, ddl_check_result *out)
{
    memset(out, 0, sizeof *out);
    loss_run      d = {0}, s = {0};
    ddl_tensor_t *g = NULL;
    ddl_status    st;
    CK(loss_setup(b, false, dt, &d));
    CK(loss_setup(b, true, dt, &s));
    double err = 0.0;
    if (b->reduction == DDL_REDUCTION_NONE) {
        CK(gather(d.el, &d.elbox, &d.el_global, &g));
        err = compare(g, s.el);
        ddl_tensor_destroy(&g);
    } else {
        double e = 0.0;
        if (world_rank() == 0) {
            e = fabs(d.value - s.value) / fmax(fabs(s.value), 1e-300);
        }
        MPI_Bcast(&e, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
        err = e;
    }
    CK(gather(d.dx, &d.xbox, &b->x_global, &g));
    out->err_input = fmax(err, compare(g, s.dx));
    out->max       = out->err_input;
done:
    ddl_tensor_destroy(&g);
    loss_run_free(&d);
    loss_run_free(&s);
    return st;
}

// The scalar the loss gradcheck differentiates: the reduced loss, or <elementwise, del>.
static ddl_status loss_objective(loss_run *r, const ddl_loss_builder *b, double *out)
{
    ddl_status st = loss_eval(r, b);
    if (st != DDL_OK) {
        return st;
    }
    if (b->reduction == DDL_REDUCTION_NONE) {
        *out = allsum(ddl_tensor_dot(r->el, r->del));
    } else {
        *out = allsum(world_rank() == 0 ? r->value : 0.0);
    }
    return DDL_OK;
}

ddl_status ddl_check_loss_gradcheck(const ddl_loss_builder *b, int points, ddl_check_result *out)
{
    memset(out, 0, sizeof *out);
    loss_run   r = {0};
    ddl_status st;
    CK(loss_setup(b, false, DDL_F64, &r));
    const double eps = 1e-6;
    int64_t      n   = ddl_shape_numel(&b->x_global);
    for (int k = 0; k < points && n > 0; k++) {
        int64_t g    = (int64_t)(ddl_rng_u64(12345, 9, (uint64_t)k) % (uint64_t)n);
        int64_t off  = local_offset(&r.xbox, &b->x_global, g);
        double  keep = off >= 0 ? ddl_tensor_get(r.x, off) : 0.0;
        double  ana  = allsum(off >= 0 ? ddl_tensor_get(r.dx, off) : 0.0);
        double  fp = 0, fm = 0;
        if (off >= 0) {
            ddl_tensor_set(r.x, off, keep + eps);
        }
        st = loss_objective(&r, b, &fp);
        if (off >= 0) {
            ddl_tensor_set(r.x, off, keep - eps);
        }
        if (st == DDL_OK) {
            st = loss_objective(&r, b, &fm);
        }
        if (off >= 0) {
            ddl_tensor_set(r.x, off, keep);
        }
        if (st != DDL_OK) {
            goto done;
        }
        double num     = (fp - fm) / (2 * eps);
        out->err_input = fmax(out->err_input, fabs(num - ana) / fmax(1.0, fmax(fabs(num), fabs(ana))));
    }
    out->max = out->err_input;
done:
    loss_run_free(&r);
    return st;
}

ddl_status ddl_check_loss_dump(const ddl_loss_builder *b, ddl_dtype dt, const char *dir)
{
    loss_run      r = {0};
    ddl_tensor_t *lab = NULL;
    ddl_status    st;
    CK(loss_setup(b, false, dt, &r));
    CK(dump_one(dir, "x", r.x, &r.xbox, &b->x_global));
    CK(dump_one(dir, "dx", r.dx, &r.xbox, &b->x_global));
    if (b->kind == DDL_LOSS_CROSS_ENTROPY) {
        // Labels as a float tensor of the class indices (held by the column-0 ranks).
        ddl_shape ls = ddl_box_shape(&r.elbox);
        CK(ddl_tensor_create(dt, &ls, &lab));
        for (int64_t i = 0; i < ls.d[0]; i++) {
            ddl_tensor_set(lab, i, (double)r.labels[i]);
        }
        CK(dump_one(dir, "target", lab, &r.elbox, &r.el_global));
    } else {
        CK(dump_one(dir, "target", r.t, &r.xbox, &b->x_global));
    }
    if (b->reduction == DDL_REDUCTION_NONE) {
        CK(dump_one(dir, "loss", r.el, &r.elbox, &r.el_global));
        CK(dump_one(dir, "dloss", r.del, &r.elbox, &r.el_global));
    } else {
        ddl_tensor_t *v = NULL;
        ddl_shape     s = ddl_shape_make(0, NULL);
        CK(ddl_tensor_create(dt, &s, &v));
        ddl_tensor_set(v, 0, r.value);
        if (world_rank() == 0) {
            char path[4096];
            snprintf(path, sizeof path, "%s/loss.npy", dir);
            st = ddl_npy_write(path, v);
        }
        ddl_tensor_destroy(&v);
        int ok = st == DDL_OK, all;
        MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        if (!all) {
            st = st != DDL_OK ? st : ddl_set_error(DDL_EIO, "dump failed on rank 0");
        }
    }
done:
    ddl_tensor_destroy(&lab);
    loss_run_free(&r);
    return st;
}
