// bench-serve: LeNet-5 serving under concurrent batch-1 clients, with and without dynamic
// batching, over gRPC and over HTTP (KServe v2 REST), and the cost of serving during a
// Train (issue 17 §6). A benchmark, not a test: it prints figures and PASS/MISS against
// the targets, and fails only on errors.
//
//   bench-serve [--seconds D] [--clients 1,8,32,100] [--np 1,2] [--batching off,on]
//               [--train-steps K] [--train-rounds R] [--max-queue-delay-us U] [--queue N]
//               [--serve-share PCT] [--no-http] [--bind-to POLICY] [--specs DIR] [--data DIR]
//
// It starts one distdld per (np, batching) pair itself, under mpirun like bench-infer:
// `--model SPECS/lenet5-NP.json --queue N --dynamic-batching off|on --max-queue-delay-us U
// --serve-during-train on --serve-during-train-share PCT (default 5, the daemon's)
// --metrics-listen 127.0.0.1:0`, listening on 127.0.0.1 port 0 for
// gRPC and (without --no-http) `--http-listen 127.0.0.1:0 --http-address-file F` for HTTP.
// Per daemon:
//   full batch  one client, Predict of batch_size test images (UINT8), median of 20 after
//               3 warm-up: the execution time of one full batch E, measured through the
//               client;
//   Predict     C closed-loop clients (a thread each, with its own connection: gRPC
//               channels of their own, HTTP/1.1 keep-alive sockets), each calling with
//               the first Fashion-MNIST test image (UINT8 [1,1,28,28]) again as soon as
//               the last call returned, for D seconds after 0.5 s of warm-up, for every C
//               of --clients: calls/s, p50 and p99 of the OK calls, refusals
//               (RESOURCE_EXHAUSTED / HTTP 429: retried after 1-2 ms), errors. Every
//               answer's logits must equal, bit for bit, the reference Predict's of the
//               same image (inference is batch-invariant), else it is an error. rows/cmd:
//               the mean rows of the inference commands the daemon ran meanwhile (its
//               /metrics, distdl_inference_batch_rows), i.e. how many calls batching joined;
//               cpu us/call: the CPU time (user + system, every thread) of the daemon's
//               ranks (mpirun's children in /proc) over the phase, per OK call: what one
//               call costs the daemon, whatever share of the cores the generator took;
//   ceiling     the same load generator at the largest C calling GetStatus (gRPC) and
//               GET /v2/health/ready (HTTP): what the RPC layer answers without the engine.
// Targets, printed PASS or MISS per row: p99 <= U + 2 E (U = 0 with batching off, where no
// call waits for batch-mates), and at the largest C: Predict calls/s >= 50 % of the
// ceiling's calls/s on the same transport. In a closed loop the mean latency is C over the
// calls/s (Little's law), so at large C the p99 target is a throughput target as well.
// Train interleave (on the last daemon with batching on, np 2 by default; --train-steps 0
// skips it): R rounds (default 3) of a Train of K steps (default 200) over the daemon's
// default data alone, then the same Train while 8 closed-loop Predict clients run (their
// p50/p99 during it), and one more alone at the end, so drift shows: the median Train
// steps/s each way and the cost (target <= 10 %).
//
// HTTP (KServe v2 / Open Inference Protocol REST): POST /v2/models/NAME/infer with a JSON
// body of the image's 784 pixels (built once), NAME the spec's "name"; the reply's
// outputs[0].data floats are parsed with strtof (the daemon prints 9 significant digits,
// which round-trip an FP32 exactly). The client here is a minimal raw-socket HTTP/1.1 one
// (Content-Length or chunked bodies; reconnects when the server closed the connection).
//
// Exit status: 0 when every call behaved (MISS is a figure, not a failure), 1 on an error
// (any call failing other than by refusal, wrong logits, a daemon that did not start), 2
// usage, 7 when the Fashion-MNIST test images are missing.
//
// Every daemon starts before this process's first gRPC call (bench_util.h); those of later
// configurations wait idle meanwhile (a fraction of a percent of a core each,
// docs/SERVER.md).
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "bench_util.h"
#include "ddl_client.h"

#define SAMPLE (28 * 28) // LeNet-5's input, one channel of UINT8 pixels
#define MAX_CLASSES 64   // logits compared per answer, at most
#define MAX_BATCH 1024   // largest spec batch_size this bench loads images for
#define MAX_CLIENTS 1024 // --clients, at most
#define MAX_LIST 8       // entries of --clients / --np / --batching
#define TRAIN_CLIENTS 8  // Predict clients during the Train interleave
#define MAX_ROUNDS 16    // --train-rounds, at most
#define WARMUP_S 0.5     // closed loop before the figures are taken
#define EXEC_CALLS 20    // full-batch Predicts timed
#define HTTP_MAX_BODY (16 << 20)

static const char *data_dir = "/usr/share/datasets/fashion-mnist";
static uint8_t    *test_px; // the first test images, SAMPLE bytes each

// ---- small helpers ---------------------------------------------------------------------

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

// "1,8,32": up to MAX_LIST positive integers; the count, or -1.
static int parse_list(const char *s, int *out)
{
    int   n    = 0;
    char *copy = strdup(s), *save = NULL;
    for (char *t = strtok_r(copy, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save)) {
        char *end;
        long  v = strtol(t, &end, 10);
        if (n == MAX_LIST || *end != '\0' || v < 1 || v > MAX_CLIENTS) {
            free(copy);
            return -1;
        }
        out[n++] = (int)v;
    }
    free(copy);
    return n > 0 ? n : -1;
}

// The first n test images (n <= MAX_BATCH) into test_px; -1 when the file is missing.
static int load_images(int n)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/t10k-images-idx3-ubyte.gz", data_dir);
    gzFile  g = gzopen(path, "rb");
    uint8_t hdr[16];
    test_px = malloc((size_t)n * SAMPLE);
    int ok  = g != NULL && test_px != NULL && gzread(g, hdr, 16) == 16 &&
             gzread(g, test_px, (unsigned)(n * SAMPLE)) == n * SAMPLE;
    if (g != NULL) {
        gzclose(g);
    }
    return ok ? 0 : -1;
}

// Images [0, n) as a UINT8 tensor [n, 1, 28, 28] (borrowed data).
static ddl_client_tensor images(int n)
{
    return (ddl_client_tensor){.name  = "x",
                               .dtype = DDL_WIRE_UINT8,
                               .ndim  = 4,
                               .shape = {n, 1, 28, 28},
                               .data  = test_px,
                               .bytes = (size_t)n * SAMPLE};
}

// ---- a minimal HTTP/1.1 client ---------------------------------------------------------
// One request at a time per connection (no pipelining), so every response starts at the
// beginning of the buffer. The buffer stays NUL-terminated after the bytes received.

typedef struct http_target {
    struct sockaddr_storage sa;
    socklen_t               salen;
    char                    hostport[256]; // for the Host header
} http_target;

