// primitives/traffic.c: the bytes each primitive moved across ranks, per process.
//
// What is counted is the *logical payload*: for each execution of forward or adjoint,
// the bytes of this rank's tensor that other ranks need (sent) and the bytes of other
// ranks' tensors this rank needs (received), as if every transfer were a direct
// point-to-point message. Copies a rank makes to itself are never counted. So, for a
// tensor of B bytes and a group of g ranks:
//
//   Broadcast fan-out (Broadcast forward, SumReduce adjoint):
//       root sends (g-1)·B, each other member receives B;
//   SumReduce fan-in (SumReduce forward, Broadcast adjoint):
//       each member other than the root sends B, the root receives (g-1)·B;
//   AllSumReduce (forward and adjoint):
//       each member sends (g-1)·B and receives (g-1)·B;
//   Repartition: the exact bytes of the boxes this rank sends to and receives from other
//       ranks (its self overlap excluded);
//   HaloExchange: the exact bytes of the slabs it sends to and receives from its
//       neighbours (global zero padding is never exchanged, so never counted).
//   AllMaxReduce: not a primitive (a maximum has no adjoint), counted like AllSumReduce:
//       the row maxima of the distributed cross-entropy (layers/loss.c).
//
// Summed over all ranks, sent equals received for every primitive and pass. The bytes
// MPI's collective algorithms put on the wire (trees, rings) differ from this by a
// factor that depends on the algorithm; the logical payload is what an analytic formula
// of the model predicts. A group of one (g = 1) moves nothing.
#include <string.h>
#include <time.h>

#include "primitives/traffic.h"

static ddl_traffic      counters;
static ddl_traffic_time times;

double ddl__traffic_clock(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void ddl__traffic_time(ddl_traffic_kind kind, ddl_traffic_pass pass, double since)
{
    times.s[kind][pass] += ddl__traffic_clock() - since;
}

void ddl_traffic_time_snapshot(ddl_traffic_time *out)
{
    *out = times;
}

void ddl__traffic_add(ddl_traffic_kind kind, ddl_traffic_pass pass, uint64_t sent,
                      uint64_t received)
{
    ddl_traffic_count *c = &counters.c[kind][pass];
    c->sent += sent;
    c->received += received;
    c->calls++;
}

void ddl_traffic_snapshot(ddl_traffic *out)
{
    *out = counters;
}

void ddl_traffic_reset(void)
{
    memset(&counters, 0, sizeof counters);
    memset(&times, 0, sizeof times);
}

const char *ddl_traffic_kind_name(ddl_traffic_kind kind)
{
    static const char *const names[DDL_TRAFFIC_NKINDS] = {
        [DDL_TRAFFIC_BROADCAST]      = "broadcast",
        [DDL_TRAFFIC_SUM_REDUCE]     = "sum_reduce",
        [DDL_TRAFFIC_ALL_SUM_REDUCE] = "all_sum_reduce",
        [DDL_TRAFFIC_REPARTITION]    = "repartition",
        [DDL_TRAFFIC_HALO_EXCHANGE]  = "halo_exchange",
        [DDL_TRAFFIC_ALL_MAX_REDUCE] = "all_max_reduce",
    };
    return (unsigned)kind < DDL_TRAFFIC_NKINDS ? names[kind] : "unknown";
}

void ddl_traffic_sub(const ddl_traffic *a, const ddl_traffic *b, ddl_traffic *out)
{
    for (int k = 0; k < DDL_TRAFFIC_NKINDS; k++) {
        for (int p = 0; p < DDL_TRAFFIC_NPASSES; p++) {
            out->c[k][p].sent     = a->c[k][p].sent - b->c[k][p].sent;
            out->c[k][p].received = a->c[k][p].received - b->c[k][p].received;
            out->c[k][p].calls    = a->c[k][p].calls - b->c[k][p].calls;
        }
    }
}

void ddl_traffic_add(ddl_traffic *acc, const ddl_traffic *d)
{
    for (int k = 0; k < DDL_TRAFFIC_NKINDS; k++) {
        for (int p = 0; p < DDL_TRAFFIC_NPASSES; p++) {
            acc->c[k][p].sent += d->c[k][p].sent;
            acc->c[k][p].received += d->c[k][p].received;
            acc->c[k][p].calls += d->c[k][p].calls;
        }
    }
}

ddl_traffic_count ddl_traffic_total(const ddl_traffic *t)
{
    ddl_traffic_count s = {0, 0, 0};
    for (int k = 0; k < DDL_TRAFFIC_NKINDS; k++) {
        for (int p = 0; p < DDL_TRAFFIC_NPASSES; p++) {
            s.sent += t->c[k][p].sent;
            s.received += t->c[k][p].received;
            s.calls += t->c[k][p].calls;
        }
    }
    return s;
}
