"""The fused kernel product: `out[m, c] = Σ_n K[m, n] · v[n, c]`, K never materialised.

`K[m, n]` is the pairwise program's output (`epilogue(REDUCE_k inner(x[m, k], z[n, k]), diag)`),
computed tile by tile exactly as the pairwise kernels compute their output tiles and contracted
with `v` where it is computed.  One program owns a `BM × BC` tile of `out` (rows `pm`, columns
`pc`: `BC` is 1 for one column, else a power of two ≥ 16 covering C up to 64, larger C takes
several column tiles, each recomputing K) and loops over N in `BN` tiles:

* the `BM × BN` tile of K: `simt_product_tile` takes it from the SIMT pairwise tile
  (`kermac_backend_triton.pairwise_simt.simt_values`, every reduction and program, float32 and
  float64), `tensor_core_product_tile` from the guarded expansion of the (x − z)²
  family (`kermac_backend_triton.pairwise_tensor_cores.guarded_d2`: x·zᵀ in 3×TF32, or one
  dot of float16/bfloat16 operands, with the same SIMT recompute of a flagged tile); where every
  feature fits one step (D ≤ `BK`), the program's rows of x stay in registers across the N tiles
  (split for 3×TF32, or in their own half dtype; the pairwise kernel reloads both operands per
  tile: it computes each output tile once); past that, float32 operands on sm_90 come split for
  3×TF32 with their norms from a workspace (`kermac_backend_triton.operand_split`, `PRESPLIT`);
* columns past N are set to 0 (their rows of `v` are loaded as 0: only lanes outside `v` are
  masked, so NaN and ±inf in `v` reach the sum as in a dense product); rows past M hold the
  values of clamped rows and are never stored;
* `acc[BM, BC] += K_tile @ v_tile` (`kermac_backend_triton.gradient.contract`): float32 in
  3×TF32 on the tensor cores with non-finite operands kept exact (`NONFINITE`), each tile's
  partial product added to the float32 accumulator; float64 as an `ieee` dot.  On the tensor-core
  K tiles whose x is resident or split, one reduction per tile tells whether the guard flags an entry
  or an entry of K is not finite: if neither, K's entries skip the non-finite selects (`FINITE_W`);
* one column (`C = 1`, `BC = 1`: a matrix-vector product, what a conjugate gradient or a
  one-output predictor asks for): no dot, whose smallest operand would be 16 columns of
  padding, and no copy of the K tile into the dot's operand layout.  Each thread multiplies
  the K entries it holds by `v` and adds them, in the compute type, into an accumulator of
  the K tile's own shape and layout (one fused multiply-add per entry of K); the tile's
  columns are summed once, after the last N tile.

Half inputs are computed in float32 (x·zᵀ of the tensor-core K tile from the half operands, exact
products with float32 accumulation) and stored in their own dtype.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kermac_backend_triton.gradient import contract
from kermac_backend_triton.kernel_math import INF, to_tf32
from kermac_backend_triton.operand_split import split_dot
from kermac_backend_triton.pairwise_simt import index_type, simt_values
from kermac_backend_triton.pairwise_tensor_cores import (
    any_entry,
    d2_values,
    dot_3xtf32,
    dot_half,
    guard_flags,
    guarded_d2,
    half_operands,
)

__all__ = ["product_order", "simt_product_tile", "tensor_core_product_tile"]


@triton.jit
def product_order(M, C, BM: tl.constexpr, BC: tl.constexpr, INT64: tl.constexpr):
    """(batch entry, row tile, column tile) of this program; the column tile varies fastest, so
    the programs that recompute the same K tiles for other columns of `v` run together."""
    pid = index_type(tl.program_id(0), INT64)
    tiles_c = tl.cdiv(C, BC)
    tiles = tl.cdiv(M, BM) * tiles_c
    bat = pid // tiles
    tile = pid % tiles
    return bat, tile // tiles_c, tile % tiles_c


@triton.jit
def _simt_k_tile(
    X, Z, M, N, D, OFF_M, OFF_N, SXM, SXK, SZN, SZK, pm, pn, hypers, inner, epilogue, combine_chunk,
    REDUCTION: tl.constexpr, USES_DIAG: tl.constexpr, COMPUTE: tl.constexpr,
    BK: tl.constexpr, MI: tl.constexpr, NI: tl.constexpr, MT: tl.constexpr, NT: tl.constexpr,
    PF: tl.constexpr, SPLIT_TAIL: tl.constexpr, INT64: tl.constexpr,
):  # fmt: skip
    """`simt_values`' tile `(pm, pn)` as `[MI·MT, NI·NT]`: its entry `[i, j, s, t]` at row
    `i·MT + s`, column `j·NT + t`, as `simt_values` numbers them."""
    val = simt_values(
        X, Z, M, N, D, OFF_M, OFF_N, SXM, SXK, SZN, SZK, pm, pn, hypers, inner, epilogue, combine_chunk,
        REDUCTION, USES_DIAG, COMPUTE, BK, MI, NI, MT, NT, PF, SPLIT_TAIL, INT64,
    )[0]  # fmt: skip
    return tl.reshape(tl.permute(val, (0, 2, 1, 3)), (MI * MT, NI * NT))


@triton.jit
def _accumulate(acc, k, V, on, oc, N, C, SVN, SVC, FINITE_K: tl.constexpr = False):
    """`acc + K_tile @ v_tile`: `k` `[BM, BN]` at columns `on` `[BN]`, `v` rows `on`, columns `oc` `[BC]`;
    `FINITE_K`: every entry of `k` is known to be finite."""
    n_in = on < N
    vv = tl.load(V + on[:, None] * SVN + oc[None, :] * SVC, mask=n_in[:, None] & (oc < C)[None, :], other=0.0)
    k = tl.where(n_in[None, :], k, 0.0)
    return contract(acc, k, vv.to(acc.dtype), NONFINITE=True, FINITE_W=FINITE_K)


@triton.jit
def _accumulate_column(acc, k, V, on, N, SVN):
    """`acc + K_tile ∘ v` entry by entry (`C = 1`): `k` and `acc` of one shape, `on` the columns of `k`
    broadcast against it; columns past N add nothing (K set to 0, `v` loaded as 0)."""
    n_in = on < N
    vv = tl.load(V + on * SVN, mask=n_in, other=0.0).to(acc.dtype)
    return acc + tl.where(n_in, k, 0.0) * vv


@triton.jit
def _store_column(OUT, col, om, M, SOM):
    """Store the one-column result `col` at rows `om` (same shape)."""
    tl.store(OUT + om * SOM, col.to(OUT.dtype.element_ty), mask=om < M)


@triton.jit
def _store(OUT, acc, om, oc, M, C, SOM, SOC):
    tl.store(
        OUT + om[:, None] * SOM + oc[None, :] * SOC,
        acc.to(OUT.dtype.element_ty),
        mask=(om < M)[:, None] & (oc < C)[None, :],
    )


@triton.jit
def simt_product_tile(
    X, Z, V, OUT, M, N, D, C, OFF_M, OFF_N, SXM, SXK, SZN, SZK, SVN, SVC, SOM, SOC, pm, pc, hypers, inner, epilogue,
    combine_chunk, REDUCTION: tl.constexpr, USES_DIAG: tl.constexpr, COMPUTE: tl.constexpr,
    BK: tl.constexpr, MI: tl.constexpr, NI: tl.constexpr, MT: tl.constexpr, NT: tl.constexpr,
    PF: tl.constexpr, BC: tl.constexpr, INT64: tl.constexpr,
):  # fmt: skip
    """Compute and store `out` tile `(pm, pc)` with K tiles of the SIMT pairwise kernel
    (`BM = MI·MT`, `BN = NI·NT`, both ≥ 16 for the dot where `BC` > 1; see the module docs)."""
    BM: tl.constexpr = MI * MT
    BN: tl.constexpr = NI * NT
    oc = pc * BC + index_type(tl.arange(0, BC), INT64)
    if BC == 1:
        acc = tl.zeros([MI, NI, MT, NT], COMPUTE)  # the K tile's shape: summed over NI, NT at the end
    else:
        acc = tl.zeros([BM, BC], COMPUTE)
    for n_tile in range(0, tl.cdiv(N, BN)):
        pn = n_tile + 0 * pm  # pm's index type (64-bit where INT64); the interpreter's n_tile is a Python int
        if BC == 1:
            val, _, on4 = simt_values(
                X, Z, M, N, D, OFF_M, OFF_N, SXM, SXK, SZN, SZK, pm, pn, hypers, inner, epilogue, combine_chunk,
                REDUCTION, USES_DIAG, COMPUTE, BK, MI, NI, MT, NT, PF, True, INT64,
            )  # fmt: skip
            acc = _accumulate_column(acc, val, V, on4, N, SVN)
        else:
            k = _simt_k_tile(
                X, Z, M, N, D, OFF_M, OFF_N, SXM, SXK, SZN, SZK, pm, pn, hypers, inner, epilogue, combine_chunk,
                REDUCTION, USES_DIAG, COMPUTE, BK, MI, NI, MT, NT, PF, True, INT64,
            )  # fmt: skip
            on = pn * BN + index_type(tl.arange(0, BN), INT64)
            acc = _accumulate(acc, k, V, on, oc, N, C, SVN, SVC)
    if BC == 1:
        om = pm * BM + index_type(tl.arange(0, MI)[:, None] * MT + tl.arange(0, MT)[None, :], INT64)
        _store_column(OUT, tl.sum(tl.sum(acc, 3), 1), om, M, SOM)
    else:
        _store(OUT, acc, pm * BM + index_type(tl.arange(0, BM), INT64), oc, M, C, SOM, SOC)


@triton.jit
def tensor_core_product_tile(
    X, Z, V, OUT, XH, XL, XN, ZH, ZL, ZN, M, N, D, DP, C, OFF_M, OFF_N, SXM, SXK, SZN, SZK, SVN, SVC, SOM, SOC,
    GUARD, pm, pc, hypers, inner, epilogue, combine_chunk, USES_DIAG: tl.constexpr, BM: tl.constexpr,
    BN: tl.constexpr, BK: tl.constexpr, BC: tl.constexpr, X_RESIDENT: tl.constexpr, PRESPLIT: tl.constexpr,
    INT64: tl.constexpr,
):  # fmt: skip
    """Compute and store `out` tile `(pm, pc)` of an (x − z)²-sum program computed in float32 with K tiles
    of the tensor-core pairwise kernel: a tile the guard flags is recomputed from differences by
    the SIMT tile, as there (see the module docs).  `X_RESIDENT` (D ≤ `BK`): x's rows are loaded,
    split for 3×TF32 (float16/bfloat16: kept in their dtype for `dot_half`) and their norms summed
    once, before the N loop, and each N tile loads z once.  `PRESPLIT` (float32, D > `BK`): x·zᵀ and the
    norms come from the operands' split workspaces `XH`, `XL`, `XN`, `ZH`, `ZL`, `ZN` (rows of `DP` features,
    `kermac_backend_triton.operand_split`); otherwise (and for the SIMT recompute) from `X`, `Z`."""
    FLAG_TILE: tl.constexpr = X_RESIDENT or PRESPLIT  # the guard's flags come as a tile, reduced below
    FINITE_SWITCH: tl.constexpr = FLAG_TILE and BC > 1  # a tile of K known finite contracts without selects
    om = pm * BM + index_type(tl.arange(0, BM), INT64)
    oc = pc * BC + index_type(tl.arange(0, BC), INT64)
    xrow = X + ((om % M) * SXM)[:, None]
    kr = index_type(tl.arange(0, BK)[None, :], INT64)
    if BC == 1:
        acc = tl.zeros([BM, BN], tl.float32)  # the K tile's shape: summed over its columns at the end
    else:
        acc = tl.zeros([BM, BC], tl.float32)
    if X_RESIDENT:
        xr = tl.load(xrow + kr * SXK, mask=kr < D, other=0.0)  # x's dtype: the half dot's operand
        xv = xr.to(tl.float32)
        if not half_operands(X.dtype.element_ty):
            xh = to_tf32(xv)
            xl = to_tf32(xv - xh)
        xn = tl.sum(xv * xv, 1)
    if PRESPLIT:
        xn = tl.load(XN + (om % M))
    for n_tile in range(0, tl.cdiv(N, BN)):
        pn = n_tile + 0 * pm  # pm's index type (64-bit where INT64); the interpreter's n_tile is a Python int
        on = pn * BN + index_type(tl.arange(0, BN), INT64)
        zrow = Z + ((on % N) * SZN)[:, None]
        if X_RESIDENT:
            zr = tl.load(zrow + kr * SZK, mask=kr < D, other=0.0)
            zv = zr.to(tl.float32)
            if half_operands(X.dtype.element_ty):
                dot = dot_half(xr, tl.trans(zr), tl.zeros([BM, BN], tl.float32))
            else:
                zt = tl.trans(zv)
                zh = to_tf32(zt)
                dot = dot_3xtf32(xh, xl, zh, to_tf32(zt - zh), tl.zeros([BM, BN], tl.float32))
            d2, flags = guard_flags(xn, tl.sum(zv * zv, 1), dot, GUARD)
        elif PRESPLIT:
            dot, zn = split_dot(XH, XL, ZH, ZL, ZN, om, on, M, N, DP, BM, BN, BK)
            d2, flags = guard_flags(xn, zn, dot, GUARD)
        else:
            d2, recompute = guarded_d2(xrow, zrow, kr, D, SXK, SZK, GUARD, BM, BN, BK)
        if FLAG_TILE:
            if FINITE_SWITCH:
                # One reduction decides the recompute and whether K's entries are all finite, so the contraction
                # with v skips the selects on K's entries (a third of its time at D = 128, C = 16).
                k = d2_values(d2, om[:, None], on[None, :], OFF_M, OFF_N, hypers, epilogue, USES_DIAG)
                flags = flags | ~(tl.abs(k) < INF)
            recompute = any_entry(flags)
        if recompute:
            k = _simt_k_tile(
                X, Z, M, N, D, OFF_M, OFF_N, SXM, SXK, SZN, SZK, pm, pn, hypers, inner, epilogue, combine_chunk,
                "sum", USES_DIAG, tl.float32, 2, BM // 8, BN // 16, 8, 16, 0, False, INT64,
            )  # fmt: skip
            if FINITE_SWITCH:
                acc = _accumulate(acc, k, V, on, oc, N, C, SVN, SVC)
        elif FINITE_SWITCH:
            acc = _accumulate(acc, k, V, on, oc, N, C, SVN, SVC, FINITE_K=True)
        else:
            k = d2_values(d2, om[:, None], on[None, :], OFF_M, OFF_N, hypers, epilogue, USES_DIAG)
        if BC > 1 and not FINITE_SWITCH:
            acc = _accumulate(acc, k, V, on, oc, N, C, SVN, SVC)
        if BC == 1:
            acc = _accumulate_column(acc, k, V, on[None, :], N, SVN)
    if BC == 1:
        _store_column(OUT, tl.sum(acc, 1), om, M, SOM)
    else:
        _store(OUT, acc, om, oc, M, C, SOM, SOC)
