// Per-rank HDF5 ingest through the session (issue 18 item 3), on 1, 2 and 4 ranks. Rank 0
// writes the files with the HDF5 C library (serially); every rank then opens them in
// parallel (MPI-IO) and reads its own box of each sample:
//  - the same training as rank 0 feeding the same samples inline (ddl_session_step in the
//    session's own shuffled order, then ddl_session_evaluate_batch): the losses and the
//    metrics agree to 1e-12 (the arithmetic is the same, only the data's path differs);
//  - bytes: each rank read exactly its box of the input and of the targets for every
//    sample it was given (the file's element sizes: x is stored float32, y float64), so
//    rank 0 read no more than its own box and the ranks' reads sum to each sample once;
//  - traffic: a step from the file moves exactly the scatter (ddl_model_scatter_traffic)
//    less than an inline step, per rank, and nothing else differs;
//  - bad files, each refused on every rank with the same status, the file and expected
//    versus got in the message, the open data kept: a missing file, a text file, a
//    truncated copy, a missing dataset, integer values, the wrong rank, the wrong
//    extent, N that differs between x and y, a train group without a test group; an
//    allocation that fails on the last rank only;
//  - a NaN under one rank's box only: the Train stops on every rank with the same
//    status, before the step, and training goes on from the good file afterwards;
//  - resumable: a checkpoint mid-epoch restored into a new session on the same file goes
//    on with the same losses, bitwise (one machine, one kernel path).
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ddl/base.h"
#include "ddl/data.h"
#include "ddl/primitives.h"
#include "ddl/session.h"
#include "mpi_test.h"

enum { B = 3, D = 8, H = 6, W = 4, V = D * H * W, NTR = 12, NTE = 5, STEPS = 4 };

static int  size;
static char dir[256];

// The dense-target chain on the volume, f64, Adam; `loss` by name.
static char *spec_text(int P, const char *split, const char *loss)
{
    const int vol[3] = {D, H, W};
    char      rest[256];
    snprintf(rest, sizeof rest,
             " \"loss\": {\"type\": \"%s\"},\n \"optimizer\": {\"type\": \"adam\", \"lr\": 0.01}",
             loss);
    return ddl_test_vol_spec(P, split, 5, "f64", B, vol, ddl_test_conv3d_pair, rest);
}

// Sample i's input (a smooth field) and target (its pointwise square, a nonlinear map
// the network can learn), deterministic.
static double xval(int64_t i, int64_t v)
{
    return sin(0.3 * (double)v + 1.7 * (double)i) + 0.1 * cos((double)(v * (i + 2)));
}

static double yval(int64_t i, int64_t v)
{
    double x = xval(i, v);
    return x * x - 0.5;
}

// A dataset `name` of `type` with dims[0..nd) filled from vals (doubles, converted).
static void put(hid_t loc, const char *name, hid_t type, int nd, const hsize_t *dims,
                const double *vals)
{
    hid_t sp = H5Screate_simple(nd, dims, NULL);
    hid_t ds = H5Dcreate2(loc, name, type, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_TRUE(ds >= 0);
    if (H5Tget_class(type) == H5T_INTEGER) {
        hsize_t n = 1;
        for (int d = 0; d < nd; d++) {
            n *= dims[d];
        }
        long long *iv = malloc(sizeof *iv * n);
        for (hsize_t i = 0; i < n; i++) {
            iv[i] = (long long)vals[i];
        }
        ASSERT_TRUE(H5Dwrite(ds, H5T_NATIVE_LLONG, H5S_ALL, H5S_ALL, H5P_DEFAULT, iv) >= 0);
        free(iv);
    } else {
        ASSERT_TRUE(H5Dwrite(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, vals) >= 0);
    }
    H5Dclose(ds);
    H5Sclose(sp);
}

// What a file variant changes.
typedef struct variant {
    const char *file;
    bool        no_test, no_y, int_x, rank4, bad_extent, short_y, nan;
} variant;

// One file: groups train (NTR samples) and test (NTE) of x (float32) and y (float64),
// unless the variant says otherwise. Rank 0.
static void write_file(const variant *v)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, v->file);
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_TRUE(f >= 0);
    for (int sp = 0; sp < (v->no_test ? 1 : 2); sp++) {
        int64_t n = sp == 0 ? NTR : NTE, off = sp == 0 ? 0 : NTR;
        hid_t g = H5Gcreate2(f, sp == 0 ? "train" : "test", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        double *xv = malloc(sizeof(double) * (size_t)(n * V));
        double *yv = malloc(sizeof(double) * (size_t)(n * V));
        for (int64_t i = 0; i < n; i++) {
            for (int64_t k = 0; k < V; k++) {
                xv[i * V + k] = xval(off + i, k);
                yv[i * V + k] = yval(off + i, k);
            }
        }
        if (v->nan && sp == 0) {
            // Sample 2, the last depth slice: under the last rank's box only (the volume
            // is split along D, then H).
            yv[2 * V + (D - 1) * H * W + (H - 1) * W + 1] = NAN;
        }
        hsize_t dx[5] = {(hsize_t)n, 1, D, H, W}, dr[4] = {(hsize_t)n, D, H, W};
        hsize_t de[5] = {(hsize_t)n, 1, D, H + 1, W};
        if (v->rank4) {
            put(g, "x", H5T_IEEE_F32LE, 4, dr, xv);
        } else if (v->bad_extent) {
            double *big = calloc((size_t)(n * D * (H + 1) * W), sizeof(double));
            put(g, "x", H5T_IEEE_F32LE, 5, de, big);
            free(big);
        } else {
            put(g, "x", v->int_x ? H5T_STD_I32LE : H5T_IEEE_F32LE, 5, dx, xv);
        }
        if (!v->no_y) {
            hsize_t dy[5] = {(hsize_t)(v->short_y ? n - 1 : n), 1, D, H, W};
            put(g, "y", H5T_IEEE_F64LE, 5, dy, yv);
        }
        free(xv);
        free(yv);
        H5Gclose(g);
    }
    H5Fclose(f);
}

