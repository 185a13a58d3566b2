// ddl/session.h: a training session -- one model, its datasets, the data cursor and the
// checkpoint policy -- driven collectively by every rank. It is the one loop that every
// front end runs: `distdl-train` (a batch program) and the `distdld` daemon's dispatcher
// call the very same functions.
//
//   ddl_session_t *s;
//   ddl_session_create(comm, spec_text_on_rank0, "spec.json", &opts, &s);
//   ddl_session_open_data(s, "/usr/share/datasets/fashion-mnist");   // rank 0's path
//   ddl_train_request req = {.epochs = 5};
//   ddl_train_result  res;
//   ddl_session_train(s, &req, on_progress, ud, &res);    // callback on rank 0
//   ddl_session_evaluate(s, DDL_SPLIT_TEST, &ev);
//   ddl_session_destroy(&s);
//
// Rules every function follows:
// - Collective over the session's communicator (a duplicate of the one passed to create,
//   so the caller's own traffic on comm never mixes with the engine's). Every rank calls
//   the same function in the same order; arguments marked "rank 0" are read on rank 0
//   only (other ranks pass NULL / 0 and learn what they need by broadcast).
// - Rank 0 validates its arguments completely before any other collective starts.
// - Every function ends with all ranks agreeing on the status (ddl_agree): either every
//   rank returns DDL_OK or every rank returns the same error code, with the message of
//   the lowest failing rank. A failure on one rank (an allocation, a shard, a label)
//   never leaves another rank blocked in a collective.
// - A failed call changes nothing observable: the model, the cursor and the files are
//   as before (a train that fails part way keeps the steps it completed; the result
//   says how many).
// - No function allocates per step: batches move through Repartition plans built at
//   creation (rank 0 -> the input partition, the output partition -> rank 0).
#ifndef DDL_SESSION_H
#define DDL_SESSION_H

#include <mpi.h>
#include <stdbool.h>
#include <stdint.h>

#include "ddl/agree.h" // ddl_agree, which every function here ends with
#include "ddl/model.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- session --------------------------------------------------------------------------

typedef struct ddl_session ddl_session_t;

// Read on rank 0 only (other ranks may pass NULL): every rank learns them by broadcast.
typedef struct ddl_session_options {
    const char *checkpoint_dir; // where ddl_session_save writes (NULL: none); the path must
                                // be reachable from every rank (each writes its shard)
    int64_t checkpoint_every;   // checkpoint every K optimizer steps inside train and
                                // step (0: never; > 0 needs checkpoint_dir)
} ddl_session_options;

// Builds the model from rank 0's spec text (validated on rank 0, then broadcast and
// built on every rank). `source` (rank 0's) names the spec in messages. A spec for
// another world size, a malformed spec, two layers with one name, or a failure while
// building on any rank (an allocation on one rank included) fails on every rank, with
// everything freed. `out` must not be NULL on any rank. The caller owns *out
// (ddl_session_destroy). Collective over comm.
DDL_EXTERN ddl_status ddl_session_create(MPI_Comm comm, const char *spec_text,
                                         const char *source, const ddl_session_options *opts,
                                         ddl_session_t **out);
// Not collective in communication, but every rank must destroy its session. NULL-safe.
DDL_EXTERN void       ddl_session_destroy(ddl_session_t **s);

DDL_EXTERN ddl_model_t *ddl_session_model(const ddl_session_t *s);

