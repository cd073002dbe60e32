r"""Programs from Python functions: [`program`][kermac.dsl.program] and
[`gradient_program`][kermac.dsl.gradient_program] trace plain Python functions into the IR
([`kermac.ir`][kermac.ir]) and return a callable kernel.

```python
import kermac
from kermac import dsl

lp = kermac.program(
    inner=lambda x, z, p: abs(x - z) ** p,   # one term per feature k
    reduce="sum",                           # the semiring's addition
    epilogue=lambda acc, p: acc ** (1 / p),  # applied to the reduced value
)
out = lp(x, z, p=1.3)                        # out[..., m, n] = (Σ_k |x[..., m, k] − z[..., n, k]|^1.3)^(1/1.3)
```

**Names.**  A function's parameters are read by name.  These names are the operands, the same in every
program kind, and no hyperparameter can take them:

| name | value | readable in |
|---|---|---|
| `x`, `z` | `x[ℓ, m, k]`, `z[ℓ, n, k]` | `inner` |
| `acc` | the reduced value | `epilogue` (both kinds) |
| `diag` | 1.0 where `m + offset_m == n + offset_n`, else 0.0 | the pairwise `epilogue` |
| `a`, `b`, `d` | `a[ℓ, k, m]`, `b[ℓ, n, k]`, `d[ℓ, n, m]` | `multiply` |
| `c` | `c[ℓ, o, k]` | the accumulation `Σ_k c · multiply` (no function reads it) |

(ℓ is the batch entry.)  Every other parameter is a **hyperparameter**: a name given by keyword when the
kernel is called, as a number or as a tensor broadcasting against the batch dimensions (one value per batch
entry computes a batch of kernel matrices in one launch; [`kermac.hyperparams`][kermac.hyperparams]).  A
name used in several functions of a program is one hyperparameter.  The keywords of the call
([`RESERVED`][kermac.dsl.RESERVED]: `out`, `backend`, ...) cannot be hyperparameters either.

**Tracing.**  Each function is called once, with proxies in place of its parameters; what it returns is
the expression.  Proxies support `+ − * / **`, unary `−`, `abs()`, the comparisons `< <= > >= == !=`
(which give 1.0 or 0.0), numbers (also numpy's) on either side, and the functions of this module
([`exp`][kermac.dsl.exp], [`log`][kermac.dsl.log], [`sqrt`][kermac.dsl.sqrt], [`where`][kermac.dsl.where],
[`minimum`][kermac.dsl.minimum], [`maximum`][kermac.dsl.maximum], [`sign`][kermac.dsl.sign], ...).  What
the IR cannot express raises a `TypeError` that names the function, its file and line, and the line's
source: Python's `if`, `and`, `or`, `not` or `min()`/`max()` on a traced value (they need a `bool`; use
[`where`][kermac.dsl.where], `*`, [`minimum`][kermac.dsl.minimum]), `math.exp` and other conversions to
`float`, numpy functions other than arithmetic, torch functions and tensors, attributes (`x.exp()`),
indexing, `%` and `//`, `*args`, `**kwargs` and parameter defaults.  A bad name (an operand in the wrong
function, a reserved name, a hyperparameter no expression reads) is a `ValueError` naming it.

The traced program is an ordinary [`PairwiseProgram`][kermac.programs.PairwiseProgram] or
[`GradProgram`][kermac.programs.GradProgram] (`kernel.program`): it runs on every backend, through
[`run_program`][kermac.api.run_program], [`program_product`][kermac.api.program_product] and
[`KernelOperator`][kermac.operator.KernelOperator] too, and a program that computes what a preset computes
takes the preset's fast path: backends choose their kernels on the normal form of the program
([`kermac.canonical`][kermac.canonical]), so `(x - z) ** 2` and `(x - z) * (x - z)` are the same kernel;
[`canonical_key`][kermac.dsl.canonical_key] shows it.
"""

from __future__ import annotations

