"""The (x − z)² sums on Hopper's warpgroup tensor cores (``wgmma``, sm_90a): template and builder.

Same math as :data:`.tc_pairwise.TC_PAIRWISE` — d² = ‖x‖² + ‖z‖² − 2·x·z, the cross term in 3×TF32
(x·z ≈ xl·zh + xh·zl + xh·zh with hi = tf32(a), lo = tf32(a − hi)), the norms in fp32, the same
cancellation guard and exact recomputation — but the products run as asynchronous
``wgmma.mma_async`` m64n128k8 instructions that read both operands from shared memory, where
``mma.sync`` needs every fragment in registers first.

Block: 2 warpgroups (256 threads), a 128 × 128 output tile, each warpgroup 64 rows × 128 columns
(64 fp32 accumulators per thread).  Per k chunk of 16, every thread loads its part of the next
chunk from global memory into registers (``KmTile``, any strides), the warpgroups issue six
wgmma (two k8 steps × three products) on the current chunk, and while they run the threads split
the registers into TF32 hi and lo parts, store them into the other shared buffer and add the
squares to their norm partial sums.  Shared layout per stage (32 KB, two stages): x hi, x lo,
z hi, z lo, each 128 rows of 64 bytes (16 fp32 values) in the 64-byte swizzle the descriptors
name (16-byte chunk c of row p at chunk c ^ ((p / 2) mod 4)), which also makes the staging
stores conflict-free.  Row norms: each thread's partial sums go through shared memory once and
are added in a fixed order (deterministic).

The shared memory is dynamic (:data:`DYNAMIC_SMEM` bytes, above the 48 KB static limit), so the
launcher raises the kernel's limit once when it loads it.  The cubin targets ``sm_90a``: wgmma
exists on sm_90 only.
"""

from __future__ import annotations

from string import Template

from kermac_backend_nvrtc import kernels
from kermac_backend_nvrtc.codegen import TC_CONFIG, PairwiseVariant, Param, _pairwise_names, _pairwise_parts, _prelude

__all__ = ["ARCH", "DYNAMIC_SMEM", "WGMMA_PAIRWISE", "wgmma_pairwise_source"]

#: Compile target of the wgmma kernel (architecture-specific features of sm_90).
ARCH = "sm_90a"
#: Dynamic shared memory of one block: two stages of 4 × 128 × 64 bytes, reused for the 128 × 136
#: float output tile of the epilogue (the larger of the two), the 2 × 128 row norms, and 1 KB to
#: align the stages to the 1024-byte boundary the swizzle pattern repeats on.
DYNAMIC_SMEM = max(2 * 4 * 128 * 64, 128 * 136 * 4) + 2 * 128 * 4 + 1024


def _wgmma_asm() -> str:
    """``km_wgmma``: d[0..63] += A·Bᵀ, one m64n128k8 TF32 wgmma on two shared-memory descriptors."""
    regs = ", ".join(f"%{i}" for i in range(64))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(64))
    return (
        "__device__ __forceinline__ void km_wgmma(float* d, unsigned long long a, unsigned long long b) {\n"
        '  asm volatile("{\\n.reg .pred p;\\nsetp.ne.b32 p, %66, 0;\\n"\n'
        f'      "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {{{regs}}}, %64, %65, p, 1, 1;\\n}}\\n"\n'
        f"      : {outs}\n"
        '      : "l"(a), "l"(b), "r"(1));\n'
        "}\n"
    )


