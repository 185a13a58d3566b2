// server_auth_unit: server/auth.c without a daemon. The constant-time comparison gives the
// right answers (its timing is not measured), token files parse or are refused with the
// line and reason, the role table admits and refuses per method, request headers are read
// the way gRPC delivers them, and the loopback rule classifies --listen addresses.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "auth.h"
#include "methods.h"

static int failures, checks;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        checks++;                                                                                  \
        if (!(cond)) {                                                                             \
            failures++;                                                                            \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

static void test_ct_equal(void)
{
    uint8_t a[64], b[64];
    for (int i = 0; i < 64; i++) {
        a[i] = b[i] = (uint8_t)(i * 7 + 3);
    }
    CHECK(ddld_ct_equal(a, b, 64), "equal buffers");
    CHECK(ddld_ct_equal(a, b, 0), "empty buffers are equal");
    // A difference in any byte and any bit is seen, first byte to last.
    for (int i = 0; i < 64; i++) {
        for (int bit = 0; bit < 8; bit++) {
            b[i] ^= (uint8_t)(1u << bit);
            CHECK(!ddld_ct_equal(a, b, 64), "byte %d bit %d differs", i, bit);
            CHECK(ddld_ct_equal(a, b, (size_t)i), "prefix of %d bytes is equal", i);
            b[i] ^= (uint8_t)(1u << bit);
        }
    }
}

static const char *const T_ADMIN = "admin-0123456789abcdef";
static const char *const T_TRAIN = "train-fedcba9876543210";
static const char *const T_INFER = "infer-a1b2c3d4e5f6a7b8";

static ddld_auth *make_auth(void)
{
    ddld_auth_options o = {0};
    ddld_auth        *a;
    char              err[512];
    CHECK(ddld_auth_create(&o, &a, err, sizeof err) == 0, "empty options: %s", err);
    char text[512];
    snprintf(text, sizeof text, "# roles\n\nadmin %s\n  train\t%s   # trailing comment\r\ninfer %s",
             T_ADMIN, T_TRAIN, T_INFER);
    CHECK(ddld_auth_parse_tokens(a, text, "tokens", err, sizeof err) == 0, "parse: %s", err);
    CHECK(ddld_auth_token_count(a) == 3, "3 tokens, got %d", ddld_auth_token_count(a));
    return a;
}

static void test_lookup(void)
{
    ddld_auth *a = make_auth();
    CHECK(ddld_auth_lookup(a, T_ADMIN, strlen(T_ADMIN)) == DDLD_ROLE_ADMIN, "admin");
    CHECK(ddld_auth_lookup(a, T_TRAIN, strlen(T_TRAIN)) == DDLD_ROLE_TRAIN, "train");
    CHECK(ddld_auth_lookup(a, T_INFER, strlen(T_INFER)) == DDLD_ROLE_INFER, "infer");
    CHECK(ddld_auth_lookup(a, T_ADMIN, strlen(T_ADMIN) - 1) == DDLD_ROLE_NONE, "a prefix");
    CHECK(ddld_auth_lookup(a, "", 0) == DDLD_ROLE_NONE, "empty");
    char longer[64];
    snprintf(longer, sizeof longer, "%sx", T_ADMIN);
    CHECK(ddld_auth_lookup(a, longer, strlen(longer)) == DDLD_ROLE_NONE, "an extension");
    snprintf(longer, sizeof longer, "%s", T_ADMIN);
    longer[5] ^= 0x20;
    CHECK(ddld_auth_lookup(a, longer, strlen(longer)) == DDLD_ROLE_NONE, "one case flipped");
    CHECK(ddld_auth_lookup(NULL, T_ADMIN, strlen(T_ADMIN)) == DDLD_ROLE_NONE, "no auth");
    // '#' inside a token belongs to it; only a field starting with '#' is a comment.
    char err[256];
    CHECK(ddld_auth_parse_tokens(a, "train abc#defghijklmnopq #c\n#admin x\n", "F", err,
                                 sizeof err) == 0,
          "%s", err);
    CHECK(ddld_auth_token_count(a) == 1, "one token after a reparse");
    CHECK(ddld_auth_lookup(a, "abc#defghijklmnopq", 18) == DDLD_ROLE_TRAIN, "token with #");
    CHECK(ddld_auth_lookup(a, "abc", 3) == DDLD_ROLE_NONE, "not cut at #");
    CHECK(ddld_auth_lookup(a, T_ADMIN, strlen(T_ADMIN)) == DDLD_ROLE_NONE, "old table replaced");
    ddld_auth_destroy(&a);
    CHECK(a == NULL, "destroy clears the handle");
}

static void bad_file(const char *text, const char *want)
{
    ddld_auth_options o = {0};
    ddld_auth        *a;
    char              err[512];
    ddld_auth_create(&o, &a, err, sizeof err);
    err[0] = '\0';
    CHECK(ddld_auth_parse_tokens(a, text, "F", err, sizeof err) != 0, "accepted: %s", text);
    CHECK(strstr(err, want) != NULL, "message \"%s\" lacks \"%s\"", err, want);
    CHECK(ddld_auth_token_count(a) == 0, "a refused file leaves no tokens");
    ddld_auth_destroy(&a);
}

static void test_token_files(void)
{
    bad_file("", "--token-file F: no tokens");
    bad_file("# only\n   \n", "no tokens");
    bad_file("admin\n", "line 1: expected \"ROLE TOKEN\", found 1 field");
    bad_file("\nadmin aaaaaaaaaaaaaaaaaaaa b\n", "line 2: expected \"ROLE TOKEN\", found 3 fields");
    bad_file("Admin aaaaaaaaaaaaaaaaaaaa\n", "unknown role \"Admin\"");
    bad_file("aaaaaaaaaaaaaaaaaaaa admin\n", "unknown role");
    bad_file("infer 123456789012345\n", "the token has 15 characters; 16 to 4096");
    bad_file("infer 1234567890123456\xff\n", "outside visible ASCII (at position 17)");
    bad_file("infer 1234567890123456\ntrain 1234567890123456\n", "line 2: the same token");
    char *big = malloc(DDLD_TOKEN_MAX + 16);
    memcpy(big, "admin ", 6);
    memset(big + 6, 'k', DDLD_TOKEN_MAX + 1);
    big[6 + DDLD_TOKEN_MAX + 1] = '\0';
    bad_file(big, "4097 characters");
    // The longest allowed token parses and is found.
    big[6 + DDLD_TOKEN_MAX] = '\0';
    ddld_auth_options o     = {0};
    ddld_auth        *a;
    char              err[512];
    ddld_auth_create(&o, &a, err, sizeof err);
    CHECK(ddld_auth_parse_tokens(a, big, "F", err, sizeof err) == 0, "4096: %s", err);
    CHECK(ddld_auth_lookup(a, big + 6, DDLD_TOKEN_MAX) == DDLD_ROLE_ADMIN, "4096-char token");
    ddld_auth_destroy(&a);
    free(big);
}

static grpc_status_code check_with(const ddld_auth *a, int method, const char *header, int copies,
                                   char *msg)
{
    grpc_metadata md[3];
    memset(md, 0, sizeof md);
    size_t n      = 0;
    md[n].key     = grpc_slice_from_static_string("user-agent");
    md[n++].value = grpc_slice_from_static_string("test");
    for (int i = 0; header != NULL && i < copies; i++) {
        md[n].key     = grpc_slice_from_static_string("authorization");
        md[n++].value = grpc_slice_from_copied_string(header);
    }
    grpc_metadata_array arr = {.count = n, .capacity = n, .metadata = md};
    grpc_status_code    c   = ddld_auth_check(a, method, "/distdl.v1.Trainer/X", &arr, msg, 256);
    for (size_t i = 1; i < n; i++) {
        grpc_slice_unref(md[i].value);
    }
    return c;
}

static void test_check(void)
{
    ddld_auth *a = make_auth();
    char       msg[256], hdr[128];
    // Health needs nothing; everything else a token.
    CHECK(check_with(a, DDLD_M_HEALTH_CHECK, NULL, 0, msg) == GRPC_STATUS_OK, "health");
    CHECK(check_with(a, DDLD_M_HEALTH_WATCH, "Bearer nonsense", 1, msg) == GRPC_STATUS_OK,
          "health with a wrong token");
    CHECK(check_with(a, DDLD_M_GET_STATUS, NULL, 0, msg) == GRPC_STATUS_UNAUTHENTICATED, "none");
    CHECK(strstr(msg, "needs a bearer token") != NULL, "%s", msg);
    CHECK(check_with(a, DDLD_M_GET_STATUS, "Bearer wrong-wrong-wrong-wrong", 1, msg) ==
              GRPC_STATUS_UNAUTHENTICATED,
          "wrong");
    CHECK(strcmp(msg, "invalid token") == 0, "%s", msg);
    snprintf(hdr, sizeof hdr, "Basic %s", T_ADMIN);
    CHECK(check_with(a, DDLD_M_GET_STATUS, hdr, 1, msg) == GRPC_STATUS_UNAUTHENTICATED, "Basic");
    CHECK(strstr(msg, T_ADMIN) == NULL, "the message never carries the token");
    snprintf(hdr, sizeof hdr, "Bearer %s", T_ADMIN);
    CHECK(check_with(a, DDLD_M_GET_STATUS, hdr, 2, msg) == GRPC_STATUS_UNAUTHENTICATED, "two");
    CHECK(check_with(a, DDLD_M_SHUTDOWN, hdr, 1, msg) == GRPC_STATUS_OK, "admin shutdown: %s", msg);
    snprintf(hdr, sizeof hdr, "bearer %s", T_INFER);
    CHECK(check_with(a, DDLD_M_PREDICT, hdr, 1, msg) == GRPC_STATUS_OK, "scheme case: %s", msg);

    // The whole table, each role against each method.
    static const struct {
        int       method;
        ddld_role need;
    } table[] = {
        {DDLD_M_HEALTH_CHECK, DDLD_ROLE_NONE},  {DDLD_M_HEALTH_WATCH, DDLD_ROLE_NONE},
        {DDLD_M_GET_STATUS, DDLD_ROLE_INFER},   {DDLD_M_PREDICT, DDLD_ROLE_INFER},
        {DDLD_M_SERVER_LIVE, DDLD_ROLE_INFER},  {DDLD_M_SERVER_READY, DDLD_ROLE_INFER},
        {DDLD_M_MODEL_READY, DDLD_ROLE_INFER},  {DDLD_M_MODEL_METADATA, DDLD_ROLE_INFER},
        {DDLD_M_MODEL_INFER, DDLD_ROLE_INFER},  {DDLD_M_SERVER_METADATA, DDLD_ROLE_INFER},
        {DDLD_M_SUBMIT_BATCH, DDLD_ROLE_TRAIN}, {DDLD_M_STEP, DDLD_ROLE_TRAIN},
        {DDLD_M_TRAIN, DDLD_ROLE_TRAIN},        {DDLD_M_EVALUATE, DDLD_ROLE_TRAIN},
        {DDLD_M_PULL_WEIGHTS, DDLD_ROLE_TRAIN}, {DDLD_M_CHECKPOINT, DDLD_ROLE_TRAIN},
        {DDLD_M_CREATE_MODEL, DDLD_ROLE_ADMIN}, {DDLD_M_PUSH_WEIGHTS, DDLD_ROLE_ADMIN},
        {DDLD_M_RESTORE, DDLD_ROLE_ADMIN},      {DDLD_M_SHUTDOWN, DDLD_ROLE_ADMIN},
        {DDLD_M_COUNT, DDLD_ROLE_INFER},
    };
    CHECK(sizeof table / sizeof table[0] == DDLD_M_COUNT + 1, "every method is in the table");
    const char *tok[] = {T_INFER, T_TRAIN, T_ADMIN};
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        CHECK(ddld_auth_required_role(table[i].method) == table[i].need, "method %d",
              table[i].method);
        for (int r = 0; r < 3; r++) {
            ddld_role        role = (ddld_role)(r + 1);
            grpc_status_code want =
                role >= table[i].need ? GRPC_STATUS_OK : GRPC_STATUS_PERMISSION_DENIED;
            snprintf(hdr, sizeof hdr, "Bearer %s", tok[r]);
            grpc_status_code got = check_with(a, table[i].method, hdr, 1, msg);
            CHECK(got == want, "method %d role %s: %d, expected %d (%s)", table[i].method,
                  ddld_role_name(role), got, want, msg);
            if (got == GRPC_STATUS_PERMISSION_DENIED) {
                CHECK(strstr(msg, ddld_role_name(role)) != NULL && strstr(msg, tok[r]) == NULL,
                      "%s", msg);
            }
        }
    }
    // No tokens configured: everything is admitted.
    ddld_auth_options o = {0};
    ddld_auth        *open;
    ddld_auth_create(&o, &open, msg, sizeof msg);
    CHECK(check_with(open, DDLD_M_SHUTDOWN, NULL, 0, msg) == GRPC_STATUS_OK, "no tokens");
    CHECK(check_with(NULL, DDLD_M_SHUTDOWN, NULL, 0, msg) == GRPC_STATUS_OK, "no auth");
    ddld_auth_destroy(&open);
    ddld_auth_destroy(&a);
}

