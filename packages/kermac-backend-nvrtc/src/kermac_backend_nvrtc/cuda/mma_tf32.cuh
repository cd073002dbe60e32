// TF32 tensor-core helpers of the 3×TF32 kernels (float32 only): rounding to TF32, the hi/lo split
// a ≈ hi + lo, and one mma.sync m16n8k8 step (fragment layouts in the PTX ISA).
// fp32 → TF32 bits, rounded to nearest (ties away), low 13 bits cleared.
__device__ __forceinline__ unsigned km_tf32(float a) { return (__float_as_uint(a) + 0x1000u) & 0xffffe000u; }
__device__ __forceinline__ void km_split(float a, unsigned& hi, unsigned& lo) {
  hi = km_tf32(a);
  lo = km_tf32(a - __uint_as_float(hi));
}
// c += a·b on one m16n8k8 tile (A row-major 16×8, B column-major 8×8, fp32 accumulators).
__device__ __forceinline__ void km_mma(float* c, const unsigned* a, unsigned b0, unsigned b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// d = a·b (zero accumulator input).
__device__ __forceinline__ void km_mma0(float* d, const unsigned* a, unsigned b0, unsigned b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
}
