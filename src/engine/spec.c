// engine/spec.c: model spec parsing and validation (no MPI).
//
// jansson parses the text (rejecting duplicate keys, with the line of a syntax error);
// a small scanner indexes the line of every key path ("layers[3].kernel") so every
// semantic error names the key and the line. The layers form a graph: each takes the
// outputs its "from" names (default: the previous layer's). Validation resolves the
// names, orders the layers topologically (refusing cycles, dangling names and unused
// outputs), then follows the tensors through that order: each layer's global input shapes
// are its producers' outputs, and a layer whose parameters do not fit them is refused
// before any model is built. What each layer type reads is in engine/layer_registry.c.
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
#include "ddl/kernels.h"
#include "engine/layer_registry.h"
#include "engine/spec_internal.h"

// ---- line index of key paths -------------------------------------------------

struct spec_jline {
    char *path;
    int   line;
};

static void index_add(spec_pctx *c, const char *path, int line)
{
    if (c->nlines == c->cap) {
        int    cap = c->cap ? 2 * c->cap : 256;
        spec_jline *n = realloc(c->lines, sizeof *n * (size_t)cap);
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
static void index_build(spec_pctx *c, const char *t)
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
static int line_of(const spec_pctx *c, const char *path)
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

static void index_free(spec_pctx *c)
{
    for (int i = 0; i < c->nlines; i++) {
        free(c->lines[i].path);
    }
    free(c->lines);
}

ddl_status spec_fail(const spec_pctx *c, const char *path, const char *fmt, ...)
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

void spec_join(char *out, size_t n, const char *base, const char *key)
{
    snprintf(out, n, base[0] ? "%s.%s" : "%s%s", base, key);
}

// Refuses keys of obj not in allowed (NULL-terminated).
ddl_status spec_check_keys(const spec_pctx *c, json_t *obj, const char *path,
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
            spec_join(p, sizeof p, path, key);
            for (int i = 0; allowed[i]; i++) {
                strncat(list, i ? ", " : "", sizeof list - strlen(list) - 1);
                strncat(list, allowed[i], sizeof list - strlen(list) - 1);
            }
            return spec_fail(c, p, "unknown key (allowed here: %s)", list);
        }
    }
    return DDL_OK;
}

ddl_status spec_get_int(const spec_pctx *c, json_t *obj, const char *path, const char *key,
                          bool required, long long min, long long max, int64_t *out)
{
    char    p[256];
    json_t *v = json_object_get(obj, key);
    spec_join(p, sizeof p, path, key);
    if (v == NULL) {
        return required ? spec_fail(c, p, "missing (required)") : DDL_OK;
    }
    if (!json_is_integer(v)) {
        return spec_fail(c, p, "must be an integer");
    }
    long long x = json_integer_value(v);
    if (x < min || x > max) {
        return spec_fail(c, p, "%lld is outside [%lld, %lld]", x, min, max);
    }
    *out = x;
    return DDL_OK;
}

ddl_status spec_get_num(const spec_pctx *c, json_t *obj, const char *path, const char *key,
                          bool required, double min, double max, double *out)
{
    char    p[256];
    json_t *v = json_object_get(obj, key);
    spec_join(p, sizeof p, path, key);
    if (v == NULL) {
        return required ? spec_fail(c, p, "missing (required)") : DDL_OK;
    }
    if (!json_is_number(v)) {
        return spec_fail(c, p, "must be a number");
    }
    double x = json_number_value(v);
    if (!(x >= min && x <= max)) {
        return spec_fail(c, p, "%g is outside [%g, %g]", x, min, max);
    }
    *out = x;
    return DDL_OK;
}

ddl_status spec_get_bool(const spec_pctx *c, json_t *obj, const char *path, const char *key, bool *out)
{
    char    p[256];
    json_t *v = json_object_get(obj, key);
    spec_join(p, sizeof p, path, key);
    if (v == NULL) {
        return DDL_OK;
    }
    if (!json_is_boolean(v)) {
        return spec_fail(c, p, "must be true or false");
    }
    *out = json_is_true(v);
    return DDL_OK;
}

ddl_status spec_get_str(const spec_pctx *c, json_t *obj, const char *path, const char *key,
                          bool required, const char **out)
{
    char    p[256];
    json_t *v = json_object_get(obj, key);
    spec_join(p, sizeof p, path, key);
    if (v == NULL) {
        return required ? spec_fail(c, p, "missing (required)") : DDL_OK;
    }
    if (!json_is_string(v)) {
        return spec_fail(c, p, "must be a string");
    }
    *out = json_string_value(v);
    return DDL_OK;
}

// An integer array of exactly n entries (n < 0: 1..8 entries, count in *got), each in
// [min, max].
static ddl_status spec_get_ints(const spec_pctx *c, json_t *obj, const char *path, const char *key,
                           bool required, int n, long long min, long long max, int64_t *out,
                           int *got)
{
    char    p[256];
    json_t *v = json_object_get(obj, key);
    spec_join(p, sizeof p, path, key);
    if (v == NULL) {
        return required ? spec_fail(c, p, "missing (required)") : DDL_OK;
    }
    if (!json_is_array(v)) {
        return spec_fail(c, p, "must be an array of integers");
    }
    int len = (int)json_array_size(v);
    if (n >= 0 && len != n) {
        return spec_fail(c, p, "expected %d entries, got %d", n, len);
    }
    if (n < 0 && (len < 1 || len > DDL_MAX_DIMS)) {
        return spec_fail(c, p, "expected 1 to %d entries, got %d", DDL_MAX_DIMS, len);
    }
    for (int i = 0; i < len; i++) {
        json_t *e = json_array_get(v, (size_t)i);
        char    pe[280];
        snprintf(pe, sizeof pe, "%s[%d]", p, i);
        if (!json_is_integer(e)) {
            return spec_fail(c, pe, "must be an integer");
        }
        if (json_integer_value(e) < min || json_integer_value(e) > max) {
            return spec_fail(c, pe, "%lld is outside [%lld, %lld]", (long long)json_integer_value(e),
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

static ddl_status parse_partitions(spec_pctx *c, json_t *root)
{
    ddl_spec_t *s = c->s;
    json_t     *ps = json_object_get(root, "partitions");
    if (ps == NULL) {
        return spec_fail(c, "partitions", "missing (required)");
    }
    if (!json_is_object(ps) || json_object_size(ps) == 0) {
        return spec_fail(c, "partitions", "must be a non-empty object of named partitions");
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
            return spec_fail(c, path, "must be an object {\"ranks\": [...], \"shape\": [...]}");
        }
        static const char *const keys[] = {"ranks", "shape", NULL};
        DDL_CHECK(spec_check_keys(c, p, path, keys));
        spec_partition *sp = &s->parts[s->nparts];
        snprintf(sp->name, sizeof sp->name, "%s", name);
        json_t *jr = json_object_get(p, "ranks");
        char    pr[280];
        snprintf(pr, sizeof pr, "%s.ranks", path);
        if (!json_is_array(jr) || json_array_size(jr) < 1 || json_array_size(jr) > SPEC_MAX_RANKS) {
            return spec_fail(c, pr, "must be an array of 1 to %d ranks", SPEC_MAX_RANKS);
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
                return spec_fail(c, pe, "must be an integer");
            }
            long long r = json_integer_value(e);
            if (r < 0 || r >= s->world_size) {
                return spec_fail(c, pe, "rank %lld is outside the world of %d ranks", r, s->world_size);
            }
            for (int j = 0; j < i; j++) {
                if (sp->ranks[j] == r) {
                    return spec_fail(c, pe, "rank %lld is listed twice", r);
                }
            }
            sp->ranks[i] = (int)r;
        }
        int64_t shape[DDL_MAX_DIMS];
        DDL_CHECK(spec_get_ints(c, p, path, "shape", true, -1, 1, SPEC_MAX_RANKS, shape, &sp->ndim));
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
                return spec_fail(c, ps2, "multiplies past %d ranks", SPEC_MAX_RANKS);
            }
            return spec_fail(c, ps2, "multiplies to %lld but %d ranks are listed", (long long)prod,
                        sp->nranks);
        }
    }
    return DDL_OK;
}

