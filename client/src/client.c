// client.c: the connection (channel, credentials, method registration) and the call
// machinery every RPC goes through: one pluck completion queue per call, so any number of
// threads can call on one connection at once.
#include <malloc.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "client_impl.h"
#include "rpc_codes.h"

static _Thread_local int last_code;

static const char *const method_path[] = {
#define X(name, path, kind, role, where, request, handler) [M_##name] = path,
    DDL_RPC_METHODS(X)
#undef X
};
_Static_assert(sizeof method_path / sizeof method_path[0] == M_COUNT, "a path per method");

const char *ddl__method_name(int method)
{
    const char *p = strrchr(method_path[method], '/');
    return p ? p + 1 : method_path[method];
}

const char *ddl_client_version_string(void)
{
    return "0.1.0";
}

// ---- status --------------------------------------------------------------------------


int ddl_client_last_code(void)
{
    return last_code;
}

const char *ddl_client_code_name(int code)
{
    return ddl_rpc_code_name(code);
}

static ddl_status status_from_code(int code)
{
    switch (code) {
    case DDL_RPC_OK:
        return DDL_OK;
    case DDL_RPC_INVALID_ARGUMENT:
    case DDL_RPC_OUT_OF_RANGE:
        return DDL_EINVAL;
    case DDL_RPC_NOT_FOUND:
        return DDL_ENOTFOUND;
    case DDL_RPC_FAILED_PRECONDITION:
        return DDL_EBUSY;
    case DDL_RPC_RESOURCE_EXHAUSTED:
        return DDL_ENOMEM;
    case DDL_RPC_DATA_LOSS:
        return DDL_ECORRUPT;
    case DDL_RPC_CANCELLED:
        return DDL_ECANCELED;
    case DDL_RPC_DEADLINE_EXCEEDED:
        return DDL_ETIMEDOUT;
    case DDL_RPC_UNAVAILABLE:
        return DDL_EIO;
    default:
        return DDL_EREMOTE;
    }
}

ddl_status ddl__local_error(ddl_status s, const char *fmt, ...)
{
    char    buf[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    last_code = DDL_RPC_OK;
    return ddl_set_error(s, "%s", buf);
}

// ---- connection ----------------------------------------------------------------------

ddl_client_options ddl_client_options_default(void)
{
    return (ddl_client_options){.connect_timeout_s = 10.0};
}

static gpr_timespec deadline_after(double s)
{
    if (s <= 0)
        return gpr_inf_future(GPR_CLOCK_REALTIME);
    return gpr_time_add(gpr_now(GPR_CLOCK_REALTIME),
                        gpr_time_from_micros((int64_t)(s * 1e6), GPR_TIMESPAN));
}

// Reads a whole (small) text file; NULL with an error set on failure.
static char *read_text(const char *path, const char *what)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        ddl__local_error(DDL_EIO, "connect: cannot open %s %s", what, path);
        return NULL;
    }
    char  *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? 2 * cap : 8192;
            if (cap > (16u << 20)) {
                ddl__local_error(DDL_EINVAL, "connect: %s %s is larger than 16 MiB", what, path);
                goto fail;
            }
            char *nb = realloc(buf, cap);
            if (!nb) {
                ddl__local_error(DDL_ENOMEM, "connect: out of memory reading %s", path);
                goto fail;
            }
            buf = nb;
        }
        size_t k = fread(buf + n, 1, 4096, f);
        n += k;
        if (k < 4096)
            break;
    }
    if (ferror(f)) {
        ddl__local_error(DDL_EIO, "connect: error reading %s %s", what, path);
        goto fail;
    }
    buf[n] = '\0';
    fclose(f);
    return buf;
fail:
    free(buf);
    fclose(f);
    return NULL;
}

