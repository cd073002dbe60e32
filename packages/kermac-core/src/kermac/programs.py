"""Semiring programs: the complete per-element description of a fused kernel, in IR.

A *pairwise program* computes, for every batch entry `ℓ` and every pair `(m, n)`:

```text
acc          = REDUCE_{k < D} inner(x = x[ℓ, m, k], z = z[ℓ, n, k])
out[ℓ, m, n] = epilogue(acc = acc, diag = [m + offset_m == n + offset_n])
```

with `REDUCE` one of the reductions of [`kermac.reductions`][kermac.reductions]: sum, max, min or logsumexp
(identities 0, −∞, +∞, −∞).  `diag` is 1.0 on the shifted diagonal and 0.0 elsewhere (it implements `K + λI`).

A *gradient program* computes, for every batch entry `ℓ` and every `(o, n, m)`, in one of two forms.  The
*product form* (`accumulate` left `None`):

```text
acc             = Σ_{k < K} c[ℓ, o, k] · a[ℓ, k, m] · multiply(d = d[ℓ, n, m], b = b[ℓ, n, k])
out[ℓ, o, n, m] = epilogue(acc = acc)
```

whose structure `c · a · multiply(d, b)` lets a backend turn the contraction over `k` into matrix products
(the gradients of `cdist` and of every program's autograd are of this form); and the *general form*
(`accumulate` given):

```text
term            = multiply(a = a[ℓ, k, m], b = b[ℓ, n, k], d = d[ℓ, n, m])
acc             = REDUCE_{k < K} accumulate(c = c[ℓ, o, k], term = term)
out[ℓ, o, n, m] = epilogue(acc = acc)
```

where `multiply` reads every operand but `c`, `accumulate` combines the term with `c`, and `REDUCE` is any
reduction of [`kermac.reductions`][kermac.reductions].  A general program equal to a product form (a sum,
`accumulate` = `c·term`, `multiply` = `a` times a factor without `a`) runs the product form's kernels:
[`product_factor`][kermac.programs.product_factor] finds that factor.

[`kermac.dsl`][kermac.dsl] builds both kinds from Python functions (`kermac.program`,
`kermac.gradient_program`), reading the operands by these names.

Both are frozen and hashable; `key` is their canonical text, used in JIT cache keys.  What a
program derives from its expressions (hash, hyperparameter names) is computed on first use and kept
on the instance, so the per-call path of an operation does not walk the expression trees again.

The facts backends choose their fast paths by ([`is_squared_difference_sum`][kermac.programs.is_squared_difference_sum],
[`is_abs_difference_sum`][kermac.programs.is_abs_difference_sum], [`is_product_sum`][kermac.programs.is_product_sum],
[`difference_power`][kermac.programs.difference_power], [`signed_power`][kermac.programs.signed_power]) are decided on
the normal form of [`kermac.canonical`][kermac.canonical], so the rewritings it lists take the same path as the form
they rewrite ([`zero_padding_is_neutral`][kermac.programs.zero_padding_is_neutral] evaluates the term, which no
rewriting changes); the program itself, and what a backend renders from it, stay as written.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from functools import cache
from types import MappingProxyType

import torch

from kermac import reductions
from kermac.canonical import canonical, equivalent
from kermac.ir import Call, Const, Expr, Var, eq, free_vars, from_sexpr, hyper_names, select, substitute, to_sexpr
from kermac.ir_diff import derivative
from kermac.ir_eval import evaluate

__all__ = [
    "L0_TERM",
    "LINF_TERM",
    "OPERANDS",
    "PRODUCT_ACCUMULATE",
    "REDUCTIONS",
    "GradProgram",
    "PairwiseProgram",
    "affine_factor",
    "canonical_inner",
    "difference_power",
    "epilogue_slope",
    "factor_without_a",
    "inner_difference_power",
    "inner_slope",
    "is_abs_difference_sum",
    "is_product_sum",
    "is_squared_difference_sum",
    "nonnegative",
    "nonnegative_variables",
    "product_factor",
    "program_from_key",
    "signed_power",
    "swap_operands",
    "zero_padding_is_neutral",
]

REDUCTIONS: Mapping[str, float] = MappingProxyType({name: r.identity for name, r in reductions.ALL.items()})
"""Reduction name → identity element (the reductions and their other facts:
[`kermac.reductions`][kermac.reductions])."""


_UNSET = object()


def _derived(program: object, name: str, compute: Callable[[], object]) -> object:
    """`program`'s derived value `name`, computed once.  Kept in the instance `__dict__` (the
    dataclass is frozen) and left out of its pickled state, where a hash would not survive."""
    value = program.__dict__.get(name, _UNSET)
    if value is _UNSET:
        value = compute()
        program.__dict__[name] = value
    return value


def _fields_state(program: object) -> dict[str, object]:
    return {f.name: program.__dict__[f.name] for f in fields(program)}


def _set_key(program: PairwiseProgram | GradProgram) -> None:
    """Keep the program's key on the instance, computed at construction (and unpickling): `key()`
    then reads a plain attribute, which `torch.compile` reads as a constant of a program object."""
    program.__dict__["_key"] = program._key_text()


OPERANDS: frozenset[str] = frozenset({"x", "z", "acc", "diag", "a", "b", "c", "d", "term"})
"""The variables of every program kind: no hyperparameter may take one of these names (a gradient of a pairwise
program reads `d`, `b` where the program read `x`, `z`, so the names are reserved across kinds)."""


def _check_vars(what: str, expr: Expr, allowed: frozenset[str]) -> None:
    if not isinstance(expr, Expr):
        raise TypeError(f"{what}: expected a kermac.ir.Expr, got {type(expr).__name__}")
    extra = free_vars(expr) - allowed
    if extra:
        raise ValueError(f"{what}: may use variables {sorted(allowed)}, got unknown {sorted(extra)}")
    clash = hyper_names(expr) & OPERANDS
    if clash:
        raise ValueError(
            f"{what}: a hyperparameter cannot be named as a program variable ({', '.join(sorted(OPERANDS))}), "
            f"got {sorted(clash)}"
        )


@dataclass(frozen=True)
class PairwiseProgram:
    """`out[ℓ,m,n] = epilogue(REDUCE_k inner(x[ℓ,m,k], z[ℓ,n,k]), diag)` (ℓ the batch entry); see the module docs."""

    inner: Expr
    reduction: str
    epilogue: Expr

    INNER_VARS = frozenset({"x", "z"})
    EPILOGUE_VARS = frozenset({"acc", "diag"})

    def __post_init__(self) -> None:
        _check_vars("inner", self.inner, self.INNER_VARS)
        _check_vars("epilogue", self.epilogue, self.EPILOGUE_VARS)
        if self.reduction not in REDUCTIONS:
            raise ValueError(f"reduction: expected one of {sorted(REDUCTIONS)}, got {self.reduction!r}")
        _set_key(self)

    @property
    def identity(self) -> float:
        """The reduction's identity (the value of an empty reduction)."""
        return REDUCTIONS[self.reduction]

    def __hash__(self) -> int:
        return _derived(self, "_hash", lambda: hash((self.inner, self.reduction, self.epilogue)))

    def __getstate__(self) -> dict[str, object]:
        return _fields_state(self)

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        _set_key(self)

    @property
    def hypers(self) -> tuple[str, ...]:
        """Sorted names of the hyperparameters the program reads."""
        return _derived(self, "_hypers", lambda: tuple(sorted(hyper_names(self.inner) | hyper_names(self.epilogue))))

    @property
    def uses_diag(self) -> bool:
        """Whether the epilogue reads `diag` (the backend must then compute it)."""
        return _derived(self, "_uses_diag", lambda: "diag" in free_vars(self.epilogue))

    def key(self) -> str:
        """Canonical text of the program."""
        return self._key

    def _key_text(self) -> str:
        return f"pairwise;{self.reduction};{to_sexpr(self.inner)};{to_sexpr(self.epilogue)}"


