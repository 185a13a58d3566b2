// server/metrics.c: the Prometheus endpoint of distdld (server/metrics.h, docs/METRICS.md).
//
// Threads. The hooks run on rank 0's cq thread and main thread; the scrape runs on
// libmicrohttpd's polling thread. They share `m` under m.mu, which the writers hold for a
// few additions and the scrape for one copy of the tables (about 70 KB); the text is
// formatted after the lock is released, so a slow scrape never holds up a step.
//
// Collection. ddld_metrics_collect is the one collective: after every command each rank
// contributes a fixed record (its primitive counters, ddl_traffic_snapshot, and its
// resident memory from /proc/self/statm) to an MPI_Gather on the dispatcher's
// communicator. The buffers are allocated once by ddld_metrics_init; the gather
// allocates nothing and costs one small message per rank per command (its time is
// exported as distdl_metrics_collect_seconds_total).
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "channel.h"
#include "ddl/base.h"
#include "ddl/decomp.h"
#include "ddl/primitives.h"
#include "listen.h"
#include "log.h"
#include "methods.h"
#include "metrics.h"
#include "service.h"
#include "shared.h"
#include "status_map.h"

// ---- tables -------------------------------------------------------------------------------

#define NMETHODS (DDLD_M_COUNT + 1) // + "unknown"
#define NCODES 17                   // gRPC status codes 0..16

// Method label values: the gRPC path without its leading slash.
static const char *const method_names[] = {[DDLD_M_COUNT] = "unknown", // any other path
#define X(name, path, kind, role, where, request, handler) [DDLD_M_##name] = &path[1],
                                           DDL_RPC_METHODS(X)
#undef X
};
_Static_assert(sizeof method_names / sizeof method_names[0] == NMETHODS, "a label per method");

// Latency buckets (upper bounds, seconds): 10 µs (a cheap answer from the snapshot) to
// 10 minutes (a long Train stream), roughly 1-2.5-5 per decade.
static const double buckets[] = {1e-5, 2.5e-5, 5e-5,   1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3,
                                 5e-3, 1e-2,   2.5e-2, 5e-2, 0.1,    0.25, 0.5,  1,
                                 2.5,  5,      10,     30,   60,     120,  300,  600};
#define NBUCKETS ((int)(sizeof buckets / sizeof buckets[0]))
_Static_assert(NBUCKETS == 24, "batch_stats.delay_bucket has a slot per latency bucket");

// Batch sizes (rows per batched inference command): powers of two up to 4096.
#define NROWB 13
// What dynamic batching did (dispatch.c): rows per command, requests per command, and each
// request's wait from its arrival to its command's start (the latency buckets).
typedef struct batch_stats {
    uint64_t commands, requests, rows, interleaved;
    double   interlude_s;   // time the Trains lent to answers (interludes, first command to RESUME)
    double   interlude_max; // the longest interlude of the latest Train
    uint64_t rows_bucket[NROWB]; // not cumulative
    uint64_t delay_bucket[24];   // NBUCKETS, not cumulative
    double   delay_sum;
} batch_stats;

typedef struct rpc_stats {
    uint64_t count[NMETHODS][NCODES];
    uint64_t bucket[NMETHODS][NCODES][NBUCKETS]; // not cumulative; +Inf is count - sum
    double   sum[NMETHODS][NCODES];
} rpc_stats;

// One rank's gathered record: per primitive kind and pass, sent/received/calls, then
// the resident memory.
enum { REC_TRAFFIC = DDL_TRAFFIC_NKINDS * DDL_TRAFFIC_NPASSES * 3, REC_RSS = REC_TRAFFIC, NREC };

// A record of the dashboard's history: a training record (count unused) or an evaluation
// (images_per_s unused).
struct hist {
    uint64_t seq;
    int64_t  step, count;
    double   loss, accuracy, images_per_s, unix_s;
};
// What a model's samples are judged by: a class per sample, a class per voxel
// (segmentation) or dense values.
enum { DASH_CLASSES, DASH_LABELS, DASH_VALUES };
// The dashboard's history: the last DDLD_HIST_TRAIN training records and DDLD_HIST_EVAL
// evaluations, rings indexed by their sequence number modulo the size, and the predictions
// of the last evaluation's first samples (ddld_metrics_eval_samples).
struct history {
    struct hist train[DDLD_HIST_TRAIN], eval[DDLD_HIST_EVAL];
    uint64_t    ntrain, neval; // records ever added (the next one's seq is n + 1)
    struct {
        uint64_t eval_seq; // the evaluation they belong to (0: none yet)
        char     split[8];
        int      n, channels, height, width; // height, width 0: no picture
        int      kind;                       // DASH_CLASSES, DASH_LABELS or DASH_VALUES
        bool     field;                      // target and prediction kept (segmentation, dense)
        int      depth, of; // the slice's index in the first spatial dim (of 0: a 2-D sample)
        int64_t  label[DDLD_DASH_SAMPLES], predicted[DDLD_DASH_SAMPLES]; // a classifier's
        uint8_t  pixels[DDLD_DASH_SAMPLES][DDLD_DASH_PIXELS]; // first channel, 0..255
        float    target[DDLD_DASH_SAMPLES][DDLD_DASH_PIXELS]; // field: the slice's
        float    prediction[DDLD_DASH_SAMPLES][DDLD_DASH_PIXELS]; // labels or values
    } samples;
};

static struct {
    bool                    enabled;
    int                     rank, size;
    const ddld_config      *cfg;
    pthread_mutex_t         mu;
    rpc_stats               rpc;
    batch_stats             batch;
    uint64_t                steps, images, checkpoints;
    double                  images_per_s;
    int64_t                *gather; // size * NREC: the gather's receive buffer (rank 0)
    int64_t                *ranks;  // size * NREC: the last complete gather, under mu
    bool                    gathered;
    uint64_t                collects;
    double                  collect_s;
    _Atomic(ddld_service *) svc;
    struct MHD_Daemon      *mhd;
    double                  start_unix, start_mono;
    long                    page;
    struct history          h; // the dashboard's (dashboard_json copies it whole)
} m = {.mu = PTHREAD_MUTEX_INITIALIZER};

// ---- the listen address ---------------------------------------------------------------

int ddld_metrics_check_config(const ddld_config *cfg, char *err, size_t errlen)
{
    return ddld_listen_check("--metrics-listen", cfg->metrics_listen, "--metrics-address-file",
                             cfg->metrics_address_file, err, errlen);
}

// ---- lifecycle ----------------------------------------------------------------------------

