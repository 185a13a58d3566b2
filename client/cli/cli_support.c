// cli_support.c: the daemon's address from its --address-file, and the Train progress
// display shared by the distdl tool and ddl_example_train (cli_support.h).
#include "cli_support.h"

#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

double ddl_cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// ---- address -------------------------------------------------------------------------

// 0: an address in buf; 1: not there yet (missing or empty); -1: unreadable (errno).
static int try_read(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return errno == ENOENT ? 1 : -1;
    char *line = fgets(buf, (int)cap, f);
    int   err  = ferror(f) ? errno : 0;
    fclose(f);
    if (err) {
        errno = err;
        return -1;
    }
    if (!line)
        return 1;
    buf[strcspn(buf, "\r\n")] = '\0';
    return buf[0] ? 0 : 1;
}

int ddl_cli_read_address(const char *path, double wait_s, char *buf, size_t cap)
{
    double end = ddl_cli_now() + wait_s;
    for (;;) {
        int r = try_read(path, buf, cap);
        if (r <= 0)
            return r;
        if (ddl_cli_now() >= end) {
            errno = ENOENT;
            return -1;
        }
        usleep(50000);
    }
}

// ---- Train progress ------------------------------------------------------------------

void ddl_cli_format_duration(double s, char *buf, size_t cap)
{
    if (!(s >= 0) || s >= 100 * 3600.0) {
        snprintf(buf, cap, "--:--");
        return;
    }
    unsigned t = (unsigned)lround(s), h = t / 3600 % 100u, m = t / 60 % 60u, sec = t % 60u;
    if (h > 0)
        snprintf(buf, cap, "%u:%02u:%02u", h, m, sec);
    else
        snprintf(buf, cap, "%u:%02u", m, sec);
}

void ddl_cli_progress_init(ddl_cli_progress *p, FILE *out, int tty)
{
    // The rate, hence the ETA, counts from here: call it just before the Train starts.
    *p = (ddl_cli_progress){.out = out, .tty = tty, .t0 = ddl_cli_now(), .last_draw = -1.0};
}

void ddl_cli_progress_end(ddl_cli_progress *p)
{
    if (p->drawn) {
        fputc('\n', p->out);
        fflush(p->out);
        p->drawn = 0;
    }
}

// Seconds left at the rate observed since the first record; negative while unknown.
static double eta(const ddl_cli_progress *p, const ddl_client_progress *r, double now)
{
    int64_t steps = r->done;
    if (steps <= 0 || now <= p->t0 || r->total <= 0)
        return -1.0;
    return (double)(r->total - r->done) * (now - p->t0) / (double)steps;
}

static int terminal_columns(FILE *out)
{
    struct winsize ws;
    if (ioctl(fileno(out), TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 20)
        return ws.ws_col;
    return 80;
}

// The bar fits the terminal: a line longer than the terminal wraps, and '\r' would then
// redraw only its last row. On a narrow one the epoch and done/total go first, then the
// bar shrinks; step, loss, accuracy, images/s and ETA stay while they fit.
static void draw_bar(ddl_cli_progress *p, const ddl_client_progress *r, double now)
{
    char left[16], full[256], brief[192], line[320];
    int  pct = r->total > 0 ? (int)(100 * r->done / r->total) : 0;
    ddl_cli_format_duration(eta(p, r, now), left, sizeof left);
    int nfull = snprintf(full, sizeof full,
                         " %3d%% %lld/%lld  step %lld  epoch %lld  loss %.4f  acc %.3f  %.0f img/s"
                         "  ETA %s",
                         pct, (long long)r->done, (long long)r->total, (long long)r->step,
                         (long long)r->epoch, r->loss, r->accuracy, r->images_per_second, left);
    int nbrief =
        snprintf(brief, sizeof brief, " %3d%% step %lld  loss %.4f  acc %.3f  %.0f img/s  ETA %s",
                 pct, (long long)r->step, r->loss, r->accuracy, r->images_per_second, left);
    int         room  = terminal_columns(p->out) - 1;
    const char *stats = nfull + 22 <= room ? full : brief;
    int         width = room - 2 - (stats == full ? nfull : nbrief);
    width             = width > 20 ? 20 : width;
    char bar[32]      = "";
    if (width >= 5) {
        int fill = r->total > 0 ? (int)(width * r->done / r->total) : 0;
        bar[0]   = '[';
        for (int i = 0; i < width; i++)
            bar[1 + i] = i < fill ? '#' : '.';
        bar[width + 1] = ']';
        bar[width + 2] = '\0';
    }
    int n = snprintf(line, sizeof line, "%s%s", bar, bar[0] ? stats : stats + 1);
    if (n > room)
        line[room] = '\0';
    fprintf(p->out, "\r%s\033[K", line);
    fflush(p->out);
    p->drawn     = 1;
    p->last_draw = now;
}

void ddl_cli_progress_update(ddl_cli_progress *p, const ddl_client_progress *r)
{
    double now = ddl_cli_now();
    if (r->finished) {
        if (p->tty)
            draw_bar(p, r, now); // the bar's final state stays on the screen
        ddl_cli_progress_end(p);
        return;
    }
    if (r->epoch_end) {
        if (p->drawn)
            fputs("\r\033[K", p->out);
        p->drawn = 0;
        fprintf(p->out,
                "epoch %lld done at step %lld: mean loss %.4f, loss %.4f, acc %.3f, %.0f img/s\n",
                (long long)r->epoch, (long long)r->step, r->mean_loss, r->loss, r->accuracy,
                r->images_per_second);
        fflush(p->out);
        if (p->tty)
            draw_bar(p, r, now);
        return;
    }
    if (p->tty) {
        if (p->last_draw < 0 || now - p->last_draw >= 0.1 || r->done == r->total)
            draw_bar(p, r, now);
        return;
    }
    char left[16];
    ddl_cli_format_duration(eta(p, r, now), left, sizeof left);
    fprintf(p->out,
            "step %lld (%lld/%lld) epoch %lld batch %lld/%lld  loss %.4f  acc %.3f  %.0f img/s  "
            "ETA %s\n",
            (long long)r->step, (long long)r->done, (long long)r->total, (long long)r->epoch,
            (long long)r->batch, (long long)r->steps_per_epoch, r->loss, r->accuracy,
            r->images_per_second, left);
    fflush(p->out);
}
