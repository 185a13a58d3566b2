// ddl/primitives.h: the five parallel data-movement primitives of DistDL, each a
// linear operator with its exact adjoint.
//
//   Broadcast     P_x -> P_y   y_j = x_{src(j)}            adjoint: sum-reduce
//   SumReduce     P_x -> P_y   y_j = sum_{i: dst(i)=j} x_i adjoint: broadcast
//   AllSumReduce  P over axes  y = sum over the group      self-adjoint
//   Repartition   P_x -> P_y   a permutation of entries    adjoint: the inverse remap
//   HaloExchange  P            ghosts <- neighbours' bulk  adjoint: ghosts added back
//
// Each primitive is a *plan*, built once by `_create` (partners, boxes, communicators,
// buffers), then executed any number of times by `_forward` and `_adjoint`, which
// allocate nothing. `_create` is collective over the ranks of the partitions involved;
// ranks outside them may call it too and get a plan that does nothing. A
// configuration that breaks the rules is refused with DDL_EINVAL and a message
// (ddl_last_error()) on every rank alike: every rank knows every partition's shape and
// ranks, so validation needs no communication and cannot hang.
//
// Conventions:
//  - Tensors passed to forward/adjoint must have the plan's local shapes on this rank
//    (ddl_*_x_shape / _y_shape); inactive ranks pass zero-volume tensors.
//  - forward writes y and adjoint writes dx: they overwrite their output (DistDL's
//    functions return fresh tensors). Accumulation into gradients is the layers' job.
//  - The inner product of the distributed space is the sum of the local dot products,
//    and for every plan F: <F x, y> == <x, F* y> (the adjoint test).
#ifndef DDL_PRIMITIVES_H
#define DDL_PRIMITIVES_H

#include <stdbool.h>
#include <stdint.h>

#include "ddl/decomp.h"
#include "ddl/partition.h"
#include "ddl/status.h"
#include "ddl/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- Broadcast -------------------------------------------------------------
// Copies the (whole) local tensor of each P_x rank onto the P_y ranks of its colour
// (DistDL broadcast rules; see ddl_group_pair_broadcast). `shape` is the local shape of
// the tensor on P_x ranks, and of its copies on P_y ranks. Identity (no communication)
// when every group has one member, e.g. P_x == P_y without transposition. On a rank
// that is source and destination of one group, x and y may be the same tensor (in
// place, as MPI_IN_PLACE); the same holds for SumReduce and for both adjoints.
typedef struct ddl_broadcast ddl_broadcast_t;
DDL_EXTERN ddl_status ddl_broadcast_create(const ddl_partition_t *P_x, const ddl_partition_t *P_y,
                                           bool transpose_src, bool transpose_dest, ddl_dtype dt,
                                           const ddl_shape *shape, ddl_broadcast_t **out);
DDL_EXTERN void       ddl_broadcast_destroy(ddl_broadcast_t **b);
DDL_EXTERN ddl_shape  ddl_broadcast_x_shape(const ddl_broadcast_t *b);
DDL_EXTERN ddl_shape  ddl_broadcast_y_shape(const ddl_broadcast_t *b);
// y = B x. Collective over P_x and P_y.
DDL_EXTERN ddl_status ddl_broadcast_forward(const ddl_broadcast_t *b, const ddl_tensor_t *x,
                                            ddl_tensor_t *y);
// dx = B* dy (a sum-reduce onto P_x).
DDL_EXTERN ddl_status ddl_broadcast_adjoint(const ddl_broadcast_t *b, const ddl_tensor_t *dy,
                                            ddl_tensor_t *dx);
// True when this rank is the source and one of the destinations of one group, so forward
// and adjoint may take one tensor as both input and output here. For the forward (a
// fan-out) a caller that can keep its input as its output should: out of place, the
// root first copies the whole tensor into its own output, which costs as much as the
// broadcast itself on shared memory (1.84-2.16x MPI_Bcast at 64 MiB, in place 1.05-1.07x).
// The adjoint (a fan-in) gains nothing in place with Open MPI, whose MPI_Reduce with
// MPI_IN_PLACE copies the root's buffer into a temporary it allocates. Not collective.
DDL_EXTERN bool       ddl_broadcast_in_place_ok(const ddl_broadcast_t *b);

