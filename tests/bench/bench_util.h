// bench_util.h: small helpers the client benchmarks share (bench-rpc, bench-infer,
// bench-load): clocks, quantiles, whole-file reads, what /proc says about a process, and a
// distdld started under mpirun.
#ifndef DDL_BENCH_UTIL_H
#define DDL_BENCH_UTIL_H

#include <limits.h>
#include <stddef.h>
#include <sys/types.h>

#include "bench_host.h" // bench_cpu_name, bench_load_average

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

// CPU seconds (user + system, every thread) of root's direct children (an mpirun's
// ranks), plus root's own when with_root; -1 when /proc cannot tell.
double bench_tree_cpu_s(pid_t root, int with_root);

// The end of a bench's temporary directory: removed when rc is 0, else kept and named on
// stderr ("<prog>: logs in DIR") for the daemons' logs.
void bench_tmp_done(const char *prog, const char *tmp, int rc);

// This program's path (/proc/self/exe: links resolved); NULL when it cannot be read.
const char *bench_self_exe(void);

// A distdld under mpirun, a child of this process. Zero-initialised: not started.
typedef struct bench_daemon {
    pid_t pid;                 // mpirun's; 0 when not running
    char  addr_file[PATH_MAX]; // where distdld writes the address it listens on
    char  address[256];        // its content, once bench_daemon_wait returned 0
} bench_daemon;

// Starts `mpirun -np NP [--bind-to BIND_TO] DDL_MPIEXEC_FLAGS DIR/distdld --listen
// 127.0.0.1:0 --address-file TMP/addr-npNP ARGS...` with DIR this program's directory,
// ARGS a NULL-terminated list (or NULL) and the output in TMP/daemon-npNP.log; bind_to
// NULL: mpirun's default. Call it before this process's first gRPC call (PLATFORM.md: no
// fork after grpc_init). 0, or -1 with a message.
int bench_daemon_start(bench_daemon *d, int np, const char *bind_to, const char *tmp,
                       const char *const *args);
// Waits up to 120 s for the daemon's address; -1 with a message when it exits first or
// none comes (the daemon's log in TMP says why).
int bench_daemon_wait(bench_daemon *d);
// Asks the daemon to shut down (when it has an address), waits up to 30 s for mpirun to
// exit, then kills it (our own child). Nothing when it is not running.
void bench_daemon_stop(bench_daemon *d);

#endif // DDL_BENCH_UTIL_H
