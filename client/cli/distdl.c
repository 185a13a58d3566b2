// distdl: the command-line tool of a running distdld, on libdistdl-client (docs/CLI.md).
//
//   distdl [--address HOST:PORT|unix:PATH | --address-file FILE] [--json] [--timeout SECONDS]
//          [--tls-ca PEM] [--tls-cert PEM --tls-key PEM] [--tls-server-name NAME]
//          [--token-file FILE] <command> [command options]
//
// One command per run: status, health, create, train, eval, predict, pull, push, checkpoint,
// restore, shutdown. Exit codes tell apart a usage error (2), a daemon that cannot be reached
// (3), an error the daemon returned (4), a local file that cannot be read or written (5), a
// command that lost a race with another and changed nothing (6: run it again) and a Train
// cancelled with Ctrl-C (130). 3 and 6 are the retryable ones. With --json every output is
// one JSON object per line on stdout (jansson, doubles printed with 17 significant digits so
// they round-trip).
//
// Everything is checked before the daemon is contacted: flags, numbers, and the files a
// command reads (spec, .npy, safetensors). A bad invocation changes nothing on the daemon.
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "cli_support.h"
#include "ddl_client.h"

enum {
    EXIT_USAGE       = 2,
    EXIT_UNREACHABLE = 3,
    EXIT_SERVER      = 4,
    EXIT_FILE        = 5,
    EXIT_RETRY       = 6, // ABORTED: raced another command, nothing changed; run it again
    EXIT_INTERRUPTED = 130,
};

// ---- options -------------------------------------------------------------------------

enum {
    O_ADDRESS = 256,
    O_ADDRESS_FILE,
    O_JSON,
    O_TIMEOUT,
    O_TLS_CA,
    O_TLS_CERT,
    O_TLS_KEY,
    O_TLS_NAME,
    O_TOKEN_FILE,
    O_HELP,
    O_NAME,
    O_REPLACE,
    O_EPOCHS,
    O_STEPS,
    O_TO_STEP,
    O_DATASET,
    O_EVERY,
    O_SPLIT,
    O_INPUT,
    O_OUTPUT,
    O_DIR,
    O_NO_CHECKPOINT,
    O_TARGETS,
    O_READY,
};

// The global options, accepted before the command and after it.
static const struct option global_options[] = {
    {"address", required_argument, 0, O_ADDRESS},
    {"address-file", required_argument, 0, O_ADDRESS_FILE},
    {"json", no_argument, 0, O_JSON},
    {"timeout", required_argument, 0, O_TIMEOUT},
    {"tls-ca", required_argument, 0, O_TLS_CA},
    {"tls-cert", required_argument, 0, O_TLS_CERT},
    {"tls-key", required_argument, 0, O_TLS_KEY},
    {"tls-server-name", required_argument, 0, O_TLS_NAME},
    {"token-file", required_argument, 0, O_TOKEN_FILE},
    {"help", no_argument, 0, O_HELP},
};
#define N_GLOBAL (sizeof global_options / sizeof global_options[0])

static const struct option command_options[] = {
    {"name", required_argument, 0, O_NAME},
    {"replace", no_argument, 0, O_REPLACE},
    {"epochs", required_argument, 0, O_EPOCHS},
    {"steps", required_argument, 0, O_STEPS},
    {"to-step", required_argument, 0, O_TO_STEP},
    {"dataset", required_argument, 0, O_DATASET},
    {"progress-every", required_argument, 0, O_EVERY},
    {"split", required_argument, 0, O_SPLIT},
    {"input", required_argument, 0, O_INPUT},
    {"output", required_argument, 0, O_OUTPUT},
    {"dir", required_argument, 0, O_DIR},
    {"no-checkpoint", no_argument, 0, O_NO_CHECKPOINT},
    {"targets", required_argument, 0, O_TARGETS},
    {"ready", no_argument, 0, O_READY},
};

// Everything the command line says.
typedef struct cli {
    const char *command;
    const char *address, *address_file, *tls_ca, *tls_cert, *tls_key, *tls_name, *token_file;
    int         json;
    double      timeout_s;
    const char *name, *dataset, *split, *input, *output, *dir, *targets;
    int         replace, no_checkpoint, ready;
    long long   epochs, steps, every; // 0: not given
    long long   to_step;              // --to-step S; -1: not given
    const char *positional[4];
    int         npositional;
    // Read before connecting (prepare()): what the command sends.
    char               *spec;         // create
    char               *spec_name;    // create: the spec's "name" when --name is not given
    ddl_client_tensor   x;            // predict, step, eval of inline samples
    ddl_client_tensor   y;            // step, eval of inline samples: the targets
    ddl_client_weights *weights;      // push
    long long           restore_step; // restore: -1 latest
} cli;

typedef int (*command_fn)(cli *a, ddl_client_t *c);

typedef struct command {
    const char *name;
    command_fn  run;
    int         options[6]; // the command's own options (0-terminated)
    int         min_pos, max_pos;
    const char *usage; // "create SPEC.json [--name N] [--replace]"
    const char *help;  // what it does, its options
} command;

static const command *find_command(const char *name);

// ---- output --------------------------------------------------------------------------

static int         g_json;
static double      g_t0; // when the tool started (wait counts --timeout from it)
static const char *g_command = "";

// Prints one JSON object as one line on stdout and frees it.
static void emit(json_t *o)
{
    char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    if (s) {
        fputs(s, stdout);
        fputc('\n', stdout);
        fflush(stdout);
        free(s);
    }
    json_decref(o);
}

// A JSON string. jansson takes only UTF-8; a path or message with other bytes is shown with
// each byte >= 0x80 as '?' rather than dropped.
static json_t *jstr(const char *s)
{
    json_t *j = json_string(s);
    if (j)
        return j;
    char *copy = strdup(s);
    if (!copy)
        return json_null();
    for (char *p = copy; *p; p++)
        if ((unsigned char)*p >= 0x80)
            *p = '?';
    j = json_string(copy);
    free(copy);
    return j ? j : json_null();
}

static json_t *event(const char *name)
{
    json_t *o = json_object();
    json_object_set_new(o, "event", jstr(name));
    return o;
}

