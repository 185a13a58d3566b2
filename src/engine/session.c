// engine/session.c: a training session (ddl/session.h): one model, rank 0's datasets,
// the data cursor and the checkpoint policy, driven collectively by every rank. This
// is the loop distdl-train and the daemon's dispatcher share.
//
// Who holds what:
//   rank 0      the datasets (both splits), the shuffled order of the current epoch,
//               one batch buffer (samples and labels), the checkpoint directory, and
//               the progress callback;
//   every rank  the model shard, the sample counts of both splits, the cursor, the
//               checkpoint interval and the newest durable step.
// Rank 0 decides (validates arguments, reads data) and the others learn the decision by
// broadcast. Every public function validates rank 0's arguments and agrees on them
// (ddl_agree, or ddl_agree_root with the arguments the others need) before data moves,
// and returns an agreed status, so every rank returns the same status and message. The
// model's own commands end agreed, so a function whose last collective is a model
// command (predict, evaluate_batch, step without a checkpoint) returns its status without
// another round, and a failure inside a step ends the loop on every rank at the same step.
//
// Nothing here allocates per step: the batch buffer, the permutation and the model's
// buffers and Repartition plans are all allocated when the session or its data is set
// up. Checkpoints and evaluation of a whole split allocate only what the checkpoint
// writer and reader need.
//
// Data comes from an IDX directory (ddl_session_open_data) or is generated from the
// spec's data.synthetic (ddl_session_open_synthetic): rank 0 makes each batch from the
// sample indices either way, so shuffling, the cursor and resuming work alike. A
// segmentation model takes label_elems labels per sample (one per output voxel).
//
// The data cursor in a checkpoint (the caller state of ddl_model_save) is
//   {"epoch": E, "batch": b, "rng": {"seed": S, "shuffle_stream": E, "dropout_stream": T}}
// where (E, b) is the next training batch, S the spec's seed and T the optimizer step:
// every random stream is counter-based, so (seed, epoch, step) is the whole random state.
// A restored cursor is validated: integers (not strings or reals) in range, the seed
// equal to the spec's.
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <jansson.h>

#include "base/check.h"
#include "ddl/agree.h"
#include "ddl/base.h"
#include "ddl/collect.h"
#include "ddl/data.h"
#include "ddl/h5.h"
#include "ddl/session.h"
#include "ddl/synth.h"
#include "engine/model_internal.h"
#include "partition/mpi_check.h"

// Bounds on what a checkpoint's cursor may claim (an epoch count no run reaches; it
// keeps every epoch * steps_per_epoch product far from overflow).
#define CURSOR_EPOCH_MAX ((int64_t)1 << 40)
// Longest string (spec text, path) broadcast from rank 0.
#define SESSION_TEXT_MAX ((int64_t)1 << 30)

struct ddl_session {
    ddl_interlude il;   // ddl_session_set_interlude (every rank alike)
    MPI_Comm     comm; // our duplicate of the caller's communicator
    int          rank, size;
    ddl_model_t *model;
    int64_t      batch;        // samples per batch (the spec's batch size)
    int64_t      sample_numel; // values in one sample
    size_t       sample_bytes; // one sample in the spec's dtype
    int          classes;
    int64_t      label_elems;  // labels per sample (segmentation: one per output voxel)
    bool              dense;        // the loss trains on dense targets (tbuf), not labels
    bool              binary;       // dense with bce or bce_with_logits: hits count too
    int64_t           out_elems;    // output values per sample (dense: targets per sample)
    ddl_target_source target;       // where the data's dense targets come from
    ddl_dtype    dt;
    double       mean, std; // input normalization
    // Checkpoint policy.
    char   *ckpt_dir;   // rank 0 (NULL: none)
    int64_t ckpt_every; // every rank
    int64_t durable_step;
    // Data.
    bool        has_data;
    int64_t     n[2];       // samples per split, every rank
    ddl_dataset data[2];    // rank 0
    bool        synth;      // the data is generated (the spec's data.synthetic)
    bool             synth_local; // generated segmentation data: each rank generates its boxes
    ddl_synth_params synth_params;
    int64_t    *perm;       // rank 0: the order of perm_epoch (n[TRAIN] entries)
    int64_t     perm_epoch; // -1: none yet
    // Rank 0's staging (rank0_staging: allocated when data that rank 0 reads is opened;
    // an HDF5 file and generated segmentation data need none, each rank ingests its own).
    void       *xbuf;       // rank 0: one batch of samples
    int64_t    *lbuf;       // rank 0: its labels (batch * label_elems; generated dense
                            // data: the painting's scratch, batch * out_elems)
    void       *tbuf;       // rank 0, dense: one batch of targets (batch * out_elems)
    int64_t    *idx;        // rank 0: sample indices of an evaluation batch
    ddl_h5     *h5;         // every rank: an HDF5 file each reads its own boxes of (or NULL)
    int64_t    *bidx;       // with h5 or synth_local, every rank: the batch's sample indices
    int64_t    *iou;        // segmentation: per-class counts of an evaluation (4 * classes)
    ddl_cursor  cur;
    // The global weights (parameters and buffers), for gather/scatter.
    ddl_named_tensor *w;
    void             *wnames;
    int               nw;
};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// ---- helpers -------------------------------------------------------------------

// Broadcasts rank 0's string (NULL allowed) to every rank as a ddl_malloc'd copy (NULL
// stays NULL). Collective; the same status everywhere.
static ddl_status bcast_string(MPI_Comm comm, int rank, const char *in, char **out)
{
    *out        = NULL;
    int64_t len = -1;
    if (rank == 0 && in != NULL) {
        size_t l = strlen(in);
        len      = l > (size_t)SESSION_TEXT_MAX ? SESSION_TEXT_MAX + 1 : (int64_t)l;
    }
    DDL_CHECK_MPI(MPI_Bcast(&len, 1, MPI_INT64_T, 0, comm));
    DDL_REQUIRE(len <= SESSION_TEXT_MAX, DDL_EINVAL, "session: text longer than %lld bytes",
                (long long)SESSION_TEXT_MAX);
    if (len < 0) {
        return DDL_OK;
    }
    char      *buf = ddl_malloc((size_t)len + 1);
    ddl_status st  = buf != NULL ? DDL_OK : ddl_set_error(DDL_ENOMEM, "session: out of memory");
    st             = ddl_agree(comm, st);
    if (st != DDL_OK) {
        ddl_free(buf);
        return st;
    }
    if (rank == 0) {
        memcpy(buf, in, (size_t)len);
    }
    buf[len] = '\0';
    if (MPI_Bcast(buf, (int)len, MPI_CHAR, 0, comm) != MPI_SUCCESS) {
        ddl_free(buf);
        return ddl_set_error(DDL_EMPI, "session: broadcast of a string failed");
    }
    *out = buf;
    return DDL_OK;
}

static char *copy_string(const char *s)
{
    size_t n = strlen(s);
    char  *c = ddl_malloc(n + 1);
    if (c != NULL) {
        memcpy(c, s, n + 1);
    }
    return c;
}

static int64_t steps_per_epoch(const ddl_session_t *s)
{
    return s->has_data ? s->n[DDL_SPLIT_TRAIN] / s->batch : 0;
}

// Fills rank 0's batch buffer with samples idx[0..count) of a split. Generation is
// validated when the data is opened and allocates nothing, so it does not fail; its
// status is still agreed on by the caller.
static ddl_status fill_batch(ddl_session_t *s, int split, const int64_t *idx, int64_t count)
{
    if (s->h5 != NULL || s->synth_local) {
        return DDL_OK; // every rank reads or generates its own box (read_local, make_local)
    }
    if (s->synth) {
        return ddl_synth_batch_targets(&s->synth_params, split, idx, count, s->mean, s->std, s->dt,
                                       s->xbuf, s->lbuf, s->target == DDL_TARGET_MASK,
                                       s->dense ? s->tbuf : NULL);
    }
    const ddl_dataset *ds  = &s->data[split];
    int64_t           *lab = s->dense ? NULL : s->lbuf;
    if (s->dt == DDL_F32) {
        ddl_dataset_batch_f32(ds, idx, count, s->mean, s->std, s->xbuf, lab);
    } else {
        ddl_dataset_batch_f64(ds, idx, count, s->mean, s->std, s->xbuf, lab);
    }
    if (s->dense) { // the image target (the spec allows no other for IDX data)
        ddl_dataset_batch_images(ds, idx, count, s->dt, s->tbuf);
    }
    return DDL_OK;
}

// Rank 0's sample indices idx0[0..count) of a batch into every rank's bidx.
static ddl_status share_indices(ddl_session_t *s, const int64_t *idx0, int64_t count)
{
    if (s->rank == 0) {
        memcpy(s->bidx, idx0, sizeof(int64_t) * (size_t)count);
    }
    DDL_CHECK_MPI(MPI_Bcast(s->bidx, (int)count, MPI_INT64_T, 0, s->comm));
    return DDL_OK;
}

