// layers/pool.c: distributed 1-D, 2-D and 3-D max and average pooling (DistDL's
// DistributedMaxPool / DistributedAvgPool): HaloExchange composed with the sequential
// pooling kernel, on a feature partition P_x = [1, 1, S...], or one that also splits the
// batch and the channels, P_x = [B, C, S...] (an extension of DistDL's, whose pooling takes
// feature partitions only: a window spans one sample and one channel, so those dims need
// no halo and each rank pools its own samples and channels).
//
// Shapes (nsp spatial dims): x [N, C, in...], y [N, C, out...] with
//   out_j = floor((in_j + 2 p_j - d_j (k_j - 1) - 1) / s_j) + 1,
// PyTorch's floor mode; stride 0 means stride = kernel (PyTorch's default, where DistDL
// defaults to 1); p_j <= k_j / 2; average pooling has no dilation and counts the padding
// (count_include_pad = True).
//
// Forward, as the feature convolution without weights (DistDL nn/pooling.py):
//
//   y = pool( C H E x )
//
// E embeds the local x into the padded buffer of the halo exchange, whose global padding
// on the boundary ranks holds the padding value: -inf for max pooling (a padding tap never
// wins), 0 for average pooling (it counts in the mean). The pads are filled once, at
// creation: the exchange only ever writes ghosts, and each forward only the bulk. H is the
// halo exchange on P_x, C the crop to the box the window needs, and pool the local kernel
// with padding 0, whose output is exactly this rank's balanced share of y (checked at
// creation for every piece). A rank with an empty share (more ranks than outputs) runs no
// kernel but still joins the exchange. When no spatial dim is split the kernel runs on the
// local x directly, with the real padding.
//
// Backward, the adjoint of that composition for the argmax fixed by the last forward
// (max) or exactly (average, which is linear): dy -> pool^T (into a zeroed block) -> C*
// (zero embedding) -> H* -> E* (the bulk copied out) = dx (overwritten).
//
// Collective over P_x (the halo exchange); ranks outside P_x hold zero-volume x and y.
// Forward and backward allocate nothing: the plan, buffers and argmax workspace are built
// by ddl_pool_create.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/check.h"
#include "ddl/base.h"
#include "layers/layer_impl.h"

typedef struct pool_impl {
    bool                 in_x;
    ddl_halo_exchange_t *halo;        // NULL when no spatial dim is split
    ddl_tensor_t        *xbuf, *dxbuf; // padded buffers (pads hold the padding value)
    ddl_box              bulk, need;
    bool                 staged;      // the needed box is not the whole buffer
    ddl_tensor_t        *xneed, *dxneed;
    bool                 work;        // non-empty local output
    ddl_pool_geom        g;
    void                *ws;          // max pooling: the argmax of the last forward
    size_t               ws_bytes;
    // The shared scratch (ddl_layer_share_scratch): the four buffers above live in the
    // model's one block, [xbuf | xneed] in forward and [dxbuf | dxneed] over them in
    // backward (which needs only the argmax); the pads are restored before each forward.
    bool   shared;
    double pad_value; // -inf (max) or 0 (average)
    size_t off_need;
} pool_impl;

static const char *pool_name(ddl_pool_mode mode)
{
    return mode == DDL_POOL_MAX ? "max_pool" : "avg_pool";
}

// ---- forward / backward ---------------------------------------------------------

static ddl_status pool_forward(ddl_layer_t *L, const ddl_tensor_t *x, ddl_tensor_t *y)
{
    pool_impl  *m   = L->impl;
    const void *src = x->data;
    DDL_CHECK(ddl_layer_check_scratch(L, m->shared));
    if (m->halo != NULL) {
        if (m->in_x) {
            if (m->shared) {
                ddl_halo_exchange_fill_pads(m->halo, m->xbuf, m->pad_value);
            }
            ddl_box full = ddl_box_full(&x->shape);
            ddl_tensor_copy_box(x, &full, m->xbuf, &m->bulk);
        }
        DDL_CHECK(ddl_halo_exchange_forward(m->halo, m->xbuf));
        if (m->in_x && m->staged) {
            ddl_tensor_pack(m->xbuf, &m->need, m->xneed->data);
        }
        src = m->staged ? m->xneed->data : m->xbuf->data;
    }
    if (m->work) {
        DDL_CHECK(ddl_pool_forward(L->dt, &m->g, y->data, src, m->ws, m->ws_bytes));
    }
    return DDL_OK;
}

