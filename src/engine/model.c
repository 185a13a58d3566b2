// engine/model.c: a model built from a spec: partitions, layers, loss, optimizer and
// every buffer of a step, allocated once.
//
// A training step (llm.c's forward -> zero_grad -> backward -> update):
//   1. rank 0 copies the caller's `count` samples into its own batch buffer (padding the
//      rest of the batch with zeros, so a short batch never reads past the caller's
//      buffer), and a Repartition plan built once moves it onto the input partition;
//      the labels are broadcast (batch int64, padded) into buffers allocated once;
//   2. forward through the layers in the spec's topological order: act[i + 1] =
//      layer_i(its operands), act[0] being the input;
//   3. the distributed cross-entropy of the last layer's output; its value lands on the
//      loss root;
//   4. zero_grad, then the adjoints in reverse topological order: the loss's gradient, then
//      each layer's backward from its output's gradient into its operands' gradients. An
//      output consumed by k > 1 layers receives the sum of their k gradients (the adjoint of
//      a copy is a sum): the first consumer's backward writes it, the others' go through a
//      scratch buffer and are added. Layers whose operands' gradients nobody needs and that
//      have no parameters (leading data movement) are skipped;
//   5. the optimizer updates each parameter on its owner rank.
// The output moves to rank 0 through a second plan (output partition -> rank 0), so a
// step, an evaluation and a prediction allocate nothing.
//
// Short batches: an evaluation or prediction of count samples runs on the smallest of the
// model's forward-only copies (one per spec inference batch, build_buckets) that holds
// them, padded to that copy's batch, or on the model itself. A copy is built from the
// spec at its batch size like the model, but borrows the model's parameters, activation
// memory, partitions and communicator (build_one_layer, ddl_layer_lend_params); see
// docs/MODEL_SPEC.md, Short batches.
//
// Segmentation (an output [batch, classes, spatial...] on a partition that keeps the
// classes whole): the labels are one per output voxel, [batch, spatial...]. They move
// from rank 0 by a third Repartition plan, as f64 class indices (exact) in the layout
// [batch, 1, spatial...] of the output partition, so each rank receives exactly its own
// voxels' labels; accuracy and the per-class intersection / union counts are taken on
// each rank's own voxels and summed, without gathering the output.
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
#include "engine/layer_registry.h"
#include "engine/model_internal.h"
#include "engine/spec_internal.h"
#include "layers/layer_impl.h"
#include "partition/mpi_check.h"

