// engine/layer_registry.c: every layer type a model spec may use, one section each: how
// its keys are parsed and its output inferred, how it is built, what memory it needs; the
// table at the end lists them. The parser (spec.c), the model (model.c) and the estimate
// (estimate.c) know layer types only through this table.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/check.h"
#include "ddl/base.h"
#include "ddl/kernels.h"
#include "engine/layer_registry.h"
#include "layers/layer_impl.h"

// "<path>.<key>", the key path of a message.
static void key_path(char *out, size_t n, const char *path, const char *key)
{
    snprintf(out, n, "%s.%s", path, key);
}

static bool always(json_t *o)
{
    (void)o;
    return true;
}

// The optional KEY (in_channels, in_features) restates dimension 1 of the tensor coming in,
// `what` in the message: it may be left out, and must match when given (up to max).
static ddl_status spec_check_dim1(spec_pctx *c, json_t *o, const char *path, const char *key,
                                  int64_t max, const ddl_shape *cur, const char *what)
{
    int64_t v = cur->d[1];
    DDL_CHECK(spec_get_int(c, o, path, key, false, 1, max, &v));
    if (v != cur->d[1]) {
        char p[96], sbuf[128];
        key_path(p, sizeof p, path, key);
        return spec_fail(c, p, "%lld does not match the %lld %s of the tensor %s", (long long)v,
                         (long long)cur->d[1], what, spec_shape_str(cur, sbuf, sizeof sbuf));
    }
    return DDL_OK;
}

// ---- repartition, flatten -------------------------------------------------------------

static ddl_status reshape_parse(spec_pctx *c, json_t *o, const char *path, spec_layer *L)
{
    ddl_spec_t      *s   = c->s;
    const ddl_shape *cur = &L->x_global;
    char             sbuf[128];
    static const char *const keys[] = {"type", "name", "P_x", "from", "to", NULL};
    DDL_CHECK(spec_check_keys(c, o, path, keys));
    int to = -1;
    DDL_CHECK(spec_get_partition(c, o, path, "to", true, &to));
    if (L->type[0] == 'f') {
        if (cur->ndim < 3) {
            return spec_fail(c, path, "flatten needs [N, C, spatial...], the tensor here is %s",
                             spec_shape_str(cur, sbuf, sizeof sbuf));
        }
        int64_t f = 1;  // <= numel(cur), already within the tensor cap
        for (int d = 1; d < cur->ndim; d++) {
            f *= cur->d[d];
        }
        L->y_global = ddl_shape_make(2, (int64_t[]){cur->d[0], f});
        // Flatten is local: the input may split only batch and channels, and the output
        // partition must be the same ranks as [P_n, P_c].
        const spec_partition *pi = &s->parts[L->P_in], *po = &s->parts[to];
        bool ok = pi->ndim == cur->ndim && po->ndim == 2 && pi->nranks == po->nranks &&
                  pi->shape[0] == po->shape[0] && pi->shape[1] == po->shape[1];
        for (int d = 2; ok && d < pi->ndim; d++) {
            ok = pi->shape[d] == 1;
        }
        for (int r = 0; ok && r < pi->nranks; r++) {
            ok = pi->ranks[r] == po->ranks[r];
        }
        if (!ok) {
            return spec_fail(c, path, "flatten is local: the tensor's partition \"%s\" must split "
                                      "only batch and channels, over the same ranks as \"%s\" "
                                      "[P_n, P_c]; insert a repartition first",
                             pi->name, po->name);
        }
    }
    if (s->parts[to].ndim != L->y_global.ndim) {
        char p[96];
        key_path(p, sizeof p, path, "to");
        return spec_fail(c, p, "partition \"%s\" has %d dims, the tensor %s has %d",
                         s->parts[to].name, s->parts[to].ndim,
                         spec_shape_str(&L->y_global, sbuf, sizeof sbuf), L->y_global.ndim);
    }
    if (L->type[0] == 'r') {
        // DistDL's rule (the Repartition primitive's): a dimension of global size 1 is not
        // split, e.g. global pooling's output on a spatially split partition.
        for (int d = 0; d < cur->ndim; d++) {
            int P = s->parts[L->P_in].shape[d] > 1 ? L->P_in : to;
            if (cur->d[d] == 1 && s->parts[P].shape[d] > 1) {
                return spec_fail(c, path, "the tensor %s has size 1 in dim %d, which partition "
                                          "\"%s\" splits %d ways; a repartition cannot move a "
                                          "dimension of size 1 that is split (repartition "
                                          "before the layer that made it size 1)",
                                 spec_shape_str(cur, sbuf, sizeof sbuf), d, s->parts[P].name,
                                 s->parts[P].shape[d]);
            }
        }
    }
    L->P_out = to;
    return DDL_OK;
}

static ddl_status repartition_build(const spec_build_ctx *b, const spec_layer *L,
                                    ddl_layer_t **out)
{
    return ddl_repartition_layer_create(b->parts[L->P_in], b->parts[L->P_out], b->s->dt,
                                        &L->x_global, out);
}

static ddl_status flatten_build(const spec_build_ctx *b, const spec_layer *L, ddl_layer_t **out)
{
    return ddl_flatten_create(b->parts[L->P_in], b->parts[L->P_out], b->s->dt, &L->x_global, out);
}

