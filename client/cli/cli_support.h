// cli_support.h: what the distdl command-line tool and the example clients share -- finding
// the daemon's address and showing a Train's progress. A static library (ddl_cli_support)
// over libdistdl-client; not part of the client library's API.
//
//   char addr[512];
//   if (ddl_cli_read_address(path, 10.0, addr, sizeof addr) != 0) ... errno says why
//   ddl_cli_progress bar;
//   ddl_cli_progress_init(&bar, stderr, isatty(STDERR_FILENO));
//   ... in the Train callback: ddl_cli_progress_update(&bar, record);
//   ddl_cli_progress_end(&bar);
#ifndef DDL_CLI_SUPPORT_H
#define DDL_CLI_SUPPORT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ddl_client.h"

// ---- address -------------------------------------------------------------------------

// Reads the first line of a daemon's --address-file ("host:port" or "unix:PATH") into buf.
// The daemon writes the file once it serves, so a missing or empty file is waited for up to
// wait_s seconds (0: not at all). Returns 0, or -1 with errno: ENOENT (no address appeared in
// time) or the error that made the file unreadable (EACCES, EISDIR, ENAMETOOLONG, ...).
int ddl_cli_read_address(const char *path, double wait_s, char *buf, size_t cap);

// Seconds on a monotonic clock.
double ddl_cli_now(void);

// ---- Train progress ------------------------------------------------------------------

// Shows progress records on `out`. On a terminal (tty = 1) one bar is redrawn in place with
// '\r' (step, done/total, epoch, loss, accuracy, images/s, ETA; at most 10 redraws a
// second, cut to the terminal's width), and every epoch end leaves one line above it.
// Otherwise (a pipe, a file) each record is one plain line. The ETA comes from the client's
// own clock: the rate of steps since ddl_cli_progress_init.
typedef struct ddl_cli_progress {
    FILE  *out;
    int    tty;
    int    drawn;     // a bar is on the screen (the cursor is at its end)
    double t0;        // when the Train began (ddl_cli_progress_init)
    double last_draw; // time of the last redraw
} ddl_cli_progress;

// Call just before the Train starts: its ETA counts from here.
void ddl_cli_progress_init(ddl_cli_progress *p, FILE *out, int tty);
// Shows one record (the final one, finished = 1, only finishes the bar).
void ddl_cli_progress_update(ddl_cli_progress *p, const ddl_client_progress *r);
// Ends the bar's line so that what follows starts on a fresh line. Idempotent.
void ddl_cli_progress_end(ddl_cli_progress *p);
// "1:02:03" or "2:03" for 0 <= seconds < 100 h; "--:--" otherwise.
void ddl_cli_format_duration(double seconds, char *buf, size_t cap);

#endif // DDL_CLI_SUPPORT_H
