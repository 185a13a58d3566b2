// server/main.c: distdld, the distdl-c daemon. One MPI job: every rank holds its shard of
// the model; rank 0 also serves gRPC and drives the others one command at a time.
//
//   mpirun -np P distdld [--model spec.json] [--listen 127.0.0.1:PORT|unix:PATH]
//          [--address-file F] [--data-root D] [--checkpoint-dir D --checkpoint-every K]
//          [--resume] [--max-message-bytes N] [--queue N]
//          [--metrics-listen 127.0.0.1:PORT [--metrics-address-file F]]
//          [--token-file F] [--tls-cert PEM --tls-key PEM [--tls-client-ca PEM]] [--insecure]
//
// Rank 0's main thread runs a libuv loop: an async handle wakes it when the gRPC thread
// queued work, signal handles turn SIGTERM/SIGINT/SIGUSR2 into a graceful shutdown,
// SIGUSR1 into a checkpoint and SIGHUP into a reload of --token-file. Ranks > 0 ignore
// those signals (mpirun forwards SIGUSR1 and SIGUSR2 to every rank at once, so
// `kill -USR2 <mpirun>` is the clean way to stop the job from outside) and wait for
// commands (dispatch.c). SIGTERM to mpirun reaches the
// ranks only after `odls_base_sigkill_timeout` seconds and is followed by SIGKILL as long
// again: launch with `--mca odls_base_sigkill_timeout 10` (more than the grace period
// plus the final checkpoint, and no more: after a rank fault mpirun takes twice it to end
// the job) if you stop it that way. --watchdog (watchdog.c) ends a job whose rank stopped.
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "auth.h"
#include "config.h"
#include "ddl/base.h"
#include "ddl/blas.h"
#include "ddl/kernels.h"
#include "ddl/model.h"
#include "dispatch.h"
#include "exit_codes.h"
#include "http.h"
#include "listen.h"
#include "log.h"
#include "methods.h"
#include "metrics.h"
#include "service.h"
#include "shared.h"
#include "watchdog.h"

// ---- command line ------------------------------------------------------------------------

static const char usage[] =
    "usage: mpirun -np P distdld [options]\n"
    "  --model FILE              create this model (a JSON spec) at start\n"
    "  --listen ADDR             127.0.0.1:PORT (default 127.0.0.1:50051; port 0 picks a free\n"
    "                            one), [::1]:PORT, 0.0.0.0:PORT or unix:PATH\n"
    "  --address-file FILE       write the bound host:port here once serving\n"
    "  --data-root DIR           server-side datasets are named relative to DIR\n"
    "                            (default /usr/share/datasets/fashion-mnist)\n"
    "  --checkpoint-dir DIR      checkpoints (Checkpoint, SIGUSR1, shutdown, --checkpoint-every)\n"
    "  --checkpoint-every K      checkpoint every K training steps (needs --checkpoint-dir)\n"
    "  --checkpoint-interval S   also checkpoint every S seconds when steps were taken\n"
    "  --resume                  restore the latest checkpoint of --checkpoint-dir, if any\n"
    "  --max-message-bytes N     largest request message accepted (default 67108864)\n"
    "  --queue N                 pending requests and submitted batches (default 64)\n"
    "  --grace SECONDS           shutdown grace for in-flight calls (default 5)\n"
    "  --metrics-listen H:PORT   serve Prometheus metrics at http://H:PORT/metrics (numeric\n"
    "                            address; port 0 picks a free one; off by default)\n"
    "  --metrics-address-file F  write the metrics host:port here once serving\n"
    "  --tensorboard-dir DIR     write TensorBoard event files (scalars: training loss,\n"
    "                            accuracy, images/s, learning rate; evaluations) in DIR\n"
    "  --http-listen H:PORT      serve the KServe v2 protocol over HTTP/REST at\n"
    "                            http(s)://H:PORT/v2 (numeric address; port 0 picks a free\n"
    "                            one; off by default; the same TLS and token rules as gRPC)\n"
    "  --http-address-file F     write the HTTP host:port here once serving\n"
    "  --token-file FILE         bearer tokens, one \"ROLE TOKEN\" per line (roles admin,\n"
    "                            train, infer; mode 600); calls then need a token\n"
    "  --tls-cert PEM --tls-key PEM   serve TLS with this certificate chain and key\n"
    "  --tls-client-ca PEM       mutual TLS: require client certificates from this CA\n"
    "  --insecure                allow a non-loopback --listen without TLS or tokens\n"
    "  --dynamic-batching on|off concurrent Predict/ModelInfer calls run as one engine\n"
    "                            command (default on)\n"
    "  --max-queue-delay-us N    longest a request waits for batch-mates once concurrent\n"
    "                            requests were seen (default 200)\n"
    "  --max-batch N             rows per batched command (default: the spec's batch_size)\n"
    "  --preferred-batch-sizes L comma-separated row counts that run at once when reached\n"
    "  --serve-during-train on|off  answer inference calls at a running Train's step\n"
    "                            boundaries (default on; off: they wait for the Train)\n"
    "  --serve-during-train-share PCT  most of a running Train's time its answers may\n"
    "                            take, in percent (default 5; 100: every step boundary)\n"
    "  --watchdog SECONDS        end the job when a rank has not answered for this long\n"
    "                            (stopped or hung; default 60, 0 = off)\n"
    "Signals: SIGTERM/SIGINT to rank 0, or SIGUSR2 to mpirun, shut down gracefully;\n"
    "SIGUSR1 (to mpirun or rank 0) checkpoints now; SIGHUP to rank 0 reloads --token-file.\n";

