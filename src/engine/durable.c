// engine/durable.c: the durable-file helpers shared by checkpoint.c and safetensors.c
// (engine/durable.h): bounded path formatting, directory creation and fsync, files
// written temp -> fflush -> fsync -> rename -> fsync directory, and the checks of
// named-tensor lists and their boxes that every writer and reader of global tensors
// runs before touching a file. The checkpoint format itself lives in checkpoint.c.
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ddl/agree.h"
#include "ddl/base.h"
#include "engine/durable.h"
#include "partition/mpi_check.h"

#define CKPT_PATH_MAX 4096
#define CKPT_NAME_MAX 1024

// ---- paths and durable files ---------------------------------------------------

ddl_status ddl__path_fmt(char *out, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(out, cap, fmt, ap);
    va_end(ap);
    DDL_REQUIRE(len >= 0 && (size_t)len < cap, DDL_EINVAL, "path too long (%d bytes): %.200s...",
                len, out);
    return DDL_OK;
}

// Flushes a directory's entries (new, renamed or removed files) to stable storage.
ddl_status ddl__fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DDL_REQUIRE(fd >= 0, DDL_EIO, "cannot open directory %s: %s", dir, strerror(errno));
    // EINVAL: the file system does not sync directories (nothing more can be done).
    int rc  = fsync(fd);
    int err = errno;
    close(fd);
    DDL_REQUIRE(rc == 0 || err == EINVAL, DDL_EIO, "cannot fsync directory %s: %s", dir,
                strerror(err));
    return DDL_OK;
}

