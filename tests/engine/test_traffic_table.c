// The per-step traffic table of a model (ddl_model_traffic_table) on one shipped spec:
//
//   mpirun -np W test_traffic_table spec.json
//
// Builds the model, runs two training steps on seeded random data, and checks that the
// table accounts for every byte the primitives counted during the second step: for every
// primitive kind and pass, the table's rows (all but a classifier's "labels", which travel
// by a plain MPI_Bcast outside the counters) sum to the process counters' delta over the step,
// summed over ranks. Then rank 0 prints the table as JSON on stdout, one row per line,
// for tests/engine/traffic_formula.py, which compares it with the bytes derived
// independently from the spec (docs/SCALING.md). Also: the table is the same after a
// third step (per step, not cumulative), and an evaluation does not change it.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddl/base.h"
#include "ddl/model.h"
#include "mpi_test.h"

static void print_traffic(const char *key, const ddl_traffic *t)
{
    printf("\"%s\": {", key);
    bool first = true;
    for (int k = 0; k < DDL_TRAFFIC_NKINDS; k++) {
        for (int p = 0; p < DDL_TRAFFIC_NPASSES; p++) {
            const ddl_traffic_count *c = &t->c[k][p];
            if (c->sent == 0 && c->received == 0) {
                continue;
            }
            printf("%s\"%s/%s\": [%llu, %llu]", first ? "" : ", ",
                   ddl_traffic_kind_name((ddl_traffic_kind)k), p == 0 ? "forward" : "adjoint",
                   (unsigned long long)c->sent, (unsigned long long)c->received);
            first = false;
        }
    }
    printf("}");
}

static ddl_traffic_row *table(ddl_model_t *m, int *n)
{
    *n                    = ddl_model_traffic_rows(m);
    ddl_traffic_row *rows = calloc((size_t)*n, sizeof *rows);
    ASSERT_TRUE(rows != NULL);
    ASSERT_OK(ddl_model_traffic_table(m, rows, *n));
    return rows;
}

int main(int argc, char **argv)
{
    ddl_test_mpi_init(&argc, &argv);
    ASSERT_TRUE(argc == 2);
    int size;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    ddl_spec_t  *spec = NULL;
    ddl_model_t *m    = NULL;
    ASSERT_OK(ddl_spec_load(argv[1], size, &spec));
    ASSERT_OK(ddl_model_create(MPI_COMM_WORLD, spec, &m));
    int64_t B = ddl_spec_batch_size(spec), C = ddl_spec_num_classes(spec);
    // One label per sample, or per output voxel for a segmentation spec.
    int64_t   LE  = ddl_spec_label_elems(spec);
    ddl_shape in  = ddl_spec_input_shape(spec);
    int64_t   S   = ddl_shape_numel(&in);
    size_t    es  = ddl_dtype_size(ddl_spec_dtype(spec));
    void     *x   = NULL;
    int64_t  *lab = NULL;
    size_t    XB  = 0;
    if (ddl_test_rank == 0) {
        XB  = es * (size_t)(B * S);
        x   = calloc((size_t)(B * S), es);
        lab = calloc((size_t)(B * LE) + 1, sizeof(int64_t)); // none for dense targets
        ASSERT_TRUE(x != NULL && lab != NULL);
        ddl_test_fill(x, es, B * S, 11, -1.0, 1.0);
        for (int64_t b = 0; b < B * LE; b++) {
            lab[b] = (b * 7) % C;
        }
    }
    // Dense targets (every loss but cross-entropy): B * E values in [0, 1] (x's values,
    // shifted, where the output holds as many; any valid targets move the same bytes).
    bool              dense = ddl_spec_dense_targets(spec);
    int64_t           E     = ddl_spec_output_elems(spec);
    void             *tg    = NULL;
    size_t            TB    = 0;
    ddl_dense_metrics dm;
    if (dense && ddl_test_rank == 0) {
        TB = es * (size_t)(B * E);
        tg = calloc((size_t)(B * E), es);
        ASSERT_TRUE(tg != NULL);
        ddl_test_fill(tg, es, B * E, 12, 0.0, 1.0);
    }
    double  loss;
    int64_t correct;
#define STEP()                                                                                     \
    (dense ? ddl_model_train_step_dense(m, x, XB, tg, TB, B, &loss, &dm)                           \
           : ddl_model_train_step(m, x, XB, lab, B, &loss, &correct))
    ASSERT_OK(STEP());

    // The second step, with the process counters around it.
    ddl_traffic t0, t1, d;
    ddl_traffic_snapshot(&t0);
    ASSERT_OK(STEP());
    ddl_traffic_snapshot(&t1);
    ddl_traffic_sub(&t1, &t0, &d);
    size_t words = sizeof d / sizeof(uint64_t);
    MPI_Allreduce(MPI_IN_PLACE, &d, (int)words, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);

    int              n;
    ddl_traffic_row *rows = table(m, &n);
    ddl_traffic      sum  = {0};
    for (int i = 0; i < n; i++) {
        if (strcmp(rows[i].type, "mpi_bcast") != 0) {
            ddl_traffic_add(&sum, &rows[i].fwd);
            ddl_traffic_add(&sum, &rows[i].bwd);
        }
    }
    for (int k = 0; k < DDL_TRAFFIC_NKINDS; k++) {
        for (int p = 0; p < DDL_TRAFFIC_NPASSES; p++) {
            if (sum.c[k][p].sent != d.c[k][p].sent || sum.c[k][p].received != d.c[k][p].received) {
                TEST_FAIL_(
                    "%s %s: the table holds %llu/%llu bytes sent/received, the counters "
                    "%llu/%llu",
                    ddl_traffic_kind_name((ddl_traffic_kind)k), p ? "adjoint" : "forward",
                    (unsigned long long)sum.c[k][p].sent, (unsigned long long)sum.c[k][p].received,
                    (unsigned long long)d.c[k][p].sent, (unsigned long long)d.c[k][p].received);
            }
            // Over all ranks every byte sent is a byte received.
            ASSERT_EQ(d.c[k][p].sent, d.c[k][p].received);
        }
    }

    // Per step, not cumulative: a third step and an evaluation leave the table as it was.
    ASSERT_OK(STEP());
    double ls;
    if (dense) {
        ASSERT_OK(ddl_model_eval_dense(m, x, XB, tg, TB, B, &dm));
    } else {
        ASSERT_OK(ddl_model_eval(m, x, XB, lab, B, &ls, &correct));
    }
#undef STEP
    int              n2;
    ddl_traffic_row *again = table(m, &n2);
    ASSERT_EQ(n2, n);
    for (int i = 0; i < n; i++) {
        ASSERT_TRUE(memcmp(&again[i].fwd, &rows[i].fwd, sizeof(ddl_traffic)) == 0);
        ASSERT_TRUE(memcmp(&again[i].bwd, &rows[i].bwd, sizeof(ddl_traffic)) == 0);
    }

    if (ddl_test_rank == 0) {
        for (int i = 0; i < n; i++) {
            printf("{\"name\": \"%s\", \"type\": \"%s\", ", rows[i].name, rows[i].type);
            print_traffic("fwd", &rows[i].fwd);
            printf(", ");
            print_traffic("bwd", &rows[i].bwd);
            printf("}\n");
        }
        fflush(stdout);
    }
    free(rows);
    free(again);
    free(x);
    free(lab);
    free(tg);
    ddl_model_destroy(&m);
    ddl_spec_destroy(&spec);
    return ddl_test_mpi_finalize();
}
