// partition/partition.c: Cartesian partitions and the broadcast/reduction groups.
//
// Every rank stores the full rank list and shape of every partition, so colours,
// coordinates and groups are computed locally and identically everywhere: the only
// MPI calls are MPI_Comm_create_group over the members of each new communicator.
#include <limits.h>
#include <string.h>

#include "ddl/agree.h"
#include "ddl/base.h"
#include "ddl/decomp.h"
#include "ddl/partition.h"
#include "partition/group_internal.h"
#include "partition/mpi_check.h"

struct ddl_partition {
    MPI_Comm base;
    int      base_rank;
    int      base_size;
    int      ndim;
    int      shape[DDL_MAX_DIMS];
    int      nranks;
    int     *ranks;     // base ranks, in partition order
    int      position;  // my position in ranks, -1 if inactive
    int      index[DDL_MAX_DIMS];
    MPI_Comm comm;      // over the members, MPI_COMM_NULL if inactive
};

// Creates a communicator over `ranks` (base ranks, in order) if this rank is listed;
// collective over those ranks only. tag distinguishes concurrent creations.
static ddl_status comm_create(MPI_Comm base, int n, const int *ranks, int tag, MPI_Comm *out)
{
    *out = MPI_COMM_NULL;
    MPI_Group world, sub;
    DDL_CHECK_MPI(MPI_Comm_group(base, &world));
    int rc = MPI_Group_incl(world, n, ranks, &sub);
    MPI_Group_free(&world);
    DDL_CHECK_MPI(rc);
    rc = MPI_Comm_create_group(base, sub, tag, out);
    MPI_Group_free(&sub);
    DDL_CHECK_MPI(rc);
    DDL_CHECK_MPI(MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN));
    return DDL_OK;
}

ddl_status ddl_partition_create(MPI_Comm base, int nranks, const int *ranks, int ndim,
                                const int *shape, ddl_partition_t **out)
{
    int base_size, base_rank;
    DDL_CHECK_MPI(MPI_Comm_size(base, &base_size));
    DDL_CHECK_MPI(MPI_Comm_rank(base, &base_rank));
    DDL_REQUIRE(ndim >= 1 && ndim <= DDL_MAX_DIMS, DDL_EINVAL,
                "partition: ndim %d outside [1, %d]", ndim, DDL_MAX_DIMS);
    DDL_REQUIRE(nranks >= 1, DDL_EINVAL, "partition: needs at least one rank (got %d)", nranks);
    int64_t prod = 1;
    for (int i = 0; i < ndim; i++) {
        DDL_REQUIRE(shape[i] >= 1, DDL_EINVAL, "partition: shape[%d] = %d must be >= 1", i,
                    shape[i]);
        prod *= shape[i];
    }
    DDL_REQUIRE(prod == nranks, DDL_EINVAL,
                "partition: shape multiplies to %lld but %d ranks are listed", (long long)prod,
                nranks);
    for (int i = 0; i < nranks; i++) {
        DDL_REQUIRE(ranks[i] >= 0 && ranks[i] < base_size, DDL_EINVAL,
                    "partition: rank %d is outside the world of %d ranks", ranks[i], base_size);
        for (int j = 0; j < i; j++) {
            DDL_REQUIRE(ranks[i] != ranks[j], DDL_EINVAL, "partition: rank %d is listed twice",
                        ranks[i]);
        }
    }

    ddl_partition_t *P = ddl_calloc(1, sizeof *P);
    int             *r = ddl_malloc(sizeof(int) * (size_t)nranks);
    if (P == NULL || r == NULL) {
        ddl_free(P);
        ddl_free(r);
        ddl_status st = ddl_set_error(DDL_ENOMEM, "partition: out of memory");
        // A member still joins the group creation and the members' agreement, so the
        // other members fail with it instead of waiting in MPI_Comm_create_group.
        for (int i = 0; i < nranks; i++) {
            if (ranks[i] == base_rank) {
                MPI_Comm tmp;
                if (comm_create(base, nranks, ranks, 0, &tmp) == DDL_OK) {
                    st = ddl_agree(tmp, st);
                    MPI_Comm_free(&tmp);
                }
                break;
            }
        }
        return st;
    }
    memcpy(r, ranks, sizeof(int) * (size_t)nranks);
    P->base      = base;
    P->base_rank = base_rank;
    P->base_size = base_size;
    P->ndim      = ndim;
    memcpy(P->shape, shape, sizeof(int) * (size_t)ndim);
    P->nranks   = nranks;
    P->ranks    = r;
    P->position = -1;
    P->comm     = MPI_COMM_NULL;
    for (int i = 0; i < nranks; i++) {
        if (r[i] == base_rank) {
            P->position = i;
        }
    }
    if (P->position >= 0) {
        ddl_index_unravel(ndim, shape, P->position, P->index);
        ddl_status st = comm_create(base, nranks, r, 0, &P->comm);
        if (st == DDL_OK) {
            // The members agree, so a member that failed above fails them all.
            st = ddl_agree(P->comm, st);
        }
        if (st != DDL_OK) {
            ddl_partition_destroy(&P);
            return st;
        }
    }
    *out = P;
    return DDL_OK;
}

