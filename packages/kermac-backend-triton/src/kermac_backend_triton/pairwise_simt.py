"""The SIMT pairwise kernel: `out[m, n] = epilogue(REDUCE_k inner(x[m, k], z[n, k]), diag)`.

The `tl` kernel of the CPU interpreter, of float64 and of `TritonTuning`
`gluon=False` (float32 programs on a GPU run `kermac_backend_triton.gluon_pairwise`, which
stages operands explicitly).  One program computes a `BM × BN` output tile, `BM = MI·MT` and
`BN = NI·NT`, held as a 4-d accumulator `[MI, NI, MT, NT]`.  Triton's default layouts give
threads to the fastest dimensions, so the `MT × NT` dimensions are spread over threads and each
thread keeps an `MI × NI` micro-tile in registers: the SIMT register blocking of a GEMM.  Each
step of the `k` loop loads `x` and `z` tiles `[BK, MI, MT]` and `[BK, NI, NT]`, evaluates
`inner` on their broadcast `[BK, MI, NI, MT, NT]` and reduces axis 0 — inside each thread, so
the reduction costs no shuffles.  Full `BK` chunks run unmasked, their loads issued `PF`
steps ahead (software pipelining by hand: Triton's pipeliner leaves loads that feed no
`tl.dot` where they are, so their latency would show at every step); one masked step handles
`D mod BK` (masked terms are replaced by the reduction's identity).  Row indices are clamped
(`m mod M`) so loads need no masks; the store is masked and streaming (`.cs`: the output is
not re-read).

`inner(x, z, hypers)` and `epilogue(acc, diag, hypers)` are the program's `@triton.jit`
functions (generated from the IR by `kermac_backend_triton.generated`); `hypers` is the
tuple of hyperparameter values they read.  `combine_chunk(acc, t)` combines the accumulator with
the terms `t` reduced over their axis 0 (a chunk's features), by the reduction's rule
(`kermac.reductions`), also generated: the kernels know a reduction only by its name `REDUCTION`,
which gives the identity.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kermac import reductions

__all__ = [
    "PREFETCH_DEPTHS",
    "grouped_tile",
    "index_type",
    "reduction_identity",
    "simt_tile",
    "simt_values",
]

PREFETCH_DEPTHS = (0, 1, 2)
"""Values of the SIMT kernel's `PF` meta-parameter: how many k chunks ahead it loads."""


@triton.constexpr_function
def reduction_identity(reduction: str) -> float:
    """The value a masked-off term takes: the identity of `reduction` (`kermac.reductions`)."""
    return reductions.ALL[reduction].identity


@triton.jit
def index_type(i, INT64: tl.constexpr):
    """`i` as 64-bit indices where `INT64` (operands past 2³¹ elements), else unchanged."""
    if INT64:
        return i.to(tl.int64)
    else:
        return i


