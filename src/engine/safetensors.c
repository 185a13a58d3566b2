// engine/safetensors.c: export and import of global (unsharded) tensors as one
// safetensors file or a directory of .npy files (ddl/checkpoint.h).
//
// safetensors (https://huggingface.co/docs/safetensors): an 8-byte little-endian header
// length N, N bytes of JSON header, then the data region. The header maps each tensor
// name to {"dtype": "F32"|"F64", "shape": [...], "data_offsets": [begin, end]} (offsets
// relative to the data region) plus an optional "__metadata__" object of strings. We
// write "__metadata__" first, then the tensors in the caller's order, contiguous in the
// data region, and pad the header with spaces so the data starts 8-byte aligned.
//
// Export gathers one tensor at a time onto rank 0 (ddl_gather_boxes) and streams it
// into the file, so rank 0 holds at most one global tensor. Import: rank 0 validates the
// whole header (length against the file size, JSON, every entry's dtype, shape and
// offsets inside the data region, consistent with shape x dtype, not overlapping), then
// reads one tensor at a time and scatters it (ddl_scatter_boxes) into staging tensors;
// the caller's tensors are written only once every tensor has arrived.
//
// .npy directories hold one <dir>/<name>.npy per tensor (names may contain '.', not '/').
//
// Every function is collective over comm and returns the same status on every rank.
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "ddl/base.h"
#include "ddl/checkpoint.h"
#include "ddl/collect.h"
#include "ddl/npy.h"
#include "engine/durable.h"
#include "partition/mpi_check.h"

#define ST_PATH_MAX 4096
#define ST_HEADER_MAX ((uint64_t)100 << 20) // the reference implementation's limit

// ---- shared steps ----------------------------------------------------------------

// Argument checks and the cross-rank consistency check common to all four functions.
static ddl_status check_args(MPI_Comm comm, const char *who, const char *path, int n,
                             const ddl_named_tensor *t)
{
    ddl_status st = path != NULL && path[0] != '\0'
                        ? ddl__check_named(who, n, t)
                        : ddl_set_error(DDL_EINVAL, "%s: NULL or empty path", who);
    DDL_CHECK(ddl_agree(comm, st));
    return ddl__check_same_list(comm, who, n, t, 0);
}

// Rank 0: the boxes of every tensor must tile its global shape (gathering needs it).
static ddl_status check_tiling(MPI_Comm comm, const char *who, int n, const ddl_named_tensor *t)
{
    int size, rank;
    DDL_CHECK_MPI(MPI_Comm_size(comm, &size));
    DDL_CHECK_MPI(MPI_Comm_rank(comm, &rank));
    ddl_box   *table = NULL;
    ddl_status st    = ddl__gather_box_table(comm, n, t, &table);
    char       why[512];
    for (int i = 0; rank == 0 && st == DDL_OK && i < n; i++) {
        if (!ddl__boxes_tile(&t[i].global, size, table + i, (size_t)n, NULL, why, sizeof why)) {
            st = ddl_set_error(DDL_EINVAL, "%s: the boxes of '%s' do not tile its global shape: %s",
                               who, t[i].name, why);
        }
    }
    ddl_free(table);
    return ddl_agree(comm, st);
}

// Allocates this rank's staging tensors (one per requested box). Collective.
static ddl_status stage_create(MPI_Comm comm, int n, const ddl_named_tensor *t,
                               ddl_tensor_t ***stage)
{
    ddl_status st = DDL_OK;
    *stage        = ddl_calloc((size_t)n + 1, sizeof **stage);
    if (*stage == NULL) {
        st = ddl_set_error(DDL_ENOMEM, "import: out of memory");
    }
    for (int i = 0; i < n && st == DDL_OK; i++) {
        st = ddl_tensor_create(t[i].local->dtype, &t[i].local->shape, &(*stage)[i]);
    }
    return ddl_agree(comm, st);
}

