// server/ddld.h: the daemon's internal interfaces, shared by its files.
//
//   main.c        command line, MPI start-up, the rank-0 libuv loop, the worker loop,
//                 graceful shutdown in the order gRPC needs (REPORT.md §10).
//   service.c     gRPC core on rank 0: one completion-queue thread runs every call's
//                 state machine, decodes requests, answers the cheap ones (health,
//                 status, KServe liveness) from a snapshot and queues the rest for the
//                 main thread (uv_async_send wakes it).
//   dispatch.c    the main thread's side: validates a queued request completely,
//                 broadcasts one command header to every rank, and every rank runs the
//                 same ddl_session_* call; rank 0 then completes the gRPC call.
//   requests.c    the pure request path (requests.h): protobuf-c decoding, the in-place
//                 WeightChunk parser and the validators; no MPI, no call state (fuzzed by
//                 tests/fuzz/fuzz_requests).
//   status_map.c  the one table from ddl_status to gRPC status codes.
//
// Threads: only main threads run the engine and the command channel; the cq thread
// touches gRPC, protobuf-c and the shared snapshot (ddld_shared, under its mutex); the
// watchdog's heartbeat thread (watchdog.h) uses MPI on its own communicator, so MPI runs
// MPI_THREAD_MULTIPLE unless --watchdog 0 (then FUNNELED).
// Internal names carry the `ddld_` prefix (the daemon's private namespace).
#ifndef DDLD_H
#define DDLD_H

#include <grpc/grpc.h>
#include <grpc/status.h>
#include <protobuf-c/protobuf-c.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "ddl/session.h"
#include "ddl/status.h"

#include "distdl/v1/trainer.pb-c.h"
#include "log.h"

#define DDLD_CHUNK_BYTES ((size_t)1 << 20)   // PullWeights payload per message
#define DDLD_MAX_ELEMENTS ((int64_t)1 << 34) // elements in any request tensor

// ---- configuration (command line) -----------------------------------------------------

typedef struct ddld_config {
    const char *model_path;     // --model: create this model at start
    const char *listen;         // --listen (default 127.0.0.1:50051)
    const char *address_file;   // --address-file: host:port written once serving
    const char *data_root;      // --data-root
    const char *checkpoint_dir; // --checkpoint-dir
    int64_t     checkpoint_every;
    int64_t     checkpoint_interval; // seconds between timed checkpoints (0: none)
    bool        resume;
    int64_t     max_message_bytes;
    int         queue;   // --queue: pending requests and submitted batches
    double      grace_s; // shutdown grace for in-flight calls
    double      watchdog_s; // --watchdog: a rank silent this long ends the job (0: off)
    const char *metrics_listen;       // --metrics-listen: Prometheus endpoint (NULL: off)
    const char *metrics_address_file; // --metrics-address-file: its host:port once serving
    // Authentication and TLS (auth.c): files read on rank 0 before serving.
    const char *token_file;    // --token-file: "ROLE TOKEN" lines
    const char *tls_cert;      // --tls-cert: server certificate chain (PEM)
    const char *tls_key;       // --tls-key: its private key (PEM)
    const char *tls_client_ca; // --tls-client-ca: require client certificates from this CA
    bool        insecure;      // --insecure: plaintext, tokenless listen beyond loopback
} ddld_config;

// ---- status mapping (status_map.c) ---------------------------------------------------

grpc_status_code ddld_status_to_grpc(ddl_status st);
const char      *ddld_grpc_code_name(grpc_status_code code);

// ---- methods ---------------------------------------------------------------------------

typedef enum {
    DDLD_M_CREATE_MODEL,
    DDLD_M_GET_STATUS,
    DDLD_M_SUBMIT_BATCH,
    DDLD_M_STEP,
    DDLD_M_TRAIN,
    DDLD_M_EVALUATE,
    DDLD_M_PREDICT,
    DDLD_M_PULL_WEIGHTS,
    DDLD_M_PUSH_WEIGHTS,
    DDLD_M_CHECKPOINT,
    DDLD_M_RESTORE,
    DDLD_M_SHUTDOWN,
    DDLD_M_HEALTH_CHECK,
    DDLD_M_HEALTH_WATCH,
    DDLD_M_SERVER_LIVE,
    DDLD_M_SERVER_READY,
    DDLD_M_MODEL_READY,
    DDLD_M_MODEL_METADATA,
    DDLD_M_MODEL_INFER,
    DDLD_M_COUNT,
    DDLD_M_INTERNAL = 100 // a job without a call (signals, start-up)
} ddld_method;

// ---- the rank-0 snapshot the cq thread answers from ------------------------------------

