// layers/loss.c: distributed losses (DistDL nn/loss.py), plus a softmax cross-entropy
// whose class dimension is split over ranks (DistDL has none).
//
// Elementwise kinds (MSE, L1, BCE, BCEWithLogits, KLDiv, KLDiv with log target,
// PoissonNLL). x and target share the layout: any global shape X decomposed balanced
// over P_x (same ndim). With l(x_i, t_i) the per-element loss (kernels_pointwise.h):
//
//   none       e_i = l(x_i, t_i), local (no communication)      dx_i = de_i l'(x_i, t_i)
//   sum        v = R(sum_local l) on P_x rank 0                  dx_i = R*(dv) l'(x_i, t_i)
//   mean       v = R(...) / numel(X)                             dx_i = R*(dv) / numel(X) l'
//   batchmean  v = R(...) / X[0]   (KL divergence only)          dx_i = R*(dv) / X[0] l'
//
// R is a SumReduce of the local sums from P_x onto P_0 = {P_x rank 0} (shape all ones,
// same ndim); its adjoint R* broadcasts the upstream gradient dv from P_x rank 0 back to
// every P_x rank (DistDL: "the broadcast is induced automatically by the adjoint").
//
// Cross-entropy. x [N, C] (logits) over P_x = [P_b, P_c]: rank (b, c) holds rows
// [n0, n0 + Nl) and classes [c0, c0 + Cl); integer labels [Nl] (every rank of a P_x row
// passes the same labels). Per row n, over the ranks of its P_x row:
//
//   m_n = max_j x_nj             MPI_Allreduce(MAX) (see below)
//   s_n = sum_j exp(x_nj - m_n)  } one AllSumReduce over P_x axis 1 of [s | x_n,label]
//   z_n = x_n,label_n            }
//   e_n = m_n + log s_n - z_n    (held by the column-0 ranks of P_x)
//   v   = R(sum over column-0 rows of e_n) / (N for mean, 1 for sum) on P_x rank 0
//   dx_nj = g_n (exp(x_nj - m_n) / s_n - [j == label_n])
//
// with g_n = R*(dv) / norm for reduced losses, and for reduction none g_n = de_n
// broadcast from the column-0 rank along its P_x row (the adjoint of "e_n lives on
// column 0"). The row maxima are all-reduced (MPI_MAX: a max is not a sum) over the
// ranks of each P_x row only, as the sums are: the rank's rows, not all N.
//
// Cross-entropy on N-d input (segmentation; PyTorch's F.cross_entropy on x [N, C, d1..dk],
// k >= 1). P_x must not split dim 1 (the classes): every rank then holds whole voxels,
// the log-softmax over C is local, and with labels [N, d1..dk] boxed like x minus dim 1:
//
//   e_nv = logsumexp_c x_ncv - x_n,label_nv,v    (local; every rank its own voxels)
//   v    = R(sum of local e) / (N * d1 * ... * dk for mean, 1 for sum) on P_x rank 0
//   dx_ncv = g_nv (softmax_c(x_nv)_c - [c == label_nv])
//
// with g_nv = R*(dv) / norm for reduced losses, de_nv for reduction none (elementwise
// losses and their gradients have x's local shape minus dim 1 on every rank).
//
// Errors on data. Forward and backward check their arguments and data locally (shapes,
// labels in [0, C)) and agree on the verdict (ddl_agree) over the base communicator of
// P_x before any communication, so a bad label on one rank fails every rank, all with
// the message of the lowest failing rank ("label 200 at batch index 17 ..."), and no
// rank is left waiting in a collective (issue 7: a test-set label of 200 hung the job).
// BCE input outside [0, 1] is found by the kernel during the computation: the failing
// ranks still take part in the reduction, then every rank agrees on the status.
//
// Collectivity: create is collective over P_x (plans, and for cross-entropy a
// communicator per P_x row, split from P_x's). Forward and backward are collective over the base
// communicator of P_x, for the agreement only: ranks outside P_x hold zero-volume x, get
// value 0 and a zero-volume gradient, and make no other MPI call (DistDL crashes there:
// `input.clone()` on Python's builtin). Forward and backward allocate nothing.
//
// Saved state. Backward reads x, target and labels of the last forward through the
// caller's pointers, not copies (the saved-tensor contract of ddl/layers.h: the caller
// leaves them unchanged until the matching backward); the loss keeps only what it
// computes itself (row maxima and sums for cross-entropy).
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/check.h"
#include "ddl/agree.h"
#include "ddl/base.h"
#include "ddl/decomp.h"
#include "layers/layer_impl.h"
#include "partition/mpi_check.h"
#include "primitives/traffic.h"