static void stage_destroy(int n, ddl_tensor_t **stage)
{
    for (int i = 0; stage != NULL && i < n; i++) {
        ddl_tensor_destroy(&stage[i]);
    }
    ddl_free(stage);
}

// ---- safetensors -----------------------------------------------------------------

typedef struct st_dtype_info {
    const char *name;
    int         size;
} st_dtype_info;

// Every dtype of the format, so that entries we do not import are still validated.
static const st_dtype_info st_dtypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
    {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
    {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8},
};

static int st_dtype_size(const char *name)
{
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++) {
        if (strcmp(st_dtypes[i].name, name) == 0) {
            return st_dtypes[i].size;
        }
    }
    return 0;
}

// The padded JSON header (rank 0). Validates metadata_json (an object of strings).
static ddl_status st_header(const char *path, int n, const ddl_named_tensor *t,
                            const char *metadata_json, char **out, size_t *len)
{
    json_t *h  = json_object();
    bool    ok = h != NULL;
    if (metadata_json != NULL) {
        json_error_t jerr;
        json_t      *meta = json_loads(metadata_json, JSON_REJECT_DUPLICATES, &jerr);
        const char  *key;
        json_t      *v;
        bool         strings = json_is_object(meta);
        json_object_foreach(meta, key, v)
        {
            strings = strings && json_is_string(v);
        }
        if (!strings) {
            json_decref(meta);
            json_decref(h);
            return ddl_set_error(DDL_EINVAL,
                                 "safetensors: metadata_json for %s must be a JSON "
                                 "object of strings",
                                 path);
        }
        ok &= json_object_set_new(h, "__metadata__", meta) == 0;
    }
    uint64_t offset = 0;
    for (int i = 0; i < n && ok; i++) {
        if (strcmp(t[i].name, "__metadata__") == 0 || json_object_get(h, t[i].name) != NULL) {
            json_decref(h);
            return ddl_set_error(DDL_EINVAL, "safetensors: tensor name '%s' is reserved",
                                 t[i].name);
        }
        json_t  *e     = json_object();
        json_t  *shape = json_array();
        uint64_t bytes =
            (uint64_t)ddl_shape_numel(&t[i].global) * ddl_dtype_size(t[i].local->dtype);
        for (int d = 0; d < t[i].global.ndim; d++) {
            ok &= json_array_append_new(shape, json_integer(t[i].global.d[d])) == 0;
        }
        ok &= json_object_set_new(e, "dtype",
                                  json_string(t[i].local->dtype == DDL_F64 ? "F64" : "F32")) == 0;
        ok &= json_object_set_new(e, "shape", shape) == 0;
        ok &= json_object_set_new(
                  e, "data_offsets",
                  json_pack("[II]", (json_int_t)offset, (json_int_t)(offset + bytes))) == 0;
        if (json_object_set_new(h, t[i].name, e) != 0) {
            json_decref(h);
            return ddl_set_error(DDL_EINVAL,
                                 "safetensors: tensor name '%s' is not valid UTF-8 "
                                 "(or out of memory)",
                                 t[i].name);
        }
        offset += bytes;
    }
    char *text = ok ? json_dumps(h, JSON_COMPACT) : NULL;
    json_decref(h);
    DDL_REQUIRE(text != NULL, DDL_ENOMEM, "safetensors: out of memory building the header");
    size_t raw = strlen(text), padded = (raw + 7) / 8 * 8;
    *out = ddl_malloc(padded);
    if (*out != NULL) {
        memcpy(*out, text, raw);
        memset(*out + raw, ' ', padded - raw);
        *len = padded;
    }
    free(text); // json_dumps allocates with malloc
    DDL_REQUIRE(*out != NULL, DDL_ENOMEM, "safetensors: out of memory building the header");
    return DDL_OK;
}