static bool parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out);

// "8,16,32": up to max sizes in [1, 2^20], ascending.
static bool parse_sizes(const char *s, int64_t *out, int max, int *n)
{
    char buf[256];
    if (strlen(s) >= sizeof buf) {
        return false;
    }
    strcpy(buf, s);
    *n = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t != NULL;
         t = strtok_r(NULL, ",", &save)) {
        int64_t v;
        if (*n >= max || !parse_int(t, 1, 1 << 20, &v) || (*n > 0 && v <= out[*n - 1])) {
            return false;
        }
        out[(*n)++] = v;
    }
    return *n > 0;
}

static bool parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno       = 0;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) {
        return false;
    }
    *out = v;
    return true;
}

// Every rank parses the same argv, so every rank reaches the same verdict without talking.
// Returns 0, or 2 after printing the problem (on the first rank only), or 1 for --help.
static int parse_args(int argc, char **argv, ddld_config *cfg, bool print)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->listen            = "127.0.0.1:50051";
    cfg->data_root         = "/usr/share/datasets/fashion-mnist";
    cfg->max_message_bytes = 64 << 20;
    cfg->queue             = 64;
    cfg->batching           = true;
    cfg->serve_during_train = true;
    cfg->serve_share_pct    = 5;
    cfg->max_queue_delay_us = 200;
    cfg->grace_s           = 5;
    cfg->watchdog_s        = 60;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        char        name[64];
        const char *val = NULL;
        const char *eq  = strchr(a, '=');
        if (strncmp(a, "--", 2) == 0 && eq != NULL && (size_t)(eq - a) < sizeof name) {
            memcpy(name, a, (size_t)(eq - a));
            name[eq - a] = '\0';
            val          = eq + 1;
        } else {
            snprintf(name, sizeof name, "%s", a);
        }
        if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0) {
            if (print) {
                fputs(usage, stdout);
            }
            return 1;
        }
        if (strcmp(name, "--resume") == 0) {
            cfg->resume = true;
            continue;
        }
        if (strcmp(name, "--insecure") == 0) {
            cfg->insecure = true;
            continue;
        }
        static const char *const with_value[] = {"--model",
                                                 "--listen",
                                                 "--address-file",
                                                 "--data-root",
                                                 "--checkpoint-dir",
                                                 "--checkpoint-every",
                                                 "--checkpoint-interval",
                                                 "--max-message-bytes",
                                                 "--queue",
                                                 "--grace",
                                                 "--metrics-listen",
                                                 "--metrics-address-file",
                                                 "--tensorboard-dir",
                                                 "--http-listen",
                                                 "--http-address-file",
                                                 "--token-file",
                                                 "--tls-cert",
                                                 "--tls-key",
                                                 "--tls-client-ca",
                                                 "--watchdog",
                                                 "--dynamic-batching",
                                                 "--max-queue-delay-us",
                                                 "--max-batch",
                                                 "--preferred-batch-sizes",
                                                 "--serve-during-train",
                                                 "--serve-during-train-share"};
        bool                     known        = false;
        for (size_t k = 0; k < sizeof with_value / sizeof with_value[0]; k++) {
            known = known || strcmp(name, with_value[k]) == 0;
        }
        if (!known) {
            if (print) {
                fprintf(stderr, DDLD_LOG_PREFIX ": unknown option %s (see --help)\n", a);
            }
            return 2;
        }
        if (val == NULL) {
            if (i + 1 >= argc) {
                if (print) {
                    fprintf(stderr, DDLD_LOG_PREFIX ": %s needs a value (see --help)\n", name);
                }
                return 2;
            }
            val = argv[++i];
        }
        int64_t v;
        bool    ok = true;
        if (strcmp(name, "--model") == 0) {
            cfg->model_path = val;
        } else if (strcmp(name, "--listen") == 0) {
            cfg->listen = val;
            ok          = val[0] != '\0';
        } else if (strcmp(name, "--address-file") == 0) {
            cfg->address_file = val;
        } else if (strcmp(name, "--data-root") == 0) {
            cfg->data_root = val;
        } else if (strcmp(name, "--checkpoint-dir") == 0) {
            cfg->checkpoint_dir = val;
        } else if (strcmp(name, "--checkpoint-every") == 0) {
            ok                    = parse_int(val, 1, INT64_MAX, &v);
            cfg->checkpoint_every = v;
        } else if (strcmp(name, "--checkpoint-interval") == 0) {
            ok                       = parse_int(val, 1, 365L * 24 * 3600, &v);
            cfg->checkpoint_interval = v;
        } else if (strcmp(name, "--max-message-bytes") == 0) {
            ok                     = parse_int(val, 4096, INT_MAX, &v);
            cfg->max_message_bytes = v;
        } else if (strcmp(name, "--queue") == 0) {
            ok         = parse_int(val, 1, 1 << 20, &v);
            cfg->queue = (int)v;
        } else if (strcmp(name, "--grace") == 0) {
            ok           = parse_int(val, 0, 3600, &v);
            cfg->grace_s = (double)v;
        } else if (strcmp(name, "--metrics-listen") == 0) {
            cfg->metrics_listen = val; // checked after MPI_Init (ddld_metrics_check_config)
        } else if (strcmp(name, "--metrics-address-file") == 0) {
            cfg->metrics_address_file = val;
        } else if (strcmp(name, "--tensorboard-dir") == 0) {
            cfg->tensorboard_dir = val; // opened by rank 0 at start (ddld_dispatch_create)
            ok                   = val[0] != '\0';
        } else if (strcmp(name, "--http-listen") == 0) {
            cfg->http_listen = val; // checked after MPI_Init (ddld_http_check_config)
        } else if (strcmp(name, "--http-address-file") == 0) {
            cfg->http_address_file = val;
        } else if (strcmp(name, "--token-file") == 0) {
            cfg->token_file = val;
        } else if (strcmp(name, "--tls-cert") == 0) {
            cfg->tls_cert = val;
        } else if (strcmp(name, "--tls-key") == 0) {
            cfg->tls_key = val;
        } else if (strcmp(name, "--tls-client-ca") == 0) {
            cfg->tls_client_ca = val;
        } else if (strcmp(name, "--dynamic-batching") == 0 ||
                   strcmp(name, "--serve-during-train") == 0) {
            ok = strcmp(val, "on") == 0 || strcmp(val, "off") == 0;
            *(name[2] == 'd' ? &cfg->batching : &cfg->serve_during_train) = strcmp(val, "on") == 0;
        } else if (strcmp(name, "--serve-during-train-share") == 0) {
            ok                   = parse_int(val, 1, 100, &v);
            cfg->serve_share_pct = (int)v;
        } else if (strcmp(name, "--max-queue-delay-us") == 0) {
            ok                      = parse_int(val, 0, 1000000, &v);
            cfg->max_queue_delay_us = v;
        } else if (strcmp(name, "--max-batch") == 0) {
            ok             = parse_int(val, 1, 1 << 20, &v);
            cfg->max_batch = v;
        } else if (strcmp(name, "--preferred-batch-sizes") == 0) {
            ok = parse_sizes(val, cfg->preferred, 8, &cfg->npreferred);
        } else if (strcmp(name, "--watchdog") == 0) {
            ok              = parse_int(val, 0, 86400, &v);
            cfg->watchdog_s = (double)v;
        }
        if (!ok) {
            if (print) {
                fprintf(stderr, DDLD_LOG_PREFIX ": %s: bad value \"%s\" (see --help)\n", name, val);
            }
            return 2;
        }
    }
    const char       *problem = NULL;
    char              auth_problem[512];
    ddld_auth_options ao = {cfg->token_file, cfg->tls_cert, cfg->tls_key, cfg->tls_client_ca};
    if (cfg->checkpoint_every > 0 && cfg->checkpoint_dir == NULL) {
        problem = "--checkpoint-every needs --checkpoint-dir";
    } else if (cfg->checkpoint_interval > 0 && cfg->checkpoint_dir == NULL) {
        problem = "--checkpoint-interval needs --checkpoint-dir";
    } else if (cfg->resume && cfg->checkpoint_dir == NULL) {
        problem = "--resume needs --checkpoint-dir";
    } else if (cfg->resume && cfg->model_path == NULL) {
        problem = "--resume needs --model (a checkpoint restores onto a model)";
    } else {
        // argv only (no files yet), so every rank refuses a non-loopback plaintext listen.
        problem = ddld_auth_config_problem(&ao, cfg->listen, cfg->insecure, auth_problem,
                                           sizeof auth_problem);
        if (problem == NULL && cfg->http_listen != NULL) { // the same rule for HTTP
            problem = ddld_auth_config_problem(&ao, cfg->http_listen, cfg->insecure, auth_problem,
                                               sizeof auth_problem);
        }
    }
    if (problem != NULL) {
        if (print) {
            fprintf(stderr, DDLD_LOG_PREFIX ": %s\n", problem);
        }
        return 2;
    }
    return 0;
}

