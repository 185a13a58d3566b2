// layers/conv.c: distributed 1-D, 2-D and 3-D convolution (DistDL's DistributedFeatureConv,
// DistributedChannelConv and DistributedGeneralConv): HaloExchange, Broadcast and SumReduce
// composed with the sequential convolution kernel.
//
// Shapes (nsp spatial dims): x [N, C_in, in...], w [C_out, C_in, k...], b [C_out],
// y [N, C_out, out...] with out_j = floor((in_j + 2 p_j - d_j (k_j - 1) - 1) / s_j) + 1.
//
// Partitions. The unit of work is P_w = [P_co, P_ci, S...]; x lives on P_x = [1, P_ci, S...]
// and y on P_y = [1, P_co, S...]. The selector (DistDL nn/conv.py):
//   feature  only P_x given: P_x = [B, 1, S...], and here P_w = P_y = P_x;
//   channel  P_y, P_w given, every spatial entry of P_x and P_y is 1 (S = 1...);
//   general  P_y, P_w given otherwise.
// One implementation serves all three: the feature layer is the general one with
// P_co = P_ci = 1 and P_w = P_x, the channel layer the general one with S = 1....
//
// Forward. With E the embedding of x into the padded halo buffer (global zero padding on
// the boundary ranks, DistDL's explicit padding), H the halo exchange on P_x (kernel 1 in
// the N and C dims), C the crop to the needed box, B_x the broadcast P_x -> P_w (down co),
// conv the local kernel with padding 0, R the sum-reduce P_w -> P_y' (over ci) where
// P_y' = [P_co, 1, S...] is P_y's ranks re-cast (DistDL conv_channel.py), and B_w, B_b the
// broadcasts of the parameters from their owners:
//
//   y = R( conv( B_x(C H E x); B_w w, B_b b ) )
//
// P_w rank (co, ci, s) convolves with the weight block [co piece, ci piece, k...] and adds
// the bias piece co only where ci == 0, so the sum over ci counts it once. Its output is
// exactly P_y rank (0, co, s)'s balanced share of y (checked at creation for every piece).
// When S = 1... no halo is needed: the local conv reads its whole x block and applies the
// real padding itself. The feature layer has no B_x and R (P_w = P_x = P_y).
//
// Parameters (DistDL's placement; each global element on exactly one rank). S = 1...:
// every P_w rank owns its weight block and the ci == 0 ranks the bias pieces, used in
// place. Otherwise the spatial-0 slab P_wr = [P_co, P_ci, 1...] of P_w owns the weight
// blocks and P_br = [P_co, 1, 1...] (ci == 0, spatial 0) the bias pieces; B_w broadcasts
// along the spatial dims to all of P_w, B_b to the ci == 0 ranks P_b = [P_co, 1, S...].
// For the feature layer that is: weight and bias on P_x rank 0, broadcast to all of P_x.
//
// Batch split (an extension of DistDL's feature layer, whose P_x is [1, 1, S...]): the
// feature layer also takes P_x = [B, 1, S...]. The batch dim needs no halo (its window is
// 1), each rank convolves its balanced share of the samples (possibly none), and the
// parameters are owned by P_x rank 0 and replicated to all of P_x as for a spatial split:
// the broadcast's adjoint sums every rank's dw and db onto the owner. With S = 1... that
// is data parallelism written in DistDL's primitives.
//
// Adjoint (backward), the reverse composition: dy -> R* (broadcast over ci) -> conv^T
// (input block, and dw, db accumulated) -> B_x* (sum over co onto P_x) -> C* (zero
// embedding) -> H* -> E* (the bulk copied out) = dx (overwritten); dw, db -> B_w*, B_b*
// (sums onto the owners), added into the parameters' gradients.
//
// Broadcast and SumReduce move one tensor of one size per rank. A rank that roots one
// group and is a leaf of another may hold blocks of two sizes (P_y rank 1 of [1, 3] is
// also P_w rank (0, 1) of [3, 2]: it receives y piece 1 but contributes to piece 0, and
// 10 channels over 3 give 4, 3, 3). When some rank is in that situation the plan moves
// flat "envelopes" of the largest block size, each block at the start of its envelope;
// otherwise blocks move in place at their exact size. All of this is decided at
// creation from the partitions alone, identically on every rank.
//
// Collective over the union of P_x, P_y and P_w (create, forward and backward); ranks
// outside them hold zero-volume x and y and return at once. Forward and backward
// allocate nothing: every plan, buffer and workspace is built by ddl_conv_create.
//
// Saved input. Backward needs the conv input block of the last forward (for dw). When
// the layer builds that block itself (halo buffer or crop, broadcast block, envelope)
// it is the layer's buffer; when the kernel reads x as it is (the feature layer
// without a halo: one rank) backward reads the caller's x by reference, not a copy (the
// saved-tensor contract of ddl/layers.h).
#include <stdio.h>
#include <string.h>

#include "base/check.h"
#include "ddl/agree.h"
#include "ddl/base.h"
#include "layers/layer_impl.h"

typedef enum { CONV_FEATURE = 0, CONV_CHANNEL, CONV_GENERAL } conv_kind;

static const char *const kind_name[] = {"conv_feature", "conv_channel", "conv_general"};

// The validated configuration: everything is a pure function of the arguments, the same
// on every rank.
typedef struct conv_cfg {
    conv_kind kind;
    int       nsp, ndim;  // ndim = 2 + nsp
    int64_t   N, C_in, C_out;
    int64_t   in[3], k[3], s[3], p[3], d[3], out[3];
    int       P_co, P_ci, S[3];
    int       B;          // batch pieces (feature layer; 1 otherwise)
    bool      halo;       // some S_j > 1: halo exchange, local conv without padding
    bool      bias;
} conv_cfg;

typedef struct conv_impl {
    conv_cfg c;
    bool     in_x, in_w, in_y;  // membership of P_x, P_w, P_y
    bool     recv_bias;         // this P_w rank adds the bias (ci == 0)

    // Partitions created here (NULL when not needed), destroyed with the layer.
    ddl_partition_t *P_yr;      // P_y re-cast as [P_co, 1, S...]
    ddl_partition_t *P_wr_own, *P_br_own, *P_b_own;

    // Input side on P_x: padded buffers of the halo exchange, and a staging block (the
    // needed crop, or an envelope) with its gradient twin.
    ddl_halo_exchange_t *halo;
    ddl_tensor_t        *xbuf, *dxbuf;
    ddl_box              bulk, need;
    bool                 x_staged;   // the block the P_x rank hands on lives in xstage
    bool                 dx_staged;  // its gradient comes back in dxstage
    ddl_tensor_t        *xstage, *dxstage;
    int64_t              nx_blk;     // elements of the conv input block on P_x

    // Fans (channel, general): x down co, y over ci; envelopes when sizes differ. A rank
    // that roots and joins its group runs the fan-outs (B_x, R*, B_w, B_b) in place: no
    // copy of its block into its own output (see layers/linear.c, "In place").
    ddl_broadcast_t  *x_bc;
    ddl_sum_reduce_t *y_sr;
    bool              x_inplace, y_inplace, w_inplace, b_inplace;
    int64_t           nx_root, nx_leaf, ny_leaf, ny_root;
    ddl_tensor_t     *xw, *dxw, *yw, *dyw;  // P_w side blocks (flat)
    ddl_tensor_t     *ystage;               // envelope of y on P_y (NULL if exact)

    // Parameter replication (halo layouts): copies on P_w and the owners' sums.
    ddl_broadcast_t *w_bc, *b_bc;
    ddl_tensor_t    *w, *dw, *b, *db, *gw, *gb;

    // The local kernel on P_w.
    bool          work;       // this rank computes a non-empty output block
    ddl_conv_geom g;
    void         *ws;
    size_t        ws_bytes;
    bool          ws_borrowed; // ws is a copy source's, or in the shared scratch
    const void   *conv_in;    // the input block the kernel reads: plan-owned, or the
                              // caller's x of the last forward (feature layer, no halo)
    bool          have_forward;  // a forward has run (backward needs its state)

    // The shared scratch (ddl_layer_share_scratch; the feature layer): the workspace
    // lives in the model's one block (ws_shared), and with a large input (shared) the halo
    // layouts' padded buffers and crops too; backward then rebuilds the padded input from
    // the x of the last forward. A small input keeps its own for the step (rebuilding it
    // would cost a copy and an exchange per backward).
    bool        ws_shared, shared;
    const void *x_saved; // that x (the caller keeps it, layers.h)
    size_t      off_ws, off_x, off_xs; // dxbuf and dxstage over xbuf and xstage
} conv_impl;

