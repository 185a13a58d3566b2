// engine/model.c: a model built from a spec: partitions, layers, loss, optimizer and
// every buffer of a step, allocated once.
//
// A training step (llm.c's forward -> zero_grad -> backward -> update):
//   1. rank 0's batch reaches the input partition (a copy when that is rank 0 alone,
//      otherwise a scatter of boxes); the labels are broadcast (batch int64);
//   2. forward through the layers: act[i + 1] = layer_i(act[i]);
//   3. the distributed cross-entropy of act[n]; its value lands on the loss root;
//   4. zero_grad, then the adjoint chain: dact[n] from the loss, dact[i] from layer_i's
//      backward, down to the first layer that has parameters (earlier layers only move
//      data and their input gradient is not needed);
//   5. the optimizer updates each parameter on its owner rank.
// Collective over the model's communicator: every rank runs every layer.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/check.h"
#include "ddl/base.h"
#include "ddl/checkpoint.h"
#include "ddl/collect.h"
#include "engine/spec_internal.h"
#include "partition/mpi_check.h"

struct ddl_model {
    MPI_Comm          comm;
    int               rank;
    ddl_spec_t       *spec;
    ddl_partition_t **parts;
    int               nlayers;
    ddl_layer_t     **layers;
    ddl_tensor_t    **act;   // nlayers + 1 activations (act[0]: the input)
    ddl_tensor_t    **dact;  // their gradients
    ddl_shape         in_global;
    ddl_box           in_box;
    bool              input_on_root;  // the input partition is rank 0 alone
    ddl_loss_t       *loss, *loss_each;
    ddl_tensor_t     *loss_el, *dloss_el;
    int               loss_root;      // world rank holding the reduced loss
    int64_t          *labels_all, *labels_local;
    ddl_box           out_box;        // this rank's box of the output [batch, classes]
    ddl_tensor_t     *logits;         // gathered output on rank 0 (NULL elsewhere)
    bool              output_on_root; // the output partition is rank 0 alone
    int               first_param_layer;
    int               nparams;
    ddl_param       **params;
    char            (*pnames)[2 * SPEC_NAME];
    int               nbuffers;       // running statistics (state saved with the weights)
    ddl_named_tensor *buffers;
    char            (*bnames)[2 * SPEC_NAME];
    ddl_optimizer_t  *opt;
};

static ddl_status build_partitions(ddl_model_t *m)
{
    const ddl_spec_t *s = m->spec;
    m->parts            = ddl_calloc((size_t)s->nparts, sizeof *m->parts);
    if (m->parts == NULL) {
        return ddl_set_error(DDL_ENOMEM, "model: out of memory");
    }
    for (int i = 0; i < s->nparts; i++) {
        const spec_partition *p = &s->parts[i];
        DDL_CHECK(ddl_partition_create(m->comm, p->nranks, p->ranks, p->ndim, p->shape, &m->parts[i]));
    }
    return DDL_OK;
}

static ddl_status build_layer(ddl_model_t *m, int i, ddl_layer_t **out)
{
    const spec_layer *L  = &m->spec->layers[i];
    ddl_partition_t  *Pi = m->parts[L->P_in], *Po = m->parts[L->P_out];
    ddl_dtype         dt = m->spec->dt;
    switch (L->type) {
    case SL_REPARTITION:
        return ddl_repartition_layer_create(Pi, Po, dt, &L->x_global, out);
    case SL_FLATTEN:
        return ddl_flatten_create(Pi, Po, dt, &L->x_global, out);
    case SL_CONV:
        return ddl_conv_create(Pi, L->P_y_given >= 0 ? Po : NULL, L->P_w >= 0 ? m->parts[L->P_w] : NULL,
                               dt, &L->x_global, &L->conv, out);
    case SL_POOL:
        return ddl_pool_create(Pi, dt, &L->x_global, &L->pool, out);
    case SL_LINEAR:
        return ddl_linear_create(Pi, Po, m->parts[L->P_w], dt, L->x_global.d[0], L->x_global.d[1],
                                 L->out_features, L->bias, out);
    case SL_ACTIVATION:
        return ddl_activation_create(Pi, dt, &L->x_global, L->act, L->alpha,
                                     m->spec->seed + 7919u * (uint64_t)(i + 1), out);
    case SL_BATCHNORM:
        return ddl_batchnorm_create(Pi, dt, &L->x_global, L->eps, L->momentum, L->affine, out);
    case SL_UPSAMPLE:
        return ddl_upsample_create(Pi, dt, &L->x_global, L->mode, L->align_corners,
                                   L->has_scale ? L->scale : NULL, L->has_scale ? NULL : L->size, out);
    }
    return ddl_set_error(DDL_EINTERNAL, "model: unknown layer type");
}

