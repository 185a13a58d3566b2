// trainer.c: one function per RPC of distdl.v1.Trainer, grpc.health.v1.Health and the
// KServe inference service, on the call machinery of client.c.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer_reader.h>

#include "client_impl.h"
#include "ddl/format.h"
#include "distdl/v1/trainer.pb-c.h"
#include "grpc/health/v1/health.pb-c.h"
#include "inference/grpc_service.pb-c.h"

#define CHUNK_BYTES ((size_t)1 << 20)

static void copy_str(char *dst, size_t cap, const char *src)
{
    snprintf(dst, cap, "%s", src ? src : "");
}

static int copy_shape(int64_t *dst, size_t n, const int64_t *src)
{
    int k = n > DDL_CLIENT_MAX_DIMS ? DDL_CLIENT_MAX_DIMS : (int)n;
    for (int i = 0; i < k; i++)
        dst[i] = src[i];
    return k;
}

// A wire Tensor that borrows t's memory (valid while t lives).
static void tensor_to_wire(const ddl_client_tensor *t, Distdl__V1__Tensor *w)
{
    distdl__v1__tensor__init(w);
    w->name     = t->name ? t->name : (char *)"";
    w->datatype = (char *)ddl_wire_dtype_name(t->dtype);
    w->n_shape  = (size_t)t->ndim;
    w->shape    = (int64_t *)t->shape;
    w->raw.len  = t->bytes;
    w->raw.data = t->data;
}

// A client tensor owning a copy of a wire Tensor.
static ddl_status tensor_from_wire(const Distdl__V1__Tensor *w, const char *what,
                                   ddl_client_tensor *t)
{
    memset(t, 0, sizeof *t);
    int dt = ddl__dtype_from_name(w->datatype);
    if (dt < 0)
        return ddl__local_error(DDL_EPROTO, "%s: unknown datatype '%s'", what, w->datatype);
    if (w->n_shape > DDL_CLIENT_MAX_DIMS)
        return ddl__local_error(DDL_EPROTO, "%s: %zu dims", what, w->n_shape);
    t->dtype = (ddl_wire_dtype)dt;
    t->ndim  = copy_shape(t->shape, w->n_shape, w->shape);
    t->name  = strdup(w->name ? w->name : "");
    t->data  = malloc(w->raw.len ? w->raw.len : 1);
    if (!t->name || !t->data) {
        ddl_client_tensor_release(t);
        return ddl__local_error(DDL_ENOMEM, "%s: out of memory", what);
    }
    memcpy(t->data, w->raw.data, w->raw.len);
    t->bytes = w->raw.len;
    return DDL_OK;
}

// A tensor the caller filled in (a zeroed one is unset).
static int tensor_set(const ddl_client_tensor *t)
{
    return t->ndim > 0 || t->bytes > 0 || t->data != NULL;
}

// What a batch's loss learns from: its targets, or else its labels.
static const ddl_client_tensor *batch_targets(const ddl_client_batch *b)
{
    return tensor_set(&b->targets) ? &b->targets : &b->labels;
}

static ddl_status check_batch(const ddl_client_batch *b, const char *what)
{
    if (tensor_set(&b->targets) && tensor_set(&b->labels))
        return ddl__local_error(DDL_EINVAL, "%s: set the batch's targets or its labels, not both",
                                what);
    ddl_status st = ddl__check_tensor(&b->x, what);
    if (st == DDL_OK)
        st = ddl__check_tensor(batch_targets(b), what);
    return st;
}

// The batch on the wire: its targets in Batch.targets, or its labels in Batch.labels (so a
// classifier's batch reaches a daemon that predates targets too).
static void batch_to_wire(const ddl_client_batch *b, Distdl__V1__Batch *w, Distdl__V1__Tensor *x,
                          Distdl__V1__Tensor *y)
{
    distdl__v1__batch__init(w);
    tensor_to_wire(&b->x, x);
    tensor_to_wire(batch_targets(b), y);
    w->x = x;
    if (tensor_set(&b->targets))
        w->targets = y;
    else
        w->labels = y;
}

// ---- health and inference ------------------------------------------------------------

ddl_status ddl_client_health_check(ddl_client_t *c, const char *service, ddl_health_status *out)
{
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service                              = (char *)(service ? service : "");
    ProtobufCMessage *m;
    ddl_status        st = ddl__unary(c, M_HEALTH_CHECK, &req.base,
                                      &grpc__health__v1__health_check_response__descriptor, &m);
    if (st != DDL_OK)
        return st;
    if (out)
        *out = (ddl_health_status)((Grpc__Health__V1__HealthCheckResponse *)m)->status;
    protobuf_c_message_free_unpacked(m, NULL);
    return DDL_OK;
}