// ---- configuration -------------------------------------------------------------

static char *pshape_str(const ddl_partition_t *P, char *buf, size_t len)
{
    ddl_shape s = {.ndim = ddl_partition_ndim(P)};
    for (int i = 0; i < s.ndim; i++) {
        s.d[i] = ddl_partition_shape(P)[i];
    }
    return ddl_shape_str(&s, buf, len);
}

// Halo description of spatial dim j, piece i of S_j (validated before any use).
static ddl_halo_dim sp_halo(const conv_cfg *c, int j, int i)
{
    ddl_halo_dim h;
    ddl_status   st = ddl_halo_dim_compute(c->in[j], c->S[j], i, c->k[j], c->s[j], c->p[j],
                                           c->d[j], &h);
    DDL_ASSERT(st == DDL_OK);
    return h;
}

// Extent of spatial dim j in spatial piece i: the input block the local conv reads
// (out == false) or the output share it computes (out == true).
static int64_t sp_extent(const conv_cfg *c, int j, int i, bool out)
{
    if (!c->halo) {
        return out ? c->out[j] : c->in[j];
    }
    ddl_halo_dim h = sp_halo(c, j, i);
    return out ? h.out_n : h.need_hi - h.need_lo;
}

// Elements of the conv input (out == false) or output block of channel piece chan and
// spatial pieces sp[0..nsp).
static int64_t block_numel(const conv_cfg *c, bool out, int chan, const int *sp)
{
    int64_t n = c->N * (out ? ddl_decomp_size(c->C_out, c->P_co, chan)
                            : ddl_decomp_size(c->C_in, c->P_ci, chan));
    for (int j = 0; j < c->nsp; j++) {
        n *= sp_extent(c, j, sp[j], out);
    }
    return n;
}

// Checks everything before anything is created; fills *c. Identical on every rank.
static ddl_status conv_validate(const ddl_partition_t *P_x, const ddl_partition_t *P_y,
                                const ddl_partition_t *P_w, ddl_dtype dt, const ddl_shape *xg,
                                const ddl_conv_params *p, conv_cfg *c)
{
    DDL_REQUIRE(P_x != NULL && xg != NULL && p != NULL, DDL_EINVAL,
                "conv: P_x, x_global and params are required");
    DDL_REQUIRE((P_y == NULL) == (P_w == NULL), DDL_EINVAL,
                "conv: give both P_y and P_w (channel or general layer) or neither (feature "
                "layer); got only %s",
                P_y != NULL ? "P_y" : "P_w");
    DDL_REQUIRE(dt == DDL_F32 || dt == DDL_F64, DDL_EINVAL, "conv: unknown dtype %d", (int)dt);
    DDL_REQUIRE(p->nsp >= 1 && p->nsp <= 3, DDL_EINVAL,
                "conv: nsp = %d spatial dimensions, expected 1..3", p->nsp);
    memset(c, 0, sizeof *c);
    c->nsp  = p->nsp;
    c->ndim = 2 + p->nsp;
    c->bias = p->bias;
    char a[128], b[128], e[128];
    DDL_REQUIRE(xg->ndim == c->ndim, DDL_EINVAL,
                "conv: x_global %s has %d dims, expected %d ([N, C_in] and %d spatial)",
                ddl_shape_str(xg, a, sizeof a), xg->ndim, c->ndim, c->nsp);
    const ddl_partition_t *parts[3] = {P_x, P_y, P_w};
    const char *const      pname[3] = {"P_x", "P_y", "P_w"};
    for (int i = 0; i < 3; i++) {
        if (parts[i] == NULL) {
            continue;
        }
        DDL_REQUIRE(ddl_partition_ndim(parts[i]) == c->ndim, DDL_EINVAL,
                    "conv: %s %s has %d dims, but x has %d", pname[i],
                    pshape_str(parts[i], a, sizeof a), ddl_partition_ndim(parts[i]), c->ndim);
        DDL_REQUIRE(ddl_partition_base(parts[i]) == ddl_partition_base(P_x), DDL_EINVAL,
                    "conv: %s and P_x are built on different base communicators", pname[i]);
    }

    // Partition shapes, per layer kind.
    const int *sx = ddl_partition_shape(P_x);
    if (P_y == NULL) {
        c->kind = CONV_FEATURE;
        DDL_REQUIRE(sx[1] == 1, DDL_EINVAL,
                    "conv_feature: P_x %s must be [B, 1, S...] (channels unsplit); give P_y and "
                    "P_w for a channel or general layer",
                    pshape_str(P_x, a, sizeof a));
        c->P_co = c->P_ci = 1;
        c->B              = sx[0];
    } else {
        const int *sy = ddl_partition_shape(P_y), *sw = ddl_partition_shape(P_w);
        bool       ones = true;
        for (int j = 2; j < c->ndim; j++) {
            ones = ones && sx[j] == 1 && sy[j] == 1;
        }
        c->kind          = ones ? CONV_CHANNEL : CONV_GENERAL;
        const char *name = kind_name[c->kind];
        DDL_REQUIRE(sx[0] == 1, DDL_EINVAL, "%s: P_x %s splits the batch (P_x[0] = %d, expected 1)",
                    name, pshape_str(P_x, a, sizeof a), sx[0]);
        DDL_REQUIRE(sy[0] == 1, DDL_EINVAL, "%s: P_y %s splits the batch (P_y[0] = %d, expected 1)",
                    name, pshape_str(P_y, a, sizeof a), sy[0]);
        DDL_REQUIRE(sw[1] == sx[1], DDL_EINVAL,
                    "%s: P_w[1] = %d (input-channel split of P_w %s) must equal P_x[1] = %d", name,
                    sw[1], pshape_str(P_w, a, sizeof a), sx[1]);
        DDL_REQUIRE(sw[0] == sy[1], DDL_EINVAL,
                    "%s: P_w[0] = %d (output-channel split of P_w %s) must equal P_y[1] = %d",
                    name, sw[0], pshape_str(P_w, a, sizeof a), sy[1]);
        for (int j = 2; j < c->ndim; j++) {
            DDL_REQUIRE(sx[j] == sw[j] && sy[j] == sw[j], DDL_EINVAL,
                        "%s: spatial split differs in dim %d: P_x %s, P_y %s, P_w %s (the "
                        "spatial entries must be equal)",
                        name, j, pshape_str(P_x, a, sizeof a), pshape_str(P_y, b, sizeof b),
                        pshape_str(P_w, e, sizeof e));
        }
        c->P_co = sw[0];
        c->P_ci = sw[1];
        c->B    = 1;
    }
    const char *name = kind_name[c->kind];
    for (int j = 0; j < c->nsp; j++) {
        c->S[j] = sx[2 + j];
        c->halo = c->halo || c->S[j] > 1;
    }

    // Sizes and the global window.
    c->N     = xg->d[0];
    c->C_in  = p->in_channels;
    c->C_out = p->out_channels;
    DDL_REQUIRE(c->N >= 1, DDL_EINVAL, "%s: batch x_global[0] = %lld, expected >= 1", name,
                (long long)c->N);
    DDL_REQUIRE(c->C_in == xg->d[1], DDL_EINVAL,
                "%s: in_channels %lld != x_global[1] = %lld", name, (long long)c->C_in,
                (long long)xg->d[1]);
    DDL_REQUIRE(c->C_in >= c->P_ci, DDL_EINVAL,
                "%s: in_channels %lld split over P_ci = %d leaves a rank without channels", name,
                (long long)c->C_in, c->P_ci);
    DDL_REQUIRE(c->C_out >= c->P_co, DDL_EINVAL,
                "%s: out_channels %lld split over P_co = %d leaves a rank without channels (or "
                "out_channels < 1)",
                name, (long long)c->C_out, c->P_co);
    for (int j = 0; j < c->nsp; j++) {
        c->in[j] = xg->d[2 + j];
        c->k[j]  = p->kernel[j];
        c->s[j]  = p->stride[j];
        c->p[j]  = p->padding[j];
        c->d[j]  = p->dilation[j];
    }
    ddl_conv_geom g;
    ddl_status    st = ddl_conv_geom_init(&g, c->nsp, c->N, c->C_in, c->C_out, c->in, c->k, c->s,
                                          c->p, c->d);
    if (st != DDL_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", ddl_last_error());
        return ddl_set_error(st, "%s: %s", name, why);
    }
    for (int j = 0; j < c->nsp; j++) {
        c->out[j] = g.out[j];
    }

    // Halos: every piece of every split dimension must reach only its neighbours, and the
    // unpadded local conv on a needed block must produce exactly that piece's output share.
    if (c->halo) {
        for (int j = 0; j < c->nsp; j++) {
            for (int i = 0; i < c->S[j]; i++) {
                ddl_halo_dim h;
                st = ddl_halo_dim_compute(c->in[j], c->S[j], i, c->k[j], c->s[j], c->p[j],
                                          c->d[j], &h);
                if (st != DDL_OK) {
                    char why[512];
                    snprintf(why, sizeof why, "%s", ddl_last_error());
                    return ddl_set_error(st, "%s: spatial dim %d (length %lld over %d pieces): %s",
                                         name, j, (long long)c->in[j], c->S[j], why);
                }
                if (h.out_n == 0) {
                    continue;
                }
                int64_t need = h.need_hi - h.need_lo, ext = c->d[j] * (c->k[j] - 1) + 1;
                int64_t loc  = need >= ext ? (need - ext) / c->s[j] + 1 : 0;
                DDL_REQUIRE(loc == h.out_n, DDL_EINTERNAL,
                            "%s: spatial dim %d piece %d: local output %lld != share %lld", name,
                            j, i, (long long)loc, (long long)h.out_n);
            }
        }
    }
    return DDL_OK;
}

