// Unit tests of tensors and box movement (pack/unpack with copy and add).
#include <string.h>

#include "ddl/base.h"
#include "ddl/tensor.h"
#include "test.h"

static void test_create(void)
{
    ddl_tensor_t *t;
    ddl_shape     s = ddl_shape_make(3, (int64_t[]){2, 3, 4});
    ASSERT_OK(ddl_tensor_create(DDL_F32, &s, &t));
    ASSERT_EQ(ddl_tensor_numel(t), 24);
    ASSERT_EQ(((uintptr_t)t->data) % 64, 0);
    ASSERT_EQ(ddl_tensor_get(t, 5), 0);
    ddl_tensor_destroy(&t);
    ASSERT_TRUE(t == NULL);
    ddl_tensor_destroy(&t);  // NULL-safe
    ddl_shape z = ddl_shape_make(2, (int64_t[]){0, 5});
    ASSERT_OK(ddl_tensor_create(DDL_F64, &z, &t));
    ASSERT_EQ(ddl_tensor_numel(t), 0);
    ddl_tensor_destroy(&t);
    ddl_shape bad = ddl_shape_make(2, (int64_t[]){-1, 5});
    ASSERT_STATUS(ddl_tensor_create(DDL_F64, &bad, &t), DDL_EINVAL);
    ddl_shape big = {.ndim = 9};
    ASSERT_STATUS(ddl_tensor_create(DDL_F64, &big, &t), DDL_EINVAL);
}

// Packs every sub-box of a small 3-D tensor and checks against direct indexing.
static void test_pack_unpack(ddl_dtype dt)
{
    ddl_tensor_t *t;
    ddl_shape     s = ddl_shape_make(3, (int64_t[]){4, 5, 6});
    ASSERT_OK(ddl_tensor_create(dt, &s, &t));
    for (int64_t i = 0; i < 120; i++) {
        ddl_tensor_set(t, i, (double)i);
    }
    double buf64[120];
    float  buf32[120];
    void  *buf = dt == DDL_F64 ? (void *)buf64 : (void *)buf32;
    for (int a0 = 0; a0 < 4; a0++)
        for (int a1 = a0; a1 <= 4; a1++)
            for (int b0 = 0; b0 < 5; b0 += 2)
                for (int b1 = b0; b1 <= 5; b1++)
                    for (int c0 = 0; c0 < 6; c0 += 3)
                        for (int c1 = c0; c1 <= 6; c1 += 2) {
                            ddl_box b = ddl_box_make(3, (int64_t[]){a0, b0, c0},
                                                     (int64_t[]){a1, b1, c1});
                            ddl_tensor_pack(t, &b, buf);
                            int64_t k = 0;
                            for (int i = a0; i < a1; i++)
                                for (int j = b0; j < b1; j++)
                                    for (int l = c0; l < c1; l++, k++) {
                                        double got = dt == DDL_F64 ? buf64[k] : buf32[k];
                                        ASSERT_EQ(got, i * 30 + j * 6 + l);
                                    }
                            ASSERT_EQ(k, ddl_box_numel(&b));
                            // unpack_add doubles the box, unpack restores it.
                            ddl_tensor_unpack_add(t, &b, buf);
                            if (k > 0) {
                                ASSERT_EQ(ddl_tensor_get(t, a0 * 30 + b0 * 6 + c0),
                                          2 * (a0 * 30 + b0 * 6 + c0));
                            }
                            ddl_tensor_unpack(t, &b, buf);
                            for (int64_t i = 0; i < 120; i++) {
                                ASSERT_EQ(ddl_tensor_get(t, i), i);
                            }
                        }
    // Box-to-box copy between tensors of different shapes, and zeroing.
    ddl_tensor_t *u;
    ddl_shape     su = ddl_shape_make(3, (int64_t[]){2, 7, 3});
    ASSERT_OK(ddl_tensor_create(dt, &su, &u));
    ddl_box bx = ddl_box_make(3, (int64_t[]){1, 1, 2}, (int64_t[]){3, 4, 5});
    ddl_box by = ddl_box_make(3, (int64_t[]){0, 4, 0}, (int64_t[]){2, 7, 3});
    ddl_tensor_copy_box(t, &bx, u, &by);
    ASSERT_EQ(ddl_tensor_get(u, 0 * 21 + 4 * 3 + 0), 1 * 30 + 1 * 6 + 2);
    ASSERT_EQ(ddl_tensor_get(u, 1 * 21 + 6 * 3 + 2), 2 * 30 + 3 * 6 + 4);
    ddl_tensor_add_box(t, &bx, u, &by);
    ASSERT_EQ(ddl_tensor_get(u, 1 * 21 + 6 * 3 + 2), 2 * (2 * 30 + 3 * 6 + 4));
    ddl_tensor_zero_box(u, &by);
    for (int64_t i = 0; i < 42; i++) {
        ASSERT_EQ(ddl_tensor_get(u, i), 0);
    }
    ddl_tensor_destroy(&u);
    ddl_tensor_destroy(&t);
}

