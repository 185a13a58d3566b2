// ddl_fmt_jdata (src/format/jdata.c), the fast reading of KServe REST tensor data, against
// jansson's tree read the way the daemon's tree path reads it (tests/support/jdata_ref.h):
//  - where the spans are found and where not: data under inputs[i] only (not in outputs,
//    the root, strings, or behind an escaped key), tensors counted when they are no
//    objects, arrays nested up to 32 levels inside data and not 33, malformed texts;
//  - cutting the spans keeps the text JSON with every other value, each span down to "0";
//  - every contents type converts the same bits as the tree path, or declines where the
//    tree path refuses: hand-picked numbers (signed zeros, denormals, the int64 and uint32
//    edges, overflow and underflow, long mantissas) and 200,000 random ones in every
//    JSON form.
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jdata_ref.h"
#include "test.h"

#define MAXI 16

static const ddl_fmt_jtype all_types[] = {DDL_FMT_J_F32, DDL_FMT_J_F64, DDL_FMT_J_I64,
                                          DDL_FMT_J_U64, DDL_FMT_J_I32, DDL_FMT_J_U32};

// Every span of text against the tree, for every type: the same values, or both refuse.
// Returns the spans found.
static int agree(const char *text)
{
    size_t        len = strlen(text);
    ddl_fmt_jspan sp[MAXI];
    json_t       *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, NULL);
    if (ddl_fmt_jdata_spans(text, len, sp, MAXI) != 0) {
        return -1;
    }
    ASSERT_TRUE(root != NULL || strstr(text, "\"data\"") != NULL); // found spans: JSON
    char  *copy = malloc(len + 1);
    size_t clen = ddl_fmt_jdata_cut(text, len, sp, MAXI, copy), cut = 0;
    int    found = 0;
    for (int i = 0; i < MAXI; i++) {
        if (sp[i].end == sp[i].begin) {
            continue;
        }
        found++;
        ASSERT_TRUE(text[sp[i].begin] == '[' && text[sp[i].end - 1] == ']');
        cut += sp[i].end - sp[i].begin - 1;
        json_t *d = root != NULL ? jref_data(root, (size_t)i) : NULL;
        size_t  cap = ddl_fmt_jdata_count(text, sp[i]);
        for (size_t k = 0; k < sizeof all_types / sizeof all_types[0]; k++) {
            ddl_fmt_jtype  t  = all_types[k];
            unsigned char *a  = calloc(cap + 1, 8), *b = calloc(cap + 1, 8);
            size_t         na = 0, nb = 0;
            int            ra = ddl_fmt_jdata_convert(text, sp[i], t, a, cap, &na);
            bool           rb = root != NULL && d != NULL && jref_flatten(d, t, b, cap, &nb, 0);
            if (ra == 0 && !rb) {
                TEST_FAIL_("type %d: the fast read took what the tree refuses: %s", (int)t, text);
            }
            if (ra == 0 && (na != nb || memcmp(a, b, na * jref_size(t)) != 0)) {
                TEST_FAIL_("type %d: %zu values against the tree's %zu, or other bits: %s",
                           (int)t, na, nb, text);
            }
            free(a);
            free(b);
        }
    }
    if (root != NULL) {
        json_t *r2 = json_loadb(copy, clen, JSON_REJECT_DUPLICATES, NULL);
        ASSERT_TRUE(r2 != NULL);
        for (int i = 0; i < MAXI; i++) { // the cut data reads as 0, the rest unchanged
            if (sp[i].end > sp[i].begin) {
                json_t *z = jref_data(r2, (size_t)i);
                ASSERT_TRUE(json_is_integer(z) && json_integer_value(z) == 0);
                json_object_set(json_array_get(json_object_get(r2, "inputs"), (size_t)i), "data",
                                jref_data(root, (size_t)i));
            }
        }
        ASSERT_TRUE(json_equal(root, r2));
        json_decref(r2);
    }
    ASSERT_EQ(clen, len - cut); // each span down to one character, nothing else
    free(copy);
    json_decref(root);
    return found;
}

