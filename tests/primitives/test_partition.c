// Partition tests: coordinates, local shapes, unions, the broadcast/reduce groups and
// their transpose variants, communicator hygiene (10,000 create/destroy cycles) and
// the creation orders that deadlocked DistDL (its issue 87).
#include <stdlib.h>
#include <string.h>

#include "ddl/base.h"
#include "mpi_test.h"

static void test_basic(void)
{
    int              shape[] = {2, 2};
    ddl_partition_t *P       = ddl_test_partition_range(0, 2, shape);
    ASSERT_EQ(ddl_partition_size(P), 4);
    if (ddl_test_rank < 4) {
        ASSERT_TRUE(ddl_partition_active(P));
        const int *idx = ddl_partition_index(P);
        ASSERT_EQ(idx[0], ddl_test_rank / 2);
        ASSERT_EQ(idx[1], ddl_test_rank % 2);
        ddl_shape g = ddl_shape_make(2, (int64_t[]){5, 4});
        ddl_shape l = ddl_partition_local_shape(P, &g);
        ASSERT_EQ(l.d[0], idx[0] == 0 ? 3 : 2);
        ASSERT_EQ(l.d[1], 2);
        int csize;
        MPI_Comm_size(ddl_partition_comm(P), &csize);
        ASSERT_EQ(csize, 4);
    } else {
        ASSERT_TRUE(!ddl_partition_active(P));
        ASSERT_TRUE(ddl_partition_comm(P) == MPI_COMM_NULL);
        ddl_shape g = ddl_shape_make(2, (int64_t[]){5, 4});
        ddl_shape l = ddl_partition_local_shape(P, &g);
        ASSERT_EQ(ddl_shape_numel(&l), 0);
    }
    ddl_partition_destroy(&P);
    ASSERT_TRUE(P == NULL);
}

static void test_invalid(void)
{
    int              world;
    ddl_partition_t *P = NULL;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    int r_over[] = {0, world};
    ASSERT_STATUS(ddl_partition_create(MPI_COMM_WORLD, 2, r_over, 1, (int[]){2}, &P), DDL_EINVAL);
    int r_dup[] = {0, 0};
    ASSERT_STATUS(ddl_partition_create(MPI_COMM_WORLD, 2, r_dup, 1, (int[]){2}, &P), DDL_EINVAL);
    int r_ok[] = {0, 1};
    ASSERT_STATUS(ddl_partition_create(MPI_COMM_WORLD, 2, r_ok, 2, (int[]){2, 2}, &P), DDL_EINVAL);
    // A shape whose product overflows int64 (2^64 wrapped to 0) is refused as too large.
    ASSERT_STATUS(ddl_partition_create(MPI_COMM_WORLD, 1, r_ok, 4,
                                       (int[]){65536, 65536, 65536, 65536}, &P),
                  DDL_EINVAL);
    ASSERT_TRUE(strstr(ddl_last_error(), "past INT_MAX") != NULL);
    ASSERT_TRUE(P == NULL);
}

// An allocation failing on one member only: every member fails alike (no member is left
// blocked in MPI_Comm_create_group).
static void test_one_rank_enomem(void)
{
    int world, rank;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int *ranks = malloc(sizeof(int) * (size_t)world);
    for (int i = 0; i < world; i++) {
        ranks[i] = i;
    }
    ddl_partition_t *P = NULL;
    if (rank == world - 1) {
        ddl_alloc_fail_after(1, 0);
    }
    ASSERT_STATUS(ddl_partition_create(MPI_COMM_WORLD, world, ranks, 1, (int[]){world}, &P),
                  DDL_ENOMEM);
    ddl_alloc_fail_after(0, 0);
    ASSERT_TRUE(P == NULL);
    ASSERT_OK(ddl_partition_create(MPI_COMM_WORLD, world, ranks, 1, (int[]){world}, &P));
    ddl_partition_destroy(&P);
    free(ranks);
}

static void test_union(void)
{
    ddl_partition_t *A = NULL, *B = NULL, *U = NULL;
    ASSERT_OK(ddl_partition_create(MPI_COMM_WORLD, 2, (int[]){2, 3}, 1, (int[]){2}, &A));
    ASSERT_OK(ddl_partition_create(MPI_COMM_WORLD, 3, (int[]){3, 0, 1}, 1, (int[]){3}, &B));
    ASSERT_OK(ddl_partition_union(A, B, &U));
    ASSERT_EQ(ddl_partition_size(U), 4);
    const int *r = ddl_partition_ranks(U);
    ASSERT_EQ(r[0], 2);
    ASSERT_EQ(r[1], 3);
    ASSERT_EQ(r[2], 0);
    ASSERT_EQ(r[3], 1);
    ddl_partition_destroy(&U);
    ddl_partition_destroy(&A);
    ddl_partition_destroy(&B);
}

// Communicator hygiene: many create/destroy cycles must not exhaust MPI's context ids.
static void test_no_leak(void)
{
    for (int i = 0; i < 10000; i++) {
        ddl_partition_t *P = ddl_test_partition_range(0, 2, (int[]){2, 2});
        ddl_partition_destroy(&P);
    }
}

