// server/auth.c: bearer tokens with roles, TLS and mutual TLS, and the loopback rule
// (auth.h says what; docs/SERVER.md is the user's side: flags, file format, role table).
//
// Files are read once on rank 0 before the daemon serves. Certificates and keys are parsed
// with OpenSSL here, although gRPC parses them again, so that a bad file is reported by
// name and reason ("does not match the certificate in --tls-cert F") instead of gRPC's
// generic failure to add the port.
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "auth.h"
#include "config.h"
#include "ddl/base.h"
#include "log.h"
#include "methods.h"
#include "status_map.h"

#define FILE_MAX ((size_t)1 << 20) // token, certificate and key files are small

struct token_entry {
    uint8_t   digest[DDLD_DIGEST_BYTES];
    ddld_role role;
};

struct ddld_auth {
    pthread_rwlock_t    lock; // the token table: read per call, replaced by a reload
    struct token_entry *tokens;
    int                 ntokens;
    bool                use_tokens;                         // tokens are required (fixed at create)
    char               *token_path;                         // --token-file, for reloads
    char               *cert_pem, *key_pem, *client_ca_pem; // NULL without TLS
    bool                verbose;                            // DDLD_VERBOSE=1: log decisions
};

// ---- constant-time helpers ----------------------------------------------------------------

bool ddld_ct_equal(const void *a, const void *b, size_t n)
{
    // volatile keeps the compiler from turning the loop into an early-exit memcmp.
    const volatile uint8_t *x = a, *y = b;
    uint8_t                 d = 0;
    for (size_t i = 0; i < n; i++) {
        d |= (uint8_t)(x[i] ^ y[i]);
    }
    return d == 0;
}

static void digest(const char *token, size_t len, uint8_t out[DDLD_DIGEST_BYTES])
{
    unsigned int n = 0;
    EVP_Digest(token, len, out, &n, EVP_sha256(), NULL);
}

ddld_role ddld_auth_lookup(const ddld_auth *a, const char *token, size_t len)
{
    if (a == NULL) {
        return DDLD_ROLE_NONE;
    }
    uint8_t h[DDLD_DIGEST_BYTES];
    digest(token, len, h);
    pthread_rwlock_rdlock(&((ddld_auth *)a)->lock);
    // Every entry is compared and the role is selected with a mask, never a branch on the
    // comparison, so no entry is skipped or taken early. Tokens are unique (the loader
    // refuses duplicates), so at most one mask is set.
    unsigned role = 0;
    for (int i = 0; i < a->ntokens; i++) {
        unsigned eq = (unsigned)ddld_ct_equal(h, a->tokens[i].digest, sizeof h);
        role |= (0u - eq) & (unsigned)a->tokens[i].role;
    }
    pthread_rwlock_unlock(&((ddld_auth *)a)->lock);
    memset(h, 0, sizeof h);
    return (ddld_role)role;
}

// ---- the role table ---------------------------------------------------------------------------

ddld_role ddld_auth_required_role(int method)
{
    static const ddld_role roles[] = {
#define X(name, path, kind, role, where, request, handler) [DDLD_M_##name] = DDLD_ROLE_##role,
        DDL_RPC_METHODS(X)
#undef X
    };
    _Static_assert(sizeof roles / sizeof roles[0] == DDLD_M_COUNT, "a role per method");
    if (method < 0 || method >= DDLD_M_COUNT) {
        return DDLD_ROLE_INFER; // unknown methods: any valid token, then UNIMPLEMENTED
    }
    return roles[method];
}

const char *ddld_role_name(ddld_role r)
{
    switch (r) {
    case DDLD_ROLE_INFER:
        return "infer";
    case DDLD_ROLE_TRAIN:
        return "train";
    case DDLD_ROLE_ADMIN:
        return "admin";
    default:
        return "none";
    }
}

static const char *short_name(const char *path)
{
    const char *s = path != NULL ? strrchr(path, '/') : NULL;
    return s != NULL ? s + 1 : (path != NULL ? path : "?");
}

