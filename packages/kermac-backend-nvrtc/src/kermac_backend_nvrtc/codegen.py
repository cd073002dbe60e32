"""IR → CUDA C++: render core's expressions and fill the kernel templates of :mod:`.kernels`.

A *variant* (:class:`PairwiseVariant`, :class:`GradVariant`) is everything that changes the
generated source: the program, the input and compute types, which hyperparameters are numbers
(kernel arguments: a new value needs no recompile) and which are tensors (pointer + batch
strides), the number of coalesced batch dimensions and the operand load modes.  Sizes, strides,
pointers and hyperparameter values are kernel arguments.  :func:`pairwise_source` /
:func:`grad_source` return the source and the ordered kernel parameters.

Expressions go through :func:`kermac.ir.render` with :data:`CUDA_OPS`; two peepholes first
replace sub-trees by faster equivalents with the same semantics: ``pow(abs(e), b)`` →
``km_powabs`` (``ex2(b·lg2|e|)``, no sign handling needed; ``km_powabs_ftz`` for a known
``b >= 1`` when subnormals may be flushed) and
``select(ne(e, 0), sign(e)·pow(abs(e), b), 0)`` (:func:`kermac.programs.signed_power`) →
``km_signpow`` (a copysign instead of a sign times a product).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from string import Template

import torch

from kermac import ir
from kermac.ir import Call, Const, Expr, Hyper, Var
from kermac.programs import is_squared_difference_sum, signed_power, zero_padding_is_neutral
from kermac_backend_nvrtc import kernels

__all__ = [
    "CUDA_OPS",
    "INPUT_TYPES",
    "TC_CONFIG",
    "GradConfig",
    "GradParts",
    "GradVariant",
    "PairwiseConfig",
    "PairwiseVariant",
    "Param",
    "arch_capability",
    "dynamic_smem",
    "grad_config",
    "grad_parts",
    "grad_source",
    "is_squared_difference_sum",
    "pairwise_config",
    "pairwise_source",
    "render_expr",
    "rounded",
    "split_exponent",
    "target_arch",
    "tc_guard",
]

#: IR operation → CUDA C++ format (overloads in ``kernels.PRELUDE`` cover float and double).
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

#: torch dtype name → (CUDA storage type, compute type).
INPUT_TYPES: dict[str, tuple[str, str]] = {
    "float32": ("float", "float"),
    "float64": ("double", "double"),
    "float16": ("km_f16", "float"),
    "bfloat16": ("km_bf16", "float"),
}

#: 2^r on [−0.5, 0.5], relative minimax of degree 4 (float32 Horner: max 2.7e-6, mean 4e-8).
_EXP2_COEFFS = (0.9999992847442627, 0.6931217908859253, 0.240247443318367, 0.05591785907745361, 0.009570101276040077)


@dataclass(frozen=True)
class Param:
    """One kernel parameter: its name and C type (a ``*`` type is a device pointer)."""

    name: str
    ctype: str

    @property
    def decl(self) -> str:
        restrict = " __restrict__" if self.ctype.endswith("*") else ""
        return f"{self.ctype}{restrict} {self.name}"


#: Compute type name → the torch dtype that rounds constants to it.
_COMPUTE_DTYPES = {"float": torch.float32, "double": torch.float64}


def rounded(v: float, compute: str) -> float:
    """``v`` rounded to compute type ``compute`` ("float" or "double"): to nearest, float32
    subnormals kept, ±inf past the range (what the reference backend computes with)."""
    return torch.tensor(v, dtype=torch.float64).to(_COMPUTE_DTYPES[compute]).item()


def _const(v: float, compute: str) -> str:
    """The constant ``v`` in compute type ``compute`` ("float" or "double"), exactly.

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
    """Whether exponent ``b`` is known finite and >= 1: a constant, or a hyperparameter in ``ge1``."""
    return (isinstance(b, Hyper) and b.name in ge1) or (isinstance(b, Const) and 1.0 <= b.value < math.inf)


