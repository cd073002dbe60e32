"""Evaluate [`kermac.ir`][kermac.ir] expressions with broadcasting torch operations.

The executable statement of the IR's semantics (the table in [`kermac.ir`][kermac.ir]): the reference
backend computes programs with it, autograd differentiates epilogues through it, and core facts
about programs ([`kermac.programs.zero_padding_is_neutral`][kermac.programs.zero_padding_is_neutral]) evaluate terms
with it.  It lives beside the IR, not in a backend, so that the IR depends on no backend.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from kermac.ir import Call, Const, Expr, Hyper, Var

__all__ = ["evaluate"]

_TORCH_OPS: dict[str, Callable[..., torch.Tensor]] = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "neg": torch.neg,
    "abs": torch.abs,
    "sqrt": torch.sqrt,
    "exp": torch.exp,
    "log": torch.log,
    "pow": torch.pow,
    "min": torch.minimum,  # NaN propagates, as the IR specifies
    "max": torch.maximum,
    # sign(±0) = +0 as torch.sign gives; NaN stays NaN (torch.sign gives 0 there).
    "sign": lambda a: torch.where(torch.isnan(a), a, torch.sign(a)),
    "lt": torch.lt,
    "le": torch.le,
    "gt": torch.gt,
    "ge": torch.ge,
    "eq": torch.eq,
    "ne": torch.ne,
}


def evaluate(expr: Expr, env: Mapping[str, torch.Tensor | float], *, like: torch.Tensor) -> torch.Tensor:
    """Value of `expr` with `Var`/`Hyper` names looked up in `env`.

    Numbers become 0-d tensors of `like`'s dtype and device, filled on the device (`torch.tensor`
    would copy from pageable host memory, which synchronises with a GPU) in float64 and rounded to
    `like`'s dtype (a number beyond its range becomes ±inf, as the generated kernels' literals do);
    comparisons give 0/1 in that dtype; `select` is `torch.where`.  The result broadcasts the shapes
    of its inputs.
    """
    if isinstance(expr, Const):
        return _number(expr.value, like)
    if isinstance(expr, (Var, Hyper)):
        value = env[expr.name]
        if isinstance(value, torch.Tensor):
            return value
        return _number(value, like)
    assert isinstance(expr, Call)
    args = [evaluate(a, env, like=like) for a in expr.args]
    if expr.op == "select":
        cond, if_true, if_false = args
        return torch.where(cond != 0, if_true, if_false)
    result = _TORCH_OPS[expr.op](*args)
    return result.to(like.dtype) if result.dtype == torch.bool else result


def _number(value: float, like: torch.Tensor) -> torch.Tensor:
    number = torch.full((), value, dtype=torch.float64, device=like.device)
    return number if like.dtype == torch.float64 else number.to(like.dtype)