ddl_status ddl_client_server_live(ddl_client_t *c, int *out)
{
    Inference__ServerLiveRequest req = INFERENCE__SERVER_LIVE_REQUEST__INIT;
    ProtobufCMessage            *m;
    ddl_status                   st =
        ddl__unary(c, M_SERVER_LIVE, &req.base, &inference__server_live_response__descriptor, &m);
    if (st != DDL_OK)
        return st;
    if (out)
        *out = ((Inference__ServerLiveResponse *)m)->live;
    protobuf_c_message_free_unpacked(m, NULL);
    return DDL_OK;
}

ddl_status ddl_client_server_ready(ddl_client_t *c, int *out)
{
    Inference__ServerReadyRequest req = INFERENCE__SERVER_READY_REQUEST__INIT;
    ProtobufCMessage             *m;
    ddl_status                    st =
        ddl__unary(c, M_SERVER_READY, &req.base, &inference__server_ready_response__descriptor, &m);
    if (st != DDL_OK)
        return st;
    if (out)
        *out = ((Inference__ServerReadyResponse *)m)->ready;
    protobuf_c_message_free_unpacked(m, NULL);
    return DDL_OK;
}

ddl_status ddl_client_model_ready(ddl_client_t *c, const char *model, int *out)
{
    Inference__ModelReadyRequest req = INFERENCE__MODEL_READY_REQUEST__INIT;
    req.name                         = (char *)(model ? model : "");
    ProtobufCMessage *m;
    ddl_status        st =
        ddl__unary(c, M_MODEL_READY, &req.base, &inference__model_ready_response__descriptor, &m);
    if (st != DDL_OK)
        return st;
    if (out)
        *out = ((Inference__ModelReadyResponse *)m)->ready;
    protobuf_c_message_free_unpacked(m, NULL);
    return DDL_OK;
}

ddl_status ddl_client_model_infer(ddl_client_t *c, const char *model, const ddl_client_tensor *x,
                                  ddl_client_tensor *out)
{
    ddl_status st = ddl__check_tensor(x, "ModelInfer");
    if (st != DDL_OK)
        return st;
    if (!out)
        return ddl__local_error(DDL_EINVAL, "ModelInfer: out is NULL");
    Inference__ModelInferRequest                   req = INFERENCE__MODEL_INFER_REQUEST__INIT;
    Inference__ModelInferRequest__InferInputTensor in =
        INFERENCE__MODEL_INFER_REQUEST__INFER_INPUT_TENSOR__INIT;
    Inference__ModelInferRequest__InferInputTensor *inputs[1] = {&in};
    ProtobufCBinaryData                             raw       = {.len = x->bytes, .data = x->data};
    req.model_name                                            = (char *)(model ? model : "");
    in.name                                                   = x->name ? x->name : (char *)"input";
    in.datatype              = (char *)ddl_wire_dtype_name(x->dtype);
    in.n_shape               = (size_t)x->ndim;
    in.shape                 = (int64_t *)x->shape;
    req.n_inputs             = 1;
    req.inputs               = inputs;
    req.n_raw_input_contents = 1;
    req.raw_input_contents   = &raw;
    ProtobufCMessage *m;
    st = ddl__unary(c, M_MODEL_INFER, &req.base, &inference__model_infer_response__descriptor, &m);
    if (st != DDL_OK)
        return st;
    Inference__ModelInferResponse *r = (Inference__ModelInferResponse *)m;
    if (r->n_outputs < 1 || r->n_raw_output_contents < 1) {
        protobuf_c_message_free_unpacked(m, NULL);
        return ddl__local_error(DDL_EPROTO, "ModelInfer: response has no raw output");
    }
    Distdl__V1__Tensor w;
    distdl__v1__tensor__init(&w);
    w.name     = r->outputs[0]->name;
    w.datatype = r->outputs[0]->datatype;
    w.n_shape  = r->outputs[0]->n_shape;
    w.shape    = r->outputs[0]->shape;
    w.raw      = r->raw_output_contents[0];
    st         = tensor_from_wire(&w, "ModelInfer", out);
    protobuf_c_message_free_unpacked(m, NULL);
    return st;
}

// ---- model and status ----------------------------------------------------------------

ddl_status ddl_client_create_model(ddl_client_t *c, const char *spec_json, const char *name,
                                   int replace, ddl_client_model_info *out)
{
    Distdl__V1__CreateModelRequest req = DISTDL__V1__CREATE_MODEL_REQUEST__INIT;
    req.spec_json                      = (char *)(spec_json ? spec_json : "");
    req.name                           = (char *)(name ? name : "");
    req.replace                        = replace != 0;
    ProtobufCMessage *m;
    ddl_status        st = ddl__unary(c, M_CREATE_MODEL, &req.base,
                                      &distdl__v1__create_model_response__descriptor, &m);
    if (st != DDL_OK)
        return st;
    Distdl__V1__CreateModelResponse *r = (Distdl__V1__CreateModelResponse *)m;
    if (out) {
        memset(out, 0, sizeof *out);
        copy_str(out->name, sizeof out->name, r->name);
        out->world_size     = r->world_size;
        out->num_parameters = r->num_parameters;
        out->batch_size     = r->batch_size;
        out->input_ndim     = copy_shape(out->input_shape, r->n_input_shape, r->input_shape);
        out->num_classes    = r->num_classes;
        copy_str(out->datatype, sizeof out->datatype, r->datatype);
    }
    protobuf_c_message_free_unpacked(m, NULL);
    return DDL_OK;
}

