// safetensors.c: read and write weight sets as safetensors files (an 8-byte little-endian
// header length, a JSON header {name: {dtype, shape, data_offsets}}, then the raw bytes).
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "client_impl.h"

#define MAX_HEADER_BYTES ((uint64_t)100 << 20)

static const char *st_dtype(ddl_wire_dtype d)
{
    static const char *const n[] = {"F32", "F64", "I64", "U8"};
    return (unsigned)d < 4 ? n[d] : NULL;
}

static int st_dtype_parse(const char *s)
{
    static const char *const n[] = {"F32", "F64", "I64", "U8"};
    for (int i = 0; i < 4; i++)
        if (strcmp(s, n[i]) == 0)
            return i;
    return -1;
}

static int write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t k = write(fd, c, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        c += k;
        n -= (size_t)k;
    }
    return 0;
}

ddl_status ddl_safetensors_write(const char *path, const ddl_client_weights *w)
{
    if (!path || !w)
        return ddl__local_error(DDL_EINVAL, "safetensors: path and weights are required");
    json_t *hdr = json_object();
    size_t  off = 0;
    for (int64_t i = 0; i < w->count; i++) {
        const ddl_client_tensor *t  = &w->tensors[i];
        const char              *dt = st_dtype(t->dtype);
        if (!dt || !t->name) {
            json_decref(hdr);
            return ddl__local_error(DDL_EINVAL, "safetensors: tensor %lld has no name or dtype",
                                    (long long)i);
        }
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++)
            json_array_append_new(shape, json_integer(t->shape[d]));
        json_t *e = json_pack("{s:s, s:o, s:[I, I]}", "dtype", dt, "shape", shape, "data_offsets",
                              (json_int_t)off, (json_int_t)(off + t->bytes));
        json_object_set_new(hdr, t->name, e);
        off += t->bytes;
    }
    char *text = json_dumps(hdr, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(hdr);
    if (!text)
        return ddl__local_error(DDL_ENOMEM, "safetensors: cannot format the header");
    size_t hlen = strlen(text), padded = (hlen + 7) / 8 * 8;

    size_t plen = strlen(path);
    char  *tmp  = malloc(plen + 5);
    if (!tmp) {
        free(text);
        return ddl__local_error(DDL_ENOMEM, "safetensors: out of memory");
    }
    snprintf(tmp, plen + 5, "%s.tmp", path);
    ddl_status st = DDL_OK;
    int        fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        st = ddl__local_error(DDL_EIO, "safetensors: cannot create %s: %s", tmp, strerror(errno));
        goto out;
    }
    uint8_t le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    int bad = write_all(fd, le, 8) || write_all(fd, text, hlen) ||
              write_all(fd, "        ", padded - hlen);
    for (int64_t i = 0; !bad && i < w->count; i++)
        bad = write_all(fd, w->tensors[i].data, w->tensors[i].bytes);
    if (bad || fsync(fd) != 0) {
        st = ddl__local_error(DDL_EIO, "safetensors: cannot write %s: %s", tmp, strerror(errno));
        close(fd);
        unlink(tmp);
        goto out;
    }
    close(fd);
    if (rename(tmp, path) != 0) {
        st = ddl__local_error(DDL_EIO, "safetensors: cannot rename %s to %s: %s", tmp, path,
                              strerror(errno));
        unlink(tmp);
    }
out:
    free(tmp);
    free(text);
    return st;
}

