// tests/engine/test_session.c: the training session (ddl/session.h) on real
// Fashion-MNIST with the shipped LeNet-5 spec for this world size (1, 2 or 4 ranks):
//   - a call before any data, a spec for another world size and bad inline sizes fail
//     on every rank with the same status (and change nothing);
//   - training lowers the loss; the progress callback can cancel, and the decision
//     reaches every rank; training allocates nothing per step;
//   - evaluation of the test split improves after training;
//   - predict handles count < batch (the samples end at a guard page, so a read past
//     them crashes) and count > batch, consistently with evaluate_batch;
//   - predict_samples gives a split's first samples, their targets and the outputs of
//     ddl_session_predict for them: the IDX file's for LeNet-5, the generator's for a
//     segmentation and a dense model on generated volumes (bit for bit); short buffers
//     are refused on every rank;
//   - save -> train -> restore gives back the weights, the cursor, and then the very
//     same losses; restored cursors are validated (strings, INT64_MIN, out of range,
//     a different seed) and a refused restore changes nothing;
//   - the data of both splits is checked against the model (tiny IDX files);
//   - an allocation failure on ONE rank (fault injection) inside a save and at many
//     points of session creation fails every rank alike, without hanging or leaking.
// Usage: test_session SPEC_DIR
#define _GNU_SOURCE // mkdtemp, MAP_ANONYMOUS

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ddl/base.h"
#include "ddl/data.h"
#include "ddl/session.h"
#include "ddl/synth.h"
#include "mpi_test.h"

#define FASHION_DIR "/usr/share/datasets/fashion-mnist"

static int rank, size;

// ---- helpers -------------------------------------------------------------------

// Rank 0 reads a whole file (NULL elsewhere).
static char *read_text(const char *path)
{
    if (rank != 0) {
        return NULL;
    }
    FILE *f = fopen(path, "rb");
    ASSERT_TRUE(f != NULL);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *t = malloc((size_t)n + 1);
    ASSERT_TRUE(fread(t, 1, (size_t)n, f) == (size_t)n);
    t[n] = '\0';
    fclose(f);
    return t;
}

// Every rank must hold the same value.
static void assert_same(long long v)
{
    long long lo = v, hi = v;
    MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
    ASSERT_EQ(lo, hi);
}

// Rank 0's temporary directory, known to every rank.
static void make_tmpdir(char *dir, size_t len)
{
    if (rank == 0) {
        snprintf(dir, len, "/tmp/ddl_session_XXXXXX");
        ASSERT_TRUE(mkdtemp(dir) != NULL);
    }
    MPI_Bcast(dir, (int)len, MPI_CHAR, 0, MPI_COMM_WORLD);
}

// Big-endian IDX file of unsigned bytes: dims[0..ndim), then data.
static void write_idx(const char *path, int ndim, const uint32_t *dims, const uint8_t *data)
{
    FILE *f = fopen(path, "wb");
    ASSERT_TRUE(f != NULL);
    unsigned char h[4] = {0, 0, 0x08, (unsigned char)ndim};
    fwrite(h, 1, 4, f);
    size_t n = 1;
    for (int i = 0; i < ndim; i++) {
        unsigned char be[4] = {(unsigned char)(dims[i] >> 24), (unsigned char)(dims[i] >> 16),
                               (unsigned char)(dims[i] >> 8), (unsigned char)dims[i]};
        fwrite(be, 1, 4, f);
        n *= dims[i];
    }
    ASSERT_TRUE(fwrite(data, 1, n, f) == n);
    fclose(f);
}

// Writes one split <dir>/<prefix>-{images-idx3,labels-idx1}-ubyte: n images of h x w,
// labels i % classes + label_shift.
static void write_split(const char *dir, const char *prefix, uint32_t n, uint32_t h, uint32_t w,
                        int classes, int label_shift)
{
    char     path[512];
    uint8_t *px  = calloc((size_t)n * h * w, 1);
    uint8_t *lab = calloc(n, 1);
    for (size_t i = 0; i < (size_t)n * h * w; i++) {
        px[i] = (uint8_t)(i * 7);
    }
    for (uint32_t i = 0; i < n; i++) {
        lab[i] = (uint8_t)((int)i % classes + label_shift);
    }
    snprintf(path, sizeof path, "%s/%s-images-idx3-ubyte", dir, prefix);
    write_idx(path, 3, (uint32_t[]){n, h, w}, px);
    snprintf(path, sizeof path, "%s/%s-labels-idx1-ubyte", dir, prefix);
    write_idx(path, 1, (uint32_t[]){n}, lab);
    free(px);
    free(lab);
}

// ---- progress callbacks ------------------------------------------------------------

typedef struct record {
    double  loss[64];
    int64_t n, stop_after, last_step, last_done;
    bool    bad; // a field out of order
} record;

static bool on_progress(const ddl_progress *p, void *ud)
{
    record *r = ud;
    if (r->n < 64) {
        r->loss[r->n] = p->loss;
    }
    r->n++;
    if (p->done != r->last_done + 1 || (r->last_step > 0 && p->step != r->last_step + 1) ||
        p->batch < 1 || p->batch > p->steps_per_epoch || !(p->loss > 0)) {
        r->bad = true;
    }
    r->last_done = p->done;
    r->last_step = p->step;
    return r->stop_after > 0 && p->done >= r->stop_after;
}

// ---- the parts ---------------------------------------------------------------------

