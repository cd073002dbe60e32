"""Error intervals for the differential fuzzer: where may a correct backend's result lie?

A kermac program computed in a compute type T (float32 for float16/bfloat16/float32 inputs, float64
for float64) differs from its exact value by rounding, by the documented approximations of the GPU
kernels (``ex2``/``lg2`` powers, 3×TF32 products, flushing of subnormal terms) and, where a
comparison, a domain boundary or the range of T is close, by a different branch, a NaN or an
infinity.  A fixed relative tolerance is therefore either flaky or blind.  This module evaluates
an IR program on *intervals* in float64 instead: every value is ``[lo, hi]`` plus two flags,
``may`` (the value may be NaN) and ``must`` (it is NaN), and every operation

* takes the hull of the exact operation over its operands' intervals (monotone pieces evaluated
  at the endpoints, with the IEEE special cases of :mod:`kermac.ir`: ``pow`` as torch.pow,
  sign(NaN) = NaN, NaN-propagating min/max, comparisons 1/0, ``select`` on ``≠ 0``), and
* widens it by that operation's rounding error in T — a few units of T's unit roundoff for
  + − × ÷ √, more for ``exp``/``log``/``pow`` in proportion to their argument's size (the error of
  ``exp2(b·log2 a)``) — plus one absolute unit ``eta`` for underflow (a subnormal step on the CPU,
  the smallest normal number where GPU code flushes subnormals), and opens it to ±∞ where it may
  leave T's range.

A comparison whose operands' intervals overlap may take either value, so a ``select`` on it gives
the hull of both branches; a square root or logarithm of an interval reaching below zero may be
NaN; a division by an interval containing 0 may be anything.  The result is an interval that a
correct computation lies in — wide exactly where the expression is ill-conditioned, exact where it
is exact (a point zero stays a point zero, an exact tie compares equal) — so the fuzzer can compare
every element without flaky failures and still catch a wrong value, a wrong NaN or a wrong
infinity.  Nothing here calls kermac: the semantics are implemented again, from the IR table.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from kermac.ir import Call, Const, Expr, Hyper, Var

__all__ = ["Interval", "Precision", "check", "evaluate", "hull", "mul", "point", "reduce_terms", "widen_output"]


@dataclass(frozen=True)
class Precision:
    """Rounding model of one compute type (or output type).

    ``u``: unit roundoff; ``max``: largest finite value; ``eta``: absolute error allowed per
    operation for underflow (a subnormal step, or the smallest normal where subnormals flush);
    ``dtype``: the torch dtype that rounds constants and hyperparameters; ``flush``: operations may
    also read subnormal operands as zero (GPU code: ``lg2.approx.ftz`` in fast powers,
    ``div.full.f32``), so an operand near zero may be exactly 0.
    """

    dtype: torch.dtype
    u: float
    max: float
    eta: float
    flush: bool = False

    @classmethod
    def of(cls, dtype: torch.dtype, *, flush: bool = False) -> Precision:
        info = torch.finfo(dtype)
        eta = info.tiny if flush else info.smallest_normal * info.eps
        return cls(dtype, info.eps / 2, info.max, eta, flush)


@dataclass(frozen=True)
class Interval:
    """Elementwise ``[lo, hi]`` (float64, ±inf allowed) with ``may``/``must`` NaN flags.

    Where ``must`` holds the value is NaN (``lo``/``hi`` are then 0 and meaningless); elsewhere it
    lies in ``[lo, hi]``, or is NaN where ``may`` holds.
    """

    lo: torch.Tensor
    hi: torch.Tensor
    may: torch.Tensor
    must: torch.Tensor


def _make(lo: torch.Tensor, hi: torch.Tensor, may: torch.Tensor, must: torch.Tensor) -> Interval:
    # float64 throughout (torch.where of Python numbers gives float32, and a 0-d float64 tensor
    # does not promote a float32 one).
    lo, hi, may, must = torch.broadcast_tensors(torch.as_tensor(lo).double(), torch.as_tensor(hi).double(), may, must)
    lo = torch.where(lo.isnan(), -math.inf, lo)
    hi = torch.where(hi.isnan(), math.inf, hi)
    may = may | must
    zero = torch.zeros((), dtype=torch.float64)
    return Interval(torch.where(must, zero, lo), torch.where(must, zero, hi), may, must)


def point(value: torch.Tensor) -> Interval:
    """The exact value ``value`` (float64; NaN entries are NaN)."""
    v = value.double()
    nan = v.isnan()
    return _make(v, v, nan, nan)


def _round_to(value: float | torch.Tensor, prec: Precision) -> torch.Tensor:
    """``value`` rounded to the compute type, as a backend receives a constant or a hyperparameter."""
    return torch.as_tensor(value, dtype=torch.float64).to(prec.dtype).double()


def _widen(iv: Interval, prec: Precision, k: float | torch.Tensor, absolute: float | torch.Tensor = 0.0) -> Interval:
    """``iv`` widened by a rounding error of ``k`` units of ``prec.u`` (relative) plus ``absolute``
    and one ``eta``, and opened to ±inf where it may leave the range.  A point zero stays exact: only
    an operation on exact operands can give it, and an exact zero is exact in any type."""
    rel = (torch.as_tensor(k, dtype=torch.float64) + 1.0) * prec.u
    extra = torch.as_tensor(absolute, dtype=torch.float64) + prec.eta
    lo = iv.lo - (rel * iv.lo.abs() + extra)
    hi = iv.hi + (rel * iv.hi.abs() + extra)
    zero = (iv.lo == 0) & (iv.hi == 0)
    lo, hi = torch.where(zero, iv.lo, lo), torch.where(zero, iv.hi, hi)
    lo = torch.where(iv.lo.isinf(), iv.lo, lo)
    hi = torch.where(iv.hi.isinf(), iv.hi, hi)
    return _range(Interval(lo, hi, iv.may, iv.must), prec)


def _range(iv: Interval, prec: Precision) -> Interval:
    """Open ``iv`` to ±inf where its values may round past ``prec.max`` (certainly, where all do)."""
    over = prec.max * (1 + 2 * prec.u)
    hi = torch.where(iv.hi > prec.max, math.inf, iv.hi)
    lo = torch.where(iv.lo < -prec.max, -math.inf, iv.lo)
    lo = torch.where(iv.lo > over, math.inf, lo)
    hi = torch.where(iv.hi < -over, -math.inf, hi)
    return _make(lo, hi, iv.may, iv.must)


def _hull(*candidates: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Elementwise (min, max) of candidate values, ignoring NaN candidates."""
    stack = torch.stack(torch.broadcast_tensors(*candidates))
    lo = torch.where(stack.isnan(), math.inf, stack).amin(0)
    hi = torch.where(stack.isnan(), -math.inf, stack).amax(0)
    return lo, hi