// ---- SumReduce -------------------------------------------------------------
// Sums the local tensors of the P_x ranks of each colour onto one P_y rank (DistDL
// reduction rules; see ddl_group_pair_reduce). `shape` is the local shape everywhere.
typedef struct ddl_sum_reduce ddl_sum_reduce_t;
DDL_EXTERN ddl_status ddl_sum_reduce_create(const ddl_partition_t *P_x, const ddl_partition_t *P_y,
                                            bool transpose_src, bool transpose_dest, ddl_dtype dt,
                                            const ddl_shape *shape, ddl_sum_reduce_t **out);
DDL_EXTERN void       ddl_sum_reduce_destroy(ddl_sum_reduce_t **r);
DDL_EXTERN ddl_shape  ddl_sum_reduce_x_shape(const ddl_sum_reduce_t *r);
DDL_EXTERN ddl_shape  ddl_sum_reduce_y_shape(const ddl_sum_reduce_t *r);
DDL_EXTERN ddl_status ddl_sum_reduce_forward(const ddl_sum_reduce_t *r, const ddl_tensor_t *x,
                                             ddl_tensor_t *y);
// dx = R* dy (a broadcast back onto P_x).
DDL_EXTERN ddl_status ddl_sum_reduce_adjoint(const ddl_sum_reduce_t *r, const ddl_tensor_t *dy,
                                             ddl_tensor_t *dx);
// True when this rank is a source and the destination of one group (x and y may be one
// tensor here; see ddl_broadcast_in_place_ok). Not collective.
DDL_EXTERN bool       ddl_sum_reduce_in_place_ok(const ddl_sum_reduce_t *r);

// ---- AllSumReduce ----------------------------------------------------------
// Sums the local tensors over the ranks of P that share their coordinates in every
// dimension not listed in axes (naxes may be 0: identity), leaving the sum on each.
// Self-adjoint. `shape` is the local shape on every active rank.
typedef struct ddl_all_sum_reduce ddl_all_sum_reduce_t;
DDL_EXTERN ddl_status ddl_all_sum_reduce_create(const ddl_partition_t *P, int naxes,
                                                const int *axes, ddl_dtype dt,
                                                const ddl_shape *shape,
                                                ddl_all_sum_reduce_t **out);
DDL_EXTERN void       ddl_all_sum_reduce_destroy(ddl_all_sum_reduce_t **a);
DDL_EXTERN ddl_shape  ddl_all_sum_reduce_shape(const ddl_all_sum_reduce_t *a);
DDL_EXTERN ddl_status ddl_all_sum_reduce_forward(const ddl_all_sum_reduce_t *a,
                                                 const ddl_tensor_t *x, ddl_tensor_t *y);
DDL_EXTERN ddl_status ddl_all_sum_reduce_adjoint(const ddl_all_sum_reduce_t *a,
                                                 const ddl_tensor_t *dy, ddl_tensor_t *dx);

// ---- Repartition -----------------------------------------------------------
// Moves a tensor of global shape `global` from its decomposition over P_x onto the
// balanced decomposition over P_y (any two Cartesian partitions of the tensor's
// dimension; overlapping or disjoint). Scatter (P_x of one rank) and gather (P_y of one
// rank) are special cases. x_local, when not NULL, is this rank's local input shape and
// may be unbalanced (the pieces must still form a grid: one extent per partition
// coordinate per dimension); NULL means balanced. Refuses partitions whose dimension
// differs from the tensor's and partitions that split a dimension of global size 1.
// When P_x equals P_y and the input is balanced, forward and adjoint are local copies.
// Collective over the union of P_x and P_y (it exchanges the local shapes when
// x_local is given, and agrees on validity).
typedef struct ddl_repartition ddl_repartition_t;
DDL_EXTERN ddl_status ddl_repartition_create(const ddl_partition_t *P_x,
                                             const ddl_partition_t *P_y, ddl_dtype dt,
                                             const ddl_shape *global, const ddl_shape *x_local,
                                             ddl_repartition_t **out);
DDL_EXTERN void       ddl_repartition_destroy(ddl_repartition_t **t);
DDL_EXTERN ddl_shape  ddl_repartition_x_shape(const ddl_repartition_t *t);
DDL_EXTERN ddl_shape  ddl_repartition_y_shape(const ddl_repartition_t *t);
// True when the plan moves nothing between ranks (identity shortcut).
DDL_EXTERN bool       ddl_repartition_is_local(const ddl_repartition_t *t);
DDL_EXTERN ddl_status ddl_repartition_forward(const ddl_repartition_t *t, const ddl_tensor_t *x,
                                              ddl_tensor_t *y);