// A spec for another world size is refused on every rank; so is a missing spec.
static void test_bad_create(const char *spec_dir)
{
    char path[512];
    snprintf(path, sizeof path, "%s/lenet5-%d.json", spec_dir, size == 1 ? 2 : 1);
    char          *other = read_text(path);
    ddl_session_t *s     = NULL;
    ASSERT_STATUS(ddl_session_create(MPI_COMM_WORLD, other, "other.json", NULL, &s), DDL_EINVAL);
    ASSERT_TRUE(s == NULL);
    ASSERT_TRUE(strstr(ddl_last_error(), "world_size") != NULL ||
                strstr(ddl_last_error(), "ranks") != NULL);
    ASSERT_STATUS(ddl_session_create(MPI_COMM_WORLD, NULL, "none", NULL, &s), DDL_EINVAL);
    free(other);
    // Two layers with one name: refused when the spec is read, not at the first
    // checkpoint or export.
    snprintf(path, sizeof path, "%s/lenet5-%d.json", spec_dir, size);
    char *dup = read_text(path);
    if (rank == 0) {
        char *at = strstr(dup, "\"name\": \"conv2\"");
        ASSERT_TRUE(at != NULL);
        memcpy(at, "\"name\": \"conv1\"", 15);
    }
    ASSERT_STATUS(ddl_session_create(MPI_COMM_WORLD, dup, "dup.json", NULL, &s), DDL_EINVAL);
    ASSERT_TRUE(strstr(ddl_last_error(), "names must be unique") != NULL);
    free(dup);
    // The example, conv2 with 2^30 output channels, used to fail an allocation on
    // the ranks holding the weight and hang the others. Its weight is now refused by the
    // per-tensor cap before anything is allocated, alike on every rank, and nothing
    // leaks. (Allocation failures on one rank during the build are swept in
    // test_one_rank_failure below.)
    char *huge = read_text(path);
    char *big  = NULL;
    if (rank == 0) {
        const char *at = strstr(huge, "\"out_channels\": 16");
        ASSERT_TRUE(at != NULL);
        big = malloc(strlen(huge) + 32);
        snprintf(big, strlen(huge) + 32, "%.*s\"out_channels\": 1073741824%s", (int)(at - huge),
                 huge, at + strlen("\"out_channels\": 16"));
    }
    int64_t    live = ddl_alloc_bytes_live();
    ddl_status st   = ddl_session_create(MPI_COMM_WORLD, big, "huge.json", NULL, &s);
    assert_same(st);
    ASSERT_STATUS(st, DDL_EINVAL);
    ASSERT_TRUE(strstr(ddl_last_error(), "DDL_MAX_TENSOR_ELEMENTS") != NULL);
    ASSERT_EQ(ddl_alloc_bytes_live(), live);
    free(huge);
    free(big);
}

// Rank 0's copy of the first n normalized test samples and their labels.
static void test_samples(const ddl_session_t *s, int64_t n, float *x, int64_t *lab)
{
    if (rank != 0) {
        return;
    }
    ddl_dataset ds = {0};
    ASSERT_OK(ddl_dataset_load_mnist_dir(FASHION_DIR, 0, &ds));
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        idx[i] = i;
    }
    double mean, std;
    ddl_spec_normalize(ddl_model_spec(ddl_session_model(s)), &mean, &std);
    ddl_dataset_batch_f32(&ds, idx, n, mean, std, x, lab);
    free(idx);
    ddl_dataset_free(&ds);
}

