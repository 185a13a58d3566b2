// bench-load: many concurrent clients against a running distdld (load), or long cycles of
// train + predict + pull while watching the daemon's memory, open files and threads (soak).
//
//   bench-load --address A [--rank-pids P0,P1,..] load [--clients N] [--connections C]
//              [--seconds D] [--mix PREDICT,STATUS,HEALTH,PULL] [--images M] [--timeout S]
//   bench-load --address A  --rank-pids P0,P1,..  soak [--seconds D] [--steps K]
//              [--warmup F] [--rss-slack-mb X] [--checkpoint-dir DIR]
//
// load: N client threads (default 100) for D seconds (default 60), each in a closed loop
//   (the next call when the last one returned), choosing a method by the mix (default
//   90 % Predict of one Fashion-MNIST test image, 7 % GetStatus, 2 % Health, 1 %
//   PullWeights). Thread i uses connection i % C; C defaults to N, every client with its
//   own TCP connection as separate users' processes would have (C < N: threads share, as
//   in a multi-threaded front end). Every outcome is counted per method and gRPC code.
//   Expected outcomes: OK, and RESOURCE_EXHAUSTED when the daemon's request queue is full
//   (backpressure: counted apart; the client retries the call after a jittered backoff,
//   and the latency from its first attempt is reported as "with retries").
//   Anything else is a failure, as is a Predict whose logits differ in any bit from the
//   reference Predict of the same image made before the load, a pull whose weights differ
//   from the reference pull, a status without the model or a health that is not SERVING.
//   After the load every client disconnects; the daemon must answer health and the
//   reference Predicts again, and rank 0's open files must come back to (at most) the count
//   it had before the load (with --rank-pids).
// soak: one client (a training notebook) repeats cycles for D seconds (default 600): Train
//   K steps (default 20) over the daemon's dataset, Predict 8 test images twice (bitwise
//   equal), PullWeights, GetStatus (step advanced by K); every third cycle a short-lived
//   second connection (health + status, like a CLI call); every fifth a Checkpoint into
//   DIR when given. After each cycle every rank's VmRSS, open fds and threads are sampled
//   (fds/threads re-read until two reads 100 ms apart agree, and for up to 3 s more while
//   they differ from the previous cycle's, so a socket still being closed is not counted). After
//   the warm-up (fraction F of the time, default 0.2) open fds and threads must be exactly constant
//   on every rank, and the RSS drift (mean of the last fifth of the samples minus the first fifth
//   after warm-up) at most X MB (default 2).
//
// Exit status: 0 pass, 1 failure, 2 usage, 7 skip (no Fashion-MNIST test set).
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "bench_util.h"
#include "ddl_client.h"

#define MAX_RANKS 64
#define NCODES 18 // gRPC codes 0..16, and 17 for a local (client-side) error
#define CODE_LOCAL 17
#define NBUCKETS (40 * 32) // latency histogram: 32 buckets per octave of ns, up to 2^40 ns

static const char *data_dir = "/usr/share/datasets/fashion-mnist";

// ---- test images ---------------------------------------------------------------------

static uint8_t *test_px; // the first n test images, 784 bytes each

static int load_images(int n)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/t10k-images-idx3-ubyte.gz", data_dir);
    gzFile  g = gzopen(path, "rb");
    uint8_t hdr[16];
    test_px = malloc((size_t)n * 784);
    if (!g || gzread(g, hdr, 16) != 16 || gzread(g, test_px, (unsigned)n * 784) != n * 784) {
        if (g)
            gzclose(g);
        return -1;
    }
    gzclose(g);
    return 0;
}

// Images [first, first + n) as a UINT8 tensor [n, 1, 28, 28] (borrowed data).
static ddl_client_tensor images(int first, int n)
{
    return (ddl_client_tensor){.name  = "x",
                               .dtype = DDL_WIRE_UINT8,
                               .ndim  = 4,
                               .shape = {n, 1, 28, 28},
                               .data  = test_px + (size_t)first * 784,
                               .bytes = (size_t)n * 784};
}

// ---- daemon processes ----------------------------------------------------------------

static pid_t rank_pid[MAX_RANKS];
static int   nranks;

static int parse_pids(const char *s)
{
    char *copy = strdup(s), *save = NULL;
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (nranks == MAX_RANKS || atoi(t) <= 0) {
            free(copy);
            return -1;
        }
        rank_pid[nranks++] = (pid_t)atoi(t);
    }
    free(copy);
    return nranks > 0 ? 0 : -1;
}

// fds and threads of pid once two reads 100 ms apart agree (at most ~3 s), RSS of the last.
// With a previous sample `prev` (NULL: none), a count that differs from it is re-read for
// up to 3 s more before it is believed: on a loaded machine the daemon may close the
// socket of a client that just left a little later, and only a lasting change is a leak.
static bench_proc_sample settled_sample(pid_t pid, const bench_proc_sample *prev)
{
    bench_proc_sample a = bench_proc_read(pid);
    for (int i = 0; i < 30; i++) {
        usleep(100000);
        bench_proc_sample b = bench_proc_read(pid);
        if (b.fds == a.fds && b.threads == a.threads) {
            a = b;
            break;
        }
        a = b;
    }
    for (int i = 0; prev && i < 30 && (a.fds != prev->fds || a.threads != prev->threads); i++) {
        usleep(100000);
        a = bench_proc_read(pid);
    }
    return a;
}

