// layers/upsample.c: distributed upsampling / interpolation (DistDL DistributedUpsample,
// torch.nn.Upsample semantics) of x [N, C, spatial...] on a partition P_x.
//
// Shapes. x_global is [N, C, in...] with 1 to 3 spatial dims; y_global is [N, C, out...]
// with out = floor(in * scale_factor) or the given size per spatial dim. x and y are
// both decomposed balanced over the same P_x (of x's ndim), which may split any dims:
// typically only the spatial ones ([1, 1, S...]), but batch and channel splits work too
// (their blocks are the same in x and y). No parameters.
//
// Math. The layer is linear: y = A E x, where
//   E  (the exchange) gives every rank r the input box it reads, Need_r: its own batch
//      and channel block, and per spatial dim the range [need_start, need_stop) that
//      ddl_interpolate_need reports for r's output range. Need_r overlaps the x boxes
//      of possibly several ranks on both sides (a downsampling rank may read well past
//      its neighbours), so E is a general overlapping gather: piece X_s ∩ Need_r of
//      rank s's x is copied into rank r's need buffer, for every pair (s, r);
//   A  is the local interpolation kernel with global offsets (in_start = Need_r.start,
//      out_start = r's output box), bit-identical to the sequential result.
// Adjoint: dx = E* A^T dy. A^T is ddl_interpolate_backward (a scatter-add) into a zeroed
// need buffer; E* sends every piece back to the rank it came from, which ADDS it into
// dx (entries read by several ranks get the sum of their contributions). Forward and
// backward overwrite y and dx.
//
// HaloExchange is not used: it is parameterized by a sliding window (kernel, stride,
// padding, dilation) and reaches only the immediate neighbour, which does not describe
// interpolation ranges in general. The exchange is planned here once, in create, from
// index arithmetic every rank can do alone (all partitions' shapes are known
// everywhere): for this rank, the pieces it sends (its x box against every Need_r) and
// receives (its Need box against every x box), each with a contiguous staging buffer;
// the overlap with itself is a local copy. Forward posts the receives, packs and posts
// the sends, copies its own piece, waits, then unpacks; the adjoint runs the same
// pieces in the other direction with unpack-add. Messages above INT_MAX elements are
// split into chunks. When Need_r lies inside rank r's own x box (no halo, e.g. integer
// nearest downsampling aligned with the decomposition) the kernel reads x directly.
//
// Collectivity. Create is collective over P_x (it duplicates P_x's communicator, so
// the layer's messages never meet anyone else's). Forward and backward are collective
// over P_x (point-to-point with the ranks this rank exchanges pieces with); ranks
// outside P_x hold zero-volume x and y and return at once. Forward and backward
// allocate nothing.
#include <limits.h>
#include <math.h>
#include <string.h>

#include "base/check.h"
#include "ddl/agree.h"
#include "ddl/base.h"
#include "ddl/decomp.h"
#include "layers/layer_impl.h"
#include "partition/mpi_check.h"
#include "primitives/traffic.h"

#define TAG_FORWARD 211
#define TAG_ADJOINT 213
#define MAX_COUNT   ((int64_t)INT_MAX)  // elements per MPI message

// One remote piece: a box of this rank's x (sent by forward, received by the adjoint)
// or of its need buffer (received by forward, sent by the adjoint), in the local
// coordinates of that tensor, with its slot in the staging buffer.
typedef struct piece {
    int     peer;     // rank in the layer's communicator (= position in P_x)
    ddl_box box;      // local coordinates
    int64_t n;        // elements
    size_t  off;      // byte offset of the piece's slot in the staging buffer
} piece;