// ---- conv1d|2d|3d, maxpool1d|2d|3d, avgpool1d|2d|3d ----------------------------------------

// The digit of "<stem><1|2|3>d".
static int spatial_dims(const char *type)
{
    size_t n = strlen(type);
    return n >= 2 ? type[n - 2] - '0' : 0;
}

static ddl_status conv_parse(spec_pctx *c, json_t *o, const char *path, spec_layer *L)
{
    const ddl_shape *cur  = &L->x_global;
    const char      *type = L->type;
    int              nsp  = spatial_dims(type);
    char             sbuf[128];
    static const char *const keys[] = {"type", "name", "P_x", "from", "P_y", "P_w",
                                       "in_channels", "out_channels", "kernel", "stride",
                                       "padding", "dilation", "bias", NULL};
    DDL_CHECK(spec_check_keys(c, o, path, keys));
    if (cur->ndim != nsp + 2) {
        return spec_fail(c, path, "%s needs a tensor [N, C, %d spatial], the tensor here is %s",
                         type, nsp, spec_shape_str(cur, sbuf, sizeof sbuf));
    }
    ddl_conv_params *cp = &L->conv;
    cp->nsp             = nsp;
    cp->in_channels     = cur->d[1];
    cp->bias            = true;
    DDL_CHECK(spec_check_dim1(c, o, path, "in_channels", 1LL << 30, cur, "channels"));
    DDL_CHECK(spec_get_int(c, o, path, "out_channels", true, 1, 1LL << 30, &cp->out_channels));
    DDL_CHECK(spec_parse_spatial(c, o, path, "kernel", true, nsp, 1, 1, cp->kernel));
    DDL_CHECK(spec_parse_spatial(c, o, path, "stride", false, nsp, 1, 1, cp->stride));
    DDL_CHECK(spec_parse_spatial(c, o, path, "padding", false, nsp, 0, 0, cp->padding));
    DDL_CHECK(spec_parse_spatial(c, o, path, "dilation", false, nsp, 1, 1, cp->dilation));
    DDL_CHECK(spec_get_bool(c, o, path, "bias", &cp->bias));
    ddl_shape wshape = {.ndim = 2 + nsp, .d = {cp->out_channels, cp->in_channels}};
    for (int d = 0; d < nsp; d++) {
        wshape.d[2 + d] = cp->kernel[d];
    }
    DDL_CHECK(spec_check_size(c, path, "the weight", &wshape));
    DDL_CHECK(spec_get_partition(c, o, path, "P_y", false, &L->P_y_given));
    DDL_CHECK(spec_get_partition(c, o, path, "P_w", false, &L->P_w));
    if ((L->P_y_given < 0) != (L->P_w < 0)) {
        return spec_fail(c, path, "give both P_y and P_w (channel or general conv) or neither "
                                  "(feature conv)");
    }
    L->y_global      = *cur;
    L->y_global.d[1] = cp->out_channels;
    for (int d = 0; d < nsp; d++) {
        int64_t span =
            cur->d[2 + d] + 2 * cp->padding[d] - cp->dilation[d] * (cp->kernel[d] - 1) - 1;
        if (span < 0) {
            return spec_fail(c, path, "the window (kernel %lld, dilation %lld) is larger than "
                                      "the padded input length %lld in spatial dim %d",
                             (long long)cp->kernel[d], (long long)cp->dilation[d],
                             (long long)(cur->d[2 + d] + 2 * cp->padding[d]), d);
        }
        L->y_global.d[2 + d] = span / cp->stride[d] + 1;
    }
    if (L->P_y_given >= 0) {
        L->P_out = L->P_y_given;
    }
    L->has_params = true;
    return DDL_OK;
}

static ddl_status conv_build(const spec_build_ctx *b, const spec_layer *L, ddl_layer_t **out)
{
    return ddl_conv_create(b->parts[L->P_in], L->P_y_given >= 0 ? b->parts[L->P_out] : NULL,
                           L->P_w >= 0 ? b->parts[L->P_w] : NULL, b->s->dt, &L->x_global,
                           &L->conv, out);
}

static ddl_status pool_parse(spec_pctx *c, json_t *o, const char *path, spec_layer *L)
{
    const ddl_shape *cur  = &L->x_global;
    const char      *type = L->type;
    int              nsp  = spatial_dims(type);
    char             sbuf[128];
    static const char *const keys[] = {"type",   "name",    "P_x",      "from",
                                       "kernel", "stride", "padding", "dilation", NULL};
    DDL_CHECK(spec_check_keys(c, o, path, keys));
    ddl_pool_params *pp = &L->pool;
    pp->nsp             = nsp;
    pp->kind            = type[0] == 'm' ? DDL_POOL_MAX : DDL_POOL_AVG;
    if (cur->ndim != nsp + 2) {
        return spec_fail(c, path, "%s needs a tensor [N, C, %d spatial], the tensor here is %s",
                         type, nsp, spec_shape_str(cur, sbuf, sizeof sbuf));
    }
    DDL_CHECK(spec_parse_spatial(c, o, path, "kernel", true, nsp, 1, 1, pp->kernel));
    DDL_CHECK(spec_parse_spatial(c, o, path, "stride", false, nsp, 1, 0, pp->stride));
    DDL_CHECK(spec_parse_spatial(c, o, path, "padding", false, nsp, 0, 0, pp->padding));
    DDL_CHECK(spec_parse_spatial(c, o, path, "dilation", false, nsp, 1, 1, pp->dilation));
    L->y_global = *cur;
    for (int d = 0; d < nsp; d++) {
        int64_t st = pp->stride[d] ? pp->stride[d] : pp->kernel[d];
        int64_t span =
            cur->d[2 + d] + 2 * pp->padding[d] - pp->dilation[d] * (pp->kernel[d] - 1) - 1;
        if (span < 0) {
            return spec_fail(c, path,
                             "the window is larger than the padded input in spatial dim %d", d);
        }
        L->y_global.d[2 + d] = span / st + 1;
    }
    return DDL_OK;
}