// Element count of this rank's block in a fan (Broadcast or SumReduce) between `roots`
// and `leaves`, whose channel coordinate is at rc / lc (spatial coordinates from 2 on);
// blocks of y when out, else of the conv input. Exact sizes when no rank is root and leaf
// with blocks of different sizes; else the largest block on every member (*envelope).
static int64_t fan_count(const conv_cfg *c, const ddl_partition_t *roots, int rc,
                         const ddl_partition_t *leaves, int lc, bool out, bool *envelope)
{
    int     me        = ddl_partition_base_rank(roots);
    int64_t nmax      = 0;
    int64_t mine[2]   = {-1, -1};  // this rank's root and leaf block sizes
    bool    env       = false;
    int     coord[DDL_MAX_DIMS], qcoord[DDL_MAX_DIMS];
    for (int side = 0; side < 2; side++) {
        const ddl_partition_t *P  = side == 0 ? roots : leaves;
        int                    cc = side == 0 ? rc : lc;
        for (int j = 0; j < ddl_partition_size(P); j++) {
            ddl_index_unravel(c->ndim, ddl_partition_shape(P), j, coord);
            int64_t n = block_numel(c, out, coord[cc], coord + 2);
            int     r = ddl_partition_ranks(P)[j];
            nmax      = n > nmax ? n : nmax;
            if (r == me) {
                mine[side] = n;
            }
            int q = side == 0 ? ddl_partition_position(leaves, r) : -1;
            if (q >= 0) {
                ddl_index_unravel(c->ndim, ddl_partition_shape(leaves), q, qcoord);
                env = env || block_numel(c, out, qcoord[lc], qcoord + 2) != n;
            }
        }
    }
    *envelope = env;
    if (env) {
        return (mine[0] >= 0 || mine[1] >= 0) ? nmax : 0;
    }
    return mine[0] >= 0 ? mine[0] : (mine[1] >= 0 ? mine[1] : 0);
}

// ---- helpers -------------------------------------------------------------------

// A flat, non-owning view (on the stack: forward and backward allocate nothing).
static ddl_tensor_t flat(ddl_dtype dt, int64_t n, const void *data)
{
    ddl_tensor_t t = {.dtype = dt, .shape = {.ndim = 1, .d = {n}}, .data = (void *)data};
    return t;
}

static ddl_status flat_create(ddl_dtype dt, int64_t n, ddl_tensor_t **out)
{
    ddl_shape s = {.ndim = 1, .d = {n}};
    return ddl_tensor_create(dt, &s, out);
}

static void zero_n(ddl_dtype dt, void *p, int64_t n)
{
    if (n > 0) {
        memset(p, 0, (size_t)n * ddl_dtype_size(dt));
    }
}

// t += u elementwise (same shapes).
static void add_into(ddl_tensor_t *t, const ddl_tensor_t *u)
{
    if (ddl_tensor_numel(t) > 0) {
        ddl_box full = ddl_box_full(&t->shape);
        ddl_tensor_add_box(u, &full, t, &full);
    }
}

static bool box_is_full(const ddl_box *b, const ddl_shape *s)
{
    for (int i = 0; i < s->ndim; i++) {
        if (b->start[i] != 0 || b->stop[i] != s->d[i]) {
            return false;
        }
    }
    return true;
}

// The sub-partition of P's members with coordinate 0 in dim 0 (when d0: the feature
// layer's batch), ci == 0 (when ci0) and all spatial coordinates 0 (when sp0), in P's
// order, with the given shape. Collective over its members.
static ddl_status sub_partition(const ddl_partition_t *P, bool d0, bool ci0, bool sp0,
                                const int *shape, ddl_partition_t **out)
{
    // The rank list lives on the stack when it is small, so that this step cannot fail
    // on one member alone (the others would wait in the partition's creation).
    int  nd = ddl_partition_ndim(P), n = ddl_partition_size(P), m = 0;
    int  few[256];
    int *sel = n <= 256 ? few : ddl_malloc(sizeof(int) * (size_t)n);
    if (sel == NULL) {
        return ddl_set_error(DDL_ENOMEM, "conv: out of memory");
    }
    int coord[DDL_MAX_DIMS];
    for (int j = 0; j < n; j++) {
        ddl_index_unravel(nd, ddl_partition_shape(P), j, coord);
        bool keep = (!d0 || coord[0] == 0) && (!ci0 || coord[1] == 0);
        for (int i = 2; i < nd && sp0; i++) {
            keep = keep && coord[i] == 0;
        }
        if (keep) {
            sel[m++] = ddl_partition_ranks(P)[j];
        }
    }
    ddl_status st = ddl_partition_create(ddl_partition_base(P), m, sel, nd, shape, out);
    if (sel != few) {
        ddl_free(sel);
    }
    return st;
}