// ---- outcome counting ----------------------------------------------------------------

enum { M_PREDICT, M_STATUS, M_HEALTH, M_PULL, M_N };
static const char *method_name[M_N] = {"Predict", "GetStatus", "Health", "PullWeights"};

typedef struct tally {
    uint64_t codes[M_N][NCODES];
    uint32_t hist[M_N][NBUCKETS]; // latency of OK calls
    uint32_t e2e[M_N][NBUCKETS];  // first attempt to OK, across refusals and backoffs
    uint64_t e2e_n[M_N];
    double   max_s[M_N];
    double   sum_s[M_N];
    uint64_t wrong; // OK replies with wrong content
    uint64_t backoffs;
    char     first_error[512];
} tally;

static int bucket_of(double s)
{
    double ns = s * 1e9;
    if (ns < 1)
        return 0;
    int b = (int)(log2(ns) * 32);
    return b < 0 ? 0 : b >= NBUCKETS ? NBUCKETS - 1 : b;
}

// The q-quantile of a histogram: the geometric middle of the bucket holding it.
static double hist_quantile(const uint32_t *h, uint64_t n, double q)
{
    if (n == 0)
        return 0;
    uint64_t rank = (uint64_t)ceil(q * (double)n), seen = 0;
    if (rank < 1)
        rank = 1;
    for (int b = 0; b < NBUCKETS; b++) {
        seen += h[b];
        if (seen >= rank)
            return exp2(((double)b + 0.5) / 32) * 1e-9;
    }
    return exp2(NBUCKETS / 32.0) * 1e-9;
}

static void note_error(tally *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note_error(tally *t, const char *fmt, ...)
{
    if (t->first_error[0])
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->first_error, sizeof t->first_error, fmt, ap);
    va_end(ap);
}

// The gRPC code of the call that returned st on this thread (CODE_LOCAL: a local error).
static int code_of(ddl_status st)
{
    if (st == DDL_OK)
        return 0;
    int code = ddl_client_last_code();
    return code == DDL_RPC_OK || code < 0 || code > 16 ? CODE_LOCAL : code;
}

static const char *code_label(int code)
{
    return code == CODE_LOCAL ? "LOCAL_ERROR" : ddl_client_code_name(code);
}

// ---- load ------------------------------------------------------------------------------

typedef struct load_cfg {
    const char *address;
    int         clients, connections, images;
    double      seconds, timeout_s;
    double      mix[M_N]; // cumulative, ends at 1
} load_cfg;

static ddl_client_tensor  *ref_logits; // per image
static ddl_client_weights *ref_weights;
static atomic_int          stop_load;

typedef struct worker {
    pthread_t     thread;
    int           id;
    ddl_client_t *c;
    uint64_t      rng;
    tally         t;
    atomic_ullong ok_now, refused_now; // running totals the main thread reads
} worker;

static const load_cfg *lcfg;

