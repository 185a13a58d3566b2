// server/requests.c: the pure half of the request path (see requests.h): decoding,
// PushWeights chunk parsing and the request validators. Moved here unchanged from
// service.c and dispatch.c so that the daemon and the fuzz targets run the same code.
#include <errno.h>
#include <grpc/byte_buffer_reader.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ddl/base.h"
#include "ddl/format.h"
#include "requests.h"

// ---- decoding ------------------------------------------------------------------------------

// Reads a varint at *p (< end). False: truncated or longer than 10 bytes.
static bool wire_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    *v = 0;
    for (int shift = 0; shift < 70 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        *v |= (uint64_t)(b & 0x7f) << shift;
        if ((b & 0x80) == 0) {
            return true;
        }
    }
    return false;
}

// Walks the wire bytes of a message that protobuf-c accepted and refuses a string field
// (at any depth) holding a NUL byte: protobuf-c hands strings over NUL-terminated, so
// "a\0b" would silently become "a" (a checkpoint dir, a dataset name). The field's dotted
// name goes into err.
static bool strings_have_no_nul(const uint8_t *p, const uint8_t *end,
                                const ProtobufCMessageDescriptor *d, const char *prefix, char *err,
                                size_t errlen)
{
    while (p < end) {
        uint64_t key, len;
        if (!wire_varint(&p, end, &key)) {
            return true; // not ours to judge: protobuf-c decoded it
        }
        switch (key & 7) {
        case 0:
            if (!wire_varint(&p, end, &len)) {
                return true;
            }
            continue;
        case 1:
            p += 8;
            continue;
        case 5:
            p += 4;
            continue;
        case 2:
            break;
        default:
            return true;
        }
        if (!wire_varint(&p, end, &len) || len > (uint64_t)(end - p)) {
            return true;
        }
        const ProtobufCFieldDescriptor *f =
            protobuf_c_message_descriptor_get_field(d, (unsigned)(key >> 3));
        if (f != NULL && f->type == PROTOBUF_C_TYPE_STRING) {
            const uint8_t *nul = memchr(p, 0, (size_t)len);
            if (nul != NULL) {
                snprintf(err, errlen,
                         "%s%s: a string holding a NUL byte (at byte %td of %llu) is not "
                         "accepted",
                         prefix, f->name, nul - p, (unsigned long long)len);
                return false;
            }
        } else if (f != NULL && f->type == PROTOBUF_C_TYPE_MESSAGE) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s%s.", prefix, f->name);
            if (!strings_have_no_nul(p, p + len, f->descriptor, sub, err, errlen)) {
                return false;
            }
        }
        p += len;
    }
    return true;
}

static ProtobufCMessage *unpack_checked(const ProtobufCMessageDescriptor *d, grpc_slice s,
                                        char *err, size_t errlen)
{
    const uint8_t    *b = GRPC_SLICE_START_PTR(s);
    size_t            n = GRPC_SLICE_LENGTH(s);

    ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, n, b);
    if (m != NULL && !strings_have_no_nul(b, b + n, d, "", err, errlen)) {
        protobuf_c_message_free_unpacked(m, NULL);
        return NULL;
    }
    return m;
}

ProtobufCMessage *ddld_request_decode(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *d,
                                      char *err, size_t errlen)
{
    ProtobufCMessage *m;
    err[0] = '\0';
    if (bb->type == GRPC_BB_RAW && bb->data.raw.compression == GRPC_COMPRESS_NONE &&
        bb->data.raw.slice_buffer.count == 1) {
        m = unpack_checked(d, bb->data.raw.slice_buffer.slices[0], err, errlen);
    } else {
        grpc_byte_buffer_reader r;
        if (!grpc_byte_buffer_reader_init(&r, bb)) {
            return NULL;
        }
        grpc_slice s = grpc_byte_buffer_reader_readall(&r);
        grpc_byte_buffer_reader_destroy(&r);
        m = unpack_checked(d, s, err, errlen);
        grpc_slice_unref(s);
    }
    return m;
}

