// The p = 1 gradient as a bf16 sign product on Hopper's warpgroup tensor cores (sm_90a).  For programs
// whose multiply is sign(d − b), a fixed m turns the contraction into a matrix product over k:
// out[o, n, m] = Σ_k S_m[n, k]·W_m[k, o], S_m[n, k] = sgn(d[n, m] − b[n, k]), W_m[k, o] = a[k, m]·c[o, k].
// S is −1, 0 or +1 — exact in bf16 — and W_m, formed in fp32, is split exactly into three bf16 pieces
// (hi, mid: the top 16 bits of w and of w − hi; lo = w − hi − mid, at most 8 significant bits) that sit
// side by side as the B operand (3·OT columns): one wgmma.mma_async m64n{3·OT}k16 per (m, 16 k)
// computes the exact products of all three; fp32 registers add the pieces.
//
// Block: 4 warpgroups, 2 along n (64 n each) × 2 along m (2 m each).  Per 16-wide k step and m a thread
// forms its 8 S values — the wgmma A fragment of its warp's 16 n, in registers — and issues one wgmma
// on W_m's k step in shared memory; before it overwrites the S registers of m it waits for the group
// that read them.  The accumulators run over one k tile of 64 only and fp32 registers add the tiles
// with round-to-nearest (the tensor cores truncate their sums).  Pipeline (one barrier per k tile):
// b's tile t + 1 and a, c's tile t + 2 are copied with cp.async while tile t is computed, and between
// the wgmma of tile t the threads form W of tile t + 1 into the other W buffer.
//
// Special values: ties give S = 0, as sgn(0) = 0 requires; differences below 2^-126 in magnitude are
// flushed to 0 and count as ties.  Where d − b is NaN the product would miss it, so each thread sums
// |b| over the values it reads, and a warp with a non-finite sum or d re-reads its rows of b after the
// loop and sets the outputs whose d − b is NaN for some k to NaN (a slow path for non-finite inputs
// only).  A non-finite a or c makes w's split NaN, so such outputs are NaN where fp32 arithmetic could
// give ±inf, as on the other tensor-core paths.  Reads the functor km_epilogue.
#define NW (3 * OT)                   // wgmma N: W's hi, mid and lo pieces side by side
#define NACC (NW / 2)                 // accumulators per m and thread
#define NSUM (OT / 2)                 // sums per m and thread
#define KM_WSTEP (NW * 32)            // bytes of W for one m and 16 k: NW rows of 16 bf16
#define KM_WBUF (MB * (BK / 16) * KM_WSTEP)
#define KM_BBUF (BNN * BS * 4)
#define KM_ABUF (MB * ACS * 4)
#define KM_CBUF (OT * ACS * 4)
#define KM_ITEMS (MB * OT * (BK / 4) / NT)  // W items (m, o, 4 k) per thread and tile

