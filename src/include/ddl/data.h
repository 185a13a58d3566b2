// ddl/data.h: datasets in IDX (MNIST) format, gzip'd or plain, and seeded batching.
// No MPI: the reading rank loads and batches; the model scatters batches onward.
#ifndef DDL_DATA_H
#define DDL_DATA_H

#include <stdint.h>

#include "ddl/status.h"
#include "ddl/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

// An image-classification dataset: n samples of `sample_dims` (e.g. 28 x 28) uint8
// pixels and uint8 labels.
typedef struct ddl_dataset {
    int64_t  n;
    int      ndim;            // dims of one sample (1..3)
    int64_t  dims[3];         // entries past ndim are 1
    int64_t  sample_size;     // product of dims
    uint8_t *pixels;          // n * sample_size
    uint8_t *labels;          // n
    int      num_classes;     // max label + 1
} ddl_dataset;

// Reads an IDX image file (2..4 dims: n, then the sample dims) and its label file (1 dim:
// n), each gzip'd or plain. Validates the magic numbers, dtypes (unsigned byte only),
// dimensions (all > 0), matching counts and a 4 GiB cap per file BEFORE allocating; a
// plain file's size is checked then too, a gzip stream must end exactly after the data
// (and pass its CRC). Errors name the file and what is wrong: DDL_EPROTO for malformed
// content, DDL_EIO when a file cannot be opened or read, DDL_ENOMEM. Not collective.
// The caller owns *out (free with ddl_dataset_free); on error *out is zeroed.
DDL_EXTERN ddl_status ddl_dataset_load_idx(const char *images_path, const char *labels_path,
                                           ddl_dataset *out);
// Loads <dir>/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] (train = 1 for the
// training split, 0 for the test split). For each file "<name>.gz" is preferred over
// "<name>"; if neither exists, DDL_ENOTFOUND with both paths in the message.
DDL_EXTERN ddl_status ddl_dataset_load_mnist_dir(const char *dir, int train, ddl_dataset *out);
// Frees the pixels and labels and zeroes *ds. NULL-safe; freeing twice is harmless.
DDL_EXTERN void       ddl_dataset_free(ddl_dataset *ds);

// A seeded permutation of [0, n) for epoch `epoch` (Fisher-Yates with the counter-based
// RNG ddl_rng_u64(seed, epoch, k), unbiased by rejection: the same (seed, epoch) always
// gives the same order). perm holds n entries; n <= 0 writes nothing.
DDL_EXTERN void ddl_dataset_shuffle(int64_t n, uint64_t seed, uint64_t epoch, int64_t *perm);

// Writes samples idx[0..count) as floats ((pixel / 255 - mean) / std) into x
// (count * sample_size, row-major [count, C=1, dims...]) and their labels into labels
// (count entries; may be NULL). Every idx[b] must be in [0, n) (asserted) and std > 0.
DDL_EXTERN void ddl_dataset_batch_f32(const ddl_dataset *ds, const int64_t *idx, int64_t count,
                                      double mean, double std, float *x, int64_t *labels);
DDL_EXTERN void ddl_dataset_batch_f64(const ddl_dataset *ds, const int64_t *idx, int64_t count,
                                      double mean, double std, double *x, int64_t *labels);
// The image target of samples idx[0..count): pixel / 255 in [0, 1] (dtype dt, F32 or F64),
// count * sample_size values row-major, as an autoencoder reconstructs them.
DDL_EXTERN void ddl_dataset_batch_images(const ddl_dataset *ds, const int64_t *idx, int64_t count,
                                         ddl_dtype dt, void *targets);

#ifdef __cplusplus
}
#endif
#endif // DDL_DATA_H
