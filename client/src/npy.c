// npy.c: NumPy .npy files for the client (format 1.0, 2.0 and 3.0; little-endian float32,
// float64, int64 and uint8; C order), https://numpy.org/doc/stable/reference/generated/
// numpy.lib.format.html.
//
// Why not the engine's src/io/npy.c: that reader builds an engine ddl_tensor_t through the
// engine's counted allocator (libddl_tensor, libddl_base) and knows only <f4/<f8, while a
// client reads images as uint8 into a ddl_client_tensor. Linking it would pull the engine's
// tensor module into libdistdl-client, which carries nothing of the engine but status.c.
//
// Header: magic "\x93NUMPY", major, minor, a little-endian length (2 bytes in 1.0, 4 in
// 2.0/3.0), then a Python dict literal such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (8, 1, 28, 28), }
// padded with spaces and a '\n' so that the data starts at a multiple of 64 bytes.
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client_impl.h"

#define NPY_MAX_HEADER (1u << 20)

static const struct {
    const char    *descr[3]; // the spellings numpy writes for it on a little-endian machine
    ddl_wire_dtype dtype;
} npy_types[] = {
    {{"<f4", "=f4", NULL}, DDL_WIRE_FP32},
    {{"<f8", "=f8", NULL}, DDL_WIRE_FP64},
    {{"<i8", "=i8", NULL}, DDL_WIRE_INT64},
    {{"|u1", "<u1", "=u1"}, DDL_WIRE_UINT8},
};

static const char *npy_descr(ddl_wire_dtype d)
{
    for (size_t i = 0; i < sizeof npy_types / sizeof npy_types[0]; i++)
        if (npy_types[i].dtype == d)
            return npy_types[i].descr[0];
    return NULL;
}

// The value of key `key` in the header dict: a pointer just after "'key':" and its spaces.
static const char *dict_value(const char *dict, const char *key)
{
    char pat[32];
    snprintf(pat, sizeof pat, "'%s'", key);
    const char *p = strstr(dict, pat);
    if (!p)
        return NULL;
    p += strlen(pat);
    while (*p == ' ')
        p++;
    if (*p != ':')
        return NULL;
    p++;
    while (*p == ' ')
        p++;
    return p;
}

// Parses the header dict into t (dtype, ndim, shape); a message naming the problem otherwise.
static ddl_status parse_dict(const char *path, const char *dict, ddl_client_tensor *t)
{
    const char *d = dict_value(dict, "descr");
    char        descr[16];
    size_t      n = 0;
    if (d && (*d == '\'' || *d == '"')) {
        char q = *d++;
        while (d[n] && d[n] != q && n < sizeof descr - 1)
            n++;
        memcpy(descr, d, n);
    }
    descr[n] = '\0';
    if (n == 0)
        return ddl__local_error(DDL_EPROTO, "npy: %s: the header has no 'descr'", path);
    int found = 0;
    for (size_t i = 0; i < sizeof npy_types / sizeof npy_types[0] && !found; i++)
        for (int k = 0; k < 3 && npy_types[i].descr[k]; k++)
            if (strcmp(descr, npy_types[i].descr[k]) == 0) {
                t->dtype = npy_types[i].dtype;
                found    = 1;
                break;
            }
    if (!found)
        return ddl__local_error(DDL_EPROTO,
                                "npy: %s: dtype '%s' is not supported (float32 '<f4', float64 "
                                "'<f8', int64 '<i8' or uint8 '|u1', little-endian)",
                                path, descr);
    const char *fo = dict_value(dict, "fortran_order");
    if (!fo || strncmp(fo, "False", 5) != 0)
        return ddl__local_error(DDL_EPROTO,
                                "npy: %s: only C order is supported (fortran_order must be False; "
                                "save np.ascontiguousarray(x))",
                                path);
    const char *s = dict_value(dict, "shape");
    if (!s || *s != '(')
        return ddl__local_error(DDL_EPROTO, "npy: %s: the header has no 'shape' tuple", path);
    s++;
    t->ndim = 0;
    for (;;) {
        while (*s == ' ')
            s++;
        if (*s == ')')
            break;
        char *end;
        errno       = 0;
        long long v = strtoll(s, &end, 10);
        if (end == s || errno == ERANGE || v < 0)
            return ddl__local_error(DDL_EPROTO, "npy: %s: bad dimension in shape (%s)", path, dict);
        if (t->ndim == DDL_CLIENT_MAX_DIMS)
            return ddl__local_error(DDL_EPROTO, "npy: %s: more than %d dimensions", path,
                                    DDL_CLIENT_MAX_DIMS);
        t->shape[t->ndim++] = v;
        s                   = end;
        while (*s == ' ')
            s++;
        if (*s == ',')
            s++;
        else if (*s != ')')
            return ddl__local_error(DDL_EPROTO, "npy: %s: bad shape tuple (%s)", path, dict);
    }
    return DDL_OK;
}

