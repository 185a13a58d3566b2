// ddl/model.h: model specs (JSON) and models built from them: a sequence of distributed
// layers with a loss and an optimizer, trained step by step.
//
// A spec names the world size, the partitions, the input, the layer sequence (each
// layer's partitions and hyper-parameters), the loss, the optimizer and the seed:
//
//   {"world_size": 4, "seed": 1, "dtype": "f32", "batch_size": 64,
//    "input": {"shape": [1, 28, 28], "partition": "root"},
//    "partitions": {"root": {"ranks": [0], "shape": [1, 1, 1, 1]},
//                   "conv": {"ranks": [0, 1, 2, 3], "shape": [1, 1, 2, 2]}, ...},
//    "layers": [{"type": "repartition", "to": "conv"},
//               {"type": "conv2d", "out_channels": 6, "kernel": [5, 5], "padding": [2, 2]},
//               {"type": "relu"}, ...],
//    "loss": {"type": "cross_entropy", "reduction": "mean"},
//    "optimizer": {"type": "adam", "lr": 0.001},
//    "data": {"normalize": {"mean": 0.286, "std": 0.353}, "shuffle": true}}
//
// Parsing validates everything without MPI and reports the first problem with the key
// path and its line ("spec.json:14: layers[3].kernel: expected 2 entries, got 3"):
// unknown keys, wrong types, duplicate keys, shapes that do not follow from layer to
// layer, partitions needing more ranks than the world. See docs/MODEL_SPEC.md.
#ifndef DDL_MODEL_H
#define DDL_MODEL_H

#include <mpi.h>
#include <stdbool.h>
#include <stdint.h>

#include "ddl/layers.h"
#include "ddl/optim.h"
#include "ddl/synth.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ddl_spec ddl_spec_t;

// Parses and validates spec text; `source` names it in messages (a file name). When
// world_size > 0 the spec's world_size must equal it. Not collective.
DDL_EXTERN ddl_status ddl_spec_parse(const char *text, const char *source, int world_size,
                                     ddl_spec_t **out);
DDL_EXTERN ddl_status ddl_spec_load(const char *path, int world_size, ddl_spec_t **out);
DDL_EXTERN void       ddl_spec_destroy(ddl_spec_t **s);
DDL_EXTERN const char *ddl_spec_text(const ddl_spec_t *s);
// The spec's top-level "name": "" when it has none.
DDL_EXTERN const char *ddl_spec_name(const ddl_spec_t *s);
DDL_EXTERN int        ddl_spec_world_size(const ddl_spec_t *s);
// The spec's layers in file order, to describe a model (the daemon's dashboard): their
// count, and layer i's name, type as written, output's global shape (batch first) and the
// name of the partition that output is decomposed over ("" for none). i in [0, count).
DDL_EXTERN int        ddl_spec_num_layers(const ddl_spec_t *s);
DDL_EXTERN void       ddl_spec_layer_output(const ddl_spec_t *s, int i, const char **name,
                                            const char **type, ddl_shape *y_global,
                                            const char **partition);
