r"""Autograd for pairwise programs: ``cdist``, ``run_kernel`` and ``run_program`` are differentiable.

A pairwise program computes ``out[m, n] = e(acc[m, n], diag)`` with ``acc = Σ_j τ(x[m, j], z[n, j])``.
For the inner terms kermac can differentiate — ``τ = |x − z|^P`` (P a number or the hyperparameter
``p``; ``|x − z|`` and ``(x − z)²`` are P = 1 and 2) and ``τ = x·z`` — and an upstream gradient
``g = ∂L/∂out``:

.. math::
    G = g \cdot e'(\mathrm{acc}),\qquad
    \frac{\partial L}{\partial x[m, j]} = \sum_n G[m, n]\, P\, \operatorname{sgn}(t)\, |t|^{P-1},\qquad
    \frac{\partial L}{\partial z[n, j]} = \sum_m G[m, n]\, P\, \operatorname{sgn}(-t)\, |t|^{P-1}

with ``t = x[m, j] − z[n, j]`` (for ``x·z``: ``∂L/∂x = G z``, ``∂L/∂z = Gᵀ x``).  ``G`` is 0 where
``acc = 0`` (the subgradient torch.cdist takes at zero distance, where ``e'`` may be infinite).

* ``e'(acc)`` comes from torch's autograd through the reference evaluator of the epilogue
  (:func:`kermac.reference.evaluate.evaluate`); when the epilogue is ``acc`` itself nothing is
  recomputed, otherwise ``acc`` is recomputed by one fused pass of the program without its epilogue.
* Each sum over ``n`` (or ``m``) is :func:`kermac.cdist_grad` with ``O = 1``, ``c = 1``:
  ``a = Gᵀ [N, M]``, ``b = zᵀ``, ``d = xᵀ`` → ``[1, D, M]`` for x; ``a = G``, ``b = xᵀ``, ``d = zᵀ``
  for z — on the same backend as the forward, never building ``[M, N, D]``.

Hyperparameters are constants (a tensor that requires grad is refused by :mod:`kermac.hyperparams`); ``out=`` is refused
while autograd records; a count (L0, ``cdist`` with p = 0) has zero gradient; other reductions
(L∞) and inner terms raise ``NotImplementedError``.  Broadcast batches are summed back to each input's shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch.autograd.function import once_differentiable

from kermac import api, ir
from kermac.hyperparams import HyperValue
from kermac.problem import pairwise_problem
from kermac.programs import PairwiseProgram
from kermac.reference.backend import compute_dtype, hyper_env
from kermac.reference.evaluate import evaluate

__all__ = ["differentiable_pairwise", "inner_power"]

_T = ir.Call("sub", (ir.Var("x"), ir.Var("z")))
_ABS_T = ir.Call("abs", (_T,))
DOT = "dot"


def inner_power(program: PairwiseProgram) -> float | str:
    """``P`` of a ``Σ |x − z|^P`` program (a number, or ``"p"`` for ``Hyper("p")``), or ``"dot"``.

    Raises ``NotImplementedError`` for programs autograd does not cover.
    """
    inner = program.inner
    if program.reduction == "sum":
        if inner == _ABS_T:
            return 1.0
        if inner == ir.Call("ne", (_T, ir.Const(0.0))):
            return 0.0  # a count of differing coordinates (L0): zero gradient
        if inner == ir.Call("mul", (_T, _T)):
            return 2.0
        if inner == ir.Call("mul", (ir.Var("x"), ir.Var("z"))):
            return DOT
        if isinstance(inner, ir.Call) and inner.op == "pow" and inner.args[0] == _ABS_T:
            exponent = inner.args[1]
            if isinstance(exponent, ir.Const):
                return float(exponent.value)
            if exponent == ir.Hyper("p"):
                return "p"
    raise NotImplementedError(
        f"automatic differentiation covers sums of |x − z|^P and x·z; program {program.key()} is not one "
        "(call it under torch.no_grad() or with detached inputs)"
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
    """The pairwise program's result with a backward for ``x`` and ``z`` (see the module docstring)."""
    if out is not None:
        raise RuntimeError(
            f"{op}: out= is not supported when x or z requires grad (autograd needs an output of its own); "
            "drop out=, or call under torch.no_grad()"
        )
    setup = _Setup(program, dict(hypers), offset_m, offset_n, inner_power(program), backend, debug, op)
    return _Pairwise.apply(x, z, setup)