static ddl_status build(ddl_model_t *m)
{
    const ddl_spec_t *s = m->spec;
    DDL_CHECK(build_partitions(m));
    m->nlayers = s->nlayers;
    m->layers  = ddl_calloc((size_t)m->nlayers, sizeof *m->layers);
    m->act     = ddl_calloc((size_t)m->nlayers + 1, sizeof *m->act);
    m->dact    = ddl_calloc((size_t)m->nlayers + 1, sizeof *m->dact);
    if (m->layers == NULL || m->act == NULL || m->dact == NULL) {
        return ddl_set_error(DDL_ENOMEM, "model: out of memory");
    }
    // The input: [batch, sample...] on the input partition.
    ddl_shape g = {.ndim = s->input.ndim + 1};
    g.d[0]      = s->batch;
    for (int d = 0; d < s->input.ndim; d++) {
        g.d[1 + d] = s->input.d[d];
    }
    m->in_global               = g;
    const ddl_partition_t *Pin = m->parts[s->input_partition];
    m->in_box                  = ddl_partition_local_box(Pin, &g);
    m->input_on_root = ddl_partition_size(Pin) == 1 && ddl_partition_ranks(Pin)[0] == 0;
    ddl_shape ls     = ddl_box_shape(&m->in_box);
    DDL_CHECK(ddl_tensor_create(s->dt, &ls, &m->act[0]));
    DDL_CHECK(ddl_tensor_create(s->dt, &ls, &m->dact[0]));
    m->first_param_layer = m->nlayers;
    int nparams          = 0;
    for (int i = 0; i < m->nlayers; i++) {
        ddl_status st = build_layer(m, i, &m->layers[i]);
        if (st != DDL_OK) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", ddl_last_error());
            return ddl_set_error(st, "%s: layers[%d] (%s): %s", s->source, i, s->layers[i].name, msg);
        }
        ddl_layer_t *L = m->layers[i];
        DDL_CHECK(ddl_tensor_create(s->dt, &L->y_shape, &m->act[i + 1]));
        DDL_CHECK(ddl_tensor_create(s->dt, &L->y_shape, &m->dact[i + 1]));
        if (L->nparams > 0 && m->first_param_layer == m->nlayers) {
            m->first_param_layer = i;
        }
        // Partition-invariant initialization: streams follow the index among the layers
        // with parameters, so specs that differ only in data movement agree.
        ddl_layer_init_params(L, s->seed, 1000u * (uint64_t)(s->layers[i].param_index + 1));
        nparams += L->nparams;
    }
    // Parameters, flattened, with names.
    m->params = ddl_calloc((size_t)(nparams > 0 ? nparams : 1), sizeof *m->params);
    m->pnames = ddl_calloc((size_t)(nparams > 0 ? nparams : 1), sizeof *m->pnames);
    if (m->params == NULL || m->pnames == NULL) {
        return ddl_set_error(DDL_ENOMEM, "model: out of memory");
    }
    for (int i = 0; i < m->nlayers; i++) {
        for (int k = 0; k < m->layers[i]->nparams; k++) {
            m->params[m->nparams] = &m->layers[i]->params[k];
            snprintf(m->pnames[m->nparams], sizeof m->pnames[0], "%s.%s", s->layers[i].name,
                     m->layers[i]->params[k].name);
            m->nparams++;
        }
    }
    DDL_CHECK(ddl_optimizer_create(&s->optim, m->nparams, m->params, &m->opt));
    // Buffers: batch norm's running statistics, boxed by each rank's channel range
    // (ranks sharing channels hold replicas).
    int nbn = 0;
    for (int i = 0; i < m->nlayers; i++) {
        nbn += s->layers[i].type == SL_BATCHNORM ? 2 : 0;
    }
    m->buffers = ddl_calloc((size_t)(nbn > 0 ? nbn : 1), sizeof *m->buffers);
    m->bnames  = ddl_calloc((size_t)(nbn > 0 ? nbn : 1), sizeof *m->bnames);
    if (m->buffers == NULL || m->bnames == NULL) {
        return ddl_set_error(DDL_ENOMEM, "model: out of memory");
    }
    for (int i = 0; i < m->nlayers; i++) {
        if (s->layers[i].type != SL_BATCHNORM) {
            continue;
        }
        const ddl_layer_t *L = m->layers[i];
        ddl_tensor_t      *rs[2];
        DDL_CHECK(ddl_batchnorm_running_stats(L, &rs[0], &rs[1]));
        ddl_box   xb = ddl_partition_local_box(L->P_in, &L->x_global);
        ddl_shape g  = ddl_shape_make(1, (int64_t[]){L->x_global.d[1]});
        ddl_box   b  = {.ndim = 1};
        if (ddl_partition_active(L->P_in)) {
            b.start[0] = xb.start[1];
            b.stop[0]  = xb.stop[1];
        }
        for (int k = 0; k < 2; k++) {
            snprintf(m->bnames[m->nbuffers], sizeof m->bnames[0], "%s.%s", s->layers[i].name,
                     k == 0 ? "running_mean" : "running_var");
            m->buffers[m->nbuffers] = (ddl_named_tensor){m->bnames[m->nbuffers], g, b, rs[k]};
            m->nbuffers++;
        }
    }
    // Loss on the output partition.
    const ddl_layer_t     *last = m->layers[m->nlayers - 1];
    const ddl_partition_t *Po   = last->P_out;
    DDL_CHECK(ddl_loss_create(Po, s->dt, &last->y_global, DDL_LOSS_CROSS_ENTROPY, s->reduction,
                              &m->loss));
    DDL_CHECK(ddl_loss_create(Po, s->dt, &last->y_global, DDL_LOSS_CROSS_ENTROPY,
                              DDL_REDUCTION_NONE, &m->loss_each));
    m->loss_root  = ddl_partition_ranks(Po)[0];
    m->out_box    = ddl_partition_local_box(Po, &last->y_global);
    ddl_shape es  = ddl_shape_make(1, (int64_t[]){0});
    const int *ix = ddl_partition_index(Po);
    if (ix != NULL && ix[1] == 0) {
        es.d[0] = m->out_box.stop[0] - m->out_box.start[0];
    }
    DDL_CHECK(ddl_tensor_create(s->dt, &es, &m->loss_el));
    DDL_CHECK(ddl_tensor_create(s->dt, &es, &m->dloss_el));
    m->output_on_root = ddl_partition_size(Po) == 1 && ddl_partition_ranks(Po)[0] == 0;
    m->labels_all     = ddl_calloc((size_t)s->batch, sizeof(int64_t));
    m->labels_local   = ddl_calloc((size_t)s->batch, sizeof(int64_t));
    if (m->labels_all == NULL || m->labels_local == NULL) {
        return ddl_set_error(DDL_ENOMEM, "model: out of memory");
    }
    if (m->rank == 0) {
        DDL_CHECK(ddl_tensor_create(s->dt, &last->y_global, &m->logits));
    }
    return DDL_OK;
}