static void test_loopback(void)
{
    static const char *const local[]  = {"127.0.0.1:50051",   "127.0.0.1:0",      "127.1.2.3:9",
                                         "localhost:50051",   "[::1]:0",          "unix:/tmp/x.sock",
                                         "unix-abstract:ddl", "ipv4:127.0.0.1:80"};
    static const char *const remote[] = {
        "0.0.0.0:50051",       "[::]:0",        ":50051",  "10.0.0.1:1",    "128.0.0.1:1",
        "127.0.0.1.example:1", "example.com:1", "[::2]:1", "127.0.0.256:1", "localhost.example:1"};
    for (size_t i = 0; i < sizeof local / sizeof local[0]; i++) {
        CHECK(ddld_listen_is_loopback(local[i]), "%s is loopback", local[i]);
    }
    for (size_t i = 0; i < sizeof remote / sizeof remote[0]; i++) {
        CHECK(!ddld_listen_is_loopback(remote[i]), "%s is not loopback", remote[i]);
    }
    char              buf[512];
    ddld_auth_options none = {0}, tok = {.token_file = "t"},
                      tls = {.tls_cert = "c", .tls_key = "k"};
    CHECK(ddld_auth_config_problem(&none, "127.0.0.1:0", false, buf, sizeof buf) == NULL, "lo");
    CHECK(ddld_auth_config_problem(&none, "0.0.0.0:0", false, buf, sizeof buf) != NULL &&
              strstr(buf, "refusing to listen on 0.0.0.0:0") != NULL,
          "%s", buf);
    CHECK(ddld_auth_config_problem(&none, "0.0.0.0:0", true, buf, sizeof buf) == NULL, "insecure");
    CHECK(ddld_auth_config_problem(&tok, "0.0.0.0:0", false, buf, sizeof buf) == NULL, "tokens");
    CHECK(ddld_auth_config_problem(&tls, "0.0.0.0:0", false, buf, sizeof buf) == NULL, "tls");
    ddld_auth_options half = {.tls_cert = "c"}, ca = {.tls_client_ca = "ca"};
    CHECK(ddld_auth_config_problem(&half, "127.0.0.1:0", false, buf, sizeof buf) != NULL, "half");
    CHECK(ddld_auth_config_problem(&ca, "127.0.0.1:0", false, buf, sizeof buf) != NULL, "ca");
}

// The cost of one header check with 3 tokens configured (printed, not asserted).
static void time_check(void)
{
    ddld_auth *a = make_auth();
    char       msg[256], hdr[128];
    snprintf(hdr, sizeof hdr, "Bearer %s", T_TRAIN);
    struct timespec t0, t1;
    int             n = 200000, ok = 0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < n; i++) {
        ok += check_with(a, DDLD_M_STEP, hdr, 1, msg) == GRPC_STATUS_OK;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    CHECK(ok == n, "every check admitted");
    double ns = ((double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec)) / n;
    printf("token check (3 tokens, header built and freed each time): %.0f ns\n", ns);
    ddld_auth_destroy(&a);
}

int main(void)
{
    test_ct_equal();
    test_lookup();
    test_token_files();
    test_check();
    test_loopback();
    time_check();
    printf("%s: %d checks, %d failed\n", failures ? "FAIL" : "PASS", checks, failures);
    return failures ? 1 : 0;
}
