"""Symmetric eigendecompositions: cuSOLVER xsyevd (all pairs) and xsyevdx (a range), batched."""

from __future__ import annotations

import ctypes
import logging

import torch

from . import _cpu
from ._cholesky import cholesky
from ._cusolver import api, data_type, lower_uplo, query
from ._dispatch import fork_join, use_threads
from ._finite import nonfinite
from ._layout import entries_disjoint, entry_pointers, matrix_layout, vectors_view, working_matrix
from ._status import finish
from ._subspace import extreme_eigenpairs
from ._validate import EigenRange, check_flag, check_matrix, check_method, check_overwrite, check_range

logger = logging.getLogger("kermac.linalg")

__all__ = ["eigh", "eigh_range", "syevd_workspace", "syevdx_workspace"]


def eigh(
    A: torch.Tensor, *, overwrite_a: bool = False, check: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Eigenvalues and eigenvectors of symmetric matrices: `A = V diag(L) Vᵀ` (xsyevd).

    Args:
        A: `[..., N, N]` float32/float64, CPU or CUDA; only the lower triangle is read
            (like `torch.linalg.eigh`).
        overwrite_a: compute in A's memory: `V` is a view of A (`A.mT` for a row-major A,
            `A` itself for a column-major one), no copy. Possible when each entry is row- or
            column-major and no two overlap; otherwise a copy is used and A is untouched.
            Refused (ValueError) for an A that requires grad.
        check: synchronise and raise [`LinalgError`][kermac_linalg.LinalgError] on failed entries.

    Returns:
        `(L, V, info)`: eigenvalues `L [..., N]` ascending; orthonormal eigenvectors in the
        columns of `V [..., N, N]` (column-major entries, like `torch.linalg.eigh`);
        `info [...]` int32 on the device, non-zero (NaN in L and V) where the solver did not
        converge (`i > 0`) or A's lower triangle holds a NaN or an infinity (`NONFINITE_INPUT`).
    """
    n = check_matrix("A", A)
    check_overwrite("overwrite_a", overwrite_a, "A", A)
    check_flag("check", check)
    bad = nonfinite(A, lower=True)  # queued before the solver may overwrite A
    if A.is_cuda:
        W, V, info = _eigh_gpu(A, n, overwrite_a, _entries_to_skip(bad))
    else:
        W, V, info = _cpu.eigh(A, overwrite_a)
    return W, V, finish("eigh", info, bad, (W, V), check)


def eigh_range(
    A: torch.Tensor,
    *,
    il: int | None = None,
    iu: int | None = None,
    vl: float | None = None,
    vu: float | None = None,
    top_k: int | None = None,
    method: str = "auto",
    overwrite_a: bool = False,
    check: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Some eigenpairs of symmetric matrices, by index or by value.

    Give exactly one selection:

    * `il`, `iu`: the eigenvalues with ascending indices `il..iu`, 0-based and inclusive
      (either may be left out: 0 and N-1);
    * `vl`, `vu`: the eigenvalues in the half-open interval `(vl, vu]` (either may be left
      out: unbounded);
    * `top_k`: the k largest, i.e. `il = N - k`, `iu = N - 1` (still ascending: the
      largest last), e.g. the leading eigenpairs of a kernel matrix.

    Args:
        A: `[..., N, N]` float32/float64, CPU or CUDA; only the lower triangle is read.
        method: `"direct"`: cuSOLVER's xsyevdx (CPU: LAPACK through torch.linalg.eigh);
            `"iterative"`: block subspace iteration with a certificate (for the k largest or
            smallest pairs, `2k + 32 < N`), falling back to the direct solver for an entry it
            cannot certify; `"auto"` (default): iterative for such ranges when N >= 4096 and
            k <= N / 32, else direct. See docs/linalg.md.
        overwrite_a: direct method: compute in A's memory, `V` is a view of its first M
            columns (of `A.mT` for a row-major A), no copy, under [`eigh`][kermac_linalg._eigh.eigh]'s conditions.
            Iterative method: V is returned in that same view of A (A's contents are lost), but
            a working copy is made all the same. Without it the result is a compact
            `[..., N, M]` tensor and no `N x N` working memory stays referenced. Refused
            (ValueError) for an A that requires grad.
        check: synchronise and raise [`LinalgError`][kermac_linalg.LinalgError] on failed entries.

    Returns:
        `(L, V, info)`: `L [..., M]` ascending, `V [..., N, M]` eigenvectors in columns,
        `info [...]` int32 on the device (non-zero: NaN in that entry; `NONFINITE_INPUT`
        where A's lower triangle holds a NaN or an infinity). M is known beforehand
        for index ranges. For a value range cuSOLVER reports each entry's count on the host;
        M is the largest count in the batch and entries with fewer eigenvalues are padded with
        NaN (count them with `(~L.isnan()).sum(-1)`). cuSOLVER's xsyevdx and the iterative
        method both wait on the host.
    """
    n = check_matrix("A", A)
    sel = check_range(n, il=il, iu=iu, vl=vl, vu=vu, top_k=top_k)
    iterative = check_method(method, sel, n)
    check_overwrite("overwrite_a", overwrite_a, "A", A)
    check_flag("check", check)
    bad = nonfinite(A, lower=True)  # queued before the solver may overwrite A
    if iterative:
        W, V, info = _eigh_range_iterative(A, n, sel, overwrite_a, _entries_to_skip(bad))
    elif A.is_cuda:
        W, V, info = _eigh_range_gpu(A, n, sel, overwrite_a, _entries_to_skip(bad))
    else:
        W, V, info = _cpu.eigh_range(A, sel, overwrite_a)
    return W, V, finish("eigh_range", info, bad, (W, V), check)


