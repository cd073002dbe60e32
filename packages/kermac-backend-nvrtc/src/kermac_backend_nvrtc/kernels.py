"""CUDA C++ sources of the tiled kernels, self-contained (no headers), as templates for codegen.

:data:`PRELUDE` holds the scalar helpers every kernel uses: input types (``km_f16``/``km_bf16``
wrap 16-bit storage, so no ``cuda_fp16.h`` is needed), conversions, the IR operations with the
semantics of :mod:`kermac.ir` (NaN-propagating min/max, sign(0) = 0, comparisons giving 1.0 or
0.0) and a fast ``|a|^b`` for a non-negative base (``ex2.approx(b·lg2.approx(a))`` in float32,
optionally flushing subnormals, which saves the denormal fix-up instructions).  :data:`POW_POLY`
adds a variant whose ex2 runs on the FMA pipe instead of the special-function unit.
:data:`LOADER` stages one ``PT × KT`` operand tile into shared memory (stored k-major, ``S[k][p]``)
through registers, so the next tile's global loads overlap the current tile's math.

:data:`PAIRWISE` is a register-tiled SIMT kernel: a block computes ``BM × BN`` outputs, each of
its 256 threads ``TM × TN`` of them (two ``TM/2``-row and ``TN/2``-column groups, read from
shared memory as 16-byte vectors), looping over k in ``BK`` steps with double-buffered shared
memory.  :data:`GRAD` tiles ``(n, m)`` the same way and keeps all ``OT`` outputs of a pair in
registers: per ``(n, m, k)`` it evaluates ``a·multiply(d, b)`` once and does ``OT`` FMAs.

:data:`TILE_PROLOGUE`, :data:`GRAD_PROLOGUE`, :data:`MMA_TF32` and :data:`WGMMA_SYNC` are the
pieces the tensor-core kernels share; those kernels live in their own modules
(:mod:`.tc_pairwise`, :mod:`.wgmma_pairwise`, :mod:`.tc_grad`, :mod:`.sign_grad`).

``codegen`` substitutes the ``$NAME`` placeholders (``string.Template``): the rendered
expressions, tile constants, the parameter list and the batch-offset code.
"""

from __future__ import annotations

from string import Template

__all__ = [
    "GRAD",
    "GRAD_PROLOGUE",
    "LOADER",
    "MMA_TF32",
    "PAIRWISE",
    "POW_POLY",
    "PRELUDE",
    "TILE_PROLOGUE",
    "WGMMA_SYNC",
]

PRELUDE = r"""
typedef $COMPUTE km_t;
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
"""

#: ``|a|^b`` with ex2 on the FMA pipe, for the split pairwise kernel (float32; ``b`` finite, >= 1):
#: l = max(lg2 a, lmin) stays on the special-function unit (lmin = −126/b: a = 0, whose lg2 is
#: −inf, gives 2^−126); y = b·l = j + r with j = round(y) from the 1.5·2^23 magic add (fused into
#: the FMA) and r in [−0.5, 0.5]; 2^r by a degree-4 minimax polynomial (relative error 2.7e-6, mean
#: 4e-8); j is added to the result's exponent bits.  9 FMA/ALU-pipe instructions instead of a FMUL
#: and a MUFU.EX2.  Valid for b·log2 a <= 125 — no inf or NaN: the kernel guarantees that by
#: checking every staged input (``km_beyond``) and taking the MUFU path for a tile that fails.
POW_POLY = r"""
__device__ __forceinline__ float km_powabs_split(float a, float b, float lmin) {
  const float l = fmaxf($LG2(a), lmin);
  const float t = fmaf(b, l, 12582912.0f);            // 1.5·2^23 + j: j in the low mantissa bits
  const float r = fmaf(b, l, 12582912.0f - t);        // y − j, exact to one rounding
  const float q = $EXP2_COEFFS;
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
"""