struct ddl_loss {
    const ddl_partition_t *P_x;
    ddl_dtype              dt;
    ddl_loss_kind          kind;
    ddl_reduction          reduction;
    ddl_shape              x_global;
    ddl_shape              x_shape;   // local x (and target) shape; zero-volume outside P_x
    bool                   active;    // this rank is in P_x
    double                 norm;      // divisor of the reduced value
    bool                   have_forward;  // a forward has run (backward needs its state)
    bool                   io_fixed;      // no agreement on the arguments (ddl_loss_set_io_fixed)
    const void            *xs, *ts;   // the caller's x and target data of the last forward

    // Reduced losses: [local sum, local failures] (f64) summed onto P_x rank 0.
    ddl_partition_t       *P0;
    ddl_sum_reduce_t      *reduce;
    ddl_tensor_t          *part;      // [2] on P_x ranks
    ddl_tensor_t          *total;     // [2] on P_x rank 0

    // Cross-entropy.
    bool                   nd;        // on N-d input [N, C, spatial...] (classes whole)
    ddl_shape              el_shape;  // N-d: local elementwise shape (x's minus dim 1)
    int64_t                voxels;    // N-d: local voxels per sample
    int64_t                rows, n0;  // local rows and the first global row
    int64_t                cl, c0;    // local classes and the first global class
    int64_t                classes;
    bool                   col0;      // P_x index[1] == 0: holds the per-row losses
    MPI_Comm               comm;      // the ranks of this rank's P_x row (MAX all-reduce)
    int                    row_size;  // their number (P_c)
    double                *gmax;      // [rows]: the row maxima
    ddl_all_sum_reduce_t  *rowsum;    // P_x axis 1, [2 rows] f64
    ddl_tensor_t          *stats;     // [2 rows]: sum exp(x - m) | label logit
    const int64_t         *labels;    // the caller's labels of the last forward ([rows])
    ddl_partition_t       *Pc0;       // column-0 ranks of P_x, [P_b, 1] (reduction none)
    ddl_broadcast_t       *bcast_g;   // Pc0 -> P_x of the per-row upstream gradient
    ddl_tensor_t          *grow;      // [rows] (dt) upstream gradient on every P_x rank

    ddl_traffic            traffic[2];  // what the last forward [0] and backward [1] moved
};

// ---- creation --------------------------------------------------------------------

static ddl_status loss_validate(const ddl_partition_t *P_x, ddl_dtype dt, const ddl_shape *x_global,
                                ddl_loss_kind kind, ddl_reduction reduction, ddl_loss_t **out)
{
    DDL_REQUIRE(out != NULL, DDL_EINVAL, "loss: out is NULL");
    DDL_REQUIRE(P_x != NULL && x_global != NULL, DDL_EINVAL, "loss: P_x and x_global are required");
    DDL_REQUIRE(dt == DDL_F32 || dt == DDL_F64, DDL_EINVAL, "loss: unknown dtype %d", (int)dt);
    DDL_REQUIRE(kind >= DDL_LOSS_MSE && kind <= DDL_LOSS_CROSS_ENTROPY, DDL_EINVAL,
                "loss: unknown loss kind %d", (int)kind);
    DDL_REQUIRE(reduction >= DDL_REDUCTION_NONE && reduction <= DDL_REDUCTION_BATCHMEAN,
                DDL_EINVAL, "loss: unknown reduction %d", (int)reduction);
    bool kl = kind == DDL_LOSS_KL_DIV || kind == DDL_LOSS_KL_DIV_LOG_TARGET;
    DDL_REQUIRE(reduction != DDL_REDUCTION_BATCHMEAN || kl, DDL_EINVAL,
                "loss: reduction batchmean is valid for the KL divergence only (kind %d)",
                (int)kind);
    int nd = ddl_partition_ndim(P_x);
    DDL_REQUIRE(x_global->ndim >= 1 && x_global->ndim <= DDL_MAX_DIMS, DDL_EINVAL,
                "loss: x_global has %d dims", x_global->ndim);
    DDL_REQUIRE(x_global->ndim == nd, DDL_EINVAL,
                "loss: x_global has %d dims but P_x has %d", x_global->ndim, nd);
    for (int d = 0; d < nd; d++) {
        DDL_REQUIRE(x_global->d[d] >= 1, DDL_EINVAL, "loss: x_global[%d] = %lld must be >= 1", d,
                    (long long)x_global->d[d]);
    }
    if (kind == DDL_LOSS_CROSS_ENTROPY && nd > 2) {
        // The log-softmax over the classes of a voxel stays local only when no rank
        // splits them; a class split of N-d input would need the row statistics of
        // every voxel all-reduced, which no model asks for.
        DDL_REQUIRE(ddl_partition_shape(P_x)[1] == 1, DDL_EINVAL,
                    "loss: cross-entropy on x [batch, classes, spatial...] needs every class on "
                    "each rank, but P_x splits dimension 1 (classes) over %d ranks; use a "
                    "partition [P_n, 1, ...] that splits the batch or the spatial dims",
                    ddl_partition_shape(P_x)[1]);
    } else if (kind == DDL_LOSS_CROSS_ENTROPY) {
        DDL_REQUIRE(nd == 2, DDL_EINVAL,
                    "loss: cross-entropy takes x [batch, classes] over P_x [P_b, P_c] or "
                    "[batch, classes, spatial...] over [P_n, 1, S...], got %d dims",
                    nd);
        // The row maxima travel as one MPI message of a rank's rows.
        DDL_REQUIRE(x_global->d[0] < INT32_MAX, DDL_EINVAL,
                    "loss: cross-entropy batch %lld too large", (long long)x_global->d[0]);
    }
    return DDL_OK;
}

