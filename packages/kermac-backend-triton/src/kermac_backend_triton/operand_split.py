"""float32 operands of the tensor-core kernel product split for 3×TF32 once, before the product.

The tensor-core product (`kermac_backend_triton.product.tensor_core_product_tile`) forms each `BM × BN` tile
of x·zᵀ from operands split as hi = tf32(a), lo = tf32(a − hi) (`kermac_backend_triton.kernel_math.to_tf32`),
and needs the squared norms ‖x‖², ‖z‖² of the tile's rows.  Splitting in the main loop repeats the split of
every row of x for every N tile, and of every row of z for every M tile, and a first k loop over the features
re-reads both operands for the norms; past `kermac_backend_triton.configs.PRODUCT_TC_RESIDENT_D` features
(where x's split rows no longer stay in registers) that work and its registers made the product slower than
writing K and multiplying (docs/dev/triton-product-presplit.md).  So for those products each operand is split
once, by `split_rows`, into a workspace:

* `hi`, `lo` `[*B, R, DP]` float32: the TF32 parts of each row, zero past D up to `DP` = D rounded up to the
  product's `BK` (the main loop then loads whole 16-byte-aligned chunks without masks, and the zeros add
  nothing to x·zᵀ);
* `norm` `[*B, R]` float32: ‖row‖², summed in float32 from the unsplit values (as the in-loop norms were).

The main loop loads the chunks straight into `tl.dot` operands (`split_dot`).  The workspace holds
`(2·DP + 1)·R` float32 values per batch entry of each operand (x's only where z is x itself), computed once per
call: a batch dimension along which the operand is broadcast (stride 0) is split once and the workspace
broadcast along it the same way.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kermac.layout import batch_layout
from kermac_backend_triton.kernel_math import to_tf32
from kermac_backend_triton.pairwise_tensor_cores import dot_3xtf32

__all__ = ["SplitOperand", "split_dot", "split_operand", "split_rows"]

SPLIT_ROWS = 32
"""Rows per program of `split_rows`."""

MAX_GRID_Y = 65535
"""CUDA's largest second grid dimension: `split_rows` takes the batch entries in launches of at most this many."""


# A captured product whose launch key was warmed up must split without compiling: the row count and the batch stride
# that follows it change inside one key.  D and the row and feature strides are fixed by the key, but are not
# specialised either (the variant then depends on nothing but the pointers' alignment; the split is one pass over
# its operand, against the product's pass per tile).
@triton.jit(do_not_specialize=["R", "D", "SAB", "SAR", "SAK"])
def split_rows(
    A, HI, LO, NORM, R, D, DP, SAB, SAR, SAK, BR: tl.constexpr, BD: tl.constexpr
):  # fmt: skip
    """`hi`, `lo`, `norm` (see the module docs) of rows `BR·program_id(0) + [0, BR)` of batch entry
    `program_id(1)` of `A` `[B, R, D]` (strides `SAB`, `SAR`, `SAK`) into the contiguous `[B, R, DP]` and
    `[B, R]` workspaces."""
    bat = tl.program_id(1).to(tl.int64)
    r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    r_in = (r < R)[:, None]
    src = A + bat * SAB + r[:, None] * SAR
    dst = (bat * R + r[:, None]) * DP
    norm = tl.zeros([BR], tl.float32)
    for k0 in range(0, DP, BD):
        k = k0 + tl.arange(0, BD)[None, :]
        a = tl.load(src + k * SAK, mask=r_in & (k < D), other=0.0).to(tl.float32)
        hi = to_tf32(a)
        tl.store(HI + dst + k, hi, mask=r_in & (k < DP))
        tl.store(LO + dst + k, to_tf32(a - hi), mask=r_in & (k < DP))
        norm += tl.sum(a * a, 1)
    tl.store(NORM + bat * R + r, norm, mask=r < R)


class SplitOperand:
    """The workspace of one operand `t` `[*B, R, D]`: `hi`, `lo` `[*B, R, DP]` and `norm` `[*B, R]` (see the
    module docs), broadcast like `t` along its batch dimensions."""

    __slots__ = ("hi", "lo", "norm")

    def __init__(self, hi: torch.Tensor, lo: torch.Tensor, norm: torch.Tensor) -> None:
        self.hi, self.lo, self.norm = hi, lo, norm


def _merged_batch(t: torch.Tensor) -> torch.Tensor | None:
    """`t` `[*B, R, D]` as a `[prod(B), R, D]` view (None where its batch dimensions do not coalesce into one:
    `kermac.layout.batch_layout`)."""
    layout = batch_layout(t.shape[:-2], {"t": t})
    if len(layout.shape) > 1:
        return None
    step = layout.strides["t"][0] if layout.shape else 0
    return t.as_strided((layout.size, *t.shape[-2:]), (step, t.stride(-2), t.stride(-1)))


def split_operand(t: torch.Tensor, block_k: int) -> SplitOperand | None:
    """Split `t` `[*B, R, D]` (float32; on a GPU, with its device current, on that device's current stream) for the
    tensor-core product whose
    feature step is `block_k`; None where its batch dimensions, once broadcast ones are dropped, do not merge
    into one (the product then splits in its main loop)."""
    compact = t
    for i in range(t.dim() - 2):
        if t.stride(i) == 0 and t.shape[i] > 1:
            compact = compact.narrow(i, 0, 1)
    rows3 = _merged_batch(compact)
    if rows3 is None:
        return None
    count, rows, d = rows3.shape
    dp = triton.cdiv(d, block_k) * block_k
    hi = torch.empty(count, rows, dp, device=t.device, dtype=torch.float32)
    lo = torch.empty_like(hi)
    norm = torch.empty(count, rows, device=t.device, dtype=torch.float32)
    if rows:
        sab, sar, sak = rows3.stride()
        for first in range(0, count, MAX_GRID_Y):
            last = min(count, first + MAX_GRID_Y)
            split_rows[(triton.cdiv(rows, SPLIT_ROWS), last - first)](
                rows3[first:last], hi[first:last], lo[first:last], norm[first:last], rows, d, dp, sab, sar, sak,
                BR=SPLIT_ROWS, BD=block_k,
            )  # fmt: skip
    batch = compact.shape[:-2]
    full = t.shape[:-2]
    return SplitOperand(
        hi.view(*batch, rows, dp).expand(*full, rows, dp),
        lo.view(*batch, rows, dp).expand(*full, rows, dp),
        norm.view(*batch, rows).expand(*full, rows),
    )


@triton.jit
def split_dot(XH, XL, ZH, ZL, ZN, om, on, M, N, DP, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """`(x·zᵀ, ‖z‖²)`: the `[BM, BN]` tile of x·zᵀ in 3×TF32 for rows `om` `[BM]` of x and `on` `[BN]` of z
    (clamped into `M`, `N`) from their split workspaces (rows of `DP` features), and the norms `[BN]` of its
    rows of z (`ZN`)."""
    kr = tl.arange(0, BK)[None, :]
    xrow = (om % M)[:, None] * DP
    zrow = (on % N)[:, None] * DP
    dot = tl.zeros([BM, BN], tl.float32)
    for k0 in range(0, DP, BK):
        xh = tl.load(XH + xrow + k0 + kr)
        xl = tl.load(XL + xrow + k0 + kr)
        zh = tl.load(ZH + zrow + k0 + kr)
        zl = tl.load(ZL + zrow + k0 + kr)
        dot = dot_3xtf32(xh, xl, tl.trans(zh), tl.trans(zl), dot)
    return dot, tl.load(ZN + (on % N))
