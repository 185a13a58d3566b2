// ddl_client.h: libdistdl-client, the C client of the distdld daemon (distdl.v1.Trainer,
// grpc.health.v1.Health and the KServe v2 inference service) over gRPC.
//
//   ddl_client_t *c;
//   ddl_client_options o = ddl_client_options_default();
//   if (ddl_client_connect("127.0.0.1:50051", &o, &c) != DDL_OK)
//       fprintf(stderr, "%s\n", ddl_last_error());
//   ddl_client_train_request tr = {.epochs = 1, .progress_every = 50};
//   ddl_client_train(c, &tr, on_progress, NULL, NULL);     // on_progress returns 1 to cancel
//   ddl_client_eval_result ev;
//   ddl_client_evaluate(c, "", "test", NULL, &ev);
//   ddl_client_pull_weights_to_file(c, "weights.safetensors");
//   ddl_client_destroy(&c);
//
// Rules every function follows:
// - Synchronous: a call returns when the RPC has finished. Every call may be made from any
//   thread, and many threads may call concurrently on one connection (each call has its own
//   completion queue; the channel is shared).
// - Returns a ddl_status: DDL_OK, or an error. After an error, ddl_client_last_code() gives
//   the gRPC status code of this thread's last call (a DDL_RPC_* value, DDL_RPC_OK after a
//   local error) and ddl_last_error() its message, method and code first
//   ("Step: INVALID_ARGUMENT: batch.x: expected shape [64, 1, 28, 28] ..., got ...").
//   The mapping: INVALID_ARGUMENT -> DDL_EINVAL, NOT_FOUND -> DDL_ENOTFOUND,
//   FAILED_PRECONDITION -> DDL_EBUSY, RESOURCE_EXHAUSTED -> DDL_ENOMEM, DATA_LOSS ->
//   DDL_ECORRUPT, CANCELLED -> DDL_ECANCELED, DEADLINE_EXCEEDED -> DDL_ETIMEDOUT,
//   UNAVAILABLE -> DDL_EIO, anything else -> DDL_EREMOTE.
// - Outputs are written only on success (except where a function says otherwise). Memory
//   the library returns names its free.
// - Pointer arguments are borrowed for the duration of the call.
#ifndef DDL_CLIENT_H
#define DDL_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "ddl/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DDL_CLIENT_VERSION_MAJOR 0
#define DDL_CLIENT_VERSION_MINOR 1
#define DDL_CLIENT_VERSION_PATCH 0

// "0.1.0"
DDL_EXTERN const char *ddl_client_version_string(void);

// ---- status --------------------------------------------------------------------------

// gRPC status codes (numbers as on the wire).
typedef enum {
    DDL_RPC_OK                  = 0,
    DDL_RPC_CANCELLED           = 1,
    DDL_RPC_UNKNOWN             = 2,
    DDL_RPC_INVALID_ARGUMENT    = 3,
    DDL_RPC_DEADLINE_EXCEEDED   = 4,
    DDL_RPC_NOT_FOUND           = 5,
    DDL_RPC_ALREADY_EXISTS      = 6,
    DDL_RPC_PERMISSION_DENIED   = 7,
    DDL_RPC_RESOURCE_EXHAUSTED  = 8,
    DDL_RPC_FAILED_PRECONDITION = 9,
    DDL_RPC_ABORTED             = 10,
    DDL_RPC_OUT_OF_RANGE        = 11,
    DDL_RPC_UNIMPLEMENTED       = 12,
    DDL_RPC_INTERNAL            = 13,
    DDL_RPC_UNAVAILABLE         = 14,
    DDL_RPC_DATA_LOSS           = 15,
    DDL_RPC_UNAUTHENTICATED     = 16,
} ddl_rpc_code;

// The gRPC status code of the calling thread's most recent client call.
DDL_EXTERN int ddl_client_last_code(void);
// "INVALID_ARGUMENT" for DDL_RPC_INVALID_ARGUMENT; "UNKNOWN_CODE" outside the table.
DDL_EXTERN const char *ddl_client_code_name(int code);