static ddl_status fsync_parent(const char *path)
{
    char        dir[CKPT_PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (slash == NULL) {
        return ddl__fsync_dir(".");
    }
    if (slash == path) {
        return ddl__fsync_dir("/");
    }
    DDL_CHECK(ddl__path_fmt(dir, sizeof dir, "%.*s", (int)(slash - path), path));
    return ddl__fsync_dir(dir);
}

// Creates dir and its missing parents; each new directory is made durable in its parent.
ddl_status ddl__mkdir_p(const char *dir)
{
    char buf[CKPT_PATH_MAX];
    DDL_CHECK(ddl__path_fmt(buf, sizeof buf, "%s", dir));
    size_t len = strlen(buf);
    while (len > 1 && buf[len - 1] == '/') {
        buf[--len] = '\0';
    }
    for (size_t i = 1; i <= len; i++) {
        if (buf[i] != '/' && buf[i] != '\0') {
            continue;
        }
        char saved = buf[i];
        buf[i]     = '\0';
        if (mkdir(buf, 0777) == 0) {
            DDL_CHECK(fsync_parent(buf));
        } else {
            struct stat sb;
            int         err = errno;
            DDL_REQUIRE(err == EEXIST && stat(buf, &sb) == 0 && S_ISDIR(sb.st_mode), DDL_EIO,
                        "cannot create directory %s: %s", buf,
                        err == EEXIST ? "exists and is not a directory" : strerror(err));
        }
        buf[i] = saved;
    }
    return DDL_OK;
}

// A durable file is written to "<path>.tmp" and renamed onto path by ddl__durable_commit.
ddl_status ddl__durable_open(const char *path, FILE **out)
{
    char tmp[CKPT_PATH_MAX];
    DDL_CHECK(ddl__path_fmt(tmp, sizeof tmp, "%s.tmp", path));
    *out = fopen(tmp, "wb");
    DDL_REQUIRE(*out != NULL, ddl__write_errno_status(errno), "cannot create %s: %s", tmp,
                strerror(errno));
    return DDL_OK;
}

// fflush -> fsync -> fclose -> rename onto path -> fsync the directory. Closes f in
// every case; on failure the temporary file is removed and path is untouched.
ddl_status ddl__durable_commit(FILE *f, const char *path)
{
    char tmp[CKPT_PATH_MAX];
    if (ddl__path_fmt(tmp, sizeof tmp, "%s.tmp", path) != DDL_OK) {
        fclose(f); // not reached: ddl__durable_open made the same name
        return DDL_EINVAL;
    }
    int ok  = fflush(f) == 0 && fsync(fileno(f)) == 0;
    int err = errno;
    if (fclose(f) != 0 && ok) {
        ok  = 0;
        err = errno;
    }
    if (ok && rename(tmp, path) != 0) {
        ok  = 0;
        err = errno;
    }
    if (!ok) {
        unlink(tmp);
        return ddl_set_error(ddl__write_errno_status(err), "cannot write %s: %s", path,
                             strerror(err));
    }
    return fsync_parent(path);
}

ddl_status ddl__write_errno_status(int err)
{
    return err == ENOSPC || err == EDQUOT || err == EFBIG ? DDL_ENOMEM : DDL_EIO;
}

ddl_status ddl__durable_fail(FILE *f, const char *path, const char *who, int err)
{
    ddl__durable_abort(f, path);
    return ddl_set_error(ddl__write_errno_status(err), "%s: cannot write %s: %s", who, path,
                         strerror(err));
}

void ddl__durable_abort(FILE *f, const char *path)
{
    char tmp[CKPT_PATH_MAX];
    if (f != NULL) {
        fclose(f);
    }
    if (ddl__path_fmt(tmp, sizeof tmp, "%s.tmp", path) == DDL_OK) {
        unlink(tmp);
    }
}

// ---- tensor lists and boxes ------------------------------------------------------

char *ddl__box_str(const ddl_box *b, char *buf, size_t len)
{
    size_t used = (size_t)snprintf(buf, len, "[");
    for (int d = 0; d < b->ndim && used < len; d++) {
        used += (size_t)snprintf(buf + used, len - used, "%s%lld:%lld", d ? ", " : "",
                                 (long long)b->start[d], (long long)b->stop[d]);
    }
    if (used < len) {
        snprintf(buf + used, len - used, "]");
    }
    return buf;
}

// Volume of a shape, or -1 when it overflows (the byte size of f64 data must fit int64).
int64_t ddl__safe_numel(const ddl_shape *s)
{
    int64_t n = 1;
    for (int d = 0; d < s->ndim; d++) {
        if (s->d[d] < 0 || (s->d[d] > 0 && n > INT64_MAX / 8 / s->d[d])) {
            return -1;
        }
        n *= s->d[d];
    }
    return n;
}

static bool box_equal(const ddl_box *a, const ddl_box *b)
{
    if (a->ndim != b->ndim) {
        return false;
    }
    for (int d = 0; d < a->ndim; d++) {
        if (a->start[d] != b->start[d] || a->stop[d] != b->stop[d]) {
            return false;
        }
    }
    return true;
}

// Local argument checks of a list of named tensors (not collective).
ddl_status ddl__check_named(const char *who, int n, const ddl_named_tensor *t)
{
    DDL_REQUIRE(n >= 0 && (n == 0 || t != NULL), DDL_EINVAL, "%s: %d tensors, list %s", who, n,
                t == NULL ? "NULL" : "given");
    for (int i = 0; i < n; i++) {
        const ddl_named_tensor *x = &t[i];
        DDL_REQUIRE(x->name != NULL && x->name[0] != '\0', DDL_EINVAL, "%s: tensor %d has no name",
                    who, i);
        DDL_REQUIRE(strlen(x->name) <= CKPT_NAME_MAX, DDL_EINVAL,
                    "%s: tensor %d: name longer than %d bytes", who, i, CKPT_NAME_MAX);
        const ddl_shape *g = &x->global;
        DDL_REQUIRE(g->ndim >= 0 && g->ndim <= DDL_MAX_DIMS, DDL_EINVAL,
                    "%s: '%s': global ndim %d outside [0, %d]", who, x->name, g->ndim,
                    DDL_MAX_DIMS);
        DDL_REQUIRE(ddl__safe_numel(g) >= 0, DDL_EINVAL,
                    "%s: '%s': global shape has a negative or too large dimension", who, x->name);
        char bs[256], ss[256];
        DDL_REQUIRE(x->box.ndim == g->ndim && ddl_box_inside(&x->box, g), DDL_EINVAL,
                    "%s: '%s': box %s does not lie inside the global shape %s", who, x->name,
                    ddl__box_str(&x->box, bs, sizeof bs), ddl_shape_str(g, ss, sizeof ss));
        for (int d = 0; d < g->ndim; d++) {
            DDL_REQUIRE(x->box.start[d] <= x->box.stop[d], DDL_EINVAL,
                        "%s: '%s': box %s has start > stop", who, x->name,
                        ddl__box_str(&x->box, bs, sizeof bs));
        }
        const ddl_tensor_t *l = x->local;
        DDL_REQUIRE(l != NULL, DDL_EINVAL, "%s: '%s': no local tensor", who, x->name);
        DDL_REQUIRE(l->dtype == DDL_F32 || l->dtype == DDL_F64, DDL_EINVAL,
                    "%s: '%s': unsupported dtype %d", who, x->name, (int)l->dtype);
        ddl_shape bshape = ddl_box_shape(&x->box);
        DDL_REQUIRE(ddl_shape_equal(&l->shape, &bshape), DDL_ESHAPE,
                    "%s: '%s': local tensor shape %s does not match its box %s", who, x->name,
                    ddl_shape_str(&l->shape, ss, sizeof ss), ddl__box_str(&x->box, bs, sizeof bs));
        DDL_REQUIRE(l->data != NULL || ddl_tensor_numel(l) == 0, DDL_EINVAL,
                    "%s: '%s': local tensor has no data", who, x->name);
        for (int j = 0; j < i; j++) {
            DDL_REQUIRE(strcmp(t[j].name, x->name) != 0, DDL_EINVAL,
                        "%s: tensor name '%s' appears twice", who, x->name);
        }
    }
    return DDL_OK;
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t len)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < len; i++) {
        h = (h ^ c[i]) * 1099511628211ull;
    }
    return h;
}

