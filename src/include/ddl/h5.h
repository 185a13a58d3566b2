// ddl/h5.h: HDF5 datasets read in parallel (parallel HDF5 over MPI-IO), each rank only
// its own box of each sample, straight into its partition's buffers: no rank reads a
// whole sample for another.
//
// A dataset file holds an input dataset "x" [N, sample...] and a target dataset "y" [N,
// target...] of floating-point values (float32 or float64 in the file; HDF5 converts to
// the model's dtype). A file with groups "train" and "test", each holding its x and y,
// has two splits; a file with x and y at its root serves both splits from them. Every
// read is collective over the communicator the file was opened on, one H5Dread per
// sample row of the batch (collective I/O), so every rank takes part in each whatever
// box it holds (an empty box selects nothing).
#ifndef DDL_H5_H
#define DDL_H5_H

#include <mpi.h>
#include <stdint.h>

#include "ddl/status.h"
#include "ddl/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ddl_h5 ddl_h5;

// What the model reads, per sample (without N): the input's shape and the targets'.
typedef struct ddl_h5_expect {
    ddl_shape x, y;
} ddl_h5_expect;

// Opens `path` read-only on every rank of comm (the same path on each) and checks both
// splits before returning: each of x and y exists, is a floating-point dataset of rank
// 1 + the sample's, with the expected sample dimensions, and x and y hold the same N >= 1.
// Every failure is an error naming the file, the dataset and expected versus got
// (DDL_ENOTFOUND: no such file; DDL_EPROTO: not HDF5, or a dataset that does not fit;
// DDL_ECORRUPT: a damaged or truncated file; DDL_EIO: no parallel HDF5), agreed by every rank
// (ddl_agree), also when only one rank fails. Collective. The caller owns *out (ddl_h5_close, also
// collective).
DDL_EXTERN ddl_status ddl_h5_open(MPI_Comm comm, const char *path, const ddl_h5_expect *e,
                                  ddl_h5 **out);
// Collective; NULL-safe (every rank passes its handle or NULL alike).
DDL_EXTERN void ddl_h5_close(ddl_h5 **h);
// N of a split (0: train, 1: test).
DDL_EXTERN int64_t ddl_h5_count(const ddl_h5 *h, int split);

// Reads this rank's box of a batch from dataset `which` (0: x, 1: y) of `split`: box is
// in the coordinates of the batch tensor [rows, sample...]; batch row b (box.start[0] <=
// b < box.stop[0]) is sample idx[b] of the split when b < count, zero otherwise. dst is
// the box, row-major, in dtype dt. Every rank takes part in rows H5Dread calls whatever
// its box; a rank that fails goes on selecting nothing, so none is left waiting, and the
// status is agreed at the end (ddl_agree). Values are checked finite on the rank that
// reads them. Allocates nothing. Collective.
DDL_EXTERN ddl_status ddl_h5_read(ddl_h5 *h, int split, int which, const int64_t *idx,
                                  int64_t count, int64_t rows, const ddl_box *box, ddl_dtype dt,
                                  void *dst);
// Payload bytes this rank has read from the file since it was opened (selected elements
// times their size in the file): what the test of per-rank ingest compares with the box.
DDL_EXTERN uint64_t ddl_h5_bytes_read(const ddl_h5 *h);

#ifdef __cplusplus
}
#endif
#endif // DDL_H5_H
