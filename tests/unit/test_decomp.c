// Unit tests of the balanced decomposition, box intersection and halo arithmetic.
#include <string.h>

#include "ddl/decomp.h"
#include "test.h"

static void check_split(int64_t n, int64_t p, const int64_t *want)
{
    int64_t start = 0;
    for (int64_t i = 0; i < p; i++) {
        ASSERT_EQ(ddl_decomp_size(n, p, i), want[i]);
        ASSERT_EQ(ddl_decomp_start(n, p, i), start);
        start += want[i];
    }
    ASSERT_EQ(start, n);
}

static void test_balanced(void)
{
    check_split(10, 4, (int64_t[]){3, 3, 2, 2});
    check_split(10, 3, (int64_t[]){4, 3, 3});
    check_split(77, 3, (int64_t[]){26, 26, 25});
    check_split(2, 3, (int64_t[]){1, 1, 0});
    check_split(0, 2, (int64_t[]){0, 0});
    check_split(5, 1, (int64_t[]){5});
}

static void test_boxes(void)
{
    ddl_shape g   = ddl_shape_make(2, (int64_t[]){77, 55});
    int       ps[] = {3, 4};
    int64_t   total = 0;
    for (int a = 0; a < 3; a++) {
        for (int b = 0; b < 4; b++) {
            ddl_box bx = ddl_decomp_box(&g, ps, (int[]){a, b});
            total += ddl_box_numel(&bx);
        }
    }
    ASSERT_EQ(total, 77 * 55);
    ddl_box a = ddl_box_make(2, (int64_t[]){0, 0}, (int64_t[]){5, 5});
    ddl_box b = ddl_box_make(2, (int64_t[]){3, 4}, (int64_t[]){8, 9});
    ddl_box c;
    ASSERT_TRUE(ddl_box_intersect(&a, &b, &c));
    ASSERT_EQ(c.start[0], 3);
    ASSERT_EQ(c.stop[0], 5);
    ASSERT_EQ(c.start[1], 4);
    ASSERT_EQ(c.stop[1], 5);
    ddl_box d = ddl_box_make(2, (int64_t[]){5, 0}, (int64_t[]){6, 5});
    ASSERT_TRUE(!ddl_box_intersect(&a, &d, &c));
    ASSERT_EQ(ddl_box_numel(&c), 0);
    int coord[3];
    ddl_index_unravel(3, (int[]){2, 3, 4}, 17, coord);
    ASSERT_EQ(coord[0], 1);
    ASSERT_EQ(coord[1], 1);
    ASSERT_EQ(coord[2], 1);
    ASSERT_EQ(ddl_index_ravel(3, (int[]){2, 3, 4}, coord), 17);
}

// DistDL tests/test_halo_mixin.py: P [1,1,4] over length 10, kernel 2, stride 2 (pooling).
static void test_halo_pool_table(void)
{
    const int64_t halo[4][2] = {{0, 1}, {-1, 0}, {0, 0}, {0, 0}};
    const int64_t recv[4][2] = {{0, 1}, {0, 0}, {0, 0}, {0, 0}};
    const int64_t send[4][2] = {{0, 0}, {1, 0}, {0, 0}, {0, 0}};
    const int64_t need[4][2] = {{0, 4}, {1, 3}, {0, 2}, {0, 2}};
    for (int i = 0; i < 4; i++) {
        ddl_halo_dim h;
        ASSERT_OK(ddl_halo_dim_compute(10, 4, i, 2, 2, 0, 1, &h));
        ASSERT_EQ(h.halo_lo, halo[i][0]);
        ASSERT_EQ(h.halo_hi, halo[i][1]);
        ASSERT_EQ(h.ghost_lo, recv[i][0]);
        ASSERT_EQ(h.ghost_hi, recv[i][1]);
        ASSERT_EQ(h.send_lo, send[i][0]);
        ASSERT_EQ(h.send_hi, send[i][1]);
        ASSERT_EQ(h.need_lo, need[i][0]);
        ASSERT_EQ(h.need_hi, need[i][1]);
    }
    // The output of length 5 splits 2,1,1,1.
    ddl_halo_dim h;
    ASSERT_OK(ddl_halo_dim_compute(10, 4, 0, 2, 2, 0, 1, &h));
    ASSERT_EQ(h.out_global, 5);
    ASSERT_EQ(h.out_n, 2);
}

// A 3-wide kernel with padding 1 over 10 split in 2: symmetric one-element halos; the
// global padding lives on the boundary pieces only.
static void test_halo_padded(void)
{
    ddl_halo_dim h0, h1;
    ASSERT_OK(ddl_halo_dim_compute(10, 2, 0, 3, 1, 1, 1, &h0));
    ASSERT_OK(ddl_halo_dim_compute(10, 2, 1, 3, 1, 1, 1, &h1));
    ASSERT_EQ(h0.pad_lo, 1);
    ASSERT_EQ(h0.pad_hi, 0);
    ASSERT_EQ(h0.ghost_hi, 1);
    ASSERT_EQ(h1.ghost_lo, 1);
    ASSERT_EQ(h1.pad_hi, 1);
    ASSERT_EQ(h0.buf, 7);
    ASSERT_EQ(h1.buf, 7);
    ASSERT_EQ(h0.need_hi - h0.need_lo - 2, h0.out_n);
    // Every needed window fits: output pieces 5 and 5.
    ASSERT_EQ(h0.out_n + h1.out_n, 10);
    // A negative right halo (surplus on the right) is cropped: kernel 1, stride 3.
    ddl_halo_dim s;
    ASSERT_OK(ddl_halo_dim_compute(10, 2, 0, 1, 3, 0, 1, &s));
    ASSERT_TRUE(s.need_hi <= s.buf);
    // Window larger than the input is refused.
    ASSERT_STATUS(ddl_halo_dim_compute(3, 1, 0, 5, 1, 0, 1, &s), DDL_EINVAL);
    // A halo reaching past the immediate neighbour is refused: 5 pieces of 1, kernel 5.
    ASSERT_STATUS(ddl_halo_dim_compute(5, 5, 2, 5, 1, 2, 1, &s), DDL_EINVAL);
    ASSERT_TRUE(strstr(ddl_last_error(), "immediate neighbour") != NULL);
}

int main(void)
{
    test_balanced();
    test_boxes();
    test_halo_pool_table();
    test_halo_padded();
    printf("test_decomp: ok\n");
    return 0;
}
