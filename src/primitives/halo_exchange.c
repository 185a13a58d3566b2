// primitives/halo_exchange.c: HaloExchange, DistDL's in-place ghost exchange for
// sliding-window operators (convolution, pooling), with its exact adjoint.
//
// Each active rank owns a padded buffer B of shape ddl_halo_exchange_shape, laid out per
// dimension d as [ghost_lo | pad_lo | bulk | pad_hi | ghost_hi] (ddl_halo_dim). The
// exchange is the product of one operator per dimension,
//
//   H = H_{D-1} ... H_1 H_0,     H_i: ghosts of dim i <- neighbours' bulk along dim i,
//
// where H_i overwrites the two ghost slabs of dim i and leaves every other entry alone.
// The slabs of step i follow DistDL's _assemble_slices: the full buffer extent in the
// dimensions j < i (already exchanged, so corners travel with the faces and no diagonal
// neighbour is ever needed), the non-ghost extent [ghost_lo, buf - ghost_hi) in the
// dimensions j > i, and in dimension i
//
//   left bulk  (sent left)       [ghost_lo, ghost_lo + send_lo)
//   left ghost (from the left)   [0, ghost_lo)
//   right bulk (sent right)      [buf - ghost_hi - send_hi, buf - ghost_hi)
//   right ghost (from the right) [buf - ghost_hi, buf)
//
// Only boundary pieces hold global padding, and they have no neighbour on that side,
// so a "bulk" slab never contains padding in the dimension being exchanged (it may in
// the other dimensions, where it carries the zeros of the padded global tensor).
//
// Adjoint: with ghosts G and sources S disjoint, H_i is y = x off G, y[G] = A x[S], so
// H_i* is x = y off G, x[G] = 0, x[S] += A^T y[G]: the ghosts are sent back, zeroed, and
// added into the neighbours' bulk. H* = H_0* H_1* ... H_{D-1}*, i.e. dims in reverse.
// The inner product is the sum of the local dots over whole buffers (pads included).
//
// Everything is computed in _create. Each slab travels one of three ways, chosen once:
//   direct  the slab is one contiguous run of B: MPI reads or writes B in place;
//   typed   strided with long runs: an MPI derived datatype over B, so MPI's own
//           packing into its transport replaces a copy of ours;
//   staged  strided with short runs (e.g. a column halo): copied through one of four
//           plan-owned buffers (DistDL's lbb, lgb, rbb, rgb) by the tight loops below.
// The adjoint always receives into a staging buffer, since it adds what it receives.
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "ddl/base.h"
#include "ddl/primitives.h"
#include "partition/mpi_check.h"
#include "primitives/traffic.h"

// Tags: one per (direction, dimension), distinct for forward and adjoint so a message of
// one operation can never match a receive of the other on the shared communicator.
#define HALO_TAG_BASE 0x4841  // "HA"
#define HALO_TAG(adjoint, to_hi, dim) \
    (HALO_TAG_BASE + ((adjoint) ? 4 * DDL_MAX_DIMS : 0) + 2 * (dim) + ((to_hi) ? 1 : 0))

// A strided slab whose contiguous runs are at least this many bytes goes to MPI as a
// derived datatype; shorter runs are cheaper to pack ourselves. Measured with Open MPI
// 4.1 over shared memory (2 ranks, 33-270 KB slabs): row slabs sent typed cost 1.05-1.10x
// a raw MPI_Sendrecv of the same bytes, packed 1.2-1.5x (two extra copies); a column
// slab (runs of one element) sent typed costs 2.5x what packing it here costs, as the
// datatype engine pays per block.
#define HALO_TYPED_MIN_RUN_BYTES 256

// The four slab buffers, indexed like DistDL's (lbb, lgb, rbb, rgb).
enum { SLOT_BULK_LO = 0, SLOT_GHOST_LO, SLOT_BULK_HI, SLOT_GHOST_HI, NSLOTS };

typedef enum { XFER_DIRECT, XFER_TYPED, XFER_STAGED } xfer_mode;

// One slab of the local buffer, as a box and as a collapsed strided walk: dims of extent
// 1 dropped and neighbours merged when the inner one is full, so the walk has the fewest
// dims (a slab of whole rows is a single run). The slab element at collapsed coordinate
// c (row-major over ext, which is also its order in a packed buffer) is
// B[off + sum_d c_d * str[d]].
typedef struct halo_region {
    ddl_box      box;                // in buffer coordinates
    int          count;              // elements; 0 means nothing is posted
    int64_t      off;                // element offset of the first element in B
    int          nd;                 // collapsed dims, innermost last (>= 1 if count > 0)
    int64_t      ext[DDL_MAX_DIMS];  // extents of the collapsed dims
    int64_t      str[DDL_MAX_DIMS];  // their strides in B (elements)
    xfer_mode    mode;
    MPI_Datatype type;               // XFER_TYPED: the slab relative to B + off
} halo_region;

// The exchange along one dimension.
typedef struct halo_step {
    int         dim;
    int         lo, hi;  // neighbours' ranks in the partition comm (or MPI_PROC_NULL)
    halo_region slab[NSLOTS];
} halo_step;

// What to do with a slab once its request completes: copy a staged ghost in (forward),
// add a received contribution (adjoint), or zero a ghost MPI has finished reading
// (adjoint, direct or typed). Sends of staged data need nothing.
typedef enum { AFTER_NONE, AFTER_UNPACK, AFTER_ADD, AFTER_ZERO } after_op;

// The requests of one step and their completion actions.
typedef struct step_reqs {
    int                n, left; // requests posted; not yet completed
    MPI_Request        req[NSLOTS];
    const halo_region *slab[NSLOTS];
    void              *stage[NSLOTS];
    after_op           after[NSLOTS];
} step_reqs;

