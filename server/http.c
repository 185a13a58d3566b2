// server/http.c: KServe v2 over HTTP/REST (http.h).
//
// Request life. libmicrohttpd calls on_request first with the headers (the route, the
// token and the client certificate are decided then), then with each piece of the body
// (gathered up to --max-message-bytes), then once more with none: the request is then
// translated into its protobuf message and submitted to the service. A call answered at
// once (from the snapshot, or refused) has its answer before ddld_service_submit returns;
// any other suspends the connection until the main thread's answer resumes it. The
// answer is rendered into the request (`struct req`) by call_done, on the thread that
// answered; on_request queues it when the connection is resumed. A request's mutex orders
// "submitted and suspended" against "answered", so a connection is resumed only after it
// was suspended.
//
// Clients that go away. libmicrohttpd does not watch a suspended connection's socket, so
// the `watcher` thread does: every suspended request is on a list, and the thread polls
// their sockets for the peer's close (POLLRDHUP, POLLHUP; an error or a descriptor no longer
// open counts as a close too) with a WATCH_MS timeout (a new entry is watched from the next
// round). A closed one's call is cancelled as a gRPC client's cancel cancels it
// (ddld_call_cancel): out of the queue at once, or dropped before its batch runs, never run
// on the ranks for nobody.
//
// Formats (the Open Inference Protocol's REST binding, with Triton's extensions):
//   - tensors in JSON: "data" is the row-major contents, flat or nested; FP32 values are
//     written with 9 significant digits and FP64 with 17, so they read back bit for bit;
//   - binary_tensor_data: the header Inference-Header-Content-Length gives the JSON's
//     length, and the tensors whose parameters say binary_data_size follow it, in order;
//     outputs come binary when the request's parameters say binary_data_output or the
//     output's say binary_data;
//   - errors: {"error": "<message>"} with the HTTP code of the gRPC status (http_status).
#define _GNU_SOURCE // POLLRDHUP
#include <gnutls/gnutls.h>
#include <grpc/byte_buffer.h>
#include <grpc/slice.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <microhttpd.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "auth.h"
#include "ddl/base.h"
#include "ddl/format.h"
#include "http.h"
#include "inference/grpc_service.pb-c.h"
#include "listen.h"
#include "log.h"
#include "methods.h"
#include "metrics.h"
#include "requests.h"
#include "service.h"

#define MAX_INPUTS 16
#define ROUTE_STATS DDLD_M_COUNT // the statistics extension (answered here after a metadata call)
#define WATCH_MS 50              // the watcher's round: a client's close is seen within it

static struct {
    const ddld_config      *cfg;
    struct MHD_Daemon      *mhd;
    _Atomic(ddld_service *) svc;
    bool                    mtls;
    pthread_mutex_t         mu; // outstanding
    pthread_cond_t          cv;
    int                     outstanding; // submitted calls not answered yet
    // DDLD_HTTP_JSON=tree in the environment: every infer body through jansson's tree (the
    // tests' and the benchmark's reference for the data-span fast path)
    bool tree_only;
    // the answer to a request whose own state could not be allocated
    struct MHD_Response *oom;
    // the suspended requests whose sockets the watcher polls (a list through struct req)
    pthread_mutex_t wmu;
    struct req     *watched;
    int             nwatched;
    bool            wstop, wstarted;
    pthread_t       wthread;
} h = {.mu  = PTHREAD_MUTEX_INITIALIZER,
       .cv  = PTHREAD_COND_INITIALIZER,
       .wmu = PTHREAD_MUTEX_INITIALIZER};

// One HTTP request.
struct req {
    struct MHD_Connection *conn;
    pthread_mutex_t        mu;
    // the route, decided from the URL and the headers
    int  method; // a ddld_method, ROUTE_STATS, or -1 (answered from `status` at once)
    // a dashboard path (ddld_dashboard_path), answered by metrics.c; method is GetStatus's,
    // whose role /dashboard.json needs
    const char *dash;
    char model[256], version[64];
    // the body
    char  *body;
    size_t len, cap;
    bool   too_big;
    // the outcome (status 0: none yet)
    bool         submitted, suspended, answered; // answered: under mu, once rendered
    unsigned int status;
    char        *out; // libc malloc (open_memstream): MHD frees it
    size_t       out_len;
    FILE        *f;        // the answer being written (begin .. end), into out and out_len
    size_t       json_len; // > 0: binary tensors follow the JSON (Inference-Header-Content-Length)
    const char  *ctype;
    // ModelInfer: which outputs come binary
    bool binary_out;
    // the submitted call (a reference, for ddld_call_cancel) and, while suspended, the
    // request's place on the watcher's list (under h.wmu)
    ddld_call  *call;
    int         fd;
    bool        on_list;
    struct req *wprev, *wnext;
};

// ---- the HTTP code of a gRPC status -------------------------------------------------------

static unsigned int http_status(grpc_status_code code)
{
    switch (code) {
    case GRPC_STATUS_OK:
        return MHD_HTTP_OK;
    case GRPC_STATUS_CANCELLED:
        return 499; // the client closed the request (nginx's code)
    case GRPC_STATUS_INVALID_ARGUMENT:
    case GRPC_STATUS_FAILED_PRECONDITION:
    case GRPC_STATUS_OUT_OF_RANGE:
        return MHD_HTTP_BAD_REQUEST;
    case GRPC_STATUS_DEADLINE_EXCEEDED:
        return MHD_HTTP_GATEWAY_TIMEOUT;
    case GRPC_STATUS_NOT_FOUND:
        return MHD_HTTP_NOT_FOUND;
    case GRPC_STATUS_ALREADY_EXISTS:
    case GRPC_STATUS_ABORTED:
        return MHD_HTTP_CONFLICT;
    case GRPC_STATUS_PERMISSION_DENIED:
        return MHD_HTTP_FORBIDDEN;
    case GRPC_STATUS_UNAUTHENTICATED:
        return MHD_HTTP_UNAUTHORIZED;
    case GRPC_STATUS_RESOURCE_EXHAUSTED:
        return MHD_HTTP_TOO_MANY_REQUESTS;
    case GRPC_STATUS_UNIMPLEMENTED:
        return MHD_HTTP_NOT_IMPLEMENTED;
    case GRPC_STATUS_UNAVAILABLE:
        return MHD_HTTP_SERVICE_UNAVAILABLE;
    default:
        return MHD_HTTP_INTERNAL_SERVER_ERROR;
    }
}

// ---- writing JSON -------------------------------------------------------------------------

static void put_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p != '\0'; p++) {
        if (*p == '"' || *p == '\\') {
            fputc('\\', f);
            fputc(*p, f);
        } else if (*p < 0x20) {
            fprintf(f, "\\u%04x", *p);
        } else {
            fputc(*p, f);
        }
    }
    fputc('"', f);
}

static void put_real(FILE *f, double v, int digits)
{
    if (isnan(v)) {
        fputs("NaN", f); // as Python's json writes them: not JSON, but nothing is lost
    } else if (isinf(v)) {
        fputs(v > 0 ? "Infinity" : "-Infinity", f);
    } else {
        fprintf(f, "%.*g", digits, v);
    }
}

