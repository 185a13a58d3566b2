// kernels/conv.c: 1-D, 2-D and 3-D convolution (PyTorch Conv{1,2,3}d, groups = 1) as
// im2col + GEMM, with a direct nested-loop reference beside it.
//
//   y[n, co, o] = b[co] + sum_{ci, kk} w[co, ci, kk] * x[n, ci, o*s - p + kk*d]
//   x [N, C_in, in...], w [C_out, C_in, k...], b [C_out], y [N, C_out, out...]
// (x is zero outside [0, in)). Dimension letters: N batch, Ci/Co channels, ov = prod(out)
// output positions, iv = prod(in), Kc = Ci * prod(k) rows of the column matrix.
//
// The column matrix of sample n is col[(ci, kk), j] = x[n, ci, o(j)*s - p + kk*d], so
//   forward     y_n [Co, ov]  = W [Co, Kc] · col [Kc, ov]            (+ b)
//   backward    dW  [Co, Kc] += dy_n [Co, ov] · col^T
//               dcol [Kc, ov] = W^T · dy_n,  dx_n += col2im(dcol)   (the adjoint of im2col)
// (Chellapilla et al. 2006; cs231n "Convolutional Networks", im2col).
//
// Performance: the column matrix is built in blocks of output positions sized to stay in
// L2 (DDL_CONV_BLOCK_BYTES), so im2col writes and the GEMM reads hit cache (measured: a
// GEMM per block is faster than one over the whole column matrix). When one sample has fewer
// positions than a block, several samples share a block (one larger GEMM) and the output goes
// through a staging block. Along the innermost spatial dimension im2col copies contiguous runs
// (memcpy when the stride is 1) and zero-fills the padding; col2im adds runs back.
// 1x1 convolutions with stride 1 and no padding skip im2col (x is its own column matrix).
// Direct path (kernels/conv_direct.h): 1-D/2-D/3-D convolutions with stride 1 run without
// a column matrix or GEMM, in AVX2 or AVX-512 register tiles over the padded sample,
// where the CPU has them: for C_in <= 8 at either width (LeNet: the im2col GEMMs there
// have K = 25 or M = 6), for any C_in at AVX-512; see conv_plan_make and the figures in
// docs/PERFORMANCE.md. 3-D samples use the same grid over the padded volume (see
// cdir_setup); a sample whose direct workspace would exceed DDL_CDIR_MAX_SLOT (large
// volumes) takes the im2col path. The im2col path below stays the fallback
// (DDL_CONV_DIRECT=0).
// Small 1-D/2-D samples with stride 1 use the "wide" layout instead of runs (see
// conv_forward_wide): one padded copy of the sample, then one contiguous slice per column
// row; the workspace then also holds that padded sample.
//
// Threads: splitting each GEMM would leave im2col/col2im on one core, and these GEMMs are
// mid-sized and many. When the kernel width is T > 1 (ddl_blas_set_threads) and the batch
// has enough independent blocks and work, the block loop is split instead into T parts,
// each a fixed contiguous range of blocks with its own im2col workspace and (backward) its
// own dW accumulator, run on the process's persistent kernel thread pool
// (kernels/threadpool.h: the caller and up to T - 1 sleeping workers, no thread created
// per call), with the width set to 1 for the region (restored after) so that the GEMMs
// inside a part run whole (OpenBLAS is single-threaded throughout, see kernels/gemm.c). The dW
// partials are added into dw in part order, so results are deterministic run to run for a given T,
// whichever threads ran the parts. db and the direct (1x1) path stay sequential.
// ddl_conv_workspace_bytes reports room for the thread count current when it is called; a smaller
// workspace than that (threads raised later) just runs with as many threads as it has room for,
// down to the sequential loop. Not collective; allocates nothing (the pool creates its workers once
// per process).
#include <limits.h>
#include <string.h>

#include "base/check.h"
#include "ddl/kernels.h"
#include "kernels/window.h"
#include "kernels/dtype.h"
#include "kernels/threadpool.h"
#include "kernels/conv_direct.h"

// Target size of one im2col block: half of a 1 MiB L2, leaving room for W and the output
// block. Measured on the 64->64, 56x56, 3x3 case (see tests/bench/bench_kernels.c).
#define DDL_CONV_BLOCK_BYTES ((size_t)512 * 1024)
// Fewest columns per block, so that very deep inputs (large Kc) still give GEMMs with a
// reasonable N.
#define DDL_CONV_MIN_COLS 128
// The channel-vector path (ddl_cvec in kernels/conv_direct.h) is taken for output planes of
// at most DDL_CVEC_MAX_OV positions, or 4x that with strides, when both channel counts are
// whole vectors and C_out at least two. Measured on AMD EPYC (Zen 5) at AVX-512, f32, batch
// 64, one thread, forward + backward against the path it replaced (docs/PERFORMANCE.md,
// "Channels in the vector lanes"): ResNet's 64->64 4x4 1.04 against 2.24 ms, 32->64
// 7x7 -> 4x4 stride 2 0.60 against 1.87, 32->32 7x7 0.93 against 1.13; but 32->32 28x28
// 17.7 against 13.6 and 16->16 14x14 1.5 against 1.0, which stay on the other paths.
#define DDL_CVEC_MAX_OV 64
// Rows (sample x output position) per kernel call: the samples of a group share the
// kernels' tiles and the weights' pass through L1.
#define DDL_CVEC_ROWS 256

// ---- geometry ----------------------------------------------------------------

// The spatial geometry as three dimensions, the leading ones padded with extent 1, so
// every loop below is a fixed 3-deep nest whatever nsp is.
typedef struct conv_plan {
    sp3     sp;
    int64_t Kc;          // C_in * kv: rows of the column matrix
    bool    direct;      // 1x1, stride 1, no padding: x_n is its own column matrix
    int64_t nb;          // samples per block (> 1 only when a sample is smaller than a block)
    int64_t cols;        // columns per block (a piece of one sample, or nb whole samples)
    size_t  col_bytes;   // im2col block, rounded up to DDL_ALIGN
    size_t  stage_bytes; // output staging block, used when nb > 1 (rounded up)
    // The "wide" layout (see conv_forward_wide), for small samples with stride 1:
    bool    wide;
    int64_t I2p;         // padded input row length
    int64_t PL;          // elements per padded depth plane: I1p * I2p (3-D direct path)
    // (Direct path with strides: I2p and PL are those of one phase volume, see below.)
    int64_t cd_nph;      // direct path: phases of the padded sample, s0 s1 s2 (1: no strides)
    int64_t cd_RV;       // direct path: elements per phase volume (the whole padded sample
                         // when the strides are 1)
    int64_t Ws;          // columns per sample: out[1] * I2p
    int64_t Pp;          // elements per padded channel plane, with its zero tail
    size_t  pad_bytes;   // one padded sample [C_in, Pp]
    // The direct path for few input channels (kernels/conv_direct.h), on the wide grid:
    // no column matrix; the workspace slot (col_bytes) holds xp, dyw, dxp, mask, offsets.
    bool    cdir;
    int64_t cd_M;        // largest tap offset within a plane: dyw's zero margin
    int64_t cd_ldy;      // row stride of dyw: margin + max(nj, nq)
    int64_t cd_nj, cd_nq;
    bool    cd_dx_scatter; // dx by ddl_cdir_dx_scatter, not the gather (conv_plan_make)
    bool    cd_inplace;    // the kernels read x itself, not a padded copy xp (g->x_tail)
    int64_t cd_tail;       // elements past a sample's end the direct path reads in place
    int64_t cd_group;      // samples per forward and dW kernel call (the slot holds that
                           // many dyw and xp)
    // The channel-vector path (ddl_cvec): nb samples per kernel call, padded as one
    // [C_in, Pp] volume each (Pp = I0p PL, PL = I1p I2p); the slot (col_bytes) holds
    // cvec_ws.
    bool cvec;
    // Per call (ddl_conv_backward_ex): dx is set (overwritten), not added into.
    bool dx_set;
} conv_plan;

// The direct kernels' tap offsets in a thread's slot: toff [Kc], dx's dtoff [Kc] when x is
// read in place (otherwise dtoff is toff) and koff [kv], as int64, DDL_ALIGN-rounded.
static size_t cdir_offs_bytes(const conv_plan *P, bool inplace)
{
    size_t n = (size_t)((inplace ? 2 : 1) * P->Kc + P->sp.kv) * sizeof(int64_t);
    return (n + DDL_ALIGN - 1) / DDL_ALIGN * DDL_ALIGN;
}

ddl_status ddl_conv_geom_init(ddl_conv_geom *g, int nsp, int64_t N, int64_t C_in,
                              int64_t C_out, const int64_t *in, const int64_t *k,
                              const int64_t *stride, const int64_t *pad,
                              const int64_t *dilation)
{
    DDL_REQUIRE(g != NULL, DDL_EINVAL, "conv: geometry pointer is NULL");
    DDL_REQUIRE(nsp >= 1 && nsp <= 3, DDL_EINVAL, "conv: %d spatial dimensions, expected 1..3",
                nsp);
    DDL_REQUIRE(in != NULL && k != NULL, DDL_EINVAL, "conv: input or kernel extents are NULL");
    DDL_REQUIRE(N >= 0 && C_in >= 0 && C_out >= 0, DDL_EINVAL,
                "conv: negative size N=%lld C_in=%lld C_out=%lld", (long long)N,
                (long long)C_in, (long long)C_out);
    ddl_conv_geom t = {.nsp = nsp, .N = N, .C_in = C_in, .C_out = C_out};
    int64_t       iv = 1, ov = 1, kv = 1;
    for (int i = 0; i < 3; i++) {
        t.in[i] = t.k[i] = t.s[i] = t.d[i] = t.out[i] = 1;
        t.p[i] = 0;
    }
    for (int i = 0; i < nsp; i++) {
        t.in[i] = in[i];
        t.k[i]  = k[i];
        t.s[i]  = stride ? stride[i] : 1;
        t.p[i]  = pad ? pad[i] : 0;
        t.d[i]  = dilation ? dilation[i] : 1;
        DDL_REQUIRE(t.in[i] >= 1 && t.in[i] <= INT_MAX, DDL_EINVAL,
                    "conv: input extent in[%d] = %lld, expected 1..INT_MAX", i,
                    (long long)t.in[i]);
        DDL_REQUIRE(t.k[i] >= 1 && t.k[i] <= INT_MAX, DDL_EINVAL,
                    "conv: kernel extent k[%d] = %lld, expected >= 1", i, (long long)t.k[i]);
        DDL_REQUIRE(t.s[i] >= 1 && t.s[i] <= INT_MAX, DDL_EINVAL,
                    "conv: stride s[%d] = %lld, expected >= 1", i, (long long)t.s[i]);
        DDL_REQUIRE(t.d[i] >= 1 && t.d[i] <= INT_MAX, DDL_EINVAL,
                    "conv: dilation d[%d] = %lld, expected >= 1", i, (long long)t.d[i]);
        DDL_REQUIRE(t.p[i] >= 0 && t.p[i] <= INT_MAX, DDL_EINVAL,
                    "conv: padding p[%d] = %lld, expected >= 0", i, (long long)t.p[i]);
        int64_t extent = t.d[i] * (t.k[i] - 1) + 1;
        int64_t padded = t.in[i] + 2 * t.p[i];
        DDL_REQUIRE(extent <= padded, DDL_EINVAL,
                    "conv: dim %d: dilated kernel extent %lld (k=%lld, d=%lld) exceeds the "
                    "padded input %lld (in=%lld + 2*pad=%lld)",
                    i, (long long)extent, (long long)t.k[i], (long long)t.d[i],
                    (long long)padded, (long long)t.in[i], (long long)t.p[i]);
        t.out[i] = (padded - extent) / t.s[i] + 1;
        DDL_REQUIRE(mul_ok(iv, t.in[i], &iv) && mul_ok(ov, t.out[i], &ov) &&
                        mul_ok(kv, t.k[i], &kv),
                    DDL_EINVAL, "conv: spatial volume overflows");
    }
    // GEMM sizes and leading dimensions are BLAS ints; whole tensors are int64 indexed.
    int64_t Kc, tmp;
    DDL_REQUIRE(iv <= INT_MAX && ov <= INT_MAX && mul_ok(C_in, kv, &Kc) && Kc <= INT_MAX,
                DDL_EINVAL, "conv: per-sample sizes exceed INT_MAX (in %lld, out %lld)",
                (long long)iv, (long long)ov);
    DDL_REQUIRE(mul_ok(N, C_in, &tmp) && mul_ok(tmp, iv, &tmp) && mul_ok(N, C_out, &tmp) &&
                    mul_ok(tmp, ov, &tmp) && mul_ok(C_out, Kc, &tmp),
                DDL_EINVAL, "conv: tensor sizes overflow int64");
    *g = t;
    return DDL_OK;
}

static sp3 sp3_from(const ddl_conv_geom *g)
{
    return sp3_make(g->nsp, g->in, g->k, g->s, g->p, g->d, g->out);
}

// ---- the channel-vector path's workspace ---------------------------------------------

// One thread's slot: nb padded samples xp [nb, Ci, Pp], the rows yT (dyT) [nb ov, Co], the
// transposed padded input gradient dxpT [nb, Pp, Ci], wT [Kc, Co], wK [kv, Co, Ci], the dW
// sums dWT [Kc, Co] and the offsets ob [ov], koff [kv], toff [Kc].
typedef struct cvec_ws {
    char    *xp, *yT, *dxpT, *wT, *wK, *dWT;
    int64_t *ob, *koff, *toff;
    ddl_cvec c;
} cvec_ws;

