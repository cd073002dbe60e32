r"""Kernel products with few rows and many columns, split along the sum over `n`.

A fused product `out[*B, m, c] = Σ_n K[*B, m, n] v[*B, n, c]` gives each GPU program a tile of rows of `out` and
the whole sum over `n` (no atomics, one order of summation).  With few rows — predicting at a handful of points
against 10⁶ centres, or `K_Sn r` with m inducing points in the Nyström preconditioner — there are fewer row tiles
than multiprocessors, and most of the GPU idles.  Here such a product becomes `S` products over consecutive slices
of `n`, launched as one batched product (the slices are a new leading batch dimension of views of `z` and `v`,
`x` broadcast over it), into a workspace `[S, *B, M, C]` whose sum over the slices is `out`:

$$
\mathrm{out}[*B, m, c] = \sum_{s} \sum_{n \in \mathrm{slice}_s} K[*B, m, n]\, v[*B, n, c].
$$

The `N mod S` last columns (fewer than `S`) are one more product into the workspace's last entry.  The sum over
slices is `torch.sum` (deterministic).  The split applies on CUDA devices to programs whose epilogue does not
read the diagonal (a regularised `K + λI` places its diagonal by column index, which a slice's own indices no
longer give), in float32 and float64 (half dtypes would round each slice's partial sum to the half dtype).

Workspace: `(S or S + 1) · B · M · C` elements of `out`'s dtype — with `S` chosen below, at most a few times
`out`'s size times the number of multiprocessors over the row tiles.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch

from kermac.problem import ProductProblem

__all__ = ["MIN_SLICE", "ROW_TILE", "SPLIT_DTYPES", "multiprocessors", "split_count", "split_problems"]

ROW_TILE = 64
"""Rows of `out` per GPU program that the count of programs is estimated with (the backends' product tiles take
32 to 128 rows)."""

MIN_SLICE = 8192
"""The fewest columns of K per slice: each program then still sums over 8192 · 64 or more entries of K, against
one extra row of partial sums to add."""

SPLIT_DTYPES = (torch.float32, torch.float64)


@functools.cache
def _multiprocessors(device: int) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def split_count(problem: ProductProblem, multiprocessors: int, min_slice: int = MIN_SLICE) -> int:
    """The number of slices `S` of the sum over `n` for `problem` on a device of `multiprocessors`
    multiprocessors, 1 for no split: enough programs to give every multiprocessor two
    (`batch · ⌈M / ROW_TILE⌉ · ⌈C / ROW_TILE⌉` row tiles per slice), each slice at least `min_slice` columns."""
    m, n, _, c = problem.sizes
    if problem.program.uses_diag or problem.out.dtype not in SPLIT_DTYPES:
        return 1
    tiles = math.prod(problem.batch_shape) * math.ceil(m / ROW_TILE) * math.ceil(c / ROW_TILE)
    if tiles == 0 or tiles >= multiprocessors:
        return 1
    return max(1, min(math.ceil(2 * multiprocessors / tiles), n // min_slice))


def split_problems(problem: ProductProblem, slices: int) -> tuple[list[ProductProblem], torch.Tensor]:
    """`problem` as products over `slices` consecutive slices of `n` (one batched product, and one more for the
    `N mod slices` last columns), and their workspace `[slices (+ 1), *B, M, C]`, whose sum over its first
    dimension is `problem.out`.  Nothing is copied: `z` and `v` are viewed, `x` and the hyperparameters
    broadcast."""
    m, n, _, c = problem.sizes
    length = n // slices
    tail = n - slices * length
    batch = problem.batch_shape
    workspace = torch.empty((slices + (tail > 0), *batch, m, c), dtype=problem.out.dtype, device=problem.out.device)

    def sliced(t: torch.Tensor) -> torch.Tensor:  # [*B, N, k] → [S, *B, length, k], a view
        return t[..., : slices * length, :].unflatten(-2, (slices, length)).movedim(-3, 0)

    split = (slices, *batch)
    problems = [
        dataclasses.replace(
            problem,
            x=problem.x.expand(*split, *problem.x.shape[-2:]),
            z=sliced(problem.z),
            v=sliced(problem.v),
            out=workspace[:slices],
            hypers={k: h.expanded(split) for k, h in problem.hypers.items()},
            batch_shape=split,
        )
    ]
    if tail:
        rest = slices * length
        problems.append(
            dataclasses.replace(problem, z=problem.z[..., rest:, :], v=problem.v[..., rest:, :], out=workspace[slices])
        )
    return problems, workspace


def multiprocessors(device: torch.device) -> int:
    """The number of multiprocessors of CUDA `device` (read once per device, no synchronisation)."""
    return _multiprocessors(device.index if device.index is not None else torch.cuda.current_device())
