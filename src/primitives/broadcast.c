// primitives/broadcast.c: Broadcast P_x -> P_y, and the fan-out/fan-in executor that
// Broadcast and SumReduce share (primitives/bcast_reduce.h).
//
// Math. DistDL's broadcast rules give every P_y rank j a source σ(j) in P_x (the P_x
// rank of the same colour; see ddl_group_pair_broadcast). With x_i the local tensor of
// P_x rank i and y_j that of P_y rank j, all of the same local shape S:
//
//     y_j = x_{σ(j)}                        (forward,  B)
//     dx_i = Σ_{j : σ(j) = i} dy_j          (adjoint,  B*: a sum-reduce onto P_x)
//
// A source that is also one of its own destinations contributes its own dy_i to the
// sum. <B x, dy> = Σ_j <x_{σ(j)}, dy_j> = Σ_i <x_i, Σ_{σ(j)=i} dy_j> = <x, B* dy>.
//
// Shapes. x is S on P_x ranks and zero-volume elsewhere; y is S on P_y ranks and
// zero-volume elsewhere (a rank in neither holds zero-volume x and y).
//
// Collectivity. Create is collective over P_x ∪ P_y (it creates the group
// communicators); forward and adjoint are collective over the groups of each rank:
// one group rooted by each P_x rank, holding it (comm rank 0) and its destinations.
// A rank in two groups issues its two blocking collectives in increasing order of
// root rank (send_first); with a single global order no cycle can form.
//
// Each group runs one MPI_Bcast (forward) or MPI_Reduce(SUM) (adjoint) per chunk of at
// most ddl__mpi_max_count() elements. A group of one member (the source is its only
// destination, e.g. P_x == P_y) is a local copy with no communicator.
#include <limits.h>
#include <string.h>

#include "ddl/base.h"
#include "ddl/primitives.h"
#include "partition/group_internal.h"
#include "partition/mpi_check.h"
#include "primitives/bcast_reduce.h"
#include "primitives/traffic.h"

// The plan is the shared executor with the sources as roots. Everything it needs is
// computed by ddl_broadcast_create; forward and adjoint read it and allocate nothing.
struct ddl_broadcast {
    ddl__bcast_reduce br;  // roots = P_x ranks, leaves = P_y ranks
};

// ---- helpers shared by the collective primitives ---------------------------

// Chunk limit read by plans at creation; see ddl__mpi_set_max_count. MPI counts are
// int, so a message of more than INT_MAX elements is sent as several calls; every
// member of a group computes the same split from the same count, so the calls pair up.
static int64_t mpi_max_count = INT_MAX;

int64_t ddl__mpi_max_count(void)
{
    return mpi_max_count;
}

int64_t ddl__mpi_set_max_count(int64_t n)
{
    int64_t old   = mpi_max_count;
    mpi_max_count = n < 1 ? 1 : (n > INT_MAX ? INT_MAX : n);
    return old;
}

MPI_Datatype ddl__mpi_dtype(ddl_dtype dt)
{
    return dt == DDL_F64 ? MPI_DOUBLE : MPI_FLOAT;
}

// Pure function of the arguments: every rank reaches the same verdict, which is what
// lets create refuse a plan without any agreement message.
ddl_status ddl__check_plan_shape(const char *name, ddl_dtype dt, const ddl_shape *shape)
{
    DDL_REQUIRE(dt == DDL_F32 || dt == DDL_F64, DDL_EINVAL,
                "%s: unknown dtype %d (expected DDL_F32 or DDL_F64)", name, (int)dt);
    DDL_REQUIRE(shape->ndim >= 0 && shape->ndim <= DDL_MAX_DIMS, DDL_EINVAL,
                "%s: shape has %d dims, outside [0, %d]", name, shape->ndim, DDL_MAX_DIMS);
    // The element count must fit in int64 together with the byte count.
    int64_t n = 1, limit = INT64_MAX / (int64_t)ddl_dtype_size(dt);
    for (int i = 0; i < shape->ndim; i++) {
        int64_t d = shape->d[i];
        DDL_REQUIRE(d >= 0, DDL_EINVAL, "%s: shape[%d] = %lld is negative", name, i,
                    (long long)d);
        DDL_REQUIRE(d == 0 || n <= limit / d, DDL_EINVAL,
                    "%s: shape[%d] = %lld makes the tensor too large to address", name, i,
                    (long long)d);
        n *= d;
    }
    return DDL_OK;
}

