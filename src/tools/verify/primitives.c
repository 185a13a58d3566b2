// tools/verify/primitives.c: distdl-verify cases for the five primitives.
//
// Each case builds the plan, draws x on the input space and y on the output space,
// and runs the adjoint test |<Fx, y> - <x, F*y>| / max(|Fx||y|, |x||F*y|).
#include <string.h>

#include "ddl/agree.h"
#include "verify.h"

static const char *const COMMON[] = {"op", "dtype", "seed"};

// Builds the allowed-key list: the common keys plus `extra`.
static int check_keys(vcase *c, const char *const *extra)
{
    const char *all[32];
    int         n = 0;
    for (size_t i = 0; i < sizeof COMMON / sizeof COMMON[0]; i++) {
        all[n++] = COMMON[i];
    }
    for (int i = 0; extra[i] != NULL; i++) {
        all[n++] = extra[i];
    }
    all[n] = NULL;
    return vcase_check_keys(c, all);
}

// The plan of one case, as a linear operator between two local spaces.
typedef struct op_plan {
    ddl_shape x_shape, y_shape;
    ddl_status (*forward)(const void *plan, const ddl_tensor_t *x, ddl_tensor_t *y);
    ddl_status (*adjoint)(const void *plan, const ddl_tensor_t *dy, ddl_tensor_t *dx);
    const void *plan;
    bool        in_place;  // halo exchange: y-space == x-space, applied in place
} op_plan;

// Adapters from each plan's typed forward/adjoint to the op_plan signature.
#define ADAPT(name, type)                                                                   \
    static ddl_status name##_fwd(const void *p, const ddl_tensor_t *x, ddl_tensor_t *y)    \
    {                                                                                       \
        return ddl_##name##_forward((const type *)p, x, y);                                 \
    }                                                                                       \
    static ddl_status name##_adj(const void *p, const ddl_tensor_t *dy, ddl_tensor_t *dx)  \
    {                                                                                       \
        return ddl_##name##_adjoint((const type *)p, dy, dx);                               \
    }
ADAPT(broadcast, ddl_broadcast_t)
ADAPT(sum_reduce, ddl_sum_reduce_t)
ADAPT(all_sum_reduce, ddl_all_sum_reduce_t)
ADAPT(repartition, ddl_repartition_t)
#undef ADAPT

static ddl_status halo_fwd(const void *p, const ddl_tensor_t *x, ddl_tensor_t *y)
{
    ddl_status st = ddl_tensor_copy(x, y);
    return st != DDL_OK ? st : ddl_halo_exchange_forward(p, y);
}

static ddl_status halo_adj(const void *p, const ddl_tensor_t *dy, ddl_tensor_t *dx)
{
    ddl_status st = ddl_tensor_copy(dy, dx);
    return st != DDL_OK ? st : ddl_halo_exchange_adjoint(p, dx);
}

// Runs the adjoint test of a plan and prints the figure; returns PASS or FAIL.
static int run_adjoint(vcase *c, const op_plan *op)
{
    ddl_tensor_t *x = NULL, *Fx = NULL, *y = NULL, *Fty = NULL;
    verify_arm_fail_alloc();
    ddl_status    st = verify_random(c->dt, &op->x_shape, c->seed, 1, &x);
    if (st == DDL_OK) {
        st = verify_random(c->dt, &op->y_shape, c->seed, 2, &y);
    }
    if (st == DDL_OK) {
        st = ddl_tensor_create(c->dt, &op->y_shape, &Fx);
    }
    if (st == DDL_OK) {
        st = ddl_tensor_create(c->dt, &op->x_shape, &Fty);
    }
    // A rank that could not allocate must not leave the others alone in forward.
    st = ddl_agree(MPI_COMM_WORLD, st);
    if (st == DDL_OK) {
        st = op->forward(op->plan, x, Fx);
    }
    st = ddl_agree(MPI_COMM_WORLD, st);
    if (st == DDL_OK) {
        st = op->adjoint(op->plan, y, Fty);
    }
    int rc = vcase_status(c, st, c->op);
    if (rc == VERIFY_PASS) {
        double err = verify_adjoint_error(x, Fx, y, Fty);
        if (c->world_rank == 0) {
            printf("adjoint_error %.6e\n", err);
        }
        rc = (err <= verify_adjoint_tol(c->dt)) ? VERIFY_PASS : VERIFY_FAIL;
    }
    ddl_tensor_destroy(&x);
    ddl_tensor_destroy(&Fx);
    ddl_tensor_destroy(&y);
    ddl_tensor_destroy(&Fty);
    return rc;
}