static size_t cvec_round(size_t v)
{
    return (v + DDL_ALIGN - 1) / DDL_ALIGN * DDL_ALIGN;
}

// Carves ws (NULL: only sizes) into d; returns the slot's bytes.
static size_t cvec_carve(ddl_dtype dt, const ddl_conv_geom *g, const conv_plan *P, char *ws,
                         cvec_ws *d)
{
    const size_t  es = dt_size(dt);
    const int64_t G = P->nb, Ci = g->C_in, Co = g->C_out, Kc = P->Kc, ov = P->sp.ov;
    const size_t  parts[9] = {(size_t)(G * Ci * P->Pp) * es, (size_t)(G * ov * Co) * es,
                              (size_t)(G * P->Pp * Ci) * es, (size_t)(Kc * Co) * es,
                              (size_t)(Kc * Co) * es,        (size_t)(Kc * Co) * es,
                              (size_t)ov * sizeof(int64_t),  (size_t)P->sp.kv * sizeof(int64_t),
                              (size_t)Kc * sizeof(int64_t)};
    char         *at[9];
    size_t        off = 0;
    for (int i = 0; i < 9; i++) {
        at[i] = ws != NULL ? ws + off : NULL;
        off += cvec_round(parts[i]);
    }
    if (d != NULL) {
        *d = (cvec_ws){.xp   = at[0],
                       .yT   = at[1],
                       .dxpT = at[2],
                       .wT   = at[3],
                       .wK   = at[4],
                       .dWT  = at[5],
                       .ob   = (int64_t *)(void *)at[6],
                       .koff = (int64_t *)(void *)at[7],
                       .toff = (int64_t *)(void *)at[8]};
    }
    return off;
}

static size_t cvec_slot(ddl_dtype dt, const ddl_conv_geom *g, const conv_plan *P)
{
    return cvec_carve(dt, g, P, NULL, NULL);
}

// Re-validates g (it is a public struct the caller may have edited) and derives the plan:
// how many columns an im2col block has and how much workspace that takes.
static ddl_status conv_plan_make(const char *who, ddl_dtype dt, const ddl_conv_geom *g,
                                 conv_plan *P, bool allow_cdir)
{
    DDL_REQUIRE(dt == DDL_F32 || dt == DDL_F64, DDL_EINVAL, "%s: unknown dtype %d", who,
                (int)dt);
    DDL_REQUIRE(g != NULL, DDL_EINVAL, "%s: geometry is NULL", who);
    DDL_REQUIRE(g->x_tail >= 0, DDL_EINVAL, "%s: geometry x_tail = %lld, expected >= 0", who,
                (long long)g->x_tail);
    ddl_conv_geom chk;
    DDL_CHECK(ddl_conv_geom_init(&chk, g->nsp, g->N, g->C_in, g->C_out, g->in, g->k, g->s,
                                 g->p, g->d));
    for (int i = 0; i < 3; i++) {
        DDL_REQUIRE(chk.out[i] == g->out[i], DDL_EINVAL,
                    "%s: geometry out[%d] = %lld but in/k/s/p/d give %lld (use "
                    "ddl_conv_geom_init)",
                    who, i, (long long)g->out[i], (long long)chk.out[i]);
    }
    memset(P, 0, sizeof(*P));
    P->sp     = sp3_from(g);
    P->Kc     = g->C_in * P->sp.kv;
    P->direct = true;
    for (int i = 0; i < 3; i++) {
        if (P->sp.k[i] != 1 || P->sp.s[i] != 1 || P->sp.p[i] != 0) {
            P->direct = false;
        }
    }
    if (P->direct || P->Kc == 0 || g->N == 0 || g->C_out == 0) {
        P->nb   = 1;
        P->cols = P->sp.ov;
        return DDL_OK; // no workspace
    }
    size_t  es     = dt_size(dt);
    int64_t target = (int64_t)(DDL_CONV_BLOCK_BYTES / ((size_t)P->Kc * es));
    if (target < DDL_CONV_MIN_COLS) {
        target = DDL_CONV_MIN_COLS;
    }
    int64_t ov = P->sp.ov;
    size_t  a  = DDL_ALIGN;
    // Wide layout: 1-D or 2-D, stride 1, several whole samples per block, and at most
    // half of each wide row wasted on the (k2 - 1) d2 columns past the output row.
    const sp3 *sp  = &P->sp;
    int64_t    I2p = sp->in[2] + 2 * sp->p[2], I1p = sp->in[1] + 2 * sp->p[1];
    // The channel-vector path, for small output planes (DDL_CVEC_MAX_OV).
    const int64_t lanes   = ddl_cvec_lanes(dt);
    const bool    strided = sp->s[0] * sp->s[1] * sp->s[2] > 1;
    if (allow_cdir && lanes > 0 && g->C_in % lanes == 0 && g->C_out % lanes == 0 &&
        g->C_out >= 2 * lanes &&
        (ov <= DDL_CVEC_MAX_OV || (strided && ov <= 4 * DDL_CVEC_MAX_OV))) {
        // Planned on a copy, kept only if its slot stays within the direct path's bound:
        // a small output of a large input (large strides) would pad copies past it, and
        // the other paths take that.
        conv_plan     Q   = *P;
        const int64_t I0p = sp->in[0] + 2 * sp->p[0], G = (DDL_CVEC_ROWS + ov - 1) / ov;
        Q.cvec      = true;
        Q.nb        = G < g->N ? G : g->N;
        Q.cols      = Q.nb * ov;
        Q.I2p       = I2p;
        Q.PL        = I1p * I2p;
        Q.Pp        = I0p * Q.PL;
        Q.col_bytes = cvec_slot(dt, g, &Q);
        if (Q.col_bytes <= DDL_CDIR_MAX_SLOT) {
            *P = Q;
            return DDL_OK;
        }
    }
    // The direct path: for few input channels at either width; for any at AVX-512, where
    // it outruns the BLAS's AVX2 GEMM (see conv_direct.h), while its dW lane
    // accumulators (C_out Kc x 64 bytes) stay within DDL_CDIR_MAX_ACC.
    bool cdir_ok = g->C_in <= DDL_CDIR_MAX_CIN ||
                   (ddl_cdir_level() == 2 &&
                    (size_t)g->C_out * (size_t)P->Kc <= DDL_CDIR_MAX_ACC / DDL_CDIR_LANE_BYTES);
    // Strides: the direct path stores the padded sample as s0 s1 s2 phase volumes of
    // R0 x R1 x R2 (R_i = ceil(Ip_i / s_i)), phase (a0, a1, a2) holding the padded elements
    // at (r0 s0 + a0, r1 s1 + a1, r2 s2 + a2). Output o reads tap k at phase
    // (k_i d_i mod s_i), position o_i + (k_i d_i div s_i): a stride-1 tap again, one offset
    // on the grid j = o0 R1 R2 + o1 R2 + o2 (cdir_setup). With strides 1, R_i = Ip_i.
    // The grid spans out[0] planes of PL = R1 R2 positions; the columns past out[2] in each
    // row, and in 3-D the rows past out[1] in each plane, are garbage, so at most half of
    // them may be.
    const int64_t I0p = sp->in[0] + 2 * sp->p[0], Ip[3] = {I0p, I1p, I2p};
    int64_t       R[3], nph                             = 1, sh[3];
    for (int i = 0; i < 3; i++) {
        R[i]  = (Ip[i] + sp->s[i] - 1) / sp->s[i];
        sh[i] = (sp->k[i] - 1) * sp->d[i] / sp->s[i]; // the largest tap shift
        nph *= sp->s[i];
    }
    const int64_t PL = R[1] * R[2], RV = R[0] * PL;
    // Every phase must be read by some tap, or the layout copies input nobody reads: a 1x1
    // convolution with stride 2 reads one phase of four (measured: 2.4x slower than the
    // im2col path, which gathers just those).
    for (int i = 0; i < 3 && cdir_ok; i++) {
        uint64_t seen = 0;
        for (int64_t kk = 0; sp->s[i] <= 64 && kk < sp->k[i]; kk++) {
            seen |= 1ull << (kk * sp->d[i] % sp->s[i]);
        }
        cdir_ok = sp->s[i] == 1 ||
                  (sp->s[i] <= 64 && seen == (sp->s[i] == 64 ? ~0ull : (1ull << sp->s[i]) - 1));
    }
    // With strides, small outputs waste too much of the grid's vectors (ResNet's 7x7 ->
    // 4x4: 32 positions for 16 outputs, backward 0.75x the im2col path's speed): the
    // grid must stay within 1.5x the outputs. The grid: Ws positions (j = o0 PL + o1 R2 + o2,
    // o0 = 0 for 1-D and 2-D), rounded up to whole runs of DDL_CDIR_ALIGN (nj).
    const int64_t A = DDL_CDIR_ALIGN, Ws = (sp->out[0] - 1) * PL + sp->out[1] * R[2];
    const int64_t nj = (Ws + A - 1) / A * A;
    cdir_ok          = cdir_ok && (nph == 1 || 2 * nj <= 3 * sp->ov);
    if (allow_cdir && cdir_ok && 2 * (R[2] - sp->out[2]) <= R[2] &&
        (sp->out[0] == 1 || 2 * (R[1] - sp->out[1]) <= R[1]) && ddl_cdir_enabled()) {
        // Direct path: per sample, the padded planes xp and dxp [C_in, Pp], dy (or y) on
        // the wide grid with a zero margin in front [C_out, ldy], the dW mask [nj] and the
        // tap offsets. Pp leaves room for the last run of every tap and for dx's runs.
        // The margin and the row stride are multiples of 16 elements, so that every row
        // of dyw starts on a 64-byte boundary (the workspace is DDL_ALIGN-aligned).
        int64_t M  = sh[0] * PL + sh[1] * R[2] + sh[2];
        M          = (M + 15) / 16 * 16;
        int64_t nq = (nph * RV + A - 1) / A * A;
        // The last phase's taps read up to (nph - 1) RV + M + nj.
        int64_t Pp     = nph * RV + sh[2];
        Pp             = Pp > (nph - 1) * RV + M + nj ? Pp : (nph - 1) * RV + M + nj;
        Pp             = Pp > nq ? Pp : nq;
        int64_t ldy    = M + (nj > nq ? nj : nq);
        size_t  planes = ((size_t)g->C_in * (size_t)Pp * es + a - 1) / a * a;
        size_t  dyw    = ((size_t)g->C_out * (size_t)ldy * es + a - 1) / a * a;
        size_t  mask   = ((size_t)nj * es + a - 1) / a * a;
        size_t  lanes  = (size_t)g->C_out * (size_t)P->Kc * DDL_CDIR_LANE_BYTES;
        // The direct dx gathers over every padded input position (nq) for every tap,
        // against ov per tap for the forward: with unpadded small planes (LeNet's conv2:
        // 224 against 100) that is over twice the work, and the scatter over the wide
        // grid (nj = 160 per tap) wins (0.93 against 2.1 ms at AVX-512).
        // With many input channels the scatter's tile (6 channels x 4 vectors, 24 FMAs per
        // 4 loads and 6 broadcasts) also beats the gather's: 64->64 56x56 at AVX-512,
        // 41 against 44 ms.
        // With strides the gather would need a margin per phase: the scatter always.
        // The scatter reads w in its tile order, packed once per call (wpack).
        bool   scatter = 2 * nq > 3 * sp->ov || g->C_in >= 6 || nph > 1;
        size_t wpack   = scatter ? ((size_t)g->C_out * (size_t)P->Kc * es + a - 1) / a * a : 0;
        // Without padding or strides the padded sample is the sample itself, planes RV
        // apart: the kernels can read x in place, if they may read past its end. A run of
        // the last valid positions reads up to the largest tap offset plus nj, that is
        // sh2 + (nj - Ws) past a sample's end (Ws + sh0 PL + sh1 R2 + sh2 = RV + sh2).
        bool    unpadded = nph == 1 && sp->p[0] == 0 && sp->p[1] == 0 && sp->p[2] == 0;
        int64_t tail     = sh[0] * PL + sh[1] * R[2] + sh[2] + nj - RV;
        tail             = tail > 0 ? tail : 0;
        bool   inplace   = unpadded && g->x_tail >= tail;
        // dW in groups of samples (ddl_cdir_dw's ns) where a sample's grid is short next
        // to the dW accumulators, which the kernel loads and stores once per call: ResNet's
        // 32->32 7x7 convolution, 590 KB of accumulators against 32 KB of dyw and xp per
        // sample, spent more time moving them than in its FMAs. The group's dyw and xp
        // take G slots each; large samples keep G = 1 (and their workspace). At most half
        // the batch: the slot never holds a padded copy of all of it (a layer's own halo
        // buffer is that copy, and sharing it must not cost more than keeping it).
        size_t  per   = (inplace ? 0 : planes) + dyw;
        int64_t group = (int64_t)(lanes / per);
        group         = group < ddl_cdir_dw_group() ? group : ddl_cdir_dw_group();
        group         = group < g->N / 2 ? group : g->N / 2;
        group         = group > 1 ? group : 1;
        size_t slot = (inplace ? 0 : (size_t)group * planes) + planes + (size_t)group * dyw + mask +
                      cdir_offs_bytes(P, inplace) + lanes + wpack;
        if (slot > DDL_CDIR_MAX_SLOT && group > 1) {
            slot -= (size_t)(group - 1) * per;
            group = 1;
        }
        if (slot <= DDL_CDIR_MAX_SLOT) {
            P->cdir      = true;
            P->I2p       = R[2];
            P->PL        = PL;
            P->cd_nph    = nph;
            P->cd_RV     = RV;
            P->Ws        = Ws;
            P->nb        = 1;
            P->cols      = Ws;
            P->cd_M      = M;
            P->cd_nj     = nj;
            P->cd_nq     = nq;
            P->Pp        = Pp;
            P->cd_ldy    = ldy;
            P->col_bytes = slot;
            P->cd_inplace = inplace;
            P->cd_tail    = unpadded ? tail : 0;
            P->cd_group      = group;
            P->cd_dx_scatter = scatter;
            return DDL_OK;
        }
    }
    if (sp->out[0] == 1 && sp->k[0] == 1 && sp->p[0] == 0 && sp->s[1] == 1 &&
        sp->s[2] == 1 && 2 * (sp->k[2] - 1) * sp->d[2] <= I2p && sp->out[1] * I2p <= target) {
        P->wide        = true;
        P->I2p         = I2p;
        P->PL          = I1p * I2p;
        P->Ws          = sp->out[1] * I2p;
        P->Pp          = I1p * I2p + (sp->k[2] - 1) * sp->d[2];
        P->nb          = target / P->Ws < g->N ? target / P->Ws : g->N;
        P->cols        = P->nb * P->Ws;
        P->col_bytes   = ((size_t)P->Kc * (size_t)P->cols * es + a - 1) / a * a;
        P->stage_bytes = ((size_t)g->C_out * (size_t)P->cols * es + a - 1) / a * a;
        P->pad_bytes   = (size_t)g->C_in * (size_t)P->Pp * es;
        return DDL_OK;
    }
    if (ov >= target) {
        // Split each sample's positions into equal pieces of at most `target` columns.
        int64_t pieces = (ov + target - 1) / target;
        P->nb          = 1;
        P->cols        = (ov + pieces - 1) / pieces;
    } else {
        P->nb = target / ov;
        if (P->nb > g->N) {
            P->nb = g->N;
        }
        P->cols = P->nb * ov;
    }
    P->col_bytes   = ((size_t)P->Kc * (size_t)P->cols * es + a - 1) / a * a;
    P->stage_bytes = P->nb > 1 ? (size_t)g->C_out * (size_t)P->cols * es : 0;
    return DDL_OK;
}

