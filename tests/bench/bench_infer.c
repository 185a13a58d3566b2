// bench-infer: LeNet-5 inference latency, in process and through the daemon.
//
//   bench-infer [--requests N] [--spaced K] [--gap-ms G] [--np 1,2] [--bind-to POLICY]
//               [--specs DIR] [--data DIR]
//   bench-infer --curve [--requests N] [--np 1,2] [--bind-to POLICY]
//
// For each rank count P (default 1 and 2), on real Fashion-MNIST test images:
//   in process  `mpirun -np P bench-infer --inproc ...`: every rank calls
//               ddl_model_predict, rank 0 times each call (the whole collective call);
//   daemon      a P-rank distdld, one client calling ddl_client_predict back to back
//               (Trainer/Predict: gRPC, the request checks, the command broadcast to the
//               ranks, ddl_session_predict, the reply);
//   spaced      the daemon again, K batch-1 calls with G ms between them (a client that
//               is not saturating it: the worker ranks are asleep when a request comes).
// Each at batch 1 and batch 64 with the shipped spec (batch_size 64), and at batch 1
// with the same spec set to batch_size 1. Printed per row: p50 and p99 latency over N
// calls (after warm-up), throughput (images/s of the closed loop, and batch / p50) and
// calls/s. The
// logits of the first image are compared bit for bit between the in-process model and
// the daemon's (same spec and seed, so the same weights): a mismatch fails the bench.
//
// What a row shows: a predict of n < batch_size images runs at the smallest of the
// spec's inference batches (by default the powers of two below batch_size) that holds
// them, so the batch_size 64 rows at batch 1 run the batch-1 copy; the batch_size 1 row
// (a spec whose full batch is 1) is what that copy should cost. See docs/PERFORMANCE.md.
//
// --curve: the cost curve of short batches in process, n = 1, 2, 4, ..., 64, with the
// shipped spec (its inference batches) and with the same spec set to
// "inference_batches": [] (every predict padded to batch_size 64), both in the same run:
// p50 of each, the padded / short ratio, and each p50 relative to the full batch's.
//
// --bind-to passes mpirun's --bind-to to both the in-process runs and the daemons (mpirun
// binds each rank to a core by default at np <= 2; on a loaded node `none` lets the ranks
// move to whichever core is free).
//
// The daemons start before the first gRPC call of this process; the in-process runs go
// through popen (posix_spawn in glibc, no fork of gRPC's threads).
#define _GNU_SOURCE
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "ddl/base.h"
#include "ddl/blas.h"
#include "ddl/data.h"
#include "ddl/model.h"
#include "ddl/primitives.h"
#include "ddl_client.h"

#define BIG 64            // the large batch (the shipped specs' batch_size)
#define SAMPLE (28 * 28)  // LeNet-5's input, one channel
#define MAX_NP 8
#define WARM 10

static const char *data_dir = "/usr/share/datasets/fashion-mnist";

// Normalised test images [n, 1, 28, 28] (the specs' mean and std).
static float *load_images(int n)
{
    ddl_dataset ds = {0};
    if (ddl_dataset_load_mnist_dir(data_dir, 0, &ds) != DDL_OK) {
        fprintf(stderr, "bench-infer: %s\n", ddl_last_error());
        return NULL;
    }
    float   *x   = malloc(sizeof(float) * (size_t)n * SAMPLE);
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)n);
    for (int i = 0; i < n; i++) {
        idx[i] = i % ds.n;
    }
    ddl_dataset_batch_f32(&ds, idx, n, 0.2860, 0.3530, x, NULL);
    free(idx);
    ddl_dataset_free(&ds);
    return x;
}

