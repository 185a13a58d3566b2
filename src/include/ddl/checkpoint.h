// ddl/checkpoint.h: durable, verifiable, reshardable checkpoints of distributed state,
// and global (unsharded) weight export/import as safetensors and .npy.
//
// The state is a list of named distributed tensors: each rank holds one box of each
// global tensor (parameters, optimizer moments, ...). A checkpoint of step S is a
// directory <dir>/step-<S, 9 digits>/ holding one shard file per rank and a manifest
// (JSON: format version, world size, step, the model spec text, user metadata such as
// optimizer settings, RNG state and data cursor, every tensor's name, dtype, global
// shape and per-rank box, and the SHA-256 of every shard file), itself covered by
// manifest.sha256 (the SHA-256 of manifest.json). <dir>/latest names the
// newest complete checkpoint. Every file is written temp -> fsync -> rename -> fsync
// directory, the manifest last and `latest` after it, so a crash at any moment leaves
// `latest` on a complete checkpoint.
//
// Loading verifies the manifest's checksum, every manifest field's type and range (counts
// are checked against the world size before anything is allocated for them) and every
// shard's checksum, and refuses a corrupt, truncated or missing file with DDL_ECORRUPT
// and a message naming the file. It works
// onto any world size and partitioning: the boxes requested by the caller may differ
// from the boxes written (each rank reads the parts of the written boxes that its own
// boxes need, straight from the shard files).
// The boxes of one tensor over the ranks must tile its global shape: identical boxes on
// several ranks are replicas, distinct boxes are disjoint, and together they cover every
// element (ranks holding none of it pass an empty box).
// All functions are collective over `comm`; every rank returns the same status, with the
// message of the lowest failing rank. The file formats are described in
// src/engine/checkpoint.c and src/engine/safetensors.c.
#ifndef DDL_CHECKPOINT_H
#define DDL_CHECKPOINT_H

#include <mpi.h>
#include <stdint.h>

#include "ddl/sha256.h"
#include "ddl/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DDL_CHECKPOINT_FORMAT_VERSION 1

// One named distributed tensor: this rank's box of a global tensor, stored in `local`
// (shape = box shape; zero-volume box on ranks that hold none of it).
typedef struct ddl_named_tensor {
    const char   *name;
    ddl_shape     global;
    ddl_box       box;
    ddl_tensor_t *local;
} ddl_named_tensor;

typedef struct ddl_checkpoint_meta {
    int64_t     step;
    const char *spec_json;  // the model spec the state belongs to (stored verbatim)
    const char *user_json;  // a JSON object of caller state (optimizer, RNG, data cursor)
} ddl_checkpoint_meta;

// Writes the checkpoint of meta->step (>= 0) under dir (created if missing) and moves
// `latest` to it once it is durable. On return with DDL_OK the checkpoint is complete on
// disk. Every rank passes the same tensor names, dtypes and global shapes in the same
// order and the same step; rank 0's spec_json (NULL: "") and user_json (NULL: {}; else
// must be a JSON object) are stored. Saving a step that exists replaces it atomically;
// `latest` names the step saved last. On failure `latest` is untouched (DDL_EINVAL for
// bad arguments or a layout that does not tile, DDL_EIO for file system errors).
DDL_EXTERN ddl_status ddl_checkpoint_save(MPI_Comm comm, const char *dir,
                                          const ddl_checkpoint_meta *meta, int n,
                                          const ddl_named_tensor *tensors);
// Resolves `path` (a checkpoint root with a `latest` file, or a step directory), verifies
// it and fills every requested tensor's local box. Tensors are matched by name (any
// subset of the checkpoint's, possibly different per rank); a missing name or a global
// shape/dtype mismatch is DDL_EINVAL naming it. A root without `latest` (deleted, or
// lost) but with step-<S> directories loads the newest step directory whose manifest
// verifies against its manifest.sha256, and logs a warning naming it (as a user
// resuming a run expects; silently starting from step 0 would redo the whole run). A
// path with neither `latest`, manifest.json nor such a step directory is DDL_ENOTFOUND.
// A manifest without manifest.sha256 (or not matching it) is DDL_ECORRUPT. On success
// *spec_json and *user_json (compact JSON) (if not NULL) receive ddl_malloc'd copies (free with ddl_free) and *step the step.
// Nothing is written into the tensors or the outputs unless everything verifies.
DDL_EXTERN ddl_status ddl_checkpoint_load(MPI_Comm comm, const char *path, int n,
                                          const ddl_named_tensor *tensors, int64_t *step,
                                          char **spec_json, char **user_json);

// Gathers every tensor onto rank 0 (one at a time) and writes one safetensors file
// (dtype F32/F64, little-endian, C order, with "__metadata__" from metadata_json if not
// NULL: a JSON object of strings, else DDL_EINVAL), temp -> fsync -> rename.
DDL_EXTERN ddl_status ddl_export_safetensors(MPI_Comm comm, const char *path, int n,
                                             const ddl_named_tensor *tensors,
                                             const char *metadata_json);
// Rank 0 reads a safetensors file, checks each requested name's shape and dtype, and
// scatters the boxes. Unknown or missing names are DDL_EINVAL naming them; a malformed
// file (header length, JSON, dtypes, offsets) is DDL_EPROTO naming the file. Entries not
// requested are validated and ignored. Nothing is written unless every tensor arrived.
DDL_EXTERN ddl_status ddl_import_safetensors(MPI_Comm comm, const char *path, int n,
                                             const ddl_named_tensor *tensors);
// One <dir>/<name>.npy per tensor (global; names must not contain '/'), and the reverse
// (a missing file or a shape/dtype mismatch is DDL_EINVAL naming the tensor).
DDL_EXTERN ddl_status ddl_export_npy_dir(MPI_Comm comm, const char *dir, int n,
                                         const ddl_named_tensor *tensors);
DDL_EXTERN ddl_status ddl_import_npy_dir(MPI_Comm comm, const char *dir, int n,
                                         const ddl_named_tensor *tensors);


#ifdef __cplusplus
}
#endif
#endif // DDL_CHECKPOINT_H
