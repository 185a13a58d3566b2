// engine/checkpoint.c: durable, verifiable, reshardable checkpoints (ddl/checkpoint.h).
//
// On disk, a checkpoint root <dir> holds
//   <dir>/latest                          "step-<S, 9 digits>\n": the newest complete checkpoint
//   <dir>/step-<S>/shard-<rank, 5 digits>.bin   one per rank of the writing world
//   <dir>/step-<S>/manifest.json          written by rank 0 once every shard is durable
//   <dir>/step-<S>/manifest.sha256        "<64 hex>  manifest.json\n" (sha256sum's format):
//                                         the SHA-256 of manifest.json, written after it
//
// Shard file, format version 1. Integers are little-endian; i64/u64 are 8 bytes, u32 4:
//   header (32 bytes): char magic[8] = "DDLSHARD", u32 version, u32 rank, u32 world size,
//                      u32 tensor count n, i64 step
//   then n records, in the order of the manifest's "tensors":
//     u32 name length L, L bytes of name (UTF-8, no NUL), u32 dtype (0 = f32, 1 = f64),
//     u32 ndim, i64 start[ndim], i64 stop[ndim] (this rank's box, global coordinates),
//     u64 byte count (box volume * dtype size), the box's elements (row-major, raw
//     little-endian IEEE 754)
//   and nothing after the last record.
//
// manifest.json (format_version 1):
//   {"format_version": 1, "world_size": P, "step": S,
//    "spec": "<model spec text, verbatim>", "user": {caller state},
//    "tensors": [{"name": "fc1.weight", "dtype": "f32", "shape": [10, 7],
//                 "boxes": [{"start": [0, 0], "stop": [5, 7]}, ...one per rank...]}, ...],
//    "shards": [{"file": "shard-00000.bin", "sha256": "<64 hex>", "bytes": N}, ...]}
// The boxes of a tensor must tile its global shape: identical boxes on several ranks are
// replicas (the lowest such rank is the one read back), distinct boxes are disjoint, and
// together they cover every element. Ranks holding none of a tensor have an empty box.
//
// Crash safety. A save writes its files into <dir>/step-<S>.partial/ (each file temp ->
// fflush -> fsync -> rename -> fsync directory), writes the manifest there last, then
// renames the directory to step-<S> (atomically exchanging it with an older step-<S> if
// one exists: renameat2 RENAME_EXCHANGE), fsyncs <dir>, and only then rewrites `latest`
// the same way. A crash at any point leaves `latest` naming a complete checkpoint; a
// left-over step-<S>.partial is removed by the next save of step S.
// Crash points for tests (ddl_fault_point, DDL_FAULT): checkpoint.staged (every rank,
// staging directory made), .shard (every rank, own shard durable), .manifest (rank 0,
// manifest durable in staging), .publish (rank 0, step directory renamed, `latest` not
// yet moved), .done (every rank, `latest` moved).
//
// Loading. Rank 0 resolves `latest`, reads manifest.json, checks it against
// manifest.sha256 and broadcasts its text; every rank validates it (every field's type
// and range, and every count against the world size before allocating for it). Without
// `latest`, a root holding step-<S> directories resolves to the newest one whose
// manifest verifies, and says so in a warning (see ddl/checkpoint.h). The shards' sizes
// and SHA-256 digests are verified round-robin over the ranks (shard s by rank s % size)
// so that every shard is checked once, in parallel, before anything is read. Then every rank reads, straight from the shard files, the
// intersections of its requested boxes with the written boxes into staging tensors, and
// copies them into the caller's tensors only once every rank has succeeded.
//
// Every function here is collective over comm; failures are agreed on (ddl_agree), so
// every rank returns the status and message of the lowest failing rank.
#define _GNU_SOURCE // renameat2 (RENAME_EXCHANGE)
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "ddl/base.h"
#include "ddl/checkpoint.h"
#include "engine/durable.h"
#include "partition/mpi_check.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "checkpoint and safetensors files store raw little-endian data");

#define CKPT_PATH_MAX 4096
#define CKPT_NAME_MAX 1024
#define CKPT_MSG_MAX 1024
#define CKPT_WORLD_MAX (1 << 20)
#define SHARD_MAGIC "DDLSHARD"
#define SHARD_HEADER 32
#define MANIFEST_MAX ((int64_t)1 << 30)
#define LATEST_MAX 64
#define MANIFEST_SUM_MAX 128

// Removes a directory holding only files (a step directory); a missing one is fine.
static ddl_status remove_flat_dir(const char *dir)
{
    struct stat sb;
    if (lstat(dir, &sb) != 0) {
        DDL_REQUIRE(errno == ENOENT, DDL_EIO, "cannot stat %s: %s", dir, strerror(errno));
        return DDL_OK;
    }
    if (!S_ISDIR(sb.st_mode)) {
        DDL_REQUIRE(unlink(dir) == 0, DDL_EIO, "cannot remove %s: %s", dir, strerror(errno));
        return DDL_OK;
    }
    DIR *d = opendir(dir);
    DDL_REQUIRE(d != NULL, DDL_EIO, "cannot open directory %s: %s", dir, strerror(errno));
    ddl_status     st = DDL_OK;
    struct dirent *e;
    while (st == DDL_OK && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) {
            continue;
        }
        if (unlinkat(dirfd(d), e->d_name, 0) != 0) {
            st = ddl_set_error(DDL_EIO, "cannot remove %s/%s: %s", dir, e->d_name, strerror(errno));
        }
    }
    closedir(d);
    DDL_CHECK(st);
    DDL_REQUIRE(rmdir(dir) == 0, DDL_EIO, "cannot remove %s: %s", dir, strerror(errno));
    return DDL_OK;
}

// ---- little-endian encoding ----------------------------------------------------

static void put_u32(unsigned char *p, uint32_t v)
{
    memcpy(p, &v, 4);
}

static void put_u64(unsigned char *p, uint64_t v)
{
    memcpy(p, &v, 8);
}

static uint32_t get_u32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static uint64_t get_u64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

// ---- save ------------------------------------------------------------------------

static ddl_status write_shard(const char *path, int rank, int size, int64_t step, int n,
                              const ddl_named_tensor *t)
{
    FILE *f;
    DDL_CHECK(ddl__durable_open(path, &f));
    unsigned char hdr[SHARD_HEADER];
    memcpy(hdr, SHARD_MAGIC, 8);
    put_u32(hdr + 8, DDL_CHECKPOINT_FORMAT_VERSION);
    put_u32(hdr + 12, (uint32_t)rank);
    put_u32(hdr + 16, (uint32_t)size);
    put_u32(hdr + 20, (uint32_t)n);
    put_u64(hdr + 24, (uint64_t)step);
    bool ok = fwrite(hdr, 1, sizeof hdr, f) == sizeof hdr;
    for (int i = 0; i < n && ok; i++) {
        const ddl_named_tensor *x = &t[i];
        unsigned char           rec[4 + 4 + 2 * 8 * DDL_MAX_DIMS + 8];
        size_t                  len   = strlen(x->name);
        size_t                  bytes = ddl_tensor_bytes(x->local);
        put_u32(rec, (uint32_t)len);
        ok         = fwrite(rec, 1, 4, f) == 4 && fwrite(x->name, 1, len, f) == len;
        size_t pos = 0;
        put_u32(rec + pos, (uint32_t)x->local->dtype);
        put_u32(rec + pos + 4, (uint32_t)x->box.ndim);
        pos += 8;
        for (int d = 0; d < x->box.ndim; d++, pos += 8) {
            put_u64(rec + pos, (uint64_t)x->box.start[d]);
        }
        for (int d = 0; d < x->box.ndim; d++, pos += 8) {
            put_u64(rec + pos, (uint64_t)x->box.stop[d]);
        }
        put_u64(rec + pos, (uint64_t)bytes);
        pos += 8;
        ok = ok && fwrite(rec, 1, pos, f) == pos;
        ok = ok && (bytes == 0 || fwrite(x->local->data, 1, bytes, f) == bytes);
    }
    if (!ok) {
        return ddl__durable_fail(f, path, "checkpoint", errno);
    }
    return ddl__durable_commit(f, path);
}

