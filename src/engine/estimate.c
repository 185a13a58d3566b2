// engine/estimate.c: a spec's memory per rank, estimated from the parsed spec alone, so a
// model that cannot fit is refused before ddl_model_create allocates (or page-faults) any
// of it. See ddl/estimate.h for what is counted.
//
// Every tensor of the model lives on a partition P (a list of world ranks and a shape); a
// rank of P holds at most the largest balanced block, prod_d ceil(G_d / P_d) elements of a
// global shape G. The estimate adds each tensor's block to every rank of its partition and
// reports the rank with the largest sum. All sums are in double: a hostile spec may ask for
// 2^34-element tensors in 4096 layers, which overflows int64 bytes.
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "ddl/base.h"
#include "ddl/decomp.h"
#include "ddl/estimate.h"
#include "ddl/kernels.h"
#include "engine/layer_registry.h"
#include "engine/spec_internal.h"

struct spec_est {
    const ddl_spec_t *s;
    double (*per)[SPEC_E_COUNT]; // per world rank
    double item;
    // A short-batch copy of the model (spec inference_batches): its parameters and
    // activations are the model's, so only its own working copies and workspaces count.
    bool copy;
};

const ddl_spec_t *spec_est_spec(const spec_est *e)
{
    return e->s;
}

bool spec_est_copy(const spec_est *e)
{
    return e->copy;
}

double spec_est_item(const spec_est *e)
{
    return e->item;
}

double spec_est_ceil_div(double n, double p)
{
    return p > 1 ? ceil(n / p) : n;
}

// The largest block of global shape g on partition P (-1: not partitioned, whole).
double spec_est_local_numel(const ddl_spec_t *s, const ddl_shape *g, int P)
{
    double n = 1;
    if (P < 0 || P >= s->nparts || s->parts[P].ndim != g->ndim) {
        double split = 1;
        if (P >= 0 && P < s->nparts) {
            split = s->parts[P].nranks;
        }
        for (int d = 0; d < g->ndim; d++) {
            n *= (double)g->d[d];
        }
        return spec_est_ceil_div(n, split);
    }
    for (int d = 0; d < g->ndim; d++) {
        n *= spec_est_ceil_div((double)g->d[d], s->parts[P].shape[d]);
    }
    return n;
}

// Adds bytes to category cat of every rank of partition P (every rank when P < 0).
void spec_est_add(spec_est *a, int P, int cat, double bytes)
{
    if (P < 0 || P >= a->s->nparts) {
        for (int r = 0; r < a->s->world_size; r++) {
            a->per[r][cat] += bytes;
        }
        return;
    }
    const spec_partition *p = &a->s->parts[P];
    for (int i = 0; i < p->nranks; i++) {
        if (p->ranks[i] >= 0 && p->ranks[i] < a->s->world_size) {
            a->per[p->ranks[i]][cat] += bytes;
        }
    }
}

// A window operation's input x (global g, spatial window k, s, p, d) on P, per rank of P:
// `bufs` halo-padded buffers (the halo exchange's, ddl/primitives.h: each dimension
// ghost_lo | pad_lo | bulk | pad_hi | ghost_hi) and, where the window needs only part of
// the buffer, `crops` copies of that part (ddl_halo_dim's need range). The same
// ddl_halo_dim_compute the exchange runs, so the figures are the layer's own.
void spec_est_scratch(spec_est *a, int P, double bytes)
{
    const ddl_spec_t *s = a->s;
    for (int r = 0; r < s->world_size; r++) {
        bool in = P < 0 || P >= s->nparts;
        for (int i = 0; !in && i < s->parts[P].nranks; i++) {
            in = s->parts[P].ranks[i] == r;
        }
        if (in && bytes > a->per[r][SPEC_E_SCRATCH]) {
            a->per[r][SPEC_E_SCRATCH] = bytes;
        }
    }
}

bool spec_est_shares(const spec_est *a)
{
    return spec_share_scratch(a->s);
}