static ddl_status pool_backward(ddl_layer_t *L, const ddl_tensor_t *dy, ddl_tensor_t *dx)
{
    pool_impl *m = L->impl;
    if (m->halo == NULL) {
        ddl_tensor_zero(dx);
        if (m->work) {
            DDL_CHECK(ddl_pool_backward(L->dt, &m->g, dx->data, dy->data, m->ws, m->ws_bytes));
        }
        return DDL_OK;
    }
    if (m->in_x) {
        ddl_tensor_t *blk = m->staged ? m->dxneed : m->dxbuf;
        ddl_tensor_zero(blk);
        if (m->work) {
            DDL_CHECK(ddl_pool_backward(L->dt, &m->g, blk->data, dy->data, m->ws, m->ws_bytes));
        }
        if (m->staged) {
            ddl_tensor_zero(m->dxbuf);
            ddl_tensor_unpack(m->dxbuf, &m->need, m->dxneed->data);
        }
    }
    DDL_CHECK(ddl_halo_exchange_adjoint(m->halo, m->dxbuf));
    if (m->in_x) {
        ddl_box full = ddl_box_full(&dx->shape);
        ddl_tensor_copy_box(m->dxbuf, &m->bulk, dx, &full);
    }
    return DDL_OK;
}

// ---- lifecycle -----------------------------------------------------------------

static void pool_destroy(ddl_layer_t *L)
{
    pool_impl *m = L->impl;
    if (m == NULL) {
        return;
    }
    ddl_halo_exchange_destroy(&m->halo);
    ddl_tensor_destroy(&m->xbuf);
    ddl_tensor_destroy(&m->dxbuf);
    ddl_tensor_destroy(&m->xneed);
    ddl_tensor_destroy(&m->dxneed);
    ddl_free(m->ws);
    ddl_free(m);
    L->impl = NULL;
}

static void pool_set_scratch(ddl_layer_t *L, void *p)
{
    pool_impl *m   = L->impl;
    char      *b   = p;
    m->xbuf->data  = b;
    m->xneed->data = b + m->off_need;
    if (m->dxbuf != NULL) {
        m->dxbuf->data = b;
    }
    if (m->dxneed != NULL) {
        m->dxneed->data = b + m->off_need;
    }
}

static const ddl_layer_ops pool_ops = {
    .forward     = pool_forward,
    .backward    = pool_backward,
    .destroy     = pool_destroy,
    .set_scratch = pool_set_scratch,
};

