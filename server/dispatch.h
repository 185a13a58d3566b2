// server/dispatch.h: the command path (dispatch.c). Rank 0's main thread validates each
// job the service queued and drives every rank through the same session call; ranks > 0
// run the worker loop. Dispatch uses the service to complete calls, never the reverse.
#ifndef DDLD_DISPATCH_H
#define DDLD_DISPATCH_H

#include <mpi.h>

#include "config.h"
#include "service.h"

typedef struct ddld_dispatch ddld_dispatch;

// Every rank: the dispatcher over a duplicate of world (the command channel) and the
// session (its own duplicate). cfg is borrowed for the daemon's lifetime.
// Collective on world: duplicates it as the command channel (MPI_ERRORS_RETURN, channel.h).
// Returns NULL on every rank, after a logged reason, when any rank is out of memory.
ddld_dispatch *ddld_dispatch_create(const ddld_config *cfg, MPI_Comm world);
void           ddld_dispatch_destroy(ddld_dispatch **d);

// Ranks > 0: receive and execute commands until QUIT; returns QUIT's exit code.
// Waits with a non-blocking broadcast polled with a growing sleep (idle is idle).
int ddld_dispatch_worker_loop(ddld_dispatch *d);

// Rank 0, main thread. `poll` runs between training steps (the libuv loop, NOWAIT). A Train
// stops at the step boundary once shutdown began (ddld_shared_shutting_down) or a Shutdown
// call is pending (ddld_service_shutdown_pending on svc).
void ddld_dispatch_set_hooks(ddld_dispatch *d, ddld_service *svc, void (*poll)(void *), void *ud);
// Start-up work: --model and --resume. Returns 0 or the exit code (2) after logging.
int ddld_dispatch_startup(ddld_dispatch *d);
// Validates and runs one job; completes its call; frees the job.
void ddld_dispatch_run(ddld_dispatch *d, ddld_job *job);
// Dynamic batching (the main loop, after taking in every queued job): runs the pending
// inference calls when their batch is due, or waits (sleeping in 20 us steps) until it is
// due or more jobs are queued. True: jobs are queued, take them in and call again; false:
// nothing is pending any more.
bool ddld_dispatch_batch_wait(ddld_dispatch *d);
// Runs whatever inference calls are pending now (before shutdown).
void ddld_dispatch_batch_run(ddld_dispatch *d);
// SIGUSR1: asks for a checkpoint into --checkpoint-dir; a running Train takes it at the
// next step boundary and goes on, otherwise the main loop runs it when the job ends.
void ddld_dispatch_request_checkpoint(ddld_dispatch *d);
// The timer's variant: only when steps were taken since the newest durable checkpoint.
void ddld_dispatch_request_checkpoint_if_stale(ddld_dispatch *d);
void ddld_dispatch_checkpoint_pending(ddld_dispatch *d);
// Final checkpoint at shutdown (when --checkpoint-dir is set and a model exists).
void ddld_dispatch_final_checkpoint(ddld_dispatch *d);
// Releases the workers: they leave their loop with `code`.
void ddld_dispatch_quit(ddld_dispatch *d, int code);

#endif // DDLD_DISPATCH_H