static void put_strs(FILE *f, char *const *s, size_t n)
{
    fputc('[', f);
    for (size_t i = 0; i < n; i++) {
        if (i > 0) {
            fputc(',', f);
        }
        put_str(f, s[i]);
    }
    fputc(']', f);
}

static void put_shape(FILE *f, const int64_t *shape, size_t n)
{
    fputc('[', f);
    for (size_t i = 0; i < n; i++) {
        fprintf(f, "%s%" PRId64, i > 0 ? "," : "", shape[i]);
    }
    fputc(']', f);
}

// An answer is written between begin (NULL: out of memory, a bare 500 is set) and end.
static FILE *begin(struct req *r)
{
    r->out     = NULL;
    r->out_len = 0;
    r->f       = open_memstream(&r->out, &r->out_len);
    if (r->f == NULL) {
        r->status = MHD_HTTP_INTERNAL_SERVER_ERROR;
        r->ctype  = "application/json";
    }
    return r->f;
}

static void end(struct req *r, unsigned int status)
{
    if (r->f == NULL) {
        return;
    }
    r->status = fclose(r->f) == 0 ? status : MHD_HTTP_INTERNAL_SERVER_ERROR; // sets out, out_len
    r->f      = NULL;
    if (r->ctype == NULL) {
        r->ctype = "application/json";
    }
}

static void answer_error(struct req *r, unsigned int status, const char *msg)
{
    free(r->out); // an answer begun before (out of memory while writing it)
    r->ctype    = "application/json";
    r->json_len = 0;
    FILE *f     = begin(r);
    if (f != NULL) {
        fputs("{\"error\":", f);
        put_str(f, msg != NULL && msg[0] != '\0' ? msg : "error");
        fputs("}", f);
    }
    end(r, status);
}

static void answer_errorf(struct req *r, unsigned int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void answer_errorf(struct req *r, unsigned int status, const char *fmt, ...)
{
    char    msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    answer_error(r, status, msg);
}

// ---- rendering answers (on the thread that answered) ------------------------------------

static void render_infer(struct req *r, const Inference__ModelInferResponse *q)
{
    FILE *f = begin(r);
    if (f == NULL) {
        return;
    }
    fputs("{\"model_name\":", f);
    put_str(f, q->model_name);
    fputs(",\"model_version\":", f);
    put_str(f, q->model_version);
    if (q->id[0] != '\0') {
        fputs(",\"id\":", f);
        put_str(f, q->id);
    }
    fputs(",\"outputs\":[", f);
    for (size_t i = 0; i < q->n_outputs; i++) {
        const Inference__ModelInferResponse__InferOutputTensor *o = q->outputs[i];
        const ProtobufCBinaryData                              *raw =
            i < q->n_raw_output_contents ? &q->raw_output_contents[i] : NULL;
        fprintf(f, "%s{\"name\":", i > 0 ? "," : "");
        put_str(f, o->name);
        fputs(",\"datatype\":", f);
        put_str(f, o->datatype);
        fputs(",\"shape\":", f);
        put_shape(f, o->shape, o->n_shape);
        bool f64 = strcmp(o->datatype, "FP64") == 0;
        if (r->binary_out && raw != NULL) {
            fprintf(f, ",\"parameters\":{\"binary_data_size\":%zu}}", raw->len);
            continue;
        }
        fputs(",\"data\":[", f);
        size_t es = f64 ? 8 : 4, n = raw != NULL ? raw->len / es : 0;
        for (size_t k = 0; k < n; k++) {
            if (k > 0) {
                fputc(',', f);
            }
            if (f64) {
                double v;
                memcpy(&v, raw->data + k * 8, 8);
                put_real(f, v, 17);
            } else {
                float v;
                memcpy(&v, raw->data + k * 4, 4);
                put_real(f, (double)v, 9);
            }
        }
        fputs("]}", f);
    }
    fputs("]}", f);
    r->ctype = "application/json";
    if (r->binary_out) {
        fflush(f); // out_len is the JSON's length now
        r->json_len = r->out_len;
        for (size_t i = 0; i < q->n_raw_output_contents; i++) {
            fwrite(q->raw_output_contents[i].data, 1, q->raw_output_contents[i].len, f);
        }
        r->ctype = "application/octet-stream";
    }
    end(r, MHD_HTTP_OK);
}

static void render_model_metadata(struct req *r, const Inference__ModelMetadataResponse *q)
{
    FILE *f = begin(r);
    if (f == NULL) {
        return;
    }
    fputs("{\"name\":", f);
    put_str(f, q->name);
    fputs(",\"versions\":", f);
    put_strs(f, q->versions, q->n_versions);
    fputs(",\"platform\":", f);
    put_str(f, q->platform);
    for (int io = 0; io < 2; io++) {
        size_t n = io == 0 ? q->n_inputs : q->n_outputs;
        Inference__ModelMetadataResponse__TensorMetadata *const *t =
            io == 0 ? q->inputs : q->outputs;
        fputs(io == 0 ? ",\"inputs\":[" : ",\"outputs\":[", f);
        for (size_t i = 0; i < n; i++) {
            fprintf(f, "%s{\"name\":", i > 0 ? "," : "");
            put_str(f, t[i]->name);
            fputs(",\"datatype\":", f);
            put_str(f, t[i]->datatype);
            fputs(",\"shape\":", f);
            put_shape(f, t[i]->shape, t[i]->n_shape);
            fputc('}', f);
        }
        fputc(']', f);
    }
    fputc('}', f);
    end(r, MHD_HTTP_OK);
}

static void put_duration(FILE *f, const char *name, uint64_t count, double s)
{
    fprintf(f, "\"%s\":{\"count\":%" PRIu64 ",\"ns\":%.0f}", name, count, s * 1e9);
}

// The statistics extension, for the model the metadata call found.
static void render_stats(struct req *r, const Inference__ModelMetadataResponse *q)
{
    ddld_infer_stats s;
    ddld_metrics_infer_stats(&s);
    FILE *f = begin(r);
    if (f == NULL) {
        return;
    }
    fputs("{\"model_stats\":[{\"name\":", f);
    put_str(f, q->name);
    fprintf(f,
            ",\"version\":\"1\",\"last_inference\":%.0f,\"inference_count\":%" PRIu64
            ",\"execution_count\":%" PRIu64 ",\"inference_stats\":{",
            s.last_unix * 1e3, s.inference_count, s.exec_count);
    put_duration(f, "success", s.success_count, s.success_s);
    fputc(',', f);
    put_duration(f, "fail", s.fail_count, s.fail_s);
    fputc(',', f);
    put_duration(f, "queue", s.queue_count, s.queue_s);
    fputc(',', f);
    put_duration(f, "compute_infer", s.exec_count, s.exec_s);
    fputs("},\"batch_stats\":[", f);
    for (int i = 0; i < s.nsizes; i++) {
        fprintf(f, "%s{\"batch_size\":%" PRId64 ",", i > 0 ? "," : "", s.sizes[i].rows);
        put_duration(f, "compute_infer", s.sizes[i].count, s.sizes[i].exec_s);
        fputc('}', f);
    }
    fputs("]}]}", f);
    end(r, MHD_HTTP_OK);
}

static void render_flag(struct req *r, bool yes, const char *what)
{
    if (yes) {
        begin(r); // an empty body
        end(r, MHD_HTTP_OK);
    } else {
        // The protocol: a 4xx status says false.
        answer_errorf(r, MHD_HTTP_BAD_REQUEST, "%s", what);
    }
}

static void render_server_metadata(struct req *r, const Inference__ServerMetadataResponse *q)
{
    FILE *f = begin(r);
    if (f != NULL) {
        fputs("{\"name\":", f);
        put_str(f, q->name);
        fputs(",\"version\":", f);
        put_str(f, q->version);
        fputs(",\"extensions\":", f);
        put_strs(f, q->extensions, q->n_extensions);
        fputc('}', f);
    }
    end(r, MHD_HTTP_OK);
}

// ---- the watcher: suspended requests whose clients went away ------------------------------

static void watch(struct req *r) // under r->mu, before the answer
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci == NULL || r->call == NULL || !h.wstarted) {
        return; // not watched: such a call runs as if its client stayed
    }
    pthread_mutex_lock(&h.wmu);
    r->fd      = ci->connect_fd;
    r->on_list = true;
    r->wprev   = NULL;
    r->wnext   = h.watched;
    if (h.watched != NULL) {
        h.watched->wprev = r;
    }
    h.watched = r;
    h.nwatched++;
    pthread_mutex_unlock(&h.wmu);
}

