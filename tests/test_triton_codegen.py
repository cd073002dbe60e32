"""The Triton backend's code generation: generated source per descriptor, and the IEEE special
cases of its generated helpers (pow, sign, NaN-propagating min/max) against torch.

Source checks need only triton's package to be importable for nothing: they inspect text.
Value checks run wherever the backend can (a GPU, or the CPU with TRITON_INTERPRET=1).
"""

from __future__ import annotations

import ast
import math
import re

import pytest
import torch
from helpers import BACKEND_DEVICES, require_backend

import kermac
from kermac import ir, presets, testing
from kermac import kernel_facts as facts
from kermac.programs import GradProgram, PairwiseProgram, nonnegative, nonnegative_variables

expressions = pytest.importorskip("kermac_backend_triton.expressions")
generated = pytest.importorskip("kermac_backend_triton.generated")

TRITON_DEVICES = [p for p in BACKEND_DEVICES if p.values[0] == "triton"]


def pairwise(desc: kermac.KernelDescriptor, **changes: object) -> str:
    spec = dict(program=desc.lower(), compute="float32", nbatch=0, tensor_hypers=frozenset(), int64=False)
    spec.update(changes)
    return generated.kernel_source(generated.PairwiseSpec(**spec))


def grad_program(p: float) -> GradProgram:
    t = ir.Var("d") - ir.Var("b")
    if p == 1.0:
        return GradProgram(ir.sign(t), ir.Var("acc"))
    general = ir.sign(t) * ir.pow(abs(t), ir.Hyper("p") - 1.0)
    return GradProgram(ir.select(ir.ne(t, 0.0), general, 0.0), ir.Var("acc"))


def function(source: str, name: str) -> str:
    """The text of function ``name`` in ``source`` (which must parse as Python)."""
    tree = ast.parse(source)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    return ast.get_source_segment(source, fn)


@pytest.mark.parametrize("name", sorted(presets.ALL))
@pytest.mark.parametrize("regularized", [False, True])
def test_every_preset_generates_valid_source(name: str, regularized: bool) -> None:
    desc = presets.ALL[name]
    program = desc.lower(regularized=regularized)
    source = pairwise(desc, program=program)
    entry = function(source, generated.PAIRWISE_ENTRY)
    inner, epilogue = function(source, "inner"), function(source, "epilogue")
    # The reduction and whether the diagonal is computed are the tile's constants.
    assert f"'{program.reduction}', {regularized}, tl.float32, BK, MI, NI, MT, NT, PF" in entry
    # Every hyperparameter is a typed scalar argument, cast to the compute type on entry.
    for h in program.hypers:
        assert f"h_{h}: tl.float32" in entry and f"h_{h} = tl.full([], h_{h}, tl.float32)" in entry
    # Inner expressions use the special-function unit's log2; epilogues the accurate one.
    if desc.power == "pow":
        assert "pow_nonneg_fast(tl.abs((x - z)), h_p)" in inner
    if desc.outer == "root":
        assert "pow_nonneg(acc, (tl.full([], 1.0, tl.float32) / h_p))" in epilogue
    assert "pow_ieee(" not in source  # every built-in base is provably non-negative


def test_specialisations_fall_out_of_the_ir() -> None:
    l1 = function(pairwise(presets.l1_distance), "inner")
    l2 = pairwise(presets.l2_distance)
    assert "return tl.abs((x - z))" in l1 and "pow" not in l1
    assert "return ((x - z) * (x - z))" in function(l2, "inner") and "sqrt_approx(acc)" in function(l2, "epilogue")
    assert "return (x * z)" in function(pairwise(presets.dot_product), "inner")


def test_layout_specialisations() -> None:
    src = pairwise(presets.laplace_lp, nbatch=2, tensor_hypers=frozenset({"bandwidth"}), int64=True)
    body = function(src, generated.PAIRWISE_ENTRY)
    assert "grouped_tile(M, N, MI * MT, NI * NT, GROUP_M, True)" in body and "INT64=True" in body
    assert "b1 = rest % BS1" in body and "X += b0 * SB_x_0 + b1 * SB_x_1" in body
    assert "H_bandwidth += b0 * SB_hyper_bandwidth_0 + b1 * SB_hyper_bandwidth_1" in body
    assert "h_bandwidth = tl.load(H_bandwidth).to(tl.float32)" in body
    assert "h_p: tl.float32" in body  # p stays a scalar argument
    # The program's functions read the hyperparameters they use from the tuple, by position.
    assert "(h_bandwidth, h_p, h_regularization)" in body or "(h_bandwidth, h_p)" in body
    assert "h_p = hypers[1]" in function(src, "inner") and "h_bandwidth" not in function(src, "inner")
    plain = function(pairwise(presets.laplace_lp), generated.PAIRWISE_ENTRY)
    assert "INT64=False" in plain and "BS0" not in plain


def test_float64_programs_and_the_interpreter_use_the_portable_math(monkeypatch: pytest.MonkeyPatch) -> None:
    """float32 on a GPU takes lg2.approx and libdevice; float64, and the interpreter, Triton's accurate math."""
    math_ = pytest.importorskip("kermac_backend_triton.kernel_math")
    tl = pytest.importorskip("triton.language")
    assert "h_p: tl.float64" in pairwise(presets.lp_distance, compute="float64")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not math_.native_float32(tl.float32)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert math_.native_float32(tl.float32) and not math_.native_float32(tl.float64)


@pytest.mark.parametrize("p", [1.0, 1.5])
def test_grad_source(p: float) -> None:
    spec = generated.GradSpec(grad_program(p), "float32", 1, frozenset(), False)
    source = generated.kernel_source(spec)
    entry = function(source, generated.GRAD_ENTRY)
    assert "A += b0 * SB_a_0" in entry and "DD += b0 * SB_d_0" in entry
    if p == 1.0:
        assert "return sign((d - b))" in function(source, "multiply") and "signed_base" not in source
        assert "None, None, False, tl.float32" in entry
    else:
        # sgn(t)·|t|^(p−1): one copysigned power where p − 1 is in (0, ∞), its exponent as a tile.
        assert "signed_base, signed_exponent, True, tl.float32" in entry
        assert "return (d - b)" in function(source, "signed_base")
        assert "return (h_p - tl.full([], 1.0, tl.float32))" in function(source, "signed_exponent")
        general = "pow_nonneg_fast(tl.abs((d - b)), (h_p - tl.full([], 1.0, tl.float32)))"
        assert general in function(source, "multiply")


