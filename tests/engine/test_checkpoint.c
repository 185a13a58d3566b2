// tests/engine/test_checkpoint.c: checkpoints (save, load, resharding onto other
// layouts, `latest`, crash safety, corruption), safetensors and .npy exports.
// Runs at 1, 2 and 4 ranks. Every value is a small multiple of 1/4, exact in f32, so
// every comparison is bitwise.
#define _GNU_SOURCE // nftw
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ddl/base.h"
#include "ddl/checkpoint.h"
#include "ddl/decomp.h"
#include "mpi_test.h"

#define NT 5
#define SENTINEL -999.0

static int rank_, size_;

static const char *SPEC         = "{\"layers\": [{\"type\": \"linear\", \"in\": 7, \"out\": 10}]}";
static const char *USER         = "{\"lr\": 0.5, \"cursor\": {\"epoch\": 2, \"index\": 640}}";
static const char *USER_COMPACT = "{\"lr\":0.5,\"cursor\":{\"epoch\":2,\"index\":640}}";

typedef struct tspec {
    const char *name;
    ddl_dtype   dt;
    int         ndim;
    int64_t     d[3];
} tspec;

static const tspec specs[NT] = {
    {"fc1.weight", DDL_F32, 2, {10, 7}},    {"fc1.bias", DDL_F64, 1, {13}},
    {"conv.weight", DDL_F64, 3, {6, 5, 3}}, {"bn.running_mean", DDL_F32, 1, {3}},
    {"head.weight", DDL_F32, 2, {4, 4}},
};

// A: the "written" layout: split along dim 0 / dim 1, one tensor replicated on every
//    rank, one held by rank 0 only.
// B: a different partitioning: transposed splits, a reversed rank order, a 2x2 grid at
//    4 ranks, a split leaving one rank empty.
// ROOT: everything on rank 0, empty boxes elsewhere.
typedef enum { LAYOUT_A, LAYOUT_B, LAYOUT_ROOT } layout;

static ddl_box empty_box(const ddl_shape *g)
{
    ddl_box b = ddl_box_full(g);
    b.stop[0] = 0;
    return b;
}

static ddl_box layout_box(layout L, int k, const ddl_shape *g)
{
    int P = size_, r = rank_;
    int ps[3] = {1, 1, 1}, ix[3] = {0, 0, 0};
    switch (L) {
    case LAYOUT_ROOT:
        return r == 0 ? ddl_box_full(g) : empty_box(g);
    case LAYOUT_A:
        if (k == 3) {
            return ddl_box_full(g); // replicated
        }
        if (k == 4) {
            return r == 0 ? ddl_box_full(g) : empty_box(g);
        }
        if (k == 2) {
            ps[1] = P; // [1, P, 1]
            ix[1] = r;
        } else {
            ps[0] = P; // [P, 1] and [P]
            ix[0] = r;
        }
        return ddl_decomp_box(g, ps, ix);
    case LAYOUT_B:
        if (k == 0 && P == 4) {
            ps[0] = ps[1] = 2; // [2, 2]
            ix[0]         = r / 2;
            ix[1]         = r % 2;
        } else if (k == 0) {
            ps[1] = P; // [1, P]
            ix[1] = r;
        } else if (k == 1) {
            ps[0] = P; // reversed rank order
            ix[0] = P - 1 - r;
        } else {
            ps[0] = P; // [P, 1, 1], [P] (3 over 4 leaves rank 3 empty), [P, 1]
            ix[0] = r;
        }
        return ddl_decomp_box(g, ps, ix);
    }
    return ddl_box_full(g);
}

// The value of global element (tensor k, flat index gi) in a state labelled `seed`.
static double value(int seed, int k, int64_t gi)
{
    return seed * 100000.0 + k * 1000.0 + (double)gi + 0.25;
}

// Calls fn(local flat index, global flat index) over a tensor's box.
static int64_t global_index(const ddl_named_tensor *t, int64_t li)
{
    ddl_shape bs = ddl_box_shape(&t->box);
    int64_t   gi = 0, rem = li;
    int64_t   c[DDL_MAX_DIMS];
    for (int d = bs.ndim - 1; d >= 0; d--) {
        c[d] = rem % bs.d[d];
        rem /= bs.d[d];
    }
    for (int d = 0; d < bs.ndim; d++) {
        gi = gi * t->global.d[d] + t->box.start[d] + c[d];
    }
    return gi;
}

