r"""Autograd of kermac's operations, registered on the custom operations of [`kermac.ops`][kermac.ops].

`cdist`, `run_kernel` and `run_program` (the `kermac::pairwise` operation) are differentiable in
`x` and `z`; `cdist_grad` (`kermac::grad`) with p = 2 in all four inputs.  Each backward is built
from kermac's operations and torch operations only, so it is itself differentiable where its pieces
are, and a trace (`torch.compile`) records it like any other.

A pairwise program computes `out[m, n] = e(acc[m, n], diag)` with `acc = ⊕_j τ(x[m, j], z[n, j])`.
For the inner terms with a dedicated route — `τ = |x − z|^P` (P a number or the hyperparameter
`p`; `|x − z|` and `(x − z)²` are P = 1 and 2) and, under a sum, `τ = x·z` — and an upstream
gradient `g = ∂L/∂out`:

$$
G = g \cdot e'(\mathrm{acc}),\qquad
\frac{\partial L}{\partial x[m, j]} = \sum_n G[m, n]\, w[m, n, j]\, P\, \operatorname{sgn}(t)\, |t|^{P-1},\qquad
\frac{\partial L}{\partial z[n, j]} = -\sum_m G[m, n]\, w[m, n, j]\, P\, \operatorname{sgn}(t)\, |t|^{P-1}
$$

with `t = x[m, j] − z[n, j]` and the term 0 where `t = 0` (for `x·z`: `∂L/∂x = G z`,
`∂L/∂z = Gᵀ x`).  `G` is 0 where `acc = 0` for `|x − z|^P` terms (the subgradient torch.cdist
takes at zero distance, where `e'` may be infinite).  The weight `w` is 1 for a sum; for a
maximum or minimum (`cdist` with p = ∞) it is `1/k` on the `k` coordinates whose `τ` attains
the extreme and 0 elsewhere: a subgradient (torch.cdist gives each tied coordinate the whole
gradient, which is not one; away from ties the two agree), NaN for a pair whose extreme is NaN
(`cdist`'s p = ∞ skips NaN differences, so a NaN coordinate there gets no gradient); for a log-sum-exp
it is `exp(τ_j − acc)`, the softmax of the pair's terms ([`term_weights`][kermac.reductions.term_weights]).

* `e'(acc)` is the epilogue's symbolic derivative ([`kermac.ir_diff.derivative`][kermac.ir_diff.derivative])
  evaluated with torch operations ([`kermac.ir_eval.evaluate`][kermac.ir_eval.evaluate]); when the epilogue is
  `acc` itself nothing is recomputed, otherwise `acc` is recomputed by one fused pass of the program
  without its epilogue.
* For a sum, each sum over `n` (or `m`) is [`kermac.cdist_grad`][kermac.cdist_grad] with `O = 1`, `c = 1`:
  `a = Gᵀ [N, M]`, `b = zᵀ`, `d = xᵀ` → `[1, D, M]` for x; `a = G`, `b = xᵀ`, `d = zᵀ`
  for z — on the same backend as the forward, never building `[M, N, D]`.
* For a maximum, minimum or log-sum-exp the weights need every coordinate of a pair at once: torch operations on
  blocks of at most `CHUNK_ELEMENTS` `(m, n, j)` elements (the
  documented workspace of this backward), not a fused kernel.
* A count (L0, `cdist` with p = 0) has zero gradient.

Every other program — any inner term and epilogue built from the operations
[`kermac.ir_diff`][kermac.ir_diff] differentiates (all of [`kermac.ir`][kermac.ir]'s), any reduction
of [`kermac.reductions`][kermac.reductions] (each has its weights `∂acc/∂τ_j`) — is
differentiated symbolically ([`kermac.pairwise_gradients`][kermac.pairwise_gradients]):

$$
G = g \cdot e'(\mathrm{acc}),\qquad
\frac{\partial L}{\partial x[m, j]} = \sum_n G[m, n]\, w[m, n, j]\, \tau_x(x[m, j], z[n, j]),\qquad
\frac{\partial L}{\partial z[n, j]} = \sum_m G[m, n]\, w[m, n, j]\, \tau_z(x[m, j], z[n, j])
$$

with `τ_x`, `τ_z` the inner term's symbolic derivatives and `w` the reduction's weights (as above: 1 for a
sum, `1/k` on the `k` terms attaining a maximum or minimum).  Values at special points are those of
[`kermac.ir_diff`][kermac.ir_diff] (torch's), except that `G` is 0 where `e'(acc)` is infinite (`√acc`,
`acc^{1/p}` or `log acc` at `acc = 0`, an overflowing `exp`): the subgradient torch.cdist takes at zero
distance, exact where every `τ_x` of the pair is 0 there (a point paired with itself), 0 also where it is not.
A NaN `e'` (the epilogue outside its domain) or a NaN term gives NaN.  An epilogue or inner term constant in
the points has zero gradient.

* For a sum, each sum over `n` (or `m`) is one fused gradient contraction (`kermac::grad`) of the generated
  program [`contraction_program`][kermac.pairwise_gradients.contraction_program] (multiply `τ_x(d, b)`) with
  `a = Gᵀ`, `b = zᵀ`, `c = 1`, `d = xᵀ` (and `a = G`, `b = xᵀ`, `d = zᵀ` with `τ_z` for z), on the forward's
  backend; `G` takes the fused pass for `acc` unless `e'` is a number.
* For a maximum or minimum: torch operations on blocks of at most `CHUNK_ELEMENTS` `(m, n, j)` elements, as
  above.
* First derivatives only: differentiating them again raises `NotImplementedError` naming the program.  A
  reduction without weights raises `NotImplementedError` naming it and the program when the backward runs.

Derivatives of any order (`create_graph=True`) are exact for `Σ (x − z)²` programs (cdist p = 2,
squared distances, Gaussian, Laplace-L2, Matérn, Cauchy) and `x·z` programs, any epilogue: the
backward is built from the fused pass (`acc`), the epilogue's derivative in torch operations, matrix
products and `cdist_grad` with p = 2, whose own backward is a few matrix products.  For every other
program the gradients carry a `grad_fn` that raises `NotImplementedError` naming the program when
differentiated (the operation `kermac::first_order_only`) — never a silent zero.

The fused product `out[m, c] = Σ_n K[m, n] v[n, c]` (`kermac::product`,
[`kermac.kernel_product`][kermac.kernel_product]) is differentiated without building K:

* `∂L/∂v = Kᵀ g`: the product of the program with its operands swapped
  ([`swap_operands`][kermac.programs.swap_operands]) on `(z, x)` and `g`, for every program.
* For programs summing `(x − z)²` (with `k = e(acc, diag)`, `acc = ‖x_m − z_n‖²`), with
  `E[m, n] = e'(acc)` (0 where `acc = 0`, where `x_m − z_n = 0`):
  `∂L/∂x[m, j] = 2 Σ_n E[m, n] (g_m·v_n)(x[m, j] − z[n, j])`
  `= 2 (x[m, j] Σ_c g[m, c] (E v)[m, c] − Σ_c g[m, c] (E W)[m, c, j])` with `W[n, c, j] = v[n, c] z[n, j]`,
  one product of the derivative program `(inner, e')` with the `C + C·D` columns `[v, W]`; `∂L/∂z`
  likewise from one transposed product with `[g, U]`, `U[m, c, j] = g[m, c] x[m, j]`.  These are
  products too, so derivatives of any order follow.
* For every other program (Laplace-L1, the Lp kernels, `x·z`, the l∞ distance, soft minima, user programs with
  any reduction), `∂L/∂x[m, j] = Σ_n (g_m·v_n) e'(acc[m, n]) w_j(m, n) ∂τ/∂x(x[m, j], z[n, j])` is one
  gradient product (`kermac::product_grad`, `kermac.problem.ProductGradProblem`: `e'` and `∂τ/∂x`
  symbolic, `w_j` the reduction's weights as above, the term 0 where `∂τ/∂x = 0` or `w_j = 0`, as
  torch.cdist's subgradient at `x = z`), and `∂L/∂z` the same on the swapped program with `(z, x)` and `v`, `g`
  exchanged.  First derivatives only: differentiating these again raises `NotImplementedError` naming the
  program.

Hyperparameters are constants (a tensor that requires grad is refused by [`kermac.hyperparams`][kermac.hyperparams]);
`out=` is refused while autograd records.  `cdist_grad` with p ≠ 2 and `run_grad_program` raise
`NotImplementedError` when their backward runs.  Broadcast batches are summed back to each input's shape.

`cdist_grad` with p = 2 is the bilinear `out[o, n, m] = d[n, m]·(c a)[o, m] − Σ_k c[o, k] a[k, m] b[n, k]`;
its backward is that formula's matrix products in the compute type.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache

import torch

from kermac import ir, ops
from kermac.hyperparams import HyperValue
from kermac.ir_eval import evaluate
from kermac.jacobians import product_jacobian
from kermac.lowering import grad_program
from kermac.pairwise_gradients import contraction_program, point_slope
from kermac.problem import compute_dtype, diagonal_offsets
from kermac.programs import (
    GradProgram,
    PairwiseProgram,
    epilogue_slope,
    inner_difference_power,
    is_product_sum,
    is_squared_difference_sum,
    program_from_key,
    slope_program,
    swap_operands,
)
from kermac.reductions import ALL as REDUCTIONS
from kermac.reference.backend import blocks, hyper_env, pair_weights, tile

__all__ = ["inner_power"]

DOT = "dot"


def inner_power(program: PairwiseProgram) -> float | str | None:
    """`P` of a program reducing `|x − z|^P` (a number, or `"p"` for `Hyper("p")`), `0.0` for a
    count of differing coordinates, `"dot"` for `Σ x·z`, or `None` for any other program (which
    autograd differentiates symbolically): the shapes with a dedicated backward.

    Decided on the normal form of the inner term ([`kermac.canonical`][kermac.canonical]), as the backends' fast
    paths are.
    """
    if is_product_sum(program):
        return DOT
    exponent = inner_difference_power(program)
    if isinstance(exponent, ir.Const):
        return float(exponent.value)  # 0 for a count of differing coordinates (L0): zero gradient
    if exponent == ir.Hyper("p"):
        return "p"
    return None


@dataclass(frozen=True)
class _Setup:
    """What the forward of `kermac::pairwise` ran, kept for the backward."""

    program: PairwiseProgram
    hypers: dict[str, HyperValue]
    offset_m: int
    offset_n: int
    backend: str
    debug: bool
    op: str

    @property
    def power(self) -> float | str | None:
        return inner_power(self.program)

    def inner_only(self) -> _Setup:
        """This setup for the program without its epilogue (`out = acc`)."""
        program = _inner_only(self.program)
        return replace(self, program=program, hypers={n: self.hypers[n] for n in program.hypers})


@cache
def _inner_only(program: PairwiseProgram) -> PairwiseProgram:
    return PairwiseProgram(program.inner, program.reduction, ir.Var("acc"))


def _setup_pairwise(ctx, inputs, output) -> None:
    x, z, program, names, numbers, tensors, offset_m, offset_n, backend, debug, op = inputs
    # Tensor hyperparameters are saved too: torch then refuses a backward after one was changed in place.
    ctx.save_for_backward(x, z, *(t for t in tensors if t is not None))
    ctx.call = (program, names, list(numbers), [t is not None for t in tensors], offset_m, offset_n, backend, debug, op)
    ctx.list_grads = _no_list_grads(numbers, tensors)


def _backward_pairwise(ctx, g):
    x, z, *saved = ctx.saved_tensors
    program, names, numbers, present, offset_m, offset_n, backend, debug, op = ctx.call
    found = iter(saved)
    tensors = [next(found) if p else None for p in present]
    hypers = ops.hypers_from_args(names, numbers, tensors)
    s = _Setup(program_from_key(program), hypers, offset_m, offset_n, backend, debug, op)
    grad_x, grad_z = _gradients(s, x, z, g, tuple(ctx.needs_input_grad[:2]))
    return grad_x, grad_z, None, None, *ctx.list_grads, None, None, None, None, None


def _gradients(
    s: _Setup, x: torch.Tensor, z: torch.Tensor, g: torch.Tensor, want: tuple[bool, bool]
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The first derivatives `(∂L/∂x, ∂L/∂z)` (`None` where not wanted)."""
    want_x, want_z = want
    power = s.power
    if power is None:
        grad_x, grad_z = _symbolic_gradients(s, x, z, g, want)
    else:
        grad_x, grad_z = _power_gradients(s, x, z, g, want, power)
    grad_x = grad_x.to(x.dtype).sum_to_size(x.shape) if want_x else None
    grad_z = grad_z.to(z.dtype).sum_to_size(z.shape) if want_z else None
    return grad_x, grad_z


