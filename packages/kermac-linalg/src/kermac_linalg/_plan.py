"""Which cuSOLVER calls a batched solve makes.

A solve with broadcast batches factors every distinct matrix of A once, then solves each
right-hand-side entry that reads it, on the same stream. Right-hand-side entries that lie next
to each other as column blocks of one column-major matrix (the usual case for the solution
buffer made here) are solved by one call with their columns together.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._layout import broadcast_reads, entry_pointers

__all__ = ["SolveCall", "solve_plan"]


@dataclass(frozen=True)
class SolveCall:
    """One xpotrs/xgetrs call: `columns` right-hand sides starting at `rhs`; status at `info`."""

    rhs: int
    columns: int
    info: int


def solve_plan(
    a_batch: torch.Size, batch: torch.Size, X: torch.Tensor, ldb: int, info: torch.Tensor
) -> list[list[SolveCall]]:
    """For each entry of A's batch, the solve calls on the entries of `X` that read it.

    `X [*batch, N, K]` is column-major per entry with leading dimension `ldb`; `info` is a
    contiguous int32 tensor of shape `batch` that receives each call's status.
    """
    k = X.shape[-1]
    groups: list[list[int]] = [[] for _ in range(_numel(a_batch))]
    for j, a in enumerate(broadcast_reads(a_batch, batch)):
        groups[a].append(j)
    if k == 0:
        return [[] for _ in groups]
    x_ptrs = entry_pointers(X)
    block = ldb * k * X.element_size()
    plan = []
    for entries in groups:
        calls: list[SolveCall] = []
        for j in entries:
            last = calls[-1] if calls else None
            if last is not None and x_ptrs[j] == last.rhs + last.columns // k * block:
                calls[-1] = SolveCall(last.rhs, last.columns + k, last.info)
            else:
                calls.append(SolveCall(x_ptrs[j], k, info.data_ptr() + 4 * j))
        plan.append(calls)
    return plan


def _numel(shape: torch.Size) -> int:
    count = 1
    for size in shape:
        count *= size
    return count