// ---- agreement over a union of partitions ----------------------------------------

ddl_status ddl_partition_union_comm(const ddl_partition_t *P, const ddl_partition_t *Q,
                                    const ddl_partition_t *R, MPI_Comm *out)
{
    *out                             = MPI_COMM_NULL;
    const ddl_partition_t *parts[3] = {P, Q, R};
    bool                   member   = false;
    for (int k = 0; k < 3; k++) {
        member = member || (parts[k] != NULL && parts[k]->position >= 0);
    }
    if (!member) {
        return DDL_OK;
    }
    // The union as an MPI group (P's ranks, then Q's others, then R's others): MPI's
    // memory, not ours, so this works right after one of our allocations failed.
    MPI_Group world, acc = MPI_GROUP_EMPTY;
    DDL_CHECK_MPI(MPI_Comm_group(P->base, &world));
    for (int k = 0; k < 3; k++) {
        if (parts[k] == NULL) {
            continue;
        }
        MPI_Group g, u;
        MPI_Group_incl(world, parts[k]->nranks, parts[k]->ranks, &g);
        MPI_Group_union(acc, g, &u);
        MPI_Group_free(&g);
        if (acc != MPI_GROUP_EMPTY) {
            MPI_Group_free(&acc);
        }
        acc = u;
    }
    int rc = MPI_Comm_create_group(P->base, acc, 0, out);
    MPI_Group_free(&acc);
    MPI_Group_free(&world);
    DDL_CHECK_MPI(rc);
    DDL_CHECK_MPI(MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN));
    return DDL_OK;
}

ddl_status ddl_partition_agree_union(const ddl_partition_t *P, const ddl_partition_t *Q,
                                     const ddl_partition_t *R, ddl_status st)
{
    MPI_Comm   U;
    ddl_status cst = ddl_partition_union_comm(P, Q, R, &U);
    if (cst != DDL_OK) {
        return st != DDL_OK ? st : cst;
    }
    st = ddl_agree(U, st);
    if (U != MPI_COMM_NULL) {
        MPI_Comm_free(&U);
    }
    return st;
}

