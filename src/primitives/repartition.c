// primitives/repartition.c: Repartition (DistDL's former DistributedTranspose), the
// general all-to-all that moves one global tensor from its decomposition over P_x
// onto the balanced decomposition over P_y.
//
// Notation: G is the global shape (ndim dims). X_i is the global box held by P_x
// member i (balanced, or any grid the caller chose), Y_j the balanced box of P_y
// member j. The operator is a permutation of entries:
//
//   forward   y_j[g - Y_j.start] = x_i[g - X_i.start]   for every g in X_i ∩ Y_j
//   adjoint   dx_i[...]          = dy_j[...]            (the same pieces, reversed)
//
// Because the X_i tile G and so do the Y_j, the pieces X_i ∩ Y_j are disjoint and
// cover every output exactly once: forward and adjoint overwrite, and T* = T^{-1}.
//
// The plan (built once in create):
//  - the union communicator of P_x ∪ P_y (P_x's ranks first, DistDL's P_union);
//  - for this rank as a P_x member, one "x piece" per P_y member its box meets
//    (sent in forward, received in adjoint), and as a P_y member one "y piece" per
//    P_x member (received in forward, sent in adjoint);
//  - the overlap with itself, copied locally (ddl_tensor_copy_box), never sent;
//  - for every remote piece an MPI description that reads or writes the tensor in
//    place: (base + offset, count, MPI_FLOAT/MPI_DOUBLE) when the piece is one
//    contiguous run of memory (the split is along the leading dims), otherwise a
//    committed subarray datatype. No pack buffers exist: with Open MPI's shared-memory
//    transport the datatype engine packs straight into the transport's fragments, so
//    a derived datatype costs the same two copies as a contiguous message, where a
//    manual pack would add a third.
//
// Execution posts every receive, then every send, then does the self copy while the
// messages are in flight, then waits. There are no collectives in forward/adjoint:
// a rank whose plan has no remote piece (e.g. the identity case P_x == P_y with
// balanced input) makes no MPI call at all.
#include <limits.h>
#include <string.h>

#include "base/check.h"
#include "ddl/agree.h"
#include "ddl/base.h"
#include "ddl/decomp.h"
#include "ddl/primitives.h"
#include "partition/mpi_check.h"
#include "primitives/traffic.h"

// Tags of the two directions (DistDL uses the same numbers). The union communicator
// is private to the plan, so only the direction needs distinguishing; within one
// direction a pair of ranks exchanges at most one piece (a box meets a box once), so
// MPI's non-overtaking order is never even needed.
#define TAG_FORWARD 111
#define TAG_ADJOINT 113

// One remote piece: where it lives in this rank's local tensor and how MPI reads or
// writes it there.
typedef struct piece {
    int          peer;     // the partner's rank in the union communicator
    MPI_Aint     offset;   // byte offset of the first element (contiguous case), else 0
    int          count;    // element count (contiguous case), else 1
    MPI_Datatype type;     // MPI_FLOAT/MPI_DOUBLE, or a committed subarray type
    bool         derived;  // type was created here and must be freed
    uint64_t     bytes;    // payload bytes of the piece (traffic counters)
} piece;

struct ddl_repartition {
    ddl_dtype        dt;
    ddl_shape        global;
    ddl_shape        x_shape;   // this rank's local input shape (zero dims outside P_x)
    ddl_shape        y_shape;   // this rank's balanced output shape (zero dims outside P_y)
    bool             local;     // no rank of the plan sends anything (identity shortcut)
    ddl_partition_t *U;         // union of P_x and P_y; NULL when not needed
    MPI_Comm         comm;      // U's communicator, MPI_COMM_NULL when no remote piece
    int              nx;        // pieces of my x, exchanged with P_y members
    int              ny;        // pieces of my y, exchanged with P_x members
    piece           *xp;        // nx pieces: sent by forward, received by adjoint
    piece           *yp;        // ny pieces: received by forward, sent by adjoint
    bool             has_self;  // my x box meets my own y box
    ddl_box          self_x;    // that overlap in x-local coordinates
    ddl_box          self_y;    // and in y-local coordinates
    MPI_Request     *req;       // nx + ny requests, reused by every call
    uint64_t         x_bytes;   // payload of the nx pieces (traffic counters)
    uint64_t         y_bytes;   // payload of the ny pieces
};

// ---- validation -------------------------------------------------------------