@dataclass(frozen=True)
class GradProgram:
    """A gradient contraction over `k` (ℓ the batch entry); see the module docs.

    Product form (`accumulate` None, `reduction` "sum"):
    `out[ℓ,o,n,m] = epilogue(Σ_k c[ℓ,o,k]·a[ℓ,k,m]·multiply(d[ℓ,n,m], b[ℓ,n,k]))`, `multiply` over `d`, `b`.

    General form (`accumulate` given): `out[ℓ,o,n,m] = epilogue(REDUCE_k accumulate(c[ℓ,o,k],
    multiply(a[ℓ,k,m], b[ℓ,n,k], d[ℓ,n,m])))`, `multiply` over `a`, `b`, `d`, `accumulate` over `c` and `term`
    (the multiply's value), `REDUCE` the reduction named `reduction`.
    """

    multiply: Expr
    epilogue: Expr
    accumulate: Expr | None = None
    reduction: str = "sum"

    MULTIPLY_VARS = frozenset({"d", "b"})
    GENERAL_MULTIPLY_VARS = frozenset({"a", "b", "d"})
    ACCUMULATE_VARS = frozenset({"c", "term"})
    EPILOGUE_VARS = frozenset({"acc"})

    def __post_init__(self) -> None:
        if self.accumulate is None:
            _check_vars("multiply", self.multiply, self.MULTIPLY_VARS)
            if self.reduction != "sum":
                raise ValueError(
                    f"reduction: the product form (accumulate None) sums c·a·multiply; got {self.reduction!r} "
                    "(give an accumulate, e.g. c·term, for another reduction)"
                )
        else:
            _check_vars("multiply", self.multiply, self.GENERAL_MULTIPLY_VARS)
            _check_vars("accumulate", self.accumulate, self.ACCUMULATE_VARS)
            if self.reduction not in REDUCTIONS:
                raise ValueError(f"reduction: expected one of {sorted(REDUCTIONS)}, got {self.reduction!r}")
        _check_vars("epilogue", self.epilogue, self.EPILOGUE_VARS)
        _set_key(self)

    @property
    def general(self) -> bool:
        """Whether the program is in the general form (it has an `accumulate`)."""
        return self.accumulate is not None

    @property
    def identity(self) -> float:
        """The reduction's identity (the value of an empty contraction, `K = 0`)."""
        return REDUCTIONS[self.reduction]

    def __hash__(self) -> int:
        return _derived(self, "_hash", lambda: hash((self.multiply, self.epilogue, self.accumulate, self.reduction)))

    def __getstate__(self) -> dict[str, object]:
        return _fields_state(self)

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        _set_key(self)

    @property
    def hypers(self) -> tuple[str, ...]:
        """Sorted names of the hyperparameters the program reads."""

        def names() -> tuple[str, ...]:
            exprs = (e for e in (self.multiply, self.accumulate, self.epilogue) if e is not None)
            return tuple(sorted(set().union(*(hyper_names(e) for e in exprs))))

        return _derived(self, "_hypers", names)

    def key(self) -> str:
        """Canonical text of the program."""
        return self._key

    def _key_text(self) -> str:
        if self.accumulate is None:
            return f"grad;{to_sexpr(self.multiply)};{to_sexpr(self.epilogue)}"
        return f"grad;{self.reduction};{to_sexpr(self.multiply)};{to_sexpr(self.accumulate)};{to_sexpr(self.epilogue)}"


