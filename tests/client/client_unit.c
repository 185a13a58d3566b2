// client_unit: libdistdl-client without a daemon -- safetensors and .npy round trips and rejects,
// status names, and the errors of a connection to nothing.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ddl_client.h"

static int failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            failures++;                                                                            \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, " [%s]\n", ddl_last_error());                                          \
        }                                                                                          \
    } while (0)

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static void test_safetensors(void)
{
    float             a[6] = {1, -2, 3.5f, 0, 1e-30f, -0.0f};
    double            b[2] = {M_PI, -1e300};
    int64_t           c[3] = {-1, 0, INT64_MAX};
    uint8_t           d[5] = {0, 1, 2, 254, 255};
    ddl_client_tensor t[5] = {
        {.name  = "conv1.weight",
         .dtype = DDL_WIRE_FP32,
         .ndim  = 2,
         .shape = {2, 3},
         .data  = a,
         .bytes = sizeof a},
        {.name  = "b",
         .dtype = DDL_WIRE_FP64,
         .ndim  = 1,
         .shape = {2},
         .data  = b,
         .bytes = sizeof b},
        {.name  = "c",
         .dtype = DDL_WIRE_INT64,
         .ndim  = 3,
         .shape = {1, 3, 1},
         .data  = c,
         .bytes = sizeof c},
        {.name  = "d",
         .dtype = DDL_WIRE_UINT8,
         .ndim  = 1,
         .shape = {5},
         .data  = d,
         .bytes = sizeof d},
        {.name  = "empty",
         .dtype = DDL_WIRE_FP32,
         .ndim  = 2,
         .shape = {0, 4},
         .data  = a,
         .bytes = 0},
    };
    ddl_client_weights w      = {.count = 5, .tensors = t};
    char               path[] = "/tmp/ddl-client-unit-XXXXXX";
    int                fd     = mkstemp(path);
    close(fd);
    CHECK(ddl_safetensors_write(path, &w) == DDL_OK, "write");
    ddl_client_weights *r = NULL;
    CHECK(ddl_safetensors_read(path, &r) == DDL_OK, "read");
    CHECK(r && r->count == 5, "count %lld", r ? (long long)r->count : -1LL);
    for (int i = 0; r && i < 5; i++) {
        ddl_client_tensor *u = ddl_client_weights_find(r, t[i].name);
        CHECK(u && u->dtype == t[i].dtype && u->ndim == t[i].ndim && u->bytes == t[i].bytes &&
                  memcmp(u->shape, t[i].shape, sizeof(int64_t) * (size_t)t[i].ndim) == 0 &&
                  memcmp(u->data, t[i].data, t[i].bytes) == 0,
              "tensor %s round trip", t[i].name);
    }
    CHECK(!ddl_client_weights_find(r, "nope"), "find of a missing name");
    ddl_client_weights_destroy(&r);
    CHECK(r == NULL, "destroy sets NULL");

    // The file layout: 8-byte length, JSON header padded to 8, data.
    FILE    *f  = fopen(path, "rb");
    uint64_t hl = 0;
    CHECK(fread(&hl, 8, 1, f) == 1 && hl % 8 == 0 && hl < 1000, "header length %llu",
          (unsigned long long)hl);
    fclose(f);

    // Rejects: truncated data, header length past the end, garbage header.
    char cmd[512];
    snprintf(cmd, sizeof cmd, "truncate -s -3 %s", path);
    CHECK(system(cmd) == 0, "truncate");
    CHECK(ddl_safetensors_read(path, &r) == DDL_EPROTO && r == NULL, "truncated file");
    f            = fopen(path, "r+b");
    uint64_t big = 1ull << 40;
    fwrite(&big, 8, 1, f);
    fclose(f);
    CHECK(ddl_safetensors_read(path, &r) == DDL_EPROTO, "huge header length");
    f              = fopen(path, "wb");
    uint64_t eight = 8;
    fwrite(&eight, 8, 1, f);
    fwrite("{nojson}", 8, 1, f);
    fclose(f);
    CHECK(ddl_safetensors_read(path, &r) == DDL_EPROTO, "bad JSON");
    f             = fopen(path, "wb");
    const char *h = "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}";
    uint64_t    n = strlen(h);
    fwrite(&n, 8, 1, f);
    fwrite(h, 1, n, f);
    fwrite("abcdefgh", 1, 8, f);
    fclose(f);
    CHECK(ddl_safetensors_read(path, &r) == DDL_EPROTO, "offsets that disagree with the shape");
    unlink(path);
    CHECK(ddl_safetensors_read(path, &r) == DDL_EIO, "missing file");
}

