// server/watchdog.h: the rank watchdog of distdld (issue 9: rank faults).
//
// Every rank runs one heartbeat thread on its own duplicate of MPI_COMM_WORLD, so it needs
// MPI_THREAD_MULTIPLE. Ranks > 0 and rank 0 exchange a 4-byte heartbeat every period; rank
// 0 judges every other rank and rank 1 judges rank 0. When a rank has been silent for
// longer than the timeout (stopped with SIGSTOP, hung in the kernel, swapped out), its
// judge logs
//
//   distdld: rank R (host H, pid P) has not answered for S s (stopped or hung); ending the job
//
// tells every other rank to exit and calls MPI_Abort (the job ends with exit code
// DDLD_EXIT_RANK_FAULT; gRPC clients of rank 0 see UNAVAILABLE when its connections
// close). The threads beat independently of the main threads, so a long step or a long
// idle time never trips it; a rank that is stopped while busy or while idle does. A judge
// that was itself stopped restarts its clocks rather than name a healthy rank.
//
// Shutdown is collective and leaves nothing unmatched: each worker's thread sends BYE
// after its command loop ended, rank 0 answers BYE after its last heartbeat to that rank,
// and rank 0's thread ends once it has every BYE (messages between two ranks arrive in
// order). Nothing is allocated per heartbeat.
#ifndef DDLD_WATCHDOG_H
#define DDLD_WATCHDOG_H

#include <mpi.h>

#include "exit_codes.h" // DDLD_EXIT_RANK_FAULT: mpirun's exit code when the watchdog ended the job

typedef struct ddld_watchdog ddld_watchdog;

// Collective on world. timeout_s 0: no watchdog (returns NULL, no communicator, no
// thread). Otherwise duplicates world, gathers each rank's host and pid on rank 0 and
// starts the thread; heartbeats go out every min(1 s, timeout_s / 3). Returns NULL with a
// logged reason when the thread cannot start (on that rank: the caller must not go on).
ddld_watchdog *ddld_watchdog_start(MPI_Comm world, double timeout_s);

// Collective on the watchdog's ranks, after the command loop ended: stops and joins the
// thread (rank 0 waits for every worker's BYE, still watching), frees the communicator.
// NULL-safe; sets *w to NULL.
void ddld_watchdog_stop(ddld_watchdog **w);

#endif // DDLD_WATCHDOG_H