def _exponent_sign(b: Expr, ge1: frozenset[str], gt1: frozenset[str]) -> int | None:
    """1 if exponent ``b`` is known finite and > 0, 0 if known finite and >= 0, else None: a constant,
    a hyperparameter known >= 1, or ``h − c`` with c <= 1 and ``h`` known > 1 (``gt1``) or >= 1
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
    """The value of ``e`` if it is built from constants and ``known`` hyperparameters with + − ×,
    else ``None``."""
    if isinstance(e, Const):
        return e.value
    if isinstance(e, Hyper):
        return known.get(e.name)
    if isinstance(e, Call) and e.op in _ARITHMETIC:
        args = [_constant_value(a, known) for a in e.args]
        return None if None in args else _ARITHMETIC[e.op](*args)
    return None


def half_steps(b: Expr, known: Mapping[str, float]) -> int | None:
    """N if exponent ``b`` is known (constants and ``known`` hyperparameters) to be N/2 with
    1 <= N <= 8 — a power the kernels take as products and at most one square root
    (``km_powhalf``) — else ``None``."""
    v = _constant_value(b, known)
    if v is None or not 0.5 <= v <= 4.0 or 2 * v != round(2 * v):  # range first: 2·v may overflow
        return None
    return round(2 * v)


def _exponents(expr: Expr) -> Iterator[Expr]:
    """The exponents of ``expr``'s powers of an absolute value (signed powers included)."""
    for node in ir.walk(expr):
        if isinstance(node, Call) and node.op == "pow" and isinstance(node.args[0], Call) and node.args[0].op == "abs":
            yield node.args[1]


def half_power_hypers(exprs: Iterable[Expr], scalars: Mapping[str, float]) -> tuple[tuple[str, float], ...]:
    """The scalar hyperparameters (name, value) that make an exponent of ``exprs`` a known multiple of
    1/2 (:func:`half_steps`): their values go into the generated source, the other hyperparameters'
    stay kernel arguments (one kernel for every value)."""
    found = {}
    for b in (b for e in exprs for b in _exponents(e)):
        names = ir.hyper_names(b)
        if names and names <= scalars.keys() and half_steps(b, scalars) is not None:
            found.update((n, scalars[n]) for n in names)
    return tuple(sorted(found.items()))


