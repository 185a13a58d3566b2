// partition/agree.c: ddl_agree, the status agreement every collective operation ends
// with (ddl/agree.h). It lives in the partition module, the lowest one allowed to call
// MPI, so that primitives, layers and the engine all share it.
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "base/check.h"
#include "ddl/agree.h"

static _Atomic uint64_t agreements;

uint64_t ddl_agree_count(void)
{
    return atomic_load_explicit(&agreements, memory_order_relaxed);
}

static void counted(void)
{
    atomic_fetch_add_explicit(&agreements, 1, memory_order_relaxed);
}

// The message of a failed status from `from` to every rank of comm (installed as each
// other rank's last error); returns the status.
static ddl_status share_failure(MPI_Comm comm, int rank, int from, ddl_status st)
{
    char msg[sizeof(int) + DDL_AGREE_MSG_MAX];
    memset(msg, 0, sizeof msg);
    if (rank == from) {
        int code = (int)st;
        memcpy(msg, &code, sizeof code);
        snprintf(msg + sizeof code, DDL_AGREE_MSG_MAX, "%s", ddl_last_error());
    }
    if (MPI_Bcast(msg, (int)sizeof msg, MPI_BYTE, from, comm) != MPI_SUCCESS) {
        return st != DDL_OK ? st : ddl_set_error(DDL_EMPI, "agree: MPI_Bcast failed");
    }
    int code;
    memcpy(&code, msg, sizeof code);
    msg[sizeof msg - 1] = '\0';
    if (rank != from) {
        ddl_set_error((ddl_status)code, "%s", msg + sizeof code);
    }
    return (ddl_status)code;
}

ddl_status ddl_agree(MPI_Comm comm, ddl_status st)
{
    if (comm == MPI_COMM_NULL) {
        return st;
    }
    counted();
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
    return share_failure(comm, rank, first, st);
}

ddl_status ddl_agree_root(MPI_Comm comm, int root, ddl_status st, void *data, int n)
{
    if (comm == MPI_COMM_NULL) {
        return st;
    }
    counted();
    int rank;
    if (MPI_Comm_rank(comm, &rank) != MPI_SUCCESS) {
        return st != DDL_OK ? st : ddl_set_error(DDL_EMPI, "agree: invalid communicator");
    }
    DDL_ASSERT(rank == root || st == DDL_OK); // only root's check may fail
    // Root's code, then its data, in one broadcast.
    unsigned char buf[sizeof(int) + DDL_AGREE_ROOT_MAX];
    DDL_ASSERT(n >= 0 && n <= DDL_AGREE_ROOT_MAX);
    int code = (int)st;
    if (rank == root) {
        memcpy(buf, &code, sizeof code);
        memcpy(buf + sizeof code, data, (size_t)n);
    }
    if (MPI_Bcast(buf, (int)sizeof code + n, MPI_BYTE, root, comm) != MPI_SUCCESS) {
        return st != DDL_OK ? st : ddl_set_error(DDL_EMPI, "agree: MPI_Bcast failed");
    }
    memcpy(&code, buf, sizeof code);
    if (code == DDL_OK) {
        memcpy(data, buf + sizeof code, (size_t)n);
        return DDL_OK;
    }
    return share_failure(comm, rank, root, st != DDL_OK ? st : (ddl_status)code);
}

ddl_status ddl_agree_sum(MPI_Comm comm, ddl_status st, double *v, int n)
{
    if (comm == MPI_COMM_NULL) {
        return st;
    }
    counted();
    DDL_ASSERT(n >= 0 && n <= DDL_AGREE_SUM_MAX);
    // The sums and, last, the number of failing ranks: every rank sees the same count, so
    // either none or all take the full agreement below.
    double buf[DDL_AGREE_SUM_MAX + 1];
    memcpy(buf, v, sizeof(double) * (size_t)n);
    buf[n] = st != DDL_OK ? 1.0 : 0.0;
    if (MPI_Allreduce(MPI_IN_PLACE, buf, n + 1, MPI_DOUBLE, MPI_SUM, comm) != MPI_SUCCESS) {
        return st != DDL_OK ? st : ddl_set_error(DDL_EMPI, "agree: MPI_Allreduce failed");
    }
    if (buf[n] == 0.0) {
        memcpy(v, buf, sizeof(double) * (size_t)n);
        return DDL_OK;
    }
    return ddl_agree(comm, st);
}
