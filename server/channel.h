// server/channel.h: the MPI error policy of the command channel (dispatch.c's duplicate
// of MPI_COMM_WORLD, which carries every command header, the step-bytes reduction and
// the metrics gather). A leaf module: MPI and log.h only.
//
// The policy: the channel's communicator has MPI_ERRORS_RETURN, and every MPI call on it
// goes through ddld_channel_check. A failed call leaves the ranks out of step with no
// channel left to agree on anything, so it is unrecoverable for the collective daemon:
// the rank logs
//
//   distdld[R]: MPI error on the command channel: MPI_Ibcast (rank R): <MPI_Error_string>
//
// and calls MPI_Abort(MPI_COMM_WORLD, DDLD_EXIT_MPI); mpirun ends every rank and exits
// with that code. The engine's own communicators are the engine's business (it checks
// and agrees on its statuses); the watchdog's has its own fault path (watchdog.h).
#ifndef DDLD_CHANNEL_H
#define DDLD_CHANNEL_H

#include <mpi.h>

#include "exit_codes.h"

// Every rank, once, on the channel's communicator right after it is created: installs
// MPI_ERRORS_RETURN on it (checked) and reads the test-only DDLD_TEST_CHANNEL_FAIL.
void ddld_channel_init(MPI_Comm ctrl, int rank);

// The check after every channel call: returns when rc is MPI_SUCCESS, otherwise logs the
// call and MPI's message and ends the job with DDLD_EXIT_MPI (does not return).
//
// TEST ONLY (fault injection): with DDLD_TEST_CHANNEL_FAIL="RANK:N" in the environment
// (read once, by ddld_channel_init), the N-th checked channel call of rank RANK counts as
// failed with MPI_ERR_OTHER, as if MPI had returned it.
void ddld_channel_check(int rc, const char *call);

#endif // DDLD_CHANNEL_H
