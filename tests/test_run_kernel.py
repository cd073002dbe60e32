"""kermac.run_kernel (descriptors, presets, kernel functions, regularisation, batched
hyperparameters) and kermac.run_program (user semiring programs) on every backend."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import BACKEND_DEVICES, assert_close, ref_cdist, ref_distance_sum, require_backend, tolerance
from test_cdist import make_layout, sizes

import kermac
from kermac import ir, presets


def median_bandwidth(x: torch.Tensor, z: torch.Tensor, p: float, scale: float = 1.0) -> float:
    """σ = scale × the median distance, the usual heuristic.  It keeps exp(−d/σ) well conditioned:
    its relative error is (d/σ) times the distance's, so σ far below d would test fp32's limits, not kermac."""
    return scale * float(ref_cdist(x, z, p).median())


def ref_kernel(name: str, d: torch.Tensor, sigma: float) -> torch.Tensor:
    """The kernel functions of docs/formulas.md on a float64 distance d."""
    if name == "laplace":
        return torch.exp(-d / sigma)
    if name == "gaussian":
        return torch.exp(-(d**2) / (2 * sigma**2))
    if name == "matern32":
        t = math.sqrt(3) * d / sigma
        return (1 + t) * torch.exp(-t)
    if name == "matern52":
        t = math.sqrt(5) * d / sigma
        return (1 + t + 5 * d**2 / (3 * sigma**2)) * torch.exp(-t)
    if name == "cauchy":
        return 1 / (1 + d**2 / sigma**2)
    raise AssertionError(name)


def ref_preset(name: str, x: torch.Tensor, z: torch.Tensor, p: float, sigma: float) -> torch.Tensor:
    """float64 reference of every preset, from first principles."""
    if name == "dot_product":
        return x.double().cpu() @ z.double().cpu().transpose(-1, -2)
    if name == "squared_l2_distance":
        return ref_distance_sum(x, z, 2.0)
    norms = {
        "l0_distance": 0.0,
        "l1_distance": 1.0,
        "l2_distance": 2.0,
        "lp_distance": p,
        "linf_distance": math.inf,
        "laplace_l1": 1.0,
        "laplace_l2": 2.0,
        "laplace_lp": p,
    }
    if name in norms:
        d = ref_cdist(x, z, norms[name])
        return ref_kernel("laplace", d, sigma) if name.startswith("laplace") else d
    return ref_kernel(name, ref_cdist(x, z, 2.0), sigma)


def preset_hypers(desc: kermac.KernelDescriptor, p: float, sigma: float) -> dict[str, float]:
    hypers = {}
    if desc.needs_p:
        hypers["p"] = p
    if desc.needs_bandwidth:
        hypers["bandwidth"] = sigma
    return hypers


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
@pytest.mark.parametrize("layout", ["contiguous", "broadcast", "transposed"])
@pytest.mark.parametrize("name", sorted(presets.ALL))
def test_presets(backend: str, device: str, layout: str, name: str) -> None:
    require_backend(backend, device)
    x, z = make_layout(layout, *sizes(device), torch.float32, device)
    desc = presets.ALL[name]
    sigma = median_bandwidth(x, z, {"laplace_l1": 1.0, "laplace_lp": 1.3}.get(name, 2.0))
    out = kermac.run_kernel(desc, x, z, backend=backend, **preset_hypers(desc, 1.3, sigma))
    assert_close(out, ref_preset(name, x, z, 1.3, sigma), tolerance(torch.float32))


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
@pytest.mark.parametrize(("offset_m", "offset_n"), [(0, 0), (3, 0), (0, 2), (-1, 4)])
def test_regularization_on_shifted_diagonal(backend: str, device: str, offset_m: int, offset_n: int) -> None:
    require_backend(backend, device)
    m, n, d = sizes(device)
    x, z = make_layout("contiguous", m, n, d, torch.float32, device)
    lam, sigma = 0.25, median_bandwidth(x, z, 1.0)
    out = kermac.run_kernel(
        "laplace_l1", x, z, bandwidth=sigma, regularization=lam, offset_m=offset_m, offset_n=offset_n, backend=backend
    )
    rows = torch.arange(m)[:, None] + offset_m
    cols = torch.arange(n)[None, :] + offset_n
    expected = ref_kernel("laplace", ref_cdist(x, z, 1.0), sigma) + lam * (rows == cols).double()
    assert_close(out, expected, tolerance(torch.float32))


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
def test_batched_hyperparameters(backend: str, device: str) -> None:
    """Bandwidths, p and λ given per batch entry compute every kernel matrix in one call."""
    require_backend(backend, device)
    m, n, d = sizes(device)
    x, z = make_layout("contiguous", m, n, d, torch.float32, device)
    ps, lams = [1.0, 1.5, 2.5], [0.0, 0.1, 1.0]
    sigmas = [median_bandwidth(x, z, p, scale) for p, scale in zip(ps, [0.5, 1.0, 4.0], strict=True)]
    t = lambda v: torch.tensor(v, device=device)  # noqa: E731
    out = kermac.run_kernel("laplace_lp", x, z, p=t(ps), bandwidth=t(sigmas), regularization=t(lams), backend=backend)
    eye = (torch.arange(m)[:, None] == torch.arange(n)[None, :]).double()
    expected = torch.stack(
        [ref_kernel("laplace", ref_cdist(x, z, p), s) + lam * eye for p, s, lam in zip(ps, sigmas, lams, strict=True)]
    )
    assert_close(out, expected, tolerance(torch.float32))
    # A 0-d device tensor and a length-1 tensor broadcast like numbers.
    sigma = median_bandwidth(x, z, 2.0)
    out = kermac.run_kernel("gaussian", x, z, bandwidth=t(sigma), backend=backend)
    assert_close(out, ref_kernel("gaussian", ref_cdist(x, z, 2.0), sigma), tolerance(torch.float32))
    out = kermac.run_kernel("gaussian", x, z, bandwidth=t([sigma]), backend=backend)
    assert_close(out, ref_kernel("gaussian", ref_cdist(x, z, 2.0), sigma)[None], tolerance(torch.float32))


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
def test_user_programs(backend: str, device: str) -> None:
    """Semiring programs written in the IR: mm-kermac's scaled difference and a tropical (min, +) product."""
    require_backend(backend, device)
    m, n, d = sizes(device)
    x, z = make_layout("contiguous", m, n, d, torch.float32, device)
    x64, z64 = x.double().cpu(), z.double().cpu()

    scaled = kermac.PairwiseProgram(
        ir.Hyper("beta") * (ir.Var("z") - ir.Var("x")), "sum", ir.Var("acc") * ir.Hyper("gamma")
    )
    out = kermac.run_program(scaled, x, z, hypers={"beta": 0.5, "gamma": 2.0}, backend=backend)
    assert_close(out, z64.sum(-1)[None, :] - x64.sum(-1)[:, None], 1e-5)

    tropical = kermac.PairwiseProgram(ir.Var("x") + ir.Var("z"), "min", ir.Var("acc"))
    out = kermac.run_program(tropical, x, z, backend=backend)
    assert_close(out, (x64[:, None, :] + z64[None, :, :]).amin(-1), 1e-6)

    clipped = kermac.PairwiseProgram(
        ir.select(ir.gt(abs(ir.Var("x") - ir.Var("z")), ir.Hyper("tau")), 1.0, 0.0),
        "max",
        ir.Var("acc") + ir.Var("diag"),
    )
    out = kermac.run_program(clipped, x, z, hypers={"tau": 2.5}, backend=backend)
    eye = (torch.arange(m)[:, None] == torch.arange(n)[None, :]).double()
    assert_close(out, ((x64[:, None, :] - z64[None, :, :]).abs() > 2.5).double().amax(-1) + eye, 1e-6)