// ---- PushWeights chunks ----------------------------------------------------------------------

// The chunk is decoded by src/format/wire.c (ddl/format.h), the client's PullWeights too,
// through this view of gRPC's slices: its cursor's slice index and position are those of
// struct wcursor.
static const uint8_t *grpc_seg(const void *segs, size_t i, size_t *len)
{
    const grpc_slice *s = segs;
    *len                = GRPC_SLICE_LENGTH(s[i]);
    return GRPC_SLICE_START_PTR(s[i]);
}

// Copies len bytes into dst, or skips them when dst is NULL.
bool ddld_wc_take(struct wcursor *c, uint8_t *dst, size_t len)
{
    ddl_fmt_cursor k = {
        .seg = grpc_seg, .segs = c->s, .n = c->n, .i = c->i, .pos = c->pos, .off = c->off};
    bool ok = ddl_fmt_cursor_take(&k, dst, len);
    c->i    = k.i;
    c->pos  = k.pos;
    c->off  = k.off;
    return ok;
}

// Parses a WeightChunk (distdl.v1, trainer.proto) from its wire bytes. False: malformed.
bool ddld_wchunk_parse(const grpc_slice *s, size_t n, struct wchunk *w)
{
    _Static_assert(sizeof w->shape == sizeof(ddl_fmt_wchunk){0}.shape &&
                       sizeof w->datatype == sizeof(ddl_fmt_wchunk){0}.datatype,
                   "struct wchunk and ddl_fmt_wchunk hold the same shape and datatype");
    ddl_fmt_wchunk fw;
    memset(w, 0, sizeof *w);
    if (ddl_fmt_wchunk_decode(grpc_seg, s, n, &fw) != DDL_OK) {
        return false;
    }
    // Names are at most 255 bytes here: a longer one is an unknown tensor (ddld_wchunk_check).
    w->name_long = fw.name_long || strlen(fw.name) >= sizeof w->name;
    if (!w->name_long) {
        memcpy(w->name, fw.name, strlen(fw.name) + 1);
    }
    memcpy(w->datatype, fw.datatype, sizeof w->datatype);
    w->datatype_long = fw.datatype_long;
    w->shape_long    = fw.shape_long;
    w->first         = fw.first;
    w->nshape        = fw.nshape;
    memcpy(w->shape, fw.shape, sizeof w->shape);
    w->offset = fw.offset;
    w->data =
        (struct wcursor){.s = s, .n = n, .i = fw.data.i, .pos = fw.data.pos, .off = fw.data.off};
    w->data_len = fw.data_len;
    return true;
}

