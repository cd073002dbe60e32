r"""The reductions of pairwise programs, as semirings: the one place their facts live.

A pairwise program ([`kermac.programs.PairwiseProgram`][kermac.programs.PairwiseProgram]) reduces its inner terms
over the feature index `j`, `acc = ⊕_j τ_j`, with one of these reductions:

| name | `⊕` | identity (`D = 0`) | combine `acc ⊕ t` |
|---|---|---|---|
| `sum` | Σ | 0 | `acc + t` |
| `max` | max (NaN propagates) | −∞ | `max(acc, t)` |
| `min` | min (NaN propagates) | +∞ | `min(acc, t)` |
| `logsumexp` | log Σ exp | −∞ | `logaddexp(acc, t)` |

`logsumexp` gives soft maxima and minima: `γ·logsumexp_j(τ_j/γ)` tends to `max_j τ_j` as `γ → 0`, and the
soft minimum is `−γ·logsumexp_j(−τ_j/γ)` (an inner term `−τ/γ`, an epilogue `−γ·acc`).  Its combine is the
stable `logaddexp(a, t) = max(a, t) + log(1 + exp(−|a − t|))`, `a + log 2` where `a = t` (so `+∞ ⊕ +∞ = +∞`
and `−∞ ⊕ −∞ = −∞` instead of the `∞ − ∞` of the general form).  Its values are those of `torch.logsumexp`:
NaN if a term is NaN, +∞ if a term is +∞ (and none is NaN), −∞ if every term is −∞ or there is none.  The
rounding of `log(1 + e)` errs by at most about half a unit in the last place of 1 per combined term, as
`torch.logsumexp`'s `log Σ exp(τ − max)` does (an absolute error, not relative to a result near 0).

Every backend reads a reduction's facts from [`ALL`][kermac.reductions.ALL]:

* `identity`: the value of an empty reduction and of a masked-off (padded) term;
* `combine`: the rule as IR ([`kermac.ir`][kermac.ir]) over `acc` (the value so far) and `t` (a term, or the
  reduction of a block of terms: the rule must be associative and commutative, which lets a backend
  reduce blocks of features in any order).  Code-generating backends render it as they render inner
  terms; the reference backend uses `reference`, a torch function reducing one dimension with the same
  values;
* `weight`: the derivative `∂acc/∂τ_j` as IR over `acc` and `t = τ_j` (with `normalized`, divided by its
  sum over `j`: the subgradient of a maximum or minimum shares the gradient equally among tied terms);
  what automatic differentiation multiplies each term's derivative by.  [`term_weights`][kermac.reductions.term_weights]
  evaluates it on a block of terms;
* `nonnegative`: non-negative terms reduce to a non-negative value, the empty reduction included (a
  backend may then compute powers of `acc` without the negative-base cases);
* `sum_fast_paths`: the reduction is the arithmetic sum, so the paths that rewrite a sum of terms apply
  (the tensor-core expansion of `Σ (x − z)²`, the split powers of `Σ |x − z|^p`, the sum-specific
  derivatives); every other reduction runs the generic SIMT kernels.

The kernel product `K @ v` ([`kermac.kernel_product`][kermac.kernel_product]) allows every reduction: its K tiles
are the pairwise kernel's, whatever the reduction over features.  So does its gradient in the points
(`kermac.problem.ProductGradProblem`), which weighs each feature's `∂τ/∂x_j` by `weight` (by 1 for the sum).

Adding a reduction: one [`Reduction`][kermac.reductions.Reduction] entry in `ALL`, whose `combine` uses only
[`kermac.ir.OPS`][kermac.ir.OPS] and is associative and commutative with `identity` as its neutral element; a
`reference` torch function with the same values on special values (NaN, ±∞, empty); its `weight`; then the
conformance cases of [`kermac.testing`][kermac.testing] and a differential test against an independent float64
formula.  Backends need no change: they render `combine` and `weight` and read `identity` (a backend with its own
table of reductions, such as a third-party one, refuses a name it lacks).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch

from kermac import ir
from kermac.ir import Expr, Var, free_vars
from kermac.ir_eval import evaluate

__all__ = ["ALL", "COMBINE_VARS", "Reduction", "term_weights"]

COMBINE_VARS = frozenset({"acc", "t"})
"""The variables of a reduction's `combine` and `weight`: the value so far (or the reduced value) and a term."""