// A local failure (an allocation) is kept in *lst and setup goes on through the
// collective constructions, so that the other ranks are not left waiting in one this
// rank skipped; loss_setup reports it, agreed over P_x, once they are behind us.
#define LOCAL(expr)                                                                                \
    do {                                                                                           \
        if (*lst == DDL_OK) {                                                                      \
            *lst = (expr);                                                                         \
        }                                                                                          \
    } while (0)

static ddl_status ce_setup(ddl_loss_t *l, ddl_status *lst)
{
    const ddl_partition_t *P = l->P_x;
    l->classes               = l->x_global.d[1];
    l->rows                  = l->x_shape.d[0];
    l->cl                    = l->x_shape.d[1];
    l->comm                  = MPI_COMM_NULL;
    if (l->active) {
        ddl_box b = ddl_partition_local_box(P, &l->x_global);
        l->n0     = b.start[0];
        l->c0     = b.start[1];
        l->col0   = ddl_partition_index(P)[1] == 0;
        // The ranks of one P_x row (the classes of the same rows): the maxima travel
        // only among them, as the sums do (rowsum).
        const int *ix = ddl_partition_index(P);
        DDL_CHECK_MPI(MPI_Comm_split(ddl_partition_comm(P), ix[0], ix[1], &l->comm));
        MPI_Comm_size(l->comm, &l->row_size);
    }
    size_t nr = (size_t)(l->rows > 0 ? l->rows : 1);
    l->gmax   = ddl_malloc(sizeof(double) * nr);
    if (l->gmax == NULL) {
        LOCAL(ddl_set_error(DDL_ENOMEM, "loss: out of memory"));
    }
    ddl_shape ss = ddl_shape_make(1, (int64_t[]){2 * l->rows});
    DDL_CHECK(ddl_all_sum_reduce_create(P, 1, (int[]){1}, DDL_F64, &ss, &l->rowsum));
    ddl_shape sa = ddl_all_sum_reduce_shape(l->rowsum);
    LOCAL(ddl_tensor_create(DDL_F64, &sa, &l->stats));
    if (l->reduction == DDL_REDUCTION_NONE) {
        // The column-0 ranks, one per P_x row, broadcast the per-row gradient along it.
        // (The rank list lives on the stack when it is small, so that this step cannot
        // fail on one rank alone.)
        const int *ps = ddl_partition_shape(P);
        int        few[64];
        int       *ranks = ps[0] <= 64 ? few : ddl_malloc(sizeof(int) * (size_t)ps[0]);
        if (ranks == NULL) {
            return ddl_set_error(DDL_ENOMEM, "loss: out of memory");
        }
        for (int b = 0; b < ps[0]; b++) {
            ranks[b] = ddl_partition_rank_at(P, (int[]){b, 0});
        }
        ddl_status st = ddl_partition_create(ddl_partition_base(P), ps[0], ranks, 2,
                                             (int[]){ps[0], 1}, &l->Pc0);
        if (ranks != few) {
            ddl_free(ranks);
        }
        DDL_CHECK(st);
        ddl_shape gs = ddl_shape_make(1, (int64_t[]){l->rows});
        DDL_CHECK(ddl_broadcast_create(l->Pc0, P, false, false, l->dt, &gs, &l->bcast_g));
        ddl_shape gy = ddl_broadcast_y_shape(l->bcast_g);
        LOCAL(ddl_tensor_create(l->dt, &gy, &l->grow));
    }
    return DDL_OK;
}

