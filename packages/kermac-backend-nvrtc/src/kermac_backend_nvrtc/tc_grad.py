"""The gradient contraction on tensor cores (float32, 3×TF32): template, tile shape, source builder.

For a fixed ``n`` the gradient is a matrix product over k::

    out[o, n, m] = Σ_k B'[m, k] · c[o, k],     B'[m, k] = a[k, m] · multiply(d[n, m], b[n, k])

so :data:`TC_GRAD` forms B' in registers, directly in the layout of an ``mma.sync`` m16n8k8 TF32
A fragment (16 m × 8 k), and multiplies it with c (B fragment: 8 k × 8 o) on the tensor cores.  m
is the mma's M dimension and o its N dimension, so O ≤ 8 costs one mma per fragment and
9 ≤ O ≤ 16 two; larger O is split into chunks of 16 over the grid (as the SIMT kernel does).

Accuracy (3×TF32): c is split once, when its tile is stored to shared memory, into
c_hi = rna_tf32(c) and c_lo = rna_tf32(c − c_hi); every B' value into v_hi = v with its low 13
bits cleared (TF32 by truncation, one instruction) and v_lo = v − v_hi (exact, |v_lo| < 2⁻¹⁰·|v|;
the tensor core reads its top 19 bits), and c·v ≈ v_lo·c_hi + v_hi·c_lo + v_hi·c_hi.  Each term
misses at most about 2⁻²⁰·|c·v| (the TF32 reading of v_lo) plus 2⁻²¹·|c·v| (the dropped v_lo·c_lo),
against 2⁻²⁴ for fp32 FMAs; rounding v_hi instead halves both bounds but costs an instruction per
value, 7.6 % of the loop (measured 5–6 % slower at p = 2, 1–2 % at p = 1.5, errors 3.2–4.3e-7 against
3.6–4.7e-7 truncated).  The tensor cores truncate
their fp32 sums, a bias that grew to 2.9e-5 relative at K = 4096 and 5.8e-5 at K = 8192 when the
mma accumulators ran over all of k; they therefore hold the three products of two 8-wide k steps
only (``k_group``), and fp32 registers add those partial sums with round-to-nearest (3e-7 to 4e-7
at K = 4096 to 8192; with one k step per partial sum, 4e-7 to 6e-7 and 1.5 % slower).  A B'
value of ±inf gives NaN (inf − inf in the split) where fp32 arithmetic would give ±inf.

Block: 8 warps of ``wn`` n × ``wm``·16 m pairs (``warps_n`` × ``warps_m`` warps); d of the warp's
pairs stays in registers; a, b and the split c are staged through shared memory in k tiles of
``bk`` (double buffer, the SIMT kernels' ``KmTile``: a and b copied with cp.async where their
layout allows — 2–5 % faster on an H100 than staging them through registers, docs/nvrtc-notes.md
Version 13 — c through registers to split it), rows padded so the fragment loads hit 32 distinct
banks.  Blocks are ordered n-tile fastest, so concurrently running blocks share their slice of a
(the largest operand) in L2.
"""

from __future__ import annotations

from dataclasses import dataclass
from string import Template

from kermac_backend_nvrtc import kernels
from kermac_backend_nvrtc.codegen import GradVariant, Param, _prelude, grad_parts

__all__ = ["TC_GRAD", "TC_GRAD_CONFIG", "TcGradConfig", "dynamic_smem", "smem_stride", "tc_grad_source"]


@dataclass(frozen=True)
class TcGradConfig:
    """Tile of :data:`TC_GRAD`: ``warps_n`` × ``warps_m`` warps of ``wn`` n × ``wm``·16 m pairs."""

    warps_n: int
    warps_m: int
    wn: int
    wm: int
    bk: int
    k_unroll: int
    min_blocks: int
    max_ot: int = 16
    k_group: int = 1  # 8-wide k steps per fresh mma accumulator (the products' partial sums)

    @property
    def bnn(self) -> int:
        """n per block."""
        return self.warps_n * self.wn

    @property
    def bmm(self) -> int:
        """m per block."""
        return self.warps_m * self.wm * 16


