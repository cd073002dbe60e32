// The same math as mma_pairwise.cuh on Hopper's warpgroup tensor cores (wgmma, sm_90a): the products
// run as asynchronous wgmma.mma_async m64n128k8 instructions that read both operands from shared
// memory, where mma.sync needs every fragment in registers first.
//
// Block: 2 warpgroups (256 threads), a 128 × 128 output tile, each warpgroup 64 rows × 128 columns
// (64 fp32 accumulators per thread).  Per k chunk of 16, every thread loads its part of the next chunk
// from global memory into registers (KmTile, any strides), the warpgroups issue six wgmma (two k8 steps
// × three products) on the current chunk, and while they run the threads split the registers into TF32
// hi and lo parts, store them into the other shared buffer and add the squares to their norm partial
// sums.  Shared layout per stage (32 KB, two stages): x hi, x lo, z hi, z lo, each 128 rows of 64 bytes
// in the 64-byte swizzle the descriptors name (16-byte chunk c of row p at chunk c ^ ((p / 2) mod 4)),
// which also makes the staging stores conflict-free.  Row norms: each thread's partial sums go through
// shared memory once and are added in a fixed order (deterministic).  The shared memory is dynamic
// (above the 48 KB static limit: the launcher raises the kernel's limit when it loads it).
#include "pairwise_epilogue.cuh"
#define NT 256
#define BM 128
#define BN 128
#define BK 16
#define KM_NSQ(MODE, E) ((MODE) == 2 && (E) % 4 == 0 ? 1 : (E))

extern "C" __global__ void __launch_bounds__(NT, 2)
kermac_pairwise(KM_PARAMS) {
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
#include "pairwise_prologue.cuh"
    const float* xb = x + off_x + (long long)m0 * sxm;
    const float* zb = z + off_z + (long long)n0 * szn;
    KmTile<float, NT, BM, BK, BM, KM_X_MODE, KM_X_VEC> xt;
    KmTile<float, NT, BN, BK, BN, KM_Z_MODE, KM_Z_VEC> zt;
    float acc[64];
    float xsq[KM_NSQ(KM_X_MODE, KM_X_VEC)], zsq[KM_NSQ(KM_Z_MODE, KM_Z_VEC)];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < KM_NSQ(KM_X_MODE, KM_X_VEC); ++i) xsq[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < KM_NSQ(KM_Z_MODE, KM_Z_VEC); ++i) zsq[i] = 0.0f;
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

    // The first k tile staged (by stage) in buffer 0 and visible to the block, before either pass's loop.
#define KM_FIRST_TILE(stage)                                                          \
    if (ntiles > 0) {                                                                 \
      load(0);                                                                        \
      stage(0);                                                                       \
      __syncthreads();                                                                \
    }

    // ---- cross term on the tensor cores (3×TF32, wgmma) and the norms in fp32 --------------
    KM_FIRST_TILE(stage_split)
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
      flagged |= km_cancelled(acc[i], xn_s[r] + zn_s[s], guard) && m0 + r < M && n0 + s < N;
    }
    if (__syncthreads_or(flagged)) {
      // Exact recomputation of the whole tile: Σ(x − z)² from differences, in fp32.
#pragma unroll
      for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
      KM_FIRST_TILE(stage_raw)
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
              acc[i + c] = km_add_sq(acc[i + c], a0.x, b.x);
              acc[i + c] = km_add_sq(acc[i + c], a0.y, b.y);
              acc[i + c] = km_add_sq(acc[i + c], a0.z, b.z);
              acc[i + c] = km_add_sq(acc[i + c], a0.w, b.w);
              acc[i + 2 + c] = km_add_sq(acc[i + 2 + c], a1.x, b.x);
              acc[i + 2 + c] = km_add_sq(acc[i + 2 + c], a1.y, b.y);
              acc[i + 2 + c] = km_add_sq(acc[i + 2 + c], a1.z, b.z);
              acc[i + 2 + c] = km_add_sq(acc[i + 2 + c], a1.w, b.w);
            }
          }
        }
        if (t + 1 < ntiles) stage_raw(cur ^ 1);
        __syncthreads();
      }
    }
#undef KM_FIRST_TILE

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
      for (int j = 0; j < 4; ++j) v[j] = KM_OUTPUT(v[j], m, nb + j);
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
