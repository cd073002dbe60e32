// Scalar helpers every kernel uses (reads the compute type km_t): input types (km_f16 / km_bf16 wrap
// 16-bit storage, so no cuda_fp16.h is needed), conversions and stores, the IR operations with the
// semantics of kermac.ir (NaN-propagating min/max, sign(0) = 0, comparisons giving 1.0 or 0.0) and
// fast powers |a|^b (ex2.approx(b·lg2.approx(a)) in float32, optionally flushing subnormals, which
// saves the denormal fix-up instructions; products and a square root for exponents N/2).
struct km_f16 { unsigned short v; };
struct km_bf16 { unsigned short v; };

__device__ __forceinline__ float km_cvt(float a, float) { return a; }
__device__ __forceinline__ double km_cvt(double a, double) { return a; }
__device__ __forceinline__ float km_cvt(double a, float) { return (float)a; }
__device__ __forceinline__ double km_cvt(float a, double) { return (double)a; }
__device__ __forceinline__ float km_cvt(km_f16 a, float) {
  float r; asm("{ .reg .b16 h; mov.b16 h, %1; cvt.f32.f16 %0, h; }" : "=f"(r) : "h"(a.v)); return r; }
__device__ __forceinline__ double km_cvt(km_f16 a, double) { return (double)km_cvt(a, 0.0f); }
__device__ __forceinline__ float km_cvt(km_bf16 a, float) { return __int_as_float(((int)a.v) << 16); }
__device__ __forceinline__ double km_cvt(km_bf16 a, double) { return (double)km_cvt(a, 0.0f); }
__device__ __forceinline__ void km_store(float* p, float a) { *p = a; }
__device__ __forceinline__ void km_store(double* p, float a) { *p = (double)a; }
__device__ __forceinline__ void km_store(float* p, double a) { *p = (float)a; }
__device__ __forceinline__ void km_store(double* p, double a) { *p = a; }
__device__ __forceinline__ void km_store(km_f16* p, float a) {
  unsigned short r; asm("{ .reg .b16 h; cvt.rn.f16.f32 h, %1; mov.b16 %0, h; }" : "=h"(r) : "f"(a)); p->v = r; }
__device__ __forceinline__ void km_store(km_bf16* p, float a) {
  unsigned short r; asm("{ .reg .b16 h; cvt.rn.bf16.f32 h, %1; mov.b16 %0, h; }" : "=h"(r) : "f"(a)); p->v = r; }
// V consecutive outputs at p (16-byte aligned) as one streaming 16-byte store (st.global.cs: evict
// first, the output is not re-read); only called where V values of the type fill 16 bytes.
__device__ __forceinline__ void km_store16(float* p, const float* v) {
  asm volatile("st.global.cs.v4.f32 [%0], {%1, %2, %3, %4};" :: "l"(p), "f"(v[0]), "f"(v[1]), "f"(v[2]), "f"(v[3]) : "memory"); }
__device__ __forceinline__ void km_store16(double* p, const double* v) {
  asm volatile("st.global.cs.v2.f64 [%0], {%1, %2};" :: "l"(p), "d"(v[0]), "d"(v[1]) : "memory"); }
template <typename T> __device__ __forceinline__ void km_store16(T*, const km_t*) {}

__device__ __forceinline__ float km_inf(float) { return __int_as_float(0x7f800000); }
__device__ __forceinline__ double km_inf(double) { return __longlong_as_double(0x7ff0000000000000LL); }
__device__ __forceinline__ float km_nan(float) { return __int_as_float(0x7fffffff); }
__device__ __forceinline__ double km_nan(double) { return __longlong_as_double(0x7fffffffffffffffLL); }