ddl_shape ddl__zero_shape(const ddl_shape *shape)
{
    // A 0-d tensor always holds one element, so its empty counterpart needs one dim.
    ddl_shape z = {.ndim = shape->ndim > 0 ? shape->ndim : 1};
    return z;
}

// Unlike plan validation this is local: a rank handed a wrong tensor returns before
// any communication, but its partners in the collective would then wait for it. Such
// an error is a bug in the caller, reported as precisely as possible.
ddl_status ddl__check_tensor(const char *op, const char *tname, const ddl_tensor_t *t,
                             ddl_dtype dt, const ddl_shape *want)
{
    DDL_REQUIRE(t != NULL, DDL_EINVAL, "%s: %s is NULL", op, tname);
    DDL_REQUIRE(t->dtype == dt, DDL_ESHAPE, "%s: %s has dtype %s, the plan has %s", op, tname,
                ddl_dtype_name(t->dtype), ddl_dtype_name(dt));
    if (ddl_shape_numel(want) == 0 && ddl_shape_numel(&t->shape) == 0) {
        return DDL_OK;  // any empty tensor stands for "nothing on this rank"
    }
    if (!ddl_shape_equal(&t->shape, want)) {
        char got[128], exp[128];
        return ddl_set_error(DDL_ESHAPE, "%s: %s has shape %s, expected %s on this rank", op,
                             tname, ddl_shape_str(&t->shape, got, sizeof got),
                             ddl_shape_str(want, exp, sizeof exp));
    }
    // Shapes match and the volume is positive (empty ones returned above).
    DDL_REQUIRE(t->data != NULL, DDL_EINVAL, "%s: %s has no data", op, tname);
    return DDL_OK;
}

// ---- chunked collectives ---------------------------------------------------
// Every member of a group holds the same element count n and the plan's max_count, so
// all members issue the same sequence of calls.

// buf (p->n elements) from comm rank 0 to every member, in place on the receivers.
static ddl_status bcast_chunks(const ddl__bcast_reduce *p, void *buf, MPI_Comm comm)
{
    size_t esz = ddl_dtype_size(p->dt);
    for (int64_t off = 0; off < p->n; off += p->max_count) {
        int64_t c = p->n - off < p->max_count ? p->n - off : p->max_count;
        DDL_CHECK_MPI(MPI_Bcast((char *)buf + (size_t)off * esz, (int)c, p->mpi_dt, 0, comm));
    }
    return DDL_OK;
}

// recv (at comm rank 0) = Σ over the members of send (p->n elements each). send may be
// MPI_IN_PLACE (at the root: its recv already holds its term) and recv NULL (at a
// leaf, where MPI ignores it); neither sentinel is offset.
static ddl_status reduce_chunks(const ddl__bcast_reduce *p, const void *send, void *recv,
                                MPI_Comm comm)
{
    size_t esz = ddl_dtype_size(p->dt);
    for (int64_t off = 0; off < p->n; off += p->max_count) {
        int64_t     c = p->n - off < p->max_count ? p->n - off : p->max_count;
        const void *s =
            send == MPI_IN_PLACE ? MPI_IN_PLACE : (const char *)send + (size_t)off * esz;
        void       *r = recv == NULL ? NULL : (char *)recv + (size_t)off * esz;
        DDL_CHECK_MPI(MPI_Reduce(s, r, (int)c, p->mpi_dt, MPI_SUM, 0, comm));
    }
    return DDL_OK;
}

// ---- the shared executor ---------------------------------------------------

