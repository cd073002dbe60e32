"""NVRTC backend without a GPU: every kind of generated kernel compiles to cubin for sm_80 and sm_90,
and the generated source has the structure the IR asks for.

Problems are built on CPU tensors (planning reads only shapes, strides and alignment); NVRTC
compiles without a GPU.  Nothing here loads a module (that needs a device).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from helpers import require_nvrtc_compiler

import kermac
from kermac import ir, presets, testing
from kermac.hyperparams import HyperValue
from kermac.lowering import cdist_program, grad_program
from kermac.problem import grad_problem, pairwise_problem

pytest.importorskip("kermac_backend_nvrtc.source")
pytest.importorskip("cuda.core")
from kermac import kernel_facts
from kermac_backend_nvrtc import compiler, launcher, plan, render, tiles, variants
from kermac_backend_nvrtc.source import EXP2_COEFFS, kernel_file, kernel_source
from kermac_backend_nvrtc.tuning import NvrtcTuning

require_nvrtc_compiler(module_level=True)

ARCHS = ("sm_80", "sm_90")
M, N, D = 37, 29, 19


def _t(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64).to(dtype)


def _tensor_cores(v: object) -> bool:
    return isinstance(v, variants.MmaPairwise | variants.WgmmaPairwise | variants.MmaGrad | variants.SignGrad)


def _wgmma(v: object) -> bool:
    return isinstance(v, variants.WgmmaPairwise | variants.SignGrad)


def _padded_tail(v: object) -> bool:
    return isinstance(v, variants.SimtPairwise) and v.padded_tail


def _k_contiguous(v: object) -> bool:
    return isinstance(v, variants.KContiguousPairwise)


def _deep_k(v: object) -> bool:
    return isinstance(v, variants.SimtPairwise) and v.deep_k


def _split_pairs(v: object) -> int:
    return v.split.pairs if isinstance(v, variants.SplitPowerPairwise) else 0


def _table_degree(v: object) -> int:
    return (
        v.split.degree if isinstance(v, variants.SplitPowerPairwise) and isinstance(v.split, variants.PowerTable) else 0
    )


def _with_split(v: object, pairs: int, ftz: bool, degree: int) -> object:
    """SIMT variant ``v`` with ``pairs`` split pairs (0: none) on the ex2 polynomial or the table of ``degree``."""
    names = ("program", "tensor_hypers", "batch_dims", "hypers_at_least_one", "half_powers", "fixed_hypers")
    common = {n: getattr(v, n) for n in (*names, "dtype", "x", "z", "k_unroll")} | {"flush_subnormals": ftz}
    if not pairs:
        return variants.SimtPairwise(**common)
    split = variants.PowerTable(pairs, degree) if degree else variants.Ex2Polynomial(pairs)
    return variants.SplitPowerPairwise(**common, split=split)


def _hypers(**values: float | torch.Tensor) -> dict[str, HyperValue]:
    return {k: HyperValue(k, v) if isinstance(v, float) else HyperValue(k, None, v) for k, v in values.items()}


def _pw(program: kermac.PairwiseProgram, x: torch.Tensor | None = None, z: torch.Tensor | None = None, **hypers):
    x = _t(M, D) if x is None else x
    z = _t(N, D, dtype=x.dtype) if z is None else z
    return pairwise_problem(program, x, z, out=None, hypers=_hypers(**hypers))


def _gr(power: float | None, o: int = 16, dtype: torch.dtype = torch.float32, a: torch.Tensor | None = None, **hypers):
    k, m, n = 21, 19, 11
    a = _t(k, m, dtype=dtype) if a is None else a
    return grad_problem(
        grad_program(power),
        a,
        _t(n, k, dtype=dtype),
        _t(o, k, dtype=dtype),
        _t(n, m, dtype=dtype),
        out=None,
        hypers=_hypers(**hypers),
    )


def _every_op_program() -> kermac.PairwiseProgram:
    x, z, acc, diag, h = ir.Var("x"), ir.Var("z"), ir.Var("acc"), ir.Var("diag"), ir.Hyper("h")
    inner = (
        ir.select(ir.lt(x, z), ir.minimum(x, z) * h, ir.maximum(x, z) / (1.0 + abs(z)))
        + ir.sign(x - z)
        + ir.le(x, 0.0)
        + ir.gt(z, 0.5)
        + ir.ge(x, z)
        + ir.eq(x, z)
        - ir.ne(x, 1.0)
        + ir.pow(x, 2.0)
    )
    epi = ir.sqrt(abs(acc)) + ir.exp(-abs(acc)) + ir.log(1.0 + abs(acc)) + ir.select(diag, h, -math.inf) * 0.0
    return kermac.PairwiseProgram(inner=inner, reduction="max", epilogue=-epi)


LOGSUMEXP_SQUARES = kermac.PairwiseProgram(
    (ir.Var("x") - ir.Var("z")) * (ir.Var("x") - ir.Var("z")), "logsumexp", ir.exp(-ir.Var("acc"))
)
"""log Σ exp((x − z)²): the squared differences of the tensor-core programs under another reduction."""


def _cases() -> dict[str, object]:
    cases: dict[str, object] = {}
    for name, desc in presets.ALL.items():
        if name == "ALL":
            continue
        hy = {}
        if desc.needs_p:
            hy["p"] = 1.5
        if desc.needs_bandwidth:
            hy["bandwidth"] = 2.0
        cases[f"preset-{name}"] = _pw(desc.lower(), **hy)
    cases["laplace_l2-regularized"] = _pw(presets.laplace_l2.lower(regularized=True), bandwidth=1.0, regularization=0.1)
    cases["lp-p<1"] = _pw(presets.lp_distance.lower(), p=0.7)
    cases["lp-tensor-p-f32"] = _pw(presets.lp_distance.lower(), p=torch.tensor([0.5, 1.5, 3.0]))
    cases["laplace_lp-tensor-hypers-f64"] = _pw(
        presets.laplace_lp.lower(),
        p=torch.tensor([1.5], dtype=torch.float64),
        bandwidth=torch.tensor([1.0, 2.0], dtype=torch.float16),
    )
    for dtype in (torch.float64, torch.float16, torch.bfloat16):
        tag = str(dtype).removeprefix("torch.")
        x = _t(M, D, dtype=dtype)
        cases[f"l1-{tag}"] = _pw(presets.l1_distance.lower(), x, _t(N, D, dtype=dtype))
        cases[f"lp-{tag}"] = _pw(presets.lp_distance.lower(), x, _t(N, D, dtype=dtype), p=1.3)
        cases[f"gaussian-regularized-{tag}"] = _pw(
            presets.gaussian.lower(regularized=True), x, _t(N, D, dtype=dtype), bandwidth=1.0, regularization=1.0
        )
    cases["l1-vec-k"] = _pw(presets.l1_distance.lower(), _t(M, 16), _t(N, 16))
    cases["l1-vec-p"] = _pw(presets.l1_distance.lower(), _t(D, 128).T, _t(D, 64).T)
    cases["l1-scalar-p-fast"] = _pw(presets.l1_distance.lower(), _t(D, M).T, _t(D, N).T)
    cases["l1-sliced"] = _pw(presets.l1_distance.lower(), _t(2 * M, D + 3)[::2, 1 : D + 1], _t(N, 2 * D)[:, ::2])
    cases["l1-batch1"] = _pw(presets.l1_distance.lower(), _t(3, M, D), _t(3, N, D))
    cases["l1-batch2-broadcast"] = _pw(presets.l1_distance.lower(), _t(2, 1, M, D), _t(3, N, D))
    cases["every-op-max"] = _pw(_every_op_program(), h=0.5)
    # Constants a float cannot hold (subnormal, past its range, -0, NaN) in both compute types.
    x, z = ir.Var("x"), ir.Var("z")
    extreme = x * 1e-40 + z * 1e39 - 1e-310 + ir.select(x, -0.0, math.nan)
    extreme_program = kermac.PairwiseProgram(extreme, "min", ir.Var("acc") * 1e300 + 5e-324)
    cases["extreme-constants-f32"] = _pw(extreme_program)
    cases["extreme-constants-f64"] = _pw(extreme_program, _t(M, D, dtype=torch.float64), _t(N, D, dtype=torch.float64))
    # cdist's edge programs: the NaN-aware counts and maximum, the guarded large-p program.
    for p, dtype in ((0.0, torch.float32), (math.inf, torch.float32), (50.0, torch.float32), (50.0, torch.float64)):
        tag = f"cdist-p{p:g}-{str(dtype).removeprefix('torch.')}"
        hyper = {"p": p} if p == 50.0 else {}
        cases[tag] = _pw(cdist_program(p, dtype=dtype), _t(M, D, dtype=dtype), _t(N, D, dtype=dtype), **hyper)
    cases["every-op-min-f64"] = _pw(
        kermac.PairwiseProgram(_every_op_program().inner, "min", ir.Var("acc")),
        _t(M, D, dtype=torch.float64),
        _t(N, D, dtype=torch.float64),
        h=0.5,
    )
    # Log-sum-exp (kermac.reductions): the soft minimum in both compute types, a half input with a batched
    # tensor hyperparameter, and a sum of (x − z)² under it, which stays off the tensor cores.
    cases["logsumexp-soft-min"] = _pw(testing.SOFT_MIN, gamma=0.5)
    cases["logsumexp-soft-min-f64"] = _pw(
        testing.SOFT_MIN, _t(M, D, dtype=torch.float64), _t(N, D, dtype=torch.float64), gamma=0.5
    )
    cases["logsumexp-soft-min-f16-batched-gamma"] = _pw(
        testing.SOFT_MIN,
        _t(2, M, D, dtype=torch.float16),
        _t(N, D, dtype=torch.float16),
        gamma=torch.tensor([0.5, 2.0], dtype=torch.float16),
    )
    cases["logsumexp-squared-differences"] = _pw(LOGSUMEXP_SQUARES, _t(M, 32), _t(N, 32))
    for p in (1.0, 2.0):
        cases[f"grad-p{p:g}"] = _gr(p)
    cases["grad-p1.5"] = _gr(None, p=1.5)
    cases["grad-p0.5-tensor"] = _gr(None, p=torch.tensor([0.5, 1.5]))
    for o in (1, 2, 3, 5, 33):
        cases[f"grad-p1-o{o}"] = _gr(1.0, o=o)
    for dtype in (torch.float64, torch.float16, torch.bfloat16):
        cases[f"grad-p1.5-{str(dtype).removeprefix('torch.')}"] = _gr(None, dtype=dtype, p=1.5)
    cases["grad-a-transposed"] = _gr(2.0, a=_t(19, 21).T)
    # The tensor-core gradient (float32, O >= NvrtcTuning.tensor_core_grad_min_o): O in one or several chunks, views,
    # broadcast batches, tensor hyperparameters, a user program.
    k, m, n = 21, 19, 11
    cases["tc-grad-batch-broadcast-tensor-p"] = grad_problem(
        grad_program(None),
        _t(2, 1, k, m),
        _t(n, k),
        _t(3, 5, k),
        _t(1, n, m),
        out=None,
        hypers=_hypers(p=torch.tensor([[0.5], [1.5]])),
    )
    cases["tc-grad-views"] = grad_problem(
        grad_program(1.0), _t(m, k).T, _t(k, n).T, _t(k, 9).T, _t(m, n).T, out=None, hypers={}
    )
    cases["tc-grad-sign-batch-broadcast"] = grad_problem(
        grad_program(1.0), _t(2, 1, k, m), _t(n, k), _t(3, 12, k), _t(1, n, m), out=None, hypers={}
    )
    cases["tc-grad-sign-user-epilogue"] = grad_problem(
        kermac.GradProgram(ir.sign(ir.Var("d") - ir.Var("b")), ir.Var("acc") * ir.Hyper("s")),
        _t(2, k, m),
        _t(n, k),
        _t(6, k),
        _t(n, m),
        out=None,
        hypers=_hypers(s=torch.tensor([[0.5], [2.0]])),
    )
    cases["tc-grad-user-program"] = grad_problem(
        kermac.GradProgram(ir.Hyper("alpha") * ir.exp(-abs(ir.Var("d") - ir.Var("b"))), ir.Var("acc") * ir.Hyper("s")),
        _t(k, m),
        _t(n, k),
        _t(40, k),
        _t(n, m),
        out=None,
        hypers=_hypers(alpha=0.5, s=2.0),
    )
    # The tensor-core path (float32 sums of (x − z)²): load modes, batches, diag, tensor hyperparameters.
    l2 = presets.l2_distance.lower()
    cases["tc-l2-p-vec"] = _pw(l2, _t(D, 128).T, _t(D, 64).T)
    cases["tc-l2-sliced"] = _pw(l2, _t(2 * M, D + 3)[::2, 1 : D + 1], _t(N, 2 * D)[:, ::2])
    cases["tc-l2-batch2-broadcast"] = _pw(l2, _t(2, 1, M, 16), _t(3, N, 16))
    cases["tc-squared-l2"] = _pw(presets.squared_l2_distance.lower(), _t(M, 32), _t(N, 32))
    cases["tc-laplace_l2-tensor-bandwidth"] = _pw(
        presets.laplace_l2.lower(regularized=True),
        _t(M, 24),
        _t(N, 24),
        bandwidth=torch.tensor([1.0, 2.0]),
        regularization=0.5,
    )
    return cases


CASES = _cases()


#: The tuning these tests plan with: the cases' p = 1.5 and 3 stay on the general power here;
#: test_nvrtc_half_powers.py covers the products-and-square-root form those values get by default.  The
#: cases' few features take the sign product where O allows (its feature threshold: test_sign_product_needs_features).
TUNING = NvrtcTuning(half_powers=False, sign_product_min_features=1)


def _plan_pairwise(problem, capability: int | None = None, **changes: object) -> tuple:
    """``plan.plan_pairwise`` with :data:`TUNING`, the fields in ``changes`` replaced."""
    return plan.plan_pairwise(problem, capability, dataclasses.replace(TUNING, **changes))


def _plan_grad(problem, capability: int | None = None, **changes: object) -> tuple:
    """``plan.plan_grad`` with :data:`TUNING`, the fields in ``changes`` replaced."""
    return plan.plan_grad(problem, capability, dataclasses.replace(TUNING, **changes))


def _source(problem, **changes: object) -> str:
    if isinstance(problem, kermac.problem.GradProblem):
        return kernel_source(_plan_grad(problem, **changes)[0])[0]
    return kernel_source(_plan_pairwise(problem, **changes)[0])[0]


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KERMAC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(compiler, "_memo", {})


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_variant_compiles_to_cubin(case: str, arch: str) -> None:
    problem = CASES[case]
    name = "kermac_grad" if isinstance(problem, kermac.problem.GradProblem) else "kermac_pairwise"
    built = compiler.compile_cubin(_source(problem), arch, name=name)
    assert built.cubin[:4] == b"\x7fELF"
    assert not built.hit
    assert "registers" in built.ptxas  # the ptxas report (-v) is captured for debug output


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(
    ("pairs", "ftz", "degree"),
    [(0, False, 0), (44, True, 0), (44, False, 0), (64, True, 0), (28, True, 5), (38, True, 5), (32, True, 6),
     (64, True, 6)],
)  # fmt: skip
def test_split_variants_compile(arch: str, pairs: int, ftz: bool, degree: int) -> None:

    for case in ("preset-lp_distance", "preset-laplace_lp", "lp-float16"):
        variant = _with_split(_plan_pairwise(CASES[case])[0], pairs, ftz, degree)
        source, params = kernel_source(variant)
        assert f"#define KM_POW_TABLE {int(degree > 0)}" in source and f"#define KM_POW_DEGREE {degree}" in source
        coefficient_params = [f"pc{j}" for j in range(degree + 1)] if degree else []
        assert [p.name for p in params if p.name.startswith("pc")] == coefficient_params
        layout = launcher.argument_layout(params, "float")
        assert len(layout.unpack(bytes(layout.size))) == len(params)
        built = compiler.compile_cubin(source, arch, name="kermac_pairwise")
        assert built.cubin[:4] == b"\x7fELF"


@pytest.mark.parametrize(
    ("p", "degree", "bound"),
    [(1.0, 5, 2e-7), (1.05, 5, 9e-7), (1.3, 5, 9e-7), (1.5, 5, 9e-7), (2.0, 5, 2e-7), (2.7, 5, 9e-7), (3.0, 5, 2e-7),
     (3.05, 6, 3.2e-7), (3.5, 6, 3.2e-7), (4.0, 6, 3.2e-7), (4.6, 6, 4.5e-7), (5.0, 6, 3.2e-7)],
)  # fmt: skip
def test_pow_table_polynomial_accuracy(p: float, degree: int, bound: float) -> None:
    """The power table's mantissa polynomial, evaluated like the kernel (float32 Horner in m), is
    within 9e-7 of m^p over the float32 values of [1, 2) with degree 5 (p <= 3; exact in exact
    arithmetic for p = 1, 2, 3), 3.2e-7 with degree 6 up to p = 4 and 4.5e-7 up to 5 (4.4e-7 near
    p = 4.6).  The table entry 2^(e·p), rounded to float32, adds 2^-24, and the accumulating FFMA
    rounds only the sum.  Exponents outside [1, 5] are refused."""
    from kermac_backend_nvrtc import pow_table

    coeffs = pow_table.coefficients(p)
    assert pow_table.degree(p) == degree and len(coeffs) == degree + 1
    m = np.linspace(1, 2, 300_001)[:-1].astype(np.float32)
    acc = np.full_like(m, np.float32(coeffs[-1]))
    for c in coeffs[-2::-1]:
        acc = _fma32(acc, m, np.float32(c))
    assert np.abs(acc / m.astype(np.float64) ** p - 1).max() < bound
    for bad in (0.5, 5.5, math.inf):
        with pytest.raises(ValueError, match="power table"):
            pow_table.coefficients(bad)


def test_pow_table_is_planned_for_p_in_its_range() -> None:
    """A split program takes the power table for a number p in [1, 5] (coefficients as arguments:
    another p in the range reuses the kernel), the ex2 polynomial beyond; no table without ftz."""

    from kermac_backend_nvrtc import pow_table
    from kermac_backend_nvrtc.pow_table import coefficients as pow_table_coefficients

    lp = presets.lp_distance.lower()
    x, z = torch.empty(64, 16, device="meta"), torch.empty(64, 16, device="meta")

    def planned(p: float):
        return _plan_pairwise(pairwise_problem(lp, x, z, out=None, hypers={"p": HyperValue("p", p)}))

    (v13, l13), (v27, l27), (v46, l46), (v7, l7) = planned(1.3), planned(2.7), planned(4.6), planned(7.0)
    assert _table_degree(v13) == 5 and v13 == v27 and _split_pairs(v13) == TUNING.power_table_pairs
    assert _table_degree(v46) == 6 and _split_pairs(v46) == TUNING.power_table_pairs_high_p and "pc6" in l46.args
    coeffs13 = [l13.args[f"pc{j}"] for j in range(6)]
    assert sum(coeffs13) == pytest.approx(1.0, abs=1e-6) and l13.args["pc1"] != l27.args["pc1"]  # 1^p
    assert "pc6" not in l13.args and coeffs13 == list(pow_table.coefficients(1.3))
    assert not _table_degree(v7) and _split_pairs(v7) == TUNING.ex2_polynomial_pairs and "pc0" not in l7.args
    const = kermac.PairwiseProgram(ir.pow(abs(ir.Var("x") - ir.Var("z")), 2.5), "sum", ir.Var("acc"))
    vc, lc = _plan_pairwise(pairwise_problem(const, x, z, out=None, hypers={}))  # a constant exponent
    assert _table_degree(vc) == 5 and lc.args["pc1"] == pytest.approx(pow_table_coefficients(2.5)[1])


def test_split_needs_a_float_sum_of_powered_differences() -> None:

    ge1 = frozenset({"p"})
    lp = presets.lp_distance.lower()
    assert render.split_exponent(lp, ge1) == ir.Hyper("p")
    assert render.split_exponent(presets.laplace_lp.lower(), ge1) == ir.Hyper("p")
    assert render.split_exponent(lp, frozenset()) is None  # p not known >= 1 (p < 1, tensor p)
    x, z = ir.Var("x"), ir.Var("z")
    for inner, reduction in [
        (ir.pow(abs(x * z), ir.Hyper("p")), "sum"),
        (ir.pow(abs(x - z), ir.Hyper("p")), "max"),
        (ir.pow(abs(x - z), ir.Const(0.5)), "sum"),
        (abs(x - z), "sum"),
    ]:
        assert render.split_exponent(kermac.PairwiseProgram(inner, reduction, ir.Var("acc")), ge1) is None
    assert render.split_exponent(kermac.PairwiseProgram(ir.pow(abs(x - z), 3.0), "sum", ir.Var("acc")), ge1)
    for case in ("lp-p<1", "lp-tensor-p-f32", "lp-float64", "preset-l1_distance"):
        assert _split_pairs(_plan_pairwise(CASES[case])[0]) == 0, case
    variant = _with_split(_plan_pairwise(CASES["preset-l1_distance"])[0], 8, True, 0)
    with pytest.raises(ValueError, match="split power: needs a float sum of"):
        kernel_source(variant)


@pytest.mark.parametrize("arch", ARCHS)
def test_simt_p2_variant_compiles(arch: str) -> None:
    variant = _plan_pairwise(CASES["preset-l2_distance"], tensor_cores=False)[0]  # the SIMT difference kernel
    assert not _tensor_cores(variant)
    built = compiler.compile_cubin(kernel_source(variant)[0], arch, name="kermac_pairwise")
    assert built.cubin[:4] == b"\x7fELF"


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", ["grad-p1", "grad-p1.5", "grad-p0.5-tensor", "grad-a-transposed"])
def test_simt_grad_variant_compiles(arch: str, case: str) -> None:
    variant = _plan_grad(CASES[case], tensor_cores=False)[0]  # the SIMT float32 gradient
    assert not _tensor_cores(variant)
    built = compiler.compile_cubin(kernel_source(variant)[0], arch, name="kermac_grad")
    assert built.cubin[:4] == b"\x7fELF"


@pytest.mark.parametrize("arch", ARCHS)
def test_tc_grad_single_output_compiles(arch: str) -> None:
    # O = 1 on the tensor cores (one padded 8-wide chunk)
    variant, launch = _plan_grad(CASES["grad-p1-o1"], tensor_core_grad_min_o=1)
    assert _tensor_cores(variant) and variant.ot == 8 and launch.args["ochunks"] == 1
    built = compiler.compile_cubin(kernel_source(variant)[0], arch, name="kermac_grad")
    assert "registers" in built.ptxas


def test_plan_selects_tensor_cores_for_grad() -> None:
    expect = {"grad-p1": (16, 1), "grad-p1-o33": (16, 3), "tc-grad-views": (16, 1), "grad-p1.5": (16, 1)}
    expect |= {"grad-p1-o5": (8, 1), "tc-grad-batch-broadcast-tensor-p": (8, 1)}
    for case, (ot, ochunks) in expect.items():
        variant, launch = _plan_grad(CASES[case])
        assert _tensor_cores(variant) and variant.ot == ot and launch.args["ochunks"] == ochunks, case
        assert "tiles_n" in launch.args and "tiles_m" not in launch.args
    for case in ("grad-p1-o1", "grad-p1-o3"):  # O below TUNING.tensor_core_grad_min_o
        assert not _tensor_cores(_plan_grad(CASES[case])[0]), case
    for dtype in ("float64", "float16", "bfloat16"):
        assert not _tensor_cores(_plan_grad(CASES[f"grad-p1.5-{dtype}"])[0])
    variant, launch = _plan_grad(CASES["grad-p1"], tensor_cores=False)
    assert not _tensor_cores(variant) and "tiles_m" in launch.args


def test_plan_selects_tensor_cores_for_squared_differences() -> None:
    for name in ("l2_distance", "squared_l2_distance", "gaussian", "laplace_l2", "matern32", "matern52", "cauchy"):
        assert _tensor_cores(_plan_pairwise(CASES[f"preset-{name}"])[0]), name
    for name in ("preset-l1_distance", "preset-lp_distance", "preset-dot_product", "every-op-max"):
        assert not _tensor_cores(_plan_pairwise(CASES[name])[0]), name
    for dtype in (torch.float64, torch.float16, torch.bfloat16):  # other dtypes keep the SIMT path
        problem = _pw(presets.l2_distance.lower(), _t(M, D, dtype=dtype), _t(N, D, dtype=dtype))
        assert not _tensor_cores(_plan_pairwise(problem)[0])
    user = kermac.PairwiseProgram(
        inner=(ir.Var("x") - ir.Var("z")) * (ir.Var("x") - ir.Var("z")),
        reduction="sum",
        epilogue=ir.exp(-ir.Var("acc")),
    )
    assert _tensor_cores(_plan_pairwise(_pw(user))[0])  # structural match, any epilogue
    launch = _plan_pairwise(CASES["preset-l2_distance"])[1]
    assert launch.args["ovec"] == 0  # N = 29 columns: rows of odd stride, no paired stores
    assert launch.args["guard"] == kernel_facts.cancellation_guard(D)


def test_few_features_keep_the_simt_kernel() -> None:
    """Below `tensor_core_min_d` features a (x − z)² program runs the SIMT kernel; the setting moves the bound."""
    l2 = presets.l2_distance.lower()
    for d, tensor_cores in ((1, False), (15, False), (16, True), (17, True)):
        assert _tensor_cores(_plan_pairwise(_pw(l2, _t(M, d), _t(N, d)))[0]) is tensor_cores, d
    assert _tensor_cores(_plan_pairwise(_pw(l2, _t(M, 3), _t(N, 3)), tensor_core_min_d=1)[0])
    assert not _tensor_cores(_plan_pairwise(_pw(l2, _t(M, 40), _t(N, 40)), tensor_core_min_d=41)[0])


def test_tensor_core_epilogue_inlining_switch() -> None:
    """Inlined by default; inline_expensive_epilogue off calls div/exp/sqrt/pow/log epilogues (__noinline__)."""
    assert not _plan_pairwise(CASES["preset-gaussian"])[0].call_epilogue
    for name, inline in (("gaussian", False), ("l2_distance", False), ("squared_l2_distance", True)):
        variant = _plan_pairwise(CASES[f"preset-{name}"], inline_expensive_epilogue=False)[0]
        assert (not variant.call_epilogue) is inline, name
        source = kernel_source(variant)[0]
        assert f"__device__ {'__forceinline__' if inline else '__noinline__'} km_t km_epilogue(" in source
    laplace_l1 = _plan_pairwise(CASES["preset-laplace_l1"], inline_expensive_epilogue=False)[0]
    assert "__device__ __forceinline__ km_t km_epilogue(" in kernel_source(laplace_l1)[0]  # SIMT kernels always do


def test_source_tensor_cores() -> None:
    src = _source(CASES["preset-gaussian"])
    assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in src
    assert "__syncthreads_or(flagged)" in src and "km_t guard" in src
    src = _source(CASES["tc-laplace_l2-tensor-bandwidth"])
    assert "hp_bandwidth[off_h_bandwidth]" in src and "diag_shift == (long long)(n)" in src


def _tc_cases() -> list[str]:
    return sorted(
        c for c, pr in CASES.items() if not c.startswith(("grad", "tc-grad")) and _tensor_cores(_plan_pairwise(pr)[0])
    )


@pytest.mark.parametrize("case", _tc_cases())
def test_wgmma_variant_compiles_to_cubin(case: str) -> None:
    """Planned for sm_90, every tensor-core pairwise case takes the wgmma kernel, built for sm_90a."""
    variant = _plan_pairwise(CASES[case], 90)[0]
    assert _wgmma(variant) and variant.target(90) == "sm_90a"
    built = compiler.compile_cubin(kernel_source(variant)[0], "sm_90a", name="kermac_pairwise")
    assert built.cubin[:4] == b"\x7fELF" and "registers" in built.ptxas


def test_plan_selects_wgmma_on_sm90_only() -> None:
    l2 = CASES["preset-l2_distance"]
    for capability, wgmma in ((90, True), (80, False), (89, False), (100, False), (None, False)):
        variant = _plan_pairwise(l2, capability)[0]
        assert _tensor_cores(variant) and _wgmma(variant) is wgmma, capability
        assert variant.dynamic_smem == (tiles.WGMMA_DYNAMIC_SMEM if wgmma else 0)
        assert variant.target(capability or 80) == ("sm_90a" if wgmma else f"sm_{capability or 80}")
    assert not _wgmma(_plan_pairwise(CASES["preset-l1_distance"], 90)[0])  # SIMT programs
    assert 48 * 1024 < tiles.WGMMA_DYNAMIC_SMEM <= 227 * 1024 // 2  # two blocks per SM
    x, z = _t(M, 64), _t(64, 64)  # rows of 64 floats: 16-byte stores on the wgmma path, pairs on mma.sync
    problem = _pw(presets.l2_distance.lower(), x, z)
    assert _plan_pairwise(problem, 90)[1].args["ovec"] == 1
    assert _plan_pairwise(_pw(presets.l2_distance.lower(), x, _t(66, 64)), 90)[1].args["ovec"] == 0
    assert _plan_pairwise(_pw(presets.l2_distance.lower(), x, _t(66, 64)), 80)[1].args["ovec"] == 1
    assert not _wgmma(_plan_pairwise(l2, 90, wgmma=False)[0])


def test_auto_prefers_nvrtc_where_its_wgmma_kernel_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVRTC's preference rises above Triton's tensor-core preference (25) exactly for the pairwise
    problems that run the wgmma kernel: float32 (x − z)² sums on sm_90."""
    import types

    from kermac_backend_nvrtc.backend import WGMMA_PREFERENCE, NvrtcBackend

    backend = NvrtcBackend()

    def on_cuda(problem):  # the same problem as if its tensors sat on cuda:0 (planning reads no data)
        x = problem.x
        cuda = types.SimpleNamespace(
            device=torch.device("cuda", 0), is_cuda=True, get_device=lambda: 0, dtype=x.dtype, shape=x.shape
        )
        return dataclasses.replace(problem, x=cuda)

    assert WGMMA_PREFERENCE > 25 > backend.priority
    for capability, preferred in ((90, WGMMA_PREFERENCE), (80, backend.priority), (100, backend.priority)):
        monkeypatch.setattr(plan, "cuda_capability", lambda index, c=capability: c)
        assert backend.preference(on_cuda(CASES["preset-l2_distance"])) == preferred
        assert backend.preference(on_cuda(CASES["tc-laplace_l2-tensor-bandwidth"])) == preferred
        assert backend.preference(on_cuda(CASES["preset-l1_distance"])) == backend.priority
        assert backend.preference(on_cuda(CASES["gaussian-regularized-float64"])) == backend.priority
    assert backend.preference(CASES["grad-p2"]) == backend.priority
    assert backend.preference(CASES["preset-l2_distance"]) == backend.priority  # CPU tensors
    monkeypatch.setattr(plan, "cuda_capability", lambda index: 90)
    assert NvrtcBackend(NvrtcTuning(wgmma=False)).preference(on_cuda(CASES["preset-l2_distance"])) == backend.priority
    simt = NvrtcBackend(NvrtcTuning(tensor_cores=False))
    assert simt.preference(on_cuda(CASES["preset-l2_distance"])) == backend.priority