import inspect
import linecache
import numbers
import operator
from collections.abc import Callable, Mapping
from types import CodeType, TracebackType
from typing import Any

import torch

from kermac.canonical import canonical
from kermac.ir import Call, Const, Expr, Hyper, Var, free_vars, hyper_names, to_sexpr
from kermac.programs import REDUCTIONS, GradProgram, PairwiseProgram

__all__ = [
    "OPERANDS",
    "RESERVED",
    "GradKernel",
    "Kernel",
    "Traced",
    "abs",
    "canonical_key",
    "eq",
    "exp",
    "ge",
    "gradient_program",
    "gt",
    "le",
    "log",
    "lt",
    "maximum",
    "minimum",
    "ne",
    "pow",
    "program",
    "sigmoid",
    "sign",
    "sqrt",
    "tanh",
    "where",
]

HyperInput = float | torch.Tensor

_ROLES: dict[str, tuple[str, ...]] = {
    "inner": ("x", "z"),
    "epilogue": ("acc", "diag"),
    "multiply": ("a", "b", "d"),
    "gradient epilogue": ("acc",),
}
"""The operands each function reads, by name (the module docs' table)."""

OPERANDS: frozenset[str] = frozenset({"x", "z", "acc", "diag", "a", "b", "c", "d"})
"""The operand names of every program kind; none can be a hyperparameter."""

RESERVED: frozenset[str] = OPERANDS | frozenset({"v", "out", "transpose", "offset_m", "offset_n", "backend", "debug"})
"""Names no hyperparameter can take: the operands and the keywords of a kernel's call."""

_WHERE_OPERAND = {
    "x": "the inner term",
    "z": "the inner term",
    "acc": "an epilogue",
    "diag": "the epilogue of a pairwise program",
    "a": "the multiply of a gradient program",
    "b": "the multiply of a gradient program",
    "d": "the multiply of a gradient program",
    "c": "no function (it enters by the accumulation Σ_k c·multiply)",
}


# -- traced values -------------------------------------------------------------------------------


def _expr(value: object) -> Expr:
    """The expression of a proxy or a real number (numpy's too); `TypeError` naming what came."""
    if isinstance(value, Traced):
        return value.expr
    if isinstance(value, torch.Tensor):
        raise TypeError(
            "a torch.Tensor cannot enter a program: pass it as a hyperparameter (a parameter of the function, "
            "given by keyword at call time as a number or one value per batch entry)"
        )
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # numpy's bool_ is no Real either
        raise TypeError(f"expected a traced value or a real number, got {type(value).__name__}")
    return Const(float(value))


def _traced(op: str, *args: object) -> Traced:
    return Traced(Call(op, tuple(_expr(a) for a in args)))


_NOT_BOOL = (
    "a traced value has no truth value: Python's `if`, `and`, `or`, `not`, chained comparisons and the builtins "
    "min()/max() need one. Write kermac.dsl.where(cond, a, b) for a choice, `*` for `and`, "
    "kermac.dsl.minimum / kermac.dsl.maximum for min/max"
)


