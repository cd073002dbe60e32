r"""Autograd for pairwise programs: `cdist`, `run_kernel` and `run_program` are differentiable.

A pairwise program computes `out[m, n] = e(acc[m, n], diag)` with `acc = ⊕_j τ(x[m, j], z[n, j])`.
For the inner terms kermac can differentiate — `τ = |x − z|^P` (P a number or the hyperparameter
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
(`cdist`'s p = ∞ skips NaN differences, so a NaN coordinate there gets no gradient).

* `e'(acc)` comes from torch's autograd through the reference evaluator of the epilogue
  ([`kermac.ir_eval.evaluate`][kermac.ir_eval.evaluate]); when the epilogue is `acc` itself nothing is
  recomputed, otherwise `acc` is recomputed by one fused pass of the program without its epilogue.
* For a sum, each sum over `n` (or `m`) is [`kermac.cdist_grad`][kermac.cdist_grad] with `O = 1`, `c = 1`:
  `a = Gᵀ [N, M]`, `b = zᵀ`, `d = xᵀ` → `[1, D, M]` for x; `a = G`, `b = xᵀ`, `d = zᵀ`
  for z — on the same backend as the forward, never building `[M, N, D]`.
* For a maximum or minimum the weights need every coordinate of a pair at once: torch operations on
  blocks of at most `CHUNK_ELEMENTS` `(m, n, j)` elements (the
  documented workspace of this backward), not a fused kernel.
* A count (L0, `cdist` with p = 0) has zero gradient.

Second derivatives (`create_graph=True`) are exact for `Σ (x − z)²` programs (cdist p = 2,
squared distances, Gaussian, Laplace-L2, Matérn, Cauchy) and `x·z` programs, any epilogue: the
backward is then itself differentiable, built from the fused first derivative, matrix products
and autograd of the epilogue (to any order).  For every other program the gradients carry a
`grad_fn` that raises `NotImplementedError` when differentiated — never a silent zero.

Hyperparameters are constants (a tensor that requires grad is refused by [`kermac.hyperparams`][kermac.hyperparams]);
`out=` is refused while autograd records.  Other programs run forward as usual and raise
`NotImplementedError` naming the program when their backward runs.  Broadcast batches are summed
back to each input's shape.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch

from kermac import ir
from kermac.dispatch import grad_contraction, run_pairwise
from kermac.hyperparams import HyperValue
from kermac.ir_eval import evaluate
from kermac.problem import compute_dtype, diagonal_offsets, pairwise_problem
from kermac.programs import PairwiseProgram, inner_difference_power, is_product_sum
from kermac.reference.backend import REDUCE, blocks, hyper_env, tile

__all__ = ["differentiable_pairwise", "inner_power"]

DOT = "dot"


def inner_power(program: PairwiseProgram) -> float | str:
    """`P` of a program reducing `|x − z|^P` (a number, or `"p"` for `Hyper("p")`), `0.0` for a
    count of differing coordinates, or `"dot"` for `Σ x·z`.

    Decided on the normal form of the inner term ([`kermac.canonical`][kermac.canonical]), as the backends' fast
    paths are.  Raises `NotImplementedError` for programs autograd does not cover.
    """
    if is_product_sum(program):
        return DOT
    exponent = inner_difference_power(program)
    if isinstance(exponent, ir.Const):
        return float(exponent.value)  # 0 for a count of differing coordinates (L0): zero gradient
    if exponent == ir.Hyper("p"):
        return "p"
    raise NotImplementedError(
        f"automatic differentiation covers sums, maxima and minima of |x − z|^P and sums of x·z; program "
        f"{program.key()} is not one (call it under torch.no_grad() or with detached inputs)"
    )


def differentiable_pairwise(
    program: PairwiseProgram,
    x: torch.Tensor,
    z: torch.Tensor,
    *,
    out: torch.Tensor | None,
    hypers: Mapping[str, HyperValue],
    offset_m: int,
    offset_n: int,
    backend: str,
    debug: bool,
    op: str,
) -> torch.Tensor:
    """The pairwise program's result with a backward for `x` and `z` (see the module docstring).

    The forward runs for every program; a program autograd does not cover raises when its backward runs."""
    if out is not None:
        raise RuntimeError(
            f"{op}: out= is not supported when x or z requires grad (autograd needs an output of its own); "
            "drop out=, or call under torch.no_grad()"
        )
    try:
        power: float | str | None = inner_power(program)
        unsupported = None
    except NotImplementedError as exc:
        power, unsupported = None, f"{op}: {exc}"
    setup = _Setup(program, dict(hypers), offset_m, offset_n, power, unsupported, backend, debug, op)
    return _Pairwise.apply(x, z, setup)


@dataclass(frozen=True)
class _Setup:
    """What the forward ran, kept for the backward."""

    program: PairwiseProgram
    hypers: dict[str, HyperValue]
    offset_m: int
    offset_n: int
    power: float | str | None
    unsupported: str | None  # why the backward cannot run, if it cannot
    backend: str
    debug: bool
    op: str

    @property
    def second_order(self) -> bool:
        """Whether the backward is differentiable: Σ (x − z)² and Σ x·z programs."""
        return self.program.reduction == "sum" and self.power in (2.0, DOT)

    def inner_only(self) -> _Setup:
        """This setup for the program without its epilogue (`out = acc`)."""
        program = PairwiseProgram(self.program.inner, self.program.reduction, ir.Var("acc"))
        return replace(self, program=program, hypers={n: self.hypers[n] for n in program.hypers})


class _Pairwise(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, z, s: _Setup):  # type: ignore[override]
        problem = pairwise_problem(s.program, x, z, out=None, hypers=s.hypers, offset_m=s.offset_m, offset_n=s.offset_n)
        result = run_pairwise(problem, s.backend, s.op)
        ctx.setup = s
        # Tensor hyperparameters are saved too: torch then refuses a backward after one was changed in place.
        ctx.save_for_backward(x, z, *(h.tensor for h in s.hypers.values() if h.tensor is not None))
        return result

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        x, z = ctx.saved_tensors[:2]
        s: _Setup = ctx.setup
        if s.unsupported is not None:
            raise NotImplementedError(s.unsupported)
        want = tuple(ctx.needs_input_grad[:2])
        if not torch.is_grad_enabled():  # create_graph=False: no graph to record
            return (*_gradients(s, x, z, g, want), None)
        if s.second_order:
            return (*_Gradient.apply(g, x, z, s, want), None)
        with torch.no_grad():
            grads = _gradients(s, x, z, g, want)
        reason = (
            f"{s.op}: second derivatives are implemented for programs summing (x − z)² (cdist p = 2, Gaussian, "
            f"Laplace-L2, Matérn, Cauchy) or x·z; program {s.program.key()} has first derivatives only"
        )
        return (*(None if t is None else _FirstOrderOnly.apply(t, reason, g, x, z) for t in grads), None)


class _FirstOrderOnly(torch.autograd.Function):
    """Passes a first derivative through; differentiating it raises `NotImplementedError`."""

    @staticmethod
    def forward(ctx, grad, reason: str, *inputs):  # type: ignore[override]
        ctx.reason = reason
        return grad

    @staticmethod
    def backward(ctx, *_):  # type: ignore[override]
        raise NotImplementedError(ctx.reason)


class _Gradient(torch.autograd.Function):
    r"""`(∂L/∂x, ∂L/∂z)` as a function of `(g, x, z)`, for second derivatives of Σ (x − z)² and x·z.

    Its forward is the fused first derivative.  Its backward differentiates
    `h = Σ u_x·∂L/∂x + Σ u_z·∂L/∂z = Σ_{m,n} G[m, n] W[m, n]` with torch's autograd, where
    `W = 2 Σ_j (x_m − z_n)_j (u_x[m] − u_z[n])_j` (matrix products) for Σ (x − z)² and
    `W = u_x zᵀ + x u_zᵀ` for x·z, and `G = g·e'(acc)` with `acc` from `_Pairwise` (so the
    path through `acc` is the first derivative again, fused, and the result is differentiable too).
    """

    @staticmethod
    def forward(ctx, g, x, z, s: _Setup, want: tuple[bool, bool]):  # type: ignore[override]
        ctx.setup = s
        ctx.save_for_backward(g, x, z)
        return _gradients(s, x, z, g, want)

    @staticmethod
    def backward(ctx, ux, uz):  # type: ignore[override]
        s: _Setup = ctx.setup
        create = torch.is_grad_enabled()
        wanted = tuple(ctx.needs_input_grad[:3])
        with torch.enable_grad():
            saved = zip(ctx.saved_tensors, wanted, strict=True)  # (g, x, z)
            g, x, z = (t if create else t.detach().requires_grad_(w) for t, w in saved)
            cdtype = compute_dtype(x.dtype)
            G = _outer_factor(s, x, z, g, differentiable=True).to(cdtype)
            xc, zc = x.to(cdtype), z.to(cdtype)
            W = torch.zeros((), dtype=cdtype, device=G.device)
            if ux is not None:
                uxc = ux.to(cdtype)
                W = W + (uxc @ zc.mT if s.power == DOT else (xc * uxc).sum(-1)[..., :, None] - uxc @ zc.mT)
            if uz is not None:
                uzc = uz.to(cdtype)
                W = W + (xc @ uzc.mT if s.power == DOT else (zc * uzc).sum(-1)[..., None, :] - xc @ uzc.mT)
            if s.power != DOT:
                W = 2.0 * W
            h = (G * W).sum()
            inputs = [t for t, w in zip((g, x, z), wanted, strict=True) if w]
            found = iter(torch.autograd.grad(h, inputs, create_graph=create, allow_unused=True, materialize_grads=True))
        return (*(next(found) if w else None for w in wanted), None, None)


def _gradients(
    s: _Setup, x: torch.Tensor, z: torch.Tensor, g: torch.Tensor, want: tuple[bool, bool]
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The first derivatives `(∂L/∂x, ∂L/∂z)` (`None` where not wanted), by the fused path."""
    want_x, want_z = want
    power = s.power
    if power == 0.0:
        return torch.zeros_like(x) if want_x else None, torch.zeros_like(z) if want_z else None
    G = _outer_factor(s, x, z, g)
    if power == DOT:
        grad_x = G @ z.to(G.dtype) if want_x else None
        grad_z = G.mT @ x.to(G.dtype) if want_z else None
    else:
        p = s.hypers["p"] if power == "p" else HyperValue("p", power)
        if s.program.reduction != "sum":
            grad_x, grad_z = _extreme_gradients(s, x, z, G, p, want)
        else:
            G = G * (p.scalar if p.tensor is None else p.tensor[..., None, None].to(G.dtype))
            if 0 in G.stride():  # an expanded upstream gradient (e.g. from .sum())
                G = G.contiguous()
            exponent = p.scalar if p.tensor is None else p.tensor
            grad_x = _contract(G.mT, z, x, exponent, s) if want_x else None
            grad_z = _contract(G, x, z, exponent, s) if want_z else None
    grad_x = grad_x.to(x.dtype).sum_to_size(x.shape) if want_x else None
    grad_z = grad_z.to(z.dtype).sum_to_size(z.shape) if want_z else None
    return grad_x, grad_z