ddl_status ddl_client_npy_read(const char *path, ddl_client_tensor *out)
{
    if (!path || !out)
        return ddl__local_error(DDL_EINVAL, "npy: path and out are required");
    // O_NONBLOCK and regular files only: a FIFO must not block the reader in open.
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return ddl__local_error(DDL_EIO, "npy: cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return ddl__local_error(DDL_EIO, "npy: %s is not a regular file", path);
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return ddl__local_error(DDL_EIO, "npy: cannot open %s: %s", path, strerror(errno));
    }
    ddl_status        st   = DDL_OK;
    char             *dict = NULL;
    ddl_client_tensor t    = {0};
    unsigned char     head[12];
    size_t            hlen = 0, pre = 10;
    if (fread(head, 1, 10, f) != 10 || memcmp(head, "\x93NUMPY", 6) != 0) {
        st = ddl__local_error(DDL_EPROTO, "npy: %s is not a .npy file (no \\x93NUMPY magic)", path);
        goto out;
    }
    if (head[6] == 1) {
        hlen = head[8] | ((size_t)head[9] << 8);
    } else if (head[6] == 2 || head[6] == 3) {
        if (fread(head + 10, 1, 2, f) != 2) {
            st = ddl__local_error(DDL_EPROTO, "npy: %s: truncated header", path);
            goto out;
        }
        hlen =
            head[8] | ((size_t)head[9] << 8) | ((size_t)head[10] << 16) | ((size_t)head[11] << 24);
        pre = 12;
    } else {
        st = ddl__local_error(DDL_EPROTO, "npy: %s: format version %d.%d is not supported", path,
                              head[6], head[7]);
        goto out;
    }
    if (hlen == 0 || hlen > NPY_MAX_HEADER || (off_t)(pre + hlen) > sb.st_size) {
        st = ddl__local_error(DDL_EPROTO,
                              "npy: %s: header length %zu does not fit the file (%lld "
                              "bytes)",
                              path, hlen, (long long)sb.st_size);
        goto out;
    }
    dict = malloc(hlen + 1);
    if (!dict || fread(dict, 1, hlen, f) != hlen) {
        st = ddl__local_error(DDL_EIO, "npy: %s: cannot read the header", path);
        goto out;
    }
    dict[hlen] = '\0';
    if (dict[0] != '{') {
        st = ddl__local_error(DDL_EPROTO, "npy: %s: the header is not a dict", path);
        goto out;
    }
    st = parse_dict(path, dict, &t);
    if (st != DDL_OK)
        goto out;
    // The size, with overflow checks, against the bytes the file really has, before
    // allocating anything of that size.
    uint64_t data  = (uint64_t)sb.st_size - pre - hlen;
    uint64_t bytes = ddl_wire_dtype_size(t.dtype);
    int      over  = 0;
    for (int i = 0; i < t.ndim; i++)
        over |= __builtin_mul_overflow(bytes, (uint64_t)t.shape[i], &bytes);
    if (over || bytes != data) {
        char shape[160];
        int  k = snprintf(shape, sizeof shape, "[");
        for (int i = 0; i < t.ndim && k < (int)sizeof shape - 24; i++)
            k += snprintf(shape + k, sizeof shape - (size_t)k, "%s%lld", i ? ", " : "",
                          (long long)t.shape[i]);
        snprintf(shape + k, sizeof shape - (size_t)k, "]");
        char need[32];
        snprintf(need, sizeof need, over ? "more than 2^64" : "%llu", (unsigned long long)bytes);
        st = ddl__local_error(DDL_EPROTO,
                              "npy: %s: shape %s of %s needs %s bytes of data, the "
                              "file has %llu",
                              path, shape, ddl_wire_dtype_name(t.dtype), need,
                              (unsigned long long)data);
        goto out;
    }
    t.bytes = (size_t)bytes;
    t.name  = strdup("x");
    t.data  = malloc(bytes ? bytes : 1);
    if (!t.name || !t.data) {
        st = ddl__local_error(DDL_ENOMEM, "npy: %s: out of memory for %zu bytes", path, t.bytes);
        goto out;
    }
    if (bytes && fread(t.data, 1, bytes, f) != bytes) {
        st = ddl__local_error(DDL_EIO, "npy: %s: short read", path);
        goto out;
    }
out:
    fclose(f);
    free(dict);
    if (st != DDL_OK) {
        ddl_client_tensor_release(&t);
        return st;
    }
    *out = t;
    return DDL_OK;
}

