"""IR → CUDA C++ expressions: what the generated functors of a kernel variant return.

Expressions go through [`kermac.ir.render`][kermac.ir.render] with `CUDA_OPS` (the `km_*` overloads of
`cuda/prelude.cuh` cover float and double); peepholes first replace sub-trees by faster equivalents
with the same semantics: `pow(abs(e), b)` → `km_powabs` (`ex2(b·lg2|e|)`, no sign handling
needed; `km_powabs_ftz` for a known `b >= 1` when subnormals may be flushed), `pow(a, b)` of another
base proven non-negative ([`kermac.programs.nonnegative`][kermac.programs.nonnegative], e.g. the root of a sum of
`|x − z|^p`) → `km_pow_nonneg` (the same with the product's rounding error carried, in place of IEEE `powf`),
`select(ne(e, 0), sign(e)·pow(abs(e), b), 0)` ([`kermac.programs.signed_power`][kermac.programs.signed_power]) →
`km_signpow` (a copysign instead of a sign times a product), powers whose exponent is a known
multiple of 1/2 → products and a square root, and divisions by (exponentials of quotients of)
hyperparameter expressions → one reciprocal per thread.  Also here: the exponent facts planning
reads off a program (`split_exponent`, `half_steps`, `half_power_hypers`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping

import torch

from kermac import ir
from kermac.ir import Call, Const, Expr, Hyper, Var
from kermac.programs import canonical_inner, nonnegative, product_factor, signed_power

__all__ = [
    "CUDA_OPS",
    "cuda_constant",
    "half_power_hypers",
    "half_steps",
    "hyper_identifier",
    "is_sign_product",
    "render_expr",
    "rounded",
    "split_exponent",
]

CUDA_OPS: dict[str, str] = {
    "add": "({0} + {1})",
    "sub": "({0} - {1})",
    "mul": "({0} * {1})",
    "div": "({0} / {1})",
    "neg": "(-{0})",
    "abs": "km_abs({0})",
    "sqrt": "km_sqrt({0})",
    "exp": "km_exp({0})",
    "log": "km_log({0})",
    "pow": "km_pow({0}, {1})",
    "min": "km_min({0}, {1})",
    "max": "km_max({0}, {1})",
    "sign": "km_sign({0})",
    "lt": "km_lt({0}, {1})",
    "le": "km_le({0}, {1})",
    "gt": "km_gt({0}, {1})",
    "ge": "km_ge({0}, {1})",
    "eq": "km_eq({0}, {1})",
    "ne": "km_ne({0}, {1})",
    "select": "(({0}) != km_t(0) ? ({1}) : ({2}))",
}
"""IR operation → CUDA C++ format (overloads in `cuda/prelude.cuh` cover float and double)."""

_COMPUTE_DTYPES = {"float": torch.float32, "double": torch.float64}
"""Compute type name → the torch dtype that rounds constants to it."""


def rounded(v: float, compute: str) -> float:
    """`v` rounded to compute type `compute` ("float" or "double"): to nearest, float32
    subnormals kept, ±inf past the range (what the reference backend computes with)."""
    return torch.tensor(v, dtype=torch.float64).to(_COMPUTE_DTYPES[compute]).item()


def hyper_identifier(name: str) -> str:
    """The C identifier of hyperparameter `name` in a kernel's functors: `h_<name>`, never a variable's."""
    return f"h_{name}"


def cuda_constant(v: float, compute: str) -> str:
    """The constant `v` in compute type `compute` ("float" or "double"), exactly.

    The value is rounded to the compute type here (to nearest, float32 subnormals kept, ±inf past
    the range), so the literal the source holds is exactly representable: converting a double
    literal outside float's range is undefined in C++, and a rounding left to the compiler could
    differ from the reference backend's.
    """
    v = rounded(v, compute)
    if math.isnan(v):
        return "km_nan(km_t(0))"
    if math.isinf(v):
        return "km_inf(km_t(0))" if v > 0 else "(-km_inf(km_t(0)))"
    return f"km_t({v!r})"


def _exponent_ge1(b: Expr, ge1: frozenset[str]) -> bool:
    """Whether exponent `b` is known finite and >= 1: a constant, or a hyperparameter in `ge1`."""
    return (isinstance(b, Hyper) and b.name in ge1) or (isinstance(b, Const) and 1.0 <= b.value < math.inf)


def _exponent_sign(b: Expr, ge1: frozenset[str], gt1: frozenset[str]) -> int | None:
    """1 if exponent `b` is known finite and > 0, 0 if known finite and >= 0, else None: a constant,
    a hyperparameter known >= 1, or `h − c` with c <= 1 and `h` known > 1 (`gt1`) or >= 1
    (the gradient's p − 1)."""
    if isinstance(b, Const):
        return None if not 0.0 <= b.value < math.inf else int(b.value > 0.0)
    if isinstance(b, Call) and b.op == "sub" and isinstance(b.args[1], Const) and b.args[1].value <= 1.0:
        h = b.args[0]
        if isinstance(h, Hyper) and h.name in gt1:
            return 1
        return 0 if _exponent_ge1(h, ge1) else None
    return 1 if _exponent_ge1(b, ge1) else None


_ARITHMETIC = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b, "neg": lambda a: -a}


