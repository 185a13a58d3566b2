// ddl/base.h: memory, logging and random numbers shared by every engine module.
// No MPI and no BLAS here.
#ifndef DDL_BASE_H
#define DDL_BASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddl/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DDL_ALIGN 64

// ---- memory ----------------------------------------------------------------
// All engine memory goes through these. Allocations are 64-byte aligned and counted,
// so tests can assert that a steady-state step allocates nothing.
// ddl_malloc returns NULL on failure (and for size 0 returns a valid unique pointer).
DDL_EXTERN void  *ddl_malloc(size_t bytes);
DDL_EXTERN void  *ddl_calloc(size_t count, size_t size);
DDL_EXTERN void   ddl_free(void *p);
// Resizes a block of ddl_malloc/ddl_calloc (or NULL: a fresh block) to `bytes`, keeping
// its first min(old, new) bytes. On failure returns NULL and leaves p allocated and
// unchanged (like realloc), so `q = ddl_realloc(p, n); if (q == NULL) ...` loses nothing.
// Counts as one allocation, and the live-byte count follows the new size.
DDL_EXTERN void  *ddl_realloc(void *p, size_t bytes);
// A ddl_malloc'd copy of the string s (free with ddl_free), or NULL when out of memory.
DDL_EXTERN char  *ddl_strdup(const char *s);
// Number of successful ddl_malloc/ddl_calloc/ddl_realloc calls since start (monotonic).
DDL_EXTERN uint64_t ddl_alloc_count(void);
// Bytes currently allocated through ddl_malloc/ddl_calloc.
DDL_EXTERN int64_t  ddl_alloc_bytes_live(void);
// The highest live byte count since the previous call (or start), and restarts the
// measurement from the current live count. Tests use it to check that a reader refuses
// a hostile size before allocating for it.
DDL_EXTERN int64_t  ddl_alloc_bytes_peak_reset(void);
// TEST ONLY (fault injection): among the ddl_malloc/ddl_calloc/ddl_realloc calls of this
// process from now on that ask for at least min_bytes, the n-th returns NULL, once; n = 0
// switches injection off. Lets tests make one rank fail an allocation at a chosen point
// and check that every rank fails alike. Never call it in production code.
DDL_EXTERN void ddl_alloc_fail_after(uint64_t n, size_t min_bytes);
// TEST ONLY (crash injection): a named point where a crash-recovery test may kill this
// process. With DDL_FAULT="SITE[@RANK][#NTH]" in the environment, the NTH pass (default
// 1) of `site` on `rank` (default any) raises SIGKILL; without it, nothing happens. Sites
// are listed where they are placed (checkpoint.c: checkpoint.staged, .shard, .manifest,
// .publish, .done).
DDL_EXTERN void ddl_fault_point(const char *site, int rank);

// Process-wide glibc malloc tuning for programs that move large buffers (the daemon,
// distdl-train, benchmarks): keeps large blocks (ours and MPI's internal temporaries)
// mapped instead of returning them to the system and faulting them in again on every
// call. Call once at start-up, before MPI_Init. Libraries never call it themselves.
DDL_EXTERN void ddl_malloc_tune_for_streaming(void);

// ---- logging ---------------------------------------------------------------
typedef enum { DDL_LOG_ERROR = 0, DDL_LOG_WARN = 1, DDL_LOG_INFO = 2, DDL_LOG_DEBUG = 3 } ddl_log_level;
typedef void (*ddl_log_cb)(ddl_log_level level, const char *msg, void *user_data);
// Routes engine log lines to cb (NULL restores the default: stderr for WARN and above).
DDL_EXTERN void ddl_log_set(ddl_log_cb cb, void *user_data);
DDL_EXTERN void ddl_log(ddl_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// ---- names -----------------------------------------------------------------
// True when name is 1 to max_len characters of POSIX's portable file name set (letters,
// digits, '.', '_', '-') and does not start with '.': what a model's name must be, since
// it names a directory and a URL path segment.
DDL_EXTERN bool ddl_name_is_portable(const char *name, size_t max_len);

// ---- values and shapes in messages -------------------------------------------
// The index of the first of n floating-point values of `item` bytes (4: float, 8: double;
// unaligned is fine) that is NaN or +-Inf, or -1. No allocation.
DDL_EXTERN int64_t ddl_first_nonfinite(const void *values, int64_t n, size_t item);
// Value i of such an array, as a double.
DDL_EXTERN double ddl_value_at(const void *values, int64_t i, size_t item);
// "[a, b, c]" of n extents into buf (truncated to len).
DDL_EXTERN void ddl_shape_text(const int64_t *d, size_t n, char *buf, size_t len);

// ---- settings from the environment --------------------------------------------
// A byte count as the engine's environment settings write one: a finite number >= 0,
// optionally followed by one of K, M, G, T (binary multiples, either case), and nothing
// else ("2097152", "2M", "1.5G"). True and *out set when text is one; false otherwise
// (*out untouched).
DDL_EXTERN bool ddl_parse_bytes(const char *text, double *out);

// ---- errors ----------------------------------------------------------------
// Records an error message for this thread and returns code; used by DDL_REQUIRE.
DDL_EXTERN ddl_status ddl_set_error(ddl_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

// ---- random numbers --------------------------------------------------------
// Counter-based generator: the value at (seed, stream, index) never depends on the
// order of calls, so a parameter's initial value can be a function of its global
// index alone (partition-invariant initialization).
DDL_EXTERN uint64_t ddl_rng_u64(uint64_t seed, uint64_t stream, uint64_t index);
// Uniform in [0, 1) with 53 random bits.
DDL_EXTERN double   ddl_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index);
// Standard normal (Box-Muller on two counter draws).
DDL_EXTERN double   ddl_rng_normal(uint64_t seed, uint64_t stream, uint64_t index);

// A sequential stream for things that are naturally sequential (shuffles, dropout).
typedef struct ddl_rng {
    uint64_t seed;
    uint64_t stream;
    uint64_t counter;
} ddl_rng;
DDL_EXTERN void     ddl_rng_init(ddl_rng *r, uint64_t seed, uint64_t stream);
DDL_EXTERN uint64_t ddl_rng_next_u64(ddl_rng *r);
DDL_EXTERN double   ddl_rng_next_uniform(ddl_rng *r);

#ifdef __cplusplus
}
#endif
#endif // DDL_BASE_H
