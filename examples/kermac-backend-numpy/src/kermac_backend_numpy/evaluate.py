"""Evaluate [`kermac.ir`][kermac.ir] expressions on NumPy arrays, with the semantics the IR's table gives.

Every operation broadcasts its operands (NumPy's rules, the same as torch's).  Constants and scalar
hyperparameters are rounded once to the compute type, as the IR requires; comparisons give 1.0 or
0.0 in that type.  The operations are those of this module's table: an IR operation core adds later
is missing from it until this module implements it, and `unsupported_ops` is how the backend
refuses programs that use one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from kermac import ir

__all__ = ["OPS", "REDUCE", "evaluate", "unsupported_ops"]

OPS: Mapping[str, Callable[..., np.ndarray]] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "neg": np.negative,
    "abs": np.abs,
    "sqrt": np.sqrt,
    "exp": np.exp,
    "log": np.log,
    "pow": np.power,
    "min": np.minimum,  # NaN propagates, as the IR specifies
    "max": np.maximum,
    # Adding +0 turns np.sign's −0 into the +0 the IR specifies; NaN stays NaN.
    "sign": lambda a: np.sign(a) + 0.0,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "eq": np.equal,
    "ne": np.not_equal,
    "select": lambda cond, if_true, if_false: np.where(cond != 0, if_true, if_false),
}
"""IR operation name → NumPy function of the same arity."""

REDUCE: Mapping[str, np.ufunc] = {"sum": np.add, "max": np.maximum, "min": np.minimum, "logsumexp": np.logaddexp}
"""Reduction of a pairwise program → the binary ufunc whose `reduce` folds it, with the values of
[`kermac.reductions`][kermac.reductions]: maximum and minimum propagate NaN, as the IR's max and min do;
`np.logaddexp` is the stable `max(a, t) + log1p(exp(−|a − t|))`, `a + log 2` where `a = t`, so a NaN term
gives NaN, a +∞ term +∞, and terms that are all −∞ give −∞.  A reduction core adds later is refused until
it is added here."""


def unsupported_ops(*exprs: ir.Expr) -> list[str]:
    """The operations used in `exprs` that `OPS` lacks, sorted."""
    return sorted({node.op for expr in exprs for node in ir.walk(expr) if isinstance(node, ir.Call)} - OPS.keys())


def evaluate(expr: ir.Expr, env: Mapping[str, np.ndarray], dtype: np.dtype) -> np.ndarray:
    """Value of `expr` with `Var` and `Hyper` names looked up in `env` (arrays of `dtype`), in `dtype`.

    The result has the broadcast shape of the inputs it uses (0-d for a constant).  Invalid
    operations (log of a negative number, 0/0) give NaN or ±inf silently, as IEEE arithmetic does.
    """
    with np.errstate(all="ignore"):
        return _eval(expr, env, np.dtype(dtype))


def _eval(expr: ir.Expr, env: Mapping[str, np.ndarray], dtype: np.dtype) -> np.ndarray:
    if isinstance(expr, ir.Const):
        return np.asarray(expr.value, dtype=dtype)
    if isinstance(expr, (ir.Var, ir.Hyper)):
        return env[expr.name]
    assert isinstance(expr, ir.Call)
    result = np.asarray(OPS[expr.op](*(_eval(arg, env, dtype) for arg in expr.args)))
    return result.astype(dtype) if result.dtype != dtype else result
