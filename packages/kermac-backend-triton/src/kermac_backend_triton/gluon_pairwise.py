"""The SIMT pairwise kernel on a GPU in Gluon: operands staged through shared memory.

`out[b,m,n] = epilogue(REDUCE_k inner(x[b,m,k], z[b,n,k]), diag)` for the programs that do not
take the tensor-core kernel, written in Gluon, Triton's explicit-layout dialect.  The `tl` SIMT
kernel (`kermac_backend_triton.pairwise_simt`) must move every operand chunk through a
shared-memory layout conversion of the compiler's choosing (a store, a barrier and a load per
operand, four barriers per chunk); here the staging is explicit, as in the NVRTC kernel:

* float32 programs only (float16/bfloat16 inputs computed in float32); one program computes a
  `BM × BN` tile with `W` warps.  The accumulator layout `ACC` gives
  each thread blocks of 4 × 4 outputs (`TM × TN` = 32 threads per warp, warps stacked along m,
  blocks repeated to cover the tile), so every operand fragment is one 16-byte shared load.
* Each `BK` chunk of x and z is loaded from global memory with 4 consecutive elements per
  thread along the operand's contiguous dimension (k for row-major operands, m or n where the
  operand is transposed: the `XT`/`ZT` constexprs) and stored k-major into one of two
  shared buffers `[BK, BM]` / `[BK, BN]`.
* The k loop computes from one buffer while the next chunk's global loads are in flight, then
  stores that chunk into the other buffer: **one barrier per chunk**.  Per feature `k` a thread
  reads its x column fragment `[BM, 1]` and z row fragment `[1, BN]` (the buffers' row k, in
  `ACC`) and combines `inner` of their broadcast into the accumulator.
* `D mod BK` features take one masked chunk after the loop: its features beyond D give the reduction's
  identity or, with the `FEW` constexpr (D < 8, set by the launch), are skipped by a branch uniform over the
  program, so that a few features cost their own terms and not `BK`'s (the branch is not taken for every D
  because it adds spills to the 128-register configuration; docs/dev/triton-gluon-tail.md).  The epilogue and the
  streaming, masked store read the accumulator in place.

`tl` builtins and `@triton.jit` functions work inside Gluon kernels, so the program's
`inner(x, z, hypers)`, `epilogue(acc, diag, hypers)` and its reduction's `combine(acc, t)` are rendered
by the same code as for the `tl` kernels (`kermac_backend_triton.generated`).  float64 programs keep the `tl`
kernel: with the accurate `pow` inlined per output, the Gluon tile compiles for over a minute.
Gluon has no CPU interpreter: the interpreter tier runs the `tl` kernel, and CI compiles this
one to cubin (`tests/test_triton_codegen.py`).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from kermac_backend_triton.pairwise_simt import index_type, reduction_identity

__all__ = ["gluon_tile"]

# Triton 3.6 names the CTA barrier thread_barrier, later releases barrier.
_barrier = getattr(gl, "barrier", None) or gl.thread_barrier


@triton.constexpr_function
def load_layout(block: int, BK: int, warps: int, transposed: bool):
    """The global-load layout of one operand chunk `[block, BK]`: 4 contiguous elements per thread.

    Row-major operands (unit k stride) are read along k (`BK // 4` threads per row);
    transposed ones (unit row stride) along the rows, warps across k.
    """
    if transposed:
        rows = 32 if block >= 128 else block // 4
        return gl.BlockedLayout([4, 1], [rows, 32 // rows], [1, warps], [0, 1])
    return gl.BlockedLayout([1, 4], [32 // (BK // 4), BK // 4], [warps, 1], [1, 0])


@gluon.jit
def _stage(xs, zs, buffer, xg, zg, COMPUTE: gl.constexpr):
    """Store one chunk of x and z, k-major, into shared buffer `buffer`."""
    xs.index(buffer).permute([1, 0]).store(xg.to(COMPUTE))
    zs.index(buffer).permute([1, 0]).store(zg.to(COMPUTE))


@gluon.jit
def _combine_buffer(acc, xs, zs, buffer, hypers, inner, combine, k0, D, REDUCTION: gl.constexpr, BK: gl.constexpr,
                    ACC: gl.constexpr, MASKED: gl.constexpr, SKIP: gl.constexpr):  # fmt: skip
    """`acc` combined (`combine(acc, t)`, the reduction's rule) with the terms of every feature of shared buffer
    `buffer` (`MASKED`: features `k0 + kk` ≥ D give the reduction's identity, or with `SKIP` are left out by a
    branch the whole program takes alike)."""
    for kk in gl.static_range(BK):
        xk = xs.index(buffer).slice(kk, 1, 0).permute([1, 0]).load(ACC)
        zk = zs.index(buffer).slice(kk, 1, 0).load(ACC)
        if MASKED:
            if SKIP:
                if k0 + kk < D:
                    acc = combine(acc, inner(xk, zk, hypers))
            else:
                acc = combine(acc, tl.where(k0 + kk < D, inner(xk, zk, hypers), reduction_identity(REDUCTION)))
        else:
            acc = combine(acc, inner(xk, zk, hypers))
    return acc


@gluon.jit
def gluon_tile(
    X, Z, OUT, M, N, D, OFF_M, OFF_N, SXM, SXK, SZN, SZK, SOM, SON, pm, pn, hypers, inner, epilogue, combine,
    REDUCTION: gl.constexpr, USES_DIAG: gl.constexpr, COMPUTE: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
    BK: gl.constexpr, TM: gl.constexpr, XT: gl.constexpr, ZT: gl.constexpr, FEW: gl.constexpr, INT64: gl.constexpr,
):  # fmt: skip
    """Reduce, apply the epilogue to and store output tile `(pm, pn)` (see the module docs).

    Meta-parameters (`kermac_backend_triton.configs.GLUON_PAIRWISE_SPACE`): `BM`, `BN`,
    `BK` (a multiple of 4), `TM` (threads of a warp along m, `32 / TM` along n: `BM` must be
    a multiple of 4·`TM`·warps, `BN` of 128 / `TM`); `XT` / `ZT`: the operand's unit stride
    is along its rows; `FEW`: D < 8, the last chunk's missing features are skipped.
    """
    W: gl.constexpr = gl.num_warps()
    ACC: gl.constexpr = gl.BlockedLayout([4, 4], [TM, 32 // TM], [W, 1], [1, 0])
    SHARED: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    XL: gl.constexpr = load_layout(BM, BK, W, XT)
    ZL: gl.constexpr = load_layout(BN, BK, W, ZT)
    xm = pm * BM + index_type(gl.arange(0, BM, layout=gl.SliceLayout(1, XL)), INT64)
    xkr = index_type(gl.arange(0, BK, layout=gl.SliceLayout(0, XL)), INT64)
    zn = pn * BN + index_type(gl.arange(0, BN, layout=gl.SliceLayout(1, ZL)), INT64)
    zkr = index_type(gl.arange(0, BK, layout=gl.SliceLayout(0, ZL)), INT64)
    # Rows are clamped (m mod M), so only the k extent needs masks.
    xp = X + gl.expand_dims((xm % M) * SXM, 1) + gl.expand_dims(xkr * SXK, 0)
    zp = Z + gl.expand_dims((zn % N) * SZN, 1) + gl.expand_dims(zkr * SZK, 0)
    xs = gl.allocate_shared_memory(COMPUTE, [2, BK, BM], SHARED)
    zs = gl.allocate_shared_memory(COMPUTE, [2, BK, BN], SHARED)
    acc = gl.full([BM, BN], reduction_identity(REDUCTION), COMPUTE, ACC)
    nfull = D // BK
    xg = gl.load(xp, mask=gl.expand_dims(xkr, 0) < D, other=0.0)
    zg = gl.load(zp, mask=gl.expand_dims(zkr, 0) < D, other=0.0)
    _stage(xs, zs, 0, xg, zg, COMPUTE)
    _barrier()
    for c in range(nfull):
        cur = (c % 2).to(tl.int32)
        # The next chunk (clamped to the last full one: unmasked, vectorised) is in flight while
        # this one is combined; then it goes to the other buffer.  One barrier per chunk.
        kn = index_type(gl.minimum(c + 1, nfull - 1), INT64) * BK
        xg = gl.load(xp + kn * SXK)
        zg = gl.load(zp + kn * SZK)
        acc = _combine_buffer(acc, xs, zs, cur, hypers, inner, combine, 0, D, REDUCTION, BK, ACC, False, False)
        _stage(xs, zs, 1 - cur, xg, zg, COMPUTE)
        _barrier()
    if nfull * BK < D:
        k0 = index_type(nfull, INT64) * BK
        last = (nfull % 2).to(tl.int32)
        xg = gl.load(xp + k0 * SXK, mask=gl.expand_dims(k0 + xkr, 0) < D, other=0.0)
        zg = gl.load(zp + k0 * SZK, mask=gl.expand_dims(k0 + zkr, 0) < D, other=0.0)
        _stage(xs, zs, last, xg, zg, COMPUTE)
        _barrier()
        acc = _combine_buffer(acc, xs, zs, last, hypers, inner, combine, k0, D, REDUCTION, BK, ACC, True, FEW)
    om = gl.expand_dims(pm * BM + index_type(gl.arange(0, BM, layout=gl.SliceLayout(1, ACC)), INT64), 1)
    on = gl.expand_dims(pn * BN + index_type(gl.arange(0, BN, layout=gl.SliceLayout(0, ACC)), INT64), 0)
    diag = 0.0
    if USES_DIAG:
        diag = tl.where(om + OFF_M == on + OFF_N, 1.0, 0.0)
    val = epilogue(acc, diag, hypers)
    gl.store(OUT + om * SOM + on * SON, val.to(OUT.dtype.element_ty), mask=(om < M) & (on < N), cache_modifier=".cs")