@dataclass(frozen=True)
class _Setup:
    """What the forward ran, kept for the backward."""

    program: PairwiseProgram
    hypers: dict[str, HyperValue]
    offset_m: int
    offset_n: int
    power: float | str
    backend: str
    debug: bool
    op: str


class _Pairwise(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, z, s: _Setup):  # type: ignore[override]
        problem = pairwise_problem(s.program, x, z, out=None, hypers=s.hypers, offset_m=s.offset_m, offset_n=s.offset_n)
        result = api._run_pairwise(problem, s.backend, s.op)
        ctx.setup = s
        ctx.save_for_backward(x, z)
        return result

    @staticmethod
    @once_differentiable
    def backward(ctx, g):  # type: ignore[override]
        x, z = ctx.saved_tensors
        s: _Setup = ctx.setup
        power, backend, debug = s.power, s.backend, s.debug
        want_x, want_z = ctx.needs_input_grad[:2]
        G = _outer_factor(s, x, z, g)
        if power == DOT:
            grad_x = G @ z.to(G.dtype) if want_x else None
            grad_z = G.mT @ x.to(G.dtype) if want_z else None
        else:
            p = s.hypers["p"] if power == "p" else HyperValue("p", power)
            if p.tensor is None and p.scalar == 0.0:
                return torch.zeros_like(x) if want_x else None, torch.zeros_like(z) if want_z else None, None
            G = G * (p.scalar if p.tensor is None else p.tensor[..., None, None].to(G.dtype))
            if 0 in G.stride():  # an expanded upstream gradient (e.g. from .sum())
                G = G.contiguous()
            exponent = p.scalar if p.tensor is None else p.tensor
            grad_x = _contract(G.mT, z, x, exponent, backend, debug) if want_x else None
            grad_z = _contract(G, x, z, exponent, backend, debug) if want_z else None
        grad_x = grad_x.to(x.dtype).sum_to_size(x.shape) if want_x else None
        grad_z = grad_z.to(z.dtype).sum_to_size(z.shape) if want_z else None
        return grad_x, grad_z, None


def _outer_factor(s: _Setup, x: torch.Tensor, z: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """``G = g · e'(acc)`` (0 where ``acc = 0`` for ``|x − z|^P`` terms); ``[..., M, N]`` in the inputs' dtype."""
    program, hypers = s.program, s.hypers
    if program.epilogue == ir.Var("acc"):
        return g
    inner_only = PairwiseProgram(program.inner, program.reduction, ir.Var("acc"))
    used = {n: hypers[n] for n in inner_only.hypers}
    problem = pairwise_problem(inner_only, x, z, out=None, hypers=used, debug=s.debug)
    acc = api._run_pairwise(problem, s.backend, s.op)
    cdtype = compute_dtype(acc.dtype)
    with torch.enable_grad():
        a = acc.detach().to(cdtype).requires_grad_()
        env: dict[str, torch.Tensor | float] = {"acc": a, **hyper_env(hypers, cdtype, 2)}
        if "diag" in ir.free_vars(program.epilogue):
            rows = torch.arange(acc.shape[-2], device=acc.device) + s.offset_m
            cols = torch.arange(acc.shape[-1], device=acc.device) + s.offset_n
            env["diag"] = (rows[:, None] == cols[None, :]).to(cdtype)
        value = evaluate(program.epilogue, env, like=a)
        G = None
        if value.requires_grad:
            (G,) = torch.autograd.grad(value, a, g.to(cdtype).expand(value.shape), allow_unused=True)
    if G is None:  # the epilogue does not depend on acc
        return torch.zeros_like(acc)
    if s.power != DOT:  # acc = 0 means every t = 0, where the inner derivative is 0 and e' may be infinite
        G = torch.where(acc == 0, torch.zeros((), dtype=cdtype, device=G.device), G)
    return G.to(x.dtype)


def _contract(
    a: torch.Tensor, other: torch.Tensor, own: torch.Tensor, p: float | torch.Tensor, backend: str, debug: bool
) -> torch.Tensor:
    """``Σ_k a[k, m] sgn(t)|t|^{p−1}``, ``t = own[m, j] − other[k, j]``, as ``[..., rows of own, D]``."""
    ones = torch.ones(1, other.shape[-2], dtype=own.dtype, device=own.device)
    out = api.cdist_grad(a, other.mT, ones, own.mT, p=p, backend=backend, debug=debug)
    return out[..., 0, :, :].mT
