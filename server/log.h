// server/log.h: the daemon's log and the clock its timings read. A leaf module: libc and
// the engine's base.h (for the engine's log levels), nothing of gRPC, MPI or the session,
// so every other server file may use it and it calls none of them.
//
// Lines go to stderr as "distdld: ..." on rank 0 (and before MPI_Init, when the rank is not
// known yet) and "distdld[N]: ..." on rank N > 0. Tests grep these prefixes.
#ifndef DDLD_LOG_H
#define DDLD_LOG_H

#define DDLD_LOG_PREFIX "distdld"

// Every rank, once its rank is known (after MPI_Init): ranks > 0 then prefix their lines
// with "[rank]".
void ddld_log_set_rank(int rank);

// Logging: "distdld: ..." on stderr (rank 0 only unless noted). Any thread; one line per
// call (at most 2047 bytes of message).
void ddld_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// Installs ddld_log as the engine's log sink (ddl_log_set): engine warnings and errors come
// out as "distdld: warning: ..." / "distdld: error: ...", with the daemon's prefix, instead
// of the engine's own "ddl warning: ..." on stderr. Info and debug lines are dropped, as the
// engine's default sink drops them. Call once at start-up, before any engine work.
void ddld_log_engine_sink(void);

// Seconds on a monotonic clock (for DDLD_VERBOSE timings across threads).
double ddld_now(void);

#endif // DDLD_LOG_H
