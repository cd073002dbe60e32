r"""The pieces of the symbolic derivative of any pairwise program in its points.

A pairwise program ([`kermac.programs`][kermac.programs]) computes `out[m, n] = e(acc[m, n], diag)` with
`acc[m, n] = ⊕_j τ(x[m, j], z[n, j])`.  For an upstream gradient `g = ∂L/∂out` the chain rule gives

$$
\frac{\partial L}{\partial x[m, j]} = \sum_n g[m, n]\; e'(\mathrm{acc}[m, n])\; w_j(m, n)\;
\tau_x(x[m, j], z[n, j]),
$$

and likewise for `z` with `τ_z`, summed over `m`: `e'` is the epilogue's symbolic derivative
([`epilogue_slope`][kermac.programs.epilogue_slope]), `τ_x` the inner term's
([`inner_slope`][kermac.programs.inner_slope]; `τ_z` is `τ_x` of the program with its operands swapped,
[`swap_operands`][kermac.programs.swap_operands]) and `w_j = ∂acc/∂τ_j` the reduction's weight
([`REDUCTION_WEIGHTS`][kermac.pairwise_gradients.REDUCTION_WEIGHTS]).

Where the weights are all 1 (a sum) the sum over `n` is the gradient contraction of
[`kermac.programs.GradProgram`][kermac.programs.GradProgram] with `O = 1`, `c = 1`,
`a[n, m] = g[m, n]·e'(acc[m, n])`, `b = zᵀ`, `d = xᵀ` and the multiply `τ_x(d, b)`
([`contraction_program`][kermac.pairwise_gradients.contraction_program]), which every backend runs in its
fused gradient kernel; [`kermac.autograd`][kermac.autograd] evaluates other weights (a maximum's) with torch
operations on bounded blocks, and states the values at special points.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import torch

from kermac import ir
from kermac.ir import Var
from kermac.programs import GradProgram, PairwiseProgram, inner_slope, swap_operands

__all__ = ["REDUCTION_WEIGHTS", "Weights", "contraction_program", "point_slope", "reduction_weights"]

Weights = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""`w(τ, acc)`: the weights `∂acc/∂τ_j` of the terms `τ[..., D]` of a pair whose reduction is `acc[..., 1]`."""


def _extreme_weights(tau: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
    """`1/k` on the `k` terms equal to the extreme `acc`, 0 elsewhere: a subgradient of a maximum or minimum
    (shared among ties, so the weights sum to 1); NaN where `acc` is NaN (no term equals it)."""
    active = (tau == acc).to(tau.dtype)
    return active / active.sum(-1, keepdim=True)


REDUCTION_WEIGHTS: dict[str, Weights | None] = {"sum": None, "max": _extreme_weights, "min": _extreme_weights}
"""Reduction name → its weights `∂acc/∂τ_j` (`None`: all 1, the fused contraction).

A reduction added to [`REDUCTIONS`][kermac.programs.REDUCTIONS] becomes differentiable by adding its
weights here, a function of the pair's terms and of its reduction: log-sum-exp's are `exp(τ_j − acc)`, the
softmax of the terms.  A reduction missing here is refused by
[`reduction_weights`][kermac.pairwise_gradients.reduction_weights], never differentiated to zero.
"""


def reduction_weights(reduction: str) -> Weights | None:
    """The weights of `reduction` ([`REDUCTION_WEIGHTS`][kermac.pairwise_gradients.REDUCTION_WEIGHTS]); raises
    `NotImplementedError` for a reduction that has none."""
    try:
        return REDUCTION_WEIGHTS[reduction]
    except KeyError:
        raise NotImplementedError(
            f"the reduction {reduction!r} has no derivative (kermac.pairwise_gradients.REDUCTION_WEIGHTS lists "
            f"{sorted(REDUCTION_WEIGHTS)})"
        ) from None


def point_slope(program: PairwiseProgram, wrt: str) -> ir.Expr:
    """`∂τ/∂x(x, z)` (`wrt = "x"`) or `∂τ/∂z` written in the swapped roles, `∂τ/∂z(x = z, z = x)`
    (`wrt = "z"`): the derivative in the operand whose gradient is summed, read as `x`, with the other as `z`.

    Raises `ValueError` for an inner term [`kermac.ir_diff`][kermac.ir_diff] has no rule for."""
    if wrt not in ("x", "z"):
        raise ValueError(f"wrt: expected 'x' or 'z', got {wrt!r}")
    return inner_slope(program if wrt == "x" else swap_operands(program))


@cache
def contraction_program(program: PairwiseProgram, wrt: str) -> GradProgram:
    """The gradient program whose contraction sums the derivative of `program`'s terms in `wrt` (`"x"` or `"z"`):
    `multiply(d, b) = h(d, b)` with `h` [`point_slope`][kermac.pairwise_gradients.point_slope], `d` the operand
    differentiated and `b` the other, and the epilogue `acc`."""
    return GradProgram(ir.substitute(point_slope(program, wrt), {"x": Var("d"), "z": Var("b")}), Var("acc"))
