// kernels/threadpool.h: internal: the process's persistent pool of kernel threads.
//
// A kernel that splits its work into n parts calls ddl_pool_run once per call instead of
// creating and joining n - 1 threads: the workers are created the first time they are
// needed and then sleep on a condition variable between calls (no spinning, so an idle
// pool costs no CPU a rank on the same core could use). The partition of the work is the
// caller's: part p is the same piece of work whichever thread runs it and however many
// threads there are, so results do not depend on the pool (only on n).
#ifndef DDL_KERNELS_THREADPOOL_H
#define DDL_KERNELS_THREADPOOL_H

#include <stdint.h>

#include "ddl/status.h"

// One part of a job: part p of n (0 <= p < n). A failure returns its status with the
// message set as usual (ddl_set_error); the pool carries it back to the caller.
typedef ddl_status (*ddl_pool_fn)(void *arg, int part, int nparts);

// Parts per job at most; and so at most this many threads (the caller + 63 workers),
// OpenBLAS's MAX_THREADS in Debian's build.
#define DDL_POOL_MAX_PARTS 64

// Runs fn(arg, p, n) for every p in [0, n) and returns when all have returned. The
// caller runs parts too; up to min(n, CPUs of this thread's affinity mask) - 1 workers
// run the rest, each claiming the next unclaimed part (who runs which part varies, what
// each part computes does not). n is the caller's choice (the conv kernels and ddl_gemm
// size it from the kernel width, ddl_blas_set_threads), capped at DDL_POOL_MAX_PARTS.
// When the pool is already in use (another thread, or a part calling ddl_pool_run), when
// it has no worker (a one-CPU mask, or thread creation failed) or n == 1, the caller runs
// every part itself, in order. Returns DDL_OK, or the status of the lowest-numbered
// failing part with its message prefixed by `who` and the part (every part runs even when
// one fails). Not collective; allocates nothing after the workers exist.
ddl_status ddl_pool_run(const char *who, int n, ddl_pool_fn fn, void *arg);

// Calls the calling thread's ddl_kernel_progress callback (ddl/kernels.h), if any: the
// kernels' hook between units of work. Cheap when none is set.
void ddl__kernel_progress(void);

// CPUs in the calling thread's affinity mask (sched_getaffinity; not nproc, which
// follows OMP_NUM_THREADS), at least 1.
int ddl_pool_affinity_cpus(void);

// What the pool has done so far in this process (for tests and benchmarks).
typedef struct ddl_pool_stats {
    int     workers;     // live workers
    int64_t created;     // threads ever created by the pool (pthread_create successes)
    int64_t jobs;        // calls that ran on workers
    int64_t inline_jobs; // calls with n > 1 that ran on the caller alone
} ddl_pool_stats;
ddl_pool_stats ddl_pool_stats_get(void);

// Caps the workers a job may use (-1: no cap, the default); returns the previous cap.
// For tests: 0 runs every job on the caller, which must give the same bits.
int ddl_pool_set_max_workers(int max);

#endif // DDL_KERNELS_THREADPOOL_H
