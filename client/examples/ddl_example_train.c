// ddl_example_train: a new user's first session with a running distdld.
//
//   mpirun -np 2 build/bin/distdld --model deploy/specs/lenet5-2.json --address-file /tmp/addr
//   build/bin/ddl_example_train --address-file /tmp/addr [--epochs 1 | --steps N]
//        [--data /usr/share/datasets/fashion-mnist] [--predict 8] [--pull weights.safetensors]
//        [--shutdown]
//
// It trains over the daemon's dataset with a progress line per record, reports the test
// accuracy, predicts the first few test images (read here from the IDX files, sent as UINT8
// pixels), pulls the global weights into a safetensors file and, with --shutdown, stops
// the daemon (a final checkpoint first when it has a checkpoint directory).
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zlib.h>

#include "cli_support.h"
#include "ddl_client.h"

static const char *const class_names[10] = {"T-shirt", "Trouser", "Pullover", "Dress", "Coat",
                                            "Sandal",  "Shirt",   "Sneaker",  "Bag",   "Boot"};

static int die(const char *what)
{
    fprintf(stderr, "ddl_example_train: %s failed: %s (gRPC %s)\n", what, ddl_last_error(),
            ddl_client_code_name(ddl_client_last_code()));
    return 1;
}

// Reads `count` items of an IDX .gz file after its header; returns the malloc'd bytes.
static uint8_t *read_idx(const char *path, size_t header, size_t count)
{
    gzFile g = gzopen(path, "rb");
    if (!g)
        return NULL;
    uint8_t  hdr[16];
    uint8_t *buf = malloc(count);
    int      ok  = buf && gzread(g, hdr, (unsigned)header) == (int)header &&
             gzread(g, buf, (unsigned)count) == (int)count;
    gzclose(g);
    if (!ok) {
        free(buf);
        return NULL;
    }
    return buf;
}

// On a terminal one progress bar redrawn in place, otherwise a line per record: the display
// the distdl tool uses (client/cli/cli_support.c).
static int on_progress(const ddl_client_progress *p, void *ud)
{
    ddl_cli_progress_update(ud, p);
    return 0;
}

