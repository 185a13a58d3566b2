// ddl/kernels.h: sequential dense, convolution and pooling kernels (no MPI).
//
// These are the local building blocks the distributed layers compose with the
// primitives. Every kernel is sequential (but for the convolution's block loop, which
// may use as many threads as the BLAS, see ddl_conv_workspace_bytes) and allocates
// nothing: scratch (im2col columns, max-pool argmax) comes from a caller-provided
// workspace whose size the matching `_workspace_bytes` function reports. OpenBLAS is the only BLAS user in the engine and
// it is called only from here (ddl_gemm).
//
// Layouts are PyTorch's, row-major and contiguous:
//   activations  [N, C, spatial...]     (N = batch, C = channels, 1 to 3 spatial dims)
//   conv weight  [C_out, C_in, k...]    linear weight [out, in]
//
// Conventions (llm.c-style pairs):
//   x_forward (out, in..., sizes)                   writes (overwrites) its output;
//   x_backward(dinp, dweight, dbias, dout, inp, ...) ACCUMULATES (+=) into every gradient
//   output, so the caller zeroes them (ddl_engine_zero_grad). Any gradient pointer may be
//   NULL, meaning "not needed": that work is skipped.
// Every public function takes `ddl_dtype dt` (DDL_F32 or DDL_F64) and void pointers to
// data of that type; all return DDL_OK or DDL_EINVAL with a message (ddl_last_error()).
//
//   ddl_conv_geom g;
//   ddl_conv_geom_init(&g, 2, N, 64, 64, (int64_t[]){56, 56}, (int64_t[]){3, 3},
//                      NULL, (int64_t[]){1, 1}, NULL);           // stride 1, pad 1
//   size_t ws_bytes = ddl_conv_workspace_bytes(DDL_F32, &g);
//   void  *ws = ddl_malloc(ws_bytes);                            // once, at setup
//   ddl_conv_forward(DDL_F32, &g, y, x, w, b, ws, ws_bytes);
//   ddl_conv_backward(DDL_F32, &g, dx, dw, db, dy, x, w, ws, ws_bytes);
#ifndef DDL_KERNELS_H
#define DDL_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddl/status.h"
#include "ddl/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

// Number of kernel threads this process may use per call: the width of the engine's
// kernel thread pool, which splits large GEMMs (ddl_gemm) and the convolutions' block
// loops (see ddl_conv_workspace_bytes); ranks sharing a node's cores should divide them
// (distdl-train does). OpenBLAS itself always runs one thread, so that no BLAS thread
// spins beside a pool worker; the first call (or the first GEMM) takes OpenBLAS's own
// count (OPENBLAS_NUM_THREADS, or the cores it saw at load) as the initial width and sets
// OpenBLAS to 1. Returns the previous width; n < 1 changes nothing (a query). Set it
// before creating layers (their workspaces are sized for it).
DDL_EXTERN int ddl_blas_set_threads(int n);

// ---- GEMM ------------------------------------------------------------------
// C[M,N] = alpha * op(A)[M,K] · op(B)[K,N] + beta * C, row-major (BLAS semantics).
// op(A) = A (stored M x K, lda >= K) or, with transA, A^T (A stored K x M, lda >= M);
// likewise B (K x N, ldb >= N, or N x K with transB, ldb >= K); ldc >= N.
// beta == 0 overwrites C without reading it (so NaN/garbage in C is ignored).
// M, N or K may be 0 (K == 0 gives C = beta C). Dimensions must fit in a BLAS int.
// Large products (at least 2^22 multiply-adds and 32 rows or columns of C) are split
// into ddl_blas_set_threads(0) parts at most, by blocks of rows or columns of C (multiples
// of 16), run on the kernel thread pool with OpenBLAS single-threaded in each. The split
// depends only on the shape and the width, so results repeat bit for bit for a given
// width (across widths they differ by rounding, as with OpenBLAS's own threads). Not
// collective; allocates nothing.
DDL_EXTERN ddl_status ddl_gemm(ddl_dtype dt, bool transA, bool transB, int64_t M, int64_t N,
                               int64_t K, double alpha, const void *A, int64_t lda,
                               const void *B, int64_t ldb, double beta, void *C, int64_t ldc);
// Same contract as ddl_gemm, computed with plain loops (accumulating in double): the
// reference the BLAS path is tested against, and a fallback.
DDL_EXTERN ddl_status ddl_gemm_naive(ddl_dtype dt, bool transA, bool transB, int64_t M,
                                     int64_t N, int64_t K, double alpha, const void *A,
                                     int64_t lda, const void *B, int64_t ldb, double beta,
                                     void *C, int64_t ldc);

