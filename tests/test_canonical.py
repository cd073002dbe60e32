"""The IR's normal form (kermac.canonical) and the facts decided on it: equivalent ways of writing a
program — (z − x)², pow(x − z, 2), |z − x|, z·x — are recognised as the forms the presets lower to,
take the same plans in both compiled backends and compute the same values; inequivalent look-alikes
((x − z)·(z − x) = −(x − z)², (x − z)·(x + z), |x + z|) are not recognised."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from helpers import BACKEND_DEVICES, require_backend

import kermac
from kermac import ir
from kermac.autograd import DOT, inner_power
from kermac.canonical import canonical, equivalent
from kermac.hyperparams import HyperValue
from kermac.ir_eval import evaluate
from kermac.lowering import grad_program
from kermac.problem import pairwise_problem
from kermac.programs import (
    PairwiseProgram,
    difference_power,
    is_abs_difference_sum,
    is_product_sum,
    is_squared_difference_sum,
    signed_power,
)
from kermac.testing import TOLERANCE

x, z, acc, h = ir.Var("x"), ir.Var("z"), ir.Var("acc"), ir.Hyper("h")
t, u = x - z, z - x

#: Ways of writing (x − z)², |x − z| and x·z, each equivalent to the first of its row.
SQUARES = [t * t, u * u, t**2, u**2, ir.pow(t, 2.0), abs(t) * abs(t), abs(u) ** 2, (-t) * (-t), (-u) ** 2]
ABSOLUTES = [abs(t), abs(u), abs(-t), abs(-u)]
PRODUCTS = [x * z, z * x]
#: Look-alikes that compute something else.
NOT_SQUARES = [
    t * u,
    u * t,
    t * (x + z),
    (x + z) * (x + z),
    t**2.0000001,
    ir.pow(t, ir.Hyper("p")),
    (h * t) ** 2,
    -(t * t),
]
NOT_ABSOLUTES = [abs(x + z), t, u, abs(x) - abs(z), -abs(t), abs(h * t)]
NOT_PRODUCTS = [x * x, z * z, x + z, -(x * z), x * (-z)]
#: Epilogues the facts must ignore: plain, hyper-scaled (Gaussian-like), with the diagonal.
EPILOGUES = [acc, ir.exp(-(acc / (2.0 * (h * h)))), ir.sqrt(acc) * h + ir.Var("diag")]


def _program(inner: ir.Expr, epilogue: ir.Expr = acc, reduction: str = "sum") -> PairwiseProgram:
    return PairwiseProgram(inner, reduction, epilogue)


# ---- the normal form ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("forms", "others"), [(SQUARES, NOT_SQUARES), (ABSOLUTES, NOT_ABSOLUTES), (PRODUCTS, NOT_PRODUCTS)]
)
def test_equivalent_forms_share_one_normal_form(forms: list[ir.Expr], others: list[ir.Expr]) -> None:
    first = canonical(forms[0])
    assert first == forms[0]  # the forms the presets lower to are their own normal form
    for form in forms:
        assert canonical(form) == first, form
        assert canonical(canonical(form)) == canonical(form), form  # idempotent
    for other in others:
        assert canonical(other) != first, other
        assert not equivalent(other, forms[0]), other


def test_rewrites_that_would_change_values_are_not_made() -> None:
    """Reassociation rounds differently; min/max of ±0 is not fixed across backends; a difference
    keeps its sign where the sign matters."""
    assert canonical((x + z) + 1.0) != canonical(x + (z + 1.0))
    assert canonical(ir.minimum(z, x)) == ir.minimum(z, x) and canonical(ir.maximum(z, x)) == ir.maximum(z, x)
    assert canonical(u) == u and canonical(ir.sign(u)) == ir.sign(u) and canonical(ir.lt(u, 0.0)) == ir.lt(u, 0.0)
    assert canonical(ir.pow(t, 3.0)) == ir.pow(t, 3.0)
    assert canonical(ir.eq(t, 1.0)) != canonical(ir.eq(u, 1.0))


#: Inputs covering signs, zeros, infinities, NaN, subnormals and values whose square overflows.
SPECIAL = [
    0.0,
    -0.0,
    1.0,
    -1.0,
    2.5,
    -3.75,
    1e-30,
    -1e-30,
    1e-40,
    3e38,
    -3e38,
    math.inf,
    -math.inf,
    math.nan,
]
#: Every form whose rewrites are exact under torch's evaluation (pow(·, 2) is exact in the IR's
#: semantics only: torch's pow with a tensor exponent may be an ulp off a·a).
EXACT = [
    *(f for f in SQUARES if "pow" not in str(f)),
    *ABSOLUTES,
    *PRODUCTS,
    ir.select(ir.ne(0.0, u), ir.sign(u) * ir.pow(abs(-u), 0.5), 0.0),
    ir.eq(u, u) + ir.ne(u, -0.0) * 2.0 + ir.eq(-0.0, -t) * 4.0,
    (z + x) * (z * x) + abs(u) * abs(u),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_normal_form_has_the_same_values_bit_for_bit(dtype: torch.dtype) -> None:
    """Evaluated on every pair of special values, each expression and its normal form agree in every
    bit (zeros' signs included), NaN where NaN."""
    values = torch.tensor(SPECIAL, dtype=dtype)
    env = {"x": values[:, None], "z": values[None, :], "h": torch.tensor(0.75, dtype=dtype)}
    for expr in EXACT:
        a, b = (evaluate(e, env, like=values).expand(len(SPECIAL), len(SPECIAL)) for e in (expr, canonical(expr)))
        assert torch.equal(a.isnan(), b.isnan()), expr
        assert _bits(a) == _bits(b), expr


def _bits(v: torch.Tensor) -> bytes:
    """The bits of ``v``'s values, NaNs as +0."""
    return torch.where(v.isnan(), 0.0, v).contiguous().numpy().tobytes()


# ---- the facts ---------------------------------------------------------------------------------


@pytest.mark.parametrize("epilogue", EPILOGUES, ids=["acc", "gaussian", "diag"])
def test_sum_facts_recognise_every_equivalent_form(epilogue: ir.Expr) -> None:
    facts = [
        (is_squared_difference_sum, SQUARES, NOT_SQUARES),
        (is_abs_difference_sum, ABSOLUTES, NOT_ABSOLUTES),
        (is_product_sum, PRODUCTS, NOT_PRODUCTS),
    ]
    for fact, forms, others in facts:
        for form in forms:
            assert fact(_program(form, epilogue)), (fact.__name__, form)
            assert not fact(_program(form, epilogue, "max")), (fact.__name__, form)
        for other in others:
            assert not fact(_program(other, epilogue)), (fact.__name__, other)


def test_autograd_differentiates_every_equivalent_form() -> None:
    p = ir.Hyper("p")
    for form in SQUARES:
        assert difference_power(form) == ir.Const(2.0) and inner_power(_program(form)) == 2.0, form
    for form in ABSOLUTES:
        assert difference_power(form) == ir.Const(1.0) and inner_power(_program(form)) == 1.0, form
    for form in PRODUCTS:
        assert inner_power(_program(form)) == DOT, form
    assert difference_power(ir.pow(abs(u), p)) == p and difference_power(ir.pow(abs(-t), 3.0)) == ir.Const(3.0)
    assert difference_power(ir.ne(u, 0.0)) == ir.Const(0.0) and difference_power(ir.ne(0.0, t)) == ir.Const(0.0)
    assert difference_power(ir.maximum(ir.pow(abs(u), p), ir.ne(t, 0.0) * 1e-30)) == p  # the floor's factors swapped
    for other in [*NOT_SQUARES, *NOT_ABSOLUTES]:
        assert difference_power(other) is None, other
        assert inner_power(_program(other)) is None, other  # the symbolic route


def test_signed_power_recognises_equivalent_writings() -> None:
    """The test, the factors and the power's base may be written in any equivalent way; ``t`` and ``e``
    come back as written in the sign (whose orientation matters)."""
    d_b = ir.Var("d") - ir.Var("b")
    b_d = ir.Var("b") - ir.Var("d")
    e = ir.Hyper("p") - 1.0
    assert signed_power(grad_program(None).multiply) == (d_b, e)
    assert signed_power(ir.select(ir.ne(0.0, d_b), ir.pow(abs(b_d), e) * ir.sign(d_b), 0.0)) == (d_b, e)
    assert signed_power(ir.select(ir.ne(b_d, -0.0), ir.sign(d_b) * ir.pow(abs(-d_b), e), 0.0)) == (d_b, e)
    assert signed_power(ir.select(ir.ne(b_d, 0.0), ir.sign(b_d) * ir.pow(abs(d_b), e), 0.0)) == (b_d, e)
    assert signed_power(ir.select(ir.ne(d_b, 0.0), ir.sign(d_b) * ir.pow(d_b, e), 0.0)) is None  # base not |t|
    assert signed_power(ir.select(ir.ne(d_b, 1.0), ir.sign(d_b) * ir.pow(abs(d_b), e), 0.0)) is None  # not t ≠ 0
    assert signed_power(ir.select(ir.ne(d_b, 0.0), ir.sign(d_b) * ir.pow(abs(d_b), e), -0.0)) is None  # −0 at t = 0
    plus = ir.Var("d") + ir.Var("b")
    assert signed_power(ir.select(ir.ne(plus, 0.0), ir.sign(d_b) * ir.pow(abs(d_b), e), 0.0)) is None  # another test


# ---- the backends take the same paths and compute the same values ------------------------------

#: (equivalent program, the preset-shaped program it is equivalent to, bit-identical output?).
#: Bit-identical where both backends' renderings of the two inner terms give the same bits.
CASES = {
    "(z-x)(z-x)": (u * u, t * t, True),
    "(z-x)**2": (u**2, t * t, False),
    "pow(x-z,2)": (ir.pow(t, 2.0), t * t, False),
    "|z-x|": (abs(u), abs(t), True),
    "|-(x-z)|": (abs(-t), abs(t), True),
    "z*x": (z * x, x * z, True),
    "|z-x|**1.3": (ir.pow(abs(u), 1.3), ir.pow(abs(t), 1.3), True),
}


def _inputs(device: str, d: int = 33) -> tuple[torch.Tensor, torch.Tensor]:
    """Odd sizes, with near-duplicate rows (the tensor-core kernels' guard recomputes those)."""
    x_ = torch.randn(5, d, device=device)
    z_ = torch.randn(7, d, device=device)
    z_[:3] = x_[:3] + 1e-4 * torch.randn(3, d, device=device)
    return x_, z_


@pytest.mark.parametrize("case", sorted(CASES))
def test_triton_plans_equivalent_programs_alike(case: str) -> None:
    """Triton's specialisation (tensor cores or not, ...) of an equivalent program is the canonical
    program's, up to the program itself."""
    launch = pytest.importorskip("kermac_backend_triton.launch")
    form, canon, _ = CASES[case]
    x_, z_ = _inputs("cpu")
    for epilogue in EPILOGUES:
        hypers = {"h": HyperValue("h", 0.5)} if "h" in str(epilogue) else {}
        plans = [
            launch.pairwise_spec(pairwise_problem(_program(inner, epilogue), x_, z_, out=None, hypers=hypers))
            for inner in (form, canon)
        ]
        (spec, layout), (canon_spec, canon_layout) = plans
        assert dataclasses.replace(spec, program=canon_spec.program) == canon_spec and layout == canon_layout, case


@pytest.mark.parametrize("case", sorted(CASES))
def test_nvrtc_plans_equivalent_programs_alike(case: str) -> None:
    """NVRTC's variant (tensor cores, the Σ|x − z| loops, ...) and launch of an equivalent program are
    the canonical program's, up to the program itself (planned on the CPU, for no device)."""
    plan = pytest.importorskip("kermac_backend_nvrtc.plan")
    tuning = pytest.importorskip("kermac_backend_nvrtc.tuning")
    variants = pytest.importorskip("kermac_backend_nvrtc.variants")
    form, canon, _ = CASES[case]
    x_, z_ = _inputs("cpu", d=64)
    out = torch.empty(5, 7)  # one output: the launch arguments hold its address
    for epilogue in EPILOGUES:
        hypers = {"h": HyperValue("h", 0.5)} if "h" in str(epilogue) else {}
        for capability in (80, 90):
            (variant, launch), (canon_variant, canon_launch) = (
                plan.plan_pairwise(
                    pairwise_problem(_program(inner, epilogue), x_, z_, out=out, hypers=hypers),
                    capability,
                    tuning.DEFAULT_TUNING,
                )
                for inner in (form, canon)
            )
            same = dataclasses.replace(variant, program=canon_variant.program)
            assert same == canon_variant, (case, capability)
            tensor_cores = isinstance(variant, variants.MmaPairwise | variants.WgmmaPairwise)
            assert tensor_cores == is_squared_difference_sum(canon_variant.program), (case, capability)
            assert launch == canon_launch, (case, capability)


def _reference(inner: ir.Expr, x_: torch.Tensor, z_: torch.Tensor) -> torch.Tensor:
    """The inner reduction in float64, from the formulas (no kermac code)."""
    x64, z64 = x_.double().cpu()[:, None, :], z_.double().cpu()[None, :, :]
    if inner == t * t:
        return ((x64 - z64) ** 2).sum(-1)
    if inner == abs(t):
        return (x64 - z64).abs().sum(-1)
    if inner == ir.pow(abs(t), 1.3):
        return ((x64 - z64).abs() ** 1.3).sum(-1)
    return (x64 * z64).sum(-1)


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_equivalent_programs_compute_the_same_values(backend: str, device: str, case: str) -> None:
    """Each backend gives an equivalent program the canonical program's values: within float32
    tolerance of the float64 formula, and bit for bit where both inner terms render to the same bits."""
    require_backend(backend, device)
    form, canon, identical = CASES[case]
    x_, z_ = _inputs(device)
    out = kermac.run_program(_program(form), x_, z_, backend=backend)
    expected = kermac.run_program(_program(canon), x_, z_, backend=backend)
    ref = _reference(canon, x_, z_)
    scale = ref.abs().max()
    assert (out.double().cpu() - ref).abs().max() <= TOLERANCE[torch.float32] * scale, case
    if identical:
        assert torch.equal(out, expected), case