// Checks one chunk of a PushWeights stream (see requests.h). Any thread.
grpc_status_code ddld_wchunk_check(const ddld_model_info *mi, const size_t *received, int *cur,
                                   const struct wchunk *ch, char *err, size_t errlen)
{
    if (ch->first) {
        int i = 0;
        while (!ch->name_long && i < mi->nweights && strcmp(mi->weights[i].name, ch->name) != 0) {
            i++;
        }
        if (ch->name_long || i == mi->nweights) {
            if (ch->name_long) {
                snprintf(err, errlen, "PushWeights: unknown tensor (name over %zu bytes)",
                         sizeof ch->name - 1);
            } else {
                snprintf(err, errlen, "PushWeights: unknown tensor \"%.200s\"", ch->name);
            }
            return GRPC_STATUS_INVALID_ARGUMENT;
        }
        const ddld_weight_info *w = &mi->weights[i];
        if (received[i] != 0 || (*cur == i)) {
            snprintf(err, errlen, "PushWeights: tensor \"%s\" sent twice", w->name);
            return GRPC_STATUS_INVALID_ARGUMENT;
        }
        if (ch->datatype_long || strcmp(ch->datatype, ddld_dtype_wire(w->dtype)) != 0) {
            snprintf(err, errlen, "PushWeights: \"%s\": expected datatype %s, got \"%s%s\"",
                     w->name, ddld_dtype_wire(w->dtype), ch->datatype,
                     ch->datatype_long ? "..." : "");
            return GRPC_STATUS_INVALID_ARGUMENT;
        }
        bool same = !ch->shape_long && ch->nshape == (size_t)w->shape.ndim;
        for (size_t d = 0; same && d < ch->nshape; d++) {
            same = ch->shape[d] == w->shape.d[d];
        }
        if (!same) {
            char exp[160], got[200];
            ddl_shape_str(&w->shape, exp, sizeof exp);
            size_t o = 0;
            got[o++] = '[';
            for (size_t d = 0; d < ch->nshape && o < 160; d++) {
                o += (size_t)snprintf(got + o, sizeof got - o, d ? ", %lld" : "%lld",
                                      (long long)ch->shape[d]);
            }
            snprintf(got + o, sizeof got - o, "%s]", ch->shape_long ? ", ..." : "");
            snprintf(err, errlen, "PushWeights: \"%s\": expected shape %s, got %s", w->name,
                     exp, got);
            return GRPC_STATUS_INVALID_ARGUMENT;
        }
        *cur = i;
    } else if (*cur < 0) {
        snprintf(err, errlen,
                 "PushWeights: the first chunk must have first=true with name, datatype, shape");
        return GRPC_STATUS_INVALID_ARGUMENT;
    }
    const ddld_weight_info *w   = &mi->weights[*cur];
    size_t                  got = received[*cur];
    if (ch->offset < 0 || (uint64_t)ch->offset != got) {
        snprintf(err, errlen, "PushWeights: \"%s\": expected offset %zu, got %lld", w->name,
                 got, (long long)ch->offset);
        return GRPC_STATUS_INVALID_ARGUMENT;
    }
    if (ch->data_len > w->bytes - got) {
        snprintf(err, errlen,
                 "PushWeights: \"%s\": %zu bytes at offset %zu exceed its %zu bytes", w->name,
                 ch->data_len, got, w->bytes);
        return GRPC_STATUS_INVALID_ARGUMENT;
    }
    return GRPC_STATUS_OK;
}

// ---- tensors and batches ---------------------------------------------------------------------

const char *ddld_dtype_wire(ddl_dtype dt)
{
    return dt == DDL_F64 ? "FP64" : "FP32";
}

grpc_status_code ddld_input_check(const ddld_model_info *mi, const char *what, const char *datatype,
                                  const int64_t *shape, size_t ndim, size_t raw_len, int64_t *count,
                                  char *err, size_t errlen)
{
    const char *want = ddld_dtype_wire(mi->dtype);
    size_t      item;
    if (strcmp(datatype, want) == 0) {
        item = ddl_dtype_size(mi->dtype);
    } else if (strcmp(datatype, "UINT8") == 0) {
        item = 1;
    } else {
        snprintf(err, errlen, "%s: expected datatype %s or UINT8, got \"%.32s\"", what, want,
                 datatype);
        return GRPC_STATUS_INVALID_ARGUMENT;
    }
    int64_t exp[DDL_MAX_DIMS + 1];
    exp[0] = ndim > 0 ? shape[0] : 0;
    for (int k = 0; k < mi->input.ndim; k++) {
        exp[k + 1] = mi->input.d[k];
    }
    bool ok = ndim == (size_t)mi->input.ndim + 1 && shape[0] >= 1;
    for (size_t k = 1; ok && k < ndim; k++) {
        ok = shape[k] == exp[k];
    }
    if (!ok) {
        char e[200], g[200];
        ddl_shape_text(exp, (size_t)mi->input.ndim + 1, e, sizeof e);
        ddl_shape_text(shape, ndim < 16 ? ndim : 16, g, sizeof g);
        snprintf(err, errlen, "%s: expected shape %s with n >= 1, got %s", what, e, g);
        return GRPC_STATUS_INVALID_ARGUMENT;
    }
    // numel = n * sample, checked against the element cap before multiplying bytes.
    if (shape[0] > DDLD_MAX_ELEMENTS / (mi->sample_numel > 0 ? mi->sample_numel : 1)) {
        snprintf(err, errlen, "%s: %lld samples exceed the tensor size limit", what,
                 (long long)shape[0]);
        return GRPC_STATUS_INVALID_ARGUMENT;
    }
    uint64_t bytes = (uint64_t)shape[0] * (uint64_t)mi->sample_numel * item;
    if (bytes != raw_len) {
        snprintf(err, errlen, "%s: expected %llu bytes (%lld x %lld x %zu-byte %s), got %zu", what,
                 (unsigned long long)bytes, (long long)shape[0], (long long)mi->sample_numel, item,
                 datatype, raw_len);
        return GRPC_STATUS_INVALID_ARGUMENT;
    }
    *count = shape[0];
    return GRPC_STATUS_OK;
}

