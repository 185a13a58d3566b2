// ddl/estimate.h: a model spec's memory, estimated per rank before anything is allocated.
//
//   ddl_spec_t *spec;                    // from ddl_spec_parse
//   ddl_mem_estimate e;
//   ddl_spec_estimate(spec, &e);         // the rank that needs the most
//   ddl_status st = ddl_spec_check_memory(spec, ranks_on_host); // RESOURCE_EXHAUSTED-able
//
// The estimate sums, for the rank that needs the most, the local blocks of the parameters,
// their gradients, the optimizer state (Adam: 2 per parameter, SGD with momentum: 1), the
// activations and their gradients for one batch, and what the layers allocate besides:
// the halo-padded buffers, crops and exchange slabs of a spatially split conv or pool
// (each rank's own, from the halo plan's arithmetic), the working weight copies of the
// halo layouts, the channel fans' and Linear's broadcast/reduce blocks, the kernels'
// workspaces, a dropout mask, the batch norm's per-channel vectors, each layer's
// bookkeeping, and the forward-only copies of the layers for the spec's inference batches.
// Local blocks are the largest balanced piece (ceil(N / P) per dimension). Every shipped
// spec measures within 1.2x of the most any rank holds across ddl_model_create, a training
// step and a short-batch evaluation (ddl_alloc high-water mark; tests/engine/
// test_estimate.c prints the ratios, 0.98-1.09 on 2026-12-06).
#ifndef DDL_ESTIMATE_H
#define DDL_ESTIMATE_H

#include <stddef.h>
#include <stdint.h>

#include "ddl/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ddl_mem_estimate {
    double params, grads, optim, activations, workspace; // bytes
    double copies; // of those, the short-batch copies' (spec inference_batches)
    double total;
    int    rank; // the rank that needs the most
} ddl_mem_estimate;

// The per-rank estimate of the rank that needs the most memory. Not collective; pure
// arithmetic on the parsed spec (no allocation beyond a per-rank table).
DDL_EXTERN ddl_status ddl_spec_estimate(const ddl_spec_t *spec, ddl_mem_estimate *out);

// Bytes available to one rank: DDL_MEMORY_LIMIT (bytes per rank, as ddl_parse_bytes reads
// them; a spec parse refuses any other value, this ignores it) when set; otherwise MemAvailable
// (/proc/meminfo) divided by ranks_on_host, or when lower the cgroup's memory.max minus
// memory.current (v2) divided by ranks_on_host, or the v1 memory group's memory.limit_in_bytes
// minus memory.usage_in_bytes (deploy/memcap.sh puts each rank in a group of its own: then not
// divided). `how` (may be NULL) receives a short description of where the figure came from. Returns
// -1 when nothing could be read.
DDL_EXTERN double ddl_mem_available(int ranks_on_host, char *how, size_t howlen);

// The value of a "Key:   123 kB" line of a /proc file (/proc/meminfo, /proc/self/status), in
// bytes; -1 when the file or the key is absent. ddl_mem_available reads MemAvailable with
// it; public so that a measurement (bench-memory: VmHWM, VmRSS) reads /proc as it does.
DDL_EXTERN double ddl_proc_kb_bytes(const char *path, const char *key);

// Refuses a spec whose estimate does not fit: DDL_ENOMEM with "spec needs an estimated X GiB (or MiB)
// per rank (parameters A, gradients B, optimizer state C, activations D, workspace E GiB)
// but Y GiB is available (...)". ranks_on_host <= 0: OMPI_COMM_WORLD_LOCAL_SIZE, else the
// spec's world size. Not collective.
DDL_EXTERN ddl_status ddl_spec_check_memory(const ddl_spec_t *spec, int ranks_on_host);

#ifdef __cplusplus
}
#endif

#endif // DDL_ESTIMATE_H
