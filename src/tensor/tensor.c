// tensor/tensor.c: tensor lifetime, elementwise helpers and box movement.
//
// Box movement walks the box as a sequence of contiguous runs: trailing dimensions the
// box covers completely (in both source and destination) are merged into the run, so a
// slab of whole rows moves with a single memcpy, and only the outer dimensions are
// iterated with an odometer.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/check.h"
#include "ddl/base.h"
#include "ddl/tensor.h"

// ---- shapes and boxes ------------------------------------------------------

size_t ddl_dtype_size(ddl_dtype dt)
{
    return dt == DDL_F64 ? 8 : 4;
}

const char *ddl_dtype_name(ddl_dtype dt)
{
    return dt == DDL_F64 ? "f64" : "f32";
}

ddl_shape ddl_shape_make(int ndim, const int64_t *d)
{
    ddl_shape s = {.ndim = ndim};
    for (int i = 0; i < ndim && i < DDL_MAX_DIMS; i++) {
        s.d[i] = d[i];
    }
    return s;
}

int64_t ddl_shape_numel(const ddl_shape *s)
{
    int64_t n = 1;
    for (int i = 0; i < s->ndim; i++) {
        if (s->d[i] < 0 || __builtin_mul_overflow(n, s->d[i], &n)) {
            return -1;
        }
    }
    return n;
}

ddl_status ddl_shape_numel_checked(const ddl_shape *s, int64_t *out)
{
    char buf[200];
    DDL_REQUIRE(s->ndim >= 0 && s->ndim <= DDL_MAX_DIMS, DDL_EINVAL,
                "shape: ndim %d outside [0, %d]", s->ndim, DDL_MAX_DIMS);
    int64_t n = ddl_shape_numel(s);
    DDL_REQUIRE(n >= 0 && n <= DDL_MAX_TENSOR_ELEMENTS, DDL_EINVAL,
                "shape %s: %s elements, the limit per tensor is 2^34 (DDL_MAX_TENSOR_ELEMENTS)",
                ddl_shape_str(s, buf, sizeof buf),
                n < 0 ? "a negative size or more than 2^63" : "too many");
    *out = n;
    return DDL_OK;
}

bool ddl_shape_equal(const ddl_shape *a, const ddl_shape *b)
{
    if (a->ndim != b->ndim) {
        return false;
    }
    for (int i = 0; i < a->ndim; i++) {
        if (a->d[i] != b->d[i]) {
            return false;
        }
    }
    return true;
}

char *ddl_shape_str(const ddl_shape *s, char *buf, size_t len)
{
    size_t used = 0;
    if (len == 0) {
        return buf;
    }
    buf[0] = '\0';
    used += (size_t)snprintf(buf + used, len - used, "[");
    for (int i = 0; i < s->ndim && used < len; i++) {
        used += (size_t)snprintf(buf + used, len - used, i ? ", %lld" : "%lld", (long long)s->d[i]);
    }
    if (used < len) {
        snprintf(buf + used, len - used, "]");
    }
    return buf;
}

ddl_box ddl_box_make(int ndim, const int64_t *start, const int64_t *stop)
{
    ddl_box b = {.ndim = ndim};
    for (int i = 0; i < ndim && i < DDL_MAX_DIMS; i++) {
        b.start[i] = start[i];
        b.stop[i]  = stop[i];
    }
    return b;
}

ddl_box ddl_box_full(const ddl_shape *s)
{
    ddl_box b = {.ndim = s->ndim};
    for (int i = 0; i < s->ndim; i++) {
        b.start[i] = 0;
        b.stop[i]  = s->d[i];
    }
    return b;
}

int64_t ddl_box_numel(const ddl_box *b)
{
    int64_t n = 1;
    for (int i = 0; i < b->ndim; i++) {
        int64_t e;
        if (__builtin_sub_overflow(b->stop[i], b->start[i], &e)) {
            return -1;
        }
        if (__builtin_mul_overflow(n, e > 0 ? e : 0, &n)) {
            return -1;
        }
    }
    return n;
}

ddl_shape ddl_box_shape(const ddl_box *b)
{
    ddl_shape s = {.ndim = b->ndim};
    for (int i = 0; i < b->ndim; i++) {
        int64_t e = b->stop[i] - b->start[i];
        s.d[i]    = e > 0 ? e : 0;
    }
    return s;
}