struct ddl_halo_exchange {
    bool         active;
    int          ndim;
    ddl_dtype    dt;
    size_t       esize;
    MPI_Datatype mpi_type;
    MPI_Comm     comm;               // the partition's communicator (borrowed)
    ddl_shape    shape;              // padded buffer shape (all zeros when inactive)
    ddl_box      bulk, needed;
    ddl_halo_dim dims[DDL_MAX_DIMS];
    int          nsteps;             // steps with anything to move, in dimension order
    halo_step    steps[DDL_MAX_DIMS];
    void        *arena;              // one allocation holding the four slot buffers
    void        *slot[NSLOTS];
    // The exchange in flight between a _start and ddl_halo_exchange_finish: its buffer,
    // direction, the step whose requests q holds, and the steps still to run after it.
    bool          in_flight, fl_adjoint;
    ddl_tensor_t *fl_buf;
    int           fl_step;
    step_reqs     fl_q;
};

// ---- strided slab movement ---------------------------------------------------
// The slabs are boxes whose innermost runs are often short (a column halo moves one
// element per row), so a run-by-run walker paying a call per run would dominate the
// exchange. These loops walk the collapsed description instead: an odometer over the
// outer dims and a two-level kernel over the innermost two, the flat side contiguous.

typedef enum { MOVE_PACK, MOVE_PACK_ZERO, MOVE_UNPACK, MOVE_ADD, MOVE_ZERO } move_op;

// One row: n0 elements of t at row[AT(k)] against fr[k]. With AT(k) = k, GCC turns the
// copy and zero loops into memcpy/memset; the add is unrolled by 4 so that -O2's
// straight-line vectorizer emits packed adds (restrict rules out aliasing).
#define HALO_UNIT(k)    (k)
#define HALO_STRIDED(k) ((k) * s0)
#define HALO_ROW(AT)                                                               \
    do {                                                                           \
        int64_t k = 0;                                                             \
        switch (op) {                                                              \
        case MOVE_PACK:                                                            \
            for (; k < n0; k++) {                                                  \
                fr[k] = row[AT(k)];                                                \
            }                                                                      \
            break;                                                                 \
        case MOVE_PACK_ZERO:                                                       \
            for (; k < n0; k++) {                                                  \
                fr[k]       = row[AT(k)];                                          \
                row[AT(k)] = 0;                                                    \
            }                                                                      \
            break;                                                                 \
        case MOVE_UNPACK:                                                          \
            for (; k < n0; k++) {                                                  \
                row[AT(k)] = fr[k];                                                \
            }                                                                      \
            break;                                                                 \
        case MOVE_ADD:                                                             \
            for (; k + 4 <= n0; k += 4) {                                          \
                row[AT(k)] += fr[k];                                               \
                row[AT(k + 1)] += fr[k + 1];                                       \
                row[AT(k + 2)] += fr[k + 2];                                       \
                row[AT(k + 3)] += fr[k + 3];                                       \
            }                                                                      \
            for (; k < n0; k++) {                                                  \
                row[AT(k)] += fr[k];                                               \
            }                                                                      \
            break;                                                                 \
        case MOVE_ZERO:                                                            \
            for (; k < n0; k++) {                                                  \
                row[AT(k)] = 0;                                                    \
            }                                                                      \
            break;                                                                 \
        }                                                                          \
    } while (0)

// The 2-D kernel: rows m < n1 at stride s1 in t, elements k < n0 at stride s0 within a
// row; f holds the n1 x n0 elements row-major (NULL for MOVE_ZERO). One per dtype.
#define HALO_DEFINE_KERNEL(T, name)                                                  \
    static void name(move_op op, T *restrict t, int64_t n1, int64_t s1, int64_t n0, \
                     int64_t s0, T *restrict f)                                     \
    {                                                                                \
        for (int64_t m = 0; m < n1; m++) {                                           \
            T *restrict row = t + m * s1;                                            \
            T *restrict fr  = f != NULL ? f + m * n0 : NULL;                         \
            if (s0 == 1) {                                                           \
                HALO_ROW(HALO_UNIT);                                                 \
            } else {                                                                 \
                HALO_ROW(HALO_STRIDED);                                              \
            }                                                                        \
        }                                                                            \
    }
HALO_DEFINE_KERNEL(double, kernel_f64)
HALO_DEFINE_KERNEL(float, kernel_f32)

// Applies op between slab r of the buffer data and the flat array f (unused by
// MOVE_ZERO). Allocates nothing.
static void slab_move(const ddl_halo_exchange_t *h, const halo_region *r, void *data, void *f,
                      move_op op)
{
    // The innermost two collapsed dims form the kernel; a 1-D walk is one row.
    int     nd = r->nd;
    int64_t n0 = r->ext[nd - 1], s0 = r->str[nd - 1];
    int64_t n1 = nd >= 2 ? r->ext[nd - 2] : 1, s1 = nd >= 2 ? r->str[nd - 2] : 0;
    int     nouter = nd >= 2 ? nd - 2 : 0;
    int64_t idx[DDL_MAX_DIMS] = {0};
    int64_t toff = r->off, foff = 0, block = n1 * n0;
    for (;;) {
        if (h->dt == DDL_F64) {
            kernel_f64(op, (double *)data + toff, n1, s1, n0, s0, f ? (double *)f + foff : NULL);
        } else {
            kernel_f32(op, (float *)data + toff, n1, s1, n0, s0, f ? (float *)f + foff : NULL);
        }
        // Next block: the flat side just advances; the tensor side steps the odometer.
        foff += block;
        int d = nouter - 1;
        while (d >= 0) {
            idx[d]++;
            toff += r->str[d];
            if (idx[d] < r->ext[d]) {
                break;
            }
            toff -= r->str[d] * r->ext[d];
            idx[d] = 0;
            d--;
        }
        if (d < 0) {
            return;
        }
    }
}

