// engine/spec.c: model spec parsing and validation (no MPI).
//
// jansson parses the text (rejecting duplicate keys, with the line of a syntax error);
// a small scanner indexes the line of every key path ("layers[3].kernel") so every
// semantic error names the key and the line. Validation follows the tensor through the
// layer sequence: each layer's global input shape is the previous layer's output, and
// a layer whose parameters do not fit it is refused before any model is built.
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/check.h"
#include "ddl/base.h"
#include "engine/spec_internal.h"

// ---- line index of key paths -------------------------------------------------

typedef struct jline {
    char *path;
    int   line;
} jline;

typedef struct pctx {
    ddl_spec_t *s;
    jline      *lines;
    int         nlines, cap;
} pctx;

static void index_add(pctx *c, const char *path, int line)
{
    if (c->nlines == c->cap) {
        int    cap = c->cap ? 2 * c->cap : 256;
        jline *n   = realloc(c->lines, sizeof *n * (size_t)cap);
        if (n == NULL) {
            return;  // the index only improves messages
        }
        c->lines = n;
        c->cap   = cap;
    }
    c->lines[c->nlines].path = strdup(path);
    c->lines[c->nlines].line = line;
    if (c->lines[c->nlines].path != NULL) {
        c->nlines++;
    }
}

// Scans JSON text (already known to parse) recording the line of every value's path.
static void index_build(pctx *c, const char *t)
{
    typedef struct frame {
        bool obj;
        int  idx;
        char path[256];
        char key[128];
        bool expect_key;
    } frame;
    frame st[64];
    int   top = -1, line = 1;
    char  pending[256] = "";  // path of the value about to start
    for (const char *p = t; *p; p++) {
        char ch = *p;
        if (ch == '\n') {
            line++;
        } else if (ch == '"') {
            const char *q = p + 1;
            char        buf[128];
            size_t      n = 0;
            while (*q && *q != '"') {
                if (*q == '\\' && q[1]) {
                    q++;
                }
                if (n + 1 < sizeof buf) {
                    buf[n++] = *q;
                }
                q++;
            }
            buf[n] = '\0';
            if (top >= 0 && st[top].obj && st[top].expect_key) {
                snprintf(st[top].key, sizeof st[top].key, "%s", buf);
                st[top].expect_key = false;
                if (st[top].path[0]) {
                    snprintf(pending, sizeof pending, "%.120s.%.120s", st[top].path, buf);
                } else {
                    snprintf(pending, sizeof pending, "%.250s", buf);
                }
                index_add(c, pending, line);
            }
            p = *q ? q : q - 1;
        } else if (ch == '{' || ch == '[') {
            if (top + 1 >= 64) {
                return;
            }
            char path[256];
            if (top >= 0 && !st[top].obj) {
                snprintf(path, sizeof path, "%.240s[%d]", st[top].path, st[top].idx);
                index_add(c, path, line);
            } else {
                snprintf(path, sizeof path, "%s", top >= 0 ? pending : "");
            }
            top++;
            st[top].obj        = ch == '{';
            st[top].idx        = 0;
            st[top].expect_key = ch == '{';
            snprintf(st[top].path, sizeof st[top].path, "%s", path);
        } else if (ch == '}' || ch == ']') {
            top--;
        } else if (ch == ',' && top >= 0) {
            if (st[top].obj) {
                st[top].expect_key = true;
            } else {
                st[top].idx++;
            }
        } else if (top >= 0 && !st[top].obj && ch != ' ' && ch != '\t' && ch != '\r' &&
                   ch != ':' && (p == t || (p[-1] == '[' || p[-1] == ',' || p[-1] == ' ' ||
                                            p[-1] == '\n' || p[-1] == '\t'))) {
            char path[256];
            snprintf(path, sizeof path, "%.240s[%d]", st[top].path, st[top].idx);
            index_add(c, path, line);
        }
    }
}

// The line of a path, or of its longest indexed prefix; 0 if unknown.
static int line_of(const pctx *c, const char *path)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    for (;;) {
        for (int i = 0; i < c->nlines; i++) {
            if (strcmp(c->lines[i].path, buf) == 0) {
                return c->lines[i].line;
            }
        }
        char *cut = strrchr(buf, '.');
        char *br  = strrchr(buf, '[');
        if (br != NULL && (cut == NULL || br > cut)) {
            cut = br;
        }
        if (cut == NULL) {
            return 0;
        }
        *cut = '\0';
    }
}

static void index_free(pctx *c)
{
    for (int i = 0; i < c->nlines; i++) {
        free(c->lines[i].path);
    }
    free(c->lines);
}

