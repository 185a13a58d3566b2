// engine/safetensors.c: export and import of global (unsharded) tensors as one
// safetensors file or a directory of .npy files (ddl/checkpoint.h).
//
// safetensors (https://huggingface.co/docs/safetensors, parsed and written by
// format/safetensors.c): an 8-byte little-endian header length N, N bytes of JSON header,
// then the data region. The header maps each tensor
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

#include "ddl/base.h"
#include "ddl/checkpoint.h"
#include "ddl/collect.h"
#include "ddl/format.h"
#include "ddl/npy.h"
#include "engine/durable.h"
#include "partition/mpi_check.h"

#define ST_PATH_MAX 4096

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

// The padded header of the tensors' global shapes (rank 0), 8-byte length first
// (ddl/format.h). Validates metadata_json (an object of strings) and the names.
static ddl_status st_header(const char *path, int n, const ddl_named_tensor *t,
                            const char *metadata_json, char **out, size_t *len)
{
    ddl_fmt_st_tensor *ft = ddl_calloc((size_t)n + 1, sizeof *ft);
    DDL_REQUIRE(ft != NULL, DDL_ENOMEM, "safetensors: out of memory building the header");
    for (int i = 0; i < n; i++) {
        ft[i] = (ddl_fmt_st_tensor){
            .name  = t[i].name,
            .dtype = t[i].local->dtype == DDL_F64 ? "F64" : "F32",
            .ndim  = t[i].global.ndim,
            .shape = t[i].global.d,
            .bytes = (uint64_t)ddl_shape_numel(&t[i].global) * ddl_dtype_size(t[i].local->dtype),
        };
    }
    ddl_status st = ddl_fmt_st_header(path, ft, (size_t)n, metadata_json, out, len);
    ddl_free(ft);
    return st;
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
            if (fwrite(hdr, 1, len, f) != len) {
                st = ddl_set_error(ddl__write_errno_status(errno),
                                   "safetensors: cannot write %s: %s", path, strerror(errno));
            }
        }
    }
    ddl_fmt_free(hdr);
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

// Rank 0: parses and validates the header (ddl/format.h), then checks every request
// against it. begin[i] receives request i's absolute file offset.
static ddl_status st_parse(const char *path, FILE *f, int n, const ddl_named_tensor *t,
                           int64_t *begin)
{
    struct stat sb;
    DDL_REQUIRE(fstat(fileno(f), &sb) == 0, DDL_EIO, "safetensors: cannot stat %s: %s", path,
                strerror(errno));
    ddl_fmt_st h;
    ddl_status st = ddl_fmt_st_read_header(path, f, (uint64_t)sb.st_size, &h);
    for (int i = 0; i < n && st == DDL_OK; i++) {
        char                    want[256], have[256];
        const ddl_fmt_st_entry *e = ddl_fmt_st_find(&h, t[i].name);
        if (e == NULL) {
            st =
                ddl_set_error(DDL_EINVAL, "safetensors: tensor '%s' is not in %s", t[i].name, path);
            break;
        }
        const char *need = t[i].local->dtype == DDL_F64 ? "F64" : "F32";
        if (strcmp(e->dtype, need) != 0) {
            st = ddl_set_error(DDL_EINVAL, "safetensors: tensor '%s' in %s is %s, requested %s",
                               t[i].name, path, e->dtype, need);
            break;
        }
        // The whole stored shape first (the message printed zeros past the first
        // mismatching dimension), then the comparison.
        ddl_shape s = {.ndim = e->ndim};
        for (int d = 0; d < s.ndim && d < DDL_MAX_DIMS; d++) {
            s.d[d] = e->shape[d];
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
        begin[i] = (int64_t)(h.data_start + e->begin);
    }
    ddl_fmt_st_free(&h);
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