// Per-rank ingest from an HDF5 file: rank 0's sample indices idx0[0..count) of a split
// to every rank, then each rank reads its own box of the inputs and the targets into the
// model's buffers (ddl_h5_read; rows past count are zeroed). Nothing passes through rank
// 0. Collective; agreed.
static ddl_status read_local(ddl_session_t *s, int split, const int64_t *idx0, int64_t count)
{
    DDL_CHECK(share_indices(s, idx0, count));
    ddl_box bx, by;
    void   *px, *py;
    ddl_model_local_input(s->model, &bx, &px);
    ddl_model_local_targets(s->model, &by, &py);
    DDL_CHECK(ddl_h5_read(s->h5, split, 0, s->bidx, count, s->batch, &bx, s->dt, px));
    return ddl_h5_read(s->h5, split, 1, s->bidx, count, s->batch, &by, s->dt, py);
}

// Rows [r0, r1) of a box [batch, 1, D, H, W] (an input or label box), `per` voxels each:
// samples bidx[r] of a split generated for r < count, zeros past it. x or labels is NULL.
static ddl_status make_rows(ddl_session_t *s, int split, int64_t count, const ddl_box *b, void *x,
                            int64_t *labels)
{
    if (b->ndim != 5 || ddl_box_numel(b) == 0) {
        return DDL_OK; // no box on this rank (the spec's synthetic input is [1, D, H, W])
    }
    DDL_REQUIRE(b->start[1] == 0 && b->stop[1] == 1, DDL_EINTERNAL,
                "synthetic data: a box of channels [%lld, %lld), expected one channel",
                (long long)b->start[1], (long long)b->stop[1]);
    int64_t lo[3], hi[3], per = 1;
    for (int d = 0; d < 3; d++) {
        lo[d] = b->start[2 + d];
        hi[d] = b->stop[2 + d];
        per *= hi[d] - lo[d];
    }
    size_t es = ddl_dtype_size(s->dt);
    for (int64_t r = b->start[0]; r < b->stop[0]; r++) {
        int64_t  o  = (r - b->start[0]) * per;
        void    *xr = x != NULL ? (char *)x + (size_t)o * es : NULL;
        int64_t *lr = labels != NULL ? labels + o : NULL;
        if (r < count) {
            DDL_CHECK(ddl_synth_box(&s->synth_params, split, &s->bidx[r], 1, lo, hi, s->mean,
                                    s->std, s->dt, xr, lr));
        } else if (xr != NULL) {
            memset(xr, 0, (size_t)per * es);
        } else {
            memset(lr, 0, (size_t)per * sizeof *lr);
        }
    }
    return DDL_OK;
}

// Per-rank generation of segmentation data: rank 0's sample indices idx0[0..count) to
// every rank, then each generates its own box of the inputs and of the labels into the
// model's buffers (ddl_synth_box; rows past count are zeroed). Nothing passes through
// rank 0. Collective; agreed.
static ddl_status make_local(ddl_session_t *s, int split, const int64_t *idx0, int64_t count)
{
    DDL_CHECK(share_indices(s, idx0, count));
    ddl_box  bx, by;
    void    *px;
    int64_t *py;
    ddl_model_local_input(s->model, &bx, &px);
    ddl_model_local_labels(s->model, &by, &py);
    ddl_status st = make_rows(s, split, count, &bx, px, NULL);
    if (st == DDL_OK) {
        st = make_rows(s, split, count, &by, NULL, py);
    }
    return ddl_agree(s->comm, st);
}

// Rank 0's batch, agreed when generated (an IDX batch cannot fail); an HDF5 batch is
// read by every rank (read_local), generated segmentation data made by every rank
// (make_local).
static ddl_status agree_fill(ddl_session_t *s, ddl_status st, int split, const int64_t *idx0,
                             int64_t count)
{
    if (s->h5 != NULL) {
        return read_local(s, split, idx0, count);
    }
    if (s->synth_local) {
        return make_local(s, split, idx0, count);
    }
    return s->synth ? ddl_agree(s->comm, st) : st;
}

// ---- create / destroy ------------------------------------------------------------

// Rank 0's checks of the arguments of create (no communication).
static ddl_status check_create_args(int size, const char *spec_text, const char *source,
                                    const ddl_session_options *opts)
{
    DDL_REQUIRE(spec_text != NULL, DDL_EINVAL, "session: rank 0 must pass the spec text");
    if (opts != NULL) {
        DDL_REQUIRE(opts->checkpoint_every >= 0, DDL_EINVAL,
                    "session: checkpoint_every %lld must be >= 0",
                    (long long)opts->checkpoint_every);
        DDL_REQUIRE(opts->checkpoint_every == 0 || opts->checkpoint_dir != NULL, DDL_EINVAL,
                    "session: checkpoint_every %lld needs a checkpoint_dir",
                    (long long)opts->checkpoint_every);
    }
    ddl_spec_t *spec = NULL;
    DDL_CHECK(ddl_spec_parse(spec_text, source != NULL ? source : "spec", size, &spec));
    ddl_spec_destroy(&spec);
    return DDL_OK;
}

// Everything after the communicator: spec, model, rank 0's buffers, the weight list.
static ddl_status create_body(ddl_session_t *s, const char *spec_text, const char *source,
                              const ddl_session_options *opts)
{
    ddl_status st = DDL_OK;
    if (s->rank == 0) {
        st = check_create_args(s->size, spec_text, source, opts);
    }
    DDL_CHECK(ddl_agree(s->comm, st));
    char   *text = NULL, *src = NULL;
    int64_t every = s->rank == 0 && opts != NULL ? opts->checkpoint_every : 0;
    DDL_CHECK_MPI(MPI_Bcast(&every, 1, MPI_INT64_T, 0, s->comm));
    s->ckpt_every = every;
    st            = bcast_string(s->comm, s->rank, spec_text, &text);
    if (st == DDL_OK) {
        st = bcast_string(s->comm, s->rank, source != NULL ? source : "spec", &src);
    }
    ddl_spec_t *spec = NULL;
    if (st == DDL_OK) {
        // Rank 0 parsed it already; the others parse the same text the same way.
        st = ddl_agree(s->comm, ddl_spec_parse(text, src, s->size, &spec));
    }
    ddl_free(text);
    ddl_free(src);
    if (st == DDL_OK) {
        st = ddl_model_create(s->comm, spec, &s->model); // agreed inside
    }
    if (st == DDL_OK) {
        s->batch        = ddl_spec_batch_size(spec);
        ddl_shape in    = ddl_spec_input_shape(spec);
        s->sample_numel = ddl_shape_numel(&in);
        s->dt           = ddl_spec_dtype(spec);
        s->sample_bytes = (size_t)s->sample_numel * ddl_dtype_size(s->dt);
        s->classes      = ddl_spec_num_classes(spec);
        s->label_elems  = ddl_spec_label_elems(spec);
        s->dense        = ddl_spec_dense_targets(spec);
        s->binary =
            ddl_spec_loss(spec) == DDL_LOSS_BCE || ddl_spec_loss(spec) == DDL_LOSS_BCE_WITH_LOGITS;
        s->out_elems = ddl_spec_output_elems(spec);
        s->target    = ddl_spec_target_source(spec);
        ddl_spec_normalize(spec, &s->mean, &s->std);
    }
    ddl_spec_destroy(&spec);
    DDL_CHECK(st);
    st = DDL_OK;
    if (s->rank == 0) {
        s->idx = ddl_malloc(sizeof(int64_t) * (size_t)s->batch);
        if (s->idx == NULL) {
            st = ddl_set_error(DDL_ENOMEM, "session: out of memory for the batch indices");
        }
        if (st == DDL_OK && opts != NULL && opts->checkpoint_dir != NULL) {
            s->ckpt_dir = copy_string(opts->checkpoint_dir);
            if (s->ckpt_dir == NULL) {
                st = ddl_set_error(DDL_ENOMEM, "session: out of memory");
            }
        }
    }
    if (st == DDL_OK && !s->dense && ddl_spec_output_shape(ddl_model_spec(s->model)).ndim > 1) {
        s->iou = ddl_calloc(4 * (size_t)s->classes, sizeof(int64_t));
        if (s->iou == NULL) {
            st = ddl_set_error(DDL_ENOMEM, "session: out of memory");
        }
    }
    if (st == DDL_OK) {
        st = ddl__model_named_state(s->model, false, &s->w, &s->nw, &s->wnames);
    }
    return ddl_agree(s->comm, st);
}

