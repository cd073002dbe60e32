// The SIMT pairwise main loop (after simt_setup.cuh): the block's BM × BN tile at rows m0 and columns n0
// of the batch entry (offsets off_x, off_z) reduced over all D features into the register tile
// acc[GM · VM][GN · VN], from double-buffered shared tiles Xs and Zs (k-major, or k-contiguous with
// KM_K_CONTIGUOUS).  Ends with a barrier after its last k tile (none when D = 0), so the block may reuse
// Xs and Zs at once.  Reads the functors km_inner and km_reduce.
    int km_fallback = 0;
    const km_in_t* xb = x + off_x + (long long)m0 * sxm;
    const km_in_t* zb = z + off_z + (long long)n0 * szn;
#if !KM_K_CONTIGUOUS
    KmTile<km_in_t, NT, BM, BK, BM + SPAD, KM_X_MODE, KM_X_VEC> xt;
    KmTile<km_in_t, NT, BN, BK, BN + SPAD, KM_Z_MODE, KM_Z_VEC> zt;
#endif
    km_t acc[GM * VM][GN * VN];
#pragma unroll
    for (int i = 0; i < GM * VM; ++i)
#pragma unroll
      for (int j = 0; j < GN * VN; ++j) acc[i][j] = KM_IDENTITY;

#if KM_K_CONTIGUOUS
#include "kcontig_loop.cuh"
#else
    if (ntiles > 0) {
      xt.load(xb, sxm, sxk, M - m0, 0, D);
      zt.load(zb, szn, szk, N - n0, 0, D);
      xt.store(Xs[0]);
      zt.store(Zs[0]);
      KM_SYNC(true);
    }
#define KM_STEP(kk, SPLIT)                                                        \
      {                                                                           \
        km_t xr[GM * VM], zr[GN * VN];                                            \
        _Pragma("unroll") for (int g = 0; g < GM; ++g)                            \
          km_lds<VM>(&Xs[cur][kk][g * (BM / GM) + ty * VM], xr + g * VM);         \
        _Pragma("unroll") for (int g = 0; g < GN; ++g)                            \
          km_lds<VN>(&Zs[cur][kk][g * (BN / GN) + tx * VN], zr + g * VN);         \
        _Pragma("unroll") for (int i = 0; i < GM * VM; ++i)                       \
        _Pragma("unroll") for (int j = 0; j < GN * VN; ++j)                       \
          acc[i][j] = km_reduce(acc[i][j], KM_IS_SPLIT(i * GN * VN + j, SPLIT)    \
            ? KM_SPLIT_TERM(xr[i], zr[j]) : km_inner(xr[i], zr[j] KM_HYPER_ACTUALS)); \
      }
    for (int t = 0; t < ntiles; ++t) {
      const int cur = t & 1;
#if KM_PADDED_TAIL
#pragma unroll
      for (int kk = 0; kk < KM_LOADS_AFTER; ++kk) KM_STEP(kk, 0)
#endif
      if (t + 1 < ntiles) {
        xt.load(xb, sxm, sxk, M - m0, (t + 1) * BK, D);
        zt.load(zb, szn, szk, N - n0, (t + 1) * BK, D);
      }
      const int kcount = min(BK, D - t * BK);
#if KM_PADDED_TAIL
      // Never taken (kcount > 0), but ptxas cannot tell: the branch ends the basic block, so the
      // loads above stay where they are instead of sinking to their shared stores.
      if (kcount <= 0) __trap();
#pragma unroll
      for (int kk = KM_LOADS_AFTER; kk < BK; ++kk) KM_STEP(kk, 0)
#else
      // A split kernel's fallback tiles (rare: inputs beyond lim, inf or NaN) share the tail's loop.
      if (kcount == BK && !km_fallback) {
#pragma unroll KM_K_UNROLL
        for (int kk = 0; kk < BK; ++kk) KM_STEP(kk, KM_SPLIT_PAIRS)
      } else {
        for (int kk = 0; kk < kcount; ++kk) KM_STEP(kk, 0)
      }
#endif
      if (t + 1 < ntiles) {
        xt.store(Xs[cur ^ 1]);
        zt.store(Zs[cur ^ 1]);
      }
      KM_SYNC(t + 1 < ntiles);
    }
#undef KM_STEP
#endif
