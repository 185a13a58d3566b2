// bench-train-worker: training throughput of one spec under mpirun.
//
//   mpirun -np P bench-train-worker --model spec.json [--data DIR] [--batch B] [--steps 30]
//                                   [--warmup 3]
//
// Runs warm-up steps, then times `steps` training steps (forward, loss, backward,
// optimizer) of the spec's network (f32) at its own batch size or B, and prints
// "images_per_s <value>" (samples: images or volumes) on rank 0. The batches are the
// spec's data, made before the timing (see make_batches). The wrapper bench-train runs it
// for each network at np 1 and 2 next to PyTorch on the same network (torch_train.py).
//
// It also counts the floating-point operations of one step from the spec (per layer,
// forward and backward; see spec_flops) and prints the achieved rate as a fraction of
// cblas_sgemm measured in the same run: every rank multiplies square n = 1024 matrices at
// once with its own BLAS threads, and the ranks' rates are summed (on an oversubscribed
// node they share the cores alike). "sgemm_fraction <value>" = achieved / summed sgemm.
//
// And the time each rank spent inside each kind of primitive per timed step (forward and
// adjoint; ddl_traffic_time_snapshot: the copies, MPI and the wait for the partners), with
// its share of the step: lines "comm <kind> ...". Halo exchanges are item 5's figure of
// issue 19 (what an overlap with compute could hide at most).
#include <cblas.h>
#include <jansson.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddl/base.h"
#include "ddl/blas.h"
#include "ddl/data.h"
#include "ddl/model.h"
#include "ddl/primitives.h"
#include "ddl/synth.h"
#include "engine/spec_internal.h" // the parsed layers, for spec_flops

// ---- FLOPs of a step, from the parsed spec ----------------------------------------------
// Counted as profilers and papers do, on the engine's own parse of the spec (each layer's
// operands, global input and output shapes, in the order a step runs them), so graphs
// (from, add, concat) count the shapes the engine builds:
//   conv, linear  2 per multiply-add plus the bias add; backward dW and dx, each as many
//                 multiply-adds as the forward (the layers compute dx even for a chain's
//                 first layer, whose dx nobody reads), plus db;
//   pooling       prod(kernel) per output forward; backward 1 per output (max) or
//                 prod(kernel) (avg); adaptive average: 1 per input element each way;
//   batchnorm     4 per element forward, 6 backward;
//   upsample      linear: a multiply-add per tap, 2^spatial taps per output, each way;
//                 nearest: nothing forward, 1 per output backward (the scatter-add);
//   add           n - 1 per output element forward; backward copies (0);
//   activations, dropout  1 per element each way;
//   repartition, flatten, concat  move data only (0).
// Layers whose backward a step skips (no parameters and no gradient leading to one: the
// data movement before a chain's first layer with parameters, src/engine/model.c) count
// no backward. Optimizer per parameter: Adam/AdamW 12 (+2 weight decay), SGD 2 (+2 weight
// decay, +2 momentum, +2 Nesterov). Loss: ignored (a few per logit).

typedef struct layer_flops {
    char   name[96];
    double fwd, bwd;
} layer_flops;

static double shape_elems(const ddl_shape *s)
{
    double e = 1;
    for (int i = 0; i < s->ndim; i++) {
        e *= (double)s->d[i];
    }
    return e;
}

