// format/npy.c: the .npy header, parsed and written (ddl/format.h). The engine's reader
// (io/npy.c) and the client's (client/src/npy.c) both go through it.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "base/check.h"
#include "ddl/format.h"

static const struct {
    const char   *descr[3]; // the spellings numpy writes for it on a little-endian machine
    ddl_fmt_dtype dtype;
} npy_types[] = {
    {{"<f4", "=f4", NULL}, DDL_FMT_F32},
    {{"<f8", "=f8", NULL}, DDL_FMT_F64},
    {{"<i8", "=i8", NULL}, DDL_FMT_I64},
    {{"|u1", "<u1", "=u1"}, DDL_FMT_U8},
};

#define NPY_NTYPES (sizeof npy_types / sizeof npy_types[0])

size_t ddl_fmt_dtype_size(ddl_fmt_dtype d)
{
    static const size_t size[] = {4, 8, 8, 1};
    return (unsigned)d < 4 ? size[d] : 0;
}

const char *ddl_fmt_dtype_name(ddl_fmt_dtype d)
{
    static const char *const name[] = {"FP32", "FP64", "INT64", "UINT8"};
    return (unsigned)d < 4 ? name[d] : "?";
}

// The value of key `key` in the header dict: a pointer just after "'key':" and its spaces.
static const char *dict_value(const char *dict, const char *key)
{
    char pat[32];
    snprintf(pat, sizeof pat, "'%s'", key);
    const char *p = strstr(dict, pat);
    if (p == NULL) {
        return NULL;
    }
    p += strlen(pat);
    while (*p == ' ') {
        p++;
    }
    if (*p != ':') {
        return NULL;
    }
    p++;
    while (*p == ' ') {
        p++;
    }
    return p;
}

// Parses the header dict (NUL-terminated) into h's dtype, ndim and shape.
static ddl_status parse_dict(const char *what, const char *dict, ddl_fmt_npy *h)
{
    const char *d = dict_value(dict, "descr");
    char        descr[16];
    size_t      n = 0;
    if (d != NULL && (*d == '\'' || *d == '"')) {
        char q = *d++;
        while (d[n] != '\0' && d[n] != q && n < sizeof descr - 1) {
            n++;
        }
        memcpy(descr, d, n);
    }
    descr[n] = '\0';
    if (n == 0) {
        return ddl_set_error(DDL_EPROTO, "npy: %s: the header has no 'descr'", what);
    }
    bool found = false;
    for (size_t i = 0; i < NPY_NTYPES && !found; i++) {
        for (int k = 0; k < 3 && npy_types[i].descr[k] != NULL && !found; k++) {
            if (strcmp(descr, npy_types[i].descr[k]) == 0) {
                h->dtype = npy_types[i].dtype;
                found    = true;
            }
        }
    }
    if (!found) {
        return ddl_set_error(DDL_EPROTO,
                             "npy: %s: dtype '%s' is not supported (float32 '<f4', float64 "
                             "'<f8', int64 '<i8' or uint8 '|u1', little-endian)",
                             what, descr);
    }
    const char *fo = dict_value(dict, "fortran_order");
    if (fo == NULL || strncmp(fo, "False", 5) != 0) {
        return ddl_set_error(DDL_EPROTO,
                             "npy: %s: only C order is supported (fortran_order must be False; "
                             "save np.ascontiguousarray(x))",
                             what);
    }
    const char *s = dict_value(dict, "shape");
    if (s == NULL || *s != '(') {
        return ddl_set_error(DDL_EPROTO, "npy: %s: the header has no 'shape' tuple", what);
    }
    s++;
    h->ndim = 0;
    for (;;) {
        while (*s == ' ') {
            s++;
        }
        if (*s == ')') {
            break;
        }
        char *end;
        errno       = 0;
        long long v = strtoll(s, &end, 10);
        if (end == s || errno == ERANGE || v < 0) {
            return ddl_set_error(DDL_EPROTO, "npy: %s: bad dimension in shape (%s)", what, dict);
        }
        if (h->ndim == DDL_FMT_MAX_DIMS) {
            return ddl_set_error(DDL_EPROTO, "npy: %s: more than %d dimensions", what,
                                 DDL_FMT_MAX_DIMS);
        }
        h->shape[h->ndim++] = v;
        s                   = end;
        while (*s == ' ') {
            s++;
        }
        if (*s == ',') {
            s++;
        } else if (*s != ')') {
            return ddl_set_error(DDL_EPROTO, "npy: %s: bad shape tuple (%s)", what, dict);
        }
    }
    return DDL_OK;
}