static void path_of(const char *file, char *out, size_t n)
{
    snprintf(out, n, "%s/%s", dir, file);
}

// The bytes this rank reads for `rows` batch rows of which the first `count` are samples:
// its boxes' rows among them, times the slab of each row (x float32, y float64).
static uint64_t box_bytes(ddl_session_t *s, int64_t count)
{
    ddl_box bx, by;
    void   *px, *py;
    ddl_model_local_input(ddl_session_model(s), &bx, &px);
    ddl_model_local_targets(ddl_session_model(s), &by, &py);
    uint64_t total = 0;
    for (int w = 0; w < 2; w++) {
        const ddl_box *b    = w == 0 ? &bx : &by;
        int64_t        slab = 1, r0 = b->start[0], r1 = b->stop[0] < count ? b->stop[0] : count;
        for (int d = 1; d < b->ndim; d++) {
            slab *= b->stop[d] - b->start[d];
        }
        total += r1 > r0 ? (uint64_t)((r1 - r0) * slab) * (w == 0 ? 4u : 8u) : 0;
    }
    return total;
}

static double rel(double a, double b)
{
    return fabs(a - b) / fmax(fabs(b), 1e-300);
}

// The repartition traffic (forward) since `before`, and every other kind's.
static void traffic_since(const ddl_traffic *before, ddl_traffic_count *rep, uint64_t *other)
{
    ddl_traffic now, d;
    ddl_traffic_snapshot(&now);
    ddl_traffic_sub(&now, before, &d);
    *rep   = d.c[DDL_TRAFFIC_REPARTITION][DDL_TRAFFIC_FORWARD];
    *other = 0;
    for (int k = 0; k < DDL_TRAFFIC_NKINDS; k++) {
        for (int p = 0; p < DDL_TRAFFIC_NPASSES; p++) {
            if (k != DDL_TRAFFIC_REPARTITION || p != DDL_TRAFFIC_FORWARD) {
                *other += d.c[k][p].sent + d.c[k][p].received;
            }
        }
    }
}

static bool record(const ddl_progress *p, void *ud)
{
    ((double *)ud)[p->step - 1] = p->loss;
    return false;
}