// ---- forward -------------------------------------------------------------------

// The conv input block this P_x rank hands on (in the halo layouts after the exchange,
// which every P_x rank joins). NULL on other ranks.
static ddl_status input_block(conv_impl *m, ddl_dtype dt, const ddl_tensor_t *x,
                              const void **out)
{
    *out = NULL;
    if (m->halo != NULL) {
        if (m->in_x) {
            if (m->shared) {
                ddl_halo_exchange_fill_pads(m->halo, m->xbuf, 0); // other layers wrote here
            }
            ddl_box full = ddl_box_full(&x->shape);
            ddl_tensor_copy_box(x, &full, m->xbuf, &m->bulk);
        }
        DDL_CHECK(ddl_halo_exchange_forward(m->halo, m->xbuf));
        if (!m->in_x) {
            return DDL_OK;
        }
        if (m->x_staged) {
            ddl_tensor_pack(m->xbuf, &m->need, m->xstage->data);
        }
        *out = m->x_staged ? m->xstage->data : m->xbuf->data;
    } else if (m->in_x) {
        // Without a halo only an envelope (a fan whose blocks differ in size) needs a
        // staged copy; otherwise x itself is handed on (and kept by reference).
        if (m->x_staged) {
            memcpy(m->xstage->data, x->data, (size_t)m->nx_blk * ddl_dtype_size(dt));
        }
        *out = m->x_staged ? m->xstage->data : x->data;
    }
    return DDL_OK;
}

// The local kernel sets the input block gradient (DDL_CONV_DX_SET), its [N, C_in, in...]
// block at the start of gin where this rank computes; before it runs, this zeroes the rest
// of gin's n elements: all of them on a rank that computes nothing, the tail of an
// envelope. No memset of what the kernel writes anyway (issue 19, item 3: 1.3 % of a
// ResNet step at np 1 by profile; +1.0-1.6 % images/s measured, docs/PERFORMANCE.md).
static void dx_clear_rest(const conv_impl *m, ddl_dtype dt, void *gin, int64_t n)
{
    int64_t k = 0;
    if (m->work) {
        k = m->g.N * m->g.C_in;
        for (int j = 0; j < m->g.nsp; j++) {
            k *= m->g.in[j];
        }
    }
    DDL_ASSERT(k <= n);
    zero_n(dt, (char *)gin + (size_t)k * ddl_dtype_size(dt), n - k);
}

// ---- halo exchanges behind the computation (issue 19, item 5) ------------------------

// The kernels' progress hook while an exchange is in flight: it moves the exchange on
// between their blocks, and keeps the first failure for the caller. A kernel calls the
// hook once per block or group of samples (hundreds of times per ResNet step), and a
// progress call with transfers pending costs microseconds, so only calls 1, 2, 4, 8, ...
// of each exchange make one: early ones let the rendezvous start, and the exchange needs
// few. Measured (bench-train-worker --overlap-ab, ResNet on 2 ranks): every call spent
// 0.9 ms per step in progress calls, every 8th 0.2-0.3 ms; the powers of two hid a little
// more than every 8th.
typedef struct halo_prog {
    ddl_halo_exchange_t *h;
    ddl_status           st;
    unsigned             calls;
} halo_prog;

static void halo_prog_fn(void *arg)
{
    halo_prog *p = arg;
    unsigned   c = ++p->calls;
    if ((c & (c - 1)) != 0 || p->st != DDL_OK) {
        return;
    }
    p->st = ddl_halo_exchange_progress(p->h);
}

// Finishes h's exchange if one is in flight (a start may fail after posting), and returns
// the first failure of: st (the work done meanwhile), the progress calls, the finish.
static ddl_status halo_settle(ddl_halo_exchange_t *h, const halo_prog *p, ddl_status st)
{
    ddl_status fin = ddl_halo_exchange_in_flight(h) ? ddl_halo_exchange_finish(h) : DDL_OK;
    if (st == DDL_OK && p != NULL) {
        st = p->st;
    }
    return st != DDL_OK ? st : fin;
}

// The weights and bias the kernel reads: the broadcast copies, or the owner's own values
// (in place, or a rank whose copy is its parameter).
static const void *kernel_w(const ddl_layer_t *L, const conv_impl *m)
{
    return m->w != NULL && !m->w_inplace ? m->w->data : L->params[0].value->data;
}

static const void *kernel_b(const ddl_layer_t *L, const conv_impl *m)
{
    if (!m->recv_bias) {
        return NULL;
    }
    return m->b != NULL && !m->b_inplace ? m->b->data : L->params[1].value->data;
}

// Where the kernel sums dw and db: the partial sums (cleared here) that B_w* and B_b* carry
// to the owners, or the owner's gradients themselves.
static void kernel_grads(ddl_layer_t *L, conv_impl *m, void **dw, void **db)
{
    if (m->dw != NULL) {
        ddl_tensor_zero(m->dw);
    }
    if (m->db != NULL) {
        ddl_tensor_zero(m->db);
    }
    *dw = m->dw != NULL ? m->dw->data : L->params[0].grad->data;
    *db = NULL;
    if (m->recv_bias) {
        *db = m->db != NULL ? m->db->data : L->params[1].grad->data;
    }
}

// The parameter gradients onto their owners (B_w*, B_b*: sums along the spatial dims).
static ddl_status grads_to_owners(ddl_layer_t *L, conv_impl *m)
{
    if (m->w_bc != NULL) {
        DDL_CHECK(ddl_broadcast_adjoint(m->w_bc, m->dw, m->gw));
        add_into(L->params[0].grad, m->gw);
    }
    if (m->b_bc != NULL) {
        DDL_CHECK(ddl_broadcast_adjoint(m->b_bc, m->db, m->gb));
        add_into(L->params[1].grad, m->gb);
    }
    return DDL_OK;
}

// C*: a staged (cropped) input gradient embedded in the zeroed padded buffer.
static void dx_unstage(conv_impl *m)
{
    if (m->in_x && m->dx_staged) {
        ddl_tensor_zero(m->dxbuf);
        ddl_tensor_unpack(m->dxbuf, &m->need, m->dxstage->data);
    }
}

// After H*: the padded buffer's bulk out into dx.
static void dx_bulk_out(const conv_impl *m, ddl_tensor_t *dx)
{
    if (m->in_x) {
        ddl_box full = ddl_box_full(&dx->shape);
        ddl_tensor_copy_box(m->dxbuf, &m->bulk, dx, &full);
    }
}

