// bench_util.c: see bench_util.h.
#define _GNU_SOURCE
#include "bench_util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ddl_client.h"

double bench_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

double bench_cpu_self(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)u.ru_utime.tv_sec + 1e-6 * (double)u.ru_utime.tv_usec +
           (double)u.ru_stime.tv_sec + 1e-6 * (double)u.ru_stime.tv_usec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double bench_quantile(double *v, int n, double q)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int i = (int)ceil(q * n) - 1;
    return v[i < 0 ? 0 : i >= n ? n - 1 : i];
}

char *bench_read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!s || fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        fclose(f);
        return NULL;
    }
    s[n] = '\0';
    fclose(f);
    return s;
}

bench_proc_sample bench_proc_read(pid_t pid)
{
    bench_proc_sample s = {-1, -1, -1};
    char              path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (f) {
        while (fgets(line, sizeof line, f)) {
            if (strncmp(line, "VmRSS:", 6) == 0)
                s.rss_kb = strtol(line + 6, NULL, 10);
            else if (strncmp(line, "Threads:", 8) == 0)
                s.threads = strtol(line + 8, NULL, 10);
        }
        fclose(f);
    }
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    if (d) {
        long           n = 0;
        struct dirent *e;
        while ((e = readdir(d)) != NULL)
            if (e->d_name[0] != '.')
                n++;
        closedir(d);
        s.fds = n;
    }
    return s;
}

// Clock ticks (user + system) of pid, from /proc/<pid>/stat; -1 when unreadable.
static long long proc_ticks(long pid)
{
    char path[64], line[1024];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return -1;
    }
    char *got = fgets(line, sizeof line, f);
    fclose(f);
    // After the command's closing parenthesis: state is field 3, utime 14, stime 15.
    const char        *p = got != NULL ? strrchr(line, ')') : NULL;
    unsigned long long ut, st;
    if (p == NULL ||
        sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2) {
        return -1;
    }
    return (long long)(ut + st);
}

double bench_tree_cpu_s(pid_t root, int with_root)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)root);
    DIR *d = opendir(path);
    if (d == NULL) {
        return -1;
    }
    long long      total = 0;
    int            n     = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) { // the children of every thread of root
        if (e->d_name[0] == '.') {
            continue;
        }
        char cpath[300];
        snprintf(cpath, sizeof cpath, "/proc/%d/task/%s/children", (int)root, e->d_name);
        FILE *f = fopen(cpath, "r");
        long  child;
        while (f != NULL && fscanf(f, "%ld", &child) == 1) {
            long long t = proc_ticks(child);
            if (t >= 0) {
                total += t;
                n++;
            }
        }
        if (f != NULL) {
            fclose(f);
        }
    }
    closedir(d);
    if (with_root) {
        long long t = proc_ticks((long)root);
        if (t < 0) {
            return -1;
        }
        total += t;
        n++;
    }
    return n > 0 ? (double)total / (double)sysconf(_SC_CLK_TCK) : -1;
}

const char *bench_self_exe(void)
{
    static char exe[PATH_MAX];
    ssize_t     k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (k <= 0) {
        fprintf(stderr, "%s: /proc/self/exe: %s\n", program_invocation_short_name, strerror(errno));
        return NULL;
    }
    exe[k] = '\0';
    return exe;
}

int bench_daemon_start(bench_daemon *d, int np, const char *bind_to, const char *tmp,
                       const char *const *args)
{
    // posix_spawn copies argv into the child before it returns, so these may be local.
    char        exe[PATH_MAX + 16], self[PATH_MAX], npbuf[16], flags[] = DDL_MPIEXEC_FLAGS;
    const char *me = bench_self_exe();
    if (me == NULL) {
        return -1;
    }
    snprintf(self, sizeof self, "%s", me);
    snprintf(exe, sizeof exe, "%s/distdld", dirname(self));
    snprintf(npbuf, sizeof npbuf, "%d", np);
    snprintf(d->addr_file, sizeof d->addr_file, "%s/addr-np%d", tmp, np);
    const char *argv[64];
    int         n = 0;
    argv[n++]     = DDL_MPIEXEC;
    argv[n++]     = "-np";
    argv[n++]     = npbuf;
    if (bind_to != NULL) {
        argv[n++] = "--bind-to";
        argv[n++] = bind_to;
    }
    for (char *tok = strtok(flags, " "); tok && n < 40; tok = strtok(NULL, " ")) {
        argv[n++] = tok;
    }
    argv[n++] = exe;
    argv[n++] = "--listen";
    argv[n++] = "127.0.0.1:0";
    argv[n++] = "--address-file";
    argv[n++] = d->addr_file;
    for (int i = 0; args != NULL && args[i] != NULL && n < 63; i++) {
        argv[n++] = args[i];
    }
    argv[n] = NULL;
    char log[PATH_MAX + 32];
    snprintf(log, sizeof log, "%s/daemon-np%d.log", tmp, np);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    int rc = posix_spawn(&d->pid, argv[0], &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
        fprintf(stderr, "%s: cannot start %s: %s\n", program_invocation_short_name, argv[0],
                strerror(rc));
        d->pid = 0;
        return -1;
    }
    return 0;
}

int bench_daemon_wait(bench_daemon *d)
{
    for (int i = 0; i < 1200; i++) {
        FILE *f = fopen(d->addr_file, "r");
        if (f) {
            int ok = fgets(d->address, sizeof d->address, f) != NULL;
            fclose(f);
            d->address[strcspn(d->address, "\r\n")] = '\0';
            if (ok && d->address[0]) {
                return 0;
            }
        }
        int status;
        if (waitpid(d->pid, &status, WNOHANG) == d->pid) {
            fprintf(stderr, "%s: the daemon exited before listening (see its log)\n",
                    program_invocation_short_name);
            d->pid = 0;
            return -1;
        }
        usleep(100000);
    }
    fprintf(stderr, "%s: no address in %s\n", program_invocation_short_name, d->addr_file);
    return -1;
}

void bench_daemon_stop(bench_daemon *d)
{
    if (d->pid <= 0) {
        return;
    }
    if (d->address[0]) {
        ddl_client_t      *c;
        ddl_client_options o = ddl_client_options_default();
        o.connect_timeout_s  = 5;
        if (ddl_client_connect(d->address, &o, &c) == DDL_OK) {
            ddl_client_shutdown(c, 0, NULL);
            ddl_client_destroy(&c);
        }
    }
    for (int i = 0; i < 300; i++) {
        int status;
        if (waitpid(d->pid, &status, WNOHANG) == d->pid) {
            d->pid = 0;
            return;
        }
        usleep(100000);
    }
    kill(d->pid, SIGKILL); // our own child, after 30 s of a shutdown not taking
    waitpid(d->pid, NULL, 0);
    d->pid = 0;
}

void bench_tmp_done(const char *prog, const char *tmp, int rc)
{
    if (rc != 0) {
        fprintf(stderr, "%s: logs in %s\n", prog, tmp);
        return;
    }
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (system(cmd) != 0) {
        fprintf(stderr, "%s: could not remove %s\n", prog, tmp);
    }
}
