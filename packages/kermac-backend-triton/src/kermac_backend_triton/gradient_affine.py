"""The gradient kernel of an affine factor: `out[o,n,m] = epilogue(Σ_k c[o,k]·a[k,m]·(α·d[n,m] + β·b[n,k]))` as
matrix products.

For a product factor `α·d + β·b` with numbers α, β ([`kermac.programs.affine_factor`][kermac.programs.affine_factor];
the p = 2 gradient of `cdist` is `d − b`) the contraction splits into

```text
s[o,m]     = Σ_k c[o,k]·a[k,m]
acc[o,n,m] = Σ_k b[n,k]·(c[o,k]·a[k,m])          (per o, the matrix product b @ (c[o] ∘ a))
out[o,n,m] = epilogue(α·d[n,m]·s[o,m] + β·acc[o,n,m])
```

so all the work per `(n, m, k)` is the tensor cores' (`kermac_backend_triton.gradient`'s kernel forms
`a·g(d, b)` for every `(n, m, k)` on the SIMT units).  One program owns a `BN × BM` tile of `(n, m)` and one row
`o`: its registers hold one `[BN, BM]` accumulator (and the `[BN, BM]` part of each step, `contract`), as a
matrix product's; `BO` rows would multiply that.  Per `BK` step it loads `b[BN, BK]`, `a[BK, BM]` and `c[o, BK]`,
forms `ca = c[o] ∘ a`, adds its column sums to `s` (SIMT, `BK·BM` per step against the product's `BN·BK·BM`) and
`b @ ca` to `acc` on the tensor cores: 3×TF32 in float32, `ieee` in float64 (`contract`).

Cancellation.  Where `b[n,k]` is close to `d[n,m]`, `α·d·s` and `β·acc` nearly cancel (their magnitude is that of
`d`, the result's that of `d − b`).  For a difference (α + β = 0) each row `n` is therefore centred on a value
`μ[n]` of its tile, `d[n, m₀]` for the tile's first column `m₀` (0 where it is not finite): the kernel computes
`α·(d − μ)·s + β·Σ_k (b − μ)·c·a`, equal in exact arithmetic, whose terms are of the size of the distances
between the points of a tile and the centres instead of the size of the coordinates.  Rows where every `b[n,k]`
equals `d[n,m]` (all m) come out exact; what is left is a relative error of about `ε·|d[n,m] − d[n,m₀]|·Σ_k|c·a|`
against `ε·Σ_k|c·a·(d − b)|` of the fused kernel (docs/dev/triton-gradient-affine.md measures both).

Other values: the K tail is masked (its `c·a` is 0), rows and columns past N and M are clamped copies that are not
stored; with K = 0 the output is `epilogue(0)` (a non-finite `d` does not meet the empty `s`).  A variable
absent from the factor (α or β = 0) is neither loaded nor multiplied.  Non-finite operands give non-finite
outputs where the float64 reference has them (±inf in a product operand makes the 3×TF32 low part NaN, as in
the fused kernel).  Half inputs compute in float32.

`combine(ds, acc, hypers)` (α·ds + β·acc, the coefficients rendered as constants of the compute type) and
`epilogue(acc, hypers)` are the program's `@triton.jit` functions (`kermac_backend_triton.generated`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kermac_backend_triton.gradient import contract
from kermac_backend_triton.kernel_math import INF
from kermac_backend_triton.pairwise_simt import index_type

__all__ = ["affine_gradient_tile"]


@triton.jit
def _step(acc, s, bv, av, cv, mu, READ_B: tl.constexpr, CENTER: tl.constexpr):
    """One `k` step: `s += Σ_k c·a` and, where the factor reads `b`, `acc += (b − μ) @ (c ∘ a)` (`bv` `[BN, BK]`,
    `av` `[BK, BM]`, `cv` `[BK]`, `mu` `[BN]`)."""
    ca = cv[:, None] * av
    s += tl.sum(ca, 0)
    if READ_B:
        if CENTER:
            bv = bv - mu[:, None]
        acc = contract(acc, bv, ca)
    return acc, s


@triton.jit
def affine_gradient_tile(
    A, B, C, DD, OUT, M, N, O, K, SAK, SAM, SBN, SBK, SCO, SCK, SDN, SDM, SOO, SON, SOM, po, pn, pm, hypers,  # noqa: E741
    combine, epilogue, READ_D: tl.constexpr, READ_B: tl.constexpr, CENTER: tl.constexpr, COMPUTE: tl.constexpr,
    BN: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, INT64: tl.constexpr,
):  # fmt: skip
    """Compute and store `out[po, n, m]` for the `(n, m)` tile `(pn, pm)` (see the module docs).

    `combine(ds, acc, hypers)` = α·ds + β·acc; `READ_D`, `READ_B`: whether the factor reads `d` (α ≠ 0) and `b`
    (β ≠ 0); `CENTER`: whether it is a difference (α + β = 0, both read), whose rows are centred.
    """
    rn = pn * BN + index_type(tl.arange(0, BN), INT64)
    rm = pm * BM + index_type(tl.arange(0, BM), INT64)
    rnc = rn % N
    rmc = rm % M
    mu = tl.zeros([BN], COMPUTE)
    if CENTER:
        first = tl.load(DD + rnc * SDN + (pm * BM) * SDM).to(COMPUTE)
        mu = tl.where(tl.abs(first) < INF, first, 0.0)
    brow = B + rnc[:, None] * SBN
    acol = A + rmc[None, :] * SAM
    crow = C + po * SCO
    kr = index_type(tl.arange(0, BK), INT64)
    acc = tl.zeros([BN, BM], COMPUTE)
    s = tl.zeros([BM], COMPUTE)
    k_full = K - K % BK
    for k0 in range(0, k_full, BK):
        kk = k0 + kr
        bv = tl.zeros([BN, BK], COMPUTE)
        if READ_B:
            bv = tl.load(brow + kk[None, :] * SBK).to(COMPUTE)
        av = tl.load(acol + kk[:, None] * SAK).to(COMPUTE)
        cv = tl.load(crow + kk * SCK).to(COMPUTE)
        acc, s = _step(acc, s, bv, av, cv, mu, READ_B, CENTER)
    if k_full < K:
        kk = k_full + kr
        km = kk < K
        bv = tl.zeros([BN, BK], COMPUTE)
        if READ_B:
            # b − μ is formed in the step: the masked columns meet c·a = 0 (μ is finite)
            bv = tl.load(brow + kk[None, :] * SBK, mask=km[None, :], other=0.0).to(COMPUTE)
        av = tl.load(acol + kk[:, None] * SAK, mask=km[:, None], other=0.0).to(COMPUTE)
        cv = tl.load(crow + kk * SCK, mask=km, other=0.0).to(COMPUTE)
        acc, s = _step(acc, s, bv, av, cv, mu, READ_B, CENTER)
    ds = tl.zeros([BN, BM], COMPUTE)
    if READ_D:
        dk = tl.load(DD + rnc[:, None] * SDN + rmc[None, :] * SDM).to(COMPUTE)
        # K = 0: the sum is empty, whatever d holds (a non-finite d times the empty s would be NaN)
        ds = tl.where(K > 0, (dk - mu[:, None]) * s[None, :], 0.0)
    val = tl.broadcast_to(epilogue(combine(ds, acc, hypers), hypers), [BN, BM])
    optr = OUT + po * SOO + rn[:, None] * SON + rm[None, :] * SOM
    tl.store(optr, val.to(OUT.dtype.element_ty), mask=(rn < N)[:, None] & (rm < M)[None, :])