static void unwatch(struct req *r)
{
    pthread_mutex_lock(&h.wmu);
    if (r->on_list) {
        if (r->wprev != NULL) {
            r->wprev->wnext = r->wnext;
        } else {
            h.watched = r->wnext;
        }
        if (r->wnext != NULL) {
            r->wnext->wprev = r->wprev;
        }
        r->on_list = false;
        h.nwatched--;
    }
    pthread_mutex_unlock(&h.wmu);
}

static void *watcher(void *arg)
{
    (void)arg;
    struct pollfd *pfd   = NULL;
    ddld_call    **calls = NULL;
    int            cap   = 0;
    for (;;) {
        // a snapshot of the sockets, each call held: the thread never touches a request,
        // which its connection may free meanwhile
        pthread_mutex_lock(&h.wmu);
        if (h.wstop) {
            pthread_mutex_unlock(&h.wmu);
            break;
        }
        if (h.nwatched > cap) {
            int            ncap = h.nwatched * 2;
            struct pollfd *np   = ddl_realloc(pfd, (size_t)ncap * sizeof *np);
            pfd                 = np != NULL ? np : pfd;
            ddld_call **nc      = np != NULL ? ddl_realloc(calls, (size_t)ncap * sizeof *nc) : NULL;
            calls               = nc != NULL ? nc : calls;
            cap                 = np != NULL && nc != NULL ? ncap : cap; // short: watch fewer
        }
        int n = 0;
        for (struct req *r = h.watched; r != NULL && n < cap; r = r->wnext) {
            if (!ddld_call_cancelled(r->call)) { // cancelled: its answer is on its way
                pfd[n]   = (struct pollfd){.fd = r->fd, .events = POLLRDHUP};
                calls[n] = r->call;
                ddld_call_hold(r->call);
                n++;
            }
        }
        pthread_mutex_unlock(&h.wmu);
        int got = n > 0 ? poll(pfd, (nfds_t)n, WATCH_MS) : 0;
        if (n == 0) {
            struct timespec ts = {0, WATCH_MS * 1000000L};
            nanosleep(&ts, NULL);
        }
        for (int i = 0; i < n; i++) {
            if (got > 0 && (pfd[i].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0) {
                ddld_call_cancel(calls[i]);
            }
            ddld_call_release(calls[i]);
        }
    }
    ddl_free(pfd);
    ddl_free(calls);
    return NULL;
}

// The service's answer to a submitted call (any thread; exactly once).
static void call_done(void *ud, grpc_status_code code, const char *msg,
                      const ProtobufCMessage *resp)
{
    struct req *r = ud;
    if (code != GRPC_STATUS_OK || resp == NULL) {
        answer_error(r, http_status(code), msg);
    } else if (r->method == ROUTE_STATS) {
        render_stats(r, (const void *)resp);
    } else {
        switch (r->method) {
        case DDLD_M_MODEL_INFER:
            render_infer(r, (const void *)resp);
            break;
        case DDLD_M_MODEL_METADATA:
            render_model_metadata(r, (const void *)resp);
            break;
        case DDLD_M_SERVER_METADATA:
            render_server_metadata(r, (const void *)resp);
            break;
        case DDLD_M_SERVER_LIVE:
            render_flag(r, ((const Inference__ServerLiveResponse *)resp)->live, "not live");
            break;
        case DDLD_M_SERVER_READY:
            render_flag(r, ((const Inference__ServerReadyResponse *)resp)->ready,
                        "not ready (no model loaded, or shutting down)");
            break;
        default: // ModelReady
            render_flag(r, ((const Inference__ModelReadyResponse *)resp)->ready,
                        "the model is not ready");
            break;
        }
    }
    pthread_mutex_lock(&r->mu);
    r->answered = true;
    bool resume = r->suspended;
    pthread_mutex_unlock(&r->mu);
    unwatch(r);
    if (resume) {
        MHD_resume_connection(r->conn);
    }
    pthread_mutex_lock(&h.mu);
    if (--h.outstanding == 0) {
        pthread_cond_broadcast(&h.cv);
    }
    pthread_mutex_unlock(&h.mu);
}

// ---- reading an inference request ----------------------------------------------------------

// JSON "data" (flat or nested arrays) into n elements of the datatype's contents array.
struct flat {
    const char *dt;
    size_t      n, cap, es;
    void       *v;
    bool        oom; // the error is a shortage (500), not the request's (400)
    char        err[256];
};

static bool flat_push(struct flat *fl, json_t *x, size_t at)
{
    if (fl->n == fl->cap) {
        size_t ncap = fl->cap > 0 ? fl->cap * 2 : 1024;
        void  *nv   = ddl_realloc(fl->v, ncap * fl->es);
        if (nv == NULL) {
            snprintf(fl->err, sizeof fl->err, "out of memory for the input's data");
            fl->oom = true;
            return false;
        }
        fl->v   = nv;
        fl->cap = ncap;
    }
    const char *dt = fl->dt;
    if (strcmp(dt, "FP32") == 0 || strcmp(dt, "FP64") == 0) {
        if (!json_is_number(x)) {
            snprintf(fl->err, sizeof fl->err, "data[%zu]: expected a number", at);
            return false;
        }
        double v = json_number_value(x);
        if (dt[2] == '3') {
            ((float *)fl->v)[fl->n++] = (float)v;
        } else {
            ((double *)fl->v)[fl->n++] = v;
        }
        return true;
    }
    if (strcmp(dt, "BOOL") == 0) {
        if (!json_is_boolean(x)) {
            snprintf(fl->err, sizeof fl->err, "data[%zu]: expected true or false", at);
            return false;
        }
        ((protobuf_c_boolean *)fl->v)[fl->n++] = json_is_true(x);
        return true;
    }
    if (!json_is_integer(x)) {
        snprintf(fl->err, sizeof fl->err, "data[%zu]: expected an integer for %s", at, dt);
        return false;
    }
    json_int_t v = json_integer_value(x);
    if (dt[0] == 'U' && v < 0) {
        snprintf(fl->err, sizeof fl->err, "data[%zu] = %" JSON_INTEGER_FORMAT " is not a %s", at, v,
                 dt);
        return false;
    }
    if (strcmp(dt, "INT64") == 0) {
        ((int64_t *)fl->v)[fl->n++] = v;
    } else if (strcmp(dt, "UINT64") == 0) {
        ((uint64_t *)fl->v)[fl->n++] = (uint64_t)v;
    } else if (dt[0] == 'U') {
        if (v > UINT32_MAX) {
            snprintf(fl->err, sizeof fl->err, "data[%zu] = %" JSON_INTEGER_FORMAT " is not a %s",
                     at, v, dt);
            return false;
        }
        ((uint32_t *)fl->v)[fl->n++] = (uint32_t)v;
    } else {
        if (v < INT32_MIN || v > INT32_MAX) {
            snprintf(fl->err, sizeof fl->err, "data[%zu] = %" JSON_INTEGER_FORMAT " is not a %s",
                     at, v, dt);
            return false;
        }
        ((int32_t *)fl->v)[fl->n++] = (int32_t)v;
    }
    return true;
}

static bool flatten(struct flat *fl, json_t *x, int depth)
{
    if (!json_is_array(x)) {
        return flat_push(fl, x, fl->n);
    }
    if (depth > 32) {
        snprintf(fl->err, sizeof fl->err, "data: nested deeper than 32 levels");
        return false;
    }
    size_t  i;
    json_t *e;
    json_array_foreach(x, i, e)
    {
        if (!flatten(fl, e, depth + 1)) {
            return false;
        }
    }
    return true;
}

// Where the typed contents go, by datatype: the element size, the contents' count and array
// fields, and the type ddl_fmt_jdata_convert reads its numbers as (*jt false: BOOL, which
// the tree path reads). false: a datatype with no JSON contents (BYTES) or an unknown one.
static bool contents_slot(Inference__InferTensorContents *c, const char *dt, size_t **n, void ***v,
                          size_t *es, ddl_fmt_jtype *jt, bool *has_jt)
{
    struct {
        const char   *dt;
        size_t       *n;
        void        **v;
        size_t        es;
        ddl_fmt_jtype jt;
        bool          has_jt;
    } slots[] = {
        {"FP32", &c->n_fp32_contents, (void **)&c->fp32_contents, 4, DDL_FMT_J_F32, true},
        {"FP64", &c->n_fp64_contents, (void **)&c->fp64_contents, 8, DDL_FMT_J_F64, true},
        {"BOOL", &c->n_bool_contents, (void **)&c->bool_contents, sizeof(protobuf_c_boolean),
         DDL_FMT_J_I32, false},
        {"INT8", &c->n_int_contents, (void **)&c->int_contents, 4, DDL_FMT_J_I32, true},
        {"INT16", &c->n_int_contents, (void **)&c->int_contents, 4, DDL_FMT_J_I32, true},
        {"INT32", &c->n_int_contents, (void **)&c->int_contents, 4, DDL_FMT_J_I32, true},
        {"INT64", &c->n_int64_contents, (void **)&c->int64_contents, 8, DDL_FMT_J_I64, true},
        {"UINT8", &c->n_uint_contents, (void **)&c->uint_contents, 4, DDL_FMT_J_U32, true},
        {"UINT16", &c->n_uint_contents, (void **)&c->uint_contents, 4, DDL_FMT_J_U32, true},
        {"UINT32", &c->n_uint_contents, (void **)&c->uint_contents, 4, DDL_FMT_J_U32, true},
        {"UINT64", &c->n_uint64_contents, (void **)&c->uint64_contents, 8, DDL_FMT_J_U64, true},
    };
    for (size_t i = 0; i < sizeof slots / sizeof slots[0]; i++) {
        if (strcmp(dt, slots[i].dt) == 0) {
            *n      = slots[i].n;
            *v      = slots[i].v;
            *es     = slots[i].es;
            *jt     = slots[i].jt;
            *has_jt = slots[i].has_jt;
            return true;
        }
    }
    return false;
}

static bool param_bool(json_t *params, const char *key, bool *out, char *err, size_t errlen,
                       const char *where)
{
    json_t *p = params != NULL ? json_object_get(params, key) : NULL;
    if (p == NULL) {
        return true;
    }
    if (!json_is_boolean(p)) {
        snprintf(err, errlen, "%s.parameters.%s: expected true or false", where, key);
        return false;
    }
    *out = json_is_true(p);
    return true;
}

// The element count an input's shape declares; 0 when a dimension is negative or the
// product overflows (the count is then taken from the data).
static size_t shape_count(const Inference__ModelInferRequest__InferInputTensor *in)
{
    size_t n = 1;
    for (size_t k = 0; k < in->n_shape; k++) {
        if (in->shape[k] < 0 || (in->shape[k] > 0 && n > SIZE_MAX / (size_t)in->shape[k])) {
            return 0;
        }
        n *= (size_t)in->shape[k];
    }
    return n;
}

// Input i's data from its span of the JSON text (the tree holds 0 there), read as type t:
// into fl, as flatten would have put it. want: the element count its shape declares (0:
// none usable). A buffer of that size is read into at once; only when the shape promises
// more numbers than the span could hold does a counting pass size it first. More numbers
// than the shape declares, or a bad one: false, declined (the caller takes the tree path,
// which names the mistake).
static bool span_data(struct flat *fl, const char *jtext, ddl_fmt_jspan span, ddl_fmt_jtype t,
                      size_t want)
{
    // Each number takes a character at least and a separator after all but the last one.
    size_t fits = (span.end - span.begin + 1) / 2;
    size_t cap  = want > 0 && want <= fits ? want : ddl_fmt_jdata_count(jtext, span);
    fl->v      = ddl_malloc((cap > 0 ? cap : 1) * fl->es);
    if (fl->v == NULL) {
        return false; // the tree path reports the shortage
    }
    fl->cap = cap;
    return ddl_fmt_jdata_convert(jtext, span, t, fl->v, cap, &fl->n) == 0;
}

// The request's tree (root) as a ModelInferRequest (packed, then decoded by the gRPC path's
// decoder, so it owns its memory as every request does). spans (or NULL): the data arrays
// read from jtext, cut to 0 in the tree. NULL: *status and the error are set, or with
// spans, possibly no error: a data array the spans cannot give as the tree would (the
// caller then builds the request from the whole tree, which sets them).
static ProtobufCMessage *build_infer(struct req *r, json_t *root, size_t jlen,
                                     const ddl_fmt_jspan *spans, const char *jtext,
                                     unsigned int *status, char *err, size_t errlen)
{
    ProtobufCMessage                              *m = NULL;
    Inference__ModelInferRequest                   q = INFERENCE__MODEL_INFER_REQUEST__INIT;
    Inference__ModelInferRequest__InferInputTensor in[MAX_INPUTS], *inp[MAX_INPUTS];
    Inference__InferTensorContents                 ct[MAX_INPUTS];
    ProtobufCBinaryData                            raw[MAX_INPUTS];
    void                                          *owned[MAX_INPUTS] = {0};
    Inference__ModelInferRequest__InferRequestedOutputTensor out[MAX_INPUTS], *outp[MAX_INPUTS];
    size_t                                                   nin = 0, nout = 0, nraw = 0;
    json_t *inputs = json_object_get(root, "inputs"), *outputs = json_object_get(root, "outputs");
    json_t *id = json_object_get(root, "id"), *params = json_object_get(root, "parameters");
    err[0] = '\0';
    if (!json_is_object(root)) {
        snprintf(err, errlen, "the request is not a JSON object");
        goto out;
    }
    if (id != NULL && !json_is_string(id)) {
        snprintf(err, errlen, "id: expected a string");
        goto out;
    }
    if (params != NULL && !json_is_object(params)) {
        snprintf(err, errlen, "parameters: expected an object");
        goto out;
    }
    if (!param_bool(params, "binary_data_output", &r->binary_out, err, errlen, "request")) {
        goto out;
    }
    if (!json_is_array(inputs) || json_array_size(inputs) == 0) {
        snprintf(err, errlen, "inputs: expected a non-empty array of tensors");
        goto out;
    }
    if (json_array_size(inputs) > MAX_INPUTS ||
        (outputs != NULL && json_array_size(outputs) > MAX_INPUTS)) {
        snprintf(err, errlen, "more than %d inputs or outputs", MAX_INPUTS);
        goto out;
    }
    if (outputs != NULL && !json_is_array(outputs)) {
        snprintf(err, errlen, "outputs: expected an array");
        goto out;
    }
    size_t boff = jlen; // the next binary tensor's first byte
    for (size_t i = 0; i < json_array_size(inputs); i++, nin++) {
        json_t *t = json_array_get(inputs, i);
        inference__model_infer_request__infer_input_tensor__init(&in[i]);
        inference__infer_tensor_contents__init(&ct[i]);
        inp[i]       = &in[i];
        json_t *name = json_object_get(t, "name"), *dt = json_object_get(t, "datatype");
        json_t *shape = json_object_get(t, "shape"), *data = json_object_get(t, "data");
        json_t *tp    = json_object_get(t, "parameters");
        json_t *bsize = json_is_object(tp) ? json_object_get(tp, "binary_data_size") : NULL;
        if (!json_is_object(t) || !json_is_string(name) || !json_is_string(dt) ||
            !json_is_array(shape)) {
            snprintf(err, errlen, "inputs[%zu]: expected an object with name, datatype and shape",
                     i);
            goto out;
        }
        in[i].name     = (char *)json_string_value(name);
        in[i].datatype = (char *)json_string_value(dt);
        in[i].n_shape  = json_array_size(shape);
        in[i].shape    = ddl_calloc(in[i].n_shape + 1, sizeof(int64_t));
        if (in[i].shape == NULL) {
            *status = MHD_HTTP_INTERNAL_SERVER_ERROR;
            snprintf(err, errlen, "out of memory");
            nin++;
            goto out;
        }
        for (size_t k = 0; k < in[i].n_shape; k++) {
            json_t *d = json_array_get(shape, k);
            if (!json_is_integer(d)) {
                snprintf(err, errlen, "inputs[%zu].shape[%zu]: expected an integer", i, k);
                nin++;
                goto out;
            }
            in[i].shape[k] = json_integer_value(d);
        }
        if (bsize != NULL) {
            if (!json_is_integer(bsize) || json_integer_value(bsize) < 0 ||
                (size_t)json_integer_value(bsize) > r->len - boff) {
                snprintf(err, errlen,
                         "inputs[%zu].parameters.binary_data_size: expected a byte count within "
                         "the %zu bytes after the JSON",
                         i, r->len - boff);
                nin++;
                goto out;
            }
            if (data != NULL) {
                snprintf(err, errlen, "inputs[%zu]: both data and binary_data_size", i);
                nin++;
                goto out;
            }
            raw[nraw].data = (uint8_t *)r->body + boff;
            raw[nraw].len  = (size_t)json_integer_value(bsize);
            boff += raw[nraw++].len;
            continue;
        }
        if (data == NULL) {
            snprintf(err, errlen, "inputs[%zu]: no data (nor binary_data_size)", i);
            nin++;
            goto out;
        }
        size_t       *cn;
        void        **cv;
        size_t        es;
        ddl_fmt_jtype jt;
        bool          has_jt;
        if (!contents_slot(&ct[i], in[i].datatype, &cn, &cv, &es, &jt, &has_jt)) {
            snprintf(err, errlen, "inputs[%zu]: datatype \"%.32s\" cannot be given as JSON data", i,
                     in[i].datatype);
            nin++;
            goto out;
        }
        struct flat fl = {.dt = in[i].datatype, .es = es};
        bool        ok;
        if (spans != NULL && spans[i].end > spans[i].begin) {
            ok       = has_jt && span_data(&fl, jtext, spans[i], jt, shape_count(&in[i]));
            owned[i] = fl.v;
            if (!ok) { // declined: the tree path reads it
                nin++;
                goto out;
            }
        } else {
            ok       = flatten(&fl, data, 0);
            owned[i] = fl.v;
        }
        if (!ok) {
            // A path for the request's mistakes (inputs[0].data[3]: ...), a sentence for
            // a shortage of the server's.
            snprintf(err, errlen, fl.oom ? "inputs[%zu]: %s" : "inputs[%zu].%s", i, fl.err);
            if (fl.oom) {
                *status = MHD_HTTP_INTERNAL_SERVER_ERROR;
            }
            nin++;
            goto out;
        }
        *cn            = fl.n;
        *cv            = fl.v;
        in[i].contents = &ct[i];
    }
    if (nraw > 0 && nraw != nin) {
        snprintf(err, errlen, "either every input is binary (binary_data_size) or none is");
        goto out;
    }
    if (boff != r->len) {
        snprintf(err, errlen, "%zu bytes after the JSON are not claimed by any binary_data_size",
                 r->len - boff);
        goto out;
    }
    for (size_t i = 0; outputs != NULL && i < json_array_size(outputs); i++, nout++) {
        json_t *o = json_array_get(outputs, i), *name = json_object_get(o, "name");
        inference__model_infer_request__infer_requested_output_tensor__init(&out[i]);
        outp[i] = &out[i];
        if (!json_is_object(o) || !json_is_string(name)) {
            snprintf(err, errlen, "outputs[%zu]: expected an object with a name", i);
            goto out;
        }
        out[i].name = (char *)json_string_value(name);
        json_t *op  = json_object_get(o, "parameters");
        char    where[32];
        snprintf(where, sizeof where, "outputs[%zu]", i);
        if (op != NULL && !json_is_object(op)) {
            snprintf(err, errlen, "%s.parameters: expected an object", where);
            goto out;
        }
        if (!param_bool(op, "binary_data", &r->binary_out, err, errlen, where)) {
            goto out;
        }
    }
    q.model_name           = r->model;
    q.model_version        = r->version;
    q.id                   = id != NULL ? (char *)json_string_value(id) : "";
    q.n_inputs             = nin;
    q.inputs               = inp;
    q.n_outputs            = nout;
    q.outputs              = outp;
    q.n_raw_input_contents = nraw;
    q.raw_input_contents   = raw;
    size_t     plen        = protobuf_c_message_get_packed_size(&q.base);
    grpc_slice s           = grpc_slice_malloc(plen);
    protobuf_c_message_pack(&q.base, GRPC_SLICE_START_PTR(s));
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    char why[256];
    m = ddld_request_decode(bb, &inference__model_infer_request__descriptor, why, sizeof why);
    grpc_byte_buffer_destroy(bb);
    if (m == NULL) {
        snprintf(err, errlen, "%s", why[0] != '\0' ? why : "the request does not convert");
    }
out:
    for (size_t i = 0; i < nin; i++) {
        ddl_free(in[i].shape);
        ddl_free(owned[i]);
    }
    return m;
}

// The body as a ModelInferRequest. NULL: *status and the error are set.
//
// The fast way first: the data arrays are read straight from the text (ddl_fmt_jdata_spans)
// and cut out of a copy that jansson then parses, so it neither builds an object per
// number nor scans their text. Its
// result is taken only when it succeeds; a text it declines, a copy jansson refuses, and
// any error of the request are all done again from the whole body, the slow way, so the
// answer and every error message are those of the slow way.
static ProtobufCMessage *infer_request(struct req *r, unsigned int *status, char *err,
                                       size_t errlen)
{
    *status          = MHD_HTTP_BAD_REQUEST;
    size_t      jlen = r->len;
    const char *hdr =
        MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Inference-Header-Content-Length");
    if (hdr != NULL) {
        char              *end;
        unsigned long long v = strtoull(hdr, &end, 10);
        if (hdr[0] < '0' || hdr[0] > '9' || *end != '\0' || v > r->len) {
            snprintf(err, errlen,
                     "Inference-Header-Content-Length: \"%.32s\" is not a length within the "
                     "%zu-byte body",
                     hdr, r->len);
            return NULL;
        }
        jlen = (size_t)v;
    }
    const char   *text = r->body != NULL ? r->body : "";
    ddl_fmt_jspan spans[MAX_INPUTS];
    bool          any = false;
    if (!h.tree_only && ddl_fmt_jdata_spans(text, jlen, spans, MAX_INPUTS) == 0) {
        for (size_t i = 0; i < MAX_INPUTS; i++) {
            any = any || spans[i].end > spans[i].begin;
        }
    }
    char *copy = any ? ddl_malloc(jlen + 1) : NULL;
    if (copy != NULL) {
        // the request without its data (which jansson would otherwise scan, blanked or not,
        // at several times the cost of reading it here)
        size_t  clen = ddl_fmt_jdata_cut(text, jlen, spans, MAX_INPUTS, copy);
        json_t *root = json_loadb(copy, clen, JSON_REJECT_DUPLICATES, NULL);
        if (root != NULL) {
            ProtobufCMessage *m = build_infer(r, root, jlen, spans, text, status, err, errlen);
            json_decref(root);
            if (m != NULL) {
                ddl_free(copy);
                return m;
            }
        }
        ddl_free(copy);
        *status = MHD_HTTP_BAD_REQUEST;
    }
    json_error_t je;
    json_t      *root = json_loadb(text, jlen, JSON_REJECT_DUPLICATES, &je);
    if (root == NULL && json_error_code(&je) == json_error_out_of_memory) {
        *status = MHD_HTTP_INTERNAL_SERVER_ERROR;
        snprintf(err, errlen, "out of memory for the JSON request");
        return NULL;
    }
    if (root == NULL) {
        snprintf(err, errlen, "malformed JSON at line %d, column %d: %s", je.line, je.column,
                 je.text);
        return NULL;
    }
    ProtobufCMessage *m = build_infer(r, root, jlen, NULL, text, status, err, errlen);
    json_decref(root);
    return m;
}

// ---- routing ---------------------------------------------------------------------------------

// Copies one path segment (up to the next '/' or the end) into buf; the rest after it.
static const char *segment(const char *p, char *buf, size_t len, bool *ok)
{
    size_t n = strcspn(p, "/");
    if (n == 0 || n >= len) {
        *ok = false;
        return p + n;
    }
    memcpy(buf, p, n);
    buf[n] = '\0';
    return p + n;
}

// The method a URL and HTTP method ask for: sets r->method (and model, version), or answers
// 404 / 405 at once. POST only for infer, GET (or HEAD) for the rest.
static void route(struct req *r, const char *url, const char *method)
{
    bool get =
        strcmp(method, MHD_HTTP_METHOD_GET) == 0 || strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
    bool post    = strcmp(method, MHD_HTTP_METHOD_POST) == 0;
    r->method    = -1;
    int  want    = -1;
    bool is_post = false;
    if ((r->dash = ddld_dashboard_path(url)) != NULL) {
        if (!ddld_dashboard_enabled()) {
            answer_errorf(r, MHD_HTTP_NOT_FOUND,
                          "not found: %s is served while --metrics-listen collects its figures "
                          "(docs/METRICS.md)",
                          r->dash);
            return;
        }
        want = DDLD_M_GET_STATUS;
    } else if (strcmp(url, "/v2") == 0 || strcmp(url, "/v2/") == 0) {
        want = DDLD_M_SERVER_METADATA;
    } else if (strcmp(url, "/v2/health/live") == 0) {
        want = DDLD_M_SERVER_LIVE;
    } else if (strcmp(url, "/v2/health/ready") == 0) {
        want = DDLD_M_SERVER_READY;
    } else if (strcmp(url, "/v2/models/stats") == 0) {
        want = ROUTE_STATS;
    } else if (strncmp(url, "/v2/models/", 11) == 0) {
        bool        ok = true;
        const char *p  = segment(url + 11, r->model, sizeof r->model, &ok);
        if (ok && strncmp(p, "/versions/", 10) == 0) {
            p = segment(p + 10, r->version, sizeof r->version, &ok);
        }
        if (!ok) {
            answer_errorf(r, MHD_HTTP_NOT_FOUND, "not found: %.200s", url);
            return;
        }
        if (p[0] == '\0') {
            want = DDLD_M_MODEL_METADATA;
        } else if (strcmp(p, "/ready") == 0) {
            want = DDLD_M_MODEL_READY;
        } else if (strcmp(p, "/stats") == 0) {
            want = ROUTE_STATS;
        } else if (strcmp(p, "/infer") == 0) {
            want    = DDLD_M_MODEL_INFER;
            is_post = true;
        }
    }
    if (want < 0) {
        answer_errorf(r, MHD_HTTP_NOT_FOUND,
                      "not found: %.200s (the KServe v2 endpoints are under /v2, see "
                      "docs/SERVER.md; the dashboard is at /dashboard)",
                      url);
        return;
    }
    if ((is_post && !post) || (!is_post && !get)) {
        answer_errorf(r, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed: %s %.200s needs %s",
                      method, url, is_post ? "POST" : "GET");
        return;
    }
    // The model and its version are the service's to check (after the token).
    r->method = want;
}

static enum MHD_Result count_auth(void *cls, enum MHD_ValueKind kind, const char *key,
                                  const char *value)
{
    (void)kind;
    (void)value;
    if (strcasecmp(key, "authorization") == 0) {
        (*(int *)cls)++;
    }
    return MHD_YES;
}

// Tokens and client certificates, from the headers: false answers the request.
static bool admit(struct req *r)
{
    if (h.mtls) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_GNUTLS_SESSION);
        gnutls_session_t s      = ci != NULL ? (gnutls_session_t)ci->tls_session : NULL;
        unsigned int     status = 1, n = 0;
        if (s == NULL || gnutls_certificate_get_peers(s, &n) == NULL || n == 0 ||
            gnutls_certificate_verify_peers2(s, &status) != GNUTLS_E_SUCCESS || status != 0) {
            answer_error(r, MHD_HTTP_UNAUTHORIZED,
                         "a client certificate issued by --tls-client-ca is required");
            return false;
        }
    }
    if (r->dash != NULL && !ddld_dashboard_private(r->dash)) {
        return true; // the page and Chart.js: no figure of the model, and a browser navigating
                     // to a page sends no token (the page sends its own with each poll)
    }
    int count = 0;
    MHD_get_connection_values(r->conn, MHD_HEADER_KIND, count_auth, &count);
    const char      *v    = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Authorization");
    int              meth = r->method == ROUTE_STATS ? DDLD_M_MODEL_METADATA : r->method;
    char             why[256];
    grpc_status_code code =
        ddld_auth_check_value(ddld_auth_daemon(), meth, ddld_method_path((ddld_method)meth), v,
                              v != NULL ? strlen(v) : 0, count, why, sizeof why);
    if (code != GRPC_STATUS_OK) {
        answer_error(r, http_status(code), why);
        return false;
    }
    return true;
}

