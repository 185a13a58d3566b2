// rpc_methods.h: every RPC of the wire protocol, once. The daemon's method enum, its gRPC
// registrations, metrics labels and role checks, its dispatch to the ranks, and the client's
// own enum and paths are all generated from this one table (the shape of libuv's
// UV_ERRNO_MAP), so they cannot disagree. tests/server/rpc_table.py (ctest rpc_table, label
// lint) checks the table against the `service` blocks of proto/**/*.proto: the same rpcs,
// paths, stream kinds and request messages.
//
// This header depends on nothing: the columns are tokens that each user expands in its own
// file (the request column names a protobuf-c descriptor only where service.c pastes it).
//
// Columns of X(name, path, kind, role, where, request, handler):
//   name     the enum suffix: DDLD_M_<name> in the daemon, M_<name> in the client.
//   path     the gRPC path, "/<package>.<Service>/<Method>".
//   kind     UNARY, CLIENT_STREAM (stream request) or SERVER_STREAM (stream response).
//   role     the least token role the call needs: NONE (no token: health), INFER, TRAIN,
//            ADMIN (server/auth.h, docs/SERVER.md "Tokens and roles").
//   where    who answers it in the daemon:
//              CQ      the cq thread alone, from the snapshot (never waits for the ranks);
//              ENGINE  queued for the main thread as it arrives, run by every rank;
//              STAGED  a client stream gathered on the cq thread, then queued for the ranks.
//   request  the protobuf-c stem of the request message (`<stem>__descriptor`).
//   handler  the stem of the daemon's handler: dispatch.c's on_<handler> for ENGINE and
//            STAGED rows, service.c's answer_<handler> for CQ rows.
//
// New rows go at the end of their service; the daemon's enum order is also the order of
// its metrics output.
#ifndef DDL_RPC_METHODS_H
#define DDL_RPC_METHODS_H

// clang-format off
#define DDL_RPC_METHODS(X)                                                                                        \
    X(CREATE_MODEL,   "/distdl.v1.Trainer/CreateModel",                UNARY,         ADMIN, ENGINE, distdl__v1__create_model_request,  create)        \
    X(GET_STATUS,     "/distdl.v1.Trainer/GetStatus",                  UNARY,         INFER, CQ,     distdl__v1__get_status_request,    status)        \
    X(SUBMIT_BATCH,   "/distdl.v1.Trainer/SubmitBatch",                CLIENT_STREAM, TRAIN, CQ,     distdl__v1__batch,                 submit_batch)  \
    X(STEP,           "/distdl.v1.Trainer/Step",                       UNARY,         TRAIN, ENGINE, distdl__v1__step_request,          step)          \
    X(TRAIN,          "/distdl.v1.Trainer/Train",                      SERVER_STREAM, TRAIN, ENGINE, distdl__v1__train_request,         train)         \
    X(EVALUATE,       "/distdl.v1.Trainer/Evaluate",                   UNARY,         TRAIN, ENGINE, distdl__v1__evaluate_request,      evaluate)      \
    X(PREDICT,        "/distdl.v1.Trainer/Predict",                    UNARY,         INFER, ENGINE, distdl__v1__predict_request,       predict)       \
    X(PULL_WEIGHTS,   "/distdl.v1.Trainer/PullWeights",                SERVER_STREAM, TRAIN, ENGINE, distdl__v1__pull_weights_request,  pull)          \
    X(PUSH_WEIGHTS,   "/distdl.v1.Trainer/PushWeights",                CLIENT_STREAM, ADMIN, STAGED, distdl__v1__weight_chunk,          push)          \
    X(CHECKPOINT,     "/distdl.v1.Trainer/Checkpoint",                 UNARY,         TRAIN, ENGINE, distdl__v1__checkpoint_request,    checkpoint)    \
    X(RESTORE,        "/distdl.v1.Trainer/Restore",                    UNARY,         ADMIN, ENGINE, distdl__v1__restore_request,       restore)       \
    X(SHUTDOWN,       "/distdl.v1.Trainer/Shutdown",                   UNARY,         ADMIN, ENGINE, distdl__v1__shutdown_request,      shutdown)      \
    X(HEALTH_CHECK,   "/grpc.health.v1.Health/Check",                  UNARY,         NONE,  CQ,     grpc__health__v1__health_check_request, health)   \
    X(HEALTH_WATCH,   "/grpc.health.v1.Health/Watch",                  SERVER_STREAM, NONE,  CQ,     grpc__health__v1__health_check_request, health)   \
    X(SERVER_LIVE,    "/inference.GRPCInferenceService/ServerLive",    UNARY,         INFER, CQ,     inference__server_live_request,    kserve)        \
    X(SERVER_READY,   "/inference.GRPCInferenceService/ServerReady",   UNARY,         INFER, CQ,     inference__server_ready_request,   kserve)        \
    X(MODEL_READY,    "/inference.GRPCInferenceService/ModelReady",    UNARY,         INFER, CQ,     inference__model_ready_request,    kserve)        \
    X(MODEL_METADATA, "/inference.GRPCInferenceService/ModelMetadata", UNARY,         INFER, CQ,     inference__model_metadata_request, kserve)        \
    X(MODEL_INFER,    "/inference.GRPCInferenceService/ModelInfer",    UNARY,         INFER, ENGINE, inference__model_infer_request,    model_infer)    \
    X(SERVER_METADATA, "/inference.GRPCInferenceService/ServerMetadata", UNARY,        INFER, CQ,     inference__server_metadata_request, kserve)
// clang-format on

// The kind column as values (DDL_RPC_<kind>).
enum ddl_rpc_kind { DDL_RPC_UNARY, DDL_RPC_CLIENT_STREAM, DDL_RPC_SERVER_STREAM };

// The where column as values (DDL_RPC_<where>).
enum ddl_rpc_where { DDL_RPC_CQ, DDL_RPC_ENGINE, DDL_RPC_STAGED };

// How many rows the table has: every array indexed by method is checked against it.
#define DDL_RPC_X_COUNT(...) +1
#define DDL_RPC_METHOD_COUNT (0 DDL_RPC_METHODS(DDL_RPC_X_COUNT))

#endif // DDL_RPC_METHODS_H
