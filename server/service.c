// server/service.c: gRPC core on rank 0. One completion-queue thread ("cq thread") runs
// every call's state machine; the main thread (libuv + MPI) receives engine work through a
// bounded job queue and completes those calls itself.
//
// Call lifetime. Every call carries two tags: `op` for its one outstanding batch of
// message/status operations, and `close` for a RECV_CLOSE_ON_SERVER batch started as
// soon as the call arrives (it completes when the call ends and tells us whether the
// client cancelled). A call is reference counted: one reference for the op side (dropped
// when the status batch completes or an op batch fails), one for the close side, and one
// per job that the main thread holds. The state is always set before a batch starts,
// because its completion may run on the cq thread before start_batch returns.
//
// Streams. Server-streaming sends go through the call's mutex: at most one send in flight,
// later records wait in a small ring (the newest replaces the last one when it is full),
// and the end status waits for the ring to drain. PullWeights chunks are produced by the
// cq thread as each send completes and point into the weights snapshot without copying.
// Client streams (SubmitBatch, PushWeights) keep one RECV_MESSAGE outstanding and check
// each message as it arrives; PushWeights parses its chunks in place and copies the data
// once, into a staging buffer that the main thread scatters only after the whole stream
// was found complete.
//
// Health, GetStatus and the KServe liveness/metadata calls are answered here, from the
// snapshot the main thread publishes (ddld_shared), so they never wait for the engine.
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "auth.h"
#include "config.h"
#include "ddl/base.h"
#include "grpc/health/v1/health.pb-c.h"
#include "inference/grpc_service.pb-c.h"
#include "log.h"
#include "methods.h"
#include "metrics.h"
#include "model_info.h"
#include "requests.h"
#include "service.h"
#include "shared.h"

// ---- method table ---------------------------------------------------------------------