bool ddl_box_intersect(const ddl_box *a, const ddl_box *b, ddl_box *out)
{
    ddl_box r  = {.ndim = a->ndim};
    bool    ok = a->ndim == b->ndim;
    for (int i = 0; i < a->ndim; i++) {
        r.start[i] = a->start[i] > b->start[i] ? a->start[i] : b->start[i];
        r.stop[i]  = a->stop[i] < b->stop[i] ? a->stop[i] : b->stop[i];
        if (r.stop[i] <= r.start[i]) {
            ok = false;
        }
    }
    if (!ok) {
        for (int i = 0; i < r.ndim; i++) {
            r.start[i] = r.stop[i] = 0;
        }
    }
    *out = r;
    return ok;
}

ddl_box ddl_box_shift(const ddl_box *b, const int64_t *origin, int sign)
{
    ddl_box r = *b;
    for (int i = 0; i < b->ndim; i++) {
        r.start[i] -= sign * origin[i];
        r.stop[i] -= sign * origin[i];
    }
    return r;
}

bool ddl_box_inside(const ddl_box *b, const ddl_shape *s)
{
    if (b->ndim != s->ndim) {
        return false;
    }
    for (int i = 0; i < b->ndim; i++) {
        if (b->start[i] < 0 || b->stop[i] > s->d[i] || b->start[i] > b->stop[i]) {
            return false;
        }
    }
    return true;
}

// ---- tensors ---------------------------------------------------------------

static ddl_status check_shape(const ddl_shape *shape)
{
    DDL_REQUIRE(shape->ndim >= 0 && shape->ndim <= DDL_MAX_DIMS, DDL_EINVAL,
                "tensor: ndim %d outside [0, %d]", shape->ndim, DDL_MAX_DIMS);
    for (int i = 0; i < shape->ndim; i++) {
        DDL_REQUIRE(shape->d[i] >= 0, DDL_EINVAL, "tensor: dimension %d has negative size %lld", i,
                    (long long)shape->d[i]);
    }
    int64_t n;
    return ddl_shape_numel_checked(shape, &n);
}

ddl_status ddl_tensor_create(ddl_dtype dt, const ddl_shape *shape, ddl_tensor_t **out)
{
    DDL_CHECK(check_shape(shape));
    DDL_REQUIRE(dt == DDL_F32 || dt == DDL_F64, DDL_EINVAL, "tensor: unknown dtype %d", (int)dt);
    ddl_tensor_t *t = ddl_calloc(1, sizeof *t);
    if (t == NULL) {
        return ddl_set_error(DDL_ENOMEM, "tensor: out of memory for the tensor header");
    }
    t->dtype   = dt;
    t->shape   = *shape;
    t->owns    = true;
    size_t len = (size_t)ddl_shape_numel(shape) * ddl_dtype_size(dt);
    t->data    = ddl_calloc(1, len);
    if (t->data == NULL) {
        ddl_free(t);
        return ddl_set_error(DDL_ENOMEM, "tensor: out of memory allocating %zu bytes", len);
    }
    *out = t;
    return DDL_OK;
}

ddl_status ddl_tensor_view(ddl_dtype dt, const ddl_shape *shape, void *data, ddl_tensor_t **out)
{
    DDL_CHECK(check_shape(shape));
    ddl_tensor_t *t = ddl_calloc(1, sizeof *t);
    if (t == NULL) {
        return ddl_set_error(DDL_ENOMEM, "tensor: out of memory for the tensor header");
    }
    t->dtype = dt;
    t->shape = *shape;
    t->data  = data;
    t->owns  = false;
    *out     = t;
    return DDL_OK;
}

void ddl_tensor_destroy(ddl_tensor_t **t)
{
    if (t == NULL || *t == NULL) {
        return;
    }
    if ((*t)->owns) {
        ddl_free((*t)->data);
    }
    ddl_free(*t);
    *t = NULL;
}

int64_t ddl_tensor_numel(const ddl_tensor_t *t)
{
    return ddl_shape_numel(&t->shape);
}

size_t ddl_tensor_bytes(const ddl_tensor_t *t)
{
    return (size_t)ddl_tensor_numel(t) * ddl_dtype_size(t->dtype);
}

void ddl_tensor_zero(ddl_tensor_t *t)
{
    if (ddl_tensor_bytes(t) > 0) {
        memset(t->data, 0, ddl_tensor_bytes(t));
    }
}

ddl_status ddl_tensor_copy(const ddl_tensor_t *x, ddl_tensor_t *y)
{
    DDL_REQUIRE(x->dtype == y->dtype && ddl_shape_equal(&x->shape, &y->shape), DDL_ESHAPE,
                "tensor_copy: source and destination differ in dtype or shape");
    if (ddl_tensor_bytes(x) > 0 && x->data != y->data) {
        memcpy(y->data, x->data, ddl_tensor_bytes(x));
    }
    return DDL_OK;
}