// A whole number >= min for a flag, or a message and -1.
static int parse_count(const char *flag, const char *text, long long min, long long *out)
{
    char *end = NULL;
    errno     = 0;
    long long v = strtoll(text, &end, 10);
    if (end == text || *end != '\0' || errno == ERANGE || v < min) {
        fprintf(stderr, "ddl_example_train: %s needs a whole number >= %lld, got \"%s\"\n", flag,
                min, text);
        return -1;
    }
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    const char                *address = NULL, *address_file = NULL, *pull = "weights.safetensors";
    const char                *data = "/usr/share/datasets/fashion-mnist", *dataset = "";
    long long                  epochs = 1, steps = 0, npredict = 8, every = 100;
    static const struct option longs[] = {
        {"address", required_argument, 0, 'a'},        {"address-file", required_argument, 0, 'f'},
        {"epochs", required_argument, 0, 'e'},         {"steps", required_argument, 0, 's'},
        {"data", required_argument, 0, 'd'},           {"dataset", required_argument, 0, 'D'},
        {"predict", required_argument, 0, 'p'},        {"pull", required_argument, 0, 'w'},
        {"progress-every", required_argument, 0, 'k'}, {"shutdown", no_argument, 0, 'q'},
        {0, 0, 0, 0}};
    int ch, shutdown = 0;
    while ((ch = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        switch (ch) {
        case 'a':
            address = optarg;
            break;
        case 'f':
            address_file = optarg;
            break;
        case 'e':
            if (parse_count("--epochs", optarg, 1, &epochs) != 0)
                return 2;
            break;
        case 's':
            if (parse_count("--steps", optarg, 1, &steps) != 0)
                return 2;
            epochs = 0;
            break;
        case 'd':
            data = optarg;
            break;
        case 'D':
            dataset = optarg;
            break;
        case 'p':
            if (parse_count("--predict", optarg, 0, &npredict) != 0)
                return 2;
            break;
        case 'w':
            pull = optarg;
            break;
        case 'k':
            if (parse_count("--progress-every", optarg, 1, &every) != 0)
                return 2;
            break;
        case 'q':
            shutdown = 1;
            break;
        default:
            fprintf(stderr,
                    "usage: ddl_example_train --address HOST:PORT | --address-file F\n"
                    "         [--epochs N | --steps N] [--dataset REL] [--data IDXDIR]\n"
                    "         [--predict N] [--pull FILE.safetensors] [--progress-every K]\n"
                    "         [--shutdown (stop the daemon at the end, with a final checkpoint)]\n");
            return 2;
        }
    }
    char buf[512];
    if (!address && address_file) {
        // The daemon writes the file once it listens; give a fresh one a minute to start.
        if (ddl_cli_read_address(address_file, 60.0, buf, sizeof buf) != 0) {
            fprintf(stderr, "ddl_example_train: cannot read an address from %s\n", address_file);
            return 1;
        }
        address = buf;
    }
    if (!address)
        address = "127.0.0.1:50051";

    ddl_client_options o = ddl_client_options_default();
    o.tune_malloc        = 1;
    ddl_client_t *c;
    if (ddl_client_connect(address, &o, &c) != DDL_OK)
        return die("connect");

    ddl_client_status_info s;
    if (ddl_client_get_status(c, &s) != DDL_OK)
        return die("GetStatus");
    if (!s.has_model) {
        fprintf(stderr, "ddl_example_train: the daemon has no model; start it with --model "
                        "deploy/specs/lenet5-<np>.json\n");
        return 1;
    }
    printf("daemon at %s: model '%s' on %d ranks, step %lld, batch %lld, %s\n", address,
           s.model_name, s.world_size, (long long)s.step, (long long)s.batch_size, s.datatype);

    ddl_client_train_request tr = {
        .epochs = epochs, .steps = steps, .dataset = dataset, .progress_every = (int32_t)every};
    ddl_client_progress last;
    printf("training %lld %s ...\n", epochs ? epochs : steps, epochs ? "epoch(s)" : "step(s)");
    ddl_cli_progress bar;
    ddl_cli_progress_init(&bar, stdout, isatty(STDOUT_FILENO));
    if (bar.tty && every > 10)
        tr.progress_every = 10; // the bar moves smoothly; lines stay sparse otherwise
    if (ddl_client_train(c, &tr, on_progress, &bar, &last) != DDL_OK)
        return die("Train");
    printf("  finished at step %lld: loss %.4f, %.0f images/s\n", (long long)last.step, last.loss,
           last.images_per_second);

    ddl_client_eval_result ev;
    if (ddl_client_evaluate(c, dataset, "test", NULL, &ev) != DDL_OK)
        return die("Evaluate");
    printf("test: %lld images, loss %.4f, accuracy %.2f%%\n", (long long)ev.count, ev.loss,
           100.0 * ev.accuracy);

    if (npredict > 0) {
        char path[1024];
        snprintf(path, sizeof path, "%s/t10k-images-idx3-ubyte.gz", data);
        uint8_t *px = read_idx(path, 16, (size_t)npredict * 784);
        snprintf(path, sizeof path, "%s/t10k-labels-idx1-ubyte.gz", data);
        uint8_t *lb = read_idx(path, 8, (size_t)npredict);
        if (!px || !lb) {
            fprintf(stderr, "ddl_example_train: cannot read %lld test images from %s\n", npredict,
                    data);
            return 1;
        }
        ddl_client_tensor x = {.name  = "x",
                               .dtype = DDL_WIRE_UINT8,
                               .ndim  = 4,
                               .shape = {npredict, 1, 28, 28},
                               .data  = px,
                               .bytes = (size_t)npredict * 784};
        ddl_client_tensor logits;
        if (ddl_client_predict(c, &x, &logits) != DDL_OK)
            return die("Predict");
        const float *z     = logits.data;
        int64_t      k     = logits.ndim == 2 ? logits.shape[1] : 0;
        int          right = 0;
        for (int64_t i = 0; i < npredict && k > 0; i++) {
            int64_t best = 0;
            for (int64_t j = 1; j < k; j++)
                if (z[i * k + j] > z[i * k + best])
                    best = j;
            right += best == lb[i];
            printf("  image %lld: predicted %-8s actual %s\n", (long long)i,
                   best < 10 ? class_names[best] : "?", class_names[lb[i] % 10]);
        }
        printf("predicted %d of %lld right\n", right, npredict);
        ddl_client_tensor_release(&logits);
        free(px);
        free(lb);
    }

    if (pull && *pull) {
        ddl_client_weights *w;
        if (ddl_client_pull_weights(c, &w) != DDL_OK)
            return die("PullWeights");
        size_t bytes = 0;
        for (int64_t i = 0; i < w->count; i++)
            bytes += w->tensors[i].bytes;
        if (ddl_safetensors_write(pull, w) != DDL_OK)
            return die("write safetensors");
        printf("pulled %lld tensors (%zu bytes) into %s\n", (long long)w->count, bytes, pull);
        ddl_client_weights_destroy(&w);
    }
    if (shutdown) {
        int64_t durable = -1;
        if (ddl_client_shutdown(c, 1, &durable) != DDL_OK)
            return die("Shutdown");
        printf("daemon shut down (durable checkpoint: step %lld)\n", (long long)durable);
    }
    ddl_client_destroy(&c);
    return 0;
}