def syevd_workspace(
    device: torch.device, dtype: torch.dtype, n: int, lda: int, uplo: int | None = None
) -> tuple[int, int]:
    """`(device_bytes, host_bytes)` one xsyevd (with eigenvectors) of an `N x N` matrix needs."""
    x, dt = api(), data_type(dtype)
    fill = x.lower if uplo is None else uplo
    return query(device, lambda h, p: x.dn.xsyevd_buffer_size(h, p, x.vectors, fill, n, dt, 0, lda, dt, 0, dt))


class _Bounds:
    """Host values cuSOLVER's xsyevdx reads through pointers: vl, vu and the count h_meig."""

    def __init__(self, dtype: torch.dtype, sel: EigenRange):
        scalar = ctypes.c_float if dtype == torch.float32 else ctypes.c_double
        big = torch.finfo(dtype).max  # cuSOLVER gets finite bounds for an unbounded side
        self.vl = scalar(max(sel.vl, -big))
        self.vu = scalar(min(sel.vu, big))
        self.meig = ctypes.c_int64(0)
        self.range = api().range_index if sel.by_index else api().range_value
        # cuSOLVER's indices are 1-based; they are not read for a value range.
        self.il, self.iu = (sel.il + 1, sel.iu + 1) if sel.by_index else (1, 1)

    def pointers(self) -> tuple[int, int]:
        return ctypes.addressof(self.vl), ctypes.addressof(self.vu)


def syevdx_workspace(
    device: torch.device, dtype: torch.dtype, n: int, lda: int, sel: EigenRange, uplo: int | None = None
) -> tuple[int, int]:
    """`(device_bytes, host_bytes)` one xsyevdx of an `N x N` matrix needs for `sel`."""
    x, dt = api(), data_type(dtype)
    fill = x.lower if uplo is None else uplo
    b = _Bounds(dtype, sel)
    vl, vu = b.pointers()
    return query(
        device,
        lambda h, p: x.dn.xsyevdx_buffer_size(
            h,
            p,
            x.vectors,
            b.range,
            fill,
            n,
            dt,
            0,
            lda,
            vl,
            vu,
            b.il,
            b.iu,
            ctypes.addressof(b.meig),
            dt,
            0,
            dt,
        ),
    )


def _entries_to_skip(bad: torch.Tensor) -> list[bool]:
    """The flat batch entries holding NaN or inf (`bad`), read on the host.

    Only for routes that wait on the host anyway (xsyevd and xsyevdx return when their stream is
    done; the iteration synchronises at every step), so the read adds no wait of its own. Those
    entries are never handed to the solver, which may fail on them with an error status
    (CUSOLVER_STATUS_EXECUTION_FAILED) instead of an `info`, or iterate on NaN; their outputs
    stay unwritten, and `_status.finish` fills them with NaN.
    """
    return bad.reshape(-1).tolist()


