"""Scalar math every kernel shares, as `@triton.jit` functions (inlined by Triton).

The IR's operations that Triton lacks or computes differently from torch are spelled here once:
IEEE `pow` (general and for bases known to be ≥ 0), `sign` with sign(±0) = +0, `min`/`max`
that propagate NaN, the sign-bit tricks they use, and the 3×TF32 split of the tensor-core
kernels.  Generated expressions (`kermac_backend_triton.expressions`) call them by name;
the kernel skeletons import them.

Two platforms: float32 on a GPU takes `log2` from the special-function unit (`lg2.approx`)
in inner loops and `exp`/`exp2` from libdevice (Triton's `tl.exp` flushes subnormal results
to 0, which loses kernel values below 1.2e-38 that torch keeps); float64, and everything under
Triton's CPU interpreter (which runs no PTX and has no libdevice), uses Triton's accurate
functions.  `native_float32` makes that choice when a kernel is compiled.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton import knobs
from triton.language.extra import libdevice

__all__ = [
    "INF",
    "NINF",
    "copysign_bits",
    "exp2_accurate",
    "exp_accurate",
    "log2_abs_fast",
    "max_nan",
    "min_nan",
    "native_float32",
    "pow_ieee",
    "pow_nonneg",
    "pow_nonneg_fast",
    "sign",
    "sign_bit_set",
    "signed_pow_positive",
    "split_tf32",
    "sqrt_approx",
    "to_tf32",
]

# Infinities as constexprs; no NaN-valued global: Triton re-checks the globals a kernel uses
# with `!=` at every launch, and NaN != NaN.
INF = tl.constexpr(float("inf"))
NINF = tl.constexpr(float("-inf"))


@triton.constexpr_function
def native_float32(dtype) -> bool:
    """Whether values of `dtype` take the GPU's float32 instructions (not the interpreter, not float64)."""
    # Triton's own switch (kermac_backend_triton.interpreter reads the same): a plain function
    # cannot be called here, only modules and @triton.jit / constexpr functions are allowed.
    return dtype == tl.float32 and not knobs.runtime.interpret


@triton.constexpr_function
def _unsigned_twin(dtype):
    """The unsigned integer type of `dtype`'s width, for bitwise sign operations."""
    return tl.uint64 if dtype == tl.float64 else tl.uint32


@triton.constexpr_function
def _sign_mask(dtype) -> int:
    return 0x8000000000000000 if dtype == tl.float64 else 0x80000000


@triton.jit
def log2_abs_fast(a):
    # log2|a|.  float32 on a GPU: lg2.approx.ftz on the special-function unit (absolute error about
    # 2^-22; a subnormal |a| counts as 0: for exponents b >= 1 its power is below the smallest normal
    # number, for b < 1 a term below F^b is lost, F = 2^-126, which only differences within a few
    # ulp of F can notice; the abs inside the asm folds into the MUFU operand).  Triton's own
    # float32 log2 is a long software polynomial.
    if native_float32(a.dtype):
        return tl.inline_asm_elementwise(
            "{ .reg .f32 m; abs.f32 m, $1; lg2.approx.ftz.f32 $0, m; }",
            "=r,r",
            [a],
            dtype=tl.float32,
            is_pure=True,
            pack=1,
        )
    else:
        return tl.log2(tl.abs(a))


@triton.jit
def sqrt_approx(a):
    # √a.  float32 on a GPU: sqrt.approx.f32 (within about an ulp, as the NVRTC backend's half powers; subnormal
    # inputs kept, unlike Triton's tl.sqrt, whose .ftz form returns 0 for them; 0, +inf, NaN and a < 0 as IEEE).
    # The correctly rounded sqrt.rn expands to a dozen instructions and a slow path: with few features the
    # distance epilogue, not the write, then set the time (docs/dev/triton-sqrt.md).
    if native_float32(a.dtype):
        return tl.inline_asm_elementwise("sqrt.approx.f32 $0, $1;", "=r,r", [a], dtype=tl.float32, is_pure=True, pack=1)
    else:
        return tl.sqrt_rn(a)


@triton.jit
def exp_accurate(a):
    # e^a with subnormal results kept (libdevice's expf on a GPU).
    if native_float32(a.dtype):
        return libdevice.exp(a)
    else:
        return tl.exp(a)