// The spec text of `path` with batch_size set to bs (NULL on error).
// The spec at path with batch_size bs; padded: with "inference_batches": [] (no short
// batches: every predict runs the full batch).
static char *spec_with(const char *path, int bs, bool padded)
{
    json_error_t je;
    json_t      *j = json_load_file(path, 0, &je);
    if (j == NULL) {
        fprintf(stderr, "bench-infer: %s:%d: %s\n", path, je.line, je.text);
        return NULL;
    }
    json_object_set_new(j, "batch_size", json_integer(bs));
    if (padded) {
        json_object_set_new(j, "inference_batches", json_array());
    }
    char *text = json_dumps(j, JSON_INDENT(1));
    json_decref(j);
    return text;
}

static uint64_t fnv(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t             h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h = (h ^ b[i]) * 1099511628211ull;
    }
    return h;
}

// ---- in process (under mpirun) ---------------------------------------------------------

// Times `reqs` predicts of `count` images (after WARM untimed ones) on rank 0 and prints
// "INPROC count p50 p99 total_s cpu_s msgs bytes hash": rank 0's CPU time over the timed
// calls, and its primitive calls and bytes sent + received per predict (ddl_traffic).
static int inproc_series(ddl_model_t *m, int rank, const float *x, int count, int reqs,
                         uint64_t *first_hash)
{
    size_t      xb = rank == 0 ? sizeof(float) * (size_t)count * SAMPLE : 0;
    float       logits[BIG * 10];
    double     *t     = malloc(sizeof(double) * (size_t)reqs);
    double      total = 0, cpu0 = 0;
    ddl_traffic a, b;
    for (int i = -WARM; i < reqs; i++) {
        if (i == 0) {
            cpu0 = bench_cpu_self();
            ddl_traffic_snapshot(&a);
        }
        double     t0 = bench_now();
        ddl_status st = ddl_model_predict(m, rank == 0 ? x : NULL, xb, count,
                                          rank == 0 ? logits : NULL, rank == 0 ? sizeof logits : 0);
        double     dt = bench_now() - t0;
        if (st != DDL_OK) {
            if (rank == 0) {
                fprintf(stderr, "bench-infer: predict: %s\n", ddl_last_error());
            }
            free(t);
            return 1;
        }
        if (i >= 0) {
            t[i] = dt;
            total += dt;
        }
    }
    double cpu = bench_cpu_self() - cpu0;
    ddl_traffic_snapshot(&b);
    if (rank == 0) {
        double calls = 0, bytes = 0;
        for (int k = 0; k < DDL_TRAFFIC_NKINDS; k++) {
            for (int p = 0; p < DDL_TRAFFIC_NPASSES; p++) {
                calls += (double)(b.c[k][p].calls - a.c[k][p].calls);
                bytes += (double)(b.c[k][p].sent - a.c[k][p].sent) +
                         (double)(b.c[k][p].received - a.c[k][p].received);
            }
        }
        *first_hash = fnv(logits, sizeof(float) * 10);
        double p50 = bench_quantile(t, reqs, 0.5), p99 = bench_quantile(t, reqs, 0.99);
        printf("INPROC %d %.9f %.9f %.9f %.9f %.1f %.0f %016llx\n", count, p50, p99, total, cpu,
               calls / reqs, bytes / reqs, (unsigned long long)*first_hash);
        fflush(stdout);
    }
    free(t);
    return 0;
}