static double now_mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int ddld_metrics_init(const ddld_config *cfg, int rank, int size)
{
    m.cfg     = cfg;
    m.rank    = rank;
    m.size    = size;
    m.enabled = cfg->metrics_listen != NULL;
    m.page    = sysconf(_SC_PAGESIZE);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    m.start_unix = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
    m.start_mono = now_mono();
    atomic_init(&m.svc, NULL);
    if (m.enabled && rank == 0) {
        m.gather = ddl_calloc((size_t)size * NREC, sizeof *m.gather);
        m.ranks  = ddl_calloc((size_t)size * NREC, sizeof *m.ranks);
        if (m.gather == NULL || m.ranks == NULL) {
            ddld_log("metrics: out of memory for %d ranks' counters", size);
            ddld_metrics_free();
            return -1;
        }
    }
    return 0;
}

void ddld_metrics_free(void)
{
    ddl_free(m.gather);
    ddl_free(m.ranks);
    m.gather  = NULL;
    m.ranks   = NULL;
    m.enabled = false;
}

// This process's resident set in bytes (second field of /proc/self/statm, in pages), or
// 0 when it cannot be read. No allocation (no stdio).
static int64_t resident_bytes(void)
{
    char buf[128];
    int  fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return 0;
    }
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) {
        return 0;
    }
    buf[n]  = '\0';
    char *p = strchr(buf, ' ');
    return p != NULL ? strtoll(p + 1, NULL, 10) * (int64_t)m.page : 0;
}

void ddld_metrics_collect(MPI_Comm comm)
{
    if (!m.enabled) {
        return;
    }
    double      t0 = MPI_Wtime();
    ddl_traffic t;
    int64_t     rec[NREC];
    ddl_traffic_snapshot(&t);
    for (int k = 0; k < DDL_TRAFFIC_NKINDS; k++) {
        for (int p = 0; p < DDL_TRAFFIC_NPASSES; p++) {
            int64_t *r = rec + (k * DDL_TRAFFIC_NPASSES + p) * 3;
            r[0]       = (int64_t)t.c[k][p].sent;
            r[1]       = (int64_t)t.c[k][p].received;
            r[2]       = (int64_t)t.c[k][p].calls;
        }
    }
    // Reading statm costs ~9 us (the kernel walks the memory map): twice a second is
    // plenty for a gauge.
    static double  rss_at = -1;
    static int64_t rss;
    double         now = now_mono();
    if (rss_at < 0 || now - rss_at >= 0.5) {
        rss    = resident_bytes();
        rss_at = now;
    }
    rec[REC_RSS] = rss;
    ddld_channel_check(MPI_Gather(rec, NREC, MPI_INT64_T, m.gather, NREC, MPI_INT64_T, 0, comm),
                       "MPI_Gather");
    if (m.rank == 0) {
        double dt = MPI_Wtime() - t0;
        pthread_mutex_lock(&m.mu);
        memcpy(m.ranks, m.gather, (size_t)m.size * NREC * sizeof *m.ranks);
        m.gathered = true;
        m.collects++;
        m.collect_s += dt;
        pthread_mutex_unlock(&m.mu);
    }
}

// ---- hooks ----------------------------------------------------------------------------------

// The inference statistics (the KServe statistics extension, http.c): kept with or without
// --metrics-listen, under their own mutex.
static struct {
    pthread_mutex_t  mu;
    ddld_infer_stats s;
} st = {.mu = PTHREAD_MUTEX_INITIALIZER};

