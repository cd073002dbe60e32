"""Powers of a value the program proves non-negative (`kermac.programs.nonnegative`): the root of a distance.

`pow(acc, b)` where `acc` sums `|x|` runs `km_pow_nonneg` on NVRTC and `pow_nonneg` on Triton (on a GPU both
2^(b·lg2 a) on the special-function unit with the rounding errors carried, in place of IEEE pow).  With one
feature `acc` is `|x|` exactly, so the output is `|x|^b` of a float32 input, compared with float64's `pow` of the
same value: within `ulps(b)` over the whole float32 range (subnormal inputs included), and torch's values on IEEE
special cases.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import BACKEND_DEVICES, require_backend

import kermac
from kermac import ir
from kermac.programs import PairwiseProgram


def ulps(b: float) -> float:
    """The error allowed in float32 ulp (2^-23 relative) for the exponent `b`: about 1 ulp of rounding and ex2's
    error plus |b|·ln 2 times lg2's absolute error (2^-22), which grows with |b|; 5 for a root (|b| <= 1)."""
    return 3.5 + 1.5 * abs(b)


EXPONENTS = [1 / 1.3, 1 / 3, 1 / 0.7, 2.5, -0.5, 1.0, 7.3, -3.1]

_B = ir.Hyper("e")


def _power_program() -> PairwiseProgram:
    """`(Σ_k |x_k| + |z_k|)^b`: with one feature and z = 0, `|x|^b`."""
    return PairwiseProgram(abs(ir.Var("x")) + abs(ir.Var("z")), "sum", ir.pow(ir.Var("acc"), _B))


def _wide_range(device: str) -> torch.Tensor:
    """Positive float32 values from the smallest subnormal to the largest finite, spread over every binade."""
    exponents = torch.linspace(-149.0, 127.9, 8192, dtype=torch.float64)
    jitter = torch.rand(8192, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    values = (2.0**exponents) * (1.0 + 0.5 * jitter)
    return values.clamp(max=torch.finfo(torch.float32).max).float().to(device)


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
@pytest.mark.parametrize("b", EXPONENTS, ids=lambda b: f"b={b:.3g}")
def test_a_power_of_a_nonnegative_sum_is_within_a_few_ulp(backend: str, device: str, b: float) -> None:
    require_backend(backend, device)
    x = _wide_range(device)[:, None]
    got = kermac.run_program(_power_program(), x, torch.zeros(1, 1, device=device), hypers={"e": b}, backend=backend)
    got = got.double().cpu()[:, 0]
    want = x.double().cpu()[:, 0] ** torch.tensor(b, dtype=torch.float32).double()
    tol = ulps(b)
    tiny, huge = torch.finfo(torch.float32).smallest_normal, torch.finfo(torch.float32).max
    normal = (want >= tiny) & (want <= huge * (1 - tol * 2.0**-23))
    error = ((got - want).abs() / want)[normal] / 2.0**-23
    worst = int(error.argmax())
    assert error.max() <= tol, f"|x|^{b}: {error.max():.2f} ulp at x = {x.cpu()[normal][worst].item():.9g}"
    # Within tol of the largest float a result may round either way; beyond, it overflows as pow does; below
    # the normal range it holds what a subnormal can.
    near = (want > huge * (1 - tol * 2.0**-23)) & (want <= huge * (1 + tol * 2.0**-23))
    assert ((got[near] == math.inf) | ((got[near] - want[near]).abs() <= tol * 2.0**-23 * want[near])).all()
    assert (got[want > huge * (1 + tol * 2.0**-23)] == math.inf).all()
    small = want < tiny
    assert ((got[small] - want[small]).abs() <= tol * 2.0**-149).all()


SPECIAL_BASES = [0.0, 1.0, 2.0, 0.5, 1e-40, 3e38, math.inf, math.nan]
SPECIAL_EXPONENTS = [0.0, -0.0, 1 / 1.3, -0.5, 2.5, math.inf, -math.inf]  # a NaN hyperparameter is refused


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
def test_a_power_of_a_nonnegative_sum_keeps_pows_special_values(backend: str, device: str) -> None:
    """0, inf, NaN, subnormal and huge bases with zero and infinite exponents, as torch.pow in float32."""
    require_backend(backend, device)
    x = torch.tensor(SPECIAL_BASES, device=device)[:, None]
    z = torch.zeros(1, 1, device=device)
    for b in SPECIAL_EXPONENTS:
        got = kermac.run_program(_power_program(), x, z, hypers={"e": b}, backend=backend).cpu()[:, 0]
        want = torch.pow(x.cpu()[:, 0], torch.tensor(b))
        same = (got.isnan() & want.isnan()) | torch.isclose(got, want, rtol=1e-6, atol=8 * 2.0**-149)
        assert same.all(), f"b = {b}: {got.tolist()} != torch {want.tolist()} for bases {SPECIAL_BASES}"