class Traced:
    """A traced value: a proxy for an operand or hyperparameter while a function is traced.

    Arithmetic, comparisons and the functions of [`kermac.dsl`][kermac.dsl] build
    [`kermac.ir`][kermac.ir] expressions; `expr` is the expression built so far.  Everything else raises
    `TypeError` (or `AttributeError` for an attribute) saying what to write instead.
    """

    __slots__ = ("expr",)
    __hash__ = None  # `==` builds an expression, so a proxy is no dictionary key

    def __init__(self, expr: Expr) -> None:
        object.__setattr__(self, "expr", expr)

    def __repr__(self) -> str:
        return f"Traced({to_sexpr(self.expr)})"

    # arithmetic
    def __add__(self, other: object) -> Traced:
        return _traced("add", self, other)

    def __radd__(self, other: object) -> Traced:
        return _traced("add", other, self)

    def __sub__(self, other: object) -> Traced:
        return _traced("sub", self, other)

    def __rsub__(self, other: object) -> Traced:
        return _traced("sub", other, self)

    def __mul__(self, other: object) -> Traced:
        return _traced("mul", self, other)

    def __rmul__(self, other: object) -> Traced:
        return _traced("mul", other, self)

    def __truediv__(self, other: object) -> Traced:
        return _traced("div", self, other)

    def __rtruediv__(self, other: object) -> Traced:
        return _traced("div", other, self)

    def __pow__(self, other: object) -> Traced:
        return _traced("pow", self, other)

    def __rpow__(self, other: object) -> Traced:
        return _traced("pow", other, self)

    def __neg__(self) -> Traced:
        return _traced("neg", self)

    def __pos__(self) -> Traced:
        return self

    def __abs__(self) -> Traced:
        return _traced("abs", self)

    # comparisons: 1.0 or 0.0
    def __lt__(self, other: object) -> Traced:
        return _traced("lt", self, other)

    def __le__(self, other: object) -> Traced:
        return _traced("le", self, other)

    def __gt__(self, other: object) -> Traced:
        return _traced("gt", self, other)

    def __ge__(self, other: object) -> Traced:
        return _traced("ge", self, other)

    def __eq__(self, other: object) -> Traced:  # type: ignore[override]
        return _traced("eq", self, other)

    def __ne__(self, other: object) -> Traced:  # type: ignore[override]
        return _traced("ne", self, other)

    # what the IR cannot express
    def __bool__(self) -> bool:
        raise TypeError(_NOT_BOOL)

    def __float__(self, *args: object) -> float:
        raise TypeError(
            "a traced value cannot become a Python number (math.exp, math.sqrt, float(), int(), round() need "
            "one): use the functions of kermac.dsl (dsl.exp, dsl.sqrt, dsl.log, ...)"
        )

    __int__ = __index__ = __complex__ = __round__ = __trunc__ = __floor__ = __ceil__ = __float__

    def _unsupported(self, *args: object) -> Traced:
        raise TypeError(
            "the IR has no %, //, @, bit operations or divmod; programs use + − * / **, comparisons and the "
            "functions of kermac.dsl"
        )

    __mod__ = __rmod__ = __floordiv__ = __rfloordiv__ = __matmul__ = __rmatmul__ = _unsupported
    __and__ = __rand__ = __or__ = __ror__ = __xor__ = __rxor__ = __invert__ = _unsupported
    __lshift__ = __rlshift__ = __rshift__ = __rrshift__ = __divmod__ = __rdivmod__ = _unsupported

    def __getitem__(self, key: object) -> Traced:
        raise TypeError(
            "a traced value is one element (x[ℓ, m, k], ...), not an array: it has no items; the reduction over "
            "the features is the program's `reduce`"
        )

    def __iter__(self) -> Traced:
        raise TypeError("a traced value is one element, not a sequence: it cannot be iterated or unpacked")

    def __len__(self) -> int:
        raise TypeError("a traced value is one element, not a sequence: it has no len()")

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("a traced value is immutable")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # protocol probes (numpy's __array_interface__, copy's __deepcopy__, ...)
            raise AttributeError(name)
        raise AttributeError(
            f"a traced value has no attribute {name!r}: write kermac.dsl.{name}(value) if kermac.dsl has it "
            f"(exp, log, sqrt, sign, where, minimum, maximum, ...)"
        )

    def __array__(self, *args: object, **kwargs: object) -> Any:
        raise TypeError("a traced value cannot become a numpy array: use the functions of kermac.dsl")

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: object, **kwargs: object) -> Any:
        """Arithmetic with numpy numbers (`np.float32(2) * x`) traces as with Python numbers; any other
        numpy function is refused, naming the kermac.dsl function to use."""
        name = getattr(ufunc, "__name__", str(ufunc))
        op = _NUMPY_OPERATORS.get(name)
        if method != "__call__" or op is None or kwargs:
            raise TypeError(
                f"numpy.{name} cannot trace: a program is built from + − * / **, comparisons and the functions "
                f"of kermac.dsl (write kermac.dsl.{name}(...) if kermac.dsl has it)"
            )
        # numpy numbers (and the 0-d arrays numpy hands them over as) become Python numbers: the operator
        # then traces as with those, instead of calling numpy back
        return op(*(i if isinstance(i, Traced) or getattr(i, "shape", None) != () else i.item() for i in inputs))

    def __array_function__(self, func: Any, types: object, args: object, kwargs: object) -> Any:
        raise TypeError(
            f"numpy.{getattr(func, '__name__', func)} cannot trace: use the functions of kermac.dsl "
            "(where, minimum, maximum, exp, ...)"
        )

    @classmethod
    def __torch_function__(cls, func: Any, types: object, args: object = (), kwargs: object = None) -> Any:
        raise TypeError(
            f"torch function {getattr(func, '__name__', func)} cannot trace: a program is built from + − * / **, "
            "comparisons and the functions of kermac.dsl; a tensor enters a program only as a hyperparameter"
        )