static double now_unix(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void ddld_metrics_infer_stats(ddld_infer_stats *out)
{
    pthread_mutex_lock(&st.mu);
    *out = st.s;
    pthread_mutex_unlock(&st.mu);
}

void ddld_metrics_rpc(int method, grpc_status_code code, double seconds)
{
    if (method == DDLD_M_PREDICT || method == DDLD_M_MODEL_INFER) {
        pthread_mutex_lock(&st.mu);
        if (code == GRPC_STATUS_OK) {
            st.s.success_count++;
            st.s.success_s += seconds;
        } else {
            st.s.fail_count++;
            st.s.fail_s += seconds;
        }
        pthread_mutex_unlock(&st.mu);
    }
    if (!m.enabled) {
        return;
    }
    int mi = method >= 0 && method < NMETHODS ? method : DDLD_M_COUNT;
    int ci = (int)code >= 0 && (int)code < NCODES ? (int)code : GRPC_STATUS_UNKNOWN;
    int b  = 0;
    while (b < NBUCKETS && seconds > buckets[b]) {
        b++;
    }
    pthread_mutex_lock(&m.mu);
    m.rpc.count[mi][ci]++;
    m.rpc.sum[mi][ci] += seconds;
    if (b < NBUCKETS) {
        m.rpc.bucket[mi][ci][b]++;
    }
    pthread_mutex_unlock(&m.mu);
}

void ddld_metrics_interlude(double seconds)
{
    if (!m.enabled) {
        return;
    }
    pthread_mutex_lock(&m.mu);
    m.batch.interlude_s += seconds;
    if (seconds > m.batch.interlude_max) {
        m.batch.interlude_max = seconds;
    }
    pthread_mutex_unlock(&m.mu);
}

void ddld_metrics_train_begin(void)
{
    if (!m.enabled) {
        return;
    }
    pthread_mutex_lock(&m.mu);
    m.batch.interlude_max = 0;
    pthread_mutex_unlock(&m.mu);
}

void ddld_metrics_batch(int64_t rows, const double *delays, int n, bool interleaved, bool ok,
                        double exec_s)
{
    if (n <= 0) {
        return;
    }
    if (ok) {
        pthread_mutex_lock(&st.mu);
        ddld_infer_stats *s = &st.s;
        s->exec_count++;
        s->inference_count += (uint64_t)rows;
        s->exec_s += exec_s;
        s->last_unix = now_unix();
        for (int i = 0; i < n; i++) {
            s->queue_s += delays[i];
        }
        s->queue_count += (uint64_t)n;
        int k = 0;
        while (k < s->nsizes && s->sizes[k].rows != rows) {
            k++;
        }
        if (k == s->nsizes && k < DDLD_STATS_SIZES) {
            s->sizes[s->nsizes++].rows = rows;
        }
        if (k < DDLD_STATS_SIZES) {
            s->sizes[k].count++;
            s->sizes[k].exec_s += exec_s;
        }
        pthread_mutex_unlock(&st.mu);
    }
    if (!m.enabled) {
        return;
    }
    int rb = 0;
    while (rb < NROWB - 1 && rows > ((int64_t)1 << rb)) {
        rb++;
    }
    pthread_mutex_lock(&m.mu);
    m.batch.commands++;
    m.batch.requests += (uint64_t)n;
    m.batch.rows += (uint64_t)rows;
    m.batch.interleaved += interleaved ? 1 : 0;
    if (rows <= ((int64_t)1 << rb)) {
        m.batch.rows_bucket[rb]++;
    }
    for (int i = 0; i < n; i++) {
        int b = 0;
        while (b < NBUCKETS && delays[i] > buckets[b]) {
            b++;
        }
        if (b < NBUCKETS) {
            m.batch.delay_bucket[b]++;
        }
        m.batch.delay_sum += delays[i];
    }
    pthread_mutex_unlock(&m.mu);
}

void ddld_metrics_steps(int64_t steps, int64_t images, double images_per_s)
{
    if (!m.enabled || steps <= 0) {
        return;
    }
    pthread_mutex_lock(&m.mu);
    m.steps += (uint64_t)steps;
    m.images += (uint64_t)images;
    if (images_per_s > 0) {
        m.images_per_s = images_per_s;
    }
    pthread_mutex_unlock(&m.mu);
}

void ddld_metrics_checkpoint(void)
{
    if (!m.enabled) {
        return;
    }
    pthread_mutex_lock(&m.mu);
    m.checkpoints++;
    pthread_mutex_unlock(&m.mu);
}

// Adds r to a ring of cap records of which *n were ever added, stamped now; an accuracy
// < 0 (the engine's "none": a dense loss without one) is kept as NaN (null in the JSON).
static void hist_add(struct hist *ring, uint64_t cap, uint64_t *n, struct hist r)
{
    if (!m.enabled) {
        return;
    }
    r.unix_s = now_unix();
    if (r.accuracy < 0) {
        r.accuracy = NAN;
    }
    pthread_mutex_lock(&m.mu);
    r.seq                   = ++*n;
    ring[(r.seq - 1) % cap] = r;
    pthread_mutex_unlock(&m.mu);
}

void ddld_metrics_train_point(int64_t step, double loss, double accuracy, double images_per_s)
{
    hist_add(m.h.train, DDLD_HIST_TRAIN, &m.h.ntrain,
             (struct hist){
                 .step = step, .loss = loss, .accuracy = accuracy, .images_per_s = images_per_s});
}

void ddld_metrics_eval_point(int64_t step, int64_t count, double loss, double accuracy)
{
    hist_add(m.h.eval, DDLD_HIST_EVAL, &m.h.neval,
             (struct hist){.step = step, .count = count, .loss = loss, .accuracy = accuracy});
}

// The index of the largest of n values v[first + k * stride] (the first of equals; NaN
// never wins).
static int64_t argmax_at(const void *v, int64_t first, int64_t stride, int64_t n, size_t es)
{
    int64_t best = 0;
    for (int64_t k = 1; k < n; k++) {
        if (ddl_value_at(v, first + k * stride, es) > ddl_value_at(v, first + best * stride, es)) {
            best = k;
        }
    }
    return best;
}

// The n values v[first..first + n) scaled to 0..255 over their own range (the inputs are
// normalised) into px.
static void scale_pixels(const void *v, int64_t first, int64_t n, size_t es, uint8_t *px)
{
    double lo = INFINITY, hi = -INFINITY;
    for (int64_t k = 0; k < n; k++) {
        double x = ddl_value_at(v, first + k, es);
        lo       = x < lo ? x : lo;
        hi       = x > hi ? x : hi;
    }
    for (int64_t k = 0; k < n; k++) {
        double x = ddl_value_at(v, first + k, es);
        px[k]    = hi > lo ? (uint8_t)lround(255.0 * (x - lo) / (hi - lo)) : 0;
    }
}

void ddld_metrics_eval_samples(const char *split, const ddld_dash_model *dm, const void *x,
                               const void *targets, const void *out, int64_t n)
{
    if (!m.enabled || n <= 0) {
        return;
    }
    n                   = n < DDLD_DASH_SAMPLES ? n : DDLD_DASH_SAMPLES;
    const ddl_shape *in = &dm->in, *o = &dm->out;
    size_t           es = ddl_dtype_size(dm->dt);
    int64_t          xn = ddl_shape_numel(in), on = ddl_shape_numel(o);
    int              kind = dm->dense ? DASH_VALUES : o->ndim == 1 ? DASH_CLASSES : DASH_LABELS;
    // a field: the output holds the input's spatial dims ([C, spatial...], two or more)
    bool field = kind != DASH_CLASSES && in->ndim >= 3 && o->ndim == in->ndim;
    for (int k = 1; field && k < in->ndim; k++) {
        field = o->d[k] == in->d[k];
    }
    // a picture: [C, H, W] (or [H, W]) with H * W <= DDLD_DASH_PIXELS, its first channel; of a
    // field, the slice at the middle of every spatial dim but the last two (offset off)
    int     h = 0, w = 0, c = 1, depth = 0, of = 0;
    int64_t off = 0, vox = 0; // vox: values per channel
    bool    fits = in->ndim >= 2 && in->d[in->ndim - 1] * in->d[in->ndim - 2] <= DDLD_DASH_PIXELS;
    if (fits && (field || in->ndim == 3 || in->ndim == 2)) {
        h = (int)in->d[in->ndim - 2];
        w = (int)in->d[in->ndim - 1];
        c            = in->ndim >= 3 ? (int)in->d[0] : 1;
        vox          = xn / c;
        int64_t step = (int64_t)h * w;
        for (int k = in->ndim - 3; k >= 1; k--) {
            off += in->d[k] / 2 * step;
            step *= in->d[k];
        }
        if (in->ndim >= 4) {
            depth = (int)(in->d[1] / 2);
            of    = (int)in->d[1];
        }
    }
    field = field && h > 0;
    pthread_mutex_lock(&m.mu);
    m.h.samples.eval_seq = m.h.neval + 1; // this Evaluate's ddld_metrics_eval_point comes after
    snprintf(m.h.samples.split, sizeof m.h.samples.split, "%s", split);
    m.h.samples.n        = (int)n;
    m.h.samples.channels = c;
    m.h.samples.height   = h;
    m.h.samples.width    = w;
    m.h.samples.kind     = kind;
    m.h.samples.field    = field;
    m.h.samples.depth    = depth;
    m.h.samples.of       = of;
    const int64_t *lab   = targets;
    for (int64_t i = 0; i < n; i++) {
        if (kind == DASH_CLASSES) {
            m.h.samples.label[i]     = lab[i];
            m.h.samples.predicted[i] = argmax_at(out, i * on, 1, on, es);
        }
        scale_pixels(x, i * xn + off, (int64_t)h * w, es, m.h.samples.pixels[i]);
        for (int64_t k = 0; field && k < (int64_t)h * w; k++) {
            int64_t at = i * on + off + k; // the output's first channel (dense: the target's)
            float  *tk = &m.h.samples.target[i][k], *pk = &m.h.samples.prediction[i][k];
            if (kind == DASH_LABELS) {
                *tk = (float)lab[i * vox + off + k];
                *pk = (float)argmax_at(out, at, vox, o->d[0], es);
            } else {
                *tk = (float)ddl_value_at(targets, at, es);
                *pk = (float)ddl_value_at(out, at, es);
            }
        }
    }
    pthread_mutex_unlock(&m.mu);
}

void ddld_metrics_attach(ddld_service *svc)
{
    atomic_store(&m.svc, svc);
}

// ---- the scrape (HTTP thread) ---------------------------------------------------------------

// Everything a scrape prints, copied under the locks and formatted afterwards.
struct scrape {
    rpc_stats   rpc;
    batch_stats batch;
    uint64_t  steps, images, checkpoints, collects;
    double    images_per_s, collect_s;
    bool      gathered;
    int64_t  *ranks; // size * NREC
    // from ddld_g
    bool        has_model;
    int         world_size;
    int64_t     step, durable_step, epoch;
    double      last_loss;
    int64_t     step_bytes;
    int         batches, batch_cap, requests, request_cap;
    const char *state;
};

static void family(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void render(FILE *f, const struct scrape *s)
{
    family(f, "distdl_start_time_seconds", "gauge",
           "Start time of the daemon since the Unix epoch in seconds.");
    fprintf(f, "distdl_start_time_seconds %.3f\n", m.start_unix);
    family(f, "distdl_uptime_seconds", "gauge", "Seconds since the daemon started.");
    fprintf(f, "distdl_uptime_seconds %.3f\n", now_mono() - m.start_mono);
    family(f, "distdl_world_size", "gauge", "MPI ranks of the daemon.");
    fprintf(f, "distdl_world_size %d\n", s->world_size);
    family(f, "distdl_model_loaded", "gauge", "1 when a model is loaded, else 0.");
    fprintf(f, "distdl_model_loaded %d\n", s->has_model ? 1 : 0);
    family(f, "distdl_training", "gauge", "1 while a Step or Train runs, else 0.");
    fprintf(f, "distdl_training %d\n", strcmp(s->state, "training") == 0 ? 1 : 0);

    family(f, "distdl_steps_total", "counter",
           "Optimizer steps taken by this daemon (Step and Train).");
    fprintf(f, "distdl_steps_total %llu\n", (unsigned long long)s->steps);
    family(f, "distdl_images_total", "counter", "Training samples consumed by those steps.");
    fprintf(f, "distdl_images_total %llu\n", (unsigned long long)s->images);
    family(f, "distdl_images_per_second", "gauge",
           "Training throughput of the latest Step or Train (samples per second).");
    fprintf(f, "distdl_images_per_second %.6g\n", s->images_per_s);
    family(f, "distdl_model_step", "gauge", "The model's optimizer step (restored with it).");
    fprintf(f, "distdl_model_step %lld\n", (long long)s->step);
    family(f, "distdl_durable_step", "gauge", "Step of the newest durable checkpoint (-1: none).");
    fprintf(f, "distdl_durable_step %lld\n", (long long)s->durable_step);
    family(f, "distdl_epoch", "gauge", "Epoch of the server-side dataset cursor.");
    fprintf(f, "distdl_epoch %lld\n", (long long)s->epoch);
    family(f, "distdl_train_loss", "gauge", "Loss of the latest training step.");
    fprintf(f, "distdl_train_loss %.17g\n", s->last_loss);
    family(f, "distdl_step_bytes", "gauge",
           "Payload bytes one training step moves between ranks, summed over ranks (each byte "
           "sent once and received once; 0 before the model's first step; docs/SCALING.md).");
    fprintf(f, "distdl_step_bytes %lld\n", (long long)s->step_bytes);
    family(f, "distdl_checkpoints_total", "counter", "Durable checkpoints written.");
    fprintf(f, "distdl_checkpoints_total %llu\n", (unsigned long long)s->checkpoints);

    family(f, "distdl_queue_depth", "gauge",
           "Waiting engine requests (queue=\"requests\") and submitted batches "
           "(queue=\"batches\").");
    fprintf(f, "distdl_queue_depth{queue=\"requests\"} %d\n", s->requests);
    fprintf(f, "distdl_queue_depth{queue=\"batches\"} %d\n", s->batches);
    family(f, "distdl_queue_capacity", "gauge", "Capacity of those queues (--queue).");
    fprintf(f, "distdl_queue_capacity{queue=\"requests\"} %d\n", s->request_cap);
    fprintf(f, "distdl_queue_capacity{queue=\"batches\"} %d\n", s->batch_cap);

    family(f, "distdl_rpc_requests_total", "counter",
           "gRPC calls completed, by method and status code.");
    for (int mi = 0; mi < NMETHODS; mi++) {
        for (int c = 0; c < NCODES; c++) {
            if (s->rpc.count[mi][c] > 0) {
                fprintf(f, "distdl_rpc_requests_total{method=\"%s\",code=\"%s\"} %llu\n",
                        method_names[mi], ddld_grpc_code_name((grpc_status_code)c),
                        (unsigned long long)s->rpc.count[mi][c]);
            }
        }
    }
    family(f, "distdl_rpc_duration_seconds", "histogram",
           "Time from a call's arrival to its final status, by method and status code.");
    for (int mi = 0; mi < NMETHODS; mi++) {
        for (int c = 0; c < NCODES; c++) {
            uint64_t n = s->rpc.count[mi][c];
            if (n == 0) {
                continue;
            }
            char lab[160];
            snprintf(lab, sizeof lab, "method=\"%s\",code=\"%s\"", method_names[mi],
                     ddld_grpc_code_name((grpc_status_code)c));
            uint64_t cum = 0;
            for (int b = 0; b < NBUCKETS; b++) {
                cum += s->rpc.bucket[mi][c][b];
                fprintf(f, "distdl_rpc_duration_seconds_bucket{%s,le=\"%g\"} %llu\n", lab,
                        buckets[b], (unsigned long long)cum);
            }
            fprintf(f, "distdl_rpc_duration_seconds_bucket{%s,le=\"+Inf\"} %llu\n", lab,
                    (unsigned long long)n);
            fprintf(f, "distdl_rpc_duration_seconds_sum{%s} %.9g\n", lab, s->rpc.sum[mi][c]);
            fprintf(f, "distdl_rpc_duration_seconds_count{%s} %llu\n", lab, (unsigned long long)n);
        }
    }

    const batch_stats *bs = &s->batch;
    family(f, "distdl_inference_batch_rows", "histogram",
           "Rows (samples) per batched inference command: concurrent Predict and ModelInfer "
           "calls joined into one (dynamic batching).");
    uint64_t cum = 0;
    for (int b = 0; b < NROWB; b++) {
        cum += bs->rows_bucket[b];
        fprintf(f, "distdl_inference_batch_rows_bucket{le=\"%d\"} %llu\n", 1 << b,
                (unsigned long long)cum);
    }
    fprintf(f, "distdl_inference_batch_rows_bucket{le=\"+Inf\"} %llu\n",
            (unsigned long long)bs->commands);
    fprintf(f, "distdl_inference_batch_rows_sum %llu\n", (unsigned long long)bs->rows);
    fprintf(f, "distdl_inference_batch_rows_count %llu\n", (unsigned long long)bs->commands);
    family(f, "distdl_inference_batch_requests_total", "counter",
           "Inference calls answered by batched commands (divide by "
           "distdl_inference_batch_rows_count for the calls per command).");
    fprintf(f, "distdl_inference_batch_requests_total %llu\n", (unsigned long long)bs->requests);
    family(f, "distdl_inference_interleaved_total", "counter",
           "Batched inference commands run at a Train's step boundary.");
    fprintf(f, "distdl_inference_interleaved_total %llu\n", (unsigned long long)bs->interleaved);
    family(f, "distdl_inference_interlude_seconds_total", "counter",
           "Time Trains lent the ranks to inference at step boundaries (bounded by "
           "--serve-during-train-share).");
    fprintf(f, "distdl_inference_interlude_seconds_total %.9g\n", bs->interlude_s);
    family(f, "distdl_inference_interlude_max_seconds", "gauge",
           "The longest interlude of the latest Train (0 until one runs): the most by which "
           "its interludes may exceed --serve-during-train-share.");
    fprintf(f, "distdl_inference_interlude_max_seconds %.9g\n", bs->interlude_max);
    family(f, "distdl_inference_queue_delay_seconds", "histogram",
           "Time from an inference call's arrival to the start of the command that ran it.");
    cum = 0;
    for (int b = 0; b < NBUCKETS; b++) {
        cum += bs->delay_bucket[b];
        fprintf(f, "distdl_inference_queue_delay_seconds_bucket{le=\"%g\"} %llu\n", buckets[b],
                (unsigned long long)cum);
    }
    fprintf(f, "distdl_inference_queue_delay_seconds_bucket{le=\"+Inf\"} %llu\n",
            (unsigned long long)bs->requests);
    fprintf(f, "distdl_inference_queue_delay_seconds_sum %.9g\n", bs->delay_sum);
    fprintf(f, "distdl_inference_queue_delay_seconds_count %llu\n",
            (unsigned long long)bs->requests);

    static const char *const pass_names[DDL_TRAFFIC_NPASSES] = {"forward", "adjoint"};
    family(f, "distdl_primitive_bytes_total", "counter",
           "Payload bytes the parallel primitives moved between ranks, summed over all ranks "
           "(direction=\"sent\" or \"received\"; self copies excluded), as of the last "
           "command that ended.");
    for (int k = 0; k < DDL_TRAFFIC_NKINDS; k++) {
        for (int p = 0; p < DDL_TRAFFIC_NPASSES; p++) {
            int64_t sum[3] = {0, 0, 0};
            for (int r = 0; r < s->world_size && s->ranks != NULL; r++) {
                for (int j = 0; j < 3; j++) {
                    sum[j] += s->ranks[(size_t)r * NREC +
                                       (size_t)(k * DDL_TRAFFIC_NPASSES + p) * 3 + (size_t)j];
                }
            }
            const char *kn = ddl_traffic_kind_name((ddl_traffic_kind)k);
            fprintf(f,
                    "distdl_primitive_bytes_total{primitive=\"%s\",pass=\"%s\",direction=\"sent\"} "
                    "%lld\n",
                    kn, pass_names[p], (long long)sum[0]);
            fprintf(f,
                    "distdl_primitive_bytes_total{primitive=\"%s\",pass=\"%s\","
                    "direction=\"received\"} %lld\n",
                    kn, pass_names[p], (long long)sum[1]);
        }
    }
    family(f, "distdl_primitive_calls_total", "counter",
           "Executions of each primitive's forward or adjoint, summed over all ranks.");
    for (int k = 0; k < DDL_TRAFFIC_NKINDS; k++) {
        for (int p = 0; p < DDL_TRAFFIC_NPASSES; p++) {
            int64_t n = 0;
            for (int r = 0; r < s->world_size && s->ranks != NULL; r++) {
                n += s->ranks[(size_t)r * NREC + (size_t)(k * DDL_TRAFFIC_NPASSES + p) * 3 + 2];
            }
            fprintf(f, "distdl_primitive_calls_total{primitive=\"%s\",pass=\"%s\"} %lld\n",
                    ddl_traffic_kind_name((ddl_traffic_kind)k), pass_names[p], (long long)n);
        }
    }
    family(f, "distdl_process_resident_memory_bytes", "gauge",
           "Resident memory of each rank (rank 0 now, the others as of a recent command).");
    for (int r = 0; r < s->world_size; r++) {
        int64_t v =
            r == 0 ? resident_bytes() : (s->gathered ? s->ranks[(size_t)r * NREC + REC_RSS] : 0);
        fprintf(f, "distdl_process_resident_memory_bytes{rank=\"%d\"} %lld\n", r, (long long)v);
    }
    family(f, "distdl_metrics_collections_total", "counter",
           "Gathers of the ranks' counters (one per command).");
    fprintf(f, "distdl_metrics_collections_total %llu\n", (unsigned long long)s->collects);
    family(f, "distdl_metrics_collect_seconds_total", "counter",
           "Time rank 0 spent in those gathers.");
    fprintf(f, "distdl_metrics_collect_seconds_total %.9g\n", s->collect_s);
}

static int take_scrape(struct scrape *s)
{
    memset(s, 0, sizeof *s);
    s->ranks = ddl_calloc((size_t)m.size * NREC, sizeof *s->ranks);
    if (s->ranks == NULL) {
        return -1;
    }
    pthread_mutex_lock(&m.mu);
    s->rpc          = m.rpc;
    s->batch        = m.batch;
    s->steps        = m.steps;
    s->images       = m.images;
    s->checkpoints  = m.checkpoints;
    s->images_per_s = m.images_per_s;
    s->collects     = m.collects;
    s->collect_s    = m.collect_s;
    s->gathered     = m.gathered;
    memcpy(s->ranks, m.ranks, (size_t)m.size * NREC * sizeof *s->ranks);
    pthread_mutex_unlock(&m.mu);

    pthread_mutex_lock(&ddld_g.mu);
    s->has_model    = ddld_g.info.has_model;
    s->world_size   = ddld_g.world_size;
    s->step         = ddld_g.step;
    s->durable_step = ddld_g.durable_step;
    s->epoch        = ddld_g.epoch;
    s->last_loss    = ddld_g.last_loss;
    s->step_bytes   = ddld_g.step_bytes;
    s->batches      = ddld_g.batch_count;
    s->batch_cap    = ddld_g.batch_cap;
    s->state        = ddld_g.state; // a string literal
    pthread_mutex_unlock(&ddld_g.mu);
    if (s->world_size > m.size) {
        s->world_size = m.size;
    }
    ddld_service *svc = atomic_load(&m.svc);
    s->requests       = svc != NULL ? ddld_service_queue_depth(svc) : 0;
    s->request_cap    = m.cfg->queue;
    return 0;
}

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned int status, char *body,
                             size_t len, bool must_free)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(
        len, body, must_free ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (r == NULL) {
        if (must_free) {
            free(body);
        }
        return MHD_NO;
    }
    if (status == MHD_HTTP_OK) {
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; version=0.0.4");
    } else {
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain");
    }
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED) {
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    }
    enum MHD_Result ret = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return ret;
}