// ---- threads ---------------------------------------------------------------------
// Least multiply-adds per part worth a thread of its own (2^20 MACs take about 20 us on
// one core; waking a pool worker and waiting for it costs a few to tens of us). Kept at
// the value of the per-call threads it replaced, so T, and the bits, are unchanged.
#define DDL_CONV_PAR_MIN_MACS ((double)(1 << 20))

static size_t align_up(size_t v)
{
    return (v + DDL_ALIGN - 1) / DDL_ALIGN * DDL_ALIGN;
}

// Blocks of the batch: the units the threads share (one sample each when nb == 1).
static int64_t conv_units(const ddl_conv_geom *g, const conv_plan *P)
{
    return (g->N + P->nb - 1) / P->nb;
}

// How many threads the block loop can use with T BLAS threads: at most one per block and
// per DDL_CONV_PAR_MIN_MACS of work; 1 for the paths without a block loop.
static int conv_threads_for(const ddl_conv_geom *g, const conv_plan *P, int T)
{
    if (T <= 1 || P->direct || P->col_bytes == 0 || g->N == 0 || g->C_out == 0) {
        return 1;
    }
    int64_t units = conv_units(g, P);
    if ((int64_t)T > units) {
        T = (int)units;
    }
    double macs = (double)g->C_out * (double)P->Kc * (double)P->sp.ov * (double)g->N;
    while (T > 1 && macs < (double)T * DDL_CONV_PAR_MIN_MACS) {
        T--;
    }
    return T;
}

// Workspace of one thread: its im2col block, staging block and padded sample.
static size_t conv_slot_bytes(const conv_plan *P)
{
    return align_up(P->col_bytes + P->stage_bytes + P->pad_bytes);
}

// One private dW accumulator [Co, Kc].
static size_t conv_dwbuf_bytes(ddl_dtype dt, const ddl_conv_geom *g, const conv_plan *P)
{
    return align_up((size_t)g->C_out * (size_t)P->Kc * dt_size(dt));
}

// Workspace for T threads: T slots, then (with_dw) dW accumulators for threads 1..T-1
// (thread 0 accumulates into dw itself). T == 1 is the sequential loop's exact need.
static size_t conv_need(ddl_dtype dt, const ddl_conv_geom *g, const conv_plan *P, int T,
                        bool with_dw)
{
    if (T <= 1) {
        return P->col_bytes + P->stage_bytes + P->pad_bytes;
    }
    return (size_t)T * conv_slot_bytes(P) +
           (with_dw ? (size_t)(T - 1) * conv_dwbuf_bytes(dt, g, P) : 0);
}

size_t ddl_conv_workspace_bytes(ddl_dtype dt, const ddl_conv_geom *g)
{
    // Room for both the direct and the im2col plan, so that a workspace sized now still
    // serves if the direct path is switched off later (ddl_cdir_set, tests and benches).
    conv_plan P, Q;
    if (conv_plan_make("conv_workspace_bytes", dt, g, &P, true) != DDL_OK ||
        conv_plan_make("conv_workspace_bytes", dt, g, &Q, false) != DDL_OK) {
        return 0;
    }
    int    T = ddl_blas_set_threads(0);
    size_t a = conv_need(dt, g, &P, conv_threads_for(g, &P, T), true);
    size_t b = conv_need(dt, g, &Q, conv_threads_for(g, &Q, T), true);
    return a > b ? a : b;
}

int64_t ddl_conv_x_tail_need(ddl_dtype dt, const ddl_conv_geom *g)
{
    conv_plan P;
    if (g == NULL || conv_plan_make("conv_x_tail_need", dt, g, &P, true) != DDL_OK) {
        ddl_clear_error();
        return 0;
    }
    return P.cdir ? P.cd_tail : 0;
}

// ---- element helpers -----------------------------------------------------------

static inline int64_t floor_div(int64_t a, int64_t b) // b > 0
{
    int64_t q = a / b;
    return (a % b != 0 && a < 0) ? q - 1 : q;
}

static inline int64_t clamp64(int64_t v, int64_t lo, int64_t hi)
{
    return v < lo ? lo : (v > hi ? hi : v);
}

static inline double ld_at(ddl_dtype dt, const void *p, int64_t i)
{
    return dt == DDL_F32 ? (double)((const float *)p)[i] : ((const double *)p)[i];
}

static inline void add_at(ddl_dtype dt, void *p, int64_t i, double v)
{
    if (dt == DDL_F32) {
        ((float *)p)[i] += (float)v;
    } else {
        ((double *)p)[i] += v;
    }
}

static inline void st_at(ddl_dtype dt, void *p, int64_t i, double v)
{
    if (dt == DDL_F32) {
        ((float *)p)[i] = (float)v;
    } else {
        ((double *)p)[i] = v;
    }
}

// ---- runs ----------------------------------------------------------------------------
// im2col and col2im move one output row at a time: runs of a few to a few dozen
// elements (LeNet's are 10 and 28). A library call per run costs more than the copy, so
// runs up to RUN_INLINE_BYTES are moved inline with 16-byte vector moves (a memcpy of a
// constant 16 bytes compiles to one unaligned load or store), the tail by one move that
// overlaps the previous one. Element sizes are 4 or 8, so byte counts are multiples of 4.

typedef unsigned char ddl_b16 __attribute__((vector_size(16)));

#define RUN_INLINE_BYTES 512

// Hides a loop counter from GCC's loop-distribution pass, which would otherwise turn the
// inline move loops below back into memmove/memset calls.
#define OPAQUE(v) __asm__("" : "+r"(v))

// dst[0..nb) = src[0..nb) (bytes).
static inline void copy_bytes(char *restrict dst, const char *restrict src, size_t nb)
{
    if (nb > RUN_INLINE_BYTES) {
        memcpy(dst, src, nb);
    } else if (nb >= 16) {
        ddl_b16 v;
        for (size_t i = 0; i + 16 < nb; i += 16) {
            OPAQUE(i);
            memcpy(&v, src + i, 16);
            memcpy(dst + i, &v, 16);
        }
        memcpy(&v, src + nb - 16, 16);
        memcpy(dst + nb - 16, &v, 16);
    } else if (nb >= 8) {
        uint64_t a, b;
        memcpy(&a, src, 8);
        memcpy(&b, src + nb - 8, 8);
        memcpy(dst, &a, 8);
        memcpy(dst + nb - 8, &b, 8);
    } else if (nb >= 4) {
        uint32_t a;
        memcpy(&a, src, 4);
        memcpy(dst, &a, 4);
    }
}

// dst[0..nb) = 0 (bytes).
static inline void zero_bytes(char *dst, size_t nb)
{
    if (nb > RUN_INLINE_BYTES) {
        memset(dst, 0, nb);
    } else if (nb >= 16) {
        const ddl_b16 z = {0};
        for (size_t i = 0; i + 16 < nb; i += 16) {
            OPAQUE(i);
            memcpy(dst + i, &z, 16);
        }
        memcpy(dst + nb - 16, &z, 16);
    } else if (nb >= 8) {
        const uint64_t z = 0;
        memcpy(dst, &z, 8);
        memcpy(dst + nb - 8, &z, 8);
    } else if (nb >= 4) {
        const uint32_t z = 0;
        memcpy(dst, &z, 4);
    }
}

// dst[0..n) = src[0, s, 2s, ...] (elements of dt).
KERNEL void copy_run(ddl_dtype dt, char *dst, const char *src, int64_t n, int64_t s)
{
    if (n <= 0) {
        return;
    }
    if (s == 1) {
        copy_bytes(dst, src, (size_t)n * dt_size(dt));
    } else if (dt == DDL_F32) {
        const float *restrict x = (const float *)src;
        float *restrict y       = (float *)dst;
        for (int64_t i = 0; i < n; i++) {
            y[i] = x[i * s];
        }
    } else {
        const double *restrict x = (const double *)src;
        double *restrict y       = (double *)dst;
        for (int64_t i = 0; i < n; i++) {
            y[i] = x[i * s];
        }
    }
}

KERNEL void zero_run(ddl_dtype dt, char *dst, int64_t n)
{
    if (n > 0) {
        zero_bytes(dst, (size_t)n * dt_size(dt));
    }
}

// Four (two) lanes at a time through GCC/Clang 16-byte vector types, two vectors per
// step: the default x86-64 build does not auto-vectorize these short runs (and 32-byte
// vectors without AVX go through the stack). memcpy does the unaligned loads and stores.
typedef float  ddl_v4f __attribute__((vector_size(16)));
typedef double ddl_v2d __attribute__((vector_size(16)));

// dst[0, s, 2s, ...] += src[0..n) (elements of dt).
KERNEL void add_run(ddl_dtype dt, char *dst, const char *src, int64_t n, int64_t s)
{
    if (dt == DDL_F32) {
        const float *restrict x = (const float *)src;
        float *restrict y       = (float *)dst;
        int64_t i               = 0;
        if (s == 1) {
            for (; i + 8 <= n; i += 8) {
                ddl_v4f a0, a1, b0, b1;
                memcpy(&a0, y + i, 16);
                memcpy(&a1, y + i + 4, 16);
                memcpy(&b0, x + i, 16);
                memcpy(&b1, x + i + 4, 16);
                a0 += b0;
                a1 += b1;
                memcpy(y + i, &a0, 16);
                memcpy(y + i + 4, &a1, 16);
            }
            if (i + 4 <= n) {
                ddl_v4f a, b;
                memcpy(&a, y + i, 16);
                memcpy(&b, x + i, 16);
                a += b;
                memcpy(y + i, &a, 16);
                i += 4;
            }
        }
        for (; i < n; i++) {
            y[i * s] += x[i];
        }
    } else {
        const double *restrict x = (const double *)src;
        double *restrict y       = (double *)dst;
        int64_t i                = 0;
        if (s == 1) {
            for (; i + 4 <= n; i += 4) {
                ddl_v2d a0, a1, b0, b1;
                memcpy(&a0, y + i, 16);
                memcpy(&a1, y + i + 2, 16);
                memcpy(&b0, x + i, 16);
                memcpy(&b1, x + i + 2, 16);
                a0 += b0;
                a1 += b1;
                memcpy(y + i, &a0, 16);
                memcpy(y + i + 2, &a1, 16);
            }
            if (i + 2 <= n) {
                ddl_v2d a, b;
                memcpy(&a, y + i, 16);
                memcpy(&b, x + i, 16);
                a += b;
                memcpy(y + i, &a, 16);
                i += 2;
            }
        }
        for (; i < n; i++) {
            y[i * s] += x[i];
        }
    }
}

// ---- im2col / col2im --------------------------------------------------------------
// Both walk the column matrix of one sample restricted to output positions [j0, j0 + nc):
// row r = (ci, k0, k1, k2) has nc entries, stored with leading dimension ldcol. The
// positions are visited as runs along the innermost output dimension (o2 in [a, b) of
// output row (o0, o1)), stepping from run to run without divisions. Within a run the
// taps inside the input are o2 in [lo2, hi2), an interval that depends only on k2, and
// their input index advances by the stride s2. Each is written once over a constant dt
// (KERNEL) and instantiated per dtype, so the run helpers carry no dtype branch.

typedef struct col_row {
    int64_t off[3];   // kk*d - p per dimension: input index = o*s + off
    int64_t lo2, hi2; // o2 whose tap lies inside the input
} col_row;

