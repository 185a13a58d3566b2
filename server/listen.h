// server/listen.h: the HTTP endpoints' listen addresses (--metrics-listen, --http-listen):
// parsing HOST:PORT, binding our own listening socket (so a busy port is reported with its
// errno and the port chosen for :0 is known before anyone is told), and the address files
// written once serving. A leaf: libc and log.h only.
#ifndef DDLD_LISTEN_H
#define DDLD_LISTEN_H

#include <stdarg.h>
#include <stddef.h>
#include <sys/socket.h>

// Splits and parses HOST:PORT (a numeric IPv4 address or a bracketed IPv6 one, a port in
// 0..65535) into ss. Pure: every rank reaches the same verdict. Returns 0, or -1 with the
// problem in err.
int ddld_listen_parse(const char *s, struct sockaddr_storage *ss, socklen_t *len, char *err,
                      size_t errlen);
// Checks a listen option and its address-file option: the address parses, and the file
// comes with the address. Pure. Returns 0, or -1 with "<flag>: bad value ..." in err.
int ddld_listen_check(const char *lflag, const char *listen, const char *fflag, const char *file,
                      char *err, size_t errlen);
// Binds and listens on addr (non-blocking, close-on-exec); *family and *port receive what
// was bound. Returns the socket, or -1 after logging "<flag> <addr>: ..." .
int ddld_listen_open(const char *flag, const char *addr, int *family, int *port);
// Writes text to path through a temp file (fsync'd) renamed into place, so a reader never
// sees half of it. Returns 0, or -1 after logging "<flag> <path>: ...".
int ddld_write_text(const char *flag, const char *path, const char *text);
// Writes "host:port\n" (the host as given in addr) to path through a temp file renamed
// into place, so a reader never sees half of it. Returns 0, or -1 after logging.
int ddld_write_address(const char *flag, const char *path, const char *addr, int port);

// libmicrohttpd's MHD_OPTION_EXTERNAL_LOGGER for both endpoints: its message through
// ddld_log, prefixed with cls (a string: "metrics", "http").
void ddld_mhd_log(void *cls, const char *fmt, va_list ap);

#endif // DDLD_LISTEN_H