static http_target http_to;    // the daemon's KServe REST endpoint
static http_target metrics_to; // its /metrics endpoint

typedef struct http_conn {
    const http_target *to;
    int                fd; // -1: not connected
    char              *buf;
    size_t             cap, len;
    long               connects;
} http_conn;

typedef struct http_reply {
    int         status;
    const char *body; // NUL-terminated, valid until the next exchange on the connection
    size_t      body_len;
} http_reply;

// host:port (host numeric, [v6] allowed) into *to; -1 with a message.
static int http_resolve(const char *hostport, http_target *to)
{
    char host[256];
    snprintf(to->hostport, sizeof to->hostport, "%s", hostport);
    const char *colon = strrchr(hostport, ':');
    if (colon == NULL || colon == hostport || (size_t)(colon - hostport) >= sizeof host) {
        fprintf(stderr, "bench-serve: HTTP address \"%s\": expected host:port\n", hostport);
        return -1;
    }
    const char *h = hostport;
    size_t      n = (size_t)(colon - hostport);
    if (h[0] == '[' && n >= 2 && h[n - 1] == ']') {
        h++;
        n -= 2;
    }
    memcpy(host, h, n);
    host[n]                = '\0';
    struct addrinfo  hints = {.ai_family   = AF_UNSPEC,
                              .ai_socktype = SOCK_STREAM,
                              .ai_flags    = AI_NUMERICHOST | AI_NUMERICSERV};
    struct addrinfo *res   = NULL;
    int              rc    = getaddrinfo(host, colon + 1, &hints, &res);
    if (rc != 0) {
        fprintf(stderr, "bench-serve: HTTP address \"%s\": %s\n", hostport, gai_strerror(rc));
        return -1;
    }
    memcpy(&to->sa, res->ai_addr, res->ai_addrlen);
    to->salen = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

static void http_close(http_conn *h)
{
    if (h->fd >= 0) {
        close(h->fd);
        h->fd = -1;
    }
}

static int http_connect(http_conn *h, char *err, size_t errn)
{
    int fd = socket(h->to->sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errn, "socket: %s", strerror(errno));
        return -1;
    }
    int            one = 1;
    struct timeval tv  = {60, 0}; // no call should take a minute
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, (const struct sockaddr *)&h->to->sa, h->to->salen) != 0) {
        snprintf(err, errn, "connect %s: %s", h->to->hostport, strerror(errno));
        close(fd);
        return -1;
    }
    h->fd = fd;
    h->connects++;
    return 0;
}

