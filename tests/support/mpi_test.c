// tests/support/mpi_test.c: shared MPI test helpers.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddl/base.h"
#include "mpi_test.h"

void ddl_test_mpi_init(int *argc, char ***argv)
{
    MPI_Init(argc, argv);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &ddl_test_rank);
}

int ddl_test_mpi_finalize(void)
{
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    return 0;
}

void ddl_test_require_ranks(int n)
{
    int size;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size < n) {
        if (ddl_test_rank == 0) {
            fprintf(stderr, "skipped: needs %d ranks, have %d\n", n, size);
        }
        MPI_Finalize();
        exit(DDL_TEST_SKIP);
    }
}

double ddl_test_adjoint_error(MPI_Comm comm, const ddl_tensor_t *x, const ddl_tensor_t *Fx,
                              const ddl_tensor_t *y, const ddl_tensor_t *Fty)
{
    double loc[6] = {ddl_tensor_dot(Fx, y),  ddl_tensor_dot(x, Fty), ddl_tensor_dot(x, x),
                     ddl_tensor_dot(Fx, Fx), ddl_tensor_dot(y, y),   ddl_tensor_dot(Fty, Fty)};
    double g[6];
    MPI_Allreduce(loc, g, 6, MPI_DOUBLE, MPI_SUM, comm);
    double d = fmax(sqrt(g[3]) * sqrt(g[4]), sqrt(g[2]) * sqrt(g[5]));
    if (d == 0.0) {
        return fabs(g[0] - g[1]);
    }
    return fabs(g[0] - g[1]) / d;
}

double ddl_test_adjoint_tol(ddl_dtype dt)
{
    return dt == DDL_F64 ? 1e-13 : 1e-5;
}

ddl_partition_t *ddl_test_partition_range(int first, int ndim, const int *shape)
{
    int n = 1;
    for (int i = 0; i < ndim; i++) {
        n *= shape[i];
    }
    int ranks[256];
    for (int i = 0; i < n; i++) {
        ranks[i] = first + i;
    }
    ddl_partition_t *P = NULL;
    ASSERT_OK(ddl_partition_create(MPI_COMM_WORLD, n, ranks, ndim, shape, &P));
    return P;
}

ddl_tensor_t *ddl_test_random(ddl_dtype dt, const ddl_shape *shape, uint64_t seed)
{
    ddl_tensor_t *t = NULL;
    ASSERT_OK(ddl_tensor_create(dt, shape, &t));
    ddl_tensor_fill_uniform(t, seed, (uint64_t)(ddl_test_rank + 1));
    return t;
}

ddl_tensor_t *ddl_test_filled(ddl_dtype dt, const ddl_shape *shape, double fill)
{
    ddl_tensor_t *t = NULL;
    ASSERT_OK(ddl_tensor_create(dt, shape, &t));
    for (int64_t i = 0; i < ddl_tensor_numel(t); i++) {
        ddl_tensor_set(t, i, fill);
    }
    return t;
}

#define NGUARD 16
#define GUARD  -12345.0

ddl_tensor_t *ddl_test_guarded(ddl_dtype dt, const ddl_shape *shape, double fill)
{
    int64_t n   = ddl_shape_numel(shape);
    void   *buf = ddl_malloc((size_t)(n + NGUARD) * ddl_dtype_size(dt));
    ASSERT_TRUE(buf != NULL);
    ddl_tensor_t *t = NULL, *all = NULL;
    ddl_shape     whole = ddl_shape_make(1, (int64_t[]){n + NGUARD});
    ASSERT_OK(ddl_tensor_view(dt, shape, buf, &t));
    ASSERT_OK(ddl_tensor_view(dt, &whole, buf, &all));
    for (int64_t i = 0; i < n + NGUARD; i++) {
        ddl_tensor_set(all, i, i < n ? fill : GUARD);
    }
    ddl_tensor_destroy(&all);
    return t;
}

void ddl_test_free_guarded(ddl_tensor_t **t)
{
    int64_t       n     = ddl_tensor_numel(*t);
    ddl_shape     whole = ddl_shape_make(1, (int64_t[]){n + NGUARD});
    ddl_tensor_t *all   = NULL;
    ASSERT_OK(ddl_tensor_view((*t)->dtype, &whole, (*t)->data, &all));
    for (int64_t i = n; i < n + NGUARD; i++) {
        ASSERT_NEAR(ddl_tensor_get(all, i), GUARD, 0.0);
    }
    ddl_tensor_destroy(&all);
    ddl_free((*t)->data);
    ddl_tensor_destroy(t);
}