typedef struct ddld_weight_info {
    char     *name;
    ddl_dtype dtype;
    ddl_shape shape;
    size_t    bytes;  // numel * item size
    size_t    offset; // in the packed all-weights layout (64-byte aligned)
} ddld_weight_info;

typedef struct ddld_model_info {
    bool              has_model;
    char              name[128];
    ddl_dtype         dtype;
    int64_t           batch_size;
    ddl_shape         input; // per sample
    int64_t           sample_numel;
    int               classes;
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
} ddld_model_info;

typedef struct ddld_shared {
    pthread_mutex_t mu;
    int             world_size;
    ddld_model_info info;      // replaced wholesale by the main thread
    uint64_t        model_gen; // bumps each time info is replaced
    int64_t         step, durable_step, epoch, batch;
    double          last_loss;
    const char     *state; // "idle", "training", "shutting_down"
    char            data_dir[1024];
    bool            serving; // health: SERVING until shutdown begins
    int64_t         dropped_calls; // queued calls dropped unrun (cancelled, past deadline)
    int64_t         step_bytes; // payload bytes a training step moves, over all ranks (0: none yet)
    // Submitted batches (SubmitBatch), oldest first: a ring of unpacked messages.
    Distdl__V1__Batch **batches;
    int                 batch_cap, batch_head, batch_count;
} ddld_shared;

extern ddld_shared ddld_g;

void ddld_model_info_free(ddld_model_info *mi);

// Checks a Batch against the model completely (dtype, shape, byte counts with overflow
// checks, label range). exact: the sample count must equal the batch size. On failure
// writes a message ("x: expected shape [64,1,28,28], got [3,1,28,28]") and returns the
// gRPC code. Not collective; any thread (mi borrowed).
grpc_status_code ddld_batch_check(const ddld_model_info *mi, const Distdl__V1__Batch *b, bool exact,
                                  int64_t *count, char *err, size_t errlen);
// The same for an input tensor alone (Predict, ModelInfer): [n, sample...] of the model
// dtype or UINT8; *count receives n.
grpc_status_code ddld_input_check(const ddld_model_info *mi, const char *what, const char *datatype,
                                  const int64_t *shape, size_t ndim, size_t raw_len, int64_t *count,
                                  char *err, size_t errlen);

// Refuses NaN and +-Inf in a validated input of n samples (raw: the model dtype or UINT8)
// with the first bad element's index. Allocates nothing.
grpc_status_code ddld_finite_check(const ddld_model_info *mi, const char *what, const char *datatype,
                                   const uint8_t *raw, int64_t n, char *err, size_t errlen);

// Wire datatype strings.
const char *ddld_dtype_wire(ddl_dtype dt);

// ---- calls (service.c) ----------------------------------------------------------------

typedef struct ddld_call ddld_call;

// A request handed to the main thread. `msg` is the unpacked request (freed with
// protobuf_c_message_free_unpacked by ddld_job_free); `call` is NULL for internal jobs.
typedef struct ddld_job {
    ddld_method       method;
    ddld_call        *call;
    ProtobufCMessage *msg;
    int               internal; // DDLD_JOB_* for internal jobs
    // PushWeights: the assembled staging buffer (packed layout of ddld_model_info).
    uint8_t *staging;
    bool     staging_owned;
    uint64_t model_gen; // the model the staging layout belongs to
    double   t_arrived; // MPI_Wtime-compatible clock when the request was decoded
} ddld_job;

enum { DDLD_JOB_SHUTDOWN = 1 };

typedef struct ddld_service ddld_service;

// Starts gRPC on cfg->listen and the cq thread; *port receives the bound port.
// Returns NULL with a logged reason on failure. wake is called (any thread) after a
// job was queued.
ddld_service *ddld_service_start(const ddld_config *cfg, void (*wake)(void *), void *wake_ud,
                                 int *port);
// Jobs waiting in the request queue now (metrics). Any thread.
int ddld_service_queue_depth(ddld_service *svc);
// Takes the next queued job (NULL when empty). Main thread.
ddld_job *ddld_service_pop(ddld_service *svc);
// Queues an internal job at the front (signals). Main thread.
void ddld_service_push_internal(ddld_service *svc, int internal);
// True once a Shutdown call was accepted (a running Train stops at its step boundary).
bool ddld_service_shutdown_pending(ddld_service *svc);
// The queued Shutdown was refused (its checkpoint could not be written): carry on.
void ddld_service_shutdown_refused(ddld_service *svc);
// Shutdown phase 1: refuse new work, health NOT_SERVING, finish Watch streams, fail every
// queued job UNAVAILABLE. Main thread.
void ddld_service_close(ddld_service *svc);
// Shutdown phase 0: the decision. GetStatus says "shutting_down" and health NOT_SERVING
// from now on, before any reply that announced the shutdown leaves. Any thread.
void ddld_shared_mark_shutdown(void);
// Shutdown phase 2: the gRPC teardown (shutdown_and_notify, grace, cancel_all, destroy,
// cq drain, grpc_shutdown) and frees svc.
void ddld_service_stop(ddld_service **svc, double grace_s);