void spec_est_add_halo(spec_est *a, int P, const ddl_shape *g, const int64_t *k, const int64_t *s,
                       const int64_t *p, const int64_t *d, double bufs, double crops, double shared)
{
    const ddl_spec_t *sp = a->s;
    if (P < 0 || P >= sp->nparts || sp->parts[P].ndim != g->ndim) {
        double xl = spec_est_local_numel(sp, g, P) * a->item;
        if (shared >= 0) {
            spec_est_scratch(a, P, xl + shared);
        } else {
            spec_est_add(a, P, SPEC_E_WORK, bufs * xl);
        }
        return;
    }
    const spec_partition *part = &sp->parts[P];
    for (int i = 0; i < part->nranks; i++) {
        int coord[DDL_MAX_DIMS];
        ddl_index_unravel(part->ndim, part->shape, i, coord);
        double       buf = 1, need = 1, ext[DDL_MAX_DIMS];
        ddl_halo_dim h[DDL_MAX_DIMS] = {{0}};
        for (int j = 0; j < g->ndim; j++) {
            int64_t n = ddl_decomp_size(g->d[j], part->shape[j], coord[j]), b = n, q = n;
            if (j >= 2 && ddl_halo_dim_compute(g->d[j], part->shape[j], coord[j], k[j - 2],
                                               s[j - 2], p[j - 2], d[j - 2], &h[j]) == DDL_OK) {
                b = h[j].buf;
                q = h[j].need_hi - h[j].need_lo;
            } else if (j >= 2) {
                ddl_clear_error(); // the layer itself refuses this (ddl_halo_exchange_create)
            }
            ext[j] = (double)b;
            buf *= (double)b;
            need *= (double)q;
        }
        // The exchange's own slabs: per side, the largest face it sends and receives over
        // the split dimensions (ghost faces counted as staged).
        double slab[4] = {0, 0, 0, 0};
        for (int j = 2; j < g->ndim; j++) {
            if (part->shape[j] <= 1 || ext[j] <= 0) {
                continue;
            }
            double face = buf / ext[j];
            double f[4] = {(double)h[j].send_lo, (double)h[j].send_hi, (double)h[j].ghost_lo,
                           (double)h[j].ghost_hi};
            for (int t = 0; t < 4; t++) {
                slab[t] = fmax(slab[t], f[t] * face);
            }
        }
        double crop  = need != buf ? need : 0;
        double bytes = (slab[0] + slab[1] + slab[2] + slab[3]) * a->item + SPEC_E_HALO_BYTES;
        int    r     = part->ranks[i];
        if (r < 0 || r >= sp->world_size) {
            continue;
        }
        if (shared >= 0) {
            double n = (buf + crop) * a->item + shared;
            if (n > a->per[r][SPEC_E_SCRATCH]) {
                a->per[r][SPEC_E_SCRATCH] = n;
            }
        } else {
            bytes += (bufs * buf + crops * crop) * a->item;
        }
        a->per[r][SPEC_E_WORK] += bytes;
    }
}

// A parameter block of `numel` elements on P: value, gradient and optimizer state;
// `copies` more values and gradients where the layer keeps working blocks of it (a
// short-batch copy: the working blocks' values alone).
void spec_est_add_param(spec_est *a, int P, double numel, double copies)
{
    const ddl_optim_params *o     = &a->s->optim;
    double                  state = o->kind == DDL_OPTIM_SGD ? (o->momentum != 0 ? 1 : 0) : 2;
    double                  own   = a->copy ? 0 : 1;
    spec_est_add(a, P, SPEC_E_PARAMS, numel * a->item * (own + copies));
    spec_est_add(a, P, SPEC_E_GRADS, numel * a->item * (own + copies) * own);
    spec_est_add(a, P, SPEC_E_OPTIM, numel * a->item * state * own);
}

int spec_est_part_dim(const ddl_spec_t *s, int P, int d)
{
    if (P < 0 || P >= s->nparts || d >= s->parts[P].ndim) {
        return 1;
    }
    return s->parts[P].shape[d] > 0 ? s->parts[P].shape[d] : 1;
}

// The output and its gradient (none for a fused ReLU), what the layer's type needs (the
// registry), and, for an output consumed more than once, the buffer its gradients are
// summed through.
static void add_layer(spec_est *a, int li)
{
    const ddl_spec_t *s    = a->s;
    const spec_layer *L    = &s->layers[li];
    double            yl   = spec_est_local_numel(s, &L->y_global, L->P_out);
    int               uses = 0;
    for (int i = 0; i < s->nlayers; i++) {
        for (int k = 0; k < s->layers[i].nin; k++) {
            uses += s->layers[i].in[k] == li;
        }
    }
    // A ReLU fused into its batch norm or add (spec_fused_relu_source) holds no output or
    // gradient of its own, only the scratch of a second consumer; a layer read only by an
    // add or a batch norm no gradient of its own (spec_grad_alias_of).
    double copies = spec_fused_relu_source(s, li) >= 0 ? 0 : spec_grad_alias_of(s, li) >= 0 ? 1 : 2;
    if (!a->copy) {
        spec_est_add(a, L->P_out, SPEC_E_ACT, (copies + (uses > 1)) * yl * a->item);
    }
    // The layer's bookkeeping (its structures, plans and MPI datatypes): 3-16 KiB measured
    // per layer on Linux x86-64, most for the window layers' halo plans; weighs only in
    // small models and their short-batch copies.
    spec_est_add(a, L->P_out, SPEC_E_WORK, SPEC_E_LAYER_BYTES);
    L->kind->estimate(a, L);
}

