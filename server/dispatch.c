// server/dispatch.c: the command path. Rank 0's main thread validates each queued request
// completely against the model, broadcasts one fixed-size command header to every rank,
// and then every rank calls the same ddl_session_* function (rank 0 with the payload
// pointers, the others with NULL: the session broadcasts what it needs and ends with all
// ranks agreeing on the status). Rank 0 then completes the gRPC call.
//
// The command protocol (one header per command, MPI_Ibcast of sizeof(ddld_cmd) bytes from
// rank 0 on the dispatcher's own duplicate of MPI_COMM_WORLD):
//   QUIT(code)  CREATE(flags REPLACE)  OPEN_DATA  STEP(count)  TRAIN(steps, epochs)
//   EVAL_SPLIT(split)  EVAL_BATCH(count)  PREDICT(count)  PULL  PUSH  SAVE  RESTORE(step)
//   DROP  RESUME
// During a TRAIN, at a step boundary, the session may lend the ranks (an interlude,
// ddl_session_set_interlude): rank 0 then sends PREDICT commands on the channel as usual,
// and RESUME hands the ranks back to the Train.
// A rejected request is never broadcast: the workers do not learn of it.
//
// Errors, one discipline with the engine's:
// - Memory: every allocation is ddl_malloc'd and checked. Rank 0 fails a call it cannot
//   allocate for before anything is broadcast (RESOURCE_EXHAUSTED, naming what); inside
//   a command the engine agrees on the status. A model rank 0 cannot describe after
//   CREATE is dropped on every rank (DROP).
// - MPI: the channel d->ctrl has MPI_ERRORS_RETURN and every call on it goes through
//   ddld_channel_check (channel.h). A failed channel call is unrecoverable for the
//   collective daemon (the ranks are out of step, with no channel to agree on): the rank
//   logs rank, call and MPI_Error_string and calls MPI_Abort with DDLD_EXIT_MPI (5). The
//   session's own communicators are the engine's (MPI_ERRORS_RETURN too, and a failed
//   call comes back as the command's status).
//
// Idle is idle: the workers wait for the next header with MPI_Ibcast + MPI_Test and a
// sleep that grows from 50 us to 10 ms with the time since the last command, so a quiet
// daemon costs almost no CPU while a client stepping steadily finds them within 50 us to
// 1 ms.
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "channel.h"
#include "ddl/base.h"
#include "ddl/estimate.h"
#include "ddl/session.h"
#include "ddl/tbevents.h"
#include "dispatch.h"
#include "inference/grpc_service.pb-c.h"
#include "log.h"
#include "methods.h"
#include "metrics.h"
#include "model_info.h"
#include "requests.h"
#include "service.h"
#include "shared.h"
#include "status_map.h"

// ---- the command header ------------------------------------------------------------------

// The command header every rank receives, one per command (fixed size, MPI_BYTE).
typedef struct ddld_cmd {
    int32_t op;    // DDLD_OP_*
    int32_t flags; // DDLD_CF_*
    int64_t arg[4];
} ddld_cmd;

enum {
    DDLD_OP_NONE = 0,
    DDLD_OP_QUIT,
    DDLD_OP_CREATE, // flags REPLACE
    DDLD_OP_OPEN_DATA,
    DDLD_OP_STEP,       // arg0 count
    DDLD_OP_TRAIN,      // arg0 steps, arg1 epochs
    DDLD_OP_EVAL_SPLIT, // arg0 split
    DDLD_OP_EVAL_BATCH, // arg0 count
    DDLD_OP_PREDICT,    // arg0 count
    DDLD_OP_PULL,
    DDLD_OP_PUSH,
    DDLD_OP_SAVE,
    DDLD_OP_RESTORE, // arg0 step (-1 latest)
    DDLD_OP_DROP,    // destroy the model (rank 0 could not describe a model just created)
    DDLD_OP_RESUME,  // ends an interlude: the Train takes its next step
};

enum { CF_REPLACE = 1 };

struct train_ctx;

static bool d_verbose; // DDLD_VERBOSE=1 (rank 0's logging of timings and refusals)

struct payload {
    const char            *text, *source, *path;
    const void            *x;
    size_t                 x_bytes;
    const void            *targets; // labels (INT64) or dense values (the model dtype)
    size_t                 t_bytes;
    void                  *out;
    size_t                 out_bytes;
    const ddld_model_info *mi; // PULL: where each weight goes in out
    const void *const     *bufs;
    ddl_step_result        step;
    ddl_train_result       train;
    ddl_eval_result        eval;
    int64_t                saved_step;
    struct train_ctx      *tctx; // TRAIN: the streaming call's context (rank 0)
};

struct ddld_dispatch {
    const ddld_config  *cfg;
    MPI_Comm            world, ctrl;
    int                 rank, size;
    ddl_session_options opts;
    ddl_session_t      *s;
    // rank 0 only
    ddld_service *svc;
    void (*poll)(void *);
    void    *ud;
    char     root_real[PATH_MAX];
    char     data_abs[PATH_MAX]; // the open dataset ("" : none)
    double   lut[256];           // UINT8 pixel -> normalized value
    void    *xbuf;               // converted inputs (grown, reused)
    size_t   xcap;
    void    *tbuf; // realigned labels, or dense targets in the model dtype
    size_t   tcap;
    // PullWeights snapshot: gathered once per weights version and shared read-only by every
    // stream that serves that version; rewritten only when no stream reads it.
    uint8_t       *pull;
    size_t         pull_cap;
    atomic_int     pull_readers;
    uint64_t       pull_version;     // weights_version the snapshot holds (0: none)
    uint64_t       weights_version;  // bumps with every command that may change weights
    bool           verbose;          // DDLD_VERBOSE=1: timings of the weight paths
    bool           ckpt_requested;   // SIGUSR1: checkpoint at the next step boundary or when idle
    double         t_popped;         // when the current job left the queue (DDLD_VERBOSE)
    bool           step_bytes_known; // ddld_g.step_bytes is measured for the current model
    bool           no_more_ckpt;     // Shutdown(checkpoint=false): no final or pending checkpoint
    ddl_tb_writer *tb;               // --tensorboard-dir (NULL: off, or stopped by a write error)
    // Where the current model checkpoints by default ("": no --checkpoint-dir): the
    // daemon's first model in --checkpoint-dir itself (what --resume reads), a model that
    // replaced another in --checkpoint-dir/models/<name>, so that no model ever writes
    // over another's durable checkpoints or moves its `latest`.
    char model_ckpt[PATH_MAX];
    char next_ckpt[PATH_MAX]; // the one of the model being created
    // Dynamic batching (rank 0): validated inference calls waiting to run as one command.
    struct pending *pend;
    double         *delays; // per pending call, filled when its command starts
    int             npend, pcap;
    int64_t         prows;      // rows pending
    bool            concurrent; // the last command answered more than one call
    bool            kept;       // the job being run joined the batch (not freed yet)
    bool            deferred;   // collecting at a step boundary: never run from join_batch
    void           *bx, *bo;    // the joined inputs and outputs (grown, reused)
    size_t          bxcap, bocap;
    // The running Train's answers (rank 0): when it started and the time its interludes
    // took, against --serve-during-train-share.
    double train_t0, il_spent;
};

// A validated Predict or ModelInfer call waiting for its batch.
struct pending {
    ddld_job      *job;
    const char    *datatype; // of raw: the model dtype's wire name or "UINT8"
    const uint8_t *raw;      // n samples (in the request, or in typed)
    void          *typed;    // ModelInfer's repacked typed contents (ddl_free), or NULL
    int64_t        n;
};

// ---- model info (rank 0) ------------------------------------------------------------------

// The spec's partitions into mi. Returns 0, or -1 when out of memory (what was allocated
// stays in mi for ddld_model_info_free; a spec the engine accepted always parses). jansson
// allocates on its own (malloc) and frees with json_decref.
static int info_partitions(ddld_model_info *mi, const char *spec_text)
{
    json_t *root  = json_loads(spec_text, 0, NULL);
    json_t *parts = root != NULL ? json_object_get(root, "partitions") : NULL;
    int     rc    = root != NULL ? 0 : -1;
    if (json_is_object(parts)) {
        size_t n        = json_object_size(parts);
        mi->part_name   = ddl_calloc(n + 1, sizeof *mi->part_name);
        mi->part_ranks  = ddl_calloc(n + 1, sizeof *mi->part_ranks);
        mi->part_shape  = ddl_calloc(n + 1, sizeof *mi->part_shape);
        mi->part_nranks = ddl_calloc(n + 1, sizeof *mi->part_nranks);
        mi->part_ndims  = ddl_calloc(n + 1, sizeof *mi->part_ndims);
        if (mi->part_name == NULL || mi->part_ranks == NULL || mi->part_shape == NULL ||
            mi->part_nranks == NULL || mi->part_ndims == NULL) {
            json_decref(root);
            return -1;
        }
        const char *key;
        json_t     *val;
        int         i = 0;
        json_object_foreach(parts, key, val)
        {
            json_t *r = json_object_get(val, "ranks"), *sh = json_object_get(val, "shape");
            size_t  nr        = json_is_array(r) ? json_array_size(r) : 0;
            size_t  nd        = json_is_array(sh) ? json_array_size(sh) : 0;
            mi->npartitions   = i + 1; // entry i is freed from here on, whatever fails
            mi->part_name[i]  = ddl_strdup(key);
            mi->part_ranks[i] = ddl_calloc(nr + 1, sizeof(int32_t));
            mi->part_shape[i] = ddl_calloc(nd + 1, sizeof(int64_t));
            if (mi->part_name[i] == NULL || mi->part_ranks[i] == NULL ||
                mi->part_shape[i] == NULL) {
                rc = -1;
                break;
            }
            for (size_t k = 0; k < nr; k++) {
                mi->part_ranks[i][k] = (int32_t)json_integer_value(json_array_get(r, k));
            }
            for (size_t k = 0; k < nd; k++) {
                mi->part_shape[i][k] = json_integer_value(json_array_get(sh, k));
            }
            mi->part_nranks[i] = (int)nr;
            mi->part_ndims[i]  = (int)nd;
            i++;
        }
    }
    json_decref(root);
    return rc;
}

// The spec's layers into mi, each with the index of its output's partition among
// mi->part_name (after info_partitions). Returns 0, or -1 when out of memory.
static int info_layers(ddld_model_info *mi, const ddl_spec_t *spec)
{
    int n      = ddl_spec_num_layers(spec);
    mi->layers = ddl_calloc((size_t)n + 1, sizeof *mi->layers);
    if (mi->layers == NULL) {
        return -1;
    }
    mi->nlayers = n;
    for (int i = 0; i < n; i++) {
        const char      *name, *type, *part;
        ddld_layer_info *L = &mi->layers[i];
        ddl_spec_layer_output(spec, i, &name, &type, &L->y, &part);
        snprintf(L->name, sizeof L->name, "%s", name);
        snprintf(L->type, sizeof L->type, "%s", type);
        L->part = -1;
        for (int k = 0; k < mi->npartitions; k++) {
            if (strcmp(mi->part_name[k], part) == 0) {
                L->part = k;
            }
        }
    }
    return 0;
}

// The name a model is served and checkpointed under: the caller's, else the spec's
// top-level "name", else "model".
static const char *served_name(const char *name, const ddl_spec_t *spec)
{
    if (name != NULL && name[0] != '\0') {
        return name;
    }
    return spec != NULL && ddl_spec_name(spec)[0] != '\0' ? ddl_spec_name(spec) : "model";
}