typedef struct up_impl {
    bool                   active;     // this rank is in P_x
    ddl_interpolate_params ip;
    ddl_interpolate_window win;        // this rank's input window (need or x) and output box
    int64_t                B;          // local N * C
    MPI_Comm               comm;       // duplicate of P_x's communicator
    bool                   direct;     // the kernel reads x itself (Need inside the x box)
    ddl_tensor_t          *need;       // [N_loc, C_loc, need...]; also its gradient in backward
    bool                   has_self;   // my x box meets my Need box (and !direct)
    ddl_box                self_x, self_n;  // that overlap in x and need coordinates
    int                    nsend, nrecv;
    piece                 *send;       // pieces of my x box, to other ranks' Need
    piece                 *recv;       // pieces of my Need box, from other ranks' x
    void                  *sbuf, *rbuf;  // staging for send and recv pieces
    // The shared scratch (ddl_layer_share_scratch): need and the staging live only within
    // one call (backward reads none of the forward's: the layer is linear), so they are
    // views of the model's one block, [need | sbuf | rbuf].
    bool                   shared;
    size_t                 off_s, off_r;
    int                    nreq;       // MPI requests (chunks) of both lists
    MPI_Request           *req;
} up_impl;

// ---- the exchange E and its adjoint ---------------------------------------------

static int64_t nchunks(int64_t n)
{
    return n == 0 ? 0 : (n + MAX_COUNT - 1) / MAX_COUNT;
}

// Posts the chunks of one piece (receive or send) from its slot in buf; advances *r.
static ddl_status post(const up_impl *u, const piece *p, void *buf, bool recv, int tag, int *r)
{
    ddl_dtype    dt  = u->need->dtype;
    size_t       esz = ddl_dtype_size(dt);
    MPI_Datatype et  = dt == DDL_F64 ? MPI_DOUBLE : MPI_FLOAT;
    for (int64_t o = 0; o < p->n; o += MAX_COUNT) {
        int   c = (int)(p->n - o < MAX_COUNT ? p->n - o : MAX_COUNT);
        char *a = (char *)buf + p->off + (size_t)o * esz;
        if (recv) {
            DDL_CHECK_MPI(MPI_Irecv(a, c, et, p->peer, tag, u->comm, &u->req[*r]));
        } else {
            DDL_CHECK_MPI(MPI_Isend(a, c, et, p->peer, tag, u->comm, &u->req[*r]));
        }
        (*r)++;
    }
    return DDL_OK;
}

static ddl_status wait_all(const up_impl *u, int r)
{
    if (r > 0) {
        DDL_CHECK_MPI(MPI_Waitall(r, u->req, MPI_STATUSES_IGNORE));
    }
    return DDL_OK;
}

// Counts one execution of E (forward) or E* (adjoint) in the process counters: the
// remote pieces, as halo_exchange (DistDL's DistributedUpsample gathers the same ranges
// with a HaloExchange); the own piece is a self copy, never counted.
static void count(const up_impl *u, ddl_traffic_pass pass)
{
    size_t   esz = ddl_dtype_size(u->need->dtype);
    uint64_t s = 0, r = 0;
    for (int i = 0; i < u->nsend; i++) {
        s += (uint64_t)u->send[i].n * esz;
    }
    for (int i = 0; i < u->nrecv; i++) {
        r += (uint64_t)u->recv[i].n * esz;
    }
    if (pass == DDL_TRAFFIC_FORWARD) {
        ddl__traffic_add(DDL_TRAFFIC_HALO_EXCHANGE, pass, s, r);
    } else {
        ddl__traffic_add(DDL_TRAFFIC_HALO_EXCHANGE, pass, r, s);
    }
}