// A buffer of `bytes` that ends exactly at an inaccessible page: reading past it faults.
static void *guarded(size_t bytes, void **base, size_t *maplen)
{
    long   page = sysconf(_SC_PAGESIZE);
    size_t body = (bytes + (size_t)page - 1) / (size_t)page * (size_t)page;
    *maplen     = body + (size_t)page;
    *base       = mmap(NULL, *maplen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_TRUE(*base != MAP_FAILED);
    ASSERT_TRUE(mprotect((char *)*base + body, (size_t)page, PROT_NONE) == 0);
    return (char *)*base + body - bytes;
}

static void test_predict_and_eval(ddl_session_t *s)
{
    const int64_t B = ddl_spec_batch_size(ddl_model_spec(ddl_session_model(s)));
    const int64_t C = 10, N = B + 7, S = 784;
    float        *x = NULL, *lg = NULL, *lg5 = NULL;
    int64_t      *lab = NULL;
    if (rank == 0) {
        x   = malloc(sizeof(float) * (size_t)(N * S));
        lab = malloc(sizeof(int64_t) * (size_t)N);
        lg  = malloc(sizeof(float) * (size_t)(N * C));
        lg5 = malloc(sizeof(float) * (size_t)(5 * C));
    }
    test_samples(s, N, x, lab);
    // count > batch: two model batches.
    ASSERT_OK(ddl_session_predict(s, x, sizeof(float) * (size_t)(N * S), N, lg,
                                  sizeof(float) * (size_t)(N * C)));
    // count < batch, from a buffer that ends at a guard page.
    void  *base   = NULL;
    size_t maplen = 0;
    float *gx     = NULL;
    if (rank == 0) {
        gx = guarded(sizeof(float) * (size_t)(5 * S), &base, &maplen);
        memcpy(gx, x, sizeof(float) * (size_t)(5 * S));
    }
    ASSERT_OK(ddl_session_predict(s, gx, sizeof(float) * (size_t)(5 * S), 5, lg5,
                                  sizeof(float) * (size_t)(5 * C)));
    // The first 8 samples of the test split with their outputs (the dashboard's
    // predictions): the same samples and labels as the file's, and the logits of
    // ddl_session_predict of them (the same batch-8 path: bitwise).
    {
        enum { K = 8 };
        static float px[K * 784], plg[K * 10], qlg[K * 10];
        int64_t      plab[K], pn = -1;
        ASSERT_OK(ddl_session_predict_samples(s, DDL_SPLIT_TEST, K, rank == 0 ? px : NULL,
                                              rank == 0 ? sizeof px : 0, rank == 0 ? plab : NULL,
                                              rank == 0 ? sizeof plab : 0, rank == 0 ? plg : NULL,
                                              rank == 0 ? sizeof plg : 0, &pn));
        ASSERT_EQ(pn, K);
        ASSERT_OK(ddl_session_predict(s, rank == 0 ? x : NULL, rank == 0 ? sizeof px : 0, K,
                                      rank == 0 ? qlg : NULL, rank == 0 ? sizeof qlg : 0));
        if (rank == 0) {
            ASSERT_TRUE(memcmp(px, x, sizeof px) == 0);
            ASSERT_TRUE(memcmp(plab, lab, sizeof plab) == 0);
            ASSERT_TRUE(memcmp(plg, qlg, sizeof plg) == 0);
        }
        // rank 0's buffer one sample short: refused on every rank
        ASSERT_STATUS(
            ddl_session_predict_samples(s, DDL_SPLIT_TEST, K, rank == 0 ? px : NULL,
                                        rank == 0 ? sizeof px - 784 * sizeof(float) : 0,
                                        rank == 0 ? plab : NULL, rank == 0 ? sizeof plab : 0,
                                        rank == 0 ? plg : NULL, rank == 0 ? sizeof plg : 0, &pn),
            DDL_EINVAL);
        // and its labels one short
        ASSERT_STATUS(ddl_session_predict_samples(
                          s, DDL_SPLIT_TEST, K, rank == 0 ? px : NULL, rank == 0 ? sizeof px : 0,
                          rank == 0 ? plab : NULL, rank == 0 ? sizeof plab - sizeof(int64_t) : 0,
                          rank == 0 ? plg : NULL, rank == 0 ? sizeof plg : 0, &pn),
                      DDL_EINVAL);
    }
    ddl_eval_result ev;
    ASSERT_OK(ddl_session_evaluate_batch(s, x, sizeof(float) * (size_t)(N * S), lab,
                                         sizeof(int64_t) * (size_t)N, N, &ev));
    ASSERT_EQ(ev.count, N);
    if (rank == 0) {
        // The rows of a short batch are those of the full one up to rounding: it runs on
        // the model's batch-8 copy (inference_batches), whose GEMMs may block them
        // differently (OpenBLAS gives rows other bits in calls of other shapes).
        double big = 0, diff = 0;
        for (int64_t i = 0; i < 5 * C; i++) {
            big  = fmax(big, fabs((double)lg[i]));
            diff = fmax(diff, fabs((double)lg[i] - (double)lg5[i]));
        }
        ASSERT_TRUE(diff <= 1e-5 * (1.0 + big));
        double  ref  = 0;
        int64_t hits = 0;
        for (int64_t b = 0; b < N; b++) {
            const float *r  = lg + b * C;
            int64_t      am = 0;
            double       mx = r[0], se = 0;
            for (int64_t c = 1; c < C; c++) {
                if (r[c] > mx) {
                    mx = r[c];
                    am = c;
                }
            }
            for (int64_t c = 0; c < C; c++) {
                se += exp((double)r[c] - mx);
            }
            ref += mx + log(se) - (double)r[lab[b]];
            hits += am == lab[b];
        }
        ASSERT_NEAR(ev.loss, ref / (double)N, 1e-4 * fabs(ref / (double)N));
        ASSERT_NEAR(ev.accuracy, (double)hits / (double)N, 1e-12);
        munmap(base, maplen);
    }
    // Bad inline sizes are refused on every rank (other ranks pass nothing) and nothing
    // moves: one byte short, too small an output, a count of zero, a label out of range.
    int64_t      step = ddl_model_step(ddl_session_model(s));
    size_t       xb = sizeof(float) * (size_t)(N * S), lb = sizeof(float) * (size_t)(N * C);
    const float *rx = rank == 0 ? x : NULL;
    float       *rl = rank == 0 ? lg : NULL;
    ASSERT_STATUS(ddl_session_predict(s, rx, rank == 0 ? xb - 1 : 0, N, rl, lb), DDL_EINVAL);
    ASSERT_STATUS(ddl_session_predict(s, rx, rank == 0 ? xb : 0, N, rl, rank == 0 ? lb - 4 : 0),
                  DDL_EINVAL);
    ASSERT_STATUS(ddl_session_predict(s, rx, 0, rank == 0 ? 0 : 3, rl, 0), DDL_EINVAL);
    ASSERT_STATUS(
        ddl_session_step(s, rx, rank == 0 ? xb : 0, lab, rank == 0 ? 8 * (size_t)N : 0, N, NULL),
        DDL_EINVAL);
    ASSERT_TRUE(strstr(ddl_last_error(), "batch") != NULL);
    if (rank == 0) {
        lab[7] = C;
    }
    ASSERT_STATUS(ddl_session_evaluate_batch(s, rx, rank == 0 ? xb : 0, lab,
                                             rank == 0 ? 8 * (size_t)N : 0, N, &ev),
                  DDL_EINVAL);
    ASSERT_STATUS(ddl_session_step(s, rx, rank == 0 ? sizeof(float) * (size_t)(B * S) : 0, lab,
                                   rank == 0 ? 8 * (size_t)B : 0, B, NULL),
                  DDL_EINVAL);
    ASSERT_TRUE(strstr(ddl_last_error(), "label") != NULL);
    ASSERT_EQ(ddl_model_step(ddl_session_model(s)), step);
    // A good inline step moves the step counter on every rank.
    if (rank == 0) {
        lab[7] = 1;
    }
    ddl_step_result sr;
    ASSERT_OK(ddl_session_step(s, rx, rank == 0 ? sizeof(float) * (size_t)(B * S) : 0, lab,
                               rank == 0 ? 8 * (size_t)B : 0, B, &sr));
    ASSERT_EQ(sr.step, step + 1);
    assert_same((long long)(sr.loss * 1e6));
    free(x);
    free(lab);
    free(lg);
    free(lg5);
}

// predict_samples of a model whose output is a field, on generated volumes 8 x 6 x 5 split
// over the ranks: a segmentation (f32, 3 classes, one label per voxel) and a dense
// denoiser (f64, the clean volume as target). The samples and targets returned are the
// generator's own (ddl_synth_batch_targets with the spec's parameters) bit for bit, the
// outputs ddl_session_predict's of those samples bit for bit; a targets buffer one value
// short is refused on every rank.
static void test_predict_samples_field(bool dense)
{
    enum { B = 3, V = 8 * 6 * 5, K = 8 };
    static const char *const splits[] = {"", "[1, 1, 1, 1, 1]", "[1, 1, 2, 1, 1]", "",
                                         "[1, 1, 2, 2, 1]"};
    const int                vol[3]   = {8, 6, 5};
    const int                C        = dense ? 1 : 3;
    ddl_dtype                dt       = dense ? DDL_F64 : DDL_F32;
    size_t                   es       = ddl_dtype_size(dt);
    char                     layers[512];
    const char              *rest =
        dense ? " \"loss\": {\"type\": \"mse\"},\n"
                             " \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.01},\n"
                             " \"data\": {\"synthetic\": {\"kind\": \"shapes3d\", \"train\": 6, \"test\": 5, "
                             "\"noise\": 0.2}, \"target\": \"clean\"}"
                           : " \"loss\": {\"type\": \"cross_entropy\"},\n"
                             " \"optimizer\": {\"type\": \"adam\", \"lr\": 0.01},\n"
                             " \"data\": {\"synthetic\": {\"kind\": \"shapes3d\", \"train\": 6, \"test\": 5, "
                             "\"noise\": 0.2}}";
    snprintf(layers, sizeof layers,
             "%s,\n  {\"type\": \"conv3d\", \"out_channels\": %d, \"kernel\": [1, 1, 1]}",
             ddl_test_conv3d_pair, C);
    char *text =
        ddl_test_vol_spec(size, splits[size], 7, dense ? "f64" : "f32", B, vol, layers, rest);
    ddl_session_t *s = NULL;
    ASSERT_OK(ddl_session_create(MPI_COMM_WORLD, rank == 0 ? text : NULL, "field.json", NULL, &s));
    ASSERT_OK(ddl_session_open_synthetic(s));
    size_t tb = ddl_session_target_bytes(s, B);
    ASSERT_EQ(tb, dense ? B * V * es : B * V * sizeof(int64_t));
    // rank 0's buffers hold K samples; the session gives the batch size's worth
    static double  x[K * V], t[K * V], out[K * 3 * V], q[B * 3 * V], rx[B * V], rt[B * V];
    static int64_t lab[K * V], rlab[B * V];
    void          *tg = dense ? (void *)t : (void *)lab;
    int64_t        n  = -1;
    ASSERT_OK(ddl_session_predict_samples(
        s, DDL_SPLIT_TEST, K, rank == 0 ? x : NULL, rank == 0 ? sizeof x : 0, rank == 0 ? tg : NULL,
        rank == 0 ? tb : 0, rank == 0 ? out : NULL, rank == 0 ? sizeof out : 0, &n));
    ASSERT_EQ(n, B);
    ASSERT_OK(ddl_session_predict(s, rank == 0 ? x : NULL, rank == 0 ? B * V * es : 0, B,
                                  rank == 0 ? q : NULL, rank == 0 ? sizeof q : 0));
    if (rank == 0) {
        const ddl_spec_t *spec = ddl_model_spec(ddl_session_model(s));
        ddl_synth_params  p;
        double            mean, std;
        ASSERT_TRUE(ddl_spec_synthetic(spec, &p, NULL, NULL));
        ddl_spec_normalize(spec, &mean, &std);
        const int64_t idx[B] = {0, 1, 2};
        ASSERT_OK(ddl_synth_batch_targets(&p, DDL_SPLIT_TEST, idx, B, mean, std, dt, rx, rlab,
                                          false, dense ? rt : NULL));
        ASSERT_TRUE(memcmp(x, rx, B * V * es) == 0);
        ASSERT_TRUE(memcmp(tg, dense ? (void *)rt : (void *)rlab, tb) == 0);
        ASSERT_TRUE(memcmp(out, q, (size_t)(B * C * V) * es) == 0);
        int64_t fg = 0; // the generator's volumes hold objects: a check of the check
        for (int64_t i = 0; i < B * V; i++) {
            fg += rlab[i] != 0;
        }
        ASSERT_TRUE(fg > 0);
    }
    ASSERT_STATUS(ddl_session_predict_samples(s, DDL_SPLIT_TEST, K, rank == 0 ? x : NULL,
                                              rank == 0 ? sizeof x : 0, rank == 0 ? tg : NULL,
                                              rank == 0 ? tb - es : 0, rank == 0 ? out : NULL,
                                              rank == 0 ? sizeof out : 0, &n),
                  DDL_EINVAL);
    if (rank == 0) {
        ASSERT_TRUE(strstr(ddl_last_error(), dense ? "targets" : "labels") != NULL);
    }
    ddl_session_destroy(&s);
    free(text);
}

// Rank 0's logits of the first B test samples (for before/after comparisons).
static void logits_of(ddl_session_t *s, const float *x, float *out)
{
    const int64_t B = ddl_spec_batch_size(ddl_model_spec(ddl_session_model(s)));
    ASSERT_OK(ddl_session_predict(s, x, rank == 0 ? sizeof(float) * (size_t)(B * 784) : 0,
                                  rank == 0 ? B : 0, out,
                                  rank == 0 ? sizeof(float) * (size_t)(B * 10) : 0));
}

// A checkpoint holding the model's state with a hand-written cursor.
static void write_bad_cursor(ddl_session_t *s, const char *root, int k, const char *user)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/bad%d", root, k);
    ASSERT_OK(ddl_model_save(ddl_session_model(s), dir, user));
}