// The manifest without its "shards" (rank 0): validates the user state and the tiling.
// jansson's *_set_new/_append_new steal their value even on failure (and fail on a NULL
// container), so `ok &= ...` without short-circuit neither leaks nor crashes on OOM.
static ddl_status manifest_begin(const ddl_checkpoint_meta *meta, int size, int n,
                                 const ddl_named_tensor *t, const ddl_box *table, json_t **out)
{
    char         why[512];
    json_error_t jerr;
    for (int i = 0; i < n; i++) {
        if (!ddl__boxes_tile(&t[i].global, size, table + i, (size_t)n, NULL, why, sizeof why)) {
            return ddl_set_error(DDL_EINVAL,
                                 "checkpoint: the boxes of '%s' do not tile its global shape: %s",
                                 t[i].name, why);
        }
        json_t *name = json_string(t[i].name);
        DDL_REQUIRE(name != NULL, DDL_EINVAL, "checkpoint: tensor name '%s' is not valid UTF-8",
                    t[i].name);
        json_decref(name);
    }
    json_t *user = json_object();
    if (meta->user_json != NULL) {
        json_decref(user);
        user = json_loads(meta->user_json, JSON_REJECT_DUPLICATES, &jerr);
        DDL_REQUIRE(user != NULL, DDL_EINVAL,
                    "checkpoint: user_json is not valid JSON: %s (line %d, column %d)", jerr.text,
                    jerr.line, jerr.column);
        if (!json_is_object(user)) {
            json_decref(user);
            return ddl_set_error(DDL_EINVAL, "checkpoint: user_json is not a JSON object");
        }
    }
    json_t *spec = json_string(meta->spec_json != NULL ? meta->spec_json : "");
    if (spec == NULL) {
        json_decref(user);
        return ddl_set_error(DDL_EINVAL, "checkpoint: spec_json is not valid UTF-8");
    }
    json_t *m   = json_object();
    json_t *arr = json_array();
    bool    ok  = true;
    ok &=
        json_object_set_new(m, "format_version", json_integer(DDL_CHECKPOINT_FORMAT_VERSION)) == 0;
    ok &= json_object_set_new(m, "world_size", json_integer(size)) == 0;
    ok &= json_object_set_new(m, "step", json_integer(meta->step)) == 0;
    ok &= json_object_set_new(m, "spec", spec) == 0;
    ok &= json_object_set_new(m, "user", user) == 0;
    ok &= json_object_set(m, "tensors", arr) == 0;
    for (int i = 0; i < n && ok; i++) {
        json_t *e     = json_object();
        json_t *shape = json_array();
        json_t *boxes = json_array();
        ok &= json_array_append_new(arr, e) == 0;
        ok &= json_object_set_new(e, "name", json_string(t[i].name)) == 0;
        ok &= json_object_set_new(e, "dtype", json_string(ddl_dtype_name(t[i].local->dtype))) == 0;
        ok &= json_object_set_new(e, "shape", shape) == 0;
        ok &= json_object_set_new(e, "boxes", boxes) == 0;
        for (int d = 0; d < t[i].global.ndim; d++) {
            ok &= json_array_append_new(shape, json_integer(t[i].global.d[d])) == 0;
        }
        for (int r = 0; r < size; r++) {
            const ddl_box *b     = &table[(size_t)r * n + i];
            json_t        *bo    = json_object();
            json_t        *start = json_array();
            json_t        *stop  = json_array();
            ok &= json_array_append_new(boxes, bo) == 0;
            ok &= json_object_set_new(bo, "start", start) == 0;
            ok &= json_object_set_new(bo, "stop", stop) == 0;
            for (int d = 0; d < b->ndim; d++) {
                ok &= json_array_append_new(start, json_integer(b->start[d])) == 0;
                ok &= json_array_append_new(stop, json_integer(b->stop[d])) == 0;
            }
        }
    }
    json_decref(arr);
    if (!ok) {
        json_decref(m);
        return ddl_set_error(DDL_ENOMEM, "checkpoint: out of memory building the manifest");
    }
    *out = m;
    return DDL_OK;
}

// Path of manifest.sha256 beside the manifest at mpath.
static ddl_status manifest_sum_path(const char *mpath, char *out)
{
    const char *slash = strrchr(mpath, '/');
    int         dlen  = slash != NULL ? (int)(slash - mpath) : 0;
    return ddl__path_fmt(out, CKPT_PATH_MAX, "%.*s%smanifest.sha256", dlen, mpath,
                         slash != NULL ? "/" : "");
}

// Writes manifest.sha256 (durably) for the manifest bytes just written to mpath, so the
// manifest itself is covered by a checksum like the shards it lists.
static ddl_status manifest_sum_write(const char *mpath, const char *bytes, size_t len)
{
    char path[CKPT_PATH_MAX], hex[65];
    DDL_CHECK(manifest_sum_path(mpath, path));
    DDL_CHECK(ddl_sha256_buffer(bytes, len, hex));
    FILE *f;
    DDL_CHECK(ddl__durable_open(path, &f));
    if (fprintf(f, "%s  manifest.json\n", hex) < 0) {
        return ddl__durable_fail(f, path, "checkpoint", errno);
    }
    return ddl__durable_commit(f, path);
}

// Adds "shards" to the manifest and writes it durably (rank 0).
static ddl_status manifest_write(json_t *m, int size, const char *hexes, const int64_t *bytes,
                                 const char *path)
{
    json_t *arr = json_array();
    bool    ok  = arr != NULL && json_object_set_new(m, "shards", arr) == 0;
    for (int r = 0; r < size && ok; r++) {
        char file[32];
        snprintf(file, sizeof file, "shard-%05d.bin", r);
        json_t *e = json_object();
        ok        = e != NULL && json_array_append_new(arr, e) == 0;
        ok        = ok && json_object_set_new(e, "file", json_string(file)) == 0;
        ok = ok && json_object_set_new(e, "sha256", json_string(hexes + 65 * (size_t)r)) == 0;
        ok = ok && json_object_set_new(e, "bytes", json_integer(bytes[r])) == 0;
    }
    char *text = ok ? json_dumps(m, JSON_INDENT(1)) : NULL;
    DDL_REQUIRE(text != NULL, DDL_ENOMEM, "checkpoint: out of memory writing the manifest");
    size_t len = strlen(text);
    text[len]  = '\n'; // the file's bytes: the JSON and a newline (NUL dropped, length kept)
    FILE      *f;
    ddl_status st = ddl__durable_open(path, &f);
    if (st == DDL_OK) {
        if (fwrite(text, 1, len + 1, f) != len + 1) {
            st = ddl__durable_fail(f, path, "checkpoint", errno);
        } else {
            st = ddl__durable_commit(f, path);
        }
    }
    if (st == DDL_OK) {
        st = manifest_sum_write(path, text, len + 1);
    }
    free(text); // json_dumps allocates with malloc
    return st;
}

