"""The 1-D block-cyclic column layout cusolverMg works on, mapped to row blocks of torch tensors.

cusolverMg splits an `N × N` column-major matrix into blocks of `block` columns and deals them
to `G` devices in turn: block `b` (columns `b·block .. (b+1)·block − 1`) lives on device
`b mod G`.  Each device stores its blocks side by side as a column-major `N × (k·block)` array
(leading dimension N), the last block padded.

A row-major `[k·block, N]` torch tensor seen as column-major is an `N × k·block` matrix, so a
device's local array is the owned columns stacked as *rows*: rows of Aᵀ on the way in (cuSOLVER
then sees A itself and reads its lower triangle, as torch does), and eigenvectors (columns of
cuSOLVER's result) as rows of Vᵀ on the way back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["BlockCyclic"]


@dataclass(frozen=True)
class BlockCyclic:
    """Column blocks of `block` for an `n × n` matrix dealt to `devices` devices in turn."""

    n: int
    block: int
    devices: int

    @property
    def blocks(self) -> int:
        """Number of column blocks, the last one possibly partial."""
        return -(-self.n // self.block)

    def owned(self, g: int) -> range:
        """The block indices held by the g-th device, in local order."""
        return range(g, self.blocks, self.devices)

    def local_rows(self, g: int) -> int:
        """Rows of the g-th device's local `[rows, n]` tensor (whole blocks, padding included)."""
        return len(self.owned(g)) * self.block

    def spans(self, g: int) -> list[tuple[int, int, int]]:
        """`(global_start, local_start, rows)` of every block of the g-th device."""
        return [
            (b * self.block, i * self.block, min(self.block, self.n - b * self.block))
            for i, b in enumerate(self.owned(g))
        ]

    def scatter(self, A: torch.Tensor, local: list[torch.Tensor]) -> None:
        """Copy the rows of `A [n, n]` (pass `A.mT` for its columns) into the local tensors.

        The padding rows of a partial last block are zeroed.
        """
        for g, dst in enumerate(local):
            for start, at, rows in self.spans(g):
                dst[at : at + rows].copy_(A[start : start + rows], non_blocking=True)
                if rows < self.block:
                    dst[at + rows : at + self.block].zero_()

    def gather(self, local: list[torch.Tensor], out: torch.Tensor) -> None:
        """Copy the local tensors' rows back into `out [n, n]` (padding rows dropped)."""
        for g, src in enumerate(local):
            for start, at, rows in self.spans(g):
                out[start : start + rows].copy_(src[at : at + rows], non_blocking=True)
