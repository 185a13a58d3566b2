// py_client_ref: the C side of the Python binding's tests.
//
//   py_client_ref abi
//       prints, as one JSON object, the size of every struct of ddl_client.h that
//       client/python/distdl_client/_native.py mirrors and the offset of each of its
//       fields; abi_test.py compares them with ctypes.
//   py_client_ref predict ADDRESS IN.u8 N OUT.f32
//       sends N Fashion-MNIST images (raw uint8 [N, 1, 28, 28] in IN.u8) to Predict
//       through the C library and writes the logits' raw bytes to OUT.f32, for the
//       binding's predict to be compared with.
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddl_client.h"

// ---- abi -----------------------------------------------------------------------------

#define OPTIONS_FIELDS(F)                                                                     \
    F(connect_timeout_s) F(call_timeout_s) F(tls_ca_file) F(tls_cert_file) F(tls_key_file)    \
    F(tls_server_name) F(token) F(max_receive_bytes) F(tune_malloc) F(own_connection)
#define TENSOR_FIELDS(F) F(name) F(dtype) F(ndim) F(shape) F(data) F(bytes)
#define WEIGHTS_FIELDS(F) F(count) F(tensors)
#define MODEL_INFO_FIELDS(F)                                                                  \
    F(name) F(world_size) F(num_parameters) F(batch_size) F(input_ndim) F(input_shape)        \
    F(num_classes) F(datatype)
#define STATUS_INFO_FIELDS(F)                                                                 \
    F(has_model) F(model_name) F(world_size) F(step) F(last_loss) F(durable_step)             \
    F(queue_depth) F(queue_capacity) F(state) F(epoch) F(batch) F(batch_size) F(input_ndim)   \
    F(input_shape) F(num_classes) F(datatype) F(data_dir) F(num_partitions) F(active_calls)   \
    F(request_queue_depth) F(dropped_calls) F(bytes_per_step)
#define BATCH_FIELDS(F) F(x) F(labels) F(targets)
#define STEP_RESULT_FIELDS(F) F(step) F(loss) F(accuracy) F(durable) F(mse)
#define TRAIN_REQUEST_FIELDS(F) F(steps) F(epochs) F(dataset) F(progress_every)
#define PROGRESS_FIELDS(F)                                                                         \
    F(step)                                                                                        \
    F(epoch) F(batch) F(steps_per_epoch) F(loss) F(accuracy) F(images_per_second) F(done) F(total) \
        F(epoch_end) F(durable) F(finished) F(mean_loss) F(mse)
#define EVAL_RESULT_FIELDS(F) F(count) F(loss) F(accuracy) F(mse) F(rel_l2) F(fg_iou)
#define CHECKPOINT_RESULT_FIELDS(F) F(step) F(durable) F(path)

static int first_struct = 1;

#define PRINT_FIELD(f)                                                                        \
    printf("%s\"%s\": %zu", first ? "" : ", ", #f, offsetof(T, f));                          \
    first = 0;
#define PRINT_STRUCT(type, LIST)                                                              \
    do {                                                                                      \
        typedef type T;                                                                       \
        int first = 1;                                                                        \
        printf("%s\n  \"%s\": {\"size\": %zu, \"fields\": {", first_struct ? "" : ",", #type, \
               sizeof(T));                                                                    \
        first_struct = 0;                                                                     \
        LIST(PRINT_FIELD)                                                                     \
        printf("}}");                                                                         \
    } while (0)

static int cmd_abi(void)
{
    printf("{");
    PRINT_STRUCT(ddl_client_options, OPTIONS_FIELDS);
    PRINT_STRUCT(ddl_client_tensor, TENSOR_FIELDS);
    PRINT_STRUCT(ddl_client_weights, WEIGHTS_FIELDS);
    PRINT_STRUCT(ddl_client_model_info, MODEL_INFO_FIELDS);
    PRINT_STRUCT(ddl_client_status_info, STATUS_INFO_FIELDS);
    PRINT_STRUCT(ddl_client_batch, BATCH_FIELDS);
    PRINT_STRUCT(ddl_client_step_result, STEP_RESULT_FIELDS);
    PRINT_STRUCT(ddl_client_train_request, TRAIN_REQUEST_FIELDS);
    PRINT_STRUCT(ddl_client_progress, PROGRESS_FIELDS);
    PRINT_STRUCT(ddl_client_eval_result, EVAL_RESULT_FIELDS);
    PRINT_STRUCT(ddl_client_checkpoint_result, CHECKPOINT_RESULT_FIELDS);
    printf("\n}\n");
    return 0;
}

// ---- predict -------------------------------------------------------------------------

static int cmd_predict(const char *address, const char *in, long n, const char *out)
{
    size_t   bytes = (size_t)n * 784;
    uint8_t *px    = malloc(bytes);
    FILE    *f     = fopen(in, "rb");
    if (!px || !f || fread(px, 1, bytes, f) != bytes) {
        fprintf(stderr, "py_client_ref: cannot read %ld images (%zu bytes) from %s\n", n, bytes,
                in);
        return 1;
    }
    fclose(f);
    ddl_client_t *c;
    if (ddl_client_connect(address, NULL, &c) != DDL_OK) {
        fprintf(stderr, "py_client_ref: connect: %s\n", ddl_last_error());
        return 1;
    }
    ddl_client_tensor x = {.dtype = DDL_WIRE_UINT8, .ndim = 4, .shape = {n, 1, 28, 28},
                           .data = px, .bytes = bytes};
    ddl_client_tensor logits = {0};
    int               rc     = 1;
    if (ddl_client_predict(c, &x, &logits) != DDL_OK) {
        fprintf(stderr, "py_client_ref: predict: %s\n", ddl_last_error());
    } else if ((f = fopen(out, "wb")) == NULL ||
               fwrite(logits.data, 1, logits.bytes, f) != logits.bytes || fclose(f) != 0) {
        fprintf(stderr, "py_client_ref: cannot write %s\n", out);
    } else {
        printf("predict: %ld images -> logits [%lld, %lld] %s\n", n, (long long)logits.shape[0],
               (long long)logits.shape[1], ddl_wire_dtype_name(logits.dtype));
        rc = 0;
    }
    ddl_client_tensor_release(&logits);
    ddl_client_destroy(&c);
    free(px);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "abi") == 0) {
        return cmd_abi();
    }
    if (argc == 6 && strcmp(argv[1], "predict") == 0) {
        long n = strtol(argv[4], NULL, 10);
        if (n > 0) {
            return cmd_predict(argv[2], argv[3], n, argv[5]);
        }
    }
    fprintf(stderr, "usage: py_client_ref abi | predict ADDRESS IN.u8 N OUT.f32\n");
    return 2;
}