static ddl_status loss_setup(ddl_loss_t *l)
{
    const ddl_partition_t *P    = l->P_x;
    ddl_status             lval = DDL_OK, *lst = &lval;
    if (l->reduction != DDL_REDUCTION_NONE) {
        int nd = ddl_partition_ndim(P);
        int r0 = ddl_partition_ranks(P)[0];
        int ones[DDL_MAX_DIMS];
        for (int d = 0; d < nd; d++) {
            ones[d] = 1;
        }
        DDL_CHECK(ddl_partition_create(ddl_partition_base(P), 1, &r0, nd, ones, &l->P0));
        ddl_shape two = ddl_shape_make(1, (int64_t[]){2});
        DDL_CHECK(ddl_sum_reduce_create(P, l->P0, false, false, DDL_F64, &two, &l->reduce));
        ddl_shape ps = ddl_sum_reduce_x_shape(l->reduce), ts = ddl_sum_reduce_y_shape(l->reduce);
        LOCAL(ddl_tensor_create(DDL_F64, &ps, &l->part));
        LOCAL(ddl_tensor_create(DDL_F64, &ts, &l->total));
    }
    if (l->kind == DDL_LOSS_CROSS_ENTROPY && !l->nd) {
        DDL_CHECK(ce_setup(l, lst));
    }
    // The members of P_x agree on the outcome, so none keeps a loss its partners lack.
    return l->active ? ddl_agree(ddl_partition_comm(P), lval) : lval;
}
#undef LOCAL

ddl_status ddl_loss_create(const ddl_partition_t *P_x, ddl_dtype dt, const ddl_shape *x_global,
                           ddl_loss_kind kind, ddl_reduction reduction, ddl_loss_t **out)
{
    DDL_CHECK(loss_validate(P_x, dt, x_global, kind, reduction, out));
    ddl_loss_t *l = ddl_calloc(1, sizeof *l);
    // P_x's members agree on it before the collective setup, so that one member's
    // failure fails them all instead of leaving them waiting.
    ddl_status ast =
        ddl_partition_agree_union(P_x, NULL, NULL,
                                  l != NULL ? DDL_OK : ddl_set_error(DDL_ENOMEM, "loss: out of memory"));
    if (ast != DDL_OK) {
        ddl_free(l);
        return ast;
    }
    l->P_x       = P_x;
    l->dt        = dt;
    l->kind      = kind;
    l->reduction = reduction;
    l->x_global  = *x_global;
    l->x_shape   = ddl_partition_local_shape(P_x, x_global);
    l->active    = ddl_partition_active(P_x);
    l->comm      = MPI_COMM_NULL;
    l->nd        = kind == DDL_LOSS_CROSS_ENTROPY && x_global->ndim > 2;
    if (l->nd) {
        // Labels and per-voxel losses: x's local box without dim 1.
        l->el_shape.ndim = x_global->ndim - 1;
        l->el_shape.d[0] = l->x_shape.d[0];
        l->voxels        = 1;
        for (int d = 2; d < x_global->ndim; d++) {
            l->el_shape.d[d - 1] = l->x_shape.d[d];
            l->voxels *= l->x_shape.d[d];
        }
        l->classes = x_global->d[1];
        l->rows    = l->x_shape.d[0];
    }
    switch (reduction) {
    case DDL_REDUCTION_MEAN:
        // Cross-entropy averages over the samples, and on N-d input over their voxels
        // (numel / classes), as PyTorch does.
        l->norm = !(kind == DDL_LOSS_CROSS_ENTROPY) ? (double)ddl_shape_numel(x_global)
                  : l->nd ? (double)(ddl_shape_numel(x_global) / x_global->d[1])
                          : (double)x_global->d[0];
        break;
    case DDL_REDUCTION_BATCHMEAN:
        l->norm = (double)x_global->d[0];
        break;
    default:
        l->norm = 1.0;
        break;
    }
    ddl_status st = loss_setup(l);
    if (st != DDL_OK) {
        ddl_loss_destroy(&l);
        return st;
    }
    *out = l;
    return DDL_OK;
}

