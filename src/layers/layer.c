// layers/layer.c: the layer framework: lifecycle, parameters and partition-invariant
// initialization.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "ddl/agree.h"
#include "ddl/base.h"
#include "layers/layer_impl.h"

// ---- lifecycle ---------------------------------------------------------------

ddl_status ddl_layer_alloc(const ddl_layer_ops *ops, const char *kind, ddl_dtype dt,
                           ddl_layer_t **out)
{
    *out           = NULL;
    ddl_layer_t *L = ddl_calloc(1, sizeof *L);
    if (L == NULL) {
        return ddl_set_error(DDL_ENOMEM, "%s: out of memory", kind);
    }
    L->ops = ops;
    snprintf(L->kind, sizeof L->kind, "%s", kind);
    L->dt       = dt;
    L->training = true;
    L->ninputs  = 1;
    *out        = L;
    return DDL_OK;
}

ddl_status ddl_layer_set_inputs(ddl_layer_t *L, int n, const ddl_shape *globals,
                                const ddl_partition_t *P)
{
    DDL_REQUIRE(n >= 2 && L->in_global == NULL, DDL_EINTERNAL,
                "%s: set_inputs with %d inputs (or twice)", L->kind, n);
    L->in_global = ddl_calloc((size_t)n, sizeof *L->in_global);
    L->in_shape  = ddl_calloc((size_t)n, sizeof *L->in_shape);
    if (L->in_global == NULL || L->in_shape == NULL) {
        ddl_free(L->in_global);
        ddl_free(L->in_shape);
        L->in_global = L->in_shape = NULL;
        return ddl_set_error(DDL_ENOMEM, "%s: out of memory for %d inputs", L->kind, n);
    }
    for (int k = 0; k < n; k++) {
        L->in_global[k] = globals[k];
        L->in_shape[k]  = ddl_partition_local_shape(P, &globals[k]);
    }
    L->ninputs  = n;
    L->P_in     = P;
    L->x_global = globals[0];
    L->x_shape  = L->in_shape[0];
    return DDL_OK;
}

// The layer whose parameters ddl_layer_add_param hands out instead of allocating, while a
// copy of it is built on this thread (ddl_layer_lend_params).
static _Thread_local const ddl_layer_t *lender;

void ddl_layer_lend_params(const ddl_layer_t *from)
{
    lender = from;
}

const ddl_layer_t *ddl_layer_copy_source(void)
{
    return lender;
}

// -1: not yet read from DDL_HALO_OVERLAP.
static int halo_overlap = -1;

bool ddl_halo_overlap(void)
{
    if (halo_overlap < 0) {
        // The engine refuses any other value (spec_read_tuning); a direct caller of the
        // layers gets the default, with a warning. "" is unset.
        const char *e  = getenv("DDL_HALO_OVERLAP");
        bool        ok = e != NULL && (strcmp(e, "0") == 0 || strcmp(e, "1") == 0);
        if (e != NULL && *e != '\0' && !ok) {
            ddl_log(DDL_LOG_WARN, "DDL_HALO_OVERLAP=%.40s is not 0 or 1; using the default, %d", e,
                    DDL_HALO_OVERLAP_DEFAULT);
        }
        halo_overlap = ok ? e[0] == '1' : DDL_HALO_OVERLAP_DEFAULT;
    }
    return halo_overlap != 0;
}

bool ddl_halo_overlap_set(bool on)
{
    bool prev    = ddl_halo_overlap();
    halo_overlap = on ? 1 : 0;
    return prev;
}

static _Thread_local bool   sharing;
static _Thread_local double sharing_min_bytes;

void ddl_layer_share_scratch(bool on, double min_bytes)
{
    sharing           = on;
    sharing_min_bytes = min_bytes;
}

bool ddl_layer_scratch_shared(void)
{
    return sharing;
}

double ddl_layer_share_min_bytes(void)
{
    return sharing_min_bytes;
}

void ddl_layer_set_scratch(ddl_layer_t *L, void *p)
{
    if (L->scratch_bytes > 0 && L->ops->set_scratch != NULL) {
        L->ops->set_scratch(L, p);
        L->scratch_set = true;
    }
}

ddl_status ddl_layer_check_scratch(const ddl_layer_t *L, bool shared)
{
    DDL_REQUIRE(!shared || L->scratch_set || L->scratch_bytes == 0, DDL_EINTERNAL,
                "%s: built to share scratch, but none was set (ddl_layer_set_scratch)", L->kind);
    return DDL_OK;
}