// ---- connection ----------------------------------------------------------------------

typedef struct ddl_client ddl_client_t;

typedef struct ddl_client_options {
    double connect_timeout_s;      // connect waits this long for the channel to be ready
                                   // (0: do not wait; the first call connects)
    double      call_timeout_s;    // deadline of unary calls (0: none); streams have none
    const char *tls_ca_file;       // PEM roots: TLS when set, plaintext when NULL
    const char *tls_cert_file;     // client certificate chain (PEM) for mutual TLS
    const char *tls_key_file;      // its private key (PEM)
    const char *tls_server_name;   // expected name in the server certificate (override)
    const char *token;             // bearer token sent as "authorization: Bearer <token>"
    int64_t     max_receive_bytes; // largest message accepted (0: 64 MiB, -1: unlimited)
    int         tune_malloc;       // 1: raise glibc's mmap/trim thresholds (process-wide) so
                                   // streaming weights does not page-fault per message
    int         own_connection;    // 1: a TCP connection of its own. 0 (default): gRPC lets
                                   // the connections of one process to the same address with
                                   // the same options share one TCP connection
} ddl_client_options;

// Defaults: connect_timeout_s 10, call_timeout_s 0, plaintext, no token.
DDL_EXTERN ddl_client_options ddl_client_options_default(void);

// Opens a channel to `address` ("host:port", "unix:/path"). With connect_timeout_s > 0
// it fails with DDL_ETIMEDOUT (code UNAVAILABLE) if the daemon cannot be reached in time.
// opts may be NULL (defaults). The caller owns *out (ddl_client_destroy).
DDL_EXTERN ddl_status ddl_client_connect(const char *address, const ddl_client_options *opts,
                                         ddl_client_t **out);
// Closes the channel. No call may be in progress on it. NULL-safe; sets *c = NULL.
DDL_EXTERN void ddl_client_destroy(ddl_client_t **c);

// Reads a bearer token from a file for ddl_client_options.token: the first line that is not
// blank or a comment (a field starting with '#') holds the token alone or "ROLE TOKEN" (a
// line of the daemon's --token-file). The file must not be accessible to other users (chmod
// 600). The caller frees *token with ddl_client_free_token (which also wipes it).
DDL_EXTERN ddl_status ddl_client_read_token_file(const char *path, char **token);
DDL_EXTERN void       ddl_client_free_token(char **token);

// ---- tensors -------------------------------------------------------------------------

typedef enum {
    DDL_WIRE_FP32  = 0,
    DDL_WIRE_FP64  = 1,
    DDL_WIRE_INT64 = 2,
    DDL_WIRE_UINT8 = 3,
} ddl_wire_dtype;

#define DDL_CLIENT_MAX_DIMS 8

// A dense row-major tensor. As an input the data is borrowed; as an output the library
// allocates name and data, freed with ddl_client_tensor_release().
typedef struct ddl_client_tensor {
    char          *name;
    ddl_wire_dtype dtype;
    int            ndim;
    int64_t        shape[DDL_CLIENT_MAX_DIMS];
    void          *data;
    size_t         bytes; // product(shape) * item size
} ddl_client_tensor;

// Bytes of one element (4, 8, 8, 1); 0 for an unknown dtype.
DDL_EXTERN size_t ddl_wire_dtype_size(ddl_wire_dtype d);
// "FP32", "FP64", "INT64", "UINT8".
DDL_EXTERN const char *ddl_wire_dtype_name(ddl_wire_dtype d);
// Frees what the library allocated in *t and zeroes it. NULL-safe.
DDL_EXTERN void ddl_client_tensor_release(ddl_client_tensor *t);

// A set of global (unsharded) weights, in the order the daemon sent them.
typedef struct ddl_client_weights {
    int64_t            count;
    ddl_client_tensor *tensors;
} ddl_client_weights;

