r"""Kernel products that run faster as row blocks of K and a matrix product than fused, with a bounded workspace.

A fused product computes each entry of `K` in a GPU program that also contracts it with `v`; the pairwise
kernels compute `K` alone with more of the GPU's registers and tiles of their own.  Where computing an entry costs
more than writing and reading it — many features, programs without tensor cores, or many columns of `v` — the
pairwise kernel into a block of rows of `K`, then `block @ v`, is faster:

$$
\mathrm{out}[m_0 : m_0 + R, :] = K(x[m_0 : m_0 + R], z)\; v \qquad \text{for } m_0 = 0, R, 2R, \dots
$$

with `R = max(1, BLOCK_ELEMENTS // N)` rows per block, one block reused.  Measured at N = 10⁵
(docs/dev/product-blocked.md; `python tools/product_bench.py`, `python tools/product_blocked_sweep.py --force`),
the blocked route beats both fused backends for the SIMT programs (Laplace-L1) from D = 128 on, and from D = 32
with more than one column of `v` (one H100); and for the float32 `(x − z)²` programs on the tensor cores
(Gaussian, Laplace-L2, Matérn) with more than 64 columns of `v`, at every D measured (3 to 128; one H200), where
the fused kernels, which contract at most 64 columns per program, compute each tile of K once per 64 columns.  So
`applies` takes this route for a product that

* runs on a CUDA device with `backend="auto"` (a named backend always runs its fused kernel), unbatched, in
  float32 with float32 matrix products in full precision (`torch.get_float32_matmul_precision() == "highest"`:
  TF32 would round `K`'s entries in the product with `v`);
* has at least `MIN_ENTRIES` entries of K and, for a tensor-core program (`kermac.kernel_facts.tensor_core_eligible`),
  at least `TENSOR_CORE_MIN_COLUMNS` columns of `v`; for any other program `D ≥ 128`, or `D ≥ 32` and `C > 1`.

The predictor gradient of a tensor-core program ([`kermac.jacobians`][kermac.jacobians]) is one product of
`C·(D + 1)` columns and takes this route from 65 on (e.g. from C = 17 at D = 3, from C = 2 at D = 32).

Workspace: one block of `R · N ≤ max(BLOCK_ELEMENTS, N)` entries in `x`'s dtype (1 GiB in float32), never
`M · N`.  The regularised diagonal keeps its place (each block's row offset is added to `offset_m`).
"""

from __future__ import annotations

import torch

from kermac.kernel_facts import tensor_core_eligible
from kermac.problem import PairwiseProblem, ProductProblem, pairwise_problem

__all__ = ["BLOCK_ELEMENTS", "MIN_ENTRIES", "TENSOR_CORE_MIN_COLUMNS", "applies", "block_problems", "faster_blocked"]

BLOCK_ELEMENTS = 1 << 28
"""Entries of K per block: 1 GiB in float32.  Measured on one H100 at N = 10⁵ (docs/dev/product-blocked.md): with
2²⁸ entries (2684 rows) per block the route runs within 3 % of 16 384-row blocks; with 2²⁶ (671 rows) it took
1.1–1.5× as long (each block's launches and matrix product too small to keep the GPU busy)."""

MIN_ENTRIES = 1 << 28
"""The fewest entries of K for which the route is taken (the measured problems had 2.5·10⁹ and 10¹⁰)."""

TENSOR_CORE_MIN_COLUMNS = 65
"""The fewest columns of `v` for which a tensor-core program's product runs blocked: more than one fused program's
64.  Measured on one H200 at N = 10⁵ (the route / the fused product, ms; docs/dev/product-blocked.md): the Gaussian
with C = 68 at D = 16 70.5 / 91.5, C = 128 at D = 3, 32, 128 62.0 / 108.3, 76.2 / 129.8, 97.3 / 171.7; with
C = 64 it was faster too (D = 3 41.5 / 54.4, D = 32 55.2 / 64.9, D = 128 76.7 / 87.9), but the Gaussian's
predictor gradient at D = 3, C = 16 (one product of 64 columns of its slope program) was not (63.0 / 55.7)."""


def applies(problem: ProductProblem, backend: str) -> bool:
    """Whether `problem` (asked of `backend`) runs as row blocks of K and a matrix product: `backend="auto"` on a
    CUDA device, and `faster_blocked` (see the module docs)."""
    return backend == "auto" and problem.device.type == "cuda" and faster_blocked(problem)


def faster_blocked(problem: ProductProblem) -> bool:
    """Whether `problem`'s dtype, program and sizes are those the blocked route was measured faster on (unbatched,
    float32 at full matrix-product precision, at least `MIN_ENTRIES` entries of K; a tensor-core program with at
    least `TENSOR_CORE_MIN_COLUMNS` columns, any other with `D ≥ 128` or `D ≥ 32` and `C > 1`), whatever its
    device."""
    m, n, d, c = problem.sizes
    if tensor_core_eligible(problem.program, problem.x.dtype):
        wide = c >= TENSOR_CORE_MIN_COLUMNS
    else:
        wide = c > 0 and (d >= 128 or (d >= 32 and c > 1))
    return (
        wide
        and not problem.batch_shape
        and problem.x.dtype == torch.float32
        and torch.get_float32_matmul_precision() == "highest"
        and m * n >= MIN_ENTRIES
    )


def block_problems(problem: ProductProblem) -> list[tuple[PairwiseProblem, slice]]:
    """The pairwise problems of `problem`'s row blocks, all writing one workspace block, each with the rows of
    `problem.out` its `block @ v` goes to."""
    m, n = problem.sizes[:2]
    rows = max(1, min(m, BLOCK_ELEMENTS // max(n, 1)))
    block = torch.empty(rows, n, dtype=problem.x.dtype, device=problem.device)
    blocks = []
    for start in range(0, m, rows):
        stop = min(m, start + rows)
        pairwise = pairwise_problem(
            problem.program,
            problem.x[start:stop],
            problem.z,
            out=block[: stop - start],
            hypers=problem.hypers,
            offset_m=problem.offset_m + start,
            offset_n=problem.offset_n,
            debug=problem.debug,
        )
        blocks.append((pairwise, slice(start, stop)))
    return blocks