DDL_EXTERN int64_t    ddl_spec_batch_size(const ddl_spec_t *s);
// The short batch sizes (spec "inference_batches", ascending, each below batch_size) that
// Predict and Evaluate run at instead of padding to batch_size: a count of n runs at the
// smallest one >= n. Returns how many; *sizes (may be NULL) points into the spec.
DDL_EXTERN int        ddl_spec_inference_batches(const ddl_spec_t *s, const int64_t **sizes);
DDL_EXTERN uint64_t   ddl_spec_seed(const ddl_spec_t *s);
DDL_EXTERN ddl_dtype  ddl_spec_dtype(const ddl_spec_t *s);
// Per-sample input shape (without the batch dimension), e.g. [1, 28, 28].
DDL_EXTERN ddl_shape  ddl_spec_input_shape(const ddl_spec_t *s);
DDL_EXTERN int        ddl_spec_num_classes(const ddl_spec_t *s);
DDL_EXTERN void       ddl_spec_normalize(const ddl_spec_t *s, double *mean, double *std);
DDL_EXTERN bool       ddl_spec_shuffle(const ddl_spec_t *s);
// The model's output per sample (without the batch dimension): [classes] for a
// classifier, [classes, spatial...] for a segmentation model, whose labels are one per
// output voxel. ddl_spec_label_elems: labels per sample, prod(spatial) (1 for a classifier).
DDL_EXTERN ddl_shape  ddl_spec_output_shape(const ddl_spec_t *s);
DDL_EXTERN int64_t    ddl_spec_label_elems(const ddl_spec_t *s);
// The loss ("loss": {"type": ...}): cross_entropy trains on class labels (one per sample,
// or one per output voxel); every other kind (mse, l1, bce, bce_with_logits, kl_div,
// poisson_nll) on dense targets shaped like the output, in the spec's dtype
// (ddl_spec_dense_targets; then ddl_spec_num_classes and ddl_spec_label_elems are 0).
// ddl_spec_output_elems: values per sample of the output, prod(ddl_spec_output_shape).
DDL_EXTERN ddl_loss_kind ddl_spec_loss(const ddl_spec_t *s);
DDL_EXTERN const char   *ddl_spec_loss_name(const ddl_spec_t *s);
DDL_EXTERN bool          ddl_spec_dense_targets(const ddl_spec_t *s);
DDL_EXTERN int64_t       ddl_spec_output_elems(const ddl_spec_t *s);
// Where the data's targets come from ("data": {"target": ...}): class labels, the
// sample's own pixels scaled to [0, 1] (image; IDX data: an autoencoder's target), or for
// generated volumes the noise-free intensity (clean: denoising) or the object mask (1
// inside a sphere or cube, 0 outside).
typedef enum {
    DDL_TARGET_LABELS = 0,
    DDL_TARGET_IMAGE,
    DDL_TARGET_CLEAN,
    DDL_TARGET_MASK,
} ddl_target_source;
DDL_EXTERN ddl_target_source ddl_spec_target_source(const ddl_spec_t *s);
// The spec's generated data ("data": {"synthetic": {...}}), when it has some: true, with
// its parameters and the training and test sample counts (each out may be NULL).
DDL_EXTERN bool       ddl_spec_synthetic(const ddl_spec_t *s, ddl_synth_params *p,
                                         int64_t *n_train, int64_t *n_test);

typedef struct ddl_model ddl_model_t;

// Builds partitions, layers (parameters initialized partition-invariantly from the
// seed), loss, optimizer and every buffer a step needs. Collective over comm, whose
// size must be the spec's world size. The spec is copied.
DDL_EXTERN ddl_status ddl_model_create(MPI_Comm comm, const ddl_spec_t *spec, ddl_model_t **out);
DDL_EXTERN void       ddl_model_destroy(ddl_model_t **m);

// Entry points that take a batch read it on rank 0 only (other ranks pass NULL and 0) and
// take its size explicitly: `count` samples of the spec's input shape and dtype in `x`,
// which holds x_bytes (at least count * sample bytes; only that much is read), and
// count * ddl_spec_label_elems labels in [0, classes) (one per sample, or for a
// segmentation model one per output voxel, [count, spatial...] row-major). Rank 0
// checks all of it before any data moves, and
// every rank returns the same status (ddl_agree). The model copies the samples into its
// own batch buffer, padding a short batch itself.

// One training step on a batch of exactly batch_size samples (count == batch_size).
// Forward, loss, zero_grad, backward, optimizer step. *loss (the reduced loss) and
// *correct (argmax hits; per voxel for segmentation) are valid on every rank. Collective.
DDL_EXTERN ddl_status ddl_model_train_step(ddl_model_t *m, const void *x, size_t x_bytes,
                                           const int64_t *labels, int64_t count, double *loss,
                                           int64_t *correct);
// Evaluation and prediction run `count` samples at the smallest of the spec's inference
// batches (ddl_spec_inference_batches) that holds them, or at batch_size: a forward-only
// copy of the layers per inference batch, built at create, shares the parameters and the
// activation memory, so a short batch costs about its own size and allocates nothing.
// Evaluation of `count` <= batch_size samples: loss summed over the samples (for
// segmentation each sample's loss is the mean over its voxels) and argmax hits (per
// voxel for segmentation). No parameter changes. Layers run in eval mode. Collective.
DDL_EXTERN ddl_status ddl_model_eval(ddl_model_t *m, const void *x, size_t x_bytes,
                                     const int64_t *labels, int64_t count, double *loss_sum,
                                     int64_t *correct);