static void test_save_restore(ddl_session_t *s, const char *tmp)
{
    const int64_t B = ddl_spec_batch_size(ddl_model_spec(ddl_session_model(s)));
    float        *x = NULL, *l1 = NULL, *l2 = NULL;
    int64_t      *lab = NULL;
    if (rank == 0) {
        x   = malloc(sizeof(float) * (size_t)(B * 784));
        lab = malloc(sizeof(int64_t) * (size_t)B);
        l1  = malloc(sizeof(float) * (size_t)(B * 10));
        l2  = malloc(sizeof(float) * (size_t)(B * 10));
    }
    test_samples(s, B, x, lab);
    int64_t saved = -1;
    ASSERT_OK(ddl_session_save(s, NULL, &saved));
    ASSERT_EQ(saved, ddl_model_step(ddl_session_model(s)));
    ASSERT_EQ(ddl_session_durable_step(s), saved);
    assert_same(saved);
    ddl_cursor c0 = ddl_session_cursor(s);
    logits_of(s, x, l1);
    record            a = {0}, b = {0};
    ddl_train_request req = {.steps = 5};
    ddl_train_result  res;
    ASSERT_OK(ddl_session_train(s, &req, on_progress, &a, &res));
    ASSERT_EQ(res.steps_done, 5);
    // Back to the checkpoint: weights, step and cursor as saved; then the same 5 losses.
    char root[512];
    snprintf(root, sizeof root, "%s/ck", tmp);
    ASSERT_OK(ddl_session_restore(s, rank == 0 ? root : NULL, -1));
    ASSERT_EQ(ddl_model_step(ddl_session_model(s)), saved);
    ASSERT_EQ(ddl_session_cursor(s).epoch, c0.epoch);
    ASSERT_EQ(ddl_session_cursor(s).batch, c0.batch);
    logits_of(s, x, l2);
    if (rank == 0) {
        ASSERT_TRUE(memcmp(l1, l2, sizeof(float) * (size_t)(B * 10)) == 0);
    }
    ASSERT_OK(ddl_session_train(s, &req, on_progress, &b, &res));
    if (rank == 0) {
        for (int i = 0; i < 5; i++) {
            ASSERT_TRUE(a.loss[i] == b.loss[i]); // bitwise: the same trajectory
        }
    }
    // A step directory by number works too.
    ASSERT_OK(ddl_session_restore(s, rank == 0 ? root : NULL, saved));
    ASSERT_EQ(ddl_model_step(ddl_session_model(s)), saved);
    ASSERT_STATUS(ddl_session_restore(s, rank == 0 ? root : NULL, saved + 12345), DDL_ENOTFOUND);

    // Damaged cursors: refused on every rank, and nothing changes.
    char spe[64];
    snprintf(spe, sizeof spe, "%lld", (long long)ddl_session_steps_per_epoch(s));
    char big[256];
    snprintf(big, sizeof big, "{\"epoch\": 0, \"batch\": %s}", spe);
    const char *bad[] = {"{\"epoch\": \"3\", \"batch\": 0}",
                         "{\"epoch\": -9223372036854775808, \"batch\": 0}",
                         "{\"epoch\": 0, \"batch\": -1}",
                         big,
                         "{\"epoch\": 1.5, \"batch\": 0}",
                         "{\"epoch\": 0}",
                         "{\"epoch\": 0, \"batch\": 0, \"rng\": {\"seed\": 2}}",
                         "{\"epoch\": 0, \"batch\": 0, \"rng\": 7}"};
    int         nbad  = (int)(sizeof bad / sizeof bad[0]);
    for (int k = 0; k < nbad; k++) {
        write_bad_cursor(s, tmp, k, bad[k]);
    }
    // Move away from the checkpoint so that a wrongly accepted restore would show.
    ASSERT_OK(ddl_session_train(s, &req, NULL, NULL, &res));
    int64_t    step = ddl_model_step(ddl_session_model(s));
    ddl_cursor c1   = ddl_session_cursor(s);
    logits_of(s, x, l1);
    for (int k = 0; k < nbad; k++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/bad%d", tmp, k);
        ddl_status st = ddl_session_restore(s, rank == 0 ? dir : NULL, -1);
        if (st == DDL_OK) {
            TEST_FAIL_("restore accepted the cursor %s", bad[k]);
        }
        ASSERT_TRUE(st == DDL_ECORRUPT || st == DDL_EINVAL);
        assert_same(st);
        ASSERT_EQ(ddl_model_step(ddl_session_model(s)), step);
        ASSERT_EQ(ddl_session_cursor(s).epoch, c1.epoch);
        ASSERT_EQ(ddl_session_cursor(s).batch, c1.batch);
    }
    ASSERT_TRUE(strstr(ddl_last_error(), "rng") != NULL);
    logits_of(s, x, l2);
    if (rank == 0) {
        ASSERT_TRUE(memcmp(l1, l2, sizeof(float) * (size_t)(B * 10)) == 0);
    }
    free(x);
    free(lab);
    free(l1);
    free(l2);
}