@triton.jit
def grouped_tile(M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr, INT64: tl.constexpr):
    """(batch entry, row tile, column tile) of this program.

    Tiles are taken in groups of `GROUP_M` row tiles so that consecutive programs share operand
    rows in L2; the batch entry is the slowest index.  `INT64`: 64-bit indices from here on.
    """
    pid = index_type(tl.program_id(0), INT64)
    tiles_m = tl.cdiv(M, BM)
    tiles_n = tl.cdiv(N, BN)
    tiles = tiles_m * tiles_n
    bat = pid // tiles
    tile = pid % tiles
    width = GROUP_M * tiles_n
    first_m = (tile // width) * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pm = first_m + (tile % width) % group_rows
    pn = (tile % width) // group_rows
    return bat, pm, pn


@triton.jit
def _step(acc, xv, zv, hypers, inner, combine_chunk, FULL: tl.constexpr):
    """One unmasked chunk: x `[BK, MI, 1, MT, 1]` and z `[BK, 1, NI, 1, NT]`, terms of shape `FULL`."""
    t = tl.broadcast_to(inner(xv, zv, hypers), FULL)
    return combine_chunk(acc, t)


@triton.jit
def _masked_step(
    acc, xrow, zrow, kk, D, SXK, SZK, hypers, inner, combine_chunk, REDUCTION: tl.constexpr, FULL: tl.constexpr
):  # fmt: skip
    """One chunk at features `kk`, those ≥ D masked to the reduction's identity."""
    km = kk < D
    xv = tl.load(xrow + kk * SXK, mask=km, other=0.0).to(acc.dtype)[:, :, None, :, None]
    zv = tl.load(zrow + kk * SZK, mask=km, other=0.0).to(acc.dtype)[:, None, :, None, :]
    t = tl.where(km[:, :, :, None, None], tl.broadcast_to(inner(xv, zv, hypers), FULL), reduction_identity(REDUCTION))
    return combine_chunk(acc, t)


@triton.jit
def simt_values(
    X, Z, M, N, D, OFF_M, OFF_N, SXM, SXK, SZN, SZK, pm, pn, hypers, inner, epilogue,
    combine_chunk, REDUCTION: tl.constexpr, USES_DIAG: tl.constexpr, COMPUTE: tl.constexpr,
    BK: tl.constexpr, MI: tl.constexpr, NI: tl.constexpr, MT: tl.constexpr, NT: tl.constexpr,
    PF: tl.constexpr, SPLIT_TAIL: tl.constexpr, INT64: tl.constexpr,
):  # fmt: skip
    """`(val, om4, on4)`: tile `(pm, pn)` reduced, with the epilogue applied (see the module docs).

    `val` is `[MI, NI, MT, NT]` in the compute type `COMPUTE`; entry `[i, j, s, t]` is output
    `(om4, on4)[i, j, s, t]`: row `pm·BM + i·MT + s`, column `pn·BN + j·NT + t`.  Rows and
    columns past `M`, `N` hold the values of clamped rows (`m mod M`, `n mod N`).
    `SPLIT_TAIL`: unmasked full `BK` steps (loads `PF` chunks ahead, one of
    `PREFETCH_DEPTHS`) and one masked step for `D mod BK`; otherwise one masked loop
    (half the code, for the tensor-core kernel's rarely taken recompute).
    """
    BM: tl.constexpr = MI * MT
    BN: tl.constexpr = NI * NT
    FULL: tl.constexpr = [BK, MI, NI, MT, NT]
    om = pm * BM + tl.arange(0, MI)[:, None] * MT + tl.arange(0, MT)[None, :]
    on = pn * BN + tl.arange(0, NI)[:, None] * NT + tl.arange(0, NT)[None, :]
    xrow = X + ((om % M) * SXM)[None, :, :]
    zrow = Z + ((on % N) * SZN)[None, :, :]
    kr = index_type(tl.arange(0, BK)[:, None, None], INT64)
    acc = tl.full([MI, NI, MT, NT], reduction_identity(REDUCTION), COMPUTE)
    if SPLIT_TAIL:
        d_full = D - D % BK
        if PF == 0:
            for k0 in range(0, d_full, BK):
                xv = tl.load(xrow + (k0 + kr) * SXK).to(COMPUTE)[:, :, None, :, None]
                zv = tl.load(zrow + (k0 + kr) * SZK).to(COMPUTE)[:, None, :, None, :]
                acc = _step(acc, xv, zv, hypers, inner, combine_chunk, FULL)
        elif PF == 1:
            xa0 = tl.load(xrow + kr * SXK, mask=kr < d_full, other=0.0)
            za0 = tl.load(zrow + kr * SZK, mask=kr < d_full, other=0.0)
            for k0 in range(0, d_full, BK):
                xv = xa0.to(COMPUTE)[:, :, None, :, None]
                zv = za0.to(COMPUTE)[:, None, :, None, :]
                # Clamped to the last full chunk and kept a multiple of BK (vector loads).
                kb = (tl.minimum(k0 + 1 * BK, d_full - BK) // BK) * BK
                xa0 = tl.load(xrow + (kb + kr) * SXK)
                za0 = tl.load(zrow + (kb + kr) * SZK)
                acc = _step(acc, xv, zv, hypers, inner, combine_chunk, FULL)
        elif PF == 2:
            xa0 = tl.load(xrow + kr * SXK, mask=kr < d_full, other=0.0)
            za0 = tl.load(zrow + kr * SZK, mask=kr < d_full, other=0.0)
            xa1 = tl.load(xrow + (1 * BK + kr) * SXK, mask=(1 * BK + kr) < d_full, other=0.0)
            za1 = tl.load(zrow + (1 * BK + kr) * SZK, mask=(1 * BK + kr) < d_full, other=0.0)
            for k0 in range(0, d_full, BK):
                xv = xa0.to(COMPUTE)[:, :, None, :, None]
                zv = za0.to(COMPUTE)[:, None, :, None, :]
                xa0, za0 = xa1, za1
                kb = (tl.minimum(k0 + 2 * BK, d_full - BK) // BK) * BK
                xa1 = tl.load(xrow + (kb + kr) * SXK)
                za1 = tl.load(zrow + (kb + kr) * SZK)
                acc = _step(acc, xv, zv, hypers, inner, combine_chunk, FULL)
        else:
            tl.static_assert(False, "PF: prefetch depth must be 0, 1 or 2")
        if d_full < D:
            acc = _masked_step(acc, xrow, zrow, d_full + kr, D, SXK, SZK, hypers, inner, combine_chunk, REDUCTION, FULL)
    else:
        for k0 in range(0, D, BK):
            acc = _masked_step(acc, xrow, zrow, k0 + kr, D, SXK, SZK, hypers, inner, combine_chunk, REDUCTION, FULL)
    om4 = om[:, None, :, None]
    on4 = on[None, :, None, :]
    diag = 0.0
    if USES_DIAG:
        # In the compute type: an epilogue of `diag` alone (e.g. exp(diag)) is computed in its type.
        diag = tl.where(om4 + OFF_M == on4 + OFF_N, 1.0, 0.0).to(COMPUTE)
    val = tl.broadcast_to(epilogue(acc, diag, hypers), [MI, NI, MT, NT])
    return val, om4, on4


@triton.jit
def simt_tile(
    X, Z, OUT, M, N, D, OFF_M, OFF_N, SXM, SXK, SZN, SZK, SOM, SON, pm, pn, hypers, inner, epilogue,
    combine_chunk, REDUCTION: tl.constexpr, USES_DIAG: tl.constexpr, COMPUTE: tl.constexpr,
    BK: tl.constexpr, MI: tl.constexpr, NI: tl.constexpr, MT: tl.constexpr, NT: tl.constexpr,
    PF: tl.constexpr, SPLIT_TAIL: tl.constexpr, INT64: tl.constexpr,
):  # fmt: skip
    """Compute (`simt_values`) and store output tile `(pm, pn)` (see the module docs)."""
    val, om4, on4 = simt_values(
        X, Z, M, N, D, OFF_M, OFF_N, SXM, SXK, SZN, SZK, pm, pn, hypers, inner, epilogue,
        combine_chunk, REDUCTION, USES_DIAG, COMPUTE, BK, MI, NI, MT, NT, PF, SPLIT_TAIL, INT64,
    )  # fmt: skip
    tl.store(
        OUT + om4 * SOM + on4 * SON,
        val.to(OUT.dtype.element_ty),
        mask=(om4 < M) & (on4 < N),
        cache_modifier=".cs",
    )