// ---- rank 0: the loop ------------------------------------------------------------------------

static struct {
    uv_loop_t      loop;
    uv_async_t     wake;
    uv_signal_t    sig_term, sig_int, sig_usr1, sig_usr2, sig_hup;
    uv_timer_t     ckpt_timer;
    ddld_service  *svc;
    ddld_dispatch *d;
    bool           shutdown;
} r0;

static void wake_from_grpc(void *ud)
{
    (void)ud;
    // Fails only on a closing handle (after the loop ended): nothing is left to wake then.
    int rc = uv_async_send(&r0.wake);
    if (rc != 0) {
        ddld_log("uv_async_send: %s (the loop is closing)", uv_strerror(rc));
    }
}

static void on_wake(uv_async_t *h)
{
    (void)h; // the main loop drains the queue after uv_run returns
}

static void on_signal(uv_signal_t *h, int signum)
{
    (void)h;
    if (signum == SIGUSR1) {
        ddld_log("SIGUSR1: checkpoint requested");
        ddld_dispatch_request_checkpoint(r0.d);
    } else if (signum == SIGHUP) {
        ddld_auth_reload(); // --token-file again (auth.c); a bad file keeps the old tokens
    } else if (!r0.shutdown) {
        ddld_log("%s: shutting down gracefully", signum == SIGTERM  ? "SIGTERM"
                                                 : signum == SIGINT ? "SIGINT"
                                                                    : "SIGUSR2");
        ddld_shared_mark_shutdown();
        r0.shutdown = true;
    }
}