// need = E x: receive the need pieces, send the x pieces, copy the own piece.
static ddl_status gather_forward(const up_impl *u, const ddl_tensor_t *x, ddl_tensor_t *need)
{
    count(u, DDL_TRAFFIC_FORWARD);
    int r = 0;
    for (int i = 0; i < u->nrecv; i++) {
        DDL_CHECK(post(u, &u->recv[i], u->rbuf, true, TAG_FORWARD, &r));
    }
    for (int i = 0; i < u->nsend; i++) {
        const piece *p = &u->send[i];
        ddl_tensor_pack(x, &p->box, (char *)u->sbuf + p->off);
        DDL_CHECK(post(u, p, u->sbuf, false, TAG_FORWARD, &r));
    }
    if (u->has_self) {
        ddl_tensor_copy_box(x, &u->self_x, need, &u->self_n);
    }
    DDL_CHECK(wait_all(u, r));
    for (int i = 0; i < u->nrecv; i++) {
        const piece *p = &u->recv[i];
        ddl_tensor_unpack(need, &p->box, (char *)u->rbuf + p->off);
    }
    return DDL_OK;
}

// dx += E* dneed: the same pieces in the other direction, added where they came from.
static ddl_status gather_adjoint(const up_impl *u, const ddl_tensor_t *dneed, ddl_tensor_t *dx)
{
    count(u, DDL_TRAFFIC_ADJOINT);
    int r = 0;
    for (int i = 0; i < u->nsend; i++) {
        DDL_CHECK(post(u, &u->send[i], u->sbuf, true, TAG_ADJOINT, &r));
    }
    for (int i = 0; i < u->nrecv; i++) {
        const piece *p = &u->recv[i];
        ddl_tensor_pack(dneed, &p->box, (char *)u->rbuf + p->off);
        DDL_CHECK(post(u, p, u->rbuf, false, TAG_ADJOINT, &r));
    }
    if (u->has_self) {
        ddl_tensor_add_box(dneed, &u->self_n, dx, &u->self_x);
    }
    DDL_CHECK(wait_all(u, r));
    for (int i = 0; i < u->nsend; i++) {
        const piece *p = &u->send[i];
        ddl_tensor_unpack_add(dx, &p->box, (char *)u->sbuf + p->off);
    }
    return DDL_OK;
}

// The two above, timed as halo_exchange (ddl_traffic_time_snapshot), as they are counted.
static ddl_status exchange_forward(const up_impl *u, const ddl_tensor_t *x, ddl_tensor_t *need)
{
    double     t0 = ddl__traffic_clock();
    ddl_status st = gather_forward(u, x, need);
    ddl__traffic_time(DDL_TRAFFIC_HALO_EXCHANGE, DDL_TRAFFIC_FORWARD, t0);
    return st;
}

static ddl_status exchange_adjoint(const up_impl *u, const ddl_tensor_t *dneed, ddl_tensor_t *dx)
{
    double     t0 = ddl__traffic_clock();
    ddl_status st = gather_adjoint(u, dneed, dx);
    ddl__traffic_time(DDL_TRAFFIC_HALO_EXCHANGE, DDL_TRAFFIC_ADJOINT, t0);
    return st;
}

// ---- forward and backward -------------------------------------------------------

static ddl_status up_forward(ddl_layer_t *L, const ddl_tensor_t *x, ddl_tensor_t *y)
{
    up_impl *u = L->impl;
    if (!u->active) {
        return DDL_OK;
    }
    DDL_CHECK(ddl_layer_check_scratch(L, u->shared));
    // A direct rank still serves the pieces of x its neighbours read.
    DDL_CHECK(exchange_forward(u, x, u->need));
    const void *in = u->direct ? x->data : u->need->data;
    return ddl_interpolate_forward(L->dt, y->data, in, &u->ip, &u->win, u->B);
}

static ddl_status up_backward(ddl_layer_t *L, const ddl_tensor_t *dy, ddl_tensor_t *dx)
{
    up_impl *u = L->impl;
    if (!u->active) {
        return DDL_OK;
    }
    DDL_CHECK(ddl_layer_check_scratch(L, u->shared));
    ddl_tensor_zero(dx);
    if (u->direct) {
        DDL_CHECK(ddl_interpolate_backward(L->dt, dx->data, dy->data, &u->ip, &u->win, u->B));
        return exchange_adjoint(u, u->need, dx);
    }
    ddl_tensor_zero(u->need);
    DDL_CHECK(ddl_interpolate_backward(L->dt, u->need->data, dy->data, &u->ip, &u->win, u->B));
    return exchange_adjoint(u, u->need, dx);
}

