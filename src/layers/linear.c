// layers/linear.c: DistDL's DistributedLinear: y = x W^T + b with the weight split in
// blocks over a 2-D partition of workers.
//
// Dimensions: B = batch, F_in = in_features, F_out = out_features. Partitions:
//   P_x = [1, P_fi]      x [B, F_in]    column c holds x_c = x[:, in-piece c]
//   P_w = [P_fo, P_fi]   W [F_out, F_in] rank (r, c) holds W_rc = W[out-piece r, in-piece c]
//                        b [F_out]       rank (r, 0) holds b_r = b[out-piece r]
//   P_y = [1, P_fo]      y [B, F_out]   column r holds y_r = y[:, out-piece r]
// (pieces are the balanced decomposition, ddl/decomp.h).
//
// Math. With Bc the Broadcast P_x -> P_w (x_c down column c of P_w) and R the SumReduce
// P_w -> P_y with transpose_src (row r of P_w summed onto P_y rank r):
//
//   y_r = sum_c (x_c W_rc^T + [c == 0] b_r)          y = R(L(Bc(x)))
//
// and the backward is the reverse composition of the adjoints:
//
//   dy_rc = dy_r                                      R* (a broadcast along row r)
//   dW_rc += dy_r^T x_c,  db_r += colsum(dy_r) (c = 0 only),  dx_rc = dy_r W_rc
//   dx_c  = sum_r dx_rc                               Bc* (a sum-reduce up column c)
//
// No all-reduce of weight gradients is needed: each block lives on one rank.
//
// Uneven splits. The Broadcast and SumReduce plans take one local shape, the same on
// every member of every group. When F_in (F_out) does not divide evenly, the blocks of
// different columns (rows) differ in size and a rank may be the source of one group and
// a destination of another with different block sizes (overlapping partitions). So the
// plans move a padded block [B, max piece]: a block [B, n] sits contiguously in the
// first B*n elements of the padded buffer (flat prefix, not a strided sub-box), and the
// tail is never read. When a rank's block already has the padded shape, the caller's
// tensor is used directly and nothing is copied.
//
// Saved input. Backward needs the x block of the last forward (for dW): the broadcast
// block xw, which the layer owns. But when P_w has one row (P_fo = 1) holding the ranks
// of P_x in the same order, Bc only hands every x_c to its own rank, and xw would be a
// mere copy of x. Then no Bc plan is made: the kernel reads the caller's x, which
// backward reads again by reference (the saved-tensor contract of ddl/layers.h), and
// backward writes dx directly (Bc* is the identity too). The test depends on the
// partitions only, so every rank takes the same path.
//
// In place. A rank that roots a group of Bc (P_x rank c inside column c of P_w) or of R
// (P_y rank r inside row r) and is one of its members hands the fan-outs one tensor as
// input and output: Bc sends its x block from where it is and the kernel reads it there
// (by reference, as above); R* broadcasts dy from where it is and the kernel reads it
// there. Out of place, the root would first copy the whole block into its own output, a
// copy that costs as much as the broadcast itself on shared memory (2x MPI_Bcast at
// 64 MiB, 1.05x in place; docs/SCALING.md). The sums (R, Bc*) stay out of place: Open
// MPI's MPI_Reduce with MPI_IN_PLACE at the root allocates and fills a temporary copy
// of the whole buffer, which is no faster and allocates in the step.
//
// Collectivity: create is collective over P_x ∪ P_w ∪ P_y (plan communicators);
// forward and backward are collective over the broadcast/reduce groups. Ranks outside
// every partition hold zero-volume x and y and make no MPI call. Forward and backward
// allocate nothing: every buffer is made in create.
#include <string.h>

#include "base/check.h"
#include "ddl/agree.h"
#include "ddl/base.h"
#include "ddl/decomp.h"
#include "layers/layer_impl.h"

