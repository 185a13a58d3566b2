// ddl/tensor.h: dense row-major tensors (f32, f64; up to 8 dimensions) and boxes.
//
// A tensor is a small public struct (as ggml_tensor is): dtype, shape and a pointer to
// contiguous, 64-byte aligned row-major data. A tensor either owns its data (created
// with ddl_tensor_create) or is a view of memory owned elsewhere (ddl_tensor_view).
// A zero-volume tensor (some dimension 0) is valid everywhere: ranks that hold no
// part of a distributed tensor hold one.
//
// A box is a half-open index range [start, stop) per dimension. Packing copies the
// elements of a box of a tensor into a flat row-major buffer; unpacking copies (or adds)
// them back. These are the building blocks of every data movement in the engine.
//
//   ddl_tensor_t *t;
//   ddl_shape s = ddl_shape_make(2, (int64_t[]){4, 5});
//   ddl_tensor_create(DDL_F64, &s, &t);          // zero-filled
//   ddl_box b = ddl_box_make(2, (int64_t[]){1, 0}, (int64_t[]){3, 5});
//   double buf[10];
//   ddl_tensor_pack(t, &b, buf);                 // rows 1..2 into buf
//   ddl_tensor_unpack_add(t, &b, buf);           // t[1:3, :] += buf
//   ddl_tensor_destroy(&t);
#ifndef DDL_TENSOR_H
#define DDL_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddl/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DDL_MAX_DIMS 8
// The most elements one tensor (local or global) may have: 2^34 (64 GiB of f32). Shapes
// from outside (specs, checkpoints, .npy and safetensors files, the wire) are refused
// past it with EINVAL naming the shape, before their products can overflow int64 or
// anything is allocated for them.
#define DDL_MAX_TENSOR_ELEMENTS ((int64_t)1 << 34)

typedef enum { DDL_F32 = 0, DDL_F64 = 1 } ddl_dtype;

typedef struct ddl_shape {
    int     ndim;
    int64_t d[DDL_MAX_DIMS];
} ddl_shape;

typedef struct ddl_box {
    int     ndim;
    int64_t start[DDL_MAX_DIMS];
    int64_t stop[DDL_MAX_DIMS];
} ddl_box;

typedef struct ddl_tensor {
    ddl_dtype dtype;
    ddl_shape shape;
    void     *data;  // contiguous row-major; NULL allowed only when volume is 0
    bool      owns;  // true when destroy must free data
} ddl_tensor_t;

// ---- shapes and boxes (not collective, no allocation) ----------------------
DDL_EXTERN size_t    ddl_dtype_size(ddl_dtype dt);
DDL_EXTERN const char *ddl_dtype_name(ddl_dtype dt);
DDL_EXTERN ddl_shape ddl_shape_make(int ndim, const int64_t *d);
// Product of the dimensions; -1 if a dimension is negative or the product overflows int64.
DDL_EXTERN int64_t   ddl_shape_numel(const ddl_shape *s);
// The product, checked: EINVAL naming the shape for a bad ndim, a negative dimension, or
// more than DDL_MAX_TENSOR_ELEMENTS elements (overflow included).
DDL_EXTERN ddl_status ddl_shape_numel_checked(const ddl_shape *s, int64_t *out);
DDL_EXTERN bool      ddl_shape_equal(const ddl_shape *a, const ddl_shape *b);
// Writes "[a, b, c]" into buf (always NUL-terminated); returns buf.
DDL_EXTERN char     *ddl_shape_str(const ddl_shape *s, char *buf, size_t len);