static void test_names(void)
{
    CHECK(strcmp(ddl_client_code_name(DDL_RPC_INVALID_ARGUMENT), "INVALID_ARGUMENT") == 0,
          "name 3");
    CHECK(strcmp(ddl_client_code_name(DDL_RPC_UNAUTHENTICATED), "UNAUTHENTICATED") == 0, "name 16");
    CHECK(strcmp(ddl_client_code_name(99), "UNKNOWN_CODE") == 0, "name 99");
    CHECK(ddl_wire_dtype_size(DDL_WIRE_FP64) == 8 && ddl_wire_dtype_size(DDL_WIRE_UINT8) == 1 &&
              ddl_wire_dtype_size((ddl_wire_dtype)9) == 0,
          "dtype sizes");
    CHECK(strcmp(ddl_wire_dtype_name(DDL_WIRE_INT64), "INT64") == 0, "dtype name");
    CHECK(strcmp(ddl_client_version_string(), "0.1.0") == 0, "version");
}

static void test_no_daemon(void)
{
    ddl_client_t *c = NULL;
    CHECK(ddl_client_connect(NULL, NULL, &c) == DDL_EINVAL && !c, "NULL address");
    ddl_client_options o = ddl_client_options_default();
    o.tls_cert_file      = "/nonexistent";
    CHECK(ddl_client_connect("127.0.0.1:1", &o, &c) == DDL_EINVAL && !c, "cert without CA");
    o             = ddl_client_options_default();
    o.tls_ca_file = "/nonexistent/ca.pem";
    CHECK(ddl_client_connect("127.0.0.1:1", &o, &c) == DDL_EIO && !c, "missing CA file");

    // Port 1 on loopback refuses: connect with a timeout gives up in time.
    o                   = ddl_client_options_default();
    o.connect_timeout_s = 0.5;
    double     t0       = now();
    ddl_status st       = ddl_client_connect("127.0.0.1:1", &o, &c);
    double     dt       = now() - t0;
    CHECK(st == DDL_ETIMEDOUT && !c && ddl_client_last_code() == DDL_RPC_UNAVAILABLE,
          "connect to a closed port: %s", ddl_status_name(st));
    CHECK(dt < 3.0, "connect took %.2f s with a 0.5 s timeout", dt);

    // Without waiting, connect succeeds and the first call reports UNAVAILABLE.
    o.connect_timeout_s = 0;
    o.call_timeout_s    = 2;
    CHECK(ddl_client_connect("127.0.0.1:1", &o, &c) == DDL_OK && c, "lazy connect");
    ddl_client_status_info s;
    st = ddl_client_get_status(c, &s);
    CHECK(st == DDL_EIO && ddl_client_last_code() == DDL_RPC_UNAVAILABLE &&
              strstr(ddl_last_error(), "GetStatus: UNAVAILABLE"),
          "GetStatus to nothing: %s", ddl_status_name(st));
    ddl_client_weights *w = NULL;
    st                    = ddl_client_pull_weights(c, &w);
    CHECK(st == DDL_EIO && !w, "PullWeights to nothing: %s", ddl_status_name(st));
    ddl_client_tensor t = {.name = "x", .dtype = DDL_WIRE_FP32, .ndim = 1, .shape = {1}};
    CHECK(ddl_client_push_weights(c, &t, 1, NULL, NULL) == DDL_EIO, "PushWeights to nothing");
    // Local argument errors never reach the wire and leave code OK.
    CHECK(ddl_client_predict(c, NULL, NULL) == DDL_EINVAL && ddl_client_last_code() == DDL_RPC_OK,
          "Predict(NULL)");
    t.dtype = (ddl_wire_dtype)7;
    CHECK(ddl_client_push_weights(c, &t, 1, NULL, NULL) == DDL_EINVAL, "bad dtype");
    ddl_client_destroy(&c);
    CHECK(c == NULL, "destroy sets NULL");
    ddl_client_destroy(&c); // NULL-safe
}