// The first non-finite value of numel values of `item` bytes (4 or 8), as an error naming
// its element, sample and offset (`per` values a sample).
static grpc_status_code values_finite(const char *what, const uint8_t *raw, int64_t numel,
                                      size_t item, int64_t per, char *err, size_t errlen)
{
    int64_t bad = ddl_first_nonfinite(raw, numel, item);
    if (bad < 0) {
        return GRPC_STATUS_OK;
    }
    double v = ddl_value_at(raw, bad, item);
    snprintf(err, errlen,
             "%s: expected finite values, got %s at element %lld (sample %lld, offset %lld)", what,
             isnan(v) ? "NaN"
             : v > 0  ? "+Inf"
                      : "-Inf",
             (long long)bad, (long long)(bad / per), (long long)(bad % per));
    return GRPC_STATUS_INVALID_ARGUMENT;
}

grpc_status_code ddld_finite_check(const ddld_model_info *mi, const char *what,
                                   const char *datatype, const uint8_t *raw, int64_t n, char *err,
                                   size_t errlen)
{
    if (strcmp(datatype, "UINT8") == 0) {
        return GRPC_STATUS_OK; // pixels are always finite
    }
    return values_finite(what, raw, n * mi->sample_numel, ddl_dtype_size(mi->dtype),
                         mi->sample_numel, err, errlen);
}

