// engine/model.c: a model built from a spec: partitions, layers, loss, optimizer and
// every buffer of a step, allocated once.
//
// A training step (llm.c's forward -> zero_grad -> backward -> update):
//   1. rank 0 copies the caller's `count` samples into its own batch buffer (padding the
//      rest of the batch with zeros, so a short batch never reads past the caller's
//      buffer), and a Repartition plan built once moves it onto the input partition;
//      the labels are broadcast (batch int64, padded) into buffers allocated once;
//   2. forward through the layers: act[i + 1] = layer_i(act[i]);
//   3. the distributed cross-entropy of act[n]; its value lands on the loss root;
//   4. zero_grad, then the adjoint chain: dact[n] from the loss, dact[i] from layer_i's
//      backward, down to the first layer that has parameters (earlier layers only move
//      data and their input gradient is not needed);
//   5. the optimizer updates each parameter on its owner rank.
// The output moves to rank 0 through a second plan (output partition -> rank 0), so a
// step, an evaluation and a prediction allocate nothing.
//
// Collective over the model's communicator, a duplicate of the caller's (MPI_Comm_dup),
// so the caller's own traffic never mixes with the engine's. Every rank runs every layer.
// Failures are agreed on (ddl_agree): model creation agrees after every collective stage
// (each partition, each layer, the loss, the plans), and every command validates rank
// 0's arguments first, agrees on them, and ends with an agreement, so a local failure
// fails every rank alike instead of leaving the others in a collective. The shapes of
// the activations are checked against every layer once at creation, so the layers' own
// shape checks cannot fail on one rank during a step.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/check.h"
#include "ddl/agree.h"
#include "ddl/base.h"
#include "ddl/checkpoint.h"
#include "ddl/collect.h"
#include "ddl/estimate.h"
#include "engine/model_internal.h"
#include "engine/spec_internal.h"
#include "partition/mpi_check.h"

struct ddl_model {
    MPI_Comm           comm; // our duplicate of the caller's communicator
    int                rank;
    ddl_spec_t        *spec;
    ddl_partition_t  **parts;
    int                nlayers;
    ddl_layer_t      **layers;
    ddl_tensor_t     **act;          // nlayers + 1 activations (act[0]: the input)
    ddl_tensor_t     **dact;         // their gradients
    ddl_shape          in_global;    // [batch, sample...]
    size_t             sample_bytes; // one sample in the spec's dtype
    ddl_partition_t   *P_in_root;    // rank 0 alone, with the input's dimension
    ddl_partition_t   *P_out_root;   // rank 0 alone, with the output's dimension
    ddl_repartition_t *in_plan;      // rank 0's batch -> the input partition
    ddl_repartition_t *out_plan;     // the output partition -> rank 0
    ddl_tensor_t      *xin;          // rank 0: the whole batch; elsewhere zero-volume
    ddl_loss_t        *loss, *loss_each;
    ddl_tensor_t      *loss_el, *dloss_el;
    int                loss_root; // world rank holding the reduced loss
    int64_t           *labels_all, *labels_local;
    ddl_box            out_box; // this rank's box of the output [batch, classes]
    ddl_tensor_t      *logits;  // rank 0: the gathered output; elsewhere zero-volume
    int                first_param_layer;
    int                nparams;
    ddl_param        **params;
    char (*pnames)[2 * SPEC_NAME];
    int               nbuffers; // running statistics (state saved with the weights)
    ddl_named_tensor *buffers;
    char (*bnames)[2 * SPEC_NAME];
    ddl_optimizer_t *opt;
};