// Fills out[0..nlayers) in the order a step runs the layers; returns the optimizer FLOPs.
static double spec_flops(const ddl_spec_t *s, layer_flops *out)
{
    double params = 0;
    bool  *back   = calloc((size_t)s->nlayers, sizeof *back);
    if (back == NULL) {
        fprintf(stderr, "bench-train-worker: out of memory\n");
        exit(1);
    }
    for (int t = 0; t < s->nlayers; t++) {
        const spec_layer *L = &s->layers[s->order[t]];
        layer_flops      *f = &out[t];
        double            x = shape_elems(&L->x_global), y = shape_elems(&L->y_global);
        int               ns = L->y_global.ndim - 2; // spatial dims (batch and channels first)
        snprintf(f->name, sizeof f->name, "%s %s", L->name, L->type);
        f->fwd = f->bwd   = 0;
        back[s->order[t]] = L->has_params;
        for (int k = 0; k < L->nin; k++) {
            back[s->order[t]] |= L->in[k] != SPEC_INPUT && back[L->in[k]];
        }
        if (strncmp(L->type, "conv", 4) == 0) {
            const ddl_conv_params *c  = &L->conv;
            double                 kv = 1;
            for (int i = 0; i < c->nsp; i++) {
                kv *= (double)c->kernel[i];
            }
            double ci = (double)L->x_global.d[1], macs = y * ci * kv;
            f->fwd = 2 * macs + (c->bias ? y : 0);
            f->bwd = 4 * macs + (c->bias ? y : 0);
            params += (double)L->y_global.d[1] * (ci * kv + (c->bias ? 1 : 0));
        } else if (strcmp(L->type, "linear") == 0) {
            double in = x / (double)L->x_global.d[0], macs = y * in;
            f->fwd = 2 * macs + (L->bias ? y : 0);
            f->bwd = 4 * macs + (L->bias ? y : 0);
            params += (double)L->y_global.d[1] * (in + (L->bias ? 1 : 0));
        } else if (strncmp(L->type, "adaptive", 8) == 0) {
            f->fwd = f->bwd = x;
        } else if (strncmp(L->type, "maxpool", 7) == 0 || strncmp(L->type, "avgpool", 7) == 0) {
            double kv = 1;
            for (int i = 0; i < L->pool.nsp; i++) {
                kv *= (double)L->pool.kernel[i];
            }
            f->fwd = y * kv;
            f->bwd = L->type[0] == 'm' ? y : y * kv;
        } else if (strcmp(L->type, "batchnorm") == 0) {
            f->fwd = 4 * x;
            f->bwd = 6 * x;
            params += L->affine ? 2 * (double)L->x_global.d[1] : 0;
        } else if (strcmp(L->type, "upsample") == 0) {
            f->fwd = L->mode == DDL_UPSAMPLE_LINEAR ? 2 * (double)(1 << ns) * y : 0;
            f->bwd = L->mode == DDL_UPSAMPLE_LINEAR ? f->fwd : y;
        } else if (strcmp(L->type, "add") == 0) {
            f->fwd = (double)(L->nin - 1) * y;
        } else if (strcmp(L->type, "repartition") != 0 && strcmp(L->type, "flatten") != 0 &&
                   strcmp(L->type, "concat") != 0) {
            f->fwd = f->bwd = x; // activations, dropout
        }
        if (!back[s->order[t]]) {
            f->bwd = 0;
        }
    }
    free(back);
    const ddl_optim_params *o = &s->optim;
    double                  per =
        o->kind == DDL_OPTIM_SGD ? 2 + (o->momentum != 0 ? 2 : 0) + (o->nesterov ? 2 : 0) : 12;
    return (per + (o->weight_decay != 0 ? 2 : 0)) * params;
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
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c,
                    n);
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

// ---- batches ----------------------------------------------------------------------------
// NBATCH different training batches of the spec's data, made before the timed steps and
// used in turn, so that neither this worker nor the PyTorch side (torch_train.py) times
// data preparation: generated volumes for a spec with a "synthetic" data block (the
// U-Net), else Fashion-MNIST from `dir` normalized as the spec says. Rank 0 only.
enum { NBATCH = 4 };

static ddl_status make_batches(const ddl_spec_t *spec, const char *dir, int64_t batch, float *x,
                               int64_t *lab)
{
    ddl_shape        in   = ddl_spec_input_shape(spec);
    int64_t          ls   = ddl_spec_label_elems(spec);
    size_t           xs   = (size_t)shape_elems(&in) * (size_t)batch;
    double           mean = 0, std = 1;
    ddl_synth_params p;
    int64_t          n   = 0;
    int64_t         *idx = malloc(sizeof(int64_t) * (size_t)batch);
    ddl_dataset      ds  = {0};
    ddl_status       st  = idx == NULL ? DDL_ENOMEM : DDL_OK;
    ddl_spec_normalize(spec, &mean, &std);
    bool synth = ddl_spec_synthetic(spec, &p, &n, NULL);
    if (st == DDL_OK && !synth) {
        st = ddl_dataset_load_mnist_dir(dir, 1, &ds);
        n  = ds.n;
    }
    for (int b = 0; st == DDL_OK && b < NBATCH; b++) {
        for (int64_t i = 0; i < batch; i++) {
            idx[i] = ((int64_t)b * batch + i) % n;
        }
        if (synth) {
            st = ddl_synth_batch(&p, 0, idx, batch, mean, std, DDL_F32, x + b * xs,
                                 lab + b * batch * ls);
        } else {
            ddl_dataset_batch_f32(&ds, idx, batch, mean, std, x + b * xs, lab + b * batch * ls);
        }
    }
    ddl_dataset_free(&ds);
    free(idx);
    return st;
}

