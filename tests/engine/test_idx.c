// tests/engine/test_idx.c: the IDX dataset reader, shuffling and batching.
//
// Small IDX files (plain and gzip'd) are written to a fresh temporary directory and read
// back; every kind of corruption must be refused with DDL_EPROTO / DDL_EIO and a message
// that names the file, without leaking (and, for header errors, without allocating).
// If Debian's dataset-fashion-mnist is installed, the real splits are loaded and checked
// against facts computed independently with numpy.
#define _XOPEN_SOURCE 700  // nftw, mkdtemp

#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "ddl/base.h"
#include "ddl/data.h"
#include "ddl/npy.h"
#include "test.h"

#define FASHION_DIR "/usr/share/datasets/fashion-mnist"

static char tmpdir[256];

// ---- file builders -----------------------------------------------------------

typedef struct bytes {
    unsigned char b[1024];
    size_t        n;
} bytes;

static void put(bytes *f, const void *p, size_t len)
{
    ASSERT_TRUE(f->n + len <= sizeof f->b);
    memcpy(f->b + f->n, p, len);
    f->n += len;
}

static void put_u8(bytes *f, unsigned v)
{
    unsigned char c = (unsigned char)v;
    put(f, &c, 1);
}

// An IDX header: 0x00 0x00 type ndims, then big-endian dims.
static bytes idx_header(unsigned type, int ndims, const uint32_t *dims)
{
    bytes f = {.n = 0};
    put_u8(&f, 0);
    put_u8(&f, 0);
    put_u8(&f, type);
    put_u8(&f, (unsigned)ndims);
    for (int i = 0; i < ndims; i++) {
        unsigned char be[4] = {(unsigned char)(dims[i] >> 24), (unsigned char)(dims[i] >> 16),
                               (unsigned char)(dims[i] >> 8), (unsigned char)dims[i]};
        put(&f, be, 4);
    }
    return f;
}

static const char *path_in_tmp(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", tmpdir, name);
    return buf;
}

// Writes f to <tmpdir>/<name>, through zlib's gzip writer if gz. Returns the path in buf.
static const char *write_file(char *buf, size_t cap, const char *name, const bytes *f, int gz)
{
    path_in_tmp(buf, cap, name);
    if (gz) {
        gzFile g = gzopen(buf, "wb");
        ASSERT_TRUE(g != NULL);
        ASSERT_TRUE(f->n == 0 || gzwrite(g, f->b, (unsigned)f->n) == (int)f->n);
        ASSERT_EQ(gzclose(g), Z_OK);
    } else {
        FILE *fp = fopen(buf, "wb");
        ASSERT_TRUE(fp != NULL);
        ASSERT_TRUE(f->n == 0 || fwrite(f->b, 1, f->n, fp) == f->n);
        ASSERT_EQ(fclose(fp), 0);
    }
    return buf;
}

// The reference dataset: 5 images of 3 x 4 and labels {0, 3, 1, 3, 2}.
enum { N = 5, R = 3, C = 4 };
static const uint8_t ref_labels[N] = {0, 3, 1, 3, 2};

static uint8_t ref_pixel(int64_t i)
{
    return (uint8_t)((i * 37 + 11) & 0xff);
}

// Image file with `n_data` pixel bytes after a header claiming N x R x C.
static bytes images_file(int64_t n_data)
{
    uint32_t dims[3] = {N, R, C};
    bytes    f       = idx_header(0x08, 3, dims);
    for (int64_t i = 0; i < n_data; i++) {
        put_u8(&f, ref_pixel(i));
    }
    return f;
}

static bytes labels_file(uint32_t n, int64_t n_data)
{
    bytes f = idx_header(0x08, 1, &n);
    for (int64_t i = 0; i < n_data; i++) {
        put_u8(&f, i < N ? ref_labels[i] : 7);
    }
    return f;
}