ddl_status ddl_session_create(MPI_Comm comm, const char *spec_text, const char *source,
                              const ddl_session_options *opts, ddl_session_t **out)
{
    DDL_REQUIRE(out != NULL, DDL_EINVAL, "session: out must not be NULL");
    *out             = NULL;
    ddl_session_t *s = ddl_calloc(1, sizeof *s);
    ddl_status     st =
        ddl_agree(comm, s != NULL ? DDL_OK : ddl_set_error(DDL_ENOMEM, "session: out of memory"));
    if (st != DDL_OK) {
        ddl_free(s);
        return st;
    }
    if (MPI_Comm_dup(comm, &s->comm) != MPI_SUCCESS) {
        ddl_free(s);
        return ddl_set_error(DDL_EMPI, "session: MPI_Comm_dup failed");
    }
    MPI_Comm_set_errhandler(s->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(s->comm, &s->rank);
    MPI_Comm_size(s->comm, &s->size);
    s->durable_step = -1;
    s->perm_epoch   = -1;
    st              = create_body(s, spec_text, source, opts);
    if (st != DDL_OK) {
        ddl_session_destroy(&s);
        return st;
    }
    *out = s;
    return DDL_OK;
}

void ddl_session_destroy(ddl_session_t **sp)
{
    if (sp == NULL || *sp == NULL) {
        return;
    }
    ddl_session_t *s = *sp;
    ddl_model_destroy(&s->model);
    ddl_dataset_free(&s->data[0]);
    ddl_dataset_free(&s->data[1]);
    ddl_free(s->perm);
    ddl_free(s->xbuf);
    ddl_free(s->lbuf);
    ddl_free(s->tbuf);
    ddl_free(s->idx);
    ddl_h5_close(&s->h5); // collective: every rank destroys its session
    ddl_free(s->bidx);
    ddl_free(s->iou);
    ddl_free(s->ckpt_dir);
    ddl_free(s->w);
    ddl_free(s->wnames);
    MPI_Comm_free(&s->comm);
    ddl_free(s);
    *sp = NULL;
}

ddl_model_t *ddl_session_model(const ddl_session_t *s)
{
    return s->model;
}

// ---- data ----------------------------------------------------------------------

// Checks one split against the model: the sample shape (the data's dims must be the
// input shape's trailing dims, the leading ones being 1, e.g. 28 x 28 for [1, 28, 28])
// and the labels, in [0, classes). Not collective.
static ddl_status check_split(const ddl_session_t *s, const char *dir, const char *name,
                              const ddl_dataset *ds)
{
    ddl_shape in = ddl_spec_input_shape(ddl_model_spec(s->model));
    char      want[128];
    ddl_shape_str(&in, want, sizeof want);
    char got[128];
    int  used = snprintf(got, sizeof got, "[");
    for (int d = 0; d < ds->ndim && used < (int)sizeof got; d++) {
        used += snprintf(got + used, sizeof got - (size_t)used, "%s%lld", d ? ", " : "",
                         (long long)ds->dims[d]);
    }
    if (used < (int)sizeof got) {
        snprintf(got + used, sizeof got - (size_t)used, "]");
    }
    bool fits = ds->sample_size == s->sample_numel && ds->ndim <= in.ndim;
    for (int d = 0; fits && d < in.ndim; d++) {
        int     k    = d - (in.ndim - ds->ndim); // the data's dim matching input dim d
        int64_t have = k >= 0 ? ds->dims[k] : 1;
        fits         = have == in.d[d];
    }
    DDL_REQUIRE(fits, DDL_EINVAL,
                "data %s: the %s samples are %s, the model's input is %s (one sample)", dir, name,
                got, want);
    DDL_REQUIRE(s->dense || ds->num_classes <= s->classes, DDL_EINVAL,
                "data %s: the %s labels reach %d, the model has %d classes (labels must be in "
                "[0, %d))",
                dir, name, ds->num_classes - 1, s->classes, s->classes);
    return DDL_OK;
}

// Rank 0: loads and checks both splits into fresh datasets and a fresh permutation.
static ddl_status load_data(const ddl_session_t *s, const char *dir, ddl_dataset *tr,
                            ddl_dataset *te, int64_t **perm)
{
    DDL_REQUIRE(dir != NULL, DDL_EINVAL, "open_data: rank 0 must pass a directory");
    DDL_REQUIRE(s->dense || s->label_elems == 1, DDL_EINVAL,
                "open_data: the model segments (one label per output voxel, %lld per sample) "
                "but IDX data holds one label per sample; give the spec \"data\": "
                "{\"synthetic\": ...} instead",
                (long long)s->label_elems);
    DDL_CHECK(ddl_dataset_load_mnist_dir(dir, 1, tr));
    DDL_CHECK(ddl_dataset_load_mnist_dir(dir, 0, te));
    DDL_CHECK(check_split(s, dir, "training", tr));
    DDL_CHECK(check_split(s, dir, "test", te));
    DDL_REQUIRE(tr->n >= s->batch, DDL_EINVAL,
                "data %s: the training split has %lld samples, fewer than one batch (%lld)", dir,
                (long long)tr->n, (long long)s->batch);
    *perm = ddl_malloc(sizeof(int64_t) * (size_t)tr->n);
    DDL_REQUIRE(*perm != NULL, DDL_ENOMEM, "open_data: out of memory for the shuffle");
    return DDL_OK;
}

// The data that replaces the session's once it was opened everywhere: IDX splits (rank
// 0; zeroed otherwise), rank 0's shuffle order, an HDF5 file with every rank's batch
// indices (or NULL), whether it is generated, and the split sizes.
typedef struct new_data {
    ddl_dataset tr, te;
    int64_t    *perm;
    ddl_h5     *h5;
    int64_t    *bidx;
    bool        synth, synth_local;
    int64_t     n[2];
} new_data;

// Rank 0's staging for data it reads or generates whole (IDX files, generated dense
// targets), allocated once, at the first such open (local; the caller agrees).
static ddl_status rank0_staging(ddl_session_t *s)
{
    if (s->rank != 0 || s->xbuf != NULL) {
        return DDL_OK;
    }
    int64_t nl = s->dense ? s->out_elems : s->label_elems;
    void   *x  = ddl_malloc((size_t)s->batch * s->sample_bytes);
    void   *l  = ddl_malloc(sizeof(int64_t) * (size_t)(s->batch * nl));
    void   *t =
        s->dense ? ddl_malloc((size_t)(s->batch * s->out_elems) * ddl_dtype_size(s->dt)) : NULL;
    if (x == NULL || l == NULL || (s->dense && t == NULL)) {
        ddl_free(x);
        ddl_free(l);
        ddl_free(t);
        return ddl_set_error(DDL_ENOMEM, "session: out of memory for the batch buffer");
    }
    s->xbuf = x;
    s->lbuf = l;
    s->tbuf = t;
    return DDL_OK;
}

// Frees the old data (the HDF5 file on every rank alike: its close is collective) and
// takes nd's; the cursor is kept. Local but for that close.
static void replace_data(ddl_session_t *s, new_data *nd)
{
    ddl_dataset_free(&s->data[0]);
    ddl_dataset_free(&s->data[1]);
    ddl_free(s->perm);
    ddl_h5_close(&s->h5);
    ddl_free(s->bidx);
    s->data[DDL_SPLIT_TRAIN] = nd->tr;
    s->data[DDL_SPLIT_TEST]  = nd->te;
    s->perm                  = nd->perm;
    s->h5                    = nd->h5;
    s->bidx                  = nd->bidx;
    s->synth                 = nd->synth;
    s->synth_local           = nd->synth_local;
    s->perm_epoch            = -1;
    s->n[0]                  = nd->n[0];
    s->n[1]                  = nd->n[1];
    s->has_data              = true;
}

// An HDF5 file (rank 0's path) that every rank reads its own boxes of: input "x" shaped
// like the model's input, target "y" like its output (ddl/h5.h). Dense targets only.
static ddl_status open_h5(ddl_session_t *s, const char *path)
{
    const ddl_spec_t *spec = ddl_model_spec(s->model);
    char             *p    = NULL;
    DDL_CHECK(bcast_string(s->comm, s->rank, path, &p));
    ddl_status st = DDL_OK;
    if (p == NULL) {
        st = ddl_set_error(DDL_EINVAL, "open_data: rank 0 must pass a path");
    } else if (!s->dense) { // every rank holds the same spec: the same verdict
        st = ddl_set_error(DDL_EINVAL,
                           "data %s: HDF5 datasets carry targets shaped like the output, and "
                           "the loss %s trains on class labels (give an IDX directory or the "
                           "spec's generated data)",
                           p, ddl_spec_loss_name(spec));
    }
    ddl_h5       *h = NULL;
    ddl_h5_expect e = {ddl_spec_input_shape(spec), ddl_spec_output_shape(spec)};
    if (st == DDL_OK) {
        st = ddl_h5_open(s->comm, p, &e, &h); // agreed
    }
    int64_t n[2] = {0, 0}, *perm = NULL, *bidx = NULL;
    if (st == DDL_OK) {
        n[0] = ddl_h5_count(h, DDL_SPLIT_TRAIN);
        n[1] = ddl_h5_count(h, DDL_SPLIT_TEST);
        if (n[0] < s->batch) {
            st = ddl_set_error(DDL_EINVAL,
                               "data %s: the training split has %lld samples, fewer than one "
                               "batch (%lld)",
                               p, (long long)n[0], (long long)s->batch);
        } else {
            bidx = ddl_malloc(sizeof(int64_t) * (size_t)s->batch);
            perm = s->rank == 0 ? ddl_malloc(sizeof(int64_t) * (size_t)n[0]) : NULL;
            if (bidx == NULL || (s->rank == 0 && perm == NULL)) {
                st = ddl_set_error(DDL_ENOMEM, "data %s: out of memory for the sample order", p);
            }
        }
        st = ddl_agree(s->comm, st);
    }
    ddl_free(p);
    if (st != DDL_OK) {
        ddl_h5_close(&h);
        ddl_free(bidx);
        ddl_free(perm);
        return st;
    }
    // Only now replace the old data (the call has succeeded everywhere).
    new_data nd = {.perm = perm, .h5 = h, .bidx = bidx, .n = {n[0], n[1]}};
    replace_data(s, &nd);
    return DDL_OK;
}

uint64_t ddl_session_data_bytes_read(const ddl_session_t *s)
{
    return ddl_h5_bytes_read(s->h5);
}

ddl_status ddl_session_open_data(ddl_session_t *s, const char *dir)
{
    // A regular file (or a missing path named .h5, .hdf5 or .he5) is an HDF5 dataset, read
    // by every rank; a directory holds IDX files, read by rank 0.
    int         file = 0;
    struct stat sb;
    if (s->rank == 0 && dir != NULL) {
        const char *dot = strrchr(dir, '.');
        bool        h5n = dot != NULL && (strcmp(dot, ".h5") == 0 || strcmp(dot, ".hdf5") == 0 ||
                                   strcmp(dot, ".he5") == 0);
        bool        got = stat(dir, &sb) == 0;
        file            = (got && S_ISREG(sb.st_mode)) || (!got && h5n);
    }
    DDL_CHECK_MPI(MPI_Bcast(&file, 1, MPI_INT, 0, s->comm));
    if (file) {
        return open_h5(s, dir);
    }
    ddl_dataset tr = {0}, te = {0};
    int64_t    *perm = NULL;
    ddl_status  st   = DDL_OK;
    if (s->rank == 0) {
        st = load_data(s, dir, &tr, &te, &perm);
        st = st == DDL_OK ? rank0_staging(s) : st;
    }
    st = ddl_agree(s->comm, st);
    if (st != DDL_OK) {
        ddl_dataset_free(&tr);
        ddl_dataset_free(&te);
        ddl_free(perm);
        return st;
    }
    // Only now replace the old data (the call has succeeded everywhere).
    int64_t n[2] = {tr.n, te.n};
    st           = MPI_Bcast(n, 2, MPI_INT64_T, 0, s->comm) == MPI_SUCCESS
                       ? DDL_OK
                       : ddl_set_error(DDL_EMPI, "open_data: broadcast failed");
    new_data nd  = {.tr = tr, .te = te, .perm = perm, .n = {n[0], n[1]}};
    replace_data(s, &nd);
    s->has_data = st == DDL_OK;
    return ddl_agree(s->comm, st);
}

ddl_status ddl_session_open_synthetic(ddl_session_t *s)
{
    // Every rank holds the same spec, so each reaches the same verdict without messages.
    const ddl_spec_t *spec = ddl_model_spec(s->model);
    ddl_synth_params  p;
    int64_t           n[2] = {0, 0};
    ddl_status        st   = DDL_OK;
    if (!ddl_spec_synthetic(spec, &p, &n[0], &n[1])) {
        st = ddl_set_error(DDL_EINVAL, "open_synthetic: the spec has no \"data\": "
                                       "{\"synthetic\": ...} block (give a data directory)");
    } else {
        st = ddl_synth_validate(&p);
    }
    // Segmentation labels (one per output voxel): every rank generates its own boxes of a
    // batch (make_local); dense targets are generated whole on rank 0 and scattered.
    bool     local = s->iou != NULL;
    int64_t *perm = NULL, *bidx = NULL;
    if (st == DDL_OK && s->rank == 0) {
        perm = ddl_malloc(sizeof(int64_t) * (size_t)n[0]);
        if (perm == NULL) {
            st = ddl_set_error(DDL_ENOMEM, "open_synthetic: out of memory for the shuffle");
        } else if (!local) {
            st = rank0_staging(s);
        }
    }
    if (st == DDL_OK && local) {
        bidx = ddl_malloc(sizeof(int64_t) * (size_t)s->batch);
        if (bidx == NULL) {
            st = ddl_set_error(DDL_ENOMEM, "open_synthetic: out of memory for the batch indices");
        }
    }
    st = ddl_agree(s->comm, st);
    if (st != DDL_OK) {
        ddl_free(perm);
        ddl_free(bidx);
        return st;
    }
    new_data nd = {
        .perm = perm, .bidx = bidx, .synth = true, .synth_local = local, .n = {n[0], n[1]}};
    replace_data(s, &nd);
    s->synth_params = p;
    return DDL_OK;
}

bool ddl_session_has_data(const ddl_session_t *s)
{
    return s->has_data;
}

ddl_cursor ddl_session_cursor(const ddl_session_t *s)
{
    return s->cur;
}

ddl_status ddl_session_set_cursor(ddl_session_t *s, ddl_cursor c)
{
    ddl_status st  = DDL_OK;
    int64_t    spe = steps_per_epoch(s);
    if (s->rank == 0 && (c.epoch < 0 || c.epoch > CURSOR_EPOCH_MAX || c.batch < 0 ||
                         (spe > 0 && c.batch >= spe))) {
        st = ddl_set_error(DDL_EINVAL,
                           "set_cursor: epoch %lld must be in [0, %lld] and batch %lld in [0, "
                           "%lld) (batches per epoch)",
                           (long long)c.epoch, (long long)CURSOR_EPOCH_MAX, (long long)c.batch,
                           (long long)(spe > 0 ? spe : INT64_MAX));
    }
    DDL_CHECK(ddl_agree(s->comm, st));
    int64_t v[2] = {c.epoch, c.batch};
    DDL_CHECK_MPI(MPI_Bcast(v, 2, MPI_INT64_T, 0, s->comm));
    s->cur = (ddl_cursor){v[0], v[1]};
    return ddl_agree(s->comm, DDL_OK);
}

int64_t ddl_session_steps_per_epoch(const ddl_session_t *s)
{
    return steps_per_epoch(s);
}

int64_t ddl_session_durable_step(const ddl_session_t *s)
{
    return s->durable_step;
}

// ---- checkpoints ---------------------------------------------------------------

static void cursor_json(const ddl_session_t *s, char *buf, size_t len)
{
    snprintf(buf, len,
             "{\"epoch\": %lld, \"batch\": %lld, \"rng\": {\"seed\": %llu, \"shuffle_stream\": "
             "%lld, \"dropout_stream\": %lld}}",
             (long long)s->cur.epoch, (long long)s->cur.batch,
             (unsigned long long)ddl_spec_seed(ddl_model_spec(s->model)), (long long)s->cur.epoch,
             (long long)ddl_model_step(s->model));
}

// Saves into `dir` (every rank's copy). Collective; agreed.
static ddl_status save_to(ddl_session_t *s, const char *dir)
{
    char user[512];
    cursor_json(s, user, sizeof user);
    DDL_CHECK(ddl_model_save(s->model, dir, user)); // agreed inside
    s->durable_step = ddl_model_step(s->model);
    return DDL_OK;
}

// rank 0's dir, or the session's checkpoint_dir, to every rank.
static ddl_status resolve_save_dir(ddl_session_t *s, const char *dir, char **out)
{
    ddl_status  st   = DDL_OK;
    const char *pick = s->rank == 0 ? (dir != NULL ? dir : s->ckpt_dir) : NULL;
    if (s->rank == 0 && pick == NULL) {
        st = ddl_set_error(DDL_EINVAL,
                           "save: no directory given and the session has no checkpoint_dir");
    }
    DDL_CHECK(ddl_agree(s->comm, st));
    return bcast_string(s->comm, s->rank, pick, out);
}

// The checkpoint every ckpt_every steps inside train and step (collective). A failed save
// (a full disk, say) does not stop training: it is logged on rank 0, *durable stays
// false, the newest durable checkpoint stays what it was, and the next one retries.
// Only a failure to agree on the directory is returned.
static ddl_status periodic_save(ddl_session_t *s, bool *durable)
{
    char      *d  = NULL;
    ddl_status st = bcast_string(s->comm, s->rank, s->ckpt_dir, &d);
    if (st == DDL_OK) {
        ddl_status sv = save_to(s, d);
        if (sv == DDL_OK) {
            *durable = true;
        } else if (s->rank == 0) {
            ddl_log(DDL_LOG_WARN,
                    "checkpoint of step %lld failed, training goes on (newest durable step "
                    "%lld): %s",
                    (long long)ddl_model_step(s->model), (long long)s->durable_step,
                    ddl_last_error());
        }
    }
    ddl_free(d);
    return st;
}

ddl_status ddl_session_save(ddl_session_t *s, const char *dir, int64_t *step)
{
    char      *d  = NULL;
    ddl_status st = resolve_save_dir(s, dir, &d);
    if (st == DDL_OK) {
        st = save_to(s, d);
    }
    ddl_free(d);
    st = ddl_agree(s->comm, st);
    if (st == DDL_OK && step != NULL) {
        *step = s->durable_step;
    }
    return st;
}

// Reads the data cursor of a checkpoint's caller state. An empty object (a checkpoint
// of the model alone) means the start (0, 0). Otherwise epoch and batch must both be
// integers in range and, when the cursor names a seed, it must be the spec's.
static ddl_status parse_cursor(const ddl_session_t *s, const char *user, ddl_cursor *out)
{
    json_error_t err;
    json_t      *u = json_loads(user != NULL ? user : "{}", 0, &err);
    DDL_REQUIRE(u != NULL, DDL_ECORRUPT, "restore: the checkpoint's caller state is not JSON: %s",
                err.text);
    ddl_status st = DDL_OK;
    json_t    *e = json_object_get(u, "epoch"), *b = json_object_get(u, "batch");
    json_t    *rng  = json_object_get(u, "rng");
    json_t    *seed = json_is_object(rng) ? json_object_get(rng, "seed") : NULL;
    int64_t    spe  = steps_per_epoch(s);
    if (!json_is_object(u)) {
        st = ddl_set_error(DDL_ECORRUPT, "restore: the checkpoint's caller state is not an object");
    } else if (e == NULL && b == NULL && rng == NULL) {
        *out = (ddl_cursor){0, 0};
    } else if (!json_is_integer(e) || !json_is_integer(b)) {
        st = ddl_set_error(DDL_ECORRUPT,
                           "restore: the data cursor needs integer \"epoch\" and \"batch\"");
    } else if (json_integer_value(e) < 0 || json_integer_value(e) > CURSOR_EPOCH_MAX) {
        st = ddl_set_error(DDL_ECORRUPT, "restore: cursor epoch %lld outside [0, %lld]",
                           (long long)json_integer_value(e), (long long)CURSOR_EPOCH_MAX);
    } else if (json_integer_value(b) < 0 || (spe > 0 && json_integer_value(b) >= spe)) {
        st = ddl_set_error(
            DDL_ECORRUPT, "restore: cursor batch %lld outside [0, %lld) (batches per epoch)",
            (long long)json_integer_value(b), (long long)(spe > 0 ? spe : INT64_MAX));
    } else if (rng != NULL && (!json_is_object(rng) || (seed != NULL && !json_is_integer(seed)))) {
        st = ddl_set_error(DDL_ECORRUPT, "restore: the cursor's \"rng\" must be an object with an "
                                         "integer \"seed\"");
    } else if (seed != NULL &&
               (uint64_t)json_integer_value(seed) != ddl_spec_seed(ddl_model_spec(s->model))) {
        st = ddl_set_error(DDL_EINVAL,
                           "restore: the checkpoint was trained with seed %lld but the spec has "
                           "seed %llu; resuming would not continue the same run",
                           (long long)json_integer_value(seed),
                           (unsigned long long)ddl_spec_seed(ddl_model_spec(s->model)));
    } else {
        *out = (ddl_cursor){json_integer_value(e), json_integer_value(b)};
    }
    json_decref(u);
    return st;
}

// A copy of the model's whole state (weights, buffers, optimizer), to undo a restore
// whose cursor turns out to be unusable. Local.
typedef struct snapshot {
    ddl_named_tensor *nt;
    void             *names;
    int               n;
    ddl_tensor_t    **copy;
    int64_t           step;
} snapshot;

static void snapshot_free(snapshot *sn)
{
    for (int i = 0; sn->copy != NULL && i < sn->n; i++) {
        ddl_tensor_destroy(&sn->copy[i]);
    }
    ddl_free(sn->copy);
    ddl_free(sn->nt);
    ddl_free(sn->names);
    memset(sn, 0, sizeof *sn);
}

static ddl_status snapshot_take(ddl_model_t *m, snapshot *sn)
{
    memset(sn, 0, sizeof *sn);
    DDL_CHECK(ddl__model_named_state(m, true, &sn->nt, &sn->n, &sn->names));
    sn->step = ddl_model_step(m);
    sn->copy = ddl_calloc((size_t)(sn->n > 0 ? sn->n : 1), sizeof *sn->copy);
    DDL_REQUIRE(sn->copy != NULL, DDL_ENOMEM, "restore: out of memory for the undo copy");
    for (int i = 0; i < sn->n; i++) {
        const ddl_tensor_t *t = sn->nt[i].local;
        DDL_CHECK(ddl_tensor_create(t->dtype, &t->shape, &sn->copy[i]));
        DDL_CHECK(ddl_tensor_copy(t, sn->copy[i]));
    }
    return DDL_OK;
}

static void snapshot_put_back(ddl_model_t *m, const snapshot *sn)
{
    for (int i = 0; i < sn->n; i++) {
        ddl_tensor_copy(sn->copy[i], sn->nt[i].local);
    }
    ddl_optimizer_set_steps(ddl_model_optimizer(m), sn->step);
}

ddl_status ddl_session_restore(ddl_session_t *s, const char *path, int64_t step)
{
    ddl_status  st = DDL_OK;
    char        buf[4096];
    const char *pick = NULL;
    if (s->rank == 0) {
        if (path == NULL) {
            st = ddl_set_error(DDL_EINVAL, "restore: rank 0 must pass a path");
        } else if (step >= 0) {
            int len = snprintf(buf, sizeof buf, "%s/step-%09lld", path, (long long)step);
            st      = len > 0 && (size_t)len < sizeof buf
                          ? DDL_OK
                          : ddl_set_error(DDL_EINVAL, "restore: path too long");
            pick    = buf;
        } else {
            pick = path;
        }
    }
    DDL_CHECK(ddl_agree(s->comm, st));
    char *p = NULL;
    DDL_CHECK(bcast_string(s->comm, s->rank, pick, &p));
    snapshot sn;
    st         = ddl_agree(s->comm, snapshot_take(s->model, &sn));
    char *user = NULL;
    if (st == DDL_OK) {
        st = ddl_model_load(s->model, p, &user); // agreed inside
        if (st == DDL_OK) {
            ddl_cursor c = {0, 0};
            // Every rank holds the same caller state and reaches the same verdict; the
            // agreement only guards against the impossible.
            st = ddl_agree(s->comm, parse_cursor(s, user, &c));
            if (st == DDL_OK) {
                s->cur          = c;
                s->durable_step = ddl_model_step(s->model);
            } else {
                snapshot_put_back(s->model, &sn);
            }
        }
    }
    ddl_free(user);
    ddl_free(p);
    snapshot_free(&sn);
    return ddl_agree(s->comm, st);
}

// ---- training ------------------------------------------------------------------

// The accuracy of `hits` over `samples` samples: argmax hits per label, or for binary
// dense targets hits per value; -1 where none applies (other dense targets).
static double accuracy_of(const ddl_session_t *s, double hits, int64_t samples)
{
    if (samples <= 0) {
        return 0.0;
    }
    if (s->dense) {
        return s->binary ? hits / ((double)samples * (double)s->out_elems) : -1.0;
    }
    return hits / ((double)samples * (double)s->label_elems);
}

// The mean squared error of `sq_err` over `samples` samples (dense targets; -1 otherwise).
static double mse_of(const ddl_session_t *s, double sq_err, int64_t samples)
{
    return s->dense && samples > 0 ? sq_err / ((double)samples * (double)s->out_elems) : -1.0;
}

// One training step on rank 0's batch buffer (labels or dense targets): the loss, the
// hits (accuracy_of) and, for dense targets, the squared error. Collective.
static ddl_status train_buffer(ddl_session_t *s, double *loss, int64_t *hits, double *sq_err)
{
    size_t xb = s->rank == 0 ? (size_t)s->batch * s->sample_bytes : 0;
    if (!s->dense) {
        *sq_err = 0;
        return s->synth_local
                   ? ddl_model_train_step_local_labels(s->model, loss, hits)
                   : ddl_model_train_step(s->model, s->xbuf, xb, s->lbuf, s->batch, loss, hits);
    }
    size_t tb = s->rank == 0 ? (size_t)(s->batch * s->out_elems) * ddl_dtype_size(s->dt) : 0;
    ddl_dense_metrics dm = {0};
    ddl_status        st = s->h5 != NULL ? ddl_model_train_step_local(s->model, loss, &dm)
                                         : ddl_model_train_step_dense(s->model, s->xbuf, xb, s->tbuf, tb,
                                                                      s->batch, loss, &dm);
    *hits   = dm.hits;
    *sq_err = dm.sq_err;
    return st;
}

// Rank 0's plan of a train call: the number of steps (broadcast by the caller).
static ddl_status plan_train(const ddl_session_t *s, const ddl_train_request *req, int64_t *total)
{
    DDL_REQUIRE(req != NULL, DDL_EINVAL, "train: rank 0 must pass a request");
    DDL_REQUIRE(s->has_data, DDL_EBUSY, "train: no data (open a dataset first)");
    DDL_REQUIRE((req->steps > 0) != (req->epochs > 0) && req->steps >= 0 && req->epochs >= 0,
                DDL_EINVAL, "train: give exactly one of steps (%lld) and epochs (%lld), > 0",
                (long long)req->steps, (long long)req->epochs);
    int64_t spe = steps_per_epoch(s);
    DDL_REQUIRE(s->cur.batch >= 0 && s->cur.batch < spe, DDL_EINVAL,
                "train: the cursor's batch %lld is outside this data's [0, %lld) batches per "
                "epoch",
                (long long)s->cur.batch, (long long)spe);
    if (req->steps > 0) {
        *total = req->steps;
    } else {
        DDL_REQUIRE(req->epochs <= CURSOR_EPOCH_MAX - s->cur.epoch &&
                        req->epochs <= INT64_MAX / spe,
                    DDL_EINVAL, "train: %lld epochs is too many", (long long)req->epochs);
        *total = req->epochs * spe - s->cur.batch;
    }
    return DDL_OK;
}

void ddl_session_set_interlude(ddl_session_t *s, const ddl_interlude *il)
{
    ddl_interlude none = {NULL, NULL, NULL};
    s->il              = il != NULL && il->run != NULL ? *il : none;
}

ddl_status ddl_session_train(ddl_session_t *s, const ddl_train_request *req, ddl_progress_cb cb,
                             void *user_data, ddl_train_result *out)
{
    ddl_train_result res  = {.durable_step = s->durable_step};
    int64_t          plan = 0;
    ddl_status       st   = s->rank == 0 ? plan_train(s, req, &plan) : DDL_OK;
    DDL_CHECK(ddl_agree(s->comm, st));
    DDL_CHECK_MPI(MPI_Bcast(&plan, 1, MPI_INT64_T, 0, s->comm));
    const int64_t      spe  = steps_per_epoch(s);
    const int64_t      B    = s->batch;
    const int64_t      ntr  = s->n[DDL_SPLIT_TRAIN];
    const bool         shuf = ddl_spec_shuffle(ddl_model_spec(s->model));
    double             t0 = now(), te = t0, lsum = 0, esum = 0, sqsum = 0;
    int64_t            hits = 0, esteps = 0;
    for (int64_t done = 0; done < plan && st == DDL_OK;) {
        ddl_status fst = DDL_OK;
        if (s->rank == 0) {
            if (s->perm_epoch != s->cur.epoch) {
                if (shuf) {
                    ddl_dataset_shuffle(ntr, ddl_spec_seed(ddl_model_spec(s->model)),
                                        (uint64_t)s->cur.epoch, s->perm);
                } else {
                    for (int64_t i = 0; i < ntr; i++) {
                        s->perm[i] = i;
                    }
                }
                s->perm_epoch = s->cur.epoch;
            }
            fst = fill_batch(s, DDL_SPLIT_TRAIN, s->perm + s->cur.batch * B, B);
        }
        st = agree_fill(s, fst, DDL_SPLIT_TRAIN, s->rank == 0 ? s->perm + s->cur.batch * B : NULL,
                        B);
        if (st != DDL_OK) {
            break;
        }
        double  loss = 0, sq = 0;
        int64_t c    = 0;
        st           = train_buffer(s, &loss, &c, &sq);
        if (st != DDL_OK) {
            break;
        }
        done++;
        ddl_progress p = {.step            = ddl_model_step(s->model),
                          .epoch           = s->cur.epoch + 1,
                          .batch           = s->cur.batch + 1,
                          .steps_per_epoch = spe,
                          .done            = done,
                          .total           = plan,
                          .loss            = loss,
                          .accuracy        = accuracy_of(s, (double)c, B),
                          .mse             = mse_of(s, sq, B)};
        s->cur.batch++;
        if (s->cur.batch == spe) {
            s->cur.batch = 0;
            s->cur.epoch++;
            p.epoch_end = true;
        }
        lsum += loss;
        hits += c;
        sqsum += sq;
        esum += loss;
        esteps++;
        res.steps_done = done;
        p.mean_loss    = esum / (double)esteps;
        p.images_per_s = (double)(esteps * B) / (now() - te);
        if (s->ckpt_every > 0 && p.step % s->ckpt_every == 0) {
            bool durable = false;
            st           = periodic_save(s, &durable);
            if (st != DDL_OK) {
                break;
            }
            p.durable        = durable;
            res.durable_step = s->durable_step;
        }
        int stop = 0;
        if (s->rank == 0 && cb != NULL) {
            stop = cb(&p, user_data) ? 1 : 0;
        }
        if (s->rank == 0 && s->il.want != NULL && s->il.want(s->il.ud)) {
            stop |= 2;
        }
        // The callback's decision reaches every rank at this step boundary.
        if (MPI_Bcast(&stop, 1, MPI_INT, 0, s->comm) != MPI_SUCCESS) {
            st = ddl_set_error(DDL_EMPI, "train: broadcast of the stop flag failed");
            break;
        }
        if ((stop & 2) && s->il.run != NULL) {
            s->il.run(s->il.ud); // inference between steps: the weights stay as they are
            stop &= 1;
        }
        if (p.epoch_end) {
            esum   = 0;
            esteps = 0;
            te     = now();
        }
        if (stop && done < plan) {
            res.cancelled = true;
            break;
        }
    }
    double dt        = now() - t0;
    res.step         = ddl_model_step(s->model);
    res.mean_loss    = res.steps_done > 0 ? lsum / (double)res.steps_done : 0;
    res.accuracy     = accuracy_of(s, (double)hits, res.steps_done * B);
    res.mse          = mse_of(s, sqsum, res.steps_done * B);
    res.images_per_s = dt > 0 ? (double)(res.steps_done * B) / dt : 0;
    st               = ddl_agree(s->comm, st);
    if (out != NULL) {
        *out = res; // also on failure: the steps completed are kept
    }
    return st;
}

// Rank 0's check of the targets of `count` inline samples: exactly
// ddl_session_target_bytes(s, count) bytes (labels, or dense values in the spec's dtype).
// The values themselves are the model's to check (ranges, finiteness).
static ddl_status check_targets(const ddl_session_t *s, const char *what, const void *t,
                                size_t t_bytes, int64_t count)
{
    size_t need = ddl_session_target_bytes(s, count);
    DDL_REQUIRE(t != NULL, DDL_EINVAL, "%s: rank 0 must pass the %s", what,
                s->dense ? "targets" : "labels");
    DDL_REQUIRE(t_bytes == need, DDL_EINVAL, "%s: %lld samples of %lld %s need %zu bytes, got %zu",
                what, (long long)count, (long long)(s->dense ? s->out_elems : s->label_elems),
                s->dense ? (s->dt == DDL_F32 ? "FP32 target values" : "FP64 target values")
                         : "INT64 labels",
                need, t_bytes);
    return DDL_OK;
}

size_t ddl_session_target_bytes(const ddl_session_t *s, int64_t count)
{
    if (count <= 0) {
        return 0;
    }
    int64_t per  = s->dense ? s->out_elems : s->label_elems;
    size_t  item = s->dense ? ddl_dtype_size(s->dt) : sizeof(int64_t);
    return (uint64_t)count > SIZE_MAX / item / (size_t)per ? SIZE_MAX
                                                           : (size_t)(count * per) * item;
}

ddl_status ddl_session_step(ddl_session_t *s, const void *x, size_t x_bytes, const void *targets,
                            size_t t_bytes, int64_t count, ddl_step_result *out)
{
    ddl_status st = DDL_OK;
    if (s->rank == 0) {
        if (count != s->batch || x_bytes != (size_t)count * s->sample_bytes) {
            st = ddl_set_error(DDL_EINVAL,
                               "step: expected %lld samples in %zu bytes (the batch size), got "
                               "%lld samples in %zu bytes",
                               (long long)s->batch, (size_t)s->batch * s->sample_bytes,
                               (long long)count, x_bytes);
        } else {
            st = check_targets(s, "step", targets, t_bytes, count);
        }
    }
    DDL_CHECK(ddl_agree(s->comm, st));
    double  loss = 0, sq = 0;
    int64_t c    = 0;
    if (s->dense) {
        ddl_dense_metrics dm = {0};
        st = ddl_model_train_step_dense(s->model, x, x_bytes, targets, t_bytes, s->batch, &loss,
                                        &dm);
        c  = dm.hits;
        sq = dm.sq_err;
    } else {
        st = ddl_model_train_step(s->model, x, x_bytes, targets, s->batch, &loss, &c);
    }
    bool durable = false;
    if (st == DDL_OK && s->ckpt_every > 0 && ddl_model_step(s->model) % s->ckpt_every == 0) {
        st = ddl_agree(s->comm, periodic_save(s, &durable));
    } // otherwise st is the model's, which its step has agreed
    if (out != NULL) {
        *out =
            (ddl_step_result){ddl_model_step(s->model), loss, accuracy_of(s, (double)c, s->batch),
                              durable, mse_of(s, sq, s->batch)};
    }
    return st;
}

// ---- evaluation and prediction ---------------------------------------------------

// Segmentation: per-class intersection and union voxel counts summed over the batches of
// an evaluation (s->iou, allocated with the session: [4 * classes], totals then one
// batch's), for the mean IoU of the foreground classes (1..classes-1).
static void seg_iou_add(ddl_session_t *s)
{
    int64_t C = s->classes, *tot_i = s->iou, *tot_u = s->iou + C, *bi = tot_u + C, *bu = bi + C;
    if (s->iou != NULL && ddl_model_class_counts(s->model, bi, bu)) {
        for (int64_t k = 0; k < C; k++) {
            tot_i[k] += bi[k];
            tot_u[k] += bu[k];
        }
    }
}

// The mean over the foreground classes that occur (in labels or predictions) of
// intersection / union; -1 for a classifier, or when no foreground voxel occurs.
static double seg_iou_mean(const ddl_session_t *s)
{
    if (s->iou == NULL) {
        return -1.0;
    }
    double sum = 0;
    int    n   = 0;
    for (int k = 1; k < s->classes; k++) {
        int64_t in = s->iou[k], un = s->iou[s->classes + k];
        if (un > 0) {
            sum += (double)in / (double)un;
            n++;
        }
    }
    return n > 0 ? sum / n : -1.0;
}

ddl_status ddl_session_evaluate(ddl_session_t *s, ddl_split split, ddl_eval_result *out)
{
    ddl_status st = DDL_OK;
    if (s->rank == 0) {
        if (split != DDL_SPLIT_TRAIN && split != DDL_SPLIT_TEST) {
            st = ddl_set_error(DDL_EINVAL, "evaluate: unknown split %d", (int)split);
        } else if (!s->has_data) {
            st = ddl_set_error(DDL_EBUSY, "evaluate: no data (open a dataset first)");
        }
    }
    DDL_CHECK(ddl_agree(s->comm, st));
    int sp = (int)split;
    DDL_CHECK_MPI(MPI_Bcast(&sp, 1, MPI_INT, 0, s->comm));
    int64_t total = s->n[sp], hits = 0, seen = 0;
    double  lsum = 0, sqe = 0, sqt = 0;
    if (s->iou != NULL) {
        memset(s->iou, 0, sizeof(int64_t) * 2 * (size_t)s->classes);
    }
    for (int64_t start = 0; start < total && st == DDL_OK; start += s->batch) {
        int64_t    count = total - start < s->batch ? total - start : s->batch;
        ddl_status fst   = DDL_OK;
        if (s->rank == 0) {
            for (int64_t i = 0; i < count; i++) {
                s->idx[i] = start + i;
            }
            fst = fill_batch(s, sp, s->idx, count);
        }
        st = agree_fill(s, fst, sp, s->idx, count);
        if (st != DDL_OK) {
            break;
        }
        double  l = 0;
        int64_t c = 0;
        size_t  xb = s->rank == 0 ? (size_t)count * s->sample_bytes : 0;
        if (s->dense) {
            size_t tb = s->rank == 0 ? (size_t)(count * s->out_elems) * ddl_dtype_size(s->dt) : 0;
            ddl_dense_metrics dm = {0};
            st                   = s->h5 != NULL
                                       ? ddl_model_eval_local(s->model, count, &dm)
                                       : ddl_model_eval_dense(s->model, s->xbuf, xb, s->tbuf, tb, count, &dm);
            l  = dm.loss_sum;
            c  = dm.hits;
            sqe += dm.sq_err;
            sqt += dm.sq_target;
        } else if (s->synth_local) {
            st = ddl_model_eval_local_labels(s->model, count, &l, &c);
        } else {
            st = ddl_model_eval(s->model, s->xbuf, xb, s->lbuf, count, &l, &c);
        }
        lsum += l;
        hits += c;
        seen += count;
        seg_iou_add(s);
    }
    st = ddl_agree(s->comm, st);
    if (st == DDL_OK && out != NULL) {
        *out = (ddl_eval_result){seen,
                                 seen > 0 ? lsum / (double)seen : 0,
                                 accuracy_of(s, (double)hits, seen),
                                 seg_iou_mean(s),
                                 mse_of(s, sqe, seen),
                                 s->dense && sqt > 0 ? sqrt(sqe / sqt) : -1.0};
    }
    return st;
}

// Rank 0's check of inline samples: count >= 1 samples of exactly x_bytes.
static ddl_status check_inline(const ddl_session_t *s, const char *what, const void *x,
                               size_t x_bytes, int64_t count)
{
    DDL_REQUIRE(count >= 1, DDL_EINVAL, "%s: count %lld must be >= 1", what, (long long)count);
    DDL_REQUIRE(x != NULL, DDL_EINVAL, "%s: rank 0 must pass the samples", what);
    DDL_REQUIRE((uint64_t)count <= SIZE_MAX / s->sample_bytes &&
                    x_bytes == (size_t)count * s->sample_bytes,
                DDL_EINVAL, "%s: %lld samples of %zu bytes (%s) need %llu bytes, got %zu", what,
                (long long)count, s->sample_bytes, ddl_dtype_name(s->dt),
                (unsigned long long)count * (unsigned long long)s->sample_bytes, x_bytes);
    return DDL_OK;
}

ddl_status ddl_session_evaluate_batch(ddl_session_t *s, const void *x, size_t x_bytes,
                                      const void *targets, size_t t_bytes, int64_t count,
                                      ddl_eval_result *out)
{
    ddl_status st = DDL_OK;
    if (s->rank == 0) {
        st = check_inline(s, "evaluate", x, x_bytes, count);
        if (st == DDL_OK) {
            st = check_targets(s, "evaluate", targets, t_bytes, count);
        }
    }
    int64_t total = count; // rank 0's verdict and the row count in one broadcast
    DDL_CHECK(ddl_agree_root(s->comm, 0, st, &total, (int)sizeof total));
    if (s->iou != NULL) {
        memset(s->iou, 0, sizeof(int64_t) * 2 * (size_t)s->classes);
    }
    const size_t per  = ddl_session_target_bytes(s, 1);
    int64_t      hits = 0;
    double       lsum = 0, sqe = 0, sqt = 0;
    for (int64_t start = 0; start < total && st == DDL_OK; start += s->batch) {
        int64_t     n  = total - start < s->batch ? total - start : s->batch;
        bool        r0 = s->rank == 0;
        const char *xp = r0 ? (const char *)x + (size_t)start * s->sample_bytes : NULL;
        const char *tp = r0 ? (const char *)targets + (size_t)start * per : NULL;
        size_t      xb = r0 ? (size_t)n * s->sample_bytes : 0, tb = r0 ? (size_t)n * per : 0;
        double      l  = 0;
        int64_t     c  = 0;
        if (s->dense) {
            ddl_dense_metrics dm = {0};
            st                   = ddl_model_eval_dense(s->model, xp, xb, tp, tb, n, &dm);
            l                    = dm.loss_sum;
            c                    = dm.hits;
            sqe += dm.sq_err;
            sqt += dm.sq_target;
        } else {
            st = ddl_model_eval(s->model, xp, xb, (const int64_t *)(const void *)tp, n, &l, &c);
            seg_iou_add(s);
        }
        lsum += l;
        hits += c;
    }
    // The model's commands end agreed: st is the same on every rank without another round.
    if (st == DDL_OK && out != NULL) {
        *out = (ddl_eval_result){
            total,           lsum / (double)total,  accuracy_of(s, (double)hits, total),
            seg_iou_mean(s), mse_of(s, sqe, total), s->dense && sqt > 0 ? sqrt(sqe / sqt) : -1.0};
    }
    return st;
}

ddl_status ddl_session_predict(ddl_session_t *s, const void *x, size_t x_bytes, int64_t count,
                               void *logits, size_t logits_bytes)
{
    ddl_status st  = DDL_OK;
    size_t     row = (size_t)s->out_elems * ddl_dtype_size(s->dt);
    if (s->rank == 0) {
        st = check_inline(s, "predict", x, x_bytes, count);
        if (st == DDL_OK && (logits == NULL || (uint64_t)count > SIZE_MAX / row ||
                             logits_bytes < (size_t)count * row)) {
            st = ddl_set_error(DDL_EINVAL,
                               "predict: %lld rows of %lld outputs need %llu bytes, got "
                               "%zu%s",
                               (long long)count, (long long)s->out_elems,
                               (unsigned long long)count * (unsigned long long)row,
                               logits == NULL ? 0 : logits_bytes, logits == NULL ? " (NULL)" : "");
        }
    }
    // Rank 0's verdict and the row count in one broadcast; the model's commands end agreed,
    // so the loop's status is already the same on every rank.
    int64_t total = count;
    DDL_CHECK(ddl_agree_root(s->comm, 0, st, &total, (int)sizeof total));
    for (int64_t start = 0; start < total && st == DDL_OK; start += s->batch) {
        int64_t n = total - start < s->batch ? total - start : s->batch;
        if (s->rank == 0) {
            st = ddl_model_predict(s->model, (const char *)x + (size_t)start * s->sample_bytes,
                                   (size_t)n * s->sample_bytes, n,
                                   (char *)logits + (size_t)start * row, (size_t)n * row);
        } else {
            st = ddl_model_predict(s->model, NULL, 0, n, NULL, 0);
        }
    }
    return st;
}

ddl_status ddl_session_predict_samples(ddl_session_t *s, ddl_split split, int64_t count, void *x,
                                       size_t x_bytes, void *targets, size_t t_bytes, void *out,
                                       size_t out_bytes, int64_t *n)
{
    *n = 0;
    if (s->h5 != NULL || (split != DDL_SPLIT_TRAIN && split != DDL_SPLIT_TEST)) {
        return DDL_OK; // the same verdict on every rank: the data kind and the argument
    }
    ddl_status st = DDL_OK;
    int64_t    k  = 0;
    if (s->rank == 0) {
        k = count < s->batch ? count : s->batch;
        k = k < s->n[split] ? k : s->n[split];
        k = s->has_data && k > 0 ? k : 0;
        size_t tb = ddl_session_target_bytes(s, k);
        if (k > 0 && (x == NULL || x_bytes < (size_t)k * s->sample_bytes)) {
            st = ddl_set_error(DDL_EINVAL, "predict_samples: %lld samples need %zu bytes, got %zu",
                               (long long)k, (size_t)k * s->sample_bytes, x == NULL ? 0 : x_bytes);
        } else if (k > 0 && (targets == NULL || t_bytes < tb)) {
            st = ddl_set_error(
                DDL_EINVAL, "predict_samples: the %s of %lld samples need %zu bytes, got %zu",
                s->dense ? "targets" : "labels", (long long)k, tb, targets == NULL ? 0 : t_bytes);
        }
        for (int64_t i = 0; i < k && st == DDL_OK; i++) {
            s->idx[i] = i;
        }
        if (k > 0 && st == DDL_OK && s->synth_local) {
            // Generated whole on rank 0, straight into the caller's buffers.
            st = ddl_synth_batch(&s->synth_params, (int)split, s->idx, k, s->mean, s->std, s->dt, x,
                                 targets);
        } else if (k > 0 && st == DDL_OK) {
            st = fill_batch(s, (int)split, s->idx, k);
            if (st == DDL_OK) {
                memcpy(x, s->xbuf, (size_t)k * s->sample_bytes);
                memcpy(targets, s->dense ? s->tbuf : (void *)s->lbuf, tb);
            }
        }
    }
    DDL_CHECK(ddl_agree(s->comm, st));
    DDL_CHECK_MPI(MPI_Bcast(&k, 1, MPI_INT64_T, 0, s->comm));
    if (k == 0) {
        return DDL_OK;
    }
    *n = k;
    return ddl_session_predict(s, s->rank == 0 ? x : NULL,
                               s->rank == 0 ? (size_t)k * s->sample_bytes : 0, k, out, out_bytes);
}

// ---- weights -------------------------------------------------------------------

int ddl_session_nweights(const ddl_session_t *s)
{
    return s->nw;
}

const char *ddl_session_weight_name(const ddl_session_t *s, int i)
{
    return i >= 0 && i < s->nw ? s->w[i].name : NULL;
}

const ddl_shape *ddl_session_weight_shape(const ddl_session_t *s, int i)
{
    return i >= 0 && i < s->nw ? &s->w[i].global : NULL;
}

ddl_dtype ddl_session_weight_dtype(const ddl_session_t *s, int i)
{
    (void)i;
    return s->dt;
}

ddl_status ddl_session_gather_weight(ddl_session_t *s, int i, void *buf)
{
    ddl_status st = DDL_OK;
    if (s->rank == 0 && (i < 0 || i >= s->nw || buf == NULL)) {
        st = ddl_set_error(DDL_EINVAL, "gather_weight: index %d outside [0, %d) or no buffer", i,
                           s->nw);
    }
    DDL_CHECK(ddl_agree(s->comm, st));
    DDL_CHECK_MPI(MPI_Bcast(&i, 1, MPI_INT, 0, s->comm));
    const ddl_named_tensor *w = &s->w[i];
    ddl_tensor_t           *g = NULL;
    if (s->rank == 0) {
        st = ddl_tensor_view(s->dt, &w->global, buf, &g);
    }
    st = ddl_agree(s->comm, st);
    if (st == DDL_OK) {
        st = ddl_gather_boxes(ddl_model_comm(s->model), 0, w->local, &w->box, &w->global, g);
    }
    ddl_tensor_destroy(&g);
    return ddl_agree(s->comm, st);
}

ddl_status ddl_session_scatter_weights(ddl_session_t *s, const void *const *bufs)
{
    ddl_status st = DDL_OK;
    if (s->rank == 0 && bufs == NULL) {
        st = ddl_set_error(DDL_EINVAL, "scatter_weights: rank 0 must pass the buffers");
    }
    for (int i = 0; s->rank == 0 && st == DDL_OK && i < s->nw; i++) {
        if (bufs[i] == NULL) {
            st = ddl_set_error(DDL_EINVAL, "scatter_weights: no buffer for '%s'", s->w[i].name);
        }
    }
    DDL_CHECK(ddl_agree(s->comm, st));
    // Stage every weight first, so a failure part way changes nothing.
    ddl_tensor_t **stage = ddl_calloc((size_t)(s->nw > 0 ? s->nw : 1), sizeof *stage);
    st = stage != NULL ? DDL_OK : ddl_set_error(DDL_ENOMEM, "scatter_weights: out of memory");
    for (int i = 0; st == DDL_OK && i < s->nw; i++) {
        st = ddl_tensor_create(s->dt, &s->w[i].local->shape, &stage[i]);
    }
    st = ddl_agree(s->comm, st);
    for (int i = 0; st == DDL_OK && i < s->nw; i++) {
        const ddl_named_tensor *w = &s->w[i];
        ddl_tensor_t           *g = NULL;
        ddl_status              v = DDL_OK;
        if (s->rank == 0) {
            v = ddl_tensor_view(s->dt, &w->global, (void *)bufs[i], &g);
        }
        st = ddl_agree(s->comm, v);
        if (st == DDL_OK) {
            st = ddl_agree(s->comm, ddl_scatter_boxes(ddl_model_comm(s->model), 0, g, &w->box,
                                                      &w->global, stage[i]));
        }
        ddl_tensor_destroy(&g);
    }
    if (st == DDL_OK) {
        for (int i = 0; i < s->nw; i++) {
            ddl_tensor_copy(stage[i], s->w[i].local);
        }
    }
    for (int i = 0; stage != NULL && i < s->nw; i++) {
        ddl_tensor_destroy(&stage[i]);
    }
    ddl_free(stage);
    return ddl_agree(s->comm, st);
}