ddl_status ddl_client_get_status(ddl_client_t *c, ddl_client_status_info *out)
{
    Distdl__V1__GetStatusRequest req = DISTDL__V1__GET_STATUS_REQUEST__INIT;
    ProtobufCMessage            *m;
    ddl_status                   st =
        ddl__unary(c, M_GET_STATUS, &req.base, &distdl__v1__get_status_response__descriptor, &m);
    if (st != DDL_OK)
        return st;
    Distdl__V1__GetStatusResponse *r = (Distdl__V1__GetStatusResponse *)m;
    if (out) {
        memset(out, 0, sizeof *out);
        out->has_model = r->has_model;
        copy_str(out->model_name, sizeof out->model_name, r->model_name);
        out->world_size     = r->world_size;
        out->step           = r->step;
        out->last_loss      = r->last_loss;
        out->durable_step   = r->durable_step;
        out->queue_depth    = r->queue_depth;
        out->queue_capacity = r->queue_capacity;
        copy_str(out->state, sizeof out->state, r->state);
        out->epoch       = r->epoch;
        out->batch       = r->batch;
        out->batch_size  = r->batch_size;
        out->input_ndim  = copy_shape(out->input_shape, r->n_input_shape, r->input_shape);
        out->num_classes = r->num_classes;
        copy_str(out->datatype, sizeof out->datatype, r->datatype);
        copy_str(out->data_dir, sizeof out->data_dir, r->data_dir);
        out->num_partitions      = (int32_t)r->n_partitions;
        out->active_calls        = r->active_calls;
        out->request_queue_depth = r->request_queue_depth;
        out->dropped_calls       = r->dropped_calls;
        out->bytes_per_step      = r->bytes_per_step;
    }
    protobuf_c_message_free_unpacked(m, NULL);
    return DDL_OK;
}

// ---- client streaming ----------------------------------------------------------------

// Sends initial metadata; the first step of every streaming call.
static int send_initial(ddl__rpc *r)
{
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op                                  = GRPC_OP_SEND_INITIAL_METADATA;
    op.data.send_initial_metadata.count    = r->client->nauth;
    op.data.send_initial_metadata.metadata = r->client->nauth ? &r->client->auth : NULL;
    return ddl__rpc_batch(r, &op, 1);
}

static int send_message(ddl__rpc *r, const ProtobufCMessage *m)
{
    grpc_byte_buffer *bb = ddl__pack(m);
    grpc_op           op;
    memset(&op, 0, sizeof op);
    op.op                             = GRPC_OP_SEND_MESSAGE;
    op.data.send_message.send_message = bb;
    int ok                            = ddl__rpc_batch(r, &op, 1);
    grpc_byte_buffer_destroy(bb);
    return ok;
}

// Half-closes and receives the single response (NULL if none; the status says why).
static ProtobufCMessage *finish_client_stream(ddl__rpc *r, const ProtobufCMessageDescriptor *d,
                                              ddl_status *local)
{
    grpc_byte_buffer *recv = NULL;
    grpc_op           ops[3];
    memset(ops, 0, sizeof ops);
    ops[0].op                                               = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[1].op                                               = GRPC_OP_RECV_INITIAL_METADATA;
    ops[1].data.recv_initial_metadata.recv_initial_metadata = &r->initial_md;
    ops[2].op                                               = GRPC_OP_RECV_MESSAGE;
    ops[2].data.recv_message.recv_message                   = &recv;
    ddl__rpc_batch(r, ops, 3);
    if (!recv)
        return NULL;
    ProtobufCMessage *m = ddl__unpack(recv, d);
    grpc_byte_buffer_destroy(recv);
    if (!m)
        *local =
            ddl__local_error(DDL_EPROTO, "%s: malformed response", ddl__method_name(r->method));
    return m;
}

// Closes a client-streaming call that expected response m.
static ddl_status close_with_response(ddl__rpc *r, ddl_status local, ProtobufCMessage **m)
{
    ddl_status st = ddl__rpc_close(r, local);
    if (st == DDL_OK && !*m)
        st = ddl__local_error(DDL_EPROTO, "OK status without a response message");
    if (st != DDL_OK && *m) {
        protobuf_c_message_free_unpacked(*m, NULL);
        *m = NULL;
    }
    return st;
}