// Rewrites a file keeping its first `keep` bytes, or (flip >= 0) flipping byte `flip`.
static void damage_file(const char *path, long keep, long flip)
{
    FILE *fp = fopen(path, "rb");
    ASSERT_TRUE(fp != NULL);
    unsigned char buf[4096];
    size_t        n = fread(buf, 1, sizeof buf, fp);
    fclose(fp);
    ASSERT_TRUE(n < sizeof buf);
    if (flip >= 0) {
        ASSERT_TRUE((size_t)flip < n);
        buf[flip] ^= 0x5a;
    }
    if (keep >= 0) {
        ASSERT_TRUE((size_t)keep <= n);
        n = (size_t)keep;
    }
    fp = fopen(path, "wb");
    ASSERT_TRUE(fp != NULL);
    ASSERT_EQ(fwrite(buf, 1, n, fp), n);
    ASSERT_EQ(fclose(fp), 0);
}

static long file_size(const char *path)
{
    struct stat sb;
    ASSERT_EQ(stat(path, &sb), 0);
    return (long)sb.st_size;
}

// ---- checks ------------------------------------------------------------------

static void check_reference(const ddl_dataset *ds)
{
    ASSERT_EQ(ds->n, N);
    ASSERT_EQ(ds->ndim, 2);
    ASSERT_EQ(ds->dims[0], R);
    ASSERT_EQ(ds->dims[1], C);
    ASSERT_EQ(ds->sample_size, R * C);
    ASSERT_EQ(ds->num_classes, 4);
    for (int64_t i = 0; i < N * R * C; i++) {
        ASSERT_EQ(ds->pixels[i], ref_pixel(i));
    }
    for (int i = 0; i < N; i++) {
        ASSERT_EQ(ds->labels[i], ref_labels[i]);
    }
}

// Loading must fail with `want`, name `blame` (and `needle`, if given) in the message,
// leave *out zeroed and leak nothing; with no_alloc, it must not allocate at all.
static void expect_refused(const char *img, const char *lab, ddl_status want, const char *blame,
                           const char *needle, int no_alloc)
{
    int64_t     live  = ddl_alloc_bytes_live();
    uint64_t    count = ddl_alloc_count();
    ddl_dataset ds;
    memset(&ds, 0xab, sizeof ds);
    ASSERT_STATUS(ddl_dataset_load_idx(img, lab, &ds), want);
    const char *msg = ddl_last_error();
    printf("  refused (%s): %s\n", ddl_status_name(want), msg);
    if (strstr(msg, blame) == NULL) {
        TEST_FAIL_("message does not name %s: %s", blame, msg);
    }
    if (needle != NULL && strstr(msg, needle) == NULL) {
        TEST_FAIL_("message lacks \"%s\": %s", needle, msg);
    }
    ASSERT_TRUE(ds.pixels == NULL && ds.labels == NULL && ds.n == 0 && ds.num_classes == 0);
    ASSERT_EQ(ddl_alloc_bytes_live(), live);
    if (no_alloc) {
        ASSERT_EQ(ddl_alloc_count(), count);
    }
}

// ---- tests -------------------------------------------------------------------

