// ddl/tbevents.h: TensorBoard event files (scalar summaries), written in TensorBoard's own
// format so that a TensorBoard elsewhere reads them as they are. No MPI: the daemon's rank 0
// and distdl-train write them.
//
// The format (TensorFlow's record_writer and event.proto / summary.proto):
//   a file named events.out.tfevents.<seconds>.<host>.<pid>, a sequence of records, each
//     uint64 length (little endian), uint32 masked CRC-32C of those 8 bytes,
//     length bytes of data, uint32 masked CRC-32C of the data,
//   where masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8 (mod 2^32);
//   each record an Event message: wall_time (1, double), step (2, int64) and either
//   file_version (3, string; the first record, "brain.Event:2") or summary (5, Summary:
//   repeated Value (1): tag (1, string), simple_value (2, float)).
#ifndef DDL_TBEVENTS_H
#define DDL_TBEVENTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddl/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ddl_tb_writer ddl_tb_writer;

// Creates dir (and its missing parents) if need be and opens a new event file in it, whose
// first record is the file_version event. DDL_EINVAL for an empty dir, DDL_EIO naming the
// path for a directory or file that cannot be made or written.
DDL_EXTERN ddl_status ddl_tb_open(const char *dir, ddl_tb_writer **out);
// One event at `step`, wall time now, with n scalars tags[i] = values[i] (written as
// float32, TensorBoard's simple_value). Buffered: ddl_tb_flush puts it in the file.
DDL_EXTERN ddl_status ddl_tb_scalars(ddl_tb_writer *w, int64_t step, size_t n,
                                     const char *const *tags, const double *values);
// The scalars distdld and distdl-train write. A training step: train/loss, train/accuracy
// and train/mse (each only when >= 0: what the model's targets have), train/images_per_second
// and train/learning_rate. An evaluation: eval/loss, and eval/accuracy, eval/mse,
// eval/rel_l2 and eval/fg_iou when >= 0.
DDL_EXTERN ddl_status ddl_tb_train_step(ddl_tb_writer *w, int64_t step, double loss,
                                        double accuracy, double mse, double images_per_s,
                                        double learning_rate);
DDL_EXTERN ddl_status ddl_tb_eval(ddl_tb_writer *w, int64_t step, double loss, double accuracy,
                                  double mse, double rel_l2, double fg_iou);
DDL_EXTERN ddl_status ddl_tb_flush(ddl_tb_writer *w);
// Flushes when `force`, or when a second has passed since the last flush (a live
// TensorBoard follows a long run; a step costs no write call).
DDL_EXTERN ddl_status ddl_tb_flush_due(ddl_tb_writer *w, bool force);
// The event file's path (for logs).
DDL_EXTERN const char *ddl_tb_path(const ddl_tb_writer *w);
// Flushes and closes; NULL is a no-op.
DDL_EXTERN void ddl_tb_close(ddl_tb_writer *w);

// CRC-32C (Castagnoli) of len bytes, and its TFRecord masking: exposed for tests.
DDL_EXTERN uint32_t ddl_crc32c(const void *data, size_t len);
DDL_EXTERN uint32_t ddl_tb_masked_crc(const void *data, size_t len);

#ifdef __cplusplus
}
#endif
#endif // DDL_TBEVENTS_H