static ddl_status conv_forward(ddl_layer_t *L, const ddl_tensor_t *x, ddl_tensor_t *y)
{
    conv_impl *m  = L->impl;
    ddl_dtype  dt = L->dt;
    ddl_param *pw = &L->params[0], *pb = m->c.bias ? &L->params[1] : NULL;
    // Parameters onto the ranks that use them (their owners send them from where they
    // are, in place, and read them there).
    if (m->w_bc != NULL) {
        DDL_CHECK(ddl_broadcast_forward(m->w_bc, pw->value, m->w_inplace ? pw->value : m->w));
    }
    if (m->b_bc != NULL) {
        DDL_CHECK(ddl_broadcast_forward(m->b_bc, pb->value, m->b_inplace ? pb->value : m->b));
    }
    DDL_CHECK(ddl_layer_check_scratch(L, m->ws_shared));
    m->have_forward = true;
    m->x_saved      = x->data;
    const void *xin;
    DDL_CHECK(input_block(m, dt, x, &xin));
    if (m->x_bc == NULL) {
        m->conv_in = xin;  // the feature layer convolves its own input block
    }
    // Down the co dimension of P_w.
    if (m->x_bc != NULL) {
        // In place, the root's block (read only by MPI_Bcast) is its own conv input.
        ddl_tensor_t in = flat(dt, m->nx_root, xin);
        ddl_tensor_t to = m->x_inplace ? in : flat(dt, m->nx_leaf, m->xw->data);
        DDL_CHECK(ddl_broadcast_forward(m->x_bc, &in, &to));
        m->conv_in = m->x_inplace ? xin : m->xw->data;
    }
    void *yout = m->y_sr != NULL ? m->yw->data : y->data;
    if (m->work) {
        const void *w = kernel_w(L, m), *b = kernel_b(L, m);
        // Inference computes each sample alone (batch-invariant bits: dynamic batching).
        DDL_CHECK(
            L->training
                ? ddl_conv_forward(dt, &m->g, yout, m->conv_in, w, b, m->ws, m->ws_bytes)
                : ddl_conv_forward_rows(dt, &m->g, yout, m->conv_in, w, b, m->ws, m->ws_bytes));
    }
    // Over the ci dimension onto P_y.
    if (m->y_sr != NULL) {
        void        *dst = m->ystage != NULL ? m->ystage->data : y->data;
        ddl_tensor_t in = flat(dt, m->ny_leaf, m->yw->data), to = flat(dt, m->ny_root, dst);
        DDL_CHECK(ddl_sum_reduce_forward(m->y_sr, &in, &to));
        if (m->ystage != NULL && m->in_y) {
            memcpy(y->data, m->ystage->data, ddl_tensor_bytes(y));
        }
    }
    return DDL_OK;
}

// ---- backward ------------------------------------------------------------------

// The feature layer's backward with the exchange of dx (H*) behind the computation of dw
// and db and their sums onto the owners: dx first (overwritten into the padded buffer, or
// its crop), then the exchange started, dw and db, B_w* and B_b*, and the exchange
// finished. The same bits as conv_backward's order (dw, db and dx are independent sums).
static ddl_status backward_overlapped(ddl_layer_t *L, conv_impl *m, const ddl_tensor_t *dy,
                                      ddl_tensor_t *dx)
{
    ddl_dtype   dt = L->dt;
    const void *w  = kernel_w(L, m);
    void       *gx = NULL;
    if (m->in_x) {
        gx = m->dx_staged ? m->dxstage->data : m->dxbuf->data;
        dx_clear_rest(m, dt, gx, m->nx_blk);
    }
    if (m->work) {
        DDL_CHECK(ddl_conv_backward_ex(dt, &m->g, gx, NULL, NULL, dy->data, NULL, w, m->ws,
                                       m->ws_bytes, DDL_CONV_DX_SET));
    }
    dx_unstage(m);
    halo_prog  p  = {.h = m->halo, .st = DDL_OK};
    ddl_status st = ddl_halo_exchange_adjoint_start(m->halo, m->dxbuf);
    void      *dw, *db;
    kernel_grads(L, m, &dw, &db);
    if (st == DDL_OK && m->work) {
        ddl_kernel_progress prev = ddl_kernel_progress_set((ddl_kernel_progress){halo_prog_fn, &p});
        st =
            ddl_conv_backward(dt, &m->g, NULL, dw, db, dy->data, m->conv_in, w, m->ws, m->ws_bytes);
        ddl_kernel_progress_set(prev);
    }
    if (st == DDL_OK) {
        st = grads_to_owners(L, m);
    }
    DDL_CHECK(halo_settle(m->halo, &p, st));
    dx_bulk_out(m, dx);
    return DDL_OK;
}

static ddl_status conv_backward(ddl_layer_t *L, const ddl_tensor_t *dy, ddl_tensor_t *dx)
{
    conv_impl *m  = L->impl;
    ddl_dtype  dt  = L->dt;
    bool       fan = m->x_bc != NULL;
    DDL_REQUIRE(m->have_forward, DDL_EINVAL, "%s: backward called before any forward", L->kind);
    if (m->halo != NULL && !m->shared && m->c.kind == CONV_FEATURE && ddl_halo_overlap() &&
        !L->dx_unused) {
        return backward_overlapped(L, m, dy, dx);
    }
    if (m->shared && m->halo != NULL) {
        // The padded input lives in the shared scratch: rebuilt from the forward's x.
        ddl_tensor_t xv = {.dtype = dt, .shape = L->x_shape, .data = (void *)m->x_saved};
        DDL_CHECK(input_block(m, dt, &xv, &m->conv_in));
    }

    // dy back onto P_w (R* broadcasts over ci).
    const void *gy = dy->data;
    if (fan) {
        const void *src = dy->data;
        if (m->ystage != NULL) {
            if (m->in_y) {
                memcpy(m->ystage->data, dy->data, ddl_tensor_bytes(dy));
            }
            src = m->ystage->data;
        }
        ddl_tensor_t in = flat(dt, m->ny_root, src);
        ddl_tensor_t to = m->y_inplace ? in : flat(dt, m->ny_leaf, m->dyw->data);
        DDL_CHECK(ddl_sum_reduce_adjoint(m->y_sr, &in, &to));
        gy = m->y_inplace ? src : m->dyw->data;
    }

    // Where the gradient of this P_x rank's input block lands.
    void *gx = NULL;
    if (m->in_x) {
        gx = m->dx_staged ? m->dxstage->data : (m->halo != NULL ? m->dxbuf->data : dx->data);
    }

    // The local adjoint: the input block gradient set (overwritten), dw and db accumulated.
    // When nobody reads dx (a model's first layer, ddl_layer_set_dx_unused) the kernel does
    // not compute it at all: the U-Net's and ResNet's first convolutions skip their dx pass.
    // With the shared scratch in a halo layout the input's gradient takes the padded
    // input's place: dw and db first, from the input, then dx (which reads only dy and
    // w) over it.
    // With dx_add (conv_can_add_dx: gin is dx itself) the kernel adds into it instead.
    bool  alias = m->shared && m->halo != NULL;
    void *gin   = L->dx_unused ? NULL : (fan ? m->dxw->data : gx);
    if (gin != NULL && (fan ? m->in_w : m->in_x) && !alias && !L->dx_add) {
        dx_clear_rest(m, dt, gin, fan ? m->nx_leaf : m->nx_blk);
    }
    void *dw, *db;
    kernel_grads(L, m, &dw, &db);
    if (m->work) {
        DDL_CHECK(ddl_conv_backward_ex(dt, &m->g, alias ? NULL : gin, dw, db, gy, m->conv_in,
                                       kernel_w(L, m), m->ws, m->ws_bytes,
                                       L->dx_add ? 0u : DDL_CONV_DX_SET));
    }
    if (alias && gin != NULL && m->in_x) {
        dx_clear_rest(m, dt, gin, m->nx_blk);
        if (m->work) {
            DDL_CHECK(ddl_conv_backward_ex(dt, &m->g, gin, NULL, NULL, gy, NULL, kernel_w(L, m),
                                           m->ws, m->ws_bytes, DDL_CONV_DX_SET));
        }
    }
    DDL_CHECK(grads_to_owners(L, m));
    if (L->dx_unused) {
        return DDL_OK;  // nobody reads dx: no B_x*, no halo adjoint
    }

    // Input block gradients summed over co onto P_x (B_x*).
    if (fan) {
        ddl_tensor_t in = flat(dt, m->nx_leaf, m->dxw->data), to = flat(dt, m->nx_root, gx);
        DDL_CHECK(ddl_broadcast_adjoint(m->x_bc, &in, &to));
    }

    // C* (zero embedding of the crop), H*, and the bulk out into dx.
    if (m->halo != NULL) {
        dx_unstage(m);
        DDL_CHECK(ddl_halo_exchange_adjoint(m->halo, m->dxbuf));
        dx_bulk_out(m, dx);
    } else if (m->in_x && m->dx_staged) {
        memcpy(dx->data, m->dxstage->data, ddl_tensor_bytes(dx));
    }
    return DDL_OK;
}

