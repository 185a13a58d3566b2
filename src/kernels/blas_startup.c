// kernels/blas_startup.c: start-up choice of the OpenBLAS core (see ddl/blas.h).
//
// The flow, in one process id (execv keeps the pid, so mpirun and Slurm see nothing):
//   1. no marker: user's OPENBLAS_CORETYPE or DDL_BLAS_AUTO=0 -> keep. Else, if the
//      running core is a fallback and the CPU can do better, set OPENBLAS_CORETYPE to the
//      candidate and DDL_BLAS_REEXEC=<candidate>:<was>:<original>, and execv.
//   2. marker <candidate>: the library loaded with the candidate; check it is the one
//      running and that sgemm/dgemm agree with the naive reference. Pass -> drop the
//      marker and go on. Fail -> restore the original OPENBLAS_CORETYPE, set the marker to
//      fallback:<reason> and execv once more.
//   3. marker fallback: log the reason, drop the marker and go on with the original core.
// So at most two execs, and a marker never survives into the program proper.
#define _GNU_SOURCE
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "ddl/blas.h"
#include "ddl/kernels.h"

#define MARKER "DDL_BLAS_REEXEC"

static char summary[256] = "";

// ---- the decision ------------------------------------------------------------

// Cores OpenBLAS runs when it does not recognise the CPU (Prescott is its generic x86-64
// fallback; Katmai..Banias older generic ones), or when it believes AVX/AVX2 unusable
// (Core2/Penryn/Dunnington/Nehalem/Atom, Sandybridge; AMD's pre-AVX2 Opteron/Barcelona/
// Bobcat). None has AVX2 kernels, so on a CPU with AVX2+FMA any of them leaves most of the
// machine idle. Haswell, Zen, SkylakeX, Cooperlake, SapphireRapids and the AMD
// Bulldozer family are deliberate choices and never replaced (Haswell is also what AMD
// machines preset).
static const char *const fallback_cores[] = {
    "Katmai", "Coppermine", "Northwood", "Prescott", "Banias",       "Atom",
    "Core2",  "Penryn",     "Dunnington", "Nehalem", "Sandybridge", "Opteron",
    "Opteron_SSE3", "Barcelona", "Bobcat",
};

const char *ddl_blas_choose_core(const char *corename, const ddl_blas_cpu *cpu)
{
    if (corename == NULL || cpu == NULL) {
        return NULL;
    }
    bool fallback = false;
    for (size_t i = 0; i < sizeof fallback_cores / sizeof fallback_cores[0]; i++) {
        fallback = fallback || strcasecmp(corename, fallback_cores[i]) == 0;
    }
    if (!fallback) {
        return NULL;
    }
    if (cpu->avx512f && cpu->avx512bw && cpu->avx512vl && cpu->avx512dq) {
        return "SkylakeX";
    }
    if (cpu->avx2 && cpu->fma) {
        return "Haswell";
    }
    return NULL;
}

void ddl_blas_cpu_detect(ddl_blas_cpu *cpu)
{
    *cpu = (ddl_blas_cpu){0};
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    cpu->avx2     = __builtin_cpu_supports("avx2");
    cpu->fma      = __builtin_cpu_supports("fma");
    cpu->avx512f  = __builtin_cpu_supports("avx512f");
    cpu->avx512bw = __builtin_cpu_supports("avx512bw");
    cpu->avx512vl = __builtin_cpu_supports("avx512vl");
    cpu->avx512dq = __builtin_cpu_supports("avx512dq");
#endif
}

// ---- helpers -----------------------------------------------------------------

const char *ddl_blas_core(void)
{
    const char *c = openblas_get_corename();
    return c != NULL ? c : "unknown";
}

// "OpenBLAS 0.3.21" from openblas_get_config() ("OpenBLAS 0.3.21 DYNAMIC_ARCH ...").
static void blas_version(char *out, size_t n)
{
    const char *cfg = openblas_get_config();
    int         len = 0, words = 0;
    while (cfg != NULL && cfg[len] != '\0' && !(cfg[len] == ' ' && ++words == 2)) {
        len++;
    }
    snprintf(out, n, "%.*s", len, cfg != NULL ? cfg : "OpenBLAS");
}

