"""The fused gradient product: `out[m, j] = Σ_n G[m, n]·(e'(acc[m, n])·w_j(m, n)·τ_x(x[m, j], z[n, j]))`, K never
materialised.

The gradient in `x` of `L = Σ g·(K v)` (`kermac.problem.ProductGradProblem`) for a program whose reduction over
features is any of `kermac.reductions`: `acc = ⊕_k τ(x[m, k], z[n, k])`, `G = g vᵀ` (`G[m, n] = Σ_c g[m, c]·v[n, c]`),
`e'` the derivative of the epilogue in `acc` (it may read `diag`), `τ_x = ∂τ/∂x`, and `w_j = ∂acc/∂τ_j` the
reduction's `weight` (1 for a sum; for a `normalized` one divided by its sum over the features: a maximum's or
minimum's `1/k` on the `k` features tied with it; log-sum-exp's `exp(τ_j − acc)`).  The bracket is 0 where
`τ_x = 0` or `w_j = 0`, even where `e'` is infinite, and `G` multiplies the bracket afterwards, so a NaN or ±inf in
`g` or `v` propagates as in the reference backend; so does a NaN term (a NaN extreme: every weight of the pair
NaN) and an infinite log-sum-exp (NaN weights, as `torch.logsumexp`'s backward).

One program owns `BM` rows of `out` (`pm`) and loops over N in `BN` tiles.  Both sums below run over the
leading axis of their tile, the one Triton's default layouts spread over threads last:

* `acc[BN, BM]`: the reduction over all D features of the inner terms, `BK` features per step
  (`combine_chunk`), the terms of features past D set to the reduction's identity;
* for a `normalized` reduction, the sum of the weights over all D features, a second pass recomputing the
  terms (the weights need the final `acc`), kept as its reciprocal;
* `G[BN, BM]` by a loop over the C columns of `g` and `v`, and `e'(acc, diag)`;
* `τ_x` on `BD` features `[BN, BM, BD]` (and for a weighted reduction `τ` and `w`),
  `where((τ_x == 0) | (w == 0), 0, e'·τ_x·w)·G` (a sum: `where(τ_x == 0, 0, e'·τ_x)·G`), set to 0 in the columns
  past N (whose rows of `z` and `v` are clamped copies), summed over the `BN` axis in the compute type.

The program owns every feature.  Where D ≤ `kermac_backend_triton.configs.PRODUCT_GRAD_MAX_BD` (`BD` ≥ D; fewer
for a weighted reduction in float64, `kermac_backend_triton.configs.product_grad_block_d`), its `[BM, BD]`
accumulator stays in registers for the whole loop over N.  Beyond (`RMW`), for each tile of z it walks the
features `BD` (`kermac_backend_triton.configs.PRODUCT_GRAD_RMW_BD`) at a time, adding each part to
what it stored in `out` for the previous tiles (read-modify-write; `out` is then in the compute type, a float32
workspace for half inputs, `kermac_backend_triton.launch.run_product_grad`), with a barrier between tiles since
another thread of the program may read what one stored.  Either way: no other workspace, no atomics (each
element of `out` has one program), one order of summation per output (deterministic).  Rows past M hold values
of clamped rows and features past D values of zeros; neither is stored.  Half inputs are loaded and computed
in float32 and stored in their own dtype.

`inner(x, z, hypers)`, `combine_chunk(acc, t)`, `slope(acc, diag, hypers)` (`e'`),
`inner_slope(x, z, hypers)` (`τ_x`) and, for a reduction other than the sum, `weight(acc, t)` are the program's
`@triton.jit` functions (`kermac_backend_triton.generated`); the kernel knows the reduction by its name
`REDUCTION`, which gives its identity and whether its weights are normalised.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kermac import reductions
from kermac_backend_triton.pairwise_simt import index_type, reduction_identity

__all__ = ["product_grad_tile", "weighted_reduction"]


@triton.constexpr_function
def weighted_reduction(reduction: str) -> bool:
    """Whether `reduction`'s terms carry weights `∂acc/∂τ_j` other than 1 (every reduction but the arithmetic sum):
    the gradient product then evaluates `weight` on a second `[BN, BM, BD]` tile (callable from host code too)."""
    return not reductions.ALL[reduction].sum_fast_paths


@triton.constexpr_function
def _normalized(reduction: str) -> bool:
    """Whether `reduction`'s weights are divided by their sum over the features."""
    return reductions.ALL[reduction].normalized