// Resolves a partition name given at path.key (or keeps *out when absent and !required).
ddl_status spec_get_partition(const spec_pctx *c, json_t *obj, const char *path, const char *key,
                                bool required, int *out)
{
    const char *name = NULL;
    DDL_CHECK(spec_get_str(c, obj, path, key, required, &name));
    if (name == NULL) {
        return DDL_OK;
    }
    int i = find_partition(c->s, name);
    if (i < 0) {
        char p[256];
        spec_join(p, sizeof p, path, key);
        return spec_fail(c, p, "no partition named \"%s\" in \"partitions\"", name);
    }
    *out = i;
    return DDL_OK;
}

ddl_status spec_parse_spatial(const spec_pctx *c, json_t *o, const char *path, const char *key,
                                bool required, int nsp, long long min, int64_t fill, int64_t *out)
{
    for (int i = 0; i < nsp; i++) {
        out[i] = fill;
    }
    // Windows are bounded so their spans cannot overflow; sizes by the tensor cap.
    long long max = strcmp(key, "size") == 0 ? DDL_MAX_TENSOR_ELEMENTS : SPEC_MAX_WINDOW;
    return spec_get_ints(c, o, path, key, required, nsp, min, max, out, NULL);
}

// Refuses a shape past the per-tensor cap (or whose product overflows), naming what it is.
ddl_status spec_check_size(const spec_pctx *c, const char *path, const char *what,
                             const ddl_shape *shape)
{
    int64_t n;
    if (ddl_shape_numel_checked(shape, &n) != DDL_OK) {
        char sbuf[160];
        return spec_fail(c, path, "%s %s has more than 2^34 elements (the limit per tensor, "
                             "DDL_MAX_TENSOR_ELEMENTS)",
                    what, ddl_shape_str(shape, sbuf, sizeof sbuf));
    }
    return DDL_OK;
}

char *spec_shape_str(const ddl_shape *s, char *buf, size_t n)
{
    return ddl_shape_str(s, buf, n);
}

// "<stem><digit>d" whose stem is a spatial type ("maxpool4d"), for a clearer message than
// "unknown".
static bool bad_spatial_dims(const char *type)
{
    size_t n = strlen(type);
    char   one[64];
    if (n < 3 || n >= sizeof one || type[n - 1] != 'd' || type[n - 2] < '0' ||
        type[n - 2] > '9') {
        return false;
    }
    memcpy(one, type, n + 1);
    one[n - 2] = '1';
    return spec_kind_find(one) != NULL;
}

// The part of layer li known before any shape: its type, its name (given or generated:
// generated names use the index among the layers with parameters, counted in file order)
// and, for `from` to refer to, nothing else.
static ddl_status parse_head(spec_pctx *c, json_t *o, int li, int *nparam)
{
    ddl_spec_t *s = c->s;
    spec_layer *L = &s->layers[li];
    char        path[64];
    snprintf(path, sizeof path, "layers[%d]", li);
    if (!json_is_object(o)) {
        return spec_fail(c, path, "must be an object with a \"type\"");
    }
    const char *type = NULL;
    DDL_CHECK(spec_get_str(c, o, path, "type", true, &type));
    const char *name = NULL;
    DDL_CHECK(spec_get_str(c, o, path, "name", false, &name));
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
            return spec_fail(c, p, "\"%.80s\" is not a valid layer name (1 to %d characters, no "
                                   "'/', '\\' or control characters, not \".\" or \"..\")",
                             name, SPEC_NAME - 1);
        }
        if (strcmp(name, "input") == 0) {
            return spec_fail(c, p, "\"input\" is reserved: in \"from\" it names the model's "
                                   "input");
        }
    }
    // Types match exactly ("maxpool2d}" is not maxpool2d).
    L->kind = spec_kind_find(type);
    if (L->kind == NULL) {
        if (bad_spatial_dims(type)) {
            return spec_fail(c, path, "type \"%s\": only 1, 2 and 3 spatial dimensions exist",
                             type);
        }
        char p[96], known[512];
        snprintf(p, sizeof p, "%s.type", path);
        spec_kind_list(known, sizeof known);
        return spec_fail(c, p, "unknown layer type \"%s\" (known: %s)", type, known);
    }
    snprintf(L->type, sizeof L->type, "%s", type);
    L->has_params = L->kind->has_params != NULL && L->kind->has_params(o);
    if (L->has_params) {
        L->param_index = (*nparam)++;
    }
    if (name != NULL) {
        snprintf(L->name, sizeof L->name, "%s", name);
    } else if (L->has_params) {
        snprintf(L->name, sizeof L->name, "%s%d", L->kind->stem, L->param_index);
    } else {
        snprintf(L->name, sizeof L->name, "%s_at_%d", L->kind->stem, li);
    }
    return DDL_OK;
}

// Resolves layer li's "from" (default: the previous layer, or the input for the first).
static ddl_status parse_from(spec_pctx *c, json_t *o, int li)
{
    ddl_spec_t *s = c->s;
    spec_layer *L = &s->layers[li];
    char        path[64];
    snprintf(path, sizeof path, "layers[%d].from", li);
    json_t *f = json_object_get(o, "from");
    if (f == NULL) {
        L->nin   = 1;
        L->in[0] = li - 1; // layers[-1] is the input (SPEC_INPUT)
    } else {
        bool   arr = json_is_array(f);
        size_t n   = arr ? json_array_size(f) : 1;
        if (!(json_is_string(f) || (arr && n >= 1))) {
            return spec_fail(c, path, "must be a layer name or an array of them (\"input\" "
                                      "names the model's input)");
        }
        if (n > SPEC_MAX_INPUTS) {
            return spec_fail(c, path, "%zu operands; a layer takes at most %d", n,
                             SPEC_MAX_INPUTS);
        }
        L->nin = (int)n;
        for (int k = 0; k < L->nin; k++) {
            json_t *e = arr ? json_array_get(f, (size_t)k) : f;
            char    pe[80];
            if (arr) {
                snprintf(pe, sizeof pe, "%s[%d]", path, k);
            } else {
                snprintf(pe, sizeof pe, "%s", path);
            }
            if (!json_is_string(e)) {
                return spec_fail(c, pe, "must be a layer name (a string)");
            }
            const char *nm = json_string_value(e);
            int         at = -2;
            if (strcmp(nm, "input") == 0) {
                at = SPEC_INPUT;
            }
            for (int j = 0; j < s->nlayers && at == -2; j++) {
                at = strcmp(s->layers[j].name, nm) == 0 ? j : -2;
            }
            if (at == -2) {
                return spec_fail(c, pe, "no layer is named \"%.80s\" (a dangling name: give a "
                                        "layer's \"name\", a generated name such as conv0 or "
                                        "relu_at_2, or \"input\")",
                                 nm);
            }
            if (at == li) {
                return spec_fail(c, pe, "layer \"%s\" takes its own output (a cycle)", L->name);
            }
            L->in[k] = at;
        }
    }
    if (L->nin > L->kind->max_inputs) {
        return spec_fail(c, path, "%s takes one input, \"from\" names %d", L->type, L->nin);
    }
    if (L->nin < L->kind->min_inputs) {
        return spec_fail(c, path, "%s joins at least %d operands, %s %d", L->type,
                         L->kind->min_inputs, f == NULL ? "without \"from\" it has" :
                                                          "\"from\" names",
                         L->nin);
    }
    return DDL_OK;
}