static ddl_status fail(const pctx *c, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ddl_status fail(const pctx *c, const char *path, const char *fmt, ...)
{
    char    msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line = line_of(c, path);
    if (line > 0) {
        return ddl_set_error(DDL_EINVAL, "%s:%d: %s: %s", c->s->source, line, path, msg);
    }
    return ddl_set_error(DDL_EINVAL, "%s: %s: %s", c->s->source, path, msg);
}

// ---- typed access -------------------------------------------------------------

static void join(char *out, size_t n, const char *base, const char *key)
{
    snprintf(out, n, base[0] ? "%s.%s" : "%s%s", base, key);
}

// Refuses keys of obj not in allowed (NULL-terminated).
static ddl_status check_keys(const pctx *c, json_t *obj, const char *path,
                             const char *const *allowed)
{
    const char *key;
    json_t     *v;
    json_object_foreach(obj, key, v)
    {
        (void)v;
        bool ok = false;
        for (int i = 0; allowed[i] && !ok; i++) {
            ok = strcmp(allowed[i], key) == 0;
        }
        if (!ok) {
            char p[256], list[512] = "";
            join(p, sizeof p, path, key);
            for (int i = 0; allowed[i]; i++) {
                strncat(list, i ? ", " : "", sizeof list - strlen(list) - 1);
                strncat(list, allowed[i], sizeof list - strlen(list) - 1);
            }
            return fail(c, p, "unknown key (allowed here: %s)", list);
        }
    }
    return DDL_OK;
}

static ddl_status get_int(const pctx *c, json_t *obj, const char *path, const char *key,
                          bool required, long long min, long long max, int64_t *out)
{
    char    p[256];
    json_t *v = json_object_get(obj, key);
    join(p, sizeof p, path, key);
    if (v == NULL) {
        return required ? fail(c, p, "missing (required)") : DDL_OK;
    }
    if (!json_is_integer(v)) {
        return fail(c, p, "must be an integer");
    }
    long long x = json_integer_value(v);
    if (x < min || x > max) {
        return fail(c, p, "%lld is outside [%lld, %lld]", x, min, max);
    }
    *out = x;
    return DDL_OK;
}

static ddl_status get_num(const pctx *c, json_t *obj, const char *path, const char *key,
                          bool required, double min, double max, double *out)
{
    char    p[256];
    json_t *v = json_object_get(obj, key);
    join(p, sizeof p, path, key);
    if (v == NULL) {
        return required ? fail(c, p, "missing (required)") : DDL_OK;
    }
    if (!json_is_number(v)) {
        return fail(c, p, "must be a number");
    }
    double x = json_number_value(v);
    if (!(x >= min && x <= max)) {
        return fail(c, p, "%g is outside [%g, %g]", x, min, max);
    }
    *out = x;
    return DDL_OK;
}

static ddl_status get_bool(const pctx *c, json_t *obj, const char *path, const char *key, bool *out)
{
    char    p[256];
    json_t *v = json_object_get(obj, key);
    join(p, sizeof p, path, key);
    if (v == NULL) {
        return DDL_OK;
    }
    if (!json_is_boolean(v)) {
        return fail(c, p, "must be true or false");
    }
    *out = json_is_true(v);
    return DDL_OK;
}

static ddl_status get_str(const pctx *c, json_t *obj, const char *path, const char *key,
                          bool required, const char **out)
{
    char    p[256];
    json_t *v = json_object_get(obj, key);
    join(p, sizeof p, path, key);
    if (v == NULL) {
        return required ? fail(c, p, "missing (required)") : DDL_OK;
    }
    if (!json_is_string(v)) {
        return fail(c, p, "must be a string");
    }
    *out = json_string_value(v);
    return DDL_OK;
}

// An integer array of exactly n entries (n < 0: 1..8 entries, count in *got), each in
// [min, max].
static ddl_status get_ints(const pctx *c, json_t *obj, const char *path, const char *key,
                           bool required, int n, long long min, long long max, int64_t *out,
                           int *got)
{
    char    p[256];
    json_t *v = json_object_get(obj, key);
    join(p, sizeof p, path, key);
    if (v == NULL) {
        return required ? fail(c, p, "missing (required)") : DDL_OK;
    }
    if (!json_is_array(v)) {
        return fail(c, p, "must be an array of integers");
    }
    int len = (int)json_array_size(v);
    if (n >= 0 && len != n) {
        return fail(c, p, "expected %d entries, got %d", n, len);
    }
    if (n < 0 && (len < 1 || len > DDL_MAX_DIMS)) {
        return fail(c, p, "expected 1 to %d entries, got %d", DDL_MAX_DIMS, len);
    }
    for (int i = 0; i < len; i++) {
        json_t *e = json_array_get(v, (size_t)i);
        char    pe[280];
        snprintf(pe, sizeof pe, "%s[%d]", p, i);
        if (!json_is_integer(e)) {
            return fail(c, pe, "must be an integer");
        }
        if (json_integer_value(e) < min || json_integer_value(e) > max) {
            return fail(c, pe, "%lld is outside [%lld, %lld]", (long long)json_integer_value(e),
                        min, max);
        }
        out[i] = json_integer_value(e);
    }
    if (got != NULL) {
        *got = len;
    }
    return DDL_OK;
}

// ---- sections -----------------------------------------------------------------

static int find_partition(const ddl_spec_t *s, const char *name)
{
    for (int i = 0; i < s->nparts; i++) {
        if (strcmp(s->parts[i].name, name) == 0) {
            return i;
        }
    }
    return -1;
}

static ddl_status parse_partitions(pctx *c, json_t *root)
{
    ddl_spec_t *s = c->s;
    json_t     *ps = json_object_get(root, "partitions");
    if (ps == NULL) {
        return fail(c, "partitions", "missing (required)");
    }
    if (!json_is_object(ps) || json_object_size(ps) == 0) {
        return fail(c, "partitions", "must be a non-empty object of named partitions");
    }
    s->parts = ddl_calloc(json_object_size(ps), sizeof *s->parts);
    if (s->parts == NULL) {
        return ddl_set_error(DDL_ENOMEM, "spec: out of memory");
    }
    const char *name;
    json_t     *p;
    json_object_foreach(ps, name, p)
    {
        char path[256];
        snprintf(path, sizeof path, "partitions.%.200s", name);
        if (!json_is_object(p)) {
            return fail(c, path, "must be an object {\"ranks\": [...], \"shape\": [...]}");
        }
        static const char *const keys[] = {"ranks", "shape", NULL};
        DDL_CHECK(check_keys(c, p, path, keys));
        spec_partition *sp = &s->parts[s->nparts];
        snprintf(sp->name, sizeof sp->name, "%s", name);
        json_t *jr = json_object_get(p, "ranks");
        char    pr[280];
        snprintf(pr, sizeof pr, "%s.ranks", path);
        if (!json_is_array(jr) || json_array_size(jr) < 1 || json_array_size(jr) > SPEC_MAX_RANKS) {
            return fail(c, pr, "must be an array of 1 to %d ranks", SPEC_MAX_RANKS);
        }
        sp->nranks = (int)json_array_size(jr);
        sp->ranks  = ddl_malloc(sizeof(int) * (size_t)sp->nranks);
        if (sp->ranks == NULL) {
            return ddl_set_error(DDL_ENOMEM, "spec: out of memory");
        }
        s->nparts++;
        for (int i = 0; i < sp->nranks; i++) {
            json_t *e = json_array_get(jr, (size_t)i);
            char    pe[300];
            snprintf(pe, sizeof pe, "%s[%d]", pr, i);
            if (!json_is_integer(e)) {
                return fail(c, pe, "must be an integer");
            }
            long long r = json_integer_value(e);
            if (r < 0 || r >= s->world_size) {
                return fail(c, pe, "rank %lld is outside the world of %d ranks", r, s->world_size);
            }
            for (int j = 0; j < i; j++) {
                if (sp->ranks[j] == r) {
                    return fail(c, pe, "rank %lld is listed twice", r);
                }
            }
            sp->ranks[i] = (int)r;
        }
        int64_t shape[DDL_MAX_DIMS];
        DDL_CHECK(get_ints(c, p, path, "shape", true, -1, 1, SPEC_MAX_RANKS, shape, &sp->ndim));
        int64_t prod = 1;
        for (int d = 0; d < sp->ndim; d++) {
            sp->shape[d] = (int)shape[d];
            if (__builtin_mul_overflow(prod, shape[d], &prod) || prod > SPEC_MAX_RANKS) {
                prod = -1;  // refused below: more than the ranks any partition may list
                break;
            }
        }
        if (prod != sp->nranks) {
            char ps2[280];
            snprintf(ps2, sizeof ps2, "%s.shape", path);
            if (prod < 0) {
                return fail(c, ps2, "multiplies past %d ranks", SPEC_MAX_RANKS);
            }
            return fail(c, ps2, "multiplies to %lld but %d ranks are listed", (long long)prod,
                        sp->nranks);
        }
    }
    return DDL_OK;
}

// Resolves a partition name given at path.key (or keeps *out when absent and !required).
static ddl_status get_partition(const pctx *c, json_t *obj, const char *path, const char *key,
                                bool required, int *out)
{
    const char *name = NULL;
    DDL_CHECK(get_str(c, obj, path, key, required, &name));
    if (name == NULL) {
        return DDL_OK;
    }
    int i = find_partition(c->s, name);
    if (i < 0) {
        char p[256];
        join(p, sizeof p, path, key);
        return fail(c, p, "no partition named \"%s\" in \"partitions\"", name);
    }
    *out = i;
    return DDL_OK;
}

static ddl_status parse_spatial(const pctx *c, json_t *o, const char *path, const char *key,
                                bool required, int nsp, long long min, int64_t fill, int64_t *out)
{
    for (int i = 0; i < nsp; i++) {
        out[i] = fill;
    }
    // Windows are bounded so their spans cannot overflow; sizes by the tensor cap.
    long long max = strcmp(key, "size") == 0 ? DDL_MAX_TENSOR_ELEMENTS : SPEC_MAX_WINDOW;
    return get_ints(c, o, path, key, required, nsp, min, max, out, NULL);
}

// Refuses a shape past the per-tensor cap (or whose product overflows), naming what it is.
static ddl_status check_size(const pctx *c, const char *path, const char *what,
                             const ddl_shape *shape)
{
    int64_t n;
    if (ddl_shape_numel_checked(shape, &n) != DDL_OK) {
        char sbuf[160];
        return fail(c, path, "%s %s has more than 2^34 elements (the limit per tensor, "
                             "DDL_MAX_TENSOR_ELEMENTS)",
                    what, ddl_shape_str(shape, sbuf, sizeof sbuf));
    }
    return DDL_OK;
}

// Matches "<prefix><1|2|3>d" exactly (conv2d, maxpool3d); returns the digit or 0.
static int spatial_type(const char *type, const char *prefix)
{
    size_t n = strlen(prefix);
    if (strncmp(type, prefix, n) != 0 || strlen(type) != n + 2 || type[n + 1] != 'd') {
        return 0;
    }
    return type[n] >= '1' && type[n] <= '3' ? type[n] - '0' : -1;
}

static char *shape_str(const ddl_shape *s, char *buf, size_t n)
{
    return ddl_shape_str(s, buf, n);
}

// Parses one layer, inferring its output from `cur` (the global shape) and *part (the
// partition the tensor is on); updates both.
static ddl_status parse_layer(pctx *c, json_t *o, int li, ddl_shape *cur, int *part, int *nparam)
{
    ddl_spec_t *s = c->s;
    spec_layer *L = &s->layers[li];
    char        path[64], sbuf[128];
    snprintf(path, sizeof path, "layers[%d]", li);
    if (!json_is_object(o)) {
        return fail(c, path, "must be an object with a \"type\"");
    }
    const char *type = NULL;
    DDL_CHECK(get_str(c, o, path, "type", true, &type));
    L->P_in = *part;
    L->P_out = *part;
    L->P_w = -1;
    L->P_y_given = -1;
    L->x_global  = *cur;
    L->y_global  = *cur;
    int given_px = -1;
    DDL_CHECK(get_partition(c, o, path, "P_x", false, &given_px));
    if (given_px >= 0 && given_px != *part) {
        char p[96];
        snprintf(p, sizeof p, "%s.P_x", path);
        return fail(c, p, "the tensor is on partition \"%s\" here; insert a repartition to \"%s\"",
                    s->parts[*part].name, s->parts[given_px].name);
    }
    const char *name = NULL;
    DDL_CHECK(get_str(c, o, path, "name", false, &name));
    if (name != NULL) {
        // Names become parameter names, checkpoint entries and export file names: refuse
        // here what would otherwise fail only at the first checkpoint or export.
        char   p[96];
        size_t n  = strlen(name);
        bool   ok = n > 0 && n < SPEC_NAME && strcmp(name, ".") != 0 && strcmp(name, "..") != 0;
        for (size_t i = 0; i < n && ok; i++) {
            ok = name[i] != '/' && name[i] != '\\' && (unsigned char)name[i] >= 0x20 &&
                 name[i] != 0x7f;
        }
        snprintf(p, sizeof p, "%s.name", path);
        if (!ok) {
            return fail(c, p, "\"%.80s\" is not a valid layer name (1 to %d characters, no '/', "
                              "'\\' or control characters, not \".\" or \"..\")",
                        name, SPEC_NAME - 1);
        }
    }
    // Types match exactly ("maxpool2d}" is not maxpool2d).
    int  nsp     = 0;
    bool is_conv = false;
    static const char *const spatial[] = {"conv", "maxpool", "avgpool"};
    for (int k = 0; k < 3 && nsp == 0; k++) {
        nsp     = spatial_type(type, spatial[k]);
        is_conv = k == 0;
    }
    if (nsp < 0) {
        return fail(c, path, "type \"%s\": only 1, 2 and 3 spatial dimensions exist", type);
    }
    if (strcmp(type, "repartition") == 0 || strcmp(type, "flatten") == 0) {
        static const char *const keys[] = {"type", "name", "P_x", "to", NULL};
        DDL_CHECK(check_keys(c, o, path, keys));
        int to = -1;
        DDL_CHECK(get_partition(c, o, path, "to", true, &to));
        L->type = type[0] == 'r' ? SL_REPARTITION : SL_FLATTEN;
        if (L->type == SL_FLATTEN) {
            if (cur->ndim < 3) {
                return fail(c, path, "flatten needs [N, C, spatial...], the tensor here is %s",
                            shape_str(cur, sbuf, sizeof sbuf));
            }
            int64_t f = 1;  // <= numel(cur), already within the tensor cap
            for (int d = 1; d < cur->ndim; d++) {
                f *= cur->d[d];
            }
            L->y_global = ddl_shape_make(2, (int64_t[]){cur->d[0], f});
            // Flatten is local: the input may split only batch and channels, and the output
            // partition must be the same ranks as [P_n, P_c].
            const spec_partition *pi = &s->parts[*part], *po = &s->parts[to];
            bool ok = pi->ndim == cur->ndim && po->ndim == 2 && pi->nranks == po->nranks &&
                      pi->shape[0] == po->shape[0] && pi->shape[1] == po->shape[1];
            for (int d = 2; ok && d < pi->ndim; d++) {
                ok = pi->shape[d] == 1;
            }
            for (int r = 0; ok && r < pi->nranks; r++) {
                ok = pi->ranks[r] == po->ranks[r];
            }
            if (!ok) {
                return fail(c, path, "flatten is local: the tensor's partition \"%s\" must split "
                                     "only batch and channels, over the same ranks as \"%s\" "
                                     "[P_n, P_c]; insert a repartition first",
                            pi->name, po->name);
            }
        }
        if (s->parts[to].ndim != L->y_global.ndim) {
            char p[96];
            snprintf(p, sizeof p, "%s.to", path);
            return fail(c, p, "partition \"%s\" has %d dims, the tensor %s has %d", s->parts[to].name,
                        s->parts[to].ndim, shape_str(&L->y_global, sbuf, sizeof sbuf),
                        L->y_global.ndim);
        }
        L->P_out = to;
    } else if (nsp > 0 && is_conv) {
        static const char *const keys[] = {"type", "name", "P_x", "P_y", "P_w", "in_channels",
                                           "out_channels", "kernel", "stride", "padding",
                                           "dilation", "bias", NULL};
        DDL_CHECK(check_keys(c, o, path, keys));
        L->type = SL_CONV;
        if (cur->ndim != nsp + 2) {
            return fail(c, path, "%s needs a tensor [N, C, %d spatial], the tensor here is %s", type,
                        nsp, shape_str(cur, sbuf, sizeof sbuf));
        }
        ddl_conv_params *cp = &L->conv;
        cp->nsp             = nsp;
        cp->in_channels     = cur->d[1];
        cp->bias            = true;
        int64_t inc         = cur->d[1];
        DDL_CHECK(get_int(c, o, path, "in_channels", false, 1, 1LL << 30, &inc));
        if (inc != cur->d[1]) {
            char p[96];
            snprintf(p, sizeof p, "%s.in_channels", path);
            return fail(c, p, "%lld does not match the %lld channels of the tensor %s",
                        (long long)inc, (long long)cur->d[1], shape_str(cur, sbuf, sizeof sbuf));
        }
        DDL_CHECK(get_int(c, o, path, "out_channels", true, 1, 1LL << 30, &cp->out_channels));
        DDL_CHECK(parse_spatial(c, o, path, "kernel", true, nsp, 1, 1, cp->kernel));
        DDL_CHECK(parse_spatial(c, o, path, "stride", false, nsp, 1, 1, cp->stride));
        DDL_CHECK(parse_spatial(c, o, path, "padding", false, nsp, 0, 0, cp->padding));
        DDL_CHECK(parse_spatial(c, o, path, "dilation", false, nsp, 1, 1, cp->dilation));
        DDL_CHECK(get_bool(c, o, path, "bias", &cp->bias));
        ddl_shape wshape = {.ndim = 2 + nsp, .d = {cp->out_channels, inc}};
        for (int d = 0; d < nsp; d++) {
            wshape.d[2 + d] = cp->kernel[d];
        }
        DDL_CHECK(check_size(c, path, "the weight", &wshape));
        DDL_CHECK(get_partition(c, o, path, "P_y", false, &L->P_y_given));
        DDL_CHECK(get_partition(c, o, path, "P_w", false, &L->P_w));
        if ((L->P_y_given < 0) != (L->P_w < 0)) {
            return fail(c, path, "give both P_y and P_w (channel or general conv) or neither "
                                 "(feature conv)");
        }
        L->y_global      = *cur;
        L->y_global.d[1] = cp->out_channels;
        for (int d = 0; d < nsp; d++) {
            int64_t span = cur->d[2 + d] + 2 * cp->padding[d] - cp->dilation[d] * (cp->kernel[d] - 1) - 1;
            if (span < 0) {
                return fail(c, path, "the window (kernel %lld, dilation %lld) is larger than the "
                                     "padded input length %lld in spatial dim %d",
                            (long long)cp->kernel[d], (long long)cp->dilation[d],
                            (long long)(cur->d[2 + d] + 2 * cp->padding[d]), d);
            }
            L->y_global.d[2 + d] = span / cp->stride[d] + 1;
        }
        if (L->P_y_given >= 0) {
            L->P_out = L->P_y_given;
        }
        L->has_params = true;
    } else if (nsp > 0) {
        static const char *const keys[] = {"type", "name", "P_x", "kernel", "stride", "padding",
                                           "dilation", NULL};
        DDL_CHECK(check_keys(c, o, path, keys));
        L->type         = SL_POOL;
        ddl_pool_params *pp = &L->pool;
        pp->nsp         = nsp;
        pp->kind        = type[0] == 'm' ? DDL_POOL_MAX : DDL_POOL_AVG;
        if (cur->ndim != nsp + 2) {
            return fail(c, path, "%s needs a tensor [N, C, %d spatial], the tensor here is %s", type,
                        nsp, shape_str(cur, sbuf, sizeof sbuf));
        }
        DDL_CHECK(parse_spatial(c, o, path, "kernel", true, nsp, 1, 1, pp->kernel));
        DDL_CHECK(parse_spatial(c, o, path, "stride", false, nsp, 1, 0, pp->stride));
        DDL_CHECK(parse_spatial(c, o, path, "padding", false, nsp, 0, 0, pp->padding));
        DDL_CHECK(parse_spatial(c, o, path, "dilation", false, nsp, 1, 1, pp->dilation));
        L->y_global = *cur;
        for (int d = 0; d < nsp; d++) {
            int64_t st   = pp->stride[d] ? pp->stride[d] : pp->kernel[d];
            int64_t span = cur->d[2 + d] + 2 * pp->padding[d] - pp->dilation[d] * (pp->kernel[d] - 1) - 1;
            if (span < 0) {
                return fail(c, path, "the window is larger than the padded input in spatial dim %d",
                            d);
            }
            L->y_global.d[2 + d] = span / st + 1;
        }
    } else if (strcmp(type, "linear") == 0) {
        static const char *const keys[] = {"type", "name", "P_x", "P_y", "P_w", "in_features",
                                           "out_features", "bias", NULL};
        DDL_CHECK(check_keys(c, o, path, keys));
        L->type = SL_LINEAR;
        if (cur->ndim != 2) {
            return fail(c, path, "linear needs a tensor [batch, features], the tensor here is %s "
                                 "(flatten it first)",
                        shape_str(cur, sbuf, sizeof sbuf));
        }
        int64_t inf = cur->d[1];
        DDL_CHECK(get_int(c, o, path, "in_features", false, 1, DDL_MAX_TENSOR_ELEMENTS, &inf));
        if (inf != cur->d[1]) {
            char p[96];
            snprintf(p, sizeof p, "%s.in_features", path);
            return fail(c, p, "%lld does not match the %lld features of the tensor %s",
                        (long long)inf, (long long)cur->d[1], shape_str(cur, sbuf, sizeof sbuf));
        }
        DDL_CHECK(get_int(c, o, path, "out_features", true, 1, DDL_MAX_TENSOR_ELEMENTS,
                          &L->out_features));
        DDL_CHECK(check_size(c, path, "the weight",
                             &(ddl_shape){.ndim = 2, .d = {L->out_features, cur->d[1]}}));
        L->bias = true;
        DDL_CHECK(get_bool(c, o, path, "bias", &L->bias));
        DDL_CHECK(get_partition(c, o, path, "P_y", true, &L->P_out));
        DDL_CHECK(get_partition(c, o, path, "P_w", true, &L->P_w));
        L->y_global   = ddl_shape_make(2, (int64_t[]){cur->d[0], L->out_features});
        L->has_params = true;
    } else if (strcmp(type, "relu") == 0 || strcmp(type, "leaky_relu") == 0 ||
               strcmp(type, "sigmoid") == 0 || strcmp(type, "tanh") == 0 ||
               strcmp(type, "gelu") == 0 || strcmp(type, "dropout") == 0) {
        static const char *const keys[] = {"type", "name", "P_x", "negative_slope", "p", NULL};
        DDL_CHECK(check_keys(c, o, path, keys));
        L->type = SL_ACTIVATION;
        static const struct {
            const char  *n;
            ddl_act_kind k;
        } acts[] = {{"relu", DDL_ACT_RELU},       {"leaky_relu", DDL_ACT_LEAKY_RELU},
                    {"sigmoid", DDL_ACT_SIGMOID}, {"tanh", DDL_ACT_TANH},
                    {"gelu", DDL_ACT_GELU},       {"dropout", DDL_ACT_DROPOUT}};
        for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++) {
            if (strcmp(type, acts[i].n) == 0) {
                L->act = acts[i].k;
            }
        }
        L->alpha = L->act == DDL_ACT_LEAKY_RELU ? 0.01 : 0.5;
        DDL_CHECK(get_num(c, o, path, L->act == DDL_ACT_DROPOUT ? "p" : "negative_slope", false,
                          L->act == DDL_ACT_DROPOUT ? 0.0 : -1e9,
                          L->act == DDL_ACT_DROPOUT ? 0.999999 : 1e9, &L->alpha));
        if (L->act != DDL_ACT_DROPOUT && json_object_get(o, "p") != NULL) {
            char p[96];
            snprintf(p, sizeof p, "%s.p", path);
            return fail(c, p, "only dropout takes \"p\"");
        }
        if (L->act != DDL_ACT_LEAKY_RELU && json_object_get(o, "negative_slope") != NULL) {
            char p[96];
            snprintf(p, sizeof p, "%s.negative_slope", path);
            return fail(c, p, "only leaky_relu takes \"negative_slope\"");
        }
    } else if (strcmp(type, "batchnorm") == 0) {
        static const char *const keys[] = {"type", "name", "P_x", "eps", "momentum", "affine", NULL};
        DDL_CHECK(check_keys(c, o, path, keys));
        L->type = SL_BATCHNORM;
        L->eps = 1e-5, L->momentum = 0.1, L->affine = true;
        DDL_CHECK(get_num(c, o, path, "eps", false, 1e-300, 1.0, &L->eps));
        if (json_is_null(json_object_get(o, "momentum"))) {
            L->momentum = -1.0;
        } else {
            DDL_CHECK(get_num(c, o, path, "momentum", false, 0.0, 1.0, &L->momentum));
        }
        DDL_CHECK(get_bool(c, o, path, "affine", &L->affine));
        if (cur->ndim < 2) {
            return fail(c, path, "batchnorm needs [N, C, ...]");
        }
        L->has_params = L->affine;
    } else if (strcmp(type, "upsample") == 0) {
        static const char *const keys[] = {"type", "name", "P_x", "mode", "align_corners",
                                           "scale_factor", "size", NULL};
        DDL_CHECK(check_keys(c, o, path, keys));
        L->type         = SL_UPSAMPLE;
        const char *mode = "nearest";
        DDL_CHECK(get_str(c, o, path, "mode", false, &mode));
        if (strcmp(mode, "nearest") != 0 && strcmp(mode, "linear") != 0) {
            char p[96];
            snprintf(p, sizeof p, "%s.mode", path);
            return fail(c, p, "\"%s\" is not nearest or linear", mode);
        }
        L->mode = mode[0] == 'n' ? DDL_UPSAMPLE_NEAREST : DDL_UPSAMPLE_LINEAR;
        DDL_CHECK(get_bool(c, o, path, "align_corners", &L->align_corners));
        int ns = cur->ndim - 2;
        if (ns < 1 || ns > 3) {
            return fail(c, path, "upsample needs [N, C, 1 to 3 spatial dims]");
        }
        json_t *sf = json_object_get(o, "scale_factor");
        if ((sf == NULL) == (json_object_get(o, "size") == NULL)) {
            return fail(c, path, "give exactly one of \"scale_factor\" and \"size\"");
        }
        L->y_global = *cur;
        if (sf != NULL) {
            L->has_scale = true;
            for (int d = 0; d < ns; d++) {
                json_t *e = json_is_array(sf) ? json_array_get(sf, (size_t)d) : sf;
                if (!json_is_number(e) || !(json_number_value(e) > 0) ||
                    (json_is_array(sf) && json_array_size(sf) != (size_t)ns)) {
                    char p[96];
                    snprintf(p, sizeof p, "%s.scale_factor", path);
                    return fail(c, p, "must be a positive number or %d of them", ns);
                }
                if (json_number_value(e) > SPEC_MAX_SCALE) {
                    char p[96];
                    snprintf(p, sizeof p, "%s.scale_factor", path);
                    return fail(c, p, "%g is outside (0, %g]", json_number_value(e),
                                SPEC_MAX_SCALE);
                }
                L->scale[d]          = json_number_value(e);
                L->y_global.d[2 + d] = (int64_t)floor((double)cur->d[2 + d] * L->scale[d]);
            }
        } else {
            DDL_CHECK(parse_spatial(c, o, path, "size", true, ns, 1, 1, L->size));
            for (int d = 0; d < ns; d++) {
                L->y_global.d[2 + d] = L->size[d];
            }
        }
    } else {
        char p[96];
        snprintf(p, sizeof p, "%s.type", path);
        return fail(c, p,
                    "unknown layer type \"%s\" (known: repartition, flatten, conv1d|2d|3d, "
                    "maxpool1d|2d|3d, avgpool1d|2d|3d, linear, relu, leaky_relu, sigmoid, tanh, "
                    "gelu, dropout, batchnorm, upsample)",
                    type);
    }
    if (s->parts[L->P_out].ndim != L->y_global.ndim) {
        return fail(c, path, "the output %s has %d dims but its partition \"%s\" has %d",
                    shape_str(&L->y_global, sbuf, sizeof sbuf), L->y_global.ndim,
                    s->parts[L->P_out].name, s->parts[L->P_out].ndim);
    }
    for (int d = 0; d < L->y_global.ndim; d++) {
        if (L->y_global.d[d] < 1) {
            return fail(c, path, "the output %s is empty", shape_str(&L->y_global, sbuf, sizeof sbuf));
        }
    }
    DDL_CHECK(check_size(c, path, "the output", &L->y_global));
    if (L->has_params) {
        L->param_index = (*nparam)++;
    }
    static const char *const tname[] = {"repartition", "flatten", "conv", "pool",
                                        "linear", "activation", "batchnorm", "upsample"};
    if (name != NULL) {
        snprintf(L->name, sizeof L->name, "%s", name);
    } else if (L->has_params) {
        snprintf(L->name, sizeof L->name, "%s%d", L->type == SL_CONV ? "conv" : tname[L->type],
                 L->param_index);
    } else {
        snprintf(L->name, sizeof L->name, "%s_at_%d", tname[L->type], li);
    }
    *cur  = L->y_global;
    *part = L->P_out;
    return DDL_OK;
}