// ---- plan construction -----------------------------------------------------

// Collapses box r->box of a row-major tensor of shape s into r's strided walk.
static void region_describe(const ddl_shape *s, halo_region *r)
{
    int64_t st[DDL_MAX_DIMS], acc = 1;
    for (int i = s->ndim - 1; i >= 0; i--) {
        st[i] = acc;
        acc *= s->d[i];
    }
    r->off = 0;
    r->nd  = 0;
    // Outer to inner, so a merge always extends the innermost dim kept so far.
    for (int i = 0; i < s->ndim; i++) {
        r->off += r->box.start[i] * st[i];
        int64_t e = r->box.stop[i] - r->box.start[i];
        if (e == 1) {
            continue;  // a single index: contributes only to the offset
        }
        // Merge into the previous (outer) dim when its stride spans this dim's block.
        if (r->nd > 0 && r->str[r->nd - 1] == e * st[i]) {
            r->ext[r->nd - 1] *= e;
            r->str[r->nd - 1] = st[i];
            continue;
        }
        r->ext[r->nd] = e;
        r->str[r->nd] = st[i];
        r->nd++;
    }
    if (r->nd == 0) {
        // A single element: a run of one.
        r->ext[0] = 1;
        r->str[0] = 1;
        r->nd     = 1;
    }
}

// Chooses how the slab travels and builds its datatype when typed. Datatypes are nested
// hvectors over the collapsed walk, relative to B + off.
static ddl_status region_plan(ddl_halo_exchange_t *h, halo_region *r)
{
    r->type = MPI_DATATYPE_NULL;
    if (r->nd == 1 && r->str[0] == 1) {
        r->mode = XFER_DIRECT;
        return DDL_OK;
    }
    // The contiguous run is the innermost collapsed dim when it has stride 1, else a
    // single element (and the innermost dim becomes one more hvector level).
    bool    unit = r->str[r->nd - 1] == 1;
    int64_t run  = unit ? r->ext[r->nd - 1] : 1;
    if ((size_t)run * h->esize < HALO_TYPED_MIN_RUN_BYTES) {
        r->mode = XFER_STAGED;
        return DDL_OK;
    }
    // Innermost run first, then one hvector (byte stride) per outer collapsed dim.
    r->mode = XFER_TYPED;
    MPI_Datatype t;
    DDL_CHECK_MPI(MPI_Type_contiguous((int)run, h->mpi_type, &t));
    for (int d = unit ? r->nd - 2 : r->nd - 1; d >= 0; d--) {
        MPI_Datatype outer;
        MPI_Aint     bytes = (MPI_Aint)(r->str[d] * (int64_t)h->esize);
        int          rc    = MPI_Type_create_hvector((int)r->ext[d], 1, bytes, t, &outer);
        MPI_Type_free(&t);
        DDL_CHECK_MPI(rc);
        t = outer;
    }
    int rc = MPI_Type_commit(&t);
    if (rc != MPI_SUCCESS) {
        MPI_Type_free(&t);
        DDL_CHECK_MPI(rc);
    }
    r->type = t;
    return DDL_OK;
}

// Saturating product for the message-size bound (anything past INT_MAX is just "big").
static int64_t mul_sat(int64_t a, int64_t b)
{
    if (a == 0 || b == 0) {
        return 0;
    }
    return a > ((int64_t)INT_MAX + 1) / b ? (int64_t)INT_MAX + 1 : a * b;
}

// Validates the whole configuration for every coordinate of P, so that every rank (and
// every non-member) reaches the same verdict with the same message. This includes MPI's
// int count limit: the largest slab of step i over all coordinates is the product of the
// per-dimension maxima (coordinates vary independently in a Cartesian grid), so the
// bound is exact and the same everywhere.
static ddl_status validate(const ddl_partition_t *P, ddl_dtype dt, const ddl_shape *global,
                           const int64_t *kernel, const int64_t *stride, const int64_t *padding,
                           const int64_t *dilation)
{
    DDL_REQUIRE(dt == DDL_F32 || dt == DDL_F64, DDL_EINVAL, "halo exchange: unknown dtype %d",
                (int)dt);
    int ndim = ddl_partition_ndim(P);
    DDL_REQUIRE(global->ndim == ndim, DDL_EINVAL,
                "halo exchange: tensor has %d dims but the partition has %d", global->ndim, ndim);
    // Per dimension, over all pieces: the largest buffer length, non-ghost length and
    // slab width (ghost or send), for the message-size bound below.
    const int *pshape = ddl_partition_shape(P);
    int64_t    max_buf[DDL_MAX_DIMS], max_inner[DDL_MAX_DIMS], max_slab[DDL_MAX_DIMS];
    for (int d = 0; d < ndim; d++) {
        DDL_REQUIRE(global->d[d] >= 0, DDL_EINVAL, "halo exchange: global[%d] = %lld is negative",
                    d, (long long)global->d[d]);
        DDL_REQUIRE(kernel[d] >= 1, DDL_EINVAL, "halo exchange: kernel[%d] = %lld must be >= 1", d,
                    (long long)kernel[d]);
        DDL_REQUIRE(stride[d] >= 1, DDL_EINVAL, "halo exchange: stride[%d] = %lld must be >= 1", d,
                    (long long)stride[d]);
        DDL_REQUIRE(padding[d] >= 0, DDL_EINVAL,
                    "halo exchange: padding[%d] = %lld must be >= 0", d, (long long)padding[d]);
        DDL_REQUIRE(dilation[d] >= 1, DDL_EINVAL,
                    "halo exchange: dilation[%d] = %lld must be >= 1", d, (long long)dilation[d]);
        // Every piece of this dimension, not just ours: the verdict must not depend on
        // which rank computes it.
        max_buf[d] = max_inner[d] = max_slab[d] = 0;
        for (int i = 0; i < pshape[d]; i++) {
            ddl_halo_dim h;
            ddl_status   st = ddl_halo_dim_compute(global->d[d], pshape[d], i, kernel[d], stride[d],
                                                   padding[d], dilation[d], &h);
            if (st != DDL_OK) {
                char why[512];
                snprintf(why, sizeof why, "%s", ddl_last_error());
                return ddl_set_error(st, "halo exchange: dimension %d (global %lld over %d): %s", d,
                                     (long long)global->d[d], pshape[d], why);
            }
            int64_t inner = h.buf - h.ghost_lo - h.ghost_hi;
            int64_t slab  = h.ghost_lo;
            slab          = h.ghost_hi > slab ? h.ghost_hi : slab;
            slab          = h.send_lo > slab ? h.send_lo : slab;
            slab          = h.send_hi > slab ? h.send_hi : slab;
            max_buf[d]    = h.buf > max_buf[d] ? h.buf : max_buf[d];
            max_inner[d]  = inner > max_inner[d] ? inner : max_inner[d];
            max_slab[d]   = slab > max_slab[d] ? slab : max_slab[d];
        }
    }
    // Slab of step i: full buffers in dims j < i, non-ghost extents in dims j > i.
    for (int i = 0; i < ndim; i++) {
        int64_t n = max_slab[i];
        for (int j = 0; j < ndim; j++) {
            if (j != i) {
                n = mul_sat(n, j < i ? max_buf[j] : max_inner[j]);
            }
        }
        DDL_REQUIRE(n <= INT_MAX, DDL_EINVAL,
                    "halo exchange: a halo slab of dimension %d holds more than %d elements "
                    "(MPI's int count); use more ranks or a smaller tensor",
                    i, INT_MAX);
    }
    return DDL_OK;
}

