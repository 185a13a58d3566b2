// distdl-train: trains a model spec on an IDX (MNIST-format) dataset as a batch MPI
// program (a Slurm job with no service).
//
//   mpirun -np P distdl-train --model spec.json --data DIR --epochs N
//          [--checkpoint-dir D --checkpoint-every K] [--resume] [--max-steps S]
//          [--print-steps] [--export FILE.safetensors|DIR] [--no-eval]
//
// Rank 0 reads the data, shuffles it per epoch (seeded by the spec's seed and the epoch)
// and feeds batches of the spec's batch size to the model (the last partial batch of
// an epoch is dropped, as with drop_last). Per epoch it prints the mean training loss,
// training accuracy, throughput (images/s) and the test loss and accuracy; with a
// terminal on stderr it draws a progress bar. Checkpoints hold the data cursor, so
// --resume continues the exact trajectory.
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "ddl/base.h"
#include "ddl/data.h"
#include "ddl/model.h"

typedef struct options {
    const char *model, *data, *ckpt_dir, *export_path, *resume_from, *import_path;
    long long   epochs, ckpt_every, max_steps;
    bool        resume, print_steps, no_eval, ckpt_on_exit;
} options;

static int rank;

static void usage(FILE *f)
{
    fputs("usage: mpirun -np P distdl-train --model spec.json --data DIR --epochs N\n"
          "         [--checkpoint-dir D] [--checkpoint-every K] [--checkpoint-on-exit]\n"
          "         [--resume | --resume-from CHECKPOINT]  (any world size / partitioning)\n"
          "         [--max-steps S (total optimizer steps)] [--print-steps]\n"
          "         [--import FILE.safetensors|DIR] [--export FILE.safetensors|DIR] [--no-eval]\n",
          f);
}

