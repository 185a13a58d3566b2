// tools/verify/layers.c: distdl-verify cases for the distributed layers and losses.
//
//   {"op":"conv2d","dtype":"f64","seed":3,"P_x":{...},"x_global_shape":[1,5,10,10],
//    "out_channels":10,"kernel":[5,5],"stride":[2,2],"padding":[2,2],"dilation":[1,1],
//    "bias":true,"checks":["adjoint","sequential","gradcheck"],"dump":"DIR"}
//   {"op":"add","n":3,"P_x":{...},"x_global_shape":[2,3,6,5]}          (n operands, default 2)
//   {"op":"concat","P_x":{...},"x_global_shapes":[[2,3,6,5],[2,4,6,5]]}  (along dim 1)
//   {"op":"global_avgpool","P_x":{...},"x_global_shape":[2,6,7,5]}
//
// Each case is turned into a builder (the layer on its partitions, or on rank 0 alone)
// and run through the generic checks of layer_checks.h.
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "ddl/base.h"
#include "layer_checks.h"
#include "verify.h"

// The most operands an add or concat case may have.
#define VERIFY_MAX_OPERANDS 8

typedef enum {
    K_LINEAR,
    K_CONV,
    K_POOL,
    K_BATCHNORM,
    K_UPSAMPLE,
    K_ADD,
    K_CONCAT,
    K_GAP,
    K_LOSS,
    K_CROSS_ENTROPY,
} layer_kind;

// Everything a builder needs: the parsed case, and two sets of partitions (the case's,
// and their sequential twins on rank 0 alone).
typedef struct lcase {
    layer_kind       kind;
    ddl_shape        x_global;
    ddl_partition_t *P[3];    // P_x, P_y, P_w as given (NULL when absent)
    ddl_partition_t *S[3];    // the twins: rank 0 alone, same ndim, shape all ones
    int64_t          out_features;
    bool             bias;
    ddl_conv_params  conv;
    ddl_pool_params  pool;
    double           eps, momentum;
    bool             affine, training;
    ddl_upsample_mode mode;
    bool             align_corners;
    bool             has_scale;
    double           scale[3];
    int64_t          size[3];
    ddl_loss_kind    loss;
    ddl_reduction    reduction;
    int              nops;                  // add, concat: operands
    ddl_shape        ops[VERIFY_MAX_OPERANDS];  // concat: their global shapes
} lcase;

static ddl_status create_layer(lcase *c, bool seq, ddl_dtype dt, ddl_layer_t **out)
{
    ddl_partition_t *const *P = seq ? c->S : c->P;
    switch (c->kind) {
    case K_LINEAR:
        return ddl_linear_create(P[0], P[1], P[2], dt, c->x_global.d[0], c->x_global.d[1],
                                 c->out_features, c->bias, out);
    case K_CONV:
        return ddl_conv_create(P[0], P[1], P[2], dt, &c->x_global, &c->conv, out);
    case K_POOL:
        return ddl_pool_create(P[0], dt, &c->x_global, &c->pool, out);
    case K_BATCHNORM:
        return ddl_batchnorm_create(P[0], dt, &c->x_global, c->eps, c->momentum, c->affine, out);
    case K_UPSAMPLE:
        return ddl_upsample_create(P[0], dt, &c->x_global, c->mode, c->align_corners,
                                   c->has_scale ? c->scale : NULL, c->has_scale ? NULL : c->size,
                                   out);
    case K_ADD:
        return ddl_add_create(P[0], dt, &c->x_global, c->nops, out);
    case K_CONCAT:
        return ddl_concat_create(P[0], dt, c->nops, c->ops, out);
    case K_GAP:
        return ddl_global_avgpool_create(P[0], dt, &c->x_global, out);
    default:
        return ddl_set_error(DDL_EINTERNAL, "verify: not a layer");
    }
}

static ddl_status build_layer(void *ctx, bool seq, ddl_dtype dt, ddl_layer_t **out)
{
    ddl_status st = create_layer(ctx, seq, dt, out);
    if (st == DDL_OK) {
        verify_arm_fail_alloc();
    }
    return st;
}

