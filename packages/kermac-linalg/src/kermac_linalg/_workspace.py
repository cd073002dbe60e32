"""Workspace queries: the device and host memory a call allocates besides its inputs and outputs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ._cholesky import potrf_workspace
from ._dispatch import max_streams
from ._eigh import syevd_workspace, syevdx_workspace
from ._finite import scratch_bytes
from ._lu import getrf_workspace
from ._trsolve import solve_workspace_bytes
from ._validate import DTYPES, check_range

__all__ = ["OPERATIONS", "WorkspaceSize", "workspace_size"]

OPERATIONS = ("cholesky", "cholesky_solve", "solve", "eigh", "eigh_range")


@dataclass(frozen=True)
class WorkspaceSize:
    """Memory one call of `op` needs for matrices of one shape, dtype and device.

    Attributes:
        op: the operation.
        entries: matrices factored (the batch entries of A).
        streams: entries in flight at once; each stream holds one device workspace.
        device_bytes_per_entry: cuSOLVER's device workspace for one matrix.
        host_bytes_per_entry: cuSOLVER's host workspace for one matrix.
        device_bytes: everything a call allocates on the device besides its inputs and
            outputs: `streams * device_bytes_per_entry`, plus the pivots of `solve`
            (12 N bytes per entry: cuSOLVER's int64 and laswp's int32), the substitution
            scratch of `cholesky_solve` and `solve` (the inverted diagonal blocks, 256²
            or 512² from N = 8192, of each triangle of every factor, an `N × K` matrix and
            the pointer arrays per right-hand-side entry), the int32 status per entry and the
            check for NaN and infinities in the inputs (`(V (itemsize + 1) + 1)` bytes per
            entry and matrix read, V = 1 for a whole matrix and at most `⌊log₂ N⌋ + 2` for a
            lower triangle; one more byte per entry for a solve, which checks A and B).
        host_bytes: `streams * host_bytes_per_entry`.
        copy_bytes: the working copy of A, made unless `overwrite_a` lets the call work in
            A's memory (add it to `device_bytes` for a call without `overwrite_a`).
    """

    op: str
    entries: int
    streams: int
    device_bytes_per_entry: int
    host_bytes_per_entry: int
    device_bytes: int
    host_bytes: int
    copy_bytes: int


def workspace_size(
    op: str,
    A: torch.Tensor | Sequence[int],
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    il: int | None = None,
    iu: int | None = None,
    vl: float | None = None,
    vu: float | None = None,
    top_k: int | None = None,
    k: int = 1,
) -> WorkspaceSize:
    """Workspace of `op` for A (a CUDA tensor, or a shape `[..., N, N]` with dtype and device).

    Args:
        op: one of `"cholesky"`, `"cholesky_solve"`, `"solve"`, `"eigh"`, `"eigh_range"`.
        A: the matrix (only its shape, dtype and device are used) or its shape.
        dtype: with a shape: torch.float32 (default) or torch.float64.
        device: with a shape: a CUDA device (default: the current one).
        il: for `"eigh_range"`: the first eigenpair index (as in `eigh_range`).
        iu: for `"eigh_range"`: the last eigenpair index.
        vl: for `"eigh_range"`: the lower end of the eigenvalue interval (vl, vu].
        vu: for `"eigh_range"`: the upper end of the eigenvalue interval.
        top_k: for `"eigh_range"`: the k largest eigenpairs.
        k: for `"cholesky_solve"` and `"solve"`: the right-hand sides per entry (columns
            of B); the batch of B is taken to be A's.

    The streams counted are the ones a call uses now (`min(entries, max_streams())`). CPU
    tensors go through torch.linalg, whose LAPACK workspaces torch manages: not reported here.
    """
    if op not in OPERATIONS:
        raise ValueError(f"op must be one of {', '.join(OPERATIONS)}; got {op!r}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k must be a non-negative int (right-hand sides per entry), got {k!r}")
    if op != "eigh_range" and any(v is not None for v in (il, iu, vl, vu, top_k)):
        raise ValueError(f"il, iu, vl, vu and top_k select eigenpairs for eigh_range, not for {op!r}")
    shape, dtype, device = _problem(A, dtype, device)
    n = shape[-1]
    entries = 1
    for size in shape[:-2]:
        entries *= size
    itemsize = torch.empty((), dtype=dtype).element_size()
    lda = max(1, n)
    if n == 0 or entries == 0:
        per_device = per_host = 0
    elif op in ("cholesky", "cholesky_solve"):
        per_device, per_host = potrf_workspace(device, dtype, n, lda)
    elif op == "solve":
        per_device, per_host = getrf_workspace(device, dtype, n, lda)
    elif op == "eigh":
        per_device, per_host = syevd_workspace(device, dtype, n, lda)
    else:
        sel = check_range(n, il=il, iu=iu, vl=vl, vu=vu, top_k=top_k)
        per_device, per_host = syevdx_workspace(device, dtype, n, lda, sel)
    streams = min(entries, max_streams())
    extra = entries * (4 + (12 * n if op == "solve" else 0))
    extra += entries * scratch_bytes(n, n, itemsize, lower=op != "solve")
    if op in ("cholesky_solve", "solve"):
        extra += entries * (scratch_bytes(n, k, itemsize, lower=False) + 1)
        extra += solve_workspace_bytes(n, k, entries, entries, itemsize, triangles=2 if op == "solve" else 1)
    return WorkspaceSize(
        op=op,
        entries=entries,
        streams=streams,
        device_bytes_per_entry=per_device,
        host_bytes_per_entry=per_host,
        device_bytes=streams * per_device + extra,
        host_bytes=streams * per_host,
        copy_bytes=entries * n * n * itemsize,
    )


def _problem(
    A: torch.Tensor | Sequence[int], dtype: torch.dtype | None, device: torch.device | str | None
) -> tuple[tuple[int, ...], torch.dtype, torch.device]:
    if isinstance(A, torch.Tensor):
        if dtype is not None or device is not None:
            raise TypeError("dtype and device are taken from A when A is a tensor; pass them only with a shape")
        shape, dtype, device = tuple(A.shape), A.dtype, A.device
    else:
        valid = isinstance(A, Sequence) and not isinstance(A, str)
        valid = valid and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in A)
        if not valid:
            raise TypeError(f"A must be a tensor or a shape (a sequence of non-negative ints), got {A!r}")
        shape = tuple(A)
        dtype = torch.float32 if dtype is None else dtype
        device = torch.device("cuda") if device is None else torch.device(device)
    if dtype not in DTYPES:
        raise TypeError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    if len(shape) < 2 or shape[-1] != shape[-2]:
        raise ValueError(f"A must have shape [..., N, N], got {shape}")
    if device.type != "cuda":
        raise ValueError(
            f"device must be a CUDA device, got {device}: on the CPU torch.linalg's LAPACK manages its own workspaces"
        )
    if not torch.cuda.is_available():
        raise RuntimeError("workspace_size asks cuSOLVER and needs a CUDA device; torch.cuda.is_available() is False")
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return shape, dtype, device