struct ddl_model {
    MPI_Comm comm; // our duplicate of the caller's (a copy's: the model's)
    // Short batches: one forward-only copy per spec "inference_batches" size, ascending
    // (bucket); a copy's `full` is the model it serves (NULL for the model itself).
    int                nbuckets;
    ddl_model_t      **bucket;
    ddl_model_t       *full;
    int                rank;
    ddl_spec_t        *spec;
    ddl_partition_t  **parts;
    int                nlayers;
    ddl_layer_t      **layers;
    ddl_tensor_t     **act;          // nlayers + 1 activations (act[0]: the input,
                                     // act[i + 1]: layer i's output)
    ddl_tensor_t     **dact;         // their gradients
    // Operand slots, layer i's at slot0[i] .. slot0[i] + nin - 1: the activation each
    // reads (x_of), the tensor its backward writes the gradient to (dx_to), and, when that
    // is a scratch view, the gradient it is then added into (dx_sum; NULL otherwise).
    int                     *slot0;
    const ddl_tensor_t     **x_of;
    ddl_tensor_t           **dx_to, **dx_sum;
    void                    *scratch[SPEC_MAX_INPUTS]; // slot k's scratch gradients
    // The block the layers (and the copies' layers) share for what lives only within a
    // call (ddl_layer_share_scratch): the model's own, sized to the largest need.
    void                    *layer_scratch;
    bool                    *run_back; // layer i's backward is needed
    // Layer i is a ReLU fused into the batch norm or add before it (spec_fused_relu_source):
    // it never runs, and its output and gradient are views of that layer's.
    bool                    *fused;
    ddl_shape          in_global;    // [batch, sample...]
    ddl_box                  in_box;       // this rank's box of it (act[0])
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
    ddl_box            out_box; // this rank's box of the output [batch, classes, ...]
    // Segmentation (seg): labels [batch, 1, spatial...] as f64 from rank 0 (lab_root) to
    // the output partition (lab_local), and the summed per-class counts of the last
    // step or evaluation: [hits | intersections (classes) | unions (classes)].
    // Dense targets (dense): the same plan moves rank 0's targets, shaped like the output
    // [batch, ...] in the spec's dtype, onto the output partition: lab_local is then this
    // rank's box of them, laid out as the output's (the loss's target).
    bool               seg, dense;
    int64_t            label_elems;  // labels per sample (1 for a classifier)
    ddl_repartition_t *lab_plan;
    ddl_tensor_t      *lab_root, *lab_local;
    int64_t           *counts;
    ddl_tensor_t      *logits;  // rank 0: the gathered output; elsewhere zero-volume
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

// A short-batch copy's activation of local shape `shape`: a view of the full model's
// activation `in`, which is at least as large (the copy's batch is smaller).
static ddl_status activation_view(ddl_model_t *m, const ddl_shape *shape, ddl_tensor_t *in,
                                  ddl_tensor_t **out)
{
    size_t need = (size_t)ddl_shape_numel(shape) * ddl_dtype_size(m->spec->dt);
    DDL_REQUIRE(need <= ddl_tensor_bytes(in), DDL_EINTERNAL,
                "model: a batch-%lld activation needs %zu bytes, the full batch's has %zu",
                (long long)m->spec->batch, need, ddl_tensor_bytes(in));
    return ddl_tensor_view(m->spec->dt, shape, in->data, out);
}

// One layer: the layer (its type's registry entry builds it), its output activation and
// gradient, its parameters' initial values, and the check that its operands are its
// producers' outputs. Local failures are reported to the caller, which agrees on them.
static ddl_status build_one_layer(ddl_model_t *m, int i, int *nparams)
{
    const ddl_spec_t     *s  = m->spec;
    const spec_layer     *SL = &s->layers[i];
    const spec_build_ctx  b  = {s, m->parts, i};
    // A short-batch copy's layer is built against the model's parameters (no copy of them).
    ddl_layer_lend_params(m->full != NULL ? m->full->layers[i] : NULL);
    ddl_status st = SL->kind->build(&b, SL, &m->layers[i]);
    ddl_layer_lend_params(NULL);
    if (st != DDL_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ddl_last_error());
        return ddl_set_error(st, "%s: layers[%d] (%s): %s", s->source, i, s->layers[i].name, msg);
    }
    ddl_layer_t *L = m->layers[i];
    char         a[128], c[128];
    DDL_REQUIRE(ddl_layer_num_inputs(L) == SL->nin, DDL_EINTERNAL,
                "%s: layers[%d] (%s): the layer takes %d inputs, the spec gives %d", s->source,
                i, SL->name, ddl_layer_num_inputs(L), SL->nin);
    for (int k = 0; k < SL->nin; k++) {
        ddl_shape           xs = ddl_layer_input_shape(L, k);
        const ddl_tensor_t *x  = m->act[SL->in[k] + 1];
        DDL_REQUIRE(ddl_shape_equal(&x->shape, &xs), DDL_EINTERNAL,
                    "%s: layers[%d] (%s): local input shape %s differs from its producer's "
                    "output %s",
                    s->source, i, SL->name, ddl_shape_str(&xs, a, sizeof a),
                    ddl_shape_str(&x->shape, c, sizeof c));
    }
    int fp = spec_fused_relu_source(s, i);
    if (fp >= 0) {
        // The batch norm or add before this ReLU applies it; their outputs share memory.
        bool bn     = strcmp(s->layers[fp].kind->stem, "batchnorm") == 0;
        m->fused[i] = true;
        DDL_CHECK(bn ? ddl_batchnorm_fuse_relu(m->layers[fp], true)
                     : ddl_add_fuse_relu(m->layers[fp], true));
        DDL_REQUIRE(ddl_shape_equal(&L->y_shape, &m->act[fp + 1]->shape), DDL_EINTERNAL,
                    "%s: layers[%d] (%s): the fused ReLU's output differs from its %s's", s->source,
                    i, SL->name, bn ? "batch norm" : "add");
    }
    if (m->full != NULL) {
        // A short-batch copy: the full model's parameters, and its activation memory
        // (idle outside a step) holds the copy's smaller activations.
        DDL_CHECK(ddl_layer_finish_copy(L, m->full->layers[i]));
        DDL_CHECK(activation_view(m, &L->y_shape, m->full->act[i + 1], &m->act[i + 1]));
        *nparams += L->nparams;
        return DDL_OK;
    }
    if (fp >= 0) {
        DDL_CHECK(ddl_tensor_view(s->dt, &L->y_shape, m->act[fp + 1]->data, &m->act[i + 1]));
        DDL_CHECK(ddl_tensor_view(s->dt, &L->y_shape, m->dact[fp + 1]->data, &m->dact[i + 1]));
    } else {
        DDL_CHECK(ddl_tensor_create(s->dt, &L->y_shape, &m->act[i + 1]));
        DDL_CHECK(ddl_tensor_create(s->dt, &L->y_shape, &m->dact[i + 1]));
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
    if (m->full == NULL) { // a short-batch copy never steps
        DDL_CHECK(ddl_optimizer_create(&s->optim, m->nparams, m->params, &m->opt));
    }
    // Buffers (batch norm's running statistics): per-channel vectors, boxed by each
    // rank's channel range (ranks sharing channels hold replicas).
    int nbuf = 0;
    for (int i = 0; i < m->nlayers; i++) {
        for (int k = 0; s->layers[i].kind->buffers != NULL && s->layers[i].kind->buffers[k]; k++) {
            nbuf++;
        }
    }
    m->buffers = ddl_calloc((size_t)(nbuf > 0 ? nbuf : 1), sizeof *m->buffers);
    m->bnames  = ddl_calloc((size_t)(nbuf > 0 ? nbuf : 1), sizeof *m->bnames);
    if (m->buffers == NULL || m->bnames == NULL) {
        return ddl_set_error(DDL_ENOMEM, "model: out of memory");
    }
    for (int i = 0; i < m->nlayers; i++) {
        const char *const *bn = s->layers[i].kind->buffers;
        if (bn == NULL) {
            continue;
        }
        const ddl_layer_t *L = m->layers[i];
        ddl_tensor_t      *rs[DDL_LAYER_MAX_PARAMS] = {NULL};
        DDL_CHECK(s->layers[i].kind->get_buffers(L, rs));
        ddl_box   xb = ddl_partition_local_box(L->P_in, &L->x_global);
        ddl_shape g  = ddl_shape_make(1, (int64_t[]){L->x_global.d[1]});
        ddl_box   b  = {.ndim = 1};
        if (ddl_partition_active(L->P_in)) {
            b.start[0] = xb.start[1];
            b.stop[0]  = xb.stop[1];
        }
        for (int k = 0; bn[k] != NULL; k++) {
            snprintf(m->bnames[m->nbuffers], sizeof m->bnames[0], "%s.%s", s->layers[i].name,
                     bn[k]);
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
    // Labels: per sample (labels_all on every rank, this rank's rows in labels_local), or
    // for segmentation one per voxel of this rank's output box (labels_local only).
    const ddl_layer_t *last = m->layers[m->nlayers - 1];
    m->label_elems          = s->label_elems;
    m->dense                = s->dense;
    m->seg                  = !s->dense && last->y_global.ndim > 2;
    int64_t nl              = s->batch;
    if (m->seg) {
        ddl_box ob = ddl_partition_local_box(last->P_out, &last->y_global);
        ddl_shape os = ddl_box_shape(&ob);
        nl           = ddl_shape_numel(&os) / (os.d[1] > 0 ? os.d[1] : 1);
    }
    m->labels_all   = ddl_calloc((size_t)s->batch, sizeof(int64_t));
    m->labels_local = ddl_calloc((size_t)(nl > 0 ? nl : 1), sizeof(int64_t));
    m->counts       = ddl_calloc(1 + 2 * (size_t)s->num_classes, sizeof(int64_t));
    if (m->labels_all == NULL || m->labels_local == NULL || m->counts == NULL) {
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
    DDL_CHECK(ddl_loss_create(Po, s->dt, &last->y_global, s->loss, s->reduction, &m->loss));
    DDL_CHECK(
        ddl_loss_create(Po, s->dt, &last->y_global, s->loss, DDL_REDUCTION_NONE, &m->loss_each));
    // Its tensors are the model's buffers and its labels were checked on entry (check_batch,
    // check_local): no agreement on them per call.
    ddl_loss_set_io_fixed(m->loss, true);
    ddl_loss_set_io_fixed(m->loss_each, true);
    m->loss_root  = ddl_partition_ranks(Po)[0];
    m->out_box    = ddl_partition_local_box(Po, &last->y_global);
    ddl_shape es  = ddl_shape_make(1, (int64_t[]){0});
    const int *ix = ddl_partition_index(Po);
    if (s->dense) {
        es = ddl_loss_x_shape(m->loss_each); // per value: the output's local box
    } else if (last->y_global.ndim > 2) {
        // Per-voxel losses: every rank its own voxels, the output box without dim 1.
        ddl_shape os = ddl_box_shape(&m->out_box);
        es.ndim      = os.ndim - 1;
        es.d[0]      = os.d[0];
        for (int d = 2; d < os.ndim; d++) {
            es.d[d - 1] = os.d[d];
        }
    } else if (ix != NULL && ix[1] == 0) {
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
    return ddl_scratch_tensor(s->dt, &xs, spec_share_scratch(s), &m->xin); // give_scratch
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
    return ddl_scratch_tensor(s->dt, &ys, spec_share_scratch(s), &m->logits); // give_scratch
}

// Segmentation: the plan that moves rank 0's labels [batch, 1, spatial...] (f64) onto the
// output partition, whose dimension 1 is whole, so each rank gets its voxels' labels.
// Dense targets: rank 0's targets [batch, ...] (the output's shape and dtype) onto the
// output partition, so each rank gets the targets of its box of the output.
static ddl_status build_label_plan(ddl_model_t *m)
{
    if (!m->seg && !m->dense) {
        return DDL_OK;
    }
    const ddl_layer_t *last = m->layers[m->nlayers - 1];
    ddl_shape          g    = last->y_global;
    ddl_dtype          dt   = m->dense ? m->spec->dt : DDL_F64;
    if (m->seg) {
        g.d[1] = 1;
    }
    DDL_CHECK(ddl_repartition_create(m->P_out_root, last->P_out, dt, &g, NULL, &m->lab_plan));
    ddl_shape xs = ddl_repartition_x_shape(m->lab_plan);
    ddl_shape ys = ddl_repartition_y_shape(m->lab_plan);
    DDL_CHECK(
        ddl_scratch_tensor(dt, &xs, spec_share_scratch(m->spec), &m->lab_root)); // give_scratch
    DDL_CHECK(ddl_tensor_create(dt, &ys, &m->lab_local));
    if (m->dense) {
        ddl_shape want = ddl_loss_x_shape(m->loss);
        char      a[128], b[128];
        DDL_REQUIRE(ddl_shape_numel(&want) == 0 ? ddl_tensor_numel(m->lab_local) == 0
                                                : ddl_shape_equal(&ys, &want),
                    DDL_EINTERNAL, "model: the target plan delivers %s, the loss expects %s",
                    ddl_shape_str(&ys, a, sizeof a), ddl_shape_str(&want, b, sizeof b));
        return DDL_OK;
    }
    DDL_REQUIRE(ddl_tensor_numel(m->lab_local) == ddl_tensor_numel(m->loss_el), DDL_EINTERNAL,
                "model: the label plan delivers %lld labels, the output box has %lld voxels",
                (long long)ddl_tensor_numel(m->lab_local), (long long)ddl_tensor_numel(m->loss_el));
    return DDL_OK;
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
    m->fused            = ddl_calloc((size_t)m->nlayers, sizeof *m->fused);
    if (m->layers == NULL || m->act == NULL || m->dact == NULL || m->fused == NULL) {
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
    m->in_box        = in_box;
    if (m->full != NULL) {
        return activation_view(m, &ls, m->full->act[0], &m->act[0]);
    }
    DDL_CHECK(ddl_tensor_create(s->dt, &ls, &m->act[0]));
    DDL_CHECK(ddl_tensor_create(s->dt, &ls, &m->dact[0]));
    return DDL_OK;
}

// The operand slots and the backward plan (see struct ddl_model), once every layer and
// activation exists. Local: no communication.
static ddl_status build_slots(ddl_model_t *m)
{
    const ddl_spec_t *s = m->spec;
    int               n = m->nlayers, nslots = 0;
    m->slot0            = ddl_calloc((size_t)n, sizeof *m->slot0);
    m->run_back         = ddl_calloc((size_t)n, sizeof *m->run_back);
    bool *seen          = ddl_calloc((size_t)n, sizeof *seen);
    if (m->slot0 == NULL || m->run_back == NULL || seen == NULL) {
        ddl_free(seen);
        return ddl_set_error(DDL_ENOMEM, "model: out of memory");
    }
    for (int i = 0; i < n; i++) {
        m->slot0[i] = nslots;
        nslots += s->layers[i].nin;
    }
    m->x_of   = ddl_calloc((size_t)nslots, sizeof *m->x_of);
    m->dx_to  = ddl_calloc((size_t)nslots, sizeof *m->dx_to);
    m->dx_sum = ddl_calloc((size_t)nslots, sizeof *m->dx_sum);
    if (m->x_of == NULL || m->dx_to == NULL || m->dx_sum == NULL) {
        ddl_free(seen);
        return ddl_set_error(DDL_ENOMEM, "model: out of memory");
    }
    // A layer's backward is needed when it has parameters or an operand's gradient leads
    // to parameters (producers come first in the order). A chain skips exactly the data
    // movement before its first layer with parameters.
    for (int t = 0; t < n && m->full == NULL; t++) { // a copy runs no backward
        int i          = s->order[t];
        m->run_back[i] = m->layers[i]->nparams > 0;
        for (int k = 0; k < s->layers[i].nin; k++) {
            int p = s->layers[i].in[k];
            m->run_back[i] |= p != SPEC_INPUT && m->run_back[p];
        }
    }
    // In reverse order, the first backward to reach a needed gradient writes it; every
    // later one adds into it where the layer can (ddl_layer_set_dx_add: a convolution),
    // else writes its slot's scratch, then adds it in. Unneeded gradients (the input's,
    // those leading to no parameter) are overwritten and never read.
    size_t need[SPEC_MAX_INPUTS] = {0};
    for (int t = n - 1; t >= 0; t--) {
        int i = s->order[t];
        for (int k = 0; k < s->layers[i].nin; k++) {
            int p = s->layers[i].in[k], j = m->slot0[i] + k;
            m->x_of[j]  = m->act[p + 1];
            m->dx_to[j] = m->dact[p + 1];
            if (!m->run_back[i] || p == SPEC_INPUT || !m->run_back[p]) {
                continue;
            }
            if (seen[p] && !(s->layers[i].nin == 1 && ddl_layer_set_dx_add(m->layers[i], true))) {
                m->dx_sum[j] = m->dact[p + 1];
                m->dx_to[j]  = NULL; // a scratch view, below
                size_t bytes = ddl_tensor_bytes(m->dact[p + 1]);
                need[k]      = bytes > need[k] ? bytes : need[k];
            }
            seen[p] = true;
        }
    }
    ddl_free(seen);
    for (int k = 0; k < SPEC_MAX_INPUTS; k++) {
        if (need[k] > 0 && (m->scratch[k] = ddl_malloc(need[k])) == NULL) {
            return ddl_set_error(DDL_ENOMEM, "model: out of memory");
        }
    }
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < s->layers[i].nin; k++) {
            int j = m->slot0[i] + k;
            if (m->dx_sum[j] != NULL) {
                DDL_CHECK(ddl_tensor_view(s->dt, &m->dx_sum[j]->shape, m->scratch[k],
                                          &m->dx_to[j]));
            }
        }
    }
    return DDL_OK;
}

// A producer read only by an add, or by a batch norm, takes that layer's gradient as its
// own (spec_grad_alias_of). In reverse order, so that an add whose own gradient is a later
// add's is resolved first. Before build_slots, which reads the gradients.
static ddl_status share_gradients(ddl_model_t *m)
{
    for (int t = m->nlayers - 1; t >= 0; t--) {
        int p = m->spec->order[t], i = spec_grad_alias_of(m->spec, p);
        if (i < 0) {
            continue;
        }
        DDL_REQUIRE(ddl_shape_equal(&m->dact[p + 1]->shape, &m->dact[i + 1]->shape), DDL_EINTERNAL,
                    "model: layers[%d]'s gradient and its consumer's differ", p);
        ddl_tensor_destroy(&m->dact[p + 1]);
        DDL_CHECK(ddl_tensor_view(m->spec->dt, &m->dact[i + 1]->shape, m->dact[i + 1]->data,
                                  &m->dact[p + 1]));
    }
    return DDL_OK;
}

static ddl_status build(ddl_model_t *m)
{
    if (m->full != NULL) {
        m->parts = m->full->parts; // a copy's partitions are the model's
    } else {
        DDL_CHECK(build_partitions(m)); // agreed inside, partition by partition
    }
    STAGE(alloc_layer_tables(m));
    int nparams = 0;
    // In topological order: a layer's operands exist before it is checked against them.
    // They share one scratch block (give_scratch, once the copies are built too).
    ddl_layer_share_scratch(spec_share_scratch(m->spec), m->spec->tuning.share_min_bytes);
    ddl_status lst = DDL_OK;
    for (int t = 0; t < m->nlayers && lst == DDL_OK; t++) {
        lst = ddl_agree(m->comm, build_one_layer(m, m->spec->order[t], &nparams));
    }
    ddl_layer_share_scratch(false, 0);
    DDL_CHECK(lst);
    if (m->full == NULL) { // a copy runs no backward
        STAGE(share_gradients(m));
    }
    STAGE(build_slots(m));
    // A layer whose backward runs but whose operands' gradients nobody reads (a chain's
    // first layer with parameters) skips assembling them (ddl_layer_set_dx_unused).
    for (int i = 0; i < m->nlayers; i++) {
        bool read = false;
        for (int k = 0; k < m->spec->layers[i].nin; k++) {
            int p = m->spec->layers[i].in[k];
            read |= p != SPEC_INPUT && m->run_back[p];
        }
        if (m->run_back[i] && !read) {
            ddl_layer_set_dx_unused(m->layers[i], true);
        }
        // The model hands each layer its own buffers, made from the layer's shapes (build_slots):
        // no agreement on them per call, two allreduces per layer and step fewer.
        ddl_layer_set_io_fixed(m->layers[i], true);
    }
    STAGE(build_tables(m, nparams));
    STAGE(build_loss(m));
    const ddl_layer_t *last = m->layers[m->nlayers - 1];
    if (m->full != NULL) {
        m->P_in_root  = m->full->P_in_root;
        m->P_out_root = m->full->P_out_root;
    } else {
        STAGE(root_partition(m, m->in_global.ndim, &m->P_in_root));
        STAGE(root_partition(m, last->y_global.ndim, &m->P_out_root));
    }
    STAGE(build_input_plan(m));
    STAGE(build_output_plan(m));
    STAGE(build_label_plan(m));
    return DDL_OK;
}

// Rank 0's batch buffers, each used between layer calls only: the input staged for the
// input plan's scatter (xin) and the labels or targets for the label plan's (lab_root),
// both within stage_input, and the output gathered by the output plan (logits), read
// where it is gathered. With the scratch shared they are views of the block too.
static size_t staging_bytes(const ddl_model_t *c)
{
    size_t n = 0;
    ddl_tensor_t *const ts[3] = {c->xin, c->logits, c->lab_root};
    for (int i = 0; i < 3; i++) {
        if (ts[i] != NULL && !ts[i]->owns && ddl_tensor_bytes(ts[i]) > n) {
            n = ddl_tensor_bytes(ts[i]);
        }
    }
    return n;
}

// The layers' shared scratch: one block as large as the largest need among the model's
// layers and its copies' (they run one call at a time) and rank 0's staging buffers
// (staging_bytes), handed to every one of them.
static ddl_status give_scratch(ddl_model_t *m)
{
    size_t need = 0;
    for (int k = -1; k < m->nbuckets; k++) {
        const ddl_model_t *c = k < 0 ? m : m->bucket[k];
        for (int i = 0; i < c->nlayers; i++) {
            need = c->layers[i]->scratch_bytes > need ? c->layers[i]->scratch_bytes : need;
        }
        need = staging_bytes(c) > need ? staging_bytes(c) : need;
    }
    if (!spec_share_scratch(m->spec)) {
        return DDL_OK;
    }
    need = need > DDL_ALIGN ? need : DDL_ALIGN; // the views' data is never NULL
    m->layer_scratch = ddl_malloc(need);
    if (m->layer_scratch == NULL) {
        return ddl_set_error(DDL_ENOMEM, "model: cannot allocate the layers' %zu-byte scratch",
                             need);
    }
    for (int k = -1; k < m->nbuckets; k++) {
        ddl_model_t *c = k < 0 ? m : m->bucket[k];
        for (int i = 0; i < c->nlayers; i++) {
            ddl_layer_set_scratch(c->layers[i], m->layer_scratch);
        }
        ddl_tensor_t *ts[3] = {c->xin, c->logits, c->lab_root};
        for (int i = 0; i < 3; i++) {
            if (ts[i] != NULL && !ts[i]->owns) {
                ts[i]->data = m->layer_scratch;
            }
        }
    }
    return DDL_OK;
}

// The short-batch copies (spec "inference_batches"), smallest first: each one the spec
// parsed at its batch size and built like the model, on the model's communicator, with
// the model's parameters and activation memory (build_one_layer). Collective.
static ddl_status build_buckets(ddl_model_t *m)
{
    const ddl_spec_t *s = m->spec;
    if (s->nbuckets == 0) {
        return DDL_OK;
    }
    m->bucket     = ddl_calloc((size_t)s->nbuckets, sizeof *m->bucket);
    ddl_status st = ddl_agree(
        m->comm, m->bucket != NULL ? DDL_OK : ddl_set_error(DDL_ENOMEM, "model: out of memory"));
    for (int k = 0; st == DDL_OK && k < s->nbuckets; k++) {
        ddl_model_t *b = ddl_calloc(1, sizeof *b);
        st             = b != NULL ? DDL_OK : ddl_set_error(DDL_ENOMEM, "model: out of memory");
        if (b != NULL) {
            b->comm                  = m->comm;
            b->rank                  = m->rank;
            b->full                  = m;
            m->bucket[m->nbuckets++] = b;
            st = spec_parse_at_batch(s->text, s->source, s->world_size, s->buckets[k], &b->spec);
        }
        st = ddl_agree(m->comm, st);
        if (st == DDL_OK) {
            st = build(b);
        }
        if (st != DDL_OK) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", ddl_last_error());
            st = ddl_set_error(st, "%s: the batch-%lld copy (inference_batches): %s", s->source,
                               (long long)s->buckets[k], msg);
        }
    }
    return st;
}

// The environment's settings (the spec's `tuning`, read on each rank) decide which layers
// share their scratch, and with it which exchanges a backward makes, and which layers
// fuse: every rank must have the same, or the ranks would build different layers and wait
// in exchanges the others never make. One all-reduce of (v, -v) gives every rank the
// largest and smallest of each, so all fail alike, with the same message.
static ddl_status agree_tuning(ddl_model_t *m)
{
    const ddl_spec_t  *s        = m->spec;
    enum { NT = 5 };
    static const char *names[NT] = {"DDL_SHARE_SCRATCH", "DDL_SHARE_MIN_BYTES", "DDL_FUSE_BN_RELU",
                                    "DDL_FUSE_ADD_RELU", "DDL_SHARE_BN_GRAD"};
    double v[NT] = {s->tuning.share_scratch, s->tuning.share_min_bytes, s->tuning.fuse_bn_relu,
                    s->tuning.fuse_add_relu, s->tuning.share_bn_grad};
    double mine[2 * NT], all[2 * NT];
    for (int i = 0; i < NT; i++) {
        mine[i]      = v[i];
        mine[NT + i] = -v[i];
    }
    DDL_CHECK_MPI(MPI_Allreduce(mine, all, 2 * NT, MPI_DOUBLE, MPI_MAX, m->comm));
    for (int i = 0; i < NT; i++) {
        DDL_REQUIRE(all[i] == -all[NT + i], DDL_EINVAL,
                    "environment: %s differs between the ranks (%.17g on some, %.17g on others): "
                    "the ranks would build different layers; set it alike on every rank "
                    "(mpirun -x %s)",
                    names[i], -all[NT + i], all[i], names[i]);
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
    if (st == DDL_OK) {
        st = agree_tuning(m);
    }
    if (st == DDL_OK) { // refuse what cannot fit before anything is allocated for it
        st = ddl_agree(m->comm, ddl_spec_check_memory(m->spec, 0));
    }
    if (st == DDL_OK) {
        st = build(m);
    }
    if (st == DDL_OK) {
        st = build_buckets(m);
    }
    if (st == DDL_OK) {
        st = ddl_agree(m->comm, give_scratch(m));
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
    for (int k = 0; k < m->nbuckets; k++) { // they borrow from m
        ddl_model_destroy(&m->bucket[k]);
    }
    ddl_free(m->bucket);
    ddl_optimizer_destroy(&m->opt);
    ddl_loss_destroy(&m->loss);
    ddl_loss_destroy(&m->loss_each);
    ddl_tensor_destroy(&m->loss_el);
    ddl_tensor_destroy(&m->dloss_el);
    ddl_tensor_destroy(&m->logits);
    ddl_tensor_destroy(&m->xin);
    ddl_repartition_destroy(&m->lab_plan);
    ddl_tensor_destroy(&m->lab_root);
    ddl_tensor_destroy(&m->lab_local);
    ddl_free(m->counts);
    ddl_repartition_destroy(&m->in_plan);
    ddl_repartition_destroy(&m->out_plan);
    if (m->full == NULL) {
        ddl_partition_destroy(&m->P_in_root);
        ddl_partition_destroy(&m->P_out_root);
    }
    for (int i = 0; m->layers != NULL && i < m->nlayers; i++) {
        ddl_layer_destroy(&m->layers[i]);
    }
    if (m->slot0 != NULL && m->dx_to != NULL && m->dx_sum != NULL) {
        for (int i = 0; i < m->nlayers; i++) {
            for (int k = 0; k < m->spec->layers[i].nin; k++) {
                if (m->dx_sum[m->slot0[i] + k] != NULL) { // a scratch view
                    ddl_tensor_destroy(&m->dx_to[m->slot0[i] + k]);
                }
            }
        }
    }
    for (int k = 0; k < SPEC_MAX_INPUTS; k++) {
        ddl_free(m->scratch[k]);
    }
    ddl_free(m->layer_scratch); // the model's (a copy has none)
    ddl_free(m->slot0);
    ddl_free(m->run_back);
    ddl_free(m->fused);
    ddl_free(m->x_of);
    ddl_free(m->dx_to);
    ddl_free(m->dx_sum);
    // Any of the tables may be missing after a failed create.
    for (int i = 0; i <= m->nlayers; i++) {
        if (m->act != NULL) {
            ddl_tensor_destroy(&m->act[i]);
        }
        if (m->dact != NULL) {
            ddl_tensor_destroy(&m->dact[i]);
        }
    }
    if (m->spec != NULL && m->full == NULL) {
        for (int i = 0; m->parts != NULL && i < m->spec->nparts; i++) {
            ddl_partition_destroy(&m->parts[i]);
        }
        ddl_free(m->parts);
    }
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
    if (m->full == NULL && m->comm != MPI_COMM_NULL) {
        MPI_Comm_free(&m->comm);
    }
    ddl_free(m);
    *mp = NULL;
}

// ---- a step ----------------------------------------------------------------------

// What a step or evaluation learns from: class labels (cross-entropy; count *
// label_elems of them) or dense values (count * out_elems in the spec's dtype, `bytes`
// long). NULL where a command takes none (predict).
typedef struct targets {
    const int64_t *labels;
    const void    *values;
    size_t         bytes;
    bool           local; // every rank wrote its own box already (ddl_model_local_input)
} targets;

// The values a dense target of the spec's loss may take: finite, in [0, 1] for the
// binary cross-entropies, >= 0 for the Poisson rate and the KL divergence's
// probabilities (as text for messages in *rule).
static void target_range(const ddl_spec_t *s, double *lo, double *hi, const char **rule)
{
    bool unit = s->loss == DDL_LOSS_BCE || s->loss == DDL_LOSS_BCE_WITH_LOGITS;
    bool pos  = s->loss == DDL_LOSS_POISSON_NLL || s->loss == DDL_LOSS_KL_DIV;
    *lo       = unit || pos ? 0.0 : -INFINITY;
    *hi       = unit ? 1.0 : INFINITY;
    *rule     = unit ? "in [0, 1]" : pos ? "finite and >= 0" : "finite";
}

// The first of n dense target values outside the loss's range: an error naming it as
// value `(first + i) % per` of sample `row0 + (first + i) / per`.
static ddl_status check_range(const ddl_spec_t *s, const char *what, const void *values, int64_t n,
                              int64_t row0, int64_t per)
{
    double      lo, hi;
    const char *rule;
    target_range(s, &lo, &hi, &rule);
    for (int64_t i = 0; i < n; i++) {
        double v = s->dt == DDL_F32 ? ((const float *)values)[i] : ((const double *)values)[i];
        if (!isfinite(v) || v < lo || v > hi) {
            return ddl_set_error(DDL_EINVAL,
                                 "%s: target %g of sample %lld, value %lld is %s (%s targets "
                                 "must be %s)",
                                 what, v, (long long)(row0 + i / per), (long long)(i % per),
                                 isfinite(v) ? "out of range" : "not finite", ddl_spec_loss_name(s),
                                 rule);
        }
    }
    return DDL_OK;
}

// Rank 0: count samples of dense targets in range (check_range).
static ddl_status check_values(const ddl_model_t *m, const char *what, const targets *t, int64_t n)
{
    const ddl_spec_t *s  = m->spec;
    int64_t           E  = s->out_elems;
    size_t            es = ddl_dtype_size(s->dt);
    DDL_REQUIRE(n == 0 || t->values != NULL, DDL_EINVAL, "%s: rank 0 must pass the targets", what);
    DDL_REQUIRE(t->bytes / es / (size_t)E >= (size_t)n, DDL_EINVAL,
                "%s: %lld samples of %lld target values (%s) need %zu bytes, got %zu", what,
                (long long)n, (long long)E, ddl_dtype_name(s->dt), (size_t)n * (size_t)E * es,
                t->bytes);
    return check_range(s, what, t->values, n * E, 0, E);
}

// Labels in [0, classes), `per` per sample (1, or a segmentation sample's voxels, all
// or a rank's box of them), n samples from sample row0 on.
static ddl_status check_label_rows(const ddl_model_t *m, const char *what, const int64_t *labels,
                                   int64_t n, int64_t row0, int64_t per)
{
    int64_t C = m->spec->num_classes;
    for (int64_t i = 0; i < n * per; i++) {
        if (labels[i] < 0 || labels[i] >= C) {
            if (m->seg) {
                return ddl_set_error(
                    DDL_EINVAL,
                    "%s: label %lld of sample %lld, voxel %lld%s is outside "
                    "[0, %lld)",
                    what, (long long)labels[i], (long long)(row0 + i / per), (long long)(i % per),
                    per < m->label_elems ? " of this rank's box" : "", (long long)C);
            }
            return ddl_set_error(DDL_EINVAL, "%s: label %lld of sample %lld is outside [0, %lld)",
                                 what, (long long)labels[i], (long long)(row0 + i), (long long)C);
        }
    }
    return DDL_OK;
}

// Rank 0: labels in [0, classes), one per sample or per output voxel.
static ddl_status check_labels(const ddl_model_t *m, const char *what, const int64_t *labels,
                               int64_t n)
{
    DDL_REQUIRE(n == 0 || labels != NULL, DDL_EINVAL, "%s: rank 0 must pass the labels", what);
    return check_label_rows(m, what, labels, n, 0, m->label_elems);
}

// Rank 0 checks a batch handed in by the caller before any rank moves data: `count`
// samples in [lo, hi], x holding at least count samples (x_bytes), and the targets the
// model trains on (when t is not NULL): labels in [0, classes), or dense values; `pre`
// is rank 0's verdict on anything else it checked first. Every rank then learns the
// verdict and rank 0's count in one broadcast (ddl_agree_root: only rank 0 checks).
static ddl_status check_batch(ddl_model_t *m, const char *what, const void *x, size_t x_bytes,
                              const targets *t, int64_t *count, int64_t lo, int64_t hi,
                              ddl_status pre)
{
    ddl_status st = DDL_OK;
    int64_t    n  = *count;
    if (m->rank == 0) {
        if (n < lo || n > hi) {
            st = ddl_set_error(DDL_EINVAL, "%s: count %lld must be in [%lld, %lld] (batch_size)",
                               what, (long long)n, (long long)lo, (long long)hi);
        } else if (n > 0 && x == NULL) {
            st = ddl_set_error(DDL_EINVAL, "%s: rank 0 must pass the samples", what);
        } else if (x_bytes / m->sample_bytes < (uint64_t)n) {
            st = ddl_set_error(DDL_EINVAL, "%s: %lld samples of %zu bytes need %llu bytes, got %zu",
                               what, (long long)n, m->sample_bytes,
                               (unsigned long long)((uint64_t)n * m->sample_bytes), x_bytes);
        } else if (t != NULL && m->dense) {
            st = check_values(m, what, t, n);
        } else if (t != NULL) {
            st = check_labels(m, what, t->labels, n);
        }
        st = st != DDL_OK ? st : pre;
    }
    DDL_CHECK(ddl_agree_root(m->comm, 0, st, &n, (int)sizeof n));
    *count = n;
    return DDL_OK;
}

// Rank 0's `count` samples into the input partition, through the model's own batch
// buffer (the rest of the batch is zero padding, never read from the caller); with
// targets: rank 0's labels (padded with class 0) to every rank, and this rank's rows,
// or its dense targets (padded with zeros) onto the output partition.
static ddl_status stage_input(ddl_model_t *m, const void *x, const targets *t, int64_t count)
{
    const ddl_spec_t *s = m->spec;
    if (t != NULL && t->local) {
        return DDL_OK; // each rank wrote its own box of the input and targets
    }
    if (m->rank == 0) {
        size_t used = (size_t)count * m->sample_bytes;
        if (used > 0) {
            memcpy(m->xin->data, x, used);
        }
        memset((char *)m->xin->data + used, 0, ddl_tensor_bytes(m->xin) - used);
    }
    DDL_CHECK(ddl_repartition_forward(m->in_plan, m->xin, m->act[0]));
    if (t != NULL && m->dense) {
        if (m->rank == 0) {
            size_t used = (size_t)(count * s->out_elems) * ddl_dtype_size(s->dt);
            if (used > 0) {
                memcpy(m->lab_root->data, t->values, used);
            }
            memset((char *)m->lab_root->data + used, 0, ddl_tensor_bytes(m->lab_root) - used);
        }
        DDL_CHECK(ddl_repartition_forward(m->lab_plan, m->lab_root, m->lab_local));
    } else if (t != NULL && m->seg) {
        // Class indices as f64 are exact; the padding samples get class 0.
        if (m->rank == 0) {
            double *lr = m->lab_root->data;
            int64_t n  = count * m->label_elems, all = ddl_tensor_numel(m->lab_root);
            for (int64_t i = 0; i < all; i++) {
                lr[i] = i < n ? (double)t->labels[i] : 0.0;
            }
        }
        DDL_CHECK(ddl_repartition_forward(m->lab_plan, m->lab_root, m->lab_local));
        const double *ll = m->lab_local->data;
        for (int64_t i = 0; i < ddl_tensor_numel(m->lab_local); i++) {
            m->labels_local[i] = (int64_t)ll[i];
        }
    } else if (t != NULL) {
        if (m->rank == 0) {
            for (int64_t i = 0; i < s->batch; i++) {
                m->labels_all[i] = i < count ? t->labels[i] : 0;
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
    const ddl_spec_t *s    = m->spec;
    uint64_t          step = (uint64_t)ddl_optimizer_steps((m->full != NULL ? m->full : m)->opt);
    for (int t = 0; t < m->nlayers; t++) {
        int          i = s->order[t], n = s->layers[i].nin;
        ddl_layer_t *L = m->layers[i];
        if (m->fused[i]) {
            continue; // applied by its batch norm or add
        }
        ddl_layer_set_training(L, training);
        ddl_layer_set_rng_step(L, step);
        if (n == 1) {
            DDL_CHECK(ddl_layer_forward(L, m->x_of[m->slot0[i]], m->act[i + 1]));
        } else {
            DDL_CHECK(ddl_layer_forward_n(L, n, &m->x_of[m->slot0[i]], m->act[i + 1]));
        }
    }
    return DDL_OK;
}

// The adjoints in reverse order from the loss's gradient (already in the last output's
// gradient), summing the gradients of outputs consumed more than once.
static ddl_status backward(ddl_model_t *m)
{
    const ddl_spec_t *s = m->spec;
    for (int t = m->nlayers - 1; t >= 0; t--) {
        int i = s->order[t], n = s->layers[i].nin, j0 = m->slot0[i];
        if (!m->run_back[i] || m->fused[i]) {
            continue; // a fused ReLU's gradient is its batch norm's or add's: nothing to move
        }
        if (n == 1) {
            DDL_CHECK(ddl_layer_backward(m->layers[i], m->dact[i + 1], m->dx_to[j0]));
        } else {
            DDL_CHECK(ddl_layer_backward_n(m->layers[i], m->dact[i + 1], n, &m->dx_to[j0]));
        }
        for (int j = j0; j < j0 + n; j++) {
            if (m->dx_sum[j] != NULL) {
                ddl_box all = ddl_box_full(&m->dx_sum[j]->shape);
                ddl_tensor_add_box(m->dx_to[j], &all, m->dx_sum[j], &all);
            }
        }
    }
    return DDL_OK;
}

// Segmentation: per-voxel argmax hits and per-class intersection / union counts over
// this rank's voxels of the first `count` samples, summed over the ranks (m->counts).
static ddl_status count_voxels(ddl_model_t *m, int64_t count, int64_t *correct)
{
    int64_t        C = m->spec->num_classes, *cnt = m->counts;
    int64_t       *inter = cnt + 1, *uni = cnt + 1 + C;
    const ddl_tensor_t *y = m->act[m->nlayers];
    for (int64_t k = 0; k < 1 + 2 * C; k++) {
        cnt[k] = 0;
    }
    int64_t rows = m->out_box.stop[0] - m->out_box.start[0];
    int64_t V    = rows > 0 ? ddl_tensor_numel(m->lab_local) / rows : 0;
    for (int64_t b = 0; b < rows && m->out_box.start[0] + b < count; b++) {
        for (int64_t v = 0; v < V; v++) {
            int64_t best = 0;
            double  bv   = ddl_tensor_get(y, (b * C) * V + v);
            for (int64_t c = 1; c < C; c++) {
                double x = ddl_tensor_get(y, (b * C + c) * V + v);
                if (x > bv) {
                    bv   = x;
                    best = c;
                }
            }
            int64_t lab = m->labels_local[b * V + v];
            cnt[0] += best == lab;
            inter[lab] += best == lab;
            uni[lab]++;
            uni[best] += best != lab;
        }
    }
    DDL_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, cnt, (int)(1 + 2 * C), MPI_INT64_T, MPI_SUM,
                                m->comm));
    *correct = cnt[0];
    return DDL_OK;
}

// The output onto rank 0 (the output plan), then argmax hits among the first `count`
// rows in *hits on rank 0, zero elsewhere (segmentation: count_voxels, no gathering),
// for the step's closing sum (the tail below).
static ddl_status count_correct(ddl_model_t *m, int64_t count, double *hits_out)
{
    if (m->seg) {
        int64_t all = 0;
        DDL_CHECK(count_voxels(m, count, &all));
        *hits_out = m->rank == 0 ? (double)all : 0.0;
        return DDL_OK;
    }
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
    *hits_out = (double)hits;
    return DDL_OK;
}

// Dense targets: the model's prediction of a target value from an output value, in the
// target's space (the mean the loss models): the output itself, its sigmoid for
// bce_with_logits, its exponential for the Poisson log-rate and the KL divergence's
// log-probabilities (the log-target form compares log-probabilities as they are).
static double predicted(ddl_loss_kind k, double y)
{
    switch (k) {
    case DDL_LOSS_BCE_WITH_LOGITS:
        return 1.0 / (1.0 + exp(-y));
    case DDL_LOSS_POISSON_NLL:
    case DDL_LOSS_KL_DIV:
        return exp(y);
    default:
        return y;
    }
}

// Dense targets: over this rank's box of the output, the first `count` samples only,
// this rank's part of [the loss of each sample under the reduction (from the elementwise
// losses when `el`), sum (p - t)^2, sum t^2, side-of-1/2 hits] into v[0..4), for the
// step's closing sum (the tail below).
static void dense_sums(ddl_model_t *m, int64_t count, const ddl_tensor_t *el, double *v)
{
    const ddl_spec_t   *s = m->spec;
    const ddl_tensor_t *y = m->act[m->nlayers], *t = m->lab_local;
    int64_t             n      = ddl_tensor_numel(t);
    int64_t             rows   = m->out_box.stop[0] - m->out_box.start[0];
    int64_t             per    = rows > 0 ? n / rows : 1;
    int64_t             r0     = m->out_box.start[0];
    bool                binary = s->loss == DDL_LOSS_BCE || s->loss == DDL_LOSS_BCE_WITH_LOGITS;
    for (int k = 0; k < 4; k++) {
        v[k] = 0.0;
    }
    for (int64_t i = 0; i < n && r0 + i / per < count; i++) {
        double p = predicted(s->loss, ddl_tensor_get(y, i)), tv = ddl_tensor_get(t, i);
        if (el != NULL) {
            v[0] += ddl_tensor_get(el, i);
        }
        v[1] += (p - tv) * (p - tv);
        v[2] += tv * tv;
        v[3] += binary && (p > 0.5) == (tv > 0.5);
    }
    if (s->reduction == DDL_REDUCTION_MEAN) {
        v[0] /= (double)s->out_elems; // a sample's loss is the mean over its values
    }
}

// A step or an evaluation ends with one synchronisation: the values some ranks hold (the
// loss on its root, the hits on rank 0, each rank's part of the dense sums), summed over
// every rank together with the status (ddl_agree_sum), where a broadcast of the loss, one
// of the hits or the sums' allreduce, and the agreement were four.
enum { TAIL_LOSS, TAIL_HITS, TAIL_DENSE, TAIL_N = TAIL_DENSE + 4 };

static ddl_status agree_tail(const ddl_model_t *m, ddl_status st, double *tail)
{
    return ddl_agree_sum(m->comm, st, tail, TAIL_N);
}

static ddl_dense_metrics dense_of(const double *tail)
{
    const double *v = tail + TAIL_DENSE;
    return (ddl_dense_metrics){v[0], v[1], v[2], (int64_t)v[3]};
}

// The step's local part: tail[TAIL_LOSS] the reduced loss on its root (zero elsewhere),
// then the hits or the dense sums of its forward (before the update).
static ddl_status train_step(ddl_model_t *m, const void *x, const targets *t, double *tail)
{
    DDL_CHECK(stage_input(m, x, t, m->spec->batch));
    DDL_CHECK(forward(m, true));
    double value = 0.0;
    DDL_CHECK(ddl_loss_forward(m->loss, m->act[m->nlayers], m->dense ? m->lab_local : NULL,
                               m->dense ? NULL : m->labels_local, &value, NULL));
    for (int i = 0; i < m->nlayers; i++) {
        ddl_layer_zero_grad(m->layers[i]);
    }
    DDL_CHECK(ddl_loss_backward(m->loss, 1.0, NULL, m->dact[m->nlayers]));
    DDL_CHECK(backward(m));
    ddl_optimizer_step(m->opt);
    tail[TAIL_LOSS] = m->rank == m->loss_root ? value : 0.0;
    if (m->dense) {
        // The output is this step's forward (before the update), as for the hits below.
        dense_sums(m, m->spec->batch, NULL, tail + TAIL_DENSE);
        return DDL_OK;
    }
    return count_correct(m, m->spec->batch, tail + TAIL_HITS);
}

// A training step's dense metrics: the loss of each sample from the reduced loss.
static ddl_dense_metrics train_dense_of(const ddl_model_t *m, const double *tail)
{
    ddl_dense_metrics dm = dense_of(tail);
    dm.loss_sum =
        tail[TAIL_LOSS] * (m->spec->reduction == DDL_REDUCTION_SUM ? 1.0 : (double)m->spec->batch);
    return dm;
}

static ddl_status want_dense(const ddl_model_t *m, const char *what, bool dense)
{
    ddl_status st = DDL_OK;
    if (m->dense != dense) {
        st = ddl_set_error(DDL_EINVAL,
                           dense ? "%s: the loss %s trains on class labels, not dense targets"
                                 : "%s: the loss %s trains on dense targets shaped like the "
                                   "output, not class labels",
                           what, ddl_spec_loss_name(m->spec));
    }
    return st; // m->dense is the spec's, the same on every rank: no agreement needed
}

ddl_status ddl_model_train_step(ddl_model_t *m, const void *x, size_t x_bytes,
                                const int64_t *labels, int64_t count, double *loss,
                                int64_t *correct)
{
    DDL_CHECK(want_dense(m, "train_step", false));
    targets t = {.labels = labels};
    DDL_CHECK(check_batch(m, "train_step", x, x_bytes, &t, &count, m->spec->batch, m->spec->batch,
                          DDL_OK));
    double     tail[TAIL_N] = {0};
    ddl_status st           = agree_tail(m, train_step(m, x, &t, tail), tail);
    if (st == DDL_OK) {
        *loss    = tail[TAIL_LOSS];
        *correct = (int64_t)tail[TAIL_HITS];
    }
    return st;
}

ddl_status ddl_model_train_step_dense(ddl_model_t *m, const void *x, size_t x_bytes,
                                      const void *targets_, size_t t_bytes, int64_t count,
                                      double *loss, ddl_dense_metrics *out)
{
    DDL_CHECK(want_dense(m, "train_step", true));
    targets t = {.values = targets_, .bytes = t_bytes};
    DDL_CHECK(check_batch(m, "train_step", x, x_bytes, &t, &count, m->spec->batch, m->spec->batch,
                          DDL_OK));
    double     tail[TAIL_N] = {0};
    ddl_status st           = agree_tail(m, train_step(m, x, &t, tail), tail);
    if (st == DDL_OK) {
        *loss = tail[TAIL_LOSS];
        if (out != NULL) {
            *out = train_dense_of(m, tail);
        }
    }
    return st;
}

// The model that runs `count` samples forward: the smallest short-batch copy that holds
// them, with the model's running statistics (batch norm's, a few values per channel)
// copied in, or the model itself. Every rank picks the same one (count is agreed).
static ddl_model_t *runner(ddl_model_t *m, int64_t count)
{
    for (int k = 0; k < m->nbuckets; k++) {
        ddl_model_t *b = m->bucket[k];
        if (count <= b->spec->batch) {
            for (int j = 0; j < m->nbuffers; j++) {
                size_t n = ddl_tensor_bytes(m->buffers[j].local);
                if (n > 0) {
                    memcpy(b->buffers[j].local->data, m->buffers[j].local->data, n);
                }
            }
            return b;
        }
    }
    return m;
}

// The evaluation's local part of the tail: this rank's part of the summed loss, then the
// hits or the dense sums.
static ddl_status eval_batch(ddl_model_t *m, const void *x, const targets *t, int64_t count,
                             double *tail)
{
    DDL_CHECK(stage_input(m, x, t, count));
    DDL_CHECK(forward(m, false));
    DDL_CHECK(ddl_loss_forward(m->loss_each, m->act[m->nlayers], m->dense ? m->lab_local : NULL,
                               m->dense ? NULL : m->labels_local, NULL, m->loss_el));
    if (m->dense) {
        dense_sums(m, count, m->loss_el, tail + TAIL_DENSE);
        return DDL_OK;
    }
    // Per-row losses live on the column-0 ranks: sum the valid rows everywhere. A
    // segmentation sample's loss is the mean over its voxels (each rank holds its own).
    double  local = 0.0;
    int64_t r0    = m->out_box.start[0];
    int64_t n     = ddl_tensor_numel(m->loss_el);
    int64_t per   = m->seg && m->loss_el->shape.d[0] > 0 ? n / m->loss_el->shape.d[0] : 1;
    for (int64_t i = 0; i < n; i++) {
        if (r0 + i / per < count) {
            local += ddl_tensor_get(m->loss_el, i);
        }
    }
    tail[TAIL_LOSS] = local / (double)m->label_elems;
    return count_correct(m, count, tail + TAIL_HITS);
}

ddl_status ddl_model_eval(ddl_model_t *m, const void *x, size_t x_bytes, const int64_t *labels,
                          int64_t count, double *loss_sum, int64_t *correct)
{
    DDL_CHECK(want_dense(m, "eval", false));
    targets t = {.labels = labels};
    DDL_CHECK(check_batch(m, "eval", x, x_bytes, &t, &count, 0, m->spec->batch, DDL_OK));
    double       tail[TAIL_N] = {0};
    ddl_model_t *r            = runner(m, count);
    ddl_status   st           = agree_tail(m, eval_batch(r, x, &t, count, tail), tail);
    if (st == DDL_OK && r != m && m->seg) { // the counts are the model's (class_counts)
        memcpy(m->counts, r->counts, (1 + 2 * (size_t)m->spec->num_classes) * sizeof *m->counts);
    }
    if (st == DDL_OK) {
        *loss_sum = tail[TAIL_LOSS];
        *correct  = (int64_t)tail[TAIL_HITS];
    }
    return st;
}

ddl_status ddl_model_eval_dense(ddl_model_t *m, const void *x, size_t x_bytes, const void *targets_,
                                size_t t_bytes, int64_t count, ddl_dense_metrics *out)
{
    DDL_CHECK(want_dense(m, "eval", true));
    targets t = {.values = targets_, .bytes = t_bytes};
    DDL_CHECK(check_batch(m, "eval", x, x_bytes, &t, &count, 0, m->spec->batch, DDL_OK));
    double       tail[TAIL_N] = {0};
    ddl_model_t *r            = runner(m, count);
    ddl_status   st           = agree_tail(m, eval_batch(r, x, &t, count, tail), tail);
    if (st == DDL_OK) {
        *out = dense_of(tail);
    }
    return st;
}

// ---- per-rank ingest ----------------------------------------------------------------

void ddl_model_local_input(ddl_model_t *m, ddl_box *box, void **data)
{
    *box  = m->in_box;
    *data = m->act[0]->data;
}

void ddl_model_local_targets(ddl_model_t *m, ddl_box *box, void **data)
{
    *box  = m->dense ? m->out_box : (ddl_box){0};
    *data = m->dense ? m->lab_local->data : NULL;
}

void ddl_model_local_labels(ddl_model_t *m, ddl_box *box, int64_t **labels)
{
    *box    = (ddl_box){0};
    *labels = NULL;
    if (m->seg) {
        // The label plan's box: the output's, with dimension 1 (whole there) of extent 1.
        *box          = m->out_box;
        box->start[1] = 0;
        box->stop[1]  = 1;
        *labels       = m->labels_local;
    }
}

ddl_traffic_count ddl_model_scatter_traffic(const ddl_model_t *m)
{
    ddl_traffic_count in = ddl_repartition_traffic(m->in_plan, DDL_TRAFFIC_FORWARD);
    ddl_traffic_count t  = ddl_repartition_traffic(m->lab_plan, DDL_TRAFFIC_FORWARD);
    bool              tg = m->dense && m->lab_plan != NULL;
    return (ddl_traffic_count){in.sent + (tg ? t.sent : 0), in.received + (tg ? t.received : 0),
                               in.calls + (tg ? 1 : 0)};
}

// Every rank checks the targets (labels: a segmentation model's class labels) of its own
// box (the first `count` rows), then all agree: a bad value seen by one rank only stops
// every rank.
static ddl_status check_local(const ddl_model_t *m, const char *what, int64_t count, bool labels)
{
    ddl_status st = labels ? DDL_OK : want_dense(m, what, true);
    if (labels && !m->seg) {
        st = ddl_set_error(DDL_EINVAL,
                           "%s: per-rank labels are a segmentation model's (a class label per "
                           "output voxel); this model's loss %s takes %s",
                           what, ddl_spec_loss_name(m->spec),
                           m->dense ? "dense targets (ddl_model_local_targets)"
                                    : "one label per sample, from rank 0");
    }
    if (st != DDL_OK) {
        return st; // from the spec, the same on every rank
    }
    int64_t r0 = m->out_box.start[0], r1 = m->out_box.stop[0];
    int64_t rows = r1 - r0, n = ddl_tensor_numel(m->lab_local);
    if (rows > 0 && n > 0) {
        int64_t per  = n / rows;
        int64_t keep = (count < r1 ? count : r1) - r0;
        if (keep > 0) {
            st = labels ? check_label_rows(m, what, m->labels_local, keep, r0, per)
                        : check_range(m->spec, what, m->lab_local->data, keep * per, r0, per);
        }
    }
    return ddl_agree(m->comm, st);
}

// Rank 0's count of an evaluation on the ranks' own buffers, checked (1..batch_size)
// and shared.
static ddl_status agree_local_count(ddl_model_t *m, int64_t *count)
{
    ddl_status st = DDL_OK;
    if (m->rank == 0 && (*count < 1 || *count > m->spec->batch)) {
        st = ddl_set_error(DDL_EINVAL, "eval: count %lld must be in [1, %lld] (batch_size)",
                           (long long)*count, (long long)m->spec->batch);
    }
    return ddl_agree_root(m->comm, 0, st, count, (int)sizeof *count);
}

ddl_status ddl_model_train_step_local(ddl_model_t *m, double *loss, ddl_dense_metrics *out)
{
    DDL_CHECK(check_local(m, "train_step", m->spec->batch, false));
    targets    t            = {.local = true};
    double     tail[TAIL_N] = {0};
    ddl_status st           = agree_tail(m, train_step(m, NULL, &t, tail), tail);
    if (st == DDL_OK) {
        *loss = tail[TAIL_LOSS];
        if (out != NULL) {
            *out = train_dense_of(m, tail);
        }
    }
    return st;
}

ddl_status ddl_model_eval_local(ddl_model_t *m, int64_t count, ddl_dense_metrics *out)
{
    DDL_CHECK(agree_local_count(m, &count));
    DDL_CHECK(check_local(m, "eval", count, false));
    // The full batch's buffers hold the data (rows past count are zero): the model itself
    // runs them, in evaluation mode.
    targets t            = {.local = true};
    double  tail[TAIL_N] = {0};
    ddl_status st           = agree_tail(m, eval_batch(m, NULL, &t, count, tail), tail);
    if (st == DDL_OK) {
        *out = dense_of(tail);
    }
    return st;
}

ddl_status ddl_model_train_step_local_labels(ddl_model_t *m, double *loss, int64_t *correct)
{
    DDL_CHECK(check_local(m, "train_step", m->spec->batch, true));
    targets    t            = {.local = true};
    double     tail[TAIL_N] = {0};
    ddl_status st           = agree_tail(m, train_step(m, NULL, &t, tail), tail);
    if (st == DDL_OK) {
        *loss    = tail[TAIL_LOSS];
        *correct = (int64_t)tail[TAIL_HITS];
    }
    return st;
}

ddl_status ddl_model_eval_local_labels(ddl_model_t *m, int64_t count, double *loss_sum,
                                       int64_t *correct)
{
    DDL_CHECK(agree_local_count(m, &count));
    DDL_CHECK(check_local(m, "eval", count, true));
    targets    t            = {.local = true};
    double     tail[TAIL_N] = {0};
    ddl_status st           = agree_tail(m, eval_batch(m, NULL, &t, count, tail), tail);
    if (st == DDL_OK) {
        *loss_sum = tail[TAIL_LOSS];
        *correct  = (int64_t)tail[TAIL_HITS];
    }
    return st;
}

ddl_status ddl_model_predict(ddl_model_t *m, const void *x, size_t x_bytes, int64_t count,
                             void *logits, size_t logits_bytes)
{
    // Rank 0's checks of the output buffer, then of the batch, agreed in one broadcast.
    size_t need =
        (size_t)(count > 0 ? count : 0) * (size_t)m->spec->out_elems * ddl_dtype_size(m->spec->dt);
    ddl_status st   = DDL_OK;
    if (m->rank == 0 && count > 0 && count <= m->spec->batch &&
        (logits == NULL || logits_bytes < need)) {
        st = ddl_set_error(DDL_EINVAL, "predict: %lld samples of outputs need %zu bytes, got %zu%s",
                           (long long)count, need, logits == NULL ? 0 : logits_bytes,
                           logits == NULL ? " (NULL)" : "");
    }
    DDL_CHECK(check_batch(m, "predict", x, x_bytes, NULL, &count, 0, m->spec->batch, st));
    need           = (size_t)count * (size_t)m->spec->out_elems * ddl_dtype_size(m->spec->dt);
    ddl_model_t *r = runner(m, count);
    st             = stage_input(r, x, NULL, count);
    if (st == DDL_OK) {
        st = forward(r, false);
    }
    if (st == DDL_OK) {
        st = ddl_repartition_forward(r->out_plan, r->act[r->nlayers], r->logits);
    }
    if (st == DDL_OK && m->rank == 0 && need > 0) {
        memcpy(logits, r->logits->data, need);
    }
    return ddl_agree(m->comm, st);
}

// ---- accessors -------------------------------------------------------------------

size_t ddl__model_scratch_bytes(const ddl_model_t *m, int *users)
{
    size_t need = 0;
    *users      = 0;
    for (int k = -1; k < m->nbuckets; k++) {
        const ddl_model_t *c = k < 0 ? m : m->bucket[k];
        for (int i = 0; i < c->nlayers; i++) {
            need = c->layers[i]->scratch_bytes > need ? c->layers[i]->scratch_bytes : need;
            *users += c->layers[i]->scratch_set;
        }
    }
    return m->layer_scratch != NULL ? need : 0;
}

int ddl__model_fused_count(const ddl_model_t *m)
{
    int n = 0;
    for (int i = 0; i < m->nlayers; i++) {
        n += m->fused[i];
    }
    return n;
}

int ddl__model_grad_alias_count(const ddl_model_t *m)
{
    int n = 0;
    for (int i = 0; i < m->nlayers && m->full == NULL; i++) {
        n += spec_grad_alias_of(m->spec, i) >= 0;
    }
    return n;
}

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
bool ddl_model_class_counts(const ddl_model_t *m, int64_t *inter, int64_t *uni)
{
    if (!m->seg) {
        return false;
    }
    int64_t C = m->spec->num_classes;
    memcpy(inter, m->counts + 1, sizeof(int64_t) * (size_t)C);
    memcpy(uni, m->counts + 1 + C, sizeof(int64_t) * (size_t)C);
    return true;
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
// is computed here from that call (a segmentation model's per-voxel labels move by the
// label plan instead, counted like the other plans). A step runs each of these once.

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
    traffic_row(&rows[k], "loss", ddl_spec_loss_name(m->spec));
    ddl_loss_traffic(m->loss, false, &rows[k].fwd);
    ddl_loss_traffic(m->loss, true, &rows[k++].bwd);
    if (m->seg || m->dense) {
        // Per-voxel labels and dense targets move by the label plan, a counted
        // Repartition like the others.
        traffic_row(&rows[k], m->dense ? "targets" : "labels", "repartition");
        traffic_plan(&rows[k++], m->lab_plan);
    } else {
        traffic_row(&rows[k], "labels", "mpi_bcast");
        int size;
        DDL_CHECK_MPI(MPI_Comm_size(m->comm, &size));
        uint64_t lb = (uint64_t)m->spec->batch * sizeof(int64_t);
        ddl_traffic_count *c = &rows[k++].fwd.c[DDL_TRAFFIC_BROADCAST][DDL_TRAFFIC_FORWARD];
        *c = (ddl_traffic_count){m->rank == 0 ? (uint64_t)(size - 1) * lb : 0,
                                 m->rank == 0 ? 0 : lb, 1};
    }
    traffic_row(&rows[k], "output", "repartition");
    if (!m->seg && !m->dense) {
        // A segmentation step counts its hits on each rank's own voxels (count_voxels):
        // the output plan runs for predictions only, not in a step.
        traffic_plan(&rows[k], m->out_plan);
    }
    k++;
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