ddl_status ddl_client_submit_batches(ddl_client_t *c, const ddl_client_batch *b, int64_t n,
                                     int32_t *accepted, int32_t *queue_depth)
{
    if (n < 0 || (n > 0 && !b))
        return ddl__local_error(DDL_EINVAL, "SubmitBatch: %lld batches at %p", (long long)n,
                                (const void *)b);
    for (int64_t i = 0; i < n; i++) {
        ddl_status st = check_batch(&b[i], "SubmitBatch");
        if (st != DDL_OK)
            return st;
    }
    ddl__rpc   r;
    ddl_status st = ddl__rpc_open(c, M_SUBMIT_BATCH, 0, &r);
    if (st != DDL_OK)
        return ddl__rpc_close(&r, st);
    ProtobufCMessage *m     = NULL;
    ddl_status        local = DDL_OK;
    int               ok    = send_initial(&r);
    for (int64_t i = 0; ok && i < n; i++) {
        Distdl__V1__Batch  w;
        Distdl__V1__Tensor x, y;
        batch_to_wire(&b[i], &w, &x, &y);
        ok = send_message(&r, &w.base);
    }
    // A failed send means the daemon already ended the call; its status says why.
    m  = finish_client_stream(&r, &distdl__v1__submit_batch_response__descriptor, &local);
    st = close_with_response(&r, local, &m);
    if (st != DDL_OK)
        return st;
    Distdl__V1__SubmitBatchResponse *resp = (Distdl__V1__SubmitBatchResponse *)m;
    if (accepted)
        *accepted = resp->accepted;
    if (queue_depth)
        *queue_depth = resp->queue_depth;
    protobuf_c_message_free_unpacked(m, NULL);
    return DDL_OK;
}

// ---- step, evaluate, predict ---------------------------------------------------------

ddl_status ddl_client_step(ddl_client_t *c, const ddl_client_batch *batch,
                           ddl_client_step_result *out)
{
    Distdl__V1__StepRequest req = DISTDL__V1__STEP_REQUEST__INIT;
    Distdl__V1__Batch       w;
    Distdl__V1__Tensor      x, y;
    if (batch) {
        ddl_status st = check_batch(batch, "Step");
        if (st != DDL_OK)
            return st;
        batch_to_wire(batch, &w, &x, &y);
        req.batch = &w;
    }
    ProtobufCMessage *m;
    ddl_status st = ddl__unary(c, M_STEP, &req.base, &distdl__v1__step_response__descriptor, &m);
    if (st != DDL_OK)
        return st;
    Distdl__V1__StepResponse *r = (Distdl__V1__StepResponse *)m;
    if (out)
        *out = (ddl_client_step_result){.step     = r->step,
                                        .loss     = r->loss,
                                        .accuracy = r->accuracy,
                                        .durable  = r->durable,
                                        .mse      = r->mse};
    protobuf_c_message_free_unpacked(m, NULL);
    return DDL_OK;
}

ddl_status ddl_client_evaluate(ddl_client_t *c, const char *dataset, const char *split,
                               const ddl_client_batch *batch, ddl_client_eval_result *out)
{
    Distdl__V1__EvaluateRequest req = DISTDL__V1__EVALUATE_REQUEST__INIT;
    Distdl__V1__Batch           w;
    Distdl__V1__Tensor          x, y;
    req.dataset = (char *)(dataset ? dataset : "");
    req.split   = (char *)(split ? split : "");
    if (batch) {
        ddl_status st = check_batch(batch, "Evaluate");
        if (st != DDL_OK)
            return st;
        batch_to_wire(batch, &w, &x, &y);
        req.batch = &w;
    }
    ProtobufCMessage *m;
    ddl_status        st =
        ddl__unary(c, M_EVALUATE, &req.base, &distdl__v1__evaluate_response__descriptor, &m);
    if (st != DDL_OK)
        return st;
    Distdl__V1__EvaluateResponse *r = (Distdl__V1__EvaluateResponse *)m;
    if (out)
        *out = (ddl_client_eval_result){.count    = r->count,
                                        .loss     = r->loss,
                                        .accuracy = r->accuracy,
                                        .mse      = r->mse,
                                        .rel_l2   = r->rel_l2,
                                        .fg_iou   = r->fg_iou};
    protobuf_c_message_free_unpacked(m, NULL);
    return DDL_OK;
}

ddl_status ddl_client_predict(ddl_client_t *c, const ddl_client_tensor *x,
                              ddl_client_tensor *logits)
{
    ddl_status st = ddl__check_tensor(x, "Predict");
    if (st != DDL_OK)
        return st;
    if (!logits)
        return ddl__local_error(DDL_EINVAL, "Predict: logits is NULL");
    Distdl__V1__PredictRequest req = DISTDL__V1__PREDICT_REQUEST__INIT;
    Distdl__V1__Tensor         w;
    tensor_to_wire(x, &w);
    req.x = &w;
    ProtobufCMessage *m;
    st = ddl__unary(c, M_PREDICT, &req.base, &distdl__v1__predict_response__descriptor, &m);
    if (st != DDL_OK)
        return st;
    Distdl__V1__PredictResponse *r = (Distdl__V1__PredictResponse *)m;
    if (!r->logits)
        st = ddl__local_error(DDL_EPROTO, "Predict: response has no logits");
    else
        st = tensor_from_wire(r->logits, "Predict", logits);
    protobuf_c_message_free_unpacked(m, NULL);
    return st;
}

