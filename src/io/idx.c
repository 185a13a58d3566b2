// io/idx.c: IDX (MNIST) datasets, gzip'd or plain, plus seeded shuffling and batching.
//
// The IDX format (http://yann.lecun.com/exdb/mnist/, "FILE FORMATS"): a 4-byte magic
// 0x00 0x00 <type> <ndims>, then ndims big-endian uint32 dimensions, then the data in
// row-major order. We accept only type 0x08 (unsigned byte), images with 2..4 dims
// (n plus up to 3 sample dims) and labels with exactly 1 dim (n).
//
// Gzip'd files are inflated with zlib (one member, nothing after it), others read
// plain. Every
// header field is validated, for both files, before anything is allocated, and the
// data size is capped (IDX_MAX_BYTES), so a hostile header cannot make us allocate
// much. Plain files are also checked against their size on disk before allocating;
// a gzip stream's length is only known by decompressing it, so it is streamed into the
// validated allocation and must end exactly there (which also verifies the gzip CRC).
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "base/check.h"
#include "ddl/base.h"
#include "ddl/data.h"

// Largest data section we accept in one file (pixels or labels): 4 GiB, or half the
// address space on 32-bit targets.
#if SIZE_MAX > 0xffffffffu
#define IDX_MAX_BYTES ((int64_t)1 << 32)
#else
#define IDX_MAX_BYTES ((int64_t)(SIZE_MAX / 2))
#endif

#define IDX_TYPE_U8   0x08
#define IDX_MAX_NDIMS 4
// inflate takes unsigned lengths: decompress in chunks below 2^31.
#define IDX_READ_CHUNK ((int64_t)1 << 30)
// Room for "<dir>/<name>.gz" in ddl_dataset_load_mnist_dir.
#define IDX_PATH_CAP 4096
// How many trailing bytes we count before giving up and reporting "at least".
#define IDX_TRAILING_CAP ((int64_t)1 << 20)
// deflate's largest expansion (zlib's FAQ, "maximum compression ratio": 1032:1).
#define IDX_GZ_MAX_RATIO 1032
// Raw input buffer (zlib's 8 KiB default makes large reads slow).
#define IDX_IN_CAP ((size_t)256 * 1024)

// One open IDX file whose header has been read and validated. A file starting with the
// gzip magic is inflated here (one gzip member, nothing after it: zlib's gzread would
// silently ignore bytes appended after the stream); any other file is read plain.
typedef struct idx_file {
    const char    *path;
    const char    *kind;  // "image" or "label": names the file in messages
    const char    *what;  // "pixel" or "label": names the data in messages
    int            fd;
    bool           gzip;   // the file starts with the gzip magic 1f 8b
    bool           zinit;  // zs is initialised
    bool           zend;   // the gzip member ended (its trailer and CRC verified)
    bool           cut;    // the input ended before the gzip member did
    z_stream       zs;
    unsigned char *in;             // IDX_IN_CAP bytes of raw input
    size_t         in_pos, in_len; // plain files: unread input in[in_pos, in_len)
    int            ndims;
    int64_t        dims[IDX_MAX_NDIMS];
    int64_t        bytes;  // product of dims: the exact size of the data section
} idx_file;

// ---- reading helpers ---------------------------------------------------------

// read(2) into in[0, IDX_IN_CAP); returns the count (0 at the end) or -1 (errno set).
static ssize_t raw_fill(idx_file *f)
{
    ssize_t n;
    do {
        n = read(f->fd, f->in, IDX_IN_CAP);
    } while (n < 0 && errno == EINTR);
    return n;
}

static ddl_status zlib_failure(const idx_file *f, int ret)
{
    if (ret == Z_MEM_ERROR) {
        return ddl_set_error(DDL_ENOMEM, "idx: %s: out of memory in zlib", f->path);
    }
    return ddl_set_error(DDL_EPROTO, "idx: %s: corrupt gzip stream: %s", f->path,
                         f->zs.msg != NULL ? f->zs.msg : "invalid data");
}