// ---- lifecycle --------------------------------------------------------------------

static void up_destroy(ddl_layer_t *L)
{
    up_impl *u = L->impl;
    if (u == NULL) {
        return;
    }
    if (u->comm != MPI_COMM_NULL) {
        MPI_Comm_free(&u->comm);
    }
    ddl_tensor_destroy(&u->need);
    ddl_free(u->send);
    ddl_free(u->recv);
    if (!u->shared) {
        ddl_free(u->sbuf);
        ddl_free(u->rbuf);
    }
    ddl_free(u->req);
    ddl_free(u);
    L->impl = NULL;
}

static void up_set_scratch(ddl_layer_t *L, void *p)
{
    up_impl *u    = L->impl;
    u->need->data = p;
    u->sbuf       = (char *)p + u->off_s;
    u->rbuf       = (char *)p + u->off_r;
}

static const ddl_layer_ops up_ops = {
    .forward     = up_forward,
    .backward    = up_backward,
    .destroy     = up_destroy,
    .set_scratch = up_set_scratch,
};

// Pure checks and the interpolation parameters: the same verdict on every rank.
static ddl_status params(ddl_dtype dt, const ddl_shape *x_global, ddl_upsample_mode mode,
                         bool align_corners, const double *scale_factor, const int64_t *size,
                         ddl_interpolate_params *ip)
{
    DDL_REQUIRE(x_global != NULL, DDL_EINVAL, "upsample: x_global must not be NULL");
    DDL_REQUIRE(dt == DDL_F32 || dt == DDL_F64, DDL_EINVAL, "upsample: unknown dtype %d",
                (int)dt);
    int nd = x_global->ndim;
    DDL_REQUIRE(nd >= 3 && nd <= 2 + DDL_INTERPOLATE_MAX_DIMS, DDL_EINVAL,
                "upsample: x has %d dims, expected [N, C, spatial...] with 1 to %d spatial dims",
                nd, DDL_INTERPOLATE_MAX_DIMS);
    DDL_REQUIRE(mode == DDL_UPSAMPLE_NEAREST || mode == DDL_UPSAMPLE_LINEAR, DDL_EINVAL,
                "upsample: unknown mode %d (nearest or linear)", (int)mode);
    DDL_REQUIRE(!(align_corners && mode == DDL_UPSAMPLE_NEAREST), DDL_EINVAL,
                "upsample: align_corners can only be set with the linear mode (as in PyTorch)");
    DDL_REQUIRE((scale_factor == NULL) != (size == NULL), DDL_EINVAL,
                "upsample: give exactly one of scale_factor and size (got %s)",
                scale_factor == NULL ? "neither" : "both");
    DDL_REQUIRE(x_global->d[0] >= 0 && x_global->d[1] >= 0, DDL_EINVAL,
                "upsample: x_global [N, C] = [%lld, %lld] has a negative size",
                (long long)x_global->d[0], (long long)x_global->d[1]);
    memset(ip, 0, sizeof *ip);
    ip->mode = mode == DDL_UPSAMPLE_LINEAR ? DDL_INTERPOLATE_LINEAR : DDL_INTERPOLATE_NEAREST;
    ip->align_corners = align_corners;
    ip->ndim          = nd - 2;
    for (int k = 0; k < ip->ndim; k++) {
        int64_t in = x_global->d[2 + k];
        DDL_REQUIRE(in >= 1, DDL_EINVAL,
                    "upsample: spatial dim %d of x has size %lld, expected >= 1", k, (long long)in);
        ip->in_global[k] = in;
        if (scale_factor != NULL) {
            double s = scale_factor[k];
            // Bounded: 1e8 made a layer that spun for minutes, 1e300 overflowed int64.
            DDL_REQUIRE(isfinite(s) && s > 0.0 && s <= DDL_UPSAMPLE_MAX_SCALE, DDL_EINVAL,
                        "upsample: scale_factor[%d] = %g must be in (0, %g] "
                        "(DDL_UPSAMPLE_MAX_SCALE)",
                        k, s, DDL_UPSAMPLE_MAX_SCALE);
            ip->out_global[k]   = ddl_interpolate_out_size(in, s);
            ip->scale_factor[k] = s;
            DDL_REQUIRE(ip->out_global[k] >= 1, DDL_EINVAL,
                        "upsample: scale_factor[%d] = %g turns size %lld into %lld; the output "
                        "must have at least 1 element",
                        k, s, (long long)in, (long long)ip->out_global[k]);
        } else {
            DDL_REQUIRE(size[k] >= 1, DDL_EINVAL, "upsample: size[%d] = %lld must be >= 1", k,
                        (long long)size[k]);
            ip->out_global[k] = size[k];
        }
    }
    // Both tensors within the per-tensor cap (their products cannot overflow).
    ddl_shape y = *x_global;
    for (int k = 0; k < ip->ndim; k++) {
        y.d[2 + k] = ip->out_global[k];
    }
    int64_t n;
    DDL_CHECK(ddl_shape_numel_checked(x_global, &n));
    DDL_CHECK(ddl_shape_numel_checked(&y, &n));
    return DDL_OK;
}