// ---- server streaming: Train, PullWeights ---------------------------------------------

// Sends the one request message and half-closes.
static int send_request(ddl__rpc *r, const ProtobufCMessage *req)
{
    grpc_byte_buffer *bb = ddl__pack(req);
    grpc_op           ops[4];
    memset(ops, 0, sizeof ops);
    ops[0].op                                  = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count    = r->client->nauth;
    ops[0].data.send_initial_metadata.metadata = r->client->nauth ? &r->client->auth : NULL;
    ops[1].op                                  = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message      = bb;
    ops[2].op                                  = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op                                  = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &r->initial_md;
    int ok                                                  = ddl__rpc_batch(r, ops, 4);
    grpc_byte_buffer_destroy(bb);
    return ok;
}

// Receives the next message; NULL at the end of the stream or on failure.
static grpc_byte_buffer *recv_message(ddl__rpc *r)
{
    grpc_byte_buffer *bb = NULL;
    grpc_op           op;
    memset(&op, 0, sizeof op);
    op.op                             = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &bb;
    if (!ddl__rpc_batch(r, &op, 1) && bb) {
        grpc_byte_buffer_destroy(bb);
        bb = NULL;
    }
    return bb;
}

ddl_status ddl_client_health_watch(ddl_client_t *c, const char *service, ddl_client_health_cb cb,
                                   void *user_data)
{
    if (!cb)
        return ddl__local_error(DDL_EINVAL, "Watch: callback is NULL");
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service                              = (char *)(service ? service : "");
    ddl__rpc   r;
    ddl_status st = ddl__rpc_open(c, M_HEALTH_WATCH, 0, &r);
    if (st != DDL_OK)
        return ddl__rpc_close(&r, st);
    ddl_status local   = DDL_OK;
    int        stopped = 0;
    if (send_request(&r, &req.base)) {
        grpc_byte_buffer *bb;
        while ((bb = recv_message(&r))) {
            Grpc__Health__V1__HealthCheckResponse *m =
                (Grpc__Health__V1__HealthCheckResponse *)ddl__unpack(
                    bb, &grpc__health__v1__health_check_response__descriptor);
            grpc_byte_buffer_destroy(bb);
            if (!m) {
                local = ddl__local_error(DDL_EPROTO, "Watch: malformed response");
                break;
            }
            ddl_health_status hs = (ddl_health_status)m->status;
            protobuf_c_message_free_unpacked(&m->base, NULL);
            if (cb(hs, user_data)) {
                stopped = 1;
                grpc_call_cancel(r.call, NULL);
                break;
            }
        }
    }
    st = ddl__rpc_close(&r, local);
    if (stopped && st == DDL_ECANCELED) { // our own cancellation is not an error
        ddl_clear_error();
        st = DDL_OK;
    }
    return st;
}

ddl_status ddl_client_train(ddl_client_t *c, const ddl_client_train_request *req,
                            ddl_client_progress_cb cb, void *user_data, ddl_client_progress *last)
{
    if (!req)
        return ddl__local_error(DDL_EINVAL, "Train: request is NULL");
    Distdl__V1__TrainRequest w = DISTDL__V1__TRAIN_REQUEST__INIT;
    w.steps                    = req->steps;
    w.epochs                   = req->epochs;
    w.dataset                  = (char *)(req->dataset ? req->dataset : "");
    w.progress_every           = req->progress_every;

    ddl__rpc   r;
    ddl_status st = ddl__rpc_open(c, M_TRAIN, 0, &r);
    if (st != DDL_OK)
        return ddl__rpc_close(&r, st);
    ddl_status          local     = DDL_OK;
    int                 cancelled = 0, have = 0;
    ddl_client_progress p;
    memset(&p, 0, sizeof p);
    if (send_request(&r, &w.base)) {
        grpc_byte_buffer *bb;
        while ((bb = recv_message(&r))) {
            Distdl__V1__TrainProgress *m = (Distdl__V1__TrainProgress *)ddl__unpack(
                bb, &distdl__v1__train_progress__descriptor);
            grpc_byte_buffer_destroy(bb);
            if (!m) {
                local = ddl__local_error(DDL_EPROTO, "Train: malformed progress record");
                break;
            }
            p    = (ddl_client_progress){.step              = m->step,
                                         .epoch             = m->epoch,
                                         .batch             = m->batch,
                                         .steps_per_epoch   = m->steps_per_epoch,
                                         .loss              = m->loss,
                                         .accuracy          = m->accuracy,
                                         .images_per_second = m->images_per_second,
                                         .done              = m->done,
                                         .total             = m->total,
                                         .epoch_end         = m->epoch_end,
                                         .durable           = m->durable,
                                         .finished          = m->finished,
                                         .mean_loss         = m->mean_loss,
                                         .mse               = m->mse};
            have = 1;
            protobuf_c_message_free_unpacked(&m->base, NULL);
            if (!cancelled && cb && cb(&p, user_data)) {
                // The daemon sees the cancellation and stops at its next step boundary; keep
                // reading so the stream ends in order and the status says CANCELLED.
                grpc_call_cancel(r.call, NULL);
                cancelled = 1;
            }
        }
    }
    st = ddl__rpc_close(&r, local);
    if (cancelled && st == DDL_OK)
        st = ddl__local_error(DDL_ECANCELED, "Train: cancelled after the last record");
    else if (cancelled && st == DDL_ECANCELED)
        ddl_set_error(DDL_ECANCELED, "Train: CANCELLED: cancelled by the caller at step %lld",
                      (long long)p.step);
    if (last && have)
        *last = p;
    return st;
}

