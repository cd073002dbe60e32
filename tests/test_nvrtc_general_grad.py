"""NVRTC backend without a GPU: gradient programs in the general form (`kermac.programs.GradProgram` with an
`accumulate`) run on the SIMT gradient kernel with their multiply, accumulate and reduction rendered; a general
program equal to a product form (`kermac.programs.product_factor`) runs exactly the product form's kernels.

Problems are built on CPU tensors (planning reads only shapes, strides and alignment); NVRTC compiles without
a GPU.  Nothing here loads a module (that needs a device).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import require_nvrtc_compiler
from test_general_grad_programs import KERNELS

from kermac import ir, testing
from kermac.hyperparams import HyperValue
from kermac.lowering import grad_program
from kermac.problem import grad_problem, pairwise_problem
from kermac.programs import GradProgram, product_factor

pytest.importorskip("kermac_backend_nvrtc.source")
pytest.importorskip("cuda.core")
from kermac_backend_nvrtc import compiler, plan, variants
from kermac_backend_nvrtc.source import kernel_source
from kermac_backend_nvrtc.tuning import DEFAULT_TUNING

require_nvrtc_compiler(module_level=True)

A, B, C, D, TERM, ACC = (ir.Var(n) for n in ("a", "b", "c", "d", "term", "acc"))
GENERAL_CASES = {c.name: c for c in testing.CASES if c.op == "grad" and product_factor(c.program) is None}
"""The conformance cases whose program has no product form (`grad_user_*`)."""
TRACED = {name: (kernel.program, hypers) for name, kernel, hypers, _ in KERNELS}
"""The general programs of tests/test_general_grad_programs.py with the hyperparameters they run with."""
TARGETS = [
    (torch.float32, "sm_80"),
    (torch.float32, "sm_90"),
    (torch.float64, "sm_80"),
    (torch.float64, "sm_90"),
    (torch.float16, "sm_80"),
    (torch.bfloat16, "sm_90"),
]
"""(input dtype, target) each general kernel compiles for: both compute types on both targets, each half input
type on one."""


def _hypers(**values: float | torch.Tensor) -> dict[str, HyperValue]:
    return {k: HyperValue(k, v) if isinstance(v, float) else HyperValue(k, None, v) for k, v in values.items()}


def _case_problem(name: str, dtype: torch.dtype):
    case = GENERAL_CASES[name]
    operands, hypers = case.inputs("cpu", dtype)
    return case.problem(operands, hypers, None)


def _traced_problem(name: str, dtype: torch.dtype, o: int = 3):
    program, hypers = TRACED[name]
    k, m, n = 37, 29, 19
    shapes = ((k, m), (n, k), (o, k), (n, m))
    a, b, c, d = (torch.randn(s, dtype=torch.float64).to(dtype) for s in shapes)
    return grad_problem(program, a, b, c, d, out=None, hypers=_hypers(**hypers))


def _problem(program: GradProgram, o: int, dtype: torch.dtype = torch.float32, **hypers: float | torch.Tensor):
    k, m, n = 21, 19, 11
    a, b, c, d = (torch.randn(s, dtype=torch.float64).to(dtype) for s in ((k, m), (n, k), (o, k), (n, m)))
    return grad_problem(program, a, b, c, d, out=None, hypers=_hypers(**hypers))


def _soft_min_problem():
    """A pairwise log-sum-exp problem (`testing.SOFT_MIN`): its kernel renders the reduction's combine."""
    return pairwise_problem(testing.SOFT_MIN, torch.randn(5, 3), torch.randn(4, 3), out=None, hypers=_hypers(gamma=0.5))


def _source(problem, capability: int = 90, tuning=DEFAULT_TUNING) -> str:
    return kernel_source(plan.plan_grad(problem, capability, tuning)[0])[0]