ddl_status ddl_export_safetensors(MPI_Comm comm, const char *path, int n,
                                  const ddl_named_tensor *tensors, const char *metadata_json)
{
    int rank;
    DDL_CHECK_MPI(MPI_Comm_rank(comm, &rank));
    DDL_CHECK(check_args(comm, "safetensors export", path, n, tensors));
    DDL_CHECK(check_tiling(comm, "safetensors export", n, tensors));

    FILE      *f   = NULL;
    char      *hdr = NULL;
    size_t     len = 0;
    ddl_status st  = DDL_OK;
    if (rank == 0) {
        st = st_header(path, n, tensors, metadata_json, &hdr, &len);
        if (st == DDL_OK) {
            st = ddl__durable_open(path, &f);
        }
        if (st == DDL_OK) {
            uint64_t le = (uint64_t)len; // little-endian host (checked in checkpoint.c)
            if (fwrite(&le, 1, 8, f) != 8 || fwrite(hdr, 1, len, f) != len) {
                st = ddl_set_error(ddl__write_errno_status(errno),
                                   "safetensors: cannot write %s: %s", path, strerror(errno));
            }
        }
    }
    ddl_free(hdr);
    st = ddl_agree(comm, st);

    // One tensor at a time: rank 0 holds at most one global tensor.
    for (int i = 0; i < n && st == DDL_OK; i++) {
        ddl_tensor_t *g = NULL;
        if (rank == 0) {
            st = ddl_tensor_create(tensors[i].local->dtype, &tensors[i].global, &g);
        }
        st = ddl_agree(comm, st);
        if (st != DDL_OK) {
            break;
        }
        st = ddl_gather_boxes(comm, 0, tensors[i].local, &tensors[i].box, &tensors[i].global, g);
        size_t bytes = rank == 0 ? ddl_tensor_bytes(g) : 0;
        if (rank == 0 && st == DDL_OK && bytes > 0 && fwrite(g->data, 1, bytes, f) != bytes) {
            st = ddl_set_error(ddl__write_errno_status(errno), "safetensors: cannot write %s: %s",
                               path, strerror(errno));
        }
        ddl_tensor_destroy(&g);
        st = ddl_agree(comm, st);
    }
    if (rank == 0 && f != NULL) {
        if (st == DDL_OK) {
            st = ddl__durable_commit(f, path);
        } else {
            ddl__durable_abort(f, path);
        }
    }
    return ddl_agree(comm, st);
}

typedef struct st_range {
    uint64_t    begin, end;
    const char *name;
} st_range;

static int range_cmp(const void *a, const void *b)
{
    const st_range *x = a, *y = b;
    return x->begin < y->begin   ? -1
           : x->begin > y->begin ? 1
                                 : (x->end > y->end) - (x->end < y->end);
}

// Validates one header entry; fills its range.
static ddl_status st_entry(const char *path, const char *key, const json_t *v, uint64_t data_len,
                           st_range *r)
{
    json_t *dtype = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape");
    json_t *offs = json_object_get(v, "data_offsets");
    DDL_REQUIRE(json_is_object(v) && json_is_string(dtype) && json_is_array(shape) &&
                    json_is_array(offs) && json_array_size(offs) == 2,
                DDL_EPROTO,
                "safetensors: %s: entry '%s' needs a string \"dtype\", an array \"shape\" and "
                "\"data_offsets\" [begin, end]",
                path, key);
    int es = st_dtype_size(json_string_value(dtype));
    DDL_REQUIRE(es > 0, DDL_EPROTO, "safetensors: %s: entry '%s' has unknown dtype \"%.16s\"", path,
                key, json_string_value(dtype));
    uint64_t bytes = (uint64_t)es;
    for (size_t d = 0; d < json_array_size(shape); d++) {
        json_t *x = json_array_get(shape, d);
        DDL_REQUIRE(json_is_integer(x) && json_integer_value(x) >= 0, DDL_EPROTO,
                    "safetensors: %s: entry '%s': shape[%zu] is not a non-negative integer", path,
                    key, d);
        uint64_t e = (uint64_t)json_integer_value(x);
        DDL_REQUIRE(e == 0 || bytes <= data_len / e, DDL_EPROTO,
                    "safetensors: %s: entry '%s': shape exceeds the data region", path, key);
        bytes *= e;
    }
    json_t *b = json_array_get(offs, 0), *e = json_array_get(offs, 1);
    DDL_REQUIRE(json_is_integer(b) && json_is_integer(e) && json_integer_value(b) >= 0 &&
                    json_integer_value(e) >= json_integer_value(b),
                DDL_EPROTO, "safetensors: %s: entry '%s': data_offsets are not [begin, end]", path,
                key);
    r->begin = (uint64_t)json_integer_value(b);
    r->end   = (uint64_t)json_integer_value(e);
    r->name  = key;
    DDL_REQUIRE(r->end <= data_len, DDL_EPROTO,
                "safetensors: %s: entry '%s': data_offsets [%llu, %llu] exceed the data region "
                "(%llu bytes)",
                path, key, (unsigned long long)r->begin, (unsigned long long)r->end,
                (unsigned long long)data_len);
    DDL_REQUIRE(r->end - r->begin == bytes, DDL_EPROTO,
                "safetensors: %s: entry '%s': %llu data bytes, shape x dtype needs %llu", path, key,
                (unsigned long long)(r->end - r->begin), (unsigned long long)bytes);
    return DDL_OK;
}