// Timed checkpoints go the SIGUSR1 way: at the next step boundary of a Train, or when the
// current command ends.
static void on_ckpt_timer(uv_timer_t *h)
{
    (void)h;
    ddld_dispatch_request_checkpoint_if_stale(r0.d);
}

static void poll_loop(void *ud)
{
    (void)ud;
    uv_run(&r0.loop, UV_RUN_NOWAIT);
}

// host:port of what we bound, written to temp and renamed into place (readers never see a
// partial file).
static int write_address(const ddld_config *cfg, int port)
{
    char text[600];
    if (strncmp(cfg->listen, "unix:", 5) == 0) {
        snprintf(text, sizeof text, "%s\n", cfg->listen);
    } else {
        const char *colon = strrchr(cfg->listen, ':');
        int         hl    = colon != NULL ? (int)(colon - cfg->listen) : (int)strlen(cfg->listen);
        snprintf(text, sizeof text, "%.*s:%d\n", hl, cfg->listen, port);
    }
    if (cfg->address_file == NULL) {
        return 0;
    }
    return ddld_write_text("--address-file", cfg->address_file, text);
}

static void close_handle(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h)) {
        uv_close(h, NULL);
    }
}

// Closes every handle of the loop (each closes once, in the order the loop holds them),
// runs the loop until their close callbacks ran, and closes the loop.
static void loop_close(void)
{
    uv_walk(&r0.loop, close_handle, NULL);
    uv_run(&r0.loop, UV_RUN_DEFAULT); // returns once no handle is left
    int rc = uv_loop_close(&r0.loop);
    if (rc != 0) {
        ddld_log("uv_loop_close: %s", uv_strerror(rc));
    }
}

