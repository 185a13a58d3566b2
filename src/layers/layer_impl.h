// layers/layer_impl.h: internal: the layer struct and the helpers that build layers
// (not installed; the public API is ddl/layers.h).
//
// Included by the layer implementations (src/layers) and by the few library modules
// that drive layers from the inside: the optimizer and the model (parameters), the
// estimator, distdl-verify's generic checks. Everything else uses the accessors of
// ddl/layers.h, so the struct can change without touching them.
#ifndef DDL_LAYERS_LAYER_IMPL_H
#define DDL_LAYERS_LAYER_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "ddl/layers.h"

#ifdef __cplusplus
extern "C" {
#endif

// A layer has one input (forward/backward) or several (forward_n/backward_n, set by the
// multi-input layers instead): the framework checks the arguments before calling either.
typedef struct ddl_layer_ops {
    ddl_status (*forward)(ddl_layer_t *L, const ddl_tensor_t *x, ddl_tensor_t *y);
    ddl_status (*backward)(ddl_layer_t *L, const ddl_tensor_t *dy, ddl_tensor_t *dx);
    void (*destroy)(ddl_layer_t *L);  // frees impl (params are freed by the framework)
    ddl_status (*forward_n)(ddl_layer_t *L, int n, const ddl_tensor_t *const *xs,
                            ddl_tensor_t *y);
    ddl_status (*backward_n)(ddl_layer_t *L, const ddl_tensor_t *dy, int n,
                             ddl_tensor_t *const *dxs);
    // Optional, for a layer built with scratch_bytes > 0 (ddl_layer_share_scratch): points
    // its per-call buffers into p, a block of scratch_bytes (DDL_ALIGN-aligned) that
    // other layers use between its calls.
    void (*set_scratch)(ddl_layer_t *L, void *p);
    // Optional: whether backward can add dx into its argument instead of overwriting it
    // (ddl_layer_set_dx_add). Without it, the layer overwrites.
    bool (*can_add_dx)(const ddl_layer_t *L);
} ddl_layer_ops;

struct ddl_layer {
    const ddl_layer_ops   *ops;
    char                   kind[32];
    ddl_dtype              dt;
    ddl_shape              x_global, y_global;
    ddl_shape              x_shape, y_shape;  // local shapes on this rank
    // Multi-input layers (ninputs > 1): input k has global shape in_global[k] and local
    // shape in_shape[k], all balanced over P_in; x_global / x_shape repeat input 0's.
    // One-input layers: ninputs 1, the arrays NULL. Set by ddl_layer_set_inputs.
    int                    ninputs;
    ddl_shape             *in_global, *in_shape;
    const ddl_partition_t *P_in, *P_out;      // borrowed: must outlive the layer
    bool                   training;
    bool                   rng_step_set;  // rng_step is driven by the caller
    uint64_t               rng_step;      // the step a random layer (dropout) draws for
    int                    nparams;
    ddl_param              params[DDL_LAYER_MAX_PARAMS];
    ddl_layer_traffic      traffic;   // kept by ddl_layer_traffic_end
    bool                   dx_unused; // the caller ignores dx (ddl_layer_set_dx_unused)
    bool                   dx_add;    // backward adds dx into its argument (ddl_layer_set_dx_add)
    bool                   io_fixed;  // no agreement on the tensors (ddl_layer_set_io_fixed)
    bool                   borrowed;  // params[k].value borrowed, no grad (lend_params)
    bool                   forwarded; // a forward was called (on every rank alike: collective)
    size_t                 scratch_bytes; // its share of the shared scratch (share_scratch)
    bool                   scratch_set;   // ddl_layer_set_scratch was called
    void                  *impl;
};

// A check of a tensor its caller fixed (ddl_layer_set_io_fixed, ddl_loss_set_io_fixed):
// DDL_OK passes; a failure is the caller's bug, reported with `who` and the check's
// message, and aborts (no status could reach every rank without an agreement).
ddl_status ddl_layer_fixed_check(const char *who, ddl_status st);

// Framework helpers for layer implementations.
// Allocates a layer with zeroed fields and the given ops/kind.
ddl_status ddl_layer_alloc(const ddl_layer_ops *ops, const char *kind, ddl_dtype dt,
                           ddl_layer_t **out);
// Adds a parameter of global shape `global` of which this rank holds `box` (empty box:
// not an owner). Allocates value and grad (zero).
ddl_status ddl_layer_add_param(ddl_layer_t *L, const char *name, const ddl_shape *global,
                               const ddl_box *box, ddl_init_kind init, int64_t fan_in);
// Makes L a layer of n >= 2 inputs of global shapes globals[k], each balanced over P
// (which becomes P_in): fills ninputs, in_global, in_shape, x_global and x_shape.
ddl_status ddl_layer_set_inputs(ddl_layer_t *L, int n, const ddl_shape *globals,
                                const ddl_partition_t *P);

// Forward-only copies of a layer (a model's short batches). While lend_params(from) is in
// force on this thread, ddl_layer_add_param of the layer being built takes from's
// parameter values (same names, shapes and boxes, in order) instead of allocating: no
// parameter or gradient of its own, not even while it is built; lend_params(NULL) ends
// it. finish_copy(L, from) then checks L against from: L runs forward only (backward is
// refused), reading from's parameters as they change, and from must outlive it. Local.
// While lend_params is in force, ddl_layer_copy_source returns `from` (NULL otherwise):
// the layer being built allocates none of the buffers only backward uses, and takes
// from's scratch where it can (a conv's workspace), so a copy never holds what it would
// not use, not even for a moment (freeing them after the build made the model's peak: 5
// MB per rank above its final figure for vgg-4).
void               ddl_layer_lend_params(const ddl_layer_t *from);
const ddl_layer_t *ddl_layer_copy_source(void);

// Scratch shared by the layers of a model, which run one call at a time. While
// share_scratch(true) is in force on this thread, a layer being built that can keep what
// lives only within one forward or backward call (a spatially split conv's or pool's
// halo-padded input and its gradient, their crops, a conv's kernel workspace) in a shared
// block allocates none of it and sets L->scratch_bytes instead; before the layer runs, the
// caller hands it a block of at least that size with set_scratch, the same block to every
// layer. A conv built so keeps a reference to the x of its forward and rebuilds its
// halo-padded input from it in backward (the saved-tensor contract of ddl/layers.h): the
// halo buffers stop being a second copy of every split activation (issue 19, item 6).
// Without share_scratch every layer owns its buffers, as before. min_bytes: see
// ddl_layer_share_min_bytes. Local.
void ddl_layer_share_scratch(bool on, double min_bytes);
bool ddl_layer_scratch_shared(void);
// Rebuilding a conv's padded input costs a copy and an exchange per backward (ResNet on
// 2 ranks: some percent of a step); it pays where the input is large. A conv shares its
// halo buffers when its input holds at least this many bytes per rank of P_x (global
// size / ranks, so every rank decides alike): the min_bytes of ddl_layer_share_scratch,
// which the model takes from DDL_SHARE_MIN_BYTES, default 2 MiB (ResNet and VGG at batch 64
// on 2 ranks, 1.6 MB per rank, keep theirs). Local.
double ddl_layer_share_min_bytes(void);
void   ddl_layer_set_scratch(ddl_layer_t *L, void *p);
// Before a forward or backward of a layer whose buffers are `shared`: DDL_EINTERNAL if
// it was built with scratch_bytes > 0 and no block was set.
ddl_status ddl_layer_check_scratch(const ddl_layer_t *L, bool shared);
// A block of `bytes` carved from a scratch of *total bytes, DDL_ALIGN-aligned: returns
// its offset and advances *total (the layers' layouts).
size_t ddl_scratch_carve(size_t *total, size_t bytes);
// A buffer of the layer's own (zero), or with `shared` a view whose data set_scratch
// places in the shared block.
ddl_status ddl_scratch_tensor(ddl_dtype dt, const ddl_shape *s, bool shared, ddl_tensor_t **out);
ddl_status ddl_layer_finish_copy(ddl_layer_t *L, ddl_layer_t *from);

// Fills t, the piece `box` of a tensor of global shape `global`, with the values the
// global tensor has under init (seeded by (seed, stream), by global flat index).
void ddl_init_fill(ddl_tensor_t *t, const ddl_box *box, const ddl_shape *global,
                   ddl_init_kind init, int64_t fan_in, uint64_t seed, uint64_t stream);

#ifdef __cplusplus
}
#endif
#endif // DDL_LAYERS_LAYER_IMPL_H