// Rank 0: parses and validates the header, then checks every request against it.
// begin[i] receives request i's absolute file offset.
static ddl_status st_parse(const char *path, FILE *f, int n, const ddl_named_tensor *t,
                           int64_t *begin)
{
    unsigned char le[8];
    struct stat   sb;
    DDL_REQUIRE(fstat(fileno(f), &sb) == 0, DDL_EIO, "safetensors: cannot stat %s: %s", path,
                strerror(errno));
    uint64_t size = (uint64_t)sb.st_size, hlen;
    DDL_REQUIRE(size >= 8 && fread(le, 1, 8, f) == 8, DDL_EPROTO,
                "safetensors: %s: %llu bytes, too short for a header", path,
                (unsigned long long)size);
    memcpy(&hlen, le, 8);
    DDL_REQUIRE(hlen <= size - 8 && hlen <= ST_HEADER_MAX, DDL_EPROTO,
                "safetensors: %s: header length %llu exceeds the file size %llu (or %llu)", path,
                (unsigned long long)hlen, (unsigned long long)size,
                (unsigned long long)ST_HEADER_MAX);
    char *text = ddl_malloc((size_t)hlen + 1);
    DDL_REQUIRE(text != NULL, DDL_ENOMEM, "safetensors: out of memory reading %s", path);
    if (fread(text, 1, (size_t)hlen, f) != (size_t)hlen) {
        ddl_free(text);
        return ddl_set_error(DDL_EIO, "safetensors: %s: short read of the header", path);
    }
    json_error_t jerr;
    json_t      *h = json_loadb(text, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    ddl_free(text);
    if (!json_is_object(h)) {
        json_decref(h);
        return ddl_set_error(DDL_EPROTO, "safetensors: %s: the header is not a JSON object (%s)",
                             path, h == NULL ? jerr.text : "wrong type");
    }
    uint64_t   data_len = size - 8 - hlen;
    size_t     count    = json_object_size(h);
    st_range  *ranges   = ddl_calloc(count + 1, sizeof *ranges);
    size_t     nr       = 0;
    ddl_status st =
        ranges != NULL ? DDL_OK : ddl_set_error(DDL_ENOMEM, "safetensors: out of memory");
    const char *key;
    json_t     *v;
    json_object_foreach(h, key, v)
    {
        if (st != DDL_OK) {
            break;
        }
        if (strcmp(key, "__metadata__") == 0) {
            const char *mk;
            json_t     *mv;
            bool        ok = json_is_object(v);
            json_object_foreach(v, mk, mv)
            {
                ok = ok && json_is_string(mv);
            }
            if (!ok) {
                st = ddl_set_error(DDL_EPROTO,
                                   "safetensors: %s: __metadata__ is not an object of "
                                   "strings",
                                   path);
            }
            continue;
        }
        st = st_entry(path, key, v, data_len, &ranges[nr++]);
    }
    if (st == DDL_OK) {
        // The data region is indexed entirely, without holes (the format's rule): bytes no
        // entry covers, between entries or after the last one, are refused.
        qsort(ranges, nr, sizeof *ranges, range_cmp);
        uint64_t covered = 0;
        for (size_t i = 0; i < nr && st == DDL_OK; i++) {
            if (i > 0 && ranges[i].begin < ranges[i - 1].end) {
                st = ddl_set_error(DDL_EPROTO, "safetensors: %s: the data of '%s' and '%s' overlap",
                                   path, ranges[i - 1].name, ranges[i].name);
            } else if (ranges[i].begin != covered) {
                st = ddl_set_error(DDL_EPROTO,
                                   "safetensors: %s: %llu data byte(s) before '%s' belong to no "
                                   "tensor",
                                   path, (unsigned long long)(ranges[i].begin - covered),
                                   ranges[i].name);
            } else {
                covered = ranges[i].end;
            }
        }
        if (st == DDL_OK && covered != data_len) {
            st = ddl_set_error(DDL_EPROTO,
                               "safetensors: %s: %llu trailing byte(s) after the data of the last "
                               "tensor (the data region is %llu bytes, the tensors cover %llu)",
                               path, (unsigned long long)(data_len - covered),
                               (unsigned long long)data_len, (unsigned long long)covered);
        }
    }
    for (int i = 0; i < n && st == DDL_OK; i++) {
        char    want[256], have[256];
        json_t *e = json_object_get(h, t[i].name);
        if (e == NULL || strcmp(t[i].name, "__metadata__") == 0) {
            st =
                ddl_set_error(DDL_EINVAL, "safetensors: tensor '%s' is not in %s", t[i].name, path);
            break;
        }
        const char *dt   = json_string_value(json_object_get(e, "dtype"));
        const char *need = t[i].local->dtype == DDL_F64 ? "F64" : "F32";
        if (strcmp(dt, need) != 0) {
            st = ddl_set_error(DDL_EINVAL, "safetensors: tensor '%s' in %s is %s, requested %s",
                               t[i].name, path, dt, need);
            break;
        }
        // The whole stored shape first (the message printed zeros past the first
        // mismatching dimension), then the comparison.
        json_t   *shape = json_object_get(e, "shape");
        ddl_shape s     = {.ndim = (int)json_array_size(shape)};
        for (int d = 0; d < s.ndim && d < DDL_MAX_DIMS; d++) {
            s.d[d] = (int64_t)json_integer_value(json_array_get(shape, (size_t)d));
        }
        bool same = s.ndim == t[i].global.ndim;
        for (int d = 0; same && d < s.ndim; d++) {
            same = s.d[d] == t[i].global.d[d];
        }
        if (!same) {
            snprintf(have, sizeof have, "%d dims", s.ndim);
            if (s.ndim <= DDL_MAX_DIMS) {
                ddl_shape_str(&s, have, sizeof have);
            }
            st = ddl_set_error(DDL_EINVAL,
                               "safetensors: tensor '%s' in %s has shape %s, "
                               "requested %s",
                               t[i].name, path, have,
                               ddl_shape_str(&t[i].global, want, sizeof want));
            break;
        }
        begin[i] = (int64_t)(8 + hlen +
                             (uint64_t)json_integer_value(
                                 json_array_get(json_object_get(e, "data_offsets"), 0)));
    }
    ddl_free(ranges);
    json_decref(h);
    return st;
}

ddl_status ddl__safetensors_parse(const char *path, FILE *f, int n, const ddl_named_tensor *t,
                                  int64_t *begin)
{
    return st_parse(path, f, n, t, begin);
}

ddl_status ddl_import_safetensors(MPI_Comm comm, const char *path, int n,
                                  const ddl_named_tensor *tensors)
{
    int rank;
    DDL_CHECK_MPI(MPI_Comm_rank(comm, &rank));
    DDL_CHECK(check_args(comm, "safetensors import", path, n, tensors));
    ddl_tensor_t **stage = NULL;
    int64_t       *begin = NULL;
    FILE          *f     = NULL;
    ddl_status     st    = stage_create(comm, n, tensors, &stage);
    if (st == DDL_OK && rank == 0) {
        begin = ddl_calloc((size_t)n + 1, sizeof *begin);
        // O_NONBLOCK and regular files only: a FIFO must not block rank 0 in open.
        int         fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
        int         err = errno;
        struct stat sb;
        if (fd >= 0 && (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode))) {
            close(fd);
            fd  = -1;
            err = -1;
        }
        f   = fd >= 0 ? fdopen(fd, "rb") : NULL;
        err = fd >= 0 && f == NULL ? errno : err;
        if (fd >= 0 && f == NULL) {
            close(fd);
        }
        if (begin == NULL) {
            st = ddl_set_error(DDL_ENOMEM, "safetensors: out of memory");
        } else if (err == -1) {
            st = ddl_set_error(DDL_EPROTO, "safetensors: %s is not a regular file", path);
        } else if (f == NULL) {
            st = ddl_set_error(err == ENOENT ? DDL_ENOTFOUND : DDL_EIO,
                               "safetensors: cannot open %s: %s", path, strerror(err));
        } else {
            st = st_parse(path, f, n, tensors, begin);
        }
    }
    st = ddl_agree(comm, st);
    for (int i = 0; i < n && st == DDL_OK; i++) {
        ddl_tensor_t *g = NULL;
        if (rank == 0) {
            st           = ddl_tensor_create(tensors[i].local->dtype, &tensors[i].global, &g);
            size_t bytes = st == DDL_OK ? ddl_tensor_bytes(g) : 0;
            if (st == DDL_OK && bytes > 0 &&
                (fseeko(f, (off_t)begin[i], SEEK_SET) != 0 ||
                 fread(g->data, 1, bytes, f) != bytes)) {
                st = ddl_set_error(DDL_EIO, "safetensors: %s: short read of '%s'", path,
                                   tensors[i].name);
            }
        }
        st = ddl_agree(comm, st);
        if (st == DDL_OK) {
            st = ddl_scatter_boxes(comm, 0, g, &tensors[i].box, &tensors[i].global, stage[i]);
            st = ddl_agree(comm, st);
        }
        ddl_tensor_destroy(&g);
    }
    for (int i = 0; i < n && st == DDL_OK; i++) {
        ddl_tensor_copy(stage[i], tensors[i].local);
    }
    if (f != NULL) {
        fclose(f);
    }
    ddl_free(begin);
    stage_destroy(n, stage);
    return st;
}