ddl_status ddl_model_create(MPI_Comm comm, const ddl_spec_t *spec, ddl_model_t **out)
{
    int size, rank;
    DDL_CHECK_MPI(MPI_Comm_size(comm, &size));
    DDL_CHECK_MPI(MPI_Comm_rank(comm, &rank));
    DDL_REQUIRE(size == spec->world_size, DDL_EINVAL,
                "model: the spec %s is for %d ranks, the job has %d (mpirun -np %d)", spec->source,
                spec->world_size, size, spec->world_size);
    ddl_model_t *m = ddl_calloc(1, sizeof *m);
    if (m == NULL) {
        return ddl_set_error(DDL_ENOMEM, "model: out of memory");
    }
    m->comm       = comm;
    m->rank       = rank;
    ddl_status st = ddl_spec_parse(spec->text, spec->source, size, &m->spec);
    if (st == DDL_OK) {
        st = build(m);
    }
    if (st != DDL_OK) {
        ddl_model_destroy(&m);
        return st;
    }
    *out = m;
    return DDL_OK;
}

void ddl_model_destroy(ddl_model_t **mp)
{
    if (mp == NULL || *mp == NULL) {
        return;
    }
    ddl_model_t *m = *mp;
    ddl_optimizer_destroy(&m->opt);
    ddl_loss_destroy(&m->loss);
    ddl_loss_destroy(&m->loss_each);
    ddl_tensor_destroy(&m->loss_el);
    ddl_tensor_destroy(&m->dloss_el);
    ddl_tensor_destroy(&m->logits);
    for (int i = 0; m->layers != NULL && i < m->nlayers; i++) {
        ddl_layer_destroy(&m->layers[i]);
    }
    for (int i = 0; m->act != NULL && i <= m->nlayers; i++) {
        ddl_tensor_destroy(&m->act[i]);
        ddl_tensor_destroy(&m->dact[i]);
    }
    if (m->spec != NULL) {
        for (int i = 0; m->parts != NULL && i < m->spec->nparts; i++) {
            ddl_partition_destroy(&m->parts[i]);
        }
    }
    ddl_free(m->parts);
    ddl_free(m->layers);
    ddl_free(m->act);
    ddl_free(m->dact);
    ddl_free(m->params);
    ddl_free(m->pnames);
    ddl_free(m->buffers);
    ddl_free(m->bnames);
    ddl_free(m->labels_all);
    ddl_free(m->labels_local);
    ddl_spec_destroy(&m->spec);
    ddl_free(m);
    *mp = NULL;
}

