// tests/fuzz/fuzz_npy.c: bytes -> ddl_npy_read (the engine's .npy reader, used by
// ddl_import_npy_dir), through a memfd path.
#include "fuzz_util.h"

#include "ddl/base.h"
#include "ddl/npy.h"
#include "ddl/tensor.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static fuzz_file f;
    if (f.path[0] == '\0') {
        fuzz_file_init(&f, "fuzz.npy");
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