ddl_status ddl_client_npy_write(const char *path, const ddl_client_tensor *t)
{
    if (!path || !t || (t->bytes && !t->data))
        return ddl__local_error(DDL_EINVAL, "npy: path and tensor are required");
    const char *descr = npy_descr(t->dtype);
    if (!descr || t->ndim < 0 || t->ndim > DDL_CLIENT_MAX_DIMS)
        return ddl__local_error(DDL_EINVAL, "npy: %s: tensor has an unknown dtype or ndim %d", path,
                                t->ndim);
    uint64_t bytes = ddl_wire_dtype_size(t->dtype);
    for (int i = 0; i < t->ndim; i++)
        bytes *= (uint64_t)(t->shape[i] < 0 ? 0 : t->shape[i]);
    if (bytes != t->bytes)
        return ddl__local_error(DDL_EINVAL, "npy: %s: tensor holds %zu bytes, its shape needs %llu",
                                path, t->bytes, (unsigned long long)bytes);
    char dict[512], shape[256] = "";
    int  k = 0;
    for (int i = 0; i < t->ndim; i++)
        k += snprintf(shape + k, sizeof shape - (size_t)k, "%s%lld", i ? ", " : "",
                      (long long)t->shape[i]);
    if (t->ndim == 1)
        snprintf(shape + k, sizeof shape - (size_t)k, ","); // (n,) is a 1-tuple in Python
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }",
                     descr, shape);
    // magic(6) + version(2) + length(2) + dict, padded with spaces and '\n' to 64 bytes.
    size_t        pad     = (64 - (10 + (size_t)n + 1) % 64) % 64;
    size_t        hlen    = (size_t)n + pad + 1;
    unsigned char pre[10] = {0x93,
                             'N',
                             'U',
                             'M',
                             'P',
                             'Y',
                             1,
                             0,
                             (unsigned char)(hlen & 0xff),
                             (unsigned char)(hlen >> 8)};
    memset(dict + n, ' ', pad);
    dict[n + (int)pad] = '\n';

    size_t plen = strlen(path);
    char  *tmp  = malloc(plen + 5);
    if (!tmp)
        return ddl__local_error(DDL_ENOMEM, "npy: out of memory");
    snprintf(tmp, plen + 5, "%s.tmp", path);
    ddl_status st = DDL_OK;
    FILE      *f  = fopen(tmp, "wb");
    if (!f) {
        st = ddl__local_error(DDL_EIO, "npy: cannot create %s: %s", tmp, strerror(errno));
        goto out;
    }
    int ok = fwrite(pre, 1, 10, f) == 10 && fwrite(dict, 1, hlen, f) == hlen &&
             (t->bytes == 0 || fwrite(t->data, 1, t->bytes, f) == t->bytes);
    ok     = fflush(f) == 0 && ok && fsync(fileno(f)) == 0;
    int en = errno;
    ok     = fclose(f) == 0 && ok;
    if (!ok) {
        st = ddl__local_error(DDL_EIO, "npy: cannot write %s: %s", tmp, strerror(en));
        unlink(tmp);
        goto out;
    }
    if (rename(tmp, path) != 0) {
        st = ddl__local_error(DDL_EIO, "npy: cannot rename %s to %s: %s", tmp, path,
                              strerror(errno));
        unlink(tmp);
    }
out:
    free(tmp);
    return st;
}
