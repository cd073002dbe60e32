"""Facts every GPU backend's kernels must agree on, stated once.

- **32-bit indices.** Kernels index rows, columns and features with 32-bit integers; a tile may
  compute indices up to `TILE_SLACK` past an operand's last row or feature (clamped or masked
  lanes), so a size fits when `size + TILE_SLACK <= INT32_MAX` (`fits_int32`).
- **Cancellation guard of the tensor-core (x − z)² path.** d² = ‖x‖² + ‖z‖² − 2·x·z loses relative
  accuracy where d² is small against ‖x‖² + ‖z‖²; entries with
  `d² <= cancellation_guard(D)·(‖x‖² + ‖z‖²)` (or not finite) are recomputed from differences.
- **Tensor-core eligibility.** A pairwise program may run on the 3×TF32 tensor-core expansion when
  it computes in float32 and is a sum of squared differences (`tensor_core_eligible`); which
  input dtypes a backend widens to float32 for that kernel is the backend's choice.
- **Hyperparameters.** A hyperparameter given as a number is passed by value, in the compute type;
  one given as a tensor is passed as a pointer and read at the batch entry's offset
  (`passed_by_value`).
- **Batch decoding.** A kernel's flat batch entry `e` over the coalesced batch shape
  `(s_0, …, s_{n−1})` is decoded innermost dimension first — `i_{n−1} = e mod s_{n−1}`, then
  `e ← e div s_{n−1}`, and so on — so entry `e` is the row-major (C-order) index
  (`batch_index`); each operand's offset is `Σ_j i_j · stride_j`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from kermac.hyperparams import HyperValue
from kermac.programs import PairwiseProgram, is_squared_difference_sum

__all__ = [
    "INT32_MAX",
    "TILE_SLACK",
    "batch_index",
    "cancellation_guard",
    "fits_int32",
    "passed_by_value",
    "tensor_core_eligible",
]

INT32_MAX = 2**31 - 1
TILE_SLACK = 512
"""Largest index overrun of any backend's tiles beyond an operand's last row or feature."""


def fits_int32(size: int) -> bool:
    """Whether a row, column or feature count `size` can be indexed with 32-bit integers by every
    tile (`size + TILE_SLACK <= INT32_MAX`)."""
    return size + TILE_SLACK <= INT32_MAX


def cancellation_guard(d: int) -> float:
    """Cancellation threshold of the tensor-core (x − z)² path for reduction length `d`.

    d² = ‖x‖² + ‖z‖² − 2·x·z has an absolute error of about ε·S, S = ‖x‖² + ‖z‖²: fp32 sums of the
    three terms (≈ √D·2⁻²⁴·S; the maximum over random, offset and clustered data in a float64
    emulation of the kernels stays below it) plus the 3×TF32 split (each product misses at most
    3·2⁻²²·|x_k z_k|, so ≤ 3·2⁻²³·S in total).  Entries with d² ≤ 2¹⁶·ε·S — relative error of d²
    possibly above 2⁻¹⁶ (1.5e-5, 7.6e-6 on d) — are recomputed from differences; the threshold is
    capped at 1/2.
    """
    return min(0.5, (math.sqrt(max(d, 1)) * 2.0**-24 + 3 * 2.0**-23) * 2.0**16)


def tensor_core_eligible(program: PairwiseProgram, compute: torch.dtype | str) -> bool:
    """Whether `program` computed in `compute` (the compute type: a torch dtype or its name, e.g.
    `"float32"`) may run on the 3×TF32 tensor-core expansion: float32 sums of squared differences."""
    name = str(compute).removeprefix("torch.")
    return name == "float32" and is_squared_difference_sum(program)


def passed_by_value(hyper: HyperValue) -> bool:
    """Whether hyperparameter `hyper` is a kernel argument by value (a number, in the compute type);
    otherwise it is a pointer to its tensor, read at the batch entry's offset."""
    return hyper.tensor is None


def batch_index(entry: int, shape: Sequence[int]) -> tuple[int, ...]:
    """The index into batch `shape` of flat batch entry `entry`, decoded innermost dimension first
    (row-major order): what every kernel computes before adding `index · stride` per operand."""
    if not 0 <= entry < math.prod(shape):
        raise ValueError(f"entry: expected 0 <= entry < {math.prod(shape)} for batch shape {tuple(shape)}, got {entry}")
    index = []
    for size in reversed(shape):
        entry, i = divmod(entry, size)
        index.append(i)
    return tuple(reversed(index))
