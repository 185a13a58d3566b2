// primitives/traffic.h: internal: the per-process byte counters behind ddl_traffic_snapshot
// (ddl/primitives.h). Each primitive adds what one execution of forward or adjoint moved
// for this rank. Main thread only (MPI_THREAD_FUNNELED), so plain adds; allocates nothing.
#ifndef DDL_PRIMITIVES_TRAFFIC_H
#define DDL_PRIMITIVES_TRAFFIC_H

#include <stdint.h>

#include "ddl/primitives.h"

// One execution of `kind`'s `pass` on this rank: `sent` and `received` payload bytes.
void ddl__traffic_add(ddl_traffic_kind kind, ddl_traffic_pass pass, uint64_t sent,
                      uint64_t received);
// The clock of the time counters (seconds, monotonic), and the time since `since` added to
// `kind`'s `pass` (ddl_traffic_time_snapshot): each primitive's public forward and adjoint
// take the one at entry and call the other on return, whatever the status.
double ddl__traffic_clock(void);
void   ddl__traffic_time(ddl_traffic_kind kind, ddl_traffic_pass pass, double since);

// Returns the ddl_status of `call`, its wall time added to kind's pass: the body of every
// primitive's public forward and adjoint.
#define DDL_TRAFFIC_TIMED_RETURN(kind, pass, call)                                                 \
    do {                                                                                           \
        double     t0_ = ddl__traffic_clock();                                                     \
        ddl_status st_ = (call);                                                                   \
        ddl__traffic_time((kind), (pass), t0_);                                                    \
        return st_;                                                                                \
    } while (0)

#endif // DDL_PRIMITIVES_TRAFFIC_H