// Writes a .npy 1.0 file with header dict `dict` and `data_bytes` zero bytes of data.
static void write_raw_npy(const char *path, const char *dict, size_t data_bytes)
{
    char   hdr[256];
    size_t n = (size_t)snprintf(hdr, sizeof hdr, "%s", dict);
    while ((10 + n + 1) % 64)
        hdr[n++] = ' ';
    hdr[n++]                 = '\n';
    unsigned char pre[10]    = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(n & 0xff),
                                (unsigned char)(n >> 8)};
    FILE         *f          = fopen(path, "wb");
    fwrite(pre, 1, 10, f);
    fwrite(hdr, 1, n, f);
    for (size_t i = 0; i < data_bytes; i++)
        fputc(0, f);
    fclose(f);
}

static void test_npy(void)
{
    char dir[] = "/tmp/client-unit-npy-XXXXXX", path[128];
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(path, sizeof path, "%s/t.npy", dir);
    float             a[6] = {1, -2, 3.5f, 0, 1e-30f, -0.0f};
    double            b[2] = {M_PI, -1e300};
    int64_t           c[3] = {-1, 0, INT64_MAX};
    uint8_t           d[5] = {0, 1, 2, 254, 255};
    float             e    = 42.0f;
    ddl_client_tensor t[5] = {
        {.dtype = DDL_WIRE_FP32, .ndim = 2, .shape = {2, 3}, .data = a, .bytes = sizeof a},
        {.dtype = DDL_WIRE_FP64, .ndim = 1, .shape = {2}, .data = b, .bytes = sizeof b},
        {.dtype = DDL_WIRE_INT64, .ndim = 3, .shape = {1, 3, 1}, .data = c, .bytes = sizeof c},
        {.dtype = DDL_WIRE_UINT8, .ndim = 1, .shape = {5}, .data = d, .bytes = sizeof d},
        {.dtype = DDL_WIRE_FP32, .ndim = 0, .data = &e, .bytes = sizeof e},
    };
    for (int i = 0; i < 5; i++) {
        ddl_client_tensor r;
        CHECK(ddl_client_npy_write(path, &t[i]) == DDL_OK, "write %d", i);
        CHECK(ddl_client_npy_read(path, &r) == DDL_OK, "read %d", i);
        CHECK(r.dtype == t[i].dtype && r.ndim == t[i].ndim && r.bytes == t[i].bytes &&
                  memcmp(r.shape, t[i].shape, sizeof r.shape) == 0 &&
                  memcmp(r.data, t[i].data, r.bytes) == 0,
              "round trip %d", i);
        ddl_client_tensor_release(&r);
    }
    // Rejects, each naming the problem; *out untouched.
    static const struct {
        const char *dict;
        size_t      data;
        const char *why;
    } bad[] = {
        {"{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", 8, "not supported"},
        {"{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", 16, "C order"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }", 15, "needs 16 bytes"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }", 17, "needs 16 bytes"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776, 1099511627776), }",
         8, "more than 2^64"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, -1), }", 8, "bad dimension"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1, 1, 1, 1), }", 4,
         "dimensions"},
        {"{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }", 8, "not supported"},
        {"{'fortran_order': False, 'shape': (1,), }", 4, "no 'descr'"},
        {"['descr', '<f4']", 4, "not a dict"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_raw_npy(path, bad[i].dict, bad[i].data);
        ddl_client_tensor r = {.ndim = -7};
        CHECK(ddl_client_npy_read(path, &r) == DDL_EPROTO, "reject %zu", i);
        CHECK(strstr(ddl_last_error(), bad[i].why) != NULL, "reject %zu names '%s'", i,
              bad[i].why);
        CHECK(r.ndim == -7 && r.data == NULL, "reject %zu wrote *out", i);
    }
    FILE *f = fopen(path, "wb");
    fputs("not an array\n", f);
    fclose(f);
    ddl_client_tensor r;
    CHECK(ddl_client_npy_read(path, &r) == DDL_EPROTO && strstr(ddl_last_error(), "magic"),
          "text file");
    CHECK(ddl_client_npy_read(dir, &r) == DDL_EIO, "a directory");
    unlink(path);
    CHECK(ddl_client_npy_read(path, &r) == DDL_EIO, "a missing file");
    snprintf(path, sizeof path, "%s/no-such-dir/t.npy", dir);
    CHECK(ddl_client_npy_write(path, &t[0]) == DDL_EIO, "write into a missing directory");
    rmdir(dir);
}

int main(void)
{
    test_names();
    test_safetensors();
    test_npy();
    test_no_daemon();
    if (failures)
        fprintf(stderr, "client_unit: %d failures\n", failures);
    else
        printf("client_unit: all passed\n");
    return failures ? 1 : 0;
}
