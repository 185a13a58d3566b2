// format/jdata.c: the numbers of a KServe v2 REST inference request's tensors, read without
// building a JSON tree (ddl/format.h, "KServe REST tensor data").
//
// A request of one LeNet-5 image carries 784 numbers; a JSON library that builds a tree
// allocates an object for each (about 150 us a request with jansson). Here one pass walks
// the whole text as JSON's grammar says, tracks only where it is (the root object, its
// "inputs" array, the tensors in it), and notes the byte span of each tensor's "data"
// array, after checking that the array holds only numbers and arrays of them. A second
// pass per tensor converts those numbers straight into the tensor's contents.
//
// Both passes only ever decline: whatever they cannot read the way jansson and the
// daemon's own JSON path would (an escape in a key, true/false in data, an integer past
// int64, a real that overflows, a value out of the datatype's range, ...) makes them
// return -1, and the caller parses the request the slow way, which gives the same answer
// or the same error as before. A span is a complete JSON value, so the caller may cut it
// out (ddl_fmt_jdata_cut) and let a tree parser read the rest of the request cheaply.
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ddl/format.h"

#define JD_MAX_DEPTH 64 // containers nested deeper: declined

typedef struct jd {
    const char    *s;
    size_t         n, i;
    ddl_fmt_jspan *spans;
    size_t         max;
    size_t         n_inputs;
} jd;

enum where { W_ROOT, W_INPUTS, W_TENSOR, W_OTHER };

static void skip_ws(jd *p)
{
    while (p->i < p->n &&
           (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r')) {
        p->i++;
    }
}

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

// A number by JSON's grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
static int number(jd *p)
{
    const char *s = p->s;
    size_t      i = p->i;
    if (i < p->n && s[i] == '-') {
        i++;
    }
    if (i >= p->n || !is_digit(s[i])) {
        return -1;
    }
    if (s[i] == '0') {
        i++;
    } else {
        while (i < p->n && is_digit(s[i])) {
            i++;
        }
    }
    if (i < p->n && s[i] == '.') {
        i++;
        if (i >= p->n || !is_digit(s[i])) {
            return -1;
        }
        while (i < p->n && is_digit(s[i])) {
            i++;
        }
    }
    if (i < p->n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < p->n && (s[i] == '+' || s[i] == '-')) {
            i++;
        }
        if (i >= p->n || !is_digit(s[i])) {
            return -1;
        }
        while (i < p->n && is_digit(s[i])) {
            i++;
        }
    }
    p->i = i;
    return 0;
}

// A string; *plain: it holds no escape (so its bytes are its value). Control characters
// are refused, as JSON says.
static int string(jd *p, size_t *b, size_t *e, bool *plain)
{
    if (p->i >= p->n || p->s[p->i] != '"') {
        return -1;
    }
    p->i++;
    *b     = p->i;
    *plain = true;
    while (p->i < p->n) {
        unsigned char c = (unsigned char)p->s[p->i];
        if (c == '"') {
            *e = p->i++;
            return 0;
        }
        if (c < 0x20) {
            return -1;
        }
        if (c == '\\') {
            *plain = false;
            p->i++; // the escaped character (\uXXXX's digits pass as plain characters)
        }
        p->i++;
    }
    return -1;
}

// Past the opening bracket of a container that `close` ends: true (and past the close)
// when it is empty.
static bool opened_empty(jd *p, char close)
{
    p->i++;
    skip_ws(p);
    if (p->i < p->n && p->s[p->i] == close) {
        p->i++;
        return true;
    }
    return false;
}

// After a member of a container that `close` ends: 1 past the close, 0 past a comma (a
// member follows), -1 for anything else.
static int after_member(jd *p, char close)
{
    skip_ws(p);
    if (p->i >= p->n) {
        return -1;
    }
    if (p->s[p->i] == close) {
        p->i++;
        return 1;
    }
    if (p->s[p->i] != ',') {
        return -1;
    }
    p->i++;
    return 0;
}

// An array of numbers and arrays of them (a tensor's "data"), `level` arrays inside the
// data array (0: the data array itself). Deeper than 32 is declined: the daemon's tree
// path refuses such data ("nested deeper than 32 levels").
#define JD_MAX_DATA_LEVEL 32
static int numeric_array(jd *p, int level)
{
    if (level > JD_MAX_DATA_LEVEL) {
        return -1;
    }
    if (opened_empty(p, ']')) {
        return 0;
    }
    for (;;) {
        skip_ws(p);
        if (p->i >= p->n) {
            return -1;
        }
        int rc = p->s[p->i] == '[' ? numeric_array(p, level + 1) : number(p);
        if (rc != 0) {
            return -1;
        }
        int end = after_member(p, ']');
        if (end != 0) {
            return end > 0 ? 0 : -1;
        }
    }
}

static int value(jd *p, enum where w, int depth);

