"""The Triton backend's code generation: generated source per descriptor, and the IEEE special
cases of its generated helpers (pow, sign, NaN-propagating min/max) against torch.

Source checks need only triton's package to be importable for nothing: they inspect text.
Value checks run wherever the backend can (a GPU, or the CPU with TRITON_INTERPRET=1).
"""

from __future__ import annotations

import ast
import math

import pytest
import torch
from helpers import BACKEND_DEVICES, require_backend

import kermac
from kermac import ir, presets
from kermac.programs import GradProgram, PairwiseProgram

codegen = pytest.importorskip("kermac_backend_triton.codegen")
kernels = pytest.importorskip("kermac_backend_triton.kernels")

TRITON_DEVICES = [p for p in BACKEND_DEVICES if p.values[0] == "triton"]


def pairwise(desc: kermac.KernelDescriptor, **changes: object) -> str:
    spec = dict(program=desc.lower(), compute="float32", nbatch=0, tensor_hypers=frozenset())
    spec.update(int64=False, interpret=False)
    spec.update(changes)
    return kernels.pairwise_source(kernels.PairwiseSpec(**spec))


def grad_program(p: float) -> GradProgram:
    t = ir.Var("d") - ir.Var("b")
    if p == 1.0:
        return GradProgram(ir.sign(t), ir.Var("acc"))
    general = ir.sign(t) * ir.pow(abs(t), ir.Hyper("p") - 1.0)
    return GradProgram(ir.select(ir.ne(t, 0.0), general, 0.0), ir.Var("acc"))


def kernel_body(source: str, name: str) -> str:
    """The text of function ``name`` in ``source`` (which must parse as Python)."""
    tree = ast.parse(source)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    return ast.get_source_segment(source, fn)


@pytest.mark.parametrize("name", sorted(presets.ALL))
@pytest.mark.parametrize("regularized", [False, True])
def test_every_preset_generates_valid_source(name: str, regularized: bool) -> None:
    desc = presets.ALL[name]
    program = desc.lower(regularized=regularized)
    body = kernel_body(pairwise(desc, program=program), kernels.PAIRWISE_ENTRY)
    # The reduction and its identity.
    combines = {"sum": "tl.sum(t, 0)", "max": "tl.reduce(t, 0, _kmax)", "min": "tl.reduce(t, 0, _kmin)"}
    combine = combines[program.reduction]
    # the unmasked steps (one loop per prefetch depth) and the masked tail
    assert body.count(combine) == len(kernels.PREFETCH_DEPTHS) + 1
    # The diagonal is computed exactly when the epilogue reads it.
    assert ("diag = tl.where(om4 + OFF_M == on4 + OFF_N" in body) == regularized
    # Every hyperparameter is a typed scalar argument, cast to the compute type on entry.
    for h in program.hypers:
        assert f"h_{h}: tl.float32" in body and f"h_{h} = tl.full([], h_{h}, tl.float32)" in body
    # Inner expressions use the special-function unit's log2; epilogues the accurate one.
    if desc.power == "pow":
        assert "_kpow_nn_fast(tl.abs((xv - zv)), h_p)" in body
    if desc.outer == "root":
        assert "_kpow_nn(acc, (tl.full([], 1.0, tl.float32) / h_p))" in body
    assert "_kpow(" not in body  # every built-in base is provably non-negative


def test_specialisations_fall_out_of_the_ir() -> None:
    l1 = kernel_body(pairwise(presets.l1_distance), kernels.PAIRWISE_ENTRY)
    l2 = kernel_body(pairwise(presets.l2_distance), kernels.PAIRWISE_ENTRY)
    assert "tl.broadcast_to(tl.abs((xv - zv))," in l1 and "pow" not in l1
    assert "tl.broadcast_to(((xv - zv) * (xv - zv))," in l2 and "tl.sqrt_rn(acc)" in l2
    dot = kernel_body(pairwise(presets.dot_product), kernels.PAIRWISE_ENTRY)
    assert "tl.broadcast_to((xv * zv)," in dot


def test_layout_specialisations() -> None:
    src = pairwise(presets.laplace_lp, nbatch=2, tensor_hypers=frozenset({"bandwidth"}), int64=True)
    body = kernel_body(src, kernels.PAIRWISE_ENTRY)
    assert "pid = tl.program_id(0).to(tl.int64)" in body
    assert "b1 = rest % BS1" in body and "X += b0 * SB_x_0 + b1 * SB_x_1" in body
    assert "H_bandwidth += b0 * SB_hyper_bandwidth_0 + b1 * SB_hyper_bandwidth_1" in body
    assert "h_bandwidth = tl.load(H_bandwidth).to(tl.float32)" in body
    assert "h_p: tl.float32" in body  # p stays a scalar argument
    plain = kernel_body(pairwise(presets.laplace_lp), kernels.PAIRWISE_ENTRY)
    assert "int64" not in plain and "BS0" not in plain