// ---- PullWeights: chunks parsed in place ---------------------------------------------
//
// A WeightChunk arrives as a byte buffer of many slices (a 1 MiB message is ~17). Instead
// of gathering it into one buffer and unpacking it (two copies of the payload), the fields
// are decoded straight from the slices and the payload is copied once, into the tensor.

// The chunk is decoded by src/format/wire.c (ddl/format.h), the daemon's PushWeights too.
static const uint8_t *grpc_seg(const void *segs, size_t i, size_t *len)
{
    const grpc_slice *s = segs;
    *len                = GRPC_SLICE_LENGTH(s[i]);
    return GRPC_SLICE_START_PTR(s[i]);
}

typedef ddl_fmt_wchunk chunk_view;

static ddl_status parse_chunk(const grpc_slice *slices, size_t n, chunk_view *v)
{
    if (ddl_fmt_wchunk_decode(grpc_seg, slices, n, v) != DDL_OK)
        return ddl__local_error(DDL_EPROTO, "PullWeights: malformed chunk (%s)", ddl_last_error());
    if (v->name_long || v->datatype_long)
        return ddl__local_error(DDL_EPROTO,
                                "PullWeights: malformed chunk (a name over %zu or a "
                                "datatype over %zu bytes)",
                                sizeof v->name - 1, sizeof v->datatype - 1);
    return DDL_OK;
}

// Accumulates pulled chunks into a weight set.
typedef struct pull_state {
    ddl_client_weights *w;
    int64_t             cap;
    size_t              filled; // bytes of the current tensor received
} pull_state;

static ddl_status pull_chunk(pull_state *ps, chunk_view *ch)
{
    ddl_client_weights *w = ps->w;
    if (ch->first) {
        if (w->count > 0 && ps->filled != w->tensors[w->count - 1].bytes)
            return ddl__local_error(
                DDL_EPROTO, "PullWeights: tensor '%s' ended after %zu of %zu bytes",
                w->tensors[w->count - 1].name, ps->filled, w->tensors[w->count - 1].bytes);
        int dt = ddl__dtype_from_name(ch->datatype);
        if (dt < 0 || ch->shape_long)
            return ddl__local_error(DDL_EPROTO,
                                    "PullWeights: tensor '%s': datatype '%s', %s%zu dims", ch->name,
                                    ch->datatype, ch->shape_long ? "over " : "", ch->nshape);
        size_t bytes = ddl_wire_dtype_size((ddl_wire_dtype)dt);
        for (size_t i = 0; i < ch->nshape; i++) {
            if (ch->shape[i] < 0 ||
                (ch->shape[i] > 0 && bytes > ((size_t)1 << 40) / (size_t)ch->shape[i]))
                return ddl__local_error(DDL_EPROTO, "PullWeights: tensor '%s' has a bad shape",
                                        ch->name);
            bytes *= (size_t)ch->shape[i];
        }
        if (w->count == ps->cap) {
            int64_t            cap = ps->cap ? 2 * ps->cap : 16;
            ddl_client_tensor *nt  = realloc(w->tensors, (size_t)cap * sizeof *nt);
            if (!nt)
                return ddl__local_error(DDL_ENOMEM, "PullWeights: out of memory");
            w->tensors = nt;
            ps->cap    = cap;
        }
        ddl_client_tensor *t = &w->tensors[w->count];
        memset(t, 0, sizeof *t);
        t->name = strdup(ch->name);
        t->data = malloc(bytes ? bytes : 1);
        if (!t->name || !t->data) {
            ddl_client_tensor_release(t);
            return ddl__local_error(DDL_ENOMEM, "PullWeights: out of memory for '%s' (%zu bytes)",
                                    ch->name, bytes);
        }
        t->dtype = (ddl_wire_dtype)dt;
        t->ndim  = copy_shape(t->shape, ch->nshape, ch->shape);
        t->bytes = bytes;
        w->count++;
        ps->filled = 0;
    }
    if (w->count == 0)
        return ddl__local_error(DDL_EPROTO, "PullWeights: data before the first tensor header");
    ddl_client_tensor *t = &w->tensors[w->count - 1];
    if (ch->data_len == 0)
        return DDL_OK;
    if (ch->offset != (int64_t)ps->filled || ch->data_len > t->bytes - ps->filled)
        return ddl__local_error(DDL_EPROTO,
                                "PullWeights: tensor '%s': chunk at offset %lld of %zu bytes, "
                                "expected offset %zu of a %zu-byte tensor",
                                t->name, (long long)ch->offset, ch->data_len, ps->filled, t->bytes);
    if (!ddl_fmt_cursor_take(&ch->data, (char *)t->data + ps->filled, ch->data_len))
        return ddl__local_error(DDL_EPROTO, "PullWeights: truncated chunk");
    ps->filled += ch->data_len;
    return DDL_OK;
}