static ddl_status build_loss(void *ctx, bool seq, ddl_dtype dt, ddl_loss_t **out,
                             const ddl_partition_t **P_x)
{
    lcase *c = ctx;
    *P_x     = seq ? c->S[0] : c->P[0];
    return ddl_loss_create(*P_x, dt, &c->x_global, c->kind == K_CROSS_ENTROPY ? DDL_LOSS_CROSS_ENTROPY : c->loss,
                           c->reduction, out);
}

static void lcase_free(lcase *c)
{
    for (int i = 0; i < 3; i++) {
        ddl_partition_destroy(&c->P[i]);
        ddl_partition_destroy(&c->S[i]);
    }
}

// Creates the rank-0 twin of each given partition.
static int make_twins(vcase *vc, lcase *c)
{
    for (int i = 0; i < 3; i++) {
        if (c->P[i] == NULL) {
            continue;
        }
        int ones[DDL_MAX_DIMS], zero = 0;
        for (int d = 0; d < DDL_MAX_DIMS; d++) {
            ones[d] = 1;
        }
        int rc = vcase_status(vc,
                              ddl_partition_create(MPI_COMM_WORLD, 1, &zero,
                                                   ddl_partition_ndim(c->P[i]), ones, &c->S[i]),
                              "sequential partition");
        if (rc != VERIFY_PASS) {
            return rc;
        }
    }
    return VERIFY_PASS;
}

// Reads a per-spatial-dimension array of exactly nsp entries (default `fill`).
static int get_spatial(vcase *c, const char *key, bool required, int nsp, long long min,
                       int64_t fill, int64_t *out)
{
    int64_t v[DDL_MAX_DIMS];
    int     n = 0;
    for (int i = 0; i < nsp; i++) {
        out[i] = fill;
    }
    if (json_object_get(c->obj, key) == NULL) {
        return required ? vcase_invalid(c, "missing key \"%s\" (required by op \"%s\")", key, c->op)
                        : VERIFY_PASS;
    }
    int rc = vcase_get_ints(c, key, true, DDL_MAX_DIMS, min, 1 << 20, v, &n);
    if (rc != VERIFY_PASS) {
        return rc;
    }
    if (n != nsp) {
        return vcase_invalid(c, "\"%s\" must have %d entries (one per spatial dimension), has %d",
                             key, nsp, n);
    }
    for (int i = 0; i < nsp; i++) {
        out[i] = v[i];
    }
    return VERIFY_PASS;
}

static int parse_enum(vcase *c, const char *key, bool required, const char *const *names,
                      int count, int *out)
{
    const char *s  = NULL;
    int         rc = vcase_get_string(c, key, required, &s);
    if (rc != VERIFY_PASS || s == NULL) {
        return rc;
    }
    char list[256] = "";
    for (int i = 0; i < count; i++) {
        if (strcmp(s, names[i]) == 0) {
            *out = i;
            return VERIFY_PASS;
        }
        strncat(list, i ? ", " : "", sizeof list - strlen(list) - 1);
        strncat(list, names[i], sizeof list - strlen(list) - 1);
    }
    return vcase_invalid(c, "\"%s\" = \"%s\" is not one of %s", key, s, list);
}

// "x_global_shapes": 2 to VERIFY_MAX_OPERANDS shapes (concat's operands).
static int get_shapes(vcase *c, const char *key, lcase *L)
{
    json_t *a = json_object_get(c->obj, key);
    if (a == NULL) {
        return vcase_invalid(c, "missing key \"%s\" (required by op \"%s\")", key, c->op);
    }
    size_t n = json_is_array(a) ? json_array_size(a) : 0;
    if (n < 2 || n > VERIFY_MAX_OPERANDS) {
        return vcase_invalid(c, "\"%s\" must be an array of 2 to %d shapes", key,
                             VERIFY_MAX_OPERANDS);
    }
    for (size_t k = 0; k < n; k++) {
        json_t *e = json_array_get(a, k);
        size_t  nd = json_is_array(e) ? json_array_size(e) : 0;
        if (nd < 1 || nd > DDL_MAX_DIMS) {
            return vcase_invalid(c, "\"%s\"[%zu] must be an array of 1 to %d integers", key, k,
                                 DDL_MAX_DIMS);
        }
        L->ops[k].ndim = (int)nd;
        for (size_t d = 0; d < nd; d++) {
            json_t *v = json_array_get(e, d);
            if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                json_integer_value(v) > (1LL << 40)) {
                return vcase_invalid(c, "\"%s\"[%zu][%zu] must be an integer in [0, 2^40]", key,
                                     k, d);
            }
            L->ops[k].d[d] = json_integer_value(v);
        }
    }
    L->nops     = (int)n;
    L->x_global = L->ops[0];
    return VERIFY_PASS;
}

