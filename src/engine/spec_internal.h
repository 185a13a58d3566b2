// engine/spec_internal.h: the parsed form of a model spec, shared by spec.c, model.c,
// estimate.c and the layer registry (layer_registry.h).
#ifndef DDL_ENGINE_SPEC_INTERNAL_H
#define DDL_ENGINE_SPEC_INTERNAL_H

#include "ddl/model.h"
#include "ddl/synth.h"

#define SPEC_MAX_RANKS 4096
#define SPEC_NAME 64
// Caps on what a spec may ask for, checked before anything is sized from it: layers per
// spec, and kernel, stride, padding and dilation per spatial dimension. Tensor sizes
// (inputs, every layer's output and parameters) are capped by DDL_MAX_TENSOR_ELEMENTS.
#define DDL_MAX_LAYERS 4096
#define SPEC_MAX_WINDOW ((int64_t)1 << 20)
// Upsample's scale_factor lies in (0, SPEC_MAX_SCALE].
#define SPEC_MAX_SCALE DDL_UPSAMPLE_MAX_SCALE

typedef struct spec_partition {
    char name[SPEC_NAME];
    int  nranks;
    int *ranks;
    int  ndim;
    int  shape[DDL_MAX_DIMS];
} spec_partition;

typedef struct spec_layer_kind spec_layer_kind;

// A layer's operands: up to SPEC_MAX_INPUTS tensors, each the output of another layer or
// the model's input (SPEC_INPUT).
#define SPEC_MAX_INPUTS 32
// At most this many short batch sizes ("inference_batches"): the powers of two below the
// largest batch_size (1 << 20) are 20.
#define SPEC_MAX_BUCKETS 24
#define SPEC_INPUT      (-1)

typedef struct spec_layer {
    const spec_layer_kind *kind;         // the registry entry of its type
    char                   type[32];     // the type as written ("conv2d", "relu")
    char                   name[SPEC_NAME];  // for parameter names
    int                    nin;          // operands (1 except for joins)
    int                    in[SPEC_MAX_INPUTS];  // their producers (layer index or SPEC_INPUT)
    int                    P_in, P_out, P_w;  // partition indices (-1: none)
    int                    P_y_given;         // conv: P_y given explicitly (-1 none)
    ddl_shape              x_global, y_global;  // x_global: operand 0's global shape
    ddl_conv_params        conv;
    ddl_pool_params        pool;
    bool                   global_pool;  // adaptive_avgpool with output size 1
    int64_t                out_features;
    bool                   bias;
    ddl_act_kind           act;
    double                 alpha;
    double                 eps, momentum;
    bool                   affine;
    ddl_upsample_mode      mode;
    bool                   align_corners, has_scale;
    double                 scale[3];
    int64_t                size[3];
    bool                   has_params;
    int                    param_index;  // index among layers with parameters (file order)
} spec_layer;

