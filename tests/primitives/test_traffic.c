// Traffic counters (ddl_traffic_snapshot): each primitive's forward and adjoint on 4 ranks
// add exactly the payload the definition in ddl/primitives.h gives, computed here by
// hand for small layouts:
//  - Broadcast P0 [1] -> P [4] of B bytes: the root sends 3B, the others receive B (it is
//    its own destination: no self count); the adjoint the other way round;
//  - SumReduce P [4] -> P0 [1]: the mirror image;
//  - AllSumReduce over P [4]: every rank sends and receives 3B in both passes;
//  - Repartition [8, 6] from [4, 1] to [1, 4]: rank r keeps its own 2 x c_r block and
//    sends 2 x (6 - c_r) elements, receives 6 x c_r;
//  - HaloExchange of [16] over [4], kernel 3, padding 1: one element per inner side.
// Also: sent == received summed over ranks, calls count executions, reset zeroes, and
// counting allocates nothing; and the time counters (ddl_traffic_time_snapshot): each
// execution adds time to its own kind and pass, and to no other.
#include <string.h>

#include "ddl/base.h"
#include "mpi_test.h"

static ddl_traffic      before;
static ddl_traffic_time before_time;

static void mark(void)
{
    ddl_traffic_snapshot(&before);
    ddl_traffic_time_snapshot(&before_time);
}

// This rank's sent/received/calls since mark() for one kind and pass.
static ddl_traffic_count delta(ddl_traffic_kind k, ddl_traffic_pass p)
{
    ddl_traffic now;
    ddl_traffic_snapshot(&now);
    ddl_traffic_count d = {.sent     = now.c[k][p].sent - before.c[k][p].sent,
                           .received = now.c[k][p].received - before.c[k][p].received,
                           .calls    = now.c[k][p].calls - before.c[k][p].calls};
    return d;
}