// An object; at W_ROOT its "inputs" is the tensors' array, at W_TENSOR its "data" is noted.
static int object(jd *p, enum where w, int depth)
{
    size_t tensor = p->n_inputs - 1; // which tensor, at W_TENSOR
    if (opened_empty(p, '}')) {
        return 0;
    }
    for (;;) {
        size_t kb, ke;
        bool   plain;
        skip_ws(p);
        if (string(p, &kb, &ke, &plain) != 0) {
            return -1;
        }
        skip_ws(p);
        if (p->i >= p->n || p->s[p->i] != ':') {
            return -1;
        }
        p->i++;
        skip_ws(p);
        size_t klen = ke - kb;
        bool   is_inputs =
            w == W_ROOT && plain && klen == 6 && memcmp(p->s + kb, "inputs", 6) == 0;
        bool is_data = w == W_TENSOR && plain && klen == 4 && memcmp(p->s + kb, "data", 4) == 0;
        if (is_data && p->i < p->n && p->s[p->i] == '[') {
            size_t b = p->i;
            if (numeric_array(p, 0) != 0) {
                return -1;
            }
            if (tensor < p->max) {
                p->spans[tensor].begin = b;
                p->spans[tensor].end   = p->i;
            }
        } else if (value(p, is_inputs ? W_INPUTS : W_OTHER, depth + 1) != 0) {
            return -1;
        }
        int end = after_member(p, '}');
        if (end != 0) {
            return end > 0 ? 0 : -1;
        }
    }
}

static int array(jd *p, enum where w, int depth)
{
    if (opened_empty(p, ']')) {
        return 0;
    }
    for (;;) {
        skip_ws(p);
        enum where in = W_OTHER;
        if (w == W_INPUTS) {
            p->n_inputs++; // the tensor's index is n_inputs - 1 (also when it is no object)
            in = W_TENSOR;
        }
        if (value(p, in, depth + 1) != 0) {
            return -1;
        }
        int end = after_member(p, ']');
        if (end != 0) {
            return end > 0 ? 0 : -1;
        }
    }
}

static int literal(jd *p, const char *word)
{
    size_t k = strlen(word);
    if (p->n - p->i < k || memcmp(p->s + p->i, word, k) != 0) {
        return -1;
    }
    p->i += k;
    return 0;
}

static int value(jd *p, enum where w, int depth)
{
    if (depth > JD_MAX_DEPTH || p->i >= p->n) {
        return -1;
    }
    size_t b, e;
    bool   plain;
    switch (p->s[p->i]) {
    case '{':
        return object(p, w == W_ROOT || w == W_TENSOR ? w : W_OTHER, depth);
    case '[':
        return array(p, w == W_INPUTS ? W_INPUTS : W_OTHER, depth);
    case '"':
        return string(p, &b, &e, &plain);
    case 't':
        return literal(p, "true");
    case 'f':
        return literal(p, "false");
    case 'n':
        return literal(p, "null");
    default:
        return number(p);
    }
}

int ddl_fmt_jdata_spans(const char *json, size_t len, ddl_fmt_jspan *spans, size_t max)
{
    jd p = {.s = json, .n = len, .spans = spans, .max = max};
    for (size_t k = 0; k < max; k++) {
        spans[k].begin = spans[k].end = 0;
    }
    skip_ws(&p);
    if (p.i >= p.n || p.s[p.i] != '{' || value(&p, W_ROOT, 0) != 0) {
        return -1;
    }
    skip_ws(&p);
    if (p.i != p.n) {
        return -1;
    }
    return 0;
}

size_t ddl_fmt_jdata_cut(const char *json, size_t len, const ddl_fmt_jspan *spans, size_t n,
                         char *out)
{
    size_t at = 0, k = 0; // read and write positions
    for (;;) {
        // the next non-empty span at or after `at` (n is small: a scan per span)
        const ddl_fmt_jspan *next = NULL;
        for (size_t i = 0; i < n; i++) {
            if (spans[i].end > spans[i].begin && spans[i].begin >= at &&
                (next == NULL || spans[i].begin < next->begin)) {
                next = &spans[i];
            }
        }
        size_t upto = next != NULL ? next->begin : len;
        memcpy(out + k, json + at, upto - at);
        k += upto - at;
        if (next == NULL) {
            return k;
        }
        out[k++] = '0';
        at       = next->end;
    }
}