grpc_status_code ddld_auth_check_value(const ddld_auth *a, int method, const char *path,
                                       const char *v, size_t vl, int count, char *msg, size_t len)
{
    msg[0]         = '\0';
    ddld_role need = ddld_auth_required_role(method);
    if (a == NULL || !a->use_tokens || need == DDLD_ROLE_NONE) {
        return GRPC_STATUS_OK;
    }
    grpc_status_code code = GRPC_STATUS_UNAUTHENTICATED;
    ddld_role        got  = DDLD_ROLE_NONE;
    if (count == 0) {
        snprintf(msg, len, "%s needs a bearer token (authorization: Bearer <token>)",
                 short_name(path));
    } else if (count > 1) {
        snprintf(msg, len, "more than one authorization header");
    } else if (vl < 7 || strncasecmp(v, "Bearer ", 7) != 0) {
        snprintf(msg, len, "the authorization header is not \"Bearer <token>\"");
    } else {
        got = ddld_auth_lookup(a, v + 7, vl - 7);
        if (got == DDLD_ROLE_NONE) {
            snprintf(msg, len, "invalid token");
        } else if (got < need) {
            code = GRPC_STATUS_PERMISSION_DENIED;
            snprintf(msg, len, "a token of role %s may not call %s (needs role %s)",
                     ddld_role_name(got), short_name(path), ddld_role_name(need));
        } else {
            code = GRPC_STATUS_OK;
        }
    }
    if (a->verbose) {
        // The decision and the role only: never the token or the header value.
        ddld_log("auth: %s: %s (role %s)", short_name(path),
                 code == GRPC_STATUS_OK ? "admitted" : ddld_grpc_code_name(code),
                 ddld_role_name(got));
    }
    return code;
}

grpc_status_code ddld_auth_check(const ddld_auth *a, int method, const char *path,
                                 const grpc_metadata_array *md, char *msg, size_t len)
{
    const grpc_slice *value = NULL;
    int               n     = 0;
    for (size_t i = 0; i < md->count; i++) {
        if (grpc_slice_str_cmp(md->metadata[i].key, "authorization") == 0) {
            value = &md->metadata[i].value;
            n++;
        }
    }
    return ddld_auth_check_value(a, method, path,
                                 value != NULL ? (const char *)GRPC_SLICE_START_PTR(*value) : NULL,
                                 value != NULL ? GRPC_SLICE_LENGTH(*value) : 0, n, msg, len);
}

// ---- files ----------------------------------------------------------------------------------

// Reads a small regular file. secret: refuse it when "others" have any access to it.
static char *read_file(const char *path, const char *flag, bool secret, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, errlen, "%s %s: cannot open: %s", flag, path, strerror(errno));
        return NULL;
    }
    struct stat st;
    char       *buf = NULL;
    if (fstat(fd, &st) != 0) {
        snprintf(err, errlen, "%s %s: %s", flag, path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s %s: not a regular file", flag, path);
        goto fail;
    }
    if (secret && (st.st_mode & S_IRWXO) != 0) {
        snprintf(err, errlen,
                 "%s %s: accessible to other users (mode %04o); it holds secrets: chmod 600 it",
                 flag, path, (unsigned)(st.st_mode & 07777));
        goto fail;
    }
    if ((size_t)st.st_size > FILE_MAX) {
        snprintf(err, errlen, "%s %s: larger than %zu bytes", flag, path, FILE_MAX);
        goto fail;
    }
    buf      = ddl_malloc((size_t)st.st_size + 1);
    size_t n = 0;
    while (buf != NULL && n < (size_t)st.st_size) {
        ssize_t k = read(fd, buf + n, (size_t)st.st_size - n);
        if (k < 0 && errno == EINTR) {
            continue;
        }
        if (k <= 0) {
            snprintf(err, errlen, "%s %s: cannot read: %s", flag, path,
                     k < 0 ? strerror(errno) : "file shrank while reading");
            goto fail;
        }
        n += (size_t)k;
    }
    if (buf == NULL) {
        snprintf(err, errlen, "%s %s: out of memory", flag, path);
        goto fail;
    }
    buf[n] = '\0';
    close(fd);
    return buf;
fail:
    if (buf != NULL) {
        memset(buf, 0, (size_t)st.st_size);
        ddl_free(buf);
    }
    close(fd);
    return NULL;
}

