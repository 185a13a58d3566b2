// server/watchdog.c: heartbeats between rank 0 and every other rank, and the verdict on a
// rank that stopped answering (see watchdog.h for the contract).
//
// Messages on the watchdog's own communicator, one MPI_INT each:
//   BEAT  rank r -> 0 and 0 -> rank r, every period while the threads run
//   BYE   rank r -> 0 once, when r's command loop ended (r sends nothing after it);
//         0 -> rank r in answer, after its last BEAT to r (0 sends r nothing after it)
//   ABORT a judge -> every other rank: the job ends; the value names the silent rank
// Messages between two ranks arrive in order, so after both BYEs nothing is in flight.
// Rank 0 judges every other rank; rank 1 judges rank 0 (one judge, one message). Worker
// threads wait on a condition variable between beats (a stop is immediate) and take rank
// 0's messages every 250 ms; rank 0's thread drains and checks every 100 ms. Both only
// ever touch preallocated buffers.
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

#include "ddl/base.h"
#include "log.h"
#include "watchdog.h"

enum { TAG_BEAT = 1, TAG_BYE = 2, TAG_ABORT = 3 };

#define WORKER_POLL_S 0.25 // a worker takes rank 0's messages (and an ABORT) this often
#define ROOT_POLL_S 0.1    // rank 0 checks the silences this often

struct hello {
    int32_t pid;
    char    host[60];
};