// Checks the arguments every rank can check alone. Deterministic: the same arguments
// give the same outcome on every rank, member or not, with no communication.
static ddl_status validate_args(const ddl_partition_t *P_x, const ddl_partition_t *P_y,
                                ddl_dtype dt, const ddl_shape *global)
{
    DDL_REQUIRE(dt == DDL_F32 || dt == DDL_F64, DDL_EINVAL, "repartition: unknown dtype %d",
                (int)dt);
    DDL_REQUIRE(ddl_partition_base(P_x) == ddl_partition_base(P_y), DDL_EINVAL,
                "repartition: P_x and P_y are over different base communicators");
    int n = global->ndim;
    DDL_REQUIRE(n >= 1 && n <= DDL_MAX_DIMS, DDL_EINVAL,
                "repartition: the tensor has %d dims, outside [1, %d]", n, DDL_MAX_DIMS);
    DDL_REQUIRE(ddl_partition_ndim(P_x) == ddl_partition_ndim(P_y), DDL_EINVAL,
                "repartition: P_x has %d dims but P_y has %d", ddl_partition_ndim(P_x),
                ddl_partition_ndim(P_y));
    DDL_REQUIRE(ddl_partition_ndim(P_x) == n, DDL_EINVAL,
                "repartition: P_x has %d dims, tensor has %d", ddl_partition_ndim(P_x), n);
    DDL_REQUIRE(ddl_partition_ndim(P_y) == n, DDL_EINVAL,
                "repartition: P_y has %d dims, tensor has %d", ddl_partition_ndim(P_y), n);
    const int *sx = ddl_partition_shape(P_x), *sy = ddl_partition_shape(P_y);
    for (int d = 0; d < n; d++) {
        // Subarray datatypes describe tensors with int sizes.
        DDL_REQUIRE(global->d[d] >= 0 && global->d[d] <= INT_MAX, DDL_EINVAL,
                    "repartition: global dim %d has size %lld, outside [0, %d]", d,
                    (long long)global->d[d], INT_MAX);
        // DistDL's rule: a dimension of global size 1 cannot be split.
        DDL_REQUIRE(global->d[d] != 1 || sx[d] == 1, DDL_EINVAL,
                    "repartition: P_x splits dim %d of global size 1 over %d ranks", d, sx[d]);
        DDL_REQUIRE(global->d[d] != 1 || sy[d] == 1, DDL_EINVAL,
                    "repartition: P_y splits dim %d of global size 1 over %d ranks", d, sy[d]);
    }
    return DDL_OK;
}

// Union members agree that each is ready to go on (`st`, this rank's status so far:
// ddl_agree carries the code and message of the lowest failing member to all), then
// that they were all called alike (same dtype, same global shape, x_local given
// everywhere or nowhere: a mix would make some ranks exchange shapes while others do
// not). One MPI_Allreduce(MIN) over v and -v yields the minimum and the maximum.
static ddl_status agree_on_call(MPI_Comm comm, ddl_status st, ddl_dtype dt,
                                const ddl_shape *global, bool unbalanced)
{
    DDL_CHECK(ddl_agree(comm, st));
    enum { K = 3 + DDL_MAX_DIMS };
    int64_t v[2 * K] = {0}, r[2 * K];
    v[0]             = unbalanced ? 1 : 0;
    v[1]             = (int64_t)dt;
    v[2]             = global->ndim;
    for (int d = 0; d < global->ndim; d++) {
        v[3 + d] = global->d[d];
    }
    for (int k = 0; k < K; k++) {
        v[K + k] = -v[k];
    }
    DDL_CHECK_MPI(MPI_Allreduce(v, r, 2 * K, MPI_INT64_T, MPI_MIN, comm));
    DDL_REQUIRE(r[0] == -r[K], DDL_EINVAL,
                "repartition: x_local is given on some ranks of the union and NULL on others");
    for (int k = 1; k < K; k++) {
        DDL_REQUIRE(r[k] == -r[K + k], DDL_EINVAL,
                    "repartition: ranks of the union disagree on the %s",
                    k == 1 ? "dtype" : "global shape");
    }
    return DDL_OK;
}

// ---- the input grid ---------------------------------------------------------

// The input grid: per dimension d, the P_x coordinate c covers global indices
// [start[off[d] + c], start[off[d] + c + 1]). Balanced unless the caller says otherwise.
typedef struct grid {
    int64_t *start;
    int      off[DDL_MAX_DIMS];
} grid;

