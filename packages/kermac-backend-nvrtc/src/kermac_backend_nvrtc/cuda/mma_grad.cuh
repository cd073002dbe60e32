// The gradient contraction on tensor cores (float32, 3×TF32).  For a fixed n it is a matrix product
// over k: out[o, n, m] = Σ_k B'[m, k]·c[o, k] with B'[m, k] = a[k, m]·multiply(d[n, m], b[n, k]), so
// B' is formed in registers directly in the layout of an mma.sync m16n8k8 TF32 A fragment (16 m × 8 k)
// and multiplied with c (B fragment: 8 k × 8 o); m is the mma's M dimension and o its N dimension, so
// O <= 8 costs one mma per fragment and 9 <= O <= 16 two.
//
// Accuracy: c is split once, when its tile is stored to shared memory, into c_hi = rna_tf32(c) and
// c_lo = rna_tf32(c − c_hi); every B' value into v_hi = v with its low 13 bits cleared (TF32 by
// truncation, one instruction) and v_lo = v − v_hi (exact), and c·v ≈ v_lo·c_hi + v_hi·c_lo + v_hi·c_hi.
// Each term misses at most about 2^-20·|c·v| plus 2^-21·|c·v| (the dropped v_lo·c_lo).  The tensor
// cores truncate their fp32 sums (a bias that grows with the number of additions), so the mma
// accumulators hold the products of KG 8-wide k steps only and fp32 registers add those partial sums
// with round-to-nearest.  A B' value of ±inf gives NaN (inf − inf in the split).
//
// Block: 8 warps of WN n × WM·16 m pairs; d of the warp's pairs stays in registers; a, b and the split
// c are staged through shared memory in k tiles of BK (double buffer: a and b copied with cp.async
// where their layout allows, c through registers to split it), rows padded so the fragment loads hit
// 32 distinct banks.  Blocks are ordered n-tile fastest, so concurrently running blocks share their
// slice of a (the largest operand) in L2.  Reads the functors km_multiply and km_epilogue.
#define OT (OT8 * 8)
static_assert(BK % (8 * KG) == 0, "k tiles hold whole groups of 8-wide k steps");

extern "C" __global__ void __launch_bounds__(NT, KM_MIN_BLOCKS)
kermac_grad(KM_PARAMS) {
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
#include "grad_prologue.cuh"
    // d of the warp's pairs: n = n0 + wn·WN + i, m = m0 + (wm·WM + j)·16 + g + 8h (A fragment rows).
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
    KmTile<float, NT, BMM, BK, AS, KM_A_MODE, KM_A_VEC> at;
    KmTile<float, NT, BNN, BK, BS, KM_B_MODE, KM_B_VEC> bt;
    KmTile<float, NT, OT8 * 8, BK, CS, KM_C_MODE, KM_C_VEC> ct;
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
#pragma unroll KM_K_UNROLL
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
                const float v = av[s][e] * km_multiply(dv[i][j][e & 1], bv[s][e >> 1][i] KM_HYPER_ACTUALS);
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
                  km_epilogue(acc[i][j][u][e] KM_HYPER_ACTUALS);
          }
        }
    }
  }
}
