// format/safetensors.c: the safetensors header, parsed, validated and written
// (ddl/format.h). The engine's import/export (engine/safetensors.c) and the client's
// ddl_safetensors_read/_write (client/src/safetensors.c) both go through it.
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "alloc.h"
#include "base/check.h"
#include "ddl/format.h"

// Every dtype of the format, so that entries a reader does not load are still validated.
static const struct {
    const char *name;
    int         size;
} st_dtypes[] = {
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

static bool is_object_of_strings(const json_t *v)
{
    const char *k;
    json_t     *x;
    bool        ok = json_is_object(v);
    json_object_foreach((json_t *)v, k, x)
    {
        ok = ok && json_is_string(x);
    }
    return ok;
}

// ---- reading ---------------------------------------------------------------------------

ddl_status ddl_fmt_st_prefix(const char *what, const uint8_t prefix[8], uint64_t file_size,
                             uint64_t *hlen)
{
    DDL_REQUIRE(file_size >= 8, DDL_EPROTO, "safetensors: %s: %llu bytes, too short for a header",
                what, (unsigned long long)file_size);
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) {
        n |= (uint64_t)prefix[i] << (8 * i);
    }
    DDL_REQUIRE(n <= file_size - 8 && n <= DDL_FMT_ST_MAX_HEADER, DDL_EPROTO,
                "safetensors: %s: header length %llu exceeds the file size %llu (or %llu)", what,
                (unsigned long long)n, (unsigned long long)file_size,
                (unsigned long long)DDL_FMT_ST_MAX_HEADER);
    *hlen = n;
    return DDL_OK;
}

// Validates one header entry into e.
static ddl_status st_entry(const char *what, const char *key, json_t *v, uint64_t data_len,
                           ddl_fmt_st_entry *e)
{
    json_t *dtype = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape");
    json_t *offs = json_object_get(v, "data_offsets");
    DDL_REQUIRE(json_is_object(v) && json_is_string(dtype) && json_is_array(shape) &&
                    json_is_array(offs) && json_array_size(offs) == 2,
                DDL_EPROTO,
                "safetensors: %s: entry '%s' needs a string \"dtype\", an array \"shape\" and "
                "\"data_offsets\" [begin, end]",
                what, key);
    int es = st_dtype_size(json_string_value(dtype));
    DDL_REQUIRE(es > 0, DDL_EPROTO, "safetensors: %s: entry '%s' has unknown dtype \"%.16s\"", what,
                key, json_string_value(dtype));
    e->name        = key;
    e->dtype       = json_string_value(dtype);
    e->dtype_size  = es;
    e->ndim        = json_array_size(shape) > INT32_MAX ? INT32_MAX : (int)json_array_size(shape);
    uint64_t bytes = (uint64_t)es;
    for (size_t d = 0; d < json_array_size(shape); d++) {
        json_t *x = json_array_get(shape, d);
        DDL_REQUIRE(json_is_integer(x) && json_integer_value(x) >= 0, DDL_EPROTO,
                    "safetensors: %s: entry '%s': shape[%zu] is not a non-negative integer", what,
                    key, d);
        uint64_t s = (uint64_t)json_integer_value(x);
        DDL_REQUIRE(s == 0 || bytes <= data_len / s, DDL_EPROTO,
                    "safetensors: %s: entry '%s': shape exceeds the data region", what, key);
        bytes *= s;
        if (d < DDL_FMT_MAX_DIMS) {
            e->shape[d] = (int64_t)s;
        }
    }
    json_t *b = json_array_get(offs, 0), *x = json_array_get(offs, 1);
    DDL_REQUIRE(json_is_integer(b) && json_is_integer(x) && json_integer_value(b) >= 0 &&
                    json_integer_value(x) >= json_integer_value(b),
                DDL_EPROTO, "safetensors: %s: entry '%s': data_offsets are not [begin, end]", what,
                key);
    e->begin = (uint64_t)json_integer_value(b);
    e->end   = (uint64_t)json_integer_value(x);
    DDL_REQUIRE(e->end <= data_len, DDL_EPROTO,
                "safetensors: %s: entry '%s': data_offsets [%llu, %llu] exceed the data region "
                "(%llu bytes)",
                what, key, (unsigned long long)e->begin, (unsigned long long)e->end,
                (unsigned long long)data_len);
    DDL_REQUIRE(e->end - e->begin == bytes, DDL_EPROTO,
                "safetensors: %s: entry '%s': %llu data bytes, shape x dtype needs %llu", what, key,
                (unsigned long long)(e->end - e->begin), (unsigned long long)bytes);
    return DDL_OK;
}

