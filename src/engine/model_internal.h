// engine/model_internal.h: what the session needs of a model beyond ddl/model.h.
#ifndef DDL_ENGINE_MODEL_INTERNAL_H
#define DDL_ENGINE_MODEL_INTERNAL_H

#include <stdbool.h>

#include "ddl/checkpoint.h"
#include "ddl/model.h"

// The model's named distributed state: parameters, then buffers (batch-norm running
// statistics), then (with_optim) the optimizer's tensors. *out and *names (the storage
// of the names *out points into) are ddl_malloc'd: free both with ddl_free. Local.
ddl_status ddl__model_named_state(ddl_model_t *m, bool with_optim, ddl_named_tensor **out, int *n,
                                  void **names);

// How many layers the model runs fused into the layer before them (a ReLU into its batch
// norm or add, spec_fused_relu_source). For tests. Local.
int ddl__model_fused_count(const ddl_model_t *m);
// For tests: how many layers' output gradients are views of their consumer's
// (spec_grad_alias_of): 0 in a forward-only copy.
int ddl__model_grad_alias_count(const ddl_model_t *m);
// The bytes of the layers' shared scratch block (give_scratch; 0 without one), and how
// many layers (with the copies') use it. For tests. Local.
size_t ddl__model_scratch_bytes(const ddl_model_t *m, int *users);

#endif // DDL_ENGINE_MODEL_INTERNAL_H