// A topological order of the layers, the earliest ready layer in file order first (a
// chain keeps its file order); a cycle is reported with the layers on it. Every output
// but the last layer's must be consumed.
static ddl_status order_layers(spec_pctx *c)
{
    ddl_spec_t *s = c->s;
    int         n = s->nlayers;
    int        *indeg = ddl_calloc((size_t)n, sizeof *indeg);
    int        *uses  = ddl_calloc((size_t)n, sizeof *uses);
    bool       *done  = ddl_calloc((size_t)n, sizeof *done);
    s->order          = ddl_calloc((size_t)n, sizeof *s->order);
    ddl_status st     = DDL_OK;
    if (indeg == NULL || uses == NULL || done == NULL || s->order == NULL) {
        st = ddl_set_error(DDL_ENOMEM, "spec: out of memory");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < s->layers[i].nin; k++) {
            if (s->layers[i].in[k] != SPEC_INPUT) {
                indeg[i]++;
                uses[s->layers[i].in[k]]++;
            }
        }
    }
    int placed = 0, from = 0; // no layer before `from` is ready and unplaced
    while (placed < n) {
        int v = -1;
        for (int i = from; i < n && v < 0; i++) {
            v = !done[i] && indeg[i] == 0 ? i : -1;
        }
        if (v < 0) {
            break;
        }
        done[v]             = true;
        s->order[placed++]  = v;
        from                = v + 1;
        // Placing v readies its consumers; the earliest of them may lie before v.
        for (int i = 0; i < n; i++) {
            for (int k = 0; k < s->layers[i].nin; k++) {
                if (s->layers[i].in[k] == v && --indeg[i] == 0 && i < from) {
                    from = i;
                }
            }
        }
    }
    if (placed < n) {
        // Every unplaced layer has an unplaced producer: walk producers from the first
        // unplaced layer until one repeats; the repeat closes a cycle.
        int v = 0;
        while (done[v]) {
            v++;
        }
        int *walk = uses; // reused: the step at which each layer was visited, +1
        memset(walk, 0, sizeof *walk * (size_t)n);
        int step = 0;
        while (walk[v] == 0) {
            walk[v] = ++step;
            int next = -1;
            for (int k = 0; k < s->layers[v].nin && next < 0; k++) {
                int p = s->layers[v].in[k];
                next  = p != SPEC_INPUT && !done[p] ? p : -1;
            }
            v = next;
        }
        // The cycle: the layers visited from walk[v] on; in data-flow order (consumers were
        // visited before their producers), from the lowest index round to it again.
        int  len = step - walk[v] + 1, lowest = 0;
        int  cycle[64];
        bool cut = len > 64; // listed in part
        len      = cut ? 64 : len;
        for (int at = 0; at < len; at++) {
            for (int u = 0; u < n; u++) {
                if (walk[u] == step - at) {
                    cycle[at] = u;
                }
            }
            lowest = cycle[at] < cycle[lowest] ? at : lowest;
        }
        char cyc[640] = "";
        for (int at = 0; at <= (cut ? len - 1 : len); at++) {
            size_t used = strlen(cyc);
            snprintf(cyc + used, sizeof cyc - used, "%s\"%s\"", at ? " -> " : "",
                     s->layers[cycle[(lowest + at) % len]].name);
        }
        if (cut) {
            size_t used = strlen(cyc);
            snprintf(cyc + used, sizeof cyc - used, " -> ...");
        }
        lowest = cycle[lowest];
        char p[64];
        snprintf(p, sizeof p, "layers[%d].from", lowest);
        st = spec_fail(c, p, "the layers form a cycle: %s", cyc);
        goto out;
    }
    for (int i = 0; i < n - 1; i++) {
        if (uses[i] == 0) {
            char p[64];
            snprintf(p, sizeof p, "layers[%d]", i);
            st = spec_fail(c, p, "the output of \"%s\" is used by no layer (only the last "
                                 "layer's output, the model's, may be unused): name it in a "
                                 "later layer's \"from\"",
                           s->layers[i].name);
            goto out;
        }
    }
out:
    ddl_free(indeg);
    ddl_free(uses);
    ddl_free(done);
    return st;
}

// Parses the rest of layer li, its operands' shapes and partitions known: the `P_x`
// check, its type's keys (the registry), and the checks every output passes.
static ddl_status parse_body(spec_pctx *c, json_t *o, int li)
{
    ddl_spec_t *s = c->s;
    spec_layer *L = &s->layers[li];
    char        path[64], sbuf[128];
    snprintf(path, sizeof path, "layers[%d]", li);
    L->P_in      = spec_node_partition(s, L->in[0]);
    L->P_out     = L->P_in;
    L->P_w       = -1;
    L->P_y_given = -1;
    L->x_global  = *spec_node_shape(s, L->in[0]);
    L->y_global  = L->x_global;
    int given_px = -1;
    DDL_CHECK(spec_get_partition(c, o, path, "P_x", false, &given_px));
    if (given_px >= 0 && given_px != L->P_in) {
        char p[96];
        snprintf(p, sizeof p, "%s.P_x", path);
        return spec_fail(c, p, "the tensor is on partition \"%s\" here; insert a repartition "
                               "to \"%s\"",
                         s->parts[L->P_in].name, s->parts[given_px].name);
    }
    bool has_params = L->has_params;
    DDL_CHECK(L->kind->parse(c, o, path, L));
    DDL_REQUIRE(L->has_params == has_params, DDL_EINTERNAL,
                "spec: layer type %s decided its parameters inconsistently", L->type);
    if (s->parts[L->P_out].ndim != L->y_global.ndim) {
        return spec_fail(c, path, "the output %s has %d dims but its partition \"%s\" has %d",
                         spec_shape_str(&L->y_global, sbuf, sizeof sbuf), L->y_global.ndim,
                         s->parts[L->P_out].name, s->parts[L->P_out].ndim);
    }
    for (int d = 0; d < L->y_global.ndim; d++) {
        if (L->y_global.d[d] < 1) {
            return spec_fail(c, path, "the output %s is empty",
                             spec_shape_str(&L->y_global, sbuf, sizeof sbuf));
        }
    }
    return spec_check_size(c, path, "the output", &L->y_global);
}