// ---- the dashboard (HTTP thread) -------------------------------------------------------------
// GET /dashboard is one HTML page (dashboard.html, compiled in by server/CMakeLists.txt) that
// polls GET /dashboard.json; GET /dashboard/chart.js is Debian's libjs-chart.js read from its
// file at each request (DDLD_CHARTJS overrides the path), so the daemon starts without it and
// the page says it is missing. docs/METRICS.md lists the JSON's fields.

extern const unsigned char ddld_dashboard_html[]; // dashboard_page.c, generated
extern const size_t        ddld_dashboard_html_len;

#define CHARTJS_DEFAULT "/usr/share/javascript/chart.js/chart.min.js"

static const char *chartjs_path(void)
{
    const char *p = getenv("DDLD_CHARTJS");
    return p != NULL && p[0] != '\0' ? p : CHARTJS_DEFAULT;
}

// A JSON number, or null for NaN and infinities (JSON has none).
static void put_num(FILE *f, double v)
{
    if (v == v && v - v == 0) {
        fprintf(f, "%.17g", v);
    } else {
        fputs("null", f);
    }
}

// n values of a slice, comma-separated: integers (labels) or %.9g numbers (the floats
// round-trip), null for NaN and infinities.
static void put_slice(FILE *f, const float *v, int n, bool labels)
{
    for (int k = 0; k < n; k++) {
        if (k > 0) {
            fputc(',', f);
        }
        if (labels) {
            fprintf(f, "%lld", (long long)v[k]);
        } else if (isfinite(v[k])) {
            fprintf(f, "%.9g", (double)v[k]);
        } else {
            fputs("null", f);
        }
    }
}