// ---- the request handler (libmicrohttpd's threads) ---------------------------------------------

static const char oom_body[] = "{\"error\": \"out of memory for the request\"}";
static char       oom_marker; // *con_cls of a request answered with h.oom

// Packs a stack-built message and decodes it back into owned memory.
static ProtobufCMessage *owned_copy(const ProtobufCMessage *q)
{
    size_t   n = protobuf_c_message_get_packed_size(q);
    uint8_t  buf[1024];
    uint8_t *p = n <= sizeof buf ? buf : NULL;
    if (p == NULL) {
        return NULL;
    }
    protobuf_c_message_pack(q, p);
    return protobuf_c_message_unpack(q->descriptor, NULL, n, p);
}

static ProtobufCMessage *make_request(struct req *r, ddld_method method)
{
    switch (method) {
    case DDLD_M_MODEL_READY: {
        Inference__ModelReadyRequest q = INFERENCE__MODEL_READY_REQUEST__INIT;
        q.name                         = r->model;
        q.version                      = r->version;
        return owned_copy(&q.base);
    }
    case DDLD_M_MODEL_METADATA: {
        Inference__ModelMetadataRequest q = INFERENCE__MODEL_METADATA_REQUEST__INIT;
        q.name                            = r->model;
        q.version                         = r->version;
        return owned_copy(&q.base);
    }
    case DDLD_M_SERVER_LIVE: {
        Inference__ServerLiveRequest q = INFERENCE__SERVER_LIVE_REQUEST__INIT;
        return owned_copy(&q.base);
    }
    case DDLD_M_SERVER_READY: {
        Inference__ServerReadyRequest q = INFERENCE__SERVER_READY_REQUEST__INIT;
        return owned_copy(&q.base);
    }
    default: {
        Inference__ServerMetadataRequest q = INFERENCE__SERVER_METADATA_REQUEST__INIT;
        return owned_copy(&q.base);
    }
    }
}