static void test_roundtrip(void)
{
    char  ip[512], lp[512], igz[512], lgz[512];
    bytes img = images_file(N * R * C), lab = labels_file(N, N);
    write_file(ip, sizeof ip, "img", &img, 0);
    write_file(lp, sizeof lp, "lab", &lab, 0);
    write_file(igz, sizeof igz, "img.gz", &img, 1);
    write_file(lgz, sizeof lgz, "lab.gz", &lab, 1);
    ASSERT_TRUE(file_size(igz) != (long)img.n);  // really compressed, not stored plain

    const char *pairs[3][2] = {{ip, lp}, {igz, lgz}, {igz, lp}};
    for (int k = 0; k < 3; k++) {
        int64_t     live = ddl_alloc_bytes_live();
        ddl_dataset ds;
        ASSERT_OK(ddl_dataset_load_idx(pairs[k][0], pairs[k][1], &ds));
        check_reference(&ds);
        ddl_dataset_free(&ds);
        ASSERT_TRUE(ds.pixels == NULL && ds.labels == NULL && ds.n == 0 && ds.sample_size == 0);
        ddl_dataset_free(&ds);  // freeing twice is harmless: the struct was zeroed
        ASSERT_EQ(ddl_alloc_bytes_live(), live);
    }
    ddl_dataset_free(NULL);

    // Sample ranks 1 and 3: (4, 6) vectors and (2, 2, 3, 2) volumes.
    uint32_t d2[2] = {4, 6}, d4[4] = {2, 2, 3, 2};
    bytes    v = idx_header(0x08, 2, d2);
    for (int i = 0; i < 24; i++) {
        put_u8(&v, (unsigned)(200 + i));
    }
    bytes vl = labels_file(4, 4), w = idx_header(0x08, 4, d4), wl = labels_file(2, 2);
    for (int i = 0; i < 24; i++) {
        put_u8(&w, (unsigned)i);
    }
    ddl_dataset ds;
    ASSERT_OK(ddl_dataset_load_idx(write_file(ip, sizeof ip, "vec.gz", &v, 1),
                                   write_file(lp, sizeof lp, "vec-lab", &vl, 0), &ds));
    ASSERT_EQ(ds.n, 4);
    ASSERT_EQ(ds.ndim, 1);
    ASSERT_EQ(ds.dims[0], 6);
    ASSERT_EQ(ds.sample_size, 6);
    ASSERT_EQ(ds.pixels[23], 223);
    ddl_dataset_free(&ds);
    ASSERT_OK(ddl_dataset_load_idx(write_file(ip, sizeof ip, "vol", &w, 0),
                                   write_file(lp, sizeof lp, "vol-lab.gz", &wl, 1), &ds));
    ASSERT_EQ(ds.n, 2);
    ASSERT_EQ(ds.ndim, 3);
    ASSERT_TRUE(ds.dims[0] == 2 && ds.dims[1] == 3 && ds.dims[2] == 2);
    ASSERT_EQ(ds.sample_size, 12);
    ASSERT_EQ(ds.pixels[12 + 5], 17);
    ASSERT_EQ(ds.num_classes, 4);  // labels {0, 3}
    ddl_dataset_free(&ds);
}