def split_exponent(program: object, ge1: frozenset[str]) -> Expr | None:
    """The exponent ``b`` if ``program`` is ``Σ_k |x − z|^b`` with ``b`` known finite and >= 1 (any
    epilogue), else ``None``: the programs whose pairwise kernel may split ex2 onto the FMA pipe."""
    inner = program.inner
    if program.reduction != "sum" or not (isinstance(inner, Call) and inner.op == "pow"):
        return None
    base, b = inner.args
    if base != Call("abs", (Call("sub", (Var("x"), Var("z"))),)) or not _exponent_ge1(b, ge1):
        return None
    return b


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
) -> str:
    """CUDA C++ for ``expr`` computed in ``compute`` ("float" or "double"); ``names`` maps Var and
    Hyper names to C identifiers.  Constants are rounded to ``compute`` (:func:`_const`).

    ``half_powers``: a power of an absolute value (signed or not) whose exponent constants and
    ``known`` (hyperparameter values fixed in the source) make a multiple of 1/2 in [1/2, 4]
    (:func:`half_steps`) is ``km_powhalf``/``km_signpowhalf`` (products and at most one square root).

    ``ge1``: hyperparameters known to be finite and >= 1 (``|a|^h`` then needs no ``h = 0`` case,
    and with ``ftz`` uses ``km_powabs_ftz``, which flushes terms below 2^-126 to 0; a signed power
    with an exponent known >= 0 uses ``km_signpow_ftz``, which gives ±0 for |x| < 2^-126, and
    ``km_signpow_pos`` where ``gt1`` — hyperparameters known > 1 — makes it known > 0).  A division
    by an expression of hyperparameters and constants only is ``km_div_inv`` (one reciprocal per
    thread, then a product and a correction step per value, correctly rounded); the exponential of
    such a quotient (also negated) is ``km_exp_div`` (one ex2 of a·log2(e)/b, the factor per thread).
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
        return render_expr(e, names, compute=compute, ge1=ge1, gt1=gt1, ftz=ftz, half_powers=half_powers, known=known)

    def placeholder(text: str) -> Expr:
        key = f"kmpeep{len(peeps)}"
        peeps[key] = text
        return Var(key)

    def var(name: str) -> str:
        if name in peeps:
            return peeps[name]
        return names[name]

    return ir.render(rewrite(expr), const=lambda v: _const(v, compute), var=var, hyper=lambda n: names[n], ops=CUDA_OPS)


def _exp_of_quotient(e: Call) -> tuple[Expr, Expr] | None:
    """``(a, b)`` where ``e`` is ``exp(a / b)`` or ``exp(−(a / b))`` (then ``b`` is ``−b``) with ``b``
    free of variables (built from hyperparameters and constants), else ``None``."""
    if e.op != "exp" or not isinstance(e.args[0], Call):
        return None
    arg, negate = e.args[0], False
    if arg.op == "neg" and isinstance(arg.args[0], Call):
        arg, negate = arg.args[0], True
    if arg.op != "div" or ir.free_vars(arg.args[1]):
        return None
    return arg.args[0], Call("neg", (arg.args[1],)) if negate else arg.args[1]


def _horner(coeffs: tuple[float, ...], x: str) -> str:
    text = f"{coeffs[-1]!r}f"
    for c in reversed(coeffs[:-1]):
        text = f"fmaf({text}, {x}, {c!r}f)"
    return text


def _prelude(compute: str, split: bool = False, ftz: bool = False) -> str:
    text = kernels.PRELUDE.replace("$COMPUTE", compute)
    if split:
        text += Template(kernels.POW_POLY).substitute(
            LG2="km_lg2_ftz" if ftz else "km_lg2", EXP2_COEFFS=_horner(_EXP2_COEFFS, "r")
        )
    return text + kernels.LOADER


# ---- variants -------------------------------------------------------------------------------


@dataclass(frozen=True)
class PairwiseConfig:
    """Tile shape of the pairwise kernel for a compute type: block BM×BN, ``tn`` threads along n
    (256 / ``tn`` along m), each thread ``gm`` groups of ``vm`` rows × ``gn`` groups of ``vn``
    columns (BM = gm·vm·256/tn, BN = gn·vn·tn)."""

    bm: int
    bn: int
    bk: int
    vm: int
    vn: int
    spad: int
    min_blocks: int
    tn: int = 16
    gm: int = 2
    gn: int = 2


#: Tile of the tensor-core kernel (``tc_pairwise.TC_PAIRWISE``): 8 warps of 64×32 outputs; the k-major
#: shared rows are padded by 8 floats so that the mma fragments' loads hit 32 distinct banks
#: (row stride 136 ≡ 8 mod 32).  ``vm``/``vn`` describe the SIMT thread tile and do not apply.
TC_CONFIG = PairwiseConfig(bm=128, bn=128, bk=16, vm=0, vn=0, spad=8, min_blocks=2)


def tc_guard(d: int) -> float:
    """Cancellation threshold of the tensor-core path for reduction length ``d``.

    d² = ‖x‖² + ‖z‖² − 2·x·z has an absolute error of about ε·S, S = ‖x‖² + ‖z‖²: fp32 sums of
    the three terms (≈ √D·2⁻²⁴·S, the maximum over random, offset and clustered data in the
    float64 emulation of the kernel stays below it) plus the 3×TF32 split (each product misses at
    most 3·2⁻²²·|x_k z_k|, so ≤ 3·2⁻²³·S in total).  Entries with d² ≤ 2¹⁶·ε·S — relative error
    of d² possibly above 2⁻¹⁶ (1.5e-5, 7.6e-6 on d) — are recomputed from differences; the
    threshold is capped at 1/2.
    """
    return min(0.5, (math.sqrt(max(d, 1)) * 2.0**-24 + 3 * 2.0**-23) * 2.0**16)


@dataclass(frozen=True)
class GradConfig:
    """Tile shape of the gradient kernel: block BNN×BMM pairs, thread TPN×TPM pairs, OT outputs."""

    bmm: int
    bnn: int
    bk: int
    tpm: int
    tpn: int
    max_ot: int
    spad: int
    min_blocks: int


#: Where a one-path ``long_k`` loop (``PairwiseVariant.one_path``) issues the next tile's loads: after
#: this many of its 16 k steps.  At 4 (and 2, 5, 6) the loop does not spill at 128 registers; at the
#: top, 3 or 8 it does (the top measured 8 % slower on an H100).  8-deep one-path loops load at the
#: top (after 2 of 8 steps Laplace-L1 was 2 % slower).  A module setting so that ``nvrtc_bench.py
#: --knob codegen.LONG_K_LOADS_AT=2,4,5,6`` can sweep it; like the tile configurations it is not in
#: ``plan.plan_key``, so a change needs ``NvrtcBackend.forget()`` (which the knob runs).
LONG_K_LOADS_AT = 4


#: The tile of k-contiguous kernels (``PairwiseVariant.k_contiguous``, ``kernels.KCONTIG_LOOP``):
#: 128 × 128 outputs, 16-deep k tiles, each thread 4 rows (32 apart) × 16 columns (8 apart).
KCONTIG_CONFIG = PairwiseConfig(bm=128, bn=128, bk=16, vm=1, vn=1, spad=0, min_blocks=2, tn=8, gm=4, gn=16)


def pairwise_config(compute: str, long_k: bool = False) -> PairwiseConfig:
    """The pairwise tile configuration for ``compute`` ("float" or "double").

    ``long_k`` (float only) stages 16 k-values per barrier instead of 8: faster where the inner
    term and the epilogue are cheap (cdist p = 1: −4 % at 30000²×1024), slower where either is
    not (Laplace-L1 +6 %, fractional p +2 %; H100, docs/nvrtc-notes.md).  Those others give each
    thread 4 × 16 outputs (one group of rows, four of columns) instead of 8 × 8: Laplace-L1 −4 %,
    fractional p equal; the cheap programs lose 2–3 % with it (Version 6 of the notes).
    """
    if compute == "double":
        return PairwiseConfig(bm=64, bn=64, bk=8, vm=2, vn=2, spad=2, min_blocks=2)
    if long_k:
        return PairwiseConfig(bm=128, bn=128, bk=16, vm=4, vn=4, spad=4, min_blocks=2)
    return PairwiseConfig(bm=128, bn=128, bk=8, vm=4, vn=4, spad=4, min_blocks=2, tn=8, gm=1, gn=4)


def grad_config(compute: str) -> GradConfig:
    """The gradient tile configuration for ``compute`` ("float" or "double")."""
    if compute == "double":
        return GradConfig(bmm=32, bnn=32, bk=16, tpm=2, tpn=2, max_ot=8, spad=2, min_blocks=1)
    return GradConfig(bmm=64, bnn=32, bk=16, tpm=4, tpn=2, max_ot=16, spad=4, min_blocks=1)


@dataclass(frozen=True)
class Operand:
    """How one operand tile is loaded: ``mode`` (see ``kernels.LOADER``) and elements per thread."""

    mode: int
    e: int


@dataclass(frozen=True)
class PairwiseVariant:
    """Everything that determines the generated pairwise source."""

    program: object  # kermac.programs.PairwiseProgram
    dtype: str  # torch dtype name: float32, float64, float16, bfloat16
    tensor_hypers: tuple[tuple[str, str], ...]  # (name, CUDA type of the tensor's elements)
    ge1_hypers: frozenset[str]  # scalar hyperparameters known finite and >= 1
    batch_dims: int
    x: Operand
    z: Operand
    poly_pairs: int  # pairs per thread whose ex2 of |x − z|^b runs on the FMA pipe (split_exponent programs)
    k_unroll: int  # unroll factor of the k loop over one shared-memory tile
    tensor_cores: bool = False  # (x − z)² sum on the tensor cores (tc_pairwise.TC_PAIRWISE), float32 only
    ftz: bool = False  # |.|^b with b >= 1 flushes subnormals (no denormal fix-ups around lg2/ex2)
    pow_degree: int = 0  # > 0: split pairs use pow_table (table × polynomial of this degree) instead of POW_POLY
    inline_epilogue: bool = True  # False: the tensor-core kernel calls the epilogue (__noinline__)
    long_k: bool = False  # SIMT float: 16 k-values per staged tile (pairwise_config)
    one_path: bool = False  # SIMT, not split, zero padding neutral: every k tile unrolled (kernels.PAIRWISE)
    k_contiguous: bool = False  # float32 Σ|x − z| on k-contiguous tiles (kernels.KCONTIG_LOOP)
    wgmma: bool = False  # tensor cores through wgmma (wgmma_pairwise, sm_90a) instead of mma.sync
    half_powers: bool = False  # powers of |·| with exponents N/2 known here as products and a square root
    known_hypers: tuple[tuple[str, float], ...] = ()  # values fixed in the source (half_power_hypers)


@dataclass(frozen=True)
class GradVariant:
    """Everything that determines the generated gradient source."""

    program: object  # kermac.programs.GradProgram
    dtype: str
    tensor_hypers: tuple[tuple[str, str], ...]
    ge1_hypers: frozenset[str]
    batch_dims: int
    ot: int
    k_unroll: int
    a: Operand
    b: Operand
    c: Operand
    tensor_cores: bool = False  # float32 contraction on the tensor cores (tc_grad.TC_GRAD); ot is 8 or 16
    wgmma: bool = False  # a sign(d − b) program as a bf16 sign product on wgmma (sign_grad, sm_90a)
    ftz: bool = False  # signed powers with exponents known >= 0 flush subnormals (km_signpow_ftz)
    gt1_hypers: frozenset[str] = frozenset()  # scalar hyperparameters known finite and > 1
    half_powers: bool = False  # powers of |·| with exponents N/2 known here as products and a square root
    known_hypers: tuple[tuple[str, float], ...] = ()  # values fixed in the source (half_power_hypers)


def _hyper_parts(
    hypers: tuple[str, ...], tensor_hypers: dict[str, str], offsets: list[str]
) -> tuple[list[Param], str, str, str]:
    params = []
    loads = []
    for h in hypers:
        if h in tensor_hypers:
            params.append(Param(f"hp_{h}", f"const {tensor_hypers[h]}*"))
            loads.append(f"    const km_t h_{h} = km_cvt(hp_{h}[off_h_{h}], km_t(0));")
            offsets.append(f"h_{h}")
        else:
            params.append(Param(f"hv_{h}", "km_t"))
            loads.append(f"    const km_t h_{h} = hv_{h};")
    formals = "".join(f", km_t h_{h}" for h in hypers)
    actuals = "".join(f", h_{h}" for h in hypers)
    return params, "\n".join(loads), formals, actuals


def _batch_parts(operands: list[str], batch_dims: int) -> tuple[list[Param], str]:
    """Parameters and code computing ``off_<operand>`` of batch entry ``bidx`` (innermost dim last)."""
    params = []
    lines = [f"    long long {', '.join(f'off_{o} = 0' for o in operands)};"]
    if batch_dims:
        lines.append("    { long long r = bidx; long long q;")
        for i in reversed(range(batch_dims)):
            params.append(Param(f"bs{i}", "long long"))
            lines.append(f"      q = r % bs{i}; r /= bs{i};")
            for o in operands:
                params.append(Param(f"b{o}{i}", "long long"))
                lines.append(f"      off_{o} += q * b{o}{i};")
        lines.append("    }")
    return params, "\n".join(lines)


def _kernel_parts(
    hypers: tuple[str, ...], tensor_hypers: dict[str, str], operands: list[str], batch_dims: int
) -> tuple[list[Param], list[Param], dict[str, str]]:
    """What every kernel takes from its hyperparameters and batch dimensions: the hyperparameter
    and batch-stride parameters, and the template arguments (formals, actuals, hyperparameter
    loads, batch offsets).  ``operands`` name the pointers that move per batch entry."""
    operands = list(operands)
    hyper_params, hyper_loads, formals, actuals = _hyper_parts(hypers, tensor_hypers, operands)
    batch_params, batch_code = _batch_parts(operands, batch_dims)
    args = {
        "HYPER_FORMALS": formals,
        "HYPER_ACTUALS": actuals,
        "HYPER_LOADS": hyper_loads,
        "BATCH_OFFSETS": batch_code,
    }
    return hyper_params, batch_params, args


def _pairwise_params(
    tin: str, extra: list[Param], uses_diag: bool, batch_params: list[Param], hyper_params: list[Param]
) -> list[Param]:
    """Parameters of a pairwise kernel in order: operands, sizes and strides, ``extra``, the
    diagonal shift if the epilogue reads ``diag``, batch strides, hyperparameters."""
    sizes = [Param(n, "int") for n in ("M", "N", "D", "tiles_n")]
    strides = [Param(n, "long long") for n in ("zbase", "sxm", "sxk", "szn", "szk", "som", "son")]
    params = [
        Param("x", f"const {tin}*"),
        Param("z", f"const {tin}*"),
        Param("out", f"{tin}*"),
        *sizes,
        *strides,
        *extra,
    ]
    if uses_diag:
        params.append(Param("diag_shift", "long long"))
    return params + batch_params + hyper_params


def _render_options(v: PairwiseVariant | GradVariant) -> dict:
    """render_expr's compute type and half-power arguments for variant ``v``."""
    return {"compute": INPUT_TYPES[v.dtype][1], "half_powers": v.half_powers, "known": dict(v.known_hypers)}


