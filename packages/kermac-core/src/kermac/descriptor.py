"""Kernel descriptors: a structured, validated way to name a fused distance/kernel computation.

A [`KernelDescriptor`][kermac.descriptor.KernelDescriptor] chooses, for the pairwise program of
[`kermac.programs`][kermac.programs],

1. the **inner operation** on one coordinate pair: `"difference"` t = x − z or `"product"` t = x·z;
2. the **inner power** applied to t: `"abs"` |t|, `"square"` t², `"pow"` |t|ᵖ (p > 0),
   `"nonzero"` [t ≠ 0] (counts differing coordinates; NaN for a NaN t), `"identity"` t;
3. the **reduction** over the feature index k: `"sum"`, `"max"` or `"min"` (a maximum of
   |t| skips NaN differences, as torch.cdist's p = ∞ does; see `docs/formulas.md`);
4. the **outer power** giving the distance d from the reduced value s: `"identity"` d = s,
   `"sqrt"` d = √s, `"root"` d = s^(1/p);
5. an optional **kernel function** of d with bandwidth σ (see [`KERNEL_FUNCTIONS`][kermac.descriptor.KERNEL_FUNCTIONS]).

Regularisation (`K + λI` on a shifted diagonal) is not part of the descriptor: it is switched on
by passing `regularization=` to [`kermac.run_kernel`][kermac.run_kernel], and
[`KernelDescriptor.lower`][kermac.descriptor.KernelDescriptor.lower] adds it to the program.  Hyperparameters are named
`p`, `bandwidth` and `regularization`.

A NaN hyperparameter (what an invalid tensor value becomes, [`kermac.hyperparams`][kermac.hyperparams]) makes every
output of its batch entry NaN: the bandwidth divides the distance in every kernel function, and the
epilogue is wrapped in [`nan_where_nan`][kermac.hyperparams.nan_where_nan] for `p` (`pow(1, NaN) = 1`
would let it through) and for `λ` (read on the diagonal only), which leaves it unchanged for
every value that is not NaN.

Descriptors are frozen and hashable; [`KernelDescriptor.key`][kermac.descriptor.KernelDescriptor.key] is a canonical
string.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from functools import lru_cache

from kermac import ir
from kermac.hyperparams import nan_where_nan
from kermac.ir import Expr, Hyper, Var
from kermac.programs import L0_TERM, LINF_TERM, PairwiseProgram

__all__ = ["INNER_OPS", "INNER_POWERS", "KERNEL_FUNCTIONS", "OUTER_POWERS", "KernelDescriptor"]

INNER_OPS = ("difference", "product")
INNER_POWERS = ("abs", "square", "pow", "nonzero", "identity")
OUTER_POWERS = ("identity", "sqrt", "root")
REDUCTION_NAMES = ("sum", "max", "min")

P = Hyper("p")
BANDWIDTH = Hyper("bandwidth")
REGULARIZATION = Hyper("regularization")

_SQRT3 = math.sqrt(3.0)
_SQRT5 = math.sqrt(5.0)


def _laplace(d: Expr, d2: Expr) -> Expr:
    return ir.exp(-(d / BANDWIDTH))


def _gaussian(d: Expr, d2: Expr) -> Expr:
    return ir.exp(-(d2 / (2.0 * (BANDWIDTH * BANDWIDTH))))


def _matern32(d: Expr, d2: Expr) -> Expr:
    t = _SQRT3 * d / BANDWIDTH
    return (1.0 + t) * ir.exp(-t)


def _matern52(d: Expr, d2: Expr) -> Expr:
    t = _SQRT5 * d / BANDWIDTH
    return (1.0 + t + (5.0 / 3.0) * d2 / (BANDWIDTH * BANDWIDTH)) * ir.exp(-t)


def _cauchy(d: Expr, d2: Expr) -> Expr:
    return 1.0 / (1.0 + d2 / (BANDWIDTH * BANDWIDTH))


KERNEL_FUNCTIONS: dict[str, Callable[[Expr, Expr], Expr]] = {
    "laplace": _laplace,
    "gaussian": _gaussian,
    "matern32": _matern32,
    "matern52": _matern52,
    "cauchy": _cauchy,
}
"""Kernel function name → builder `f(d, d²) -> Expr`; each formula is in `docs/formulas.md`:
laplace e^(−d/σ); gaussian e^(−d²/(2σ²)); matern32 (1+√3d/σ)e^(−√3d/σ);
matern52 (1+√5d/σ+5d²/(3σ²))e^(−√5d/σ); cauchy 1/(1+d²/σ²).
"""


def _choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}: expected one of {', '.join(map(repr, allowed))}; got {value!r}")


@dataclass(frozen=True)
class KernelDescriptor:
    """What one fused pairwise pass computes; see the module documentation for each field."""

    inner: str = "difference"
    power: str = "abs"
    reduction: str = "sum"
    outer: str = "identity"
    kernel: str | None = None

    def __post_init__(self) -> None:
        _choice("inner", self.inner, INNER_OPS)
        _choice("power", self.power, INNER_POWERS)
        _choice("reduction", self.reduction, REDUCTION_NAMES)
        _choice("outer", self.outer, OUTER_POWERS)
        if self.kernel is not None:
            _choice("kernel", self.kernel, tuple(KERNEL_FUNCTIONS))
            if self.inner != "difference":
                raise ValueError(
                    f"kernel: a kernel function needs inner='difference' (a distance); got inner={self.inner!r}"
                )
        if self.power == "nonzero" and self.inner != "difference":
            raise ValueError(
                f"power: 'nonzero' counts differing coordinates and needs inner='difference'; got inner={self.inner!r}"
            )

    @property
    def needs_p(self) -> bool:
        """Whether the hyperparameter `p` must be given."""
        return self.power == "pow" or self.outer == "root"

    @property
    def needs_bandwidth(self) -> bool:
        """Whether the hyperparameter `bandwidth` must be given."""
        return self.kernel is not None

    def replace(self, **changes: object) -> KernelDescriptor:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    def key(self) -> str:
        """Canonical string naming this descriptor."""
        return ";".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))

    def lower(self, *, regularized: bool = False) -> PairwiseProgram:
        """The pairwise program of this descriptor (plus `+ λ·[on diagonal]` if `regularized`),
        NaN throughout for a NaN `p` or `λ` (see the module documentation).

        Built once per descriptor and flag (both immutable): repeated calls return the same program."""
        return _lowered(self, regularized)

    def _program(self, regularized: bool) -> PairwiseProgram:
        x, z, acc = Var("x"), Var("z"), Var("acc")
        t = x - z if self.inner == "difference" else x * z
        inner = {
            "abs": lambda: abs(t),
            "square": lambda: t * t,
            "pow": lambda: ir.pow(abs(t), P),
            "nonzero": lambda: L0_TERM,  # [t ≠ 0], NaN for a NaN t (torch.cdist's p = 0)
            "identity": lambda: t,
        }[self.power]()
        if inner == abs(t) and self.reduction == "max" and self.inner == "difference":
            inner = LINF_TERM  # torch.cdist's p = ∞ skips NaN differences

        if self.reduction == "max" and self.power != "identity":
            # Non-negative terms: an empty maximum (D = 0) is 0, as torch.cdist gives, not −∞.
            acc = ir.maximum(acc, 0.0)
        if self.outer == "identity":
            d, d2 = acc, acc * acc
        elif self.outer == "sqrt":
            d, d2 = ir.sqrt(acc), acc
        else:
            d, d2 = ir.pow(acc, 1.0 / P), ir.pow(acc, 2.0 / P)
        epilogue = d if self.kernel is None else KERNEL_FUNCTIONS[self.kernel](d, d2)
        if self.needs_p:
            epilogue = nan_where_nan(epilogue, P.name)
        if regularized:
            epilogue = nan_where_nan(epilogue + ir.select(Var("diag"), REGULARIZATION, 0.0), REGULARIZATION.name)
        return PairwiseProgram(inner=inner, reduction=self.reduction, epilogue=epilogue)


@lru_cache(maxsize=256)
def _lowered(descriptor: KernelDescriptor, regularized: bool) -> PairwiseProgram:
    return descriptor._program(regularized)
