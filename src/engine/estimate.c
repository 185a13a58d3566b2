// engine/estimate.c: a spec's memory per rank, estimated from the parsed spec alone, so a
// model that cannot fit is refused before ddl_model_create allocates (or page-faults) any
// of it. See ddl/estimate.h for what is counted.
//
// Every tensor of the model lives on a partition P (a list of world ranks and a shape); a
// rank of P holds at most the largest balanced block, prod_d ceil(G_d / P_d) elements of a
// global shape G. The estimate adds each tensor's block to every rank of its partition and
// reports the rank with the largest sum. All sums are in double: a hostile spec may ask for
// 2^34-element tensors in 4096 layers, which overflows int64 bytes.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "ddl/base.h"
#include "ddl/estimate.h"
#include "ddl/kernels.h"
#include "engine/spec_internal.h"

enum { E_PARAMS, E_GRADS, E_OPTIM, E_ACT, E_WORK, E_COUNT };

struct acc {
    const ddl_spec_t *s;
    double (*per)[E_COUNT]; // per world rank
    double item;
};

static double ceil_div(double n, double p)
{
    return p > 1 ? ceil(n / p) : n;
}

// The largest block of global shape g on partition P (-1: not partitioned, whole).
static double local_numel(const ddl_spec_t *s, const ddl_shape *g, int P)
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
        return ceil_div(n, split);
    }
    for (int d = 0; d < g->ndim; d++) {
        n *= ceil_div((double)g->d[d], s->parts[P].shape[d]);
    }
    return n;
}

// Adds bytes to category cat of every rank of partition P (every rank when P < 0).
static void add(struct acc *a, int P, int cat, double bytes)
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

// A parameter block of `numel` elements on P: value, gradient and optimizer state;
// `copies` more values and gradients where the layer keeps working blocks of it.
static void add_param(struct acc *a, int P, double numel, double copies)
{
    const ddl_optim_params *o     = &a->s->optim;
    double                  state = o->kind == DDL_OPTIM_SGD ? (o->momentum != 0 ? 1 : 0) : 2;
    add(a, P, E_PARAMS, numel * a->item * (1 + copies));
    add(a, P, E_GRADS, numel * a->item * (1 + copies));
    add(a, P, E_OPTIM, numel * a->item * state);
}

static int part_dim(const ddl_spec_t *s, int P, int d)
{
    if (P < 0 || P >= s->nparts || d >= s->parts[P].ndim) {
        return 1;
    }
    return s->parts[P].shape[d] > 0 ? s->parts[P].shape[d] : 1;
}

// im2col columns (conv) or pooling indices, from the kernels' own workspace functions on
// the largest local block (with its halo).
static double kernel_workspace(const ddl_spec_t *s, const spec_layer *L)
{
    const ddl_shape *x   = &L->x_global;
    int              nsp = x->ndim - 2;
    if (nsp < 1 || nsp > 3) {
        return 0;
    }
    int64_t N = (int64_t)ceil_div((double)x->d[0], part_dim(s, L->P_in, 0));
    int64_t C = (int64_t)ceil_div((double)x->d[1], part_dim(s, L->P_in, 1));
    int64_t in[3], k[3], st[3], pad[3], dil[3];
    for (int j = 0; j < nsp; j++) {
        const int64_t *kk = L->type == SL_CONV ? L->conv.kernel : L->pool.kernel;
        const int64_t *dd = L->type == SL_CONV ? L->conv.dilation : L->pool.dilation;
        k[j]              = kk[j];
        dil[j]            = dd[j] > 0 ? dd[j] : 1;
        st[j]  = L->type == SL_CONV ? L->conv.stride[j] : L->pool.stride[j] ? L->pool.stride[j] : k[j];
        pad[j] = L->type == SL_CONV ? L->conv.padding[j] : L->pool.padding[j];
        in[j]  = (int64_t)ceil_div((double)x->d[2 + j], part_dim(s, L->P_in, 2 + j)) +
                (k[j] - 1) * dil[j];
        if (st[j] <= 0) {
            st[j] = 1;
        }
    }
    if (L->type == SL_CONV) {
        ddl_conv_geom g;
        int64_t       co = (int64_t)ceil_div((double)L->conv.out_channels, part_dim(s, L->P_in, 1));
        if (ddl_conv_geom_init(&g, nsp, N, C, co, in, k, st, pad, dil) != DDL_OK) {
            ddl_clear_error();
            return 0;
        }
        return (double)ddl_conv_workspace_bytes(s->dt, &g);
    }
    ddl_pool_geom g;
    if (ddl_pool_geom_init(&g, L->pool.kind, nsp, N, C, in, k, st, pad, dil) != DDL_OK) {
        ddl_clear_error();
        return 0;
    }
    return (double)ddl_pool_workspace_bytes(&g);
}