ddl_status ddl__bcast_reduce_init(ddl__bcast_reduce *p, const char *name,
                                  const ddl_partition_t *P_x, const ddl_partition_t *P_y,
                                  bool transpose_src, bool transpose_dest, ddl_dtype dt,
                                  const ddl_shape *shape, bool roots_are_x, ddl_status local)
{
    DDL_REQUIRE(P_x != NULL && P_y != NULL, DDL_EINVAL, "%s: P_x or P_y is NULL", name);
    DDL_REQUIRE(shape != NULL, DDL_EINVAL, "%s: shape is NULL", name);
    DDL_CHECK(ddl__check_plan_shape(name, dt, shape));

    // The group builders check the partition rules (and the shared base) identically
    // on every rank before they create any communicator.
    ddl_group_pair g;
    if (roots_are_x) {
        DDL_CHECK(ddl__group_pair_broadcast(P_x, P_y, transpose_src, transpose_dest, local, &g));
    } else {
        DDL_CHECK(ddl__group_pair_reduce(P_x, P_y, transpose_src, transpose_dest, local, &g));
    }

    memset(p, 0, sizeof *p);
    p->pair = g;
    // Broadcast pairs: send = the group I root, recv = the one I am a leaf of.
    // Reduction pairs: send = the group I contribute to (a leaf), recv = the group I
    // root. send_first says the pair's send group has the lower root rank and goes
    // first; translated to rooted/leaf terms that order is kept unchanged. (When only
    // one group exists, or both are the same, the order does not matter.)
    if (roots_are_x) {
        p->rooted       = g.send;
        p->leaf         = g.recv;
        p->rooted_first = g.send_first;
    } else {
        p->rooted       = g.recv;
        p->leaf         = g.send;
        p->rooted_first = !g.send_first;
    }
    p->same      = g.same;
    p->dt        = dt;
    p->mpi_dt    = ddl__mpi_dtype(dt);
    p->n         = ddl_shape_numel(shape);
    p->max_count = ddl__mpi_max_count();
    ddl_shape z  = ddl__zero_shape(shape);
    p->root_shape = p->rooted.member ? *shape : z;
    p->leaf_shape = p->leaf.member ? *shape : z;
    p->name       = name;
    p->kind       = roots_are_x ? DDL_TRAFFIC_BROADCAST : DDL_TRAFFIC_SUM_REDUCE;
    return DDL_OK;
}

void ddl__bcast_reduce_free(ddl__bcast_reduce *p)
{
    ddl_group_pair_free(&p->pair);
    p->rooted.comm = MPI_COMM_NULL;
    p->leaf.comm   = MPI_COMM_NULL;
}

// Both executors check their tensors, then take two steps in root order: the step on
// the group this rank roots, and the step on the group it is a leaf of (skipped when
// that is the same group: one collective serves both roles).
static ddl_status check_pair(const ddl__bcast_reduce *p, const char *op, const ddl_tensor_t *in,
                             const ddl_shape *in_shape, const ddl_tensor_t *out,
                             const ddl_shape *out_shape)
{
    DDL_CHECK(ddl__check_tensor(op, "input", in, p->dt, in_shape));
    DDL_CHECK(ddl__check_tensor(op, "output", out, p->dt, out_shape));
    // In place is allowed only where it is meaningful: a rank that is root and leaf of
    // one group, whose input and output are the same block (as MPI_Bcast / MPI_Reduce
    // with MPI_IN_PLACE); anywhere else the two roles need two buffers.
    DDL_REQUIRE(ddl_tensor_numel(in) == 0 || ddl_tensor_numel(out) == 0 || in->data != out->data ||
                    p->same,
                DDL_EINVAL,
                "%s: input and output share memory, which is allowed only on a rank that is "
                "source and destination of one group",
                op);
    return DDL_OK;
}