static void test_corrupt_headers(void)
{
    char  ip[512], lp[512], bad[512];
    bytes img = images_file(N * R * C), lab = labels_file(N, N);
    write_file(ip, sizeof ip, "good-img", &img, 0);
    write_file(lp, sizeof lp, "good-lab.gz", &lab, 1);

    bytes f = img;
    f.b[0]  = 0x01;  // bad magic
    expect_refused(write_file(bad, sizeof bad, "magic", &f, 0), lp, DDL_EPROTO, bad, "magic", 1);
    f      = lab;
    f.b[1] = 0x08;  // bad magic, gzip'd label file
    expect_refused(ip, write_file(bad, sizeof bad, "magic-lab.gz", &f, 1), DDL_EPROTO, bad, "magic",
                   1);

    f      = img;
    f.b[2] = 0x0D;  // float32: a valid IDX type we do not read
    expect_refused(write_file(bad, sizeof bad, "dtype", &f, 0), lp, DDL_EPROTO, bad, "0x0d", 1);
    f      = img;
    f.b[2] = 0x09;  // signed byte
    expect_refused(write_file(bad, sizeof bad, "dtype.gz", &f, 1), lp, DDL_EPROTO, bad, "0x09", 1);

    // Wrong rank: labels with 2 dims, images with 1 and with 5.
    uint32_t two[2] = {N, 1}, five[5] = {N, 1, 1, 1, 12};
    f = idx_header(0x08, 2, two);
    put(&f, ref_labels, N);
    expect_refused(ip, write_file(bad, sizeof bad, "lab2d", &f, 0), DDL_EPROTO, bad, "dimension(s)",
                   1);
    f = labels_file(N, N);  // a label file given as the image file
    expect_refused(write_file(bad, sizeof bad, "img1d", &f, 0), lp, DDL_EPROTO, bad, "dimension(s)",
                   1);
    f = idx_header(0x08, 5, five);
    for (int i = 0; i < N * 12; i++) {
        put_u8(&f, 1);
    }
    expect_refused(write_file(bad, sizeof bad, "img5d", &f, 0), lp, DDL_EPROTO, bad, "dimension(s)",
                   1);

    // A zero dimension.
    uint32_t zero[3] = {N, 0, C};
    f                = idx_header(0x08, 3, zero);
    expect_refused(write_file(bad, sizeof bad, "zero", &f, 0), lp, DDL_EPROTO, bad,
                   "dimension 1 is 0", 1);
    uint32_t nolab = 0;
    f              = idx_header(0x08, 1, &nolab);
    expect_refused(ip, write_file(bad, sizeof bad, "zero-lab.gz", &f, 1), DDL_EPROTO, bad,
                   "dimension 0 is 0", 1);

    // Truncated headers: empty, half a magic, half the dims.
    f.n = 0;
    expect_refused(write_file(bad, sizeof bad, "empty", &f, 0), lp, DDL_EPROTO, bad,
                   "truncated header", 1);
    f   = img;
    f.n = 2;
    expect_refused(write_file(bad, sizeof bad, "short-magic.gz", &f, 1), lp, DDL_EPROTO, bad,
                   "truncated header", 1);
    f.n = 10;
    expect_refused(write_file(bad, sizeof bad, "short-dims", &f, 0), lp, DDL_EPROTO, bad,
                   "truncated header", 1);

    // Images and labels disagree on n: the message names both files.
    f = labels_file(N - 1, N - 1);
    write_file(bad, sizeof bad, "lab4", &f, 0);
    expect_refused(ip, bad, DDL_EPROTO, bad, "5 images", 1);
    expect_refused(ip, bad, DDL_EPROTO, ip, "4 labels", 1);

    // Hostile sizes: 2^31 x 2^31 x 2^31 must be refused without allocating, plain or
    // gzip'd; so must 4 GiB + 64 KiB made of small dims.
    uint32_t huge[3] = {1u << 31, 1u << 31, 1u << 31}, over[3] = {65537, 256, 256};
    f = idx_header(0x08, 3, huge);
    expect_refused(write_file(bad, sizeof bad, "huge", &f, 0), lp, DDL_EPROTO, bad, "limit", 1);
    expect_refused(write_file(bad, sizeof bad, "huge.gz", &f, 1), lp, DDL_EPROTO, bad, "limit", 1);
    f = idx_header(0x08, 3, over);
    expect_refused(write_file(bad, sizeof bad, "over.gz", &f, 1), lp, DDL_EPROTO, bad, "limit", 1);
    uint32_t hugelab = 0xffffffffu;
    f                = idx_header(0x08, 1, &hugelab);  // 4 GiB - 1 labels: under the cap
    put(&f, ref_labels, N);
    expect_refused(ip, write_file(bad, sizeof bad, "hugelab", &f, 0), DDL_EPROTO, bad,
                   "expected 4294967295 bytes of label data, got 5", 1);

    // A plain file is measured before allocating: a 1e6 x 28 x 28 claim with 12 bytes.
    uint32_t big[3] = {1000000, 28, 28};
    f               = idx_header(0x08, 3, big);
    put(&f, ref_labels, N);
    expect_refused(write_file(bad, sizeof bad, "big", &f, 0), lp, DDL_EPROTO, bad,
                   "truncated: expected 784000000 bytes of pixel data, got 5", 1);

    // A gzip'd file cannot inflate beyond 1032:1: the same claim, gzip'd into a few dozen
    // bytes, is refused before allocating (it allocated 784 MB, then found the stream
    // short; tests/fuzz/fuzz_idx found the 4 GiB version).
    expect_refused(write_file(bad, sizeof bad, "big.gz", &f, 1), lp, DDL_EPROTO, bad,
                   "gzip file can hold", 1);

    // A missing file is an I/O error naming the path.
    path_in_tmp(bad, sizeof bad, "does-not-exist");
    expect_refused(bad, lp, DDL_EIO, bad, "cannot open", 1);
    expect_refused(ip, bad, DDL_EIO, bad, "cannot open", 1);
}

