"""kermac.zoo: every ready kernel against its formula in float64 (written here from the formulas, with plain
broadcasting) on the CPU backends — the reference backend and the Triton interpreter — and the preset-equivalent
ones producing the preset's canonical key, so they run the preset's kernel."""

from __future__ import annotations

import pytest
import torch
from helpers import CPU_BACKENDS, assert_close, ref_grad, require_backend, require_nvrtc_compiler

from kermac import presets, zoo
from kermac.dsl import GradKernel, Kernel, canonical_key
from kermac.lowering import grad_program
from kermac.programs import (
    is_abs_difference_sum,
    is_product_sum,
    is_squared_difference_sum,
    signed_power,
)

F64 = torch.float64
TOL = 1e-12


def _inputs(*batch: int, m: int = 7, n: int = 5, d: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(*batch, m, d, dtype=F64), torch.randn(*batch, n, d, dtype=F64)


def _diff(x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    return x[..., :, None, :] - z[..., None, :, :]  # [..., M, N, D]


def _dot(x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    return x @ z.transpose(-1, -2)


# (kernel, hyperparameters, reference(x, z)) for every pairwise kernel of the zoo
CASES = {
    "Gemm": (zoo.Gemm(), {}, _dot),
    "NormL1": (zoo.NormL1(), {}, lambda x, z: _diff(x, z).abs().sum(-1)),
    "NormL2": (zoo.NormL2(), {}, lambda x, z: _diff(x, z).pow(2).sum(-1).sqrt()),
    "NormLp": (
        zoo.NormLp(epsilon=2.5),
        {"p_inner": 1.3, "p_outer": 1 / 1.3},
        lambda x, z: (lambda s: torch.where(s < 2.5, 0.0, s))(_diff(x, z).abs().pow(1.3).sum(-1).pow(1 / 1.3)),
    ),
    "Gaussian": (
        zoo.Gaussian(),
        {"bandwidth": 1.7},
        lambda x, z: torch.exp(-_diff(x, z).pow(2).sum(-1) / (2 * 1.7**2)),
    ),
    "LaplaceL1": (zoo.LaplaceL1(), {"bandwidth": 2.5}, lambda x, z: torch.exp(-_diff(x, z).abs().sum(-1) / 2.5)),
    "LaplaceL2": (zoo.LaplaceL2(), {"bandwidth": 1.5}, lambda x, z: torch.exp(-_diff(x, z).norm(dim=-1) / 1.5)),
    "Polynomial": (
        zoo.Polynomial(),
        {"gamma": 0.5, "coef0": 1.0, "degree": 3.0},
        lambda x, z: (0.5 * _dot(x, z) + 1.0) ** 3,
    ),
    "Sigmoid": (zoo.Sigmoid(), {"gamma": 0.3, "coef0": -0.2}, lambda x, z: torch.tanh(0.3 * _dot(x, z) - 0.2)),
    "LpqLaplace": (
        zoo.LpqLaplace(),
        {"p": 1.5, "q": 0.8, "bandwidth": 2.0},
        lambda x, z: torch.exp(-((_diff(x, z).abs().pow(1.5).sum(-1) ** (1 / 1.5)) ** 0.8) / 2.0**0.8),
    ),
    "SumPowerLaplace": (
        zoo.SumPowerLaplace(const_mix=0.1, power=1.5),
        {"bandwidth": 1.3, "exponent": 0.7},
        lambda x, z: (0.9 * torch.exp(-_diff(x, z).abs().pow(0.7) / 1.3**0.7).mean(-1) + 0.1) ** 1.5,
    ),
}


def test_every_kernel_of_the_zoo_is_tested() -> None:
    pairwise = {n for n in zoo.__all__ if not n.endswith("Grad")} - {"Mahalanobis"}
    assert pairwise == set(CASES)
    assert {n for n in zoo.__all__ if n.endswith("Grad")} == set(GRAD_CASES)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_kernel_against_its_formula(name: str, backend: str) -> None:
    require_backend(backend, "cpu")
    kernel, hypers, ref = CASES[name]
    x, z = _inputs()
    assert isinstance(kernel, Kernel)
    assert_close(kernel(x, z, backend=backend, **hypers), ref(x, z), TOL)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_batched_hyperparameters_of_a_zoo_kernel(backend: str) -> None:
    """One bandwidth per batch entry, also for a bound hyperparameter given as a tensor."""
    require_backend(backend, "cpu")
    x, z = _inputs(3)
    sigma = torch.tensor([0.5, 1.0, 2.0], dtype=F64)
    out = zoo.Gaussian()(x, z, bandwidth=sigma, backend=backend)
    assert_close(out, torch.exp(-_diff(x, z).pow(2).sum(-1) / (2 * sigma[:, None, None] ** 2)), TOL)
    eps = torch.tensor([0.0, 1e9, 0.0], dtype=F64)
    lp = zoo.NormLp(epsilon=eps)(x, z, p_inner=2.0, p_outer=0.5, backend=backend)
    d = _diff(x, z).norm(dim=-1)
    assert_close(lp, torch.where(torch.arange(3)[:, None, None] == 1, 0.0, d), TOL)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_mahalanobis_scales_every_feature(backend: str) -> None:
    require_backend(backend, "cpu")
    x, z = _inputs()
    s = torch.tensor([0.5, 2.0, 1.0], dtype=F64)
    metric = torch.diag(s**2)
    t = _diff(x, z)
    dist = torch.einsum("mnk,kl,mnl->mn", t, metric, t).sqrt()
    assert_close(zoo.Mahalanobis()(x, z, scale=s, bandwidth=1.5, backend=backend), torch.exp(-dist / 1.5), TOL)
    gauss = zoo.Mahalanobis(zoo.Gaussian())
    assert_close(gauss(x, z, scale=s, bandwidth=2.0, backend=backend), torch.exp(-(dist**2) / 8.0), TOL)
    v = torch.randn(5, 2, dtype=F64)
    assert_close(gauss.product(x, z, v, scale=s, bandwidth=2.0, backend=backend), torch.exp(-(dist**2) / 8.0) @ v, TOL)


def test_mahalanobis_bad_input() -> None:
    x, z = _inputs()
    with pytest.raises(TypeError, match="scale: expected a tensor of one value per feature, got float"):
        zoo.Mahalanobis()(x, z, scale=2.0, bandwidth=1.0)
    with pytest.raises(ValueError, match=r"scale: expected shape \[\.\.\., 3\] .* got \[2\]"):
        zoo.Mahalanobis()(x, z, scale=torch.ones(2, dtype=F64), bandwidth=1.0)
    with pytest.raises(ValueError, match=r"scale: expected a tensor of x's dtype and device \(torch\.float64, cpu\)"):
        zoo.Mahalanobis()(x, z, scale=torch.ones(3), bandwidth=1.0)
    with pytest.raises(TypeError, match=r"kernel: expected a kermac\.dsl\.Kernel"):
        zoo.Mahalanobis(presets.gaussian)


def test_sum_power_laplace_passes_the_feature_count() -> None:
    x, z = _inputs(d=6)
    k = zoo.SumPowerLaplace()
    ref = torch.exp(-_diff(x, z).abs().pow(1.2) / 2.0**1.2).mean(-1) ** 2
    assert_close(k(x, z, bandwidth=2.0, exponent=1.2), ref, TOL)
    v = torch.randn(5, 1, dtype=F64)
    assert_close(k.product(x, z, v, bandwidth=2.0, exponent=1.2), ref @ v, TOL)
    bound = k.bind(bandwidth=2.0)
    assert isinstance(bound, zoo.SumPowerLaplace)  # bind keeps the class, and with it the feature count
    assert_close(bound(x, z, exponent=1.2), ref, TOL)


# -- the same kernels as the presets ---------------------------------------------------------------

PRESET_EQUIVALENTS = {
    "Gemm": (presets.dot_product, is_product_sum),
    "NormL1": (presets.l1_distance, is_abs_difference_sum),
    "NormL2": (presets.l2_distance, is_squared_difference_sum),
    "Gaussian": (presets.gaussian, is_squared_difference_sum),
    "LaplaceL1": (presets.laplace_l1, is_abs_difference_sum),
    "LaplaceL2": (presets.laplace_l2, is_squared_difference_sum),
}


@pytest.mark.parametrize("name", sorted(PRESET_EQUIVALENTS))
def test_preset_equivalents_have_the_presets_canonical_key(name: str) -> None:
    """Written as a user writes them (`(x - z) ** 2`), they canonicalise to the preset's program and so share its
    fast path: the fact the backends choose by holds for both."""
    preset, fact = PRESET_EQUIVALENTS[name]
    traced = CASES[name][0].program
    assert canonical_key(traced) == canonical_key(preset.lower())
    assert fact(traced) and fact(preset.lower())


# -- the gradient zoo ---------------------------------------------------------------------------


def _grad_inputs(*batch: int) -> tuple[torch.Tensor, ...]:
    k, m, n, o = 9, 5, 4, 3
    a, b = torch.randn(*batch, k, m, dtype=F64), torch.randn(*batch, n, k, dtype=F64)
    c, d = torch.randn(*batch, o, k, dtype=F64), torch.randn(*batch, n, m, dtype=F64)
    b[..., 0, 0] = d[..., 0, 0]  # a tie t = 0, whose term is 0
    return a, b, c, d


def _ref_floor_grad(a, b, c, d, q: float, eps: float) -> torch.Tensor:
    t = d[..., :, :, None] - b[..., :, None, :]
    phi = torch.where(t != 0, torch.sign(t) * t.abs().clamp_min(eps).pow(q), torch.zeros_like(t))
    return torch.einsum("...ok,...km,...nmk->...onm", c, a, phi)


GRAD_CASES = {
    "NormL1Grad": (zoo.NormL1Grad(), {}, lambda a, b, c, d: ref_grad(a, b, c, d, 1.0)),
    "NormL2Grad": (zoo.NormL2Grad(), {}, lambda a, b, c, d: ref_grad(a, b, c, d, 2.0)),
    "NormLpGrad": (zoo.NormLpGrad(), {"p_power_grad": 0.3}, lambda a, b, c, d: ref_grad(a, b, c, d, 1.3)),
}


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("name", sorted(GRAD_CASES))
def test_gradient_kernel_against_its_formula(name: str, backend: str) -> None:
    require_backend(backend, "cpu", "grad")
    kernel, hypers, ref = GRAD_CASES[name]
    assert isinstance(kernel, GradKernel)
    a, b, c, d = _grad_inputs(2)
    assert_close(kernel(a, b, c, d, backend=backend, **hypers), ref(a, b, c, d), TOL)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_lp_gradient_with_a_floor(backend: str) -> None:
    require_backend(backend, "cpu", "grad")
    a, b, c, d = _grad_inputs()
    out = zoo.NormLpGrad(epsilon=0.5)(a, b, c, d, p_power_grad=-0.4, backend=backend)
    assert_close(out, _ref_floor_grad(a, b, c, d, -0.4, 0.5), TOL)
    assert torch.isfinite(out).all()
    with pytest.raises(ValueError, match=r"epsilon: expected a number >= 0, got -1\.0"):
        zoo.NormLpGrad(epsilon=-1.0)


def test_gradient_zoo_runs_the_cdist_grad_kernels() -> None:
    assert zoo.NormL1Grad().key() == grad_program(1.0).key()
    assert zoo.NormL2Grad().key() == grad_program(2.0).key()
    lp = zoo.NormLpGrad().program
    assert signed_power(lp.multiply) is not None and signed_power(grad_program(1.3).multiply) is not None
    assert canonical_key(lp).split(";")[1] == canonical_key(grad_program(1.3)).split(";")[1].replace(
        "(sub $p 1.0)", "$p_power_grad"
    )
    assert signed_power(zoo.NormLpGrad(epsilon=0.1).program.multiply) is None  # the floor is another term


# -- mm-kermac's README, line by line ---------------------------------------------------------------


def test_mm_kermac_quickstart_numbers() -> None:
    """mm-kermac's quickstart: Gemm, NormL2 and NormLp with p_inner = p, p_outer = 1/p given as 0-d tensors."""
    x, z = _inputs(m=12, n=10, d=8)
    out = torch.empty(12, 10, dtype=F64)
    zoo.Gemm()(x=x, z=z, out=out)
    assert_close(out, _dot(x, z), TOL)
    zoo.NormL2()(x=x, z=z, out=out)
    assert_close(out, torch.cdist(x, z, compute_mode="donot_use_mm_for_euclid_dist"), TOL)
    p = 1.3
    zoo.NormLp(epsilon=0.0)(
        x=x, z=z, p_inner=torch.tensor(p, dtype=F64), p_outer=torch.tensor(1 / p, dtype=F64), out=out
    )
    assert_close(out, torch.cdist(x, z, p), TOL)


# -- NVRTC: every zoo program compiles (no GPU needed) -----------------------------------------------


@pytest.mark.parametrize("name", sorted(zoo.__all__))
def test_zoo_program_compiles_to_cubin_on_nvrtc(name: str, tmp_path, monkeypatch) -> None:
    """The NVRTC backend renders and compiles every zoo program (sm_90 cubin, a private cache): no IR operation
    or hyperparameter of the zoo lacks a rendering."""
    require_nvrtc_compiler()
    from kermac.hyperparams import HyperValue
    from kermac.problem import grad_problem, pairwise_problem
    from kermac_backend_nvrtc import compiler, plan
    from kermac_backend_nvrtc.source import kernel_source
    from kermac_backend_nvrtc.tuning import NvrtcTuning

    monkeypatch.setenv("KERMAC_CACHE_DIR", str(tmp_path / "cache"))
    kernel = getattr(zoo, name)()
    hypers = {h: HyperValue(h, 1.5) for h in kernel.program.hypers}
    f32 = torch.float32
    if isinstance(kernel, GradKernel):
        a, b, c, d = (t.to(f32) for t in _grad_inputs())
        problem = grad_problem(kernel.program, a, b, c, d, out=None, hypers=hypers)
        variant, source_name = plan.plan_grad(problem, None, NvrtcTuning())[0], "kermac_grad"
    else:
        x, z = (t.to(f32) for t in _inputs())
        problem = pairwise_problem(kernel.program, x, z, out=None, hypers=hypers)
        variant, source_name = plan.plan_pairwise(problem, None, NvrtcTuning())[0], "kermac_pairwise"
    built = compiler.compile_cubin(kernel_source(variant)[0], "sm_90", name=source_name)
    assert built.cubin[:4] == b"\x7fELF"
