// The engine's allocator (base/alloc.c): zeroed blocks of 2 MiB and more get a mapping of
// their own, whose pages become resident only when written (a model that only serves never
// makes its gradient buffers resident; a model's creation no longer writes every page of
// them), and are zero; freeing one gives its pages back. Smaller blocks come from the heap,
// zeroed. Counted either way.
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "ddl/base.h"
#include "test.h"

// This process's resident bytes (the second field of /proc/self/statm, in pages).
static double resident(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    ASSERT_TRUE(f != NULL);
    long size = 0, res = 0;
    ASSERT_TRUE(fscanf(f, "%ld %ld", &size, &res) == 2);
    fclose(f);
    return (double)res * (double)sysconf(_SC_PAGESIZE);
}

static bool all_zero(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (p[i] != 0) {
            return false;
        }
    }
    return true;
}

int main(void)
{
    const double MiB = 1048576.0;
    // 8 MiB and 96 MiB (the second asks for huge pages): nothing resident until written.
    const size_t sizes[] = {(size_t)8 << 20, (size_t)96 << 20};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t         n    = sizes[k];
        int64_t        live = ddl_alloc_bytes_live();
        double         r0   = resident();
        unsigned char *p    = ddl_calloc(n, 1);
        ASSERT_TRUE(p != NULL);
        ASSERT_EQ(ddl_alloc_bytes_live() - live, (long long)n);
        ASSERT_EQ((uintptr_t)p % DDL_ALIGN, 0);
        double r1 = resident();
        // The block's header is written: its page (a 2 MiB one with huge pages) is resident.
        if (r1 - r0 > 2.5 * MiB) {
            TEST_FAIL_("a fresh zeroed block of %zu MiB made %.1f MiB resident", n >> 20,
                       (r1 - r0) / MiB);
        }
        memset(p, 0x5a, n); // every page written: resident now
        double r2 = resident();
        if (r2 - r0 < 0.9 * (double)n) {
            TEST_FAIL_("writing the block of %zu MiB made only %.1f MiB resident", n >> 20,
                       (r2 - r0) / MiB);
        }
        ddl_free(p);
        ASSERT_EQ(ddl_alloc_bytes_live(), live);
        double r3 = resident();
        if (r2 - r3 < 0.9 * (double)n) {
            TEST_FAIL_("freeing the block of %zu MiB gave back only %.1f MiB", n >> 20,
                       (r2 - r3) / MiB);
        }
        // A fresh block is zero again (its own mapping, not the pages just written).
        p = ddl_calloc(1, n);
        ASSERT_TRUE(p != NULL && all_zero(p, n));
        ddl_free(p);
    }
    // Heap blocks: zero, whatever the heap held before.
    for (size_t n = 1; n <= ((size_t)1 << 20); n *= 4) {
        unsigned char *q = ddl_malloc(n);
        ASSERT_TRUE(q != NULL);
        memset(q, 0xff, n);
        ddl_free(q);
        unsigned char *z = ddl_calloc(n, 1);
        ASSERT_TRUE(z != NULL && all_zero(z, n));
        ddl_free(z);
    }
    ASSERT_TRUE(ddl_calloc(SIZE_MAX / 2, 4) == NULL); // count * size overflows
    printf("test_alloc: ok\n");
    return 0;
}