static int range_cmp(const void *a, const void *b)
{
    const ddl_fmt_st_entry *x = *(const ddl_fmt_st_entry *const *)a;
    const ddl_fmt_st_entry *y = *(const ddl_fmt_st_entry *const *)b;
    return x->begin < y->begin   ? -1
           : x->begin > y->begin ? 1
                                 : (x->end > y->end) - (x->end < y->end);
}

// The data region is indexed entirely, without holes (the format's rule): bytes no entry
// covers, between entries or after the last one, are refused.
static ddl_status st_coverage(const char *what, const ddl_fmt_st *h)
{
    const ddl_fmt_st_entry **by = fmt_malloc((h->count + 1) * sizeof *by);
    DDL_REQUIRE(by != NULL, DDL_ENOMEM, "safetensors: %s: out of memory", what);
    for (size_t i = 0; i < h->count; i++) {
        by[i] = &h->entries[i];
    }
    qsort(by, h->count, sizeof *by, range_cmp);
    ddl_status st      = DDL_OK;
    uint64_t   covered = 0;
    for (size_t i = 0; i < h->count && st == DDL_OK; i++) {
        if (i > 0 && by[i]->begin < by[i - 1]->end) {
            st = ddl_set_error(DDL_EPROTO, "safetensors: %s: the data of '%s' and '%s' overlap",
                               what, by[i - 1]->name, by[i]->name);
        } else if (by[i]->begin != covered) {
            st = ddl_set_error(DDL_EPROTO,
                               "safetensors: %s: %llu data byte(s) before '%s' belong to no "
                               "tensor",
                               what, (unsigned long long)(by[i]->begin - covered), by[i]->name);
        } else {
            covered = by[i]->end;
        }
    }
    if (st == DDL_OK && covered != h->data_len) {
        st = ddl_set_error(DDL_EPROTO,
                           "safetensors: %s: %llu trailing byte(s) after the data of the last "
                           "tensor (the data region is %llu bytes, the tensors cover %llu)",
                           what, (unsigned long long)(h->data_len - covered),
                           (unsigned long long)h->data_len, (unsigned long long)covered);
    }
    fmt_free(by);
    return st;
}

ddl_status ddl_fmt_st_parse(const char *what, const char *text, size_t hlen, uint64_t file_size,
                            ddl_fmt_st *out)
{
    memset(out, 0, sizeof *out);
    DDL_REQUIRE(file_size >= 8 && hlen <= file_size - 8, DDL_EINVAL,
                "safetensors: %s: a header of %zu bytes in a file of %llu", what, hlen,
                (unsigned long long)file_size);
    json_error_t jerr;
    json_t      *h = json_loadb(text, hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!json_is_object(h)) {
        json_decref(h);
        return ddl_set_error(DDL_EPROTO, "safetensors: %s: the header is not a JSON object (%s)",
                             what, h == NULL ? jerr.text : "wrong type");
    }
    out->json_      = h;
    out->data_start = 8 + (uint64_t)hlen;
    out->data_len   = file_size - 8 - hlen;
    out->entries    = fmt_calloc(json_object_size(h) + 1, sizeof *out->entries);
    DDL_REQUIRE(out->entries != NULL, DDL_ENOMEM, "safetensors: %s: out of memory", what);
    const char *key;
    json_t     *v;
    json_object_foreach(h, key, v)
    {
        if (strcmp(key, "__metadata__") == 0) {
            DDL_REQUIRE(is_object_of_strings(v), DDL_EPROTO,
                        "safetensors: %s: __metadata__ is not an object of strings", what);
            continue;
        }
        DDL_CHECK(st_entry(what, key, v, out->data_len, &out->entries[out->count]));
        out->count++;
    }
    return st_coverage(what, out);
}