static int http_send_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) {
            continue;
        }
        if (k <= 0) {
            return -1;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

// Reads more bytes: > 0 read, 0 at end of stream, -1 on an error (errno).
static ssize_t http_fill(http_conn *h)
{
    if (h->cap - h->len < 4097) {
        size_t cap = h->cap > 0 ? 2 * h->cap : 65536;
        char  *b   = cap <= 2 * (size_t)HTTP_MAX_BODY ? realloc(h->buf, cap) : NULL;
        if (b == NULL) {
            errno = EMSGSIZE;
            return -1;
        }
        h->buf = b;
        h->cap = cap;
    }
    ssize_t k;
    do {
        k = recv(h->fd, h->buf + h->len, h->cap - h->len - 1, 0);
    } while (k < 0 && errno == EINTR);
    if (k > 0) {
        h->len += (size_t)k;
        h->buf[h->len] = '\0';
    }
    return k;
}

// Fills until at least n bytes are buffered; -1 with a message.
static int http_need(http_conn *h, size_t n, char *err, size_t errn)
{
    while (h->len < n) {
        ssize_t k = http_fill(h);
        if (k <= 0) {
            snprintf(err, errn, "%s in the middle of a response",
                     k == 0 ? "connection closed" : strerror(errno));
            return -1;
        }
    }
    return 0;
}

// The offset of the next CRLF at or after `from`, filling as needed; -1 with a message.
static long http_crlf(http_conn *h, size_t from, char *err, size_t errn)
{
    for (;;) {
        char *p = from < h->len ? memmem(h->buf + from, h->len - from, "\r\n", 2) : NULL;
        if (p != NULL) {
            return p - h->buf;
        }
        if (h->len > 65536 || http_need(h, h->len + 1, err, errn) != 0) {
            if (h->len > 65536) {
                snprintf(err, errn, "a header or chunk line longer than 64 KiB");
            }
            return -1;
        }
    }
}

// Whether the header value [v, eol) contains `word` (lower case), ignoring case.
static bool header_has(const char *v, const char *eol, const char *word)
{
    char   low[128];
    size_t n = (size_t)(eol - v) < sizeof low - 1 ? (size_t)(eol - v) : sizeof low - 1;
    for (size_t i = 0; i < n; i++) {
        low[i] = (char)((v[i] >= 'A' && v[i] <= 'Z') ? v[i] + 32 : v[i]);
    }
    low[n] = '\0';
    return strstr(low, word) != NULL;
}

// One response: 0; -2 when the connection ended before its first byte (a keep-alive
// connection the server closed: the caller may retry on a new one); -1 with a message.
static int http_read_response(http_conn *h, http_reply *r, char *err, size_t errn)
{
    h->len = 0;
    char *eoh;
    for (;;) {
        eoh = h->len > 0 ? memmem(h->buf, h->len, "\r\n\r\n", 4) : NULL;
        if (eoh != NULL) {
            break;
        }
        ssize_t k = h->len > 65536 ? (errno = EMSGSIZE, -1) : http_fill(h);
        if (k == 0 && h->len == 0) {
            return -2;
        }
        if (k <= 0) {
            snprintf(err, errn, "reading the response head: %s",
                     k == 0 ? "connection closed" : strerror(errno));
            return -1;
        }
    }
    size_t hdr_end = (size_t)(eoh - h->buf) + 4;
    int    major = 0, minor = 0, status = 0;
    if (sscanf(h->buf, "HTTP/%d.%d %d", &major, &minor, &status) != 3) {
        snprintf(err, errn, "not an HTTP response: \"%.40s\"", h->buf);
        return -1;
    }
    long long clen    = -1;
    bool      chunked = false, closing = major == 1 && minor == 0;
    for (char *line = strstr(h->buf, "\r\n") + 2; line < h->buf + hdr_end - 2;) {
        char *eol = strstr(line, "\r\n");
        if (strncasecmp(line, "content-length:", 15) == 0) {
            clen = strtoll(line + 15, NULL, 10);
        } else if (strncasecmp(line, "transfer-encoding:", 18) == 0) {
            chunked = header_has(line + 18, eol, "chunked");
        } else if (strncasecmp(line, "connection:", 11) == 0) {
            closing = header_has(line + 11, eol, "close") ||
                      (closing && !header_has(line + 11, eol, "keep-alive"));
        }
        line = eol + 2;
    }
    size_t end;
    if (chunked) {
        // Each chunk's data is moved down over the size lines before it.
        size_t rd = hdr_end, wr = hdr_end;
        for (;;) {
            long eol = http_crlf(h, rd, err, errn);
            if (eol < 0) {
                return -1;
            }
            unsigned long long sz   = strtoull(h->buf + rd, NULL, 16);
            size_t             data = (size_t)eol + 2;
            if (sz == 0) {
                for (size_t t = data;;) { // trailer lines up to an empty one
                    long e = http_crlf(h, t, err, errn);
                    if (e < 0) {
                        return -1;
                    }
                    if ((size_t)e == t) {
                        break;
                    }
                    t = (size_t)e + 2;
                }
                break;
            }
            if (sz > HTTP_MAX_BODY || wr - hdr_end + sz > HTTP_MAX_BODY) {
                snprintf(err, errn, "a response body over %d bytes", HTTP_MAX_BODY);
                return -1;
            }
            if (http_need(h, data + sz + 2, err, errn) != 0) {
                return -1;
            }
            memmove(h->buf + wr, h->buf + data, sz);
            wr += sz;
            rd = data + sz + 2;
        }
        end = wr;
    } else if (clen >= 0) {
        if (clen > HTTP_MAX_BODY) {
            snprintf(err, errn, "Content-Length %lld over %d", clen, HTTP_MAX_BODY);
            return -1;
        }
        if (http_need(h, hdr_end + (size_t)clen, err, errn) != 0) {
            return -1;
        }
        end = hdr_end + (size_t)clen;
    } else if (status / 100 == 1 || status == 204 || status == 304) {
        end = hdr_end;
    } else { // no length: the body ends with the connection
        ssize_t k;
        while ((k = http_fill(h)) > 0) {
        }
        if (k < 0) {
            snprintf(err, errn, "reading a body without a length: %s", strerror(errno));
            return -1;
        }
        end     = h->len;
        closing = true;
    }
    h->buf[end] = '\0';
    r->status   = status;
    r->body     = h->buf + hdr_end;
    r->body_len = end - hdr_end;
    if (closing) {
        http_close(h); // the body stays in the buffer
    }
    return 0;
}

// Sends req and reads its response, connecting first when not connected; a connection the
// server had closed while idle is replaced once. 0, or -1 with a message.
static int http_exchange(http_conn *h, const char *req, size_t n, http_reply *r, char *err,
                         size_t errn)
{
    for (int attempt = 0;; attempt++) {
        bool reused = h->fd >= 0;
        if (!reused && http_connect(h, err, errn) != 0) {
            return -1;
        }
        int rc = -2;
        if (http_send_all(h->fd, req, n) != 0) {
            snprintf(err, errn, "send: %s", strerror(errno));
        } else {
            rc = http_read_response(h, r, err, errn);
            if (rc == -2) {
                snprintf(err, errn, "the server closed the connection without a response");
            }
        }
        if (rc == 0) {
            return 0;
        }
        http_close(h);
        if (rc != -2 || !reused || attempt > 0) {
            return -1;
        }
    }
}

// The first n floats of outputs[0].data in a KServe v2 infer response; -1 when absent.
static int parse_logits(const char *body, float *y, int n)
{
    const char *p = strstr(body, "\"outputs\"");
    p             = p != NULL ? strstr(p, "\"data\"") : NULL;
    p             = p != NULL ? strchr(p, '[') : NULL;
    if (p == NULL) {
        return -1;
    }
    p++;
    for (int i = 0; i < n; i++) {
        char *end;
        y[i] = strtof(p, &end);
        if (end == p) {
            return -1;
        }
        p = end + strspn(end, " \t\r\n");
        if (*p != (i + 1 < n ? ',' : ']')) {
            return -1;
        }
        p++;
    }
    return 0;
}

// ---- the load generator ------------------------------------------------------------------

enum { OP_PREDICT, OP_STATUS, OP_INFER, OP_READY, OP_N };
static const char *op_transport[OP_N] = {"grpc", "grpc", "http", "http"};
static const char *op_call[OP_N]      = {"Predict", "GetStatus", "infer", "health/ready"};

// What every worker of the current phase reads (set before the threads start).
static struct {
    int        op;
    bool       check;            // compare logits with ref
    float      ref[MAX_CLASSES]; // the reference logits of image 0
    int        classes;
    char      *infer_req, *ready_req; // whole HTTP requests, built once per daemon
    size_t     infer_len, ready_len;
    atomic_int recording, stop;
    pid_t      daemon; // mpirun of the daemon under load: its ranks' CPU is read per phase
} ph;

typedef struct worker {
    pthread_t     thread;
    ddl_client_t *c; // a gRPC channel of its own
    http_conn     h;
    double       *lat; // seconds of the OK calls that ended while recording
    size_t        nlat, cap;
    uint64_t      refused, errors, rng;
    char          first_error[768];
} worker;

typedef struct result {
    double   calls_s, p50, p99; // p50/p99 in seconds
    double   cpu_us;            // the daemon's CPU (every rank, user + system) per call, or -1
    uint64_t calls, refused, errors;
    long     connects; // HTTP connections opened during the phase
    char     first_error[768];
} result;

static uint64_t next_rand(uint64_t *s)
{
    *s ^= *s >> 12; // xorshift64*
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

static void note(worker *w, const char *what, const char *msg)
{
    if (w->first_error[0] == '\0') {
        snprintf(w->first_error, sizeof w->first_error, "%s: %s", what, msg);
    }
}

// One call: 0 OK, 1 refused (RESOURCE_EXHAUSTED, HTTP 429), -1 an error (noted).
static int call_once(worker *w, int op)
{
    char       err[512];
    http_reply r;
    switch (op) {
    case OP_PREDICT: {
        ddl_client_tensor x = images(1), y = {0};
        int               rc = 0;
        if (ddl_client_predict(w->c, &x, &y) != DDL_OK) {
            rc = ddl_client_last_code() == DDL_RPC_RESOURCE_EXHAUSTED ? 1 : -1;
            if (rc < 0) {
                note(w, "Predict", ddl_last_error());
            }
        } else if (ph.check &&
                   (y.dtype != DDL_WIRE_FP32 || y.bytes != sizeof(float) * (size_t)ph.classes ||
                    memcmp(y.data, ph.ref, y.bytes) != 0)) {
            note(w, "Predict", "the logits differ from the reference Predict's");
            rc = -1;
        }
        ddl_client_tensor_release(&y);
        return rc;
    }
    case OP_STATUS: {
        ddl_client_status_info s;
        if (ddl_client_get_status(w->c, &s) != DDL_OK) {
            if (ddl_client_last_code() == DDL_RPC_RESOURCE_EXHAUSTED) {
                return 1;
            }
            note(w, "GetStatus", ddl_last_error());
            return -1;
        }
        if (!s.has_model) {
            note(w, "GetStatus", "no model");
            return -1;
        }
        return 0;
    }
    case OP_INFER:
    case OP_READY: {
        const char *req = op == OP_INFER ? ph.infer_req : ph.ready_req;
        size_t      n   = op == OP_INFER ? ph.infer_len : ph.ready_len;
        if (http_exchange(&w->h, req, n, &r, err, sizeof err) != 0) {
            note(w, op_call[op], err);
            return -1;
        }
        if (r.status == 429) {
            return 1;
        }
        if (r.status != 200) {
            snprintf(err, sizeof err, "HTTP %d: %.300s", r.status, r.body);
            note(w, op_call[op], err);
            return -1;
        }
        float y[MAX_CLASSES];
        if (op == OP_INFER && parse_logits(r.body, y, ph.classes) != 0) {
            snprintf(err, sizeof err, "no %d logits in outputs[0].data: %.300s", ph.classes,
                     r.body);
            note(w, op_call[op], err);
            return -1;
        }
        if (op == OP_INFER && ph.check &&
            memcmp(y, ph.ref, sizeof(float) * (size_t)ph.classes) != 0) {
            note(w, op_call[op], "the logits differ from the gRPC Predict's");
            return -1;
        }
        return 0;
    }
    default:
        return -1;
    }
}

// A closed loop until ph.stop: the next call as soon as the last returned. A call's latency
// counts when it ends while ph.recording is set (so calls/s over the window is unbiased).
static void *worker_main(void *arg)
{
    worker *w = arg;
    while (!atomic_load(&ph.stop)) {
        double t0 = bench_now();
        int    rc = call_once(w, ph.op);
        double dt = bench_now() - t0;
        if (rc == 0 && atomic_load(&ph.recording)) {
            if (w->nlat == w->cap) {
                size_t  cap = w->cap > 0 ? 2 * w->cap : 4096;
                double *l   = realloc(w->lat, cap * sizeof *l);
                if (l == NULL) {
                    note(w, "bench-serve", "out of memory for latencies");
                    w->errors++;
                    break;
                }
                w->lat = l;
                w->cap = cap;
            }
            w->lat[w->nlat++] = dt;
        } else if (rc == 1) {
            w->refused++;
            sleep_s(1e-3 + (double)(next_rand(&w->rng) % 1000) * 1e-6);
        } else if (rc < 0) {
            w->errors++;
            sleep_s(0.01); // a dead daemon must not become a spin
        }
    }
    return NULL;
}

// `n` workers of pool run op for WARMUP_S, then with recording on for `seconds` (or, with
// `during` set, for as long as during(ud) runs; its return value into *during_rc).
static int run_phase(worker *pool, int n, int op, bool check, double seconds, int (*during)(void *),
                     void *ud, int *during_rc, result *out)
{
    ph.op    = op;
    ph.check = check;
    atomic_store(&ph.stop, 0);
    atomic_store(&ph.recording, 0);
    long connects0 = 0;
    for (int i = 0; i < n; i++) {
        pool[i].nlat           = 0;
        pool[i].refused        = 0;
        pool[i].errors         = 0;
        pool[i].first_error[0] = '\0';
        connects0 += pool[i].h.connects;
    }
    int started = 0;
    for (; started < n; started++) {
        if (pthread_create(&pool[started].thread, NULL, worker_main, &pool[started]) != 0) {
            fprintf(stderr, "bench-serve: cannot start client thread %d\n", started);
            break;
        }
    }
    double t0 = 0, t1 = 0, cpu0 = -1, cpu1 = -1;
    if (started == n) {
        sleep_s(WARMUP_S);
        atomic_store(&ph.recording, 1);
        t0   = bench_now();
        cpu0 = ph.daemon > 0 ? bench_tree_cpu_s(ph.daemon, 0) : -1;
        if (during != NULL) {
            *during_rc = during(ud);
        } else {
            sleep_s(seconds);
        }
        cpu1 = ph.daemon > 0 ? bench_tree_cpu_s(ph.daemon, 0) : -1;
        t1   = bench_now();
        atomic_store(&ph.recording, 0);
    }
    atomic_store(&ph.stop, 1);
    for (int i = 0; i < started; i++) {
        pthread_join(pool[i].thread, NULL);
    }
    if (started < n) {
        return -1;
    }
    *out         = (result){0};
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        total += pool[i].nlat;
        out->refused += pool[i].refused;
        out->errors += pool[i].errors;
        out->connects += pool[i].h.connects;
        if (out->first_error[0] == '\0' && pool[i].first_error[0] != '\0') {
            snprintf(out->first_error, sizeof out->first_error, "%s", pool[i].first_error);
        }
    }
    out->connects -= connects0;
    out->calls   = total;
    out->calls_s = (double)total / (t1 - t0);
    out->cpu_us  = cpu0 >= 0 && cpu1 >= 0 && total > 0 ? (cpu1 - cpu0) / (double)total * 1e6 : -1;
    double *all  = malloc((total > 0 ? total : 1) * sizeof *all);
    if (all == NULL) {
        return -1;
    }
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        if (pool[i].nlat > 0) {
            memcpy(all + k, pool[i].lat, pool[i].nlat * sizeof *all);
        }
        k += pool[i].nlat;
    }
    out->p50 = total > 0 ? bench_quantile(all, (int)total, 0.5) : 0;
    out->p99 = total > 0 ? bench_quantile(all, (int)total, 0.99) : 0;
    free(all);
    return 0;
}