static ddl_status parse_optimizer(pctx *c, json_t *root)
{
    ddl_spec_t *s = c->s;
    json_t     *o = json_object_get(root, "optimizer");
    if (o == NULL) {
        s->optim = ddl_optim_params_default(DDL_OPTIM_ADAM);
        return DDL_OK;
    }
    if (!json_is_object(o)) {
        return fail(c, "optimizer", "must be an object with a \"type\"");
    }
    static const char *const keys[] = {"type", "lr", "momentum", "dampening", "nesterov",
                                       "weight_decay", "betas", "eps", "schedule", NULL};
    DDL_CHECK(check_keys(c, o, "optimizer", keys));
    const char *type = NULL;
    DDL_CHECK(get_str(c, o, "optimizer", "type", true, &type));
    ddl_optim_kind k;
    if (strcmp(type, "sgd") == 0) {
        k = DDL_OPTIM_SGD;
    } else if (strcmp(type, "adam") == 0) {
        k = DDL_OPTIM_ADAM;
    } else if (strcmp(type, "adamw") == 0) {
        k = DDL_OPTIM_ADAMW;
    } else {
        return fail(c, "optimizer.type", "\"%s\" is not one of sgd, adam, adamw", type);
    }
    ddl_optim_params *p = &s->optim;
    *p                  = ddl_optim_params_default(k);
    DDL_CHECK(get_num(c, o, "optimizer", "lr", false, 0.0, 1e6, &p->lr));
    DDL_CHECK(get_num(c, o, "optimizer", "weight_decay", false, 0.0, 1e6, &p->weight_decay));
    if (k == DDL_OPTIM_SGD) {
        DDL_CHECK(get_num(c, o, "optimizer", "momentum", false, 0.0, 1.0, &p->momentum));
        DDL_CHECK(get_num(c, o, "optimizer", "dampening", false, 0.0, 1.0, &p->dampening));
        DDL_CHECK(get_bool(c, o, "optimizer", "nesterov", &p->nesterov));
        if (json_object_get(o, "betas") || json_object_get(o, "eps")) {
            return fail(c, "optimizer", "sgd takes no \"betas\" or \"eps\"");
        }
    } else {
        json_t *b = json_object_get(o, "betas");
        if (b != NULL) {
            if (!json_is_array(b) || json_array_size(b) != 2 || !json_is_number(json_array_get(b, 0)) ||
                !json_is_number(json_array_get(b, 1))) {
                return fail(c, "optimizer.betas", "must be two numbers [beta1, beta2]");
            }
            p->beta1 = json_number_value(json_array_get(b, 0));
            p->beta2 = json_number_value(json_array_get(b, 1));
            if (!(p->beta1 >= 0 && p->beta1 < 1 && p->beta2 >= 0 && p->beta2 < 1)) {
                return fail(c, "optimizer.betas", "each must be in [0, 1)");
            }
        }
        DDL_CHECK(get_num(c, o, "optimizer", "eps", false, 1e-300, 1.0, &p->eps));
        if (json_object_get(o, "momentum") || json_object_get(o, "nesterov") ||
            json_object_get(o, "dampening")) {
            return fail(c, "optimizer", "%s takes no momentum, dampening or nesterov", type);
        }
    }
    if (p->nesterov && !(p->momentum > 0 && p->dampening == 0)) {
        return fail(c, "optimizer.nesterov", "needs momentum > 0 and dampening 0");
    }
    json_t *sc = json_object_get(o, "schedule");
    if (sc != NULL) {
        if (!json_is_object(sc)) {
            return fail(c, "optimizer.schedule", "must be an object with a \"type\"");
        }
        static const char *const sk[] = {"type", "step_size", "gamma", "t_max", "eta_min", NULL};
        DDL_CHECK(check_keys(c, sc, "optimizer.schedule", sk));
        const char *st = NULL;
        DDL_CHECK(get_str(c, sc, "optimizer.schedule", "type", true, &st));
        if (strcmp(st, "constant") == 0) {
            p->sched = DDL_SCHED_CONSTANT;
        } else if (strcmp(st, "step") == 0) {
            p->sched = DDL_SCHED_STEP;
            DDL_CHECK(get_int(c, sc, "optimizer.schedule", "step_size", true, 1, 1LL << 40, &p->step_size));
            DDL_CHECK(get_num(c, sc, "optimizer.schedule", "gamma", false, 1e-300, 1e6, &p->gamma));
        } else if (strcmp(st, "cosine") == 0) {
            p->sched = DDL_SCHED_COSINE;
            DDL_CHECK(get_int(c, sc, "optimizer.schedule", "t_max", true, 1, 1LL << 40, &p->t_max));
            DDL_CHECK(get_num(c, sc, "optimizer.schedule", "eta_min", false, 0.0, p->lr, &p->eta_min));
        } else {
            return fail(c, "optimizer.schedule.type", "\"%s\" is not one of constant, step, cosine",
                        st);
        }
    }
    return DDL_OK;
}