@triton.jit
def exp2_accurate(a):
    # 2^a with subnormal results kept (libdevice's exp2f on a GPU).
    if native_float32(a.dtype):
        return libdevice.exp2(a)
    else:
        return tl.exp2(a)


@triton.jit
def copysign_bits(r, t):
    # r (+0 or more, or NaN) with the sign bit of t: one bitwise instruction.
    bits: tl.constexpr = _unsigned_twin(r.dtype)
    signed = r.to(bits, bitcast=True) | (t.to(bits, bitcast=True) & _sign_mask(r.dtype))
    return signed.to(r.dtype, bitcast=True)


@triton.jit
def sign_bit_set(a):
    # Whether a's sign bit is set (a < 0, or -0): read from the bits, since a compiler may take
    # a == 0 to mean a is +0 (1 / a then loses -0's sign).
    bits: tl.constexpr = _unsigned_twin(a.dtype)
    return (a.to(bits, bitcast=True) & _sign_mask(a.dtype)) != 0


@triton.jit
def _pow_nonneg_sfu(a, b):
    # 2^(b·log2 a) for float32 on a GPU, as the NVRTC backend's km_pow_nonneg (its comment gives the reasons):
    # log2 a = E + lg2.approx(m), a = 2^E·m, m in [√½, √2) (subnormal a scaled by 2^24 first); the rounding errors
    # of b·E, b·lg2 m and their sum carried into ex2.approx's result as r·(1 + err·ln 2) (within 3.5 + 1.5|b| ulp:
    # lg2.approx's own error grows with |b|); a = 0, inf, NaN and a non-finite b take 2^(b·lg2 a) whole; 2^y as
    # 2^(y - s)·2^s, s = ±64 where |y| >= 64; no correction where y - s is infinite or NaN.  PTX, so that no
    # contraction into fma can change the error terms.
    return tl.inline_asm_elementwise(
        """{ .reg .f32 s, m, fe, lm, ye, yl, y, err, t, r, sc; .reg .b32 bits, e, sh; .reg .pred sn, ok, fin, big;
        setp.lt.f32 sn, $1, 0f00800000; mul.rn.f32 t, $1, 0f4B800000; selp.f32 s, t, $1, sn;
        mov.b32 bits, s; sub.s32 e, bits, 0x3f3504f3; shr.s32 e, e, 23; shl.b32 sh, e, 23; sub.s32 bits, bits, sh;
        mov.b32 m, bits; @sn sub.s32 e, e, 24; cvt.rn.f32.s32 fe, e;
        setp.gt.f32 ok, $1, 0f00000000; setp.lt.and.f32 ok, $1, 0f7F800000, ok;
        abs.f32 t, $2; setp.lt.and.f32 ok, t, 0f7F800000, ok;
        selp.f32 m, m, $1, ok; selp.f32 fe, fe, 0f00000000, ok;
        lg2.approx.f32 lm, m; mul.rn.f32 ye, $2, fe; selp.f32 ye, ye, 0f00000000, ok;
        mul.rn.f32 yl, $2, lm; add.rn.f32 y, ye, yl;
        neg.f32 t, ye; fma.rn.f32 err, $2, fe, t; neg.f32 t, yl; fma.rn.f32 t, $2, lm, t; add.rn.f32 err, err, t;
        sub.rn.f32 t, ye, y; add.rn.f32 t, t, yl; add.rn.f32 err, err, t; mul.rn.f32 err, err, 0f3F317218;
        abs.f32 t, y; setp.ge.f32 big, t, 0f42800000; mov.b32 bits, y; and.b32 bits, bits, 0x80000000;
        or.b32 bits, bits, 0x42800000; mov.b32 sc, bits; selp.f32 sc, sc, 0f00000000, big; sub.rn.f32 y, y, sc;
        ex2.approx.f32 r, y; fma.rn.f32 t, r, err, r; abs.f32 y, y; setp.lt.f32 fin, y, 0f43000000;
        selp.f32 r, t, r, fin; setp.gt.f32 big, sc, 0f00000000; selp.f32 t, 0f5F800000, 0f3F800000, big;
        setp.lt.f32 big, sc, 0f00000000; selp.f32 t, 0f1F800000, t, big; mul.rn.f32 $0, r, t; }""",
        "=r,r,r",
        [a, b],
        dtype=tl.float32,
        is_pure=True,
        pack=1,
    )


