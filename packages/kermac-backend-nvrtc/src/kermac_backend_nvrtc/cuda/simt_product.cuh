// The fused kernel product out[m, c] = Σ_n K[m, n] · v[n, c] on the SIMT pairwise tile, K never stored.
// A block owns BM rows of out and CC of its columns (c0 on): it loops over N in BN-wide tiles, computes
// each BM × BN tile of K with the pairwise main loop (simt_mainloop.cuh) and the pairwise epilogue
// (KM_OUTPUT: kernel function, diagonal), and contracts it at once with the tile of v staged k-major in
// shared memory (Vs[c][n], loaded by KmTile as the operand tiles are, with rows past N and columns past C
// as zeros).  Thread (ty, tx) keeps part[i][c] = Σ over its own columns n of K[m_i, n] · v[n, c] across
// all tiles; the TN threads of a row group (consecutive lanes of one warp) add theirs by shuffles at the
// end, and each stores some of the CC columns.  Columns of K past N are 0 before they meet v (a K entry
// there is computed from z's zero padding and may be inf or NaN, which v's zero would turn into NaN);
// rows past M are computed but never stored.  Reads the functors km_inner, km_reduce and km_epilogue and
// the pairwise configuration, plus CC and v's load (KM_V_MODE, KM_V_VEC).
#include "pairwise_epilogue.cuh"
#include "simt_terms.cuh"

extern "C" __global__ void __launch_bounds__(NT, KM_MIN_BLOCKS)
kermac_product(KM_PARAMS) {
  __shared__ __align__(16) km_t Xs[2][BK][BM + SPAD];
  __shared__ __align__(16) km_t Zs[2][BK][BN + SPAD];
  __shared__ __align__(16) km_t Vs[CC][BN + SPAD];
  const int tid = threadIdx.x;
  const int tx = tid % TN, ty = tid / TN;
  const int m0 = (blockIdx.x % tiles_m) * BM;
  const int c0 = (blockIdx.x / tiles_m) * CC;
  const int ntiles = (D + BK - 1) / BK;
  {
    const long long bidx = zbase + blockIdx.z;  // batch entry (the host splits batches over 65535)
    KM_BATCH_OFFSETS
    KM_HYPER_LOADS
#include "simt_setup.cuh"
    const km_in_t* vb = v + off_v + (long long)c0 * svc;
    KmTile<km_in_t, NT, BN, CC, BN + SPAD, KM_V_MODE, KM_V_VEC> vt;
    km_t part[GM * VM][CC];
#pragma unroll
    for (int i = 0; i < GM * VM; ++i)
#pragma unroll
      for (int c = 0; c < CC; ++c) part[i][c] = km_t(0);

    for (int n0 = 0; n0 < N; n0 += BN) {
      // v's tile goes to registers first: its global loads overlap the K tile's main loop.
      vt.load(vb + (long long)n0 * svn, svn, svc, N - n0, 0, C - c0);
#include "simt_mainloop.cuh"
      // With D = 0 the main loop has no barrier: the previous tile's contraction may still read Vs.
      if (ntiles == 0) __syncthreads();
      vt.store(Vs);
      __syncthreads();
#pragma unroll
      for (int g = 0; g < GN; ++g) {
        const int nb = n0 + g * (BN / GN) + tx * VN;
#pragma unroll
        for (int i = 0; i < GM * VM; ++i) {
          const int m = m0 + (i / VM) * (BM / GM) + ty * VM + i % VM;
#pragma unroll
          for (int j = 0; j < VN; ++j)
            acc[i][g * VN + j] = nb + j < N ? KM_OUTPUT(acc[i][g * VN + j], m, nb + j) : km_t(0);
        }
#pragma unroll
        for (int c = 0; c < CC; ++c) {
          km_t vr[VN];
          km_lds<VN>(&Vs[c][g * (BN / GN) + tx * VN], vr);
#pragma unroll
          for (int i = 0; i < GM * VM; ++i)
#pragma unroll
            for (int j = 0; j < VN; ++j) part[i][c] = km_fma(acc[i][g * VN + j], vr[j], part[i][c]);
        }
      }
    }
#undef KM_SYNC

    // The TN threads of a row group are TN consecutive lanes: a butterfly leaves every one with the sum.
#pragma unroll
    for (int i = 0; i < GM * VM; ++i)
#pragma unroll
      for (int c = 0; c < CC; ++c)
#pragma unroll
        for (int lanes = TN / 2; lanes > 0; lanes /= 2) part[i][c] += __shfl_xor_sync(0xffffffffu, part[i][c], lanes);
    km_in_t* ob = out + off_o;
#pragma unroll
    for (int i = 0; i < GM * VM; ++i) {
      const int m = m0 + (i / VM) * (BM / GM) + ty * VM + i % VM;
      if (m >= M) continue;
      km_in_t* row = ob + (long long)m * som;
#pragma unroll
      for (int c = 0; c < CC; ++c)
        if (c % TN == tx && c0 + c < C) km_store(row + (long long)(c0 + c) * soc, part[i][c]);
    }
  }
}