// Parses the op-specific keys. nsp: spatial dims for conv/pool ops (else 0).
static int parse_case(vcase *c, lcase *L, int nsp)
{
    int rc;
    if (L->kind == K_CONCAT) {
        return get_shapes(c, "x_global_shapes", L);
    }
    if ((rc = vcase_get_shape(c, "x_global_shape", true, &L->x_global)) != VERIFY_PASS) {
        return rc;
    }
    if (nsp > 0 && L->x_global.ndim != nsp + 2) {
        return vcase_invalid(c, "\"x_global_shape\" must have %d entries ([N, C, %d spatial]) for %s",
                             nsp + 2, nsp, c->op);
    }
    long long v = 0;
    switch (L->kind) {
    case K_LINEAR:
        if (L->x_global.ndim != 2) {
            return vcase_invalid(c, "\"x_global_shape\" must be [batch, in_features] for linear");
        }
        if ((rc = vcase_get_int(c, "out_features", true, 1, 1LL << 30, &v)) != VERIFY_PASS) {
            return rc;
        }
        L->out_features = v;
        L->bias         = true;
        return vcase_get_bool(c, "bias", false, &L->bias);
    case K_CONV:
        L->conv.nsp         = nsp;
        L->conv.in_channels = L->x_global.d[1];
        if ((rc = vcase_get_int(c, "out_channels", true, 1, 1LL << 30, &v)) != VERIFY_PASS) {
            return rc;
        }
        L->conv.out_channels = v;
        L->conv.bias         = true;
        if ((rc = get_spatial(c, "kernel", true, nsp, 1, 1, L->conv.kernel)) != VERIFY_PASS ||
            (rc = get_spatial(c, "stride", false, nsp, 1, 1, L->conv.stride)) != VERIFY_PASS ||
            (rc = get_spatial(c, "padding", false, nsp, 0, 0, L->conv.padding)) != VERIFY_PASS ||
            (rc = get_spatial(c, "dilation", false, nsp, 1, 1, L->conv.dilation)) != VERIFY_PASS) {
            return rc;
        }
        return vcase_get_bool(c, "bias", false, &L->conv.bias);
    case K_POOL:
        L->pool.nsp = nsp;
        if ((rc = get_spatial(c, "kernel", true, nsp, 1, 1, L->pool.kernel)) != VERIFY_PASS ||
            (rc = get_spatial(c, "stride", false, nsp, 0, 0, L->pool.stride)) != VERIFY_PASS ||
            (rc = get_spatial(c, "padding", false, nsp, 0, 0, L->pool.padding)) != VERIFY_PASS ||
            (rc = get_spatial(c, "dilation", false, nsp, 1, 1, L->pool.dilation)) != VERIFY_PASS) {
            return rc;
        }
        return VERIFY_PASS;
    case K_BATCHNORM:
        L->eps = 1e-5, L->momentum = 0.1, L->affine = true, L->training = true;
        if ((rc = vcase_get_double(c, "eps", false, &L->eps)) != VERIFY_PASS ||
            (rc = vcase_get_bool(c, "affine", false, &L->affine)) != VERIFY_PASS ||
            (rc = vcase_get_bool(c, "training", false, &L->training)) != VERIFY_PASS) {
            return rc;
        }
        if (json_is_null(json_object_get(c->obj, "momentum"))) {
            L->momentum = -1.0;  // PyTorch's momentum=None: the cumulative average
        } else if ((rc = vcase_get_double(c, "momentum", false, &L->momentum)) != VERIFY_PASS) {
            return rc;
        }
        if (!(L->eps > 0)) {
            return vcase_invalid(c, "\"eps\" must be > 0");
        }
        return VERIFY_PASS;
    case K_UPSAMPLE: {
        static const char *const modes[] = {"nearest", "linear"};
        int                      m       = 0;
        if ((rc = parse_enum(c, "mode", false, modes, 2, &m)) != VERIFY_PASS ||
            (rc = vcase_get_bool(c, "align_corners", false, &L->align_corners)) != VERIFY_PASS) {
            return rc;
        }
        L->mode   = (ddl_upsample_mode)m;
        int  ns   = L->x_global.ndim - 2;
        json_t *sf = json_object_get(c->obj, "scale_factor"), *sz = json_object_get(c->obj, "size");
        if (ns < 1 || ns > 3) {
            return vcase_invalid(c, "upsample needs [N, C, 1 to 3 spatial dims]");
        }
        if ((sf == NULL) == (sz == NULL)) {
            return vcase_invalid(c, "upsample needs exactly one of \"scale_factor\" and \"size\"");
        }
        if (sf != NULL) {
            L->has_scale = true;
            for (int i = 0; i < ns; i++) {
                json_t *e = json_is_array(sf) ? json_array_get(sf, (size_t)i) : sf;
                if (!json_is_number(e) || json_number_value(e) <= 0 ||
                    (json_is_array(sf) && json_array_size(sf) != (size_t)ns)) {
                    return vcase_invalid(c, "\"scale_factor\" must be a positive number or %d of them",
                                         ns);
                }
                L->scale[i] = json_number_value(e);
            }
            return VERIFY_PASS;
        }
        return get_spatial(c, "size", true, ns, 1, 1, L->size);
    }
    case K_ADD:
        v = 2;
        if ((rc = vcase_get_int(c, "n", false, 2, VERIFY_MAX_OPERANDS, &v)) != VERIFY_PASS) {
            return rc;
        }
        L->nops = (int)v;
        return VERIFY_PASS;
    case K_CONCAT:
    case K_GAP:
        return VERIFY_PASS;
    case K_LOSS: {
        // In ddl_loss_kind order (DDL_LOSS_MSE = 0 ... DDL_LOSS_KL_DIV_LOG_TARGET = 6).
        static const char *const kinds[] = {
            "mse", "l1", "bce", "bce_with_logits", "kl_div", "poisson_nll", "kl_div_log_target"};
        int k = 0;
        if ((rc = parse_enum(c, "kind", true, kinds, 7, &k)) != VERIFY_PASS) {
            return rc;
        }
        L->loss = (ddl_loss_kind)k;
    }
        __attribute__((fallthrough));  // then the reduction
    case K_CROSS_ENTROPY: {
        static const char *const reds[] = {"none", "sum", "mean", "batchmean"};
        int r = 2;
        if ((rc = parse_enum(c, "reduction", false, reds, 4, &r)) != VERIFY_PASS) {
            return rc;
        }
        L->reduction = (ddl_reduction)r;
        if (L->kind == K_CROSS_ENTROPY && L->x_global.ndim < 2) {
            return vcase_invalid(c, "\"x_global_shape\" must be [batch, classes] or [batch, "
                                    "classes, spatial...] for cross_entropy");
        }
        return VERIFY_PASS;
    }
    }
    return VERIFY_PASS;
}

