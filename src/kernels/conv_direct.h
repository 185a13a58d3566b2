// kernels/conv_direct.h: internal: direct (no im2col, no GEMM) convolution kernels on
// the "wide" padded layout of kernels/conv.c, in AVX2 + FMA and AVX-512F: for few input
// channels at either width, for any number at AVX-512; 1-D, 2-D and 3-D, stride 1.
//
// With C_in * prod(k) small (LeNet's first layer: 1 x 5 x 5 = 25) the im2col GEMM has a
// tiny K or M: its packing and the column matrix (25x the input) cost more than the
// multiply-adds, and the backward dx GEMM has K = C_out = 6. These kernels read the
// zero-padded sample xp [C_in, Pp] directly. Output position j = o0 PL + o1 I2p + o2 of
// the wide grid (I2p the padded row length, PL = I1p I2p the padded plane; o0 = 0 in 1-D
// and 2-D) reads xp at j + toff[t] for tap t = (ci, k0, k1, k2),
// toff[t] = ci Pp + k0 d0 PL + k1 d1 I2p + k2 d2, so for a run of positions every tap is one
// contiguous vector load, and a register tile of output channels x positions takes one
// broadcast weight per (channel, tap):
//   forward  yw [co, j]  = b[co] + sum_t w[co, t] xp[toff[t] + j]    j in [0, nj)
//   dW       dw [co, t] += sum_j dyw[co, j] (xp[toff[t] + j] & mask[j])   (per lane in
//            acc over a range of samples, then reduced into dw by ddl_cdir_dw_finish)
//   dx       dxp[ci, q]  = sum_{co, kk} w[co, ci, kk] dyw[co, q - koff[kk]]   q in [0, nq)
// where dyw is dy in the wide layout with zeros at the positions past each output row (and plane)
// and before (a margin of koff's largest value) and after the valid ones, and mask[j] is
// all-ones exactly at the valid positions (so an inf or NaN of x at a garbage position
// never meets a zero of dy: 0 * inf). Each sum runs in a fixed order: results are the same
// run to run (and with any thread count, the caller adding the dW partials in order),
// but not bit-identical to the GEMM path (FMA, another summation order).
//
// Runtime dispatch on the vector width: AVX-512F where the CPU has it, else AVX2 + FMA,
// else none (ddl_cdir_enabled false); the im2col + GEMM path and the naive loops of
// conv.c remain the reference and the fallback. The environment can cap it:
// DDL_CONV_DIRECT=0 (off) or =avx2. The two widths sum in different orders: results are
// the same run to run on one machine, not across vector widths.
#ifndef DDL_KERNELS_CONV_DIRECT_H
#define DDL_KERNELS_CONV_DIRECT_H

#include <stdbool.h>
#include <stdint.h>

#include "ddl/kernels.h" // ddl_conv_geom
#include "ddl/tensor.h"

// Largest C_in the direct path is taken for at AVX2 width (see conv_plan_make): beyond
// it the im2col GEMM's K = C_in prod(k) is large enough for the BLAS to run near its
// peak. At AVX-512 the direct path is taken for any C_in (measured on AMD EPYC Zen 5,
// 64->64 channels 56x56 3x3, batch 32, one thread, CPU time: forward 32, dW + db 41,
// dx 50 ms against 72, 78, 70 ms for im2col + OpenBLAS's Haswell sgemm), as long as its
// dW accumulators fit in DDL_CDIR_MAX_ACC bytes.
#define DDL_CDIR_MAX_CIN 8
#define DDL_CDIR_MAX_ACC ((size_t)8 << 20)
// Largest workspace slot (per thread) of the direct path: its padded planes scale with the
// sample (two copies of C_in padded volumes, one of C_out), so large 3-D volumes (a U-Net
// level at 128^3: 8 channels of 130^3 floats, 70 MB a copy) keep the im2col path, whose
// slot is a block of columns (DDL_CONV_BLOCK_BYTES).
#define DDL_CDIR_MAX_SLOT ((size_t)64 << 20)
// Most samples one dW call sums (conv.c groups samples whose grid is short next to the
// dW accumulators, see conv_plan_make).
#define DDL_CDIR_DW_GROUP 8
// nj and nq are multiples of DDL_CDIR_ALIGN elements: one AVX-512 vector of floats (every
// kernel steps down to one vector; at the other widths that is two or four). Not more: a
// grid rounded up to 32 gave a 2-row block of a 4x4 plane (ResNet's last stage, split over
// 2 ranks) 32 positions for 8 outputs, and the split layer ran no faster than the whole.
#define DDL_CDIR_ALIGN 16
// Bytes of one dW lane accumulator (a 512-bit vector).
#define DDL_CDIR_LANE_BYTES 64