// mpirun -np P bench-infer --inproc SPEC BATCH_SIZE REQS [curve]: the spec file as
// given; curve: every count 1, 2, 4, ..., BIG, else 1 and (batch_size BIG) BIG.
static int run_inproc(const char *spec_path, int bs, int reqs, bool curve)
{
    MPI_Init(NULL, NULL);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int threads = ddl_runtime_divide_cores(MPI_COMM_WORLD);
    if (rank == 0) {
        ddl_blas_log("bench-infer (in-process)", threads);
    }
    char        *text = curve ? bench_read_file(spec_path) : spec_with(spec_path, bs, false);
    ddl_spec_t  *spec = NULL;
    ddl_model_t *m    = NULL;
    ddl_status   st   = text ? ddl_spec_parse(text, spec_path, size, &spec) : DDL_EINVAL;
    if (st == DDL_OK) {
        st = ddl_model_create(MPI_COMM_WORLD, spec, &m);
    }
    float *x  = rank == 0 ? load_images(BIG) : NULL;
    int    ok = st == DDL_OK && (rank != 0 || x != NULL);
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    int rc = 1;
    if (ok) {
        uint64_t h;
        rc = inproc_series(m, rank, x, 1, reqs, &h);
        for (int n = 2; curve && rc == 0 && n <= BIG; n *= 2) {
            rc = inproc_series(m, rank, x, n, reqs, &h);
        }
        if (rc == 0 && !curve && bs >= BIG) {
            rc = inproc_series(m, rank, x, BIG, reqs, &h);
        }
    } else if (rank == 0) {
        fprintf(stderr, "bench-infer: %s\n", ddl_last_error());
    }
    ddl_model_destroy(&m);
    ddl_spec_destroy(&spec);
    free(text);
    free(x);
    MPI_Finalize();
    return rc;
}

static const char *bind_to; // --bind-to, or NULL: mpirun's default

typedef struct series {
    double   p50, p99, total; // seconds
    double   cpu;             // in process: rank 0's CPU seconds over the calls (else < 0)
    double   msgs, bytes;     // in process: rank 0's primitive calls and bytes per predict
    int      reqs, count;
    uint64_t hash;            // logits of the first image
} series;

// `reqs` Predicts of `count` images through c, gap_s apart (0: back to back).
static int daemon_series(ddl_client_t *c, const float *x, int count, int reqs, double gap_s,
                         series *out)
{
    ddl_client_tensor in = {.name  = "x",
                            .dtype = DDL_WIRE_FP32,
                            .ndim  = 4,
                            .shape = {count, 1, 28, 28},
                            .data  = (void *)x,
                            .bytes = sizeof(float) * (size_t)count * SAMPLE};
    double           *t  = malloc(sizeof(double) * (size_t)reqs);
    *out                 = (series){.reqs = reqs, .count = count, .cpu = -1};
    for (int i = gap_s > 0 ? -1 : -WARM; i < reqs; i++) {
        if (gap_s > 0) {
            struct timespec ts = {(time_t)gap_s, (long)((gap_s - (double)(time_t)gap_s) * 1e9)};
            nanosleep(&ts, NULL);
        }
        ddl_client_tensor y  = {0};
        double            t0 = bench_now();
        ddl_status        st = ddl_client_predict(c, &in, &y);
        double            dt = bench_now() - t0;
        if (st != DDL_OK) {
            fprintf(stderr, "bench-infer: Predict: %s\n", ddl_last_error());
            free(t);
            return -1;
        }
        if (i >= 0) {
            t[i] = dt;
            out->total += dt;
        }
        if (y.bytes >= sizeof(float) * 10) {
            out->hash = fnv(y.data, sizeof(float) * 10);
        }
        ddl_client_tensor_release(&y);
    }
    out->p50 = bench_quantile(t, reqs, 0.5);
    out->p99 = bench_quantile(t, reqs, 0.99);
    free(t);
    return 0;
}

// Throughput two ways: of the closed loop (count / mean latency; outliers on a shared node
// pull it down) and at the median latency (count / p50). In process also rank 0's CPU
// time per call (below the latency: it waited for its share of a core or for the other
// rank) and its primitive calls (messages exchanged) per predict.
static void print_row(int np, const char *path, int bs, const series *s)
{
    double per = s->total / s->reqs;
    printf("%2d  %-10s %5d %6d  %9.3f %9.3f  %9.0f %9.0f %8.0f", np, path, bs, s->count,
           s->p50 * 1e3, s->p99 * 1e3, s->count / per, s->count / s->p50, 1.0 / per);
    if (s->cpu >= 0) {
        printf("  %7.3f %5.0f %9.0f", s->cpu / s->reqs * 1e3, s->msgs, s->bytes);
    }
    printf("\n");
    fflush(stdout);
}