static void expect(ddl_traffic_kind k, ddl_traffic_pass p, uint64_t sent, uint64_t received)
{
    ddl_traffic_count d = delta(k, p);
    if (d.sent != sent || d.received != received || d.calls != 1) {
        TEST_FAIL_("%s %s: sent %llu received %llu calls %llu, expected %llu %llu 1",
                   ddl_traffic_kind_name(k), p == DDL_TRAFFIC_FORWARD ? "forward" : "adjoint",
                   (unsigned long long)d.sent, (unsigned long long)d.received,
                   (unsigned long long)d.calls, (unsigned long long)sent,
                   (unsigned long long)received);
    }
    // Time: some for this kind and pass, none for any other.
    ddl_traffic_time now;
    ddl_traffic_time_snapshot(&now);
    for (int kk = 0; kk < DDL_TRAFFIC_NKINDS; kk++) {
        for (int pp = 0; pp < DDL_TRAFFIC_NPASSES; pp++) {
            double t = now.s[kk][pp] - before_time.s[kk][pp];
            if ((kk == (int)k && pp == (int)p) ? !(t > 0) : t != 0) {
                TEST_FAIL_("%s %s: time of %s pass %d grew by %g s", ddl_traffic_kind_name(k),
                           p == DDL_TRAFFIC_FORWARD ? "forward" : "adjoint",
                           ddl_traffic_kind_name((ddl_traffic_kind)kk), pp, t);
            }
        }
    }
    // Over all ranks every byte sent is a byte received.
    uint64_t mine[2] = {d.sent, d.received}, all[2];
    MPI_Allreduce(mine, all, 2, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    ASSERT_EQ(all[0], all[1]);
}

static void test_broadcast_sum_reduce(int r)
{
    ddl_partition_t *P0 = ddl_test_partition_range(0, 1, (int[]){1});
    ddl_partition_t *P  = ddl_test_partition_range(0, 1, (int[]){4});
    ddl_shape        S  = ddl_shape_make(1, (int64_t[]){10});
    for (int dti = 0; dti < 2; dti++) {
        ddl_dtype         dt = dti == 0 ? DDL_F32 : DDL_F64;
        uint64_t          B  = 10 * ddl_dtype_size(dt);
        ddl_broadcast_t  *b  = NULL;
        ddl_sum_reduce_t *s  = NULL;
        ASSERT_OK(ddl_broadcast_create(P0, P, false, false, dt, &S, &b));
        ASSERT_OK(ddl_sum_reduce_create(P, P0, false, false, dt, &S, &s));
        ddl_shape     bx = ddl_broadcast_x_shape(b), by = ddl_broadcast_y_shape(b);
        ddl_tensor_t *x = ddl_test_random(dt, &bx, 1), *y = ddl_test_random(dt, &by, 2);
        ddl_tensor_t *x2 = ddl_test_random(dt, &bx, 3);

        mark();
        int64_t a0 = ddl_alloc_count();
        ASSERT_OK(ddl_broadcast_forward(b, x, y));
        ASSERT_EQ(ddl_alloc_count(), a0);
        expect(DDL_TRAFFIC_BROADCAST, DDL_TRAFFIC_FORWARD, r == 0 ? 3 * B : 0, r == 0 ? 0 : B);
        mark();
        ASSERT_OK(ddl_broadcast_adjoint(b, y, x2));
        expect(DDL_TRAFFIC_BROADCAST, DDL_TRAFFIC_ADJOINT, r == 0 ? 0 : B, r == 0 ? 3 * B : 0);
        // SumReduce P -> P0 moves the same tensors the other way.
        mark();
        ASSERT_OK(ddl_sum_reduce_forward(s, y, x2));
        expect(DDL_TRAFFIC_SUM_REDUCE, DDL_TRAFFIC_FORWARD, r == 0 ? 0 : B, r == 0 ? 3 * B : 0);
        mark();
        ASSERT_OK(ddl_sum_reduce_adjoint(s, x, y));
        expect(DDL_TRAFFIC_SUM_REDUCE, DDL_TRAFFIC_ADJOINT, r == 0 ? 3 * B : 0, r == 0 ? 0 : B);
        ddl_tensor_destroy(&x);
        ddl_tensor_destroy(&x2);
        ddl_tensor_destroy(&y);
        ddl_broadcast_destroy(&b);
        ddl_sum_reduce_destroy(&s);
    }
    ddl_partition_destroy(&P0);
    ddl_partition_destroy(&P);
}

static void test_all_sum_reduce(void)
{
    ddl_partition_t      *P = ddl_test_partition_range(0, 1, (int[]){4});
    ddl_shape             S = ddl_shape_make(2, (int64_t[]){3, 4});
    ddl_all_sum_reduce_t *a = NULL;
    ASSERT_OK(ddl_all_sum_reduce_create(P, 1, (int[]){0}, DDL_F64, &S, &a));
    ddl_tensor_t *x = ddl_test_random(DDL_F64, &S, 4), *y = ddl_test_random(DDL_F64, &S, 5);
    uint64_t      B = 12 * 8;
    mark();
    ASSERT_OK(ddl_all_sum_reduce_forward(a, x, y));
    expect(DDL_TRAFFIC_ALL_SUM_REDUCE, DDL_TRAFFIC_FORWARD, 3 * B, 3 * B);
    mark();
    ASSERT_OK(ddl_all_sum_reduce_adjoint(a, y, x));
    expect(DDL_TRAFFIC_ALL_SUM_REDUCE, DDL_TRAFFIC_ADJOINT, 3 * B, 3 * B);
    ddl_tensor_destroy(&x);
    ddl_tensor_destroy(&y);
    ddl_all_sum_reduce_destroy(&a);
    ddl_partition_destroy(&P);
}

static void test_repartition(void)
{
    ddl_partition_t   *Px = ddl_test_partition_range(0, 2, (int[]){4, 1});
    ddl_partition_t   *Py = ddl_test_partition_range(0, 2, (int[]){1, 4});
    ddl_shape          G  = ddl_shape_make(2, (int64_t[]){8, 6});
    ddl_repartition_t *t  = NULL;
    ASSERT_OK(ddl_repartition_create(Px, Py, DDL_F64, &G, NULL, &t));
    ddl_shape xs = ddl_repartition_x_shape(t), ys = ddl_repartition_y_shape(t);
    ASSERT_EQ(xs.d[0], 2);
    ASSERT_EQ(ys.d[0], 8);
    uint64_t      c = (uint64_t)ys.d[1]; // my columns: 6 balanced over 4
    ddl_tensor_t *x = ddl_test_random(DDL_F64, &xs, 6), *y = ddl_test_random(DDL_F64, &ys, 7);
    mark();
    ASSERT_OK(ddl_repartition_forward(t, x, y));
    expect(DDL_TRAFFIC_REPARTITION, DDL_TRAFFIC_FORWARD, 2 * (6 - c) * 8, 6 * c * 8);
    mark();
    ASSERT_OK(ddl_repartition_adjoint(t, y, x));
    expect(DDL_TRAFFIC_REPARTITION, DDL_TRAFFIC_ADJOINT, 6 * c * 8, 2 * (6 - c) * 8);
    ddl_tensor_destroy(&x);
    ddl_tensor_destroy(&y);
    ddl_repartition_destroy(&t);
    ddl_partition_destroy(&Px);
    ddl_partition_destroy(&Py);
}

static void test_halo(int r)
{
    ddl_partition_t     *P = ddl_test_partition_range(0, 1, (int[]){4});
    ddl_shape            G = ddl_shape_make(1, (int64_t[]){16});
    ddl_halo_exchange_t *h = NULL;
    ASSERT_OK(ddl_halo_exchange_create(P, DDL_F32, &G, (int64_t[]){3}, (int64_t[]){1},
                                       (int64_t[]){1}, (int64_t[]){1}, &h));
    ddl_shape     s   = ddl_halo_exchange_shape(h);
    ddl_tensor_t *buf = ddl_test_random(DDL_F32, &s, 8);
    // One element to and from each neighbour: rank 0 and 3 have one, 1 and 2 two.
    uint64_t sides = (r > 0) + (r < 3);
    mark();
    int64_t a0 = ddl_alloc_count();
    ASSERT_OK(ddl_halo_exchange_forward(h, buf));
    ASSERT_OK(ddl_halo_exchange_adjoint(h, buf));
    ASSERT_EQ(ddl_alloc_count(), a0);
    ddl_traffic_count f = delta(DDL_TRAFFIC_HALO_EXCHANGE, DDL_TRAFFIC_FORWARD);
    ddl_traffic_count a = delta(DDL_TRAFFIC_HALO_EXCHANGE, DDL_TRAFFIC_ADJOINT);
    ASSERT_EQ(f.sent, sides * 4);
    ASSERT_EQ(f.received, sides * 4);
    ASSERT_EQ(a.sent, sides * 4);
    ASSERT_EQ(a.received, sides * 4);
    ASSERT_EQ(f.calls, 1);
    ASSERT_EQ(a.calls, 1);
    ddl_tensor_destroy(&buf);
    ddl_halo_exchange_destroy(&h);
    ddl_partition_destroy(&P);
}

int main(int argc, char **argv)
{
    ddl_test_mpi_init(&argc, &argv);
    ddl_test_require_ranks(4);
    int size;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 4) {
        if (ddl_test_rank == 0) {
            printf("traffic: the hand-computed layouts need exactly 4 ranks\n");
        }
        ddl_test_mpi_finalize();
        return DDL_TEST_SKIP;
    }
    int r = ddl_test_rank;
    test_broadcast_sum_reduce(r);
    test_all_sum_reduce();
    test_repartition();
    test_halo(r);
    ddl_traffic_reset();
    ddl_traffic      t;
    ddl_traffic_time tt;
    ddl_traffic_snapshot(&t);
    ddl_traffic_time_snapshot(&tt);
    for (int k = 0; k < DDL_TRAFFIC_NKINDS; k++) {
        for (int p = 0; p < DDL_TRAFFIC_NPASSES; p++) {
            ASSERT_EQ(t.c[k][p].sent + t.c[k][p].received + t.c[k][p].calls, 0);
            ASSERT_TRUE(tt.s[k][p] == 0);
        }
    }
    ASSERT_TRUE(strcmp(ddl_traffic_kind_name(DDL_TRAFFIC_HALO_EXCHANGE), "halo_exchange") == 0);
    if (r == 0) {
        printf("traffic: every primitive counted its payload exactly on 4 ranks\n");
    }
    return ddl_test_mpi_finalize();
}
