// tests/support/test_kit.c: the failure path shared by unit and MPI tests.
#include <mpi.h>

#include "test.h"

int ddl_test_rank = -1;

void ddl_test_fail(void)
{
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (inited && !finalized) {
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    exit(1);
}
