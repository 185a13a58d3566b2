// base/fault.c: named crash points for crash-recovery tests (ddl_fault_point, ddl/base.h).
//
// DDL_FAULT="SITE[@RANK][#NTH]" makes the NTH time (default 1) this process passes SITE
// on rank RANK (default: any rank) end the process with SIGKILL, as a power cut or an
// OOM kill would, after one line on stderr. Unset, a site costs one branch on a cached
// flag. The variable is read once, on the first site passed.
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ddl/base.h"

#define FAULT_SITE_MAX 64

static struct {
    int  armed;
    char site[FAULT_SITE_MAX];
    int  rank; // -1: any
    long nth;
    long hits;
} fault;
static pthread_once_t fault_once = PTHREAD_ONCE_INIT;

static void fault_parse(void)
{
    const char *v = getenv("DDL_FAULT");
    if (v == NULL || v[0] == '\0') {
        return;
    }
    size_t n = strcspn(v, "@#");
    if (n == 0 || n >= sizeof fault.site) {
        fprintf(stderr, "ddl: DDL_FAULT=\"%s\": expected SITE[@RANK][#NTH]; ignored\n", v);
        return;
    }
    memcpy(fault.site, v, n);
    fault.site[n] = '\0';
    fault.rank    = -1;
    fault.nth     = 1;
    const char *p = v + n;
    char       *end;
    if (*p == '@') {
        long r = strtol(p + 1, &end, 10);
        if (end == p + 1 || r < 0) {
            fprintf(stderr, "ddl: DDL_FAULT=\"%s\": bad rank; ignored\n", v);
            return;
        }
        fault.rank = (int)r;
        p          = end;
    }
    if (*p == '#') {
        long k = strtol(p + 1, &end, 10);
        if (end == p + 1 || k < 1) {
            fprintf(stderr, "ddl: DDL_FAULT=\"%s\": bad count; ignored\n", v);
            return;
        }
        fault.nth = k;
        p         = end;
    }
    if (*p != '\0') {
        fprintf(stderr, "ddl: DDL_FAULT=\"%s\": trailing \"%s\"; ignored\n", v, p);
        return;
    }
    fault.armed = 1;
}

void ddl_fault_point(const char *site, int rank)
{
    pthread_once(&fault_once, fault_parse);
    if (!fault.armed || strcmp(site, fault.site) != 0 || (fault.rank >= 0 && fault.rank != rank)) {
        return;
    }
    if (++fault.hits != fault.nth) {
        return;
    }
    fprintf(stderr, "ddl: DDL_FAULT: SIGKILL at %s on rank %d (pass %ld)\n", site, rank,
            fault.hits);
    fflush(stderr);
    raise(SIGKILL);
}