typedef struct ddl_cdir {
    int64_t        Ci, Co, Kc, kv; // Kc = Ci * kv taps; w is [Co, Kc]
    const int64_t *toff;           // [Kc]: offset of tap t in xp
    const int64_t *dtoff;          // [Kc]: offset of tap t in dxp (toff, unless xp is the
                                   // caller's x read in place, whose planes lie closer)
    const int64_t *koff;           // [kv]: offset of tap kk within one channel plane
    int64_t        Pp;             // channel plane stride of dxp (and of xp in toff)
    int64_t        ldy;            // row stride of yw / dyw (channel co at co * ldy)
    int64_t        nj;             // positions of the forward and dW (multiple of ALIGN)
    int64_t        nq;             // positions of dx (multiple of ALIGN)
} ddl_cdir;

// Whether the direct path is used: the CPU has AVX2 and FMA, the environment does not
// set DDL_CONV_DIRECT=0, and no override (below) says otherwise. Cached after the first
// call.
bool ddl_cdir_enabled(void);
// The vector width in use: 0 (off), 1 (AVX2 + FMA) or 2 (AVX-512F).
int ddl_cdir_level(void);
// For tests and benches: the vector width to use, capped by the CPU's: 0 off (the
// im2col path), 1 AVX2, 2 AVX-512; -1 back to the default. Returns the previous level.
// Workspaces need not be resized (ddl_conv_workspace_bytes covers both paths).
int ddl_cdir_set(int level);
// Most samples one dW call sums (DDL_CDIR_DW_GROUP unless set), and for tests and
// benches its setting: most < 1 restores the default. Returns the previous value. The
// bits do not depend on it (ddl_cdir_dw); the workspace a plan asks for does.
int ddl_cdir_dw_group(void);
int ddl_cdir_set_dw_group(int most);
// For tests and benches: whether a forward (backward false) or backward call of geometry
// g with a workspace of ws_bytes would run the direct kernels.
bool ddl_cdir_taken(ddl_dtype dt, const ddl_conv_geom *g, size_t ws_bytes, bool backward);
// For tests: the samples per dW call of a backward call of g with ws_bytes (0: not the
// direct path).
int64_t ddl_cdir_dw_group_of(ddl_dtype dt, const ddl_conv_geom *g, size_t ws_bytes);

// The three kernels (dt DDL_F32 or DDL_F64; pointers to element 0 of the wide grid:
// dyw must be readable and zero from dyw - max(koff) on, see above).
// The forward of ns samples (ns >= 1): sample s's xp at xp + s sx, its yw at yw + s sy
// (elements). Samples whose grid is shorter than the kernel's tile share its tiles; the
// bits are those of one sample per call.
void ddl_cdir_forward(ddl_dtype dt, const ddl_cdir *c, void *yw, const void *xp, const void *w,
                      const void *b /* may be NULL */, int64_t ns, int64_t sy, int64_t sx);
// acc: [Co, Kc, lanes] with room for DDL_CDIR_LANE_BYTES per (co, t); ddl_cdir_dw_finish
// adds each lane sum, in a fixed order, to dw. ddl_cdir_dw sums ns samples (ns >= 1):
// sample s's dyw at dyw + s sdy, its xp at xp + s sx (elements), onto acc, or with `fresh`
// into it from zero (acc's contents unread: the first call of a batch range, which need
// not clear C_out Kc 64 bytes first). The bits equal ns calls of one sample each, in order.
void ddl_cdir_dw(ddl_dtype dt, const ddl_cdir *c, void *acc, const void *dyw, const void *xp,
                 const void *mask, int64_t ns, int64_t sdy, int64_t sx, bool fresh);