PRODUCT_ACCUMULATE = Call("mul", (Var("c"), Var("term")))
"""`c·term`: the accumulation of the product form (a general program's default accumulation)."""
_PRODUCT_ACCUMULATE = canonical(PRODUCT_ACCUMULATE)


def _factors(expr: Expr) -> list[Expr]:
    """The factors of a product tree (`expr` itself if it is no product)."""
    if isinstance(expr, Call) and expr.op == "mul":
        return _factors(expr.args[0]) + _factors(expr.args[1])
    return [expr]


def factor_without_a(term: Expr) -> Expr | None:
    """`g` if `term` is a product with `Var("a")` as exactly one factor and `g` (the other factors, in their
    order; `1` if there are none) does not read `a`; else `None`."""
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


def product_factor(program: GradProgram) -> Expr | None:
    """The factor `g(d, b)` of the product form `Σ_k c·a·g(d, b)` that `program` computes, or `None`.

    It is `program.multiply` for a program in the product form, and for a general one the multiply without its
    factor `a` ([`factor_without_a`][kermac.programs.factor_without_a]) where the reduction is the sum and the
    accumulation is `c·term` (decided on the normal form: `term·c` qualifies).  Backends run a program with a
    factor on their product-form kernels (the tensor-core and sign-product routes among them) and render the
    factor as their multiply; a program without one runs the general kernels.  The product form computes the
    same values up to the order of the multiplications `c·(a·g)`.
    """

    def find() -> Expr | None:
        if program.accumulate is None:
            return program.multiply
        if not reductions.ALL[program.reduction].sum_fast_paths or canonical(program.accumulate) != _PRODUCT_ACCUMULATE:
            return None
        return factor_without_a(program.multiply)

    return _derived(program, "_product_factor", find)