// Parses the command line identically on every rank; returns 0, or 2 with a message.
static int parse_args(int argc, char **argv, options *o, char *err, size_t errlen)
{
    static const struct option longs[] = {
        {"model", required_argument, 0, 'm'},          {"data", required_argument, 0, 'd'},
        {"epochs", required_argument, 0, 'e'},         {"checkpoint-dir", required_argument, 0, 'c'},
        {"checkpoint-every", required_argument, 0, 'k'}, {"resume", no_argument, 0, 'r'},
        {"max-steps", required_argument, 0, 's'},      {"print-steps", no_argument, 0, 'p'},
        {"export", required_argument, 0, 'x'},         {"no-eval", no_argument, 0, 'n'},
        {"resume-from", required_argument, 0, 'R'},    {"import", required_argument, 0, 'I'},    {"checkpoint-on-exit", no_argument, 0, 'E'},
        {"help", no_argument, 0, 'h'},                 {0, 0, 0, 0}};
    memset(o, 0, sizeof *o);
    o->epochs    = 1;
    o->max_steps = -1;
    opterr       = 0;
    int ch;
    while ((ch = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        char *end = NULL;
        switch (ch) {
        case 'm': o->model = optarg; break;
        case 'd': o->data = optarg; break;
        case 'c': o->ckpt_dir = optarg; break;
        case 'x': o->export_path = optarg; break;
        case 'r': o->resume = true; break;
        case 'R': o->resume = true; o->resume_from = optarg; break;
        case 'E': o->ckpt_on_exit = true; break;
        case 'I': o->import_path = optarg; break;
        case 'p': o->print_steps = true; break;
        case 'n': o->no_eval = true; break;
        case 'h': return 1;
        case 'e':
        case 'k':
        case 's': {
            long long v = strtoll(optarg, &end, 10);
            const char *name = ch == 'e' ? "--epochs" : ch == 'k' ? "--checkpoint-every" : "--max-steps";
            if (end == optarg || *end != '\0' || v < (ch == 's' ? 0 : 1)) {
                snprintf(err, errlen, "%s needs a whole number >= %d, got \"%s\"", name,
                         ch == 's' ? 0 : 1, optarg);
                return 2;
            }
            if (ch == 'e') o->epochs = v;
            if (ch == 'k') o->ckpt_every = v;
            if (ch == 's') o->max_steps = v;
            break;
        }
        default:
            snprintf(err, errlen, "unknown or incomplete option \"%s\"", argv[optind - 1]);
            return 2;
        }
    }
    if (optind < argc) {
        snprintf(err, errlen, "unexpected argument \"%s\"", argv[optind]);
        return 2;
    }
    if (o->import_path != NULL && o->resume) {
        snprintf(err, errlen, "--import and --resume both set the weights; give one");
        return 2;
    }
    if (o->model == NULL || o->data == NULL) {
        snprintf(err, errlen, "--model and --data are required");
        return 2;
    }
    if ((o->ckpt_every > 0 || o->ckpt_on_exit || (o->resume && o->resume_from == NULL)) &&
        o->ckpt_dir == NULL) {
        snprintf(err, errlen,
                 "--checkpoint-every, --checkpoint-on-exit and --resume need --checkpoint-dir");
        return 2;
    }
    return 0;
}

// The trainer's state in a checkpoint: the data cursor (the next batch to train on) and
// the random state. Every random stream here is counter-based: the shuffle of epoch e is
// stream e of the seed, dropout at optimizer step t draws stream t; (seed, step) is the
// whole state.
static void cursor_json(char *buf, size_t len, int64_t epoch, int64_t batch, uint64_t seed,
                        int64_t step)
{
    snprintf(buf, len,
             "{\"epoch\": %lld, \"batch\": %lld, \"rng\": {\"seed\": %llu, \"shuffle_stream\": "
             "%lld, \"dropout_stream\": %lld}}",
             (long long)epoch, (long long)batch, (unsigned long long)seed, (long long)epoch,
             (long long)step);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void progress(int64_t done, int64_t total, double loss, double rate)
{
    int  width = 30, fill = total > 0 ? (int)(width * done / total) : width;
    char bar[64];
    for (int i = 0; i < width; i++) {
        bar[i] = i < fill ? '#' : '.';
    }
    bar[width] = '\0';
    fprintf(stderr, "\r  [%s] %lld/%lld  loss %.4f  %.0f img/s ", bar, (long long)done,
            (long long)total, loss, rate);
    fflush(stderr);
}

// Fails the whole job the same way on every rank: prints (rank 0) and exits 1.
static int die(const char *what, ddl_status st)
{
    if (rank == 0) {
        fprintf(stderr, "distdl-train: %s: %s (%s)\n", what, ddl_last_error(), ddl_status_name(st));
    }
    MPI_Finalize();
    return 1;
}

// Evaluates the test split in batches (the last one padded); returns loss and accuracy.
static ddl_status evaluate(ddl_model_t *m, const ddl_dataset *test, void *xbuf, int64_t *lbuf,
                           int64_t *idx, double *loss, double *acc)
{
    const ddl_spec_t *s = ddl_model_spec(m);
    int64_t           B = ddl_spec_batch_size(s), n = 0, hits = 0;
    double            mean, std, lsum = 0;
    ddl_spec_normalize(s, &mean, &std);
    int64_t total = rank == 0 ? test->n : 0;
    MPI_Bcast(&total, 1, MPI_INT64_T, 0, ddl_model_comm(m));
    for (int64_t start = 0; start < total; start += B) {
        int64_t count = total - start < B ? total - start : B;
        if (rank == 0) {
            for (int64_t i = 0; i < B; i++) {
                idx[i] = start + (i < count ? i : 0);  // padding repeats a valid sample
            }
            if (ddl_spec_dtype(s) == DDL_F32) {
                ddl_dataset_batch_f32(test, idx, B, mean, std, xbuf, lbuf);
            } else {
                ddl_dataset_batch_f64(test, idx, B, mean, std, xbuf, lbuf);
            }
        }
        double     l;
        int64_t    c;
        ddl_status st = ddl_model_eval(m, xbuf, lbuf, count, &l, &c);
        if (st != DDL_OK) {
            return st;
        }
        lsum += l;
        hits += c;
        n += count;
    }
    *loss = n ? lsum / (double)n : 0;
    *acc  = n ? (double)hits / (double)n : 0;
    return DDL_OK;
}

int main(int argc, char **argv)
{
    ddl_malloc_tune_for_streaming();
    MPI_Init(&argc, &argv);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    options o;
    char    err[512] = "";
    int     prc      = parse_args(argc, argv, &o, err, sizeof err);
    if (prc != 0) {
        if (rank == 0) {
            if (prc == 2) {
                fprintf(stderr, "distdl-train: %s\n", err);
            }
            usage(prc == 1 ? stdout : stderr);
        }
        MPI_Finalize();
        return prc == 1 ? 0 : 2;
    }
    ddl_spec_t *spec = NULL;
    ddl_status  st   = ddl_spec_load(o.model, size, &spec);
    if (st != DDL_OK) {
        if (rank == 0) {
            fprintf(stderr, "distdl-train: %s\n", ddl_last_error());
        }
        MPI_Finalize();
        return 2;
    }
    // Data on rank 0; every rank learns whether it loaded.
    ddl_dataset train = {0}, test = {0};
    int         ok    = 1;
    if (rank == 0) {
        st = ddl_dataset_load_mnist_dir(o.data, 1, &train);
        if (st == DDL_OK && !o.no_eval) {
            st = ddl_dataset_load_mnist_dir(o.data, 0, &test);
        }
        ok = st == DDL_OK;
        if (!ok) {
            fprintf(stderr, "distdl-train: %s\n", ddl_last_error());
        } else {
            ddl_shape in = ddl_spec_input_shape(spec);
            int64_t   ss = ddl_shape_numel(&in);
            if (ss != train.sample_size || train.num_classes > ddl_spec_num_classes(spec)) {
                fprintf(stderr,
                        "distdl-train: the data's samples (%lld values, %d classes) do not fit "
                        "the model's input (%lld values) and output (%d classes)\n",
                        (long long)train.sample_size, train.num_classes, (long long)ss,
                        ddl_spec_num_classes(spec));
                ok = 0;
            }
        }
    }
    MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (!ok) {
        ddl_dataset_free(&train);
        ddl_dataset_free(&test);
        ddl_spec_destroy(&spec);
        MPI_Finalize();
        return 2;
    }
    int          threads = ddl_runtime_divide_cores(MPI_COMM_WORLD);
    ddl_model_t *m       = NULL;
    st                   = ddl_model_create(MPI_COMM_WORLD, spec, &m);
    if (st != DDL_OK) {
        return die("building the model", st);
    }
    int64_t B = ddl_spec_batch_size(spec), epoch0 = 0, batch0 = 0;
    if (o.import_path != NULL) {
        st = ddl_model_import(m, o.import_path);
        if (st != DDL_OK) {
            return die("importing weights", st);
        }
        if (rank == 0) {
            printf("imported weights from %s\n", o.import_path);
        }
    }
    if (o.resume) {
        char *user = NULL;
        const char *from = o.resume_from ? o.resume_from : o.ckpt_dir;
        st               = ddl_model_load(m, from, &user);
        if (st == DDL_ENOTFOUND && o.resume_from == NULL) {
            if (rank == 0) {
                fprintf(stderr, "distdl-train: no checkpoint in %s yet, starting fresh\n", from);
            }
        } else if (st != DDL_OK) {
            return die("resuming", st);
        } else {
            json_t *u    = json_loads(user ? user : "{}", 0, NULL);
            epoch0       = json_integer_value(json_object_get(u, "epoch"));
            batch0       = json_integer_value(json_object_get(u, "batch"));
            json_t *seed = json_object_get(json_object_get(u, "rng"), "seed");
            bool    same = seed == NULL ||
                        (uint64_t)json_integer_value(seed) == ddl_spec_seed(spec);
            long long was = seed ? json_integer_value(seed) : 0;
            json_decref(u);
            if (!same) {
                if (rank == 0) {
                    fprintf(stderr,
                            "distdl-train: the checkpoint was trained with seed %lld but %s has "
                            "seed %llu; resuming would not continue the same run\n",
                            was, o.model, (unsigned long long)ddl_spec_seed(spec));
                }
                ddl_free(user);
                MPI_Finalize();
                return 2;
            }
            if (rank == 0) {
                printf("resumed from %s at step %lld (epoch %lld, batch %lld)\n", from,
                       (long long)ddl_model_step(m), (long long)epoch0 + 1, (long long)batch0);
            }
        }
        ddl_free(user);
    }
    size_t   es   = ddl_dtype_size(ddl_spec_dtype(spec));
    ddl_shape in  = ddl_spec_input_shape(spec);
    int64_t  ss   = ddl_shape_numel(&in);
    void    *xbuf = rank == 0 ? ddl_malloc((size_t)(B * ss) * es) : NULL;
    int64_t *lbuf = rank == 0 ? ddl_malloc(sizeof(int64_t) * (size_t)B) : NULL;
    int64_t *perm = rank == 0 ? ddl_malloc(sizeof(int64_t) * (size_t)(train.n > B ? train.n : B)) : NULL;
    int64_t  ntrain = rank == 0 ? train.n : 0;
    MPI_Bcast(&ntrain, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
    int64_t steps_per_epoch = ntrain / B;
    double  mean, std;
    ddl_spec_normalize(spec, &mean, &std);
    bool tty = rank == 0 && isatty(2);
    if (rank == 0) {
        printf("model %s on %d ranks (%d BLAS thread%s each): %d parameter tensors, batch %lld, "
               "%lld steps per epoch\n",
               o.model, size, threads, threads == 1 ? "" : "s", ddl_model_nparams(m), (long long)B,
               (long long)steps_per_epoch);
        fflush(stdout);
    }
    int64_t steps_done = 0, cur_epoch = epoch0, cur_batch = batch0;
    bool    stop       = false;
    for (int64_t epoch = epoch0; epoch < o.epochs && !stop; epoch++) {
        if (rank == 0) {
            if (ddl_spec_shuffle(spec)) {
                ddl_dataset_shuffle(train.n, ddl_spec_seed(spec), (uint64_t)epoch, perm);
            } else {
                for (int64_t i = 0; i < train.n; i++) {
                    perm[i] = i;
                }
            }
        }
        double  t0 = now(), lsum = 0;
        int64_t hits = 0, seen = 0;
        for (int64_t b = (epoch == epoch0 ? batch0 : 0); b < steps_per_epoch; b++) {
            if (o.max_steps >= 0 && ddl_model_step(m) >= o.max_steps) {
                stop = true;
                break;
            }
            if (rank == 0) {
                if (ddl_spec_dtype(spec) == DDL_F32) {
                    ddl_dataset_batch_f32(&train, perm + b * B, B, mean, std, xbuf, lbuf);
                } else {
                    ddl_dataset_batch_f64(&train, perm + b * B, B, mean, std, xbuf, lbuf);
                }
            }
            double  loss;
            int64_t c;
            st = ddl_model_train_step(m, xbuf, lbuf, &loss, &c);
            if (st != DDL_OK) {
                return die("training step", st);
            }
            steps_done++;
            cur_epoch = b + 1 == steps_per_epoch ? epoch + 1 : epoch;
            cur_batch = b + 1 == steps_per_epoch ? 0 : b + 1;
            lsum += loss;
            hits += c;
            seen += B;
            if (rank == 0 && o.print_steps) {
                printf("step %lld loss %.9g\n", (long long)ddl_model_step(m), loss);
            }
            if (tty && (b % 10 == 0 || b + 1 == steps_per_epoch)) {
                progress(b + 1, steps_per_epoch, lsum / (double)(seen / B), (double)seen / (now() - t0));
            }
            if (o.ckpt_every > 0 && ddl_model_step(m) % o.ckpt_every == 0) {
                char user[256];
                cursor_json(user, sizeof user, cur_epoch, cur_batch, ddl_spec_seed(spec),
                            ddl_model_step(m));
                st = ddl_model_save(m, o.ckpt_dir, user);
                if (st != DDL_OK) {
                    return die("writing a checkpoint", st);
                }
            }
        }
        double dt = now() - t0;
        if (tty) {
            fprintf(stderr, "\n");
        }
        double tl = 0, ta = 0;
        if (!o.no_eval && (!stop || seen > 0)) {
            st = evaluate(m, &test, xbuf, lbuf, perm, &tl, &ta);
            if (st != DDL_OK) {
                return die("evaluating", st);
            }
        }
        if (rank == 0 && seen > 0) {
            printf("epoch %lld: loss %.4f  train acc %.4f  %.1f img/s  %.1f s", (long long)epoch + 1,
                   lsum / (double)(seen / B), (double)hits / (double)seen, (double)seen / dt, dt);
            if (!o.no_eval) {
                printf("  test loss %.4f  test acc %.4f", tl, ta);
            }
            printf("\n");
            fflush(stdout);
        }
    }
    if (o.ckpt_on_exit) {
        char user[256];
        cursor_json(user, sizeof user, cur_epoch, cur_batch, ddl_spec_seed(spec),
                    ddl_model_step(m));
        st = ddl_model_save(m, o.ckpt_dir, user);
        if (st != DDL_OK) {
            return die("writing the final checkpoint", st);
        }
    }
    if (o.export_path != NULL) {
        st = ddl_model_export(m, o.export_path);
        if (st != DDL_OK) {
            return die("exporting weights", st);
        }
        if (rank == 0) {
            printf("exported weights to %s\n", o.export_path);
        }
    }
    ddl_free(xbuf);
    ddl_free(lbuf);
    ddl_free(perm);
    ddl_model_destroy(&m);
    ddl_spec_destroy(&spec);
    ddl_dataset_free(&train);
    ddl_dataset_free(&test);
    MPI_Finalize();
    return 0;
}