def _constant_value(e: Expr, known: Mapping[str, float]) -> float | None:
    """The value of `e` if it is built from constants and `known` hyperparameters with + − ×,
    else `None`."""
    if isinstance(e, Const):
        return e.value
    if isinstance(e, Hyper):
        return known.get(e.name)
    if isinstance(e, Call) and e.op in _ARITHMETIC:
        args = [_constant_value(a, known) for a in e.args]
        return None if None in args else _ARITHMETIC[e.op](*args)
    return None


def half_steps(b: Expr, known: Mapping[str, float]) -> int | None:
    """N if exponent `b` is known (constants and `known` hyperparameters) to be N/2 with
    1 <= N <= 8 — a power the kernels take as products and at most one square root
    (`km_powhalf`) — else `None`."""
    v = _constant_value(b, known)
    if v is None or not 0.5 <= v <= 4.0 or 2 * v != round(2 * v):  # range first: 2·v may overflow
        return None
    return round(2 * v)


def _exponents(expr: Expr) -> Iterator[Expr]:
    """The exponents of `expr`'s powers of an absolute value (signed powers included)."""
    for node in ir.walk(expr):
        if isinstance(node, Call) and node.op == "pow" and isinstance(node.args[0], Call) and node.args[0].op == "abs":
            yield node.args[1]


def half_power_hypers(exprs: Iterable[Expr], scalars: Mapping[str, float]) -> tuple[tuple[str, float], ...]:
    """The scalar hyperparameters (name, value) that make an exponent of `exprs` a known multiple of
    1/2 (`half_steps`): their values go into the generated source, the other hyperparameters'
    stay kernel arguments (one kernel for every value)."""
    found = {}
    for b in (b for e in exprs for b in _exponents(e)):
        names = ir.hyper_names(b)
        if names and names <= scalars.keys() and half_steps(b, scalars) is not None:
            found.update((n, scalars[n]) for n in names)
    return tuple(sorted(found.items()))


_ABS_DIFFERENCE = Call("abs", (Call("sub", (Var("x"), Var("z"))),))


def split_exponent(program: object, ge1: frozenset[str]) -> Expr | None:
    """The exponent `b` if `program` is `Σ_k |x − z|^b` with `b` known finite and >= 1 (any
    epilogue), else `None`: the programs whose pairwise kernel may split ex2 onto the FMA pipe.

    Decided on the normal form of the inner term (`kermac.programs.canonical_inner`), so `|z − x|^b`
    qualifies too (the kernel forms |x − z| itself, the same value); `b` is returned as written."""
    inner = canonical_inner(program)
    if program.reduction != "sum" or not (isinstance(inner, Call) and inner.op == "pow"):
        return None
    base, b = inner.args
    if base != _ABS_DIFFERENCE or not _exponent_ge1(b, ge1):
        return None
    written = program.inner
    return written.args[1] if isinstance(written, Call) and written.op == "pow" else b