static int case_broadcast_or_reduce(vcase *c, bool is_reduce)
{
    static const char *const keys[] = {"P_x", "P_y", "transpose_src", "transpose_dest",
                                       "x_local_shape", NULL};
    int rc = check_keys(c, keys);
    if (rc != VERIFY_PASS) {
        return rc;
    }
    bool      ts = false, td = false;
    ddl_shape shape;
    if ((rc = vcase_get_bool(c, "transpose_src", false, &ts)) != VERIFY_PASS ||
        (rc = vcase_get_bool(c, "transpose_dest", false, &td)) != VERIFY_PASS ||
        (rc = vcase_get_shape(c, "x_local_shape", true, &shape)) != VERIFY_PASS) {
        return rc;
    }
    ddl_partition_t *Px = NULL, *Py = NULL;
    if ((rc = vcase_get_partition(c, "P_x", true, &Px)) != VERIFY_PASS) {
        return rc;
    }
    if ((rc = vcase_get_partition(c, "P_y", true, &Py)) != VERIFY_PASS) {
        ddl_partition_destroy(&Px);
        return rc;
    }
    op_plan op = {0};
    if (!is_reduce) {
        ddl_broadcast_t *b = NULL;
        rc = vcase_status(c, ddl_broadcast_create(Px, Py, ts, td, c->dt, &shape, &b), "broadcast");
        if (rc == VERIFY_PASS) {
            op = (op_plan){ddl_broadcast_x_shape(b), ddl_broadcast_y_shape(b),
                           broadcast_fwd, broadcast_adj, b, false};
            rc = run_adjoint(c, &op);
        }
        ddl_broadcast_destroy(&b);
    } else {
        ddl_sum_reduce_t *r = NULL;
        rc = vcase_status(c, ddl_sum_reduce_create(Px, Py, ts, td, c->dt, &shape, &r), "sum_reduce");
        if (rc == VERIFY_PASS) {
            op = (op_plan){ddl_sum_reduce_x_shape(r), ddl_sum_reduce_y_shape(r),
                           sum_reduce_fwd, sum_reduce_adj, r, false};
            rc = run_adjoint(c, &op);
        }
        ddl_sum_reduce_destroy(&r);
    }
    ddl_partition_destroy(&Px);
    ddl_partition_destroy(&Py);
    return rc;
}

static int case_all_sum_reduce(vcase *c)
{
    static const char *const keys[] = {"P_x", "axes_reduce", "x_local_shape", NULL};
    int rc = check_keys(c, keys);
    if (rc != VERIFY_PASS) {
        return rc;
    }
    ddl_shape shape;
    int64_t   axes64[DDL_MAX_DIMS];
    int       naxes = 0;
    json_t   *ja    = json_object_get(c->obj, "axes_reduce");
    if (ja == NULL) {
        return vcase_invalid(c, "missing key \"axes_reduce\" (required by op \"all_sum_reduce\")");
    }
    if (json_is_array(ja) && json_array_size(ja) == 0) {
        naxes = 0;  // an empty list is the identity
    } else if ((rc = vcase_get_ints(c, "axes_reduce", true, DDL_MAX_DIMS, 0, DDL_MAX_DIMS - 1,
                                    axes64, &naxes)) != VERIFY_PASS) {
        return rc;
    }
    if ((rc = vcase_get_shape(c, "x_local_shape", true, &shape)) != VERIFY_PASS) {
        return rc;
    }
    ddl_partition_t *Px = NULL;
    if ((rc = vcase_get_partition(c, "P_x", true, &Px)) != VERIFY_PASS) {
        return rc;
    }
    int axes[DDL_MAX_DIMS];
    for (int i = 0; i < naxes; i++) {
        axes[i] = (int)axes64[i];
    }
    ddl_all_sum_reduce_t *a = NULL;
    rc = vcase_status(c, ddl_all_sum_reduce_create(Px, naxes, axes, c->dt, &shape, &a),
                      "all_sum_reduce");
    if (rc == VERIFY_PASS) {
        ddl_shape s  = ddl_all_sum_reduce_shape(a);
        op_plan   op = {s, s, all_sum_reduce_fwd, all_sum_reduce_adj,
                        a, false};
        rc = run_adjoint(c, &op);
    }
    ddl_all_sum_reduce_destroy(&a);
    ddl_partition_destroy(&Px);
    return rc;
}

// An unbalanced but valid local shape: along every dimension split in two or more
// pieces, piece 0 gives one element to piece 1 when it has one to spare, so the
// pieces still tile the global tensor on a grid.
static ddl_shape unbalanced_local(const ddl_partition_t *P, const ddl_shape *global)
{
    ddl_shape s = ddl_partition_local_shape(P, global);
    if (!ddl_partition_active(P)) {
        return s;
    }
    const int *idx = ddl_partition_index(P), *ps = ddl_partition_shape(P);
    for (int d = 0; d < global->ndim; d++) {
        if (ps[d] >= 2 && ddl_decomp_size(global->d[d], ps[d], 0) >= 1) {
            if (idx[d] == 0) {
                s.d[d] -= 1;
            } else if (idx[d] == 1) {
                s.d[d] += 1;
            }
        }
    }
    return s;
}