// data.synthetic: {"kind": "shapes3d", "train": n, "test": n, "noise": s, "seed": k},
// generated volumes [1, D, H, W] sized by the input shape, one label per voxel, for a
// model whose output `out` is [batch, classes >= 3, D, H, W].
static ddl_status parse_synthetic(pctx *c, json_t *da, const ddl_shape *out)
{
    ddl_spec_t *s  = c->s;
    json_t     *sy = json_object_get(da, "synthetic");
    if (sy == NULL) {
        return DDL_OK;
    }
    if (!json_is_object(sy)) {
        return fail(c, "data.synthetic", "must be an object {\"kind\": \"shapes3d\", "
                                         "\"train\": n, \"test\": n, \"noise\": s}");
    }
    static const char *const sk[] = {"kind", "train", "test", "noise", "seed", NULL};
    DDL_CHECK(check_keys(c, sy, "data.synthetic", sk));
    const char *kind = NULL;
    DDL_CHECK(get_str(c, sy, "data.synthetic", "kind", true, &kind));
    if (strcmp(kind, "shapes3d") != 0) {
        return fail(c, "data.synthetic.kind", "\"%s\" is not a known kind (shapes3d)", kind);
    }
    int64_t seed = (int64_t)(s->seed & ((1ull << 62) - 1));
    s->synth_n[1] = 64;
    s->synth.noise = 0.3;
    DDL_CHECK(get_int(c, sy, "data.synthetic", "train", true, 1, (1LL << 31), &s->synth_n[0]));
    DDL_CHECK(get_int(c, sy, "data.synthetic", "test", false, 0, (1LL << 31), &s->synth_n[1]));
    DDL_CHECK(get_num(c, sy, "data.synthetic", "noise", false, 0.0, 100.0, &s->synth.noise));
    DDL_CHECK(get_int(c, sy, "data.synthetic", "seed", false, 0, (1LL << 62), &seed));
    char ib[128], ob[128];
    shape_str(&s->input, ib, sizeof ib);
    shape_str(out, ob, sizeof ob);
    if (s->input.ndim != 4 || s->input.d[0] != 1) {
        return fail(c, "data.synthetic", "shapes3d makes single-channel volumes, so the input "
                                         "shape must be [1, D, H, W]; it is %s",
                    ib);
    }
    bool fits = out->ndim == 5 && out->d[1] >= DDL_SYNTH_CLASSES;
    for (int d = 0; fits && d < 3; d++) {
        fits = out->d[2 + d] == s->input.d[1 + d];
    }
    if (!fits) {
        return fail(c, "data.synthetic", "shapes3d labels every voxel of the input volume %s "
                                         "with one of %d classes, so the last layer's output "
                                         "must be [batch, >= %d classes, %lld, %lld, %lld]; it "
                                         "is %s",
                    ib, DDL_SYNTH_CLASSES, DDL_SYNTH_CLASSES, (long long)s->input.d[1],
                    (long long)s->input.d[2], (long long)s->input.d[3], ob);
    }
    if (s->synth_n[0] < s->batch) {
        return fail(c, "data.synthetic.train", "%lld samples are fewer than one batch (%lld)",
                    (long long)s->synth_n[0], (long long)s->batch);
    }
    s->synth.kind = DDL_SYNTH_SHAPES3D;
    s->synth.seed = (uint64_t)seed;
    for (int d = 0; d < 3; d++) {
        s->synth.dims[d] = s->input.d[1 + d];
    }
    s->has_synth = true;
    return ddl_synth_validate(&s->synth) == DDL_OK
               ? DDL_OK
               : fail(c, "data.synthetic", "%s", ddl_last_error());
}

