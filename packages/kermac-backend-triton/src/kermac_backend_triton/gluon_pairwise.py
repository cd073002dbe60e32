"""Gluon source of the SIMT pairwise kernel on a GPU: operands staged through shared memory.

``out[b,m,n] = epilogue(REDUCE_k inner(x[b,m,k], z[b,n,k]), diag)`` for the programs that do not
take the tensor-core kernel, written in Gluon, Triton's explicit-layout dialect.  The ``tl`` SIMT
kernel (:mod:`kermac_backend_triton.kernels`) must move every operand chunk through a
shared-memory layout conversion of the compiler's choosing (a store, a barrier and a load per
operand, four barriers per chunk); here the staging is explicit, as in the NVRTC kernel:

* float32 programs only (float16/bfloat16 inputs computed in float32); one program computes a
  ``BM × BN`` tile with ``W`` warps.  The accumulator layout ``ACC`` gives
  each thread blocks of 4 × 4 outputs (``TM × TN`` = 32 threads per warp, warps stacked along m,
  blocks repeated to cover the tile), so every operand fragment is one 16-byte shared load.
* Each ``BK`` chunk of x and z is loaded from global memory with 4 consecutive elements per
  thread along the operand's contiguous dimension (k for row-major operands, m or n where the
  operand is transposed: the ``XT``/``ZT`` constexprs) and stored k-major into one of two
  shared buffers ``[BK, BM]`` / ``[BK, BN]``.
* The k loop computes from one buffer while the next chunk's global loads are in flight, then
  stores that chunk into the other buffer: **one barrier per chunk**.  Per feature ``k`` a thread
  reads its x column fragment ``[BM, 1]`` and z row fragment ``[1, BN]`` (the buffers' row k, in
  ``ACC``) and combines ``inner`` of their broadcast into the accumulator.
* ``D mod BK`` features take one masked chunk after the loop (masked terms become the reduction's
  identity); the epilogue and the streaming, masked store read the accumulator in place.

``tl`` builtins and the ``@triton.jit`` helpers of :mod:`kermac_backend_triton.codegen` work
inside Gluon kernels, so ``inner`` and ``epilogue`` are rendered by the same code as for the
``tl`` kernels.  Gluon has no CPU interpreter: the interpreter tier runs the ``tl`` kernel, and
CI compiles this one to cubin (``tests/test_triton_codegen.py``).
"""

from __future__ import annotations

import functools

from kermac.ir import free_vars
from kermac.programs import REDUCTIONS
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
from kermac_backend_triton.kernels import PAIRWISE_ENTRY, PairwiseSpec

__all__ = ["gluon_available", "gluon_pairwise_source"]

#: How each reduction folds one term ``t`` into ``acc`` (elementwise: one k at a time).
_FOLD = {"sum": "{acc} + {t}", "max": "_kmax({acc}, {t})", "min": "_kmin({acc}, {t})"}

_GLUON_IMPORTS = """
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

# Triton 3.6 names the CTA barrier thread_barrier, later releases barrier.
_kbarrier = getattr(gl, "barrier", None) or gl.thread_barrier
"""


@functools.cache
def gluon_available() -> str | None:
    """``None`` if this Triton has the Gluon features the kernel uses, else what is missing."""
    try:
        from triton.experimental.gluon import language as gl
    except ImportError as exc:
        return f"triton.experimental.gluon cannot be imported ({exc})"
    needed = ("allocate_shared_memory", "BlockedLayout", "SliceLayout", "SwizzledSharedLayout", "num_warps")
    missing = [name for name in needed if not hasattr(gl, name)]
    if not (hasattr(gl, "barrier") or hasattr(gl, "thread_barrier")):
        missing.append("barrier")
    if missing:
        return f"triton.experimental.gluon.language lacks {', '.join(missing)}"
    return None


