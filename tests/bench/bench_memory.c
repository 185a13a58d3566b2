// bench-memory-worker: memory per rank of one training step of a spec on its generated
// data, with the input volume resized (the spec's input shape [1, S, S, S]) and the batch
// set (default 1). Per rank it prints:
//   engine_created   bytes the engine holds after building the session (ddl_alloc_bytes_live
//                    growth: parameters, optimizer state, activations and their gradients,
//                    layer workspaces, plans, rank 0's batch buffers)
//   engine_peak      the most the engine held at any moment of the step (its allocator's
//                    high-water mark, ddl_alloc_bytes_peak_reset)
//   hwm              the process's peak resident memory (VmHWM of /proc/self/status) after
//                    the step, and the same before the model (MPI and libraries) as base
// and the spec's estimate (ddl/estimate.h) of the rank that needs the most. Rank 0 prints
// one line per rank and a summary line "max ..." for the wrapper (bench-memory).
// Usage: mpirun -np P bench-memory-worker --model SPEC --size S [--batch B]
#include <jansson.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ddl/base.h"
#include "ddl/estimate.h"
#include "ddl/session.h"

// The spec file with input.shape = [1, S, S, S] and batch_size = B, as text (malloc'd).
static char *resized_spec(const char *path, long S, long B)
{
    json_error_t e;
    json_t      *root = json_load_file(path, JSON_REJECT_DUPLICATES, &e);
    if (root == NULL) {
        fprintf(stderr, "bench-memory: %s:%d: %s\n", path, e.line, e.text);
        return NULL;
    }
    json_t *in = json_object_get(root, "input");
    json_object_set_new(in, "shape", json_pack("[iiii]", 1, S, S, S));
    json_object_set_new(root, "batch_size", json_integer(B));
    char *t = json_dumps(root, JSON_INDENT(1));
    json_decref(root);
    return t;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const char *model = NULL;
    long        S = 128, B = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--model") == 0) {
            model = argv[i + 1];
        } else if (strcmp(argv[i], "--size") == 0) {
            S = atol(argv[i + 1]);
        } else if (strcmp(argv[i], "--batch") == 0) {
            B = atol(argv[i + 1]);
        }
    }
    if (model == NULL || S < 4 || B < 1) {
        if (rank == 0) {
            fprintf(stderr, "usage: bench-memory-worker --model SPEC --size S [--batch B]\n");
        }
        MPI_Finalize();
        return 2;
    }
    double base_hwm = ddl_proc_kb_bytes("/proc/self/status", "VmHWM");
    double base_rss = ddl_proc_kb_bytes("/proc/self/status", "VmRSS");
    char  *text     = rank == 0 ? resized_spec(model, S, B) : NULL;
    int    ok       = rank != 0 || text != NULL;
    MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (!ok) {
        MPI_Finalize();
        return 1;
    }
    ddl_mem_estimate est = {0};
    if (rank == 0) {
        ddl_spec_t *sp = NULL;
        if (ddl_spec_parse(text, model, size, &sp) == DDL_OK) {
            ddl_spec_estimate(sp, &est);
        }
        ddl_spec_destroy(&sp);
    }
    int64_t        live0 = ddl_alloc_bytes_live();
    ddl_session_t *s     = NULL;
    ddl_status     st    = ddl_session_create(MPI_COMM_WORLD, text, model, NULL, &s);
    if (st == DDL_OK) {
        st = ddl_session_open_synthetic(s);
    }
    if (st != DDL_OK) {
        if (rank == 0) {
            fprintf(stderr, "bench-memory: %s\n", ddl_last_error());
        }
        ddl_session_destroy(&s);
        MPI_Finalize();
        return 1;
    }
    double created = (double)(ddl_alloc_bytes_live() - live0);
    ddl_alloc_bytes_peak_reset();
    ddl_train_request req = {.steps = 1};
    ddl_train_result  res;
    double            t0 = now();
    st                   = ddl_session_train(s, &req, NULL, NULL, &res);
    double dt            = now() - t0;
    double peak          = (double)(ddl_alloc_bytes_peak_reset() - live0);
    double hwm           = ddl_proc_kb_bytes("/proc/self/status", "VmHWM");
    double mine[5]       = {created, peak, hwm, base_hwm, base_rss};
    double all[5 * 64]   = {0};
    MPI_Gather(mine, 5, MPI_DOUBLE, rank == 0 ? all : NULL, 5, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (rank == 0 && st == DDL_OK) {
        const double MiB = 1024.0 * 1024.0;
        printf("%s at %ld^3, batch %ld, %d rank%s: one step %.1f s, loss %.4f\n", model, S, B, size,
               size == 1 ? "" : "s", dt, res.mean_loss);
        printf("estimate (rank %d, the most): %.1f MiB = params %.1f + grads %.1f + optimizer %.1f "
               "+ activations %.1f + workspace %.1f\n",
               est.rank, est.total / MiB, est.params / MiB, est.grads / MiB, est.optim / MiB,
               est.activations / MiB, est.workspace / MiB);
        double mx[5] = {0};
        for (int r = 0; r < size && r < 64; r++) {
            const double *a = all + 5 * r;
            printf("rank %d: engine_created %.1f MiB  engine_peak %.1f MiB  hwm %.1f MiB  "
                   "(base hwm %.1f MiB, rss %.1f MiB)\n",
                   r, a[0] / MiB, a[1] / MiB, a[2] / MiB, a[3] / MiB, a[4] / MiB);
            for (int k = 0; k < 5; k++) {
                mx[k] = a[k] > mx[k] ? a[k] : mx[k];
            }
        }
        printf("max engine_created %.1f engine_peak %.1f hwm %.1f base_hwm %.1f estimate %.1f "
               "MiB\n",
               mx[0] / MiB, mx[1] / MiB, mx[2] / MiB, mx[3] / MiB, est.total / MiB);
    } else if (rank == 0) {
        fprintf(stderr, "bench-memory: %s\n", ddl_last_error());
    }
    ddl_session_destroy(&s);
    free(text);
    MPI_Finalize();
    return st == DDL_OK ? 0 : 1;
}