// ---- lifecycle -----------------------------------------------------------------

static void conv_destroy(ddl_layer_t *L)
{
    conv_impl *m = L->impl;
    if (m == NULL) {
        return;
    }
    ddl_broadcast_destroy(&m->w_bc);
    ddl_broadcast_destroy(&m->b_bc);
    ddl_broadcast_destroy(&m->x_bc);
    ddl_sum_reduce_destroy(&m->y_sr);
    ddl_halo_exchange_destroy(&m->halo);
    ddl_tensor_t **ts[] = {&m->xbuf, &m->dxbuf, &m->xstage, &m->dxstage, &m->xw, &m->dxw,
                           &m->yw,   &m->dyw,   &m->ystage, &m->w,       &m->dw, &m->b,
                           &m->db,   &m->gw,    &m->gb};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
        ddl_tensor_destroy(ts[i]);
    }
    if (!m->ws_borrowed) {
        ddl_free(m->ws);
    }
    ddl_partition_destroy(&m->P_yr);
    ddl_partition_destroy(&m->P_wr_own);
    ddl_partition_destroy(&m->P_br_own);
    ddl_partition_destroy(&m->P_b_own);
    ddl_free(m);
    L->impl = NULL;
}

static const ddl_layer_ops conv_ops; // below: a copy's source is a conv when its ops are these
static void                conv_set_scratch(ddl_layer_t *L, void *p);

// Takes the kernel workspace of `from`, the conv a forward-only copy is built from (it
// never runs at the same time, and no call leaves anything in the workspace for the
// next), when that is large enough. True if it did.
static bool borrow_ws(conv_impl *m, const ddl_layer_t *from)
{
    const conv_impl *f = from != NULL && from->ops == &conv_ops ? from->impl : NULL;
    if (f == NULL || f->ws == NULL || f->ws_bytes < m->ws_bytes) {
        return false;
    }
    m->ws          = f->ws;
    m->ws_bytes    = f->ws_bytes;
    m->ws_borrowed = true;
    return true;
}

// Backward can add into dx where its kernel writes dx itself: no halo (whose adjoint
// overwrites the bulk), no fan-out over channels (whose sum overwrites), no staging.
static bool conv_can_add_dx(const ddl_layer_t *L)
{
    const conv_impl *m = L->impl;
    return m->x_bc == NULL && !m->c.halo && !m->dx_staged;
}

static const ddl_layer_ops conv_ops = {
    .forward     = conv_forward,
    .backward    = conv_backward,
    .destroy     = conv_destroy,
    .set_scratch = conv_set_scratch,
    .can_add_dx  = conv_can_add_dx,
};