LOADER = r"""
// cp.async (sm_80+) of 4, 8 or 16 bytes from global to shared memory (shared address dst); an invalid
// source copies nothing and zero-fills the destination.  km_cp_commit closes a group of copies,
// km_cp_wait waits for all of the thread's groups (then a barrier makes them visible to the block).
template <int N>
__device__ __forceinline__ void km_cp(unsigned dst, const void* src, bool valid) {
  if (N == 16) asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
  else asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(N), "r"(valid ? N : 0) : "memory");
}
__device__ __forceinline__ void km_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void km_cp_wait() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// One PT x KT operand tile, element (p, k) at base[p*sp + k*sk], staged through registers into
// S[k][p] (k-major).  MODE 0: scalar loads, k fastest across threads; 1: scalar, p fastest;
// 2: E-vectors along k (sk == 1, aligned); 3: E-vectors along p (sp == 1, aligned).
// fetch/land move the same elements with cp.async where they land whole (no staging registers).
template <typename Tin, int NT, int PT, int KT, int SP, int MODE, int E>
struct KmTile {
  struct __align__(sizeof(Tin) * E) Vec { Tin v[E]; };
  Vec r;
  __device__ __forceinline__ void load(const Tin* __restrict__ base, long long sp, long long sk,
                                       int p_lim, int k0, int k_lim) {
    const int tid = threadIdx.x;
    if (MODE == 0 || MODE == 1) {
#pragma unroll
      for (int i = 0; i < E; ++i) {
        int e = tid + NT * i;
        int k = MODE == 0 ? e % KT : e / PT;
        int p = MODE == 0 ? e / KT : e % PT;
        bool ok = (PT * KT % NT == 0 || e < PT * KT) && p < p_lim && k0 + k < k_lim;
        r.v[i] = ok ? base[(long long)p * sp + (long long)(k0 + k) * sk] : Tin{};
      }
    } else if (MODE == 2) {
      int p = tid / (KT / E), k = (tid % (KT / E)) * E;
      bool ok = p < p_lim && k0 + k < k_lim;
      if (ok) r = *reinterpret_cast<const Vec*>(base + (long long)p * sp + (k0 + k));
      else {
#pragma unroll
        for (int i = 0; i < E; ++i) r.v[i] = Tin{};
      }
    } else {
      int p = (tid % (PT / E)) * E, k = tid / (PT / E);
      bool ok = p < p_lim && k0 + k < k_lim;
      if (ok) r = *reinterpret_cast<const Vec*>(base + p + (long long)(k0 + k) * sk);
      else {
#pragma unroll
        for (int i = 0; i < E; ++i) r.v[i] = Tin{};
      }
    }
  }
  static constexpr int mode = MODE, e = E, pt = PT, kt = KT;
  // f(i, k, p) for every element slot this thread stages: element i of r.v sits at (p, k).
  template <typename F>
  __device__ __forceinline__ void each_pos(F f) const {
    const int tid = threadIdx.x;
    if (MODE == 0 || MODE == 1) {
#pragma unroll
      for (int i = 0; i < E; ++i) {
        int e = tid + NT * i;
        int k = MODE == 0 ? e % KT : e / PT;
        int p = MODE == 0 ? e / KT : e % PT;
        if (PT * KT % NT == 0 || e < PT * KT) f(i, k, p);
      }
    } else if (MODE == 2) {
      int p = tid / (KT / E), k = (tid % (KT / E)) * E;
#pragma unroll
      for (int i = 0; i < E; ++i) f(i, k + i, p);
    } else {
      int p = (tid % (PT / E)) * E, k = tid / (PT / E);
#pragma unroll
      for (int i = 0; i < E; ++i) f(i, k, p + i);
    }
  }
  // f(k, p, value) for every element this thread staged (value converted to km_t).
  template <typename F>
  __device__ __forceinline__ void each(F f) const {
    each_pos([&](int i, int k, int p) { f(k, p, km_cvt(r.v[i], km_t(0))); });
  }
  __device__ __forceinline__ void store(km_t (*S)[SP]) const {
    each([&](int k, int p, km_t v) { S[k][p] = v; });
  }
  // load + store without staging registers where the copies land whole: cp.async of the thread's
  // elements into S (zero outside the operand, as load gives; MODE 0, 1 and 3).  MODE 2 vectors land
  // transposed (E 4-byte copies each, measured slower than one vector load): staged as before.
  // fetch starts the tile, land finishes it (after km_cp_commit ... km_cp_wait, before a barrier).
  __device__ __forceinline__ void fetch(km_t (*S)[SP], const Tin* __restrict__ base, long long sp, long long sk,
                                        int p_lim, int k0, int k_lim) {
    static_assert(MODE == 2 || sizeof(Tin) == sizeof(km_t), "cp.async copies without conversion");
    const int tid = threadIdx.x;
    if (MODE == 0 || MODE == 1) {
      each_pos([&](int i, int k, int p) {
        const bool ok = p < p_lim && k0 + k < k_lim;
        const Tin* src = ok ? base + (long long)p * sp + (long long)(k0 + k) * sk : base;
        km_cp<sizeof(Tin)>((unsigned)__cvta_generic_to_shared(&S[k][p]), src, ok);
      });
    } else if (MODE == 2) {
      load(base, sp, sk, p_lim, k0, k_lim);
    } else {  // E-vector along p, contiguous in S[k] too: 16 bytes per copy where E allows
      constexpr int V = sizeof(Tin) * E % 16 == 0 ? 16 / sizeof(Tin) : 1;
      const int p = (tid % (PT / E)) * E, k = tid / (PT / E);
      const bool ok = p < p_lim && k0 + k < k_lim;
      const Tin* src = ok ? base + p + (long long)(k0 + k) * sk : base;  // base + j·V: in bounds (P % E == 0)
      const unsigned dst = (unsigned)__cvta_generic_to_shared(&S[k][p]);
#pragma unroll
      for (int j = 0; j < E / V; ++j) km_cp<sizeof(Tin) * V>(dst + j * V * sizeof(Tin), src + j * V, ok);
    }
  }
  __device__ __forceinline__ void land(km_t (*S)[SP]) const {
    if (MODE == 2) store(S);
  }
};

// Grouped tile order of a pairwise grid: groups of 8 row tiles sweep the column tiles together
// (L2 reuse of z).  Block ``tile`` → first row m0 and first column n0 of its bm × bn output tile.
__device__ __forceinline__ void km_tile_origin(int tile, int M, int tiles_n, int bm, int bn, int& m0, int& n0) {
  const int group_m = 8, tiles_m = (M + bm - 1) / bm;
  const int first_m = tile / (group_m * tiles_n) * group_m;
  const int gsize = min(tiles_m - first_m, group_m);
  const int in_group = tile % (group_m * tiles_n);
  m0 = (first_m + in_group % gsize) * bm;
  n0 = (in_group / gsize) * bn;
}

// V consecutive values of shared memory as one vector load where 16 bytes allow it.
template <int V>
__device__ __forceinline__ void km_lds(const km_t* p, km_t* r) {
  if (sizeof(km_t) * V == 16) {
    if (sizeof(km_t) == 4) { float4 q = *reinterpret_cast<const float4*>(p); r[0] = q.x; r[1] = q.y; r[2] = q.z; r[3] = q.w; }
    else { double2 q = *reinterpret_cast<const double2*>(p); r[0] = q.x; r[1] = q.y; }
  } else if (sizeof(km_t) * V == 8 && sizeof(km_t) == 4) {
    float2 q = *reinterpret_cast<const float2*>(p); r[0] = q.x; r[1] = q.y;
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) r[i] = p[i];
  }
}
"""

