// ddl/sha256.h: file checksums (checkpoint shards). No MPI.
#ifndef DDL_SHA256_H
#define DDL_SHA256_H

#include <stddef.h>

#include "ddl/status.h"

#ifdef __cplusplus
extern "C" {
#endif

// SHA-256 of a file as 64 lowercase hex characters (+ NUL) into hex, streamed in 1 MiB
// reads. DDL_ENOTFOUND / DDL_EIO name the file.
DDL_EXTERN ddl_status ddl_sha256_file(const char *path, char hex[65]);
// SHA-256 of len bytes in memory (checkpoint manifests), as 64 lowercase hex + NUL.
DDL_EXTERN ddl_status ddl_sha256_buffer(const void *data, size_t len, char hex[65]);

#ifdef __cplusplus
}
#endif
#endif // DDL_SHA256_H