// Fills the four slabs of the step along dimension i (see the file comment) and plans
// how each travels.
static ddl_status build_step(ddl_halo_exchange_t *h, int i, halo_step *s)
{
    const ddl_halo_dim *hd   = h->dims;
    ddl_box             base = {.ndim = h->ndim};
    for (int j = 0; j < h->ndim; j++) {
        if (j < i) {
            base.start[j] = 0;
            base.stop[j]  = hd[j].buf;
        } else {
            base.start[j] = hd[j].ghost_lo;
            base.stop[j]  = hd[j].buf - hd[j].ghost_hi;
        }
    }
    // The extent of each slab in dimension i itself (the table in the file comment).
    const ddl_halo_dim *c = &hd[i];
    int64_t             lo[NSLOTS], hi[NSLOTS];
    lo[SLOT_BULK_LO]  = c->ghost_lo;
    hi[SLOT_BULK_LO]  = c->ghost_lo + c->send_lo;
    lo[SLOT_GHOST_LO] = 0;
    hi[SLOT_GHOST_LO] = c->ghost_lo;
    lo[SLOT_BULK_HI]  = c->buf - c->ghost_hi - c->send_hi;
    hi[SLOT_BULK_HI]  = c->buf - c->ghost_hi;
    lo[SLOT_GHOST_HI] = c->buf - c->ghost_hi;
    hi[SLOT_GHOST_HI] = c->buf;
    s->dim            = i;
    // No datatype yet on any slab, so that an error part-way leaves a destroyable step.
    for (int k = 0; k < NSLOTS; k++) {
        s->slab[k].type = MPI_DATATYPE_NULL;
    }
    for (int k = 0; k < NSLOTS; k++) {
        halo_region *r  = &s->slab[k];
        r->box          = base;
        r->box.start[i] = lo[k];
        r->box.stop[i]  = hi[k];
        DDL_ASSERT(ddl_box_inside(&r->box, &h->shape));
        int64_t n = ddl_box_numel(&r->box);
        DDL_ASSERT(n <= INT_MAX);  // bounded for every coordinate by validate()
        r->count = (int)n;
        if (n > 0) {
            region_describe(&h->shape, r);
            DDL_CHECK(region_plan(h, r));
        }
    }
    // A non-empty slab on a side implies a neighbour there (the halo arithmetic never
    // gives the first piece a left halo nor the last a right one).
    DDL_ASSERT(s->lo != MPI_PROC_NULL ||
               (s->slab[SLOT_BULK_LO].count == 0 && s->slab[SLOT_GHOST_LO].count == 0));
    DDL_ASSERT(s->hi != MPI_PROC_NULL ||
               (s->slab[SLOT_BULK_HI].count == 0 && s->slab[SLOT_GHOST_HI].count == 0));
    return DDL_OK;
}

