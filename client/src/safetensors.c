// safetensors.c: read and write weight sets as safetensors files (an 8-byte little-endian
// header length, a JSON header {name: {dtype, shape, data_offsets}}, then the raw bytes).
// The header is parsed, validated and written by src/format/safetensors.c (ddl/format.h),
// the engine's import and export too.
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client_impl.h"
#include "ddl/format.h"

static const char *const st_dtypes[] = {"F32", "F64", "I64", "U8"}; // by ddl_wire_dtype

static int st_dtype_parse(const char *s)
{
    for (int i = 0; i < 4; i++)
        if (strcmp(s, st_dtypes[i]) == 0)
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
    ddl_fmt_st_tensor *ft = calloc((size_t)w->count + 1, sizeof *ft);
    if (!ft)
        return ddl__local_error(DDL_ENOMEM, "safetensors: out of memory");
    for (int64_t i = 0; i < w->count; i++) {
        const ddl_client_tensor *t = &w->tensors[i];
        ft[i]                      = (ddl_fmt_st_tensor){
                                 .name  = t->name,
                                 .dtype = (unsigned)t->dtype < 4 ? st_dtypes[t->dtype] : NULL,
                                 .ndim  = t->ndim,
                                 .shape = t->shape,
                                 .bytes = t->bytes,
        };
    }
    char      *text = NULL;
    size_t     hlen = 0;
    ddl_status hst  = ddl_fmt_st_header(path, ft, (size_t)w->count, NULL, &text, &hlen);
    free(ft);
    if (hst != DDL_OK)
        return ddl__local_error(hst, "%s", ddl_last_error());

    size_t plen = strlen(path);
    char  *tmp  = malloc(plen + 5);
    if (!tmp) {
        ddl_fmt_free(text);
        return ddl__local_error(DDL_ENOMEM, "safetensors: out of memory");
    }
    snprintf(tmp, plen + 5, "%s.tmp", path);
    ddl_status st = DDL_OK;
    int        fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        st = ddl__local_error(DDL_EIO, "safetensors: cannot create %s: %s", tmp, strerror(errno));
        goto out;
    }
    int bad = write_all(fd, text, hlen); // the length, the header and its padding
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
    ddl_fmt_free(text);
    return st;
}

ddl_status ddl_safetensors_read(const char *path, ddl_client_weights **out)
{
    if (!path || !out)
        return ddl__local_error(DDL_EINVAL, "safetensors: path and out are required");
    FILE *f = fopen(path, "rb");
    if (!f)
        return ddl__local_error(DDL_EIO, "safetensors: cannot open %s: %s", path, strerror(errno));
    ddl_status          st = DDL_OK;
    ddl_fmt_st          h  = {0};
    ddl_client_weights *w  = calloc(1, sizeof *w);
    if (!w) {
        st = ddl__local_error(DDL_ENOMEM, "safetensors: out of memory");
        goto out;
    }
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0) {
        st = ddl__local_error(DDL_EIO, "safetensors: cannot stat %s: %s", path, strerror(errno));
        goto out;
    }
    st = ddl_fmt_st_read_header(path, f, (uint64_t)sb.st_size, &h);
    if (st != DDL_OK) {
        st = ddl__local_error(st, "%s", ddl_last_error());
        goto out;
    }
    w->tensors = calloc(h.count ? h.count : 1, sizeof *w->tensors);
    if (!w->tensors) {
        st = ddl__local_error(DDL_ENOMEM, "safetensors: out of memory");
        goto out;
    }
    for (size_t k = 0; k < h.count; k++) {
        const ddl_fmt_st_entry *e = &h.entries[k];
        int                     d = st_dtype_parse(e->dtype);
        if (d < 0 || e->ndim > DDL_CLIENT_MAX_DIMS) {
            st =
                ddl__local_error(DDL_EPROTO,
                                 "safetensors: %s: tensor '%s' needs dtype F32/F64/I64/U8, a shape "
                                 "of <= %d dims and two data_offsets",
                                 path, e->name, DDL_CLIENT_MAX_DIMS);
            goto out;
        }
        ddl_client_tensor *t = &w->tensors[w->count];
        t->dtype             = (ddl_wire_dtype)d;
        t->ndim              = e->ndim;
        memcpy(t->shape, e->shape, sizeof e->shape);
        uint64_t bytes = e->end - e->begin; // shape x dtype (checked)
        t->name        = strdup(e->name);
        t->data        = malloc(bytes ? bytes : 1);
        t->bytes       = bytes;
        w->count++;
        if (!t->name || !t->data) {
            st = ddl__local_error(DDL_ENOMEM, "safetensors: out of memory for '%s'", e->name);
            goto out;
        }
        if (fseeko(f, (off_t)(h.data_start + e->begin), SEEK_SET) != 0 ||
            fread(t->data, 1, bytes, f) != bytes) {
            st = ddl__local_error(DDL_EIO, "safetensors: %s: cannot read tensor '%s'", path,
                                  e->name);
            goto out;
        }
    }
out:
    fclose(f);
    ddl_fmt_st_free(&h);
    if (st != DDL_OK) {
        ddl_client_weights_destroy(&w);
        return st;
    }
    *out = w;
    return DDL_OK;
}