def render_expr(
    expr: Expr,
    names: dict[str, str],
    *,
    compute: str = "float",
    ge1: frozenset[str] = frozenset(),
    gt1: frozenset[str] = frozenset(),
    ftz: bool = False,
    half_powers: bool = False,
    known: Mapping[str, float] = {},
    nonneg: frozenset[str] = frozenset(),
) -> str:
    """CUDA C++ for `expr` computed in `compute` ("float" or "double"); `names` maps Var names to C
    identifiers, a hyperparameter is `hyper_identifier` of its name (a program may name a
    hyperparameter as one of its variables: they stay apart).  Constants are rounded to `compute`
    (`cuda_constant`).

    `half_powers`: a power of an absolute value (signed or not) whose exponent constants and
    `known` (hyperparameter values fixed in the source) make a multiple of 1/2 in [1/2, 4]
    (`half_steps`) is `km_powhalf`/`km_signpowhalf` (products and at most one square root).

    `nonneg`: variables known to be ≥ +0 or NaN (`kermac.programs.nonnegative_variables`: a pairwise epilogue's
    `acc` where the terms and the reduction keep it so); a power of a base `kermac.programs.nonnegative` proves
    non-negative with them is `km_pow_nonneg` (or `km_powhalf` for a known exponent N/2) instead of IEEE `km_pow`.

    `ge1`: hyperparameters known to be finite and >= 1 (`|a|^h` then needs no `h = 0` case,
    and with `ftz` uses `km_powabs_ftz`, which flushes terms below 2^-126 to 0; a signed power
    with an exponent known >= 0 uses `km_signpow_ftz`, which gives ±0 for |x| < 2^-126, and
    `km_signpow_pos` where `gt1` — hyperparameters known > 1 — makes it known > 0).  A division
    by an expression of hyperparameters and constants only is `km_div_inv` (one reciprocal per
    thread, then a product and a correction step per value, correctly rounded); the exponential of
    such a quotient (also negated) is `km_exp_div` (one ex2 of a·log2(e)/b, the factor per thread).
    """
    peeps: dict[str, str] = {}

    def rewrite(e: Expr) -> Expr:
        if isinstance(e, Call):
            if e.op == "pow" and isinstance(e.args[0], Call) and e.args[0].op == "abs":
                n = half_steps(e.args[1], known) if half_powers else None
                if n is not None:  # a >= 2^-126 kept unless |a|^b >= |a| (b >= 1), as km_powabs_ftz
                    return placeholder(f"km_powhalf<{n}, {str(ftz and n >= 2).lower()}>({sub(e.args[0])})")
                base, b = sub(e.args[0]), sub(e.args[1])
                fn = ("km_powabs_ftz" if ftz else "km_powabs_nz") if _exponent_ge1(e.args[1], ge1) else "km_powabs"
                return placeholder(f"{fn}({base}, {b})")
            if e.op == "pow" and nonnegative(e.args[0], nonneg):
                n = half_steps(e.args[1], known) if half_powers else None
                if n is not None:
                    return placeholder(f"km_powhalf<{n}, false>({sub(e.args[0])})")
                return placeholder(f"km_pow_nonneg({sub(e.args[0])}, {sub(e.args[1])})")
            quotient = _exp_of_quotient(e)
            if quotient is not None:
                return placeholder(f"km_exp_div({sub(quotient[0])}, {sub(quotient[1])})")
            if e.op == "div" and not ir.free_vars(e.args[1]):
                return placeholder(f"km_div_inv({sub(e.args[0])}, {sub(e.args[1])})")
            signed = signed_power(e)
            n = half_steps(signed[1], known) if signed is not None and half_powers else None
            if n is not None:
                return placeholder(f"km_signpowhalf<{n}, {str(ftz).lower()}>({sub(signed[0])})")
            if signed is not None:
                sign = _exponent_sign(signed[1], ge1, gt1) if ftz else None
                fn = "km_signpow" if sign is None else ("km_signpow_pos" if sign else "km_signpow_ftz")
                return placeholder(f"{fn}({sub(signed[0])}, {sub(signed[1])})")
            return Call(e.op, tuple(rewrite(a) for a in e.args))
        return e

    def sub(e: Expr) -> str:
        options = {"ge1": ge1, "gt1": gt1, "ftz": ftz, "half_powers": half_powers, "known": known, "nonneg": nonneg}
        return render_expr(e, names, compute=compute, **options)

    def placeholder(text: str) -> Expr:
        key = f"kmpeep{len(peeps)}"
        peeps[key] = text
        return Var(key)

    def var(name: str) -> str:
        if name in peeps:
            return peeps[name]
        return names[name]

    return ir.render(
        rewrite(expr), const=lambda v: cuda_constant(v, compute), var=var, hyper=hyper_identifier, ops=CUDA_OPS
    )


def _exp_of_quotient(e: Call) -> tuple[Expr, Expr] | None:
    """`(a, b)` where `e` is `exp(a / b)` or `exp(−(a / b))` (then `b` is `−b`) with `b`
    free of variables (built from hyperparameters and constants), else `None`."""
    if e.op != "exp" or not isinstance(e.args[0], Call):
        return None
    arg, negate = e.args[0], False
    if arg.op == "neg" and isinstance(arg.args[0], Call):
        arg, negate = arg.args[0], True
    if arg.op != "div" or ir.free_vars(arg.args[1]):
        return None
    return arg.args[0], Call("neg", (arg.args[1],)) if negate else arg.args[1]


_SIGN = ir.sign(ir.Var("d") - ir.Var("b"))


def is_sign_product(program: object) -> bool:
    """Whether a gradient program computes the product form with the factor exactly `sign(d − b)` (p = 1,
    `kermac.programs.product_factor`): the programs the bf16 sign-product kernel (`cuda/sign_grad.cuh`) computes."""
    return product_factor(program) == _SIGN