// Fresh tensors of a layout, filled with the state `seed` (or SENTINEL when seed < 0).
static void make(layout L, int seed, ddl_named_tensor *t)
{
    for (int k = 0; k < NT; k++) {
        t[k].name        = specs[k].name;
        t[k].global      = ddl_shape_make(specs[k].ndim, specs[k].d);
        t[k].box         = layout_box(L, k, &t[k].global);
        ddl_shape     bs = ddl_box_shape(&t[k].box);
        ddl_tensor_t *l  = NULL;
        ASSERT_OK(ddl_tensor_create(specs[k].dt, &bs, &l));
        for (int64_t i = 0; i < ddl_tensor_numel(l); i++) {
            ddl_tensor_set(l, i, seed < 0 ? SENTINEL : value(seed, k, global_index(&t[k], i)));
        }
        t[k].local = l;
    }
}

static void release(ddl_named_tensor *t)
{
    for (int k = 0; k < NT; k++) {
        ddl_tensor_destroy(&t[k].local);
    }
}

// Bitwise check of every element against the state `seed` (or SENTINEL).
static void expect_values(const ddl_named_tensor *t, int seed)
{
    for (int k = 0; k < NT; k++) {
        const ddl_tensor_t *l = t[k].local;
        for (int64_t i = 0; i < ddl_tensor_numel(l); i++) {
            double want = seed < 0 ? SENTINEL : value(seed, k, global_index(&t[k], i));
            if (l->dtype == DDL_F32) {
                float w = (float)want, got = ((const float *)l->data)[i];
                if (memcmp(&w, &got, sizeof w) != 0) {
                    TEST_FAIL_("%s[%lld]: %.9g, expected %.9g", t[k].name, (long long)i, got, w);
                }
            } else {
                double got = ((const double *)l->data)[i];
                if (memcmp(&want, &got, sizeof want) != 0) {
                    TEST_FAIL_("%s[%lld]: %.17g, expected %.17g", t[k].name, (long long)i, got,
                               want);
                }
            }
        }
    }
}

// ---- file helpers (rank 0) -------------------------------------------------------

static char *slurp(const char *path, long *len)
{
    FILE *f = fopen(path, "rb");
    ASSERT_TRUE(f != NULL);
    fseek(f, 0, SEEK_END);
    *len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)*len + 1);
    ASSERT_TRUE(buf != NULL && fread(buf, 1, (size_t)*len, f) == (size_t)*len);
    buf[*len] = '\0';
    fclose(f);
    return buf;
}

