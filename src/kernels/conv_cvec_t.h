// kernels/conv_cvec_t.h: internal: the body of the channel-vector convolution kernels
// (see ddl_cvec in kernels/conv_direct.h), included by conv_direct.c once per element type
// and vector width, beside conv_direct_t.h, with the same macros (T, V, L, SUF, LOADU, STOREU,
// BCAST, FMA, ZERO, ADD, CDIR_TGT, CDIR_INLINE) and these:
//   CV_CBMAX  most vectors of channels per tile (4 at AVX-512, 3 at AVX2)
//   CV_ACC    accumulator registers per tile (24 at AVX-512, 12 at AVX2)
// A tile is MT rows (output positions, or taps for dW) x CB vectors of channels, with
// MT = min(12, CV_ACC / CB): each step loads CB vectors and broadcasts MT scalars for
// MT CB multiply-adds.

#define CDIR_CAT2(a, b) a##_##b
#define CDIR_CAT(a, b) CDIR_CAT2(a, b)
#define CDIR_FN(name) CDIR_CAT(name, SUF)

// Runs X(CB) with CB the constant cb (1 .. CV_CBMAX), so that each tile size is its own
// unrolled instance.
#if CV_CBMAX >= 4
#define CV_CB4(X)                                                                                  \
    case 4:                                                                                        \
        X(4);                                                                                      \
        break;
#else
#define CV_CB4(X)
#endif
#define CV_BY_CB(cb, X)                                                                            \
    do {                                                                                           \
        switch (cb) {                                                                              \
            CV_CB4(X)                                                                              \
        case 3:                                                                                    \
            X(3);                                                                                  \
            break;                                                                                 \
        case 2:                                                                                    \
            X(2);                                                                                  \
            break;                                                                                 \
        default:                                                                                   \
            X(1);                                                                                  \
            break;                                                                                 \
        }                                                                                          \
    } while (0)

#define CV_MT(CB) (CV_ACC / (CB) < 12 ? CV_ACC / (CB) : 12)
// Taps per forward pass over the rows: the K-block of wT (CV_KB x CB L elements, 32 KB
// for 64 floats or 32 doubles) stays in L1 while every row tile of the call reads it.
#define CV_KB 128
// Rows per dW block: their pointers, and their dy rows (CV_MB x CB L elements), are
// reused by every tap tile of the block.
#define CV_MB 64

// Forward tile: rows xb[0..MT) (a padded sample plus the row's output offset) x CB
// vectors of channels, over taps [t0, t1); the sums start from yr (rows Co apart) unless
// first, where they start from the bias (or zero). Each row's sum runs over the taps in
// order, whichever rows share the tile: the same bits for a sample alone or in a batch.
CDIR_TGT CDIR_INLINE void CDIR_FN(cv_fwd_tile)(const int MT, const int CB, const T *const *xb,
                                               const T *wT, const T *b, const int64_t *toff,
                                               int64_t Co, int64_t t0, int64_t t1, T *yr,
                                               bool first, int mt)
{
    V a[24];
    for (int i = 0; i < 24; i++) {
        a[i] = ZERO(); // (beyond the tile: dead stores; they keep GCC's uninitialized check quiet)
    }
    for (int i = 0; i < MT; i++) {
        for (int c = 0; c < CB; c++) {
            a[i * CB + c] = !first      ? LOADU(yr + i * Co + c * L)
                            : b != NULL ? LOADU(b + c * L)
                                        : ZERO();
        }
    }
    for (int64_t t = t0; t < t1; t++) {
        const T *wr = wT + t * Co;
        int64_t  o  = toff[t];
        V        wv[4];
        for (int c = 0; c < CB; c++) {
            wv[c] = LOADU(wr + c * L);
        }
        for (int i = 0; i < MT; i++) {
            V xs = BCAST(xb[i] + o);
            for (int c = 0; c < CB; c++) {
                a[i * CB + c] = FMA(xs, wv[c], a[i * CB + c]);
            }
        }
    }
    for (int i = 0; i < mt; i++) {
        for (int c = 0; c < CB; c++) {
            STOREU(yr + i * Co + c * L, a[i * CB + c]);
        }
    }
}