def affine_factor(program: GradProgram) -> tuple[float, float] | None:
    """`(α, β)` where `program`'s product factor ([`product_factor`][kermac.programs.product_factor]) is
    `g(d, b) = α·d + β·b` with numbers α, β, else `None`; a coefficient is 0 exactly where its variable is absent.

    Then `Σ_k c[o,k]·a[k,m]·g(d[n,m], b[n,k]) = α·d[n,m]·s[o,m] + β·Σ_k b[n,k]·c[o,k]·a[k,m]` with
    `s[o,m] = Σ_k c[o,k]·a[k,m]`: matrix products and a rank-one term, no work per `(n, m, k)` (the p = 2
    gradient of `cdist`, `d − b`, is `(1, −1)`).  Recognised as written: `d`, `b`, their negation, sum and
    difference, and a product with or quotient by a finite non-zero constant.  A sum or difference whose two sides
    read the same variable (`d − d`, `(d − b) + b`) is refused, as is a constant term, a hyperparameter or a zero
    factor: the product form then evaluates something the two matrix products would not (`d − d` is NaN for an
    infinite `d`, where `0·d·s` is not its value either).
    """

    def find() -> tuple[float, float] | None:
        factor = product_factor(program)
        coefficients = None if factor is None else _affine(factor)
        if coefficients is None:
            return None
        # a coefficient that overflowed, or underflowed to 0 for a variable that is read, is not the factor's
        reads = (name in free_vars(factor) for name in ("d", "b"))
        if all(math.isfinite(v) and (v != 0.0) == read for v, read in zip(coefficients, reads, strict=True)):
            return coefficients
        return None

    return _derived(program, "_affine_factor", find)


def _affine(expr: Expr) -> tuple[float, float] | None:
    """`(α, β)` of an expression `α·d + β·b` of the forms [`affine_factor`][kermac.programs.affine_factor] accepts."""
    if isinstance(expr, Var):
        return {"d": (1.0, 0.0), "b": (0.0, 1.0)}.get(expr.name)
    if not isinstance(expr, Call):
        return None
    if expr.op == "neg":
        inner = _affine(expr.args[0])
        return None if inner is None else (-inner[0], -inner[1])
    if expr.op in ("add", "sub"):
        left, right = expr.args
        if free_vars(left) & free_vars(right):
            return None
        lhs, rhs = _affine(left), _affine(right)
        if lhs is None or rhs is None:
            return None
        sign = 1.0 if expr.op == "add" else -1.0
        return lhs[0] + sign * rhs[0], lhs[1] + sign * rhs[1]
    if expr.op in ("mul", "div"):
        left, right = expr.args
        scale = _scale(right)
        if scale is not None:
            term = _affine(left)
        elif expr.op == "mul":
            scale, term = _scale(left), _affine(right)
        else:
            return None
        if scale is None or term is None:
            return None
        factor = scale if expr.op == "mul" else 1.0 / scale
        return term[0] * factor, term[1] * factor
    return None