static void free_secret(char **p)
{
    if (*p != NULL) {
        memset(*p, 0, strlen(*p));
        ddl_free(*p);
        *p = NULL;
    }
}

static bool parse_role(const char *s, size_t n, ddld_role *out)
{
    static const ddld_role roles[] = {DDLD_ROLE_ADMIN, DDLD_ROLE_TRAIN, DDLD_ROLE_INFER};
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++) {
        const char *name = ddld_role_name(roles[i]);
        if (strlen(name) == n && strncmp(s, name, n) == 0) {
            *out = roles[i];
            return true;
        }
    }
    return false;
}

int ddld_auth_parse_tokens(ddld_auth *a, const char *text, const char *path, char *err,
                           size_t errlen)
{
    int                 line = 0, cap = 0, n = 0;
    struct token_entry *t = NULL;
    const char         *p = text;
    while (*p != '\0') {
        line++;
        const char *eol  = strchr(p, '\n');
        const char *end  = eol != NULL ? eol : p + strlen(p);
        const char *next = eol != NULL ? eol + 1 : end;
        // Fields: ROLE TOKEN, separated by spaces or tabs. A field that starts with '#'
        // starts a comment to the end of the line ('#' inside a token is part of it).
        const char *f[3];
        size_t      fl[3];
        int         nf = 0;
        const char *q  = p;
        while (q < end) {
            if (*q == ' ' || *q == '\t' || *q == '\r') {
                q++;
                continue;
            }
            if (*q == '#') {
                break;
            }
            const char *s = q;
            while (q < end && *q != ' ' && *q != '\t' && *q != '\r') {
                q++;
            }
            if (nf < 3) {
                f[nf]  = s;
                fl[nf] = (size_t)(q - s);
            }
            nf++;
        }
        p = next;
        if (nf == 0) {
            continue;
        }
        ddld_role role;
        if (nf != 2) {
            snprintf(err, errlen,
                     "--token-file %s line %d: expected \"ROLE TOKEN\", found %d field%s", path,
                     line, nf, nf == 1 ? "" : "s");
            goto fail;
        }
        if (!parse_role(f[0], fl[0], &role)) {
            snprintf(err, errlen,
                     "--token-file %s line %d: unknown role \"%.*s\" (admin, train or infer)", path,
                     line, fl[0] > 32 ? 32 : (int)fl[0], f[0]);
            goto fail;
        }
        if (fl[1] < DDLD_TOKEN_MIN || fl[1] > DDLD_TOKEN_MAX) {
            snprintf(err, errlen,
                     "--token-file %s line %d: the token has %zu characters; %d to %d are needed",
                     path, line, fl[1], DDLD_TOKEN_MIN, DDLD_TOKEN_MAX);
            goto fail;
        }
        for (size_t i = 0; i < fl[1]; i++) {
            unsigned char ch = (unsigned char)f[1][i];
            if (ch < 0x21 || ch > 0x7e) {
                snprintf(err, errlen,
                         "--token-file %s line %d: the token has a character outside visible ASCII "
                         "(at position %zu)",
                         path, line, i + 1);
                goto fail;
            }
        }
        if (n == cap) {
            cap                      = cap != 0 ? 2 * cap : 8;
            struct token_entry *grow = ddl_realloc(t, (size_t)cap * sizeof *t);
            if (grow == NULL) {
                snprintf(err, errlen, "--token-file %s: out of memory", path);
                goto fail;
            }
            t = grow;
        }
        digest(f[1], fl[1], t[n].digest);
        t[n].role = role;
        for (int i = 0; i < n; i++) {
            if (memcmp(t[i].digest, t[n].digest, DDLD_DIGEST_BYTES) == 0) {
                snprintf(err, errlen, "--token-file %s line %d: the same token appears twice", path,
                         line);
                goto fail;
            }
        }
        n++;
    }
    if (n == 0) {
        snprintf(err, errlen, "--token-file %s: no tokens (lines of \"ROLE TOKEN\")", path);
        goto fail;
    }
    pthread_rwlock_wrlock(&a->lock);
    struct token_entry *old  = a->tokens;
    int                 nold = a->ntokens;
    a->tokens                = t;
    a->ntokens               = n;
    a->use_tokens            = true;
    pthread_rwlock_unlock(&a->lock);
    if (old != NULL) {
        memset(old, 0, (size_t)nold * sizeof *old);
        ddl_free(old);
    }
    return 0;
fail:
    ddl_free(t);
    return -1;
}

