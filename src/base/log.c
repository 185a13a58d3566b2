// base/log.c: the engine's log sink; replaceable with ddl_log_set (as ggml_log_set).
#include <stdarg.h>
#include <stdio.h>

#include "ddl/base.h"

static ddl_log_cb log_cb;
static void      *log_ud;

void ddl_log_set(ddl_log_cb cb, void *user_data)
{
    log_cb = cb;
    log_ud = user_data;
}

void ddl_log(ddl_log_level level, const char *fmt, ...)
{
    char    msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (log_cb != NULL) {
        log_cb(level, msg, log_ud);
        return;
    }
    if (level <= DDL_LOG_WARN) {
        static const char *names[] = {"error", "warning"};
        fprintf(stderr, "ddl %s: %s\n", names[level], msg);
    }
}