// Room for P_x.shape[d] + 1 boundaries per dim (a few ints per rank of P_x at most).
static ddl_status grid_alloc(const ddl_partition_t *P_x, int n, grid *g)
{
    const int *sx    = ddl_partition_shape(P_x);
    int        total = 0;
    for (int d = 0; d < n; d++) {
        g->off[d] = total;
        total += sx[d] + 1;
    }
    g->start = ddl_malloc(sizeof(int64_t) * (size_t)total);
    DDL_REQUIRE(g->start != NULL, DDL_ENOMEM, "repartition: out of memory for the input grid");
    return DDL_OK;
}

// Balanced input: the boundaries follow from G and P_x's shape alone, so every rank
// computes them with no communication (start of coordinate P is G[d]).
static void grid_balanced(const ddl_partition_t *P_x, const ddl_shape *global, grid *g)
{
    const int *sx = ddl_partition_shape(P_x);
    for (int d = 0; d < global->ndim; d++) {
        for (int c = 0; c <= sx[d]; c++) {
            g->start[g->off[d] + c] = ddl_decomp_start(global->d[d], sx[d], c);
        }
    }
}

// The global box of the P_x member at coordinate `coord`.
static ddl_box grid_box(const grid *g, int n, const int *coord)
{
    ddl_box b = {.ndim = n};
    for (int d = 0; d < n; d++) {
        b.start[d] = g->start[g->off[d] + coord[d]];
        b.stop[d]  = g->start[g->off[d] + coord[d] + 1];
    }
    return b;
}

// Unbalanced input: every union member contributes its local shape (P_x members) or
// -1s (others) to an MPI_Allgather, then every rank checks the same data the same way,
// so all reach the same verdict. P_x member j is union rank j (P_x's ranks come first
// in the union). The shapes must form a grid: along dim d every member at coordinate c
// has the same extent, and the extents along d sum to G[d].
static ddl_status grid_unbalanced(MPI_Comm comm, const ddl_partition_t *P_x,
                                  const ddl_shape *global, const ddl_shape *x_local, int64_t *all,
                                  grid *g)
{
    int        n  = global->ndim, nx = ddl_partition_size(P_x);
    const int *sx = ddl_partition_shape(P_x);
    int64_t    mine[DDL_MAX_DIMS];
    for (int d = 0; d < n; d++) {
        mine[d] = -1;  // not in P_x
    }
    if (ddl_partition_active(P_x)) {
        bool ok = x_local->ndim == n;
        for (int d = 0; ok && d < n; d++) {
            ok = x_local->d[d] >= 0;
        }
        for (int d = 0; d < n; d++) {
            mine[d] = ok ? x_local->d[d] : -2;  // -2 marks a malformed shape
        }
    }
    DDL_CHECK_MPI(MPI_Allgather(mine, n, MPI_INT64_T, all, n, MPI_INT64_T, comm));
    const int *xr = ddl_partition_ranks(P_x);
    ddl_status st = DDL_OK;
    for (int j = 0; j < nx && st == DDL_OK; j++) {
        if (all[(size_t)j * (size_t)n] == -2) {
            st = ddl_set_error(DDL_ESHAPE,
                               "repartition: P_x member %d (rank %d) passed a local shape that "
                               "is not %d non-negative dims",
                               j, xr[j], n);
        }
    }
    // Along each dim, compare every member with the representative of its coordinate
    // (the member at coordinate c along d and 0 elsewhere), then sum the extents.
    for (int d = 0; d < n && st == DDL_OK; d++) {
        int64_t *start = g->start + g->off[d];
        start[0]       = 0;
        for (int c = 0; c < sx[d]; c++) {
            int rep[DDL_MAX_DIMS] = {0};
            rep[d]                = c;
            int64_t rj            = ddl_index_ravel(n, sx, rep);
            start[c + 1]          = start[c] + all[(size_t)rj * (size_t)n + (size_t)d];
        }
        for (int j = 0; j < nx && st == DDL_OK; j++) {
            int coord[DDL_MAX_DIMS] = {0}, rep[DDL_MAX_DIMS] = {0};
            ddl_index_unravel(n, sx, j, coord);
            rep[d]     = coord[d];
            int64_t rj = ddl_index_ravel(n, sx, rep);
            int64_t e  = all[(size_t)j * (size_t)n + (size_t)d];
            int64_t er = all[(size_t)rj * (size_t)n + (size_t)d];
            if (e != er) {
                st = ddl_set_error(DDL_ESHAPE,
                                   "repartition: local shapes do not form a grid: along dim %d, "
                                   "P_x coordinate %d has extent %lld on rank %d but %lld on "
                                   "rank %d",
                                   d, coord[d], (long long)e, xr[j], (long long)er, xr[rj]);
            }
        }
        if (st == DDL_OK && start[sx[d]] != global->d[d]) {
            st = ddl_set_error(DDL_ESHAPE,
                               "repartition: local extents along dim %d sum to %lld, but the "
                               "global shape has %lld",
                               d, (long long)start[sx[d]], (long long)global->d[d]);
        }
    }
    return st;
}