static ddl_status pool_build(const spec_build_ctx *b, const spec_layer *L, ddl_layer_t **out)
{
    return ddl_pool_create(b->parts[L->P_in], b->s->dt, &L->x_global, &L->pool, out);
}

// True when P splits a spatial dimension of x (a conv's halo layouts).
static bool splits_space(const ddl_spec_t *s, const spec_layer *L)
{
    for (int d = 2; d < L->x_global.ndim; d++) {
        if (spec_est_part_dim(s, L->P_in, d) > 1) {
            return true;
        }
    }
    return false;
}

// im2col columns (conv) or pooling indices, from the kernels' own workspace functions on
// the largest local block (with its halo). in_place: a conv reading its padded input in
// the shared scratch in place (conv_setup: x_tail).
static double kernel_workspace(const ddl_spec_t *s, const spec_layer *L, bool conv, bool in_place)
{
    const ddl_shape *x   = &L->x_global;
    int              nsp = x->ndim - 2;
    if (nsp < 1 || nsp > 3) {
        return 0;
    }
    int64_t N = (int64_t)spec_est_ceil_div((double)x->d[0], spec_est_part_dim(s, L->P_in, 0));
    int64_t C = (int64_t)spec_est_ceil_div((double)x->d[1], spec_est_part_dim(s, L->P_in, 1));
    int64_t in[3], k[3], st[3], pad[3], dil[3];
    bool    halo_bufs = conv && splits_space(s, L); // conv_setup's halo buffers
    for (int j = 0; j < nsp; j++) {
        const int64_t *kk = conv ? L->conv.kernel : L->pool.kernel;
        const int64_t *dd = conv ? L->conv.dilation : L->pool.dilation;
        k[j]              = kk[j];
        dil[j]            = dd[j] > 0 ? dd[j] : 1;
        st[j]  = conv ? L->conv.stride[j] : L->pool.stride[j] ? L->pool.stride[j] : k[j];
        // A split dimension: the local kernel runs unpadded on the block and its halo;
        // otherwise on the whole extent with the layer's padding, or, for a conv that
        // splits another dimension, unpadded on the extent padded in its halo buffer
        // (conv_setup).
        bool    split = spec_est_part_dim(s, L->P_in, 2 + j) > 1;
        int64_t p0    = conv ? L->conv.padding[j] : L->pool.padding[j];
        bool    held  = !split && halo_bufs;
        pad[j]        = split || held ? 0 : p0;
        in[j] =
            (int64_t)spec_est_ceil_div((double)x->d[2 + j], spec_est_part_dim(s, L->P_in, 2 + j)) +
            (split  ? (k[j] - 1) * dil[j]
             : held ? 2 * p0
                    : 0);
        if (st[j] <= 0) {
            st[j] = 1;
        }
    }
    if (conv) {
        ddl_conv_geom g;
        int64_t       co = (int64_t)spec_est_ceil_div((double)L->conv.out_channels,
                                                      spec_est_part_dim(s, L->P_in, 1));
        if (ddl_conv_geom_init(&g, nsp, N, C, co, in, k, st, pad, dil) != DDL_OK) {
            ddl_clear_error();
            return 0;
        }
        g.x_tail = in_place ? ddl_conv_x_tail_need(s->dt, &g) : 0;
        return (double)ddl_conv_workspace_bytes(s->dt, &g);
    }
    ddl_pool_geom g;
    if (ddl_pool_geom_init(&g, L->pool.kind, nsp, N, C, in, k, st, pad, dil) != DDL_OK) {
        ddl_clear_error();
        return 0;
    }
    return (double)ddl_pool_workspace_bytes(&g);
}

// x's halo-padded buffers and needed crops (conv and pool): `n` each, or with `shared`
// >= 0 one of each and `shared` bytes more in the shared scratch (spec_est_add_halo).
static void add_window_halo(spec_est *e, const spec_layer *L, bool conv, double n, double shared)
{
    int64_t k[3] = {1, 1, 1}, st[3] = {1, 1, 1}, pad[3] = {0, 0, 0}, dil[3] = {1, 1, 1};
    for (int j = 0; j < L->x_global.ndim - 2 && j < 3; j++) {
        k[j]   = conv ? L->conv.kernel[j] : L->pool.kernel[j];
        st[j]  = conv ? L->conv.stride[j] : L->pool.stride[j] ? L->pool.stride[j] : k[j];
        pad[j] = conv ? L->conv.padding[j] : L->pool.padding[j];
        dil[j] = conv ? L->conv.dilation[j] : L->pool.dilation[j];
        st[j]  = st[j] > 0 ? st[j] : 1;
        dil[j] = dil[j] > 0 ? dil[j] : 1;
    }
    spec_est_add_halo(e, L->P_in, &L->x_global, k, st, pad, dil, n, n, shared);
}