// The layers: heads (types and names) in file order, then `from` and the order, then
// each layer's shapes in that order.
static ddl_status parse_layers(spec_pctx *c, json_t *ls)
{
    ddl_spec_t *s      = c->s;
    int         nparam = 0;
    for (int i = 0; i < s->nlayers; i++) {
        DDL_CHECK(parse_head(c, json_array_get(ls, (size_t)i), i, &nparam));
        for (int j = 0; j < i; j++) {
            if (strcmp(s->layers[j].name, s->layers[i].name) == 0) {
                char p[64];
                snprintf(p, sizeof p, "layers[%d].name", i);
                return spec_fail(c, p, "\"%s\" is also the name of layers[%d]; layer names must "
                                       "be unique (they name parameters and checkpoint entries)",
                                 s->layers[i].name, j);
            }
        }
    }
    for (int i = 0; i < s->nlayers; i++) {
        DDL_CHECK(parse_from(c, json_array_get(ls, (size_t)i), i));
    }
    DDL_CHECK(order_layers(c));
    for (int t = 0; t < s->nlayers; t++) {
        int i = s->order[t];
        DDL_CHECK(parse_body(c, json_array_get(ls, (size_t)i), i));
    }
    return DDL_OK;
}

static ddl_status parse_optimizer(spec_pctx *c, json_t *root)
{
    ddl_spec_t *s = c->s;
    json_t     *o = json_object_get(root, "optimizer");
    if (o == NULL) {
        s->optim = ddl_optim_params_default(DDL_OPTIM_ADAM);
        return DDL_OK;
    }
    if (!json_is_object(o)) {
        return spec_fail(c, "optimizer", "must be an object with a \"type\"");
    }
    static const char *const keys[] = {"type", "lr", "momentum", "dampening", "nesterov",
                                       "weight_decay", "betas", "eps", "schedule", NULL};
    DDL_CHECK(spec_check_keys(c, o, "optimizer", keys));
    const char *type = NULL;
    DDL_CHECK(spec_get_str(c, o, "optimizer", "type", true, &type));
    ddl_optim_kind k;
    if (strcmp(type, "sgd") == 0) {
        k = DDL_OPTIM_SGD;
    } else if (strcmp(type, "adam") == 0) {
        k = DDL_OPTIM_ADAM;
    } else if (strcmp(type, "adamw") == 0) {
        k = DDL_OPTIM_ADAMW;
    } else {
        return spec_fail(c, "optimizer.type", "\"%s\" is not one of sgd, adam, adamw", type);
    }
    ddl_optim_params *p = &s->optim;
    *p                  = ddl_optim_params_default(k);
    DDL_CHECK(spec_get_num(c, o, "optimizer", "lr", false, 0.0, 1e6, &p->lr));
    DDL_CHECK(spec_get_num(c, o, "optimizer", "weight_decay", false, 0.0, 1e6, &p->weight_decay));
    if (k == DDL_OPTIM_SGD) {
        DDL_CHECK(spec_get_num(c, o, "optimizer", "momentum", false, 0.0, 1.0, &p->momentum));
        DDL_CHECK(spec_get_num(c, o, "optimizer", "dampening", false, 0.0, 1.0, &p->dampening));
        DDL_CHECK(spec_get_bool(c, o, "optimizer", "nesterov", &p->nesterov));
        if (json_object_get(o, "betas") || json_object_get(o, "eps")) {
            return spec_fail(c, "optimizer", "sgd takes no \"betas\" or \"eps\"");
        }
    } else {
        json_t *b = json_object_get(o, "betas");
        if (b != NULL) {
            if (!json_is_array(b) || json_array_size(b) != 2 || !json_is_number(json_array_get(b, 0)) ||
                !json_is_number(json_array_get(b, 1))) {
                return spec_fail(c, "optimizer.betas", "must be two numbers [beta1, beta2]");
            }
            p->beta1 = json_number_value(json_array_get(b, 0));
            p->beta2 = json_number_value(json_array_get(b, 1));
            if (!(p->beta1 >= 0 && p->beta1 < 1 && p->beta2 >= 0 && p->beta2 < 1)) {
                return spec_fail(c, "optimizer.betas", "each must be in [0, 1)");
            }
        }
        DDL_CHECK(spec_get_num(c, o, "optimizer", "eps", false, 1e-300, 1.0, &p->eps));
        if (json_object_get(o, "momentum") || json_object_get(o, "nesterov") ||
            json_object_get(o, "dampening")) {
            return spec_fail(c, "optimizer", "%s takes no momentum, dampening or nesterov", type);
        }
    }
    if (p->nesterov && !(p->momentum > 0 && p->dampening == 0)) {
        return spec_fail(c, "optimizer.nesterov", "needs momentum > 0 and dampening 0");
    }
    json_t *sc = json_object_get(o, "schedule");
    if (sc != NULL) {
        if (!json_is_object(sc)) {
            return spec_fail(c, "optimizer.schedule", "must be an object with a \"type\"");
        }
        static const char *const sk[] = {"type", "step_size", "gamma", "t_max", "eta_min", NULL};
        DDL_CHECK(spec_check_keys(c, sc, "optimizer.schedule", sk));
        const char *st = NULL;
        DDL_CHECK(spec_get_str(c, sc, "optimizer.schedule", "type", true, &st));
        if (strcmp(st, "constant") == 0) {
            p->sched = DDL_SCHED_CONSTANT;
        } else if (strcmp(st, "step") == 0) {
            p->sched = DDL_SCHED_STEP;
            DDL_CHECK(spec_get_int(c, sc, "optimizer.schedule", "step_size", true, 1, 1LL << 40, &p->step_size));
            DDL_CHECK(spec_get_num(c, sc, "optimizer.schedule", "gamma", false, 1e-300, 1e6, &p->gamma));
        } else if (strcmp(st, "cosine") == 0) {
            p->sched = DDL_SCHED_COSINE;
            DDL_CHECK(spec_get_int(c, sc, "optimizer.schedule", "t_max", true, 1, 1LL << 40, &p->t_max));
            DDL_CHECK(spec_get_num(c, sc, "optimizer.schedule", "eta_min", false, 0.0, p->lr, &p->eta_min));
        } else {
            return spec_fail(c, "optimizer.schedule.type", "\"%s\" is not one of constant, step, cosine",
                        st);
        }
    }
    return DDL_OK;
}

// data.synthetic: {"kind": "shapes3d", "train": n, "test": n, "noise": s, "seed": k},
// generated volumes [1, D, H, W] sized by the input shape, one label per voxel, for a
// model whose output `out` is [batch, classes >= 3, D, H, W].
// The loss kinds a spec may name, with PyTorch's names and DistDL's reductions.
static const struct {
    const char   *name;
    ddl_loss_kind kind;
} loss_kinds[] = {
    {"cross_entropy", DDL_LOSS_CROSS_ENTROPY},
    {"mse", DDL_LOSS_MSE},
    {"l1", DDL_LOSS_L1},
    {"bce", DDL_LOSS_BCE},
    {"bce_with_logits", DDL_LOSS_BCE_WITH_LOGITS},
    {"kl_div", DDL_LOSS_KL_DIV},
    {"poisson_nll", DDL_LOSS_POISSON_NLL},
};

