"""cdist at the edges (docs/formulas.md, "Special values" and "Large p"), on every backend.

* ±0, ±inf and NaN coordinates for p = 0, 1, 2, fractional p and ∞, and D = 0: the values of
  ``torch.cdist`` (the oracle here), in float32 and float64.
* Large p: from :func:`kermac.lowering.linf_threshold` on, d_∞ (torch.cdist with p = ∞ on data without
  NaN); between :func:`~kermac.lowering.plain_power_limit` and that threshold the guarded program,
  either NaN or within rounding of d_p computed stably in float64 (scaled by the largest
  difference), never a plausible-looking wrong number; exact duplicates stay 0.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import BACKEND_DEVICES, require_backend

import kermac
from kermac import lowering
from kermac.hyperparams import nan_where_nan

#: Values whose pairwise differences cover 0, ±0, ±inf, inf − inf and NaN.
EDGE_VALUES = [0.0, -0.0, 1.0, -2.0, 3.5, math.inf, -math.inf, math.nan]
PS = [0.0, 1.0, 2.0, 1.5, 0.5, 3.0, math.inf]
DTYPES = [torch.float32, torch.float64]


def _edge_points(dtype: torch.dtype, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of one and of three coordinates made of :data:`EDGE_VALUES` (every pair of values meets
    in one coordinate; three-coordinate rows mix them with ordinary values)."""
    one = torch.tensor(EDGE_VALUES, dtype=dtype)[:, None]
    g = torch.Generator().manual_seed(5)
    pick = torch.randint(0, len(EDGE_VALUES), (24, 3), generator=g)
    three = torch.tensor(EDGE_VALUES, dtype=dtype)[pick]
    three[::3] = torch.randn(8, 3, generator=g, dtype=dtype)  # some rows without special values
    return one.to(device), three.to(device)


