"""NVRTC backend without a GPU: exponents that a scalar hyperparameter makes a multiple of 1/2
(cdist p = 0.5, 1.5, 3; the gradient's p − 1 = 0.5, 2) become products and at most one square root
(``km_powhalf``), planned, rendered and compiled for sm_80 and sm_90.  Values on a GPU, against
float64: test_cdist.py (p = 0.5, 3), test_cdist_grad.py (p = 1.5, 3; IEEE special values for
exponents 0.5 and 1.5) and test_nvrtc_gpu.py's gradient shapes (p = 1.5, 3) beside p = 1.3 and 1.7
on the general power."""

from __future__ import annotations

import math
import re

import pytest
import torch
from helpers import require_nvrtc_compiler

import kermac
from kermac import ir, presets
from kermac.hyperparams import HyperValue
from kermac.lowering import grad_program
from kermac.problem import grad_problem, pairwise_problem

pytest.importorskip("kermac_backend_nvrtc.source")
pytest.importorskip("cuda.core")
from kermac_backend_nvrtc import compiler, plan, render, variants
from kermac_backend_nvrtc.source import kernel_source
from kermac_backend_nvrtc.tuning import DEFAULT_TUNING, NvrtcTuning

require_nvrtc_compiler(module_level=True)

P, Q = ir.Hyper("p"), ir.Hyper("q")


def _hv(**values: float | torch.Tensor) -> dict[str, HyperValue]:
    return {k: HyperValue(k, v) if isinstance(v, float) else HyperValue(k, None, v) for k, v in values.items()}


def _cdist(p: float | torch.Tensor, dtype: torch.dtype = torch.float32):
    x, z = torch.randn(37, 13, dtype=dtype), torch.randn(29, 13, dtype=dtype)
    return pairwise_problem(presets.lp_distance.lower(), x, z, out=None, hypers=_hv(p=p))


def _grad(p: float | torch.Tensor, o: int = 16, dtype: torch.dtype = torch.float32):
    k, m, n = 21, 19, 11
    a, b, c, d = (torch.randn(*s, dtype=dtype) for s in ((k, m), (n, k), (o, k), (n, m)))
    return grad_problem(grad_program(None), a, b, c, d, out=None, hypers=_hv(p=p))


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KERMAC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(compiler, "_memo", {})


@pytest.mark.parametrize(
    ("b", "steps"),
    [(0.5, 1), (1.0, 2), (1.5, 3), (4.0, 8), (0.0, None), (0.25, None), (4.5, None), (-0.5, None), (math.inf, None)],
)
def test_half_steps_of_constants(b: float, steps: int | None) -> None:
    assert render.half_steps(ir.Const(b), {}) == steps


def test_half_steps_evaluate_hyperparameters_and_arithmetic() -> None:
    assert render.half_steps(P - 1.0, {"p": 1.5}) == 1  # the gradient's p − 1
    assert render.half_steps(P * 2.0 + (-Q), {"p": 1.5, "q": 1.0}) == 4
    assert render.half_steps(P - 1.0, {}) is None  # p not known
    assert render.half_steps(P / 2.0, {"p": 3.0}) is None  # division is not evaluated
    assert render.half_steps(ir.sqrt(P), {"p": 4.0}) is None


def test_half_power_hypers_only_where_an_exponent_becomes_a_half_step() -> None:
    x, z = ir.Var("x"), ir.Var("z")
    lp = presets.lp_distance.lower()
    assert render.half_power_hypers([lp.inner, lp.epilogue], {"p": 1.5}) == (("p", 1.5),)
    assert render.half_power_hypers([lp.inner, lp.epilogue], {"p": 1.3}) == ()
    assert render.half_power_hypers([lp.inner], {}) == ()  # p a tensor: not among the scalars
    both = ir.pow(abs(x - z), P - Q)
    assert render.half_power_hypers([both], {"p": 2.0, "q": 0.5}) == (("p", 2.0), ("q", 0.5))
    assert render.half_power_hypers([both], {"p": 2.0}) == ()  # q is a tensor
    assert render.half_power_hypers([ir.pow(x, P)], {"p": 2.0}) == ()  # not a power of |·|


