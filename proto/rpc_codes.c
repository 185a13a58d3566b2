// rpc_codes.c: gRPC status code names, indexed by the code's number (grpc/status.h).
#include "rpc_codes.h"

static const char *const names[] = {
    "OK",                 "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",  "NOT_FOUND",      "ALREADY_EXISTS",    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",      "OUT_OF_RANGE",
    "UNIMPLEMENTED",      "INTERNAL",       "UNAVAILABLE",       "DATA_LOSS",
    "UNAUTHENTICATED",
};

const char *ddl_rpc_code_name(int code)
{
    if (code < 0 || code >= (int)(sizeof names / sizeof names[0])) {
        return "UNKNOWN_CODE";
    }
    return names[code];
}