void ddl_cdir_dw_finish(ddl_dtype dt, const ddl_cdir *c, void *dw, const void *acc);
void ddl_cdir_dx(ddl_dtype dt, const ddl_cdir *c, void *dxp, const void *dyw, const void *w);
// dx as a scatter: dxp[dtoff[t] + j] += sum_co w[co, t] dyw[co, j] over j in [0, nj) (the
// caller zeroes dxp): Kc nj Co multiply-adds against the gather's Ci nq kv Co, so the
// better choice when nq is well above the number of output positions (small unpadded
// planes: LeNet's conv2, 224 against 100).
// wp: w [Co, Kc] in the scatter's tile order, from ddl_cdir_dx_scatter_pack (Co Kc
// elements; the order depends on the vector width in use, so pack and scatter at one).
void ddl_cdir_dx_scatter_pack(ddl_dtype dt, const ddl_cdir *c, void *wp, const void *w);
void ddl_cdir_dx_scatter(ddl_dtype dt, const ddl_cdir *c, void *dxp, const void *dyw,
                         const void *wp);

// ---- channel-vector kernels (small output planes, any stride) --------------------------
// For planes of a few positions (ResNet's 7x7 and 4x4 stages, and the strided layers that
// lead to them) the kernels above spend their vectors on grids that are mostly margin, and
// their dW keeps a lane accumulator per weight. These kernels put channels in the vector
// lanes instead, as an implicit GEMM over rows m = (sample, output position), with a
// padded sample xp [C_in, Pp] (Pp = prod(in + 2 p), channel planes Pp apart):
//   forward  yT [m, co]  = b[co] + sum_t xp_n[ob[p] + toff[t]] wT[t, co]
//   dW       dWT[t, co] += sum_m xp_n[ob[p] + toff[t]] dyT[m, co]
//   dx       dxpT_n[(ob[p] + koff[kk]) Ci + ci] += sum_co wK[kk, co, ci] dy_n[co, p]
// with m = n ov + p, t = ci kv + kk, toff[t] = ci Pp + koff[kk], ob[p] the padded position
// of output p's first tap and koff[kk] tap kk's offset from it; yT, dyT [ns ov, Co] and
// dxpT [ns, Pp, Ci] are channel-minor. C_out (forward, dW) and C_in (dx) must be
// multiples of ddl_cvec_lanes(dt). Each sum runs in a fixed order that does not depend on
// how rows share tiles: the forward's over the taps from the bias, dW's one chain per
// weight over the rows in order (across calls: dWT carries it), dx's over the taps in
// order, each tap's over the output channels. Results are the same run to run and for a
// sample alone or in a batch; not bit-identical to the other paths.
typedef struct ddl_cvec {
    int64_t        Ci, Co, kv, Kc, ov, Pp;
    const int64_t *ob;   // [ov]
    const int64_t *koff; // [kv]
    const int64_t *toff; // [Kc]
} ddl_cvec;

// Elements per vector of dt at the width in use (0: the vector kernels are off, or these
// kernels switched off by ddl_cvec_set).
int64_t ddl_cvec_lanes(ddl_dtype dt);
// For tests and benches: whether conv.c may pick these kernels (true by default), so that
// a test of the other direct kernels can keep their geometries. Returns the previous value.
bool ddl_cvec_set(bool on);
// For tests and benches: whether a forward (backward false) or backward call of geometry
// g with a workspace of ws_bytes would run these kernels (conv.c picks them).
bool ddl_cvec_taken(ddl_dtype dt, const ddl_conv_geom *g, size_t ws_bytes, bool backward);
// ns >= 1 samples: xp [ns, Ci, Pp], yT / dyT [ns ov, Co], dy [ns, Co, ov], dxpT [ns, Pp, Ci];
// wT [Kc, Co] (w transposed), wK [kv, Co, Ci]. b may be NULL. dWT and dxpT are added into.
void ddl_cvec_forward(ddl_dtype dt, const ddl_cvec *c, void *yT, const void *xp, const void *wT,
                      const void *b, int64_t ns);
void ddl_cvec_dw(ddl_dtype dt, const ddl_cvec *c, void *dWT, const void *xp, const void *dyT,
                 int64_t ns);
void ddl_cvec_dx(ddl_dtype dt, const ddl_cvec *c, void *dxpT, const void *dy, const void *wK,
                 int64_t ns);
// dst[j ldd + i] = src[i lds + j] (or += with add) for i < r, j < c: the layouts' changes
// around these kernels (16 x 16 blocks in registers for f32 at AVX-512).
void ddl_cvec_transpose(ddl_dtype dt, void *dst, int64_t ldd, const void *src, int64_t lds,
                        int64_t r, int64_t c, bool add);

#endif // DDL_KERNELS_CONV_DIRECT_H
