// bench-rpc: what the gRPC front end costs, measured against references in the same run.
//
//   bench-rpc [--steps N] [--blocks B] [--unary N] [--reps N] [--idle SECONDS] [--specs DIR]
//
// 1. Step overhead: LeNet-5 at batch 256 on 2 ranks, the same inline batch stepped
//    in-process (`mpirun -np 2 bench-rpc --inproc`, ddl_session_step) and through a
//    2-rank distdld (ddl_client_step), in B alternating blocks of N steps; the ratio of
//    the mean block medians (target <= 1.05).
// 2. GetStatus unary latency: median and p99 over N calls.
// 3. PullWeights / PushWeights throughput on deploy/specs/mlp-big-2.json (80 MB of
//    global weights; target >= 1 GiB/s), median of N repetitions.
// 4. Idle CPU of a 4-rank daemon with a model over SECONDS (mpirun and every rank).
//
// The daemons are started before the first gRPC call (PLATFORM.md: no fork after
// grpc_init); the in-process runs later go through popen, which glibc implements with
// posix_spawn.
#define _GNU_SOURCE
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "ddl/blas.h"
#include "ddl/session.h"
#include "ddl_client.h"

#define BATCH 256

// The LeNet-5 spec with batch_size 256 (the shipped one says 64).
static char *lenet_b256(const char *specs)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/lenet5-2.json", specs);
    char *s = bench_read_file(path);
    char *p = s ? strstr(s, "\"batch_size\": 64") : NULL;
    if (!p) {
        fprintf(stderr, "bench-rpc: no \"batch_size\": 64 in %s\n", path);
        exit(1);
    }
    memcpy(p, "\"batch_size\":256", 16);
    return s;
}

// A deterministic synthetic batch (normalised-looking FP32 values, labels 0..9).
static void make_batch(float *x, int64_t *labels)
{
    for (int64_t i = 0; i < (int64_t)BATCH * 784; i++)
        x[i] = (float)((double)((i * 2654435761u) % 1000) / 500.0 - 1.0);
    for (int i = 0; i < BATCH; i++)
        labels[i] = i % 10;
}

// ---- in-process reference (under mpirun) ----------------------------------------------

