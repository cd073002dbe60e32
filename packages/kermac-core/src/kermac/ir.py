"""kermac's expression IR: the per-element math of every fused kernel, owned by core.

Every operation kermac runs is a *semiring program*: a per-element expression evaluated inside
the reduction loop, a reduction (sum, max or min) over the contracted index, and an epilogue
applied to the reduced value.  The expressions are small immutable trees built from

* [`Const`][kermac.ir.Const] — a float literal,
* [`Var`][kermac.ir.Var] — a per-element input whose meaning the program defines (`x`, `z`, `acc`, ...),
* [`Hyper`][kermac.ir.Hyper] — a named hyperparameter (a number or a per-batch tensor at run time),
* [`Call`][kermac.ir.Call] — an operation from [`OPS`][kermac.ir.OPS] applied to sub-expressions.

Expressions support Python's arithmetic operators, so `exp(-abs(x - z) / Hyper("bandwidth"))`
builds a tree.  Comparisons are functions ([`lt`][kermac.ir.lt], [`eq`][kermac.ir.eq], ...) because `==` on
expressions means structural equality (expressions are hashable and compare by value).

Programs compute in a compute type: float32 for float16, bfloat16 and float32 inputs, float64 for
float64 inputs.  A constant (and a hyperparameter) is rounded once to the compute type before it is
used, as the reference evaluator does; every backend renders it that way.

Semantics of every operation (all in floating point; a comparison yields 1.0 or 0.0):

| op | arity | value |
|---|---|---|
| add | 2 | a + b |
| sub | 2 | a − b |
| mul | 2 | a · b |
| div | 2 | a / b |
| neg | 1 | −a |
| abs | 1 | \\|a\\| |
| sqrt | 1 | √a |
| exp | 1 | eᵃ |
| log | 1 | ln a |
| pow | 2 | aᵇ  (IEEE `pow`: 0ᵇ = 0 for b > 0, 0⁰ = 1) |
| min, max | 2 | minimum / maximum (NaN propagates) |
| sign | 1 | −1, +0 or 1 (sign(±0) = +0 as torch.sign; NaN → NaN) |
| lt le gt | 2 | a < b, a ≤ b, a > b |
| ge eq ne | 2 | a ≥ b, a = b, a ≠ b |
| select | 3 | b if a ≠ 0 else c |

Backends generate code from these trees (CUDA C, Triton) or evaluate them (the reference
backend); [`render`][kermac.ir.render] walks a tree with a backend-supplied table of formats so no backend
re-implements the traversal.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

__all__ = [
    "OPS",
    "Call",
    "Const",
    "Expr",
    "Hyper",
    "Number",
    "Var",
    "abs_",
    "as_expr",
    "eq",
    "exp",
    "free_vars",
    "from_sexpr",
    "ge",
    "gt",
    "hyper_names",
    "le",
    "log",
    "lt",
    "maximum",
    "minimum",
    "ne",
    "pow",
    "render",
    "select",
    "sign",
    "sqrt",
    "substitute",
    "walk",
]

Number = int | float

OPS: Mapping[str, int] = {
    "add": 2,
    "sub": 2,
    "mul": 2,
    "div": 2,
    "neg": 1,
    "abs": 1,
    "sqrt": 1,
    "exp": 1,
    "log": 1,
    "pow": 2,
    "min": 2,
    "max": 2,
    "sign": 1,
    "lt": 2,
    "le": 2,
    "gt": 2,
    "ge": 2,
    "eq": 2,
    "ne": 2,
    "select": 3,
}
"""Operation name → arity.  The table above gives their semantics."""


class Expr:
    """Base class of IR nodes.  Nodes are frozen dataclasses: hashable, compared by value."""

    __slots__ = ()

    def __add__(self, other: Expr | Number) -> Expr:
        return Call("add", (self, as_expr(other)))

    def __radd__(self, other: Number) -> Expr:
        return Call("add", (as_expr(other), self))

    def __sub__(self, other: Expr | Number) -> Expr:
        return Call("sub", (self, as_expr(other)))

    def __rsub__(self, other: Number) -> Expr:
        return Call("sub", (as_expr(other), self))

    def __mul__(self, other: Expr | Number) -> Expr:
        return Call("mul", (self, as_expr(other)))

    def __rmul__(self, other: Number) -> Expr:
        return Call("mul", (as_expr(other), self))

    def __truediv__(self, other: Expr | Number) -> Expr:
        return Call("div", (self, as_expr(other)))

    def __rtruediv__(self, other: Number) -> Expr:
        return Call("div", (as_expr(other), self))

    def __pow__(self, other: Expr | Number) -> Expr:
        return Call("pow", (self, as_expr(other)))

    def __rpow__(self, other: Number) -> Expr:
        return Call("pow", (as_expr(other), self))

    def __neg__(self) -> Expr:
        return Call("neg", (self,))

    def __abs__(self) -> Expr:
        return Call("abs", (self,))

    def __str__(self) -> str:
        return to_sexpr(self)


@dataclass(frozen=True, slots=True, eq=False)
class Const(Expr):
    """A floating-point literal.

    Constants compare and hash by their IEEE bits, with one NaN: `Const(0.0) != Const(-0.0)`
    (they are different programs: 1/−0 = −∞) and `Const(nan) == Const(nan)` (so a program with a
    NaN constant equals itself and is compiled once).
    """

    value: float

    def __post_init__(self) -> None:
        if isinstance(self.value, bool) or not isinstance(self.value, (int, float)):
            raise TypeError(f"Const value: expected a real number, got {type(self.value).__name__}")
        object.__setattr__(self, "value", float(self.value))

    def _bits(self) -> bytes:
        return b"nan" if math.isnan(self.value) else struct.pack("<d", self.value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Const) and self._bits() == other._bits()

    def __hash__(self) -> int:
        return hash((Const, self._bits()))


@dataclass(frozen=True, slots=True)
class Var(Expr):
    """A per-element input; its meaning (`x`, `z`, `acc`, ...) is defined by the program."""

    name: str

    def __post_init__(self) -> None:
        _check_identifier("Var name", self.name)


@dataclass(frozen=True, slots=True)
class Hyper(Expr):
    """A named hyperparameter: a number or a per-batch-entry tensor supplied at run time."""

    name: str

    def __post_init__(self) -> None:
        _check_identifier("Hyper name", self.name)


@dataclass(frozen=True, slots=True)
class Call(Expr):
    """An operation of [`OPS`][kermac.ir.OPS] applied to argument expressions."""

    op: str
    args: tuple[Expr, ...]

    def __post_init__(self) -> None:
        arity = OPS.get(self.op)
        if arity is None:
            raise ValueError(f"Call op: expected one of {sorted(OPS)}, got {self.op!r}")
        if not isinstance(self.args, tuple) or len(self.args) != arity:
            raise ValueError(f"Call {self.op!r}: expected {arity} argument(s), got {len(self.args)}")
        for a in self.args:
            if not isinstance(a, Expr):
                raise TypeError(f"Call {self.op!r}: arguments must be Expr, got {type(a).__name__}")


def _check_identifier(what: str, name: object) -> None:
    if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
        raise ValueError(f"{what}: expected a Python identifier not starting with '_', got {name!r}")


def as_expr(value: Expr | Number) -> Expr:
    """Wrap a Python number as [`Const`][kermac.ir.Const]; pass expressions through."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected an Expr or a real number, got {type(value).__name__}")
    return Const(value)