static ddl_status build_partitions(ddl_model_t *m)
{
    const ddl_spec_t *s = m->spec;
    m->parts            = ddl_calloc((size_t)s->nparts, sizeof *m->parts);
    ddl_status st       = ddl_agree(
              m->comm, m->parts != NULL ? DDL_OK : ddl_set_error(DDL_ENOMEM, "model: out of memory"));
    // Each partition's creation is collective over its members: agree after each one,
    // so no rank goes on to the next while another has failed.
    for (int i = 0; st == DDL_OK && i < s->nparts; i++) {
        const spec_partition *p = &s->parts[i];
        st = ddl_partition_create(m->comm, p->nranks, p->ranks, p->ndim, p->shape, &m->parts[i]);
        st = ddl_agree(m->comm, st);
    }
    return st;
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

// One layer: the layer, its output activation and gradient, its parameters' initial
// values, and the check that its input is the previous layer's output. Local failures
// are reported to the caller, which agrees on them.
static ddl_status build_one_layer(ddl_model_t *m, int i, int *nparams)
{
    const ddl_spec_t *s  = m->spec;
    ddl_status        st = build_layer(m, i, &m->layers[i]);
    if (st != DDL_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ddl_last_error());
        return ddl_set_error(st, "%s: layers[%d] (%s): %s", s->source, i, s->layers[i].name, msg);
    }
    ddl_layer_t *L = m->layers[i];
    char         a[128], b[128];
    DDL_REQUIRE(ddl_shape_equal(&m->act[i]->shape, &L->x_shape), DDL_EINTERNAL,
                "%s: layers[%d] (%s): local input shape %s differs from the previous output %s",
                s->source, i, s->layers[i].name, ddl_shape_str(&L->x_shape, a, sizeof a),
                ddl_shape_str(&m->act[i]->shape, b, sizeof b));
    DDL_CHECK(ddl_tensor_create(s->dt, &L->y_shape, &m->act[i + 1]));
    DDL_CHECK(ddl_tensor_create(s->dt, &L->y_shape, &m->dact[i + 1]));
    if (L->nparams > 0 && m->first_param_layer == m->nlayers) {
        m->first_param_layer = i;
    }
    // Partition-invariant initialization: streams follow the index among the layers
    // with parameters, so specs that differ only in data movement agree.
    ddl_layer_init_params(L, s->seed, 1000u * (uint64_t)(s->layers[i].param_index + 1));
    *nparams += L->nparams;
    return DDL_OK;
}

// The local bookkeeping after the layers: parameter list and names, optimizer, batch
// norm buffers, label buffers. No communication.
static ddl_status build_tables(ddl_model_t *m, int nparams)
{
    const ddl_spec_t *s = m->spec;
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
    // Checkpoints and exports name every tensor: two layers with one name would only
    // fail there, after hours of training, so refuse them now.
    for (int i = 0; i < m->nparams; i++) {
        for (int j = 0; j < i; j++) {
            DDL_REQUIRE(strcmp(m->pnames[i], m->pnames[j]) != 0, DDL_EINVAL,
                        "%s: two parameters are named '%s': give the layers distinct \"name\"s",
                        s->source, m->pnames[i]);
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
            for (int j = 0; j < m->nbuffers; j++) {
                DDL_REQUIRE(strcmp(m->bnames[j], m->bnames[m->nbuffers]) != 0, DDL_EINVAL,
                            "%s: two buffers are named '%s': give the layers distinct "
                            "\"name\"s",
                            s->source, m->bnames[j]);
            }
            m->nbuffers++;
        }
    }
    m->labels_all   = ddl_calloc((size_t)s->batch, sizeof(int64_t));
    m->labels_local = ddl_calloc((size_t)s->batch, sizeof(int64_t));
    if (m->labels_all == NULL || m->labels_local == NULL) {
        return ddl_set_error(DDL_ENOMEM, "model: out of memory");
    }
    return DDL_OK;
}

// The loss on the output partition and its per-row buffers. Collective over the output
// partition (the loss duplicates its communicator).
static ddl_status build_loss(ddl_model_t *m)
{
    const ddl_spec_t      *s    = m->spec;
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
    return DDL_OK;
}

// A partition of rank 0 alone with ndim dimensions (every extent 1).
static ddl_status root_partition(ddl_model_t *m, int ndim, ddl_partition_t **out)
{
    int shape[DDL_MAX_DIMS], r0 = 0;
    for (int d = 0; d < ndim; d++) {
        shape[d] = 1;
    }
    return ddl_partition_create(m->comm, 1, &r0, ndim, shape, out);
}

