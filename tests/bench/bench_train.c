// bench-train-worker: LeNet-style training throughput of one spec under mpirun.
//
//   mpirun -np P bench-train-worker --model spec.json --data DIR [--batch 256] [--steps 30]
//
// Runs warm-up steps, then times `steps` training steps (forward, loss, backward,
// optimizer) on real batches and prints "images_per_s <value>" on rank 0. The wrapper
// bench-train runs it at np 1, 2 and 4 next to PyTorch on the same network.
#include <jansson.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddl/base.h"
#include "ddl/blas.h"
#include "ddl/data.h"
#include "ddl/model.h"

int main(int argc, char **argv)
{
    ddl_blas_startup(argc, argv); // may re-execute: before anything else
    ddl_malloc_tune_for_streaming();
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const char *model = NULL, *data = "/usr/share/datasets/fashion-mnist";
    long        batch = 256, steps = 30, warm = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--model") == 0) {
            model = argv[i + 1];
        } else if (strcmp(argv[i], "--data") == 0) {
            data = argv[i + 1];
        } else if (strcmp(argv[i], "--batch") == 0) {
            batch = atol(argv[i + 1]);
        } else if (strcmp(argv[i], "--steps") == 0) {
            steps = atol(argv[i + 1]);
        }
    }
    json_error_t je;
    json_t      *j = model ? json_load_file(model, 0, &je) : NULL;
    if (j == NULL || batch < 1 || steps < 1) {
        if (rank == 0) {
            fprintf(stderr, "usage: bench-train-worker --model spec.json [--data DIR] [--batch B] "
                            "[--steps S]\n");
        }
        MPI_Finalize();
        return 2;
    }
    json_object_set_new(j, "batch_size", json_integer(batch));
    char       *text = json_dumps(j, 0);
    ddl_spec_t *spec = NULL;
    ddl_status  st   = ddl_spec_parse(text, model, size, &spec);
    ddl_model_t *m   = NULL;
    int threads      = ddl_runtime_divide_cores(MPI_COMM_WORLD);
    if (rank == 0) {
        ddl_blas_log("bench-train-worker", threads);
    }
    if (st == DDL_OK) {
        st = ddl_model_create(MPI_COMM_WORLD, spec, &m);
    }
    ddl_dataset ds = {0};
    if (st == DDL_OK && rank == 0) {
        st = ddl_dataset_load_mnist_dir(data, 1, &ds);
    }
    int ok = st == DDL_OK;
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!ok) {
        if (rank == 0) {
            fprintf(stderr, "bench-train-worker: %s\n", ddl_last_error());
        }
        MPI_Finalize();
        return 1;
    }
    float   *x   = rank == 0 ? malloc(sizeof(float) * (size_t)batch * 784) : NULL;
    int64_t *lab = rank == 0 ? malloc(sizeof(int64_t) * (size_t)batch) : NULL;
    int64_t *idx = rank == 0 ? malloc(sizeof(int64_t) * (size_t)batch) : NULL;
    double   t0 = 0;
    for (long s = 0; s < warm + steps; s++) {
        if (rank == 0) {
            for (long i = 0; i < batch; i++) {
                idx[i] = (s * batch + i) % ds.n;
            }
            ddl_dataset_batch_f32(&ds, idx, batch, 0.2860, 0.3530, x, lab);
        }
        if (s == warm) {
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = MPI_Wtime();
        }
        double  loss;
        int64_t c;
        if (ddl_model_train_step(m, x, rank == 0 ? sizeof(float) * (size_t)batch * 784 : 0, lab,
                                 batch, &loss, &c) != DDL_OK) {
            if (rank == 0) {
                fprintf(stderr, "bench-train-worker: %s\n", ddl_last_error());
            }
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    double dt = MPI_Wtime() - t0;
    if (rank == 0) {
        printf("np %d threads/rank %d batch %ld steps %ld: %.3f s, images_per_s %.1f\n", size,
               threads, batch, steps, dt, (double)(batch * steps) / dt);
    }
    free(x);
    free(lab);
    free(idx);
    free(text);
    json_decref(j);
    ddl_dataset_free(&ds);
    ddl_model_destroy(&m);
    ddl_spec_destroy(&spec);
    MPI_Finalize();
    return 0;
}