def _scale(expr: Expr) -> float | None:
    """The value of a finite non-zero constant, else `None`."""
    if isinstance(expr, Const) and math.isfinite(expr.value) and expr.value != 0.0:
        return expr.value
    return None


def swap_operands(program: PairwiseProgram) -> PairwiseProgram:
    """The program with `x` and `z` exchanged in its inner term: its kernel on `(z, x)` is the transpose of
    `program`'s on `(x, z)`, `swap(K)(z, x)[n, m] = K(x, z)[m, n]`, with the diagonal offsets exchanged too
    (`offset_m ↔ offset_n`).  The transposed product `Kᵀ @ u` is the product of this program.

    The epilogue reads only `acc` and `diag`, which the exchange leaves as they are."""
    if not isinstance(program, PairwiseProgram):
        raise TypeError(f"program: expected a kermac.programs.PairwiseProgram, got {type(program).__name__}")
    return _derived(
        program,
        "_swapped",
        lambda: PairwiseProgram(
            substitute(program.inner, {"x": Var("z"), "z": Var("x")}), program.reduction, program.epilogue
        ),
    )


_BY_KEY: dict[str, PairwiseProgram | GradProgram] = {}
"""Programs rebuilt from their keys (a few per process: the programs a process runs)."""


def program_from_key(key: str) -> PairwiseProgram | GradProgram:
    """The program whose [`key`][kermac.programs.PairwiseProgram.key] is `key`, rebuilt once per process.

    kermac's `torch.library` operations ([`kermac.ops`][kermac.ops]) take a program as its key, the only form
    a string argument can carry; this is how they get the program back.
    """
    program = _BY_KEY.get(key)
    if program is None:
        kind, *parts = key.split(";")
        if kind == "pairwise" and len(parts) == 3:
            program = PairwiseProgram(from_sexpr(parts[1]), parts[0], from_sexpr(parts[2]))
        elif kind == "grad" and len(parts) == 2:
            program = GradProgram(from_sexpr(parts[0]), from_sexpr(parts[1]))
        elif kind == "grad" and len(parts) == 4:
            reduction, multiply, accumulate, epilogue = parts
            program = GradProgram(from_sexpr(multiply), from_sexpr(epilogue), from_sexpr(accumulate), reduction)
        else:
            raise ValueError(f"program: expected the key of a PairwiseProgram or GradProgram, got {key!r}")
        _BY_KEY[key] = program
    return program


_T = Call("sub", (Var("x"), Var("z")))
"""t = x − z, |t|, [t = t] (0 only for NaN) and [t ≠ 0]: the pieces of the forms recognised below."""
_ABS_T = Call("abs", (_T,))
_T_IS_NUMBER = Call("eq", (_T, _T))
_T_NONZERO = Call("ne", (_T, Const(0.0)))
_SQUARED = Call("mul", (_T, _T))
_PRODUCT = Call("mul", (Var("x"), Var("z")))
L0_TERM = Call("select", (_T_IS_NUMBER, _T_NONZERO, _T))
"""[t ≠ 0], NaN where t is NaN: the term of `cdist` with p = 0 (torch.cdist's count of differing
coordinates is NaN for a NaN coordinate, and for ∞ − ∞).
"""
LINF_TERM = Call("select", (_T_IS_NUMBER, _ABS_T, Const(0.0)))
"""|t|, 0 where t is NaN: the term of `cdist` with p = ∞ (torch.cdist's maximum skips NaN; a
maximum of non-negative terms is unchanged by a 0).
"""

