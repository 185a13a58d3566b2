// engine/runtime.c: process-level set-up shared by the programs (distdl-train, the
// daemon, benchmarks).
#define _GNU_SOURCE
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

#include "ddl/kernels.h"
#include "ddl/model.h"

int ddl_runtime_divide_cores(MPI_Comm comm)
{
    // An explicit OPENBLAS_NUM_THREADS wins. It sizes the kernel pool, as any count
    // given to ddl_blas_set_threads does: OpenBLAS itself stays single-threaded (see
    // kernels/gemm.c), so that the pool is the one owner of this rank's threads.
    const char *env = getenv("OPENBLAS_NUM_THREADS");
    if (env != NULL && atoi(env) >= 1) {
        ddl_blas_set_threads(atoi(env));
        return atoi(env);
    }
    MPI_Comm node;
    int      local = 1;
    if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
        MPI_Comm_size(node, &local);
        MPI_Comm_free(&node);
    }
    // The CPUs this rank may run on: mpirun binds ranks to cores by default, and threads
    // beyond the affinity mask would only share those cores.
    long      cores = sysconf(_SC_NPROCESSORS_ONLN);
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) >= 1) {
        int mask = CPU_COUNT(&set);
        // A rank bound to a subset of the node uses that subset; an unbound rank shares
        // the node's cores with its node-local peers.
        cores = mask < cores ? mask : cores / local;
        local = 1;
    }
    int threads = cores > local ? (int)(cores / local) : 1;
    ddl_blas_set_threads(threads);
    return threads;
}