typedef struct linear_impl {
    int64_t           batch;
    int64_t           fi, fo;        // this rank's block of W on P_w (0 when not in P_w)
    bool              in_w;          // member of P_w
    bool              has_bias;      // holds a bias piece (P_w column 0, bias on)
    bool              pad_x, pad_y;  // the local x (y) block is smaller than the padded block
    bool              x_direct;      // Bc is the identity: no plan, x used in place
    bool              bc_inplace;    // this rank roots and joins its Bc group: in place
    bool              sr_inplace;    // this rank roots and joins its R group: in place
    bool              have_forward;  // a forward has run (backward needs its state)
    const void       *x_in;          // P_w: the x block of the last forward (xw->data, or
                                     // the caller's x when x_direct), read by backward
    ddl_broadcast_t  *bcast_x;       // P_x -> P_w, [B, max in-piece] (NULL when x_direct)
    ddl_sum_reduce_t *reduce_y;      // P_w -> P_y (transpose_src), [B, max out-piece]
    ddl_tensor_t     *xs;            // P_x: padded x (forward) / padded dx (backward)
    ddl_tensor_t     *xw;            // P_w: the broadcast x block, kept for dW
    ddl_tensor_t     *dxw;           // P_w: the local partial dx block (not when x_direct)
    ddl_tensor_t     *yw;            // P_w: the partial y block (forward) / dy block (backward)
    ddl_tensor_t     *ys;            // P_y: padded y (forward) / padded dy (backward)
} linear_impl;

// Copies the n elements of src into the first n elements of dst (a flat prefix).
static void copy_prefix(ddl_tensor_t *dst, const ddl_tensor_t *src)
{
    size_t bytes = ddl_tensor_bytes(src);
    if (bytes > 0) {
        memcpy(dst->data, src->data, bytes);
    }
}

// A tensor the layer hands to a fan-out as both input and output (in place): on a rank
// that roots and joins one group, MPI_Bcast only reads the root's buffer, so a caller's
// const tensor may serve.
static ddl_tensor_t *as_inout(const ddl_tensor_t *t)
{
    return (ddl_tensor_t *)t;
}

static ddl_status linear_forward(ddl_layer_t *L, const ddl_tensor_t *x, ddl_tensor_t *y)
{
    linear_impl *m  = L->impl;
    m->have_forward = true;
    if (m->x_direct) {
        m->x_in = x->data;  // kept by reference until backward (no copy)
    } else {
        const ddl_tensor_t *src = x;
        if (m->pad_x) {
            copy_prefix(m->xs, x);
            src = m->xs;
        }
        if (m->bc_inplace) {
            // My own block is my x: broadcast it from where it is, and keep it there.
            DDL_CHECK(ddl_broadcast_forward(m->bcast_x, src, as_inout(src)));
            m->x_in = src->data;
        } else {
            DDL_CHECK(ddl_broadcast_forward(m->bcast_x, src, m->xw));
            m->x_in = m->xw->data;
        }
    }
    if (m->in_w) {
        const void *b = m->has_bias ? L->params[1].value->data : NULL;
        // Inference computes each row alone (batch-invariant bits: dynamic batching).
        DDL_CHECK((L->training ? ddl_linear_forward : ddl_linear_forward_rows)(
            L->dt, m->yw->data, m->x_in, L->params[0].value->data, b, m->batch, m->fi, m->fo));
    }
    ddl_tensor_t *dst = m->pad_y ? m->ys : y;
    DDL_CHECK(ddl_sum_reduce_forward(m->reduce_y, m->yw, dst));
    if (m->pad_y) {
        // y is the first B * fo_r elements of the padded sum: the flat prefix.
        memcpy(y->data, m->ys->data, ddl_tensor_bytes(y));
    }
    return DDL_OK;
}

