"""The gradient kernel: `out[o, n, m] = epilogue(Σ_k c[o,k]·a[k,m]·multiply(d[n,m], b[n,k]))`.

The kernel of every gradient program with a product factor (`multiply` here is
[`kermac.programs.product_factor`][kermac.programs.product_factor]); the others run
`kermac_backend_triton.general_gradient`.

One program owns a `BN × BM` tile of `(n, m)` pairs and `BO` rows of `o`.  Per `BK`
chunk it forms `w[n,m,k] = a[k,m]·multiply(d[n,m], b[n,k])` elementwise and contracts it with
`c` on the tensor cores: `acc[(n,m), o] += w[(n,m), k] @ cᵀ[k, o]` — in float32 as 3×TF32 by
hand (`contract`), `ieee` in float64.  `w` stays in registers as the A operand of the
products, provided Triton can form it in that register layout: every leaf of the chain that
computes `w` must be a load or a constant (a splatted scalar, such as a hyperparameter, sends
`w` through shared memory).

A multiply that is a signed power sgn(t)·|t|^e ([`kermac.programs.signed_power`][kermac.programs.signed_power], the
fractional-p gradient) with a scalar `e` gets a second k loop, taken when 0 < e < ∞: one
copysigned power per term (`signed_pow_positive`, no
selects) with `e` entering as a tile derived from the loaded `d` (exactly `e`, and no
splatted scalar in the chain that forms `w`); other `e`, and the masked tail, use the general
form.

`multiply(d, b, hypers)`, `epilogue(acc, hypers)` and, for signed powers,
`signed_base(d, b, hypers)` (t) and `signed_exponent(hypers)` (e) are the program's
`@triton.jit` functions (`kermac_backend_triton.generated`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kermac_backend_triton.kernel_math import INF, signed_pow_positive, split_tf32, to_tf32
from kermac_backend_triton.pairwise_simt import index_type

__all__ = ["contract", "gradient_tile", "grid_order"]


@triton.jit
def grid_order(M, N, O, BN: tl.constexpr, BM: tl.constexpr, BO: tl.constexpr, INT64: tl.constexpr):  # noqa: E741
    """(batch entry, o tile, n tile, m tile) of this program; o varies fastest."""
    pid = index_type(tl.program_id(0), INT64)
    tiles_o = tl.cdiv(O, BO)
    tiles_n = tl.cdiv(N, BN)
    tiles = tiles_o * tiles_n * tl.cdiv(M, BM)
    bat = pid // tiles
    tile = pid % tiles
    po = tile % tiles_o
    rest_t = tile // tiles_o
    pn = rest_t % tiles_n
    pm = rest_t // tiles_n
    return bat, po, pn, pm


@triton.jit
def contract(acc, w, cv, NONFINITE: tl.constexpr = False, FINITE_W: tl.constexpr = False):
    """`acc + w[(n,m), k] @ cv[k, o]`.

    float64: one `ieee` dot.  float32: 3×TF32 by hand, as in the tensor-core pairwise kernel:
    hi = `to_tf32` rounding, lo = the remainder (`w`'s
    lo goes in unrounded: the tensor cores truncate it, an error ≤ 2⁻²¹·|w| that saves two
    instructions per term), the products wl·ch + wh·cl + wh·ch summed into a fresh accumulator
    `part` that is added to `acc` in float32 — the tensor cores truncate their own sums, which
    over all of K would grow the error linearly with K.

    `NONFINITE`: ±inf and NaN operands give what a float32 product gives.  Without it the lo
    part of ±inf is NaN (inf − inf) and an exact lo of 0 meets the other operand's inf (0·inf);
    with it the lo parts of non-finite entries and the hi parts they meet in the cross products
    are 0 and their hi parts are the entries themselves, so a non-finite entry enters the sum
    through wh·ch alone (six selects per pair of tiles' entries, which the gradient, whose operands
    are finite in practice, does not pay).  `FINITE_W` (with `NONFINITE`): `w` is known to be finite, only
    `cv`'s non-finite entries are handled.
    """
    if acc.dtype == tl.float64:
        return tl.dot(w, cv, acc, input_precision="ieee", out_dtype=tl.float64)
    else:
        wh, wl = split_tf32(w)
        ch = to_tf32(cv)
        cl = to_tf32(cv - ch)
        if NONFINITE and FINITE_W:
            c_finite = tl.abs(cv) < INF
            ch = tl.where(c_finite, ch, cv)
            cl = tl.where(c_finite, cl, 0.0)
            part = tl.dot(wl, tl.where(c_finite, ch, 0.0), input_precision="tf32", out_dtype=tl.float32)
            part = tl.dot(wh, cl, part, input_precision="tf32", out_dtype=tl.float32)
        elif NONFINITE:
            w_finite = tl.abs(w) < INF
            c_finite = tl.abs(cv) < INF
            # A non-finite entry goes in unrounded: the rounding carry of a NaN with a full payload (the
            # 0x7FFFFFFF that CUDA arithmetic produces) reaches the sign bit and would make its hi part -0.
            wh = tl.where(w_finite, wh, w)
            ch = tl.where(c_finite, ch, cv)
            wl = tl.where(w_finite, wl, 0.0)
            cl = tl.where(c_finite, cl, 0.0)
            part = tl.dot(wl, tl.where(c_finite, ch, 0.0), input_precision="tf32", out_dtype=tl.float32)
            part = tl.dot(tl.where(w_finite, wh, 0.0), cl, part, input_precision="tf32", out_dtype=tl.float32)
        else:
            part = tl.dot(wl, ch, input_precision="tf32", out_dtype=tl.float32)
            part = tl.dot(wh, cl, part, input_precision="tf32", out_dtype=tl.float32)
        part = tl.dot(wh, ch, part, input_precision="tf32", out_dtype=tl.float32)
        acc += part
        return acc


@triton.jit
def _full_steps(
    acc, brow, acol, crow, kr, k_full, dv, e_tile, SBK, SAK, SCK, hypers, multiply, signed_base,
    SIGNED: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    """The unmasked k loop over full `BK` chunks; `SIGNED`: terms sgn(t)·|t|^e with e = `e_tile`."""
    for k0 in range(0, k_full, BK):
        kk = k0 + kr
        bk = tl.load(brow + kk[None, :] * SBK).to(acc.dtype)
        bv = bk[:, None, :]
        av = tl.load(acol + kk[None, :] * SAK).to(acc.dtype)
        cv = tl.load(crow + kk[:, None] * SCK).to(acc.dtype)
        if SIGNED:
            term = signed_pow_positive(signed_base(dv, bv, hypers), e_tile)
        else:
            term = multiply(dv, bv, hypers)
        w = tl.reshape(av[None, :, :] * tl.broadcast_to(term, [BN, BM, BK]), [BN * BM, BK])
        acc = contract(acc, w, cv)
    return acc


@triton.jit
def gradient_tile(
    A, B, C, DD, OUT, M, N, O, K, SAK, SAM, SBN, SBK, SCO, SCK, SDN, SDM, SOO, SON, SOM, po, pn, pm, hypers,  # noqa: E741
    multiply, epilogue, signed_base, signed_exponent, SIGNED_POWER: tl.constexpr, COMPUTE: tl.constexpr,
    BN: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, BO: tl.constexpr, INT64: tl.constexpr,
):  # fmt: skip
    """Compute and store the `(o, n, m)` tile `(po, pn, pm)` (see the module docs).

    `SIGNED_POWER`: the multiply is sgn(t)·|t|^e with a scalar e (`signed_base`,
    `signed_exponent`; otherwise those are unused).
    """
    rn = pn * BN + tl.arange(0, BN)
    rm = pm * BM + tl.arange(0, BM)
    ro = po * BO + tl.arange(0, BO)
    rnc = rn % N
    rmc = rm % M
    dk = tl.load(DD + rnc[:, None] * SDN + rmc[None, :] * SDM).to(COMPUTE)
    dv = dk[:, :, None]
    brow = B + rnc[:, None] * SBN
    acol = A + rmc[:, None] * SAM
    crow = C + (ro % O)[None, :] * SCO
    kr = index_type(tl.arange(0, BK), INT64)
    acc = tl.zeros([BN * BM, BO], COMPUTE)
    k_full = K - K % BK
    if SIGNED_POWER:
        e = signed_exponent(hypers)
        if (e < INF) & (e > 0):
            e_tile = (e + 0.0 * tl.minimum(tl.abs(dk), 1.0))[:, :, None]
            acc = _full_steps(
                acc, brow, acol, crow, kr, k_full, dv, e_tile, SBK, SAK, SCK, hypers, multiply, signed_base,
                True, BN, BM, BK,
            )  # fmt: skip
        else:
            acc = _full_steps(
                acc, brow, acol, crow, kr, k_full, dv, 0.0, SBK, SAK, SCK, hypers, multiply, signed_base,
                False, BN, BM, BK,
            )  # fmt: skip
    else:
        acc = _full_steps(
            acc, brow, acol, crow, kr, k_full, dv, 0.0, SBK, SAK, SCK, hypers, multiply, signed_base, False, BN, BM, BK
        )
    if k_full < K:
        kk = k_full + kr
        km = kk < K
        bv = tl.load(brow + kk[None, :] * SBK, mask=km[None, :], other=0.0).to(COMPUTE)[:, None, :]
        av = tl.load(acol + kk[None, :] * SAK, mask=km[None, :], other=0.0).to(COMPUTE)
        cv = tl.load(crow + kk[:, None] * SCK, mask=km[:, None], other=0.0).to(COMPUTE)
        w = tl.where(km[None, None, :], av[None, :, :] * tl.broadcast_to(multiply(dv, bv, hypers), [BN, BM, BK]), 0.0)
        w = tl.reshape(w, [BN * BM, BK])
        acc = contract(acc, w, cv)
    val = tl.reshape(tl.broadcast_to(epilogue(acc, hypers), [BN * BM, BO]), [BN, BM, BO])
    optr = OUT + ro[None, None, :] * SOO + rn[:, None, None] * SON + rm[None, :, None] * SOM
    omask = (ro < O)[None, None, :] & (rn < N)[:, None, None] & (rm < M)[None, :, None]
    tl.store(optr, val.to(OUT.dtype.element_ty), mask=omask)