// ---- pieces -----------------------------------------------------------------

// The MPI element type of a dtype.
static MPI_Datatype mpi_type(ddl_dtype dt)
{
    return dt == DDL_F64 ? MPI_DOUBLE : MPI_FLOAT;
}

// Describes box b (local coordinates) of a row-major tensor of shape s for MPI.
// Dimensions are first merged where the inner one is covered whole (its rows are then
// contiguous with the outer step), which leaves the datatype engine the fewest levels
// to walk. If one run remains the piece is contiguous and is sent from or received
// into the tensor's memory with a plain count; otherwise a subarray type is built.
//
// Example, G = [77, 55] from P_x [4, 1] to P_y [3, 4]: rank (0,0) of P_x holds x of
// shape [20, 55]; its piece for P_y (0,1) is rows [0, 20) x cols [14, 28): two levels,
// 20 runs of 14 elements -> a subarray. The matching y piece on P_y (0,1), of shape
// [26, 14], is rows [0, 20) x all cols: merged into one run -> a plain count.
static ddl_status piece_describe(ddl_dtype dt, const ddl_shape *s, const ddl_box *b, int peer,
                                 piece *p)
{
    // size/sub/st: the merged dims' full sizes, box extents and box starts (innermost
    // first), in the units of the merged dims below them.
    int size[DDL_MAX_DIMS], sub[DDL_MAX_DIMS], st[DDL_MAX_DIMS];
    int m = 0;  // merged dims, innermost first
    for (int d = s->ndim - 1; d >= 0; d--) {
        int64_t sz = s->d[d], e = b->stop[d] - b->start[d], o = b->start[d];
        // Merge into the current innermost merged dim when that one is whole and the
        // product still fits MPI's int.
        if (m > 0 && sub[m - 1] == size[m - 1] && sz * size[m - 1] <= INT_MAX) {
            int64_t in = size[m - 1];
            size[m - 1] = (int)(sz * in);
            sub[m - 1]  = (int)(e * in);
            st[m - 1]   = (int)(o * in);
        } else {
            size[m] = (int)sz;
            sub[m]  = (int)e;
            st[m]   = (int)o;
            m++;
        }
    }
    // Outer merged dims of extent 1 do not break contiguity: the run is the innermost.
    bool contiguous = true;
    for (int k = 1; k < m; k++) {
        if (sub[k] != 1) {
            contiguous = false;
        }
    }
    int64_t numel = ddl_box_numel(b);
    p->peer       = peer;
    p->derived    = false;
    p->bytes      = (uint64_t)numel * ddl_dtype_size(dt);
    if (contiguous && numel <= INT_MAX) {
        int64_t first = 0, stride = 1;  // element offset of the box's first element
        for (int d = s->ndim - 1; d >= 0; d--) {
            first += b->start[d] * stride;
            stride *= s->d[d];
        }
        p->offset = (MPI_Aint)(first * (int64_t)ddl_dtype_size(dt));
        p->count  = (int)numel;
        p->type   = mpi_type(dt);
        return DDL_OK;
    }
    // MPI_Type_create_subarray wants the slowest dimension first.
    int rs[DDL_MAX_DIMS], rsub[DDL_MAX_DIMS], rst[DDL_MAX_DIMS];
    for (int k = 0; k < m; k++) {
        rs[k]   = size[m - 1 - k];
        rsub[k] = sub[m - 1 - k];
        rst[k]  = st[m - 1 - k];
    }
    p->offset = 0;
    p->count  = 1;
    p->type   = MPI_DATATYPE_NULL;
    DDL_CHECK_MPI(
        MPI_Type_create_subarray(m, rs, rsub, rst, MPI_ORDER_C, mpi_type(dt), &p->type));
    p->derived = true;
    DDL_CHECK_MPI(MPI_Type_commit(&p->type));
    return DDL_OK;
}