def _outer_factor(
    s: _Setup, x: torch.Tensor, z: torch.Tensor, g: torch.Tensor, *, differentiable: bool = False
) -> torch.Tensor:
    """`G = g · e'(acc)` (0 where `acc = 0` for `|x − z|^P` terms); `[..., M, N]` in the inputs' dtype.

    `differentiable`: `G` as a differentiable function of `g`, `x` and `z` (`acc` through
    `_Pairwise`, `e'` with `create_graph`)."""
    program, hypers = s.program, s.hypers
    if program.epilogue == ir.Var("acc"):
        return g
    if differentiable:
        acc = _Pairwise.apply(x, z, s.inner_only())
    else:
        inner = s.inner_only()
        problem = pairwise_problem(inner.program, x, z, out=None, hypers=inner.hypers, debug=s.debug)
        acc = run_pairwise(problem, s.backend, s.op)
    cdtype = compute_dtype(acc.dtype)
    with torch.enable_grad():
        a = acc.to(cdtype)
        if not a.requires_grad:
            a = a.detach().requires_grad_()
        zero = a == 0 if s.power != DOT else None  # every t = 0: the inner derivative is 0, e' may be infinite
        safe = a if zero is None else torch.where(zero, torch.ones((), dtype=cdtype, device=a.device), a)
        env: dict[str, torch.Tensor | float] = {"acc": safe, **hyper_env(hypers, cdtype, 2)}
        if "diag" in ir.free_vars(program.epilogue):
            m, n = acc.shape[-2:]
            om, on = diagonal_offsets(int(s.offset_m), int(s.offset_n), m, n)  # validated by the forward
            rows = torch.arange(m, device=acc.device) + om
            cols = torch.arange(n, device=acc.device) + on
            env["diag"] = (rows[:, None] == cols[None, :]).to(cdtype)
        value = evaluate(program.epilogue, env, like=a)
        G = None
        if value.requires_grad:
            upstream = g.to(cdtype).expand(value.shape)
            (G,) = torch.autograd.grad(value, a, upstream, create_graph=differentiable, allow_unused=True)
    if G is None:  # the epilogue does not depend on acc
        return torch.zeros_like(acc)
    if zero is not None:
        G = torch.where(zero, torch.zeros((), dtype=cdtype, device=G.device), G)
    return G.to(x.dtype)


