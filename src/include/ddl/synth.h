// ddl/synth.h: synthetic volumetric segmentation data, generated on demand.
//
// "shapes3d": a volume [1, D, H, W] holding 1-3 spheres and 1-3 axis-aligned cubes of
// random size, position and intensity in Gaussian noise, with one label per voxel:
// 0 background, 1 sphere, 2 cube. Every sample is a pure function of (seed, split,
// index): no state, nothing stored, so every partitioning, every restart and every
// rank that asks sees the same data, and a batch costs only its own generation (about
// 100 ns per voxel). No MPI: the reading rank generates and the model scatters.
//
// Geometry (voxel centres at integer coordinates; S = min(D, H, W)):
//   sphere   radius r in [max(1.5, S/6), that + S/6), voxels with |p - c|^2 <= r^2
//   cube     half-side h in [max(1, S/8), that + S/8), voxels with |p_i - c_i| <= h
//   centre   uniform in [size, n - 1 - size] per axis (the whole object inside the
//            volume when it fits; the axis centre otherwise)
//   value    intensity in [0.5, 1.5) inside an object, 0 outside, plus N(0, noise^2)
// Objects are painted in order (spheres and cubes alternating, a sphere first); a later
// one overwrites an earlier one where they overlap, label and intensity alike.
#ifndef DDL_SYNTH_H
#define DDL_SYNTH_H

#include <stdbool.h>
#include <stdint.h>

#include "ddl/status.h"
#include "ddl/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DDL_SYNTH_SHAPES3D = 1 } ddl_synth_kind;

enum { DDL_SYNTH_BACKGROUND = 0, DDL_SYNTH_SPHERE = 1, DDL_SYNTH_CUBE = 2 };
#define DDL_SYNTH_CLASSES     3 // labels are in [0, 3)
#define DDL_SYNTH_MAX_OBJECTS 6

typedef struct ddl_synth_params {
    ddl_synth_kind kind;
    int64_t        dims[3]; // D, H, W (each >= 1)
    double         noise;   // standard deviation of the Gaussian noise (>= 0)
    uint64_t       seed;
} ddl_synth_params;

typedef struct ddl_synth_object {
    int    label;     // DDL_SYNTH_SPHERE or DDL_SYNTH_CUBE
    double center[3]; // voxel coordinates (d, h, w)
    double size;      // sphere radius or cube half-side, in voxels
    double intensity;
} ddl_synth_object;

// Checks the parameters (kind, dims >= 1 and at most 2^31 voxels, noise finite >= 0).
// Not collective.
DDL_EXTERN ddl_status ddl_synth_validate(const ddl_synth_params *p);

// The objects of sample `index` (>= 0) of split `split` (0 training, 1 test), in painting
// order, into objs (DDL_SYNTH_MAX_OBJECTS entries); returns how many (2 to 6).
DDL_EXTERN int ddl_synth_objects(const ddl_synth_params *p, int split, int64_t index,
                                 ddl_synth_object *objs);

// Generates samples idx[0..count) of a split: x [count, D, H, W] (dtype dt, values
// (v - mean) / std) and labels [count, D, H, W]. Validates everything (EINVAL naming the
// bad value) before writing anything; allocates nothing.
DDL_EXTERN ddl_status ddl_synth_batch(const ddl_synth_params *p, int split, const int64_t *idx,
                                      int64_t count, double mean, double std, ddl_dtype dt,
                                      void *x, int64_t *labels);
// The same, and dense targets [count, 1, D, H, W] (dtype dt) when targets is not NULL:
// the noise-free intensity of each voxel (0 outside the objects; not normalized: the
// denoising target), or with `mask` 1 inside an object and 0 outside. labels is filled
// as above (it is the painting's scratch too).
DDL_EXTERN ddl_status ddl_synth_batch_targets(const ddl_synth_params *p, int split,
                                              const int64_t *idx, int64_t count, double mean,
                                              double std, ddl_dtype dt, void *x, int64_t *labels,
                                              bool mask, void *targets);

// Per-rank generation: the voxels of one box of samples idx[0..count), bit for bit those
// ddl_synth_batch gives there: x and labels [count, box], box-shaped and row-major, either
// may be NULL (a rank's input box and label box may differ). The box is voxels [lo[d],
// hi[d]) along D, H, W, within the volume. Each voxel tests every object (at most
// DDL_SYNTH_MAX_OBJECTS) instead of painting them. Validates everything first; allocates
// nothing.
DDL_EXTERN ddl_status ddl_synth_box(const ddl_synth_params *p, int split, const int64_t *idx,
                                    int64_t count, const int64_t lo[3], const int64_t hi[3],
                                    double mean, double std, ddl_dtype dt, void *x,
                                    int64_t *labels);

#ifdef __cplusplus
}
#endif
#endif // DDL_SYNTH_H