// The two Repartition plans that move batches in and out, and their rank-0 buffers.
// Collective over the partitions involved.
static ddl_status build_input_plan(ddl_model_t *m)
{
    const ddl_spec_t *s = m->spec;
    DDL_CHECK(ddl_repartition_create(m->P_in_root, m->parts[s->input_partition], s->dt,
                                     &m->in_global, NULL, &m->in_plan));
    ddl_shape xs = ddl_repartition_x_shape(m->in_plan);
    ddl_shape ys = ddl_repartition_y_shape(m->in_plan);
    char      a[128], b[128];
    DDL_REQUIRE(ddl_shape_equal(&ys, &m->act[0]->shape), DDL_EINTERNAL,
                "model: the input plan delivers %s, the first layer expects %s",
                ddl_shape_str(&ys, a, sizeof a), ddl_shape_str(&m->act[0]->shape, b, sizeof b));
    return ddl_tensor_create(s->dt, &xs, &m->xin);
}

static ddl_status build_output_plan(ddl_model_t *m)
{
    const ddl_spec_t  *s    = m->spec;
    const ddl_layer_t *last = m->layers[m->nlayers - 1];
    DDL_CHECK(ddl_repartition_create(last->P_out, m->P_out_root, s->dt, &last->y_global, NULL,
                                     &m->out_plan));
    ddl_shape xs = ddl_repartition_x_shape(m->out_plan);
    ddl_shape ys = ddl_repartition_y_shape(m->out_plan);
    char      a[128], b[128];
    DDL_REQUIRE(ddl_shape_equal(&xs, &m->act[m->nlayers]->shape), DDL_EINTERNAL,
                "model: the output plan expects %s, the last layer delivers %s",
                ddl_shape_str(&xs, a, sizeof a),
                ddl_shape_str(&m->act[m->nlayers]->shape, b, sizeof b));
    return ddl_tensor_create(s->dt, &ys, &m->logits);
}

// Every stage that communicates (or precedes communication) ends with an agreement over
// the model's communicator, so a failure on one rank (an allocation, a layer's check)
// fails every rank at the same point and no rank waits in a collective the others
// never reach.
#define STAGE(expr)                                                                                \
    do {                                                                                           \
        ddl_status stage_st_ = ddl_agree(m->comm, (expr));                                         \
        if (stage_st_ != DDL_OK) {                                                                 \
            return stage_st_;                                                                      \
        }                                                                                          \
    } while (0)

static ddl_status alloc_layer_tables(ddl_model_t *m)
{
    const ddl_spec_t *s = m->spec;
    m->nlayers          = s->nlayers;
    m->layers           = ddl_calloc((size_t)m->nlayers, sizeof *m->layers);
    m->act              = ddl_calloc((size_t)m->nlayers + 1, sizeof *m->act);
    m->dact             = ddl_calloc((size_t)m->nlayers + 1, sizeof *m->dact);
    if (m->layers == NULL || m->act == NULL || m->dact == NULL) {
        return ddl_set_error(DDL_ENOMEM, "model: out of memory");
    }
    // The input: [batch, sample...] on the input partition.
    ddl_shape g = {.ndim = s->input.ndim + 1};
    g.d[0]      = s->batch;
    for (int d = 0; d < s->input.ndim; d++) {
        g.d[1 + d] = s->input.d[d];
    }
    m->in_global     = g;
    m->sample_bytes  = (size_t)ddl_shape_numel(&s->input) * ddl_dtype_size(s->dt);
    ddl_box   in_box = ddl_partition_local_box(m->parts[s->input_partition], &g);
    ddl_shape ls     = ddl_box_shape(&in_box);
    DDL_CHECK(ddl_tensor_create(s->dt, &ls, &m->act[0]));
    DDL_CHECK(ddl_tensor_create(s->dt, &ls, &m->dact[0]));
    m->first_param_layer = m->nlayers;
    return DDL_OK;
}