def test_source_wgmma() -> None:
    src = kernel_source(_plan_pairwise(CASES["tc-laplace_l2-tensor-bandwidth"], 90)[0])[0]
    assert src.count("wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32") == 1  # one helper
    assert "fence.proxy.async.shared::cta" in src and "km_wg_wait<0>();" in src and kernel_file("wgmma_sync.cuh") in src
    assert "__syncthreads_or(flagged)" in src and "hp_bandwidth[off_h_bandwidth]" in src
    assert "mma.sync" not in src.split("kermac_pairwise(")[1]  # the kernel body uses wgmma only


@pytest.mark.parametrize("case", sorted(CASES))
def test_source_is_one_self_contained_text(case: str) -> None:
    """Every package file a kernel includes is expanded into its text (what NVRTC compiles and the JIT
    cache key hashes): no include remains, and the kernel file and the shared epilogue are there."""
    problem = CASES[case]
    grad = isinstance(problem, kermac.problem.GradProblem)
    variant = (_plan_grad if grad else _plan_pairwise)(problem, 90)[0]
    src = kernel_source(variant)[0]
    assert "#include" not in src
    assert kernel_file("prelude.cuh") in src and kernel_file("loader.cuh") in src
    assert (kernel_file("pairwise_epilogue.cuh") in src) is not grad


