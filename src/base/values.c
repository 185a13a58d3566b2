#include "ddl/base.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// A branch-free pass first (it vectorizes: 5.5 us for a LeNet-5 batch of 64), the search
// only when it found one; no allocation.
int64_t ddl_first_nonfinite(const void *values, int64_t n, size_t item)
{
    const unsigned char *raw = values;
    unsigned             bad = 0;
    if (item == 4) {
        for (int64_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, raw + (size_t)i * 4, 4);
            bad |= (u & 0x7f800000u) == 0x7f800000u;
        }
    } else {
        for (int64_t i = 0; i < n; i++) {
            uint64_t u;
            memcpy(&u, raw + (size_t)i * 8, 8);
            bad |= (u & 0x7ff0000000000000u) == 0x7ff0000000000000u;
        }
    }
    if (!bad) {
        return -1;
    }
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(ddl_value_at(raw, i, item))) {
            return i;
        }
    }
    return -1;
}

double ddl_value_at(const void *values, int64_t i, size_t item)
{
    const unsigned char *raw = values;
    if (item == 4) {
        float f;
        memcpy(&f, raw + (size_t)i * 4, 4);
        return f;
    }
    double v;
    memcpy(&v, raw + (size_t)i * 8, 8);
    return v;
}

void ddl_shape_text(const int64_t *d, size_t n, char *buf, size_t len)
{
    if (len == 0) {
        return;
    }
    size_t o = (size_t)snprintf(buf, len, "[");
    for (size_t i = 0; i < n && o < len; i++) {
        o += (size_t)snprintf(buf + o, len - o, i ? ", %lld" : "%lld", (long long)d[i]);
    }
    if (o < len) {
        snprintf(buf + o, len - o, "]");
    }
}

bool ddl_parse_bytes(const char *text, double *out)
{
    if (text == NULL) {
        return false;
    }
    // strtod also skips leading space and takes signs, "inf", "nan" and hex: a count
    // starts with a digit or a point and has no x, n or i.
    if (!((text[0] >= '0' && text[0] <= '9') || text[0] == '.') ||
        strpbrk(text, "xXnNiI") != NULL) {
        return false;
    }
    char  *end;
    double v = strtod(text, &end);
    if (end == text || !isfinite(v) || v < 0) {
        return false;
    }
    if (*end != '\0') {
        static const char units[] = "KMGT";
        const char       *u       = memchr(units, *end & ~0x20, sizeof units - 1);
        if (u == NULL || end[1] != '\0') {
            return false;
        }
        for (const char *k = units; k <= u; k++) {
            v *= 1024.0;
        }
    }
    *out = v;
    return true;
}
