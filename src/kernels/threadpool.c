// kernels/threadpool.c: the persistent kernel thread pool (see kernels/threadpool.h).
//
// One pool per process, in static storage: one mutex guards everything, workers sleep on
// `wake` until a job has unclaimed parts, and the caller sleeps on `done` until every
// part has returned. Parts are claimed under the mutex one at a time; they are coarse
// (the conv kernels give each at least 2^20 multiply-adds, tens of microseconds), so the
// lock is never contended for long, and the caller resets the job only once no part is
// claimed and unfinished, so a late-waking worker can never run a stale part.
//
// Lifetime: workers are created on first need (a job with more parts than workers, up to
// the affinity mask) and never joined. At exit they are blocked in pthread_cond_wait, and
// exit_group ends them with the process; the mutex and condition variables are never
// destroyed, so an atexit handler or a late kernel call from another thread finds them
// valid. Workers block every signal, so signals (SIGTERM to the daemon, SIGINT) go to the
// program's own threads. After fork the child has none of the workers: an atfork
// handler resets the pool there, so a child that runs kernels creates its own.
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/check.h"
#include "ddl/kernels.h"
#include "kernels/threadpool.h"

#define POOL_MAX_WORKERS (DDL_POOL_MAX_PARTS - 1)

static struct {
    pthread_mutex_t mu;
    pthread_cond_t  wake; // workers: a job has an unclaimed part
    pthread_cond_t  done; // the caller: pending reached 0
    pthread_t       tid[POOL_MAX_WORKERS];
    int             nworkers;
    int             max_workers; // ddl_pool_set_max_workers; -1 no cap
    bool            busy;        // a caller owns the pool
    int             slots;       // workers that may still join the current job
    // The current job; nparts == next == 0 when there is none.
    ddl_pool_fn fn;
    void       *arg;
    int         nparts, next, pending;
    // The lowest failing part of the job: its status and message.
    int        err_part;
    ddl_status err_st;
    char       err_msg[512];
    int64_t    created, jobs, inline_jobs;
} pool = {
    .mu          = PTHREAD_MUTEX_INITIALIZER,
    .wake        = PTHREAD_COND_INITIALIZER,
    .done        = PTHREAD_COND_INITIALIZER,
    .max_workers = -1,
};

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

// ---- fork -----------------------------------------------------------------------------
// The forking thread holds the mutex across fork, so the child's copy of the pool is in a
// consistent state (no half-claimed part); the child then forgets the workers it lacks.

static void pool_prepare(void)
{
    pthread_mutex_lock(&pool.mu);
}

static void pool_parent(void)
{
    pthread_mutex_unlock(&pool.mu);
}

static void pool_child(void)
{
    // Waiters recorded in the condition variables were threads of the parent.
    pthread_cond_init(&pool.wake, NULL);
    pthread_cond_init(&pool.done, NULL);
    pool.nworkers = 0;
    pool.busy     = false;
    pool.fn       = NULL;
    pool.arg      = NULL;
    pool.nparts = pool.next = pool.pending = pool.slots = 0;
    pthread_mutex_unlock(&pool.mu);
}

static void pool_register_atfork(void)
{
    pthread_atfork(pool_prepare, pool_parent, pool_child);
}

// ---- workers --------------------------------------------------------------------------

// Records part p's outcome (mutex held). msg is the message the part set on its thread.
static void pool_note(int p, ddl_status st, const char *msg)
{
    if (st != DDL_OK && p < pool.err_part) {
        pool.err_part = p;
        pool.err_st   = st;
        snprintf(pool.err_msg, sizeof pool.err_msg, "%s", msg);
    }
    if (--pool.pending == 0) {
        pthread_cond_signal(&pool.done);
    }
}

// Claims and runs parts of the current job until none is left (mutex held on entry and
// on return, released while a part runs).
static void pool_drain(void)
{
    while (pool.next < pool.nparts) {
        int         p   = pool.next++;
        int         n   = pool.nparts;
        ddl_pool_fn fn  = pool.fn;
        void       *arg = pool.arg;
        pthread_mutex_unlock(&pool.mu);
        ddl_status  st  = fn(arg, p, n);
        const char *msg = st != DDL_OK ? ddl_last_error() : "";
        pthread_mutex_lock(&pool.mu);
        pool_note(p, st, msg);
    }
}

static void *pool_worker(void *unused)
{
    (void)unused;
    pthread_setname_np(pthread_self(), "ddl-pool");
    pthread_mutex_lock(&pool.mu);
    for (;;) {
        while (pool.next >= pool.nparts || pool.slots == 0) {
            pthread_cond_wait(&pool.wake, &pool.mu);
        }
        pool.slots--;
        pool_drain();
    }
    return NULL; // not reached: workers live as long as the process
}

int ddl_pool_affinity_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int c = CPU_COUNT(&set);
        return c >= 1 ? c : 1;
    }
    // More CPUs than a cpu_set_t holds (EINVAL): size the set to the machine.
    int  err    = errno;
    long online = sysconf(_SC_NPROCESSORS_CONF);
    if (err == EINVAL && online > CPU_SETSIZE) {
        cpu_set_t *big  = CPU_ALLOC((int)online);
        size_t     size = CPU_ALLOC_SIZE((int)online);
        int        c    = 1;
        if (big != NULL && sched_getaffinity(0, size, big) == 0) {
            c = CPU_COUNT_S(size, big);
        }
        CPU_FREE(big);
        return c >= 1 ? c : 1;
    }
    return 1;
}

