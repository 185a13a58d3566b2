// kernels/conv_direct_t.h: internal: the body of the direct convolution kernels, included
// by conv_direct.c once per element type with these defined:
//   T (float, double), V (its __m256 type), L (lanes), SUF (name suffix),
//   LOADU, STOREU, BCAST, FMA, ZERO, AND, ADD (the intrinsics for V), HSUM (V -> T, the
//   lanes summed in pairwise halves), and the register
//   tiles: 6 channels x FWD_JV vectors (forward), DW_CB x DW_TB (dW, at most 6 x 4),
//   DXS_TB channels x 4 vectors (dx scatter, at most 6).
// Every function carries the avx2/fma target, so it is only called after the CPU check.

#define CDIR_CAT2(a, b) a##_##b
#define CDIR_CAT(a, b)  CDIR_CAT2(a, b)
#define CDIR_FN(name)   CDIR_CAT(name, SUF)

// Forward tile: CB output channels x JV vectors of positions, over all Kc taps. Vector i
// reads x at xb[i] + toff[t] and writes y at yb[i] (its channel c at yb[i] + c ldy): the
// vectors of one sample's run, or of several samples' (fwd_group). Each sum runs over the
// taps in order from the bias, whichever vectors share the tile: the same bits.
CDIR_TGT CDIR_INLINE void CDIR_FN(fwd_tile_s)(const int CB, const int JV, int64_t Kc,
                                              const int64_t *toff, const T *const *xb, const T *w,
                                              const T *b, T *const *yb, int64_t ldy)
{
    V a[6][4];
    for (int c = 0; c < CB; c++) {
        for (int i = 0; i < JV; i++) {
            a[c][i] = b != NULL ? BCAST(b + c) : ZERO();
        }
    }
    for (int64_t t = 0; t < Kc; t++) {
        V xv[4];
        for (int i = 0; i < JV; i++) {
            xv[i] = LOADU(xb[i] + toff[t]);
        }
        for (int c = 0; c < CB; c++) {
            V wv = BCAST(w + c * Kc + t);
            for (int i = 0; i < JV; i++) {
                a[c][i] = FMA(wv, xv[i], a[c][i]);
            }
        }
    }
    for (int c = 0; c < CB; c++) {
        for (int i = 0; i < JV; i++) {
            STOREU(yb[i] + c * ldy, a[c][i]);
        }
    }
}

// The tile over JV consecutive vectors of one sample's run, from xj and yj.
CDIR_TGT CDIR_INLINE void CDIR_FN(fwd_tile)(const int CB, const int JV, int64_t Kc,
                                            const int64_t *toff, const T *xj, const T *w,
                                            const T *b, T *yj, int64_t ldy)
{
    const T *xb[4];
    T       *yb[4];
    for (int i = 0; i < JV; i++) {
        xb[i] = xj + i * L;
        yb[i] = yj + i * L;
    }
    CDIR_FN(fwd_tile_s)(CB, JV, Kc, toff, xb, w, b, yb, ldy);
}

#define CDIR_FWD_CO(JV_)                                                                     \
    do {                                                                                     \
        switch (cb) {                                                                        \
        case 6: CDIR_FN(fwd_tile)(6, JV_, c->Kc, c->toff, xp + j, wc, bc, yc + j, c->ldy); break; \
        case 5: CDIR_FN(fwd_tile)(5, JV_, c->Kc, c->toff, xp + j, wc, bc, yc + j, c->ldy); break; \
        case 4: CDIR_FN(fwd_tile)(4, JV_, c->Kc, c->toff, xp + j, wc, bc, yc + j, c->ldy); break; \
        case 3: CDIR_FN(fwd_tile)(3, JV_, c->Kc, c->toff, xp + j, wc, bc, yc + j, c->ldy); break; \
        case 2: CDIR_FN(fwd_tile)(2, JV_, c->Kc, c->toff, xp + j, wc, bc, yc + j, c->ldy); break; \
        default: CDIR_FN(fwd_tile)(1, JV_, c->Kc, c->toff, xp + j, wc, bc, yc + j, c->ldy); break; \
        }                                                                                    \
    } while (0)

