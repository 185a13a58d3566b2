// decomposition/decomp.c: balanced decomposition and halo arithmetic (no MPI).
#include "base/check.h"
#include "ddl/decomp.h"

int64_t ddl_decomp_size(int64_t n, int64_t p, int64_t i)
{
    return n / p + (i < n % p ? 1 : 0);
}

int64_t ddl_decomp_start(int64_t n, int64_t p, int64_t i)
{
    int64_t r = n % p;
    return (n / p) * i + (i < r ? i : r);
}

ddl_box ddl_decomp_box(const ddl_shape *global, const int *pshape, const int *index)
{
    ddl_box b = {.ndim = global->ndim};
    for (int i = 0; i < global->ndim; i++) {
        b.start[i] = ddl_decomp_start(global->d[i], pshape[i], index[i]);
        b.stop[i]  = b.start[i] + ddl_decomp_size(global->d[i], pshape[i], index[i]);
    }
    return b;
}

int64_t ddl_index_ravel(int ndim, const int *shape, const int *coord)
{
    int64_t f = 0;
    for (int i = 0; i < ndim; i++) {
        f = f * shape[i] + coord[i];
    }
    return f;
}

void ddl_index_unravel(int ndim, const int *shape, int64_t flat, int *coord)
{
    for (int i = ndim - 1; i >= 0; i--) {
        coord[i] = (int)(flat % shape[i]);
        flat /= shape[i];
    }
}

// Raw (signed) halos and output share of piece i on the padded global length.
static void raw_halo(int64_t N, int64_t P, int64_t i, int64_t k, int64_t s, int64_t p, int64_t d,
                     ddl_halo_dim *h)
{
    int64_t Np  = N + 2 * p;
    h->n        = ddl_decomp_size(N, P, i);
    h->pad_lo   = (i == 0) ? p : 0;
    h->pad_hi   = (i == P - 1) ? p : 0;
    int64_t x0  = ddl_decomp_start(N, P, i) + (i == 0 ? 0 : p);  // start in padded coords
    int64_t len = h->pad_lo + h->n + h->pad_hi;
    int64_t m   = (Np - d * (k - 1) - 1) / s + 1;
    if (Np - d * (k - 1) - 1 < 0) {
        m = 0;
    }
    h->out_global = m;
    h->out_start  = ddl_decomp_start(m, P, i);
    h->out_n      = ddl_decomp_size(m, P, i);
    if (h->out_n == 0) {
        // Nothing to compute here: need none of the local input.
        h->halo_lo = -len;
        h->halo_hi = 0;
        return;
    }
    int64_t need_l = s * h->out_start;
    int64_t need_r = s * (h->out_start + h->out_n - 1) + d * (k - 1);
    if (need_l < 0) {
        need_l = 0;
    }
    if (need_r > Np - 1) {
        need_r = Np - 1;
    }
    h->halo_lo = x0 - need_l;
    h->halo_hi = need_r - (x0 + len - 1);
}

ddl_status ddl_halo_dim_compute(int64_t N, int64_t P, int64_t i, int64_t k, int64_t s, int64_t p,
                                int64_t d, ddl_halo_dim *out)
{
    DDL_REQUIRE(N >= 0 && P >= 1 && i >= 0 && i < P, DDL_EINVAL,
                "halo: piece %lld of %lld over length %lld is not valid", (long long)i,
                (long long)P, (long long)N);
    DDL_REQUIRE(k >= 1 && s >= 1 && p >= 0 && d >= 1, DDL_EINVAL,
                "halo: need kernel >= 1, stride >= 1, padding >= 0, dilation >= 1 "
                "(got kernel %lld, stride %lld, padding %lld, dilation %lld)",
                (long long)k, (long long)s, (long long)p, (long long)d);
    DDL_REQUIRE(N + 2 * p - d * (k - 1) - 1 >= 0, DDL_EINVAL,
                "halo: window of extent %lld (kernel %lld, dilation %lld) is larger than the "
                "padded input length %lld",
                (long long)(d * (k - 1) + 1), (long long)k, (long long)d, (long long)(N + 2 * p));
    ddl_halo_dim h = {0};
    raw_halo(N, P, i, k, s, p, d, &h);
    h.ghost_lo = h.halo_lo > 0 ? h.halo_lo : 0;
    h.ghost_hi = h.halo_hi > 0 ? h.halo_hi : 0;
    h.buf      = h.ghost_lo + h.pad_lo + h.n + h.pad_hi + h.ghost_hi;
    if (h.out_n == 0) {
        h.need_lo = h.need_hi = 0;
    } else {
        h.need_lo = h.halo_lo < 0 ? -h.halo_lo : 0;
        h.need_hi = h.buf - (h.halo_hi < 0 ? -h.halo_hi : 0);
    }
    // What the neighbours need from me, and whether their needs fit in one piece.
    ddl_halo_dim nb;
    if (i > 0) {
        raw_halo(N, P, i - 1, k, s, p, d, &nb);
        h.send_lo = nb.halo_hi > 0 ? nb.halo_hi : 0;
        int64_t mine = h.pad_lo + h.n + h.pad_hi;
        DDL_REQUIRE(h.send_lo <= mine, DDL_EINVAL,
                    "halo: piece %lld needs %lld elements from piece %lld, which holds only %lld "
                    "(a halo reaches only the immediate neighbour; use fewer pieces)",
                    (long long)(i - 1), (long long)h.send_lo, (long long)i, (long long)mine);
        int64_t nmine = nb.pad_lo + nb.n + nb.pad_hi;
        DDL_REQUIRE(h.ghost_lo <= nmine, DDL_EINVAL,
                    "halo: piece %lld needs %lld elements from piece %lld, which holds only %lld "
                    "(a halo reaches only the immediate neighbour; use fewer pieces)",
                    (long long)i, (long long)h.ghost_lo, (long long)(i - 1), (long long)nmine);
    } else {
        DDL_REQUIRE(h.ghost_lo == 0, DDL_EINVAL, "halo: internal: left halo on the first piece");
    }
    if (i < P - 1) {
        raw_halo(N, P, i + 1, k, s, p, d, &nb);
        h.send_hi = nb.halo_lo > 0 ? nb.halo_lo : 0;
        int64_t mine = h.pad_lo + h.n + h.pad_hi;
        DDL_REQUIRE(h.send_hi <= mine, DDL_EINVAL,
                    "halo: piece %lld needs %lld elements from piece %lld, which holds only %lld "
                    "(a halo reaches only the immediate neighbour; use fewer pieces)",
                    (long long)(i + 1), (long long)h.send_hi, (long long)i, (long long)mine);
        int64_t nmine = nb.pad_lo + nb.n + nb.pad_hi;
        DDL_REQUIRE(h.ghost_hi <= nmine, DDL_EINVAL,
                    "halo: piece %lld needs %lld elements from piece %lld, which holds only %lld "
                    "(a halo reaches only the immediate neighbour; use fewer pieces)",
                    (long long)i, (long long)h.ghost_hi, (long long)(i + 1), (long long)nmine);
    } else {
        DDL_REQUIRE(h.ghost_hi == 0, DDL_EINVAL, "halo: internal: right halo on the last piece");
    }
    *out = h;
    return DDL_OK;
}
