// server/http.h: the KServe v2 / Open Inference Protocol over HTTP/REST (--http-listen), on
// rank 0, in libmicrohttpd's own threads (docs/SERVER.md, "KServe over HTTP").
//
// A transport only: each request is translated into the gRPC method's protobuf request
// (ServerLive, ServerReady, ServerMetadata, ModelReady, ModelMetadata, ModelInfer) and run
// through ddld_service_submit exactly as that gRPC call runs: the same validation, the
// same dynamic batching, the same answers. The outcome is translated back into JSON (and,
// with the binary_tensor_data extension, raw tensor bytes after it). The statistics
// extension renders ddld_metrics_infer_stats. The same token rules as gRPC
// (authorization: Bearer, the role of the method's row) and the same TLS, with client
// certificates verified against --tls-client-ca when it is given.
#ifndef DDLD_HTTP_H
#define DDLD_HTTP_H

#include <stddef.h>

#include "config.h"

typedef struct ddld_service ddld_service; // service.h

// Checks --http-listen (HOST:PORT, numeric, as --metrics-listen) and that
// --http-address-file comes with it. Pure: every rank reaches the same verdict.
// Returns 0, or -1 with a message in err.
int ddld_http_check_config(const ddld_config *cfg, char *err, size_t errlen);
// Rank 0, after ddld_auth_startup and before ddld_service_start (TLS takes its copy of the
// key first): binds, starts the HTTP threads and writes --http-address-file. Requests are
// answered 503 until ddld_http_attach. Returns 0, or -1 after logging why.
int ddld_http_start(const ddld_config *cfg);
// The service that runs the requests (it must outlive the HTTP threads).
void ddld_http_attach(ddld_service *svc);
// Stops the HTTP threads, after waiting (at most 10 s) for the calls still being answered.
// Idempotent; a no-op without --http-listen.
void ddld_http_stop(void);

#endif // DDLD_HTTP_H