// The magic, the version and the header length from the first 10 or 12 bytes (n of
// them available): *pre receives 10 or 12, *hlen the dict's length.
static ddl_status parse_prefix(const char *what, const uint8_t *b, size_t n, size_t *pre,
                               size_t *hlen)
{
    if (n < 10 || memcmp(b, "\x93NUMPY", 6) != 0) {
        return ddl_set_error(DDL_EPROTO, "npy: %s is not a .npy file (no \\x93NUMPY magic)", what);
    }
    if (b[6] == 1) {
        *pre  = 10;
        *hlen = b[8] | ((size_t)b[9] << 8);
    } else if (b[6] == 2 || b[6] == 3) {
        if (n < 12) {
            return ddl_set_error(DDL_EPROTO, "npy: %s: truncated header", what);
        }
        *pre  = 12;
        *hlen = b[8] | ((size_t)b[9] << 8) | ((size_t)b[10] << 16) | ((size_t)b[11] << 24);
    } else {
        return ddl_set_error(DDL_EPROTO, "npy: %s: format version %d.%d is not supported", what,
                             b[6], b[7]);
    }
    return DDL_OK;
}

// The header length against the file, before anything of that size is read or allocated.
static ddl_status check_hlen(const char *what, size_t pre, size_t hlen, uint64_t file_size)
{
    if (hlen == 0 || hlen > DDL_FMT_NPY_MAX_HEADER || pre + hlen > file_size) {
        return ddl_set_error(DDL_EPROTO,
                             "npy: %s: header length %zu does not fit the file (%llu bytes)", what,
                             hlen, (unsigned long long)file_size);
    }
    return DDL_OK;
}

// The dict (hlen bytes at text, NUL-terminated at text[hlen]), then the data size, with
// overflow checks, against the bytes the file really has.
static ddl_status parse_header(const char *what, const char *text, size_t pre, size_t hlen,
                               uint64_t file_size, ddl_fmt_npy *h)
{
    if (text[0] != '{') {
        return ddl_set_error(DDL_EPROTO, "npy: %s: the header is not a dict", what);
    }
    if (memchr(text, '\0', hlen) != NULL) {
        return ddl_set_error(DDL_EPROTO, "npy: %s: the header holds a NUL byte", what);
    }
    DDL_CHECK(parse_dict(what, text, h));
    uint64_t data  = file_size - pre - hlen;
    uint64_t bytes = ddl_fmt_dtype_size(h->dtype);
    bool     over  = false;
    for (int i = 0; i < h->ndim; i++) {
        over |= __builtin_mul_overflow(bytes, (uint64_t)h->shape[i], &bytes);
    }
    if (over || bytes != data) {
        char shape[160];
        int  k = snprintf(shape, sizeof shape, "[");
        for (int i = 0; i < h->ndim && k < (int)sizeof shape - 24; i++) {
            k += snprintf(shape + k, sizeof shape - (size_t)k, "%s%lld", i ? ", " : "",
                          (long long)h->shape[i]);
        }
        snprintf(shape + k, sizeof shape - (size_t)k, "]");
        char need[32];
        snprintf(need, sizeof need, over ? "more than 2^64" : "%llu", (unsigned long long)bytes);
        return ddl_set_error(
            DDL_EPROTO, "npy: %s: shape %s of %s needs %s bytes of data, the file has %llu", what,
            shape, ddl_fmt_dtype_name(h->dtype), need, (unsigned long long)data);
    }
    h->data_offset = pre + hlen;
    h->data_bytes  = bytes;
    return DDL_OK;
}