static grpc_channel_credentials *make_credentials(const ddl_client_options *o, ddl_status *st)
{
    *st = DDL_OK;
    if (!o->tls_ca_file) {
        if (o->tls_cert_file || o->tls_key_file) {
            *st = ddl__local_error(DDL_EINVAL,
                                   "connect: tls_cert_file/tls_key_file need tls_ca_file");
            return NULL;
        }
        return grpc_insecure_credentials_create();
    }
    if (!o->tls_cert_file != !o->tls_key_file) {
        *st = ddl__local_error(DDL_EINVAL,
                               "connect: mutual TLS needs both tls_cert_file and tls_key_file");
        return NULL;
    }
    char *ca = read_text(o->tls_ca_file, "CA file"), *cert = NULL, *key = NULL;
    if (!ca)
        goto fail;
    if (o->tls_cert_file) {
        cert = read_text(o->tls_cert_file, "certificate");
        key  = cert ? read_text(o->tls_key_file, "key") : NULL;
        if (!key)
            goto fail;
    }
    grpc_ssl_pem_key_cert_pair pair = {.private_key = key, .cert_chain = cert};
    grpc_channel_credentials *cr = grpc_ssl_credentials_create(ca, cert ? &pair : NULL, NULL, NULL);
    free(ca);
    free(cert);
    if (key) {
        memset(key, 0, strlen(key));
        free(key);
    }
    if (!cr)
        *st = ddl__local_error(DDL_EINVAL, "connect: gRPC rejected the TLS files");
    return cr;
fail:
    free(ca);
    free(cert);
    free(key);
    *st = DDL_EIO;
    return NULL;
}

// Waits until the channel is READY or the deadline passes.
static ddl_status wait_ready(grpc_channel *ch, double timeout_s, const char *address)
{
    gpr_timespec            deadline = deadline_after(timeout_s);
    grpc_completion_queue  *cq       = grpc_completion_queue_create_for_pluck(NULL);
    ddl_status              st       = DDL_OK;
    char                    tag;
    grpc_connectivity_state s = grpc_channel_check_connectivity_state(ch, 1);
    while (s != GRPC_CHANNEL_READY) {
        if (s == GRPC_CHANNEL_SHUTDOWN) {
            st = DDL_EIO;
            break;
        }
        grpc_channel_watch_connectivity_state(ch, s, deadline, cq, &tag);
        grpc_event ev =
            grpc_completion_queue_pluck(cq, &tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type != GRPC_OP_COMPLETE || !ev.success) { // deadline passed
            st = DDL_ETIMEDOUT;
            break;
        }
        s = grpc_channel_check_connectivity_state(ch, 1);
    }
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(cq);
    if (st != DDL_OK) {
        ddl__local_error(st, "connect: %s not reachable within %.1f s", address, timeout_s);
        last_code = DDL_RPC_UNAVAILABLE;
    }
    return st;
}