_NUMPY_OPERATORS: dict[str, Callable[..., Traced]] = {
    "add": operator.add,
    "subtract": operator.sub,
    "multiply": operator.mul,
    "true_divide": operator.truediv,
    "divide": operator.truediv,
    "power": operator.pow,
    "negative": operator.neg,
    "positive": operator.pos,
    "absolute": operator.abs,
    "less": operator.lt,
    "less_equal": operator.le,
    "greater": operator.gt,
    "greater_equal": operator.ge,
    "equal": operator.eq,
    "not_equal": operator.ne,
}
"""numpy ufuncs that are Python operators: with a numpy number and a proxy they trace as the operator."""


# -- the functions of the DSL --------------------------------------------------------------------

Value = Traced | float


def abs(a: Value) -> Traced:
    """|a| (the builtin `abs()` works on traced values too)."""
    return _traced("abs", a)


def sqrt(a: Value) -> Traced:
    """√a."""
    return _traced("sqrt", a)


def exp(a: Value) -> Traced:
    """eᵃ."""
    return _traced("exp", a)


def log(a: Value) -> Traced:
    """ln a."""
    return _traced("log", a)


def pow(a: Value, b: Value) -> Traced:
    """aᵇ (IEEE `pow`), as `a ** b`."""
    return _traced("pow", a, b)


def sign(a: Value) -> Traced:
    """sgn(a) ∈ {−1, +0, 1} (+0 also for −0, as torch.sign), NaN for NaN."""
    return _traced("sign", a)


def minimum(a: Value, b: Value) -> Traced:
    """min(a, b), NaN propagating."""
    return _traced("min", a, b)


def maximum(a: Value, b: Value) -> Traced:
    """max(a, b), NaN propagating."""
    return _traced("max", a, b)


def where(cond: Value, if_true: Value, if_false: Value) -> Traced:
    """`if_true` where `cond ≠ 0` (a comparison is 1.0 or 0.0), else `if_false`: the IR's `select`."""
    return _traced("select", cond, if_true, if_false)


def lt(a: Value, b: Value) -> Traced:
    """1.0 if a < b else 0.0 (as `a < b`)."""
    return _traced("lt", a, b)


def le(a: Value, b: Value) -> Traced:
    """1.0 if a ≤ b else 0.0 (as `a <= b`)."""
    return _traced("le", a, b)


def gt(a: Value, b: Value) -> Traced:
    """1.0 if a > b else 0.0 (as `a > b`)."""
    return _traced("gt", a, b)


def ge(a: Value, b: Value) -> Traced:
    """1.0 if a ≥ b else 0.0 (as `a >= b`)."""
    return _traced("ge", a, b)


def eq(a: Value, b: Value) -> Traced:
    """1.0 if a = b else 0.0 (as `a == b`)."""
    return _traced("eq", a, b)


def ne(a: Value, b: Value) -> Traced:
    """1.0 if a ≠ b else 0.0 (as `a != b`)."""
    return _traced("ne", a, b)