extern "C" __global__ void __launch_bounds__(NT, 1)
kermac_grad(KM_PARAMS, int bvec, int ovec) {
  extern __shared__ __align__(16) unsigned char km_smem[];
  const unsigned sbase = ((unsigned)__cvta_generic_to_shared(km_smem) + 255u) & ~255u;
  unsigned char* const gbase = km_smem + (sbase - (unsigned)__cvta_generic_to_shared(km_smem));
  const unsigned wsm = sbase;                              // W[2]
  const unsigned bsm = wsm + 2 * KM_WBUF;                  // b[2][BNN][BS]
  const unsigned asm_ = bsm + 2 * KM_BBUF;                 // a[2][MB][ACS]
  const unsigned csm = asm_ + 2 * KM_ABUF;                 // c[2][OT][ACS]
  const float* const Bs = reinterpret_cast<const float*>(gbase + 2 * KM_WBUF);
  const float* const As = reinterpret_cast<const float*>(gbase + 2 * KM_WBUF + 2 * KM_BBUF);
  const float* const Cs = reinterpret_cast<const float*>(gbase + 2 * KM_WBUF + 2 * KM_BBUF + 2 * KM_ABUF);
  unsigned char* const Ws = gbase;

  const int tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2, wr = warp & 3;     // warpgroup, warp within it (16 n)
  const int g = lane >> 2, q = lane & 3;       // fragment coordinates
  const int nl = 64 * (wg & 1) + 16 * wr + g;  // this thread's rows: nl and nl + 8 of the block
  const int ml = (wg >> 1) * MW;               // and its m: ml .. ml + MW of the block
  const int n0 = (blockIdx.x % tiles_n) * BNN; // n tiles fastest: neighbours share a's columns in L2
  const int m0 = (blockIdx.x / tiles_n) * MB;
#include "grad_prologue.cuh"
    const float* const ab = a + off_a;
    const float* const bb = b + off_b;
    const float* const cb = c + off_c;
    // d of this thread's pairs (rows nl, nl + 8; m ml .. ml + MW); a non-finite d marks the warp.
    float dv[2][MW];
    bool special = false;
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int j = 0; j < MW; ++j) {
        const int n = n0 + nl + 8 * r, m = m0 + ml + j;
        dv[r][j] = (n < N && m < M) ? d[off_d + (long long)n * sdn + (long long)m * sdm] : 0.0f;
        special |= !isfinite(dv[r][j]);
      }

    // cp.async of b's tile t (n-major rows) and of a's and c's tile t (m- and o-major rows).
    auto copy_b = [&](int t) {
      const int k0 = t * BK;
      const unsigned dst = bsm + (t & 1) * KM_BBUF;
      if (bvec) {  // unit k stride, 16-byte aligned rows, K % 4 == 0
#pragma unroll
        for (int j = 0; j < BNN * BK / 4 / NT; ++j) {
          const int i = tid + j * NT, n = i / (BK / 4), k = 4 * (i % (BK / 4));
          const bool ok = n0 + n < N && k0 + k < K;
          km_cp<16>(dst + 4 * (n * BS + k), ok ? bb + (long long)(n0 + n) * sbn + (k0 + k) : bb, ok);
        }
      } else {
        const bool nfast = sbn == 1 && sbk != 1;
#pragma unroll 4
        for (int j = 0; j < BNN * BK / NT; ++j) {
          const int i = tid + j * NT;
          const int n = nfast ? i % BNN : i / BK, k = nfast ? i / BNN : i % BK;
          const bool ok = n0 + n < N && k0 + k < K;
          km_cp<4>(dst + 4 * (n * BS + k), ok ? bb + (long long)(n0 + n) * sbn + (long long)(k0 + k) * sbk : bb, ok);
        }
      }
    };
    auto copy_ac = [&](int t) {
      const int k0 = t * BK;
#pragma unroll
      for (int j = 0; j < (MB * BK + NT - 1) / NT; ++j) {
        const int i = tid + j * NT, m = i / BK, k = i % BK;
        if (m < MB) {
          const bool ok = m0 + m < M && k0 + k < K;
          km_cp<4>(asm_ + (t & 1) * KM_ABUF + 4 * (m * ACS + k),
                 ok ? ab + (long long)(k0 + k) * sak + (long long)(m0 + m) * sam : ab, ok);
        }
      }
#pragma unroll
      for (int j = 0; j < OT * BK / NT; ++j) {
        const int i = tid + j * NT, o = i / BK, k = i % BK;
        const bool ok = o0 + o < O && k0 + k < K;
        km_cp<4>(csm + (t & 1) * KM_CBUF + 4 * (o * ACS + k),
               ok ? cb + (long long)(o0 + o) * sco + (long long)(k0 + k) * sck : cb, ok);
      }
    };
    // W item j of tile t: w = a[k, m]·c[o, k] for 4 consecutive k, split into its three bf16
    // pieces, stored as rows p·OT + o of W_m's k step (32-byte swizzle; o fastest over the lanes:
    // the c reads are conflict-free, the 8-byte stores at most 2-way).
    auto form_w = [&](int t, int j) {
      const int i = tid + j * NT, o = i % OT, kq = (i / OT) % (BK / 4), m = i / OT / (BK / 4);
      const float4 av = *reinterpret_cast<const float4*>(As + (t & 1) * (KM_ABUF / 4) + m * ACS + 4 * kq);
      const float4 cv = *reinterpret_cast<const float4*>(Cs + (t & 1) * (KM_CBUF / 4) + o * ACS + 4 * kq);
      const float w0 = av.x * cv.x, w1 = av.y * cv.y, w2 = av.z * cv.z, w3 = av.w * cv.w;
      const float r0 = km_rest(w0), r1 = km_rest(w1), r2 = km_rest(w2), r3 = km_rest(w3);
      const uint2 hi = make_uint2(km_top2(w0, w1), km_top2(w2, w3));
      const uint2 mid = make_uint2(km_top2(r0, r1), km_top2(r2, r3));
      const uint2 lo = make_uint2(km_top2(km_rest(r0), km_rest(r1)), km_top2(km_rest(r2), km_rest(r3)));
      unsigned char* const step = Ws + (t & 1) * KM_WBUF + m * ((BK / 16) * KM_WSTEP) + (kq >> 2) * KM_WSTEP;
      const int chunk = (kq >> 1) & 1, half = 8 * (kq & 1);
#pragma unroll
      for (int p = 0; p < 3; ++p) {
        const int row = p * OT + o;
        *reinterpret_cast<uint2*>(step + row * 32 + ((chunk ^ ((row >> 2) & 1)) << 4) + half) =
            p == 0 ? hi : p == 1 ? mid : lo;
      }
    };

    float acc[MW][NACC], sum[MW][NSUM];
    unsigned sa[MW][4];  // S of m ml + j: the wgmma A fragment, written before each wgmma reads it