__device__ __forceinline__ float km_fma(float a, float b, float c) { return fmaf(a, b, c); }
__device__ __forceinline__ double km_fma(double a, double b, double c) { return fma(a, b, c); }
__device__ __forceinline__ float km_abs(float a) { return fabsf(a); }
__device__ __forceinline__ double km_abs(double a) { return fabs(a); }
__device__ __forceinline__ float km_sqrt(float a) { return sqrtf(a); }
__device__ __forceinline__ double km_sqrt(double a) { return sqrt(a); }
__device__ __forceinline__ float km_exp(float a) { return expf(a); }
__device__ __forceinline__ double km_exp(double a) { return exp(a); }
__device__ __forceinline__ float km_log(float a) { return logf(a); }
__device__ __forceinline__ double km_log(double a) { return log(a); }
// IEEE pow is long code: one out-of-line copy keeps unrolled epilogues small (and compiles fast).
__device__ __noinline__ float km_pow(float a, float b) { return powf(a, b); }
__device__ __noinline__ double km_pow(double a, double b) { return pow(a, b); }
// a / b for a divisor b that is the same for every output (built from hyperparameters and
// constants), correctly rounded like a / b but without its per-output reciprocal and slow-path
// branch: km_recip(b) depends on b only, so the inlined copies share one evaluation.  b is scaled by
// s (a power of two) into [2^-126, 2^126], where 1/b is normal; q = a·r, and one Markstein step
// q + r·(a − q·b) (the remainder is exact with fma) gives RN(a/b), which s scales back exactly.
// Within one ulp instead where the remainder underflows (|a| < 2^-102), for subnormal quotients and
// within an ulp of overflow.  A NaN step means a or b is 0, ±inf or NaN, where q = a·(1/b) is
// already the IEEE quotient.
struct km_recip_t { float b, r, s; };
__device__ __forceinline__ km_recip_t km_recip(float b) {
  const float m = fabsf(b);
  const float s = m < 1.17549435e-38f ? 18446744073709551616.0f : m > 8.50705917e37f ? 5.42101086e-20f : 1.0f;
  const float bs = b * s;
  return {bs, 1.0f / bs, s};
}
__device__ __forceinline__ float km_div_inv(float a, float b) {
  const km_recip_t d = km_recip(b);
  const float q = a * d.r;
  const float q2 = fmaf(fmaf(-q, d.b, a), d.r, q);
  return (q2 == q2 ? q2 : q) * d.s;
}
__device__ __forceinline__ double km_div_inv(double a, double b) { return a / b; }
// exp(a / b) for a divisor b that is the same for every output (a kernel's bandwidth term):
// ex2(a·f·s), f = log2(e)/b (for b scaled by s as in km_recip) rounded once per thread (a Markstein
// step on log2(e) split in two floats), so a value costs two products and one ex2 instead of a
// correctly rounded quotient and expf's range reduction.  Accuracy: the exponent carries two
// roundings, so the result is within about 2 + 2·|a/b| ulp of exp(a/b) (__expf: 2 + 1.2·|a/b|).
// A NaN step means b is 0 or ±inf, where f = log2(e)·(1/b) is already exact (±inf or ±0).
__device__ __forceinline__ float km_exp_div(float a, float b) {
  const km_recip_t d = km_recip(b);
  const float q = 1.44269502f * d.r;
  const float f = fmaf(fmaf(-q, d.b, 1.44269502f) + 1.92596303e-08f, d.r, q);
  float r; asm("ex2.approx.f32 %0, %1;" : "=f"(r) : "f"(a * (f == f ? f : q) * d.s)); return r;
}
__device__ __forceinline__ double km_exp_div(double a, double b) { return exp(a / b); }
// min / max with NaN propagation (torch.minimum / torch.maximum).
__device__ __forceinline__ float km_max(float a, float b) { float r; asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r; }
__device__ __forceinline__ float km_min(float a, float b) { float r; asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r; }
__device__ __forceinline__ double km_max(double a, double b) { return (a > b || a != a) ? a : b; }
__device__ __forceinline__ double km_min(double a, double b) { return (a < b || a != a) ? a : b; }
// sign: -1, +0 or 1 as torch.sign (sign(-0) = +0); NaN stays NaN (|a| > 0 is false for ±0 and NaN,
// which give |a|: +0, or NaN; the absolute value is an operand modifier, no instruction).
__device__ __forceinline__ float km_sign(float a) { return fabsf(a) > 0.0f ? copysignf(1.0f, a) : fabsf(a); }
__device__ __forceinline__ double km_sign(double a) { return fabs(a) > 0.0 ? copysign(1.0, a) : fabs(a); }
// |a|^b for a >= 0 (the IR's pow(abs(.), b)): IEEE pow, as torch.pow.
__device__ __forceinline__ float km_ex2(float a) { float r; asm("ex2.approx.f32 %0, %1;" : "=f"(r) : "f"(a)); return r; }
__device__ __forceinline__ float km_lg2(float a) { float r; asm("lg2.approx.f32 %0, %1;" : "=f"(r) : "f"(a)); return r; }
// Both sides are computed and then selected: a conditional around the asm would become a branch.
// pow(a, 0) = pow(1, b) = 1 also where ex2(b·lg2 a) is NaN: a NaN a, a NaN b, and 1^±inf (inf·0).
__device__ __forceinline__ float km_powabs(float a, float b) { const float r = km_ex2(b * km_lg2(a)); return b == 0.0f || a == 1.0f ? 1.0f : r; }
__device__ __forceinline__ double km_powabs(double a, double b) { return pow(a, b); }
// a^b for a base the program proves >= +0 or NaN (kermac.programs.nonnegative: the root of a sum of
// |x − z|^p, a power of an exponential), once per output: 2^y, y = b·log2 a, on the special-function unit
// with log2 a split as E + lg2(m), a = 2^E·m, m in [√½, √2) (subnormal a scaled by 2^24 first), so lg2.approx
// sees |lg2 m| <= ½ and E is exact; the rounding errors of b·E, b·lg2 m and their sum (fma and two-sum,
// exact) are carried into the result as r·(1 + err·ln 2).  What remains is lg2's and ex2's own error, about
// 1 ulp + |b|·ln 2·2^-22: within 3.5 + 1.5|b| ulp, 5 for the roots of distances (|b| <= 1), where a
// single-float log2 a loses up to 2^-17 at |log2 a| near 128 (30 ulp after the power).  IEEE powf is a long
// out-of-line call.  2^y is 2^(y − s)·2^s, s = ±64 where |y| >= 64, so the corrected value stays normal and
// one rounding scales it (results near the largest float and subnormal ones keep their precision).
// a = 0, inf, NaN and a non-finite b take 2^(b·lg2 a) whole, which gives pow's special values; no
// correction where y − s is infinite or NaN (inf·0 would make NaN).  pow(a, 0) = pow(1, b) = 1, pow(a, 1) = a.
__device__ __forceinline__ float km_pow_nonneg(float a, float b) {
  const bool plain = !(a > 0.0f && a < km_inf(a) && fabsf(b) < km_inf(b));
  const bool subnormal = a < 1.17549435e-38f;
  const unsigned bits = __float_as_uint(subnormal ? a * 16777216.0f : a);
  const int e = (int)(bits - 0x3f3504f3u) >> 23;  // arithmetic shift: the exponent of m in [√½, √2)
  const float m = plain ? a : __uint_as_float(bits - ((unsigned)e << 23));
  const float fe = plain ? 0.0f : (float)(subnormal ? e - 24 : e);
  const float lm = km_lg2(m);
  const float ye = plain ? 0.0f : __fmul_rn(b, fe), yl = __fmul_rn(b, lm);  // not inf·0
  const float y = __fadd_rn(ye, yl);
  const float err = __fadd_rn(__fadd_rn(fmaf(b, fe, -ye), fmaf(b, lm, -yl)), __fadd_rn(__fsub_rn(ye, y), yl));
  const float s = fabsf(y) >= 64.0f ? copysignf(64.0f, y) : 0.0f;
  const float t = y - s;  // exact (Sterbenz)
  const float r = km_ex2(t);
  const float q = fabsf(t) < 128.0f ? fmaf(r, __fmul_rn(err, 0.693147181f), r) : r;
  const float scaled = q * (s > 0.0f ? 18446744073709551616.0f : s < 0.0f ? 5.42101086e-20f : 1.0f);
  return b == 0.0f || a == 1.0f ? 1.0f : b == 1.0f ? a : scaled;
}
__device__ __forceinline__ double km_pow_nonneg(double a, double b) { return pow(a, b); }
// |a|^b when b is known finite and >= 1 (no b == 0 case).
__device__ __forceinline__ float km_powabs_nz(float a, float b) { return km_ex2(b * km_lg2(a)); }
__device__ __forceinline__ double km_powabs_nz(double a, double b) { return pow(a, b); }
// Flush-to-zero forms, without the denormal fix-ups: lg2 of a subnormal is -inf, ex2 below -126 is 0.
__device__ __forceinline__ float km_ex2_ftz(float a) { float r; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(a)); return r; }
__device__ __forceinline__ float km_lg2_ftz(float a) { float r; asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(a)); return r; }
// |a|^b when b is known finite and >= 1, flushing: a < 2^-126 and results below 2^-126 give 0 (each
// such term is below 1.2e-38, which a sum cannot tell from 0); 0, inf and NaN as km_powabs_nz.
__device__ __forceinline__ float km_powabs_ftz(float a, float b) { return km_ex2_ftz(b * km_lg2_ftz(a)); }
__device__ __forceinline__ double km_powabs_ftz(double a, double b) { return pow(a, b); }
// sign(x)·|x|^b where x != 0, and 0 where x == 0 (the IR's select(ne(x,0), sign(x)·pow(abs(x),b), 0)).
// For NaN x the result is NaN, also for b == 0 (where |x|^0 = 1 but sign(NaN) = NaN); |x| = 1 gives ±1
// also for b = ±inf or NaN (pow(1, b) = 1, where ex2(b·lg2|x|) is NaN).
__device__ __forceinline__ float km_signpow(float x, float b) {
  const float r = km_ex2(b * km_lg2(fabsf(x)));
  const float s = copysignf((b == 0.0f && x == x) || fabsf(x) == 1.0f ? 1.0f : r, x);
  return x == 0.0f ? 0.0f : s;
}
__device__ __forceinline__ double km_signpow(double x, double b) { return x == 0.0 ? 0.0 : x != x ? x : copysign(pow(fabs(x), b), x); }
// km_signpow for b known finite and >= 0, flushing (no denormal fix-ups around lg2/ex2): for b > 0,
// |x| < 2^-126 gives ±0 (as a tie would) and results below 2^-126 are ±0; NaN, ±inf, 0 and b = 0
// as km_signpow.
__device__ __forceinline__ float km_signpow_ftz(float x, float b) {
  const float s = copysignf(b == 0.0f && x == x ? 1.0f : km_ex2_ftz(b * km_lg2_ftz(fabsf(x))), x);
  return x == 0.0f ? 0.0f : s;
}
__device__ __forceinline__ double km_signpow_ftz(double x, double b) { return km_signpow(x, b); }
// km_signpow_ftz for b known finite and > 0: x = 0 gives ex2(−inf) = ±0 and NaN stays NaN without
// selects.
__device__ __forceinline__ float km_signpow_pos(float x, float b) { return copysignf(km_ex2_ftz(b * km_lg2_ftz(fabsf(x))), x); }
__device__ __forceinline__ double km_signpow_pos(double x, double b) { return km_signpow(x, b); }
// |a|^(N/2) for a >= 0 and 1 <= N <= 8, an exponent that is a multiple of 1/2 known when the kernel
// is generated: a product of a's and, for odd N, one approximate square root (sqrt.approx, within
// about an ulp; FTZ flushes a < 2^-126 to 0) — at most one special-function op where the general
// power takes lg2 and ex2.  0, inf and NaN as pow.
template <int N, bool FTZ>
__device__ __forceinline__ float km_powhalf(float a) {
  static_assert(1 <= N && N <= 8, "exponent N/2 in [1/2, 4]");
  const float a2 = a * a;
  const float ak = N / 2 == 4 ? a2 * a2 : N / 2 == 3 ? a2 * a : N / 2 == 2 ? a2 : a;  // a^(N/2), rounded down
  if (N % 2 == 0) return ak;
  float s;
  if (FTZ) asm("sqrt.approx.ftz.f32 %0, %1;" : "=f"(s) : "f"(a));
  else asm("sqrt.approx.f32 %0, %1;" : "=f"(s) : "f"(a));
  return N == 1 ? s : ak * s;
}
template <int N, bool FTZ>
__device__ __forceinline__ double km_powhalf(double a) {
  static_assert(1 <= N && N <= 8, "exponent N/2 in [1/2, 4]");
  const double a2 = a * a;
  const double ak = N / 2 == 4 ? a2 * a2 : N / 2 == 3 ? a2 * a : N / 2 == 2 ? a2 : a;
  return N % 2 == 0 ? ak : N == 1 ? sqrt(a) : ak * sqrt(a);
}
// km_signpow with the exponent N/2 > 0 known: sign(x)·|x|^(N/2); x = ±0 gives ±0, NaN stays NaN.
template <int N, bool FTZ>
__device__ __forceinline__ float km_signpowhalf(float x) { return copysignf(km_powhalf<N, FTZ>(fabsf(x)), x); }
template <int N, bool FTZ>
__device__ __forceinline__ double km_signpowhalf(double x) { return copysign(km_powhalf<N, FTZ>(fabs(x)), x); }
#define KM_CMP(name, op) \
  __device__ __forceinline__ float name(float a, float b) { return (a op b) ? 1.0f : 0.0f; } \
  __device__ __forceinline__ double name(double a, double b) { return (a op b) ? 1.0 : 0.0; }
KM_CMP(km_lt, <) KM_CMP(km_le, <=) KM_CMP(km_gt, >) KM_CMP(km_ge, >=) KM_CMP(km_eq, ==) KM_CMP(km_ne, !=)