// Traffic of one fan-out or fan-in (primitives/traffic.c): the root exchanges the tensor
// with each of the other g-1 members of the group it roots, a leaf that is not that root
// exchanges it once with its own root. Fan-out is Broadcast's forward and SumReduce's
// adjoint; fan-in the other way round.
static void count_traffic(const ddl__bcast_reduce *p, bool fan_out, size_t bytes)
{
    uint64_t to_leaves = 0, to_root = 0;
    if (p->rooted.member && p->rooted.comm != MPI_COMM_NULL) {
        to_leaves = (uint64_t)(p->rooted.size - 1) * bytes;
    }
    if (p->leaf.member && !p->same) {
        to_root = bytes;
    }
    ddl_traffic_pass pass =
        fan_out == (p->kind == DDL_TRAFFIC_BROADCAST) ? DDL_TRAFFIC_FORWARD : DDL_TRAFFIC_ADJOINT;
    if (fan_out) {
        ddl__traffic_add((ddl_traffic_kind)p->kind, pass, to_leaves, to_root);
    } else {
        ddl__traffic_add((ddl_traffic_kind)p->kind, pass, to_root, to_leaves);
    }
}

// Fan-out. Per group: the root's tensor reaches every leaf (MPI_Bcast from comm rank
// 0). A root that is its own leaf copies first and broadcasts the copy, so `in` is
// never written.
ddl_status ddl__bcast_reduce_bcast(const ddl__bcast_reduce *p, const ddl_tensor_t *in,
                                   ddl_tensor_t *out, const char *op)
{
    DDL_CHECK(check_pair(p, op, in, &p->root_shape, out, &p->leaf_shape));
    size_t bytes = (size_t)p->n * ddl_dtype_size(p->dt);
    count_traffic(p, true, bytes);
    for (int step = 0; step < 2; step++) {
        bool rooted_step = (step == 0) == p->rooted_first;
        if (rooted_step && p->rooted.member) {
            if (p->same) {
                // I am my own destination: keep a copy (unless in place), then send it on.
                if (bytes > 0 && out->data != in->data) {
                    memcpy(out->data, in->data, bytes);
                }
                if (p->rooted.comm != MPI_COMM_NULL) {
                    DDL_CHECK(bcast_chunks(p, out->data, p->rooted.comm));
                }
            } else if (p->rooted.comm != MPI_COMM_NULL) {
                // The root's buffer is only read by MPI_Bcast.
                DDL_CHECK(bcast_chunks(p, in->data, p->rooted.comm));
            }
        } else if (!rooted_step && p->leaf.member && !p->same) {
            // A leaf that is not the root is in a group of at least two.
            DDL_ASSERT(p->leaf.comm != MPI_COMM_NULL);
            DDL_CHECK(bcast_chunks(p, out->data, p->leaf.comm));
        }
    }
    return DDL_OK;
}

// Fan-in. Per group: the leaves' tensors are summed onto the root (MPI_Reduce, SUM,
// to comm rank 0). The exact adjoint of the fan-out on the same plan: a root that is
// also a leaf contributes its own term; one that is not contributes zeros.
ddl_status ddl__bcast_reduce_sum(const ddl__bcast_reduce *p, const ddl_tensor_t *in,
                                 ddl_tensor_t *out, const char *op)
{
    DDL_CHECK(check_pair(p, op, in, &p->leaf_shape, out, &p->root_shape));
    size_t bytes = (size_t)p->n * ddl_dtype_size(p->dt);
    count_traffic(p, false, bytes);
    for (int step = 0; step < 2; step++) {
        bool rooted_step = (step == 0) == p->rooted_first;
        if (rooted_step && p->rooted.member) {
            if (p->same) {
                // My own contribution is part of the sum (in place when in == out).
                if (p->rooted.comm != MPI_COMM_NULL) {
                    DDL_CHECK(reduce_chunks(p, in->data == out->data ? MPI_IN_PLACE : in->data,
                                            out->data, p->rooted.comm));
                } else if (bytes > 0 && out->data != in->data) {
                    memcpy(out->data, in->data, bytes);
                }
            } else {
                // A root that is not one of its leaves adds zeros (in place).
                ddl_tensor_zero(out);
                if (p->rooted.comm != MPI_COMM_NULL) {
                    DDL_CHECK(reduce_chunks(p, MPI_IN_PLACE, out->data, p->rooted.comm));
                }
            }
        } else if (!rooted_step && p->leaf.member && !p->same) {
            DDL_ASSERT(p->leaf.comm != MPI_COMM_NULL);
            DDL_CHECK(reduce_chunks(p, in->data, NULL, p->leaf.comm));
        }
    }
    return DDL_OK;
}

