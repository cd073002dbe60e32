"""Lower core's expression IR to Triton source text.

Every expression of a program (:mod:`kermac.programs`) is rendered with :func:`kermac.ir.render`
and the operation table :func:`op_table`; this module adds only what Triton needs around it:

* the compute type: ``float32`` (also for float16/bfloat16 inputs) or ``float64``.  Every leaf
  of an expression is a value of that type: constants are 0-d tensors ``tl.full([], c, T)`` (the
  Python float rounded once to T: exact in float64, subnormals kept, ±inf and NaN spelled without a
  NaN-valued global), scalar hyperparameters are cast to T on entry (:func:`hyper_loads`), and
  comparisons give T's 1.0 / 0.0.  Nothing is left to Triton's typing of Python scalars, which
  computes a subexpression of scalars only in float32 (under the interpreter also a float64
  kernel argument) and cannot broadcast a bare Python float to a tile;
* ``pow(a, b)`` as ``exp2(b·log2 a)`` (the special-function unit, one ``lg2`` and one ``ex2``)
  with the IEEE special cases restored, in two forms: ``_kpow_nn`` where ``a`` is
  provably never negative (``|t|``, ``t·t``, sums of those — see :func:`nonnegative`), and the
  general ``_kpow`` (negative bases: integer exponents keep the sign, others give NaN);
* ``sign`` with sign(±0) = +0 (torch.sign) and NaN → NaN, comparisons as 1.0 / 0.0, ``min``/``max`` that
  propagate NaN, ``sqrt`` correctly rounded (``sqrt_rn`` in float32);
* ``_ksignpow_pos``: sgn(t)·|t|^b for 0 < b < ∞ as a copysign of one power (the gradient
  kernel's fractional-p loop, :mod:`kermac_backend_triton.kernels`).

The helpers (:func:`helpers`) are ``@triton.jit`` functions emitted at the top of every generated
module.  Inner-loop expressions (``fast``) take ``log2`` from the special-function unit
(``lg2.approx``, relative error 2⁻²²) instead of Triton's float32 software ``log2``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from kermac import ir
from kermac.ir import Call, Const, Expr, Hyper, Var

__all__ = ["COMPUTE_TYPES", "const", "helpers", "hyper_arg", "nonnegative", "op_table", "render_expr"]

#: Compute type name → the Triton dtype expression used in generated source.
COMPUTE_TYPES: Mapping[str, str] = {"float32": "tl.float32", "float64": "tl.float64"}

_PLATFORM_HELPERS = {
    # float32 on a GPU.  _klog2abs_fast: log2|a| as lg2.approx.ftz.f32 on the special-function unit
    # (absolute error about 2^-22; a subnormal |a| counts as 0: for exponents b >= 1 its power is
    # below the smallest normal number, for b < 1 a term below F^b is lost, F = 2^-126, which only
    # differences within a few ulp of F can notice; the abs inside the asm is folded into the MUFU
    # operand) --
    # Triton's own float32 log2 is a long software polynomial.  _kexp/_kexp2:
    # libdevice's correctly handled expf/exp2f (Triton's tl.exp flushes subnormal results to 0,
    # which loses kernel values below 1.2e-38 that torch keeps).
    "gpu": """
from triton.language.extra import libdevice


@triton.jit
def _klog2abs_fast(a):
    return tl.inline_asm_elementwise(
        "{ .reg .f32 m; abs.f32 m, $1; lg2.approx.ftz.f32 $0, m; }", "=r,r", [a], dtype=tl.float32, is_pure=True, pack=1
    )


@triton.jit
def _kexp(a):
    return libdevice.exp(a)


@triton.jit
def _kexp2(a):
    return libdevice.exp2(a)
""",
    # The interpreter runs no PTX (and no libdevice); float64 math is accurate throughout.
    "portable": """
@triton.jit
def _klog2abs_fast(a):
    return tl.log2(tl.abs(a))


@triton.jit
def _kexp(a):
    return tl.exp(a)


@triton.jit
def _kexp2(a):
    return tl.exp2(a)