static ddl_status validate(const ddl_partition_t *P_x, ddl_dtype dt, const ddl_shape *x_global,
                           ddl_upsample_mode mode, bool align_corners, const double *scale_factor,
                           const int64_t *size, ddl_interpolate_params *ip)
{
    DDL_REQUIRE(P_x != NULL && x_global != NULL, DDL_EINVAL,
                "upsample: P_x and x_global must not be NULL");
    DDL_REQUIRE(ddl_partition_ndim(P_x) == x_global->ndim, DDL_EINVAL,
                "upsample: P_x has %d dims but x has %d", ddl_partition_ndim(P_x), x_global->ndim);
    return params(dt, x_global, mode, align_corners, scale_factor, size, ip);
}

// Rank r's Need box (global coordinates): its batch/channel block, and per spatial dim
// the input range its output box reads. Empty when its output box is.
static ddl_status need_box(ddl_dtype dt, const ddl_interpolate_params *ip, const ddl_box *xb,
                           const ddl_box *yb, ddl_box *out)
{
    ddl_box b = {.ndim = xb->ndim};
    if (ddl_box_numel(yb) == 0) {
        *out = b;
        return DDL_OK;
    }
    for (int d = 0; d < 2; d++) {
        b.start[d] = xb->start[d];
        b.stop[d]  = xb->stop[d];
    }
    for (int k = 0; k < ip->ndim; k++) {
        int64_t o0 = yb->start[2 + k], on = yb->stop[2 + k] - o0;
        DDL_CHECK(ddl_interpolate_need(dt, ip, k, o0, on, &b.start[2 + k], &b.stop[2 + k]));
    }
    *out = b;
    return DDL_OK;
}

static bool box_inside(const ddl_box *a, const ddl_box *b)
{
    for (int d = 0; d < a->ndim; d++) {
        if (a->start[d] < b->start[d] || a->stop[d] > b->stop[d]) {
            return false;
        }
    }
    return true;
}

// The exchange's geometry, pure (no MPI): x and y split shape-way, block `me` of np.
typedef struct geom {
    ddl_dtype                     dt;
    const ddl_interpolate_params *ip;
    const ddl_shape              *xg, *yg;
    const int                    *shape;
    int                           np, me;
} geom;