static enum MHD_Result send_answer(struct req *r)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(r->out_len, r->out, MHD_RESPMEM_MUST_FREE);
    if (resp == NULL) {
        free(r->out);
        r->out = NULL;
        return MHD_NO;
    }
    r->out = NULL; // the response owns it
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, r->ctype);
    if (r->json_len > 0) {
        char v[32];
        snprintf(v, sizeof v, "%zu", r->json_len);
        MHD_add_response_header(resp, "Inference-Header-Content-Length", v);
    }
    if (r->status == MHD_HTTP_METHOD_NOT_ALLOWED) {
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW,
                                r->method == DDLD_M_MODEL_INFER ? "POST" : "GET, HEAD");
    }
    enum MHD_Result ret = MHD_queue_response(r->conn, r->status, resp);
    MHD_destroy_response(resp);
    return ret;
}

// The whole body is in: run the request.
static enum MHD_Result run_request(struct req *r)
{
    if (r->status != 0) {
        return send_answer(r);
    }
    if (r->too_big) {
        answer_errorf(r, MHD_HTTP_CONTENT_TOO_LARGE,
                      "the request body exceeds %lld bytes (--max-message-bytes)",
                      (long long)h.cfg->max_message_bytes);
        return send_answer(r);
    }
    if (r->dash != NULL) {
        return ddld_dashboard_answer(r->conn, r->dash);
    }
    ddld_service *svc = atomic_load(&h.svc);
    if (svc == NULL) {
        answer_error(r, MHD_HTTP_SERVICE_UNAVAILABLE, "distdld is starting");
        return send_answer(r);
    }
    ProtobufCMessage *m;
    ddld_method method = r->method == ROUTE_STATS ? DDLD_M_MODEL_METADATA : (ddld_method)r->method;
    if (method == DDLD_M_MODEL_INFER) {
        unsigned int status;
        char         err[1024];
        m = infer_request(r, &status, err, sizeof err);
        if (m == NULL) {
            answer_errorf(r, status, "ModelInfer: %s", err);
            return send_answer(r);
        }
    } else {
        m = make_request(r, method);
        if (m == NULL) {
            answer_error(r, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory");
            return send_answer(r);
        }
    }
    pthread_mutex_lock(&h.mu);
    h.outstanding++;
    pthread_mutex_unlock(&h.mu);
    r->submitted = true;
    ddld_service_submit(svc, method, m, call_done, r, &r->call);
    pthread_mutex_lock(&r->mu);
    bool answered = r->answered;
    if (!answered) {
        r->suspended = true;
        MHD_suspend_connection(r->conn);
        watch(r);
    }
    pthread_mutex_unlock(&r->mu);
    return answered ? send_answer(r) : MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls)
{
    (void)cls;
    (void)version;
    if (*con_cls == &oom_marker) { // refused for want of memory: the body is dropped
        *upload_size = 0;
        return MHD_YES;
    }
    struct req *r = *con_cls;
    if (r == NULL) { // the headers: route and admit now, answer once the body is in
        r = ddl_calloc(1, sizeof *r);
        if (r == NULL) {
            // Out of memory for the request itself: the 500 made at start-up, which needs
            // none (without it, the connection is closed).
            *con_cls = &oom_marker;
            return h.oom != NULL ? MHD_queue_response(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, h.oom)
                                 : MHD_NO;
        }
        pthread_mutex_init(&r->mu, NULL);
        r->conn  = conn;
        *con_cls = r;
        route(r, url, method);
        if (r->status == 0) {
            admit(r);
        }
        const char *cl =
            MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        long long n = cl != NULL ? atoll(cl) : 0;
        if (n > h.cfg->max_message_bytes) {
            r->too_big = true;
        } else if (r->status == 0 && n > 0) {
            r->body = ddl_malloc((size_t)n + 1);
            r->cap  = r->body != NULL ? (size_t)n : 0;
        }
        return MHD_YES;
    }
    if (*upload_size > 0) {
        size_t n     = *upload_size;
        *upload_size = 0;
        if (r->status != 0 || r->too_big) {
            return MHD_YES; // refused already: the body is read and dropped
        }
        if ((int64_t)(r->len + n) > h.cfg->max_message_bytes) {
            r->too_big = true;
            return MHD_YES;
        }
        if (r->len + n > r->cap) {
            size_t ncap = r->cap * 2 > r->len + n ? r->cap * 2 : r->len + n;
            char  *nb   = ddl_realloc(r->body, ncap + 1);
            if (nb == NULL) {
                answer_error(r, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory for the body");
                return MHD_YES;
            }
            r->body = nb;
            r->cap  = ncap;
        }
        memcpy(r->body + r->len, upload, n);
        r->len += n;
        return MHD_YES;
    }
    if (r->submitted) { // resumed: the answer is in
        return send_answer(r);
    }
    return run_request(r);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode why)
{
    (void)cls;
    (void)conn;
    (void)why;
    struct req *r = *con_cls;
    if (r == NULL || *con_cls == &oom_marker) {
        *con_cls = NULL;
        return;
    }
    unwatch(r); // answered already, so off the list; kept for a connection torn down
    ddld_call_release(r->call);
    free(r->out);
    ddl_free(r->body);
    pthread_mutex_destroy(&r->mu);
    ddl_free(r);
    *con_cls = NULL;
}

// ---- lifecycle ------------------------------------------------------------------------------

int ddld_http_check_config(const ddld_config *cfg, char *err, size_t errlen)
{
    return ddld_listen_check("--http-listen", cfg->http_listen, "--http-address-file",
                             cfg->http_address_file, err, errlen);
}

int ddld_http_start(const ddld_config *cfg)
{
    h.cfg            = cfg;
    const char *mode = getenv("DDLD_HTTP_JSON");
    h.tree_only      = mode != NULL && strcmp(mode, "tree") == 0;
    if (cfg->http_listen == NULL) {
        return 0;
    }
    const char *addr = cfg->http_listen;
    int         family, port;
    int         fd = ddld_listen_open("--http-listen", addr, &family, &port);
    if (fd < 0) {
        return -1;
    }
    const char *cert, *key, *ca;
    ddld_auth_tls_pem(ddld_auth_daemon(), &cert, &key, &ca);
    unsigned int flags =
        MHD_USE_AUTO_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (family == AF_INET6) {
        flags |= MHD_USE_IPv6;
    }
    if (cert != NULL) {
        flags |= MHD_USE_TLS;
    }
    h.mtls = cert != NULL && ca != NULL;
    // The TLS options come last and only with TLS (MHD refuses them without it).
    h.oom = MHD_create_response_from_buffer(sizeof oom_body - 1, (void *)oom_body,
                                            MHD_RESPMEM_PERSISTENT);
    if (h.oom != NULL) {
        MHD_add_response_header(h.oom, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    }
    h.mhd = MHD_start_daemon(
        flags, 0, NULL, NULL, on_request, NULL, MHD_OPTION_EXTERNAL_LOGGER, ddld_mhd_log, "http",
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL, MHD_OPTION_LISTEN_SOCKET, fd,
        MHD_OPTION_THREAD_POOL_SIZE, (unsigned int)2, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned int)1000, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)120,
        cert != NULL ? MHD_OPTION_HTTPS_MEM_CERT : MHD_OPTION_END, cert, MHD_OPTION_HTTPS_MEM_KEY,
        key, h.mtls ? MHD_OPTION_HTTPS_MEM_TRUST : MHD_OPTION_END, ca, MHD_OPTION_END);
    if (h.mhd == NULL) {
        ddld_log("--http-listen %s: libmicrohttpd did not start%s", addr,
                 cert != NULL ? " (TLS)" : "");
        close(fd);
        if (h.oom != NULL) {
            MHD_destroy_response(h.oom);
            h.oom = NULL;
        }
        return -1;
    }
    h.wstop = false;
    if (pthread_create(&h.wthread, NULL, watcher, NULL) == 0) {
        h.wstarted = true;
    } else {
        ddld_log("--http-listen: no thread to watch for clients that go away: their calls run "
                 "as if they stayed");
    }
    if (cfg->http_address_file != NULL &&
        ddld_write_address("--http-address-file", cfg->http_address_file, addr, port) != 0) {
        ddld_http_stop();
        return -1;
    }
    const char *colon = strrchr(addr, ':');
    ddld_log("KServe v2 over HTTP on %s://%.*s:%d/v2", cert != NULL ? "https" : "http",
             (int)(colon - addr), addr, port);
    return 0;
}

void ddld_http_attach(ddld_service *svc)
{
    atomic_store(&h.svc, svc);
}

void ddld_http_stop(void)
{
    if (h.mhd == NULL) {
        atomic_store(&h.svc, NULL);
        return;
    }
    // A suspended connection must be resumed before the daemon stops: every call submitted
    // has been answered by now (ddld_service_close fails the queued ones); wait for the
    // answers still being rendered, boundedly.
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;
    pthread_mutex_lock(&h.mu);
    while (h.outstanding > 0 && pthread_cond_timedwait(&h.cv, &h.mu, &until) == 0) {
    }
    int left = h.outstanding;
    pthread_mutex_unlock(&h.mu);
    if (left > 0) {
        ddld_log("http: %d call%s still unanswered at shutdown", left, left == 1 ? "" : "s");
    }
    if (h.wstarted) {
        pthread_mutex_lock(&h.wmu);
        h.wstop = true;
        pthread_mutex_unlock(&h.wmu);
        pthread_join(h.wthread, NULL);
        h.wstarted = false;
    }
    MHD_stop_daemon(h.mhd);
    h.mhd = NULL;
    if (h.oom != NULL) {
        MHD_destroy_response(h.oom);
        h.oom = NULL;
    }
    atomic_store(&h.svc, NULL);
}