// Checks everything before anything is created; fills the global geometry. Identical on
// every rank.
static ddl_status pool_validate(const ddl_partition_t *P_x, ddl_dtype dt, const ddl_shape *xg,
                                const ddl_pool_params *p, ddl_pool_geom *gg)
{
    DDL_REQUIRE(P_x != NULL && xg != NULL && p != NULL, DDL_EINVAL,
                "pool: P_x, x_global and params are required");
    DDL_REQUIRE(p->kind == DDL_POOL_MAX || p->kind == DDL_POOL_AVG, DDL_EINVAL,
                "pool: unknown kind %d (expected DDL_POOL_MAX or DDL_POOL_AVG)", (int)p->kind);
    const char *name = pool_name(p->kind);
    DDL_REQUIRE(dt == DDL_F32 || dt == DDL_F64, DDL_EINVAL, "%s: unknown dtype %d", name,
                (int)dt);
    DDL_REQUIRE(p->nsp >= 1 && p->nsp <= 3, DDL_EINVAL,
                "%s: nsp = %d spatial dimensions, expected 1..3", name, p->nsp);
    int  nd = 2 + p->nsp;
    char a[128];
    DDL_REQUIRE(xg->ndim == nd, DDL_EINVAL,
                "%s: x_global %s has %d dims, expected %d ([N, C] and %d spatial)", name,
                ddl_shape_str(xg, a, sizeof a), xg->ndim, nd, p->nsp);
    DDL_REQUIRE(ddl_partition_ndim(P_x) == nd, DDL_EINVAL,
                "%s: P_x has %d dims, but x has %d", name, ddl_partition_ndim(P_x), nd);
    const int *sx = ddl_partition_shape(P_x);
    DDL_REQUIRE(xg->d[0] >= 1 && xg->d[1] >= 1, DDL_EINVAL,
                "%s: x_global %s: batch and channels must be >= 1", name,
                ddl_shape_str(xg, a, sizeof a));
    // The window (stride 0 = kernel, padding <= k/2, no dilation for avg, non-empty output).
    ddl_status st = ddl_pool_geom_init(gg, p->kind, p->nsp, xg->d[0], xg->d[1], xg->d + 2,
                                       p->kernel, p->stride, p->padding, p->dilation);
    if (st != DDL_OK) {
        return st;  // the kernel's message already names the layer and the value
    }
    // Every piece of every split dimension reaches only its neighbours, and the unpadded
    // local window on its needed block gives exactly its output share.
    for (int j = 0; j < p->nsp; j++) {
        for (int i = 0; i < sx[2 + j] && sx[2 + j] > 1; i++) {
            ddl_halo_dim h;
            st = ddl_halo_dim_compute(gg->in[j], sx[2 + j], i, gg->k[j], gg->s[j], gg->p[j],
                                      gg->d[j], &h);
            if (st != DDL_OK) {
                char why[512];
                snprintf(why, sizeof why, "%s", ddl_last_error());
                return ddl_set_error(st, "%s: spatial dim %d (length %lld over %d pieces): %s",
                                     name, j, (long long)gg->in[j], sx[2 + j], why);
            }
            if (h.out_n == 0) {
                continue;
            }
            int64_t need = h.need_hi - h.need_lo, ext = gg->d[j] * (gg->k[j] - 1) + 1;
            int64_t loc  = need >= ext ? (need - ext) / gg->s[j] + 1 : 0;
            DDL_REQUIRE(loc == h.out_n, DDL_EINTERNAL,
                        "%s: spatial dim %d piece %d: local output %lld != share %lld", name, j,
                        i, (long long)loc, (long long)h.out_n);
        }
    }
    return DDL_OK;
}