def test_grad_signed_power_needs_a_scalar_exponent() -> None:
    t = ir.Var("d") - ir.Var("b")
    prog = GradProgram(ir.select(ir.ne(t, 0.0), ir.sign(t) * ir.pow(abs(t), ir.Var("d")), 0.0), ir.Var("acc"))
    source = generated.kernel_source(generated.GradSpec(prog, "float32", 0, frozenset(), False))
    assert "signed_base" not in source and "None, None, False" in source


_A, _B, _C, _D, _TERM, _ACC = (ir.Var(n) for n in ("a", "b", "c", "d", "term", "acc"))


def grad_source(program: GradProgram, **changes: object) -> str:
    spec = dict(program=program, compute="float32", nbatch=0, tensor_hypers=frozenset(), int64=False)
    spec.update(changes)
    return generated.kernel_source(generated.GradSpec(**spec))


def test_general_grad_source() -> None:
    """A program without a product factor: `multiply` of `a, b, d`, its `accumulate`, the reduction's `combine`
    rendered from `kermac.reductions` by the pairwise kernels' renderer, and the general kernel's tile."""
    program = GradProgram(abs(_D - _B) - _A, ir.Hyper("s") * _ACC, _TERM * _C + ir.Hyper("t"), "max")
    source = grad_source(program, nbatch=1, tensor_hypers=frozenset({"t"}))
    assert generated.grad_kernel(program) == "grad_general"
    assert "return (tl.abs((d - b)) - a)" in function(source, "multiply")
    assert "def multiply(a, b, d, hypers):" in source
    accumulate = function(source, "accumulate")
    assert "def accumulate(c, term, hypers):" in accumulate and "return ((term * c) + h_t)" in accumulate
    assert "h_t = hypers[1]" in accumulate and "h_s" not in accumulate
    assert "return (h_s * acc)" in function(source, "epilogue")
    assert "return max_nan(acc, t)" in function(source, "combine")
    assert "combine_chunk" not in source and "signed_base" not in source and not re.search(r"\bgradient_tile\(", source)
    entry = function(source, generated.GRAD_ENTRY)
    assert "general_gradient_tile(" in entry and "multiply, accumulate, combine, epilogue, 'max', tl.float32" in entry
    assert "H_t += b0 * SB_hyper_t_0" in entry and "h_s: tl.float32" in entry
    # The combine is the pairwise kernels' text of the same reduction (one renderer): log-sum-exp's logaddexp.
    soft = grad_source(testing.SOFT_MAX_GRAD)
    assert function(soft, "combine") == function(pairwise(presets.l1_distance, program=testing.SOFT_MIN), "combine")


def test_a_product_form_program_takes_the_product_path() -> None:
    """A program without an accumulate is its own product factor: the product-form kernel, its multiply of `d, b`."""
    program = grad_program(1.0)
    source = grad_source(program)
    assert generated.grad_kernel(program) == "grad"
    assert "gradient_tile(" in function(source, generated.GRAD_ENTRY) and "general_gradient" not in source
    assert "def multiply(d, b, hypers):" in source and "accumulate" not in source and "combine" not in source


@pytest.mark.parametrize(
    "general, product",
    [
        (GradProgram(_A * ir.sign(_D - _B), _ACC, _C * _TERM), GradProgram(ir.sign(_D - _B), _ACC)),
        (
            GradProgram((_D - _B) * ir.Hyper("s") * _A, ir.Hyper("e") * _ACC, _TERM * _C),
            GradProgram((_D - _B) * ir.Hyper("s"), ir.Hyper("e") * _ACC),
        ),
        (GradProgram(grad_program(1.5).multiply * _A, _ACC, _C * _TERM), grad_program(1.5)),
    ],
    ids=["sign", "hypers_and_order", "signed_power"],
)
def test_a_general_program_equal_to_a_product_form_takes_the_product_path(
    general: GradProgram, product: GradProgram
) -> None:
    """A sum of `c·term` whose multiply is `a` times a factor generates the product form's module: the same text
    but for the program's key in a comment (the signed-power route included)."""
    assert generated.grad_kernel(general) == "grad"
    for changes in ({}, {"compute": "float64", "nbatch": 2, "int64": True}):
        general_source, product_source = grad_source(general, **changes), grad_source(product, **changes)
        assert general_source.replace(general.key(), product.key()) == product_source


def test_op_table_covers_the_ir() -> None:
    for compute in expressions.COMPUTE_TYPES:
        assert set(expressions.op_table(compute)) == set(ir.OPS)
    with pytest.raises(ValueError, match="compute"):
        expressions.op_table("float16")


def test_constants_and_nonnegativity() -> None:
    x, z = ir.Var("x"), ir.Var("z")
    e = ir.minimum(x, -1.5) + ir.maximum(z, math.inf) * math.nan - (-0.0)
    text = expressions.render_expr(e, {"x": "X", "z": "Z"}, "float32")
    one = "tl.full([], {}, tl.float32)".format
    minus_zero = "tl.full([], 0x80000000, tl.uint32).to(tl.float32, bitcast=True)"
    expected = f"((min_nan(X, {one(-1.5)}) + (max_nan(Z, {one('INF')}) * ({one('INF')} * 0.0))) - {minus_zero})"
    assert text == expected
    nn = nonnegative
    assert nn(abs(x - z)) and nn((x - z) * (x - z)) and nn(ir.exp(x)) and nn(ir.Var("acc"), frozenset({"acc"}))
    assert not nn(x - z) and not nn(ir.Hyper("p")) and not nn(ir.Const(-0.0)) and not nn(ir.sqrt(x))
    assert nn(ir.maximum(x, 0.0)) and not nn(ir.minimum(x, 0.0))
    acc = ir.Var("acc")  # the accumulator of a sum or a minimum of non-negative terms; not of a maximum or signed terms
    assert nonnegative_variables(PairwiseProgram(abs(x - z), "sum", acc)) == {"acc"}
    assert nonnegative_variables(PairwiseProgram(abs(x - z), "min", acc)) == {"acc"}
    assert nonnegative_variables(PairwiseProgram(abs(x - z), "max", acc)) == frozenset()
    assert nonnegative_variables(PairwiseProgram(x - z, "sum", acc)) == frozenset()
    with pytest.raises(KeyError, match="variable 'q'"):
        expressions.render_expr(ir.Var("q"), {"x": "X"}, "float32")