#: 8 n × 64 m pairs per block (warps of 4 n × 16 m), k tiles of 32, two blocks per SM, two k steps
#: per partial sum: 128 registers with about 40 bytes of spills (NVRTC 13.5, sm_90), the fastest of
#: the tiles measured (docs/nvrtc-notes.md).
TC_GRAD_CONFIG = TcGradConfig(warps_n=2, warps_m=4, wn=4, wm=1, bk=32, k_unroll=1, min_blocks=2, k_group=2)


def smem_stride(p: int) -> int:
    """Row stride (floats, ≥ ``p``, a multiple of 4) of a k-major shared tile whose fragment loads —
    8 consecutive p by 4 consecutive k per warp — hit 32 distinct banks (stride ≡ 8 or 24 mod 32)."""
    s = -(-p // 8) * 8
    while s % 32 not in (8, 24):
        s += 8
    return s


TC_GRAD = Template(
    r"""
#define NT 256
#define WARPS_M $WARPS_M
#define WN $WN
#define WM $WM
#define OT8 $OT8
#define OT (OT8 * 8)
#define BNN $BNN
#define BMM $BMM
#define BK $BK
#define AS $ASTRIDE
#define BS $BSTRIDE
#define CS $CSTRIDE
#define KG $KGROUP  // 8-wide k steps whose three products share one mma accumulator
static_assert(BK % (8 * KG) == 0, "k tiles hold whole groups of 8-wide k steps");

__device__ __forceinline__ float km_multiply(float d, float b$HYPER_FORMALS) { return $MULTIPLY; }
__device__ __forceinline__ float km_epilogue(float acc$HYPER_FORMALS) { return $EPILOGUE; }

extern "C" __global__ void __launch_bounds__(NT, $MIN_BLOCKS)
kermac_grad($PARAMS) {
  // Dynamic shared memory (dynamic_smem bytes; k tiles of 64 would take over 48 KB): a, b, c_hi, c_lo.
  extern __shared__ __align__(16) float km_dyn[];
  float(*As)[BK][AS] = reinterpret_cast<float(*)[BK][AS]>(km_dyn);
  float(*Bs)[BK][BS] = reinterpret_cast<float(*)[BK][BS]>(km_dyn + 2 * BK * AS);
  unsigned(*Ch)[BK][CS] = reinterpret_cast<unsigned(*)[BK][CS]>(km_dyn + 2 * BK * (AS + BS));
  unsigned(*Cl)[BK][CS] = reinterpret_cast<unsigned(*)[BK][CS]>(km_dyn + 2 * BK * (AS + BS + CS));
  const int tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, q = lane & 3;          // mma fragment coordinates
  const int wn = warp / WARPS_M, wm = warp % WARPS_M;
  const int n0 = (blockIdx.x % tiles_n) * BNN;   // n tiles fastest: neighbours share a's slice in L2
  const int m0 = (blockIdx.x / tiles_n) * BMM;
"""
    + kernels.GRAD_PROLOGUE
    + r"""    // d of the warp's pairs: n = n0 + wn·WN + i, m = m0 + (wm·WM + j)·16 + g + 8h (A fragment rows).
    float dv[WN][WM][2];
#pragma unroll
    for (int i = 0; i < WN; ++i)
#pragma unroll
      for (int j = 0; j < WM; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int n = n0 + wn * WN + i, m = m0 + (wm * WM + j) * 16 + g + 8 * h;
          dv[i][j][h] = (n < N && m < M) ? d[off_d + (long long)n * sdn + (long long)m * sdm] : 0.0f;
        }
    const float* ab = a + off_a + (long long)m0 * sam;
    const float* bb = b + off_b + (long long)n0 * sbn;
    const float* cb = c + off_c + (long long)o0 * sco;
    KmTile<float, NT, BMM, BK, AS, $AMODE, $AE> at;
    KmTile<float, NT, BNN, BK, BS, $BMODE, $BE> bt;
    KmTile<float, NT, OT8 * 8, BK, CS, $CMODE, $CE> ct;
    // The tensor cores truncate their fp32 sums (a bias that grows with the number of additions), so
    // the mma accumulators hold KG 8-wide k steps only; acc adds those with round-to-nearest.
    float acc[WN][WM][OT8][4];
#pragma unroll
    for (int i = 0; i < WN; ++i)
#pragma unroll
      for (int j = 0; j < WM; ++j)
#pragma unroll
        for (int t = 0; t < OT8; ++t)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[i][j][t][e] = 0.0f;

    // a and b go to shared memory with cp.async where they can (KM_STORE lands them), c through
    // registers, split into TF32 hi and lo parts on the way.
#define KM_STORE(buf)                                                                 \
    {                                                                                 \
      km_cp_wait();                                                                   \
      at.land(As[buf]);                                                               \
      bt.land(Bs[buf]);                                                               \
      ct.each([&](int k, int p, float v) {                                            \
        unsigned hi, lo;                                                              \
        km_split(v, hi, lo);                                                          \
        Ch[buf][k][p] = hi;                                                           \
        Cl[buf][k][p] = lo;                                                           \
      });                                                                             \
    }
    // ab, bb and cb advance by one k tile per fetch (the tile's k run from 0, K − k0 left).
    if (ntiles > 0) {
      at.fetch(As[0], ab, sam, sak, M - m0, 0, K);
      bt.fetch(Bs[0], bb, sbn, sbk, N - n0, 0, K);
      km_cp_commit();
      ct.load(cb, sco, sck, O - o0, 0, K);
      ab += BK * sak, bb += BK * sbk, cb += BK * sck;
      KM_STORE(0)
      __syncthreads();
    }
    for (int t = 0; t < ntiles; ++t) {
      const int cur = t & 1;
      if (t + 1 < ntiles) {
        const int k_left = K - (t + 1) * BK;
        at.fetch(As[cur ^ 1], ab, sam, sak, M - m0, 0, k_left);
        bt.fetch(Bs[cur ^ 1], bb, sbn, sbk, N - n0, 0, k_left);
        km_cp_commit();
        ct.load(cb, sco, sck, O - o0, 0, k_left);
        ab += BK * sak, bb += BK * sbk, cb += BK * sck;
      }
      // k tails are zero-filled (a = c = 0 there), so every tile runs whole.
#pragma unroll $KUNROLL
      for (int kk = 0; kk < BK; kk += 8 * KG) {
        unsigned ch[KG][OT8][2], cl[KG][OT8][2];
        float bv[KG][2][WN];
#pragma unroll
        for (int s = 0; s < KG; ++s) {
#pragma unroll
          for (int u = 0; u < OT8; ++u)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              ch[s][u][h] = Ch[cur][kk + 8 * s + q + 4 * h][u * 8 + g];
              cl[s][u][h] = Cl[cur][kk + 8 * s + q + 4 * h][u * 8 + g];
            }
          km_lds<WN>(&Bs[cur][kk + 8 * s + q][wn * WN], bv[s][0]);
          km_lds<WN>(&Bs[cur][kk + 8 * s + q + 4][wn * WN], bv[s][1]);
        }
#pragma unroll
        for (int j = 0; j < WM; ++j) {
          const int r = (wm * WM + j) * 16 + g;
          // A fragment element e: row (m) g + 8·(e & 1), column (k) q + 4·(e >> 1).
          float av[KG][4];
#pragma unroll
          for (int s = 0; s < KG; ++s) {
            const float* a0 = &As[cur][kk + 8 * s + q][r];
            av[s][0] = a0[0];
            av[s][1] = a0[8];
            av[s][2] = a0[4 * AS];
            av[s][3] = a0[4 * AS + 8];
          }
#pragma unroll
          for (int i = 0; i < WN; ++i) {
            float s8[OT8][4];
#pragma unroll
            for (int s = 0; s < KG; ++s) {
              unsigned hi[4], lo[4];
#pragma unroll
              for (int e = 0; e < 4; ++e) {
                const float v = av[s][e] * km_multiply(dv[i][j][e & 1], bv[s][e >> 1][i]$HYPER_ACTUALS);
                hi[e] = __float_as_uint(v) & 0xffffe000u;  // TF32 by truncation: v − hi is exact
                lo[e] = __float_as_uint(v - __uint_as_float(hi[e]));
              }
#pragma unroll
              for (int u = 0; u < OT8; ++u) {
                if (s == 0) km_mma0(s8[u], lo, ch[s][u][0], ch[s][u][1]);
                else km_mma(s8[u], lo, ch[s][u][0], ch[s][u][1]);
                km_mma(s8[u], hi, cl[s][u][0], cl[s][u][1]);
                km_mma(s8[u], hi, ch[s][u][0], ch[s][u][1]);
              }
            }
#pragma unroll
            for (int u = 0; u < OT8; ++u)
#pragma unroll
              for (int e = 0; e < 4; ++e) acc[i][j][u][e] += s8[u][e];
          }
        }
      }
      if (t + 1 < ntiles) KM_STORE(cur ^ 1)
      __syncthreads();
    }
#undef KM_STORE

    // Accumulator e of tile (i, j, u): m row g + 8·(e >> 1), o column u·8 + 2q + (e & 1).
    float* ob = out + off_o;
#pragma unroll
    for (int i = 0; i < WN; ++i) {
      const int n = n0 + wn * WN + i;
      if (n >= N) continue;
#pragma unroll
      for (int j = 0; j < WM; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int m = m0 + (wm * WM + j) * 16 + g + 8 * (e >> 1);
          if (m >= M) continue;
#pragma unroll
          for (int u = 0; u < OT8; ++u) {
            const int o = o0 + u * 8 + 2 * q + (e & 1);
            if (o < O)
              ob[(long long)o * soo + (long long)n * son + (long long)m * som] =
                  km_epilogue(acc[i][j][u][e]$HYPER_ACTUALS);
          }
        }
    }
  }
}
"""
)


def dynamic_smem(ot: int) -> int:
    """Bytes of dynamic shared memory of a :data:`TC_GRAD` block with ``ot`` outputs: two k tiles each
    of a, b, c_hi and c_lo, rows padded by :func:`smem_stride` (tile :data:`TC_GRAD_CONFIG`)."""
    cfg = TC_GRAD_CONFIG
    return 4 * 2 * cfg.bk * (smem_stride(cfg.bmm) + smem_stride(cfg.bnn) + 2 * smem_stride(ot))


def tc_grad_source(v: GradVariant) -> tuple[str, list[Param]]:
    """CUDA source of ``kermac_grad`` on the tensor cores for float32 variant ``v`` (``v.ot`` 8 or 16),
    with the tile :data:`TC_GRAD_CONFIG` (read at each call, as :func:`.plan.plan_grad` does)."""
    cfg = TC_GRAD_CONFIG
    if v.dtype != "float32" or v.ot not in (8, 16):
        raise ValueError(f"tensor-core gradient: needs float32 and 8 or 16 outputs per block; got {v.dtype}, {v.ot}")
    parts = grad_parts(v, "float", "tiles_n")
    source = TC_GRAD.substitute(
        WARPS_M=cfg.warps_m,
        WN=cfg.wn,
        WM=cfg.wm,
        OT8=v.ot // 8,
        BNN=cfg.bnn,
        BMM=cfg.bmm,
        BK=cfg.bk,
        ASTRIDE=smem_stride(cfg.bmm),
        BSTRIDE=smem_stride(cfg.bnn),
        CSTRIDE=smem_stride(v.ot),
        KUNROLL=cfg.k_unroll,
        KGROUP=cfg.k_group,
        MIN_BLOCKS=cfg.min_blocks,
        **parts.args,
    )
    return _prelude("float", False) + kernels.MMA_TF32 + source, parts.params
