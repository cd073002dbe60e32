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
#include "simt_terms.cuh"

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
#include "simt_setup.cuh"
#include "simt_mainloop.cuh"
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