def _call(op: str, *args: Expr | Number) -> Expr:
    return Call(op, tuple(as_expr(a) for a in args))


def abs_(a: Expr | Number) -> Expr:
    """|a| (also available as the builtin `abs(expr)`)."""
    return _call("abs", a)


def sqrt(a: Expr | Number) -> Expr:
    """√a."""
    return _call("sqrt", a)


def exp(a: Expr | Number) -> Expr:
    """eᵃ."""
    return _call("exp", a)


def log(a: Expr | Number) -> Expr:
    """ln a."""
    return _call("log", a)


def pow(a: Expr | Number, b: Expr | Number) -> Expr:
    """aᵇ (also `a ** b`)."""
    return _call("pow", a, b)


def minimum(a: Expr | Number, b: Expr | Number) -> Expr:
    """min(a, b)."""
    return _call("min", a, b)


def maximum(a: Expr | Number, b: Expr | Number) -> Expr:
    """max(a, b)."""
    return _call("max", a, b)


def sign(a: Expr | Number) -> Expr:
    """sgn(a) ∈ {−1, +0, 1} (+0 also for −0, as torch.sign); NaN for NaN."""
    return _call("sign", a)


def select(cond: Expr | Number, if_true: Expr | Number, if_false: Expr | Number) -> Expr:
    """`if_true` where `cond ≠ 0`, else `if_false`."""
    return _call("select", cond, if_true, if_false)


def lt(a: Expr | Number, b: Expr | Number) -> Expr:
    """1.0 if a < b else 0.0."""
    return _call("lt", a, b)


def le(a: Expr | Number, b: Expr | Number) -> Expr:
    """1.0 if a ≤ b else 0.0."""
    return _call("le", a, b)


def gt(a: Expr | Number, b: Expr | Number) -> Expr:
    """1.0 if a > b else 0.0."""
    return _call("gt", a, b)