// Walks the blocks (starting after this one, to spread the traffic) and collects the
// pieces of block me's plan: with out == NULL it only counts. `sending`: my x box
// against every Need box; otherwise my Need box against every x box.
static ddl_status collect(const geom *g, const ddl_box *my_x, const ddl_box *my_need, bool sending,
                          piece *out, int *count, size_t *bytes)
{
    int    nd  = g->xg->ndim;
    size_t esz = ddl_dtype_size(g->dt);
    int    k   = 0;
    size_t off = 0;
    for (int i = 1; i < g->np; i++) {
        int j = (g->me + i) % g->np;
        int coord[DDL_MAX_DIMS];
        ddl_index_unravel(nd, g->shape, j, coord);
        ddl_box xj = ddl_decomp_box(g->xg, g->shape, coord);
        ddl_box yj = ddl_decomp_box(g->yg, g->shape, coord), nj;
        ddl_box ov;
        if (sending) {
            DDL_CHECK(need_box(g->dt, g->ip, &xj, &yj, &nj));
            if (!ddl_box_intersect(my_x, &nj, &ov)) {
                continue;
            }
        } else if (!ddl_box_intersect(&xj, my_need, &ov)) {
            continue;
        }
        if (out != NULL) {
            out[k].peer = j;
            out[k].box  = ddl_box_shift(&ov, sending ? my_x->start : my_need->start, 1);
            out[k].n    = ddl_box_numel(&ov);
            out[k].off  = off;
        }
        // Slots stay 64-byte aligned.
        off += ((size_t)ddl_box_numel(&ov) * esz + 63) / 64 * 64;
        k++;
    }
    *count = k;
    *bytes = off;
    return DDL_OK;
}

// Block me's boxes: its x and y blocks, the input window its output reads (nb), and
// whether that window lies in its own x (direct: no gathering).
static ddl_status block_boxes(const geom *g, ddl_box *xb, ddl_box *yb, ddl_box *nb, bool *direct)
{
    int coord[DDL_MAX_DIMS];
    ddl_index_unravel(g->xg->ndim, g->shape, g->me, coord);
    *xb = ddl_decomp_box(g->xg, g->shape, coord);
    *yb = ddl_decomp_box(g->yg, g->shape, coord);
    DDL_CHECK(need_box(g->dt, g->ip, xb, yb, nb));
    *direct = ddl_box_numel(nb) == 0 || box_inside(nb, xb);
    return DDL_OK;
}

// The staging of block me: how many pieces it sends and receives, and their bytes
// (nothing received when direct).
static ddl_status staging(const geom *g, const ddl_box *xb, const ddl_box *nb, bool direct,
                          int *nsend, size_t *sbytes, int *nrecv, size_t *rbytes)
{
    *nrecv  = 0;
    *rbytes = 0;
    DDL_CHECK(collect(g, xb, nb, true, NULL, nsend, sbytes));
    return direct ? DDL_OK : collect(g, xb, nb, false, NULL, nrecv, rbytes);
}

// The bytes of block g->me's per-call buffers as plan lays them out in the shared
// scratch (the gathered window, then the send and receive staging), from the geometry
// alone: the estimate's count, which test_upsample_layer checks against plan's.
static ddl_status block_scratch(const geom *g, size_t *total)
{
    ddl_box xb, yb, nb;
    bool    direct;
    int     nsend, nrecv;
    size_t  sbytes, rbytes;
    DDL_CHECK(block_boxes(g, &xb, &yb, &nb, &direct));
    DDL_CHECK(staging(g, &xb, &nb, direct, &nsend, &sbytes, &nrecv, &rbytes));
    *total = 0;
    (void)ddl_scratch_carve(total, direct ? 0 : (size_t)ddl_box_numel(&nb) * ddl_dtype_size(g->dt));
    (void)ddl_scratch_carve(total, sbytes);
    (void)ddl_scratch_carve(total, rbytes);
    return DDL_OK;
}

