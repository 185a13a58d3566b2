// server/listen.c: listen addresses of the HTTP endpoints (listen.h).
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "listen.h"
#include "log.h"

int ddld_listen_parse(const char *s, struct sockaddr_storage *ss, socklen_t *len, char *err,
                      size_t errlen)
{
    char        host[64];
    const char *port;
    memset(ss, 0, sizeof *ss);
    if (s[0] == '[') {
        const char *rb = strchr(s, ']');
        if (rb == NULL || rb[1] != ':' || (size_t)(rb - s - 1) >= sizeof host) {
            snprintf(err, errlen, "expected [IPV6]:PORT");
            return -1;
        }
        memcpy(host, s + 1, (size_t)(rb - s - 1));
        host[rb - s - 1] = '\0';
        port             = rb + 2;
    } else {
        const char *colon = strrchr(s, ':');
        if (colon == NULL || (size_t)(colon - s) >= sizeof host) {
            snprintf(err, errlen, "expected HOST:PORT with a numeric address, e.g. 127.0.0.1:9090");
            return -1;
        }
        memcpy(host, s, (size_t)(colon - s));
        host[colon - s] = '\0';
        port            = colon + 1;
    }
    char *end;
    errno  = 0;
    long p = strtol(port, &end, 10);
    if (port[0] < '0' || port[0] > '9' || *end != '\0' || errno != 0 || p < 0 || p > 65535) {
        snprintf(err, errlen, "port \"%s\" is not a number in 0..65535", port);
        return -1;
    }
    struct sockaddr_in  *v4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)ss;
    if (s[0] != '[' && inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port   = htons((uint16_t)p);
        *len           = sizeof *v4;
    } else if (s[0] == '[' && inet_pton(AF_INET6, host, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port   = htons((uint16_t)p);
        *len            = sizeof *v6;
    } else {
        snprintf(err, errlen,
                 "\"%s\" is not a numeric IPv4 address (or a bracketed IPv6 one); names are "
                 "not resolved",
                 host);
        return -1;
    }
    return 0;
}

int ddld_listen_open(const char *flag, const char *addr, int *family, int *port)
{
    struct sockaddr_storage ss;
    socklen_t               len;
    char                    err[256];
    if (ddld_listen_parse(addr, &ss, &len, err, sizeof err) != 0) {
        ddld_log("%s %s: %s", flag, addr, err);
        return -1;
    }
    int fd  = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(fd, (struct sockaddr *)&ss, len) != 0 || listen(fd, 128) != 0) {
        ddld_log("%s %s: cannot listen: %s", flag, addr, strerror(errno));
        if (fd >= 0) {
            close(fd);
        }
        return -1;
    }
    struct sockaddr_storage bound;
    socklen_t               blen = sizeof bound;
    if (getsockname(fd, (struct sockaddr *)&bound, &blen) != 0) {
        ddld_log("%s %s: getsockname: %s", flag, addr, strerror(errno));
        close(fd);
        return -1;
    }
    *family = bound.ss_family;
    *port   = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                : ((struct sockaddr_in *)&bound)->sin_port);
    return fd;
}

int ddld_write_text(const char *flag, const char *path, const char *text)
{
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (f == NULL || fputs(text, f) < 0 || fflush(f) != 0 || fsync(fileno(f)) != 0) {
        ddld_log("%s %s: %s", flag, tmp, strerror(errno));
        if (f != NULL) {
            fclose(f);
        }
        unlink(tmp);
        return -1;
    }
    fclose(f);
    if (rename(tmp, path) != 0) {
        ddld_log("%s %s: %s", flag, path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

int ddld_write_address(const char *flag, const char *path, const char *addr, int port)
{
    char        text[128];
    const char *colon = strrchr(addr, ':');
    int         hl    = colon != NULL ? (int)(colon - addr) : (int)strlen(addr);
    snprintf(text, sizeof text, "%.*s:%d\n", hl, addr, port);
    return ddld_write_text(flag, path, text);
}

void ddld_mhd_log(void *cls, const char *fmt, va_list ap)
{
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n > 0 && msg[n - 1] == '\n') {
        msg[--n] = '\0';
    }
    ddld_log("%s: %s", (const char *)cls, msg);
}

int ddld_listen_check(const char *lflag, const char *listen, const char *fflag, const char *file,
                      char *err, size_t errlen)
{
    struct sockaddr_storage ss;
    socklen_t               len;
    char                    why[256];
    if (file != NULL && listen == NULL) {
        snprintf(err, errlen, "%s needs %s", fflag, lflag);
        return -1;
    }
    if (listen != NULL && ddld_listen_parse(listen, &ss, &len, why, sizeof why) != 0) {
        snprintf(err, errlen, "%s: bad value \"%s\": %s", lflag, listen, why);
        return -1;
    }
    return 0;
}