// Publishes the current model (or none) in the shared snapshot. Rank 0. Returns 0, or -1
// when rank 0 is out of memory for the model's description (the snapshot is then left as
// it was). Without a model it allocates nothing and cannot fail.
static int publish_model(ddld_dispatch *d, const char *name)
{
    ddld_model_info mi;
    memset(&mi, 0, sizeof mi);
    if (d->s != NULL) {
        const ddl_spec_t *spec = ddl_model_spec(ddl_session_model(d->s));
        mi.has_model           = true;
        snprintf(mi.name, sizeof mi.name, "%s", served_name(name, spec));
        mi.dtype        = ddl_spec_dtype(spec);
        mi.batch_size   = ddl_spec_batch_size(spec);
        mi.input        = ddl_spec_input_shape(spec);
        mi.sample_numel = ddl_shape_numel(&mi.input);
        mi.classes      = ddl_spec_num_classes(spec);
        mi.output            = ddl_spec_output_shape(spec);
        mi.out_elems         = ddl_spec_output_elems(spec);
        mi.dense             = ddl_spec_dense_targets(spec);
        mi.target            = mi.output;
        if (!mi.dense) { // class indices: one per sample, or one per output voxel
            mi.target.ndim--;
            memmove(mi.target.d, mi.target.d + 1, sizeof(int64_t) * (size_t)mi.target.ndim);
        }
        snprintf(mi.loss, sizeof mi.loss, "%s", ddl_spec_loss_name(spec));
        ddl_spec_normalize(spec, &mi.norm_mean, &mi.norm_std);
        for (int v = 0; v < 256; v++) {
            d->lut[v] = ((double)v / 255.0 - mi.norm_mean) / mi.norm_std;
        }
        int nw     = ddl_session_nweights(d->s);
        mi.weights = ddl_calloc((size_t)nw + 1, sizeof *mi.weights);
        if (mi.weights == NULL) {
            return -1;
        }
        mi.nweights = nw;
        size_t off  = 0;
        for (int i = 0; i < mi.nweights; i++) {
            ddld_weight_info *w = &mi.weights[i];
            w->name             = ddl_strdup(ddl_session_weight_name(d->s, i));
            if (w->name == NULL) {
                ddld_model_info_free(&mi);
                return -1;
            }
            w->dtype  = ddl_session_weight_dtype(d->s, i);
            w->shape  = *ddl_session_weight_shape(d->s, i);
            int64_t n = ddl_shape_numel(&w->shape);
            w->bytes  = (size_t)n * ddl_dtype_size(w->dtype);
            w->offset = off;
            off += (w->bytes + 63) / 64 * 64;
            mi.num_parameters += n;
        }
        mi.weights_bytes = off;
        if (info_partitions(&mi, ddl_spec_text(spec)) != 0 || info_layers(&mi, spec) != 0) {
            ddld_model_info_free(&mi);
            return -1;
        }
    } else if (name != NULL) {
        snprintf(mi.name, sizeof mi.name, "%s", name);
    }
    pthread_mutex_lock(&ddld_g.mu);
    if (!mi.has_model && name == NULL) {
        snprintf(mi.name, sizeof mi.name, "%s", ddld_g.info.name);
    }
    ddld_model_info_free(&ddld_g.info);
    ddld_g.info = mi;
    ddld_g.model_gen++;
    pthread_mutex_unlock(&ddld_g.mu);
    return 0;
}

// Mirrors the session's counters into the snapshot. Rank 0.
static void publish_progress(ddld_dispatch *d)
{
    if (d->s == NULL) {
        return;
    }
    ddl_cursor cur     = ddl_session_cursor(d->s);
    int64_t    step    = ddl_model_step(ddl_session_model(d->s));
    int64_t    durable = ddl_session_durable_step(d->s);
    pthread_mutex_lock(&ddld_g.mu);
    ddld_g.step         = step;
    ddld_g.durable_step = durable;
    ddld_g.epoch        = cur.epoch;
    ddld_g.batch        = cur.batch;
    pthread_mutex_unlock(&ddld_g.mu);
}

static void clear_batches(void)
{
    pthread_mutex_lock(&ddld_g.mu);
    while (ddld_g.batch_count > 0) {
        protobuf_c_message_free_unpacked(&ddld_g.batches[ddld_g.batch_head]->base, NULL);
        ddld_g.batch_head = (ddld_g.batch_head + 1) % ddld_g.batch_cap;
        ddld_g.batch_count--;
    }
    pthread_mutex_unlock(&ddld_g.mu);
}

// ---- the collective part (every rank) -------------------------------------------------------

static void tb_train(ddld_dispatch *d, int64_t step, double loss, double accuracy, double mse,
                     double images_per_s, bool flush);
static bool progress_cb(const ddl_progress *p, void *ud);
static void pending_free(struct pending *p);
static bool interlude_want(void *ud);
static void interlude_run0(void *ud);
static void interlude_run(void *ud);

// HDF5 data, which every rank reads its own boxes of: rank 0 logs the bytes each rank has
// read from the open file so far (after a Train or an evaluation of a split), the check
// that no rank reads it whole. Every rank (the command is collective); a failed gather
// only loses the line.
static void log_data_read(ddld_dispatch *d)
{
    enum { MAX_LOGGED = 512 };
    uint64_t mine = ddl_session_data_bytes_read(d->s), all[MAX_LOGGED];
    if (d->size > MAX_LOGGED ||
        MPI_Gather(&mine, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, 0, d->world) != MPI_SUCCESS ||
        d->rank != 0) {
        return;
    }
    uint64_t sum = 0;
    for (int r = 0; r < d->size; r++) {
        sum += all[r];
    }
    if (sum == 0) {
        return; // not HDF5 data
    }
    char   line[MAX_LOGGED * 24];
    size_t o = 0;
    for (int r = 0; r < d->size && o < sizeof line; r++) {
        o += (size_t)snprintf(line + o, sizeof line - o, "%s%d %llu", r ? ", " : "", r,
                              (unsigned long long)all[r]);
    }
    ddld_log("data read from the file per rank (bytes): %s", line);
}

// Rank 0: the dashboard's view of the current model, from the snapshot.
static ddld_dash_model dash_model(void)
{
    pthread_mutex_lock(&ddld_g.mu);
    ddld_dash_model dm = {.dt    = ddld_g.info.dtype,
                          .in    = ddld_g.info.input,
                          .out   = ddld_g.info.output,
                          .dense = ddld_g.info.dense};
    pthread_mutex_unlock(&ddld_g.mu);
    return dm;
}

// Rank 0: a buffer of the dashboard's, ddl_malloc'd, its size in *got (NULL and 0 when out of
// memory: the session then refuses rank 0's empty buffer, on every rank).
static void *dash_alloc(size_t bytes, size_t *got)
{
    void *b = ddl_malloc(bytes);
    *got    = b != NULL ? bytes : 0;
    return b;
}

// The dashboard's predictions (--metrics-listen, the same on every rank): after an Evaluate
// of a split, the model's outputs for the split's first DDLD_DASH_SAMPLES samples, kept by
// metrics.c with the samples and their targets. Every rank; collective. A failure (agreed by
// the session) is logged and changes nothing of the Evaluate's answer.
static void eval_samples(ddld_dispatch *d, ddl_split split)
{
    enum { K = DDLD_DASH_SAMPLES };
    void           *x = NULL, *t = NULL, *out = NULL;
    size_t          xb = 0, tb = 0, ob = 0;
    int64_t         n  = 0;
    ddld_dash_model dm = {0};
    if (d->rank == 0) {
        dm        = dash_model();
        size_t es = ddl_dtype_size(dm.dt);
        x         = dash_alloc((size_t)(K * ddl_shape_numel(&dm.in)) * es, &xb);
        t         = dash_alloc(ddl_session_target_bytes(d->s, K), &tb);
        out       = dash_alloc((size_t)(K * ddl_shape_numel(&dm.out)) * es, &ob);
    }
    ddl_status st = ddl_session_predict_samples(d->s, split, K, x, xb, t, tb, out, ob, &n);
    if (st != DDL_OK && d->rank == 0) {
        ddld_log("dashboard: no predictions of the evaluated samples: %s", ddl_last_error());
    } else if (d->rank == 0 && n > 0) {
        ddld_metrics_eval_samples(split == DDL_SPLIT_TEST ? "test" : "train", &dm, x, t, out, n);
    }
    ddl_free(x);
    ddl_free(t);
    ddl_free(out);
}

// The same after an Evaluate of `count` inline samples (p->x, p->targets on rank 0): the
// model's outputs for the first DDLD_DASH_SAMPLES of them (ddl_session_predict), split
// "inline". Every rank; collective; a failure is logged and changes nothing.
static void eval_inline_samples(ddld_dispatch *d, const struct payload *p, int64_t count)
{
    int64_t         k   = count < DDLD_DASH_SAMPLES ? count : DDLD_DASH_SAMPLES;
    void           *out = NULL;
    size_t          ob = 0, xb = 0;
    ddld_dash_model dm = {0};
    if (d->rank == 0) {
        dm        = dash_model();
        size_t es = ddl_dtype_size(dm.dt);
        xb        = (size_t)(k * ddl_shape_numel(&dm.in)) * es;
        out       = dash_alloc((size_t)(k * ddl_shape_numel(&dm.out)) * es, &ob);
    }
    ddl_status st = ddl_session_predict(d->s, d->rank == 0 ? p->x : NULL, xb, k, out, ob);
    if (st != DDL_OK && d->rank == 0) {
        ddld_log("dashboard: no predictions of the evaluated samples: %s", ddl_last_error());
    } else if (d->rank == 0) {
        ddld_metrics_eval_samples("inline", &dm, p->x, p->targets, out, k);
    }
    ddl_free(out);
}

static ddl_status execute(ddld_dispatch *d, const ddld_cmd *cmd, struct payload *p)
{
    ddl_status st = DDL_OK;
    switch (cmd->op) {
    case DDLD_OP_CREATE: {
        ddl_session_t *ns = NULL;
        st = ddl_session_create(d->world, p->text, p->source != NULL ? p->source : "CreateModel",
                                &d->opts, &ns);
        if (st == DDL_OK) {
            ddl_session_destroy(&d->s);
            d->s = ns;
        }
        break;
    }
    case DDLD_OP_OPEN_DATA: // arg 1: the spec's generated data
        st = cmd->arg[0] ? ddl_session_open_synthetic(d->s) : ddl_session_open_data(d->s, p->path);
        break;
    case DDLD_OP_STEP:
        st =
            ddl_session_step(d->s, p->x, p->x_bytes, p->targets, p->t_bytes, cmd->arg[0], &p->step);
        break;
    case DDLD_OP_TRAIN: {
        ddl_train_request r  = {.steps = cmd->arg[0], .epochs = cmd->arg[1]};
        ddl_interlude     il = {d->rank == 0 ? interlude_want : NULL,
                            d->rank == 0 ? interlude_run0 : interlude_run, d};
        ddl_session_set_interlude(d->s, d->cfg->serve_during_train ? &il : NULL);
        st = ddl_session_train(d->s, &r, d->rank == 0 ? progress_cb : NULL, d->rank == 0 ? p : NULL,
                               &p->train);
        ddl_session_set_interlude(d->s, NULL);
        log_data_read(d);
        break;
    }
    case DDLD_OP_EVAL_SPLIT:
        st = ddl_session_evaluate(d->s, (ddl_split)cmd->arg[0], &p->eval);
        log_data_read(d);
        if (st == DDL_OK && d->cfg->metrics_listen != NULL) {
            eval_samples(d, (ddl_split)cmd->arg[0]);
        }
        break;
    case DDLD_OP_EVAL_BATCH:
        st = ddl_session_evaluate_batch(d->s, p->x, p->x_bytes, p->targets, p->t_bytes, cmd->arg[0],
                                        &p->eval);
        if (st == DDL_OK && d->cfg->metrics_listen != NULL) {
            eval_inline_samples(d, p, cmd->arg[0]);
        }
        break;
    case DDLD_OP_PREDICT:
        st = ddl_session_predict(d->s, p->x, p->x_bytes, cmd->arg[0], p->out, p->out_bytes);
        break;
    case DDLD_OP_PULL: {
        int n = ddl_session_nweights(d->s);
        for (int i = 0; i < n && st == DDL_OK; i++) {
            uint8_t *dst = p->mi != NULL ? (uint8_t *)p->out + p->mi->weights[i].offset : NULL;
            st           = ddl_session_gather_weight(d->s, i, dst);
        }
        break;
    }
    case DDLD_OP_PUSH:
        st = ddl_session_scatter_weights(d->s, p->bufs);
        break;
    case DDLD_OP_SAVE:
        st = ddl_session_save(d->s, p->path, &p->saved_step);
        break;
    case DDLD_OP_RESTORE:
        st = ddl_session_restore(d->s, p->path, cmd->arg[0]);
        break;
    case DDLD_OP_DROP:
        ddl_session_destroy(&d->s);
        break;
    default:
        break;
    }
    return st;
}