ddl_status ddl_partition_union(const ddl_partition_t *P, const ddl_partition_t *Q,
                               ddl_partition_t **out)
{
    DDL_REQUIRE(P->base == Q->base, DDL_EINVAL, "partition union: different base communicators");
    int *r = ddl_malloc(sizeof(int) * (size_t)(P->nranks + Q->nranks));
    if (r == NULL) {
        ddl_status st = ddl_set_error(DDL_ENOMEM, "partition union: out of memory");
        if (ddl_partition_position(P, P->base_rank) < 0 &&
            ddl_partition_position(Q, Q->base_rank) < 0) {
            return st;
        }
        // A member of the union joins its creation (built from MPI groups, which need no
        // memory of ours; MPI_Group_union keeps P's ranks first, then Q's others) and the
        // members' agreement, so they all fail with it.
        MPI_Group world, gp, gq, gu;
        MPI_Comm  tmp = MPI_COMM_NULL;
        if (MPI_Comm_group(P->base, &world) == MPI_SUCCESS) {
            MPI_Group_incl(world, P->nranks, P->ranks, &gp);
            MPI_Group_incl(world, Q->nranks, Q->ranks, &gq);
            MPI_Group_union(gp, gq, &gu);
            if (MPI_Comm_create_group(P->base, gu, 0, &tmp) == MPI_SUCCESS) {
                st = ddl_agree(tmp, st);
                MPI_Comm_free(&tmp);
            }
            MPI_Group_free(&gu);
            MPI_Group_free(&gq);
            MPI_Group_free(&gp);
            MPI_Group_free(&world);
        }
        return st;
    }
    int n = 0;
    for (int i = 0; i < P->nranks; i++) {
        r[n++] = P->ranks[i];
    }
    for (int i = 0; i < Q->nranks; i++) {
        if (ddl_partition_position(P, Q->ranks[i]) < 0) {
            r[n++] = Q->ranks[i];
        }
    }
    int        shape[1] = {n};
    ddl_status st       = ddl_partition_create(P->base, n, r, 1, shape, out);
    ddl_free(r);
    return st;
}

void ddl_partition_destroy(ddl_partition_t **P)
{
    if (P == NULL || *P == NULL) {
        return;
    }
    if ((*P)->comm != MPI_COMM_NULL) {
        MPI_Comm_free(&(*P)->comm);
    }
    ddl_free((*P)->ranks);
    ddl_free(*P);
    *P = NULL;
}

bool ddl_partition_active(const ddl_partition_t *P)
{
    return P->position >= 0;
}

int ddl_partition_ndim(const ddl_partition_t *P)
{
    return P->ndim;
}

const int *ddl_partition_shape(const ddl_partition_t *P)
{
    return P->shape;
}

const int *ddl_partition_index(const ddl_partition_t *P)
{
    return P->position >= 0 ? P->index : NULL;
}

int ddl_partition_size(const ddl_partition_t *P)
{
    return P->nranks;
}

int ddl_partition_rank(const ddl_partition_t *P)
{
    return P->position;
}

const int *ddl_partition_ranks(const ddl_partition_t *P)
{
    return P->ranks;
}

int ddl_partition_position(const ddl_partition_t *P, int r)
{
    for (int i = 0; i < P->nranks; i++) {
        if (P->ranks[i] == r) {
            return i;
        }
    }
    return -1;
}

MPI_Comm ddl_partition_comm(const ddl_partition_t *P)
{
    return P->comm;
}

MPI_Comm ddl_partition_base(const ddl_partition_t *P)
{
    return P->base;
}

int ddl_partition_base_rank(const ddl_partition_t *P)
{
    return P->base_rank;
}

int ddl_partition_rank_at(const ddl_partition_t *P, const int *coord)
{
    return P->ranks[ddl_index_ravel(P->ndim, P->shape, coord)];
}

bool ddl_partition_equal(const ddl_partition_t *P, const ddl_partition_t *Q)
{
    if (P == Q) {
        return true;
    }
    if (P->base != Q->base || P->ndim != Q->ndim || P->nranks != Q->nranks) {
        return false;
    }
    return memcmp(P->shape, Q->shape, sizeof(int) * (size_t)P->ndim) == 0 &&
           memcmp(P->ranks, Q->ranks, sizeof(int) * (size_t)P->nranks) == 0;
}

ddl_box ddl_partition_local_box(const ddl_partition_t *P, const ddl_shape *global)
{
    if (P->position < 0 || global->ndim != P->ndim) {
        ddl_box b = {.ndim = global->ndim};
        return b;
    }
    return ddl_decomp_box(global, P->shape, P->index);
}

ddl_shape ddl_partition_local_shape(const ddl_partition_t *P, const ddl_shape *global)
{
    ddl_box b = ddl_partition_local_box(P, global);
    return ddl_box_shape(&b);
}

// ---- cross-partition groups ------------------------------------------------