static ddl_status plan(ddl_layer_t *L)
{
    up_impl *u  = L->impl;
    int      nd = L->x_global.ndim;
    geom     g  = {.dt    = L->dt,
                   .ip    = &u->ip,
                   .xg    = &L->x_global,
                   .yg    = &L->y_global,
                   .shape = ddl_partition_shape(L->P_in),
                   .np    = ddl_partition_size(L->P_in),
                   .me    = ddl_partition_rank(L->P_in)};
    ddl_box  xb, yb, nb;
    DDL_CHECK(block_boxes(&g, &xb, &yb, &nb, &u->direct));
    u->B              = L->x_shape.d[0] * L->x_shape.d[1];
    const ddl_box *in = u->direct ? &xb : &nb;
    for (int k = 0; k < u->ip.ndim; k++) {
        u->win.in_start[k]  = in->start[2 + k];
        u->win.in_n[k]      = in->stop[2 + k] - in->start[2 + k];
        u->win.out_start[k] = yb.start[2 + k];
        u->win.out_n[k]     = yb.stop[2 + k] - yb.start[2 + k];
    }
    ddl_shape ns = u->direct ? ddl_shape_make(nd, (int64_t[DDL_MAX_DIMS]){0}) : ddl_box_shape(&nb);
    u->shared    = ddl_layer_scratch_shared();
    DDL_CHECK(ddl_scratch_tensor(L->dt, &ns, u->shared, &u->need));
    if (!u->direct) {
        ddl_box ov;
        u->has_self = ddl_box_intersect(&xb, &nb, &ov);
        if (u->has_self) {
            u->self_x = ddl_box_shift(&ov, xb.start, 1);
            u->self_n = ddl_box_shift(&ov, nb.start, 1);
        }
    }
    // Two passes per list: count and size, then fill.
    size_t sbytes, rbytes;
    DDL_CHECK(staging(&g, &xb, &nb, u->direct, &u->nsend, &sbytes, &u->nrecv, &rbytes));
    u->send = ddl_calloc((size_t)u->nsend + 1, sizeof(piece));
    u->recv = ddl_calloc((size_t)u->nrecv + 1, sizeof(piece));
    if (u->shared) {
        size_t total = 0;
        (void)ddl_scratch_carve(&total, ddl_tensor_bytes(u->need));
        u->off_s         = ddl_scratch_carve(&total, sbytes);
        u->off_r         = ddl_scratch_carve(&total, rbytes);
        L->scratch_bytes = total;
    } else {
        u->sbuf = ddl_malloc(sbytes);
        u->rbuf = ddl_malloc(rbytes);
    }
    DDL_REQUIRE(u->send && u->recv && (u->shared || (u->sbuf && u->rbuf)), DDL_ENOMEM,
                "upsample: out of memory for the exchange plan");
    DDL_CHECK(collect(&g, &xb, &nb, true, u->send, &u->nsend, &sbytes));
    if (!u->direct) {
        DDL_CHECK(collect(&g, &xb, &nb, false, u->recv, &u->nrecv, &rbytes));
    }
    int64_t nreq = 0;
    for (int i = 0; i < u->nsend; i++) {
        nreq += nchunks(u->send[i].n);
    }
    for (int i = 0; i < u->nrecv; i++) {
        nreq += nchunks(u->recv[i].n);
    }
    DDL_REQUIRE(nreq <= INT_MAX, DDL_EINVAL, "upsample: too many messages (%lld)",
                (long long)nreq);
    u->nreq = (int)nreq;
    u->req  = ddl_calloc((size_t)u->nreq + 1, sizeof(MPI_Request));
    DDL_REQUIRE(u->req != NULL, DDL_ENOMEM, "upsample: out of memory for the requests");
    return DDL_OK;
}

