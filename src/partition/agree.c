// partition/agree.c: ddl_agree, the status agreement every collective operation ends
// with (ddl/agree.h). It lives in the partition module, the lowest one allowed to call
// MPI, so that primitives, layers and the engine all share it.
#include <stdio.h>
#include <string.h>

#include "base/check.h"
#include "ddl/agree.h"

ddl_status ddl_agree(MPI_Comm comm, ddl_status st)
{
    if (comm == MPI_COMM_NULL) {
        return st;
    }
    int rank, size;
    if (MPI_Comm_rank(comm, &rank) != MPI_SUCCESS || MPI_Comm_size(comm, &size) != MPI_SUCCESS) {
        return st != DDL_OK ? st : ddl_set_error(DDL_EMPI, "agree: invalid communicator");
    }
    // The lowest failing rank, or size when every rank succeeded.
    int mine = st != DDL_OK ? rank : size, first = size;
    if (MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm) != MPI_SUCCESS) {
        return st != DDL_OK ? st : ddl_set_error(DDL_EMPI, "agree: MPI_Allreduce failed");
    }
    if (first == size) {
        return DDL_OK;
    }
    // The first failing rank sends its code and message; everyone installs them.
    char msg[sizeof(int) + DDL_AGREE_MSG_MAX];
    memset(msg, 0, sizeof msg);
    if (rank == first) {
        int code = (int)st;
        memcpy(msg, &code, sizeof code);
        snprintf(msg + sizeof code, DDL_AGREE_MSG_MAX, "%s", ddl_last_error());
    }
    if (MPI_Bcast(msg, (int)sizeof msg, MPI_BYTE, first, comm) != MPI_SUCCESS) {
        return st != DDL_OK ? st : ddl_set_error(DDL_EMPI, "agree: MPI_Bcast failed");
    }
    int code;
    memcpy(&code, msg, sizeof code);
    msg[sizeof msg - 1] = '\0';
    if (rank != first) {
        ddl_set_error((ddl_status)code, "%s", msg + sizeof code);
    }
    return (ddl_status)code;
}