INVALID = {  # hyperparameter -> (invalid values, a valid one)
    "bandwidth": ([0.0, -1.0, math.inf, math.nan], 1.5),
    "regularization": ([math.inf, -math.inf, math.nan], 0.25),
    "p": ([0.0, -1.0, math.inf, math.nan], 1.5),
}


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
@pytest.mark.parametrize("name", sorted(INVALID))
def test_invalid_tensor_hyperparameters_give_nan_batch_entries(backend: str, device: str, name: str) -> None:
    """Without debug (no host sync) an invalid value makes every entry of its batch entry NaN; the valid
    entries are exact.  Inputs with |x − z| = 1 everywhere (pow(1, NaN) = 1) and D = 1 included."""
    require_backend(backend, device)
    bad, good = INVALID[name]
    values = torch.tensor([good, *bad, good], device=device)
    hypers = {"p": 1.5, "bandwidth": 1.5, "regularization": 0.25} | {name: values}
    for x, z in [
        make_layout("contiguous", *sizes(device), torch.float32, device),
        (torch.zeros(3, 1, device=device), torch.tensor([[1.0], [-1.0]], device=device)),  # every |x − z| = 1
    ]:
        out = kermac.run_kernel("laplace_lp", x, z, backend=backend, **hypers).cpu()
        assert out.shape == (len(values), x.shape[0], z.shape[0])
        assert out[1:-1].isnan().all()
        eye = (torch.arange(x.shape[0])[:, None] == torch.arange(z.shape[0])[None, :]).double()
        expected = ref_kernel("laplace", ref_cdist(x, z, 1.5), 1.5) + 0.25 * eye
        assert_close(out[0], expected, tolerance(torch.float32))
        assert_close(out[-1], expected, tolerance(torch.float32))
    with pytest.raises(ValueError, match=f"{name}: expected"):
        kermac.run_kernel("laplace_lp", x, z, backend=backend, debug=True, **hypers)


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
def test_regularization_is_bit_identical_to_adding_it_on_the_diagonal(backend: str, device: str) -> None:
    """Finite λ (number or tensor, ±0 included) gives exactly e + (λ on the diagonal, +0 elsewhere):
    the NaN guard multiplies by exactly 1.  Epilogue values −0 come from a max of products −0."""
    require_backend(backend, device)
    desc = kermac.KernelDescriptor(inner="product", power="identity", reduction="max")
    x = torch.tensor([[-1.0, -2.0], [0.0, 0.0], [3.0, 0.5]], device=device)
    z = torch.tensor([[0.0, 0.0], [1.0, -1.0], [-0.5, 2.0], [0.0, 0.25]], device=device)
    plain = kermac.run_kernel(desc, x, z, backend=backend).cpu()
    assert (plain == 0).any() and plain[plain == 0].signbit().any()  # some −0 entries
    eye = torch.arange(3)[:, None] + 1 == torch.arange(4)[None, :]
    for lam in (0.0, -0.0, 0.25, -1.5, 3e38):
        expected = plain + torch.where(eye, torch.tensor(lam), torch.tensor(0.0))
        for given in (lam, torch.tensor([lam], device=device)):
            out = kermac.run_kernel(desc, x, z, regularization=given, offset_m=1, backend=backend).cpu().reshape(3, 4)
            assert torch.equal(out.view(torch.int32), expected.view(torch.int32)), (lam, out, expected)


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
def test_program_hyperparameters_are_not_range_checked(backend: str, device: str) -> None:
    """run_program's hyperparameters take any value (user programs): a negative tensor value is used as is."""
    require_backend(backend, device)
    x, z = make_layout("contiguous", *sizes(device), torch.float32, device)
    prog = kermac.PairwiseProgram(ir.Hyper("beta") * abs(ir.Var("x") - ir.Var("z")), "sum", ir.Var("acc"))
    out = kermac.run_program(prog, x, z, hypers={"beta": torch.tensor([-1.0, 0.0], device=device)}, backend=backend)
    assert_close(
        out, torch.stack([-ref_cdist(x, z, 1.0), torch.zeros(x.shape[0], z.shape[0], dtype=torch.float64)]), 1e-6
    )


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
def test_distance_presets_take_torch_cdists_special_values(backend: str, device: str) -> None:
    """The L0 and L∞ presets agree with torch.cdist (and kermac.cdist) on NaN and infinite coordinates:
    a NaN difference makes the count NaN and is skipped by the maximum."""
    require_backend(backend, device)
    nan, inf = math.nan, math.inf
    x = torch.tensor([[nan, 1.0, 0.0], [inf, 0.0, 2.0], [0.0, -inf, 1.0], [1.0, 2.0, 3.0]], device=device)
    z = torch.tensor([[0.0, 1.0, 0.0], [inf, 0.0, nan], [1.0, 2.0, 3.0]], device=device)
    for name, p in (("l0_distance", 0.0), ("linf_distance", inf)):
        got = kermac.run_kernel(name, x, z, backend=backend).cpu()
        expected = torch.cdist(x.cpu(), z.cpu(), p=p)
        torch.testing.assert_close(got, expected, equal_nan=True, msg=name)
        torch.testing.assert_close(got, kermac.cdist(x, z, p, backend=backend).cpu(), equal_nan=True)


