"""Memory layouts: how cuSOLVER (column-major) addresses torch tensors, and when work can be in place.

A torch matrix entry `[R, C]` with strides `(sr, sc)` is, to cuSOLVER:

* *column-major* when `sr == 1` and `sc >= R`: the matrix itself, leading dimension `sc`;
* *transposed* when `sc == 1` and `sr >= C` (torch's default row-major layout): cuSOLVER sees
  its transpose `[C, R]` with leading dimension `sr`.

Symmetric inputs (Cholesky, eigh) work in either layout, swapping the triangle read. LU works in
either too, solving with the transposed factor. Right-hand sides must be column-major, because
xpotrs/xgetrs have no transposed form for B: `torch.linalg.solve` returns its solution in this
same column-major layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "Layout",
    "batch_offsets",
    "broadcast_index_strides",
    "broadcast_reads",
    "column_major_ld",
    "entries_disjoint",
    "entry_pointers",
    "matrix_layout",
    "rhs_alias_ok",
    "vectors_view",
    "working_matrix",
    "working_rhs",
]


@dataclass(frozen=True)
class Layout:
    """How cuSOLVER sees each matrix entry: `transposed` (rows contiguous) and leading dim `ld`."""

    transposed: bool
    ld: int


def matrix_layout(t: torch.Tensor) -> Layout | None:
    """The layout cuSOLVER can use on `t [..., R, C]` without a copy, or None if there is none."""
    r, c = t.shape[-2:]
    sr, sc = t.stride()[-2:]
    if (c == 1 or sc == 1) and (r == 1 or sr >= max(1, c)):
        return Layout(True, sr if r > 1 else max(1, c))
    ld = column_major_ld(t)
    return None if ld is None else Layout(False, ld)


def column_major_ld(t: torch.Tensor) -> int | None:
    """Leading dimension of `t [..., R, C]` read as column-major, or None if it is not."""
    r, c = t.shape[-2:]
    sr, sc = t.stride()[-2:]
    if (r == 1 or sr == 1) and (c == 1 or sc >= max(1, r)):
        return sc if c > 1 else max(1, r)
    return None


def entries_disjoint(t: torch.Tensor) -> bool:
    """True if no two batch entries of `t [..., R, C]` share memory (so each can be written)."""
    r, c = t.shape[-2:]
    sr, sc = t.stride()[-2:]
    extent = 1 + (r - 1) * sr + (c - 1) * sc
    dims = sorted((stride, size) for size, stride in zip(t.shape[:-2], t.stride()[:-2], strict=True) if size > 1)
    for stride, size in dims:
        if stride < extent:
            return False
        extent += stride * (size - 1)
    return True


def batch_offsets(shape: torch.Size | tuple[int, ...], strides: tuple[int, ...]) -> list[int]:
    """Element offset of every batch entry, in row-major order of the batch index."""
    offsets = [0]
    for size, stride in zip(shape, strides, strict=True):
        offsets = [o + i * stride for o in offsets for i in range(size)]
    return offsets


def entry_pointers(t: torch.Tensor) -> list[int]:
    """Device address of every batch entry's first element, in row-major order of the batch index."""
    base, size = t.data_ptr(), t.element_size()
    return [base + o * size for o in batch_offsets(t.shape[:-2], t.stride()[:-2])]


def broadcast_index_strides(shape: torch.Size, batch: torch.Size) -> tuple[int, ...]:
    """Strides mapping a batch index of `batch` to the flat entry index of `shape`.

    `shape` broadcasts to `batch` (torch's rule); with `batch_offsets` this gives, for
    every entry of the broadcast batch, which entry of the smaller batch it reads.
    """
    strides = [0] * len(batch)
    step = 1
    for axis in range(1, len(shape) + 1):
        size = shape[-axis]
        strides[-axis] = step if size > 1 else 0
        step *= size
    return tuple(strides)


def broadcast_reads(a_batch: torch.Size, batch: torch.Size) -> list[int]:
    """For every entry of the broadcast `batch` (row-major order), the flat entry of `a_batch` it reads."""
    return batch_offsets(batch, broadcast_index_strides(a_batch, batch))


def working_matrix(
    A: torch.Tensor, overwrite: bool, *, column_major: bool = False
) -> tuple[torch.Tensor, Layout, bool]:
    """The buffer cuSOLVER factors in place: `A` itself if allowed and possible, else a copy.

    Returns `(buffer, layout, aliased)`. `A` is used in place when `overwrite` is set, its
    entries are column- or row-major with a usable leading dimension, and no two entries share
    memory (an expanded batch, say); otherwise a copy is made and `A` is untouched: row-major
    (a plain copy of a contiguous A), or column-major with `column_major` (cuSOLVER's own
    layout, which some routines run faster on; made from row-major CUDA entries by cuBLAS's
    transposing `geam`, faster than an elementwise copy: docs/linalg.md).
    """
    if overwrite:
        layout = matrix_layout(A)
        if layout is not None and entries_disjoint(A):
            return A, layout, True
    ld = max(1, A.shape[-1])
    if column_major:
        work = torch.empty((*A.shape[:-2], A.shape[-1], A.shape[-2]), dtype=A.dtype, device=A.device).mT
        layout = matrix_layout(A)
        if A.is_cuda and layout is not None and layout.transposed and A.shape[-2] > 1:
            from ._cublas import transpose_copy

            transpose_copy(entry_pointers(work), entry_pointers(A), *A.shape[-2:], layout.ld, A.dtype, A.device)
        else:
            work.copy_(A)
        return work, Layout(False, ld), False
    work = A.clone(memory_format=torch.contiguous_format)
    return work, Layout(True, ld), False


def rhs_alias_ok(B: torch.Tensor, batch: torch.Size) -> bool:
    """True if the solution can be written over `B` itself (see `working_rhs`)."""
    return B.shape[:-2] == batch and column_major_ld(B) is not None and entries_disjoint(B)


def working_rhs(
    B: torch.Tensor, batch: torch.Size, overwrite: bool, factors: torch.Tensor
) -> tuple[torch.Tensor, int, bool]:
    """The column-major buffer that receives the solution, and its leading dimension.

    `B` itself when `overwrite` is set and it is column-major per entry (`B.stride(-2) == 1`,
    or a single column), spans the whole broadcast `batch`, has disjoint entries and shares no
    memory with `factors` (the matrices factored in place); otherwise a column-major copy of B
    broadcast to `batch` and `B` is untouched. Returns `(buffer, ld, aliased)`.
    """
    n, k = B.shape[-2:]
    if overwrite and rhs_alias_ok(B, batch) and not _share_memory(B, factors):
        return B, column_major_ld(B), True
    work = torch.empty((*batch, k, n), dtype=B.dtype, device=B.device).mT
    work.copy_(B.expand(*batch, n, k))
    return work, max(1, n), False


def _share_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def vectors_view(buffer: torch.Tensor, layout: Layout) -> torch.Tensor:
    """The torch view of the column-major matrix cuSOLVER wrote into `buffer` (eigenvectors)."""
    return buffer.mT if layout.transposed else buffer