""",
}


def helpers(compute: str, interpret: bool) -> str:
    """Module prologue of every generated kernel module: imports, constants, helper functions.

    Only three helpers differ between platforms (:data:`_PLATFORM_HELPERS`): for float32 on a
    GPU ``_klog2abs_fast`` is the special-function unit's ``lg2.approx`` of ``|a|`` and
    ``_kexp``/``_kexp2`` are libdevice's; under the interpreter or in float64 all three are
    Triton's accurate ones.  ``_kcopysign`` is the compute type's bitwise copysign and
    ``_ksignbit`` its sign-bit test.
    """
    if compute not in COMPUTE_TYPES:
        raise ValueError(f"compute: expected one of {sorted(COMPUTE_TYPES)}, got {compute!r}")
    platform = _PLATFORM_HELPERS["gpu" if compute == "float32" and not interpret else "portable"]
    bits, sign = _SIGN_BIT[compute]
    return _HELPERS + _COPYSIGN.format(bits=bits, sign=sign, dtype=COMPUTE_TYPES[compute]) + platform


#: Compute type → (same-width unsigned type, its sign bit) for :data:`_COPYSIGN`.
_SIGN_BIT: Mapping[str, tuple[str, str]] = {
    "float32": ("tl.uint32", "0x80000000"),
    "float64": ("tl.uint64", "0x8000000000000000"),
}

_COPYSIGN = """

@triton.jit
def _kcopysign(r, t):
    # r (+0 or more, or NaN) with the sign bit of t: one bitwise instruction.
    bits = r.to({bits}, bitcast=True) | (t.to({bits}, bitcast=True) & {sign})
    return bits.to({dtype}, bitcast=True)


@triton.jit
def _ksignbit(a):
    # Whether a's sign bit is set (a < 0, or -0): read from the bits, since a compiler may take
    # a == 0 to mean a is +0 (1 / a then loses -0's sign, as it did on the GPU).
    return (a.to({bits}, bitcast=True) & {sign}) != 0
"""


_HELPERS = """\
import triton
import triton.language as tl

# No NaN-valued global: Triton re-checks used globals with `!=` at every launch, and NaN != NaN.
_INF = tl.constexpr(float("inf"))
_NINF = tl.constexpr(float("-inf"))


@triton.jit
def _kpow_nn(a, b):
    # a ** b for a >= 0 (or NaN): exp2(b * log2(a)); pow(a, 0) = pow(1, b) = 1 as in IEEE pow.
    r = _kexp2(b * tl.log2(a))
    return tl.where(b == 0, 1.0, tl.where(a == 1, 1.0, r))


@triton.jit
def _kpow_nn_fast(a, b):
    # _kpow_nn on the special-function unit (inner loops): lg2.approx and ex2.approx.
    r = tl.exp2(b * _klog2abs_fast(a))
    return tl.where(b == 0, 1.0, tl.where(a == 1, 1.0, r))


@triton.jit
def _ksignpow_pos(t, b):
    # sign(t) * |t| ** b where t != 0, 0 where t == 0, for 0 < b < inf (elementwise b): the power
    # alone is right everywhere (|+-0| ** b = 0, |+-inf| ** b = inf, 1 ** b = 1, NaN) and the sign
    # is t's sign bit -- no selects.
    return _kcopysign(tl.exp2(b * _klog2abs_fast(t)), t)


@triton.jit
def _kpow(a, b):
    # IEEE pow for any a: |a| ** b, negated for a < 0 (or -0) with an odd integer b, NaN for
    # a finite a < 0 with a non-integer b; pow(a, 0) = pow(1, b) = pow(-1, +-inf) = 1.
    r = _kexp2(b * tl.log2(tl.abs(a)))
    odd = (b - 2.0 * tl.floor(0.5 * b)) == 1.0
    negative = _ksignbit(a)
    real = tl.where(tl.floor(b) == b, True, (a == 0) | (tl.abs(a) == _INF))
    r = tl.where(negative, tl.where(odd, -r, tl.where(real, r, _INF - _INF)), r)
    r = tl.where(tl.abs(a) == 1, tl.where(tl.abs(b) == _INF, 1.0, r), r)
    return tl.where(b == 0, 1.0, tl.where(a == 1, 1.0, r))


@triton.jit
def _ksign(a):
    # -1, +0 or 1 as torch.sign (sign(-0) = +0); NaN stays NaN.  |a| is free (an operand modifier).
    return tl.where(a > 0, 1.0, tl.where(a < 0, -1.0, tl.abs(a)))