// What conv_setup (layers/conv.c) allocates on each rank:
// - the parameter blocks; in the halo layouts (P_x splits space) a working copy of the
//   weight block, its gradient and the gathered gradient besides (three blocks);
// - in the halo layouts, x's halo-padded buffer and its gradient's, and the crops of both
//   where the window needs only part of the buffer;
// - in the channel and general layouts (P_w given), the fans' blocks on P_w: x's block
//   broadcast down the output channels and its gradient, y's partial block and its
//   gradient;
// - the kernel's workspace.
// A short-batch copy keeps the working weight, the x side and the y block, and borrows
// the workspace (conv_forward_only).
static void conv_estimate(spec_est *e, const spec_layer *L)
{
    const ddl_spec_t *s  = spec_est_spec(e);
    double            kp = 1;
    for (int j = 0; j < L->x_global.ndim - 2; j++) {
        kp *= (double)L->conv.kernel[j];
    }
    int    Pw = L->P_w >= 0 ? L->P_w : L->P_in;
    double w  = (double)L->conv.out_channels * (double)L->x_global.d[1] * kp;
    double b  = L->conv.bias ? (double)L->conv.out_channels : 0;
    double sp = L->P_w >= 0 ? (double)spec_est_part_dim(s, Pw, 0) * spec_est_part_dim(s, Pw, 1) : 1;
    bool   halo = splits_space(s, L), copy = spec_est_copy(e);
    double n = copy ? 1 : 2; // a buffer and (not in a copy) its gradient
    spec_est_add_param(e, Pw, spec_est_ceil_div(w + b, sp), halo ? (copy ? 1 : 1.5) : 0);
    // The feature layer (no P_w) keeps its workspace in the shared scratch, and its padded
    // input and crop when the input is large (their gradients over the same bytes), or in
    // a copy (conv_setup). A small input's halo buffers in the model are its own.
    double ranks = L->P_in >= 0 && L->P_in < s->nparts ? s->parts[L->P_in].nranks : 1;
    double big   = spec_est_local_numel(s, &L->x_global, -1) * spec_est_item(e) / ranks >=
                 s->tuning.share_min_bytes;
    if (L->P_w < 0 && spec_est_shares(e)) {
        bool   in_block = !halo || big || copy;
        double ws       = kernel_workspace(s, L, true, halo && in_block);
        if (halo && in_block) {
            add_window_halo(e, L, true, 1, ws);
            return;
        }
        if (halo) {
            add_window_halo(e, L, true, n, -1);
        }
        spec_est_scratch(e, L->P_in, ws);
        return;
    }
    if (halo) {
        add_window_halo(e, L, true, n, -1);
    }
    if (L->P_w >= 0) {
        double xs = spec_est_local_numel(s, &L->x_global, L->P_in) /
                    spec_est_ceil_div((double)L->x_global.d[1], spec_est_part_dim(s, L->P_in, 1));
        double ys = spec_est_local_numel(s, &L->y_global, L->P_out) /
                    spec_est_ceil_div((double)L->y_global.d[1], spec_est_part_dim(s, L->P_out, 1));
        double ci = spec_est_ceil_div((double)L->x_global.d[1], spec_est_part_dim(s, Pw, 1));
        double co = spec_est_ceil_div((double)L->conv.out_channels, spec_est_part_dim(s, Pw, 0));
        spec_est_add(e, Pw, SPEC_E_WORK, n * (xs * ci + ys * co) * spec_est_item(e));
    }
    if (!copy) {
        spec_est_add(e, Pw, SPEC_E_WORK, kernel_workspace(s, L, true, false));
    }
}

// pool_setup (layers/pool.c): on more than one rank, x's halo-padded buffer and its
// gradient's (and their crops); the kernel's workspace.
static void pool_estimate(spec_est *e, const spec_layer *L)
{
    const ddl_spec_t *s     = spec_est_spec(e);
    bool              alone = L->P_in < 0 || L->P_in >= s->nparts || s->parts[L->P_in].nranks <= 1;
    if (!alone) {
        // Shared: [padded x | crop] in forward, their gradients over them in backward.
        add_window_halo(e, L, false, spec_est_copy(e) ? 1 : 2, spec_est_shares(e) ? 0 : -1);
    }
    spec_est_add(e, L->P_in, SPEC_E_WORK, kernel_workspace(s, L, false, false));
}

// ---- adaptive_avgpool1d|2d|3d ------------------------------------------------------------