// Rank 0 of the job (or not under a launcher): the one that prints.
static bool first_rank(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK",
                                       "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v != NULL) {
            return strcmp(v, "0") == 0;
        }
    }
    return true;
}

static void set_summary(const char *fmt, const char *a, const char *b)
{
    char ver[64];
    blas_version(ver, sizeof ver);
    char how[160];
    snprintf(how, sizeof how, fmt, a != NULL ? a : "", b != NULL ? b : "");
    snprintf(summary, sizeof summary, "%s core %s (%s)", ver, ddl_blas_core(), how);
}

// A 64x48x80 sgemm and dgemm (C = A B and C = A^T B + C) against the naive reference.
// The inputs are multiples of 1/8 in [-6/8, 6/8], so both results are exact in either
// precision and any difference means broken kernels. About a millisecond.
static bool self_check(char *why, size_t n)
{
    enum { M = 64, N = 48, K = 80 };
    static double a[M * K], b[K * N], c[M * N], r[M * N];
    static float  af[M * K], bf[K * N], cf[M * N], rf[M * N];
    for (int i = 0; i < M * K; i++) {
        a[i] = (double)((i * 7) % 13 - 6) / 8.0, af[i] = (float)a[i];
    }
    for (int i = 0; i < K * N; i++) {
        b[i] = (double)((i * 5) % 11 - 5) / 8.0, bf[i] = (float)b[i];
    }
    for (int t = 0; t < 2; t++) {
        bool trans = t == 1; // A read as [K, M] transposed: same buffer, other shape
        int  lda   = trans ? M : K;
        for (int i = 0; i < M * N; i++) {
            c[i] = r[i] = (double)(i % 3), cf[i] = rf[i] = (float)(i % 3);
        }
        double beta = trans ? 1.0 : 0.0;
        if (ddl_gemm(DDL_F64, trans, false, M, N, K, 1.0, a, lda, b, N, beta, c, N) != DDL_OK ||
            ddl_gemm_naive(DDL_F64, trans, false, M, N, K, 1.0, a, lda, b, N, beta, r, N) !=
                DDL_OK ||
            ddl_gemm(DDL_F32, trans, false, M, N, K, 1.0, af, lda, bf, N, beta, cf, N) !=
                DDL_OK ||
            ddl_gemm_naive(DDL_F32, trans, false, M, N, K, 1.0, af, lda, bf, N, beta, rf, N) !=
                DDL_OK) {
            snprintf(why, n, "gemm refused: %s", ddl_last_error());
            return false;
        }
        for (int i = 0; i < M * N; i++) {
            if (!(fabs(c[i] - r[i]) <= 1e-12 * (1 + fabs(r[i])))) {
                snprintf(why, n, "dgemm%s differs from the reference at %d: %g vs %g",
                         trans ? " (A^T)" : "", i, c[i], r[i]);
                return false;
            }
            if (!(fabsf(cf[i] - rf[i]) <= 1e-5f * (1 + fabsf(rf[i])))) {
                snprintf(why, n, "sgemm%s differs from the reference at %d: %g vs %g",
                         trans ? " (A^T)" : "", i, (double)cf[i], (double)rf[i]);
                return false;
            }
        }
    }
    return true;
}

// ---- start-up ------------------------------------------------------------------

// Restores OPENBLAS_CORETYPE as the user had it ("-" = unset).
static void restore_coretype(const char *orig)
{
    if (orig == NULL || strcmp(orig, "-") == 0) {
        unsetenv("OPENBLAS_CORETYPE");
    } else {
        setenv("OPENBLAS_CORETYPE", orig, 1);
    }
}