// Reads up to `len` bytes of (decompressed) content; stops early only at the end of the
// content. Returns the count read in *got, or an error (I/O error or corrupt data). A
// gzip stream cut short is not an error here: f->cut records it and callers report it.
static ddl_status gz_read_full(idx_file *f, void *buf, int64_t len, int64_t *got)
{
    unsigned char *p    = buf;
    int64_t        done = 0;
    while (done < len && !f->gzip) {
        if (f->in_pos < f->in_len) {
            size_t n = f->in_len - f->in_pos;
            n        = (int64_t)n < len - done ? n : (size_t)(len - done);
            memcpy(p + done, f->in + f->in_pos, n);
            f->in_pos += n;
            done += (int64_t)n;
            continue;
        }
        ssize_t n = raw_fill(f);
        if (n < 0) {
            return ddl_set_error(DDL_EIO, "idx: %s: read error: %s", f->path, strerror(errno));
        }
        if (n == 0) {
            break;
        }
        f->in_pos = 0;
        f->in_len = (size_t)n;
    }
    while (done < len && f->gzip && !f->zend && !f->cut) {
        if (f->zs.avail_in == 0) {
            ssize_t n = raw_fill(f);
            if (n < 0) {
                return ddl_set_error(DDL_EIO, "idx: %s: read error: %s", f->path,
                                     strerror(errno));
            }
            if (n == 0) {
                f->cut = true;
                break;
            }
            f->zs.next_in  = f->in;
            f->zs.avail_in = (uInt)n;
        }
        int64_t want     = len - done < IDX_READ_CHUNK ? len - done : IDX_READ_CHUNK;
        f->zs.next_out   = p + done;
        f->zs.avail_out  = (uInt)want;
        int ret          = inflate(&f->zs, Z_NO_FLUSH);
        done += want - (int64_t)f->zs.avail_out;
        if (ret == Z_STREAM_END) {
            f->zend = true;
        } else if (ret != Z_OK && ret != Z_BUF_ERROR) {
            return zlib_failure(f, ret);
        }
    }
    *got = done;
    return DDL_OK;
}

static int gz_cut_short(const idx_file *f)
{
    return f->cut;
}

static uint32_t be32(const unsigned char *b)
{
    return ((uint32_t)b[0] << 24) | ((uint32_t)b[1] << 16) | ((uint32_t)b[2] << 8) | (uint32_t)b[3];
}

static const char *idx_type_name(int t)
{
    switch (t) {
    case 0x08:
        return "unsigned byte";
    case 0x09:
        return "signed byte";
    case 0x0B:
        return "int16";
    case 0x0C:
        return "int32";
    case 0x0D:
        return "float32";
    case 0x0E:
        return "float64";
    default:
        return "not an IDX type";
    }
}

static void idx_close(idx_file *f)
{
    if (f->zinit) {
        inflateEnd(&f->zs);
        f->zinit = false;
    }
    free(f->in);
    f->in = NULL;
    if (f->fd >= 0) {
        close(f->fd);
        f->fd = -1;
    }
}

