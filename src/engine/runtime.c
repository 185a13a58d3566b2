// engine/runtime.c: process-level set-up shared by the programs (distdl-train, the
// daemon, benchmarks).
#include <stdlib.h>
#include <unistd.h>

#include "ddl/kernels.h"
#include "ddl/model.h"

int ddl_runtime_divide_cores(MPI_Comm comm)
{
    // An explicit OPENBLAS_NUM_THREADS wins.
    const char *env = getenv("OPENBLAS_NUM_THREADS");
    if (env != NULL && atoi(env) >= 1) {
        return atoi(env);
    }
    MPI_Comm node;
    int      local = 1;
    if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
        MPI_Comm_size(node, &local);
        MPI_Comm_free(&node);
    }
    long cores   = sysconf(_SC_NPROCESSORS_ONLN);
    int  threads = cores > local ? (int)(cores / local) : 1;
    ddl_blas_set_threads(threads);
    return threads;
}