// Adds the model of spec a->s (or, a->copy, one of its short-batch copies) to a->per.
// Rank 0's staging buffers (engine/model.c: the staged input, the gathered output, the
// labels or targets the label plan scatters): in the shared scratch when the layers
// share one (each is used between layer calls only), the largest of them; else each its own.
static void add_staging(spec_est *a, double xin, double logits, double lab_root)
{
    if (spec_share_scratch(a->s)) {
        double n = fmax(xin, fmax(logits, lab_root));
        if (n > a->per[0][SPEC_E_SCRATCH]) {
            a->per[0][SPEC_E_SCRATCH] = n;
        }
    } else {
        a->per[0][SPEC_E_WORK] += xin + logits + lab_root;
    }
}

static void add_model(spec_est *a)
{
    const ddl_spec_t *s = a->s;
    // The input and its gradient on the input partition, the whole batch on rank 0 (staged
    // input, gathered logits) and the loss's per-sample buffers.
    ddl_shape in = {.ndim = s->input.ndim + 1};
    in.d[0]      = s->batch;
    for (int d = 0; d < s->input.ndim; d++) {
        in.d[1 + d] = s->input.d[d];
    }
    double sample = 1;
    for (int d = 0; d < s->input.ndim; d++) {
        sample *= (double)s->input.d[d];
    }
    if (!a->copy) {
        spec_est_add(a, s->input_partition, SPEC_E_ACT,
                     2 * spec_est_local_numel(s, &in, s->input_partition) * a->item);
    }
    if (s->dense) {
        // Dense targets: rank 0 stages the batch, gathers the output and holds the targets
        // twice (the session's and the target plan's) plus the generator's int64 scratch;
        // each output rank its values' losses, their gradient and its box of the targets.
        const spec_layer *last = &s->layers[s->nlayers - 1];
        double            E    = (double)s->out_elems;
        double B = (double)s->batch;
        add_staging(a, B * sample * a->item, B * E * a->item, B * E * a->item);
        a->per[0][SPEC_E_WORK] += B * E * (a->item + 8);
        spec_est_add(a, last->P_out, SPEC_E_WORK,
                     spec_est_local_numel(s, &last->y_global, last->P_out) * 3 * a->item);
    } else if (s->label_elems > 1 || s->output.ndim > 1) {
        // Segmentation: rank 0 stages the batch, gathers logits [batch, C, spatial...] and
        // holds the labels twice (the label plan's f64, and a caller's int64 given inline,
        // e.g. a TrainBatch's); each output rank its voxels' losses, their gradient and
        // labels. The session stages none: its data (generated, or an HDF5 file; IDX holds
        // one label per sample) is made or read per rank (ddl_model_local_labels).
        const spec_layer *last = &s->layers[s->nlayers - 1];
        double            L    = (double)s->label_elems;
        double B = (double)s->batch;
        add_staging(a, B * sample * a->item, B * s->num_classes * L * a->item, B * L * 8);
        a->per[0][SPEC_E_WORK] += B * L * 8;
        double voxels = spec_est_local_numel(s, &last->y_global, last->P_out) /
                        (double)(s->num_classes > 0 ? s->num_classes : 1);
        spec_est_add(a, last->P_out, SPEC_E_WORK, voxels * (2 * a->item + 16));
    } else {
        double B = (double)s->batch;
        add_staging(a, B * sample * a->item, B * s->num_classes * a->item, 0);
        a->per[0][SPEC_E_WORK] += B * 16; // labels, padded
        spec_est_add(a, -1, SPEC_E_WORK,
                     (double)s->batch * ((double)s->num_classes * a->item * 3 + 16));
    }
    for (int i = 0; i < s->nlayers; i++) {
        add_layer(a, i);
    }
}

