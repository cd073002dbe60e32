// The register-tiled SIMT pairwise kernel: a block computes BM × BN outputs with its NT = 256 threads,
// looping over k in BK steps with double-buffered shared memory.  Thread layout: TN threads along n,
// NT / TN along m; a thread owns GM groups of VM rows (BM / GM apart) and GN groups of VN columns (BN /
// GN apart), each group one 16-byte shared load per k.  Reads the functors km_inner, km_reduce and
// km_epilogue, and these variants of the configuration:
// - split powers (KM_SPLIT_PAIRS > 0, only for a float sum of |x − z|^b with b >= 1; pow_split.cuh):
//   KM_SPLIT_PAIRS of a thread's pairs take |x − z|^b without the MUFU's ex2 (a polynomial, or with
//   KM_POW_TABLE a table of 2^(e·b) times a polynomial of degree KM_POW_DEGREE), the others on the MUFU;
// - the padded tail (KM_PADDED_TAIL: not split, inner(0, 0) the reduction's identity): every k tile, the
//   partial one too, runs the unrolled loop; its features past D are staged as zeros in both operands,
//   so their terms are the identity.  The next tile's loads go after KM_LOADS_AFTER of its BK steps (in
//   a 16-deep tile, a shorter life for the staging registers);
// - the k-contiguous loop (KM_K_CONTIGUOUS, kcontig_loop.cuh).
#include "pairwise_epilogue.cuh"
// Pair q of the thread's P = GM·VM·GN·VN is split iff floor((q + 1)·n / P) > floor(q·n / P): n of them, spread evenly.
#define KM_IS_SPLIT(q, n) (((q) + 1) * (n) / (GM * VM * GN * VN) > (q) * (n) / (GM * VM * GN * VN))
#if KM_SPLIT_PAIRS > 0 && KM_POW_TABLE
#define KM_SPLIT_TERM(x, z) km_powabs_table<KM_POW_DEGREE>((x) - (z), km_ptab, km_pc)
#elif KM_SPLIT_PAIRS > 0
#define KM_SPLIT_TERM(x, z) km_powabs_split(km_abs((x) - (z)), km_pb, km_plmin)
#else
#define KM_SPLIT_TERM(x, z) km_t(0)
#endif

// k-contiguous kernels (KM_K_CONTIGUOUS, kcontig_loop.cuh): tiles keep each row's BK k-values together.
#define KM_KROW (BK + 4)

extern "C" __global__ void __launch_bounds__(NT, KM_MIN_BLOCKS)
kermac_pairwise(KM_PARAMS) {
#if KM_K_CONTIGUOUS
  __shared__ __align__(16) km_t Xs[2][BM * KM_KROW];
  __shared__ __align__(16) km_t Zs[2][BN * KM_KROW];
#else
  __shared__ __align__(16) km_t Xs[2][BK][BM + SPAD];
  __shared__ __align__(16) km_t Zs[2][BK][BN + SPAD];
#endif
  const int tid = threadIdx.x;
  const int tx = tid % TN, ty = tid / TN;
#include "pairwise_prologue.cuh"
#if KM_SPLIT_PAIRS > 0
    const km_t km_pb = KM_SPLIT_EXPONENT;                      // the exponent b of |x − z|^b
    const km_t km_plmin = km_t(-126) / km_pb;                  // lg2 clamp: b·lmin = −126
    const km_t km_plim = km_ex2(km_t(125) / km_pb - km_t(1));  // |x|, |z| <= lim: b·log2|x − z| <= 125
    // A tile holding an input beyond lim (or inf, NaN) runs all pairs on the MUFU: km_fallback.
#if KM_POW_TABLE
    // Table pairs: T[e] = 2^((e − 127)·b), thread tid fills entry tid (NT = 256); 0 below 2^-126.
    __shared__ float km_ptab[256];
    {
      const double eb = (double)(tid - 127) * (double)km_pb;
      km_ptab[tid] = (tid == 0 || eb < -126.0) ? 0.0f : (float)exp2(eb);
    }
    const float km_pc[KM_POW_DEGREE + 1] = {KM_POW_COEFFS};  // m^b ≈ Σ km_pc[j]·m^j
#endif
#define KM_SYNC(next) km_fallback = __syncthreads_or((next) && (km_beyond(xt, km_plim) || km_beyond(zt, km_plim)))
#else
#define KM_SYNC(next) __syncthreads()
#endif
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
#undef KM_SYNC

    // Each thread's row holds GN groups of VN consecutive columns: one 16-byte store per group
    // where ovec says the output allows it (unit column stride, 16-byte aligned rows), else scalars.
    km_in_t* ob = out + off_o;
#pragma unroll
    for (int i = 0; i < GM * VM; ++i) {
      const int m = m0 + (i / VM) * (BM / GM) + ty * VM + i % VM;
      if (m >= M) continue;
      km_in_t* row = ob + (long long)m * som;
#pragma unroll
      for (int g = 0; g < GN; ++g) {
        const int nb = n0 + g * (BN / GN) + tx * VN;
        km_t v[VN];
#pragma unroll
        for (int j = 0; j < VN; ++j) {
          // The diagonal before the sum, not inside KM_OUTPUT: the order this kernel's code was tuned in.
          const km_t diag = KM_DIAG(m, nb + j);
#if KM_SPLIT_PAIRS > 0
          // Split terms are at least about 2^-126 (lmin, |x − z| = 0 included): a sum below
          // D·2^-125 has only terms below the float32 normal range and is 0, as each is with ftz.
          const km_t a = acc[i][g * VN + j];
          const km_t sum = a < km_t(D) * km_t(2.350988701644575e-38) ? km_t(0) : a;
#else
          const km_t sum = acc[i][g * VN + j];
#endif
          v[j] = km_epilogue(sum, diag KM_HYPER_ACTUALS);
        }
        if (sizeof(km_in_t) * VN == 16 && ovec && nb + VN <= N) {
          km_store16(row + nb, v);
        } else if (KM_K_CONTIGUOUS && ovec) {  // unit column stride: no 64-bit product per element
#pragma unroll
          for (int j = 0; j < VN; ++j)
            if (nb + j < N) km_store(row + nb + j, v[j]);
        } else {
#pragma unroll
          for (int j = 0; j < VN; ++j)
            if (nb + j < N) km_store(row + (long long)(nb + j) * son, v[j]);
        }
      }
    }
  }
}