// ---- a step ----------------------------------------------------------------------

// Rank 0's batch (x: [batch, sample...]) into the input partition; with_labels: rank 0's
// labels to every rank and this rank's rows of them (the same choice on every rank).
static ddl_status stage_input(ddl_model_t *m, const void *x, const int64_t *labels,
                              bool with_labels)
{
    const ddl_spec_t *s = m->spec;
    if (m->input_on_root) {
        if (m->rank == 0) {
            memcpy(m->act[0]->data, x, ddl_tensor_bytes(m->act[0]));
        }
    } else {
        ddl_tensor_t *gx = NULL;
        if (m->rank == 0) {
            DDL_CHECK(ddl_tensor_view(s->dt, &m->in_global, (void *)x, &gx));
        }
        ddl_status st = ddl_scatter_boxes(m->comm, 0, gx, &m->in_box, &m->in_global, m->act[0]);
        ddl_tensor_destroy(&gx);
        DDL_CHECK(st);
    }
    if (with_labels) {
        if (m->rank == 0) {
            memcpy(m->labels_all, labels, sizeof(int64_t) * (size_t)s->batch);
        }
        DDL_CHECK_MPI(MPI_Bcast(m->labels_all, (int)s->batch, MPI_INT64_T, 0, m->comm));
        int64_t r0 = m->out_box.start[0], r1 = m->out_box.stop[0];
        for (int64_t r = r0; r < r1; r++) {
            m->labels_local[r - r0] = m->labels_all[r];
        }
    }
    return DDL_OK;
}

// Rank 0 checks the caller's arguments and every rank learns the verdict, so a bad call
// fails everywhere instead of leaving the other ranks in a collective.
static ddl_status agree_args(ddl_model_t *m, bool ok, const char *what)
{
    int v = ok ? 1 : 0;
    DDL_CHECK_MPI(MPI_Bcast(&v, 1, MPI_INT, 0, m->comm));
    DDL_REQUIRE(v == 1, DDL_EINVAL, "%s: rank 0 must pass the batch%s", what,
                strcmp(what, "predict") == 0 ? "" : " and its labels");
    return DDL_OK;
}

static ddl_status forward(ddl_model_t *m, bool training)
{
    for (int i = 0; i < m->nlayers; i++) {
        ddl_layer_set_training(m->layers[i], training);
        ddl_layer_set_rng_step(m->layers[i], (uint64_t)ddl_optimizer_steps(m->opt));
        DDL_CHECK(ddl_layer_forward(m->layers[i], m->act[i], m->act[i + 1]));
    }
    return DDL_OK;
}

// Argmax hits among the first `count` rows, on every rank (the logits are gathered
// onto rank 0).
static ddl_status count_correct(ddl_model_t *m, int64_t count, int64_t *correct)
{
    const ddl_tensor_t *y = m->act[m->nlayers];
    if (m->output_on_root) {
        if (m->rank == 0) {
            memcpy(m->logits->data, y->data, ddl_tensor_bytes(y));
        }
    } else {
        const ddl_layer_t *last = m->layers[m->nlayers - 1];
        DDL_CHECK(ddl_gather_boxes(m->comm, 0, y, &m->out_box, &last->y_global, m->logits));
    }
    int64_t hits = 0;
    if (m->rank == 0) {
        int64_t C = m->spec->num_classes;
        for (int64_t b = 0; b < count; b++) {
            int64_t best = 0;
            double  bv   = ddl_tensor_get(m->logits, b * C);
            for (int64_t c = 1; c < C; c++) {
                double v = ddl_tensor_get(m->logits, b * C + c);
                if (v > bv) {
                    bv   = v;
                    best = c;
                }
            }
            hits += best == m->labels_all[b];
        }
    }
    DDL_CHECK_MPI(MPI_Bcast(&hits, 1, MPI_INT64_T, 0, m->comm));
    *correct = hits;
    return DDL_OK;
}