def _pairwise_names(prog) -> dict[str, str]:
    """C names of the pairwise IR variables and hyperparameters."""
    return {"x": "x", "z": "z", "acc": "acc", "diag": "diag"} | {h: f"h_{h}" for h in prog.hypers}


def _pairwise_parts(
    v: PairwiseVariant, tin: str, extra: list[Param], names: dict[str, str]
) -> tuple[list[Param], dict[str, str]]:
    """Parameters of a pairwise kernel and the template arguments the SIMT and tensor-core
    templates share (epilogue, hyperparameters, batch offsets, operand load modes, diagonal)."""
    prog = v.program
    hyper_params, batch_params, common = _kernel_parts(
        prog.hypers, dict(v.tensor_hypers), ["x", "z", "o"], v.batch_dims
    )
    params = _pairwise_params(tin, extra, prog.uses_diag, batch_params, hyper_params)
    shared = common | {
        "EPILOGUE": render_expr(prog.epilogue, names, ge1=v.ge1_hypers, **_render_options(v)),
        "PARAMS": ", ".join(p.decl for p in params),
        "XMODE": v.x.mode,
        "XE": v.x.e,
        "ZMODE": v.z.mode,
        "ZE": v.z.e,
        "DIAG": "((long long)m + diag_shift == (long long)n ? km_t(1) : km_t(0))" if prog.uses_diag else "km_t(0)",
    }
    return params, shared


