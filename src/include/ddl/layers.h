// ddl/layers.h: distributed layers = primitives composed with sequential kernels.
//
// A layer maps a distributed input x (global shape x_global, decomposed balanced over
// P_in) to a distributed output y (y_global over P_out). Its backward is the reverse
// composition of its parts' adjoints: given dy it writes dx and ACCUMULATES (+=) into
// the gradients of its parameters (ddl_layer_zero_grad clears them).
//
// Parameters follow DistDL's placement: each global element of a parameter lives on
// exactly one owner rank (Linear: blocks over P_w with the bias on column 0; feature
// conv: rank 0 of P_x, broadcast to the others; ...). ddl_param records the global
// shape (PyTorch layout) and the box of it held on this rank, so initialization is
// partition-invariant (a value depends only on the seed and the global index) and
// parameters can be gathered, checkpointed and redistributed generically.
//
// Every rank calls every layer function (ranks outside a layer's partitions pass and
// receive zero-volume tensors). Creation is collective over the world of the
// partitions and fails alike on every rank for a bad configuration.
#ifndef DDL_LAYERS_H
#define DDL_LAYERS_H

#include <stdbool.h>
#include <stdint.h>

#include "ddl/kernels.h"
#include "ddl/kernels_pointwise.h"
#include "ddl/partition.h"
#include "ddl/primitives.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DDL_LAYER_MAX_PARAMS 4

typedef enum {
    DDL_INIT_NONE = 0,
    DDL_INIT_KAIMING_UNIFORM,  // U(-b, b), b = sqrt(6 / ((1 + a^2) fan_in)), a = sqrt(5) (PyTorch)
    DDL_INIT_FAN_IN_UNIFORM,   // U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (PyTorch's bias init)
    DDL_INIT_ONES,
    DDL_INIT_ZEROS,
} ddl_init_kind;

typedef struct ddl_param {
    char          name[32];  // "weight", "bias"
    ddl_shape     global;    // PyTorch layout (conv [C_out, C_in, k...], linear [out, in])
    ddl_box       box;       // the global box held on this rank (empty when not an owner)
    ddl_tensor_t *value;     // local piece, shape = box shape
    ddl_tensor_t *grad;      // same shape; accumulated by backward
    ddl_init_kind init;
    int64_t       fan_in;
} ddl_param;

// A layer (opaque: read it through the accessors below; the struct and the helpers
// that build layers are internal, src/layers/layer_impl.h).
typedef struct ddl_layer ddl_layer_t;

// The payload a layer's most recent calls moved for this rank (ddl_traffic deltas over
// each call; ddl/primitives.h). A backward may run primitives' forwards (batch norm sums
// its statistics), so each entry keeps every kind and pass. A training forward and an
// evaluation forward move different amounts (batch norm's statistics), hence two.
typedef struct ddl_layer_traffic {
    ddl_traffic forward_train;  // the last forward in training mode
    ddl_traffic forward_eval;   // the last forward in evaluation mode
    ddl_traffic backward;       // the last backward
} ddl_layer_traffic;

// ---- framework ---------------------------------------------------------------
// y = L(x). x and y must have the layer's local shapes on this rank. As with autograd's
// saved tensors, a layer may keep references to the x and y of its last forward instead
// of copies: the caller must leave both unchanged until the matching backward (the model
// does: every activation has its own buffer for the whole step).
// Collective over the base communicator of the layer's partitions: every rank of it calls
// (ranks outside the layer with zero-volume tensors). The local checks of x and y are
// agreed on (ddl_agree) before the layer communicates, so a wrong tensor on one rank
// fails every rank with that rank's message (DDL_ESHAPE) and none is left blocked
// (unless the caller fixed its tensors: ddl_layer_set_io_fixed).
DDL_EXTERN ddl_status ddl_layer_forward(ddl_layer_t *L, const ddl_tensor_t *x, ddl_tensor_t *y);
// dx = (dL/dx)^T dy (overwrites dx); parameter gradients += (dL/dp)^T dy. Needs the
// state saved by the most recent forward. Collective and agreed like forward.
DDL_EXTERN ddl_status ddl_layer_backward(ddl_layer_t *L, const ddl_tensor_t *dy, ddl_tensor_t *dx);

