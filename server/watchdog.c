// server/watchdog.c: heartbeats from every rank to rank 0, and rank 0's verdict on a rank
// that stopped answering (see watchdog.h for the contract).
//
// Messages on the watchdog's own communicator, one MPI_INT each:
//   BEAT  rank r -> 0   every period while r's thread runs
//   BYE   rank r -> 0   once, when r's command loop ended (r sends nothing after it)
//   ABORT 0 -> rank r   the job ends; the value names the silent rank
// Worker threads wait on a condition variable between beats (so a stop is immediate) and
// test their pending ABORT receive every 250 ms; rank 0's thread drains the heartbeats and
// checks every rank's silence every 100 ms. Both only ever touch preallocated buffers.
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ddld.h"
#include "watchdog.h"

enum { TAG_BEAT = 1, TAG_BYE = 2, TAG_ABORT = 3 };

#define WORKER_POLL_S 0.25 // a worker notices rank 0's ABORT within this
#define ROOT_POLL_S 0.1    // rank 0 checks the silences this often

struct hello {
    int32_t pid;
    char    host[60];
};

struct peer {
    double       last; // when its last message arrived (ddld_now)
    bool         bye;
    MPI_Request  abort_req;
};

struct ddld_watchdog {
    MPI_Comm        comm;
    int             rank, size;
    double          timeout_s, period_s;
    pthread_t       thread;
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    bool            stop; // under mu: the worker's command loop ended
    // the message buffers (never reallocated)
    int32_t beat, rx, abort_in, fault_rank;
    // rank 0: one entry per rank
    struct peer  *peers;
    struct hello *who;
};

// Waits until `deadline` (ddld_now seconds) or a stop; returns the stop flag.
static bool nap_until(ddld_watchdog *w, double deadline)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double wait = deadline - ddld_now();
    if (wait < 0) {
        wait = 0;
    }
    ts.tv_sec += (time_t)wait;
    ts.tv_nsec += (long)((wait - (double)(time_t)wait) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&w->mu);
    while (!w->stop) {
        if (pthread_cond_timedwait(&w->cv, &w->mu, &ts) == ETIMEDOUT) {
            break;
        }
    }
    bool stop = w->stop;
    pthread_mutex_unlock(&w->mu);
    return stop;
}

// ---- ranks > 0 ------------------------------------------------------------------------------

static void *beat_main(void *arg)
{
    ddld_watchdog *w = arg;
    MPI_Request    abort_req, send_req = MPI_REQUEST_NULL;
    MPI_Irecv(&w->abort_in, 1, MPI_INT, 0, TAG_ABORT, w->comm, &abort_req);
    double next_beat = ddld_now();
    for (;;) {
        double now = ddld_now();
        if (now >= next_beat) {
            int sent = 1;
            MPI_Test(&send_req, &sent, MPI_STATUS_IGNORE);
            if (sent) { // else rank 0 is not taking them: no queue of beats behind it
                MPI_Isend(&w->beat, 1, MPI_INT, 0, TAG_BEAT, w->comm, &send_req);
            }
            next_beat = now + w->period_s;
        }
        double wake = now + WORKER_POLL_S < next_beat ? now + WORKER_POLL_S : next_beat;
        if (nap_until(w, wake)) {
            break;
        }
        int aborted = 0;
        MPI_Test(&abort_req, &aborted, MPI_STATUS_IGNORE);
        if (aborted) {
            ddld_log("rank 0 ends the job (rank %d stopped answering); exiting", (int)w->abort_in);
            fflush(stderr);
            _exit(DDLD_EXIT_RANK_FAULT);
        }
    }
    MPI_Wait(&send_req, MPI_STATUS_IGNORE);
    MPI_Send(&w->beat, 1, MPI_INT, 0, TAG_BYE, w->comm);
    MPI_Cancel(&abort_req);
    MPI_Wait(&abort_req, MPI_STATUS_IGNORE);
    return NULL;
}

// ---- rank 0 ---------------------------------------------------------------------------------

