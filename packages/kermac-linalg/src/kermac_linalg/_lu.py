"""General solves by LU with partial pivoting: cuSOLVER xgetrf batched over streams, then substitution.

cuSOLVER is column-major. A column-major working matrix (a copy of A, or A itself with
`overwrite_a`) is factored as `A = P L U`; B's rows are interchanged on each entry's stream
(laswp) and, after the join, `X = U⁻¹ L⁻¹ Pᵀ B` is substituted on cuBLAS for the whole batch
at once (`._trsolve`, several times faster than xgetrs for few right-hand sides). A
row-major A factored in place is `Aᵀ` to cuSOLVER: its LU is that of `Aᵀ` and the solve is
cuSOLVER's transposed xgetrs, `(Aᵀ)ᵀ X = A X = B`. Either way the system solved is
`A X = B` for the torch matrix A.
"""

from __future__ import annotations

import torch

from . import _cpu
from ._cusolver import api, data_type, query
from ._dispatch import fork_join, use_threads
from ._finite import nonfinite
from ._layout import broadcast_reads, entry_pointers, working_matrix, working_rhs
from ._plan import solve_plan
from ._status import combine_info, finish
from ._trsolve import Triangle, substitute
from ._validate import check_flag, check_matrix, check_overwrite, check_rhs

__all__ = ["getrf_workspace", "solve"]


def solve(
    A: torch.Tensor,
    B: torch.Tensor,
    *,
    overwrite_a: bool = False,
    overwrite_b: bool = False,
    check: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Solve `A X = B` for general square A by LU with partial pivoting (xgetrf + xgetrs).

    Args:
        A: `[..., N, N]` float32/float64, CPU or CUDA.
        B: `[..., N, K]`, same dtype and device; batch dimensions broadcast with A's
            (`torch.linalg.solve`'s rule); each distinct matrix of A is factored once.
        overwrite_a: factor in A's memory (A then holds the LU factors of A or Aᵀ, depending
            on its layout) when each entry is row- or column-major and no two overlap;
            otherwise a copy is factored. On the CPU A is left untouched.
        overwrite_b: write X over B (`X` is `B`) when each entry of B is column-major
            (`B.stride(-2) == 1` or K = 1), B spans the whole broadcast batch and its
            entries do not overlap; otherwise X is a new tensor and B is untouched. Both flags
            are refused (ValueError) for an input that requires grad.
        check: synchronise and raise [`LinalgError`][kermac_linalg.LinalgError] on failed entries.

    Returns:
        `(X, info)`: `X [*batch, N, K]` (column-major entries, like `torch.linalg.solve`);
        `info [*batch]` int32 on the device, non-zero where the entry failed (NaN in X):
        `i > 0` where A is singular, pivot i of the LU factorisation being exactly zero (on
        CUDA with `overwrite_a` and row-major entries, of the LU of Aᵀ that cuSOLVER factors
        in place, so i may differ from LAPACK's); `NONFINITE_INPUT` where A or B holds a NaN
        or an infinity.
    """
    n = check_matrix("A", A)
    batch, _k = check_rhs(A, B)
    check_overwrite("overwrite_a", overwrite_a, "A", A)
    check_overwrite("overwrite_b", overwrite_b, "B", B)
    check_flag("check", check)
    bad = nonfinite(A) | nonfinite(B)  # queued before A or B may be overwritten
    if A.is_cuda:
        X, info = _solve_gpu(A, B, n, batch, overwrite_a, overwrite_b)
    else:
        X, info = _cpu.solve(A, B, batch, overwrite_b)
    return X, finish("solve", info, bad, (X,), check)


def getrf_workspace(device: torch.device, dtype: torch.dtype, n: int, lda: int) -> tuple[int, int]:
    """`(device_bytes, host_bytes)` one xgetrf of an `N x N` matrix needs (pivots not included)."""
    x, dt = api(), data_type(dtype)
    return query(device, lambda h, p: x.dn.xgetrf_buffer_size(h, p, n, n, dt, 0, lda, dt))


def _solve_gpu(
    A: torch.Tensor, B: torch.Tensor, n: int, batch: torch.Size, overwrite_a: bool, overwrite_b: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    buf, layout, _ = working_matrix(A, overwrite_a, column_major=True)
    X, ldb, _ = working_rhs(B, batch, overwrite_b, buf)
    a_batch = A.shape[:-2]
    factor_info = torch.zeros(a_batch, dtype=torch.int32, device=A.device)
    solve_info = torch.zeros(batch, dtype=torch.int32, device=A.device)
    a_ptrs = entry_pointers(buf)
    if n > 0 and a_ptrs and batch.numel() > 0:
        x, dt = api(), data_type(A.dtype)
        pivots = torch.empty((len(a_ptrs), n), dtype=torch.int64, device=A.device)
        swaps = None if layout.transposed else torch.empty((len(a_ptrs), n), dtype=torch.int32, device=A.device)
        laswp = x.dn.slaswp if A.dtype == torch.float32 else x.dn.dlaswp
        dbytes, hbytes = getrf_workspace(A.device, A.dtype, n, layout.ld)
        plan = solve_plan(a_batch, batch, X, ldb, solve_info)
        finfo = factor_info.data_ptr()

        def issue(t: int, slot, dws: int, hws: int) -> None:
            a, ipiv = a_ptrs[t], pivots[t].data_ptr()
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
            if swaps is not None:  # B's rows interchanged as A's were: Pᵀ B (laswp takes int32 pivots)
                with torch.cuda.stream(slot.stream):
                    swaps[t].copy_(pivots[t])
                for call in plan[t]:
                    laswp(slot.handle, call.columns, call.rhs, ldb, 1, n, swaps[t].data_ptr(), 1)
                return
            for call in plan[t]:
                x.dn.xgetrs(
                    slot.handle,
                    slot.params,
                    x.trans,
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
        if swaps is not None:
            reads = broadcast_reads(a_batch, batch)
            L = Triangle(a_ptrs, layout.ld, upper=False, unit=True)
            substitute(L, Triangle(a_ptrs, layout.ld, upper=True), n, X, ldb, reads)
    return X, combine_info(factor_info, solve_info, batch)