static inline void col_row_init(const sp3 *sp, int64_t k0, int64_t k1, int64_t k2,
                                col_row *w)
{
    w->off[0] = k0 * sp->d[0] - sp->p[0];
    w->off[1] = k1 * sp->d[1] - sp->p[1];
    w->off[2] = k2 * sp->d[2] - sp->p[2];
    // 0 <= o2*s2 + off2 <= in2 - 1, i.e. ceil(-off2 / s2) <= o2 <= floor((in2-1-off2) / s2)
    w->lo2 = clamp64(-floor_div(w->off[2], sp->s[2]), 0, sp->out[2]);
    w->hi2 = clamp64(floor_div(sp->in[2] - 1 - w->off[2], sp->s[2]) + 1, w->lo2, sp->out[2]);
}

// Where the block starts: output row (o0, o1) and position a within it.
typedef struct run_start {
    int64_t o0, o1, a;
} run_start;

static inline run_start run_start_of(const sp3 *sp, int64_t j0)
{
    run_start st;
    int64_t   row = j0 / sp->out[2];
    st.a          = j0 - row * sp->out[2];
    st.o0         = row / sp->out[1];
    st.o1         = row - st.o0 * sp->out[1];
    return st;
}

// col[r, j - j0] = x_n[ci, o(j)*s + kk*d - p] (0 outside the input).
KERNEL void im2col_t(ddl_dtype dt, const sp3 *sp, int64_t Ci, void *col, int64_t ldcol,
                     const void *xn, int64_t j0, int64_t nc)
{
    const size_t    es = dt_size(dt);
    const int64_t   O1 = sp->out[1], O2 = sp->out[2];
    const int64_t   I0 = sp->in[0], I1 = sp->in[1], I2 = sp->in[2];
    const int64_t   S0 = sp->s[0], S1 = sp->s[1], S2 = sp->s[2];
    const run_start st = run_start_of(sp, j0);
    int64_t         r  = 0;
    for (int64_t ci = 0; ci < Ci; ci++) {
        const char *xc = (const char *)xn + (size_t)(ci * sp->iv) * es;
        for (int64_t k0 = 0; k0 < sp->k[0]; k0++) {
            for (int64_t k1 = 0; k1 < sp->k[1]; k1++) {
                for (int64_t k2 = 0; k2 < sp->k[2]; k2++, r++) {
                    col_row w;
                    col_row_init(sp, k0, k1, k2, &w);
                    char   *dst = (char *)col + (size_t)(r * ldcol) * es;
                    int64_t o0 = st.o0, o1 = st.o1, a = st.a, left = nc;
                    while (left > 0) {
                        int64_t b  = O2 - a < left ? O2 : a + left;
                        int64_t i0 = o0 * S0 + w.off[0], i1 = o1 * S1 + w.off[1];
                        if (i0 < 0 || i0 >= I0 || i1 < 0 || i1 >= I1) {
                            zero_run(dt, dst, b - a);
                        } else {
                            int64_t lo = clamp64(w.lo2, a, b), hi = clamp64(w.hi2, lo, b);
                            int64_t i2 = lo * S2 + w.off[2];
                            zero_run(dt, dst, lo - a);
                            copy_run(dt, dst + (size_t)(lo - a) * es,
                                     xc + (size_t)((i0 * I1 + i1) * I2 + i2) * es, hi - lo, S2);
                            zero_run(dt, dst + (size_t)(hi - a) * es, b - hi);
                        }
                        dst += (size_t)(b - a) * es;
                        left -= b - a;
                        a = 0;
                        if (++o1 == O1) {
                            o1 = 0;
                            o0++;
                        }
                    }
                }
            }
        }
    }
}

static void im2col(ddl_dtype dt, const sp3 *sp, int64_t Ci, void *col, int64_t ldcol,
                   const void *xn, int64_t j0, int64_t nc)
{
    if (dt == DDL_F32) {
        im2col_t(DDL_F32, sp, Ci, col, ldcol, xn, j0, nc);
    } else {
        im2col_t(DDL_F64, sp, Ci, col, ldcol, xn, j0, nc);
    }
}

// dx_n[ci, o(j)*s + kk*d - p] += col[r, j - j0] for taps inside the input: the adjoint
// of im2col (padding taps are dropped).
KERNEL void col2im_add_t(ddl_dtype dt, const sp3 *sp, int64_t Ci, const void *col,
                         int64_t ldcol, void *dxn, int64_t j0, int64_t nc)
{
    const size_t    es = dt_size(dt);
    const int64_t   O1 = sp->out[1], O2 = sp->out[2];
    const int64_t   I0 = sp->in[0], I1 = sp->in[1], I2 = sp->in[2];
    const int64_t   S0 = sp->s[0], S1 = sp->s[1], S2 = sp->s[2];
    const run_start st = run_start_of(sp, j0);
    int64_t         r  = 0;
    for (int64_t ci = 0; ci < Ci; ci++) {
        char *xc = (char *)dxn + (size_t)(ci * sp->iv) * es;
        for (int64_t k0 = 0; k0 < sp->k[0]; k0++) {
            for (int64_t k1 = 0; k1 < sp->k[1]; k1++) {
                for (int64_t k2 = 0; k2 < sp->k[2]; k2++, r++) {
                    col_row w;
                    col_row_init(sp, k0, k1, k2, &w);
                    const char *src = (const char *)col + (size_t)(r * ldcol) * es;
                    int64_t     o0 = st.o0, o1 = st.o1, a = st.a, left = nc;
                    while (left > 0) {
                        int64_t b  = O2 - a < left ? O2 : a + left;
                        int64_t i0 = o0 * S0 + w.off[0], i1 = o1 * S1 + w.off[1];
                        if (i0 >= 0 && i0 < I0 && i1 >= 0 && i1 < I1) {
                            int64_t lo = clamp64(w.lo2, a, b), hi = clamp64(w.hi2, lo, b);
                            int64_t i2 = lo * S2 + w.off[2];
                            add_run(dt, xc + (size_t)((i0 * I1 + i1) * I2 + i2) * es,
                                    src + (size_t)(lo - a) * es, hi - lo, S2);
                        }
                        src += (size_t)(b - a) * es;
                        left -= b - a;
                        a = 0;
                        if (++o1 == O1) {
                            o1 = 0;
                            o0++;
                        }
                    }
                }
            }
        }
    }
}

static void col2im_add(ddl_dtype dt, const sp3 *sp, int64_t Ci, const void *col,
                       int64_t ldcol, void *dxn, int64_t j0, int64_t nc)
{
    if (dt == DDL_F32) {
        col2im_add_t(DDL_F32, sp, Ci, col, ldcol, dxn, j0, nc);
    } else {
        col2im_add_t(DDL_F64, sp, Ci, col, ldcol, dxn, j0, nc);
    }
}

// ---- forward ----------------------------------------------------------------------

// Sum of p[0..n) in double, in four independent chains (a single chain is bound by the
// add latency; this one by the loads).
static double row_sum(ddl_dtype dt, const void *p, int64_t n)
{
    double  s[4] = {0.0, 0.0, 0.0, 0.0};
    int64_t i    = 0;
    if (dt == DDL_F32) {
        const float *x = p;
        for (; i + 4 <= n; i += 4) {
            s[0] += x[i];
            s[1] += x[i + 1];
            s[2] += x[i + 2];
            s[3] += x[i + 3];
        }
        for (; i < n; i++) {
            s[0] += x[i];
        }
    } else {
        const double *x = p;
        for (; i + 4 <= n; i += 4) {
            s[0] += x[i];
            s[1] += x[i + 1];
            s[2] += x[i + 2];
            s[3] += x[i + 3];
        }
        for (; i < n; i++) {
            s[0] += x[i];
        }
    }
    return (s[0] + s[1]) + (s[2] + s[3]);
}

static inline char *elem(const void *p, int64_t i, size_t es)
{
    return (char *)p + (size_t)i * es;
}

// rows [Co] x cols [nc] block with leading dimension ld: y[co, :] += b[co].
static void add_bias(ddl_dtype dt, void *y, int64_t ld, int64_t Co, int64_t nc, const void *b)
{
    for (int64_t co = 0; co < Co; co++) {
        if (dt == DDL_F32) {
            float *r = (float *)y + co * ld, v = ((const float *)b)[co];
            for (int64_t j = 0; j < nc; j++) {
                r[j] += v;
            }
        } else {
            double *r = (double *)y + co * ld, v = ((const double *)b)[co];
            for (int64_t j = 0; j < nc; j++) {
                r[j] += v;
            }
        }
    }
}

// The plan of a forward (backward false) or backward call with a workspace of ws_bytes.
static ddl_status conv_select(const char *who, ddl_dtype dt, const ddl_conv_geom *g,
                              size_t ws_bytes, bool backward, conv_plan *P)
{
    DDL_CHECK(conv_plan_make(who, dt, g, P, true));
    size_t need = P->col_bytes + P->stage_bytes + P->pad_bytes;
    // A workspace sized for the im2col path only: take that path. So does the backward of
    // a direct plan whose grid is at least three times the outputs (planes of a few
    // positions, where the dW and dx sweeps run mostly empty). Measured at AVX-512 (AMD
    // EPYC Zen 5, batch 64, one thread, backward direct against im2col, since dW sums
    // groups of samples): 64->64 4x4 padded, 32 grid positions for 16 outputs, 2.20
    // against 2.85-2.93 ms; 32->32 6x9 unpadded, 64 for 28, 0.93-0.96 against 1.28; but
    // 64->64 4x6 unpadded, 32 for 8, 2.21 against 1.57-1.61 ms. (Before the groups the
    // 4x4 took 3.78 against 3.09 ms, and the bound was twice.)
    // ddl_conv_workspace_bytes has room for either path.
    if ((P->cdir && (ws_bytes < need || (backward && P->cd_nj >= 3 * P->sp.ov))) ||
        (P->cvec && ws_bytes < need)) {
        DDL_CHECK(conv_plan_make(who, dt, g, P, false));
    }
    return DDL_OK;
}

bool ddl_cdir_taken(ddl_dtype dt, const ddl_conv_geom *g, size_t ws_bytes, bool backward)
{
    conv_plan P;
    return conv_select("conv_path", dt, g, ws_bytes, backward, &P) == DDL_OK && P.cdir;
}

bool ddl_cvec_taken(ddl_dtype dt, const ddl_conv_geom *g, size_t ws_bytes, bool backward)
{
    conv_plan P;
    return conv_select("conv_path", dt, g, ws_bytes, backward, &P) == DDL_OK && P.cvec;
}

int64_t ddl_cdir_dw_group_of(ddl_dtype dt, const ddl_conv_geom *g, size_t ws_bytes)
{
    conv_plan P;
    if (conv_select("conv_path", dt, g, ws_bytes, true, &P) != DDL_OK) {
        ddl_clear_error();
        return 0;
    }
    return P.cdir ? P.cd_group : 0;
}

// The plan of a call, checked against the workspace.
static ddl_status conv_args(const char *who, ddl_dtype dt, const ddl_conv_geom *g, const void *ws,
                            size_t ws_bytes, bool backward, conv_plan *P)
{
    DDL_CHECK(conv_select(who, dt, g, ws_bytes, backward, P));
    size_t need = P->col_bytes + P->stage_bytes + P->pad_bytes;
    DDL_REQUIRE(ws_bytes >= need && (need == 0 || ws != NULL), DDL_EINVAL,
                "%s: workspace of %zu bytes%s, need %zu (ddl_conv_workspace_bytes)", who,
                ws_bytes, ws == NULL ? " (NULL)" : "", need);
    return DDL_OK;
}

// ---- the wide layout ------------------------------------------------------------------
// For stride-1 convolutions of small 1-D/2-D samples (LeNet's 28x28 and 14x14) the
// run-by-run im2col above spends its time on run bookkeeping, not on moving data. The
// wide layout removes the runs: it computes the output over a grid of out[1] rows of
// I2p = in[2] + 2 p[2] positions (the padded row length) instead of out[2]. Output
// position j = o1*I2p + o2 reads the padded input xp at j + k1*d1*I2p + k2*d2, so row
// r = (ci, k1, k2) of the column matrix is one contiguous slice of xp:
//   col[r, j] = xp[ci, k1*d1*I2p + k2*d2 + j],   j in [0, Ws), Ws = out[1] * I2p.
// Positions o2 >= out[2] are garbage: the forward drops them when it copies the block
// out, and the backward gives them dy = 0 (and, for dW, zero columns), so they add
// nothing. xp is the sample zero-padded once, with (k2-1)*d2 zeros after each plane so
// the last slice stays inside it. The GEMMs grow by I2p / out[2] (1.14x and 1.4x for
// LeNet), cheap next to what the runs cost.

