"""The (x − z)² sums on tensor cores with ``mma.sync`` (sm_80 and newer): template and builder.

Pairwise programs whose term is (x − z)² with a sum (l2, squared l2, gaussian, laplace_l2, matern,
cauchy), float32 only: d² = ‖x‖² + ‖z‖² − 2·x·z with the cross term on the tensor cores
(``mma.sync`` m16n8k8 TF32) in 3×TF32 — each operand split into a TF32 high part and a TF32
residual, x·z ≈ xl·zh + xh·zl + xh·zh — and the norms summed in fp32 from the same fragments.
A block computes 128×128 outputs with 8 warps of 64×32 (4×4 mma tiles).  Guard: where
d² ≤ guard·(‖x‖² + ‖z‖²) (cancellation; ``guard`` from the error bound, a kernel argument), or
d² is not finite, the whole block tile is recomputed exactly as Σ(x − z)² from differences.

On sm_90 the same math runs on ``wgmma`` instead (:mod:`.wgmma_pairwise`); this kernel serves
every other architecture and ``KERMAC_NVRTC_WGMMA=0``.
"""

from __future__ import annotations

from string import Template

from kermac.programs import is_squared_difference_sum
from kermac_backend_nvrtc import codegen, kernels
from kermac_backend_nvrtc.codegen import PairwiseVariant, Param, _pairwise_names, _pairwise_parts, _prelude

__all__ = ["TC_PAIRWISE", "tc_pairwise_source"]

TC_PAIRWISE = Template(
    r"""
#define NT 256
#define BM $BM
#define BN $BN
#define BK $BK
#define SPAD $SPAD

__device__ $EPILOGUE_INLINE float km_epilogue(float acc, float diag$HYPER_FORMALS) { return $EPILOGUE; }

extern "C" __global__ void __launch_bounds__(NT, $MIN_BLOCKS)
kermac_pairwise($PARAMS) {
  __shared__ __align__(16) float Xs[2][BK][BM + SPAD];
  __shared__ __align__(16) float Zs[2][BK][BN + SPAD];
  __shared__ float xn_s[BM], zn_s[BN];
  const int tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5;
  const int wm = warp >> 2, wn = warp & 3;   // warp tile: rows wm·64.., columns wn·32..
  const int g = lane >> 2, q = lane & 3;     // mma fragment coordinates
"""
    + kernels.TILE_PROLOGUE
    + r"""    const float* xb = x + off_x + (long long)m0 * sxm;
    const float* zb = z + off_z + (long long)n0 * szn;
    KmTile<float, NT, BM, BK, BM + SPAD, $XMODE, $XE> xt;
    KmTile<float, NT, BN, BK, BN + SPAD, $ZMODE, $ZE> zt;
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
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int r = wm * 64 + i * 16 + g + (c >> 1) * 8, s = wn * 32 + j * 8 + 2 * q + (c & 1);
          const float norms = xn_s[r] + zn_s[s];
          const float d2 = fmaf(-2.0f, acc[i][j][c], norms);
          acc[i][j][c] = d2;
          flagged |= !(d2 > guard * norms) && m0 + r < M && n0 + s < N;
        }
    if (__syncthreads_or(flagged)) {
      // Exact recomputation of the whole tile: Σ(x − z)² from differences, in fp32.
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int c = 0; c < 4; ++c) acc[i][j][c] = 0.0f;
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
#pragma unroll
          for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
              for (int c = 0; c < 4; ++c) {
                const float d = xv[i][c >> 1] - zv[j][c & 1];
                acc[i][j][c] = fmaf(d, d, acc[i][j][c]);
              }
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
          for (int c = 0; c < 2; ++c) {
            const int n = nb + c;
            const float diag = $DIAG;
            v[c] = km_epilogue(acc[i][j][2 * h + c], diag$HYPER_ACTUALS);
          }
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
"""
)


def tc_pairwise_source(v: PairwiseVariant) -> tuple[str, list[Param]]:
    """CUDA source of :data:`TC_PAIRWISE` for a float32 (x − z)²-sum program: its epilogue, hyperparameters,
    batch; the tile is ``codegen.TC_CONFIG``, read at each call (so a benchmark can vary it)."""
    prog = v.program
    if v.dtype != "float32" or not is_squared_difference_sum(prog):
        raise ValueError(f"tensor-core variant: needs a float32 sum of (x - z)^2; got {v.dtype} {prog.key()}")
    cfg = codegen.TC_CONFIG
    extra = [Param("guard", "km_t"), Param("ovec", "int")]
    params, shared = _pairwise_parts(v, "float", extra, _pairwise_names(prog))
    source = TC_PAIRWISE.substitute(
        BM=cfg.bm,
        BN=cfg.bn,
        BK=cfg.bk,
        SPAD=cfg.spad,
        MIN_BLOCKS=cfg.min_blocks,
        EPILOGUE_INLINE="__forceinline__" if v.inline_epilogue else "__noinline__",
        **shared,
    )
    return _prelude("float", False) + kernels.MMA_TF32 + source, params