// ---- .npy directories --------------------------------------------------------------

// A tensor name must be usable as a file name: "<dir>/<name>.npy".
static ddl_status npy_names(const char *who, int n, const ddl_named_tensor *t)
{
    for (int i = 0; i < n; i++) {
        const char *s = t[i].name;
        DDL_REQUIRE(s != NULL && strchr(s, '/') == NULL && strcmp(s, ".") != 0 &&
                        strcmp(s, "..") != 0 && strlen(s) + 4 <= NAME_MAX,
                    DDL_EINVAL, "%s: tensor name '%s' cannot be a file name", who,
                    s != NULL ? s : "(null)");
    }
    return DDL_OK;
}

static ddl_status npy_check(MPI_Comm comm, const char *who, const char *dir, int n,
                            const ddl_named_tensor *t)
{
    ddl_status st = n >= 0 && (n == 0 || t != NULL) ? npy_names(who, n, t) : DDL_OK;
    DDL_CHECK(ddl_agree(comm, st));
    return check_args(comm, who, dir, n, t);
}

static ddl_status fsync_file(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    DDL_REQUIRE(fd >= 0, DDL_EIO, "npy: cannot open %s: %s", path, strerror(errno));
    int rc  = fsync(fd);
    int err = errno;
    close(fd);
    DDL_REQUIRE(rc == 0, DDL_EIO, "npy: cannot fsync %s: %s", path, strerror(err));
    return DDL_OK;
}