// The last OpenSSL error as text (or "no PEM data").
static const char *ssl_reason(char *buf, size_t len)
{
    unsigned long e = ERR_peek_last_error();
    if (e == 0) {
        snprintf(buf, len, "no PEM data");
    } else {
        ERR_error_string_n(e, buf, len);
    }
    ERR_clear_error();
    return buf;
}

// Checks the PEM files with OpenSSL: a certificate chain, a private key that matches its
// first certificate, and a client CA with at least one certificate.
static int check_tls(const ddld_auth_options *o, ddld_auth *a, char *err, size_t errlen)
{
    char      why[256];
    int       rc   = -1;
    X509     *cert = NULL, *ca = NULL;
    EVP_PKEY *key = NULL;
    BIO      *bio = BIO_new_mem_buf(a->cert_pem, -1);
    cert          = bio != NULL ? PEM_read_bio_X509(bio, NULL, NULL, NULL) : NULL;
    BIO_free(bio);
    if (cert == NULL) {
        snprintf(err, errlen, "--tls-cert %s: no PEM certificate in it (%s)", o->tls_cert,
                 ssl_reason(why, sizeof why));
        goto out;
    }
    bio = BIO_new_mem_buf(a->key_pem, -1);
    key = bio != NULL ? PEM_read_bio_PrivateKey(bio, NULL, NULL, NULL) : NULL;
    BIO_free(bio);
    if (key == NULL) {
        snprintf(err, errlen, "--tls-key %s: no unencrypted PEM private key in it (%s)", o->tls_key,
                 ssl_reason(why, sizeof why));
        goto out;
    }
    if (X509_check_private_key(cert, key) != 1) {
        ERR_clear_error();
        snprintf(err, errlen, "--tls-key %s: does not match the certificate in --tls-cert %s",
                 o->tls_key, o->tls_cert);
        goto out;
    }
    if (X509_cmp_current_time(X509_get0_notAfter(cert)) < 0) {
        ddld_log("warning: --tls-cert %s: the certificate has expired; clients will refuse it",
                 o->tls_cert);
    }
    if (a->client_ca_pem != NULL) {
        bio = BIO_new_mem_buf(a->client_ca_pem, -1);
        ca  = bio != NULL ? PEM_read_bio_X509(bio, NULL, NULL, NULL) : NULL;
        BIO_free(bio);
        if (ca == NULL) {
            snprintf(err, errlen, "--tls-client-ca %s: no PEM certificate in it (%s)",
                     o->tls_client_ca, ssl_reason(why, sizeof why));
            goto out;
        }
    }
    rc = 0;
out:
    X509_free(cert);
    X509_free(ca);
    EVP_PKEY_free(key);
    return rc;
}