// Steps [s0, s0 + n) of the batches (rank 0 holds them): wall seconds, from a barrier to
// a barrier, and this rank's halo exchange seconds per step (forward, adjoint).
static double timed_steps(ddl_model_t *m, int rank, const float *x, size_t xs, const int64_t *lab,
                          int64_t ls, long batch, long s0, long n, double halo[2])
{
    ddl_traffic_time c0, c1;
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    ddl_traffic_time_snapshot(&c0);
    for (long s = s0; s < s0 + n; s++) {
        double  loss;
        int64_t c;
        size_t  b = (size_t)(s % NBATCH);
        if (ddl_model_train_step(
                m, rank == 0 ? x + b * xs : NULL, rank == 0 ? sizeof(float) * xs : 0,
                rank == 0 ? lab + b * (size_t)ls : NULL, batch, &loss, &c) != DDL_OK) {
            if (rank == 0) {
                fprintf(stderr, "bench-train-worker: %s\n", ddl_last_error());
            }
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    ddl_traffic_time_snapshot(&c1);
    MPI_Barrier(MPI_COMM_WORLD);
    double dt = MPI_Wtime() - t0;
    for (int p = 0; p < 2; p++) {
        halo[p] = n > 0
                      ? (c1.s[DDL_TRAFFIC_HALO_EXCHANGE][p] - c0.s[DDL_TRAFFIC_HALO_EXCHANGE][p]) /
                            (double)n
                      : 0;
    }
    return dt;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// --overlap-ab R: R rounds of `steps` steps with the halo overlap off and on (ddl/layers.h),
// alternated within this run, so the modes share the cores' state and the machine's load.
// Prints, for each, the median step time and each rank's median halo exchange time per
// step (forward + adjoint, progress calls included), and against the overlap off the
// step's ratio and the share of the exchange time hidden.
static void overlap_ab(ddl_model_t *m, int rank, int size, const float *x, size_t xs,
                       const int64_t *lab, int64_t ls, long batch, long steps, int rounds)
{
    enum { NMODE = 2 };
    static const bool  modes[NMODE] = {false, true};
    static const char *names[NMODE] = {"off", "on"};
    double            *step         = calloc((size_t)(NMODE * rounds), sizeof(double));
    double            *fwd          = calloc((size_t)(NMODE * rounds * size), sizeof(double));
    double            *adj          = calloc((size_t)(NMODE * rounds * size), sizeof(double));
    bool               prev         = ddl_halo_overlap();
    long               s0           = 0;
    for (int r = 0; r < rounds; r++) {
        for (int k = 0; k < NMODE; k++) {
            double h[2], all[2 * 64];
            ddl_halo_overlap_set(modes[k]);
            step[k * rounds + r] =
                timed_steps(m, rank, x, xs, lab, ls, batch, s0, steps, h) / (double)steps;
            s0 += steps;
            MPI_Gather(h, 2, MPI_DOUBLE, all, 2, MPI_DOUBLE, 0, MPI_COMM_WORLD);
            for (int q = 0; rank == 0 && q < size; q++) {
                fwd[(k * size + q) * rounds + r] = all[2 * q];
                adj[(k * size + q) * rounds + r] = all[2 * q + 1];
            }
        }
    }
    ddl_halo_overlap_set(prev);
    if (rank == 0) {
        double base_step = 0, base_halo[64] = {0};
        printf("halo overlap A/B: %d rounds of %ld steps per mode, alternated; medians\n", rounds,
               steps);
        for (int k = 0; k < NMODE; k++) {
            double st = median(step + k * rounds, rounds);
            if (k == 0) {
                base_step = st;
            }
            printf("  %-17s step %.3f ms (%.3f of off); halo ms per step, rank: fwd+adj", names[k],
                   st * 1e3, st / base_step);
            double hidden_lo = 1, hidden_hi = -1e9;
            for (int q = 0; q < size; q++) {
                double f = median(fwd + (k * size + q) * rounds, rounds);
                double a = median(adj + (k * size + q) * rounds, rounds);
                if (k == 0) {
                    base_halo[q] = f + a;
                }
                double hid = base_halo[q] > 0 ? 1 - (f + a) / base_halo[q] : 0;
                hidden_lo  = hid < hidden_lo ? hid : hidden_lo;
                hidden_hi  = hid > hidden_hi ? hid : hidden_hi;
                printf(" %d: %.3f+%.3f", q, f * 1e3, a * 1e3);
            }
            if (k > 0) {
                printf("; hidden %.0f-%.0f %%", 100 * hidden_lo, 100 * hidden_hi);
            }
            printf("\n");
        }
    }
    free(step);
    free(fwd);
    free(adj);
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
    long        batch = 0, steps = 30, warm = 3, ab = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--model") == 0) {
            model = argv[i + 1];
        } else if (strcmp(argv[i], "--data") == 0) {
            data = argv[i + 1];
        } else if (strcmp(argv[i], "--batch") == 0) {
            batch = atol(argv[i + 1]);
        } else if (strcmp(argv[i], "--steps") == 0) {
            steps = atol(argv[i + 1]);
        } else if (strcmp(argv[i], "--warmup") == 0) {
            warm = atol(argv[i + 1]);
        } else if (strcmp(argv[i], "--overlap-ab") == 0) {
            ab = atol(argv[i + 1]);
        }
    }
    json_error_t je;
    json_t      *j = model ? json_load_file(model, 0, &je) : NULL;
    if (j == NULL || batch < 0 || steps < 1 || warm < 0 || ab < 0 || ab > 1000 ||
        (ab > 0 && size > 64)) {
        if (rank == 0) {
            fprintf(stderr, "usage: bench-train-worker --model spec.json [--data DIR] [--batch B] "
                            "[--steps S] [--warmup W] [--overlap-ab ROUNDS]\n"
                            "(--overlap-ab: at most 64 ranks)\n");
        }
        MPI_Finalize();
        return 2;
    }
    if (batch > 0) {
        json_object_set_new(j, "batch_size", json_integer(batch));
    }
    char        *text    = json_dumps(j, 0);
    ddl_spec_t  *spec    = NULL;
    ddl_status   st      = ddl_spec_parse(text, model, size, &spec);
    ddl_model_t *m       = NULL;
    float       *x       = NULL;
    int64_t     *lab     = NULL;
    size_t       xs      = 0;
    int64_t      ls      = 0;
    int          threads = ddl_runtime_divide_cores(MPI_COMM_WORLD);
    if (rank == 0) {
        ddl_blas_log("bench-train-worker", threads);
    }
    if (st == DDL_OK && ddl_spec_dtype(spec) != DDL_F32) {
        st = ddl_set_error(DDL_EINVAL, "bench-train-worker: %s is not f32", model);
    }
    if (st == DDL_OK) {
        batch        = (long)ddl_spec_batch_size(spec);
        ddl_shape in = ddl_spec_input_shape(spec);
        xs           = (size_t)shape_elems(&in) * (size_t)batch;
        ls           = ddl_spec_label_elems(spec) * batch;
        st           = ddl_model_create(MPI_COMM_WORLD, spec, &m);
    }
    if (st == DDL_OK && rank == 0) {
        x   = malloc(sizeof(float) * xs * NBATCH);
        lab = malloc(sizeof(int64_t) * (size_t)ls * NBATCH);
        st  = x == NULL || lab == NULL ? ddl_set_error(DDL_ENOMEM, "bench-train-worker: batches")
                                       : make_batches(spec, data, batch, x, lab);
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
    ddl_traffic_time c0, c1;
    double           hdummy[2];
    timed_steps(m, rank, x, xs, lab, ls, batch, 0, warm, hdummy);
    if (ab > 0) {
        overlap_ab(m, rank, size, x, xs, lab, ls, batch, steps, (int)ab);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    ddl_traffic_time_snapshot(&c0);
    timed_steps(m, rank, x, xs, lab, ls, batch, warm, steps, hdummy);
    ddl_traffic_time_snapshot(&c1);
    MPI_Barrier(MPI_COMM_WORLD);
    double dt = MPI_Wtime() - t0;
    // Seconds per step in each primitive kind and pass, every rank's, on rank 0.
    enum { NK = DDL_TRAFFIC_NKINDS, NP = DDL_TRAFFIC_NPASSES };
    double mine[NK * NP], *every = rank == 0 ? malloc(sizeof(double) * NK * NP * size) : NULL;
    for (int k = 0; k < NK; k++) {
        for (int p = 0; p < NP; p++) {
            mine[k * NP + p] = (c1.s[k][p] - c0.s[k][p]) / (double)steps;
        }
    }
    MPI_Gather(mine, NK * NP, MPI_DOUBLE, every, NK * NP, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    // The same-run reference, after the timed steps (so it does not warm or cool them).
    double  rate = sgemm_rate(1024), total_rate = 0;
    double *rates = rank == 0 ? malloc(sizeof(double) * (size_t)size) : NULL;
    MPI_Gather(&rate, 1, MPI_DOUBLE, rates, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    for (int r = 0; rank == 0 && r < size; r++) {
        total_rate += rates[r]; // the ranks' rates, summed
    }
    if (rank == 0) {
        printf("np %d threads/rank %d batch %ld steps %ld: %.3f s, images_per_s %.2f\n", size,
               threads, batch, steps, dt, (double)(batch * steps) / dt);
        int          nl   = spec->nlayers;
        layer_flops *lf   = malloc(sizeof *lf * (size_t)nl);
        double       fopt = spec_flops(spec, lf), fwd = 0, bwd = 0;
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
                printf("  layer %-26s forward %9.2f MFLOP  backward %9.2f MFLOP  %5.1f%%\n",
                       lf[i].name, lf[i].fwd * 1e-6, lf[i].bwd * 1e-6,
                       100 * (lf[i].fwd + lf[i].bwd) / tot);
            }
        }
        printf("  %-32s %9.2f MFLOP  %5.1f%%\n", "optimizer", fopt * 1e-6, 100 * fopt / tot);
        free(lf);
        // The ranks' own sgemm rates: on a VM a core can run much slower than another for
        // a while (docs/PERFORMANCE.md), and a multi-rank step waits for the slowest rank
        // (the others' waits show as time inside the primitives, below).
        printf("sgemm n=1024 per rank, GFLOP/s:");
        for (int r = 0; r < size; r++) {
            printf(" %.1f", rates[r]);
        }
        printf("\n");
        double step = dt / (double)steps;
        printf("step %.3f ms; time inside the primitives per step, rank 0 to %d "
               "(forward + adjoint):\n",
               step * 1e3, size - 1);
        for (int k = 0; k < NK; k++) {
            double lo = 1e300, hi = 0;
            for (int r = 0; r < size; r++) {
                double t = every[(r * NK + k) * NP] + every[(r * NK + k) * NP + 1];
                lo       = t < lo ? t : lo;
                hi       = t > hi ? t : hi;
            }
            if (hi <= 0) {
                continue;
            }
            printf("comm %-15s", ddl_traffic_kind_name((ddl_traffic_kind)k));
            for (int r = 0; r < size; r++) {
                printf(" %.3f+%.3f", every[(r * NK + k) * NP] * 1e3,
                       every[(r * NK + k) * NP + 1] * 1e3);
            }
            printf(" ms: %.1f-%.1f %% of the step\n", 100 * lo / step, 100 * hi / step);
        }
    }
    free(every);
    free(rates);
    free(x);
    free(lab);
    free(text);
    json_decref(j);
    ddl_model_destroy(&m);
    ddl_spec_destroy(&spec);
    MPI_Finalize();
    return 0;
}
