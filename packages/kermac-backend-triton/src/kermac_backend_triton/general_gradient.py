"""The general gradient kernel: `out[o,n,m] = epilogue(REDUCE_k accumulate(c[o,k], multiply(a[k,m], b[n,k], d[n,m])))`.

The kernel of gradient programs in the general form ([`kermac.programs.GradProgram`][kermac.programs.GradProgram])
that compute no product form `Σ_k c·a·g(d, b)` (those run `kermac_backend_triton.gradient`, whose contraction
over `k` is a matrix product; [`kermac.programs.product_factor`][kermac.programs.product_factor] decides).
Nothing here is a matrix product: `REDUCE` is any reduction of `kermac.reductions`, known to the kernel by its
generated `combine` and by its identity.

One program owns a `BN × BM` tile of `(n, m)` pairs and `BO` rows of `o` (`grid_order` of the product-form
kernel), held as a `[BO, BN, BM]` accumulator that starts at the reduction's identity (so `K = 0` gives the
epilogue of the identity).  For each `k` it evaluates `term = multiply(a, b, d)` once per `(n, m)`, then
`acc = combine(acc, accumulate(c, term))` per `(o, n, m)`: one term at a time, so no chunk of terms is held and
no reduction runs across lanes (Triton's default layouts give threads to `(n, m)`, each keeping its `BO` rows in
registers), and the CPU interpreter combines whole tiles, where a `tl.reduce` by a function of its own would fold
element by element.  The `k` loop is unrolled by `BK` (its loads issued together), the last `K mod BK` one by
one; `k` never passes `K`, so loads need no masks, and row indices are clamped (`n mod N`, `m mod M`,
`o mod O`); the store is masked.

`multiply(a, b, d, hypers)`, `accumulate(c, term, hypers)`, `epilogue(acc, hypers)` and `combine(acc, t)` are
the program's `@triton.jit` functions (`kermac_backend_triton.generated`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kermac_backend_triton.pairwise_simt import reduction_identity

__all__ = ["general_gradient_tile"]


@triton.jit
def _step(acc, acol, brow, crow, dv, k, SAK, SBK, SCK, hypers, multiply, accumulate, combine, INT64: tl.constexpr):
    """`acc` combined with the terms of index `k`: `term[n, m]` once, `accumulate(c[o, k], term)` per `o`.

    `INT64`: `k` as a 64-bit index (by `tl.cast`, which also takes the interpreter's Python integer)."""
    if INT64:
        k = tl.cast(k, tl.int64)
    av = tl.load(acol + k * SAK).to(acc.dtype)
    bv = tl.load(brow + k * SBK).to(acc.dtype)
    cv = tl.load(crow + k * SCK).to(acc.dtype)
    term = multiply(av, bv, dv, hypers)
    return combine(acc, accumulate(cv, term, hypers))


@triton.jit
def general_gradient_tile(
    A, B, C, DD, OUT, M, N, O, K, SAK, SAM, SBN, SBK, SCO, SCK, SDN, SDM, SOO, SON, SOM, po, pn, pm, hypers,  # noqa: E741
    multiply, accumulate, combine, epilogue, REDUCTION: tl.constexpr, COMPUTE: tl.constexpr,
    BN: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, BO: tl.constexpr, INT64: tl.constexpr,
):  # fmt: skip
    """Compute and store the `(o, n, m)` tile `(po, pn, pm)` (see the module docs)."""
    rn = pn * BN + tl.arange(0, BN)
    rm = pm * BM + tl.arange(0, BM)
    ro = po * BO + tl.arange(0, BO)
    rnc = (rn % N)[None, :, None]
    rmc = (rm % M)[None, None, :]
    dv = tl.load(DD + rnc * SDN + rmc * SDM).to(COMPUTE)
    acol = A + rmc * SAM
    brow = B + rnc * SBN
    crow = C + (ro % O)[:, None, None] * SCO
    acc = tl.full([BO, BN, BM], reduction_identity(REDUCTION), COMPUTE)
    k_full = K - K % BK
    for k0 in range(0, k_full, BK):
        for j in tl.static_range(BK):
            acc = _step(acc, acol, brow, crow, dv, k0 + j, SAK, SBK, SCK, hypers, multiply, accumulate, combine, INT64)
    for k in range(k_full, K):
        acc = _step(acc, acol, brow, crow, dv, k, SAK, SBK, SCK, hypers, multiply, accumulate, combine, INT64)
    val = tl.broadcast_to(epilogue(acc, hypers), [BO, BN, BM])
    optr = OUT + ro[:, None, None] * SOO + rn[None, :, None] * SON + rm[None, None, :] * SOM
    omask = (ro < O)[:, None, None] & (rn < N)[None, :, None] & (rm < M)[None, None, :]
    tl.store(optr, val.to(OUT.dtype.element_ty), mask=omask)