#: PTX of the asynchronous warpgroup MMA pipeline (sm_90a), shared by the wgmma kernels: fence
#: before a wgmma that reads registers written by other instructions, commit, wait until at most N
#: groups run, make shared-memory stores visible to the async proxy, and keep the compiler from
#: moving accumulator accesses across a wait.
WGMMA_SYNC = r"""
__device__ __forceinline__ void km_wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void km_wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void km_wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void km_async_fence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void km_fence_acc(float* d) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
"""

#: The start of every gradient kernel's body after its thread coordinates and tile origin: the
#: number of k tiles, the block's batch entry and output chunk (o0 .. o0 + OT), and the entry's
#: operand offsets and hyperparameters (its closing brace is the kernel's).
GRAD_PROLOGUE = r"""  const int ntiles = (K + BK - 1) / BK;

  {
    const long long zi = zbase + blockIdx.z;  // batch entry × output chunk (the host splits over 65535)
    const long long bidx = zi / ochunks;
    const int o0 = (int)(zi % ochunks) * OT;
$BATCH_OFFSETS
$HYPER_LOADS
"""

#: The start of every pairwise kernel's body, after its thread coordinates: the block's tile origin
#: (grouped order), the number of k tiles, and the batch entry's operand offsets and hyperparameters
#: (its closing brace is the kernel's).
TILE_PROLOGUE = r"""  int m0, n0;
#if defined(KM_KCONTIG) && KM_KCONTIG
  // Row-major tile order: the grouped order's extra live values made ptxas spill this kernel's loop
  // (compute-bound: z's re-reads from L2/HBM cost little at the D it runs).
  m0 = (blockIdx.x / tiles_n) * BM;
  n0 = (blockIdx.x % tiles_n) * BN;
#else
  km_tile_origin(blockIdx.x, M, tiles_n, BM, BN, m0, n0);
#endif
  const int ntiles = (D + BK - 1) / BK;

  {
    const long long bidx = zbase + blockIdx.z;  // batch entry (the host splits batches over 65535)
$BATCH_OFFSETS
$HYPER_LOADS
"""

