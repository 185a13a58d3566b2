// partition/mpi_check.h: internal: turns an MPI failure into DDL_EMPI with MPI's message.
// Only for modules allowed to call MPI (partition, primitives, engine, server).
#ifndef DDL_PARTITION_MPI_CHECK_H
#define DDL_PARTITION_MPI_CHECK_H

#include <mpi.h>

#include "base/check.h"

#define DDL_CHECK_MPI(call)                                                              \
    do {                                                                                 \
        int ddl__rc_ = (call);                                                           \
        if (ddl__rc_ != MPI_SUCCESS) {                                                   \
            char ddl__msg_[MPI_MAX_ERROR_STRING];                                        \
            int  ddl__len_ = 0;                                                          \
            MPI_Error_string(ddl__rc_, ddl__msg_, &ddl__len_);                           \
            return ddl_set_error(DDL_EMPI, "%s:%d: %s: %s", __FILE__, __LINE__, #call,   \
                                 ddl__msg_);                                             \
        }                                                                                \
    } while (0)

// Safe conversion of an element count to MPI's int; EINVAL past INT_MAX.
#define DDL_MPI_COUNT(n, out)                                                            \
    do {                                                                                 \
        DDL_REQUIRE((n) <= INT_MAX, DDL_EINVAL,                                          \
                    "message of %lld elements exceeds MPI's int count", (long long)(n)); \
        (out) = (int)(n);                                                                \
    } while (0)

#endif // DDL_PARTITION_MPI_CHECK_H
