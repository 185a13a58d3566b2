// engine/tbevents.c: TensorBoard event files (ddl/tbevents.h). Each event is encoded as
// protobuf by hand (five fields; no generated code, no protobuf dependency in the engine)
// and framed as a TFRecord with masked CRC-32C checksums.
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/check.h"
#include "ddl/tbevents.h"
#include "durable.h"

struct ddl_tb_writer {
    FILE *f;
    char  path[4096];
    // One event's encoding: grown as needed, kept between events.
    uint8_t *buf;
    size_t   cap;
    double   flushed; // monotonic seconds of the last flush (ddl_tb_flush_due)
};

// ---- CRC-32C (Castagnoli, reflected polynomial 0x82f63b78), table-driven ----------------

static uint32_t crc_table[256];
static void     crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) {
            c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
        }
        crc_table[i] = c;
    }
}

uint32_t ddl_crc32c(const void *data, size_t len)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, crc_init);
    const uint8_t *p = data;
    uint32_t       c = 0xffffffffu;
    for (size_t i = 0; i < len; i++) {
        c = crc_table[(c ^ p[i]) & 0xff] ^ (c >> 8);
    }
    return c ^ 0xffffffffu;
}

uint32_t ddl_tb_masked_crc(const void *data, size_t len)
{
    uint32_t c = ddl_crc32c(data, len);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

// ---- protobuf encoding ------------------------------------------------------------------

struct enc {
    uint8_t *p;
    size_t   n, cap;
};

static void put(struct enc *e, const void *b, size_t n)
{
    if (e->n + n <= e->cap) {
        memcpy(e->p + e->n, b, n);
    }
    e->n += n; // past cap: counted only (the caller sizes and encodes again)
}
static void put_varint(struct enc *e, uint64_t v)
{
    uint8_t b[10];
    size_t  n = 0;
    do {
        b[n++] = (uint8_t)((v & 0x7f) | (v >= 0x80 ? 0x80 : 0));
        v >>= 7;
    } while (v != 0);
    put(e, b, n);
}
static void put_key(struct enc *e, int field, int wire)
{
    put_varint(e, (uint64_t)field << 3 | (uint64_t)wire);
}
static void put_le(struct enc *e, uint64_t v, size_t n)
{
    uint8_t b[8];
    for (size_t i = 0; i < n; i++) {
        b[i] = (uint8_t)(v >> (8 * i));
    }
    put(e, b, n);
}
static void put_bytes(struct enc *e, int field, const void *b, size_t n)
{
    put_key(e, field, 2);
    put_varint(e, n);
    put(e, b, n);
}
static size_t varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

// Summary.Value{tag = 1, simple_value = 2}: its encoded length.
static size_t value_len(const char *tag)
{
    size_t t = strlen(tag);
    return 1 + varint_len(t) + t + 1 + 4;
}

// Event{wall_time = 1, step = 2, file_version = 3 | summary = 5}.
static void encode_event(struct enc *e, double wall, int64_t step, const char *version, size_t n,
                         const char *const *tags, const double *values)
{
    uint64_t bits;
    memcpy(&bits, &wall, sizeof bits);
    put_key(e, 1, 1);
    put_le(e, bits, 8);
    if (step != 0) {
        put_key(e, 2, 0);
        put_varint(e, (uint64_t)step);
    }
    if (version != NULL) {
        put_bytes(e, 3, version, strlen(version));
        return;
    }
    size_t summary = 0;
    for (size_t i = 0; i < n; i++) {
        size_t v = value_len(tags[i]);
        summary += 1 + varint_len(v) + v;
    }
    put_key(e, 5, 2);
    put_varint(e, summary);
    for (size_t i = 0; i < n; i++) {
        float    f = (float)values[i];
        uint32_t fb;
        memcpy(&fb, &f, sizeof fb);
        put_key(e, 1, 2);
        put_varint(e, value_len(tags[i]));
        put_bytes(e, 1, tags[i], strlen(tags[i]));
        put_key(e, 2, 5);
        put_le(e, fb, 4);
    }
}

static double clock_now(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// Encodes one event into w->buf (growing it) and writes it as a record.
static ddl_status write_event(ddl_tb_writer *w, int64_t step, const char *version, size_t n,
                              const char *const *tags, const double *values)
{
    double     wall = clock_now(CLOCK_REALTIME);
    struct enc e    = {.p = w->buf, .cap = w->cap};
    encode_event(&e, wall, step, version, n, tags, values);
    if (e.n > w->cap) {
        uint8_t *nb = ddl_realloc(w->buf, e.n);
        DDL_REQUIRE(nb != NULL, DDL_ENOMEM, "tensorboard: out of memory for an event of %zu bytes",
                    e.n);
        w->buf = nb;
        w->cap = e.n;
        e      = (struct enc){.p = w->buf, .cap = w->cap};
        encode_event(&e, wall, step, version, n, tags, values);
    }
    uint8_t    head[12], tail[4];
    struct enc h = {.p = head, .cap = sizeof head}, t = {.p = tail, .cap = sizeof tail};
    put_le(&h, e.n, 8);
    put_le(&h, ddl_tb_masked_crc(head, 8), 4);
    put_le(&t, ddl_tb_masked_crc(e.p, e.n), 4);
    if (fwrite(head, 1, 12, w->f) != 12 || fwrite(e.p, 1, e.n, w->f) != e.n ||
        fwrite(tail, 1, 4, w->f) != 4) {
        return ddl_set_error(ddl__write_errno_status(errno), "tensorboard: cannot write %s: %s",
                             w->path, strerror(errno));
    }
    return DDL_OK;
}

ddl_status ddl_tb_open(const char *dir, ddl_tb_writer **out)
{
    DDL_REQUIRE(out != NULL, DDL_EINVAL, "tensorboard: NULL output");
    *out = NULL;
    DDL_REQUIRE(dir != NULL && dir[0] != '\0', DDL_EINVAL,
                "tensorboard: expected a directory, got an empty path");
    DDL_CHECK(ddl__mkdir_p(dir));
    ddl_tb_writer *w = ddl_calloc(1, sizeof *w);
    DDL_REQUIRE(w != NULL, DDL_ENOMEM, "tensorboard: out of memory");
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = '\0';
    ddl_status st = ddl__path_fmt(w->path, sizeof w->path, "%s/events.out.tfevents.%lld.%s.%d", dir,
                                  (long long)time(NULL), host, (int)getpid());
    if (st == DDL_OK) {
        w->f = fopen(w->path, "wb");
        if (w->f == NULL) {
            st = ddl_set_error(ddl__write_errno_status(errno), "tensorboard: cannot create %s: %s",
                               w->path, strerror(errno));
        }
    }
    if (st == DDL_OK) {
        st = write_event(w, 0, "brain.Event:2", 0, NULL, NULL);
    }
    if (st == DDL_OK) {
        st = ddl_tb_flush(w);
    }
    if (st != DDL_OK) {
        ddl_tb_close(w);
        return st;
    }
    *out = w;
    return DDL_OK;
}

ddl_status ddl_tb_scalars(ddl_tb_writer *w, int64_t step, size_t n, const char *const *tags,
                          const double *values)
{
    DDL_REQUIRE(w != NULL && (n == 0 || (tags != NULL && values != NULL)), DDL_EINVAL,
                "tensorboard: NULL writer, tags or values");
    return write_event(w, step, NULL, n, tags, values);
}

// The tags whose value is >= 0 (always the first), as one event.
static ddl_status some_scalars(ddl_tb_writer *w, int64_t step, size_t n, const char *const *tags,
                               const double *all)
{
    const char *t[8];
    double      v[8];
    size_t      k = 0;
    for (size_t i = 0; i < n && k < 8; i++) {
        if (i == 0 || all[i] >= 0) {
            t[k]   = tags[i];
            v[k++] = all[i];
        }
    }
    return ddl_tb_scalars(w, step, k, t, v);
}

ddl_status ddl_tb_train_step(ddl_tb_writer *w, int64_t step, double loss, double accuracy,
                             double mse, double images_per_s, double learning_rate)
{
    static const char *const tags[] = {"train/loss", "train/accuracy", "train/mse",
                                       "train/images_per_second", "train/learning_rate"};
    const double             v[]    = {loss, accuracy, mse, images_per_s, learning_rate};
    return some_scalars(w, step, 5, tags, v);
}

ddl_status ddl_tb_eval(ddl_tb_writer *w, int64_t step, double loss, double accuracy, double mse,
                       double rel_l2, double fg_iou)
{
    static const char *const tags[] = {"eval/loss", "eval/accuracy", "eval/mse", "eval/rel_l2",
                                       "eval/fg_iou"};
    const double             v[]    = {loss, accuracy, mse, rel_l2, fg_iou};
    return some_scalars(w, step, 5, tags, v);
}

ddl_status ddl_tb_flush(ddl_tb_writer *w)
{
    DDL_REQUIRE(w != NULL, DDL_EINVAL, "tensorboard: NULL writer");
    if (fflush(w->f) != 0) {
        return ddl_set_error(ddl__write_errno_status(errno), "tensorboard: cannot write %s: %s",
                             w->path, strerror(errno));
    }
    return DDL_OK;
}

ddl_status ddl_tb_flush_due(ddl_tb_writer *w, bool force)
{
    DDL_REQUIRE(w != NULL, DDL_EINVAL, "tensorboard: NULL writer");
    double now = clock_now(CLOCK_MONOTONIC);
    if (!force && now - w->flushed < 1.0) {
        return DDL_OK;
    }
    w->flushed = now;
    return ddl_tb_flush(w);
}

const char *ddl_tb_path(const ddl_tb_writer *w)
{
    return w != NULL ? w->path : "";
}

void ddl_tb_close(ddl_tb_writer *w)
{
    if (w == NULL) {
        return;
    }
    if (w->f != NULL) {
        fclose(w->f);
    }
    ddl_free(w->buf);
    ddl_free(w);
}