static int case_repartition(vcase *c)
{
    static const char *const keys[] = {"P_x", "P_y", "x_global_shape", "balanced", NULL};
    int rc = check_keys(c, keys);
    if (rc != VERIFY_PASS) {
        return rc;
    }
    ddl_shape global;
    bool      balanced = true;
    if ((rc = vcase_get_shape(c, "x_global_shape", true, &global)) != VERIFY_PASS ||
        (rc = vcase_get_bool(c, "balanced", false, &balanced)) != VERIFY_PASS) {
        return rc;
    }
    ddl_partition_t *Px = NULL, *Py = NULL;
    if ((rc = vcase_get_partition(c, "P_x", true, &Px)) != VERIFY_PASS) {
        return rc;
    }
    if ((rc = vcase_get_partition(c, "P_y", true, &Py)) != VERIFY_PASS) {
        ddl_partition_destroy(&Px);
        return rc;
    }
    ddl_repartition_t *t = NULL;
    ddl_shape          xl;
    if (!balanced && ddl_partition_ndim(Px) == global.ndim) {
        xl = unbalanced_local(Px, &global);
    }
    rc = vcase_status(c,
                      ddl_repartition_create(Px, Py, c->dt, &global,
                                             (!balanced && ddl_partition_ndim(Px) == global.ndim)
                                                 ? &xl
                                                 : NULL,
                                             &t),
                      "repartition");
    if (rc == VERIFY_PASS) {
        op_plan op = {ddl_repartition_x_shape(t), ddl_repartition_y_shape(t),
                      repartition_fwd, repartition_adj, t, false};
        rc = run_adjoint(c, &op);
    }
    ddl_repartition_destroy(&t);
    ddl_partition_destroy(&Px);
    ddl_partition_destroy(&Py);
    return rc;
}

// Reads a per-dimension window parameter, left-padding to ndim with `fill`.
static int get_window(vcase *c, const char *key, int ndim, long long min, int64_t fill,
                      int64_t *out)
{
    int64_t v[DDL_MAX_DIMS];
    int     n  = 0;
    int     rc = vcase_get_ints(c, key, false, ndim, min, 1 << 20, v, &n);
    if (rc != VERIFY_PASS) {
        return rc;
    }
    for (int i = 0; i < ndim; i++) {
        out[i] = (i < ndim - n) ? fill : v[i - (ndim - n)];
    }
    return VERIFY_PASS;
}

static int case_halo_exchange(vcase *c)
{
    static const char *const keys[] = {"P_x",    "x_global_shape", "kernel", "stride",
                                       "padding", "dilation",       NULL};
    int rc = check_keys(c, keys);
    if (rc != VERIFY_PASS) {
        return rc;
    }
    ddl_shape global;
    if ((rc = vcase_get_shape(c, "x_global_shape", true, &global)) != VERIFY_PASS) {
        return rc;
    }
    if (json_object_get(c->obj, "kernel") == NULL) {
        return vcase_invalid(c, "missing key \"kernel\" (required by op \"halo_exchange\")");
    }
    int     nd = global.ndim;
    int64_t k[DDL_MAX_DIMS], s[DDL_MAX_DIMS], p[DDL_MAX_DIMS], d[DDL_MAX_DIMS];
    if ((rc = get_window(c, "kernel", nd, 1, 1, k)) != VERIFY_PASS ||
        (rc = get_window(c, "stride", nd, 1, 1, s)) != VERIFY_PASS ||
        (rc = get_window(c, "padding", nd, 0, 0, p)) != VERIFY_PASS ||
        (rc = get_window(c, "dilation", nd, 1, 1, d)) != VERIFY_PASS) {
        return rc;
    }
    ddl_partition_t *Px = NULL;
    if ((rc = vcase_get_partition(c, "P_x", true, &Px)) != VERIFY_PASS) {
        return rc;
    }
    ddl_halo_exchange_t *h = NULL;
    rc = vcase_status(c, ddl_halo_exchange_create(Px, c->dt, &global, k, s, p, d, &h),
                      "halo_exchange");
    if (rc == VERIFY_PASS) {
        ddl_shape bs = ddl_halo_exchange_shape(h);
        op_plan   op = {bs, bs, halo_fwd, halo_adj, h, true};
        rc           = run_adjoint(c, &op);
    }
    ddl_halo_exchange_destroy(&h);
    ddl_partition_destroy(&Px);
    return rc;
}

int verify_primitive(vcase *c)
{
    if (strcmp(c->op, "broadcast") == 0) {
        return case_broadcast_or_reduce(c, false);
    }
    if (strcmp(c->op, "sum_reduce") == 0) {
        return case_broadcast_or_reduce(c, true);
    }
    if (strcmp(c->op, "all_sum_reduce") == 0) {
        return case_all_sum_reduce(c);
    }
    if (strcmp(c->op, "repartition") == 0) {
        return case_repartition(c);
    }
    if (strcmp(c->op, "halo_exchange") == 0) {
        return case_halo_exchange(c);
    }
    return -1;
}