ddl_status ddl_halo_exchange_create(const ddl_partition_t *P, ddl_dtype dt,
                                    const ddl_shape *global, const int64_t *kernel,
                                    const int64_t *stride, const int64_t *padding,
                                    const int64_t *dilation, ddl_halo_exchange_t **out)
{
    DDL_REQUIRE(out != NULL, DDL_EINVAL, "halo exchange: out is NULL");
    *out = NULL;
    DDL_REQUIRE(P != NULL && global != NULL && kernel != NULL && stride != NULL &&
                    padding != NULL && dilation != NULL,
                DDL_EINVAL,
                "halo exchange: NULL argument (P, global, kernel, stride, padding and "
                "dilation are all required)");
    DDL_CHECK(validate(P, dt, global, kernel, stride, padding, dilation));

    // Valid everywhere from here on; the rest is this rank's own plan.
    ddl_halo_exchange_t *h = ddl_calloc(1, sizeof *h);
    if (h == NULL) {
        return ddl_set_error(DDL_ENOMEM, "halo exchange: out of memory");
    }
    int ndim       = ddl_partition_ndim(P);
    h->ndim        = ndim;
    h->dt          = dt;
    h->esize       = ddl_dtype_size(dt);
    h->mpi_type    = dt == DDL_F64 ? MPI_DOUBLE : MPI_FLOAT;
    h->comm        = MPI_COMM_NULL;
    h->active      = ddl_partition_active(P);
    h->shape.ndim  = ndim;
    h->bulk.ndim   = ndim;
    h->needed.ndim = ndim;
    if (!h->active) {
        // Non-members: zero-volume everything, no communication ever.
        *out = h;
        return DDL_OK;
    }
    // The buffer layout, and where the input and the window's needs sit inside it.
    h->comm           = ddl_partition_comm(P);
    const int *pshape = ddl_partition_shape(P);
    const int *index  = ddl_partition_index(P);
    for (int d = 0; d < ndim; d++) {
        ddl_halo_dim *hd = &h->dims[d];
        // Cannot fail: validate() ran the same computation for every index.
        ddl_status st = ddl_halo_dim_compute(global->d[d], pshape[d], index[d], kernel[d],
                                             stride[d], padding[d], dilation[d], hd);
        DDL_ASSERT(st == DDL_OK);
        h->shape.d[d]      = hd->buf;
        h->bulk.start[d]   = hd->ghost_lo + hd->pad_lo;
        h->bulk.stop[d]    = hd->ghost_lo + hd->pad_lo + hd->n;
        h->needed.start[d] = hd->need_lo;
        h->needed.stop[d]  = hd->need_hi;
    }

    // One step per dimension with anything to move; face neighbours by coordinate. The
    // position of a coordinate in the partition list is its rank in the partition comm.
    size_t cap[NSLOTS] = {0};
    for (int i = 0; i < ndim; i++) {
        halo_step *s = &h->steps[h->nsteps];
        int        coord[DDL_MAX_DIMS];
        memcpy(coord, index, sizeof(int) * (size_t)ndim);
        coord[i] = index[i] - 1;
        s->lo    = index[i] > 0 ? (int)ddl_index_ravel(ndim, pshape, coord) : MPI_PROC_NULL;
        coord[i] = index[i] + 1;
        s->hi = index[i] < pshape[i] - 1 ? (int)ddl_index_ravel(ndim, pshape, coord)
                                         : MPI_PROC_NULL;
        ddl_status st = build_step(h, i, s);  // fails only if MPI cannot build a datatype
        if (st != DDL_OK) {
            h->nsteps++;  // so destroy frees this step's datatypes too
            ddl_halo_exchange_destroy(&h);
            return st;
        }
        int busy = 0;
        for (int k = 0; k < NSLOTS; k++) {
            busy += s->slab[k].count > 0;
            // Bulk slots are always needed by the adjoint (it adds what it receives);
            // ghost slots only when the ghost slab is staged.
            bool   staged = k == SLOT_BULK_LO || k == SLOT_BULK_HI ||
                            s->slab[k].mode == XFER_STAGED;
            size_t bytes  = staged ? (size_t)s->slab[k].count * h->esize : 0;
            cap[k]        = bytes > cap[k] ? bytes : cap[k];
        }
        if (busy > 0) {
            h->nsteps++;  // else the slot is reused by the next dimension
        }
    }

    // The slot buffers, in one aligned allocation carved at DDL_ALIGN boundaries.
    size_t total = 0, at[NSLOTS];
    for (int k = 0; k < NSLOTS; k++) {
        at[k] = total;
        total += (cap[k] + DDL_ALIGN - 1) / DDL_ALIGN * DDL_ALIGN;
    }
    if (total > 0) {
        h->arena = ddl_malloc(total);
        if (h->arena == NULL) {
            ddl_halo_exchange_destroy(&h);
            return ddl_set_error(DDL_ENOMEM, "halo exchange: cannot allocate %zu buffer bytes",
                                 total);
        }
        for (int k = 0; k < NSLOTS; k++) {
            h->slot[k] = cap[k] > 0 ? (char *)h->arena + at[k] : NULL;
        }
    }
    *out = h;
    return DDL_OK;
}

// Frees the datatypes of the planned steps, the slot buffers and the plan. Not
// collective (the partition's communicator is borrowed, not owned).
void ddl_halo_exchange_destroy(ddl_halo_exchange_t **h)
{
    if (h == NULL || *h == NULL) {
        return;
    }
    for (int t = 0; t < (*h)->nsteps; t++) {
        for (int k = 0; k < NSLOTS; k++) {
            if ((*h)->steps[t].slab[k].type != MPI_DATATYPE_NULL) {
                MPI_Type_free(&(*h)->steps[t].slab[k].type);
            }
        }
    }
    ddl_free((*h)->arena);
    ddl_free(*h);
    *h = NULL;
}

ddl_shape ddl_halo_exchange_shape(const ddl_halo_exchange_t *h)
{
    return h->shape;
}

ddl_box ddl_halo_exchange_bulk_box(const ddl_halo_exchange_t *h)
{
    return h->bulk;
}

ddl_box ddl_halo_exchange_needed_box(const ddl_halo_exchange_t *h)
{
    return h->needed;
}

const ddl_halo_dim *ddl_halo_exchange_dims(const ddl_halo_exchange_t *h)
{
    return h->active ? h->dims : NULL;
}