static void add_layer(struct acc *a, const spec_layer *L)
{
    const ddl_spec_t *s  = a->s;
    double            xl = local_numel(s, &L->x_global, L->P_in);
    double            yl = local_numel(s, &L->y_global, L->P_out);
    add(a, L->P_out, E_ACT, 2 * yl * a->item); // the output and its gradient
    switch (L->type) {
    case SL_LINEAR: {
        // W [out, in] on P_w = [a, b]; x broadcast to [batch, in/b], y reduced from
        // [batch, out/a] blocks.
        double fo = ceil_div((double)L->out_features, part_dim(s, L->P_w, 0));
        double fi = ceil_div((double)L->x_global.d[1], part_dim(s, L->P_w, 1));
        add_param(a, L->P_w, fo * fi + (L->bias ? fo : 0), 0);
        add(a, L->P_w, E_WORK, (double)L->x_global.d[0] * (2 * fi + fo) * a->item);
        break;
    }
    case SL_CONV: {
        double kp = 1;
        for (int j = 0; j < L->x_global.ndim - 2; j++) {
            kp *= (double)L->conv.kernel[j];
        }
        int    Pw = L->P_w >= 0 ? L->P_w : L->P_in;
        double w  = (double)L->conv.out_channels * (double)L->x_global.d[1] * kp;
        double b  = L->conv.bias ? (double)L->conv.out_channels : 0;
        double sp = L->P_w >= 0 ? (double)part_dim(s, Pw, 0) * part_dim(s, Pw, 1) : 1;
        add_param(a, Pw, ceil_div(w + b, sp), 2); // + the working block and the gathered grad
        add(a, L->P_in, E_WORK, 2 * xl * a->item + kernel_workspace(s, L));
        break;
    }
    case SL_POOL:
        add(a, L->P_in, E_WORK, 2 * xl * a->item + kernel_workspace(s, L));
        break;
    case SL_ACTIVATION:
        add(a, L->P_in, E_WORK, xl); // a byte mask per element
        break;
    case SL_BATCHNORM: {
        double c = ceil_div((double)L->x_global.d[1], part_dim(s, L->P_in, 1));
        if (L->affine) {
            add_param(a, L->P_in, 2 * c, 0);
        }
        add(a, L->P_in, E_WORK, 2 * c * a->item + 2 * xl * a->item);
        break;
    }
    case SL_REPARTITION:
    case SL_FLATTEN:
    case SL_UPSAMPLE:
        add(a, L->P_out, E_WORK, yl * a->item);
        break;
    }
}

ddl_status ddl_spec_estimate(const ddl_spec_t *s, ddl_mem_estimate *out)
{
    DDL_REQUIRE(s != NULL && out != NULL && s->world_size > 0, DDL_EINVAL,
                "estimate: a parsed spec and an output are required");
    struct acc a = {.s = s, .item = (double)ddl_dtype_size(s->dt)};
    a.per        = calloc((size_t)s->world_size, sizeof *a.per);
    if (a.per == NULL) {
        return ddl_set_error(DDL_ENOMEM, "estimate: out of memory");
    }
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
    add(&a, s->input_partition, E_ACT, 2 * local_numel(s, &in, s->input_partition) * a.item);
    a.per[0][E_WORK] += (double)s->batch * (sample + s->num_classes) * a.item +
                        (double)s->batch * 16; // labels, padded
    add(&a, -1, E_WORK, (double)s->batch * ((double)s->num_classes * a.item * 3 + 16));
    for (int i = 0; i < s->nlayers; i++) {
        add_layer(&a, &s->layers[i]);
    }
    memset(out, 0, sizeof *out);
    out->total = -1;
    for (int r = 0; r < s->world_size; r++) {
        double t = 0;
        for (int c = 0; c < E_COUNT; c++) {
            t += a.per[r][c];
        }
        if (t > out->total) {
            out->total       = t;
            out->rank        = r;
            out->params      = a.per[r][E_PARAMS];
            out->grads       = a.per[r][E_GRADS];
            out->optim       = a.per[r][E_OPTIM];
            out->activations = a.per[r][E_ACT];
            out->workspace   = a.per[r][E_WORK];
        }
    }
    free(a.per);
    return DDL_OK;
}

// "123456 kB" lines of /proc/meminfo; -1 when absent.
static double meminfo(const char *key)
{
    FILE *f = fopen("/proc/meminfo", "r");
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

static double parse_bytes(const char *s)
{
    char  *end;
    double v = strtod(s, &end);
    if (end == s || v <= 0) {
        return -1;
    }
    switch (*end) {
    case 'k':
    case 'K':
        return v * 1024.0;
    case 'm':
    case 'M':
        return v * 1048576.0;
    case 'g':
    case 'G':
        return v * 1073741824.0;
    case 't':
    case 'T':
        return v * 1099511627776.0;
    default:
        return v;
    }
}

double ddl_mem_available(int ranks_on_host, char *how, size_t howlen)
{
    char        dummy[8];
    const char *lim = getenv("DDL_MEMORY_LIMIT");
    if (how == NULL) {
        how    = dummy;
        howlen = sizeof dummy;
    }
    if (lim != NULL && lim[0] != '\0' && parse_bytes(lim) > 0) {
        snprintf(how, howlen, "DDL_MEMORY_LIMIT=%s per rank", lim);
        return parse_bytes(lim);
    }
    if (ranks_on_host < 1) {
        ranks_on_host = 1;
    }
    double avail = meminfo("MemAvailable");
    double cmax  = read_number("/sys/fs/cgroup/memory.max");
    double ccur  = read_number("/sys/fs/cgroup/memory.current");
    if (cmax > 0 && ccur >= 0 && (avail < 0 || cmax - ccur < avail)) {
        snprintf(how, howlen, "cgroup memory.max %.1f GiB - memory.current %.1f GiB over %d ranks",
                 cmax / 1073741824.0, ccur / 1073741824.0, ranks_on_host);
        return (cmax - ccur) / ranks_on_host;
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
    char t[32], p[32], g[32], o[32], a[32], w[32], v[32];
    return ddl_set_error(DDL_ENOMEM,
                         "%s: spec needs an estimated %s per rank (rank %d: parameters %s, "
                         "gradients %s, optimizer state %s, activations %s, workspace %s) but "
                         "%s is available (%s)",
                         s->source, human(e.total, t, sizeof t), e.rank,
                         human(e.params, p, sizeof p), human(e.grads, g, sizeof g),
                         human(e.optim, o, sizeof o), human(e.activations, a, sizeof a),
                         human(e.workspace, w, sizeof w), human(avail, v, sizeof v), how);
}