// Moves the complete staging directory to its final name (rank 0). An existing step
// directory of the same step is exchanged atomically, so `latest` never names a missing
// or partial directory; the old one ends up at `staging` and is removed.
static ddl_status publish_step(const char *root, const char *staging, const char *final)
{
    struct stat sb;
    if (lstat(final, &sb) != 0) {
        DDL_REQUIRE(rename(staging, final) == 0, DDL_EIO, "checkpoint: cannot rename %s to %s: %s",
                    staging, final, strerror(errno));
        return ddl__fsync_dir(root);
    }
    if (renameat2(AT_FDCWD, staging, AT_FDCWD, final, RENAME_EXCHANGE) != 0) {
        // No atomic exchange on this file system: move the old directory aside first
        // (a crash in between leaves `latest` naming a missing directory of step S).
        char old[CKPT_PATH_MAX];
        DDL_CHECK(ddl__path_fmt(old, sizeof old, "%s.old", final));
        DDL_CHECK(remove_flat_dir(old));
        DDL_REQUIRE(rename(final, old) == 0 && rename(staging, final) == 0, DDL_EIO,
                    "checkpoint: cannot replace %s: %s", final, strerror(errno));
        DDL_CHECK(ddl__fsync_dir(root));
        if (remove_flat_dir(old) != DDL_OK) {
            ddl_log(DDL_LOG_WARN, "checkpoint: %s", ddl_last_error());
        }
        return DDL_OK;
    }
    DDL_CHECK(ddl__fsync_dir(root));
    if (remove_flat_dir(staging) != DDL_OK) {
        ddl_log(DDL_LOG_WARN, "checkpoint: replaced an older %s but could not remove it: %s", final,
                ddl_last_error());
    }
    return DDL_OK;
}

static ddl_status write_latest(const char *root, const char *step_name)
{
    char path[CKPT_PATH_MAX];
    DDL_CHECK(ddl__path_fmt(path, sizeof path, "%s/latest", root));
    FILE *f;
    DDL_CHECK(ddl__durable_open(path, &f));
    if (fprintf(f, "%s\n", step_name) < 0) {
        return ddl__durable_fail(f, path, "checkpoint", errno);
    }
    return ddl__durable_commit(f, path);
}

// Creates the root and an empty staging directory (rank 0).
static ddl_status prepare_dirs(const char *root, const char *staging)
{
    DDL_CHECK(ddl__mkdir_p(root));
    DDL_CHECK(remove_flat_dir(staging));
    DDL_REQUIRE(mkdir(staging, 0777) == 0, ddl__write_errno_status(errno),
                "checkpoint: cannot create %s: %s", staging, strerror(errno));
    return ddl__fsync_dir(root);
}

ddl_status ddl_checkpoint_save(MPI_Comm comm, const char *dir, const ddl_checkpoint_meta *meta,
                               int n, const ddl_named_tensor *tensors)
{
    int rank, size;
    DDL_CHECK_MPI(MPI_Comm_rank(comm, &rank));
    DDL_CHECK_MPI(MPI_Comm_size(comm, &size));
    char       step_name[32], final[CKPT_PATH_MAX], staging[CKPT_PATH_MAX], shard[CKPT_PATH_MAX];
    char       manifest_path[CKPT_PATH_MAX];
    ddl_status st = DDL_OK;
    if (dir == NULL || dir[0] == '\0' || meta == NULL) {
        st = ddl_set_error(DDL_EINVAL, "checkpoint: NULL or empty directory, or NULL meta");
    } else if (meta->step < 0) {
        st = ddl_set_error(DDL_EINVAL, "checkpoint: negative step %lld", (long long)meta->step);
    } else {
        st = ddl__check_named("checkpoint", n, tensors);
    }
    if (st == DDL_OK) {
        snprintf(step_name, sizeof step_name, "step-%09lld", (long long)meta->step);
        st = ddl__path_fmt(final, sizeof final, "%s/%s", dir, step_name);
    }
    if (st == DDL_OK) {
        st = ddl__path_fmt(staging, sizeof staging, "%s.partial", final);
    }
    if (st == DDL_OK) {
        st = ddl__path_fmt(shard, sizeof shard, "%s/shard-%05d.bin", staging, rank);
    }
    if (st == DDL_OK) {
        st = ddl__path_fmt(manifest_path, sizeof manifest_path, "%s/manifest.json", staging);
    }
    DDL_CHECK(ddl_agree(comm, st));
    DDL_CHECK(ddl__check_same_list(comm, "checkpoint", n, tensors, meta->step));

    // 1. Rank 0 checks the layout and user state and prepares an empty staging directory.
    ddl_box *table    = NULL;
    json_t  *manifest = NULL;
    char    *hexes    = NULL;
    int64_t *bytes    = NULL;
    bool     staged   = false;
    char     hex[65]  = {0};
    int64_t  nbytes   = 0;
    st                = ddl__gather_box_table(comm, n, tensors, &table);
    if (rank == 0 && st == DDL_OK) {
        st = manifest_begin(meta, size, n, tensors, table, &manifest);
        if (st == DDL_OK) {
            hexes = ddl_calloc((size_t)size, 65);
            bytes = ddl_calloc((size_t)size, sizeof *bytes);
            if (hexes == NULL || bytes == NULL) {
                st = ddl_set_error(DDL_ENOMEM, "checkpoint: out of memory");
            }
        }
        if (st == DDL_OK) {
            st     = prepare_dirs(dir, staging);
            staged = true;
        }
    }
    st = ddl_agree(comm, st);
    if (st != DDL_OK) {
        goto done;
    }
    ddl_fault_point("checkpoint.staged", rank);

    // 2. Every rank writes and hashes its shard.
    st = write_shard(shard, rank, size, meta->step, n, tensors);
    if (st == DDL_OK) {
        st = ddl_sha256_file(shard, hex);
    }
    if (st == DDL_OK) {
        struct stat sb;
        if (stat(shard, &sb) == 0) {
            nbytes = (int64_t)sb.st_size;
        } else {
            st = ddl_set_error(DDL_EIO, "checkpoint: cannot stat %s: %s", shard, strerror(errno));
        }
    }
    ddl_fault_point("checkpoint.shard", rank);
    st = ddl_agree(comm, st);
    if (st != DDL_OK) {
        goto done;
    }

    // 3. Rank 0 records the digests in the manifest, publishes the step, moves `latest`.
    int rc1 = MPI_Gather(hex, 65, MPI_CHAR, hexes, 65, MPI_CHAR, 0, comm);
    int rc2 = MPI_Gather(&nbytes, 1, MPI_INT64_T, bytes, 1, MPI_INT64_T, 0, comm);
    if (rc1 != MPI_SUCCESS || rc2 != MPI_SUCCESS) {
        st = ddl_set_error(DDL_EMPI, "checkpoint: MPI_Gather of the shard digests failed");
    }
    if (rank == 0 && st == DDL_OK) {
        st = manifest_write(manifest, size, hexes, bytes, manifest_path);
        if (st == DDL_OK) {
            ddl_fault_point("checkpoint.manifest", rank);
            st = publish_step(dir, staging, final);
        }
        if (st == DDL_OK) {
            ddl_fault_point("checkpoint.publish", rank);
            st = write_latest(dir, step_name);
        }
    }
    if (st == DDL_OK) {
        ddl_fault_point("checkpoint.done", rank);
    }
    st = ddl_agree(comm, st);

done:
    if (st != DDL_OK && rank == 0 && staged) {
        char keep[CKPT_MSG_MAX];
        snprintf(keep, sizeof keep, "%s", ddl_last_error());
        remove_flat_dir(staging); // best effort; the next save of this step retries
        ddl_set_error(st, "%s", keep);
    }
    json_decref(manifest);
    ddl_free(table);
    ddl_free(hexes);
    ddl_free(bytes);
    return st;
}

