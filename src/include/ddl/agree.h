// ddl/agree.h: the one agreement on a status that ends every collective operation.
//
// A collective call may fail on one rank only: an allocation, a shard on a full disk, a
// shape check. If that rank returned at once, the others would wait forever in the next
// collective. Every collective operation therefore ends (and, where a step can fail
// locally before communicating, also pauses) with
//
//   st = ddl_agree(comm, st);   // same status and message on every rank of comm
//
// and returns st: either every rank goes on, or every rank fails with the same code and
// the message of the lowest failing rank.
#ifndef DDL_AGREE_H
#define DDL_AGREE_H

#include <mpi.h>
#include <stdint.h>

#include "ddl/status.h"

#ifdef __cplusplus
extern "C" {
#endif

// Agrees on a status over comm: DDL_OK if every rank passed DDL_OK, otherwise the status
// and the last-error message of the lowest failing rank, on every rank (the message is
// installed as each rank's ddl_last_error()). One MPI_Allreduce when all succeed, plus
// one MPI_Bcast of the message when some rank failed. With comm == MPI_COMM_NULL (a rank
// outside the group) it returns st unchanged. If MPI itself fails, DDL_EMPI (or this
// rank's own error, which takes precedence). Collective over comm.
DDL_EXTERN ddl_status ddl_agree(MPI_Comm comm, ddl_status st);

// Two forms that fold the agreement into a collective the caller makes anyway, so a
// step pays one synchronisation where it would pay two or three:
//
// ddl_agree_root: when only `root` can have failed (a check of what root alone holds; the
// other ranks must pass DDL_OK), root's status and the `n` bytes at `data` from root, on
// every rank: one MPI_Bcast when root succeeded, plus one of the message when it failed
// (data is then left as each rank had it). n <= DDL_AGREE_ROOT_MAX.
DDL_EXTERN ddl_status ddl_agree_root(MPI_Comm comm, int root, ddl_status st, void *data, int n);
#define DDL_AGREE_ROOT_MAX 64
// ddl_agree_sum: agrees on st (as ddl_agree) while summing the n doubles at v over comm in
// place: one MPI_Allreduce when every rank succeeded; when some rank failed, the agreement
// of ddl_agree follows and v is unspecified. n <= DDL_AGREE_SUM_MAX.
DDL_EXTERN ddl_status ddl_agree_sum(MPI_Comm comm, ddl_status st, double *v, int n);
#define DDL_AGREE_SUM_MAX 15

// How many agreements (ddl_agree, ddl_agree_root, ddl_agree_sum calls with a communicator)
// this process has made: a count of synchronisations for benches and tests.
DDL_EXTERN uint64_t ddl_agree_count(void);

// The maximum length of a message carried by ddl_agree (longer ones are truncated).
#define DDL_AGREE_MSG_MAX 1024

#ifdef __cplusplus
}
#endif
#endif // DDL_AGREE_H
