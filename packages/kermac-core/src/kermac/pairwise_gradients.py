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
([`term_weights`][kermac.reductions.term_weights], from the reduction's entry in
[`kermac.reductions.ALL`][kermac.reductions.ALL]).

Where the weights are all 1 (a sum) the sum over `n` is the gradient contraction of
[`kermac.programs.GradProgram`][kermac.programs.GradProgram] with `O = 1`, `c = 1`,
`a[n, m] = g[m, n]·e'(acc[m, n])`, `b = zᵀ`, `d = xᵀ` and the multiply `τ_x(d, b)`
([`contraction_program`][kermac.pairwise_gradients.contraction_program]), which every backend runs in its
fused gradient kernel; [`kermac.autograd`][kermac.autograd] evaluates other weights (a maximum's) with torch
operations on bounded blocks, and states the values at special points.
"""

from __future__ import annotations

from functools import cache

from kermac import ir
from kermac.ir import Var
from kermac.programs import GradProgram, PairwiseProgram, inner_slope, swap_operands

__all__ = ["contraction_program", "point_slope"]


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