// Opens `path`, reads its header and validates it: magic, type, ndims in
// [min_ndims, max_ndims], every dim > 0, total size <= IDX_MAX_BYTES and, for a plain
// file, the exact size on disk. Nothing is allocated except zlib's stream state;
// on error the file is closed again.
static ddl_status idx_open(idx_file *f, const char *path, const char *kind, const char *what,
                           int min_ndims, int max_ndims)
{
    memset(f, 0, sizeof *f);
    f->fd   = -1;
    f->path = path;
    f->kind = kind;
    f->what = what;

    // O_NONBLOCK and regular files only: a FIFO must not block the loader in open.
    f->fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    DDL_REQUIRE(f->fd >= 0, DDL_EIO, "idx: cannot open %s: %s", path, strerror(errno));
    ddl_status  st;
    struct stat sb;
    if (fstat(f->fd, &sb) != 0) {
        st = ddl_set_error(DDL_EIO, "idx: cannot stat %s: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = ddl_set_error(DDL_EPROTO, "idx: %s is not a regular file", path);
        goto fail;
    }
    f->in = malloc(IDX_IN_CAP);
    if (f->in == NULL) {
        st = ddl_set_error(DDL_ENOMEM, "idx: %s: cannot allocate a read buffer", path);
        goto fail;
    }
    // The first bytes tell a gzip file (1f 8b) from a plain one.
    while (f->in_len < 2) {
        ssize_t n = read(f->fd, f->in + f->in_len, IDX_IN_CAP - f->in_len);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0) {
            st = ddl_set_error(DDL_EIO, "idx: %s: read error: %s", path, strerror(errno));
            goto fail;
        }
        if (n == 0) {
            break;
        }
        f->in_len += (size_t)n;
    }
    if (f->in_len >= 2 && f->in[0] == 0x1f && f->in[1] == 0x8b) {
        f->gzip = true;
        memset(&f->zs, 0, sizeof f->zs);
        f->zs.next_in  = f->in;
        f->zs.avail_in = (uInt)f->in_len;
        int ret        = inflateInit2(&f->zs, 16 + MAX_WBITS);  // gzip wrapper only
        if (ret != Z_OK) {
            st = ddl_set_error(DDL_ENOMEM, "idx: %s: cannot allocate a zlib stream", path);
            goto fail;
        }
        f->zinit = true;
    }

    unsigned char head[4 + 4 * IDX_MAX_NDIMS];
    int64_t       got = 0;
    DDL_CHECK_GOTO(gz_read_full(f, head, 4, &got), st, fail);
    if (got < 4 && f->cut) {
        st = ddl_set_error(DDL_EPROTO, "idx: %s: corrupt gzip stream: unexpected end of file",
                           path);
        goto fail;
    }
    if (got < 4) {
        st = ddl_set_error(DDL_EPROTO, "idx: %s: truncated header: %lld of 4 magic bytes", path,
                           (long long)got);
        goto fail;
    }
    if (head[0] != 0 || head[1] != 0) {
        st = ddl_set_error(
            DDL_EPROTO,
            "idx: %s is not an IDX file: magic starts 0x%02x 0x%02x, expected 0x00 0x00", path,
            head[0], head[1]);
        goto fail;
    }
    if (head[2] != IDX_TYPE_U8) {
        st = ddl_set_error(
            DDL_EPROTO,
            "idx: %s: data type 0x%02x (%s) is not supported: only 0x08 (unsigned byte)", path,
            head[2], idx_type_name(head[2]));
        goto fail;
    }
    f->ndims = head[3];
    if (f->ndims < min_ndims || f->ndims > max_ndims) {
        if (min_ndims == max_ndims) {
            st = ddl_set_error(DDL_EPROTO,
                               "idx: %s: has %d dimension(s), an IDX %s file must have %d", path,
                               f->ndims, kind, min_ndims);
        } else {
            st = ddl_set_error(DDL_EPROTO,
                               "idx: %s: has %d dimension(s), an IDX %s file must have %d to %d",
                               path, f->ndims, kind, min_ndims, max_ndims);
        }
        goto fail;
    }
    int64_t hlen = 4 * (int64_t)f->ndims;
    DDL_CHECK_GOTO(gz_read_full(f, head + 4, hlen, &got), st, fail);
    if (got < hlen) {
        st = ddl_set_error(DDL_EPROTO, "idx: %s: truncated header: %lld of %lld dimension bytes",
                           path, (long long)got, (long long)hlen);
        goto fail;
    }
    int64_t bytes = 1;
    for (int i = 0; i < f->ndims; i++) {
        f->dims[i] = be32(head + 4 + 4 * i);
        if (f->dims[i] == 0) {
            st = ddl_set_error(DDL_EPROTO, "idx: %s: dimension %d is 0", path, i);
            goto fail;
        }
        // Each dim is below 2^32 and bytes <= IDX_MAX_BYTES, so the division form never
        // overflows where bytes * dim could.
        if (bytes > IDX_MAX_BYTES / f->dims[i]) {
            char   shape[96];
            size_t used = 0;
            for (int k = 0; k < f->ndims && used < sizeof shape; k++) {
                used += (size_t)snprintf(shape + used, sizeof shape - used, "%s%lld",
                                         k ? " x " : "", (long long)be32(head + 4 + 4 * k));
            }
            st = ddl_set_error(DDL_EPROTO,
                               "idx: %s: header claims %s %s bytes, over the %lld-byte limit", path,
                               shape, what, (long long)IDX_MAX_BYTES);
            goto fail;
        }
        bytes *= f->dims[i];
    }
    f->bytes = bytes;

    // A gzip file cannot inflate to more than IDX_GZ_MAX_RATIO times its own size: a
    // header claiming more is refused before the caller allocates for it (a 133-byte file
    // claiming 4 GiB of pixels made the loader allocate them, found by tests/fuzz/fuzz_idx).
    if (f->gzip && (int64_t)sb.st_size <= INT64_MAX / IDX_GZ_MAX_RATIO &&
        4 + hlen + bytes > (int64_t)sb.st_size * IDX_GZ_MAX_RATIO) {
        st = ddl_set_error(DDL_EPROTO,
                           "idx: %s: header claims %lld %s bytes, more than a %lld-byte gzip "
                           "file can hold (deflate inflates at most %d:1)",
                           path, (long long)bytes, what, (long long)sb.st_size, IDX_GZ_MAX_RATIO);
        goto fail;
    }

    // A plain file (read transparently) has a known size: check it now, before the
    // caller allocates anything.
    if (!f->gzip && S_ISREG(sb.st_mode)) {
        int64_t remaining = (int64_t)sb.st_size - 4 - hlen;
        if (remaining < bytes) {
            st = ddl_set_error(DDL_EPROTO,
                               "idx: %s: truncated: expected %lld bytes of %s data, got %lld", path,
                               (long long)bytes, what, (long long)remaining);
            goto fail;
        }
        if (remaining > bytes) {
            st = ddl_set_error(DDL_EPROTO,
                               "idx: %s: %lld trailing byte(s) after the %lld bytes of %s data",
                               path, (long long)(remaining - bytes), (long long)bytes, what);
            goto fail;
        }
    }
    return DDL_OK;

fail:
    idx_close(f);
    return st;
}