// ---- one daemon ------------------------------------------------------------------------

typedef struct config {
    int          np;
    bool         batching;
    char         dir[PATH_MAX];          // its logs and address files
    char         http_file[PATH_MAX];    // --http-address-file
    char         metrics_file[PATH_MAX]; // --metrics-address-file
    char         model[128];             // the spec's name
    bench_daemon d;
} config;

typedef struct options {
    double      seconds;
    int         clients[MAX_LIST], nclients;
    int         top_clients; // the largest of clients: the ceiling's load
    int         max_clients; // connections opened (the Train interleave needs TRAIN_CLIENTS)
    int         train_steps, train_rounds;
    int         delay_us, queue;
    int         share; // --serve-during-train-share
    bool        http;
    const char *bind_to;
} options;

static int g_errors; // calls that failed, wrong answers, failed measurements

// The first line of an address file, waiting up to 30 s for it; -1 with a message.
static int read_address(const char *path, const char *what, char *addr, size_t n)
{
    addr[0] = '\0';
    for (int i = 0; i < 300 && addr[0] == '\0'; i++) { // written once the daemon serves
        FILE *f = fopen(path, "r");
        if (f != NULL) {
            if (fgets(addr, (int)n, f) == NULL) {
                addr[0] = '\0';
            }
            fclose(f);
            addr[strcspn(addr, "\r\n")] = '\0';
        }
        if (addr[0] == '\0') {
            sleep_s(0.1);
        }
    }
    if (addr[0] == '\0') {
        fprintf(stderr, "bench-serve: no %s address in %s after 30 s\n", what, path);
        return -1;
    }
    return 0;
}

