// test_threadpool: the persistent kernel thread pool (kernels/threadpool.h) and the conv
// kernels on it.
//   - every part of a job runs exactly once; the lowest failing part's status and message
//     come back to the caller; nested and concurrent jobs run (on the caller) and finish;
//   - many LeNet-sized conv forward + backward steps with 2 BLAS threads create no thread
//     after the first: no pthread_create call (counted by a link-time wrapper), the pool's
//     creation counter and /proc/self/task stay put, while
//     the pool's job counter shows the steps ran on it;
//   - the bits do not depend on the pool: the same steps run on the caller alone give
//     identical outputs, and so does a forked child (which builds its own workers);
//   - one owner of threads: with a width of 2, OpenBLAS stays at one thread, a large GEMM
//     runs as pool parts (the same bits on the caller alone), and no thread but the
//     caller and the pool's workers (OpenBLAS's server threads among them) gets CPU time
//     while conv steps and GEMMs run: nothing spins beside the pool.
#define _GNU_SOURCE
#include <cblas.h>
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ddl/base.h"
#include "ddl/kernels.h"
#include "kernels/threadpool.h"
#include "test.h"

// Every pthread_create of this executable's code (the kernels are linked in statically)
// goes through here (-Wl,--wrap=pthread_create): a count that does not rely on the pool's
// own bookkeeping.
int        __real_pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *),
                                 void *arg);
int        __wrap_pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *),
                                 void *arg);
static int creates;

int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *), void *arg)
{
    __atomic_add_fetch(&creates, 1, __ATOMIC_RELAXED);
    return __real_pthread_create(t, a, fn, arg);
}

// Threads of this process right now.
static int task_count(void)
{
    DIR *d = opendir("/proc/self/task");
    ASSERT_TRUE(d != NULL);
    int            n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        n += e->d_name[0] != '.';
    }
    closedir(d);
    return n;
}

// CPU time (clock ticks, user + system) of this process's threads other than the caller
// and the pool's workers ("ddl-pool"): OpenBLAS's server threads, started at load.
static long long others_cpu_ticks(void)
{
    DIR *d = opendir("/proc/self/task");
    ASSERT_TRUE(d != NULL);
    long long      ticks = 0;
    pid_t          self  = gettid();
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' || atoi(e->d_name) == self) {
            continue;
        }
        char path[300], buf[512];
        snprintf(path, sizeof path, "/proc/self/task/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (f == NULL) {
            continue; // the thread ended
        }
        size_t len = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[len]    = '\0';
        char *open  = strchr(buf, '(');
        char *close = strrchr(buf, ')');
        ASSERT_TRUE(open != NULL && close != NULL);
        if (strncmp(open + 1, "ddl-pool)", 9) == 0) {
            continue;
        }
        // After the name: state (field 3) ... utime (14), stime (15).
        unsigned long long ut = 0, st = 0;
        ASSERT_EQ(
            sscanf(close + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st),
            2);
        ticks += (long long)(ut + st);
    }
    closedir(d);
    return ticks;
}

// ---- the pool on its own -------------------------------------------------------------

typedef struct job {
    int       runs[DDL_POOL_MAX_PARTS]; // times each part ran
    pthread_t who[DDL_POOL_MAX_PARTS];  // the thread that ran it
    int       fail_from;                // parts >= fail_from fail (with their number)
    int       nested;                   // parts call ddl_pool_run themselves
    pthread_mutex_t mu;
} job;

static ddl_status inner_part(void *arg, int p, int n)
{
    (void)n;
    __atomic_add_fetch(&((int *)arg)[p], 1, __ATOMIC_RELAXED);
    return DDL_OK;
}

static ddl_status job_part(void *arg, int p, int n)
{
    job *j = arg;
    // Long enough that the workers have time to join.
    volatile double acc = 0;
    for (int i = 0; i < 200000; i++) {
        acc += i * 1e-9;
    }
    pthread_mutex_lock(&j->mu);
    j->runs[p]++;
    j->who[p] = pthread_self();
    pthread_mutex_unlock(&j->mu);
    if (j->nested) {
        int inner[4] = {0};
        ddl_status st = ddl_pool_run("inner", 4, inner_part, inner);
        if (st != DDL_OK || inner[0] != 1 || inner[1] != 1 || inner[2] != 1 || inner[3] != 1) {
            return ddl_set_error(DDL_EINTERNAL, "nested job of part %d of %d went wrong", p, n);
        }
    }
    if (p >= j->fail_from) {
        return ddl_set_error(p % 2 ? DDL_EIO : DDL_EINVAL, "part %d refuses", p);
    }
    return DDL_OK;
}

