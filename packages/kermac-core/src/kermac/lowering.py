"""The programs behind :func:`kermac.cdist` and :func:`kermac.cdist_grad`.

``p`` given as a number selects a specialised program (no ``p`` hyperparameter for p in
{0, 1, 2, ∞} in ``cdist`` and {1, 2} in ``cdist_grad``); ``p=None`` stands for a p given per batch
entry as a tensor, which the general program reads as the hyperparameter ``p``.  The public
operations and ahead-of-time compilation (``kermac precompile``) both use these, so they agree on
which kernels exist.
"""

from __future__ import annotations

import math
from functools import cache

from kermac import ir, presets
from kermac.programs import GradProgram, PairwiseProgram

__all__ = ["cdist_program", "grad_program"]

_SPECIAL_CDIST = {
    0.0: presets.l0_distance,
    1.0: presets.l1_distance,
    2.0: presets.l2_distance,
    math.inf: presets.linf_distance,
}


def cdist_program(p: float | None, *, skip_epilogue: bool = False) -> PairwiseProgram:
    """Program of ``cdist(x, z, p, skip_epilogue=...)``; it reads ``Hyper("p")`` unless p is special."""
    descriptor = _SPECIAL_CDIST.get(p, presets.lp_distance) if p is not None else presets.lp_distance
    if skip_epilogue:
        descriptor = descriptor.replace(outer="identity")
    return descriptor.lower()


def grad_program(p: float | None) -> GradProgram:
    """Program of ``cdist_grad(..., p)``: Σ_k c·a·φ(d − b) with φ(t) = sgn(t)|t|^(p−1), φ(0) = 0.

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
    return GradProgram(multiply=multiply, epilogue=ir.Var("acc"))