// dx = T* dy = T^{-1} dy.
DDL_EXTERN ddl_status ddl_repartition_adjoint(const ddl_repartition_t *t, const ddl_tensor_t *dy,
                                              ddl_tensor_t *dx);

// ---- HaloExchange ----------------------------------------------------------
// Fills the ghost regions of padded local buffers of a tensor of global shape `global`
// decomposed balanced over P, for a sliding window with kernel, stride, padding and
// dilation given per dimension (P's ndim entries each; use 1, 1, 0, 1 for
// dimensions without a window). Each rank's buffer has shape ddl_halo_exchange_shape:
// per dimension [ghost_lo | pad_lo | bulk | pad_hi | ghost_hi] (see ddl_halo_dim). The
// global zero padding is materialised on boundary ranks and is never exchanged.
// Forward copies the neighbours' bulk into the ghosts, dimension by dimension (0 up),
// in place; the adjoint adds the ghosts into the neighbours' bulk and zeroes them, in
// reverse dimension order (the low neighbour's contribution first, whichever arrives
// first, so the sums are the same run to run). Collective over P.
typedef struct ddl_halo_exchange ddl_halo_exchange_t;
DDL_EXTERN ddl_status ddl_halo_exchange_create(const ddl_partition_t *P, ddl_dtype dt,
                                               const ddl_shape *global, const int64_t *kernel,
                                               const int64_t *stride, const int64_t *padding,
                                               const int64_t *dilation,
                                               ddl_halo_exchange_t **out);
DDL_EXTERN void       ddl_halo_exchange_destroy(ddl_halo_exchange_t **h);
// Shape of this rank's padded buffer (zero-volume when inactive).
DDL_EXTERN ddl_shape  ddl_halo_exchange_shape(const ddl_halo_exchange_t *h);
// Where the rank's unpadded local input sits inside the buffer.
DDL_EXTERN ddl_box    ddl_halo_exchange_bulk_box(const ddl_halo_exchange_t *h);
// The part of the buffer the local window operator needs (surplus input cropped).
DDL_EXTERN ddl_box    ddl_halo_exchange_needed_box(const ddl_halo_exchange_t *h);
// Per-dimension halo description of this rank (ndim entries; NULL when inactive).
DDL_EXTERN const ddl_halo_dim *ddl_halo_exchange_dims(const ddl_halo_exchange_t *h);
// Sets the global padding of this rank's buffer (the pad_lo and pad_hi slabs of every
// dimension) to v: a buffer shared with other users has its pads restored before each
// use; the exchange itself never writes them. Local; nothing when inactive.
DDL_EXTERN void       ddl_halo_exchange_fill_pads(const ddl_halo_exchange_t *h, ddl_tensor_t *buf,
                                                  double v);
DDL_EXTERN ddl_status ddl_halo_exchange_forward(const ddl_halo_exchange_t *h, ddl_tensor_t *buf);
DDL_EXTERN ddl_status ddl_halo_exchange_adjoint(const ddl_halo_exchange_t *h, ddl_tensor_t *buf);
// Split phase, to hide the exchange behind computation (issue 19, item 5): _start checks
// the buffer and posts the first step's transfers (forward: dimension 0; adjoint: the
// last), and ddl_halo_exchange_finish completes them and runs the remaining steps. In
// between the caller may compute on anything but `buf`, which it must neither read nor
// write; no other exchange of this plan may start. The same results, bit for bit, and the
// same traffic as the one-call forms; the time of start, progress and finish counts as the
// exchange's.
// Collective over P as a pair: every rank starts and finishes, in the same order
// relative to its other communication. A _start that failed after posting leaves the
// exchange in flight (ddl_halo_exchange_in_flight): finish it, then report the failure.
// Over shared memory a transfer past the eager size moves only inside MPI calls on both
// sides: call ddl_halo_exchange_progress now and then during the computation (the conv
// layer does it through ddl_kernel_progress_set), or the data moves in finish. Progress
// completes what has arrived without waiting and posts the next step once one is done;
// it is a no-op with nothing in flight. Local (no collective), allocates nothing.
DDL_EXTERN ddl_status ddl_halo_exchange_forward_start(ddl_halo_exchange_t *h, ddl_tensor_t *buf);
DDL_EXTERN ddl_status ddl_halo_exchange_adjoint_start(ddl_halo_exchange_t *h, ddl_tensor_t *buf);
DDL_EXTERN ddl_status ddl_halo_exchange_progress(ddl_halo_exchange_t *h);
DDL_EXTERN ddl_status ddl_halo_exchange_finish(ddl_halo_exchange_t *h);
DDL_EXTERN bool       ddl_halo_exchange_in_flight(const ddl_halo_exchange_t *h);

