r"""Kernel products (and their gradient products) with few rows and many columns, split along the sum over `n`.

A fused product `out[*B, m, c] = Σ_n K[*B, m, n] v[*B, n, c]` gives each GPU program a tile of rows of `out` and
the whole sum over `n` (no atomics, one order of summation).  With few rows — predicting at a handful of points
against 10⁶ centres, or `K_Sn r` with m inducing points in the Nyström preconditioner — there are fewer row tiles
than multiprocessors, and most of the GPU idles.  Here such a product becomes `S` products over consecutive slices
of `n`, launched as one batched product (the slices are a new leading batch dimension of views of `z` and `v`,
`x` broadcast over it), into a workspace `[S, *B, M, C]` whose sum over the slices is `out`:

$$
\mathrm{out}[*B, m, c] = \sum_{s} \sum_{n \in \mathrm{slice}_s} K[*B, m, n]\, v[*B, n, c].
$$

The gradient product (`out[*B, m, j]`, a sum over `n` too:
`kermac.problem.ProductGradProblem`) is split the same way, `g` broadcast as `x` is.  The
`N mod S` last columns (fewer than `S`) are one more problem into the workspace's last entry.  The sum over
slices is `torch.sum` (deterministic).  The split applies on CUDA devices to programs whose epilogue does not
read the diagonal (a regularised `K + λI` places its diagonal by column index, which a slice's own indices no
longer give), in float32 and float64 (half dtypes would round each slice's partial sum to the half dtype).

Workspace: `S` (or `S + 1`) times `out`'s `B · M · C` elements (a gradient product's `B · M · D`) in `out`'s
dtype.  With `S` chosen by `split_count`, that is less than `2 · ROW_TILE² · multiprocessors + 2 · B · M · C`
elements (a gradient product's: `2 · ROW_TILE · D · multiprocessors + 2 · B · M · D`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import threading
from collections.abc import Iterator

import torch

from kermac.problem import ProductGradProblem, ProductProblem

Splittable = ProductProblem | ProductGradProblem

__all__ = ["MIN_SLICE", "ROW_TILE", "SPLIT_DTYPES", "disabled", "multiprocessors", "split_count", "split_problems"]

ROW_TILE = 64
"""Rows of `out` per GPU program that the count of programs is estimated with (the backends' product tiles take
32 to 128 rows)."""

MIN_SLICE = 8192
"""The fewest columns of K per slice: each program then still sums over 8192 · 64 or more entries of K, against
one extra row of partial sums to add."""

SPLIT_DTYPES = (torch.float32, torch.float64)


_local = threading.local()


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Within the block, this thread's products and gradient products run in one launch each, unsplit (no
    workspace): for measuring the split, or where even its workspace is not to be allocated.  Autograd runs the
    backward of CUDA operations on threads of its own, so `backward()` called within the block still splits its
    gradient products."""
    before = getattr(_local, "disabled", False)
    _local.disabled = True
    try:
        yield
    finally:
        _local.disabled = before


@functools.cache
def _multiprocessors(device: int) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def split_count(problem: Splittable, multiprocessors: int, min_slice: int = MIN_SLICE) -> int:
    """The number of slices `S` of the sum over `n` for `problem` on a device of `multiprocessors`
    multiprocessors, 1 for no split: enough programs to give every multiprocessor two
    (`batch · ⌈M / ROW_TILE⌉ · ⌈C / ROW_TILE⌉` row tiles per slice; a gradient product's programs take every
    feature of their rows: `batch · ⌈M / ROW_TILE⌉`), each slice at least `min_slice` columns; 1 within
    [`disabled`][kermac.product_split.disabled]."""
    m, n, _, c = problem.sizes
    if getattr(_local, "disabled", False) or problem.program.uses_diag or problem.out.dtype not in SPLIT_DTYPES:
        return 1
    column_tiles = 1 if isinstance(problem, ProductGradProblem) else math.ceil(c / ROW_TILE)
    tiles = math.prod(problem.batch_shape) * math.ceil(m / ROW_TILE) * column_tiles
    if tiles == 0 or tiles >= multiprocessors:
        return 1
    return max(1, min(math.ceil(2 * multiprocessors / tiles), n // min_slice))


def split_problems(problem: Splittable, slices: int) -> tuple[list[Splittable], torch.Tensor]:
    """`problem` as problems over `slices` consecutive slices of `n` (one batched problem, and one more for the
    `N mod slices` last columns), and their workspace `[slices (+ 1), *out.shape]`, whose sum over its first
    dimension is `problem.out`.  Nothing is copied: `z` and `v` are viewed, `x` (and a gradient product's `g`)
    and the hyperparameters broadcast."""
    n = problem.sizes[1]
    length = n // slices
    tail = n - slices * length
    batch = problem.batch_shape
    out = problem.out
    workspace = torch.empty((slices + (tail > 0), *out.shape), dtype=out.dtype, device=out.device)

    def sliced(t: torch.Tensor) -> torch.Tensor:  # [*B, N, k] → [S, *B, length, k], a view
        return t[..., : slices * length, :].unflatten(-2, (slices, length)).movedim(-3, 0)

    split = (slices, *batch)

    def broadcast(t: torch.Tensor) -> torch.Tensor:  # [*B, M, k] → [S, *B, M, k], stride 0 over the slices
        return t.expand(*split, *t.shape[-2:])

    rows = {"x": broadcast(problem.x)}
    if isinstance(problem, ProductGradProblem):
        rows["g"] = broadcast(problem.g)
    problems = [
        dataclasses.replace(
            problem,
            **rows,
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
