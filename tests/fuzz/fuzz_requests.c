// tests/fuzz/fuzz_requests.c: the daemon's request path, "bytes -> validated request or
// error message", with the code distdld runs (server/requests.c): protobuf-c decoding of
// every RPC's request through ddld_request_decode (one slice, or split in two so gRPC's
// byte-buffer reader gathers them), then the request's validator against the model of
// deploy/specs/lenet5-2.json:
//   CreateModel      ddl_spec_parse(spec_json, world 2), as create_model does first
//   SubmitBatch      ddld_batch_check(exact)          Step   the inline batch, the same
//   Evaluate         ddld_batch_check(not exact), or the split and ddld_resolve_dataset
//   Train            ddld_resolve_dataset(dataset)    Predict ddld_input_check(x)
//   ModelInfer       ddld_infer_input
//   PushWeights      a stream of chunks: ddld_wchunk_parse over 1-2 slices, ddld_wchunk_check
//                    against lenet5's weight table, the data copied into a staging buffer
//   the others       decoding only (their handlers read no field, or only a path the
//                    engine opens)
// After a validator accepts, the harness reads every byte it promised (ASan checks it).
//
// Input: byte 0 selects the method, byte 1 where the payload splits into two slices (0:
// one slice), the rest is the payload; for PushWeights the payload is a sequence of
// messages, each a 2-byte little-endian length then that many bytes.
#include "fuzz_util.h"

#include <errno.h>
#include <grpc/byte_buffer.h>
#include <grpc/slice.h>
#include <limits.h>
#include <sys/stat.h>

#include "ddl/base.h"
#include "ddl/model.h"
#include "grpc/health/v1/health.pb-c.h"
#include "requests.h"

static ddld_model_info mi;
static char            root[PATH_MAX]; // the data root (resolved), a private temp dir
static uint8_t        *staging;

static void fatal(const char *what)
{
    fprintf(stderr, "fuzz_requests: %s\n", what);
    abort();
}

// The weight table distdld publishes for lenet5-2 (ddl_session_weight_*): names, shapes
// and the packed 64-byte-aligned layout PushWeights stages into.
static void lenet5_weights(void)
{
    static const struct {
        const char *name;
        int         ndim;
        int64_t     d[4];
    } w[] = {
        {"conv1.weight", 4, {6, 1, 5, 5}}, {"conv1.bias", 1, {6}},
        {"conv2.weight", 4, {16, 6, 5, 5}}, {"conv2.bias", 1, {16}},
        {"fc1.weight", 2, {120, 400}},      {"fc1.bias", 1, {120}},
        {"fc2.weight", 2, {84, 120}},       {"fc2.bias", 1, {84}},
        {"fc3.weight", 2, {10, 84}},        {"fc3.bias", 1, {10}},
    };
    int n       = (int)(sizeof w / sizeof w[0]);
    mi.nweights = n;
    mi.weights  = calloc((size_t)n, sizeof *mi.weights);
    size_t off  = 0;
    for (int i = 0; i < n; i++) {
        ddld_weight_info *x = &mi.weights[i];
        x->name             = strdup(w[i].name);
        x->dtype            = mi.dtype;
        x->shape.ndim       = w[i].ndim;
        memcpy(x->shape.d, w[i].d, sizeof w[i].d);
        x->bytes  = (size_t)ddl_shape_numel(&x->shape) * ddl_dtype_size(x->dtype);
        x->offset = off;
        off += (x->bytes + 63) / 64 * 64;
        mi.num_parameters += ddl_shape_numel(&x->shape);
    }
    mi.weights_bytes = off;
    staging          = aligned_alloc(64, off + 64);
}