static void test_alloc_counting(void)
{
    int64_t live = ddl_alloc_bytes_live();
    void   *p    = ddl_malloc(1000);
    ASSERT_EQ(((uintptr_t)p) % 64, 0);
    ASSERT_EQ(ddl_alloc_bytes_live(), live + 1000);
    ddl_free(p);
    ASSERT_EQ(ddl_alloc_bytes_live(), live);

    // ddl_realloc keeps the contents and the live count follows the new size; a failed
    // one leaves the block as it was.
    unsigned char *b = ddl_realloc(NULL, 10);
    ASSERT_TRUE(b != NULL);
    memset(b, 0xab, 10);
    unsigned char *g = ddl_realloc(b, 5000);
    ASSERT_TRUE(g != NULL);
    ASSERT_EQ(((uintptr_t)g) % 64, 0);
    ASSERT_EQ(g[0], 0xab);
    ASSERT_EQ(g[9], 0xab);
    ASSERT_EQ(ddl_alloc_bytes_live(), live + 5000);
    ddl_alloc_fail_after(1, 0);
    ASSERT_TRUE(ddl_realloc(g, 9000) == NULL);
    ASSERT_EQ(ddl_alloc_bytes_live(), live + 5000);
    ASSERT_EQ(g[9], 0xab);
    g = ddl_realloc(g, 3);
    ASSERT_TRUE(g != NULL);
    ASSERT_EQ(g[2], 0xab);
    ASSERT_EQ(ddl_alloc_bytes_live(), live + 3);
    ddl_free(g);
    char *s = ddl_strdup("distdld");
    ASSERT_TRUE(s != NULL && strcmp(s, "distdld") == 0);
    ASSERT_EQ(ddl_alloc_bytes_live(), live + 8);
    ddl_free(s);
    ddl_alloc_fail_after(1, 0);
    ASSERT_TRUE(ddl_strdup("x") == NULL);
    ASSERT_EQ(ddl_alloc_bytes_live(), live);
}

// Zeroed blocks of 64 MiB and more have a mapping of their own (alloc.c): zero at every
// page, writable to the last byte, counted, resized both ways by ddl_realloc, released
// by ddl_free, and failed by the fault injection like any other.
static void test_big_zeroed(void)
{
    int64_t live  = ddl_alloc_bytes_live();
    size_t  sizes[] = {((size_t)64 << 20) - 64, (size_t)64 << 20, ((size_t)64 << 20) + 4097,
                       (size_t)130 << 20};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t         n = sizes[k];
        unsigned char *b = ddl_calloc(n, 1);
        ASSERT_TRUE(b != NULL);
        ASSERT_EQ(((uintptr_t)b) % 64, 0);
        ASSERT_EQ(ddl_alloc_bytes_live(), live + (int64_t)n);
        int nonzero = 0;
        for (size_t i = 0; i < n; i += 4096) {
            nonzero |= b[i];
        }
        ASSERT_EQ(nonzero | b[n - 1], 0);
        b[0]     = 0x5a;
        b[n - 1] = 0xa5;
        unsigned char *g = ddl_realloc(b, n + 1000); // a heap block now
        ASSERT_TRUE(g != NULL);
        ASSERT_EQ(g[0], 0x5a);
        ASSERT_EQ(g[n - 1], 0xa5);
        ASSERT_EQ(ddl_alloc_bytes_live(), live + (int64_t)n + 1000);
        ddl_free(g);
        ASSERT_EQ(ddl_alloc_bytes_live(), live);
    }
    float *f = ddl_calloc((size_t)20 << 20, sizeof(float)); // 80 MiB of floats
    ASSERT_TRUE(f != NULL);
    ASSERT_EQ(f[((size_t)20 << 20) - 1], 0.0f);
    unsigned char *small = ddl_realloc(f, 16); // shrinks onto the heap
    ASSERT_TRUE(small != NULL);
    ASSERT_EQ(ddl_alloc_bytes_live(), live + 16);
    ddl_free(small);
    ddl_alloc_fail_after(1, (size_t)64 << 20);
    ASSERT_TRUE(ddl_calloc((size_t)64 << 20, 1) == NULL);
    ASSERT_EQ(ddl_alloc_bytes_live(), live);
    void *again = ddl_calloc((size_t)64 << 20, 1); // the injection fired once
    ASSERT_TRUE(again != NULL);
    ddl_free(again);
    ASSERT_EQ(ddl_alloc_bytes_live(), live);
}

