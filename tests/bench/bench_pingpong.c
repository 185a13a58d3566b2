// bench-pingpong: the machine parameters of the scaling model (docs/SCALING.md,
// tests/bench/scaling_model.py), measured in one run:
//
//   mpirun -np 2 build/bin/bench-pingpong [--reps 50]
//
//   alpha  latency (s): half the round trip of an 8-byte message between ranks 0 and 1;
//   beta   inverse bandwidth (s/byte): the slope of the half round trip against the
//          size, fitted by least squares over 256 KiB ... 16 MiB;
//   sgemm  the engine's sgemm (ddl_gemm) FLOP rate on one thread (rank 0 alone, the other
//          rank asleep: quiet_barrier), n = 256 and 1024, and with every core of the node
//          (threads = the affinity mask of rank 0's process when mpirun binds none);
//   memcpy bandwidth of a 64 MiB copy (bytes/s: read + write counted once).
// Each figure is the best over reps (the least disturbed: the machine is shared, and
// other work only ever adds time). Prints one JSON object on rank 0.
#define _GNU_SOURCE
#include <cblas.h>
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ddl/blas.h"
#include "ddl/kernels.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double best(double *t, int n)
{
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return t[0];
}

// Half round trip of `bytes` between ranks 0 and 1 (best over reps).
static double pingpong(char *buf, int bytes, int reps, int rank)
{
    double *t = malloc(sizeof(double) * (size_t)reps);
    for (int r = -3; r < reps; r++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        if (rank == 0) {
            MPI_Send(buf, bytes, MPI_BYTE, 1, 1, MPI_COMM_WORLD);
            MPI_Recv(buf, bytes, MPI_BYTE, 1, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else if (rank == 1) {
            MPI_Recv(buf, bytes, MPI_BYTE, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(buf, bytes, MPI_BYTE, 0, 2, MPI_COMM_WORLD);
        }
        if (r >= 0) {
            t[r] = (MPI_Wtime() - t0) / 2;
        }
    }
    double m = best(t, reps);
    free(t);
    return m;
}

// A barrier whose waiting ranks sleep between tests of it instead of polling a core.
static void quiet_barrier(void)
{
    MPI_Request r;
    int         done = 0;
    MPI_Ibarrier(MPI_COMM_WORLD, &r);
    while (!done) {
        MPI_Test(&r, &done, MPI_STATUS_IGNORE);
        if (!done) {
            nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
        }
    }
}

static double sgemm_rate(int n, int reps)
{
    float  *a = malloc(sizeof(float) * (size_t)n * (size_t)n);
    float  *b = malloc(sizeof(float) * (size_t)n * (size_t)n);
    float  *c = malloc(sizeof(float) * (size_t)n * (size_t)n);
    double *t = malloc(sizeof(double) * (size_t)reps);
    for (int i = 0; i < n * n; i++) {
        a[i] = (float)(i % 7) * 0.5f;
        b[i] = (float)(i % 5) * 0.25f;
    }
    for (int r = -1; r < reps; r++) {
        double t0 = MPI_Wtime();
        // The engine's GEMM: its kernel pool splits it over ddl_blas_set_threads threads
        // (OpenBLAS itself stays single-threaded, kernels/gemm.c).
        (void)ddl_gemm(DDL_F32, false, false, n, n, n, 1.0, a, n, b, n, 0.0, c, n);
        if (r >= 0) {
            t[r] = MPI_Wtime() - t0;
        }
    }
    double m = best(t, reps);
    free(a);
    free(b);
    free(c);
    free(t);
    return 2.0 * n * (double)n * n / m;
}

static double memcpy_rate(int reps)
{
    size_t  n   = 64u << 20;
    char   *src = malloc(n), *dst = malloc(n);
    double *t = malloc(sizeof(double) * (size_t)reps);
    memset(src, 1, n);
    memset(dst, 2, n);
    for (int r = -1; r < reps; r++) {
        double t0 = MPI_Wtime();
        memcpy(dst, src, n);
        if (r >= 0) {
            t[r] = MPI_Wtime() - t0;
        }
    }
    double m = best(t, reps);
    free(src);
    free(dst);
    free(t);
    return (double)n / m;
}

int main(int argc, char **argv)
{
    ddl_blas_startup(argc, argv);
    MPI_Init(&argc, &argv);
    int rank, size, reps = 50;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], "--reps") == 0) {
            reps = atoi(argv[i + 1]);
        }
    }
    if (size < 2 || reps < 3) {
        if (rank == 0) {
            fprintf(stderr, "usage: mpirun -np 2 bench-pingpong [--reps N >= 3]\n");
        }
        MPI_Finalize();
        return 2;
    }
    char *buf = malloc(16u << 20);
    memset(buf, 0, 16u << 20);
    double alpha = pingpong(buf, 8, reps, rank);
    // Least squares of t(s) = a + b s over the large sizes.
    int    sizes[] = {256 << 10, 1 << 20, 4 << 20, 16 << 20};
    int    ns      = (int)(sizeof sizes / sizeof sizes[0]);
    double sx = 0, sy = 0, sxx = 0, sxy = 0, tl[8];
    for (int i = 0; i < ns; i++) {
        tl[i] = pingpong(buf, sizes[i], reps > 20 ? 20 : reps, rank);
        sx += sizes[i];
        sy += tl[i];
        sxx += (double)sizes[i] * sizes[i];
        sxy += (double)sizes[i] * tl[i];
    }
    double beta = (ns * sxy - sx * sy) / (ns * sxx - sx * sx);
    free(buf);

    // Compute on rank 0 alone (the other ranks asleep in quiet_barrier: in MPI_Barrier
    // they would poll, and on a 2-core node take the core the all-cores sgemm needs).
    double    g1_256 = 0, g1_1024 = 0, gall = 0, mem = 0;
    cpu_set_t cs;
    int       cores = sched_getaffinity(0, sizeof cs, &cs) == 0 ? CPU_COUNT(&cs) : 1;
    if (rank == 0) {
        ddl_blas_set_threads(1);
        g1_256  = sgemm_rate(256, 20);
        g1_1024 = sgemm_rate(1024, 5);
        ddl_blas_set_threads(cores);
        gall = sgemm_rate(1024, 5);
        ddl_blas_set_threads(1);
        mem = memcpy_rate(10);
    }
    quiet_barrier();
    if (rank == 0) {
        printf("{\"alpha\": %.4g, \"beta\": %.4g, \"bandwidth\": %.4g, \"pingpong\": {", alpha,
               beta, 1.0 / beta);
        for (int i = 0; i < ns; i++) {
            printf("%s\"%d\": %.4g", i ? ", " : "", sizes[i], tl[i]);
        }
        printf("}, \"sgemm_1thread_n256\": %.4g, \"sgemm_1thread_n1024\": %.4g, "
               "\"sgemm_threads\": %d, \"sgemm_all_n1024\": %.4g, \"memcpy\": %.4g, "
               "\"blas_core\": \"%s\"}\n",
               g1_256, g1_1024, cores, gall, mem, ddl_blas_core());
    }
    MPI_Finalize();
    return 0;
}