// A number, or null when it is not finite (JSON has no NaN or infinity).
static json_t *jreal(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

static json_t *jshape(int ndim, const int64_t *shape)
{
    json_t *a = json_array();
    for (int i = 0; i < ndim; i++)
        json_array_append_new(a, json_integer(shape[i]));
    return a;
}

static void format_shape(int ndim, const int64_t *shape, char *buf, size_t cap)
{
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (n < cap)
        snprintf(buf + n, cap - n, "]");
}

// Reports an error and returns the exit code: a line on stderr, or with --json an
// {"event":"error"} object on stdout. `code` names the kind: a gRPC status name for errors
// of the daemon, else USAGE, UNAVAILABLE, FILE.
__attribute__((format(printf, 3, 4))) static int fail(int exit_code, const char *code,
                                                      const char *fmt, ...)
{
    char    msg[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (g_json) {
        json_t *o = event("error");
        json_object_set_new(o, "command", jstr(g_command));
        json_object_set_new(o, "code", jstr(code));
        json_object_set_new(o, "message", jstr(msg));
        json_object_set_new(o, "exit", json_integer(exit_code));
        emit(o);
    } else {
        fprintf(stderr, "distdl%s%s: %s\n", g_command[0] ? " " : "", g_command, msg);
        if (exit_code == EXIT_USAGE)
            fprintf(stderr, "Try 'distdl %s%s--help'.\n", g_command, g_command[0] ? " " : "");
    }
    return exit_code;
}

// The exit code for a failed client call, from the gRPC status of this thread's last call:
// UNAVAILABLE (and the connect timeout, which the library reports as UNAVAILABLE) is 3,
// ABORTED (a PushWeights whose model was replaced while it streamed) 6, any other status
// the daemon returned 4. A local error of the library (code OK) is a file
// error for DDL_EIO, else a usage error.
static int fail_call(ddl_status st)
{
    int code = ddl_client_last_code();
    if (code == DDL_RPC_UNAVAILABLE)
        return fail(EXIT_UNREACHABLE, "UNAVAILABLE", "%s", ddl_last_error());
    if (code == DDL_RPC_ABORTED)
        return fail(EXIT_RETRY, "ABORTED", "%s", ddl_last_error());
    if (code != DDL_RPC_OK)
        return fail(EXIT_SERVER, ddl_client_code_name(code), "%s", ddl_last_error());
    if (st == DDL_EIO || st == DDL_EPROTO)
        return fail(EXIT_FILE, "FILE", "%s", ddl_last_error());
    return fail(EXIT_USAGE, "USAGE", "%s", ddl_last_error());
}

// ---- parsing -------------------------------------------------------------------------

// A whole number >= min, or -1 after reporting a usage error naming the flag.
static int parse_count(const char *flag, const char *text, long long min, long long *out)
{
    char *end   = NULL;
    errno       = 0;
    long long v = strtoll(text, &end, 10);
    if (end == text || *end != '\0' || errno == ERANGE || v < min) {
        fail(EXIT_USAGE, "USAGE", "%s needs a whole number >= %lld, got '%s'", flag, min, text);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_seconds(const char *flag, const char *text, double *out)
{
    char *end = NULL;
    errno     = 0;
    double v  = strtod(text, &end);
    if (end == text || *end != '\0' || errno == ERANGE || !(v > 0) || v > 1e6) {
        fail(EXIT_USAGE, "USAGE", "%s needs a number of seconds > 0, got '%s'", flag, text);
        return -1;
    }
    *out = v;
    return 0;
}

// ---- connecting ----------------------------------------------------------------------

// Opens the connection. Returns 0 (c set) or an exit code.
static int connect_daemon(const cli *a, ddl_client_t **c)
{
    static char address[1024];
    char       *file_token = NULL;
    const char *addr = a->address;
    double      wait = a->timeout_s > 0 ? a->timeout_s : 10.0;
    // Files named on the command line are checked before anything is sent.
    const char *files[][2] = {
        {a->tls_ca, "--tls-ca"}, {a->tls_cert, "--tls-cert"}, {a->tls_key, "--tls-key"}};
    for (int i = 0; i < 3; i++)
        if (files[i][0] && access(files[i][0], R_OK) != 0)
            return fail(EXIT_FILE, "FILE", "cannot read %s %s: %s", files[i][1], files[i][0],
                        strerror(errno));
    if (a->address_file) {
        if (ddl_cli_read_address(a->address_file, wait, address, sizeof address) != 0) {
            if (errno == ENOENT)
                return fail(EXIT_UNREACHABLE, "UNAVAILABLE",
                            "no daemon address in %s after %g s (is distdld running with "
                            "--address-file %s?)",
                            a->address_file, wait, a->address_file);
            return fail(EXIT_FILE, "FILE", "cannot read the address file %s: %s", a->address_file,
                        strerror(errno));
        }
        addr = address;
    }
    if (!addr)
        addr = getenv("DDL_ADDRESS");
    if (!addr || !*addr)
        addr = "127.0.0.1:50051";
    const char *tok = getenv("DDL_TOKEN");
    if (a->token_file) {
        // The daemon's token-file rules: a bare token or a "ROLE TOKEN" line, mode 600.
        if (ddl_client_read_token_file(a->token_file, &file_token) != DDL_OK)
            return fail(EXIT_FILE, "FILE", "%s", ddl_last_error());
        tok = file_token;
    }
    ddl_client_options o = ddl_client_options_default();
    // One budget for finding the address and reaching the daemon, counted from the start.
    double left          = wait - (ddl_cli_now() - g_t0);
    o.connect_timeout_s  = left > 0.1 ? left : 0.1;
    o.tls_ca_file        = a->tls_ca;
    o.tls_cert_file      = a->tls_cert;
    o.tls_key_file       = a->tls_key;
    o.tls_server_name    = a->tls_name;
    o.token              = tok && *tok ? tok : NULL;
    o.tune_malloc        = 1; // pull and push stream weights
    ddl_status st        = ddl_client_connect(addr, &o, c); // copies the token
    ddl_client_free_token(&file_token);
    if (st != DDL_OK) {
        if (st == DDL_ETIMEDOUT || ddl_client_last_code() == DDL_RPC_UNAVAILABLE)
            return fail(EXIT_UNREACHABLE, "UNAVAILABLE", "cannot reach distdld at %s: %s", addr,
                        ddl_last_error());
        return fail_call(st);
    }
    return 0;
}

// ---- commands ------------------------------------------------------------------------

static int cmd_status(cli *a, ddl_client_t *c)
{
    (void)a;
    ddl_client_status_info s;
    ddl_status             st = ddl_client_get_status(c, &s);
    if (st != DDL_OK)
        return fail_call(st);
    if (g_json) {
        json_t *o = event("status");
        json_object_set_new(o, "has_model", json_boolean(s.has_model));
        json_object_set_new(o, "model_name", jstr(s.model_name));
        json_object_set_new(o, "world_size", json_integer(s.world_size));
        json_object_set_new(o, "state", jstr(s.state));
        json_object_set_new(o, "step", json_integer(s.step));
        json_object_set_new(o, "epoch", json_integer(s.epoch));
        json_object_set_new(o, "batch", json_integer(s.batch));
        json_object_set_new(o, "last_loss", jreal(s.last_loss));
        json_object_set_new(o, "durable_step", json_integer(s.durable_step));
        json_object_set_new(o, "queue_depth", json_integer(s.queue_depth));
        json_object_set_new(o, "queue_capacity", json_integer(s.queue_capacity));
        json_object_set_new(o, "batch_size", json_integer(s.batch_size));
        json_object_set_new(o, "input_shape", jshape(s.input_ndim, s.input_shape));
        json_object_set_new(o, "num_classes", json_integer(s.num_classes));
        json_object_set_new(o, "datatype", jstr(s.datatype));
        json_object_set_new(o, "num_partitions", json_integer(s.num_partitions));
        json_object_set_new(o, "data_dir", jstr(s.data_dir));
        json_object_set_new(o, "active_calls", json_integer(s.active_calls));
        json_object_set_new(o, "request_queue_depth", json_integer(s.request_queue_depth));
        json_object_set_new(o, "dropped_calls", json_integer(s.dropped_calls));
        json_object_set_new(o, "bytes_per_step", json_integer(s.bytes_per_step));
        emit(o);
        return 0;
    }
    printf("state      %s on %d ranks\n", s.state, s.world_size);
    printf("calls      %d active, %d queued, %lld dropped\n", s.active_calls, s.request_queue_depth,
           (long long)s.dropped_calls);
    if (!s.has_model) {
        printf("model      none (distdl create SPEC.json)\n");
        return 0;
    }
    char shape[128];
    format_shape(s.input_ndim, s.input_shape, shape, sizeof shape);
    printf("model      %s (%d partitions)\n", s.model_name, s.num_partitions);
    printf("input      %s %s per sample, batch %lld, %d classes\n", shape, s.datatype,
           (long long)s.batch_size, s.num_classes);
    printf("step       %lld (epoch %lld, batch %lld), last loss %.4f\n", (long long)s.step,
           (long long)s.epoch, (long long)s.batch, s.last_loss);
    if (s.durable_step >= 0)
        printf("durable    step %lld\n", (long long)s.durable_step);
    else
        printf("durable    none\n");
    printf("queue      %d of %d\n", s.queue_depth, s.queue_capacity);
    printf("traffic    %lld bytes per step\n", (long long)s.bytes_per_step);
    printf("data       %s\n", s.data_dir);
    return 0;
}

static int cmd_health(cli *a, ddl_client_t *c)
{
    (void)a;
    static const char *const names[] = {"UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"};
    ddl_health_status        h;
    ddl_status               st = ddl_client_health_check(c, "", &h);
    if (st != DDL_OK)
        return fail_call(st);
    const char *name = (unsigned)h < 4 ? names[h] : "UNKNOWN";
    if (g_json) {
        json_t *o = event("health");
        json_object_set_new(o, "status", jstr(name));
        json_object_set_new(o, "serving", json_boolean(h == DDL_HEALTH_SERVING));
        emit(o);
    } else {
        printf("%s\n", name);
    }
    // A daemon that answers but does not serve (shutting down) is not healthy.
    return h == DDL_HEALTH_SERVING ? 0 : EXIT_SERVER;
}

// Reads a whole text file (a model spec) into a malloc'd string; NULL after reporting.
static char *read_text_file(const char *path, int *rc)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        *rc = fail(EXIT_FILE, "FILE", "cannot read %s: %s", path, strerror(errno));
        return NULL;
    }
    char  *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap      = cap ? 2 * cap : 16384;
            char *nb = cap <= (64u << 20) ? realloc(buf, cap) : NULL;
            if (!nb) {
                *rc = fail(EXIT_FILE, "FILE", "%s is larger than 64 MiB", path);
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = nb;
        }
        size_t k = fread(buf + n, 1, 4096, f);
        n += k;
        if (k < 4096)
            break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        *rc = fail(EXIT_FILE, "FILE", "cannot read %s (is it a directory?)", path);
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    return buf;
}

// Reached once connected: the daemon answers. --ready: until it also serves (health
// SERVING) with a model loaded, asked every 0.2 s; all within --timeout of the start.
static int cmd_wait(cli *a, ddl_client_t *c)
{
    double                 limit = a->timeout_s > 0 ? a->timeout_s : 10.0;
    ddl_client_status_info s;
    ddl_health_status      h  = DDL_HEALTH_UNKNOWN;
    const char            *why = "";
    for (;;) {
        ddl_status st = ddl_client_get_status(c, &s);
        if (st == DDL_OK && a->ready)
            st = ddl_client_health_check(c, "", &h);
        int code = ddl_client_last_code();
        if (st != DDL_OK && code != DDL_RPC_UNAVAILABLE)
            return fail_call(st); // refused (a token's role, TLS): waiting will not help
        if (st == DDL_OK && (!a->ready || (h == DDL_HEALTH_SERVING && s.has_model)))
            break;
        why = st != DDL_OK                ? "is unavailable"
              : h != DDL_HEALTH_SERVING ? "does not serve (NOT_SERVING: shutting down?)"
                                        : "has no model loaded";
        if (ddl_cli_now() - g_t0 + 0.2 > limit)
            return fail(EXIT_UNREACHABLE, "UNAVAILABLE", "distdld %s after %g s (--timeout)",
                        why, limit);
        usleep(200 * 1000);
    }
    double waited = ddl_cli_now() - g_t0;
    if (g_json) {
        json_t *o = event(a->ready ? "ready" : "reachable");
        json_object_set_new(o, "has_model", json_boolean(s.has_model));
        json_object_set_new(o, "model_name", jstr(s.model_name));
        json_object_set_new(o, "state", jstr(s.state));
        json_object_set_new(o, "step", json_integer(s.step));
        json_object_set_new(o, "waited_seconds", json_real(waited));
        emit(o);
    } else {
        printf("%s after %.1f s: %s%s, state %s, step %lld\n", a->ready ? "ready" : "reachable",
               waited, s.has_model ? "model " : "no model", s.has_model ? s.model_name : "",
               s.state, (long long)s.step);
    }
    return 0;
}

static int cmd_create(cli *a, ddl_client_t *c)
{
    ddl_client_model_info info;
    ddl_status            st = ddl_client_create_model(c, a->spec, a->name, a->replace, &info);
    if (st != DDL_OK)
        return fail_call(st);
    if (g_json) {
        json_t *o = event("create");
        json_object_set_new(o, "name", jstr(info.name));
        json_object_set_new(o, "world_size", json_integer(info.world_size));
        json_object_set_new(o, "num_parameters", json_integer(info.num_parameters));
        json_object_set_new(o, "batch_size", json_integer(info.batch_size));
        json_object_set_new(o, "input_shape", jshape(info.input_ndim, info.input_shape));
        json_object_set_new(o, "num_classes", json_integer(info.num_classes));
        json_object_set_new(o, "datatype", jstr(info.datatype));
        emit(o);
    } else {
        char shape[128];
        format_shape(info.input_ndim, info.input_shape, shape, sizeof shape);
        printf("created model '%s': %lld parameters on %d ranks, batch %lld, input %s %s, "
               "%d classes\n",
               info.name, (long long)info.num_parameters, info.world_size,
               (long long)info.batch_size, shape, info.datatype, info.num_classes);
    }
    return 0;
}

// ---- train ---------------------------------------------------------------------------

static volatile sig_atomic_t g_interrupted;

static void on_sigint(int sig)
{
    g_interrupted = sig;
}

typedef struct train_state {
    ddl_cli_progress bar;
    int              show; // progress on stderr (not with --json)
    long long        every;
    int64_t          last_line_done; // `done` of the last line shown in the plain mode
} train_state;

static json_t *progress_json(const char *name, const ddl_client_progress *p)
{
    json_t *o = event(name);
    json_object_set_new(o, "step", json_integer(p->step));
    json_object_set_new(o, "epoch", json_integer(p->epoch));
    json_object_set_new(o, "batch", json_integer(p->batch));
    json_object_set_new(o, "steps_per_epoch", json_integer(p->steps_per_epoch));
    json_object_set_new(o, "loss", jreal(p->loss));
    json_object_set_new(o, "accuracy", jreal(p->accuracy));
    json_object_set_new(o, "images_per_second", jreal(p->images_per_second));
    json_object_set_new(o, "done", json_integer(p->done));
    json_object_set_new(o, "total", json_integer(p->total));
    json_object_set_new(o, "epoch_end", json_boolean(p->epoch_end));
    json_object_set_new(o, "durable", json_boolean(p->durable));
    json_object_set_new(o, "mse", jreal(p->mse));
    return o;
}

static int on_progress(const ddl_client_progress *p, void *ud)
{
    train_state *t = ud;
    if (g_interrupted)
        return 1;
    if (p->finished)
        return 0; // reported by the caller ("done")
    if (g_json) {
        json_t *o = progress_json("progress", p);
        json_object_set_new(o, "mean_loss", jreal(p->mean_loss));
        emit(o);
    } else if (t->show) {
        // On a terminal records come more often than --progress-every (a smooth bar, a quick
        // Ctrl-C); plain lines keep to its granularity.
        if (t->bar.tty || p->epoch_end || p->done - t->last_line_done >= t->every ||
            p->done == p->total) {
            ddl_cli_progress_update(&t->bar, p);
            t->last_line_done = p->done;
        }
    }
    return g_interrupted ? 1 : 0;
}

// Where the daemon really stopped after a cancelled Train. The call ends as soon as the
// client cancels it, while the daemon finishes the step in progress and only then goes idle
// and publishes its step; so wait (up to 30 s) until it is idle and its step has stayed the
// same over two reads 50 ms apart.
static int64_t stopped_step(ddl_client_t *c, int64_t fallback)
{
    int64_t seen = -1;
    double  end  = ddl_cli_now() + 30.0;
    while (ddl_cli_now() < end) {
        ddl_client_status_info s;
        if (ddl_client_get_status(c, &s) != DDL_OK)
            return fallback;
        if (strcmp(s.state, "training") != 0) {
            if (s.step == seen)
                return seen;
            seen = s.step;
        }
        usleep(50000);
    }
    return seen >= 0 ? seen : fallback;
}

static int cmd_train(cli *a, ddl_client_t *c)
{
    if (a->to_step >= 0) {
        // Idempotent: the steps still missing from the model's own step. Not atomic with the
        // Train: a Train of another client in between moves the step (docs/CLI.md).
        ddl_client_status_info s;
        ddl_status             st = ddl_client_get_status(c, &s);
        if (st != DDL_OK)
            return fail_call(st);
        if (!s.has_model)
            return fail(EXIT_SERVER, "FAILED_PRECONDITION", "--to-step %lld: the daemon has no model",
                        a->to_step);
        if (s.step > a->to_step)
            return fail(EXIT_SERVER, "FAILED_PRECONDITION",
                        "--to-step %lld: model %s is at step %lld already, past it", a->to_step,
                        s.model_name, (long long)s.step);
        if (s.step == a->to_step) {
            if (g_json) {
                // The fields of a Train's last record, for a Train of no steps: no means
                // (null), no throughput; steps_per_epoch is not in GetStatus (0).
                ddl_client_progress p = {.step      = s.step,
                                         .epoch     = s.epoch,
                                         .batch     = s.batch,
                                         .loss      = NAN,
                                         .accuracy  = NAN,
                                         .durable   = s.durable_step == s.step,
                                         .finished  = 1,
                                         .mean_loss = NAN,
                                         .mse       = -1};
                json_t *o           = progress_json("done", &p);
                json_object_set_new(o, "mean_loss", jreal(p.mean_loss));
                json_object_set_new(o, "seconds", json_real(0));
                emit(o);
            } else {
                printf("model %s is at step %lld already: nothing to train\n", s.model_name,
                       (long long)s.step);
            }
            return 0;
        }
        a->steps = a->to_step - s.step;
    }
    train_state t = {.every = a->every ? a->every : 50, .show = !g_json};
    ddl_cli_progress_init(&t.bar, stderr, !g_json && isatty(STDERR_FILENO));
    ddl_client_train_request req = {.steps   = a->steps,
                                    .epochs  = a->epochs,
                                    .dataset = a->dataset,
                                    .progress_every =
                                        (int32_t)(t.every > 1 << 30 ? 1 << 30 : t.every)};
    if (t.bar.tty && req.progress_every > 5)
        req.progress_every = 5;

    // Ctrl-C cancels the Train: the callback returns nonzero at the next record, the daemon
    // stops at its next step boundary. A second Ctrl-C kills the process (SA_RESETHAND).
    struct sigaction sa = {0}, old_int, old_term;
    sa.sa_handler       = on_sigint;
    sa.sa_flags         = SA_RESETHAND | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);

    double              t0 = ddl_cli_now();
    ddl_client_progress last;
    memset(&last, 0, sizeof last);
    ddl_status st      = ddl_client_train(c, &req, on_progress, &t, &last);
    double     seconds = ddl_cli_now() - t0;
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    if (t.show)
        ddl_cli_progress_end(&t.bar);

    if (st == DDL_ECANCELED && g_interrupted) {
        int64_t step = stopped_step(c, last.step);
        if (g_json) {
            json_t *o = progress_json("cancelled", &last);
            json_object_set_new(o, "step", json_integer(step));
            json_object_set_new(o, "seconds", json_real(seconds));
            emit(o);
        } else {
            fprintf(stderr, "distdl train: cancelled; the daemon stopped at step %lld\n",
                    (long long)step);
        }
        return 128 + (int)g_interrupted; // 130 for SIGINT, 143 for SIGTERM
    }
    if (st != DDL_OK)
        return fail_call(st);
    if (g_json) {
        json_t *o = progress_json("done", &last);
        json_object_set_new(o, "mean_loss", jreal(last.mean_loss));
        json_object_set_new(o, "seconds", json_real(seconds));
        emit(o);
    } else {
        char took[32];
        ddl_cli_format_duration(seconds, took, sizeof took);
        printf("trained %lld steps in %s, now at step %lld: loss %.4f, accuracy %.4f (means over "
               "the run), %.0f images/s\n",
               (long long)last.done, took, (long long)last.step, last.mean_loss, last.accuracy,
               last.images_per_second);
    }
    return 0;
}

// ---- eval, predict -------------------------------------------------------------------

// The batch of an inline step or evaluation: --input and --targets, read by prepare().
static ddl_client_batch inline_batch(const cli *a)
{
    ddl_client_batch b;
    memset(&b, 0, sizeof b);
    b.x       = a->x;
    b.targets = a->y;
    return b;
}

static int cmd_eval(cli *a, ddl_client_t *c)
{
    // Inline samples (--input, --targets) or a split of the daemon's data.
    const char            *split = a->input ? "inline" : a->split ? a->split : "test";
    ddl_client_batch       b     = inline_batch(a);
    ddl_client_eval_result r;
    ddl_status st = ddl_client_evaluate(c, a->dataset ? a->dataset : "", a->input ? NULL : split,
                                        a->input ? &b : NULL, &r);
    if (st != DDL_OK)
        return fail_call(st);
    if (g_json) {
        json_t *o = event("eval");
        json_object_set_new(o, "split", jstr(split));
        if (a->input) {
            json_object_set_new(o, "input", jstr(a->input));
            json_object_set_new(o, "targets", jstr(a->targets));
        }
        json_object_set_new(o, "count", json_integer(r.count));
        json_object_set_new(o, "loss", jreal(r.loss));
        json_object_set_new(o, "accuracy", jreal(r.accuracy));
        json_object_set_new(o, "mse", jreal(r.mse));
        json_object_set_new(o, "rel_l2", jreal(r.rel_l2));
        json_object_set_new(o, "fg_iou", jreal(r.fg_iou));
        emit(o);
    } else if (r.mse >= 0) { // dense targets: regression, masks
        printf("%s mse %.6g, relative L2 error %.4f", split, r.mse, r.rel_l2);
        if (r.accuracy >= 0) {
            printf(", voxel accuracy %.4f", r.accuracy);
        }
        printf(" (loss %.4f, %lld samples)\n", r.loss, (long long)r.count);
    } else {
        printf("%s accuracy %.4f (loss %.4f, %lld images)", split, r.accuracy, r.loss,
               (long long)r.count);
        if (r.fg_iou >= 0) {
            printf(", foreground IoU %.4f", r.fg_iou);
        }
        printf("\n");
    }
    return 0;
}

static int cmd_step(cli *a, ddl_client_t *c)
{
    ddl_client_batch       b = inline_batch(a);
    ddl_client_step_result r;
    ddl_status             st = ddl_client_step(c, &b, &r);
    if (st != DDL_OK)
        return fail_call(st);
    if (g_json) {
        json_t *o = event("step");
        json_object_set_new(o, "input", jstr(a->input));
        json_object_set_new(o, "targets", jstr(a->targets));
        json_object_set_new(o, "step", json_integer(r.step));
        json_object_set_new(o, "loss", jreal(r.loss));
        json_object_set_new(o, "accuracy", jreal(r.accuracy));
        json_object_set_new(o, "mse", jreal(r.mse));
        json_object_set_new(o, "durable", json_boolean(r.durable));
        emit(o);
    } else {
        printf("step %lld: loss %.4f", (long long)r.step, r.loss);
        if (r.mse >= 0)
            printf(", mse %.6g", r.mse);
        if (r.accuracy >= 0)
            printf(", accuracy %.4f", r.accuracy);
        printf("%s\n", r.durable ? " (checkpoint durable)" : "");
    }
    return 0;
}

// The index of the largest of the k logits of row i.
static int64_t argmax_row(const ddl_client_tensor *z, int64_t i, int64_t k)
{
    int64_t best = 0;
    for (int64_t j = 1; j < k; j++) {
        double a, b;
        if (z->dtype == DDL_WIRE_FP64) {
            a = ((const double *)z->data)[i * k + j];
            b = ((const double *)z->data)[i * k + best];
        } else {
            a = ((const float *)z->data)[i * k + j];
            b = ((const float *)z->data)[i * k + best];
        }
        if (a > b)
            best = j;
    }
    return best;
}

static int cmd_predict(cli *a, ddl_client_t *c)
{
    ddl_client_tensor z;
    ddl_status        st = ddl_client_predict(c, &a->x, &z);
    if (st != DDL_OK)
        return fail_call(st);
    int rc = 0;
    if (ddl_client_npy_write(a->output, &z) != DDL_OK) {
        rc = fail(EXIT_FILE, "FILE", "%s", ddl_last_error());
        ddl_client_tensor_release(&z);
        return rc;
    }
    // Classes (argmax) only for a classifier's [n, classes]; a volume's output is the file.
    int64_t n = z.ndim >= 1 ? z.shape[0] : 0, k = z.ndim == 2 ? z.shape[1] : 0;
    if (g_json) {
        json_t *o = event("predict");
        json_object_set_new(o, "input", jstr(a->input));
        json_object_set_new(o, "output", jstr(a->output));
        json_object_set_new(o, "count", json_integer(n));
        json_object_set_new(o, "shape", jshape(z.ndim, z.shape));
        json_object_set_new(o, "dtype", jstr(ddl_wire_dtype_name(z.dtype)));
        json_t *cls = json_array();
        for (int64_t i = 0; i < n && k > 0; i++)
            json_array_append_new(cls, json_integer(argmax_row(&z, i, k)));
        json_object_set_new(o, "classes", cls);
        emit(o);
    } else {
        char shape[128];
        format_shape(z.ndim, z.shape, shape, sizeof shape);
        printf("logits %s %s written to %s\n", shape, ddl_wire_dtype_name(z.dtype), a->output);
        if (k > 0) {
            printf("classes");
            for (int64_t i = 0; i < n && i < 32; i++)
                printf(" %lld", (long long)argmax_row(&z, i, k));
            printf("%s\n", n > 32 ? " ..." : "");
        }
    }
    ddl_client_tensor_release(&z);
    return rc;
}

// ---- weights -------------------------------------------------------------------------

static int cmd_pull(cli *a, ddl_client_t *c)
{
    ddl_client_weights *w;
    ddl_status          st = ddl_client_pull_weights(c, &w);
    if (st != DDL_OK)
        return fail_call(st);
    size_t bytes = 0;
    for (int64_t i = 0; i < w->count; i++)
        bytes += w->tensors[i].bytes;
    int rc = 0;
    if (ddl_safetensors_write(a->output, w) != DDL_OK) {
        rc = fail(EXIT_FILE, "FILE", "%s", ddl_last_error());
    } else if (g_json) {
        json_t *o = event("pull");
        json_object_set_new(o, "output", jstr(a->output));
        json_object_set_new(o, "tensors", json_integer(w->count));
        json_object_set_new(o, "bytes", json_integer((json_int_t)bytes));
        emit(o);
    } else {
        printf("pulled %lld tensors (%zu bytes) into %s\n", (long long)w->count, bytes, a->output);
    }
    ddl_client_weights_destroy(&w);
    return rc;
}

static int cmd_push(cli *a, ddl_client_t *c)
{
    int32_t                   tensors = 0;
    int64_t                   bytes   = 0;
    const ddl_client_weights *w       = a->weights;
    ddl_status st = ddl_client_push_weights(c, w->tensors, w->count, &tensors, &bytes);
    if (st != DDL_OK)
        return fail_call(st);
    if (g_json) {
        json_t *o = event("push");
        json_object_set_new(o, "input", jstr(a->input));
        json_object_set_new(o, "tensors", json_integer(tensors));
        json_object_set_new(o, "bytes", json_integer(bytes));
        emit(o);
    } else {
        printf("pushed %d tensors (%lld bytes) from %s\n", tensors, (long long)bytes, a->input);
    }
    return 0;
}

// ---- checkpoints, shutdown -----------------------------------------------------------

static int cmd_checkpoint(cli *a, ddl_client_t *c)
{
    ddl_client_checkpoint_result r;
    ddl_status                   st = ddl_client_checkpoint(c, a->dir, &r);
    if (st != DDL_OK)
        return fail_call(st);
    if (g_json) {
        json_t *o = event("checkpoint");
        json_object_set_new(o, "step", json_integer(r.step));
        json_object_set_new(o, "durable", json_boolean(r.durable));
        json_object_set_new(o, "path", jstr(r.path));
        emit(o);
    } else {
        printf("checkpoint of step %lld in %s%s\n", (long long)r.step, r.path,
               r.durable ? " (durable)" : " (not durable)");
    }
    return 0;
}

static int cmd_restore(cli *a, ddl_client_t *c)
{
    int64_t    restored = -1;
    ddl_status st       = ddl_client_restore(c, a->restore_step, a->dir, &restored);
    if (st != DDL_OK)
        return fail_call(st);
    if (g_json) {
        json_t *o = event("restore");
        json_object_set_new(o, "step", json_integer(restored));
        emit(o);
    } else {
        printf("restored step %lld\n", (long long)restored);
    }
    return 0;
}

static int cmd_shutdown(cli *a, ddl_client_t *c)
{
    int64_t    durable    = -1;
    int        checkpoint = !a->no_checkpoint;
    ddl_status st         = ddl_client_shutdown(c, checkpoint, &durable);
    if (st != DDL_OK && checkpoint && ddl_client_last_code() == DDL_RPC_FAILED_PRECONDITION) {
        // The daemon refuses a final checkpoint it cannot write (no --checkpoint-dir, no
        // model) and changes nothing: stop it without one, as SIGTERM would.
        checkpoint = 0;
        st         = ddl_client_shutdown(c, 0, &durable);
    }
    if (st != DDL_OK)
        return fail_call(st);
    if (g_json) {
        json_t *o = event("shutdown");
        json_object_set_new(o, "checkpoint", json_boolean(checkpoint));
        json_object_set_new(o, "durable_step", json_integer(durable));
        emit(o);
    } else if (durable >= 0) {
        printf("daemon shutting down (durable checkpoint: step %lld)\n", (long long)durable);
    } else {
        printf("daemon shutting down (no checkpoint)\n");
    }
    return 0;
}

// ---- the command table ---------------------------------------------------------------

static const command commands[] = {
    {"status",
     cmd_status,
     {0},
     0,
     0,
     "status",
     "The daemon's state: model, step, durable checkpoint, queue.\n"},
    {"health",
     cmd_health,
     {0},
     0,
     0,
     "health",
     "grpc.health.v1 Check: prints SERVING (exit 0) or NOT_SERVING (exit 4).\n"},
    {"wait",
     cmd_wait,
     {O_READY, 0},
     0,
     0,
     "wait [--ready]",
     "Wait until distdld answers, at most --timeout seconds (default 10) from the start (an\n"
     "--address-file that does not exist yet is waited for too). For workflows: exit 0 once\n"
     "it is there, 3 when the time runs out (retryable, like every 3).\n"
     "  --ready   wait also until it serves (health SERVING) with a model loaded\n"},
    {"create",
     cmd_create,
     {O_NAME, O_REPLACE, 0},
     1,
     1,
     "create SPEC.json [--name N] [--replace]",
     "Create the daemon's model from a model spec (docs/MODEL_SPEC.md).\n"
     "  --name N     the model's name (default: the spec's)\n"
     "  --replace    replace an existing model (without it that is an error)\n"},
    {"train",
     cmd_train,
     {O_EPOCHS, O_STEPS, O_TO_STEP, O_DATASET, O_EVERY, 0},
     0,
     0,
     "train (--epochs N | --steps N | --to-step S) [--dataset D] [--progress-every K]",
     "Train over the daemon's dataset. On a terminal a progress bar on stderr (step, loss,\n"
     "accuracy, images/s, ETA); otherwise a line per K steps and per epoch end. Ctrl-C\n"
     "cancels the Train at the next step boundary and exits 130.\n"
     "  --epochs N          train N epochs\n"
     "  --steps N           train N optimizer steps\n"
     "  --to-step S         train until the model is at step S (none when it is there\n"
     "                      already; an error when it is past S): a retried workflow step\n"
     "                      goes on from where a restarted daemon resumed\n"
     "  --dataset D         an IDX directory relative to the daemon's --data-root\n"
     "  --progress-every K  a progress record every K steps (default 50)\n"},
    {"eval",
     cmd_eval,
     {O_SPLIT, O_DATASET, O_INPUT, O_TARGETS, 0},
     0,
     0,
     "eval [--split test|train] [--dataset D] | eval --input X.npy --targets Y.npy",
     "Evaluate the model on a split of the daemon's dataset, or on inline samples: loss and\n"
     "the metrics that fit the model (accuracy; foreground IoU; mse and relative L2 error).\n"
     "  --split S      test (default) or train\n"
     "  --dataset D    an IDX directory relative to the daemon's --data-root\n"
     "  --input X.npy  samples [n, sample...] (float32, float64 or uint8 pixels)\n"
     "  --targets Y.npy  their targets: int64 labels [n] or [n, spatial...], or float32/64\n"
     "                 values shaped like the model's output\n"},
    {"step",
     cmd_step,
     {O_INPUT, O_TARGETS, 0},
     0,
     0,
     "step --input X.npy --targets Y.npy",
     "One optimizer step on an inline batch of exactly the spec's batch_size samples.\n"
     "  --input X.npy    samples [n, sample...] (float32, float64 or uint8 pixels)\n"
     "  --targets Y.npy  their targets: int64 labels [n] or [n, spatial...], or float32/64\n"
     "                   values shaped like the model's output\n"},
    {"predict",
     cmd_predict,
     {O_INPUT, O_OUTPUT, 0},
     0,
     0,
     "predict --input X.npy --output LOGITS.npy",
     "Logits for the samples of a .npy file ([n, sample...], C order, float32, float64 or\n"
     "uint8 pixels), written as a .npy file [n, classes].\n"},
    {"pull",
     cmd_pull,
     {O_OUTPUT, 0},
     0,
     0,
     "pull --output W.safetensors",
     "Pull the global (unsharded) weights into a safetensors file.\n"},
    {"push",
     cmd_push,
     {O_INPUT, 0},
     0,
     0,
     "push --input W.safetensors",
     "Push weights from a safetensors file: every weight of the model, each once (the\n"
     "daemon applies all or nothing).\n"},
    {"checkpoint",
     cmd_checkpoint,
     {O_DIR, 0},
     0,
     0,
     "checkpoint [--dir D]",
     "Write a durable checkpoint (default: the daemon's --checkpoint-dir).\n"},
    {"restore",
     cmd_restore,
     {O_DIR, 0},
     1,
     1,
     "restore (STEP|latest) [--dir D]",
     "Restore the checkpoint of STEP, or the newest durable one.\n"
     "  --dir D      the checkpoint directory (default: the daemon's --checkpoint-dir)\n"},
    {"shutdown",
     cmd_shutdown,
     {O_NO_CHECKPOINT, 0},
     0,
     0,
     "shutdown [--no-checkpoint]",
     "Stop the daemon, after a final checkpoint when it has a checkpoint directory.\n"
     "  --no-checkpoint   skip the final checkpoint\n"},
};
static const size_t n_commands = sizeof commands / sizeof commands[0];

static const command *find_command(const char *name)
{
    for (size_t i = 0; i < n_commands; i++)
        if (strcmp(commands[i].name, name) == 0)
            return &commands[i];
    return NULL;
}

// ---- help ----------------------------------------------------------------------------

static const char global_usage[] =
    "usage: distdl [--address HOST:PORT|unix:PATH | --address-file FILE] [--json]\n"
    "              [--timeout SECONDS] [--tls-ca PEM] [--tls-cert PEM --tls-key PEM]\n"
    "              [--tls-server-name NAME] [--token-file FILE] <command> [options]\n";

static const char global_help[] =
    "\n"
    "Global options (before or after the command):\n"
    "  --address A        the daemon: HOST:PORT or unix:PATH (default $DDL_ADDRESS,\n"
    "                     else 127.0.0.1:50051)\n"
    "  --address-file F   read the address from distdld's --address-file (waits for it\n"
    "                     up to --timeout)\n"
    "  --json             one JSON object per line on stdout (docs/CLI.md)\n"
    "  --timeout S        seconds to wait for the daemon to be reachable (default 10)\n"
    "  --tls-ca PEM       TLS with these root certificates\n"
    "  --tls-cert PEM, --tls-key PEM   client certificate for mutual TLS\n"
    "  --tls-server-name NAME          expected name in the server certificate\n"
    "  --token-file F     bearer token: a file with the token alone or a \"ROLE TOKEN\"\n"
    "                     line, mode 600 (default $DDL_TOKEN)\n"
    "\n"
    "Exit codes: 0 success, 2 usage error, 3 cannot reach the daemon, 4 the daemon returned\n"
    "an error, 5 a local file cannot be read or written, 6 the command raced another and\n"
    "changed nothing (run it again), 130 train cancelled (Ctrl-C). Retry on 3 and 6 only.\n"
    "'distdl COMMAND --help' describes a command.\n";

static void print_usage(FILE *f, const command *cmd)
{
    if (cmd) {
        fprintf(f, "usage: distdl [global options] %s\n\n%s", cmd->usage, cmd->help);
        fprintf(f, "\nGlobal options: --address, --address-file, --json, --timeout, --tls-*,\n"
                   "--token-file ('distdl --help').\n");
        return;
    }
    fputs(global_usage, f);
    fputs("\nCommands:\n", f);
    for (size_t i = 0; i < n_commands; i++)
        fprintf(f, "  %s\n", commands[i].usage);
    fputs(global_help, f);
}

#define COMMAND_LIST                                                                               \
    "status, health, wait, create, train, eval, step, predict, pull, push, checkpoint, "          \
    "restore, shutdown"

// ---- parsing the command line ---------------------------------------------------------

// Parses argv into *a. Returns -1 to go on, else the exit code (0 after --help).
static int parse(int argc, char **argv, cli *a)
{
    // --json anywhere turns errors into JSON too, also those found before it is parsed.
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
        if (strcmp(argv[i], "--json") == 0)
            g_json = 1;

    // The global options, up to the command word.
    struct option all[N_GLOBAL + sizeof command_options / sizeof command_options[0] + 1];
    memcpy(all, global_options, sizeof global_options);
    memset(&all[N_GLOBAL], 0, sizeof all[0]);
    int help           = 0, ch;
    opterr             = 0;
    optind             = 1;
    const command *cmd = NULL;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            // The command's own options join the global ones.
            size_t n = N_GLOBAL;
            for (int k = 0; cmd->options[k]; k++)
                for (size_t j = 0; j < sizeof command_options / sizeof command_options[0]; j++)
                    if (command_options[j].val == cmd->options[k])
                        all[n++] = command_options[j];
            memset(&all[n], 0, sizeof all[0]);
        }
        // Pass 0 stops at the command word ('+'); pass 1 permutes, so positional arguments
        // and options mix freely after it. ':' reports a missing argument as ':'.
        while ((ch = getopt_long(argc, argv, pass == 0 ? "+:" : ":", all, NULL)) != -1) {
            // The offending option: a short one by its letter, a long one as written.
            char        letter[3] = {'-', (char)optopt, '\0'};
            int         is_short  = optopt > 0 && optopt < 128 && argv[optind - 1][1] != '-';
            const char *bad       = is_short ? letter : argv[optind - 1];
            switch (ch) {
            case O_ADDRESS:
                a->address = optarg;
                break;
            case O_ADDRESS_FILE:
                a->address_file = optarg;
                break;
            case O_JSON:
                a->json = 1;
                break;
            case O_TIMEOUT:
                if (parse_seconds("--timeout", optarg, &a->timeout_s) != 0)
                    return EXIT_USAGE;
                break;
            case O_TLS_CA:
                a->tls_ca = optarg;
                break;
            case O_TLS_CERT:
                a->tls_cert = optarg;
                break;
            case O_TLS_KEY:
                a->tls_key = optarg;
                break;
            case O_TLS_NAME:
                a->tls_name = optarg;
                break;
            case O_TOKEN_FILE:
                a->token_file = optarg;
                break;
            case O_HELP:
                help = 1;
                break;
            case O_NAME:
                a->name = optarg;
                break;
            case O_REPLACE:
                a->replace = 1;
                break;
            case O_EPOCHS:
                if (parse_count("--epochs", optarg, 1, &a->epochs) != 0)
                    return EXIT_USAGE;
                break;
            case O_STEPS:
                if (parse_count("--steps", optarg, 1, &a->steps) != 0)
                    return EXIT_USAGE;
                break;
            case O_TO_STEP:
                if (parse_count("--to-step", optarg, 0, &a->to_step) != 0)
                    return EXIT_USAGE;
                break;
            case O_EVERY:
                if (parse_count("--progress-every", optarg, 1, &a->every) != 0)
                    return EXIT_USAGE;
                break;
            case O_DATASET:
                a->dataset = optarg;
                break;
            case O_SPLIT:
                a->split = optarg;
                break;
            case O_INPUT:
                a->input = optarg;
                break;
            case O_OUTPUT:
                a->output = optarg;
                break;
            case O_DIR:
                a->dir = optarg;
                break;
            case O_NO_CHECKPOINT:
                a->no_checkpoint = 1;
                break;
            case O_TARGETS:
                a->targets = optarg;
                break;
            case O_READY:
                a->ready = 1;
                break;
            case ':':
                return fail(EXIT_USAGE, "USAGE", "option %s needs an argument", bad);
            default:
                if (help)
                    break; // "distdl train --help --bogus" still shows the help
                if (pass == 1)
                    return fail(EXIT_USAGE, "USAGE", "unknown option %s for '%s'", bad, cmd->name);
                return fail(EXIT_USAGE, "USAGE", "unknown option %s", bad);
            }
        }
        if (pass == 0) {
            if (optind >= argc) {
                if (help) {
                    print_usage(stdout, NULL);
                    return 0;
                }
                if (!g_json)
                    fputs(global_usage, stderr);
                return fail(EXIT_USAGE, "USAGE", "no command given (%s)", COMMAND_LIST);
            }
            a->command = argv[optind];
            // "distdl help [COMMAND]" is "distdl [COMMAND] --help".
            if (strcmp(a->command, "help") == 0) {
                const command *h = optind + 1 < argc ? find_command(argv[optind + 1]) : NULL;
                if (optind + 1 < argc && !h)
                    return fail(EXIT_USAGE, "USAGE", "unknown command '%s'", argv[optind + 1]);
                print_usage(stdout, h);
                return 0;
            }
            cmd = find_command(a->command);
            if (!cmd) {
                if (help) {
                    print_usage(stdout, NULL);
                    return 0;
                }
                return fail(EXIT_USAGE, "USAGE", "unknown command '%s' (%s)", a->command,
                            COMMAND_LIST);
            }
            g_command = cmd->name;
            optind++;
            // Parse what follows the command word as a command line of its own.
            argc -= optind - 1;
            argv += optind - 1;
            optind = 0; // glibc: 0 reinitialises getopt's scanning state for the new argv
        }
    }
    if (help) {
        print_usage(stdout, cmd);
        return 0;
    }
    for (int i = optind; i < argc; i++) {
        if (a->npositional == cmd->max_pos)
            return fail(EXIT_USAGE, "USAGE", "unexpected argument '%s' (usage: distdl %s)", argv[i],
                        cmd->usage);
        a->positional[a->npositional++] = argv[i];
    }
    if (a->npositional < cmd->min_pos)
        return fail(EXIT_USAGE, "USAGE", "missing argument (usage: distdl %s)", cmd->usage);
    if (a->address && a->address_file)
        return fail(EXIT_USAGE, "USAGE", "give --address or --address-file, not both");
    if (!a->tls_cert != !a->tls_key)
        return fail(EXIT_USAGE, "USAGE", "mutual TLS needs both --tls-cert and --tls-key");
    if ((a->tls_cert || a->tls_name) && !a->tls_ca)
        return fail(EXIT_USAGE, "USAGE",
                    "--tls-cert, --tls-key and --tls-server-name need --tls-ca");
    a->command = cmd->name;
    return -1;
}