def _power_gradients(
    s: _Setup, x: torch.Tensor, z: torch.Tensor, g: torch.Tensor, want: tuple[bool, bool], power: float | str
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The first derivatives of a program reducing `|x − z|^P` or summing `x·z` (`power` is `inner_power`),
    with the batch shape of `g`."""
    want_x, want_z = want
    if power == 0.0:
        return torch.zeros_like(x) if want_x else None, torch.zeros_like(z) if want_z else None
    G = _outer_factor(s, x, z, g)
    if power == DOT:
        return (G @ z.to(G.dtype) if want_x else None), (G.mT @ x.to(G.dtype) if want_z else None)
    p = s.hypers["p"] if power == "p" else HyperValue("p", power)
    if s.program.reduction != "sum":
        grad_x, grad_z = _blockwise_gradients(s, x, z, G, _power_slopes(p), want)
        what = f"program {s.program.key()} (a {REDUCTIONS[s.program.reduction].noun} over coordinates)"
        return _first_order(s, what, grad_x), _first_order(s, what, grad_z)
    G = G * (p.scalar if p.tensor is None else p.tensor[..., None, None].to(G.dtype))
    if 0 in G.stride():  # an expanded upstream gradient (e.g. from .sum())
        G = G.contiguous()
    program = grad_program(p.scalar)
    return (_contract(G.mT, z, x, program, {"p": p}, s) if want_x else None), (
        _contract(G, x, z, program, {"p": p}, s) if want_z else None
    )


def _symbolic_gradients(
    s: _Setup, x: torch.Tensor, z: torch.Tensor, g: torch.Tensor, want: tuple[bool, bool]
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The first derivatives of any other program from the symbolic derivatives of its inner term and epilogue
    (module docstring), with the batch shape of `g`; refusing gradients (`kermac::no_gradient`) for a program
    without one."""
    want_x, want_z = want
    program = s.program
    try:
        slopes = point_slope(program, "x"), point_slope(program, "z")
    except ValueError as exc:
        reason = f"{s.op}: program {program.key()} cannot be differentiated: {exc}"
        return (_no_gradient(x, reason) if want_x else None), (_no_gradient(z, reason) if want_z else None)
    zero = ir.Const(0.0)
    constant = epilogue_slope(program) == zero
    # Where the output does not move with an input (an epilogue constant in acc, terms constant in it): zeros.
    moving = tuple(w and not constant and slope != zero for w, slope in zip(want, slopes, strict=True))
    if not any(moving):
        return (torch.zeros_like(x) if want_x else None), (torch.zeros_like(z) if want_z else None)
    G = _symbolic_outer_factor(g, _epilogue_derivative(s, x, z))
    if REDUCTIONS[program.reduction].sum_fast_paths:  # weights all 1: the fused contraction
        grads = (
            _sum_gradient(s, "x", G, z, x) if moving[0] else None,
            _sum_gradient(s, "z", G.mT, x, z) if moving[1] else None,
        )
    else:
        grads = _blockwise_gradients(s, x, z, G, _symbolic_slopes(slopes), moving)
    what = f"program {program.key()}"
    grad_x, grad_z = (
        _first_order(s, what, grad) if grad is not None else torch.zeros_like(own) if wanted else None
        for grad, own, wanted in zip(grads, (x, z), want, strict=True)
    )
    return grad_x, grad_z


def _first_order(s: _Setup, what: str, grad: torch.Tensor | None) -> torch.Tensor | None:
    """`grad`, whose own derivative raises `NotImplementedError` naming `what` where this backward records
    (`create_graph=True`)."""
    if grad is None or not torch.is_grad_enabled():
        return grad
    return torch.ops.kermac.first_order_only(grad, _first_order_only(s.op, what))


def _no_list_grads(*lists: list) -> tuple[list[None] | None, ...]:
    """The (absent) gradients of an operation's list arguments, in the structure `torch.library`
    expects: a list whose entries are all tensors (an empty one too) gets one `None` per entry,
    any other list a single `None`."""
    return tuple([None] * len(v) if all(isinstance(t, torch.Tensor) for t in v) else None for v in lists)


def _first_order_only(op: str, what: str) -> str:
    """Why `what` cannot be differentiated again."""
    return (
        f"{op}: second derivatives are implemented for programs summing (x − z)² (cdist p = 2, Gaussian, "
        f"Laplace-L2, Matérn, Cauchy) or x·z; {what} has first derivatives only"
    )


def _no_gradient(like: torch.Tensor, reason: str) -> torch.Tensor:
    """A gradient that raises `NotImplementedError(reason)` when it is computed."""
    return torch.ops.kermac.no_gradient(like, reason)


def _outer_factor(s: _Setup, x: torch.Tensor, z: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """`G = g · e'(acc)` (0 where `acc = 0` for `|x − z|^P` terms); `[..., M, N]` in the inputs' dtype.

    A differentiable function of `g`, `x` and `z` where grad mode is on (a `create_graph` backward)."""
    program = s.program
    if program.epilogue == ir.Var("acc"):
        return g
    slope = epilogue_slope(program)
    acc = _accumulated(s, x, z)
    if slope == ir.Const(0.0):  # the epilogue does not depend on acc
        return torch.zeros_like(acc)
    cdtype = compute_dtype(acc.dtype)
    a = acc.to(cdtype)
    zero = a == 0 if s.power != DOT else None  # every t = 0: the inner derivative is 0, e' may be infinite
    safe = a if zero is None else torch.where(zero, torch.ones((), dtype=cdtype, device=a.device), a)
    G = g.to(cdtype) * _slope_values(s, slope, safe)
    if zero is not None:
        G = torch.where(zero, torch.zeros((), dtype=cdtype, device=G.device), G)
    return G.to(x.dtype)


def _accumulated(s: _Setup, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """`acc` of the forward: one fused pass of the program without its epilogue, `[..., M, N]`."""
    inner = s.inner_only()
    return ops.pairwise(inner.program.key(), x, z, inner.hypers, backend=s.backend, debug=s.debug, op=s.op)


def _slope_values(s: _Setup, slope: ir.Expr, acc: torch.Tensor) -> torch.Tensor:
    """`slope` (an expression in `acc`, `diag` and the hyperparameters) at `acc` `[..., M, N]`, in `acc`'s dtype."""
    env: dict[str, torch.Tensor | float] = {"acc": acc, **hyper_env(s.hypers, acc.dtype, 2)}
    if "diag" in ir.free_vars(slope):
        m, n = acc.shape[-2:]
        om, on = diagonal_offsets(int(s.offset_m), int(s.offset_n), m, n)  # validated by the forward
        rows = torch.arange(m, device=acc.device) + om
        cols = torch.arange(n, device=acc.device) + on
        env["diag"] = (rows[:, None] == cols[None, :]).to(acc.dtype)
    return evaluate(slope, env, like=acc)


def _epilogue_derivative(s: _Setup, x: torch.Tensor, z: torch.Tensor) -> float | torch.Tensor:
    """`e'(acc)`: a number where it is constant (no pass then; 1 for the epilogue `acc`), else `[..., M, N]` in the
    compute dtype from one fused pass for `acc`."""
    constant = _constant_slope(s.program)
    if constant is not None:
        return constant
    acc = _accumulated(s, x, z)
    return _slope_values(s, epilogue_slope(s.program), acc.to(compute_dtype(acc.dtype)))


@cache
def _constant_slope(program: PairwiseProgram) -> float | None:
    """`e'` of `program` as a number where it reads neither `acc`, `diag` nor a hyperparameter, else `None`."""
    slope = epilogue_slope(program)
    if ir.free_vars(slope) or ir.hyper_names(slope):
        return None
    return float(evaluate(slope, {}, like=torch.empty((), dtype=torch.float64)))


def _symbolic_outer_factor(g: torch.Tensor, E: float | torch.Tensor) -> torch.Tensor:
    """`G = g·e'(acc)`, 0 where `e'` is infinite; `[..., M, N]` in the compute dtype of `g`."""
    gc = g.to(compute_dtype(g.dtype))
    if isinstance(E, float):
        return gc if E == 1.0 else torch.zeros_like(gc) if math.isinf(E) else gc * E
    return torch.where(torch.isinf(E), 0.0, gc * E)


def _sum_gradient(s: _Setup, wrt: str, G: torch.Tensor, other: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
    """`Σ_k G[r, k] h(own[r, j], other[k, j])` over the rows `k` of `other`, `h` the slope of a sum's terms in
    `wrt` ([`contraction_program`][kermac.pairwise_gradients.contraction_program]); `G` has the rows of `own`
    first."""
    G = G.to(own.dtype)
    if 0 in G.stride():  # an expanded upstream gradient (e.g. from .sum())
        G = G.contiguous()
    return _contract(G.mT, other, own, contraction_program(s.program, wrt), s.hypers, s)


def _contract(
    a: torch.Tensor, other: torch.Tensor, own: torch.Tensor, program: GradProgram, hypers: dict, s: _Setup
) -> torch.Tensor:
    """`Σ_k a[k, m] h(own[m, j], other[k, j])`, `h` the multiply of `program` (`d` = own, `b` = other), as
    `[..., rows of own, D]`: the gradient contraction with `O = 1`, `c = 1`."""
    ones = torch.ones(1, other.shape[-2], dtype=own.dtype, device=own.device)
    used = {n: hypers[n] for n in program.hypers}
    out = ops.grad(program.key(), a, other.mT, ones, own.mT, used, backend=s.backend, debug=s.debug, op=s.op)
    return out[..., 0, :, :].mT


Slope = Callable[[torch.Tensor, torch.Tensor, dict], torch.Tensor]
"""`∂τ/∂x` or `∂τ/∂z` on a block of terms, from `x [..., bm, 1, D]`, `z [..., 1, bn, D]` and the hyperparameters."""


def _power_slopes(p: HyperValue) -> tuple[Slope, Slope]:
    """The slopes of `|x − z|^P`: `±P sgn(t)|t|^(P−1)`, 0 where `t = x − z = 0`."""

    def slope(xs: torch.Tensor, zs: torch.Tensor, env: dict) -> torch.Tensor:
        power = p.scalar if p.tensor is None else env["p"]
        t = xs - zs
        return torch.where(t != 0, torch.sign(t) * t.abs().pow(power - 1) * power, torch.zeros_like(t))

    return slope, lambda xs, zs, env: -slope(xs, zs, env)


def _symbolic_slopes(slopes: tuple[ir.Expr, ir.Expr]) -> tuple[Slope, Slope]:
    """The slopes [`point_slope`][kermac.pairwise_gradients.point_slope] of any inner term, evaluated."""

    def in_x(xs: torch.Tensor, zs: torch.Tensor, env: dict) -> torch.Tensor:
        return evaluate(slopes[0], {"x": xs, "z": zs, **env}, like=xs)

    def in_z(xs: torch.Tensor, zs: torch.Tensor, env: dict) -> torch.Tensor:
        return evaluate(slopes[1], {"x": zs, "z": xs, **env}, like=xs)

    return in_x, in_z


def _blockwise_gradients(
    s: _Setup,
    x: torch.Tensor,
    z: torch.Tensor,
    G: torch.Tensor,
    slopes: tuple[Slope, Slope],
    want: tuple[bool, bool],
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The gradients of a program whose reduction is not the sum (a maximum, minimum or log-sum-exp; its weights
    [`term_weights`][kermac.reductions.term_weights]) in blocks of at most `CHUNK_ELEMENTS` `(m, n, j)`
    elements; `[*batch, M, D]` and `[*batch, N, D]`.

    Each term is `G·w·slope`, `G = g·e'(acc)`."""
    batch, (m, n), d = G.shape[:-2], G.shape[-2:], x.shape[-1]
    cdtype = compute_dtype(x.dtype)
    grad_x = torch.zeros(batch + (m, d), dtype=cdtype, device=x.device) if want[0] else None
    grad_z = torch.zeros(batch + (n, d), dtype=cdtype, device=x.device) if want[1] else None
    if d == 0 or m == 0 or n == 0 or x.device.type == "meta":
        return grad_x, grad_z
    like = torch.empty((), dtype=cdtype, device=x.device)
    env = hyper_env(s.hypers, cdtype, 3)
    xb, zb, Gc = x.expand(batch + (m, d)), z.expand(batch + (n, d)), G.to(cdtype)
    bm, bn = tile(m, n, math.prod(batch) * d)
    for m0, m1 in blocks(m, bm):
        for n0, n1 in blocks(n, bn):
            xs, zs = xb[..., m0:m1, None, :].to(cdtype), zb[..., None, n0:n1, :].to(cdtype)
            weight = pair_weights(s.program, {"x": xs, "z": zs, **env}, like)  # from the forward's terms
            Gb = Gc[..., m0:m1, n0:n1, None]
            for slope, grad, dim, rows in zip(slopes, (grad_x, grad_z), (-2, -3), ((m0, m1), (n0, n1)), strict=True):
                if grad is not None:
                    grad[..., rows[0] : rows[1], :] += (Gb * weight * slope(xs, zs, env)).sum(dim)
    return grad_x, grad_z


def _setup_grad(ctx, inputs, output) -> None:
    a, b, c, d, program, _, numbers, tensors, *_, op = inputs
    ctx.save_for_backward(a, b, c, d)
    ctx.list_grads = _no_list_grads(numbers, tensors)
    ctx.bilinear = program_from_key(program) == grad_program(2.0)
    ctx.op = op


def _backward_grad(ctx, g):
    a, b, c, d = ctx.saved_tensors
    want = ctx.needs_input_grad[:4]
    if not ctx.bilinear:
        reason = _first_order_only(
            ctx.op, "a gradient contraction with p ≠ 2 (cdist_grad is differentiable for p = 2 only)"
        )
        grads = tuple(_no_gradient(t, reason) if w else None for t, w in zip((a, b, c, d), want, strict=True))
    else:
        grads = _bilinear_gradients(a, b, c, d, g, want)
    return *grads, None, None, *ctx.list_grads, None, None, None


def _bilinear_gradients(
    a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor, g: torch.Tensor, want: tuple[bool, ...]
) -> tuple[torch.Tensor | None, ...]:
    """Gradients of `out[o, n, m] = d[n, m]·C[o, m] − Σ_k c[o, k] a[k, m] b[n, k]`, `C = c a`."""
    cdtype = compute_dtype(a.dtype)
    ac, bc, cc, dc, gc = (t.to(cdtype) for t in (a, b, c, d, g))
    # Matrix products only (no einsum, whose path search would read the sizes and so fix them in a trace).
    grad_c_of = (gc * dc[..., None, :, :]).sum(-2)  # ∂L/∂C [..., O, M]
    ga = gc @ ac.mT[..., None, :, :]  # Σ_m g[o, n, m] a[k, m]: [..., O, N, K]
    grads = (
        cc.mT @ grad_c_of - (cc[..., :, :, None] * (bc.mT[..., None, :, :] @ gc)).sum(-3) if want[0] else None,
        -(cc[..., :, None, :] * ga).sum(-3) if want[1] else None,
        grad_c_of @ ac.mT - (ga * bc[..., None, :, :]).sum(-2) if want[2] else None,
        (gc * (cc @ ac)[..., :, None, :]).sum(-3) if want[3] else None,
    )
    return tuple(
        None if t is None else t.to(ref.dtype).sum_to_size(ref.shape)
        for t, ref in zip(grads, (a, b, c, d), strict=True)
    )


def _setup_first_order_only(ctx, inputs, output) -> None:
    ctx.reason = inputs[1]


def _backward_first_order_only(ctx, g):
    return _no_gradient(g, ctx.reason), None


def _setup_product(ctx, inputs, output) -> None:
    x, z, v, program, names, numbers, tensors, offset_m, offset_n, backend, debug, op = inputs
    ctx.save_for_backward(x, z, v, *(t for t in tensors if t is not None))
    ctx.call = (program, names, list(numbers), [t is not None for t in tensors], offset_m, offset_n, backend, debug, op)
    ctx.list_grads = _no_list_grads(numbers, tensors)


def _backward_product(ctx, g):
    x, z, v, *saved = ctx.saved_tensors
    program, names, numbers, present, offset_m, offset_n, backend, debug, op = ctx.call
    found = iter(saved)
    hypers = ops.hypers_from_args(names, numbers, [next(found) if p else None for p in present])
    s = _Setup(program_from_key(program), hypers, offset_m, offset_n, backend, debug, op)
    want_x, want_z, want_v = ctx.needs_input_grad[:3]
    grad_v = None
    if want_v:
        grad_v = _transposed_product(s, s.program, x, z, g, hypers).sum_to_size(v.shape)
    grad_x = grad_z = None
    if want_x or want_z:
        if is_squared_difference_sum(s.program):
            grad_x, grad_z = _product_point_gradients(s, x, z, v, g, (want_x, want_z))
        else:
            grad_x, grad_z = _product_grad_gradients(s, x, z, v, g, (want_x, want_z))
    return grad_x, grad_z, grad_v, None, None, *ctx.list_grads, None, None, None, None, None


def _product_grad_gradients(
    s: _Setup, x: torch.Tensor, z: torch.Tensor, v: torch.Tensor, g: torch.Tensor, want: tuple[bool, bool]
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """`(∂L/∂x, ∂L/∂z)` of `out = K v` for a program not on Σ(x − z)²: one gradient product
    (`kermac::product_grad`) per input, the one for `z` on the swapped program with `v` and `g` exchanged."""
    key, hypers = s.program.key(), s.hypers
    grad_x = grad_z = None
    if want[0]:
        grad_x = ops.product_grad(
            key, x, z, v, g, hypers, offset_m=s.offset_m, offset_n=s.offset_n, backend=s.backend, debug=s.debug,
            op=s.op,
        ).sum_to_size(x.shape)  # fmt: skip
    if want[1]:
        grad_z = ops.product_grad(
            swap_operands(s.program).key(), z, x, g, v, hypers, offset_m=s.offset_n, offset_n=s.offset_m,
            backend=s.backend, debug=s.debug, op=s.op,
        ).sum_to_size(z.shape)  # fmt: skip
    return grad_x, grad_z


def _setup_product_grad(ctx, inputs, output) -> None:
    x, z, v, g, program, _, numbers, tensors, *_, op = inputs
    ctx.reason = (
        f"{op}: second derivatives of a kernel product with respect to x and z are implemented for programs "
        f"summing (x − z)² (Gaussian, Laplace-L2, Matérn, Cauchy, l2); program {program} has first derivatives "
        "only (its gradient is the operation kermac::product_grad)"
    )
    ctx.save_for_backward(x, z, v, g)  # only as the `like` of the refusing gradients
    ctx.list_grads = _no_list_grads(numbers, tensors)


def _backward_product_grad(ctx, g_out):
    want = ctx.needs_input_grad[:4]
    grads = (_no_gradient(t, ctx.reason) if w else None for t, w in zip(ctx.saved_tensors, want, strict=True))
    return *grads, None, None, *ctx.list_grads, None, None, None, None, None


def _transposed_product(
    s: _Setup, program: PairwiseProgram, x: torch.Tensor, z: torch.Tensor, u: torch.Tensor, hypers: dict
) -> torch.Tensor:
    """`K(x, z)ᵀ @ u` for `program`: its swapped program on `(z, x)`, offsets exchanged; `[..., N, C']`."""
    swapped = swap_operands(program)
    return ops.product(
        swapped.key(), z, x, u, hypers, offset_m=s.offset_n, offset_n=s.offset_m, backend=s.backend, debug=s.debug,
        op=s.op,
    )  # fmt: skip


def _product_point_gradients(
    s: _Setup, x: torch.Tensor, z: torch.Tensor, v: torch.Tensor, g: torch.Tensor, want: tuple[bool, bool]
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """`(∂L/∂x, ∂L/∂z)` of `out = K v` for a program summing `(x − z)²` (module docstring), from one product of
    the slope program per input, with `C + C·D` columns."""
    slope = slope_program(s.program)
    hypers = {n: s.hypers[n] for n in slope.hypers}
    batch = torch.broadcast_shapes(x.shape[:-2], z.shape[:-2], v.shape[:-2], g.shape[:-2])
    (m, d), n, c = x.shape[-2:], z.shape[-2], v.shape[-1]
    xb, zb = x.expand(batch + (m, d)), z.expand(batch + (n, d))
    vb, gb = v.expand(batch + (n, c)), g.expand(batch + (m, c))
    grad_x = grad_z = None
    if want[0]:
        jacobian = product_jacobian(
            s.program, x, z, v, s.hypers, offset_m=s.offset_m, offset_n=s.offset_n, backend=s.backend, debug=s.debug,
            op=s.op,
        )  # fmt: skip
        grad_x = (gb[..., :, :, None] * jacobian).sum(-2).sum_to_size(x.shape)
    if want[1]:
        u = (gb[..., :, :, None] * xb[..., :, None, :]).reshape(batch + (m, c * d))
        eu = _transposed_product(s, slope, x, z, torch.cat([gb, u], dim=-1), hypers)
        eg, eu = eu[..., :c], eu[..., c:].reshape(batch + (n, c, d))
        b = (vb * eg).sum(-1, keepdim=True)
        grad_z = (-2 * ((vb[..., :, :, None] * eu).sum(-2) - zb * b)).sum_to_size(z.shape)
    return grad_x, grad_z


torch.library.register_autograd("kermac::pairwise", _backward_pairwise, setup_context=_setup_pairwise)
torch.library.register_autograd("kermac::product", _backward_product, setup_context=_setup_product)
torch.library.register_autograd("kermac::grad", _backward_grad, setup_context=_setup_grad)
torch.library.register_autograd("kermac::product_grad", _backward_product_grad, setup_context=_setup_product_grad)
torch.library.register_autograd(
    "kermac::first_order_only", _backward_first_order_only, setup_context=_setup_first_order_only
)