// Rank r has been silent for `silent` seconds: name it, release the other ranks, abort.
static void end_job(ddld_watchdog *w, int r, double silent)
{
    const struct hello *who = &w->who[r];
    ddld_log("rank %d (host %s, pid %d) has not answered for %.1f s (stopped or hung); "
             "ending the job",
             r, who->host, (int)who->pid, silent);
    w->fault_rank = r;
    for (int i = 1; i < w->size; i++) {
        MPI_Isend(&w->fault_rank, 1, MPI_INT, i, TAG_ABORT, w->comm, &w->peers[i].abort_req);
    }
    // Small messages leave at once; give them a moment, never more (the silent rank may
    // never take its copy).
    double end = ddld_now() + 1.0;
    for (int all = 0; !all && ddld_now() < end;) {
        all = 1;
        for (int i = 1; i < w->size; i++) {
            int done = 1;
            MPI_Test(&w->peers[i].abort_req, &done, MPI_STATUS_IGNORE);
            all = all && done;
        }
        struct timespec ts = {0, 10000000L};
        nanosleep(&ts, NULL);
    }
    fflush(stderr);
    // MPI_Abort asks mpirun to kill the job; while mpirun is already in its own kill sequence
    // (a rank died) the call blocks for up to twice odls_base_sigkill_timeout. SIGALRM's
    // default action ends rank 0 -- and its gRPC connections -- after 3 s in any case.
    alarm(3);
    MPI_Abort(MPI_COMM_WORLD, DDLD_EXIT_RANK_FAULT);
    _exit(DDLD_EXIT_RANK_FAULT); // MPI_Abort does not return; should it, do not linger
}

static void *watch_main(void *arg)
{
    ddld_watchdog *w     = arg;
    int            byes  = 0;
    double         start = ddld_now();
    for (int i = 0; i < w->size; i++) {
        w->peers[i].last = start;
    }
    MPI_Request rx;
    MPI_Irecv(&w->rx, 1, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, w->comm, &rx);
    for (;;) {
        int        got;
        MPI_Status st;
        while (MPI_Test(&rx, &got, &st), got) {
            struct peer *p = &w->peers[st.MPI_SOURCE];
            p->last        = ddld_now();
            if (st.MPI_TAG == TAG_BYE && !p->bye) {
                p->bye = true;
                byes++;
            }
            if (byes == w->size - 1) {
                return NULL; // every worker said goodbye: nothing is in flight
            }
            MPI_Irecv(&w->rx, 1, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, w->comm, &rx);
        }
        double now = ddld_now();
        for (int r = 1; r < w->size; r++) {
            if (!w->peers[r].bye && now - w->peers[r].last > w->timeout_s) {
                end_job(w, r, now - w->peers[r].last);
            }
        }
        // Rank 0 ends on the BYEs, not on the stop flag (which would cut its naps short).
        struct timespec ts = {0, (long)(ROOT_POLL_S * 1e9)};
        nanosleep(&ts, NULL);
    }
}

// ---- lifecycle ------------------------------------------------------------------------------

ddld_watchdog *ddld_watchdog_start(MPI_Comm world, double timeout_s)
{
    int size, rank;
    MPI_Comm_size(world, &size);
    MPI_Comm_rank(world, &rank);
    if (timeout_s <= 0 || size == 1) {
        return NULL;
    }
    ddld_watchdog *w = calloc(1, sizeof *w);
    if (w == NULL) {
        ddld_log("watchdog: out of memory");
        MPI_Abort(world, 2);
    }
    w->rank      = rank;
    w->size      = size;
    w->timeout_s = timeout_s;
    w->period_s  = timeout_s / 3 < 1.0 ? timeout_s / 3 : 1.0;
    MPI_Comm_dup(world, &w->comm);
    pthread_mutex_init(&w->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);

    struct hello me;
    memset(&me, 0, sizeof me);
    me.pid = (int32_t)getpid();
    gethostname(me.host, sizeof me.host - 1);
    if (rank == 0) {
        w->peers = calloc((size_t)size, sizeof *w->peers);
        w->who   = calloc((size_t)size, sizeof *w->who);
        if (w->peers == NULL || w->who == NULL) {
            ddld_log("watchdog: out of memory");
            MPI_Abort(world, 2);
        }
    }
    // Each rank's host and pid, for the message that names a silent rank.
    MPI_Gather(&me, (int)sizeof me, MPI_BYTE, w->who, (int)sizeof me, MPI_BYTE, 0, w->comm);
    int err = pthread_create(&w->thread, NULL, rank == 0 ? watch_main : beat_main, w);
    if (err != 0) {
        ddld_log("watchdog: cannot start its thread: %s", strerror(err));
        MPI_Abort(world, 2);
    }
    return w;
}

void ddld_watchdog_stop(ddld_watchdog **pw)
{
    ddld_watchdog *w = *pw;
    if (w == NULL) {
        return;
    }
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    MPI_Comm_free(&w->comm);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w->peers);
    free(w->who);
    free(w);
    *pw = NULL;
}