// --input: samples [n, sample...], n >= 1, of an input dtype. Returns -1 or the exit code.
static int read_samples(cli *a)
{
    if (ddl_client_npy_read(a->input, &a->x) != DDL_OK)
        return fail(EXIT_FILE, "FILE", "%s", ddl_last_error());
    if (a->x.dtype == DDL_WIRE_INT64)
        return fail(EXIT_FILE, "FILE", "%s holds int64; %s takes float32, float64 or uint8 samples",
                    a->input, a->command);
    if (a->x.ndim < 2 || a->x.shape[0] < 1)
        return fail(EXIT_FILE, "FILE", "%s: %s needs [n, sample...] with n >= 1", a->input,
                    a->command);
    return -1;
}

// --input and --targets of an inline step or evaluation: the samples, and as many targets
// (int64 class indices, or float32/float64 values; the daemon checks their shape).
static int read_batch(cli *a)
{
    if (!a->input || !a->targets)
        return fail(EXIT_USAGE, "USAGE", "%s needs --input X.npy and --targets Y.npy", a->command);
    int rc = read_samples(a);
    if (rc >= 0)
        return rc;
    if (ddl_client_npy_read(a->targets, &a->y) != DDL_OK)
        return fail(EXIT_FILE, "FILE", "%s", ddl_last_error());
    if (a->y.dtype == DDL_WIRE_UINT8)
        return fail(EXIT_FILE, "FILE",
                    "%s holds uint8; targets are int64 class indices or float32/float64 values",
                    a->targets);
    if (a->y.ndim < 1 || a->y.shape[0] != a->x.shape[0])
        return fail(EXIT_FILE, "FILE",
                    "%s: expected %lld targets (one row per sample of %s), got %lld", a->targets,
                    (long long)a->x.shape[0], a->input,
                    a->y.ndim < 1 ? 0LL : (long long)a->y.shape[0]);
    return -1;
}