// Opens rank 0's path as the session's data. A regular file is an HDF5 dataset (ddl/h5.h:
// "x" shaped [N, input...] and "y" [N, output...], in groups "train" and "test" or once at
// the root for both splits), for a model with dense targets: every rank reads only its
// own box of each sample of a batch straight from the file into its partition's buffers,
// and nothing is scattered from rank 0 (ddl_session_data_bytes_read counts what this
// rank read). Every check of the file (datasets, dtypes, shapes, N) is made on every rank
// before it is accepted, and a value check that fails on one rank's box fails the step
// on every rank.
// Otherwise it loads an IDX directory holding both splits and checks each against the
// model: sample shape (the IDX dims are the input's trailing dims, e.g. 28 x 28 for
// [1, 28, 28]), label range [0, classes), and at least one batch of training samples.
// A model with dense targets takes the images themselves (pixel / 255) as its targets
// (the spec's "data.target": "image"). Replaces the current data only on success; the
// cursor is kept. Collective.
DDL_EXTERN ddl_status ddl_session_open_data(ddl_session_t *s, const char *dir);
// Bytes of data this rank has read from the open HDF5 file since it was opened (0 for
// other data). Local.
DDL_EXTERN uint64_t ddl_session_data_bytes_read(const ddl_session_t *s);
// Uses the data the spec generates ("data": {"synthetic": {...}}, ddl/synth.h): training
// and test splits of the spec's sizes, made batch by batch on rank 0 from (seed, split,
// sample index), shuffled per epoch like a dataset, with the spec's targets (labels, or
// the clean volume or the object mask, ddl_synth_batch_targets). EINVAL when the spec
// has none.
// Replaces the current data only on success; the cursor is kept. Collective.
DDL_EXTERN ddl_status ddl_session_open_synthetic(ddl_session_t *s);
DDL_EXTERN bool       ddl_session_has_data(const ddl_session_t *s);

typedef enum { DDL_SPLIT_TRAIN = 0, DDL_SPLIT_TEST = 1 } ddl_split;

// The data cursor: the next training batch is batch `batch` of epoch `epoch` (0-based).
typedef struct ddl_cursor {
    int64_t epoch, batch;
} ddl_cursor;
DDL_EXTERN ddl_cursor ddl_session_cursor(const ddl_session_t *s);
// Moves the cursor to rank 0's `c` (e.g. back to the start after opening other data):
// epoch in [0, 2^40], batch in [0, batches per epoch) when data is open. Collective.
DDL_EXTERN ddl_status ddl_session_set_cursor(ddl_session_t *s, ddl_cursor c);
DDL_EXTERN int64_t    ddl_session_steps_per_epoch(const ddl_session_t *s); // 0 without data

// ---- training ---------------------------------------------------------------------------

typedef struct ddl_progress {
    int64_t step;         // optimizer steps so far (global)
    int64_t epoch;        // 1-based epoch of the step just taken
    int64_t batch;        // 1-based batch within that epoch
    int64_t steps_per_epoch;
    int64_t done, total;  // steps taken in this call, and planned
    double  loss;         // this step's loss
    double  accuracy;     // this step's batch accuracy (dense targets: of the values for
                          // bce and bce_with_logits, -1 for the other dense losses)
    double mse;           // dense targets: this step's mean squared error of the
                          // prediction (ddl_dense_metrics); -1 for a classifier
    double  mean_loss;    // mean loss over this epoch so far
    double  images_per_s; // over this epoch so far
    bool    epoch_end;    // the step finished an epoch
    bool    durable;      // a checkpoint of this step is durable on disk
} ddl_progress;

// Called on rank 0 after every step (after that step's checkpoint, if any). Return true
// to stop at this step boundary (the decision is broadcast to every rank; the result
// then has .cancelled set unless that was the last planned step anyway).
typedef bool (*ddl_progress_cb)(const ddl_progress *p, void *user_data);

// An interlude: the ranks lent to the caller at a step boundary of ddl_session_train, for
// inference between steps (the daemon's answers during a Train). After each step's
// callback, rank 0 calls want(ud); when it returns true (decided on rank 0, broadcast
// with the stop flag), every rank calls run(ud), which may make collective session calls
// that leave the weights, the optimizer and the cursor as they are (ddl_session_predict,
// ddl_session_evaluate_batch): the training trajectory is then the same bit for bit. run
// reports its own errors; the Train goes on. Set it alike on every rank; NULL turns it off.
typedef struct ddl_interlude {
    bool (*want)(void *ud); // rank 0
    void (*run)(void *ud);  // every rank
    void *ud;
} ddl_interlude;
DDL_EXTERN void ddl_session_set_interlude(ddl_session_t *s, const ddl_interlude *il);

