r"""Differentiable :func:`kermac.cdist`: an autograd function whose backward is :func:`kermac.cdist_grad`.

For ``d[m, n] = (Σ_j |x[m, j] − z[n, j]|^p)^{1/p}`` and the upstream gradient ``g = ∂L/∂d``:

.. math::
    \frac{\partial L}{\partial x[m, j]} = \sum_n G[m, n]\, \operatorname{sgn}(t)\, |t|^{p-1},\qquad
    \frac{\partial L}{\partial z[n, j]} = \sum_m G[m, n]\, \operatorname{sgn}(-t)\, |t|^{p-1},\qquad
    t = x[m, j] - z[n, j]

with ``G = g · d^{1−p}`` (0 where ``d = 0``: the subgradient torch.cdist takes too), or
``G = p · g`` for ``skip_epilogue`` (the derivative of ``Σ |t|^p``).  Each sum is the contraction
:func:`kermac.cdist_grad` computes, with ``O = 1`` and ``c = 1``:

* ``∂L/∂x``: ``a = Gᵀ [N, M]``, ``b = zᵀ [D, N]``, ``d = xᵀ [D, M]`` → ``[1, D, M]``;
* ``∂L/∂z``: ``a = G [M, N]``, ``b = xᵀ [D, M]``, ``d = zᵀ [D, N]`` → ``[1, D, N]``,

so the backward runs on the same backend as the forward, never materialises ``[M, N, D]``, and
allocates only ``G`` and the gradients.  ``p = 0`` (a count) has zero gradient; ``p = ∞`` is not
supported; a tensor ``p`` is treated as a constant (it may not require grad).
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from kermac import api

__all__ = ["differentiable_cdist"]


def differentiable_cdist(
    x: torch.Tensor,
    z: torch.Tensor,
    p: float | torch.Tensor,
    *,
    out: torch.Tensor | None,
    skip_epilogue: bool,
    backend: str,
    debug: bool,
) -> torch.Tensor:
    """:func:`kermac.cdist` with a backward for ``x`` and ``z`` (see the module docstring)."""
    if out is not None:
        raise RuntimeError(
            "cdist: out= is not supported when x or z requires grad (autograd needs an output of its own); "
            "drop out=, or call under torch.no_grad()"
        )
    if isinstance(p, torch.Tensor):
        if p.requires_grad:
            raise ValueError("p: a tensor p is a constant for autograd and may not require grad; pass p.detach()")
        if p.dim() == 0 and p.device.type == "cpu":
            p = float(p)
    if not isinstance(p, torch.Tensor) and math.isinf(p):
        raise NotImplementedError(
            "cdist: automatic differentiation is not implemented for p = inf; "
            "use a large finite p or torch.cdist for this gradient"
        )
    return _Cdist.apply(x, z, p, skip_epilogue, backend, debug)


class _Cdist(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, z, p, skip_epilogue, backend, debug):  # type: ignore[override]
        dist = api._cdist(x, z, p, out=None, skip_epilogue=skip_epilogue, backend=backend, debug=debug)
        ctx.p, ctx.skip_epilogue, ctx.backend, ctx.debug = p, skip_epilogue, backend, debug
        ctx.save_for_backward(x, z, dist)
        return dist

    @staticmethod
    @once_differentiable
    def backward(ctx, g):  # type: ignore[override]
        x, z, dist = ctx.saved_tensors
        p = ctx.p
        want_x, want_z = ctx.needs_input_grad[:2]
        if not isinstance(p, torch.Tensor) and p == 0:  # a count of differing coordinates
            return (torch.zeros_like(x) if want_x else None, torch.zeros_like(z) if want_z else None, *[None] * 4)
        G = _outer_factor(g, dist, p, ctx.skip_epilogue)
        grad_x = grad_z = None
        if want_x:
            grad_x = _contract(G.mT, z, x, p, ctx).sum_to_size(x.shape)
        if want_z:
            grad_z = _contract(G, x, z, p, ctx).sum_to_size(z.shape)
        return grad_x, grad_z, None, None, None, None


def _outer_factor(g: torch.Tensor, dist: torch.Tensor, p: float | torch.Tensor, skip_epilogue: bool) -> torch.Tensor:
    """``G = g · d^{1−p}`` (0 where ``d = 0``), or ``p · g`` without the root; ``[..., M, N]``."""
    pb = p[..., None, None] if isinstance(p, torch.Tensor) else p  # one p per batch entry
    if skip_epilogue:
        return g * pb
    if not isinstance(p, torch.Tensor) and p == 1:
        return g
    return torch.where(dist > 0, g * dist.pow(1 - pb), torch.zeros((), dtype=g.dtype, device=g.device))


def _contract(a: torch.Tensor, other: torch.Tensor, own: torch.Tensor, p: float | torch.Tensor, ctx) -> torch.Tensor:
    """``Σ_k a[k, m] φ(ownᵀ[j, m] − otherᵀ[j, k])`` as ``[..., rows of own, D]`` via cdist_grad."""
    ones = torch.ones(1, other.shape[-2], dtype=own.dtype, device=own.device)
    out = api.cdist_grad(a, other.mT, ones, own.mT, p=p, backend=ctx.backend, debug=ctx.debug)
    return out[..., 0, :, :].mT