// The loop, its async handle, its signal handles and the checkpoint timer. Returns 0, or
// -1 after a logged reason with everything it made released.
static int loop_start(const ddld_config *cfg)
{
    struct {
        uv_signal_t *h;
        int          signum;
    } const sigs[] = {{&r0.sig_term, SIGTERM},
                      {&r0.sig_int, SIGINT},
                      {&r0.sig_usr1, SIGUSR1},
                      {&r0.sig_usr2, SIGUSR2},
                      {&r0.sig_hup, SIGHUP}};
    const char *what;
    int         rc = uv_loop_init(&r0.loop);
    if (rc != 0) {
        ddld_log("start-up: uv_loop_init: %s", uv_strerror(rc));
        return -1;
    }
    if ((rc = uv_async_init(&r0.loop, &r0.wake, on_wake)) != 0) {
        what = "uv_async_init";
        goto fail_handles;
    }
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        if ((rc = uv_signal_init(&r0.loop, sigs[i].h)) != 0) {
            what = "uv_signal_init";
            goto fail_handles;
        }
        if ((rc = uv_signal_start(sigs[i].h, on_signal, sigs[i].signum)) != 0) {
            what = "uv_signal_start";
            goto fail_handles;
        }
    }
    if ((rc = uv_timer_init(&r0.loop, &r0.ckpt_timer)) != 0) {
        what = "uv_timer_init";
        goto fail_handles;
    }
    if (cfg->checkpoint_interval > 0) {
        uint64_t ms = (uint64_t)cfg->checkpoint_interval * 1000;
        if ((rc = uv_timer_start(&r0.ckpt_timer, on_ckpt_timer, ms, ms)) != 0) {
            what = "uv_timer_start";
            goto fail_handles;
        }
    }
    return 0;

fail_handles: // the handles made so far are the loop's: closing them all is the reverse
    ddld_log("start-up: %s: %s", what, uv_strerror(rc));
    loop_close();
    return -1;
}

// Serves until a Shutdown or a signal, then the orderly part of shutdown that needs the
// workers and the service still up.
static void serve(const ddld_config *cfg, ddld_dispatch *d, int port)
{
    ddld_dispatch_set_hooks(d, r0.svc, poll_loop, NULL);
    if (strncmp(cfg->listen, "unix:", 5) == 0) {
        ddld_log("listening on %s (pid %d)", cfg->listen, (int)getpid());
    } else {
        const char *colon = strrchr(cfg->listen, ':');
        int         hl = colon != NULL ? (int)(colon - cfg->listen) : (int)strlen(cfg->listen);
        ddld_log("listening on %.*s:%d (pid %d)", hl, cfg->listen, port, (int)getpid());
    }
    if (getenv("DDLD_TEST_ALLOC_FAIL") != NULL) { // the sweep's map of start-up and session
        ddld_log("alloc-fail test: %llu allocations at serving",
                 (unsigned long long)ddl_alloc_count());
    }
    while (!r0.shutdown) {
        uv_run(&r0.loop, UV_RUN_ONCE);
        ddld_dispatch_checkpoint_pending(d);
        do {
            ddld_job *job;
            while (!r0.shutdown && (job = ddld_service_pop(r0.svc)) != NULL) {
                if (job->method == DDLD_M_INTERNAL && job->internal == DDLD_JOB_SHUTDOWN) {
                    r0.shutdown = true;
                    ddld_job_free(job);
                    break;
                }
                ddld_dispatch_run(d, job);
                ddld_dispatch_checkpoint_pending(d);
            }
            // Inference calls waiting for batch-mates: more arrive, or their batch runs.
        } while (!r0.shutdown && ddld_dispatch_batch_wait(d));
    }
    ddld_dispatch_batch_run(d); // the calls taken in before the shutdown are answered
    // The order gRPC needs (docs/SERVER.md, "Signals and shutdown"): refuse and fail
    // what is queued, then the final checkpoint while the workers are still here, then
    // the gRPC teardown, and only then release the workers.
    ddld_service_close(r0.svc);
    ddld_dispatch_final_checkpoint(d);
    ddld_metrics_stop(); // scrapes see the final checkpoint; the service outlives them
    ddld_http_stop();    // its calls were all answered by ddld_service_close
}

