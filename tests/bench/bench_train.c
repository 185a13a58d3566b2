// bench-train-worker: LeNet-style training throughput of one spec under mpirun.
//
//   mpirun -np P bench-train-worker --model spec.json --data DIR [--batch 256] [--steps 30]
//
// Runs warm-up steps, then times `steps` training steps (forward, loss, backward,
// optimizer) on real batches and prints "images_per_s <value>" on rank 0. The wrapper
// bench-train runs it at np 1, 2 and 4 next to PyTorch on the same network.
//
// It also counts the floating-point operations of one step from the spec (per layer,
// forward and backward; see spec_flops) and prints the achieved rate as a fraction of
// cblas_sgemm measured in the same run: every rank multiplies square n = 1024 matrices at
// once with its own BLAS threads, and the ranks' rates are summed (on an oversubscribed
// node they share the cores alike). "sgemm_fraction <value>" = achieved / summed sgemm.
#include <cblas.h>
#include <jansson.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddl/base.h"
#include "ddl/blas.h"
#include "ddl/data.h"
#include "ddl/model.h"

// ---- FLOPs of a step, from the spec ---------------------------------------------------
// Counted as profilers and papers do: 2 per multiply-add of conv and linear plus the bias
// add; backward computes dW and dx, each as many multiply-adds as the forward (the
// layers compute dx even for the first layer), plus db. Activations and dropout 1 per
// element each way; pooling prod(kernel) per output forward, 1 per output backward;
// batchnorm 4 per element forward, 6 backward; repartition, flatten and upsample move
// data only (0). Layers before the first one with parameters run no backward. The
// optimizer: Adam/AdamW ~12 per parameter, SGD 2 (4 with momentum). Loss: ignored (a
// few per logit).

typedef struct layer_flops {
    char   name[64];
    double fwd, bwd;
} layer_flops;

enum { MAX_FLOP_LAYERS = 256 };

// a[i] of a JSON integer array (or the integer itself), `dflt` when absent.
static int64_t arr_at(const json_t *o, const char *key, int i, int64_t dflt)
{
    const json_t *v = json_object_get(o, key);
    if (json_is_integer(v)) {
        return json_integer_value(v);
    }
    if (json_is_array(v) && (size_t)i < json_array_size(v)) {
        return json_integer_value(json_array_get(v, (size_t)i));
    }
    return dflt;
}

// Fills out[0..*n) for batch N; returns the optimizer FLOPs of a step.
static double spec_flops(const json_t *spec, int64_t N, layer_flops *out, int *n)
{
    const json_t *shape  = json_object_get(json_object_get(spec, "input"), "shape");
    int64_t       d[8]   = {0};
    int           nd     = (int)json_array_size(shape); // per sample: [C, spatial...]
    double        params = 0;
    for (int i = 0; i < nd && i < 8; i++) {
        d[i] = json_integer_value(json_array_get(shape, (size_t)i));
    }
    const json_t *layers = json_object_get(spec, "layers");
    bool          seen_param = false;
    *n                       = 0;
    for (size_t li = 0; li < json_array_size(layers) && *n < MAX_FLOP_LAYERS; li++) {
        const json_t *L    = json_array_get(layers, li);
        const char   *type = json_string_value(json_object_get(L, "type"));
        const char   *name = json_string_value(json_object_get(L, "name"));
        layer_flops  *f    = &out[(*n)++];
        snprintf(f->name, sizeof f->name, "%s%s%s", name ? name : "", name ? " " : "",
                 type ? type : "?");
        f->fwd = f->bwd = 0;
        double elems    = 1; // per sample, before the layer
        for (int i = 0; i < nd; i++) {
            elems *= (double)d[i];
        }
        type         = type ? type : "";
        int  ns      = nd - 1;
        bool weights = false;
        if (strncmp(type, "conv", 4) == 0 || strncmp(type, "maxpool", 7) == 0 ||
            strncmp(type, "avgpool", 7) == 0) {
            bool    conv = type[0] == 'c';
            int64_t kv = 1, ov = 1;
            for (int i = 0; i < ns; i++) {
                int64_t k   = arr_at(L, "kernel", i, 1);
                int64_t s   = arr_at(L, "stride", i, conv ? 1 : k);
                int64_t p   = arr_at(L, "padding", i, 0);
                int64_t dl  = arr_at(L, "dilation", i, 1);
                d[1 + i]    = (d[1 + i] + 2 * p - dl * (k - 1) - 1) / s + 1;
                kv         *= k;
                ov         *= d[1 + i];
            }
            if (conv) {
                int64_t ci = d[0], co = json_integer_value(json_object_get(L, "out_channels"));
                bool    b  = !json_is_false(json_object_get(L, "bias"));
                double  macs = (double)N * (double)co * (double)ov * (double)ci * (double)kv;
                double  outs = (double)N * (double)co * (double)ov;
                f->fwd       = 2 * macs + (b ? outs : 0);
                f->bwd       = 4 * macs + (b ? outs : 0);
                params += (double)co * (double)ci * (double)kv + (b ? (double)co : 0);
                d[0]    = co;
                weights = true;
            } else {
                double outs = (double)N * (double)d[0] * (double)ov;
                f->fwd      = outs * (double)kv;
                f->bwd      = outs;
            }
        } else if (strcmp(type, "linear") == 0) {
            int64_t in = d[0], outf = json_integer_value(json_object_get(L, "out_features"));
            bool    b  = !json_is_false(json_object_get(L, "bias"));
            double  macs = (double)N * (double)in * (double)outf;
            f->fwd       = 2 * macs + (b ? (double)N * (double)outf : 0);
            f->bwd       = 4 * macs + (b ? (double)N * (double)outf : 0);
            params += (double)in * (double)outf + (b ? (double)outf : 0);
            d[0]    = outf;
            weights = true;
        } else if (strcmp(type, "flatten") == 0) {
            d[0] = (int64_t)elems;
            nd   = 1;
        } else if (strcmp(type, "batchnorm") == 0) {
            f->fwd = 4 * (double)N * elems;
            f->bwd = 6 * (double)N * elems;
            params += 2 * (double)d[0];
            weights = true;
        } else if (strcmp(type, "upsample") == 0) {
            for (int i = 0; i < ns; i++) {
                const json_t *sf = json_object_get(L, "scale_factor");
                const json_t *e  = json_is_array(sf) ? json_array_get(sf, (size_t)i) : sf;
                d[1 + i] = e ? (int64_t)floor((double)d[1 + i] * json_number_value(e))
                             : arr_at(L, "size", i, d[1 + i]);
            }
        } else if (strcmp(type, "repartition") != 0) {
            f->fwd = f->bwd = (double)N * elems; // activations, dropout
        }
        seen_param = seen_param || weights;
        if (!seen_param) {
            f->bwd = 0;
        }
    }
    const json_t *opt  = json_object_get(spec, "optimizer");
    const char   *otyp = json_string_value(json_object_get(opt, "type"));
    double        mom  = json_number_value(json_object_get(opt, "momentum"));
    if (otyp != NULL && strncmp(otyp, "adam", 4) == 0) {
        return 12 * params;
    }
    return (mom != 0 ? 4 : 2) * params;
}