def arch_capability(arch: str) -> int:
    """Compute capability named by an NVRTC target as one number (``sm_90`` and ``sm_90a`` → 90)."""
    return int(arch.removeprefix("sm_").rstrip("a"))


def target_arch(variant: PairwiseVariant | GradVariant, capability: int) -> str:
    """NVRTC target of ``variant`` on a device of ``capability`` (90 → ``sm_90``; ``sm_90a`` for wgmma)."""
    return "sm_90a" if getattr(variant, "wgmma", False) else f"sm_{capability}"


def dynamic_smem(variant: PairwiseVariant | GradVariant) -> int:
    """Bytes of dynamic shared memory a block of ``variant``'s kernel takes (0: static only)."""
    if isinstance(variant, GradVariant) and variant.wgmma:
        from kermac_backend_nvrtc import sign_grad  # imports this module

        return sign_grad.dynamic_smem(variant.ot)
    if isinstance(variant, GradVariant) and variant.tensor_cores:
        from kermac_backend_nvrtc import tc_grad  # imports this module

        return tc_grad.dynamic_smem(variant.ot)
    if getattr(variant, "wgmma", False):
        from kermac_backend_nvrtc.wgmma_pairwise import DYNAMIC_SMEM  # imports this module

        return DYNAMIC_SMEM
    return 0