// A JSON string of a name from the spec (quotes and control characters escaped).
static void put_jstr(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s != '\0'; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            fprintf(f, "\\%c", c);
        } else if (c < 0x20) {
            fprintf(f, "\\u%04x", c);
        } else {
            fputc(c, f);
        }
    }
    fputc('"', f);
}

// Layer i of mi as JSON: its name, type, output shape, partition and each rank's box of the
// output (the balanced decomposition the engine uses, ddl_decomp_box); no boxes when the
// partition's grid has another rank than the tensor.
static void dashboard_layer(FILE *f, const ddld_model_info *mi, int i)
{
    const ddld_layer_info *L = &mi->layers[i];
    fprintf(f, "%s\n  {\"name\": ", i > 0 ? "," : "");
    put_jstr(f, L->name);
    fputs(", \"type\": ", f);
    put_jstr(f, L->type);
    fputs(", \"shape\": [", f);
    for (int k = 0; k < L->y.ndim; k++) {
        fprintf(f, "%s%lld", k > 0 ? ", " : "", (long long)L->y.d[k]);
    }
    fputs("], \"partition\": ", f);
    if (L->part < 0) {
        fputs("null, \"boxes\": []}", f);
        return;
    }
    put_jstr(f, mi->part_name[L->part]);
    fputs(", \"boxes\": [", f);
    int nd = mi->part_ndims[L->part], pshape[DDL_MAX_DIMS], coord[DDL_MAX_DIMS];
    if (nd == L->y.ndim) {
        for (int k = 0; k < nd; k++) {
            pshape[k] = (int)mi->part_shape[L->part][k];
        }
        for (int r = 0; r < mi->part_nranks[L->part]; r++) {
            ddl_index_unravel(nd, pshape, r, coord);
            ddl_box b = ddl_decomp_box(&L->y, pshape, coord);
            fprintf(f, "%s{\"rank\": %d, \"start\": [", r > 0 ? ", " : "",
                    (int)mi->part_ranks[L->part][r]);
            for (int k = 0; k < nd; k++) {
                fprintf(f, "%s%lld", k > 0 ? ", " : "", (long long)b.start[k]);
            }
            fputs("], \"size\": [", f);
            for (int k = 0; k < nd; k++) {
                fprintf(f, "%s%lld", k > 0 ? ", " : "", (long long)(b.stop[k] - b.start[k]));
            }
            fputs("]}", f);
        }
    }
    fputs("]}", f);
}