static void remove_root(void)
{
    char p[PATH_MAX + 32];
    static const char *const names[] = {"data/sub", "data", "out", "up", "self", "in"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", root, names[i]);
        if (unlink(p) != 0) {
            rmdir(p);
        }
    }
    rmdir(root);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    ddl_spec_t *spec = NULL;
    if (ddl_spec_load(DDL_FUZZ_SPEC, 2, &spec) != DDL_OK) {
        fatal(ddl_last_error());
    }
    // publish_model's fields.
    mi.has_model = true;
    snprintf(mi.name, sizeof mi.name, "lenet5-2");
    mi.dtype        = ddl_spec_dtype(spec);
    mi.batch_size   = ddl_spec_batch_size(spec);
    mi.input        = ddl_spec_input_shape(spec);
    mi.sample_numel = ddl_shape_numel(&mi.input);
    mi.classes      = ddl_spec_num_classes(spec);
    mi.output       = ddl_spec_output_shape(spec);
    mi.out_elems    = ddl_spec_output_elems(spec);
    mi.dense        = false; // a classifier: its targets are INT64 [n] (mi.target: [])
    snprintf(mi.loss, sizeof mi.loss, "%s", ddl_spec_loss_name(spec));
    ddl_spec_normalize(spec, &mi.norm_mean, &mi.norm_std);
    ddl_spec_destroy(&spec);
    lenet5_weights();

    // A data root with a dataset, a nested one, and symbolic links that leave it.
    // Under $TMPDIR (run.sh points it into its work directory, removed at the end, also
    // after a crash, when atexit handlers do not run).
    char        tmpl[PATH_MAX];
    const char *tmp = getenv("TMPDIR");
    snprintf(tmpl, sizeof tmpl, "%s/ddl-fuzz-root-XXXXXX", tmp != NULL && tmp[0] ? tmp : "/tmp");
    if (mkdtemp(tmpl) == NULL || realpath(tmpl, root) == NULL) {
        fatal("cannot make the data root");
    }
    char p[PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/data", root);
    mkdir(p, 0700);
    snprintf(p, sizeof p, "%s/data/sub", root);
    mkdir(p, 0700);
    snprintf(p, sizeof p, "%s/out", root);
    if (symlink("/", p) != 0) {
        fatal("symlink");
    }
    snprintf(p, sizeof p, "%s/up", root);
    if (symlink("..", p) != 0) {
        fatal("symlink");
    }
    snprintf(p, sizeof p, "%s/self", root);
    if (symlink(".", p) != 0) {
        fatal("symlink");
    }
    snprintf(p, sizeof p, "%s/in", root);
    if (symlink("data/sub", p) != 0) {
        fatal("symlink");
    }
    atexit(remove_root);
    return 0;
}

// ---- checks of what a validator promised ----------------------------------------------

static volatile uint8_t sink;

static void touch(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        sink ^= p[i];
    }
}

static size_t item_of(const char *datatype)
{
    return strcmp(datatype, "UINT8") == 0 ? 1 : ddl_dtype_size(mi.dtype);
}

static void check_batch(const Distdl__V1__Batch *b, bool exact)
{
    char    err[768];
    int64_t n;
    if (b == NULL || ddld_batch_check(&mi, b, exact, &n, err, sizeof err) != GRPC_STATUS_OK) {
        return;
    }
    if (n < 1 || (exact && n != mi.batch_size)) {
        fatal("ddld_batch_check accepted a wrong sample count");
    }
    // input_data and target_data read exactly these bytes (a classifier's INT64 labels, in
    // either field).
    const Distdl__V1__Tensor *t = b->targets != NULL ? b->targets : b->labels;
    touch(b->x->raw.data, (size_t)n * (size_t)mi.sample_numel * item_of(b->x->datatype));
    touch(t->raw.data, (size_t)n * 8);
}

static void check_dataset(const char *rel)
{
    char abs[PATH_MAX], err[768];
    if (ddld_resolve_dataset(root, rel, abs, err, sizeof err) != GRPC_STATUS_OK) {
        return;
    }
    size_t rn = strlen(root);
    if (strncmp(abs, root, rn) != 0 || (abs[rn] != '\0' && abs[rn] != '/')) {
        fprintf(stderr, "dataset \"%s\" resolved to %s, outside %s\n", rel, abs, root);
        fatal("ddld_resolve_dataset let a name leave the data root");
    }
}

// ---- the methods -----------------------------------------------------------------------

static void v_create(const ProtobufCMessage *m)
{
    const Distdl__V1__CreateModelRequest *q = (const void *)m;
    if (q->spec_json == NULL || q->spec_json[0] == '\0') {
        return; // "spec_json is empty"
    }
    ddl_spec_t *spec = NULL;
    (void)ddl_spec_parse(q->spec_json, "spec_json", 2, &spec);
    ddl_spec_destroy(&spec);
}

static void v_batch(const ProtobufCMessage *m)
{
    check_batch((const void *)m, true);
}

static void v_step(const ProtobufCMessage *m)
{
    check_batch(((const Distdl__V1__StepRequest *)m)->batch, true);
}

static void v_train(const ProtobufCMessage *m)
{
    check_dataset(((const Distdl__V1__TrainRequest *)m)->dataset);
}

static void v_evaluate(const ProtobufCMessage *m)
{
    const Distdl__V1__EvaluateRequest *q = (const void *)m;
    if (q->batch != NULL) {
        check_batch(q->batch, false);
    } else if (q->split[0] == '\0' || strcmp(q->split, "test") == 0 ||
               strcmp(q->split, "train") == 0) {
        check_dataset(q->dataset);
    }
}

static void v_predict(const ProtobufCMessage *m)
{
    const Distdl__V1__PredictRequest *q = (const void *)m;
    char                              err[768];
    int64_t                           n;
    if (q->x == NULL || ddld_input_check(&mi, "x", q->x->datatype, q->x->shape, q->x->n_shape,
                                         q->x->raw.len, &n, err, sizeof err) != GRPC_STATUS_OK) {
        return;
    }
    touch(q->x->raw.data, (size_t)n * (size_t)mi.sample_numel * item_of(q->x->datatype));
}