static uint64_t next_rand(uint64_t *s)
{
    // xorshift64*
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

static int same_weights(const ddl_client_weights *a, const ddl_client_weights *b)
{
    if (a->count != b->count)
        return 0;
    for (int64_t i = 0; i < a->count; i++)
        if (a->tensors[i].bytes != b->tensors[i].bytes ||
            strcmp(a->tensors[i].name, b->tensors[i].name) != 0 ||
            memcmp(a->tensors[i].data, b->tensors[i].data, a->tensors[i].bytes) != 0)
            return 0;
    return 1;
}

// One call of method m (image img for a Predict); its outcome goes into w->t. Returns the
// gRPC code.
static int one_call(worker *w, int m, int img)
{
    tally     *t  = &w->t;
    ddl_status st = DDL_OK;
    double     t0 = bench_now();
    switch (m) {
    case M_PREDICT: {
        ddl_client_tensor x = images(img, 1), y = {0};
        st = ddl_client_predict(w->c, &x, &y);
        if (st == DDL_OK &&
            (y.bytes != ref_logits[img].bytes || memcmp(y.data, ref_logits[img].data, y.bytes))) {
            t->wrong++;
            note_error(t, "Predict: image %d: logits differ from the reference", img);
        }
        ddl_client_tensor_release(&y);
        break;
    }
    case M_STATUS: {
        ddl_client_status_info s;
        st = ddl_client_get_status(w->c, &s);
        if (st == DDL_OK && !s.has_model) {
            t->wrong++;
            note_error(t, "GetStatus: no model");
        }
        break;
    }
    case M_HEALTH: {
        ddl_health_status h;
        st = ddl_client_health_check(w->c, "", &h);
        if (st == DDL_OK && h != DDL_HEALTH_SERVING) {
            t->wrong++;
            note_error(t, "Health: status %d, not SERVING", (int)h);
        }
        break;
    }
    default: {
        ddl_client_weights *pw = NULL;
        st                     = ddl_client_pull_weights(w->c, &pw);
        if (st == DDL_OK && !same_weights(pw, ref_weights)) {
            t->wrong++;
            note_error(t, "PullWeights: the weights differ from the reference pull");
        }
        ddl_client_weights_destroy(&pw);
        break;
    }
    }
    double dt   = bench_now() - t0;
    int    code = code_of(st);
    t->codes[m][code]++;
    if (code == 0)
        atomic_fetch_add_explicit(&w->ok_now, 1, memory_order_relaxed);
    else if (code == DDL_RPC_RESOURCE_EXHAUSTED)
        atomic_fetch_add_explicit(&w->refused_now, 1, memory_order_relaxed);
    if (code == 0) {
        t->hist[m][bucket_of(dt)]++;
        t->sum_s[m] += dt;
        if (dt > t->max_s[m])
            t->max_s[m] = dt;
    } else if (code != DDL_RPC_RESOURCE_EXHAUSTED) {
        note_error(t, "%s: %s", method_name[m], ddl_last_error());
    }
    return code;
}

// A closed loop: choose a method by the mix, call it until it is not refused, repeat.
// A refusal (RESOURCE_EXHAUSTED, the daemon's queue is full) is retried after a jittered
// exponential backoff, as gRPC's retry policies do: a uniform wait in [b/2, b] with b =
// 10 ms doubling to at most 640 ms.
static void *worker_main(void *arg)
{
    worker *w = arg;
    while (!atomic_load(&stop_load)) {
        double u = (double)(next_rand(&w->rng) >> 11) * 0x1.0p-53;
        int    m = 0;
        while (m < M_N - 1 && u >= lcfg->mix[m])
            m++;
        int    img     = (int)(next_rand(&w->rng) % (uint64_t)lcfg->images);
        double t0      = bench_now();
        int    backoff = 10; // ms
        int    code;
        while ((code = one_call(w, m, img)) == DDL_RPC_RESOURCE_EXHAUSTED &&
               !atomic_load(&stop_load)) {
            w->t.backoffs++;
            uint64_t us = (uint64_t)backoff * 500;
            usleep((useconds_t)(us + next_rand(&w->rng) % (us + 1)));
            backoff = backoff < 640 ? 2 * backoff : 640;
        }
        if (code == 0) {
            w->t.e2e[m][bucket_of(bench_now() - t0)]++;
            w->t.e2e_n[m]++;
        }
    }
    return NULL;
}

static int connect_to(const char *address, double timeout_s, int own, ddl_client_t **c)
{
    ddl_client_options o = ddl_client_options_default();
    o.call_timeout_s     = timeout_s;
    o.own_connection     = own;
    if (ddl_client_connect(address, &o, c) != DDL_OK) {
        fprintf(stderr, "bench-load: connect %s: %s\n", address, ddl_last_error());
        return -1;
    }
    return 0;
}

// The reference logits of every image and the reference weights, one call at a time.
static int take_references(ddl_client_t *c, int n)
{
    ref_logits = calloc((size_t)n, sizeof *ref_logits);
    for (int i = 0; i < n; i++) {
        ddl_client_tensor x = images(i, 1);
        if (ddl_client_predict(c, &x, &ref_logits[i]) != DDL_OK) {
            fprintf(stderr, "bench-load: reference Predict: %s\n", ddl_last_error());
            return -1;
        }
    }
    if (ddl_client_pull_weights(c, &ref_weights) != DDL_OK) {
        fprintf(stderr, "bench-load: reference PullWeights: %s\n", ddl_last_error());
        return -1;
    }
    return 0;
}

// After the load: health, every reference Predict bitwise again, status unchanged.
static int check_after(const load_cfg *cfg, int64_t step_before)
{
    ddl_client_t *c;
    if (connect_to(cfg->address, cfg->timeout_s, 1, &c))
        return -1;
    int               bad = 0;
    ddl_health_status h;
    if (ddl_client_health_check(c, "", &h) != DDL_OK || h != DDL_HEALTH_SERVING) {
        fprintf(stderr, "bench-load: after the load: health not SERVING: %s\n", ddl_last_error());
        bad = 1;
    }
    for (int i = 0; i < cfg->images && !bad; i++) {
        ddl_client_tensor x = images(i, 1), y = {0};
        if (ddl_client_predict(c, &x, &y) != DDL_OK || y.bytes != ref_logits[i].bytes ||
            memcmp(y.data, ref_logits[i].data, y.bytes)) {
            fprintf(stderr, "bench-load: after the load: Predict of image %d differs or fails\n",
                    i);
            bad = 1;
        }
        ddl_client_tensor_release(&y);
    }
    ddl_client_status_info s;
    if (!bad && (ddl_client_get_status(c, &s) != DDL_OK || s.step != step_before)) {
        fprintf(stderr, "bench-load: after the load: step moved or GetStatus failed\n");
        bad = 1;
    }
    ddl_client_destroy(&c);
    return bad ? -1 : 0;
}

static int run_load(const load_cfg *cfg)
{
    lcfg = cfg;
    if (load_images(cfg->images) != 0) {
        printf("SKIP: no Fashion-MNIST test images under %s\n", data_dir);
        return 7;
    }
    ddl_client_t *c0;
    if (connect_to(cfg->address, cfg->timeout_s, 1, &c0))
        return 1;
    ddl_client_status_info s0;
    if (ddl_client_get_status(c0, &s0) != DDL_OK || !s0.has_model) {
        fprintf(stderr, "bench-load: the daemon has no model (start it with --model)\n");
        return 1;
    }
    if (take_references(c0, cfg->images))
        return 1;
    ddl_client_destroy(&c0);
    bench_proc_sample base = {-1, -1, -1};
    if (nranks > 0)
        base = settled_sample(rank_pid[0], NULL);
    printf("bench-load: %d clients on %d connections for %.0f s against %s (model %s, %d "
           "ranks, request queue %d); mix Predict %.0f%% GetStatus %.0f%% Health %.0f%% "
           "PullWeights %.0f%%; %d test images\n",
           cfg->clients, cfg->connections, cfg->seconds, cfg->address, s0.model_name, s0.world_size,
           s0.queue_capacity, 100 * cfg->mix[0], 100 * (cfg->mix[1] - cfg->mix[0]),
           100 * (cfg->mix[2] - cfg->mix[1]), 100 * (1 - cfg->mix[2]), cfg->images);
    if (nranks > 0)
        printf("rank 0 before: %ld fds, %ld threads, RSS %.1f MB\n", base.fds, base.threads,
               base.rss_kb / 1024.0);

    ddl_client_t **conn = calloc((size_t)cfg->connections, sizeof *conn);
    for (int i = 0; i < cfg->connections; i++)
        if (connect_to(cfg->address, cfg->timeout_s, 1, &conn[i]))
            return 1;
    worker *w = calloc((size_t)cfg->clients, sizeof *w);
    for (int i = 0; i < cfg->clients; i++) {
        w[i].id  = i;
        w[i].c   = conn[i % cfg->connections];
        w[i].rng = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
    }
    double cpu0 = bench_cpu_self(), t0 = bench_now();
    for (int i = 0; i < cfg->clients; i++)
        pthread_create(&w[i].thread, NULL, worker_main, &w[i]);
    long   peak_fds = 0, peak_threads = 0, peak_rss = 0;
    double next_report = t0 + 10;
    while (bench_now() - t0 < cfg->seconds) {
        usleep(250000);
        if (nranks > 0) {
            bench_proc_sample p = bench_proc_read(rank_pid[0]);
            peak_fds            = p.fds > peak_fds ? p.fds : peak_fds;
            peak_threads        = p.threads > peak_threads ? p.threads : peak_threads;
            peak_rss            = p.rss_kb > peak_rss ? p.rss_kb : peak_rss;
        }
        if (bench_now() >= next_report) {
            uint64_t ok = 0, refused = 0;
            for (int i = 0; i < cfg->clients; i++) {
                ok += atomic_load_explicit(&w[i].ok_now, memory_order_relaxed);
                refused += atomic_load_explicit(&w[i].refused_now, memory_order_relaxed);
            }
            printf("  %5.0f s: %llu OK, %llu RESOURCE_EXHAUSTED\n", bench_now() - t0,
                   (unsigned long long)ok, (unsigned long long)refused);
            fflush(stdout);
            next_report += 10;
        }
    }
    atomic_store(&stop_load, 1);
    for (int i = 0; i < cfg->clients; i++)
        pthread_join(w[i].thread, NULL);
    double wall = bench_now() - t0, cpu = bench_cpu_self() - cpu0;

    // Merge and report.
    tally *all = calloc(1, sizeof *all);
    for (int i = 0; i < cfg->clients; i++) {
        for (int m = 0; m < M_N; m++) {
            for (int k = 0; k < NCODES; k++)
                all->codes[m][k] += w[i].t.codes[m][k];
            for (int b = 0; b < NBUCKETS; b++) {
                all->hist[m][b] += w[i].t.hist[m][b];
                all->e2e[m][b] += w[i].t.e2e[m][b];
            }
            all->e2e_n[m] += w[i].t.e2e_n[m];
            all->sum_s[m] += w[i].t.sum_s[m];
            all->max_s[m] = w[i].t.max_s[m] > all->max_s[m] ? w[i].t.max_s[m] : all->max_s[m];
        }
        all->wrong += w[i].t.wrong;
        all->backoffs += w[i].t.backoffs;
        if (!all->first_error[0] && w[i].t.first_error[0])
            snprintf(all->first_error, sizeof all->first_error, "client %d: %s", i,
                     w[i].t.first_error);
    }
    uint64_t ok_total = 0, unexpected = 0, refused = 0;
    printf("%-12s %9s %8s %8s %9s %9s %9s %9s %9s  other codes\n", "method", "OK", "OK/s",
           "refused", "mean ms", "p50 ms", "p90 ms", "p99 ms", "max ms");
    for (int m = 0; m < M_N; m++) {
        uint64_t ok = all->codes[m][0], other = 0;
        char     others[256] = "";
        for (int k = 1; k < NCODES; k++) {
            if (k == DDL_RPC_RESOURCE_EXHAUSTED || all->codes[m][k] == 0)
                continue;
            other += all->codes[m][k];
            size_t len = strlen(others);
            snprintf(others + len, sizeof others - len, "%s %s=%llu", len ? "," : "", code_label(k),
                     (unsigned long long)all->codes[m][k]);
        }
        ok_total += ok;
        unexpected += other;
        refused += all->codes[m][DDL_RPC_RESOURCE_EXHAUSTED];
        printf("%-12s %9llu %8.1f %8llu %9.3f %9.3f %9.3f %9.3f %9.3f  %s\n", method_name[m],
               (unsigned long long)ok, ok / wall,
               (unsigned long long)all->codes[m][DDL_RPC_RESOURCE_EXHAUSTED],
               ok ? 1e3 * all->sum_s[m] / ok : 0,
               1e3 * fmin(hist_quantile(all->hist[m], ok, 0.5), all->max_s[m]),
               1e3 * fmin(hist_quantile(all->hist[m], ok, 0.9), all->max_s[m]),
               1e3 * fmin(hist_quantile(all->hist[m], ok, 0.99), all->max_s[m]),
               1e3 * all->max_s[m], other ? others : "none");
    }
    printf("with retries (first attempt to OK, across refusals and backoffs):\n");
    for (int m = 0; m < M_N; m++)
        if (all->e2e_n[m] > 0)
            printf("%-12s %9llu %8s %8s %9s %9.3f %9.3f %9.3f\n", method_name[m],
                   (unsigned long long)all->e2e_n[m], "", "", "",
                   1e3 * hist_quantile(all->e2e[m], all->e2e_n[m], 0.5),
                   1e3 * hist_quantile(all->e2e[m], all->e2e_n[m], 0.9),
                   1e3 * hist_quantile(all->e2e[m], all->e2e_n[m], 0.99));
    printf("throughput: %.1f OK calls/s over %.1f s (%llu calls); backpressure: %llu "
           "RESOURCE_EXHAUSTED (%.1f%% of attempts), retried after a 5-640 ms backoff\n",
           ok_total / wall, wall, (unsigned long long)ok_total, (unsigned long long)refused,
           100.0 * (double)refused / (double)(ok_total + refused + unexpected));
    printf("load generator CPU: %.1f s (%.0f%% of one core)\n", cpu, 100 * cpu / wall);
    if (nranks > 0)
        printf("rank 0 during the load (peak of 0.25 s samples): %ld fds, %ld threads, RSS %.1f "
               "MB\n",
               peak_fds, peak_threads, peak_rss / 1024.0);
    int fail = 0;
    if (unexpected || all->wrong) {
        fprintf(stderr, "bench-load: FAIL: %llu unexpected codes, %llu wrong replies; first: %s\n",
                (unsigned long long)unexpected, (unsigned long long)all->wrong, all->first_error);
        fail = 1;
    }
    if (all->codes[M_PREDICT][0] == 0) {
        fprintf(stderr, "bench-load: FAIL: no Predict succeeded\n");
        fail = 1;
    }

    // Every client disconnects; the daemon must serve as before and let go of the sockets.
    for (int i = 0; i < cfg->connections; i++)
        ddl_client_destroy(&conn[i]);
    if (check_after(cfg, s0.step))
        fail = 1;
    else
        printf("after the load: health SERVING, %d reference Predicts bitwise equal, step "
               "unchanged (%lld)\n",
               cfg->images, (long long)s0.step);
    if (nranks > 0) {
        bench_proc_sample after = {-1, -1, -1};
        double            t1    = bench_now();
        while (bench_now() - t1 < 20) {
            after = settled_sample(rank_pid[0], &base);
            if (after.fds <= base.fds)
                break;
        }
        printf("rank 0 after the clients left: %ld fds (before %ld), %ld threads (before %ld), "
               "RSS %.1f MB (before %.1f)\n",
               after.fds, base.fds, after.threads, base.threads, after.rss_kb / 1024.0,
               base.rss_kb / 1024.0);
        if (after.fds > base.fds) {
            fprintf(stderr,
                    "bench-load: FAIL: rank 0 holds %ld fds after the clients left, %ld "
                    "before\n",
                    after.fds, base.fds);
            fail = 1;
        }
    }
    printf("RESULT %s\n", fail ? "FAIL" : "PASS");
    free(all);
    free(w);
    free(conn);
    return fail;
}

// ---- soak ------------------------------------------------------------------------------

typedef struct soak_cfg {
    const char *address;
    const char *checkpoint_dir;
    double      seconds, warmup, rss_slack_mb, timeout_s;
    int         steps;
} soak_cfg;

#define SOAK_RANKS 16 // ranks sampled at most

typedef struct soak_sample {
    double            t;
    int64_t           step;
    bench_proc_sample rank[SOAK_RANKS];
    bench_proc_sample self;
} soak_sample;

#define SOAK_IMAGES 8

static int fail_call(const char *what)
{
    fprintf(stderr, "bench-load: soak: %s: %s (%s)\n", what, ddl_last_error(),
            ddl_client_code_name(ddl_client_last_code()));
    return -1;
}

// One cycle; *step is the daemon's step, advanced by the Train.
static int soak_cycle(const soak_cfg *cfg, ddl_client_t *c, int k, int64_t *step)
{
    ddl_client_train_request tr   = {.steps = cfg->steps, .progress_every = cfg->steps};
    ddl_client_progress      last = {0};
    if (ddl_client_train(c, &tr, NULL, NULL, &last) != DDL_OK)
        return fail_call("Train");
    if (!last.finished || last.step != *step + cfg->steps) {
        fprintf(stderr, "bench-load: soak: Train ended at step %lld (finished %d), expected %lld\n",
                (long long)last.step, last.finished, (long long)(*step + cfg->steps));
        return -1;
    }
    *step               = last.step;
    ddl_client_tensor x = images(0, SOAK_IMAGES), y1 = {0}, y2 = {0};
    int               rc = 0;
    if (ddl_client_predict(c, &x, &y1) != DDL_OK || ddl_client_predict(c, &x, &y2) != DDL_OK)
        rc = fail_call("Predict");
    else if (y1.bytes != y2.bytes || memcmp(y1.data, y2.data, y1.bytes) != 0 ||
             y1.shape[0] != SOAK_IMAGES) {
        fprintf(stderr, "bench-load: soak: two Predicts of the same images differ\n");
        rc = -1;
    }
    ddl_client_tensor_release(&y1);
    ddl_client_tensor_release(&y2);
    if (rc)
        return rc;
    ddl_client_weights *w = NULL;
    if (ddl_client_pull_weights(c, &w) != DDL_OK || w->count < 1)
        return fail_call("PullWeights");
    ddl_client_weights_destroy(&w);
    ddl_client_status_info s;
    if (ddl_client_get_status(c, &s) != DDL_OK)
        return fail_call("GetStatus");
    if (s.step != *step || strcmp(s.state, "idle") != 0) {
        fprintf(stderr, "bench-load: soak: status step %lld state %s, expected step %lld idle\n",
                (long long)s.step, s.state, (long long)*step);
        return -1;
    }
    if (k % 3 == 2) {
        // A short-lived connection, as each `distdl status` makes.
        ddl_client_t     *c2;
        ddl_health_status h;
        if (connect_to(cfg->address, cfg->timeout_s, 1, &c2))
            return -1;
        if (ddl_client_health_check(c2, "", &h) != DDL_OK || h != DDL_HEALTH_SERVING ||
            ddl_client_get_status(c2, &s) != DDL_OK)
            rc = fail_call("short connection: Health/GetStatus");
        ddl_client_destroy(&c2);
        if (rc)
            return rc;
    }
    if (cfg->checkpoint_dir && k % 5 == 4) {
        ddl_client_checkpoint_result r;
        if (ddl_client_checkpoint(c, cfg->checkpoint_dir, &r) != DDL_OK)
            return fail_call("Checkpoint");
        if (!r.durable || r.step != *step) {
            fprintf(stderr, "bench-load: soak: checkpoint step %lld durable %d\n",
                    (long long)r.step, r.durable);
            return -1;
        }
    }
    return 0;
}

// Mean RSS (MB) of rank r over samples [a, b).
static double mean_rss(const soak_sample *s, int a, int b, int r)
{
    double sum = 0;
    for (int i = a; i < b; i++)
        sum += r < 0 ? (double)s[i].self.rss_kb : (double)s[i].rank[r].rss_kb;
    return sum / 1024.0 / (b - a);
}

// Least-squares slope of RSS (MB per minute) of rank r over samples [a, b).
static double rss_slope(const soak_sample *s, int a, int b, int r)
{
    double mt = 0, my = 0, n = b - a;
    for (int i = a; i < b; i++) {
        mt += s[i].t;
        my += r < 0 ? (double)s[i].self.rss_kb : (double)s[i].rank[r].rss_kb;
    }
    mt /= n;
    my /= n;
    double num = 0, den = 0;
    for (int i = a; i < b; i++) {
        double y = r < 0 ? (double)s[i].self.rss_kb : (double)s[i].rank[r].rss_kb;
        num += (s[i].t - mt) * (y - my);
        den += (s[i].t - mt) * (s[i].t - mt);
    }
    return den > 0 ? num / den / 1024.0 * 60.0 : 0;
}

static int run_soak(const soak_cfg *cfg)
{
    if (nranks == 0 || nranks > SOAK_RANKS) {
        fprintf(stderr, "bench-load: soak needs --rank-pids (at most %d)\n", SOAK_RANKS);
        return 2;
    }
    if (load_images(SOAK_IMAGES) != 0) {
        printf("SKIP: no Fashion-MNIST test images under %s\n", data_dir);
        return 7;
    }
    ddl_client_t *c;
    if (connect_to(cfg->address, 0, 1, &c)) // Train has no deadline; unary calls neither
        return 1;
    ddl_client_status_info s0;
    if (ddl_client_get_status(c, &s0) != DDL_OK || !s0.has_model) {
        fprintf(stderr, "bench-load: the daemon has no model (start it with --model)\n");
        return 1;
    }
    printf("bench-load soak: %.0f s of cycles (Train %d steps, Predict %d images x2, "
           "PullWeights, GetStatus; a short connection every 3rd cycle%s) on %s, model %s, %d "
           "ranks; warm-up %.0f%%\n",
           cfg->seconds, cfg->steps, SOAK_IMAGES,
           cfg->checkpoint_dir ? ", a Checkpoint every 5th" : "", cfg->address, s0.model_name,
           nranks, 100 * cfg->warmup);
    // The samples are allocated and touched up front (room for 10 cycles a second): a
    // buffer growing during the run would show as the client's own RSS creeping.
    int          cap = (int)(cfg->seconds * 10) + 256, n = 0;
    soak_sample *smp = malloc(sizeof *smp * (size_t)cap);
    memset(smp, 0, sizeof *smp * (size_t)cap);
    int64_t step = s0.step;
    double  t0 = bench_now(), next_print = 0;
    int     rc = 0, k;
    for (k = 0; bench_now() - t0 < cfg->seconds; k++) {
        if (soak_cycle(cfg, c, k, &step)) {
            rc = 1;
            break;
        }
        if (n == cap) {
            cap *= 2;
            smp = realloc(smp, sizeof *smp * (size_t)cap);
        }
        smp[n].t    = bench_now() - t0;
        smp[n].step = step;
        for (int r = 0; r < nranks; r++)
            smp[n].rank[r] = settled_sample(rank_pid[r], n > 0 ? &smp[n - 1].rank[r] : NULL);
        smp[n].self = bench_proc_read(getpid());
        if (smp[n].t >= next_print) {
            printf("  %6.1f s  cycle %4d  step %6lld ", smp[n].t, k, (long long)step);
            for (int r = 0; r < nranks; r++)
                printf(" | rank %d: RSS %7.1f MB, %3ld fds, %2ld threads", r,
                       smp[n].rank[r].rss_kb / 1024.0, smp[n].rank[r].fds, smp[n].rank[r].threads);
            printf(" | client RSS %.1f MB\n", smp[n].self.rss_kb / 1024.0);
            fflush(stdout);
            next_print = smp[n].t + cfg->seconds / 12;
        }
        n++;
    }
    ddl_client_destroy(&c);
    if (rc) {
        printf("RESULT FAIL\n");
        free(smp);
        return 1;
    }
    // Samples after the warm-up.
    int a = 0;
    while (a < n && smp[a].t < cfg->warmup * cfg->seconds)
        a++;
    if (n - a < 5) {
        fprintf(stderr,
                "bench-load: soak: only %d samples after the warm-up (%d cycles in all); "
                "run longer\n",
                n - a, n);
        printf("RESULT FAIL\n");
        free(smp);
        return 1;
    }
    int    w    = (n - a) / 5 > 0 ? (n - a) / 5 : 1;
    double mins = (smp[n - 1].t - smp[a].t) / 60.0;
    printf("%d cycles, %lld steps in %.1f s; %d samples after the warm-up (from %.1f s)\n", k,
           (long long)(step - s0.step), smp[n - 1].t, n - a, smp[a].t);
    for (int r = -1; r < nranks; r++) {
        long fmin = LONG_MAX, fmax = 0, hmin = LONG_MAX, hmax = 0, rmin = LONG_MAX, rmax = 0;
        for (int i = a; i < n; i++) {
            const bench_proc_sample *p = r < 0 ? &smp[i].self : &smp[i].rank[r];
            fmin = p->fds < fmin ? p->fds : fmin, fmax = p->fds > fmax ? p->fds : fmax;
            hmin = p->threads < hmin ? p->threads : hmin;
            hmax = p->threads > hmax ? p->threads : hmax;
            rmin = p->rss_kb < rmin ? p->rss_kb : rmin, rmax = p->rss_kb > rmax ? p->rss_kb : rmax;
        }
        double first = mean_rss(smp, a, a + w, r), lastw = mean_rss(smp, n - w, n, r);
        double slope                = rss_slope(smp, a, n, r);
        const bench_proc_sample *p0 = r < 0 ? &smp[0].self : &smp[0].rank[r];
        char                     name[32];
        snprintf(name, sizeof name, r < 0 ? "client" : "rank %d", r);
        printf("%-8s RSS %.1f MB at the first cycle; after warm-up %.1f..%.1f MB, first/last "
               "fifth %.2f/%.2f MB (drift %+.2f MB over %.1f min, slope %+.3f MB/min); fds "
               "%ld..%ld; threads %ld..%ld\n",
               name, p0->rss_kb / 1024.0, rmin / 1024.0, rmax / 1024.0, first, lastw, lastw - first,
               mins, slope, fmin, fmax, hmin, hmax);
        if (r < 0)
            continue; // the client's own figures are reported, not judged
        if (fmin != fmax || hmin != hmax) {
            fprintf(stderr,
                    "bench-load: soak: FAIL: rank %d's open fds (%ld..%ld) or threads "
                    "(%ld..%ld) changed after the warm-up\n",
                    r, fmin, fmax, hmin, hmax);
            rc = 1;
        }
        if (fabs(lastw - first) > cfg->rss_slack_mb) {
            fprintf(stderr,
                    "bench-load: soak: FAIL: rank %d's RSS drifted %+.2f MB after the "
                    "warm-up (allowed %.1f)\n",
                    r, lastw - first, cfg->rss_slack_mb);
            rc = 1;
        }
    }
    printf("RESULT %s\n", rc ? "FAIL" : "PASS");
    free(smp);
    return rc;
}

// ---- command line ------------------------------------------------------------------------

static void usage(void)
{
    fprintf(stderr,
            "usage: bench-load --address A [--rank-pids P0,P1,..] load [--clients N] "
            "[--connections C] [--seconds D] [--mix P,S,H,W] [--images M] [--timeout S]\n"
            "       bench-load --address A --rank-pids P0,P1,.. soak [--seconds D] [--steps K] "
            "[--warmup F] [--rss-slack-mb X] [--checkpoint-dir DIR]\n");
}

int main(int argc, char **argv)
{
    load_cfg    lc       = {.clients = 100, .seconds = 60, .images = 32, .timeout_s = 60};
    double      mix[M_N] = {90, 7, 2, 1};
    soak_cfg    sc       = {.seconds = 600, .warmup = 0.2, .rss_slack_mb = 2, .steps = 20};
    double      seconds  = -1;
    const char *address  = NULL;
    enum {
        O_ADDR = 256,
        O_PIDS,
        O_CLIENTS,
        O_CONNS,
        O_SECONDS,
        O_MIX,
        O_IMAGES,
        O_TIMEOUT,
        O_STEPS,
        O_WARMUP,
        O_SLACK,
        O_CKPT
    };
    static const struct option longs[] = {{"address", required_argument, 0, O_ADDR},
                                          {"rank-pids", required_argument, 0, O_PIDS},
                                          {"clients", required_argument, 0, O_CLIENTS},
                                          {"connections", required_argument, 0, O_CONNS},
                                          {"seconds", required_argument, 0, O_SECONDS},
                                          {"mix", required_argument, 0, O_MIX},
                                          {"images", required_argument, 0, O_IMAGES},
                                          {"timeout", required_argument, 0, O_TIMEOUT},
                                          {"steps", required_argument, 0, O_STEPS},
                                          {"warmup", required_argument, 0, O_WARMUP},
                                          {"rss-slack-mb", required_argument, 0, O_SLACK},
                                          {"checkpoint-dir", required_argument, 0, O_CKPT},
                                          {0, 0, 0, 0}};
    int                        ch;
    while ((ch = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        switch (ch) {
        case O_ADDR:
            address = optarg;
            break;
        case O_PIDS:
            if (parse_pids(optarg))
                return usage(), 2;
            break;
        case O_CLIENTS:
            lc.clients = atoi(optarg);
            break;
        case O_CONNS:
            lc.connections = atoi(optarg);
            break;
        case O_SECONDS:
            seconds = atof(optarg);
            break;
        case O_MIX:
            if (sscanf(optarg, "%lf,%lf,%lf,%lf", &mix[0], &mix[1], &mix[2], &mix[3]) != 4)
                return usage(), 2;
            break;
        case O_IMAGES:
            lc.images = atoi(optarg);
            break;
        case O_TIMEOUT:
            lc.timeout_s = sc.timeout_s = atof(optarg);
            break;
        case O_STEPS:
            sc.steps = atoi(optarg);
            break;
        case O_WARMUP:
            sc.warmup = atof(optarg);
            break;
        case O_SLACK:
            sc.rss_slack_mb = atof(optarg);
            break;
        case O_CKPT:
            sc.checkpoint_dir = optarg;
            break;
        default:
            return usage(), 2;
        }
    }
    if (!address || optind != argc - 1)
        return usage(), 2;
    if (getenv("DDL_DATA_DIR"))
        data_dir = getenv("DDL_DATA_DIR");
    setenv("GRPC_VERBOSITY", "ERROR", 0);
    const char *mode = argv[optind];
    if (strcmp(mode, "load") == 0) {
        lc.address = address;
        if (seconds > 0)
            lc.seconds = seconds;
        if (lc.connections <= 0 || lc.connections > lc.clients)
            lc.connections = lc.clients;
        double total = mix[0] + mix[1] + mix[2] + mix[3], acc = 0;
        if (lc.clients < 1 || lc.images < 1 || lc.images > 10000 || total <= 0 || mix[0] < 0 ||
            mix[1] < 0 || mix[2] < 0 || mix[3] < 0)
            return usage(), 2;
        for (int m = 0; m < M_N; m++)
            lc.mix[m] = (acc += mix[m]) / total;
        return run_load(&lc);
    }
    if (strcmp(mode, "soak") == 0) {
        sc.address = address;
        if (seconds > 0)
            sc.seconds = seconds;
        if (sc.steps < 1 || sc.warmup < 0 || sc.warmup >= 1)
            return usage(), 2;
        return run_soak(&sc);
    }
    return usage(), 2;
}