ddl_status ddl_export_npy_dir(MPI_Comm comm, const char *dir, int n,
                              const ddl_named_tensor *tensors)
{
    int rank;
    DDL_CHECK_MPI(MPI_Comm_rank(comm, &rank));
    DDL_CHECK(npy_check(comm, "npy export", dir, n, tensors));
    DDL_CHECK(check_tiling(comm, "npy export", n, tensors));
    ddl_status st = rank == 0 ? ddl__mkdir_p(dir) : DDL_OK;
    st            = ddl_agree(comm, st);
    for (int i = 0; i < n && st == DDL_OK; i++) {
        ddl_tensor_t *g = NULL;
        char          path[ST_PATH_MAX];
        if (rank == 0) {
            st = ddl__path_fmt(path, sizeof path, "%s/%s.npy", dir, tensors[i].name);
            if (st == DDL_OK) {
                st = ddl_tensor_create(tensors[i].local->dtype, &tensors[i].global, &g);
            }
        }
        st = ddl_agree(comm, st);
        if (st != DDL_OK) {
            break;
        }
        st = ddl_gather_boxes(comm, 0, tensors[i].local, &tensors[i].box, &tensors[i].global, g);
        if (rank == 0 && st == DDL_OK) {
            // ddl_npy_write renames its temporary file into place; make the data durable.
            st = ddl_npy_write(path, g);
            if (st == DDL_OK) {
                st = fsync_file(path);
            }
        }
        ddl_tensor_destroy(&g);
        st = ddl_agree(comm, st);
    }
    if (rank == 0 && st == DDL_OK) {
        st = ddl__fsync_dir(dir);
    }
    return ddl_agree(comm, st);
}