def hull(a: Interval, b: Interval) -> Interval:
    """The values either ``a`` or ``b`` allows: where two computations may give a result (NaN certain only
    where both are)."""
    # A certain NaN's ends (0) are no values: the other's ends stand where one is NaN for sure.
    a_lo, a_hi = torch.where(a.must, b.lo, a.lo), torch.where(a.must, b.hi, a.hi)
    b_lo, b_hi = torch.where(b.must, a.lo, b.lo), torch.where(b.must, a.hi, b.hi)
    return _make(torch.minimum(a_lo, b_lo), torch.maximum(a_hi, b_hi), a.may | b.may, a.must & b.must)


def _has(iv: Interval, value: float) -> torch.Tensor:
    """Whether ``value`` (0 or ±inf) lies in ``iv`` (not counting a certain NaN)."""
    return (iv.lo <= value) & (iv.hi >= value) & ~iv.must


def _is(iv: Interval, value: float) -> torch.Tensor:
    """Whether ``iv`` is exactly the non-NaN value ``value``."""
    return (iv.lo == value) & (iv.hi == value) & ~iv.may


# ---- operations -------------------------------------------------------------------------------


def _flushed(a: Interval, prec: Precision) -> Interval:
    """``a`` as an operation that may flush subnormal operands reads it: with 0 where it reaches
    below the smallest normal number in magnitude."""
    tiny = torch.finfo(prec.dtype).smallest_normal
    near = (a.lo < tiny) & (a.hi > -tiny)
    lo = torch.where(near, a.lo.clamp(max=0.0), a.lo)
    return _make(lo, torch.where(near, a.hi.clamp(min=0.0), a.hi), a.may, a.must)