// output_size 1 everywhere: global average pooling (on any partition); otherwise an
// average pool whose kernel and stride are in / out, when every size divides.
static ddl_status adaptive_parse(spec_pctx *c, json_t *o, const char *path, spec_layer *L)
{
    const ddl_shape *cur = &L->x_global;
    int              nsp = spatial_dims(L->type);
    char             sbuf[128], p[96];
    static const char *const keys[] = {"type", "name", "P_x", "from", "output_size", NULL};
    DDL_CHECK(spec_check_keys(c, o, path, keys));
    if (cur->ndim != nsp + 2) {
        return spec_fail(c, path, "%s needs a tensor [N, C, %d spatial], the tensor here is %s",
                         L->type, nsp, spec_shape_str(cur, sbuf, sizeof sbuf));
    }
    int64_t out[3] = {0, 0, 0};
    key_path(p, sizeof p, path, "output_size");
    json_t *os = json_object_get(o, "output_size");
    if (os == NULL) {
        return spec_fail(c, p, "missing (required)");
    }
    if (json_is_integer(os)) {
        if (json_integer_value(os) < 1 || json_integer_value(os) > DDL_MAX_TENSOR_ELEMENTS) {
            return spec_fail(c, p, "%lld is outside [1, %lld]", (long long)json_integer_value(os),
                             (long long)DDL_MAX_TENSOR_ELEMENTS);
        }
        for (int d = 0; d < nsp; d++) {
            out[d] = json_integer_value(os);
        }
    } else {
        DDL_CHECK(spec_parse_spatial(c, o, path, "output_size", true, nsp, 1, 1, out));
    }
    bool global = true;
    for (int d = 0; d < nsp; d++) {
        global = global && out[d] == 1;
    }
    L->y_global = *cur;
    for (int d = 0; d < nsp; d++) {
        L->y_global.d[2 + d] = out[d];
    }
    if (global) {
        L->global_pool = true;
        return DDL_OK;
    }
    ddl_pool_params *pp = &L->pool;
    pp->nsp             = nsp;
    pp->kind            = DDL_POOL_AVG;
    for (int d = 0; d < nsp; d++) {
        if (cur->d[2 + d] % out[d] != 0) {
            return spec_fail(c, p, "output size %lld does not divide the input size %lld of "
                                   "spatial dim %d (the tensor %s); only output size 1 or a "
                                   "divisor is supported",
                             (long long)out[d], (long long)cur->d[2 + d], d,
                             spec_shape_str(cur, sbuf, sizeof sbuf));
        }
        pp->kernel[d]   = cur->d[2 + d] / out[d];
        pp->stride[d]   = pp->kernel[d];
        pp->padding[d]  = 0;
        pp->dilation[d] = 1;
    }
    return DDL_OK;
}

static ddl_status adaptive_build(const spec_build_ctx *b, const spec_layer *L, ddl_layer_t **out)
{
    if (!L->global_pool) {
        return pool_build(b, L, out);
    }
    return ddl_global_avgpool_create(b->parts[L->P_in], b->s->dt, &L->x_global, out);
}

static void adaptive_estimate(spec_est *e, const spec_layer *L)
{
    if (!L->global_pool) {
        pool_estimate(e, L);
    }
    // Global pooling keeps per-channel partial sums only.
}

// ---- linear ------------------------------------------------------------------------------

static ddl_status linear_parse(spec_pctx *c, json_t *o, const char *path, spec_layer *L)
{
    const ddl_shape *cur = &L->x_global;
    char             sbuf[128];
    static const char *const keys[] = {"type", "name", "P_x", "from", "P_y", "P_w",
                                       "in_features", "out_features", "bias", NULL};
    DDL_CHECK(spec_check_keys(c, o, path, keys));
    if (cur->ndim != 2) {
        return spec_fail(c, path, "linear needs a tensor [batch, features], the tensor here is "
                                  "%s (flatten it first)",
                         spec_shape_str(cur, sbuf, sizeof sbuf));
    }
    DDL_CHECK(spec_check_dim1(c, o, path, "in_features", DDL_MAX_TENSOR_ELEMENTS, cur, "features"));
    DDL_CHECK(spec_get_int(c, o, path, "out_features", true, 1, DDL_MAX_TENSOR_ELEMENTS,
                           &L->out_features));
    DDL_CHECK(spec_check_size(c, path, "the weight",
                              &(ddl_shape){.ndim = 2, .d = {L->out_features, cur->d[1]}}));
    L->bias = true;
    DDL_CHECK(spec_get_bool(c, o, path, "bias", &L->bias));
    DDL_CHECK(spec_get_partition(c, o, path, "P_y", true, &L->P_out));
    DDL_CHECK(spec_get_partition(c, o, path, "P_w", true, &L->P_w));
    L->y_global   = ddl_shape_make(2, (int64_t[]){cur->d[0], L->out_features});
    L->has_params = true;
    return DDL_OK;
}

static ddl_status linear_build(const spec_build_ctx *b, const spec_layer *L, ddl_layer_t **out)
{
    return ddl_linear_create(b->parts[L->P_in], b->parts[L->P_out], b->parts[L->P_w], b->s->dt,
                             L->x_global.d[0], L->x_global.d[1], L->out_features, L->bias, out);
}

static void linear_estimate(spec_est *e, const spec_layer *L)
{
    // W [out, in] on P_w = [a, b]; x broadcast to [batch, in/b], y reduced from
    // [batch, out/a] blocks.
    const ddl_spec_t *s  = spec_est_spec(e);
    double            fo = spec_est_ceil_div((double)L->out_features, spec_est_part_dim(s, L->P_w, 0));
    double fi = spec_est_ceil_div((double)L->x_global.d[1], spec_est_part_dim(s, L->P_w, 1));
    spec_est_add_param(e, L->P_w, fo * fi + (L->bias ? fo : 0), 0);
    spec_est_add(e, L->P_w, SPEC_E_WORK, (double)L->x_global.d[0] * (2 * fi + fo) * spec_est_item(e));
}

