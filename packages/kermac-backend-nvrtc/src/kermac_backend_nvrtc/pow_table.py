"""|t|^p without the special-function unit: a table of 2^(e·p) over float32 exponents times a
polynomial for the mantissa's power, for the split fractional-p pairwise kernel.

For t = ±2^e·m with m in [1, 2), |t|^p = 2^(e·p)·m^p.  The kernel keeps T[e] = 2^(e·p) for the 256
biased exponents in shared memory (0 for zero and subnormal |t| and below 2^-126: flushed) and
evaluates m^p = (1 + u)^p, u = m − 1 in [0, 1), with the degree-6 polynomial that interpolates it at
the Chebyshev nodes of [0, 1].  For 1 <= p <= :data:`MAX_EXPONENT` its relative error, float32
Horner evaluation included, stays below 3e-7 (2.5 ulp; ``lg2``/``ex2.approx`` have 2^-22 each);
beyond, the interpolation error grows with p (2e-5 at p = 6.5), so larger p keep the ex2 polynomial
(``kernels.POW_POLY``).
:func:`coefficients` runs on the host, once per value of p, in float64; the kernel receives them as
arguments, so a new p reuses the compiled kernel.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

__all__ = ["DEGREE", "MAX_EXPONENT", "coefficients", "exponent_in_range"]

DEGREE = 6
MAX_EXPONENT = 5.0


def _nodes() -> list[float]:
    n = DEGREE + 1
    return [0.5 + 0.5 * math.cos((2 * k + 1) * math.pi / (2 * n)) for k in range(n)]


def exponent_in_range(p: float) -> bool:
    """Whether the table path is accurate for exponent ``p`` (1 <= p <= MAX_EXPONENT)."""
    return 1.0 <= p <= MAX_EXPONENT


@lru_cache(maxsize=64)
def coefficients(p: float) -> tuple[float, ...]:
    """c_0..c_6 with Σ c_j·u^j = (1 + u)^p at the Chebyshev nodes of [0, 1] (Vandermonde solve, float64)."""
    if not exponent_in_range(p):
        raise ValueError(f"p: expected a number in [1, {MAX_EXPONENT}] for the power table, got {p!r}")
    us = torch.tensor(_nodes(), dtype=torch.float64)
    vandermonde = us[:, None] ** torch.arange(DEGREE + 1, dtype=torch.float64)
    return tuple(torch.linalg.solve(vandermonde, (1.0 + us) ** p).tolist())