// The row tiles of one K-block and one block of CB vectors of channels.
#define CV_FWD_ROWS(CB_)                                                                           \
    do {                                                                                           \
        const int MT_ = CV_MT(CB_);                                                                \
        for (int64_t m0 = 0; m0 < M; m0 += MT_) {                                                  \
            int      mt     = M - m0 < MT_ ? (int)(M - m0) : MT_;                                  \
            const T *xb[12] = {0};                                                                 \
            for (int i = 0; i < MT_; i++) {                                                        \
                int64_t m = m0 + (i < mt ? i : 0); /* a short tile repeats its first row */        \
                xb[i]     = xp + (m / ov) * ss + c->ob[m % ov];                                    \
            }                                                                                      \
            CDIR_FN(cv_fwd_tile)                                                                   \
            (MT_, CB_, xb, wT + co0, b != NULL ? b + co0 : NULL, c->toff, Co, t0, t1,              \
             yT + m0 * Co + co0, t0 == 0, mt);                                                     \
        }                                                                                          \
    } while (0)

CDIR_TGT static void CDIR_FN(cv_fwd)(const ddl_cvec *c, T *yT, const T *xp, const T *wT, const T *b,
                                     int64_t ns)
{
    const int64_t ov = c->ov, M = ns * ov, Co = c->Co, Kc = c->Kc, ss = c->Ci * c->Pp;
    for (int64_t t0 = 0; t0 < Kc; t0 += CV_KB) {
        int64_t t1 = Kc - t0 < CV_KB ? Kc : t0 + CV_KB;
        for (int64_t co0 = 0; co0 < Co; co0 += CV_CBMAX * L) {
            int64_t cb = (Co - co0) / L < CV_CBMAX ? (Co - co0) / L : CV_CBMAX;
            CV_BY_CB(cb, CV_FWD_ROWS);
        }
    }
}
#undef CV_FWD_ROWS

// dW tile: taps o[0..TT) x CB vectors of channels, over rows [0, nm) of a block (x row i
// at xb[i], dy row i at dyr + i Co), onto dr (rows Co apart). Each weight's sum is one
// chain of multiply-adds from its stored value over the rows in order: the same bits
// however the rows are cut into blocks and calls.
CDIR_TGT CDIR_INLINE void CDIR_FN(cv_dw_tile)(const int TT, const int CB, const T *const *xb,
                                              const T *dyr, const int64_t *o, int64_t Co,
                                              int64_t nm, T *dr, int tt)
{
    V a[24];
    for (int i = 0; i < 24; i++) {
        a[i] = ZERO(); // (beyond the tile: dead stores; they keep GCC's uninitialized check quiet)
    }
    for (int k = 0; k < TT; k++) {
        for (int c = 0; c < CB; c++) {
            a[k * CB + c] = LOADU(dr + (k < tt ? k : 0) * Co + c * L);
        }
    }
    for (int64_t i = 0; i < nm; i++) {
        const T *x = xb[i], *d = dyr + i * Co;
        V        dv[4];
        for (int c = 0; c < CB; c++) {
            dv[c] = LOADU(d + c * L);
        }
        for (int k = 0; k < TT; k++) {
            V xs = BCAST(x + o[k]);
            for (int c = 0; c < CB; c++) {
                a[k * CB + c] = FMA(xs, dv[c], a[k * CB + c]);
            }
        }
    }
    for (int k = 0; k < tt; k++) {
        for (int c = 0; c < CB; c++) {
            STOREU(dr + k * Co + c * L, a[k * CB + c]);
        }
    }
}

#define CV_DW_TAPS(CB_)                                                                            \
    do {                                                                                           \
        const int TT_ = CV_MT(CB_);                                                                \
        for (int64_t t0 = 0; t0 < c->Kc; t0 += TT_) {                                              \
            int     tt = c->Kc - t0 < TT_ ? (int)(c->Kc - t0) : TT_;                               \
            int64_t o[12];                                                                         \
            for (int k = 0; k < TT_; k++) {                                                        \
                o[k] = c->toff[t0 + (k < tt ? k : 0)];                                             \
            }                                                                                      \
            CDIR_FN(cv_dw_tile)                                                                    \
            (TT_, CB_, xb, dyT + m0 * Co + co0, o, Co, m1 - m0, dWT + t0 * Co + co0, tt);          \
        }                                                                                          \
    } while (0)