// Dense targets (ddl_spec_dense_targets: every loss but cross_entropy) instead of labels:
// count * ddl_spec_output_elems values in the spec's dtype, shaped like the output
// ([count, ...] row-major), t_bytes long. Rank 0 checks them first: finite, in [0, 1] for
// bce and bce_with_logits, >= 0 for poisson_nll and kl_div (without log_target). The
// label entry points refuse a dense model and these refuse a classifier (EINVAL).
// The metrics, summed over the samples and valid on every rank: the loss of each sample
// under the spec's reduction (mean: over its values), and of the prediction p (the
// output; its sigmoid for bce_with_logits; its exp for poisson_nll and kl_div without
// log_target) against the target t: sum (p - t)^2, sum t^2 (MSE = sq_err / values;
// relative L2 error = sqrt(sq_err / sq_target)) and, for bce and bce_with_logits, the
// values where p and t fall on the same side of 1/2. A training step's metrics are of
// its forward, before the update.
typedef struct ddl_dense_metrics {
    double  loss_sum;
    double  sq_err, sq_target;
    int64_t hits;
} ddl_dense_metrics;
DDL_EXTERN ddl_status ddl_model_train_step_dense(ddl_model_t *m, const void *x, size_t x_bytes,
                                                 const void *targets, size_t t_bytes, int64_t count,
                                                 double *loss, ddl_dense_metrics *out);
DDL_EXTERN ddl_status ddl_model_eval_dense(ddl_model_t *m, const void *x, size_t x_bytes,
                                           const void *targets, size_t t_bytes, int64_t count,
                                           ddl_dense_metrics *out);
// Per-rank ingest (dense targets): instead of rank 0 passing the whole batch for the
// model to scatter, every rank writes its own box of the batch straight into the model's
// buffers (a parallel reader: ddl/h5.h), and the step or evaluation runs on them.
// ddl_model_local_input: this rank's box of the input batch [batch_size, sample...] and
// the buffer it fills (box-shaped, row-major, the spec's dtype; an empty box on ranks
// outside the input partition). ddl_model_local_targets: the same for the dense targets
// [batch_size, output...] on the output partition (an empty box for a model without
// dense targets). Rows past the samples an evaluation counts must be zero. Local.
DDL_EXTERN void ddl_model_local_input(ddl_model_t *m, ddl_box *box, void **data);
DDL_EXTERN void ddl_model_local_targets(ddl_model_t *m, ddl_box *box, void **data);
// A training step (a full batch) or an evaluation of the first `count` rows on the
// buffers the ranks filled: each rank checks its own targets (ranges as for
// ddl_model_train_step_dense) and every rank agrees, so a bad value one rank holds stops
// all of them before anything moves. Nothing is scattered from rank 0. Collective.
DDL_EXTERN ddl_status ddl_model_train_step_local(ddl_model_t *m, double *loss,
                                                 ddl_dense_metrics *out);
DDL_EXTERN ddl_status ddl_model_eval_local(ddl_model_t *m, int64_t count, ddl_dense_metrics *out);
// The same for a segmentation model's class labels (one per output voxel): this rank's
// box of the labels [batch_size, 1, spatial...] on the output partition and the buffer it
// fills (int64, box-shaped, row-major; an empty box and NULL for other models, and on
// ranks outside the output partition). With the input written through
// ddl_model_local_input, the step or evaluation runs on them as ddl_model_train_step and
// ddl_model_eval do (loss, correct voxels, ddl_model_class_counts), each rank checking its
// own labels (in [0, classes)) before anything moves, all agreeing. Rows past the samples
// an evaluation counts must be zero. Collective (the two commands).
DDL_EXTERN void       ddl_model_local_labels(ddl_model_t *m, ddl_box *box, int64_t **labels);
DDL_EXTERN ddl_status ddl_model_train_step_local_labels(ddl_model_t *m, double *loss,
                                                        int64_t *correct);
DDL_EXTERN ddl_status ddl_model_eval_local_labels(ddl_model_t *m, int64_t count, double *loss_sum,
                                                  int64_t *correct);
// What one scatter of a batch from rank 0 moves for this rank (the input plan, and the
// dense targets' plan; sent, received, plans run): what per-rank ingest does not move.
DDL_EXTERN ddl_traffic_count ddl_model_scatter_traffic(const ddl_model_t *m);
// Forward only on `count` <= batch_size samples; the whole output [count, ...] (logits
// [count, classes] or [count, classes, spatial...] for a classifier; the spec's dtype) is
// written on rank 0 into `logits`, which holds logits_bytes (at least count *
// ddl_spec_output_elems * dtype size). Collective.
DDL_EXTERN ddl_status ddl_model_predict(ddl_model_t *m, const void *x, size_t x_bytes,
                                        int64_t count, void *logits, size_t logits_bytes);