// Multi-input layers (add, concat): the same contract with n input tensors, xs[k] of
// local shape ddl_layer_input_shape(L, k) (dxs[k] likewise; backward_n OVERWRITES every
// dxs[k]). n must be the layer's ddl_layer_num_inputs. The local checks of every
// tensor are agreed on before the layer communicates, as above. Calling
// ddl_layer_forward/backward on a multi-input layer, or these on a one-input layer, is
// refused (DDL_EINVAL, on every rank alike).
DDL_EXTERN ddl_status ddl_layer_forward_n(ddl_layer_t *L, int n, const ddl_tensor_t *const *xs,
                                          ddl_tensor_t *y);
DDL_EXTERN ddl_status ddl_layer_backward_n(ddl_layer_t *L, const ddl_tensor_t *dy, int n,
                                           ddl_tensor_t *const *dxs);
// The number of inputs: 1 for every one-input layer.
DDL_EXTERN int        ddl_layer_num_inputs(const ddl_layer_t *L);
// Local shape of input k on this rank (k = 0 of a one-input layer: its x shape); the
// zero-volume shape [0] for k outside [0, ddl_layer_num_inputs).
DDL_EXTERN ddl_shape  ddl_layer_input_shape(const ddl_layer_t *L, int k);
// Global shape of input k (the same conventions).
DDL_EXTERN ddl_shape  ddl_layer_input_global(const ddl_layer_t *L, int k);

// Accessors (not collective). Local shapes are this rank's blocks (zero-volume outside
// the layer's partitions); a multi-input layer's x shapes are those of input 0. The
// shapes are the layer's own (valid while it lives), so they pass straight to
// ddl_tensor_create and friends.
DDL_EXTERN const char      *ddl_layer_kind(const ddl_layer_t *L);  // "conv", "add", ...
DDL_EXTERN ddl_dtype        ddl_layer_dtype(const ddl_layer_t *L);
DDL_EXTERN const ddl_shape *ddl_layer_x_shape(const ddl_layer_t *L);
DDL_EXTERN const ddl_shape *ddl_layer_y_shape(const ddl_layer_t *L);
DDL_EXTERN const ddl_shape *ddl_layer_x_global(const ddl_layer_t *L);
DDL_EXTERN const ddl_shape *ddl_layer_y_global(const ddl_layer_t *L);
// The partitions x (every input) and y are balanced over (borrowed from the creator).
DDL_EXTERN const ddl_partition_t *ddl_layer_P_in(const ddl_layer_t *L);
DDL_EXTERN const ddl_partition_t *ddl_layer_P_out(const ddl_layer_t *L);
DDL_EXTERN bool                   ddl_layer_training(const ddl_layer_t *L);
// Parameters in the layer's order ("weight" before "bias"); ddl_layer_param gives NULL
// for i outside [0, ddl_layer_nparams). The ddl_param is owned by the layer (its value
// may be written, e.g. to load a checkpoint).
DDL_EXTERN int                    ddl_layer_nparams(const ddl_layer_t *L);
DDL_EXTERN ddl_param             *ddl_layer_param(ddl_layer_t *L, int i);