// ---- manifest parsing and validation -------------------------------------------

typedef struct ckpt_tensor {
    const char *name; // points into the manifest's JSON
    ddl_dtype   dtype;
    ddl_shape   shape;
    ddl_box    *boxes; // world_size boxes, by writing rank
    int        *owner; // owner[r]: lowest rank writing the same box as r; -1 if empty
} ckpt_tensor;

typedef struct ckpt_manifest {
    json_t      *root;
    int          world;
    int64_t      step;
    const char  *spec;
    json_t      *user;
    int          n;
    ckpt_tensor *t;
    ddl_box     *box_mem;
    int         *owner_mem;
    char        *sha;   // world * 65
    int64_t     *bytes; // world
} ckpt_manifest;

static void manifest_free(ckpt_manifest *m)
{
    json_decref(m->root);
    ddl_free(m->t);
    ddl_free(m->box_mem);
    ddl_free(m->owner_mem);
    ddl_free(m->sha);
    ddl_free(m->bytes);
    memset(m, 0, sizeof *m);
}

static ddl_status corrupt(const char *file, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static ddl_status corrupt(const char *file, const char *fmt, ...)
{
    char    msg[CKPT_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ddl_set_error(DDL_ECORRUPT, "%s: %s", file, msg);
}

static const char *json_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a real";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    case JSON_NULL:
        return "null";
    }
    return "unknown";
}

// Fetches obj[key] and checks its JSON type; ctx names the object ("tensors[2]").
static ddl_status field(const char *file, const json_t *obj, const char *ctx, const char *key,
                        json_type want, const char *want_name, json_t **out)
{
    json_t *v = json_object_get(obj, key);
    if (v == NULL) {
        return corrupt(file, "%s%s\"%s\" is missing", ctx, ctx[0] ? "." : "", key);
    }
    if (json_typeof(v) != want) {
        return corrupt(file, "%s%s\"%s\" is %s, expected %s", ctx, ctx[0] ? "." : "", key,
                       json_kind(v), want_name);
    }
    *out = v;
    return DDL_OK;
}

static ddl_status int_field(const char *file, const json_t *obj, const char *ctx, const char *key,
                            int64_t lo, int64_t hi, int64_t *out)
{
    json_t *v = NULL;
    DDL_CHECK(field(file, obj, ctx, key, JSON_INTEGER, "an integer", &v));
    int64_t x = (int64_t)json_integer_value(v);
    if (x < lo || x > hi) {
        return corrupt(file, "%s%s\"%s\" = %lld is outside [%lld, %lld]", ctx, ctx[0] ? "." : "",
                       key, (long long)x, (long long)lo, (long long)hi);
    }
    *out = x;
    return DDL_OK;
}

// An array of `want` (>= 0) non-negative integers (want < 0: up to DDL_MAX_DIMS, count
// in *count).
static ddl_status index_array(const char *file, const json_t *obj, const char *ctx, const char *key,
                              int want, int64_t *out, int *count)
{
    json_t *arr = NULL;
    DDL_CHECK(field(file, obj, ctx, key, JSON_ARRAY, "an array", &arr));
    size_t len = json_array_size(arr);
    if ((want >= 0 && len != (size_t)want) || len > DDL_MAX_DIMS) {
        return corrupt(file, "%s.\"%s\" has %zu entries, expected %d", ctx, key, len,
                       want >= 0 ? want : DDL_MAX_DIMS);
    }
    for (size_t i = 0; i < len; i++) {
        json_t *v = json_array_get(arr, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0) {
            return corrupt(file, "%s.\"%s\"[%zu] is %s, expected a non-negative integer", ctx, key,
                           i, json_is_integer(v) ? "negative" : json_kind(v));
        }
        out[i] = (int64_t)json_integer_value(v);
    }
    if (count != NULL) {
        *count = (int)len;
    }
    return DDL_OK;
}

static bool is_hex64(const char *s)
{
    for (int i = 0; i < 64; i++) {
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) {
            return false;
        }
    }
    return s[64] == '\0';
}

static ddl_status parse_tensor(const char *file, ckpt_manifest *m, int i, const json_t *e)
{
    char ctx[64], why[512];
    snprintf(ctx, sizeof ctx, "tensors[%d]", i);
    if (!json_is_object(e)) {
        return corrupt(file, "%s is %s, expected an object", ctx, json_kind(e));
    }
    ckpt_tensor *t = &m->t[i];
    json_t      *v = NULL;
    DDL_CHECK(field(file, e, ctx, "name", JSON_STRING, "a string", &v));
    t->name = json_string_value(v);
    if (t->name[0] == '\0' || strlen(t->name) > CKPT_NAME_MAX) {
        return corrupt(file, "%s.\"name\" is empty or longer than %d bytes", ctx, CKPT_NAME_MAX);
    }
    for (int j = 0; j < i; j++) {
        if (strcmp(m->t[j].name, t->name) == 0) {
            return corrupt(file, "tensor '%s' is listed twice", t->name);
        }
    }
    DDL_CHECK(field(file, e, ctx, "dtype", JSON_STRING, "a string", &v));
    if (strcmp(json_string_value(v), "f32") == 0) {
        t->dtype = DDL_F32;
    } else if (strcmp(json_string_value(v), "f64") == 0) {
        t->dtype = DDL_F64;
    } else {
        return corrupt(file, "%s.\"dtype\" is \"%.32s\", expected \"f32\" or \"f64\"", ctx,
                       json_string_value(v));
    }
    DDL_CHECK(index_array(file, e, ctx, "shape", -1, t->shape.d, &t->shape.ndim));
    int64_t numel;
    if (ddl_shape_numel_checked(&t->shape, &numel) != DDL_OK) {
        return corrupt(file, "%s.\"shape\" has more than 2^34 elements (DDL_MAX_TENSOR_ELEMENTS)",
                       ctx);
    }
    json_t *boxes = NULL;
    DDL_CHECK(field(file, e, ctx, "boxes", JSON_ARRAY, "an array", &boxes));
    if (json_array_size(boxes) != (size_t)m->world) {
        return corrupt(file, "%s.\"boxes\" has %zu entries, expected world_size %d", ctx,
                       json_array_size(boxes), m->world);
    }
    for (int r = 0; r < m->world; r++) {
        char    bctx[96];
        json_t *b = json_array_get(boxes, (size_t)r);
        snprintf(bctx, sizeof bctx, "%s.boxes[%d]", ctx, r);
        if (!json_is_object(b)) {
            return corrupt(file, "%s is %s, expected an object", bctx, json_kind(b));
        }
        ddl_box *x = &t->boxes[r];
        x->ndim    = t->shape.ndim;
        DDL_CHECK(index_array(file, b, bctx, "start", x->ndim, x->start, NULL));
        DDL_CHECK(index_array(file, b, bctx, "stop", x->ndim, x->stop, NULL));
        for (int d = 0; d < x->ndim; d++) {
            if (x->start[d] > x->stop[d] || x->stop[d] > t->shape.d[d]) {
                return corrupt(file, "%s lies outside the shape of '%s'", bctx, t->name);
            }
        }
    }
    if (!ddl__boxes_tile(&t->shape, m->world, t->boxes, 1, t->owner, why, sizeof why)) {
        return corrupt(file, "the boxes of '%s' do not tile its shape: %s", t->name, why);
    }
    return DDL_OK;
}