// Every rank, after each command: the bytes a training step of the current model moves,
// summed over ranks (ddl_model_traffic_local, one MPI_Reduce onto rank 0), for GetStatus
// and the metrics. Measured once per model, after its first good training command: the
// plans and so the bytes never change (docs/SCALING.md). Every rank sees the same
// command, status and step count, so all take part in the reduction or none.
static void note_step_bytes(ddld_dispatch *d, const ddld_cmd *cmd, const struct payload *p,
                            ddl_status st)
{
    if (cmd->op == DDLD_OP_CREATE && st == DDL_OK) {
        d->step_bytes_known = false;
        if (d->rank == 0) {
            pthread_mutex_lock(&ddld_g.mu);
            ddld_g.step_bytes = 0;
            pthread_mutex_unlock(&ddld_g.mu);
        }
        return;
    }
    bool trained = (cmd->op == DDLD_OP_STEP || (cmd->op == DDLD_OP_TRAIN && p->train.steps_done > 0));
    if (!trained || st != DDL_OK || d->step_bytes_known || d->s == NULL) {
        return;
    }
    ddl_model_t     *m    = ddl_session_model(d->s);
    int              n    = ddl_model_traffic_rows(m);
    ddl_traffic_row *rows = ddl_calloc((size_t)n, sizeof *rows);
    uint64_t         mine = 0, all = 0;
    if (rows != NULL && ddl_model_traffic_local(m, rows, n) == DDL_OK) {
        for (int i = 0; i < n; i++) {
            mine += ddl_traffic_total(&rows[i].fwd).sent + ddl_traffic_total(&rows[i].bwd).sent;
        }
    }
    ddl_free(rows); // a rank short of memory contributes 0: the figure is informative only
    ddld_channel_check(MPI_Reduce(&mine, &all, 1, MPI_UINT64_T, MPI_SUM, 0, d->ctrl), "MPI_Reduce");
    d->step_bytes_known = true;
    if (d->rank == 0) {
        pthread_mutex_lock(&ddld_g.mu);
        ddld_g.step_bytes = (int64_t)all;
        pthread_mutex_unlock(&ddld_g.mu);
    }
}

// Rank 0: the header to everyone, then the same call as the workers.
static ddl_status run(ddld_dispatch *d, int op, int flags, int64_t a0, int64_t a1,
                      struct payload *p)
{
    ddld_cmd cmd;
    memset(&cmd, 0, sizeof cmd);
    cmd.op     = op;
    cmd.flags  = flags;
    cmd.arg[0] = a0;
    cmd.arg[1] = a1;
    MPI_Request req;
    ddld_channel_check(MPI_Ibcast(&cmd, (int)sizeof cmd, MPI_BYTE, 0, d->ctrl, &req), "MPI_Ibcast");
    ddld_channel_check(MPI_Wait(&req, MPI_STATUS_IGNORE), "MPI_Wait");
    if (op == DDLD_OP_CREATE || op == DDLD_OP_STEP || op == DDLD_OP_TRAIN || op == DDLD_OP_PUSH ||
        op == DDLD_OP_RESTORE) {
        d->weights_version++;
    }
    ddl_status st = execute(d, &cmd, p);
    if (op != DDLD_OP_QUIT && op != DDLD_OP_RESUME) {
        note_step_bytes(d, &cmd, p, st); // the workers do the same after each command
        ddld_metrics_collect(d->ctrl);
    }
    return st;
}

// The sleep between two tests of the pending broadcast, by the time since the last command
// ended: 50 us at first (a client stepping back to back), then up to 1 ms for the next
// 100 ms (a client preparing its next batch), then up to 10 ms (idle: ~100 wake-ups/s).
static long worker_nap_ns(long nap_ns, double idle_s)
{
    long cap = idle_s < 0.002 ? 50000 : idle_s < 0.1 ? 1000000 : 10000000;
    nap_ns *= 2;
    return nap_ns > cap ? cap : nap_ns < 50000 ? 50000 : nap_ns;
}

// Ranks > 0: the next command header from rank 0.
static void recv_cmd(ddld_dispatch *d, ddld_cmd *cmd)
{
    MPI_Request req;
    int         done   = 0;
    long        nap_ns = 50000;
    double      t0     = MPI_Wtime();
    ddld_channel_check(MPI_Ibcast(cmd, (int)sizeof *cmd, MPI_BYTE, 0, d->ctrl, &req), "MPI_Ibcast");
    for (;;) {
        ddld_channel_check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "MPI_Test");
        if (done) {
            return;
        }
        struct timespec ts = {.tv_sec = 0, .tv_nsec = nap_ns};
        nanosleep(&ts, NULL);
        nap_ns = worker_nap_ns(nap_ns, MPI_Wtime() - t0);
    }
}

int ddld_dispatch_worker_loop(ddld_dispatch *d)
{
    for (;;) {
        ddld_cmd cmd;
        recv_cmd(d, &cmd);
        if (cmd.op == DDLD_OP_QUIT) {
            return (int)cmd.arg[0];
        }
        struct payload p;
        memset(&p, 0, sizeof p);
        ddl_status st = execute(d, &cmd, &p);
        note_step_bytes(d, &cmd, &p, st);
        ddld_metrics_collect(d->ctrl);
    }
}

void ddld_dispatch_quit(ddld_dispatch *d, int code)
{
    struct payload p;
    memset(&p, 0, sizeof p);
    run(d, DDLD_OP_QUIT, 0, code, 0, &p);
}

// ---- lifecycle ---------------------------------------------------------------------------------

ddld_dispatch *ddld_dispatch_create(const ddld_config *cfg, MPI_Comm world)
{
    // Every local allocation first, then one agreement, so that a rank short of memory
    // fails start-up on every rank instead of leaving the others in MPI_Comm_dup.
    int rank, size;
    MPI_Comm_rank(world, &rank);
    MPI_Comm_size(world, &size);
    ddld_dispatch      *d       = ddl_calloc(1, sizeof *d);
    Distdl__V1__Batch **batches = NULL;
    if (d != NULL && rank == 0) {
        batches = ddl_calloc((size_t)cfg->queue, sizeof *batches);
    }
    int bad = d == NULL || (rank == 0 && batches == NULL), any_bad = 1;
    if (bad) {
        ddld_log("start-up: out of memory for the dispatcher%s",
                 rank == 0 ? " and its batch queue" : "");
    }
    ddl_tb_writer *tb = NULL;
    if (!bad && rank == 0 && cfg->tensorboard_dir != NULL &&
        ddl_tb_open(cfg->tensorboard_dir, &tb) != DDL_OK) {
        ddld_log("start-up: --tensorboard-dir %s: %s", cfg->tensorboard_dir, ddl_last_error());
        bad = 1;
    }
    MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_MAX, world);
    if (any_bad) {
        ddl_tb_close(tb);
        ddl_free(batches);
        ddl_free(d);
        return NULL;
    }
    if (tb != NULL) {
        ddld_log("TensorBoard events: %s", ddl_tb_path(tb));
    }
    d->tb    = tb;
    d->cfg   = cfg;
    d->world = world;
    d->rank  = rank;
    d->size  = size;
    ddld_channel_check(MPI_Comm_dup(world, &d->ctrl), "MPI_Comm_dup");
    ddld_channel_init(d->ctrl, rank);
    d->opts.checkpoint_dir   = cfg->checkpoint_dir;
    d->opts.checkpoint_every = cfg->checkpoint_every;
    atomic_init(&d->pull_readers, 0);
    d->verbose = getenv("DDLD_VERBOSE") != NULL && getenv("DDLD_VERBOSE")[0] == '1';
    d_verbose  = d->verbose && d->rank == 0;
    if (d->rank == 0) {
        if (realpath(cfg->data_root, d->root_real) == NULL) {
            snprintf(d->root_real, sizeof d->root_real, "%s", cfg->data_root);
        }
        pthread_mutex_lock(&ddld_g.mu);
        ddld_g.world_size = d->size;
        ddld_g.batch_cap  = cfg->queue;
        ddld_g.batches    = batches;
        pthread_mutex_unlock(&ddld_g.mu);
    }
    return d;
}

void ddld_dispatch_destroy(ddld_dispatch **pd)
{
    ddld_dispatch *d = *pd;
    if (d == NULL) {
        return;
    }
    ddl_session_destroy(&d->s);
    ddl_tb_close(d->tb);
    ddld_channel_check(MPI_Comm_free(&d->ctrl), "MPI_Comm_free");
    if (d->rank == 0) {
        clear_batches();
        pthread_mutex_lock(&ddld_g.mu);
        ddld_model_info_free(&ddld_g.info);
        ddl_free(ddld_g.batches);
        ddld_g.batches = NULL;
        pthread_mutex_unlock(&ddld_g.mu);
    }
    for (int i = 0; i < d->npend; i++) { // none unless shutdown skipped the last batch
        pending_free(&d->pend[i]);
    }
    ddl_free(d->pend);
    ddl_free(d->delays);
    ddl_free(d->bx);
    ddl_free(d->bo);
    ddl_free(d->xbuf);
    ddl_free(d->tbuf);
    *pd = NULL;
    if (atomic_load(&d->pull_readers) != 0) {
        // gRPC may release a stream's last chunk after its own shutdown returned: leave the
        // snapshot and its counter alive for that release (the process is exiting).
        return;
    }
    ddl_free(d->pull);
    ddl_free(d);
}

void ddld_dispatch_set_hooks(ddld_dispatch *d, ddld_service *svc, void (*poll)(void *), void *ud)
{
    d->svc  = svc;
    d->poll = poll;
    d->ud   = ud;
}

// ---- rank 0 helpers ------------------------------------------------------------------------

static void *grow(void **buf, size_t *cap, size_t need)
{
    if (*cap < need) {
        ddl_free(*buf);
        *buf = ddl_malloc(need); // 64-byte aligned
        *cap = *buf != NULL ? need : 0;
    }
    return *buf;
}

// numel values of a validated input (raw, of datatype) into dst in the model dtype.
static void convert_input(ddld_dispatch *d, const char *datatype, const uint8_t *raw, int64_t numel,
                          void *dst)
{
    const ddld_model_info *mi = &ddld_g.info; // stable: only this thread replaces it
    if (strcmp(datatype, "UINT8") != 0) {
        memcpy(dst, raw, (size_t)numel * ddl_dtype_size(mi->dtype));
    } else if (mi->dtype == DDL_F64) {
        double *o = dst;
        for (int64_t i = 0; i < numel; i++) {
            o[i] = d->lut[raw[i]];
        }
    } else {
        float *o = dst;
        for (int64_t i = 0; i < numel; i++) {
            o[i] = (float)d->lut[raw[i]];
        }
    }
}

// The model-dtype view of a validated input: the request's own bytes when they already are
// the model dtype (and aligned), otherwise converted once into a reused buffer.
static const void *input_data(ddld_dispatch *d, const char *datatype, const uint8_t *raw,
                              int64_t numel, size_t *bytes)
{
    size_t item = ddl_dtype_size(ddld_g.info.dtype);
    *bytes      = (size_t)numel * item;
    if (strcmp(datatype, "UINT8") != 0 && ((uintptr_t)raw % item) == 0) {
        return raw;
    }
    void *x = grow(&d->xbuf, &d->xcap, *bytes);
    if (x != NULL) {
        convert_input(d, datatype, raw, numel, x);
    }
    return x;
}