# The recognised forms in normal form (kermac.canonical), against which normal forms are compared.
_CANONICAL_ABS_T = canonical(_ABS_T)
_CANONICAL_SQUARED = canonical(_SQUARED)
_CANONICAL_PRODUCT = canonical(_PRODUCT)
_CANONICAL_T_NONZERO = canonical(_T_NONZERO)
_CANONICAL_COUNTS = (_CANONICAL_T_NONZERO, canonical(L0_TERM))
_CANONICAL_FIRST_POWERS = (_CANONICAL_ABS_T, canonical(LINF_TERM))


def canonical_inner(program: PairwiseProgram) -> Expr:
    """The normal form ([`kermac.canonical.canonical`][kermac.canonical.canonical]) of `program`'s inner term,
    computed once."""
    return _derived(program, "_canonical_inner", lambda: canonical(program.inner))


def _is_sum_of(program: PairwiseProgram, name: str, term: Expr) -> bool:
    """Whether `program` sums the canonical `term` (its reduction takes the sum's fast paths); kept on the
    program as `name`."""
    return _derived(
        program, name, lambda: reductions.ALL[program.reduction].sum_fast_paths and canonical_inner(program) == term
    )


def is_squared_difference_sum(program: PairwiseProgram) -> bool:
    """Whether `program` is `Σ_k (x − z)²`, with any epilogue.

    Decided on the normal form ([`kermac.canonical`][kermac.canonical]): `(x − z)·(x − z)`, `(z − x)·(z − x)`,
    `pow(x − z, 2)`, `|x − z|·|x − z|` and the other exact rewritings qualify; `(x − z)·(z − x)`
    (that is −(x − z)²) does not.  Such programs (l2, squared l2, Gaussian, Laplace-L2, Matérn,
    Cauchy, user programs of that shape) reduce d² = Σ_k (x_k − z_k)², which a backend may expand
    into ‖x‖² + ‖z‖² − 2·x·z and compute on tensor cores.
    """
    return _is_sum_of(program, "_sq_diff_sum", _CANONICAL_SQUARED)


def is_abs_difference_sum(program: PairwiseProgram) -> bool:
    """Whether `program` is `Σ_k |x − z|` (also written `|z − x|`, `|−(x − z)|`), with any
    epilogue (cdist p = 1, Laplace-L1); decided on the normal form."""
    return _is_sum_of(program, "_abs_diff_sum", _CANONICAL_ABS_T)


def is_product_sum(program: PairwiseProgram) -> bool:
    """Whether `program` is `Σ_k x·z` (also written `z·x`), with any epilogue (the dot-product
    kernels); decided on the normal form."""
    return _is_sum_of(program, "_product_sum", _CANONICAL_PRODUCT)


def difference_power(inner: Expr) -> Expr | None:
    """The exponent P if `inner` is a form of |x − z|^P kermac lowers programs to, else `None`.

    With t = x − z, decided on the normal form (so t may also be written z − x where the sign
    cannot matter): `|t|` and [`LINF_TERM`][kermac.programs.LINF_TERM] (P = 1), `t·t` (P = 2), `pow(|t|, P)` and the
    guarded `select(overflow, NaN, max(pow(|t|, P), c·[t ≠ 0]))` (any P; see
    [`kermac.lowering.guarded_lp_program`][kermac.lowering.guarded_lp_program]), and the counts `[t ≠ 0]` and
    [`L0_TERM`][kermac.programs.L0_TERM] (P = 0).  All have the derivative P·sgn(t)|t|^(P−1) (0 for a count) wherever
    they are differentiable, which is what automatic differentiation needs.
    """
    return _canonical_difference_power(canonical(inner))


def inner_difference_power(program: PairwiseProgram) -> Expr | None:
    """[`difference_power`][kermac.programs.difference_power] of `program`'s inner term, computed once per program."""
    return _derived(program, "_difference_power", lambda: _canonical_difference_power(canonical_inner(program)))


