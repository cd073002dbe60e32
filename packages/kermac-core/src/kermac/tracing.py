"""Tracing Python functions into the IR: the proxy [`Traced`][kermac.tracing.Traced] and
[`trace`][kermac.tracing.trace], which [`kermac.dsl`][kermac.dsl] builds programs with.

A function is called once with a proxy for each parameter, read by name: an operand of its role
([`ROLES`][kermac.tracing.ROLES]) becomes a [`Var`][kermac.ir.Var], any other name a
[`Hyper`][kermac.ir.Hyper].  Proxies build [`kermac.ir`][kermac.ir] expressions under Python's operators; what
the IR cannot express raises `TypeError` (`AttributeError` for an attribute), and `trace` re-raises every
failure of the function as a `TypeError` naming the function's role, file and line, and the failing line's
source.  [`kermac.dsl`][kermac.dsl] documents the names and what a function may use.
"""

from __future__ import annotations

import inspect
import linecache
import numbers
import operator
from collections.abc import Callable
from types import CodeType, TracebackType
from typing import Any

import torch

from kermac import programs
from kermac.ir import Call, Const, Expr, Hyper, Var, hyper_names, to_sexpr

__all__ = ["OPERANDS", "RESERVED", "ROLES", "Traced", "as_traced", "describe", "trace", "traced_call"]

ROLES: dict[str, tuple[str, ...]] = {
    "inner": ("x", "z"),
    "epilogue": ("acc", "diag"),
    "multiply": ("a", "b", "d"),
    "accumulate": ("c", "term"),
    "gradient epilogue": ("acc",),
}
"""The operands each function reads, by name (the table of [`kermac.dsl`][kermac.dsl])."""

OPERANDS: frozenset[str] = programs.OPERANDS
"""The operand names of every program kind; none can be a hyperparameter
([`kermac.programs.OPERANDS`][kermac.programs.OPERANDS])."""

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
    "c": "the accumulate of a gradient program",
    "term": "the accumulate of a gradient program (the multiply's value)",
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


def traced_call(op: str, *args: object) -> Traced:
    """The proxy of the IR operation `op` on `args` (proxies or numbers)."""
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
        return traced_call("add", self, other)

    def __radd__(self, other: object) -> Traced:
        return traced_call("add", other, self)

    def __sub__(self, other: object) -> Traced:
        return traced_call("sub", self, other)

    def __rsub__(self, other: object) -> Traced:
        return traced_call("sub", other, self)

    def __mul__(self, other: object) -> Traced:
        return traced_call("mul", self, other)

    def __rmul__(self, other: object) -> Traced:
        return traced_call("mul", other, self)

    def __truediv__(self, other: object) -> Traced:
        return traced_call("div", self, other)

    def __rtruediv__(self, other: object) -> Traced:
        return traced_call("div", other, self)

    def __pow__(self, other: object) -> Traced:
        return traced_call("pow", self, other)

    def __rpow__(self, other: object) -> Traced:
        return traced_call("pow", other, self)

    def __neg__(self) -> Traced:
        return traced_call("neg", self)

    def __pos__(self) -> Traced:
        return self

    def __abs__(self) -> Traced:
        return traced_call("abs", self)

    # comparisons: 1.0 or 0.0
    def __lt__(self, other: object) -> Traced:
        return traced_call("lt", self, other)

    def __le__(self, other: object) -> Traced:
        return traced_call("le", self, other)

    def __gt__(self, other: object) -> Traced:
        return traced_call("gt", self, other)

    def __ge__(self, other: object) -> Traced:
        return traced_call("ge", self, other)

    def __eq__(self, other: object) -> Traced:  # type: ignore[override]
        return traced_call("eq", self, other)

    def __ne__(self, other: object) -> Traced:  # type: ignore[override]
        return traced_call("ne", self, other)

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


def as_traced(a: Traced | float) -> Traced:
    """`a` as a proxy (a number becomes a constant)."""
    return a if isinstance(a, Traced) else Traced(_expr(a))


# -- tracing -------------------------------------------------------------------------------------


def _code(fn: object) -> CodeType | None:
    return getattr(inspect.unwrap(fn), "__code__", None) if callable(fn) else None


def describe(role: str, fn: object) -> str:
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


def trace(role: str, fn: object, order: list[str]) -> Expr:
    """The expression `fn` computes from proxies of its parameters; adds its hyperparameters to `order`."""
    if not callable(fn):
        raise TypeError(f"{role}: expected a function (e.g. a lambda), got {type(fn).__name__}")
    where = describe(role, fn)
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{where}: its parameters cannot be read ({exc}); pass a lambda or a def") from None
    operands = ROLES[role]
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