SPECIALS = [0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5, 3.0, math.inf, -math.inf, math.nan]


@pytest.mark.parametrize(("backend", "device"), TRITON_DEVICES)
def test_helpers_match_torch_on_special_values(backend: str, device: str) -> None:
    """pow (general and non-negative), sign, min and max on IEEE special values, as torch computes them."""
    require_backend(backend, device)
    v = torch.tensor(SPECIALS, device=device)[:, None]
    x, z = ir.Var("x"), ir.Var("z")
    cases = {
        "pow": (ir.pow(x, z), lambda a, b: torch.pow(a, b)),
        "pow_nonneg": (ir.pow(abs(x), z), lambda a, b: torch.pow(a.abs(), b)),
        # kermac.ir documents sign(NaN) = NaN (torch.sign gives 0 there).
        "sign": (ir.sign(x) + 0.0 * ir.eq(z, z), lambda a, b: torch.where(a.isnan(), a, a.sign()) + 0.0 * (b == b)),
        # 1/sign tells sign(−0) = +0 (torch.sign) from −0: +inf, not −inf.
        "inv_sign": (
            1.0 / ir.sign(x) + 0.0 * ir.eq(z, z),
            lambda a, b: 1.0 / torch.where(a.isnan(), a, a.sign()) + 0.0 * (b == b),
        ),
        "min": (ir.minimum(x, z), torch.minimum),
        "max": (ir.maximum(x, z), torch.maximum),
    }
    for name, (expr, ref) in cases.items():
        out = kermac.run_program(PairwiseProgram(expr, "sum", ir.Var("acc")), v, v, backend=backend).cpu().double()
        expected = ref(v.cpu().double(), v.cpu().double().T)
        same_nan = torch.isnan(out) == torch.isnan(expected)
        assert same_nan.all(), f"{name}: NaN pattern differs at {same_nan.logical_not().nonzero().tolist()}"
        finite = ~torch.isnan(expected)
        close = torch.isclose(out[finite], expected[finite], rtol=1e-6, atol=0.0)
        assert close.all(), f"{name}: {out[finite][~close].tolist()} != {expected[finite][~close].tolist()}"


#: (base, exponent) pairs covering IEEE pow's special cases: signed zeros and infinities, odd, even
#: and non-integer exponents, NaN on either side (pow(NaN, 0) = pow(1, NaN) = 1), |base| = 1 with
#: infinite exponents, subnormal and huge values.
POW_PAIRS = [
    (math.inf, 2.0), (math.inf, -2.0), (-math.inf, 3.0), (-math.inf, 2.0), (-math.inf, -3.0), (-math.inf, 0.5),
    (0.0, -1.0), (-0.0, -1.0), (-0.0, -2.0), (-0.0, 3.0), (0.0, 0.0), (-2.0, 0.5), (-2.0, 3.0), (-2.0, -2.0),
    (-1.0, math.inf), (-1.0, -math.inf), (0.5, math.inf), (2.0, -math.inf), (0.5, -math.inf), (-0.5, math.inf),
    (math.nan, 0.0), (1.0, math.nan), (math.nan, 1.0), (2.0, math.nan), (1e-40, 1.0), (1e-310, 0.5), (1e300, 2.0),
]  # fmt: skip


_FLOAT32_TINY = torch.finfo(torch.float32).smallest_normal


def _dtype_id(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=_dtype_id)
@pytest.mark.parametrize(("backend", "device"), TRITON_DEVICES)
def test_pow_with_constant_operands_matches_torch(backend: str, device: str, dtype: torch.dtype) -> None:
    """pow of two constants (a scalar-only expression, broadcast to the tile) and of a tile and a
    constant exponent, on IEEE special cases, as torch.pow computes them after rounding the constants
    to the compute type.  Before constants were typed, a constant exponent of ±inf or NaN made the
    kernel fail (``tl.floor`` of a Python float) and pow of two constants was computed by Python."""
    require_backend(backend, device)
    x, z = ir.Var("x"), ir.Var("z")
    ones = torch.ones(1, 1, dtype=dtype, device=device)
    for a, b in POW_PAIRS:
        ref = torch.pow(torch.tensor(a, dtype=dtype), torch.tensor(b, dtype=dtype)).double()
        for expr, xv in ((ir.pow(a, b) + 0.0 * abs(x - z), ones), (ir.pow(x, b), ones * a)):
            got = kermac.run_program(PairwiseProgram(expr, "sum", ir.Var("acc")), xv, ones, backend=backend)
            got = got.double().cpu()[0, 0]
            # float32 on the GPU may flush a subnormal result to 0 (docs/triton.md, semantics notes).
            flushed = device == "cuda" and dtype == torch.float32 and got == 0 and 0 < ref.abs() < _FLOAT32_TINY
            assert flushed or (got.isnan() and ref.isnan()) or torch.isclose(got, ref, rtol=1e-6, atol=0.0), (
                f"pow({a}, {b}) in {dtype}: {got.item()} != torch {ref.item()} ({ir.to_sexpr(expr)})"
            )