// Checks what the command needs and reads the local files it sends, before any RPC: a bad
// invocation changes nothing on the daemon and needs no daemon to be reported. Returns -1
// to go on, else the exit code.
static int prepare(cli *a)
{
    const char *cmd = a->command;
    if (strcmp(cmd, "train") == 0) {
        int given = (a->epochs > 0) + (a->steps > 0) + (a->to_step >= 0);
        if (given > 1)
            return fail(EXIT_USAGE, "USAGE",
                        "give one of --epochs N, --steps N and --to-step S, not several");
        if (given == 0)
            return fail(EXIT_USAGE, "USAGE", "train needs --epochs N, --steps N or --to-step S");
    } else if (strcmp(cmd, "eval") == 0 && (a->input || a->targets)) {
        if (a->split || a->dataset)
            return fail(EXIT_USAGE, "USAGE",
                        "eval takes a split (--split, --dataset) or inline samples (--input, "
                        "--targets), not both");
        return read_batch(a);
    } else if (strcmp(cmd, "eval") == 0) {
        if (a->split && strcmp(a->split, "test") != 0 && strcmp(a->split, "train") != 0)
            return fail(EXIT_USAGE, "USAGE", "--split is 'test' or 'train', got '%s'", a->split);
    } else if (strcmp(cmd, "step") == 0) {
        return read_batch(a);
    } else if (strcmp(cmd, "restore") == 0) {
        a->restore_step = -1;
        if (strcmp(a->positional[0], "latest") != 0 &&
            parse_count("restore STEP", a->positional[0], 0, &a->restore_step) != 0)
            return EXIT_USAGE;
    } else if (strcmp(cmd, "create") == 0) {
        int rc  = 0;
        a->spec = read_text_file(a->positional[0], &rc);
        if (!a->spec)
            return rc;
        // A file that is not JSON at all is a local file error; whether the JSON is a
        // valid spec for this daemon's world size is the daemon's call.
        json_error_t jerr;
        json_t      *parsed = json_loads(a->spec, 0, &jerr);
        if (!parsed)
            return fail(EXIT_FILE, "FILE", "%s is not JSON (line %d: %s)", a->positional[0],
                        jerr.line, jerr.text);
        // The model is named after the spec unless --name says otherwise (the daemon does
        // the same when no name is sent).
        json_t *name = json_object_get(parsed, "name");
        if (!a->name && json_is_string(name) && json_string_length(name) > 0) {
            a->spec_name = strdup(json_string_value(name));
            a->name      = a->spec_name;
        }
        json_decref(parsed);
    } else if (strcmp(cmd, "predict") == 0) {
        if (!a->input || !a->output)
            return fail(EXIT_USAGE, "USAGE", "predict needs --input X.npy and --output LOGITS.npy");
        return read_samples(a);
    } else if (strcmp(cmd, "pull") == 0) {
        if (!a->output)
            return fail(EXIT_USAGE, "USAGE", "pull needs --output W.safetensors");
    } else if (strcmp(cmd, "push") == 0) {
        if (!a->input)
            return fail(EXIT_USAGE, "USAGE", "push needs --input W.safetensors");
        if (ddl_safetensors_read(a->input, &a->weights) != DDL_OK)
            return fail(EXIT_FILE, "FILE", "%s", ddl_last_error());
    }
    return -1;
}

int main(int argc, char **argv)
{
    g_t0   = ddl_cli_now();
    cli a  = {.to_step = -1};
    int rc = parse(argc, argv, &a);
    if (rc >= 0)
        return rc; // --help, or a usage error
    ddl_client_t *c = NULL;
    rc              = prepare(&a);
    if (rc < 0) {
        rc = connect_daemon(&a, &c);
        if (rc == 0)
            rc = find_command(a.command)->run(&a, c);
    }
    ddl_client_destroy(&c);
    free(a.spec);
    free(a.spec_name);
    ddl_client_tensor_release(&a.x);
    ddl_client_tensor_release(&a.y);
    ddl_client_weights_destroy(&a.weights);
    // gRPC keeps threads of its own that grpc_shutdown does not join (a subchannel may still
    // be retrying a failed TLS handshake), and exit() would tear OpenSSL down under them (a
    // crash seen after connecting with TLS to a plaintext daemon). Everything is written and
    // flushed by now: leave without the atexit handlers. (grpc_shutdown_blocking in the
    // client library does not help: gRPC 1.51's event-engine threads outlive it, and a
    // subchannel watcher still started a new handshake during exit in 1 of 360 runs.)
    fflush(NULL);
    _exit(rc);
}