// Parses and validates the whole manifest (every rank does it on the same text).
static ddl_status manifest_parse(const char *file, const char *text, size_t len, ckpt_manifest *m)
{
    memset(m, 0, sizeof *m);
    json_error_t jerr;
    m->root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (m->root == NULL) {
        return corrupt(file, "invalid JSON at line %d, column %d: %s", jerr.line, jerr.column,
                       jerr.text);
    }
    if (!json_is_object(m->root)) {
        return corrupt(file, "the top level is %s, expected an object", json_kind(m->root));
    }
    int64_t v = 0;
    json_t *j = NULL;
    DDL_CHECK(int_field(file, m->root, "", "format_version", 0, INT32_MAX, &v));
    if (v != DDL_CHECKPOINT_FORMAT_VERSION) {
        return corrupt(file, "format_version %lld is not supported (this build reads %d)",
                       (long long)v, DDL_CHECKPOINT_FORMAT_VERSION);
    }
    DDL_CHECK(int_field(file, m->root, "", "world_size", 1, CKPT_WORLD_MAX, &v));
    m->world = (int)v;
    DDL_CHECK(int_field(file, m->root, "", "step", 0, INT64_MAX, &m->step));
    DDL_CHECK(field(file, m->root, "", "spec", JSON_STRING, "a string", &j));
    m->spec = json_string_value(j);
    DDL_CHECK(field(file, m->root, "", "user", JSON_OBJECT, "an object", &m->user));
    json_t *tensors = NULL, *shards = NULL;
    DDL_CHECK(field(file, m->root, "", "tensors", JSON_ARRAY, "an array", &tensors));
    DDL_CHECK(field(file, m->root, "", "shards", JSON_ARRAY, "an array", &shards));
    if (json_array_size(tensors) > INT_MAX / 2) {
        return corrupt(file, "too many tensors");
    }
    // Every count is checked against the text before anything is allocated for it: a
    // manifest claiming a world of 2^20 ranks must list 2^20 shards and 2^20 boxes per
    // tensor, so the tables below stay proportional to the manifest's own size.
    if (json_array_size(shards) != (size_t)m->world) {
        return corrupt(file, "\"shards\" has %zu entries, expected world_size %d",
                       json_array_size(shards), m->world);
    }
    // Every tensor, not only those with a "boxes" array: tensors without one made the
    // box tables n x world from a text of n + world entries (a 72 KB manifest asked for
    // 20 GB; found by tests/fuzz/fuzz_manifest).
    for (size_t i = 0; i < json_array_size(tensors); i++) {
        json_t *e     = json_array_get(tensors, i);
        json_t *boxes = json_object_get(e, "boxes");
        if (!json_is_object(e)) {
            return corrupt(file, "tensors[%zu] is %s, expected an object", i, json_kind(e));
        }
        if (boxes == NULL) {
            return corrupt(file, "tensors[%zu].\"boxes\" is missing", i);
        }
        if (!json_is_array(boxes)) {
            return corrupt(file, "tensors[%zu].\"boxes\" is %s, expected an array", i,
                           json_kind(boxes));
        }
        if (json_array_size(boxes) != (size_t)m->world) {
            return corrupt(file, "tensors[%zu].\"boxes\" has %zu entries, expected world_size %d",
                           i, json_array_size(boxes), m->world);
        }
    }
    m->n         = (int)json_array_size(tensors);
    size_t nb    = (size_t)m->n * (size_t)m->world;
    m->t         = ddl_calloc((size_t)m->n + 1, sizeof *m->t);
    m->box_mem   = ddl_calloc(nb + 1, sizeof *m->box_mem);
    m->owner_mem = ddl_calloc(nb + 1, sizeof *m->owner_mem);
    m->sha       = ddl_calloc((size_t)m->world, 65);
    m->bytes     = ddl_calloc((size_t)m->world, sizeof *m->bytes);
    DDL_REQUIRE(m->t != NULL && m->box_mem != NULL && m->owner_mem != NULL && m->sha != NULL &&
                    m->bytes != NULL,
                DDL_ENOMEM, "checkpoint: out of memory reading %s", file);
    for (int i = 0; i < m->n; i++) {
        m->t[i].boxes = m->box_mem + (size_t)i * m->world;
        m->t[i].owner = m->owner_mem + (size_t)i * m->world;
        DDL_CHECK(parse_tensor(file, m, i, json_array_get(tensors, (size_t)i)));
    }
    if (json_array_size(shards) != (size_t)m->world) {
        return corrupt(file, "\"shards\" has %zu entries, expected world_size %d",
                       json_array_size(shards), m->world);
    }
    for (int r = 0; r < m->world; r++) {
        char    ctx[32], want[32];
        json_t *e = json_array_get(shards, (size_t)r);
        snprintf(ctx, sizeof ctx, "shards[%d]", r);
        snprintf(want, sizeof want, "shard-%05d.bin", r);
        if (!json_is_object(e)) {
            return corrupt(file, "%s is %s, expected an object", ctx, json_kind(e));
        }
        DDL_CHECK(field(file, e, ctx, "file", JSON_STRING, "a string", &j));
        if (strcmp(json_string_value(j), want) != 0) {
            return corrupt(file, "%s.\"file\" is \"%.64s\", expected \"%s\"", ctx,
                           json_string_value(j), want);
        }
        DDL_CHECK(field(file, e, ctx, "sha256", JSON_STRING, "a string", &j));
        if (!is_hex64(json_string_value(j))) {
            return corrupt(file, "%s.\"sha256\" is not 64 lowercase hex digits", ctx);
        }
        memcpy(m->sha + 65 * (size_t)r, json_string_value(j), 65);
        DDL_CHECK(int_field(file, e, ctx, "bytes", SHARD_HEADER, INT64_MAX, &m->bytes[r]));
    }
    return DDL_OK;
}

ddl_status ddl__checkpoint_manifest_check(const char *file, const char *text, size_t len)
{
    ckpt_manifest m;
    ddl_status    st = manifest_parse(file, text, len, &m);
    manifest_free(&m);
    return st;
}

// ---- load ------------------------------------------------------------------------