void ddl_halo_exchange_fill_pads(const ddl_halo_exchange_t *h, ddl_tensor_t *buf, double v)
{
    if (!h->active) {
        return;
    }
    DDL_ASSERT(ddl_shape_equal(&buf->shape, &h->shape));
    for (int j = 0; j < h->ndim; j++) {
        const ddl_halo_dim *d = &h->dims[j];
        ddl_box             b = ddl_box_full(&h->shape);
        if (d->pad_lo > 0) {
            b.start[j] = d->ghost_lo;
            b.stop[j]  = d->ghost_lo + d->pad_lo;
            ddl_tensor_fill_box(buf, &b, v);
        }
        if (d->pad_hi > 0) {
            b.start[j] = d->buf - d->ghost_hi - d->pad_hi;
            b.stop[j]  = d->buf - d->ghost_hi;
            ddl_tensor_fill_box(buf, &b, v);
        }
    }
}

// ---- execution ---------------------------------------------------------------

// Checks the tensor handed to forward/adjoint. Local only: a wrong tensor is a usage
// error that leaves the neighbours waiting, as with any mismatched MPI call. An
// agreement round (allreduce) per call would cost more than a small halo itself, and
// the plan, validated collectively in _create, already fixes every shape.
static ddl_status check_buffer(const ddl_halo_exchange_t *h, const ddl_tensor_t *buf,
                               const char *what)
{
    DDL_REQUIRE(h != NULL, DDL_EINVAL, "halo exchange %s: plan is NULL", what);
    if (!h->active) {
        DDL_REQUIRE(buf == NULL || ddl_tensor_numel(buf) == 0, DDL_ESHAPE,
                    "halo exchange %s: inactive rank got a tensor of %lld elements "
                    "(expected zero volume)",
                    what, (long long)(buf ? ddl_tensor_numel(buf) : 0));
        return DDL_OK;
    }
    DDL_REQUIRE(buf != NULL, DDL_EINVAL, "halo exchange %s: buffer tensor is NULL", what);
    DDL_REQUIRE(buf->dtype == h->dt, DDL_EINVAL, "halo exchange %s: dtype %s, plan has %s", what,
                ddl_dtype_name(buf->dtype), ddl_dtype_name(h->dt));
    if (!ddl_shape_equal(&buf->shape, &h->shape)) {
        char got[128], want[128];
        return ddl_set_error(DDL_ESHAPE, "halo exchange %s: buffer shape %s, expected %s", what,
                             ddl_shape_str(&buf->shape, got, sizeof got),
                             ddl_shape_str(&h->shape, want, sizeof want));
    }
    return DDL_OK;
}

// Posts one receive or send of slab r: in place (direct: count elements at B + off;
// typed: one datatype at B + off) or through stage (count contiguous elements).
static ddl_status post(const ddl_halo_exchange_t *h, ddl_tensor_t *buf, step_reqs *q,
                       const halo_region *r, void *stage, bool recv, int peer, int tag,
                       after_op after)
{
    void        *ptr   = (char *)buf->data + (size_t)r->off * h->esize;
    int          count = r->count;
    MPI_Datatype type  = h->mpi_type;
    if (stage != NULL) {
        ptr = stage;
    } else if (r->mode == XFER_TYPED) {
        count = 1;
        type  = r->type;
    }
    MPI_Request *req = &q->req[q->n];
    if (recv) {
        DDL_CHECK_MPI(MPI_Irecv(ptr, count, type, peer, tag, h->comm, req));
    } else {
        DDL_CHECK_MPI(MPI_Isend(ptr, count, type, peer, tag, h->comm, req));
    }
    q->slab[q->n]  = r;
    q->stage[q->n] = stage;
    q->after[q->n] = after;
    q->n++;
    q->left++;
    return DDL_OK;
}

// The action of request `at`, once it has completed.
static void after_done(const ddl_halo_exchange_t *h, ddl_tensor_t *buf, const step_reqs *q, int at)
{
    switch (q->after[at]) {
    case AFTER_UNPACK:
        slab_move(h, q->slab[at], buf->data, q->stage[at], MOVE_UNPACK);
        break;
    case AFTER_ADD:
        slab_move(h, q->slab[at], buf->data, q->stage[at], MOVE_ADD);
        break;
    case AFTER_ZERO:
        slab_move(h, q->slab[at], buf->data, NULL, MOVE_ZERO);
        break;
    case AFTER_NONE:
        break;
    }
}

// Request `at` has completed: its action now, so that unpacking one side overlaps the
// other side's transfer; but the additions only once every request is done, in the order
// they were posted (low side, then high). The two bulk slabs of a step may overlap, and
// adding them in the order the transfers happened to complete would make the sums differ
// from run to run (and the split phase from the one-call exchange).
static void request_done(const ddl_halo_exchange_t *h, ddl_tensor_t *buf, step_reqs *q, int at)
{
    q->left--;
    if (q->after[at] != AFTER_ADD) {
        after_done(h, buf, q, at);
    }
    for (int i = 0; q->left == 0 && i < q->n; i++) {
        if (q->after[i] == AFTER_ADD) {
            after_done(h, buf, q, i);
        }
    }
}

// Completes the step's requests. At most four requests: a Waitany loop over them costs
// nothing next to the data.
static ddl_status complete(const ddl_halo_exchange_t *h, ddl_tensor_t *buf, step_reqs *q)
{
    while (q->left > 0) {
        int at;
        DDL_CHECK_MPI(MPI_Waitany(q->n, q->req, &at, MPI_STATUS_IGNORE));
        DDL_ASSERT(at != MPI_UNDEFINED);
        request_done(h, buf, q, at);
    }
    return DDL_OK;
}