def _contract(
    a: torch.Tensor, other: torch.Tensor, own: torch.Tensor, p: float | torch.Tensor, s: _Setup
) -> torch.Tensor:
    """`Σ_k a[k, m] sgn(t)|t|^{p−1}`, `t = own[m, j] − other[k, j]`, as `[..., rows of own, D]`."""
    ones = torch.ones(1, other.shape[-2], dtype=own.dtype, device=own.device)
    out = grad_contraction(a, other.mT, ones, own.mT, p=p, out=None, backend=s.backend, debug=s.debug, op="cdist_grad")
    return out[..., 0, :, :].mT


def _extreme_gradients(
    s: _Setup, x: torch.Tensor, z: torch.Tensor, G: torch.Tensor, p: HyperValue, want: tuple[bool, bool]
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The gradients of a maximum or minimum of `τ = |x − z|^P` (see the module docstring), in blocks
    of at most `CHUNK_ELEMENTS` `(m, n, j)` elements; `[*batch, M, D]` and `[*batch, N, D]`."""
    batch, (m, n), d = G.shape[:-2], G.shape[-2:], x.shape[-1]
    cdtype = compute_dtype(x.dtype)
    grad_x = torch.zeros(batch + (m, d), dtype=cdtype, device=x.device) if want[0] else None
    grad_z = torch.zeros(batch + (n, d), dtype=cdtype, device=x.device) if want[1] else None
    if d == 0 or x.device.type == "meta":
        return grad_x, grad_z
    reduce = REDUCE[s.program.reduction]  # the reference backend's maximum or minimum: the forward's definition
    like = torch.empty((), dtype=cdtype, device=x.device)
    env = hyper_env(s.hypers, cdtype, 3)
    power = p.scalar if p.tensor is None else p.tensor.to(cdtype).reshape(p.tensor.shape + (1, 1, 1))
    xb, zb, Gc = x.expand(batch + (m, d)), z.expand(batch + (n, d)), G.to(cdtype)
    bm, bn = tile(m, n, math.prod(batch) * d)
    for m0, m1 in blocks(m, bm):
        for n0, n1 in blocks(n, bn):
            xs, zs = xb[..., m0:m1, None, :].to(cdtype), zb[..., None, n0:n1, :].to(cdtype)
            tau = evaluate(s.program.inner, {"x": xs, "z": zs, **env}, like=like)  # the forward's terms
            active = (tau == reduce(tau, dim=-1, keepdim=True)).to(cdtype)
            weight = active / active.sum(-1, keepdim=True)  # 1/k on k tied coordinates; NaN for a NaN extreme
            t = xs - zs
            slope = torch.where(t != 0, torch.sign(t) * t.abs().pow(power - 1) * power, torch.zeros_like(t))
            terms = Gc[..., m0:m1, n0:n1, None] * weight * slope
            if grad_x is not None:
                grad_x[..., m0:m1, :] += terms.sum(-2)
            if grad_z is not None:
                grad_z[..., n0:n1, :] -= terms.sum(-3)
    return grad_x, grad_z