// The tensor called `name`, or NULL.
DDL_EXTERN ddl_client_tensor *ddl_client_weights_find(const ddl_client_weights *w,
                                                      const char               *name);
// Frees the set (NULL-safe; sets *w = NULL).
DDL_EXTERN void ddl_client_weights_destroy(ddl_client_weights **w);

// ---- health and inference (grpc.health.v1, KServe v2) ---------------------------------

typedef enum {
    DDL_HEALTH_UNKNOWN         = 0,
    DDL_HEALTH_SERVING         = 1,
    DDL_HEALTH_NOT_SERVING     = 2,
    DDL_HEALTH_SERVICE_UNKNOWN = 3,
} ddl_health_status;

// grpc.health.v1.Health/Check for `service` ("" : the whole server).
DDL_EXTERN ddl_status ddl_client_health_check(ddl_client_t *c, const char *service,
                                              ddl_health_status *out);
// Called for each status a Watch delivers. Return 0 to go on, nonzero to stop watching.
typedef int (*ddl_client_health_cb)(ddl_health_status status, void *user_data);
// grpc.health.v1.Health/Watch: calls cb with the current status and every change until the
// server ends the stream (DDL_OK), cb returns nonzero (DDL_OK) or the call fails.
DDL_EXTERN ddl_status ddl_client_health_watch(ddl_client_t *c, const char *service,
                                              ddl_client_health_cb cb, void *user_data);
// ServerLive / ServerReady / ModelReady(name): *out is 1 or 0.
DDL_EXTERN ddl_status ddl_client_server_live(ddl_client_t *c, int *out);
DDL_EXTERN ddl_status ddl_client_server_ready(ddl_client_t *c, int *out);
DDL_EXTERN ddl_status ddl_client_model_ready(ddl_client_t *c, const char *model, int *out);
// ModelInfer with one input (raw contents); *out receives the first output tensor.
// The caller releases *out (ddl_client_tensor_release).
DDL_EXTERN ddl_status ddl_client_model_infer(ddl_client_t *c, const char *model,
                                             const ddl_client_tensor *x, ddl_client_tensor *out);

// ---- trainer -------------------------------------------------------------------------

typedef struct ddl_client_model_info {
    char    name[128];
    int32_t world_size;
    int64_t num_parameters;
    int64_t batch_size;
    int     input_ndim;
    int64_t input_shape[DDL_CLIENT_MAX_DIMS]; // per sample
    int32_t num_classes;
    char    datatype[16];
} ddl_client_model_info;

// CreateModel from spec text (a distdl-train spec). replace: 1 to replace an existing model.
// name may be NULL. out may be NULL.
DDL_EXTERN ddl_status ddl_client_create_model(ddl_client_t *c, const char *spec_json,
                                              const char *name, int replace,
                                              ddl_client_model_info *out);

// GetStatus. New fields are appended only, so sources (and the Python binding's mirror)
// stay valid; the size grows with them, so a program must be rebuilt against this header
// (there is no size field: libdistdl-client's SOVERSION is still 0).
typedef struct ddl_client_status_info {
    int     has_model;
    char    model_name[128];
    int32_t world_size;
    int64_t step;
    double  last_loss;
    int64_t durable_step; // -1: none
    int32_t queue_depth;
    int32_t queue_capacity;
    char    state[32]; // "idle", "training", "shutting_down"
    int64_t epoch;
    int64_t batch;
    int64_t batch_size;
    int     input_ndim;
    int64_t input_shape[DDL_CLIENT_MAX_DIMS];
    int32_t num_classes;
    char    datatype[16];
    char    data_dir[256];
    int32_t num_partitions;
    // The daemon's call accounting (docs/SERVER.md, "Hostile input, deadlines and
    // backpressure").
    int32_t active_calls;        // gRPC calls not yet answered, this GetStatus excluded
    int32_t request_queue_depth; // engine requests waiting (at most the daemon's --queue)
    int64_t dropped_calls;       // queued calls dropped unrun: cancelled or past their deadline
    int64_t bytes_per_step;      // payload bytes one training step moves between ranks, summed
                                 // over ranks (docs/SCALING.md); 0 before the model's first step
} ddl_client_status_info;

