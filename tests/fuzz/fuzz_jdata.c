// tests/fuzz/fuzz_jdata.c: bytes -> the fast reading of KServe REST tensor data
// (src/format/jdata.c), differentially against jansson's tree read the way the daemon's
// tree path reads it (tests/support/jdata_ref.h). Whenever the spans are found, the text
// is JSON, cutting them out keeps it JSON with every other value the same, and every contents
// type converts to the tree's bits or declines where the tree refuses. Any disagreement
// aborts.
#include <stdlib.h>
#include <string.h>

#include "jdata_ref.h"

#define MAXI 16

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char   *text = (const char *)data;
    ddl_fmt_jspan sp[MAXI];
    if (ddl_fmt_jdata_spans(text, size, sp, MAXI) != 0) {
        return 0;
    }
    json_t *root = json_loadb(text, size, JSON_REJECT_DUPLICATES, NULL);
    char   *copy = malloc(size + 1);
    if (copy == NULL) {
        abort();
    }
    size_t              clen     = ddl_fmt_jdata_cut(text, size, sp, MAXI, copy);
    const ddl_fmt_jtype types[] = {DDL_FMT_J_F32, DDL_FMT_J_F64, DDL_FMT_J_I64,
                                   DDL_FMT_J_U64, DDL_FMT_J_I32, DDL_FMT_J_U32};
    bool all_read = true; // every span converts under some type
    for (size_t i = 0; i < MAXI; i++) {
        if (sp[i].end == sp[i].begin) {
            continue;
        }
        bool read = false;
        if (sp[i].end > size || text[sp[i].begin] != '[' || text[sp[i].end - 1] != ']') {
            abort();
        }
        json_t *d   = root != NULL ? jref_data(root, i) : NULL;
        size_t  cap = ddl_fmt_jdata_count(text, sp[i]);
        for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
            unsigned char *a = calloc(cap + 1, 8), *b = calloc(cap + 1, 8);
            size_t         na = 0, nb = 0;
            if (a == NULL || b == NULL) {
                abort();
            }
            int  ra = ddl_fmt_jdata_convert(text, sp[i], types[k], a, cap, &na);
            read    = read || ra == 0;
            bool rb = d != NULL && jref_flatten(d, types[k], b, cap, &nb, 0);
            // Where the tree has no such data (a duplicate key refused the text, say) the
            // daemon never uses the fast read's values.
            if (d != NULL && ra == 0 &&
                (!rb || na != nb || memcmp(a, b, na * jref_size(types[k])) != 0)) {
                abort();
            }
            free(a);
            free(b);
        }
        all_read = all_read && read;
    }
    // The cut text parses when the original does, to the same tree but data. It may also
    // parse where the original does not, but only for a number jansson refuses (an
    // integer past int64, a real that overflows) inside a span, which then converts under
    // no type, so the daemon takes the tree path and its error.
    json_t *r2 = json_loadb(copy, clen, JSON_REJECT_DUPLICATES, NULL);
    if ((root != NULL && r2 == NULL) || (root == NULL && r2 != NULL && all_read)) {
        abort();
    }
    if (root != NULL) {
        for (size_t i = 0; i < MAXI; i++) {
            if (sp[i].end > sp[i].begin) {
                json_t *z = jref_data(r2, i);
                if (!json_is_integer(z) || json_integer_value(z) != 0) {
                    abort();
                }
                json_object_set(json_array_get(json_object_get(r2, "inputs"), i), "data",
                                jref_data(root, i));
            }
        }
        if (!json_equal(root, r2)) {
            abort();
        }
    }
    json_decref(r2);
    json_decref(root);
    free(copy);
    return 0;
}
