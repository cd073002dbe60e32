// The end of every pairwise kernel, after its reduction: the output value of entry (m, n), and for
// the tensor-core (x − z)² kernels the cancellation guard and the exact recomputation's term.  Reads
// KM_DIAG(m, n) and KM_HYPER_ACTUALS from the variant's configuration.  The row stores stay with each
// kernel: their shapes differ (16-byte streaming stores of converted values on the SIMT path, pairs on
// mma.sync, 16-byte groups from a shared-memory tile on wgmma).

// Output (m, n) from its reduced value: the program's epilogue (kernel function, outer power) with
// the diagonal indicator KM_DIAG(m, n).
#define KM_OUTPUT(acc, m, n) km_epilogue((acc), KM_DIAG(m, n) KM_HYPER_ACTUALS)

// d² = ‖x‖² + ‖z‖² − 2·x·z into acc (given x·z, and norms = ‖x‖² + ‖z‖²); true where d² may have
// lost its accuracy to cancellation — d² <= guard·norms, guard from kermac.kernel_facts'
// cancellation_guard — or is not finite: the caller recomputes its tile exactly from differences.
__device__ __forceinline__ bool km_cancelled(float& acc, float norms, float guard) {
  const float d2 = fmaf(-2.0f, acc, norms);
  acc = d2;
  return !(d2 > guard * norms);
}

// One term of the exact recomputation: acc + (a − b)², in fp32.
__device__ __forceinline__ float km_add_sq(float acc, float a, float b) {
  const float d = a - b;
  return fmaf(d, d, acc);
}
