r"""Symbolic derivatives of [`kermac.ir`][kermac.ir] expressions.

`derivative(e, v)` is an expression for $\partial e / \partial v$ built by the chain rule, with the
values torch's autograd gives at the special points, so that differentiating a program here
or by evaluating it with torch operations agrees:

| e | ∂e |
|---|---|
| a ± b, −a, a·b, a/b | the usual rules |
| \|a\| | sign(a)·a′ (0 at a = 0) |
| √a, eᵃ, ln a | a′/(2√a), eᵃ·a′, a′/a |
| aᵇ | b·aᵇ⁻¹·a′ (0 where b = 0) + aᵇ·ln a·b′ (0 where a = 0 and b ≥ 0) |
| min(a, b), max(a, b) | the derivative of the selected argument; half of each on a tie |
| sign, comparisons | 0 |
| select(c, a, b) | select(c, a′, b′) |

Constant terms are folded (`0·e = 0`, `1·e = e`, `e + 0 = e`), so the derivative of an expression
that does not depend on `v` is `Const(0.0)`, and derivatives stay small enough to generate code from.
[`kermac.autograd`][kermac.autograd] evaluates them with [`kermac.ir_eval.evaluate`][kermac.ir_eval.evaluate]
(torch operations, so the result is differentiable again).
"""

from __future__ import annotations

from kermac import ir
from kermac.ir import Call, Const, Expr, Var

__all__ = ["derivative"]

_ZERO, _ONE, _HALF = Const(0.0), Const(1.0), Const(0.5)
_CONSTANT_OPS = frozenset({"sign", "lt", "le", "gt", "ge", "eq", "ne"})


def derivative(expr: Expr, var: str) -> Expr:
    """`∂expr/∂Var(var)` (see the module docstring for the rules)."""
    if isinstance(expr, Var):
        return _ONE if expr.name == var else _ZERO
    if not isinstance(expr, Call) or expr.op in _CONSTANT_OPS or var not in ir.free_vars(expr):
        return _ZERO
    args = expr.args
    da = [derivative(a, var) for a in args]
    op = expr.op
    if op == "add":
        return _add(da[0], da[1])
    if op == "sub":
        return _add(da[0], _neg(da[1]))
    if op == "neg":
        return _neg(da[0])
    if op == "mul":
        return _add(_mul(da[0], args[1]), _mul(args[0], da[1]))
    if op == "div":
        a, b = args
        return _add(_div(da[0], b), _neg(_mul(da[1], _div(expr, b))))
    if op == "abs":
        return _mul(ir.sign(args[0]), da[0])
    if op == "sqrt":
        return _div(da[0], _mul(Const(2.0), expr))
    if op == "exp":
        return _mul(expr, da[0])
    if op == "log":
        return _div(da[0], args[0])
    if op == "pow":
        a, b = args
        slope = _mul(b, ir.pow(a, _add(b, Const(-1.0))))
        if not (isinstance(b, Const) and b.value != 0.0):
            slope = ir.select(ir.ne(b, 0.0), slope, 0.0)  # a⁰ = 1 has slope 0, also at a = 0
        by_exponent = _ZERO
        if da[1] != _ZERO:
            log_term = ir.select(ir.eq(a, 0.0) * ir.ge(b, 0.0), 0.0, _mul(expr, ir.log(a)))
            by_exponent = _mul(log_term, da[1])
        return _add(_mul(slope, da[0]), by_exponent)
    if op in ("min", "max"):
        a, b = args
        pick_a = ir.lt(a, b) if op == "min" else ir.gt(a, b)
        pick_b = ir.gt(a, b) if op == "min" else ir.lt(a, b)
        tie = _mul(_HALF, _add(da[0], da[1]))
        return ir.select(pick_a, da[0], ir.select(pick_b, da[1], tie))
    if op == "select":
        if da[1] == da[2]:
            return da[1]
        return ir.select(args[0], da[1], da[2])
    raise ValueError(f"derivative: operation {op!r} has no rule")


def _add(a: Expr, b: Expr) -> Expr:
    if a == _ZERO:
        return b
    if b == _ZERO:
        return a
    return a + b


def _neg(a: Expr) -> Expr:
    return _ZERO if a == _ZERO else -a


def _mul(a: Expr, b: Expr) -> Expr:
    if _ZERO in (a, b):
        return _ZERO
    if a == _ONE:
        return b
    if b == _ONE:
        return a
    return a * b


def _div(a: Expr, b: Expr) -> Expr:
    return _ZERO if a == _ZERO else a / b