static ddl_status build(ddl_model_t *m)
{
    DDL_CHECK(build_partitions(m)); // agreed inside, partition by partition
    STAGE(alloc_layer_tables(m));
    int nparams = 0;
    for (int i = 0; i < m->nlayers; i++) {
        STAGE(build_one_layer(m, i, &nparams));
    }
    if (m->first_param_layer < m->nlayers) { // its dx is never read (see train_step)
        ddl_layer_set_dx_unused(m->layers[m->first_param_layer], true);
    }
    STAGE(build_tables(m, nparams));
    STAGE(build_loss(m));
    const ddl_layer_t *last = m->layers[m->nlayers - 1];
    STAGE(root_partition(m, m->in_global.ndim, &m->P_in_root));
    STAGE(root_partition(m, last->y_global.ndim, &m->P_out_root));
    STAGE(build_input_plan(m));
    STAGE(build_output_plan(m));
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
    ddl_status   st =
        ddl_agree(comm, m != NULL ? DDL_OK : ddl_set_error(DDL_ENOMEM, "model: out of memory"));
    if (st != DDL_OK) {
        ddl_free(m);
        return st;
    }
    m->rank = rank;
    // Our own communicator: the caller's traffic on comm never meets the engine's.
    if (MPI_Comm_dup(comm, &m->comm) != MPI_SUCCESS) {
        ddl_free(m);
        return ddl_set_error(DDL_EMPI, "model: MPI_Comm_dup failed");
    }
    MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    st = ddl_agree(m->comm, ddl_spec_parse(spec->text, spec->source, size, &m->spec));
    if (st == DDL_OK) { // refuse what cannot fit before anything is allocated for it
        st = ddl_agree(m->comm, ddl_spec_check_memory(m->spec, 0));
    }
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
    ddl_tensor_destroy(&m->xin);
    ddl_repartition_destroy(&m->in_plan);
    ddl_repartition_destroy(&m->out_plan);
    ddl_partition_destroy(&m->P_in_root);
    ddl_partition_destroy(&m->P_out_root);
    for (int i = 0; m->layers != NULL && i < m->nlayers; i++) {
        ddl_layer_destroy(&m->layers[i]);
    }
    // Any of the tables may be missing after a failed create.
    for (int i = 0; i <= m->nlayers; i++) {
        if (m->act != NULL) {
            ddl_tensor_destroy(&m->act[i]);
        }
        if (m->dact != NULL) {
            ddl_tensor_destroy(&m->dact[i]);
        }
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
    if (m->comm != MPI_COMM_NULL) {
        MPI_Comm_free(&m->comm);
    }
    ddl_free(m);
    *mp = NULL;
}

// ---- a step ----------------------------------------------------------------------

// Rank 0 checks a batch handed in by the caller before any rank moves data: `count`
// samples in [lo, hi], x holding at least count samples (x_bytes), labels (when wanted)
// in [0, classes). Every rank then agrees on the verdict and learns rank 0's count.
static ddl_status check_batch(ddl_model_t *m, const char *what, const void *x, size_t x_bytes,
                              const int64_t *labels, bool want_labels, int64_t *count, int64_t lo,
                              int64_t hi)
{
    const ddl_spec_t *s  = m->spec;
    ddl_status        st = DDL_OK;
    int64_t           n  = *count;
    if (m->rank == 0) {
        int64_t C = s->num_classes;
        if (n < lo || n > hi) {
            st = ddl_set_error(DDL_EINVAL, "%s: count %lld must be in [%lld, %lld] (batch_size)",
                               what, (long long)n, (long long)lo, (long long)hi);
        } else if (n > 0 && x == NULL) {
            st = ddl_set_error(DDL_EINVAL, "%s: rank 0 must pass the samples", what);
        } else if (x_bytes / m->sample_bytes < (uint64_t)n) {
            st = ddl_set_error(DDL_EINVAL, "%s: %lld samples of %zu bytes need %llu bytes, got %zu",
                               what, (long long)n, m->sample_bytes,
                               (unsigned long long)((uint64_t)n * m->sample_bytes), x_bytes);
        } else if (want_labels && n > 0 && labels == NULL) {
            st = ddl_set_error(DDL_EINVAL, "%s: rank 0 must pass the labels", what);
        } else if (want_labels) {
            for (int64_t i = 0; i < n; i++) {
                if (labels[i] < 0 || labels[i] >= C) {
                    st = ddl_set_error(DDL_EINVAL,
                                       "%s: label %lld of sample %lld is outside [0, %lld)", what,
                                       (long long)labels[i], (long long)i, (long long)C);
                    break;
                }
            }
        }
    }
    DDL_CHECK(ddl_agree(m->comm, st));
    DDL_CHECK_MPI(MPI_Bcast(&n, 1, MPI_INT64_T, 0, m->comm));
    *count = n;
    return DDL_OK;
}

// Rank 0's `count` samples into the input partition, through the model's own batch
// buffer (the rest of the batch is zero padding, never read from the caller); with
// labels: rank 0's labels (padded with class 0) to every rank, and this rank's rows.
static ddl_status stage_input(ddl_model_t *m, const void *x, const int64_t *labels, int64_t count,
                              bool with_labels)
{
    const ddl_spec_t *s = m->spec;
    if (m->rank == 0) {
        size_t used = (size_t)count * m->sample_bytes;
        if (used > 0) {
            memcpy(m->xin->data, x, used);
        }
        memset((char *)m->xin->data + used, 0, ddl_tensor_bytes(m->xin) - used);
    }
    DDL_CHECK(ddl_repartition_forward(m->in_plan, m->xin, m->act[0]));
    if (with_labels) {
        if (m->rank == 0) {
            for (int64_t i = 0; i < s->batch; i++) {
                m->labels_all[i] = i < count ? labels[i] : 0;
            }
        }
        DDL_CHECK_MPI(MPI_Bcast(m->labels_all, (int)s->batch, MPI_INT64_T, 0, m->comm));
        int64_t r0 = m->out_box.start[0], r1 = m->out_box.stop[0];
        for (int64_t r = r0; r < r1; r++) {
            m->labels_local[r - r0] = m->labels_all[r];
        }
    }
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

// The output onto rank 0 (the output plan), then argmax hits among the first `count`
// rows, on every rank.
static ddl_status count_correct(ddl_model_t *m, int64_t count, int64_t *correct)
{
    DDL_CHECK(ddl_repartition_forward(m->out_plan, m->act[m->nlayers], m->logits));
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

static ddl_status train_step(ddl_model_t *m, const void *x, const int64_t *labels, double *loss,
                             int64_t *correct)
{
    DDL_CHECK(stage_input(m, x, labels, m->spec->batch, true));
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

ddl_status ddl_model_train_step(ddl_model_t *m, const void *x, size_t x_bytes,
                                const int64_t *labels, int64_t count, double *loss,
                                int64_t *correct)
{
    DDL_CHECK(check_batch(m, "train_step", x, x_bytes, labels, true, &count, m->spec->batch,
                          m->spec->batch));
    double     l  = 0.0;
    int64_t    c  = 0;
    ddl_status st = ddl_agree(m->comm, train_step(m, x, labels, &l, &c));
    if (st == DDL_OK) {
        *loss    = l;
        *correct = c;
    }
    return st;
}

static ddl_status eval_batch(ddl_model_t *m, const void *x, const int64_t *labels, int64_t count,
                             double *loss_sum, int64_t *correct)
{
    DDL_CHECK(stage_input(m, x, labels, count, true));
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

ddl_status ddl_model_eval(ddl_model_t *m, const void *x, size_t x_bytes, const int64_t *labels,
                          int64_t count, double *loss_sum, int64_t *correct)
{
    DDL_CHECK(check_batch(m, "eval", x, x_bytes, labels, true, &count, 0, m->spec->batch));
    double     l  = 0.0;
    int64_t    c  = 0;
    ddl_status st = ddl_agree(m->comm, eval_batch(m, x, labels, count, &l, &c));
    if (st == DDL_OK) {
        *loss_sum = l;
        *correct  = c;
    }
    return st;
}

ddl_status ddl_model_predict(ddl_model_t *m, const void *x, size_t x_bytes, int64_t count,
                             void *logits, size_t logits_bytes)
{
    DDL_CHECK(check_batch(m, "predict", x, x_bytes, NULL, false, &count, 0, m->spec->batch));
    size_t     need = (size_t)count * (size_t)m->spec->num_classes * ddl_dtype_size(m->spec->dt);
    ddl_status st   = DDL_OK;
    if (m->rank == 0 && count > 0 && (logits == NULL || logits_bytes < need)) {
        st = ddl_set_error(DDL_EINVAL, "predict: %lld rows of logits need %zu bytes, got %zu%s",
                           (long long)count, need, logits == NULL ? 0 : logits_bytes,
                           logits == NULL ? " (NULL)" : "");
    }
    DDL_CHECK(ddl_agree(m->comm, st));
    st = stage_input(m, x, NULL, count, false);
    if (st == DDL_OK) {
        st = forward(m, false);
    }
    if (st == DDL_OK) {
        st = ddl_repartition_forward(m->out_plan, m->act[m->nlayers], m->logits);
    }
    if (st == DDL_OK && m->rank == 0 && need > 0) {
        memcpy(logits, m->logits->data, need);
    }
    return ddl_agree(m->comm, st);
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
        *out   = NULL;
        *names = NULL;
        *n     = 0;
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
    ddl_named_tensor *nt = NULL;
    char (*names)[2 * SPEC_NAME + 32] = NULL;
    int   n;
    ddl_status nst = ddl_agree(m->comm, named_state(m, true, &nt, &n, &names));
    if (nst != DDL_OK) {
        ddl_free(nt);
        ddl_free(names);
        return nst;
    }
    ddl_checkpoint_meta meta = {ddl_optimizer_steps(m->opt), m->spec->text,
                                user_json != NULL ? user_json : "{}"};
    ddl_status st = ddl_checkpoint_save(m->comm, dir, &meta, n, nt);
    ddl_free(nt);
    ddl_free(names);
    return st;
}

ddl_status ddl_model_load(ddl_model_t *m, const char *path, char **user_json)
{
    ddl_named_tensor *nt = NULL;
    char (*names)[2 * SPEC_NAME + 32] = NULL;
    int     n;
    int64_t step = 0;
    char   *spec = NULL;
    ddl_status nst = ddl_agree(m->comm, named_state(m, true, &nt, &n, &names));
    if (nst != DDL_OK) {
        ddl_free(nt);
        ddl_free(names);
        return nst;
    }
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
    ddl_named_tensor *nt = NULL;
    char (*names)[2 * SPEC_NAME + 32] = NULL;
    int   n;
    ddl_status nst = ddl_agree(m->comm, named_state(m, false, &nt, &n, &names));
    if (nst != DDL_OK) {
        ddl_free(nt);
        ddl_free(names);
        return nst;
    }
    ddl_status st = is_safetensors(path) ? ddl_export_safetensors(m->comm, path, n, nt, NULL)
                                         : ddl_export_npy_dir(m->comm, path, n, nt);
    ddl_free(nt);
    ddl_free(names);
    return st;
}

ddl_status ddl_model_import(ddl_model_t *m, const char *path)
{
    ddl_named_tensor *nt = NULL;
    char (*names)[2 * SPEC_NAME + 32] = NULL;
    int   n;
    ddl_status nst = ddl_agree(m->comm, named_state(m, false, &nt, &n, &names));
    if (nst != DDL_OK) {
        ddl_free(nt);
        ddl_free(names);
        return nst;
    }
    ddl_status st = is_safetensors(path) ? ddl_import_safetensors(m->comm, path, n, nt)
                                         : ddl_import_npy_dir(m->comm, path, n, nt);
    ddl_free(nt);
    ddl_free(names);
    return st;
}

ddl_status ddl__model_named_state(ddl_model_t *m, bool with_optim, ddl_named_tensor **out, int *n,
                                  void **names)
{
    char(*nm)[2 * SPEC_NAME + 32] = NULL;
    ddl_status st                 = named_state(m, with_optim, out, n, &nm);
    *names                        = nm;
    return st;
}

// ---- traffic: the bytes a step moves, per layer ------------------------------------
// Self-contained on purpose (it reads the layers, the loss and the two plans only). Each
// layer and the loss record what their own last calls moved (ddl_layer_traffic_end,
// ddl_loss_traffic); the plans know what one execution moves; the labels travel by one
// MPI_Bcast of batch int64 from rank 0 (stage_input), outside the counters, so their row
// is computed here from that call. A step runs each of these once.

int ddl_model_traffic_rows(const ddl_model_t *m)
{
    return m->nlayers + 4;
}

static void traffic_row(ddl_traffic_row *r, const char *name, const char *type)
{
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s", name);
    snprintf(r->type, sizeof r->type, "%s", type);
}

static void traffic_plan(ddl_traffic_row *r, const ddl_repartition_t *t)
{
    r->fwd.c[DDL_TRAFFIC_REPARTITION][DDL_TRAFFIC_FORWARD] =
        ddl_repartition_traffic(t, DDL_TRAFFIC_FORWARD);
}

ddl_status ddl_model_traffic_local(const ddl_model_t *m, ddl_traffic_row *rows, int n)
{
    DDL_REQUIRE(m != NULL && rows != NULL && n == ddl_model_traffic_rows(m), DDL_EINVAL,
                "traffic table: needs %d rows, got %d", m != NULL ? ddl_model_traffic_rows(m) : 0,
                n);
    int k = 0;
    traffic_row(&rows[k], "input", "repartition");
    traffic_plan(&rows[k++], m->in_plan);
    for (int i = 0; i < m->nlayers; i++, k++) {
        const ddl_layer_t *L = m->layers[i];
        traffic_row(&rows[k], m->spec->layers[i].name, L->kind);
        rows[k].fwd = L->traffic.forward_train;
        rows[k].bwd = L->traffic.backward;
    }
    traffic_row(&rows[k], "loss", "cross_entropy");
    ddl_loss_traffic(m->loss, false, &rows[k].fwd);
    ddl_loss_traffic(m->loss, true, &rows[k++].bwd);
    traffic_row(&rows[k], "labels", "mpi_bcast");
    int size;
    DDL_CHECK_MPI(MPI_Comm_size(m->comm, &size));
    uint64_t lb = (uint64_t)m->spec->batch * sizeof(int64_t);
    ddl_traffic_count *c = &rows[k++].fwd.c[DDL_TRAFFIC_BROADCAST][DDL_TRAFFIC_FORWARD];
    *c = (ddl_traffic_count){m->rank == 0 ? (uint64_t)(size - 1) * lb : 0,
                             m->rank == 0 ? 0 : lb, 1};
    traffic_row(&rows[k], "output", "repartition");
    traffic_plan(&rows[k++], m->out_plan);
    return DDL_OK;
}

ddl_status ddl_model_traffic_table(ddl_model_t *m, ddl_traffic_row *rows, int n)
{
    DDL_CHECK(ddl_agree(m->comm, ddl_model_traffic_local(m, rows, n)));
    // Sum over the ranks: a ddl_traffic is plain uint64, so two all-reduces per row.
    size_t words = sizeof(ddl_traffic) / sizeof(uint64_t);
    for (int i = 0; i < n; i++) {
        DDL_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &rows[i].fwd, (int)words, MPI_UINT64_T,
                                    MPI_SUM, m->comm));
        DDL_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &rows[i].bwd, (int)words, MPI_UINT64_T,
                                    MPI_SUM, m->comm));
    }
    return DDL_OK;
}
