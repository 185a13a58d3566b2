// engine/spec_internal.h: the parsed form of a model spec, shared by spec.c and model.c.
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

typedef enum {
    SL_REPARTITION,
    SL_FLATTEN,
    SL_CONV,
    SL_POOL,
    SL_LINEAR,
    SL_ACTIVATION,
    SL_BATCHNORM,
    SL_UPSAMPLE,
} spec_layer_type;

typedef struct spec_layer {
    spec_layer_type   type;
    char              name[SPEC_NAME];  // for parameter names
    int               P_in, P_out, P_w;  // partition indices (-1: none)
    int               P_y_given;         // conv: P_y given explicitly (-1 none)
    ddl_shape         x_global, y_global;
    ddl_conv_params   conv;
    ddl_pool_params   pool;
    int64_t           out_features;
    bool              bias;
    ddl_act_kind      act;
    double            alpha;
    double            eps, momentum;
    bool              affine;
    ddl_upsample_mode mode;
    bool              align_corners, has_scale;
    double            scale[3];
    int64_t           size[3];
    bool              has_params;
    int               param_index;       // index among layers with parameters
} spec_layer;

struct ddl_spec {
    char             *text;
    char              source[256];
    int               world_size;
    uint64_t          seed;
    ddl_dtype         dt;
    int64_t           batch;
    ddl_shape         input;       // per sample
    int               input_partition;
    int               nparts;
    spec_partition   *parts;
    int               nlayers;
    spec_layer       *layers;
    ddl_reduction     reduction;
    ddl_optim_params  optim;
    double            mean, std;
    bool              shuffle;
    int               num_classes;
    // The model output per sample: [classes], or [classes, spatial...] for segmentation,
    // whose labels are one per output voxel (label_elems = prod(spatial); else 1).
    ddl_shape         output;
    int64_t           label_elems;
    // data.synthetic (has_synth): generated samples instead of a dataset directory.
    bool              has_synth;
    ddl_synth_params  synth;
    int64_t           synth_n[2]; // training and test samples
};

#endif // DDL_ENGINE_SPEC_INTERNAL_H
