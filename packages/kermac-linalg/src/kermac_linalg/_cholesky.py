"""Cholesky factorisation and SPD solves: cuSOLVER xpotrf batched over streams, then cuBLAS substitution."""

from __future__ import annotations

import torch

from . import _cpu
from ._cusolver import api, data_type, lower_uplo, query
from ._dispatch import fork_join, use_threads
from ._finite import nonfinite
from ._layout import (
    Layout,
    broadcast_reads,
    entry_pointers,
    working_matrix,
    working_rhs,
)
from ._status import finish
from ._trsolve import Triangle, substitute
from ._validate import check_flag, check_matrix, check_overwrite, check_rhs

__all__ = ["cholesky", "cholesky_solve", "potrf_workspace"]


def cholesky(
    A: torch.Tensor, *, upper: bool = False, overwrite_a: bool = False, check: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cholesky factor of symmetric positive-definite matrices: `A = L Lᵀ` (or `A = Uᵀ U`).

    Args:
        A: `[..., N, N]` float32/float64, CPU or CUDA. Only the lower triangle is read
            (like `torch.linalg.cholesky`, also with `upper=True`).
        upper: return `U = Lᵀ` (upper triangular) instead of `L`.
        overwrite_a: factor in A's memory: `L` is `A` itself (`U` is `A.mT`), no copy.
            Possible when each entry of A is row- or column-major with no two entries
            overlapping; otherwise (an expanded batch, a strided view) a copy is factored and
            A is untouched. Refused (ValueError) for an A that requires grad.
        check: synchronise and raise [`LinalgError`][kermac_linalg.LinalgError] listing the entries
            whose factorisation failed.

    Returns:
        `(L, info)`: `L [..., N, N]` triangular, the other triangle zero; `info [...]`
        int32 on A's device, 0 where the entry succeeded, `i > 0` where its leading minor of
        order i is not positive definite, `NONFINITE_INPUT` where A's lower triangle holds a
        NaN or an infinity (a failed entry of L is NaN; the others are valid).
    """
    n = check_matrix("A", A)
    check_flag("upper", upper)
    check_overwrite("overwrite_a", overwrite_a, "A", A)
    check_flag("check", check)
    bad = nonfinite(A, lower=True)  # queued before the factorisation may overwrite A
    if A.is_cuda:
        L, info = _cholesky_gpu(A, n, overwrite_a)
        L = L.mT if upper else L
    else:
        L, info = _cpu.cholesky(A, upper, overwrite_a)
    return L, finish("cholesky", info, bad, (L,), check)


def cholesky_solve(
    A: torch.Tensor,
    B: torch.Tensor,
    *,
    overwrite_a: bool = False,
    overwrite_b: bool = False,
    check: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Solve `A X = B` for symmetric positive-definite A: factor A (xpotrf), then substitute.

    The substitution runs on cuBLAS, every right-hand-side entry of the batch at once, blocked on
    inverted diagonal blocks of the factor (several times faster than xpotrs for few right-hand
    sides, see `docs/linalg.md`).

    Args:
        A: `[..., N, N]` float32/float64 (its lower triangle is read), CPU or CUDA.
        B: `[..., N, K]`, same dtype and device; batch dimensions broadcast with A's
            (`torch.linalg.solve`'s rule); each distinct matrix of A is factored once.
        overwrite_a: factor in A's memory (A then holds its Cholesky factor in the lower
            triangle); same conditions as [`cholesky`][kermac_linalg._cholesky.cholesky]. On the CPU A is left
            untouched.
        overwrite_b: write X over B: `X` is `B`, no copy. Possible when each entry of B is
            column-major (`B.stride(-2) == 1`, e.g. `B = C.mT` for a contiguous `C [..., K, N]`,
            or K = 1), B spans the whole broadcast batch and its entries do not overlap;
            otherwise X is a new tensor and B is untouched. Both flags are refused
            (ValueError) for an input that requires grad.
        check: synchronise and raise [`LinalgError`][kermac_linalg.LinalgError] on failed entries.

    Returns:
        `(X, info)`: `X [*batch, N, K]` (column-major entries, like `torch.linalg.solve`);
        `info [*batch]` int32 on the device, non-zero (NaN in X) where A is not positive
        definite (`i > 0`) or where A's lower triangle or B holds a NaN or an infinity
        (`NONFINITE_INPUT`).
    """
    n = check_matrix("A", A)
    batch, _k = check_rhs(A, B)
    check_overwrite("overwrite_a", overwrite_a, "A", A)
    check_overwrite("overwrite_b", overwrite_b, "B", B)
    check_flag("check", check)
    bad = nonfinite(A, lower=True) | nonfinite(B)  # queued before A or B may be overwritten
    if A.is_cuda:
        X, info = _cholesky_solve_gpu(A, B, n, batch, overwrite_a, overwrite_b)
    else:
        X, info = _cpu.cholesky_solve(A, B, batch, overwrite_b)
    return X, finish("cholesky_solve", info, bad, (X,), check)


def potrf_workspace(
    device: torch.device, dtype: torch.dtype, n: int, lda: int, uplo: int | None = None
) -> tuple[int, int]:
    """`(device_bytes, host_bytes)` one xpotrf of an `N x N` matrix needs."""
    x, dt = api(), data_type(dtype)
    fill = x.lower if uplo is None else uplo
    return query(device, lambda h, p: x.dn.xpotrf_buffer_size(h, p, fill, n, dt, 0, lda, dt))


def _factor(buf: torch.Tensor, layout: Layout, n: int, info: torch.Tensor) -> list[int]:
    """xpotrf on every entry of `buf` (in place, over the stream pool); the entries' addresses.

    `info` (shape of `buf`'s batch, int32) receives each entry's status.
    """
    a_ptrs = entry_pointers(buf)
    if n == 0 or not a_ptrs:
        return a_ptrs
    x, dt, uplo = api(), data_type(buf.dtype), lower_uplo(layout.transposed)
    dbytes, hbytes = potrf_workspace(buf.device, buf.dtype, n, layout.ld, uplo)
    info_ptr = info.data_ptr()

    def issue(t: int, slot, dws: int, hws: int) -> None:
        x.dn.xpotrf(
            slot.handle,
            slot.params,
            uplo,
            n,
            dt,
            a_ptrs[t],
            layout.ld,
            dt,
            dws,
            dbytes,
            hws,
            hbytes,
            info_ptr + 4 * t,
        )

    fork_join(buf.device, len(a_ptrs), dbytes, hbytes, issue, threads=use_threads(layout.transposed))
    return a_ptrs


def _cholesky_gpu(A: torch.Tensor, n: int, overwrite_a: bool) -> tuple[torch.Tensor, torch.Tensor]:
    buf, layout, _ = working_matrix(A, overwrite_a, column_major=True)
    info = torch.zeros(A.shape[:-2], dtype=torch.int32, device=A.device)
    _factor(buf, layout, n, info)
    buf.tril_()
    return buf, info


def _cholesky_solve_gpu(
    A: torch.Tensor, B: torch.Tensor, n: int, batch: torch.Size, overwrite_a: bool, overwrite_b: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    buf, layout, _ = working_matrix(A, overwrite_a, column_major=True)
    X, ldb, _ = working_rhs(B, batch, overwrite_b, buf)
    factor_info = torch.zeros(A.shape[:-2], dtype=torch.int32, device=A.device)
    if batch.numel() > 0:
        a_ptrs = _factor(buf, layout, n, factor_info)
        reads = broadcast_reads(A.shape[:-2], batch)
        lower = Triangle(a_ptrs, layout.ld, upper=layout.transposed, transposed=layout.transposed)
        substitute(lower, lower.T, n, X, ldb, reads)
    return X, factor_info.expand(batch).contiguous()