// ---- Broadcast -------------------------------------------------------------

// Collective over P_x ∪ P_y (group communicators); other ranks return a plan that
// does nothing. EINVAL on every rank alike for a bad shape, dtype or partition pair.
ddl_status ddl_broadcast_create(const ddl_partition_t *P_x, const ddl_partition_t *P_y,
                                bool transpose_src, bool transpose_dest, ddl_dtype dt,
                                const ddl_shape *shape, ddl_broadcast_t **out)
{
    DDL_REQUIRE(out != NULL, DDL_EINVAL, "broadcast: out is NULL");
    // Without the plan's memory this rank still joins the members' agreement (in the
    // group building), so they all fail with it.
    ddl_broadcast_t  *b = ddl_calloc(1, sizeof *b);
    ddl__bcast_reduce none;
    ddl_status        local =
        b != NULL ? DDL_OK : ddl_set_error(DDL_ENOMEM, "broadcast: out of memory for the plan");
    ddl_status st = ddl__bcast_reduce_init(b != NULL ? &b->br : &none, "broadcast", P_x, P_y,
                                           transpose_src, transpose_dest, dt, shape, true, local);
    if (st == DDL_OK && b == NULL) {
        ddl__bcast_reduce_free(&none); // not reached: the members agreed on the failure
        st = local;
    }
    if (st != DDL_OK) {
        ddl_free(b);
        return st;
    }
    *out = b;
    return DDL_OK;
}

// Releases the group communicators (MPI_Comm_free, which does not wait for the other
// members); NULL-safe; sets *b to NULL.
void ddl_broadcast_destroy(ddl_broadcast_t **b)
{
    if (b == NULL || *b == NULL) {
        return;
    }
    ddl__bcast_reduce_free(&(*b)->br);
    ddl_free(*b);
    *b = NULL;
}

// x lives on the roots (P_x), y on the leaves (P_y).
ddl_shape ddl_broadcast_x_shape(const ddl_broadcast_t *b)
{
    return b->br.root_shape;
}

ddl_shape ddl_broadcast_y_shape(const ddl_broadcast_t *b)
{
    return b->br.leaf_shape;
}

// y = B x: fan-out from the sources. x and y must not share memory.
ddl_status ddl_broadcast_forward(const ddl_broadcast_t *b, const ddl_tensor_t *x, ddl_tensor_t *y)
{
    DDL_REQUIRE(b != NULL, DDL_EINVAL, "broadcast forward: plan is NULL");
    DDL_TRAFFIC_TIMED_RETURN(DDL_TRAFFIC_BROADCAST, DDL_TRAFFIC_FORWARD,
                             ddl__bcast_reduce_bcast(&b->br, x, y, "broadcast forward"));
}

bool ddl_broadcast_in_place_ok(const ddl_broadcast_t *b)
{
    return b != NULL && b->br.same;
}

// dx = B* dy: fan-in onto the sources (zero on a source with no destinations).
ddl_status ddl_broadcast_adjoint(const ddl_broadcast_t *b, const ddl_tensor_t *dy,
                                 ddl_tensor_t *dx)
{
    DDL_REQUIRE(b != NULL, DDL_EINVAL, "broadcast adjoint: plan is NULL");
    DDL_TRAFFIC_TIMED_RETURN(DDL_TRAFFIC_BROADCAST, DDL_TRAFFIC_ADJOINT,
                             ddl__bcast_reduce_sum(&b->br, dy, dx, "broadcast adjoint"));
}
