// tests/support/mpi_test.h: MPI test helpers: init/finalize, the adjoint test, and
// gathering a distributed tensor onto one rank.
#ifndef DDL_MPI_TEST_H
#define DDL_MPI_TEST_H

#include <mpi.h>

#include "ddl/model.h"
#include "ddl/primitives.h"
#include "test.h"

// MPI_Init, errors-return on COMM_WORLD, and ddl_test_rank.
void ddl_test_mpi_init(int *argc, char ***argv);
// Barrier and MPI_Finalize; returns 0 for main to return.
int  ddl_test_mpi_finalize(void);
// Skips (exit 7 on every rank) when the world has fewer than n ranks.
void ddl_test_require_ranks(int n);

// The adjoint (dot-product) test over comm: x and Fx are this rank's blocks of x and
// F x; y and Fty of y and F* y. Returns
//   |<Fx, y> - <x, F*y>| / max(|Fx||y|, |x||F*y|)
// (0 when both inner products and norms vanish), identical on every rank of comm.
double ddl_test_adjoint_error(MPI_Comm comm, const ddl_tensor_t *x, const ddl_tensor_t *Fx,
                              const ddl_tensor_t *y, const ddl_tensor_t *Fty);

// Tolerance by dtype: 1e-13 for f64, 1e-5 for f32.
double ddl_test_adjoint_tol(ddl_dtype dt);

// Creates a partition over world ranks [first, first + prod(shape)).
ddl_partition_t *ddl_test_partition_range(int first, int ndim, const int *shape);

// Creates a tensor of the given shape filled with seeded uniform values in [-1, 1)
// (seed mixed with this rank so ranks differ).
ddl_tensor_t *ddl_test_random(ddl_dtype dt, const ddl_shape *shape, uint64_t seed);

// A tensor of the given shape with every element set to fill.
ddl_tensor_t *ddl_test_filled(ddl_dtype dt, const ddl_shape *shape, double fill);
// An output tensor followed by guard elements that catch writes past its end (a chunk
// loop running over); ddl_test_free_guarded checks the guards and frees it.
ddl_tensor_t *ddl_test_guarded(ddl_dtype dt, const ddl_shape *shape, double fill);
void          ddl_test_free_guarded(ddl_tensor_t **t);

// The model of spec `text` (named `source` in messages) over comm, whose size is the
// spec's world size; fails the test on any error.
ddl_model_t *ddl_test_model(MPI_Comm comm, const char *text, const char *source);

// The spec at `path` when its world size is this world's (MPI_COMM_WORLD), else NULL: for
// the callbacks of ddl_test_each_file over a directory of specs, which return 0 for NULL.
// Fails the test when the spec cannot be loaded.
ddl_spec_t *ddl_test_spec_for_world(const char *path);

// Two builds of one classifier spec that must agree bit for bit (fused and unfused
// layers, shared and owned scratch): both train `steps` steps on the same batch (B
// samples of x, x_bytes on rank 0; labels), then evaluate it and predict 2 samples
// (`classes` outputs each, `item` bytes per value; a short-batch copy when the spec has
// one). Every loss, hit count, parameter, evaluation and prediction must be identical,
// else the job aborts naming what differs between `what` ("the fused and the unfused
// model"). Returns the evaluation's mean loss. Collective.
double ddl_test_same_bits(ddl_model_t *a, ddl_model_t *b, const void *x, size_t x_bytes,
                          const int64_t *labels, int64_t B, int steps, int classes, size_t item,
                          const char *what);
// The batch both tests use: n values of 2 u - 1 (u uniform from seed) in f32 or f64
// (item bytes each), malloc'd.
void *ddl_test_uniform_batch(size_t n, size_t item, uint64_t seed);

// n seeded uniform values in [lo, hi) into buf as f32 (es 4) or f64 (es 8): sample i is
// ddl_rng_uniform(seed, 0, i), the same on every rank.
void ddl_test_fill(void *buf, size_t es, int64_t n, uint64_t seed, double lo, double hi);

#endif // DDL_MPI_TEST_H
