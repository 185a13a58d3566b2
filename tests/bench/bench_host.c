// bench_host.c: the CPU's name and the load average for the benches' headers.
#include "bench_host.h"

#include <stdio.h>
#include <string.h>

void bench_cpu_name(char *out, size_t n)
{
    snprintf(out, n, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    char  line[512];
    while (f != NULL && fgets(line, sizeof line, f) != NULL) {
        char *c = strchr(line, ':');
        if (strncmp(line, "model name", 10) == 0 && c != NULL) {
            snprintf(out, n, "%s", c + 2);
            out[strcspn(out, "\n")] = '\0';
            break;
        }
    }
    if (f != NULL) {
        fclose(f);
    }
}

const char *bench_load_average(void)
{
    static char out[128];
    double      a = -1, b = -1, c = -1;
    FILE       *f = fopen("/proc/loadavg", "r");
    if (f != NULL) {
        if (fscanf(f, "%lf %lf %lf", &a, &b, &c) != 3) {
            a = b = c = -1;
        }
        fclose(f);
    }
    snprintf(out, sizeof out, "load average: %.2f, %.2f, %.2f", a, b, c);
    return out;
}