def _add(a: Interval, b: Interval, prec: Precision) -> Interval:
    lo, hi = a.lo + b.lo, a.hi + b.hi
    inf_inf = (_has(a, math.inf) & _has(b, -math.inf)) | (_has(a, -math.inf) & _has(b, math.inf))
    both = (_is(a, math.inf) & _is(b, -math.inf)) | (_is(a, -math.inf) & _is(b, math.inf))
    return _widen(_make(lo, hi, a.may | b.may | inf_inf, a.must | b.must | both), prec, 1)


def _neg(a: Interval) -> Interval:
    return _make(-a.hi, -a.lo, a.may, a.must)


def mul(a: Interval, b: Interval, prec: Precision, k: float = 1) -> Interval:
    """a·b rounded once (``k`` units) in ``prec``'s type; NaN for 0·∞."""
    lo, hi = _hull(a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi)
    zero_inf = (_has(a, 0.0) & (_has(b, math.inf) | _has(b, -math.inf))) | (
        _has(b, 0.0) & (_has(a, math.inf) | _has(a, -math.inf))
    )
    certain = (_is(a, 0.0) & (_is(b, math.inf) | _is(b, -math.inf))) | (
        _is(b, 0.0) & (_is(a, math.inf) | _is(a, -math.inf))
    )
    return _widen(_make(lo, hi, a.may | b.may | zero_inf, a.must | b.must | certain), prec, k)


def _div(a: Interval, b: Interval, prec: Precision) -> Interval:
    lo, hi = _hull(a.lo / b.lo, a.lo / b.hi, a.hi / b.lo, a.hi / b.hi)
    spans_zero = (b.lo < 0) & (b.hi > 0)  # the quotient takes every sign and size
    lo = torch.where(spans_zero, -math.inf, lo)
    hi = torch.where(spans_zero, math.inf, hi)
    zero_zero = _has(a, 0.0) & _has(b, 0.0)
    inf_inf = (_has(a, math.inf) | _has(a, -math.inf)) & (_has(b, math.inf) | _has(b, -math.inf))
    certain = (_is(a, 0.0) & _is(b, 0.0)) | ((a.lo.isinf() & (a.lo == a.hi)) & (b.lo.isinf() & (b.lo == b.hi)))
    may = a.may | b.may | zero_zero | inf_inf
    return _widen(_make(lo, hi, may, a.must | b.must | (certain & ~a.may & ~b.may)), prec, 3)


def _abs(a: Interval) -> Interval:
    straddle = (a.lo < 0) & (a.hi > 0)
    lo = torch.where(straddle, 0.0, torch.minimum(a.lo.abs(), a.hi.abs()))
    return _make(lo, torch.maximum(a.lo.abs(), a.hi.abs()), a.may, a.must)


def _sqrt(a: Interval, prec: Precision) -> Interval:
    lo, hi = torch.sqrt(a.lo.clamp(min=0)), torch.sqrt(a.hi.clamp(min=0))
    negative = a.lo < 0
    return _widen(_make(lo, hi, a.may | negative, a.must | (a.hi < 0)), prec, 1)


def _exp(a: Interval, prec: Precision) -> Interval:
    # exp as ex2(a·log2 e): the product's rounding is a relative error of about |a|·u in the result
    # (2·|a| ulp for NVRTC's exp of a quotient with the reciprocal taken once).
    k = 4 + 2 * torch.maximum(a.lo.abs(), a.hi.abs()).clamp(max=1e6)
    return _widen(_make(torch.exp(a.lo), torch.exp(a.hi), a.may, a.must), prec, k)


def _log(a: Interval, prec: Precision) -> Interval:
    lo, hi = torch.log(a.lo.clamp(min=0)), torch.log(a.hi.clamp(min=0))
    # lg2.approx has an absolute error of about 2^-22 near 1, where the logarithm itself is small.
    absolute = 16 * prec.u
    return _widen(_make(lo, hi, a.may | (a.lo < 0), a.must | (a.hi < 0)), prec, 4, absolute)