// Reads the data section into dst (f->bytes long) and checks that the stream ends
// exactly there.
static ddl_status idx_read_data(idx_file *f, uint8_t *dst)
{
    int64_t got = 0;
    DDL_CHECK(gz_read_full(f, dst, f->bytes, &got));
    DDL_REQUIRE(got == f->bytes, DDL_EPROTO,
                "idx: %s: truncated: expected %lld bytes of %s data, got %lld%s", f->path,
                (long long)f->bytes, f->what, (long long)got,
                gz_cut_short(f) ? " (the gzip stream is cut short)" : "");

    // Drain to the end: counts any extra bytes and makes zlib verify the gzip trailer.
    unsigned char scratch[4096];
    int64_t       extra = 0;
    do {
        DDL_CHECK(gz_read_full(f, scratch, (int64_t)sizeof scratch, &got));
        extra += got;
    } while (got == (int64_t)sizeof scratch && extra < IDX_TRAILING_CAP);
    DDL_REQUIRE(extra == 0, DDL_EPROTO,
                "idx: %s: %s%lld trailing byte(s) after the %lld bytes of %s data", f->path,
                extra >= IDX_TRAILING_CAP ? "at least " : "", (long long)extra, (long long)f->bytes,
                f->what);
    DDL_REQUIRE(!gz_cut_short(f), DDL_EPROTO,
                "idx: %s: the gzip stream ends without its trailer (file cut short)", f->path);
    if (f->gzip) {
        // Bytes after the gzip member (appended garbage, a second member): refused, as
        // trailing bytes of a plain file are.
        int64_t raw = (int64_t)f->zs.avail_in;
        ssize_t n;
        while (raw < IDX_TRAILING_CAP && (n = raw_fill(f)) > 0) {
            raw += n;
        }
        DDL_REQUIRE(raw == 0, DDL_EPROTO,
                    "idx: %s: %s%lld trailing byte(s) after the end of the gzip stream",
                    f->path, raw >= IDX_TRAILING_CAP ? "at least " : "", (long long)raw);
    }
    return DDL_OK;
}

// ---- loading -----------------------------------------------------------------