// The records of a ring (cap, n ever added) with seq > since, as JSON array elements.
static void put_hist(FILE *f, const struct hist *ring, uint64_t cap, uint64_t n, uint64_t since,
                     bool eval)
{
    uint64_t first = n > cap ? n - cap + 1 : 1;
    if (first <= since) {
        first = since + 1;
    }
    for (uint64_t q = first; q <= n; q++) {
        const struct hist *h = &ring[(q - 1) % cap];
        fprintf(f, "%s\n  {\"seq\": %llu, \"step\": %lld", q > first ? "," : "",
                (unsigned long long)h->seq, (long long)h->step);
        if (eval) {
            fprintf(f, ", \"count\": %lld", (long long)h->count);
        }
        fputs(", \"loss\": ", f);
        put_num(f, h->loss);
        fputs(", \"accuracy\": ", f);
        put_num(f, h->accuracy);
        if (!eval) {
            fputs(", \"images_per_s\": ", f);
            put_num(f, h->images_per_s);
        }
        fprintf(f, ", \"unix_s\": %.3f}", h->unix_s);
    }
}

// The records with seq > since_train (training) and seq > since_eval (evaluations), and the
// current figures, as one JSON object.
static void dashboard_json(FILE *f, const struct scrape *s, uint64_t since_train,
                           uint64_t since_eval)
{
    // the history, copied under m.mu (about 330 KB: on the heap, like the scrape)
    struct history *hc = ddl_calloc(1, sizeof *hc);
    if (hc != NULL) {
        pthread_mutex_lock(&m.mu);
        *hc = m.h;
        pthread_mutex_unlock(&m.mu);
    }
    const char *cjs = chartjs_path();
    fprintf(f,
            "{\"uptime_seconds\": %.3f, \"world_size\": %d, \"state\": ", now_mono() - m.start_mono,
            s->world_size);
    put_jstr(f, s->state);
    fprintf(f, ",\n \"chart_js\": {\"path\": ");
    put_jstr(f, cjs);
    fprintf(f, ", \"present\": %s},\n", access(cjs, R_OK) == 0 ? "true" : "false");
    fprintf(f, " \"step\": %lld, \"durable_step\": %lld, \"epoch\": %lld, \"last_loss\": ",
            (long long)s->step, (long long)s->durable_step, (long long)s->epoch);
    put_num(f, s->last_loss);
    fprintf(f, ", \"images_per_s\": ");
    put_num(f, s->images_per_s);
    fprintf(f,
            ", \"steps_total\": %llu, \"images_total\": %llu, \"checkpoints_total\": %llu,\n"
            " \"step_bytes\": %lld, \"queue\": {\"requests\": %d, \"requests_capacity\": %d, "
            "\"batches\": %d, \"batches_capacity\": %d},\n",
            (unsigned long long)s->steps, (unsigned long long)s->images,
            (unsigned long long)s->checkpoints, (long long)s->step_bytes, s->requests,
            s->request_cap, s->batches, s->batch_cap);
    fprintf(f, " \"ranks\": [");
    for (int r = 0; r < s->world_size; r++) {
        int64_t sent = 0, recv = 0;
        for (int k = 0; k < DDL_TRAFFIC_NKINDS * DDL_TRAFFIC_NPASSES && s->gathered; k++) {
            sent += s->ranks[(size_t)r * NREC + (size_t)k * 3];
            recv += s->ranks[(size_t)r * NREC + (size_t)k * 3 + 1];
        }
        int64_t rss =
            r == 0 ? resident_bytes() : (s->gathered ? s->ranks[(size_t)r * NREC + REC_RSS] : 0);
        fprintf(f,
                "%s{\"rank\": %d, \"resident_bytes\": %lld, \"bytes_sent\": %lld, "
                "\"bytes_received\": %lld}",
                r > 0 ? ", " : "", r, (long long)rss, (long long)sent, (long long)recv);
    }
    uint64_t ntrain = hc != NULL ? hc->ntrain : 0, neval = hc != NULL ? hc->neval : 0;
    fprintf(f, "],\n \"train_seq\": %llu, \"train\": [", (unsigned long long)ntrain);
    if (hc != NULL) {
        put_hist(f, hc->train, DDLD_HIST_TRAIN, ntrain, since_train, false);
    }
    fprintf(f, "],\n \"eval_seq\": %llu, \"eval\": [", (unsigned long long)neval);
    if (hc != NULL) {
        put_hist(f, hc->eval, DDLD_HIST_EVAL, neval, since_eval, true);
    }
    // the predictions of the last evaluation's first samples
    fputs("],\n \"samples\": ", f);
    const __typeof__(m.h.samples) *sm = hc != NULL ? &hc->samples : NULL;
    if (sm == NULL || sm->eval_seq == 0) {
        fputs("null", f);
    } else {
        fprintf(f, "{\"eval_seq\": %llu, \"split\": ", (unsigned long long)sm->eval_seq);
        put_jstr(f, sm->split);
        static const char *const kinds[] = {"classifier", "segmentation", "dense"};
        fprintf(f,
                ", \"kind\": \"%s\", \"channels\": %d, \"height\": %d, \"width\": %d, "
                "\"items\": [",
                kinds[sm->kind], sm->channels, sm->height, sm->width);
        int hw = sm->height * sm->width;
        for (int i = 0; i < sm->n; i++) {
            fputs(i > 0 ? ",\n  {" : "\n  {", f);
            if (sm->kind == DASH_CLASSES) {
                fprintf(f, "\"label\": %lld, \"predicted\": %lld, ", (long long)sm->label[i],
                        (long long)sm->predicted[i]);
            }
            fputs("\"pixels\": [", f);
            for (int k = 0; k < hw; k++) {
                fprintf(f, k > 0 ? ",%u" : "%u", (unsigned)sm->pixels[i][k]);
            }
            fputc(']', f);
            if (sm->of > 0) {
                fprintf(f, ", \"slice\": {\"axis\": \"depth\", \"index\": %d, \"of\": %d}",
                        sm->depth, sm->of);
            }
            if (sm->field) {
                fputs(", \"target\": [", f);
                put_slice(f, sm->target[i], hw, sm->kind == DASH_LABELS);
                fputs("], \"prediction\": [", f);
                put_slice(f, sm->prediction[i], hw, sm->kind == DASH_LABELS);
                fputc(']', f);
            }
            fputc('}', f);
        }
        fputs("]}", f);
    }
    ddl_free(hc);
    // the model and its partitions (the spec's rank grids), under the snapshot's mutex
    fputs(",\n \"model\": ", f);
    pthread_mutex_lock(&ddld_g.mu);
    const ddld_model_info *mi = &ddld_g.info;
    if (!mi->has_model) {
        fputs("null", f);
    } else {
        fputs("{\"name\": ", f);
        put_jstr(f, mi->name);
        fprintf(f, ", \"batch_size\": %lld, \"num_parameters\": %lld, \"partitions\": [",
                (long long)mi->batch_size, (long long)mi->num_parameters);
        for (int i = 0; i < mi->npartitions; i++) {
            fputs(i > 0 ? ",\n  {\"name\": " : "\n  {\"name\": ", f);
            put_jstr(f, mi->part_name[i]);
            fputs(", \"shape\": [", f);
            for (int j = 0; j < mi->part_ndims[i]; j++) {
                fprintf(f, "%s%lld", j > 0 ? ", " : "", (long long)mi->part_shape[i][j]);
            }
            fputs("], \"ranks\": [", f);
            for (int j = 0; j < mi->part_nranks[i]; j++) {
                fprintf(f, "%s%d", j > 0 ? ", " : "", (int)mi->part_ranks[i][j]);
            }
            fputs("]}", f);
        }
        fputs("],\n \"layers\": [", f);
        for (int i = 0; i < mi->nlayers; i++) {
            dashboard_layer(f, mi, i);
        }
        fputs("]}", f);
    }
    pthread_mutex_unlock(&ddld_g.mu);
    fputs("}\n", f);
}