// ---- relu, leaky_relu, sigmoid, tanh, gelu, dropout ---------------------------------------

static ddl_status activation_parse(spec_pctx *c, json_t *o, const char *path, spec_layer *L)
{
    const char *type = L->type;
    static const char *const keys[] = {"type", "name", "P_x", "from", "negative_slope", "p", NULL};
    DDL_CHECK(spec_check_keys(c, o, path, keys));
    static const struct {
        const char  *n;
        ddl_act_kind k;
    } acts[] = {{"relu", DDL_ACT_RELU},       {"leaky_relu", DDL_ACT_LEAKY_RELU},
                {"sigmoid", DDL_ACT_SIGMOID}, {"tanh", DDL_ACT_TANH},
                {"gelu", DDL_ACT_GELU},       {"dropout", DDL_ACT_DROPOUT}};
    for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++) {
        if (strcmp(type, acts[i].n) == 0) {
            L->act = acts[i].k;
        }
    }
    L->alpha = L->act == DDL_ACT_LEAKY_RELU ? 0.01 : 0.5;
    DDL_CHECK(spec_get_num(c, o, path, L->act == DDL_ACT_DROPOUT ? "p" : "negative_slope", false,
                           L->act == DDL_ACT_DROPOUT ? 0.0 : -1e9,
                           L->act == DDL_ACT_DROPOUT ? 0.999999 : 1e9, &L->alpha));
    if (L->act != DDL_ACT_DROPOUT && json_object_get(o, "p") != NULL) {
        char p[96];
        key_path(p, sizeof p, path, "p");
        return spec_fail(c, p, "only dropout takes \"p\"");
    }
    if (L->act != DDL_ACT_LEAKY_RELU && json_object_get(o, "negative_slope") != NULL) {
        char p[96];
        key_path(p, sizeof p, path, "negative_slope");
        return spec_fail(c, p, "only leaky_relu takes \"negative_slope\"");
    }
    return DDL_OK;
}

static ddl_status activation_build(const spec_build_ctx *b, const spec_layer *L,
                                   ddl_layer_t **out)
{
    return ddl_activation_create(b->parts[L->P_in], b->s->dt, &L->x_global, L->act, L->alpha,
                                 b->s->seed + 7919u * (uint64_t)(b->index + 1), out);
}

static void activation_estimate(spec_est *e, const spec_layer *L)
{
    // Only dropout keeps state of its own: a byte per element (its mask).
    if (L->act == DDL_ACT_DROPOUT) {
        const ddl_spec_t *s = spec_est_spec(e);
        spec_est_add(e, L->P_in, SPEC_E_WORK, spec_est_local_numel(s, &L->x_global, L->P_in));
    }
}

// ---- batchnorm ---------------------------------------------------------------------------

static bool batchnorm_has_params(json_t *o)
{
    return !json_is_false(json_object_get(o, "affine"));
}

static ddl_status batchnorm_parse(spec_pctx *c, json_t *o, const char *path, spec_layer *L)
{
    static const char *const keys[] = {"type", "name", "P_x", "from", "eps", "momentum",
                                       "affine", NULL};
    DDL_CHECK(spec_check_keys(c, o, path, keys));
    L->eps = 1e-5, L->momentum = 0.1, L->affine = true;
    DDL_CHECK(spec_get_num(c, o, path, "eps", false, 1e-300, 1.0, &L->eps));
    if (json_is_null(json_object_get(o, "momentum"))) {
        L->momentum = -1.0;
    } else {
        DDL_CHECK(spec_get_num(c, o, path, "momentum", false, 0.0, 1.0, &L->momentum));
    }
    DDL_CHECK(spec_get_bool(c, o, path, "affine", &L->affine));
    if (L->x_global.ndim < 2) {
        return spec_fail(c, path, "batchnorm needs [N, C, ...]");
    }
    L->has_params = L->affine;
    return DDL_OK;
}

static ddl_status batchnorm_build(const spec_build_ctx *b, const spec_layer *L,
                                  ddl_layer_t **out)
{
    return ddl_batchnorm_create(b->parts[L->P_in], b->s->dt, &L->x_global, L->eps, L->momentum,
                                L->affine, out);
}

static void batchnorm_estimate(spec_est *e, const spec_layer *L)
{
    const ddl_spec_t *s    = spec_est_spec(e);
    double            c    = spec_est_ceil_div((double)L->x_global.d[1], spec_est_part_dim(s, L->P_in, 1));
    double            item = spec_est_item(e);
    if (L->affine) {
        spec_est_add_param(e, L->P_in, 2 * c, 0);
    }
    // The per-channel vectors: the layer saves x and y by reference (layers/batchnorm.c).
    spec_est_add(e, L->P_in, SPEC_E_WORK, 2 * c * item);
}

static ddl_status batchnorm_buffers(const ddl_layer_t *L, ddl_tensor_t **out)
{
    return ddl_batchnorm_running_stats(L, &out[0], &out[1]);
}

// ---- upsample ----------------------------------------------------------------------------