#define CDIR_FWD_S(JV_)                                                                            \
    do {                                                                                           \
        switch (cb) {                                                                              \
        case 6:                                                                                    \
            CDIR_FN(fwd_tile_s)(6, JV_, c->Kc, c->toff, xb + k, wc, bc, yb + k, c->ldy);           \
            break;                                                                                 \
        case 5:                                                                                    \
            CDIR_FN(fwd_tile_s)(5, JV_, c->Kc, c->toff, xb + k, wc, bc, yb + k, c->ldy);           \
            break;                                                                                 \
        case 4:                                                                                    \
            CDIR_FN(fwd_tile_s)(4, JV_, c->Kc, c->toff, xb + k, wc, bc, yb + k, c->ldy);           \
            break;                                                                                 \
        case 3:                                                                                    \
            CDIR_FN(fwd_tile_s)(3, JV_, c->Kc, c->toff, xb + k, wc, bc, yb + k, c->ldy);           \
            break;                                                                                 \
        case 2:                                                                                    \
            CDIR_FN(fwd_tile_s)(2, JV_, c->Kc, c->toff, xb + k, wc, bc, yb + k, c->ldy);           \
            break;                                                                                 \
        default:                                                                                   \
            CDIR_FN(fwd_tile_s)(1, JV_, c->Kc, c->toff, xb + k, wc, bc, yb + k, c->ldy);           \
            break;                                                                                 \
        }                                                                                          \
    } while (0)

// ns samples whose grids are shorter than a tile (nj / L < FWD_JV vectors, a small plane):
// their vectors fill the tiles together, each weight broadcast serving FWD_JV vectors
// instead of nj / L. Sample s's x at xp + s sx, its y at yw + s sy.
CDIR_TGT static void CDIR_FN(fwd_group)(const ddl_cdir *c, T *yw, const T *xp, const T *w,
                                        const T *b, int64_t ns, int64_t sy, int64_t sx)
{
    const int64_t nv = c->nj / L, n = ns * nv;
    const T      *xb0[CDIR_FWD_GROUP_VECTORS];
    T            *yb0[CDIR_FWD_GROUP_VECTORS];
    for (int64_t s = 0, k = 0; s < ns; s++) {
        for (int64_t v = 0; v < nv; v++, k++) {
            xb0[k] = xp + s * sx + v * L;
            yb0[k] = yw + s * sy + v * L;
        }
    }
    for (int64_t co0 = 0; co0 < c->Co; co0 += 6) {
        int64_t  cb = c->Co - co0 < 6 ? c->Co - co0 : 6;
        const T *wc = w + co0 * c->Kc, *bc = b != NULL ? b + co0 : NULL;
        T       *yb[CDIR_FWD_GROUP_VECTORS];
        for (int64_t k = 0; k < n; k++) {
            yb[k] = yb0[k] + co0 * c->ldy;
        }
        const T *const *xb = xb0;
        int64_t         k  = 0;
        for (; k + FWD_JV <= n; k += FWD_JV) {
            CDIR_FWD_S(FWD_JV);
        }
        for (; k + 2 <= n; k += 2) {
            CDIR_FWD_S(2);
        }
        for (; k < n; k++) {
            CDIR_FWD_S(1);
        }
    }
}
#undef CDIR_FWD_S

// Channels in blocks of 6, positions in tiles of FWD_JV vectors, the rest in pairs and a
// last single vector.
CDIR_TGT static void CDIR_FN(fwd)(const ddl_cdir *c, T *yw, const T *xp, const T *w,
                                  const T *b)
{
    for (int64_t co0 = 0; co0 < c->Co; co0 += 6) {
        int64_t  cb = c->Co - co0 < 6 ? c->Co - co0 : 6;
        const T *wc = w + co0 * c->Kc, *bc = b != NULL ? b + co0 : NULL;
        T       *yc = yw + co0 * c->ldy;
        int64_t  j  = 0;
        for (; j + FWD_JV * L <= c->nj; j += FWD_JV * L) {
            CDIR_FWD_CO(FWD_JV);
        }
        for (; j + 2 * L <= c->nj; j += 2 * L) {
            CDIR_FWD_CO(2);
        }
        if (j < c->nj) {
            CDIR_FWD_CO(1);
        }
    }
}
#undef CDIR_FWD_CO