def sigmoid(a: Value) -> Traced:
    """1 / (1 + e^(−a)): 0 at −∞, 1 at +∞."""
    return 1.0 / (1.0 + exp(-_as_traced(a)))


def tanh(a: Value) -> Traced:
    """tanh a = 1 − 2 / (e^(2a) + 1): −1 at −∞, 1 at +∞.

    Written with one exponential, as the IR has no `tanh`: its error is about the compute type's unit
    roundoff in absolute terms (not relative to tanh a where |a| is tiny).
    """
    return 1.0 - 2.0 / (exp(2.0 * _as_traced(a)) + 1.0)


def _as_traced(a: Value) -> Traced:
    return a if isinstance(a, Traced) else Traced(_expr(a))


# -- tracing -------------------------------------------------------------------------------------


def _code(fn: object) -> CodeType | None:
    return getattr(inspect.unwrap(fn), "__code__", None) if callable(fn) else None


def _describe(role: str, fn: object) -> str:
    """`inner (<lambda> at file.py:12)`: the function of `role` and where it is defined."""
    code = _code(fn)
    if code is None:
        return f"{role} ({fn!r})"
    return f"{role} ({code.co_name} at {code.co_filename}:{code.co_firstlineno})"


def _failing_line(fn: object, tb: TracebackType | None) -> str:
    """` (line N: source)` for the deepest line of `fn`'s file in the traceback `tb`, or ``."""
    code = _code(fn)
    if code is None:
        return ""
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == code.co_filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    if line is None:
        return ""
    source = linecache.getline(code.co_filename, line).strip()
    at = "" if line == code.co_firstlineno else f"line {line}: "
    return f" ({at}{source})" if source else f" (line {line})" if at else ""


def _trace(role: str, fn: object, order: list[str]) -> Expr:
    """The expression `fn` computes from proxies of its parameters; adds its hyperparameters to `order`."""
    if not callable(fn):
        raise TypeError(f"{role}: expected a function (e.g. a lambda), got {type(fn).__name__}")
    where = _describe(role, fn)
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{where}: its parameters cannot be read ({exc}); pass a lambda or a def") from None
    operands = _ROLES[role]
    positional, keywords, mine = [], {}, []
    for param in signature.parameters.values():
        name = param.name
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"{where}: parameter {'*' if param.kind == param.VAR_POSITIONAL else '**'}{name}: "
                            "every parameter must be named (an operand or a hyperparameter)")  # fmt: skip
        if param.default is not param.empty:
            raise TypeError(
                f"{where}: parameter {name!r} has a default; a hyperparameter's value is given when the kernel is "
                "called (Kernel.bind fixes one)"
            )
        if name in operands:
            value = Traced(Var(name))
        elif name in OPERANDS:
            raise ValueError(
                f"{where}: parameter {name!r} is an operand of {_WHERE_OPERAND[name]}; {role} reads "
                f"{', '.join(operands)} and hyperparameters"
            )
        elif name in RESERVED:
            raise ValueError(
                f"{where}: parameter {name!r} is a keyword of the kernel's call, which no hyperparameter can be "
                f"named (reserved: {', '.join(sorted(RESERVED))})"
            )
        elif name.startswith("_"):
            raise ValueError(f"{where}: parameter {name!r}: a hyperparameter's name cannot start with '_'")
        else:
            value = Traced(Hyper(name))
            mine.append(name)
        if param.kind == param.KEYWORD_ONLY:
            keywords[name] = value
        else:
            positional.append(value)
    try:
        result = fn(*positional, **keywords)
    except Exception as exc:
        message = str(exc) if isinstance(exc, (TypeError, AttributeError)) else f"{type(exc).__name__}: {exc}"
        raise TypeError(f"{where}{_failing_line(fn, exc.__traceback__)}: {message}") from exc
    if isinstance(result, Traced):
        expr = result.expr
    elif isinstance(result, bool) or not isinstance(result, numbers.Real):
        raise TypeError(f"{where}: returned {type(result).__name__}; expected a traced value or a number")
    else:
        expr = Const(float(result))
    unused = [n for n in mine if n not in hyper_names(expr)]
    if unused:
        raise ValueError(f"{where}: hyperparameter(s) {unused} not used by the expression it returns")
    order.extend(n for n in mine if n not in order)
    return expr