// The engine's view of a validated batch's targets (ddld_batch_check): its labels, or its
// dense values in the model dtype; the request's own bytes when they already are that and
// aligned, otherwise realigned or converted once into a reused buffer. NULL: no memory.
static const void *target_data(ddld_dispatch *d, const Distdl__V1__Batch *b, size_t *bytes)
{
    const Distdl__V1__Tensor *t     = b->targets != NULL ? b->targets : b->labels;
    const ddld_model_info    *mi    = &ddld_g.info; // stable: only this thread replaces it
    bool                      label = !mi->dense;   // INT64, validated
    bool                      same  = label || strcmp(t->datatype, ddld_dtype_wire(mi->dtype)) == 0;
    size_t                    item  = label ? sizeof(int64_t) : ddl_dtype_size(mi->dtype);
    size_t                    numel = t->raw.len / (same ? item : (item == 8 ? 4 : 8));
    *bytes                          = numel * item;
    if (same && ((uintptr_t)t->raw.data % item) == 0) {
        return t->raw.data;
    }
    void *o = grow(&d->tbuf, &d->tcap, *bytes);
    if (o == NULL) {
        return NULL;
    }
    if (same) {
        memcpy(o, t->raw.data, *bytes);
        return o;
    }
    // FP32 values for an FP64 model, or FP64 values for an FP32 one.
    for (size_t i = 0; i < numel; i++) {
        double v = ddl_value_at(t->raw.data, (int64_t)i, item == 8 ? 4 : 8);
        if (item == 8) {
            ((double *)o)[i] = v;
        } else {
            ((float *)o)[i] = (float)v;
        }
    }
    return o;
}