static void spill(const char *path, const char *buf, long len)
{
    FILE *f = fopen(path, "wb");
    ASSERT_TRUE(f != NULL && fwrite(buf, 1, (size_t)len, f) == (size_t)len);
    ASSERT_TRUE(fclose(f) == 0);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void rm_tree(const char *path)
{
    nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static bool path_exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

static void expect_latest(const char *root, const char *want)
{
    if (rank_ == 0) {
        char path[512];
        long len;
        snprintf(path, sizeof path, "%s/latest", root);
        char *text = slurp(path, &len);
        if (strcmp(text, want) != 0) {
            TEST_FAIL_("latest holds '%s', expected '%s'", text, want);
        }
        free(text);
    }
}

static void expect_error_names(const char *what)
{
    if (strstr(ddl_last_error(), what) == NULL) {
        TEST_FAIL_("error message '%s' does not name '%s'", ddl_last_error(), what);
    }
}

static ddl_status save(const char *root, int64_t step, layout L, int seed)
{
    ddl_named_tensor    t[NT];
    ddl_checkpoint_meta meta = {.step = step, .spec_json = SPEC, .user_json = USER};
    make(L, seed, t);
    ddl_status st = ddl_checkpoint_save(MPI_COMM_WORLD, root, &meta, NT, t);
    release(t);
    return st;
}

// Loads path onto layout L and checks the state `seed`, the step and the metadata.
static void load_expect(const char *path, layout L, int64_t step, int seed)
{
    ddl_named_tensor t[NT];
    int64_t          got_step = -1;
    char            *spec = NULL, *user = NULL;
    make(L, -1, t);
    ASSERT_OK(ddl_checkpoint_load(MPI_COMM_WORLD, path, NT, t, &got_step, &spec, &user));
    ASSERT_EQ(got_step, step);
    ASSERT_TRUE(spec != NULL && strcmp(spec, SPEC) == 0);
    if (strcmp(user, USER_COMPACT) != 0) {
        TEST_FAIL_("user_json '%s', expected '%s'", user, USER_COMPACT);
    }
    expect_values(t, seed);
    ddl_free(spec);
    ddl_free(user);
    release(t);
}

// A load that must fail with `want` on every rank, naming `what`, and leave the
// destination tensors untouched.
static void load_refused(const char *path, ddl_status want, const char *what)
{
    ddl_named_tensor t[NT];
    int64_t          step = -7;
    char            *spec = NULL, *user = NULL;
    make(LAYOUT_B, -1, t);
    ASSERT_STATUS(ddl_checkpoint_load(MPI_COMM_WORLD, path, NT, t, &step, &spec, &user), want);
    expect_error_names(what);
    ASSERT_EQ(step, -7);
    ASSERT_TRUE(spec == NULL && user == NULL);
    expect_values(t, -1);
    release(t);
}

// ---- tests -------------------------------------------------------------------------

static void test_save_load(const char *root)
{
    char path[512];
    ASSERT_OK(save(root, 5, LAYOUT_A, 5));
    expect_latest(root, "step-000000005\n");
    if (rank_ == 0) {
        for (int r = 0; r < size_; r++) {
            snprintf(path, sizeof path, "%s/step-000000005/shard-%05d.bin", root, r);
            ASSERT_TRUE(path_exists(path));
        }
        snprintf(path, sizeof path, "%s/step-000000005/manifest.json", root);
        ASSERT_TRUE(path_exists(path));
        snprintf(path, sizeof path, "%s/step-000000005.partial", root);
        ASSERT_TRUE(!path_exists(path));
    }
    // Same layout, then resharded: transposed / reversed / 2x2, and all on rank 0.
    load_expect(root, LAYOUT_A, 5, 5);
    load_expect(root, LAYOUT_B, 5, 5);
    load_expect(root, LAYOUT_ROOT, 5, 5);
    snprintf(path, sizeof path, "%s/step-000000005", root);
    load_expect(path, LAYOUT_B, 5, 5);

    // Written with everything on rank 0, read back split.
    char other[512];
    snprintf(other, sizeof other, "%s/from-root", root);
    ASSERT_OK(save(other, 3, LAYOUT_ROOT, 3));
    load_expect(other, LAYOUT_A, 3, 3);
    load_expect(other, LAYOUT_B, 3, 3);
}

static void test_latest_moves(const char *root)
{
    char path[512];
    ASSERT_OK(save(root, 7, LAYOUT_B, 7));
    expect_latest(root, "step-000000007\n");
    load_expect(root, LAYOUT_A, 7, 7);
    snprintf(path, sizeof path, "%s/step-000000005", root);
    load_expect(path, LAYOUT_ROOT, 5, 5); // the older checkpoint is still intact

    // Saving the same step again replaces it (atomic directory exchange).
    ASSERT_OK(save(root, 7, LAYOUT_ROOT, 8));
    expect_latest(root, "step-000000007\n");
    load_expect(root, LAYOUT_B, 7, 8);
    if (rank_ == 0) {
        snprintf(path, sizeof path, "%s/step-000000007.partial", root);
        ASSERT_TRUE(!path_exists(path));
    }
}

// Failures before any file is written leave `latest` and the directory alone.
static void test_save_refused(const char *root)
{
    char                path[512];
    ddl_named_tensor    t[NT];
    ddl_checkpoint_meta meta = {.step = 12, .spec_json = SPEC, .user_json = "[1, 2]"};
    make(LAYOUT_A, 12, t);
    ASSERT_STATUS(ddl_checkpoint_save(MPI_COMM_WORLD, root, &meta, NT, t), DDL_EINVAL);
    expect_error_names("user_json");
    meta.user_json = USER;
    if (size_ > 1 && rank_ == size_ - 1) {
        t[1].name = "fc1.other"; // one rank disagrees about the tensor list
    }
    ASSERT_STATUS(ddl_checkpoint_save(MPI_COMM_WORLD, root, &meta, NT, t),
                  size_ > 1 ? DDL_EINVAL : DDL_OK);
    t[1].name = specs[1].name;
    // Boxes that do not tile the global tensor (a row is missing).
    t[0].box.stop[0] =
        t[0].box.stop[0] > 0 && rank_ == size_ - 1 ? t[0].box.stop[0] - 1 : t[0].box.stop[0];
    ddl_tensor_t *old = t[0].local;
    ddl_shape     bs  = ddl_box_shape(&t[0].box);
    ASSERT_OK(ddl_tensor_create(DDL_F32, &bs, &t[0].local));
    meta.step = 13;
    ASSERT_STATUS(ddl_checkpoint_save(MPI_COMM_WORLD, root, &meta, NT, t), DDL_EINVAL);
    expect_error_names("fc1.weight");
    ddl_tensor_destroy(&t[0].local);
    t[0].local = old;
    release(t);
    expect_latest(root, size_ > 1 ? "step-000000007\n" : "step-000000012\n");
    if (rank_ == 0) {
        snprintf(path, sizeof path, "%s/step-000000013", root);
        ASSERT_TRUE(!path_exists(path));
        snprintf(path, sizeof path, "%s/step-000000013.partial", root);
        ASSERT_TRUE(!path_exists(path));
    }
    if (size_ == 1) {
        // At one rank the "disagreeing" save above succeeded: put step 7 back on top.
        ASSERT_OK(save(root, 7, LAYOUT_ROOT, 8));
    }
}

// A crash between the shards and the manifest leaves a step directory without a
// manifest (or a staging directory): `latest` still names the previous checkpoint.
static void test_crash_safety(const char *root)
{
    char path[512], from[512];
    if (rank_ == 0) {
        long len;
        snprintf(from, sizeof from, "%s/step-000000007/shard-00000.bin", root);
        char *shard = slurp(from, &len);
        snprintf(path, sizeof path, "%s/step-000000009", root);
        ASSERT_TRUE(mkdir(path, 0777) == 0);
        snprintf(path, sizeof path, "%s/step-000000009/shard-00000.bin", root);
        spill(path, shard, len);
        snprintf(path, sizeof path, "%s/step-000000010.partial", root);
        ASSERT_TRUE(mkdir(path, 0777) == 0);
        snprintf(path, sizeof path, "%s/step-000000010.partial/shard-00000.bin.tmp", root);
        spill(path, shard, len / 2);
        free(shard);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    load_expect(root, LAYOUT_A, 7, 8);
    snprintf(path, sizeof path, "%s/step-000000009", root);
    load_refused(path, DDL_ENOTFOUND, "manifest.json");

    // The next saves of those steps replace the debris.
    ASSERT_OK(save(root, 10, LAYOUT_A, 10));
    ASSERT_OK(save(root, 9, LAYOUT_B, 9));
    expect_latest(root, "step-000000009\n");
    load_expect(root, LAYOUT_ROOT, 9, 9);
    if (rank_ == 0) {
        snprintf(path, sizeof path, "%s/step-000000010.partial", root);
        ASSERT_TRUE(!path_exists(path));
        snprintf(path, sizeof path, "%s/step-000000009.partial", root);
        ASSERT_TRUE(!path_exists(path));
    }
}

// Replaces the value of the first "key": in text by `token`: a scalar runs to the next
// ',' or newline, an object or array to its matching bracket.
static char *replace_value(const char *text, const char *key, const char *token)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *at = strstr(text, pat);
    ASSERT_TRUE(at != NULL);
    const char *v   = at + strlen(pat);
    const char *end = v + strcspn(v, ",\n");
    if (*v == '{' || *v == '[') {
        int  depth     = 0;
        bool in_string = false;
        for (end = v; *end != '\0'; end++) {
            if (in_string) {
                if (*end == '\\') {
                    end++;
                } else if (*end == '"') {
                    in_string = false;
                }
            } else if (*end == '"') {
                in_string = true;
            } else if (*end == '{' || *end == '[') {
                depth++;
            } else if ((*end == '}' || *end == ']') && --depth == 0) {
                end++;
                break;
            }
        }
    }
    char *out = malloc(strlen(text) + strlen(token) + 1);
    ASSERT_TRUE(out != NULL);
    sprintf(out, "%.*s%s%s", (int)(v - text), text, token, end);
    return out;
}

// SEALED: REPLACE a manifest and rewrite its manifest.sha256 to match, as a hostile
// writer would: the fields must still be validated on their own.
typedef enum { TRUNCATE, FLIP, REMOVE, REPLACE, SEALED } damage;

// Rewrites manifest.sha256 beside `manifest` for its current contents (rank 0).
static void reseal(const char *manifest)
{
    char sum[600], hex[65], line[100];
    snprintf(sum, sizeof sum, "%.*s/manifest.sha256", (int)(strrchr(manifest, '/') - manifest),
             manifest);
    ASSERT_OK(ddl_sha256_file(manifest, hex));
    snprintf(line, sizeof line, "%s  manifest.json\n", hex);
    spill(sum, line, (long)strlen(line));
}

// Damages one file (rank 0), expects every rank to refuse the load naming `what`, and
// restores the file.
static void corrupt_case(const char *root, const char *file, damage how, const char *content,
                         ddl_status want, const char *what)
{
    long  len   = 0;
    char *saved = NULL;
    if (rank_ == 0) {
        saved = path_exists(file) ? slurp(file, &len) : NULL;
        switch (how) {
        case TRUNCATE:
            spill(file, saved, len / 2);
            break;
        case FLIP: {
            char *copy = malloc((size_t)len);
            memcpy(copy, saved, (size_t)len);
            copy[len - 3] ^= 0x10;
            spill(file, copy, len);
            free(copy);
            break;
        }
        case REMOVE:
            ASSERT_TRUE(unlink(file) == 0);
            break;
        case REPLACE:
        case SEALED:
            ASSERT_TRUE(content != NULL);
            spill(file, content, (long)strlen(content));
            if (how == SEALED) {
                reseal(file);
            }
            break;
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    load_refused(root, want, what);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank_ == 0) {
        if (saved != NULL) {
            spill(file, saved, len);
        } else {
            unlink(file);
        }
        if (how == SEALED) {
            reseal(file);
        }
        free(saved);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

static void test_corruption(const char *root)
{
    char shard[512], shard_name[32], manifest[512], latest[512];
    int  victim = size_ - 1;
    snprintf(shard_name, sizeof shard_name, "shard-%05d.bin", victim);
    snprintf(shard, sizeof shard, "%s/step-000000009/%s", root, shard_name);
    snprintf(manifest, sizeof manifest, "%s/step-000000009/manifest.json", root);
    snprintf(latest, sizeof latest, "%s/latest", root);

    corrupt_case(root, shard, TRUNCATE, NULL, DDL_ECORRUPT, shard_name);
    corrupt_case(root, shard, FLIP, NULL, DDL_ECORRUPT, shard_name);
    corrupt_case(root, shard, REMOVE, NULL, DDL_ECORRUPT, shard_name);
    // The manifest is covered by manifest.sha256: damage anywhere is refused before
    // parsing, a bit flip inside the spec text (still valid JSON) included.
    corrupt_case(root, manifest, TRUNCATE, NULL, DDL_ECORRUPT, "does not match manifest.sha256");
    {
        char *bad = NULL;
        if (rank_ == 0) {
            long  n    = 0;
            char *orig = slurp(manifest, &n);
            bad        = malloc((size_t)n + 1);
            memcpy(bad, orig, (size_t)n);
            bad[n]     = '\0';
            char *spec = strstr(bad, "\"spec\": \"");
            ASSERT_TRUE(spec != NULL);
            spec[10] ^= 0x01;  // one bit of the spec text's first character
            free(orig);
        }
        corrupt_case(root, manifest, REPLACE, bad, DDL_ECORRUPT, "does not match manifest.sha256");
        free(bad);
    }
    char sum[512];
    snprintf(sum, sizeof sum, "%s/step-000000009/manifest.sha256", root);
    corrupt_case(root, sum, REMOVE, NULL, DDL_ECORRUPT, "manifest.sha256: missing");
    corrupt_case(root, sum, REPLACE, "0123  manifest.json\n", DDL_ECORRUPT,
                 "manifest.sha256: is not");

    // Wrong field types and values, one at a time.
    static const struct {
        const char *key, *token, *what;
    } fields[] = {
        {"world_size", "\"2\"", "\"world_size\" is a string"},
        {"step", "9.5", "\"step\" is a real"},
        {"user", "[]", "\"user\" is an array"},
        {"shape", "{}", "tensors[0].\"shape\" is an object"},
        {"shape", "[4294967296, 4294967296]", "tensors[0].\"shape\" has more than 2^34"},
        {"dtype", "\"f16\"", "tensors[0].\"dtype\""},
        {"bytes", "null", "shards[0].\"bytes\" is null"},
        {"format_version", "2", "format_version 2"},
    };
    long  len  = 0;
    char *text = NULL;
    if (rank_ == 0) {
        text = slurp(manifest, &len);
    }
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        char *bad = rank_ == 0 ? replace_value(text, fields[i].key, fields[i].token) : NULL;
        corrupt_case(root, manifest, SEALED, bad, DDL_ECORRUPT, fields[i].what);
        free(bad);
    }
    // A world of 2^20 ranks is refused from the counts, before any rank allocates
    // tables for it (it used to cost gigabytes per rank before the check).
    {
        char *bad = rank_ == 0 ? replace_value(text, "world_size", "1048576") : NULL;
        ddl_alloc_bytes_peak_reset();
        int64_t before = ddl_alloc_bytes_live();
        corrupt_case(root, manifest, SEALED, bad, DDL_ECORRUPT, "expected world_size 1048576");
        int64_t peak = ddl_alloc_bytes_peak_reset() - before;
        if (peak > ((int64_t)64 << 20)) {
            TEST_FAIL_("refusing a world of 2^20 allocated %lld bytes at peak", (long long)peak);
        }
        free(bad);
    }
    free(text);

    corrupt_case(root, latest, REPLACE, "step-000000099\n", DDL_ECORRUPT, "step-000000099");
    corrupt_case(root, latest, REPLACE, "../../etc\n", DDL_ECORRUPT, "latest");
    // A FIFO in place of `latest` is refused at once (opening it used to block rank 0).
    {
        long  n     = 0;
        char *saved = NULL;
        if (rank_ == 0) {
            saved = slurp(latest, &n);
            ASSERT_TRUE(unlink(latest) == 0 && mkfifo(latest, 0600) == 0);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        load_refused(root, DDL_ECORRUPT, "not a regular file");
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank_ == 0) {
            ASSERT_TRUE(unlink(latest) == 0);
            spill(latest, saved, n);
            free(saved);
        }
        MPI_Barrier(MPI_COMM_WORLD);
    }
    // Without `latest`, the newest step directory whose manifest verifies is loaded
    // (step 10 here: it is newer than step 9, which was saved after it) and a warning
    // says so; it used to be ENOTFOUND, so --resume started again from step 0.
    {
        char saved_latest[64] = "";
        if (rank_ == 0) {
            long  n = 0;
            char *t = slurp(latest, &n);
            snprintf(saved_latest, sizeof saved_latest, "%.*s", (int)n, t);
            free(t);
            ASSERT_TRUE(unlink(latest) == 0);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        // The newest step: 10 (12 at one rank, where test_save_refused's step 12 exists).
        int64_t newest = size_ > 1 ? 10 : 12, next = size_ > 1 ? 9 : 10;
        load_expect(root, LAYOUT_A, newest, (int)newest);
        // A newer step directory whose manifest does not verify is skipped.
        char m10[512];
        snprintf(m10, sizeof m10, "%s/step-%09lld/manifest.json", root, (long long)newest);
        long  n10 = 0;
        char *t10 = NULL;
        if (rank_ == 0) {
            t10 = slurp(m10, &n10);
            spill(m10, t10, n10 / 2);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        load_expect(root, LAYOUT_A, next, (int)next);
        if (rank_ == 0) {
            spill(m10, t10, n10);
            free(t10);
            spill(latest, saved_latest, (long)strlen(saved_latest));
        }
        MPI_Barrier(MPI_COMM_WORLD);
    }
    // Everything restored: the checkpoint loads again.
    load_expect(root, LAYOUT_B, 9, 9);
}

static void test_bad_requests(const char *root)
{
    ddl_named_tensor t[NT];
    char             missing[512];
    make(LAYOUT_A, -1, t);
    t[2].name = "conv.missing";
    ASSERT_STATUS(ddl_checkpoint_load(MPI_COMM_WORLD, root, NT, t, NULL, NULL, NULL), DDL_EINVAL);
    expect_error_names("conv.missing");
    t[2].name = specs[2].name;

    // A global shape that differs from the checkpoint's (same box volume on every rank).
    ddl_tensor_t *old = t[3].local;
    t[3].global       = ddl_shape_make(2, (int64_t[]){3, 1});
    t[3].box          = ddl_box_full(&t[3].global);
    ddl_shape bs      = ddl_box_shape(&t[3].box);
    ASSERT_OK(ddl_tensor_create(DDL_F32, &bs, &t[3].local));
    ASSERT_STATUS(ddl_checkpoint_load(MPI_COMM_WORLD, root, NT, t, NULL, NULL, NULL), DDL_EINVAL);
    expect_error_names("bn.running_mean");
    ddl_tensor_destroy(&t[3].local);
    t[3].local  = old;
    t[3].global = ddl_shape_make(specs[3].ndim, specs[3].d);
    t[3].box    = ddl_box_full(&t[3].global);
    expect_values(t, -1);
    release(t);

    snprintf(missing, sizeof missing, "%s/nothing-here", root);
    load_refused(missing, DDL_ENOTFOUND, "nothing-here");

    // A subset of the tensors may be loaded.
    make(LAYOUT_ROOT, -1, t);
    ASSERT_OK(ddl_checkpoint_load(MPI_COMM_WORLD, root, 2, t + 1, NULL, NULL, NULL));
    for (int64_t i = 0; i < ddl_tensor_numel(t[1].local); i++) {
        ASSERT_TRUE(ddl_tensor_get(t[1].local, i) == value(9, 1, global_index(&t[1], i)));
    }
    release(t);
}

// Rank 0 loads the file with a tiny numpy-only safetensors parser and compares sums.
static void python_cross_check(const char *file, const ddl_named_tensor *global_t)
{
    if (access("/usr/bin/python3", X_OK) != 0 ||
        system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0) {
        printf("python cross-check skipped: /usr/bin/python3 with numpy not found\n");
        return;
    }
    static const char *script = "import json, struct, sys\n"
                                "import numpy as np\n"
                                "b = open(sys.argv[1], \"rb\").read()\n"
                                "n = struct.unpack(\"<Q\", b[:8])[0]\n"
                                "assert n % 8 == 0\n"
                                "h = json.loads(b[8:8 + n])\n"
                                "meta = h.pop(\"__metadata__\", {})\n"
                                "data = b[8 + n:]\n"
                                "for k in sorted(h):\n"
                                "    e = h[k]\n"
                                "    s, t = e[\"data_offsets\"]\n"
                                "    dt = {\"F32\": \"<f4\", \"F64\": \"<f8\"}[e[\"dtype\"]]\n"
                                "    a = np.frombuffer(data[s:t], dtype=dt).reshape(e[\"shape\"])\n"
                                "    print(k, repr(float(a.astype(np.float64).sum())), a.size)\n"
                                "print(\"meta\", meta.get(\"framework\"))\n";
    char               cmd[4096];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 -c '%s' '%s'", script, file);
    FILE *p = popen(cmd, "r");
    ASSERT_TRUE(p != NULL);
    char line[512];
    int  seen = 0;
    while (fgets(line, sizeof line, p) != NULL) {
        char      name[128], sum[64];
        long long count;
        if (strncmp(line, "meta ", 5) == 0) {
            ASSERT_TRUE(strcmp(line, "meta distdl-c\n") == 0);
            seen++;
            continue;
        }
        ASSERT_EQ(sscanf(line, "%127s %63s %lld", name, sum, &count), 3);
        int k = 0;
        while (k < NT && strcmp(specs[k].name, name) != 0) {
            k++;
        }
        ASSERT_TRUE(k < NT);
        double want = 0.0;
        for (int64_t i = 0; i < ddl_shape_numel(&global_t[k].global); i++) {
            want += value(9, k, i);
        }
        ASSERT_EQ(count, ddl_shape_numel(&global_t[k].global));
        if (strtod(sum, NULL) != want) {
            TEST_FAIL_("python sum of %s is %s, expected %.17g", name, sum, want);
        }
        seen++;
    }
    ASSERT_EQ(pclose(p), 0);
    ASSERT_EQ(seen, NT + 1);
    printf("python cross-check: %d tensors match\n", NT);
}

static void test_safetensors(const char *root)
{
    char             file[512], bad[512];
    ddl_named_tensor t[NT];
    snprintf(file, sizeof file, "%s/model.safetensors", root);
    make(LAYOUT_A, 9, t);
    ASSERT_OK(ddl_export_safetensors(MPI_COMM_WORLD, file, NT, t,
                                     "{\"framework\": \"distdl-c\", \"step\": \"9\"}"));
    if (rank_ == 0) {
        python_cross_check(file, t);
    }
    release(t);
    for (int L = LAYOUT_A; L <= LAYOUT_ROOT; L++) {
        make((layout)L, -1, t);
        ASSERT_OK(ddl_import_safetensors(MPI_COMM_WORLD, file, NT, t));
        expect_values(t, 9);
        release(t);
    }
    // An absent name, and a damaged file, are refused without touching the tensors.
    make(LAYOUT_B, -1, t);
    t[4].name = "head.missing";
    ASSERT_STATUS(ddl_import_safetensors(MPI_COMM_WORLD, file, NT, t), DDL_EINVAL);
    expect_error_names("head.missing");
    t[4].name = specs[4].name;
    snprintf(bad, sizeof bad, "%s/truncated.safetensors", root);
    if (rank_ == 0) {
        long  len;
        char *b = slurp(file, &len);
        spill(bad, b, len - 4);
        free(b);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    ASSERT_STATUS(ddl_import_safetensors(MPI_COMM_WORLD, bad, NT, t), DDL_EPROTO);
    expect_error_names("truncated.safetensors");
    ASSERT_STATUS(ddl_export_safetensors(MPI_COMM_WORLD, bad, NT, t, "{\"n\": 1}"), DDL_EINVAL);
    expect_error_names("metadata_json");
    // Bytes after the last tensor's data used to be ignored.
    snprintf(bad, sizeof bad, "%s/trailing.safetensors", root);
    if (rank_ == 0) {
        long  len;
        char *b = slurp(file, &len);
        char *c = malloc((size_t)len + 16);
        memcpy(c, b, (size_t)len);
        memset(c + len, 0x5a, 16);
        spill(bad, c, len + 16);
        free(b);
        free(c);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    ASSERT_STATUS(ddl_import_safetensors(MPI_COMM_WORLD, bad, NT, t), DDL_EPROTO);
    expect_error_names("16 trailing byte(s)");
    // A FIFO is refused at once (rank 0 used to block in open while the others waited).
    snprintf(bad, sizeof bad, "%s/fifo.safetensors", root);
    if (rank_ == 0) {
        ASSERT_TRUE(mkfifo(bad, 0600) == 0);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    ASSERT_STATUS(ddl_import_safetensors(MPI_COMM_WORLD, bad, NT, t), DDL_EPROTO);
    expect_error_names("not a regular file");
    expect_values(t, -1);
    release(t);

    // A shape mismatch names the stored shape in full (it printed [3, 0, 0] for
    // conv.weight [6, 5, 3] requested as [3, 5, 3]).
    make(LAYOUT_ROOT, -1, t);
    ddl_tensor_t *old = t[2].local;
    t[2].global       = ddl_shape_make(3, (int64_t[]){3, 5, 3});
    t[2].box          = rank_ == 0 ? ddl_box_full(&t[2].global) : (ddl_box){.ndim = 3};
    ddl_shape bs      = ddl_box_shape(&t[2].box);
    ASSERT_OK(ddl_tensor_create(DDL_F64, &bs, &t[2].local));
    ASSERT_STATUS(ddl_import_safetensors(MPI_COMM_WORLD, file, NT, t), DDL_EINVAL);
    expect_error_names("has shape [6, 5, 3], requested [3, 5, 3]");
    ddl_tensor_destroy(&t[2].local);
    t[2].local  = old;
    t[2].global = ddl_shape_make(specs[2].ndim, specs[2].d);
    t[2].box    = rank_ == 0 ? ddl_box_full(&t[2].global) : (ddl_box){.ndim = 3};
    release(t);
}

static void test_npy_dir(const char *root)
{
    char             dir[512], path[600];
    ddl_named_tensor t[NT];
    snprintf(dir, sizeof dir, "%s/npy/export", root);
    make(LAYOUT_B, 9, t);
    ASSERT_OK(ddl_export_npy_dir(MPI_COMM_WORLD, dir, NT, t));
    release(t);
    if (rank_ == 0) {
        for (int k = 0; k < NT; k++) {
            snprintf(path, sizeof path, "%s/%s.npy", dir, specs[k].name);
            ASSERT_TRUE(path_exists(path));
        }
    }
    for (int L = LAYOUT_A; L <= LAYOUT_ROOT; L++) {
        make((layout)L, -1, t);
        ASSERT_OK(ddl_import_npy_dir(MPI_COMM_WORLD, dir, NT, t));
        expect_values(t, 9);
        release(t);
    }
    make(LAYOUT_A, -1, t);
    t[0].name = "fc1.absent";
    ASSERT_STATUS(ddl_import_npy_dir(MPI_COMM_WORLD, dir, NT, t), DDL_EINVAL);
    expect_error_names("fc1.absent");
    t[0].name = "up/../fc1";
    ASSERT_STATUS(ddl_export_npy_dir(MPI_COMM_WORLD, dir, NT, t), DDL_EINVAL);
    expect_values(t, -1);
    release(t);
}

static void test_sha256(const char *root)
{
    if (rank_ != 0) {
        return;
    }
    char path[512], hex[65];
    snprintf(path, sizeof path, "%s/abc.txt", root);
    spill(path, "abc", 3);
    ASSERT_OK(ddl_sha256_file(path, hex));
    ASSERT_TRUE(strcmp(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad") ==
                0);
    snprintf(path, sizeof path, "%s/absent", root);
    ASSERT_STATUS(ddl_sha256_file(path, hex), DDL_ENOTFOUND);
}

int main(int argc, char **argv)
{
    ddl_test_mpi_init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    char base[256] = "";
    if (rank_ == 0) {
        const char *tmp = getenv("TMPDIR");
        snprintf(base, sizeof base, "%s/ddl-ckpt-XXXXXX", tmp != NULL ? tmp : "/tmp");
        ASSERT_TRUE(mkdtemp(base) != NULL);
    }
    MPI_Bcast(base, sizeof base, MPI_CHAR, 0, MPI_COMM_WORLD);
    char root[300];
    snprintf(root, sizeof root, "%s/ckpt", base);

    test_sha256(base);
    test_save_load(root);
    test_latest_moves(root);
    test_save_refused(root);
    test_crash_safety(root);
    test_corruption(root);
    test_bad_requests(root);
    test_safetensors(base);
    test_npy_dir(base);

    MPI_Barrier(MPI_COMM_WORLD);
    if (rank_ == 0) {
        rm_tree(base);
        printf("test_checkpoint: all passed on %d rank(s)\n", size_);
    }
    return ddl_test_mpi_finalize();
}
