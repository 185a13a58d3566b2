// tests/support/jdata_ref.h: the reference that ddl_fmt_jdata (src/format/jdata.c) must
// agree with: a JSON tree's inputs[i].data, flattened by jansson the way the daemon's
// tree path does (server/http.c, flatten/flat_push), for test_jdata and fuzz_jdata.
#ifndef DDL_TEST_JDATA_REF_H
#define DDL_TEST_JDATA_REF_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "ddl/format.h"

// Element size of a contents type.
static inline size_t jref_size(ddl_fmt_jtype t)
{
    return t == DDL_FMT_J_F32 || t == DDL_FMT_J_I32 || t == DDL_FMT_J_U32 ? 4 : 8;
}

// Appends x (a number, or arrays of them) to out as type t, as the tree path would; false
// where the tree path refuses a value (or past cap elements, or 32 levels deep).
static inline bool jref_flatten(json_t *x, ddl_fmt_jtype t, unsigned char *out, size_t cap,
                                size_t *n, int depth)
{
    if (json_is_array(x)) {
        if (depth > 32) {
            return false;
        }
        size_t  i;
        json_t *e;
        json_array_foreach(x, i, e)
        {
            if (!jref_flatten(e, t, out, cap, n, depth + 1)) {
                return false;
            }
        }
        return true;
    }
    if (*n == cap) {
        return false;
    }
    unsigned char *at = out + *n * jref_size(t);
    if (t == DDL_FMT_J_F32 || t == DDL_FMT_J_F64) {
        if (!json_is_number(x)) {
            return false;
        }
        double v = json_number_value(x);
        if (t == DDL_FMT_J_F32) {
            float f = (float)v;
            memcpy(at, &f, 4);
        } else {
            memcpy(at, &v, 8);
        }
        (*n)++;
        return true;
    }
    if (!json_is_integer(x)) {
        return false;
    }
    json_int_t v = json_integer_value(x);
    if ((t == DDL_FMT_J_U64 || t == DDL_FMT_J_U32) && v < 0) {
        return false;
    }
    if (t == DDL_FMT_J_I64 || t == DDL_FMT_J_U64) {
        int64_t w = (int64_t)v;
        memcpy(at, &w, 8);
    } else if (t == DDL_FMT_J_U32) {
        if (v > (json_int_t)UINT32_MAX) {
            return false;
        }
        uint32_t w = (uint32_t)v;
        memcpy(at, &w, 4);
    } else {
        if (v < INT32_MIN || v > INT32_MAX) {
            return false;
        }
        int32_t w = (int32_t)v;
        memcpy(at, &w, 4);
    }
    (*n)++;
    return true;
}

// root.inputs[i].data of a tree (NULL: none).
static inline json_t *jref_data(json_t *root, size_t i)
{
    json_t *in = json_object_get(root, "inputs");
    json_t *t  = json_is_array(in) ? json_array_get(in, i) : NULL;
    return json_is_object(t) ? json_object_get(t, "data") : NULL;
}

#endif // DDL_TEST_JDATA_REF_H
