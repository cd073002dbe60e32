"""Lower core's expression IR to Triton expression text.

Every expression of a program ([`kermac.programs`][kermac.programs]) is rendered with
[`kermac.ir.render`][kermac.ir.render] and the operation table `op_table`; this module adds only what Triton needs
around it:

* the compute type: `float32` (also for float16/bfloat16 inputs) or `float64`.  Every leaf
  of an expression is a value of that type: constants are 0-d tensors `tl.full([], c, T)` (the
  Python float rounded once to T: exact in float64, subnormals kept, ±inf and NaN spelled without a
  NaN-valued global), scalar hyperparameters are cast to T on entry
  (`kermac_backend_triton.generated`), and comparisons give T's 1.0 / 0.0.  Nothing is left
  to Triton's typing of Python scalars, which computes a subexpression of scalars only in float32
  (under the interpreter also a float64 kernel argument) and cannot broadcast a bare Python float
  to a tile;
* `pow(a, b)` as `exp2(b·log2 a)` (the special-function unit, one `lg2` and one `ex2`)
  with the IEEE special cases restored, in two forms: `pow_nonneg` where `a` is provably
  never negative (`|t|`, `t·t`, sums of those — see `kermac.programs.nonnegative`), and the general
  `pow_ieee` (negative bases: integer exponents keep the sign, others give NaN);
* `sign` with sign(±0) = +0 (torch.sign) and NaN → NaN, comparisons as 1.0 / 0.0, `min`/`max`
  that propagate NaN, `sqrt` within about an ulp in float32 (`sqrt_approx`).

The functions named here are the `@triton.jit` functions of
`kermac_backend_triton.kernel_math`.  Inner-loop expressions (`fast`) take `log2` from the
special-function unit (`lg2.approx`, relative error 2⁻²²) instead of Triton's float32 software
`log2`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from kermac import ir
from kermac.ir import Call, Expr, Var
from kermac.programs import nonnegative

__all__ = ["COMPUTE_TYPES", "const", "hyper_arg", "op_table", "render_expr"]

COMPUTE_TYPES: Mapping[str, str] = {"float32": "tl.float32", "float64": "tl.float64"}
"""Compute type name → the Triton dtype expression used in generated source."""

_SIGN_BIT: Mapping[str, tuple[str, str]] = {
    "float32": ("tl.uint32", "0x80000000"),
    "float64": ("tl.uint64", "0x8000000000000000"),
}
"""Compute type → (same-width unsigned type, its sign bit): −0 is spelled as its bits."""

_COMMON_OPS: Mapping[str, str] = {
    "add": "({0} + {1})",
    "sub": "({0} - {1})",
    "mul": "({0} * {1})",
    "neg": "(-{0})",
    "abs": "tl.abs({0})",
    "log": "tl.log({0})",
    "pow": "pow_ieee({0}, {1})",
    "min": "min_nan({0}, {1})",
    "max": "max_nan({0}, {1})",
    "sign": "sign({0})",
    "select": "tl.where({0} != 0, {1}, {2})",
}

_COMPARISONS: Mapping[str, str] = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
"""Comparisons as the compute type's 1.0 / 0.0 (`{T}`: the compute type)."""


def op_table(compute: str, *, fast: bool = False) -> dict[str, str]:
    """The IR operation → Triton template table for compute type `compute`.

    float32 uses `sqrt_approx` (`sqrt.approx.f32` on a GPU, within about an ulp, subnormal inputs kept: the
    correctly rounded `sqrt.rn` made few-feature distances slower than their write) and Triton's `/`
    (`div.full`, within 2 ulp: a correctly rounded `div_rn` is measurably slower on large kernel
    matrices); in float64 the plain forms are correctly rounded.
    `exp` is `exp_accurate` (subnormal results kept) except in `fast` inner loops.
    """
    if compute not in COMPUTE_TYPES:
        raise ValueError(f"compute: expected one of {sorted(COMPUTE_TYPES)}, got {compute!r}")
    table = dict(_COMMON_OPS)
    cdt = COMPUTE_TYPES[compute]
    table.update({op: f"({{0}} {sym} {{1}}).to({cdt})" for op, sym in _COMPARISONS.items()})
    table["exp"] = "tl.exp({0})" if fast else "exp_accurate({0})"
    table["div"] = "({0} / {1})"
    table["sqrt"] = "sqrt_approx({0})" if compute == "float32" else "tl.sqrt({0})"
    missing = set(ir.OPS) - set(table)
    assert not missing, f"Triton op table lacks {sorted(missing)}"
    return table