def test_wgmma_swizzle_is_a_conflict_free_bijection() -> None:
    """km_sw64 (mirrored here) maps the 128 × 16 tile onto 8 KB one to one, and the 16-byte stores of
    a staging phase (8 threads: MODE 2, 8 values of one row per thread, two stores) hit 8 distinct
    16-byte bank groups."""

    def sw64(p: int, k: int) -> int:
        return p * 64 + ((((k >> 2) ^ (p >> 1)) & 3) << 4) + ((k & 3) << 2)

    src = kernel_file("wgmma_tf32.cuh")
    assert "p * KM_ROW + ((((k >> 2) ^ (p >> 1)) & 3) << 4) + ((k & 3) << 2)" in src
    offsets = {sw64(p, k) for p in range(128) for k in range(16)}
    assert offsets == set(range(0, 128 * 64, 4))
    for phase in range(0, 256, 8):
        for c in (0, 4):
            groups = {(sw64(t // 2, (t % 2) * 8 + c) % 128) // 16 for t in range(phase, phase + 8)}
            assert len(groups) == 8, (phase, c)


def _tf32(a: np.ndarray) -> np.ndarray:
    """cuda/mma_tf32.cuh's km_tf32: round to nearest (ties away) to 10 mantissa bits."""
    return ((a.astype(np.float32).view(np.uint32) + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def _tc_emulated(x: np.ndarray, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 emulation of the tensor-core kernel: (d² from the 3×TF32 expansion, guard flags).

    Products of TF32 parts are exact; each m16n8k8 step's 8-term sum is added to the fp32
    accumulator in the order xl·zh, xh·zl, xh·zh; the norms are fp32 sums.
    """
    f32 = np.float32
    xh, zh = _tf32(x), _tf32(z)
    xl, zl = _tf32(x - xh), _tf32(z - zh)
    acc = np.zeros((x.shape[0], z.shape[0]), f32)
    for k0 in range(0, x.shape[1], 8):
        for a, b in ((xl, zh), (xh, zl), (xh, zh)):
            acc = (acc + a[:, k0 : k0 + 8].astype(np.float64) @ b[:, k0 : k0 + 8].T.astype(np.float64)).astype(f32)
    xn, zn = (np.square(v).sum(1, dtype=f32) for v in (x, z))
    s = (xn[:, None] + zn[None, :]).astype(f32)
    d2 = (s - f32(2) * acc).astype(f32)
    return d2, ~(d2 > f32(kernel_facts.cancellation_guard(x.shape[1])) * s)


@pytest.mark.parametrize("d", [8, 32, 256, 1024])
@pytest.mark.parametrize("data", ["randn", "offset", "clustered", "near-duplicates"])
def test_tensor_core_split_and_guard_accuracy(d: int, data: str) -> None:
    """Every entry the guard lets through is within 1.5e-5 relative of float64 (7.6e-6 on d)."""
    rng = np.random.default_rng(d)
    x = rng.standard_normal((40, d))
    z = rng.standard_normal((40, d))
    if data == "offset":
        x, z = x + 5.0, z + 5.0
    elif data == "clustered":
        c = rng.standard_normal(d)
        x, z = c + 0.3 * x, c + 0.3 * z
    elif data == "near-duplicates":
        x = 10 * x
        z = x + 1e-4 * z
    x, z = x.astype(np.float32), z.astype(np.float32)
    ref = np.square(x.astype(np.float64)[:, None, :] - z.astype(np.float64)[None]).sum(-1)
    d2, flagged = _tc_emulated(x, z)
    rel = np.abs(d2 - ref) / ref
    assert rel[~flagged].max(initial=0.0) < 2.0**-16
    if data == "near-duplicates":
        assert flagged.diagonal().all()  # what the expansion cannot resolve is recomputed
    if data == "randn":
        assert not flagged.any()  # random data never pays for the exact recomputation


def test_cache_hit_is_fast_and_identical() -> None:
    source = _source(CASES["preset-l1_distance"])
    first = compiler.compile_cubin(source, "sm_90", name="kermac_pairwise")
    compiler._memo.clear()
    second = compiler.compile_cubin(source, "sm_90", name="kermac_pairwise")
    assert second.hit and second.cubin == first.cubin
    assert second.seconds < 0.05


def test_long_k_tiles_for_cheap_programs() -> None:
    """BK = 16 exactly for float SIMT programs whose inner term and epilogue are both cheap."""
    pairwise_cases = {name: case for name, case in CASES.items() if isinstance(case.program, kermac.PairwiseProgram)}
    long_k = {name: _deep_k(_plan_pairwise(case)[0]) for name, case in pairwise_cases.items()}
    assert long_k["preset-l1_distance"] and long_k["l1-float16"] and long_k["l1-bfloat16"]
    assert not long_k["preset-laplace_l1"]  # exp epilogue
    assert not long_k["preset-lp_distance"]  # pow inner term
    assert not long_k["l1-float64"]  # double keeps its own tile
    assert not long_k["preset-l2_distance"]  # tensor cores
    assert "#define BK 16" in _source(CASES["preset-l1_distance"])
    assert "#define BK 8" in _source(CASES["preset-laplace_l1"])
    # The others give each thread 4 × 16 outputs (one group of rows, four of columns), long_k 8 × 8.
    assert "#define TN 8\n#define GM 1\n#define GN 4" in _source(CASES["preset-laplace_l1"])
    assert "#define TN 16\n#define GM 2\n#define GN 2" in _source(CASES["preset-l1_distance"])


def test_one_path_for_float32_l1_sums_with_vector_loads() -> None:
    """Every k tile on the unrolled path exactly for float32 sums of |x − z| whose operands load as
    16-byte vectors (measured faster); the others keep the branch between the unrolled tile and the
    tail loop.  The next tile's loads sit at the top of 8-deep tiles and after 4 of 16 steps.  (With
    k-contiguous tiles off: where they apply they take the place of the one-path loop.)"""
    t = ir.Var("x") - ir.Var("z")

    def planned(program, d=16, dtype=torch.float32, transposed=False, zero_padded_k_tail=True):
        if transposed:
            x, z = _t(d, 40, dtype=dtype).T, _t(d, 48, dtype=dtype).T
        else:
            x, z = _t(40, d, dtype=dtype), _t(48, d, dtype=dtype)
        values = {"bandwidth": 2.0, "p": 1.5}
        hypers = {name: HyperValue(name, values[name]) for name in program.hypers}
        problem = pairwise_problem(program, x, z, out=None, hypers=hypers)
        return _plan_pairwise(problem, k_contiguous_tiles=False, zero_padded_k_tail=zero_padded_k_tail)[0]

    laplace, l1 = presets.laplace_l1.lower(), presets.l1_distance.lower()
    assert _padded_tail(planned(laplace)) and _padded_tail(planned(l1))
    assert _padded_tail(planned(laplace, transposed=True)) and _padded_tail(planned(l1, transposed=True))
    assert "#define KM_PADDED_TAIL 1\n#define KM_LOADS_AFTER 0" in kernel_source(planned(laplace))[0]
    assert "#define KM_PADDED_TAIL 1\n#define KM_LOADS_AFTER 4" in kernel_source(planned(l1))[0]
    assert not _padded_tail(planned(laplace, d=13))  # scalar loads: measured slower with it
    assert not _padded_tail(planned(l1, d=12))  # 8-element vectors in 16-deep tiles: 12 is no multiple of 8
    assert not _padded_tail(planned(laplace, dtype=torch.float16))  # half inputs measured level or slower
    assert not _padded_tail(planned(l1, dtype=torch.float64))
    sqrt = ir.sqrt(ir.Var("acc"))
    assert _padded_tail(planned(kermac.PairwiseProgram(ir.abs_(t), "sum", sqrt)))
    assert not _padded_tail(planned(kermac.PairwiseProgram(ir.abs_(t), "max", sqrt)))  # 0 is not max's identity
    assert not _padded_tail(planned(kermac.PairwiseProgram(t * t, "sum", sqrt)))  # SIMT p = 2: slower with it
    assert not _padded_tail(planned(presets.lp_distance.lower()))  # split (power table)
    assert not _padded_tail(planned(laplace, zero_padded_k_tail=False))
    assert "#define KM_PADDED_TAIL 0" in kernel_source(planned(laplace, zero_padded_k_tail=False))[0]


def test_k_contiguous_for_float32_l1_sums_with_row_major_aligned_x() -> None:
    """k-contiguous tiles exactly for float32 sums of |x − z| whose x rows are 16-byte aligned with
    unit k-stride (D a multiple of 4) and whose z rows have unit k-stride (any alignment: 4-byte
    copies); the one-path loop (or the branch) takes the other layouts.  The variant's source, for
    both architectures, has the k-contiguous loop with z's pairs landing swapped."""
    t = ir.Var("x") - ir.Var("z")

    def planned(
        program,
        d: int = 16,
        dtype: torch.dtype = torch.float32,
        xt: bool = False,
        zt: bool = False,
        x_shift: int = 0,
        z_shift: int = 0,
        batch: tuple[int, ...] = (),
    ):
        x = _t(*batch, 40 * d + x_shift, dtype=dtype)[..., x_shift:].unflatten(-1, (40, d))
        x = _t(d, 40, dtype=dtype).T if xt else x
        z = _t(d, 48, dtype=dtype).T if zt else _t(48 * d + z_shift, dtype=dtype)[z_shift:].view(48, d)
        values = {"bandwidth": 2.0, "p": 1.5}
        hypers = {name: HyperValue(name, values[name]) for name in program.hypers}
        return _plan_pairwise(pairwise_problem(program, x, z, out=None, hypers=hypers))[0]

    laplace, l1 = presets.laplace_l1.lower(), presets.l1_distance.lower()
    for program in (laplace, l1, kermac.PairwiseProgram(ir.abs_(t), "sum", ir.sqrt(ir.Var("acc")))):
        v = planned(program)
        assert _k_contiguous(v) and not _padded_tail(v)
    assert (
        _k_contiguous(planned(l1, d=4))
        and _k_contiguous(planned(l1, d=1028))
        and _k_contiguous(planned(l1, batch=(3,)))
    )
    assert _k_contiguous(planned(l1, z_shift=1))  # z is copied 4 bytes at a time
    assert not _k_contiguous(planned(l1, x_shift=1)) and not _k_contiguous(planned(l1, d=13))  # 16-byte x copies
    assert not _k_contiguous(planned(l1, xt=True)) and not _k_contiguous(planned(l1, zt=True))
    assert not _k_contiguous(planned(l1, dtype=torch.float16)) and not _k_contiguous(planned(l1, dtype=torch.float64))
    assert not _k_contiguous(planned(kermac.PairwiseProgram(t * t, "sum", ir.sqrt(ir.Var("acc")))))
    assert not _k_contiguous(planned(presets.lp_distance.lower()))
    far = torch.empty_strided((48, 16), (2**24, 1), device="meta")  # 128 rows span 2^31 elements
    near = torch.empty_strided((48, 16), (2**24 - 4, 1), device="meta")
    x = torch.empty(40, 16, device="meta")
    assert not _k_contiguous(_plan_pairwise(pairwise_problem(l1, x, far, out=None, hypers={}))[0])
    assert _k_contiguous(_plan_pairwise(pairwise_problem(l1, x, near, out=None, hypers={}))[0])
    source = kernel_source(planned(l1))[0]
    assert (
        "#define KM_K_CONTIGUOUS 1" in source
        and "(zk ^ 1)" in source
        and "#define TN 8\n#define GM 4\n#define GN 16" in source
    )
    for arch in ARCHS:
        assert compiler.compile_cubin(source, arch, name="kermac_pairwise").cubin[:4] == b"\x7fELF"


def test_k_contiguous_setting_off_plans_the_padded_tail() -> None:
    """With the k-contiguous loop off, a float32 Σ|x − z| with vector loads runs the padded-tail loop."""
    l1 = _plan_pairwise(pairwise_problem(presets.l1_distance.lower(), _t(40, 16), _t(48, 16), out=None, hypers={}))
    assert _k_contiguous(l1[0])
    off_problem = pairwise_problem(presets.l1_distance.lower(), _t(40, 16), _t(48, 16), out=None, hypers={})
    off = _plan_pairwise(off_problem, k_contiguous_tiles=False)
    assert not _k_contiguous(off[0]) and _padded_tail(off[0])


@pytest.mark.parametrize("steps", [0, 2, 15])
def test_one_path_long_k_loads_anywhere_in_the_tile(monkeypatch: pytest.MonkeyPatch, steps: int) -> None:
    """``tiles.DEEP_K_LOADS_AT`` (a tuning setting) moves the 16-deep loop's loads; every position
    compiles, one past the tile is refused."""
    problem = pairwise_problem(presets.l1_distance.lower(), _t(40, 16), _t(48, 16), out=None, hypers={})
    variant = _plan_pairwise(problem, k_contiguous_tiles=False)[0]
    assert _padded_tail(variant) and _deep_k(variant)
    monkeypatch.setattr(tiles, "DEEP_K_LOADS_AT", steps)
    source = kernel_source(variant)[0]
    assert f"#define KM_LOADS_AFTER {steps}" in source
    compiler.compile_cubin(source, "sm_90", name="kermac_pairwise")
    monkeypatch.setattr(tiles, "DEEP_K_LOADS_AT", 16)
    with pytest.raises(ValueError, match=r"DEEP_K_LOADS_AT: expected 0 <= steps < 16 \(the k tile's depth\), got 16"):
        kernel_source(variant)


def test_padded_tail_refuses_non_neutral_padding() -> None:
    linf = _plan_pairwise(pairwise_problem(presets.linf_distance.lower(), _t(M, D), _t(40, D), out=None, hypers={}))
    with pytest.raises(ValueError, match="padded tail: needs an inner term whose value at x = z = 0 is the reduction"):
        kernel_source(dataclasses.replace(linf[0], padded_tail=True))  # max of |x − z|: 0 is not −inf


@pytest.mark.parametrize("compute", ["float", "double"])
@pytest.mark.parametrize("long_k", [False, True])
def test_simt_thread_layout_covers_the_tile(compute: str, long_k: bool) -> None:
    """256 threads: TN along n, 256 / TN along m; GM·VM rows and GN·VN columns each cover the tile."""
    cfg = tiles.pairwise_config(compute, long_k)
    assert 256 % cfg.tn == 0
    assert cfg.gm * cfg.vm * (256 // cfg.tn) == cfg.bm
    assert cfg.gn * cfg.vn * cfg.tn == cfg.bn


def test_plan_vector_stores_need_aligned_unit_stride_rows() -> None:
    """``ovec``: 16-byte stores only where every output row starts 16-byte aligned with unit column stride."""
    x, z = _t(M, D), _t(40, D)

    def ovec(out: torch.Tensor, dtype: torch.dtype = torch.float32) -> int:
        problem = pairwise_problem(presets.l1_distance.lower(), x.to(dtype), z.to(dtype), out=out, hypers={})
        return _plan_pairwise(problem)[1].args["ovec"]

    assert ovec(torch.empty(M, 40)) == 1
    assert ovec(torch.empty(M, 48)[:, :40]) == 1  # padded rows: the kernel handles the ragged end
    assert ovec(torch.empty(M, 48)[:, 1:41]) == 0  # one element off alignment
    assert ovec(torch.empty(M, 42)[:, :40]) == 0  # row stride not a multiple of 4
    assert ovec(torch.empty(40, M).T) == 0  # column stride ≠ 1
    assert ovec(torch.empty(M, 40, dtype=torch.float64), torch.float64) == 1  # pairs of doubles
    assert ovec(torch.empty(M, 42, dtype=torch.float64)[:, :40], torch.float64) == 1
    assert ovec(torch.empty(M, 41, dtype=torch.float64)[:, :40], torch.float64) == 0


def test_plan_picks_load_modes() -> None:
    def x_load(case: str) -> variants.TileLoad:  # k-contiguous tiles off: that kernel copies its tiles itself
        return _plan_pairwise(CASES[case], k_contiguous_tiles=False)[0].x

    assert x_load("l1-vec-k") == variants.TileLoad(variants.LoadMode.VECTOR_ALONG_K, 8)  # BK = 16: 8 per thread
    assert x_load("l1-vec-p") == variants.TileLoad(variants.LoadMode.VECTOR_ALONG_P, 8)
    assert x_load("preset-laplace_l1") == variants.TileLoad(variants.LoadMode.SCALAR_K_FASTEST, 4)  # BK = 8
    assert x_load("l1-scalar-p-fast").mode == 1  # 29 rows: no aligned vectors
    assert x_load("l1-sliced").mode == 0
    assert x_load("l1-float64").count == 2


def test_source_l1_is_a_plain_abs_difference() -> None:
    src = _source(CASES["preset-l1_distance"])
    assert "return km_abs((x - z));" in src
    assert "km_pow" not in src.split("kermac_pairwise(")[1]
    assert "#define KM_SPLIT_PAIRS 0" in src


def test_source_fractional_p_uses_fast_pow() -> None:
    lp = CASES["preset-lp_distance"]
    src = _source(lp, ex2_polynomial_pairs=44)  # p = 1.5 in [1, 5]: split pairs from the power table
    assert f"#define KM_SPLIT_PAIRS {TUNING.power_table_pairs}" in src and "#define KM_POW_TABLE 1" in src
    assert "#define KM_POW_DEGREE 5" in src and "km_t pc5" in src and "pc6" not in src
    src = _source(lp, ex2_polynomial_pairs=44, power_table=False)  # p = 1.5: ex2(p·lg2|t|) without the p = 0 case
    assert "km_powabs_ftz(km_abs((x - z)), h_p)" in src and "lg2.approx.ftz.f32" in src
    assert "#define KM_SPLIT_PAIRS 44" in src and "#define KM_SPLIT_EXPONENT h_p" in src
    assert "#define KM_SPLIT_LG2 km_lg2_ftz" in src and "float km_powabs_split(" in src
    assert "km_pow_nonneg(acc, km_div_inv(km_t(1.0), h_p))" in src  # the root of a non-negative sum
    src = _source(lp, ex2_polynomial_pairs=0, flush_subnormals=False, power_table=False)
    assert "km_powabs_nz(km_abs((x - z)), h_p)" in src and "#define KM_SPLIT_PAIRS 0" in src
    assert "float km_powabs_split(" not in src  # pow_split.cuh only in split kernels
    src = _source(CASES["lp-p<1"], ex2_polynomial_pairs=0, flush_subnormals=False, power_table=False)
    assert "km_powabs(km_abs((x - z)), h_p)" in src and "#define KM_SPLIT_PAIRS 0" in src


def test_source_hyper_kinds() -> None:
    src = _source(CASES["lp-tensor-p-f32"])
    assert "const float* __restrict__ hp_p" in src and "hp_p[off_h_p]" in src
    src = _source(CASES["laplace_lp-tensor-hypers-f64"])
    assert "const double* __restrict__ hp_p" in src and "const km_f16* __restrict__ hp_bandwidth" in src
    src = _source(CASES["preset-laplace_l1"])
    assert "km_t hv_bandwidth" in src and "km_exp" in src


def test_source_diag_and_batch() -> None:
    src = _source(CASES["laplace_l2-regularized"])
    assert "long long diag_shift" in src and "diag_shift == (long long)(n)" in src
    src = _source(CASES["l1-batch2-broadcast"])
    assert "long long bs1" in src and "off_x += q * bx1" in src


def test_source_grad() -> None:
    src = _source(CASES["grad-p1"])
    assert "return km_sign((d - b));" in src and "#define OT8 2" in src
    assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in src
    assert "return km_signpow_pos((d - b), (h_p - km_t(1.0)));" in _source(CASES["grad-p1.5"])  # p > 1 known
    problem = _gr(None, p=1.0)  # the general program with p = 1: p − 1 known >= 0, not > 0
    assert "return km_signpow_ftz((d - b), (h_p - km_t(1.0)));" in _source(problem)
    assert "return km_signpow_ftz((d - b), (h_p - km_t(1.0)));" in _source(_gr(None, o=3, p=1.5))  # SIMT (O < 5)
    src = _source(CASES["tc-grad-batch-broadcast-tensor-p"])
    assert "hp_p[off_h_p]" in src and "off_a += q * ba0" in src and "#define OT8 1" in src
    assert "return km_signpow((d - b), (h_p - km_t(1.0)));" in src  # a tensor p: not known >= 1
    assert "km_signpow((d - b)" in _source(CASES["grad-p1.5-float64"])  # double: no flushing form
    assert "return km_signpow((d - b), (h_p - km_t(1.0)));" in _source(CASES["grad-p1.5"], flush_subnormals=False)
    simt = {"flush_subnormals": False, "tensor_cores": False}
    assert "return km_sign((d - b));" in _source(CASES["grad-p1"], **simt)
    assert "#define OT 1" in _source(CASES["grad-p1-o1"], **simt)
    assert "#define OT 4" in _source(CASES["grad-p1-o3"], **simt)
    assert "#define OT 16" in _source(CASES["grad-p1-o33"], **simt)


def test_smem_stride_is_conflict_free() -> None:
    """Fragment loads (8 consecutive p × 4 consecutive k rows) of every tile width hit 32 banks."""
    for p in (8, 16, 24, 32, 64, 128):
        s = tiles.smem_stride(p)
        assert s >= p and s % 4 == 0
        assert len({(k * s + g) % 32 for k in range(4) for g in range(8)}) == 32


def _tc_grad_emulated(a, b, c, d, p: float) -> np.ndarray:
    """float32 emulation of cuda/mma_grad.cuh: B' = a·φ in fp32, c split by rounding, B' into its
    truncation to TF32 + the exact fp32 residual, which the tensor core reads as TF32 (truncated
    here; rounding it gives the same errors to 1 %), the three products of each group of
    ``k_group`` 8-wide k steps summed (in float64 here; the tensor cores truncate) and added to fp32
    accumulators."""
    f32 = np.float32
    t = (d[:, :, None] - b[:, None, :]).astype(f32)  # [N, M, K]
    phi = np.sign(t) if p == 1.0 else (np.sign(t) * np.abs(t) ** f32(p - 1)).astype(f32)
    v = (a.T[None] * phi).astype(f32)
    vh = (v.view(np.uint32) & np.uint32(0xFFFFE000)).view(f32)
    vl = (((v - vh).astype(f32)).view(np.uint32) & np.uint32(0xFFFFE000)).view(f32)
    ch = _tf32(c)
    cl = _tf32((c - ch).astype(f32))
    acc = np.zeros((c.shape[0],) + v.shape[:2], f32)
    group = 8 * tiles.TC_GRAD_CONFIG.k_group
    for k0 in range(0, c.shape[1], group):
        s = slice(k0, k0 + group)
        part = sum(
            np.einsum("nmk,ok->onm", x[..., s].astype(np.float64), y[:, s].astype(np.float64))
            for x, y in ((vl, ch), (vh, cl), (vh, ch))
        )
        acc = (acc + part).astype(f32)
    return acc


@pytest.mark.parametrize("p", [1.0, 2.0, 1.5])
@pytest.mark.parametrize("data", ["randn", "offset", "cancelling"])
def test_tc_grad_split_accuracy(p: float, data: str) -> None:
    """3×TF32 is as accurate as fp32 FMAs on random data (2e-7 relative Frobenius vs float64 here; the
    SIMT kernel's fp32 sums give 4e-7) and about 1e-5 (1.06e-5 with B' truncated to TF32, 9e-6
    rounded; SIMT: 2.7e-6; the tolerance is 1e-4) for mixed-sign c whose terms cancel to 1 % of their
    magnitude, where the TF32 reading of B's residual and the dropped lo·lo products (≤ 2⁻²⁰ and
    2⁻²¹ of each term) show."""
    rng = np.random.default_rng(7)
    k, m, n, o = 512, 24, 6, 5
    a, b, c, d = (rng.standard_normal(s) for s in ((k, m), (n, k), (o, k), (n, m)))
    if data == "offset":
        a, b, d = a + 4.0, b + 3.0, d - 3.0
    elif data == "cancelling":  # k pairs with equal a, b and c of opposite sign up to 1 %
        a[1::2], b[:, 1::2] = a[::2], b[:, ::2]
        c[:, 1::2] = -c[:, ::2] * (1 + 0.01 * rng.standard_normal((o, k // 2)))
    a, b, c, d = (x.astype(np.float32) for x in (a, b, c, d))
    t = d.astype(np.float64)[:, :, None] - b.astype(np.float64)[:, None, :]
    ref = np.einsum("ok,km,nmk->onm", c.astype(np.float64), a.astype(np.float64), np.sign(t) * np.abs(t) ** (p - 1))
    got = _tc_grad_emulated(a, b, c, d, p)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < (1.5e-5 if data == "cancelling" else 1e-6)


def test_constants_are_rounded_to_the_compute_type() -> None:
    """Every constant is rounded to the compute type in Python: the literal is then exactly
    representable (a double literal past float's range is undefined behaviour when converted), and
    equal to what the reference backend computes with (float32 subnormals kept)."""

    def r(v: float, compute: str) -> str:
        return render.render_expr(ir.Const(v), {}, compute=compute)

    assert r(1e39, "float") == "km_inf(km_t(0))" and r(-1e39, "float") == "(-km_inf(km_t(0)))"
    assert r(1e39, "double") == "km_t(1e+39)"
    assert r(1e-40, "float") == f"km_t({torch.tensor(1e-40, dtype=torch.float32).item()!r})" != "km_t(1e-40)"
    assert r(1e-50, "float") == "km_t(0.0)" and r(-1e-50, "float") == "km_t(-0.0)"
    assert r(1e-310, "double") == "km_t(1e-310)" and r(0.1, "double") == "km_t(0.1)"
    assert r(0.1, "float") == "km_t(0.10000000149011612)" and r(math.nan, "double") == "km_nan(km_t(0))"
    program = kermac.PairwiseProgram(ir.Var("x") * 1e39, "sum", ir.Var("acc") + 0.1)
    f32 = kernel_source(_plan_pairwise(_pw(program))[0])[0]
    f64 = kernel_source(_plan_pairwise(_pw(program, _t(M, D, dtype=torch.float64), _t(N, D, dtype=torch.float64)))[0])[
        0
    ]
    assert "(x * km_inf(km_t(0)))" in f32 and "(acc + km_t(0.10000000149011612))" in f32
    assert "(x * km_t(1e+39))" in f64 and "(acc + km_t(0.1))" in f64


def test_render_semantics_table() -> None:
    names = {"x": "x", "z": "z"}
    assert render.render_expr(ir.Const(math.inf) - ir.Var("x"), names) == "(km_inf(km_t(0)) - x)"
    assert (
        render.render_expr(ir.select(ir.Var("x"), 1.0, ir.Const(math.nan)), names)
        == "((x) != km_t(0) ? (km_t(1.0)) : (km_nan(km_t(0))))"
    )
    assert set(render.CUDA_OPS) == set(ir.OPS)


def _fma32(a: np.ndarray, b: np.ndarray | float, c: np.ndarray | float) -> np.ndarray:
    """fmaf in float32: the float32 product is exact in float64, so one float64 add then rounding."""
    return (a.astype(np.float64) * np.float64(b) + np.asarray(c, np.float64)).astype(np.float32)


def _recip(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float32 emulation of cuda/prelude.cuh's km_recip: (b·s, 1/(b·s), s) with s a power of two
    that scales b into [2^-126, 2^126]."""
    f32 = np.float32
    m = np.abs(b)
    s = np.where(m < f32(2.0**-126), f32(2.0**64), np.where(m > f32(2.0**126), f32(2.0**-64), f32(1.0)))
    bs = b * s
    with np.errstate(all="ignore"):
        return bs, f32(1.0) / bs, s


def _div_inv(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """float32 emulation of cuda/prelude.cuh's km_div_inv: b scaled into [2^-126, 2^126], its
    reciprocal, q = a·r, one Markstein step with exact remainders (both fma emulated exactly)."""
    bs, r, s = _recip(b)
    with np.errstate(all="ignore"):
        q = a * r
        e = _fma32(-q, bs, a)
        q2 = _fma32(e, r, q)
        return np.where(q2 == q2, q2, q) * s


def test_division_by_an_invariant_is_correctly_rounded() -> None:
    """km_div_inv (a divisor of hyperparameters and constants: reciprocal once per thread, then a
    product and a correction step per value) equals IEEE a / b bit for bit, special values and
    subnormal or huge divisors included, except for |a| < 2^-102 or a subnormal quotient (within
    one ulp there)."""
    rng = np.random.default_rng(7)
    n = 400_000

    def wide() -> np.ndarray:  # values across the whole float32 exponent range, both signs
        return rng.uniform(1, 2, n) * np.exp2(rng.integers(-149, 128, n)) * rng.choice([-1, 1], n)

    special = np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-40, 1.1754942e-38, 3.4028235e38, 1.0])
    a = np.concatenate([wide(), rng.standard_normal(n), np.repeat(special, len(special))]).astype(np.float32)
    b = np.concatenate([wide(), rng.uniform(0.1, 10, n), np.tile(special, len(special))]).astype(np.float32)
    with np.errstate(all="ignore"):
        want = a / b
    got = _div_inv(a, b)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    # Below |a| = 2^-102 the remainder a − q·b (about 2^-24·|a|) underflows, and a subnormal
    # quotient is rounded twice: within one ulp there.
    edge = (np.abs(want) < np.float32(2.0**-126)) | (np.abs(a) < np.float32(2.0**-102))
    assert same[~edge].all(), (a[~same & ~edge][:5], b[~same & ~edge][:5])
    off = ~same
    assert (np.abs(got[off].astype(np.float64) - want[off]) <= np.spacing(np.abs(want[off]))).all()
    assert "km_div_inv(acc, (h_bandwidth * h_bandwidth))" in _source(CASES["preset-cauchy"])
    varying = ir.Var("acc") / (1.0 + ir.Var("acc"))  # a divisor that varies per output stays IEEE
    assert render.render_expr(varying, {"acc": "acc"}) == "(acc / (km_t(1.0) + acc))"


def _exp_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """float32 emulation of cuda/prelude.cuh's km_exp_div up to its ex2: the exponent a·f·s with
    f = log2(e)/b (b scaled by s as in km_div_inv) from a Markstein step on log2(e) in two floats,
    then ex2 exactly (float64 exp2, rounded)."""
    f32 = np.float32
    hi, lo = f32(1.44269502), f32(1.92596303e-08)
    bs, r, s = _recip(b)
    with np.errstate(all="ignore"):
        q = hi * r
        f = _fma32((_fma32(-q, bs, hi) + lo).astype(f32), r, q)
        t = a * np.where(f == f, f, q) * s
        return np.exp2(t.astype(np.float64)).astype(f32)


def test_exp_of_an_invariant_quotient() -> None:
    """exp(±a / b) with b free of variables renders as km_exp_div (ex2 of a·(log2(e)/b), the factor
    once per thread): within 1 + 2·|a/b| ulp of exp(a/b) before ex2's own error (measured on the GPU
    by test_exp_of_a_hyperparameter_quotient), and the IEEE result for zero, infinite, subnormal and
    huge divisors."""
    rng = np.random.default_rng(11)
    n = 400_000
    b = (np.exp2(rng.uniform(-149, 127, n)) * rng.choice([-1, 1], n)).astype(np.float32)
    q = rng.uniform(-100, 88, n) * rng.choice([1, 1e-3, 1e-9], n)  # the intended quotient a/b
    with np.errstate(over="ignore"):  # a beyond float32 is ±inf: covered like the special values
        a = (q * b.astype(np.float64)).astype(np.float32)
    special = np.float32([0.0, -0.0, np.inf, -np.inf, 1e-45, -1e-40, 3.4028235e38, 1.0, -2.5])
    a = np.concatenate([a, np.repeat(special, len(special))])
    b = np.concatenate([b, np.tile(special, len(special))])
    with np.errstate(all="ignore"):
        quotient = a.astype(np.float64) / b.astype(np.float64)
        want = np.exp(quotient).astype(np.float32)
    got = _exp_div(a, b)
    ulp = np.spacing(np.abs(want)).astype(np.float64)
    finite = np.isfinite(want) & np.isfinite(quotient)
    with np.errstate(all="ignore"):
        err = np.abs(got.astype(np.float64) - np.exp(quotient)) / ulp
    assert (err[finite] <= 1 + 2 * np.abs(quotient[finite])).all(), err[finite].max()
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    assert same[~finite].all(), (a[~finite & ~same][:5], b[~finite & ~same][:5])
    src = _source(CASES["preset-laplace_l1"])
    assert "km_exp_div(acc, (-h_bandwidth))" in src and "km_div_inv" not in src.split("km_epilogue")[-1]
    sqrt3 = torch.tensor(math.sqrt(3.0), dtype=torch.float32).item()  # √3 rounded to the compute type
    assert f"km_exp_div((km_t({sqrt3!r}) * km_sqrt(acc)), (-h_bandwidth))" in _source(CASES["preset-matern32"])
    varying = ir.exp(ir.Var("acc") / (1.0 + ir.Var("acc")))  # a divisor that varies stays exp of a quotient
    assert render.render_expr(varying, {"acc": "acc"}) == "km_exp((acc / (km_t(1.0) + acc)))"


def _split_powabs(a: np.ndarray, b: float) -> np.ndarray:
    """float32 emulation of cuda/pow_split.cuh's km_powabs_split (lg2.approx.ftz as a rounded log2)."""
    f32 = np.float32
    a = a.astype(f32)
    with np.errstate(divide="ignore"):
        lg2 = np.where(a >= f32(2.0**-126), np.log2(a.astype(np.float64)), -np.inf).astype(f32)
    lc = np.maximum(lg2, f32(-126.0) / f32(b))
    t = _fma32(lc, b, f32(12582912.0))
    r = _fma32(lc, b, f32(12582912.0) - t)
    q = np.full_like(r, EXP2_COEFFS[-1])
    for c in reversed(EXP2_COEFFS[:-1]):
        q = _fma32(q, r, f32(c))
    return ((t.view(np.int32) << 23) + q.view(np.int32)).view(f32)


@pytest.mark.parametrize("b", [1.0, 1.3, 2.5, 7.0])
def test_split_pow_accuracy(b: float) -> None:
    lim = 2.0 ** (125 / b)  # the kernel's guard keeps |x − z| <= 2^(125/b) on this path
    a = np.concatenate([np.geomspace(1e-30, min(lim, 1e30), 40001), [0.0, 1.0, 0.75, 1.5, 2.0**-130]])
    a = a.astype(np.float32)
    got = _split_powabs(a, b).astype(np.float64)
    want = np.power(a.astype(np.float64), b)
    ok = want > 2.0**-125
    rel = (got[ok] - want[ok]) / want[ok]
    # 2^r: 2.7e-6; the float32 product b·l and lg2's rounding add b·2^-24·|log2 a|·ln 2 at most.
    assert np.abs(rel).max() < 2.7e-6 + 6e-8 * np.abs(np.log2(a[ok])).max() * b
    assert abs(rel.mean()) < 3e-7  # errors oscillate: sums over k do not accumulate a bias
    tiny = got[~ok]  # 0 and terms below 2^-125 come out below 2^-125 (the kernel's epilogue flush)
    assert (tiny >= 0).all() and (tiny < 2.0**-125).all()


def test_precompile_in_worker_processes() -> None:
    from kermac_backend_nvrtc.backend import NvrtcBackend

    built = NvrtcBackend().precompile([CASES["preset-l1_distance"], CASES["grad-p2"]], archs=["sm_90"])
    assert len(built) == 2 and all(" sm_90 " in b for b in built)
    built = NvrtcBackend().precompile([CASES["preset-l2_distance"]], archs=["sm_80", "sm_90"])
    assert sorted(b.split()[1] for b in built) == ["sm_80", "sm_90a"]  # wgmma on sm_90
    compiler._memo.clear()
    assert compiler.compile_cubin(_source(CASES["grad-p2"]), "sm_90", name="kermac_grad").hit


def _sign_cases() -> list[str]:
    grads = {c: pr for c, pr in CASES.items() if isinstance(pr, kermac.problem.GradProblem)}
    return sorted(c for c, pr in grads.items() if _wgmma(_plan_grad(pr, 90)[0]))


def test_sign_cases_cover_the_layouts() -> None:
    assert {"grad-p1", "grad-p1-o3", "grad-p1-o33", "tc-grad-views", "tc-grad-sign-user-epilogue"} <= set(_sign_cases())


@pytest.mark.parametrize("case", _sign_cases())
def test_sign_grad_variant_compiles_to_cubin(case: str) -> None:
    """Planned for sm_90, every float32 sign(d − b) gradient with O ≥ 3 is the bf16 sign product (sm_90a)."""
    variant, launch = _plan_grad(CASES[case], 90)
    assert variant.target(90) == "sm_90a" and launch.block == tiles.SIGN_GRAD_TILE.threads
    source = kernel_source(variant)[0]
    assert "wgmma.mma_async.sync.aligned.m64n" in source and "mma.sync" not in source.split("kermac_grad(")[1]
    built = compiler.compile_cubin(source, "sm_90a", name="kermac_grad")
    assert built.cubin[:4] == b"\x7fELF" and "registers" in built.ptxas


def test_sign_product_needs_features() -> None:
    """By default the sign product takes gradients of at least `sign_product_min_features` features (N); fewer run
    on `mma.sync` (O ≥ 5) or the SIMT kernel."""
    k, m, o = 21, 19, 16
    for n, kind in ((95, variants.MmaGrad), (96, variants.SignGrad), (200, variants.SignGrad)):
        problem = grad_problem(grad_program(1.0), _t(k, m), _t(n, k), _t(o, k), _t(n, m), out=None, hypers={})
        assert type(plan.plan_grad(problem, 90, NvrtcTuning())[0]) is kind, n
        few = grad_problem(grad_program(1.0), _t(k, m), _t(n, k), _t(4, k), _t(n, m), out=None, hypers={})
        assert type(plan.plan_grad(few, 90, NvrtcTuning())[0]) is (variants.SimtGrad if n < 96 else kind), n


def test_plan_selects_sign_product_on_sm90_only() -> None:
    for capability, wgmma in ((90, True), (80, False), (89, False), (100, False), (None, False)):
        variant, launch = _plan_grad(CASES["grad-p1"], capability)
        assert _tensor_cores(variant) and _wgmma(variant) is wgmma, capability
        assert launch.block == (tiles.SIGN_GRAD_TILE.threads if wgmma else plan.NT)
        assert variant.dynamic_smem == (
            tiles.SIGN_GRAD_TILE.dynamic_smem(16) if wgmma else tiles.tc_grad_dynamic_smem(16)
        )
    assert 48 * 1024 < tiles.SIGN_GRAD_TILE.dynamic_smem(16) <= 227 * 1024
    # mma.sync gradient: two k tiles of a (64 m), b (8 n), c_hi and c_lo (16 o), rows padded to 72, 8, 24.
    assert tiles.tc_grad_dynamic_smem(16) == 4 * 2 * tiles.TC_GRAD_CONFIG.bk * (72 + 8 + 2 * 24)
    assert tiles.TC_GRAD_CONFIG.min_blocks * tiles.tc_grad_dynamic_smem(16) <= 163 * 1024  # sm_80's limit per SM
    for case in ("grad-p1.5", "grad-p2", "tc-grad-user-program", "grad-p1-o2", "grad-p1.5-float64"):
        assert not _wgmma(_plan_grad(CASES[case], 90)[0]), case  # other programs, O < 3, other dtypes
    assert _plan_grad(CASES["grad-p1-o3"], 90)[0].ot == 8
    assert _plan_grad(CASES["grad-p1-o33"], 90)[1].args["ochunks"] == 3
    assert render.is_sign_product(grad_program(1.0))
    flipped = kermac.GradProgram(ir.sign(ir.Var("b") - ir.Var("d")), ir.Var("acc"))
    assert not render.is_sign_product(flipped) and not render.is_sign_product(grad_program(2.0))
    assert not _wgmma(_plan_grad(CASES["grad-p1"], 90, wgmma=False)[0])


def test_sign_grad_copy_and_store_modes() -> None:
    """b's tiles go 16 bytes at a time only with unit k stride and K % 4 == 0; outputs in pairs of m
    only with unit m stride and even strides."""
    k, m, n = 24, 10, 7

    def launch(a, b, c, d, out=None):
        return _plan_grad(grad_problem(grad_program(1.0), a, b, c, d, out=out, hypers={}), 90)[1].args

    args = launch(_t(k, m), _t(n, k), _t(5, k), _t(n, m))
    assert args["bvec"] == 1 and args["ovec"] == 1
    assert launch(_t(k + 1, m), _t(n, k + 1), _t(5, k + 1), _t(n, m))["bvec"] == 0  # K % 4
    assert launch(_t(k, m), _t(k, n).T, _t(5, k), _t(n, m))["bvec"] == 0  # b column-major
    assert launch(_t(k, m), _t(n, k), _t(5, k), _t(n, m), out=_t(m, n, 5).permute(2, 1, 0))["ovec"] == 0
    assert launch(_t(k, m + 1), _t(n, k), _t(5, k), _t(n, m + 1))["ovec"] == 0  # odd row stride


def _bf16_top(x: np.ndarray) -> np.ndarray:
    """The top 16 bits of float32 values (km_top2's halves) as float32."""
    return (x.astype(np.float32).view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)


def test_sign_split_is_exact() -> None:
    """W = a·c splits into hi + mid + lo (km_top2, km_rest) exactly, each piece a bf16 value, for
    values across the float32 exponent range."""
    rng = np.random.default_rng(5)
    w = (rng.standard_normal(200_000) * np.exp2(rng.integers(-100, 100, 200_000))).astype(np.float32)
    w = np.concatenate([w, np.float32([0.0, -0.0, 1.0, -3.0, 3.4e38, 1.1754944e-38])])
    hi = _bf16_top(w)
    r = (w - hi).astype(np.float32)
    mid = _bf16_top(r)
    lo = (r - mid).astype(np.float32)
    assert np.array_equal(_bf16_top(lo), lo)  # lo has at most 8 significant bits: exact in bf16
    assert np.array_equal(hi.astype(np.float64) + mid + lo, w.astype(np.float64))
    assert "0x7632" in kernel_file("sign_grad_helpers.cuh") and "0xFFFF0000u" in kernel_file("sign_grad_helpers.cuh")


def test_sign_formula() -> None:
    """km_sgn2's sat(t·2^126 + 1/2) → 2u − 1 (emulated in float32): ±1 for |t| ≥ 2^-126 and ±inf,
    0 for ±0 and for subnormal t (flushed), −1 for NaN (the kernel's slow path restores NaN)."""
    t = np.float32([1.0, -1.0, 2.0**-126, -(2.0**-126), 3e38, -np.inf, np.inf, 0.0, -0.0, 1e-39, -1e-45, np.nan])
    ftz = np.where(np.abs(t) < np.float32(2.0**-126), np.float32(0.0), t)
    with np.errstate(over="ignore", invalid="ignore"):
        u = np.clip(np.nan_to_num(ftz * np.float32(2.0**126) + np.float32(0.5), nan=0.0), 0.0, 1.0)
    s = 2.0 * u - 1.0
    assert s.tolist() == [1, -1, 1, -1, 1, -1, 1, 0, 0, 0, 0, -1]
    assert "fma.rn.ftz.sat.f32 %0, %1, 0f7E800000, 0f3F000000" in kernel_file("sign_grad_helpers.cuh")


def test_logsumexp_reduces_by_its_combine_on_the_simt_kernel() -> None:
    """A log-sum-exp program (`kermac.reductions`) takes the SIMT kernel, a sum of (x − z)² under it too (the
    tensor cores expand a sum only), with the short unroll and shallow k tile of an expensive per-term step:
    `km_reduce` is the registry's logaddexp and the accumulators start at its identity −∞.  The built-in
    reductions keep their one-operation functors."""
    for case in ("logsumexp-soft-min", "logsumexp-squared-differences"):
        variant, _ = _plan_pairwise(CASES[case])
        assert type(variant) is variants.SimtPairwise and variant.k_unroll == 2 and not variant.deep_k, case
    source = _source(CASES["logsumexp-soft-min"])
    logaddexp = (
        "km_reduce(km_t acc, km_t v) { return ((km_eq(acc, v)) != km_t(0) ? ((acc + km_t(0.6931471824645996))) : "
        "((km_max(acc, v) + km_log((km_t(1.0) + km_exp((-km_abs((acc - v))))))))); }"
    )
    assert logaddexp in source and "#define KM_IDENTITY (-km_inf(km_t(0)))" in source
    assert "km_reduce(km_t acc, km_t v) { return (acc + v); }" in _source(CASES["preset-l1_distance"])
    assert "km_reduce(km_t acc, km_t v) { return km_max(acc, v); }" in _source(CASES["preset-linf_distance"])