// Checks that every rank passed the same names, dtypes and global shapes (and the same
// `extra`, e.g. the step), in the same order. Collective; same result on every rank.
ddl_status ddl__check_same_list(MPI_Comm comm, const char *who, int n, const ddl_named_tensor *t,
                                int64_t extra)
{
    uint64_t h = fnv1a(14695981039346656037ull, &n, sizeof n);
    h          = fnv1a(h, &extra, sizeof extra);
    for (int i = 0; i < n; i++) {
        int dt = (int)t[i].local->dtype;
        h      = fnv1a(h, t[i].name, strlen(t[i].name) + 1);
        h      = fnv1a(h, &dt, sizeof dt);
        h      = fnv1a(h, &t[i].global.ndim, sizeof t[i].global.ndim);
        h      = fnv1a(h, t[i].global.d, sizeof(int64_t) * (size_t)t[i].global.ndim);
    }
    // min(h) == max(h) on every rank iff all equal; max(h) = ~min(~h).
    uint64_t mine[2] = {h, ~h}, all[2];
    DDL_CHECK_MPI(MPI_Allreduce(mine, all, 2, MPI_UINT64_T, MPI_MIN, comm));
    DDL_REQUIRE(all[0] == ~all[1], DDL_EINVAL,
                "%s: ranks passed different tensor lists (names, dtypes, global shapes and "
                "their order must be identical on every rank)",
                who);
    return DDL_OK;
}