def _pow(a: Interval, b: Interval, prec: Precision) -> Interval:
    """torch.pow on intervals.  Between its breakpoints (a = ±0, ±1; b = 0) pow is monotone in each
    argument, so the hull of its values at the corners and at the breakpoints inside the box covers
    it — for a negative base only with a point integer (or infinite) exponent; a negative base with
    an exponent that may be a non-integer may give NaN, and then anything else."""
    b_point = (b.lo == b.hi) & ~b.may
    b_int = b_point & ((torch.floor(b.lo) == b.lo) | b.lo.isinf())
    a_points = [a.lo, a.hi]
    for v in (0.0, -0.0, 1.0, -1.0):
        a_points.append(torch.where(_has(a, v), v, math.nan))
    b_points = [b.lo, b.hi, torch.where(_has(b, 0.0), 0.0, math.nan)]
    lo, hi = _hull(*(torch.pow(p, q) for p in a_points for q in b_points))
    negative = a.lo < 0
    wild = negative & ~b_point  # the exponent may be a non-integer: NaN, or any value
    lo, hi = torch.where(wild, -math.inf, lo), torch.where(wild, math.inf, hi)
    non_integer = b_point & ~b_int  # a negative base gives NaN
    one = _is(b, 0.0) | _is(a, 1.0)  # pow(x, 0) = pow(1, y) = 1, even for NaN x or y
    b_nonzero = (b.lo > 0) | (b.hi < 0) | b.must
    a_not_one = (a.lo > 1) | (a.hi < 1) | a.must
    must = (a.must & b_nonzero) | (b.must & a_not_one) | ((a.hi < 0) & (a.lo > -math.inf) & non_integer)
    may = must | (a.may & ~_is(b, 0.0)) | (b.may & ~_is(a, 1.0)) | (negative & (non_integer | wild))
    lo, hi = torch.where(one, 1.0, lo), torch.where(one, 1.0, hi)
    no = torch.zeros_like(may)
    may, must = torch.where(one, no, may), torch.where(one, no, must)
    # exp2(b·log2 a): the rounding of b·log2 a is a relative error of about |b·log2 a|·u, and the
    # absolute error of an approximate log2 (lg2.approx: 2^-22, about 4u) one of 4·|b|·u; table and
    # polynomial powers (NVRTC) stay within 64u.
    log_a = torch.maximum(torch.log2(a.lo.abs()).abs(), torch.log2(a.hi.abs()).abs())
    b_size = torch.maximum(b.lo.abs(), b.hi.abs())
    size = 2 * b_size * log_a + 8 * b_size
    size = torch.where(size.isfinite(), size, 0.0).clamp(max=1e6)
    return _widen(_make(lo, hi, may, must), prec, 64 + size)


def _minmax(a: Interval, b: Interval, fn) -> Interval:
    return _make(fn(a.lo, b.lo), fn(a.hi, b.hi), a.may | b.may, a.must | b.must)


def _sign(a: Interval) -> Interval:
    return _make(torch.sign(a.lo), torch.sign(a.hi), a.may, a.must)


def _compare(op: str, a: Interval, b: Interval) -> Interval:
    """1.0 or 0.0; NaN compares false except ``ne``.  Overlapping intervals may give either."""
    nan_possible, nan_certain = a.may | b.may, a.must | b.must
    if op in ("lt", "gt"):
        (a, b) = (a, b) if op == "lt" else (b, a)
        true, false = a.hi < b.lo, a.lo >= b.hi
    elif op in ("le", "ge"):
        (a, b) = (a, b) if op == "le" else (b, a)
        true, false = a.hi <= b.lo, a.lo > b.hi
    else:
        equal = (a.lo == a.hi) & (b.lo == b.hi) & (a.lo == b.lo)
        apart = (a.hi < b.lo) | (b.hi < a.lo)
        true, false = (equal, apart) if op == "eq" else (apart, equal)
    if op == "ne":  # NaN != anything is true
        true, false = (true & ~nan_possible) | nan_certain, false & ~nan_possible
    else:
        true, false = true & ~nan_possible, false | nan_certain
    lo = torch.where(true, 1.0, 0.0)
    hi = torch.where(false, 0.0, 1.0)
    no = torch.zeros_like(lo, dtype=torch.bool)
    return _make(lo, hi, no, no)