def pairwise_source(v: PairwiseVariant) -> tuple[str, list[Param]]:
    """CUDA source of ``kermac_pairwise`` for variant ``v`` and its parameters in order."""
    if v.tensor_cores and v.wgmma:
        from kermac_backend_nvrtc.wgmma_pairwise import wgmma_pairwise_source  # imports this module

        return wgmma_pairwise_source(v)
    if v.tensor_cores:
        from kermac_backend_nvrtc.tc_pairwise import tc_pairwise_source  # imports this module

        return tc_pairwise_source(v)
    prog = v.program
    tin, compute = INPUT_TYPES[v.dtype]
    cfg = KCONTIG_CONFIG if v.k_contiguous else pairwise_config(compute, v.long_k)
    names = _pairwise_names(prog)
    table = [Param(f"pc{j}", "km_t") for j in range(v.pow_degree + 1)] if v.pow_degree else []
    params, shared = _pairwise_parts(v, tin, [Param("ovec", "int"), *table], names)
    reduce = {"sum": "acc + v", "max": "km_max(acc, v)", "min": "km_min(acc, v)"}[prog.reduction]
    split = v.poly_pairs > 0
    exponent = split_exponent(prog, v.ge1_hypers)
    if split and (compute != "float" or exponent is None):
        raise ValueError(f"split variant: needs a float sum of |x - z|^b with b >= 1; got {compute} {prog.key()}")
    if v.pow_degree and not (split and v.ftz):
        raise ValueError("pow_degree variant: needs a split variant (poly_pairs > 0) that flushes subnormals (ftz)")
    if v.one_path and (split or not zero_padding_is_neutral(prog)):
        raise ValueError(
            "one_path variant: needs a variant that is not split (poly_pairs = 0) and an inner term whose value "
            f"at x = z = 0 is the reduction's identity; got poly_pairs={v.poly_pairs}, {prog.key()}"
        )
    if v.k_contiguous and (v.dtype != "float32" or split or v.one_path or not zero_padding_is_neutral(prog)):
        raise ValueError(
            "k_contiguous variant: needs a float32 variant that is neither split nor one_path and an inner term "
            f"whose value at x = z = 0 is the reduction's identity; got {v.dtype}, poly_pairs={v.poly_pairs}, "
            f"one_path={v.one_path}, {prog.key()}"
        )
    loads_at = LONG_K_LOADS_AT if v.long_k else 0
    if v.one_path and not 0 <= loads_at < cfg.bk:
        raise ValueError(f"LONG_K_LOADS_AT: expected 0 <= steps < {cfg.bk} (the k tile's depth), got {loads_at}")
    source = kernels.PAIRWISE.substitute(
        BM=cfg.bm,
        BN=cfg.bn,
        BK=cfg.bk,
        VM=cfg.vm,
        VN=cfg.vn,
        TN=cfg.tn,
        GM=cfg.gm,
        GN=cfg.gn,
        SPAD=cfg.spad,
        MIN_BLOCKS=cfg.min_blocks,
        POLY_PAIRS=v.poly_pairs,
        POW_TABLE=int(v.pow_degree > 0),
        POW_DEGREE=v.pow_degree,
        POW_COEFFS=", ".join(p.name for p in table),
        ONE_PATH=int(v.one_path),
        KCONTIG=int(v.k_contiguous),
        LOADS_AT=loads_at,
        KUNROLL=v.k_unroll,
        INNER=render_expr(prog.inner, names, ge1=v.ge1_hypers, ftz=v.ftz, **_render_options(v)),
        POLY_EXP=render_expr(exponent, names, compute=compute) if split else "",
        REDUCE=reduce,
        IDENTITY=_const(prog.identity, compute),
        TIN=tin,
        TOUT=tin,
        **shared,
    )
    return _prelude(compute, split, v.ftz) + source, params