// The checks requested (default: all that apply).
enum { C_ADJOINT = 1, C_SEQUENTIAL = 2, C_GRADCHECK = 4 };

static int parse_checks(vcase *c, bool linear, int *mask)
{
    json_t *j = json_object_get(c->obj, "checks");
    if (j == NULL) {
        *mask = (linear ? C_ADJOINT : 0) | C_SEQUENTIAL | C_GRADCHECK;
        return VERIFY_PASS;
    }
    if (!json_is_array(j) || json_array_size(j) == 0) {
        return vcase_invalid(c, "\"checks\" must be a non-empty array of \"adjoint\", "
                                "\"sequential\", \"gradcheck\"");
    }
    *mask = 0;
    for (size_t i = 0; i < json_array_size(j); i++) {
        const char *s = json_string_value(json_array_get(j, i));
        if (s != NULL && strcmp(s, "adjoint") == 0) {
            if (!linear) {
                return vcase_invalid(c, "the adjoint check applies to linear (affine) layers only; "
                                        "%s is not linear",
                                     c->op);
            }
            *mask |= C_ADJOINT;
        } else if (s != NULL && strcmp(s, "sequential") == 0) {
            *mask |= C_SEQUENTIAL;
        } else if (s != NULL && strcmp(s, "gradcheck") == 0) {
            *mask |= C_GRADCHECK;
        } else {
            return vcase_invalid(c, "\"checks\"[%zu] is not one of adjoint, sequential, gradcheck",
                                 i);
        }
    }
    return VERIFY_PASS;
}