def _select(c: Interval, t: Interval, f: Interval) -> Interval:
    """``t`` where ``c ≠ 0`` (NaN included), ``f`` where ``c = 0``; the hull where unknown."""
    nonzero = (c.lo > 0) | (c.hi < 0) | c.must
    zero = (c.lo == 0) & (c.hi == 0) & ~c.may
    lo = torch.where(nonzero, t.lo, torch.where(zero, f.lo, torch.minimum(t.lo, f.lo)))
    hi = torch.where(nonzero, t.hi, torch.where(zero, f.hi, torch.maximum(t.hi, f.hi)))
    may = torch.where(nonzero, t.may, torch.where(zero, f.may, t.may | f.may))
    must = torch.where(nonzero, t.must, torch.where(zero, f.must, t.must & f.must))
    # Where the branch is unknown and one branch is a certain NaN, the hull is the other branch's.
    lo = torch.where(~nonzero & ~zero & t.must, f.lo, torch.where(~nonzero & ~zero & f.must, t.lo, lo))
    hi = torch.where(~nonzero & ~zero & t.must, f.hi, torch.where(~nonzero & ~zero & f.must, t.hi, hi))
    return _make(lo, hi, may, must)


def evaluate(expr: Expr, env: Mapping[str, Interval], prec: Precision) -> Interval:
    """The interval of ``expr`` computed in ``prec``'s type; ``env`` maps Var and Hyper names."""
    if isinstance(expr, Const):
        return point(_round_to(expr.value, prec))
    if isinstance(expr, (Var, Hyper)):
        return env[expr.name]
    assert isinstance(expr, Call)
    args = [evaluate(a, env, prec) for a in expr.args]
    if prec.flush:
        args = [_flushed(a, prec) for a in args]
    op = expr.op
    if op == "add":
        return _add(args[0], args[1], prec)
    if op == "sub":
        return _add(args[0], _neg(args[1]), prec)
    if op == "mul":
        return mul(args[0], args[1], prec)
    if op == "div":
        return _div(args[0], args[1], prec)
    if op == "neg":
        return _neg(args[0])
    if op == "abs":
        return _abs(args[0])
    if op == "sqrt":
        return _sqrt(args[0], prec)
    if op == "exp":
        return _exp(args[0], prec)
    if op == "log":
        return _log(args[0], prec)
    if op == "pow":
        return _pow(args[0], args[1], prec)
    if op == "min":
        return _minmax(args[0], args[1], torch.minimum)
    if op == "max":
        return _minmax(args[0], args[1], torch.maximum)
    if op == "sign":
        return _sign(args[0])
    if op == "select":
        return _select(*args)
    return _compare(op, args[0], args[1])


def reduce_terms(terms: Interval, reduction: str, prec: Precision, extra_rel: float = 0.0) -> Interval:
    """The reduction over the last dimension (``sum``, ``max``, ``min`` or ``logsumexp``; identities 0,
    −inf, +inf, −inf).

    A sum may round each partial sum: its error is at most (n + 1)·u·Σ|term| in any order of
    summation, plus ``eta`` per term; ``extra_rel`` adds a relative error of the sum of magnitudes
    (3×TF32 products, the tensor-core expansion of a squared distance).  A maximum or minimum is
    exact.  Log-sum-exp: see :func:`_logsumexp`.
    """
    n = terms.lo.shape[-1]
    may, must = terms.may.any(-1), terms.must.any(-1)
    if reduction == "logsumexp":
        return _logsumexp(terms, prec)
    if reduction == "sum":
        lo, hi = terms.lo.sum(-1), terms.hi.sum(-1)
        inf_inf = (terms.hi == math.inf).any(-1) & (terms.lo == -math.inf).any(-1)
        both = ((terms.lo == math.inf) & ~terms.may).any(-1) & ((terms.hi == -math.inf) & ~terms.may).any(-1)
        magnitude = torch.maximum(terms.lo.abs(), terms.hi.abs())
        magnitude = torch.where(magnitude.isfinite(), magnitude, 0.0).sum(-1)
        err = ((n + 2) * prec.u + extra_rel) * magnitude + n * prec.eta
        exact = (terms.lo == terms.hi).all(-1) & (terms.lo == 0).all(-1)  # every term an exact zero
        err = torch.where(exact, 0.0, err)
        lo = torch.where(lo.isinf(), lo, lo - err)
        hi = torch.where(hi.isinf(), hi, hi + err)
        # Partial sums may overflow although the total does not.
        big = magnitude > prec.max
        lo = torch.where(big, -math.inf, lo)
        hi = torch.where(big, math.inf, hi)
        return _range(_make(lo, hi, may | inf_inf, must | both), prec)
    if n == 0:
        value = torch.full(terms.lo.shape[:-1], -math.inf if reduction == "max" else math.inf, dtype=torch.float64)
        return point(value)
    fn = torch.amax if reduction == "max" else torch.amin
    return _make(fn(terms.lo, -1), fn(terms.hi, -1), may, must)


