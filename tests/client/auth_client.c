// auth_client: calls a real distdld through libdistdl-client with the TLS and token options
// taken from the environment, and checks the gRPC code of each call. Run by auth_test.py.
//
//   DDL_ADDRESS=host:port [DDL_TLS_CA=pem DDL_TLS_CERT=pem DDL_TLS_KEY=pem
//   DDL_TLS_SERVER_NAME=name DDL_TOKEN=token | DDL_TOKEN_FILE=file] auth_client CALL=CODE ...
//   auth_client --bench N      (connect + Health N times; prints the connect latency)
//
// CALL is one of health live status predict infer step submit evaluate pull pushback push
// create shutdown; CODE a gRPC code name (OK, UNAUTHENTICATED, PERMISSION_DENIED,
// UNAVAILABLE, ...). The model is the 1x28x28, 10-class LeNet-5 of deploy/specs; inputs are
// synthetic pixels (the calls test admission, not learning). The connection does not wait
// to be ready, so a failed handshake shows as the first call's UNAVAILABLE; every call has
// a deadline, so nothing hangs. Exit 0 only if every call returned the code expected, 3 if
// ddl_client_read_token_file refused DDL_TOKEN_FILE (its message on stdout).
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ddl_client.h"

#define N 64 // the spec's batch size

static uint8_t px[N * 784];
static int64_t lb[N];

static ddl_client_tensor images(int64_t n)
{
    return (ddl_client_tensor){.name  = "x",
                               .dtype = DDL_WIRE_UINT8,
                               .ndim  = 4,
                               .shape = {n, 1, 28, 28},
                               .data  = px,
                               .bytes = (size_t)n * 784};
}

static ddl_client_batch batch(void)
{
    ddl_client_batch b = {.x = images(N)};
    b.labels           = (ddl_client_tensor){.name  = "labels",
                                             .dtype = DDL_WIRE_INT64,
                                             .ndim  = 1,
                                             .shape = {N},
                                             .data  = lb,
                                             .bytes = sizeof lb};
    return b;
}

static ddl_status call(ddl_client_t *c, const char *what)
{
    ddl_client_batch b = batch();
    if (strcmp(what, "health") == 0) {
        ddl_health_status h;
        return ddl_client_health_check(c, "", &h);
    }
    if (strcmp(what, "live") == 0) {
        int live;
        return ddl_client_server_live(c, &live);
    }
    if (strcmp(what, "status") == 0) {
        ddl_client_status_info s;
        return ddl_client_get_status(c, &s);
    }
    if (strcmp(what, "predict") == 0) {
        ddl_client_tensor x = images(2), y;
        memset(&y, 0, sizeof y);
        ddl_status st = ddl_client_predict(c, &x, &y);
        ddl_client_tensor_release(&y);
        return st;
    }
    if (strcmp(what, "infer") == 0) {
        ddl_client_tensor      x = images(2), y;
        ddl_client_status_info s;
        memset(&y, 0, sizeof y);
        ddl_status st = ddl_client_get_status(c, &s); // the model's name (needs infer too)
        if (st == DDL_OK) {
            st = ddl_client_model_infer(c, s.model_name, &x, &y);
        }
        ddl_client_tensor_release(&y);
        return st;
    }
    if (strcmp(what, "step") == 0) {
        ddl_client_step_result r;
        return ddl_client_step(c, &b, &r);
    }
    if (strcmp(what, "submit") == 0) {
        return ddl_client_submit_batches(c, &b, 1, NULL, NULL);
    }
    if (strcmp(what, "evaluate") == 0) {
        ddl_client_eval_result r;
        return ddl_client_evaluate(c, NULL, NULL, &b, &r);
    }
    if (strcmp(what, "pull") == 0 || strcmp(what, "pushback") == 0) {
        ddl_client_weights *w  = NULL;
        ddl_status          st = ddl_client_pull_weights(c, &w);
        if (st == DDL_OK && strcmp(what, "pushback") == 0) {
            st = ddl_client_push_weights(c, w->tensors, w->count, NULL, NULL);
        }
        ddl_client_weights_destroy(&w);
        return st;
    }
    if (strcmp(what, "push") == 0) { // one made-up tensor: admission is decided before it
        float             v[4] = {0};
        ddl_client_tensor t    = {.name  = "conv1.weight",
                                  .dtype = DDL_WIRE_FP32,
                                  .ndim  = 1,
                                  .shape = {4},
                                  .data  = v,
                                  .bytes = sizeof v};
        return ddl_client_push_weights(c, &t, 1, NULL, NULL);
    }
    if (strcmp(what, "create") == 0) { // not a spec: admin gets INVALID_ARGUMENT
        return ddl_client_create_model(c, "{}", NULL, 1, NULL);
    }
    if (strcmp(what, "shutdown") == 0) {
        return ddl_client_shutdown(c, 0, NULL);
    }
    fprintf(stderr, "auth_client: unknown call %s\n", what);
    exit(2);
}