def test_render_uses_products_and_one_square_root() -> None:
    names = {"x": "x", "z": "z", "d": "d", "b": "b"}  # a hyperparameter p is h_p
    on = {"half_powers": True}
    x, z = ir.Var("x"), ir.Var("z")
    assert (
        render.render_expr(ir.pow(abs(x - z), P), names, **on, known={"p": 1.5})
        == "km_powhalf<3, false>(km_abs((x - z)))"
    )
    assert "km_powhalf<3, true>" in render.render_expr(ir.pow(abs(x - z), P), names, ftz=True, **on, known={"p": 1.5})
    # |a|^(1/2) keeps subnormal a (as the general power does below an exponent of 1).
    assert "km_powhalf<1, false>" in render.render_expr(ir.pow(abs(x - z), P), names, ftz=True, **on, known={"p": 0.5})
    signed = grad_program(None).multiply
    text = render.render_expr(signed, names, ftz=True, **on, known={"p": 1.5})
    assert text == "km_signpowhalf<1, true>((d - b))"
    assert render.render_expr(signed, names, ftz=True, **on, known={"p": 1.3}).startswith("km_signpow(")
    # Off: the general power, also for a constant exponent.
    assert "km_powabs" in render.render_expr(ir.pow(abs(x - z), 1.5), names, known={})
    assert "km_powhalf<3" in render.render_expr(ir.pow(abs(x - z), 1.5), names, **on, known={})


def test_plan_fixes_half_step_values_and_skips_the_split() -> None:
    for p, known in ((0.5, (("p", 0.5),)), (1.5, (("p", 1.5),)), (3.0, (("p", 3.0),)), (1.3, ()), (5.0, ())):
        variant = plan.plan_pairwise(_cdist(p), None, DEFAULT_TUNING)[0]
        assert variant.fixed_hypers == known, p
        split = isinstance(variant, variants.SplitPowerPairwise)
        assert split != (bool(known) or p < 1), p  # no ex2 split for products
    assert plan.plan_pairwise(_cdist(torch.tensor([1.5])), None, DEFAULT_TUNING)[0].fixed_hypers == ()
    assert plan.plan_grad(_grad(1.5), None, DEFAULT_TUNING)[0].fixed_hypers == (("p", 1.5),)
    assert plan.plan_grad(_grad(1.25), None, DEFAULT_TUNING)[0].fixed_hypers == ()
    assert plan.plan_grad(_grad(0.5), None, DEFAULT_TUNING)[0].fixed_hypers == ()  # p − 1 < 0: the general power
    # Different values are different kernels; other values share one.
    planned = {p: plan.plan_pairwise(_cdist(p), None, DEFAULT_TUNING)[0] for p in (1.5, 2.5, 1.3, 1.7)}
    assert planned[1.5] != planned[2.5] and planned[1.3] == planned[1.7]


def test_setting_keeps_the_general_power() -> None:
    off = NvrtcTuning(half_powers=False)
    variant = plan.plan_pairwise(_cdist(1.5), None, off)[0]
    assert not variant.half_powers and variant.fixed_hypers == ()
    assert "km_powhalf<3" not in kernel_source(variant)[0]
    assert isinstance(variant, variants.SplitPowerPairwise)
    assert plan.plan_grad(_grad(1.5), None, off)[0].fixed_hypers == ()


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_half_power_variants_compile(arch: str, dtype: torch.dtype) -> None:
    problems = [_cdist(p, dtype) for p in (0.5, 1.5, 3.0)]
    x, z = torch.randn(37, 13, dtype=dtype), torch.randn(29, 13, dtype=dtype)
    problems += [pairwise_problem(presets.laplace_lp.lower(), x, z, out=None, hypers=_hv(p=2.5, bandwidth=1.0))]
    problems += [_grad(p, o, dtype) for p in (1.5, 3.0) for o in (4, 16)]  # SIMT and (float32) tensor cores
    tuning = NvrtcTuning(flush_subnormals=dtype != torch.float16)  # both forms of the square root
    for problem in problems:
        grad = isinstance(problem, kermac.problem.GradProblem)
        variant = (plan.plan_grad if grad else plan.plan_pairwise)(problem, int(arch[3:]), tuning)[0]
        assert variant.fixed_hypers, problem
        source = kernel_source(variant)[0]
        assert re.search(r"km_(sign)?powhalf<[1-8], (true|false)>\(", source), problem
        built = compiler.compile_cubin(source, variant.target(int(arch[3:])), name=variant.kernel)
        assert built.cubin[:4] == b"\x7fELF"


def test_half_steps_of_huge_exponents() -> None:
    """An exponent whose double overflows (p = 1e308: 2·p = inf) is no half step; round(inf) raised
    OverflowError while planning cdist(p=1e308, skip_epilogue=True) on the GPU."""
    assert render.half_steps(ir.Hyper("p"), {"p": 1e308}) is None
    assert render.half_steps(ir.Const(1e308), {}) is None
    assert render.half_steps(ir.Hyper("p") - 1.0, {"p": -1e308}) is None
    assert [render.half_steps(ir.Const(v), {}) for v in (0.5, 1.5, 4.0, 4.5, 0.25)] == [1, 3, 8, None, None]