def _canonical_difference_power(inner: Expr) -> Expr | None:
    """[`difference_power`][kermac.programs.difference_power] of an inner term in normal form."""
    if inner in _CANONICAL_COUNTS:
        return Const(0.0)
    if isinstance(inner, Call) and inner.op == "select" and inner.args[1] == Const(math.nan):
        inner = inner.args[2]  # the guard's overflow test: NaN instead of a term
    if isinstance(inner, Call) and inner.op == "max":
        power, floor = inner.args
        if not (isinstance(floor, Call) and floor.op == "mul" and _CANONICAL_T_NONZERO in floor.args):
            return None
        scale = floor.args[0] if floor.args[1] == _CANONICAL_T_NONZERO else floor.args[1]
        if not (isinstance(scale, Const) and scale.value >= 0):
            return None
        inner = power
    if inner in _CANONICAL_FIRST_POWERS:
        return Const(1.0)
    if inner == _CANONICAL_SQUARED:
        return Const(2.0)
    if isinstance(inner, Call) and inner.op == "pow" and inner.args[0] == _CANONICAL_ABS_T:
        return inner.args[1]
    return None


def zero_padding_is_neutral(program: PairwiseProgram) -> bool:
    """Whether the term of two zero features, `inner(0, 0)`, is the reduction's identity.

    Then a backend may pad the feature dimension with zeros in both operands and reduce the padding
    with the other terms: |0 − 0| = (0 − 0)² = [0 ≠ 0] = 0·0 = 0 for a sum.  Inner terms that read a
    hyperparameter (|x − z|^p is 1 at p = 0) or give NaN there (0/0) do not qualify.
    """

    def neutral() -> bool:
        if hyper_names(program.inner):
            return False
        zero = torch.zeros((), dtype=torch.float64)
        return float(evaluate(program.inner, {"x": zero, "z": zero}, like=zero)) == program.identity

    return _derived(program, "_zero_padding_is_neutral", neutral)


def nonnegative(expr: Expr, known: frozenset[str] = frozenset()) -> bool:
    """Whether `expr` is provably ≥ +0 or NaN (never negative, never −0).

    `known` names variables with that property (e.g. `acc` of a sum of non-negative terms,
    [`nonnegative_variables`][kermac.programs.nonnegative_variables]).  The analysis is conservative: `False` means
    "not proven".  Backends compute a power of a base proven non-negative without the negative-base cases.
    """
    if isinstance(expr, Const):
        return expr.value >= 0 and math.copysign(1.0, expr.value) > 0
    if isinstance(expr, Var):
        return expr.name in known
    if not isinstance(expr, Call):  # a hyperparameter
        return False
    op, args = expr.op, expr.args
    if op in ("abs", "exp", "lt", "le", "gt", "ge", "eq", "ne"):
        return True
    if op == "mul" and args[0] == args[1]:
        return True
    if op in ("add", "mul", "div", "min", "sqrt"):
        return all(nonnegative(a, known) for a in args)
    if op == "max":
        return any(nonnegative(a, known) for a in args)
    if op == "pow":
        return nonnegative(args[0], known)
    if op == "select":
        return nonnegative(args[1], known) and nonnegative(args[2], known)
    return False


def nonnegative_variables(program: PairwiseProgram) -> frozenset[str]:
    """The variables of `program`'s epilogue known to be ≥ +0 or NaN: `{"acc"}` where the inner terms are
    ([`nonnegative`][kermac.programs.nonnegative]) and the reduction keeps them so (`nonnegative` of
    [`kermac.reductions`][kermac.reductions]: a sum or a minimum, whose identity, 0 or +inf, is ≥ 0 too), else none."""
    kept = reductions.ALL[program.reduction].nonnegative and nonnegative(program.inner)
    return frozenset({"acc"}) if kept else frozenset()


