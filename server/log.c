// server/log.c: the daemon's log lines and its monotonic clock (see log.h).
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include "ddl/base.h"
#include "log.h"

static int log_rank = -1;

void ddld_log_set_rank(int rank)
{
    log_rank = rank;
}

void ddld_log(const char *fmt, ...)
{
    char    msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (log_rank > 0) {
        fprintf(stderr, DDLD_LOG_PREFIX "[%d]: %s\n", log_rank, msg);
    } else {
        fprintf(stderr, DDLD_LOG_PREFIX ": %s\n", msg);
    }
}

static void engine_sink(ddl_log_level level, const char *msg, void *ud)
{
    (void)ud;
    if (level <= DDL_LOG_WARN) {
        ddld_log("%s: %s", level == DDL_LOG_ERROR ? "error" : "warning", msg);
    }
}

void ddld_log_engine_sink(void)
{
    ddl_log_set(engine_sink, NULL);
}

double ddld_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