def test_float64_and_interpreter_helpers() -> None:
    f64 = pairwise(presets.lp_distance, compute="float64")
    assert "h_p: tl.float64" in f64 and "lg2.approx.ftz.f32 $0" not in f64 and "libdevice" not in f64
    gpu = pairwise(presets.lp_distance)
    assert "lg2.approx.ftz.f32 $0" in gpu and "libdevice.exp2(a)" in gpu
    interp = pairwise(presets.lp_distance, interpret=True)
    assert "lg2.approx.ftz.f32 $0" not in interp and "return tl.log2(tl.abs(a))" in interp


@pytest.mark.parametrize("p", [1.0, 1.5])
def test_grad_source(p: float) -> None:
    spec = kernels.GradSpec(grad_program(p), "float32", 1, frozenset(), False, False)
    body = kernel_body(kernels.grad_source(spec), kernels.GRAD_ENTRY)
    # 3×TF32 by hand into a fresh accumulator per k step, in the full steps and the masked tail.
    # p = 1.5: the full steps twice (select-free loop for p − 1 in (0, ∞), general loop otherwise).
    loops = 2 if p == 1.0 else 3
    assert body.count('input_precision="tf32", out_dtype=tl.float32)') == 3 * loops
    assert body.count("acc += part") == loops and body.count("wh, wl = _ksplit(w)") == loops and "tf32x3" not in body
    # The split is one asm block on a GPU (no integer negation of hi), integer operations when interpreted.
    assert "sub.f32 $1, $2, $0" in kernels.grad_source(spec)
    interp = kernels.grad_source(kernels.GradSpec(grad_program(p), "float32", 1, frozenset(), False, True))
    assert "inline_asm" not in interp.split("def _ksplit")[1].split("@triton.jit")[0]
    f64 = kernel_body(
        kernels.grad_source(kernels.GradSpec(grad_program(p), "float64", 1, frozenset(), False, False)),
        kernels.GRAD_ENTRY,
    )
    assert (
        f64.count('tl.dot(w, cv, acc, input_precision="ieee", out_dtype=tl.float64)') == loops and "_ktf32" not in f64
    )
    if p == 1.0:
        assert "_ksign((dv - bv))" in body and "pow" not in body
    else:
        # sgn(t)·|t|^(p−1): one copysigned power where p − 1 is in (0, ∞), its exponent as a tile.
        assert "if (sp_e < _INF) & (sp_e > 0):" in body and "sp_e = (h_p - tl.full([], 1.0, tl.float32))" in body
        assert body.count("_ksignpow_pos((dv - bv), sp_et)") == 1
        general = "_kpow_nn_fast(tl.abs((dv - bv)), (h_p - tl.full([], 1.0, tl.float32)))"
        assert body.count(general) == 2  # general loop and tail


def test_grad_signed_power_needs_a_scalar_exponent() -> None:
    t = ir.Var("d") - ir.Var("b")
    prog = GradProgram(ir.select(ir.ne(t, 0.0), ir.sign(t) * ir.pow(abs(t), ir.Var("d")), 0.0), ir.Var("acc"))
    body = kernel_body(
        kernels.grad_source(kernels.GradSpec(prog, "float32", 0, frozenset(), False, False)), "kermac_grad"
    )
    assert "_ksignpow_pos" not in body and body.count("acc += part") == 2


def test_op_table_covers_the_ir() -> None:
    for compute in codegen.COMPUTE_TYPES:
        assert set(codegen.op_table(compute)) == set(ir.OPS)
    with pytest.raises(ValueError, match="compute"):
        codegen.op_table("float16")