static ddl_status parse_root(pctx *c, json_t *root)
{
    ddl_spec_t *s = c->s;
    if (!json_is_object(root)) {
        return fail(c, "(top level)", "the spec must be a JSON object");
    }
    static const char *const keys[] = {"name",  "world_size", "seed", "dtype", "batch_size",
                                       "input", "partitions", "layers", "loss", "optimizer",
                                       "data",  NULL};
    DDL_CHECK(check_keys(c, root, "", keys));
    int64_t v = 0;
    DDL_CHECK(get_int(c, root, "", "world_size", true, 1, SPEC_MAX_RANKS, &v));
    if (s->world_size > 0 && v != s->world_size) {
        return fail(c, "world_size", "the spec is for %lld ranks but the job has %d (run with "
                                     "mpirun -np %lld)",
                    (long long)v, s->world_size, (long long)v);
    }
    s->world_size = (int)v;
    v             = 0;
    DDL_CHECK(get_int(c, root, "", "seed", false, 0, (1LL << 62), &v));
    s->seed          = (uint64_t)v;
    const char *dt   = "f32";
    DDL_CHECK(get_str(c, root, "", "dtype", false, &dt));
    if (strcmp(dt, "f32") == 0) {
        s->dt = DDL_F32;
    } else if (strcmp(dt, "f64") == 0) {
        s->dt = DDL_F64;
    } else {
        return fail(c, "dtype", "\"%s\" is not f32 or f64", dt);
    }
    s->batch = 64;
    DDL_CHECK(get_int(c, root, "", "batch_size", false, 1, 1 << 20, &s->batch));
    DDL_CHECK(parse_partitions(c, root));
    // input
    json_t *in = json_object_get(root, "input");
    if (in == NULL || !json_is_object(in)) {
        return fail(c, "input", "missing or not an object {\"shape\": [...], \"partition\": ...}");
    }
    static const char *const ik[] = {"shape", "partition", NULL};
    DDL_CHECK(check_keys(c, in, "input", ik));
    int64_t is[DDL_MAX_DIMS];
    int     nd = 0;
    DDL_CHECK(get_ints(c, in, "input", "shape", true, -1, 1, DDL_MAX_TENSOR_ELEMENTS, is, &nd));
    if (nd >= DDL_MAX_DIMS) {
        return fail(c, "input.shape", "at most %d dims per sample", DDL_MAX_DIMS - 1);
    }
    s->input = ddl_shape_make(nd, is);
    DDL_CHECK(get_partition(c, in, "input", "partition", true, &s->input_partition));
    if (s->parts[s->input_partition].ndim != nd + 1) {
        return fail(c, "input.partition", "partition \"%s\" has %d dims; the batched input "
                                          "[batch, %d sample dims] has %d",
                    s->parts[s->input_partition].name, s->parts[s->input_partition].ndim, nd, nd + 1);
    }
    // layers
    json_t *ls = json_object_get(root, "layers");
    if (ls == NULL || !json_is_array(ls) || json_array_size(ls) == 0) {
        return fail(c, "layers", "missing or not a non-empty array of layers");
    }
    if (json_array_size(ls) > DDL_MAX_LAYERS) {
        return fail(c, "layers", "%zu layers; a spec may have at most %d (DDL_MAX_LAYERS)",
                    json_array_size(ls), DDL_MAX_LAYERS);
    }
    s->nlayers = (int)json_array_size(ls);
    s->layers  = ddl_calloc((size_t)s->nlayers, sizeof *s->layers);
    if (s->layers == NULL) {
        return ddl_set_error(DDL_ENOMEM, "spec: out of memory");
    }
    ddl_shape cur = {.ndim = nd + 1};
    cur.d[0]      = s->batch;
    for (int d = 0; d < nd; d++) {
        cur.d[1 + d] = is[d];
    }
    DDL_CHECK(check_size(c, "input.shape", "the batched input", &cur));
    int part = s->input_partition, nparam = 0;
    for (int i = 0; i < s->nlayers; i++) {
        DDL_CHECK(parse_layer(c, json_array_get(ls, (size_t)i), i, &cur, &part, &nparam));
        for (int j = 0; j < i; j++) {
            if (strcmp(s->layers[j].name, s->layers[i].name) == 0) {
                char p[64];
                snprintf(p, sizeof p, "layers[%d].name", i);
                return fail(c, p, "\"%s\" is also the name of layers[%d]; layer names must be "
                                  "unique (they name parameters and checkpoint entries)",
                            s->layers[i].name, j);
            }
        }
    }
    // loss
    json_t *lo = json_object_get(root, "loss");
    if (lo == NULL || !json_is_object(lo)) {
        return fail(c, "loss", "missing or not an object {\"type\": \"cross_entropy\", ...}");
    }
    static const char *const lk[] = {"type", "reduction", NULL};
    DDL_CHECK(check_keys(c, lo, "loss", lk));
    const char *lt = NULL, *red = "mean";
    DDL_CHECK(get_str(c, lo, "loss", "type", true, &lt));
    if (strcmp(lt, "cross_entropy") != 0) {
        return fail(c, "loss.type", "\"%s\": models train classifiers on labelled data, so the "
                                    "loss must be cross_entropy",
                    lt);
    }
    DDL_CHECK(get_str(c, lo, "loss", "reduction", false, &red));
    if (strcmp(red, "mean") == 0) {
        s->reduction = DDL_REDUCTION_MEAN;
    } else if (strcmp(red, "sum") == 0) {
        s->reduction = DDL_REDUCTION_SUM;
    } else {
        return fail(c, "loss.reduction", "\"%s\" is not mean or sum", red);
    }
    if (cur.ndim < 2) {
        char sbuf[128];
        return fail(c, "loss", "cross_entropy needs the last layer's output to be [batch, "
                               "classes] or [batch, classes, spatial...], it is %s",
                    shape_str(&cur, sbuf, sizeof sbuf));
    }
    if (cur.ndim > 2 && s->parts[part].shape[1] != 1) {
        // Segmentation: the log-softmax of a voxel needs all of its classes on one rank.
        char sbuf[128];
        return fail(c, "loss", "cross_entropy on the segmentation output %s needs every class "
                               "on each rank, but its partition \"%s\" splits dimension 1 "
                               "(classes) over %d ranks; split the batch or spatial dims",
                    shape_str(&cur, sbuf, sizeof sbuf), s->parts[part].name,
                    s->parts[part].shape[1]);
    }
    if (cur.d[1] > INT32_MAX) {
        char sbuf[128];
        return fail(c, "loss", "%lld classes (the output %s); at most %d are supported",
                    (long long)cur.d[1], shape_str(&cur, sbuf, sizeof sbuf), INT32_MAX);
    }
    s->num_classes = (int)cur.d[1];
    s->output      = (ddl_shape){.ndim = cur.ndim - 1};
    s->label_elems = 1;
    for (int d = 1; d < cur.ndim; d++) {
        s->output.d[d - 1] = cur.d[d];
        s->label_elems *= d >= 2 ? cur.d[d] : 1;
    }
    DDL_CHECK(parse_optimizer(c, root));
    // data
    s->mean = 0.0, s->std = 1.0, s->shuffle = true;
    json_t *da = json_object_get(root, "data");
    if (da != NULL) {
        if (!json_is_object(da)) {
            return fail(c, "data", "must be an object");
        }
        static const char *const dk[] = {"normalize", "shuffle", "synthetic", NULL};
        DDL_CHECK(check_keys(c, da, "data", dk));
        DDL_CHECK(parse_synthetic(c, da, &cur));
        DDL_CHECK(get_bool(c, da, "data", "shuffle", &s->shuffle));
        json_t *no = json_object_get(da, "normalize");
        if (no != NULL) {
            if (!json_is_object(no)) {
                return fail(c, "data.normalize", "must be {\"mean\": m, \"std\": s}");
            }
            static const char *const nk[] = {"mean", "std", NULL};
            DDL_CHECK(check_keys(c, no, "data.normalize", nk));
            DDL_CHECK(get_num(c, no, "data.normalize", "mean", true, -1e9, 1e9, &s->mean));
            DDL_CHECK(get_num(c, no, "data.normalize", "std", true, 1e-12, 1e9, &s->std));
        }
    }
    return DDL_OK;
}