static void test_corrupt_data(void)
{
    char  ip[512], lp[512], bad[512];
    bytes img = images_file(N * R * C), lab = labels_file(N, N);
    write_file(ip, sizeof ip, "good-img.gz", &img, 1);
    write_file(lp, sizeof lp, "good-lab", &lab, 0);

    // One byte short and one byte over, plain (caught before allocating) and gzip'd
    // (caught while streaming).
    bytes f = images_file(N * R * C - 1);
    expect_refused(write_file(bad, sizeof bad, "short", &f, 0), lp, DDL_EPROTO, bad,
                   "truncated: expected 60 bytes of pixel data, got 59", 1);
    expect_refused(write_file(bad, sizeof bad, "short.gz", &f, 1), lp, DDL_EPROTO, bad,
                   "truncated: expected 60 bytes of pixel data, got 59", 0);
    f = images_file(N * R * C + 1);
    expect_refused(write_file(bad, sizeof bad, "long", &f, 0), lp, DDL_EPROTO, bad,
                   "1 trailing byte(s) after the 60 bytes of pixel data", 1);
    expect_refused(write_file(bad, sizeof bad, "long.gz", &f, 1), lp, DDL_EPROTO, bad,
                   "1 trailing byte(s) after the 60 bytes of pixel data", 0);
    f = labels_file(N, N - 2);
    expect_refused(ip, write_file(bad, sizeof bad, "short-lab.gz", &f, 1), DDL_EPROTO, bad,
                   "expected 5 bytes of label data, got 3", 0);
    f = labels_file(N, N + 300);
    expect_refused(ip, write_file(bad, sizeof bad, "long-lab.gz", &f, 1), DDL_EPROTO, bad,
                   "300 trailing byte(s) after the 5 bytes of label data", 0);

    // A gzip stream claiming more than it holds, but no more than its size could inflate
    // to (1032:1; beyond that it is refused before allocating, test_corrupt_headers):
    // allocated, then refused, nothing leaks.
    uint32_t big[3] = {N, 40, 40};
    f               = idx_header(0x08, 3, big);
    put(&f, ref_labels, N);
    expect_refused(write_file(bad, sizeof bad, "big.gz", &f, 1), lp, DDL_EPROTO, bad,
                   "truncated: expected 8000 bytes of pixel data, got 5", 0);

    // Damaged gzip files: the 8-byte trailer (CRC32, ISIZE) cut off, the stream cut in
    // half, and a flipped CRC byte.
    write_file(bad, sizeof bad, "cut-trailer.gz", &img, 1);
    long size = file_size(bad);
    damage_file(bad, size - 8, -1);
    expect_refused(bad, lp, DDL_EPROTO, bad, "cut short", 0);
    write_file(bad, sizeof bad, "cut-half.gz", &img, 1);
    damage_file(bad, size / 2, -1);
    expect_refused(bad, lp, DDL_EPROTO, bad, NULL, 0);
    write_file(bad, sizeof bad, "bad-crc.gz", &img, 1);
    damage_file(bad, -1, size - 6);
    expect_refused(bad, lp, DDL_EPROTO, bad, "corrupt gzip stream: incorrect data check", 0);

    // Bytes appended after a complete gzip stream used to be ignored (zlib's gzread skips
    // trailing garbage); they are refused like the trailing bytes of a plain file. A
    // second gzip member after the first is refused too.
    write_file(bad, sizeof bad, "garbage.gz", &img, 1);
    FILE *fp = fopen(bad, "ab");
    ASSERT_TRUE(fp != NULL && fwrite("junk!", 1, 5, fp) == 5 && fclose(fp) == 0);
    expect_refused(bad, lp, DDL_EPROTO, bad,
                   "5 trailing byte(s) after the end of the gzip stream", 0);
    bytes none = {0};
    char  extra[512];
    write_file(bad, sizeof bad, "two-members.gz", &img, 1);
    write_file(extra, sizeof extra, "empty.gz", &none, 1);
    long  esz  = file_size(extra);
    FILE *src  = fopen(extra, "rb");
    FILE *dst  = fopen(bad, "ab");
    char  buf[256];
    ASSERT_TRUE(src != NULL && dst != NULL && esz > 0 && esz < (long)sizeof buf);
    ASSERT_TRUE(fread(buf, 1, (size_t)esz, src) == (size_t)esz);
    ASSERT_TRUE(fwrite(buf, 1, (size_t)esz, dst) == (size_t)esz);
    fclose(src);
    fclose(dst);
    expect_refused(bad, lp, DDL_EPROTO, bad, "trailing byte(s) after the end of the gzip stream",
                   0);
}