DDL_EXTERN ddl_box   ddl_box_make(int ndim, const int64_t *start, const int64_t *stop);
// The box [0, shape) covering a whole tensor.
DDL_EXTERN ddl_box   ddl_box_full(const ddl_shape *s);
// Volume of a box (empty extents count 0); -1 if it overflows int64.
DDL_EXTERN int64_t   ddl_box_numel(const ddl_box *b);
DDL_EXTERN ddl_shape ddl_box_shape(const ddl_box *b);
// Intersection of a and b (same ndim). Returns false, and an empty box, when they do
// not overlap.
DDL_EXTERN bool      ddl_box_intersect(const ddl_box *a, const ddl_box *b, ddl_box *out);
// Shifts a box by -origin in each dimension (global -> local coordinates).
DDL_EXTERN ddl_box   ddl_box_shift(const ddl_box *b, const int64_t *origin, int sign);
// True if box lies inside [0, shape).
DDL_EXTERN bool      ddl_box_inside(const ddl_box *b, const ddl_shape *s);

// ---- tensors ---------------------------------------------------------------
// Allocates a zero-filled tensor. Caller owns *out; free with ddl_tensor_destroy.
DDL_EXTERN ddl_status ddl_tensor_create(ddl_dtype dt, const ddl_shape *shape, ddl_tensor_t **out);
// Wraps memory owned elsewhere (no copy). data must stay valid while the view is used.
DDL_EXTERN ddl_status ddl_tensor_view(ddl_dtype dt, const ddl_shape *shape, void *data,
                                      ddl_tensor_t **out);
// NULL-safe; sets *t to NULL.
DDL_EXTERN void       ddl_tensor_destroy(ddl_tensor_t **t);
DDL_EXTERN int64_t    ddl_tensor_numel(const ddl_tensor_t *t);
DDL_EXTERN size_t     ddl_tensor_bytes(const ddl_tensor_t *t);
DDL_EXTERN void       ddl_tensor_zero(ddl_tensor_t *t);
// y = x elementwise; shapes and dtypes must match.
DDL_EXTERN ddl_status ddl_tensor_copy(const ddl_tensor_t *x, ddl_tensor_t *y);
// Value of element i (flat index) as double, and setting it.
DDL_EXTERN double     ddl_tensor_get(const ddl_tensor_t *t, int64_t i);
DDL_EXTERN void       ddl_tensor_set(ddl_tensor_t *t, int64_t i, double v);
// Sum over elements of x*y in double precision (a local inner product).
DDL_EXTERN double     ddl_tensor_dot(const ddl_tensor_t *x, const ddl_tensor_t *y);
// Fills with uniform values in [-1, 1) from (seed, stream), element i at counter i.
DDL_EXTERN void       ddl_tensor_fill_uniform(ddl_tensor_t *t, uint64_t seed, uint64_t stream);

// ---- box movement ----------------------------------------------------------
// Copies the elements of box b of t into the flat buffer buf (row-major over the box).
// The box must lie inside t. Not collective; allocates nothing.
DDL_EXTERN void ddl_tensor_pack(const ddl_tensor_t *t, const ddl_box *b, void *buf);
// Copies buf into box b of t (overwrite).
DDL_EXTERN void ddl_tensor_unpack(ddl_tensor_t *t, const ddl_box *b, const void *buf);
// Adds buf into box b of t.
DDL_EXTERN void ddl_tensor_unpack_add(ddl_tensor_t *t, const ddl_box *b, const void *buf);
// Copies box bx of x into box by of y (same box shapes; x and y same dtype).
DDL_EXTERN void ddl_tensor_copy_box(const ddl_tensor_t *x, const ddl_box *bx, ddl_tensor_t *y,
                                    const ddl_box *by);
// Adds box bx of x into box by of y.
DDL_EXTERN void ddl_tensor_add_box(const ddl_tensor_t *x, const ddl_box *bx, ddl_tensor_t *y,
                                   const ddl_box *by);
// Sets box b of t to zero.
DDL_EXTERN void ddl_tensor_zero_box(ddl_tensor_t *t, const ddl_box *b);
// Sets box b of t to v (in t's dtype; -INFINITY for a max pool's padding).
DDL_EXTERN void ddl_tensor_fill_box(ddl_tensor_t *t, const ddl_box *b, double v);

#ifdef __cplusplus
}
#endif
#endif // DDL_TENSOR_H