// Completes what has arrived without waiting (MPI_Testsome also moves the transfers on).
static ddl_status complete_some(const ddl_halo_exchange_t *h, ddl_tensor_t *buf, step_reqs *q)
{
    if (q->left == 0) {
        return DDL_OK;
    }
    int done = 0, at[NSLOTS];
    DDL_CHECK_MPI(MPI_Testsome(q->n, q->req, &done, at, MPI_STATUSES_IGNORE));
    for (int i = 0; i < done && done != MPI_UNDEFINED; i++) {
        request_done(h, buf, q, at[i]);
    }
    return DDL_OK;
}

// The slabs of each side: index 0 is the low side (left neighbour), 1 the high side.
static const int ghost_slot[2] = {SLOT_GHOST_LO, SLOT_GHOST_HI};
static const int bulk_slot[2]  = {SLOT_BULK_LO, SLOT_BULK_HI};

// Traffic of one exchange (primitives/traffic.c): forward sends the bulk slabs and
// receives the ghosts; the adjoint sends the ghosts back and receives into the bulk.
static void count_traffic(const ddl_halo_exchange_t *h, ddl_traffic_pass pass)
{
    uint64_t bulk = 0, ghost = 0;
    for (int t = 0; t < h->nsteps; t++) {
        for (int side = 0; side < 2; side++) {
            bulk += (uint64_t)h->steps[t].slab[bulk_slot[side]].count;
            ghost += (uint64_t)h->steps[t].slab[ghost_slot[side]].count;
        }
    }
    bulk *= h->esize;
    ghost *= h->esize;
    if (pass == DDL_TRAFFIC_FORWARD) {
        ddl__traffic_add(DDL_TRAFFIC_HALO_EXCHANGE, pass, bulk, ghost);
    } else {
        ddl__traffic_add(DDL_TRAFFIC_HALO_EXCHANGE, pass, ghost, bulk);
    }
}

// Posts step t of the forward: receives first, so the neighbours' sends find them
// posted (the low ghost is filled by the low neighbour sending upwards, to_hi, and vice
// versa), then the bulk slabs, packed first when staged.
static ddl_status post_forward_step(const ddl_halo_exchange_t *h, ddl_tensor_t *buf, int t,
                                    step_reqs *q)
{
    const halo_step *s       = &h->steps[t];
    const int        peer[2] = {s->lo, s->hi};
    q->n = q->left = 0;
    for (int side = 0; side < 2; side++) {
        const halo_region *g = &s->slab[ghost_slot[side]];
        if (g->count > 0) {
            bool staged = g->mode == XFER_STAGED;
            DDL_CHECK(post(h, buf, q, g, staged ? h->slot[ghost_slot[side]] : NULL, true,
                           peer[side], HALO_TAG(0, side == 0, s->dim),
                           staged ? AFTER_UNPACK : AFTER_NONE));
        }
    }
    for (int side = 0; side < 2; side++) {
        const halo_region *b     = &s->slab[bulk_slot[side]];
        void              *stage = NULL;
        if (b->count == 0) {
            continue;
        }
        if (b->mode == XFER_STAGED) {
            stage = h->slot[bulk_slot[side]];
            slab_move(h, b, buf->data, stage, MOVE_PACK);
        }
        DDL_CHECK(post(h, buf, q, b, stage, false, peer[side], HALO_TAG(0, side == 1, s->dim),
                       AFTER_NONE));
    }
    return DDL_OK;
}

// Posts step t of the adjoint. The neighbours' ghosts come back into staging, to be added
// into my bulk (ghost and bulk slabs are disjoint; the two bulk slabs may overlap, send_lo
// + send_hi > n, and both additions then land). My ghosts go back where forward took them
// from, and become zero: at once when staged (packed and zeroed in one pass), else once
// MPI is done reading them.
static ddl_status post_adjoint_step(const ddl_halo_exchange_t *h, ddl_tensor_t *buf, int t,
                                    step_reqs *q)
{
    const halo_step *s       = &h->steps[t];
    const int        peer[2] = {s->lo, s->hi};
    q->n = q->left = 0;
    for (int side = 0; side < 2; side++) {
        const halo_region *b = &s->slab[bulk_slot[side]];
        if (b->count > 0) {
            DDL_CHECK(post(h, buf, q, b, h->slot[bulk_slot[side]], true, peer[side],
                           HALO_TAG(1, side == 0, s->dim), AFTER_ADD));
        }
    }
    for (int side = 0; side < 2; side++) {
        const halo_region *g = &s->slab[ghost_slot[side]];
        if (g->count == 0) {
            continue;
        }
        bool staged = g->mode == XFER_STAGED;
        if (staged) {
            slab_move(h, g, buf->data, h->slot[ghost_slot[side]], MOVE_PACK_ZERO);
        }
        DDL_CHECK(post(h, buf, q, g, staged ? h->slot[ghost_slot[side]] : NULL, false, peer[side],
                       HALO_TAG(1, side == 1, s->dim), staged ? AFTER_NONE : AFTER_ZERO));
    }
    return DDL_OK;
}

// Forward runs the steps in dimension order, the adjoint in reverse: the step after t.
static int next_step(const ddl_halo_exchange_t *h, bool adjoint, int t)
{
    return adjoint ? t - 1 : (t + 1 < h->nsteps ? t + 1 : -1);
}

static ddl_status post_step(const ddl_halo_exchange_t *h, ddl_tensor_t *buf, bool adjoint, int t,
                            step_reqs *q)
{
    return adjoint ? post_adjoint_step(h, buf, t, q) : post_forward_step(h, buf, t, q);
}

// Runs the steps from t on, each posted and completed in turn (t < 0: none).
static ddl_status run_steps(const ddl_halo_exchange_t *h, ddl_tensor_t *buf, bool adjoint, int t)
{
    for (; t >= 0; t = next_step(h, adjoint, t)) {
        step_reqs q = {.n = 0};
        DDL_CHECK(post_step(h, buf, adjoint, t, &q));
        DDL_CHECK(complete(h, buf, &q));
    }
    return DDL_OK;
}