// The targets of a batch of n samples, in exactly one of batch.targets and batch.labels
// (the older name, class labels only): INT64 class indices [n, target...] in [0, classes)
// for a classifier or a segmentation model, or FP32/FP64 values [n, output...], finite,
// for a loss on dense targets. Their ranges per loss ([0, 1] for bce, >= 0 for
// poisson_nll) are the engine's to check, on rank 0 before any data moves.
static grpc_status_code targets_check(const ddld_model_info *mi, const Distdl__V1__Batch *b,
                                      int64_t n, char *err, size_t errlen)
{
    const Distdl__V1__Tensor *t    = b->targets != NULL ? b->targets : b->labels;
    const char               *what = b->targets != NULL ? "batch.targets" : "batch.labels";
    if (b->targets != NULL && b->labels != NULL) {
        snprintf(err, errlen, "batch: give exactly one of targets and labels, got both");
        return GRPC_STATUS_INVALID_ARGUMENT;
    }
    if (t == NULL) {
        snprintf(err, errlen, "batch: both x and targets (or labels) are required");
        return GRPC_STATUS_INVALID_ARGUMENT;
    }
    int64_t exp[DDL_MAX_DIMS + 1], per = 1;
    exp[0] = n;
    for (int k = 0; k < mi->target.ndim; k++) {
        exp[k + 1] = mi->target.d[k];
        per *= mi->target.d[k];
    }
    size_t nd = (size_t)mi->target.ndim + 1;
    char   e[200], g[200];
    ddl_shape_text(exp, nd, e, sizeof e);
    ddl_shape_text(t->shape, t->n_shape < 16 ? t->n_shape : 16, g, sizeof g);
    if (mi->dense && b->labels != NULL) {
        snprintf(err, errlen,
                 "batch.labels: the loss %s trains on dense targets %s, not class labels; send "
                 "them as batch.targets (FP32 or FP64)",
                 mi->loss, e);
        return GRPC_STATUS_INVALID_ARGUMENT;
    }
    size_t item;
    if (!mi->dense && strcmp(t->datatype, "INT64") == 0) {
        item = 8;
    } else if (mi->dense && strcmp(t->datatype, "FP32") == 0) {
        item = 4;
    } else if (mi->dense && strcmp(t->datatype, "FP64") == 0) {
        item = 8;
    } else {
        snprintf(err, errlen, "%s: expected datatype %s (the loss %s), got \"%.32s\"", what,
                 mi->dense ? "FP32 or FP64" : "INT64", mi->loss, t->datatype);
        return GRPC_STATUS_INVALID_ARGUMENT;
    }
    bool ok = t->n_shape == nd;
    for (size_t k = 0; ok && k < nd; k++) {
        ok = t->shape[k] == exp[k];
    }
    if (!ok) {
        snprintf(err, errlen, "%s: expected shape %s, got %s", what, e, g);
        return GRPC_STATUS_INVALID_ARGUMENT;
    }
    // n and per are bounded by the validated input and the model: no overflow.
    if ((uint64_t)t->raw.len != (uint64_t)n * (uint64_t)per * item) {
        snprintf(err, errlen, "%s: expected %llu bytes (%lld x %lld x %zu-byte %s), got %zu", what,
                 (unsigned long long)((uint64_t)n * (uint64_t)per * item), (long long)n,
                 (long long)per, item, t->datatype, t->raw.len);
        return GRPC_STATUS_INVALID_ARGUMENT;
    }
    if (mi->dense) {
        return values_finite(what, t->raw.data, n * per, item, per, err, errlen);
    }
    for (int64_t i = 0; i < n * per; i++) {
        int64_t v;
        memcpy(&v, t->raw.data + i * 8, 8);
        if (v < 0 || v >= mi->classes) {
            if (per > 1) {
                snprintf(err, errlen,
                         "%s[%lld]: expected a class in [0, %d), got %lld (sample %lld, voxel "
                         "%lld)",
                         what, (long long)i, mi->classes, (long long)v, (long long)(i / per),
                         (long long)(i % per));
            } else {
                snprintf(err, errlen, "%s[%lld]: expected a class in [0, %d), got %lld", what,
                         (long long)i, mi->classes, (long long)v);
            }
            return GRPC_STATUS_INVALID_ARGUMENT;
        }
    }
    return GRPC_STATUS_OK;
}

grpc_status_code ddld_batch_check(const ddld_model_info *mi, const Distdl__V1__Batch *b, bool exact,
                                  int64_t *count, char *err, size_t errlen)
{
    if (b->x == NULL) {
        snprintf(err, errlen, "batch: both x and targets (or labels) are required");
        return GRPC_STATUS_INVALID_ARGUMENT;
    }
    int64_t          n;
    grpc_status_code code = ddld_input_check(mi, "batch.x", b->x->datatype, b->x->shape,
                                             b->x->n_shape, b->x->raw.len, &n, err, errlen);
    if (code != GRPC_STATUS_OK) {
        return code;
    }
    if (exact && n != mi->batch_size) {
        snprintf(err, errlen, "batch.x: expected %lld samples (the spec's batch_size), got %lld",
                 (long long)mi->batch_size, (long long)n);
        return GRPC_STATUS_INVALID_ARGUMENT;
    }
    code = targets_check(mi, b, n, err, errlen);
    if (code != GRPC_STATUS_OK) {
        return code;
    }
    code = ddld_finite_check(mi, "batch.x", b->x->datatype, b->x->raw.data, n, err, errlen);
    if (code != GRPC_STATUS_OK) {
        return code;
    }
    *count = n;
    return GRPC_STATUS_OK;
}