struct peer {
    double      last; // when its last message arrived (ddld_now)
    bool        bye;
    MPI_Request beat_req, abort_req;
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
    int32_t beat, rx, fault_rank;
    // one entry per rank; rank 0 also has `who` (each rank's host and pid), all have `root`
    struct peer  *peers;
    struct hello *who;
    struct hello  root;
    double        last_check; // the judge's previous check (ddld_now; 0: none yet)
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

// The verdict (rank 0 on any rank, rank 1 on rank 0): rank r (host, pid) has been silent
// for `silent` seconds. Names it, tells every other rank to exit, aborts the job.
static void end_job(ddld_watchdog *w, int r, const struct hello *who, double silent)
{
    ddld_log("rank %d (host %s, pid %d) has not answered for %.1f s (stopped or hung); "
             "ending the job",
             r, who->host, (int)who->pid, silent);
    w->fault_rank = r;
    for (int i = 0; i < w->size; i++) {
        w->peers[i].abort_req = MPI_REQUEST_NULL;
        if (i != w->rank) {
            MPI_Isend(&w->fault_rank, 1, MPI_INT, i, TAG_ABORT, w->comm, &w->peers[i].abort_req);
        }
    }
    // Small messages leave at once; give them a moment, never more (the silent rank may
    // never take its copy -- or take it when mpirun's SIGCONT resumes it, and exit).
    double end = ddld_now() + 1.0;
    for (int all = 0; !all && ddld_now() < end;) {
        all = 1;
        for (int i = 0; i < w->size; i++) {
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
    // default action ends this rank -- on rank 0, its gRPC connections -- after 3 s anyway.
    alarm(3);
    MPI_Abort(MPI_COMM_WORLD, DDLD_EXIT_RANK_FAULT);
    _exit(DDLD_EXIT_RANK_FAULT); // MPI_Abort does not return; should it, do not linger
}

// Another rank's verdict arrived: leave at once.
static void aborted(ddld_watchdog *w, int from)
{
    ddld_log("rank %d ends the job (rank %d stopped answering); exiting", from, (int)w->rx);
    fflush(stderr);
    _exit(DDLD_EXIT_RANK_FAULT);
}

// A judge that was itself stopped or starved (its own checks more than half the timeout
// apart) cannot tell silence from its own absence: it restarts the clocks instead.
static bool judge_was_away(ddld_watchdog *w, double now)
{
    bool away     = w->last_check > 0 && now - w->last_check > w->timeout_s / 2;
    w->last_check = now;
    return away;
}

// ---- ranks > 0 ------------------------------------------------------------------------------

// Takes every message sent to this rank so far (rank 0's beats and BYE; an ABORT from
// rank 0 or rank 1 ends this process); returns true once rank 0's BYE arrived. Rank 1
// also judges rank 0.
static bool take_from_root(ddld_watchdog *w, MPI_Request *in, double *root_last)
{
    int        got;
    MPI_Status st;
    while (MPI_Test(in, &got, &st), got) {
        if (st.MPI_TAG == TAG_ABORT) {
            aborted(w, st.MPI_SOURCE);
        }
        *root_last = ddld_now();
        if (st.MPI_TAG == TAG_BYE) {
            return true; // the last message from rank 0: no receive left pending
        }
        MPI_Irecv(&w->rx, 1, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, w->comm, in);
    }
    double now = ddld_now();
    if (w->rank == 1) {
        if (judge_was_away(w, now)) {
            *root_last = now;
        } else if (now - *root_last > w->timeout_s) {
            end_job(w, 0, &w->root, now - *root_last);
        }
    }
    return false;
}

static void *beat_main(void *arg)
{
    ddld_watchdog *w = arg;
    MPI_Request    in, send_req = MPI_REQUEST_NULL;
    MPI_Irecv(&w->rx, 1, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, w->comm, &in);
    double root_last = ddld_now();
    double next_beat = root_last;
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
        take_from_root(w, &in, &root_last);
    }
    MPI_Wait(&send_req, MPI_STATUS_IGNORE);
    MPI_Send(&w->beat, 1, MPI_INT, 0, TAG_BYE, w->comm);
    // Rank 0 answers with its own BYE after its last beat to us; still judging it.
    while (!take_from_root(w, &in, &root_last)) {
        struct timespec ts = {0, 10000000L};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

// ---- rank 0 ---------------------------------------------------------------------------------

static void *watch_main(void *arg)
{
    ddld_watchdog *w         = arg;
    int            byes      = 0;
    double         start     = ddld_now();
    double         next_beat = start;
    for (int i = 0; i < w->size; i++) {
        w->peers[i].last     = start;
        w->peers[i].beat_req = MPI_REQUEST_NULL;
    }
    MPI_Request rx;
    MPI_Irecv(&w->rx, 1, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, w->comm, &rx);
    for (;;) {
        int        got;
        MPI_Status st;
        while (MPI_Test(&rx, &got, &st), got) {
            if (st.MPI_TAG == TAG_ABORT) {
                aborted(w, st.MPI_SOURCE); // rank 1 found this rank silent
            }
            struct peer *p = &w->peers[st.MPI_SOURCE];
            p->last        = ddld_now();
            if (st.MPI_TAG == TAG_BYE && !p->bye) {
                p->bye = true;
                byes++;
                // Our answer goes after our last beat to that rank, which it still takes.
                MPI_Wait(&p->beat_req, MPI_STATUS_IGNORE);
                MPI_Send(&w->beat, 1, MPI_INT, st.MPI_SOURCE, TAG_BYE, w->comm);
            }
            if (byes == w->size - 1) {
                return NULL; // every worker said goodbye: nothing is in flight
            }
            MPI_Irecv(&w->rx, 1, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, w->comm, &rx);
        }
        double now = ddld_now();
        if (now >= next_beat) {
            for (int r = 1; r < w->size; r++) {
                int sent = 1;
                MPI_Test(&w->peers[r].beat_req, &sent, MPI_STATUS_IGNORE);
                if (sent && !w->peers[r].bye) {
                    MPI_Isend(&w->beat, 1, MPI_INT, r, TAG_BEAT, w->comm, &w->peers[r].beat_req);
                }
            }
            next_beat = now + w->period_s;
        }
        bool away = judge_was_away(w, now);
        for (int r = 1; r < w->size; r++) {
            if (away) {
                w->peers[r].last = now;
            } else if (!w->peers[r].bye && now - w->peers[r].last > w->timeout_s) {
                end_job(w, r, &w->who[r], now - w->peers[r].last);
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
    ddld_watchdog *w = ddl_calloc(1, sizeof *w);
    if (w == NULL) {
        ddld_log("watchdog: out of memory");
        MPI_Abort(world, DDLD_EXIT_START);
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
    w->peers = ddl_calloc((size_t)size, sizeof *w->peers);
    if (rank == 0) {
        w->who = ddl_calloc((size_t)size, sizeof *w->who);
    }
    if (w->peers == NULL || (rank == 0 && w->who == NULL)) {
        ddld_log("watchdog: out of memory");
        MPI_Abort(world, DDLD_EXIT_START);
    }
    // Each rank's host and pid, for the message that names a silent rank.
    MPI_Gather(&me, (int)sizeof me, MPI_BYTE, w->who, (int)sizeof me, MPI_BYTE, 0, w->comm);
    w->root = me;
    MPI_Bcast(&w->root, (int)sizeof w->root, MPI_BYTE, 0, w->comm);
    int err = pthread_create(&w->thread, NULL, rank == 0 ? watch_main : beat_main, w);
    if (err != 0) {
        ddld_log("watchdog: cannot start its thread: %s", strerror(err));
        MPI_Abort(world, DDLD_EXIT_START);
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
    ddl_free(w->peers);
    ddl_free(w->who);
    ddl_free(w);
    *pw = NULL;
}