WGMMA_HELPERS = r"""
#define KM_ROW 64                 // bytes of one staged row: 16 fp32 values of k
#define KM_PART (128 * KM_ROW)    // one operand part (hi or lo) of one stage
#define KM_STAGE (4 * KM_PART)    // x hi, x lo, z hi, z lo
#define KM_TROW 136               // floats per row of the staged output tile (8 of padding)
#define KM_NORMS (128 * KM_TROW * 4)  // byte offset of the row norms, past the stages and the tile

// Byte offset of (p, k) in a k-major tile of 64-byte rows with the wgmma 64-byte swizzle: 16-byte
// chunk k/4 of row p is stored at chunk (k/4) ^ ((p/2) mod 4); the tile starts 1024-byte aligned.
__device__ __forceinline__ unsigned km_sw64(int p, int k) {
  return (unsigned)(p * KM_ROW + ((((k >> 2) ^ (p >> 1)) & 3) << 4) + ((k & 3) << 2));
}
// Descriptor of a K-major wgmma operand at shared address a: 64-byte swizzle (mode 2), 8-row
// groups 512 bytes apart (stride offset 512 >> 4), leading offset unused for swizzled K-major tiles.
__device__ __forceinline__ unsigned long long km_desc(unsigned a) {
  return (unsigned long long)((a & 0x3FFFFu) >> 4) | (1ull << 16) | (32ull << 32) | (2ull << 62);
}

// Stage a KmTile (PT rows × 16 k) into the swizzled buffers: TF32 hi and lo parts (SPLIT) or the
// values themselves into hi (the exact recomputation), adding squares to sq (SPLIT only): one sum
// for MODE 2, whose values share a row, else one per value.
template <bool SPLIT, typename Tile>
__device__ __forceinline__ void km_stage(const Tile& t, unsigned char* hi, unsigned char* lo, float* sq) {
  if constexpr (Tile::mode == 2 && Tile::e % 4 == 0) {
    const int p = threadIdx.x / (Tile::kt / Tile::e), k = (threadIdx.x % (Tile::kt / Tile::e)) * Tile::e;
#pragma unroll
    for (int c = 0; c < Tile::e; c += 4) {
      unsigned h[4], l[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float v = t.r.v[c + i];
        if constexpr (SPLIT) {
          sq[0] = fmaf(v, v, sq[0]);
          km_split(v, h[i], l[i]);
        } else {
          h[i] = l[i] = __float_as_uint(v);
        }
      }
      const unsigned off = km_sw64(p, k + c);
      *reinterpret_cast<uint4*>(hi + off) = make_uint4(h[0], h[1], h[2], h[3]);
      if constexpr (SPLIT) *reinterpret_cast<uint4*>(lo + off) = make_uint4(l[0], l[1], l[2], l[3]);
    }
  } else {
    t.each_pos([&](int i, int k, int p) {
      const float v = t.r.v[i];
      const unsigned off = km_sw64(p, k);
      if constexpr (SPLIT) {
        sq[i] = fmaf(v, v, sq[i]);
        unsigned h, l;
        km_split(v, h, l);
        *reinterpret_cast<unsigned*>(hi + off) = h;
        *reinterpret_cast<unsigned*>(lo + off) = l;
      } else {
        *reinterpret_cast<float*>(hi + off) = v;
      }
    });
  }
}
// This thread's norm partial sums into part[k·PT + p] (every position of the tile is written once).
template <typename Tile>
__device__ __forceinline__ void km_norm_parts(const Tile& t, float* part, const float* sq) {
  constexpr bool one = Tile::mode == 2 && Tile::e % 4 == 0;
  t.each_pos([&](int i, int k, int p) { part[k * Tile::pt + p] = one && i ? 0.0f : sq[one ? 0 : i]; });
}
"""