// Second and third stages: we are the re-executed image.
static void after_reexec(char **argv, const char *marker)
{
    char m[192];
    snprintf(m, sizeof m, "%s", marker);
    unsetenv(MARKER);
    if (strncmp(m, "fallback:", 9) == 0) {
        if (first_rank()) {
            fprintf(stderr, "ddl: BLAS core kept: %s\n", m + 9);
        }
        set_summary("auto: %s", m + 9, NULL);
        return;
    }
    // <candidate>:<was>:<original OPENBLAS_CORETYPE>
    char *was  = strchr(m, ':');
    char *orig = was != NULL ? strchr(was + 1, ':') : NULL;
    if (orig == NULL) {
        set_summary("auto: ignored a malformed " MARKER, NULL, NULL);
        return;
    }
    *was++ = '\0', *orig++ = '\0';
    char why[160] = "";
    if (strcasecmp(ddl_blas_core(), m) != 0) {
        snprintf(why, sizeof why, "OPENBLAS_CORETYPE=%.40s gave core %.40s", m, ddl_blas_core());
    } else if (!self_check(why, sizeof why)) {
        // why says what failed
    } else {
        // Left for our children (mpirun, a daemon, a helper): their OPENBLAS_CORETYPE
        // then reads as inherited, not as the user's.
        setenv("DDL_BLAS_CHOSEN", m, 1);
        set_summary("auto: was %s", was, NULL);
        return;
    }
    char fb[320];
    snprintf(fb, sizeof fb, "fallback:%.40s failed its self-check (%s), kept %.40s", m, why,
             was);
    restore_coretype(orig);
    setenv(MARKER, fb, 1);
    execv("/proc/self/exe", argv);
    // Still here: the exec failed, and this process runs the unverified candidate.
    unsetenv(MARKER);
    if (first_rank()) {
        fprintf(stderr, "ddl: BLAS core %s failed its self-check (%s) and re-exec failed; "
                        "set DDL_BLAS_AUTO=0\n", m, why);
    }
    set_summary("auto: UNVERIFIED, %s", why, NULL);
}

void ddl_blas_startup(int argc, char **argv)
{
    (void)argc;
    const char *marker = getenv(MARKER);
    if (marker != NULL) {
        after_reexec(argv, marker);
        return;
    }
    const char *user  = getenv("OPENBLAS_CORETYPE");
    const char *autov = getenv("DDL_BLAS_AUTO");
    const char *force = getenv("DDL_BLAS_TEST_FORCE");
    if (autov != NULL && strcmp(autov, "0") == 0) {
        set_summary("auto off: DDL_BLAS_AUTO=0", NULL, NULL);
        return;
    }
    if (user != NULL && !(force != NULL && strcmp(force, "1") == 0)) {
        const char *chosen = getenv("DDL_BLAS_CHOSEN");
        if (chosen != NULL && strcmp(chosen, user) == 0) {
            set_summary("auto, inherited from the parent process", NULL, NULL);
        } else {
            set_summary("OPENBLAS_CORETYPE=%s set by the user", user, NULL);
        }
        return;
    }
    ddl_blas_cpu cpu;
    ddl_blas_cpu_detect(&cpu);
    char was[64];
    snprintf(was, sizeof was, "%s", ddl_blas_core());
    const char *best = ddl_blas_choose_core(was, &cpu);
    if (best == NULL) {
        set_summary("chosen by OpenBLAS", NULL, NULL);
        return;
    }
    char m[192];
    snprintf(m, sizeof m, "%s:%s:%s", best, was, user != NULL ? user : "-");
    setenv("OPENBLAS_CORETYPE", best, 1);
    setenv(MARKER, m, 1);
    execv("/proc/self/exe", argv);
    unsetenv(MARKER);
    restore_coretype(user != NULL ? user : "-");
    if (first_rank()) {
        fprintf(stderr, "ddl: could not re-execute with OPENBLAS_CORETYPE=%s; running %s\n",
                best, was);
    }
    set_summary("auto: re-exec for %s failed", best, NULL);
}

const char *ddl_blas_summary(void)
{
    if (summary[0] == '\0') {
        set_summary("ddl_blas_startup not called", NULL, NULL);
    }
    return summary;
}

void ddl_blas_log(const char *prog, int threads)
{
    int t = threads >= 1 ? threads : ddl_blas_set_threads(0);
    fprintf(stderr, "%s: BLAS %s, %d thread%s per rank, convolutions %s\n", prog,
            ddl_blas_summary(), t, t == 1 ? "" : "s", ddl_conv_path());
}
