"""General solves by LU with partial pivoting: cuSOLVER xgetrf / xgetrs, batched over streams.

cuSOLVER is column-major: a row-major torch matrix ``A`` is ``Aᵀ`` to it. Its LU is then the
LU of ``Aᵀ``, and the solve uses the transposed operation, ``(Aᵀ)ᵀ X = A X = B``; a
column-major A is factored as it is and solved without transposition. Either way the system
solved is ``A X = B`` for the torch matrix A.
"""

from __future__ import annotations

import torch

from . import _cpu
from ._cusolver import api, data_type, query
from ._dispatch import fork_join, use_threads
from ._layout import entry_pointers, working_matrix, working_rhs
from ._plan import solve_plan
from ._status import combine_info, poison_failed, raise_for_info
from ._validate import check_flag, check_matrix, check_rhs

__all__ = ["getrf_workspace", "solve"]


def solve(
    A: torch.Tensor,
    B: torch.Tensor,
    *,
    overwrite_a: bool = False,
    overwrite_b: bool = False,
    check: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Solve ``A X = B`` for general square A by LU with partial pivoting (xgetrf + xgetrs).

    Args:
        A: ``[..., N, N]`` float32/float64, CPU or CUDA.
        B: ``[..., N, K]``, same dtype and device; batch dimensions broadcast with A's
            (``torch.linalg.solve``'s rule); each distinct matrix of A is factored once.
        overwrite_a: factor in A's memory (A then holds the LU factors of A or Aᵀ, depending
            on its layout) when each entry is row- or column-major and no two overlap;
            otherwise a copy is factored. On the CPU A is left untouched.
        overwrite_b: write X over B (``X`` is ``B``) when each entry of B is column-major
            (``B.stride(-2) == 1`` or K = 1), B spans the whole broadcast batch and its
            entries do not overlap; otherwise X is a new tensor and B is untouched.
        check: synchronise and raise :class:`~kermac_linalg.LinalgError` on failed entries.

    Returns:
        ``(X, info)``: ``X [*batch, N, K]`` (column-major entries, like ``torch.linalg.solve``);
        ``info [*batch]`` int32 on the device, ``i > 0`` (NaN in X) where A is singular: pivot
        i of the LU factorisation is exactly zero (on CUDA, of the LU of Aᵀ when A's entries are
        row-major, as cuSOLVER sees them, so i may differ from LAPACK's).
    """
    n = check_matrix("A", A)
    batch, _k = check_rhs(A, B)
    check_flag("overwrite_a", overwrite_a)
    check_flag("overwrite_b", overwrite_b)
    check_flag("check", check)
    if A.is_cuda:
        X, info = _solve_gpu(A, B, n, batch, overwrite_a, overwrite_b)
    else:
        X, info = _cpu.solve(A, B, batch, overwrite_b)
    if check:
        raise_for_info("solve", info)
    return X, info


def getrf_workspace(device: torch.device, dtype: torch.dtype, n: int, lda: int) -> tuple[int, int]:
    """``(device_bytes, host_bytes)`` one xgetrf of an ``N x N`` matrix needs (pivots not included)."""
    x, dt = api(), data_type(dtype)
    return query(device, lambda h, p: x.dn.xgetrf_buffer_size(h, p, n, n, dt, 0, lda, dt))


def _solve_gpu(
    A: torch.Tensor, B: torch.Tensor, n: int, batch: torch.Size, overwrite_a: bool, overwrite_b: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    buf, layout, _ = working_matrix(A, overwrite_a)
    X, ldb, _ = working_rhs(B, batch, overwrite_b, buf)
    a_batch = A.shape[:-2]
    factor_info = torch.zeros(a_batch, dtype=torch.int32, device=A.device)
    solve_info = torch.zeros(batch, dtype=torch.int32, device=A.device)
    a_ptrs = entry_pointers(buf)
    if n > 0 and a_ptrs and solve_info.numel() > 0:
        x, dt = api(), data_type(A.dtype)
        op = x.trans if layout.transposed else x.no_trans
        pivots = torch.empty((*a_batch, n), dtype=torch.int64, device=A.device)
        dbytes, hbytes = getrf_workspace(A.device, A.dtype, n, layout.ld)
        plan = solve_plan(a_batch, batch, X, ldb, solve_info)
        finfo, piv = factor_info.data_ptr(), pivots.data_ptr()

        def issue(t: int, slot, dws: int, hws: int) -> None:
            a, ipiv = a_ptrs[t], piv + 8 * n * t
            x.dn.xgetrf(
                slot.handle,
                slot.params,
                n,
                n,
                dt,
                a,
                layout.ld,
                ipiv,
                dt,
                dws,
                dbytes,
                hws,
                hbytes,
                finfo + 4 * t,
            )
            for call in plan[t]:
                x.dn.xgetrs(
                    slot.handle,
                    slot.params,
                    op,
                    n,
                    call.columns,
                    dt,
                    a,
                    layout.ld,
                    ipiv,
                    dt,
                    call.rhs,
                    ldb,
                    call.info,
                )

        fork_join(A.device, len(a_ptrs), dbytes, hbytes, issue, threads=use_threads(True))
    info = combine_info(factor_info, solve_info, batch)
    poison_failed(info, X)
    return X, info