# The k loop of k-contiguous pairwise kernels (PairwiseVariant.k_contiguous; float32 Σ |x − z|): shared
# tiles keep each row's 16 k-values together (row pitch KM_KROW = 20 floats: the rows a quarter-warp
# reads fall on distinct banks), filled by cp.async without staging registers — x as 16-byte copies,
# z as 4-byte copies that land at k ^ 1 (pairs swapped).  A thread owns x rows ty + 32i and z rows
# tx + 8j; per 4 k it reads one 16-byte vector per row, and x[k] sits at an even register offset of
# its vector exactly when z[k] sits at an odd one, so no difference reads two registers of one bank.
# Rows past M or N read the last row (their outputs are never stored); k past D (a multiple of 4) is
# zero-filled in both operands, whose |0 − 0| adds nothing.  The terms of each output are summed in
# k order, as in the other SIMT kernels.
KCONTIG_LOOP = r"""    {
      const int xr = tid >> 1, xk = (tid & 1) * (BK / 2);  // x: 2 × 16 bytes of row xr per tile
      const float* xp = xb + (long long)min(xr, M - 1 - m0) * sxm + xk;
      const unsigned xdst = (unsigned)__cvta_generic_to_shared(&Xs[0][xr * KM_KROW + xk]);
      const int zk = tid & 15, zr = tid >> 4;  // z: k = zk of rows zr + 16c, c < BN / 16
      const float* zp = zb + zk;
      const unsigned zdst = (unsigned)__cvta_generic_to_shared(&Zs[0][zr * KM_KROW + (zk ^ 1)]);
      const int zlast = N - 1 - n0;
      auto fetch = [&](int t, int buf) {
        const int k0 = t * BK;
#pragma unroll
        for (int h = 0; h < BK / 8; ++h)
          km_cp<16>(xdst + buf * (BM * KM_KROW * 4) + 16 * h, xp + k0 + 4 * h, k0 + xk + 4 * h < D);
#pragma unroll
        for (int c = 0; c < BN / 16; ++c)
          km_cp<4>(zdst + buf * (BN * KM_KROW * 4) + c * (16 * KM_KROW * 4),
                   zp + k0 + (unsigned)(min(zr + 16 * c, zlast) * (int)szn), k0 + zk < D);
        km_cp_commit();
      };
      if (ntiles > 0) {
        fetch(0, 0);
        km_cp_wait();
        __syncthreads();
      }
      for (int t = 0; t < ntiles; ++t) {
        const int cur = t & 1;
        if (t + 1 < ntiles) fetch(t + 1, cur ^ 1);
#pragma unroll
        for (int q = 0; q < BK / 4; ++q) {
          float4 xq[GM];
#pragma unroll
          for (int i = 0; i < GM; ++i) xq[i] = *(const float4*)&Xs[cur][(ty + (BM / GM) * i) * KM_KROW + 4 * q];
#pragma unroll
          for (int j = 0; j < GN; ++j) {
            const float4 zq = *(const float4*)&Zs[cur][(tx + (BN / GN) * j) * KM_KROW + 4 * q];  // z[k + 1, k, k + 3, k + 2]
#pragma unroll
            for (int i = 0; i < GM; ++i) {
              km_t a = acc[i][j];
              a = km_reduce(a, km_inner(xq[i].x, zq.y$HYPER_ACTUALS));
              a = km_reduce(a, km_inner(xq[i].y, zq.x$HYPER_ACTUALS));
              a = km_reduce(a, km_inner(xq[i].z, zq.w$HYPER_ACTUALS));
              acc[i][j] = km_reduce(a, km_inner(xq[i].w, zq.z$HYPER_ACTUALS));
            }
          }
        }
        km_cp_wait();
        __syncthreads();
      }
    }
"""