// NULL-safe; sets *L to NULL.
DDL_EXTERN void       ddl_layer_destroy(ddl_layer_t **L);
DDL_EXTERN void       ddl_layer_zero_grad(ddl_layer_t *L);
DDL_EXTERN void       ddl_layer_set_training(ddl_layer_t *L, bool training);
// Ties a random layer's draws (dropout masks) to a caller step, e.g. the optimizer step, so
// a resumed run draws what the uninterrupted one did. Without it a layer counts its own
// training forwards.
DDL_EXTERN void       ddl_layer_set_rng_step(ddl_layer_t *L, uint64_t step);
// Tells the layer that its caller ignores the input gradient dx of backward (a model's
// first layer with parameters: nothing before it needs a gradient). Backward then skips
// the communication that only assembles dx (Linear's sum-reduce of the partial dx up
// the columns of P_w, a convolution's halo adjoint and its sum over co; a convolution
// does not compute its local dx either), and leaves dx unspecified; parameter gradients
// are unchanged. Every rank must set the same value.
DDL_EXTERN void       ddl_layer_set_dx_unused(ddl_layer_t *L, bool unused);
// Asks backward to add the input gradient into dx instead of overwriting it (a model's
// later consumer of a tensor, which would otherwise write a scratch copy and add that in).
// Returns whether the layer does: a convolution whose kernel writes this rank's input
// block in place (no halo, no fan-out over channels, no staging), which adds each element
// of its own dx into dx once, so the sum is the one the copy would have given. Other
// layers keep overwriting; add false restores that. Local: ranks may differ.
DDL_EXTERN bool ddl_layer_set_dx_add(ddl_layer_t *L, bool add);
// Halo exchanges behind computation (issue 19, item 5), for the convolutions on a feature
// partition that keep their own halo buffers: backward computes dx first, starts its
// exchange (H*), and computes dw and sums it onto the owners (B_w*) while the exchange
// runs, moved on by progress calls from inside the kernels (ddl_kernel_progress_set).
// The same bits either way, and the same messages in the same order (ranks may differ).
// On (1) unless DDL_HALO_OVERLAP is 0 at the first call (the engine refuses values other
// than 0 and 1 with the spec; here they warn and mean the default); the setter returns
// the previous value. Read at every backward: change it between steps only.
#define DDL_HALO_OVERLAP_DEFAULT 1
DDL_EXTERN bool ddl_halo_overlap(void);
DDL_EXTERN bool ddl_halo_overlap_set(bool on);
// Tells the layer that its caller passes tensors it built from the layer's own shapes
// and dtype (a model's activation buffers): forward and backward then check them on
// this rank only and skip the agreement on them, one allreduce over the layer's ranks
// per call. A tensor that fails the check then is the caller's bug and aborts the
// process. Every rank must set the same value.
DDL_EXTERN void ddl_layer_set_io_fixed(ddl_layer_t *L, bool fixed);
// Initializes every parameter from (seed, stream_base + parameter index) by global index.
DDL_EXTERN void       ddl_layer_init_params(ddl_layer_t *L, uint64_t seed, uint64_t stream_base);
// Traffic accounting around one call of a layer's ops (ddl_layer_forward and _backward
// do it; anything else that calls L->ops directly brackets the call the same way):
// begin snapshots the process counters into *mark, end stores what moved since into
// L->traffic (forward: the slot of L->training). Local, allocates nothing.
DDL_EXTERN void       ddl_layer_traffic_begin(ddl_traffic *mark);
DDL_EXTERN void       ddl_layer_traffic_end(ddl_layer_t *L, bool backward, const ddl_traffic *mark);

// Fills t with uniform [-1, 1) values by global flat index (a partition-invariant
// random tensor: the same global values whatever the decomposition).
DDL_EXTERN void ddl_fill_global_uniform(ddl_tensor_t *t, const ddl_box *box,
                                        const ddl_shape *global, uint64_t seed, uint64_t stream);

// ---- layers ------------------------------------------------------------------
// Each constructor validates everything before any communication (same verdict on
// every rank, DDL_EINVAL with a message naming the value) and is collective over the
// union of the partitions it is given. Partitions are borrowed and must outlive the
// layer. Local shapes: ddl_layer_x_shape / ddl_layer_y_shape.

// Linear (DistDL DistributedLinear): x [batch, in] over P_x = [1, P_fi], weight [out, in]
// over P_w = [P_fo, P_fi] (block (r, c) on P_w rank (r, c); bias [out] on column 0),
// y [batch, out] over P_y = [1, P_fo]. y = SumReduce_{P_w -> P_y, transpose_src}(
// x_local W_rc^T + b_r) after x is broadcast from P_x down the columns of P_w.
// Parameters: "weight" (Kaiming uniform, fan_in = in_features), then "bias" if bias.
// EINVAL unless P_x [1, a], P_y [1, b], P_w [b, a] share one base, and sizes >= 1.
DDL_EXTERN ddl_status ddl_linear_create(const ddl_partition_t *P_x, const ddl_partition_t *P_y,
                                        const ddl_partition_t *P_w, ddl_dtype dt, int64_t batch,
                                        int64_t in_features, int64_t out_features, bool bias,
                                        ddl_layer_t **out);

// Convolution 1/2/3-D (nsp spatial dims). x_global [N, C_in, spatial...].
//  - only P_x given (P_y = P_w = NULL): feature-partitioned, P_x = [1, 1, S...]; weight
//    and bias on P_x rank 0, broadcast to the others; halo exchange on the input.
//  - P_y and P_w given and every spatial entry of P_x, P_y is 1: channel-partitioned,
//    P_x [1, P_ci, 1...], P_y [1, P_co, 1...], P_w [P_co, P_ci, 1...].
//  - P_y and P_w given otherwise: general (channels and space), P_w [P_co, P_ci, S...].
// Giving exactly one of P_y / P_w is an error (DistDL's selector).
typedef struct ddl_conv_params {
    int     nsp;
    int64_t in_channels, out_channels;
    int64_t kernel[3], stride[3], padding[3], dilation[3];
    bool    bias;
} ddl_conv_params;
DDL_EXTERN ddl_status ddl_conv_create(const ddl_partition_t *P_x, const ddl_partition_t *P_y,
                                      const ddl_partition_t *P_w, ddl_dtype dt,
                                      const ddl_shape *x_global, const ddl_conv_params *p,
                                      ddl_layer_t **out);

