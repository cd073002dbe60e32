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
| `c` | `c[ℓ, o, k]` | `accumulate` |
| `term` | the multiply's value | `accumulate` |

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

from collections.abc import Callable, Mapping
from typing import Any

import torch

from kermac.canonical import canonical
from kermac.ir import Var, to_sexpr
from kermac.programs import PRODUCT_ACCUMULATE, REDUCTIONS, GradProgram, PairwiseProgram, product_factor
from kermac.tracing import OPERANDS, RESERVED, Traced, as_traced, trace, traced_call

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


# -- the functions of the DSL --------------------------------------------------------------------

Value = Traced | float


def abs(a: Value) -> Traced:
    """|a| (the builtin `abs()` works on traced values too)."""
    return traced_call("abs", a)


def sqrt(a: Value) -> Traced:
    """√a."""
    return traced_call("sqrt", a)


def exp(a: Value) -> Traced:
    """eᵃ."""
    return traced_call("exp", a)


def log(a: Value) -> Traced:
    """ln a."""
    return traced_call("log", a)


def pow(a: Value, b: Value) -> Traced:
    """aᵇ (IEEE `pow`), as `a ** b`."""
    return traced_call("pow", a, b)


def sign(a: Value) -> Traced:
    """sgn(a) ∈ {−1, +0, 1} (+0 also for −0, as torch.sign), NaN for NaN."""
    return traced_call("sign", a)


def minimum(a: Value, b: Value) -> Traced:
    """min(a, b), NaN propagating."""
    return traced_call("min", a, b)


def maximum(a: Value, b: Value) -> Traced:
    """max(a, b), NaN propagating."""
    return traced_call("max", a, b)


def where(cond: Value, if_true: Value, if_false: Value) -> Traced:
    """`if_true` where `cond ≠ 0` (a comparison is 1.0 or 0.0), else `if_false`: the IR's `select`."""
    return traced_call("select", cond, if_true, if_false)


def lt(a: Value, b: Value) -> Traced:
    """1.0 if a < b else 0.0 (as `a < b`)."""
    return traced_call("lt", a, b)


def le(a: Value, b: Value) -> Traced:
    """1.0 if a ≤ b else 0.0 (as `a <= b`)."""
    return traced_call("le", a, b)


def gt(a: Value, b: Value) -> Traced:
    """1.0 if a > b else 0.0 (as `a > b`)."""
    return traced_call("gt", a, b)


def ge(a: Value, b: Value) -> Traced:
    """1.0 if a ≥ b else 0.0 (as `a >= b`)."""
    return traced_call("ge", a, b)


def eq(a: Value, b: Value) -> Traced:
    """1.0 if a = b else 0.0 (as `a == b`)."""
    return traced_call("eq", a, b)


def ne(a: Value, b: Value) -> Traced:
    """1.0 if a ≠ b else 0.0 (as `a != b`)."""
    return traced_call("ne", a, b)


def sigmoid(a: Value) -> Traced:
    """1 / (1 + e^(−a)): 0 at −∞, 1 at +∞."""
    return 1.0 / (1.0 + exp(-as_traced(a)))


def tanh(a: Value) -> Traced:
    """tanh a = 1 − 2 / (e^(2a) + 1): −1 at −∞, 1 at +∞.

    Written with one exponential, as the IR has no `tanh`: its error is about the compute type's unit
    roundoff in absolute terms (not relative to tanh a where |a| is tiny).
    """
    return 1.0 - 2.0 / (exp(2.0 * as_traced(a)) + 1.0)


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
    if not isinstance(reduce, str) or reduce not in REDUCTIONS:
        raise ValueError(f"reduce: expected one of {sorted(REDUCTIONS)}, got {reduce!r}")
    order: list[str] = []
    inner_expr = trace("inner", inner, order)
    epilogue_expr = Var("acc") if epilogue is None else trace("epilogue", epilogue, order)
    return Kernel(PairwiseProgram(inner_expr, reduce, epilogue_expr), tuple(order))