CDIR_TGT static void CDIR_FN(cv_dw)(const ddl_cvec *c, T *dWT, const T *xp, const T *dyT,
                                    int64_t ns)
{
    const int64_t ov = c->ov, M = ns * ov, Co = c->Co, ss = c->Ci * c->Pp;
    const T      *xb[CV_MB];
    for (int64_t m0 = 0; m0 < M; m0 += CV_MB) {
        int64_t m1 = M - m0 < CV_MB ? M : m0 + CV_MB;
        for (int64_t m = m0; m < m1; m++) {
            xb[m - m0] = xp + (m / ov) * ss + c->ob[m % ov];
        }
        for (int64_t co0 = 0; co0 < Co; co0 += CV_CBMAX * L) {
            int64_t cb = (Co - co0) / L < CV_CBMAX ? (Co - co0) / L : CV_CBMAX;
            CV_BY_CB(cb, CV_DW_TAPS);
        }
    }
}
#undef CV_DW_TAPS

// dx tile: rows (dy of output position m at db[i], channels ov apart) x CB vectors of
// input channels, over all Co output channels for one tap; the sums are added to the
// transposed padded gradient at xb[i] (+ the tap's offset).
CDIR_TGT CDIR_INLINE void CDIR_FN(cv_dx_tile)(const int MT, const int CB, const T *const *db,
                                              T *const *xb, const T *wr, int64_t Ci, int64_t Co,
                                              int64_t ov, int mt)
{
    V a[24];
    for (int i = 0; i < 24; i++) {
        a[i] = ZERO();
    }
    for (int64_t co = 0; co < Co; co++) {
        V wv[4];
        for (int c = 0; c < CB; c++) {
            wv[c] = LOADU(wr + co * Ci + c * L);
        }
        for (int i = 0; i < MT; i++) {
            V ds = BCAST(db[i] + co * ov);
            for (int c = 0; c < CB; c++) {
                a[i * CB + c] = FMA(ds, wv[c], a[i * CB + c]);
            }
        }
    }
    for (int i = 0; i < mt; i++) {
        for (int c = 0; c < CB; c++) {
            STOREU(xb[i] + c * L, ADD(LOADU(xb[i] + c * L), a[i * CB + c]));
        }
    }
}

#define CV_DX_ROWS(CB_)                                                                            \
    do {                                                                                           \
        const int MT_ = CV_MT(CB_);                                                                \
        for (int64_t m0 = 0; m0 < M; m0 += MT_) {                                                  \
            int      mt     = M - m0 < MT_ ? (int)(M - m0) : MT_;                                  \
            const T *db[12] = {0};                                                                 \
            T       *xb[12] = {0};                                                                 \
            for (int i = 0; i < MT_; i++) {                                                        \
                int64_t m = m0 + (i < mt ? i : 0), n = m / ov, p = m % ov;                         \
                db[i] = dy + n * Co * ov + p;                                                      \
                xb[i] = dxpT + n * ps + (c->ob[p] + c->koff[kk]) * Ci + ci0;                       \
            }                                                                                      \
            CDIR_FN(cv_dx_tile)(MT_, CB_, db, xb, wK + kk * Co * Ci + ci0, Ci, Co, ov, mt);        \
        }                                                                                          \
    } while (0)

CDIR_TGT static void CDIR_FN(cv_dx)(const ddl_cvec *c, T *dxpT, const T *dy, const T *wK,
                                    int64_t ns)
{
    const int64_t ov = c->ov, M = ns * ov, Co = c->Co, Ci = c->Ci, ps = c->Pp * Ci;
    for (int64_t kk = 0; kk < c->kv; kk++) {
        for (int64_t ci0 = 0; ci0 < Ci; ci0 += CV_CBMAX * L) {
            int64_t cb = (Ci - ci0) / L < CV_CBMAX ? (Ci - ci0) / L : CV_CBMAX;
            CV_BY_CB(cb, CV_DX_ROWS);
        }
    }
}
#undef CV_DX_ROWS
#undef CV_MT
#undef CV_BY_CB
#undef CV_CB4
#undef CV_KB
#undef CV_MB
#undef CDIR_FN
#undef CDIR_CAT
#undef CDIR_CAT2