// Parses one received message and applies it.
static ddl_status pull_message(pull_state *ps, grpc_byte_buffer *bb)
{
    chunk_view v;
    ddl_status st;
    if (bb->type == GRPC_BB_RAW && bb->data.raw.compression == GRPC_COMPRESS_NONE) {
        st = parse_chunk(bb->data.raw.slice_buffer.slices, bb->data.raw.slice_buffer.count, &v);
        return st == DDL_OK ? pull_chunk(ps, &v) : st;
    }
    grpc_byte_buffer_reader rd; // compressed: let gRPC inflate it into one slice
    if (!grpc_byte_buffer_reader_init(&rd, bb))
        return ddl__local_error(DDL_EPROTO, "PullWeights: cannot read a chunk");
    grpc_slice s = grpc_byte_buffer_reader_readall(&rd);
    grpc_byte_buffer_reader_destroy(&rd);
    st = parse_chunk(&s, 1, &v);
    if (st == DDL_OK)
        st = pull_chunk(ps, &v);
    grpc_slice_unref(s);
    return st;
}

ddl_status ddl_client_pull_weights(ddl_client_t *c, ddl_client_weights **out)
{
    if (!out)
        return ddl__local_error(DDL_EINVAL, "PullWeights: out is NULL");
    pull_state ps = {.w = calloc(1, sizeof(ddl_client_weights))};
    if (!ps.w)
        return ddl__local_error(DDL_ENOMEM, "PullWeights: out of memory");
    Distdl__V1__PullWeightsRequest req = DISTDL__V1__PULL_WEIGHTS_REQUEST__INIT;
    ddl__rpc                       r;
    ddl_status                     st = ddl__rpc_open(c, M_PULL_WEIGHTS, 0, &r);
    if (st != DDL_OK) {
        ddl_client_weights_destroy(&ps.w);
        return ddl__rpc_close(&r, st);
    }
    ddl_status local = DDL_OK;
    if (send_request(&r, &req.base)) {
        grpc_byte_buffer *bb;
        while (local == DDL_OK && (bb = recv_message(&r))) {
            local = pull_message(&ps, bb);
            grpc_byte_buffer_destroy(bb);
        }
    }
    if (local == DDL_OK && ps.w->count > 0 && ps.filled != ps.w->tensors[ps.w->count - 1].bytes)
        local = ddl__local_error(DDL_EPROTO, "PullWeights: the stream ended inside tensor '%s'",
                                 ps.w->tensors[ps.w->count - 1].name);
    st = ddl__rpc_close(&r, local);
    if (st != DDL_OK) {
        ddl_client_weights_destroy(&ps.w);
        return st;
    }
    *out = ps.w;
    return DDL_OK;
}

ddl_status ddl_client_pull_weights_to_file(ddl_client_t *c, const char *path)
{
    if (!path)
        return ddl__local_error(DDL_EINVAL, "PullWeights: path is NULL");
    ddl_client_weights *w;
    ddl_status          st = ddl_client_pull_weights(c, &w);
    if (st != DDL_OK)
        return st;
    st = ddl_safetensors_write(path, w);
    ddl_client_weights_destroy(&w);
    return st;
}

// ---- PushWeights ---------------------------------------------------------------------