// ---- linear: y = x W^T + b -------------------------------------------------
// B = batch, C = in_features, OC = out_features.
// y [B, OC] (overwritten), x [B, C], w [OC, C], b [OC] or NULL (no bias).
DDL_EXTERN ddl_status ddl_linear_forward(ddl_dtype dt, void *y, const void *x, const void *w,
                                         const void *b, int64_t B, int64_t C, int64_t OC);
// The same product, batch-invariant: row i of y depends on row i of x alone, bit for bit
// the same whatever B and wherever the row sits in the batch (on one BLAS core and
// kernel path). One GEMV per row (about 2.3x the GEMM's time at LeNet's shapes), rows
// split over the kernel pool. What inference runs (dynamic batching's isolation).
DDL_EXTERN ddl_status ddl_linear_forward_rows(ddl_dtype dt, void *y, const void *x, const void *w,
                                              const void *b, int64_t B, int64_t C, int64_t OC);
// dx [B, C] += dy · W;  dw [OC, C] += dy^T · x;  db [OC] += sum_b dy[b, :].
// Each of dx, dw, db may be NULL. x is needed only for dw, w only for dx.
DDL_EXTERN ddl_status ddl_linear_backward(ddl_dtype dt, void *dx, void *dw, void *db,
                                          const void *dy, const void *x, const void *w,
                                          int64_t B, int64_t C, int64_t OC);

// ---- convolution (1-D, 2-D, 3-D; groups = 1) --------------------------------
// Geometry of a convolution over nsp spatial dimensions (PyTorch Conv{1,2,3}d semantics:
// cross-correlation, zero padding on both sides of each spatial dimension).
//   x [N, C_in, in...], w [C_out, C_in, k...], b [C_out], y [N, C_out, out...]
//   out[i] = floor((in[i] + 2 p[i] - d[i] (k[i] - 1) - 1) / s[i]) + 1
// Entries [nsp, 3) of the arrays are set to in = k = s = d = out = 1, p = 0.
typedef struct ddl_conv_geom {
    int     nsp;    // spatial dimensions, 1..3
    int64_t N;      // batch (may be 0)
    int64_t C_in;   // input channels (may be 0: y = bias)
    int64_t C_out;  // output channels (may be 0)
    int64_t in[3];  // input spatial extents, >= 1
    int64_t k[3];   // kernel extents, >= 1
    int64_t s[3];   // strides, >= 1
    int64_t p[3];   // zero padding on each side, >= 0
    int64_t d[3];   // dilations, >= 1
    int64_t out[3]; // output spatial extents, computed
    // Elements past the end of x the kernels may read (0 from ddl_conv_geom_init). Their
    // values never matter, and nothing may write them during a call. With at least
    // ddl_conv_x_tail_need of them, a direct-path convolution without padding reads x in
    // place instead of a padded copy, and its workspace shrinks by that copy (one sample's
    // C_in planes per thread); dx must then not overlap x in a call that also computes dw.
    int64_t x_tail;
} ddl_conv_geom;

// Fills *g and validates it. in and k have nsp entries; stride, pad and dilation have nsp
// entries or are NULL for the defaults 1, 0 and 1. Fails with DDL_EINVAL (and *g
// untouched) on nsp outside 1..3, negative N/C, non-positive extents, strides, dilations,
// negative padding, or a dilated kernel larger than the padded input.
DDL_EXTERN ddl_status ddl_conv_geom_init(ddl_conv_geom *g, int nsp, int64_t N, int64_t C_in,
                                         int64_t C_out, const int64_t *in, const int64_t *k,
                                         const int64_t *stride, const int64_t *pad,
                                         const int64_t *dilation);