// ---- datasets -------------------------------------------------------------------------------

// Does the relative path climb above its start, lexically ("a/../..")?
static bool climbs_out(const char *rel)
{
    int depth = 0;
    for (const char *p = rel; *p != '\0';) {
        const char *e = strchr(p, '/');
        size_t      n = e != NULL ? (size_t)(e - p) : strlen(p);
        if (n == 2 && p[0] == '.' && p[1] == '.') {
            depth--;
        } else if (n > 0 && !(n == 1 && p[0] == '.')) {
            depth++;
        }
        if (depth < 0) {
            return true;
        }
        p += n + (e != NULL);
    }
    return false;
}

// Is the resolved path abs root_real itself or below it?
static bool inside(const char *root_real, const char *abs)
{
    size_t rn = strlen(root_real);
    return strncmp(abs, root_real, rn) == 0 &&
           (abs[rn] == '\0' || abs[rn] == '/' || (rn == 1 && root_real[0] == '/'));
}

// A dataset name relative to --data-root: no absolute paths, nothing that climbs out of
// the root (lexically, and after resolving symbolic links). Any thread.
grpc_status_code ddld_resolve_dataset(const char *root_real, const char *rel, char *abs, char *err,
                                      size_t errlen)
{
    if (rel[0] == '/') {
        snprintf(err, errlen, "dataset \"%.200s\": expected a path relative to --data-root", rel);
        return GRPC_STATUS_INVALID_ARGUMENT;
    }
    if (climbs_out(rel)) {
        snprintf(err, errlen, "dataset \"%.200s\" leaves the data root", rel);
        return GRPC_STATUS_INVALID_ARGUMENT;
    }
    char joined[PATH_MAX * 2];
    snprintf(joined, sizeof joined, "%s/%s", root_real, rel);
    if (realpath(joined, abs) == NULL) {
        snprintf(err, errlen, "dataset \"%.200s\": %s under %s", rel, strerror(errno), root_real);
        return errno == ENOENT ? GRPC_STATUS_NOT_FOUND : GRPC_STATUS_INVALID_ARGUMENT;
    }
    if (!inside(root_real, abs)) {
        snprintf(err, errlen, "dataset \"%.200s\" leaves the data root", rel);
        return GRPC_STATUS_INVALID_ARGUMENT;
    }
    return GRPC_STATUS_OK;
}

// Resolves path (absolute, or relative to the resolved directory base) component by
// component with realpath, so every symbolic link on the way is followed; the components
// from the first one that does not exist on are appended as they are ("." skipped, ".."
// dropping the last missing one). A dangling symbolic link is refused: writing through it
// would create its target, wherever that is. out (PATH_MAX) receives the result.
static bool resolve_walk(const char *base, const char *path, char *out, char *err, size_t errlen)
{
    char   cur[PATH_MAX], res[PATH_MAX];
    int    missing = 0; // trailing components of cur that do not exist
    size_t len     = strlen(path[0] == '/' ? "/" : base);
    if (len >= sizeof cur) {
        snprintf(err, errlen, "%s", strerror(ENAMETOOLONG));
        return false;
    }
    memcpy(cur, path[0] == '/' ? "/" : base, len + 1);
    for (const char *p = path; *p != '\0';) {
        const char *e = strchr(p, '/');
        size_t      n = e != NULL ? (size_t)(e - p) : strlen(p);
        const char *c = p;
        p += n + (e != NULL);
        if (n == 0 || (n == 1 && c[0] == '.')) {
            continue;
        }
        if (n == 2 && c[0] == '.' && c[1] == '.' && missing > 0) {
            *strrchr(cur, '/') = '\0';
            len                = strlen(cur);
            missing--;
            continue;
        }
        // cur + "/" + the component, in place
        if (len + 1 + n >= sizeof cur) {
            snprintf(err, errlen, "%s", strerror(ENAMETOOLONG));
            return false;
        }
        if (strcmp(cur, "/") != 0) {
            cur[len++] = '/';
        }
        memcpy(cur + len, c, n);
        len += n;
        cur[len] = '\0';
        if (missing > 0) {
            missing++;
            continue;
        }
        struct stat sb;
        if (realpath(cur, res) != NULL) {
            len = strlen(res);
            memcpy(cur, res, len + 1);
        } else if (errno == ENOENT && lstat(cur, &sb) != 0) {
            missing = 1;
        } else {
            int e2 = errno;
            snprintf(err, errlen, "%.300s: %s", cur,
                     e2 == ENOENT ? "a symbolic link to nothing" : strerror(e2));
            return false;
        }
    }
    memcpy(out, cur, len + 1);
    return true;
}