// The global weights: gather them all onto rank 0, push zeros (every logit is then 0),
// gather the zeros back, push the originals (the logits return bitwise).
static void test_weights(ddl_session_t *s)
{
    const int64_t B  = ddl_spec_batch_size(ddl_model_spec(ddl_session_model(s)));
    int           nw = ddl_session_nweights(s);
    ASSERT_TRUE(nw == 10);
    float   *x = NULL, *l0 = NULL, *l1 = NULL;
    int64_t *lab = NULL;
    float  **w = calloc((size_t)nw, sizeof *w), **z = calloc((size_t)nw, sizeof *z);
    if (rank == 0) {
        x   = malloc(sizeof(float) * (size_t)(B * 784));
        lab = malloc(sizeof(int64_t) * (size_t)B);
        l0  = malloc(sizeof(float) * (size_t)(B * 10));
        l1  = malloc(sizeof(float) * (size_t)(B * 10));
    }
    test_samples(s, B, x, lab);
    logits_of(s, x, l0);
    for (int i = 0; i < nw; i++) {
        int64_t n = ddl_shape_numel(ddl_session_weight_shape(s, i));
        ASSERT_TRUE(n > 0);
        ASSERT_TRUE(ddl_session_weight_dtype(s, i) == DDL_F32);
        ASSERT_TRUE(strchr(ddl_session_weight_name(s, i), '.') != NULL);
        if (rank == 0) {
            w[i] = malloc(sizeof(float) * (size_t)n);
            z[i] = calloc((size_t)n, sizeof(float));
        }
        ASSERT_OK(ddl_session_gather_weight(s, i, w[i]));
    }
    ASSERT_STATUS(ddl_session_gather_weight(s, nw, rank == 0 ? w[0] : NULL), DDL_EINVAL);
    // An allocation failing on the root (rank 0) part way through a gather or a scatter
    // fails every rank alike; the weights stay as they were.
    for (uint64_t n = 1; n <= 4; n++) {
        if (rank == 0) {
            ddl_alloc_fail_after(n, 0);
        }
        ddl_status st = ddl_session_gather_weight(s, 0, w[0]);
        ddl_alloc_fail_after(0, 0);
        assert_same(st);
        ASSERT_TRUE(st == DDL_ENOMEM || st == DDL_OK);
        if (rank == 0) {
            ddl_alloc_fail_after(n, 0);
        }
        st = ddl_session_scatter_weights(s, (const void *const *)z);
        ddl_alloc_fail_after(0, 0);
        assert_same(st);
        ASSERT_STATUS(st, DDL_ENOMEM);
    }
    logits_of(s, x, l1);
    if (rank == 0) {
        ASSERT_TRUE(memcmp(l0, l1, sizeof(float) * (size_t)(B * 10)) == 0);
    }
    ASSERT_STATUS(ddl_session_scatter_weights(s, NULL), DDL_EINVAL);
    ASSERT_OK(ddl_session_scatter_weights(s, (const void *const *)z));
    logits_of(s, x, l1);
    if (rank == 0) {
        for (int64_t i = 0; i < B * 10; i++) {
            ASSERT_TRUE(l1[i] == 0.0f);
        }
        memset(z[3], 0xff, sizeof(float)); // a NaN, overwritten by the gather below
    }
    ASSERT_OK(ddl_session_gather_weight(s, 3, z[3]));
    if (rank == 0) {
        ASSERT_TRUE(z[3][0] == 0.0f);
    }
    ASSERT_OK(ddl_session_scatter_weights(s, (const void *const *)w));
    logits_of(s, x, l1);
    if (rank == 0) {
        ASSERT_TRUE(memcmp(l0, l1, sizeof(float) * (size_t)(B * 10)) == 0);
    }
    for (int i = 0; i < nw; i++) {
        free(w[i]);
        free(z[i]);
    }
    free(w);
    free(z);
    free(x);
    free(lab);
    free(l0);
    free(l1);
}

