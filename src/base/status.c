// base/status.c: status names, descriptions and the per-thread error message.
#include <stdarg.h>
#include <stdio.h>

#include "ddl/base.h"

static _Thread_local char last_error[1024];

const char *ddl_strerror(ddl_status s)
{
    switch (s) {
    case DDL_OK:
        return "success";
#define XX(code, val, msg) \
    case DDL_##code:       \
        return msg;
        DDL_STATUS_MAP(XX)
#undef XX
    }
    return "unknown status";
}

const char *ddl_status_name(ddl_status s)
{
    switch (s) {
    case DDL_OK:
        return "DDL_OK";
#define XX(code, val, msg) \
    case DDL_##code:       \
        return "DDL_" #code;
        DDL_STATUS_MAP(XX)
#undef XX
    }
    return "DDL_UNKNOWN";
}

const char *ddl_last_error(void)
{
    return last_error;
}

void ddl_clear_error(void)
{
    last_error[0] = '\0';
}

ddl_status ddl_set_error(ddl_status code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return code;
}