// Max / average pooling 1/2/3-D on a feature partition P_x = [1, 1, S...] (halo
// exchange). stride 0 means stride = kernel (PyTorch's default; DistDL defaults to 1,
// which we do not follow). Average pooling counts padding (count_include_pad=True) and
// refuses dilation != 1.
typedef struct ddl_pool_params {
    int           nsp;
    ddl_pool_mode kind;
    int64_t       kernel[3], stride[3], padding[3], dilation[3];
} ddl_pool_params;
DDL_EXTERN ddl_status ddl_pool_create(const ddl_partition_t *P_x, ddl_dtype dt,
                                      const ddl_shape *x_global, const ddl_pool_params *p,
                                      ddl_layer_t **out);

// Batch normalization over dim 1 of x [N, C, spatial...] partitioned any way by P_x.
// Statistics by SumReduce to the [0, c, 0...] ranks (P_sum, shape [1, P_c, 1...]) and
// Broadcast back; gamma ("weight", init 1) and beta ("bias", init 0), both [C], live on
// those ranks (piece c on P_sum rank c). Running statistics use PyTorch's unbiased
// variance. momentum < 0 means the cumulative average (PyTorch's momentum=None); eps
// >= 0, momentum <= 1. Training needs N * prod(spatial) > 1 (checked by forward).
DDL_EXTERN ddl_status ddl_batchnorm_create(const ddl_partition_t *P_x, ddl_dtype dt,
                                           const ddl_shape *x_global, double eps, double momentum,
                                           bool affine, ddl_layer_t **out);
// The running statistics of a batch-norm layer (state, not parameters): every rank of
// P_x holds running_mean and running_var ([C_loc], the layer's dtype) for its own
// channels (the channel range of ddl_partition_local_box(P_x, x_global)); ranks sharing
// a channel coordinate hold identical copies. Zero-volume outside P_x. The tensors are
// borrowed (owned by the layer; writable, e.g. to restore a checkpoint, but then every
// copy of a channel must be written alike). Either output may be NULL. Not collective.
DDL_EXTERN ddl_status ddl_batchnorm_running_stats(const ddl_layer_t *L, ddl_tensor_t **mean,
                                                  ddl_tensor_t **var);
// Fuses (on) a ReLU onto the layer's output: forward gives relu(batchnorm(x)) and backward
// takes the gradient of that, the same bits as this layer followed by a ReLU layer
// (ddl_batchnorm_normalize_relu). One pass over the activation fewer each way, and the
// caller needs no buffer for the ReLU's output. Call before the first forward (EINVAL
// after it). Not collective; every rank of P_x must set the same.
DDL_EXTERN ddl_status ddl_batchnorm_fuse_relu(ddl_layer_t *L, bool on);

// Upsampling (nearest / linear) of x [N, C, spatial...] (1 to 3 spatial dims), with
// The largest scale_factor accepted; larger ones are refused (EINVAL), as are outputs
// past DDL_MAX_TENSOR_ELEMENTS.
#define DDL_UPSAMPLE_MAX_SCALE 1024.0
// torch.nn.Upsample's semantics; give scale_factor (per spatial dim; output
// floor(in * scale)) or size (per spatial dim), the other NULL. align_corners needs the
// linear mode (as in PyTorch). x and y are balanced over the same P_x, which may split
// any dims (typically [1, 1, S...]); each rank gathers the input range its output reads
// from whichever ranks hold it (point-to-point, planned in create), so halos may reach
// past the neighbours (downsampling). No parameters; the layer is linear.
typedef enum { DDL_UPSAMPLE_NEAREST = 0, DDL_UPSAMPLE_LINEAR = 1 } ddl_upsample_mode;
DDL_EXTERN ddl_status ddl_upsample_create(const ddl_partition_t *P_x, ddl_dtype dt,
                                          const ddl_shape *x_global, ddl_upsample_mode mode,
                                          bool align_corners, const double *scale_factor,
                                          const int64_t *size, ddl_layer_t **out);