ddl_status ddl_model_train_step(ddl_model_t *m, const void *x, const int64_t *labels, double *loss,
                                int64_t *correct)
{
    DDL_CHECK(agree_args(m, m->rank != 0 || (x != NULL && labels != NULL), "train_step"));
    DDL_CHECK(stage_input(m, x, labels, true));
    DDL_CHECK(forward(m, true));
    double value = 0.0;
    DDL_CHECK(ddl_loss_forward(m->loss, m->act[m->nlayers], NULL, m->labels_local, &value, NULL));
    for (int i = 0; i < m->nlayers; i++) {
        ddl_layer_zero_grad(m->layers[i]);
    }
    DDL_CHECK(ddl_loss_backward(m->loss, 1.0, NULL, m->dact[m->nlayers]));
    for (int i = m->nlayers - 1; i >= m->first_param_layer; i--) {
        DDL_CHECK(ddl_layer_backward(m->layers[i], m->dact[i + 1], m->dact[i]));
    }
    ddl_optimizer_step(m->opt);
    DDL_CHECK_MPI(MPI_Bcast(&value, 1, MPI_DOUBLE, m->loss_root, m->comm));
    *loss = value;
    return count_correct(m, m->spec->batch, correct);
}

ddl_status ddl_model_eval(ddl_model_t *m, const void *x, const int64_t *labels, int64_t count,
                          double *loss_sum, int64_t *correct)
{
    DDL_REQUIRE(count >= 0 && count <= m->spec->batch, DDL_EINVAL,
                "eval: count %lld must be in [0, batch_size %lld]", (long long)count,
                (long long)m->spec->batch);
    DDL_CHECK(agree_args(m, m->rank != 0 || (x != NULL && labels != NULL), "eval"));
    DDL_CHECK(stage_input(m, x, labels, true));
    DDL_CHECK(forward(m, false));
    DDL_CHECK(ddl_loss_forward(m->loss_each, m->act[m->nlayers], NULL, m->labels_local, NULL,
                               m->loss_el));
    // Per-row losses live on the column-0 ranks: sum the valid rows everywhere.
    double  local = 0.0;
    int64_t r0    = m->out_box.start[0];
    for (int64_t i = 0; i < ddl_tensor_numel(m->loss_el); i++) {
        if (r0 + i < count) {
            local += ddl_tensor_get(m->loss_el, i);
        }
    }
    DDL_CHECK_MPI(MPI_Allreduce(&local, loss_sum, 1, MPI_DOUBLE, MPI_SUM, m->comm));
    return count_correct(m, count, correct);
}

ddl_status ddl_model_predict(ddl_model_t *m, const void *x, int64_t count, void *logits)
{
    DDL_REQUIRE(count >= 0 && count <= m->spec->batch, DDL_EINVAL,
                "predict: count %lld must be in [0, batch_size %lld]", (long long)count,
                (long long)m->spec->batch);
    DDL_CHECK(agree_args(m, m->rank != 0 || x != NULL, "predict"));
    DDL_CHECK(stage_input(m, x, NULL, false));
    DDL_CHECK(forward(m, false));
    int64_t unused;
    DDL_CHECK(count_correct(m, 0, &unused));
    if (m->rank == 0 && logits != NULL) {
        memcpy(logits, m->logits->data,
               (size_t)(count * m->spec->num_classes) * ddl_dtype_size(m->spec->dt));
    }
    return DDL_OK;
}

// ---- accessors -------------------------------------------------------------------

int ddl_model_nparams(const ddl_model_t *m)
{
    return m->nparams;
}
ddl_param *ddl_model_param(const ddl_model_t *m, int i)
{
    return m->params[i];
}
const char *ddl_model_param_name(const ddl_model_t *m, int i)
{
    return m->pnames[i];
}
ddl_optimizer_t *ddl_model_optimizer(const ddl_model_t *m)
{
    return m->opt;
}
int64_t ddl_model_step(const ddl_model_t *m)
{
    return ddl_optimizer_steps(m->opt);
}
const ddl_spec_t *ddl_model_spec(const ddl_model_t *m)
{
    return m->spec;
}
MPI_Comm ddl_model_comm(const ddl_model_t *m)
{
    return m->comm;
}