// Workspace (bytes) ddl_conv_forward/ddl_conv_backward need for g in dtype dt: a block of
// im2col columns sized to stay cache-resident (about 512 KiB, and, when several small
// samples share one GEMM, a staging block for the output). 0 for 1x1, stride 1, unpadded
// convolutions, and for an invalid g (the kernels then report the error). It never grows
// when N shrinks, so a workspace sized for the largest batch serves smaller ones.
// Threads: with T = ddl_blas_set_threads(0) > 1 BLAS threads, and a batch with at least T
// blocks and enough work, the kernels split their block loop into T parts run on a
// persistent thread pool (the caller plus up to T - 1 workers, created once per process,
// no more than the CPUs of the affinity mask; each part's GEMMs run whole), each
// part with its own im2col block and dW accumulator; the size reported covers the thread
// count CURRENT AT THE QUERY, so ask after setting it (layers ask at create). A workspace
// sized for fewer threads still works: the kernels then use as many parts as it has room
// for (at least one). Results are deterministic for a given T (whichever threads run the
// parts); across values of T they differ only by rounding (the dW partial sums are added
// in a different order).
DDL_EXTERN size_t ddl_conv_workspace_bytes(ddl_dtype dt, const ddl_conv_geom *g);
// The x_tail (elements) with which the kernels read x in place (see ddl_conv_geom): the
// reads of the direct path's last run of positions past the end of a sample, at most
// (k - 1) d + 31 elements of the innermost dimension; 0 when it never reads in place (padding,
// strides, or the im2col path). Set g->x_tail to it before asking ddl_conv_workspace_bytes.
DDL_EXTERN int64_t ddl_conv_x_tail_need(ddl_dtype dt, const ddl_conv_geom *g);
// y = conv(x, w) + b (b may be NULL). im2col on blocks of output positions + one GEMM
// per block, or, for 1-D/2-D stride-1 convolutions on a CPU with AVX2 (few input
// channels) or AVX-512 (any), direct vector kernels chosen at run time
// (DDL_CONV_DIRECT=0 in the environment turns them off, =avx2 caps the width; results
// differ from the GEMM path's by rounding only, and are the same run to run). ws must
// hold at least the single-thread size (what ddl_conv_workspace_bytes reports with a
// width of one; ws_bytes says how many it holds); its contents on entry and exit are
// scratch. It sets the kernel width (ddl_blas_set_threads) to 1 and back
// while its parts run, so do not call it from several threads at once.
// The convolution path this process runs, for logs: "direct AVX-512", "direct AVX2" or
// "im2col + GEMM" (the CPU's widest unless DDL_CONV_DIRECT says otherwise).
DDL_EXTERN const char *ddl_conv_path(void);
// Whether value is a setting of DDL_CONV_DIRECT: "0" (off), "avx2" (at most AVX2) or "1"
// (the CPU's widest, as when unset). The kernels take any other value as unset; the
// engine refuses it (a spec parse fails, naming it).
DDL_EXTERN bool       ddl_conv_direct_setting_ok(const char *value);
DDL_EXTERN ddl_status ddl_conv_forward(ddl_dtype dt, const ddl_conv_geom *g, void *y,
                                       const void *x, const void *w, const void *b, void *ws,
                                       size_t ws_bytes);
// The same convolution, batch-invariant: sample n of y depends on sample n of x alone, bit
// for bit the same whatever N and wherever the sample sits (on one kernel path): one
// sample per block and every GEMM whole on one thread (the parts split the samples; a
// lone large sample gets one thread). What inference runs (dynamic batching's isolation).
DDL_EXTERN ddl_status ddl_conv_forward_rows(ddl_dtype dt, const ddl_conv_geom *g, void *y,
                                            const void *x, const void *w, const void *b, void *ws,
                                            size_t ws_bytes);
// Adjoint of ddl_conv_forward with respect to each argument, accumulated:
//   dx [N, C_in, in...] += conv^T(dy, w)   (GEMM into columns, then col2im)
//   dw [C_out, C_in, k...] += dy · columns(x)^T
//   db [C_out] += sum over n and positions of dy
// Each of dx, dw, db may be NULL. x is needed only for dw, w only for dx.
DDL_EXTERN ddl_status ddl_conv_backward(ddl_dtype dt, const ddl_conv_geom *g, void *dx,
                                        void *dw, void *db, const void *dy, const void *x,
                                        const void *w, void *ws, size_t ws_bytes);
// The same, with flags. DDL_CONV_DX_SET: dx is set to conv^T(dy, w), every element of it
// written and none read, instead of added into: no caller memset of dx (the kernels clear
// a sample's dx in cache where they sum into it: the im2col paths and strided direct
// ones). The same values as accumulating into zeros (a sum that is -0 may come out +0 or -0).
enum { DDL_CONV_DX_SET = 1u };
DDL_EXTERN ddl_status ddl_conv_backward_ex(ddl_dtype dt, const ddl_conv_geom *g, void *dx, void *dw,
                                           void *db, const void *dy, const void *x, const void *w,
                                           void *ws, size_t ws_bytes, unsigned flags);