#pragma unroll
    for (int j = 0; j < MW; ++j) {
#pragma unroll
      for (int e = 0; e < NACC; ++e) acc[j][e] = 0.0f;
#pragma unroll
      for (int e = 0; e < NSUM; ++e) sum[j][e] = 0.0f;
    }
    float babs = 0.0f;  // Σ|b| over the b values this thread reads: non-finite if any is
    const unsigned wdesc = km_desc_lo(wsm);

    if (ntiles > 0) {
      copy_b(0);
      copy_ac(0);
      if (ntiles > 1) copy_ac(1);
      km_cp_commit();
      km_cp_wait();
      __syncthreads();
#pragma unroll
      for (int j = 0; j < KM_ITEMS; ++j) form_w(0, j);
      km_async_fence();
      __syncthreads();
    }
    for (int t = 0; t < ntiles; ++t) {
      if (t + 1 < ntiles) copy_b(t + 1);
      if (t + 2 < ntiles) copy_ac(t + 2);
      km_cp_commit();
      const float* const bt = Bs + (t & 1) * (KM_BBUF / 4);
      // W of m ml + j, k step s: the descriptor of buffer t & 1 plus the offset in 16-byte units.
      const unsigned wt = wdesc + (unsigned)((t & 1) * (KM_WBUF >> 4) + ml * (BK / 16) * (KM_WSTEP >> 4));
#pragma unroll
      for (int s = 0; s < BK / 16; ++s) {
        // A fragment: value (row nl + 8r, k 16s + 2q + 8h + e) is element e of register r + 2h.
        float2 bv[2][2];
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            bv[r][h] = *reinterpret_cast<const float2*>(bt + (nl + 8 * r) * BS + 16 * s + 2 * q + 8 * h);
            babs += fabsf(bv[r][h].x) + fabsf(bv[r][h].y);
          }
#pragma unroll
        for (int j = 0; j < MW; ++j) {
          km_wg_wait<MW - 1>();  // the group that read sa[j] (MW groups ago) is done
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int r = 0; r < 2; ++r)
              sa[j][r + 2 * h] = km_sgn2(dv[r][j], bv[r][h].x, dv[r][j], bv[r][h].y);
          km_wg_fence();
          km_wgmma(acc[j], sa[j], wt + (unsigned)((j * (BK / 16) + s) * (KM_WSTEP >> 4)), s != 0);
          km_wg_commit();
        }
        if (t + 1 < ntiles && s < KM_ITEMS) form_w(t + 1, s);
      }
      km_wg_wait<0>();  // also frees this W buffer for tile t + 2
#pragma unroll
      for (int j = 0; j < MW; ++j) {
        km_fence_acc<NACC>(acc[j]);
        // Accumulator 4u + 2r + e: row nl + 8r, column 8u + 2q + e (piece u / (OT / 8)).
#pragma unroll
        for (int e = 0; e < NSUM; ++e) {
          const int u = e >> 2, x = e & 3;
          sum[j][e] += acc[j][4 * u + x] + (acc[j][4 * (u + OT / 8) + x] + acc[j][4 * (u + OT / 4) + x]);
        }
      }
      km_async_fence();
      km_cp_wait();
      __syncthreads();
    }
    km_wg_wait<0>();

    // Non-finite inputs: outputs whose d − b is NaN for some k are NaN (S was −1 there).
    if (__any_sync(0xffffffffu, special || !isfinite(babs))) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int n = n0 + nl + 8 * r;
        if (n >= N) continue;
        bool nan[MW];
#pragma unroll
        for (int j = 0; j < MW; ++j) nan[j] = isnan(dv[r][j]);
        for (int k = 0; k < K; ++k) {
          const float bk = bb[(long long)n * sbn + (long long)k * sbk];
#pragma unroll
          for (int j = 0; j < MW; ++j) nan[j] |= isnan(dv[r][j] - bk);
        }
#pragma unroll
        for (int j = 0; j < MW; ++j)
          if (nan[j])
#pragma unroll
            for (int e = 0; e < NSUM; ++e)
              if (((e >> 1) & 1) == r) sum[j][e] = __int_as_float(0x7fffffff);
      }
    }

    // Sum e of m j: o = o0 + 8·(e >> 2) + 2q + (e & 1), n = n0 + nl + 8·((e >> 1) & 1), m = m0 + ml + j.
    float* const ob = out + off_o;
    const int mt = m0 + ml;
#pragma unroll
    for (int e = 0; e < NSUM; ++e) {
      const int o = o0 + 8 * (e >> 2) + 2 * q + (e & 1), n = n0 + nl + 8 * ((e >> 1) & 1);
      if (o >= O || n >= N) continue;
      float v[MW];
#pragma unroll
      for (int j = 0; j < MW; ++j) v[j] = km_epilogue(sum[j][e] KM_HYPER_ACTUALS);
      float* const p = ob + (long long)o * soo + (long long)n * son + (long long)mt * som;
      if (ovec && mt + MW <= M) {
        *reinterpret_cast<float2*>(p) = make_float2(v[0], v[1]);
      } else {
#pragma unroll
        for (int j = 0; j < MW; ++j)
          if (mt + j < M) p[(long long)j * som] = v[j];
      }
    }
  }
}
