// server/methods.h: the RPCs the daemon serves, as one enum generated from the method table
// (proto/rpc_methods.h). service.c, auth.c, metrics.c and dispatch.c expand the same table
// for their paths, roles, labels and handlers.
#ifndef DDLD_METHODS_H
#define DDLD_METHODS_H

#include "rpc_methods.h"

typedef enum {
#define X(name, path, kind, role, where, request, handler) DDLD_M_##name,
    DDL_RPC_METHODS(X)
#undef X
    // Not methods: the count, and a job without a call.
    DDLD_M_COUNT,
    DDLD_M_INTERNAL = 100 // signals, start-up
} ddld_method;

_Static_assert(DDLD_M_COUNT == DDL_RPC_METHOD_COUNT, "one enum value per row of the table");
_Static_assert(DDLD_M_COUNT < DDLD_M_INTERNAL, "DDLD_M_INTERNAL is not a method");

#endif // DDLD_METHODS_H