// The most bytes of per-call buffers (the gathered input window and the send and receive
// staging) that one block of x_global split pshape-way (the P_x shape, per dim) holds:
// what ddl_model_estimate counts for the layer. Pure: no MPI.
DDL_EXTERN ddl_status ddl_upsample_scratch_bytes(ddl_dtype dt, const ddl_shape *x_global,
                                                 const int *pshape, ddl_upsample_mode mode,
                                                 bool align_corners, const double *scale_factor,
                                                 const int64_t *size, size_t *bytes);

// Repartition as a layer: x over P_x to y over P_y (same global shape).
DDL_EXTERN ddl_status ddl_repartition_layer_create(const ddl_partition_t *P_x,
                                                   const ddl_partition_t *P_y, ddl_dtype dt,
                                                   const ddl_shape *x_global, ddl_layer_t **out);

// Flatten [N, C, spatial...] over P_x = [P_n, P_c, 1...] to [N, C * prod(spatial)] over
// P_y = [P_n, P_c] (same ranks); rebalances with a Repartition when the channel split
// does not give balanced feature blocks. EINVAL when P_x splits a spatial dim or when
// P_y is not [P_n, P_c] on the same ranks in the same order.
DDL_EXTERN ddl_status ddl_flatten_create(const ddl_partition_t *P_x, const ddl_partition_t *P_y,
                                         ddl_dtype dt, const ddl_shape *x_global,
                                         ddl_layer_t **out);

// Pointwise activations on any partition (local): ReLU, LeakyReLU(alpha), Sigmoid,
// Tanh, GELU, and Dropout(p = alpha; identity when not training; the mask is drawn by
// global index so it does not depend on the partition). Dropout's k-th training forward
// (k = 0, 1, ...) keeps element g iff ddl_rng_uniform(seed, k, g) >= p: a fresh mask per
// step, the same on every partition; backward uses the mask of the last forward.
typedef enum {
    DDL_ACT_RELU = 0,
    DDL_ACT_LEAKY_RELU,
    DDL_ACT_SIGMOID,
    DDL_ACT_TANH,
    DDL_ACT_GELU,
    DDL_ACT_DROPOUT,
} ddl_act_kind;
DDL_EXTERN ddl_status ddl_activation_create(const ddl_partition_t *P_x, ddl_dtype dt,
                                            const ddl_shape *x_global, ddl_act_kind kind,
                                            double alpha, uint64_t seed, ddl_layer_t **out);

// ---- joins and global pooling (graph models) ---------------------------------
// Add (residual connections): y = x_0 + ... + x_{n-1} for n >= 2 operands of one global
// shape x_global, all balanced over P_x like y; backward: every dx_k = dy. Local (no
// communication); no parameters; linear. A multi-input layer (ddl_layer_forward_n).
DDL_EXTERN ddl_status ddl_add_create(const ddl_partition_t *P_x, ddl_dtype dt,
                                     const ddl_shape *x_global, int n, ddl_layer_t **out);
// Fuses (on) a ReLU onto the add's output: forward gives relu(x_0 + ... + x_{n-1}) and
// backward takes the gradient of that (dy [y > 0], to every operand), the same bits as
// this layer followed by a ReLU layer. One pass over the activation fewer forward, and the
// caller needs no buffer for the ReLU's output; the layer then keeps a reference to its
// y. Call before the first forward (EINVAL after it). Not collective; every rank of P_x
// must set the same.
DDL_EXTERN ddl_status ddl_add_fuse_relu(ddl_layer_t *L, bool on);

// Concatenation along dim 1 (channels; U-Net skips): n >= 2 operands x_k of global
// shapes x_globals[k], equal except in dim 1, all balanced over P_x, to y (channels in
// operand order) balanced over P_x. P_x must not split dim 1 (its shape[1] is 1), so
// every rank holds all channels of its block and the layer is a local copy; backward
// slices dy back into the dx_k. No parameters; linear. A multi-input layer.
DDL_EXTERN ddl_status ddl_concat_create(const ddl_partition_t *P_x, ddl_dtype dt, int n,
                                        const ddl_shape *x_globals, ddl_layer_t **out);

// Global average pooling over the spatial dims (adaptive_avg_pool to output size 1):
// x [N, C, S_1..S_k] (k >= 1) balanced over P_x = [P_n, P_c, s_1..s_k] (any split), y
// [N, C, 1..1] balanced over the same P_x, i.e. held by the ranks at spatial coordinate
// 0. Each rank sums its spatial box and divides by S_1 ... S_k; a SumReduce over the
// spatial dims of P_x adds the partial means onto the spatial-coordinate-0 ranks. The
// adjoint broadcasts dy back and spreads dy / (S_1 ... S_k) over each rank's box.
// Collective over P_x; no parameters; linear.
DDL_EXTERN ddl_status ddl_global_avgpool_create(const ddl_partition_t *P_x, ddl_dtype dt,
                                                const ddl_shape *x_global, ddl_layer_t **out);