static ddl_status linear_backward(ddl_layer_t *L, const ddl_tensor_t *dy, ddl_tensor_t *dx)
{
    linear_impl        *m   = L->impl;
    const ddl_tensor_t *src = dy;
    DDL_REQUIRE(m->have_forward, DDL_EINVAL, "linear: backward called before any forward");
    if (m->pad_y) {
        copy_prefix(m->ys, dy);
        src = m->ys;
    }
    // dy down row r: in place on its root (which then reads dy where it is).
    const void *gy = m->yw->data;
    if (m->sr_inplace) {
        DDL_CHECK(ddl_sum_reduce_adjoint(m->reduce_y, src, as_inout(src)));
        gy = src->data;
    } else {
        DDL_CHECK(ddl_sum_reduce_adjoint(m->reduce_y, src, m->yw));
    }
    // Where this rank's partial dx lands: dx itself when Bc* is the identity (x_direct),
    // else the plan's block (sums stay out of place: see "In place" above).
    ddl_tensor_t *gxw = m->x_direct ? dx : m->dxw;
    if (m->in_w) {
        ddl_param *w  = &L->params[0];
        void      *db = m->has_bias ? L->params[1].grad->data : NULL;
        ddl_tensor_zero(gxw);
        DDL_CHECK(ddl_linear_backward(L->dt, gxw->data, w->grad->data, db, gy, m->x_in,
                                      w->value->data, m->batch, m->fi, m->fo));
    }
    if (m->x_direct || L->dx_unused) {
        return DDL_OK;  // nothing to sum, or nobody reads the sum
    }
    ddl_tensor_t *dst = m->pad_x ? m->xs : dx;
    DDL_CHECK(ddl_broadcast_adjoint(m->bcast_x, gxw, dst));
    if (m->pad_x) {
        memcpy(dx->data, m->xs->data, ddl_tensor_bytes(dx));
    }
    return DDL_OK;
}

static void linear_destroy(ddl_layer_t *L)
{
    linear_impl *m = L->impl;
    if (m == NULL) {
        return;
    }
    ddl_broadcast_destroy(&m->bcast_x);
    ddl_sum_reduce_destroy(&m->reduce_y);
    ddl_tensor_destroy(&m->xs);
    ddl_tensor_destroy(&m->xw);
    ddl_tensor_destroy(&m->dxw);
    ddl_tensor_destroy(&m->yw);
    ddl_tensor_destroy(&m->ys);
    ddl_free(m);
    L->impl = NULL;
}

static const ddl_layer_ops linear_ops = {
    .forward  = linear_forward,
    .backward = linear_backward,
    .destroy  = linear_destroy,
};

// Everything every rank can check alone (partition shapes and ranks are known
// everywhere), so the verdict is the same on every rank and no collective has started.
static ddl_status linear_validate(const ddl_partition_t *P_x, const ddl_partition_t *P_y,
                                  const ddl_partition_t *P_w, ddl_dtype dt, int64_t batch,
                                  int64_t in_features, int64_t out_features, ddl_layer_t **out)
{
    DDL_REQUIRE(out != NULL, DDL_EINVAL, "linear: out is NULL");
    DDL_REQUIRE(P_x != NULL && P_y != NULL && P_w != NULL, DDL_EINVAL,
                "linear: P_x, P_y and P_w are all required");
    DDL_REQUIRE(dt == DDL_F32 || dt == DDL_F64, DDL_EINVAL, "linear: unknown dtype %d", (int)dt);
    DDL_REQUIRE(batch >= 1 && in_features >= 1 && out_features >= 1, DDL_EINVAL,
                "linear: batch %lld, in_features %lld and out_features %lld must be >= 1",
                (long long)batch, (long long)in_features, (long long)out_features);
    DDL_REQUIRE(ddl_partition_ndim(P_x) == 2, DDL_EINVAL,
                "linear: P_x has %d dims, expected 2 ([1, P_fi])", ddl_partition_ndim(P_x));
    DDL_REQUIRE(ddl_partition_ndim(P_y) == 2, DDL_EINVAL,
                "linear: P_y has %d dims, expected 2 ([1, P_fo])", ddl_partition_ndim(P_y));
    DDL_REQUIRE(ddl_partition_ndim(P_w) == 2, DDL_EINVAL,
                "linear: P_w has %d dims, expected 2 ([P_fo, P_fi])", ddl_partition_ndim(P_w));
    const int *sx = ddl_partition_shape(P_x), *sy = ddl_partition_shape(P_y);
    const int *sw = ddl_partition_shape(P_w);
    DDL_REQUIRE(sx[0] == 1, DDL_EINVAL,
                "linear: P_x shape[0] = %d, expected 1 (the batch is not partitioned)", sx[0]);
    DDL_REQUIRE(sy[0] == 1, DDL_EINVAL,
                "linear: P_y shape[0] = %d, expected 1 (the batch is not partitioned)", sy[0]);
    DDL_REQUIRE(sw[1] == sx[1], DDL_EINVAL,
                "linear: P_w shape[1] = %d != P_x shape[1] = %d (input feature split)", sw[1],
                sx[1]);
    DDL_REQUIRE(sw[0] == sy[1], DDL_EINVAL,
                "linear: P_w shape[0] = %d != P_y shape[1] = %d (output feature split)", sw[0],
                sy[1]);
    MPI_Comm base = ddl_partition_base(P_w);
    DDL_REQUIRE(ddl_partition_base(P_x) == base && ddl_partition_base(P_y) == base, DDL_EINVAL,
                "linear: P_x, P_y and P_w must share one base communicator");
    return DDL_OK;
}