void ddl_loss_destroy(ddl_loss_t **lp)
{
    if (lp == NULL || *lp == NULL) {
        return;
    }
    ddl_loss_t *l = *lp;
    ddl_sum_reduce_destroy(&l->reduce);
    ddl_tensor_destroy(&l->part);
    ddl_tensor_destroy(&l->total);
    ddl_partition_destroy(&l->P0);
    if (l->comm != MPI_COMM_NULL) {
        MPI_Comm_free(&l->comm);
    }
    ddl_free(l->gmax);
    ddl_all_sum_reduce_destroy(&l->rowsum);
    ddl_tensor_destroy(&l->stats);
    ddl_broadcast_destroy(&l->bcast_g);
    ddl_tensor_destroy(&l->grow);
    ddl_partition_destroy(&l->Pc0);
    ddl_free(l);
    *lp = NULL;
}

ddl_shape ddl_loss_x_shape(const ddl_loss_t *l)
{
    return l->x_shape;
}

// ---- forward ----------------------------------------------------------------------

static ddl_status check_tensor(const ddl_loss_t *l, const char *what, const ddl_tensor_t *t,
                               const ddl_shape *want)
{
    if (t == NULL && ddl_shape_numel(want) == 0) {
        return DDL_OK;
    }
    DDL_REQUIRE(t != NULL, DDL_EINVAL, "loss: %s is NULL", what);
    char got[96], exp[96];
    DDL_REQUIRE(t->dtype == l->dt, DDL_ESHAPE, "loss: %s has dtype %s, the loss has %s", what,
                ddl_dtype_name(t->dtype), ddl_dtype_name(l->dt));
    DDL_REQUIRE(ddl_shape_equal(&t->shape, want) ||
                    (ddl_shape_numel(want) == 0 && ddl_tensor_numel(t) == 0),
                DDL_ESHAPE, "loss: %s has shape %s, expected %s on this rank", what,
                ddl_shape_str(&t->shape, got, sizeof got), ddl_shape_str(want, exp, sizeof exp));
    return DDL_OK;
}

// The reduced value: sum the [local sum, failures] pairs onto P_x rank 0. A failure is
// reported by the caller's agreement; the count only keeps a refused value out of *value.
static ddl_status reduce_value(ddl_loss_t *l, double local, bool failed, double *value)
{
    if (l->active) {
        double *p = l->part->data;
        p[0]      = local;
        p[1]      = failed ? 1.0 : 0.0;
    }
    DDL_CHECK(ddl_sum_reduce_forward(l->reduce, l->part, l->total));
    if (ddl_tensor_numel(l->total) > 0) {
        const double *t = l->total->data;
        if (value != NULL && t[1] == 0.0) {
            *value = t[0] / l->norm;
        }
    }
    return DDL_OK;
}

// Agrees on a status over every rank that calls forward/backward (P_x's base).
static ddl_status agree(const ddl_loss_t *l, ddl_status st)
{
    return ddl_agree(ddl_partition_base(l->P_x), st);
}

// Agrees on the verdict of the argument checks, which only the caller's tensors and
// labels can fail. With a caller that fixed them (ddl_loss_set_io_fixed: a model, which
// checked the labels before the step) a failure is the caller's bug: it aborts, and the
// agreement is skipped.
static ddl_status agree_args(const ddl_loss_t *l, ddl_status st)
{
    return l->io_fixed ? ddl_layer_fixed_check("loss", st) : agree(l, st);
}

void ddl_loss_set_io_fixed(ddl_loss_t *l, bool fixed)
{
    l->io_fixed = fixed;
}

// Local checks of an elementwise loss's tensors (no MPI).
static ddl_status eloss_check(const ddl_loss_t *l, const ddl_tensor_t *target,
                              const ddl_tensor_t *elementwise)
{
    DDL_CHECK(check_tensor(l, "target", target, &l->x_shape));
    if (l->reduction == DDL_REDUCTION_NONE) {
        DDL_CHECK(check_tensor(l, "elementwise", elementwise, &l->x_shape));
    }
    return DDL_OK;
}