#define MAX_ROWS 8 // INPROC lines of one run: the curve's 1, 2, 4, ..., 64

// The in-process rows for np ranks and batch_size bs (curve: the cost curve); INPROC
// lines into s[0..MAX_ROWS).
static int inproc_rows(int np, const char *spec, int bs, int reqs, bool curve, series *s, int *ns)
{
    char        cmd[3 * PATH_MAX + 512];
    const char *exe = bench_self_exe();
    if (exe == NULL) {
        return -1;
    }
    snprintf(cmd, sizeof cmd, "%s -np %d %s%s %s %s --inproc %s %d %d%s --data %s 2>&1",
             DDL_MPIEXEC, np, bind_to ? "--bind-to " : "", bind_to ? bind_to : "",
             DDL_MPIEXEC_FLAGS, exe, spec, bs, reqs, curve ? " curve" : "", data_dir);
    FILE *p = popen(cmd, "r");
    char  line[1024];
    *ns = 0;
    while (p && fgets(line, sizeof line, p)) {
        series             r = {.reqs = reqs};
        unsigned long long h;
        if (*ns < MAX_ROWS &&
            sscanf(line, "INPROC %d %lf %lf %lf %lf %lf %lf %llx", &r.count, &r.p50, &r.p99,
                   &r.total, &r.cpu, &r.msgs, &r.bytes, &h) == 8) {
            r.hash     = h;
            s[(*ns)++] = r;
        } else if (strstr(line, "bench-infer") != NULL && strstr(line, "BLAS") == NULL) {
            fputs(line, stderr);
        }
    }
    if (!p || pclose(p) != 0 || *ns == 0) {
        fprintf(stderr, "bench-infer: the in-process run failed: %s\n", cmd);
        return -1;
    }
    return 0;
}

// The 1-minute load average and the rest of /proc/loadavg, with its newline.
static const char *load_average(void)
{
    static char buf[128] = "?\n";
    FILE       *f        = fopen("/proc/loadavg", "r");
    if (f) {
        if (!fgets(buf, sizeof buf, f)) {
            snprintf(buf, sizeof buf, "?\n");
        }
        fclose(f);
    }
    return buf;
}

// --curve: per rank count, the short-batch cost curve, short batches against padded.
static int curve_rows(char (*spec)[3][PATH_MAX], const int *nps, int nnp, int reqs, const char *cpu,
                      const char *tmp)
{
    printf("bench-infer --curve: LeNet-5 f32 predict in process, batch_size %d; %s; %d calls "
           "per row after %d warm-up; mpirun --bind-to %s; load average %s",
           BIG, cpu, reqs, WARM, bind_to ? bind_to : "(default)", load_average());
    printf("np  batch  short p50 ms  padded p50 ms  padded/short  short/full  img/s@p50\n");
    int rc = 0;
    for (int i = 0; i < nnp && rc == 0; i++) {
        series sh[MAX_ROWS], pd[MAX_ROWS];
        int    nsh = 0, npd = 0;
        if (inproc_rows(nps[i], spec[i][0], BIG, reqs, true, sh, &nsh) != 0 ||
            inproc_rows(nps[i], spec[i][2], BIG, reqs, true, pd, &npd) != 0 || nsh != npd) {
            rc = 1;
            break;
        }
        double full = sh[nsh - 1].p50;
        for (int r = 0; r < nsh; r++) {
            printf("%2d %6d  %12.4f  %13.4f  %12.2f  %10.3f  %9.0f\n", nps[i], sh[r].count,
                   sh[r].p50 * 1e3, pd[r].p50 * 1e3, pd[r].p50 / sh[r].p50, sh[r].p50 / full,
                   sh[r].count / sh[r].p50);
        }
        fflush(stdout);
    }
    bench_tmp_done("bench-infer", tmp, 0); // removed whatever rc says, as before
    return rc;
}

