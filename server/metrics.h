// server/metrics.h: distdld's Prometheus endpoint (--metrics-listen HOST:PORT).
//
// Rank 0 serves `GET /metrics` in the Prometheus text format (version 0.0.4) from
// libmicrohttpd's own polling thread; docs/METRICS.md lists every family. The numbers
// come from three places:
//   - hooks on rank 0 (RPC completions from service.c, steps and checkpoints from
//     dispatch.c), under one mutex held for a few additions;
//   - rank 0's snapshot ddld_g (step, loss, queues), read at scrape time;
//   - every rank's primitive byte counters and resident memory, gathered onto rank 0 by
//     one fixed-size MPI_Gather at the end of each command (ddld_metrics_collect), so
//     they are current as of the last command that ended (a long Train: its start).
// Without --metrics-listen every call here returns at once and nothing is gathered.
#ifndef DDLD_METRICS_H
#define DDLD_METRICS_H

#include <stdbool.h>

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include <grpc/status.h>
#include <microhttpd.h>

#include "config.h"
#include "ddl/tensor.h"

typedef struct ddld_service ddld_service; // service.h

// Checks the metrics options: --metrics-listen is HOST:PORT with a numeric IPv4 address
// or a bracketed IPv6 one and a port in 0..65535 (0: any free port), and
// --metrics-address-file comes with it. Pure, so every rank reaches the same verdict.
// Returns 0, or -1 with a message in err.
int ddld_metrics_check_config(const ddld_config *cfg, char *err, size_t errlen);

// Every rank, after MPI_Init: remembers cfg (borrowed) and, on rank 0, allocates the
// gather buffers. Metrics are on when cfg->metrics_listen is set (the same on all ranks).
// Returns 0, or -1 after a logged reason when rank 0 is out of memory (not collective:
// the caller agrees with the other ranks before any of them gathers).
int ddld_metrics_init(const ddld_config *cfg, int rank, int size);
// Every rank, at exit (after ddld_metrics_stop on rank 0).
void ddld_metrics_free(void);

// Every rank, at the end of every command but QUIT, in the same order on all ranks:
// gathers each rank's counters onto rank 0 over comm. Collective when metrics are on;
// allocates nothing.
void ddld_metrics_collect(MPI_Comm comm);

// Rank 0: binds cfg->metrics_listen, starts the HTTP thread and writes
// --metrics-address-file. Returns 0, or -1 after logging why (nothing left running).
int ddld_metrics_start(void);
// Rank 0: the service whose request queue depth is reported (NULL: none yet). The
// service must outlive the HTTP thread: stop metrics before ddld_service_stop.
void ddld_metrics_attach(ddld_service *svc);
// Rank 0: stops the HTTP thread (waits for scrapes in progress). Idempotent.
void ddld_metrics_stop(void);

// ---- inference statistics (the KServe statistics extension; kept without --metrics-listen)

#define DDLD_STATS_SIZES 64 // distinct command sizes counted (later new sizes are not)
typedef struct ddld_infer_stats {
    uint64_t success_count, fail_count;   // Predict and ModelInfer calls, by outcome
    double   success_s, fail_s;           // their time from arrival to answer
    uint64_t queue_count;                 // calls that ran in a successful command
    double   queue_s;                     // their wait from arrival to the command's start
    uint64_t exec_count, inference_count; // successful commands, and the rows they ran
    double   exec_s;                      // the commands' time on the ranks
    double   last_unix;                   // end of the last successful command (0: none)
    int      nsizes;
    struct {
        int64_t  rows;
        uint64_t count;
        double   exec_s;
    } sizes[DDLD_STATS_SIZES]; // per command size, in the order first seen
} ddld_infer_stats;

// A copy of the statistics since start. Any thread.
void ddld_metrics_infer_stats(ddld_infer_stats *out);

// ---- hooks (rank 0, any thread) ---------------------------------------------------------