// Builds everything of a validated layer. P_y and P_w are P_x for the feature layer.
static ddl_status conv_setup(ddl_layer_t *L, conv_impl *m, const ddl_partition_t *P_x,
                             const ddl_partition_t *P_y, const ddl_partition_t *P_w,
                             const ddl_shape *xg, MPI_Comm U)
{
    const conv_cfg *c  = &m->c;
    ddl_dtype       dt = L->dt;
    bool            fan = c->kind != CONV_FEATURE;
    bool            rep = c->halo || c->B > 1; // parameters replicated: spatial or batch split
    int             nd  = c->ndim;
    bool            grads = ddl_layer_copy_source() == NULL; // a forward-only copy: no gradients
    // The feature layer shares its workspace, and its halo buffers when its input is
    // large (ddl_layer_share_min_bytes; decided from global sizes, alike on every rank),
    // or always in a forward-only copy: the threshold spares a small input the rebuild in
    // backward, which a copy never runs.
    double per_rank =
        (double)ddl_shape_numel(xg) * (double)ddl_dtype_size(dt) / (double)ddl_partition_size(P_x);
    m->ws_shared = ddl_layer_scratch_shared() && c->kind == CONV_FEATURE;
    m->shared    = m->ws_shared && (!c->halo || !grads || per_rank >= ddl_layer_share_min_bytes());

    ddl_shape yg = {.ndim = nd, .d = {c->N, c->C_out}};
    for (int j = 0; j < c->nsp; j++) {
        yg.d[2 + j] = c->out[j];
    }
    L->x_global = *xg;
    L->y_global = yg;
    L->x_shape  = ddl_partition_local_shape(P_x, xg);
    L->y_shape  = ddl_partition_local_shape(P_y, &yg);
    L->P_in     = P_x;
    L->P_out    = P_y;
    m->in_x     = ddl_partition_active(P_x);
    m->in_y     = ddl_partition_active(P_y);
    m->in_w     = ddl_partition_active(P_w);
    const int *iw = m->in_w ? ddl_partition_index(P_w) : NULL;
    // sp0: this P_w rank is in the owners' slab (spatial coordinates 0, and batch 0 for
    // the feature layer, whose dim 0 is the batch).
    bool       sp0 = iw == NULL || fan || iw[0] == 0;
    for (int j = 2; j < nd && iw != NULL; j++) {
        sp0 = sp0 && iw[j] == 0;
    }
    m->recv_bias = c->bias && m->in_w && iw[1] == 0;
    // A local failure (an allocation) before the last collective construction is kept in
    // lst and reported after it: returning at once would leave the other ranks waiting
    // in a collective this rank never joins. (LOCAL evaluates nothing once one failed.)
    ddl_status lst = DDL_OK;
#define LOCAL(expr)                                                                                \
    do {                                                                                           \
        if (lst == DDL_OK) {                                                                       \
            lst = (expr);                                                                          \
        }                                                                                          \
    } while (0)

    // Every collective construction below is followed by an agreement over the layer's
    // ranks (U), so a step that failed on some of them stops all of them there.
    // 1. The halo plan on P_x (no communication).
    if (c->halo) {
        int64_t K[DDL_MAX_DIMS], S[DDL_MAX_DIMS], Pd[DDL_MAX_DIMS], D[DDL_MAX_DIMS];
        for (int i = 0; i < nd; i++) {
            bool sp = i >= 2;
            K[i]    = sp ? c->k[i - 2] : 1;
            S[i]    = sp ? c->s[i - 2] : 1;
            Pd[i]   = sp ? c->p[i - 2] : 0;
            D[i]    = sp ? c->d[i - 2] : 1;
        }
        LOCAL(ddl_halo_exchange_create(P_x, dt, xg, K, S, Pd, D, &m->halo));
        if (m->halo != NULL) {
            ddl_shape hs = ddl_halo_exchange_shape(m->halo);
            m->bulk      = ddl_halo_exchange_bulk_box(m->halo);
            m->need      = ddl_halo_exchange_needed_box(m->halo);
            // Pads: zero, and stay zero (shared: restored before each use).
            LOCAL(ddl_scratch_tensor(dt, &hs, m->shared, &m->xbuf));
            if (grads) {
                LOCAL(ddl_scratch_tensor(dt, &hs, m->shared, &m->dxbuf));
            }
        }
        m->nx_blk = m->in_x ? ddl_box_numel(&m->need) : 0;
    } else {
        m->nx_blk = m->in_x ? ddl_shape_numel(&L->x_shape) : 0;
    }

    // 2. Partitions of the layer's own (collective over their members).
    const ddl_partition_t *P_wr = P_w, *P_br = NULL, *P_b = NULL;
    if (fan) {
        int shape[DDL_MAX_DIMS] = {c->P_co, 1};
        for (int j = 0; j < c->nsp; j++) {
            shape[2 + j] = c->S[j];
        }
        DDL_CHECK(ddl_agree(U, ddl_partition_create(ddl_partition_base(P_y), ddl_partition_size(P_y),
                                       ddl_partition_ranks(P_y), nd, shape, &m->P_yr)));
    }
    if (rep) {
        int wr[DDL_MAX_DIMS] = {c->P_co, c->P_ci}, br[DDL_MAX_DIMS] = {c->P_co, 1};
        int bs[DDL_MAX_DIMS] = {c->P_co, 1};
        for (int j = 0; j < c->nsp; j++) {
            wr[2 + j] = br[2 + j] = 1;
            bs[2 + j] = c->S[j];
        }
        DDL_CHECK(ddl_agree(U, sub_partition(P_w, !fan, false, true, wr, &m->P_wr_own)));
        P_wr = m->P_wr_own;
        if (c->bias && c->P_ci == 1) {
            P_br = P_wr;  // the same ranks and shape
            P_b  = P_w;
        } else if (c->bias) {
            DDL_CHECK(ddl_agree(U, sub_partition(P_w, false, true, true, br, &m->P_br_own)));
            DDL_CHECK(ddl_agree(U, sub_partition(P_w, false, true, false, bs, &m->P_b_own)));
            P_br = m->P_br_own;
            P_b  = m->P_b_own;
        }
    }

    // 3. Parameters: the blocks of this rank when it owns any.
    int64_t co_loc = 0, ci_loc = 0, co0 = 0, ci0 = 0;
    if (m->in_w) {
        co_loc = ddl_decomp_size(c->C_out, c->P_co, iw[0]);
        co0    = ddl_decomp_start(c->C_out, c->P_co, iw[0]);
        ci_loc = ddl_decomp_size(c->C_in, c->P_ci, iw[1]);
        ci0    = ddl_decomp_start(c->C_in, c->P_ci, iw[1]);
    }
    ddl_shape wg = {.ndim = nd, .d = {c->C_out, c->C_in}};
    ddl_box   wbox = {.ndim = nd};
    ddl_shape wblk = {.ndim = nd};  // the block a P_w rank convolves with (zero elsewhere)
    for (int j = 0; j < c->nsp; j++) {
        wg.d[2 + j] = c->k[j];
    }
    if (m->in_w) {
        wblk = ddl_shape_make(nd, (int64_t[]){co_loc, ci_loc, c->k[0], c->k[1], c->k[2]});
        if (!rep || sp0) {
            wbox = ddl_box_make(nd, (int64_t[]){co0, ci0, 0, 0, 0},
                                (int64_t[]){co0 + co_loc, ci0 + ci_loc, c->k[0], c->k[1], c->k[2]});
        }
    }
    int64_t fan_in = c->C_in;
    for (int j = 0; j < c->nsp; j++) {
        fan_in *= c->k[j];
    }
    LOCAL(ddl_layer_add_param(L, "weight", &wg, &wbox, DDL_INIT_KAIMING_UNIFORM, fan_in));
    if (c->bias) {
        ddl_shape bg   = ddl_shape_make(1, (int64_t[]){c->C_out});
        ddl_box   bbox = {.ndim = 1};
        if (m->recv_bias && (!rep || sp0)) {
            bbox = ddl_box_make(1, (int64_t[]){co0}, (int64_t[]){co0 + co_loc});
        }
        LOCAL(ddl_layer_add_param(L, "bias", &bg, &bbox, DDL_INIT_FAN_IN_UNIFORM, fan_in));
    }

    // 4. Parameter replication (halo layouts).
    if (rep) {
        DDL_CHECK(ddl_agree(U, ddl_broadcast_create(P_wr, P_w, false, false, dt, &wblk, &m->w_bc)));
        LOCAL(ddl_tensor_create(dt, &wblk, &m->w));
        if (grads) {
            LOCAL(ddl_tensor_create(dt, &wblk, &m->dw));
            LOCAL(ddl_tensor_create(dt, &L->params[0].value->shape, &m->gw));
        }
        m->w_inplace = ddl_broadcast_in_place_ok(m->w_bc);
        if (c->bias) {
            ddl_shape bblk = ddl_shape_make(1, (int64_t[]){m->recv_bias ? co_loc : 0});
            DDL_CHECK(ddl_agree(U, ddl_broadcast_create(P_br, P_b, false, false, dt, &bblk, &m->b_bc)));
            LOCAL(ddl_tensor_create(dt, &bblk, &m->b));
            if (grads) {
                LOCAL(ddl_tensor_create(dt, &bblk, &m->db));
                LOCAL(ddl_tensor_create(dt, &L->params[1].value->shape, &m->gb));
            }
            m->b_inplace = ddl_broadcast_in_place_ok(m->b_bc);
        }
    }

    // 5. The fans: x down co onto P_w, y over ci onto P_y'.
    bool x_env = false;
    if (fan) {
        bool    y_env;
        int64_t nx = fan_count(c, P_x, 1, P_w, 1, false, &x_env);
        int64_t ny = fan_count(c, m->P_yr, 0, P_w, 0, true, &y_env);
        ddl_shape sx = ddl_shape_make(1, (int64_t[]){nx}), sy = ddl_shape_make(1, (int64_t[]){ny});
        DDL_CHECK(ddl_agree(U, ddl_broadcast_create(P_x, P_w, false, false, dt, &sx, &m->x_bc)));
        DDL_CHECK(ddl_agree(U, ddl_sum_reduce_create(P_w, m->P_yr, false, false, dt, &sy, &m->y_sr)));
        ddl_shape s;
        s = ddl_broadcast_x_shape(m->x_bc);
        m->nx_root = ddl_shape_numel(&s);
        s = ddl_broadcast_y_shape(m->x_bc);
        m->nx_leaf = ddl_shape_numel(&s);
        s = ddl_sum_reduce_x_shape(m->y_sr);
        m->ny_leaf = ddl_shape_numel(&s);
        s = ddl_sum_reduce_y_shape(m->y_sr);
        m->ny_root = ddl_shape_numel(&s);
        LOCAL(flat_create(dt, m->nx_leaf, &m->xw));
        if (grads) {
            LOCAL(flat_create(dt, m->nx_leaf, &m->dxw));
            LOCAL(flat_create(dt, m->ny_leaf, &m->dyw));
        }
        LOCAL(flat_create(dt, m->ny_leaf, &m->yw));
        if (y_env) {
            LOCAL(flat_create(dt, m->ny_root, &m->ystage));
        }
        m->x_inplace = ddl_broadcast_in_place_ok(m->x_bc);
        m->y_inplace = ddl_sum_reduce_in_place_ok(m->y_sr);
    }

    // The collectives are behind us: report a deferred local failure now.
#undef LOCAL
    DDL_CHECK(lst);

    // 6. Staging on P_x: the needed crop (halo layouts, unless it is the whole buffer), or
    //    an envelope. The feature layer without a halo reads x itself (no copy).
    bool need_whole = m->halo != NULL && box_is_full(&m->need, &m->xbuf->shape);
    if (m->in_x) {
        if (c->halo) {
            m->x_staged  = !need_whole || x_env;
            m->dx_staged = m->x_staged;
        } else {
            m->x_staged  = fan && x_env;
            m->dx_staged = m->x_staged;
        }
    }
    int64_t   cap = m->nx_blk > m->nx_root ? m->nx_blk : m->nx_root;
    ddl_shape xs  = {.ndim = 1, .d = {m->x_staged ? cap : 0}};
    ddl_shape dxs = {.ndim = 1, .d = {m->dx_staged ? cap : 0}};
    DDL_CHECK(ddl_scratch_tensor(dt, &xs, m->shared, &m->xstage));
    if (grads) {
        DDL_CHECK(ddl_scratch_tensor(dt, &dxs, m->shared, &m->dxstage));
    }

    // 7. The local kernel on P_w, and the block it reads.
    int64_t n_loc = m->in_w ? ddl_decomp_size(c->N, c->B, fan ? 0 : iw[0]) : 0; // samples here
    if (m->in_w) {
        const int *sp = iw + 2;
        int64_t    in_ext[3], out_ext[3], zero[3] = {0, 0, 0};
        m->work = n_loc > 0;
        for (int j = 0; j < c->nsp; j++) {
            in_ext[j]  = sp_extent(c, j, sp[j], false);
            out_ext[j] = sp_extent(c, j, sp[j], true);
            m->work    = m->work && out_ext[j] > 0;
        }
        if (m->work) {
            DDL_CHECK(ddl_conv_geom_init(&m->g, c->nsp, n_loc, ci_loc, co_loc, in_ext, c->k, c->s,
                                         c->halo ? zero : c->p, c->d));
            for (int j = 0; j < c->nsp; j++) {
                DDL_REQUIRE(m->g.out[j] == out_ext[j], DDL_EINTERNAL,
                            "%s: local output extent %lld != share %lld in spatial dim %d",
                            L->kind, (long long)m->g.out[j], (long long)out_ext[j], j);
            }
            // Shared, the kernel's input is the padded buffer or its crop, both carved
            // below with the tail the direct path reads past them: it reads them in
            // place, and its workspace holds no padded copy of a sample.
            if (m->shared && m->halo != NULL) {
                m->g.x_tail = ddl_conv_x_tail_need(dt, &m->g);
            }
            m->ws_bytes    = ddl_conv_workspace_bytes(dt, &m->g);
            m->ws_borrowed = m->ws_shared; // in the scratch
            if (m->ws_bytes > 0 && !m->ws_shared && !borrow_ws(m, ddl_layer_copy_source())) {
                m->ws = ddl_malloc(m->ws_bytes);
                if (m->ws == NULL) {
                    return ddl_set_error(DDL_ENOMEM, "%s: cannot allocate a %zu-byte workspace",
                                         L->kind, m->ws_bytes);
                }
            }
        }
        // The feature layer's block is set by every forward (xstage, the halo buffer when
        // needed whole, or the caller's x).
        if (fan) {
            m->conv_in = m->xw->data;
        }
    }
    // The feature layer writes its output in place: its block must be y's local shape.
    if (!fan && m->work) {
        ddl_shape ys = {.ndim = nd, .d = {n_loc, c->C_out}};
        for (int j = 0; j < c->nsp; j++) {
            ys.d[2 + j] = m->g.out[j];
        }
        DDL_REQUIRE(ddl_shape_equal(&ys, &L->y_shape), DDL_EINTERNAL,
                    "%s: local output block differs from y's local shape", L->kind);
    }
    // 8. The shared scratch's layout: [workspace | x padded | x crop], the gradients of
    //    the padded input and its crop over the same bytes as those (backward computes
    //    dw and db from the input first, then dx in its place: conv_backward).
    //    Each input is followed by the tail the kernel may read past it (x_tail). A layer
    //    that keeps its own halo buffers puts only its workspace there.
    if (m->ws_shared) {
        size_t total = 0, tail = m->work ? (size_t)m->g.x_tail * ddl_dtype_size(dt) : 0;
        m->off_ws    = ddl_scratch_carve(&total, m->work ? m->ws_bytes : 0);
        if (m->shared) {
            m->off_x =
                ddl_scratch_carve(&total, m->xbuf != NULL ? ddl_tensor_bytes(m->xbuf) + tail : 0);
            m->off_xs = ddl_scratch_carve(&total, ddl_tensor_bytes(m->xstage) + tail);
        }
        L->scratch_bytes = total;
    }
    return DDL_OK;
}