static ddl_status eloss_forward(ddl_loss_t *l, const ddl_tensor_t *x, const ddl_tensor_t *target,
                                double *value, ddl_tensor_t *elementwise)
{
    int64_t n = ddl_shape_numel(&l->x_shape);
    // References for backward (a zero-volume target may be NULL: it is never read).
    l->xs = x->data;
    l->ts = target != NULL ? target->data : NULL;
    if (l->reduction == DDL_REDUCTION_NONE) {
        return agree(l, ddl_eloss_forward(l->kind, l->dt, n > 0 ? elementwise->data : NULL, NULL,
                                          l->xs, l->ts, n));
    }
    double     local = 0.0;
    ddl_status st    = ddl_eloss_forward(l->kind, l->dt, NULL, &local, l->xs, l->ts, n);
    // Take part in the reduction whatever happened, so that no partner waits.
    DDL_CHECK(reduce_value(l, st == DDL_OK ? local : 0.0, st != DDL_OK, value));
    return agree(l, st);
}

// Local checks of cross-entropy's arguments and labels (no MPI). Every rank of a P_x row
// holds the same labels, so a bad label is found by each rank of its row.
static ddl_status ce_check(const ddl_loss_t *l, const int64_t *labels,
                           const ddl_tensor_t *elementwise)
{
    if (!l->active) {
        return DDL_OK;
    }
    DDL_REQUIRE(l->rows == 0 || labels != NULL, DDL_EINVAL, "loss: cross-entropy labels are NULL");
    if (l->reduction == DDL_REDUCTION_NONE && l->col0) {
        ddl_shape es = ddl_shape_make(1, (int64_t[]){l->rows});
        DDL_CHECK(check_tensor(l, "elementwise", elementwise, &es));
    }
    for (int64_t b = 0; b < l->rows; b++) {
        DDL_REQUIRE(labels[b] >= 0 && labels[b] < l->classes, DDL_EINVAL,
                    "loss: cross-entropy label %lld at batch index %lld is outside [0, %lld) "
                    "(the model has %lld classes)",
                    (long long)labels[b], (long long)(l->n0 + b), (long long)l->classes,
                    (long long)l->classes);
    }
    return DDL_OK;
}

static ddl_status ce_forward(ddl_loss_t *l, const ddl_tensor_t *x, const int64_t *labels,
                             double *value, ddl_tensor_t *elementwise)
{
    int64_t rows = l->rows;
    if (!l->active) {
        return DDL_OK;  // no rows, no collectives: P_x's members are the only participants
    }
    l->xs     = x->data;  // references for backward, not copies
    l->labels = labels;
    // The maxima of this rank's rows over the classes of its P_x row (rows < INT32_MAX:
    // loss_validate). Counted as all_max_reduce: each of the P_c ranks exchanges its
    // rows' maxima with the P_c - 1 others (ddl/primitives.h).
    DDL_CHECK(ddl_cross_entropy_local_max(l->dt, l->gmax, l->xs, rows, l->cl));
    if (l->row_size > 1) {
        uint64_t moved = (uint64_t)(l->row_size - 1) * (uint64_t)rows * sizeof(double);
        ddl__traffic_add(DDL_TRAFFIC_ALL_MAX_REDUCE, DDL_TRAFFIC_FORWARD, moved, moved);
        double t0 = ddl__traffic_clock();
        int    rc = MPI_Allreduce(MPI_IN_PLACE, l->gmax, (int)rows, MPI_DOUBLE, MPI_MAX, l->comm);
        ddl__traffic_time(DDL_TRAFFIC_ALL_MAX_REDUCE, DDL_TRAFFIC_FORWARD, t0);
        DDL_CHECK_MPI(rc);
    }

    // Sum of exponentials and the label logit, summed along the P_x row.
    double *s = l->stats->data, *z = s + rows;
    DDL_CHECK(ddl_cross_entropy_local_sumexp(l->dt, s, l->xs, l->gmax, rows, l->cl));
    DDL_CHECK(ddl_cross_entropy_local_label_logit(l->dt, z, l->xs, l->labels, rows, l->c0, l->cl,
                                                  l->classes));
    DDL_CHECK(ddl_all_sum_reduce_forward(l->rowsum, l->stats, l->stats));

    if (l->reduction == DDL_REDUCTION_NONE) {
        if (l->col0) {
            DDL_CHECK(ddl_cross_entropy_combine(l->dt, rows > 0 ? elementwise->data : NULL, NULL,
                                                l->gmax, s, z, rows));
        }
        return DDL_OK;
    }
    double local = 0.0;
    if (l->col0) {
        DDL_CHECK(ddl_cross_entropy_combine(l->dt, NULL, &local, l->gmax, s, z, rows));
    }
    return reduce_value(l, local, false, value);
}