// ---- Traffic counters ------------------------------------------------------
// Every process counts the payload bytes its primitives exchanged with other ranks,
// per primitive kind and pass (forward, adjoint), since start or the last reset: what
// this rank's data other ranks needed (sent) and what it needed of theirs (received),
// as direct messages; self copies are not counted. Collectives count per group of g
// ranks and tensor of B bytes: a broadcast root sends (g-1)B and every other member
// receives B; a sum-reduce root receives (g-1)B and every other member sends B; an
// all-sum-reduce member sends and receives (g-1)B. Repartition and HaloExchange count
// the exact boxes and slabs sent and received. Summed over ranks, sent == received.
// `calls` counts the forward/adjoint executions on this rank (zero-byte ones too).
// Main thread only (not thread-safe); allocates nothing.
typedef enum {
    DDL_TRAFFIC_BROADCAST,
    DDL_TRAFFIC_SUM_REDUCE,
    DDL_TRAFFIC_ALL_SUM_REDUCE,
    DDL_TRAFFIC_REPARTITION,
    DDL_TRAFFIC_HALO_EXCHANGE,
    DDL_TRAFFIC_ALL_MAX_REDUCE,  // not a primitive: cross-entropy's row maxima (MPI_MAX)
    DDL_TRAFFIC_NKINDS
} ddl_traffic_kind;

typedef enum { DDL_TRAFFIC_FORWARD, DDL_TRAFFIC_ADJOINT, DDL_TRAFFIC_NPASSES } ddl_traffic_pass;

typedef struct ddl_traffic_count {
    uint64_t sent, received, calls;
} ddl_traffic_count;

typedef struct ddl_traffic {
    ddl_traffic_count c[DDL_TRAFFIC_NKINDS][DDL_TRAFFIC_NPASSES];
} ddl_traffic;

// Copies this process's counters into *out.
DDL_EXTERN void        ddl_traffic_snapshot(ddl_traffic *out);
// Sets this process's counters to zero.
DDL_EXTERN void        ddl_traffic_reset(void);
// "broadcast", "sum_reduce", "all_sum_reduce", "repartition", "halo_exchange",
// "all_max_reduce".
DDL_EXTERN const char *ddl_traffic_kind_name(ddl_traffic_kind kind);
// *out = a - b, entry by entry (the traffic between two snapshots, b taken first).
DDL_EXTERN void        ddl_traffic_sub(const ddl_traffic *a, const ddl_traffic *b,
                                       ddl_traffic *out);
// *acc += d, entry by entry.
DDL_EXTERN void        ddl_traffic_add(ddl_traffic *acc, const ddl_traffic *d);
// Sent and received bytes of t summed over every kind and both passes (calls too).
DDL_EXTERN ddl_traffic_count ddl_traffic_total(const ddl_traffic *t);

// Wall time this process spent inside each primitive's forward and adjoint, in seconds
// (from the call to its return: the copies, MPI, and the wait for the partners), summed
// since the start or the last reset. Apart from the byte counters, which are exact and
// alike run to run: times are a profile (bench-train-worker prints each kind's share of a
// training step). Upsample's gathers count as halo_exchange, as their bytes do.
typedef struct ddl_traffic_time {
    double s[DDL_TRAFFIC_NKINDS][DDL_TRAFFIC_NPASSES];
} ddl_traffic_time;
DDL_EXTERN void ddl_traffic_time_snapshot(ddl_traffic_time *out);

// What one execution of a Repartition plan moves for this rank (sent, received; calls 1):
// the same amounts the counters add for it. Lets a caller account for a plan it runs
// outside any layer (a model's input and output plans) without snapshots.
DDL_EXTERN ddl_traffic_count ddl_repartition_traffic(const ddl_repartition_t *t,
                                                     ddl_traffic_pass pass);

#ifdef __cplusplus
}
#endif
#endif // DDL_PRIMITIVES_H