static ddl_status pool_setup(ddl_layer_t *L, pool_impl *m, const ddl_partition_t *P_x,
                             const ddl_shape *xg, const ddl_pool_geom *gg)
{
    ddl_dtype dt  = L->dt;
    int       nsp = gg->nsp, nd = 2 + nsp;
    ddl_shape yg  = {.ndim = nd, .d = {gg->N, gg->C}};
    for (int j = 0; j < nsp; j++) {
        yg.d[2 + j] = gg->out[j];
    }
    L->x_global = *xg;
    L->y_global = yg;
    L->x_shape  = ddl_partition_local_shape(P_x, xg);
    L->y_shape  = ddl_partition_local_shape(P_x, &yg);
    L->P_in     = P_x;
    L->P_out    = P_x;
    m->in_x     = ddl_partition_active(P_x);

    bool spatial = false; // some spatial dim is split: a halo exchange
    for (int j = 0; j < nsp; j++) {
        spatial = spatial || ddl_partition_shape(P_x)[2 + j] > 1;
    }
    ddl_pool_geom g = *gg; // this rank's window: set below wherever it works
    if (spatial) {
        int64_t K[DDL_MAX_DIMS], S[DDL_MAX_DIMS], Pd[DDL_MAX_DIMS], D[DDL_MAX_DIMS];
        for (int i = 0; i < nd; i++) {
            bool sp = i >= 2;
            K[i]    = sp ? gg->k[i - 2] : 1;
            S[i]    = sp ? gg->s[i - 2] : 1;
            Pd[i]   = sp ? gg->p[i - 2] : 0;
            D[i]    = sp ? gg->d[i - 2] : 1;
        }
        DDL_CHECK(ddl_halo_exchange_create(P_x, dt, xg, K, S, Pd, D, &m->halo));
        ddl_shape hs = ddl_halo_exchange_shape(m->halo);
        m->bulk      = ddl_halo_exchange_bulk_box(m->halo);
        m->need      = ddl_halo_exchange_needed_box(m->halo);
        m->shared    = ddl_layer_scratch_shared();
        m->pad_value = gg->mode == DDL_POOL_MAX ? -INFINITY : 0.0;
        bool grads   = ddl_layer_copy_source() == NULL; // a forward-only copy: no gradients
        DDL_CHECK(ddl_scratch_tensor(dt, &hs, m->shared, &m->xbuf));
        if (grads) {
            DDL_CHECK(ddl_scratch_tensor(dt, &hs, m->shared, &m->dxbuf));
        }
        if (gg->mode == DDL_POOL_MAX && !m->shared) {
            // Pads at -inf, once; ghosts are overwritten by every exchange, the bulk by
            // every forward (tensors are created zero, which is average pooling's pad).
            for (int64_t i = 0; i < ddl_tensor_numel(m->xbuf); i++) {
                ddl_tensor_set(m->xbuf, i, -INFINITY);
            }
        }
        ddl_shape ns = ddl_box_shape(&m->need);
        m->staged    = m->in_x && !ddl_shape_equal(&ns, &hs);
        ddl_shape z  = {.ndim = nd};
        DDL_CHECK(ddl_scratch_tensor(dt, m->staged ? &ns : &z, m->shared, &m->xneed));
        if (grads) {
            DDL_CHECK(ddl_scratch_tensor(dt, m->staged ? &ns : &z, m->shared, &m->dxneed));
        }
        if (m->shared) {
            size_t total = 0;
            ddl_scratch_carve(&total, ddl_tensor_bytes(m->xbuf));
            m->off_need      = ddl_scratch_carve(&total, ddl_tensor_bytes(m->xneed));
            L->scratch_bytes = total;
        }
        m->work = m->in_x && ddl_shape_numel(&L->y_shape) > 0;
        if (m->work) {
            int64_t zero[3] = {0, 0, 0};
            DDL_CHECK(ddl_pool_geom_init(&g, gg->mode, nsp, ns.d[0], ns.d[1], ns.d + 2, gg->k,
                                         gg->s, zero, gg->d));
        }
    } else {
        m->work = m->in_x && ddl_shape_numel(&L->x_shape) > 0;
        if (m->work) { // this rank's samples and channels (all of them on one rank)
            DDL_CHECK(ddl_pool_geom_init(&g, gg->mode, nsp, L->x_shape.d[0], L->x_shape.d[1],
                                         xg->d + 2, gg->k, gg->s, gg->p, gg->d));
        }
    }
    if (m->work) {
        for (int j = 0; j < nsp; j++) {
            DDL_REQUIRE(g.out[j] == L->y_shape.d[2 + j], DDL_EINTERNAL,
                        "%s: local output extent %lld != share %lld in spatial dim %d", L->kind,
                        (long long)g.out[j], (long long)L->y_shape.d[2 + j], j);
        }
        m->g        = g;
        m->ws_bytes = ddl_pool_workspace_bytes(&g);
        if (m->ws_bytes > 0) {
            m->ws = ddl_malloc(m->ws_bytes);
            if (m->ws == NULL) {
                return ddl_set_error(DDL_ENOMEM, "%s: cannot allocate a %zu-byte workspace",
                                     L->kind, m->ws_bytes);
            }
        }
    }
    return DDL_OK;
}

ddl_status ddl_pool_create(const ddl_partition_t *P_x, ddl_dtype dt, const ddl_shape *x_global,
                           const ddl_pool_params *p, ddl_layer_t **out)
{
    DDL_REQUIRE(out != NULL, DDL_EINVAL, "pool: out is NULL");
    *out = NULL;
    ddl_pool_geom gg;
    DDL_CHECK(pool_validate(P_x, dt, x_global, p, &gg));
    ddl_layer_t *L;
    DDL_CHECK(ddl_layer_alloc(&pool_ops, pool_name(p->kind), dt, &L));
    pool_impl *m = ddl_calloc(1, sizeof *m);
    if (m == NULL) {
        ddl_layer_destroy(&L);
        return ddl_set_error(DDL_ENOMEM, "%s: out of memory", pool_name(p->kind));
    }
    L->impl       = m;
    ddl_status st = pool_setup(L, m, P_x, x_global, &gg);
    if (st != DDL_OK) {
        ddl_layer_destroy(&L);
        return st;
    }
    *out = L;
    return DDL_OK;
}
