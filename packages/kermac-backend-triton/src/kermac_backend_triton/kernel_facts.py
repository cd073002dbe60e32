"""Facts about kermac's kernels that every backend shares, kept here until core provides them.

Each fact lives in this one place in the Triton package; when ``kermac.kernel_facts`` exists, this
module's body becomes ``from kermac.kernel_facts import ...``.

* :func:`guard_threshold`: the tensor-core kernels' cancellation threshold;
* :func:`tensor_core_eligible`: whether the tensor-core expansion computes a program;
* :data:`INT32_MAX` and :data:`TILE_SLACK`: when 32-bit indices suffice.
"""

from __future__ import annotations

import math

from kermac.programs import PairwiseProgram, is_squared_difference_sum

__all__ = ["INT32_MAX", "TILE_SLACK", "guard_threshold", "tensor_core_eligible"]

#: Largest value of a signed 32-bit index (and CUDA's limit on the grid's x dimension).
INT32_MAX = 2**31 - 1
#: Largest index overrun of any tile beyond an operand's last row/feature (pointer arithmetic of
#: clamped or masked lanes), used when deciding whether 32-bit indices suffice.
TILE_SLACK = 512


def tensor_core_eligible(program: PairwiseProgram, compute: str) -> bool:
    """Whether the tensor-core kernel computes ``program``: a float32 sum of (x − z)²."""
    return compute == "float32" and is_squared_difference_sum(program)


def guard_threshold(d: int) -> float:
    """Cancellation threshold of the tensor-core kernel for reduction length ``d``.

    d² = ‖x‖² + ‖z‖² − 2·x·z carries an absolute error of about ε·S, S = ‖x‖² + ‖z‖²: the fp32
    sums of the three terms (≈ √D·2⁻²⁴·S) plus the 3×TF32 split (≤ 3·2⁻²³·S), the same bound
    as the NVRTC backend's guard.  Entries with d² ≤ 2¹⁶·ε·S (relative error of d² possibly above
    2⁻¹⁶) are recomputed from differences; capped at 1/2.
    """
    return min(0.5, (math.sqrt(max(d, 1)) * 2.0**-24 + 3 * 2.0**-23) * 2.0**16)