// Training from the file against rank 0's inline batches in the session's order.
static void same_as_inline(const char *text)
{
    ddl_session_t *s = NULL, *r = NULL;
    ASSERT_OK(ddl_session_create(MPI_COMM_WORLD, text, "h5.json", NULL, &s));
    ASSERT_OK(ddl_session_create(MPI_COMM_WORLD, text, "h5.json", NULL, &r));
    char good[512];
    path_of("good.h5", good, sizeof good);
    ASSERT_OK(ddl_session_open_data(s, ddl_test_rank == 0 ? good : NULL));
    ASSERT_EQ(ddl_session_steps_per_epoch(s), NTR / B);
    ASSERT_EQ(ddl_session_data_bytes_read(s), 0);
    // The file's training.
    double            losses[STEPS];
    ddl_train_request req = {.steps = STEPS};
    ddl_train_result  tr;
    ASSERT_OK(ddl_session_train(s, &req, ddl_test_rank == 0 ? record : NULL, losses, &tr));
    ASSERT_EQ(tr.steps_done, STEPS);
    uint64_t after_train = ddl_session_data_bytes_read(s);
    ASSERT_EQ(after_train, STEPS * box_bytes(s, B));
    ddl_eval_result ev;
    ASSERT_OK(ddl_session_evaluate(s, DDL_SPLIT_TEST, &ev));
    ASSERT_EQ(ev.count, NTE);
    // The test split: one batch of B and one of NTE - B with padding rows.
    uint64_t want = after_train + box_bytes(s, B) + box_bytes(s, NTE - B);
    ASSERT_EQ(ddl_session_data_bytes_read(s), want);
    uint64_t mine = ddl_session_data_bytes_read(s), all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    ASSERT_EQ(all, (uint64_t)(STEPS * B + NTE) * V * (4 + 8)); // every sample once in all
    // The same samples inline, in the order the session shuffled them (epoch 0).
    double  *x = malloc(sizeof(double) * B * V), *t = malloc(sizeof(double) * B * V);
    int64_t *perm = malloc(sizeof(int64_t) * NTR);
    ddl_dataset_shuffle(NTR, 5, 0, perm);
    double worst = 0;
    for (int st = 0; st < STEPS; st++) {
        for (int b = 0; b < B; b++) {
            for (int64_t k = 0; k < V; k++) {
                x[b * V + k] = (double)(float)xval(perm[st * B + b], k); // stored float32
                t[b * V + k] = yval(perm[st * B + b], k);
            }
        }
        ddl_step_result sr;
        ASSERT_OK(ddl_session_step(r, x, ddl_test_rank == 0 ? sizeof(double) * B * V : 0, t,
                                   ddl_test_rank == 0 ? sizeof(double) * B * V : 0, B, &sr));
        if (ddl_test_rank == 0) {
            worst = fmax(worst, rel(sr.loss, losses[st]));
        }
    }
    double *xe = malloc(sizeof(double) * NTE * V), *te = malloc(sizeof(double) * NTE * V);
    for (int i = 0; i < NTE; i++) {
        for (int64_t k = 0; k < V; k++) {
            xe[i * V + k] = (double)(float)xval(NTR + i, k);
            te[i * V + k] = yval(NTR + i, k);
        }
    }
    ddl_eval_result er;
    size_t          eb = ddl_test_rank == 0 ? sizeof(double) * NTE * V : 0;
    ASSERT_OK(ddl_session_evaluate_batch(r, xe, eb, te, eb, NTE, &er));
    if (ddl_test_rank == 0) {
        worst = fmax(worst, rel(ev.loss, er.loss));
        worst = fmax(worst, rel(ev.mse, er.mse));
        worst = fmax(worst, rel(ev.rel_l2, er.rel_l2));
        printf("np %d: %d steps from the file vs inline: max rel diff %.2e (loss %.5f -> %.5f, "
               "test rel L2 %.4f); rank 0 read %llu bytes = its box\n",
               size, STEPS, worst, losses[0], losses[STEPS - 1], ev.rel_l2,
               (unsigned long long)mine);
        ASSERT_TRUE(worst <= 1e-12);
    }
    // Traffic of one step each way: the file's moves the scatter less, nothing else.
    ddl_traffic       t0;
    ddl_traffic_count rep_file, rep_inline;
    uint64_t          other_file, other_inline;
    req.steps = 1;
    ddl_traffic_snapshot(&t0);
    ASSERT_OK(ddl_session_train(s, &req, NULL, NULL, &tr));
    traffic_since(&t0, &rep_file, &other_file);
    ddl_traffic_snapshot(&t0);
    ASSERT_OK(ddl_session_step(r, x, ddl_test_rank == 0 ? sizeof(double) * B * V : 0, t,
                               ddl_test_rank == 0 ? sizeof(double) * B * V : 0, B, NULL));
    traffic_since(&t0, &rep_inline, &other_inline);
    ddl_traffic_count sc = ddl_model_scatter_traffic(ddl_session_model(s));
    ASSERT_EQ(rep_inline.sent - rep_file.sent, sc.sent);
    ASSERT_EQ(rep_inline.received - rep_file.received, sc.received);
    ASSERT_EQ(other_inline, other_file);
    if (size > 1 && ddl_test_rank == 0) {
        ASSERT_TRUE(sc.sent > 0); // the scatter rank 0 no longer sends
        printf("np %d: a step from the file moves %llu bytes less from rank 0 (the scatter)\n",
               size, (unsigned long long)sc.sent);
    }
    free(x);
    free(t);
    free(xe);
    free(te);
    free(perm);
    ddl_session_destroy(&s);
    ddl_session_destroy(&r);
}