// Creates workers until there are `want` (mutex held). Stops at the first failure: the
// job then runs with the workers there are.
static void pool_grow(int want)
{
    if (pool.nworkers >= want) {
        return;
    }
    pthread_once(&atfork_once, pool_register_atfork);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); // inherited by the new threads
    while (pool.nworkers < want) {
        if (pthread_create(&pool.tid[pool.nworkers], NULL, pool_worker, NULL) != 0) {
            break;
        }
        pool.nworkers++;
        pool.created++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

// ---- jobs -----------------------------------------------------------------------------

// The caller alone: every part in order; the lowest failing part's status and message.
static ddl_status run_inline(const char *who, int n, ddl_pool_fn fn, void *arg)
{
    ddl_status first = DDL_OK;
    char       msg[512];
    int        fp = 0;
    for (int p = 0; p < n; p++) {
        ddl_status st = fn(arg, p, n);
        if (st != DDL_OK && first == DDL_OK) {
            first = st;
            fp    = p;
            snprintf(msg, sizeof msg, "%s", ddl_last_error());
        }
    }
    if (first != DDL_OK && n > 1) {
        return ddl_set_error(first, "%s: part %d of %d: %s", who, fp, n, msg);
    }
    if (first != DDL_OK) {
        return ddl_set_error(first, "%s", msg);
    }
    return DDL_OK;
}

ddl_status ddl_pool_run(const char *who, int n, ddl_pool_fn fn, void *arg)
{
    DDL_REQUIRE(fn != NULL && n >= 0 && n <= DDL_POOL_MAX_PARTS, DDL_EINVAL,
                "%s: thread pool: %d parts (expected 0..%d) or no function", who, n,
                DDL_POOL_MAX_PARTS);
    if (n <= 1) {
        return n == 1 ? fn(arg, 0, 1) : DDL_OK;
    }
    pthread_mutex_lock(&pool.mu);
    if (pool.busy) {
        // Another thread's job, or a part of ours calling back in: no workers to spare.
        pool.inline_jobs++;
        pthread_mutex_unlock(&pool.mu);
        return run_inline(who, n, fn, arg);
    }
    int want = n - 1;
    if (want > pool.nworkers) {
        int cpus = ddl_pool_affinity_cpus();
        want     = want < cpus - 1 ? want : cpus - 1;
    }
    if (pool.max_workers >= 0 && want > pool.max_workers) {
        want = pool.max_workers;
    }
    pool_grow(want);
    if (pool.nworkers == 0 || want <= 0) {
        pool.inline_jobs++;
        pthread_mutex_unlock(&pool.mu);
        return run_inline(who, n, fn, arg);
    }
    // More workers than `want` may exist (an earlier job had more parts or a wider cap):
    // only `want` of them join, so the job runs on at most min(n, CPUs) threads.
    pool.busy     = true;
    pool.slots    = want < pool.nworkers ? want : pool.nworkers;
    pool.fn       = fn;
    pool.arg      = arg;
    pool.nparts   = n;
    pool.next     = 0;
    pool.pending  = n;
    pool.err_part = n;
    pool.err_st   = DDL_OK;
    pool.jobs++;
    pthread_cond_broadcast(&pool.wake);
    pool_drain();
    while (pool.pending > 0) {
        pthread_cond_wait(&pool.done, &pool.mu);
    }
    int        ep = pool.err_part;
    ddl_status st = pool.err_st;
    char       msg[sizeof pool.err_msg];
    memcpy(msg, pool.err_msg, sizeof msg);
    pool.fn     = NULL;
    pool.arg    = NULL;
    pool.nparts = pool.next = pool.slots = 0;
    pool.busy   = false;
    pthread_mutex_unlock(&pool.mu);
    if (st != DDL_OK) {
        return ddl_set_error(st, "%s: part %d of %d: %s", who, ep, n, msg);
    }
    return DDL_OK;
}

ddl_pool_stats ddl_pool_stats_get(void)
{
    pthread_mutex_lock(&pool.mu);
    ddl_pool_stats s = {pool.nworkers, pool.created, pool.jobs, pool.inline_jobs};
    pthread_mutex_unlock(&pool.mu);
    return s;
}

int ddl_pool_set_max_workers(int max)
{
    pthread_mutex_lock(&pool.mu);
    int prev         = pool.max_workers;
    pool.max_workers = max < 0 ? -1 : max;
    pthread_mutex_unlock(&pool.mu);
    return prev;
}

// ---- progress during the kernels (ddl/kernels.h) ------------------------------------

static _Thread_local ddl_kernel_progress progress;

ddl_kernel_progress ddl_kernel_progress_set(ddl_kernel_progress p)
{
    ddl_kernel_progress prev = progress;
    progress                 = p;
    return prev;
}

void ddl__kernel_progress(void)
{
    if (progress.fn != NULL) {
        progress.fn(progress.arg);
    }
}