// Single-precision GEMM rate of this rank (GFLOP/s), square n x n, the median of 3 after a
// warm-up, every rank at once.
static double sgemm_rate(int n)
{
    float *a = malloc(sizeof(float) * (size_t)n * (size_t)n);
    float *b = malloc(sizeof(float) * (size_t)n * (size_t)n);
    float *c = calloc((size_t)n * (size_t)n, sizeof(float));
    for (size_t i = 0; i < (size_t)n * (size_t)n; i++) {
        a[i] = (float)((i * 7919) % 1000) * 1e-3f;
        b[i] = (float)((i * 104729) % 1000) * 1e-3f;
    }
    double t[4];
    for (int r = 0; r < 4; r++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f,
                    c, n);
        t[r] = MPI_Wtime() - t0;
    }
    // Median of the 3 timed (t[1..3]).
    double x = t[1], y = t[2], z = t[3];
    double med = x > y ? (y > z ? y : (x > z ? z : x)) : (x > z ? x : (y > z ? z : y));
    free(a);
    free(b);
    free(c);
    return 2.0 * (double)n * (double)n * (double)n / med * 1e-9;
}

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
    // The same-run reference, after the timed steps (so it does not warm or cool them).
    double rate = sgemm_rate(1024), total_rate = 0;
    MPI_Allreduce(&rate, &total_rate, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) {
        printf("np %d threads/rank %d batch %ld steps %ld: %.3f s, images_per_s %.1f\n", size,
               threads, batch, steps, dt, (double)(batch * steps) / dt);
        layer_flops lf[MAX_FLOP_LAYERS];
        int         nl;
        double      fopt = spec_flops(j, batch, lf, &nl), fwd = 0, bwd = 0;
        for (int i = 0; i < nl; i++) {
            fwd += lf[i].fwd;
            bwd += lf[i].bwd;
        }
        double tot = fwd + bwd + fopt, achieved = tot * (double)steps / dt * 1e-9;
        printf("flops per step: %.4f GFLOP (forward %.4f, backward %.4f, optimizer %.4f); "
               "achieved %.2f GFLOP/s; sgemm n=1024 %.2f GFLOP/s (%d ranks at once, summed); "
               "sgemm_fraction %.3f\n",
               tot * 1e-9, fwd * 1e-9, bwd * 1e-9, fopt * 1e-9, achieved, total_rate, size,
               achieved / total_rate);
        for (int i = 0; i < nl; i++) {
            if (lf[i].fwd + lf[i].bwd > 0) {
                printf("  layer %-22s forward %9.2f MFLOP  backward %9.2f MFLOP  %5.1f%%\n",
                       lf[i].name, lf[i].fwd * 1e-6, lf[i].bwd * 1e-6,
                       100 * (lf[i].fwd + lf[i].bwd) / tot);
            }
        }
        printf("  %-28s %9.2f MFLOP  %5.1f%%\n", "optimizer", fopt * 1e-6, 100 * fopt / tot);
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