// A call ended with `code` after `seconds` since it arrived. method: a ddld_method, or
// DDLD_M_COUNT for an unknown method.
void ddld_metrics_rpc(int method, grpc_status_code code, double seconds);
// Training advanced by `steps` optimizer steps over `images` samples; images_per_s is the
// current throughput (<= 0: unknown, keep the previous value).
// Rank 0, main thread: one batched inference command of `rows` rows answering n calls,
// which waited delays[i] seconds from arrival to its start; interleaved: at a Train's step
// boundary.
// ok: the command succeeded, taking exec_s seconds (the statistics below count only those).
void ddld_metrics_batch(int64_t rows, const double *delays, int n, bool interleaved, bool ok,
                        double exec_s);
// Rank 0, main thread: a Train lent the ranks to inference for `seconds` at a step boundary.
void ddld_metrics_interlude(double seconds);
// Rank 0, main thread: a Train begins (distdl_inference_interlude_max_seconds starts anew).
void ddld_metrics_train_begin(void);
void ddld_metrics_steps(int64_t steps, int64_t images, double images_per_s);
// A durable checkpoint was written.
void ddld_metrics_checkpoint(void);

// ---- the dashboard's pages (libmicrohttpd's threads) ----------------------------------------
// Served on --metrics-listen, and on --http-listen under that listener's tokens and TLS
// (http.c) while --metrics-listen collects its figures. ddld_dashboard_path: the canonical
// path of a dashboard URL ("/dashboard", "/dashboard/chart.js" or "/dashboard.json", a
// static string), NULL for any other URL. ddld_dashboard_answer answers a GET or HEAD of
// one. Only /dashboard.json holds the model's figures; the page and Chart.js hold none.
bool            ddld_dashboard_enabled(void);
const char     *ddld_dashboard_path(const char *url);
bool            ddld_dashboard_private(const char *path);
enum MHD_Result ddld_dashboard_answer(struct MHD_Connection *conn, const char *path);

// ---- the dashboard's history (GET /dashboard.json on --metrics-listen) --------------------

#define DDLD_HIST_TRAIN 512 // training records kept (the newest)
#define DDLD_HIST_EVAL 64   // evaluations kept
// Rank 0, main thread: a training record (a Step, or a Train's progress report) at the
// model's step `step`; accuracy < 0 (the engine's "none", dense losses) is kept as NaN.
void ddld_metrics_train_point(int64_t step, double loss, double accuracy, double images_per_s);
// Rank 0, main thread: an evaluation of `count` samples at the model's step `step`
// (accuracy as above).
void ddld_metrics_eval_point(int64_t step, int64_t count, double loss, double accuracy);

// What the dashboard needs to know of the model to read a batch of samples and outputs.
typedef struct ddld_dash_model {
    ddl_dtype dt;    // of the samples, the outputs and dense targets
    ddl_shape in;    // per sample: [C, H, W] (or [H, W]) an image, [C, D, H, W] a volume
    ddl_shape out;   // per sample: [classes] a classifier, [C, spatial...] otherwise
    bool      dense; // targets shaped like out in dt; else INT64 labels (one per sample,
                     // or one per output voxel for segmentation)
} ddld_dash_model;

// Rank 0, main thread: the first n (<= DDLD_DASH_SAMPLES) samples of the split just
// evaluated ("test", "train" or "inline"), values as the model saw them, with their targets
// and the model's outputs for them. A classifier keeps each sample's label and predicted
// class, and the first channel of a picture of at most DDLD_DASH_PIXELS values per channel
// (a volume or a large image is listed without its picture). A model whose output has the
// input's spatial dims (segmentation, dense targets) keeps, for spatial slices of at most
// DDLD_DASH_PIXELS values, the slice at the middle of every spatial dim but the last two
// of: the input's first channel, the target (labels; dense: its first channel) and the
// prediction (the argmax over the classes; dense: the output's first channel).
#define DDLD_DASH_SAMPLES 8
#define DDLD_DASH_PIXELS 4096
void ddld_metrics_eval_samples(const char *split, const ddld_dash_model *dm, const void *x,
                               const void *targets, const void *out, int64_t n);

#endif // DDLD_METRICS_H