static void job_init(job *j, int fail_from, int nested)
{
    memset(j, 0, sizeof *j);
    j->fail_from = fail_from;
    j->nested    = nested;
    pthread_mutex_init(&j->mu, NULL);
}

static void *concurrent_caller(void *arg)
{
    job *j = arg;
    for (int k = 0; k < 20; k++) {
        if (ddl_pool_run("concurrent", 8, job_part, j) != DDL_OK) {
            return (void *)1;
        }
    }
    return NULL;
}

static void test_pool(void)
{
    int cpus = ddl_pool_affinity_cpus();
    ASSERT_TRUE(cpus >= 1);
    job j;
    for (int n = 0; n <= 9; n++) {
        job_init(&j, 1000, 0);
        ASSERT_OK(ddl_pool_run("pool", n, job_part, &j));
        for (int p = 0; p < DDL_POOL_MAX_PARTS; p++) {
            ASSERT_EQ(j.runs[p], p < n ? 1 : 0);
        }
    }
    ddl_pool_stats s = ddl_pool_stats_get();
    int            want = (cpus < 9 ? cpus : 9) - 1;
    ASSERT_EQ(s.workers, want);
    ASSERT_EQ(s.created, want);
    if (want > 0) {
        // A wider job than the workers: the workers ran parts (not only the caller).
        job_init(&j, 1000, 0);
        int seen_other = 0;
        for (int k = 0; k < 50 && !seen_other; k++) {
            ASSERT_OK(ddl_pool_run("pool", 8, job_part, &j));
            for (int p = 0; p < 8; p++) {
                seen_other |= !pthread_equal(j.who[p], pthread_self());
            }
        }
        ASSERT_TRUE(seen_other);
    }
    // Failures: the lowest failing part wins, with its message, whatever thread ran it.
    job_init(&j, 3, 0);
    ddl_status st = ddl_pool_run("failing", 8, job_part, &j);
    ASSERT_EQ(st, DDL_EIO);
    ASSERT_TRUE(strstr(ddl_last_error(), "failing: part 3 of 8: part 3 refuses") != NULL);
    for (int p = 0; p < 8; p++) {
        ASSERT_EQ(j.runs[p], 1); // every part ran even so
    }
    job_init(&j, 0, 0);
    ASSERT_STATUS(ddl_pool_run("failing", 5, job_part, &j), DDL_EINVAL);
    ASSERT_TRUE(strstr(ddl_last_error(), "part 0 of 5: part 0 refuses") != NULL);
    // The same on the caller alone.
    int prev = ddl_pool_set_max_workers(0);
    job_init(&j, 3, 0);
    ASSERT_STATUS(ddl_pool_run("inline", 8, job_part, &j), DDL_EIO);
    ASSERT_TRUE(strstr(ddl_last_error(), "inline: part 3 of 8: part 3 refuses") != NULL);
    for (int p = 0; p < 8; p++) {
        ASSERT_EQ(j.runs[p], 1);
        ASSERT_TRUE(pthread_equal(j.who[p], pthread_self()));
    }
    ddl_pool_set_max_workers(prev);
    // Bad arguments.
    ASSERT_STATUS(ddl_pool_run("bad", DDL_POOL_MAX_PARTS + 1, job_part, &j), DDL_EINVAL);
    ASSERT_STATUS(ddl_pool_run("bad", -1, job_part, &j), DDL_EINVAL);
    ASSERT_STATUS(ddl_pool_run("bad", 2, NULL, &j), DDL_EINVAL);
    // Parts that run jobs of their own: those run on their caller, and finish.
    job_init(&j, 1000, 1);
    ASSERT_OK(ddl_pool_run("nested", 6, job_part, &j));
    for (int p = 0; p < 6; p++) {
        ASSERT_EQ(j.runs[p], 1);
    }
    // Several threads at once: each job completes, whoever owns the pool.
    job       jc[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        job_init(&jc[i], 1000, 0);
        ASSERT_EQ(pthread_create(&th[i], NULL, concurrent_caller, &jc[i]), 0);
    }
    for (int i = 0; i < 3; i++) {
        void *ret;
        pthread_join(th[i], &ret);
        ASSERT_TRUE(ret == NULL);
        for (int p = 0; p < 8; p++) {
            ASSERT_EQ(jc[i].runs[p], 20);
        }
    }
    s = ddl_pool_stats_get();
    ASSERT_EQ(s.created, want); // none of that created a thread
    printf("pool: %d CPUs in the affinity mask, %d workers, %lld jobs on workers, %lld on the "
           "caller alone\n",
           cpus, s.workers, (long long)s.jobs, (long long)s.inline_jobs);
}

