// server/shared.c: the rank-0 snapshot ddld_g and the shutdown decision (shared.h).
#include <stdatomic.h>

#include "shared.h"

ddld_shared ddld_g = {
    .mu = PTHREAD_MUTEX_INITIALIZER, .state = "idle", .serving = true, .durable_step = -1};

static atomic_bool shutting_down;

void ddld_shared_mark_shutdown(void)
{
    atomic_store(&shutting_down, true);
    pthread_mutex_lock(&ddld_g.mu);
    ddld_g.serving = false;
    ddld_g.state   = "shutting_down";
    pthread_mutex_unlock(&ddld_g.mu);
}

bool ddld_shared_shutting_down(void)
{
    return atomic_load(&shutting_down);
}