static int run_inproc(const char *spec_path, int steps)
{
    int provided, rank;
    MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int threads = ddl_runtime_divide_cores(MPI_COMM_WORLD);
    if (rank == 0) {
        ddl_blas_log("bench-rpc (in-process)", threads);
    }
    char          *spec = rank == 0 ? bench_read_file(spec_path) : NULL;
    ddl_session_t *s;
    ddl_status     st = ddl_session_create(MPI_COMM_WORLD, spec, spec_path, NULL, &s);
    if (st != DDL_OK) {
        if (rank == 0)
            fprintf(stderr, "inproc: %s\n", ddl_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    float   *x      = rank == 0 ? malloc(sizeof(float) * BATCH * 784) : NULL;
    int64_t *labels = rank == 0 ? malloc(sizeof(int64_t) * BATCH) : NULL;
    if (rank == 0)
        make_batch(x, labels);
    size_t  xb = rank == 0 ? sizeof(float) * BATCH * 784 : 0;
    double *t  = malloc(sizeof(double) * (size_t)steps);
    for (int i = -3; i < steps; i++) {
        ddl_step_result r;
        double          t0 = bench_now();
        st = ddl_session_step(s, x, xb, labels, rank == 0 ? 8 * BATCH : 0, rank == 0 ? BATCH : 0,
                              &r);
        if (st != DDL_OK) {
            if (rank == 0)
                fprintf(stderr, "inproc step: %s\n", ddl_last_error());
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        if (i >= 0)
            t[i] = bench_now() - t0;
    }
    if (rank == 0)
        printf("INPROC %.9f %.9f %d\n", bench_quantile(t, steps, 0.5),
               bench_quantile(t, steps, 0.9), threads);
    ddl_session_destroy(&s);
    free(t);
    free(x);
    free(labels);
    free(spec);
    MPI_Finalize();
    return 0;
}

#define DIE(...)                                                                                   \
    do {                                                                                           \
        fprintf(stderr, "bench-rpc: " __VA_ARGS__);                                                \
        fprintf(stderr, ": %s (%s)\n", ddl_last_error(),                                           \
                ddl_client_code_name(ddl_client_last_code()));                                     \
        rc = 1;                                                                                    \
        goto out;                                                                                  \
    } while (0)

int main(int argc, char **argv)
{
    ddl_blas_startup(argc, argv); // may re-execute: before MPI, gRPC and children
    if (argc >= 4 && strcmp(argv[1], "--inproc") == 0)
        return run_inproc(argv[2], atoi(argv[3]));

    int                        steps = 20, unary = 2000, reps = 5, idle = 60, blocks = 3;
    const char                *specs   = NULL;
    static const struct option longs[] = {{"steps", required_argument, 0, 's'},
                                          {"unary", required_argument, 0, 'u'},
                                          {"reps", required_argument, 0, 'r'},
                                          {"idle", required_argument, 0, 'i'},
                                          {"specs", required_argument, 0, 'S'},
                                          {"blocks", required_argument, 0, 'b'},
                                          {0, 0, 0, 0}};
    int                        ch;
    while ((ch = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        switch (ch) {
        case 's':
            steps = atoi(optarg);
            break;
        case 'u':
            unary = atoi(optarg);
            break;
        case 'r':
            reps = atoi(optarg);
            break;
        case 'i':
            idle = atoi(optarg);
            break;
        case 'S':
            specs = optarg;
            break;
        default:
            fprintf(stderr, "usage: bench-rpc [--steps N] [--unary N] [--reps N] [--idle S] "
                            "[--specs DIR]\n");
            return 2;
        }
    }
    if (steps < 1 || unary < 1 || reps < 1 || idle < 0 || blocks < 1)
        return fprintf(stderr, "bench-rpc: counts must be positive\n"), 2;
    const char *exe = bench_self_exe();
    if (exe == NULL)
        return 1;
    if (!specs)
        specs = DDL_SOURCE_DIR "/deploy/specs";
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
    setenv("OMPI_MCA_plm_rsh_agent", "false", 0);
    setenv("GRPC_VERBOSITY", "ERROR", 0);

    char tmp[] = "/tmp/bench-rpc-XXXXXX";
    if (!mkdtemp(tmp))
        return 1;
    char  spec256_path[PATH_MAX], lenet4[PATH_MAX], big[PATH_MAX];
    char *spec256 = lenet_b256(specs);
    snprintf(spec256_path, sizeof spec256_path, "%s/lenet5-2-b256.json", tmp);
    FILE *f = fopen(spec256_path, "w");
    fputs(spec256, f);
    fclose(f);
    snprintf(lenet4, sizeof lenet4, "%s/lenet5-4.json", specs);
    snprintf(big, sizeof big, "%s/mlp-big-2.json", specs);
    char *big_text = bench_read_file(big);
    if (!big_text)
        return fprintf(stderr, "bench-rpc: cannot read %s\n", big), 1;

    printf("bench-rpc: LeNet-5, batch %d, 2 ranks; %d blocks of %d timed steps each way, "
           "alternating\n",
           BATCH, blocks, steps);
    char cmd[3 * PATH_MAX + 1024];
    snprintf(cmd, sizeof cmd, "%s -np 2 %s %s --inproc %s %d", DDL_MPIEXEC, DDL_MPIEXEC_FLAGS, exe,
             spec256_path, steps);

    // Both daemons start now, before any gRPC call in this process.
    const char   *args2[] = {"--max-message-bytes", "16777216", NULL};
    const char   *args4[] = {"--max-message-bytes", "16777216", "--model", lenet4, NULL};
    bench_daemon  d2 = {0}, d4 = {0};
    int           rc = 0;
    ddl_client_t *c  = NULL;
    if (bench_daemon_start(&d2, 2, NULL, tmp, args2) ||
        bench_daemon_start(&d4, 4, NULL, tmp, args4) || bench_daemon_wait(&d2) ||
        bench_daemon_wait(&d4)) {
        rc = 1;
        goto out;
    }
    ddl_client_options o = ddl_client_options_default();
    o.tune_malloc        = 1;
    if (ddl_client_connect(d2.address, &o, &c) != DDL_OK)
        DIE("connect %s", d2.address);

    // 1b. The same steps through the daemon.
    if (ddl_client_create_model(c, spec256, "lenet-b256", 1, NULL) != DDL_OK)
        DIE("CreateModel");
    float   *x      = malloc(sizeof(float) * BATCH * 784);
    int64_t *labels = malloc(sizeof(int64_t) * BATCH);
    make_batch(x, labels);
    ddl_client_batch b = {.x      = {.name  = "x",
                                     .dtype = DDL_WIRE_FP32,
                                     .ndim  = 4,
                                     .shape = {BATCH, 1, 28, 28},
                                     .data  = x,
                                     .bytes = sizeof(float) * BATCH * 784},
                          .labels = {.name  = "labels",
                                     .dtype = DDL_WIRE_INT64,
                                     .ndim  = 1,
                                     .shape = {BATCH},
                                     .data  = labels,
                                     .bytes = sizeof(int64_t) * BATCH}};
    // In-process and RPC blocks alternate so that load drifting on a shared machine hits
    // both sides alike. (popen after grpc_init: glibc's popen is posix_spawn, an exec with
    // no fork of gRPC's threads' state.)
    int     nt     = steps * blocks;
    double *t      = malloc(sizeof(double) * (size_t)(nt > unary ? nt : unary));
    double *rt     = malloc(sizeof(double) * (size_t)steps);
    double  in_sum = 0, rpc_sum = 0;
    int     in_threads = 0;
    for (int k = 0; k < blocks; k++) {
        double in_med = 0, in_p90 = 0;
        FILE  *p = popen(cmd, "r");
        char   line[512];
        while (p && fgets(line, sizeof line, p))
            if (sscanf(line, "INPROC %lf %lf %d", &in_med, &in_p90, &in_threads) == 3)
                break;
        while (p && fgets(line, sizeof line, p)) {
        }
        if (!p || pclose(p) != 0 || in_med <= 0) {
            fprintf(stderr, "bench-rpc: the in-process run failed: %s\n", cmd);
            rc = 1;
            goto out;
        }
        for (int i = -3; i < steps; i++) {
            double t0 = bench_now();
            if (ddl_client_step(c, &b, NULL) != DDL_OK)
                DIE("Step");
            if (i >= 0)
                t[k * steps + i] = rt[i] = bench_now() - t0;
        }
        double rpc_med = bench_quantile(rt, steps, 0.5);
        printf("  block %d: in-process median %8.3f ms (p90 %8.3f), RPC median %8.3f ms: %.3f\n", k,
               1e3 * in_med, 1e3 * in_p90, 1e3 * rpc_med, rpc_med / in_med);
        in_sum += in_med;
        rpc_sum += rpc_med;
    }
    printf("step in-process : mean of block medians %8.3f ms  (%d BLAS thread(s) per rank)\n",
           1e3 * in_sum / blocks, in_threads);
    printf("step via RPC    : mean of block medians %8.3f ms  (p90 of all %.3f ms)\n",
           1e3 * rpc_sum / blocks, 1e3 * bench_quantile(t, nt, 0.9));
    printf("RPC overhead ratio (RPC / in-process): %.3f  (target <= 1.05)\n", rpc_sum / in_sum);
    free(rt);

    // 2. Unary latency.
    for (int i = 0; i < unary; i++) {
        ddl_client_status_info s;
        double                 t0 = bench_now();
        if (ddl_client_get_status(c, &s) != DDL_OK)
            DIE("GetStatus");
        t[i] = bench_now() - t0;
    }
    printf("GetStatus x %d : median %.1f us  p99 %.1f us\n", unary,
           1e6 * bench_quantile(t, unary, 0.5), 1e6 * bench_quantile(t, unary, 0.99));

    // 3. Weight streaming on the big MLP.
    ddl_client_model_info mi;
    if (ddl_client_create_model(c, big_text, "mlp-big", 1, &mi) != DDL_OK)
        DIE("CreateModel mlp-big-2");
    double *tp = malloc(sizeof(double) * (size_t)reps), *tq = malloc(sizeof(double) * (size_t)reps);
    size_t  bytes            = 0;
    ddl_client_weights *w    = NULL;
    double              cpu0 = bench_cpu_self();
    for (int i = 0; i < reps; i++) {
        ddl_client_weights_destroy(&w);
        double t0 = bench_now();
        if (ddl_client_pull_weights(c, &w) != DDL_OK)
            DIE("PullWeights");
        tp[i] = bench_now() - t0;
    }
    double cpu_pull = bench_cpu_self() - cpu0;
    for (int64_t i = 0; i < w->count; i++)
        bytes += w->tensors[i].bytes;
    cpu0 = bench_cpu_self();
    for (int i = 0; i < reps; i++) {
        double t0 = bench_now();
        if (ddl_client_push_weights(c, w->tensors, w->count, NULL, NULL) != DDL_OK)
            DIE("PushWeights");
        tq[i] = bench_now() - t0;
    }
    double cpu_push = bench_cpu_self() - cpu0;
    double gib      = (double)bytes / (1u << 30);
    printf("weights: %lld tensors, %.1f MiB (%lld parameters)\n", (long long)w->count,
           (double)bytes / (1 << 20), (long long)mi.num_parameters);
    printf("PullWeights: median %.3f s = %.2f GiB/s  (best %.2f GiB/s; target >= 1)\n",
           bench_quantile(tp, reps, 0.5), gib / bench_quantile(tp, reps, 0.5),
           gib / bench_quantile(tp, reps, 0.0));
    printf("PushWeights: median %.3f s = %.2f GiB/s  (best %.2f GiB/s; target >= 1)\n",
           bench_quantile(tq, reps, 0.5), gib / bench_quantile(tq, reps, 0.5),
           gib / bench_quantile(tq, reps, 0.0));
    printf("client CPU per GiB: pull %.2f s, push %.2f s\n", cpu_pull / (reps * gib),
           cpu_push / (reps * gib));
    ddl_client_weights_destroy(&w);
    ddl_client_destroy(&c);

    // 4. Idle CPU of the 4-rank daemon (model loaded, no requests).
    if (idle > 0) {
        ddl_client_t *c4;
        if (ddl_client_connect(d4.address, &o, &c4) != DDL_OK)
            DIE("connect %s", d4.address);
        ddl_client_status_info s;
        if (ddl_client_get_status(c4, &s) != DDL_OK)
            DIE("GetStatus np 4");
        ddl_client_destroy(&c4);
        double t0 = bench_tree_cpu_s(d4.pid, 1);
        double w0 = bench_now();
        sleep((unsigned)idle);
        double t1  = bench_tree_cpu_s(d4.pid, 1);
        double cpu = t0 >= 0 && t1 >= 0 ? t1 - t0 : NAN, wall = bench_now() - w0;
        printf(
            "idle 4-rank daemon over %.0f s: %.2f CPU-s = %.2f%% of one core (mpirun + 4 ranks)\n",
            wall, cpu, 100.0 * cpu / wall);
    }
    free(t);
    free(tp);
    free(tq);
    free(x);
    free(labels);
out:
    if (c)
        ddl_client_destroy(&c);
    bench_daemon_stop(&d2);
    bench_daemon_stop(&d4);
    free(spec256);
    free(big_text);
    return rc;
}
