// engine/layer_registry.h: one entry per layer type of a model spec.
//
// A layer type is its registry entry (engine/layer_registry.c): the type names it answers
// to, how its keys are parsed and its output inferred (spec.c calls it once the layer's
// operands are known), how it is built into a ddl_layer_t (model.c), and what memory it
// needs per rank (estimate.c). Adding a type means adding one entry and its functions in
// layer_registry.c, nowhere else. The helpers below are what those functions share with
// the parser (key paths and lines in every error) and with the estimate.
#ifndef DDL_ENGINE_LAYER_REGISTRY_H
#define DDL_ENGINE_LAYER_REGISTRY_H

#include <jansson.h>
#include <stddef.h>

#include "ddl/layers.h"
#include "engine/spec_internal.h"

// ---- the parser's helpers (spec.c) --------------------------------------------------

typedef struct spec_jline spec_jline;
typedef struct spec_pctx {
    ddl_spec_t *s;
    spec_jline *lines;  // the line of every key path ("layers[3].kernel")
    int         nlines, cap;
    int64_t     batch_override; // > 0: batch_size replaced (spec_parse_at_batch)
} spec_pctx;

// EINVAL "source:line: path: message" (the line of path or of its longest known prefix).
ddl_status spec_fail(const spec_pctx *c, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void       spec_join(char *out, size_t n, const char *base, const char *key);
// Refuses keys of obj not in allowed (NULL-terminated).
ddl_status spec_check_keys(const spec_pctx *c, json_t *obj, const char *path,
                           const char *const *allowed);
// Typed access to path.key; an absent optional key leaves *out unchanged.
ddl_status spec_get_int(const spec_pctx *c, json_t *obj, const char *path, const char *key,
                        bool required, long long min, long long max, int64_t *out);
ddl_status spec_get_num(const spec_pctx *c, json_t *obj, const char *path, const char *key,
                        bool required, double min, double max, double *out);
ddl_status spec_get_bool(const spec_pctx *c, json_t *obj, const char *path, const char *key,
                         bool *out);
ddl_status spec_get_str(const spec_pctx *c, json_t *obj, const char *path, const char *key,
                        bool required, const char **out);
// A partition name at path.key resolved to its index.
ddl_status spec_get_partition(const spec_pctx *c, json_t *obj, const char *path,
                              const char *key, bool required, int *out);
// nsp integers >= min (windows up to SPEC_MAX_WINDOW, "size" up to the tensor cap), each
// preset to fill.
ddl_status spec_parse_spatial(const spec_pctx *c, json_t *o, const char *path, const char *key,
                              bool required, int nsp, long long min, int64_t fill, int64_t *out);
// Refuses a shape past DDL_MAX_TENSOR_ELEMENTS, naming `what`.
ddl_status spec_check_size(const spec_pctx *c, const char *path, const char *what,
                           const ddl_shape *shape);
char      *spec_shape_str(const ddl_shape *s, char *buf, size_t n);

// ---- the estimate's helpers (estimate.c) --------------------------------------------

// SPEC_E_SCRATCH: the layers' shared scratch block, the largest need (spec_est_scratch).
enum {
    SPEC_E_PARAMS,
    SPEC_E_GRADS,
    SPEC_E_OPTIM,
    SPEC_E_ACT,
    SPEC_E_WORK,
    SPEC_E_SCRATCH,
    SPEC_E_COUNT
};
// Bookkeeping counted per layer (estimate.c), and more per halo exchange (its plan and
// slab descriptions), as measured with ddl_alloc_bytes_live.
#define SPEC_E_LAYER_BYTES 3072.0
#define SPEC_E_HALO_BYTES 12288.0
typedef struct spec_est spec_est;
const ddl_spec_t *spec_est_spec(const spec_est *e);
double            spec_est_item(const spec_est *e);  // bytes per element
// Adds bytes to category cat of every rank of partition P (every rank when P < 0).
void              spec_est_add(spec_est *e, int P, int cat, double bytes);
// A parameter block of numel elements on P: value, gradient and optimizer state; `copies`
// more values and gradients where the layer keeps working blocks of it.
void              spec_est_add_param(spec_est *e, int P, double numel, double copies);
// True while the estimate counts a forward-only short-batch copy of the model (spec
// inference_batches): its layers keep no gradients and borrow their workspaces from
// the model's layers (ddl_layer_copy_source).
bool spec_est_copy(const spec_est *e);
// The largest block of global shape g on partition P (P < 0: not partitioned).
double            spec_est_local_numel(const ddl_spec_t *s, const ddl_shape *g, int P);
int               spec_est_part_dim(const ddl_spec_t *s, int P, int d);
double            spec_est_ceil_div(double n, double p);
// A window operation's input x of global shape g on P, per rank: `bufs` halo-padded
// buffers and, where the window needs only part of one, `crops` copies of that part
// (k, s, p, d: the spatial window, g->ndim - 2 entries each); with `shared` >= 0 instead
// one of each in the shared scratch, with `shared` bytes more (a kernel workspace).
void spec_est_add_halo(spec_est *e, int P, const ddl_shape *g, const int64_t *k, const int64_t *s,
                       const int64_t *p, const int64_t *d, double bufs, double crops,
                       double shared);
// A need of the shared scratch block on every rank of P: the block is the largest need.
void spec_est_scratch(spec_est *e, int P, double bytes);
// Whether the model shares the layers' scratch (spec_share_scratch).
bool spec_est_shares(const spec_est *e);

// ---- the registry --------------------------------------------------------------------

// What a build function gets besides its spec layer.
typedef struct spec_build_ctx {
    const ddl_spec_t       *s;
    ddl_partition_t *const *parts;  // the model's partitions, by spec index
    int                     index;  // the layer's index in the spec (seeds random layers)
} spec_build_ctx;

struct spec_layer_kind {
    const char *const *types;  // the type names it answers to (NULL-terminated)
    const char        *list;   // how the "unknown layer type" message lists them
    const char        *stem;   // generated names: stem<param index> or stem_at_<layer index>
    int                min_inputs, max_inputs;
    // Whether the layer has parameters, decided from its keys alone (generated names,
    // which `from` may refer to, are known before any shape); NULL: never.
    bool (*has_params)(json_t *o);
    // Reads the keys of o (at path) and infers L->y_global and L->P_out (preset to
    // L->x_global and L->P_in); the operands L->in[0..nin) are parsed already.
    ddl_status (*parse)(spec_pctx *c, json_t *o, const char *path, spec_layer *L);
    ddl_status (*build)(const spec_build_ctx *b, const spec_layer *L, ddl_layer_t **out);
    // Adds the layer's memory beyond its output and output gradient (counted by the caller).
    void (*estimate)(spec_est *e, const spec_layer *L);
    // Buffers: per-channel state saved with the weights (batch norm's running statistics),
    // named "<layer>.<buffers[k]>"; get_buffers returns the layer's tensors in that order.
    const char *const *buffers;
    ddl_status (*get_buffers)(const ddl_layer_t *L, ddl_tensor_t **out);
};

// The entry answering to `type`, or NULL.
const spec_layer_kind *spec_kind_find(const char *type);
// The known types, for messages ("repartition, flatten, conv1d|2d|3d, ...").
void                   spec_kind_list(char *buf, size_t n);

#endif // DDL_ENGINE_LAYER_REGISTRY_H