ddl_status ddl_spec_parse(const char *text, const char *source, int world_size, ddl_spec_t **out)
{
    DDL_REQUIRE(text != NULL, DDL_EINVAL, "spec: no text");
    ddl_spec_t *s = ddl_calloc(1, sizeof *s);
    if (s == NULL) {
        return ddl_set_error(DDL_ENOMEM, "spec: out of memory");
    }
    snprintf(s->source, sizeof s->source, "%s", source ? source : "spec");
    s->world_size = world_size;
    size_t len    = strlen(text);
    s->text       = ddl_malloc(len + 1);
    if (s->text == NULL) {
        ddl_free(s);
        return ddl_set_error(DDL_ENOMEM, "spec: out of memory");
    }
    memcpy(s->text, text, len + 1);
    json_error_t je;
    json_t      *root = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    ddl_status   st;
    if (root == NULL) {
        st = ddl_set_error(DDL_EINVAL, "%s:%d:%d: %s", s->source, je.line, je.column, je.text);
    } else {
        pctx c = {.s = s};
        index_build(&c, text);
        st = parse_root(&c, root);
        index_free(&c);
        json_decref(root);
    }
    if (st != DDL_OK) {
        ddl_spec_destroy(&s);
        return st;
    }
    *out = s;
    return DDL_OK;
}

