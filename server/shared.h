// server/shared.h: the rank-0 snapshot the cq thread answers from (health, GetStatus, the
// KServe liveness and metadata calls), published by the main thread under its mutex, and
// the shutdown decision. Owned by shared.c; only service.c, dispatch.c, metrics.c and
// main.c include it (the distdld_core_deps check keeps ddld_g out of the other modules).
#ifndef DDLD_SHARED_H
#define DDLD_SHARED_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "distdl/v1/trainer.pb-c.h"
#include "model_info.h"

// ---- the rank-0 snapshot the cq thread answers from ------------------------------------

typedef struct ddld_shared {
    pthread_mutex_t mu;
    int             world_size;
    ddld_model_info info;      // replaced wholesale by the main thread
    uint64_t        model_gen; // bumps each time info is replaced
    int64_t         step, durable_step, epoch, batch;
    double          last_loss;
    const char     *state; // "idle", "training", "shutting_down"
    char            data_dir[1024];
    bool            serving; // health: SERVING until shutdown begins
    int64_t         dropped_calls; // queued calls dropped unrun (cancelled, past deadline)
    int64_t         step_bytes; // payload bytes a training step moves, over all ranks (0: none yet)
    // Submitted batches (SubmitBatch), oldest first: a ring of unpacked messages.
    Distdl__V1__Batch **batches;
    int                 batch_cap, batch_head, batch_count;
} ddld_shared;

extern ddld_shared ddld_g;

// Shutdown phase 0: the decision. GetStatus says "shutting_down" and health NOT_SERVING
// from now on, before any reply that announced the shutdown leaves. Any thread.
void ddld_shared_mark_shutdown(void);
// True once ddld_shared_mark_shutdown ran: a running Train stops at its step boundary.
// Any thread.
bool ddld_shared_shutting_down(void);

#endif // DDLD_SHARED_H
