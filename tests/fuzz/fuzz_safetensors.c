// tests/fuzz/fuzz_safetensors.c: bytes -> the safetensors header parser of
// src/format/safetensors.c, which the engine and the client library both read with:
//  - ddl_fmt_st_prefix + ddl_fmt_st_parse on the bytes in memory, every accepted entry
//    checked to lie inside the data region;
//  - the engine's (safetensors.c st_parse via ddl__safetensors_parse: the header validated
//    entirely, then two requested tensors, "w" f32 [2, 3] and "b" f64 [4], checked against
//    it, as ddl_import_safetensors does on rank 0 before any collective);
//  - the client library's ddl_safetensors_read (the whole file into memory).
#include "fuzz_util.h"

#include "ddl/base.h"
#include "ddl/checkpoint.h"
#include "ddl/format.h"
#include "ddl/tensor.h"
#include "ddl_client.h"
#include "engine/durable.h"

static ddl_named_tensor want[2];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    static const char *names[2] = {"w", "b"};
    ddl_dtype          dt[2]    = {DDL_F32, DDL_F64};
    ddl_shape          sh[2]    = {{.ndim = 2, .d = {2, 3}}, {.ndim = 1, .d = {4}}};
    for (int i = 0; i < 2; i++) {
        want[i].name   = names[i];
        want[i].global = sh[i];
        want[i].box    = (ddl_box){.ndim = sh[i].ndim};
        for (int d = 0; d < sh[i].ndim; d++) {
            want[i].box.stop[d] = sh[i].d[d];
        }
        if (ddl_tensor_create(dt[i], &sh[i], &want[i].local) != DDL_OK) {
            abort();
        }
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static fuzz_file f;
    if (f.path[0] == '\0') {
        fuzz_file_init(&f, "fuzz.safetensors");
    }
    uint64_t hlen;
    if (size >= 8 && ddl_fmt_st_prefix("fuzz.safetensors", data, size, &hlen) == DDL_OK) {
        ddl_fmt_st h;
        if (ddl_fmt_st_parse("fuzz.safetensors", (const char *)data + 8, (size_t)hlen, size, &h) ==
            DDL_OK) {
            uint64_t covered = 0;
            for (size_t i = 0; i < h.count; i++) {
                const ddl_fmt_st_entry *e = &h.entries[i];
                if (e->begin > e->end || e->end > h.data_len || h.data_start + e->end > size) {
                    abort();
                }
                covered += e->end - e->begin;
            }
            if (covered != h.data_len) { // no holes, no overlap
                abort();
            }
        }
        ddl_fmt_st_free(&h);
    }
    fuzz_file_set(&f, data, size);

    FILE *fp = fopen(f.path, "rb");
    if (fp != NULL) {
        int64_t begin[2] = {0, 0};
        if (ddl__safetensors_parse("fuzz.safetensors", fp, 2, want, begin) == DDL_OK) {
            // Both requested tensors lie inside the file.
            for (int i = 0; i < 2; i++) {
                size_t bytes = ddl_tensor_bytes(want[i].local);
                if (begin[i] < 8 || (uint64_t)begin[i] + bytes > size) {
                    abort();
                }
            }
        }
        fclose(fp);
    }

    ddl_client_weights *w = NULL;
    if (ddl_safetensors_read(f.path, &w) == DDL_OK) {
        volatile uint8_t sink = 0;
        for (int64_t i = 0; i < w->count; i++) {
            const uint8_t *p = w->tensors[i].data;
            for (size_t k = 0; k < w->tensors[i].bytes; k++) {
                sink ^= p[k];
            }
        }
        (void)sink;
    }
    ddl_client_weights_destroy(&w);
    return 0;
}