static void v_infer(const ProtobufCMessage *m)
{
    const Inference__ModelInferRequest *q = (const void *)m;
    const uint8_t                      *raw;
    void                               *typed;
    char                                err[1024];
    int64_t                             n;
    if (ddld_infer_input(&mi, q, &raw, &typed, &n, err, sizeof err) != GRPC_STATUS_OK) {
        if (typed != NULL) {
            fatal("ddld_infer_input failed but left its buffer");
        }
        return;
    }
    touch(raw, (size_t)n * (size_t)mi.sample_numel * item_of(q->inputs[0]->datatype));
    ddl_free(typed);
}

static const struct method {
    const char                       *name;
    const ProtobufCMessageDescriptor *req;
    void (*validate)(const ProtobufCMessage *m);
} methods[] = {
    {"CreateModel", &distdl__v1__create_model_request__descriptor, v_create},
    {"GetStatus", &distdl__v1__get_status_request__descriptor, NULL},
    {"SubmitBatch", &distdl__v1__batch__descriptor, v_batch},
    {"Step", &distdl__v1__step_request__descriptor, v_step},
    {"Train", &distdl__v1__train_request__descriptor, v_train},
    {"Evaluate", &distdl__v1__evaluate_request__descriptor, v_evaluate},
    {"Predict", &distdl__v1__predict_request__descriptor, v_predict},
    {"PullWeights", &distdl__v1__pull_weights_request__descriptor, NULL},
    {"PushWeights", NULL, NULL}, // a chunk stream: push_stream
    {"Checkpoint", &distdl__v1__checkpoint_request__descriptor, NULL},
    {"Restore", &distdl__v1__restore_request__descriptor, NULL},
    {"Shutdown", &distdl__v1__shutdown_request__descriptor, NULL},
    {"Health", &grpc__health__v1__health_check_request__descriptor, NULL},
    {"ServerLive", &inference__server_live_request__descriptor, NULL},
    {"ServerReady", &inference__server_ready_request__descriptor, NULL},
    {"ModelReady", &inference__model_ready_request__descriptor, NULL},
    {"ModelMetadata", &inference__model_metadata_request__descriptor, NULL},
    {"ModelInfer", &inference__model_infer_request__descriptor, v_infer},
};
#define NMETHODS (sizeof methods / sizeof methods[0])

// The payload as gRPC hands it over: one slice, or two split at `cut`.
static size_t make_slices(const uint8_t *p, size_t n, size_t cut, grpc_slice s[2])
{
    if (cut == 0 || cut >= n) {
        s[0] = grpc_slice_from_copied_buffer((const char *)p, n);
        return 1;
    }
    s[0] = grpc_slice_from_copied_buffer((const char *)p, cut);
    s[1] = grpc_slice_from_copied_buffer((const char *)p + cut, n - cut);
    return 2;
}

// PushWeights: service.c's push_message/push_chunk with the call state kept here.
static void push_stream(const uint8_t *p, size_t n, size_t cut)
{
    size_t got[16] = {0};
    int    cur     = -1;
    while (n >= 2) {
        size_t len = (size_t)p[0] | (size_t)p[1] << 8;
        p += 2;
        n -= 2;
        len = len < n ? len : n;
        grpc_slice    s[2];
        size_t        ns = make_slices(p, len, cut, s);
        struct wchunk ch;
        bool          ok = ddld_wchunk_parse(s, ns, &ch);
        char          err[768];
        if (ok && ddld_wchunk_check(&mi, got, &cur, &ch, err, sizeof err) == GRPC_STATUS_OK) {
            const ddld_weight_info *w = &mi.weights[cur];
            if (got[cur] + ch.data_len > w->bytes) {
                fatal("ddld_wchunk_check accepted data past the tensor's end");
            }
            if (!ddld_wc_take(&ch.data, staging + w->offset + got[cur], ch.data_len)) {
                fatal("a parsed chunk's data is shorter than its length");
            }
            got[cur] += ch.data_len;
        } else {
            ok = false;
        }
        for (size_t i = 0; i < ns; i++) {
            grpc_slice_unref(s[i]);
        }
        if (!ok) {
            return; // the call fails here
        }
        p += len;
        n -= len;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) {
        return 0;
    }
    const struct method *md  = &methods[data[0] % NMETHODS];
    size_t               cut = data[1];
    const uint8_t       *p   = data + 2;
    size_t               n   = size - 2;
    if (md->req == NULL) {
        push_stream(p, n, cut);
        return 0;
    }
    grpc_slice        s[2];
    size_t            ns = make_slices(p, n, cut, s);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(s, ns);
    for (size_t i = 0; i < ns; i++) {
        grpc_slice_unref(s[i]);
    }
    char              why[512];
    ProtobufCMessage *m = ddld_request_decode(bb, md->req, why, sizeof why);
    grpc_byte_buffer_destroy(bb);
    if (m != NULL) {
        if (md->validate != NULL) {
            md->validate(m);
        }
        protobuf_c_message_free_unpacked(m, NULL);
    }
    return 0;
}