// Parameters, in spec order; names like "conv2d_0.weight" (layer "name" key if given).
DDL_EXTERN int              ddl_model_nparams(const ddl_model_t *m);
DDL_EXTERN ddl_param       *ddl_model_param(const ddl_model_t *m, int i);
DDL_EXTERN const char      *ddl_model_param_name(const ddl_model_t *m, int i);
DDL_EXTERN ddl_optimizer_t *ddl_model_optimizer(const ddl_model_t *m);
DDL_EXTERN int64_t          ddl_model_step(const ddl_model_t *m);
DDL_EXTERN const ddl_spec_t *ddl_model_spec(const ddl_model_t *m);
// The model's own communicator (a duplicate of the one passed to ddl_model_create).
DDL_EXTERN MPI_Comm         ddl_model_comm(const ddl_model_t *m);
// Segmentation models: the voxel counts per class of the last train step or evaluation
// (its first `count` samples), summed over every rank: inter[k] = |pred = k and label =
// k|, uni[k] = |pred = k or label = k| (pred the argmax over the classes), for k in
// [0, classes) (each array holds classes entries). IoU_k = inter[k] / uni[k]. Returns
// false and writes nothing for a classifier. Valid on every rank; not collective.
DDL_EXTERN bool             ddl_model_class_counts(const ddl_model_t *m, int64_t *inter,
                                                   int64_t *uni);

// Checkpoint the model, optimizer state, step and caller state (a JSON object text,
// e.g. the data cursor) under dir; restore from a checkpoint root or step directory,
// possibly written by a different world size or partitioning (same layer sequence).
// *user_json (ddl_malloc'd, may be NULL) receives the caller state. Collective.
DDL_EXTERN ddl_status ddl_model_save(ddl_model_t *m, const char *dir, const char *user_json);
DDL_EXTERN ddl_status ddl_model_load(ddl_model_t *m, const char *path, char **user_json);
// Global weights as one safetensors file or a directory of .npy files, and back.
DDL_EXTERN ddl_status ddl_model_export(ddl_model_t *m, const char *path);
DDL_EXTERN ddl_status ddl_model_import(ddl_model_t *m, const char *path);

// ---- traffic ---------------------------------------------------------------------
// The payload a training step moves between ranks, row by row, summed over every rank
// (the logical payload of ddl/primitives.h; summed over ranks, sent == received). Rows,
// in order: "input" (rank 0's batch onto the input partition), one per layer in spec
// order (name = the layer's name, type = its kind, e.g. "conv_feature"), "loss",
// "labels" (rank 0's labels to every rank) and "output" (the output onto rank 0, for
// the accuracy). fwd is the row's forward part (a layer's last forward in training
// mode), bwd its backward part (a layer's last backward: zero for the layers before the
// first one with parameters, whose backward a step skips). Each entry keeps the
// primitive kinds and passes (a backward may run a primitive's forward).
typedef struct ddl_traffic_row {
    char        name[64];
    char        type[32];
    ddl_traffic fwd, bwd;
} ddl_traffic_row;
// The table's row count: layers + 4.
DDL_EXTERN int        ddl_model_traffic_rows(const ddl_model_t *m);
// Fills rows[0..n), n == ddl_model_traffic_rows(m), valid on every rank. Layers and loss
// report their last step (zero before the first). Collective (all-reduces over the model's
// communicator): call it when a table is wanted, not every step. Allocates nothing.
DDL_EXTERN ddl_status ddl_model_traffic_table(ddl_model_t *m, ddl_traffic_row *rows, int n);
// The same rows for this rank alone (what it sent and received), without the sums: not
// collective (a caller that already gathers per-rank figures adds them up itself).
DDL_EXTERN ddl_status ddl_model_traffic_local(const ddl_model_t *m, ddl_traffic_row *rows, int n);

// Gives each rank of comm on a node an equal share of the node's cores: the width of its
// kernel thread pool (ddl_blas_set_threads; OPENBLAS_NUM_THREADS, when set, wins, and
// OpenBLAS itself runs one thread). Returns the thread count chosen. Collective.
DDL_EXTERN int ddl_runtime_divide_cores(MPI_Comm comm);

#ifdef __cplusplus
}
#endif
#endif // DDL_MODEL_H