static void test_mnist_dir(void)
{
    char dir[512], p[1200];
    path_in_tmp(dir, sizeof dir, "mnist");
    ASSERT_EQ(mkdir(dir, 0700), 0);
    bytes img = images_file(N * R * C), lab = labels_file(N, N);
    write_file(p, sizeof p, "mnist/train-images-idx3-ubyte.gz", &img, 1);
    write_file(p, sizeof p, "mnist/train-labels-idx1-ubyte", &lab, 0);
    // A plain decoy next to the .gz: the .gz must win.
    bytes decoy = labels_file(N, N);
    write_file(p, sizeof p, "mnist/train-images-idx3-ubyte", &decoy, 0);

    ddl_dataset ds;
    ASSERT_OK(ddl_dataset_load_mnist_dir(dir, 1, &ds));
    check_reference(&ds);
    ddl_dataset_free(&ds);

    memset(&ds, 0xab, sizeof ds);
    ASSERT_STATUS(ddl_dataset_load_mnist_dir(dir, 0, &ds), DDL_ENOTFOUND);
    const char *msg = ddl_last_error();
    printf("  refused (DDL_ENOTFOUND): %s\n", msg);
    snprintf(p, sizeof p, "%s/t10k-images-idx3-ubyte.gz and %s/t10k-images-idx3-ubyte", dir, dir);
    if (strstr(msg, p) == NULL) {
        TEST_FAIL_("message does not list what was tried (%s): %s", p, msg);
    }
    ASSERT_TRUE(ds.pixels == NULL && ds.n == 0);
}

static void test_shuffle(void)
{
    enum { M = 1000 };
    static int64_t a[M], b[M], c[M], d[M];
    static uint8_t seen[M];
    ddl_dataset_shuffle(M, 42, 0, a);
    ddl_dataset_shuffle(M, 42, 0, b);
    ddl_dataset_shuffle(M, 42, 1, c);
    ddl_dataset_shuffle(M, 43, 0, d);
    int64_t fixed = 0, same_ab = 0, same_ac = 0, same_ad = 0;
    for (int i = 0; i < M; i++) {
        ASSERT_TRUE(a[i] >= 0 && a[i] < M);
        ASSERT_EQ(seen[a[i]], 0);
        seen[a[i]] = 1;
        fixed += a[i] == i;
        same_ab += a[i] == b[i];
        same_ac += a[i] == c[i];
        same_ad += a[i] == d[i];
    }
    ASSERT_EQ(same_ab, M);   // deterministic for (seed, epoch)
    ASSERT_LE(same_ac, 10);  // a new epoch is a new order (expected ~1 coincidence)
    ASSERT_LE(same_ad, 10);  // and so is a new seed
    ASSERT_LE(fixed, 10);    // and it is not the identity

    int64_t one = -1;
    ddl_dataset_shuffle(1, 42, 0, &one);
    ASSERT_EQ(one, 0);
    ddl_dataset_shuffle(0, 42, 0, NULL);

    // Uniformity: over 60,000 epochs each of the 6 orders of 3 items appears ~10,000
    // times. A biased variant (e.g. swapping with any j in [0, n)) fails this badly.
    // Chi-square with 5 degrees of freedom: P(X > 25) is about 1.4e-4.
    int64_t counts[6] = {0};
    for (uint64_t e = 0; e < 60000; e++) {
        int64_t p[3];
        ddl_dataset_shuffle(3, 7, e, p);
        ASSERT_TRUE(p[0] + p[1] + p[2] == 3 && p[0] != p[1] && p[1] != p[2] && p[0] != p[2]);
        counts[p[0] * 2 + (p[1] > p[2])]++;
    }
    double chi2 = 0.0;
    for (int k = 0; k < 6; k++) {
        chi2 += (counts[k] - 10000.0) * (counts[k] - 10000.0) / 10000.0;
    }
    printf("  shuffle(3) over 60000 epochs: chi2 = %.2f (5 dof)\n", chi2);
    ASSERT_LE(chi2, 25.0);
}