ddl_status ddl_fmt_npy_parse(const char *what, const void *buf, size_t n, uint64_t file_size,
                             ddl_fmt_npy *out)
{
    const uint8_t *b   = buf;
    size_t         pre = 0, hlen = 0;
    memset(out, 0, sizeof *out);
    DDL_CHECK(parse_prefix(what, b, n < file_size ? n : (size_t)file_size, &pre, &hlen));
    DDL_CHECK(check_hlen(what, pre, hlen, file_size));
    if (pre + hlen > n) {
        return ddl_set_error(DDL_EPROTO, "npy: %s: truncated header", what);
    }
    char *text = fmt_malloc(hlen + 1);
    if (text == NULL) {
        return ddl_set_error(DDL_ENOMEM, "npy: %s: out of memory for the header", what);
    }
    memcpy(text, b + pre, hlen);
    text[hlen]    = '\0';
    ddl_status st = parse_header(what, text, pre, hlen, file_size, out);
    fmt_free(text);
    return st;
}

ddl_status ddl_fmt_npy_read_header(const char *what, FILE *f, uint64_t file_size, ddl_fmt_npy *out)
{
    uint8_t head[12];
    size_t  pre = 0, hlen = 0;
    memset(out, 0, sizeof *out);
    size_t got = fread(head, 1, 10, f);
    if (got == 10 && (head[6] == 2 || head[6] == 3)) {
        got += fread(head + 10, 1, 2, f);
    }
    DDL_CHECK(parse_prefix(what, head, got, &pre, &hlen));
    DDL_CHECK(check_hlen(what, pre, hlen, file_size));
    char *text = fmt_malloc(hlen + 1);
    if (text == NULL) {
        return ddl_set_error(DDL_ENOMEM, "npy: %s: out of memory for the header", what);
    }
    if (fread(text, 1, hlen, f) != hlen) {
        fmt_free(text);
        return ddl_set_error(DDL_EIO, "npy: %s: cannot read the header", what);
    }
    text[hlen]    = '\0';
    ddl_status st = parse_header(what, text, pre, hlen, file_size, out);
    fmt_free(text);
    return st;
}

ddl_status ddl_fmt_npy_header(ddl_fmt_dtype dtype, int ndim, const int64_t *shape, void *buf,
                              size_t cap, size_t *len)
{
    const char *descr = NULL;
    for (size_t i = 0; i < NPY_NTYPES; i++) {
        if (npy_types[i].dtype == dtype) {
            descr = npy_types[i].descr[0];
        }
    }
    if (descr == NULL || ndim < 0 || ndim > DDL_FMT_MAX_DIMS) {
        return ddl_set_error(DDL_EINVAL, "npy: unknown dtype %d or ndim %d (0 to %d)", (int)dtype,
                             ndim, DDL_FMT_MAX_DIMS);
    }
    char dict[512], dims[256] = "";
    int  k = 0;
    for (int i = 0; i < ndim; i++) {
        k += snprintf(dims + k, sizeof dims - (size_t)k, "%s%lld", i ? ", " : "",
                      (long long)shape[i]);
    }
    if (ndim == 1) {
        snprintf(dims + k, sizeof dims - (size_t)k, ","); // (n,) is a 1-tuple in Python
    }
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }",
                     descr, dims);
    // magic(6) + version(2) + length(2) + dict, padded with spaces and '\n' to 64 bytes.
    size_t pad   = (64 - (10 + (size_t)n + 1) % 64) % 64;
    size_t hlen  = (size_t)n + pad + 1;
    size_t total = 10 + hlen;
    if (total > cap) {
        return ddl_set_error(DDL_EINVAL, "npy: a header of %zu bytes, the buffer holds %zu", total,
                             cap);
    }
    uint8_t *b = buf;
    memcpy(b, "\x93NUMPY\x01\x00", 8);
    b[8] = (uint8_t)(hlen & 0xff);
    b[9] = (uint8_t)(hlen >> 8);
    memcpy(b + 10, dict, (size_t)n);
    memset(b + 10 + n, ' ', pad);
    b[total - 1] = '\n';
    *len         = total;
    return DDL_OK;
}