def program(inner: Callable[..., object], reduce: str = "sum", epilogue: Callable[..., object] | None = None) -> Kernel:
    r"""A pairwise kernel traced from Python functions (see the module docs for names and tracing).

    $$
    \mathrm{out}[\ell, m, n] = \mathrm{epilogue}\Big(\mathrm{acc} = \operatorname*{REDUCE}_{k}
        \mathrm{inner}(x[\ell, m, k], z[\ell, n, k]),\ \mathrm{diag} = [m + o_m = n + o_n]\Big)
    $$

    Args:
        inner: the term of one feature pair, a function of `x`, `z` (either may be left out) and
            hyperparameters, e.g. `lambda x, z, p: abs(x - z) ** p`.
        reduce: the reduction over the features, a name of
            [`kermac.programs.REDUCTIONS`][kermac.programs.REDUCTIONS] (`"sum"`, `"max"`, `"min"`, ...).
        epilogue: a function of `acc` (the reduced value), `diag` and hyperparameters, e.g.
            `lambda acc, p: acc ** (1 / p)`; `None` returns `acc`.

    Returns:
        A [`Kernel`][kermac.dsl.Kernel]: `kernel(x, z, **hyperparameters)` computes the matrix,
        `kernel.product(x, z, v, ...)` its product with `v`, `kernel.program` is the IR program.

    Raises:
        TypeError: a function uses what the IR cannot express (the message names its file and line).
        ValueError: a bad parameter name, or an unknown `reduce`.
    """
    if reduce not in REDUCTIONS:
        raise ValueError(f"reduce: expected one of {sorted(REDUCTIONS)}, got {reduce!r}")
    order: list[str] = []
    inner_expr = _trace("inner", inner, order)
    epilogue_expr = Var("acc") if epilogue is None else _trace("epilogue", epilogue, order)
    return Kernel(PairwiseProgram(inner_expr, reduce, epilogue_expr), tuple(order))


def gradient_program(multiply: Callable[..., object], epilogue: Callable[..., object] | None = None) -> GradKernel:
    r"""A gradient kernel traced from Python functions (see the module docs for names and tracing).

    $$
    \mathrm{out}[\ell, o, n, m] = \mathrm{epilogue}\Big(\mathrm{acc} = \sum_k c[\ell, o, k]\cdot
        \mathrm{multiply}(a[\ell, k, m], b[\ell, n, k], d[\ell, n, m])\Big)
    $$

    with the shapes of [`cdist_grad`][kermac.api.cdist_grad].  The fused gradient kernels compute
    `Σ_k c·a·g(b, d)`: `multiply` must be `a` times a factor that does not read `a` (any product with `a` as
    one factor, e.g. `alpha * (d - b) * a`); the kernels multiply `c`, `a` and that factor in their own
    order.  The accumulation is the sum of `c · multiply`.

    Args:
        multiply: a function of `a`, `b`, `d` and hyperparameters, e.g. `lambda a, b, d: a * dsl.sign(d - b)`.
        epilogue: a function of `acc` and hyperparameters; `None` returns `acc`.

    Returns:
        A [`GradKernel`][kermac.dsl.GradKernel]: `kernel(a, b, c, d, **hyperparameters)`.

    Raises:
        TypeError: a function uses what the IR or the gradient kernels cannot express (naming its file and
            line), e.g. `a` other than as a factor.
        ValueError: a bad parameter name.
    """
    order: list[str] = []
    term = _trace("multiply", multiply, order)
    factor = _without_factor_a(term)
    if factor is None:
        raise TypeError(
            f"{_describe('multiply', multiply)}: expected a · g(b, d), a product with the operand a as one factor "
            f"and no other use of a (the fused gradient kernels compute Σ_k c·a·g(b, d)); got {to_sexpr(term)}"
        )
    epilogue_expr = Var("acc") if epilogue is None else _trace("gradient epilogue", epilogue, order)
    return GradKernel(GradProgram(factor, epilogue_expr), tuple(order))