def _eigh_gpu(
    A: torch.Tensor, n: int, overwrite_a: bool, skip: list[bool]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    buf, layout, _ = working_matrix(A, overwrite_a)
    batch = A.shape[:-2]
    W = torch.empty((*batch, n), dtype=A.dtype, device=A.device)
    info = torch.zeros(batch, dtype=torch.int32, device=A.device)
    a_ptrs = entry_pointers(buf)
    if n > 0 and a_ptrs:
        x, dt, uplo = api(), data_type(A.dtype), lower_uplo(layout.transposed)
        dbytes, hbytes = syevd_workspace(A.device, A.dtype, n, layout.ld, uplo)
        w_ptr, w_step, info_ptr = W.data_ptr(), n * W.element_size(), info.data_ptr()

        def issue(t: int, slot, dws: int, hws: int) -> None:
            if skip[t]:
                return
            x.dn.xsyevd(
                slot.handle,
                slot.params,
                x.vectors,
                uplo,
                n,
                dt,
                a_ptrs[t],
                layout.ld,
                dt,
                w_ptr + w_step * t,
                dt,
                dws,
                dbytes,
                hws,
                hbytes,
                info_ptr + 4 * t,
            )

        fork_join(A.device, len(a_ptrs), dbytes, hbytes, issue, threads=use_threads(True))
    return W, vectors_view(buf, layout), info


def _eigh_range_gpu(
    A: torch.Tensor, n: int, sel: EigenRange, overwrite_a: bool, skip: list[bool]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    buf, layout, aliased = working_matrix(A, overwrite_a)
    batch = A.shape[:-2]
    W = torch.empty((*batch, n), dtype=A.dtype, device=A.device)
    info = torch.zeros(batch, dtype=torch.int32, device=A.device)
    a_ptrs = entry_pointers(buf)
    counts = [0] * len(a_ptrs)
    if n > 0 and a_ptrs:
        x, dt, uplo = api(), data_type(A.dtype), lower_uplo(layout.transposed)
        dbytes, hbytes = syevdx_workspace(A.device, A.dtype, n, layout.ld, sel, uplo)
        bounds = _Bounds(A.dtype, sel)
        vl, vu = bounds.pointers()
        w_ptr, w_step, info_ptr = W.data_ptr(), n * W.element_size(), info.data_ptr()

        def issue(t: int, slot, dws: int, hws: int) -> None:
            if skip[t]:
                return
            counts[t] = x.dn.xsyevdx(
                slot.handle,
                slot.params,
                x.vectors,
                bounds.range,
                uplo,
                n,
                dt,
                a_ptrs[t],
                layout.ld,
                vl,
                vu,
                bounds.il,
                bounds.iu,
                dt,
                w_ptr + w_step * t,
                dt,
                dws,
                dbytes,
                hws,
                hbytes,
                info_ptr + 4 * t,
            )

        fork_join(A.device, len(a_ptrs), dbytes, hbytes, issue, threads=use_threads(True))
    m = sel.count if sel.by_index else max(counts, default=0)
    W_sel = W[..., :m]
    V_sel = vectors_view(buf, layout)[..., :, :m]
    if not aliased:
        # Compact results, so that the N x N working copy is released when this returns.
        W_sel = W_sel.clone(memory_format=torch.contiguous_format)
        V_sel = torch.empty((*batch, m, n), dtype=A.dtype, device=A.device).mT.copy_(V_sel)
    if not sel.by_index:
        _pad_counts(W_sel, V_sel, batch, counts, m)
    return W_sel, V_sel, info


def _pad_counts(W: torch.Tensor, V: torch.Tensor, batch: torch.Size, counts: list[int], m: int) -> None:
    """NaN in the columns past each entry's own count (value ranges find different numbers)."""
    for t, count in enumerate(counts):
        if count < m:
            index = _unravel(t, batch)
            W[index][count:] = torch.nan
            V[index][:, count:] = torch.nan


def _unravel(flat: int, shape: torch.Size) -> tuple[int, ...]:
    index = []
    for size in reversed(shape):
        flat, i = divmod(flat, size)
        index.append(i)
    return tuple(reversed(index))


def _eigh_range_iterative(
    A: torch.Tensor, n: int, sel: EigenRange, overwrite_a: bool, skip: list[bool]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`eigh_range` by certified subspace iteration, entry by entry; direct where it fails.

    Entries marked in `skip` (NaN or inf) are left unwritten.
    """
    batch, k = A.shape[:-2], sel.count
    largest = sel.iu == n - 1
    W = torch.empty((*batch, k), dtype=A.dtype, device=A.device)
    V = torch.empty((*batch, k, n), dtype=A.dtype, device=A.device).mT
    info = torch.zeros(batch, dtype=torch.int32, device=A.device)
    for t, skipped in enumerate(skip):  # one flag per entry, in row-major order of the batch
        if skipped:
            continue
        e = _unravel(t, batch)
        found = extreme_eigenpairs(A[e], k, largest, _factor_in_place)
        if found is None:
            logger.debug("eigh_range: entry %s not certified by subspace iteration; direct solver", e)
            if A.is_cuda:
                W_e, V_e, info[e] = _eigh_range_gpu(A[e], n, sel, False, [False])
            else:
                W_e, V_e, info[e] = _cpu.eigh_range(A[e], sel, False)
        else:
            W_e, V_e = found
        W[e].copy_(W_e)
        V[e].copy_(V_e)
    layout = matrix_layout(A)
    if overwrite_a and layout is not None and entries_disjoint(A):
        view = vectors_view(A, layout)[..., :, :k]
        view.copy_(V)
        V = view
    return W, V, info


def _factor_in_place(C: torch.Tensor) -> torch.Tensor:
    """Status of the Cholesky factorisation of C, computed in C's memory (the certificate).

    C is a working matrix, never the caller's; detached, since it derives from an A that may
    require grad, and `overwrite_a` is refused for tensors that autograd tracks.
    """
    return cholesky(C.detach(), overwrite_a=True)[1]