ddl_status ddl_spec_estimate(const ddl_spec_t *s, ddl_mem_estimate *out)
{
    DDL_REQUIRE(s != NULL && out != NULL && s->world_size > 0, DDL_EINVAL,
                "estimate: a parsed spec and an output are required");
    spec_est a = {.s = s, .item = (double)ddl_dtype_size(s->dt)};
    a.per      = calloc((size_t)s->world_size, sizeof *a.per);
    double *own = calloc((size_t)s->world_size, sizeof *own); // each rank's, without copies
    if (a.per == NULL || own == NULL) {
        free(a.per);
        free(own);
        return ddl_set_error(DDL_ENOMEM, "estimate: out of memory");
    }
    add_model(&a);
    for (int r = 0; r < s->world_size; r++) {
        for (int c = 0; c < SPEC_E_COUNT; c++) {
            own[r] += a.per[r][c];
        }
    }
    // Each short-batch copy: the spec at its batch size (a parse of text already parsed,
    // so it fails only for want of memory).
    for (int k = 0; k < s->nbuckets; k++) {
        ddl_spec_t *c  = NULL;
        ddl_status  st = spec_parse_at_batch(s->text, s->source, s->world_size, s->buckets[k], &c);
        if (st != DDL_OK) {
            free(a.per);
            free(own);
            return st;
        }
        a.s    = c;
        a.copy = true;
        add_model(&a);
        ddl_spec_destroy(&c);
    }
    a.s = s;
    memset(out, 0, sizeof *out);
    out->total = -1;
    for (int r = 0; r < s->world_size; r++) {
        double t = 0;
        for (int c = 0; c < SPEC_E_COUNT; c++) {
            t += a.per[r][c];
        }
        if (t > out->total) {
            out->total       = t;
            out->rank        = r;
            out->params      = a.per[r][SPEC_E_PARAMS];
            out->grads       = a.per[r][SPEC_E_GRADS];
            out->optim       = a.per[r][SPEC_E_OPTIM];
            out->activations = a.per[r][SPEC_E_ACT];
            out->workspace   = a.per[r][SPEC_E_WORK] + a.per[r][SPEC_E_SCRATCH];
            out->copies      = t - own[r];
        }
    }
    free(a.per);
    free(own);
    return DDL_OK;
}

double ddl_proc_kb_bytes(const char *path, const char *key)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return -1;
    }
    char   line[256];
    double v = -1;
    size_t n = strlen(key);
    while (fgets(line, sizeof line, f) != NULL) {
        if (strncmp(line, key, n) == 0 && line[n] == ':') {
            v = strtod(line + n + 1, NULL) * 1024.0;
            break;
        }
    }
    fclose(f);
    return v;
}

static double read_number(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return -1;
    }
    char   buf[64] = {0};
    double v       = -1;
    if (fgets(buf, sizeof buf, f) != NULL && strncmp(buf, "max", 3) != 0) {
        char *end;
        v = strtod(buf, &end);
        if (end == buf) {
            v = -1;
        }
    }
    fclose(f);
    return v;
}

// This process's group of the cgroup v1 memory controller ("N:memory:/path" in
// /proc/self/cgroup) as a directory under /sys/fs/cgroup/memory, and how many processes it
// holds; 0 when there is none (cgroup v2, or the root group).
static int v1_memory_group(char *dir, size_t len)
{
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (f == NULL) {
        return 0;
    }
    char line[PATH_MAX + 64];
    int  found = 0;
    while (!found && fgets(line, sizeof line, f) != NULL) {
        char *c1 = strchr(line, ':'), *c2 = c1 != NULL ? strchr(c1 + 1, ':') : NULL;
        if (c2 == NULL || (size_t)(c2 - c1 - 1) != strlen("memory") ||
            strncmp(c1 + 1, "memory", 6) != 0) {
            continue;
        }
        char *path                = c2 + 1;
        path[strcspn(path, "\n")] = '\0';
        if (strcmp(path, "/") != 0 &&
            (size_t)snprintf(dir, len, "/sys/fs/cgroup/memory%s", path) < len) {
            found = 1;
        }
    }
    fclose(f);
    if (!found) {
        return 0;
    }
    char procs[PATH_MAX + 32];
    snprintf(procs, sizeof procs, "%s/cgroup.procs", dir);
    FILE *p = fopen(procs, "r");
    if (p == NULL) {
        return 0;
    }
    int n = 0;
    while (fgets(line, sizeof line, p) != NULL) {
        n++;
    }
    fclose(p);
    return n;
}

