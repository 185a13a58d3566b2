// base/alloc.c: the engine's allocator: 64-byte aligned, counted.
//
// Counting lets tests assert that plans do their allocation at creation and that
// forward/adjoint allocate nothing (the steady state of a training step).
#include <execinfo.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "ddl/base.h"

// A 64-byte header in front of each block keeps the size for the live-bytes count
// and preserves the alignment of the user pointer.
#define HEADER DDL_ALIGN

static atomic_uint_fast64_t n_allocs;
static atomic_int_fast64_t  live_bytes;
static atomic_int_fast64_t  peak_bytes;
// Test-only fault injection (ddl_alloc_fail_after): allocations of at least fail_min
// bytes left before the one that fails; 0 means off.
static atomic_uint_fast64_t fail_countdown;
static atomic_size_t        fail_min;

void ddl_alloc_fail_after(uint64_t n, size_t min_bytes)
{
    atomic_store(&fail_min, min_bytes);
    atomic_store(&fail_countdown, n);
}

// True when this allocation is the one chosen to fail (the countdown then switches off).
static int injected_failure(size_t bytes)
{
    uint_fast64_t left = atomic_load(&fail_countdown);
    if (left == 0 || bytes < atomic_load(&fail_min)) {
        return 0;
    }
    while (left > 0) {
        if (atomic_compare_exchange_weak(&fail_countdown, &left, left - 1)) {
            if (left == 1 && getenv("DDL_ALLOC_FAIL_TRACE") != NULL) {
                void *frames[16];
                backtrace_symbols_fd(frames, backtrace(frames, 16), 2);
            }
            return left == 1;
        }
    }
    return 0;
}

void *ddl_malloc(size_t bytes)
{
    if (bytes > SIZE_MAX - 2 * HEADER || injected_failure(bytes)) {
        return NULL;
    }
    size_t total = HEADER + ((bytes + DDL_ALIGN - 1) / DDL_ALIGN) * DDL_ALIGN;
    void  *base  = aligned_alloc(DDL_ALIGN, total);
    if (base == NULL) {
        return NULL;
    }
    memcpy(base, &bytes, sizeof bytes);
    atomic_fetch_add(&n_allocs, 1);
    int_fast64_t live = atomic_fetch_add(&live_bytes, (int_fast64_t)bytes) + (int_fast64_t)bytes;
    int_fast64_t peak = atomic_load(&peak_bytes);
    while (live > peak && !atomic_compare_exchange_weak(&peak_bytes, &peak, live)) {
    }
    return (char *)base + HEADER;
}

void *ddl_calloc(size_t count, size_t size)
{
    if (size != 0 && count > SIZE_MAX / size) {
        return NULL;
    }
    void *p = ddl_malloc(count * size);
    if (p != NULL) {
        memset(p, 0, count * size);
    }
    return p;
}

void ddl_free(void *p)
{
    if (p == NULL) {
        return;
    }
    char  *base = (char *)p - HEADER;
    size_t bytes;
    memcpy(&bytes, base, sizeof bytes);
    atomic_fetch_sub(&live_bytes, (int_fast64_t)bytes);
    free(base);
}

void *ddl_realloc(void *p, size_t bytes)
{
    if (p == NULL) {
        return ddl_malloc(bytes);
    }
    size_t old;
    memcpy(&old, (char *)p - HEADER, sizeof old);
    // A fresh aligned block and a copy: aligned_alloc memory has no aligned realloc, and
    // the daemon resizes rarely (token tables, grown scratch), never in a step.
    void *q = ddl_malloc(bytes);
    if (q == NULL) {
        return NULL;
    }
    memcpy(q, p, old < bytes ? old : bytes);
    ddl_free(p);
    return q;
}

char *ddl_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char  *c = ddl_malloc(n);
    if (c != NULL) {
        memcpy(c, s, n);
    }
    return c;
}

uint64_t ddl_alloc_count(void)
{
    return atomic_load(&n_allocs);
}

int64_t ddl_alloc_bytes_live(void)
{
    return atomic_load(&live_bytes);
}

int64_t ddl_alloc_bytes_peak_reset(void)
{
    return atomic_exchange(&peak_bytes, atomic_load(&live_bytes));
}

void ddl_malloc_tune_for_streaming(void)
{
    // PLATFORM.md: with glibc's defaults every large temporary is an mmap/munmap pair and
    // its pages fault in again on each use (~14 us per 4 KiB page here).
    mallopt(M_MMAP_THRESHOLD, 256 * 1024 * 1024);
    mallopt(M_TRIM_THRESHOLD, 1024 * 1024 * 1024);
}