// xp [Ci, Pp] = x_n [Ci, in[0], in[1], in[2]] zero-padded (planes PL apart; in[0] = 1 and
// p[0] = 0 for 1-D and 2-D).
static void pad_sample(ddl_dtype dt, const conv_plan *P, int64_t Ci, char *xp, const char *xn)
{
    const sp3    *sp = &P->sp;
    const size_t  es = dt_size(dt);
    const int64_t I0 = sp->in[0], I1 = sp->in[1], I2 = sp->in[2];
    const int64_t p0 = sp->p[0], p1 = sp->p[1], p2 = sp->p[2];
    if (p0 == 0 && p1 == 0 && p2 == 0) {
        const int64_t tail = P->Pp - sp->iv;
        for (int64_t ci = 0; ci < Ci; ci++) {
            char *dst = xp + (size_t)(ci * P->Pp) * es;
            copy_bytes(dst, xn + (size_t)(ci * sp->iv) * es, (size_t)sp->iv * es);
            zero_bytes(dst + (size_t)sp->iv * es, (size_t)tail * es);
        }
        return;
    }
    // Each byte written once: the rows in order, the zeros between them (the padding, the
    // bottom rows and the tail) as the runs from one row's end to the next one's start.
    for (int64_t ci = 0; ci < Ci; ci++) {
        char   *dst = xp + (size_t)(ci * P->Pp) * es;
        int64_t cur = 0; // elements of this plane's xp written
        for (int64_t i0 = 0; i0 < I0; i0++) {
            for (int64_t i1 = 0; i1 < I1; i1++) {
                const int64_t at = (i0 + p0) * P->PL + (i1 + p1) * P->I2p + p2;
                zero_bytes(dst + (size_t)cur * es, (size_t)(at - cur) * es);
                copy_bytes(dst + (size_t)at * es,
                           xn + (size_t)(ci * sp->iv + (i0 * I1 + i1) * I2) * es, (size_t)I2 * es);
                cur = at + I2;
            }
        }
        zero_bytes(dst + (size_t)cur * es, (size_t)(P->Pp - cur) * es);
    }
}

// Offset in xp of the slice of column row (ci, k1, k2).
static inline int64_t wide_off(const conv_plan *P, int64_t ci, int64_t k1, int64_t k2)
{
    return ci * P->Pp + k1 * P->sp.d[1] * P->I2p + k2 * P->sp.d[2];
}

// col[:, 0..Ws) (leading dimension ldcol) = the wide columns of the padded sample xp;
// with zero_gaps the garbage positions are zeroed (dW must not see x there: 0 * inf).
static void im2col_wide(ddl_dtype dt, const conv_plan *P, int64_t Ci, char *col, int64_t ldcol,
                        const char *xp, bool zero_gaps)
{
    const size_t  es = dt_size(dt);
    const int64_t O1 = P->sp.out[1], O2 = P->sp.out[2], gap = P->I2p - O2;
    int64_t       r  = 0;
    for (int64_t ci = 0; ci < Ci; ci++) {
        for (int64_t k1 = 0; k1 < P->sp.k[1]; k1++) {
            for (int64_t k2 = 0; k2 < P->sp.k[2]; k2++, r++) {
                char *dst = col + (size_t)(r * ldcol) * es;
                copy_bytes(dst, xp + (size_t)wide_off(P, ci, k1, k2) * es, (size_t)P->Ws * es);
                for (int64_t o1 = 0; zero_gaps && gap > 0 && o1 < O1; o1++) {
                    zero_bytes(dst + (size_t)(o1 * P->I2p + O2) * es, (size_t)gap * es);
                }
            }
        }
    }
}

// dx_n += the adjoint of im2col_wide applied to dcol [Kc, Ws] (leading dimension ldcol),
// gathered in the padded buffer dxp first (garbage positions of dcol are 0).
// dx_n += (or =, P->dx_set) the adjoint of im2col_wide of the columns dcol, through the
// padded plane dxp.
static void col2im_wide_add(ddl_dtype dt, const conv_plan *P, int64_t Ci, const char *dcol,
                            int64_t ldcol, char *dxp, char *dxn)
{
    const sp3    *sp = &P->sp;
    const size_t  es = dt_size(dt);
    int64_t       r  = 0;
    memset(dxp, 0, (size_t)(Ci * P->Pp) * es);
    for (int64_t ci = 0; ci < Ci; ci++) {
        for (int64_t k1 = 0; k1 < sp->k[1]; k1++) {
            for (int64_t k2 = 0; k2 < sp->k[2]; k2++, r++) {
                add_run(dt, dxp + (size_t)wide_off(P, ci, k1, k2) * es,
                        dcol + (size_t)(r * ldcol) * es, P->Ws, 1);
            }
        }
    }
    for (int64_t ci = 0; ci < Ci; ci++) {
        for (int64_t i1 = 0; i1 < sp->in[1]; i1++) {
            char       *to = dxn + (size_t)(ci * sp->iv + i1 * sp->in[2]) * es;
            const char *from =
                dxp + (size_t)(ci * P->Pp + (i1 + sp->p[1]) * P->I2p + sp->p[2]) * es;
            if (P->dx_set) {
                copy_bytes(to, from, (size_t)sp->in[2] * es);
            } else {
                add_run(dt, to, from, sp->in[2], 1);
            }
        }
    }
}

// Samples [n_begin, n_end) (n_begin a multiple of P->nb), like the loops below.
static ddl_status conv_forward_wide(ddl_dtype dt, const ddl_conv_geom *g, const conv_plan *P,
                                    void *y, const void *x, const void *w, const void *b,
                                    void *ws, int64_t n_begin, int64_t n_end)
{
    const int64_t N = n_end, Ci = g->C_in, Co = g->C_out, Kc = P->Kc;
    const int64_t iv = P->sp.iv, ov = P->sp.ov, O1 = P->sp.out[1], O2 = P->sp.out[2];
    const size_t  es    = dt_size(dt);
    char         *col   = ws;
    char         *stage = col + P->col_bytes;
    char         *xp    = stage + P->stage_bytes;
    for (int64_t n0 = n_begin; n0 < N; n0 += P->nb) {
        ddl__kernel_progress();
        int64_t nt = N - n0 < P->nb ? N - n0 : P->nb, nc = nt * P->Ws;
        for (int64_t t = 0; t < nt; t++) {
            pad_sample(dt, P, Ci, xp, (const char *)x + (size_t)((n0 + t) * Ci * iv) * es);
            im2col_wide(dt, P, Ci, col + (size_t)(t * P->Ws) * es, nc, xp, false);
        }
        DDL_CHECK(ddl_gemm(dt, false, false, Co, nc, Kc, 1.0, w, Kc, col, nc, 0.0, stage, nc));
        if (b != NULL) {
            add_bias(dt, stage, nc, Co, nc, b);
        }
        for (int64_t t = 0; t < nt; t++) {
            for (int64_t co = 0; co < Co; co++) {
                char       *yr = (char *)y + (size_t)(((n0 + t) * Co + co) * ov) * es;
                const char *sr = stage + (size_t)(co * nc + t * P->Ws) * es;
                for (int64_t o1 = 0; o1 < O1; o1++) {
                    copy_bytes(yr + (size_t)(o1 * O2) * es, sr + (size_t)(o1 * P->I2p) * es,
                               (size_t)O2 * es);
                }
            }
        }
    }
    return DDL_OK;
}

static ddl_status conv_backward_wide(ddl_dtype dt, const ddl_conv_geom *g, const conv_plan *P,
                                     void *dx, void *dw, const void *dy, const void *x,
                                     const void *w, void *ws, int64_t n_begin, int64_t n_end)
{
    const int64_t N = n_end, Ci = g->C_in, Co = g->C_out, Kc = P->Kc;
    const int64_t iv = P->sp.iv, ov = P->sp.ov, O1 = P->sp.out[1], O2 = P->sp.out[2];
    const int64_t gap   = P->I2p - O2;
    const size_t  es    = dt_size(dt);
    char         *col   = ws;
    char         *stage = col + P->col_bytes;
    char         *xp    = stage + P->stage_bytes;
    for (int64_t n0 = n_begin; n0 < N; n0 += P->nb) {
        ddl__kernel_progress();
        int64_t nt = N - n0 < P->nb ? N - n0 : P->nb, nc = nt * P->Ws;
        // dy of the block in the wide layout [Co, nc], zero at the garbage positions.
        for (int64_t t = 0; t < nt; t++) {
            for (int64_t co = 0; co < Co; co++) {
                const char *yr = (const char *)dy + (size_t)(((n0 + t) * Co + co) * ov) * es;
                char       *sr = stage + (size_t)(co * nc + t * P->Ws) * es;
                for (int64_t o1 = 0; o1 < O1; o1++) {
                    copy_bytes(sr + (size_t)(o1 * P->I2p) * es, yr + (size_t)(o1 * O2) * es,
                               (size_t)O2 * es);
                    zero_bytes(sr + (size_t)(o1 * P->I2p + O2) * es, (size_t)gap * es);
                }
            }
        }
        if (dw != NULL) {
            for (int64_t t = 0; t < nt; t++) {
                pad_sample(dt, P, Ci, xp, (const char *)x + (size_t)((n0 + t) * Ci * iv) * es);
                im2col_wide(dt, P, Ci, col + (size_t)(t * P->Ws) * es, nc, xp, true);
            }
            DDL_CHECK(ddl_gemm(dt, false, true, Co, Kc, nc, 1.0, stage, nc, col, nc, 1.0, dw,
                               Kc));
        }
        if (dx != NULL) {
            DDL_CHECK(ddl_gemm(dt, true, false, Kc, nc, Co, 1.0, w, Kc, stage, nc, 0.0, col, nc));
            for (int64_t t = 0; t < nt; t++) {
                col2im_wide_add(dt, P, Ci, col + (size_t)(t * P->Ws) * es, nc, xp,
                                (char *)dx + (size_t)((n0 + t) * Ci * iv) * es);
            }
        }
    }
    return DDL_OK;
}

// ---- the direct path for few input channels ------------------------------------------
// kernels/conv_direct.h computes on the wide grid without a column matrix; these loops
// pad each sample, lay dy out on the grid and move results back, like the wide layout.

typedef struct cdir_ws {
    char    *xp, *dyw, *dxp, *mask, *acc, *wp; // wp: the scatter's packed w
    int64_t  xp_stride, dyw_stride; // elements between a group's samples (x's when in place)
    int64_t *toff, *dtoff, *koff;
    ddl_cdir c;
} cdir_ws;

// Offset within a channel of the direct path's xp of padded position (g0, g1, g2): its
// phase volume, then its place there (conv_plan_make). With strides 1: g0 PL + g1 I2p + g2.
static inline int64_t cdir_at(const conv_plan *P, int64_t g0, int64_t g1, int64_t g2)
{
    const int64_t *s  = P->sp.s;
    int64_t        ph = ((g0 % s[0]) * s[1] + g1 % s[1]) * s[2] + g2 % s[2];
    return ph * P->cd_RV + g0 / s[0] * P->PL + g1 / s[1] * P->I2p + g2 / s[2];
}

// With strides: to = xp [Ci, Pp], the sample `from` zero-padded in the phase layout (add
// false), or to = dx_n += the dxp `from` read back from it (add true). Along a row the
// elements i2 = i, i + s2, i + 2 s2, ... (i < s2) fall in one phase a2 = (i + p2) mod s2,
// at consecutive places from (i + p2) div s2 on: one strided run per phase (copy_run,
// add_run).
static void cdir_phase_copy(ddl_dtype dt, const conv_plan *P, int64_t Ci, const char *from,
                            char *to, bool add)
{
    const sp3    *sp = &P->sp;
    const int64_t s2 = sp->s[2], I2 = sp->in[2];
    const size_t  es = dt_size(dt);
    if (!add) {
        memset(to, 0, (size_t)(Ci * P->Pp) * es);
    }
    for (int64_t ci = 0; ci < Ci; ci++) {
        for (int64_t i0 = 0; i0 < sp->in[0]; i0++) {
            for (int64_t i1 = 0; i1 < sp->in[1]; i1++) {
                int64_t row = ci * P->Pp + cdir_at(P, i0 + sp->p[0], i1 + sp->p[1], 0);
                int64_t src = ci * sp->iv + (i0 * sp->in[1] + i1) * I2;
                for (int64_t i = 0; i < s2 && i < I2; i++) {
                    int64_t at = row + (i + sp->p[2]) % s2 * P->cd_RV + (i + sp->p[2]) / s2;
                    int64_t n  = (I2 - i + s2 - 1) / s2;
                    if (add) {
                        add_run(dt, to + (size_t)(src + i) * es, from + (size_t)at * es, n, s2);
                    } else {
                        copy_run(dt, to + (size_t)at * es, from + (size_t)(src + i) * es, n, s2);
                    }
                }
            }
        }
    }
}

// One sample's output rows between the dense layout [Co, ov] and the direct path's grid
// (channel stride cd_ldy, plane stride PL, row stride I2p): from the dense rows onto the
// grid (to_grid) or back.
static void cdir_grid_rows(size_t es, const conv_plan *P, int64_t Co, const char *from, char *to,
                           bool to_grid)
{
    const int64_t O0 = P->sp.out[0], O1 = P->sp.out[1], O2 = P->sp.out[2], ov = P->sp.ov;
    for (int64_t co = 0; co < Co; co++) {
        for (int64_t o0 = 0; o0 < O0; o0++) {
            for (int64_t o1 = 0; o1 < O1; o1++) {
                size_t gr = (size_t)(co * P->cd_ldy + o0 * P->PL + o1 * P->I2p) * es;
                size_t de = (size_t)(co * ov + (o0 * O1 + o1) * O2) * es;
                copy_bytes(to + (to_grid ? gr : de), from + (to_grid ? de : gr), (size_t)O2 * es);
            }
        }
    }
}

// What the kernels read for sample xn: xp = xn zero-padded in the direct path's layout, or
// xn itself when it is read in place.
static const char *cdir_input(ddl_dtype dt, const conv_plan *P, int64_t Ci, char *xp,
                              const char *xn)
{
    if (P->cd_inplace) {
        return xn;
    }
    if (P->cd_nph > 1) {
        cdir_phase_copy(dt, P, Ci, xn, xp, false);
    } else {
        pad_sample(dt, P, Ci, xp, xn);
    }
    return xp;
}

