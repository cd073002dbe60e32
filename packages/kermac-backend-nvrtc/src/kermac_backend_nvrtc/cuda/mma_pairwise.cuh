// float32 Σ(x − z)² on the tensor cores with mma.sync (sm_80 and newer): d² = ‖x‖² + ‖z‖² − 2·x·z with
// the cross term in 3×TF32 — each operand split into a TF32 high part and a TF32 residual,
// x·z ≈ xl·zh + xh·zl + xh·zh — and the norms summed in fp32 from the same fragments.  A block
// computes 128×128 outputs with 8 warps of 64×32 (4×4 mma tiles).  Where d² <= guard·(‖x‖² + ‖z‖²)
// (cancellation) or is not finite, the whole block tile is recomputed exactly as Σ(x − z)² from
// differences (pairwise_epilogue.cuh).  Reads the functor km_epilogue.
#include "pairwise_epilogue.cuh"
// Every accumulator (i, j, c) of the warp's 4 × 4 mma tiles: acc[i][j][c] is row wm·64 + 16i + g + 8(c >> 1),
// column wn·32 + 8j + 2q + (c & 1).
#define KM_EACH_ACC(i, j, c)                          \
  _Pragma("unroll") for (int i = 0; i < 4; ++i)       \
  _Pragma("unroll") for (int j = 0; j < 4; ++j)       \
  _Pragma("unroll") for (int c = 0; c < 4; ++c)