static void test_batch(void)
{
    char        ip[512], lp[512];
    bytes       img = images_file(N * R * C), lab = labels_file(N, N);
    ddl_dataset ds;
    ASSERT_OK(ddl_dataset_load_idx(write_file(ip, sizeof ip, "b-img", &img, 0),
                                   write_file(lp, sizeof lp, "b-lab", &lab, 0), &ds));
    const int64_t idx[3] = {4, 0, 2};
    const double  mean = 0.1307, std = 0.3081;
    float         xf[3 * R * C];
    double        xd[3 * R * C];
    int64_t       lf[3] = {-1, -1, -1}, ld[3] = {-1, -1, -1};
    ddl_dataset_batch_f32(&ds, idx, 3, mean, std, xf, lf);
    ddl_dataset_batch_f64(&ds, idx, 3, mean, std, xd, ld);
    for (int b = 0; b < 3; b++) {
        ASSERT_EQ(lf[b], ref_labels[idx[b]]);
        ASSERT_EQ(ld[b], ref_labels[idx[b]]);
        for (int k = 0; k < R * C; k++) {
            double want = (ref_pixel(idx[b] * R * C + k) / 255.0 - mean) / std;
            ASSERT_NEAR(xd[b * R * C + k], want, 1e-15);
            ASSERT_NEAR(xf[b * R * C + k], want, 1e-6 * fabs(want) + 1e-7);
        }
    }
    // Spot values: pixel 0 of sample 0 is 11, pixel 0 of sample 4 is (48 * 37 + 11) & 255 = 251.
    ASSERT_NEAR(xd[R * C], (11 / 255.0 - mean) / std, 1e-15);
    ASSERT_NEAR(xd[0], (251 / 255.0 - mean) / std, 1e-15);
    // Identity normalization gives pixel / 255; labels may be omitted.
    ddl_dataset_batch_f64(&ds, idx, 1, 0.0, 1.0, xd, NULL);
    ASSERT_NEAR(xd[0], 251 / 255.0, 1e-15);
    ddl_dataset_free(&ds);
}