ddl_status ddl_dataset_load_idx(const char *images_path, const char *labels_path, ddl_dataset *out)
{
    DDL_REQUIRE(out != NULL, DDL_EINVAL, "ddl_dataset_load_idx: out is NULL");
    memset(out, 0, sizeof *out);
    DDL_REQUIRE(images_path != NULL && labels_path != NULL, DDL_EINVAL,
                "ddl_dataset_load_idx: images_path (%s) or labels_path (%s) is NULL",
                images_path ? images_path : "NULL", labels_path ? labels_path : "NULL");

    // Both headers are validated before either allocation.
    idx_file img, lab;
    DDL_CHECK(idx_open(&img, images_path, "image", "pixel", 2, IDX_MAX_NDIMS));
    ddl_status st = idx_open(&lab, labels_path, "label", "label", 1, 1);
    if (st != DDL_OK) {
        idx_close(&img);
        return st;
    }
    uint8_t *pixels = NULL, *labels = NULL;
    if (img.dims[0] != lab.dims[0]) {
        st =
            ddl_set_error(DDL_EPROTO, "idx: %s holds %lld images but %s holds %lld labels",
                          images_path, (long long)img.dims[0], labels_path, (long long)lab.dims[0]);
        goto done;
    }

    pixels = ddl_malloc((size_t)img.bytes);
    labels = ddl_malloc((size_t)lab.bytes);
    if (pixels == NULL || labels == NULL) {
        st = ddl_set_error(DDL_ENOMEM, "idx: cannot allocate %lld bytes for %s and %lld for %s",
                           (long long)img.bytes, images_path, (long long)lab.bytes, labels_path);
        goto done;
    }
    DDL_CHECK_GOTO(idx_read_data(&img, pixels), st, done);
    DDL_CHECK_GOTO(idx_read_data(&lab, labels), st, done);

    int max_label = 0;
    for (int64_t i = 0; i < lab.bytes; i++) {
        max_label = labels[i] > max_label ? labels[i] : max_label;
    }
    out->n    = img.dims[0];
    out->ndim = img.ndims - 1;
    for (int d = 0; d < 3; d++) {
        out->dims[d] = d < out->ndim ? img.dims[d + 1] : 1;
    }
    out->sample_size = img.bytes / img.dims[0];
    out->pixels      = pixels;
    out->labels      = labels;
    out->num_classes = max_label + 1;
    pixels = labels = NULL;

done:
    ddl_free(pixels);
    ddl_free(labels);
    idx_close(&img);
    idx_close(&lab);
    return st;
}

// Sets path to "<dir>/<name>.gz" if that exists, else to "<dir>/<name>" if that exists.
static ddl_status find_split_file(const char *dir, const char *name, char path[IDX_PATH_CAP])
{
    char gz[IDX_PATH_CAP];
    int  n = snprintf(gz, sizeof gz, "%s/%s.gz", dir, name);
    DDL_REQUIRE(n > 0 && n < IDX_PATH_CAP, DDL_EINVAL,
                "idx: dataset directory path is too long (%zu bytes): %s", strlen(dir), dir);
    if (access(gz, F_OK) == 0) {
        memcpy(path, gz, (size_t)n + 1);
        return DDL_OK;
    }
    snprintf(path, IDX_PATH_CAP, "%s/%s", dir, name);  // shorter than gz: fits
    DDL_REQUIRE(access(path, F_OK) == 0, DDL_ENOTFOUND,
                "idx: dataset file not found: tried %s and %s", gz, path);
    return DDL_OK;
}

ddl_status ddl_dataset_load_mnist_dir(const char *dir, int train, ddl_dataset *out)
{
    DDL_REQUIRE(out != NULL, DDL_EINVAL, "ddl_dataset_load_mnist_dir: out is NULL");
    memset(out, 0, sizeof *out);
    DDL_REQUIRE(dir != NULL, DDL_EINVAL, "ddl_dataset_load_mnist_dir: dir is NULL");
    const char *split = train ? "train" : "t10k";
    char        name[64], images[IDX_PATH_CAP], labels[IDX_PATH_CAP];
    snprintf(name, sizeof name, "%s-images-idx3-ubyte", split);
    DDL_CHECK(find_split_file(dir, name, images));
    snprintf(name, sizeof name, "%s-labels-idx1-ubyte", split);
    DDL_CHECK(find_split_file(dir, name, labels));
    return ddl_dataset_load_idx(images, labels, out);
}