// The dynamic-batching counters of the daemon's /metrics (docs/METRICS.md).
typedef struct batch_counts {
    double rows, commands, interleaved; // distdl_inference_batch_rows_sum, _count, and
                                        // distdl_inference_interleaved_total
    bool ok;
} batch_counts;

static batch_counts scrape_batches(void)
{
    batch_counts b = {0};
    if (metrics_to.salen == 0) {
        return b;
    }
    char req[512], err[512];
    snprintf(req, sizeof req, "GET /metrics HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n",
             metrics_to.hostport);
    http_conn  h = {.to = &metrics_to, .fd = -1};
    http_reply r;
    if (http_exchange(&h, req, strlen(req), &r, err, sizeof err) == 0 && r.status == 200) {
        const char *names[3] = {"\ndistdl_inference_batch_rows_sum ",
                                "\ndistdl_inference_batch_rows_count ",
                                "\ndistdl_inference_interleaved_total "};
        double     *vals[3]  = {&b.rows, &b.commands, &b.interleaved};
        b.ok                 = true;
        for (int i = 0; i < 3; i++) {
            const char *p = strstr(r.body, names[i]);
            b.ok          = b.ok && p != NULL;
            *vals[i]      = p != NULL ? strtod(p + strlen(names[i]), NULL) : 0;
        }
    }
    http_close(&h);
    free(h.buf);
    return b;
}

// "rows/cmd" over a phase: the mean rows of the inference commands run between a and b.
static void print_rows_per_command(batch_counts a, batch_counts b)
{
    if (a.ok && b.ok && b.commands > a.commands) {
        printf(" %8.1f", (b.rows - a.rows) / (b.commands - a.commands));
    } else {
        printf(" %8s", "-");
    }
}

static void print_row_header(void)
{
    printf("transport call          np batching clients    calls/s    p50 ms    p99 ms  refused "
           " errors rows/cmd cpu us/call  target\n");
}

// One row; bound_s > 0: the p99 target it is held to; a, b: the batching counters before
// and after it.
static void print_row(int op, const config *cf, int clients, const result *r, double bound_s,
                      batch_counts a, batch_counts b)
{
    printf("%-9s %-13s %2d %-8s %7d %10.0f %9.3f %9.3f %8llu %7llu", op_transport[op], op_call[op],
           cf->np, cf->batching ? "on" : "off", clients, r->calls_s, r->p50 * 1e3, r->p99 * 1e3,
           (unsigned long long)r->refused, (unsigned long long)r->errors);
    print_rows_per_command(a, b);
    if (r->cpu_us >= 0) {
        printf(" %11.1f", r->cpu_us);
    } else {
        printf(" %11s", "-");
    }
    if (bound_s > 0) {
        printf("  p99<=%.3f %s", bound_s * 1e3,
               r->calls > 0 && r->p99 <= bound_s ? "PASS" : "MISS");
    }
    if (op >= OP_INFER && r->connects > clients) {
        printf("  (%ld connections opened)", r->connects);
    }
    printf("\n");
    if (r->errors > 0) {
        printf("    first error: %s\n", r->first_error);
        g_errors++;
    }
    fflush(stdout);
}

// Reads cf's HTTP address and builds the two requests (the infer body once); -1 with a
// message.
static int http_setup(const config *cf)
{
    char addr[256];
    if (read_address(cf->http_file, "HTTP", addr, sizeof addr) != 0 ||
        http_resolve(addr, &http_to) != 0) {
        return -1;
    }
    size_t cap  = (size_t)SAMPLE * 4 + 256;
    char  *body = malloc(cap);
    if (body == NULL) {
        return -1;
    }
    int n = snprintf(body, cap,
                     "{\"inputs\":[{\"name\":\"input\",\"shape\":[1,1,28,28],\"datatype\":"
                     "\"UINT8\",\"data\":[");
    for (int i = 0; i < SAMPLE; i++) {
        n += snprintf(body + n, cap - (size_t)n, "%s%u", i > 0 ? "," : "", test_px[i]);
    }
    n += snprintf(body + n, cap - (size_t)n, "]}]}");
    free(ph.infer_req);
    free(ph.ready_req);
    int a = asprintf(&ph.infer_req,
                     "POST /v2/models/%s/infer HTTP/1.1\r\nHost: %s\r\nContent-Type: "
                     "application/json\r\nContent-Length: %d\r\n\r\n%s",
                     cf->model, addr, n, body);
    int b = asprintf(&ph.ready_req, "GET /v2/health/ready HTTP/1.1\r\nHost: %s\r\n\r\n", addr);
    free(body);
    if (a < 0 || b < 0) {
        return -1;
    }
    ph.infer_len = (size_t)a;
    ph.ready_len = (size_t)b;
    printf("HTTP on %s: POST /v2/models/%s/infer (%d-byte JSON body), GET /v2/health/ready\n", addr,
           cf->model, n);
    return 0;
}

// The first HTTP infer answer against the gRPC reference: parsed, and equal bit for bit.
static int http_first_check(const config *cf)
{
    http_conn  h = {.to = &http_to, .fd = -1};
    http_reply r;
    char       err[512];
    int        rc = -1;
    float      y[MAX_CLASSES];
    if (http_exchange(&h, ph.infer_req, ph.infer_len, &r, err, sizeof err) != 0) {
        fprintf(stderr, "bench-serve: np %d: first HTTP infer: %s\n", cf->np, err);
    } else if (r.status != 200) {
        fprintf(stderr, "bench-serve: np %d: first HTTP infer: HTTP %d: %.300s\n", cf->np, r.status,
                r.body);
    } else if (parse_logits(r.body, y, ph.classes) != 0) {
        fprintf(stderr, "bench-serve: np %d: first HTTP infer: no %d logits in: %.300s\n", cf->np,
                ph.classes, r.body);
    } else if (memcmp(y, ph.ref, sizeof(float) * (size_t)ph.classes) != 0) {
        fprintf(stderr,
                "bench-serve: np %d: first HTTP infer: logits differ from gRPC Predict's "
                "(logit 0: %.9g against %.9g)\n",
                cf->np, (double)y[0], (double)ph.ref[0]);
    } else {
        printf("first HTTP infer: %d logits parsed, equal bit for bit to gRPC Predict's\n",
               ph.classes);
        rc = 0;
    }
    http_close(&h);
    free(h.buf);
    return rc;
}

typedef struct train_run {
    ddl_client_t *c;
    int           steps;
    double        seconds;
} train_run;

static int train_once(void *ud)
{
    train_run               *t    = ud;
    ddl_client_train_request tr   = {.steps = t->steps, .progress_every = t->steps};
    ddl_client_progress      last = {0};
    double                   t0   = bench_now();
    ddl_status               st   = ddl_client_train(t->c, &tr, NULL, NULL, &last);
    t->seconds                    = bench_now() - t0;
    if (st != DDL_OK || !last.finished) {
        fprintf(stderr, "bench-serve: Train of %d steps: %s\n", t->steps,
                st != DDL_OK ? ddl_last_error() : "the stream ended before the last step");
        return -1;
    }
    return 0;
}