def const(value: float, compute: str, lang: str = "tl") -> str:
    """Source of the constant `value` as a 0-d tensor of compute type `compute`.

    `repr` gives back the exact double, which Triton rounds once to the compute type (float32
    subnormals included).  NaN is ∞·0: a NaN-valued global is not possible (Triton re-checks the
    globals a kernel uses with `!=` at every launch, and NaN != NaN); −0 is the sign bit alone, bitcast
    (Triton's compiled `full(−0.0)` is +0).  `lang` is the kernel's
    language module: `tl`, or `gl` in Gluon (whose `full` takes an optional layout, `tl.full`
    none).
    """
    cdt = COMPUTE_TYPES[compute]
    if math.isnan(value):
        return f"({lang}.full([], INF, {cdt}) * 0.0)"
    if math.isinf(value):
        return f"{lang}.full([], {'INF' if value > 0 else 'NINF'}, {cdt})"
    if value == 0.0 and math.copysign(1.0, value) < 0:  # full(-0.0) compiles to +0: the sign bit alone
        bits, sign = _SIGN_BIT[compute]
        return f"{lang}.full([], {sign}, {bits}).to({cdt}, bitcast=True)"
    return f"{lang}.full([], {float(value)!r}, {cdt})"


def hyper_arg(name: str) -> str:
    """The kernel-local name holding hyperparameter `name`."""
    return f"h_{name}"


def _mark_fast_pows(expr: Expr, known: frozenset[str], pows: dict[str, tuple[Expr, Expr]]) -> Expr:
    """`expr` with its `pow` nodes of provably non-negative base replaced by placeholder variables."""
    if not isinstance(expr, Call):
        return expr
    args = tuple(_mark_fast_pows(a, known, pows) for a in expr.args)
    if expr.op == "pow" and nonnegative(expr.args[0], known):
        name = f"kpownn{len(pows)}"
        pows[name] = (args[0], args[1])
        return Var(name)
    return Call(expr.op, args)


def render_expr(
    expr: Expr,
    variables: Mapping[str, str],
    compute: str,
    known: frozenset[str] = frozenset(),
    *,
    fast: bool = False,
    lang: str = "tl",
) -> str:
    """Triton source of `expr`.

    `variables` maps each IR variable name to the kernel-local expression holding it;
    hyperparameters render as `hyper_arg` names.  `pow` with a provably non-negative base
    (`known` lists non-negative variables) skips the negative-base cases (`pow_nonneg`); with
    `fast` (inner loops) it also takes its logarithm from the special-function unit.  `lang`:
    the kernel's language module (`const`).
    """
    pows: dict[str, tuple[Expr, Expr]] = {}
    lowered = _mark_fast_pows(expr, known, pows)
    table = op_table(compute, fast=fast)

    def var(name: str) -> str:
        if name in pows:
            base, exponent = pows[name]
            helper = "pow_nonneg_fast" if fast else "pow_nonneg"
            return f"{helper}({var_render(base)}, {var_render(exponent)})"
        try:
            return variables[name]
        except KeyError:
            raise KeyError(f"variable {name!r} has no binding in this kernel (bound: {sorted(variables)})") from None

    def var_render(e: Expr) -> str:
        return ir.render(e, const=lambda v: const(v, compute, lang), var=var, hyper=hyper_arg, ops=table)

    return var_render(lowered)