ddl_model_t *ddl_test_model(MPI_Comm comm, const char *text, const char *source)
{
    int size;
    MPI_Comm_size(comm, &size);
    ddl_spec_t  *s = NULL;
    ddl_model_t *m = NULL;
    ASSERT_OK(ddl_spec_parse(text, source, size, &s));
    ASSERT_OK(ddl_model_create(comm, s, &m));
    ddl_spec_destroy(&s);
    return m;
}

void ddl_test_fill(void *buf, size_t es, int64_t n, uint64_t seed, double lo, double hi)
{
    for (int64_t i = 0; i < n; i++) {
        double v = lo + (hi - lo) * ddl_rng_uniform(seed, 0, (uint64_t)i);
        if (es == 4) {
            ((float *)buf)[i] = (float)v;
        } else {
            ((double *)buf)[i] = v;
        }
    }
}

ddl_spec_t *ddl_test_spec_for_world(const char *path)
{
    int         size;
    ddl_spec_t *spec = NULL;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    ASSERT_OK(ddl_spec_load(path, 0, &spec));
    if (ddl_spec_world_size(spec) != size) {
        ddl_spec_destroy(&spec);
    }
    return spec;
}

static void same_bits(const void *a, const void *b, size_t n, const char *thing, int i,
                      const char *what)
{
    if (memcmp(a, b, n) != 0) {
        fprintf(stderr, "rank %d: %s (%d) differs between %s\n", ddl_test_rank, thing, i, what);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
}

double ddl_test_same_bits(ddl_model_t *f, ddl_model_t *u, const void *xs, size_t x_bytes,
                          const int64_t *labels, int64_t B, int steps, int classes, size_t item,
                          const char *what)
{
    for (int s = 0; s < steps; s++) {
        double  lf, lu;
        int64_t hf, hu;
        ASSERT_OK(ddl_model_train_step(f, xs, x_bytes, labels, B, &lf, &hf));
        ASSERT_OK(ddl_model_train_step(u, xs, x_bytes, labels, B, &lu, &hu));
        same_bits(&lf, &lu, sizeof lf, "the loss of step", s, what);
        ASSERT_EQ(hf, hu);
    }
    ASSERT_EQ(ddl_model_nparams(f), ddl_model_nparams(u));
    for (int i = 0; i < ddl_model_nparams(f); i++) {
        const ddl_tensor_t *a = ddl_model_param(f, i)->value, *b = ddl_model_param(u, i)->value;
        ASSERT_EQ(ddl_tensor_bytes(a), ddl_tensor_bytes(b));
        same_bits(a->data, b->data, ddl_tensor_bytes(a), "a parameter after the steps", i, what);
    }
    double  ef, eu;
    int64_t cf, cu;
    ASSERT_OK(ddl_model_eval(f, xs, x_bytes, labels, B, &ef, &cf));
    ASSERT_OK(ddl_model_eval(u, xs, x_bytes, labels, B, &eu, &cu));
    same_bits(&ef, &eu, sizeof ef, "the evaluation loss", 0, what);
    ASSERT_EQ(cf, cu);
    size_t ln = 2 * (size_t)classes * item;
    char  *pf = calloc(1, ln), *pu = calloc(1, ln);
    ASSERT_TRUE(pf != NULL && pu != NULL);
    ASSERT_OK(ddl_model_predict(f, xs, x_bytes, 2, pf, ln));
    ASSERT_OK(ddl_model_predict(u, xs, x_bytes, 2, pu, ln));
    same_bits(pf, pu, ln, "the short-batch prediction", 0, what);
    free(pf);
    free(pu);
    return ef / (double)B;
}

void *ddl_test_uniform_batch(size_t n, size_t item, uint64_t seed)
{
    char *xs = malloc(n * item);
    ASSERT_TRUE(xs != NULL);
    for (size_t i = 0; i < n; i++) {
        double v = 2.0 * ddl_rng_uniform(seed, 0, (uint64_t)i) - 1.0;
        if (item == sizeof(float)) {
            ((float *)xs)[i] = (float)v;
        } else {
            ((double *)xs)[i] = v;
        }
    }
    return xs;
}