// Opens a regular file for reading without ever blocking (a FIFO put in place of a
// manifest would block rank 0 in open); anything else is refused as corrupt.
static ddl_status open_regular(const char *path, FILE **out)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        return corrupt(path, "cannot open: %s", strerror(errno));
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return corrupt(path, "not a regular file");
    }
    *out = fdopen(fd, "rb");
    if (*out == NULL) {
        close(fd);
        return corrupt(path, "cannot open: %s", strerror(errno));
    }
    return DDL_OK;
}

static ddl_status read_text(const char *path, int64_t max, char **out, int64_t *len)
{
    FILE *f = NULL;
    DDL_CHECK(open_regular(path, &f));
    ddl_status st   = DDL_OK;
    long       size = -1;
    if (fseek(f, 0, SEEK_END) == 0) {
        size = ftell(f);
    }
    if (size < 0 || size > max || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return corrupt(path, "unreadable or larger than %lld bytes", (long long)max);
    }
    *out = ddl_malloc((size_t)size + 1);
    if (*out == NULL) {
        st = ddl_set_error(DDL_ENOMEM, "checkpoint: out of memory reading %s", path);
    } else if (fread(*out, 1, (size_t)size, f) != (size_t)size) {
        st = corrupt(path, "short read");
    } else {
        (*out)[size] = '\0';
        *len         = size;
    }
    fclose(f);
    if (st != DDL_OK) {
        ddl_free(*out);
        *out = NULL;
    }
    return st;
}

static bool exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

// Checks the manifest's bytes against manifest.sha256 beside it (rank 0): a bit flip
// anywhere in the manifest, the spec text included, is refused before it is parsed.
static ddl_status manifest_sum_check(const char *mpath, const char *text, int64_t len)
{
    char path[CKPT_PATH_MAX], hex[65];
    DDL_CHECK(manifest_sum_path(mpath, path));
    if (!exists(path)) {
        return corrupt(path, "missing: the manifest is not covered by a checksum (written by "
                             "an older build, or damaged)");
    }
    char   *sum = NULL;
    int64_t n   = 0;
    DDL_CHECK(read_text(path, MANIFEST_SUM_MAX, &sum, &n));
    // Exactly "<64 lowercase hex>  manifest.json" and an optional newline.
    static const char tail[] = "  manifest.json";
    if (n > 0 && sum[n - 1] == '\n') {
        sum[--n] = '\0';
    }
    bool ok = n == 64 + (int64_t)strlen(tail) && strcmp(sum + 64, tail) == 0;
    if (ok) {
        sum[64] = '\0';
        ok      = is_hex64(sum);
    }
    ddl_status st = ok ? ddl_sha256_buffer(text, (size_t)len, hex)
                       : corrupt(path, "is not \"<64 hex digits>  manifest.json\"");
    if (st == DDL_OK && strcmp(hex, sum) != 0) {
        st = corrupt(mpath, "SHA-256 %s does not match manifest.sha256 (%s): the manifest was "
                            "modified or damaged",
                     hex, sum);
    }
    ddl_free(sum);
    return st;
}

// The newest step-<digits> directory under root whose manifest verifies against its
// checksum, for a root whose `latest` is missing (rank 0). ENOTFOUND if there is none.
static ddl_status newest_step(const char *root, char *stepdir, size_t cap, int64_t *step)
{
    DIR *d = opendir(root);
    if (d == NULL) {
        return ddl_set_error(DDL_ENOTFOUND, "checkpoint: no checkpoint at %s: %s", root,
                             strerror(errno));
    }
    int64_t        tried = -1, best = -1;
    struct dirent *e;
    // Candidates newest first: repeat the scan for the next lower step (step counts are
    // small; a directory listing is cheap next to verifying a checkpoint).
    for (;;) {
        int64_t next = -1;
        rewinddir(d);
        while ((e = readdir(d)) != NULL) {
            const char *nm = e->d_name;
            size_t      ln = strlen(nm);
            bool        ok = ln > 5 && ln <= 5 + 18 && strncmp(nm, "step-", 5) == 0;
            for (size_t i = 5; i < ln && ok; i++) {
                ok = nm[i] >= '0' && nm[i] <= '9';
            }
            int64_t v = ok ? strtoll(nm + 5, NULL, 10) : -1;
            if (ok && v > next && (tried < 0 || v < tried)) {
                next = v;
            }
        }
        if (next < 0) {
            break;
        }
        tried = next;
        char    dir[CKPT_PATH_MAX], mpath[CKPT_PATH_MAX];
        char   *text = NULL;
        int64_t len  = 0;
        if (ddl__path_fmt(dir, sizeof dir, "%s/step-%09lld", root, (long long)next) != DDL_OK ||
            ddl__path_fmt(mpath, sizeof mpath, "%s/manifest.json", dir) != DDL_OK) {
            continue;
        }
        if (exists(mpath) && read_text(mpath, MANIFEST_MAX, &text, &len) == DDL_OK &&
            manifest_sum_check(mpath, text, len) == DDL_OK) {
            best = next;
            ddl_free(text);
            break;
        }
        ddl_free(text);
        ddl_log(DDL_LOG_WARN, "checkpoint: %s has no latest; skipping step-%09lld: %s", root,
                (long long)next, ddl_last_error());
    }
    closedir(d);
    if (best < 0) {
        return ddl_set_error(DDL_ENOTFOUND,
                             "checkpoint: no checkpoint at %s (no latest, no manifest.json, "
                             "no step directory with a verified manifest)",
                             root);
    }
    ddl_log(DDL_LOG_WARN,
            "checkpoint: %s/latest is missing; resuming from the newest verified step "
            "directory, step-%09lld",
            root, (long long)best);
    *step = best;
    return ddl__path_fmt(stepdir, cap, "%s/step-%09lld", root, (long long)best);
}

// Resolves a root (with `latest`) or a step directory to the step directory (rank 0).
// *expect receives the step named by `latest`, or -1.
static ddl_status resolve(const char *path, char *stepdir, size_t cap, int64_t *expect)
{
    char latest[CKPT_PATH_MAX], manifest[CKPT_PATH_MAX];
    DDL_CHECK(ddl__path_fmt(latest, sizeof latest, "%s/latest", path));
    DDL_CHECK(ddl__path_fmt(manifest, sizeof manifest, "%s/manifest.json", path));
    *expect = -1;
    if (!exists(latest)) {
        if (!exists(manifest)) {
            return newest_step(path, stepdir, cap, expect);
        }
        return ddl__path_fmt(stepdir, cap, "%s", path);
    }
    char   *text = NULL;
    int64_t len  = 0;
    DDL_CHECK(read_text(latest, LATEST_MAX, &text, &len));
    // Exactly "step-<digits>" and an optional newline.
    if (len > 0 && text[len - 1] == '\n') {
        text[--len] = '\0';
    }
    bool ok = len > 5 && strncmp(text, "step-", 5) == 0 && len <= 5 + 18;
    for (int64_t i = 5; i < len && ok; i++) {
        ok = text[i] >= '0' && text[i] <= '9';
    }
    ddl_status st = DDL_OK;
    if (!ok) {
        st = corrupt(latest, "does not hold a step directory name (\"step-<digits>\")");
    } else {
        *expect = strtoll(text + 5, NULL, 10);
        st      = ddl__path_fmt(stepdir, cap, "%s/%s", path, text);
    }
    if (st == DDL_OK) {
        st = ddl__path_fmt(manifest, sizeof manifest, "%s/manifest.json", stepdir);
    }
    if (st == DDL_OK && !exists(manifest)) {
        st = corrupt(latest, "names %s, but %s is missing", text, manifest);
    }
    ddl_free(text);
    return st;
}