extern "C" __global__ void __launch_bounds__(NT, KM_MIN_BLOCKS)
kermac_pairwise(KM_PARAMS) {
  __shared__ __align__(16) float Xs[2][BK][BM + SPAD];
  __shared__ __align__(16) float Zs[2][BK][BN + SPAD];
  __shared__ float xn_s[BM], zn_s[BN];
  const int tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5;
  const int wm = warp >> 2, wn = warp & 3;   // warp tile: rows wm·64.., columns wn·32..
  const int g = lane >> 2, q = lane & 3;     // mma fragment coordinates
#include "pairwise_prologue.cuh"
    const float* xb = x + off_x + (long long)m0 * sxm;
    const float* zb = z + off_z + (long long)n0 * szn;
    KmTile<float, NT, BM, BK, BM + SPAD, KM_X_MODE, KM_X_VEC> xt;
    KmTile<float, NT, BN, BK, BN + SPAD, KM_Z_MODE, KM_Z_VEC> zt;
    float acc[4][4][4];
    float xsq[4][2], zsq[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      xsq[i][0] = xsq[i][1] = zsq[i] = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[i][j][c] = 0.0f;
    }

    // x and z tiles through KmTile's register double buffer, for the main loop and the guard's
    // recomputation: KM_LOAD(tile) starts loading k tile number tile, KM_STORE(buf) stores it in buffer buf.
#define KM_LOAD(tile)                                                                 \
    {                                                                                 \
      xt.load(xb, sxm, sxk, M - m0, (tile) * BK, D);                                  \
      zt.load(zb, szn, szk, N - n0, (tile) * BK, D);                                  \
    }
#define KM_STORE(buf)                                                                 \
    {                                                                                 \
      xt.store(Xs[buf]);                                                              \
      zt.store(Zs[buf]);                                                              \
    }
    // The first k tile staged in buffer 0 and visible to the block, before either pass's loop.
#define KM_FIRST_TILE                                                                 \
    if (ntiles > 0) {                                                                 \
      KM_LOAD(0)                                                                      \
      KM_STORE(0)                                                                     \
      __syncthreads();                                                                \
    }
    // ---- cross term on the tensor cores (3×TF32) and the norms in fp32 -------------------
    KM_FIRST_TILE
    for (int t = 0; t < ntiles; ++t) {
      const int cur = t & 1;
      if (t + 1 < ntiles) KM_LOAD(t + 1)
#pragma unroll 1
      for (int kk = 0; kk < BK; kk += 8) {   // tails are zero-filled; unroll 1 keeps 2 blocks/SM (128 registers)
        unsigned bh[4][2], bl[4][2];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int c = wn * 32 + j * 8 + g;
          const float b0 = Zs[cur][kk + q][c], b1 = Zs[cur][kk + q + 4][c];
          if (wm == 0) zsq[j] = fmaf(b1, b1, fmaf(b0, b0, zsq[j]));
          km_split(b0, bh[j][0], bl[j][0]);
          km_split(b1, bh[j][1], bl[j][1]);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int r = wm * 64 + i * 16 + g;
          const float a[4] = {Xs[cur][kk + q][r], Xs[cur][kk + q][r + 8], Xs[cur][kk + q + 4][r], Xs[cur][kk + q + 4][r + 8]};
          if (wn == 0) {
            xsq[i][0] = fmaf(a[2], a[2], fmaf(a[0], a[0], xsq[i][0]));
            xsq[i][1] = fmaf(a[3], a[3], fmaf(a[1], a[1], xsq[i][1]));
          }
          unsigned ah[4], al[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) km_split(a[e], ah[e], al[e]);
#pragma unroll
          for (int j = 0; j < 4; ++j) km_mma(acc[i][j], al, bh[j][0], bh[j][1]);
#pragma unroll
          for (int j = 0; j < 4; ++j) km_mma(acc[i][j], ah, bl[j][0], bl[j][1]);
#pragma unroll
          for (int j = 0; j < 4; ++j) km_mma(acc[i][j], ah, bh[j][0], bh[j][1]);
        }
      }
      if (t + 1 < ntiles) KM_STORE(cur ^ 1)
      __syncthreads();
    }
    if (wn == 0) {
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float v = xsq[i][h];
          v += __shfl_xor_sync(0xffffffffu, v, 1);
          v += __shfl_xor_sync(0xffffffffu, v, 2);
          if (q == 0) xn_s[wm * 64 + i * 16 + h * 8 + g] = v;
        }
    }
    if (wm == 0) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float v = zsq[j];
        v += __shfl_xor_sync(0xffffffffu, v, 1);
        v += __shfl_xor_sync(0xffffffffu, v, 2);
        if (q == 0) zn_s[wn * 32 + j * 8 + g] = v;
      }
    }
    __syncthreads();

    // ---- d² = ‖x‖² + ‖z‖² − 2·x·z, and the cancellation guard -----------------------------
    int flagged = 0;
    KM_EACH_ACC(i, j, c) {
          const int r = wm * 64 + i * 16 + g + (c >> 1) * 8, s = wn * 32 + j * 8 + 2 * q + (c & 1);
          flagged |= km_cancelled(acc[i][j][c], xn_s[r] + zn_s[s], guard) && m0 + r < M && n0 + s < N;
        }
    if (__syncthreads_or(flagged)) {
      // Exact recomputation of the whole tile: Σ(x − z)² from differences, in fp32.
      KM_EACH_ACC(i, j, c) acc[i][j][c] = 0.0f;
      KM_FIRST_TILE
      for (int t = 0; t < ntiles; ++t) {
        const int cur = t & 1;
        if (t + 1 < ntiles) KM_LOAD(t + 1)
#pragma unroll 4
        for (int kk = 0; kk < BK; ++kk) {
          float xv[4][2], zv[4][2];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            xv[i][0] = Xs[cur][kk][wm * 64 + i * 16 + g];
            xv[i][1] = Xs[cur][kk][wm * 64 + i * 16 + g + 8];
            const float2 zz = *reinterpret_cast<const float2*>(&Zs[cur][kk][wn * 32 + i * 8 + 2 * q]);
            zv[i][0] = zz.x;
            zv[i][1] = zz.y;
          }
          KM_EACH_ACC(i, j, c) acc[i][j][c] = km_add_sq(acc[i][j][c], xv[i][c >> 1], zv[j][c & 1]);
        }
        if (t + 1 < ntiles) KM_STORE(cur ^ 1)
        __syncthreads();
      }
    }
#undef KM_LOAD
#undef KM_STORE
#undef KM_FIRST_TILE

    // ---- epilogue and stores (pairs of columns as one 8-byte store where ovec allows) -------
    float* ob = out + off_o;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = m0 + wm * 64 + i * 16 + h * 8 + g;
        if (m >= M) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int nb = n0 + wn * 32 + j * 8 + 2 * q;
          float v[2];
#pragma unroll
          for (int c = 0; c < 2; ++c) v[c] = KM_OUTPUT(acc[i][j][2 * h + c], m, nb + c);
          float* o = ob + (long long)m * som + (long long)nb * son;
          if (ovec && nb + 1 < N) {
            *reinterpret_cast<float2*>(o) = make_float2(v[0], v[1]);
          } else {
            if (nb < N) *o = v[0];
            if (nb + 1 < N) o[son] = v[1];
          }
        }
      }
  }
}
