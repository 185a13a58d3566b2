// The format library (ddl/format.h), the one parser per format that the engine, the daemon
// and the client share:
//  - .npy: header write -> parse round trip for every dtype and 0 to 8 dims, then each
//    refusal (bad magic, unknown version, truncated header, header longer than the file,
//    unknown dtype, Fortran order, malformed shape, too many dims, a dimension past int64,
//    a size past 2^64, data that does not match the shape) with its message;
//  - safetensors: header write -> parse round trip with metadata, the writer's refusals
//    (reserved or repeated names, bad metadata), then the reader's (short file, header
//    past the file, not JSON, duplicate keys, bad entries, offsets out of range, overlap,
//    holes, trailing bytes);
//  - WeightChunk: a chunk encoded here, split over slices at every byte, decodes to the
//    same fields and data; packed and unpacked shapes, unknown fields, over-long strings
//    and shapes are flagged; truncation, field 0, wire types 3/4/6/7 and NUL bytes in the
//    name are refused with their messages.
#include <stdlib.h>
#include <string.h>

#include "ddl/format.h"
#include "test.h"

#define ASSERT_REFUSED(expr, code, text)                                                           \
    do {                                                                                           \
        ASSERT_STATUS(expr, code);                                                                 \
        if (strstr(ddl_last_error(), text) == NULL) {                                              \
            TEST_FAIL_("%s: message '%s' does not say '%s'", #expr, ddl_last_error(), text);       \
        }                                                                                          \
    } while (0)

// ---- .npy ------------------------------------------------------------------------------

// A .npy file in buf: the format 1.0 prefix, dict padded to 64 bytes, data_bytes zeros.
static size_t npy_file(uint8_t *buf, size_t cap, const char *dict, size_t data_bytes)
{
    size_t n = strlen(dict), pad = (64 - (10 + n + 1) % 64) % 64, hlen = n + pad + 1;
    ASSERT_TRUE(10 + hlen + data_bytes <= cap);
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (uint8_t)(hlen & 0xff);
    buf[9] = (uint8_t)(hlen >> 8);
    memcpy(buf + 10, dict, n);
    memset(buf + 10 + n, ' ', pad);
    buf[10 + hlen - 1] = '\n';
    memset(buf + 10 + hlen, 0, data_bytes);
    return 10 + hlen + data_bytes;
}

static void test_npy_round_trip(void)
{
    static uint8_t buf[1 << 16];
    for (int dt = DDL_FMT_F32; dt <= DDL_FMT_U8; dt++) {
        for (int ndim = 0; ndim <= DDL_FMT_MAX_DIMS; ndim++) {
            int64_t shape[DDL_FMT_MAX_DIMS];
            size_t  bytes = ddl_fmt_dtype_size((ddl_fmt_dtype)dt);
            for (int d = 0; d < ndim; d++) {
                shape[d] = d == 2 ? 0 : 1 + d % 3;
                bytes *= (size_t)shape[d];
            }
            size_t len;
            ASSERT_OK(ddl_fmt_npy_header((ddl_fmt_dtype)dt, ndim, shape, buf, sizeof buf, &len));
            ASSERT_EQ(len % 64, 0);
            memset(buf + len, 0x5a, bytes);
            ddl_fmt_npy h;
            ASSERT_OK(ddl_fmt_npy_parse("rt.npy", buf, len + bytes, len + bytes, &h));
            ASSERT_EQ((int)h.dtype, dt);
            ASSERT_EQ(h.ndim, ndim);
            for (int d = 0; d < ndim; d++) {
                ASSERT_EQ(h.shape[d], shape[d]);
            }
            ASSERT_EQ(h.data_offset, len);
            ASSERT_EQ(h.data_bytes, bytes);
            // The same through a FILE, which is left at the data.
            FILE *f = fmemopen(buf, len + bytes, "rb");
            ASSERT_TRUE(f != NULL);
            ASSERT_OK(ddl_fmt_npy_read_header("rt.npy", f, len + bytes, &h));
            ASSERT_EQ(ftell(f), (long)len);
            fclose(f);
        }
    }
    // numpy's own spelling of a 1-tuple, and format 2.0.
    size_t n =
        npy_file(buf, sizeof buf, "{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }", 24);
    ddl_fmt_npy h;
    ASSERT_OK(ddl_fmt_npy_parse("one.npy", buf, n, n, &h));
    ASSERT_TRUE(h.dtype == DDL_FMT_F64 && h.ndim == 1 && h.shape[0] == 3);
    uint8_t v2[256];
    memcpy(v2, "\x93NUMPY\x02\x00", 8);
    size_t hlen = (size_t)buf[8] | (size_t)buf[9] << 8;
    v2[8] = buf[8], v2[9] = buf[9], v2[10] = 0, v2[11] = 0;
    memcpy(v2 + 12, buf + 10, hlen + 24);
    ASSERT_OK(ddl_fmt_npy_parse("v2.npy", v2, 12 + hlen + 24, 12 + hlen + 24, &h));
    ASSERT_EQ(h.data_offset, 12 + hlen);
    ASSERT_REFUSED(ddl_fmt_npy_header(DDL_FMT_F32, 9, (int64_t[9]){0}, buf, sizeof buf, &n),
                   DDL_EINVAL, "ndim 9");
    ASSERT_REFUSED(ddl_fmt_npy_header(DDL_FMT_F32, 1, (int64_t[1]){4}, buf, 16, &n), DDL_EINVAL,
                   "the buffer holds 16");
}

static void npy_refused(const char *dict, size_t data_bytes, const char *text)
{
    static uint8_t buf[4096];
    size_t         n = npy_file(buf, sizeof buf, dict, data_bytes);
    ddl_fmt_npy    h;
    ASSERT_REFUSED(ddl_fmt_npy_parse("bad.npy", buf, n, n, &h), DDL_EPROTO, text);
}

static void test_npy_refusals(void)
{
    const char *ok = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
    uint8_t     buf[512];
    size_t      n = npy_file(buf, sizeof buf, ok, 24);
    ddl_fmt_npy h;
    ASSERT_OK(ddl_fmt_npy_parse("ok.npy", buf, n, n, &h));
    // The prefix.
    ASSERT_REFUSED(ddl_fmt_npy_parse("short.npy", buf, 6, 6, &h), DDL_EPROTO, "magic");
    buf[1] = 'X';
    ASSERT_REFUSED(ddl_fmt_npy_parse("magic.npy", buf, n, n, &h), DDL_EPROTO,
                   "magic.npy is not a .npy file");
    buf[1] = 'N';
    buf[6] = 4;
    ASSERT_REFUSED(ddl_fmt_npy_parse("v4.npy", buf, n, n, &h), DDL_EPROTO,
                   "format version 4.0 is not supported");
    buf[6] = 2;
    ASSERT_REFUSED(ddl_fmt_npy_parse("v2.npy", buf, 11, 11, &h), DDL_EPROTO, "truncated header");
    buf[6] = 1;
    ASSERT_REFUSED(ddl_fmt_npy_parse("cut.npy", buf, 40, 40, &h), DDL_EPROTO,
                   "header length 118 does not fit the file (40 bytes)");
    ASSERT_REFUSED(ddl_fmt_npy_parse("part.npy", buf, 40, n, &h), DDL_EPROTO, "truncated header");
    buf[8] = 0, buf[9] = 0;
    ASSERT_REFUSED(ddl_fmt_npy_parse("zero.npy", buf, n, n, &h), DDL_EPROTO, "header length 0");
    // The dict.
    npy_refused("[1, 2]", 0, "the header is not a dict");
    npy_refused("{'fortran_order': False, 'shape': (2,), }", 8, "has no 'descr'");
    npy_refused("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", 8,
                "dtype '>f4' is not supported");
    npy_refused("{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", 8, "only C order");
    npy_refused("{'descr': '<f4', 'fortran_order': False, }", 8, "no 'shape' tuple");
    npy_refused("{'descr': '<f4', 'fortran_order': False, 'shape': (2; 3), }", 24,
                "bad shape tuple");
    npy_refused("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", 0,
                "bad dimension in shape");
    npy_refused("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", 0,
                "bad dimension in shape");
    npy_refused("{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1), }", 4,
                "more than 8 dimensions");
    // Sizes: a product past 2^64 (it used to wrap to 0 and be accepted), and data that is
    // not exactly the shape's.
    npy_refused("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", 0,
                "shape [4294967296, 4294967296] of FP32 needs more than 2^64 bytes");
    npy_refused(ok, 20, "shape [2, 3] of FP32 needs 24 bytes of data, the file has 20");
    npy_refused(ok, 28, "needs 24 bytes of data, the file has 28");
}

// ---- safetensors -----------------------------------------------------------------------

// A file in buf: the prefix for header, then header, then data_bytes bytes of 0x11.
static size_t st_file(char *buf, size_t cap, const char *header, size_t data_bytes)
{
    size_t n = strlen(header);
    ASSERT_TRUE(8 + n + data_bytes <= cap);
    for (int i = 0; i < 8; i++) {
        buf[i] = (char)(uint8_t)((uint64_t)n >> (8 * i));
    }
    memcpy(buf + 8, header, n);
    memset(buf + 8 + n, 0x11, data_bytes);
    return 8 + n + data_bytes;
}

static ddl_status st_parse_file(const char *buf, size_t n, ddl_fmt_st *h)
{
    uint64_t hlen;
    memset(h, 0, sizeof *h);
    ddl_status st = ddl_fmt_st_prefix("t.safetensors", (const uint8_t *)buf, n, &hlen);
    if (st != DDL_OK) {
        return st;
    }
    return ddl_fmt_st_parse("t.safetensors", buf + 8, (size_t)hlen, n, h);
}

static void test_st_round_trip(void)
{
    int64_t           ws[2] = {2, 3}, bs[1] = {4}, es[3] = {0, 7, 2};
    ddl_fmt_st_tensor t[3] = {
        {"w", "F32", 2, ws, 24},
        {"b", "F64", 1, bs, 32},
        {"empty", "U8", 3, es, 0},
    };
    char  *hdr;
    size_t len;
    ASSERT_OK(ddl_fmt_st_header("rt.safetensors", t, 3, "{\"format\": \"pt\"}", &hdr, &len));
    ASSERT_EQ(len % 8, 0);
    char *file = malloc(len + 56);
    memcpy(file, hdr, len);
    memset(file + len, 0, 56);
    ddl_fmt_st h;
    ASSERT_OK(st_parse_file(file, len + 56, &h));
    ASSERT_EQ(h.count, 3);
    ASSERT_EQ(h.data_start, len);
    ASSERT_EQ(h.data_len, 56);
    for (size_t i = 0; i < 3; i++) {
        const ddl_fmt_st_entry *e = ddl_fmt_st_find(&h, t[i].name);
        ASSERT_TRUE(e == &h.entries[i]); // the header's order is the writer's
        ASSERT_TRUE(strcmp(e->dtype, t[i].dtype) == 0 && e->ndim == t[i].ndim);
        for (int d = 0; d < e->ndim; d++) {
            ASSERT_EQ(e->shape[d], t[i].shape[d]);
        }
        ASSERT_EQ(e->end - e->begin, t[i].bytes);
    }
    ASSERT_TRUE(ddl_fmt_st_find(&h, "__metadata__") == NULL);
    ddl_fmt_st_free(&h);
    // Through a FILE.
    FILE *f = fmemopen(file, len + 56, "rb");
    ASSERT_OK(ddl_fmt_st_read_header("rt.safetensors", f, len + 56, &h));
    ASSERT_EQ(h.count, 3);
    ddl_fmt_st_free(&h);
    fclose(f);
    free(file);
    ddl_fmt_free(hdr);

    // The writer's refusals.
    ddl_fmt_st_tensor dup[2] = {{"w", "F32", 2, ws, 24}, {"w", "F32", 2, ws, 24}};
    ASSERT_REFUSED(ddl_fmt_st_header("d", dup, 2, NULL, &hdr, &len), DDL_EINVAL,
                   "tensor name 'w' is reserved");
    dup[1].name = "__metadata__";
    ASSERT_REFUSED(ddl_fmt_st_header("d", dup, 2, NULL, &hdr, &len), DDL_EINVAL,
                   "tensor name '__metadata__' is reserved");
    dup[1].name = "\xff\xfe";
    ASSERT_REFUSED(ddl_fmt_st_header("d", dup, 2, NULL, &hdr, &len), DDL_EINVAL,
                   "is not valid UTF-8");
    dup[1].dtype = "F13";
    ASSERT_REFUSED(ddl_fmt_st_header("d", dup, 2, NULL, &hdr, &len), DDL_EINVAL,
                   "tensor 1 has no name, dtype or shape");
    ASSERT_REFUSED(ddl_fmt_st_header("m.safetensors", t, 1, "{\"n\": 1}", &hdr, &len), DDL_EINVAL,
                   "metadata_json for m.safetensors must be a JSON object of strings");
}

static void st_refused(const char *header, size_t data, const char *text)
{
    static char buf[4096];
    size_t      n = st_file(buf, sizeof buf, header, data);
    ddl_fmt_st  h;
    ASSERT_REFUSED(st_parse_file(buf, n, &h), DDL_EPROTO, text);
    ddl_fmt_st_free(&h);
}

static void test_st_refusals(void)
{
    char       buf[64];
    ddl_fmt_st h;
    uint64_t   hlen;
    ASSERT_REFUSED(ddl_fmt_st_prefix("tiny", (const uint8_t *)"\0\0\0\0\0\0\0\0", 7, &hlen),
                   DDL_EPROTO, "tiny: 7 bytes, too short for a header");
    size_t n = st_file(buf, sizeof buf, "{}", 0);
    buf[0]   = 9;
    ASSERT_REFUSED(st_parse_file(buf, n, &h), DDL_EPROTO,
                   "header length 9 exceeds the file size 10");
    st_refused("[1]", 0, "the header is not a JSON object (wrong type)");
    st_refused("{\"a\": ", 0, "the header is not a JSON object");
    st_refused("{\"a\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]}, "
               "\"a\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [1, 2]}}",
               2, "not a JSON object");
    st_refused("{\"__metadata__\": {\"n\": 1}}", 0, "__metadata__ is not an object of strings");
    st_refused("{\"a\": {\"dtype\": \"U8\", \"shape\": [1]}}", 1,
               "entry 'a' needs a string \"dtype\"");
    st_refused("{\"a\": {\"dtype\": \"F13\", \"shape\": [1], \"data_offsets\": [0, 1]}}", 1,
               "entry 'a' has unknown dtype \"F13\"");
    st_refused("{\"a\": {\"dtype\": \"U8\", \"shape\": [-1], \"data_offsets\": [0, 1]}}", 1,
               "shape[0] is not a non-negative integer");
    st_refused("{\"a\": {\"dtype\": \"F64\", \"shape\": [4294967296, 4294967296], "
               "\"data_offsets\": [0, 0]}}",
               0, "entry 'a': shape exceeds the data region");
    st_refused("{\"a\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [2, 1]}}", 2,
               "entry 'a': data_offsets are not [begin, end]");
    st_refused("{\"a\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [0, 3]}}", 2,
               "data_offsets [0, 3] exceed the data region (2 bytes)");
    st_refused("{\"a\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [0, 1]}}", 2,
               "entry 'a': 1 data bytes, shape x dtype needs 2");
    st_refused("{\"a\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [0, 2]}, "
               "\"b\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [1, 3]}}",
               3, "the data of 'a' and 'b' overlap");
    st_refused("{\"a\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [1, 3]}}", 3,
               "1 data byte(s) before 'a' belong to no tensor");
    st_refused("{\"a\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [0, 2]}}", 18,
               "16 trailing byte(s) after the data of the last tensor");
}

// ---- WeightChunk -----------------------------------------------------------------------

static size_t put_varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    do {
        p[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v != 0);
    return n;
}

static size_t put_bytes(uint8_t *p, unsigned field, const void *b, size_t len)
{
    size_t n = put_varint(p, field << 3 | 2);
    n += put_varint(p + n, len);
    memcpy(p + n, b, len);
    return n + len;
}

static size_t put_uint(uint8_t *p, unsigned field, uint64_t v)
{
    size_t n = put_varint(p, field << 3);
    return n + put_varint(p + n, v);
}

// name, datatype, shape [2, 300] packed, offset 70000, first, an unknown field of each
// wire type, and 16 data bytes.
static size_t chunk(uint8_t *p, const char *name, size_t name_len)
{
    uint8_t packed[8];
    size_t  k = put_varint(packed, 2);
    k += put_varint(packed + k, 300);
    size_t n = put_bytes(p, 1, name, name_len);
    n += put_bytes(p + n, 2, "FP32", 4);
    n += put_bytes(p + n, 3, packed, k);
    n += put_uint(p + n, 4, 70000);
    n += put_uint(p + n, 6, 1);
    n += put_uint(p + n, 99, 5);
    n += put_varint(p + n, 98 << 3 | 1);
    memset(p + n, 0xee, 8), n += 8;
    n += put_varint(p + n, 97 << 3 | 5);
    memset(p + n, 0xee, 4), n += 4;
    n += put_bytes(p + n, 96, "skip", 4);
    n += put_bytes(p + n, 5, "0123456789abcdef", 16);
    return n;
}

static ddl_status decode_split(const uint8_t *p, size_t n, size_t cut, ddl_fmt_wchunk *w)
{
    ddl_fmt_span s[3] = {{p, cut}, {p + cut, 0}, {p + cut, n - cut}}; // an empty slice too
    return ddl_fmt_wchunk_decode(ddl_fmt_span_seg, s, 3, w);
}

static void test_wchunk(void)
{
    uint8_t msg[1024];
    size_t  n = chunk(msg, "conv1.weight", 12);
    for (size_t cut = 0; cut <= n; cut++) {
        ddl_fmt_span   s[3] = {{msg, cut}, {msg + cut, 0}, {msg + cut, n - cut}};
        ddl_fmt_wchunk w;
        ASSERT_OK(ddl_fmt_wchunk_decode(ddl_fmt_span_seg, s, 3, &w));
        ASSERT_TRUE(strcmp(w.name, "conv1.weight") == 0 && strcmp(w.datatype, "FP32") == 0);
        ASSERT_TRUE(w.first && !w.name_long && !w.datatype_long && !w.shape_long);
        ASSERT_TRUE(w.nshape == 2 && w.shape[0] == 2 && w.shape[1] == 300);
        ASSERT_EQ(w.offset, 70000);
        ASSERT_EQ(w.data_len, 16);
        char data[17] = {0};
        ASSERT_TRUE(ddl_fmt_cursor_take(&w.data, data, 16));
        ASSERT_TRUE(strcmp(data, "0123456789abcdef") == 0);
        ASSERT_TRUE(!ddl_fmt_cursor_take(&w.data, data, 1)); // the message ends there
    }
    ddl_fmt_wchunk w;
    // An empty message is a chunk of defaults; an unpacked shape; shapes and strings over
    // their size are flagged, not refused.
    ASSERT_OK(ddl_fmt_wchunk_decode(ddl_fmt_span_seg, NULL, 0, &w));
    ASSERT_TRUE(!w.first && w.nshape == 0 && w.data_len == 0);
    size_t k = 0;
    for (int d = 0; d < 9; d++) {
        k += put_uint(msg + k, 3, (uint64_t)d + 1);
    }
    k += put_bytes(msg + k, 2, "FLOAT32_WITH_A_LONG_NAME", 24);
    ASSERT_OK(decode_split(msg, k, 3, &w));
    ASSERT_TRUE(w.nshape == 8 && w.shape[7] == 8 && w.shape_long);
    ASSERT_TRUE(w.datatype_long && w.datatype[0] == '\0');
    static char long_name[600];
    memset(long_name, 'n', sizeof long_name);
    n = chunk(msg, long_name, sizeof long_name);
    ASSERT_OK(decode_split(msg, n, 7, &w));
    ASSERT_TRUE(w.name_long && w.name[0] == '\0' && w.data_len == 16);

    // Refusals.
    n = chunk(msg, "a\0b", 3);
    ASSERT_REFUSED(decode_split(msg, n, 2, &w), DDL_EPROTO,
                   "WeightChunk: name: a string holding a NUL byte is not accepted");
    n = chunk(msg, "conv1.weight", 12);
    ASSERT_REFUSED(decode_split(msg, n - 1, 5, &w), DDL_EPROTO, "WeightChunk: field 5 at byte");
    ASSERT_REFUSED(decode_split(msg, 17, 5, &w), DDL_EPROTO,
                   "WeightChunk: datatype: 4 bytes, the message ends first");
    ASSERT_REFUSED(decode_split(msg, 1, 1, &w), DDL_EPROTO, "WeightChunk: name: truncated length");
    uint8_t bad[16] = {0x80, 0x80};
    ASSERT_REFUSED(decode_split(bad, 2, 1, &w), DDL_EPROTO, "truncated key at byte 0");
    memset(bad, 0xff, 11);
    bad[11] = 0;
    ASSERT_REFUSED(decode_split(bad, 12, 1, &w), DDL_EPROTO, "truncated key");
    bad[0] = 0 << 3 | 0, bad[1] = 1;
    ASSERT_REFUSED(decode_split(bad, 2, 1, &w), DDL_EPROTO,
                   "field 0 of wire type 0 at byte 0 is not protobuf");
    for (unsigned wt = 3; wt <= 7; wt++) {
        if (wt == 5) {
            continue;
        }
        bad[0] = (uint8_t)(7 << 3 | wt), bad[1] = 0;
        ASSERT_REFUSED(decode_split(bad, 2, 1, &w), DDL_EPROTO, "is not protobuf");
    }
    // A packed shape whose length ends inside a varint.
    k        = put_varint(bad, 3 << 3 | 2);
    bad[k++] = 2, bad[k++] = 0x81, bad[k++] = 0x81, bad[k++] = 0x01;
    ASSERT_REFUSED(decode_split(bad, k, 2, &w), DDL_EPROTO, "field 3 at byte 0 is truncated");
}

int main(void)
{
    test_npy_round_trip();
    test_npy_refusals();
    test_st_round_trip();
    test_st_refusals();
    test_wchunk();
    printf("test_format: ok\n");
    return 0;
}
