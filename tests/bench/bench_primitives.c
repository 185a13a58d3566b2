// bench-primitives: each primitive's forward and adjoint against the equivalent raw MPI
// call, measured in the same run on the same data volume.
//
//   mpirun -np 2 build/bin/bench-primitives [--sizes 16,64] [--reps 15]
//
// Per primitive and size it prints the median time of forward and adjoint, of the raw
// MPI reference, and their ratio (primitive / raw; target <= 1.10):
//   broadcast      root -> all            vs MPI_Bcast   / MPI_Reduce
//                  (and _inpl: x and y the same tensor on the root, as in MPI_Bcast)
//   sum_reduce     all -> root            vs MPI_Reduce  / MPI_Bcast
//   all_sum_reduce over all ranks         vs MPI_Allreduce
//   repartition    [P,1] -> [1,P]         vs MPI_Alltoallv of the same counts
//   halo_rows      [P,1] split, kernel 65 vs MPI_Sendrecv of the same (contiguous) ghost volume
//   halo_columns   [1,P] split, kernel 65 vs MPI_Sendrecv of the same strided ghosts
//                  (an MPI_Type_vector, as hand-written MPI code would send them)
// Times are maxima over ranks of each repetition (the collective's completion).
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddl/base.h"
#include "ddl/primitives.h"

static int rank, nprocs;