// Row-major (C) and column-major (F) flat index over the masked dimensions.
static int64_t flat_index(int n, const int *shape, const int *idx, const bool *mask, bool f_order)
{
    int64_t f = 0;
    if (f_order) {
        for (int i = n - 1; i >= 0; i--) {
            if (mask[i]) {
                f = f * shape[i] + idx[i];
            }
        }
    } else {
        for (int i = 0; i < n; i++) {
            if (mask[i]) {
                f = f * shape[i] + idx[i];
            }
        }
    }
    return f;
}

static void reverse_ints(int n, int *a)
{
    for (int i = 0; i < n / 2; i++) {
        int t        = a[i];
        a[i]         = a[n - 1 - i];
        a[n - 1 - i] = t;
    }
}

// The colour of every member of the wide partition (the one whose coordinate is used
// as is, possibly reversed) and of the narrow one (left-padded with ones).
typedef struct colouring {
    int64_t *wide;    // per member of the wide partition
    int64_t *narrow;  // per member of the narrow partition
} colouring;

// W is the wide partition (its coordinates are used as they are, or reversed), Nn the
// narrow one (left-padded with ones). DistDL places a narrow coordinate in two ways:
// a broadcast source reverses its coordinate and puts it at the right end; a reduction
// destination with transpose_dest puts it at the left end and reverses the whole
// padded index. Colours are C-order flat indices over the matching dimensions, or
// F-order on a transposed side (DistDL's cartesian_index_c / _f).
static ddl_status compute_colours(const ddl_partition_t *W, bool tw, const ddl_partition_t *Nn,
                                  bool tn, bool is_reduce, const char *what, colouring *c)
{
    int n = W->ndim, m = Nn->ndim;
    DDL_REQUIRE(m <= n, DDL_EINVAL,
                "%s: the %s partition has %d dims, more than the %s partition's %d", what,
                is_reduce ? "destination" : "source", m, is_reduce ? "source" : "destination", n);
    int wshape[DDL_MAX_DIMS], nshape[DDL_MAX_DIMS];
    memcpy(wshape, W->shape, sizeof(int) * (size_t)n);
    if (tw) {
        reverse_ints(n, wshape);
    }
    int nraw[DDL_MAX_DIMS];
    memcpy(nraw, Nn->shape, sizeof(int) * (size_t)m);
    if (tn) {
        reverse_ints(m, nraw);
    }
    for (int i = 0; i < n; i++) {
        nshape[i] = (i < n - m) ? 1 : nraw[i - (n - m)];
    }
    bool match[DDL_MAX_DIMS];
    for (int i = 0; i < n; i++) {
        DDL_REQUIRE(nshape[i] == wshape[i] || nshape[i] == 1, DDL_EINVAL,
                    "%s: partition dimension %d does not fit: the %s side has %d, the %s side %d "
                    "(must be equal, or 1 on the %s side)",
                    what, i, is_reduce ? "destination" : "source", nshape[i],
                    is_reduce ? "source" : "destination", wshape[i],
                    is_reduce ? "destination" : "source");
        match[i] = nshape[i] == wshape[i];
    }
    c->wide   = ddl_malloc(sizeof(int64_t) * (size_t)W->nranks);
    c->narrow = ddl_malloc(sizeof(int64_t) * (size_t)Nn->nranks);
    if (c->wide == NULL || c->narrow == NULL) {
        ddl_free(c->wide);
        ddl_free(c->narrow);
        return ddl_set_error(DDL_ENOMEM, "%s: out of memory", what);
    }
    for (int j = 0; j < W->nranks; j++) {
        int idx[DDL_MAX_DIMS];
        ddl_index_unravel(n, W->shape, j, idx);
        if (tw) {
            reverse_ints(n, idx);
        }
        c->wide[j] = flat_index(n, wshape, idx, match, tw);
    }
    for (int j = 0; j < Nn->nranks; j++) {
        int coord[DDL_MAX_DIMS], idx[DDL_MAX_DIMS] = {0};
        ddl_index_unravel(m, Nn->shape, j, coord);
        if (is_reduce && tn) {
            // DistDL: idx[:m] = c, then reverse the whole padded index.
            memcpy(idx, coord, sizeof(int) * (size_t)m);
            reverse_ints(n, idx);
        } else {
            if (tn) {
                reverse_ints(m, coord);
            }
            memcpy(idx + (n - m), coord, sizeof(int) * (size_t)m);
        }
        c->narrow[j] = flat_index(n, nshape, idx, match, tn);
    }
    return DDL_OK;
}

