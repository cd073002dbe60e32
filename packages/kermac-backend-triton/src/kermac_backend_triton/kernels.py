"""Triton source of the two kernels, generated per program and layout specialisation.

**Pairwise** ``out[b,m,n] = epilogue(REDUCE_k inner(x[b,m,k], z[b,n,k]), diag)`` in ``tl``: the
kernel of the CPU interpreter, of float64 and of ``KERMAC_TRITON_GLUON=0`` (float32 programs on a
GPU run :mod:`kermac_backend_triton.gluon_pairwise`, which stages operands explicitly).  One program
computes a ``BM × BN`` output tile, ``BM = MI·MT`` and ``BN = NI·NT``, held as a 4-d accumulator
``[MI, NI, MT, NT]``.  Triton's default layouts give threads to the fastest dimensions, so the
``MT × NT`` dimensions are spread over threads and each thread keeps an ``MI × NI`` micro-tile in
registers: the SIMT register blocking of a GEMM.  Each step of the ``k`` loop loads ``x`` and
``z`` tiles ``[BK, MI, MT]`` and ``[BK, NI, NT]``, evaluates ``inner`` on their broadcast
``[BK, MI, NI, MT, NT]`` and reduces axis 0 — inside each thread, so the reduction costs no
shuffles.  Full ``BK`` chunks run unmasked, their loads issued ``PF`` steps ahead (software
pipelining by hand); one masked step handles ``D mod BK`` (masked terms are replaced by the
reduction's identity).  Row indices are clamped (``m mod M``) so loads need no masks; the store
is masked and streaming.  Programs are ordered in groups of ``GROUP_M`` row tiles for L2 reuse.

**Pairwise on tensor cores** (float32 ``Σ_k (x − z)²`` programs, any epilogue:
:func:`kermac.programs.is_squared_difference_sum`).  One program computes a ``BM × BN`` tile of
d² = ‖x‖² + ‖z‖² − 2·x·zᵀ.  A first k loop sums the norms ‖x‖², ‖z‖² in float32 (kept out of the
main loop: there they would hold a second register copy of each tile and cost occupancy); the
main loop forms ``x·zᵀ`` in 3×TF32: each operand is split as hi = tf32(a), lo = tf32(a − hi)
(round to nearest, :data:`_TF32_HELPER`) and three chained ``tl.dot(..., input_precision="tf32")``
add hi·lo + lo·hi + hi·hi (float32 accuracy; the same products as Triton's ``tf32x3``, without
its serialising NaN fix-ups between the products).  N and D are specialised on divisibility by
16 so the k mask and the store mask keep 16-byte vectors.  Cancellation guard: an entry is
*flagged* where d² ≤ ``GUARD``·(‖x‖² + ‖z‖²) or d² is not finite (``GUARD`` from
:func:`guard_threshold`); if any entry of the tile is flagged, the program recomputes the whole
tile from differences with a register-lean SIMT tile (:data:`_RECOMPUTE_TILE`) and stores that
instead, so near-duplicate rows (and x = z) are as exact as the SIMT kernel; otherwise it
applies the epilogue to d² and stores it streaming (``.cs``: the output is not re-read).

**Gradient** ``out[b,o,n,m] = epilogue(Σ_k c[b,o,k]·a[b,k,m]·multiply(d[b,n,m], b[b,n,k]))``.
One program owns a ``BN × BM`` tile of ``(n, m)`` pairs and ``BO`` rows of ``o``.  Per ``BK``
chunk it forms ``w[n,m,k] = a[k,m]·multiply(d[n,m], b[n,k])`` elementwise and contracts it with
``c`` on the tensor cores: ``acc[(n,m), o] += w[(n,m), k] @ cᵀ[k, o]`` — in float32 as 3×TF32
by hand (:func:`_grad_contract`: the pairwise kernel's :data:`_TF32_HELPER` split, three plain
``tf32`` products into a fresh accumulator per k step, added to ``acc`` in float32), ``ieee`` in
float64.  ``w`` stays in registers as the A operand of the products, provided Triton can form it
in that register layout: every leaf of the chain that computes ``w`` must be a load or a
constant (a splatted scalar, such as a hyperparameter, sends ``w`` through shared memory).
A multiply that is a signed power sgn(t)·|t|^e (:func:`kermac.programs.signed_power`, the
fractional-p gradient) with a scalar ``e`` gets a second k loop, taken when 0 < e < ∞: one
copysigned power per term (``_ksignpow_pos``, no selects) with ``e`` entering as a tile derived
from the loaded ``d`` (exactly ``e``); other ``e``, and the masked tail, use the general form.

Batch entries are decoded from the program id over the coalesced batch dimensions of
:func:`kermac.layout.batch_layout`; tensor hyperparameters are read once per program from their
per-batch offset.  With ``int64`` every index is 64-bit (for operands past 2³¹ elements).
M is never specialised on; N is, on divisibility by 16 (16-byte output stores), and so is D in
the tensor-core kernel (its k mask) — at most two compilations per configuration.  Strides are
specialised, so unit strides and 16-divisible row strides give vectorised loads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kermac.ir import free_vars
from kermac.programs import REDUCTIONS, GradProgram, PairwiseProgram, is_squared_difference_sum, signed_power
from kermac_backend_triton.codegen import COMPUTE_TYPES, helpers, render_expr
from kermac_backend_triton.kernel_parts import (
    IDENTITY,
    STREAM,
    batch_code,
    batch_params,
    hyper_loads,
    hyper_params,
    indent,
    operand_pointers,
    simt_epilogue,
    tile_order,
)

__all__ = [
    "GRAD_ENTRY",
    "PAIRWISE_ENTRY",
    "GradSpec",
    "PairwiseSpec",
    "grad_source",
    "guard_threshold",
    "pairwise_source",
    "tensor_core_eligible",
]

PAIRWISE_ENTRY = "kermac_pairwise"
GRAD_ENTRY = "kermac_grad"

_COMBINE = {
    "sum": "{acc} + tl.sum({t}, 0)",
    "max": "_kmax({acc}, tl.reduce({t}, 0, _kmax))",
    "min": "_kmin({acc}, tl.reduce({t}, 0, _kmin))",
}


@dataclass(frozen=True)
class PairwiseSpec:
    """Everything the generated pairwise source depends on."""

    program: PairwiseProgram
    compute: str  # "float32" or "float64"
    nbatch: int  # coalesced batch dimensions
    tensor_hypers: frozenset[str]  # hyperparameters passed as per-batch tensors
    int64: bool
    interpret: bool  # generated for Triton's CPU interpreter (portable helpers)
    tensor_cores: bool = False  # the tf32x3 expansion with the guard (tensor_core_eligible programs)
    gluon: bool = False  # the Gluon SIMT kernel (kermac_backend_triton.gluon_pairwise)


@dataclass(frozen=True)
class GradSpec:
    """Everything the generated gradient source depends on."""

    program: GradProgram
    compute: str
    nbatch: int
    tensor_hypers: frozenset[str]
    int64: bool
    interpret: bool


def tensor_core_eligible(program: PairwiseProgram, compute: str) -> bool:
    """Whether the tensor-core kernel computes ``program``: a float32 sum of (x − z)²."""
    return compute == "float32" and is_squared_difference_sum(program)


def guard_threshold(d: int) -> float:
    """Cancellation threshold of the tensor-core kernel for reduction length ``d``.

    d² = ‖x‖² + ‖z‖² − 2·x·z carries an absolute error of about ε·S, S = ‖x‖² + ‖z‖²: the fp32
    sums of the three terms (≈ √D·2⁻²⁴·S) plus the 3×TF32 split (≤ 3·2⁻²³·S), the derivation of
    the NVRTC backend's guard (``docs/nvrtc-notes.md``, Version 2).  Entries with d² ≤ 2¹⁶·ε·S
    (relative error of d² possibly above 2⁻¹⁶) are recomputed from differences; capped at 1/2.
    """
    return min(0.5, (math.sqrt(max(d, 1)) * 2.0**-24 + 3 * 2.0**-23) * 2.0**16)


#: Values of the SIMT kernel's ``PF`` meta-parameter: how many k chunks ahead it loads.
PREFETCH_DEPTHS = (0, 1, 2)
#: Indexing that places an x tile ``[BK, MI, MT]`` / a z tile ``[BK, NI, NT]`` in ``[BK, MI, NI, MT, NT]``.
_X5, _Z5 = "[:, :, None, :, None]", "[:, None, :, None, :]"


def _prefetched_loop(p: str, depth: int, bk: str, cdt: str, inner: str, full: str, combine: str) -> list[str]:
    """The unmasked k loop over full ``BK`` chunks, loading the chunk ``depth`` steps ahead (0: none).

    Software pipelining by hand: Triton's pipeliner leaves loads that feed no ``tl.dot`` where
    they are, so their latency would show at every step.  Prologue loads are masked; in-loop
    addresses are clamped to the last full chunk and kept a multiple of ``BK`` (vector loads).
    """
    step = [f"    {p}t = tl.broadcast_to({inner}, {full})", f"    {p}acc = {combine}"]
    if depth == 0:
        return [
            f"for k0 in range(0, {p}d_full, {bk}):",
            f"    {p}xv = tl.load({p}xrow + (k0 + {p}kr) * SXK).to({cdt}){_X5}",
            f"    {p}zv = tl.load({p}zrow + (k0 + {p}kr) * SZK).to({cdt}){_Z5}",
            *step,
        ]
    lines = []
    for i in range(depth):
        kk = f"({i} * {bk} + {p}kr)" if i else f"{p}kr"
        km = f"{kk} < {p}d_full"
        lines += [
            f"{p}xa{i} = tl.load({p}xrow + {kk} * SXK, mask={km}, other=0.0)",
            f"{p}za{i} = tl.load({p}zrow + {kk} * SZK, mask={km}, other=0.0)",
        ]
    last = depth - 1
    return lines + [
        f"for k0 in range(0, {p}d_full, {bk}):",
        f"    {p}xv = {p}xa0.to({cdt}){_X5}",
        f"    {p}zv = {p}za0.to({cdt}){_Z5}",
        *(f"    {p}xa{i}, {p}za{i} = {p}xa{i + 1}, {p}za{i + 1}" for i in range(last)),
        f"    {p}kb = (tl.minimum(k0 + {depth} * {bk}, {p}d_full - {bk}) // {bk}) * {bk}",
        f"    {p}xa{last} = tl.load({p}xrow + ({p}kb + {p}kr) * SXK)",
        f"    {p}za{last} = tl.load({p}zrow + ({p}kb + {p}kr) * SZK)",
        *step,
    ]


def _simt_tile(
    spec: PairwiseSpec, t: dict[str, str], p: str = "", *, split_tail: bool = True, streaming: bool = False
) -> list[str]:
    """The SIMT register-blocked tile: reduction, epilogue and store of one ``BM × BN`` tile.

    ``t`` names the tile's constexprs (keys ``BK MI NI MT NT``, and ``PF`` — the prefetch depth,
    :data:`PREFETCH_DEPTHS` — where ``split_tail``; see the module docs); every
    variable is prefixed with ``p`` (the tensor-core kernel embeds this tile in a branch, where
    names must not collide with its own).  ``split_tail``: unmasked full ``BK`` steps and one
    masked step for ``D mod BK`` (no per-term select in the hot loop); otherwise one masked loop
    (half the code, for the tensor-core kernel's rarely taken recompute).  ``streaming`` stores
    with ``.cs`` (evict first: the output is not re-read).
    """
    prog = spec.program
    cdt = COMPUTE_TYPES[spec.compute]
    cast = ".to(tl.int64)" if spec.int64 else ""
    bk, mi, ni, mt, nt = (t[k] for k in ("BK", "MI", "NI", "MT", "NT"))
    inner = render_expr(prog.inner, {"x": f"{p}xv", "z": f"{p}zv"}, spec.compute, fast=True)
    epilogue = simt_epilogue(prog, spec.compute, f"{p}acc", f"{p}diag")
    identity = IDENTITY[prog.reduction]
    combine = _COMBINE[prog.reduction].format(acc=f"{p}acc", t=f"{p}t")
    full = f"[{bk}, {mi}, {ni}, {mt}, {nt}]"
    lines = [
        f"{p}om = pm * BM + tl.arange(0, {mi})[:, None] * {mt} + tl.arange(0, {mt})[None, :]",
        f"{p}on = pn * BN + tl.arange(0, {ni})[:, None] * {nt} + tl.arange(0, {nt})[None, :]",
        f"{p}xrow = X + (({p}om % M) * SXM)[None, :, :]",
        f"{p}zrow = Z + (({p}on % N) * SZN)[None, :, :]",
        f"{p}kr = tl.arange(0, {bk})[:, None, None]{cast}",
        f"{p}acc = tl.full([{mi}, {ni}, {mt}, {nt}], {identity}, {cdt})",
    ]
    masked = [
        f"    {p}km = {p}kk < D",
        f"    {p}xv = tl.load({p}xrow + {p}kk * SXK, mask={p}km, other=0.0).to({cdt}){_X5}",
        f"    {p}zv = tl.load({p}zrow + {p}kk * SZK, mask={p}km, other=0.0).to({cdt}){_Z5}",
        f"    {p}t = tl.where({p}km[:, :, :, None, None], tl.broadcast_to({inner}, {full}), {identity})",
        f"    {p}acc = {combine}",
    ]
    if split_tail:
        lines.append(f"{p}d_full = D - D % {bk}")
        for depth in PREFETCH_DEPTHS:
            test = "if" if depth == PREFETCH_DEPTHS[0] else "elif"
            lines.append(f"{test} {t['PF']} == {depth}:")
            loop = _prefetched_loop(p, depth, bk, cdt, inner, full, combine)
            lines += [f"    {line}" for line in loop]
        lines += [
            "else:",
            f"    tl.static_assert(False, 'PF: prefetch depth must be one of {PREFETCH_DEPTHS}')",
            f"if {p}d_full < D:",
            f"    {p}kk = {p}d_full + {p}kr",
            *masked,
        ]
    else:
        lines += [f"for k0 in range(0, D, {bk}):", f"    {p}kk = k0 + {p}kr", *masked]
    lines += [f"{p}om4 = {p}om[:, None, :, None]", f"{p}on4 = {p}on[None, :, None, :]"]
    if prog.uses_diag:
        lines.append(f"{p}diag = tl.where({p}om4 + OFF_M == {p}on4 + OFF_N, 1.0, 0.0)")
    lines += [
        f"{p}val = tl.broadcast_to({epilogue}, [{mi}, {ni}, {mt}, {nt}])",
        f"tl.store(OUT + {p}om4 * SOM + {p}on4 * SON, {p}val.to(OUT.dtype.element_ty), "
        f"mask=({p}om4 < M) & ({p}on4 < N){STREAM if streaming else ''})",
    ]
    return lines


def pairwise_source(spec: PairwiseSpec) -> str:
    """Complete Python module source (helpers + ``kermac_pairwise``) for ``spec``."""
    if spec.tensor_cores:
        return _pairwise_tc_source(spec)
    prog = spec.program
    cdt = COMPUTE_TYPES[spec.compute]
    operands = operand_pointers({"x": "X", "z": "Z", "out": "OUT"}, spec.tensor_hypers)
    cast = ".to(tl.int64)" if spec.int64 else ""
    assert float(REDUCTIONS[prog.reduction]) in (0.0, float("inf"), float("-inf"))
    # N is specialised (divisibility by 16): the store mask then keeps 16-byte vectors.
    head = f"""\
@triton.jit(do_not_specialize=["M", "D", "OFF_M", "OFF_N", "KEY"])
def {PAIRWISE_ENTRY}(
    X, Z, OUT, {hyper_params(prog.hypers, spec.tensor_hypers, cdt)}M, N, D, OFF_M, OFF_N,
    SXM, SXK, SZN, SZK, SOM, SON, {batch_params(tuple(operands), spec.nbatch)}KEY,
    BK: tl.constexpr, MI: tl.constexpr, NI: tl.constexpr, MT: tl.constexpr, NT: tl.constexpr,
    PF: tl.constexpr, GROUP_M: tl.constexpr,
):
    # program {prog.key()}
    BM: tl.constexpr = MI * MT
    BN: tl.constexpr = NI * NT
{tile_order(cast)}"""
    body = batch_code(operands, spec.nbatch) + hyper_loads(prog.hypers, spec.tensor_hypers, cdt)
    tile = {k: k for k in ("BK", "MI", "NI", "MT", "NT", "PF")}
    tile_lines = _simt_tile(spec, tile, streaming=True)
    return helpers(spec.compute, spec.interpret) + "\n\n" + head + indent(body + tile_lines)


#: Round-to-nearest (ties away) float32 → TF32 (low 13 bits cleared) by integer operations: the
#: ``cvt.rna.tf32.f32`` of the 3×TF32 split, also valid under the interpreter.  ±inf stays ±inf,
#: NaN stays NaN, finite values above TF32's range round to ±inf (the guard then recomputes them).
_TF32_HELPER = """

@triton.jit
def _ktf32(a):
    b = a.to(tl.uint32, bitcast=True)
    return ((b + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)
"""

#: The gradient's split of ``w`` into hi = :func:`_ktf32` and lo = w − hi (unrounded), per
#: platform.  On a GPU one inline-asm block: PTX sees a float subtraction, so ptxas folds the
#: negation into it (Triton's own IR would turn −hi into an integer xor, one more instruction
#: per term).
_SPLIT_HELPER = {
    "gpu": """

@triton.jit
def _ksplit(a):
    return tl.inline_asm_elementwise(
        "{ .reg .b32 t; add.u32 t, $2, 0x1000; and.b32 $0, t, 0xFFFFE000; sub.f32 $1, $2, $0; }",
        "=r,=r,r",
        [a],
        dtype=(tl.float32, tl.float32),
        is_pure=True,
        pack=1,
    )
""",
    "portable": """

@triton.jit
def _ksplit(a):
    hi = _ktf32(a)
    return hi, a - hi
""",
}

#: The recompute tile of the tensor-core kernel: ``RMT × RNT`` = 128 threads of ``RMI × RNI``
#: outputs, ``RK`` features per step (register-lean: the branch must not raise the kernel's
#: register count, which sets how many programs share a multiprocessor).
_RECOMPUTE_TILE = {"BK": "RK", "MI": "RMI", "NI": "RNI", "MT": "RMT", "NT": "RNT"}


def _pairwise_tc_source(spec: PairwiseSpec) -> str:
    """``kermac_pairwise`` on tensor cores (see the module docs) for an eligible ``spec``."""
    prog = spec.program
    if not tensor_core_eligible(prog, spec.compute):
        raise ValueError(f"tensor_cores: needs a float32 sum of (x - z)^2; got {spec.compute} {prog.key()}")
    cdt = COMPUTE_TYPES[spec.compute]
    epilogue = render_expr(prog.epilogue, {"acc": "d2", "diag": "diag"}, spec.compute, frozenset({"acc"}))
    operands = operand_pointers({"x": "X", "z": "Z", "out": "OUT"}, spec.tensor_hypers)
    cast = ".to(tl.int64)" if spec.int64 else ""
    # N and D are specialised (divisibility by 16): the k mask and the store mask then keep
    # 16-byte vectors (at most two compilations per configuration instead of one).
    head = f"""\
@triton.jit(do_not_specialize=["M", "OFF_M", "OFF_N", "GUARD", "KEY"])
def {PAIRWISE_ENTRY}(
    X, Z, OUT, {hyper_params(prog.hypers, spec.tensor_hypers, cdt)}M, N, D, OFF_M, OFF_N,
    SXM, SXK, SZN, SZK, SOM, SON, {batch_params(tuple(operands), spec.nbatch)}GUARD, KEY,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
):
    # program {prog.key()} (tensor cores)
    RK: tl.constexpr = 2
    RMT: tl.constexpr = 8
    RNT: tl.constexpr = 16
    RMI: tl.constexpr = BM // RMT
    RNI: tl.constexpr = BN // RNT
{tile_order(cast)}"""
    body = batch_code(operands, spec.nbatch) + hyper_loads(prog.hypers, spec.tensor_hypers, cdt)
    load = [
        "    kk = k0 + kr",
        "    xv = tl.load(xrow + kk * SXK, mask=kk < D, other=0.0).to(tl.float32)",
        "    zv = tl.load(zrow + kk * SZK, mask=kk < D, other=0.0).to(tl.float32)",
    ]
    main = [
        f"om = pm * BM + tl.arange(0, BM){cast}",
        f"on = pn * BN + tl.arange(0, BN){cast}",
        "xrow = X + ((om % M) * SXM)[:, None]",
        "zrow = Z + ((on % N) * SZN)[:, None]",
        f"kr = tl.arange(0, BK)[None, :]{cast}",
        # The norms first, in their own loop: summed in the main loop they would hold a second
        # register copy of each tile (the dot needs another layout) and cost occupancy.
        "xsq = tl.zeros([BM, BK], tl.float32)",
        "zsq = tl.zeros([BN, BK], tl.float32)",
        "for k0 in range(0, D, BK):",
        *load,
        "    xsq += xv * xv",
        "    zsq += zv * zv",
        "xn = tl.sum(xsq, 1)",
        "zn = tl.sum(zsq, 1)",
        # x·zᵀ in 3×TF32: hi·lo + lo·hi + hi·hi, the low products first.
        "dot = tl.zeros([BM, BN], tl.float32)",
        "for k0 in range(0, D, BK):",
        *load,
        "    xh = _ktf32(xv)",
        "    xl = _ktf32(xv - xh)",
        "    zt = tl.trans(zv)",
        "    zh = _ktf32(zt)",
        "    zl = _ktf32(zt - zh)",
        '    dot = tl.dot(xh, zl, dot, input_precision="tf32", out_dtype=tl.float32)',
        '    dot = tl.dot(xl, zh, dot, input_precision="tf32", out_dtype=tl.float32)',
        '    dot = tl.dot(xh, zh, dot, input_precision="tf32", out_dtype=tl.float32)',
        "s = xn[:, None] + zn[None, :]",
        "d2 = s - 2.0 * dot",
        "flag = ~((d2 > GUARD * s) & (d2 < _INF))",
        "if tl.max(tl.max(flag.to(tl.int32), 1), 0) > 0:",
        *(f"    {line}" for line in _simt_tile(spec, _RECOMPUTE_TILE, "r", split_tail=False, streaming=True)),
        "else:",
        "    om2 = om[:, None]",
        "    on2 = on[None, :]",
    ]
    if prog.uses_diag:
        main.append("    diag = tl.where(om2 + OFF_M == on2 + OFF_N, 1.0, 0.0)")
    main += [
        f"    val = tl.broadcast_to({epilogue}, [BM, BN])",
        f"    tl.store(OUT + om2 * SOM + on2 * SON, val.to(OUT.dtype.element_ty), mask=(om2 < M) & (on2 < N){STREAM})",
    ]
    return helpers(spec.compute, spec.interpret) + _TF32_HELPER + "\n\n" + head + indent(body + main)


def _grad_contract(compute: str) -> list[str]:
    """Lines adding one k step's ``w[(n,m), k] @ cv[k, o]`` to ``acc``.

    float64: one ``ieee`` dot.  float32: 3×TF32 by hand (as in the tensor-core pairwise kernel):
    hi = :func:`_ktf32` rounding, lo = the remainder (``_ksplit``; ``w``'s lo goes in unrounded:
    the tensor cores truncate it, an error ≤ 2⁻²¹·|w| that saves two instructions per term), the products
    wl·ch + wh·cl + wh·ch summed into a fresh accumulator ``part`` that is added to ``acc`` in
    float32 — the tensor cores truncate their own sums, which over all of K would grow the error
    linearly with K.
    """
    if compute == "float64":
        return ['acc = tl.dot(w, cv, acc, input_precision="ieee", out_dtype=tl.float64)']
    dot = 'tl.dot({}, {}{}, input_precision="tf32", out_dtype=tl.float32)'
    return [
        "wh, wl = _ksplit(w)",
        "ch = _ktf32(cv)",
        "cl = _ktf32(cv - ch)",
        "part = " + dot.format("wl", "ch", ""),
        "part = " + dot.format("wh", "cl", ", part"),
        "part = " + dot.format("wh", "ch", ", part"),
        "acc += part",
    ]


def grad_source(spec: GradSpec) -> str:
    """Complete Python module source (helpers + ``kermac_grad``) for ``spec``."""
    prog = spec.program
    cdt = COMPUTE_TYPES[spec.compute]
    hypers = prog.hypers
    multiply = render_expr(prog.multiply, {"d": "dv", "b": "bv"}, spec.compute, fast=True)
    epilogue = render_expr(prog.epilogue, {"acc": "acc"}, spec.compute)
    operands = operand_pointers({"a": "A", "b": "B", "c": "C", "d": "DD", "out": "OUT"}, spec.tensor_hypers)
    cast = ".to(tl.int64)" if spec.int64 else ""
    head = f"""\
@triton.jit(do_not_specialize=["M", "N", "O", "K", "KEY"])
def {GRAD_ENTRY}(
    A, B, C, DD, OUT, {hyper_params(hypers, spec.tensor_hypers, cdt)}M, N, O, K,
    SAK, SAM, SBN, SBK, SCO, SCK, SDN, SDM, SOO, SON, SOM, {batch_params(tuple(operands), spec.nbatch)}KEY,
    BN: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, BO: tl.constexpr,
):
    # program {prog.key()}
    pid = tl.program_id(0){cast}
    tiles_o = tl.cdiv(O, BO)
    tiles_n = tl.cdiv(N, BN)
    tiles = tiles_o * tiles_n * tl.cdiv(M, BM)
    bat = pid // tiles
    tile = pid % tiles
    po = tile % tiles_o
    rest_t = tile // tiles_o
    pn = rest_t % tiles_n
    pm = rest_t // tiles_n
"""
    body = batch_code(operands, spec.nbatch) + hyper_loads(hypers, spec.tensor_hypers, cdt)
    body += [
        "rn = pn * BN + tl.arange(0, BN)",
        "rm = pm * BM + tl.arange(0, BM)",
        "ro = po * BO + tl.arange(0, BO)",
        "rnc = rn % N",
        "rmc = rm % M",
        f"dk = tl.load(DD + rnc[:, None] * SDN + rmc[None, :] * SDM).to({cdt})",
        "dv = dk[:, :, None]",
        "brow = B + rnc[:, None] * SBN",
        "acol = A + rmc[:, None] * SAM",
        "crow = C + (ro % O)[None, :] * SCO",
        f"kr = tl.arange(0, BK){cast}",
        f"acc = tl.zeros([BN * BM, BO], {cdt})",
        "k_full = K - K % BK",
    ]
    signed = signed_power(prog.multiply)
    if signed is not None and not free_vars(signed[1]):
        # sgn(t)·|t|^e with a scalar e: for 0 < e < ∞ a loop with one copysigned power per term.
        # Its exponent is a tile, e + 0·min(|d|, 1) (exactly e, also for infinite or NaN d): a
        # splatted scalar in the chain that forms w would make Triton pass w through shared
        # memory instead of forming it in the tensor cores' register layout (1.7× slower,
        # docs/triton-notes.md, Version 5).
        t = render_expr(signed[0], {"d": "dv", "b": "bv"}, spec.compute, fast=True)
        body += [
            f"sp_e = {render_expr(signed[1], {}, spec.compute)}",
            "if (sp_e < _INF) & (sp_e > 0):",
            "    sp_et = (sp_e + 0.0 * tl.minimum(tl.abs(dk), 1.0))[:, :, None]",
            *_grad_loop(spec, f"_ksignpow_pos({t}, sp_et)", 1),
            "else:",
            *_grad_loop(spec, multiply, 1),
        ]
    else:
        body += _grad_loop(spec, multiply, 0)
    tail = f"""\
    if k_full < K:
        kk = k_full + kr
        km = kk < K
        bv = tl.load(brow + kk[None, :] * SBK, mask=km[None, :], other=0.0).to({cdt})[:, None, :]
        av = tl.load(acol + kk[None, :] * SAK, mask=km[None, :], other=0.0).to({cdt})
        cv = tl.load(crow + kk[:, None] * SCK, mask=km[:, None], other=0.0).to({cdt})
        w = tl.where(km[None, None, :], av[None, :, :] * tl.broadcast_to({multiply}, [BN, BM, BK]), 0.0)
        w = tl.reshape(w, [BN * BM, BK])
{indent(_grad_contract(spec.compute), 2)}\
    val = tl.reshape(tl.broadcast_to({epilogue}, [BN * BM, BO]), [BN, BM, BO])
    optr = OUT + ro[None, None, :] * SOO + rn[:, None, None] * SON + rm[None, :, None] * SOM
    omask = (ro < O)[None, None, :] & (rn < N)[:, None, None] & (rm < M)[None, :, None]
    tl.store(optr, val.to(OUT.dtype.element_ty), mask=omask)
"""
    split = _TF32_HELPER + _SPLIT_HELPER["portable" if spec.interpret else "gpu"] if spec.compute == "float32" else ""
    return helpers(spec.compute, spec.interpret) + split + "\n\n" + head + indent(body) + tail


def _grad_loop(spec: GradSpec, multiply: str, depth: int) -> list[str]:
    """Lines of the gradient's unmasked k loop (full ``BK`` steps) with ``multiply`` per term,
    indented ``depth`` levels (inside a branch)."""
    cdt = COMPUTE_TYPES[spec.compute]
    step = [
        "kk = k0 + kr",
        f"bk = tl.load(brow + kk[None, :] * SBK).to({cdt})",
        "bv = bk[:, None, :]",
        f"av = tl.load(acol + kk[None, :] * SAK).to({cdt})",
        f"cv = tl.load(crow + kk[:, None] * SCK).to({cdt})",
        f"w = tl.reshape(av[None, :, :] * tl.broadcast_to({multiply}, [BN, BM, BK]), [BN * BM, BK])",
        *_grad_contract(spec.compute),
    ]
    pad = "    " * depth
    return [f"{pad}for k0 in range(0, k_full, BK):", *(f"{pad}    {line}" for line in step)]
