// client_impl.h: the connection's layout and the call machinery shared by the RPC files.
#ifndef DDL_CLIENT_IMPL_H
#define DDL_CLIENT_IMPL_H

#include <grpc/grpc.h>
#include <protobuf-c/protobuf-c.h>

#include "ddl/base.h" // ddl_set_error (status.c is built into the client)
#include "ddl_client.h"
#include "rpc_methods.h"

// Methods: one per row of the shared method table (proto/rpc_methods.h).
enum {
#define X(name, path, kind, role, where, request, handler) M_##name,
    DDL_RPC_METHODS(X)
#undef X
    // The count, not a method.
    M_COUNT
};
_Static_assert(M_COUNT == DDL_RPC_METHOD_COUNT, "one client method per row of the table");

struct ddl_client {
    grpc_channel *channel;
    void         *method[M_COUNT]; // grpc_channel_register_call handles
    grpc_metadata auth;            // "authorization: Bearer ..." when a token is set
    size_t        nauth;
    double        call_timeout_s;
};

// One call in flight: its own pluck queue, so calls on one connection never share a queue.
typedef struct ddl__rpc {
    ddl_client_t          *client;
    int                    method;
    grpc_completion_queue *cq;
    grpc_call             *call;
    grpc_metadata_array    initial_md;
    grpc_metadata_array    trailing_md;
    grpc_status_code       status;
    grpc_slice             details;
    const char            *error_string;
    int                    status_pending; // RECV_STATUS_ON_CLIENT started, not yet plucked
    char                   status_tag;     // address used as the status batch's tag
} ddl__rpc;

// Name of a method for messages ("Step").
const char *ddl__method_name(int method);

// Starts a call with the given deadline (seconds, 0: none) and starts receiving its status.
ddl_status ddl__rpc_open(ddl_client_t *c, int method, double timeout_s, ddl__rpc *r);
// Runs a batch of ops and waits for it; returns the batch's success flag (0 on failure).
int ddl__rpc_batch(ddl__rpc *r, const grpc_op *ops, size_t n);
// Waits for the status (cancelling nothing), releases the call and its queue, records the
// thread's last code and message. Returns local_status if that is an error and the call
// itself succeeded, else the status mapped from the gRPC code.
ddl_status ddl__rpc_close(ddl__rpc *r, ddl_status local_status);

// Serialises a message into a byte buffer (caller destroys), or NULL on allocation failure.
grpc_byte_buffer *ddl__pack(const ProtobufCMessage *m);
// Parses a byte buffer (NULL on malformed input). Free with protobuf_c_message_free_unpacked.
ProtobufCMessage *ddl__unpack(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *d);

// Unary call: sends req, receives one message of descriptor d into *resp (caller frees).
ddl_status ddl__unary(ddl_client_t *c, int method, const ProtobufCMessage *req,
                      const ProtobufCMessageDescriptor *d, ProtobufCMessage **resp);

// Records a local error (no RPC involved) for this thread: code DDL_RPC_OK, message.
ddl_status ddl__local_error(ddl_status s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

// Wire dtype from its name ("FP32"); -1 if unknown.
int ddl__dtype_from_name(const char *name);
// Checks a tensor's shape, dtype and byte count against each other.
ddl_status ddl__check_tensor(const ddl_client_tensor *t, const char *what);

#endif // DDL_CLIENT_IMPL_H