// Local checks of N-d cross-entropy's labels (no MPI): a bad one is named by its global
// batch index and voxel coordinates.
static ddl_status ce_nd_check(const ddl_loss_t *l, const int64_t *labels,
                              const ddl_tensor_t *elementwise)
{
    if (l->reduction == DDL_REDUCTION_NONE) {
        DDL_CHECK(check_tensor(l, "elementwise", elementwise, &l->el_shape));
    }
    int64_t n = ddl_shape_numel(&l->el_shape);
    DDL_REQUIRE(n == 0 || labels != NULL, DDL_EINVAL, "loss: cross-entropy labels are NULL");
    for (int64_t i = 0; i < n; i++) {
        if (labels[i] >= 0 && labels[i] < l->classes) {
            continue;
        }
        ddl_box b = ddl_partition_local_box(l->P_x, &l->x_global);
        char    at[160];
        int     used = 0;
        int64_t rem  = i;
        int64_t c[DDL_MAX_DIMS];
        for (int d = l->el_shape.ndim - 1; d >= 0; d--) {
            c[d] = rem % l->el_shape.d[d];
            rem /= l->el_shape.d[d];
        }
        for (int d = 1; d < l->el_shape.ndim && used < (int)sizeof at; d++) {
            used += snprintf(at + used, sizeof at - (size_t)used, "%s%lld", d > 1 ? ", " : "",
                             (long long)(b.start[d + 1] + c[d]));
        }
        return ddl_set_error(DDL_EINVAL,
                             "loss: cross-entropy label %lld at batch index %lld, voxel (%s) is "
                             "outside [0, %lld) (the model has %lld classes)",
                             (long long)labels[i], (long long)(b.start[0] + c[0]), at,
                             (long long)l->classes, (long long)l->classes);
    }
    return DDL_OK;
}

static ddl_status ce_nd_forward(ddl_loss_t *l, const ddl_tensor_t *x, const int64_t *labels,
                                double *value, ddl_tensor_t *elementwise)
{
    l->xs     = x->data;  // references for backward, not copies
    l->labels = labels;
    void   *el = l->reduction == DDL_REDUCTION_NONE && ddl_shape_numel(&l->el_shape) > 0
                     ? elementwise->data
                     : NULL;
    double  local = 0.0;
    ddl_status st = DDL_OK;
    if (l->active) {
        st = ddl_cross_entropy_nd_forward(l->dt, el, &local, l->xs, labels, l->rows, l->classes,
                                          l->voxels);
    }
    if (l->reduction == DDL_REDUCTION_NONE) {
        return st;
    }
    // Labels were checked already: a failure here is internal, and the reduction still
    // runs so that no partner waits.
    DDL_CHECK(reduce_value(l, st == DDL_OK ? local : 0.0, st != DDL_OK, value));
    return st;
}

static ddl_status loss_forward(ddl_loss_t *l, const ddl_tensor_t *x, const ddl_tensor_t *target,
                               const int64_t *labels, double *value, ddl_tensor_t *elementwise)
{
    DDL_REQUIRE(l != NULL, DDL_EINVAL, "loss forward: loss is NULL");
    if (value != NULL) {
        *value = 0.0;
    }
    ddl_status st = check_tensor(l, "x", x, &l->x_shape);
    if (st == DDL_OK) {
        st = l->nd                                ? ce_nd_check(l, labels, elementwise)
             : l->kind == DDL_LOSS_CROSS_ENTROPY ? ce_check(l, labels, elementwise)
                                                  : eloss_check(l, target, elementwise);
    }
    DDL_CHECK(agree_args(l, st));
    l->have_forward = true;
    if (l->nd) {
        // Only its arguments can fail it (checked above): agreed as they are.
        return agree_args(l, ce_nd_forward(l, x, labels, value, elementwise));
    }
    if (l->kind == DDL_LOSS_CROSS_ENTROPY) {
        return ce_forward(l, x, labels, value, elementwise);
    }
    return eloss_forward(l, x, target, value, elementwise);
}

// ---- backward ---------------------------------------------------------------------

// The upstream gradient of a reduced loss on every P_x rank (R* dv), divided by the
// normaliser.
static ddl_status reduced_scale(ddl_loss_t *l, double dvalue, double *scale)
{
    if (ddl_tensor_numel(l->total) > 0) {
        double *t = l->total->data;
        t[0]      = dvalue;
        t[1]      = 0.0;
    }
    DDL_CHECK(ddl_sum_reduce_adjoint(l->reduce, l->total, l->part));
    *scale = l->active ? ((const double *)l->part->data)[0] / l->norm : 0.0;
    return DDL_OK;
}