struct ddl_spec {
    char             *text;
    char              source[256];
    char              name[SPEC_NAME]; // the top-level "name" ("" when absent)
    int               world_size;
    uint64_t          seed;
    ddl_dtype         dt;
    int64_t           batch;
    // "inference_batches": the short batch sizes, ascending and below batch, that Predict
    // and Evaluate run at without padding to batch (the model builds a forward-only copy
    // of its layers for each, sharing the parameters).
    int               nbuckets;
    int64_t           buckets[SPEC_MAX_BUCKETS];
    ddl_shape         input;       // per sample
    int               input_partition;
    int               nparts;
    spec_partition   *parts;
    int               nlayers;
    spec_layer       *layers;
    int              *order;      // a topological order of the layers (file order if possible)
    ddl_shape         in_global;  // the batched input [batch, sample...]
    ddl_loss_kind     loss;       // DDL_LOSS_CROSS_ENTROPY or an elementwise kind
    ddl_reduction     reduction;
    bool              dense;     // the loss takes dense targets shaped like the output
    ddl_target_source target;    // where the data's targets come from
    int64_t           out_elems; // values per sample of the output
    ddl_optim_params  optim;
    double            mean, std;
    bool              shuffle;
    int               num_classes;
    // The model output per sample: [classes], or [classes, spatial...] for segmentation,
    // whose labels are one per output voxel (label_elems = prod(spatial); else 1). Dense
    // targets: the output's per-sample shape, num_classes and label_elems 0.
    ddl_shape         output;
    int64_t           label_elems;
    // data.synthetic (has_synth): generated samples instead of a dataset directory.
    bool              has_synth;
    ddl_synth_params  synth;
    int64_t           synth_n[2]; // training and test samples
    // The engine's settings from the environment, read and checked with the spec (a bad
    // value fails the parse, naming it), so that the model and the estimate each see one
    // value (and the model checks that every rank has the same: ddl_model_create):
    //   DDL_SHARE_SCRATCH    0 or 1 (default 1): share_scratch (spec_share_scratch)
    //   DDL_SHARE_MIN_BYTES  a byte count (default 2M): share_min_bytes
    //                        (ddl_layer_share_scratch)
    //   DDL_FUSE_BN_RELU     0 or 1 (default 1): fuse_bn_relu (spec_fused_relu_source)
    //   DDL_FUSE_ADD_RELU    0 or 1 (default 1): fuse_add_relu (spec_fused_relu_source)
    //   DDL_SHARE_BN_GRAD    0 or 1 (default 1): share_bn_grad (spec_grad_alias_of)
    // and, checked only (their readers are below the engine): DDL_MEMORY_LIMIT (a byte
    // count > 0, ddl_mem_available) and DDL_CONV_DIRECT (ddl_conv_direct_setting_ok).
    struct {
        bool   share_scratch;
        double share_min_bytes;
        bool   fuse_bn_relu;
        bool   fuse_add_relu;
        bool   share_bn_grad;
    } tuning;
};

// Parses the spec as ddl_spec_parse does, with batch_size replaced by `batch` (> 0) and
// no inference_batches of its own: the spec of one of a model's short-batch copies.
ddl_status spec_parse_at_batch(const char *text, const char *source, int world_size, int64_t batch,
                               ddl_spec_t **out);

// The global shape and partition of node `n`: a layer's output, or the batched input.
static inline const ddl_shape *spec_node_shape(const ddl_spec_t *s, int n)
{
    return n == SPEC_INPUT ? &s->in_global : &s->layers[n].y_global;
}
static inline int spec_node_partition(const ddl_spec_t *s, int n)
{
    return n == SPEC_INPUT ? s->input_partition : s->layers[n].P_out;
}

// Fusion of a batch norm or an add and the ReLU after it. Layer j is a fused ReLU, and
// this returns its operand p, when j is a "relu" whose one operand is a batchnorm or add
// layer p that no other layer reads and that is not the model's output: the model then
// runs p with the ReLU fused (ddl_batchnorm_fuse_relu, ddl_add_fuse_relu), skips j, and
// gives j's output and gradient p's memory. Otherwise -1. DDL_FUSE_BN_RELU=0 and
// DDL_FUSE_ADD_RELU=0 in the environment turn each off (for comparing; fused and unfused
// give the same bits): s->tuning.
int spec_fused_relu_source(const ddl_spec_t *s, int j);
// The layer whose output gradient is also layer p's (the model makes p's gradient a view
// of that layer's), or -1: p's only consumer, on p's output partition, p no fused ReLU
// (whose gradient is its batch norm's), and either
//   - an add: its backward has nothing to copy for p. Safe because nothing writes either
//     gradient once the add's backward has run: the add's consumers ran before it, and p
//     has no other;
//   - a batch norm (with share_bn_grad): its backward overwrites its dy with its dx,
//     element by element after reading it, so the write finds its line in cache and p's
//     gradient needs no memory of its own. Where that dy is the batch norm's own, or an
//     add's whose other operands have gradients of their own or run their backward
//     before this one (later in the topological order). Safe because nothing reads that
//     dy after the batch norm's backward: its consumers ran before it, and so did the add,
//     which copied it to its other operands, and those other operands that share it.
int spec_grad_alias_of(const ddl_spec_t *s, int p);
// Whether the model's layers share one scratch block for what lives only within a call
// (ddl_layer_share_scratch; the estimate counts the largest need, not the sum).
// DDL_SHARE_SCRATCH=0 gives every layer its own, to compare: s->tuning.
bool spec_share_scratch(const ddl_spec_t *s);

#endif // DDL_ENGINE_SPEC_INTERNAL_H