static void test_where(void)
{
    ASSERT_EQ(agree("{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[2,2],"
                    "\"data\":[[1.5,-2],[3e2,0.1]]}]}"),
              1);
    ASSERT_EQ(agree("{\"id\": \"a\", \"inputs\" : [ {\"data\" : [ 1 , 2 ,\n 3 ] , \"datatype\": "
                    "\"INT64\"} , {\"name\": \"y\", \"data\": [[[4]], [], [5]]} ]}"),
              2);
    // a tensor that is no object still counts; data elsewhere does not
    ddl_fmt_jspan sp[MAXI];
    const char   *t = "{\"outputs\":[{\"data\":[1]}],\"data\":[2],\"inputs\":[7,{\"data\":[3]}]}";
    ASSERT_EQ(ddl_fmt_jdata_spans(t, strlen(t), sp, MAXI), 0);
    ASSERT_TRUE(sp[0].end == sp[0].begin && sp[1].end > sp[1].begin);
    ASSERT_EQ(agree(t), 1);
    // inside strings, behind an escaped key, or a key with an escaped quote
    ASSERT_EQ(agree("{\"id\":\"\\\"inputs\\\":[{\\\"data\\\":[1]}]\",\"inputs\":[{\"na\\\"me\":1}]}"),
              0);
    ASSERT_EQ(agree("{\"inputs\":[{\"d\\u0061ta\":[1,2]}]}"), 0);
    ASSERT_EQ(agree("{\"inputs\":[{\"data\":\"[1,2]\"}]}"), 0);
    // nesting: 33 levels of arrays (32 inside data) are read, 34 are declined
    char deep[256];
    for (int levels = 33; levels <= 34; levels++) {
        int n = snprintf(deep, sizeof deep, "{\"inputs\":[{\"data\":");
        for (int k = 0; k < levels; k++) {
            deep[n++] = '[';
        }
        deep[n++] = '1';
        for (int k = 0; k < levels; k++) {
            deep[n++] = ']';
        }
        snprintf(deep + n, sizeof deep - (size_t)n, "}]}");
        ASSERT_EQ(agree(deep), levels == 33 ? 1 : -1);
    }
    // not JSON, or data holding something else: declined
    const char *bad[] = {
        "",
        "[]",
        "{\"inputs\":[{\"data\":[1,]}]}",
        "{\"inputs\":[{\"data\":[01]}]}",
        "{\"inputs\":[{\"data\":[1.]}]}",
        "{\"inputs\":[{\"data\":[.5]}]}",
        "{\"inputs\":[{\"data\":[1e]}]}",
        "{\"inputs\":[{\"data\":[+1]}]}",
        "{\"inputs\":[{\"data\":[true]}]}",
        "{\"inputs\":[{\"data\":[null]}]}",
        "{\"inputs\":[{\"data\":[\"1\"]}]}",
        "{\"inputs\":[{\"data\":[1]}]} x",
        "{\"inputs\":[{\"data\":[1]}]",
        "{\"inputs\":[{\"data\":[1] \"x\":1}]}",
        "{\"inputs\":[{\"data\":[1]}],}",
        "{\"inputs\":[{\"x\":\"a\nb\", \"data\":[1]}]}",
        "{\"inputs\":[{\"data\":[NaN]}]}",
        "{\"inputs\":[{\"data\":[Infinity]}]}",
        "{\"inputs\":[{\"data\":[1]}], \"x\": tru}",
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        if (ddl_fmt_jdata_spans(bad[k], strlen(bad[k]), sp, MAXI) != -1) {
            TEST_FAIL_("not declined: %s", bad[k]);
        }
    }
}

static void check_numbers(const char *const *nums, size_t n)
{
    char text[16384];
    for (size_t k = 0; k < n; k++) {
        snprintf(text, sizeof text, "{\"inputs\":[{\"data\":[%s]}]}", nums[k]);
        ASSERT_EQ(agree(text), 1);
    }
}

static void test_numbers(void)
{
    const char *nums[] = {
        "0", "-0", "0.0", "-0.0", "1", "-1", "0.1", "-0.1", "1e0", "1E+2", "1e-2", "123456789012345",
        "1234567890123456", "12345678901234567", "0.30000000000000004", "3.4028234663852886e38",
        "3.4028235677973366e38", "1e39", "-1e39", "1.401298464324817e-45", "7e-46",
        "4.9406564584124654e-324", "2.4703282292062327e-324", "2.4703282292062328e-324",
        "1e-400", "-1e-400", "1.7976931348623157e308", "1.7976931348623159e308", "1e309",
        "9007199254740993", "9007199254740993.0", "9223372036854775807", "9223372036854775808",
        "-9223372036854775808", "-9223372036854775809", "4294967295", "4294967296", "2147483647",
        "2147483648", "-2147483648", "-2147483649", "255", "1e22", "1e23", "123456789012345e-22",
        "123456789012345e-23", "0.000001", "1.5e-5", "100000000000000000000000",
        "0.1000000000000000055511151231257827021181583404541015625", "2.5e-08",
        "12.5,-3,4e1", "[1,2],[3,[4,5]]", "1,1.0,1e0,10e-1",
    };
    check_numbers(nums, sizeof nums / sizeof nums[0]);
    // random numbers in every JSON form: integers of 1-20 digits, fractions, exponents
    unsigned long long seed = 42;
    char               buf[64];
    const char        *one[1];
    for (int k = 0; k < 200000; k++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        unsigned long long r = seed >> 11;
        int                o = 0;
        if (r & 1) {
            buf[o++] = '-';
        }
        int ndig = 1 + (int)((r >> 1) % 20);
        for (int d = 0; d < ndig; d++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            int c = (int)((seed >> 33) % 10);
            buf[o++] = (char)('0' + (d == 0 && ndig > 1 && c == 0 ? 1 : c));
        }
        if ((r >> 6) & 1) {
            buf[o++] = '.';
            int nf = 1 + (int)((r >> 7) % 18);
            for (int d = 0; d < nf; d++) {
                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                buf[o++] = (char)('0' + (seed >> 33) % 10);
            }
        }
        if ((r >> 12) & 1) {
            o += snprintf(buf + o, sizeof buf - (size_t)o, "%s%d", (r >> 13) & 1 ? "e-" : "e",
                          (int)((r >> 14) % 340));
        }
        buf[o] = '\0';
        one[0] = buf;
        check_numbers(one, 1);
    }
    // a long run of %.9g floats, as clients print them
    static char many[16384];
    int         o = 0;
    for (int k = 0; k < 784 && o < 16000; k++) {
        o += snprintf(many + o, sizeof many - (size_t)o, "%s%.9g", k ? "," : "",
                      (double)(float)sin(k * 0.37) * pow(10.0, (k % 11) - 5));
    }
    one[0] = many;
    check_numbers(one, 1);
}

int main(void)
{
    test_where();
    test_numbers();
    printf("test_jdata: ok\n");
    return 0;
}
