"""The programs behind [`kermac.cdist`][kermac.cdist] and [`kermac.cdist_grad`][kermac.cdist_grad].

`p` given as a number selects a program for that p; `p=None` stands for a p given per batch
entry as a tensor, which the program reads as the hyperparameter `p`.  The public operations and
ahead-of-time compilation (`kermac precompile`) both use these, so they agree on which kernels
exist.  `docs/formulas.md` ("Special values", "Large p") states the semantics; in short, with
t = x − z per feature:

* p = 0 counts the features with t ≠ 0; a NaN t (a NaN coordinate, or ∞ − ∞) makes the count NaN
  ([`kermac.programs.L0_TERM`][kermac.programs.L0_TERM]), as torch.cdist gives.
* p = ∞ is the largest |t| over the features whose t is not NaN (0 if there is none): torch.cdist's
  maximum ignores NaN ([`kermac.programs.LINF_TERM`][kermac.programs.LINF_TERM]).
* 0 < p < ∞ is (Σ|t|^p)^(1/p), NaN where a t is NaN.  The p-th powers leave the compute type's range
  for coordinate differences that move further from 1 as p grows, so:

  - p at or above [`linf_threshold`][kermac.lowering.linf_threshold] (a number p, not `skip_epilogue`) is computed as
    the maximum of |t| (NaN propagating): d_∞ ≤ d_p ≤ D^(1/p)·d_∞ and D^(1/p) − 1 is then below the
    output type's rounding for every D < 2⁶⁴;
  - a number p above [`plain_power_limit`][kermac.lowering.plain_power_limit] takes the *guarded* program
    ([`guarded_lp_program`][kermac.lowering.guarded_lp_program]), which returns NaN where underflow may have cost
    accuracy or a power overflows, instead of a plausible-looking wrong value;
  - a tensor p (one per batch entry) takes the plain formula, whose fast inner loop every backend
    specialises; [`kermac.cdist`][kermac.cdist] accepts its values up to
    [`plain_power_limit`][kermac.lowering.plain_power_limit] (a larger one makes its batch entry NaN, like any invalid
    tensor hyperparameter);
  - p up to that limit, where underflow costs the formula at most an absolute 2⁻²⁴ (float32) or
    2⁻⁵³ (float64) for D ≤ 2³¹, takes torch.cdist's plain formula, which every backend specialises.

The thresholds depend on the inputs' dtype; `dtype=None` takes float64's (exact for float64, and
for narrower types the plain formula wherever float64's limits would guard).
"""

from __future__ import annotations

import math
from functools import cache

import torch

from kermac import ir, presets
from kermac.hyperparams import nan_where_nan
from kermac.problem import compute_dtype
from kermac.programs import GradProgram, PairwiseProgram

__all__ = [
    "MAX_FEATURES",
    "cdist_program",
    "grad_program",
    "guarded_lp_program",
    "linf_threshold",
    "plain_power_limit",
]

_T = ir.Var("x") - ir.Var("z")
MAX_FEATURES = 2**31
"""The largest feature count D the guard and the plain formula's bound are derived for (the bound
of [`linf_threshold`][kermac.lowering.linf_threshold] grows with ln D only and holds for D < 2⁶⁴).
"""

_ACC, _P = ir.Var("acc"), ir.Hyper("p")


