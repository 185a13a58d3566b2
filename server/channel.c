// server/channel.c: the command channel's MPI error policy (channel.h).
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "channel.h"
#include "log.h"

static int  chan_rank = -1;
static long fail_at; // DDLD_TEST_CHANNEL_FAIL: this rank's checked call that fails (0: none)
static long calls;   // checked channel calls of this rank so far

void ddld_channel_init(MPI_Comm ctrl, int rank)
{
    chan_rank     = rank;
    const char *t = getenv("DDLD_TEST_CHANNEL_FAIL");
    int         r;
    long        n;
    if (t != NULL && sscanf(t, "%d:%ld", &r, &n) == 2 && r == rank && n > 0) {
        fail_at = n;
    }
    ddld_channel_check(MPI_Comm_set_errhandler(ctrl, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
}

void ddld_channel_check(int rc, const char *call)
{
    calls++;
    if (rc == MPI_SUCCESS && calls != fail_at) {
        return;
    }
    if (rc == MPI_SUCCESS) {
        rc = MPI_ERR_OTHER; // the injected failure
    }
    char msg[MPI_MAX_ERROR_STRING];
    int  len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) {
        snprintf(msg, sizeof msg, "MPI error %d", rc);
    }
    ddld_log("MPI error on the command channel: %s (rank %d): %s; ending the job (exit %d)", call,
             chan_rank, msg, DDLD_EXIT_MPI);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, DDLD_EXIT_MPI);
    _exit(DDLD_EXIT_MPI); // MPI_Abort does not return; should it, do not linger
}