int main(int argc, char **argv)
{
    ddl_blas_startup(argc, argv); // may re-execute: before MPI, gRPC and children
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], "--data") == 0) {
            data_dir = argv[i + 1];
        }
    }
    if (argc >= 5 && strcmp(argv[1], "--inproc") == 0) {
        return run_inproc(argv[2], atoi(argv[3]), atoi(argv[4]),
                          argc >= 6 && strcmp(argv[5], "curve") == 0);
    }
    int                        reqs = 200, spaced = 20, gap_ms = 150, nps[MAX_NP] = {1, 2},
        nnp                                       = 2;
    const char                *specs              = DDL_SOURCE_DIR "/deploy/specs";
    static const struct option longs[]            = {{"requests", required_argument, 0, 'n'},
                                                     {"spaced", required_argument, 0, 'k'},
                                                     {"gap-ms", required_argument, 0, 'g'},
                                                     {"np", required_argument, 0, 'p'},
                                                     {"specs", required_argument, 0, 's'},
                                                     {"bind-to", required_argument, 0, 'b'},
                                                     {"data", required_argument, 0, 'd'},
                                                     {"curve", no_argument, 0, 'c'},
                                                     {0, 0, 0, 0}};
    bool                       curve              = false;
    int                        ch;
    while ((ch = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        switch (ch) {
        case 'n':
            reqs = atoi(optarg);
            break;
        case 'k':
            spaced = atoi(optarg);
            break;
        case 'g':
            gap_ms = atoi(optarg);
            break;
        case 'p': {
            nnp = 0;
            for (char *tok = strtok(optarg, ","); tok && nnp < MAX_NP; tok = strtok(NULL, ",")) {
                nps[nnp++] = atoi(tok);
            }
            break;
        }
        case 's':
            specs = optarg;
            break;
        case 'd':
            data_dir = optarg;
            break;
        case 'b':
            bind_to = optarg;
            break;
        case 'c':
            curve = true;
            break;
        default:
            fprintf(stderr, "usage: bench-infer [--curve] [--requests N] [--spaced K] "
                            "[--gap-ms G] [--np 1,2] [--bind-to POLICY] [--specs DIR] "
                            "[--data DIR]\n");
            return 2;
        }
    }
    for (int i = 0; i < nnp; i++) {
        if (nps[i] < 1 || nps[i] > MAX_NP) {
            return fprintf(stderr, "bench-infer: --np %d: expected 1..%d\n", nps[i], MAX_NP), 2;
        }
    }
    if (reqs < 1 || spaced < 0 || gap_ms < 0) {
        return fprintf(stderr, "bench-infer: counts must be positive\n"), 2;
    }
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
    setenv("OMPI_MCA_plm_rsh_agent", "false", 0);
    setenv("GRPC_VERBOSITY", "ERROR", 0);
    char tmp[] = "/tmp/bench-infer-XXXXXX";
    if (!mkdtemp(tmp)) {
        return 1;
    }
    float *x = load_images(BIG);
    if (x == NULL) {
        return 1;
    }
    // Spec files: lenet5-P.json as shipped (batch_size 64), with batch_size 1, and padded
    // (batch_size 64 without inference batches).
    char spec[MAX_NP][3][PATH_MAX];
    for (int i = 0; i < nnp; i++) {
        char src[PATH_MAX];
        snprintf(src, sizeof src, "%s/lenet5-%d.json", specs, nps[i]);
        for (int b = 0; b < 3; b++) {
            char *text = spec_with(src, b == 1 ? 1 : BIG, b == 2);
            snprintf(spec[i][b], sizeof spec[i][b], "%s/lenet5-%d-%s.json", tmp, nps[i],
                     b == 0   ? "b64"
                     : b == 1 ? "b1"
                              : "padded");
            FILE *f = text ? fopen(spec[i][b], "w") : NULL;
            if (f == NULL) {
                return fprintf(stderr, "bench-infer: cannot write %s\n", spec[i][b]), 1;
            }
            fputs(text, f);
            fclose(f);
            free(text);
        }
    }
    char cpu[256];
    bench_cpu_name(cpu, sizeof cpu);
    if (curve) {
        int rc = curve_rows(spec, nps, nnp, reqs, cpu, tmp);
        free(x);
        return rc;
    }
    printf("bench-infer: LeNet-5 f32 predict on Fashion-MNIST test images; %s; %d calls per "
           "row after %d warm-up (spaced: %d calls, %d ms apart); mpirun --bind-to %s; load "
           "average %s",
           cpu, reqs, WARM, spaced, gap_ms, bind_to ? bind_to : "(default)", load_average());
    printf("np  path       bsize  batch     p50 ms    p99 ms      img/s img/s@p50  calls/s  "
           "cpu ms  msgs     bytes\n");
    // Every daemon before the first gRPC call (one per rank count, with the shipped spec).
    bench_daemon d[MAX_NP] = {{0}};
    int          rc        = 0;
    for (int i = 0; i < nnp && rc == 0; i++) {
        const char *args[] = {"--model", spec[i][0], NULL};
        rc                 = bench_daemon_start(&d[i], nps[i], bind_to, tmp, args);
    }
    for (int i = 0; i < nnp && rc == 0; i++) {
        rc = bench_daemon_wait(&d[i]);
    }
    for (int i = 0; i < nnp && rc == 0; i++) {
        int    np = nps[i];
        series in[MAX_ROWS], in1[MAX_ROWS];
        int    nin = 0, nin1 = 0;
        if (inproc_rows(np, spec[i][0], BIG, reqs, false, in, &nin) != 0 ||
            inproc_rows(np, spec[i][1], 1, reqs, false, in1, &nin1) != 0) {
            rc = 1;
            break;
        }
        for (int r = 0; r < nin; r++) {
            print_row(np, "in-process", BIG, &in[r]);
        }
        print_row(np, "in-process", 1, &in1[0]);
        ddl_client_t      *c;
        ddl_client_options o = ddl_client_options_default();
        if (ddl_client_connect(d[i].address, &o, &c) != DDL_OK) {
            fprintf(stderr, "bench-infer: connect %s: %s\n", d[i].address, ddl_last_error());
            rc = 1;
            break;
        }
        series s1, s64, ssp, sb1;
        if (daemon_series(c, x, 1, reqs, 0, &s1) || daemon_series(c, x, BIG, reqs, 0, &s64)) {
            rc = 1;
        }
        if (rc == 0) {
            print_row(np, "daemon", BIG, &s1);
            print_row(np, "daemon", BIG, &s64);
            if (s1.hash != in[0].hash) {
                fprintf(stderr, "bench-infer: np %d: the daemon's logits differ from the "
                                "in-process model's\n",
                        np);
                rc = 1;
            }
        }
        if (rc == 0 && spaced > 0) {
            if (daemon_series(c, x, 1, spaced, gap_ms * 1e-3, &ssp) != 0) {
                rc = 1;
            } else {
                print_row(np, "spaced", BIG, &ssp);
            }
        }
        // The same daemon with the batch_size 1 spec.
        char *text1 = bench_read_file(spec[i][1]);
        if (rc == 0 && (text1 == NULL ||
                        ddl_client_create_model(c, text1, "lenet5-b1", 1, NULL) != DDL_OK)) {
            fprintf(stderr, "bench-infer: CreateModel (batch_size 1): %s\n", ddl_last_error());
            rc = 1;
        }
        free(text1);
        if (rc == 0 && daemon_series(c, x, 1, reqs, 0, &sb1) == 0) {
            print_row(np, "daemon", 1, &sb1);
        } else {
            rc = 1;
        }
        ddl_client_destroy(&c);
    }
    for (int i = 0; i < nnp; i++) {
        bench_daemon_stop(&d[i]);
    }
    free(x);
    bench_tmp_done("bench-infer", tmp, rc);
    return rc;
}
