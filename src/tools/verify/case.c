// tools/verify/case.c: typed, validated access to a distdl-verify case.
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ddl/agree.h"
#include "ddl/base.h"
#include "verify.h"

int vcase_invalid(vcase *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    return VERIFY_INVALID;
}

int vcase_check_keys(vcase *c, const char *const *allowed)
{
    const char *key;
    json_t     *val;
    json_object_foreach(c->obj, key, val)
    {
        (void)val;
        bool ok = false;
        for (int i = 0; allowed[i] != NULL && !ok; i++) {
            ok = strcmp(allowed[i], key) == 0;
        }
        if (!ok) {
            char list[512] = "";
            for (int i = 0; allowed[i] != NULL; i++) {
                strncat(list, i ? ", " : "", sizeof list - strlen(list) - 1);
                strncat(list, allowed[i], sizeof list - strlen(list) - 1);
            }
            return vcase_invalid(c, "unknown key \"%s\" for op \"%s\" (allowed: %s)", key, c->op,
                                 list);
        }
    }
    return VERIFY_PASS;
}

static json_t *lookup(vcase *c, const char *key, bool required, int *rc)
{
    json_t *v = json_object_get(c->obj, key);
    *rc       = VERIFY_PASS;
    if (v == NULL && required) {
        *rc = vcase_invalid(c, "missing key \"%s\" (required by op \"%s\")", key, c->op);
    }
    return v;
}

int vcase_get_bool(vcase *c, const char *key, bool required, bool *out)
{
    int     rc;
    json_t *v = lookup(c, key, required, &rc);
    if (v == NULL) {
        return rc;
    }
    if (!json_is_boolean(v)) {
        return vcase_invalid(c, "\"%s\" must be true or false", key);
    }
    *out = json_is_true(v);
    return VERIFY_PASS;
}

int vcase_get_int(vcase *c, const char *key, bool required, long long min, long long max,
                  long long *out)
{
    int     rc;
    json_t *v = lookup(c, key, required, &rc);
    if (v == NULL) {
        return rc;
    }
    if (!json_is_integer(v)) {
        return vcase_invalid(c, "\"%s\" must be an integer", key);
    }
    long long x = json_integer_value(v);
    if (x < min || x > max) {
        return vcase_invalid(c, "\"%s\" = %lld is outside [%lld, %lld]", key, x, min, max);
    }
    *out = x;
    return VERIFY_PASS;
}

int vcase_get_double(vcase *c, const char *key, bool required, double *out)
{
    int     rc;
    json_t *v = lookup(c, key, required, &rc);
    if (v == NULL) {
        return rc;
    }
    if (!json_is_number(v)) {
        return vcase_invalid(c, "\"%s\" must be a number", key);
    }
    *out = json_number_value(v);
    return VERIFY_PASS;
}

int vcase_get_string(vcase *c, const char *key, bool required, const char **out)
{
    int     rc;
    json_t *v = lookup(c, key, required, &rc);
    if (v == NULL) {
        return rc;
    }
    if (!json_is_string(v)) {
        return vcase_invalid(c, "\"%s\" must be a string", key);
    }
    *out = json_string_value(v);
    return VERIFY_PASS;
}

int vcase_get_ints(vcase *c, const char *key, bool required, int maxn, long long min,
                   long long max, int64_t *vals, int *n)
{
    int     rc;
    json_t *v = lookup(c, key, required, &rc);
    if (v == NULL) {
        return rc;
    }
    if (!json_is_array(v)) {
        return vcase_invalid(c, "\"%s\" must be an array of integers", key);
    }
    size_t len = json_array_size(v);
    if (len < 1 || (int)len > maxn) {
        return vcase_invalid(c, "\"%s\" must have 1 to %d entries (has %zu)", key, maxn, len);
    }
    for (size_t i = 0; i < len; i++) {
        json_t *e = json_array_get(v, i);
        if (!json_is_integer(e)) {
            return vcase_invalid(c, "\"%s\"[%zu] must be an integer", key, i);
        }
        long long x = json_integer_value(e);
        if (x < min || x > max) {
            return vcase_invalid(c, "\"%s\"[%zu] = %lld is outside [%lld, %lld]", key, i, x, min,
                                 max);
        }
        vals[i] = x;
    }
    *n = (int)len;
    return VERIFY_PASS;
}

int vcase_get_shape(vcase *c, const char *key, bool required, ddl_shape *out)
{
    int64_t d[DDL_MAX_DIMS];
    int     n  = 0;
    int     rc = vcase_get_ints(c, key, required, DDL_MAX_DIMS, 0, 1LL << 40, d, &n);
    if (rc != VERIFY_PASS || n == 0) {
        return rc;
    }
    *out = ddl_shape_make(n, d);
    return VERIFY_PASS;
}