// One side of this rank's plan: my box in one partition, met against every box of the
// other partition Q. Q's boxes come from the input grid (Q = P_x) or are balanced over
// Q (Q = P_y).
typedef struct side {
    const ddl_partition_t *Q;     // the partition of the partners
    const grid            *qg;    // their boxes (NULL: balanced over Q)
    ddl_box                mine;  // my box, global coordinates
    ddl_shape              s;     // my local tensor shape
    int                    rot;   // where the walk starts
    bool                   is_x;  // my box is my x box (self overlap sides)
} side;

// Walks the members of Q and collects the overlaps of my box with theirs: the overlap
// with myself into the plan's self boxes, the others (when out != NULL) into out as
// pieces of my local tensor; *count is the number of remote pieces. The walk starts
// after my own position so that the ranks do not all send to the same partner first.
// Called twice by side_build: with out == NULL it only counts (and records the self
// overlap); with out it fills the array. Both passes walk in the same order.
static ddl_status side_collect(ddl_repartition_t *t, const side *sd, piece *out, int *count)
{
    int        n = t->global.ndim, nq = ddl_partition_size(sd->Q);
    const int *qshape = ddl_partition_shape(sd->Q);
    const int *qr     = ddl_partition_ranks(sd->Q);
    int        me     = ddl_partition_base_rank(sd->Q);
    int        k      = 0;
    for (int i = 0; i < nq; i++) {
        int j = (i + sd->rot) % nq;
        int coord[DDL_MAX_DIMS];
        ddl_index_unravel(n, qshape, j, coord);
        ddl_box qb = sd->qg ? grid_box(sd->qg, n, coord)
                            : ddl_decomp_box(&t->global, qshape, coord);
        ddl_box ov;
        if (!ddl_box_intersect(&sd->mine, &qb, &ov)) {
            continue;
        }
        ddl_box lo = ddl_box_shift(&ov, sd->mine.start, 1);  // in my local coordinates
        if (qr[j] == me) {
            // The partner is this rank (it is in both partitions): the overlap is the
            // self copy, seen from my x and my y tensor. Both sides find the same box.
            ddl_box lq  = ddl_box_shift(&ov, qb.start, 1);
            t->has_self = true;
            t->self_x   = sd->is_x ? lo : lq;
            t->self_y   = sd->is_x ? lq : lo;
            continue;
        }
        if (out != NULL) {
            int peer = ddl_partition_position(t->U, qr[j]);
            DDL_ASSERT(peer >= 0);
            // Count the piece before describing it so destroy frees a partial type.
            out[k].type    = MPI_DATATYPE_NULL;
            out[k].derived = false;
            *count         = k + 1;
            DDL_CHECK(piece_describe(t->dt, &sd->s, &lo, peer, &out[k]));
        }
        k++;
    }
    if (out == NULL) {
        *count = k;
    }
    return DDL_OK;
}

// Counts, allocates and describes the pieces of one side (exactly sized array).
static ddl_status side_build(ddl_repartition_t *t, const side *sd, piece **out, int *count)
{
    int n = 0;
    DDL_CHECK(side_collect(t, sd, NULL, &n));
    *count = 0;
    if (n == 0) {
        return DDL_OK;
    }
    *out = ddl_calloc((size_t)n, sizeof(piece));
    DDL_REQUIRE(*out != NULL, DDL_ENOMEM, "repartition: out of memory for %d pieces", n);
    return side_collect(t, sd, *out, count);
}

// Frees the datatypes this plan created (not the predefined ones) and the array.
static void pieces_free(piece *p, int n)
{
    for (int k = 0; k < n; k++) {
        if (p[k].derived && p[k].type != MPI_DATATYPE_NULL) {
            MPI_Type_free(&p[k].type);
        }
    }
    ddl_free(p);
}