ddl_status ddl_client_push_weights(ddl_client_t *c, const ddl_client_tensor *t, int64_t n,
                                   int32_t *tensors, int64_t *bytes)
{
    if (n < 0 || (n > 0 && !t))
        return ddl__local_error(DDL_EINVAL, "PushWeights: %lld tensors at %p", (long long)n,
                                (const void *)t);
    for (int64_t i = 0; i < n; i++) {
        ddl_status st = ddl__check_tensor(&t[i], "PushWeights");
        if (st != DDL_OK)
            return st;
    }
    ddl__rpc   r;
    ddl_status st = ddl__rpc_open(c, M_PUSH_WEIGHTS, 0, &r);
    if (st != DDL_OK)
        return ddl__rpc_close(&r, st);
    ddl_status local = DDL_OK;
    int        ok    = send_initial(&r);
    for (int64_t i = 0; ok && i < n; i++) {
        size_t off = 0;
        do {
            size_t len = t[i].bytes - off < CHUNK_BYTES ? t[i].bytes - off : CHUNK_BYTES;
            Distdl__V1__WeightChunk ch = DISTDL__V1__WEIGHT_CHUNK__INIT;
            if (off == 0) {
                ch.first    = 1;
                ch.name     = t[i].name ? t[i].name : (char *)"";
                ch.datatype = (char *)ddl_wire_dtype_name(t[i].dtype);
                ch.n_shape  = (size_t)t[i].ndim;
                ch.shape    = (int64_t *)t[i].shape;
            }
            ch.offset    = (int64_t)off;
            ch.data.len  = len;
            ch.data.data = (uint8_t *)t[i].data + off;
            ok           = send_message(&r, &ch.base);
            off += len;
        } while (ok && off < t[i].bytes);
    }
    ProtobufCMessage *m =
        finish_client_stream(&r, &distdl__v1__push_weights_response__descriptor, &local);
    st = close_with_response(&r, local, &m);
    if (st != DDL_OK)
        return st;
    Distdl__V1__PushWeightsResponse *resp = (Distdl__V1__PushWeightsResponse *)m;
    if (tensors)
        *tensors = resp->tensors;
    if (bytes)
        *bytes = resp->bytes;
    protobuf_c_message_free_unpacked(m, NULL);
    return DDL_OK;
}

ddl_status ddl_client_push_weights_from_file(ddl_client_t *c, const char *path)
{
    ddl_client_weights *w;
    ddl_status          st = ddl_safetensors_read(path, &w);
    if (st != DDL_OK)
        return st;
    st = ddl_client_push_weights(c, w->tensors, w->count, NULL, NULL);
    ddl_client_weights_destroy(&w);
    return st;
}

// ---- checkpoints and shutdown ----------------------------------------------------------

ddl_status ddl_client_checkpoint(ddl_client_t *c, const char *dir,
                                 ddl_client_checkpoint_result *out)
{
    Distdl__V1__CheckpointRequest req = DISTDL__V1__CHECKPOINT_REQUEST__INIT;
    req.dir                           = (char *)(dir ? dir : "");
    ProtobufCMessage *m;
    ddl_status        st =
        ddl__unary(c, M_CHECKPOINT, &req.base, &distdl__v1__checkpoint_response__descriptor, &m);
    if (st != DDL_OK)
        return st;
    Distdl__V1__CheckpointResponse *r = (Distdl__V1__CheckpointResponse *)m;
    if (out) {
        memset(out, 0, sizeof *out);
        out->step    = r->step;
        out->durable = r->durable;
        copy_str(out->path, sizeof out->path, r->path);
    }
    protobuf_c_message_free_unpacked(m, NULL);
    return DDL_OK;
}

ddl_status ddl_client_restore(ddl_client_t *c, int64_t step, const char *dir,
                              int64_t *restored_step)
{
    Distdl__V1__RestoreRequest req = DISTDL__V1__RESTORE_REQUEST__INIT;
    req.step                       = step < 0 ? 0 : step;
    req.latest                     = step < 0;
    req.dir                        = (char *)(dir ? dir : "");
    ProtobufCMessage *m;
    ddl_status        st =
        ddl__unary(c, M_RESTORE, &req.base, &distdl__v1__restore_response__descriptor, &m);
    if (st != DDL_OK)
        return st;
    if (restored_step)
        *restored_step = ((Distdl__V1__RestoreResponse *)m)->step;
    protobuf_c_message_free_unpacked(m, NULL);
    return DDL_OK;
}

ddl_status ddl_client_shutdown(ddl_client_t *c, int checkpoint, int64_t *durable_step)
{
    Distdl__V1__ShutdownRequest req = DISTDL__V1__SHUTDOWN_REQUEST__INIT;
    req.checkpoint                  = checkpoint != 0;
    ProtobufCMessage *m;
    ddl_status        st =
        ddl__unary(c, M_SHUTDOWN, &req.base, &distdl__v1__shutdown_response__descriptor, &m);
    if (st != DDL_OK)
        return st;
    if (durable_step)
        *durable_step = ((Distdl__V1__ShutdownResponse *)m)->durable_step;
    protobuf_c_message_free_unpacked(m, NULL);
    return DDL_OK;
}