// ---- conv steps ------------------------------------------------------------------------

typedef struct conv_net {
    ddl_conv_geom g[2];
    float        *x, *w[2], *b[2], *y[2], *dy[2], *dx, *dw[2], *db[2];
    void         *ws;
    size_t        ws_bytes;
} conv_net;

static float *randf(int64_t n, uint64_t seed)
{
    float *v = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; i < n; i++) {
        v[i] = (float)(2.0 * ddl_rng_uniform(seed, 0, (uint64_t)i) - 1.0);
    }
    return v;
}

static int64_t numel_in(const ddl_conv_geom *g)
{
    return g->N * g->C_in * g->in[0] * g->in[1] * g->in[2];
}
static int64_t numel_out(const ddl_conv_geom *g)
{
    return g->N * g->C_out * g->out[0] * g->out[1] * g->out[2];
}
static int64_t numel_w(const ddl_conv_geom *g)
{
    return g->C_out * g->C_in * g->k[0] * g->k[1] * g->k[2];
}

// LeNet-5's two convolutions at batch 64: 1 -> 6, 28x28, 5x5, pad 2 (the "wide"
// layout) and 6 -> 16, 14x14, 5x5 (blocks of whole samples).
static void net_init(conv_net *c)
{
    memset(c, 0, sizeof *c);
    const int64_t in0[2] = {28, 28}, in1[2] = {14, 14}, k[2] = {5, 5}, p0[2] = {2, 2};
    ASSERT_OK(ddl_conv_geom_init(&c->g[0], 2, 64, 1, 6, in0, k, NULL, p0, NULL));
    ASSERT_OK(ddl_conv_geom_init(&c->g[1], 2, 64, 6, 16, in1, k, NULL, NULL, NULL));
    c->x = randf(numel_in(&c->g[0]), 1);
    c->dx = calloc((size_t)numel_in(&c->g[1]), sizeof(float));
    for (int l = 0; l < 2; l++) {
        c->w[l]  = randf(numel_w(&c->g[l]), 10 + l);
        c->b[l]  = randf(c->g[l].C_out, 20 + l);
        c->y[l]  = calloc((size_t)numel_out(&c->g[l]), sizeof(float));
        c->dy[l] = randf(numel_out(&c->g[l]), 30 + l);
        c->dw[l] = calloc((size_t)numel_w(&c->g[l]), sizeof(float));
        c->db[l] = calloc((size_t)c->g[l].C_out, sizeof(float));
        size_t need = ddl_conv_workspace_bytes(DDL_F32, &c->g[l]);
        c->ws_bytes = need > c->ws_bytes ? need : c->ws_bytes;
    }
    c->ws = malloc(c->ws_bytes);
}

static void net_free(conv_net *c)
{
    free(c->x), free(c->dx), free(c->ws);
    for (int l = 0; l < 2; l++) {
        free(c->w[l]), free(c->b[l]), free(c->y[l]), free(c->dy[l]), free(c->dw[l]),
            free(c->db[l]);
    }
}

// One step: conv1 forward on x, conv2 forward on a 14x14 crop of conv1's output (any
// input of the right size does), and both backward (dw, db accumulate across steps).
static void net_step(conv_net *c)
{
    ASSERT_OK(ddl_conv_forward(DDL_F32, &c->g[0], c->y[0], c->x, c->w[0], c->b[0], c->ws,
                               c->ws_bytes));
    ASSERT_OK(ddl_conv_forward(DDL_F32, &c->g[1], c->y[1], c->y[0], c->w[1], c->b[1], c->ws,
                               c->ws_bytes));
    ASSERT_OK(ddl_conv_backward(DDL_F32, &c->g[1], c->dx, c->dw[1], c->db[1], c->dy[1], c->y[0],
                                c->w[1], c->ws, c->ws_bytes));
    ASSERT_OK(ddl_conv_backward(DDL_F32, &c->g[0], NULL, c->dw[0], c->db[0], c->dy[0], c->x,
                                c->w[0], c->ws, c->ws_bytes));
}