// Gathers every rank's boxes onto rank 0: (*table)[r * n + i] is rank r's box of tensor
// i (rank 0 only; ddl_free it). Collective; the global ndims must agree across ranks.
ddl_status ddl__gather_box_table(MPI_Comm comm, int n, const ddl_named_tensor *t, ddl_box **table)
{
    int rank, size;
    DDL_CHECK_MPI(MPI_Comm_rank(comm, &rank));
    DDL_CHECK_MPI(MPI_Comm_size(comm, &size));
    *table          = NULL;
    const int  per  = 2 * DDL_MAX_DIMS;
    ddl_status st   = DDL_OK;
    int64_t   *mine = ddl_calloc((size_t)n * per + 1, sizeof(int64_t));
    int64_t   *all  = NULL;
    if ((int64_t)n * per * size > INT_MAX) {
        st = ddl_set_error(DDL_EINVAL, "too many tensors (%d) for one box exchange", n);
    } else if (mine == NULL) {
        st = ddl_set_error(DDL_ENOMEM, "out of memory for the box table");
    } else if (rank == 0) {
        all    = ddl_malloc(sizeof(int64_t) * ((size_t)n * per * (size_t)size + 1));
        *table = ddl_malloc(sizeof(ddl_box) * ((size_t)n * (size_t)size + 1));
        if (all == NULL || *table == NULL) {
            st = ddl_set_error(DDL_ENOMEM, "out of memory for the box table");
        }
    }
    st = ddl_agree(comm, st);
    if (st == DDL_OK) {
        for (int i = 0; i < n; i++) {
            for (int d = 0; d < t[i].box.ndim; d++) {
                mine[(size_t)i * per + d]                = t[i].box.start[d];
                mine[(size_t)i * per + DDL_MAX_DIMS + d] = t[i].box.stop[d];
            }
        }
        int rc = MPI_Gather(mine, n * per, MPI_INT64_T, all, n * per, MPI_INT64_T, 0, comm);
        if (rc != MPI_SUCCESS) {
            st = ddl_set_error(DDL_EMPI, "box table: MPI_Gather failed");
        }
    }
    if (st == DDL_OK && rank == 0) {
        for (int r = 0; r < size; r++) {
            for (int i = 0; i < n; i++) {
                const int64_t *e = all + ((size_t)r * n + i) * per;
                ddl_box       *b = &(*table)[(size_t)r * n + i];
                b->ndim          = t[i].global.ndim;
                for (int d = 0; d < b->ndim; d++) {
                    b->start[d] = e[d];
                    b->stop[d]  = e[DDL_MAX_DIMS + d];
                }
            }
        }
    }
    ddl_free(mine);
    ddl_free(all);
    if (st != DDL_OK) {
        ddl_free(*table);
        *table = NULL;
    }
    return st;
}

// True if the non-empty boxes (boxes[r * stride], r < nb) tile [0, g): identical boxes are
// replicas, distinct ones are disjoint and their volumes add up to g's. owner[r] (if not
// NULL) receives the lowest rank holding the same box as r, or -1 for an empty box.
bool ddl__boxes_tile(const ddl_shape *g, int nb, const ddl_box *boxes, size_t stride, int *owner,
                     char *why, size_t len)
{
    int64_t covered = 0, total = ddl_shape_numel(g);
    char    a[256], b[256];
    for (int r = 0; r < nb; r++) {
        const ddl_box *x = &boxes[(size_t)r * stride];
        if (owner != NULL) {
            owner[r] = -1;
        }
        if (x->ndim != g->ndim || !ddl_box_inside(x, g)) {
            snprintf(why, len, "box %s of rank %d lies outside the global shape",
                     ddl__box_str(x, a, sizeof a), r);
            return false;
        }
        if (ddl_box_numel(x) == 0) {
            continue;
        }
        int first = r;
        for (int q = 0; q < r && first == r; q++) {
            const ddl_box *y = &boxes[(size_t)q * stride];
            ddl_box        common;
            if (ddl_box_numel(y) == 0) {
                continue;
            }
            if (box_equal(x, y)) {
                first = q;
            } else if (ddl_box_intersect(x, y, &common)) {
                snprintf(why, len, "box %s of rank %d overlaps box %s of rank %d",
                         ddl__box_str(x, a, sizeof a), r, ddl__box_str(y, b, sizeof b), q);
                return false;
            }
        }
        if (owner != NULL) {
            owner[r] = first == r ? r : owner[first];
        }
        if (first == r) {
            covered += ddl_box_numel(x);
        }
    }
    if (covered != total) {
        snprintf(why, len, "boxes cover %lld of %lld elements", (long long)covered,
                 (long long)total);
        return false;
    }
    return true;
}
