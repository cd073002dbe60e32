"""The CPU path: the same operations and semantics through `torch.linalg` (LAPACK).

Same results, status tensors and aliasing rules as the GPU path: with `overwrite_*` the
results are written into the input's memory (and alias it) exactly when the GPU path would work
there in place. The public functions then mark non-finite inputs and fill failed entries with
NaN for both paths (`_status.finish`). LAPACK's own workspaces stay inside torch, so on the
CPU this keeps the aliasing contract but saves no memory. Solves leave A untouched.
"""

from __future__ import annotations

import re

import torch

from ._layout import entries_disjoint, matrix_layout, rhs_alias_ok, vectors_view
from ._validate import EigenRange

__all__ = ["cholesky", "cholesky_solve", "eigh", "eigh_range", "solve"]

_ERROR_CODE = re.compile(r"error code: (-?\d+)")


def _can_alias(A: torch.Tensor) -> bool:
    return matrix_layout(A) is not None and entries_disjoint(A)


def cholesky(A: torch.Tensor, upper: bool, overwrite_a: bool) -> tuple[torch.Tensor, torch.Tensor]:
    L, info = torch.linalg.cholesky_ex(A)
    if overwrite_a and _can_alias(A):
        A.copy_(L)
        L = A
    return (L.mT if upper else L), info


def _into_rhs(B: torch.Tensor, X: torch.Tensor, batch: torch.Size, overwrite_b: bool) -> torch.Tensor:
    if overwrite_b and rhs_alias_ok(B, batch):
        B.copy_(X)
        return B
    return X


def cholesky_solve(
    A: torch.Tensor, B: torch.Tensor, batch: torch.Size, overwrite_b: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    L, factor_info = torch.linalg.cholesky_ex(A)
    X = torch.cholesky_solve(B.expand(*batch, *B.shape[-2:]), L)
    info = factor_info.expand(batch).clone(memory_format=torch.contiguous_format)
    return _into_rhs(B, X, batch, overwrite_b), info


def solve(A: torch.Tensor, B: torch.Tensor, batch: torch.Size, overwrite_b: bool) -> tuple[torch.Tensor, torch.Tensor]:
    # B expanded to the full batch so torch.linalg never reads it as a batch of vectors.
    X, factor_info = torch.linalg.solve_ex(A, B.expand(*batch, *B.shape[-2:]))
    info = factor_info.expand(batch).clone(memory_format=torch.contiguous_format)
    return _into_rhs(B, X, batch, overwrite_b), info


def _eigh_entries(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """torch.linalg.eigh with per-entry status: retries entry by entry when the batch fails."""
    batch, n = A.shape[:-2], A.shape[-1]
    info = torch.zeros(batch, dtype=torch.int32)
    try:
        W, V = torch.linalg.eigh(A)
        return W, V, info
    except torch.linalg.LinAlgError:
        pass
    flat = A.reshape(-1, n, n)
    W = torch.full((flat.shape[0], n), torch.nan, dtype=A.dtype)
    V = torch.full((flat.shape[0], n, n), torch.nan, dtype=A.dtype)
    codes = info.view(-1)
    for e in range(flat.shape[0]):
        try:
            W[e], V[e] = torch.linalg.eigh(flat[e])
        except torch.linalg.LinAlgError as err:
            match = _ERROR_CODE.search(str(err))
            if match is None:
                raise
            codes[e] = int(match.group(1))
    return W.reshape(*batch, n), V.reshape(*batch, n, n), info


def eigh(A: torch.Tensor, overwrite_a: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    W, V, info = _eigh_entries(A)
    layout = matrix_layout(A)
    if overwrite_a and layout is not None and entries_disjoint(A):
        view = vectors_view(A, layout)
        view.copy_(V)
        V = view
    return W, V, info


def eigh_range(A: torch.Tensor, sel: EigenRange, overwrite_a: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    W, V, info = _eigh_entries(A)
    n = A.shape[-1]
    if sel.by_index:
        W, V = W[..., sel.il : sel.iu + 1], V[..., :, sel.il : sel.iu + 1]
    else:
        W, V = _select_values(W, V, sel.vl, sel.vu)
    W = W.clone(memory_format=torch.contiguous_format)
    layout = matrix_layout(A)
    if overwrite_a and layout is not None and entries_disjoint(A):
        view = vectors_view(A, layout)[..., :, : W.shape[-1]]
        view.copy_(V)
        return W, view, info
    out = torch.empty((*A.shape[:-2], W.shape[-1], n), dtype=A.dtype).mT
    out.copy_(V)
    return W, out, info


def _select_values(W: torch.Tensor, V: torch.Tensor, vl: float, vu: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenpairs with `vl < w <= vu` (ascending), NaN-padded to the largest count in the batch."""
    first = (W <= vl).sum(-1, keepdim=True)
    count = ((W > vl) & (W <= vu)).sum(-1, keepdim=True)
    m = int(count.max()) if count.numel() else 0
    slots = torch.arange(m)
    index = (first + slots).clamp(max=max(W.shape[-1] - 1, 0))
    valid = slots < count
    W_sel = torch.where(valid, W.gather(-1, index), torch.nan)
    V_sel = V.gather(-1, index.unsqueeze(-2).expand(*V.shape[:-1], m))
    V_sel = torch.where(valid.unsqueeze(-2), V_sel, torch.nan)
    return W_sel, V_sel
