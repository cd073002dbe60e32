// Helpers of the sign-product gradient (sign_grad.cuh): its B-operand descriptor, the bf16x2 signs
// and the exact three-way bf16 split of W.
// Descriptor of a K-major bf16 wgmma B operand at shared address a: 32-byte swizzle (mode 3 in
// bits 62-63), 8-row groups 256 bytes apart (stride offset 256 >> 4 in bits 32-45), leading offset
// unused (1; one swizzle row holds the instruction's 16 k), start address >> 4 in bits 0-13.  The
// low word is linear in a (shared addresses stay below 2^18), the high word fixed.
#define KM_DESC_HI 0xC0000010u
__device__ __forceinline__ unsigned km_desc_lo(unsigned a) { return ((a & 0x3FFFFu) >> 4) | (1u << 16); }
// (sgn(t) + 1) / 2 for |t| ≥ 2^-126 or t = 0: sat(t·2^126 + 1/2) ∈ {0, 1/2, 1}; t below 2^-126 is
// flushed to 0 (ftz), NaN gives 0.
__device__ __forceinline__ float km_half_sign(float t) {
  float u;
  asm("fma.rn.ftz.sat.f32 %0, %1, 0f7E800000, 0f3F000000;" : "=f"(u) : "f"(t));
  return u;
}
// bf16x2 of (sgn(d0 − b0), sgn(d1 − b1)), the first in the low half: 2u − 1 of the packed halves.
__device__ __forceinline__ unsigned km_sgn2(float d0, float b0, float d1, float b1) {
  unsigned u, r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(u) : "f"(km_half_sign(d1 - b1)), "f"(km_half_sign(d0 - b0)));
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(u), "r"(0x40004000u), "r"(0xBF80BF80u));
  return r;
}
// The top 16 bits of x (low half) and y (high half): their bf16 truncations.
__device__ __forceinline__ unsigned km_top2(float x, float y) {
  return __byte_perm(__float_as_uint(x), __float_as_uint(y), 0x7632);
}
__device__ __forceinline__ float km_rest(float x) { return x - __uint_as_float(__float_as_uint(x) & 0xFFFF0000u); }
