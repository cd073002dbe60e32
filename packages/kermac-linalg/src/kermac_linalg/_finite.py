"""Which batch entries of a matrix hold a NaN or an infinity: read on the device, no host sync.

`nonfinite(A)` reads every element of each entry `A[..., :, :]`; `nonfinite(A, lower=True)`
reads only the lower triangle (diagonal included), which is all the symmetric operations read,
so that a NaN stored in the other triangle (say, uninitialised memory) does not count.

Each test is `‖·‖_∞` of a strided view of A, reduced per batch entry: torch's inf-norm takes
`|a|` inside the reduction and propagates NaN (`max_propagate_nan` on CUDA), so it is
non-finite exactly when an element read is NaN or ±inf. Unlike a sum it cannot overflow (the
largest `|a|` of finite numbers is finite), and it reads the view where it lies: no temporary
the size of A, only one value per view and batch entry.

The lower triangle is no strided view, so it is covered by views that lie inside it. With
`M = 2^⌊log₂ N⌋` and `e = N − M < M`: the lower triangles of the two `M × M` diagonal squares
`A[:M, :M]` and `A[e:, e:]` (one view with a dimension of 2), and the `e × e` block
`A[M:, :e]` (strictly lower, since `j < e ≤ M ≤ i`), hold every lower element. The lower
triangle of a square of side `h = 2r` is those of its two diagonal squares of side r plus the
`r × r` block below the first; at level l the `2^l` squares of side `M / 2^l` lie at equal
steps along the diagonal, so all their blocks are one view, and the squares of side 1 are the
diagonal. That is `⌊log₂ N⌋ + 2` reductions; they read the `N(N+1)/2` lower elements once
when N is a power of two and at most about `N²` elements (A's size) otherwise.
"""

from __future__ import annotations

import math

import torch

__all__ = ["nonfinite", "scratch_bytes"]


def nonfinite(t: torch.Tensor, *, lower: bool = False) -> torch.Tensor:
    """Bool `[...]` (`t`'s batch shape, on its device): True where entry `t[..., :, :]` holds NaN or ±inf.

    `t [..., R, C]` is any float tensor (strided, expanded, overlapping views are read in
    place); with `lower` it must be square and only its lower triangle is read. Queues one
    reduction per view (1, or `⌊log₂ N⌋ + 2` at most with `lower`) and two tiny kernels on
    the `[views, ...]` norms, and never waits for the device; allocates
    `scratch_bytes` per batch entry, the result included.
    """
    t = t.detach()
    batch = t.shape[:-2]
    if t.shape[-1] == 0 or t.shape[-2] == 0:
        return torch.zeros(batch, dtype=torch.bool, device=t.device)
    views = _lower_cover(t) if lower else [t]
    norms = torch.empty((len(views), *batch), dtype=t.dtype, device=t.device)
    for norm, view in zip(norms, views, strict=True):
        torch.linalg.vector_norm(view, math.inf, dim=tuple(range(len(batch), view.dim())), out=norm)
    return norms.isfinite().all(dim=0).logical_not_()


def scratch_bytes(rows: int, cols: int, itemsize: int, *, lower: bool) -> int:
    """Device bytes per batch entry that `nonfinite` allocates for `[rows, cols]` entries.

    One norm (`itemsize` bytes) and one bool per view, and the one-byte result.
    """
    if rows == 0 or cols == 0:
        return 1
    views = len(_lower_cover(torch.empty(rows, cols, device="meta"))) if lower else 1
    return views * (itemsize + 1) + 1


def _lower_cover(t: torch.Tensor) -> list[torch.Tensor]:
    """Views of `t [..., N, N]` (N >= 1) inside its lower triangle that together hold all of it."""
    n = t.shape[-1]
    batch, bstrides = list(t.shape[:-2]), list(t.stride()[:-2])
    sr, sc = t.stride()[-2:]
    step = sr + sc  # from one diagonal element to the next
    base = t.storage_offset()
    m = 1 << (n.bit_length() - 1)
    e = n - m
    squares = 2 if e else 1  # A[:M, :M] and A[e:, e:], e diagonal steps apart

    def view(shape: list[int], strides: list[int], offset: int) -> torch.Tensor:
        return t.as_strided(batch + shape, bstrides + strides, base + offset)

    views = []
    if e:
        views.append(view([e, e], [sr, sc], m * sr))
    side = m
    while side > 1:
        half = side // 2
        # The block below the first half-square of each of the (m // side) squares of this side.
        views.append(view([squares, m // side, half, half], [e * step, side * step, sr, sc], half * sr))
        side = half
    views.append(view([squares, m], [e * step, step], 0))  # the squares of side 1: the diagonal
    return views