// One entry per row of proto/rpc_methods.h, indexed by ddld_method.
static const struct method_desc {
    const char                       *path;
    enum ddl_rpc_kind                 kind;
    enum ddl_rpc_where                where;
    const ProtobufCMessageDescriptor *req;
} methods[] = {
#define X(name, path, kind, role, where, request, handler)                                         \
    [DDLD_M_##name] = {path, DDL_RPC_##kind, DDL_RPC_##where, &request##__descriptor},
    DDL_RPC_METHODS(X)
#undef X
};
_Static_assert(sizeof methods / sizeof methods[0] == DDLD_M_COUNT, "one entry per method");
#define M_GENERIC DDLD_M_COUNT // any other method: UNIMPLEMENTED

// ---- calls ------------------------------------------------------------------------------

enum { TAG_OP, TAG_CLOSE, TAG_SHUTDOWN };
enum { ST_NEW, ST_RECV, ST_IDLE, ST_SEND, ST_FINISH };
#define SEND_RING 16
#define REARM_MS 50 // retry period of a method request_new could not arm
// Requests kept outstanding per method. gRPC matches an arriving call to one of them on
// its own thread; a call that finds none waits in gRPC's pending list until we ask again.
// With a single request per method (as before), every call of a burst waited for one
// round trip through the cq thread, and a method whose one request never came back was
// dead for good: all its later calls sat in that list until their deadlines, while other
// methods answered (what two CI runs showed; not reproduced here, so this is hardening,
// not a proven cause). A request that completes without a call while the server is up is
// now asked again (on_op). gRPC core 1.51's matcher also drops the request it pairs with
// a zombied pending call (later releases put it back), though in its code a pending call
// becomes a zombie only at shutdown. Several outstanding requests per method, as gRPC's
// own wrapped-language servers keep, make a burst go through gRPC's fast path and leave
// a method served if one is lost.
#define ARMED_PER_METHOD 8

struct tag {
    ddld_call *call;
    int        what;
};

// The PullWeights stream: each chunk's data slice holds a reference to it.
struct wstream {
    atomic_int refs;
    void (*release)(void *);
    void *ud;
};

struct ddld_call {
    struct tag          op, close;
    ddld_service       *svc;
    atomic_int          refs;
    int                 method;
    int                 state;
    double              t_arrived; // ddld_now() when the call arrived (metrics)
    grpc_call          *call;
    gpr_timespec        deadline;
    grpc_metadata_array md;
    grpc_call_details   details; // generic calls only
    grpc_byte_buffer   *recv_bb;
    grpc_byte_buffer   *send_bb;
    grpc_slice          status_details;
    bool                has_details;
    int                 close_cancelled;
    atomic_bool         cancelled;
    bool                live;     // counted in active_calls (a client's call, not yet answered)
    bool                inflight; // counted in svc->inflight: arrived before the teardown

    pthread_mutex_t   mu; // the send side of streams
    bool              sent_md, send_busy, dead, end_pending;
    grpc_status_code  end_code;
    char             *end_msg;
    grpc_byte_buffer *ring[SEND_RING];
    int               nring;
    ddld_call        *next_watch;
    // Another transport's call (ddld_service_submit): no grpc_call; the outcome goes to done.
    ddld_call_done done;
    void          *done_ud;

    // SubmitBatch
    int accepted;
    // PushWeights: a copy of the model's weight table and the staging buffer.
    ddld_model_info *push_mi;
    uint64_t         push_gen;
    gpr_timespec     push_t0; // first chunk (DDLD_VERBOSE timing)
    uint8_t         *staging;
    bool             staging_owned;
    size_t          *push_got; // bytes received per weight
    int              push_cur; // the weight being received (-1: none yet)
    // PullWeights
    int               w_n, w_cur;
    ddld_weight_info *w_info;
    size_t            w_off;
    const uint8_t    *w_data;
    struct wstream   *w_stream;
};

struct ddld_service {
    const ddld_config     *cfg;
    grpc_server           *server;
    grpc_completion_queue *cq;
    pthread_t              thread;
    void                  *registered[DDLD_M_COUNT];
    struct tag             shutdown_tag;

    pthread_mutex_t mu; // jobs, closing, stopping, inflight, watchers, shutdown_done, staging
    pthread_cond_t  cv; // shutdown_done, inflight reaching 0
    ddld_job      **jobs;
    int             cap, head, count; // ring storage
    int             limit;            // --queue: client jobs waiting at most
    // closing: phase 1, engine work refused; stopping: phase 2, every new call refused;
    // torn_down: grpc_server_shutdown_and_notify was called, no more requests.
    bool       closing, stopping, torn_down, shutdown_done;
    int        inflight; // live calls that arrived before `stopping`: the ones the grace is for
    ddld_call *watchers;
    uint8_t   *staging;
    size_t     staging_cap;
    bool       staging_busy;
    // The internal job (Shutdown's end of the loop), allocated at start so that it never
    // fails, and the DDLD_JOB_* that ddld_service_push_internal asked for (0: none).
    ddld_job *internal_job;
    int       internal_pending;
    // Per method, the requests to ask again: those request_new could not make for want of
    // memory, and those that came back without a call while serving (on_op). The cq
    // thread tries again every REARM_MS while any is set.
    int         rearm[DDLD_M_COUNT + 1];
    atomic_bool rearm_any;

    void (*wake)(void *);
    void       *wake_ud;
    bool        verbose;          // DDLD_VERBOSE=1
    atomic_bool shutdown_pending; // a Shutdown call is queued or running
};

static bool request_new(ddld_service *svc, int method);
static void rearm_methods(ddld_service *svc);
static void call_unref(ddld_call *c);

// Calls from clients that have arrived and are not answered yet (GetStatus active_calls): a
// call leaves the count when its status is handed to gRPC (finish_locked), or when it is
// freed without one (cancelled, or its peer went away).
static atomic_int active_calls;

// A call that dies before a status is handed to gRPC (its client cancelled it, or went
// away, so a receive or a send failed): counted once, CANCELLED, as gRPC's own servers do,
// and no longer active. Called with c->mu held, before c->dead is set; a status sent
// later is dropped (c->dead), so no call is counted twice.
static void died_locked(ddld_call *c)
{
    if (!c->dead && c->live) {
        c->live = false;
        atomic_fetch_sub(&active_calls, 1);
        ddld_metrics_rpc(c->method, GRPC_STATUS_CANCELLED, ddld_now() - c->t_arrived);
    }
}

static void start_batch(ddld_call *c, const grpc_op *ops, size_t n)
{
    grpc_call_error e = grpc_call_start_batch(c->call, ops, n, &c->op, NULL);
    if (e != GRPC_CALL_OK) {
        // A bug in our state machine, never a peer's doing: say so and drop the op side.
        ddld_log("internal: grpc_call_start_batch(%s, state %d) = %d",
                 c->method < DDLD_M_COUNT ? methods[c->method].path : "generic", c->state, e);
        c->dead = true;
        call_unref(c);
    }
}

static grpc_byte_buffer *pack_message(const ProtobufCMessage *m)
{
    size_t     n = protobuf_c_message_get_packed_size(m);
    grpc_slice s = grpc_slice_malloc(n);
    protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(s));
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

// Starts the status batch (with an optional last message). Caller holds c->mu or owns
// the op side alone.
static void finish_locked(ddld_call *c, grpc_status_code code, const char *msg,
                          grpc_byte_buffer *bb)
{
    grpc_op ops[3];
    size_t  n = 0;
    memset(ops, 0, sizeof ops);
    if (!c->sent_md) {
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
        c->sent_md  = true;
    }
    if (bb != NULL) {
        c->send_bb                              = bb;
        ops[n].op                               = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = bb;
    }
    c->status_details = grpc_slice_from_copied_string(msg != NULL ? msg : "");
    c->has_details    = true;
    ops[n].op         = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status           = code;
    ops[n++].data.send_status_from_server.status_details = msg != NULL ? &c->status_details : NULL;
    c->state                                             = ST_FINISH;
    c->send_busy                                         = true;
    ddld_metrics_rpc(c->method, code, ddld_now() - c->t_arrived);
    // Answered: no longer active, before the status can reach the client. A client that
    // asks GetStatus the moment its call returned must not find it still counted (the
    // call's memory is freed later, when gRPC reports the status sent).
    if (c->live) {
        c->live = false;
        atomic_fetch_sub(&active_calls, 1);
    }
    start_batch(c, ops, n);
}

static void send_locked(ddld_call *c, grpc_byte_buffer *bb)
{
    grpc_op ops[2];
    size_t  n = 0;
    memset(ops, 0, sizeof ops);
    if (!c->sent_md) {
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
        c->sent_md  = true;
    }
    c->send_bb                              = bb;
    ops[n].op                               = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = bb;
    c->state                                = ST_SEND;
    c->send_busy                            = true;
    start_batch(c, ops, n);
}

// A transport call's outcome: once, then the op side's reference goes.
static void finish_external(ddld_call *c, grpc_status_code code, const char *msg,
                            const ProtobufCMessage *resp)
{
    pthread_mutex_lock(&c->mu);
    bool first = !c->dead;
    c->dead    = true;
    pthread_mutex_unlock(&c->mu);
    if (!first) {
        return;
    }
    ddld_metrics_rpc(c->method, code, ddld_now() - c->t_arrived);
    if (c->live) {
        c->live = false;
        atomic_fetch_sub(&active_calls, 1);
    }
    c->done(c->done_ud, code, msg, code == GRPC_STATUS_OK ? resp : NULL);
    call_unref(c);
}

void ddld_call_finish(ddld_call *c, grpc_status_code code, const char *msg,
                      const ProtobufCMessage *resp)
{
    if (c->done != NULL) {
        finish_external(c, code, msg, resp);
        return;
    }
    grpc_byte_buffer *bb = (resp != NULL && code == GRPC_STATUS_OK) ? pack_message(resp) : NULL;
    pthread_mutex_lock(&c->mu);
    if (c->dead) {
        if (bb != NULL) {
            grpc_byte_buffer_destroy(bb);
        }
    } else {
        finish_locked(c, code, msg, bb);
    }
    pthread_mutex_unlock(&c->mu);
}

static void finish_code(ddld_call *c, grpc_status_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void finish_code(ddld_call *c, grpc_status_code code, const char *fmt, ...)
{
    char    msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ddld_call_finish(c, code, msg, NULL);
}

void ddld_call_send(ddld_call *c, const ProtobufCMessage *msg)
{
    grpc_byte_buffer *bb = pack_message(msg);
    pthread_mutex_lock(&c->mu);
    if (c->dead || c->end_pending) {
        grpc_byte_buffer_destroy(bb);
    } else if (!c->send_busy) {
        send_locked(c, bb);
    } else if (c->nring < SEND_RING) {
        c->ring[c->nring++] = bb;
    } else {
        // The client reads slower than we produce: keep the newest record.
        grpc_byte_buffer_destroy(c->ring[SEND_RING - 1]);
        c->ring[SEND_RING - 1] = bb;
    }
    pthread_mutex_unlock(&c->mu);
}

void ddld_call_end(ddld_call *c, grpc_status_code code, const char *msg)
{
    pthread_mutex_lock(&c->mu);
    if (!c->dead) {
        if (c->send_busy) {
            c->end_pending = true;
            c->end_code    = code;
            // Out of memory: the status still goes out when the send completes, without
            // its message (finish_locked takes NULL).
            c->end_msg = ddl_strdup(msg != NULL ? msg : "");
        } else {
            finish_locked(c, code, msg, NULL);
        }
    }
    pthread_mutex_unlock(&c->mu);
}

bool ddld_call_cancelled(const ddld_call *c)
{
    return atomic_load(&c->cancelled);
}

// ---- PullWeights: zero-copy chunks ------------------------------------------------------

static void wstream_unref(void *p)
{
    struct wstream *w = p;
    if (atomic_fetch_sub(&w->refs, 1) == 1) {
        if (w->release != NULL) {
            w->release(w->ud);
        }
        ddl_free(w);
    }
}

static size_t put_varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}

// The next WeightChunk: protobuf-c packs the small fields, then field 5 (data) is
// appended by hand as a tag and a length, its bytes a slice into the snapshot.
static grpc_byte_buffer *next_chunk(ddld_call *c)
{
    const ddld_weight_info *w = &c->w_info[c->w_cur];
    size_t len = w->bytes - c->w_off < DDLD_CHUNK_BYTES ? w->bytes - c->w_off : DDLD_CHUNK_BYTES;
    Distdl__V1__WeightChunk ch = DISTDL__V1__WEIGHT_CHUNK__INIT;
    int64_t                 shape[DDL_MAX_DIMS];
    ch.offset = (int64_t)c->w_off;
    if (c->w_off == 0) {
        ch.first    = true;
        ch.name     = w->name;
        ch.datatype = (char *)ddld_dtype_wire(w->dtype);
        for (int d = 0; d < w->shape.ndim; d++) {
            shape[d] = w->shape.d[d];
        }
        ch.n_shape = (size_t)w->shape.ndim;
        ch.shape   = shape;
    }
    size_t     hn = protobuf_c_message_get_packed_size(&ch.base);
    grpc_slice slices[2];
    slices[0]  = grpc_slice_malloc(hn + 11);
    uint8_t *p = GRPC_SLICE_START_PTR(slices[0]);
    protobuf_c_message_pack(&ch.base, p);
    size_t used    = hn;
    size_t nslices = 1;
    if (len > 0) {
        p[used++] = (5 << 3) | 2; // field 5, length-delimited
        used += put_varint(p + used, len);
        atomic_fetch_add(&c->w_stream->refs, 1);
        slices[1] = grpc_slice_new_with_user_data((void *)(c->w_data + w->offset + c->w_off), len,
                                                  wstream_unref, c->w_stream);
        nslices   = 2;
    }
    slices[0]            = grpc_slice_sub_no_ref(slices[0], 0, used);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(slices, nslices);
    for (size_t i = 0; i < nslices; i++) {
        grpc_slice_unref(slices[i]);
    }
    c->w_off += len;
    if (c->w_off >= w->bytes) {
        c->w_cur++;
        c->w_off = 0;
    }
    return bb;
}

void ddld_call_stream_weights(ddld_call *c, const ddld_model_info *mi, const uint8_t *data,
                              void (*release)(void *), void *ud)
{
    struct wstream   *w    = ddl_malloc(sizeof *w);
    ddld_weight_info *info = ddl_calloc((size_t)mi->nweights + 1, sizeof *info);
    bool              ok   = w != NULL && info != NULL;
    for (int i = 0; ok && i < mi->nweights; i++) {
        info[i]      = mi->weights[i];
        info[i].name = ddl_strdup(mi->weights[i].name);
        ok           = info[i].name != NULL;
    }
    if (!ok) {
        for (int i = 0; info != NULL && i < mi->nweights; i++) {
            ddl_free(info[i].name);
        }
        ddl_free(info);
        ddl_free(w);
        release(ud);
        ddld_call_finish(c, GRPC_STATUS_RESOURCE_EXHAUSTED,
                         "PullWeights: out of memory for the stream's weight table", NULL);
        return;
    }
    atomic_init(&w->refs, 1);
    w->release = release;
    w->ud      = ud;
    pthread_mutex_lock(&c->mu);
    c->w_stream = w;
    c->w_n      = mi->nweights;
    c->w_cur    = 0;
    c->w_off    = 0;
    c->w_data   = data;
    c->w_info   = info;
    if (c->dead) {
        pthread_mutex_unlock(&c->mu);
        return;
    }
    if (c->w_n == 0) {
        finish_locked(c, GRPC_STATUS_OK, NULL, NULL);
    } else {
        send_locked(c, next_chunk(c));
    }
    pthread_mutex_unlock(&c->mu);
}

// ---- jobs -------------------------------------------------------------------------------

void ddld_job_free(ddld_job *job)
{
    if (job == NULL) {
        return;
    }
    if (job->msg != NULL) {
        protobuf_c_message_free_unpacked(job->msg, NULL);
    }
    if (job->staging_owned) {
        ddl_free(job->staging);
    } else if (job->staging != NULL && job->call != NULL) {
        ddld_service *svc = job->call->svc;
        pthread_mutex_lock(&svc->mu);
        svc->staging_busy = false;
        pthread_mutex_unlock(&svc->mu);
    }
    if (job->call != NULL) {
        call_unref(job->call);
    }
    ddl_free(job);
}

// Makes room for one more job at the front, beyond the client limit if need be. Caller
// holds svc->mu.
static bool push_front_locked(ddld_service *svc, ddld_job *job)
{
    if (svc->count == svc->cap) {
        int        ncap = svc->cap * 2;
        ddld_job **nj   = ddl_calloc((size_t)ncap, sizeof *nj);
        if (nj == NULL) {
            return false;
        }
        for (int i = 0; i < svc->count; i++) {
            nj[i] = svc->jobs[(svc->head + i) % svc->cap];
        }
        ddl_free(svc->jobs);
        svc->jobs = nj;
        svc->cap  = ncap;
        svc->head = 0;
    }
    svc->head            = (svc->head + svc->cap - 1) % svc->cap;
    svc->jobs[svc->head] = job;
    svc->count++;
    return true;
}

// Queues a job for the main thread: UNAVAILABLE when closing, RESOURCE_EXHAUSTED when
// --queue client jobs wait already. `priority` jobs (Shutdown) go first and are never
// refused for room.
static grpc_status_code enqueue(ddld_service *svc, ddld_job *job, bool priority)
{
    job->t_arrived = ddld_now();
    pthread_mutex_lock(&svc->mu);
    if (svc->closing) {
        pthread_mutex_unlock(&svc->mu);
        return GRPC_STATUS_UNAVAILABLE;
    }
    if (priority && !push_front_locked(svc, job)) {
        pthread_mutex_unlock(&svc->mu);
        return GRPC_STATUS_RESOURCE_EXHAUSTED; // out of memory to grow the queue
    } else if (priority) {
    } else if (svc->count >= svc->limit) {
        pthread_mutex_unlock(&svc->mu);
        return GRPC_STATUS_RESOURCE_EXHAUSTED;
    } else {
        svc->jobs[(svc->head + svc->count) % svc->cap] = job;
        svc->count++;
    }
    if (job->call != NULL) {
        atomic_fetch_add(&job->call->refs, 1);
        job->call->state = ST_IDLE;
    }
    pthread_mutex_unlock(&svc->mu);
    svc->wake(svc->wake_ud);
    return GRPC_STATUS_OK;
}

int ddld_service_queue_depth(ddld_service *svc)
{
    pthread_mutex_lock(&svc->mu);
    int n = svc->count;
    pthread_mutex_unlock(&svc->mu);
    return n;
}

ddld_job *ddld_service_pop(ddld_service *svc)
{
    ddld_job *job = NULL;
    pthread_mutex_lock(&svc->mu);
    if (svc->internal_pending != 0 && svc->internal_job != NULL) {
        job                   = svc->internal_job; // the caller frees it (ddld_job_free)
        job->internal         = svc->internal_pending;
        svc->internal_job     = NULL;
        svc->internal_pending = 0;
    } else if (svc->count > 0) {
        job       = svc->jobs[svc->head];
        svc->head = (svc->head + 1) % svc->cap;
        svc->count--;
    }
    pthread_mutex_unlock(&svc->mu);
    return job;
}

bool ddld_service_shutdown_pending(ddld_service *svc)
{
    return svc != NULL && atomic_load(&svc->shutdown_pending);
}

void ddld_service_shutdown_refused(ddld_service *svc)
{
    atomic_store(&svc->shutdown_pending, false);
}

void ddld_service_push_internal(ddld_service *svc, int internal)
{
    // The job was allocated at start (ddld_service_start) and goes ahead of client work
    // through ddld_service_pop, so that ending the loop never waits for memory or room.
    pthread_mutex_lock(&svc->mu);
    svc->internal_pending = internal;
    pthread_mutex_unlock(&svc->mu);
}

// ---- cheap answers from the snapshot (cq thread) ----------------------------------------

// The answers below (answer_<handler> of the table's CQ rows) each own the request they are
// given.
static void answer_status(ddld_call *c, ProtobufCMessage *req)
{
    protobuf_c_message_free_unpacked(req, NULL); // GetStatusRequest has no fields
    Distdl__V1__GetStatusResponse r = DISTDL__V1__GET_STATUS_RESPONSE__INIT;
    pthread_mutex_lock(&ddld_g.mu);
    const ddld_model_info *mi = &ddld_g.info;
    int64_t                in[DDL_MAX_DIMS];
    Distdl__V1__Partition  parts_storage[64], *parts[64];
    r.has_model      = mi->has_model;
    r.model_name     = (char *)(mi->has_model ? mi->name : "");
    r.world_size     = ddld_g.world_size;
    r.step           = ddld_g.step;
    r.last_loss      = ddld_g.last_loss;
    r.durable_step   = ddld_g.durable_step;
    r.queue_depth    = ddld_g.batch_count;
    r.queue_capacity = ddld_g.batch_cap;
    r.state          = (char *)ddld_g.state;
    r.epoch          = ddld_g.epoch;
    r.batch          = ddld_g.batch;
    r.data_dir       = ddld_g.data_dir;
    r.dropped_calls  = ddld_g.dropped_calls;
    r.bytes_per_step = ddld_g.step_bytes;
    r.active_calls   = atomic_load(&active_calls) - 1; // this GetStatus excluded
    pthread_mutex_lock(&c->svc->mu);
    r.request_queue_depth = c->svc->count;
    pthread_mutex_unlock(&c->svc->mu);
    if (mi->has_model) {
        r.batch_size = mi->batch_size;
        for (int d = 0; d < mi->input.ndim; d++) {
            in[d] = mi->input.d[d];
        }
        r.n_input_shape = (size_t)mi->input.ndim;
        r.input_shape   = in;
        r.num_classes   = mi->classes;
        r.datatype      = (char *)ddld_dtype_wire(mi->dtype);
        int np          = mi->npartitions < 64 ? mi->npartitions : 64;
        for (int i = 0; i < np; i++) {
            Distdl__V1__Partition *p = &parts_storage[i];
            distdl__v1__partition__init(p);
            p->name    = mi->part_name[i];
            p->n_ranks = (size_t)mi->part_nranks[i];
            p->ranks   = mi->part_ranks[i];
            p->n_shape = (size_t)mi->part_ndims[i];
            p->shape   = mi->part_shape[i];
            parts[i]   = p;
        }
        r.n_partitions = (size_t)np;
        r.partitions   = parts;
    }
    grpc_byte_buffer *bb = pack_message(&r.base);
    pthread_mutex_unlock(&ddld_g.mu);
    pthread_mutex_lock(&c->mu);
    finish_locked(c, GRPC_STATUS_OK, NULL, bb);
    pthread_mutex_unlock(&c->mu);
}

static bool health_known(const char *service)
{
    return service[0] == '\0' || strcmp(service, "distdl.v1.Trainer") == 0 ||
           strcmp(service, "inference.GRPCInferenceService") == 0;
}

static Grpc__Health__V1__HealthCheckResponse__ServingStatus health_now(void)
{
    pthread_mutex_lock(&ddld_g.mu);
    bool serving = ddld_g.serving;
    pthread_mutex_unlock(&ddld_g.mu);
    return serving ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
                   : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
}

// Check and Watch.
static void answer_health(ddld_call *c, ProtobufCMessage *m)
{
    const Grpc__Health__V1__HealthCheckRequest *req = (const void *)m;
    Grpc__Health__V1__HealthCheckResponse       r   = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    bool                                        watch = c->method == DDLD_M_HEALTH_WATCH;
    bool                                        known = health_known(req->service);
    if (!known && !watch) {
        finish_code(c, GRPC_STATUS_NOT_FOUND, "health: unknown service \"%s\"", req->service);
        protobuf_c_message_free_unpacked(m, NULL);
        return;
    }
    protobuf_c_message_free_unpacked(m, NULL);
    r.status = known ? health_now()
                     : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN;
    if (!watch) {
        ddld_call_finish(c, GRPC_STATUS_OK, NULL, &r.base);
        return;
    }
    // Watch: the current status now, then every change (only SERVING -> NOT_SERVING at
    // shutdown, after which the stream ends).
    ddld_service *svc = c->svc;
    pthread_mutex_lock(&svc->mu);
    bool closing = svc->closing;
    if (!closing) {
        c->next_watch = svc->watchers;
        svc->watchers = c;
        atomic_fetch_add(&c->refs, 1); // the watcher list's reference
    }
    pthread_mutex_unlock(&svc->mu);
    c->state = ST_IDLE;
    ddld_call_send(c, &r.base);
    if (closing) {
        ddld_call_end(c, GRPC_STATUS_OK, NULL);
    }
}

static void kserve_reply(ddld_call *c, const ProtobufCMessage *req)
{
    pthread_mutex_lock(&ddld_g.mu);
    bool        has = ddld_g.info.has_model, serving = ddld_g.serving;
    const char *name = ddld_g.info.name;
    switch (c->method) {
    case DDLD_M_SERVER_LIVE: {
        Inference__ServerLiveResponse r = INFERENCE__SERVER_LIVE_RESPONSE__INIT;
        r.live                          = true;
        pthread_mutex_unlock(&ddld_g.mu);
        ddld_call_finish(c, GRPC_STATUS_OK, NULL, &r.base);
        return;
    }
    case DDLD_M_SERVER_READY: {
        Inference__ServerReadyResponse r = INFERENCE__SERVER_READY_RESPONSE__INIT;
        r.ready                          = serving && has;
        pthread_mutex_unlock(&ddld_g.mu);
        ddld_call_finish(c, GRPC_STATUS_OK, NULL, &r.base);
        return;
    }
    case DDLD_M_SERVER_METADATA: {
        pthread_mutex_unlock(&ddld_g.mu);
        Inference__ServerMetadataResponse r            = INFERENCE__SERVER_METADATA_RESPONSE__INIT;
        char                             *extensions[] = {"binary_tensor_data", "statistics"};
        r.name                                         = "distdld";
        r.version                                      = DDLD_VERSION;
        r.n_extensions                                 = sizeof extensions / sizeof extensions[0];
        r.extensions                                   = extensions;
        ddld_call_finish(c, GRPC_STATUS_OK, NULL, &r.base);
        return;
    }
    case DDLD_M_MODEL_READY: {
        const Inference__ModelReadyRequest *q = (const void *)req;
        Inference__ModelReadyResponse       r = INFERENCE__MODEL_READY_RESPONSE__INIT;
        r.ready = serving && has && (q->name[0] == '\0' || strcmp(q->name, name) == 0) &&
                  ddld_version_served(q->version);
        pthread_mutex_unlock(&ddld_g.mu);
        ddld_call_finish(c, GRPC_STATUS_OK, NULL, &r.base);
        return;
    }
    default: { // ModelMetadata
        const Inference__ModelMetadataRequest *q = (const void *)req;
        if (!has || (q->name[0] != '\0' && strcmp(q->name, name) != 0)) {
            char qn[160];
            snprintf(qn, sizeof qn, "%s", q->name);
            pthread_mutex_unlock(&ddld_g.mu);
            finish_code(c, GRPC_STATUS_NOT_FOUND, "model \"%s\" not found%s", qn,
                        has ? "" : " (no model loaded)");
            return;
        }
        if (!ddld_version_served(q->version)) {
            pthread_mutex_unlock(&ddld_g.mu);
            finish_code(c, GRPC_STATUS_NOT_FOUND,
                        "model \"%.128s\" has no version \"%.32s\" (only \"1\")", name, q->version);
            return;
        }
        const ddld_model_info *mi = &ddld_g.info;
        int64_t                in[DDL_MAX_DIMS + 1], out[DDL_MAX_DIMS + 1];
        in[0]  = -1;
        out[0] = -1;
        for (int d = 0; d < mi->input.ndim; d++) {
            in[d + 1] = mi->input.d[d];
        }
        for (int d = 0; d < mi->output.ndim; d++) { // [classes], or the whole output
            out[d + 1] = mi->output.d[d];
        }
        Inference__ModelMetadataResponse__TensorMetadata ti, to, *tip = &ti, *top = &to;
        inference__model_metadata_response__tensor_metadata__init(&ti);
        inference__model_metadata_response__tensor_metadata__init(&to);
        ti.name                                      = "input";
        ti.datatype                                  = (char *)ddld_dtype_wire(mi->dtype);
        ti.n_shape                                   = (size_t)mi->input.ndim + 1;
        ti.shape                                     = in;
        to.name                                      = "logits";
        to.datatype                                  = ti.datatype;
        to.n_shape                                   = (size_t)mi->output.ndim + 1;
        to.shape                                     = out;
        char                            *versions[1] = {"1"};
        Inference__ModelMetadataResponse r           = INFERENCE__MODEL_METADATA_RESPONSE__INIT;
        r.name                                       = (char *)name;
        r.n_versions                                 = 1;
        r.versions                                   = versions;
        r.platform                                   = "distdl-c";
        r.n_inputs                                   = 1;
        r.inputs                                     = &tip;
        r.n_outputs                                  = 1;
        r.outputs                                    = &top;
        if (c->done != NULL) { // r points into the snapshot: answered under its mutex
            ddld_call_finish(c, GRPC_STATUS_OK, NULL, &r.base);
            pthread_mutex_unlock(&ddld_g.mu);
            return;
        }
        grpc_byte_buffer *bb = pack_message(&r.base);
        pthread_mutex_unlock(&ddld_g.mu);
        pthread_mutex_lock(&c->mu);
        finish_locked(c, GRPC_STATUS_OK, NULL, bb);
        pthread_mutex_unlock(&c->mu);
        return;
    }
    }
}

// ServerLive, ServerReady, ModelReady and ModelMetadata.
static void answer_kserve(ddld_call *c, ProtobufCMessage *req)
{
    kserve_reply(c, req);
    protobuf_c_message_free_unpacked(req, NULL);
}

// ---- client streams (cq thread) -----------------------------------------------------------

static void recv_next(ddld_call *c)
{
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op                             = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &c->recv_bb;
    c->state                          = ST_RECV;
    start_batch(c, &op, 1);
}

// One SubmitBatch message: kept in the batch queue, or freed.
static void answer_submit_batch(ddld_call *c, ProtobufCMessage *m)
{
    Distdl__V1__Batch *b = (Distdl__V1__Batch *)m;
    char             err[512];
    int64_t          count;
    grpc_status_code code;
    pthread_mutex_lock(&ddld_g.mu);
    if (!ddld_g.info.has_model) {
        code = GRPC_STATUS_FAILED_PRECONDITION;
        snprintf(err, sizeof err, "SubmitBatch: no model (CreateModel first)");
    } else {
        char msg[448];
        code = ddld_batch_check(&ddld_g.info, b, true, &count, msg, sizeof msg);
        if (code != GRPC_STATUS_OK) {
            snprintf(err, sizeof err, "SubmitBatch: %s", msg);
        }
        if (code == GRPC_STATUS_OK && ddld_g.batch_count == ddld_g.batch_cap) {
            code = GRPC_STATUS_RESOURCE_EXHAUSTED;
            snprintf(err, sizeof err,
                     "SubmitBatch: the batch queue is full (%d batches; Step consumes them)",
                     ddld_g.batch_cap);
        }
        if (code == GRPC_STATUS_OK) {
            ddld_g.batches[(ddld_g.batch_head + ddld_g.batch_count) % ddld_g.batch_cap] = b;
            ddld_g.batch_count++;
            b = NULL;
        }
    }
    pthread_mutex_unlock(&ddld_g.mu);
    if (b != NULL) {
        protobuf_c_message_free_unpacked(&b->base, NULL);
    }
    if (code != GRPC_STATUS_OK) {
        ddld_call_finish(c, code, err, NULL);
        return;
    }
    c->accepted++;
    recv_next(c);
}

static void submit_end(ddld_call *c)
{
    Distdl__V1__SubmitBatchResponse r = DISTDL__V1__SUBMIT_BATCH_RESPONSE__INIT;
    r.accepted                        = c->accepted;
    pthread_mutex_lock(&ddld_g.mu);
    r.queue_depth = ddld_g.batch_count;
    pthread_mutex_unlock(&ddld_g.mu);
    ddld_call_finish(c, GRPC_STATUS_OK, NULL, &r.base);
}

static void push_release_staging(ddld_call *c)
{
    if (c->staging == NULL) {
        return;
    }
    if (c->staging_owned) {
        ddl_free(c->staging);
    } else {
        pthread_mutex_lock(&c->svc->mu);
        c->svc->staging_busy = false;
        pthread_mutex_unlock(&c->svc->mu);
    }
    c->staging = NULL;
}

static void push_fail(ddld_call *c, grpc_status_code code, const char *msg)
{
    push_release_staging(c);
    ddld_call_finish(c, code, msg, NULL);
}

// The first chunk of a push: copy the model's weight table and take a staging buffer
// (the service keeps one for reuse, so a 64 MiB push does not fault in fresh pages).
static bool push_begin(ddld_call *c)
{
    pthread_mutex_lock(&ddld_g.mu);
    const ddld_model_info *mi = &ddld_g.info;
    if (!mi->has_model) {
        pthread_mutex_unlock(&ddld_g.mu);
        push_fail(c, GRPC_STATUS_FAILED_PRECONDITION, "PushWeights: no model (CreateModel first)");
        return false;
    }
    ddld_model_info  *cp = ddl_calloc(1, sizeof *cp);
    ddld_weight_info *ws = ddl_calloc((size_t)mi->nweights + 1, sizeof *ws);
    bool              ok = cp != NULL && ws != NULL;
    if (ok) {
        cp->has_model     = true;
        cp->nweights      = mi->nweights; // the names below are freed with cp from here on
        cp->weights_bytes = mi->weights_bytes;
        cp->weights       = ws;
        for (int i = 0; ok && i < mi->nweights; i++) {
            ws[i]      = mi->weights[i];
            ws[i].name = ddl_strdup(mi->weights[i].name);
            ok         = ws[i].name != NULL;
        }
    } else {
        ddl_free(ws);
    }
    c->push_gen = ddld_g.model_gen;
    pthread_mutex_unlock(&ddld_g.mu);
    c->push_got = ok ? ddl_calloc((size_t)cp->nweights + 1, sizeof *c->push_got) : NULL;
    if (c->push_got == NULL) {
        if (cp != NULL) {
            ddld_model_info_free(cp); // frees the names copied so far
            ddl_free(cp);
        }
        push_fail(c, GRPC_STATUS_RESOURCE_EXHAUSTED,
                  "PushWeights: out of memory for the model's weight table");
        return false;
    }
    c->push_mi        = cp;
    c->push_t0        = gpr_now(GPR_CLOCK_MONOTONIC);
    c->push_cur       = -1;
    ddld_service *svc = c->svc;
    pthread_mutex_lock(&svc->mu);
    if (!svc->staging_busy) {
        if (svc->staging_cap < cp->weights_bytes) {
            ddl_free(svc->staging);
            svc->staging     = ddl_malloc(cp->weights_bytes + 64);
            svc->staging_cap = svc->staging != NULL ? cp->weights_bytes : 0;
        }
        if (svc->staging != NULL) {
            svc->staging_busy = true;
            c->staging        = svc->staging;
        }
    }
    pthread_mutex_unlock(&svc->mu);
    if (c->staging == NULL) {
        c->staging       = ddl_malloc(cp->weights_bytes + 64);
        c->staging_owned = true;
        if (c->staging == NULL) {
            push_fail(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "PushWeights: out of memory for staging");
            return false;
        }
    }
    return true;
}

static void push_chunk(ddld_call *c, struct wchunk *ch)
{
    char err[768];
    if (c->push_mi == NULL && !push_begin(c)) {
        return;
    }
    grpc_status_code code =
        ddld_wchunk_check(c->push_mi, c->push_got, &c->push_cur, ch, err, sizeof err);
    if (code != GRPC_STATUS_OK) {
        push_fail(c, code, err);
        return;
    }
    const ddld_weight_info *w   = &c->push_mi->weights[c->push_cur];
    size_t                  got = c->push_got[c->push_cur];
    ddld_wc_take(&ch->data, c->staging + w->offset + got, ch->data_len);
    c->push_got[c->push_cur] = got + ch->data_len;
    recv_next(c);
}

// Parses and applies one received PushWeights message (and releases it).
static void push_message(ddld_call *c)
{
    grpc_byte_buffer *bb = c->recv_bb;
    c->recv_bb           = NULL;
    struct wchunk ch;
    bool          ok;
    if (bb->type == GRPC_BB_RAW && bb->data.raw.compression == GRPC_COMPRESS_NONE) {
        ok = ddld_wchunk_parse(bb->data.raw.slice_buffer.slices, bb->data.raw.slice_buffer.count, &ch);
        if (ok) {
            push_chunk(c, &ch);
        }
    } else { // compressed: let gRPC inflate it into one slice first
        grpc_byte_buffer_reader r;
        ok = grpc_byte_buffer_reader_init(&r, bb) != 0;
        if (ok) {
            grpc_slice one = grpc_byte_buffer_reader_readall(&r);
            grpc_byte_buffer_reader_destroy(&r);
            ok = ddld_wchunk_parse(&one, 1, &ch);
            if (ok) {
                push_chunk(c, &ch);
            }
            grpc_slice_unref(one);
        }
    }
    grpc_byte_buffer_destroy(bb);
    if (!ok) {
        push_fail(c, GRPC_STATUS_INVALID_ARGUMENT, "PushWeights: malformed WeightChunk");
    }
}

static void push_end(ddld_call *c)
{
    char err[512];
    if (c->push_mi == NULL) {
        finish_code(c, GRPC_STATUS_INVALID_ARGUMENT, "PushWeights: empty stream");
        return;
    }
    for (int i = 0; i < c->push_mi->nweights; i++) {
        const ddld_weight_info *w = &c->push_mi->weights[i];
        if (c->push_got[i] != w->bytes) {
            snprintf(err, sizeof err, "PushWeights: \"%s\": expected %zu bytes, got %zu", w->name,
                     w->bytes, c->push_got[i]);
            push_fail(c, GRPC_STATUS_INVALID_ARGUMENT, err);
            return;
        }
    }
    if (c->svc->verbose) {
        gpr_timespec dt = gpr_time_sub(gpr_now(GPR_CLOCK_MONOTONIC), c->push_t0);
        ddld_log("PushWeights: received %zu bytes in %.1f ms", c->push_mi->weights_bytes,
                 (double)dt.tv_sec * 1e3 + dt.tv_nsec * 1e-6);
    }
    ddld_job *job = ddl_calloc(1, sizeof *job);
    if (job == NULL) {
        push_fail(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "PushWeights: out of memory for its job");
        return;
    }
    job->method           = DDLD_M_PUSH_WEIGHTS;
    job->call             = c;
    job->staging          = c->staging;
    job->staging_owned    = c->staging_owned;
    job->model_gen        = c->push_gen;
    c->staging            = NULL;
    grpc_status_code code = enqueue(c->svc, job, false);
    if (code != GRPC_STATUS_OK) {
        job->call = NULL;
        if (!job->staging_owned) {
            job->staging = NULL;
            pthread_mutex_lock(&c->svc->mu);
            c->svc->staging_busy = false;
            pthread_mutex_unlock(&c->svc->mu);
        }
        ddld_job_free(job);
        finish_code(c, code,
                    code == GRPC_STATUS_UNAVAILABLE ? "distdld is shutting down"
                                                    : "request queue full");
    }
}

// ---- the state machine (cq thread) ---------------------------------------------------------

// Queues a decoded request of an ENGINE method for the ranks (the job owns m), or fails
// the call when the queue is full or closed.
static void queue_call(ddld_call *c, ProtobufCMessage *m)
{
    ddld_job *job = ddl_calloc(1, sizeof *job);
    if (job == NULL) {
        protobuf_c_message_free_unpacked(m, NULL);
        finish_code(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "%s: out of memory for the request's job",
                    methods[c->method].path);
        return;
    }
    job->method = (ddld_method)c->method;
    job->call   = c;
    job->msg    = m;
    // Shutdown goes ahead of queued work and stops a running Train at its next step
    // boundary; what it jumped is failed UNAVAILABLE by the shutdown itself.
    bool             shutdown = c->method == DDLD_M_SHUTDOWN;
    grpc_status_code code     = enqueue(c->svc, job, shutdown);
    if (code == GRPC_STATUS_OK && shutdown) {
        atomic_store(&c->svc->shutdown_pending, true);
    }
    if (code != GRPC_STATUS_OK) {
        job->call = NULL;
        ddld_job_free(job);
        if (code == GRPC_STATUS_UNAVAILABLE) {
            finish_code(c, code, "distdld is shutting down");
        } else if (shutdown) {
            finish_code(c, code, "Shutdown: out of memory to queue it");
        } else {
            finish_code(c, code, "the request queue is full (%d waiting; --queue)", c->svc->limit);
        }
    }
}

// Runs a decoded request: the table's where column decides, CQ rows are answered here,
// ENGINE rows queued for the ranks. STAGED rows never get here (their messages are parsed
// in place as they arrive). Owns m.
static void run_message(ddld_call *c, ProtobufCMessage *m)
{
    switch (c->method) {
#define ON_CQ(name, handler)                                                                       \
    case DDLD_M_##name:                                                                            \
        answer_##handler(c, m);                                                                    \
        return;
#define ON_ENGINE(name, handler)                                                                   \
    case DDLD_M_##name:                                                                            \
        queue_call(c, m);                                                                          \
        return;
#define ON_STAGED(name, handler)
#define X(name, path, kind, role, where, request, handler) ON_##where(name, handler)
        DDL_RPC_METHODS(X)
#undef X
#undef ON_CQ
#undef ON_ENGINE
#undef ON_STAGED
    default:
        protobuf_c_message_free_unpacked(m, NULL);
        finish_code(c, GRPC_STATUS_UNIMPLEMENTED, "%s: no handler for a whole request message",
                    methods[c->method].path);
        return;
    }
}

static void on_message(ddld_call *c)
{
    const struct method_desc *md = &methods[c->method];
    if (c->recv_bb == NULL) { // the client half-closed
        if (md->kind != DDL_RPC_CLIENT_STREAM) {
            finish_code(c, GRPC_STATUS_INVALID_ARGUMENT, "%s: no request message", md->path);
        } else if (c->method == DDLD_M_PUSH_WEIGHTS) {
            push_end(c);
        } else {
            submit_end(c);
        }
        return;
    }
    if (c->method == DDLD_M_PUSH_WEIGHTS) {
        push_message(c);
        return;
    }
    char              why[512];
    ProtobufCMessage *m   = ddld_request_decode(c->recv_bb, md->req, why, sizeof why);
    size_t            len = grpc_byte_buffer_length(c->recv_bb);
    grpc_byte_buffer_destroy(c->recv_bb);
    c->recv_bb = NULL;
    if (m == NULL && why[0] != '\0') {
        finish_code(c, GRPC_STATUS_INVALID_ARGUMENT, "%s: %s.%s", md->path, md->req->short_name,
                    why);
        return;
    }
    if (m == NULL) {
        finish_code(c, GRPC_STATUS_INVALID_ARGUMENT,
                    "%s: malformed request: expected a %s message, got %zu bytes that do not "
                    "decode as one",
                    md->path, md->req->name, len);
        return;
    }
    run_message(c, m);
}

static void call_free(ddld_call *c)
{
    if (c->live) {
        atomic_fetch_sub(&active_calls, 1);
    }
    if (c->inflight) {
        ddld_service *svc = c->svc;
        pthread_mutex_lock(&svc->mu);
        if (--svc->inflight == 0) {
            pthread_cond_broadcast(&svc->cv);
        }
        pthread_mutex_unlock(&svc->mu);
    }
    if (c->call != NULL) {
        grpc_call_unref(c->call);
    }
    grpc_metadata_array_destroy(&c->md);
    grpc_call_details_destroy(&c->details);
    if (c->recv_bb != NULL) {
        grpc_byte_buffer_destroy(c->recv_bb);
    }
    if (c->send_bb != NULL) {
        grpc_byte_buffer_destroy(c->send_bb);
    }
    for (int i = 0; i < c->nring; i++) {
        grpc_byte_buffer_destroy(c->ring[i]);
    }
    if (c->has_details) {
        grpc_slice_unref(c->status_details);
    }
    ddl_free(c->end_msg);
    push_release_staging(c);
    if (c->push_mi != NULL) {
        ddld_model_info_free(c->push_mi);
        ddl_free(c->push_mi);
    }
    ddl_free(c->push_got);
    if (c->w_info != NULL) {
        for (int i = 0; i < c->w_n; i++) {
            ddl_free(c->w_info[i].name);
        }
        ddl_free(c->w_info);
    }
    if (c->w_stream != NULL) {
        wstream_unref(c->w_stream);
    }
    pthread_mutex_destroy(&c->mu);
    ddl_free(c);
}

static void call_unref(ddld_call *c)
{
    if (atomic_fetch_sub(&c->refs, 1) == 1) {
        call_free(c);
    }
}

// Tokens and roles, from the request headers, before anything else (auth.c): a refused
// call is finished at once and its message is never read.
static bool admit(ddld_call *c)
{
    char *generic = c->method == M_GENERIC ? grpc_slice_to_c_string(c->details.method) : NULL;
    char  why[256];
    grpc_status_code code = ddld_auth_check(ddld_auth_daemon(), c->method,
                                            generic != NULL ? generic : methods[c->method].path,
                                            &c->md, why, sizeof why);
    gpr_free(generic);
    if (code != GRPC_STATUS_OK) {
        finish_code(c, code, "%s", why);
        return false;
    }
    return true;
}

// An op batch completed.
static void on_op(ddld_call *c, bool ok)
{
    ddld_service *svc = c->svc;
    switch (c->state) {
    case ST_NEW: {
        if (!ok) { // this request never got a call
            // At shutdown (torn_down), as expected. Otherwise gRPC failed one request of
            // ours while serving: ask again (in the cq thread's next REARM_MS round, so a
            // gRPC that kept failing them could not spin it), or the method would have one
            // fewer.
            pthread_mutex_lock(&svc->mu);
            bool serving = !svc->torn_down;
            if (serving) {
                svc->rearm[c->method]++;
            }
            pthread_mutex_unlock(&svc->mu);
            if (serving) {
                static atomic_int said;
                if (atomic_fetch_add(&said, 1) < 5) {
                    ddld_log("gRPC returned a request for %s without a call while serving; "
                             "asking again",
                             c->method == M_GENERIC ? "unknown methods" : methods[c->method].path);
                }
                atomic_store(&svc->rearm_any, true);
            }
            call_free(c);
            return;
        }
        c->t_arrived = ddld_now();
        request_new(svc, c->method);
        atomic_init(&c->refs, 2); // op side + close side
        c->live = true;
        atomic_fetch_add(&active_calls, 1);
        pthread_mutex_lock(&svc->mu);
        bool closing  = svc->closing;
        bool stopping = svc->stopping;
        c->inflight   = !stopping;
        svc->inflight += c->inflight;
        pthread_mutex_unlock(&svc->mu);
        grpc_op op;
        memset(&op, 0, sizeof op);
        op.op                                  = GRPC_OP_RECV_CLOSE_ON_SERVER;
        op.data.recv_close_on_server.cancelled = &c->close_cancelled;
        if (grpc_call_start_batch(c->call, &op, 1, &c->close, NULL) != GRPC_CALL_OK) {
            atomic_fetch_sub(&c->refs, 1);
        }
        if (!admit(c)) {
            return;
        }
        // Once the teardown has begun every call is answered here, whatever its method:
        // gRPC itself would cancel it (CANCELLED) once shutdown_and_notify is called.
        if (stopping ||
            (closing && c->method < DDLD_M_COUNT && methods[c->method].where == DDL_RPC_ENGINE)) {
            finish_code(c, GRPC_STATUS_UNAVAILABLE, "distdld is shutting down");
            return;
        }
        if (c->method == M_GENERIC) {
            char *path = grpc_slice_to_c_string(c->details.method);
            finish_code(c, GRPC_STATUS_UNIMPLEMENTED, "unknown method %s", path);
            gpr_free(path);
            return;
        }
        recv_next(c);
        return;
    }
    case ST_RECV:
        if (!ok) {
            pthread_mutex_lock(&c->mu);
            died_locked(c);
            c->dead = true;
            pthread_mutex_unlock(&c->mu);
            call_unref(c);
            return;
        }
        on_message(c);
        return;
    case ST_SEND: {
        pthread_mutex_lock(&c->mu);
        grpc_byte_buffer_destroy(c->send_bb);
        c->send_bb = NULL;
        if (!ok) {
            died_locked(c);
            c->dead      = true;
            c->send_busy = false;
            pthread_mutex_unlock(&c->mu);
            call_unref(c);
            return;
        }
        if (c->nring > 0) {
            grpc_byte_buffer *bb = c->ring[0];
            memmove(c->ring, c->ring + 1, (size_t)(c->nring - 1) * sizeof c->ring[0]);
            c->nring--;
            send_locked(c, bb);
        } else if (c->end_pending) {
            c->end_pending = false;
            finish_locked(c, c->end_code, c->end_msg, NULL);
        } else if (c->w_stream != NULL && c->w_cur < c->w_n) {
            send_locked(c, next_chunk(c));
        } else if (c->w_stream != NULL) {
            finish_locked(c, GRPC_STATUS_OK, NULL, NULL);
        } else {
            c->send_busy = false;
            c->state     = ST_IDLE;
        }
        pthread_mutex_unlock(&c->mu);
        return;
    }
    case ST_FINISH:
        pthread_mutex_lock(&c->mu);
        c->dead      = true; // the op side is over
        c->send_busy = false;
        pthread_mutex_unlock(&c->mu);
        call_unref(c);
        return;
    default:
        ddld_log("internal: completion in state %d", c->state);
        return;
    }
}

// Takes the first queued job that match(job, arg) accepts out of the queue, closing the
// gap (the others keep their order). Returns it, or NULL.
static ddld_job *take(ddld_service *svc, bool (*match)(const ddld_job *, const void *),
                      const void   *arg)
{
    ddld_job *found = NULL;
    pthread_mutex_lock(&svc->mu);
    for (int i = 0; i < svc->count; i++) {
        ddld_job *j = svc->jobs[(svc->head + i) % svc->cap];
        if (found == NULL && match(j, arg)) {
            found = j;
        } else if (found != NULL) { // close the gap
            svc->jobs[(svc->head + i - 1) % svc->cap] = j;
        }
    }
    if (found != NULL) {
        svc->count--;
    }
    pthread_mutex_unlock(&svc->mu);
    return found;
}

static bool of_call(const ddld_job *j, const void *c)
{
    return j->call == c;
}

// A call that ended before its job left the queue (the client cancelled it, or its
// deadline passed): take the job out now, so it frees its queue slot at once and can never
// run on the ranks. Returns the job (NULL: none queued).
static ddld_job *unqueue(ddld_service *svc, ddld_call *c)
{
    return take(svc, of_call, c);
}

static bool is_inference(const ddld_job *j, const void *unused)
{
    (void)unused;
    return j->method == DDLD_M_PREDICT || j->method == DDLD_M_MODEL_INFER;
}

ddld_job *ddld_service_pop_inference(ddld_service *svc)
{
    return take(svc, is_inference, NULL);
}

// A cancelled call whose job still waits in the queue: out of it, answered CANCELLED (a job
// the main thread took is dropped there, by ddld_call_cancelled).
static void drop_queued(ddld_call *c)
{
    ddld_job *job = unqueue(c->svc, c);
    if (job != NULL) {
        pthread_mutex_lock(&ddld_g.mu);
        ddld_g.dropped_calls++;
        pthread_mutex_unlock(&ddld_g.mu);
        ddld_call_finish(c, GRPC_STATUS_CANCELLED, "cancelled while queued", NULL);
        ddld_job_free(job);
    }
}

static void on_close(ddld_call *c)
{
    atomic_store(&c->cancelled, c->close_cancelled != 0);
    if (c->close_cancelled != 0 && c->method < DDLD_M_COUNT) {
        drop_queued(c);
    }
    if (c->method == DDLD_M_HEALTH_WATCH) {
        // A watcher that went away: take it off the list and end its op side.
        ddld_service *svc   = c->svc;
        bool          found = false;
        pthread_mutex_lock(&svc->mu);
        for (ddld_call **p = &svc->watchers; *p != NULL; p = &(*p)->next_watch) {
            if (*p == c) {
                *p    = c->next_watch;
                found = true;
                break;
            }
        }
        pthread_mutex_unlock(&svc->mu);
        if (found) {
            ddld_call_end(c, GRPC_STATUS_CANCELLED, NULL);
            call_unref(c);
        }
    }
    call_unref(c);
}

// ---- calls from other transports (HTTP) ---------------------------------------------------

void ddld_service_submit(ddld_service *svc, ddld_method method, ProtobufCMessage *m,
                         ddld_call_done done, void *ud, ddld_call **hold)
{
    ddld_call *c = method < DDLD_M_COUNT ? ddl_calloc(1, sizeof *c) : NULL;
    if (hold != NULL) {
        *hold = c;
    }
    if (c == NULL) {
        protobuf_c_message_free_unpacked(m, NULL);
        done(ud, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory for the call", NULL);
        return;
    }
    c->svc       = svc;
    c->method    = (int)method;
    c->state     = ST_IDLE;
    c->done      = done;
    c->done_ud   = ud;
    c->t_arrived = ddld_now();
    c->live      = true;
    atomic_init(&c->refs, hold != NULL ? 2 : 1); // the op side (finish_external) and hold
    atomic_fetch_add(&active_calls, 1);
    pthread_mutex_init(&c->mu, NULL);
    grpc_metadata_array_init(&c->md);
    grpc_call_details_init(&c->details);
    pthread_mutex_lock(&svc->mu);
    bool closing = svc->closing || svc->stopping;
    pthread_mutex_unlock(&svc->mu);
    if (closing && methods[method].where == DDL_RPC_ENGINE) {
        protobuf_c_message_free_unpacked(m, NULL);
        finish_code(c, GRPC_STATUS_UNAVAILABLE, "distdld is shutting down");
        return;
    }
    run_message(c, m);
}

void ddld_call_hold(ddld_call *c)
{
    atomic_fetch_add(&c->refs, 1);
}

void ddld_call_release(ddld_call *c)
{
    if (c != NULL) {
        call_unref(c);
    }
}

void ddld_call_cancel(ddld_call *c)
{
    if (!atomic_exchange(&c->cancelled, true)) {
        drop_queued(c);
    }
}

const char *ddld_method_path(ddld_method method)
{
    return method < DDLD_M_COUNT ? methods[method].path : "unknown";
}

static void *cq_thread(void *arg)
{
    ddld_service *svc        = arg;
    double        last_rearm = 0; // at most one round of asking again per REARM_MS
    for (;;) {
        gpr_timespec until = atomic_load(&svc->rearm_any)
                                 ? gpr_time_add(gpr_now(GPR_CLOCK_REALTIME),
                                                gpr_time_from_millis(REARM_MS, GPR_TIMESPAN))
                                 : gpr_inf_future(GPR_CLOCK_REALTIME);
        grpc_event   ev    = grpc_completion_queue_next(svc->cq, until, NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN) {
            break;
        }
        if (atomic_load(&svc->rearm_any) && ddld_now() - last_rearm >= REARM_MS * 1e-3) {
            last_rearm = ddld_now();
            rearm_methods(svc);
        }
        if (ev.type != GRPC_OP_COMPLETE) {
            continue;
        }
        struct tag *t = ev.tag;
        if (t->what == TAG_SHUTDOWN) {
            pthread_mutex_lock(&svc->mu);
            svc->shutdown_done = true;
            pthread_cond_broadcast(&svc->cv);
            pthread_mutex_unlock(&svc->mu);
        } else if (t->what == TAG_CLOSE) {
            on_close(t->call);
        } else {
            on_op(t->call, ev.success != 0);
        }
    }
    return NULL;
}

// Adds one request for `method` (gRPC holds calls beyond those requested until we ask);
// each arrival asks for its replacement, keeping ARMED_PER_METHOD outstanding. Returns
// false when out of memory for the call: the method is then marked for the cq thread to
// ask again (gRPC holds its calls meanwhile), so one failed allocation does not leave a
// method unserved.
static bool request_new(ddld_service *svc, int method)
{
    pthread_mutex_lock(&svc->mu);
    bool torn_down = svc->torn_down;
    pthread_mutex_unlock(&svc->mu);
    if (torn_down) {
        return true;
    }
    ddld_call *c = ddl_calloc(1, sizeof *c);
    if (c == NULL) {
        ddld_log("out of memory for the next call of %s (once serving, asked again every %d ms)",
                 method == M_GENERIC ? "unknown methods" : methods[method].path, REARM_MS);
        pthread_mutex_lock(&svc->mu);
        svc->rearm[method]++;
        pthread_mutex_unlock(&svc->mu);
        atomic_store(&svc->rearm_any, true);
        return false;
    }
    c->svc        = svc;
    c->method     = method;
    c->state      = ST_NEW;
    c->op.call    = c;
    c->op.what    = TAG_OP;
    c->close.call = c;
    c->close.what = TAG_CLOSE;
    pthread_mutex_init(&c->mu, NULL);
    grpc_metadata_array_init(&c->md);
    grpc_call_details_init(&c->details);
    grpc_call_error e;
    if (method == M_GENERIC) {
        e = grpc_server_request_call(svc->server, &c->call, &c->details, &c->md, svc->cq, svc->cq,
                                     &c->op);
    } else {
        e = grpc_server_request_registered_call(svc->server, svc->registered[method], &c->call,
                                                &c->deadline, &c->md, NULL, svc->cq, svc->cq,
                                                &c->op);
    }
    if (e != GRPC_CALL_OK) {
        ddld_log("request_call(%d) failed: %d", method, e);
        call_free(c);
    }
    return true;
}

// The cq thread: asks again for the methods request_new could not arm.
static void rearm_methods(ddld_service *svc)
{
    atomic_store(&svc->rearm_any, false);
    for (int m = 0; m <= M_GENERIC; m++) {
        pthread_mutex_lock(&svc->mu);
        int again     = svc->rearm[m];
        svc->rearm[m] = 0;
        pthread_mutex_unlock(&svc->mu);
        while (again-- > 0) {
            request_new(svc, m); // marks it again when it fails again
        }
    }
}

// ---- lifecycle (main thread) ----------------------------------------------------------------

ddld_service *ddld_service_start(const ddld_config *cfg, void (*wake)(void *), void *wake_ud,
                                 int *port)
{
    ddld_service *svc = ddl_calloc(1, sizeof *svc);
    if (svc == NULL) {
        ddld_log("start-up: out of memory for the gRPC service");
        return NULL;
    }
    svc->jobs         = ddl_calloc((size_t)cfg->queue + 1, sizeof *svc->jobs);
    svc->internal_job = ddl_calloc(1, sizeof *svc->internal_job);
    if (svc->jobs == NULL || svc->internal_job == NULL) {
        ddld_log("start-up: out of memory for the request queue (--queue %d)", cfg->queue);
        goto fail_alloc;
    }
    svc->internal_job->method = DDLD_M_INTERNAL;
    svc->cfg                  = cfg;
    svc->wake                 = wake;
    svc->wake_ud              = wake_ud;
    svc->cap                  = cfg->queue + 1;
    svc->limit                = cfg->queue;
    svc->verbose              = getenv("DDLD_VERBOSE") != NULL && getenv("DDLD_VERBOSE")[0] == '1';
    svc->shutdown_tag.what    = TAG_SHUTDOWN;
    atomic_init(&svc->rearm_any, false);
    atomic_init(&svc->shutdown_pending, false);
    pthread_mutex_init(&svc->mu, NULL);
    pthread_cond_init(&svc->cv, NULL);

    grpc_init();
    int64_t  max     = cfg->max_message_bytes > INT_MAX ? INT_MAX : cfg->max_message_bytes;
    // A stream's flow-control window starts at 64 KiB: an inline batch (800 KB for
    // LeNet-5 at batch 256) would wait for several window updates over loopback. Let each
    // stream run ahead by 8 MiB (the client does the same for pulled weights).
    // Connections are bounded in time as well as in number of bytes: a peer that connects
    // and never completes the HTTP/2 handshake (a port scanner, a half-open socket, a
    // truncated preface) is dropped after 5 s instead of gRPC's default 120 s; a connection
    // without calls for 15 min gets a GOAWAY (clients reconnect transparently); keepalive
    // pings every 2 min (20 s timeout) find peers that vanished while holding a stream.
    // gRPC core 1.51 assembles a whole message before it compares its size with
    // max_receive_message_length (grpc/grpc#43012): a 4 GiB message sent against a 64 MiB
    // limit would be buffered completely before its RESOURCE_EXHAUSTED. A memory quota on
    // the server's transport bounds that: past it, gRPC drops the connection that is
    // buffering. DDLD_GRPC_QUOTA_MB overrides the size (0: no quota).
    const char *qenv     = getenv("DDLD_GRPC_QUOTA_MB");
    int64_t     quota_mb = 2 * (max >> 20) + 64;
    if (qenv != NULL && qenv[0] != '\0') {
        quota_mb = strtoll(qenv, NULL, 10);
    }
    grpc_resource_quota *quota = grpc_resource_quota_create("distdld");
    grpc_resource_quota_resize(quota, (size_t)(quota_mb > 0 ? quota_mb : 1) << 20);
    grpc_arg args[8] = {
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_ALLOW_REUSEPORT, .value.integer = 0},
        {.type          = GRPC_ARG_INTEGER,
         .key           = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
         .value.integer = (int)max},
        {.type          = GRPC_ARG_INTEGER,
         .key           = GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES,
         .value.integer = 8 << 20},
        {.type          = GRPC_ARG_INTEGER,
         .key           = GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
         .value.integer = 5000},
        {.type          = GRPC_ARG_INTEGER,
         .key           = GRPC_ARG_MAX_CONNECTION_IDLE_MS,
         .value.integer = 15 * 60 * 1000},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_KEEPALIVE_TIME_MS, .value.integer = 120000},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_KEEPALIVE_TIMEOUT_MS, .value.integer = 20000},
        {.type                   = GRPC_ARG_POINTER,
         .key                    = GRPC_ARG_RESOURCE_QUOTA,
         .value.pointer.p        = quota,
         .value.pointer.vtable   = grpc_resource_quota_arg_vtable()},
    };
    grpc_channel_args ca = {.num_args = quota_mb > 0 ? 8 : 7, .args = args};
    svc->server          = grpc_server_create(&ca, NULL);
    grpc_resource_quota_unref(quota); // the server holds its own reference
    svc->cq              = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(svc->server, svc->cq, NULL);
    for (int m = 0; m < DDLD_M_COUNT; m++) {
        svc->registered[m] = grpc_server_register_method(svc->server, methods[m].path, NULL,
                                                         GRPC_SRM_PAYLOAD_NONE, 0);
    }
    grpc_server_credentials *creds = ddld_auth_server_credentials(ddld_auth_daemon());
    *port                          = grpc_server_add_http2_port(svc->server, cfg->listen, creds);
    grpc_server_credentials_release(creds);
    if (*port == 0) {
        ddld_log("cannot listen on %s (address in use or invalid)", cfg->listen);
        goto fail_server;
    }
    grpc_server_start(svc->server);
    // Every method armed before the cq thread runs: at start-up a failure stops the daemon
    // (later, request_new's retry covers it).
    for (int m = 0; m <= M_GENERIC; m++) {
        for (int k = 0; k < ARMED_PER_METHOD; k++) {
            if (!request_new(svc, m)) {
                ddld_log("start-up: out of memory arming the gRPC methods");
                goto fail_started;
            }
        }
    }
    int err = pthread_create(&svc->thread, NULL, cq_thread, svc);
    if (err != 0) {
        ddld_log("start-up: cannot start the gRPC thread: %s", strerror(err));
        goto fail_started;
    }
    return svc;

    // Reverse order of acquisition. A started server is shut down and its queue drained
    // here on this thread (the cq thread never ran): the armed calls come back cancelled.
