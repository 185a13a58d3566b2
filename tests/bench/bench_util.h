// bench_util.h: small helpers the client benchmarks share (bench-rpc, bench-load):
// clocks, quantiles, whole-file reads and what /proc says about a process.
#ifndef DDL_BENCH_UTIL_H
#define DDL_BENCH_UTIL_H

#include <stddef.h>
#include <sys/types.h>

// CLOCK_MONOTONIC in seconds.
double bench_now(void);
// User + system CPU seconds of this process.
double bench_cpu_self(void);
// The q-quantile (0..1) of v[0..n) (sorts v in place; nearest rank).
double bench_quantile(double *v, int n, double q);
// The whole file, NUL-terminated; NULL when it cannot be read. The caller frees it.
char *bench_read_file(const char *path);

// What /proc/<pid> says about a live process; -1 where it cannot be read.
typedef struct bench_proc_sample {
    long rss_kb;  // VmRSS
    long threads; // Threads
    long fds;     // entries of /proc/<pid>/fd
} bench_proc_sample;

bench_proc_sample bench_proc_read(pid_t pid);

#endif // DDL_BENCH_UTIL_H