static int run_rank0(const ddld_config *cfg, ddld_dispatch *d)
{
    r0.d = d;
    // The loop and its signal handles come first, so a signal during a long start-up
    // (building a big model, --resume) is held for the loop instead of killing rank 0.
    int code = DDLD_EXIT_START;
    if (loop_start(cfg) != 0) {
        goto out_quit;
    }
    // TLS and token files are read before any collective work: a bad file stops every rank
    // at once (the workers leave with our code through ddld_dispatch_quit below).
    code = ddld_auth_startup(cfg);
    if (code != 0) {
        goto out_auth;
    }
    code = ddld_dispatch_startup(d);
    if (code != 0) {
        goto out_auth;
    }
    if (ddld_metrics_start() != 0) {
        code = DDLD_EXIT_START; // a bad or busy --metrics-listen: before gRPC serves anything
        goto out_metrics;
    }
    // HTTP before gRPC: TLS takes its copy of the key first (gRPC's credentials wipe ours),
    // and answers 503 until the service is attached.
    if (ddld_http_start(cfg) != 0) {
        code = DDLD_EXIT_START;
        goto out_http;
    }
    int port = 0;
    r0.svc   = ddld_service_start(cfg, wake_from_grpc, NULL, &port);
    if (r0.svc == NULL) {
        code = DDLD_EXIT_START;
        goto out_http;
    }
    ddld_metrics_attach(r0.svc);
    ddld_http_attach(r0.svc);
    if (write_address(cfg, port) != 0) {
        code = DDLD_EXIT_START;
        ddld_metrics_stop();
        ddld_service_close(r0.svc);
        ddld_http_stop();
        goto out_service;
    }
    serve(cfg, d, port);

    // The way out, in the reverse order of the way in; a failed start-up enters it at the
    // label after the last thing it acquired.
out_service:
    ddld_http_stop(); // every HTTP call was answered by ddld_service_close
    ddld_service_stop(&r0.svc, code == 0 ? cfg->grace_s : 0);
out_http:
    ddld_http_stop(); // NULL-safe and idempotent
out_metrics:
    ddld_metrics_stop(); // NULL-safe and idempotent
out_auth:
    ddld_auth_shutdown();
    loop_close();
out_quit:
    ddld_dispatch_quit(d, code); // the workers leave with our code
    return code;
}

// How every rank leaves once MPI is up: its exit line first, then MPI_Finalize. Once one rank
// has exited nonzero mpirun tears the job down and stops forwarding output, so a line printed
// after MPI_Finalize (whose fence every rank passes together) may never reach the log, and a
// worker's "exit 2" would be lost even though it did exit 2.
static int leave(int code, bool say)
{
    if (getenv("DDLD_TEST_ALLOC_FAIL") != NULL) {
        ddld_log("alloc-fail test: %llu allocations", (unsigned long long)ddl_alloc_count());
    }
    if (say) {
        ddld_log("exit %d", code);
    }
    fflush(stdout);
    fflush(stderr);
    MPI_Finalize();
    return code;
}