def _functor(source: str, name: str) -> str:
    """The line defining functor `name` in `source`."""
    (line,) = (line for line in source.splitlines() if f" km_t {name}(" in line)
    return line


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory):
    """One cache for the module: an equal source (a case differing only in its values) compiles once."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KERMAC_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        mp.setattr(compiler, "_memo", {})
        yield


def test_the_cases_cover_every_reduction() -> None:
    reductions = {c.program.reduction for c in GENERAL_CASES.values()} | {p.reduction for p, _ in TRACED.values()}
    assert reductions == {"sum", "max", "min", "logsumexp"}
    assert all(name.startswith("grad_user_") for name in GENERAL_CASES) and len(GENERAL_CASES) >= 8


@pytest.mark.parametrize(("dtype", "arch"), TARGETS, ids=[f"{str(d)[6:]}-{a}" for d, a in TARGETS])
@pytest.mark.parametrize("name", [*GENERAL_CASES, *TRACED])
def test_general_kernel_compiles_to_cubin(name: str, dtype: torch.dtype, arch: str) -> None:
    problem = _case_problem(name, dtype) if name in GENERAL_CASES else _traced_problem(name, dtype)
    variant = plan.plan_grad(problem, int(arch.removeprefix("sm_")), DEFAULT_TUNING)[0]
    assert isinstance(variant, variants.SimtGrad)
    target = variant.target(int(arch.removeprefix("sm_")))
    built = compiler.compile_cubin(kernel_source(variant)[0], target, name=variant.kernel)
    assert built.cubin[:4] == b"\x7fELF"


def test_general_source_renders_multiply_accumulate_and_combine() -> None:
    """Per (n, m, k) the multiply over a, b, d; per output the reduction's combine (the pairwise kernels'
    `km_reduce`) of the value so far with the accumulate of c and the term; the reduction's identity."""
    source = _source(_case_problem("grad_user_max", torch.float32))
    assert _functor(source, "km_term").endswith("{ return (km_abs((d - b)) - a); }")
    assert _functor(source, "km_accumulate").endswith("{ return km_reduce(acc, (term * c)); }")
    assert _functor(source, "km_reduce").endswith("{ return km_max(acc, v); }")
    assert "#define KM_IDENTITY (-km_inf(km_t(0)))" in source and "km_multiply" not in source
    source = _source(_case_problem("grad_user_min_k0", torch.float64))
    assert _functor(source, "km_term").endswith("{ return ((a * b) - d); }")
    assert _functor(source, "km_accumulate").endswith("{ return km_reduce(acc, (term - c)); }")
    assert _functor(source, "km_reduce").endswith("{ return km_min(acc, v); }")
    assert "#define KM_IDENTITY km_inf(km_t(0))" in source
    source = _source(_case_problem("grad_user_general_sum", torch.float32))
    assert _functor(source, "km_reduce").endswith("{ return (acc + v); }")
    assert _functor(source, "km_accumulate").endswith("{ return km_reduce(acc, (c * term)); }")
    assert "#define KM_IDENTITY km_t(0.0)" in source
    # log-sum-exp: the combine the pairwise kernels render, tensor hyperparameters read by the multiply
    source = _source(_case_problem("grad_user_soft_max_batched_gamma", torch.float32))
    pairwise = kernel_source(plan.plan_pairwise(_soft_min_problem(), 90, DEFAULT_TUNING)[0])[0]
    assert _functor(source, "km_reduce") == _functor(pairwise, "km_reduce")
    assert _functor(source, "km_term").endswith("{ return km_div_inv((a * (d - b)), h_gamma); }")
    assert "hp_gamma" in source


def test_accumulate_reads_hyperparameters() -> None:
    program = GradProgram(A - D * B, ACC, C * TERM + ir.Hyper("t"), "max")
    source = _source(_problem(program, 3, t=0.5))
    assert _functor(source, "km_accumulate").endswith("{ return km_reduce(acc, ((c * term) + h_t)); }")
    assert "km_t hv_t" in source and "KM_HYPER_FORMALS" in _functor(source, "km_accumulate")


def test_half_powers_of_the_accumulate_are_known_to_the_plan() -> None:
    """The exponents planning fixes in the source include the accumulate's (`km_powhalf`: products and a
    square root)."""
    program = GradProgram(A * (D - B), ACC, ir.pow(abs(C), ir.Hyper("q")) * TERM, "max")
    variant = plan.plan_grad(_problem(program, 3, q=1.5), 90, DEFAULT_TUNING)[0]
    assert variant.fixed_hypers == (("q", 1.5),)
    assert "km_powhalf<3, " in _functor(kernel_source(variant)[0], "km_accumulate")


