// ddl/blas.h: which OpenBLAS kernels a program runs with, chosen once at start-up.
//
// OpenBLAS picks its kernels (its "core") when the library loads, from the CPU it
// recognises. An OpenBLAS older than the CPU does not recognise it and falls back to a
// generic core: Debian's 0.3.21 on an Intel Xeon family 6 model 207 (AVX-512) runs its
// SSE3 `Prescott` kernels, about 4x slower in sgemm than `SkylakeX`. The core can only be
// changed through OPENBLAS_CORETYPE before the library loads, so a program that finds
// itself on a fallback core re-executes itself once with a better one.
//
// Every program calls ddl_blas_startup first thing in main(), before MPI_Init, grpc_init,
// any thread or any BLAS call:
//   int main(int argc, char **argv)
//   {
//       ddl_blas_startup(argc, argv);           // may execv itself: nothing before it
//       MPI_Init(&argc, &argv);
//       ...
//       if (rank == 0) ddl_blas_log("distdl-train", threads);
//
// Environment (documented in docs/DECISIONS.md):
//   OPENBLAS_CORETYPE  set by the user: always kept (only logged).
//   DDL_BLAS_AUTO=0    turns the choice off: the core OpenBLAS picked is kept.
//   DDL_BLAS_REEXEC    internal marker between a process and its re-executed image
//                      ("<candidate>:<was>:<original OPENBLAS_CORETYPE or ->", or
//                      "fallback:<reason>"); it is removed before main() continues.
//   DDL_BLAS_CHOSEN    set after a verified switch to the core chosen, so that child
//                      processes log their inherited OPENBLAS_CORETYPE as such.
//   DDL_BLAS_TEST_FORCE=1  test only: lets the choice override a preset OPENBLAS_CORETYPE
//                      (tests force Prescott to exercise the logic on any CPU).
#ifndef DDL_BLAS_H
#define DDL_BLAS_H

#include <stdbool.h>

#include "ddl/status.h"

#ifdef __cplusplus
extern "C" {
#endif

// The CPU features the choice depends on (as usable by user code: the compiler's
// __builtin_cpu_supports checks the OS saves the registers, too).
typedef struct ddl_blas_cpu {
    bool avx2, fma;                               // -> Haswell
    bool avx512f, avx512bw, avx512vl, avx512dq;   // -> SkylakeX
} ddl_blas_cpu;

// Fills *cpu from the running CPU. Not collective; cheap.
DDL_EXTERN void ddl_blas_cpu_detect(ddl_blas_cpu *cpu);

// The pure decision: the core to switch to when `corename` (openblas_get_corename(),
// any case) is a generic fallback core and the CPU can run a better one, else NULL.
// Returns "SkylakeX" (avx512f+bw+vl+dq) or "Haswell" (avx2+fma), static strings.
// A core that is not a fallback (Haswell, Zen, SkylakeX, ...) is never replaced.
DDL_EXTERN const char *ddl_blas_choose_core(const char *corename, const ddl_blas_cpu *cpu);

// The start-up check described above. argv must be main()'s (argv[argc] == NULL): on a
// switch the process execv's /proc/self/exe with the same argv, at most twice (the
// candidate, then, if the candidate is not running or fails a small sgemm/dgemm against
// the naive reference, the original environment). Warnings go to stderr on rank 0 (rank
// from the launcher's environment). Never fails: on any problem the program keeps the
// core it has. Not thread-safe; call before anything else.
DDL_EXTERN void ddl_blas_startup(int argc, char **argv);

// The core running now (openblas_get_corename()).
DDL_EXTERN const char *ddl_blas_core(void);

// What ddl_blas_startup decided, e.g. "OpenBLAS 0.3.21 core SkylakeX (auto: was
// Prescott)" or "... core Haswell (OPENBLAS_CORETYPE set by the user)". Static storage.
DDL_EXTERN const char *ddl_blas_summary(void);

// Prints "<prog>: BLAS <summary>, <threads> thread(s) per rank, convolutions <path>"
// (ddl_conv_path) to stderr; threads < 1 means the BLAS's current count. Call it once,
// on rank 0.
DDL_EXTERN void ddl_blas_log(const char *prog, int threads);

#ifdef __cplusplus
}
#endif
#endif // DDL_BLAS_H