static ddl_status loss_backward(ddl_loss_t *l, double dvalue, const ddl_tensor_t *delementwise,
                                ddl_tensor_t *dx)
{
    DDL_REQUIRE(l != NULL, DDL_EINVAL, "loss backward: loss is NULL");
    bool       none = l->reduction == DDL_REDUCTION_NONE;
    bool       ce   = l->kind == DDL_LOSS_CROSS_ENTROPY;
    int64_t    n    = ddl_shape_numel(&l->x_shape);
    ddl_status st   = l->have_forward ? check_tensor(l, "dx", dx, &l->x_shape)
                                      : ddl_set_error(DDL_EINVAL,
                                                      "loss backward: called before any forward");
    if (st == DDL_OK && none && !ce) {
        st = check_tensor(l, "elementwise gradient", delementwise, &l->x_shape);
    }
    if (st == DDL_OK && none && l->nd) {
        st = check_tensor(l, "elementwise gradient", delementwise, &l->el_shape);
    }
    if (st == DDL_OK && none && ce && !l->nd && l->col0) {
        ddl_shape es = ddl_shape_make(1, (int64_t[]){l->rows});
        st           = check_tensor(l, "elementwise gradient", delementwise, &es);
    }
    DDL_CHECK(agree_args(l, st));
    if (n > 0) {
        ddl_tensor_zero(dx);
    }
    double      scale = 1.0;
    const void *g     = NULL;
    if (!none) {
        DDL_CHECK(reduced_scale(l, dvalue, &scale));
    } else if (l->nd) {
        g = ddl_shape_numel(&l->el_shape) > 0 ? delementwise->data : NULL;
    } else if (ce) {
        // The per-row gradients live on column 0: broadcast them along each P_x row.
        // Other ranks send nothing: a zero-volume stand-in.
        ddl_tensor_t        z   = {.dtype = l->dt, .shape = ddl_shape_make(1, (int64_t[]){0})};
        const ddl_tensor_t *src = l->col0 && delementwise != NULL ? delementwise : &z;
        DDL_CHECK(ddl_broadcast_forward(l->bcast_g, src, l->grow));
        g = l->grow->data;
    } else {
        g = n > 0 ? delementwise->data : NULL;
    }
    if (!l->active) {
        return DDL_OK;
    }
    if (l->nd) {
        return ddl_cross_entropy_nd_backward(l->dt, n > 0 ? dx->data : NULL, g, scale, l->xs,
                                             l->labels, l->rows, l->classes, l->voxels);
    }
    if (ce) {
        return ddl_cross_entropy_local_backward(l->dt, n > 0 ? dx->data : NULL, g, scale,
                                                l->xs, l->labels, l->gmax, l->stats->data,
                                                l->rows, l->c0, l->cl, l->classes);
    }
    return ddl_eloss_backward(l->kind, l->dt, n > 0 ? dx->data : NULL, g, scale, l->xs, l->ts,
                              n);
}

// ---- traffic --------------------------------------------------------------------
// Forward and backward record what they moved (snapshot deltas, as ddl_layer_forward
// does for layers), so a model can report its loss beside its layers.

ddl_status ddl_loss_forward(ddl_loss_t *l, const ddl_tensor_t *x, const ddl_tensor_t *target,
                            const int64_t *labels, double *value, ddl_tensor_t *elementwise)
{
    DDL_REQUIRE(l != NULL, DDL_EINVAL, "loss forward: loss is NULL");
    ddl_traffic mark, now;
    ddl_traffic_snapshot(&mark);
    ddl_status st = loss_forward(l, x, target, labels, value, elementwise);
    ddl_traffic_snapshot(&now);
    ddl_traffic_sub(&now, &mark, &l->traffic[0]);
    return st;
}

ddl_status ddl_loss_backward(ddl_loss_t *l, double dvalue, const ddl_tensor_t *delementwise,
                             ddl_tensor_t *dx)
{
    DDL_REQUIRE(l != NULL, DDL_EINVAL, "loss backward: loss is NULL");
    ddl_traffic mark, now;
    ddl_traffic_snapshot(&mark);
    ddl_status st = loss_backward(l, dvalue, delementwise, dx);
    ddl_traffic_snapshot(&now);
    ddl_traffic_sub(&now, &mark, &l->traffic[1]);
    return st;
}

void ddl_loss_traffic(const ddl_loss_t *l, bool backward, ddl_traffic *out)
{
    *out = l->traffic[backward ? 1 : 0];
}