// Size and SHA-256 of shard r against the manifest.
static ddl_status verify_shard(const char *stepdir, const ckpt_manifest *m, int r)
{
    char path[CKPT_PATH_MAX], hex[65];
    DDL_CHECK(ddl__path_fmt(path, sizeof path, "%s/shard-%05d.bin", stepdir, r));
    struct stat sb;
    if (stat(path, &sb) != 0) {
        return corrupt(path, "%s (listed in manifest.json)",
                       errno == ENOENT ? "missing" : strerror(errno));
    }
    if ((int64_t)sb.st_size != m->bytes[r]) {
        return corrupt(path, "%lld bytes, manifest.json records %lld (truncated or overwritten)",
                       (long long)sb.st_size, (long long)m->bytes[r]);
    }
    ddl_status st = ddl_sha256_file(path, hex);
    if (st == DDL_ENOMEM) {
        return st; // our failure, not the file's
    }
    if (st != DDL_OK) {
        return corrupt(path, "cannot hash: %s", ddl_last_error());
    }
    if (strcmp(hex, m->sha + 65 * (size_t)r) != 0) {
        return corrupt(path, "SHA-256 %s does not match manifest.json (%s)", hex,
                       m->sha + 65 * (size_t)r);
    }
    return DDL_OK;
}

// Does request i (manifest tensor idx[i]) need the box written by rank r?
static bool needs(const ckpt_manifest *m, const ddl_named_tensor *req, const int *idx, int i, int r)
{
    const ckpt_tensor *t = &m->t[idx[i]];
    ddl_box            common;
    return t->owner[r] == r && ddl_box_intersect(&t->boxes[r], &req[i].box, &common);
}

// Reads shard r's records and copies every needed intersection into the staging tensors.
// The shard's checksum has been verified; its structure is checked against the manifest.
static ddl_status read_shard(const char *stepdir, const ckpt_manifest *m, int r, int n,
                             const ddl_named_tensor *req, const int *idx, ddl_tensor_t **stage)
{
    char path[CKPT_PATH_MAX];
    DDL_CHECK(ddl__path_fmt(path, sizeof path, "%s/shard-%05d.bin", stepdir, r));
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return corrupt(path, "cannot open: %s", strerror(errno));
    }
    ddl_status    st  = DDL_OK;
    void         *buf = NULL;
    unsigned char hdr[SHARD_HEADER];
    char          name[CKPT_NAME_MAX + 1];
    if (fread(hdr, 1, sizeof hdr, f) != sizeof hdr || memcmp(hdr, SHARD_MAGIC, 8) != 0) {
        st = corrupt(path, "bad shard header (magic)");
        goto done;
    }
    if (get_u32(hdr + 8) != DDL_CHECKPOINT_FORMAT_VERSION || get_u32(hdr + 12) != (uint32_t)r ||
        get_u32(hdr + 16) != (uint32_t)m->world || get_u32(hdr + 20) != (uint32_t)m->n ||
        (int64_t)get_u64(hdr + 24) != m->step) {
        st = corrupt(path, "shard header (version, rank, world size, count, step) disagrees "
                           "with manifest.json");
        goto done;
    }
    for (int k = 0; k < m->n; k++) {
        const ckpt_tensor *t = &m->t[k];
        const ddl_box     *b = &t->boxes[r];
        unsigned char      rec[4 + 4 + 2 * 8 * DDL_MAX_DIMS + 8];
        size_t             len  = strlen(t->name);
        size_t             want = 8 + 16 * (size_t)b->ndim + 8;
        bool               ok   = fread(rec, 1, 4, f) == 4 && get_u32(rec) == len &&
                  fread(name, 1, len, f) == len && memcmp(name, t->name, len) == 0 &&
                  fread(rec, 1, want, f) == want && get_u32(rec) == (uint32_t)t->dtype &&
                  get_u32(rec + 4) == (uint32_t)b->ndim;
        for (int d = 0; d < b->ndim && ok; d++) {
            ok = (int64_t)get_u64(rec + 8 + 8 * d) == b->start[d] &&
                 (int64_t)get_u64(rec + 8 + 8 * (b->ndim + d)) == b->stop[d];
        }
        size_t bytes = (size_t)ddl_box_numel(b) * ddl_dtype_size(t->dtype);
        if (!ok || get_u64(rec + 8 + 16 * b->ndim) != bytes) {
            st = corrupt(path, "record %d ('%s') disagrees with manifest.json", k, t->name);
            goto done;
        }
        bool wanted = false;
        for (int i = 0; i < n && !wanted; i++) {
            wanted = idx[i] == k && needs(m, req, idx, i, r);
        }
        if (!wanted) {
            if (fseeko(f, (off_t)bytes, SEEK_CUR) != 0) {
                st = corrupt(path, "cannot seek past record %d", k);
                goto done;
            }
            continue;
        }
        buf = ddl_malloc(bytes);
        if (buf == NULL) {
            st = ddl_set_error(DDL_ENOMEM, "checkpoint: out of memory reading %s", path);
            goto done;
        }
        if (fread(buf, 1, bytes, f) != bytes) {
            st = corrupt(path, "short read in record %d ('%s')", k, t->name);
            goto done;
        }
        ddl_tensor_t piece = {.dtype = t->dtype, .shape = ddl_box_shape(b), .data = buf};
        for (int i = 0; i < n; i++) {
            ddl_box common;
            if (idx[i] != k || !needs(m, req, idx, i, r)) {
                continue;
            }
            ddl_box_intersect(b, &req[i].box, &common);
            ddl_box from = ddl_box_shift(&common, b->start, 1);
            ddl_box to   = ddl_box_shift(&common, req[i].box.start, 1);
            ddl_tensor_copy_box(&piece, &from, stage[i], &to);
        }
        ddl_free(buf);
        buf = NULL;
    }
    if (fgetc(f) != EOF) {
        st = corrupt(path, "trailing bytes after the last record");
    }
done:
    ddl_free(buf);
    fclose(f);
    return st;
}