def ge(a: Expr | Number, b: Expr | Number) -> Expr:
    """1.0 if a ≥ b else 0.0."""
    return _call("ge", a, b)


def eq(a: Expr | Number, b: Expr | Number) -> Expr:
    """1.0 if a = b else 0.0."""
    return _call("eq", a, b)


def ne(a: Expr | Number, b: Expr | Number) -> Expr:
    """1.0 if a ≠ b else 0.0."""
    return _call("ne", a, b)


def walk(expr: Expr) -> Iterator[Expr]:
    """Every node of `expr`, parents before children."""
    stack = [expr]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, Call):
            stack.extend(reversed(node.args))


def free_vars(expr: Expr) -> frozenset[str]:
    """Names of the [`Var`][kermac.ir.Var] nodes in `expr`."""
    return frozenset(n.name for n in walk(expr) if isinstance(n, Var))


def hyper_names(expr: Expr) -> frozenset[str]:
    """Names of the [`Hyper`][kermac.ir.Hyper] nodes in `expr`."""
    return frozenset(n.name for n in walk(expr) if isinstance(n, Hyper))


def substitute(expr: Expr, mapping: Mapping[str, Expr]) -> Expr:
    """`expr` with every `Var(name)` for `name` in `mapping` replaced by `mapping[name]`."""
    if isinstance(expr, Var):
        return mapping.get(expr.name, expr)
    if isinstance(expr, Call):
        return Call(expr.op, tuple(substitute(a, mapping) for a in expr.args))
    return expr


def render(
    expr: Expr,
    *,
    const: Callable[[float], str],
    var: Callable[[str], str],
    hyper: Callable[[str], str],
    ops: Mapping[str, str],
) -> str:
    """Render `expr` as source text.

    `ops` maps each operation name to a `str.format` template over its arguments `{0}`,
    `{1}`, `{2}` (e.g. `"({0} + {1})"` or `"fabsf({0})"`).  A backend that lacks an
    operation gets a `KeyError` naming it.
    """
    if isinstance(expr, Const):
        return const(expr.value)
    if isinstance(expr, Var):
        return var(expr.name)
    if isinstance(expr, Hyper):
        return hyper(expr.name)
    assert isinstance(expr, Call)
    try:
        template = ops[expr.op]
    except KeyError:
        raise KeyError(f"operation {expr.op!r} has no rendering in this backend") from None
    args = [render(a, const=const, var=var, hyper=hyper, ops=ops) for a in expr.args]
    return template.format(*args)


def _const_sexpr(v: float) -> str:
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return repr(v)


def to_sexpr(expr: Expr) -> str:
    """Canonical text of `expr` (an s-expression); equal trees give equal text."""
    return render(
        expr,
        const=_const_sexpr,
        var=lambda n: n,
        hyper=lambda n: f"${n}",
        ops={op: "(" + op + "".join(f" {{{i}}}" for i in range(k)) + ")" for op, k in OPS.items()},
    )


_SEXPR_TOKEN = re.compile(r"\(|\)|[^\s()]+")


def from_sexpr(text: str) -> Expr:
    """The expression whose [`to_sexpr`][kermac.ir.to_sexpr] is `text` (`from_sexpr(to_sexpr(e)) == e`).

    Program keys are s-expressions, so a program travels as text (e.g. as a string argument of
    kermac's `torch.library` operations) and is rebuilt exactly.  Raises `ValueError` naming the
    position of the first token it cannot read.
    """
    tokens = _SEXPR_TOKEN.findall(text)
    expr, end = _parse(tokens, 0, text)
    if end != len(tokens):
        raise ValueError(f"s-expression: unexpected {tokens[end]!r} after a complete expression in {text!r}")
    return expr


def _parse(tokens: list[str], i: int, text: str) -> tuple[Expr, int]:
    if i >= len(tokens):
        raise ValueError(f"s-expression: ended early in {text!r}")
    token = tokens[i]
    if token == "(":
        if i + 1 >= len(tokens):
            raise ValueError(f"s-expression: ended after '(' in {text!r}")
        op, i = tokens[i + 1], i + 2
        args = []
        while i < len(tokens) and tokens[i] != ")":
            arg, i = _parse(tokens, i, text)
            args.append(arg)
        if i >= len(tokens):
            raise ValueError(f"s-expression: missing ')' for {op!r} in {text!r}")
        return Call(op, tuple(args)), i + 1
    if token == ")":
        raise ValueError(f"s-expression: unexpected ')' (token {i}) in {text!r}")
    if token.startswith("$"):
        return Hyper(token[1:]), i + 1
    try:
        return Const(float(token)), i + 1
    except ValueError:
        return Var(token), i + 1