def _factors(expr: Expr) -> list[Expr]:
    """The factors of a product tree (`expr` itself if it is no product)."""
    if isinstance(expr, Call) and expr.op == "mul":
        return _factors(expr.args[0]) + _factors(expr.args[1])
    return [expr]


def _without_factor_a(term: Expr) -> Expr | None:
    """`g` if `term` is a product with `Var("a")` as exactly one factor and `g` (the other factors, in their
    order) does not read `a`; else `None`."""
    factors = _factors(term)
    rest = [f for f in factors if f != Var("a")]
    if len(rest) != len(factors) - 1 or any("a" in free_vars(f) for f in rest):
        return None
    if not rest:
        return Const(1.0)
    g = rest[0]
    for f in rest[1:]:
        g = Call("mul", (g, f))
    return g


def canonical_key(program: PairwiseProgram | GradProgram) -> str:
    """The key of `program` with each expression in normal form ([`kermac.canonical`][kermac.canonical]).

    Two programs with the same canonical key compute the same values (the normal form's rewritings are
    exact) and take the same kernel in every backend, which chooses on the normal form; the traced
    `(x - z) ** 2` and the presets' `(x - z) * (x - z)` have the same one.
    """
    if isinstance(program, PairwiseProgram):
        return (
            f"pairwise;{program.reduction};{to_sexpr(canonical(program.inner))};{to_sexpr(canonical(program.epilogue))}"
        )
    if isinstance(program, GradProgram):
        return f"grad;{to_sexpr(canonical(program.multiply))};{to_sexpr(canonical(program.epilogue))}"
    raise TypeError(f"program: expected a PairwiseProgram or GradProgram, got {type(program).__name__}")


# -- the kernels ----------------------------------------------------------------------------------


class _Traced:
    """What both kernel kinds share: the program, its hyperparameter names and the values bound to some."""

    __slots__ = ("_bound", "parameters", "program")

    def __init__(self, program: Any, parameters: tuple[str, ...], bound: Mapping[str, HyperInput] | None = None):
        self.program = program
        self.parameters = parameters
        self._bound = dict(bound or {})

    @property
    def hypers(self) -> tuple[str, ...]:
        """The hyperparameters a call must give: the functions' parameters not fixed by
        [`bind`][kermac.dsl.Kernel.bind], in the order the functions declare them."""
        return tuple(n for n in self.parameters if n not in self._bound)

    @property
    def bound(self) -> dict[str, HyperInput]:
        """The hyperparameters fixed by [`bind`][kermac.dsl.Kernel.bind] (a copy)."""
        return dict(self._bound)

    def key(self) -> str:
        """The program's key ([`PairwiseProgram.key`][kermac.programs.PairwiseProgram.key]): what the JIT
        cache compiles once."""
        return self.program.key()

    def bind(self, **hypers: HyperInput) -> Any:
        """The same kernel with some hyperparameters fixed (a number or tensor each); a call gives the rest.
        The program is unchanged: every value of a bound hyperparameter runs the same compiled kernel."""
        unknown = sorted(set(hypers) - set(self.hypers))
        if unknown:
            raise ValueError(f"bind: expected hyperparameters of {list(self.hypers)}, got unknown {unknown}")
        bound = object.__new__(type(self))  # the same class (a zoo kernel keeps its call), not its constructor
        _Traced.__init__(bound, self.program, self.parameters, {**self._bound, **hypers})
        return bound

    def _hypers(self, given: Mapping[str, HyperInput]) -> dict[str, HyperInput]:
        twice = sorted(set(given) & set(self._bound))
        if twice:
            raise ValueError(f"{', '.join(twice)}: fixed by bind(), given again in the call")
        return {**self._bound, **given}

    def __repr__(self) -> str:
        bound = f", bound={sorted(self._bound)}" if self._bound else ""
        return f"{type(self).__name__}({self.key()!r}, hypers={list(self.hypers)}{bound})"