def gradient_program(
    multiply: Callable[..., object],
    epilogue: Callable[..., object] | None = None,
    *,
    accumulate: Callable[..., object] | None = None,
    reduce: str = "sum",
) -> GradKernel:
    r"""A gradient kernel traced from Python functions (see the module docs for names and tracing).

    $$
    \mathrm{out}[\ell, o, n, m] = \mathrm{epilogue}\Big(\mathrm{acc} = \operatorname*{REDUCE}_k
        \mathrm{accumulate}\big(c[\ell, o, k],\ \mathrm{term} = \mathrm{multiply}(a[\ell, k, m],
        b[\ell, n, k], d[\ell, n, m])\big)\Big)
    $$

    with the shapes of [`cdist_grad`][kermac.api.cdist_grad]; by default `REDUCE` is the sum and `accumulate`
    is `c · term`, the gradient contraction `Σ_k c·multiply(a, b, d)`.

    A sum of `c · term` whose multiply is `a` times a factor that does not read `a` (e.g.
    `alpha * (d - b) * a`) is the product form [`kermac.programs.GradProgram`][kermac.programs.GradProgram]
    `Σ_k c·a·g(b, d)` and runs the fused product-form kernels (tensor cores where they apply); any other
    multiply, accumulation or reduction runs the general fused kernels, which evaluate `multiply` once per
    `(n, m, k)` and `accumulate` once per `(o, n, m, k)`.

    Args:
        multiply: a function of `a`, `b`, `d` (any may be left out) and hyperparameters, e.g.
            `lambda a, b, d: a * dsl.sign(d - b)`.
        epilogue: a function of `acc` and hyperparameters; `None` returns `acc`.
        accumulate: a function of `c`, `term` (the multiply's value) and hyperparameters whose values are
            reduced over `k`, e.g. `lambda c, term: c * term` (the default) or `lambda c, term: term - c`.
        reduce: the reduction over `k`, a name of [`kermac.programs.REDUCTIONS`][kermac.programs.REDUCTIONS]
            (`"sum"`, `"max"`, `"min"`, `"logsumexp"`).

    Returns:
        A [`GradKernel`][kermac.dsl.GradKernel]: `kernel(a, b, c, d, **hyperparameters)`.

    Raises:
        TypeError: a function uses what the IR cannot express (naming its file and line).
        ValueError: a bad parameter name, or an unknown `reduce`.
    """
    if not isinstance(reduce, str) or reduce not in REDUCTIONS:
        raise ValueError(f"reduce: expected one of {sorted(REDUCTIONS)}, got {reduce!r}")
    order: list[str] = []
    term = trace("multiply", multiply, order)
    combine = PRODUCT_ACCUMULATE if accumulate is None else trace("accumulate", accumulate, order)
    epilogue_expr = Var("acc") if epilogue is None else trace("gradient epilogue", epilogue, order)
    general = GradProgram(term, epilogue_expr, combine, reduce)
    factor = product_factor(general)
    program = general if factor is None else GradProgram(factor, epilogue_expr)
    return GradKernel(program, tuple(order))


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
    if isinstance(program, GradProgram) and program.accumulate is None:
        return f"grad;{to_sexpr(canonical(program.multiply))};{to_sexpr(canonical(program.epilogue))}"
    if isinstance(program, GradProgram):
        parts = (program.multiply, program.accumulate, program.epilogue)
        return f"grad;{program.reduction};" + ";".join(to_sexpr(canonical(e)) for e in parts)
    raise TypeError(f"program: expected a PairwiseProgram or GradProgram, got {type(program).__name__}")


# -- the kernels ----------------------------------------------------------------------------------


class _TracedKernel:
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
        _TracedKernel.__init__(bound, self.program, self.parameters, {**self._bound, **hypers})
        return bound

    def _hypers(self, given: Mapping[str, HyperInput]) -> dict[str, HyperInput]:
        twice = sorted(set(given) & set(self._bound))
        if twice:
            raise ValueError(f"{', '.join(twice)}: fixed by bind(), given again in the call")
        return {**self._bound, **given}

    def __repr__(self) -> str:
        bound = f", bound={sorted(self._bound)}" if self._bound else ""
        return f"{type(self).__name__}({self.key()!r}, hypers={list(self.hypers)}{bound})"


class Kernel(_TracedKernel):
    """A pairwise kernel built by [`program`][kermac.dsl.program].

    `kernel(x, z, *, out=None, offset_m=0, offset_n=0, backend="auto", debug=False, **hypers)` is the kernel
    matrix `[..., M, N]` of `x [..., M, D]` and `z [..., N, D]`, computed as
    [`run_program`][kermac.api.run_program] computes it (those arguments mean what they mean there), with each
    hyperparameter by keyword.

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


class GradKernel(_TracedKernel):
    """A gradient kernel built by [`gradient_program`][kermac.dsl.gradient_program].

    `kernel(a, b, c, d, *, out=None, backend="auto", debug=False, **hypers)` is `out [..., O, N, M]` for
    `a [..., K, M]`, `b [..., N, K]`, `c [..., O, K]`, `d [..., N, M]`, computed as
    [`run_grad_program`][kermac.api.run_grad_program] computes it, with each hyperparameter by keyword.

    Attributes:
        program: the traced [`GradProgram`][kermac.programs.GradProgram]: in the product form (its `multiply`
            the factor `g` of `a · g(b, d)`) where the functions compute one, else in the general form.
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