static void print_figure(vcase *c, const char *name, double v)
{
    if (c->world_rank == 0) {
        printf("%s %.6e\n", name, v);
    }
}

int verify_layer(vcase *vc)
{
    static const struct {
        const char *op;
        layer_kind  kind;
        int         nsp;
        bool        linear;
    } ops[] = {
        {"linear", K_LINEAR, 0, true},        {"conv1d", K_CONV, 1, true},
        {"conv2d", K_CONV, 2, true},          {"conv3d", K_CONV, 3, true},
        {"maxpool1d", K_POOL, 1, false},      {"maxpool2d", K_POOL, 2, false},
        {"maxpool3d", K_POOL, 3, false},      {"avgpool1d", K_POOL, 1, true},
        {"avgpool2d", K_POOL, 2, true},       {"avgpool3d", K_POOL, 3, true},
        {"batchnorm", K_BATCHNORM, 0, false}, {"upsample", K_UPSAMPLE, 0, true},
        {"loss", K_LOSS, 0, false},           {"cross_entropy", K_CROSS_ENTROPY, 0, false},
        {"add", K_ADD, 0, true},              {"concat", K_CONCAT, 0, true},
        {"global_avgpool", K_GAP, 0, true},
    };
    int which = -1;
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        if (strcmp(vc->op, ops[i].op) == 0) {
            which = (int)i;
        }
    }
    if (which < 0) {
        return -1;
    }
    static const char *const keys[][16] = {
        [K_LINEAR]        = {"P_x", "P_y", "P_w", "x_global_shape", "out_features", "bias", NULL},
        [K_CONV]          = {"P_x", "P_y", "P_w", "x_global_shape", "out_channels", "kernel",
                             "stride", "padding", "dilation", "bias", NULL},
        [K_POOL]          = {"P_x", "x_global_shape", "kernel", "stride", "padding", "dilation",
                             NULL},
        [K_BATCHNORM]     = {"P_x", "x_global_shape", "eps", "momentum", "affine", "training", NULL},
        [K_UPSAMPLE]      = {"P_x", "x_global_shape", "mode", "align_corners", "scale_factor",
                             "size", NULL},
        [K_ADD]           = {"P_x", "x_global_shape", "n", NULL},
        [K_CONCAT]        = {"P_x", "x_global_shapes", NULL},
        [K_GAP]           = {"P_x", "x_global_shape", NULL},
        [K_LOSS]          = {"P_x", "x_global_shape", "kind", "reduction", NULL},
        [K_CROSS_ENTROPY] = {"P_x", "x_global_shape", "reduction", NULL},
    };
    lcase L     = {.kind = ops[which].kind};
    const char *all[24];
    int         n = 0;
    all[n++]      = "op";
    all[n++]      = "dtype";
    all[n++]      = "seed";
    all[n++]      = "checks";
    all[n++]      = "dump";
    for (int i = 0; keys[L.kind][i] != NULL; i++) {
        all[n++] = keys[L.kind][i];
    }
    all[n] = NULL;
    int rc = vcase_check_keys(vc, all);
    if (rc != VERIFY_PASS) {
        return rc;
    }
    bool        linear = ops[which].linear;
    int         mask   = 0;
    const char *dump   = NULL;
    if ((rc = parse_checks(vc, linear, &mask)) != VERIFY_PASS ||
        (rc = vcase_get_string(vc, "dump", false, &dump)) != VERIFY_PASS ||
        (rc = parse_case(vc, &L, ops[which].nsp)) != VERIFY_PASS) {
        return rc;
    }
    if (L.kind == K_POOL) {
        L.pool.kind = strncmp(vc->op, "max", 3) == 0 ? DDL_POOL_MAX : DDL_POOL_AVG;
    }
    // Partitions: P_x always; P_y / P_w where the op takes them.
    bool takes_y = L.kind == K_LINEAR || L.kind == K_CONV;
    if ((rc = vcase_get_partition(vc, "P_x", true, &L.P[0])) != VERIFY_PASS ||
        (takes_y && (rc = vcase_get_partition(vc, "P_y", L.kind == K_LINEAR, &L.P[1])) != VERIFY_PASS) ||
        (takes_y && (rc = vcase_get_partition(vc, "P_w", L.kind == K_LINEAR, &L.P[2])) != VERIFY_PASS) ||
        (rc = make_twins(vc, &L)) != VERIFY_PASS) {
        lcase_free(&L);
        return rc;
    }
    if (dump != NULL && vc->world_rank == 0) {
        mkdir(dump, 0755);
    }
    double tol_adj = verify_adjoint_tol(vc->dt), tol_seq = vc->dt == DDL_F64 ? 1e-12 : 1e-5;
    double tol_fd  = 1e-6;
    bool   pass    = true;
    ddl_check_result r;
    bool is_loss = L.kind == K_LOSS || L.kind == K_CROSS_ENTROPY;
    if (is_loss) {
        ddl_loss_builder b = {build_loss, &L, vc->seed, L.x_global,
                              L.kind == K_CROSS_ENTROPY ? DDL_LOSS_CROSS_ENTROPY : L.loss,
                              L.reduction};
        if (rc == VERIFY_PASS && (mask & C_SEQUENTIAL)) {
            rc = vcase_status(vc, ddl_check_loss_sequential(&b, vc->dt, &r), vc->op);
            if (rc == VERIFY_PASS) {
                print_figure(vc, "sequential_max_rel_error", r.max);
                pass = pass && r.max <= tol_seq;
            }
        }
        if (rc == VERIFY_PASS && (mask & C_GRADCHECK)) {
            rc = vcase_status(vc, ddl_check_loss_gradcheck(&b, 16, &r), vc->op);
            if (rc == VERIFY_PASS) {
                print_figure(vc, "gradcheck_max_rel_error", r.max);
                pass = pass && r.max <= tol_fd;
            }
        }
        if (rc == VERIFY_PASS && dump != NULL) {
            rc = vcase_status(vc, ddl_check_loss_dump(&b, vc->dt, dump), "dump");
        }
    } else {
        ddl_layer_builder b = {build_layer, &L, vc->seed, L.kind != K_BATCHNORM || L.training};
        if (rc == VERIFY_PASS && (mask & C_ADJOINT)) {
            rc = vcase_status(vc, ddl_check_adjoint(&b, vc->dt, &r), vc->op);
            if (rc == VERIFY_PASS) {
                if (r.nparams == 0) {
                    print_figure(vc, "adjoint_error", r.err_input);
                } else {
                    print_figure(vc, "adjoint_error_input", r.err_input);
                    for (int i = 0; i < r.nparams; i++) {
                        char name[64];
                        snprintf(name, sizeof name, "adjoint_error_%s", r.param_names[i]);
                        print_figure(vc, name, r.err_param[i]);
                    }
                }
                pass = pass && r.max <= tol_adj;
            }
        }
        if (rc == VERIFY_PASS && (mask & C_SEQUENTIAL)) {
            rc = vcase_status(vc, ddl_check_sequential(&b, vc->dt, &r), vc->op);
            if (rc == VERIFY_PASS) {
                print_figure(vc, "sequential_max_rel_error", r.max);
                pass = pass && r.max <= tol_seq;
            }
        }
        if (rc == VERIFY_PASS && (mask & C_GRADCHECK)) {
            rc = vcase_status(vc, ddl_check_gradcheck(&b, 12, &r), vc->op);
            if (rc == VERIFY_PASS) {
                print_figure(vc, "gradcheck_max_rel_error", r.max);
                pass = pass && r.max <= tol_fd;
            }
        }
        if (rc == VERIFY_PASS && dump != NULL) {
            rc = vcase_status(vc, ddl_check_dump(&b, vc->dt, dump), "dump");
        }
    }
    lcase_free(&L);
    if (rc != VERIFY_PASS) {
        return rc;
    }
    return pass ? VERIFY_PASS : VERIFY_FAIL;
}