_ACC, _T = Var("acc"), Var("t")


@dataclass(frozen=True)
class Reduction:
    """One reduction over features and its facts (see the module docs).

    Attributes:
        name: the name a program gives (`PairwiseProgram.reduction`).
        noun: what messages call it ("sum", "maximum", ...).
        identity: the value of the empty reduction, neutral for `combine`.
        combine: `acc ⊕ t` in IR over `acc` and `t`.
        reference: a torch function `f(terms, dim)` reducing dimension `dim` with `combine`'s values.
        weight: `∂acc/∂τ_j` in IR over `acc` and `t` (before normalisation).
        normalized: whether the weights are divided by their sum over the terms.
        nonnegative: whether non-negative terms (and no term) reduce to a non-negative value.
        sum_fast_paths: whether the reduction is the arithmetic sum the sum-specific paths rewrite.
    """

    name: str
    noun: str
    identity: float
    combine: Expr
    reference: Callable[[torch.Tensor, int], torch.Tensor]
    weight: Expr
    normalized: bool
    nonnegative: bool
    sum_fast_paths: bool = False

    def __post_init__(self) -> None:
        for what in ("combine", "weight"):
            expr = getattr(self, what)
            if not isinstance(expr, Expr):
                raise TypeError(f"{what}: expected a kermac.ir.Expr, got {type(expr).__name__}")
            extra = free_vars(expr) - COMBINE_VARS
            if extra:
                raise ValueError(f"{what}: may use variables {sorted(COMBINE_VARS)}, got unknown {sorted(extra)}")
            if ir.hyper_names(expr):
                raise ValueError(f"{what}: may not read hyperparameters, got {sorted(ir.hyper_names(expr))}")


_LOGADDEXP = ir.select(
    ir.eq(_ACC, _T),
    _ACC + math.log(2.0),
    ir.maximum(_ACC, _T) + ir.log(1.0 + ir.exp(-abs(_ACC - _T))),
)
"""`logaddexp(acc, t)`: stable, and `acc + log 2` where `acc = t` (equal infinities stay infinite)."""
_TIED = ir.eq(_T, _ACC)
"""The weight of a maximum's or minimum's term before normalisation: 1 where it attains the extreme."""

ALL: Mapping[str, Reduction] = MappingProxyType(
    {
        "sum": Reduction(
            "sum",
            "sum",
            0.0,
            _ACC + _T,
            torch.sum,
            ir.Const(1.0),
            normalized=False,
            nonnegative=True,
            sum_fast_paths=True,
        ),
        "max": Reduction(
            "max", "maximum", -math.inf, ir.maximum(_ACC, _T), torch.amax, _TIED, normalized=True, nonnegative=False
        ),
        "min": Reduction(
            "min", "minimum", math.inf, ir.minimum(_ACC, _T), torch.amin, _TIED, normalized=True, nonnegative=True
        ),
        "logsumexp": Reduction(
            "logsumexp",
            "log-sum-exp",
            -math.inf,
            _LOGADDEXP,
            torch.logsumexp,
            ir.exp(_T - _ACC),
            normalized=False,
            nonnegative=False,
        ),
    }
)
"""Reduction name → its [`Reduction`][kermac.reductions.Reduction]: every reduction a program may name."""


def term_weights(reduction: str, terms: torch.Tensor) -> torch.Tensor:
    """`∂acc/∂τ_j` for `acc` the reduction of `terms` over their last dimension, in `terms`' shape and dtype.

    A sum gives 1; a maximum or minimum `1/k` on the `k` terms equal to it and 0 elsewhere (NaN for a NaN
    extreme); log-sum-exp `exp(τ_j − acc)`, the softmax of the terms (as `torch.logsumexp`'s backward: NaN
    where `acc` is infinite).
    """
    spec = ALL[reduction]
    if terms.shape[-1] == 0:
        return terms.clone()
    acc = spec.reference(terms, -1).unsqueeze(-1)
    weight = evaluate(spec.weight, {"acc": acc, "t": terms}, like=terms).expand(terms.shape)
    return weight / weight.sum(-1, keepdim=True) if spec.normalized else weight