// ns samples (x at xp + s sx, y at yw + s sy): grids shorter than a tile share tiles
// (fwd_group), in runs of at most CDIR_FWD_GROUP_VECTORS vectors; others one at a time.
CDIR_TGT static void CDIR_FN(fwd_n)(const ddl_cdir *c, T *yw, const T *xp, const T *w, const T *b,
                                    int64_t ns, int64_t sy, int64_t sx)
{
    const int64_t nv = c->nj / L;
    if (ns > 1 && nv < FWD_JV && nv <= CDIR_FWD_GROUP_VECTORS) {
        const int64_t most = CDIR_FWD_GROUP_VECTORS / nv;
        for (int64_t s0 = 0; s0 < ns; s0 += most) {
            int64_t m = ns - s0 < most ? ns - s0 : most;
            CDIR_FN(fwd_group)(c, yw + s0 * sy, xp + s0 * sx, w, b, m, sy, sx);
        }
        return;
    }
    for (int64_t s = 0; s < ns; s++) {
        CDIR_FN(fwd)(c, yw + s * sy, xp + s * sx, w, b);
    }
}

// dW tile: CB channels x TB taps, summed over all nj positions of ns samples (dyw and xp
// sdy and sx elements apart) one vector at a time into the per-lane accumulators
// acc[(co Kc + t) L + lane] (reduced once per batch range by dw_finish: a reduction per
// tile and sample would cost more than the tile's FMAs). The accumulators stay in
// registers from one sample to the next: a short grid (a small plane) would otherwise
// load and store them for a few vectors of FMAs per sample. The sums run in the same
// order whatever ns: the same bits as one sample per call.
CDIR_TGT CDIR_INLINE void CDIR_FN(dw_tile)(const int CB, const int TB, const ddl_cdir *c, T *acc,
                                           const T *dyw, const T *xp, const T *mask, int64_t ns,
                                           int64_t sdy, int64_t sx, bool fresh)
{
    V a[6][4];
    for (int i = 0; i < CB; i++) {
        for (int k = 0; k < TB; k++) {
            a[i][k] = fresh ? ZERO() : LOADU(acc + (i * c->Kc + k) * L);
        }
    }
    for (int64_t s = 0; s < ns; s++) {
        const T *dys = dyw + s * sdy, *xs = xp + s * sx;
        for (int64_t j = 0; j < c->nj; j += L) {
            V m = LOADU(mask + j), xv[4];
            for (int k = 0; k < TB; k++) {
                xv[k] = AND(LOADU(xs + c->toff[k] + j), m);
            }
            for (int i = 0; i < CB; i++) {
                V d = LOADU(dys + i * c->ldy + j);
                for (int k = 0; k < TB; k++) {
                    a[i][k] = FMA(d, xv[k], a[i][k]);
                }
            }
        }
    }
    for (int i = 0; i < CB; i++) {
        for (int k = 0; k < TB; k++) {
            STOREU(acc + (i * c->Kc + k) * L, a[i][k]);
        }
    }
}

// dw[i] += the lanes of acc[i L ..] summed in a fixed order (pairwise halves: HSUM, in
// registers; the scalar loop it replaced spilled the vector and took 4 % of a 64 -> 64
// layer's backward).
CDIR_TGT static void CDIR_FN(dw_finish)(const ddl_cdir *c, T *dw, const T *acc)
{
    for (int64_t i = 0; i < c->Co * c->Kc; i++) {
        dw[i] += HSUM(LOADU(acc + i * L));
    }
}

#define CDIR_DW_CALL(CB_)                                                                          \
    do {                                                                                           \
        int64_t t = 0;                                                                             \
        for (; t + DW_TB <= c->Kc; t += DW_TB) {                                                   \
            ddl_cdir local = *c;                                                                   \
            local.toff     = c->toff + t;                                                          \
            CDIR_FN(dw_tile)(CB_, DW_TB, &local, dwc + t * L, dyc, xp, mask, ns, sdy, sx, fresh);  \
        }                                                                                          \
        for (; t < c->Kc; t++) {                                                                   \
            ddl_cdir local = *c;                                                                   \
            local.toff     = c->toff + t;                                                          \
            CDIR_FN(dw_tile)(CB_, 1, &local, dwc + t * L, dyc, xp, mask, ns, sdy, sx, fresh);      \
        }                                                                                          \
    } while (0)