// Carves one thread's slot and fills the tap offsets (and the dW mask when asked).
static void cdir_setup(ddl_dtype dt, const ddl_conv_geom *g, const conv_plan *P, char *ws,
                       bool with_mask, cdir_ws *d)
{
    const sp3    *sp = &P->sp;
    const size_t  es = dt_size(dt), a = DDL_ALIGN;
    const int64_t Ci = g->C_in, Co = g->C_out;
    size_t planes = ((size_t)Ci * (size_t)P->Pp * es + a - 1) / a * a;
    size_t dyw    = ((size_t)Co * (size_t)P->cd_ldy * es + a - 1) / a * a;
    size_t        mask   = ((size_t)P->cd_nj * es + a - 1) / a * a;
    // A group of cd_group samples' xp (unless read in place) and dyw, planes and dyw apart
    // (xp_stride, dyw_stride), then one dxp.
    d->xp_stride         = P->cd_inplace ? sp->iv * Ci : (int64_t)(planes / es);
    d->dyw_stride        = (int64_t)(dyw / es);
    d->xp                = P->cd_inplace ? NULL : ws; // in place: the sample itself (cdir_input)
    d->dyw               = P->cd_inplace ? ws : ws + (size_t)P->cd_group * planes;
    d->dxp               = d->dyw + (size_t)P->cd_group * dyw;
    d->mask              = d->dxp + planes;
    d->toff       = (int64_t *)(void *)(d->mask + mask);
    // dx's taps differ from x's only when x is read in place (its planes lie iv apart).
    d->dtoff             = P->cd_inplace ? d->toff + P->Kc : d->toff;
    d->koff              = d->dtoff + P->Kc;
    d->acc               = (char *)d->mask + mask + cdir_offs_bytes(P, P->cd_inplace);
    d->wp                = d->acc + (size_t)(Co * P->Kc) * DDL_CDIR_LANE_BYTES;
    // x's planes lie iv apart when read in place, dxp's always Pp.
    const int64_t xst = P->cd_inplace ? sp->iv : P->Pp;
    // Tap (k0, k1, k2) reads padded position o s + k d: in the phase layout (conv_plan_make)
    // the phase volume of k d mod s, shifted by k d div s (with strides 1: k d).
    for (int64_t k0 = 0, kk = 0; k0 < sp->k[0]; k0++) {
        for (int64_t k1 = 0; k1 < sp->k[1]; k1++) {
            for (int64_t k2 = 0; k2 < sp->k[2]; k2++, kk++) {
                d->koff[kk] = cdir_at(P, k0 * sp->d[0], k1 * sp->d[1], k2 * sp->d[2]);
            }
        }
    }
    for (int64_t ci = 0; ci < Ci; ci++) {
        for (int64_t kk = 0; kk < sp->kv; kk++) {
            d->toff[ci * sp->kv + kk] = ci * xst + d->koff[kk];
            if (P->cd_inplace) {
                d->dtoff[ci * sp->kv + kk] = ci * P->Pp + d->koff[kk];
            }
        }
    }
    // Valid: the first out[2] positions of the first out[1] rows of each of the out[0]
    // planes of the grid (j = o0 PL + o1 I2p + o2); all others zero. One run per output row,
    // no division per position (this runs on every backward call).
    if (with_mask) {
        memset(d->mask, 0, (size_t)P->cd_nj * es);
        for (int64_t o0 = 0; o0 < sp->out[0]; o0++) {
            for (int64_t o1 = 0; o1 < sp->out[1]; o1++) {
                memset(d->mask + (size_t)(o0 * P->PL + o1 * P->I2p) * es, 0xff,
                       (size_t)sp->out[2] * es);
            }
        }
    }
    d->c = (ddl_cdir){.Ci    = Ci,
                      .Co    = Co,
                      .Kc    = P->Kc,
                      .kv    = sp->kv,
                      .toff  = d->toff,
                      .dtoff = d->dtoff,
                      .koff  = d->koff,
                      .Pp    = P->Pp,
                      .ldy   = P->cd_ldy,
                      .nj    = P->cd_nj,
                      .nq    = P->cd_nq};
}

// What the kernels read for the ng samples from xn on: their padded copies in the group's
// xp slots, or the samples themselves when read in place (d->xp_stride apart either way).
static const char *cdir_group_input(ddl_dtype dt, const conv_plan *P, int64_t Ci, const cdir_ws *d,
                                    const char *xn, int64_t ng)
{
    if (P->cd_inplace) {
        return xn;
    }
    const size_t es = dt_size(dt);
    for (int64_t t = 0; t < ng; t++) {
        cdir_input(dt, P, Ci, d->xp + (size_t)(t * d->xp_stride) * es,
                   xn + (size_t)(t * Ci * P->sp.iv) * es);
    }
    return d->xp;
}

static ddl_status conv_forward_cdir(ddl_dtype dt, const ddl_conv_geom *g, const conv_plan *P,
                                    void *y, const void *x, const void *w, const void *b,
                                    char *ws, int64_t n_begin, int64_t n_end)
{
    const int64_t Ci = g->C_in, Co = g->C_out, iv = P->sp.iv, ov = P->sp.ov;
    const size_t  es = dt_size(dt);
    cdir_ws       d;
    cdir_setup(dt, g, P, ws, false, &d);
    char *yw0 = d.dyw + (size_t)P->cd_M * es;
    // A group of samples per kernel call (the dW's, conv_plan_make): small planes share
    // the kernel's tiles.
    for (int64_t n0 = n_begin; n0 < n_end; n0 += P->cd_group) {
        ddl__kernel_progress();
        int64_t     ng = n_end - n0 < P->cd_group ? n_end - n0 : P->cd_group;
        const char *xs = cdir_group_input(dt, P, Ci, &d, elem(x, n0 * Ci * iv, es), ng);
        // The bias starts each sum.
        ddl_cdir_forward(dt, &d.c, yw0, xs, w, b, ng, d.dyw_stride, d.xp_stride);
        for (int64_t t = 0; t < ng; t++) {
            cdir_grid_rows(es, P, Co, yw0 + (size_t)(t * d.dyw_stride) * es,
                           elem(y, (n0 + t) * Co * ov, es), false);
        }
    }
    return DDL_OK;
}

static ddl_status conv_backward_cdir(ddl_dtype dt, const ddl_conv_geom *g, const conv_plan *P,
                                     void *dx, void *dw, const void *dy, const void *x,
                                     const void *w, char *ws, int64_t n_begin, int64_t n_end)
{
    const sp3    *sp = &P->sp;
    const int64_t Ci = g->C_in, Co = g->C_out, iv = sp->iv, ov = sp->ov;
    const size_t  es = dt_size(dt);
    cdir_ws       d;
    cdir_setup(dt, g, P, ws, dw != NULL, &d);
    // Margins, garbage columns and tail of dyw stay zero; only the valid runs change.
    memset(d.dyw, 0, (size_t)(P->cd_group * d.dyw_stride) * es);
    if (dx != NULL && P->cd_dx_scatter) {
        ddl_cdir_dx_scatter_pack(dt, &d.c, d.wp, w);
    }
    char *dyw0 = d.dyw + (size_t)P->cd_M * es;
    for (int64_t n0 = n_begin; n0 < n_end; n0 += P->cd_group) {
        ddl__kernel_progress();
        int64_t ng = n_end - n0 < P->cd_group ? n_end - n0 : P->cd_group;
        for (int64_t t = 0; t < ng; t++) {
            cdir_grid_rows(es, P, Co, elem(dy, (n0 + t) * Co * ov, es),
                           dyw0 + (size_t)(t * d.dyw_stride) * es, true);
        }
        if (dw != NULL) {
            const char *xs = cdir_group_input(dt, P, Ci, &d, elem(x, n0 * Ci * iv, es), ng);
            ddl_cdir_dw(dt, &d.c, d.acc, dyw0, xs, d.mask, ng, d.dyw_stride, d.xp_stride,
                        n0 == n_begin);
        }
        for (int64_t t = 0; t < ng && dx != NULL; t++) {
            const char *dyw = dyw0 + (size_t)(t * d.dyw_stride) * es;
            if (P->cd_dx_scatter) {
                memset(d.dxp, 0, (size_t)(Ci * P->Pp) * es);
                ddl_cdir_dx_scatter(dt, &d.c, d.dxp, dyw, d.wp);
            } else {
                ddl_cdir_dx(dt, &d.c, d.dxp, dyw, w);
            }
            char *dxn = elem(dx, (n0 + t) * Ci * iv, es);
            if (P->cd_nph > 1) {
                if (P->dx_set) {
                    zero_bytes(dxn, (size_t)(Ci * iv) * es); // in cache, added into at once
                }
                cdir_phase_copy(dt, P, Ci, d.dxp, dxn, true); // strides
                continue;
            }
            for (int64_t ci = 0; ci < Ci; ci++) {
                for (int64_t i0 = 0; i0 < sp->in[0]; i0++) {
                    for (int64_t i1 = 0; i1 < sp->in[1]; i1++) {
                        char       *to = elem(dxn, ci * iv + (i0 * sp->in[1] + i1) * sp->in[2], es);
                        const char *from = elem(d.dxp,
                                                ci * P->Pp + (i0 + sp->p[0]) * P->PL +
                                                    (i1 + sp->p[1]) * P->I2p + sp->p[2],
                                                es);
                        if (P->dx_set) {
                            copy_bytes(to, from, (size_t)sp->in[2] * es);
                        } else {
                            add_run(dt, to, from, sp->in[2], 1);
                        }
                    }
                }
            }
        }
    }
    if (dw != NULL && n_begin < n_end) { // acc is set by the first group's call
        ddl_cdir_dw_finish(dt, &d.c, dw, d.acc);
    }
    return DDL_OK;
}

// ---- the channel-vector path ------------------------------------------------------------

// The slot carved, the offsets filled: output position o reads its first tap at padded
// position ob = o0 s0 PL + o1 s1 I2p + o2 s2, tap kk = (k0, k1, k2) koff = k0 d0 PL +
// k1 d1 I2p + k2 d2 further, and tap t = (ci, kk) of a sample at ci Pp + koff.
static void cvec_setup(ddl_dtype dt, const ddl_conv_geom *g, const conv_plan *P, char *ws,
                       cvec_ws *d)
{
    const sp3 *sp = &P->sp;
    cvec_carve(dt, g, P, ws, d);
    for (int64_t o0 = 0, p = 0; o0 < sp->out[0]; o0++) {
        for (int64_t o1 = 0; o1 < sp->out[1]; o1++) {
            for (int64_t o2 = 0; o2 < sp->out[2]; o2++, p++) {
                d->ob[p] = o0 * sp->s[0] * P->PL + o1 * sp->s[1] * P->I2p + o2 * sp->s[2];
            }
        }
    }
    for (int64_t k0 = 0, kk = 0; k0 < sp->k[0]; k0++) {
        for (int64_t k1 = 0; k1 < sp->k[1]; k1++) {
            for (int64_t k2 = 0; k2 < sp->k[2]; k2++, kk++) {
                d->koff[kk] = k0 * sp->d[0] * P->PL + k1 * sp->d[1] * P->I2p + k2 * sp->d[2];
            }
        }
    }
    for (int64_t t = 0; t < P->Kc; t++) {
        d->toff[t] = t / sp->kv * P->Pp + d->koff[t % sp->kv];
    }
    d->c = (ddl_cvec){.Ci   = g->C_in,
                      .Co   = g->C_out,
                      .kv   = sp->kv,
                      .Kc   = P->Kc,
                      .ov   = sp->ov,
                      .Pp   = P->Pp,
                      .ob   = d->ob,
                      .koff = d->koff,
                      .toff = d->toff};
}

static ddl_status conv_forward_cvec(ddl_dtype dt, const ddl_conv_geom *g, const conv_plan *P,
                                    void *y, const void *x, const void *w, const void *b, char *ws,
                                    int64_t n_begin, int64_t n_end)
{
    const int64_t Ci = g->C_in, Co = g->C_out, iv = P->sp.iv, ov = P->sp.ov;
    const size_t  es = dt_size(dt);
    cvec_ws       d;
    cvec_setup(dt, g, P, ws, &d);
    ddl_cvec_transpose(dt, d.wT, Co, w, P->Kc, Co, P->Kc, false);
    for (int64_t n0 = n_begin; n0 < n_end; n0 += P->nb) {
        ddl__kernel_progress();
        int64_t ng = n_end - n0 < P->nb ? n_end - n0 : P->nb;
        for (int64_t t = 0; t < ng; t++) {
            pad_sample(dt, P, Ci, d.xp + (size_t)(t * Ci * P->Pp) * es,
                       elem(x, (n0 + t) * Ci * iv, es));
        }
        ddl_cvec_forward(dt, &d.c, d.yT, d.xp, d.wT, b, ng);
        for (int64_t t = 0; t < ng; t++) {
            ddl_cvec_transpose(dt, elem(y, (n0 + t) * Co * ov, es), ov,
                               d.yT + (size_t)(t * ov * Co) * es, Co, ov, Co, false);
        }
    }
    return DDL_OK;
}