class Kernel(_Traced):
    """A pairwise kernel built by [`program`][kermac.dsl.program]: call it as `kernel(x, z, **hypers)`.

    Attributes:
        program: the traced [`PairwiseProgram`][kermac.programs.PairwiseProgram].
        parameters: every hyperparameter name, in the order the functions declare them.
    """

    __slots__ = ()

    def __call__(
        self,
        x: torch.Tensor,
        z: torch.Tensor,
        *,
        out: torch.Tensor | None = None,
        offset_m: int = 0,
        offset_n: int = 0,
        backend: str = "auto",
        debug: bool = False,
        **hypers: HyperInput,
    ) -> torch.Tensor:
        """The kernel matrix `[..., M, N]` of `x` `[..., M, D]` and `z` `[..., N, D]`, as
        [`run_program`][kermac.api.run_program] computes it (the same arguments; hyperparameters by keyword)."""
        from kermac.api import run_program

        return run_program(
            self.program, x, z, hypers=self._hypers(hypers), out=out, offset_m=offset_m, offset_n=offset_n,
            backend=backend, debug=debug,
        )  # fmt: skip

    def product(
        self,
        x: torch.Tensor,
        z: torch.Tensor,
        v: torch.Tensor,
        *,
        transpose: bool = False,
        out: torch.Tensor | None = None,
        offset_m: int = 0,
        offset_n: int = 0,
        backend: str = "auto",
        debug: bool = False,
        **hypers: HyperInput,
    ) -> torch.Tensor:
        """`K @ v` (`Kᵀ @ v` with `transpose`) without materialising K, as
        [`program_product`][kermac.api.program_product] computes it."""
        from kermac.api import program_product

        return program_product(
            self.program, x, z, v, transpose=transpose, out=out, offset_m=offset_m, offset_n=offset_n,
            backend=backend, debug=debug, **self._hypers(hypers),
        )  # fmt: skip

    def operator(
        self,
        x: torch.Tensor,
        z: torch.Tensor,
        *,
        offset_m: int = 0,
        offset_n: int = 0,
        backend: str = "auto",
        debug: bool = False,
        **hypers: HyperInput,
    ) -> Any:
        """The kernel matrix as a [`KernelOperator`][kermac.operator.KernelOperator] (products, solvers)."""
        from kermac.operator import KernelOperator

        return KernelOperator(
            self.program, x, z, offset_m=offset_m, offset_n=offset_n, backend=backend, debug=debug,
            **self._hypers(hypers),
        )  # fmt: skip


class GradKernel(_Traced):
    """A gradient kernel built by [`gradient_program`][kermac.dsl.gradient_program]:
    `kernel(a, b, c, d, **hypers)`.

    Attributes:
        program: the traced [`GradProgram`][kermac.programs.GradProgram] (its `multiply` is the factor `g`
            of `a · g(b, d)`).
        parameters: every hyperparameter name, in the order the functions declare them.
    """

    __slots__ = ()

    def __call__(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        c: torch.Tensor,
        d: torch.Tensor,
        *,
        out: torch.Tensor | None = None,
        backend: str = "auto",
        debug: bool = False,
        **hypers: HyperInput,
    ) -> torch.Tensor:
        """`out [..., O, N, M]` for `a [..., K, M]`, `b [..., N, K]`, `c [..., O, K]`, `d [..., N, M]`, as
        [`run_grad_program`][kermac.api.run_grad_program] computes it."""
        from kermac.api import run_grad_program

        return run_grad_program(
            self.program, a, b, c, d, hypers=self._hypers(hypers), out=out, backend=backend, debug=debug
        )