const char *ddl_spec_loss_name(const ddl_spec_t *s)
{
    ddl_loss_kind k = s->loss == DDL_LOSS_KL_DIV_LOG_TARGET ? DDL_LOSS_KL_DIV : s->loss;
    for (size_t i = 0; i < sizeof loss_kinds / sizeof loss_kinds[0]; i++) {
        if (loss_kinds[i].kind == k) {
            return loss_kinds[i].name;
        }
    }
    return "?";
}

// Cross-entropy: the output is [batch, classes] or [batch, classes, spatial...] with the
// classes whole on each rank (segmentation), and labels come one per sample or voxel.
static ddl_status loss_classes(spec_pctx *c, const ddl_shape *cur)
{
    ddl_spec_t *s = c->s;
    char        sbuf[128];
    if (cur->ndim < 2) {
        return spec_fail(c, "loss",
                         "cross_entropy needs the last layer's output to be [batch, "
                         "classes] or [batch, classes, spatial...], it is %s",
                         spec_shape_str(cur, sbuf, sizeof sbuf));
    }
    const spec_partition *po = &s->parts[s->layers[s->nlayers - 1].P_out];
    if (cur->ndim > 2 && po->shape[1] != 1) {
        // Segmentation: the log-softmax of a voxel needs all of its classes on one rank.
        return spec_fail(c, "loss",
                         "cross_entropy on the segmentation output %s needs every class "
                         "on each rank, but its partition \"%s\" splits dimension 1 "
                         "(classes) over %d ranks; split the batch or spatial dims",
                         spec_shape_str(cur, sbuf, sizeof sbuf), po->name, po->shape[1]);
    }
    if (cur->d[1] > INT32_MAX) {
        return spec_fail(c, "loss", "%lld classes (the output %s); at most %d are supported",
                         (long long)cur->d[1], spec_shape_str(cur, sbuf, sizeof sbuf), INT32_MAX);
    }
    s->num_classes = (int)cur->d[1];
    s->label_elems = 1;
    for (int d = 2; d < cur->ndim; d++) {
        s->label_elems *= cur->d[d];
    }
    return DDL_OK;
}

// "loss": {"type": T, "reduction": R[, "log_target": b]} against the last layer's output
// `cur`. Every kind but cross_entropy takes dense targets shaped like the output; bce
// needs outputs in [0, 1], so the network must end with a sigmoid.
static ddl_status parse_loss(spec_pctx *c, json_t *root, const ddl_shape *cur)
{
    ddl_spec_t *s  = c->s;
    json_t     *lo = json_object_get(root, "loss");
    if (lo == NULL || !json_is_object(lo)) {
        return spec_fail(c, "loss", "missing or not an object {\"type\": \"cross_entropy\", ...}");
    }
    static const char *const lk[] = {"type", "reduction", "log_target", NULL};
    DDL_CHECK(spec_check_keys(c, lo, "loss", lk));
    const char *lt = NULL, *red = "mean";
    DDL_CHECK(spec_get_str(c, lo, "loss", "type", true, &lt));
    size_t k = 0, nk = sizeof loss_kinds / sizeof loss_kinds[0];
    while (k < nk && strcmp(lt, loss_kinds[k].name) != 0) {
        k++;
    }
    if (k == nk) {
        return spec_fail(c, "loss.type",
                         "\"%s\" is not a known loss (cross_entropy, mse, l1, bce, "
                         "bce_with_logits, kl_div, poisson_nll)",
                         lt);
    }
    s->loss         = loss_kinds[k].kind;
    s->dense        = s->loss != DDL_LOSS_CROSS_ENTROPY;
    bool log_target = false;
    DDL_CHECK(spec_get_bool(c, lo, "loss", "log_target", &log_target));
    if (json_object_get(lo, "log_target") != NULL && s->loss != DDL_LOSS_KL_DIV) {
        return spec_fail(c, "loss.log_target", "only kl_div takes log_target, not %s", lt);
    }
    if (log_target) {
        s->loss = DDL_LOSS_KL_DIV_LOG_TARGET;
    }
    DDL_CHECK(spec_get_str(c, lo, "loss", "reduction", false, &red));
    if (strcmp(red, "mean") == 0) {
        s->reduction = DDL_REDUCTION_MEAN;
    } else if (strcmp(red, "sum") == 0) {
        s->reduction = DDL_REDUCTION_SUM;
    } else if (strcmp(red, "batchmean") == 0 && loss_kinds[k].kind == DDL_LOSS_KL_DIV) {
        s->reduction = DDL_REDUCTION_BATCHMEAN;
    } else {
        return spec_fail(c, "loss.reduction", "\"%s\" is not mean or sum%s", red,
                         loss_kinds[k].kind == DDL_LOSS_KL_DIV ? " or batchmean" : "");
    }
    s->output = (ddl_shape){.ndim = cur->ndim - 1};
    for (int d = 1; d < cur->ndim; d++) {
        s->output.d[d - 1] = cur->d[d];
    }
    s->out_elems = 1;
    for (int d = 0; d < s->output.ndim; d++) {
        s->out_elems *= s->output.d[d];
    }
    if (!s->dense) {
        return loss_classes(c, cur);
    }
    char sbuf[128];
    if (cur->ndim < 2) {
        return spec_fail(c, "loss",
                         "%s needs the last layer's output to be [batch, values...], "
                         "it is %s",
                         lt, spec_shape_str(cur, sbuf, sizeof sbuf));
    }
    const spec_layer *last = &s->layers[s->nlayers - 1];
    if (s->loss == DDL_LOSS_BCE && strcmp(last->type, "sigmoid") != 0) {
        return spec_fail(c, "loss",
                         "bce needs outputs in [0, 1], but the last layer is \"%s\"; "
                         "end the network with {\"type\": \"sigmoid\"}, or train "
                         "the logits with bce_with_logits",
                         last->type);
    }
    s->num_classes = 0;
    s->label_elems = 0;
    return DDL_OK;
}

