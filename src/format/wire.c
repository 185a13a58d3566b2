// format/wire.c: the WeightChunk message decoded in place from its slices (ddl/format.h).
// The daemon's PushWeights (server/requests.c) and the client's PullWeights
// (client/src/trainer.c) both go through it.
#include <string.h>

#include "base/check.h"
#include "ddl/format.h"

const uint8_t *ddl_fmt_span_seg(const void *spans, size_t i, size_t *len)
{
    const ddl_fmt_span *s = spans;
    *len                  = s[i].n;
    return s[i].p;
}

// Moves past exhausted slices; true at the end of the message.
static bool cur_end(ddl_fmt_cursor *c)
{
    size_t len;
    while (c->i < c->n && (c->seg(c->segs, c->i, &len), c->pos >= len)) {
        c->i++;
        c->pos = 0;
    }
    return c->i >= c->n;
}

static bool cur_byte(ddl_fmt_cursor *c, uint8_t *b)
{
    size_t len;
    if (cur_end(c)) {
        return false;
    }
    *b = c->seg(c->segs, c->i, &len)[c->pos++];
    c->off++;
    return true;
}

// A varint of at most 10 bytes. False: truncated or longer.
static bool cur_varint(ddl_fmt_cursor *c, uint64_t *v)
{
    *v = 0;
    for (int sh = 0; sh < 64; sh += 7) {
        uint8_t b;
        if (!cur_byte(c, &b)) {
            return false;
        }
        *v |= (uint64_t)(b & 0x7f) << sh;
        if ((b & 0x80) == 0) {
            return true;
        }
    }
    return false;
}

bool ddl_fmt_cursor_take(ddl_fmt_cursor *c, void *dst, size_t len)
{
    uint8_t *d = dst;
    while (len > 0) {
        if (cur_end(c)) {
            return false;
        }
        size_t         have;
        const uint8_t *p     = c->seg(c->segs, c->i, &have);
        size_t         avail = have - c->pos;
        size_t         k     = avail < len ? avail : len;
        if (d != NULL) {
            memcpy(d, p + c->pos, k);
            d += k;
        }
        c->pos += k;
        c->off += k;
        len -= k;
    }
    return true;
}

// A length-delimited string into dst (cap bytes with its NUL). One that does not fit is
// skipped and *too_long set; one holding a NUL byte is refused.
static ddl_status cur_string(ddl_fmt_cursor *c, const char *field, char *dst, size_t cap,
                             bool *too_long)
{
    uint64_t len;
    DDL_REQUIRE(cur_varint(c, &len), DDL_EPROTO, "WeightChunk: %s: truncated length", field);
    *too_long = len >= cap;
    dst[0]    = '\0';
    if (*too_long) {
        DDL_REQUIRE(ddl_fmt_cursor_take(c, NULL, (size_t)len), DDL_EPROTO,
                    "WeightChunk: %s: %llu bytes, the message ends first", field,
                    (unsigned long long)len);
        return DDL_OK;
    }
    DDL_REQUIRE(ddl_fmt_cursor_take(c, dst, (size_t)len), DDL_EPROTO,
                "WeightChunk: %s: %llu bytes, the message ends first", field,
                (unsigned long long)len);
    dst[len] = '\0';
    DDL_REQUIRE(memchr(dst, 0, (size_t)len) == NULL, DDL_EPROTO,
                "WeightChunk: %s: a string holding a NUL byte is not accepted", field);
    return DDL_OK;
}

static void shape_add(ddl_fmt_wchunk *w, uint64_t v)
{
    if (w->nshape < DDL_FMT_MAX_DIMS) {
        w->shape[w->nshape++] = (int64_t)v;
    } else {
        w->shape_long = true;
    }
}

ddl_status ddl_fmt_wchunk_decode(ddl_fmt_seg_fn seg, const void *segs, size_t n, ddl_fmt_wchunk *w)
{
    memset(w, 0, sizeof *w);
    ddl_fmt_cursor c = {.seg = seg, .segs = segs, .n = n};
    while (!cur_end(&c)) {
        uint64_t key, v;
        size_t   at = c.off;
        DDL_REQUIRE(cur_varint(&c, &key), DDL_EPROTO, "WeightChunk: truncated key at byte %zu", at);
        unsigned field = (unsigned)(key >> 3), wt = (unsigned)(key & 7);
        bool     ok;
        if (field == 1 && wt == 2) {
            DDL_CHECK(cur_string(&c, "name", w->name, sizeof w->name, &w->name_long));
            ok = true;
        } else if (field == 2 && wt == 2) {
            DDL_CHECK(
                cur_string(&c, "datatype", w->datatype, sizeof w->datatype, &w->datatype_long));
            ok = true;
        } else if (field == 3 && wt == 2) { // packed shape
            ok          = cur_varint(&c, &v);
            size_t stop = c.off + (size_t)v;
            ok          = ok && v <= SIZE_MAX - c.off;
            while (ok && c.off < stop) {
                ok = cur_varint(&c, &v);
                shape_add(w, v);
            }
            ok = ok && c.off == stop;
        } else if (field == 3 && wt == 0) {
            ok = cur_varint(&c, &v);
            shape_add(w, v);
        } else if (field == 4 && wt == 0) {
            ok        = cur_varint(&c, &v);
            w->offset = (int64_t)v;
        } else if (field == 5 && wt == 2) {
            ok          = cur_varint(&c, &v);
            w->data     = c;
            w->data_len = (size_t)v;
            ok          = ok && ddl_fmt_cursor_take(&c, NULL, (size_t)v);
        } else if (field == 6 && wt == 0) {
            ok       = cur_varint(&c, &v);
            w->first = v != 0;
        } else if (field != 0 && wt == 0) { // unknown fields are skipped
            ok = cur_varint(&c, &v);
        } else if (field != 0 && wt == 1) {
            ok = ddl_fmt_cursor_take(&c, NULL, 8);
        } else if (field != 0 && wt == 2) {
            ok = cur_varint(&c, &v) && ddl_fmt_cursor_take(&c, NULL, (size_t)v);
        } else if (field != 0 && wt == 5) {
            ok = ddl_fmt_cursor_take(&c, NULL, 4);
        } else {
            return ddl_set_error(DDL_EPROTO,
                                 "WeightChunk: field %u of wire type %u at byte %zu is not "
                                 "protobuf",
                                 field, wt, at);
        }
        DDL_REQUIRE(ok, DDL_EPROTO, "WeightChunk: field %u at byte %zu is truncated", field, at);
    }
    return DDL_OK;
}
