// Model tests on the shipped 4-rank LeNet-5 spec: predict and eval agree (the eval loss
// is the cross-entropy of the predicted logits, padding ignored), prediction is
// deterministic, a training step changes the weights and lowers the loss on a repeated
// batch, and a bad call fails on every rank instead of hanging.
#include <math.h>
#include <string.h>

#include "ddl/base.h"
#include "ddl/model.h"
#include "mpi_test.h"

int main(int argc, char **argv)
{
    ddl_test_mpi_init(&argc, &argv);
    ddl_test_require_ranks(4);
    int size;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 4) {
        return ddl_test_mpi_finalize();  // the spec is for exactly 4 ranks
    }
    ASSERT_TRUE(argc == 2);
    ddl_spec_t  *spec = NULL;
    ddl_model_t *m    = NULL;
    ASSERT_OK(ddl_spec_load(argv[1], 4, &spec));
    ASSERT_OK(ddl_model_create(MPI_COMM_WORLD, spec, &m));
    int64_t B = ddl_spec_batch_size(spec), C = ddl_spec_num_classes(spec);
    float  *x = NULL, *logits = NULL, *logits2 = NULL;
    int64_t *lab = NULL;
    size_t   XB = 0, LB = 0; // rank 0's byte sizes of x and of the logits
    if (ddl_test_rank == 0) {
        XB      = sizeof(float) * (size_t)(B * 784);
        LB      = sizeof(float) * (size_t)(B * C);
        x       = calloc((size_t)(B * 784), sizeof(float));
        logits  = calloc((size_t)(B * C), sizeof(float));
        logits2 = calloc((size_t)(B * C), sizeof(float));
        lab     = calloc((size_t)B, sizeof(int64_t));
        for (int64_t i = 0; i < B * 784; i++) {
            x[i] = (float)(2.0 * ddl_rng_uniform(3, 0, (uint64_t)i) - 1.0);
        }
        for (int64_t b = 0; b < B; b++) {
            lab[b] = b % C;
        }
    }
    ASSERT_OK(ddl_model_predict(m, x, XB, B, logits, LB));
    ASSERT_OK(ddl_model_predict(m, x, XB, B, logits2, LB));
    int64_t count = B - 5;  // the last 5 rows are padding for eval
    double  loss_sum;
    int64_t correct;
    ASSERT_OK(ddl_model_eval(m, x, XB, lab, count, &loss_sum, &correct));
    if (ddl_test_rank == 0) {
        ASSERT_TRUE(memcmp(logits, logits2, sizeof(float) * (size_t)(B * C)) == 0);
        double  ref = 0;
        int64_t hits = 0;
        for (int64_t b = 0; b < count; b++) {
            const float *r  = logits + b * C;
            double       mx = r[0];
            int64_t      am = 0;
            for (int64_t c = 1; c < C; c++) {
                if (r[c] > mx) {
                    mx = r[c];
                    am = c;
                }
            }
            double se = 0;
            for (int64_t c = 0; c < C; c++) {
                se += exp((double)r[c] - mx);
            }
            ref += mx + log(se) - (double)r[lab[b]];
            hits += am == lab[b];
        }
        ASSERT_NEAR(loss_sum, ref, 1e-4 * fabs(ref));
        ASSERT_EQ(correct, hits);
    }
    // Training on the same batch lowers its loss.
    double l0, l1 = 0;
    ASSERT_OK(ddl_model_train_step(m, x, XB, lab, B, &l0, &correct));
    for (int i = 0; i < 5; i++) {
        ASSERT_OK(ddl_model_train_step(m, x, XB, lab, B, &l1, &correct));
    }
    ASSERT_TRUE(l1 < l0);
    ASSERT_EQ(ddl_model_step(m), 6);
    // A bad call (no batch on rank 0) fails on every rank, without hanging.
    ASSERT_STATUS(ddl_model_train_step(m, NULL, 0, NULL, B, &l1, &correct), DDL_EINVAL);
    ASSERT_STATUS(ddl_model_predict(m, NULL, 0, B, NULL, 0), DDL_EINVAL);
    // Sizes that do not match: too few bytes of samples or of logits, a bad label.
    ASSERT_STATUS(ddl_model_predict(m, x, XB - 1, B, logits, LB), DDL_EINVAL);
    ASSERT_STATUS(ddl_model_predict(m, x, XB, B, logits, LB - 1), DDL_EINVAL);
    if (ddl_test_rank == 0) {
        lab[3] = C;
    }
    ASSERT_STATUS(ddl_model_train_step(m, x, XB, lab, B, &l1, &correct), DDL_EINVAL);
    if (ddl_test_rank == 0) {
        lab[3] = 3 % C;
    }
    ASSERT_STATUS(ddl_model_eval(m, x, XB, lab, B + 1, &loss_sum, &correct), DDL_EINVAL);
    ASSERT_EQ(ddl_model_step(m), 6);  // nothing changed
    free(x);
    free(logits);
    free(logits2);
    free(lab);
    ddl_model_destroy(&m);
    ddl_spec_destroy(&spec);
    return ddl_test_mpi_finalize();
}