def _load_layout(name: str, block: str, transposed: str) -> list[str]:
    """The global-load layout of one operand chunk ``[block, BK]``: 4 contiguous elements per thread.

    Row-major operands (unit k stride) are read along k (``BK // 4`` threads per row);
    transposed ones (``transposed`` true: unit row stride) along the rows, warps across k.
    """
    rows = f"{name}_ROWS"
    return [
        f"if {transposed}:",
        f"    {rows}: gl.constexpr = 32 if {block} >= 128 else {block} // 4",
        f"    {name}: gl.constexpr = gl.BlockedLayout([4, 1], [{rows}, 32 // {rows}], [1, W], [0, 1])",
        "else:",
        f"    {name}: gl.constexpr = gl.BlockedLayout([1, 4], [32 // (BK // 4), BK // 4], [W, 1], [1, 0])",
    ]


def gluon_pairwise_source(spec: PairwiseSpec) -> str:
    """Complete Python module source (helpers + ``kermac_pairwise`` in Gluon) for a SIMT ``spec``.

    ``spec`` must compute in float32 (float64 programs keep the ``tl`` kernel: with the
    accurate ``pow`` inlined per output, the Gluon tile compiles for over a minute) and be
    neither for the interpreter nor a tensor-core one.  Meta-parameters (see
    :data:`kermac_backend_triton.configs.GLUON_PAIRWISE_SPACE`): ``BM``, ``BN``, ``BK`` (a
    multiple of 4), ``TM`` (threads of a warp along m, ``32 / TM`` along n: ``BM`` must be a
    multiple of 4·``TM``·warps, ``BN`` of 128 / ``TM``), ``GROUP_M``; the launcher sets ``XT`` /
    ``ZT`` (the operand's unit stride is along its rows).
    """
    if spec.interpret or spec.tensor_cores or spec.compute != "float32":
        raise ValueError(
            "spec: the Gluon kernel is the GPU SIMT kernel in float32 (interpret=False, "
            f"tensor_cores=False, compute='float32'); got interpret={spec.interpret}, "
            f"tensor_cores={spec.tensor_cores}, compute={spec.compute!r}"
        )
    prog = spec.program
    cdt = COMPUTE_TYPES[spec.compute]
    cast = ".to(tl.int64)" if spec.int64 else ""
    assert float(REDUCTIONS[prog.reduction]) in (0.0, float("inf"), float("-inf"))
    inner = render_expr(prog.inner, {"x": "xk", "z": "zk"}, spec.compute, fast=True, lang="gl")
    epilogue = simt_epilogue(prog, spec.compute, "acc", "diag", "gl")
    identity = IDENTITY[prog.reduction]
    fold = _FOLD[prog.reduction]
    operands = operand_pointers({"x": "X", "z": "Z", "out": "OUT"}, spec.tensor_hypers)
    head = f"""\
@gluon.jit(do_not_specialize=["M", "D", "OFF_M", "OFF_N", "KEY"])
def {PAIRWISE_ENTRY}(
    X, Z, OUT, {hyper_params(prog.hypers, spec.tensor_hypers, cdt)}M, N, D, OFF_M, OFF_N,
    SXM, SXK, SZN, SZK, SOM, SON, {batch_params(tuple(operands), spec.nbatch)}KEY,
    BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, TM: gl.constexpr, GROUP_M: gl.constexpr,
    XT: gl.constexpr, ZT: gl.constexpr,
):
    # program {prog.key()} (Gluon)
    W: gl.constexpr = gl.num_warps()
    ACC: gl.constexpr = gl.BlockedLayout([4, 4], [TM, 32 // TM], [W, 1], [1, 0])
    SHARED: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
{tile_order(cast, "gl")}"""
    layouts = _load_layout("XL", "BM", "XT") + _load_layout("ZL", "BN", "ZT")
    body = layouts + batch_code(operands, spec.nbatch) + hyper_loads(prog.hypers, spec.tensor_hypers, cdt, "gl")

    def stage(buffer: str, value_x: str, value_z: str) -> list[str]:
        return [
            f"xs.index({buffer}).permute([1, 0]).store({value_x}.to({cdt}))",
            f"zs.index({buffer}).permute([1, 0]).store({value_z}.to({cdt}))",
        ]

    def terms(buffer: str) -> list[str]:
        return [
            f"xk = xs.index({buffer}).slice(kk, 1, 0).permute([1, 0]).load(ACC)",
            f"zk = zs.index({buffer}).slice(kk, 1, 0).load(ACC)",
        ]

    body += [
        f"xm = pm * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, XL)){cast}",
        f"xkr = gl.arange(0, BK, layout=gl.SliceLayout(0, XL)){cast}",
        f"zn = pn * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, ZL)){cast}",
        f"zkr = gl.arange(0, BK, layout=gl.SliceLayout(0, ZL)){cast}",
        # Rows are clamped (m mod M), so only the k extent needs masks.
        "xp = X + gl.expand_dims((xm % M) * SXM, 1) + gl.expand_dims(xkr * SXK, 0)",
        "zp = Z + gl.expand_dims((zn % N) * SZN, 1) + gl.expand_dims(zkr * SZK, 0)",
        f"xs = gl.allocate_shared_memory({cdt}, [2, BK, BM], SHARED)",
        f"zs = gl.allocate_shared_memory({cdt}, [2, BK, BN], SHARED)",
        f"acc = gl.full([BM, BN], {identity}, {cdt}, ACC)",
        "nfull = D // BK",
        "xg = gl.load(xp, mask=gl.expand_dims(xkr, 0) < D, other=0.0)",
        "zg = gl.load(zp, mask=gl.expand_dims(zkr, 0) < D, other=0.0)",
        *stage("0", "xg", "zg"),
        "_kbarrier()",
        "for c in range(nfull):",
        "    cur = (c % 2).to(tl.int32)",
        # The next chunk (clamped to the last full one: unmasked, vectorised) is in flight while
        # this one is combined; then it goes to the other buffer.  One barrier per chunk.
        f"    kn = gl.minimum(c + 1, nfull - 1){cast} * BK",
        "    xg = gl.load(xp + kn * SXK)",
        "    zg = gl.load(zp + kn * SZK)",
        "    for kk in gl.static_range(BK):",
        *(f"        {line}" for line in terms("cur")),
        f"        acc = {fold.format(acc='acc', t=inner)}",
        *(f"    {line}" for line in stage("1 - cur", "xg", "zg")),
        "    _kbarrier()",
        "if nfull * BK < D:",
        f"    k0 = nfull{cast} * BK",
        "    last = (nfull % 2).to(tl.int32)",
        "    xg = gl.load(xp + k0 * SXK, mask=gl.expand_dims(k0 + xkr, 0) < D, other=0.0)",
        "    zg = gl.load(zp + k0 * SZK, mask=gl.expand_dims(k0 + zkr, 0) < D, other=0.0)",
        *(f"    {line}" for line in stage("last", "xg", "zg")),
        "    _kbarrier()",
        "    for kk in gl.static_range(BK):",
        *(f"        {line}" for line in terms("last")),
        f"        acc = {fold.format(acc='acc', t=f'tl.where(k0 + kk < D, {inner}, {identity})')}",
        f"om = gl.expand_dims(pm * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, ACC)){cast}, 1)",
        f"on = gl.expand_dims(pn * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, ACC)){cast}, 0)",
    ]
    if prog.uses_diag:
        body.append("diag = tl.where(om + OFF_M == on + OFF_N, 1.0, 0.0)")
    if not free_vars(prog.epilogue) & {"acc", "diag"}:
        # An epilogue without acc is a scalar: where(c, v, v) = v, broadcast to the tile.
        epilogue = f"tl.where(acc == acc, {epilogue}, {epilogue})"
    body += [
        f"val = {epilogue}",
        f"gl.store(OUT + om * SOM + on * SON, val.to(OUT.dtype.element_ty), mask=(om < M) & (on < N){STREAM})",
    ]
    return helpers(spec.compute, interpret=False) + _GLUON_IMPORTS + "\n\n" + head + indent(body)