// Rank 0 resolves the path and reads the manifest; every rank receives the text and the
// step directory.
static ddl_status fetch_manifest(MPI_Comm comm, int rank, const char *path, char *stepdir,
                                 char *mpath, int64_t *expect, char **text, int64_t *len)
{
    ddl_status st = DDL_OK;
    *text         = NULL;
    *len          = 0;
    if (rank == 0) {
        st = resolve(path, stepdir, CKPT_PATH_MAX, expect);
        if (st == DDL_OK) {
            st = ddl__path_fmt(mpath, CKPT_PATH_MAX, "%s/manifest.json", stepdir);
        }
        if (st == DDL_OK) {
            st = read_text(mpath, MANIFEST_MAX, text, len);
        }
        if (st == DDL_OK) {
            st = manifest_sum_check(mpath, *text, *len);
        }
    }
    st = ddl_agree(comm, st);
    if (st != DDL_OK) {
        ddl_free(*text); // read, but its checksum failed
        *text = NULL;
        return st;
    }
    int64_t head[2] = {*expect, *len};
    DDL_CHECK_MPI(MPI_Bcast(head, 2, MPI_INT64_T, 0, comm));
    DDL_CHECK_MPI(MPI_Bcast(stepdir, CKPT_PATH_MAX, MPI_CHAR, 0, comm));
    DDL_CHECK_MPI(MPI_Bcast(mpath, CKPT_PATH_MAX, MPI_CHAR, 0, comm));
    *expect = head[0];
    *len    = head[1];
    if (rank != 0) {
        *text = ddl_malloc((size_t)*len + 1);
        st    = *text != NULL
                    ? DDL_OK
                    : ddl_set_error(DDL_ENOMEM, "checkpoint: out of memory for the manifest");
    }
    st = ddl_agree(comm, st);
    if (st == DDL_OK) {
        int rc = MPI_Bcast(*text, (int)*len + 1, MPI_CHAR, 0, comm);
        st     = rc == MPI_SUCCESS
                     ? DDL_OK
                     : ddl_set_error(DDL_EMPI, "checkpoint: MPI_Bcast of the manifest failed");
    }
    if (st != DDL_OK) {
        ddl_free(*text);
        *text = NULL;
    }
    return st;
}

// Matches every request to a manifest tensor (idx) and checks dtype and global shape.
static ddl_status match_requests(const ckpt_manifest *m, const char *mpath, int n,
                                 const ddl_named_tensor *req, int *idx)
{
    for (int i = 0; i < n; i++) {
        idx[i] = -1;
        for (int k = 0; k < m->n && idx[i] < 0; k++) {
            if (strcmp(m->t[k].name, req[i].name) == 0) {
                idx[i] = k;
            }
        }
        DDL_REQUIRE(idx[i] >= 0, DDL_EINVAL, "checkpoint load: tensor '%s' is not in %s",
                    req[i].name, mpath);
        const ckpt_tensor *t = &m->t[idx[i]];
        char               a[256], b[256];
        DDL_REQUIRE(
            ddl_shape_equal(&t->shape, &req[i].global), DDL_EINVAL,
            "checkpoint load: tensor '%s': global shape %s requested, the checkpoint has %s",
            req[i].name, ddl_shape_str(&req[i].global, a, sizeof a),
            ddl_shape_str(&t->shape, b, sizeof b));
        DDL_REQUIRE(t->dtype == req[i].local->dtype, DDL_EINVAL,
                    "checkpoint load: tensor '%s': dtype %s requested, the checkpoint has %s",
                    req[i].name, ddl_dtype_name(req[i].local->dtype), ddl_dtype_name(t->dtype));
    }
    return DDL_OK;
}

static char *copy_string(const char *s)
{
    size_t len = strlen(s);
    char  *c   = ddl_malloc(len + 1);
    if (c != NULL) {
        memcpy(c, s, len + 1);
    }
    return c;
}

ddl_status ddl_checkpoint_load(MPI_Comm comm, const char *path, int n,
                               const ddl_named_tensor *tensors, int64_t *step, char **spec_json,
                               char **user_json)
{
    int rank, size;
    DDL_CHECK_MPI(MPI_Comm_rank(comm, &rank));
    DDL_CHECK_MPI(MPI_Comm_size(comm, &size));
    if (spec_json != NULL) {
        *spec_json = NULL;
    }
    if (user_json != NULL) {
        *user_json = NULL;
    }
    ddl_status st = path != NULL && path[0] != '\0'
                        ? ddl__check_named("checkpoint load", n, tensors)
                        : ddl_set_error(DDL_EINVAL, "checkpoint load: NULL or empty path");
    DDL_CHECK(ddl_agree(comm, st));

    char           stepdir[CKPT_PATH_MAX] = "", mpath[CKPT_PATH_MAX] = "";
    char          *text = NULL;
    int64_t        len = 0, expect = -1;
    int           *idx   = NULL;
    ddl_tensor_t **stage = NULL;
    char          *spec = NULL, *user = NULL;
    ckpt_manifest  m = {0};
    DDL_CHECK(fetch_manifest(comm, rank, path, stepdir, mpath, &expect, &text, &len));

    // Every rank validates the same text, so all reach the same verdict.
    st = manifest_parse(mpath, text, (size_t)len, &m);
    if (st == DDL_OK && expect >= 0 && m.step != expect) {
        st = corrupt(mpath, "step %lld differs from the step %lld named by latest",
                     (long long)m.step, (long long)expect);
    }
    st = ddl_agree(comm, st);
    if (st != DDL_OK) {
        goto done;
    }

    idx   = ddl_calloc((size_t)n + 1, sizeof *idx);
    stage = ddl_calloc((size_t)n + 1, sizeof *stage);
    if (idx == NULL || stage == NULL) {
        st = ddl_set_error(DDL_ENOMEM, "checkpoint load: out of memory");
    } else {
        st = match_requests(&m, mpath, n, tensors, idx);
    }
    st = ddl_agree(comm, st);
    if (st != DDL_OK) {
        goto done;
    }

    // Every shard is verified once, round-robin over the ranks, before any is read.
    for (int r = rank; r < m.world && st == DDL_OK; r += size) {
        st = verify_shard(stepdir, &m, r);
    }
    st = ddl_agree(comm, st);
    if (st != DDL_OK) {
        goto done;
    }

    // Stage the requested boxes straight from the shards that hold them.
    for (int i = 0; i < n && st == DDL_OK; i++) {
        st = ddl_tensor_create(tensors[i].local->dtype, &tensors[i].local->shape, &stage[i]);
    }
    for (int r = 0; r < m.world && st == DDL_OK; r++) {
        bool need = false;
        for (int i = 0; i < n && !need; i++) {
            need = needs(&m, tensors, idx, i, r);
        }
        if (need) {
            st = read_shard(stepdir, &m, r, n, tensors, idx, stage);
        }
    }
    if (st == DDL_OK && (spec_json != NULL || user_json != NULL)) {
        char *dumped = json_dumps(m.user, JSON_COMPACT);
        spec         = copy_string(m.spec);
        user         = dumped != NULL ? copy_string(dumped) : NULL;
        free(dumped); // json_dumps allocates with malloc
        if (spec == NULL || user == NULL) {
            st = ddl_set_error(DDL_ENOMEM, "checkpoint load: out of memory");
        }
    }
    st = ddl_agree(comm, st);
    if (st != DDL_OK) {
        goto done;
    }

    // Everything verified on every rank: only now touch the caller's tensors.
    for (int i = 0; i < n; i++) {
        ddl_tensor_copy(stage[i], tensors[i].local);
    }
    if (step != NULL) {
        *step = m.step;
    }
    if (spec_json != NULL) {
        *spec_json = spec;
        spec       = NULL;
    }
    if (user_json != NULL) {
        *user_json = user;
        user       = NULL;
    }

done:
    for (int i = 0; stage != NULL && i < n; i++) {
        ddl_tensor_destroy(&stage[i]);
    }
    ddl_free(stage);
    ddl_free(idx);
    ddl_free(spec);
    ddl_free(user);
    ddl_free(text);
    manifest_free(&m);
    return st;
}
