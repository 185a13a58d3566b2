// distdl-train: trains a model spec on an IDX (MNIST-format) dataset, or on the data the
// spec generates ("data": {"synthetic": ...}, e.g. volumetric segmentation), as a batch
// MPI program (a Slurm job with no service).
//
//   mpirun -np P distdl-train --model spec.json [--data DIR|FILE.h5] --epochs N
//          [--checkpoint-dir D --checkpoint-every K] [--resume] [--max-steps S]
//          [--print-steps] [--export FILE.safetensors|DIR] [--no-eval] [--stats]
//
// Rank 0 reads the data, shuffles it per epoch (seeded by the spec's seed and the epoch)
// and feeds batches of the spec's batch size to the model (the last partial batch of
// an epoch is dropped, as with drop_last). Per epoch it prints the mean training loss,
// training accuracy, throughput (images/s) and the test loss and accuracy (for a
// segmentation model: voxel accuracy and the foreground classes' mean IoU; for dense
// targets, regression and masks: the mean squared error and the relative L2 error of
// the prediction, and for bce / bce_with_logits the voxel accuracy); with a
// terminal on stderr it draws a progress bar. Checkpoints hold the data cursor, so
// --resume continues the exact trajectory. With --stats it ends with the bytes a training
// step moved between ranks, per layer (ddl_model_traffic_table; docs/SCALING.md).
//
// The training loop itself is the engine's session (ddl/session.h), the same one the
// daemon drives; this program only parses options, checks its output paths before any
// training, and prints. Every error path frees what it made.
#include <errno.h>
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ddl/base.h"
#include "ddl/blas.h"
#include "ddl/data.h"
#include "ddl/model.h"
#include "ddl/session.h"
#include "ddl/tbevents.h"

typedef struct options {
    const char *model, *data, *ckpt_dir, *export_path, *resume_from, *import_path, *tb_dir;
    long long   epochs, ckpt_every, max_steps;
    bool        resume, print_steps, no_eval, ckpt_on_exit, stats;
} options;

static int rank;

static void usage(FILE *f)
{
    fputs("usage: mpirun -np P distdl-train --model spec.json [--data DIR|FILE.h5] --epochs N\n"
          "         (--data unless the spec generates its data: \"data\": {\"synthetic\": ...};\n"
          "         an IDX directory, or an HDF5 file every rank reads its own box of)\n"
          "         [--checkpoint-dir D] [--checkpoint-every K] [--checkpoint-on-exit]\n"
          "         [--resume | --resume-from CHECKPOINT]  (any world size / partitioning)\n"
          "         [--max-steps S (total optimizer steps)] [--print-steps]\n"
          "         [--import FILE.safetensors|DIR] [--export FILE.safetensors|DIR] [--no-eval]\n"
          "         [--stats (bytes moved per training step, per layer)]\n"
          "         [--tensorboard-dir D (TensorBoard event files: loss, accuracy, img/s,\n"
          "          learning rate per step; the test figures per epoch)]\n"
          "         [-h | --help]\n",
          f);
}

