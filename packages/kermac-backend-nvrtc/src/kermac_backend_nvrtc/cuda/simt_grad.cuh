// The SIMT gradient kernel, for every gradient program: out[o, n, m] = epilogue(acc) with
// acc = REDUCE_k accumulate(c[o, k], term), term = term(a[k, m], b[n, k], d[n, m]), starting from the
// reduction's identity KM_IDENTITY (the value of K = 0).  The product form renders term = a·multiply(d, b)
// and accumulate = the FMA c·term + acc; the general form its multiply and the reduction's combine of the
// value so far with its accumulate.  Tiles (n, m) like the pairwise kernel and keeps all OT outputs of a
// pair in registers: per (n, m, k) it evaluates the term once and accumulates it into the OT outputs.
// Reads the functors km_term, km_accumulate and km_epilogue.
extern "C" __global__ void __launch_bounds__(NT, KM_MIN_BLOCKS)
kermac_grad(KM_PARAMS) {
  __shared__ __align__(16) km_t As[2][BK][BMM + SPAD];
  __shared__ __align__(16) km_t Bs[2][BK][BNN + SPAD];
  __shared__ __align__(16) km_t Cs[2][BK][OT];
  const int tid = threadIdx.x;
  const int tx = tid % 16, ty = tid / 16;
  const int m0 = (blockIdx.x % tiles_m) * BMM;
  const int n0 = (blockIdx.x / tiles_m) * BNN;
#include "grad_prologue.cuh"
    km_t dv[TPN][TPM];
#pragma unroll
    for (int i = 0; i < TPN; ++i)
#pragma unroll
      for (int j = 0; j < TPM; ++j) {
        const int n = n0 + ty * TPN + i, m = m0 + tx * TPM + j;
        dv[i][j] = (n < N && m < M) ? km_cvt(d[off_d + (long long)n * sdn + (long long)m * sdm], km_t(0)) : km_t(0);
      }
    const km_in_t* ab = a + off_a + (long long)m0 * sam;
    const km_in_t* bb = b + off_b + (long long)n0 * sbn;
    const km_in_t* cb = c + off_c + (long long)o0 * sco;
    KmTile<km_in_t, NT, BMM, BK, BMM + SPAD, KM_A_MODE, KM_A_VEC> at;
    KmTile<km_in_t, NT, BNN, BK, BNN + SPAD, KM_B_MODE, KM_B_VEC> bt;
    KmTile<km_in_t, NT, OT, BK, OT, KM_C_MODE, KM_C_VEC> ct;
    km_t acc[OT][TPN][TPM];
#pragma unroll
    for (int o = 0; o < OT; ++o)
#pragma unroll
      for (int i = 0; i < TPN; ++i)
#pragma unroll
        for (int j = 0; j < TPM; ++j) acc[o][i][j] = KM_IDENTITY;

    if (ntiles > 0) {
      at.load(ab, sam, sak, M - m0, 0, K);
      bt.load(bb, sbn, sbk, N - n0, 0, K);
      ct.load(cb, sco, sck, O - o0, 0, K);
      at.store(As[0]);
      bt.store(Bs[0]);
      ct.store(Cs[0]);
      __syncthreads();
    }
    for (int t = 0; t < ntiles; ++t) {
      const int cur = t & 1;
      if (t + 1 < ntiles) {
        at.load(ab, sam, sak, M - m0, (t + 1) * BK, K);
        bt.load(bb, sbn, sbk, N - n0, (t + 1) * BK, K);
        ct.load(cb, sco, sck, O - o0, (t + 1) * BK, K);
      }
      const int kcount = min(BK, K - t * BK);
#define KM_STEP(kk)                                                               \
      {                                                                           \
        km_t ar[TPM], br[TPN], cr[OT];                                            \
        km_lds<TPM>(&As[cur][kk][tx * TPM], ar);                                  \
        km_lds<TPN>(&Bs[cur][kk][ty * TPN], br);                                  \
        _Pragma("unroll") for (int o = 0; o < OT; o += (OT < 4 ? OT : 4))         \
          km_lds<(OT < 4 ? OT : 4)>(&Cs[cur][kk][o], cr + o);                     \
        _Pragma("unroll") for (int i = 0; i < TPN; ++i)                           \
        _Pragma("unroll") for (int j = 0; j < TPM; ++j) {                         \
          const km_t v = km_term(ar[j], br[i], dv[i][j] KM_HYPER_ACTUALS);        \
          _Pragma("unroll") for (int o = 0; o < OT; ++o)                          \
            acc[o][i][j] = km_accumulate(acc[o][i][j], cr[o], v KM_HYPER_ACTUALS); \
        }                                                                         \
      }
      if (kcount == BK) {
#pragma unroll KM_K_UNROLL
        for (int kk = 0; kk < BK; ++kk) KM_STEP(kk)
      } else {
        for (int kk = 0; kk < kcount; ++kk) KM_STEP(kk)
      }
#undef KM_STEP
      if (t + 1 < ntiles) {
        at.store(As[cur ^ 1]);
        bt.store(Bs[cur ^ 1]);
        ct.store(Cs[cur ^ 1]);
      }
      __syncthreads();
    }

    km_in_t* ob = out + off_o;
#pragma unroll
    for (int o = 0; o < OT; ++o) {
      if (o0 + o >= O) break;
#pragma unroll
      for (int i = 0; i < TPN; ++i) {
        const int n = n0 + ty * TPN + i;
        if (n >= N) continue;
#pragma unroll
        for (int j = 0; j < TPM; ++j) {
          const int m = m0 + tx * TPM + j;
          if (m < M)
            km_store(ob + (long long)(o0 + o) * soo + (long long)n * son + (long long)m * som,
                     km_epilogue(acc[o][i][j] KM_HYPER_ACTUALS));
        }
      }
    }
  }
}