int ddld_auth_create(const ddld_auth_options *o, ddld_auth **out, char *err, size_t errlen)
{
    *out         = NULL;
    err[0]       = '\0';
    ddld_auth *a = ddl_calloc(1, sizeof *a);
    if (a == NULL) {
        snprintf(err, errlen, "auth: out of memory");
        return -1;
    }
    pthread_rwlock_init(&a->lock, NULL);
    a->verbose = getenv("DDLD_VERBOSE") != NULL && getenv("DDLD_VERBOSE")[0] == '1';
    if (o->token_file != NULL) {
        a->token_path = ddl_strdup(o->token_file);
        if (a->token_path == NULL) {
            snprintf(err, errlen, "--token-file %s: out of memory", o->token_file);
            goto fail;
        }
        char *text = read_file(o->token_file, "--token-file", true, err, errlen);
        if (text == NULL) {
            goto fail;
        }
        int rc = ddld_auth_parse_tokens(a, text, o->token_file, err, errlen);
        free_secret(&text);
        if (rc != 0) {
            goto fail;
        }
    }
    if ((o->tls_cert != NULL) != (o->tls_key != NULL)) {
        snprintf(err, errlen, "--tls-cert and --tls-key go together");
        goto fail;
    }
    if (o->tls_cert != NULL) {
        a->cert_pem = read_file(o->tls_cert, "--tls-cert", false, err, errlen);
        a->key_pem =
            a->cert_pem != NULL ? read_file(o->tls_key, "--tls-key", true, err, errlen) : NULL;
        if (a->key_pem == NULL) {
            goto fail;
        }
        if (o->tls_client_ca != NULL) {
            a->client_ca_pem = read_file(o->tls_client_ca, "--tls-client-ca", false, err, errlen);
            if (a->client_ca_pem == NULL) {
                goto fail;
            }
        }
        if (check_tls(o, a, err, errlen) != 0) {
            goto fail;
        }
    } else if (o->tls_client_ca != NULL) {
        snprintf(err, errlen, "--tls-client-ca needs --tls-cert and --tls-key");
        goto fail;
    }
    *out = a;
    return 0;
fail:
    ddld_auth_destroy(&a);
    return -1;
}

void ddld_auth_destroy(ddld_auth **pa)
{
    ddld_auth *a = *pa;
    if (a == NULL) {
        return;
    }
    if (a->tokens != NULL) {
        memset(a->tokens, 0, (size_t)a->ntokens * sizeof *a->tokens);
        ddl_free(a->tokens);
    }
    ddl_free(a->cert_pem);
    free_secret(&a->key_pem);
    ddl_free(a->client_ca_pem);
    ddl_free(a->token_path);
    pthread_rwlock_destroy(&a->lock);
    ddl_free(a);
    *pa = NULL;
}

int ddld_auth_token_count(const ddld_auth *a)
{
    if (a == NULL) {
        return 0;
    }
    pthread_rwlock_rdlock(&((ddld_auth *)a)->lock);
    int n = a->ntokens;
    pthread_rwlock_unlock(&((ddld_auth *)a)->lock);
    return n;
}

int ddld_auth_reload_tokens(ddld_auth *a, char *err, size_t errlen)
{
    if (a == NULL || a->token_path == NULL) {
        snprintf(err, errlen, "no --token-file to reload");
        return -1;
    }
    char *text = read_file(a->token_path, "--token-file", true, err, errlen);
    if (text == NULL) {
        return -1;
    }
    int rc = ddld_auth_parse_tokens(a, text, a->token_path, err, errlen);
    free_secret(&text);
    return rc;
}

bool ddld_auth_uses_tls(const ddld_auth *a)
{
    return a != NULL && a->cert_pem != NULL;
}

void ddld_auth_tls_pem(const ddld_auth *a, const char **cert, const char **key, const char **ca)
{
    *cert = a != NULL ? a->cert_pem : NULL;
    *key  = a != NULL ? a->key_pem : NULL;
    *ca   = a != NULL ? a->client_ca_pem : NULL;
}

grpc_server_credentials *ddld_auth_server_credentials(ddld_auth *a)
{
    if (!ddld_auth_uses_tls(a)) {
        return grpc_insecure_server_credentials_create();
    }
    grpc_ssl_pem_key_cert_pair pair = {.private_key = a->key_pem, .cert_chain = a->cert_pem};
    // The config copies the PEM strings; gRPC verifies client certificates against the
    // client CA when one is given and then requires one.
    grpc_ssl_server_certificate_config *conf =
        grpc_ssl_server_certificate_config_create(a->client_ca_pem, &pair, 1);
    grpc_ssl_server_credentials_options *opts =
        grpc_ssl_server_credentials_create_options_using_config(
            a->client_ca_pem != NULL ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                     : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
            conf);
    grpc_server_credentials *cr = grpc_ssl_server_credentials_create_with_options(opts);
    free_secret(&a->key_pem);
    return cr;
}

// ---- configuration checks ---------------------------------------------------------------------

