"""``L Lᵀ X = B`` from Cholesky factors: blocked substitution on inverted diagonal blocks, on cuBLAS.

cuSOLVER's xpotrs runs two triangular solves whose kernels, for a few right-hand sides, wait on
one another: 10.3 ms for N = 16384 and K = 16 on an H100, about 1 ms per N = 2048 entry (a
tenth of the bandwidth bound). Here the diagonal blocks ``L_ss`` (``nb × nb``, see :func:`block_size`; the
last one smaller) of every factor are inverted once, in one batched triangular solve against identities,
and the two substitutions become matrix products, every entry of a batch in one call per step:

    forward,  s = 0 … S−1:   Y_s = L_ss⁻¹ X_s;       X_{>s} −= L_{>s,s} Y_s
    backward, s = S−1 … 0:   X_s = L_ss⁻ᵀ Y_s;       Y_{<s} −= L_{s,<s}ᵀ X_s

``X`` holds the right-hand sides and receives the solution; ``Y`` is a scratch of the same shape
(cuBLAS products cannot write over an input, so the two alternate as input and output). Each
factor is stored as cuSOLVER left it: ``L`` in the lower triangle of a column-major matrix, or
``U = Lᵀ`` in the upper triangle (a row-major torch matrix factored in place), read with the
transposed operation. Inverting the diagonal blocks is what blocked triangular solvers for GPUs
do (MAGMA's trsm); its error is bounded by the conditioning of ``L_ss``, never worse than ``L``'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._cublas import blas
from ._layout import entry_pointers

__all__ = ["Factors", "block_size", "solve_factored", "solve_workspace_bytes"]


def block_size(n: int) -> int:
    """Diagonal block size ``nb`` for factors of order ``n``.

    Measured on an H100 (float32, K = 16, ``docs/linalg.md``): nb = 128/256/512 took 4.33/4.37/
    4.52 ms for a batch of 8 × 2048 and 45.4/45.3/44.3 ms for one 16384 solve (factorisation
    included): fewer, larger steps pay off only once the products are large.
    """
    return 256 if n < 8192 else 512


@dataclass(frozen=True)
class Factors:
    """Cholesky factors as cuSOLVER left them: entry pointers, leading dimension, triangle stored."""

    pointers: list[int]
    ld: int
    upper: bool


def solve_workspace_bytes(n: int, k: int, factors: int, solves: int, itemsize: int) -> int:
    """Device scratch of :func:`solve_factored`: inverted diagonal blocks, ``Y`` and pointer arrays."""
    if n == 0 or k == 0 or solves == 0:
        return 0
    nb = min(n, block_size(n))
    steps = -(-n // nb)
    return itemsize * (factors * steps * nb * nb + solves * n * k) + 8 * (2 * factors * steps + 12 * steps * solves)


def solve_factored(factors: Factors, n: int, X: torch.Tensor, ldb: int, reads: list[int]) -> None:
    """Overwrite ``X [*batch, N, K]`` (column-major entries, leading dimension ``ldb``) with ``(L Lᵀ)⁻¹ X``.

    Entry ``j`` of X (row-major order of the batch) is solved with factor ``reads[j]``. Queued on
    torch's current stream of X's device; no host synchronisation.
    """
    k = X.shape[-1]
    solves = len(reads)
    if n == 0 or k == 0 or solves == 0:
        return
    device, dtype = X.device, X.dtype
    b = blas(device, dtype)
    f = X.element_size()
    nb = min(n, block_size(n))
    starts = list(range(0, n, nb))
    sizes = [min(nb, n - i) for i in starts]
    entries = len(factors.pointers)

    inverses = torch.eye(nb, dtype=dtype, device=device).expand(entries, len(starts), nb, nb).contiguous()
    Y = torch.empty((solves, k, n), dtype=dtype, device=device)
    x_ptrs = entry_pointers(X)
    inv_ptrs = [
        inverses.data_ptr() + f * nb * nb * (e * len(starts) + s) for e in range(entries) for s in range(len(starts))
    ]
    y_ptrs = [Y.data_ptr() + f * n * k * j for j in range(solves)]

    table = []  # the pointer arrays of every call, in call order: copied to the device at once
    full = [s for s, m in enumerate(sizes) if m == nb]
    parts = [full, [s for s, m in enumerate(sizes) if m != nb]]
    for part in parts:
        if part:
            table.append([_block(factors, a, starts[s], starts[s], f) for a in factors.pointers for s in part])
            table.append([inv_ptrs[e * len(starts) + s] for e in range(entries) for s in part])
    for s, i in enumerate(starts):
        m = sizes[s]
        inv = [inv_ptrs[a * len(starts) + s] for a in reads]
        table += [inv, [x + f * i for x in x_ptrs], [y + f * i for y in y_ptrs]]
        if i + m < n:
            below = [_block(factors, factors.pointers[a], i + m, i, f) for a in reads]
            table += [below, [y + f * i for y in y_ptrs], [x + f * (i + m) for x in x_ptrs]]
        table += [inv, [y + f * i for y in y_ptrs], [x + f * i for x in x_ptrs]]
        if i > 0:
            left = [_block(factors, factors.pointers[a], i, 0, f) for a in reads]
            table += [left, [x + f * i for x in x_ptrs], list(y_ptrs)]
    flat = torch.tensor([p for row in table for p in row], dtype=torch.int64)
    arrays = flat.pin_memory().to(device, non_blocking=True)
    base, step = arrays.data_ptr(), 8
    offsets, at = [], 0
    for row in table:
        offsets.append(base + step * at)
        at += len(row)
    rows = iter(offsets)

    # Invert the diagonal blocks: op(T_ss) Z = I with op(T_ss) = L_ss (stored lower, or upper and transposed).
    tri = b.upper if factors.upper else b.lower
    op_l = b.trans if factors.upper else b.no_trans
    for part in parts:
        if part:
            m = sizes[part[0]]
            diag, inv = next(rows), next(rows)
            b.trsm_batched(
                b.handle, b.left, tri, op_l, b.non_unit, m, m, b.one, diag, factors.ld, inv, nb, entries * len(part)
            )
    forward, backward = [], []
    for s, i in enumerate(starts):
        m = sizes[s]
        forward.append((b.no_trans, m, m, b.zero, next(rows), nb, next(rows), ldb, next(rows), n))
        if i + m < n:
            op = b.trans if factors.upper else b.no_trans
            forward.append((op, n - i - m, m, b.one, next(rows), factors.ld, next(rows), n, next(rows), ldb))
        backward.append([(b.trans, m, m, b.zero, next(rows), nb, next(rows), n, next(rows), ldb)])
        if i > 0:
            op = b.no_trans if factors.upper else b.trans
            backward[-1].append((op, i, m, b.one, next(rows), factors.ld, next(rows), ldb, next(rows), n))
    for call in forward + [c for calls in reversed(backward) for c in calls]:
        _product(b, call, k, solves)


def _product(b, call: tuple, k: int, solves: int) -> None:
    """``C = alpha op(A) B + beta C`` for every solve; ``alpha`` is −1 for updates, 1 for diagonal blocks."""
    op, m, depth, beta, a, lda, bb, ldb, c, ldc = call
    alpha = b.one if beta == b.zero else b.minus_one
    b.gemm_batched(b.handle, op, b.no_trans, m, k, depth, alpha, a, lda, bb, ldb, beta, c, ldc, solves)


def _block(factors: Factors, pointer: int, row: int, col: int, f: int) -> int:
    """Address of ``L[row, col]`` as stored: ``L`` column-major, or ``U = Lᵀ`` (so ``U[col, row]``)."""
    if factors.upper:
        row, col = col, row
    return pointer + f * (row + col * factors.ld)