WGMMA_PAIRWISE = Template(
    r"""
#define NT 256
#define BM 128
#define BN 128
#define BK 16
#define KM_NSQ(MODE, E) ((MODE) == 2 && (E) % 4 == 0 ? 1 : (E))

__device__ $EPILOGUE_INLINE float km_epilogue(float acc, float diag$HYPER_FORMALS) { return $EPILOGUE; }

extern "C" __global__ void __launch_bounds__(NT, 2)
kermac_pairwise($PARAMS) {
  extern __shared__ __align__(16) unsigned char km_dyn[];
  const unsigned raw = (unsigned)__cvta_generic_to_shared(km_dyn);
  const unsigned sbase = (raw + 1023u) & ~1023u;            // shared address of stage 0
  unsigned char* const smem = km_dyn + (sbase - raw);
  float* const xn_s = reinterpret_cast<float*>(smem + KM_NORMS);
  float* const zn_s = xn_s + BM;
  const int tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2, wr = warp & 3;   // warpgroup (64 rows each), warp within it (16 rows)
  const int g = lane >> 2, q = lane & 3;     // accumulator fragment coordinates
"""
    + kernels.TILE_PROLOGUE
    + r"""    const float* xb = x + off_x + (long long)m0 * sxm;
    const float* zb = z + off_z + (long long)n0 * szn;
    KmTile<float, NT, BM, BK, BM, $XMODE, $XE> xt;
    KmTile<float, NT, BN, BK, BN, $ZMODE, $ZE> zt;
    float acc[64];
    float xsq[KM_NSQ($XMODE, $XE)], zsq[KM_NSQ($ZMODE, $ZE)];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < KM_NSQ($XMODE, $XE); ++i) xsq[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < KM_NSQ($ZMODE, $ZE); ++i) zsq[i] = 0.0f;
    // Chunk t of both operands into registers; the registers into stage buf, split (hi, lo and
    // the squares) for the products or as they are for the exact recomputation.
    auto load = [&](int t) {
      xt.load(xb, sxm, sxk, M - m0, t * BK, D);
      zt.load(zb, szn, szk, N - n0, t * BK, D);
    };
    auto stage_split = [&](int buf) {
      unsigned char* st = smem + buf * KM_STAGE;
      km_stage<true>(xt, st, st + KM_PART, xsq);
      km_stage<true>(zt, st + 2 * KM_PART, st + 3 * KM_PART, zsq);
      km_async_fence();
    };
    auto stage_raw = [&](int buf) {
      unsigned char* st = smem + buf * KM_STAGE;
      km_stage<false>(xt, st, nullptr, nullptr);
      km_stage<false>(zt, st + 2 * KM_PART, nullptr, nullptr);
    };

    // ---- cross term on the tensor cores (3×TF32, wgmma) and the norms in fp32 --------------
    if (ntiles > 0) {
      load(0);
      stage_split(0);
      __syncthreads();
    }
    for (int t = 0; t < ntiles; ++t) {
      const int cur = t & 1;
      if (t + 1 < ntiles) load(t + 1);
      const unsigned st = sbase + cur * KM_STAGE;
      const unsigned xa = st + wg * 64 * KM_ROW;   // this warpgroup's 64 rows of x hi
      km_fence_acc<64>(acc);
      km_wg_fence();
#pragma unroll
      for (int s = 0; s < 2; ++s) {              // k8 steps: 32 bytes into the 64-byte rows
        const unsigned long long ah = km_desc(xa + 32 * s), al = km_desc(xa + KM_PART + 32 * s);
        const unsigned long long bh = km_desc(st + 2 * KM_PART + 32 * s), bl = km_desc(st + 3 * KM_PART + 32 * s);
        km_wgmma(acc, al, bh);
        km_wgmma(acc, ah, bl);
        km_wgmma(acc, ah, bh);
      }
      km_wg_commit();
      if (t + 1 < ntiles) stage_split(cur ^ 1);
      km_wg_wait<0>();
      km_fence_acc<64>(acc);
      __syncthreads();
    }
    {
      float* part = reinterpret_cast<float*>(smem);   // [BK][BM] x partial sums, then [BK][BN] z
      km_norm_parts(xt, part, xsq);
      km_norm_parts(zt, part + BK * BM, zsq);
      __syncthreads();
      float v = 0.0f;
      const float* col = part + (tid < BM ? tid : BK * BM + tid - BM);
#pragma unroll
      for (int k = 0; k < BK; ++k) v += col[k * BM];
      xn_s[tid] = v;   // zn_s = xn_s + BM
      __syncthreads();
    }

    // ---- d² = ‖x‖² + ‖z‖² − 2·x·z, and the cancellation guard -----------------------------
    // acc[4j + 2h + c] is row wg·64 + wr·16 + h·8 + g, column 8j + 2q + c.
    const int r0 = wg * 64 + wr * 16 + g;
    int flagged = 0;
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      const int r = r0 + ((i >> 1) & 1) * 8, s = (i >> 2) * 8 + 2 * q + (i & 1);
      const float norms = xn_s[r] + zn_s[s];
      const float d2 = fmaf(-2.0f, acc[i], norms);
      acc[i] = d2;
      flagged |= !(d2 > guard * norms) && m0 + r < M && n0 + s < N;
    }
    if (__syncthreads_or(flagged)) {
      // Exact recomputation of the whole tile: Σ(x − z)² from differences, in fp32.
#pragma unroll
      for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
      if (ntiles > 0) {
        load(0);
        stage_raw(0);
        __syncthreads();
      }
      for (int t = 0; t < ntiles; ++t) {
        const int cur = t & 1;
        if (t + 1 < ntiles) load(t + 1);
        const unsigned char* xs = smem + cur * KM_STAGE;
        const unsigned char* zs = xs + 2 * KM_PART;
#pragma unroll 1
        for (int kc = 0; kc < BK; kc += 4) {
          const float4 a0 = *reinterpret_cast<const float4*>(xs + km_sw64(r0, kc));
          const float4 a1 = *reinterpret_cast<const float4*>(xs + km_sw64(r0 + 8, kc));
#pragma unroll
          for (int i = 0; i < 64; i += 4) {
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const float4 b = *reinterpret_cast<const float4*>(zs + km_sw64((i >> 2) * 8 + 2 * q + c, kc));
              float d;
              d = a0.x - b.x; acc[i + c] = fmaf(d, d, acc[i + c]);
              d = a0.y - b.y; acc[i + c] = fmaf(d, d, acc[i + c]);
              d = a0.z - b.z; acc[i + c] = fmaf(d, d, acc[i + c]);
              d = a0.w - b.w; acc[i + c] = fmaf(d, d, acc[i + c]);
              d = a1.x - b.x; acc[i + 2 + c] = fmaf(d, d, acc[i + 2 + c]);
              d = a1.y - b.y; acc[i + 2 + c] = fmaf(d, d, acc[i + 2 + c]);
              d = a1.z - b.z; acc[i + 2 + c] = fmaf(d, d, acc[i + 2 + c]);
              d = a1.w - b.w; acc[i + 2 + c] = fmaf(d, d, acc[i + 2 + c]);
            }
          }
        }
        if (t + 1 < ntiles) stage_raw(cur ^ 1);
        __syncthreads();
      }
    }

    // ---- epilogue: the d² tile through shared memory, then row-contiguous 16-byte stores -----
    // (the stages are free: the last shared reads above were followed by a barrier)
    float* const tile_s = reinterpret_cast<float*>(smem);   // [BM][KM_TROW]
#pragma unroll
    for (int i = 0; i < 64; i += 2)
      *reinterpret_cast<float2*>(tile_s + (r0 + ((i >> 1) & 1) * 8) * KM_TROW + (i >> 2) * 8 + 2 * q) =
          make_float2(acc[i], acc[i + 1]);
    __syncthreads();
    float* ob = out + off_o;
#pragma unroll 1
    for (int e = tid; e < BM * BN / 4; e += NT) {
      const int r = e / (BN / 4), c = (e % (BN / 4)) * 4;
      const int m = m0 + r, nb = n0 + c;
      if (m >= M) break;   // rows only grow with e
      const float4 a = *reinterpret_cast<const float4*>(tile_s + r * KM_TROW + c);
      float v[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int n = nb + j;
        const float diag = $DIAG;
        v[j] = km_epilogue(v[j], diag$HYPER_ACTUALS);
      }
      float* o = ob + (long long)m * som + (long long)nb * son;
      if (ovec && nb + 3 < N) {
        km_store16(o, v);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (nb + j < N) o[(long long)j * son] = v[j];
      }
    }
  }
}
"""
)


def wgmma_pairwise_source(v: PairwiseVariant) -> tuple[str, list[Param]]:
    """:data:`WGMMA_PAIRWISE` for a float32 (x − z)²-sum variant (``v.wgmma``); compile for :data:`ARCH`."""
    if not v.wgmma:
        raise ValueError("wgmma variant: needs a tensor-core variant planned for sm_90 (v.wgmma)")
    if (TC_CONFIG.bm, TC_CONFIG.bn, TC_CONFIG.bk) != (128, 128, 16):
        raise AssertionError("the wgmma kernel stages the 128 × 128 × 16 tiles of TC_CONFIG")
    extra = [Param("guard", "km_t"), Param("ovec", "int")]
    params, shared = _pairwise_parts(v, "float", extra, _pairwise_names(v.program))
    source = WGMMA_PAIRWISE.substitute(
        EPILOGUE_INLINE="__forceinline__" if v.inline_epilogue else "__noinline__", **shared
    )
    return _prelude(
        "float", False
    ) + kernels.MMA_TF32 + kernels.WGMMA_SYNC + WGMMA_HELPERS + _wgmma_asm() + source, params