int main(int argc, char **argv)
{
    ddld_log_engine_sink();       // engine warnings carry the daemon's prefix from the start
    ddl_blas_startup(argc, argv); // may re-execute: before MPI, gRPC and threads
    // Before MPI_Init we know our rank only from the launcher's environment; use it so
    // a bad command line is reported once, not P times.
    static const char *const rank_vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK",
                                            "SLURM_PROCID"};
    const char              *env_rank    = NULL;
    for (size_t i = 0; env_rank == NULL && i < sizeof rank_vars / sizeof rank_vars[0]; i++) {
        env_rank = getenv(rank_vars[i]);
    }
    bool first = env_rank == NULL || strcmp(env_rank, "0") == 0;

    ddld_config cfg;
    int         pa = parse_args(argc, argv, &cfg, first);
    if (pa == 1) {
        return 0; // --help
    }
    if (pa != 0) {
        // Rank 0 has printed the problem. Every rank leaves through one barrier, so no rank's
        // exit makes mpirun tear the job down before rank 0's message is out.
        fflush(stderr);
        MPI_Init(&argc, &argv);
        MPI_Barrier(MPI_COMM_WORLD);
        MPI_Finalize();
        return 2;
    }
    ddl_malloc_tune_for_streaming();
    signal(SIGPIPE, SIG_IGN);
    // A file-size limit (ulimit -f) makes a checkpoint write fail with EFBIG, reported to
    // the caller, instead of killing the rank with SIGXFSZ.
    signal(SIGXFSZ, SIG_IGN);

    // The watchdog's heartbeat thread calls MPI beside the main thread.
    int required = cfg.watchdog_s > 0 ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED;
    int provided;
    MPI_Init_thread(&argc, &argv, required, &provided);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    ddld_log_set_rank(rank);
    if (provided < required) {
        if (rank == 0) {
            ddld_log("MPI provides thread level %d, %s needed%s", provided,
                     required == MPI_THREAD_MULTIPLE ? "MULTIPLE" : "FUNNELED",
                     required == MPI_THREAD_MULTIPLE
                         ? " by the watchdog (--watchdog 0 turns it off)"
                         : "");
        }
        return leave(2, true);
    }
    // The metrics options are checked here, where rank 0 can report them before any rank
    // leaves (MPI_Finalize waits for all): every rank reaches the same verdict alone.
    char why[512];
    if (ddld_metrics_check_config(&cfg, why, sizeof why) != 0 ||
        ddld_http_check_config(&cfg, why, sizeof why) != 0) {
        if (rank == 0) {
            ddld_log("%s (see --help)", why);
        }
        return leave(2, true);
    }
    // The same BLAS thread share per rank as distdl-train, so a model trained through the
    // daemon computes exactly what the batch program computes.
    int threads = ddl_runtime_divide_cores(MPI_COMM_WORLD);
    if (rank == 0) {
        ddld_log("%d ranks, BLAS %s, %d thread%s per rank, convolutions %s", size,
                 ddl_blas_summary(), threads, threads == 1 ? "" : "s", ddl_conv_path());
    }
    // TEST ONLY (tests/server/alloc_sweep_test.py): DDLD_TEST_ALLOC_FAIL="N[@RANK]" makes
    // the N-th ddl_malloc of rank RANK (default 0) from here on fail, once (N = 0: none);
    // every rank then logs its allocation count at exit.
    const char *inject = getenv("DDLD_TEST_ALLOC_FAIL");
    if (inject != NULL) {
        unsigned long long n  = 0;
        int                at = 0;
        if (sscanf(inject, "%llu@%d", &n, &at) >= 1 && at == rank) {
            ddl_alloc_fail_after(n, 0);
        }
    }
    // Start-up: each step is agreed on or collective, so a rank that fails takes every rank
    // out with it, through the labels below in the reverse order.
    int            code = DDLD_EXIT_START;
    ddld_dispatch *d    = NULL;
    ddld_watchdog *wd   = NULL;
    int            bad  = ddld_metrics_init(&cfg, rank, size) != 0;
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (bad) {
        goto out_metrics;
    }
    d = ddld_dispatch_create(&cfg, MPI_COMM_WORLD);
    if (d == NULL) {
        goto out_metrics;
    }
    wd = ddld_watchdog_start(MPI_COMM_WORLD, cfg.watchdog_s); // ends the job itself on failure
    if (rank == 0) {
        code = run_rank0(&cfg, d);
    } else {
        // Shutdown is rank 0's decision; mpirun forwards SIGUSR1 (checkpoint) to us too.
        signal(SIGTERM, SIG_IGN);
        signal(SIGINT, SIG_IGN);
        signal(SIGUSR1, SIG_IGN);
        signal(SIGUSR2, SIG_IGN);
        signal(SIGHUP, SIG_IGN);
        code = ddld_dispatch_worker_loop(d);
    }
    ddld_watchdog_stop(&wd);
    ddld_dispatch_destroy(&d);
out_metrics:
    ddld_metrics_free();
    return leave(code, rank == 0 || code != 0); // a failed start says so on every rank
}