// The median of v[0..n) (sorts v; the mean of the middle two when n is even).
static double median(double *v, int n)
{
    bench_quantile(v, n, 0.5); // sorts
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Rounds of a Train alone then the same Train with TRAIN_CLIENTS Predict clients, and one
// more alone at the end: medians of each, so the host's drift shows and mostly cancels.
static int train_interleave(const config *cf, const options *o, ddl_client_t *c, worker *pool)
{
    printf("\ntrain interleave: np %d, batching on, serve-during-train on, share %d %%: %d rounds "
           "of a Train of %d steps alone, then with %d closed-loop Predict clients; a last one "
           "alone; %s\n",
           cf->np, o->share, o->train_rounds, o->train_steps, TRAIN_CLIENTS, bench_load_average());
    double    alone[MAX_ROUNDS + 1], with[MAX_ROUNDS], p50[MAX_ROUNDS], p99[MAX_ROUNDS];
    double    calls[MAX_ROUNDS];
    train_run warm = {c, 10, 0};
    if (train_once(&warm) != 0) {
        return -1;
    }
    for (int k = 0; k <= o->train_rounds; k++) {
        train_run t = {c, o->train_steps, 0};
        if (train_once(&t) != 0) {
            return -1;
        }
        alone[k] = t.steps / t.seconds;
        printf("  round %d  alone           %8.1f steps/s  (%.2f s)\n", k + 1, alone[k], t.seconds);
        fflush(stdout);
        if (k == o->train_rounds) {
            break;
        }
        result       r;
        int          trc = -1;
        batch_counts a   = scrape_batches();
        if (run_phase(pool, TRAIN_CLIENTS, OP_PREDICT, false, 0, train_once, &t, &trc, &r) != 0 ||
            trc != 0) {
            return -1;
        }
        batch_counts b = scrape_batches();
        with[k]        = t.steps / t.seconds;
        p50[k]         = r.p50;
        p99[k]         = r.p99;
        calls[k]       = r.calls_s;
        printf("  round %d  with %d clients  %8.1f steps/s  (%.2f s); Predicts during it: %.0f "
               "calls/s, p50 %.3f ms, p99 %.3f ms, %llu refused, %llu errors",
               k + 1, TRAIN_CLIENTS, with[k], t.seconds, r.calls_s, r.p50 * 1e3, r.p99 * 1e3,
               (unsigned long long)r.refused, (unsigned long long)r.errors);
        if (a.ok && b.ok) {
            printf("; %.0f commands at step boundaries, %.1f rows/cmd overall",
                   b.interleaved - a.interleaved,
                   b.commands > a.commands ? (b.rows - a.rows) / (b.commands - a.commands) : 0);
        }
        printf("\n");
        if (r.errors > 0) {
            printf("    first error: %s\n", r.first_error);
            g_errors++;
        }
        fflush(stdout);
    }
    int    n     = o->train_rounds;
    double first = alone[0], last = alone[n];
    double ma = median(alone, n + 1), mw = median(with, n), cost = 1 - mw / ma;
    printf("  median: alone %.1f steps/s (%d runs; first %.1f, last %.1f: drift %+.1f%%), with "
           "%d clients %.1f steps/s (%d runs)\n",
           ma, n + 1, first, last, 100 * (last - first) / first, TRAIN_CLIENTS, mw, n);
    printf("  Predicts during the Trains (medians over rounds): %.0f calls/s, p50 %.3f ms, p99 "
           "%.3f ms\n",
           median(calls, n), median(p50, n) * 1e3, median(p99, n) * 1e3);
    printf("  cost of serving %d clients during a Train: %.1f%% of its steps/s (target <= 10%%): "
           "%s\n",
           TRAIN_CLIENTS, 100 * cost, cost <= 0.10 ? "PASS" : "MISS");
    return 0;
}

// Everything measured on one daemon. -1 when a measurement could not be made.
static int run_config(config *cf, const options *o, bool train)
{
    ddl_client_options co = ddl_client_options_default();
    co.own_connection     = 1;
    co.call_timeout_s     = 0; // Train is a stream; unary calls end well before a minute
    ddl_client_t *c       = NULL;
    worker       *pool    = NULL;
    int           rc      = -1;
    ph.daemon             = cf->d.pid;
    if (ddl_client_connect(cf->d.address, &co, &c) != DDL_OK) {
        fprintf(stderr, "bench-serve: connect %s: %s\n", cf->d.address, ddl_last_error());
        return -1;
    }
    ddl_client_status_info s = {0};
    if (ddl_client_get_status(c, &s) != DDL_OK || !s.has_model) {
        fprintf(stderr, "bench-serve: np %d: GetStatus: %s\n", cf->np,
                s.has_model ? ddl_last_error() : "no model");
        goto done;
    }
    if (s.batch_size < 1 || s.batch_size > MAX_BATCH || s.num_classes < 1 ||
        s.num_classes > MAX_CLASSES) {
        fprintf(stderr, "bench-serve: np %d: batch_size %lld, %d classes: outside this bench\n",
                cf->np, (long long)s.batch_size, s.num_classes);
        goto done;
    }
    ph.classes = s.num_classes;
    // The reference logits of image 0.
    ddl_client_tensor x = images(1), y = {0};
    if (ddl_client_predict(c, &x, &y) != DDL_OK || y.dtype != DDL_WIRE_FP32 ||
        y.bytes != sizeof(float) * (size_t)s.num_classes) {
        fprintf(stderr, "bench-serve: np %d: reference Predict: %s\n", cf->np, ddl_last_error());
        ddl_client_tensor_release(&y);
        goto done;
    }
    memcpy(ph.ref, y.data, y.bytes);
    ddl_client_tensor_release(&y);
    // One full batch, alone.
    double t[EXEC_CALLS];
    for (int i = -3; i < EXEC_CALLS; i++) {
        ddl_client_tensor xb = images((int)s.batch_size), yb = {0};
        double            t0 = bench_now();
        ddl_status        st = ddl_client_predict(c, &xb, &yb);
        double            dt = bench_now() - t0;
        ddl_client_tensor_release(&yb);
        if (st != DDL_OK) {
            fprintf(stderr, "bench-serve: np %d: full-batch Predict: %s\n", cf->np,
                    ddl_last_error());
            goto done;
        }
        if (i >= 0) {
            t[i] = dt;
        }
    }
    double exec  = bench_quantile(t, EXEC_CALLS, 0.5);
    double delay = cf->batching ? o->delay_us * 1e-6 : 0;
    double bound = delay + 2 * exec;
    printf("\n== np %d, dynamic batching %s (model %s, %d rank%s; %s)\n", cf->np,
           cf->batching ? "on" : "off", s.model_name, s.world_size, s.world_size > 1 ? "s" : "",
           bench_load_average());
    printf("full batch: Predict of %lld images %.3f ms (median of %d, through the client); "
           "--max-queue-delay-us %d%s; p99 target %.3f ms = %.3f + 2 x %.3f\n",
           (long long)s.batch_size, exec * 1e3, EXEC_CALLS, o->delay_us,
           cf->batching ? "" : " (not applied: batching off)", bound * 1e3, delay * 1e3,
           exec * 1e3);
    char maddr[256];
    memset(&metrics_to, 0, sizeof metrics_to);
    if (read_address(cf->metrics_file, "metrics", maddr, sizeof maddr) != 0 ||
        http_resolve(maddr, &metrics_to) != 0) {
        memset(&metrics_to, 0, sizeof metrics_to); // rows/cmd then shows "-"
    }
    // A failed HTTP set-up or first answer is an error; the gRPC rows are still measured.
    bool http = o->http;
    if (http && strcmp(cf->model, s.model_name) != 0) {
        printf("note: the spec names the model \"%s\", GetStatus \"%s\"; HTTP uses the spec's\n",
               cf->model, s.model_name);
    }
    if (http && (http_setup(cf) != 0 || http_first_check(cf) != 0)) {
        fprintf(stderr, "bench-serve: np %d, batching %s: no HTTP rows\n", cf->np,
                cf->batching ? "on" : "off");
        g_errors++;
        http = false;
    }
    pool = calloc((size_t)o->max_clients, sizeof *pool);
    if (pool == NULL) {
        goto done;
    }
    for (int i = 0; i < o->max_clients; i++) {
        pool[i].h.to = &http_to;
        pool[i].h.fd = -1;
        pool[i].rng  = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
        if (ddl_client_connect(cf->d.address, &co, &pool[i].c) != DDL_OK) {
            fprintf(stderr, "bench-serve: client %d: connect: %s\n", i, ddl_last_error());
            goto done;
        }
    }
    fflush(stdout);
    print_row_header();
    for (int tr = 0; tr < (http ? 2 : 1); tr++) {
        int    predict = tr == 0 ? OP_PREDICT : OP_INFER, ceiling = tr == 0 ? OP_STATUS : OP_READY;
        result top = {0}, cr;
        for (int k = 0; k < o->nclients; k++) {
            result       r;
            batch_counts a = scrape_batches();
            if (run_phase(pool, o->clients[k], predict, true, o->seconds, NULL, NULL, NULL, &r)) {
                goto done;
            }
            batch_counts b = scrape_batches();
            if (o->clients[k] == o->top_clients) {
                top = r;
            }
            print_row(predict, cf, o->clients[k], &r, bound, a, b);
        }
        if (run_phase(pool, o->top_clients, ceiling, false, o->seconds, NULL, NULL, NULL, &cr)) {
            goto done;
        }
        print_row(ceiling, cf, o->top_clients, &cr, 0, (batch_counts){0}, (batch_counts){0});
        printf("%-9s %s calls/s at %d clients / %s calls/s at %d clients: %.0f / %.0f = %.0f%% "
               "(target >= 50%%): %s\n",
               op_transport[predict], op_call[predict], o->top_clients, op_call[ceiling],
               o->top_clients, top.calls_s, cr.calls_s,
               cr.calls_s > 0 ? 100 * top.calls_s / cr.calls_s : 0,
               cr.calls_s > 0 && top.calls_s >= 0.5 * cr.calls_s ? "PASS" : "MISS");
        fflush(stdout);
    }
    rc = 0;
    if (train && o->train_steps > 0) {
        rc = train_interleave(cf, o, c, pool);
    }
done:
    for (int i = 0; pool != NULL && i < o->max_clients; i++) {
        ddl_client_destroy(&pool[i].c);
        http_close(&pool[i].h);
        free(pool[i].h.buf);
        free(pool[i].lat);
    }
    free(pool);
    ddl_client_destroy(&c);
    return rc;
}

// The spec's "name" into out; -1 with a message.
static int spec_name(const char *path, char *out, size_t n)
{
    json_error_t je;
    json_t      *j = json_load_file(path, 0, &je);
    const char  *s = j != NULL ? json_string_value(json_object_get(j, "name")) : NULL;
    if (s == NULL) {
        fprintf(stderr, "bench-serve: %s: %s\n", path, j == NULL ? je.text : "no \"name\"");
        json_decref(j);
        return -1;
    }
    snprintf(out, n, "%s", s);
    json_decref(j);
    return 0;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: bench-serve [--seconds D] [--clients 1,8,32,100] [--np 1,2] "
            "[--batching off,on] [--train-steps K] [--train-rounds R] [--max-queue-delay-us U] "
            "[--queue N] [--serve-share PCT] [--no-http] [--bind-to POLICY] [--specs DIR] "
            "[--data DIR]\n");
}