@dataclass(frozen=True)
class GradParts:
    """What the SIMT and tensor-core gradient sources share: the parameters in order, and the
    template arguments (multiply, epilogue, hyperparameters, batch offsets, operand load modes)."""

    params: list[Param]
    args: dict[str, object]


def grad_parts(v: GradVariant, tin: str, tiles: str) -> GradParts:
    """Parameters (in order) and shared template arguments of a gradient kernel for variant ``v``.

    Parameters: operands a, b, c, d, out; sizes M, N, O, K; ``tiles`` (the tile count along the
    grid's fastest dimension: ``tiles_m`` or ``tiles_n``); ``ochunks``; ``zbase``; the strides; batch
    strides; hyperparameters.
    """
    prog = v.program
    operands = ["a", "b", "c", "d", "o"]
    hyper_params, batch_params, common = _kernel_parts(prog.hypers, dict(v.tensor_hypers), operands, v.batch_dims)
    names = {"d": "d", "b": "b", "acc": "acc"} | {h: f"h_{h}" for h in prog.hypers}
    params = [Param(n, f"const {tin}*") for n in ("a", "b", "c", "d")]
    params += [Param("out", f"{tin}*"), *(Param(n, "int") for n in ("M", "N", "O", "K", tiles, "ochunks"))]
    strides = ("zbase", "sak", "sam", "sbn", "sbk", "sco", "sck", "sdn", "sdm", "soo", "son", "som")
    params += [Param(n, "long long") for n in strides]
    params += batch_params + hyper_params
    options = {"ge1": v.ge1_hypers, "gt1": v.gt1_hypers, "ftz": v.ftz, **_render_options(v)}
    args = common | {
        "MULTIPLY": render_expr(prog.multiply, names, **options),
        "EPILOGUE": render_expr(prog.epilogue, names, **options),
        "PARAMS": ", ".join(p.decl for p in params),
        "AMODE": v.a.mode,
        "AE": v.a.e,
        "BMODE": v.b.mode,
        "BE": v.b.e,
        "CMODE": v.c.mode,
        "CE": v.c.e,
    }
    return GradParts(params, args)


def grad_source(v: GradVariant) -> tuple[str, list[Param]]:
    """CUDA source of ``kermac_grad`` for variant ``v`` and its parameters in order."""
    if v.wgmma:
        from kermac_backend_nvrtc.sign_grad import sign_grad_source  # imports this module

        return sign_grad_source(v)
    if v.tensor_cores:
        from kermac_backend_nvrtc.tc_grad import tc_grad_source  # imports this module

        return tc_grad_source(v)
    tin, compute = INPUT_TYPES[v.dtype]
    cfg = grad_config(compute)
    parts = grad_parts(v, tin, "tiles_m")
    source = kernels.GRAD.substitute(
        KUNROLL=v.k_unroll,
        BMM=cfg.bmm,
        BNN=cfg.bnn,
        BK=cfg.bk,
        TPM=cfg.tpm,
        TPN=cfg.tpn,
        OT=v.ot,
        SPAD=cfg.spad,
        MIN_BLOCKS=cfg.min_blocks,
        TIN=tin,
        TOUT=tin,
        **parts.args,
    )
    return _prelude(compute, False) + source, parts.params