def _assert_same(got: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """NaN and ±inf exactly where torch.cdist has them; finite values to the dtype's accuracy (float32:
    2e-5, the tensor-core expansion of p = 2 on a GPU keeps d² within 2⁻¹⁶)."""
    rtol = 2e-5 if got.dtype == torch.float32 else 1e-12
    got, expected = got.cpu().double(), expected.cpu().double()
    nan = got.isnan() != expected.isnan()
    assert not nan.any(), f"{what}: got {got[nan][:6].tolist()} where torch.cdist gives {expected[nan][:6].tolist()}"
    finite, infinite = expected.isfinite(), expected.isinf()
    assert torch.equal(got[infinite], expected[infinite]), f"{what}: infinities differ"
    torch.testing.assert_close(got[finite], expected[finite], rtol=rtol, atol=1e-12, msg=what)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("p", PS)
@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
def test_special_values_as_torch_cdist(backend: str, device: str, p: float, dtype: torch.dtype) -> None:
    """NaN, ±inf and ±0 coordinates give torch.cdist's values: for p = 0 a NaN difference (a NaN
    coordinate or ∞ − ∞) makes the count NaN, ±inf − finite counts 1; for p = ∞ the maximum skips
    NaN differences; for other p NaN propagates and an infinite difference gives inf."""
    require_backend(backend, device)
    for x in _edge_points(dtype, device):
        got = kermac.cdist(x, x, p=p, backend=backend)
        _assert_same(got, torch.cdist(x.cpu(), x.cpu(), p=p), f"p={p} {dtype} D={x.shape[-1]}")


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
def test_featureless_points_are_at_distance_zero(backend: str, device: str) -> None:
    require_backend(backend, device)
    x, z = torch.empty(3, 0, device=device), torch.empty(2, 0, device=device)
    for p in [*PS, 50.0, 1e308]:
        for skip in (False, True):
            out = kermac.cdist(x, z, p=p, skip_epilogue=skip, backend=backend)
            assert torch.equal(out.cpu(), torch.zeros(3, 2)), (p, skip)


def _linf(x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    return torch.cdist(x.cpu().double(), z.cpu().double(), p=math.inf)


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
def test_huge_p_is_the_maximum(backend: str, device: str) -> None:
    """p = 1e308 gave 1.0 everywhere (1/p rounds to a subnormal or 0 and acc^0 = 1); from the L∞
    threshold on, cdist is d_∞, which d_p equals to rounding there; a NaN coordinate still gives NaN
    (finite p), unlike p = ∞."""
    require_backend(backend, device)
    g = torch.Generator().manual_seed(3)
    for dtype in DTYPES:
        x = (torch.randn(9, 5, generator=g, dtype=torch.float64) * 1e3).to(dtype).to(device)
        z = (torch.randn(7, 5, generator=g, dtype=torch.float64) * 1e-3).to(dtype).to(device)
        u = torch.finfo(dtype).eps / 2  # one rounding of each difference
        for p in (1e308, 1e30, 2 * lowering.linf_threshold(torch.float64)):
            got = kermac.cdist(x, z, p=p, backend=backend)
            torch.testing.assert_close(got.cpu().double(), _linf(x, z), rtol=u, atol=0, msg=f"p={p} {dtype}")
        x[2, 1] = math.nan
        got = kermac.cdist(x, z, p=1e308, backend=backend).cpu()
        assert got[2].isnan().all() and not got[torch.arange(9) != 2].isnan().any()
    for dtype in (torch.float16, torch.bfloat16, torch.float32):  # a threshold of their own
        p = lowering.linf_threshold(dtype)
        program = lowering.cdist_program(p, dtype=dtype)
        x = (torch.randn(9, 5, generator=g) * 30).to(dtype).to(device)
        z = torch.randn(7, 5, generator=g).to(dtype).to(device)
        got = kermac.run_program(program, x, z, backend=backend)
        # Rounded to the output type (truncated by Triton's CPU interpreter for bfloat16: a whole ulp).
        ulp = torch.finfo(dtype).eps
        torch.testing.assert_close(got.cpu().double(), _linf(x, z), rtol=ulp, atol=0, msg=str(dtype))
        below = lowering.cdist_program(p / 2, dtype=dtype)
        assert "p" in below.hypers and below.reduction == "sum"


def _stable_lp(x: torch.Tensor, z: torch.Tensor, p: float) -> torch.Tensor:
    """d_p in float64 without under/overflow: M·(Σ (|t|/M)^p)^(1/p), M = max|t|."""
    t = (x.cpu().double()[:, None, :] - z.cpu().double()[None, :, :]).abs()
    m = t.amax(-1, keepdim=True)
    scaled = torch.where(m > 0, t / m, 0.0)
    return m[..., 0] * (scaled**p).sum(-1) ** (1.0 / p)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
def test_large_p_is_exact_or_nan(backend: str, device: str, dtype: torch.dtype) -> None:
    """Between the plain limit and the L∞ threshold (the guarded program): each distance is NaN or
    within rounding of d_p — p = 50 with differences of 0.1 in float32 used to give 0, larger
    differences inf, and larger p 0 or 1 — and it is not NaN where d_p^p is well inside the range
    the guard trusts; an exact duplicate is at distance 0."""
    require_backend(backend, device)
    g = torch.Generator().manual_seed(11)
    u = torch.finfo(dtype).eps / 2
    for p in (lowering.plain_power_limit(dtype) * 1.01, 50.0, 300.0, 1e4):
        program = lowering.cdist_program(p, dtype=dtype)
        assert program == lowering.guarded_lp_program(dtype)
        scale = 10.0 ** torch.empty(12, 1, dtype=torch.float64).uniform_(-3, 2, generator=g)
        x = (torch.randn(12, 6, generator=g, dtype=torch.float64) * scale).to(dtype)
        z = torch.cat([x[:3], (torch.randn(5, 6, generator=g, dtype=torch.float64) * 0.1).to(dtype)])
        got = kermac.run_program(program, x.to(device), z.to(device), hypers={"p": p}, backend=backend)
        got = got.cpu().double()
        exact = _stable_lp(x, z, p)
        assert torch.equal(got.diagonal()[:3], torch.zeros(3, dtype=torch.float64)), "duplicates must be 0"
        computed = ~got.isnan()
        rel = ((got - exact).abs() / exact.clamp_min(1e-300))[computed & (exact > 0)]
        assert (rel <= 64 * u).all(), f"p={p}: relative error {rel.max().item():.3g} on a returned value"
        tiny, huge = torch.finfo(dtype).smallest_normal, torch.finfo(dtype).max
        power = exact**p
        trusted = (power * p > lowering.MAX_FEATURES * tiny / u * 4) & (power < huge / lowering.MAX_FEATURES / 4)
        assert computed[trusted].all(), f"p={p}: NaN where d_p^p = {exact[trusted & ~computed][:3].tolist()}"
    x = torch.full((1, 4), 0.1, dtype=dtype)
    got = kermac.run_program(
        lowering.cdist_program(50.0, dtype=dtype), x.to(device), torch.zeros(1, 4, dtype=dtype, device=device),
        hypers={"p": 50.0}, backend=backend,
    )  # fmt: skip
    expected = _stable_lp(x, torch.zeros(1, 4, dtype=dtype), 50.0)
    assert got.isnan().all() if dtype == torch.float32 else torch.allclose(got.cpu().double(), expected, rtol=1e-12)


def test_thresholds() -> None:
    """The documented values (docs/formulas.md): L∞ from 64·ln 2/u of the output type, the plain
    formula up to log(2³¹·F)/log(u) of the compute type; ``dtype=None`` is float64's."""
    assert 7.4e8 < lowering.linf_threshold(torch.float32) < 7.5e8
    assert 3.9e17 < lowering.linf_threshold(torch.float64) < 4.1e17
    assert 9.0e4 < lowering.linf_threshold(torch.float16) < 9.2e4
    assert 1.1e4 < lowering.linf_threshold(torch.bfloat16) < 1.2e4
    assert 3.9 < lowering.plain_power_limit(torch.float32) == lowering.plain_power_limit(torch.bfloat16) < 4.0
    assert 18.6 < lowering.plain_power_limit(torch.float64) == lowering.plain_power_limit(None) < 18.8
    assert lowering.cdist_program(3.0, dtype=torch.float32) == kermac.presets.lp_distance.lower()
    assert lowering.cdist_program(4.0, dtype=torch.float32) == lowering.guarded_lp_program(torch.float32)
    assert lowering.cdist_program(4.0, dtype=torch.float64) == kermac.presets.lp_distance.lower()
    # A tensor p runs the plain formula (its values are limited to plain_power_limit by kermac.cdist).
    assert lowering.cdist_program(None, dtype=torch.float64) == kermac.presets.lp_distance.lower()
    # skip_epilogue returns the sum of p-th powers itself, for every finite p (NaN for a NaN p).
    for p in (50.0, 1e308, None):
        assert lowering.cdist_program(p, skip_epilogue=True).epilogue == nan_where_nan(kermac.ir.Var("acc"), "p")