CDIR_TGT static void CDIR_FN(dw)(const ddl_cdir *c, T *acc, const T *dyw, const T *xp,
                                 const T *mask, int64_t ns, int64_t sdy, int64_t sx, bool fresh)
{
    for (int64_t co0 = 0; co0 < c->Co; co0 += DW_CB) {
        int64_t  cb  = c->Co - co0 < DW_CB ? c->Co - co0 : DW_CB;
        T       *dwc = acc + co0 * c->Kc * L;
        const T *dyc = dyw + co0 * c->ldy;
        switch (cb) {
        case 6: CDIR_DW_CALL(6); break;
        case 5: CDIR_DW_CALL(5); break;
        case 4: CDIR_DW_CALL(4); break;
        case 3: CDIR_DW_CALL(3); break;
        case 2: CDIR_DW_CALL(2); break;
        default: CDIR_DW_CALL(1); break;
        }
    }
}
#undef CDIR_DW_CALL

// dx tile: CIB input channels x QV vectors of positions, over all output channels and
// taps: each load of dy serves CIB channels.
CDIR_TGT CDIR_INLINE void CDIR_FN(dx_tile)(const int CIB, const int QV, const ddl_cdir *c,
                                           int64_t ci0, T *dq, const T *dyq, const T *w)
{
    V a[24];
    for (int i = 0; i < CIB * QV; i++) {
        a[i] = ZERO();
    }
    for (int64_t co = 0; co < c->Co; co++) {
        const T *wc = w + co * c->Kc + ci0 * c->kv;
        const T *dc = dyq + co * c->ldy;
        for (int64_t kk = 0; kk < c->kv; kk++) {
            const T *d = dc - c->koff[kk];
            V        dv[24];
            for (int i = 0; i < QV; i++) {
                dv[i] = LOADU(d + i * L);
            }
            for (int b = 0; b < CIB; b++) {
                V wv = BCAST(wc + b * c->kv + kk);
                for (int i = 0; i < QV; i++) {
                    a[b * QV + i] = FMA(wv, dv[i], a[b * QV + i]);
                }
            }
        }
    }
    for (int b = 0; b < CIB; b++) {
        for (int i = 0; i < QV; i++) {
            STOREU(dq + b * c->Pp + i * L, a[b * QV + i]);
        }
    }
}

// Channels in blocks of 3 (4 vectors each: 12 accumulators), a last block of 2 or 1
// (1: 8 vectors); positions past the last whole tile one vector at a time.
#define CDIR_DX_RUN(CIB_, QV_)                                                               \
    do {                                                                                     \
        int64_t q = 0;                                                                       \
        for (; q + (QV_) * L <= c->nq; q += (QV_) * L) {                                     \
            CDIR_FN(dx_tile)(CIB_, QV_, c, ci, dc + q, dyw + q, w);                          \
        }                                                                                    \
        for (; q < c->nq; q += L) {                                                          \
            CDIR_FN(dx_tile)(CIB_, 1, c, ci, dc + q, dyw + q, w);                            \
        }                                                                                    \
    } while (0)

CDIR_TGT static void CDIR_FN(dx)(const ddl_cdir *c, T *dxp, const T *dyw, const T *w)
{
    for (int64_t ci = 0; ci < c->Ci;) {
        int64_t cib = c->Ci - ci >= 3 ? 3 : c->Ci - ci;
        T      *dc  = dxp + ci * c->Pp;
        if (cib == 3) {
            CDIR_DX_RUN(3, 4);
        } else if (cib == 2) {
            CDIR_DX_RUN(2, 4);
        } else {
            CDIR_DX_RUN(1, DX_QV1);
        }
        ci += cib;
    }
}
#undef CDIR_DX_RUN

