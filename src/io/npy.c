// io/npy.c: .npy writer and reader (https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html).
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/check.h"
#include "ddl/npy.h"

ddl_status ddl_npy_write(const char *path, const ddl_tensor_t *t)
{
    char dict[512], shape[256] = "";
    size_t used = 0;
    for (int i = 0; i < t->shape.ndim; i++) {
        used += (size_t)snprintf(shape + used, sizeof shape - used, "%lld,%s",
                                 (long long)t->shape.d[i], (t->shape.ndim > 1 && i < t->shape.ndim - 1) ? " " : "");
    }
    if (t->shape.ndim > 1 && used > 0) {
        shape[used - 1] = '\0';  // "2, 3," -> "2, 3" ; 1-D keeps its trailing comma
    }
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }",
                     t->dtype == DDL_F64 ? "<f8" : "<f4", shape);
    // Header: magic(6) + version(2) + len(2) + dict padded with spaces and '\n' to 64 bytes.
    size_t total = 10 + (size_t)n + 1;
    size_t pad   = (64 - total % 64) % 64;
    size_t hlen  = (size_t)n + pad + 1;
    char   tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    DDL_REQUIRE(f != NULL, DDL_EIO, "npy: cannot create %s: %s", tmp, strerror(errno));
    unsigned char head[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hlen & 0xff),
                              (unsigned char)(hlen >> 8)};
    int ok = fwrite(head, 1, 10, f) == 10 && fwrite(dict, 1, (size_t)n, f) == (size_t)n;
    for (size_t i = 0; i < pad && ok; i++) {
        ok = fputc(' ', f) != EOF;
    }
    ok = ok && fputc('\n', f) != EOF;
    size_t bytes = ddl_tensor_bytes(t);
    ok           = ok && (bytes == 0 || fwrite(t->data, 1, bytes, f) == bytes);
    ok           = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        remove(tmp);
        return ddl_set_error(DDL_EIO, "npy: cannot write %s: %s", path, strerror(errno));
    }
    return DDL_OK;
}

ddl_status ddl_npy_read(const char *path, ddl_tensor_t **out)
{
    // O_NONBLOCK and regular files only: a FIFO must not block the reader in open.
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    DDL_REQUIRE(fd >= 0, DDL_EIO, "npy: cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return ddl_set_error(DDL_EPROTO, "npy: %s is not a regular file", path);
    }
    FILE *f = fdopen(fd, "rb");
    if (f == NULL) {
        close(fd);
        return ddl_set_error(DDL_EIO, "npy: cannot open %s: %s", path, strerror(errno));
    }
    unsigned char head[12];
    ddl_status    st = DDL_OK;
    char          dict[4096];
    if (fread(head, 1, 10, f) != 10 || memcmp(head, "\x93NUMPY", 6) != 0) {
        fclose(f);
        return ddl_set_error(DDL_EPROTO, "npy: %s is not a .npy file (bad magic)", path);
    }
    size_t hlen;
    if (head[6] == 1) {
        hlen = head[8] | ((size_t)head[9] << 8);
    } else if (head[6] == 2 || head[6] == 3) {
        if (fread(head + 10, 1, 2, f) != 2) {
            fclose(f);
            return ddl_set_error(DDL_EPROTO, "npy: %s: truncated header", path);
        }
        hlen = head[8] | ((size_t)head[9] << 8) | ((size_t)head[10] << 16) | ((size_t)head[11] << 24);
    } else {
        fclose(f);
        return ddl_set_error(DDL_EPROTO, "npy: %s: unsupported version %d", path, head[6]);
    }
    if (hlen >= sizeof dict || fread(dict, 1, hlen, f) != hlen) {
        fclose(f);
        return ddl_set_error(DDL_EPROTO, "npy: %s: header too long or truncated", path);
    }
    dict[hlen]   = '\0';
    ddl_dtype dt = DDL_F32;
    if (strstr(dict, "'<f8'") != NULL) {
        dt = DDL_F64;
    } else if (strstr(dict, "'<f4'") == NULL) {
        fclose(f);
        return ddl_set_error(DDL_EPROTO, "npy: %s: only <f4 and <f8 are supported (%s)", path, dict);
    }
    if (strstr(dict, "'fortran_order': False") == NULL) {
        fclose(f);
        return ddl_set_error(DDL_EPROTO, "npy: %s: Fortran order is not supported", path);
    }
    const char *sp = strstr(dict, "'shape':");
    const char *lp = sp ? strchr(sp, '(') : NULL;
    ddl_shape   s  = {.ndim = 0};
    if (lp == NULL) {
        fclose(f);
        return ddl_set_error(DDL_EPROTO, "npy: %s: no shape in header", path);
    }
    const char *q = lp + 1;
    while (*q && *q != ')') {
        while (*q == ' ' || *q == ',') {
            q++;
        }
        if (*q == ')') {
            break;
        }
        char     *end;
        errno       = 0;
        long long v = strtoll(q, &end, 10);
        if (end == q || errno == ERANGE || v < 0 || s.ndim >= DDL_MAX_DIMS) {
            fclose(f);
            return ddl_set_error(DDL_EPROTO, "npy: %s: bad shape in header", path);
        }
        s.d[s.ndim++] = v;
        q             = end;
    }
    // The shape's size, checked (a (2^32, 2^32) shape wrapped to 0 elements and was
    // accepted with no data), then the data size against the file before allocating.
    int64_t numel;
    if (ddl_shape_numel_checked(&s, &numel) != DDL_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", ddl_last_error());  // set_error reuses its buffer
        fclose(f);
        return ddl_set_error(DDL_EPROTO, "npy: %s: %s", path, why);
    }
    long pos = ftell(f);
    fseek(f, 0, SEEK_END);
    long end = ftell(f);
    fseek(f, pos, SEEK_SET);
    size_t need = (size_t)numel * ddl_dtype_size(dt);
    if (end < 0 || pos < 0 || (size_t)(end - pos) != need) {
        fclose(f);
        return ddl_set_error(DDL_EPROTO, "npy: %s: data is %ld bytes, shape needs %zu", path,
                             end - pos, need);
    }
    st = ddl_tensor_create(dt, &s, out);
    if (st == DDL_OK && need > 0 && fread((*out)->data, 1, need, f) != need) {
        ddl_tensor_destroy(out);
        st = ddl_set_error(DDL_EIO, "npy: %s: short read", path);
    }
    fclose(f);
    return st;
}
