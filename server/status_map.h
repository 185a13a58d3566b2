// server/status_map.h: the one table from ddl_status to gRPC status codes (status_map.c).
#ifndef DDLD_STATUS_MAP_H
#define DDLD_STATUS_MAP_H

#include <grpc/status.h>

#include "ddl/status.h"

grpc_status_code ddld_status_to_grpc(ddl_status st);
const char      *ddld_grpc_code_name(grpc_status_code code);

#endif // DDLD_STATUS_MAP_H