int vcase_get_partition(vcase *c, const char *key, bool required, ddl_partition_t **out)
{
    int     rc;
    json_t *v = lookup(c, key, required, &rc);
    if (v == NULL) {
        return rc;
    }
    if (!json_is_object(v)) {
        return vcase_invalid(c, "\"%s\" must be an object {\"ranks\": [...], \"shape\": [...]}",
                             key);
    }
    const char *k;
    json_t     *e;
    json_object_foreach(v, k, e)
    {
        (void)e;
        if (strcmp(k, "ranks") != 0 && strcmp(k, "shape") != 0) {
            return vcase_invalid(c, "unknown key \"%s\" in partition \"%s\" (allowed: ranks, shape)",
                                 k, key);
        }
    }
    json_t *jr = json_object_get(v, "ranks"), *js = json_object_get(v, "shape");
    if (!json_is_array(jr) || !json_is_array(js)) {
        return vcase_invalid(c, "partition \"%s\" needs arrays \"ranks\" and \"shape\"", key);
    }
    size_t nr = json_array_size(jr), ns = json_array_size(js);
    if (nr < 1 || (int)nr > c->world_size) {
        return vcase_invalid(c, "partition \"%s\" lists %zu ranks; the world has %d", key, nr,
                             c->world_size);
    }
    if (ns < 1 || ns > DDL_MAX_DIMS) {
        return vcase_invalid(c, "partition \"%s\" shape must have 1 to %d entries (has %zu)", key,
                             DDL_MAX_DIMS, ns);
    }
    int     ranks[4096], shape[DDL_MAX_DIMS];
    int64_t prod = 1;
    for (size_t i = 0; i < nr; i++) {
        json_t *x = json_array_get(jr, i);
        if (!json_is_integer(x)) {
            return vcase_invalid(c, "partition \"%s\" ranks[%zu] must be an integer", key, i);
        }
        long long r = json_integer_value(x);
        if (r < 0 || r >= c->world_size) {
            return vcase_invalid(c,
                                 "partition \"%s\" ranks[%zu] = %lld is beyond the world of %d "
                                 "ranks (run with mpirun -np %lld or more)",
                                 key, i, r, c->world_size, r + 1);
        }
        for (size_t j = 0; j < i; j++) {
            if (ranks[j] == r) {
                return vcase_invalid(c, "partition \"%s\" lists rank %lld twice", key, r);
            }
        }
        ranks[i] = (int)r;
    }
    for (size_t i = 0; i < ns; i++) {
        json_t *x = json_array_get(js, i);
        if (!json_is_integer(x) || json_integer_value(x) < 1 || json_integer_value(x) > 4096) {
            return vcase_invalid(c, "partition \"%s\" shape[%zu] must be an integer >= 1", key, i);
        }
        shape[i] = (int)json_integer_value(x);
        prod *= shape[i];
    }
    if (prod != (int64_t)nr) {
        return vcase_invalid(c, "partition \"%s\" shape multiplies to %lld but lists %zu ranks", key,
                             (long long)prod, nr);
    }
    ddl_status st = ddl_partition_create(MPI_COMM_WORLD, (int)nr, ranks, (int)ns, shape, out);
    return vcase_status(c, st, key);
}

long long verify_fail_alloc_after = -1;

void verify_arm_fail_alloc(void)
{
    if (verify_fail_alloc_after >= 0) {
        ddl_alloc_fail_after((uint64_t)verify_fail_alloc_after + 1, 0);
        verify_fail_alloc_after = -1;
    }
}

int vcase_status(vcase *c, ddl_status st, const char *what)
{
    // Every rank reaches each call: agree, so a failure seen by one rank (an allocation,
    // an MPI error) gives every rank the same verdict and none goes on into the next
    // collective alone.
    st = ddl_agree(MPI_COMM_WORLD, st);
    if (st == DDL_OK) {
        return VERIFY_PASS;
    }
    if (st == DDL_EINVAL || st == DDL_ESHAPE) {
        return vcase_invalid(c, "%s: %s", what, ddl_last_error());
    }
    snprintf(c->err, sizeof c->err, "%s failed: %s: %s", what, ddl_status_name(st),
             ddl_last_error());
    return VERIFY_FAIL;
}

double verify_adjoint_tol(ddl_dtype dt)
{
    return dt == DDL_F64 ? 1e-13 : 1e-5;
}

double verify_adjoint_error(const ddl_tensor_t *x, const ddl_tensor_t *Fx, const ddl_tensor_t *y,
                            const ddl_tensor_t *Fty)
{
    double loc[6] = {ddl_tensor_dot(Fx, y),  ddl_tensor_dot(x, Fty), ddl_tensor_dot(x, x),
                     ddl_tensor_dot(Fx, Fx), ddl_tensor_dot(y, y),   ddl_tensor_dot(Fty, Fty)};
    double g[6];
    MPI_Allreduce(loc, g, 6, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    double d = fmax(sqrt(g[3]) * sqrt(g[4]), sqrt(g[2]) * sqrt(g[5]));
    return d == 0.0 ? fabs(g[0] - g[1]) : fabs(g[0] - g[1]) / d;
}

ddl_status verify_random(ddl_dtype dt, const ddl_shape *s, uint64_t seed, uint64_t stream,
                         ddl_tensor_t **out)
{
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    ddl_status st = ddl_tensor_create(dt, s, out);
    if (st == DDL_OK) {
        ddl_tensor_fill_uniform(*out, seed, stream * 65536 + (uint64_t)rank);
    }
    return st;
}