grpc_status_code ddld_resolve_confined(const char *root, const char *path, const char *what,
                                       const char *rule, char *abs, char *err, size_t errlen)
{
    char cwd[PATH_MAX], root_real[PATH_MAX], why[512];
    if (getcwd(cwd, sizeof cwd) == NULL) {
        snprintf(cwd, sizeof cwd, "/");
    }
    if (!resolve_walk(cwd, root, root_real, why, sizeof why)) {
        snprintf(err, errlen, "%s \"%.200s\": %s %.200s: %.300s", what, path, rule, root, why);
        return GRPC_STATUS_FAILED_PRECONDITION;
    }
    if (path[0] != '/' && climbs_out(path)) {
        snprintf(err, errlen, "%s \"%.200s\" leaves %s %.200s", what, path, rule, root_real);
        return GRPC_STATUS_INVALID_ARGUMENT;
    }
    if (!resolve_walk(root_real, path, abs, why, sizeof why)) {
        snprintf(err, errlen, "%s \"%.200s\": %.300s", what, path, why);
        return GRPC_STATUS_INVALID_ARGUMENT;
    }
    if (!inside(root_real, abs)) {
        snprintf(err, errlen, "%s \"%.200s\" (%.200s) leaves %s %.200s", what, path, abs, rule,
                 root_real);
        return GRPC_STATUS_INVALID_ARGUMENT;
    }
    return GRPC_STATUS_OK;
}

// ---- ModelInfer ------------------------------------------------------------------------------

