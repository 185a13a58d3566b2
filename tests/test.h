// tests/test.h: the test kit. Assertions print the expression, both values, the rank
// and file:line; a failing rank calls MPI_Abort so mpirun fails instead of hanging.
// A skipped test exits with DDL_TEST_SKIP (wired to ctest's SKIP_RETURN_CODE).
#ifndef DDL_TEST_H
#define DDL_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "ddl/status.h"

#define DDL_TEST_SKIP 7

// Set by MPI tests (ddl_test_mpi_init); -1 in unit tests.
extern int ddl_test_rank;
void ddl_test_fail(void) __attribute__((noreturn));

#define TEST_FAIL_(...)                                                             \
    do {                                                                            \
        fprintf(stderr, "[rank %d] %s:%d: ", ddl_test_rank, __FILE__, __LINE__);    \
        fprintf(stderr, __VA_ARGS__);                                               \
        fprintf(stderr, "\n");                                                      \
        ddl_test_fail();                                                            \
    } while (0)

#define ASSERT_TRUE(c)                              \
    do {                                            \
        if (!(c)) {                                 \
            TEST_FAIL_("assertion failed: %s", #c); \
        }                                           \
    } while (0)

#define ASSERT_OK(expr)                                                                   \
    do {                                                                                  \
        ddl_status st__ = (expr);                                                         \
        if (st__ != DDL_OK) {                                                             \
            TEST_FAIL_("%s returned %s: %s", #expr, ddl_status_name(st__), ddl_last_error()); \
        }                                                                                 \
    } while (0)

#define ASSERT_STATUS(expr, want)                                                      \
    do {                                                                               \
        ddl_status st__ = (expr);                                                      \
        if (st__ != (want)) {                                                          \
            TEST_FAIL_("%s returned %s, expected %s (%s)", #expr, ddl_status_name(st__), \
                       ddl_status_name(want), ddl_last_error());                       \
        }                                                                              \
    } while (0)

#define ASSERT_EQ(a, b)                                                                       \
    do {                                                                                      \
        long long a__ = (long long)(a), b__ = (long long)(b);                                 \
        if (a__ != b__) {                                                                     \
            TEST_FAIL_("%s == %s failed: %lld != %lld", #a, #b, a__, b__);                    \
        }                                                                                     \
    } while (0)

#define ASSERT_NEAR(a, b, tol)                                                                \
    do {                                                                                      \
        double a__ = (double)(a), b__ = (double)(b), t__ = (double)(tol);                     \
        if (!(fabs(a__ - b__) <= t__)) {                                                      \
            TEST_FAIL_("|%s - %s| <= %g failed: %.17g vs %.17g", #a, #b, t__, a__, b__);      \
        }                                                                                     \
    } while (0)

#define ASSERT_LE(a, b)                                                                       \
    do {                                                                                      \
        double a__ = (double)(a), b__ = (double)(b);                                          \
        if (!(a__ <= b__)) {                                                                  \
            TEST_FAIL_("%s <= %s failed: %.17g > %.17g", #a, #b, a__, b__);                   \
        }                                                                                     \
    } while (0)

// Calls fn("dir/name", ud) for every file of `dir` whose name ends in `suffix`, in sorted
// name order (so every run and every rank visits them alike). fn returns 1 for a file it
// checked and 0 for one it passed over (a spec for another world size, say). Returns the
// sum: the files checked. Fails the test when dir cannot be read.
int ddl_test_each_file(const char *dir, const char *suffix, int (*fn)(const char *path, void *ud),
                       void *ud);

// "0, 1, ..., P-1" into buf (len bytes): the ranks list of a spec partition over a world
// of P. Returns buf.
char *ddl_test_rank_list(int P, char *buf, size_t len);

// A spec of a world of P ranks whose 1-channel volume vol[0] x vol[1] x vol[2] is split as
// `split` (partition "vol"): `layers` (JSON objects, comma-separated) and `rest` (the
// spec's remaining keys: loss, optimizer, data) around the common head. Malloc'd (free
// it); fails the test when it does not fit in 4 KiB.
char *ddl_test_vol_spec(int P, const char *split, int seed, const char *dtype, int batch,
                        const int vol[3], const char *layers, const char *rest);
// The 3-D regression chain of the dense-target tests: conv3d to 4 channels, tanh, conv3d
// to 1 channel (3x3x3, padding 1), for ddl_test_vol_spec's `layers`.
extern const char *const ddl_test_conv3d_pair;

#endif // DDL_TEST_H