// 10^k for k = 0..22, each exact in a double.
static const double pow10_exact[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                     1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                     1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

// The number at s[0..len) (checked by the grammar above) as jansson reads it: an integer
// (no fraction, no exponent) must fit in long long, and its value is (double) of it; a real
// is strtod's, declined when it overflows. Reals of at most 15 significant digits and a
// decimal exponent within +-22 take Clinger's fast path: one correctly rounded operation
// on exact operands, so the same bits as strtod.
static int to_double(const char *s, size_t len, bool integer, long long ll, double *out)
{
    if (integer) {
        *out = (double)ll;
        return 0;
    }
    uint64_t m = 0;
    int      digits = 0, exp10 = 0;
    size_t   i      = 0;
    bool     neg    = s[0] == '-';
    if (neg) {
        i++;
    }
    for (; i < len && is_digit(s[i]); i++) {
        if (m != 0 || s[i] != '0') {
            digits++;
        }
        m = m * 10 + (uint64_t)(s[i] - '0');
        if (digits > 15) {
            goto slow;
        }
    }
    if (i < len && s[i] == '.') {
        for (i++; i < len && is_digit(s[i]); i++) {
            if (m != 0 || s[i] != '0') {
                digits++;
            }
            m = m * 10 + (uint64_t)(s[i] - '0');
            exp10--;
            if (digits > 15) {
                goto slow;
            }
        }
    }
    if (i < len) { // the exponent
        i++;
        bool eneg = s[i] == '-';
        if (s[i] == '+' || s[i] == '-') {
            i++;
        }
        int e = 0;
        for (; i < len; i++) {
            if (e > 1000) {
                goto slow;
            }
            e = e * 10 + (s[i] - '0');
        }
        exp10 += eneg ? -e : e;
    }
    if (exp10 < -22 || exp10 > 22) {
        goto slow;
    }
    double v = (double)m; // exact: m < 10^15 < 2^53
    v        = exp10 < 0 ? v / pow10_exact[-exp10] : v * pow10_exact[exp10];
    *out     = neg ? -v : v;
    return 0;
slow:;
    char  buf[512];
    char *end;
    if (len >= sizeof buf) {
        return -1; // a number this long: the slow path reads it
    }
    memcpy(buf, s, len);
    buf[len] = '\0';
    errno    = 0;
    double d = strtod(buf, &end);
    if (end != buf + len || ((d == HUGE_VAL || d == -HUGE_VAL) && errno == ERANGE)) {
        return -1;
    }
    *out = d;
    return 0;
}

// An integer token as long long, declined past its range (jansson's "too big integer").
static int to_ll(const char *s, size_t len, long long *out)
{
    size_t             i   = s[0] == '-' ? 1 : 0;
    unsigned long long lim = i ? (unsigned long long)LLONG_MAX + 1 : (unsigned long long)LLONG_MAX;
    unsigned long long v   = 0;
    for (; i < len; i++) {
        unsigned d = (unsigned)(s[i] - '0');
        if (v > (lim - d) / 10) {
            return -1;
        }
        v = v * 10 + d;
    }
    *out = s[0] == '-' ? (long long)(0 - v) : (long long)v;
    return 0;
}

int ddl_fmt_jdata_convert(const char *json, ddl_fmt_jspan span, ddl_fmt_jtype type, void *dst,
                          size_t cap, size_t *count)
{
    size_t n = 0;
    for (size_t i = span.begin; i < span.end;) {
        char c = json[i];
        if (c != '-' && !is_digit(c)) {
            i++; // brackets, commas, white space
            continue;
        }
        size_t b       = i;
        bool   integer = true;
        while (i < span.end && (is_digit(json[i]) || json[i] == '-' || json[i] == '+' ||
                                json[i] == '.' || json[i] == 'e' || json[i] == 'E')) {
            integer = integer && json[i] != '.' && json[i] != 'e' && json[i] != 'E';
            i++;
        }
        if (n == cap) {
            return -1;
        }
        long long ll = 0;
        if (integer && to_ll(json + b, i - b, &ll) != 0) {
            return -1;
        }
        switch (type) {
        case DDL_FMT_J_F32:
        case DDL_FMT_J_F64: {
            double v;
            if (to_double(json + b, i - b, integer, ll, &v) != 0) {
                return -1;
            }
            if (type == DDL_FMT_J_F32) {
                ((float *)dst)[n] = (float)v;
            } else {
                ((double *)dst)[n] = v;
            }
            break;
        }
        case DDL_FMT_J_I64:
            if (!integer) {
                return -1;
            }
            ((int64_t *)dst)[n] = ll;
            break;
        case DDL_FMT_J_U64:
            if (!integer || ll < 0) {
                return -1;
            }
            ((uint64_t *)dst)[n] = (uint64_t)ll;
            break;
        case DDL_FMT_J_I32:
            if (!integer || ll < INT32_MIN || ll > INT32_MAX) {
                return -1;
            }
            ((int32_t *)dst)[n] = (int32_t)ll;
            break;
        case DDL_FMT_J_U32:
            if (!integer || ll < 0 || ll > (long long)UINT32_MAX) {
                return -1;
            }
            ((uint32_t *)dst)[n] = (uint32_t)ll;
            break;
        default:
            return -1;
        }
        n++;
    }
    *count = n;
    return 0;
}

size_t ddl_fmt_jdata_count(const char *json, ddl_fmt_jspan span)
{
    size_t n = 0;
    bool   in = false;
    for (size_t i = span.begin; i < span.end; i++) {
        bool num = json[i] == '-' || is_digit(json[i]) || json[i] == '+' || json[i] == '.' ||
                   json[i] == 'e' || json[i] == 'E';
        n += num && !in;
        in = num;
    }
    return n;
}