// Checks which base ranks a rank's groups contain for a broadcast P_x -> P_y.
static int group_root(const ddl_group *g)
{
    return g->member ? g->root : -1;
}

// DistDL's transpose example: P_x [2,2,1] (ranks 0..3) with transpose_src feeds P_y
// [3,2,2] (ranks 0..11): source (a,b,0) feeds destinations (k,a,b).
static void test_transpose_groups(void)
{
    ddl_partition_t *Px = ddl_test_partition_range(0, 3, (int[]){2, 2, 1});
    ddl_partition_t *Py = ddl_test_partition_range(0, 3, (int[]){3, 2, 2});
    ddl_group_pair   g;
    ASSERT_OK(ddl_group_pair_broadcast(Px, Py, true, false, &g));
    if (ddl_test_rank < 12) {
        int k = ddl_test_rank / 4, a = (ddl_test_rank / 2) % 2, b = ddl_test_rank % 2;
        (void)k;
        // Source (a,b,0) sits at position a*2+b of P_x, i.e. base rank a*2+b.
        ASSERT_EQ(group_root(&g.recv), a * 2 + b);
        ASSERT_EQ(g.recv.size, 3);
    }
    ddl_group_pair_free(&g);
    // DistributedLinear's reduction: P_w [2,3] with transpose_src onto P_y [1,2]:
    // worker (r,c) reduces into P_y worker (0,r).
    ddl_partition_t *Pw  = ddl_test_partition_range(0, 2, (int[]){2, 3});
    ddl_partition_t *Pyl = ddl_test_partition_range(6, 2, (int[]){1, 2});
    ASSERT_OK(ddl_group_pair_reduce(Pw, Pyl, true, false, &g));
    if (ddl_test_rank < 6) {
        ASSERT_EQ(group_root(&g.send), 6 + ddl_test_rank / 3);
        ASSERT_EQ(g.send.size, 4);
    }
    ddl_group_pair_free(&g);
    // Rule violations are refused alike on every rank.
    ddl_partition_t *P13 = ddl_test_partition_range(0, 2, (int[]){1, 3});
    ddl_partition_t *P31 = ddl_test_partition_range(0, 2, (int[]){3, 1});
    ASSERT_STATUS(ddl_group_pair_broadcast(P13, P31, false, false, &g), DDL_EINVAL);
    ASSERT_OK(ddl_group_pair_broadcast(P13, P31, true, false, &g));
    ddl_group_pair_free(&g);
    ddl_partition_destroy(&P13);
    ddl_partition_destroy(&P31);
    ddl_partition_destroy(&Pw);
    ddl_partition_destroy(&Pyl);
    ddl_partition_destroy(&Px);
    ddl_partition_destroy(&Py);
}

// DistDL issue 87: group creation orders that deadlocked.
static void test_deadlock_orders(void)
{
    int world;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    ddl_partition_t *Px = NULL, *Pw = NULL;
    ASSERT_OK(ddl_partition_create(MPI_COMM_WORLD, 2, (int[]){1, 2}, 2, (int[]){1, 2}, &Px));
    ASSERT_OK(ddl_partition_create(MPI_COMM_WORLD, 4, (int[]){0, 1, 2, 3}, 2, (int[]){2, 2}, &Pw));
    ddl_group_pair g;
    ASSERT_OK(ddl_group_pair_broadcast(Px, Pw, false, false, &g));
    ddl_group_pair_free(&g);
    ASSERT_OK(ddl_group_pair_reduce(Pw, Px, false, false, &g));
    ddl_group_pair_free(&g);
    ddl_partition_destroy(&Px);
    ddl_partition_destroy(&Pw);
    if (world >= 8) {
        ASSERT_OK(ddl_partition_create(MPI_COMM_WORLD, 4, (int[]){2, 3, 4, 5}, 3, (int[]){1, 2, 2},
                                       &Px));
        ASSERT_OK(ddl_partition_create(MPI_COMM_WORLD, 8, (int[]){0, 1, 2, 3, 4, 5, 6, 7}, 3,
                                       (int[]){2, 2, 2}, &Pw));
        ASSERT_OK(ddl_group_pair_broadcast(Px, Pw, false, false, &g));
        ddl_group_pair_free(&g);
        ASSERT_OK(ddl_group_pair_reduce(Pw, Px, false, false, &g));
        ddl_group_pair_free(&g);
        ddl_partition_destroy(&Px);
        ddl_partition_destroy(&Pw);
    }
}

int main(int argc, char **argv)
{
    ddl_test_mpi_init(&argc, &argv);
    ddl_test_require_ranks(4);
    test_basic();
    test_invalid();
    test_one_rank_enomem();
    test_union();
    test_deadlock_orders();
    int world;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (world >= 12) {
        test_transpose_groups();
    }
    test_no_leak();
    return ddl_test_mpi_finalize();
}
