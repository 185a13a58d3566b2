// ddl/partition.h: Cartesian partitions of MPI ranks, and the cross-partition groups
// that broadcast and sum-reduce run on (DistDL's create_broadcast_partition_to and
// create_reduction_partition_to).
//
// A partition is a list of ranks of a base communicator, in a given order, arranged as
// a row-major Cartesian grid of a given shape: the rank at position j of the list has
// the coordinate unravel(j, shape). Every rank of the base communicator knows every
// partition's ranks and shape, member or not, so all index arithmetic is local and
// every rank reaches the same decision about a configuration without communicating.
// A rank outside the partition is *inactive*: it holds zero-volume tensors and makes
// no MPI call on the partition's behalf.
//
// Creation is collective over the member ranks only (MPI_Comm_create_group), so
// non-members may create the same partition object without blocking. The members agree
// on the outcome (ddl_agree over the new communicator): a member that fails locally (an
// allocation) still joins the creation, and every member returns its error. Every
// communicator created is freed by ddl_partition_destroy.
//
//   int ranks[] = {0, 1, 2, 3}, shape[] = {1, 1, 2, 2};
//   ddl_partition_t *P;
//   ddl_partition_create(MPI_COMM_WORLD, 4, ranks, 4, shape, &P);
//   if (ddl_partition_active(P)) { const int *idx = ddl_partition_index(P); ... }
//   ddl_partition_destroy(&P);
#ifndef DDL_PARTITION_H
#define DDL_PARTITION_H

#include <mpi.h>
#include <stdbool.h>

#include "ddl/status.h"
#include "ddl/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ddl_partition ddl_partition_t;

// Creates the partition of `nranks` ranks of `base` (listed in order) with the given
// shape (ndim dims, product == nranks). Collective over the listed ranks; other ranks
// return an inactive partition immediately. Fails with EINVAL (same outcome on every
// rank) for a rank outside base, a repeated rank, or a shape that does not multiply
// to nranks. The caller keeps ownership of base, which must outlive the partition.
// Caller owns *out; free with ddl_partition_destroy.
DDL_EXTERN ddl_status ddl_partition_create(MPI_Comm base, int nranks, const int *ranks, int ndim,
                                           const int *shape, ddl_partition_t **out);
// The union partition (1-D): P's ranks first, then Q's ranks not in P. Collective over
// the union. P and Q must share the base communicator.
DDL_EXTERN ddl_status ddl_partition_union(const ddl_partition_t *P, const ddl_partition_t *Q,
                                          ddl_partition_t **out);
// Agrees on st (ddl_agree) over the members of P ∪ Q ∪ R (Q and R may be NULL; all on one
// base), through a temporary communicator built from MPI groups -- no allocation of ours,
// so a rank can join right after one of its allocations failed. Ranks outside the union
// return st unchanged. Collective over the union's members.
DDL_EXTERN ddl_status ddl_partition_agree_union(const ddl_partition_t *P, const ddl_partition_t *Q,
                                                const ddl_partition_t *R, ddl_status st);
// The communicator of the members of P ∪ Q ∪ R (same rank order as above), built the
// same way; MPI_COMM_NULL on other ranks. The caller frees it (MPI_Comm_free). Lets a
// multi-step construction agree after each step. Collective over the union's members.
DDL_EXTERN ddl_status ddl_partition_union_comm(const ddl_partition_t *P, const ddl_partition_t *Q,
                                               const ddl_partition_t *R, MPI_Comm *out);
// NULL-safe; frees every communicator; sets *P to NULL. Not collective.
DDL_EXTERN void       ddl_partition_destroy(ddl_partition_t **P);