// dx of one sample from its transposed padded gradient dxpT [Pp, Ci], through tmp [Ci, Pp]
// (the group's xp, free once dW has read it): each input row a run, set or added.
static void cvec_dx_out(ddl_dtype dt, const conv_plan *P, int64_t Ci, char *dxn, const char *dxpT,
                        char *tmp)
{
    const sp3   *sp = &P->sp;
    const size_t es = dt_size(dt);
    ddl_cvec_transpose(dt, tmp, P->Pp, dxpT, Ci, P->Pp, Ci, false);
    for (int64_t ci = 0; ci < Ci; ci++) {
        for (int64_t i0 = 0, q = 0; i0 < sp->in[0]; i0++) {
            for (int64_t i1 = 0; i1 < sp->in[1]; i1++, q += sp->in[2]) {
                const char *from = tmp + (size_t)(ci * P->Pp + (i0 + sp->p[0]) * P->PL +
                                                  (i1 + sp->p[1]) * P->I2p + sp->p[2]) *
                                             es;
                char *to = dxn + (size_t)(ci * sp->iv + q) * es;
                if (P->dx_set) {
                    copy_bytes(to, from, (size_t)sp->in[2] * es);
                } else {
                    add_run(dt, to, from, sp->in[2], 1);
                }
            }
        }
    }
}