def signed_power(expr: Expr) -> tuple[Expr, Expr] | None:
    """`(t, e)` if `expr` is `select(ne(t, 0), sign(t)·pow(abs(t), e), 0)`, else `None`.

    That is sgn(t)·|t|^e with the term 0 where t = 0 (also for e ≤ 0): the multiply of the
    fractional-p gradient ([`kermac.lowering.grad_program`][kermac.lowering.grad_program]), which a backend may compute
    as a copysign of one power instead of a product with a sign.  The test and the power's base are
    compared with `t` on the normal form ([`kermac.canonical`][kermac.canonical]: `ne(0, t)`, `pow(abs(−t), e)`
    and the factors in either order qualify); `t` and `e` are returned as written in `expr`,
    `t` with the orientation of its `sign`.
    """
    if not (isinstance(expr, Call) and expr.op == "select" and expr.args[2] == Const(0.0)):
        return None
    cond, body = expr.args[0], expr.args[1]
    if not (isinstance(body, Call) and body.op == "mul"):
        return None
    for sgn, power in (body.args, body.args[::-1]):
        if not (isinstance(sgn, Call) and sgn.op == "sign" and isinstance(power, Call) and power.op == "pow"):
            continue
        (t,), (base, e) = sgn.args, power.args
        if equivalent(cond, Call("ne", (t, Const(0.0)))) and equivalent(base, Call("abs", (t,))):
            return t, e
    return None


@cache
def epilogue_slope(program: PairwiseProgram) -> Expr:
    """`e'(acc)`: the symbolic derivative ([`kermac.ir_diff`][kermac.ir_diff]) of `program`'s epilogue with respect
    to `acc` (it may read `diag` and the hyperparameters)."""
    return derivative(program.epilogue, "acc")


@cache
def inner_slope(program: PairwiseProgram) -> Expr:
    """`∂inner/∂x`: the symbolic derivative of `program`'s inner term with respect to `x` (it may read `z` and the
    hyperparameters).  With [`swap_operands`][kermac.programs.swap_operands] it gives `∂inner/∂z` too.

    For `|x − z|^P` with P below 1, or not known before run time ([`difference_power`][kermac.programs.difference_power]
    a hyperparameter), the derivative `P·sgn(t)·|t|^(P−1)` is `0·∞` at a tie `x = z`; it is taken as 0 there, as
    [`cdist_grad`][kermac.api.cdist_grad] and torch.cdist's subgradient take it (the exact derivative does not
    exist at the cusp)."""
    slope = derivative(program.inner, "x")
    power = inner_difference_power(program)
    if (
        power is None
        or slope == Const(0.0)
        or (isinstance(power, Const) and (power.value >= 1.0 or power.value == 0.0))
    ):
        return slope
    return select(eq(_T, 0.0), 0.0, slope)


@cache
def slope_program(program: PairwiseProgram) -> PairwiseProgram:
    """The program of `e'(acc)`, the derivative of `program`'s epilogue with respect to `acc` (symbolic,
    [`kermac.ir_diff`][kermac.ir_diff]), taken as 0 where `acc = 0`.

    For a program summing `(x − z)²`, `K = e(r²)` and `∂K/∂x_j = 2 e'(r²) (x_j − z_j)`: the slope kernel
    times the differences.  Where `acc = 0` every difference is 0, so the term vanishes there while `e'`
    may be infinite (Laplace-L2's `e'(0)`).  The regularisation of the diagonal does not depend on the
    points and has no slope.

    The convention holds where `acc = 0` forces every inner derivative to 0, as for `Σ (x − z)²`; it does not in
    general (`Σ x·z` is 0 for orthogonal points, where `∂/∂x = z`), so the gradient product of other programs
    (`kermac.problem.ProductGradProblem`) takes [`epilogue_slope`][kermac.programs.epilogue_slope] as it is and
    drops a term where `∂τ/∂x = 0` instead.
    """
    slope = select(eq(Var("acc"), 0.0), 0.0, epilogue_slope(program))
    return PairwiseProgram(program.inner, program.reduction, slope)