DDL_EXTERN bool       ddl_partition_active(const ddl_partition_t *P);
DDL_EXTERN int        ddl_partition_ndim(const ddl_partition_t *P);
DDL_EXTERN const int *ddl_partition_shape(const ddl_partition_t *P);
// This rank's coordinate (NULL when inactive).
DDL_EXTERN const int *ddl_partition_index(const ddl_partition_t *P);
// Number of ranks, and this rank's position in the list (-1 when inactive).
DDL_EXTERN int        ddl_partition_size(const ddl_partition_t *P);
DDL_EXTERN int        ddl_partition_rank(const ddl_partition_t *P);
// The ranks (in base) in partition order.
DDL_EXTERN const int *ddl_partition_ranks(const ddl_partition_t *P);
// Position of base rank r in the partition, or -1.
DDL_EXTERN int        ddl_partition_position(const ddl_partition_t *P, int r);
// The partition's communicator (rank order = list order); MPI_COMM_NULL when inactive.
DDL_EXTERN MPI_Comm   ddl_partition_comm(const ddl_partition_t *P);
DDL_EXTERN MPI_Comm   ddl_partition_base(const ddl_partition_t *P);
// This rank's rank in base.
DDL_EXTERN int        ddl_partition_base_rank(const ddl_partition_t *P);
// Base rank of the member at Cartesian coordinate coord.
DDL_EXTERN int        ddl_partition_rank_at(const ddl_partition_t *P, const int *coord);
// True if P and Q have the same ranks in the same order and the same shape.
DDL_EXTERN bool       ddl_partition_equal(const ddl_partition_t *P, const ddl_partition_t *Q);

// This rank's local shape of a tensor of global shape `global` decomposed balanced
// over P (global->ndim must equal P's ndim). Inactive ranks get all-zero dims.
DDL_EXTERN ddl_shape  ddl_partition_local_shape(const ddl_partition_t *P, const ddl_shape *global);
// The global box of this rank's piece (empty on inactive ranks).
DDL_EXTERN ddl_box    ddl_partition_local_box(const ddl_partition_t *P, const ddl_shape *global);

// ---- cross-partition groups ------------------------------------------------
// A group is a set of ranks with a root: in a broadcast the root sends to the others;
// in a reduction the others send to the root. A group of one is a local copy and has
// no communicator.
typedef struct ddl_group {
    bool     member;     // this rank belongs to the group
    int      root;       // base rank of the root (-1 when not a member)
    int      size;       // members, root included
    MPI_Comm comm;       // root is rank 0; MPI_COMM_NULL when size <= 1 or not a member
} ddl_group;

// The (up to) two groups of this rank for a broadcast or reduction from P_src to P_dest.
//   broadcast: `send` is the group this rank roots (it is a source); `recv` is the
//              group it receives in (it is a destination).
//   reduction: `send` is the group this rank contributes to (it is a source; the root
//              is its destination); `recv` is the group it roots (it is a destination).
// `same` is true when both are the same group (the rank is source and destination of
// one group). `send_first` tells the order in which collectives on the two groups must
// be issued so that no cycle of blocking collectives can form (groups are ordered by
// root rank; DistDL issue 87).
typedef struct ddl_group_pair {
    ddl_group send, recv;
    bool      same;
    bool      send_first;
} ddl_group_pair;

// Builds the groups of DistDL's broadcast rules: P_src is left-padded with ones (after
// reversal when transpose_src) and each of its dims must equal P_dest's (reversed when
// transpose_dest) or be 1. Collective over the union of P_src and P_dest; EINVAL (same
// outcome on every rank) when the partitions do not fit the rules.
DDL_EXTERN ddl_status ddl_group_pair_broadcast(const ddl_partition_t *P_src,
                                               const ddl_partition_t *P_dest, bool transpose_src,
                                               bool transpose_dest, ddl_group_pair *out);
// The mirror rules for a sum-reduction: P_dest is left-padded with ones (after
// reversal when transpose_dest) and each of its dims must equal P_src's or be 1.
DDL_EXTERN ddl_status ddl_group_pair_reduce(const ddl_partition_t *P_src,
                                            const ddl_partition_t *P_dest, bool transpose_src,
                                            bool transpose_dest, ddl_group_pair *out);
// Frees the communicators of a group pair. NULL-safe, idempotent.
DDL_EXTERN void ddl_group_pair_free(ddl_group_pair *g);

#ifdef __cplusplus
}
#endif
#endif // DDL_PARTITION_H