// FNV-1a over everything the steps wrote.
static uint64_t net_hash(const conv_net *c)
{
    uint64_t h = 1469598103934665603ull;
    const struct {
        const void *p;
        size_t      n;
    } parts[] = {
        {c->y[0], (size_t)numel_out(&c->g[0])}, {c->y[1], (size_t)numel_out(&c->g[1])},
        {c->dx, (size_t)numel_in(&c->g[1])},    {c->dw[0], (size_t)numel_w(&c->g[0])},
        {c->dw[1], (size_t)numel_w(&c->g[1])},  {c->db[0], (size_t)c->g[0].C_out},
        {c->db[1], (size_t)c->g[1].C_out},
    };
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        const unsigned char *b = parts[i].p;
        for (size_t k = 0; k < parts[i].n * sizeof(float); k++) {
            h = (h ^ b[k]) * 1099511628211ull;
        }
    }
    return h;
}

// `steps` steps from a fresh net; the hash of the result.
static uint64_t net_run(int steps)
{
    conv_net c;
    net_init(&c);
    for (int s = 0; s < steps; s++) {
        net_step(&c);
    }
    uint64_t h = net_hash(&c);
    net_free(&c);
    return h;
}

// The same 5 steps with the pool, on the caller alone, and in a forked child: the same
// bits. Run before test_conv_steps: OpenBLAS stops its threads around fork and starts
// them again at the next threaded call, which must not happen as the process exits
// (LeakSanitizer then sees a thread half started).
static void test_same_bits(void)
{
    int      prev   = ddl_blas_set_threads(2);
    int      cpus   = ddl_pool_affinity_cpus();
    uint64_t pooled = net_run(5);
    int      cap    = ddl_pool_set_max_workers(0);
    uint64_t alone  = net_run(5);
    ddl_pool_set_max_workers(cap);
    ASSERT_TRUE(pooled == alone);
    ASSERT_TRUE(net_run(5) == pooled);
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        // The workers stayed in the parent: the child's pool starts empty, builds its own,
        // and computes the same bits.
        ddl_pool_stats cs = ddl_pool_stats_get();
        int            ok = cs.workers == 0 && net_run(5) == pooled;
        cs                = ddl_pool_stats_get();
        ok                = ok && cs.workers == (cpus >= 2 ? 1 : 0);
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    ddl_blas_set_threads(prev);
}

static void test_conv_steps(void)
{
    enum { STEPS = 200 };
    int prev = ddl_blas_set_threads(2);
    int cpus = ddl_pool_affinity_cpus();
    // Warm up: the pool's workers and OpenBLAS's own threads come to be here.
    conv_net c;
    net_init(&c);
    net_step(&c);
    ddl_pool_stats s0    = ddl_pool_stats_get();
    int            task0 = task_count();
    int            c0    = __atomic_load_n(&creates, __ATOMIC_RELAXED);
    for (int s = 0; s < STEPS; s++) {
        net_step(&c);
    }
    ddl_pool_stats s1    = ddl_pool_stats_get();
    int            task1 = task_count();
    int            c1    = __atomic_load_n(&creates, __ATOMIC_RELAXED);
    printf("conv: %d steps (4 conv calls each) with 2 BLAS threads, %d CPUs: threads %d -> %d, "
           "pthread_create calls %d, pool threads created %lld -> %lld, jobs on workers +%lld, "
           "on the caller alone +%lld\n",
           STEPS, cpus, task0, task1, c1 - c0, (long long)s0.created, (long long)s1.created,
           (long long)(s1.jobs - s0.jobs), (long long)(s1.inline_jobs - s0.inline_jobs));
    ASSERT_EQ(c1, c0);
    ASSERT_EQ(task1, task0);
    ASSERT_EQ(s1.created, s0.created);
    // Every call of both layers split in two parts (the batch has the blocks and the work):
    // on a worker when the mask has a second CPU, else on the caller alone.
    if (cpus >= 2) {
        ASSERT_TRUE(s0.workers >= 1);
        ASSERT_EQ(s1.jobs - s0.jobs, 4 * STEPS);
    } else {
        ASSERT_EQ(s1.inline_jobs - s0.inline_jobs, 4 * STEPS);
    }
    net_free(&c);
    ddl_blas_set_threads(prev);
}