def _grad_inputs(dtype: torch.dtype, device: str) -> tuple[torch.Tensor, ...]:
    k, m, n, o = 5, 4, 3, 2
    return tuple(torch.randn(*s, dtype=dtype, device=device) for s in ((k, m), (n, k), (o, k), (n, m)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=_dtype_id)
@pytest.mark.parametrize(("backend", "device"), TRITON_DEVICES)
def test_constant_and_hyperparameter_only_expressions(backend: str, device: str, dtype: torch.dtype) -> None:
    """An inner term, multiply or epilogue built from constants and scalar hyperparameters only is a
    scalar: it is broadcast to the tile (it used to fail with ``'float' object has no attribute 'type'``)."""
    require_backend(backend, device)
    xs, zs, acc, h = ir.Var("x") - ir.Var("z"), ir.Var("d") - ir.Var("b"), ir.Var("acc"), ir.Hyper("h")
    x, z = torch.randn(3, 4, dtype=dtype, device=device), torch.randn(5, 4, dtype=dtype, device=device)
    pairwise = [
        PairwiseProgram(ir.Const(2.0), "sum", acc),
        PairwiseProgram(h * 3.0, "max", acc),
        PairwiseProgram(ir.exp(h), "min", acc * h),
        PairwiseProgram(abs(xs), "sum", ir.Const(1.5)),
        PairwiseProgram(abs(xs), "sum", ir.sqrt(h) + ir.select(ir.Var("diag"), h, 0.0)),
    ]
    for program in pairwise:
        hypers = {"h": 0.7} if program.hypers else None
        got = kermac.run_program(program, x, z, hypers=hypers, backend=backend)
        ref = kermac.run_program(program, x, z, hypers=hypers, backend="torch")
        torch.testing.assert_close(got, ref, rtol=1e-6, atol=0.0, msg=program.key())
    grads = [GradProgram(ir.Const(0.5), acc), GradProgram(h - 1.0, acc), GradProgram(zs, ir.Const(-2.0))]
    grads.append(GradProgram(ir.sign(zs), h * h))
    operands = _grad_inputs(dtype, device)
    for program in grads:
        hypers = {"h": 0.7} if program.hypers else None
        got = kermac.run_grad_program(program, *operands, hypers=hypers, backend=backend)
        ref = kermac.run_grad_program(program, *operands, hypers=hypers, backend="torch")
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6, msg=program.key())


@pytest.mark.parametrize(("backend", "device"), TRITON_DEVICES)
def test_scalar_subexpressions_compute_in_the_compute_type(backend: str, device: str) -> None:
    """Constants and scalar hyperparameters are values of the compute type.  float64: λ, exp(1.0) and
    p − 1/3 keep float64 precision (they were computed in float32).  float32: a constant is rounded
    to float32 before it is used — 1e-40 to the float32 subnormal, 1e39 to inf — as the reference
    does (Python evaluated scalar-only subexpressions in double precision)."""
    require_backend(backend, device)
    t, acc, h, diag = ir.Var("x") - ir.Var("z"), ir.Var("acc"), ir.Hyper("h"), ir.Var("diag")
    cases = {
        torch.float64: [
            PairwiseProgram(abs(t) * ir.exp(ir.Const(1.0)), "sum", acc),
            PairwiseProgram(abs(t) * ir.exp(h), "sum", acc),
            PairwiseProgram(abs(t) * (h - 1.0 / 3.0), "sum", acc),
            PairwiseProgram(abs(t), "sum", acc + ir.select(diag, h / 3.0, 0.0)),
            PairwiseProgram(abs(t) + 1e-310, "max", acc * 1e300),
        ],
        torch.float32: [
            PairwiseProgram(ir.sqrt(ir.Const(1e-40)) + 0.0 * t, "sum", acc),
            PairwiseProgram(ir.select(ir.gt(t, -100.0), 1e-40, 0.0), "sum", acc * 1e30),
            PairwiseProgram(0.0 * t + ir.Const(1.0) / ir.Const(1e39), "sum", acc),
        ],
    }
    for dtype, programs in cases.items():
        x, z = torch.randn(3, 4, dtype=dtype, device=device), torch.randn(5, 4, dtype=dtype, device=device)
        for program in programs:
            hypers = {"h": 0.1} if program.hypers else None
            got = kermac.run_program(program, x, z, hypers=hypers, backend=backend)
            ref = kermac.run_program(program, x, z, hypers=hypers, backend="torch")
            tol = 1e-15 if dtype == torch.float64 else 1e-6
            torch.testing.assert_close(got, ref, rtol=tol, atol=0.0, msg=f"{dtype} {program.key()}")


@pytest.mark.parametrize("name", ["l2_distance", "squared_l2_distance", "gaussian", "laplace_l2", "matern32", "cauchy"])
def test_p2_family_selects_the_tensor_core_kernel(name: str) -> None:
    """Float32 Σ(x − z)² programs expand on tensor cores with the guard and the exact recompute."""
    program = presets.ALL[name].lower(regularized=True)
    assert facts.tensor_core_eligible(program, "float32")
    assert not facts.tensor_core_eligible(program, "float64")
    source = pairwise(presets.ALL[name], program=program, kernel="tensor_cores")
    entry = function(source, generated.PAIRWISE_ENTRY)
    assert "tensor_core_tile(" in entry and "GUARD, KEY," in entry
    assert 'do_not_specialize=["M", "OFF_M", "OFF_N", "GUARD", "KEY"]' in source  # N and D specialised
    assert "pow_ieee(" not in function(source, "epilogue")  # acc is known non-negative in the epilogue


@pytest.mark.parametrize("name", ["l1_distance", "lp_distance", "dot_product", "linf_distance", "laplace_l1"])
def test_other_programs_keep_the_simt_kernel(name: str) -> None:
    program = presets.ALL[name].lower()
    assert not facts.tensor_core_eligible(program, "float32")
    with pytest.raises(ValueError, match="'tensor_cores' needs a float32 sum"):
        pairwise(presets.ALL[name], kernel="tensor_cores")
    with pytest.raises(ValueError, match="'tensor_cores' needs a float32 sum"):
        pairwise(presets.l2_distance, compute="float64", kernel="tensor_cores")