PAIRWISE = Template(
    r"""
#define NT 256
#define BM $BM
#define BN $BN
#define BK $BK
#define VM $VM
#define VN $VN
#define TN $TN
#define GM $GM
#define GN $GN
#define SPAD $SPAD
// Thread layout: TN threads along n, NT / TN along m; a thread owns GM groups of VM rows (BM / GM
// apart) and GN groups of VN columns (BN / GN apart), each group one 16-byte shared load per k.

// Split kernels (POLY_PAIRS > 0, only for a float32 sum of |x − z|^b with b >= 1): POLY_PAIRS of a
// thread's pairs take ex2 on the FMA pipe (km_powabs_split), the others on the MUFU.
#define POLY_PAIRS $POLY_PAIRS
// One-path kernels (KM_ONE_PATH: not split, inner(0, 0) the reduction's identity): every k tile,
// the partial one too, runs the unrolled loop; its features past D are staged as zeros in both
// operands, so their terms are the identity.  The next tile's loads go after KM_LOADS_AT of its BK
// steps (in a 16-deep tile, a shorter life for the staging registers).
#define KM_ONE_PATH $ONE_PATH
#define KM_LOADS_AT $LOADS_AT
__device__ __forceinline__ km_t km_inner(km_t x, km_t z$HYPER_FORMALS) { return $INNER; }
// Pair q of the thread's P = GM·VM·GN·VN is split iff floor((q + 1)·n / P) > floor(q·n / P): n of them, spread evenly.
#define KM_IS_SPLIT(q, n) (((q) + 1) * (n) / (GM * VM * GN * VN) > (q) * (n) / (GM * VM * GN * VN))
#define KM_POW_TABLE $POW_TABLE
#define KM_POW_DEGREE $POW_DEGREE
#if POLY_PAIRS > 0 && KM_POW_TABLE
#define KM_SPLIT_TERM(x, z) km_powabs_table<KM_POW_DEGREE>((x) - (z), km_ptab, km_pc)
#elif POLY_PAIRS > 0
#define KM_SPLIT_TERM(x, z) km_powabs_split(km_abs((x) - (z)), km_pb, km_plmin)
#else
#define KM_SPLIT_TERM(x, z) km_t(0)
#endif
__device__ __forceinline__ km_t km_reduce(km_t acc, km_t v) { return $REDUCE; }
__device__ __forceinline__ km_t km_epilogue(km_t acc, km_t diag$HYPER_FORMALS) { return $EPILOGUE; }

// k-contiguous kernels (KM_KCONTIG, kernels.KCONTIG_LOOP): tiles keep each row's BK k-values together.
#define KM_KCONTIG $KCONTIG
#define KM_KROW (BK + 4)

extern "C" __global__ void __launch_bounds__(NT, $MIN_BLOCKS)
kermac_pairwise($PARAMS) {
#if KM_KCONTIG
  __shared__ __align__(16) km_t Xs[2][BM * KM_KROW];
  __shared__ __align__(16) km_t Zs[2][BN * KM_KROW];
#else
  __shared__ __align__(16) km_t Xs[2][BK][BM + SPAD];
  __shared__ __align__(16) km_t Zs[2][BK][BN + SPAD];
#endif
  const int tid = threadIdx.x;
  const int tx = tid % TN, ty = tid / TN;
"""
    + TILE_PROLOGUE
    + r"""#if POLY_PAIRS > 0
    const km_t km_pb = $POLY_EXP;                              // the exponent b of |x − z|^b
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
    const float km_pc[KM_POW_DEGREE + 1] = {$POW_COEFFS};  // m^b ≈ Σ km_pc[j]·m^j
#endif
#define KM_SYNC(next) km_fallback = __syncthreads_or((next) && (km_beyond(xt, km_plim) || km_beyond(zt, km_plim)))
#else
#define KM_SYNC(next) __syncthreads()
#endif
    int km_fallback = 0;
    const $TIN* xb = x + off_x + (long long)m0 * sxm;
    const $TIN* zb = z + off_z + (long long)n0 * szn;
#if !KM_KCONTIG
    KmTile<$TIN, NT, BM, BK, BM + SPAD, $XMODE, $XE> xt;
    KmTile<$TIN, NT, BN, BK, BN + SPAD, $ZMODE, $ZE> zt;
#endif
    km_t acc[GM * VM][GN * VN];
#pragma unroll
    for (int i = 0; i < GM * VM; ++i)
#pragma unroll
      for (int j = 0; j < GN * VN; ++j) acc[i][j] = $IDENTITY;

#if KM_KCONTIG
"""
    + KCONTIG_LOOP
    + r"""#else
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
            ? KM_SPLIT_TERM(xr[i], zr[j]) : km_inner(xr[i], zr[j]$HYPER_ACTUALS)); \
      }
    for (int t = 0; t < ntiles; ++t) {
      const int cur = t & 1;
#if KM_ONE_PATH
#pragma unroll
      for (int kk = 0; kk < KM_LOADS_AT; ++kk) KM_STEP(kk, 0)
#endif
      if (t + 1 < ntiles) {
        xt.load(xb, sxm, sxk, M - m0, (t + 1) * BK, D);
        zt.load(zb, szn, szk, N - n0, (t + 1) * BK, D);
      }
      const int kcount = min(BK, D - t * BK);
#if KM_ONE_PATH
      // Never taken (kcount > 0), but ptxas cannot tell: the branch ends the basic block, so the
      // loads above stay where they are instead of sinking to their shared stores.
      if (kcount <= 0) __trap();
#pragma unroll
      for (int kk = KM_LOADS_AT; kk < BK; ++kk) KM_STEP(kk, 0)
#else
      // A split kernel's fallback tiles (rare: inputs beyond lim, inf or NaN) share the tail's loop.
      if (kcount == BK && !km_fallback) {
#pragma unroll $KUNROLL
        for (int kk = 0; kk < BK; ++kk) KM_STEP(kk, POLY_PAIRS)
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
    $TOUT* ob = out + off_o;
#pragma unroll
    for (int i = 0; i < GM * VM; ++i) {
      const int m = m0 + (i / VM) * (BM / GM) + ty * VM + i % VM;
      if (m >= M) continue;
      $TOUT* row = ob + (long long)m * som;
#pragma unroll
      for (int g = 0; g < GN; ++g) {
        const int nb = n0 + g * (BN / GN) + tx * VN;
        km_t v[VN];
#pragma unroll
        for (int j = 0; j < VN; ++j) {
          const int n = nb + j;
          const km_t diag = $DIAG;
#if POLY_PAIRS > 0
          // Split terms are at least about 2^-126 (lmin, |x − z| = 0 included): a sum below
          // D·2^-125 has only terms below the float32 normal range and is 0, as each is with ftz.
          const km_t a = acc[i][g * VN + j];
          const km_t sum = a < km_t(D) * km_t(2.350988701644575e-38) ? km_t(0) : a;
#else
          const km_t sum = acc[i][g * VN + j];
#endif
          v[j] = km_epilogue(sum, diag$HYPER_ACTUALS);
        }
        if (sizeof($TOUT) * VN == 16 && ovec && nb + VN <= N) {
          km_store16(row + nb, v);
        } else if (KM_KCONTIG && ovec) {  // unit column stride: no 64-bit product per element
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
"""
)

