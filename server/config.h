// server/config.h: the daemon's configuration, parsed from the command line by main.c
// (every rank parses the same argv) and borrowed by the modules for the daemon's lifetime.
#ifndef DDLD_CONFIG_H
#define DDLD_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

// ---- configuration (command line) -----------------------------------------------------

typedef struct ddld_config {
    const char *model_path;     // --model: create this model at start
    const char *listen;         // --listen (default 127.0.0.1:50051)
    const char *address_file;   // --address-file: host:port written once serving
    const char *data_root;      // --data-root
    const char *checkpoint_dir; // --checkpoint-dir
    int64_t     checkpoint_every;
    int64_t     checkpoint_interval; // seconds between timed checkpoints (0: none)
    bool        resume;
    int64_t     max_message_bytes;
    int         queue;   // --queue: pending requests and submitted batches
    double      grace_s; // shutdown grace for in-flight calls
    double      watchdog_s; // --watchdog: a rank silent this long ends the job (0: off)
    const char *metrics_listen;       // --metrics-listen: Prometheus endpoint (NULL: off)
    const char *tensorboard_dir;      // --tensorboard-dir: TensorBoard event files (NULL: off)
    const char *metrics_address_file; // --metrics-address-file: its host:port once serving
    const char *http_listen;          // --http-listen: KServe v2 over HTTP/REST (http.c; NULL: off)
    const char *http_address_file;    // --http-address-file: its host:port once serving
    // Authentication and TLS (auth.c): files read on rank 0 before serving.
    const char *token_file;    // --token-file: "ROLE TOKEN" lines
    const char *tls_cert;      // --tls-cert: server certificate chain (PEM)
    const char *tls_key;       // --tls-key: its private key (PEM)
    const char *tls_client_ca; // --tls-client-ca: require client certificates from this CA
    bool        insecure;      // --insecure: plaintext, tokenless listen beyond loopback
    // Dynamic batching (dispatch.c, docs/SERVER.md "Dynamic batching").
    bool    batching;           // --dynamic-batching on|off (default on)
    int64_t max_queue_delay_us; // --max-queue-delay-us: longest a request waits for batch-mates
    int64_t max_batch;          // --max-batch: rows per engine command (0: the spec's batch)
    int64_t preferred[8];       // --preferred-batch-sizes: run at once on reaching one
    int     npreferred;
    bool    serve_during_train; // --serve-during-train on|off (default on)
    int     serve_share_pct;    // --serve-during-train-share: most of a Train's time spent
                                // answering (percent; 100: at every step boundary)
} ddld_config;

#endif // DDLD_CONFIG_H