double ddl_mem_available(int ranks_on_host, char *how, size_t howlen)
{
    char        dummy[8];
    const char *lim = getenv("DDL_MEMORY_LIMIT");
    if (how == NULL) {
        how    = dummy;
        howlen = sizeof dummy;
    }
    double limit = 0;
    if (lim != NULL && ddl_parse_bytes(lim, &limit) && limit > 0) {
        snprintf(how, howlen, "DDL_MEMORY_LIMIT=%s per rank", lim);
        return limit;
    }
    if (ranks_on_host < 1) {
        ranks_on_host = 1;
    }
    double avail = ddl_proc_kb_bytes("/proc/meminfo", "MemAvailable");
    double cmax  = read_number("/sys/fs/cgroup/memory.max");
    double ccur  = read_number("/sys/fs/cgroup/memory.current");
    if (cmax > 0 && ccur >= 0 && (avail < 0 || cmax - ccur < avail)) {
        snprintf(how, howlen, "cgroup memory.max %.1f GiB - memory.current %.1f GiB over %d ranks",
                 cmax / 1073741824.0, ccur / 1073741824.0, ranks_on_host);
        return (cmax - ccur) / ranks_on_host;
    }
    // The v1 memory controller: this process's group (deploy/memcap.sh puts each rank in
    // its own; a group of one process is that rank's whole budget).
    char   grp[PATH_MAX];
    double vmax = -1, vcur = -1;
    int    procs = v1_memory_group(grp, sizeof grp);
    if (procs > 0) {
        char f[PATH_MAX + 32];
        snprintf(f, sizeof f, "%s/memory.limit_in_bytes", grp);
        vmax = read_number(f);
        snprintf(f, sizeof f, "%s/memory.usage_in_bytes", grp);
        vcur = read_number(f);
    }
    int per = procs > 1 ? ranks_on_host : 1;
    if (vmax > 0 && vcur >= 0 && (avail < 0 || (vmax - vcur) / per < avail / ranks_on_host)) {
        snprintf(how, howlen, "cgroup v1 %s: memory.limit_in_bytes %.1f MiB - usage %.1f MiB%s",
                 strrchr(grp, '/') != NULL ? strrchr(grp, '/') + 1 : grp, vmax / 1048576.0,
                 vcur / 1048576.0, per > 1 ? " over the ranks in it" : ", this rank's own");
        return (vmax - vcur) / per;
    }
    if (avail < 0) {
        snprintf(how, howlen, "unknown");
        return -1;
    }
    snprintf(how, howlen, "MemAvailable %.1f GiB over %d ranks on this host",
             avail / 1073741824.0, ranks_on_host);
    return avail / ranks_on_host;
}

// "12.50 GiB" or "3.1 MiB".
static const char *human(double bytes, char *buf, size_t len)
{
    if (bytes >= 1073741824.0) {
        snprintf(buf, len, "%.2f GiB", bytes / 1073741824.0);
    } else {
        snprintf(buf, len, "%.1f MiB", bytes / 1048576.0);
    }
    return buf;
}

ddl_status ddl_spec_check_memory(const ddl_spec_t *s, int ranks_on_host)
{
    ddl_mem_estimate e;
    DDL_CHECK(ddl_spec_estimate(s, &e));
    if (ranks_on_host <= 0) {
        const char *ls = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
        ranks_on_host  = ls != NULL && atoi(ls) > 0 ? atoi(ls) : s->world_size;
    }
    char   how[160];
    double avail = ddl_mem_available(ranks_on_host, how, sizeof how);
    if (avail < 0 || e.total <= avail) {
        return DDL_OK; // unknown availability: nothing to compare with
    }
    char t[32], p[32], g[32], o[32], a[32], w[32], v[32], c[32], hint[160] = "";
    if (e.copies > 0) {
        snprintf(hint, sizeof hint,
                 "; of it, %s is the short-batch copies, which \"inference_batches\": [] "
                 "drops",
                 human(e.copies, c, sizeof c));
    }
    return ddl_set_error(DDL_ENOMEM,
                         "%s: spec needs an estimated %s per rank (rank %d: parameters %s, "
                         "gradients %s, optimizer state %s, activations %s, workspace %s) but "
                         "%s is available (%s)%s",
                         s->source, human(e.total, t, sizeof t), e.rank,
                         human(e.params, p, sizeof p), human(e.grads, g, sizeof g),
                         human(e.optim, o, sizeof o), human(e.activations, a, sizeof a),
                         human(e.workspace, w, sizeof w), human(avail, v, sizeof v), how, hint);
}