// The query of /dashboard.json: since (training records) and since_eval, each a decimal
// count; anything else is a bad request.
struct dash_query {
    uint64_t since, since_eval;
    char     err[160];
};

static enum MHD_Result dash_arg(void *cls, enum MHD_ValueKind kind, const char *key,
                                const char *value)
{
    (void)kind;
    struct dash_query *q = cls;
    uint64_t          *out;
    if (strcmp(key, "since") == 0) {
        out = &q->since;
    } else if (strcmp(key, "since_eval") == 0) {
        out = &q->since_eval;
    } else {
        snprintf(q->err, sizeof q->err,
                 "bad request: unknown parameter \"%.40s\" (expected since, since_eval)\n", key);
        return MHD_NO;
    }
    char *end;
    errno = 0;
    unsigned long long v =
        value != NULL && value[0] >= '0' && value[0] <= '9' ? strtoull(value, &end, 10) : 0;
    if (value == NULL || value[0] < '0' || value[0] > '9' || *end != '\0' || errno != 0) {
        snprintf(q->err, sizeof q->err,
                 "bad request: %s=\"%.40s\" is not a non-negative decimal integer\n", key,
                 value != NULL ? value : "");
        return MHD_NO;
    }
    *out = v;
    return MHD_YES;
}

// A fresh scrape written out: the Prometheus exposition (q NULL) or /dashboard.json for q.
// The text is open_memstream's (libc malloc: libmicrohttpd frees it with free()); NULL when
// out of memory.
static char *scrape_text(const struct dash_query *q, size_t *len)
{
    struct scrape *s    = ddl_malloc(sizeof *s); // ~70 KB: not on the HTTP thread's stack
    char          *text = NULL;
    FILE          *f    = NULL;
    *len                = 0;
    if (s != NULL && take_scrape(s) == 0 && (f = open_memstream(&text, len)) != NULL) {
        if (q != NULL) {
            dashboard_json(f, s, q->since, q->since_eval);
        } else {
            render(f, s);
        }
    }
    if (s != NULL) {
        ddl_free(s->ranks);
    }
    ddl_free(s);
    if (f == NULL || fclose(f) != 0) {
        free(text);
        return NULL;
    }
    return text;
}