double ddl_tensor_get(const ddl_tensor_t *t, int64_t i)
{
    return t->dtype == DDL_F64 ? ((const double *)t->data)[i] : (double)((const float *)t->data)[i];
}

void ddl_tensor_set(ddl_tensor_t *t, int64_t i, double v)
{
    if (t->dtype == DDL_F64) {
        ((double *)t->data)[i] = v;
    } else {
        ((float *)t->data)[i] = (float)v;
    }
}

double ddl_tensor_dot(const ddl_tensor_t *x, const ddl_tensor_t *y)
{
    int64_t n = ddl_tensor_numel(x);
    double  s = 0.0;
    if (x->dtype == DDL_F64 && y->dtype == DDL_F64) {
        const double *a = x->data, *b = y->data;
        for (int64_t i = 0; i < n; i++) {
            s += a[i] * b[i];
        }
    } else {
        for (int64_t i = 0; i < n; i++) {
            s += ddl_tensor_get(x, i) * ddl_tensor_get(y, i);
        }
    }
    return s;
}

void ddl_tensor_fill_uniform(ddl_tensor_t *t, uint64_t seed, uint64_t stream)
{
    int64_t n = ddl_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) {
        ddl_tensor_set(t, i, 2.0 * ddl_rng_uniform(seed, stream, (uint64_t)i) - 1.0);
    }
}

// ---- box movement ----------------------------------------------------------

// A strided walk: `extent` per dimension (the box shape), and element strides for the
// source and destination (a flat buffer has the box's own row-major strides).
typedef struct walk {
    int     ndim;
    int64_t extent[DDL_MAX_DIMS];
    int64_t sstride[DDL_MAX_DIMS];
    int64_t dstride[DDL_MAX_DIMS];
    int64_t soff, doff;  // element offsets of the first element
} walk;

static void row_major_strides(const ddl_shape *s, int64_t *st)
{
    int64_t acc = 1;
    for (int i = s->ndim - 1; i >= 0; i--) {
        st[i] = acc;
        acc *= s->d[i];
    }
}

// Describes box b of a tensor with shape s: element offset and strides.
static void describe_box(const ddl_shape *s, const ddl_box *b, int64_t *off, int64_t *st)
{
    row_major_strides(s, st);
    *off = 0;
    for (int i = 0; i < s->ndim; i++) {
        *off += b->start[i] * st[i];
    }
}

// Describes a flat buffer holding a box of shape e.
static void describe_flat(const ddl_box *b, int64_t *off, int64_t *st)
{
    ddl_shape e = ddl_box_shape(b);
    row_major_strides(&e, st);
    *off = 0;
}

typedef enum { OP_COPY, OP_ADD, OP_ZERO, OP_FILL } move_op;

static void run_op(move_op op, ddl_dtype dt, char *dst, const char *src, int64_t n)
{
    size_t es = ddl_dtype_size(dt);
    switch (op) {
    case OP_COPY:
        memcpy(dst, src, (size_t)n * es);
        break;
    case OP_ZERO:
        memset(dst, 0, (size_t)n * es);
        break;
    case OP_FILL: // src: the one value
        for (int64_t i = 0; i < n; i++) {
            memcpy(dst + (size_t)i * es, src, es);
        }
        break;
    case OP_ADD:
        if (dt == DDL_F64) {
            double *restrict d       = (double *)dst;
            const double *restrict s = (const double *)src;
            for (int64_t i = 0; i < n; i++) {
                d[i] += s[i];
            }
        } else {
            float *restrict d       = (float *)dst;
            const float *restrict s = (const float *)src;
            for (int64_t i = 0; i < n; i++) {
                d[i] += s[i];
            }
        }
        break;
    }
}

// Executes the walk: merges the trailing dimensions that are contiguous in both source
// and destination into one run, then iterates over the remaining dimensions.
static void walk_run(const walk *w, move_op op, ddl_dtype dt, char *dst, const char *src)
{
    for (int i = 0; i < w->ndim; i++) {
        if (w->extent[i] <= 0) {
            return;
        }
    }
    size_t  es  = ddl_dtype_size(dt);
    int     k   = w->ndim;  // dims [k, ndim) form the run
    int64_t run = 1;
    while (k > 0 && w->sstride[k - 1] == run && w->dstride[k - 1] == run) {
        run *= w->extent[k - 1];
        k--;
    }
    if (k == w->ndim && w->ndim > 0) {
        // The innermost dimension is strided on one side: not produced by our layouts,
        // but handle it with single-element runs.
        k   = w->ndim;
        run = 1;
    }
    int64_t idx[DDL_MAX_DIMS] = {0};
    int64_t so = w->soff, dof = w->doff;
    for (;;) {
        run_op(op, dt, dst + dof * (int64_t)es,
               op == OP_FILL ? src
               : src         ? src + so * (int64_t)es
                             : NULL,
               run);
        int i = k - 1;
        while (i >= 0) {
            idx[i]++;
            so += w->sstride[i];
            dof += w->dstride[i];
            if (idx[i] < w->extent[i]) {
                break;
            }
            so -= w->sstride[i] * w->extent[i];
            dof -= w->dstride[i] * w->extent[i];
            idx[i] = 0;
            i--;
        }
        if (i < 0) {
            return;
        }
    }
}