ddl_status ddl_scratch_tensor(ddl_dtype dt, const ddl_shape *s, bool shared, ddl_tensor_t **out)
{
    return shared ? ddl_tensor_view(dt, s, NULL, out) : ddl_tensor_create(dt, s, out);
}

size_t ddl_scratch_carve(size_t *total, size_t bytes)
{
    size_t at = *total;
    *total += (bytes + DDL_ALIGN - 1) / DDL_ALIGN * DDL_ALIGN;
    return at;
}

// The lender's parameter i for p (name, global shape and box as p's): borrowed, no grad.
static ddl_status borrow_param(ddl_layer_t *L, ddl_param *p, int i)
{
    const ddl_param *q    = i < lender->nparams ? &lender->params[i] : NULL;
    bool             same = q != NULL && strcmp(q->name, p->name) == 0 &&
                ddl_shape_equal(&q->global, &p->global) && q->box.ndim == p->box.ndim;
    for (int d = 0; same && d < p->box.ndim; d++) {
        same = p->box.start[d] == q->box.start[d] && p->box.stop[d] == q->box.stop[d];
    }
    DDL_REQUIRE(same, DDL_EINTERNAL, "%s: parameter %d (%s) differs from the lender's", L->kind, i,
                p->name);
    p->value    = q->value;
    L->borrowed = true;
    L->nparams++;
    return DDL_OK;
}

ddl_status ddl_layer_add_param(ddl_layer_t *L, const char *name, const ddl_shape *global,
                               const ddl_box *box, ddl_init_kind init, int64_t fan_in)
{
    DDL_REQUIRE(L->nparams < DDL_LAYER_MAX_PARAMS, DDL_EINTERNAL, "%s: too many parameters",
                L->kind);
    ddl_param *p = &L->params[L->nparams];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->global = *global;
    p->box    = *box;
    p->init   = init;
    p->fan_in = fan_in;
    if (lender != NULL) {
        return borrow_param(L, p, L->nparams);
    }
    ddl_shape  s  = ddl_box_shape(box);
    ddl_status st = ddl_tensor_create(L->dt, &s, &p->value);
    if (st == DDL_OK) {
        st = ddl_tensor_create(L->dt, &s, &p->grad);
    }
    if (st != DDL_OK) {
        ddl_tensor_destroy(&p->value);
        return st;
    }
    L->nparams++;
    return DDL_OK;
}

// Local checks of forward/backward arguments (no MPI).
static ddl_status check_io(const ddl_layer_t *L, const char *what, const ddl_tensor_t *t,
                           const ddl_shape *want)
{
    char got[96], exp[96];
    DDL_REQUIRE(t != NULL, DDL_EINVAL, "%s: %s is NULL", L->kind, what);
    DDL_REQUIRE(t->dtype == L->dt, DDL_ESHAPE, "%s: %s has dtype %s, the layer has %s", L->kind,
                what, ddl_dtype_name(t->dtype), ddl_dtype_name(L->dt));
    DDL_REQUIRE(ddl_shape_equal(&t->shape, want), DDL_ESHAPE,
                "%s: %s has local shape %s, expected %s on this rank", L->kind, what,
                ddl_shape_str(&t->shape, got, sizeof got), ddl_shape_str(want, exp, sizeof exp));
    return DDL_OK;
}

// Every rank of the layer's base communicator calls forward/backward (inactive ranks
// with zero-volume tensors), so a check that fails on one rank fails on all of them
// before the layer's first collective, instead of leaving the others blocked in it.
// A layer whose caller fixed its tensors (ddl_layer_set_io_fixed) checks them on this
// rank only: a mismatch is the caller's bug, which no status could report on every rank
// without the agreement, so it aborts with the check's message.
ddl_status ddl_layer_fixed_check(const char *who, ddl_status st)
{
    if (st != DDL_OK) {
        fprintf(stderr, "ddl: %s: a fixed argument failed its check: %s\n", who, ddl_last_error());
        abort();
    }
    return DDL_OK;
}

static ddl_status agree_io(const ddl_layer_t *L, ddl_status st)
{
    if (L->io_fixed) {
        return ddl_layer_fixed_check(L->kind, st);
    }
    const ddl_partition_t *P = L->P_in != NULL ? L->P_in : L->P_out;
    return P != NULL ? ddl_agree(ddl_partition_base(P), st) : st;
}

static bool multi_input(const ddl_layer_t *L)
{
    return L->ops->forward_n != NULL;
}