ddl_status ddl_client_connect(const char *address, const ddl_client_options *opts,
                              ddl_client_t **out)
{
    ddl_client_options o = opts ? *opts : ddl_client_options_default();
    if (!address || !*address || !out)
        return ddl__local_error(DDL_EINVAL, "connect: address and out are required");
    if (o.token && (strchr(o.token, '\n') || strchr(o.token, '\r') || strlen(o.token) > 4096))
        return ddl__local_error(DDL_EINVAL, "connect: token has a line break or is too long");
    if (o.tune_malloc) {
        mallopt(M_MMAP_THRESHOLD, 256 << 20); // a 64 MiB weight is not mmap'd per pull
        mallopt(M_TRIM_THRESHOLD, 1 << 30);
    }

    grpc_init();
    ddl_status                st;
    grpc_channel_credentials *cr = make_credentials(&o, &st);
    if (!cr) {
        grpc_shutdown();
        return st;
    }
    ddl_client_t *c = calloc(1, sizeof *c);
    if (!c) {
        grpc_channel_credentials_release(cr);
        grpc_shutdown();
        return ddl__local_error(DDL_ENOMEM, "connect: out of memory");
    }
    c->call_timeout_s = o.call_timeout_s;

    int64_t  max_recv = o.max_receive_bytes ? o.max_receive_bytes : (int64_t)64 << 20;
    grpc_arg args[5];
    size_t   na              = 0;
    args[na].type            = GRPC_ARG_INTEGER;
    args[na].key             = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[na++].value.integer = max_recv < 0 || max_recv > INT32_MAX ? -1 : (int)max_recv;
    // Streams start with a 64 KiB flow-control window; large logits and weight chunks
    // should not wait for window updates (the daemon does the same for requests).
    args[na].type            = GRPC_ARG_INTEGER;
    args[na].key             = GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES;
    args[na++].value.integer = 8 << 20;
    if (o.own_connection) {
        // A channel-local subchannel pool: this channel never reuses another's connection.
        args[na].type            = GRPC_ARG_INTEGER;
        args[na].key             = GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL;
        args[na++].value.integer = 1;
    }
    if (o.tls_server_name) {
        args[na].type           = GRPC_ARG_STRING;
        args[na].key            = GRPC_SSL_TARGET_NAME_OVERRIDE_ARG;
        args[na++].value.string = (char *)o.tls_server_name;
    }
    grpc_channel_args cargs = {.num_args = na, .args = args};
    c->channel              = grpc_channel_create(address, cr, &cargs);
    grpc_channel_credentials_release(cr);
    if (!c->channel) {
        free(c);
        grpc_shutdown();
        return ddl__local_error(DDL_EINVAL, "connect: cannot create a channel to %s", address);
    }
    for (int m = 0; m < M_COUNT; m++)
        c->method[m] = grpc_channel_register_call(c->channel, method_path[m], NULL, NULL);
    if (o.token) {
        size_t n = strlen(o.token) + 8;
        char  *v = malloc(n);
        if (!v) {
            ddl_client_destroy(&c);
            return ddl__local_error(DDL_ENOMEM, "connect: out of memory");
        }
        snprintf(v, n, "Bearer %s", o.token);
        c->auth.key   = grpc_slice_from_static_string("authorization");
        c->auth.value = grpc_slice_from_copied_string(v);
        memset(v, 0, n);
        free(v);
        c->nauth = 1;
    }
    if (o.connect_timeout_s > 0) {
        st = wait_ready(c->channel, o.connect_timeout_s, address);
        if (st != DDL_OK) {
            ddl_client_destroy(&c);
            return st;
        }
    }
    *out      = c;
    last_code = DDL_RPC_OK;
    return DDL_OK;
}

void ddl_client_destroy(ddl_client_t **cp)
{
    if (!cp || !*cp)
        return;
    ddl_client_t *c = *cp;
    if (c->nauth)
        grpc_slice_unref(c->auth.value);
    grpc_channel_destroy(c->channel);
    free(c);
    *cp = NULL;
    grpc_shutdown();
}

// ---- calls ---------------------------------------------------------------------------

