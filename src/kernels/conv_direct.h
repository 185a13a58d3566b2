// kernels/conv_direct.h: internal: direct (no im2col, no GEMM) convolution kernels for
// few input channels, on the "wide" padded layout of kernels/conv.c, in AVX2 + FMA.
//
// With C_in * prod(k) small (LeNet's first layer: 1 x 5 x 5 = 25) the im2col GEMM has a
// tiny K or M: its packing and the column matrix (25x the input) cost more than the
// multiply-adds, and the backward dx GEMM has K = C_out = 6. These kernels read the
// zero-padded sample xp [C_in, Pp] directly. Output position j = o1 * I2p + o2 of the
// wide grid (I2p the padded row length) reads xp at j + toff[t] for tap t = (ci, k1, k2),
// toff[t] = ci Pp + k1 d1 I2p + k2 d2, so for a run of positions every tap is one
// contiguous vector load, and a register tile of output channels x positions takes one
// broadcast weight per (channel, tap):
//   forward  yw [co, j]  = sum_t w[co, t] xp[toff[t] + j]            j in [0, nj)
//   dW       dw [co, t] += sum_j dyw[co, j] (xp[toff[t] + j] & mask[j])
//   dx       dxp[ci, q]  = sum_{co, kk} w[co, ci, kk] dyw[co, q - koff[kk]]   q in [0, nq)
// where dyw is dy in the wide layout with zeros at the positions past each output row
// and before (a margin of koff's largest value) and after the valid ones, and mask[j] is
// all-ones exactly at the valid positions (so an inf or NaN of x at a garbage position
// never meets a zero of dy: 0 * inf). Each sum runs in a fixed order: results are the same
// run to run (and with any thread count, the caller adding the dW partials in order),
// but not bit-identical to the GEMM path (FMA, another summation order).
//
// Runtime dispatch: used only when the CPU has AVX2 and FMA (ddl_cdir_enabled); the
// im2col + GEMM path and the naive loops of conv.c remain the reference and the fallback.
#ifndef DDL_KERNELS_CONV_DIRECT_H
#define DDL_KERNELS_CONV_DIRECT_H

#include <stdbool.h>
#include <stdint.h>

#include "ddl/tensor.h"

// Largest C_in the direct path is taken for (see conv_plan_make): beyond it the im2col
// GEMM's K = C_in prod(k) is large enough for the BLAS to run near its peak.
#define DDL_CDIR_MAX_CIN 8
// Positions are processed in runs of DDL_CDIR_ALIGN elements (two 8-float or 4-double
// vectors for the forward, one for dW and dx): nj and nq are multiples of it.
#define DDL_CDIR_ALIGN 16

typedef struct ddl_cdir {
    int64_t        Ci, Co, Kc, kv; // Kc = Ci * kv taps; w is [Co, Kc]
    const int64_t *toff;           // [Kc]: offset of tap t in xp
    const int64_t *koff;           // [kv]: offset of tap kk within one channel plane
    int64_t        Pp;             // channel plane stride of xp and dxp
    int64_t        ldy;            // row stride of yw / dyw (channel co at co * ldy)
    int64_t        nj;             // positions of the forward and dW (multiple of ALIGN)
    int64_t        nq;             // positions of dx (multiple of ALIGN)
} ddl_cdir;

// Whether the direct path is used: the CPU has AVX2 and FMA, the environment does not
// set DDL_CONV_DIRECT=0, and no override (below) says otherwise. Cached after the first
// call.
bool ddl_cdir_enabled(void);
// For tests and benches: 1 forces the direct path on (where the CPU allows it), 0 off,
// -1 back to the default. Returns the previous state (1 on, 0 off). Call it before
// sizing workspaces (ddl_conv_workspace_bytes reports room for both paths, though).
int ddl_cdir_set(int on);

// The three kernels (dt DDL_F32 or DDL_F64; pointers to element 0 of the wide grid:
// dyw must be readable and zero from dyw - max(koff) on, see above).
void ddl_cdir_forward(ddl_dtype dt, const ddl_cdir *c, void *yw, const void *xp,
                      const void *w);
void ddl_cdir_dw(ddl_dtype dt, const ddl_cdir *c, void *dw, const void *dyw, const void *xp,
                 const void *mask);
void ddl_cdir_dx(ddl_dtype dt, const ddl_cdir *c, void *dxp, const void *dyw, const void *w);

#endif // DDL_KERNELS_CONV_DIRECT_H