ddl_status ddl_import_npy_dir(MPI_Comm comm, const char *dir, int n,
                              const ddl_named_tensor *tensors)
{
    int rank;
    DDL_CHECK_MPI(MPI_Comm_rank(comm, &rank));
    DDL_CHECK(npy_check(comm, "npy import", dir, n, tensors));
    ddl_tensor_t **stage = NULL;
    ddl_status     st    = stage_create(comm, n, tensors, &stage);
    for (int i = 0; i < n && st == DDL_OK; i++) {
        ddl_tensor_t *g = NULL;
        if (rank == 0) {
            char                    path[ST_PATH_MAX], a[256], b[256];
            struct stat             sb;
            const ddl_named_tensor *t = &tensors[i];
            st                        = ddl__path_fmt(path, sizeof path, "%s/%s.npy", dir, t->name);
            if (st == DDL_OK && stat(path, &sb) != 0) {
                st = ddl_set_error(DDL_EINVAL, "npy import: tensor '%s' has no file %s: %s",
                                   t->name, path, strerror(errno));
            }
            if (st == DDL_OK) {
                st = ddl_npy_read(path, &g);
            }
            if (st == DDL_OK &&
                (g->dtype != t->local->dtype || !ddl_shape_equal(&g->shape, &t->global))) {
                st = ddl_set_error(
                    DDL_EINVAL, "npy import: %s holds %s %s, tensor '%s' is %s %s", path,
                    ddl_dtype_name(g->dtype), ddl_shape_str(&g->shape, a, sizeof a), t->name,
                    ddl_dtype_name(t->local->dtype), ddl_shape_str(&t->global, b, sizeof b));
            }
        }
        st = ddl_agree(comm, st);
        if (st == DDL_OK) {
            st = ddl_scatter_boxes(comm, 0, g, &tensors[i].box, &tensors[i].global, stage[i]);
            st = ddl_agree(comm, st);
        }
        ddl_tensor_destroy(&g);
    }
    for (int i = 0; i < n && st == DDL_OK; i++) {
        ddl_tensor_copy(stage[i], tensors[i].local);
    }
    stage_destroy(n, stage);
    return st;
}