// The one-input entry points on a multi-input layer (or the reverse) would read the
// wrong number of tensors: refused, the same verdict on every rank.
static ddl_status check_arity(const ddl_layer_t *L, bool multi, const char *call, int n)
{
    if (multi_input(L) != multi) {
        return multi_input(L)
                   ? ddl_set_error(DDL_EINVAL,
                                   "%s: the layer takes %d inputs: call ddl_layer_%s_n, not "
                                   "ddl_layer_%s",
                                   L->kind, L->ninputs, call, call)
                   : ddl_set_error(DDL_EINVAL,
                                   "%s: the layer takes one input: call ddl_layer_%s, not "
                                   "ddl_layer_%s_n",
                                   L->kind, call, call);
    }
    DDL_REQUIRE(!multi || n == L->ninputs, DDL_EINVAL, "%s: %s given %d inputs, the layer takes %d",
                L->kind, call, n, L->ninputs);
    return DDL_OK;
}

ddl_status ddl_layer_forward(ddl_layer_t *L, const ddl_tensor_t *x, ddl_tensor_t *y)
{
    DDL_REQUIRE(L != NULL, DDL_EINVAL, "layer forward: layer is NULL");
    ddl_status st = check_arity(L, false, "forward", 1);
    if (st == DDL_OK) {
        st = check_io(L, "input", x, &L->x_shape);
    }
    if (st == DDL_OK) {
        st = check_io(L, "output", y, &L->y_shape);
    }
    DDL_CHECK(agree_io(L, st));
    L->forwarded = true;
    ddl_traffic mark;
    ddl_layer_traffic_begin(&mark);
    st = L->ops->forward(L, x, y);
    ddl_layer_traffic_end(L, false, &mark);
    return st;
}

ddl_status ddl_layer_backward(ddl_layer_t *L, const ddl_tensor_t *dy, ddl_tensor_t *dx)
{
    DDL_REQUIRE(L != NULL, DDL_EINVAL, "layer backward: layer is NULL");
    ddl_status st = check_arity(L, false, "backward", 1);
    if (st == DDL_OK && L->borrowed) {
        st = ddl_set_error(DDL_EINVAL, "%s: backward of a forward-only copy", L->kind);
    }
    if (st == DDL_OK) {
        st = check_io(L, "output gradient", dy, &L->y_shape);
    }
    if (st == DDL_OK) {
        st = check_io(L, "input gradient", dx, &L->x_shape);
    }
    DDL_CHECK(agree_io(L, st));
    // Every rank knows this alike (forward is collective, and sets it after its agreed
    // checks): a layer's own check may hold on its active ranks only, and statuses would
    // differ.
    DDL_REQUIRE(L->forwarded, DDL_EINVAL, "%s: backward called before any forward", L->kind);
    ddl_traffic mark;
    ddl_layer_traffic_begin(&mark);
    st = L->ops->backward(L, dy, dx);
    ddl_layer_traffic_end(L, true, &mark);
    return st;
}

void ddl_layer_traffic_begin(ddl_traffic *mark)
{
    ddl_traffic_snapshot(mark);
}

void ddl_layer_traffic_end(ddl_layer_t *L, bool backward, const ddl_traffic *mark)
{
    ddl_traffic now;
    ddl_traffic_snapshot(&now);
    ddl_traffic *slot = backward      ? &L->traffic.backward
                        : L->training ? &L->traffic.forward_train
                                      : &L->traffic.forward_eval;
    ddl_traffic_sub(&now, mark, slot);
}

// Checks of the n inputs (or their gradients) of a multi-input layer; `what` is
// "input" or "input gradient".
static ddl_status check_inputs(const ddl_layer_t *L, const char *what, int n,
                               const ddl_tensor_t *const *ts)
{
    DDL_REQUIRE(ts != NULL, DDL_EINVAL, "%s: the %s array is NULL", L->kind, what);
    for (int k = 0; k < n; k++) {
        char name[48];
        snprintf(name, sizeof name, "%s %d", what, k);
        DDL_CHECK(check_io(L, name, ts[k], &L->in_shape[k]));
    }
    return DDL_OK;
}

ddl_status ddl_layer_forward_n(ddl_layer_t *L, int n, const ddl_tensor_t *const *xs,
                               ddl_tensor_t *y)
{
    DDL_REQUIRE(L != NULL, DDL_EINVAL, "layer forward_n: layer is NULL");
    ddl_status st = check_arity(L, true, "forward", n);
    if (st == DDL_OK) {
        st = check_inputs(L, "input", n, xs);
    }
    if (st == DDL_OK) {
        st = check_io(L, "output", y, &L->y_shape);
    }
    DDL_CHECK(agree_io(L, st));
    L->forwarded = true;
    ddl_traffic mark;
    ddl_layer_traffic_begin(&mark);
    st = L->ops->forward_n(L, n, xs, y);
    ddl_layer_traffic_end(L, false, &mark);
    return st;
}

