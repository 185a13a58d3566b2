// server/model_info.h: what rank 0 knows of the current model (its input, its weights in
// the packed all-weights layout, its partitions), built by dispatch.c when a model is
// created and read by the snapshot (shared.h), the request checks (requests.h) and the
// weight streams (service.h). No MPI, no gRPC.
#ifndef DDLD_MODEL_INFO_H
#define DDLD_MODEL_INFO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddl/tensor.h"

typedef struct ddld_weight_info {
    char     *name;
    ddl_dtype dtype;
    ddl_shape shape;
    size_t    bytes;  // numel * item size
    size_t    offset; // in the packed all-weights layout (64-byte aligned)
} ddld_weight_info;

// A layer of the spec: its output's global shape and the partition it is decomposed over.
typedef struct ddld_layer_info {
    char      name[64], type[32];
    int       part; // index into the part_* arrays below; -1: none
    ddl_shape y;    // the output's global shape, batch first
} ddld_layer_info;

typedef struct ddld_model_info {
    bool              has_model;
    char              name[128];
    ddl_dtype         dtype;
    int64_t           batch_size;
    ddl_shape         input; // per sample
    int64_t           sample_numel;
    int               classes;
    ddl_shape         output;    // per sample: [classes], or [C, spatial...] (segmentation, dense)
    int64_t           out_elems; // values per sample of the output
    bool              dense;     // the loss trains on dense targets (FP values shaped like output)
    ddl_shape         target;    // per sample: a batch's targets ([] for a classifier's label,
                                 // [spatial...] for segmentation, the output for dense)
    char              loss[32];
    double            norm_mean, norm_std;
    int               nweights;
    ddld_weight_info *weights;
    size_t            weights_bytes; // packed size (sum of aligned sizes)
    int64_t           num_parameters;
    // Partitions of the spec, for GetStatus (rank lists and shapes, flattened).
    int       npartitions;
    char    **part_name;
    int      *part_nranks, *part_ndims;
    int32_t **part_ranks;
    int64_t **part_shape;
    // The spec's layers in file order (the dashboard's picture of the partitions).
    int              nlayers;
    ddld_layer_info *layers;
} ddld_model_info;

// Frees every array of mi and zeroes it (model_info.c).
void ddld_model_info_free(ddld_model_info *mi);

#endif // DDLD_MODEL_INFO_H
