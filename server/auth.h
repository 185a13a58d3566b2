// server/auth.h: who may call the daemon. Bearer tokens with a role (admin, train, infer)
// read from --token-file, TLS (--tls-cert/--tls-key) and mutual TLS (--tls-client-ca),
// and the rule that a daemon without either listens only on loopback unless --insecure.
//
// The token file (docs/SERVER.md): one `ROLE TOKEN` per line; a field starting with `#`
// starts a comment and blank lines are ignored. ROLE is admin, train or infer; TOKEN is 16
// to 4096 visible ASCII characters. The file must not be accessible to "others" (chmod 600 or 640).
//
// Only SHA-256 digests of the tokens are kept in memory. A presented token is hashed and
// its digest compared with every configured digest in constant time, without stopping at
// a match, so the time taken says nothing about which token (if any) matched. Tokens are
// never logged, not even with DDLD_VERBOSE=1.
//
// Threads: ddld_auth_startup runs once on rank 0's main thread before serving. The token
// table is then read under a read lock by ddld_auth_check (any thread) and replaced under
// the write lock by a reload (SIGHUP); everything else is fixed.
#ifndef DDLD_AUTH_H
#define DDLD_AUTH_H

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/status.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

typedef enum {
    DDLD_ROLE_NONE  = 0, // no (valid) token
    DDLD_ROLE_INFER = 1, // inference and read-only status
    DDLD_ROLE_TRAIN = 2, // infer + training, evaluation, pulling weights, checkpoints
    DDLD_ROLE_ADMIN = 3, // everything: models, pushed weights, restore, shutdown
} ddld_role;

#define DDLD_TOKEN_MIN 16
#define DDLD_TOKEN_MAX 4096
#define DDLD_DIGEST_BYTES 32

typedef struct ddld_auth ddld_auth;

// What the command line asked for (every field may be NULL).
typedef struct ddld_auth_options {
    const char *token_file;    // --token-file
    const char *tls_cert;      // --tls-cert: server certificate chain (PEM)
    const char *tls_key;       // --tls-key: its private key (PEM)
    const char *tls_client_ca; // --tls-client-ca: CA that client certificates must chain to
} ddld_auth_options;

// ---- configuration checks (every rank, before MPI_Init: argv only, no files) ---------------

// True when `listen` ("127.0.0.1:PORT", "[::1]:PORT", "localhost:PORT", "unix:PATH")
// can only be reached from this machine.
bool ddld_listen_is_loopback(const char *listen);

// The problem with this combination of options, or NULL: --tls-cert without --tls-key (or
// the reverse), --tls-client-ca without TLS, and a non-loopback address with neither TLS
// nor tokens unless insecure. Writes into buf.
const char *ddld_auth_config_problem(const ddld_auth_options *o, const char *listen, bool insecure,
                                     char *buf, size_t len);

// ---- loading (rank 0) ------------------------------------------------------------------

// Reads and checks every file of o: readable, permissions, well-formed, key matching the
// certificate. On failure returns -1 with a message naming the file and the problem in err
// and *out NULL. An empty options struct gives an auth that admits everyone (plaintext).
int  ddld_auth_create(const ddld_auth_options *o, ddld_auth **out, char *err, size_t errlen);
void ddld_auth_destroy(ddld_auth **a);

// Parses token-file text (path is for messages). Exposed for the unit test.
int ddld_auth_parse_tokens(ddld_auth *a, const char *text, const char *path, char *err,
                           size_t errlen);

// Reads --token-file again and replaces the table atomically (calls in flight finish with
// the old one). On any problem the table loaded before stays and -1 comes back with the
// reason in err. Any thread.
int ddld_auth_reload_tokens(ddld_auth *a, char *err, size_t errlen);

int  ddld_auth_token_count(const ddld_auth *a);
bool ddld_auth_uses_tls(const ddld_auth *a);

// The PEM texts of --tls-cert, --tls-key and --tls-client-ca (NULL: not given), for the
// HTTP side's TLS (http.c). The key is NULL once ddld_auth_server_credentials ran.
void ddld_auth_tls_pem(const ddld_auth *a, const char **cert, const char **key, const char **ca);

// The server credentials for grpc_server_add_http2_port: TLS (requiring and verifying a
// client certificate when a client CA was given) or insecure. The caller releases them.
// The private key is wiped from our memory afterwards (gRPC keeps its own copy).
grpc_server_credentials *ddld_auth_server_credentials(ddld_auth *a);

// ---- per call (any thread) -------------------------------------------------------------

// The role the presented token carries (DDLD_ROLE_NONE when it matches none). Hashes it and
// compares with every configured digest in constant time.
ddld_role ddld_auth_lookup(const ddld_auth *a, const char *token, size_t len);

// The least role a method (ddld_method; DDLD_M_COUNT for unknown methods) needs.
// DDLD_ROLE_NONE: callable without a token (health).
ddld_role   ddld_auth_required_role(int method);
const char *ddld_role_name(ddld_role r);

// Admits or refuses one call from its request metadata: GRPC_STATUS_OK, UNAUTHENTICATED
// (no token, a malformed header, an unknown token) or PERMISSION_DENIED (a valid token whose
// role is below what the method needs), with a message for the client in msg. A NULL or
// tokenless auth admits every call. `path` names the method in messages.
grpc_status_code ddld_auth_check(const ddld_auth *a, int method, const char *path,
                                 const grpc_metadata_array *md, char *msg, size_t len);

// The same decision from the authorization value itself (v, vl bytes; count: how many
// authorization headers came, 0 or more than 1 refusing the call): the HTTP side's check.
grpc_status_code ddld_auth_check_value(const ddld_auth *a, int method, const char *path,
                                       const char *v, size_t vl, int count, char *msg, size_t len);

// Constant-time equality of two n-byte buffers: the time depends on n only.
bool ddld_ct_equal(const void *a, const void *b, size_t n);

// ---- the daemon's instance (rank 0) -----------------------------------------------------

// Loads the daemon's auth from the command line; logs the problem and returns 2 on failure
// (the caller then releases the workers with that code), 0 otherwise.
int ddld_auth_startup(const ddld_config *cfg);
// SIGHUP: reloads the daemon's --token-file and logs the outcome (main thread).
void ddld_auth_reload(void);
// The loaded auth (NULL before ddld_auth_startup).
ddld_auth *ddld_auth_daemon(void);
void       ddld_auth_shutdown(void);

#endif // DDLD_AUTH_H