// Parses the command line identically on every rank; returns 0, 1 for help, or 2 with a
// message.
static int parse_args(int argc, char **argv, options *o, char *err, size_t errlen)
{
    static const struct option longs[] = {{"model", required_argument, 0, 'm'},
                                          {"data", required_argument, 0, 'd'},
                                          {"epochs", required_argument, 0, 'e'},
                                          {"checkpoint-dir", required_argument, 0, 'c'},
                                          {"checkpoint-every", required_argument, 0, 'k'},
                                          {"resume", no_argument, 0, 'r'},
                                          {"max-steps", required_argument, 0, 's'},
                                          {"print-steps", no_argument, 0, 'p'},
                                          {"export", required_argument, 0, 'x'},
                                          {"no-eval", no_argument, 0, 'n'},
                                          {"resume-from", required_argument, 0, 'R'},
                                          {"import", required_argument, 0, 'I'},
                                          {"checkpoint-on-exit", no_argument, 0, 'E'},
                                          {"stats", no_argument, 0, 'S'},
                                          {"tensorboard-dir", required_argument, 0, 'T'},
                                          {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};
    memset(o, 0, sizeof *o);
    o->epochs    = 1;
    o->max_steps = -1;
    opterr       = 0;
    int ch;
    while ((ch = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
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
        case 'S': o->stats = true; break;
        case 'h': return 1;
        case 'e':
        case 'k':
        case 's': {
            errno            = 0;
            long long   v    = strtoll(optarg, &end, 10);
            const char *name = ch == 'e' ? "--epochs" : ch == 'k' ? "--checkpoint-every" : "--max-steps";
            if (errno == ERANGE) {
                snprintf(err, errlen, "%s %s is out of range (at most %lld)", name, optarg,
                         (long long)LLONG_MAX);
                return 2;
            }
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
        case 'T':
            if (optarg[0] == '\0') {
                snprintf(err, errlen, "--tensorboard-dir needs a directory, got \"\"");
                return 2;
            }
            o->tb_dir = optarg;
            break;
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
    if (o->model == NULL) {
        snprintf(err, errlen, "--model is required");
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

// Rank 0: can we write where we will write, before hours of training? The checkpoint
// directory is created if missing and must be writable; an export file's directory must
// be writable (an export directory of .npy files may exist, writable, or be creatable).
static bool writable_dir(const char *dir, char *err, size_t len, const char *what)
{
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode) || access(dir, W_OK | X_OK) != 0) {
        snprintf(err, len, "%s: %s is not a writable directory", what, dir);
        return false;
    }
    return true;
}

static bool parent_writable(const char *path, char *err, size_t len, const char *what)
{
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    return writable_dir(dirname(buf), err, len, what);
}

// mkdir -p: creates dir and its missing parents.
static bool make_dirs(const char *dir, char *err, size_t len)
{
    char buf[4096];
    int  n = snprintf(buf, sizeof buf, "%s", dir);
    if (n <= 0 || (size_t)n >= sizeof buf) {
        snprintf(err, len, "--checkpoint-dir: path too long");
        return false;
    }
    for (char *p = buf + 1;; p++) {
        if (*p != '/' && *p != '\0') {
            continue;
        }
        char saved = *p;
        *p         = '\0';
        struct stat sb;
        if (stat(buf, &sb) != 0 && mkdir(buf, 0777) != 0 && errno != EEXIST) {
            snprintf(err, len, "--checkpoint-dir: cannot create %.400s: %s", buf, strerror(errno));
            return false;
        }
        *p = saved;
        if (saved == '\0') {
            return true;
        }
    }
}

static bool check_outputs(const options *o, char *err, size_t len)
{
    if (o->ckpt_dir != NULL) {
        // Creating it (and missing parents) now is what the first checkpoint would do; a
        // failure is reported here instead of after hours of training.
        if (!make_dirs(o->ckpt_dir, err, len) ||
            !writable_dir(o->ckpt_dir, err, len, "--checkpoint-dir")) {
            return false;
        }
    }
    if (o->export_path != NULL) {
        size_t      n    = strlen(o->export_path);
        bool        file = n > 12 && strcmp(o->export_path + n - 12, ".safetensors") == 0;
        struct stat sb;
        if (file) {
            if (stat(o->export_path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
                snprintf(err, len, "--export: %s is a directory", o->export_path);
                return false;
            }
            return parent_writable(o->export_path, err, len, "--export");
        }
        if (stat(o->export_path, &sb) == 0) {
            return writable_dir(o->export_path, err, len, "--export");
        }
        return parent_writable(o->export_path, err, len, "--export");
    }
    return true;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void progress_bar(int64_t done, int64_t total, double loss, double rate)
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

typedef struct printer {
    bool print_steps, tty;
    // --tensorboard-dir (rank 0; NULL: off, or stopped by a write error) and the session
    // whose learning rate it records.
    ddl_tb_writer *tb;
    ddl_session_t *s;
} printer;

// The outcome of writing TensorBoard events, and a flush if asked or a second has passed.
// A write that fails (a full disk) stops the events with a warning; training goes on.
static void tb_done(printer *pr, ddl_status st, bool flush)
{
    if (pr->tb == NULL) {
        return;
    }
    if (st == DDL_OK) {
        st = ddl_tb_flush_due(pr->tb, flush);
    }
    if (st != DDL_OK) {
        fprintf(stderr, "distdl-train: %s: no more TensorBoard events\n", ddl_last_error());
        ddl_tb_close(pr->tb);
        pr->tb = NULL;
    }
}

// The session's progress callback (rank 0): step lines and the progress bar.
static bool on_progress(const ddl_progress *p, void *user_data)
{
    printer *pr = user_data;
    if (pr->tb != NULL) {
        double lr = ddl_optimizer_lr(ddl_model_optimizer(ddl_session_model(pr->s)));
        tb_done(
            pr,
            ddl_tb_train_step(pr->tb, p->step, p->loss, p->accuracy, p->mse, p->images_per_s, lr),
            false);
    }
    if (pr->print_steps) {
        // 17 digits round-trip a double: f64 runs compare to PyTorch at 1e-10 and below.
        printf("step %lld loss %.17g\n", (long long)p->step, p->loss);
    }
    if (pr->tty && ((p->batch - 1) % 10 == 0 || p->epoch_end)) {
        progress_bar(p->batch, p->steps_per_epoch, p->mean_loss, p->images_per_s);
    }
    return false;
}

// Prints a failure (rank 0) and returns the exit code: every rank reaches it with the
// same status and message (the session agrees on every command).
static int fail(const char *what, ddl_status st, int code)
{
    if (rank == 0) {
        fprintf(stderr, "distdl-train: %s: %s (%s)\n", what, ddl_last_error(), ddl_status_name(st));
    }
    return code;
}

// Everything between MPI_Init and MPI_Finalize; frees all it makes on every path.
// The primitive kinds a row moved bytes with, e.g. "halo_exchange broadcast".
static void row_kinds(const ddl_traffic_row *r, char *buf, size_t len)
{
    buf[0]   = '\0';
    size_t n = 0;
    for (int k = 0; k < DDL_TRAFFIC_NKINDS; k++) {
        uint64_t b = 0;
        for (int p = 0; p < DDL_TRAFFIC_NPASSES; p++) {
            b += r->fwd.c[k][p].sent + r->bwd.c[k][p].sent;
        }
        if (b > 0 && n < len) {
            n += (size_t)snprintf(buf + n, len - n, "%s%s", n > 0 ? " " : "",
                                  ddl_traffic_kind_name((ddl_traffic_kind)k));
        }
    }
}

// --stats: the per-step traffic table (collective), printed by rank 0.
static ddl_status print_stats(ddl_model_t *m)
{
    int              n    = ddl_model_traffic_rows(m);
    ddl_traffic_row *rows = calloc((size_t)n, sizeof *rows);
    int              ok   = rows != NULL, all;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, ddl_model_comm(m));
    if (!all) {
        free(rows);
        return ddl_set_error(DDL_ENOMEM, "--stats: out of memory");
    }
    ddl_status st = ddl_model_traffic_table(m, rows, n);
    if (st == DDL_OK && rank == 0) {
        printf("bytes moved per training step, summed over ranks (each byte sent once and "
               "received once):\n");
        printf("  %-20s %-14s %12s %12s  %s\n", "layer", "type", "forward", "backward",
               "primitives");
        uint64_t total = 0;
        for (int i = 0; i < n; i++) {
            uint64_t f = ddl_traffic_total(&rows[i].fwd).sent;
            uint64_t b = ddl_traffic_total(&rows[i].bwd).sent;
            char     kinds[128];
            row_kinds(&rows[i], kinds, sizeof kinds);
            printf("  %-20s %-14s %12llu %12llu  %s\n", rows[i].name, rows[i].type,
                   (unsigned long long)f, (unsigned long long)b, kinds);
            total += f + b;
        }
        printf("  %-35s %12llu bytes per step\n", "total", (unsigned long long)total);
        fflush(stdout);
    }
    free(rows);
    return st;
}

static int run(const options *o, int size)
{
    // The spec is read on rank 0 only; the session broadcasts it.
    ddl_spec_t *spec = NULL;
    ddl_status  st   = DDL_OK;
    if (rank == 0) {
        st = ddl_spec_load(o->model, size, &spec);
    }
    int ok = st == DDL_OK;
    MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (!ok) {
        if (rank == 0) {
            fprintf(stderr, "distdl-train: %s\n", ddl_last_error());
        }
        ddl_spec_destroy(&spec);
        return 2;
    }
    // The data: a directory, or generated by the spec; exactly one. Then the output paths,
    // all before anything expensive happens.
    char err[512] = "";
    if (rank == 0) {
        bool synth = ddl_spec_synthetic(spec, NULL, NULL, NULL);
        if (synth && o->data != NULL) {
            snprintf(err, sizeof err, "the spec %s generates its data (\"data\": {\"synthetic\": "
                                      "...}); leave out --data",
                     o->model);
        } else if (!synth && o->data == NULL) {
            snprintf(err, sizeof err, "--data DIR is required (the spec %s has no \"data\": "
                                      "{\"synthetic\": ...})",
                     o->model);
        }
    }
    ok                = err[0] == '\0' && (rank != 0 || check_outputs(o, err, sizeof err));
    ddl_tb_writer *tb = NULL;
    if (ok && rank == 0 && o->tb_dir != NULL && ddl_tb_open(o->tb_dir, &tb) != DDL_OK) {
        snprintf(err, sizeof err, "--tensorboard-dir %s: %s", o->tb_dir, ddl_last_error());
        ok = 0;
    }
    MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (!ok) {
        if (rank == 0) {
            fprintf(stderr, "distdl-train: %s\n", err);
        }
        ddl_spec_destroy(&spec);
        return 2;
    }
    int                 threads = ddl_runtime_divide_cores(MPI_COMM_WORLD);
    if (rank == 0) {
        ddl_blas_log("distdl-train", threads);
    }
    ddl_session_options opts    = {o->ckpt_dir, o->ckpt_every};
    ddl_session_t      *s       = NULL;
    st = ddl_session_create(MPI_COMM_WORLD, rank == 0 ? ddl_spec_text(spec) : NULL, o->model, &opts,
                            &s);
    ddl_spec_destroy(&spec);
    if (st != DDL_OK) {
        ddl_tb_close(tb);
        return fail("building the model", st, 1);
    }
    printer pr    = {o->print_steps, rank == 0 && isatty(2), tb, s}; // owns tb from here
    int     rc    = 0;
    bool    synth = ddl_spec_synthetic(ddl_model_spec(ddl_session_model(s)), NULL, NULL, NULL);
    bool    seg   = ddl_spec_label_elems(ddl_model_spec(ddl_session_model(s))) > 1;
    bool    dense = ddl_spec_dense_targets(ddl_model_spec(ddl_session_model(s)));
    st            = synth ? ddl_session_open_synthetic(s) : ddl_session_open_data(s, o->data);
    if (st != DDL_OK) {
        if (rank == 0) {
            fprintf(stderr, "distdl-train: %s\n", ddl_last_error());
        }
        rc = 2;
        goto done;
    }
    ddl_model_t *m = ddl_session_model(s);
    if (o->import_path != NULL) {
        st = ddl_model_import(m, o->import_path);
        if (st != DDL_OK) {
            rc = fail("importing weights", st, 1);
            goto done;
        }
        if (rank == 0) {
            printf("imported weights from %s\n", o->import_path);
        }
    }
    if (o->resume) {
        const char *from = o->resume_from ? o->resume_from : o->ckpt_dir;
        st               = ddl_session_restore(s, from, -1);
        if (st == DDL_ENOTFOUND && o->resume_from == NULL) {
            if (rank == 0) {
                fprintf(stderr, "distdl-train: no checkpoint in %s yet, starting fresh\n", from);
            }
        } else if (st != DDL_OK) {
            rc = fail("resuming", st, st == DDL_EINVAL ? 2 : 1);
            goto done;
        } else if (rank == 0) {
            ddl_cursor c = ddl_session_cursor(s);
            printf("resumed from %s at step %lld (epoch %lld, batch %lld)\n", from,
                   (long long)ddl_model_step(m), (long long)c.epoch + 1, (long long)c.batch);
        }
    }
    const ddl_spec_t *sp  = ddl_model_spec(m);
    int64_t           B   = ddl_spec_batch_size(sp);
    int64_t           spe = ddl_session_steps_per_epoch(s);
    if (rank == 0) {
        printf("model %s on %d ranks (%d BLAS thread%s each): %d parameter tensors, batch %lld, "
               "%lld steps per epoch\n",
               o->model, size, threads, threads == 1 ? "" : "s", ddl_model_nparams(m), (long long)B,
               (long long)spe);
        fflush(stdout);
    }
    for (int64_t epoch = ddl_session_cursor(s).epoch; epoch < o->epochs; epoch++) {
        int64_t left = spe - ddl_session_cursor(s).batch, step = ddl_model_step(m);
        if (o->max_steps >= 0 && step >= o->max_steps) {
            break;
        }
        bool last = false;
        if (o->max_steps >= 0 && o->max_steps - step < left) {
            left = o->max_steps - step;
            last = true;
        }
        ddl_train_request req = {.steps = left};
        ddl_train_result  res;
        double            t0 = now();
        st                   = ddl_session_train(s, &req, on_progress, &pr, &res);
        double dt            = now() - t0;
        if (st != DDL_OK) {
            rc = fail("training", st, 1);
            goto done;
        }
        if (pr.tty) {
            fprintf(stderr, "\n");
        }
        ddl_eval_result ev = {0};
        if (!o->no_eval && res.steps_done > 0) {
            st = ddl_session_evaluate(s, DDL_SPLIT_TEST, &ev);
            if (st != DDL_OK) {
                rc = fail("evaluating", st, 1);
                goto done;
            }
            if (pr.tb != NULL) {
                tb_done(&pr,
                        ddl_tb_eval(pr.tb, ddl_model_step(m), ev.loss, ev.accuracy, ev.mse,
                                    ev.rel_l2, ev.fg_iou),
                        true);
            }
        }
        tb_done(&pr, DDL_OK, true); // the epoch's events reach the file
        if (rank == 0 && res.steps_done > 0 && dense) {
            // Regression and dense binary targets: the error of the prediction, and the
            // accuracy of the values where it applies (bce, bce_with_logits).
            int64_t seen = res.steps_done * B;
            printf("epoch %lld: loss %.4f  train mse %.6g", (long long)epoch + 1, res.mean_loss,
                   res.mse);
            if (res.accuracy >= 0) {
                printf("  train voxel acc %.4f", res.accuracy);
            }
            printf("  %.1f img/s  %.1f s", (double)seen / dt, dt);
            if (!o->no_eval) {
                printf("  test loss %.4f  test mse %.6g  test rel L2 %.4f", ev.loss, ev.mse,
                       ev.rel_l2);
                if (ev.accuracy >= 0) {
                    printf("  test voxel acc %.4f", ev.accuracy);
                }
            }
            printf("\n");
            fflush(stdout);
        } else if (rank == 0 && res.steps_done > 0) {
            int64_t seen = res.steps_done * B;
            printf("epoch %lld: loss %.4f  train %sacc %.4f  %.1f img/s  %.1f s",
                   (long long)epoch + 1, res.mean_loss, seg ? "voxel " : "", res.accuracy,
                   (double)seen / dt, dt);
            if (!o->no_eval) {
                printf("  test loss %.4f  test %sacc %.4f", ev.loss, seg ? "voxel " : "",
                       ev.accuracy);
                if (ev.fg_iou >= 0) {
                    printf("  test fg IoU %.4f", ev.fg_iou);
                }
            }
            printf("\n");
            fflush(stdout);
        }
        if (last) {
            break;
        }
    }
    if (o->stats) {
        st = print_stats(m);
        if (st != DDL_OK) {
            rc = fail("--stats", st, 1);
            goto done;
        }
    }
    if (o->ckpt_on_exit) {
        st = ddl_session_save(s, NULL, NULL);
        if (st != DDL_OK) {
            rc = fail("writing the final checkpoint", st, 1);
            goto done;
        }
    }
    if (o->export_path != NULL) {
        st = ddl_model_export(m, o->export_path);
        if (st != DDL_OK) {
            rc = fail("exporting weights", st, 1);
            goto done;
        }
        if (rank == 0) {
            printf("exported weights to %s\n", o->export_path);
        }
    }
done:
    tb_done(&pr, DDL_OK, true);
    ddl_tb_close(pr.tb);
    ddl_session_destroy(&s);
    return rc;
}

int main(int argc, char **argv)
{
    ddl_blas_startup(argc, argv); // may re-execute: before anything else
    ddl_malloc_tune_for_streaming();
    MPI_Init(&argc, &argv);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    options o;
    char    err[512] = "";
    int     prc      = parse_args(argc, argv, &o, err, sizeof err);
    int     rc       = 0;
    if (prc != 0) {
        if (rank == 0) {
            if (prc == 2) {
                fprintf(stderr, "distdl-train: %s\n", err);
            }
            usage(prc == 1 ? stdout : stderr);
        }
        rc = prc == 1 ? 0 : 2;
    } else {
        rc = run(&o, size);
    }
    MPI_Finalize();
    return rc;
}