// ModelInfer's input (see requests.h). Any thread.
grpc_status_code ddld_infer_input(const ddld_model_info *mi, const Inference__ModelInferRequest *q,
                                  const uint8_t **raw_out, void **typed_out, int64_t *count,
                                  char *err, size_t errlen)
{
    *raw_out   = NULL;
    *typed_out = NULL;
    for (size_t i = 0; i < q->n_outputs; i++) {
        if (strcmp(q->outputs[i]->name, "logits") != 0) {
            snprintf(err, errlen,
                     "ModelInfer: unknown output \"%.64s\" (the model's output is \"logits\")",
                     q->outputs[i]->name);
            return GRPC_STATUS_INVALID_ARGUMENT;
        }
        for (size_t k = 0; k < q->outputs[i]->n_parameters; k++) {
            const Inference__ModelInferRequest__InferRequestedOutputTensor__ParametersEntry *e =
                q->outputs[i]->parameters[k];
            if (strcmp(e->key, "binary_data") == 0 &&
                (e->value == NULL || e->value->parameter_choice_case !=
                                         INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM)) {
                snprintf(err, errlen,
                         "ModelInfer: output \"logits\": parameter binary_data must be a bool");
                return GRPC_STATUS_INVALID_ARGUMENT;
            }
        }
    }
    if (q->n_inputs != 1) {
        snprintf(err, errlen, "ModelInfer: expected 1 input, got %zu", q->n_inputs);
        return GRPC_STATUS_INVALID_ARGUMENT;
    }
    const Inference__ModelInferRequest__InferInputTensor *in      = q->inputs[0];
    const uint8_t                                        *raw     = NULL;
    size_t                                                raw_len = 0;
    void                                                 *typed   = NULL;
    if (q->n_raw_input_contents > 0) {
        if (q->n_raw_input_contents != 1 || in->contents != NULL) {
            snprintf(err, errlen,
                     "ModelInfer: expected one raw_input_contents entry and no typed contents");
            return GRPC_STATUS_INVALID_ARGUMENT;
        }
        raw     = q->raw_input_contents[0].data;
        raw_len = q->raw_input_contents[0].len;
    } else if (in->contents != NULL) {
        // Typed contents: repack as little-endian raw bytes of the declared datatype.
        // An empty repeated field is a NULL array in protobuf-c: memcpy only what is there
        // (memcpy from NULL, even of 0 bytes, is undefined; found by fuzz_requests).
        const Inference__InferTensorContents *c = in->contents;
        if (strcmp(in->datatype, "FP32") == 0) {
            raw_len = c->n_fp32_contents * 4;
            typed   = ddl_malloc(raw_len + 1);
            if (typed != NULL && raw_len > 0) {
                memcpy(typed, c->fp32_contents, raw_len);
            }
        } else if (strcmp(in->datatype, "FP64") == 0) {
            raw_len = c->n_fp64_contents * 8;
            typed   = ddl_malloc(raw_len + 1);
            if (typed != NULL && raw_len > 0) {
                memcpy(typed, c->fp64_contents, raw_len);
            }
        } else if (strcmp(in->datatype, "UINT8") == 0) {
            raw_len = c->n_uint_contents;
            typed   = ddl_malloc(raw_len + 1);
        }
        if (raw_len > 0 && typed == NULL) {
            snprintf(err, errlen, "ModelInfer: out of memory for %zu input bytes", raw_len);
            return GRPC_STATUS_RESOURCE_EXHAUSTED;
        }
        if (strcmp(in->datatype, "UINT8") == 0) {
            for (size_t i = 0; i < raw_len; i++) {
                if (c->uint_contents[i] > 255) {
                    ddl_free(typed);
                    snprintf(err, errlen, "ModelInfer: uint_contents[%zu] = %u is not a UINT8", i,
                             c->uint_contents[i]);
                    return GRPC_STATUS_INVALID_ARGUMENT;
                }
                ((uint8_t *)typed)[i] = (uint8_t)c->uint_contents[i];
            }
        }
        raw = typed;
    } else {
        snprintf(err, errlen, "ModelInfer: the input has no data");
        return GRPC_STATUS_INVALID_ARGUMENT;
    }
    char             e[768];
    grpc_status_code code = ddld_input_check(mi, in->name, in->datatype, in->shape, in->n_shape,
                                             raw_len, count, e, sizeof e);
    if (code == GRPC_STATUS_OK) {
        code = ddld_finite_check(mi, in->name, in->datatype, raw, *count, e, sizeof e);
    }
    if (code != GRPC_STATUS_OK) {
        ddl_free(typed);
        snprintf(err, errlen, "ModelInfer: %s", e);
        return code;
    }
    *raw_out   = raw;
    *typed_out = typed;
    return GRPC_STATUS_OK;
}

bool ddld_infer_typed_output(const Inference__ModelInferRequest *q)
{
    for (size_t i = 0; i < q->n_outputs; i++) {
        for (size_t k = 0; k < q->outputs[i]->n_parameters; k++) {
            const Inference__ModelInferRequest__InferRequestedOutputTensor__ParametersEntry *e =
                q->outputs[i]->parameters[k];
            if (strcmp(e->key, "binary_data") == 0 && e->value != NULL &&
                e->value->parameter_choice_case ==
                    INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM &&
                !e->value->bool_param) {
                return true;
            }
        }
    }
    return false;
}

bool ddld_version_served(const char *version)
{
    return version[0] == '\0' || strcmp(version, "1") == 0;
}