// ---- losses ------------------------------------------------------------------
// A loss of x (over P_x) against a target of the same layout (or integer class labels
// for cross-entropy). With a reduction other than none the value is a scalar on P_x
// rank 0 (local sums reduced by SumReduce; the adjoint broadcasts the upstream gradient
// back to every rank). Cross-entropy takes x [batch, classes] with the class
// dimension split over P_x's dimension 1 (max and sum of exponentials by all-sum-reduce),
// or, as PyTorch's F.cross_entropy on N-d input, x [batch, classes, d1, ..., dk] on a P_x
// that does not split dimension 1 (segmentation: one label per voxel; mean over all
// batch * d1 * ... * dk voxels).
typedef enum {
    DDL_REDUCTION_NONE = 0,
    DDL_REDUCTION_SUM,
    DDL_REDUCTION_MEAN,
    DDL_REDUCTION_BATCHMEAN,  // KL divergence only: sum / batch size
} ddl_reduction;

typedef struct ddl_loss ddl_loss_t;
DDL_EXTERN ddl_status ddl_loss_create(const ddl_partition_t *P_x, ddl_dtype dt,
                                      const ddl_shape *x_global, ddl_loss_kind kind,
                                      ddl_reduction reduction, ddl_loss_t **out);
DDL_EXTERN void       ddl_loss_destroy(ddl_loss_t **l);
// Local shape of x (and of target) on this rank; for cross-entropy the labels are
// int64 [local batch rows], or on N-d input x's local box without dimension 1
// ([local batch, local d1, ..., local dk], row-major).
DDL_EXTERN ddl_shape  ddl_loss_x_shape(const ddl_loss_t *l);
// Forward. target: same local shape as x (NULL for cross-entropy); labels: int64 per
// local batch row (cross-entropy only; per local voxel on N-d input). Reduced losses:
// *value on P_x rank 0 (0 on other ranks). Reduction none: per-element losses into
// `elementwise` (x's local shape; for cross-entropy [local batch rows], held by the
// column-0 ranks of P_x: other ranks pass NULL or a zero-volume tensor, which is
// ignored; on N-d input the labels' local shape, on every rank of P_x). Collective over the base
// communicator of P_x: ranks outside P_x call it too (zero-volume x, value 0) and only
// take part in the agreement on the status. Every rank returns the same status and
// message (ddl_agree): a wrong shape, or a label outside [0, classes) on any rank
// ("label 200 at batch index 17"), is refused (ESHAPE, EINVAL) before any other
// communication; BCE input outside [0, 1] fails (EINVAL) everywhere after the reduction.
// As with a layer's forward, the loss may keep references to x, target and labels
// instead of copies: the caller must leave all three unchanged until the matching
// ddl_loss_backward.
DDL_EXTERN ddl_status ddl_loss_forward(ddl_loss_t *l, const ddl_tensor_t *x,
                                       const ddl_tensor_t *target, const int64_t *labels,
                                       double *value, ddl_tensor_t *elementwise);
// Backward: dx = d(loss)/dx times the upstream gradient (dvalue for reduced losses,
// meaningful on P_x rank 0 and broadcast by the adjoint; the elementwise gradient
// tensor for reduction none). Overwrites dx. Uses the state of the last forward.
// Collective and agreed like forward.
DDL_EXTERN ddl_status ddl_loss_backward(ddl_loss_t *l, double dvalue,
                                        const ddl_tensor_t *delementwise, ddl_tensor_t *dx);
// As ddl_layer_set_io_fixed, for a loss whose caller passes tensors of its shapes and
// labels it checked itself (a model): forward and backward check their arguments on this
// rank only, with no agreement on them; a failure there aborts. BCE input outside [0, 1]
// is still agreed on (it depends on the values). Every rank must set the same value.
DDL_EXTERN void ddl_loss_set_io_fixed(ddl_loss_t *l, bool fixed);
// What the last forward (backward false) or backward moved for this rank (a delta of the
// traffic counters, ddl/primitives.h). Not collective.
DDL_EXTERN void       ddl_loss_traffic(const ddl_loss_t *l, bool backward, ddl_traffic *out);

#ifdef __cplusplus
}
#endif
#endif // DDL_LAYERS_H