// Both splits are checked against the model; a refused dataset leaves the old one.
static void test_data_checks(ddl_session_t *s, const char *tmp)
{
    const int64_t B   = ddl_spec_batch_size(ddl_model_spec(ddl_session_model(s)));
    const int64_t spe = ddl_session_steps_per_epoch(s);
    struct {
        uint32_t    test_h, test_w, train_n;
        int         test_shift;
        const char *needle;
    } cases[] = {
        {56, 56, (uint32_t)B, 0, "test samples"}, // the 28 x 28 model would overflow
        {1, 1, (uint32_t)B, 0, "test samples"},   // a meaningless accuracy
        {28, 28, (uint32_t)B, 1, "test labels"},  // label 10 with 10 classes
        {28, 28, (uint32_t)B - 1, 0, "fewer than one batch"},
    };
    for (int k = 0; k < (int)(sizeof cases / sizeof cases[0]); k++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/data%d", tmp, k);
        if (rank == 0) {
            ASSERT_TRUE(mkdir(dir, 0777) == 0);
            write_split(dir, "train", cases[k].train_n, 28, 28, 10, 0);
            write_split(dir, "t10k", 20, cases[k].test_h, cases[k].test_w, 10, cases[k].test_shift);
        }
        ASSERT_STATUS(ddl_session_open_data(s, rank == 0 ? dir : NULL), DDL_EINVAL);
        if (strstr(ddl_last_error(), cases[k].needle) == NULL) {
            TEST_FAIL_("case %d: message \"%s\" lacks \"%s\"", k, ddl_last_error(),
                       cases[k].needle);
        }
        ASSERT_TRUE(ddl_session_has_data(s));
        ASSERT_EQ(ddl_session_steps_per_epoch(s), spe);
    }
    // A good tiny dataset replaces the old one.
    char dir[512];
    snprintf(dir, sizeof dir, "%s/good", tmp);
    if (rank == 0) {
        ASSERT_TRUE(mkdir(dir, 0777) == 0);
        write_split(dir, "train", (uint32_t)(2 * B + 3), 28, 28, 10, 0);
        write_split(dir, "t10k", 20, 28, 28, 10, 0);
    }
    ASSERT_OK(ddl_session_open_data(s, rank == 0 ? dir : NULL));
    ASSERT_EQ(ddl_session_steps_per_epoch(s), 2);
    // The cursor (batch 45 of the real data) does not fit 2 batches per epoch: training
    // refuses it until the cursor is moved.
    ddl_train_request req = {.epochs = 1};
    ddl_train_result  res;
    ASSERT_STATUS(ddl_session_train(s, &req, NULL, NULL, &res), DDL_EINVAL);
    ASSERT_TRUE(strstr(ddl_last_error(), "cursor") != NULL);
    ASSERT_STATUS(ddl_session_set_cursor(s, (ddl_cursor){0, 2}), DDL_EINVAL);
    ASSERT_STATUS(ddl_session_set_cursor(s, (ddl_cursor){-1, 0}), DDL_EINVAL);
    ASSERT_OK(ddl_session_set_cursor(s, (ddl_cursor){0, 1}));
    // {epochs = 1} from the middle of an epoch finishes it; {epochs = 2} then runs two.
    ASSERT_OK(ddl_session_train(s, &req, NULL, NULL, &res));
    ASSERT_EQ(res.steps_done, 1);
    ASSERT_EQ(ddl_session_cursor(s).epoch, 1);
    ASSERT_EQ(ddl_session_cursor(s).batch, 0);
    req = (ddl_train_request){.epochs = 2};
    ASSERT_OK(ddl_session_train(s, &req, NULL, NULL, &res));
    ASSERT_EQ(res.steps_done, 4);
    ASSERT_EQ(ddl_session_cursor(s).epoch, 3);
    ASSERT_EQ(ddl_session_cursor(s).batch, 0);
    req = (ddl_train_request){.epochs = INT64_MAX};
    ASSERT_STATUS(ddl_session_train(s, &req, NULL, NULL, &res), DDL_EINVAL);
    ddl_eval_result ev;
    ASSERT_OK(ddl_session_evaluate(s, DDL_SPLIT_TEST, &ev));
    ASSERT_EQ(ev.count, 20);
}

// Periodic checkpoints inside train: checkpoint_every 3 over 7 steps makes steps 3 and 6
// durable (the progress says so at those steps), and the newest one restores.
typedef struct durables {
    int64_t steps[8];
    int     n;
} durables;

static bool note_durable(const ddl_progress *p, void *ud)
{
    durables *d = ud;
    if (p->durable && d->n < 8) {
        d->steps[d->n++] = p->step;
    }
    return false;
}

static void test_periodic_checkpoints(const char *spec_text, const char *tmp)
{
    char ck[512], data[512];
    snprintf(ck, sizeof ck, "%s/every3", tmp);
    snprintf(data, sizeof data, "%s/good", tmp); // written by test_data_checks
    ddl_session_options opts = {.checkpoint_dir = ck, .checkpoint_every = 3};
    ddl_session_t      *t    = NULL;
    ASSERT_OK(ddl_session_create(MPI_COMM_WORLD, spec_text, "spec.json", rank == 0 ? &opts : NULL,
                                 &t));
    ASSERT_OK(ddl_session_open_data(t, rank == 0 ? data : NULL));
    durables          d   = {.n = 0};
    ddl_train_request req = {.steps = 7};
    ddl_train_result  res;
    ASSERT_OK(ddl_session_train(t, &req, note_durable, &d, &res));
    ASSERT_EQ(res.steps_done, 7);
    ASSERT_EQ(res.durable_step, 6);
    ASSERT_EQ(ddl_session_durable_step(t), 6);
    if (rank == 0) {
        ASSERT_EQ(d.n, 2);
        ASSERT_EQ(d.steps[0], 3);
        ASSERT_EQ(d.steps[1], 6);
    }
    ASSERT_OK(ddl_session_restore(t, rank == 0 ? ck : NULL, -1));
    ASSERT_EQ(ddl_model_step(ddl_session_model(t)), 6);
    ASSERT_EQ(ddl_session_cursor(t).epoch, 3); // 2 batches per epoch: step 6 ends epoch 3
    ASSERT_EQ(ddl_session_cursor(t).batch, 0);
    ddl_session_destroy(&t);
}