@triton.jit
def _acc_tile(
    xrow, zrow, kr, D, SXK, SZK, hypers, inner, combine_chunk, REDUCTION: tl.constexpr, COMPUTE: tl.constexpr,
    BN: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    """`acc[n, m] = ⊕_k inner(x[m, k], z[n, k])` over all D features, `BK` per step (`xrow` `[1, 1, BM]`,
    `zrow` `[1, BN, 1]`, `kr` `[BK, 1, 1]`)."""
    identity = reduction_identity(REDUCTION)
    acc = tl.full([BN, BM], identity, COMPUTE)
    for k0 in range(0, D, BK):
        kk = k0 + kr
        km = kk < D
        xv = tl.load(xrow + kk * SXK, mask=km, other=0.0).to(COMPUTE)
        zv = tl.load(zrow + kk * SZK, mask=km, other=0.0).to(COMPUTE)
        t = tl.where(km, tl.broadcast_to(inner(xv, zv, hypers), [BK, BN, BM]), identity)
        acc = combine_chunk(acc, t)
    return acc


@triton.jit
def _weight_sum_tile(
    xrow, zrow, kr, D, SXK, SZK, acc, hypers, inner, weight, COMPUTE: tl.constexpr,
    BN: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    """`Σ_k weight(acc[n, m], inner(x[m, k], z[n, k]))` over all D features, `BK` per step (arguments as
    `_acc_tile`'s; the features past D contribute 0, whatever the weight of the identity)."""
    total = tl.zeros([BN, BM], COMPUTE)
    for k0 in range(0, D, BK):
        kk = k0 + kr
        km = kk < D
        xv = tl.load(xrow + kk * SXK, mask=km, other=0.0).to(COMPUTE)
        zv = tl.load(zrow + kk * SZK, mask=km, other=0.0).to(COMPUTE)
        t = tl.broadcast_to(inner(xv, zv, hypers), [BK, BN, BM])
        total += tl.sum(tl.where(km, weight(acc[None, :, :], t), 0.0), 0)
    return total


@triton.jit
def _g_tile(grow, vrow, C, SGC, SVC, COMPUTE: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr):
    """`G[n, m] = Σ_c g[m, c]·v[n, c]` (`grow` `[1, BM]`, `vrow` `[BN, 1]`: column 0; the pointers step by the
    column strides, so no index `c·stride` is formed)."""
    gv = tl.zeros([BN, BM], COMPUTE)
    for _ in range(0, C):
        gv += tl.load(vrow).to(COMPUTE) * tl.load(grow).to(COMPUTE)
        vrow += SVC
        grow += SGC
    return gv


@triton.jit
def _feature_part(
    X, Z, rm, rn, od, D, SXM, SXK, SZN, SZK, e, gv, acc, scale, on, N, hypers, inner, inner_slope, weight,
    REDUCTION: tl.constexpr, COMPUTE: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr,
):  # fmt: skip
    """`Σ_n G[n, m]·where((τ_x == 0) | (w == 0), 0, e[n, m]·τ_x·w)` `[BM, BD]` over one tile of z (`gv`: G), for
    the features `od`, with `τ_x = inner_slope(x[m, j], z[n, j])` and `w = weight(acc, inner(x[m, j], z[n, j]))`
    times `scale` (the reciprocal of the weights' sum) where normalised, `w = 1` for a sum; the columns past N
    contribute 0."""
    d_in = (od < D)[None, None, :]
    xd = tl.load(X + (rm * SXM)[None, :, None] + od[None, None, :] * SXK, mask=d_in, other=0.0).to(COMPUTE)
    zd = tl.load(Z + (rn * SZN)[:, None, None] + od[None, None, :] * SZK, mask=d_in, other=0.0).to(COMPUTE)
    tau = tl.broadcast_to(inner_slope(xd, zd, hypers), [BN, BM, BD])
    if weighted_reduction(REDUCTION):
        w = tl.broadcast_to(weight(acc[:, :, None], inner(xd, zd, hypers)), [BN, BM, BD])
        if _normalized(REDUCTION):
            # the quotient w / Σ w itself for the 0/1 weights of a maximum or minimum; 0·(1/0) is NaN, as 0/0
            # where no weight is 1 (a NaN extreme)
            w = w * scale[:, :, None]
        bracket = tl.where((tau == 0) | (w == 0), 0.0, e[:, :, None] * tau * w)
    else:
        bracket = tl.where(tau == 0, 0.0, e[:, :, None] * tau)
    return tl.sum(tl.where((on < N)[:, None, None], gv[:, :, None] * bracket, 0.0), 0)


@triton.jit
def product_grad_tile(
    X, Z, V, G, OUT, M, N, D, C, OFF_M, OFF_N, SXM, SXK, SZN, SZK, SVN, SVC, SGM, SGC, SOM, SOK, pm, hypers,
    inner, combine_chunk, slope, inner_slope, USES_DIAG: tl.constexpr, COMPUTE: tl.constexpr, BM: tl.constexpr,
    BN: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr, RMW: tl.constexpr, INT64: tl.constexpr,
    REDUCTION: tl.constexpr, weight,
):  # fmt: skip
    """Compute and store the rows `pm` of `out` (see the module docs); with `RMW` accumulate in `out`, whose dtype
    is then the compute type, else hold the `BD` ≥ D features in registers.  `REDUCTION`: the program's reduction,
    `weight` its generated `weight(acc, t)` (`None` for a sum, which has no weights).  Both are passed explicitly:
    Triton 3.6 does not take a string default of a `tl.constexpr` parameter (3.9 does)."""
    om = pm * BM + index_type(tl.arange(0, BM), INT64)
    rm = om % M
    kr = index_type(tl.arange(0, BK), INT64)[:, None, None]
    xrow = X + (rm * SXM)[None, None, :]
    grow = G + (rm * SGM)[None, :]
    m_in = (om < M)[:, None]
    out = tl.zeros([BM, BD], COMPUTE)
    for n_tile in range(0, tl.cdiv(N, BN)):
        pn = n_tile + 0 * pm  # pm's index type (64-bit where INT64); the interpreter's n_tile is a Python int
        on = pn * BN + index_type(tl.arange(0, BN), INT64)
        rn = on % N
        zrow = Z + (rn * SZN)[None, :, None]
        acc = _acc_tile(xrow, zrow, kr, D, SXK, SZK, hypers, inner, combine_chunk, REDUCTION, COMPUTE, BN, BM, BK)
        scale = 1.0
        if _normalized(REDUCTION):
            scale = 1.0 / _weight_sum_tile(xrow, zrow, kr, D, SXK, SZK, acc, hypers, inner, weight, COMPUTE, BN, BM, BK)
        diag = 0.0
        if USES_DIAG:
            diag = tl.where(on[:, None] + OFF_N == om[None, :] + OFF_M, 1.0, 0.0).to(COMPUTE)
        e = tl.broadcast_to(slope(acc, diag, hypers), [BN, BM])
        gv = _g_tile(grow, V + (rn * SVN)[:, None], C, SGC, SVC, COMPUTE, BN, BM)
        if RMW:
            for d0 in range(0, D, BD):
                od = d0 + index_type(tl.arange(0, BD), INT64)
                part = _feature_part(
                    X, Z, rm, rn, od, D, SXM, SXK, SZN, SZK, e, gv, acc, scale, on, N, hypers, inner, inner_slope,
                    weight, REDUCTION, COMPUTE, BN, BM, BD,
                )  # fmt: skip
                optr = OUT + om[:, None] * SOM + od[None, :] * SOK
                mask = m_in & (od < D)[None, :]
                # the first tile of z starts the sum (over whatever `out` held); later ones add to what this
                # program stored before
                part += tl.where(pn > 0, tl.load(optr, mask=mask, other=0.0).to(COMPUTE), 0.0)
                tl.store(optr, part.to(OUT.dtype.element_ty), mask=mask)
            # another thread of this program may read back what one stored: order them
            tl.debug_barrier()
        else:
            od = index_type(tl.arange(0, BD), INT64)
            out += _feature_part(
                X, Z, rm, rn, od, D, SXM, SXK, SZN, SZK, e, gv, acc, scale, on, N, hypers, inner, inner_slope, weight,
                REDUCTION, COMPUTE, BN, BM, BD,
            )  # fmt: skip
    if not RMW:
        od = index_type(tl.arange(0, BD), INT64)
        optr = OUT + om[:, None] * SOM + od[None, :] * SOK
        tl.store(optr, out.to(OUT.dtype.element_ty), mask=m_in & (od < D)[None, :])
