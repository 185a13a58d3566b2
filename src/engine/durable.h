// engine/durable.h: internal helpers shared by checkpoint.c and safetensors.c, defined
// in durable.c: durable file writes (temp -> fsync -> rename -> fsync dir), and checks
// of named-tensor lists and their boxes. Status agreement is ddl_agree (ddl/agree.h).
#ifndef DDL_ENGINE_DURABLE_H
#define DDL_ENGINE_DURABLE_H

#include <mpi.h>
#include <stdbool.h>
#include <stdio.h>

#include "ddl/agree.h"
#include "ddl/checkpoint.h"

ddl_status ddl__path_fmt(char *out, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
ddl_status ddl__fsync_dir(const char *dir);
ddl_status ddl__mkdir_p(const char *dir);
ddl_status ddl__durable_open(const char *path, FILE **out);
ddl_status ddl__durable_commit(FILE *f, const char *path);
// The status of a failed write with errno err: DDL_ENOMEM ("resource exhausted": the
// caller sees RESOURCE_EXHAUSTED) for a full disk, a quota or a file-size limit (ENOSPC,
// EDQUOT, EFBIG), else DDL_EIO.
ddl_status ddl__write_errno_status(int err);
// Abandons a durable write after a failed write with errno err (closes f, removes the
// temporary file) and returns the error "<who>: cannot write <path>: <strerror>".
ddl_status ddl__durable_fail(FILE *f, const char *path, const char *who, int err);
void       ddl__durable_abort(FILE *f, const char *path);
ddl_status ddl__check_named(const char *who, int n, const ddl_named_tensor *t);
ddl_status ddl__check_same_list(MPI_Comm comm, const char *who, int n, const ddl_named_tensor *t,
                                int64_t extra);
ddl_status ddl__gather_box_table(MPI_Comm comm, int n, const ddl_named_tensor *t, ddl_box **table);
bool       ddl__boxes_tile(const ddl_shape *g, int nb, const ddl_box *boxes, size_t stride,
                           int *owner, char *why, size_t len);
// Volume of a shape, or -1 when it (or its f64 byte size) overflows int64.
int64_t    ddl__safe_numel(const ddl_shape *s);
char      *ddl__box_str(const ddl_box *b, char *buf, size_t len);


// The readers' parsers on their own, no MPI (the fuzz targets in tests/fuzz; the loaders
// call the same static functions). ddl__safetensors_parse: the header of the open file f
// (st_parse: validated entirely, then the n requested tensors checked against it, begin[i]
// receiving each one's file offset). ddl__checkpoint_manifest_check: manifest.json's text
// parsed and validated as every rank does it on load, then freed.
ddl_status ddl__safetensors_parse(const char *path, FILE *f, int n, const ddl_named_tensor *t,
                                  int64_t *begin);
ddl_status ddl__checkpoint_manifest_check(const char *file, const char *text, size_t len);

#endif // DDL_ENGINE_DURABLE_H