def test_constants_and_nonnegativity() -> None:
    x, z = ir.Var("x"), ir.Var("z")
    e = ir.minimum(x, -1.5) + ir.maximum(z, math.inf) * math.nan - (-0.0)
    text = codegen.render_expr(e, {"x": "X", "z": "Z"}, "float32")
    one = "tl.full([], {}, tl.float32)".format
    minus_zero = "tl.full([], 0x80000000, tl.uint32).to(tl.float32, bitcast=True)"
    expected = f"((_kmin(X, {one(-1.5)}) + (_kmax(Z, {one('_INF')}) * ({one('_INF')} * 0.0))) - {minus_zero})"
    assert text == expected
    nn = codegen.nonnegative
    assert nn(abs(x - z)) and nn((x - z) * (x - z)) and nn(ir.exp(x)) and nn(ir.Var("acc"), frozenset({"acc"}))
    assert not nn(x - z) and not nn(ir.Hyper("p")) and not nn(ir.Const(-0.0)) and not nn(ir.sqrt(x))
    assert nn(ir.maximum(x, 0.0)) and not nn(ir.minimum(x, 0.0))
    with pytest.raises(KeyError, match="variable 'q'"):
        codegen.render_expr(ir.Var("q"), {"x": "X"}, "float32")


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
    assert kernels.tensor_core_eligible(program, "float32")
    assert not kernels.tensor_core_eligible(program, "float64")
    body = kernel_body(pairwise(presets.ALL[name], program=program, tensor_cores=True), kernels.PAIRWISE_ENTRY)
    # 3×TF32: hi·lo + lo·hi + hi·hi, each operand split once per k step.
    for a, b in (("xh", "zl"), ("xl", "zh"), ("xh", "zh")):
        assert f'dot = tl.dot({a}, {b}, dot, input_precision="tf32", out_dtype=tl.float32)' in body
    assert "xh = _ktf32(xv)" in body and "zl = _ktf32(zt - zh)" in body
    assert "xsq += xv * xv" in body and "zsq += zv * zv" in body
    assert "flag = ~((d2 > GUARD * s) & (d2 < _INF))" in body
    # Flagged tiles are recomputed from differences and stored by the SIMT tile in the branch.
    assert "if tl.max(tl.max(flag.to(tl.int32), 1), 0) > 0:" in body and "racc = racc + tl.sum(rt, 0)" in body
    assert body.count("tl.store(") == 2
    assert "diag = tl.where(om2 + OFF_M == on2 + OFF_N" in body and "rdiag = tl.where(rom4 + OFF_M" in body
    assert "_kpow(" not in body  # acc is known non-negative in the epilogue


@pytest.mark.parametrize("name", ["l1_distance", "lp_distance", "dot_product", "linf_distance", "laplace_l1"])
def test_other_programs_keep_the_simt_kernel(name: str) -> None:
    program = presets.ALL[name].lower()
    assert not kernels.tensor_core_eligible(program, "float32")
    with pytest.raises(ValueError, match="tensor_cores: needs a float32 sum"):
        pairwise(presets.ALL[name], tensor_cores=True)
    with pytest.raises(ValueError, match="tensor_cores: needs a float32 sum"):
        pairwise(presets.l2_distance, compute="float64", tensor_cores=True)


def test_guard_threshold_follows_the_error_bound() -> None:
    def bound(d: int) -> float:
        return (math.sqrt(d) * 2.0**-24 + 3 * 2.0**-23) * 2.0**16

    assert kernels.guard_threshold(256) == pytest.approx(bound(256)) and 0.08 < kernels.guard_threshold(256) < 0.09
    assert kernels.guard_threshold(1024) == pytest.approx(bound(1024))
    assert kernels.guard_threshold(0) == pytest.approx(bound(1))
    assert kernels.guard_threshold(10**8) == 0.5


def test_selection_follows_dtype_and_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """KERMAC_TRITON_TENSOR_CORES=0 or D < TC_MIN_D keeps the SIMT kernel; other dtypes and programs never take it."""
    launch = pytest.importorskip("kermac_backend_triton.launch")
    configs = pytest.importorskip("kermac_backend_triton.configs")
    from kermac.problem import pairwise_problem

    def spec(desc: kermac.KernelDescriptor, dtype: torch.dtype, d: int = configs.TC_MIN_D) -> object:
        x, z = torch.ones(4, d, dtype=dtype), torch.ones(5, d, dtype=dtype)
        problem = pairwise_problem(desc.lower(), x, z, out=None, hypers={}, offset_m=0, offset_n=0, debug=False)
        return launch.pairwise_spec(problem)[0]

    monkeypatch.delenv("KERMAC_TRITON_TENSOR_CORES", raising=False)
    assert spec(presets.l2_distance, torch.float32).tensor_cores
    assert spec(presets.l2_distance, torch.float16).tensor_cores  # computed in float32
    assert not spec(presets.l2_distance, torch.float64).tensor_cores
    assert not spec(presets.l1_distance, torch.float32).tensor_cores
    assert not spec(presets.l2_distance, torch.float32, configs.TC_MIN_D - 1).tensor_cores  # short D: SIMT
    monkeypatch.setenv("KERMAC_TRITON_TENSOR_CORES", "0")
    assert not spec(presets.l2_distance, torch.float32).tensor_cores


