// tools/verify/verify.h: distdl-verify's case model shared by its op families.
//
// A case is a JSON object. Every rank parses the same text, so every rank reaches the
// same verdict on a malformed case and exits 2 without communicating (no hang).
#ifndef DDL_VERIFY_H
#define DDL_VERIFY_H

#include <jansson.h>
#include <mpi.h>
#include <stdbool.h>

#include "ddl/primitives.h"

#define VERIFY_PASS 0
#define VERIFY_FAIL 1
#define VERIFY_INVALID 2

// The parsed common part of a case plus the raw object for op-specific keys.
typedef struct vcase {
    json_t     *obj;
    const char *op;
    ddl_dtype   dt;
    uint64_t    seed;
    int         world_size;
    int         world_rank;
    char        err[1024];  // why the case is invalid
} vcase;

// Records why a case is invalid; returns VERIFY_INVALID.
int vcase_invalid(vcase *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// Checks that every key of the object is in `allowed` (NULL-terminated).
int vcase_check_keys(vcase *c, const char *const *allowed);

// Typed getters. `required` false means the key may be absent (then *out keeps its
// default). Return VERIFY_PASS or VERIFY_INVALID with a message naming the key.
int vcase_get_bool(vcase *c, const char *key, bool required, bool *out);
int vcase_get_int(vcase *c, const char *key, bool required, long long min, long long max,
                  long long *out);
int vcase_get_double(vcase *c, const char *key, bool required, double *out);
int vcase_get_string(vcase *c, const char *key, bool required, const char **out);
// An array of integers; *n gets its length (1..maxn), each within [min, max].
int vcase_get_ints(vcase *c, const char *key, bool required, int maxn, long long min,
                   long long max, int64_t *vals, int *n);
// A shape: array of 1..8 non-negative integers.
int vcase_get_shape(vcase *c, const char *key, bool required, ddl_shape *out);
// A partition object {"ranks":[...],"shape":[...]} created over MPI_COMM_WORLD
// (collective over its ranks). Validates ranks against the world size.
int vcase_get_partition(vcase *c, const char *key, bool required, ddl_partition_t **out);

// Reports a ddl_status failure from the engine: invalid configurations (EINVAL,
// ESHAPE) become VERIFY_INVALID with the engine's message; anything else VERIFY_FAIL.
int vcase_status(vcase *c, ddl_status st, const char *what);

// Global adjoint error over MPI_COMM_WORLD, as DESIGN.md defines it.
double verify_adjoint_error(const ddl_tensor_t *x, const ddl_tensor_t *Fx, const ddl_tensor_t *y,
                            const ddl_tensor_t *Fty);
double verify_adjoint_tol(ddl_dtype dt);

// Creates a tensor of the given shape filled with seeded values in [-1, 1) that differ
// per rank and per stream.
ddl_status verify_random(ddl_dtype dt, const ddl_shape *s, uint64_t seed, uint64_t stream,
                         ddl_tensor_t **out);

// Test-only fault injection (DDL_VERIFY_FAIL_ALLOC="<rank>:<n>", read by main): on
// that world rank, the first object under test to be built arms
// ddl_alloc_fail_after(n + 1, 0): the (n+1)-th allocation after it fails, so the checks
// that follow meet an allocation failure on one rank only. (The creation of plans and
// layers is swept by tests/engine/test_session.c instead.)
extern long long verify_fail_alloc_after;  // -1: off
void             verify_arm_fail_alloc(void);

// Op families: each returns VERIFY_PASS/FAIL/INVALID and prints its figures on rank 0.
// Returns -1 when `op` is not one of the family's.
int verify_primitive(vcase *c);
int verify_layer(vcase *c);

#endif // DDL_VERIFY_H
