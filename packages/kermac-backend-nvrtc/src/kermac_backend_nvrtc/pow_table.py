"""|t|^p without the special-function unit: a table indexed by |t|'s exponent and leading mantissa bits,
times a short polynomial, for the split fractional-p pairwise kernel.

Write |t| = 2^E·m with m in [1, 2) and let j be the top :data:`BUCKET_BITS` bits of m's fraction: m
lies in bucket j, [1 + j/8, 1 + (j + 1)/8), whose midpoint is m_j = 1 + (2j + 1)/16.  The kernel keeps,
for every biased exponent e = E + 127 and bucket j, a pair in shared memory (:func:`bucket_scales`):

    R[e, j] = 2^-E·ρ_j,  ρ_j = float32(1/m_j)        T[e, j] = R[e, j]^-p  (float64, then rounded)

so that |t|^p = T·y^p exactly, with y = |t|·R within 1 ± :data:`HALF_WIDTH`.  One FFMA forms
r = |t|·R − 1, and (1 + r)^p is the polynomial of degree :func:`degree` (3 for p <= 3, else 4) that
interpolates it at the Chebyshev nodes of [−HALF_WIDTH, HALF_WIDTH] (:func:`coefficients`).  Per term:
the difference, two instructions for the table offset (exponent and bucket come from one shift of the
bits), one 8-byte shared load, one FFMA for r, three or four for the polynomial, and the accumulating
FFMA — 9 or 10 issue slots, no MUFU.

For 1 <= p <= :data:`MAX_EXPONENT` the polynomial's relative error is below 1e-7 (the interpolation
error of degree 3 vanishes at p = 1, 2, 3 and peaks at 7e-8 near p = 2.5; degree 4 reaches 6e-8 at
p = 5), float32 Horner evaluation adds about 2^-24, T rounded to float32 another 2^-24
(``lg2``/``ex2.approx`` have 2^-22 each).  The
kernel flushes like the ftz MUFU path: T = 0 for e = 0 (zero and subnormal |t|) and where T < 2^-126.
:func:`coefficients` runs on the host, once per value of p, in float64; the kernel receives them as
arguments, so a new p reuses the compiled kernel.
"""

from __future__ import annotations

import math
import struct
from functools import lru_cache

__all__ = ["BUCKET_BITS", "HALF_WIDTH", "MAX_EXPONENT", "bucket_scales", "coefficients", "degree", "exponent_in_range"]

MAX_EXPONENT = 5.0
#: Mantissa bits that, with the 8 exponent bits, index the table: 2^(8 + 3) pairs of floats, 16 KB.
BUCKET_BITS = 3
#: Bound on |r| = ||t|·R − 1|: 1/17 for bucket 0 (the widest relative to its midpoint), plus ρ_0's rounding.
HALF_WIDTH = 0.0589


def bucket_scales() -> list[float]:
    """ρ_j = float32(16 / (17 + 2j)), j = 0..7, as the kernel computes them (float32 IEEE division)."""
    return [struct.unpack("f", struct.pack("f", 16.0 / (17 + 2 * j)))[0] for j in range(1 << BUCKET_BITS)]


def exponent_in_range(p: float) -> bool:
    """Whether the table path is accurate for exponent ``p`` (1 <= p <= MAX_EXPONENT)."""
    return 1.0 <= p <= MAX_EXPONENT


def degree(p: float) -> int:
    """Degree of the polynomial for (1 + r)^p: 3 where that is accurate (p <= 3), else 4."""
    if not exponent_in_range(p):
        raise ValueError(f"p: expected a number in [1, {MAX_EXPONENT}] for the power table, got {p!r}")
    return 3 if p <= 3.0 else 4


@lru_cache(maxsize=64)
def coefficients(p: float) -> tuple[float, ...]:
    """c_0..c_d, d = degree(p), with Σ c_k·r^k = (1 + r)^p at the d + 1 Chebyshev nodes of
    [−HALF_WIDTH, HALF_WIDTH] (Vandermonde solve, float64)."""
    n = degree(p) + 1
    rs = [HALF_WIDTH * math.cos((2 * k + 1) * math.pi / (2 * n)) for k in range(n)]
    rows = [[r**k for k in range(n)] + [(1.0 + r) ** p] for r in rs]
    for col in range(n):  # Gaussian elimination with partial pivoting
        pivot = max(range(col, n), key=lambda i: abs(rows[i][col]))
        rows[col], rows[pivot] = rows[pivot], rows[col]
        for i in range(col + 1, n):
            f = rows[i][col] / rows[col][col]
            rows[i] = [a - f * b for a, b in zip(rows[i], rows[col], strict=True)]
    c = [0.0] * n
    for i in reversed(range(n)):
        c[i] = (rows[i][n] - sum(rows[i][k] * c[k] for k in range(i + 1, n))) / rows[i][i]
    return tuple(c)