ddl_status ddl_linear_create(const ddl_partition_t *P_x, const ddl_partition_t *P_y,
                             const ddl_partition_t *P_w, ddl_dtype dt, int64_t batch,
                             int64_t in_features, int64_t out_features, bool bias,
                             ddl_layer_t **out)
{
    DDL_CHECK(linear_validate(P_x, P_y, P_w, dt, batch, in_features, out_features, out));
    const int *sw = ddl_partition_shape(P_w);

    ddl_layer_t *L = NULL;
    ddl_status   ast = ddl_layer_alloc(&linear_ops, "linear", dt, &L);
    linear_impl *m   = ast == DDL_OK ? ddl_calloc(1, sizeof *m) : NULL;
    if (ast == DDL_OK && m == NULL) {
        ast = ddl_set_error(DDL_ENOMEM, "linear: out of memory");
    }
    // The members agree on these allocations before any collective construction, so a
    // member whose allocation failed fails them all instead of leaving them waiting.
    // U: the layer's ranks; every collective construction below ends agreed over it.
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
    L->impl     = m;
    L->x_global = ddl_shape_make(2, (int64_t[]){batch, in_features});
    L->y_global = ddl_shape_make(2, (int64_t[]){batch, out_features});
    L->x_shape  = ddl_partition_local_shape(P_x, &L->x_global);
    L->y_shape  = ddl_partition_local_shape(P_y, &L->y_global);
    L->P_in     = P_x;
    L->P_out    = P_y;
    m->batch    = batch;

    // Parameters: block (r, c) of W on P_w rank (r, c); b_r on (r, 0). The global shapes
    // and boxes make initialization partition-invariant (PyTorch's fan_in = in_features).
    ddl_status st;
    ddl_shape  wg   = ddl_shape_make(2, (int64_t[]){out_features, in_features});
    ddl_shape  bg   = ddl_shape_make(1, (int64_t[]){out_features});
    ddl_box    wbox = {.ndim = 2}, bbox = {.ndim = 1};
    m->in_w         = ddl_partition_active(P_w);
    if (m->in_w) {
        const int *iw = ddl_partition_index(P_w);
        wbox          = ddl_decomp_box(&wg, sw, iw);
        m->fo         = wbox.stop[0] - wbox.start[0];
        m->fi         = wbox.stop[1] - wbox.start[1];
        if (bias && iw[1] == 0) {
            m->has_bias   = true;
            bbox.start[0] = wbox.start[0];
            bbox.stop[0]  = wbox.stop[0];
        }
    }
    // The parameters are this rank's own allocations: a failure is reported only after
    // the plans below, whose collectives the other ranks would otherwise wait in.
    ddl_status lst =
        ddl_layer_add_param(L, "weight", &wg, &wbox, DDL_INIT_KAIMING_UNIFORM, in_features);
    if (lst == DDL_OK && bias) {
        lst = ddl_layer_add_param(L, "bias", &bg, &bbox, DDL_INIT_FAN_IN_UNIFORM, in_features);
    }

    // Is Bc the identity (one row of P_w on the ranks of P_x, in order)? The same answer
    // on every rank: partition shapes and ranks are known everywhere.
    m->x_direct = sw[0] == 1;
    for (int c = 0; c < sw[1] && m->x_direct; c++) {
        m->x_direct = ddl_partition_ranks(P_x)[c] == ddl_partition_ranks(P_w)[c];
    }

    // Plans on padded blocks (see the file comment). Piece 0 is the largest.
    int64_t   fi_max = ddl_decomp_size(in_features, sw[1], 0);
    int64_t   fo_max = ddl_decomp_size(out_features, sw[0], 0);
    ddl_shape xblk   = ddl_shape_make(2, (int64_t[]){batch, fi_max});
    ddl_shape yblk   = ddl_shape_make(2, (int64_t[]){batch, fo_max});
    ddl_shape none   = ddl_shape_make(2, (int64_t[]){0, 0});
    if (!m->x_direct) {
        DDL_CHECK_GOTO(ddl_agree(U, ddl_broadcast_create(P_x, P_w, false, false, dt, &xblk,
                                                         &m->bcast_x)),
                       st, fail);
    }
    DDL_CHECK_GOTO(ddl_agree(U, ddl_sum_reduce_create(P_w, P_y, true, false, dt, &yblk,
                                                      &m->reduce_y)),
                   st, fail);
    DDL_CHECK_GOTO(lst, st, fail);
    ddl_shape xs_shape = m->x_direct ? none : ddl_broadcast_x_shape(m->bcast_x);
    ddl_shape xw_shape = m->x_direct ? none : ddl_broadcast_y_shape(m->bcast_x);
    ddl_shape yw_shape = ddl_sum_reduce_x_shape(m->reduce_y);
    ddl_shape ys_shape = ddl_sum_reduce_y_shape(m->reduce_y);
    m->pad_x = !m->x_direct && ddl_partition_active(P_x) &&
               !ddl_shape_equal(&L->x_shape, &xs_shape);
    m->pad_y = ddl_partition_active(P_y) && !ddl_shape_equal(&L->y_shape, &ys_shape);
    // A rank that roots and joins one group keeps its block where it is for the fan-outs
    // (no copy into its own output: it costs as much as the broadcast itself).
    // A padded x block stays out of place: backward (which may run more than once) still
    // reads the saved block after it has summed dx into the padded buffer.
    m->bc_inplace = !m->x_direct && !m->pad_x && ddl_broadcast_in_place_ok(m->bcast_x);
    m->sr_inplace = ddl_sum_reduce_in_place_ok(m->reduce_y);
    DDL_CHECK_GOTO(ddl_tensor_create(dt, m->pad_x ? &xs_shape : &none, &m->xs), st, fail);
    DDL_CHECK_GOTO(ddl_tensor_create(dt, m->pad_y ? &ys_shape : &none, &m->ys), st, fail);
    DDL_CHECK_GOTO(ddl_tensor_create(dt, &xw_shape, &m->xw), st, fail);
    if (ddl_layer_copy_source() == NULL) { // a forward-only copy: no gradient block
        DDL_CHECK_GOTO(ddl_tensor_create(dt, &xw_shape, &m->dxw), st, fail);
    }
    DDL_CHECK_GOTO(ddl_tensor_create(dt, &yw_shape, &m->yw), st, fail);
    if (U != MPI_COMM_NULL) {
        MPI_Comm_free(&U);
    }
    *out = L;
    return DDL_OK;
fail:
    if (U != MPI_COMM_NULL) {
        MPI_Comm_free(&U);
    }
    ddl_layer_destroy(&L);
    return st;
}
