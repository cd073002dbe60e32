"""Triangular substitution `X ← U⁻¹ L⁻¹ X` with few right-hand sides: inverted diagonal blocks, cuBLAS.

Both solves of a factored system go through here: Cholesky (`L`, `Lᵀ`) and LU (unit `L`,
`U`, after the row interchanges). cuSOLVER's xpotrs/xgetrs run triangular solves whose kernels,
for a few right-hand sides, wait on one another and reach about a tenth of the bandwidth bound
(docs/linalg.md). Here the diagonal blocks
`T_ss` (`nb × nb`, see `block_size`; the last one smaller) of each triangle are
inverted once, in one batched triangular solve against identities, and the substitutions become
matrix products, every entry of a batch in one call per step:

    forward,  s = 0 … S−1:   Y_s = L_ss⁻¹ X_s;       X_{>s} −= L_{>s,s} Y_s
    backward, s = S−1 … 0:   X_s = U_ss⁻¹ Y_s;       Y_{<s} −= U_{<s,s} X_s

`X` holds the right-hand sides and receives the solution; `Y` is a scratch of the same shape
(cuBLAS products cannot write over an input, so the two alternate as input and output). Each
triangle is read where cuSOLVER left it (`Triangle`). When `U = Lᵀ` (Cholesky) the
inverted blocks of L serve U too. Inverting diagonal blocks is what blocked triangular solvers
for GPUs do (MAGMA's trsm); its error is bounded by the conditioning of `T_ss`, never worse
than the triangle's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ._cublas import calls, handle
from ._layout import entry_pointers

__all__ = ["Triangle", "block_size", "solve_workspace_bytes", "substitute"]


def block_size(n: int) -> int:
    """Diagonal block size `nb` for triangles of order `n`.

    Fewer, larger steps pay off only once the products are large (the sweep over nb = 128, 256 and
    512 is in `docs/linalg.md`).
    """
    return 256 if n < 8192 else 512


@dataclass(frozen=True)
class Triangle:
    """A triangular matrix `T` in cuSOLVER's column-major factors, one per batch entry.

    `T` is the `upper` (else lower) triangle of the stored matrices at `pointers` (leading
    dimension `ld`), or its transpose when `transposed`; `unit`: its diagonal is ones
    (not stored).
    """

    pointers: list[int]
    ld: int
    upper: bool
    transposed: bool = False
    unit: bool = False

    def at(self, pointer: int, row: int, col: int, itemsize: int) -> int:
        """Address of `T[row, col]` in the entry stored at `pointer`."""
        if self.transposed:
            row, col = col, row
        return pointer + itemsize * (row + col * self.ld)

    @property
    def T(self) -> Triangle:
        """The transposed triangle (same storage)."""
        return replace(self, transposed=not self.transposed)


def solve_workspace_bytes(n: int, k: int, factors: int, solves: int, itemsize: int, triangles: int = 1) -> int:
    """Device scratch of `substitute`: inverted diagonal blocks, `Y` and the pointer arrays.

    `triangles`: 1 when `U = Lᵀ` (Cholesky), 2 otherwise (LU).
    """
    if n == 0 or k == 0 or solves == 0:
        return 0
    nb = min(n, block_size(n))
    steps = -(-n // nb)
    blocks = triangles * factors * steps
    return itemsize * (blocks * nb * nb + solves * n * k) + 8 * (2 * blocks + 12 * steps * solves)


def substitute(lower: Triangle, upper: Triangle, n: int, X: torch.Tensor, ldb: int, reads: list[int]) -> None:
    """Overwrite `X [*batch, N, K]` (column-major entries, leading dimension `ldb`) with `U⁻¹ L⁻¹ X`.

    `lower` is `L` and `upper` is `U` (`N × N`, one per factored entry); entry `j` of
    X (row-major order of the batch) is solved with the triangles of entry `reads[j]`. Queued
    on torch's current stream of X's device; no host synchronisation.
    """
    if n == 0 or X.shape[-1] == 0 or len(reads) == 0:
        return
    with torch.cuda.device(X.device):  # a cuBLAS call needs its handle's device current
        _substitute(lower, upper, n, X, ldb, reads)


def _substitute(lower: Triangle, upper: Triangle, n: int, X: torch.Tensor, ldb: int, reads: list[int]) -> None:
    k, solves = X.shape[-1], len(reads)
    h, b = handle(X.device), calls(X.dtype)
    f = X.element_size()
    nb = min(n, block_size(n))
    starts = list(range(0, n, nb))
    sizes = [min(nb, n - i) for i in starts]
    shared = upper == lower.T
    triangles = [lower] if shared else [lower, upper]
    entries = len(lower.pointers)
    inverses = torch.eye(nb, dtype=X.dtype, device=X.device).expand(len(triangles), entries, len(starts), nb, nb)
    inverses = inverses.contiguous()
    Y = torch.empty((solves, k, n), dtype=X.dtype, device=X.device)
    x_ptrs, y_ptrs = entry_pointers(X), [Y.data_ptr() + f * n * k * j for j in range(solves)]

    def inv(t: int, a: int, s: int) -> int:
        return inverses.data_ptr() + f * nb * nb * ((t * entries + a) * len(starts) + s)

    def xs(row: int) -> list[int]:
        return [x + f * row for x in x_ptrs]

    def ys(row: int) -> list[int]:
        return [y + f * row for y in y_ptrs]

    def blocks(tri: Triangle, row: int, col: int) -> list[int]:
        return [tri.at(tri.pointers[a], row, col, f) for a in reads]

    # (call, scalar arguments, pointer arrays) in the order the calls run
    plan: list[tuple[str, tuple, list[list[int]]]] = []
    for t, tri in enumerate(triangles):
        for part in ([s for s, m in enumerate(sizes) if m == nb], [s for s, m in enumerate(sizes) if m < nb]):
            if part:
                diagonal = [tri.at(p, starts[s], starts[s], f) for p in tri.pointers for s in part]
                slots = [inv(t, a, s) for a in range(entries) for s in part]
                plan.append(("trsm", (tri, sizes[part[0]], entries * len(part)), [diagonal, slots]))
    for s, i in enumerate(starts):
        m = sizes[s]
        plan.append(("gemm", (False, m, m, False, nb, ldb, n), [[inv(0, a, s) for a in reads], xs(i), ys(i)]))
        if i + m < n:
            update = (lower.transposed, n - i - m, m, True, lower.ld, n, ldb)
            plan.append(("gemm", update, [blocks(lower, i + m, i), ys(i), xs(i + m)]))
    for s in reversed(range(len(starts))):
        i, m = starts[s], sizes[s]
        t, transposed = (0, True) if shared else (1, False)
        plan.append(("gemm", (transposed, m, m, False, nb, n, ldb), [[inv(t, a, s) for a in reads], ys(i), xs(i)]))
        if i > 0:
            update = (upper.transposed, i, m, True, upper.ld, ldb, n)
            plan.append(("gemm", update, [blocks(upper, 0, i), xs(i), ys(0)]))

    flat = torch.tensor([p for _, _, arrays in plan for array in arrays for p in array], dtype=torch.int64)
    device_flat = flat.pin_memory().to(X.device, non_blocking=True)
    at = device_flat.data_ptr()
    for name, args, arrays in plan:
        pointers = []
        for array in arrays:
            pointers.append(at)
            at += 8 * len(array)
        if name == "trsm":
            tri, m, count = args
            uplo, op = (b.upper if tri.upper else b.lower), (b.trans if tri.transposed else b.no_trans)
            diag = b.unit if tri.unit else b.non_unit
            b.trsm_batched(h, b.left, uplo, op, diag, m, m, b.one, pointers[0], tri.ld, pointers[1], nb, count)
        else:
            transposed, m, depth, update, lda, ldb_, ldc = args
            op = b.trans if transposed else b.no_trans
            alpha, beta = (b.minus_one, b.one) if update else (b.one, b.zero)
            a, bb, c = pointers
            b.gemm_batched(h, op, b.no_trans, m, k, depth, alpha, a, lda, bb, ldb_, beta, c, ldc, solves)