def test_auto_prefers_triton_where_its_tensor_core_kernel_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Preference 25 (above NVRTC's 20) for the tensor-core problems on a GPU; elsewhere the priority."""
    backend_mod = pytest.importorskip("kermac_backend_triton.backend")
    from kermac.problem import pairwise_problem

    def problem(desc: kermac.KernelDescriptor, d: int = 64) -> object:
        x, z = torch.ones(4, d), torch.ones(5, d)
        return pairwise_problem(desc.lower(), x, z, out=None, hypers={}, offset_m=0, offset_n=0, debug=False)

    monkeypatch.delenv("KERMAC_TRITON_TENSOR_CORES", raising=False)
    monkeypatch.setattr(backend_mod, "interpreting", lambda: False)
    backend = backend_mod.TritonBackend()
    assert backend.preference(problem(presets.l2_distance)) == backend_mod.TENSOR_CORE_PREFERENCE == 25
    assert backend.preference(problem(presets.laplace_l2)) == 25
    assert backend.preference(problem(presets.l1_distance)) == backend.priority
    monkeypatch.setattr(backend_mod, "interpreting", lambda: True)  # the interpreter stays opt-in
    assert backend.preference(problem(presets.l2_distance)) == backend.priority


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
@pytest.mark.parametrize("tensor_cores", ["1", "0"])
@pytest.mark.parametrize("d", [70, 20])
def test_p2_paths_agree_and_recompute_near_duplicates(
    backend: str, device: str, tensor_cores: str, d: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both p = 2 paths against float64: random rows, near-duplicates (the guard's recompute), x = z, NaN.

    D = 70 and 20 take the two tile spaces of the tensor-core kernel; neither is a multiple of 16.
    """
    require_backend(backend, device)
    monkeypatch.setenv("KERMAC_TRITON_TENSOR_CORES", tensor_cores)
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(37, d, generator=g) * 10).to(device)  # D ≥ TC_MIN_D
    near = x[:20] + 1e-4 * torch.randn(20, d, generator=g).to(device)
    z = torch.cat([near, torch.randn(13, d, generator=g).to(device)])
    z[3] = x[3]
    x[30, 7] = math.nan
    out = kermac.cdist(x, z, p=2.0, backend=backend).cpu().double()
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
    kernel switched off (``KERMAC_TRITON_GLUON=0``: the ``tl`` kernel is its fallback); under
    the interpreter: its small tile at every prefetch depth.  N = 45 and 48 take the scalar and
    the vector store (N is specialised on divisibility by 16).
    """
    require_backend(backend, device)
    monkeypatch.setenv("KERMAC_TRITON_GLUON", "0")
    configs = pytest.importorskip("kermac_backend_triton.configs")
    launch = pytest.importorskip("kermac_backend_triton.launch")
    from kermac.hyperparams import HyperValue
    from kermac.problem import pairwise_problem

    if launch.interpreting():
        metas = [dict(configs.INTERPRET_PAIRWISE, PF=pf) for pf in kernels.PREFETCH_DEPTHS]
    else:
        metas = [configs.launch_options(entry) for entry in configs.PAIRWISE_SPACE]
        assert {m["PF"] for m in metas} <= set(kernels.PREFETCH_DEPTHS)
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
                launch.run_pairwise(problem, meta)
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
                assert launch.pairwise_spec(problem)[0].gluon
                for entry in configs.GLUON_PAIRWISE_SPACE:
                    meta = configs.launch_options(entry)
                    out.fill_(math.nan)
                    launch.run_pairwise(problem, meta)
                    msg = f"D={d} N={n} transposed={transposed} {meta}"
                    torch.testing.assert_close(out.cpu().double(), ref, rtol=2e-6, atol=1e-6, msg=msg)


ROW_MAJOR = {"SXK": 1, "SZK": 1, "SON": 1, "XT": 0, "ZT": 0}
TRANSPOSED = {"SXM": 1, "SZN": 1, "SON": 1, "XT": 1, "ZT": 1}


def gluon_jobs() -> dict[str, dict]:
    """What CI compiles: every preset (regularised: the diagonal path) in the default
    configuration; transposed operands (the row-wise load layouts), 64-bit indices and batches with
    a per-batch tensor hyperparameter, for sm_80 as well; every configuration of the space."""
    configs = pytest.importorskip("kermac_backend_triton.configs")
    meta, warps, _, _ = configs.GLUON_PAIRWISE_SPACE[0]
    base = dict(regularized=False, spec={}, meta=meta, warps=warps, arch=90, constants=ROW_MAJOR)
    jobs = {f"preset-{name}": base | dict(preset=name, regularized=True) for name in sorted(presets.ALL)}
    jobs["transposed-sm80"] = base | dict(preset="l1_distance", arch=80, constants=TRANSPOSED)
    jobs["int64-sm80"] = base | dict(preset="l1_distance", arch=80, spec={"int64": True})
    jobs["batched-tensor-hyper"] = base | dict(preset="lp_distance", spec={"nbatch": 2, "tensor_hypers": ["p"]})
    for i, (meta_i, warps_i, _, _) in enumerate(configs.GLUON_PAIRWISE_SPACE):
        jobs[f"config-{i}"] = base | dict(preset="l1_distance", meta=meta_i, warps=warps_i)
    return {key: job | {"id": key} for key, job in jobs.items()}


@pytest.fixture(scope="module")
def gluon_reports() -> dict[str, str]:
    """``cuobjdump -res-usage`` of every job of :func:`gluon_jobs`, compiled in one clean process."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    gluon = pytest.importorskip("kermac_backend_triton.gluon_pairwise")
    if gluon.gluon_available() is not None:
        pytest.skip(gluon.gluon_available())
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("gluon_compile.py")
    jobs = json.dumps(list(gluon_jobs().values()))
    done = subprocess.run([sys.executable, str(script)], input=jobs, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout)


@pytest.mark.parametrize("job", sorted(gluon_jobs()))
def test_gluon_source_compiles(job: str, gluon_reports: dict[str, str]) -> None:
    """Each CI variant of the Gluon kernel compiles to a cubin; the presets' default tile without
    spilling."""
    report = gluon_reports[job]
    assert "REG:" in report, report
    if job.startswith("preset-"):
        assert "STACK:0" in report and "LOCAL:0" in report, report


def test_gluon_kernel_is_float32_gpu_simt_only() -> None:
    gluon = pytest.importorskip("kermac_backend_triton.gluon_pairwise")
    for changes in ({"compute": "float64"}, {"interpret": True}):
        spec = kernels.PairwiseSpec(
            **(
                dict(program=presets.l1_distance.lower(), compute="float32", nbatch=0, tensor_hypers=frozenset())
                | dict(int64=False, interpret=False, gluon=True)
                | changes
            )
        )
        with pytest.raises(ValueError, match="Gluon kernel is the GPU SIMT kernel in float32"):
            gluon.gluon_pairwise_source(spec)


@pytest.mark.gpu
@pytest.mark.parametrize("gluon", [True, False], ids=["gluon", "tl"])
def test_outputs_past_two_to_the_31_elements(gluon: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """An output of more than 2³¹ elements takes 64-bit indexing: its last rows and columns are
    right (the Gluon kernel and the ``tl`` one; 8.6 GB of output)."""
    require_backend("triton", "cuda")
    monkeypatch.setenv("KERMAC_TRITON_GLUON", "1" if gluon else "0")
    launch = pytest.importorskip("kermac_backend_triton.launch")
    from kermac.problem import pairwise_problem

    m = n = 46400  # m·n > 2**31
    if torch.cuda.mem_get_info()[0] < 10 * 2**30:
        pytest.skip("needs 10 GiB of free GPU memory")
    g = torch.Generator().manual_seed(5)
    x, z = torch.randn(m, 5, generator=g), torch.randn(n, 5, generator=g)
    out = torch.full((m, n), math.nan, device="cuda")
    problem = pairwise_problem(presets.l1_distance.lower(), x.cuda(), z.cuda(), out=out, hypers={})
    spec = launch.pairwise_spec(problem)[0]
    assert spec.int64 and spec.gluon == gluon
    kermac.cdist(x.cuda(), z.cuda(), p=1.0, out=out, backend="triton")
    for rows, cols in ((slice(m - 3, m), slice(None)), (slice(None), slice(n - 2, n))):
        ref = torch.cdist(x[rows].double(), z[cols].double(), p=1.0)
        torch.testing.assert_close(out[rows, cols].cpu().double(), ref, rtol=2e-6, atol=1e-6)
    del out
    torch.cuda.empty_cache()