// wK [kk, co, ci] = w [co, ci kv + kk]: the dx kernel's order.
#define CVEC_PACK(T_)                                                                              \
    do {                                                                                           \
        const T_ *a = (const T_ *)w;                                                               \
        T_       *o = (T_ *)(void *)wK;                                                            \
        for (int64_t co = 0; co < Co; co++) {                                                      \
            for (int64_t ci = 0; ci < Ci; ci++) {                                                  \
                for (int64_t kk = 0; kk < kv; kk++) {                                              \
                    o[(kk * Co + co) * Ci + ci] = a[(co * Ci + ci) * kv + kk];                     \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    } while (0)

static void cvec_pack_wk(ddl_dtype dt, int64_t Co, int64_t Ci, int64_t kv, char *wK, const void *w)
{
    if (dt == DDL_F32) {
        CVEC_PACK(float);
    } else {
        CVEC_PACK(double);
    }
}
#undef CVEC_PACK

static ddl_status conv_backward_cvec(ddl_dtype dt, const ddl_conv_geom *g, const conv_plan *P,
                                     void *dx, void *dw, const void *dy, const void *x,
                                     const void *w, char *ws, int64_t n_begin, int64_t n_end)
{
    const int64_t Ci = g->C_in, Co = g->C_out, Kc = P->Kc, kv = P->sp.kv;
    const int64_t iv = P->sp.iv, ov = P->sp.ov;
    const size_t  es = dt_size(dt);
    cvec_ws       d;
    cvec_setup(dt, g, P, ws, &d);
    if (dw != NULL) {
        memset(d.dWT, 0, (size_t)(Kc * Co) * es);
    }
    if (dx != NULL) {
        cvec_pack_wk(dt, Co, Ci, kv, d.wK, w);
    }
    for (int64_t n0 = n_begin; n0 < n_end; n0 += P->nb) {
        ddl__kernel_progress();
        int64_t     ng  = n_end - n0 < P->nb ? n_end - n0 : P->nb;
        const char *dyg = elem(dy, n0 * Co * ov, es);
        if (dw != NULL) {
            for (int64_t t = 0; t < ng; t++) {
                pad_sample(dt, P, Ci, d.xp + (size_t)(t * Ci * P->Pp) * es,
                           elem(x, (n0 + t) * Ci * iv, es));
                ddl_cvec_transpose(dt, d.yT + (size_t)(t * ov * Co) * es, Co,
                                   dyg + (size_t)(t * Co * ov) * es, ov, Co, ov, false);
            }
            ddl_cvec_dw(dt, &d.c, d.dWT, d.xp, d.yT, ng);
        }
        if (dx != NULL) {
            memset(d.dxpT, 0, (size_t)(ng * P->Pp * Ci) * es);
            ddl_cvec_dx(dt, &d.c, d.dxpT, dyg, d.wK, ng);
            for (int64_t t = 0; t < ng; t++) {
                cvec_dx_out(dt, P, Ci, elem(dx, (n0 + t) * Ci * iv, es),
                            d.dxpT + (size_t)(t * P->Pp * Ci) * es, d.xp);
            }
        }
    }
    if (dw != NULL) {
        ddl_cvec_transpose(dt, dw, Kc, d.dWT, Co, Kc, Co, true); // dw [co, t] += dWT [t, co]
    }
    return DDL_OK;
}

// y for samples [n_begin, n_end) (n_begin a multiple of P->nb) through the im2col
// workspace ws (one thread's slot).
static ddl_status conv_forward_range(ddl_dtype dt, const ddl_conv_geom *g, const conv_plan *P,
                                     void *y, const void *x, const void *w, const void *b,
                                     char *ws, int64_t n_begin, int64_t n_end)
{
    const int64_t Ci = g->C_in, Co = g->C_out, Kc = P->Kc;
    const int64_t iv = P->sp.iv, ov = P->sp.ov;
    const size_t  es = dt_size(dt);
    if (P->cvec) {
        return conv_forward_cvec(dt, g, P, y, x, w, b, ws, n_begin, n_end);
    }
    if (P->cdir) {
        return conv_forward_cdir(dt, g, P, y, x, w, b, ws, n_begin, n_end);
    }
    if (P->wide) {
        return conv_forward_wide(dt, g, P, y, x, w, b, ws, n_begin, n_end);
    }
    char *col   = ws;
    char *stage = ws + P->col_bytes;
    if (P->nb == 1) {
        for (int64_t n = n_begin; n < n_end; n++) {
            ddl__kernel_progress();
            const char *xn = elem(x, n * Ci * iv, es);
            char       *yn = elem(y, n * Co * ov, es);
            for (int64_t j0 = 0; j0 < ov; j0 += P->cols) {
                int64_t nc = ov - j0 < P->cols ? ov - j0 : P->cols;
                im2col(dt, &P->sp, Ci, col, nc, xn, j0, nc);
                DDL_CHECK(ddl_gemm(dt, false, false, Co, nc, Kc, 1.0, w, Kc, col, nc, 0.0,
                                   elem(yn, j0, es), ov));
                if (b != NULL) {
                    add_bias(dt, elem(yn, j0, es), ov, Co, nc, b);
                }
            }
        }
        return DDL_OK;
    }
    // Several samples per block: columns [t*ov, (t+1)*ov) belong to sample n0 + t, and the
    // GEMM result [Co, nc] is scattered back to the per-sample [Co, ov] layout.
    for (int64_t n0 = n_begin; n0 < n_end; n0 += P->nb) {
        ddl__kernel_progress();
        int64_t nt = n_end - n0 < P->nb ? n_end - n0 : P->nb, nc = nt * ov;
        for (int64_t t = 0; t < nt; t++) {
            im2col(dt, &P->sp, Ci, elem(col, t * ov, es), nc, elem(x, (n0 + t) * Ci * iv, es),
                   0, ov);
        }
        DDL_CHECK(ddl_gemm(dt, false, false, Co, nc, Kc, 1.0, w, Kc, col, nc, 0.0, stage, nc));
        if (b != NULL) {
            add_bias(dt, stage, nc, Co, nc, b);
        }
        for (int64_t t = 0; t < nt; t++) {
            for (int64_t co = 0; co < Co; co++) {
                memcpy(elem(y, ((n0 + t) * Co + co) * ov, es), elem(stage, co * nc + t * ov, es),
                       (size_t)ov * es);
            }
        }
    }
    return DDL_OK;
}

// dx and dw (either may be NULL) for samples [n_begin, n_end) through the workspace ws.
static ddl_status conv_backward_range(ddl_dtype dt, const ddl_conv_geom *g, const conv_plan *P,
                                      void *dx, void *dw, const void *dy, const void *x,
                                      const void *w, char *ws, int64_t n_begin, int64_t n_end)
{
    const int64_t Ci = g->C_in, Co = g->C_out, Kc = P->Kc;
    const int64_t iv = P->sp.iv, ov = P->sp.ov;
    const size_t  es = dt_size(dt);
    if (P->cvec) {
        return conv_backward_cvec(dt, g, P, dx, dw, dy, x, w, ws, n_begin, n_end);
    }
    if (P->cdir) {
        return conv_backward_cdir(dt, g, P, dx, dw, dy, x, w, ws, n_begin, n_end);
    }
    if (P->wide) {
        return conv_backward_wide(dt, g, P, dx, dw, dy, x, w, ws, n_begin, n_end);
    }
    char *col   = ws;
    char *stage = ws + P->col_bytes;
    if (P->nb == 1) {
        for (int64_t n = n_begin; n < n_end; n++) {
            ddl__kernel_progress();
            const char *xn  = x != NULL ? elem(x, n * Ci * iv, es) : NULL;
            const char *dyn = elem(dy, n * Co * ov, es);
            char       *dxn = dx != NULL ? elem(dx, n * Ci * iv, es) : NULL;
            if (dxn != NULL && P->dx_set) {
                zero_bytes(dxn, (size_t)(Ci * iv) * es); // the sample's, added into below
            }
            for (int64_t j0 = 0; j0 < ov; j0 += P->cols) {
                int64_t nc = ov - j0 < P->cols ? ov - j0 : P->cols;
                if (dw != NULL) {
                    im2col(dt, &P->sp, Ci, col, nc, xn, j0, nc);
                    DDL_CHECK(ddl_gemm(dt, false, true, Co, Kc, nc, 1.0, elem(dyn, j0, es), ov,
                                       col, nc, 1.0, dw, Kc));
                }
                if (dx != NULL) {
                    DDL_CHECK(ddl_gemm(dt, true, false, Kc, nc, Co, 1.0, w, Kc,
                                       elem(dyn, j0, es), ov, 0.0, col, nc));
                    col2im_add(dt, &P->sp, Ci, col, nc, dxn, j0, nc);
                }
            }
        }
        return DDL_OK;
    }
    // Several samples per block: gather dy of the block into the staging area [Co, nc]
    // so both GEMMs see one matrix.
    for (int64_t n0 = n_begin; n0 < n_end; n0 += P->nb) {
        ddl__kernel_progress();
        int64_t nt = n_end - n0 < P->nb ? n_end - n0 : P->nb, nc = nt * ov;
        for (int64_t t = 0; t < nt; t++) {
            for (int64_t co = 0; co < Co; co++) {
                memcpy(elem(stage, co * nc + t * ov, es), elem(dy, ((n0 + t) * Co + co) * ov, es),
                       (size_t)ov * es);
            }
        }
        if (dw != NULL) {
            for (int64_t t = 0; t < nt; t++) {
                im2col(dt, &P->sp, Ci, elem(col, t * ov, es), nc,
                       elem(x, (n0 + t) * Ci * iv, es), 0, ov);
            }
            DDL_CHECK(ddl_gemm(dt, false, true, Co, Kc, nc, 1.0, stage, nc, col, nc, 1.0, dw,
                               Kc));
        }
        if (dx != NULL) {
            DDL_CHECK(ddl_gemm(dt, true, false, Kc, nc, Co, 1.0, w, Kc, stage, nc, 0.0, col, nc));
            for (int64_t t = 0; t < nt; t++) {
                char *dxn = elem(dx, (n0 + t) * Ci * iv, es);
                if (P->dx_set) {
                    zero_bytes(dxn, (size_t)(Ci * iv) * es);
                }
                col2im_add(dt, &P->sp, Ci, elem(col, t * ov, es), nc, dxn, 0, ov);
            }
        }
    }
    return DDL_OK;
}

// ---- the block loop over threads ---------------------------------------------------

typedef struct conv_par {
    ddl_dtype            dt;
    const ddl_conv_geom *g;
    const conv_plan     *P;
    bool                 backward;
    void                *y, *dx, *dw;
    const void          *x, *w, *b, *dy;
    char                *ws;
    int                  T;
    bool                 whole; // a single part too runs its GEMMs whole (width 1)
} conv_par;

typedef struct conv_part {
    const conv_par *c;
    int             t;
    ddl_status      st;
} conv_part;

// Part t's share: blocks [U t / T, U (t+1) / T), its workspace slot and, for t > 0, its
// own dW accumulator (zeroed here) after the T slots. Which thread runs it does not matter.
static ddl_status conv_part_run(const conv_par *c, int t)
{
    const conv_plan *P     = c->P;
    int64_t          units = conv_units(c->g, P);
    int64_t          u0 = units * t / c->T, u1 = units * (t + 1) / c->T;
    int64_t          n0 = u0 * P->nb, n1 = u1 * P->nb < c->g->N ? u1 * P->nb : c->g->N;
    char            *ws = c->ws + (size_t)t * conv_slot_bytes(P); // t = 0 when T = 1
    if (!c->backward) {
        return conv_forward_range(c->dt, c->g, P, c->y, c->x, c->w, c->b, ws, n0, n1);
    }
    void *dw = c->dw;
    if (dw != NULL && t > 0) {
        size_t dwb = conv_dwbuf_bytes(c->dt, c->g, P);
        dw         = c->ws + (size_t)c->T * conv_slot_bytes(P) + (size_t)(t - 1) * dwb;
        memset(dw, 0, (size_t)(c->g->C_out * P->Kc) * dt_size(c->dt));
    }
    return conv_backward_range(c->dt, c->g, P, c->dx, dw, c->dy, c->x, c->w, ws, n0, n1);
}

// One part for the pool: thread index t of T is part t of T.
static ddl_status conv_part_fn(void *arg, int t, int T)
{
    (void)T;
    return conv_part_run(arg, t);
}

// Runs the block loop of c (c->T unset) in as many parts as the BLAS thread count, the
// batch and ws_bytes allow, on the kernel thread pool.
static ddl_status conv_blocks(const char *who, conv_par *c, size_t ws_bytes)
{
    int  T       = conv_threads_for(c->g, c->P, ddl_blas_set_threads(0));
    bool with_dw = c->backward && c->dw != NULL;
    while (T > 1 && conv_need(c->dt, c->g, c->P, T, with_dw) > ws_bytes) {
        T--;
    }
    if (T > DDL_POOL_MAX_PARTS) {
        T = DDL_POOL_MAX_PARTS;
    }
    c->T = T;
    if (T <= 1 && !c->whole) {
        return conv_part_run(c, 0);
    }
    if (T <= 1) {
        // Parts run their GEMMs whole (below); so does a lone part when asked, as a
        // sample inside a larger batch would (ddl_conv_forward_rows).
        int        prev = ddl_blas_set_threads(1);
        ddl_status st   = conv_part_run(c, 0);
        ddl_blas_set_threads(prev);
        return st;
    }
    int        prev = ddl_blas_set_threads(1);
    ddl_status st   = ddl_pool_run(who, T, conv_part_fn, c);
    ddl_blas_set_threads(prev);
    DDL_CHECK(st);
    if (with_dw) {
        // dw += the partials of parts 1..T-1, in that order (deterministic).
        size_t  dwb = conv_dwbuf_bytes(c->dt, c->g, c->P);
        int64_t nw  = c->g->C_out * c->P->Kc;
        for (int t = 1; t < T; t++) {
            add_run(c->dt, c->dw, c->ws + (size_t)T * conv_slot_bytes(c->P) + (size_t)(t - 1) * dwb,
                    nw, 1);
        }
    }
    return DDL_OK;
}

// rows: batch-invariant (ddl_conv_forward_rows): one sample per block, and every GEMM of
// a block whole on its thread, so a sample's bits never depend on the batch around it.
static ddl_status conv_forward(ddl_dtype dt, const ddl_conv_geom *g, void *y, const void *x,
                               const void *w, const void *b, void *ws, size_t ws_bytes, bool rows)
{
    conv_plan P;
    DDL_CHECK(conv_args("conv_forward", dt, g, ws, ws_bytes, false, &P));
    if (rows && P.nb > 1) {
        // One sample per block: the wide layout's block is then one sample's Ws columns,
        // the general one's a sample's ov positions (both within the planned block).
        P.nb   = 1;
        P.cols = P.wide ? P.Ws : P.sp.ov;
    }
    const int64_t N = g->N, Ci = g->C_in, Co = g->C_out, Kc = P.Kc;
    const int64_t iv = P.sp.iv, ov = P.sp.ov;
    const size_t  es = dt_size(dt);
    if (N == 0 || Co == 0) {
        return DDL_OK;
    }
    DDL_REQUIRE(y != NULL && (Kc == 0 || (x != NULL && w != NULL)), DDL_EINVAL,
                "conv_forward: y, x or w is NULL");
    if (Kc == 0) {
        // No input channels: the product is empty and y is the bias (or zero).
        memset(y, 0, (size_t)(N * Co * ov) * es);
        for (int64_t n = 0; b != NULL && n < N; n++) {
            add_bias(dt, elem(y, n * Co * ov, es), ov, Co, ov, b);
        }
        return DDL_OK;
    }
    if (P.direct) {
        // y_n [Co, ov] = W [Co, Ci] · x_n [Ci, ov] (+ b): x_n is its own column matrix.
        for (int64_t n = 0; n < N; n++) {
            ddl__kernel_progress();
            char *yn = elem(y, n * Co * ov, es);
            DDL_CHECK(ddl_gemm(dt, false, false, Co, ov, Ci, 1.0, w, Ci, elem(x, n * Ci * iv, es),
                               ov, 0.0, yn, ov));
            if (b != NULL) {
                add_bias(dt, yn, ov, Co, ov, b);
            }
        }
        return DDL_OK;
    }
    conv_par c = {.dt = dt, .g = g, .P = &P, .backward = false, .y = y, .x = x, .w = w, .b = b,
                  .ws = ws};
    c.whole    = rows;
    return conv_blocks("conv_forward", &c, ws_bytes);
}

ddl_status ddl_conv_forward(ddl_dtype dt, const ddl_conv_geom *g, void *y, const void *x,
                            const void *w, const void *b, void *ws, size_t ws_bytes)
{
    return conv_forward(dt, g, y, x, w, b, ws, ws_bytes, false);
}

ddl_status ddl_conv_forward_rows(ddl_dtype dt, const ddl_conv_geom *g, void *y, const void *x,
                                 const void *w, const void *b, void *ws, size_t ws_bytes)
{
    return conv_forward(dt, g, y, x, w, b, ws, ws_bytes, true);
}

// ---- backward ---------------------------------------------------------------------

ddl_status ddl_conv_backward(ddl_dtype dt, const ddl_conv_geom *g, void *dx, void *dw,
                             void *db, const void *dy, const void *x, const void *w, void *ws,
                             size_t ws_bytes)
{
    return ddl_conv_backward_ex(dt, g, dx, dw, db, dy, x, w, ws, ws_bytes, 0);
}

ddl_status ddl_conv_backward_ex(ddl_dtype dt, const ddl_conv_geom *g, void *dx, void *dw, void *db,
                                const void *dy, const void *x, const void *w, void *ws,
                                size_t ws_bytes, unsigned flags)
{
    conv_plan P;
    DDL_CHECK(conv_args("conv_backward", dt, g, ws, ws_bytes, true, &P));
    DDL_REQUIRE((flags & ~(unsigned)DDL_CONV_DX_SET) == 0, DDL_EINVAL,
                "conv_backward: unknown flags 0x%x", flags & ~(unsigned)DDL_CONV_DX_SET);
    P.dx_set        = dx != NULL && (flags & DDL_CONV_DX_SET) != 0;
    const int64_t N = g->N, Ci = g->C_in, Co = g->C_out, Kc = P.Kc;
    const int64_t iv = P.sp.iv, ov = P.sp.ov;
    const size_t  es = dt_size(dt);
    if (P.dx_set && (Co == 0 || Kc == 0)) {
        zero_bytes(dx, (size_t)(N * Ci * iv) * es); // no tap reaches dx: it is zero
    }
    if (N == 0 || Co == 0) {
        return DDL_OK;
    }
    DDL_REQUIRE(dy != NULL, DDL_EINVAL, "conv_backward: dy is NULL");
    DDL_REQUIRE(dw == NULL || Kc == 0 || x != NULL, DDL_EINVAL,
                "conv_backward: dw requested but x is NULL");
    DDL_REQUIRE(dx == NULL || Kc == 0 || w != NULL, DDL_EINVAL,
                "conv_backward: dx requested but w is NULL");
    if (P.cdir && P.cd_inplace && dx != NULL && dw != NULL) {
        // Parts read x (and its tail) in place while others write their samples of dx.
        uintptr_t xa = (uintptr_t)x, xe = xa + (size_t)(N * Ci * iv + g->x_tail) * es;
        uintptr_t da = (uintptr_t)dx, de = da + (size_t)(N * Ci * iv) * es;
        DDL_REQUIRE(de <= xa || xe <= da, DDL_EINVAL,
                    "conv_backward: dx overlaps x and its x_tail, which are read in place; "
                    "compute dw and dx in two calls");
    }
    if (db != NULL) {
        // db[co] += sum over samples and positions of dy, summed in double.
        for (int64_t co = 0; co < Co; co++) {
            double acc = 0.0;
            for (int64_t n = 0; n < N; n++) {
                acc += row_sum(dt, elem(dy, (n * Co + co) * ov, es), ov);
            }
            add_at(dt, db, co, acc);
        }
    }
    if (Kc == 0 || (dx == NULL && dw == NULL)) {
        return DDL_OK;
    }
    if (P.direct) {
        for (int64_t n = 0; n < N; n++) {
            ddl__kernel_progress();
            const char *dyn = elem(dy, n * Co * ov, es);
            if (dw != NULL) {
                DDL_CHECK(ddl_gemm(dt, false, true, Co, Ci, ov, 1.0, dyn, ov,
                                   elem(x, n * Ci * iv, es), ov, 1.0, dw, Ci));
            }
            if (dx != NULL) {
                DDL_CHECK(ddl_gemm(dt, true, false, Ci, ov, Co, 1.0, w, Ci, dyn, ov,
                                   P.dx_set ? 0.0 : 1.0, elem(dx, n * Ci * iv, es), ov));
            }
        }
        return DDL_OK;
    }
    conv_par c = {.dt = dt, .g = g, .P = &P, .backward = true, .dx = dx, .dw = dw, .dy = dy,
                  .x = x, .w = w, .ws = ws};
    return conv_blocks("conv_backward", &c, ws_bytes);
}

// ---- naive reference --------------------------------------------------------------
// Direct loops over (n, co, o, ci, kk) with explicit bounds tests: slow, obviously right.

// Flat index of input tap (o + kk) of channel plane `plane`, or -1 for a padding tap.
static inline int64_t tap_index(const sp3 *sp, int64_t plane, const int64_t o[3],
                                const int64_t kk[3])
{
    int64_t idx = 0;
    for (int i = 0; i < 3; i++) {
        int64_t ii = o[i] * sp->s[i] - sp->p[i] + kk[i] * sp->d[i];
        if (ii < 0 || ii >= sp->in[i]) {
            return -1;
        }
        idx = idx * sp->in[i] + ii;
    }
    return plane * sp->iv + idx;
}

ddl_status ddl_conv_forward_naive(ddl_dtype dt, const ddl_conv_geom *g, void *y, const void *x,
                                  const void *w, const void *b)
{
    conv_plan P;
    DDL_CHECK(conv_plan_make("conv_forward_naive", dt, g, &P, false));
    const sp3    *sp = &P.sp;
    const int64_t Ci = g->C_in, Co = g->C_out;
    if (g->N == 0 || Co == 0) {
        return DDL_OK;
    }
    DDL_REQUIRE(y != NULL && (P.Kc == 0 || (x != NULL && w != NULL)), DDL_EINVAL,
                "conv_forward_naive: y, x or w is NULL");
    int64_t o[3], kk[3];
    for (int64_t n = 0; n < g->N; n++) {
        for (int64_t co = 0; co < Co; co++) {
            int64_t oi = (n * Co + co) * sp->ov;
            for (o[0] = 0; o[0] < sp->out[0]; o[0]++) {
                for (o[1] = 0; o[1] < sp->out[1]; o[1]++) {
                    for (o[2] = 0; o[2] < sp->out[2]; o[2]++, oi++) {
                        double acc = b != NULL ? ld_at(dt, b, co) : 0.0;
                        int64_t wi = co * Ci * sp->kv;
                        for (int64_t ci = 0; ci < Ci; ci++) {
                            for (kk[0] = 0; kk[0] < sp->k[0]; kk[0]++) {
                                for (kk[1] = 0; kk[1] < sp->k[1]; kk[1]++) {
                                    for (kk[2] = 0; kk[2] < sp->k[2]; kk[2]++, wi++) {
                                        int64_t xi = tap_index(sp, n * Ci + ci, o, kk);
                                        if (xi >= 0) {
                                            acc += ld_at(dt, w, wi) * ld_at(dt, x, xi);
                                        }
                                    }
                                }
                            }
                        }
                        st_at(dt, y, oi, acc);
                    }
                }
            }
        }
    }
    return DDL_OK;
}

ddl_status ddl_conv_backward_naive(ddl_dtype dt, const ddl_conv_geom *g, void *dx, void *dw,
                                   void *db, const void *dy, const void *x, const void *w)
{
    conv_plan P;
    DDL_CHECK(conv_plan_make("conv_backward_naive", dt, g, &P, false));
    const sp3    *sp = &P.sp;
    const int64_t Ci = g->C_in, Co = g->C_out;
    if (g->N == 0 || Co == 0) {
        return DDL_OK;
    }
    DDL_REQUIRE(dy != NULL, DDL_EINVAL, "conv_backward_naive: dy is NULL");
    DDL_REQUIRE((dw == NULL || P.Kc == 0 || x != NULL) && (dx == NULL || P.Kc == 0 || w != NULL),
                DDL_EINVAL, "conv_backward_naive: x or w is NULL");
    int64_t o[3], kk[3];
    for (int64_t n = 0; n < g->N; n++) {
        for (int64_t co = 0; co < Co; co++) {
            int64_t oi = (n * Co + co) * sp->ov;
            for (o[0] = 0; o[0] < sp->out[0]; o[0]++) {
                for (o[1] = 0; o[1] < sp->out[1]; o[1]++) {
                    for (o[2] = 0; o[2] < sp->out[2]; o[2]++, oi++) {
                        double gy = ld_at(dt, dy, oi);
                        if (db != NULL) {
                            add_at(dt, db, co, gy);
                        }
                        int64_t wi = co * Ci * sp->kv;
                        for (int64_t ci = 0; ci < Ci; ci++) {
                            for (kk[0] = 0; kk[0] < sp->k[0]; kk[0]++) {
                                for (kk[1] = 0; kk[1] < sp->k[1]; kk[1]++) {
                                    for (kk[2] = 0; kk[2] < sp->k[2]; kk[2]++, wi++) {
                                        int64_t xi = tap_index(sp, n * Ci + ci, o, kk);
                                        if (xi < 0) {
                                            continue;
                                        }
                                        if (dx != NULL) {
                                            add_at(dt, dx, xi, gy * ld_at(dt, w, wi));
                                        }
                                        if (dw != NULL) {
                                            add_at(dt, dw, wi, gy * ld_at(dt, x, xi));
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    return DDL_OK;
}
