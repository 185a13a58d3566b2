// server/requests.h: the pure half of the daemon's request path, "bytes -> validated
// request or error message": decoding a received message, parsing PushWeights chunks in
// place, and checking tensors, batches, chunks and inference inputs against the model.
// No MPI, no engine session, no call state: the cq thread (service.c), the main thread
// (dispatch.c) and the fuzz targets (tests/fuzz/fuzz_requests.c) all run this code.
#ifndef DDLD_REQUESTS_H
#define DDLD_REQUESTS_H

#include <grpc/byte_buffer.h>
#include <grpc/slice.h>
#include <grpc/status.h>
#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "distdl/v1/trainer.pb-c.h"
#include "inference/grpc_service.pb-c.h"
#include "model_info.h"

#define DDLD_MAX_ELEMENTS ((int64_t)1 << 34) // elements in any request tensor

// Unpacks a received message with protobuf-c (any slice layout, compressed or not).
// NULL: malformed; err (errlen > 0) is then "" or, for a string field (at any depth) that
// holds a NUL byte, which one ("dir: a string holding a NUL byte ..."): C would see it cut
// short there, so it is refused for every message, path-like or not. Free with
// protobuf_c_message_free_unpacked.
ProtobufCMessage *ddld_request_decode(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *d,
                                      char *err, size_t errlen);

// ---- tensors, batches and inputs against the model -------------------------------------

// Checks a Batch against the model completely (dtype, shape, byte counts with overflow
// checks; the targets: class labels in range, dense values finite). exact: the sample count must
// equal the batch size. On failure writes a message ("x: expected shape [64,1,28,28], got
// [3,1,28,28]") and returns the gRPC code. Not collective; any thread (mi borrowed).
grpc_status_code ddld_batch_check(const ddld_model_info *mi, const Distdl__V1__Batch *b, bool exact,
                                  int64_t *count, char *err, size_t errlen);
// The same for an input tensor alone (Predict, ModelInfer): [n, sample...] of the model
// dtype or UINT8; *count receives n.
grpc_status_code ddld_input_check(const ddld_model_info *mi, const char *what, const char *datatype,
                                  const int64_t *shape, size_t ndim, size_t raw_len, int64_t *count,
                                  char *err, size_t errlen);

// Refuses NaN and +-Inf in a validated input of n samples (raw: the model dtype or UINT8)
// with the first bad element's index. Allocates nothing.
grpc_status_code ddld_finite_check(const ddld_model_info *mi, const char *what, const char *datatype,
                                   const uint8_t *raw, int64_t n, char *err, size_t errlen);

// Wire datatype strings.
const char *ddld_dtype_wire(ddl_dtype dt);

// ---- PushWeights chunks ---------------------------------------------------------------

// A WeightChunk read in place: the small fields are parsed straight from gRPC's slices
// and the data is copied once, from those slices into the staging buffer (unpacking with
// protobuf-c would first gather the message into one buffer, then copy the data again).

struct wcursor {
    const grpc_slice *s;
    size_t            n, i, pos; // slice index, position in it
    size_t            off;       // bytes consumed
};

struct wchunk {
    char           name[256], datatype[16];
    bool           name_long, datatype_long, shape_long, first;
    int64_t        shape[DDL_MAX_DIMS];
    size_t         nshape;
    int64_t        offset;
    struct wcursor data; // where the data bytes start
    size_t         data_len;
};

// Copies len bytes at the cursor into dst (NULL: skips them). False: the message ends first.
bool ddld_wc_take(struct wcursor *c, uint8_t *dst, size_t len);
// Parses a WeightChunk from its wire bytes spread over n slices. False: malformed.
bool ddld_wchunk_parse(const grpc_slice *s, size_t n, struct wchunk *w);
// Checks a parsed chunk against the weight table mi and the stream so far: got[i] bytes of
// weight i received, *cur the weight being received (-1: none yet); on success *cur is the
// weight this chunk's data belongs to (at offset got[*cur], ch->data_len bytes, within
// it). On failure writes the message and returns the gRPC code.
grpc_status_code ddld_wchunk_check(const ddld_model_info *mi, const size_t *got, int *cur,
                                   const struct wchunk *ch, char *err, size_t errlen);

// ModelInfer: the one input of q as raw little-endian bytes of its declared datatype, checked
// against the model (outputs, input count, contents, ddld_input_check). Typed contents are
// repacked into *typed (ddl_malloc; the caller ddl_frees it, also NULL), *raw points at the bytes
// to use and *count receives n. On failure writes the message ("ModelInfer: ...") and returns
// the gRPC code; nothing is left allocated.
grpc_status_code ddld_infer_input(const ddld_model_info *mi, const Inference__ModelInferRequest *q,
                                  const uint8_t **raw, void **typed, int64_t *count, char *err,
                                  size_t errlen);

// True when the request asks for typed outputs: an output "logits" with parameter
// binary_data = false (validated by ddld_infer_input). Otherwise the logits come as
// raw_output_contents, as Triton sends them.
bool ddld_infer_typed_output(const Inference__ModelInferRequest *q);

// The served model has one version, "1" (ModelMetadata lists it): true for it and for ""
// (the request names none).
bool ddld_version_served(const char *version);

// A dataset name relative to the data root root_real (itself already resolved): no absolute
// paths, nothing that climbs out of the root, lexically or through symbolic links. abs
// (PATH_MAX) receives the resolved path. NOT_FOUND when it does not exist.
grpc_status_code ddld_resolve_dataset(const char *root_real, const char *rel, char *abs, char *err,
                                      size_t errlen);
// A path that must stay inside the directory root (as configured; it need not exist yet):
// relative to it, or absolute; either way it must resolve (symbolic links followed, a
// missing tail taken as written) to root or below it. The same rule as datasets, for
// paths that may not exist yet (a checkpoint being written). abs (PATH_MAX) receives the
// resolved path. INVALID_ARGUMENT names the path, what it is ("dir"), the rule ("is
// confined to --checkpoint-dir") and the root.
grpc_status_code ddld_resolve_confined(const char *root, const char *path, const char *what,
                                       const char *rule, char *abs, char *err, size_t errlen);

#endif // DDLD_REQUESTS_H