void ddld_job_free(ddld_job *job);

// Completes a call: status, message (NULL: none) and an optional response. Any thread;
// never while another batch of the call is outstanding.
void ddld_call_finish(ddld_call *c, grpc_status_code code, const char *msg,
                      const ProtobufCMessage *resp);
// Server streaming: sends msg (copied); when a send is still in flight, queues it
// (bounded; the newest record replaces the last queued one when full).
void ddld_call_send(ddld_call *c, const ProtobufCMessage *msg);
// Server streaming end: the status after every queued message.
void ddld_call_end(ddld_call *c, grpc_status_code code, const char *msg);
bool ddld_call_cancelled(const ddld_call *c);

// PullWeights: streams the packed weights in `data` (described by mi) as WeightChunk
// messages of <= 1 MiB, zero-copy; release(ud) runs once gRPC no longer needs data.
void ddld_call_stream_weights(ddld_call *c, const ddld_model_info *mi, const uint8_t *data,
                              void (*release)(void *), void *ud);

// ---- dispatch (dispatch.c) -------------------------------------------------------------

// The command header every rank receives, one per command (fixed size, MPI_BYTE).
typedef struct ddld_cmd {
    int32_t op;    // DDLD_OP_*
    int32_t flags; // DDLD_CF_*
    int64_t arg[4];
} ddld_cmd;

enum {
    DDLD_OP_NONE = 0,
    DDLD_OP_QUIT,
    DDLD_OP_CREATE, // flags REPLACE
    DDLD_OP_OPEN_DATA,
    DDLD_OP_STEP,       // arg0 count
    DDLD_OP_TRAIN,      // arg0 steps, arg1 epochs
    DDLD_OP_EVAL_SPLIT, // arg0 split
    DDLD_OP_EVAL_BATCH, // arg0 count
    DDLD_OP_PREDICT,    // arg0 count
    DDLD_OP_PULL,
    DDLD_OP_PUSH,
    DDLD_OP_SAVE,
    DDLD_OP_RESTORE, // arg0 step (-1 latest)
};

typedef struct ddld_dispatch ddld_dispatch;

// Every rank: the dispatcher over a duplicate of world (the command channel) and the
// session (its own duplicate). cfg is borrowed for the daemon's lifetime.
ddld_dispatch *ddld_dispatch_create(const ddld_config *cfg, MPI_Comm world);
void           ddld_dispatch_destroy(ddld_dispatch **d);

// Ranks > 0: receive and execute commands until QUIT; returns QUIT's exit code.
// Waits with a non-blocking broadcast polled with a growing sleep (idle is idle).
int ddld_dispatch_worker_loop(ddld_dispatch *d);

// Rank 0, main thread. `poll` runs between training steps (the libuv loop, NOWAIT) and
// `stopping` says whether shutdown began (a Train then stops at the step boundary).
void ddld_dispatch_set_hooks(ddld_dispatch *d, ddld_service *svc, void (*poll)(void *),
                             bool (*stopping)(void *), void *ud);
// Start-up work: --model and --resume. Returns 0 or the exit code (2) after logging.
int ddld_dispatch_startup(ddld_dispatch *d);
// Validates and runs one job; completes its call; frees the job.
void ddld_dispatch_run(ddld_dispatch *d, ddld_job *job);
// SIGUSR1: asks for a checkpoint into --checkpoint-dir; a running Train takes it at the
// next step boundary and goes on, otherwise the main loop runs it when the job ends.
void ddld_dispatch_request_checkpoint(ddld_dispatch *d);
// The timer's variant: only when steps were taken since the newest durable checkpoint.
void ddld_dispatch_request_checkpoint_if_stale(ddld_dispatch *d);
void ddld_dispatch_checkpoint_pending(ddld_dispatch *d);
// Final checkpoint at shutdown (when --checkpoint-dir is set and a model exists).
void ddld_dispatch_final_checkpoint(ddld_dispatch *d);
// Releases the workers: they leave their loop with `code`.
void ddld_dispatch_quit(ddld_dispatch *d, int code);

#endif // DDLD_H