// C = A B for a 256 x 256 x 256 f32 product (2^24 multiply-adds: two parts at width 2).
static void big_gemm(float *c, const float *a, const float *b)
{
    ASSERT_OK(ddl_gemm(DDL_F32, false, false, 256, 256, 256, 1.0, a, 256, b, 256, 0.0, c, 256));
}

static void test_one_owner(void)
{
    enum { N = 256 * 256, STEPS = 50 };
    int    prev = ddl_blas_set_threads(2);
    int    cpus = ddl_pool_affinity_cpus();
    float *a = malloc(sizeof(float) * N), *b = malloc(sizeof(float) * N);
    float *c1 = malloc(sizeof(float) * N), *c2 = malloc(sizeof(float) * N);
    ASSERT_TRUE(a != NULL && b != NULL && c1 != NULL && c2 != NULL);
    for (int i = 0; i < N; i++) {
        a[i] = (float)((i * 37 % 101) - 50) / 50.0f;
        b[i] = (float)((i * 53 % 97) - 48) / 48.0f;
    }
    ASSERT_EQ(openblas_get_num_threads(), 1);
    ddl_pool_stats s0 = ddl_pool_stats_get();
    big_gemm(c1, a, b);
    ddl_pool_stats s1 = ddl_pool_stats_get();
    ASSERT_EQ((s1.jobs - s0.jobs) + (s1.inline_jobs - s0.inline_jobs), 1); // split in parts
    if (cpus >= 2) {
        ASSERT_EQ(s1.jobs - s0.jobs, 1);
    }
    int cap = ddl_pool_set_max_workers(0);
    big_gemm(c2, a, b);
    ddl_pool_set_max_workers(cap);
    ASSERT_TRUE(memcmp(c1, c2, sizeof(float) * N) == 0);
    ddl_blas_set_threads(1);
    big_gemm(c2, a, b);
    ddl_blas_set_threads(2);
    double err = 0.0;
    for (int i = 0; i < N; i++) {
        err = fmax(err, fabs((double)c1[i] - (double)c2[i]));
    }
    ASSERT_TRUE(err < 1e-3);
    printf("gemm 256^3 at width 2 (%s workers) against width 1: max difference %.3g%s\n",
           cpus >= 2 ? "on" : "without", err,
           memcmp(c1, c2, sizeof(float) * N) == 0 ? " (same bits)" : "");

    // OpenBLAS's server threads spin for a while after they start (and after every
    // threaded call); wait until they sleep, then run kernels and check that they stay
    // asleep. Asleep means no tick in three polls in a row (150 ms): on a loaded machine a
    // spinning thread can sit descheduled through one 50 ms poll and spin on after it.
    long long t0 = others_cpu_ticks();
    for (int i = 0, quiet = 0; i < 120 && quiet < 3; i++) {
        usleep(50 * 1000);
        long long t = others_cpu_ticks();
        quiet       = t == t0 ? quiet + 1 : 0;
        t0          = t;
    }
    conv_net c;
    net_init(&c);
    for (int s = 0; s < STEPS; s++) {
        net_step(&c);
        big_gemm(c1, a, b);
    }
    net_free(&c);
    long long t1 = others_cpu_ticks();
    printf("one owner: OpenBLAS threads %d; CPU ticks of threads besides the caller and the "
           "pool during %d conv steps + GEMMs: %lld\n",
           openblas_get_num_threads(), STEPS, t1 - t0);
    ASSERT_EQ(openblas_get_num_threads(), 1);
    ASSERT_TRUE(t1 - t0 <= 2); // clock-tick rounding at both ends
    free(a), free(b), free(c1), free(c2);
    ddl_blas_set_threads(prev);
}

int main(void)
{
    test_pool();
    test_same_bits();
    test_conv_steps();
    test_one_owner();
    printf("test_threadpool: ok\n");
    return 0;
}