// ---- state: checkpoints and exports ----------------------------------------------

// The named state: parameters, then (with_optim) the optimizer's tensors.
static ddl_status named_state(ddl_model_t *m, bool with_optim, ddl_named_tensor **out, int *n,
                              char (**names)[2 * SPEC_NAME + 32])
{
    int ns = with_optim ? ddl_optimizer_nstate(m->opt) : 0;
    int nb = m->nbuffers;
    int k  = m->nparams + nb + ns;
    *out   = ddl_calloc((size_t)(k > 0 ? k : 1), sizeof **out);
    *names = ddl_calloc((size_t)(k > 0 ? k : 1), sizeof **names);
    if (*out == NULL || *names == NULL) {
        ddl_free(*out);
        ddl_free(*names);
        return ddl_set_error(DDL_ENOMEM, "model: out of memory");
    }
    for (int i = 0; i < m->nparams; i++) {
        ddl_param *p = m->params[i];
        snprintf((*names)[i], sizeof (*names)[i], "%s", m->pnames[i]);
        (*out)[i] = (ddl_named_tensor){(*names)[i], p->global, p->box, p->value};
    }
    for (int i = 0; i < nb; i++) {
        (*out)[m->nparams + i] = m->buffers[i];
    }
    for (int j = 0; j < ns; j++) {
        const ddl_param *p;
        const char      *suffix;
        ddl_tensor_t    *t = ddl_optimizer_state(m->opt, j, &p, &suffix);
        int              pi = 0;
        while (pi < m->nparams && m->params[pi] != p) {
            pi++;
        }
        int at = m->nparams + nb + j;
        snprintf((*names)[at], sizeof (*names)[0], "optimizer.%s.%s", m->pnames[pi], suffix);
        (*out)[at] = (ddl_named_tensor){(*names)[at], p->global, p->box, t};
    }
    *n = k;
    return DDL_OK;
}

ddl_status ddl_model_save(ddl_model_t *m, const char *dir, const char *user_json)
{
    ddl_named_tensor *nt;
    char (*names)[2 * SPEC_NAME + 32];
    int   n;
    DDL_CHECK(named_state(m, true, &nt, &n, &names));
    ddl_checkpoint_meta meta = {ddl_optimizer_steps(m->opt), m->spec->text,
                                user_json != NULL ? user_json : "{}"};
    ddl_status st = ddl_checkpoint_save(m->comm, dir, &meta, n, nt);
    ddl_free(nt);
    ddl_free(names);
    return st;
}

ddl_status ddl_model_load(ddl_model_t *m, const char *path, char **user_json)
{
    ddl_named_tensor *nt;
    char (*names)[2 * SPEC_NAME + 32];
    int     n;
    int64_t step = 0;
    char   *spec = NULL;
    DDL_CHECK(named_state(m, true, &nt, &n, &names));
    ddl_status st = ddl_checkpoint_load(m->comm, path, n, nt, &step, &spec, user_json);
    if (st == DDL_OK) {
        ddl_optimizer_set_steps(m->opt, step);
    }
    ddl_free(spec);
    ddl_free(nt);
    ddl_free(names);
    return st;
}

static bool is_safetensors(const char *path)
{
    size_t n = strlen(path);
    return n > 12 && strcmp(path + n - 12, ".safetensors") == 0;
}

ddl_status ddl_model_export(ddl_model_t *m, const char *path)
{
    ddl_named_tensor *nt;
    char (*names)[2 * SPEC_NAME + 32];
    int   n;
    DDL_CHECK(named_state(m, false, &nt, &n, &names));
    ddl_status st = is_safetensors(path) ? ddl_export_safetensors(m->comm, path, n, nt, NULL)
                                         : ddl_export_npy_dir(m->comm, path, n, nt);
    ddl_free(nt);
    ddl_free(names);
    return st;
}

ddl_status ddl_model_import(ddl_model_t *m, const char *path)
{
    ddl_named_tensor *nt;
    char (*names)[2 * SPEC_NAME + 32];
    int   n;
    DDL_CHECK(named_state(m, false, &nt, &n, &names));
    ddl_status st = is_safetensors(path) ? ddl_import_safetensors(m->comm, path, n, nt)
                                         : ddl_import_npy_dir(m->comm, path, n, nt);
    ddl_free(nt);
    ddl_free(names);
    return st;
}