// dx by scatter, for small unpadded planes where the gather above would multiply mostly
// the zero margins: dxp[dtoff[t] + j] += sum_co w[co, t] dyw[co, j] for j in [0, nj), a
// tile of TB taps x JV vectors of positions at a time (the caller zeroes dxp first).
// The taps are added in a fixed order: the same bits run to run. A tile's weights come
// from wt, its TB taps' weights of every co side by side (dxs_pack).
CDIR_TGT CDIR_INLINE void CDIR_FN(dxs_tile)(const int TB, const int JV, const ddl_cdir *c,
                                            int64_t t0, int64_t ts, int64_t j, T *dxp, const T *dyw,
                                            const T *wt)
{
    V a[24];
    for (int i = 0; i < TB * JV; i++) {
        a[i] = ZERO();
    }
    for (int64_t co = 0; co < c->Co; co++) {
        const T *d = dyw + co * c->ldy + j;
        V        dv[CDIR_DXS_JV];
        for (int i = 0; i < JV; i++) {
            dv[i] = LOADU(d + i * L);
        }
        for (int k = 0; k < TB; k++) {
            V wv = BCAST(wt + co * TB + k);
            for (int i = 0; i < JV; i++) {
                a[k * JV + i] = FMA(wv, dv[i], a[k * JV + i]);
            }
        }
    }
    for (int k = 0; k < TB; k++) {
        T *o = dxp + c->dtoff[t0 + k * ts] + j;
        for (int i = 0; i < JV; i++) {
            STOREU(o + i * L, ADD(LOADU(o + i * L), a[k * JV + i]));
        }
    }
}

// The scatter's tiles in their order: for each kernel position kk, the taps of DXS_TB
// consecutive input channels (t = ci kv + kk, stride kv), whose targets lie a plane apart
// (the taps of one channel would read back, one element off, the vectors the tile has just
// stored: a failed store-to-load forward each), then the channels left one at a time.
// BODY(tb, t0) runs once per tile.
#define CDIR_DXS_TILES(BODY)                                                                       \
    do {                                                                                           \
        for (int64_t kk = 0; kk < c->kv; kk++) {                                                   \
            int64_t ci = 0;                                                                        \
            for (; ci + DXS_TB <= c->Ci; ci += DXS_TB) {                                           \
                BODY(DXS_TB, ci * c->kv + kk);                                                     \
            }                                                                                      \
            for (; ci < c->Ci; ci++) {                                                             \
                BODY(1, ci * c->kv + kk);                                                          \
            }                                                                                      \
        }                                                                                          \
    } while (0)

// wp [Co Kc]: w [Co, Kc] tile by tile, each tile's TB taps of co side by side, so that a
// tile's broadcasts walk Co TB consecutive weights instead of TB scattered ones in each of
// Co rows Kc apart (ResNet's 64 -> 64 3x3: 147 KB of w, past L1, for every tile).
CDIR_TGT static void CDIR_FN(dxs_pack)(const ddl_cdir *c, T *wp, const T *w)
{
#define CDIR_DXS_PACK(TB_, t0_)                                                                    \
    do {                                                                                           \
        for (int64_t co = 0; co < c->Co; co++) {                                                   \
            for (int k = 0; k < (TB_); k++) {                                                      \
                *wp++ = w[co * c->Kc + (t0_) + k * c->kv];                                         \
            }                                                                                      \
        }                                                                                          \
    } while (0)
    CDIR_DXS_TILES(CDIR_DXS_PACK);
#undef CDIR_DXS_PACK
}

CDIR_TGT static void CDIR_FN(dxs)(const ddl_cdir *c, T *dxp, const T *dyw, const T *wp)
{
    int64_t  j = 0;
    const T *wt;
#define CDIR_DXS_RUN(TB_, t0_)                                                                     \
    do {                                                                                           \
        CDIR_FN(dxs_tile)(TB_, JV_, c, (t0_), c->kv, j, dxp, dyw, wt);                             \
        wt += c->Co * (TB_);                                                                       \
    } while (0)
#define CDIR_DXS_PASS(JV)                                                                          \
    do {                                                                                           \
        const int JV_ = (JV);                                                                      \
        wt            = wp;                                                                        \
        CDIR_DXS_TILES(CDIR_DXS_RUN);                                                              \
    } while (0)
    for (; j + CDIR_DXS_JV * L <= c->nj; j += CDIR_DXS_JV * L) {
        CDIR_DXS_PASS(CDIR_DXS_JV);
    }
    for (; j + 2 * L <= c->nj; j += 2 * L) {
        CDIR_DXS_PASS(2);
    }
    for (; j < c->nj; j += L) {
        CDIR_DXS_PASS(1);
    }
#undef CDIR_DXS_PASS
#undef CDIR_DXS_RUN
}
#undef CDIR_DXS_TILES

#undef CDIR_FN
#undef CDIR_CAT
#undef CDIR_CAT2