def test_product_form_source_is_the_product_form() -> None:
    """A program with a factor renders it as `km_multiply`, the term `a·g(d, b)`, the FMA and the identity 0."""
    source = _source(_problem(grad_program(2.0), 3))
    assert _functor(source, "km_multiply").endswith("{ return (d - b); }")
    assert _functor(source, "km_term").endswith("{ return a * km_multiply(d, b KM_HYPER_ACTUALS); }")
    assert _functor(source, "km_accumulate").endswith("{ return km_fma(c, term, acc); }")
    assert "#define KM_IDENTITY km_t(0.0)" in source and "km_reduce" not in source


@pytest.mark.parametrize("o", [3, 16])
@pytest.mark.parametrize("capability", [80, 90])
@pytest.mark.parametrize("name", [*GENERAL_CASES, *TRACED])
def test_general_programs_plan_to_the_simt_kernel_only(name: str, capability: int, o: int) -> None:
    """Whatever the tuning, device and O: no tensor-core or sign-product kernel computes a general program."""
    program = GENERAL_CASES[name].program if name in GENERAL_CASES else TRACED[name][0]
    hypers = {h: 0.5 for h in program.hypers}
    for tuning in (DEFAULT_TUNING, dataclasses.replace(DEFAULT_TUNING, tensor_core_grad_min_o=1)):
        variant, launch = plan.plan_grad(_problem(program, o, **hypers), capability, tuning)
        assert isinstance(variant, variants.SimtGrad) and variant.program == program
        assert launch.block == plan.NT


@pytest.mark.parametrize("o", [1, 16])
@pytest.mark.parametrize("capability", [80, 90])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_general_program_equal_to_the_p1_gradient_plans_like_it(o: int, capability: int, dtype) -> None:
    """`Σ_k c·(a·sign(d − b))` in the general form plans like cdist_grad's p = 1 program — the same kernel
    (mma.sync for O = 16 — 11 features are too few for the sign product on sm_90 —, SIMT otherwise), launch and
    source."""
    general = GradProgram(A * ir.sign(D - B), ACC, C * TERM)
    assert general.general and product_factor(general) == grad_program(1.0).multiply
    problem = _problem(grad_program(1.0), o, dtype)
    twin = dataclasses.replace(problem, program=general)
    variant, launch = plan.plan_grad(problem, capability, DEFAULT_TUNING)
    twin_variant, twin_launch = plan.plan_grad(twin, capability, DEFAULT_TUNING)
    assert twin_variant == dataclasses.replace(variant, program=general)
    assert twin_launch == launch
    assert kernel_source(twin_variant) == kernel_source(variant)
    expected = {(80, 1): variants.SimtGrad, (80, 16): variants.MmaGrad, (90, 1): variants.SimtGrad}
    expected[90, 16] = variants.MmaGrad
    assert isinstance(variant, expected[capability, o] if dtype == torch.float32 else variants.SimtGrad)


def test_programs_that_differ_only_in_reduction_or_accumulate_get_distinct_kernels() -> None:
    """The variant holds the program, so the plan memo and loaded kernels tell general programs apart; their
    sources differ, so the JIT cache does too."""
    multiply = A * (D - B)
    programs = [
        GradProgram(multiply, ACC, C * TERM, "max"),
        GradProgram(multiply, ACC, C * TERM, "min"),
        GradProgram(multiply, ACC, C * TERM, "logsumexp"),
        GradProgram(multiply, ACC, C + TERM),
    ]
    planned = [plan.plan_grad(_problem(p, 3), 90, DEFAULT_TUNING)[0] for p in programs]
    assert len(set(planned)) == len(programs)
    assert len({kernel_source(v)[0] for v in planned}) == len(programs)
    assert len({plan.call_key(_problem(p, 3))[0] for p in programs}) == len(programs)


def test_tensor_core_sources_refuse_a_general_program() -> None:
    """Built by hand (the planner never does), a tensor-core variant of a general program is refused."""
    problem = _problem(grad_program(1.0), 16)
    general = GradProgram(A + ir.sign(D - B), ACC, C * TERM)
    sign = dataclasses.replace(DEFAULT_TUNING, sign_product_min_features=1)  # the sign product on sm_90 too
    for capability in (80, 90):
        variant = plan.plan_grad(problem, capability, sign)[0]
        assert isinstance(variant, variants.MmaGrad | variants.SignGrad)
        with pytest.raises(ValueError, match=r"needs .*product form"):
            kernel_source(dataclasses.replace(variant, program=general))
