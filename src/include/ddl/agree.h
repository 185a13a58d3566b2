// ddl/agree.h: one answer to "did every rank succeed?", the same on every rank.
//
// A collective call validates its arguments locally and then agrees before its first
// communication, so that a failure on one rank fails every rank alike instead of leaving
// the others blocked in a collective (PETSc raises errors the same way on all ranks).
//
//   ddl_status st = validate_locally(...);     // no MPI
//   DDL_CHECK(ddl_agree(comm, st));            // every rank: same status, same message
//   ... collectives ...
#ifndef DDL_AGREE_H
#define DDL_AGREE_H

#include <mpi.h>

#include "ddl/status.h"

#ifdef __cplusplus
extern "C" {
#endif

// The longest error message that travels with an agreed failure (bytes, NUL included).
#define DDL_AGREE_MSG_MAX 1024

// Agrees on a status over comm: DDL_OK if every rank passed DDL_OK; otherwise the status
// and last-error message (ddl_last_error) of the lowest failing rank, returned and set
// as the last error on every rank. Collective over comm (one MPI_Allreduce when all
// succeed, plus one MPI_Bcast of the message otherwise); allocates nothing. DDL_EMPI if
// MPI itself fails.
DDL_EXTERN ddl_status ddl_agree(MPI_Comm comm, ddl_status st);

#ifdef __cplusplus
}
#endif
#endif // DDL_AGREE_H