def _logsumexp(terms: Interval, prec: Precision) -> Interval:
    """``log Σ exp`` over the last dimension, with the values of ``torch.logsumexp`` (NaN if a term is NaN,
    +inf if one is +inf, −inf if all are −inf or there is none: no ``∞ − ∞``).

    It is increasing in every term, so its exact values over the terms' intervals lie between its values
    at their lower and at their upper ends, and ``max_j τ_j ≤ logsumexp ≤ max_j τ_j + log n``.  Computed
    pairwise, ``acc ⊕ t = max(acc, t) + log(1 + exp(−|acc − t|))``, one combine errs by the rounding of
    ``|acc − t|`` and of an approximate ``exp`` (a relative error of ``e = exp(−|acc − t|)`` of about
    ``(2|acc − t| + 4)·u``, at most ``5u`` absolute since ``x·e^−x ≤ 1/e``), of ``1 + e`` and of an
    approximate ``log`` (``lg2.approx``: about ``4u`` absolute near 1), so a few ``u`` absolute, and by the
    final addition, ``u·|acc ⊕ t|``; as ``torch.logsumexp``'s ``max + log Σ exp(τ − max)`` does, with
    ``n`` in place of the count of combines.  A combine's result moves by at most the larger of its
    operands' errors (its partial derivatives are non-negative and sum to 1), so the total is at most the
    sum over the ``n − 1`` combines: ``(n + 1)·(32 + 2·L)·u`` with ``L`` bounding every partial result
    (the largest finite end of a term, plus ``log n``), plus ``eta`` per term.  It is exact where at most
    one term can exceed −inf (a combine with −inf returns the other operand exactly).
    """
    n = terms.lo.shape[-1]
    may, must = terms.may.any(-1), terms.must.any(-1)
    # Certain-NaN terms have ends 0 (their result is NaN anyway); the others' ends are numbers or ±inf.
    lo, hi = torch.logsumexp(terms.lo, -1), torch.logsumexp(terms.hi, -1)
    ends = torch.cat((terms.lo, terms.hi), -1).abs()
    largest = torch.where(ends.isfinite(), ends, 0.0).amax(-1) if n else torch.zeros(lo.shape, dtype=torch.float64)
    err = (n + 1) * (32 + 2 * (largest + math.log(max(n, 1)))) * prec.u + n * prec.eta
    live = ((terms.hi > -math.inf) | terms.may).sum(-1)
    err = torch.where(live <= 1, 0.0, err)
    lo = torch.where(lo.isinf(), lo, lo - err)
    hi = torch.where(hi.isinf(), hi, hi + err)
    return _range(_make(lo, hi, may, must), prec)


def widen_output(iv: Interval, out: Precision) -> Interval:
    """``iv`` rounded to the output type (a no-op rounding for the compute type itself)."""
    return _widen(iv, out, 0)


def check(got: torch.Tensor, iv: Interval) -> torch.Tensor:
    """Mask of the elements of ``got`` that violate ``iv`` (NaN where not allowed, or outside)."""
    g = got.double().cpu()
    nan = g.isnan()
    inside = (g >= iv.lo) & (g <= iv.hi)
    ok = torch.where(iv.must, nan, torch.where(nan, iv.may, inside))
    return ~ok
