// base/check.h: internal error-propagation macros (not installed).
//
// DDL_REQUIRE checks usage and is always on; DDL_CHECK propagates a failure;
// DDL_CHECK_MPI turns an MPI error into DDL_EMPI with MPI's message; DDL_ASSERT
// guards internal invariants and aborts (never used on user input).
#ifndef DDL_BASE_CHECK_H
#define DDL_BASE_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include "ddl/base.h"

#define DDL_REQUIRE(cond, code, ...)                 \
    do {                                             \
        if (!(cond)) {                               \
            return ddl_set_error((code), __VA_ARGS__); \
        }                                            \
    } while (0)

#define DDL_CHECK(expr)                  \
    do {                                 \
        ddl_status ddl__st_ = (expr);    \
        if (ddl__st_ != DDL_OK) {        \
            return ddl__st_;             \
        }                                \
    } while (0)

// Like DDL_CHECK but jumps to a cleanup label with the status stored in `st`.
#define DDL_CHECK_GOTO(expr, st, label) \
    do {                                \
        (st) = (expr);                  \
        if ((st) != DDL_OK) {           \
            goto label;                 \
        }                               \
    } while (0)

#define DDL_ASSERT(cond)                                                            \
    do {                                                                            \
        if (!(cond)) {                                                              \
            fprintf(stderr, "%s:%d: %s: internal assertion failed: %s\n", __FILE__, \
                    __LINE__, __func__, #cond);                                     \
            abort();                                                                \
        }                                                                           \
    } while (0)

#endif // DDL_BASE_CHECK_H