fail_started:
    grpc_server_shutdown_and_notify(svc->server, svc->cq, &svc->shutdown_tag);
    grpc_server_cancel_all_calls(svc->server);
    for (;;) {
        grpc_event ev =
            grpc_completion_queue_next(svc->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type != GRPC_OP_COMPLETE) {
            continue;
        }
        struct tag *t = ev.tag;
        if (t->what == TAG_SHUTDOWN) {
            break;
        }
        call_free(t->call); // a requested call that never arrived
    }
fail_server:
    grpc_server_destroy(svc->server);
    grpc_completion_queue_shutdown(svc->cq);
    while (grpc_completion_queue_next(svc->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(svc->cq);
    grpc_shutdown();
    pthread_cond_destroy(&svc->cv);
    pthread_mutex_destroy(&svc->mu);
fail_alloc:
    ddl_free(svc->internal_job);
    ddl_free(svc->jobs);
    ddl_free(svc);
    return NULL;
}

void ddld_service_close(ddld_service *svc)
{
    ddld_shared_mark_shutdown();

    pthread_mutex_lock(&svc->mu);
    svc->closing  = true;
    ddld_call *w  = svc->watchers;
    svc->watchers = NULL;
    pthread_mutex_unlock(&svc->mu);
    Grpc__Health__V1__HealthCheckResponse r = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    r.status = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
    while (w != NULL) {
        ddld_call *next = w->next_watch;
        ddld_call_send(w, &r.base);
        ddld_call_end(w, GRPC_STATUS_OK, NULL);
        call_unref(w);
        w = next;
    }
    ddld_job *job;
    while ((job = ddld_service_pop(svc)) != NULL) {
        if (job->call != NULL) {
            ddld_call_finish(job->call, GRPC_STATUS_UNAVAILABLE, "distdld is shutting down", NULL);
        }
        ddld_job_free(job);
    }
}

// The grace is for calls, not connections. gRPC core 1.51's shutdown_and_notify completes
// only once every connection has closed, and its graceful GOAWAY waits for the client to
// answer a PING first: an idle C-core client (no call, so nothing polls its socket but the
// 5 s backup poller) or any peer that does not answer would hold every shutdown for the
// whole grace. And from shutdown_and_notify on, gRPC cancels each new call itself
// (CANCELLED). So: refuse new calls UNAVAILABLE ourselves while the calls that arrived
// before this point finish (at most grace_s), then shut gRPC down (GOAWAY), linger a
// moment, and drop the connections that are left.
//
// The linger (DDLD_CLOSE_LINGER_S, within the grace): a reply that was just written
// (Shutdown's own, the last calls') may still sit in the socket's send buffer while the
// client's next bytes (an ACK of our PING, a WINDOW_UPDATE) sit unread in its receive
// buffer; closing such a socket sends RST, which discards the unsent reply, and the
// client sees UNAVAILABLE ("Broken pipe") for a call that succeeded (seen 1 run in 45 of
// the stress test at load 8). While gRPC still polls the connections, it reads and
// flushes; clients that take the GOAWAY close first and end the wait early.
#define DDLD_CLOSE_LINGER_S 1.0
void ddld_service_stop(ddld_service **psvc, double grace_s)
{
    ddld_service *svc = *psvc;
    if (svc == NULL) {
        return;
    }
    gpr_timespec until = gpr_time_add(
        gpr_now(GPR_CLOCK_REALTIME), gpr_time_from_millis((int64_t)(grace_s * 1000), GPR_TIMESPAN));
    struct timespec ts = {.tv_sec = until.tv_sec, .tv_nsec = until.tv_nsec};
    pthread_mutex_lock(&svc->mu);
    svc->stopping = true;
    while (svc->inflight > 0) {
        if (pthread_cond_timedwait(&svc->cv, &svc->mu, &ts) != 0) {
            break;
        }
    }
    int left       = svc->inflight;
    svc->torn_down = true;
    pthread_mutex_unlock(&svc->mu);
    if (left > 0) {
        ddld_log("grace period over: cancelling the remaining calls (%d)", left);
    }
    grpc_server_shutdown_and_notify(svc->server, svc->cq, &svc->shutdown_tag);
    gpr_timespec linger =
        gpr_time_add(gpr_now(GPR_CLOCK_REALTIME),
                     gpr_time_from_millis((int64_t)(DDLD_CLOSE_LINGER_S * 1000), GPR_TIMESPAN));
    if (gpr_time_cmp(linger, until) > 0) {
        linger = until;
    }
    ts = (struct timespec){.tv_sec = linger.tv_sec, .tv_nsec = linger.tv_nsec};
    pthread_mutex_lock(&svc->mu);
    while (!svc->shutdown_done) {
        if (pthread_cond_timedwait(&svc->cv, &svc->mu, &ts) != 0) {
            break;
        }
    }
    pthread_mutex_unlock(&svc->mu);
    // Nothing left deserves more time: the calls in flight had their grace, and a
    // connection without a call is only closed (its client reconnects, UNAVAILABLE).
    grpc_server_cancel_all_calls(svc->server);
    pthread_mutex_lock(&svc->mu);
    while (!svc->shutdown_done) {
        pthread_cond_wait(&svc->cv, &svc->mu);
    }
    pthread_mutex_unlock(&svc->mu);
    grpc_server_destroy(svc->server);
    grpc_completion_queue_shutdown(svc->cq);
    pthread_join(svc->thread, NULL);
    grpc_completion_queue_destroy(svc->cq);
    grpc_shutdown();
    ddl_free(svc->staging);
    ddl_free(svc->jobs);
    ddld_job_free(svc->internal_job); // when no Shutdown took it; NULL-safe
    pthread_cond_destroy(&svc->cv);
    pthread_mutex_destroy(&svc->mu);
    ddl_free(svc);
    *psvc = NULL;
}