// Builds this union member's plan from the input grid: my local shapes, my pieces as
// a P_x member (my x box against every balanced P_y box) and as a P_y member (my
// balanced y box against every P_x box of the grid), and the request array. Local;
// allocates and creates datatypes, so it can fail with ENOMEM or EMPI.
static ddl_status plan_build(ddl_repartition_t *t, const ddl_partition_t *P_x,
                             const ddl_partition_t *P_y, const grid *xg)
{
    int n = t->global.ndim;
    if (ddl_partition_active(P_x)) {
        ddl_box xb = grid_box(xg, n, ddl_partition_index(P_x));
        t->x_shape = ddl_box_shape(&xb);
        if (ddl_box_numel(&xb) > 0) {
            side sd = {.Q    = P_y,
                       .qg   = NULL,
                       .mine = xb,
                       .s    = t->x_shape,
                       .rot  = ddl_partition_rank(P_x) + 1,
                       .is_x = true};
            DDL_CHECK(side_build(t, &sd, &t->xp, &t->nx));
        }
    }
    if (ddl_partition_active(P_y)) {
        ddl_box yb = ddl_partition_local_box(P_y, &t->global);
        t->y_shape = ddl_box_shape(&yb);
        if (ddl_box_numel(&yb) > 0) {
            side sd = {.Q    = P_x,
                       .qg   = xg,
                       .mine = yb,
                       .s    = t->y_shape,
                       .rot  = ddl_partition_rank(P_y) + 1,
                       .is_x = false};
            DDL_CHECK(side_build(t, &sd, &t->yp, &t->ny));
        }
    }
    for (int k = 0; k < t->nx; k++) {
        t->x_bytes += t->xp[k].bytes;
    }
    for (int k = 0; k < t->ny; k++) {
        t->y_bytes += t->yp[k].bytes;
    }
    if (t->nx + t->ny > 0) {
        t->req = ddl_malloc(sizeof(MPI_Request) * (size_t)(t->nx + t->ny));
        DDL_REQUIRE(t->req != NULL, DDL_ENOMEM, "repartition: out of memory for requests");
    }
    return DDL_OK;
}

// ---- create / destroy --------------------------------------------------------

// Frees the datatypes, arrays and the union communicator. NULL-safe, sets *t to NULL.
// Not collective (like ddl_partition_destroy, which frees the union communicator).
void ddl_repartition_destroy(ddl_repartition_t **t)
{
    if (t == NULL || *t == NULL) {
        return;
    }
    pieces_free((*t)->xp, (*t)->nx);
    pieces_free((*t)->yp, (*t)->ny);
    ddl_free((*t)->req);
    ddl_partition_destroy(&(*t)->U);
    ddl_free(*t);
    *t = NULL;
}

// Collective over P_x ∪ P_y. The sequence on a member is:
//   validate_args (local) -> union communicator -> agreement allreduce
//   -> [unbalanced: allgather of the local shapes, then the grid check]
//   -> plan_build (local) -> final allreduce (status, any remote piece?).
// Every member runs the same collectives in the same order whatever fails locally,
// and returns the same status. x_local is read on P_x members only.
ddl_status ddl_repartition_create(const ddl_partition_t *P_x, const ddl_partition_t *P_y,
                                  ddl_dtype dt, const ddl_shape *global, const ddl_shape *x_local,
                                  ddl_repartition_t **out)
{
    DDL_REQUIRE(P_x != NULL && P_y != NULL && global != NULL && out != NULL, DDL_EINVAL,
                "repartition: P_x, P_y, global and out must not be NULL");
    DDL_CHECK(validate_args(P_x, P_y, dt, global));
    ddl_repartition_t *t = ddl_calloc(1, sizeof *t);
    if (t == NULL) {
        ddl_status st = ddl_set_error(DDL_ENOMEM, "repartition: out of memory for the plan");
        if (!ddl_partition_active(P_x) && !ddl_partition_active(P_y)) {
            return st;
        }
        // Join the union's creation and first agreement with the failure, so that the
        // other members fail with this one instead of waiting for it.
        ddl_partition_t *U = NULL;
        if (ddl_partition_union(P_x, P_y, &U) == DDL_OK) {
            st = agree_on_call(ddl_partition_comm(U), st, dt, global, x_local != NULL);
            ddl_partition_destroy(&U);
        }
        return st;
    }
    t->dt      = dt;
    t->global  = *global;
    t->x_shape = (ddl_shape){.ndim = global->ndim};
    t->y_shape = (ddl_shape){.ndim = global->ndim};
    t->local   = true;
    t->comm    = MPI_COMM_NULL;
    if (!ddl_partition_active(P_x) && !ddl_partition_active(P_y)) {
        // Neither partition: nothing to move, no collective to join.
        *out = t;
        return DDL_OK;
    }

    // From here on the members run the same sequence of collectives over the union
    // whatever happens locally: allocation first, then the agreement that carries any
    // local failure to everyone, then (unbalanced) the shape exchange whose data, and
    // so whose verdict, is identical everywhere.
    ddl_status st = ddl_partition_union(P_x, P_y, &t->U);
    if (st != DDL_OK) {
        ddl_repartition_destroy(&t);
        return st;
    }
    MPI_Comm comm  = ddl_partition_comm(t->U);
    grid     xg    = {.start = NULL};
    int64_t *all   = NULL;  // every member's local shape (unbalanced input)
    int      usize = ddl_partition_size(t->U);
    st             = grid_alloc(P_x, global->ndim, &xg);
    if (st == DDL_OK && x_local != NULL) {
        all = ddl_malloc(sizeof(int64_t) * (size_t)usize * (size_t)global->ndim);
        if (all == NULL) {
            st = ddl_set_error(DDL_ENOMEM, "repartition: out of memory for the local shapes");
        }
    }
    st = agree_on_call(comm, st, dt, global, x_local != NULL);
    if (st == DDL_OK) {
        if (x_local != NULL) {
            st = grid_unbalanced(comm, P_x, global, x_local, all, &xg);
        } else {
            grid_balanced(P_x, global, &xg);
        }
    }
    ddl_free(all);
    if (st != DDL_OK) {
        // The same verdict on every member: return without further collectives.
        ddl_free(xg.start);
        ddl_repartition_destroy(&t);
        return st;
    }
    st = plan_build(t, P_x, P_y, &xg);
    ddl_free(xg.start);

    // Final agreement: the status (ddl_agree), then whether any member has a remote
    // piece.
    st        = ddl_agree(comm, st);
    int64_t v = -(int64_t)(t->nx + t->ny), r = 0;
    if (st == DDL_OK && MPI_Allreduce(&v, &r, 1, MPI_INT64_T, MPI_MIN, comm) != MPI_SUCCESS) {
        st = ddl_set_error(DDL_EMPI, "repartition: MPI_Allreduce of the piece counts failed");
    }
    if (st != DDL_OK) {
        ddl_repartition_destroy(&t);
        return st;
    }
    // r is minus the largest number of remote pieces on any member: zero means
    // the whole plan is self copies (P_x == P_y with balanced input, or degenerate
    // shapes), so forward and adjoint never touch MPI.
    t->local = r == 0;
    if (t->local) {
        // Identity shortcut: only self copies remain, the union is not needed.
        ddl_partition_destroy(&t->U);
    } else {
        t->comm = comm;
    }
    *out = t;
    return DDL_OK;
}