static char *file_token; // DDL_TOKEN_FILE, read with ddl_client_read_token_file

static ddl_client_options options(double connect_timeout)
{
    ddl_client_options o = ddl_client_options_default();
    o.connect_timeout_s  = connect_timeout;
    o.call_timeout_s     = 30;
    o.tls_ca_file        = getenv("DDL_TLS_CA");
    o.tls_cert_file      = getenv("DDL_TLS_CERT");
    o.tls_key_file       = getenv("DDL_TLS_KEY");
    o.tls_server_name    = getenv("DDL_TLS_SERVER_NAME");
    o.token              = file_token != NULL ? file_token : getenv("DDL_TOKEN");
    return o;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// A new connection each time: channel, TCP, the TLS handshake when configured, then one
// Health call on it.
static int bench(const char *addr, int n)
{
    double *t = calloc((size_t)n, sizeof *t);
    for (int i = 0; i < n; i++) {
        ddl_client_options o = options(10);
        ddl_client_t      *c;
        double             t0 = now();
        if (ddl_client_connect(addr, &o, &c) != DDL_OK || call(c, "health") != DDL_OK) {
            fprintf(stderr, "bench: %s\n", ddl_last_error());
            free(t);
            return 1;
        }
        t[i] = now() - t0;
        ddl_client_destroy(&c);
    }
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    printf("connect+health (%s): median %.2f ms, p90 %.2f ms over %d connections\n",
           getenv("DDL_TLS_CA") == NULL     ? "plaintext"
           : getenv("DDL_TLS_CERT") == NULL ? "TLS"
                                            : "mutual TLS",
           t[n / 2] * 1e3, t[(n * 9) / 10] * 1e3, n);
    free(t);
    return 0;
}

int main(int argc, char **argv)
{
    const char *addr = getenv("DDL_ADDRESS");
    if (addr == NULL) {
        fprintf(stderr, "auth_client: DDL_ADDRESS is not set (run under auth_test.py)\n");
        return 2;
    }
    for (int i = 0; i < N * 784; i++) {
        px[i] = (uint8_t)((i * 37) % 251);
    }
    for (int i = 0; i < N; i++) {
        lb[i] = i % 10;
    }
    const char *tf = getenv("DDL_TOKEN_FILE");
    if (tf != NULL && ddl_client_read_token_file(tf, &file_token) != DDL_OK) {
        printf("token file refused: %s\n", ddl_last_error());
        return 3;
    }
    if (argc == 3 && strcmp(argv[1], "--bench") == 0) {
        return bench(addr, atoi(argv[2]));
    }
    ddl_client_options o = options(0);
    ddl_client_t      *c;
    if (ddl_client_connect(addr, &o, &c) != DDL_OK) {
        fprintf(stderr, "auth_client: connect: %s\n", ddl_last_error());
        return 1;
    }
    int failures = 0;
    for (int i = 1; i < argc; i++) {
        char        what[64];
        const char *eq = strchr(argv[i], '=');
        if (eq == NULL || (size_t)(eq - argv[i]) >= sizeof what) {
            fprintf(stderr, "auth_client: expected CALL=CODE, got %s\n", argv[i]);
            return 2;
        }
        memcpy(what, argv[i], (size_t)(eq - argv[i]));
        what[eq - argv[i]] = '\0';
        ddl_status  st     = call(c, what);
        const char *got    = ddl_client_code_name(ddl_client_last_code());
        bool        ok     = strcmp(got, eq + 1) == 0;
        printf("%s %-9s -> %-17s (expected %s)%s%s\n", ok ? "ok  " : "FAIL", what, got, eq + 1,
               st != DDL_OK ? ": " : "", st != DDL_OK ? ddl_last_error() : "");
        failures += !ok;
    }
    ddl_client_destroy(&c);
    ddl_client_free_token(&file_token);
    return failures == 0 ? 0 : 1;
}