// An allocation failure on the last rank only, at allocations of session creation: those
// of at least min_bytes, from the first-th to the last-th (test_one_rank_failure: all of
// them, or those of at least 4 KiB and then every stride-th of any size).
// Every rank must return the same error, nothing may hang, and a failed creation must
// free everything it made. `stride` > 1 fails every stride-th allocation only.
static void sweep_create(const char *spec_text, long long first, long long last, size_t min_bytes,
                         long long stride)
{
    const int victim = size - 1;
    for (long long n = first; n <= last; n += stride) {
        int64_t        live = ddl_alloc_bytes_live();
        ddl_session_t *t    = NULL;
        if (getenv("DDL_TEST_VERBOSE") != NULL && rank == 0) {
            fprintf(stderr, "failing allocation %lld (>= %zu bytes) on rank %d\n", n, min_bytes,
                    victim);
        }
        if (rank == victim) {
            ddl_alloc_fail_after((uint64_t)n, min_bytes);
        }
        ddl_status st = ddl_session_create(MPI_COMM_WORLD, spec_text, "spec.json", NULL, &t);
        ddl_alloc_fail_after(0, 0);
        assert_same(st);
        if (st == DDL_OK && last == LLONG_MAX) {
            ddl_session_destroy(&t); // past the last allocation of that size: done
            ASSERT_TRUE(n > 5);
            return;
        }
        if (st != DDL_ENOMEM) {
            TEST_FAIL_("allocation %lld (>= %zu bytes) failing on rank %d gave %s: %s", n,
                       min_bytes, victim, ddl_status_name(st), ddl_last_error());
        }
        ASSERT_TRUE(t == NULL);
        if (ddl_alloc_bytes_live() != live) { // nothing may leak
            TEST_FAIL_("allocation %lld (>= %zu bytes) failing on rank %d leaked %lld bytes (%s)",
                       n, min_bytes, victim, (long long)(ddl_alloc_bytes_live() - live),
                       ddl_last_error());
        }
    }
    ASSERT_TRUE(last != LLONG_MAX);
}

// Runs op once to count the victim's allocations, then again with each of them failing
// in turn: every rank must return `want` (or DDL_OK when want_ok_too and the failure was
// absorbed), nothing may leak, and the step and cursor stay as they were.
typedef ddl_status (*session_op)(ddl_session_t *s, const char *arg);

static void sweep_op(ddl_session_t *s, const char *name, session_op op, const char *arg,
                     int victim, ddl_status want)
{
    int64_t    step = ddl_model_step(ddl_session_model(s));
    ddl_cursor cur  = ddl_session_cursor(s);
    uint64_t   c0   = ddl_alloc_count();
    ASSERT_OK(op(s, arg));
    long long k = (long long)(ddl_alloc_count() - c0);
    MPI_Bcast(&k, 1, MPI_LONG_LONG, victim, MPI_COMM_WORLD);
    for (long long n = 1; n <= k; n++) {
        int64_t live = ddl_alloc_bytes_live();
        if (getenv("DDL_TEST_VERBOSE") != NULL && rank == 0) {
            fprintf(stderr, "%s: failing allocation %lld of %lld on rank %d\n", name, n, k,
                    victim);
        }
        if (rank == victim) {
            ddl_alloc_fail_after((uint64_t)n, 0);
        }
        ddl_status st = op(s, arg);
        ddl_alloc_fail_after(0, 0);
        assert_same(st);
        if (st != want) {
            TEST_FAIL_("%s: allocation %lld of %lld failing on rank %d gave %s: %s", name, n, k,
                       victim, ddl_status_name(st), ddl_last_error());
        }
        if (ddl_alloc_bytes_live() != live) {
            TEST_FAIL_("%s: allocation %lld of %lld failing on rank %d leaked %lld bytes", name,
                       n, k, victim, (long long)(ddl_alloc_bytes_live() - live));
        }
        ASSERT_EQ(ddl_model_step(ddl_session_model(s)), step);
        ASSERT_EQ(ddl_session_cursor(s).batch, cur.batch);
    }
}

static ddl_status op_open(ddl_session_t *s, const char *dir)
{
    return ddl_session_open_data(s, rank == 0 ? dir : NULL);
}

static ddl_status op_export(ddl_session_t *s, const char *path)
{
    return ddl_model_export(ddl_session_model(s), path);
}

static ddl_status op_import(ddl_session_t *s, const char *path)
{
    return ddl_model_import(ddl_session_model(s), path);
}

static void test_one_rank_failure(ddl_session_t *s, const char *spec_text, const char *tmp)
{
    const int victim = size - 1;
    char      dir[512];
    snprintf(dir, sizeof dir, "%s/failsave", tmp);
    // Every allocation of a save, then of a restore, failing in turn on the victim: the
    // same status everywhere, and a failed restore changes nothing.
    int64_t    step = ddl_model_step(ddl_session_model(s));
    ddl_cursor cur  = ddl_session_cursor(s);
    for (int what = 0; what < 2; what++) {
        uint64_t c0 = ddl_alloc_count();
        ASSERT_OK(what == 0 ? ddl_session_save(s, rank == 0 ? dir : NULL, NULL)
                            : ddl_session_restore(s, rank == 0 ? dir : NULL, -1));
        long long k = (long long)(ddl_alloc_count() - c0);
        MPI_Bcast(&k, 1, MPI_LONG_LONG, victim, MPI_COMM_WORLD);
        ASSERT_TRUE(k >= 3);
        for (long long n = 1; n <= k; n++) {
            int64_t live = ddl_alloc_bytes_live();
            if (getenv("DDL_TEST_VERBOSE") != NULL && rank == 0) {
                fprintf(stderr, "%s: failing allocation %lld of %lld on rank %d\n",
                        what == 0 ? "save" : "restore", n, k, victim);
            }
            if (rank == victim) {
                ddl_alloc_fail_after((uint64_t)n, 0);
            }
            ddl_status st = what == 0 ? ddl_session_save(s, rank == 0 ? dir : NULL, NULL)
                                      : ddl_session_restore(s, rank == 0 ? dir : NULL, -1);
            ddl_alloc_fail_after(0, 0);
            assert_same(st);
            if (st != DDL_ENOMEM) {
                TEST_FAIL_("%s: allocation %lld of %lld failing on rank %d gave %s: %s",
                           what == 0 ? "save" : "restore", n, k, victim, ddl_status_name(st),
                           ddl_last_error());
            }
            ASSERT_EQ(ddl_alloc_bytes_live(), live);
            ASSERT_EQ(ddl_model_step(ddl_session_model(s)), step);
            ASSERT_EQ(ddl_session_cursor(s).batch, cur.batch);
        }
    }
    // Data (rank 0 reads it), and the global weights out and back in.
    sweep_op(s, "open_data", op_open, FASHION_DIR, 0, DDL_ENOMEM);
    char st_path[600], npy_dir[600];
    snprintf(st_path, sizeof st_path, "%s/w.safetensors", tmp);
    snprintf(npy_dir, sizeof npy_dir, "%s/npy", tmp);
    for (int v = 0; v < 2; v++) {
        int who = v == 0 ? 0 : victim;
        sweep_op(s, "export safetensors", op_export, st_path, who, DDL_ENOMEM);
        sweep_op(s, "import safetensors", op_import, st_path, who, DDL_ENOMEM);
        sweep_op(s, "export npy", op_export, npy_dir, who, DDL_ENOMEM);
        sweep_op(s, "import npy", op_import, npy_dir, who, DDL_ENOMEM);
    }
    // Every allocation of any size (DDL_TEST_SWEEP_FROM=n starts at the n-th), or every
    // DDL_TEST_SWEEP_STRIDE-th: at 4 ranks (tests/engine/CMakeLists.txt) each of the 2,304
    // creations takes ~80 ms on 2 cores, and the sweep at 1 and 2 ranks fails every one.
    // When it skips some, every allocation of at least 4 KiB fails first (tensors: weights,
    // activations, gradients, optimizer state, plan buffers -- where a huge layer fails).
    // A full sweep fails those too, at the same points (the n-th allocation of 4 KiB or
    // more is the m-th of all, creation being deterministic), so it runs alone.
    const char *from_s   = getenv("DDL_TEST_SWEEP_FROM");
    const char *stride_s = getenv("DDL_TEST_SWEEP_STRIDE");
    long long   from     = from_s != NULL && atoll(from_s) > 1 ? atoll(from_s) : 1;
    long long   stride   = stride_s != NULL && atoll(stride_s) > 1 ? atoll(stride_s) : 1;
    if (from > 1 || stride > 1) {
        sweep_create(spec_text, 1, LLONG_MAX, 4096, 1);
    }
    sweep_create(spec_text, from, LLONG_MAX, 0, stride);
}