// ---- accessors ----------------------------------------------------------------
// Not collective. Shapes have the tensor's ndim; all zero where this rank holds nothing.

ddl_shape ddl_repartition_x_shape(const ddl_repartition_t *t)
{
    return t->x_shape;
}

ddl_shape ddl_repartition_y_shape(const ddl_repartition_t *t)
{
    return t->y_shape;
}

// The same on every member of the union; true on ranks outside it (they move nothing).
bool ddl_repartition_is_local(const ddl_repartition_t *t)
{
    return t->local;
}

// ---- execution -----------------------------------------------------------------

// A tensor passed in must have the plan's dtype and local shape; where that shape has
// no volume, any zero-volume tensor (or NULL) is accepted.
static ddl_status check_tensor(const ddl_repartition_t *t, const ddl_tensor_t *a,
                               const ddl_shape *want, const char *what)
{
    if (a == NULL) {
        DDL_REQUIRE(ddl_shape_numel(want) == 0, DDL_EINVAL,
                    "repartition: %s is NULL but this rank's piece is not empty", what);
        return DDL_OK;
    }
    DDL_REQUIRE(a->dtype == t->dt, DDL_EINVAL, "repartition: %s is %s, the plan is %s", what,
                ddl_dtype_name(a->dtype), ddl_dtype_name(t->dt));
    if (ddl_shape_numel(want) == 0 && ddl_tensor_numel(a) == 0) {
        return DDL_OK;
    }
    if (!ddl_shape_equal(&a->shape, want)) {
        char got[96], exp[96];
        return ddl_set_error(DDL_ESHAPE, "repartition: %s has shape %s, this rank's is %s", what,
                             ddl_shape_str(&a->shape, got, sizeof got),
                             ddl_shape_str(want, exp, sizeof exp));
    }
    return DDL_OK;
}

// Cancels and releases the first n requests after a failed post.
static void requests_abandon(MPI_Request *req, int n)
{
    for (int k = 0; k < n; k++) {
        if (req[k] != MPI_REQUEST_NULL) {
            MPI_Cancel(&req[k]);
            MPI_Request_free(&req[k]);
        }
    }
}

