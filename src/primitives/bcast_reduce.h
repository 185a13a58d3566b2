// primitives/bcast_reduce.h: internal: the one executor behind Broadcast and SumReduce
// (not installed).
//
// Broadcast and SumReduce are adjoint to each other, and both run on the same kind of
// groups: each group has one root (comm rank 0) and some leaves. Only the direction of
// the data differs:
//
//   fan-out  (ddl__bcast_reduce_bcast): every leaf receives a copy of its root's tensor
//   fan-in   (ddl__bcast_reduce_sum):   every root receives the sum of its leaves' tensors
//
// so Broadcast forward == SumReduce adjoint == fan-out, and Broadcast adjoint ==
// SumReduce forward == fan-in. The plan below is written once in broadcast.c; the two
// public primitives only say which partition holds the roots:
//
//   Broadcast  P_x -> P_y: roots are P_x ranks (sources), leaves are P_y ranks
//   SumReduce  P_x -> P_y: roots are P_y ranks (destinations), leaves are P_x ranks
//
// A rank may root one group and be a leaf of another (or of the same one, `same`).
// The two blocking collectives are issued in increasing order of the groups' root
// ranks, which is the order the group builder reports in send_first: with one global
// order, no cycle of blocking collectives can form (DistDL issue 87).
#ifndef DDL_PRIMITIVES_BCAST_REDUCE_H
#define DDL_PRIMITIVES_BCAST_REDUCE_H

#include <mpi.h>
#include <stdbool.h>
#include <stdint.h>

#include "ddl/partition.h"
#include "ddl/tensor.h"

typedef struct ddl__bcast_reduce {
    ddl_group_pair pair;          // owns the communicators
    ddl_group      rooted;        // the group this rank roots (member false if none)
    ddl_group      leaf;          // the group this rank is a leaf of (member false if none)
    bool           same;          // rooted and leaf are one group (rank is root and leaf)
    bool           rooted_first;  // issue the rooted group's collective first
    ddl_dtype      dt;
    MPI_Datatype   mpi_dt;
    int64_t        n;             // elements of `shape` (equal on every member)
    int64_t        max_count;     // elements per MPI call (chunking above it)
    ddl_shape      root_shape;    // local shape on the root side (zero-volume if not a root)
    ddl_shape      leaf_shape;    // local shape on the leaf side (zero-volume if not a leaf)
    const char    *name;          // "broadcast" or "sum_reduce", for messages
    int            kind;          // ddl_traffic_kind of the plan (traffic counters)
} ddl__bcast_reduce;

// Validates shape and dtype, then builds the groups: roots_are_x selects the broadcast
// rules (ddl_group_pair_broadcast; roots = P_x) or the reduction rules
// (ddl_group_pair_reduce; roots = P_y). Collective over P_x ∪ P_y; EINVAL on every
// rank alike for a bad shape, dtype or partition pair. `local` (this rank's outcome so
// far, e.g. the plan's allocation) is agreed on by the members before any communicator
// is created. On failure p holds nothing.
ddl_status ddl__bcast_reduce_init(ddl__bcast_reduce *p, const char *name,
                                  const ddl_partition_t *P_x, const ddl_partition_t *P_y,
                                  bool transpose_src, bool transpose_dest, ddl_dtype dt,
                                  const ddl_shape *shape, bool roots_are_x, ddl_status local);
// Frees the communicators. Not collective; idempotent.
void ddl__bcast_reduce_free(ddl__bcast_reduce *p);

// Fan-out: out (leaf side) = the tensor `in` (root side) of this rank's leaf group's
// root. Overwrites out. `op` names the public call in messages ("broadcast forward").
// Collective over the groups of this rank; allocates nothing.
ddl_status ddl__bcast_reduce_bcast(const ddl__bcast_reduce *p, const ddl_tensor_t *in,
                                   ddl_tensor_t *out, const char *op);
// Fan-in: out (root side) = sum of `in` (leaf side) over the leaves of the group this
// rank roots (zero when it has no leaves). Overwrites out. Collective; allocates
// nothing.
ddl_status ddl__bcast_reduce_sum(const ddl__bcast_reduce *p, const ddl_tensor_t *in,
                                 ddl_tensor_t *out, const char *op);

// ---- helpers shared by the collective primitives (broadcast.c) -------------

// MPI_FLOAT or MPI_DOUBLE.
MPI_Datatype ddl__mpi_dtype(ddl_dtype dt);
// Validates a plan's local shape and dtype (ndim 0..8, dims >= 0, dtype known).
ddl_status ddl__check_plan_shape(const char *name, ddl_dtype dt, const ddl_shape *shape);
// The zero-volume shape of a rank outside a partition: `shape`'s ndim, every dim 0
// (one dim of 0 for a 0-d shape, which cannot be empty otherwise).
ddl_shape ddl__zero_shape(const ddl_shape *shape);
// Checks that t has dtype dt and shape `want`; when `want` is zero-volume any
// zero-volume tensor of dtype dt is accepted. DDL_ESHAPE names the tensor and shapes.
ddl_status ddl__check_tensor(const char *op, const char *tname, const ddl_tensor_t *t,
                             ddl_dtype dt, const ddl_shape *want);

// Largest element count passed to one MPI call; larger messages are split into
// chunks of at most this many elements. Plans read it when they are created. The
// default is INT_MAX (MPI's int count).
int64_t ddl__mpi_max_count(void);
// Test hook: sets the chunk limit for plans created afterwards (clamped to
// [1, INT_MAX]) and returns the previous value. Every rank must set the same value.
// Not thread-safe.
int64_t ddl__mpi_set_max_count(int64_t n);

#endif // DDL_PRIMITIVES_BCAST_REDUCE_H