void ddl_dataset_free(ddl_dataset *ds)
{
    if (ds == NULL) {
        return;
    }
    ddl_free(ds->pixels);
    ddl_free(ds->labels);
    memset(ds, 0, sizeof *ds);
}

// ---- shuffling and batching ----------------------------------------------------

// Uniform in [0, range) without modulo bias: reject the lowest (2^64 mod range) values
// so the accepted ones cover a whole number of copies of [0, range). *ctr advances once
// per draw; a rejection (probability < range / 2^64) costs one more draw.
static uint64_t uniform_below(uint64_t seed, uint64_t epoch, uint64_t *ctr, uint64_t range)
{
    uint64_t threshold = (0 - range) % range;  // == 2^64 mod range
    uint64_t x;
    do {
        x = ddl_rng_u64(seed, epoch, (*ctr)++);
    } while (x < threshold);
    return x % range;
}

void ddl_dataset_shuffle(int64_t n, uint64_t seed, uint64_t epoch, int64_t *perm)
{
    if (n <= 0) {
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        perm[i] = i;
    }
    // Fisher-Yates (Knuth, TAOCP vol. 2, Algorithm 3.4.2 P): position i takes a uniform
    // pick among the i + 1 elements not yet placed.
    uint64_t ctr = 0;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)uniform_below(seed, epoch, &ctr, (uint64_t)i + 1);
        int64_t t = perm[i];
        perm[i]   = perm[j];
        perm[j]   = t;
    }
}

// lut[v] = (v / 255 - mean) / std, evaluated exactly as written for each byte value.
static void fill_lut(double mean, double std, double lut[256])
{
    for (int v = 0; v < 256; v++) {
        lut[v] = ((double)v / 255.0 - mean) / std;
    }
}

void ddl_dataset_batch_f32(const ddl_dataset *ds, const int64_t *idx, int64_t count, double mean,
                           double std, float *x, int64_t *labels)
{
    double lut[256];
    fill_lut(mean, std, lut);
    int64_t ss = ds->sample_size;
    for (int64_t b = 0; b < count; b++) {
        DDL_ASSERT(idx[b] >= 0 && idx[b] < ds->n);
        const uint8_t *px = ds->pixels + idx[b] * ss;
        float         *xb = x + b * ss;
        for (int64_t k = 0; k < ss; k++) {
            xb[k] = (float)lut[px[k]];
        }
        if (labels != NULL) {
            labels[b] = ds->labels[idx[b]];
        }
    }
}

void ddl_dataset_batch_f64(const ddl_dataset *ds, const int64_t *idx, int64_t count, double mean,
                           double std, double *x, int64_t *labels)
{
    double lut[256];
    fill_lut(mean, std, lut);
    int64_t ss = ds->sample_size;
    for (int64_t b = 0; b < count; b++) {
        DDL_ASSERT(idx[b] >= 0 && idx[b] < ds->n);
        const uint8_t *px = ds->pixels + idx[b] * ss;
        double        *xb = x + b * ss;
        for (int64_t k = 0; k < ss; k++) {
            xb[k] = lut[px[k]];
        }
        if (labels != NULL) {
            labels[b] = ds->labels[idx[b]];
        }
    }
}

void ddl_dataset_batch_images(const ddl_dataset *ds, const int64_t *idx, int64_t count,
                              ddl_dtype dt, void *targets)
{
    int64_t ss = ds->sample_size;
    for (int64_t b = 0; b < count; b++) {
        DDL_ASSERT(idx[b] >= 0 && idx[b] < ds->n);
        const uint8_t *px = ds->pixels + idx[b] * ss;
        for (int64_t k = 0; k < ss; k++) {
            double v = px[k] / 255.0;
            if (dt == DDL_F32) {
                ((float *)targets)[b * ss + k] = (float)v;
            } else {
                ((double *)targets)[b * ss + k] = v;
            }
        }
    }
}