@triton.jit
def _kmax(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _kmin(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _kadd(a, b):
    return a + b
"""

_COMMON_OPS: Mapping[str, str] = {
    "add": "({0} + {1})",
    "sub": "({0} - {1})",
    "mul": "({0} * {1})",
    "neg": "(-{0})",
    "abs": "tl.abs({0})",
    "log": "tl.log({0})",
    "pow": "_kpow({0}, {1})",
    "min": "_kmin({0}, {1})",
    "max": "_kmax({0}, {1})",
    "sign": "_ksign({0})",
    "select": "tl.where({0} != 0, {1}, {2})",
}

#: Comparisons as the compute type's 1.0 / 0.0 (``{T}``: the compute type).
_COMPARISONS: Mapping[str, str] = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def op_table(compute: str, *, fast: bool = False) -> dict[str, str]:
    """The IR operation → Triton template table for compute type ``compute``.

    float32 uses the correctly rounded ``sqrt_rn`` (Triton's plain ``sqrt`` is approximate) and
    Triton's ``/`` (``div.full``, within 2 ulp: a correctly rounded ``div_rn`` costs ~0.3 ms per
    16384² kernel matrix); in float64 the plain forms are correctly rounded.
    ``exp`` is ``_kexp`` (subnormal results kept) except in ``fast`` inner loops.
    """
    if compute not in COMPUTE_TYPES:
        raise ValueError(f"compute: expected one of {sorted(COMPUTE_TYPES)}, got {compute!r}")
    table = dict(_COMMON_OPS)
    cdt = COMPUTE_TYPES[compute]
    table.update({op: f"({{0}} {sym} {{1}}).to({cdt})" for op, sym in _COMPARISONS.items()})
    table["exp"] = "tl.exp({0})" if fast else "_kexp({0})"
    if compute == "float32":
        table.update({"sqrt": "tl.sqrt_rn({0})", "div": "({0} / {1})"})
    else:
        table.update({"sqrt": "tl.sqrt({0})", "div": "({0} / {1})"})
    missing = set(ir.OPS) - set(table)
    assert not missing, f"Triton op table lacks {sorted(missing)}"
    return table


def nonnegative(expr: Expr, known: frozenset[str] = frozenset()) -> bool:
    """Whether ``expr`` is provably ≥ +0 or NaN (never negative, never −0).

    ``known`` names variables with that property (e.g. ``acc`` of a sum of non-negative terms).
    The analysis is conservative: ``False`` means "not proven".
    """
    if isinstance(expr, Const):
        return expr.value >= 0 and math.copysign(1.0, expr.value) > 0
    if isinstance(expr, Var):
        return expr.name in known
    if isinstance(expr, Hyper):
        return False
    assert isinstance(expr, Call)
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


def const(value: float, compute: str, lang: str = "tl") -> str:
    """Source of the constant ``value`` as a 0-d tensor of compute type ``compute``.

    ``repr`` gives back the exact double, which Triton rounds once to the compute type (float32
    subnormals included).  NaN is ∞·0: a NaN-valued global is not possible (Triton re-checks the
    globals a kernel uses with ``!=`` at every launch, and NaN != NaN); −0 is the sign bit alone, bitcast
    (Triton's compiled ``full(−0.0)`` is +0).  ``lang`` is the kernel's
    language module: ``tl``, or ``gl`` in Gluon (whose ``full`` takes an optional layout, ``tl.full``
    none).
    """
    cdt = COMPUTE_TYPES[compute]
    if math.isnan(value):
        return f"({lang}.full([], _INF, {cdt}) * 0.0)"
    if math.isinf(value):
        return f"{lang}.full([], {'_INF' if value > 0 else '_NINF'}, {cdt})"
    if value == 0.0 and math.copysign(1.0, value) < 0:  # full(-0.0) compiles to +0: the sign bit alone
        bits, sign = _SIGN_BIT[compute]
        return f"{lang}.full([], {sign}, {bits}).to({cdt}, bitcast=True)"
    return f"{lang}.full([], {float(value)!r}, {cdt})"


def hyper_arg(name: str) -> str:
    """The kernel-local name holding hyperparameter ``name``."""
    return f"h_{name}"


def _mark_fast_pows(expr: Expr, known: frozenset[str], pows: dict[str, tuple[Expr, Expr]]) -> Expr:
    """``expr`` with its ``pow`` nodes of provably non-negative base replaced by placeholder variables."""
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
    """Triton source of ``expr``.

    ``variables`` maps each IR variable name to the kernel-local expression holding it;
    hyperparameters render as :func:`hyper_arg` names.  ``pow`` with a provably non-negative base
    (``known`` lists non-negative variables) skips the negative-base cases (``_kpow_nn``); with
    ``fast`` (inner loops) it also takes its logarithm from the special-function unit.  ``lang``:
    the kernel's language module (:func:`const`).
    """
    pows: dict[str, tuple[Expr, Expr]] = {}
    lowered = _mark_fast_pows(expr, known, pows)
    table = op_table(compute, fast=fast)

    def var(name: str) -> str:
        if name in pows:
            base, exponent = pows[name]
            helper = "_kpow_nn_fast" if fast else "_kpow_nn"
            return f"{helper}({var_render(base)}, {var_render(exponent)})"
        try:
            return variables[name]
        except KeyError:
            raise KeyError(f"variable {name!r} has no binding in this kernel (bound: {sorted(variables)})") from None

    def var_render(e: Expr) -> str:
        return ir.render(e, const=lambda v: const(v, compute, lang), var=var, hyper=hyper_arg, ops=table)

    return var_render(lowered)
