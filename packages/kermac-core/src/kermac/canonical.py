"""The normal form of IR expressions: one tree for the ways of writing the same per-element math.

Core's facts about programs ([`kermac.programs`][kermac.programs]: "is this a sum of squared differences?",
"is this term a signed power?", ...) are decided on the normal form, so that `(z − x)²`,
`(x − z)·(x − z)` and `pow(x − z, 2)` take the same fast paths in every backend.  Programs keep
the tree they were written with, and backends render that tree: the normal form only decides which
kernel (and which derivative formula) computes a program, never what a kernel evaluates.

Every rewrite is exact in the IR's semantics (IEEE arithmetic with round-to-nearest, `pow` the
IEEE power): both sides give the same value for every input, signed zeros and infinities included,
and NaN for NaN (the sign and payload of a NaN are not values).  Applied bottom-up:

1. `pow(a, 2)` → `a·a`: IEEE `pow(a, 2)` is the correctly rounded a², as is `a·a`, for every
   a (also −0, ±∞ and NaN).  Implementations of `pow` approximate it (torch's with a tensor
   exponent, CUDA's `powf`, Triton's within their documented ulps), so a program written
   `pow(x − z, 2)` that a fact sends to a fast path gets the accuracy documented for that path,
   the accuracy `(x − z)·(x − z)` has.
2. Arguments whose sign cannot matter take one sign.  `|a|`, a square `a·a` and the tests
   `[a = 0]`, `[a ≠ 0]`, `[a = a]`, `[a ≠ a]` give the same value for `a` and `−a`, so
   there `−a` becomes `a` and a difference `b − a` becomes `a − b` when `a` comes first in
   the order of rule 3 (round-to-nearest is symmetric: fl(b − a) = −fl(a − b), and the two are
   both +0 when a = b).  `|a|·|a|` is `a·a`.  A negative zero compared with `=` or `≠` is 0.
3. The arguments of the commutative operations `add`, `mul`, `eq` and `ne` are listed in a
   fixed order (by their canonical text, [`kermac.ir.to_sexpr`][kermac.ir.to_sexpr]; `x` comes before `z`):
   a + b = b + a and a·b = b·a exactly.

Deliberately not rewritten: reassociation ((a + b) + c and a + (b + c) round differently), the
argument order of `min` and `max` (which zero min(+0, −0) gives is not fixed across backends),
and a product of a difference with its negation, (x − z)·(z − x) = −(x − z)², which is no square.
"""

from __future__ import annotations

from kermac.ir import Call, Const, Expr, to_sexpr

__all__ = ["canonical", "equivalent"]

_COMMUTATIVE = frozenset({"add", "mul", "eq", "ne"})
"""Operations whose two arguments commute exactly."""
_ZERO = Const(0.0)
_TWO = Const(2.0)


def canonical(expr: Expr) -> Expr:
    """The normal form of `expr` (see the module docs): equal for the equivalent ways of writing it."""
    if not isinstance(expr, Call):
        return expr
    args = tuple(canonical(a) for a in expr.args)
    op = expr.op
    if op == "pow" and args[1] == _TWO:
        op, args = "mul", (args[0], args[0])
    if op == "abs":
        return Call("abs", (_unsigned(args[0]),))
    if op == "mul" and args[0] == args[1]:
        square = args[0].args[0] if isinstance(args[0], Call) and args[0].op == "abs" else args[0]
        base = _unsigned(square)
        return Call("mul", (base, base))
    if op in ("eq", "ne"):
        args = tuple(_ZERO if a == Const(-0.0) else a for a in args)
        if args[0] == args[1]:
            args = (_unsigned(args[0]),) * 2
        elif _ZERO in args:
            args = tuple(a if a == _ZERO else _unsigned(a) for a in args)
    if op in _COMMUTATIVE:
        args = tuple(sorted(args, key=to_sexpr))
    return Call(op, args)


def equivalent(a: Expr, b: Expr) -> bool:
    """Whether `a` and `b` have the same normal form (and so the same value for every input)."""
    return a == b or canonical(a) == canonical(b)


def _unsigned(expr: Expr) -> Expr:
    """The representative of {`expr`, −`expr`} for an argument whose sign cannot matter (rule 2)."""
    while isinstance(expr, Call) and expr.op == "neg":
        expr = expr.args[0]
    if isinstance(expr, Call) and expr.op == "sub":
        a, b = expr.args
        if to_sexpr(b) < to_sexpr(a):
            return Call("sub", (b, a))
    return expr
