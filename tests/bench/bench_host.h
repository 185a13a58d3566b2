// bench_host.h: what every bench prints beside its figures about the machine it ran on
// (DEVELOPERS.md: name the CPU and the load beside every figure). No dependencies.
#ifndef DDL_BENCH_HOST_H
#define DDL_BENCH_HOST_H

#include <stddef.h>

// The CPU's "model name" from /proc/cpuinfo into out[0..n), or "unknown CPU".
void bench_cpu_name(char *out, size_t n);
// "load average: 1.00, 0.50, 0.25" from /proc/loadavg, as uptime prints it (-1.00 where
// it cannot be read). A static buffer, overwritten by the next call.
const char *bench_load_average(void);

#endif // DDL_BENCH_HOST_H