@triton.jit
def pow_nonneg(a, b):
    # a ** b for a >= 0 (or NaN), once per output (epilogues): exp2(b * log2(a)), on the special-function unit
    # for float32 on a GPU (_pow_nonneg_sfu), else with Triton's accurate log2 (in float64 for float32 values);
    # pow(a, 0) = pow(1, b) = 1 as in IEEE pow.  exp2(b * log2(a)) in float32 loses up to 2^-17 of y = b·log2 a
    # where |y| is large (31–39 ulp after the power); the carried errors keep the bound the NVRTC backend keeps
    # (docs/dev/nonnegative-powers.md).
    if native_float32(a.dtype):
        r = tl.where(b == 1, a, _pow_nonneg_sfu(a, b))  # IEEE pow(a, 1) = a exactly
    elif a.dtype == tl.float32:  # the interpreter: float64, so that log2 a keeps its bits for large |log2 a|
        r = tl.exp2(b.to(tl.float64) * tl.log2(a.to(tl.float64))).to(tl.float32)
    else:
        r = exp2_accurate(b * tl.log2(a))
    return tl.where(b == 0, 1.0, tl.where(a == 1, 1.0, r))


@triton.jit
def pow_nonneg_fast(a, b):
    # pow_nonneg on the special-function unit (inner loops): lg2.approx and ex2.approx.
    r = tl.exp2(b * log2_abs_fast(a))
    return tl.where(b == 0, 1.0, tl.where(a == 1, 1.0, r))


@triton.jit
def signed_pow_positive(t, b):
    # sign(t) * |t| ** b where t != 0, 0 where t == 0, for 0 < b < inf (elementwise b): the power
    # alone is right everywhere (|+-0| ** b = 0, |+-inf| ** b = inf, 1 ** b = 1, NaN) and the sign
    # is t's sign bit -- no selects.
    return copysign_bits(tl.exp2(b * log2_abs_fast(t)), t)


@triton.jit
def pow_ieee(a, b):
    # IEEE pow for any a: |a| ** b, negated for a < 0 (or -0) with an odd integer b, NaN for
    # a finite a < 0 with a non-integer b; pow(a, 0) = pow(1, b) = pow(-1, +-inf) = 1.
    r = exp2_accurate(b * tl.log2(tl.abs(a)))
    odd = (b - 2.0 * tl.floor(0.5 * b)) == 1.0
    negative = sign_bit_set(a)
    real = tl.where(tl.floor(b) == b, True, (a == 0) | (tl.abs(a) == INF))
    r = tl.where(negative, tl.where(odd, -r, tl.where(real, r, INF - INF)), r)
    r = tl.where(tl.abs(a) == 1, tl.where(tl.abs(b) == INF, 1.0, r), r)
    return tl.where(b == 0, 1.0, tl.where(a == 1, 1.0, r))


@triton.jit
def sign(a):
    # -1, +0 or 1 as torch.sign (sign(-0) = +0); NaN stays NaN.  |a| is free (an operand modifier).
    return tl.where(a > 0, 1.0, tl.where(a < 0, -1.0, tl.abs(a)))


@triton.jit
def max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def min_nan(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def to_tf32(a):
    # Round to nearest (ties away) float32 -> TF32 (low 13 bits cleared) by integer operations: the
    # cvt.rna.tf32.f32 of the 3xTF32 split, also valid under the interpreter.  +-inf stays +-inf,
    # NaN stays NaN, finite values above TF32's range round to +-inf (the guard then recomputes them).
    b = a.to(tl.uint32, bitcast=True)
    return ((b + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)


@triton.jit
def split_tf32(a):
    # (hi, lo) = (to_tf32(a), a - hi), lo unrounded.  On a GPU one inline-asm block: PTX sees a
    # float subtraction, so ptxas folds the negation into it (Triton's own IR would turn -hi into
    # an integer xor, one more instruction per term).
    if native_float32(a.dtype):
        return tl.inline_asm_elementwise(
            "{ .reg .b32 t; add.u32 t, $2, 0x1000; and.b32 $0, t, 0xFFFFE000; sub.f32 $1, $2, $0; }",
            "=r,=r,r",
            [a],
            dtype=(tl.float32, tl.float32),
            is_pure=True,
            pack=1,
        )
    else:
        hi = to_tf32(a)
        return hi, a - hi