// Lists the members of the group of colour `col` rooted at `root` into mem: the root
// first, then the leaves of that colour in the union order (R's ranks, then L's ranks
// not in R). Returns the count.
static int group_members(const ddl_partition_t *R, const ddl_partition_t *L, const int64_t *lcol,
                         int64_t col, int root, int *mem)
{
    int n    = 0;
    mem[n++] = root;
    for (int j = 0; j < R->nranks; j++) {
        int lp = ddl_partition_position(L, R->ranks[j]);
        if (lp >= 0 && lcol[lp] == col && R->ranks[j] != root) {
            mem[n++] = R->ranks[j];
        }
    }
    for (int j = 0; j < L->nranks; j++) {
        if (lcol[j] == col && L->ranks[j] != root && ddl_partition_position(R, L->ranks[j]) < 0) {
            mem[n++] = L->ranks[j];
        }
    }
    return n;
}

// Builds this rank's groups. `R` holds the roots (one per colour), `L` the leaves.
static ddl_status build_groups(const ddl_partition_t *R, const int64_t *rcol,
                               const ddl_partition_t *L, const int64_t *lcol, bool rooted_is_send,
                               const char *what, ddl_status local, ddl_group_pair *out)
{
    int       me     = R->base_rank;
    ddl_group rooted = {.member = false, .root = -1, .size = 0, .comm = MPI_COMM_NULL};
    ddl_group leaf   = rooted;
    int64_t   col[2] = {-1, -1};  // colour of the group I root, and of the one I am a leaf of
    int       rpos = ddl_partition_position(R, me), lpos = ddl_partition_position(L, me);
    if (rpos >= 0) {
        rooted.member = true;
        rooted.root   = me;
        col[0]        = rcol[rpos];
    }
    if (lpos >= 0) {
        col[1] = lcol[lpos];
        for (int j = 0; j < R->nranks && leaf.root < 0; j++) {
            if (rcol[j] == col[1]) {
                leaf.member = true;
                leaf.root   = R->ranks[j];
            }
        }
        DDL_REQUIRE(leaf.member, DDL_EINTERNAL, "%s: no root for colour %lld", what,
                    (long long)col[1]);
    }
    int       *mem = ddl_malloc(sizeof(int) * (size_t)(L->nranks + 1));
    ddl_status ast = local;
    if (ast == DDL_OK && mem == NULL) {
        ast = ddl_set_error(DDL_ENOMEM, "%s: out of memory", what);
    }
    // The members agree before creating any communicator, so that one member's local
    // failure (here or in the colouring) fails them all instead of leaving them waiting.
    ast = ddl_partition_agree_union(R, L, NULL, ast);
    if (ast != DDL_OK) {
        ddl_free(mem);
        return ast;
    }
    bool same = rooted.member && leaf.member && rooted.root == leaf.root;
    // Create communicators in increasing order of root rank, so that no cycle of
    // MPI_Comm_create_group calls can form (DistDL issue 87).
    ddl_group *order[2] = {&rooted, &leaf};
    int        ocol[2]  = {0, 1};
    if (leaf.member && rooted.member && leaf.root < rooted.root) {
        order[0] = &leaf;
        order[1] = &rooted;
        ocol[0]  = 1;
        ocol[1]  = 0;
    }
    ddl_status st = DDL_OK;
    for (int k = 0; k < 2 && st == DDL_OK; k++) {
        ddl_group *g = order[k];
        if (!g->member || (same && g == &leaf)) {
            continue;
        }
        g->size = group_members(R, L, lcol, col[ocol[k]], g->root, mem);
        if (g->size > 1) {
            st = comm_create(R->base, g->size, mem, g->root, &g->comm);
        }
    }
    ddl_free(mem);
    if (same) {
        leaf.size = rooted.size;
        leaf.comm = rooted.comm;
    }
    if (st != DDL_OK) {
        if (rooted.comm != MPI_COMM_NULL) {
            MPI_Comm_free(&rooted.comm);
        }
        if (!same && leaf.comm != MPI_COMM_NULL) {
            MPI_Comm_free(&leaf.comm);
        }
        return st;
    }
    out->send       = rooted_is_send ? rooted : leaf;
    out->recv       = rooted_is_send ? leaf : rooted;
    out->same       = same;
    out->send_first = !(out->send.member && out->recv.member && out->recv.root < out->send.root);
    return DDL_OK;
}