ddl_status ddl_layer_backward_n(ddl_layer_t *L, const ddl_tensor_t *dy, int n,
                                ddl_tensor_t *const *dxs)
{
    DDL_REQUIRE(L != NULL, DDL_EINVAL, "layer backward_n: layer is NULL");
    ddl_status st = check_arity(L, true, "backward", n);
    if (st == DDL_OK && L->borrowed) {
        st = ddl_set_error(DDL_EINVAL, "%s: backward of a forward-only copy", L->kind);
    }
    if (st == DDL_OK) {
        st = check_io(L, "output gradient", dy, &L->y_shape);
    }
    if (st == DDL_OK) {
        st = check_inputs(L, "input gradient", n, (const ddl_tensor_t *const *)dxs);
    }
    DDL_CHECK(agree_io(L, st));
    // Every rank knows this alike (forward is collective, and sets it after its agreed
    // checks): a layer's own check may hold on its active ranks only, and statuses would
    // differ.
    DDL_REQUIRE(L->forwarded, DDL_EINVAL, "%s: backward called before any forward", L->kind);
    ddl_traffic mark;
    ddl_layer_traffic_begin(&mark);
    st = L->ops->backward_n(L, dy, n, dxs);
    ddl_layer_traffic_end(L, true, &mark);
    return st;
}

int ddl_layer_num_inputs(const ddl_layer_t *L)
{
    return L->ninputs > 1 ? L->ninputs : 1;
}

// [0]: what a caller asking for a missing input gets (zero volume, never a real shape).
static ddl_shape no_shape(void)
{
    return ddl_shape_make(1, (int64_t[]){0});
}

ddl_shape ddl_layer_input_shape(const ddl_layer_t *L, int k)
{
    if (k < 0 || k >= ddl_layer_num_inputs(L)) {
        return no_shape();
    }
    return L->in_shape != NULL ? L->in_shape[k] : L->x_shape;
}

const char *ddl_layer_kind(const ddl_layer_t *L)
{
    return L->kind;
}

ddl_dtype ddl_layer_dtype(const ddl_layer_t *L)
{
    return L->dt;
}

const ddl_shape *ddl_layer_x_shape(const ddl_layer_t *L)
{
    return &L->x_shape;
}

const ddl_shape *ddl_layer_y_shape(const ddl_layer_t *L)
{
    return &L->y_shape;
}

const ddl_shape *ddl_layer_x_global(const ddl_layer_t *L)
{
    return &L->x_global;
}

const ddl_shape *ddl_layer_y_global(const ddl_layer_t *L)
{
    return &L->y_global;
}

const ddl_partition_t *ddl_layer_P_in(const ddl_layer_t *L)
{
    return L->P_in;
}

const ddl_partition_t *ddl_layer_P_out(const ddl_layer_t *L)
{
    return L->P_out;
}

bool ddl_layer_training(const ddl_layer_t *L)
{
    return L->training;
}

int ddl_layer_nparams(const ddl_layer_t *L)
{
    return L->nparams;
}

ddl_param *ddl_layer_param(ddl_layer_t *L, int i)
{
    return i >= 0 && i < L->nparams ? &L->params[i] : NULL;
}

ddl_shape ddl_layer_input_global(const ddl_layer_t *L, int k)
{
    if (k < 0 || k >= ddl_layer_num_inputs(L)) {
        return no_shape();
    }
    return L->in_global != NULL ? L->in_global[k] : L->x_global;
}

ddl_status ddl_layer_finish_copy(ddl_layer_t *L, ddl_layer_t *from)
{
    DDL_REQUIRE(L != NULL && from != NULL && !from->borrowed && strcmp(L->kind, from->kind) == 0 &&
                    L->nparams == from->nparams && (L->borrowed || L->nparams == 0),
                DDL_EINTERNAL, "finish_copy: %s is not a copy of %s built against its parameters",
                L != NULL ? L->kind : "(null)", from != NULL ? from->kind : "(null)");
    L->borrowed = true;
    return DDL_OK;
}

void ddl_layer_destroy(ddl_layer_t **L)
{
    if (L == NULL || *L == NULL) {
        return;
    }
    if ((*L)->ops != NULL && (*L)->ops->destroy != NULL) {
        (*L)->ops->destroy(*L);
    }
    for (int i = 0; i < (*L)->nparams; i++) {
        if ((*L)->borrowed) {
            (*L)->params[i].value = NULL; // the lender's
        }
        ddl_tensor_destroy(&(*L)->params[i].value);
        ddl_tensor_destroy(&(*L)->params[i].grad);
    }
    ddl_free((*L)->in_global);
    ddl_free((*L)->in_shape);
    ddl_free(*L);
    *L = NULL;
}

