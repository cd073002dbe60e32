// |a|^b without the special-function unit's ex2, for the split SIMT pairwise kernels (float32; b
// finite, >= 1).  Needs from the generated variant header: KM_SPLIT_LG2 (km_lg2_ftz where subnormals
// may be flushed, else km_lg2) and KM_EXP2_POLY(r), 2^r on [-0.5, 0.5] as a Horner polynomial.
//
// km_powabs_split: l = max(lg2 a, lmin) stays on the special-function unit (lmin = -126/b: a = 0,
// whose lg2 is -inf, gives 2^-126); y = b·l = j + r with j = round(y) from the 1.5·2^23 magic add
// (fused into the FMA) and r in [-0.5, 0.5]; 2^r by a degree-4 minimax polynomial (relative error
// 2.7e-6, mean 4e-8); j is added to the result's exponent bits: FMA/ALU-pipe instructions instead of
// a FMUL and a MUFU.EX2.  Valid for b·log2 a <= 125 (no inf or NaN): the kernel guarantees that by
// checking every staged input (km_beyond) and taking the MUFU path for a tile that fails.
__device__ __forceinline__ float km_powabs_split(float a, float b, float lmin) {
  const float l = fmaxf(KM_SPLIT_LG2(a), lmin);
  const float t = fmaf(b, l, 12582912.0f);            // 1.5·2^23 + j: j in the low mantissa bits
  const float r = fmaf(b, l, 12582912.0f - t);        // y − j, exact to one rounding
  const float q = KM_EXP2_POLY(r);
  return __int_as_float((__float_as_int(t) << 23) + __float_as_int(q));  // q·2^j (j >= −126: no wrap)
}
// |t|^b from a table and a polynomial (pow_table.py): T[e] = 2^((e − 127)·b) for t's biased exponent
// e (0 for zero, subnormal t and values below 2^-126), times m^b for t's mantissa m in [1, 2), by the
// degree-N interpolant with coefficients c[0..N] (kernel arguments) in m itself.  One LOP3 makes ±m
// from t's bits (the exponent field XOR-ed with itself and with 1.0's) and the FFMAs read it as
// |±m|: with the difference, the exponent mask, its shift, the table load and N + 1 FFMA, N + 6 issue
// slots and no MUFU.  Valid while |t|^b stays finite: the kernel's km_beyond check guarantees it.
template <int N>
__device__ __forceinline__ float km_powabs_table(float t, const float* tab, const float (&c)[N + 1]) {
  const unsigned bits = __float_as_uint(t);
  const unsigned e = bits & 0x7f800000u;
  const float s = *(const float*)((const char*)tab + (e >> 21));
  unsigned sm;  // bits ^ e ^ 0x3f800000: t's sign and mantissa, the exponent of 1.0
  asm("lop3.b32 %0, %1, %2, 0x3f800000, 0x96;" : "=r"(sm) : "r"(bits), "r"(e));
  const float m = fabsf(__uint_as_float(sm));
  float q = c[N];
#pragma unroll
  for (int j = N - 1; j >= 0; --j) q = fmaf(q, m, c[j]);
  return s * q;
}
// Whether a staged operand tile (KmTile registers) holds a value with !(|v| <= lim): large, inf or NaN.
template <typename Tile>
__device__ __forceinline__ bool km_beyond(const Tile& tile, float lim) {
  bool out = false;
#pragma unroll
  for (int i = 0; i < (int)(sizeof(tile.r.v) / sizeof(tile.r.v[0])); ++i)
    out |= !(fabsf(km_cvt(tile.r.v[i], 0.0f)) <= lim);
  return out;
}