ddl_status ddl__group_pair_broadcast(const ddl_partition_t *P_src, const ddl_partition_t *P_dest,
                                     bool transpose_src, bool transpose_dest, ddl_status local,
                                     ddl_group_pair *out)
{
    DDL_REQUIRE(P_src->base == P_dest->base, DDL_EINVAL,
                "broadcast: partitions over different base communicators");
    colouring c;
    // For a broadcast the destination is the wide side, the source the narrow side.
    ddl_status cst = compute_colours(P_dest, transpose_dest, P_src, transpose_src, false,
                                     "broadcast", &c);
    if (cst == DDL_ENOMEM) {
        // A local failure: join the agreement the other members reach in build_groups.
        return ddl_partition_agree_union(P_src, P_dest, NULL, cst);
    }
    DDL_CHECK(cst); // the rules: the same verdict on every rank
    ddl_status st = build_groups(P_src, c.narrow, P_dest, c.wide, true, "broadcast", local, out);
    ddl_free(c.wide);
    ddl_free(c.narrow);
    return st;
}

ddl_status ddl__group_pair_reduce(const ddl_partition_t *P_src, const ddl_partition_t *P_dest,
                                  bool transpose_src, bool transpose_dest, ddl_status local,
                                  ddl_group_pair *out)
{
    DDL_REQUIRE(P_src->base == P_dest->base, DDL_EINVAL,
                "sum_reduce: partitions over different base communicators");
    colouring c;
    // For a reduction the source is the wide side, the destination the narrow side.
    ddl_status cst = compute_colours(P_src, transpose_src, P_dest, transpose_dest, true,
                                     "sum_reduce", &c);
    if (cst == DDL_ENOMEM) {
        // A local failure: join the agreement the other members reach in build_groups.
        return ddl_partition_agree_union(P_dest, P_src, NULL, cst);
    }
    DDL_CHECK(cst); // the rules: the same verdict on every rank
    ddl_status st = build_groups(P_dest, c.narrow, P_src, c.wide, false, "sum_reduce", local, out);
    ddl_free(c.wide);
    ddl_free(c.narrow);
    return st;
}

ddl_status ddl_group_pair_broadcast(const ddl_partition_t *P_src, const ddl_partition_t *P_dest,
                                    bool transpose_src, bool transpose_dest, ddl_group_pair *out)
{
    return ddl__group_pair_broadcast(P_src, P_dest, transpose_src, transpose_dest, DDL_OK, out);
}

ddl_status ddl_group_pair_reduce(const ddl_partition_t *P_src, const ddl_partition_t *P_dest,
                                 bool transpose_src, bool transpose_dest, ddl_group_pair *out)
{
    return ddl__group_pair_reduce(P_src, P_dest, transpose_src, transpose_dest, DDL_OK, out);
}

void ddl_group_pair_free(ddl_group_pair *g)
{
    if (g == NULL) {
        return;
    }
    if (g->send.comm != MPI_COMM_NULL) {
        MPI_Comm_free(&g->send.comm);
    }
    if (!g->same && g->recv.comm != MPI_COMM_NULL) {
        MPI_Comm_free(&g->recv.comm);
    }
    g->send.comm = MPI_COMM_NULL;
    g->recv.comm = MPI_COMM_NULL;
}