static int pluck(grpc_completion_queue *cq, void *tag)
{
    grpc_event ev = grpc_completion_queue_pluck(cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    return ev.type == GRPC_OP_COMPLETE && ev.success;
}

ddl_status ddl__rpc_open(ddl_client_t *c, int method, double timeout_s, ddl__rpc *r)
{
    memset(r, 0, sizeof *r);
    r->client  = c;
    r->method  = method;
    r->status  = GRPC_STATUS_UNKNOWN;
    r->details = grpc_empty_slice();
    grpc_metadata_array_init(&r->initial_md);
    grpc_metadata_array_init(&r->trailing_md);
    r->cq = grpc_completion_queue_create_for_pluck(NULL);
    if (!r->cq)
        return ddl__local_error(DDL_ENOMEM, "%s: cannot create a completion queue",
                                ddl__method_name(method));
    r->call =
        grpc_channel_create_registered_call(c->channel, NULL, GRPC_PROPAGATE_DEFAULTS, r->cq,
                                            c->method[method], deadline_after(timeout_s), NULL);
    if (!r->call)
        return ddl__local_error(DDL_EINTERNAL, "%s: cannot create the call",
                                ddl__method_name(method));
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op                                           = GRPC_OP_RECV_STATUS_ON_CLIENT;
    op.data.recv_status_on_client.trailing_metadata = &r->trailing_md;
    op.data.recv_status_on_client.status            = &r->status;
    op.data.recv_status_on_client.status_details    = &r->details;
    op.data.recv_status_on_client.error_string      = &r->error_string;
    if (grpc_call_start_batch(r->call, &op, 1, &r->status_tag, NULL) != GRPC_CALL_OK)
        return ddl__local_error(DDL_EINTERNAL, "%s: cannot start the call",
                                ddl__method_name(method));
    r->status_pending = 1;
    return DDL_OK;
}

int ddl__rpc_batch(ddl__rpc *r, const grpc_op *ops, size_t n)
{
    char tag;
    if (grpc_call_start_batch(r->call, ops, n, &tag, NULL) != GRPC_CALL_OK)
        return 0;
    return pluck(r->cq, &tag);
}

ddl_status ddl__rpc_close(ddl__rpc *r, ddl_status local_status)
{
    ddl_status st = local_status;
    if (r->status_pending) {
        if (local_status != DDL_OK && r->call) {
            // A local failure mid-call: do not leave the daemon waiting for more.
            grpc_call_cancel(r->call, NULL);
        }
        pluck(r->cq, &r->status_tag);
        r->status_pending = 0;
        int code          = (int)r->status;
        if (code != GRPC_STATUS_OK) {
            char *d = grpc_slice_to_c_string(r->details);
            if (local_status == DDL_OK || code != GRPC_STATUS_CANCELLED) {
                last_code = code;
                st =
                    ddl_set_error(status_from_code(code), "%s: %s: %s", ddl__method_name(r->method),
                                  ddl_client_code_name(code), d && *d ? d : "(no message)");
            }
            gpr_free(d);
        } else if (local_status == DDL_OK) {
            last_code = DDL_RPC_OK;
        }
    }
    if (r->error_string)
        gpr_free((void *)r->error_string);
    grpc_slice_unref(r->details);
    grpc_metadata_array_destroy(&r->initial_md);
    grpc_metadata_array_destroy(&r->trailing_md);
    if (r->call)
        grpc_call_unref(r->call);
    if (r->cq) {
        grpc_completion_queue_shutdown(r->cq);
        while (grpc_completion_queue_pluck(r->cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL)
                   .type != GRPC_QUEUE_SHUTDOWN) {
        }
        grpc_completion_queue_destroy(r->cq);
    }
    memset(r, 0, sizeof *r);
    return st;
}

grpc_byte_buffer *ddl__pack(const ProtobufCMessage *m)
{
    size_t     n = protobuf_c_message_get_packed_size(m);
    grpc_slice s = grpc_slice_malloc(n);
    protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(s));
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

ProtobufCMessage *ddl__unpack(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *d)
{
    grpc_byte_buffer_reader rd;
    if (!grpc_byte_buffer_reader_init(&rd, bb))
        return NULL;
    ProtobufCMessage *m;
    if (bb->data.raw.slice_buffer.count == 1) {
        grpc_slice s = bb->data.raw.slice_buffer.slices[0];
        m = protobuf_c_message_unpack(d, NULL, GRPC_SLICE_LENGTH(s), GRPC_SLICE_START_PTR(s));
    } else {
        grpc_slice s = grpc_byte_buffer_reader_readall(&rd);
        m = protobuf_c_message_unpack(d, NULL, GRPC_SLICE_LENGTH(s), GRPC_SLICE_START_PTR(s));
        grpc_slice_unref(s);
    }
    grpc_byte_buffer_reader_destroy(&rd);
    return m;
}

ddl_status ddl__unary(ddl_client_t *c, int method, const ProtobufCMessage *req,
                      const ProtobufCMessageDescriptor *d, ProtobufCMessage **resp)
{
    *resp = NULL;
    ddl__rpc   r;
    ddl_status st = ddl__rpc_open(c, method, c->call_timeout_s, &r);
    if (st != DDL_OK)
        return ddl__rpc_close(&r, st);
    grpc_byte_buffer *send = ddl__pack(req), *recv = NULL;
    grpc_op           ops[5];
    memset(ops, 0, sizeof ops);
    ops[0].op                                               = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count                 = c->nauth;
    ops[0].data.send_initial_metadata.metadata              = c->nauth ? &c->auth : NULL;
    ops[1].op                                               = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message                   = send;
    ops[2].op                                               = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op                                               = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &r.initial_md;
    ops[4].op                                               = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message                   = &recv;
    ddl__rpc_batch(&r, ops, 5);
    grpc_byte_buffer_destroy(send);
    ddl_status local = DDL_OK;
    if (recv) {
        *resp = ddl__unpack(recv, d);
        grpc_byte_buffer_destroy(recv);
        if (!*resp)
            local =
                ddl__local_error(DDL_EPROTO, "%s: malformed response", ddl__method_name(method));
    }
    st = ddl__rpc_close(&r, local);
    if (st == DDL_OK && !*resp)
        st = ddl__local_error(DDL_EPROTO, "%s: OK status without a response message",
                              ddl__method_name(method));
    if (st != DDL_OK && *resp) {
        protobuf_c_message_free_unpacked(*resp, NULL);
        *resp = NULL;
    }
    return st;
}

// ---- tensors -------------------------------------------------------------------------

static const char *const dtype_names[] = {"FP32", "FP64", "INT64", "UINT8"};
static const size_t      dtype_sizes[] = {4, 8, 8, 1};

size_t ddl_wire_dtype_size(ddl_wire_dtype d)
{
    return (unsigned)d < 4 ? dtype_sizes[d] : 0;
}

const char *ddl_wire_dtype_name(ddl_wire_dtype d)
{
    return (unsigned)d < 4 ? dtype_names[d] : "UNKNOWN";
}

int ddl__dtype_from_name(const char *name)
{
    for (int i = 0; i < 4; i++)
        if (name && strcmp(name, dtype_names[i]) == 0)
            return i;
    return -1;
}

ddl_status ddl__check_tensor(const ddl_client_tensor *t, const char *what)
{
    if (!t)
        return ddl__local_error(DDL_EINVAL, "%s: tensor is NULL", what);
    if (ddl_wire_dtype_size(t->dtype) == 0)
        return ddl__local_error(DDL_EINVAL, "%s: unknown dtype %d", what, (int)t->dtype);
    if (t->ndim < 0 || t->ndim > DDL_CLIENT_MAX_DIMS)
        return ddl__local_error(DDL_EINVAL, "%s: ndim %d outside [0, %d]", what, t->ndim,
                                DDL_CLIENT_MAX_DIMS);
    // The byte count is what goes on the wire; shape and bytes are both sent, and the daemon
    // checks them against each other, so a mismatch is left for it to report.
    if (t->bytes && !t->data)
        return ddl__local_error(DDL_EINVAL, "%s: %zu bytes but data is NULL", what, t->bytes);
    return DDL_OK;
}

void ddl_client_tensor_release(ddl_client_tensor *t)
{
    if (!t)
        return;
    free(t->name);
    free(t->data);
    memset(t, 0, sizeof *t);
}

ddl_client_tensor *ddl_client_weights_find(const ddl_client_weights *w, const char *name)
{
    if (!w || !name)
        return NULL;
    for (int64_t i = 0; i < w->count; i++)
        if (w->tensors[i].name && strcmp(w->tensors[i].name, name) == 0)
            return &w->tensors[i];
    return NULL;
}

void ddl_client_weights_destroy(ddl_client_weights **wp)
{
    if (!wp || !*wp)
        return;
    ddl_client_weights *w = *wp;
    for (int64_t i = 0; i < w->count; i++)
        ddl_client_tensor_release(&w->tensors[i]);
    free(w->tensors);
    free(w);
    *wp = NULL;
}