def test_guard_threshold_follows_the_error_bound() -> None:
    def bound(d: int) -> float:
        return (math.sqrt(d) * 2.0**-24 + 3 * 2.0**-23) * 2.0**16

    assert facts.cancellation_guard(256) == pytest.approx(bound(256)) and 0.08 < facts.cancellation_guard(256) < 0.09
    assert facts.cancellation_guard(1024) == pytest.approx(bound(1024))
    assert facts.cancellation_guard(0) == pytest.approx(bound(1))
    assert facts.cancellation_guard(10**8) == 0.5


def test_selection_follows_dtype_and_tuning(monkeypatch: pytest.MonkeyPatch) -> None:
    """TritonTuning(tensor_cores=False) or D < TC_MIN_D keeps the SIMT kernel; other dtypes and programs
    never take it.  The environment switches of earlier releases are not read any more."""
    launch = pytest.importorskip("kermac_backend_triton.launch")
    configs = pytest.importorskip("kermac_backend_triton.configs")
    tuning = pytest.importorskip("kermac_backend_triton.tuning")
    from kermac.problem import pairwise_problem

    def kernel(desc: kermac.KernelDescriptor, dtype: torch.dtype, d: int = configs.TC_MIN_D, **choices) -> str:
        x, z = torch.ones(4, d, dtype=dtype), torch.ones(5, d, dtype=dtype)
        problem = pairwise_problem(desc.lower(), x, z, out=None, hypers={}, offset_m=0, offset_n=0, debug=False)
        return launch.pairwise_spec(problem, tuning.TritonTuning(**choices))[0].kernel

    assert kernel(presets.l2_distance, torch.float32) == "tensor_cores"
    assert kernel(presets.l2_distance, torch.float16) == "tensor_cores"  # computed in float32
    assert kernel(presets.l2_distance, torch.float64) == "simt"
    assert kernel(presets.l1_distance, torch.float32) == "simt"  # the interpreter never takes Gluon
    assert kernel(presets.l2_distance, torch.float32, configs.TC_MIN_D - 1) == "simt"  # short D: SIMT
    assert kernel(presets.l2_distance, torch.float32, tensor_cores=False) == "simt"
    for variable in ("KERMAC_TRITON_TENSOR_CORES", "KERMAC_TRITON_GLUON", "KERMAC_TRITON_AUTOTUNE"):
        monkeypatch.setenv(variable, "0")
    assert kernel(presets.l2_distance, torch.float32) == "tensor_cores"


def test_tuning_is_validated_and_keys_the_backend() -> None:
    tuning = pytest.importorskip("kermac_backend_triton.tuning")
    backend_mod = pytest.importorskip("kermac_backend_triton.backend")
    assert tuning.TritonTuning() == tuning.DEFAULT_TUNING
    assert (tuning.DEFAULT_TUNING.autotune, tuning.DEFAULT_TUNING.tensor_cores, tuning.DEFAULT_TUNING.gluon) == (
        True,
        True,
        True,
    )
    with pytest.raises(TypeError, match="tensor_cores: expected a bool, got str 'false'"):
        tuning.TritonTuning(tensor_cores="false")
    with pytest.raises(TypeError, match="tuning: expected a TritonTuning, got dict"):
        backend_mod.TritonBackend(tuning={"gluon": False})
    off = tuning.TritonTuning(tensor_cores=False)
    assert backend_mod.TritonBackend(tuning=off).tuning is off
    assert backend_mod.TritonBackend().tuning == tuning.DEFAULT_TUNING


