// io/sha256.c: SHA-256 of a file (checkpoint shard checksums), streamed through
// OpenSSL's EVP interface in 1 MiB reads so a shard of any size costs 1 MiB of memory.
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <openssl/evp.h>

#include "base/check.h"
#include "ddl/sha256.h"

#define SHA256_CHUNK ((size_t)1 << 20)

ddl_status ddl_sha256_file(const char *path, char hex[65])
{
    DDL_REQUIRE(path != NULL && hex != NULL, DDL_EINVAL, "sha256: NULL path or output");
    hex[0]  = '\0';
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return ddl_set_error(errno == ENOENT ? DDL_ENOTFOUND : DDL_EIO,
                             "sha256: cannot open %s: %s", path, strerror(errno));
    }
    unsigned char *buf = ddl_malloc(SHA256_CHUNK);
    EVP_MD_CTX    *ctx = EVP_MD_CTX_new();
    ddl_status     st  = DDL_OK;
    if (buf == NULL || ctx == NULL) {
        st = ddl_set_error(DDL_ENOMEM, "sha256: out of memory hashing %s", path);
        goto done;
    }
    if (EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) {
        st = ddl_set_error(DDL_EINTERNAL, "sha256: EVP_DigestInit_ex failed");
        goto done;
    }
    for (;;) {
        size_t got = fread(buf, 1, SHA256_CHUNK, f);
        if (got > 0 && EVP_DigestUpdate(ctx, buf, got) != 1) {
            st = ddl_set_error(DDL_EINTERNAL, "sha256: EVP_DigestUpdate failed");
            goto done;
        }
        if (got < SHA256_CHUNK) {
            break;
        }
    }
    if (ferror(f)) {
        st = ddl_set_error(DDL_EIO, "sha256: read error on %s: %s", path, strerror(errno));
        goto done;
    }
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int  len = 0;
    if (EVP_DigestFinal_ex(ctx, md, &len) != 1 || len != 32) {
        st = ddl_set_error(DDL_EINTERNAL, "sha256: EVP_DigestFinal_ex failed");
        goto done;
    }
    static const char digits[] = "0123456789abcdef";
    for (unsigned int i = 0; i < len; i++) {
        hex[2 * i]     = digits[md[i] >> 4];
        hex[2 * i + 1] = digits[md[i] & 0xf];
    }
    hex[64] = '\0';
done:
    EVP_MD_CTX_free(ctx);
    ddl_free(buf);
    fclose(f);
    return st;
}

ddl_status ddl_sha256_buffer(const void *data, size_t len, char hex[65])
{
    DDL_REQUIRE((data != NULL || len == 0) && hex != NULL, DDL_EINVAL,
                "sha256: NULL data or output");
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int  mdlen = 0;
    static const char empty[1];
    DDL_REQUIRE(EVP_Digest(len > 0 ? data : empty, len, md, &mdlen, EVP_sha256(), NULL) == 1 &&
                    mdlen == 32,
                DDL_EINTERNAL, "sha256: EVP_Digest failed");
    static const char digits[] = "0123456789abcdef";
    for (unsigned int i = 0; i < mdlen; i++) {
        hex[2 * i]     = digits[md[i] >> 4];
        hex[2 * i + 1] = digits[md[i] & 0xf];
    }
    hex[64] = '\0';
    return DDL_OK;
}