ddl_status ddl_spec_load(const char *path, int world_size, ddl_spec_t **out)
{
    DDL_REQUIRE(path != NULL, DDL_EINVAL, "spec: NULL path");
    // O_NONBLOCK: opening a FIFO (or a device) must not block; only regular files are read.
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    DDL_REQUIRE(fd >= 0, DDL_EIO, "spec: cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return ddl_set_error(DDL_EINVAL, "spec: %s is not a regular file", path);
    }
    FILE *f = fdopen(fd, "rb");
    if (f == NULL) {
        close(fd);
        return ddl_set_error(DDL_EIO, "spec: cannot open %s: %s", path, strerror(errno));
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (n < 0 || n > (16L << 20)) {
        fclose(f);
        return ddl_set_error(DDL_EINVAL, "spec: %s is not a readable file under 16 MiB", path);
    }
    char *buf = malloc((size_t)n + 1);
    if (buf == NULL || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        fclose(f);
        return ddl_set_error(DDL_EIO, "spec: cannot read %s", path);
    }
    fclose(f);
    buf[n]        = '\0';
    const char *b = strrchr(path, '/');
    ddl_status  st = ddl_spec_parse(buf, b ? b + 1 : path, world_size, out);
    free(buf);
    return st;
}

void ddl_spec_destroy(ddl_spec_t **s)
{
    if (s == NULL || *s == NULL) {
        return;
    }
    for (int i = 0; i < (*s)->nparts; i++) {
        ddl_free((*s)->parts[i].ranks);
    }
    ddl_free((*s)->parts);
    ddl_free((*s)->layers);
    ddl_free((*s)->text);
    ddl_free(*s);
    *s = NULL;
}

const char *ddl_spec_text(const ddl_spec_t *s)
{
    return s->text;
}
int ddl_spec_world_size(const ddl_spec_t *s)
{
    return s->world_size;
}
int64_t ddl_spec_batch_size(const ddl_spec_t *s)
{
    return s->batch;
}
uint64_t ddl_spec_seed(const ddl_spec_t *s)
{
    return s->seed;
}
ddl_dtype ddl_spec_dtype(const ddl_spec_t *s)
{
    return s->dt;
}
ddl_shape ddl_spec_input_shape(const ddl_spec_t *s)
{
    return s->input;
}
int ddl_spec_num_classes(const ddl_spec_t *s)
{
    return s->num_classes;
}
void ddl_spec_normalize(const ddl_spec_t *s, double *mean, double *std)
{
    *mean = s->mean;
    *std  = s->std;
}
bool ddl_spec_shuffle(const ddl_spec_t *s)
{
    return s->shuffle;
}
int64_t ddl_spec_label_elems(const ddl_spec_t *s)
{
    return s->label_elems;
}
ddl_shape ddl_spec_output_shape(const ddl_spec_t *s)
{
    return s->output;
}
bool ddl_spec_synthetic(const ddl_spec_t *s, ddl_synth_params *p, int64_t *n_train,
                        int64_t *n_test)
{
    if (s->has_synth) {
        if (p != NULL) {
            *p = s->synth;
        }
        if (n_train != NULL) {
            *n_train = s->synth_n[0];
        }
        if (n_test != NULL) {
            *n_test = s->synth_n[1];
        }
    }
    return s->has_synth;
}