static void test_rng(void)
{
    // Counter-based: the same (seed, stream, index) gives the same value.
    ASSERT_EQ(ddl_rng_u64(1, 2, 3), ddl_rng_u64(1, 2, 3));
    ASSERT_TRUE(ddl_rng_u64(1, 2, 3) != ddl_rng_u64(1, 2, 4));
    ASSERT_TRUE(ddl_rng_u64(1, 2, 3) != ddl_rng_u64(2, 2, 3));
    double mean = 0;
    for (int i = 0; i < 100000; i++) {
        double u = ddl_rng_uniform(7, 0, (uint64_t)i);
        ASSERT_TRUE(u >= 0 && u < 1);
        mean += u;
    }
    ASSERT_NEAR(mean / 100000, 0.5, 0.01);
}

// Sizes from outside are bounded: products that overflow int64 (or wrap to a small
// number) and tensors past DDL_MAX_TENSOR_ELEMENTS are refused, naming the shape.
static void test_size_limits(void)
{
    ddl_tensor_t *t    = NULL;
    int64_t       n    = 0;
    ddl_shape     wrap = ddl_shape_make(2, (int64_t[]){(int64_t)1 << 32, (int64_t)1 << 32});
    ASSERT_EQ(ddl_shape_numel(&wrap), -1);  // 2^64 used to wrap to 0
    ASSERT_STATUS(ddl_shape_numel_checked(&wrap, &n), DDL_EINVAL);
    ASSERT_STATUS(ddl_tensor_create(DDL_F32, &wrap, &t), DDL_EINVAL);
    ASSERT_TRUE(t == NULL && strstr(ddl_last_error(), "[4294967296, 4294967296]") != NULL);
    // 2^40 * 2^40 * 2^40 wraps to 0 in int64 as well; 784 * 2^62 wraps to 0 too.
    ddl_shape wrap3 = ddl_shape_make(3, (int64_t[]){(int64_t)1 << 40, (int64_t)1 << 40,
                                                    (int64_t)1 << 40});
    ASSERT_EQ(ddl_shape_numel(&wrap3), -1);
    ddl_shape cap = ddl_shape_make(2, (int64_t[]){(int64_t)1 << 17, (int64_t)1 << 17});
    ASSERT_OK(ddl_shape_numel_checked(&cap, &n));
    ASSERT_EQ(n, DDL_MAX_TENSOR_ELEMENTS);
    cap.d[1]++;
    ASSERT_STATUS(ddl_shape_numel_checked(&cap, &n), DDL_EINVAL);
    ASSERT_STATUS(ddl_tensor_view(DDL_F32, &cap, NULL, &t), DDL_EINVAL);
    ddl_box b = ddl_box_make(1, (int64_t[]){INT64_MIN}, (int64_t[]){INT64_MAX});
    ASSERT_EQ(ddl_box_numel(&b), -1);
}

int main(void)
{
    test_create();
    test_size_limits();
    test_pack_unpack(DDL_F64);
    test_pack_unpack(DDL_F32);
    test_alloc_counting();
    test_big_zeroed();
    test_rng();
    printf("test_tensor: ok\n");
    return 0;
}