bool ddld_listen_is_loopback(const char *listen)
{
    if (strncmp(listen, "unix:", 5) == 0 || strncmp(listen, "unix-abstract:", 14) == 0) {
        return true;
    }
    if (strncmp(listen, "ipv4:", 5) == 0 || strncmp(listen, "ipv6:", 5) == 0) {
        listen += 5;
    }
    const char *colon = strrchr(listen, ':');
    size_t      hl    = colon != NULL ? (size_t)(colon - listen) : strlen(listen);
    char        host[256];
    if (hl >= sizeof host) {
        return false;
    }
    memcpy(host, listen, hl);
    host[hl] = '\0';
    if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = '\0';
    }
    if (strcmp(host, "localhost") == 0 || strcmp(host, "::1") == 0) {
        return true;
    }
    // 127.0.0.0/8, written as a dotted quad of numbers.
    unsigned b[4];
    char     tail;
    return sscanf(host, "%u.%u.%u.%u%c", &b[0], &b[1], &b[2], &b[3], &tail) == 4 && b[0] == 127 &&
           b[1] < 256 && b[2] < 256 && b[3] < 256;
}

const char *ddld_auth_config_problem(const ddld_auth_options *o, const char *listen, bool insecure,
                                     char *buf, size_t len)
{
    if ((o->tls_cert != NULL) != (o->tls_key != NULL)) {
        snprintf(buf, len, "--tls-cert and --tls-key go together");
        return buf;
    }
    if (o->tls_client_ca != NULL && o->tls_cert == NULL) {
        snprintf(buf, len, "--tls-client-ca needs --tls-cert and --tls-key");
        return buf;
    }
    if (!insecure && o->tls_cert == NULL && o->token_file == NULL &&
        !ddld_listen_is_loopback(listen)) {
        snprintf(buf, len,
                 "refusing to listen on %s without TLS or tokens: anyone who can reach it could "
                 "train, replace or shut down the model. Use --tls-cert/--tls-key and/or "
                 "--token-file, listen on 127.0.0.1 or unix:PATH, or pass --insecure",
                 listen);
        return buf;
    }
    return NULL;
}

// ---- the daemon's instance ---------------------------------------------------------------------

static ddld_auth *daemon_auth;

int ddld_auth_startup(const struct ddld_config *cfg)
{
    ddld_auth_options o = {.token_file    = cfg->token_file,
                           .tls_cert      = cfg->tls_cert,
                           .tls_key       = cfg->tls_key,
                           .tls_client_ca = cfg->tls_client_ca};
    char              err[1024];
    if (ddld_auth_create(&o, &daemon_auth, err, sizeof err) != 0) {
        ddld_log("%s", err);
        return 2;
    }
    if (ddld_auth_uses_tls(daemon_auth) || daemon_auth->use_tokens) {
        ddld_log("auth: %s%s, %d token%s", ddld_auth_uses_tls(daemon_auth) ? "TLS" : "plaintext",
                 cfg->tls_client_ca != NULL ? " with client certificates required" : "",
                 daemon_auth->ntokens, daemon_auth->ntokens == 1 ? "" : "s");
    }
    if (ddld_auth_uses_tls(daemon_auth) && !daemon_auth->use_tokens && cfg->tls_client_ca == NULL &&
        !ddld_listen_is_loopback(cfg->listen)) {
        ddld_log("warning: TLS without --token-file or --tls-client-ca encrypts but does not "
                 "restrict: every client that trusts the certificate may call everything");
    }
    return 0;
}

void ddld_auth_reload(void)
{
    char err[1024];
    if (daemon_auth == NULL || daemon_auth->token_path == NULL) {
        ddld_log("SIGHUP: no --token-file to reload");
    } else if (ddld_auth_reload_tokens(daemon_auth, err, sizeof err) != 0) {
        ddld_log("SIGHUP: %s; the %d tokens loaded before stay in force", err,
                 ddld_auth_token_count(daemon_auth));
    } else {
        int n = ddld_auth_token_count(daemon_auth);
        ddld_log("SIGHUP: --token-file %s reloaded: %d token%s", daemon_auth->token_path, n,
                 n == 1 ? "" : "s");
    }
}

ddld_auth *ddld_auth_daemon(void)
{
    return daemon_auth;
}

void ddld_auth_shutdown(void)
{
    ddld_auth_destroy(&daemon_auth);
}