// Direct nested-loop reference versions of the two above (no workspace; slow). They are
// what the im2col path is tested against, and a fallback.
DDL_EXTERN ddl_status ddl_conv_forward_naive(ddl_dtype dt, const ddl_conv_geom *g, void *y,
                                             const void *x, const void *w, const void *b);
DDL_EXTERN ddl_status ddl_conv_backward_naive(ddl_dtype dt, const ddl_conv_geom *g, void *dx,
                                              void *dw, void *db, const void *dy,
                                              const void *x, const void *w);

// ---- progress during the kernels ----------------------------------------------
// A callback the convolution kernels call between their units of work (a block or a
// group of samples of a part), on the thread that set it only, so that a split-phase
// exchange moves on while they compute (ddl_halo_exchange_progress; issue 19, item 5).
// Thread-local; {NULL, NULL}, the default, turns it off. Returns the one it replaces, to
// be set back. The callback must not call the kernels, and keeps its own failures.
typedef struct ddl_kernel_progress {
    void (*fn)(void *arg);
    void *arg;
} ddl_kernel_progress;
DDL_EXTERN ddl_kernel_progress ddl_kernel_progress_set(ddl_kernel_progress p);

// ---- pooling (1-D, 2-D, 3-D) -------------------------------------------------
// Max and average pooling with PyTorch's MaxPool/AvgPool{1,2,3}d semantics (floor mode):
//   x [N, C, in...], y [N, C, out...], out[i] as for convolution.
// Max pads with -inf, propagates NaN and takes the first maximum in a window; it records
// per output element the flat index of its argmax in x (int64, in the workspace) for the
// backward. A window lying entirely in the padding yields -inf and index -1 (no
// gradient). Average uses count_include_pad = True: it divides by the kernel volume.
typedef enum { DDL_POOL_MAX = 0, DDL_POOL_AVG = 1 } ddl_pool_mode;

typedef struct ddl_pool_geom {
    ddl_pool_mode mode;
    int           nsp;    // spatial dimensions, 1..3
    int64_t       N;      // batch (may be 0)
    int64_t       C;      // channels (may be 0)
    int64_t       in[3];  // input spatial extents, >= 1
    int64_t       k[3];   // window extents, >= 1
    int64_t       s[3];   // strides, >= 1
    int64_t       p[3];   // implicit padding on each side, 0 <= p <= k / 2
    int64_t       d[3];   // dilations, >= 1 (must be 1 for average pooling)
    int64_t       out[3]; // output spatial extents, computed
} ddl_pool_geom;

// Fills *g and validates it. in and k have nsp entries. stride: NULL, or an entry of 0,
// means stride = kernel (PyTorch's default; DistDL's default of 1 is a known bug).
// pad NULL means 0; dilation NULL means 1. Refused (DDL_EINVAL, *g untouched): padding
// larger than k / 2 (PyTorch's rule), dilation != 1 with DDL_POOL_AVG (PyTorch's
// AvgPool has no dilation), non-positive extents, and an empty output.
DDL_EXTERN ddl_status ddl_pool_geom_init(ddl_pool_geom *g, ddl_pool_mode mode, int nsp,
                                         int64_t N, int64_t C, const int64_t *in,
                                         const int64_t *k, const int64_t *stride,
                                         const int64_t *pad, const int64_t *dilation);
// Workspace (bytes) for g: N * C * prod(out) int64 argmax indices for max pooling, 0 for
// average pooling. The forward fills it and the backward reads it, so the caller keeps it
// unchanged between the two.
DDL_EXTERN size_t ddl_pool_workspace_bytes(const ddl_pool_geom *g);
// y = pool(x) (overwritten); for max pooling also writes the argmax into ws.
DDL_EXTERN ddl_status ddl_pool_forward(ddl_dtype dt, const ddl_pool_geom *g, void *y,
                                       const void *x, void *ws, size_t ws_bytes);
// dx [N, C, in...] += pool^T(dy): max scatters dy to the recorded argmax, average spreads
// dy / kernel volume over the window (padding taps receive nothing).
DDL_EXTERN ddl_status ddl_pool_backward(ddl_dtype dt, const ddl_pool_geom *g, void *dx,
                                        const void *dy, const void *ws, size_t ws_bytes);

#ifdef __cplusplus
}
#endif
#endif // DDL_KERNELS_H
