// server/session_stub.c: TEMPORARY stand-in for the engine session (ddl/session.h) until the
// session branch lands, so distdld links and serves CreateModel/Step/Predict/GetStatus on
// top of ddl_model_*. It is linked after ddl::engine: once the engine defines the session,
// the linker never pulls this in. Remove it when `session` is merged.
#include <stdlib.h>
#include <string.h>

#include "ddl/base.h"
#include "ddl/session.h"

struct ddl_session {
    ddl_model_t *m;
    int          rank;
};

ddl_status ddl_agree(MPI_Comm comm, ddl_status st)
{
    int v = (int)st, min = 0;
    MPI_Allreduce(&v, &min, 1, MPI_INT, MPI_MIN, comm);
    return (ddl_status)min;
}

ddl_status ddl_session_create(MPI_Comm comm, const char *spec_text, const char *source,
                              const ddl_session_options *opts, ddl_session_t **out)
{
    (void)opts;
    int rank;
    MPI_Comm_rank(comm, &rank);
    long n = rank == 0 ? (long)strlen(spec_text) : 0;
    MPI_Bcast(&n, 1, MPI_LONG, 0, comm);
    char *text = malloc((size_t)n + 1);
    if (rank == 0) {
        memcpy(text, spec_text, (size_t)n + 1);
    }
    MPI_Bcast(text, (int)n + 1, MPI_CHAR, 0, comm);
    int size;
    MPI_Comm_size(comm, &size);
    ddl_spec_t *spec = NULL;
    ddl_status  st = ddl_agree(comm, ddl_spec_parse(text, source, size, &spec));
    free(text);
    ddl_model_t *m = NULL;
    if (st == DDL_OK) {
        st = ddl_agree(comm, ddl_model_create(comm, spec, &m));
    }
    ddl_spec_destroy(&spec);
    if (st != DDL_OK) {
        ddl_model_destroy(&m);
        return st;
    }
    ddl_session_t *s = calloc(1, sizeof *s);
    s->m = m;
    s->rank = rank;
    *out = s;
    return DDL_OK;
}

void ddl_session_destroy(ddl_session_t **s)
{
    if (*s != NULL) {
        ddl_model_destroy(&(*s)->m);
        free(*s);
        *s = NULL;
    }
}

ddl_model_t *ddl_session_model(const ddl_session_t *s) { return s->m; }
ddl_status   ddl_session_open_data(ddl_session_t *s, const char *dir)
{
    (void)s;
    (void)dir;
    return ddl_set_error(DDL_EINTERNAL, "session stub: datasets need the session branch");
}
bool       ddl_session_has_data(const ddl_session_t *s) { (void)s; return false; }
ddl_cursor ddl_session_cursor(const ddl_session_t *s) { (void)s; return (ddl_cursor){0, 0}; }
int64_t    ddl_session_steps_per_epoch(const ddl_session_t *s) { (void)s; return 0; }
ddl_status ddl_session_train(ddl_session_t *s, const ddl_train_request *req, ddl_progress_cb cb,
                             void *ud, ddl_train_result *out)
{
    (void)s; (void)req; (void)cb; (void)ud; (void)out;
    return ddl_set_error(DDL_EINTERNAL, "session stub: Train needs the session branch");
}
ddl_status ddl_session_step(ddl_session_t *s, const void *x, size_t x_bytes, const int64_t *labels,
                            int64_t count, ddl_step_result *out)
{
    (void)x_bytes;
    (void)count;
    double  loss = 0;
    int64_t correct = 0;
    MPI_Comm comm = ddl_model_comm(s->m);
    ddl_status st = ddl_agree(comm, ddl_model_train_step(s->m, x, labels, &loss, &correct));
    if (st == DDL_OK) {
        out->step = ddl_model_step(s->m);
        out->loss = loss;
        out->accuracy = (double)correct / (double)ddl_spec_batch_size(ddl_model_spec(s->m));
        out->durable = false;
    }
    return st;
}
ddl_status ddl_session_evaluate(ddl_session_t *s, ddl_split split, ddl_eval_result *out)
{
    (void)s; (void)split; (void)out;
    return ddl_set_error(DDL_EINTERNAL, "session stub: Evaluate needs the session branch");
}
ddl_status ddl_session_evaluate_batch(ddl_session_t *s, const void *x, size_t x_bytes,
                                      const int64_t *labels, int64_t count, ddl_eval_result *out)
{
    (void)s; (void)x; (void)x_bytes; (void)labels; (void)count; (void)out;
    return ddl_set_error(DDL_EINTERNAL, "session stub: Evaluate needs the session branch");
}
ddl_status ddl_session_predict(ddl_session_t *s, const void *x, size_t x_bytes, int64_t count,
                               void *logits, size_t logits_bytes)
{
    (void)x_bytes;
    (void)logits_bytes;
    int64_t b = ddl_spec_batch_size(ddl_model_spec(s->m));
    if (count > b) {
        return ddl_set_error(DDL_EINVAL, "session stub: at most %lld samples", (long long)b);
    }
    return ddl_agree(ddl_model_comm(s->m), ddl_model_predict(s->m, x, count, logits));
}
ddl_status ddl_session_save(ddl_session_t *s, const char *dir, int64_t *step)
{
    ddl_status st = ddl_agree(ddl_model_comm(s->m), ddl_model_save(s->m, dir, NULL));
    *step = ddl_model_step(s->m);
    return st;
}
ddl_status ddl_session_restore(ddl_session_t *s, const char *path, int64_t step)
{
    (void)step;
    char *u = NULL;
    ddl_status st = ddl_agree(ddl_model_comm(s->m), ddl_model_load(s->m, path, &u));
    ddl_free(u);
    return st;
}
int64_t ddl_session_durable_step(const ddl_session_t *s) { (void)s; return -1; }
int     ddl_session_nweights(const ddl_session_t *s) { return ddl_model_nparams(s->m); }
const char *ddl_session_weight_name(const ddl_session_t *s, int i)
{
    return ddl_model_param_name(s->m, i);
}
const ddl_shape *ddl_session_weight_shape(const ddl_session_t *s, int i)
{
    return &ddl_model_param(s->m, i)->global;
}
ddl_dtype ddl_session_weight_dtype(const ddl_session_t *s, int i)
{
    (void)i;
    return ddl_spec_dtype(ddl_model_spec(s->m));
}
ddl_status ddl_session_gather_weight(ddl_session_t *s, int i, void *buf)
{
    (void)s; (void)i; (void)buf;
    return ddl_set_error(DDL_EINTERNAL, "session stub: PullWeights needs the session branch");
}
ddl_status ddl_session_scatter_weights(ddl_session_t *s, const void *const *bufs)
{
    (void)s; (void)bufs;
    return ddl_set_error(DDL_EINTERNAL, "session stub: PushWeights needs the session branch");
}
