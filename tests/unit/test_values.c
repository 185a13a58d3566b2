// The value helpers of ddl/base.h that the daemon's request checks (server/requests.c) and
// the HDF5 reader (src/io/h5.c) share: the first NaN or +-Inf of float and double arrays,
// at every position of every length up to 40 (the vector pass and its tail), unaligned,
// and none in finite extremes (max, min, denormals, -0); the values read back; and the
// shape text, with its truncation.
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ddl/base.h"
#include "test.h"

// Element i of n finite extremes (max, the smallest denormal, -0, small negatives), item
// bytes each, at p.
static void put(unsigned char *p, int64_t i, size_t item, double v)
{
    float f = (float)v;
    memcpy(p + (size_t)i * item, item == 4 ? (void *)&f : (void *)&v, item);
}

static void fill_finite(unsigned char *p, int64_t n, size_t item)
{
    for (int64_t i = 0; i < n; i++) {
        double v = i % 4 == 0   ? (item == 4 ? FLT_MAX : DBL_MAX)
                   : i % 4 == 1 ? (item == 4 ? FLT_TRUE_MIN : DBL_TRUE_MIN)
                   : i % 4 == 2 ? -0.0
                                : -(double)i;
        put(p, i, item, v);
    }
}

static void test_first_nonfinite(void)
{
    static unsigned char buf[8 * 41 + 1];
    unsigned char       *p     = buf + 1; // unaligned on purpose
    const double         odd[] = {NAN, INFINITY, -INFINITY};
    for (size_t item = 4; item <= 8; item += 4) {
        for (int64_t n = 0; n <= 40; n++) {
            fill_finite(p, n, item);
            ASSERT_TRUE(ddl_first_nonfinite(p, n, item) == -1);
            for (int64_t at = 0; at < n; at++) {
                for (int k = 0; k < 3; k++) {
                    fill_finite(p, n, item);
                    put(p, at, item, odd[k]);
                    put(p, n - 1, item, odd[(k + 1) % 3]); // a later one: the first counts
                    put(p, at, item, odd[k]);
                    if (ddl_first_nonfinite(p, n, item) != at) {
                        TEST_FAIL_("item %zu, n %lld, %g at %lld: got %lld", item, (long long)n,
                                   odd[k], (long long)at,
                                   (long long)ddl_first_nonfinite(p, n, item));
                    }
                    double back = ddl_value_at(p, at, item);
                    ASSERT_TRUE(isnan(odd[k]) ? isnan(back) : back == odd[k]);
                }
            }
        }
    }
}

static void test_shape_text(void)
{
    char          buf[64];
    const int64_t d[] = {64, 1, 28, 28};
    ddl_shape_text(d, 4, buf, sizeof buf);
    ASSERT_TRUE(strcmp(buf, "[64, 1, 28, 28]") == 0);
    ddl_shape_text(d, 0, buf, sizeof buf);
    ASSERT_TRUE(strcmp(buf, "[]") == 0);
    const int64_t neg[] = {-1, INT64_MAX};
    ddl_shape_text(neg, 2, buf, sizeof buf);
    ASSERT_TRUE(strcmp(buf, "[-1, 9223372036854775807]") == 0);
    char small[8];
    ddl_shape_text(d, 4, small, sizeof small); // truncated, still a string
    ASSERT_TRUE(strlen(small) == sizeof small - 1 && strncmp(small, "[64, 1,", 7) == 0);
}

int main(void)
{
    test_first_nonfinite();
    test_shape_text();
    printf("test_values: ok\n");
    return 0;
}
