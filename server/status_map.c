// server/status_map.c: the one mapping from engine status codes to gRPC status codes.
// The client maps back with the inverse of this table (client/), so change both together.
#include <stddef.h>

#include "rpc_codes.h"
#include "status_map.h"

static const struct {
    ddl_status       st;
    grpc_status_code code;
} status_table[] = {
    {DDL_OK, GRPC_STATUS_OK},
    {DDL_EINVAL, GRPC_STATUS_INVALID_ARGUMENT},
    {DDL_ESHAPE, GRPC_STATUS_INVALID_ARGUMENT},
    {DDL_EPROTO, GRPC_STATUS_INVALID_ARGUMENT},
    {DDL_ENOMEM, GRPC_STATUS_RESOURCE_EXHAUSTED},
    {DDL_EBUSY, GRPC_STATUS_FAILED_PRECONDITION},
    {DDL_ENOTFOUND, GRPC_STATUS_NOT_FOUND},
    {DDL_ECORRUPT, GRPC_STATUS_DATA_LOSS},
    {DDL_ECANCELED, GRPC_STATUS_CANCELLED},
    {DDL_ETIMEDOUT, GRPC_STATUS_DEADLINE_EXCEEDED},
    {DDL_EIO, GRPC_STATUS_INTERNAL},
    {DDL_EMPI, GRPC_STATUS_INTERNAL},
    {DDL_EINTERNAL, GRPC_STATUS_INTERNAL},
    {DDL_EREMOTE, GRPC_STATUS_INTERNAL},
};

grpc_status_code ddld_status_to_grpc(ddl_status st)
{
    for (size_t i = 0; i < sizeof status_table / sizeof status_table[0]; i++) {
        if (status_table[i].st == st) {
            return status_table[i].code;
        }
    }
    return GRPC_STATUS_UNKNOWN;
}

const char *ddld_grpc_code_name(grpc_status_code code)
{
    return ddl_rpc_code_name((int)code);
}