static void conv_set_scratch(ddl_layer_t *L, void *p)
{
    conv_impl *m       = L->impl;
    char      *b       = p;
    m->ws              = m->work && m->ws_bytes > 0 ? b + m->off_ws : NULL;
    if (!m->shared) {
        return; // its halo buffers are its own
    }
    ddl_tensor_t *ts[] = {m->xbuf, m->xstage, m->dxbuf, m->dxstage};
    size_t        at[] = {m->off_x, m->off_xs, m->off_x, m->off_xs};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
        if (ts[i] != NULL) {
            ts[i]->data = b + at[i];
        }
    }
}

ddl_status ddl_conv_create(const ddl_partition_t *P_x, const ddl_partition_t *P_y,
                           const ddl_partition_t *P_w, ddl_dtype dt, const ddl_shape *x_global,
                           const ddl_conv_params *p, ddl_layer_t **out)
{
    DDL_REQUIRE(out != NULL, DDL_EINVAL, "conv: out is NULL");
    *out = NULL;
    conv_cfg c;
    DDL_CHECK(conv_validate(P_x, P_y, P_w, dt, x_global, p, &c));
    if (c.kind == CONV_FEATURE) {
        P_y = P_x;
        P_w = P_x;
    }
    ddl_layer_t *L = NULL;
    ddl_status ast = ddl_layer_alloc(&conv_ops, kind_name[c.kind], dt, &L);
    conv_impl *m   = ast == DDL_OK ? ddl_calloc(1, sizeof *m) : NULL;
    if (ast == DDL_OK && m == NULL) {
        ast = ddl_set_error(DDL_ENOMEM, "%s: out of memory", kind_name[c.kind]);
    }
    // The members agree on these allocations before any collective construction, so a
    // member whose allocation failed fails them all instead of leaving them waiting.
    MPI_Comm   U   = MPI_COMM_NULL;
    ddl_status ust = ddl_partition_union_comm(P_x, P_y, P_w, &U);
    ast            = ddl_agree(U, ast != DDL_OK ? ast : ust);
    if (ast != DDL_OK) {
        if (U != MPI_COMM_NULL) {
            MPI_Comm_free(&U);
        }
        ddl_free(m);
        ddl_layer_destroy(&L);
        return ast;
    }
    m->c          = c;
    L->impl       = m;
    ddl_status st = conv_setup(L, m, P_x, P_y, P_w, x_global, U);
    if (U != MPI_COMM_NULL) {
        MPI_Comm_free(&U);
    }
    if (st != DDL_OK) {
        ddl_layer_destroy(&L);
        return st;
    }
    *out = L;
    return DDL_OK;
}