def test_auto_prefers_triton_where_its_tensor_core_kernel_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Preference 25 (above NVRTC's 20) for the tensor-core problems on a GPU; elsewhere the priority."""
    backend_mod = pytest.importorskip("kermac_backend_triton.backend")
    from kermac.problem import pairwise_problem, product_problem

    def problem(desc: kermac.KernelDescriptor, d: int = 64) -> object:
        x, z = torch.ones(4, d), torch.ones(5, d)
        return pairwise_problem(desc.lower(), x, z, out=None, hypers={}, offset_m=0, offset_n=0, debug=False)

    def product(desc: kermac.KernelDescriptor, d: int = 64, dtype: torch.dtype = torch.float32) -> object:
        x, v = torch.ones(4, d, dtype=dtype), torch.ones(4, 3, dtype=dtype)
        return product_problem(desc.lower(), x, x, v, out=None, hypers={})

    monkeypatch.setattr(backend_mod, "interpreting", lambda: False)
    backend = backend_mod.TritonBackend()
    assert backend.preference(problem(presets.l2_distance)) == backend_mod.TENSOR_CORE_PREFERENCE == 25
    assert backend.preference(problem(presets.laplace_l2)) == 25
    assert backend.preference(problem(presets.l1_distance)) == backend.priority
    # products whose K tiles come from the tensor-core kernel: float32 Σ(x − z)² programs with D ≥ 16
    assert backend.preference(product(presets.gaussian)) == 25
    # and float32 products of at most 32 features on SIMT K tiles (measured faster than NVRTC's)
    assert backend.preference(product(presets.gaussian, d=3)) == 25
    assert backend.preference(product(presets.laplace_l1, d=32)) == 25
    assert backend.preference(product(presets.laplace_l1, d=33)) == backend.priority
    assert backend.preference(product(presets.laplace_l1)) == backend.priority
    assert backend.preference(product(presets.gaussian, dtype=torch.float64)) == backend.priority
    assert backend.preference(product(presets.laplace_l1, d=3, dtype=torch.float64)) == backend.priority
    monkeypatch.setattr(backend_mod, "interpreting", lambda: True)  # the interpreter stays opt-in
    assert backend.preference(problem(presets.l2_distance)) == backend.priority
    assert backend.preference(product(presets.gaussian)) == backend.priority


def test_tensor_core_spaces_follow_d() -> None:
    """Short and long D take their own tile spaces; the autotuner's prune keeps exactly that space."""
    configs = pytest.importorskip("kermac_backend_triton.configs")
    pytest.importorskip("triton")
    short, long = configs.TC_SHORT_D - 1, configs.TC_SHORT_D
    assert configs.pairwise_tc_space(short) == configs.PAIRWISE_TC_SPACE_SHORT
    assert configs.pairwise_tc_space(long) == configs.PAIRWISE_TC_SPACE_LONG
    assert short.bit_length() < long.bit_length()  # the key buckets bit lengths: no key spans both spaces
    space = configs.pairwise_tc_configs()
    for d, want in ((short, configs.PAIRWISE_TC_SPACE_SHORT), (long, configs.PAIRWISE_TC_SPACE_LONG)):
        kept = configs.prune_pairwise_tc(space, {"D": d})
        assert [(c.kwargs, c.num_warps, c.num_stages, c.maxnreg) for c in kept] == list(want)
        assert configs.default_pairwise_tc(d) == configs.launch_options(want[0])


@pytest.mark.parametrize(("backend", "device"), TRITON_DEVICES)
@pytest.mark.parametrize("tensor_cores", [True, False])
@pytest.mark.parametrize("d", [70, 20])
def test_p2_paths_agree_and_recompute_near_duplicates(backend: str, device: str, tensor_cores: bool, d: int) -> None:
    """Both p = 2 paths against float64: random rows, near-duplicates (the guard's recompute), x = z, NaN.

    D = 70 and 20 take the two tile spaces of the tensor-core kernel; neither is a multiple of 16.
    """
    require_backend(backend, device)
    backend_mod = pytest.importorskip("kermac_backend_triton.backend")
    tuning = pytest.importorskip("kermac_backend_triton.tuning")
    launch = pytest.importorskip("kermac_backend_triton.launch")
    from kermac.problem import pairwise_problem

    g = torch.Generator().manual_seed(5)
    x = (torch.randn(37, d, generator=g) * 10).to(device)  # D ≥ TC_MIN_D
    near = x[:20] + 1e-4 * torch.randn(20, d, generator=g).to(device)
    z = torch.cat([near, torch.randn(13, d, generator=g).to(device)])
    z[3] = x[3]
    x[30, 7] = math.nan
    problem = pairwise_problem(presets.l2_distance.lower(), x, z, out=None, hypers={})
    triton_backend = backend_mod.TritonBackend(tuning=tuning.TritonTuning(tensor_cores=tensor_cores))
    expected = "tensor_cores" if tensor_cores else ("simt" if device == "cpu" else "gluon")
    assert launch.pairwise_spec(problem, triton_backend.tuning)[0].kernel == expected
    triton_backend.pairwise(problem)
    out = problem.out.cpu().double()
    ref = torch.cdist(x.cpu().double(), z.cpu().double(), compute_mode="donot_use_mm_for_euclid_dist")
    assert torch.isnan(out[30]).all() and not torch.isnan(out[:30]).any()
    assert out[3, 3] == 0.0
    keep = torch.ones(37, dtype=torch.bool)
    keep[30] = False
    rel = ((out[keep] - ref[keep]).abs() / ref[keep].clamp_min(1e-30)).nan_to_num(0.0)
    assert rel.max() < 1e-5


@pytest.mark.parametrize(("backend", "device"), TRITON_DEVICES)
def test_tensor_core_kernel_with_batches_views_and_tensor_hypers(backend: str, device: str) -> None:
    """The tensor-core kernel on broadcast batches, a transposed z, per-batch bandwidths, +λ on a shifted diagonal."""
    require_backend(backend, device)
    g = torch.Generator().manual_seed(11)
    x = torch.randn(2, 1, 19, 64, generator=g).to(device)
    z = torch.randn(3, 64, 21, generator=g).to(device).transpose(-1, -2)  # [3, 21, 64], k-stride 21
    sigma = torch.tensor([[9.0], [11.0], [13.0]]).to(device)[None, :, :].expand(2, 3, 1)[..., 0]  # [2, 3]
    out = kermac.run_kernel(
        "gaussian", x, z, bandwidth=sigma, regularization=0.5, offset_m=2, offset_n=0, backend=backend
    )
    d2 = torch.cdist(x.cpu().double(), z.cpu().double(), compute_mode="donot_use_mm_for_euclid_dist") ** 2
    ref = torch.exp(-d2 / (2 * sigma.cpu().double()[..., None, None] ** 2))
    ref += 0.5 * (torch.arange(19)[:, None] + 2 == torch.arange(21)[None, :]).double()
    torch.testing.assert_close(out.cpu().double(), ref, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize(("backend", "device"), TRITON_DEVICES)
@pytest.mark.parametrize("p", [1.0, 1.3])
def test_every_simt_configuration_and_prefetch_depth(
    backend: str, device: str, p: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each ``tl`` SIMT tile configuration against float64, for D below, at and past whole chunks.

    On a GPU: every entry of the autotuning space (each prefetch depth it uses), with the Gluon
    kernel switched off (``TritonTuning(gluon=False)``: the ``tl`` kernel is its fallback); under
    the interpreter: its small tile at every prefetch depth.  N = 45 and 48 take the scalar and
    the vector store (N is specialised on divisibility by 16).
    """
    require_backend(backend, device)
    configs = pytest.importorskip("kermac_backend_triton.configs")
    simt = pytest.importorskip("kermac_backend_triton.pairwise_simt")
    no_gluon = pytest.importorskip("kermac_backend_triton.tuning").TritonTuning(gluon=False)
    launch = pytest.importorskip("kermac_backend_triton.launch")
    from kermac.hyperparams import HyperValue
    from kermac.problem import pairwise_problem

    if launch.interpreting():
        metas = [dict(configs.INTERPRET_PAIRWISE, PF=pf) for pf in simt.PREFETCH_DEPTHS]
    else:
        metas = [configs.launch_options(entry) for entry in configs.PAIRWISE_SPACE]
        assert {m["PF"] for m in metas} <= set(simt.PREFETCH_DEPTHS)
    desc, hypers = (presets.l1_distance, {}) if p == 1.0 else (presets.lp_distance, {"p": HyperValue("p", p)})
    g = torch.Generator().manual_seed(17)
    for d in (3, 8, 24, 41):
        for n in (45, 48):
            x, z = torch.randn(37, d, generator=g), torch.randn(n, d, generator=g)
            ref = torch.cdist(x.double(), z.double(), p=p)
            out = torch.empty(37, n, device=device)
            problem = pairwise_problem(desc.lower(), x.to(device), z.to(device), out=out, hypers=hypers)
            for meta in metas:
                out.fill_(math.nan)
                launch.run_pairwise(problem, meta, tuning=no_gluon)
                torch.testing.assert_close(out.cpu().double(), ref, rtol=2e-6, atol=1e-6, msg=f"D={d} N={n} {meta}")


GLUON_CASES = [
    ("l1", presets.l1_distance, {}, lambda x, z: torch.cdist(x, z, p=1.0)),
    ("p1.3", presets.lp_distance, {"p": 1.3}, lambda x, z: torch.cdist(x, z, p=1.3)),
    ("linf", presets.linf_distance, {}, lambda x, z: torch.cdist(x, z, p=math.inf)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", GLUON_CASES, ids=[c[0] for c in GLUON_CASES])
def test_every_gluon_configuration(case: tuple) -> None:
    """Each Gluon SIMT configuration against float64 on a GPU: D below, at and past whole chunks,
    ragged M and N (N = 45: scalar stores, 48: vector stores), row-major and transposed operands
    (the kernel's two load layouts), a max reduction (L∞)."""
    require_backend("triton", "cuda")
    configs = pytest.importorskip("kermac_backend_triton.configs")
    launch = pytest.importorskip("kermac_backend_triton.launch")
    from kermac.hyperparams import HyperValue
    from kermac.problem import pairwise_problem

    _, desc, hyper_values, reference = case
    hypers = {k: HyperValue(k, v) for k, v in hyper_values.items()}
    g = torch.Generator().manual_seed(23)
    for d in (3, 8, 24, 41):
        for n in (45, 48):
            x, z = torch.randn(37, d, generator=g), torch.randn(n, d, generator=g)
            ref = reference(x.double(), z.double())
            out = torch.empty(37, n, device="cuda")
            for transposed in (False, True):
                xd, zd = x.cuda(), z.cuda()
                if transposed:
                    xd, zd = xd.t().contiguous().t(), zd.t().contiguous().t()
                problem = pairwise_problem(desc.lower(), xd, zd, out=out, hypers=hypers)
                assert launch.pairwise_spec(problem)[0].kernel == "gluon"
                for entry in configs.GLUON_PAIRWISE_SPACE:
                    meta = configs.launch_options(entry)
                    out.fill_(math.nan)
                    launch.run_pairwise(problem, meta)
                    msg = f"D={d} N={n} transposed={transposed} {meta}"
                    torch.testing.assert_close(out.cpu().double(), ref, rtol=2e-6, atol=1e-6, msg=msg)


ROW_MAJOR = {"SXK": 1, "SZK": 1, "SON": 1, "XT": 0, "ZT": 0, "FEW": 0}
TRANSPOSED = {"SXM": 1, "SZN": 1, "SON": 1, "XT": 1, "ZT": 1, "FEW": 0}


def gluon_jobs() -> dict[str, dict]:
    """What CI compiles: every preset (regularised: the diagonal path) in the default configuration, and again
    with fewer than 8 features (`FEW`); transposed operands (the row-wise load layouts), 64-bit indices and batches
    with a per-batch tensor hyperparameter, for sm_80 as well; every configuration of the space; a log-sum-exp
    program (its combine in the k loop), on sm_80 and sm_90."""
    configs = pytest.importorskip("kermac_backend_triton.configs")
    meta, warps, _, _ = configs.GLUON_PAIRWISE_SPACE[0]
    base = dict(regularized=False, spec={}, meta=meta, warps=warps, arch=90, constants=ROW_MAJOR)
    jobs = {f"preset-{name}": base | dict(preset=name, regularized=True) for name in sorted(presets.ALL)}
    few = ROW_MAJOR | {"FEW": 1}  # D < 8: the last chunk's missing features skipped by a branch
    jobs |= {f"preset-few-{name}": base | dict(preset=name, constants=few) for name in sorted(presets.ALL)}
    jobs["transposed-sm80"] = base | dict(preset="l1_distance", arch=80, constants=TRANSPOSED)
    jobs["int64-sm80"] = base | dict(preset="l1_distance", arch=80, spec={"int64": True})
    jobs["batched-tensor-hyper"] = base | dict(preset="lp_distance", spec={"nbatch": 2, "tensor_hypers": ["p"]})
    for arch in (80, 90):
        jobs[f"logsumexp-sm{arch}"] = base | dict(program=testing.SOFT_MIN.key(), arch=arch)
    for i, (meta_i, warps_i, _, _) in enumerate(configs.GLUON_PAIRWISE_SPACE):
        jobs[f"config-{i}"] = base | dict(preset="l1_distance", meta=meta_i, warps=warps_i)
    return {key: job | {"id": key} for key, job in jobs.items()}


@pytest.fixture(scope="module")
def gluon_reports() -> dict[str, str]:
    """``cuobjdump -res-usage`` of every job of :func:`gluon_jobs`, compiled in one clean process."""
    from pathlib import Path

    from cubin_jobs import compile_in_clean_process

    launch = pytest.importorskip("kermac_backend_triton.launch")
    if launch.gluon_available() is not None:
        pytest.skip(launch.gluon_available())
    return compile_in_clean_process(Path(__file__).with_name("gluon_compile.py"), list(gluon_jobs().values()))


@pytest.mark.parametrize("job", sorted(gluon_jobs()))
def test_gluon_source_compiles(job: str, gluon_reports: dict[str, str]) -> None:
    """Each CI variant of the Gluon kernel compiles to a cubin; the presets' default tile without
    spilling."""
    from cubin_jobs import assert_compiled

    assert_compiled(gluon_reports[job], spills=not job.startswith("preset-"))


def test_few_features_are_one_partial_chunk_and_a_bucket_of_their_own() -> None:
    """`FEW` (D < `GLUON_FEW_FEATURES`) assumes D is one partial chunk in every configuration, and the launch keys
    no `FEW` of its own: D's bit length in the autotuning bucket must change exactly at the threshold."""
    configs = pytest.importorskip("kermac_backend_triton.configs")
    few = configs.GLUON_FEW_FEATURES
    assert all(meta["BK"] >= few for meta, *_ in configs.GLUON_PAIRWISE_SPACE)
    assert all((configs.bucket(d) < configs.bucket(few)) == (d < few) for d in range(1, 4 * few))


def test_gluon_kernel_is_float32_only() -> None:
    with pytest.raises(ValueError, match="the Gluon kernel computes in float32; got compute='float64'"):
        pairwise(presets.l1_distance, compute="float64", kernel="gluon")
    with pytest.raises(ValueError, match="kernel: expected one of"):
        pairwise(presets.l1_distance, kernel="wgmma")


@pytest.mark.gpu
@pytest.mark.parametrize("gluon", [True, False], ids=["gluon", "tl"])
def test_outputs_past_two_to_the_31_elements(gluon: bool) -> None:
    """An output of more than 2³¹ elements takes 64-bit indexing: its last rows and columns are
    right (the Gluon kernel and the ``tl`` one; 8.6 GB of output)."""
    require_backend("triton", "cuda")
    launch = pytest.importorskip("kermac_backend_triton.launch")
    tuning = pytest.importorskip("kermac_backend_triton.tuning").TritonTuning(gluon=gluon)
    from kermac.problem import pairwise_problem

    m = n = 46400  # m·n > 2**31
    if torch.cuda.mem_get_info()[0] < 10 * 2**30:
        pytest.skip("needs 10 GiB of free GPU memory")
    g = torch.Generator().manual_seed(5)
    x, z = torch.randn(m, 5, generator=g), torch.randn(n, 5, generator=g)
    out = torch.full((m, n), math.nan, device="cuda")
    problem = pairwise_problem(presets.l1_distance.lower(), x.cuda(), z.cuda(), out=out, hypers={})
    spec = launch.pairwise_spec(problem, tuning)[0]
    assert spec.int64 and spec.kernel == ("gluon" if gluon else "simt")
    launch.run_pairwise(problem, tuning=tuning)
    for rows, cols in ((slice(m - 3, m), slice(None)), (slice(None), slice(n - 2, n))):
        ref = torch.cdist(x[rows].double(), z[cols].double(), p=1.0)
        torch.testing.assert_close(out[rows, cols].cpu().double(), ref, rtol=2e-6, atol=1e-6)
    del out
    torch.cuda.empty_cache()


@pytest.mark.parametrize("value", ["1", "true", "on", "0", "", "off", "2"])
def test_the_backend_reads_triton_interpret_as_triton_does(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The backend asks Triton whether it interprets: with TRITON_INTERPRET=2 Triton compiles for the GPU,
    so the backend must not take CPU tensors (it used to parse the variable itself and said yes)."""
    interpreter = pytest.importorskip("kermac_backend_triton.interpreter")
    knobs = pytest.importorskip("triton").knobs
    monkeypatch.setenv("TRITON_INTERPRET", value)
    assert interpreter.interpreting() == knobs.runtime.interpret == (value in ("1", "true", "on"))


@pytest.mark.parametrize(("backend", "device"), TRITON_DEVICES)
@pytest.mark.parametrize("reduction", ["sum", "min"])
def test_an_epilogue_of_the_diagonal_alone_computes_in_float64(backend: str, device: str, reduction: str) -> None:
    """`exp(diag)` in a float64 program is e to float64 precision on the diagonal (the diagonal
    indicator is in the compute type, not a float32 constant)."""
    require_backend(backend, device)
    x = torch.randn(5, 3, dtype=torch.float64, device=device)
    program = PairwiseProgram(abs(ir.Var("x") - ir.Var("z")), reduction, ir.exp(ir.Var("diag")))
    got = kermac.run_program(program, x, x, backend=backend).cpu()
    expected = torch.ones(5, 5, dtype=torch.float64).fill_diagonal_(math.e)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("kernel", ["simt", "gluon"])
def test_the_reduction_is_the_registrys_combine(kernel: str) -> None:
    """The generated module holds the reduction's rule of `kermac.reductions`: `combine` rendered from its IR
    (log-sum-exp's logaddexp; the sum's `acc + t`) and, for the `tl` kernels, `combine_chunk`, which reduces a
    chunk of terms by `tl.reduce` with that combine (by `tl.sum` for the sum); the tile reads no reduction by
    name but for its identity."""
    lse = pairwise(presets.l1_distance, program=testing.SOFT_MIN, kernel=kernel)
    combine = function(lse, "combine")
    assert "tl.where((acc == t).to(tl.float32) != 0, (acc + " in combine and "tl.log(" in combine
    entry = function(lse, generated.PAIRWISE_ENTRY)
    if kernel == "gluon":
        assert "combine_chunk" not in lse and "inner, epilogue,\n        combine, 'logsumexp', False" in entry
        return
    assert "return combine(acc, tl.reduce(t, 0, combine))" in function(lse, "combine_chunk")
    assert "inner, epilogue,\n        combine_chunk, 'logsumexp', False" in entry
    sums = pairwise(presets.l1_distance)
    assert "return (acc + t)" in function(sums, "combine")
    assert "return combine(acc, tl.sum(t, 0))" in function(sums, "combine_chunk")


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_a_power_of_a_logsumexp_of_nonnegative_terms_keeps_negative_bases(backend: str) -> None:
    """Non-negative terms do not make a log-sum-exp non-negative (its identity is −∞; `nonnegative` of
    `kermac.reductions`): the epilogue's `acc³` keeps the negative-base cases, −∞ with no feature."""
    require_backend(backend, "cpu")
    program = PairwiseProgram(abs(ir.Var("x") - ir.Var("z")), "logsumexp", ir.pow(ir.Var("acc"), 3.0))
    assert "pow_ieee(acc, " in function(pairwise(presets.l1_distance, program=program), "epilogue")
    for d in (0, 2):
        x, z = torch.randn(3, d, dtype=torch.float64), torch.randn(4, d, dtype=torch.float64)
        got = kermac.run_program(program, x, z, backend=backend)
        expected = torch.logsumexp((x[:, None, :] - z[None, :, :]).abs(), dim=-1) ** 3
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=0)