int main(int argc, char **argv)
{
    options     o             = {.seconds      = 5,
                                 .clients      = {1, 8, 32, 100},
                                 .nclients     = 4,
                                 .train_steps  = 200,
                                 .train_rounds = 3,
                                 .delay_us     = 200,
                                 .queue        = 1024,
                                 .share        = 5,
                                 .http         = true};
    int         nps[MAX_LIST] = {1, 2}, nnp = 2;
    bool        batching[2] = {false, true};
    int         nbatching   = 2;
    const char *specs       = DDL_SOURCE_DIR "/deploy/specs";
    enum {
        O_SECONDS = 256,
        O_CLIENTS,
        O_NP,
        O_BATCHING,
        O_STEPS,
        O_ROUNDS,
        O_DELAY,
        O_QUEUE,
        O_SHARE,
        O_NOHTTP,
        O_BIND,
        O_SPECS,
        O_DATA
    };
    static const struct option longs[] = {{"seconds", required_argument, 0, O_SECONDS},
                                          {"clients", required_argument, 0, O_CLIENTS},
                                          {"np", required_argument, 0, O_NP},
                                          {"batching", required_argument, 0, O_BATCHING},
                                          {"train-steps", required_argument, 0, O_STEPS},
                                          {"train-rounds", required_argument, 0, O_ROUNDS},
                                          {"max-queue-delay-us", required_argument, 0, O_DELAY},
                                          {"queue", required_argument, 0, O_QUEUE},
                                          {"serve-share", required_argument, 0, O_SHARE},
                                          {"no-http", no_argument, 0, O_NOHTTP},
                                          {"bind-to", required_argument, 0, O_BIND},
                                          {"specs", required_argument, 0, O_SPECS},
                                          {"data", required_argument, 0, O_DATA},
                                          {0, 0, 0, 0}};
    int                        ch;
    while ((ch = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        switch (ch) {
        case O_SECONDS:
            o.seconds = atof(optarg);
            break;
        case O_CLIENTS:
            o.nclients = parse_list(optarg, o.clients);
            break;
        case O_NP:
            nnp = parse_list(optarg, nps);
            break;
        case O_BATCHING:
            nbatching = 0;
            for (char *save = NULL, *t = strtok_r(optarg, ",", &save); t != NULL;
                 t = strtok_r(NULL, ",", &save)) {
                if (nbatching == 2 || (strcmp(t, "on") != 0 && strcmp(t, "off") != 0)) {
                    return usage(), 2;
                }
                batching[nbatching++] = strcmp(t, "on") == 0;
            }
            break;
        case O_STEPS:
            o.train_steps = atoi(optarg);
            break;
        case O_ROUNDS:
            o.train_rounds = atoi(optarg);
            break;
        case O_DELAY:
            o.delay_us = atoi(optarg);
            break;
        case O_QUEUE:
            o.queue = atoi(optarg);
            break;
        case O_SHARE:
            o.share = atoi(optarg);
            break;
        case O_NOHTTP:
            o.http = false;
            break;
        case O_BIND:
            o.bind_to = optarg;
            break;
        case O_SPECS:
            specs = optarg;
            break;
        case O_DATA:
            data_dir = optarg;
            break;
        default:
            return usage(), 2;
        }
    }
    if (optind != argc || o.seconds <= 0 || o.nclients < 1 || nnp < 1 || nbatching < 1 ||
        o.train_steps < 0 || o.train_rounds < 1 || o.train_rounds > MAX_ROUNDS || o.delay_us < 0 ||
        o.queue < 1 || o.share < 1 || o.share > 100) {
        return usage(), 2;
    }
    for (int i = 0; i < o.nclients; i++) {
        o.top_clients = o.clients[i] > o.top_clients ? o.clients[i] : o.top_clients;
    }
    o.max_clients =
        o.train_steps > 0 && o.top_clients < TRAIN_CLIENTS ? TRAIN_CLIENTS : o.top_clients;
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
    setenv("OMPI_MCA_plm_rsh_agent", "false", 0);
    setenv("GRPC_VERBOSITY", "ERROR", 0);
    if (load_images(MAX_BATCH) != 0) {
        printf("SKIP: no Fashion-MNIST test images under %s\n", data_dir);
        return 7;
    }
    char cpu[256];
    bench_cpu_name(cpu, sizeof cpu);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    printf("bench-serve: LeNet-5, batch-1 closed-loop clients (first Fashion-MNIST test image, "
           "UINT8), %.1f s per row after %.1f s of warm-up; --queue %d; %s; %ld CPUs; %s\n",
           o.seconds, WARMUP_S, o.queue, cpu, ncpu, bench_load_average());
    if (!o.http) {
        printf("HTTP: skipped (--no-http)\n");
    }
    fflush(stdout);
    char tmp[] = "/tmp/bench-serve-XXXXXX";
    if (mkdtemp(tmp) == NULL) {
        return fprintf(stderr, "bench-serve: mkdtemp: %s\n", strerror(errno)), 1;
    }
    // Every daemon before the first gRPC call of this process.
    config cfg[2 * MAX_LIST];
    int    ncfg = 0, rc = 0;
    memset(cfg, 0, sizeof cfg);
    for (int i = 0; i < nnp && rc == 0; i++) {
        for (int b = 0; b < nbatching && rc == 0; b++) {
            config *cf   = &cfg[ncfg++];
            cf->np       = nps[i];
            cf->batching = batching[b];
            char spec[PATH_MAX], delay[32], queue[32], share[32];
            snprintf(spec, sizeof spec, "%s/lenet5-%d.json", specs, cf->np);
            snprintf(cf->dir, sizeof cf->dir, "%s/np%d-%s", tmp, cf->np,
                     cf->batching ? "on" : "off");
            snprintf(cf->http_file, sizeof cf->http_file, "%s/http-addr", cf->dir);
            snprintf(cf->metrics_file, sizeof cf->metrics_file, "%s/metrics-addr", cf->dir);
            snprintf(delay, sizeof delay, "%d", o.delay_us);
            snprintf(queue, sizeof queue, "%d", o.queue);
            snprintf(share, sizeof share, "%d", o.share);
            if (spec_name(spec, cf->model, sizeof cf->model) != 0 || mkdir(cf->dir, 0700) != 0) {
                rc = 1;
                break;
            }
            const char *args[] = {"--model",
                                  spec,
                                  "--queue",
                                  queue,
                                  "--dynamic-batching",
                                  cf->batching ? "on" : "off",
                                  "--max-queue-delay-us",
                                  delay,
                                  "--serve-during-train",
                                  "on",
                                  "--serve-during-train-share",
                                  share,
                                  "--metrics-listen",
                                  "127.0.0.1:0",
                                  "--metrics-address-file",
                                  cf->metrics_file,
                                  o.http ? "--http-listen" : NULL,
                                  "127.0.0.1:0",
                                  "--http-address-file",
                                  cf->http_file,
                                  NULL};
            printf("daemon %d: mpirun -np %d distdld", ncfg, cf->np);
            for (int k = 0; args[k] != NULL; k++) {
                printf(" %s", args[k]);
            }
            printf("\n");
            fflush(stdout);
            rc = bench_daemon_start(&cf->d, cf->np, o.bind_to, cf->dir, args) != 0;
        }
    }
    for (int i = 0; i < ncfg; i++) { // all of them, so each can be shut down with its address
        if (cfg[i].d.pid > 0 && bench_daemon_wait(&cfg[i].d) != 0) {
            fprintf(stderr, "bench-serve: daemon %d did not start: %s/daemon-np%d.log%s\n", i + 1,
                    cfg[i].dir, cfg[i].np,
                    o.http ? " (a daemon without --http-listen needs --no-http)" : "");
            rc = 1;
        }
    }
    // The Train interleave runs on the last daemon with batching on.
    int train_cfg = -1;
    for (int i = 0; i < ncfg; i++) {
        train_cfg = cfg[i].batching ? i : train_cfg;
    }
    for (int i = 0; i < ncfg && rc == 0; i++) {
        if (run_config(&cfg[i], &o, i == train_cfg) != 0) {
            rc = 1;
        }
        bench_daemon_stop(&cfg[i].d);
    }
    for (int i = 0; i < ncfg; i++) {
        bench_daemon_stop(&cfg[i].d);
    }
    if (o.train_steps > 0 && train_cfg < 0 && rc == 0) {
        printf("\ntrain interleave: skipped (no daemon with batching on)\n");
    }
    printf("\nbench-serve: end; %s; %s\n", cpu, bench_load_average());
    if (g_errors > 0) {
        fprintf(stderr, "bench-serve: %d row(s) or checks with errors (see above)\n", g_errors);
        rc = 1;
    }
    bench_tmp_done("bench-serve", tmp, rc);
    free(ph.infer_req);
    free(ph.ready_req);
    free(test_px);
    return rc;
}