def _unit_roundoff(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps / 2


def linf_threshold(dtype: torch.dtype | None = None) -> float:
    """Smallest p from which cdist computes d_p as d_∞ = max|t| for `dtype` outputs.

    d_∞ ≤ d_p ≤ D^(1/p)·d_∞, and D^(1/p) ≤ e^u (u the output type's unit roundoff) for every
    D < 2⁶⁴ once p ≥ 64·ln 2/u: about 7.4e8 for float32, 4.0e17 for float64, 9.1e4 for float16 and
    1.1e4 for bfloat16.
    """
    return 64 * math.log(2) / _unit_roundoff(dtype or torch.float64)


def plain_power_limit(dtype: torch.dtype | None = None) -> float:
    """Largest p that takes the plain (Σ|t|^p)^(1/p) for `dtype` inputs.

    Terms |t|^p below the compute type's smallest normal number F flush or lose digits; their sum
    is below D·F, so the plain formula is within an absolute (D·F)^(1/p) of d_p (besides rounding).
    Up to p = log(2³¹·F)/log(u) that is at most u, the compute type's unit roundoff, for D ≤ 2³¹:
    the limit is about 3.96 for float32 (and narrower) inputs, 18.7 for float64.  Beyond it the
    guarded program runs.
    """
    c = compute_dtype(dtype or torch.float64)
    return math.log(MAX_FEATURES * torch.finfo(c).smallest_normal) / math.log(_unit_roundoff(c))


@cache
def guarded_lp_program(dtype: torch.dtype | None = None) -> PairwiseProgram:
    """(Σ|t|^p)^(1/p) for large p: NaN wherever under- or overflow may have made it wrong.

    With F the compute type's smallest normal number, u its unit roundoff and H = max/2³¹:

    * the inner term is max(|t|^p, F·[t ≠ 0]): a difference whose power underflows still counts F,
      so the sum S is 0 only where every t is 0 (a duplicate point: distance 0) and at least F
      otherwise.  An underflowed or subnormal term is off by less than F, S by less than D·F, and
      the distance by a relative D·F/(p·S): the epilogue returns NaN where p·S < 2³¹·F/u, where
      that may exceed u (for D ≤ 2³¹), and S^(1/p) elsewhere;
    * a term above H from a finite t is NaN: then the sum of at most 2³¹ terms cannot overflow,
      and +inf is left to infinite coordinates (as for every p); NaN coordinates give NaN.

    Reads `Hyper("p")` (a number, or one per batch entry).
    """
    c = compute_dtype(dtype or torch.float64)
    info = torch.finfo(c)
    power = ir.pow(abs(_T), _P)
    overflow = ir.gt(power, info.max / MAX_FEATURES) * ir.lt(abs(_T), math.inf)
    inner = ir.select(overflow, math.nan, ir.maximum(power, info.smallest_normal * ir.ne(_T, 0.0)))
    lossy = ir.gt(_ACC, 0.0) * ir.lt(_ACC * _P, MAX_FEATURES * info.smallest_normal / _unit_roundoff(c))
    epilogue = ir.select(lossy, math.nan, ir.pow(_ACC, 1.0 / _P))
    return PairwiseProgram(inner=inner, reduction="sum", epilogue=epilogue)


@cache
def _max_abs_program() -> PairwiseProgram:
    """max_k |t| with NaN propagating (as for every finite p), 0 for D = 0: cdist from
    [`linf_threshold`][kermac.lowering.linf_threshold]."""
    return PairwiseProgram(inner=abs(_T), reduction="max", epilogue=ir.maximum(_ACC, 0.0))


def cdist_program(p: float | None, *, skip_epilogue: bool = False, dtype: torch.dtype | None = None) -> PairwiseProgram:
    """Program of `cdist(x, z, p, skip_epilogue=...)` for inputs of `dtype` (see the module docs).

    `p=None` is a p per batch entry (a tensor): the plain formula, which the public operation
    accepts only for values up to [`plain_power_limit`][kermac.lowering.plain_power_limit] (an invalid value gives NaN).
    The program reads `Hyper("p")` unless p is 0, 1, 2, ∞ or at least
    [`linf_threshold`][kermac.lowering.linf_threshold].
    """
    if p == 0.0:
        return presets.l0_distance.lower()
    if p == math.inf:
        return presets.linf_distance.lower()
    if p is not None and not skip_epilogue:
        if p >= linf_threshold(dtype):
            return _max_abs_program()
        if p > plain_power_limit(dtype):
            return guarded_lp_program(None if dtype is None else compute_dtype(dtype))
    descriptor = {1.0: presets.l1_distance, 2.0: presets.l2_distance}.get(p, presets.lp_distance)
    if skip_epilogue:
        descriptor = descriptor.replace(outer="identity")
    return descriptor.lower()


def grad_program(p: float | None) -> GradProgram:
    """Program of `cdist_grad(..., p)`: Σ_k c·a·φ(d − b) with φ(t) = sgn(t)|t|^(p−1), φ(0) = 0.

    One program per kind (p = 1, p = 2, any other p), built once."""
    return _grad_program(p if p in (1.0, 2.0) else None)


@cache
def _grad_program(p: float | None) -> GradProgram:
    t = ir.Var("d") - ir.Var("b")
    if p == 1.0:
        multiply = ir.sign(t)
    elif p == 2.0:
        multiply = t
    else:
        general = ir.sign(t) * ir.pow(abs(t), ir.Hyper("p") - 1.0)
        multiply = ir.select(ir.ne(t, 0.0), general, 0.0)
        # A NaN p (an invalid tensor value, kermac.hyperparams) must reach every output of its batch entry.
        return GradProgram(multiply=multiply, epilogue=nan_where_nan(ir.Var("acc"), "p"))
    return GradProgram(multiply=multiply, epilogue=ir.Var("acc"))