static void fail(ddld_job *job, grpc_status_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fail(ddld_job *job, grpc_status_code code, const char *fmt, ...)
{
    char    msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (d_verbose) {
        ddld_log("refused: %s %s", ddld_grpc_code_name(code), msg);
    }
    if (job->call != NULL) {
        ddld_call_finish(job->call, code, msg, NULL);
    }
}

// The engine's status as the call's status, with the agreed message.
static void fail_engine(ddld_job *job, const char *what, ddl_status st)
{
    const char *m = ddl_last_error();
    fail(job, ddld_status_to_grpc(st), "%s: %s", what, m[0] ? m : ddl_strerror(st));
}

static bool need_model(ddld_dispatch *d, ddld_job *job, const char *what)
{
    if (d->s == NULL) {
        fail(job, GRPC_STATUS_FAILED_PRECONDITION, "%s: no model (CreateModel first)", what);
        return false;
    }
    return true;
}

// Opens the dataset when it is not the open one. Rank 0 (collective when it opens).
static bool ensure_data(ddld_dispatch *d, ddld_job *job, const char *rel, const char *what)
{
    char        abs[PATH_MAX], err[768];
    const char *shown = rel; // what GetStatus says the data is
    // A spec that makes its own data (data.synthetic) trains on it, as distdl-train does.
    bool synth = ddl_spec_synthetic(ddl_model_spec(ddl_session_model(d->s)), NULL, NULL, NULL);
    if (synth) {
        if (rel != NULL && rel[0] != '\0') {
            fail(job, GRPC_STATUS_INVALID_ARGUMENT,
                 "%s: the model generates its data (the spec's data.synthetic): leave out the "
                 "dataset, got \"%.200s\"",
                 what, rel);
            return false;
        }
        snprintf(abs, sizeof abs, "(generated)");
        shown = abs;
    } else {
        grpc_status_code code = ddld_resolve_dataset(d->root_real, rel, abs, err, sizeof err);
        if (code != GRPC_STATUS_OK) {
            fail(job, code, "%s: %s", what, err);
            return false;
        }
    }
    if (strcmp(abs, d->data_abs) == 0 && ddl_session_has_data(d->s)) {
        return true;
    }
    struct payload p;
    memset(&p, 0, sizeof p);
    p.path        = synth ? NULL : abs;
    ddl_status st = run(d, DDLD_OP_OPEN_DATA, 0, synth, 0, &p);
    if (st != DDL_OK) {
        fail_engine(job, what, st);
        return false;
    }
    snprintf(d->data_abs, sizeof d->data_abs, "%s", abs);
    pthread_mutex_lock(&ddld_g.mu);
    snprintf(ddld_g.data_dir, sizeof ddld_g.data_dir, "%.*s", (int)sizeof ddld_g.data_dir - 1,
             shown);
    pthread_mutex_unlock(&ddld_g.mu);
    return true;
}

static void set_state(const char *state)
{
    pthread_mutex_lock(&ddld_g.mu);
    if (strcmp(ddld_g.state, "shutting_down") != 0) {
        ddld_g.state = state;
    }
    pthread_mutex_unlock(&ddld_g.mu);
}

// ---- checkpoint directories (rank 0) ---------------------------------------------------------

static const char *model_ckpt_dir(const ddld_dispatch *d)
{
    return d->model_ckpt[0] != '\0' ? d->model_ckpt : NULL;
}

// Does dir hold the checkpoints of a model other than the one with this spec text (its
// `latest` names a checkpoint whose manifest has another spec)? Then saving into it
// would write over that model's steps and move its `latest`: *why says so. A directory
// without a readable `latest` and manifest holds nothing to protect here.
static bool holds_other_model(const char *dir, const char *spec_text, char *why, size_t whylen)
{
    char  path[PATH_MAX + 64], step[64] = "";
    FILE *f = NULL;
    if (snprintf(path, sizeof path, "%s/latest", dir) < (int)sizeof path) {
        f = fopen(path, "r");
    }
    if (f == NULL) {
        return false;
    }
    bool got = fgets(step, sizeof step, f) != NULL;
    fclose(f);
    step[strcspn(step, "\r\n")] = '\0';
    if (!got || strncmp(step, "step-", 5) != 0 || strchr(step, '/') != NULL) {
        return false;
    }
    snprintf(path, sizeof path, "%s/%s/manifest.json", dir, step);
    json_t     *m     = json_load_file(path, 0, NULL);
    const char *spec  = json_string_value(json_object_get(m, "spec"));
    bool        other = spec != NULL && strcmp(spec, spec_text) != 0;
    if (other) {
        snprintf(why, whylen,
                 "%.300s holds the checkpoints of another model (its latest, %s, has another "
                 "spec); they are never overwritten by a different model",
                 dir, step);
    }
    json_decref(m);
    return other;
}

// Does dir hold checkpoints already (a `latest`)? A model that replaces another never
// checkpoints into such a directory, whatever its spec: a fresh model starts at step 0, and
// its step 10 would replace the earlier model's step 10 and move `latest` back. *why says
// so and how to read them instead.
static bool holds_checkpoints(const char *dir, char *why, size_t whylen)
{
    char path[PATH_MAX + 16];
    if (snprintf(path, sizeof path, "%s/latest", dir) >= (int)sizeof path ||
        access(path, F_OK) != 0) {
        return false;
    }
    snprintf(why, whylen,
             "%.300s holds the checkpoints of an earlier model of that name; they are never "
             "overwritten (Restore with dir \"models/<name>\" reads them into a model of the "
             "same shapes)",
             dir);
    return true;
}

// A model name as a directory name under --checkpoint-dir/models: letters, digits, '.',
// '_', '-', not starting with '.'.
static bool name_is_dir_safe(const char *name)
{
    return ddl_name_is_portable(name, 128);
}

// The directory a request's `dir` names: empty is the current model's own; anything else
// must stay inside --checkpoint-dir (relative to it, or absolute below it), by the rule
// datasets follow under --data-root. abs (PATH_MAX) receives it.
static bool request_dir(ddld_dispatch *d, ddld_job *job, const char *what, const char *dir,
                        char *abs);

// Is abs (a resolved directory inside --checkpoint-dir, for a Checkpoint with an explicit
// dir) the home of another model, or inside a checkpoint? The --checkpoint-dir root is the
// daemon's first model's, each models/<name> a replacement's, and a step-* directory is one
// durable checkpoint: the current model writes only into its own home or into directories
// of neither kind. *why says which.
static bool foreign_home(ddld_dispatch *d, const char *abs, char *why, size_t whylen)
{
    const char *cdir = d->cfg->checkpoint_dir;
    const char *own  = strcmp(d->model_ckpt, cdir) == 0 ? "." : d->model_ckpt + strlen(cdir) + 1;
    char        root_real[PATH_MAX], own_real[PATH_MAX], err[512];
    if (ddld_resolve_confined(cdir, ".", "dir", "--checkpoint-dir", root_real, err, sizeof err) !=
            GRPC_STATUS_OK ||
        ddld_resolve_confined(cdir, own, "dir", "--checkpoint-dir", own_real, err, sizeof err) !=
            GRPC_STATUS_OK) {
        snprintf(why, whylen, "%s", err);
        return true;
    }
    if (strcmp(abs, own_real) == 0) {
        return false;
    }
    const char *rel = abs + strlen(root_real); // abs is root_real or below it
    rel += rel[0] == '/';
    if (rel[0] == '\0') {
        snprintf(why, whylen,
                 "--checkpoint-dir itself is the home of another model (the "
                 "daemon's first): its checkpoints are never overwritten");
        return true;
    }
    if (strncmp(rel, "models", 6) == 0 && (rel[6] == '\0' || rel[6] == '/')) {
        snprintf(why, whylen,
                 "models/ under --checkpoint-dir holds the homes of other models "
                 "(each replacement's, models/<name>)");
        return true;
    }
    for (const char *p = rel; p != NULL; p = strchr(p, '/') != NULL ? strchr(p, '/') + 1 : NULL) {
        if (strncmp(p, "step-", 5) == 0) {
            snprintf(why, whylen, "it is inside a checkpoint (%.*s)", (int)strcspn(p, "/"), p);
            return true;
        }
    }
    return false;
}

static bool request_dir(ddld_dispatch *d, ddld_job *job, const char *what, const char *dir,
                        char *abs)
{
    if (dir[0] == '\0') {
        if (model_ckpt_dir(d) == NULL) {
            fail(job, GRPC_STATUS_FAILED_PRECONDITION,
                 "%s: no dir in the request and no --checkpoint-dir", what);
            return false;
        }
        snprintf(abs, PATH_MAX, "%s", d->model_ckpt);
        return true;
    }
    if (d->cfg->checkpoint_dir == NULL) {
        fail(job, GRPC_STATUS_FAILED_PRECONDITION,
             "%s: dir \"%.200s\": distdld has no --checkpoint-dir, and checkpoint directories "
             "are confined to it",
             what, dir);
        return false;
    }
    char             err[1024];
    grpc_status_code code = ddld_resolve_confined(d->cfg->checkpoint_dir, dir, "dir",
                                                  "--checkpoint-dir", abs, err, sizeof err);
    if (code != GRPC_STATUS_OK) {
        fail(job, code, "%s: %s (checkpoint directories are confined to it)", what, err);
        return false;
    }
    return true;
}

// ---- handlers (rank 0, main thread) -----------------------------------------------------------

static ddl_status create_model(ddld_dispatch *d, const char *what, const char *text,
                               const char *source, bool replace, const char *name, char *err,
                               size_t errlen, grpc_status_code *code)
{
    if (d->s != NULL && !replace) {
        *code = GRPC_STATUS_FAILED_PRECONDITION;
        snprintf(err, errlen, "%s: a model exists (set replace to replace it)", what);
        return DDL_EBUSY;
    }
    if (text == NULL || text[0] == '\0') {
        *code = GRPC_STATUS_INVALID_ARGUMENT;
        snprintf(err, errlen, "%s: spec_json is empty", what);
        return DDL_EINVAL;
    }
    // Complete validation on rank 0 first: a bad spec costs the other ranks nothing.
    ddl_spec_t *spec = NULL;
    ddl_status  st   = ddl_spec_parse(text, source, d->size, &spec);
    // Where the new model checkpoints: the daemon's first model in --checkpoint-dir, a
    // replacement in --checkpoint-dir/models/<name> (the name it is served under).
    const char *cdir = d->cfg->checkpoint_dir;
    d->next_ckpt[0]  = '\0';
    if (st == DDL_OK && cdir != NULL && d->s == NULL) {
        snprintf(d->next_ckpt, sizeof d->next_ckpt, "%s", cdir);
    } else if (st == DDL_OK && cdir != NULL) {
        const char *mname = served_name(name, spec);
        if (!name_is_dir_safe(mname)) {
            ddl_spec_destroy(&spec);
            *code = GRPC_STATUS_INVALID_ARGUMENT;
            snprintf(err, errlen,
                     "%s: name \"%.128s\": a model that replaces another checkpoints into "
                     "--checkpoint-dir/models/<name>, so the name must be 1-128 letters, "
                     "digits, '.', '_' or '-', not starting with '.'",
                     what, mname);
            return DDL_EINVAL;
        }
        snprintf(d->next_ckpt, sizeof d->next_ckpt, "%s/models/%s", cdir, mname);
    }
    char        why[512];
    if (st == DDL_OK && d->next_ckpt[0] != '\0' && strcmp(what, "--model") != 0 &&
        (d->s != NULL ? holds_checkpoints(d->next_ckpt, why, sizeof why)
                      : holds_other_model(d->next_ckpt, ddl_spec_text(spec), why, sizeof why))) {
        ddl_spec_destroy(&spec);
        *code = GRPC_STATUS_FAILED_PRECONDITION;
        snprintf(err, errlen, "%s: its checkpoint directory %s (choose another name)", what, why);
        return DDL_EBUSY;
    }
    if (st == DDL_OK) { // its memory, estimated before any rank allocates it
        st = ddl_spec_check_memory(spec, 0);
    }
    ddl_spec_destroy(&spec);
    if (st == DDL_OK) {
        struct payload p;
        memset(&p, 0, sizeof p);
        p.text                 = text;
        p.source               = source;
        d->opts.checkpoint_dir = d->next_ckpt[0] != '\0' ? d->next_ckpt : NULL;
        st                     = run(d, DDLD_OP_CREATE, replace ? CF_REPLACE : 0, 0, 0, &p);
        d->opts.checkpoint_dir = NULL; // the session keeps its own copy
    }
    if (st != DDL_OK) {
        *code = ddld_status_to_grpc(st);
        snprintf(err, errlen, "%s: %s", what,
                 ddl_last_error()[0] ? ddl_last_error() : ddl_strerror(st));
        return st;
    }
    clear_batches();
    snprintf(d->model_ckpt, sizeof d->model_ckpt, "%s", d->next_ckpt);
    d->data_abs[0] = '\0';
    pthread_mutex_lock(&ddld_g.mu);
    ddld_g.data_dir[0] = '\0';
    ddld_g.last_loss   = 0;
    pthread_mutex_unlock(&ddld_g.mu);
    if (publish_model(d, name) != 0) {
        // Every rank holds the new model, but rank 0 cannot describe it: drop it on every
        // rank rather than serve a model without its weight table.
        struct payload p;
        memset(&p, 0, sizeof p);
        run(d, DDLD_OP_DROP, 0, 0, 0, &p);
        publish_model(d, NULL); // no model: allocates nothing
        *code = GRPC_STATUS_RESOURCE_EXHAUSTED;
        snprintf(err, errlen,
                 "%s: rank 0 is out of memory for the model's description; no model is loaded",
                 what);
        return ddl_set_error(DDL_ENOMEM, "%s", err);
    }
    publish_progress(d);
    return DDL_OK;
}

static void on_create(ddld_dispatch *d, ddld_job *job)
{
    const Distdl__V1__CreateModelRequest *q = (const void *)job->msg;
    char                                  err[1024];
    grpc_status_code                      code = GRPC_STATUS_OK;
    if (create_model(d, "CreateModel", q->spec_json, "spec_json", q->replace, q->name, err,
                     sizeof err, &code) != DDL_OK) {
        fail(job, code, "%s", err);
        return;
    }
    Distdl__V1__CreateModelResponse r  = DISTDL__V1__CREATE_MODEL_RESPONSE__INIT;
    const ddld_model_info          *mi = &ddld_g.info;
    int64_t                         in[DDL_MAX_DIMS];
    for (int k = 0; k < mi->input.ndim; k++) {
        in[k] = mi->input.d[k];
    }
    r.name           = (char *)mi->name;
    r.world_size     = d->size;
    r.num_parameters = mi->num_parameters;
    r.batch_size     = mi->batch_size;
    r.n_input_shape  = (size_t)mi->input.ndim;
    r.input_shape    = in;
    r.num_classes    = mi->classes;
    r.datatype       = (char *)ddld_dtype_wire(mi->dtype);
    ddld_log("model \"%s\" created (%lld parameters, %d weights; checkpoints in %s)", mi->name,
             (long long)mi->num_parameters, mi->nweights,
             d->model_ckpt[0] ? d->model_ckpt : "(no --checkpoint-dir)");
    ddld_call_finish(job->call, GRPC_STATUS_OK, NULL, &r.base);
}

static void on_step(ddld_dispatch *d, ddld_job *job)
{
    const Distdl__V1__StepRequest *q = (const void *)job->msg;
    if (!need_model(d, job, "Step")) {
        return;
    }
    const ddld_model_info *mi = &ddld_g.info;
    Distdl__V1__Batch     *b = q->batch, *queued = NULL;
    char                   err[768];
    int64_t                n;
    if (b == NULL) {
        pthread_mutex_lock(&ddld_g.mu);
        if (ddld_g.batch_count > 0) {
            queued            = ddld_g.batches[ddld_g.batch_head];
            ddld_g.batch_head = (ddld_g.batch_head + 1) % ddld_g.batch_cap;
            ddld_g.batch_count--;
        }
        pthread_mutex_unlock(&ddld_g.mu);
        if (queued == NULL) {
            fail(job, GRPC_STATUS_FAILED_PRECONDITION,
                 "Step: no inline batch and no submitted batch waiting (SubmitBatch first)");
            return;
        }
        b = queued;
    }
    grpc_status_code code = ddld_batch_check(mi, b, true, &n, err, sizeof err);
    if (code != GRPC_STATUS_OK) {
        fail(job, code, "Step: %s", err);
    } else {
        struct payload p;
        memset(&p, 0, sizeof p);
        p.x      = input_data(d, b->x->datatype, b->x->raw.data, n * mi->sample_numel, &p.x_bytes);
        p.targets = target_data(d, b, &p.t_bytes);
        if (p.x == NULL || p.targets == NULL) {
            fail(job, GRPC_STATUS_RESOURCE_EXHAUSTED, "Step: out of memory");
        } else {
            set_state("training");
            double     t0 = ddld_now();
            ddl_status st = run(d, DDLD_OP_STEP, 0, n, 0, &p);
            set_state("idle");
            if (d->verbose) {
                ddld_log("Step: waited %.3f ms in the queue, validated in %.3f ms, engine %.3f ms",
                         (job->t_arrived > 0 ? d->t_popped - job->t_arrived : 0) * 1e3,
                         (t0 - d->t_popped) * 1e3, (ddld_now() - t0) * 1e3);
            }
            if (st != DDL_OK) {
                fail_engine(job, "Step", st);
            } else {
                pthread_mutex_lock(&ddld_g.mu);
                ddld_g.last_loss = p.step.loss;
                pthread_mutex_unlock(&ddld_g.mu);
                publish_progress(d);
                double dt = ddld_now() - t0;
                ddld_metrics_steps(1, n, dt > 0 ? (double)n / dt : 0);
                tb_train(d, p.step.step, p.step.loss, p.step.accuracy, p.step.mse,
                         dt > 0 ? (double)n / dt : 0, true);
                if (p.step.durable) {
                    ddld_metrics_checkpoint();
                }
                Distdl__V1__StepResponse r = DISTDL__V1__STEP_RESPONSE__INIT;
                r.step                     = p.step.step;
                r.loss                     = p.step.loss;
                r.accuracy                 = p.step.accuracy;
                r.durable                  = p.step.durable;
                r.mse                      = p.step.mse;
                ddld_call_finish(job->call, GRPC_STATUS_OK, NULL, &r.base);
            }
        }
    }
    if (queued != NULL) {
        protobuf_c_message_free_unpacked(&queued->base, NULL);
    }
}

struct train_ctx {
    ddld_dispatch *d;
    ddld_job      *job;
    int            every;
    int64_t        base_done; // steps done by earlier segments of this call
    int64_t        total;     // steps planned for the whole call
    int64_t        counted;   // steps already reported to the metrics
    bool           stop_shutdown, stop_cancel, stop_ckpt;
};

// --tensorboard-dir (rank 0): the outcome of writing an event (st), and a flush if asked
// or a second has passed (a live TensorBoard follows a Train). A write that fails (a full
// disk) stops the events, said once in the log; the command it came from goes on.
static void tb_done(ddld_dispatch *d, ddl_status st, bool flush)
{
    if (d->tb == NULL) {
        return;
    }
    if (st == DDL_OK) {
        st = ddl_tb_flush_due(d->tb, flush);
    }
    if (st != DDL_OK) {
        ddld_log("%s: no more TensorBoard events", ddl_last_error());
        ddl_tb_close(d->tb);
        d->tb = NULL;
    }
}

// A training step's scalars (Train's steps and Step calls).
static void tb_train(ddld_dispatch *d, int64_t step, double loss, double accuracy, double mse,
                     double images_per_s, bool flush)
{
    ddld_metrics_train_point(step, loss, accuracy, images_per_s); // the dashboard's curves
    if (d->tb != NULL) {
        double lr = ddl_optimizer_lr(ddl_model_optimizer(ddl_session_model(d->s)));
        tb_done(d, ddl_tb_train_step(d->tb, step, loss, accuracy, mse, images_per_s, lr), flush);
    }
}

static bool progress_cb(const ddl_progress *pr, void *ud)
{
    struct payload   *p    = ud;
    struct train_ctx *t    = p->tctx;
    ddld_dispatch    *d    = t->d;
    int64_t           done = t->base_done + pr->done;
    if (t->base_done == 0) {
        t->total = pr->total;
    }
    publish_progress(d);
    pthread_mutex_lock(&ddld_g.mu);
    ddld_g.last_loss = pr->loss;
    pthread_mutex_unlock(&ddld_g.mu);
    ddld_metrics_steps(done - t->counted, (done - t->counted) * ddld_g.info.batch_size,
                       pr->images_per_s);
    tb_train(d, pr->step, pr->loss, pr->accuracy, pr->mse, pr->images_per_s, false);
    t->counted = done;
    if (pr->durable) {
        ddld_metrics_checkpoint();
    }
    if (t->job->call != NULL && (pr->epoch_end || done % t->every == 0)) {
        Distdl__V1__TrainProgress r = DISTDL__V1__TRAIN_PROGRESS__INIT;
        r.step                      = pr->step;
        r.epoch                     = pr->epoch;
        r.batch                     = pr->batch;
        r.steps_per_epoch           = pr->steps_per_epoch;
        r.loss                      = pr->loss;
        r.accuracy                  = pr->accuracy;
        r.images_per_second         = pr->images_per_s;
        r.done                      = done;
        r.total                     = t->total;
        r.epoch_end                 = pr->epoch_end;
        r.durable                   = pr->durable;
        r.mean_loss                 = pr->mean_loss;
        r.mse                       = pr->mse;
        ddld_call_send(t->job->call, &r.base);
    }
    if (d->poll != NULL) {
        d->poll(d->ud); // signals and timers: may begin shutdown or ask for a checkpoint
    }
    t->stop_shutdown = ddld_shared_shutting_down() || ddld_service_shutdown_pending(d->svc);
    t->stop_cancel   = t->job->call != NULL && ddld_call_cancelled(t->job->call);
    t->stop_ckpt     = d->ckpt_requested;
    return t->stop_shutdown || t->stop_cancel || t->stop_ckpt;
}

// Train runs in segments: a checkpoint requested meanwhile (SIGUSR1) stops the session at
// the step boundary, is written, and training goes on with the steps that remain, on the
// same stream.
static void on_train(ddld_dispatch *d, ddld_job *job)
{
    const Distdl__V1__TrainRequest *q = (const void *)job->msg;
    if (!need_model(d, job, "Train")) {
        return;
    }
    if ((q->steps > 0) == (q->epochs > 0) || q->steps < 0 || q->epochs < 0) {
        fail(job, GRPC_STATUS_INVALID_ARGUMENT,
             "Train: expected exactly one of steps > 0 or epochs > 0, got steps=%lld epochs=%lld",
             (long long)q->steps, (long long)q->epochs);
        return;
    }
    if (q->progress_every < 0) {
        fail(job, GRPC_STATUS_INVALID_ARGUMENT, "Train: progress_every must be >= 0, got %d",
             q->progress_every);
        return;
    }
    if (!ensure_data(d, job, q->dataset, "Train")) {
        return;
    }
    struct train_ctx t = {
        .d = d, .job = job, .every = q->progress_every > 0 ? q->progress_every : 1};
    struct payload p;
    int64_t        steps = q->steps, epochs = q->epochs, done = 0;
    double         loss_sum = 0, acc_sum = 0, mse_sum = 0, seconds = 0;
    ddl_status     st;
    set_state("training");
    d->train_t0 = ddld_now();
    d->il_spent = 0;
    ddld_metrics_train_begin();
    for (;;) {
        memset(&p, 0, sizeof p);
        p.tctx      = &t;
        t.stop_ckpt = false;
        double t0   = MPI_Wtime();
        st          = run(d, DDLD_OP_TRAIN, 0, steps, epochs, &p);
        seconds += MPI_Wtime() - t0;
        if (st != DDL_OK) {
            break;
        }
        done += p.train.steps_done;
        loss_sum += p.train.mean_loss * (double)p.train.steps_done;
        acc_sum += p.train.accuracy * (double)p.train.steps_done;
        mse_sum += p.train.mse * (double)p.train.steps_done;
        t.base_done = done;
        if (!t.stop_ckpt || t.stop_shutdown || t.stop_cancel) {
            break;
        }
        ddld_dispatch_checkpoint_pending(d);
        if (done >= t.total) {
            break;
        }
        steps  = t.total - done;
        epochs = 0;
    }
    set_state("idle");
    publish_progress(d);
    tb_done(d, DDL_OK, true); // the Train's last events reach the file
    if (st != DDL_OK) {
        const char *m = ddl_last_error();
        char        msg[1024];
        snprintf(msg, sizeof msg, "Train: %s", m[0] ? m : ddl_strerror(st));
        ddld_call_end(job->call, ddld_status_to_grpc(st), msg);
        return;
    }
    Distdl__V1__TrainProgress r   = DISTDL__V1__TRAIN_PROGRESS__INIT;
    ddl_cursor                cur = ddl_session_cursor(d->s);
    r.step                        = p.train.step;
    r.epoch                       = cur.epoch;
    r.batch                       = cur.batch;
    r.steps_per_epoch             = ddl_session_steps_per_epoch(d->s);
    r.loss                        = done > 0 ? loss_sum / (double)done : 0;
    r.mean_loss                   = r.loss;
    r.accuracy                    = done > 0 ? acc_sum / (double)done : 0;
    r.mse                         = done > 0 ? mse_sum / (double)done : -1;
    r.images_per_second = seconds > 0 ? (double)done * (double)ddld_g.info.batch_size / seconds : 0;
    r.done              = done;
    r.total             = t.total > 0 ? t.total : done;
    r.durable           = p.train.durable_step == p.train.step;
    r.finished          = true;
    ddld_call_send(job->call, &r.base);
    if (t.stop_shutdown) {
        ddld_call_end(job->call, GRPC_STATUS_UNAVAILABLE,
                      "Train: stopped at a step boundary because distdld is shutting down");
    } else if (t.stop_cancel) {
        // One line in the log: gRPC tells a client's cancel, a passed deadline and a lost
        // connection apart to nobody, and an operator wants to know a Train stopped early.
        ddld_log("Train: stopped after %lld of %lld steps (%.1f s): its call was cancelled (by "
                 "the client, its deadline or a lost connection)",
                 (long long)done, (long long)t.total, ddld_now() - d->train_t0);
        ddld_call_end(job->call, GRPC_STATUS_CANCELLED, "Train: cancelled");
    } else {
        ddld_call_end(job->call, GRPC_STATUS_OK, NULL);
    }
}

static void on_evaluate(ddld_dispatch *d, ddld_job *job)
{
    const Distdl__V1__EvaluateRequest *q = (const void *)job->msg;
    if (!need_model(d, job, "Evaluate")) {
        return;
    }
    struct payload p;
    memset(&p, 0, sizeof p);
    ddl_status st;
    if (q->batch != NULL) {
        char             err[768];
        int64_t          n;
        grpc_status_code code =
            ddld_batch_check(&ddld_g.info, q->batch, false, &n, err, sizeof err);
        if (code != GRPC_STATUS_OK) {
            fail(job, code, "Evaluate: %s", err);
            return;
        }
        p.x      = input_data(d, q->batch->x->datatype, q->batch->x->raw.data,
                              n * ddld_g.info.sample_numel, &p.x_bytes);
        p.targets = target_data(d, q->batch, &p.t_bytes);
        if (p.x == NULL || p.targets == NULL) {
            fail(job, GRPC_STATUS_RESOURCE_EXHAUSTED, "Evaluate: out of memory");
            return;
        }
        st = run(d, DDLD_OP_EVAL_BATCH, 0, n, 0, &p);
    } else {
        int split;
        if (q->split[0] == '\0' || strcmp(q->split, "test") == 0) {
            split = DDL_SPLIT_TEST;
        } else if (strcmp(q->split, "train") == 0) {
            split = DDL_SPLIT_TRAIN;
        } else {
            fail(job, GRPC_STATUS_INVALID_ARGUMENT,
                 "Evaluate: split: expected \"test\" or \"train\", got \"%.64s\"", q->split);
            return;
        }
        if (!ensure_data(d, job, q->dataset, "Evaluate")) {
            return;
        }
        st = run(d, DDLD_OP_EVAL_SPLIT, 0, split, 0, &p);
    }
    if (st != DDL_OK) {
        fail_engine(job, "Evaluate", st);
        return;
    }
    Distdl__V1__EvaluateResponse r = DISTDL__V1__EVALUATE_RESPONSE__INIT;
    r.count                        = p.eval.count;
    r.loss                         = p.eval.loss;
    r.accuracy                     = p.eval.accuracy;
    r.mse                          = p.eval.mse;
    r.rel_l2                       = p.eval.rel_l2;
    r.fg_iou                       = p.eval.fg_iou;
    pthread_mutex_lock(&ddld_g.mu);
    int64_t step = ddld_g.step;
    pthread_mutex_unlock(&ddld_g.mu);
    ddld_metrics_eval_point(step, r.count, r.loss, r.accuracy);
    if (d->tb != NULL) {
        tb_done(d, ddl_tb_eval(d->tb, step, r.loss, r.accuracy, r.mse, r.rel_l2, r.fg_iou), true);
    }
    ddld_call_finish(job->call, GRPC_STATUS_OK, NULL, &r.base);
}

// ---- dynamic batching -------------------------------------------------------------------
// Validated Predict and ModelInfer calls join a batch; one PREDICT command runs it and each
// caller gets its own rows. Inference is batch-invariant (ddl_conv_forward_rows,
// ddl_linear_forward_rows), so those rows are bit for bit what the call alone would get.
// A batch runs when it holds --max-batch rows (default: the spec's batch_size), reaches a
// --preferred-batch-sizes size, before any other job (order is kept), or when its oldest
// call has waited --max-queue-delay-us; the delay applies only once concurrency was seen
// (the last command answered more than one call), so a lone client never waits. During a
// Train the batch runs at the next step boundary (an interlude). A call that fails
// validation is refused before it joins; one cancelled or past its deadline while it waits
// is dropped from its batch; an engine failure fails every call of the command.

static int64_t max_rows(const ddld_dispatch *d)
{
    return d->cfg->max_batch > 0 ? d->cfg->max_batch : ddld_g.info.batch_size;
}

// The output's shape for n samples: [n, output per sample...] ([n, classes] for a
// classifier); returns its rank.
static size_t output_shape(const ddld_model_info *mi, int64_t n, int64_t *shape)
{
    shape[0] = n;
    for (int d = 0; d < mi->output.ndim; d++) {
        shape[1 + d] = mi->output.d[d];
    }
    return 1 + (size_t)mi->output.ndim;
}

static void respond_predict(ddld_job *job, const void *logits, int64_t n)
{
    const ddld_model_info *mi = &ddld_g.info;
    int64_t                shape[DDL_MAX_DIMS + 1];
    Distdl__V1__Tensor     t        = DISTDL__V1__TENSOR__INIT;
    t.name                          = "logits";
    t.datatype                      = (char *)ddld_dtype_wire(mi->dtype);
    t.n_shape                       = output_shape(mi, n, shape);
    t.shape                         = shape;
    t.raw.data                      = (uint8_t *)logits;
    t.raw.len                       = (size_t)n * (size_t)mi->out_elems * ddl_dtype_size(mi->dtype);
    Distdl__V1__PredictResponse r   = DISTDL__V1__PREDICT_RESPONSE__INIT;
    r.logits                        = &t;
    ddld_call_finish(job->call, GRPC_STATUS_OK, NULL, &r.base);
}

static void respond_infer(ddld_job *job, const void *logits, int64_t n)
{
    const Inference__ModelInferRequest              *q        = (const void *)job->msg;
    const ddld_model_info                           *mi       = &ddld_g.info;
    int64_t                                          shape[DDL_MAX_DIMS + 1];
    Inference__ModelInferResponse__InferOutputTensor o, *op = &o;
    inference__model_infer_response__infer_output_tensor__init(&o);
    o.name                  = "logits";
    o.datatype              = (char *)ddld_dtype_wire(mi->dtype);
    o.n_shape               = output_shape(mi, n, shape);
    o.shape                 = shape;
    ProtobufCBinaryData out = {.len = (size_t)n * (size_t)mi->out_elems * ddl_dtype_size(mi->dtype),
                               .data = (uint8_t *)logits};
    Inference__ModelInferResponse r = INFERENCE__MODEL_INFER_RESPONSE__INIT;
    r.model_name                    = (char *)mi->name;
    r.model_version                 = "1";
    r.id                            = q->id;
    r.n_outputs                     = 1;
    r.outputs                       = &op;
    // Typed contents on request (binary_data = false); the logits are of the model dtype,
    // float or double, and the arrays point at them (packed on the wire, no copy here).
    Inference__InferTensorContents tc = INFERENCE__INFER_TENSOR_CONTENTS__INIT;
    if (ddld_infer_typed_output(q)) {
        size_t count = (size_t)n * (size_t)mi->out_elems;
        if (mi->dtype == DDL_F64) {
            tc.n_fp64_contents = count;
            tc.fp64_contents   = (double *)logits;
        } else {
            tc.n_fp32_contents = count;
            tc.fp32_contents   = (float *)logits;
        }
        o.contents = &tc;
    } else {
        r.n_raw_output_contents = 1;
        r.raw_output_contents   = &out;
    }
    ddld_call_finish(job->call, GRPC_STATUS_OK, NULL, &r.base);
}

static const char *job_what(const ddld_job *job)
{
    return job->method == DDLD_M_MODEL_INFER ? "ModelInfer" : "Predict";
}

static void pending_free(struct pending *p)
{
    ddl_free(p->typed);
    ddld_job_free(p->job);
}

// One command for pending calls [a, b): their rows joined (the call's own bytes when it is
// alone), one PREDICT, each call answered with its rows.
static void run_command(ddld_dispatch *d, int a, int b, bool interleaved)
{
    const ddld_model_info *mi = &ddld_g.info;
    size_t                 es = ddl_dtype_size(mi->dtype);
    int64_t                N  = 0;
    double                 t  = ddld_now();
    for (int i = a; i < b; i++) {
        N += d->pend[i].n;
        d->delays[i - a] = t - d->pend[i].job->t_arrived;
    }
    struct payload p;
    memset(&p, 0, sizeof p);
    if (b - a == 1) {
        p.x = input_data(d, d->pend[a].datatype, d->pend[a].raw, N * mi->sample_numel, &p.x_bytes);
    } else {
        p.x_bytes = (size_t)(N * mi->sample_numel) * es;
        if (grow(&d->bx, &d->bxcap, p.x_bytes) != NULL) {
            char *dst = d->bx;
            for (int i = a; i < b; i++) {
                convert_input(d, d->pend[i].datatype, d->pend[i].raw,
                              d->pend[i].n * mi->sample_numel, dst);
                dst += (size_t)(d->pend[i].n * mi->sample_numel) * es;
            }
            p.x = d->bx;
        }
    }
    p.out_bytes   = (size_t)N * (size_t)mi->out_elems * es;
    p.out         = grow(&d->bo, &d->bocap, p.out_bytes);
    ddl_status st = DDL_OK;
    if (p.x == NULL || p.out == NULL) {
        st = ddl_set_error(DDL_ENOMEM, "out of memory for %lld samples", (long long)N);
    } else {
        st = run(d, DDLD_OP_PREDICT, 0, N, 0, &p);
    }
    ddld_metrics_batch(N, d->delays, b - a, interleaved, st == DDL_OK, ddld_now() - t);
    const char *row = p.out;
    for (int i = a; i < b; i++) {
        ddld_job *job = d->pend[i].job;
        if (st != DDL_OK) {
            fail_engine(job, job_what(job), st);
        } else if (job->method == DDLD_M_MODEL_INFER) {
            respond_infer(job, row, d->pend[i].n);
        } else {
            respond_predict(job, row, d->pend[i].n);
        }
        row += (size_t)(d->pend[i].n * mi->out_elems) * es;
        pending_free(&d->pend[i]);
    }
}

// Runs every pending call: those cancelled meanwhile are dropped, the rest go in commands
// of at most max_rows rows (a larger call runs alone), in arrival order; with
// --dynamic-batching off, one command per call (also at a Train's step boundary).
static void run_batches(ddld_dispatch *d, bool interleaved)
{
    int kept = 0;
    for (int i = 0; i < d->npend; i++) {
        ddld_job *job = d->pend[i].job;
        if (job->call != NULL && ddld_call_cancelled(job->call)) {
            pthread_mutex_lock(&ddld_g.mu);
            ddld_g.dropped_calls++;
            pthread_mutex_unlock(&ddld_g.mu);
            fail(job, GRPC_STATUS_CANCELLED, "cancelled while waiting for its batch");
            pending_free(&d->pend[i]);
        } else {
            d->pend[kept++] = d->pend[i];
        }
    }
    int     a   = 0;
    int64_t cap = max_rows(d);
    while (a < kept) {
        int     b    = a + 1;
        int64_t rows = d->pend[a].n;
        while (d->cfg->batching && b < kept && rows + d->pend[b].n <= cap) {
            rows += d->pend[b++].n;
        }
        run_command(d, a, b, interleaved);
        d->concurrent = b - a > 1;
        a             = b;
    }
    d->npend = 0;
    d->prows = 0;
}

static bool preferred_reached(const ddld_dispatch *d)
{
    for (int i = 0; i < d->cfg->npreferred; i++) {
        if (d->prows == d->cfg->preferred[i]) {
            return true;
        }
    }
    return false;
}

// A validated call joins the batch (the job is kept until its command answers it).
static void join_batch(ddld_dispatch *d, ddld_job *job, const char *datatype, const uint8_t *raw,
                       void *typed, int64_t n)
{
    if (!d->deferred && d->npend > 0 && d->prows + n > max_rows(d)) {
        run_batches(d, false); // it would not fit: the batch so far runs first
    }
    if (d->npend == d->pcap) {
        int             cap = d->pcap > 0 ? 2 * d->pcap : 64;
        struct pending *np  = ddl_realloc(d->pend, (size_t)cap * sizeof *np);
        double         *nd  = np != NULL ? ddl_realloc(d->delays, (size_t)cap * sizeof *nd) : NULL;
        if (np != NULL) {
            d->pend = np;
        }
        if (nd == NULL) {
            fail(job, GRPC_STATUS_RESOURCE_EXHAUSTED, "%s: out of memory for its batch",
                 job_what(job));
            ddl_free(typed);
            return; // the job is freed by ddld_dispatch_run
        }
        d->delays = nd;
        d->pcap   = cap;
    }
    d->pend[d->npend++] = (struct pending){job, datatype, raw, typed, n};
    d->prows += n;
    d->kept = true;
    if (!d->deferred && (!d->cfg->batching || d->prows >= max_rows(d) || preferred_reached(d))) {
        run_batches(d, false);
    }
}

bool ddld_dispatch_batch_wait(ddld_dispatch *d)
{
    double delay = (double)d->cfg->max_queue_delay_us * 1e-6;
    while (d->npend > 0) {
        double left = d->pend[0].job->t_arrived + delay - ddld_now();
        if (!d->concurrent || left <= 0) {
            run_batches(d, false);
            return false;
        }
        if (ddld_service_queue_depth(d->svc) > 0) {
            return true; // more calls to take in first
        }
        struct timespec ts = {.tv_sec = 0, .tv_nsec = left < 20e-6 ? (long)(left * 1e9) : 20000};
        nanosleep(&ts, NULL);
    }
    return false;
}

void ddld_dispatch_batch_run(ddld_dispatch *d)
{
    if (d->npend > 0) {
        run_batches(d, false);
    }
}

static void on_predict(ddld_dispatch *d, ddld_job *job)
{
    const Distdl__V1__PredictRequest *q = (const void *)job->msg;
    if (!need_model(d, job, "Predict")) {
        return;
    }
    if (q->x == NULL) {
        fail(job, GRPC_STATUS_INVALID_ARGUMENT, "Predict: x is required");
        return;
    }
    char             err[768];
    int64_t          n;
    grpc_status_code code = ddld_input_check(&ddld_g.info, "x", q->x->datatype, q->x->shape,
                                             q->x->n_shape, q->x->raw.len, &n, err, sizeof err);
    if (code == GRPC_STATUS_OK) {
        code = ddld_finite_check(&ddld_g.info, "x", q->x->datatype, q->x->raw.data, n, err,
                                 sizeof err);
    }
    if (code != GRPC_STATUS_OK) {
        fail(job, code, "Predict: %s", err);
        return;
    }
    join_batch(d, job, q->x->datatype, q->x->raw.data, NULL, n);
}

static void on_model_infer(ddld_dispatch *d, ddld_job *job)
{
    const Inference__ModelInferRequest *q  = (const void *)job->msg;
    const ddld_model_info              *mi = &ddld_g.info;
    if (d->s == NULL || (q->model_name[0] != '\0' && strcmp(q->model_name, mi->name) != 0)) {
        fail(job, GRPC_STATUS_NOT_FOUND, "ModelInfer: model \"%.128s\" not found%s", q->model_name,
             d->s == NULL ? " (no model loaded)" : "");
        return;
    }
    if (!ddld_version_served(q->model_version)) {
        fail(job, GRPC_STATUS_NOT_FOUND,
             "ModelInfer: model \"%.128s\" has no version \"%.32s\" (only \"1\")", mi->name,
             q->model_version);
        return;
    }
    const uint8_t   *raw   = NULL;
    void            *typed = NULL;
    char             err[1024];
    int64_t          n;
    grpc_status_code code = ddld_infer_input(mi, q, &raw, &typed, &n, err, sizeof err);
    if (code != GRPC_STATUS_OK) {
        fail(job, code, "%s", err);
        return;
    }
    join_batch(d, job, q->inputs[0]->datatype, raw, typed, n);
}

// ---- answers between training steps (the interlude) -----------------------------------

// Rank 0, at a step boundary: takes every queued inference call in (refusing the bad
// ones at once); true when some are pending and the Train's answers so far took at most
// --serve-during-train-share of its time. An interlude costs about the same whether it
// answers one call or a full batch (the command round trips, the forward's fixed part,
// and on a small host the callers' own CPU), so under load the budget spaces the
// interludes out and each one answers every call that waited; a call arriving at a Train
// not under load is answered at the next boundary. What is left when the Train ends runs
// at once after it (ddld_dispatch_batch_wait: those calls are past their delay).
#define IL_CREDIT_S 0.02
static bool interlude_want(void *ud)
{
    ddld_dispatch *d = ud;
    ddld_job      *job;
    d->deferred = true;
    while ((job = ddld_service_pop_inference(d->svc)) != NULL) {
        ddld_dispatch_run(d, job);
    }
    d->deferred = false;
    if (d->npend == 0) {
        return false;
    }
    // The budget is of the recent past: a Train that ran long without calls has saved at
    // most IL_CREDIT_S of answering, so a burst of calls does not stop its steps for long.
    double allowed = 0.01 * d->cfg->serve_share_pct * (ddld_now() - d->train_t0);
    if (allowed - d->il_spent > IL_CREDIT_S) {
        d->il_spent = allowed - IL_CREDIT_S;
    }
    return d->il_spent <= allowed;
}

static void interlude_run0(void *ud)
{
    ddld_dispatch *d  = ud;
    double         t0 = ddld_now();
    run_batches(d, true);
    struct payload p;
    memset(&p, 0, sizeof p);
    run(d, DDLD_OP_RESUME, 0, 0, 0, &p);
    double dt = ddld_now() - t0;
    d->il_spent += dt;
    ddld_metrics_interlude(dt);
}

static void recv_cmd(ddld_dispatch *d, ddld_cmd *cmd);

// The workers: the commands rank 0 sends until RESUME.
static void interlude_run(void *ud)
{
    ddld_dispatch *d = ud;
    for (;;) {
        ddld_cmd cmd;
        recv_cmd(d, &cmd);
        if (cmd.op == DDLD_OP_RESUME) {
            return;
        }
        struct payload p;
        memset(&p, 0, sizeof p);
        ddl_status st = execute(d, &cmd, &p);
        note_step_bytes(d, &cmd, &p, st);
        ddld_metrics_collect(d->ctrl);
    }
}

static void pull_release(void *ud)
{
    ddld_dispatch *d = ud;
    atomic_fetch_sub(&d->pull_readers, 1);
}

static void pull_release_owned(void *ud)
{
    ddl_free(ud);
}

static void on_pull(ddld_dispatch *d, ddld_job *job)
{
    if (!need_model(d, job, "PullWeights")) {
        return;
    }
    const ddld_model_info *mi = &ddld_g.info;
    // Weights unchanged since the last snapshot: stream it again, no collective at all.
    if (d->pull != NULL && d->pull_version == d->weights_version) {
        atomic_fetch_add(&d->pull_readers, 1);
        ddld_call_stream_weights(job->call, mi, d->pull, pull_release, d);
        return;
    }
    // Otherwise gather into the snapshot when no stream reads it, else into a private copy.
    bool     shared = atomic_load(&d->pull_readers) == 0;
    uint8_t *buf;
    if (shared) {
        d->pull_version = 0;
        buf             = grow((void **)&d->pull, &d->pull_cap, mi->weights_bytes + 64);
    } else {
        buf = ddl_malloc(mi->weights_bytes + 64);
    }
    if (buf == NULL) {
        fail(job, GRPC_STATUS_RESOURCE_EXHAUSTED, "PullWeights: out of memory for %zu bytes",
             mi->weights_bytes);
        return;
    }
    struct payload p;
    memset(&p, 0, sizeof p);
    p.out         = buf;
    p.mi          = mi;
    double     t0 = MPI_Wtime();
    ddl_status st = run(d, DDLD_OP_PULL, 0, 0, 0, &p);
    if (d->verbose) {
        ddld_log("PullWeights: gathered %zu bytes in %.1f ms", mi->weights_bytes,
                 (MPI_Wtime() - t0) * 1e3);
    }
    if (st != DDL_OK) {
        if (!shared) {
            ddl_free(buf);
        }
        fail_engine(job, "PullWeights", st);
        return;
    }
    if (shared) {
        d->pull_version = d->weights_version;
        atomic_fetch_add(&d->pull_readers, 1);
        ddld_call_stream_weights(job->call, mi, buf, pull_release, d);
    } else {
        ddld_call_stream_weights(job->call, mi, buf, pull_release_owned, buf);
    }
}

static void on_push(ddld_dispatch *d, ddld_job *job)
{
    if (!need_model(d, job, "PushWeights")) {
        return;
    }
    const ddld_model_info *mi = &ddld_g.info;
    if (job->model_gen != ddld_g.model_gen) {
        fail(job, GRPC_STATUS_ABORTED,
             "PushWeights: the model was replaced while the weights streamed in; push again");
        return;
    }
    const void **bufs  = ddl_calloc((size_t)mi->nweights + 1, sizeof *bufs);
    int64_t      bytes = 0;
    if (bufs == NULL) {
        fail(job, GRPC_STATUS_RESOURCE_EXHAUSTED, "PushWeights: out of memory for %d weights",
             mi->nweights);
        return;
    }
    for (int i = 0; i < mi->nweights; i++) {
        bufs[i] = job->staging + mi->weights[i].offset;
        bytes += (int64_t)mi->weights[i].bytes;
    }
    struct payload p;
    memset(&p, 0, sizeof p);
    p.bufs        = bufs;
    double     t0 = MPI_Wtime();
    ddl_status st = run(d, DDLD_OP_PUSH, 0, 0, 0, &p);
    if (d->verbose) {
        ddld_log("PushWeights: scattered %lld bytes in %.1f ms", (long long)bytes,
                 (MPI_Wtime() - t0) * 1e3);
    }
    ddl_free(bufs);
    if (st != DDL_OK) {
        fail_engine(job, "PushWeights", st);
        return;
    }
    Distdl__V1__PushWeightsResponse r = DISTDL__V1__PUSH_WEIGHTS_RESPONSE__INIT;
    r.tensors                         = mi->nweights;
    r.bytes                           = bytes;
    ddld_call_finish(job->call, GRPC_STATUS_OK, NULL, &r.base);
}

// Saves a checkpoint into dir (NULL: --checkpoint-dir). Rank 0.
static ddl_status save(ddld_dispatch *d, const char *dir, int64_t *step)
{
    struct payload p;
    memset(&p, 0, sizeof p);
    p.path        = dir;
    ddl_status st = run(d, DDLD_OP_SAVE, 0, 0, 0, &p);
    if (st == DDL_OK) {
        *step = p.saved_step;
        publish_progress(d);
        ddld_metrics_checkpoint();
        ddld_log("checkpoint of step %lld is durable in %s", (long long)p.saved_step, dir);
    }
    return st;
}

static void on_checkpoint(ddld_dispatch *d, ddld_job *job)
{
    const Distdl__V1__CheckpointRequest *q = (const void *)job->msg;
    if (!need_model(d, job, "Checkpoint")) {
        return;
    }
    char dir[PATH_MAX], why[512];
    if (!request_dir(d, job, "Checkpoint", q->dir, dir)) {
        return;
    }
    if (q->dir[0] != '\0' &&
        (foreign_home(d, dir, why, sizeof why) ||
         holds_other_model(dir, ddl_spec_text(ddl_model_spec(ddl_session_model(d->s))), why,
                           sizeof why))) {
        fail(job, GRPC_STATUS_FAILED_PRECONDITION, "Checkpoint: dir \"%.200s\": %s", q->dir, why);
        return;
    }
    int64_t    step = -1;
    ddl_status st   = save(d, dir, &step);
    if (st != DDL_OK) {
        fail_engine(job, "Checkpoint", st);
        return;
    }
    Distdl__V1__CheckpointResponse r = DISTDL__V1__CHECKPOINT_RESPONSE__INIT;
    r.step                           = step;
    r.durable                        = true;
    r.path                           = dir;
    ddld_call_finish(job->call, GRPC_STATUS_OK, NULL, &r.base);
}

static void on_restore(ddld_dispatch *d, ddld_job *job)
{
    const Distdl__V1__RestoreRequest *q = (const void *)job->msg;
    if (!need_model(d, job, "Restore")) {
        return;
    }
    if (!q->latest && q->step < 0) {
        fail(job, GRPC_STATUS_INVALID_ARGUMENT, "Restore: step must be >= 0 (or latest), got %lld",
             (long long)q->step);
        return;
    }
    char dir[PATH_MAX];
    if (!request_dir(d, job, "Restore", q->dir, dir)) {
        return;
    }
    struct payload p;
    memset(&p, 0, sizeof p);
    p.path        = dir;
    ddl_status st = run(d, DDLD_OP_RESTORE, 0, q->latest ? -1 : q->step, 0, &p);
    if (st != DDL_OK) {
        fail_engine(job, "Restore", st);
        return;
    }
    clear_batches();
    publish_progress(d);
    Distdl__V1__RestoreResponse r = DISTDL__V1__RESTORE_RESPONSE__INIT;
    r.step                        = ddl_model_step(ddl_session_model(d->s));
    ddld_log("restored step %lld from %s", (long long)r.step, dir);
    ddld_call_finish(job->call, GRPC_STATUS_OK, NULL, &r.base);
}

static void on_shutdown(ddld_dispatch *d, ddld_job *job)
{
    const Distdl__V1__ShutdownRequest *q = (const void *)job->msg;
    Distdl__V1__ShutdownResponse       r = DISTDL__V1__SHUTDOWN_RESPONSE__INIT;
    r.durable_step                       = d->s != NULL ? ddl_session_durable_step(d->s) : -1;
    if (q->checkpoint) {
        if (d->s == NULL || model_ckpt_dir(d) == NULL) {
            ddld_service_shutdown_refused(d->svc);
            fail(job, GRPC_STATUS_FAILED_PRECONDITION, "Shutdown: checkpoint requested but %s",
                 d->s == NULL ? "there is no model" : "distdld has no --checkpoint-dir");
            return;
        }
        int64_t    step;
        ddl_status st = save(d, d->model_ckpt, &step);
        if (st != DDL_OK) {
            ddld_service_shutdown_refused(d->svc);
            fail_engine(job, "Shutdown", st);
            return;
        }
        r.durable_step = step;
    } else {
        // Without checkpoint: none now and none at the end (the reply's durable_step is the
        // step a restart resumes at), nor one that SIGUSR1 or the timer asked for.
        d->no_more_ckpt   = true;
        d->ckpt_requested = false;
    }
    ddld_log("Shutdown requested by a client (%s)",
             q->checkpoint ? "after a checkpoint" : "without a final checkpoint");
    ddld_shared_mark_shutdown();
    ddld_call_finish(job->call, GRPC_STATUS_OK, NULL, &r.base);
    ddld_service_push_internal(d->svc, DDLD_JOB_SHUTDOWN);
}

void ddld_dispatch_request_checkpoint(ddld_dispatch *d)
{
    d->ckpt_requested = true;
}

void ddld_dispatch_request_checkpoint_if_stale(ddld_dispatch *d)
{
    if (d->s != NULL && model_ckpt_dir(d) != NULL && !d->no_more_ckpt &&
        ddl_session_durable_step(d->s) != ddl_model_step(ddl_session_model(d->s))) {
        d->ckpt_requested = true;
    }
}

void ddld_dispatch_checkpoint_pending(ddld_dispatch *d)
{
    // A Shutdown queued or running decides: with checkpoint it writes one, without it none
    // (on_shutdown drops the request then; a refused Shutdown leaves it pending).
    if (!d->ckpt_requested || ddld_service_shutdown_pending(d->svc)) {
        return;
    }
    d->ckpt_requested = false;
    if (d->no_more_ckpt) {
        return; // a Shutdown without checkpoint is under way
    }
    if (d->s == NULL || model_ckpt_dir(d) == NULL) {
        ddld_log("checkpoint requested but %s",
                 d->s == NULL ? "there is no model" : "there is no --checkpoint-dir");
        return;
    }
    int64_t step;
    if (save(d, d->model_ckpt, &step) != DDL_OK) {
        ddld_log("requested checkpoint failed: %s", ddl_last_error());
    }
}

void ddld_dispatch_final_checkpoint(ddld_dispatch *d)
{
    if (d->s == NULL || model_ckpt_dir(d) == NULL) {
        return;
    }
    if (d->no_more_ckpt) {
        ddld_log("no final checkpoint (Shutdown without checkpoint); the newest durable step "
                 "stays %lld",
                 (long long)ddl_session_durable_step(d->s));
        return;
    }
    if (ddl_session_durable_step(d->s) == ddl_model_step(ddl_session_model(d->s))) {
        return; // this step is durable already (Shutdown with checkpoint, or no steps since)
    }
    int64_t    step;
    ddl_status st = save(d, d->model_ckpt, &step);
    if (st != DDL_OK) {
        ddld_log("final checkpoint failed: %s", ddl_last_error());
    }
}

void ddld_dispatch_run(ddld_dispatch *d, ddld_job *job)
{
    if (d->npend > 0 && !d->deferred && job->method != DDLD_M_PREDICT &&
        job->method != DDLD_M_MODEL_INFER) {
        run_batches(d, false); // calls run in arrival order: the batch before this job
    }
    d->t_popped = ddld_now();
    ddl_clear_error();
    // A call that was cancelled (or passed its deadline) while it waited in the queue is
    // not executed: its client has already been told it failed.
    if (job->call != NULL && ddld_call_cancelled(job->call)) {
        pthread_mutex_lock(&ddld_g.mu);
        ddld_g.dropped_calls++;
        pthread_mutex_unlock(&ddld_g.mu);
        fail(job, GRPC_STATUS_CANCELLED, "cancelled while queued");
        ddld_job_free(job);
        return;
    }
    // One case per ENGINE or STAGED row of the method table: its on_<handler>.
    switch (job->method) {
#define RUN_CQ(name, handler)
#define RUN_ENGINE(name, handler)                                                                  \
    case DDLD_M_##name:                                                                            \
        on_##handler(d, job);                                                                      \
        break;
#define RUN_STAGED RUN_ENGINE
#define X(name, path, kind, role, where, request, handler) RUN_##where(name, handler)
        DDL_RPC_METHODS(X)
#undef X
#undef RUN_CQ
#undef RUN_ENGINE
#undef RUN_STAGED
    case DDLD_M_INTERNAL:
        break;
    default:
        fail(job, GRPC_STATUS_INTERNAL, "no handler for method %d", job->method);
        break;
    }
    if (!d->kept) {
        ddld_job_free(job);
    }
    d->kept = false;
}

// ---- start-up ---------------------------------------------------------------------------

static char *read_file(const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        snprintf(err, errlen, "--model %s: %s", path, strerror(errno));
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (n < 0 || n > (64L << 20)) {
        fclose(f);
        snprintf(err, errlen, "--model %s: not a readable spec (size %ld)", path, n);
        return NULL;
    }
    char *text = ddl_malloc((size_t)n + 1);
    if (text == NULL) {
        fclose(f);
        snprintf(err, errlen, "--model %s: out of memory for %ld bytes", path, n);
        return NULL;
    }
    size_t got = fread(text, 1, (size_t)n, f);
    fclose(f);
    text[got] = '\0';
    return text;
}

int ddld_dispatch_startup(ddld_dispatch *d)
{
    const ddld_config *cfg = d->cfg;
    if (cfg->model_path == NULL) {
        publish_model(d, NULL);
        return 0;
    }
    char  err[1024];
    char *text = read_file(cfg->model_path, err, sizeof err);
    if (text == NULL) {
        ddld_log("%s", err);
        return 2;
    }
    grpc_status_code code;
    ddl_status       st =
        create_model(d, "--model", text, cfg->model_path, false, NULL, err, sizeof err, &code);
    ddl_free(text);
    if (st != DDL_OK) {
        ddld_log("%s", err);
        return 2;
    }
    ddld_log("model from %s: %lld parameters", cfg->model_path,
             (long long)ddld_g.info.num_parameters);
    if (cfg->resume) {
        struct payload p;
        memset(&p, 0, sizeof p);
        p.path = cfg->checkpoint_dir;
        st     = run(d, DDLD_OP_RESTORE, 0, -1, 0, &p);
        if (st == DDL_OK) {
            publish_progress(d);
            ddld_log("resumed from %s at step %lld", cfg->checkpoint_dir, (long long)ddld_g.step);
        } else if (st == DDL_ENOTFOUND) {
            ddld_log("--resume: no checkpoint in %s yet; starting fresh", cfg->checkpoint_dir);
        } else {
            ddld_log("--resume: %s", ddl_last_error());
            return st == DDL_ECORRUPT ? 3 : 2;
        }
    }
    return 0;
}
