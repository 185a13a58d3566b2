// token.c: the client's token file, so the CLI (--token-file), the Python binding and
// programs read one format the same way (docs/CLIENT.md).
//
// The first line that is not blank or a comment (a field starting with '#') holds either
// the token alone or "ROLE TOKEN", a line copied from the daemon's --token-file. The token is
// 1 to 4096 visible ASCII characters. Like the daemon's file, it must not be accessible to
// other users (chmod 600).
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client_impl.h"

#define TOKEN_FILE_MAX (64 * 1024)

static ddl_status parse(const char *text, const char *path, char **out)
{
    const char *p = text;
    while (*p != '\0') {
        const char *eol   = strchr(p, '\n');
        const char *end   = eol ? eol : p + strlen(p);
        const char *f[3]  = {0};
        size_t      fl[3] = {0};
        int         nf    = 0;
        for (const char *q = p; q < end;) {
            if (*q == ' ' || *q == '\t' || *q == '\r') {
                q++;
                continue;
            }
            if (*q == '#')
                break;
            const char *s = q;
            while (q < end && *q != ' ' && *q != '\t' && *q != '\r')
                q++;
            if (nf < 3) {
                f[nf]  = s;
                fl[nf] = (size_t)(q - s);
            }
            nf++;
        }
        p = eol ? eol + 1 : end;
        if (nf == 0)
            continue;
        if (nf > 2)
            return ddl__local_error(DDL_EINVAL,
                                    "token file %s: expected \"TOKEN\" or \"ROLE TOKEN\" on the "
                                    "first line, found %d fields",
                                    path, nf);
        const char *t  = f[nf - 1];
        size_t      tl = fl[nf - 1];
        if (tl > 4096)
            return ddl__local_error(DDL_EINVAL, "token file %s: the token is longer than 4096",
                                    path);
        for (size_t i = 0; i < tl; i++) {
            unsigned char ch = (unsigned char)t[i];
            if (ch < 0x21 || ch > 0x7e)
                return ddl__local_error(DDL_EINVAL,
                                        "token file %s: the token has a character outside "
                                        "visible ASCII",
                                        path);
        }
        char *tok = malloc(tl + 1);
        if (!tok)
            return ddl__local_error(DDL_ENOMEM, "token file %s: out of memory", path);
        memcpy(tok, t, tl);
        tok[tl] = '\0';
        *out    = tok;
        return DDL_OK;
    }
    return ddl__local_error(DDL_EINVAL, "token file %s: no token in it", path);
}

ddl_status ddl_client_read_token_file(const char *path, char **token)
{
    if (!path || !token)
        return ddl__local_error(DDL_EINVAL, "read_token_file: path and token are required");
    *token = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ddl__local_error(DDL_EIO, "token file %s: cannot open: %s", path, strerror(errno));
    struct stat st;
    ddl_status  s   = DDL_OK;
    char       *buf = NULL;
    size_t      n   = 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        s = ddl__local_error(DDL_EINVAL, "token file %s: not a regular file", path);
    } else if (st.st_mode & S_IRWXO) {
        s = ddl__local_error(DDL_EINVAL,
                             "token file %s: accessible to other users (mode %04o): chmod 600 it",
                             path, (unsigned)(st.st_mode & 07777));
    } else if (st.st_size > TOKEN_FILE_MAX) {
        s = ddl__local_error(DDL_EINVAL, "token file %s: larger than %d bytes", path,
                             TOKEN_FILE_MAX);
    } else if (!(buf = malloc((size_t)st.st_size + 1))) {
        s = ddl__local_error(DDL_ENOMEM, "token file %s: out of memory", path);
    } else {
        while (n < (size_t)st.st_size) {
            ssize_t k = read(fd, buf + n, (size_t)st.st_size - n);
            if (k < 0 && errno == EINTR)
                continue;
            if (k <= 0)
                break;
            n += (size_t)k;
        }
        buf[n] = '\0';
        s      = parse(buf, path, token);
    }
    close(fd);
    if (buf) {
        memset(buf, 0, n);
        free(buf);
    }
    return s;
}

void ddl_client_free_token(char **token)
{
    if (token && *token) {
        memset(*token, 0, strlen(*token));
        free(*token);
        *token = NULL;
    }
}
