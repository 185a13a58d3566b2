// rpc_codes.h: the names of gRPC's status codes ("INVALID_ARGUMENT"), shared by the daemon's
// logs and the client library's messages so that both spell them alike.
#ifndef DDL_RPC_CODES_H
#define DDL_RPC_CODES_H

// The canonical name of gRPC status code `code` (0..16, numbers as on the wire), or
// "UNKNOWN_CODE" outside that range.
const char *ddl_rpc_code_name(int code);

#endif // DDL_RPC_CODES_H