ddl_status ddl_upsample_scratch_bytes(ddl_dtype dt, const ddl_shape *x_global, const int *pshape,
                                      ddl_upsample_mode mode, bool align_corners,
                                      const double *scale_factor, const int64_t *size,
                                      size_t *bytes)
{
    DDL_REQUIRE(pshape != NULL && bytes != NULL, DDL_EINVAL,
                "upsample: pshape and bytes must not be NULL");
    ddl_interpolate_params ip;
    DDL_CHECK(params(dt, x_global, mode, align_corners, scale_factor, size, &ip));
    ddl_shape y  = *x_global;
    int       np = 1;
    for (int d = 0; d < x_global->ndim; d++) {
        DDL_REQUIRE(pshape[d] >= 1, DDL_EINVAL, "upsample: %d blocks of dim %d", pshape[d], d);
        np *= pshape[d];
    }
    for (int k = 0; k < ip.ndim; k++) {
        y.d[2 + k] = ip.out_global[k];
    }
    geom g = {.dt = dt, .ip = &ip, .xg = x_global, .yg = &y, .shape = pshape, .np = np};
    *bytes = 0;
    for (g.me = 0; g.me < np; g.me++) {
        size_t total;
        DDL_CHECK(block_scratch(&g, &total));
        *bytes = total > *bytes ? total : *bytes;
    }
    return DDL_OK;
}

ddl_status ddl_upsample_create(const ddl_partition_t *P_x, ddl_dtype dt,
                               const ddl_shape *x_global, ddl_upsample_mode mode,
                               bool align_corners, const double *scale_factor,
                               const int64_t *size, ddl_layer_t **out)
{
    DDL_REQUIRE(out != NULL, DDL_EINVAL, "upsample: out must not be NULL");
    ddl_interpolate_params ip;
    DDL_CHECK(validate(P_x, dt, x_global, mode, align_corners, scale_factor, size, &ip));

    ddl_layer_t *L = NULL;
    ddl_status   ast = ddl_layer_alloc(&up_ops, "upsample", dt, &L);
    up_impl     *u   = ast == DDL_OK ? ddl_calloc(1, sizeof *u) : NULL;
    if (ast == DDL_OK && u == NULL) {
        ast = ddl_set_error(DDL_ENOMEM, "upsample: out of memory");
    }
    if (ast != DDL_OK) {
        // Still join P_x's duplicate and agreement below, so P_x fails together.
        if (ddl_partition_active(P_x)) {
            MPI_Comm tmp;
            if (MPI_Comm_dup(ddl_partition_comm(P_x), &tmp) == MPI_SUCCESS) {
                ast = ddl_agree(tmp, ast);
                MPI_Comm_free(&tmp);
            }
        }
        ddl_layer_destroy(&L);
        return ast;
    }
    u->comm     = MPI_COMM_NULL;
    u->ip       = ip;
    u->active   = ddl_partition_active(P_x);
    L->impl     = u;
    L->x_global = *x_global;
    L->y_global = *x_global;
    for (int k = 0; k < ip.ndim; k++) {
        L->y_global.d[2 + k] = ip.out_global[k];
    }
    L->x_shape = ddl_partition_local_shape(P_x, &L->x_global);
    L->y_shape = ddl_partition_local_shape(P_x, &L->y_global);
    L->P_in    = P_x;
    L->P_out   = P_x;

    ddl_status st = DDL_OK;
    if (u->active) {
        // The plan is index arithmetic; the only communication is the duplicate.
        st = plan(L);
        int rc = MPI_Comm_dup(ddl_partition_comm(P_x), &u->comm);
        if (rc != MPI_SUCCESS) {
            u->comm = MPI_COMM_NULL;
            if (st == DDL_OK) {
                st = ddl_set_error(DDL_EMPI, "upsample: MPI_Comm_dup failed (%d)", rc);
            }
        }
        // P_x agrees on success, so no rank is left with a plan its partners lack.
        if (u->comm != MPI_COMM_NULL) {
            st = ddl_agree(u->comm, st);
        }
    }
    if (st != DDL_OK) {
        ddl_layer_destroy(&L);
        return st;
    }
    *out = L;
    return DDL_OK;
}