// A text answer copied from msg (a stack buffer).
static enum MHD_Result reply_copy(struct MHD_Connection *conn, unsigned int status, const char *msg)
{
    char *copy = strdup(msg); // libc malloc: libmicrohttpd frees it with free()
    if (copy == NULL) {
        return MHD_NO;
    }
    return reply(conn, status, copy, strlen(copy), true);
}

static enum MHD_Result reply_typed(struct MHD_Connection *conn, struct MHD_Response *r,
                                   const char *type)
{
    if (r == NULL) {
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    enum MHD_Result ret = MHD_queue_response(conn, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ret;
}

bool ddld_dashboard_enabled(void)
{
    return m.enabled;
}

const char *ddld_dashboard_path(const char *url)
{
    if (strcmp(url, "/dashboard") == 0 || strcmp(url, "/dashboard/") == 0) {
        return "/dashboard";
    }
    if (strcmp(url, "/dashboard/chart.js") == 0) {
        return "/dashboard/chart.js";
    }
    return strcmp(url, "/dashboard.json") == 0 ? "/dashboard.json" : NULL;
}

bool ddld_dashboard_private(const char *path)
{
    return strcmp(path, "/dashboard.json") == 0;
}

enum MHD_Result ddld_dashboard_answer(struct MHD_Connection *conn, const char *url)
{
    static char failed[] = "out of memory\n";
    if (strcmp(url, "/dashboard") == 0) {
        return reply_typed(conn,
                           MHD_create_response_from_buffer(ddld_dashboard_html_len,
                                                           (void *)ddld_dashboard_html,
                                                           MHD_RESPMEM_PERSISTENT),
                           "text/html; charset=utf-8");
    }
    if (strcmp(url, "/dashboard/chart.js") == 0) {
        const char *path = chartjs_path();
        int         fd   = open(path, O_RDONLY | O_CLOEXEC);
        struct stat sb;
        if (fd < 0 || fstat(fd, &sb) != 0) {
            if (fd >= 0) {
                close(fd);
            }
            char msg[PATH_MAX + 160];
            snprintf(msg, sizeof msg,
                     "not found: Chart.js is not at %s (install Debian's libjs-chart.js, "
                     "deploy/install-deps.sh, or set DDLD_CHARTJS)\n",
                     path);
            return reply_copy(conn, MHD_HTTP_NOT_FOUND, msg);
        }
        // libmicrohttpd closes fd with the response
        return reply_typed(conn, MHD_create_response_from_fd((uint64_t)sb.st_size, fd),
                           "text/javascript; charset=utf-8");
    }
    // /dashboard.json
    struct dash_query q = {0};
    MHD_get_connection_values(conn, MHD_GET_ARGUMENT_KIND, dash_arg, &q);
    if (q.err[0] != '\0') {
        return reply_copy(conn, MHD_HTTP_BAD_REQUEST, q.err);
    }
    size_t len;
    char  *text = scrape_text(&q, &len);
    if (text == NULL) {
        return reply(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, failed, strlen(failed), false);
    }
    return reply_typed(conn, MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE),
                       "application/json");
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    (void)cls;
    (void)version;
    (void)upload_data;
    (void)upload_data_size;
    (void)con_cls;
    static char not_found[] =
        "not found: the metrics are at /metrics, the dashboard at /dashboard\n";
    static char not_allowed[] = "method not allowed: GET /metrics, /dashboard\n";
    static char failed[]      = "out of memory\n";
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0) {
        return reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED, not_allowed, strlen(not_allowed), false);
    }
    const char *dash = ddld_dashboard_path(url);
    if (dash != NULL) {
        return ddld_dashboard_answer(conn, dash);
    }
    if (strcmp(url, "/metrics") != 0) {
        return reply(conn, MHD_HTTP_NOT_FOUND, not_found, strlen(not_found), false);
    }
    size_t len;
    char  *text = scrape_text(NULL, &len);
    if (text == NULL) {
        return reply(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, failed, strlen(failed), false);
    }
    return reply(conn, MHD_HTTP_OK, text, len, true);
}

int ddld_metrics_start(void)
{
    if (!m.enabled || m.rank != 0) {
        return 0;
    }
    const char *addr = m.cfg->metrics_listen;
    int         family, port;
    int         fd = ddld_listen_open("--metrics-listen", addr, &family, &port);
    if (fd < 0) {
        return -1;
    }
    unsigned int flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG;
    if (family == AF_INET6) {
        flags |= MHD_USE_IPv6;
    }
    m.mhd = MHD_start_daemon(flags, 0, NULL, NULL, on_request, NULL, MHD_OPTION_EXTERNAL_LOGGER,
                             ddld_mhd_log, "metrics", MHD_OPTION_LISTEN_SOCKET, fd,
                             MHD_OPTION_CONNECTION_LIMIT, (unsigned int)16,
                             MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)10, MHD_OPTION_END);
    if (m.mhd == NULL) {
        ddld_log("--metrics-listen %s: libmicrohttpd did not start", addr);
        close(fd);
        return -1;
    }
    if (m.cfg->metrics_address_file != NULL &&
        ddld_write_address("--metrics-address-file", m.cfg->metrics_address_file, addr, port) !=
            0) {
        ddld_metrics_stop();
        return -1;
    }
    ddld_log("metrics on http://%.*s:%d/metrics", (int)(strrchr(addr, ':') - addr), addr, port);
    return 0;
}

void ddld_metrics_stop(void)
{
    if (m.mhd != NULL) {
        MHD_stop_daemon(m.mhd); // joins the polling thread, closes the socket
        m.mhd = NULL;
    }
    atomic_store(&m.svc, NULL);
}