ddl_status ddl_fmt_st_read_header(const char *what, FILE *f, uint64_t file_size, ddl_fmt_st *out)
{
    uint8_t  le[8] = {0};
    uint64_t hlen  = 0;
    memset(out, 0, sizeof *out);
    DDL_REQUIRE(file_size < 8 || fread(le, 1, 8, f) == 8, DDL_EIO,
                "safetensors: %s: short read of the header", what);
    DDL_CHECK(ddl_fmt_st_prefix(what, le, file_size, &hlen));
    char *text = fmt_malloc((size_t)hlen + 1);
    DDL_REQUIRE(text != NULL, DDL_ENOMEM, "safetensors: out of memory reading %s", what);
    if (fread(text, 1, (size_t)hlen, f) != (size_t)hlen) {
        fmt_free(text);
        return ddl_set_error(DDL_EIO, "safetensors: %s: short read of the header", what);
    }
    ddl_status st = ddl_fmt_st_parse(what, text, (size_t)hlen, file_size, out);
    fmt_free(text);
    return st;
}

const ddl_fmt_st_entry *ddl_fmt_st_find(const ddl_fmt_st *h, const char *name)
{
    for (size_t i = 0; i < h->count; i++) {
        if (strcmp(h->entries[i].name, name) == 0) {
            return &h->entries[i];
        }
    }
    return NULL;
}

void ddl_fmt_free(void *p)
{
    fmt_free(p);
}

void ddl_fmt_st_free(ddl_fmt_st *h)
{
    fmt_free(h->entries);
    json_decref(h->json_);
    memset(h, 0, sizeof *h);
}

// ---- writing ---------------------------------------------------------------------------

ddl_status ddl_fmt_st_header(const char *what, const ddl_fmt_st_tensor *t, size_t n,
                             const char *metadata_json, char **out, size_t *len)
{
    *out       = NULL;
    json_t *h  = json_object();
    bool    ok = h != NULL;
    if (metadata_json != NULL) {
        json_error_t jerr;
        json_t      *meta = json_loads(metadata_json, JSON_REJECT_DUPLICATES, &jerr);
        if (!is_object_of_strings(meta)) {
            json_decref(meta);
            json_decref(h);
            return ddl_set_error(DDL_EINVAL,
                                 "safetensors: metadata_json for %s must be a JSON object of "
                                 "strings",
                                 what);
        }
        ok = ok && json_object_set_new(h, "__metadata__", meta) == 0;
    }
    uint64_t offset = 0;
    for (size_t i = 0; i < n && ok; i++) {
        if (t[i].name == NULL || t[i].dtype == NULL || st_dtype_size(t[i].dtype) == 0 ||
            t[i].ndim < 0 || (t[i].ndim > 0 && t[i].shape == NULL)) {
            json_decref(h);
            return ddl_set_error(DDL_EINVAL, "safetensors: tensor %zu has no name, dtype or shape",
                                 i);
        }
        if (strcmp(t[i].name, "__metadata__") == 0 || json_object_get(h, t[i].name) != NULL) {
            json_decref(h);
            return ddl_set_error(DDL_EINVAL, "safetensors: tensor name '%s' is reserved",
                                 t[i].name);
        }
        json_t *e     = json_object();
        json_t *shape = json_array();
        for (int d = 0; d < t[i].ndim; d++) {
            ok = ok && json_array_append_new(shape, json_integer(t[i].shape[d])) == 0;
        }
        ok = ok && json_object_set_new(e, "dtype", json_string(t[i].dtype)) == 0;
        ok = ok && json_object_set_new(e, "shape", shape) == 0;
        ok = ok && json_object_set_new(e, "data_offsets",
                                       json_pack("[II]", (json_int_t)offset,
                                                 (json_int_t)(offset + t[i].bytes))) == 0;
        if (json_object_set_new(h, t[i].name, e) != 0) {
            json_decref(h);
            return ddl_set_error(DDL_EINVAL,
                                 "safetensors: tensor name '%s' is not valid UTF-8 "
                                 "(or out of memory)",
                                 t[i].name);
        }
        offset += t[i].bytes;
    }
    char *text = ok ? json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(h);
    DDL_REQUIRE(text != NULL, DDL_ENOMEM, "safetensors: out of memory building the header");
    size_t raw = strlen(text), padded = (raw + 7) / 8 * 8;
    *out = fmt_malloc(8 + padded);
    if (*out != NULL) {
        for (int i = 0; i < 8; i++) {
            (*out)[i] = (char)(uint8_t)((uint64_t)padded >> (8 * i));
        }
        memcpy(*out + 8, text, raw);
        memset(*out + 8 + raw, ' ', padded - raw);
        *len = 8 + padded;
    }
    free(text); // json_dumps allocates with malloc
    DDL_REQUIRE(*out != NULL, DDL_ENOMEM, "safetensors: out of memory building the header");
    return DDL_OK;
}
