"""The tensor-core pairwise kernel: `Σ_k (x − z)²` programs computed in float32, any epilogue.

For the programs `kermac.kernel_facts.tensor_core_eligible` accepts.  One
program computes a `BM × BN` tile of d² = ‖x‖² + ‖z‖² − 2·x·zᵀ.  A first k loop sums the norms
‖x‖², ‖z‖² in float32 (kept out of the main loop: there they would hold a second register copy
of each tile, since the dot needs another layout, and cost occupancy); the main loop forms
`x·zᵀ` with float32 accumulation, by the input dtype (the pointers' element type, known when the
kernel is compiled):

* float32: in 3×TF32: each operand is split as hi = tf32(a), lo = tf32(a − hi) (round to nearest,
  `to_tf32`) and three chained `tl.dot(..., input_precision="tf32")` add hi·lo + lo·hi + hi·hi,
  the low products first (float32 accuracy; the same products as Triton's `tf32x3`, without its
  serialising NaN fix-ups between the products);
* float16, bfloat16: one `tl.dot` of the operands in their own dtype, `out_dtype=tl.float32`
  (`dot_half`): the product of two values of 11 significant bits (bfloat16: 8) is exact in
  float32, so the dot has the 3×TF32 dot's accuracy (whose low halves of such values are 0) with
  a third of its products and half of its operand bytes.

The launcher specialises N and D on divisibility by 16 so the k mask and the store mask keep
16-byte vectors.

Cancellation guard: an entry is *flagged* where d² ≤ `GUARD`·(‖x‖² + ‖z‖²) or d² is not finite
(`GUARD` from `kermac.kernel_facts.cancellation_guard`); if any entry of the
tile is flagged, the program recomputes the whole tile from differences with a register-lean
SIMT tile (`kermac_backend_triton.pairwise_simt.simt_tile`: 128 threads of
`BM/8 × BN/16` outputs, 2 features per step — the branch must not raise the kernel's register
count, which sets how many programs share a multiprocessor) and stores that instead, so
near-duplicate rows (and x = z) are as exact as the SIMT kernel; otherwise it applies the
epilogue to d² and stores it streaming.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton import knobs

from kermac_backend_triton.kernel_math import INF, to_tf32
from kermac_backend_triton.pairwise_simt import index_type, simt_tile

__all__ = [
    "any_entry",
    "d2_values",
    "dot_3xtf32",
    "dot_half",
    "guard",
    "guard_flags",
    "guarded_d2",
    "half_operands",
    "tensor_core_tile",
]


@triton.constexpr_function
def half_operands(dtype) -> bool:
    """Whether inputs of `dtype` (the pointers' element type) form x·zᵀ by `dot_half` (float16, bfloat16)."""
    return dtype == tl.float16 or dtype == tl.bfloat16


@triton.constexpr_function
def _interpreted_bfloat16(dtype) -> bool:
    """Whether `dtype` is bfloat16 under Triton's CPU interpreter (see `dot_half`)."""
    return dtype == tl.bfloat16 and knobs.runtime.interpret


@triton.jit
def _load_raw(xrow, zrow, k0, kr, D, SXK, SZK):
    """The chunk of features `k0 + kr` of the rows at `xrow`, `zrow` in the inputs' dtype (0 past D)."""
    kk = k0 + kr
    xv = tl.load(xrow + kk * SXK, mask=kk < D, other=0.0)
    zv = tl.load(zrow + kk * SZK, mask=kk < D, other=0.0)
    return xv, zv


@triton.jit
def _load_chunk(xrow, zrow, k0, kr, D, SXK, SZK):
    """`_load_raw`'s chunk in float32."""
    xv, zv = _load_raw(xrow, zrow, k0, kr, D, SXK, SZK)
    return xv.to(tl.float32), zv.to(tl.float32)


@triton.jit
def guarded_d2(
    xrow, zrow, kr, D, SXK, SZK, GUARD, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr
):  # fmt: skip
    """`(d2, recompute)`: the `[BM, BN]` tile of d² = ‖x‖² + ‖z‖² − 2·x·zᵀ (x·zᵀ by the input dtype) for the rows at
    `xrow` `[BM, 1]` and `zrow` `[BN, 1]` (features at `kr` `[1, BK]`), and whether any entry of it
    is flagged by the cancellation guard (see the module docs)."""
    xsq = tl.zeros([BM, BK], tl.float32)
    zsq = tl.zeros([BN, BK], tl.float32)
    for k0 in range(0, D, BK):
        xv, zv = _load_chunk(xrow, zrow, k0, kr, D, SXK, SZK)
        xsq += xv * xv
        zsq += zv * zv
    xn = tl.sum(xsq, 1)
    zn = tl.sum(zsq, 1)
    dot = tl.zeros([BM, BN], tl.float32)
    for k0 in range(0, D, BK):
        if half_operands(xrow.dtype.element_ty):
            xv, zv = _load_raw(xrow, zrow, k0, kr, D, SXK, SZK)
            dot = dot_half(xv, tl.trans(zv), dot)
        else:
            xv, zv = _load_chunk(xrow, zrow, k0, kr, D, SXK, SZK)
            xh = to_tf32(xv)
            xl = to_tf32(xv - xh)
            zt = tl.trans(zv)
            zh = to_tf32(zt)
            zl = to_tf32(zt - zh)
            dot = dot_3xtf32(xh, xl, zh, zl, dot)
    return guard(xn, zn, dot, GUARD)


@triton.jit
def dot_3xtf32(xh, xl, zh, zl, acc):
    """`acc + x·zᵀ` in 3×TF32 from the split operands (x `[BM, BK]`, zᵀ `[BK, BN]`), the low products first."""
    acc = tl.dot(xh, zl, acc, input_precision="tf32", out_dtype=tl.float32)
    acc = tl.dot(xl, zh, acc, input_precision="tf32", out_dtype=tl.float32)
    return tl.dot(xh, zh, acc, input_precision="tf32", out_dtype=tl.float32)


@triton.jit
def dot_half(x, zt, acc):
    """`acc + x·zᵀ` of float16 or bfloat16 operands (x `[BM, BK]`, zᵀ `[BK, BN]`) in one dot with float32
    accumulation: each product of two such values is exact in float32."""
    if _interpreted_bfloat16(x.dtype):
        # The interpreter keeps bfloat16 as its uint16 bits and its dot multiplies those bits
        # (triton-lang/triton#11584); the float32 values, converted exactly, give the same products.
        return tl.dot(x.to(tl.float32), zt.to(tl.float32), acc, input_precision="ieee", out_dtype=tl.float32)
    return tl.dot(x, zt, acc, out_dtype=tl.float32)


@triton.jit
def guard_flags(xn, zn, dot, GUARD):
    """`(d2, flags)` from the squared norms `xn` `[BM]`, `zn` `[BN]` and `dot` = x·zᵀ: d² and the entries the
    cancellation guard flags (see the module docs)."""
    s = xn[:, None] + zn[None, :]
    d2 = s - 2.0 * dot
    return d2, ~((d2 > GUARD * s) & (d2 < INF))


@triton.jit
def any_entry(flags):
    """Whether any entry of the 2-D boolean tile `flags` is set."""
    return tl.max(tl.max(flags.to(tl.int32), 1), 0) > 0


@triton.jit
def guard(xn, zn, dot, GUARD):
    """`(d2, recompute)`: `guard_flags`' d² and whether it flags any entry of the tile."""
    d2, flags = guard_flags(xn, zn, dot, GUARD)
    return d2, any_entry(flags)


@triton.jit
def d2_values(d2, om2, on2, OFF_M, OFF_N, hypers, epilogue, USES_DIAG: tl.constexpr):
    """The epilogue applied to a `d2` tile whose rows and columns are `om2` `[BM, 1]`, `on2` `[1, BN]`."""
    diag = 0.0
    if USES_DIAG:
        diag = tl.where(om2 + OFF_M == on2 + OFF_N, 1.0, 0.0)
    return tl.broadcast_to(epilogue(d2, diag, hypers), d2.shape)


@triton.jit
def tensor_core_tile(
    X, Z, OUT, M, N, D, OFF_M, OFF_N, SXM, SXK, SZN, SZK, SOM, SON, GUARD, pm, pn, hypers, inner, epilogue,
    combine_chunk, USES_DIAG: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, INT64: tl.constexpr,
):  # fmt: skip
    """Compute and store output tile `(pm, pn)` of a (x − z)²-sum program (see the module docs).

    `inner` is the program's (x − z)² (the recompute's term), `combine_chunk` its sum of a chunk of terms,
    `epilogue(d2, diag, hypers)` its epilogue.
    """
    om = pm * BM + index_type(tl.arange(0, BM), INT64)
    on = pn * BN + index_type(tl.arange(0, BN), INT64)
    xrow = X + ((om % M) * SXM)[:, None]
    zrow = Z + ((on % N) * SZN)[:, None]
    kr = index_type(tl.arange(0, BK)[None, :], INT64)
    d2, recompute = guarded_d2(xrow, zrow, kr, D, SXK, SZK, GUARD, BM, BN, BK)
    if recompute:
        simt_tile(
            X, Z, OUT, M, N, D, OFF_M, OFF_N, SXM, SXK, SZN, SZK, SOM, SON, pm, pn, hypers, inner, epilogue,
            combine_chunk, "sum", USES_DIAG, tl.float32, BK=2, MI=BM // 8, NI=BN // 16, MT=8, NT=16, PF=0,
            SPLIT_TAIL=False, INT64=INT64,
        )  # fmt: skip
    else:
        om2 = om[:, None]
        on2 = on[None, :]
        tl.store(
            OUT + om2 * SOM + on2 * SON,
            d2_values(d2, om2, on2, OFF_M, OFF_N, hypers, epilogue, USES_DIAG).to(OUT.dtype.element_ty),
            mask=(om2 < M) & (on2 < N),
            cache_modifier=".cs",
        )