DDL_EXTERN ddl_status ddl_client_get_status(ddl_client_t *c, ddl_client_status_info *out);

// One batch: x [n, sample...] (model dtype, or UINT8 pixels) and what the loss learns
// from, in exactly one of (the other left zeroed):
//   targets  any the model's loss takes: INT64 [n] class labels, INT64 [n, spatial...] a
//            class per output voxel (segmentation), or FP32/FP64 [n, output...] dense
//            targets shaped like the model's output (every loss but cross_entropy)
//   labels   INT64 [n] class labels (the older field; a classifier only)
typedef struct ddl_client_batch {
    ddl_client_tensor x;
    ddl_client_tensor labels;
    ddl_client_tensor targets;
} ddl_client_batch;

// SubmitBatch: streams n batches into the daemon's queue. *accepted (may be NULL) receives
// how many were appended, *queue_depth (may be NULL) the queue depth after.
DDL_EXTERN ddl_status ddl_client_submit_batches(ddl_client_t *c, const ddl_client_batch *b,
                                                int64_t n, int32_t *accepted, int32_t *queue_depth);

typedef struct ddl_client_step_result {
    int64_t step;
    double  loss;
    double  accuracy; // -1 where none applies (dense targets but bce)
    int     durable;
    double  mse; // dense targets: of the step's prediction; -1 for a classifier
} ddl_client_step_result;

// Step: one optimizer step on `batch`, or on the next submitted batch when batch is NULL.
DDL_EXTERN ddl_status ddl_client_step(ddl_client_t *c, const ddl_client_batch *batch,
                                      ddl_client_step_result *out);

typedef struct ddl_client_train_request {
    int64_t     steps; // exactly one of steps / epochs > 0
    int64_t     epochs;
    const char *dataset;        // relative to the daemon's --data-root (NULL or "": the root)
    int32_t     progress_every; // a record every K steps (0: every step); epoch ends always
} ddl_client_train_request;

typedef struct ddl_client_progress {
    int64_t step;
    int64_t epoch;
    int64_t batch;
    int64_t steps_per_epoch;
    double  loss;
    double  accuracy;
    double  images_per_second;
    int64_t done;
    int64_t total;
    int     epoch_end;
    int     durable;
    int     finished;
    double  mean_loss;
    double  mse; // dense targets: this step's mean squared error; -1 for a classifier
} ddl_client_progress;

// Called on the calling thread for each progress record. Return 0 to go on, nonzero to
// cancel the Train (the daemon stops at the next step boundary; the call then returns
// DDL_ECANCELED with code CANCELLED).
typedef int (*ddl_client_progress_cb)(const ddl_client_progress *p, void *user_data);

// Train over the daemon's dataset. cb may be NULL. *last (may be NULL) receives the last
// record received, also on cancellation.
DDL_EXTERN ddl_status ddl_client_train(ddl_client_t *c, const ddl_client_train_request *req,
                                       ddl_client_progress_cb cb, void *user_data,
                                       ddl_client_progress *last);

typedef struct ddl_client_eval_result {
    int64_t count;
    double  loss;
    double  accuracy; // per sample, or per voxel (segmentation, masks); -1: none applies
    double  mse;      // dense targets: of the prediction; -1 otherwise
    double  rel_l2;   // dense targets: ||prediction - target|| / ||target||; -1 otherwise
    double  fg_iou;   // segmentation, a whole split: the foreground mean IoU; -1 otherwise
} ddl_client_eval_result;

// Evaluate on a dataset split ("test" or "train"; NULL: "test") or, when batch is not
// NULL, on those inline samples.
DDL_EXTERN ddl_status ddl_client_evaluate(ddl_client_t *c, const char *dataset, const char *split,
                                          const ddl_client_batch *batch,
                                          ddl_client_eval_result *out);

