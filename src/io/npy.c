// io/npy.c: .npy files of engine tensors; the header is format/npy.c's (ddl/format.h).
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/check.h"
#include "ddl/format.h"
#include "ddl/npy.h"

ddl_status ddl_npy_write(const char *path, const ddl_tensor_t *t)
{
    uint8_t head[512];
    size_t  hlen;
    DDL_CHECK(ddl_fmt_npy_header(t->dtype == DDL_F64 ? DDL_FMT_F64 : DDL_FMT_F32, t->shape.ndim,
                                 t->shape.d, head, sizeof head, &hlen));
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    DDL_REQUIRE(f != NULL, DDL_EIO, "npy: cannot create %s: %s", tmp, strerror(errno));
    int    ok    = fwrite(head, 1, hlen, f) == hlen;
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
    // The header and the data size against the file (ddl/format.h), then the engine's own
    // limits: f4/f8 only, and the element count a tensor may have.
    ddl_fmt_npy h;
    ddl_status  st = ddl_fmt_npy_read_header(path, f, (uint64_t)sb.st_size, &h);
    if (st == DDL_OK && h.dtype != DDL_FMT_F32 && h.dtype != DDL_FMT_F64) {
        st = ddl_set_error(DDL_EPROTO, "npy: %s: only <f4 and <f8 are supported (dtype %s)", path,
                           ddl_fmt_dtype_name(h.dtype));
    }
    ddl_shape s = {.ndim = h.ndim};
    int64_t   numel;
    for (int i = 0; st == DDL_OK && i < h.ndim; i++) {
        s.d[i] = h.shape[i];
    }
    if (st == DDL_OK && ddl_shape_numel_checked(&s, &numel) != DDL_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", ddl_last_error()); // set_error reuses its buffer
        st = ddl_set_error(DDL_EPROTO, "npy: %s: %s", path, why);
    }
    if (st == DDL_OK) {
        st = ddl_tensor_create(h.dtype == DDL_FMT_F64 ? DDL_F64 : DDL_F32, &s, out);
    }
    size_t need = (size_t)h.data_bytes;
    if (st == DDL_OK && need > 0 && fread((*out)->data, 1, need, f) != need) {
        ddl_tensor_destroy(out);
        st = ddl_set_error(DDL_EIO, "npy: %s: short read", path);
    }
    fclose(f);
    return st;
}