static ddl_status parse_synthetic(spec_pctx *c, json_t *da, const ddl_shape *out)
{
    ddl_spec_t *s  = c->s;
    json_t     *sy = json_object_get(da, "synthetic");
    if (sy == NULL) {
        return DDL_OK;
    }
    if (!json_is_object(sy)) {
        return spec_fail(c, "data.synthetic", "must be an object {\"kind\": \"shapes3d\", "
                                         "\"train\": n, \"test\": n, \"noise\": s}");
    }
    static const char *const sk[] = {"kind", "train", "test", "noise", "seed", NULL};
    DDL_CHECK(spec_check_keys(c, sy, "data.synthetic", sk));
    const char *kind = NULL;
    DDL_CHECK(spec_get_str(c, sy, "data.synthetic", "kind", true, &kind));
    if (strcmp(kind, "shapes3d") != 0) {
        return spec_fail(c, "data.synthetic.kind", "\"%s\" is not a known kind (shapes3d)", kind);
    }
    int64_t seed = (int64_t)(s->seed & ((1ull << 62) - 1));
    s->synth_n[1] = 64;
    s->synth.noise = 0.3;
    DDL_CHECK(spec_get_int(c, sy, "data.synthetic", "train", true, 1, (1LL << 31), &s->synth_n[0]));
    DDL_CHECK(spec_get_int(c, sy, "data.synthetic", "test", false, 0, (1LL << 31), &s->synth_n[1]));
    DDL_CHECK(spec_get_num(c, sy, "data.synthetic", "noise", false, 0.0, 100.0, &s->synth.noise));
    DDL_CHECK(spec_get_int(c, sy, "data.synthetic", "seed", false, 0, (1LL << 62), &seed));
    char ib[128], ob[128];
    spec_shape_str(&s->input, ib, sizeof ib);
    spec_shape_str(out, ob, sizeof ob);
    if (s->input.ndim != 4 || s->input.d[0] != 1) {
        return spec_fail(c, "data.synthetic", "shapes3d makes single-channel volumes, so the input "
                                         "shape must be [1, D, H, W]; it is %s",
                    ib);
    }
    bool fits = out->ndim == 5 && (s->dense ? out->d[1] == 1 : out->d[1] >= DDL_SYNTH_CLASSES);
    for (int d = 0; fits && d < 3; d++) {
        fits = out->d[2 + d] == s->input.d[1 + d];
    }
    if (!fits && s->dense) {
        return spec_fail(c, "data.synthetic",
                         "shapes3d gives %s one value per voxel of the input "
                         "volume %s, so the last layer's output must be "
                         "[batch, 1, %lld, %lld, %lld]; it is %s",
                         ddl_spec_loss_name(s), ib, (long long)s->input.d[1],
                         (long long)s->input.d[2], (long long)s->input.d[3], ob);
    }
    if (!fits) {
        return spec_fail(c, "data.synthetic", "shapes3d labels every voxel of the input volume %s "
                                         "with one of %d classes, so the last layer's output "
                                         "must be [batch, >= %d classes, %lld, %lld, %lld]; it "
                                         "is %s",
                    ib, DDL_SYNTH_CLASSES, DDL_SYNTH_CLASSES, (long long)s->input.d[1],
                    (long long)s->input.d[2], (long long)s->input.d[3], ob);
    }
    if (s->synth_n[0] < s->batch) {
        return spec_fail(c, "data.synthetic.train", "%lld samples are fewer than one batch (%lld)",
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
               : spec_fail(c, "data.synthetic", "%s", ddl_last_error());
}

// "data": {"target": T}: where the targets come from, against the loss and the data.
// Defaults: labels for cross_entropy; for dense losses the image (IDX data) or, for
// generated volumes, the mask (bce, bce_with_logits) or the clean volume (the others).
static ddl_status parse_target(spec_pctx *c, json_t *da)
{
    ddl_spec_t              *s       = c->s;
    static const char *const names[] = {"labels", "image", "clean", "mask"};
    const char              *t       = NULL;
    if (da != NULL) {
        DDL_CHECK(spec_get_str(c, da, "data", "target", false, &t));
    }
    if (t == NULL) {
        bool bin  = s->loss == DDL_LOSS_BCE || s->loss == DDL_LOSS_BCE_WITH_LOGITS;
        s->target = !s->dense       ? DDL_TARGET_LABELS
                    : !s->has_synth ? DDL_TARGET_IMAGE
                    : bin           ? DDL_TARGET_MASK
                                    : DDL_TARGET_CLEAN;
    } else {
        int k = 0;
        while (k < 4 && strcmp(t, names[k]) != 0) {
            k++;
        }
        if (k == 4) {
            return spec_fail(c, "data.target", "\"%s\" is not labels, image, clean or mask", t);
        }
        s->target = (ddl_target_source)k;
    }
    const char *loss = ddl_spec_loss_name(s);
    if (!s->dense && s->target != DDL_TARGET_LABELS) {
        return spec_fail(c, "data.target",
                         "cross_entropy trains on class labels, not \"%s\"; "
                         "give a dense loss (mse, l1, ...) for dense targets",
                         names[s->target]);
    }
    if (s->dense && s->target == DDL_TARGET_LABELS) {
        return spec_fail(c, "data.target",
                         "%s trains on dense targets shaped like the output, "
                         "not class labels (%s)",
                         loss, s->has_synth ? "clean or mask" : "image");
    }
    if (s->has_synth && s->target == DDL_TARGET_IMAGE) {
        return spec_fail(c, "data.target",
                         "\"image\" is the target of IDX data; generated "
                         "volumes give \"clean\" or \"mask\"");
    }
    if (!s->has_synth && (s->target == DDL_TARGET_CLEAN || s->target == DDL_TARGET_MASK)) {
        return spec_fail(c, "data.target",
                         "\"%s\" needs generated volumes (\"synthetic\"); IDX "
                         "data gives \"labels\" or \"image\"",
                         names[s->target]);
    }
    int64_t in = 1;
    for (int d = 0; d < s->input.ndim; d++) {
        in *= s->input.d[d];
    }
    if (s->target == DDL_TARGET_IMAGE && s->out_elems != in) {
        char ib[128], ob[128];
        return spec_fail(c, "data.target",
                         "the image target holds the input's %lld values %s per "
                         "sample (row-major), so the output must hold as many; "
                         "it is %s (%lld)",
                         (long long)in, spec_shape_str(&s->input, ib, sizeof ib),
                         spec_shape_str(&s->output, ob, sizeof ob), (long long)s->out_elems);
    }
    return DDL_OK;
}

// The most ranks any activation's partition splits the batch dimension over (and that
// partition's index in *which): a short batch needs at least that many samples, so that
// every one of them holds a row.
static int64_t batch_split(const ddl_spec_t *s, int *which)
{
    int64_t most = 1;
    *which       = s->input_partition;
    for (int n = SPEC_INPUT; n < s->nlayers; n++) {
        int P = spec_node_partition(s, n);
        if (s->parts[P].shape[0] > most) {
            most   = s->parts[P].shape[0];
            *which = P;
        }
    }
    return most;
}

// "inference_batches": the short batch sizes, ascending, each at least batch_split and
// below batch_size. Absent: the powers of two in that range; []: none, so every Predict
// and Evaluate runs a full batch. A short-batch copy's spec (batch_override) has none.
static ddl_status parse_buckets(spec_pctx *c, json_t *root)
{
    ddl_spec_t *s = c->s;
    s->nbuckets   = 0;
    if (c->batch_override > 0) {
        return DDL_OK;
    }
    int     P  = 0;
    int64_t lo = batch_split(s, &P);
    json_t *v  = json_object_get(root, "inference_batches");
    if (v == NULL) {
        for (int64_t b = 1; b < s->batch && s->nbuckets < SPEC_MAX_BUCKETS; b *= 2) {
            if (b >= lo) {
                s->buckets[s->nbuckets++] = b;
            }
        }
        return DDL_OK;
    }
    if (!json_is_array(v)) {
        return spec_fail(c, "inference_batches",
                         "must be an array of batch sizes, ascending, each below batch_size");
    }
    if (json_array_size(v) > SPEC_MAX_BUCKETS) {
        return spec_fail(c, "inference_batches", "%zu entries; at most %d", json_array_size(v),
                         SPEC_MAX_BUCKETS);
    }
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *e = json_array_get(v, i);
        char    pe[64];
        snprintf(pe, sizeof pe, "inference_batches[%zu]", i);
        if (!json_is_integer(e)) {
            return spec_fail(c, pe, "must be an integer");
        }
        long long b = json_integer_value(e);
        if (b >= s->batch || b < 1) {
            return spec_fail(c, pe,
                             "%lld is not a short batch: it must be in [1, %lld) "
                             "(batch_size %lld)",
                             b, (long long)s->batch, (long long)s->batch);
        }
        if (b < lo) {
            return spec_fail(c, pe,
                             "%lld samples are fewer than the %lld ranks partition "
                             "\"%s\" splits the batch over; each needs a row",
                             b, (long long)lo, s->parts[P].name);
        }
        if (i > 0 && b <= s->buckets[i - 1]) {
            return spec_fail(c, pe, "%lld after %lld: the sizes must be ascending", b,
                             (long long)s->buckets[i - 1]);
        }
        s->buckets[s->nbuckets++] = b;
    }
    return DDL_OK;
}

static ddl_status parse_root(spec_pctx *c, json_t *root)
{
    ddl_spec_t *s = c->s;
    if (!json_is_object(root)) {
        return spec_fail(c, "(top level)", "the spec must be a JSON object");
    }
    static const char *const keys[] = {
        "name",  "world_size", "seed",   "dtype", "batch_size", "inference_batches",
        "input", "partitions", "layers", "loss",  "optimizer",  "data",
        NULL};
    DDL_CHECK(spec_check_keys(c, root, "", keys));
    int64_t v = 0;
    DDL_CHECK(spec_get_int(c, root, "", "world_size", true, 1, SPEC_MAX_RANKS, &v));
    if (s->world_size > 0 && v != s->world_size) {
        return spec_fail(c, "world_size", "the spec is for %lld ranks but the job has %d (run with "
                                     "mpirun -np %lld)",
                    (long long)v, s->world_size, (long long)v);
    }
    s->world_size = (int)v;
    // The model's name: the daemon serves the model under it (KServe's model_name, the
    // /v2/models/{name} paths) and keeps a replacement's checkpoints under it, so it is
    // what a path segment and a directory name can hold.
    const char *mname = NULL;
    DDL_CHECK(spec_get_str(c, root, "", "name", false, &mname));
    if (mname != NULL) {
        // (the JSON parser has refused a NUL inside the string already)
        if (!ddl_name_is_portable(mname, SPEC_NAME - 1)) {
            return spec_fail(c, "name",
                             "\"%.80s\" is not a valid model name (1 to %d letters, "
                             "digits, '.', '_' or '-', not starting with '.')",
                             mname, SPEC_NAME - 1);
        }
        snprintf(s->name, sizeof s->name, "%s", mname);
    }
    v = 0;
    DDL_CHECK(spec_get_int(c, root, "", "seed", false, 0, (1LL << 62), &v));
    s->seed          = (uint64_t)v;
    const char *dt   = "f32";
    DDL_CHECK(spec_get_str(c, root, "", "dtype", false, &dt));
    if (strcmp(dt, "f32") == 0) {
        s->dt = DDL_F32;
    } else if (strcmp(dt, "f64") == 0) {
        s->dt = DDL_F64;
    } else {
        return spec_fail(c, "dtype", "\"%s\" is not f32 or f64", dt);
    }
    s->batch = 64;
    DDL_CHECK(spec_get_int(c, root, "", "batch_size", false, 1, 1 << 20, &s->batch));
    if (c->batch_override > 0) {
        s->batch = c->batch_override;
    }
    DDL_CHECK(parse_partitions(c, root));
    // input
    json_t *in = json_object_get(root, "input");
    if (in == NULL || !json_is_object(in)) {
        return spec_fail(c, "input", "missing or not an object {\"shape\": [...], \"partition\": ...}");
    }
    static const char *const ik[] = {"shape", "partition", NULL};
    DDL_CHECK(spec_check_keys(c, in, "input", ik));
    int64_t is[DDL_MAX_DIMS];
    int     nd = 0;
    DDL_CHECK(spec_get_ints(c, in, "input", "shape", true, -1, 1, DDL_MAX_TENSOR_ELEMENTS, is, &nd));
    if (nd >= DDL_MAX_DIMS) {
        return spec_fail(c, "input.shape", "at most %d dims per sample", DDL_MAX_DIMS - 1);
    }
    s->input = ddl_shape_make(nd, is);
    DDL_CHECK(spec_get_partition(c, in, "input", "partition", true, &s->input_partition));
    if (s->parts[s->input_partition].ndim != nd + 1) {
        return spec_fail(c, "input.partition", "partition \"%s\" has %d dims; the batched input "
                                          "[batch, %d sample dims] has %d",
                    s->parts[s->input_partition].name, s->parts[s->input_partition].ndim, nd, nd + 1);
    }
    // layers
    json_t *ls = json_object_get(root, "layers");
    if (ls == NULL || !json_is_array(ls) || json_array_size(ls) == 0) {
        return spec_fail(c, "layers", "missing or not a non-empty array of layers");
    }
    if (json_array_size(ls) > DDL_MAX_LAYERS) {
        return spec_fail(c, "layers", "%zu layers; a spec may have at most %d (DDL_MAX_LAYERS)",
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
    DDL_CHECK(spec_check_size(c, "input.shape", "the batched input", &cur));
    s->in_global = cur;
    DDL_CHECK(parse_layers(c, ls));
    DDL_CHECK(parse_buckets(c, root));
    cur = s->layers[s->nlayers - 1].y_global;
    DDL_CHECK(parse_loss(c, root, &cur));
    DDL_CHECK(parse_optimizer(c, root));
    // data
    s->mean = 0.0, s->std = 1.0, s->shuffle = true;
    json_t *da = json_object_get(root, "data");
    if (da != NULL) {
        if (!json_is_object(da)) {
            return spec_fail(c, "data", "must be an object");
        }
        static const char *const dk[] = {"normalize", "shuffle", "synthetic", "target", NULL};
        DDL_CHECK(spec_check_keys(c, da, "data", dk));
        DDL_CHECK(parse_synthetic(c, da, &cur));
        DDL_CHECK(spec_get_bool(c, da, "data", "shuffle", &s->shuffle));
        json_t *no = json_object_get(da, "normalize");
        if (no != NULL) {
            if (!json_is_object(no)) {
                return spec_fail(c, "data.normalize", "must be {\"mean\": m, \"std\": s}");
            }
            static const char *const nk[] = {"mean", "std", NULL};
            DDL_CHECK(spec_check_keys(c, no, "data.normalize", nk));
            DDL_CHECK(spec_get_num(c, no, "data.normalize", "mean", true, -1e9, 1e9, &s->mean));
            DDL_CHECK(spec_get_num(c, no, "data.normalize", "std", true, 1e-12, 1e9, &s->std));
        }
    }
    return parse_target(c, da);
}

ddl_status ddl_spec_parse(const char *text, const char *source, int world_size, ddl_spec_t **out)
{
    return spec_parse_at_batch(text, source, world_size, 0, out);
}

// The environment variable `name`, or NULL when it is unset or empty.
static const char *env_setting(const char *name)
{
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0' ? v : NULL;
}

// A switch setting: unset (def), "0" or "1".
static ddl_status env_switch(const char *name, bool def, bool *out)
{
    const char *v = env_setting(name);
    *out          = v == NULL ? def : strcmp(v, "1") == 0;
    DDL_REQUIRE(v == NULL || strcmp(v, "0") == 0 || strcmp(v, "1") == 0, DDL_EINVAL,
                "environment: %s=\"%.40s\" is not one of its settings, 0 and 1 (unset means %d)",
                name, v, def);
    return DDL_OK;
}

// The engine's settings from the environment (ddl_spec's `tuning`), checked.
static ddl_status spec_read_tuning(ddl_spec_t *s)
{
    DDL_CHECK(env_switch("DDL_SHARE_SCRATCH", true, &s->tuning.share_scratch));
    DDL_CHECK(env_switch("DDL_FUSE_BN_RELU", true, &s->tuning.fuse_bn_relu));
    DDL_CHECK(env_switch("DDL_FUSE_ADD_RELU", true, &s->tuning.fuse_add_relu));
    DDL_CHECK(env_switch("DDL_SHARE_BN_GRAD", true, &s->tuning.share_bn_grad));
    const char *v             = env_setting("DDL_SHARE_MIN_BYTES");
    s->tuning.share_min_bytes = 2.0 * 1024 * 1024;
    DDL_REQUIRE(v == NULL || ddl_parse_bytes(v, &s->tuning.share_min_bytes), DDL_EINVAL,
                "environment: DDL_SHARE_MIN_BYTES=\"%.40s\" is not a byte count (a number >= 0, "
                "optionally followed by K, M, G or T; unset: 2M)",
                v);
    double lim = 0;
    v          = env_setting("DDL_MEMORY_LIMIT");
    DDL_REQUIRE(v == NULL || (ddl_parse_bytes(v, &lim) && lim > 0), DDL_EINVAL,
                "environment: DDL_MEMORY_LIMIT=\"%.40s\" is not a byte count per rank (a number "
                "> 0, optionally followed by K, M, G or T)",
                v);
    bool halo_overlap; // read by the layers (ddl_halo_overlap); checked here
    DDL_CHECK(env_switch("DDL_HALO_OVERLAP", DDL_HALO_OVERLAP_DEFAULT, &halo_overlap));
    v = env_setting("DDL_CONV_DIRECT");
    DDL_REQUIRE(v == NULL || ddl_conv_direct_setting_ok(v), DDL_EINVAL,
                "environment: DDL_CONV_DIRECT=\"%.40s\" is not a setting of it: 0 (im2col + "
                "GEMM), avx2 (the direct kernels at most at AVX2 width) or 1 (the CPU's widest, "
                "as when unset)",
                v);
    return DDL_OK;
}

ddl_status spec_parse_at_batch(const char *text, const char *source, int world_size, int64_t batch,
                               ddl_spec_t **out)
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
    ddl_status st = spec_read_tuning(s);
    if (st != DDL_OK) {
        ddl_spec_destroy(&s);
        return st;
    }
    json_error_t je;
    json_t      *root = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    if (root == NULL) {
        st = ddl_set_error(DDL_EINVAL, "%s:%d:%d: %s", s->source, je.line, je.column, je.text);
    } else {
        spec_pctx c = {.s = s, .batch_override = batch};
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
    ddl_free((*s)->order);
    ddl_free((*s)->text);
    ddl_free(*s);
    *s = NULL;
}

const char *ddl_spec_text(const ddl_spec_t *s)
{
    return s->text;
}
const char *ddl_spec_name(const ddl_spec_t *s)
{
    return s->name;
}
int ddl_spec_world_size(const ddl_spec_t *s)
{
    return s->world_size;
}
int ddl_spec_num_layers(const ddl_spec_t *s)
{
    return s->nlayers;
}
void ddl_spec_layer_output(const ddl_spec_t *s, int i, const char **name, const char **type,
                           ddl_shape *y_global, const char **partition)
{
    const spec_layer *L = &s->layers[i];
    *name               = L->name;
    *type               = L->type;
    *y_global           = L->y_global;
    *partition          = L->P_out >= 0 ? s->parts[L->P_out].name : "";
}
int64_t ddl_spec_batch_size(const ddl_spec_t *s)
{
    return s->batch;
}
int ddl_spec_inference_batches(const ddl_spec_t *s, const int64_t **sizes)
{
    if (sizes != NULL) {
        *sizes = s->buckets;
    }
    return s->nbuckets;
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
ddl_loss_kind ddl_spec_loss(const ddl_spec_t *s)
{
    return s->loss;
}
bool ddl_spec_dense_targets(const ddl_spec_t *s)
{
    return s->dense;
}
int64_t ddl_spec_output_elems(const ddl_spec_t *s)
{
    return s->out_elems;
}
ddl_target_source ddl_spec_target_source(const ddl_spec_t *s)
{
    return s->target;
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

bool spec_share_scratch(const ddl_spec_t *s)
{
    return s->tuning.share_scratch;
}

// Layer i's place in the topological order (s->order).
static int order_pos(const ddl_spec_t *s, int i)
{
    int t = 0;
    while (t < s->nlayers && s->order[t] != i) {
        t++;
    }
    return t;
}

int spec_grad_alias_of(const ddl_spec_t *s, int p)
{
    if (spec_fused_relu_source(s, p) >= 0) {
        return -1; // its gradient is its batch norm's (or add's)
    }
    int consumer = -1, uses = 0;
    for (int i = 0; i < s->nlayers; i++) {
        for (int k = 0; k < s->layers[i].nin; k++) {
            if (s->layers[i].in[k] == p) {
                consumer = i;
                uses++;
            }
        }
    }
    if (uses != 1 || s->layers[consumer].P_in != s->layers[p].P_out) {
        return -1;
    }
    const char *stem = s->layers[consumer].kind->stem;
    if (strcmp(stem, "add") == 0) {
        return consumer;
    }
    // A batch norm overwrites its dy with its dx: where that dy is its own, or an add's
    // whose other operands have gradients of their own (copied from it before) or read it
    // in backwards that run before this one's (later in the topological order).
    if (!s->tuning.share_bn_grad || strcmp(stem, "batchnorm") != 0) {
        return -1;
    }
    int a = spec_grad_alias_of(s, consumer);
    for (int k = 0; a >= 0 && k < s->layers[a].nin; k++) {
        int q = s->layers[a].in[k];
        if (q != consumer && q != SPEC_INPUT && spec_grad_alias_of(s, q) == a &&
            order_pos(s, q) < order_pos(s, consumer)) {
            return -1;
        }
    }
    return consumer;
}

int spec_fused_relu_source(const ddl_spec_t *s, int j)
{
    const spec_layer *R = &s->layers[j];
    if (strcmp(R->kind->stem, "activation") != 0 || R->act != DDL_ACT_RELU || R->nin != 1 ||
        R->in[0] == SPEC_INPUT) {
        return -1;
    }
    int         p    = R->in[0];
    const char *stem = s->layers[p].kind->stem;
    bool        kind = (s->tuning.fuse_bn_relu && strcmp(stem, "batchnorm") == 0) ||
                (s->tuning.fuse_add_relu && strcmp(stem, "add") == 0);
    if (!kind || p == s->nlayers - 1 || s->layers[p].P_out != R->P_in) {
        return -1;
    }
    for (int i = 0; i < s->nlayers; i++) {
        for (int k = 0; k < s->layers[i].nin; k++) {
            if (s->layers[i].in[k] == p && i != j) {
                return -1;
            }
        }
    }
    return p;
}