GRAD = Template(
    r"""
#define NT 256
#define BMM $BMM
#define BNN $BNN
#define BK $BK
#define TPM $TPM
#define TPN $TPN
#define OT $OT
#define SPAD $SPAD

__device__ __forceinline__ km_t km_multiply(km_t d, km_t b$HYPER_FORMALS) { return $MULTIPLY; }
__device__ __forceinline__ km_t km_epilogue(km_t acc$HYPER_FORMALS) { return $EPILOGUE; }

extern "C" __global__ void __launch_bounds__(NT, $MIN_BLOCKS)
kermac_grad($PARAMS) {
  __shared__ __align__(16) km_t As[2][BK][BMM + SPAD];
  __shared__ __align__(16) km_t Bs[2][BK][BNN + SPAD];
  __shared__ __align__(16) km_t Cs[2][BK][OT];
  const int tid = threadIdx.x;
  const int tx = tid % 16, ty = tid / 16;
  const int m0 = (blockIdx.x % tiles_m) * BMM;
  const int n0 = (blockIdx.x / tiles_m) * BNN;
"""
    + GRAD_PROLOGUE
    + r"""    km_t dv[TPN][TPM];
#pragma unroll
    for (int i = 0; i < TPN; ++i)
#pragma unroll
      for (int j = 0; j < TPM; ++j) {
        const int n = n0 + ty * TPN + i, m = m0 + tx * TPM + j;
        dv[i][j] = (n < N && m < M) ? km_cvt(d[off_d + (long long)n * sdn + (long long)m * sdm], km_t(0)) : km_t(0);
      }
    const $TIN* ab = a + off_a + (long long)m0 * sam;
    const $TIN* bb = b + off_b + (long long)n0 * sbn;
    const $TIN* cb = c + off_c + (long long)o0 * sco;
    KmTile<$TIN, NT, BMM, BK, BMM + SPAD, $AMODE, $AE> at;
    KmTile<$TIN, NT, BNN, BK, BNN + SPAD, $BMODE, $BE> bt;
    KmTile<$TIN, NT, OT, BK, OT, $CMODE, $CE> ct;
    km_t acc[OT][TPN][TPM];
#pragma unroll
    for (int o = 0; o < OT; ++o)
#pragma unroll
      for (int i = 0; i < TPN; ++i)
#pragma unroll
        for (int j = 0; j < TPM; ++j) acc[o][i][j] = km_t(0);

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
          const km_t v = ar[j] * km_multiply(dv[i][j], br[i]$HYPER_ACTUALS);      \
          _Pragma("unroll") for (int o = 0; o < OT; ++o)                          \
            acc[o][i][j] = km_fma(cr[o], v, acc[o][i][j]);                        \
        }                                                                         \
      }
      if (kcount == BK) {
#pragma unroll $KUNROLL
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

    $TOUT* ob = out + off_o;
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
                     km_epilogue(acc[o][i][j]$HYPER_ACTUALS));
        }
      }
    }
  }
}
"""
)

#: TF32 tensor-core helpers of the 3×TF32 kernels (float32 only): rounding to TF32, the hi/lo split
#: a ≈ hi + lo, and one ``mma.sync`` m16n8k8 step (fragment layouts in the PTX ISA).
MMA_TF32 = r"""
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
"""