static int first_step(const ddl_halo_exchange_t *h, bool adjoint)
{
    return h->nsteps == 0 ? -1 : (adjoint ? h->nsteps - 1 : 0);
}

static ddl_status halo_run(const ddl_halo_exchange_t *h, ddl_tensor_t *buf, bool adjoint)
{
    DDL_CHECK(check_buffer(h, buf, adjoint ? "adjoint" : "forward"));
    DDL_REQUIRE(!h->in_flight, DDL_EINVAL,
                "halo exchange %s: an exchange of this plan is in flight (finish it first)",
                adjoint ? "adjoint" : "forward");
    count_traffic(h, adjoint ? DDL_TRAFFIC_ADJOINT : DDL_TRAFFIC_FORWARD);
    return h->active ? run_steps(h, buf, adjoint, first_step(h, adjoint)) : DDL_OK;
}

// Split phase: the first step posted now, completed (and the rest run) by finish.
static ddl_status halo_start(ddl_halo_exchange_t *h, ddl_tensor_t *buf, bool adjoint)
{
    const char *what = adjoint ? "adjoint start" : "forward start";
    DDL_CHECK(check_buffer(h, buf, what));
    DDL_REQUIRE(!h->in_flight, DDL_EINVAL,
                "halo exchange %s: an exchange of this plan is in flight (finish it first)", what);
    count_traffic(h, adjoint ? DDL_TRAFFIC_ADJOINT : DDL_TRAFFIC_FORWARD);
    h->in_flight  = true;
    h->fl_adjoint = adjoint;
    h->fl_buf     = buf;
    h->fl_step    = h->active ? first_step(h, adjoint) : -1;
    h->fl_q.n     = 0;
    h->fl_q.left  = 0;
    if (h->fl_step >= 0) {
        DDL_CHECK(post_step(h, buf, adjoint, h->fl_step, &h->fl_q));
    }
    return DDL_OK;
}

// Moves the exchange in flight on: completes what has arrived and, once a step is done,
// posts the next.
static ddl_status halo_progress(ddl_halo_exchange_t *h)
{
    while (h->fl_step >= 0) {
        DDL_CHECK(complete_some(h, h->fl_buf, &h->fl_q));
        if (h->fl_q.left > 0) {
            return DDL_OK;
        }
        h->fl_step = next_step(h, h->fl_adjoint, h->fl_step);
        if (h->fl_step >= 0) {
            DDL_CHECK(post_step(h, h->fl_buf, h->fl_adjoint, h->fl_step, &h->fl_q));
        }
    }
    return DDL_OK;
}

static ddl_status halo_finish(ddl_halo_exchange_t *h)
{
    h->in_flight = false;
    if (h->fl_step < 0) {
        return DDL_OK;
    }
    DDL_CHECK(complete(h, h->fl_buf, &h->fl_q));
    return run_steps(h, h->fl_buf, h->fl_adjoint, next_step(h, h->fl_adjoint, h->fl_step));
}

ddl_status ddl_halo_exchange_forward(const ddl_halo_exchange_t *h, ddl_tensor_t *buf)
{
    DDL_TRAFFIC_TIMED_RETURN(DDL_TRAFFIC_HALO_EXCHANGE, DDL_TRAFFIC_FORWARD,
                             halo_run(h, buf, false));
}

ddl_status ddl_halo_exchange_adjoint(const ddl_halo_exchange_t *h, ddl_tensor_t *buf)
{
    DDL_TRAFFIC_TIMED_RETURN(DDL_TRAFFIC_HALO_EXCHANGE, DDL_TRAFFIC_ADJOINT,
                             halo_run(h, buf, true));
}

ddl_status ddl_halo_exchange_forward_start(ddl_halo_exchange_t *h, ddl_tensor_t *buf)
{
    DDL_TRAFFIC_TIMED_RETURN(DDL_TRAFFIC_HALO_EXCHANGE, DDL_TRAFFIC_FORWARD,
                             halo_start(h, buf, false));
}

ddl_status ddl_halo_exchange_adjoint_start(ddl_halo_exchange_t *h, ddl_tensor_t *buf)
{
    DDL_TRAFFIC_TIMED_RETURN(DDL_TRAFFIC_HALO_EXCHANGE, DDL_TRAFFIC_ADJOINT,
                             halo_start(h, buf, true));
}

ddl_status ddl_halo_exchange_progress(ddl_halo_exchange_t *h)
{
    if (h == NULL || !h->in_flight) {
        return DDL_OK;
    }
    DDL_TRAFFIC_TIMED_RETURN(DDL_TRAFFIC_HALO_EXCHANGE,
                             h->fl_adjoint ? DDL_TRAFFIC_ADJOINT : DDL_TRAFFIC_FORWARD,
                             halo_progress(h));
}

bool ddl_halo_exchange_in_flight(const ddl_halo_exchange_t *h)
{
    return h != NULL && h->in_flight;
}

ddl_status ddl_halo_exchange_finish(ddl_halo_exchange_t *h)
{
    DDL_REQUIRE(h != NULL, DDL_EINVAL, "halo exchange finish: plan is NULL");
    DDL_REQUIRE(h->in_flight, DDL_EINVAL, "halo exchange finish: no exchange in flight");
    DDL_TRAFFIC_TIMED_RETURN(DDL_TRAFFIC_HALO_EXCHANGE,
                             h->fl_adjoint ? DDL_TRAFFIC_ADJOINT : DDL_TRAFFIC_FORWARD,
                             halo_finish(h));
}