static ddl_status upsample_parse(spec_pctx *c, json_t *o, const char *path, spec_layer *L)
{
    const ddl_shape *cur = &L->x_global;
    static const char *const keys[] = {"type", "name", "P_x", "from", "mode", "align_corners",
                                       "scale_factor", "size", NULL};
    DDL_CHECK(spec_check_keys(c, o, path, keys));
    const char *mode = "nearest";
    DDL_CHECK(spec_get_str(c, o, path, "mode", false, &mode));
    if (strcmp(mode, "nearest") != 0 && strcmp(mode, "linear") != 0) {
        char p[96];
        key_path(p, sizeof p, path, "mode");
        return spec_fail(c, p, "\"%s\" is not nearest or linear", mode);
    }
    L->mode = mode[0] == 'n' ? DDL_UPSAMPLE_NEAREST : DDL_UPSAMPLE_LINEAR;
    DDL_CHECK(spec_get_bool(c, o, path, "align_corners", &L->align_corners));
    int ns = cur->ndim - 2;
    if (ns < 1 || ns > 3) {
        return spec_fail(c, path, "upsample needs [N, C, 1 to 3 spatial dims]");
    }
    json_t *sf = json_object_get(o, "scale_factor");
    if ((sf == NULL) == (json_object_get(o, "size") == NULL)) {
        return spec_fail(c, path, "give exactly one of \"scale_factor\" and \"size\"");
    }
    L->y_global = *cur;
    if (sf != NULL) {
        L->has_scale = true;
        for (int d = 0; d < ns; d++) {
            json_t *e = json_is_array(sf) ? json_array_get(sf, (size_t)d) : sf;
            char    p[96];
            key_path(p, sizeof p, path, "scale_factor");
            if (!json_is_number(e) || !(json_number_value(e) > 0) ||
                (json_is_array(sf) && json_array_size(sf) != (size_t)ns)) {
                return spec_fail(c, p, "must be a positive number or %d of them", ns);
            }
            if (json_number_value(e) > SPEC_MAX_SCALE) {
                return spec_fail(c, p, "%g is outside (0, %g]", json_number_value(e),
                                 SPEC_MAX_SCALE);
            }
            L->scale[d]          = json_number_value(e);
            L->y_global.d[2 + d] = (int64_t)floor((double)cur->d[2 + d] * L->scale[d]);
        }
    } else {
        DDL_CHECK(spec_parse_spatial(c, o, path, "size", true, ns, 1, 1, L->size));
        for (int d = 0; d < ns; d++) {
            L->y_global.d[2 + d] = L->size[d];
        }
    }
    return DDL_OK;
}

// upsample (layers/upsample.c): the per-call buffers of its busiest rank, by the layer's
// own plan (the input window its output box reads when that is not within its own
// block, and the send and receive staging). They live within one call: in the shared
// scratch, or its own. A rank whose window is its own block gathers nothing.
static void upsample_estimate(spec_est *e, const spec_layer *L)
{
    const ddl_spec_t *s = spec_est_spec(e);
    int               pshape[DDL_MAX_DIMS];
    size_t            bytes;
    for (int d = 0; d < L->x_global.ndim; d++) {
        pshape[d] = spec_est_part_dim(s, L->P_in, d);
    }
    // The parse made the same checks as the layer's, so this cannot fail on a parsed spec.
    if (ddl_upsample_scratch_bytes(s->dt, &L->x_global, pshape, L->mode, L->align_corners,
                                   L->has_scale ? L->scale : NULL, L->has_scale ? NULL : L->size,
                                   &bytes) != DDL_OK ||
        bytes == 0) {
        return;
    }
    if (spec_est_shares(e)) {
        spec_est_scratch(e, L->P_in, (double)bytes);
    } else {
        spec_est_add(e, L->P_in, SPEC_E_WORK, (double)bytes);
    }
}

static ddl_status upsample_build(const spec_build_ctx *b, const spec_layer *L, ddl_layer_t **out)
{
    return ddl_upsample_create(b->parts[L->P_in], b->s->dt, &L->x_global, L->mode,
                               L->align_corners, L->has_scale ? L->scale : NULL,
                               L->has_scale ? NULL : L->size, out);
}

// ---- add, concat (joins) -----------------------------------------------------------------

// "name" [shape] on "partition", for messages naming an operand.
static const char *operand_str(const ddl_spec_t *s, int n, char *buf, size_t len)
{
    char sh[128];
    spec_shape_str(spec_node_shape(s, n), sh, sizeof sh);
    snprintf(buf, len, "\"%s\" %s on \"%s\"", n == SPEC_INPUT ? "input" : s->layers[n].name, sh,
             s->parts[spec_node_partition(s, n)].name);
    return buf;
}