// A bad file is refused on every rank with the same status and words, and the good data
// stays open (one more step trains from it).
static void refused(ddl_session_t *s, const char *file, ddl_status want, const char *words)
{
    char path[512];
    path_of(file, path, sizeof path);
    ASSERT_STATUS(ddl_session_open_data(s, ddl_test_rank == 0 ? path : NULL), want);
    const char *msg = ddl_last_error();
    if (strstr(msg, words) == NULL) {
        fprintf(stderr, "rank %d: %s: \"%s\" lacks \"%s\"\n", ddl_test_rank, file, msg, words);
        ASSERT_TRUE(0);
    }
    if (ddl_test_rank == 0) {
        printf("refused %s: %s\n", file, msg);
    }
    ddl_train_request req = {.steps = 1};
    ASSERT_OK(ddl_session_train(s, &req, NULL, NULL, NULL));
}

// Resumable as any data: a checkpoint after 3 steps (mid-epoch), restored into a new
// session that reopens the file, continues with the same losses as the run it came from.
static void resumes(const char *text)
{
    char good[512], ck[512];
    path_of("good.h5", good, sizeof good);
    path_of("ck", ck, sizeof ck);
    double            ref[6], got[6];
    ddl_train_request req = {.steps = 3};
    ddl_session_t    *s = NULL, *r = NULL;
    ASSERT_OK(ddl_session_create(MPI_COMM_WORLD, text, "h5.json", NULL, &s));
    ASSERT_OK(ddl_session_open_data(s, ddl_test_rank == 0 ? good : NULL));
    ASSERT_OK(ddl_session_train(s, &req, ddl_test_rank == 0 ? record : NULL, ref, NULL));
    int64_t step = -1;
    ASSERT_OK(ddl_session_save(s, ddl_test_rank == 0 ? ck : NULL, &step));
    ASSERT_EQ(step, 3);
    ASSERT_OK(ddl_session_train(s, &req, ddl_test_rank == 0 ? record : NULL, ref, NULL));
    ddl_session_destroy(&s);
    ASSERT_OK(ddl_session_create(MPI_COMM_WORLD, text, "h5.json", NULL, &r));
    ASSERT_OK(ddl_session_open_data(r, ddl_test_rank == 0 ? good : NULL));
    ASSERT_OK(ddl_session_restore(r, ddl_test_rank == 0 ? ck : NULL, -1));
    ddl_cursor c = ddl_session_cursor(r);
    ASSERT_TRUE(c.epoch == 0 && c.batch == 3);
    ASSERT_OK(ddl_session_train(r, &req, ddl_test_rank == 0 ? record : NULL, got, NULL));
    if (ddl_test_rank == 0) {
        for (int i = 3; i < 6; i++) {
            ASSERT_TRUE(got[i] == ref[i]); // the same path on the same machine: bitwise
        }
        printf("np %d: resumed at step 3 (epoch 0, batch 3): steps 4-6 bitwise as before\n",
               size);
    }
    ddl_session_destroy(&r);
}