// Moves the pieces `sp` of src to their partners and receives the pieces `rp` of dst
// from theirs, plus the self overlap (src box sb -> dst box db). Receives are posted
// first so that eager messages land directly in dst; the self copy runs while the
// messages are in flight. Allocates nothing: the requests live in the plan, which is
// why one plan must not execute twice at the same time (from two threads).
static ddl_status execute(const ddl_repartition_t *t, const ddl_tensor_t *src, const piece *sp,
                          int ns, const ddl_box *sb, ddl_tensor_t *dst, const piece *rp, int nr,
                          const ddl_box *db, int tag)
{
    MPI_Request *req = t->req;
    int          k   = 0;
    for (int i = 0; i < nr; i++, k++) {
        int rc = MPI_Irecv((char *)dst->data + rp[i].offset, rp[i].count, rp[i].type,
                           rp[i].peer, tag, t->comm, &req[k]);
        if (rc != MPI_SUCCESS) {
            requests_abandon(req, k);
            DDL_CHECK_MPI(rc);
        }
    }
    for (int i = 0; i < ns; i++, k++) {
        int rc = MPI_Isend((const char *)src->data + sp[i].offset, sp[i].count, sp[i].type,
                           sp[i].peer, tag, t->comm, &req[k]);
        if (rc != MPI_SUCCESS) {
            requests_abandon(req, k);
            DDL_CHECK_MPI(rc);
        }
    }
    if (t->has_self) {
        ddl_tensor_copy_box(src, sb, dst, db);
    }
    if (k > 0) {
        DDL_CHECK_MPI(MPI_Waitall(k, req, MPI_STATUSES_IGNORE));
    }
    return DDL_OK;
}

// y = T x. Point-to-point over the union (no collective): x has this rank's input
// shape (ddl_repartition_x_shape), y its balanced output shape; y is overwritten
// entirely, since the pieces tile it.
ddl_status ddl_repartition_forward(const ddl_repartition_t *t, const ddl_tensor_t *x,
                                   ddl_tensor_t *y)
{
    DDL_REQUIRE(t != NULL, DDL_EINVAL, "repartition_forward: plan is NULL");
    DDL_CHECK(check_tensor(t, x, &t->x_shape, "x"));
    DDL_CHECK(check_tensor(t, y, &t->y_shape, "y"));
    // x pieces go out, y pieces come in.
    ddl__traffic_add(DDL_TRAFFIC_REPARTITION, DDL_TRAFFIC_FORWARD, t->x_bytes, t->y_bytes);
    DDL_TRAFFIC_TIMED_RETURN(
        DDL_TRAFFIC_REPARTITION, DDL_TRAFFIC_FORWARD,
        execute(t, x, t->xp, t->nx, &t->self_x, y, t->yp, t->ny, &t->self_y, TAG_FORWARD));
}

ddl_traffic_count ddl_repartition_traffic(const ddl_repartition_t *t, ddl_traffic_pass pass)
{
    ddl_traffic_count c = {0, 0, 1};
    if (t != NULL) {
        c.sent     = pass == DDL_TRAFFIC_FORWARD ? t->x_bytes : t->y_bytes;
        c.received = pass == DDL_TRAFFIC_FORWARD ? t->y_bytes : t->x_bytes;
    }
    return c;
}

// dx = T* dy = T^{-1} dy: every piece travels back along its forward route. dx is
// overwritten entirely (the pieces are disjoint and tile it).
ddl_status ddl_repartition_adjoint(const ddl_repartition_t *t, const ddl_tensor_t *dy,
                                   ddl_tensor_t *dx)
{
    DDL_REQUIRE(t != NULL, DDL_EINVAL, "repartition_adjoint: plan is NULL");
    DDL_CHECK(check_tensor(t, dy, &t->y_shape, "dy"));
    DDL_CHECK(check_tensor(t, dx, &t->x_shape, "dx"));
    // The inverse remap: y pieces go back out, x pieces come home.
    ddl__traffic_add(DDL_TRAFFIC_REPARTITION, DDL_TRAFFIC_ADJOINT, t->y_bytes, t->x_bytes);
    DDL_TRAFFIC_TIMED_RETURN(
        DDL_TRAFFIC_REPARTITION, DDL_TRAFFIC_ADJOINT,
        execute(t, dy, t->yp, t->ny, &t->self_y, dx, t->xp, t->nx, &t->self_x, TAG_ADJOINT));
}
