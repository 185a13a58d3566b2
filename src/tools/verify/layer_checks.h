// tools/verify/layer_checks.h: the three checks every distributed layer must pass,
// written once for all layers (used by distdl-verify and by tests/layers):
//
//   adjoint     for a layer affine in its input and in each parameter (Linear, Conv,
//               AvgPool, Upsample, ...): with J the Jacobian, J v = F(v) - F(0) and
//               backward(dy) gives J^T dy, so |<J v, dy> - <v, J^T dy>| / max(...)
//               is measured for the input and for each parameter;
//   sequential  the layer on its partitions against the same layer built on rank 0
//               alone (same global input, same global parameters — initialization is
//               partition-invariant): y, dx and every parameter gradient, gathered;
//   gradcheck   central finite differences of L = <F(x), r> at sampled global indices
//               of the input and of every parameter (f64).
//
// A multi-input layer (ddl_layer_num_inputs > 1: add, concat) is checked on all its
// inputs at once: J v with v = (x_0, .., x_{n-1}), the sequential error and the finite
// differences over every input; err_input is the largest over the inputs.
//
// All are collective over MPI_COMM_WORLD.
#ifndef DDL_LAYER_CHECKS_H
#define DDL_LAYER_CHECKS_H

#include <stdbool.h>

#include "ddl/layers.h"

// Builds the layer under test. sequential = true builds the same layer with every
// partition replaced by rank 0 alone (shape all ones). dt is the dtype to build in.
typedef ddl_status (*ddl_layer_build_fn)(void *ctx, bool sequential, ddl_dtype dt,
                                         ddl_layer_t **out);

typedef struct ddl_layer_builder {
    ddl_layer_build_fn build;
    void              *ctx;
    uint64_t           seed;
    bool               training;
} ddl_layer_builder;

// Results; err_param[i] follows the layer's parameter order. Unused entries are 0.
typedef struct ddl_check_result {
    double err_input;
    double err_param[DDL_LAYER_MAX_PARAMS];
    int    nparams;
    char   param_names[DDL_LAYER_MAX_PARAMS][32];
    double max;  // the largest of the above
} ddl_check_result;

ddl_status ddl_check_adjoint(const ddl_layer_builder *b, ddl_dtype dt, ddl_check_result *out);
ddl_status ddl_check_sequential(const ddl_layer_builder *b, ddl_dtype dt, ddl_check_result *out);
ddl_status ddl_check_gradcheck(const ddl_layer_builder *b, int points, ddl_check_result *out);

// Runs the layer once on global random data and writes the gathered global tensors as
// .npy files into dir on rank 0: x, dy, y, dx (x0, x1, .. and dx0, dx1, .. for a
// multi-input layer), and per parameter <name>.npy and d<name>.npy.
ddl_status ddl_check_dump(const ddl_layer_builder *b, ddl_dtype dt, const char *dir);

#endif // DDL_LAYER_CHECKS_H

// ---- losses ------------------------------------------------------------------
// A loss under test: built on its partition (or on rank 0 alone when sequential).
typedef ddl_status (*ddl_loss_build_fn)(void *ctx, bool sequential, ddl_dtype dt,
                                        ddl_loss_t **out, const ddl_partition_t **P_x);
typedef struct ddl_loss_builder {
    ddl_loss_build_fn build;
    void             *ctx;
    uint64_t          seed;
    ddl_shape         x_global;
    ddl_loss_kind     kind;
    ddl_reduction     reduction;
} ddl_loss_builder;

// Sequential: the loss value (or the gathered elementwise losses) and dx against the
// loss on rank 0 alone; out->err_input holds the larger relative error.
ddl_status ddl_check_loss_sequential(const ddl_loss_builder *b, ddl_dtype dt, ddl_check_result *out);
// Finite differences of the (reduced, or weighted elementwise) loss w.r.t. x, f64.
ddl_status ddl_check_loss_gradcheck(const ddl_loss_builder *b, int points, ddl_check_result *out);
// Writes x.npy, target.npy (or labels as target.npy for cross-entropy), loss.npy, dx.npy.
ddl_status ddl_check_loss_dump(const ddl_loss_builder *b, ddl_dtype dt, const char *dir);