typedef struct timing {
    double med;
} timing;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// Median over reps of the slowest rank's time of fn(ctx).
typedef void (*bench_fn)(void *ctx);
static double bench(bench_fn fn, void *ctx, int reps)
{
    double *t = malloc(sizeof(double) * (size_t)reps);
    for (int w = 0; w < 2; w++) {
        fn(ctx);
    }
    for (int r = 0; r < reps; r++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        fn(ctx);
        double dt = MPI_Wtime() - t0, mx;
        MPI_Allreduce(&dt, &mx, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        t[r] = mx;
    }
    qsort(t, (size_t)reps, sizeof(double), cmp_double);
    double m = t[reps / 2];
    free(t);
    return m;
}

#define CHECK(x)                                                                      \
    do {                                                                              \
        ddl_status s_ = (x);                                                          \
        if (s_ != DDL_OK) {                                                           \
            fprintf(stderr, "%s failed: %s: %s\n", #x, ddl_status_name(s_), ddl_last_error()); \
            MPI_Abort(MPI_COMM_WORLD, 1);                                             \
        }                                                                             \
    } while (0)

// ---- contexts ---------------------------------------------------------------
typedef struct ctx {
    const void   *plan;
    ddl_tensor_t *a, *b;
    void         *ra, *rb;  // raw buffers
    int           count;
    MPI_Comm      comm;
    int          *sc, *sd, *rc, *rd;  // alltoallv
    int           left, right, halo_count;
    MPI_Datatype  halo_type;  // strided halo (columns): one element is the whole ghost
    int           halo_stride; // offset between the left and right regions (elements)
} ctx;

static void f_bcast_fwd(void *p) { ctx *c = p; ddl_broadcast_forward(c->plan, c->a, c->b); }
static void f_bcast_adj(void *p) { ctx *c = p; ddl_broadcast_adjoint(c->plan, c->b, c->a); }
static void f_red_fwd(void *p) { ctx *c = p; ddl_sum_reduce_forward(c->plan, c->a, c->b); }
static void f_red_adj(void *p) { ctx *c = p; ddl_sum_reduce_adjoint(c->plan, c->b, c->a); }
static void f_asr_fwd(void *p) { ctx *c = p; ddl_all_sum_reduce_forward(c->plan, c->a, c->b); }
static void f_rep_fwd(void *p) { ctx *c = p; ddl_repartition_forward(c->plan, c->a, c->b); }
static void f_rep_adj(void *p) { ctx *c = p; ddl_repartition_adjoint(c->plan, c->b, c->a); }
static void f_halo_fwd(void *p) { ctx *c = p; ddl_halo_exchange_forward(c->plan, c->a); }
static void f_halo_adj(void *p) { ctx *c = p; ddl_halo_exchange_adjoint(c->plan, c->a); }

static void raw_bcast(void *p) { ctx *c = p; MPI_Bcast(c->ra, c->count, MPI_FLOAT, 0, c->comm); }
static void raw_reduce(void *p)
{
    ctx *c = p;
    MPI_Reduce(c->ra, c->rb, c->count, MPI_FLOAT, MPI_SUM, 0, c->comm);
}
static void raw_allreduce(void *p)
{
    ctx *c = p;
    MPI_Allreduce(c->ra, c->rb, c->count, MPI_FLOAT, MPI_SUM, c->comm);
}
static void raw_alltoallv(void *p)
{
    ctx *c = p;
    MPI_Alltoallv(c->ra, c->sc, c->sd, MPI_FLOAT, c->rb, c->rc, c->rd, MPI_FLOAT, c->comm);
}
static void raw_sendrecv(void *p)
{
    ctx   *c  = p;
    float *a  = c->ra, *b = c->rb;
    int    hc = c->halo_count, off = c->halo_stride;
    // Both directions, as the halo exchange does: to the right and to the left. Strided
    // halos use an MPI vector datatype, as hand-written MPI code would.
    MPI_Datatype t  = c->halo_type != MPI_DATATYPE_NULL ? c->halo_type : MPI_FLOAT;
    int          ct = c->halo_type != MPI_DATATYPE_NULL ? 1 : hc;
    MPI_Sendrecv(a + off, ct, t, c->right, 1, b, ct, t, c->left, 1, c->comm, MPI_STATUS_IGNORE);
    MPI_Sendrecv(a, ct, t, c->left, 2, b + off, ct, t, c->right, 2, c->comm, MPI_STATUS_IGNORE);
}

static void report(const char *name, double mib, double fwd, double adj, double raw_f,
                   double raw_a, const char *raw_f_name, const char *raw_a_name)
{
    if (rank != 0) {
        return;
    }
    printf("%-15s np=%d %5.0f MiB  forward %8.3f ms  %-13s %8.3f ms  ratio %.3f\n", name, nprocs,
           mib, fwd * 1e3, raw_f_name, raw_f * 1e3, fwd / raw_f);
    printf("%-15s np=%d %5.0f MiB  adjoint %8.3f ms  %-13s %8.3f ms  ratio %.3f\n", name, nprocs,
           mib, adj * 1e3, raw_a_name, raw_a * 1e3, adj / raw_a);
    fflush(stdout);
}

static ddl_partition_t *part(int n, const int *ranks, int ndim, const int *shape)
{
    ddl_partition_t *P;
    CHECK(ddl_partition_create(MPI_COMM_WORLD, n, ranks, ndim, shape, &P));
    return P;
}

static ddl_tensor_t *tensor(const ddl_shape *s)
{
    ddl_tensor_t *t;
    CHECK(ddl_tensor_create(DDL_F32, s, &t));
    int64_t n = ddl_tensor_numel(t);
    float  *d = t->data;
    for (int64_t i = 0; i < n; i++) {
        d[i] = (float)((i + rank) % 13) * 0.25f;
    }
    return t;
}

static void bench_size(double mib, int reps)
{
    int64_t  n = (int64_t)(mib * 1024 * 1024 / 4);
    int      all[64], root[1] = {0};
    for (int i = 0; i < nprocs; i++) {
        all[i] = i;
    }
    MPI_Comm comm;
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    ddl_partition_t *P_all  = part(nprocs, all, 1, (int[]){nprocs});
    ddl_partition_t *P_root = part(1, root, 1, (int[]){1});
    ddl_shape        s1     = ddl_shape_make(1, (int64_t[]){n});
    float           *ra = NULL, *rb = NULL;
    MPI_Alloc_mem((MPI_Aint)(n * 4), MPI_INFO_NULL, &ra);
    MPI_Alloc_mem((MPI_Aint)(n * 4), MPI_INFO_NULL, &rb);
    memset(ra, 0, (size_t)n * 4);
    memset(rb, 0, (size_t)n * 4);
    ctx raw = {.ra = ra, .rb = rb, .count = (int)n, .comm = comm};

    // Broadcast root -> all, adjoint sum-reduce.
    {
        ddl_broadcast_t *b;
        CHECK(ddl_broadcast_create(P_root, P_all, false, false, DDL_F32, &s1, &b));
        ddl_shape xs = ddl_broadcast_x_shape(b), ys = ddl_broadcast_y_shape(b);
        ctx       c  = {.plan = b, .a = tensor(&xs), .b = tensor(&ys)};
        double    f = bench(f_bcast_fwd, &c, reps), a = bench(f_bcast_adj, &c, reps);
        double    rf = bench(raw_bcast, &raw, reps), rr = bench(raw_reduce, &raw, reps);
        report("broadcast", mib, f, a, rf, rr, "MPI_Bcast", "MPI_Reduce");
        // In place on the root (x and y the same tensor there), as MPI_Bcast itself is.
        ddl_tensor_t *keep_a = c.a;
        if (rank == 0) {
            c.a = c.b;
        }
        f = bench(f_bcast_fwd, &c, reps);
        a = bench(f_bcast_adj, &c, reps);
        report("broadcast_inpl", mib, f, a, rf, rr, "MPI_Bcast", "MPI_Reduce");
        c.a = keep_a;
        ddl_tensor_destroy(&c.a);
        ddl_tensor_destroy(&c.b);
        ddl_broadcast_destroy(&b);
    }
    // SumReduce all -> root, adjoint broadcast.
    {
        ddl_sum_reduce_t *r;
        CHECK(ddl_sum_reduce_create(P_all, P_root, false, false, DDL_F32, &s1, &r));
        ddl_shape xs = ddl_sum_reduce_x_shape(r), ys = ddl_sum_reduce_y_shape(r);
        ctx       c  = {.plan = r, .a = tensor(&xs), .b = tensor(&ys)};
        double    f = bench(f_red_fwd, &c, reps), a = bench(f_red_adj, &c, reps);
        double    rf = bench(raw_reduce, &raw, reps), rr = bench(raw_bcast, &raw, reps);
        report("sum_reduce", mib, f, a, rf, rr, "MPI_Reduce", "MPI_Bcast");
        ddl_tensor_t *keep_b = c.b;
        if (rank == 0) {
            c.b = c.a;
        }
        f = bench(f_red_fwd, &c, reps);
        a = bench(f_red_adj, &c, reps);
        report("sum_reduce_inpl", mib, f, a, rf, rr, "MPI_Reduce", "MPI_Bcast");
        c.b = keep_b;
        ddl_tensor_destroy(&c.a);
        ddl_tensor_destroy(&c.b);
        ddl_sum_reduce_destroy(&r);
    }
    // AllSumReduce over the one axis (self-adjoint: forward and adjoint are the same call).
    {
        ddl_all_sum_reduce_t *r;
        CHECK(ddl_all_sum_reduce_create(P_all, 1, (int[]){0}, DDL_F32, &s1, &r));
        ddl_shape xs = ddl_all_sum_reduce_shape(r);
        ctx       c  = {.plan = r, .a = tensor(&xs), .b = tensor(&xs)};
        double    f = bench(f_asr_fwd, &c, reps);
        double    rf = bench(raw_allreduce, &raw, reps);
        report("all_sum_reduce", mib, f, f, rf, rf, "MPI_Allreduce", "MPI_Allreduce");
        ddl_tensor_destroy(&c.a);
        ddl_tensor_destroy(&c.b);
        ddl_all_sum_reduce_destroy(&r);
    }
    // Repartition [P,1] -> [1,P] of a global [R, C] tensor: every rank sends a block to
    // every other rank (a full all-to-all); n elements per rank.
    {
        int64_t R = 1024 * nprocs, C = n / 1024;
        ddl_shape g = ddl_shape_make(2, (int64_t[]){R, C});
        ddl_partition_t *Px = part(nprocs, all, 2, (int[]){nprocs, 1});
        ddl_partition_t *Py = part(nprocs, all, 2, (int[]){1, nprocs});
        ddl_repartition_t *t;
        CHECK(ddl_repartition_create(Px, Py, DDL_F32, &g, NULL, &t));
        ddl_shape xs = ddl_repartition_x_shape(t), ys = ddl_repartition_y_shape(t);
        ctx       c  = {.plan = t, .a = tensor(&xs), .b = tensor(&ys)};
        double    f = bench(f_rep_fwd, &c, reps), a = bench(f_rep_adj, &c, reps);
        // The same counts as contiguous blocks: rank i sends block (i, j) of 1024 rows x
        // C/P columns to rank j.
        int *sc = malloc(sizeof(int) * 4 * (size_t)nprocs);
        int *sd = sc + nprocs, *rc = sd + nprocs, *rd = rc + nprocs;
        int  off = 0;
        for (int j = 0; j < nprocs; j++) {
            sc[j] = (int)(1024 * ddl_decomp_size(C, nprocs, j));
            sd[j] = off;
            off += sc[j];
        }
        off = 0;
        for (int j = 0; j < nprocs; j++) {
            rc[j] = (int)(1024 * ddl_decomp_size(C, nprocs, rank));
            rd[j] = off;
            off += rc[j];
        }
        ctx r2 = raw;
        r2.sc = sc;
        r2.sd = sd;
        r2.rc = rc;
        r2.rd = rd;
        double rf = bench(raw_alltoallv, &r2, reps);
        report("repartition", mib, f, a, rf, rf, "MPI_Alltoallv", "MPI_Alltoallv");
        free(sc);
        ddl_tensor_destroy(&c.a);
        ddl_tensor_destroy(&c.b);
        ddl_repartition_destroy(&t);
        ddl_partition_destroy(&Px);
        ddl_partition_destroy(&Py);
    }
    // HaloExchange of a [rows, 4096] tensor split along dim 0 (contiguous halos) and of
    // a [rows, 4096 P] tensor split along dim 1 (strided column halos), kernel 65 with
    // padding 32: 32 ghost rows (columns) on each interior side.
    for (int along = 0; along < 2; along++) {
        int64_t rows = n / 4096;
        ddl_shape g  = along == 0 ? ddl_shape_make(2, (int64_t[]){rows * nprocs, 4096})
                                  : ddl_shape_make(2, (int64_t[]){rows, 4096 * (int64_t)nprocs});
        int pshape[2] = {along == 0 ? nprocs : 1, along == 0 ? 1 : nprocs};
        ddl_partition_t *P = part(nprocs, all, 2, pshape);
        ddl_halo_exchange_t *h;
        int64_t k[2] = {along == 0 ? 65 : 1, along == 0 ? 1 : 65};
        int64_t s[2] = {1, 1}, d[2] = {1, 1};
        int64_t p[2] = {along == 0 ? 32 : 0, along == 0 ? 0 : 32};
        CHECK(ddl_halo_exchange_create(P, DDL_F32, &g, k, s, p, d, &h));
        ddl_shape bs = ddl_halo_exchange_shape(h);
        ctx       c  = {.plan = h, .a = tensor(&bs)};
        double    f = bench(f_halo_fwd, &c, reps), a = bench(f_halo_adj, &c, reps);
        ctx       r2 = raw;
        r2.halo_count  = (int)((along == 0 ? 4096 : rows) * 32);
        r2.halo_stride = along == 0 ? r2.halo_count : 4096 - 32;
        r2.halo_type   = MPI_DATATYPE_NULL;
        if (along == 1) {
            // rows x 32 columns of a [rows, 4096] block.
            MPI_Type_vector((int)rows, 32, 4096, MPI_FLOAT, &r2.halo_type);
            MPI_Type_commit(&r2.halo_type);
        }
        r2.left       = rank > 0 ? rank - 1 : MPI_PROC_NULL;
        r2.right      = rank < nprocs - 1 ? rank + 1 : MPI_PROC_NULL;
        double rf     = bench(raw_sendrecv, &r2, reps);
        report(along == 0 ? "halo_rows" : "halo_columns", mib, f, a, rf, rf,
               along == 0 ? "MPI_Sendrecv" : "Sendrecv(vec)", along == 0 ? "MPI_Sendrecv" : "Sendrecv(vec)");
        if (r2.halo_type != MPI_DATATYPE_NULL) {
            MPI_Type_free(&r2.halo_type);
        }
        ddl_tensor_destroy(&c.a);
        ddl_halo_exchange_destroy(&h);
        ddl_partition_destroy(&P);
    }
    MPI_Free_mem(ra);
    MPI_Free_mem(rb);
    MPI_Comm_free(&comm);
    ddl_partition_destroy(&P_all);
    ddl_partition_destroy(&P_root);
}

int main(int argc, char **argv)
{
    // Large temporaries (Open MPI's own, e.g. for an in-place MPI_Reduce) stay mapped.
    ddl_malloc_tune_for_streaming();
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nprocs);
    double sizes[8] = {16, 64};
    int    nsizes = 2, reps = 15;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc) {
            nsizes = 0;
            for (char *tok = strtok(argv[++i], ","); tok && nsizes < 8; tok = strtok(NULL, ",")) {
                sizes[nsizes++] = atof(tok);
            }
        } else {
            if (rank == 0) {
                fprintf(stderr, "usage: bench-primitives [--sizes MiB,MiB] [--reps N]\n");
            }
            MPI_Finalize();
            return 2;
        }
    }
    if (reps < 1 || nsizes < 1) {
        MPI_Finalize();
        return 2;
    }
    for (int i = 0; i < nsizes; i++) {
        bench_size(sizes[i], reps);
    }
    MPI_Finalize();
    return 0;
}