ddl_status ddl_safetensors_read(const char *path, ddl_client_weights **out)
{
    if (!path || !out)
        return ddl__local_error(DDL_EINVAL, "safetensors: path and out are required");
    FILE *f = fopen(path, "rb");
    if (!f)
        return ddl__local_error(DDL_EIO, "safetensors: cannot open %s: %s", path, strerror(errno));
    ddl_status          st   = DDL_OK;
    char               *text = NULL;
    json_t             *hdr  = NULL;
    ddl_client_weights *w    = calloc(1, sizeof *w);
    uint8_t             le[8];
    if (!w) {
        st = ddl__local_error(DDL_ENOMEM, "safetensors: out of memory");
        goto out;
    }
    if (fseek(f, 0, SEEK_END) != 0) {
        st = ddl__local_error(DDL_EIO, "safetensors: cannot seek %s", path);
        goto out;
    }
    long fsize = ftell(f);
    rewind(f);
    if (fsize < 8 || fread(le, 1, 8, f) != 8) {
        st = ddl__local_error(DDL_EPROTO, "safetensors: %s is shorter than its header", path);
        goto out;
    }
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++)
        hlen |= (uint64_t)le[i] << (8 * i);
    if (hlen > MAX_HEADER_BYTES || hlen > (uint64_t)fsize - 8) {
        st = ddl__local_error(DDL_EPROTO, "safetensors: %s: header length %llu, file %ld bytes",
                              path, (unsigned long long)hlen, fsize);
        goto out;
    }
    text = malloc(hlen + 1);
    if (!text || fread(text, 1, hlen, f) != hlen) {
        st = ddl__local_error(DDL_EIO, "safetensors: cannot read the header of %s", path);
        goto out;
    }
    text[hlen] = '\0';
    json_error_t jerr;
    hdr = json_loads(text, 0, &jerr);
    if (!hdr || !json_is_object(hdr)) {
        st = ddl__local_error(DDL_EPROTO, "safetensors: %s: header is not a JSON object (%s)", path,
                              hdr ? "" : jerr.text);
        goto out;
    }
    uint64_t    data_bytes = (uint64_t)fsize - 8 - hlen;
    size_t      n          = json_object_size(hdr);
    const char *key;
    json_t     *val;
    w->tensors = calloc(n ? n : 1, sizeof *w->tensors);
    if (!w->tensors) {
        st = ddl__local_error(DDL_ENOMEM, "safetensors: out of memory");
        goto out;
    }
    long data_start = (long)(8 + hlen);
    json_object_foreach(hdr, key, val)
    {
        if (strcmp(key, "__metadata__") == 0)
            continue;
        json_t *dt = json_object_get(val, "dtype"), *shape = json_object_get(val, "shape"),
               *offs = json_object_get(val, "data_offsets");
        int d        = json_is_string(dt) ? st_dtype_parse(json_string_value(dt)) : -1;
        if (d < 0 || !json_is_array(shape) || json_array_size(shape) > DDL_CLIENT_MAX_DIMS ||
            !json_is_array(offs) || json_array_size(offs) != 2) {
            st =
                ddl__local_error(DDL_EPROTO,
                                 "safetensors: %s: tensor '%s' needs dtype F32/F64/I64/U8, a shape "
                                 "of <= %d dims and two data_offsets",
                                 path, key, DDL_CLIENT_MAX_DIMS);
            goto out;
        }
        ddl_client_tensor *t = &w->tensors[w->count];
        t->dtype             = (ddl_wire_dtype)d;
        t->ndim              = (int)json_array_size(shape);
        uint64_t bytes       = ddl_wire_dtype_size(t->dtype);
        for (int i = 0; i < t->ndim; i++) {
            json_t *s = json_array_get(shape, (size_t)i);
            if (!json_is_integer(s) || json_integer_value(s) < 0 ||
                (json_integer_value(s) > 0 &&
                 bytes > data_bytes / (uint64_t)json_integer_value(s) + 1)) {
                st = ddl__local_error(DDL_EPROTO, "safetensors: %s: tensor '%s' has a bad shape",
                                      path, key);
                goto out;
            }
            t->shape[i] = json_integer_value(s);
            bytes *= (uint64_t)t->shape[i];
        }
        json_int_t b0 = json_integer_value(json_array_get(offs, 0)),
                   b1 = json_integer_value(json_array_get(offs, 1));
        if (b0 < 0 || b1 < b0 || (uint64_t)b1 > data_bytes || (uint64_t)(b1 - b0) != bytes) {
            st = ddl__local_error(DDL_EPROTO,
                                  "safetensors: %s: tensor '%s' offsets [%lld, %lld] do not hold "
                                  "%llu bytes within %llu",
                                  path, key, (long long)b0, (long long)b1,
                                  (unsigned long long)bytes, (unsigned long long)data_bytes);
            goto out;
        }
        t->name  = strdup(key);
        t->data  = malloc(bytes ? bytes : 1);
        t->bytes = bytes;
        w->count++;
        if (!t->name || !t->data) {
            st = ddl__local_error(DDL_ENOMEM, "safetensors: out of memory for '%s'", key);
            goto out;
        }
        if (fseek(f, data_start + (long)b0, SEEK_SET) != 0 ||
            fread(t->data, 1, bytes, f) != bytes) {
            st = ddl__local_error(DDL_EIO, "safetensors: %s: cannot read tensor '%s'", path, key);
            goto out;
        }
    }
out:
    fclose(f);
    free(text);
    if (hdr)
        json_decref(hdr);
    if (st != DDL_OK) {
        ddl_client_weights_destroy(&w);
        return st;
    }
    *out = w;
    return DDL_OK;
}
