// ddl/decomp.h: DistDL's balanced decomposition and the halo arithmetic of its
// convolution and pooling mixins. Pure index math: no MPI, no allocation.
//
// Balanced decomposition of N elements over P pieces, piece i (0 <= i < P):
//   size  n_i = N/P + (i < N%P)          start x_i = (N/P)*i + min(i, N%P)
// so 10 over 4 is 3,3,2,2 and 2 over 3 is 1,1,0.
#ifndef DDL_DECOMP_H
#define DDL_DECOMP_H

#include <stdint.h>

#include "ddl/status.h"
#include "ddl/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

DDL_EXTERN int64_t ddl_decomp_size(int64_t n, int64_t p, int64_t i);
DDL_EXTERN int64_t ddl_decomp_start(int64_t n, int64_t p, int64_t i);

// The box of the piece at Cartesian coordinate `index` when `global` is decomposed
// balanced over a partition of shape `pshape` (both ndim dims).
DDL_EXTERN ddl_box ddl_decomp_box(const ddl_shape *global, const int *pshape, const int *index);

// Row-major flat index of a coordinate, and back.
DDL_EXTERN int64_t ddl_index_ravel(int ndim, const int *shape, const int *coord);
DDL_EXTERN void    ddl_index_unravel(int ndim, const int *shape, int64_t flat, int *coord);

// ---- halos -----------------------------------------------------------------
// Halo of one dimension for one piece of a sliding-window operator (conv or pool)
// with kernel k, stride s, padding p and dilation d over a dimension of global size N
// split balanced over P pieces, following DistDL's ConvMixin/PoolingMixin (the
// left-anchored PyTorch window). The global zero padding p is materialised only on the
// boundary pieces (pad_lo on piece 0, pad_hi on piece P-1); halos are then computed on
// the padded global length N + 2p with padding 0.
//
// The local buffer of the piece is laid out as
//   [ ghost_lo | pad_lo | bulk (n) | pad_hi | ghost_hi ]
// with ghost_lo = max(halo_lo, 0) and ghost_hi = max(halo_hi, 0). A negative raw halo
// means the piece holds input it does not need: the needed range [need_lo, need_hi)
// (in buffer coordinates) crops it away, on either side (DistDL crops only the left).
typedef struct ddl_halo_dim {
    int64_t n;                  // bulk (unpadded local) length
    int64_t pad_lo, pad_hi;     // global zero padding held by this piece
    int64_t halo_lo, halo_hi;   // raw halo sizes (negative: surplus input)
    int64_t ghost_lo, ghost_hi; // max(halo, 0): received from the neighbours
    int64_t send_lo, send_hi;   // sent to the left / right neighbour (their ghosts)
    int64_t buf;                // ghost_lo + pad_lo + n + pad_hi + ghost_hi
    int64_t need_lo, need_hi;   // needed range within the buffer
    int64_t out_start, out_n;   // this piece's balanced share of the output
    int64_t out_global;         // global output length
} ddl_halo_dim;

// Computes the halo of piece i. Fails (EINVAL, with a message) when the window does not
// fit (output length < 1) or when a halo is larger than the neighbour's local length
// (a halo reaches only the immediate neighbour).
DDL_EXTERN ddl_status ddl_halo_dim_compute(int64_t N, int64_t P, int64_t i, int64_t k, int64_t s,
                                           int64_t p, int64_t d, ddl_halo_dim *out);

#ifdef __cplusplus
}
#endif
#endif // DDL_DECOMP_H