int main(int argc, char **argv)
{
    ddl_test_mpi_init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    ASSERT_TRUE(argc == 2);
    struct stat sb;
    if (stat(FASHION_DIR, &sb) != 0) {
        if (rank == 0) {
            printf("skipped: no dataset at %s\n", FASHION_DIR);
        }
        MPI_Finalize();
        return DDL_TEST_SKIP;
    }
    if (size != 1 && size != 2 && size != 4) {
        return ddl_test_mpi_finalize(); // shipped LeNet-5 specs exist for 1, 2 and 4 ranks
    }
    char path[512], tmp[256];
    snprintf(path, sizeof path, "%s/lenet5-%d.json", argv[1], size);
    char *text = read_text(path);
    make_tmpdir(tmp, sizeof tmp);
    test_bad_create(argv[1]);

    char ck[512];
    snprintf(ck, sizeof ck, "%s/ck", tmp);
    ddl_session_options opts = {.checkpoint_dir = ck, .checkpoint_every = 0};
    ddl_session_t      *s    = NULL;
    ASSERT_OK(ddl_session_create(MPI_COMM_WORLD, text, path, rank == 0 ? &opts : NULL, &s));
    ASSERT_TRUE(ddl_session_nweights(s) == 10);

    // Nothing to train on yet.
    ddl_train_request req = {.steps = 3};
    ddl_train_result  res;
    ASSERT_STATUS(ddl_session_train(s, &req, NULL, NULL, &res), DDL_EBUSY);
    ASSERT_OK(ddl_session_open_data(s, rank == 0 ? FASHION_DIR : NULL));
    ASSERT_EQ(ddl_session_steps_per_epoch(s), 60000 / 64);
    ddl_eval_result ev0, ev1;
    ASSERT_OK(ddl_session_evaluate(s, DDL_SPLIT_TEST, &ev0));
    ASSERT_EQ(ev0.count, 10000);
    // Bad requests: both or neither of steps and epochs.
    ddl_train_request both = {.steps = 1, .epochs = 1}, none = {0};
    ASSERT_STATUS(ddl_session_train(s, &both, NULL, NULL, &res), DDL_EINVAL);
    ASSERT_STATUS(ddl_session_train(s, &none, NULL, NULL, &res), DDL_EINVAL);

    // Training lowers the loss and allocates nothing per step.
    record r = {0};
    req      = (ddl_train_request){.steps = 2};
    ASSERT_OK(ddl_session_train(s, &req, on_progress, &r, &res)); // warm-up
    uint64_t before = ddl_alloc_count();
    req             = (ddl_train_request){.steps = 40};
    r               = (record){0};
    ASSERT_OK(ddl_session_train(s, &req, on_progress, &r, &res));
    ASSERT_EQ(ddl_alloc_count() - before, 0);
    ASSERT_EQ(res.steps_done, 40);
    ASSERT_EQ(res.step, 42);
    ASSERT_TRUE(!res.cancelled);
    ASSERT_EQ(ddl_session_cursor(s).batch, 42);
    if (rank == 0) {
        ASSERT_EQ(r.n, 40);
        ASSERT_TRUE(!r.bad);
        double first = 0, last = 0;
        for (int i = 0; i < 5; i++) {
            first += r.loss[i];
            last += r.loss[35 + i];
        }
        ASSERT_TRUE(last < first);
    }
    // Cancel from the callback after 3 of 10 steps: every rank stops there.
    r   = (record){.stop_after = 3};
    req = (ddl_train_request){.steps = 10};
    ASSERT_OK(ddl_session_train(s, &req, on_progress, &r, &res));
    ASSERT_TRUE(res.cancelled);
    ASSERT_EQ(res.steps_done, 3);
    ASSERT_EQ(ddl_session_cursor(s).batch, 45);
    assert_same(res.steps_done);
    ASSERT_OK(ddl_session_evaluate(s, DDL_SPLIT_TEST, &ev1));
    ASSERT_TRUE(ev1.loss < ev0.loss);
    ASSERT_TRUE(ev1.accuracy > ev0.accuracy);

    test_predict_and_eval(s);
    test_predict_samples_field(false);
    test_predict_samples_field(true);
    test_save_restore(s, tmp);
    test_weights(s);
    test_one_rank_failure(s, text, tmp);
    test_data_checks(s, tmp);
    test_periodic_checkpoints(text, tmp);

    ddl_session_destroy(&s);
    ASSERT_TRUE(s == NULL);
    if (rank == 0) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
        ASSERT_TRUE(system(cmd) == 0);
    }
    free(text);
    return ddl_test_mpi_finalize();
}
