// tests/fuzz/fuzz_idx.c: bytes -> ddl_dataset_load_idx (the IDX/MNIST loader, gzip'd or
// plain), through two memfd paths. The input is split in two: the first two bytes
// (little-endian, modulo the rest's length + 1) give the length of the images file, the
// remainder is the labels file.
#include "fuzz_util.h"

#include "ddl/base.h"
#include "ddl/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static fuzz_file img, lab;
    if (img.path[0] == '\0') {
        fuzz_file_init(&img, "images-idx3-ubyte");
        fuzz_file_init(&lab, "labels-idx1-ubyte");
    }
    if (size < 2) {
        return 0;
    }
    size_t split = ((size_t)data[0] | (size_t)data[1] << 8) % (size - 2 + 1);
    fuzz_file_set(&img, data + 2, split);
    fuzz_file_set(&lab, data + 2 + split, size - 2 - split);
    ddl_dataset ds;
    if (ddl_dataset_load_idx(img.path, lab.path, &ds) == DDL_OK) {
        // What a batch reads: every pixel of every sample, every label.
        volatile uint8_t sink = 0;
        for (int64_t i = 0; i < ds.n * ds.sample_size; i++) {
            sink ^= ds.pixels[i];
        }
        for (int64_t i = 0; i < ds.n; i++) {
            if (ds.labels[i] >= ds.num_classes) {
                abort();
            }
        }
        (void)sink;
        ddl_dataset_free(&ds);
    }
    return 0;
}
