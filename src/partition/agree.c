// partition/agree.c: status agreement over a communicator (ddl/agree.h).
//
// The lowest failing rank wins, so the message every rank reports is deterministic and
// names the first problem in rank order, whichever rank found it.
#include <stdio.h>
#include <string.h>

#include "ddl/agree.h"
#include "ddl/base.h"
#include "partition/mpi_check.h"

ddl_status ddl_agree(MPI_Comm comm, ddl_status st)
{
    int rank, size;
    DDL_CHECK_MPI(MPI_Comm_rank(comm, &rank));
    DDL_CHECK_MPI(MPI_Comm_size(comm, &size));
    int mine = st != DDL_OK ? rank : size, first = size;
    DDL_CHECK_MPI(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm));
    if (first == size) {
        return DDL_OK;
    }
    // [int code | message], sent by the lowest failing rank.
    char msg[sizeof(int) + DDL_AGREE_MSG_MAX];
    if (rank == first) {
        int code = (int)st;
        memcpy(msg, &code, sizeof code);
        snprintf(msg + sizeof code, DDL_AGREE_MSG_MAX, "%s", ddl_last_error());
    }
    DDL_CHECK_MPI(MPI_Bcast(msg, (int)sizeof msg, MPI_BYTE, first, comm));
    int code;
    memcpy(&code, msg, sizeof code);
    if (rank != first) {
        ddl_set_error((ddl_status)code, "%s", msg + sizeof code);
    }
    return (ddl_status)code;
}