// Facts about Debian's dataset-fashion-mnist computed with numpy (gzip + frombuffer).
static void test_fashion_mnist(void)
{
    struct stat sb;
    if (stat(FASHION_DIR, &sb) != 0) {
        printf("  skipped: %s not found (install dataset-fashion-mnist)\n", FASHION_DIR);
        return;
    }
    static const struct {
        int      train;
        int64_t  n;
        uint64_t pixel_sum;
        uint8_t  first_labels[10];
    } splits[2] = {
        {1, 60000, 3431114169ull, {9, 0, 0, 3, 0, 2, 7, 2, 5, 5}},
        {0, 10000, 573469082ull, {9, 2, 1, 1, 6, 1, 4, 6, 5, 7}},
    };
    for (int s = 0; s < 2; s++) {
        ddl_dataset ds;
        ASSERT_OK(ddl_dataset_load_mnist_dir(FASHION_DIR, splits[s].train, &ds));
        ASSERT_EQ(ds.n, splits[s].n);
        ASSERT_EQ(ds.ndim, 2);
        ASSERT_TRUE(ds.dims[0] == 28 && ds.dims[1] == 28);
        ASSERT_EQ(ds.sample_size, 784);
        ASSERT_EQ(ds.num_classes, 10);
        int64_t hist[256] = {0};
        for (int64_t i = 0; i < ds.n; i++) {
            hist[ds.labels[i]]++;
        }
        for (int k = 0; k < 10; k++) {
            ASSERT_EQ(hist[k], ds.n / 10);
        }
        for (int k = 0; k < 10; k++) {
            ASSERT_EQ(ds.labels[k], splits[s].first_labels[k]);
        }
        uint64_t sum = 0;
        for (int64_t i = 0; i < ds.n * ds.sample_size; i++) {
            sum += ds.pixels[i];
        }
        ASSERT_EQ(sum, splits[s].pixel_sum);
        printf("  fashion-mnist %s: n = %lld, 28 x 28, 10 classes x %lld, pixel mean %.4f\n",
               splits[s].train ? "train" : "t10k", (long long)ds.n, (long long)(ds.n / 10),
               (double)sum / 255.0 / (double)(ds.n * ds.sample_size));
        ddl_dataset_free(&ds);
    }
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

// .npy (the other array reader): a header shape whose product overflows, (2^32, 2^32)
// with no data, used to wrap to 0 elements and be accepted.
static void test_npy_sizes(void)
{
    char path[512];
    path_in_tmp(path, sizeof path, "wrap.npy");
    const char dict[] = "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, "
                        "4294967296), }";
    char  header[128];
    int   n   = snprintf(header, sizeof header, "%-117s\n", dict);
    FILE *fp  = fopen(path, "wb");
    unsigned char magic[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)n, 0};
    ASSERT_TRUE(fp != NULL && fwrite(magic, 1, 10, fp) == 10 &&
                fwrite(header, 1, (size_t)n, fp) == (size_t)n && fclose(fp) == 0);
    ddl_tensor_t *t = NULL;
    ASSERT_STATUS(ddl_npy_read(path, &t), DDL_EPROTO);
    ASSERT_TRUE(t == NULL && strstr(ddl_last_error(), "[4294967296, 4294967296]") != NULL);
    // A dimension past int64 in the header text.
    fp = fopen(path, "wb");
    snprintf(header, sizeof header, "%-117s\n",
             "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }");
    ASSERT_TRUE(fp != NULL && fwrite(magic, 1, 10, fp) == 10 &&
                fwrite(header, 1, 118, fp) == 118 && fclose(fp) == 0);
    ASSERT_STATUS(ddl_npy_read(path, &t), DDL_EPROTO);

    // FIFOs are refused at once instead of blocking in open (.npy and IDX).
    char fifo[512], lp[512];
    path_in_tmp(fifo, sizeof fifo, "fifo");
    ASSERT_TRUE(mkfifo(fifo, 0600) == 0);
    ASSERT_STATUS(ddl_npy_read(fifo, &t), DDL_EPROTO);
    ASSERT_TRUE(strstr(ddl_last_error(), "not a regular file") != NULL);
    bytes lab = labels_file(N, N);
    write_file(lp, sizeof lp, "fifo-lab", &lab, 0);
    expect_refused(fifo, lp, DDL_EPROTO, fifo, "not a regular file", 0);
    unlink(fifo);
}

int main(void)
{
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/ddl_test_idx.XXXXXX",
             base != NULL && *base ? base : "/tmp");
    ASSERT_TRUE(mkdtemp(tmpdir) != NULL);

    int64_t live = ddl_alloc_bytes_live();
    printf("roundtrip\n");
    test_roundtrip();
    printf("corrupt headers\n");
    test_corrupt_headers();
    printf("corrupt data\n");
    test_corrupt_data();
    printf("npy sizes\n");
    test_npy_sizes();
    printf("mnist dir\n");
    test_mnist_dir();
    printf("shuffle\n");
    test_shuffle();
    printf("batch\n");
    test_batch();
    printf("fashion-mnist\n");
    test_fashion_mnist();
    ASSERT_EQ(ddl_alloc_bytes_live(), live);

    ASSERT_EQ(nftw(tmpdir, remove_entry, 16, FTW_DEPTH | FTW_PHYS), 0);
    printf("test_idx: all passed\n");
    return 0;
}