// Predict: the model's whole output for x [n, sample...]: logits [n, classes], or
// [n, C, spatial...] for segmentation and dense models. The caller releases *logits.
DDL_EXTERN ddl_status ddl_client_predict(ddl_client_t *c, const ddl_client_tensor *x,
                                         ddl_client_tensor *logits);

// PullWeights into memory: the global tensors. The caller owns *out
// (ddl_client_weights_destroy).
DDL_EXTERN ddl_status ddl_client_pull_weights(ddl_client_t *c, ddl_client_weights **out);
// PullWeights into a safetensors file (written to path.tmp, then renamed).
DDL_EXTERN ddl_status ddl_client_pull_weights_to_file(ddl_client_t *c, const char *path);
// PushWeights: streams the tensors in chunks of at most 1 MiB. distdld applies a push
// atomically and only as a complete set: every weight of the model, each exactly once
// (pull, modify, push back). *tensors and *bytes (may be NULL) receive what it accepted.
DDL_EXTERN ddl_status ddl_client_push_weights(ddl_client_t *c, const ddl_client_tensor *t,
                                              int64_t n, int32_t *tensors, int64_t *bytes);
// PushWeights from a safetensors file (F32, F64, I64, U8 tensors).
DDL_EXTERN ddl_status ddl_client_push_weights_from_file(ddl_client_t *c, const char *path);

// ---- safetensors files ---------------------------------------------------------------

// Reads a safetensors file into a weight set (validating sizes). Caller owns *out.
DDL_EXTERN ddl_status ddl_safetensors_read(const char *path, ddl_client_weights **out);
// Writes a weight set as a safetensors file (temp file, fsync, rename).
DDL_EXTERN ddl_status ddl_safetensors_write(const char *path, const ddl_client_weights *w);

// ---- .npy files -----------------------------------------------------------------------

// Reads a NumPy .npy file (format 1.0-3.0, C order, little-endian float32 '<f4', float64
// '<f8', int64 '<i8' or uint8 '|u1') into *out, e.g. the input of ddl_client_predict. The
// header, shape and data size are validated against the file before anything is allocated;
// errors are DDL_EIO (cannot open or read) or DDL_EPROTO (not a supported .npy), naming the
// file and the problem. The caller releases *out (ddl_client_tensor_release). This is the
// client's own small reader: the engine's (ddl/npy.h) builds engine tensors, knows only
// f32/f64 and would pull the engine's tensor module into this library.
DDL_EXTERN ddl_status ddl_client_npy_read(const char *path, ddl_client_tensor *out);
// Writes t as a .npy file (format 1.0), e.g. the logits of ddl_client_predict: to path.tmp,
// fsync, then renamed over path, so a reader never sees a partial file.
DDL_EXTERN ddl_status ddl_client_npy_write(const char *path, const ddl_client_tensor *t);

typedef struct ddl_client_checkpoint_result {
    int64_t step;
    int     durable;
    char    path[512];
} ddl_client_checkpoint_result;

// Checkpoint into dir (NULL: the daemon's --checkpoint-dir).
DDL_EXTERN ddl_status ddl_client_checkpoint(ddl_client_t *c, const char *dir,
                                            ddl_client_checkpoint_result *out);
// Restore step `step` (>= 0), or the newest durable checkpoint when step < 0, from dir
// (NULL: --checkpoint-dir). *restored_step may be NULL.
DDL_EXTERN ddl_status ddl_client_restore(ddl_client_t *c, int64_t step, const char *dir,
                                         int64_t *restored_step);
// Shutdown the daemon, after a final checkpoint when checkpoint is 1. *durable_step may be
// NULL.
DDL_EXTERN ddl_status ddl_client_shutdown(ddl_client_t *c, int checkpoint, int64_t *durable_step);

#ifdef __cplusplus
}
#endif
#endif // DDL_CLIENT_H
