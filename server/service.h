// server/service.h: gRPC core on rank 0 (service.c): the calls, the jobs they become for
// the main thread, and the service's life cycle. Nothing here calls into dispatch.c: the
// dispatcher uses this API to complete the calls it ran.
#ifndef DDLD_SERVICE_H
#define DDLD_SERVICE_H

#include <grpc/status.h>
#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "methods.h"
#include "model_info.h"

#define DDLD_CHUNK_BYTES ((size_t)1 << 20) // PullWeights payload per message

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
// Takes the first queued Predict or ModelInfer job, ahead of the others (NULL: none).
// Main thread, at a Train's step boundary (the other jobs wait for the Train).
ddld_job *ddld_service_pop_inference(ddld_service *svc);
// Queues an internal job at the front (signals). Main thread.
void ddld_service_push_internal(ddld_service *svc, int internal);
// True once a Shutdown call was accepted (a running Train stops at its step boundary).
bool ddld_service_shutdown_pending(ddld_service *svc);
// The queued Shutdown was refused (its checkpoint could not be written): carry on.
void ddld_service_shutdown_refused(ddld_service *svc);
// Shutdown phase 1: refuse new work, health NOT_SERVING, finish Watch streams, fail every
// queued job UNAVAILABLE. Main thread.
void ddld_service_close(ddld_service *svc);
// Shutdown phase 2: the gRPC teardown (shutdown_and_notify, grace, cancel_all, destroy,
// cq drain, grpc_shutdown) and frees svc.
void ddld_service_stop(ddld_service **svc, double grace_s);

void ddld_job_free(ddld_job *job);

// ---- calls from other transports (http.c) ---------------------------------------------

// A call's outcome for a transport other than gRPC: code, message (NULL: none) and, when
// code is OK, the response (valid only during the callback). Runs once per call, on
// whichever thread answers it: the caller's own (inside ddld_service_submit, for calls
// answered from the snapshot or refused at once), or the main thread.
typedef void (*ddld_call_done)(void *ud, grpc_status_code code, const char *msg,
                               const ProtobufCMessage *resp);
// Runs request m (owned; a message of the method's request type) exactly as a gRPC call
// of `method` would run: a CQ row is answered here, from the snapshot; an ENGINE row is
// queued for the ranks (refused RESOURCE_EXHAUSTED when --queue jobs wait, UNAVAILABLE
// once shutdown began) and joins dynamic batching like any other. The caller has already
// admitted it (auth). done(ud, ...) always runs exactly once. With hold non-NULL, *hold
// receives a reference to the call (NULL when none could be made), for ddld_call_cancel,
// which the caller drops with ddld_call_release. Any thread.
void ddld_service_submit(ddld_service *svc, ddld_method method, ProtobufCMessage *m,
                         ddld_call_done done, void *ud, ddld_call **hold);
// A reference to a call, and its release (NULL: nothing). Any thread.
void ddld_call_hold(ddld_call *c);
void ddld_call_release(ddld_call *c);
// The transport's client went away: the call is cancelled as a gRPC client's cancel
// cancels it. Still queued, it leaves the queue and is answered CANCELLED now; waiting for
// its batch, it is dropped there; already running, it finishes. Once per call counts; any
// thread, with a reference held.
void ddld_call_cancel(ddld_call *c);
// The method's gRPC path (the table, proto/rpc_methods.h).
const char *ddld_method_path(ddld_method method);

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

#endif // DDLD_SERVICE_H
