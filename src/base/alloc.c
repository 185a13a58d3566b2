// base/alloc.c: the engine's allocator: 64-byte aligned, counted.
//
// Counting lets tests assert that plans do their allocation at creation and that
// forward/adjoint allocate nothing (the steady state of a training step).
#include <execinfo.h>
#include <malloc.h>
#include <sys/mman.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "ddl/base.h"

// A 64-byte header in front of each block keeps the size for the live-bytes count (its
// first word) and, in its second, the length of the block's own mapping (0: a heap block);
// it preserves the alignment of the user pointer.
#define HEADER DDL_ALIGN

// Zeroed blocks of at least OWN_MAPPING bytes (ddl_calloc: a model's activations and
// gradients) get a mapping of their own: its pages are zero already, so nothing is written
// until the block is used, and a page that is never used (the gradients of a model that
// only serves, the activations of a short-batch copy no request runs at) never becomes
// resident. Writing zeros into a heap block instead faulted in every page at creation, at
// 0.18-0.30 GB/s on the 2-core VMs (a batch-60000 LeNet-5 spent 55 s in CreateModel on 4
// ranks). Blocks of at least BIG_ZEROED are asked for as transparent huge pages (2 MiB),
// which fault in at 0.67-0.81 GB/s there; smaller ones keep 4 KiB pages, since a huge page
// at a block's end can be mostly past it (up to 2 MiB more resident than the block).
// Smaller and uninitialised blocks stay on glibc's heap, which reuses pages
// (ddl_malloc_tune_for_streaming).
#define OWN_MAPPING ((size_t)2 << 20)
#define BIG_ZEROED ((size_t)64 << 20)
#define HUGE_PAGE ((size_t)2 << 20)
#define SMALL_PAGE ((size_t)4096)

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

// Writes the header of a fresh block (its size; its mapping's length, 0 for a heap block),
// counts it and returns the user pointer.
static void *counted(void *base, size_t bytes, size_t mapped)
{
    memcpy(base, &bytes, sizeof bytes);
    memcpy((char *)base + sizeof bytes, &mapped, sizeof mapped);
    atomic_fetch_add(&n_allocs, 1);
    int_fast64_t live = atomic_fetch_add(&live_bytes, (int_fast64_t)bytes) + (int_fast64_t)bytes;
    int_fast64_t peak = atomic_load(&peak_bytes);
    while (live > peak && !atomic_compare_exchange_weak(&peak_bytes, &peak, live)) {
    }
    return (char *)base + HEADER;
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
    return counted(base, bytes, 0);
}

// A block of its own mapping (see OWN_MAPPING), zero throughout.
static void *map_zeroed(size_t bytes)
{
    if (bytes > SIZE_MAX - 2 * HUGE_PAGE || injected_failure(bytes)) {
        return NULL;
    }
    size_t page = bytes >= BIG_ZEROED ? HUGE_PAGE : SMALL_PAGE;
    size_t len  = (HEADER + bytes + page - 1) / page * page;
    void  *base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
        return NULL;
    }
    if (page == HUGE_PAGE) {
        (void)madvise(base, len, MADV_HUGEPAGE); // a hint: without THP the pages are 4 KiB
    }
    return counted(base, bytes, len);
}

void *ddl_calloc(size_t count, size_t size)
{
    if (size != 0 && count > SIZE_MAX / size) {
        return NULL;
    }
    size_t bytes = count * size;
    if (bytes >= OWN_MAPPING) {
        return map_zeroed(bytes);
    }
    void *p = ddl_malloc(bytes);
    if (p != NULL) {
        memset(p, 0, bytes);
    }
    return p;
}

void ddl_free(void *p)
{
    if (p == NULL) {
        return;
    }
    char  *base = (char *)p - HEADER;
    size_t bytes, mapped;
    memcpy(&bytes, base, sizeof bytes);
    memcpy(&mapped, base + sizeof bytes, sizeof mapped);
    atomic_fetch_sub(&live_bytes, (int_fast64_t)bytes);
    if (mapped != 0) {
        munmap(base, mapped);
    } else {
        free(base);
    }
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