// Rank 0's request is the one that counts (broadcast). Exactly one field is > 0.
typedef struct ddl_train_request {
    int64_t steps;  // > 0: exactly this many steps (crossing epochs as needed), or
    int64_t epochs; // > 0: until the cursor reaches the end of this many more epochs (the
                    // current, possibly partial, epoch counts as the first)
} ddl_train_request;

typedef struct ddl_train_result {
    int64_t steps_done;
    int64_t step;           // optimizer steps after the call
    double  mean_loss;      // over the steps done
    double  accuracy;       // over the steps done (-1 as in ddl_progress)
    double  images_per_s;
    bool    cancelled;
    int64_t durable_step;   // newest durable checkpoint step (-1: none)
    double  mse;            // dense targets: over the steps done; -1 for a classifier
} ddl_train_result;

// Trains over the training split from the cursor, shuffling each epoch by (seed, epoch),
// checkpointing every checkpoint_every steps. Collective; req, cb and user_data on rank 0.
// DDL_EBUSY without data; DDL_EINVAL for a bad request or a cursor outside this data's
// epoch. On a failure part way *out (when not NULL) still says how many steps were kept.
DDL_EXTERN ddl_status ddl_session_train(ddl_session_t *s, const ddl_train_request *req,
                                        ddl_progress_cb cb, void *user_data,
                                        ddl_train_result *out);

typedef struct ddl_step_result {
    int64_t step;
    double  loss;
    double  accuracy; // argmax hits / count (-1 as in ddl_progress)
    bool    durable;  // a checkpoint of this step is durable (checkpoint_every reached)
    double  mse;      // dense targets: of this step's prediction; -1 for a classifier
} ddl_step_result;

// The targets of `count` inline samples, in bytes: count * ddl_spec_label_elems INT64
// labels in [0, classes) (one per sample, or per output voxel for a segmentation model,
// [count, spatial...] row-major), or for a loss on dense targets (ddl_spec_dense_targets)
// count * ddl_spec_output_elems values in the spec's dtype, shaped like the output.
DDL_EXTERN size_t ddl_session_target_bytes(const ddl_session_t *s, int64_t count);

// One optimizer step on rank 0's inline batch: `count` samples (must equal the spec's
// batch size) of the spec's input shape in `x` (x_bytes = count * sample * dtype size,
// the spec's dtype) and their targets (t_bytes = ddl_session_target_bytes(s, count)).
// Every size is checked on rank 0 first, then the values (ranges, finiteness) by the
// model, still before any data moves. Collective.
DDL_EXTERN ddl_status ddl_session_step(ddl_session_t *s, const void *x, size_t x_bytes,
                                       const void *targets, size_t t_bytes, int64_t count,
                                       ddl_step_result *out);

typedef struct ddl_eval_result {
    int64_t count;
    double  loss;     // mean over the samples
    double  accuracy; // of the samples, or of the voxels for a segmentation model
    double  fg_iou;   // segmentation (whole splits): mean intersection over union of the
                      // foreground classes 1..classes-1 that occur; -1 otherwise
    double mse;       // dense targets (whole splits): mean squared error of the
                      // prediction over every value; -1 otherwise
    double rel_l2;    // dense targets (whole splits): ||p - t|| / ||t||; -1 otherwise
} ddl_eval_result;

// Loss and accuracy over a whole split (rank 0's choice; the last batch padded, padding
// ignored). DDL_EBUSY without data. Collective.
DDL_EXTERN ddl_status ddl_session_evaluate(ddl_session_t *s, ddl_split split,
                                           ddl_eval_result *out);
// The same over rank 0's inline samples: count >= 1 samples in exactly x_bytes = count *
// sample * dtype size and their targets (t_bytes = ddl_session_target_bytes(s, count)),
// processed batch by batch; fg_iou, mse and rel_l2 as for a split. Collective.
DDL_EXTERN ddl_status ddl_session_evaluate_batch(ddl_session_t *s, const void *x, size_t x_bytes,
                                                 const void *targets, size_t t_bytes, int64_t count,
                                                 ddl_eval_result *out);