static void bad_files(const char *text, const char *split)
{
    ddl_session_t *s = NULL;
    ASSERT_OK(ddl_session_create(MPI_COMM_WORLD, text, "h5.json", NULL, &s));
    char good[512];
    path_of("good.h5", good, sizeof good);
    ASSERT_OK(ddl_session_open_data(s, ddl_test_rank == 0 ? good : NULL));
    refused(s, "missing.h5", DDL_ENOTFOUND, "no such file");
    refused(s, "text.h5", DDL_EPROTO, "not an HDF5 file");
    refused(s, "truncated.h5", DDL_ECORRUPT, "a damaged HDF5 file");
    refused(s, "no_y.h5", DDL_EPROTO, "no dataset \"train/y\"");
    refused(s, "int_x.h5", DDL_EPROTO, "expected float32 or float64 values, got integers");
    refused(s, "rank4.h5", DDL_EPROTO,
            "expected shape [12, 1, 8, 6, 4] (N, then the model's input), got [12, 8, 6, 4]");
    refused(s, "extent.h5", DDL_EPROTO, "got [12, 1, 8, 7, 4]");
    refused(s, "short_y.h5", DDL_EPROTO, "\"train/x\" holds 12 samples but \"train/y\" holds 11");
    refused(s, "no_test.h5", DDL_EPROTO, "a group \"train\" but no group \"test\"");
    // An allocation that fails on the last rank only, at the open.
    if (ddl_test_rank == size - 1) {
        ddl_alloc_fail_after(1, 0);
    }
    ASSERT_STATUS(ddl_session_open_data(s, ddl_test_rank == 0 ? good : NULL), DDL_ENOMEM);
    ddl_alloc_fail_after(0, 0);
    // A NaN under the last rank's box: the file opens (values are checked as they are
    // read), and the Train stops on every rank before its first step.
    char nanp[512];
    path_of("nan.h5", nanp, sizeof nanp);
    ASSERT_OK(ddl_session_open_data(s, ddl_test_rank == 0 ? nanp : NULL));
    int64_t           step = ddl_model_step(ddl_session_model(s));
    ddl_train_request req  = {.steps = 2 * NTR / B}; // a whole epoch at least
    ASSERT_STATUS(ddl_session_train(s, &req, NULL, NULL, NULL), DDL_EINVAL);
    ASSERT_TRUE(strstr(ddl_last_error(), "holds NaN") != NULL);
    int64_t after = ddl_model_step(ddl_session_model(s));
    // Every rank stops at the same step (the batch holding sample 2, or none before it).
    int64_t lo = after, hi = after;
    MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
    ASSERT_TRUE(lo == hi && after < step + 2 * NTR / B);
    if (ddl_test_rank == 0) {
        printf("%s: a NaN under rank %d's box stopped every rank at step %lld: %s\n", split,
               size - 1, (long long)after, ddl_last_error());
    }
    ASSERT_OK(ddl_session_open_data(s, ddl_test_rank == 0 ? good : NULL));
    req = (ddl_train_request){.steps = 2};
    ASSERT_OK(ddl_session_train(s, &req, NULL, NULL, NULL));
    ddl_session_destroy(&s);
}

static void write_files(void)
{
    const variant vs[] = {
        {"good.h5", .nan = false},         {"no_y.h5", .no_y = true},
        {"int_x.h5", .int_x = true},       {"rank4.h5", .rank4 = true},
        {"extent.h5", .bad_extent = true}, {"short_y.h5", .short_y = true},
        {"no_test.h5", .no_test = true},   {"nan.h5", .nan = true},
    };
    for (size_t i = 0; i < sizeof vs / sizeof vs[0]; i++) {
        write_file(&vs[i]);
    }
    char p[512], q[512];
    path_of("text.h5", p, sizeof p);
    FILE *f = fopen(p, "w");
    fputs("x,y\n1,2\n", f);
    fclose(f);
    // The first half of the good file.
    path_of("good.h5", p, sizeof p);
    path_of("truncated.h5", q, sizeof q);
    FILE *in = fopen(p, "rb"), *out = fopen(q, "wb");
    fseek(in, 0, SEEK_END);
    long n = ftell(in);
    fseek(in, 0, SEEK_SET);
    char *buf = malloc((size_t)n);
    ASSERT_TRUE(fread(buf, 1, (size_t)n, in) == (size_t)n);
    fwrite(buf, 1, (size_t)n / 2, out);
    free(buf);
    fclose(in);
    fclose(out);
}

int main(int argc, char **argv)
{
    ddl_test_mpi_init(&argc, &argv);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (ddl_test_rank == 0) {
        const char *tmp = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/ddl-h5-XXXXXX", tmp != NULL && tmp[0] ? tmp : "/tmp");
        ASSERT_TRUE(mkdtemp(dir) != NULL);
        write_files();
    }
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    const char *split = size == 1   ? "[1, 1, 1, 1, 1]"
                        : size == 2 ? "[1, 1, 2, 1, 1]"
                                    : "[1, 1, 2, 2, 1]";
    char       *text  = spec_text(size, split, "mse");
    same_as_inline(text);
    resumes(text);
    bad_files(text, split);
    free(text);
    MPI_Barrier(MPI_COMM_WORLD);
    if (ddl_test_rank == 0) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        ASSERT_TRUE(system(cmd) == 0);
        printf("test_h5: ok\n");
    }
    return ddl_test_mpi_finalize();
}