def test_power_above_the_plain_limit_is_refused() -> None:
    """|x − z|^p with p above lowering.plain_power_limit loses accuracy: a number is refused at once, a
    tensor value makes its batch entry NaN (debug raises)."""
    from kermac.lowering import plain_power_limit

    x, z = torch.randn(4, 3), torch.randn(5, 3)
    limit = plain_power_limit(torch.float32)
    with pytest.raises(ValueError, match=r"p: expected a number > 0 and <= 3\.958.*float32.*got 4\.5"):
        kermac.run_kernel("laplace_lp", x, z, p=4.5, bandwidth=1.0)
    kermac.run_kernel("laplace_lp", x, z, p=limit, bandwidth=1.0)
    kermac.run_kernel("laplace_lp", x.double(), z.double(), p=4.5, bandwidth=1.0)  # float64's limit is 18.7
    out = kermac.run_kernel("laplace_lp", x, z, p=torch.tensor([1.5, 4.5]), bandwidth=1.0)
    assert out[1].isnan().all() and not out[0].isnan().any()
    with pytest.raises(ValueError, match=r"p: expected a number > 0 and <= 3\.958"):
        kermac.run_kernel("laplace_lp", x, z, p=torch.tensor([1.5, 4.5]), bandwidth=1.0, debug=True)