// The whole output (ddl_spec_output_shape per sample: logits [count, classes], or
// [count, C, spatial...] for segmentation and dense models; the spec's dtype) for rank 0's
// `count` >= 1 samples, written on rank 0 into `logits` (logits_bytes must hold them).
// Any count: batch by batch, never reading past x_bytes.
DDL_EXTERN ddl_status ddl_session_predict(ddl_session_t *s, const void *x, size_t x_bytes,
                                          int64_t count, void *logits, size_t logits_bytes);

// The first `count` samples of a split with the model's outputs for them, for a look at
// what the model predicts (the daemon's dashboard), on IDX or generated data. *n =
// min(count, batch size, split size) and rank 0 receives the samples as the model sees
// them (normalised, the spec's dtype) in x (x_bytes must hold them), their targets as the
// model trains on them in targets (t_bytes >= ddl_session_target_bytes(s, *n): INT64
// labels, label_elems per sample, one per voxel for segmentation; dense targets in the
// spec's dtype, shaped like the output) and the whole outputs (as ddl_session_predict) in
// out (out_bytes likewise); other ranks pass NULL and 0. HDF5 data gives *n = 0 and runs
// nothing: each rank reads only its own box of a sample, so rank 0 never holds one whole.
// Collective; agreed.
DDL_EXTERN ddl_status ddl_session_predict_samples(ddl_session_t *s, ddl_split split, int64_t count,
                                                  void *x, size_t x_bytes, void *targets,
                                                  size_t t_bytes, void *out, size_t out_bytes,
                                                  int64_t *n);

// ---- state ----------------------------------------------------------------------------

// Checkpoints model, optimizer, cursor and RNG state into the session's checkpoint_dir
// (or rank 0's `dir` when not NULL); *step receives the durable step. Collective.
DDL_EXTERN ddl_status ddl_session_save(ddl_session_t *s, const char *dir, int64_t *step);
// Restores from rank 0's `path` (a checkpoint root: `latest`, or with step >= 0 that
// step's directory; or a step directory) onto this world size. The data cursor is
// validated (integers, not strings; epoch in [0, 2^40]; batch in [0, batches per epoch)
// when data is open) and its seed must match the spec's (DDL_EINVAL otherwise); an empty
// caller state (a ddl_model_save checkpoint) means cursor (0, 0). DDL_ENOTFOUND when there
// is none; DDL_ECORRUPT for a damaged one. A refused restore leaves weights, optimizer
// state, step and cursor as they were. Collective.
DDL_EXTERN ddl_status ddl_session_restore(ddl_session_t *s, const char *path, int64_t step);
DDL_EXTERN int64_t    ddl_session_durable_step(const ddl_session_t *s); // -1: none

// The global (unsharded) weights: parameters and buffers (batch-norm running stats) in
// spec order. Names, dtype and global shapes are known on every rank.
DDL_EXTERN int              ddl_session_nweights(const ddl_session_t *s);
DDL_EXTERN const char      *ddl_session_weight_name(const ddl_session_t *s, int i);
DDL_EXTERN const ddl_shape *ddl_session_weight_shape(const ddl_session_t *s, int i);
DDL_EXTERN ddl_dtype        ddl_session_weight_dtype(const ddl_session_t *s, int i);
// Assembles weight i (rank 0's index) onto rank 0 into `buf` (rank 0: numel * dtype size
// bytes). Collective.
DDL_EXTERN ddl_status ddl_session_gather_weight(ddl_session_t *s, int i, void *buf);
// Sets every weight from rank 0's buffers (bufs[i] for weight i, each of the global
// size), all or nothing. Collective.
DDL_EXTERN ddl_status ddl_session_scatter_weights(ddl_session_t *s, const void *const *bufs);

#ifdef __cplusplus
}
#endif
#endif // DDL_SESSION_H
