// ddl/npy.h: NumPy .npy files (format 1.0/2.0, little-endian f32/f64/i64/u8, C order),
// readable by numpy.load alone. No MPI.
#ifndef DDL_NPY_H
#define DDL_NPY_H

#include "ddl/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

// Writes t to path (temp file + rename, so a reader never sees a partial file).
DDL_EXTERN ddl_status ddl_npy_write(const char *path, const ddl_tensor_t *t);
// Reads a .npy of dtype <f4 or <f8 (C order) into a new tensor. Validates the header,
// shape and file size before allocating. Caller owns *out.
DDL_EXTERN ddl_status ddl_npy_read(const char *path, ddl_tensor_t **out);

#ifdef __cplusplus
}
#endif
#endif // DDL_NPY_H
