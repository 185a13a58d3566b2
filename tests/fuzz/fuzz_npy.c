// tests/fuzz/fuzz_npy.c: bytes -> the .npy header parser of src/format/npy.c, the one the
// engine and the client library both read with: ddl_fmt_npy_parse on the bytes in memory,
// then ddl_npy_read (the engine's reader, used by ddl_import_npy_dir; through
// ddl_fmt_npy_read_header) through a memfd path.
#include "fuzz_util.h"

#include "ddl/base.h"
#include "ddl/format.h"
#include "ddl/npy.h"
#include "ddl/tensor.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static fuzz_file f;
    if (f.path[0] == '\0') {
        fuzz_file_init(&f, "fuzz.npy");
    }
    ddl_fmt_npy h;
    if (ddl_fmt_npy_parse("fuzz.npy", data, size, size, &h) == DDL_OK) {
        // The header promised exactly the rest of the file, shape x item bytes.
        uint64_t bytes = ddl_fmt_dtype_size(h.dtype);
        for (int i = 0; i < h.ndim; i++) {
            bytes *= (uint64_t)h.shape[i];
        }
        if (h.ndim > DDL_FMT_MAX_DIMS || h.data_offset > size || bytes != h.data_bytes ||
            h.data_bytes != size - h.data_offset) {
            abort();
        }
    }
    fuzz_file_set(&f, data, size);
    ddl_tensor_t *t = NULL;
    if (ddl_npy_read(f.path, &t) == DDL_OK) {
        // Touch every byte: the reader promised numel x item bytes.
        volatile uint8_t sink = 0;
        const uint8_t   *p    = t->data;
        for (size_t i = 0; i < ddl_tensor_bytes(t); i++) {
            sink ^= p[i];
        }
        (void)sink;
    }
    ddl_tensor_destroy(&t);
    return 0;
}
