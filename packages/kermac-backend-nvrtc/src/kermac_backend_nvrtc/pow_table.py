"""|t|^p without the special-function unit: a table of 2^(e·p) over float32 exponents times a
polynomial for the mantissa's power, for the split fractional-p pairwise kernel.

For t = ±2^e·m with m in [1, 2), |t|^p = 2^(e·p)·m^p.  The kernel keeps T[e] = 2^(e·p) for the 256
biased exponents in shared memory (0 for zero and subnormal |t| and below 2^-126: flushed) and
evaluates m^p with the polynomial in m of degree `degree` (5 for p <= `DEGREE_5_MAX`,
else 6) that interpolates it at the Chebyshev nodes of [1, 2] (in m itself rather than in m − 1: one
FADD less per term).  Its relative error, float32 Horner evaluation included, stays below 9e-7 with
degree 5 (p <= 3) and 4.5e-7 with degree 6 (3.1e-7 for p <= 4) — an lg2/ex2 term has 2^-22 from each
of `lg2`/`ex2.approx` and grows with p·|log2 t| — up to `MAX_EXPONENT`; beyond, the
interpolation error grows with p (2e-5 at p = 6.5), so larger p keep the ex2 polynomial
(`cuda/pow_split.cuh`).
`coefficients` runs on the host, once per value of p, in float64; the kernel receives them as
arguments, so a new p reuses the compiled kernel.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

__all__ = ["DEGREE_5_MAX", "MAX_EXPONENT", "coefficients", "degree", "exponent_in_range"]

DEGREE_5_MAX = 3.0
MAX_EXPONENT = 5.0


def _nodes(degree: int) -> list[float]:
    n = degree + 1
    return [1.5 + 0.5 * math.cos((2 * k + 1) * math.pi / (2 * n)) for k in range(n)]


def exponent_in_range(p: float) -> bool:
    """Whether the table path is accurate for exponent `p` (1 <= p <= MAX_EXPONENT)."""
    return 1.0 <= p <= MAX_EXPONENT


def degree(p: float) -> int:
    """Degree of the mantissa polynomial for exponent `p` (in the table's range): 5 up to
    `DEGREE_5_MAX`, 6 above."""
    if not exponent_in_range(p):
        raise ValueError(f"p: expected a number in [1, {MAX_EXPONENT}] for the power table, got {p!r}")
    return 5 if p <= DEGREE_5_MAX else 6


@lru_cache(maxsize=64)
def coefficients(p: float) -> tuple[float, ...]:
    """c_0..c_N (N = `degree(p)`) with Σ c_j·m^j = m^p at the Chebyshev nodes of [1, 2]
    (Vandermonde solve, float64)."""
    n = degree(p)
    ms = torch.tensor(_nodes(n), dtype=torch.float64)
    vandermonde = ms[:, None] ** torch.arange(n + 1, dtype=torch.float64)
    return tuple(torch.linalg.solve(vandermonde, ms**p).tolist())