// Every operand on operand 0's partition; add: the same shape; concat: the same shape
// except dim 1, which the partition must not split.
static ddl_status join_parse(spec_pctx *c, json_t *o, const char *path, spec_layer *L)
{
    const ddl_spec_t *s   = c->s;
    bool              cat = strcmp(L->type, "concat") == 0;
    char              a[400], b[400], p[96];
    static const char *const keys[] = {"type", "name", "P_x", "from", NULL};
    DDL_CHECK(spec_check_keys(c, o, path, keys));
    key_path(p, sizeof p, path, "from");
    const ddl_shape *x0 = spec_node_shape(s, L->in[0]);
    int64_t          ch = 0;
    for (int k = 0; k < L->nin; k++) {
        const ddl_shape *xk = spec_node_shape(s, L->in[k]);
        bool             same = xk->ndim == x0->ndim;
        for (int d = 0; same && d < x0->ndim; d++) {
            same = xk->d[d] == x0->d[d] || (cat && d == 1);
        }
        if (spec_node_partition(s, L->in[k]) != L->P_in) {
            return spec_fail(c, p, "%s operands must be on one partition: %s and %s differ "
                                   "(insert a repartition)",
                             L->type, operand_str(s, L->in[0], a, sizeof a),
                             operand_str(s, L->in[k], b, sizeof b));
        }
        if (!same) {
            return spec_fail(c, p, "%s operands must have %s: %s and %s differ", L->type,
                             cat ? "the same shape except in dim 1 (channels)" : "the same shape",
                             operand_str(s, L->in[0], a, sizeof a),
                             operand_str(s, L->in[k], b, sizeof b));
        }
        ch += xk->d[1 < xk->ndim ? 1 : 0];
    }
    if (cat) {
        const spec_partition *P = &s->parts[L->P_in];
        if (x0->ndim < 2) {
            return spec_fail(c, p, "concat joins along dim 1: the operands %s have no dim 1",
                             operand_str(s, L->in[0], a, sizeof a));
        }
        if (P->ndim > 1 && P->shape[1] != 1) {
            return spec_fail(c, p, "concat joins along dim 1 (channels), which partition \"%s\" "
                                   "splits %d ways; repartition the operands onto a partition "
                                   "that does not split channels",
                             P->name, P->shape[1]);
        }
        L->y_global.d[1] = ch;
    }
    return DDL_OK;
}

static ddl_status add_build(const spec_build_ctx *b, const spec_layer *L, ddl_layer_t **out)
{
    return ddl_add_create(b->parts[L->P_in], b->s->dt, &L->x_global, L->nin, out);
}

static ddl_status concat_build(const spec_build_ctx *b, const spec_layer *L, ddl_layer_t **out)
{
    ddl_shape xs[SPEC_MAX_INPUTS];
    for (int k = 0; k < L->nin; k++) {
        xs[k] = *spec_node_shape(b->s, L->in[k]);
    }
    return ddl_concat_create(b->parts[L->P_in], b->s->dt, L->nin, xs, out);
}

static void none_estimate(spec_est *e, const spec_layer *L)
{
    (void)e, (void)L;
}

// ---- the table ---------------------------------------------------------------------------

#define TYPES(...) ((const char *const[]){__VA_ARGS__, NULL})

static const spec_layer_kind kinds[] = {
    {TYPES("repartition"), "repartition", "repartition", 1, 1, NULL, reshape_parse,
     repartition_build, none_estimate, NULL, NULL},
    {TYPES("flatten"), "flatten", "flatten", 1, 1, NULL, reshape_parse, flatten_build,
     none_estimate, NULL, NULL},
    {TYPES("conv1d", "conv2d", "conv3d"), "conv1d|2d|3d", "conv", 1, 1, always, conv_parse,
     conv_build, conv_estimate, NULL, NULL},
    {TYPES("maxpool1d", "maxpool2d", "maxpool3d"), "maxpool1d|2d|3d", "pool", 1, 1, NULL,
     pool_parse, pool_build, pool_estimate, NULL, NULL},
    {TYPES("avgpool1d", "avgpool2d", "avgpool3d"), "avgpool1d|2d|3d", "pool", 1, 1, NULL,
     pool_parse, pool_build, pool_estimate, NULL, NULL},
    {TYPES("adaptive_avgpool1d", "adaptive_avgpool2d", "adaptive_avgpool3d"),
     "adaptive_avgpool1d|2d|3d", "pool", 1, 1, NULL, adaptive_parse, adaptive_build,
     adaptive_estimate, NULL, NULL},
    {TYPES("linear"), "linear", "linear", 1, 1, always, linear_parse, linear_build, linear_estimate,
     NULL, NULL},
    {TYPES("relu", "leaky_relu", "sigmoid", "tanh", "gelu", "dropout"),
     "relu, leaky_relu, sigmoid, tanh, gelu, dropout", "activation", 1, 1, NULL, activation_parse,
     activation_build, activation_estimate, NULL, NULL},
    {TYPES("batchnorm"), "batchnorm", "batchnorm", 1, 1, batchnorm_has_params, batchnorm_parse,
     batchnorm_build, batchnorm_estimate, TYPES("running_mean", "running_var"), batchnorm_buffers},
    {TYPES("upsample"), "upsample", "upsample", 1, 1, NULL, upsample_parse, upsample_build,
     upsample_estimate, NULL, NULL},
    {TYPES("add"), "add", "add", 2, SPEC_MAX_INPUTS, NULL, join_parse, add_build, none_estimate,
     NULL, NULL},
    {TYPES("concat"), "concat", "concat", 2, SPEC_MAX_INPUTS, NULL, join_parse, concat_build,
     none_estimate, NULL, NULL},
};

const spec_layer_kind *spec_kind_find(const char *type)
{
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        for (int t = 0; kinds[i].types[t] != NULL; t++) {
            if (strcmp(kinds[i].types[t], type) == 0) {
                return &kinds[i];
            }
        }
    }
    return NULL;
}

void spec_kind_list(char *buf, size_t n)
{
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        size_t used = strlen(buf);
        snprintf(buf + used, n - used, "%s%s", i ? ", " : "", kinds[i].list);
    }
}