void ddl_layer_zero_grad(ddl_layer_t *L)
{
    for (int i = 0; i < L->nparams && !L->borrowed; i++) {
        ddl_tensor_zero(L->params[i].grad);
    }
}

void ddl_layer_set_training(ddl_layer_t *L, bool training)
{
    L->training = training;
}

void ddl_layer_set_rng_step(ddl_layer_t *L, uint64_t step)
{
    L->rng_step_set = true;
    L->rng_step     = step;
}

void ddl_layer_set_dx_unused(ddl_layer_t *L, bool unused)
{
    L->dx_unused = unused;
}

bool ddl_layer_set_dx_add(ddl_layer_t *L, bool add)
{
    L->dx_add = add && L->ops->can_add_dx != NULL && L->ops->can_add_dx(L);
    return L->dx_add;
}

void ddl_layer_set_io_fixed(ddl_layer_t *L, bool fixed)
{
    L->io_fixed = fixed;
}

void ddl_layer_init_params(ddl_layer_t *L, uint64_t seed, uint64_t stream_base)
{
    for (int i = 0; i < L->nparams; i++) {
        ddl_param *p = &L->params[i];
        ddl_init_fill(p->value, &p->box, &p->global, p->init, p->fan_in, seed,
                      stream_base + (uint64_t)i);
    }
}

// ---- partition-invariant fills -------------------------------------------------

// Calls fn for every element of box (row-major), with its global flat index.
static void for_box(ddl_tensor_t *t, const ddl_box *box, const ddl_shape *global,
                    double (*fn)(const void *ctx, uint64_t g), const void *ctx)
{
    int64_t n = ddl_box_numel(box);
    if (n == 0) {
        return;
    }
    int     nd = box->ndim;
    int64_t idx[DDL_MAX_DIMS], stride[DDL_MAX_DIMS], acc = 1;
    for (int d = nd - 1; d >= 0; d--) {
        stride[d] = acc;
        acc *= global->d[d];
        idx[d] = box->start[d];
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t g = 0;
        for (int d = 0; d < nd; d++) {
            g += idx[d] * stride[d];
        }
        ddl_tensor_set(t, i, fn(ctx, (uint64_t)g));
        for (int d = nd - 1; d >= 0; d--) {
            if (++idx[d] < box->stop[d]) {
                break;
            }
            idx[d] = box->start[d];
        }
    }
}

typedef struct fill_ctx {
    uint64_t seed, stream;
    double   bound;
    double   constant;
} fill_ctx;

static double fill_uniform(const void *ctx, uint64_t g)
{
    const fill_ctx *c = ctx;
    return c->bound * (2.0 * ddl_rng_uniform(c->seed, c->stream, g) - 1.0);
}

static double fill_constant(const void *ctx, uint64_t g)
{
    (void)g;
    return ((const fill_ctx *)ctx)->constant;
}

void ddl_init_fill(ddl_tensor_t *t, const ddl_box *box, const ddl_shape *global, ddl_init_kind init,
                   int64_t fan_in, uint64_t seed, uint64_t stream)
{
    fill_ctx c  = {.seed = seed, .stream = stream};
    double   fi = fan_in > 0 ? (double)fan_in : 1.0;
    switch (init) {
    case DDL_INIT_KAIMING_UNIFORM:
        // PyTorch: kaiming_uniform_(a=sqrt(5)) gives bound = sqrt(6/((1+5) fan_in)) = 1/sqrt(fan_in).
        c.bound = sqrt(6.0 / (6.0 * fi));
        for_box(t, box, global, fill_uniform, &c);
        break;
    case DDL_INIT_FAN_IN_UNIFORM:
        c.bound = 1.0 / sqrt(fi);
        for_box(t, box, global, fill_uniform, &c);
        break;
    case DDL_INIT_ONES:
        c.constant = 1.0;
        for_box(t, box, global, fill_constant, &c);
        break;
    case DDL_INIT_ZEROS:
    case DDL_INIT_NONE:
        ddl_tensor_zero(t);
        break;
    }
}

void ddl_fill_global_uniform(ddl_tensor_t *t, const ddl_box *box, const ddl_shape *global,
                             uint64_t seed, uint64_t stream)
{
    fill_ctx c = {.seed = seed, .stream = stream, .bound = 1.0};
    for_box(t, box, global, fill_uniform, &c);
}