static void move_tensor_to_flat(const ddl_tensor_t *t, const ddl_box *b, void *buf)
{
    walk w = {.ndim = b->ndim};
    for (int i = 0; i < b->ndim; i++) {
        w.extent[i] = b->stop[i] - b->start[i];
    }
    describe_box(&t->shape, b, &w.soff, w.sstride);
    describe_flat(b, &w.doff, w.dstride);
    walk_run(&w, OP_COPY, t->dtype, buf, t->data);
}

static void move_flat_to_tensor(ddl_tensor_t *t, const ddl_box *b, const void *buf, move_op op)
{
    walk w = {.ndim = b->ndim};
    for (int i = 0; i < b->ndim; i++) {
        w.extent[i] = b->stop[i] - b->start[i];
    }
    describe_flat(b, &w.soff, w.sstride);
    describe_box(&t->shape, b, &w.doff, w.dstride);
    walk_run(&w, op, t->dtype, t->data, buf);
}

void ddl_tensor_pack(const ddl_tensor_t *t, const ddl_box *b, void *buf)
{
    DDL_ASSERT(ddl_box_inside(b, &t->shape));
    move_tensor_to_flat(t, b, buf);
}

void ddl_tensor_unpack(ddl_tensor_t *t, const ddl_box *b, const void *buf)
{
    DDL_ASSERT(ddl_box_inside(b, &t->shape));
    move_flat_to_tensor(t, b, buf, OP_COPY);
}

void ddl_tensor_unpack_add(ddl_tensor_t *t, const ddl_box *b, const void *buf)
{
    DDL_ASSERT(ddl_box_inside(b, &t->shape));
    move_flat_to_tensor(t, b, buf, OP_ADD);
}

static void box_to_box(const ddl_tensor_t *x, const ddl_box *bx, ddl_tensor_t *y, const ddl_box *by,
                       move_op op)
{
    DDL_ASSERT(ddl_box_inside(bx, &x->shape) && ddl_box_inside(by, &y->shape));
    DDL_ASSERT(x->dtype == y->dtype && bx->ndim == by->ndim);
    walk w = {.ndim = bx->ndim};
    for (int i = 0; i < bx->ndim; i++) {
        w.extent[i] = bx->stop[i] - bx->start[i];
        DDL_ASSERT(w.extent[i] == by->stop[i] - by->start[i]);
    }
    describe_box(&x->shape, bx, &w.soff, w.sstride);
    describe_box(&y->shape, by, &w.doff, w.dstride);
    walk_run(&w, op, x->dtype, y->data, x->data);
}

void ddl_tensor_copy_box(const ddl_tensor_t *x, const ddl_box *bx, ddl_tensor_t *y, const ddl_box *by)
{
    box_to_box(x, bx, y, by, OP_COPY);
}

void ddl_tensor_add_box(const ddl_tensor_t *x, const ddl_box *bx, ddl_tensor_t *y, const ddl_box *by)
{
    box_to_box(x, bx, y, by, OP_ADD);
}

void ddl_tensor_zero_box(ddl_tensor_t *t, const ddl_box *b)
{
    ddl_tensor_fill_box(t, b, 0.0);
}

void ddl_tensor_fill_box(ddl_tensor_t *t, const ddl_box *b, double v)
{
    DDL_ASSERT(ddl_box_inside(b, &t->shape));
    walk w = {.ndim = b->ndim};
    for (int i = 0; i < b->ndim; i++) {
        w.extent[i] = b->stop[i] - b->start[i];
    }
    describe_box(&t->shape, b, &w.doff, w.dstride);
    for (int i = 0; i < b->ndim; i++) {
        w.sstride[i] = w.dstride[i]; // as zero_box: the runs merge alike
    }
    double d = v;
    float  f = (float)v;
    walk_run(&w, v == 0 && !signbit(v) ? OP_ZERO : OP_FILL, t->dtype, t->data,
             t->dtype == DDL_F64 ? (const char *)&d : (const char *)&f);
}
