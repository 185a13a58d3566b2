// npy.c: NumPy .npy files for the client (format 1.0, 2.0 and 3.0; little-endian float32,
// float64, int64 and uint8; C order), https://numpy.org/doc/stable/reference/generated/
// numpy.lib.format.html.
//
// The header is parsed and written by src/format/npy.c (ddl/format.h), the engine's reader
// too; this file reads and writes the client's tensors around it.
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client_impl.h"
#include "ddl/format.h"

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
    ddl_client_tensor t = {0};
    ddl_fmt_npy       h;
    ddl_status        st = ddl_fmt_npy_read_header(path, f, (uint64_t)sb.st_size, &h);
    if (st != DDL_OK) {
        st = ddl__local_error(st, "%s", ddl_last_error());
        goto out;
    }
    t.dtype = (ddl_wire_dtype)h.dtype; // the same values (ddl/format.h)
    t.ndim  = h.ndim;
    memcpy(t.shape, h.shape, sizeof h.shape);
    uint64_t bytes = h.data_bytes;
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
    if (ddl_fmt_dtype_size((ddl_fmt_dtype)t->dtype) == 0 || t->ndim < 0 ||
        t->ndim > DDL_CLIENT_MAX_DIMS)
        return ddl__local_error(DDL_EINVAL, "npy: %s: tensor has an unknown dtype or ndim %d", path,
                                t->ndim);
    uint64_t bytes = ddl_wire_dtype_size(t->dtype);
    for (int i = 0; i < t->ndim; i++)
        bytes *= (uint64_t)(t->shape[i] < 0 ? 0 : t->shape[i]);
    if (bytes != t->bytes)
        return ddl__local_error(DDL_EINVAL, "npy: %s: tensor holds %zu bytes, its shape needs %llu",
                                path, t->bytes, (unsigned long long)bytes);
    uint8_t    head[512];
    size_t     hlen;
    ddl_status st =
        ddl_fmt_npy_header((ddl_fmt_dtype)t->dtype, t->ndim, t->shape, head, sizeof head, &hlen);
    if (st != DDL_OK)
        return ddl__local_error(st, "%s", ddl_last_error());

    size_t plen = strlen(path);
    char  *tmp  = malloc(plen + 5);
    if (!tmp)
        return ddl__local_error(DDL_ENOMEM, "npy: out of memory");
    snprintf(tmp, plen + 5, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        st = ddl__local_error(DDL_EIO, "npy: cannot create %s: %s", tmp, strerror(errno));
        goto out;
    }
    int ok = fwrite(head, 1, hlen, f) == hlen &&
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
