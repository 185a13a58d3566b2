// tests/kernels/test_blas_startup.c: the start-up choice of the OpenBLAS core.
//
// 1. ddl_blas_choose_core as a table (pure: core name + CPU flags -> core or none).
// 2. ddl_blas_startup end to end: this program runs copies of itself (--child) with a
//    preset OPENBLAS_CORETYPE=Prescott (in the child's environment only) and checks the
//    core each ends with, how many times it was executed, and the summary:
//      (a) DDL_BLAS_TEST_FORCE=1 lets the logic override Prescott: on a CPU with AVX2 or
//          AVX-512 the re-executed image runs the chosen core and passed its self-check;
//      (b) DDL_BLAS_AUTO=0 keeps Prescott;
//      (c) a user's OPENBLAS_CORETYPE wins (no force): Prescott kept, no exec;
//      (d) no loop: a candidate that is not running (marker SkylakeX while Prescott is
//          forced) falls back once, and a fallback marker is never followed again.
//    Skips (7) after the rest when the CPU has neither AVX2+FMA nor AVX-512, as (a) then
//    has nothing to choose.
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ddl/blas.h"
#include "test.h"

// ---- 1. the pure decision --------------------------------------------------------

static void test_choose_table(void)
{
    static const ddl_blas_cpu none = {0};
    static const ddl_blas_cpu avx2 = {.avx2 = true, .fma = true};
    static const ddl_blas_cpu avx2_nofma = {.avx2 = true};
    static const ddl_blas_cpu avx512 = {true, true, true, true, true, true};
    static const ddl_blas_cpu avx512f_only = {.avx2 = true, .fma = true, .avx512f = true};
    const struct {
        const char         *core;
        const ddl_blas_cpu *cpu;
        const char         *want; // NULL: keep
    } rows[] = {
        {"Prescott", &avx512, "SkylakeX"},     // this machine: Xeon model 207, 0.3.21
        {"prescott", &avx512, "SkylakeX"},     // any case
        {"Prescott", &avx2, "Haswell"},
        {"Prescott", &avx512f_only, "Haswell"}, // AVX-512 without BW/VL/DQ: not SkylakeX
        {"Prescott", &avx2_nofma, NULL},
        {"Prescott", &none, NULL},              // a real SSE3 machine
        {"Nehalem", &avx2, "Haswell"},
        {"Sandybridge", &avx512, "SkylakeX"},
        {"Core2", &avx2, "Haswell"},
        {"Katmai", &avx2, "Haswell"},
        {"Atom", &avx2, "Haswell"},
        {"Barcelona", &avx2, "Haswell"},
        {"Haswell", &avx512, NULL},             // a deliberate choice (AMD presets it)
        {"Zen", &avx2, NULL},
        {"SkylakeX", &avx512, NULL},
        {"Cooperlake", &avx512, NULL},
        {"Excavator", &avx2, NULL},
        {"", &avx512, NULL},
        {NULL, &avx512, NULL},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const char *got = ddl_blas_choose_core(rows[i].core, rows[i].cpu);
        if ((got == NULL) != (rows[i].want == NULL) ||
            (got != NULL && strcmp(got, rows[i].want) != 0)) {
            TEST_FAIL_("row %zu: core %s -> %s, expected %s", i,
                       rows[i].core ? rows[i].core : "(null)", got ? got : "keep",
                       rows[i].want ? rows[i].want : "keep");
        }
    }
    ASSERT_TRUE(ddl_blas_choose_core("Prescott", NULL) == NULL);
}

// ---- 2. end to end through copies of this program ---------------------------------

// The child: count our executions (the counter survives execv in the environment),
// run the start-up logic, report.
static int child_main(int argc, char **argv)
{
    const char *n = getenv("DDL_BLAS_TEST_EXECS");
    char        buf[16];
    snprintf(buf, sizeof buf, "%d", (n != NULL ? atoi(n) : 0) + 1);
    setenv("DDL_BLAS_TEST_EXECS", buf, 1);
    ddl_blas_startup(argc, argv);
    const char *m = getenv("DDL_BLAS_REEXEC");
    printf("core=%s execs=%s marker=%s summary=%s\n", ddl_blas_core(), buf, m ? m : "none",
           ddl_blas_summary());
    return 0;
}

typedef struct {
    const char *coretype, *autov, *force, *marker; // NULL: unset in the child
} child_env;

static void put(const char *name, const char *v)
{
    if (v != NULL) {
        setenv(name, v, 1);
    } else {
        unsetenv(name);
    }
}

// Runs /proc/self/exe --child with env; its stdout line into out.
static void run_child(const child_env *e, char *out, size_t n)
{
    int fd[2];
    ASSERT_EQ(pipe(fd), 0);
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        put("OPENBLAS_CORETYPE", e->coretype);
        put("DDL_BLAS_AUTO", e->autov);
        put("DDL_BLAS_TEST_FORCE", e->force);
        put("DDL_BLAS_REEXEC", e->marker);
        unsetenv("DDL_BLAS_TEST_EXECS");
        dup2(fd[1], 1);
        close(fd[0]), close(fd[1]);
        execl("/proc/self/exe", "test_blas_startup", "--child", (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    size_t got = 0;
    ssize_t r;
    while (got + 1 < n && (r = read(fd[0], out + got, n - 1 - got)) > 0) {
        got += (size_t)r;
    }
    out[got] = '\0';
    close(fd[0]);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    fprintf(stderr, "  child: %s", out);
}

static void expect(const char *out, const char *want)
{
    if (strstr(out, want) == NULL) {
        TEST_FAIL_("expected \"%s\" in: %s", want, out);
    }
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--child") == 0) {
        return child_main(argc, argv);
    }
    test_choose_table();

    char out[1024], want[128];
    // (b) DDL_BLAS_AUTO=0 keeps the preset core even when forced.
    run_child(&(child_env){"Prescott", "0", "1", NULL}, out, sizeof out);
    expect(out, "core=Prescott execs=1 marker=none");
    expect(out, "auto off");
    // (c) the user's value wins: no force, Prescott stays.
    run_child(&(child_env){"Prescott", NULL, NULL, NULL}, out, sizeof out);
    expect(out, "core=Prescott execs=1 marker=none");
    expect(out, "OPENBLAS_CORETYPE=Prescott set by the user");
    // (d) a candidate that is not running: one fallback exec, back on Prescott.
    run_child(&(child_env){"Prescott", NULL, "1", "SkylakeX:Prescott:Prescott"}, out,
              sizeof out);
    expect(out, "core=Prescott execs=2 marker=none");
    expect(out, "SkylakeX failed its self-check");
    // (d) a fallback marker is the end of the chain.
    run_child(&(child_env){"Prescott", NULL, "1", "fallback:test reason"}, out, sizeof out);
    expect(out, "core=Prescott execs=1 marker=none");
    expect(out, "auto: test reason");

    // (a) forced Prescott, the logic asked to choose.
    ddl_blas_cpu cpu;
    ddl_blas_cpu_detect(&cpu);
    const char *best = ddl_blas_choose_core("Prescott", &cpu);
    if (best == NULL) {
        fprintf(stderr, "SKIP (a): this CPU has neither AVX2+FMA nor AVX-512 F/BW/VL/DQ\n");
        return DDL_TEST_SKIP;
    }
    run_child(&(child_env){"Prescott", NULL, "1", NULL}, out, sizeof out);
    snprintf(want, sizeof want, "core=%s execs=2 marker=none", best);
    expect(out, want);
    expect(out, "auto: was Prescott");
    printf("test_blas_startup: OK (this CPU: %s)\n", best);
    return 0;
}
