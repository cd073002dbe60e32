"""Autograd of any pairwise program (kermac.autograd's symbolic route, kermac.pairwise_gradients): random
programs over every operation kermac.ir_diff differentiates, by gradcheck in float64 (reference backend and the
Triton interpreter) and against torch's autograd of the same program evaluated with torch operations
(kermac.ir_eval, the IR's semantics); hyperparameter batches, size-0/1 dimensions, the documented rules at
special points, the refusals, and the generated contraction programs compiled by NVRTC."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from helpers import require_backend, require_nvrtc_compiler

import kermac
from kermac import ir
from kermac.autograd import inner_power
from kermac.hyperparams import HyperValue
from kermac.ir_eval import evaluate
from kermac.pairwise_gradients import contraction_program
from kermac.problem import grad_problem

X, Z, ACC, DIAG = ir.Var("x"), ir.Var("z"), ir.Var("acc"), ir.Var("diag")
H = ir.Hyper("h")


def _expr(rng: random.Random, leaves: tuple[ir.Expr, ...], depth: int) -> ir.Expr:
    """A random expression over `leaves`, smooth almost everywhere on random inputs: every operation kermac.ir_diff
    has a rule for, with the arguments of sqrt, log, pow and div kept in their domain."""
    if depth == 0 or rng.random() < 0.2:
        return rng.choice(leaves) if rng.random() < 0.8 else ir.Const(rng.choice((0.5, -1.5, 2.0, 3.0)))
    a = _expr(rng, leaves, depth - 1)
    b = _expr(rng, leaves, depth - 1)
    positive = 1.0 + a * a
    forms = [
        lambda: a + b,
        lambda: a - b,
        lambda: a * b,
        lambda: a / (1.0 + b * b),
        lambda: -a,
        lambda: abs(a) * b,
        lambda: ir.sqrt(positive),
        lambda: ir.exp(a / positive),
        lambda: ir.log(positive),
        lambda: ir.pow(positive, rng.choice((ir.Const(0.5), ir.Const(-1.5), ir.Const(3.0), H))),
        lambda: ir.minimum(a, b),
        lambda: ir.maximum(a, b),
        lambda: ir.sign(a) * b,
        lambda: ir.select(rng.choice((ir.lt, ir.le, ir.gt, ir.ge))(a, b), a, b * b),
        lambda: ir.select(ir.ne(a, b), a, b) + ir.eq(a, b),
    ]
    return rng.choice(forms)()


def random_program(seed: int, reduction: str | None = None) -> kermac.PairwiseProgram:
    """A seeded random program reading both points, the hyperparameter `h` somewhere, and `diag` or not."""
    rng = random.Random(seed)
    inner = _expr(rng, (X, Z, X, Z, H), 3)
    while not {"x", "z"} <= ir.free_vars(inner):
        inner = inner * _expr(rng, (X, Z), 2) + rng.choice((X, Z))
    epilogue = _expr(rng, (ACC, ACC, H), 2)
    if "acc" not in ir.free_vars(epilogue):
        epilogue = epilogue + ACC
    if rng.random() < 0.3:
        epilogue = epilogue + 0.5 * DIAG * ACC
    return kermac.PairwiseProgram(inner, reduction or rng.choice(("sum", "sum", "max", "min")), epilogue)


def is_symbolic(program: kermac.PairwiseProgram) -> bool:
    """Whether autograd takes the symbolic route (not one of the recognised |x − z|^P or x·z shapes)."""
    return inner_power(program) is None


def formula(program: kermac.PairwiseProgram, x: torch.Tensor, z: torch.Tensor, h, offset: int = 0) -> torch.Tensor:
    """The program evaluated with torch operations (the IR's semantics), differentiable by torch's autograd."""
    hb = h[..., None, None, None] if isinstance(h, torch.Tensor) else h
    tau = evaluate(program.inner, {"x": x[..., :, None, :], "z": z[..., None, :, :], "h": hb}, like=x)
    tau = tau.expand(torch.broadcast_shapes(tau.shape, x[..., :, None, :].shape, z[..., None, :, :].shape))
    acc = {"sum": torch.sum, "max": torch.amax, "min": torch.amin}[program.reduction](tau, dim=-1)
    m, n = acc.shape[-2:]
    diag = (torch.arange(m)[:, None] + offset == torch.arange(n)[None, :]).to(x.dtype)
    he = h[..., None, None] if isinstance(h, torch.Tensor) else h
    return evaluate(program.epilogue, {"acc": acc, "diag": diag, "h": he}, like=x).expand(acc.shape)


def run(program: kermac.PairwiseProgram, x, z, h=0.7, backend: str = "torch", **kwargs) -> torch.Tensor:
    """`kermac.run_program` with the hyperparameter `h` where the program reads it."""
    hypers = {"h": h} if "h" in program.hypers else None
    return kermac.run_program(program, x, z, hypers=hypers, backend=backend, **kwargs)


def _points(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=torch.float64).requires_grad_()


SEEDS = range(40)


def test_random_programs_take_the_symbolic_route():
    programs = [random_program(seed) for seed in SEEDS]
    assert sum(is_symbolic(p) for p in programs) == len(programs)
    assert {p.reduction for p in programs} == {"sum", "max", "min"}
    assert sum(bool(p.hypers) for p in programs) > len(programs) // 2


@pytest.mark.parametrize("seed", SEEDS)
def test_random_programs_match_torch_autograd_and_gradcheck(seed):
    """Reference backend, float64: the gradients agree with torch's autograd of the program's formula, and
    gradcheck (central differences of kermac's own forward) passes."""
    program = random_program(seed)
    gen = torch.Generator().manual_seed(seed)
    x, z = _points(gen, 3, 4, 3), _points(gen, 5, 3)  # a batch that z broadcasts over
    h = 0.7

    def forward(a, b):
        return run(program, a, b, h)

    out = forward(x, z)
    expected_out = formula(program, x, z, h)
    torch.testing.assert_close(out, expected_out, equal_nan=True)
    g = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    got = torch.autograd.grad(out, (x, z), g)
    expected = torch.autograd.grad(expected_out, (x, z), g)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, equal_nan=True)
    if out.isfinite().all():
        assert torch.autograd.gradcheck(forward, (x[:1, :3], z[:4]))


@pytest.mark.parametrize(("seed", "reduction"), [*((seed, "sum") for seed in range(6)), (6, "max"), (7, "min")])
def test_random_programs_gradcheck_on_triton(seed, reduction):
    """The Triton backend runs the generated contraction programs of sums (the interpreter on the CPU), and the
    pass for `acc` of every program."""
    require_backend("triton", "cpu", "grad")
    program = random_program(seed, reduction)
    gen = torch.Generator().manual_seed(seed)
    x, z = _points(gen, 3, 2), _points(gen, 4, 2)

    def forward(a, b):
        return run(program, a, b, backend="triton")

    g = torch.randn(3, 4, generator=gen, dtype=torch.float64)
    got = torch.autograd.grad(forward(x, z), (x, z), g)
    expected = torch.autograd.grad(formula(program, x, z, 0.7), (x, z), g)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, equal_nan=True)
    assert torch.autograd.gradcheck(forward, (x, z))


@pytest.mark.parametrize("reduction", ["sum", "max"])
def test_sum_runs_the_fused_contraction_and_extremes_do_not(monkeypatch, reduction):
    """A sum's gradient is one gradient contraction (kermac::grad) per input, with the generated program."""
    program = random_program(3, reduction=reduction)
    seen = []
    original = kermac.ops.grad

    def spy(key, *args, **kwargs):
        seen.append(key)
        return original(key, *args, **kwargs)

    monkeypatch.setattr(kermac.ops, "grad", spy)
    x, z = torch.randn(4, 2, dtype=torch.float64, requires_grad=True), torch.randn(3, 2, dtype=torch.float64)
    z.requires_grad_()
    torch.autograd.grad(run(program, x, z).sum(), (x, z))
    if reduction == "sum":
        assert seen == [contraction_program(program, "x").key(), contraction_program(program, "z").key()]
    else:
        assert seen == []


@pytest.mark.parametrize(
    ("backend", "reduction"), [("torch", "sum"), ("torch", "max"), ("torch", "min"), ("triton", "sum")]
)
def test_batched_hyperparameters_and_diagonal_offsets(backend, reduction):
    """A per-batch tensor hyperparameter, read by the inner term (so by the contraction) and the epilogue, and a
    shifted diagonal."""
    require_backend(backend, "cpu", "grad")
    for seed in (1, 5, 8):
        program = random_program(seed, reduction)
        program = kermac.PairwiseProgram(program.inner + H * X * Z, reduction, program.epilogue + H * DIAG * ACC)
        gen = torch.Generator().manual_seed(seed)
        x, z = _points(gen, 2, 4, 3), _points(gen, 2, 5, 3)
        h = torch.tensor([0.6, 1.3], dtype=torch.float64)
        out = run(program, x, z, h, backend=backend, offset_n=1)
        expected_out = formula(program, x, z, h, offset=-1)
        torch.testing.assert_close(out, expected_out)
        g = torch.randn(out.shape, generator=gen, dtype=torch.float64)
        got = torch.autograd.grad(out, (x, z), g)
        expected = torch.autograd.grad(expected_out, (x, z), g)
        for a, b in zip(got, expected, strict=True):
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("reduction", ["sum", "max"])
@pytest.mark.parametrize(("m", "n", "d"), [(0, 3, 2), (3, 0, 2), (3, 2, 0), (1, 1, 1), (1, 3, 2)])
def test_empty_and_single_dimensions(m, n, d, reduction):
    program = random_program(2, reduction)
    x = torch.randn(m, d, dtype=torch.float64, requires_grad=True)
    z = torch.randn(n, d, dtype=torch.float64, requires_grad=True)
    out = run(program, x, z)
    g = torch.randn_like(out)
    gx, gz = torch.autograd.grad(out, (x, z), g)
    assert gx.shape == x.shape and gz.shape == z.shape
    if d == 0:  # acc is the reduction's identity, which depends on no point
        assert not gx.any() and not gz.any()
    else:
        ex, ez = torch.autograd.grad(formula(program, x, z, 0.7), (x, z), g, allow_unused=True, materialize_grads=True)
        torch.testing.assert_close(gx, ex)
        torch.testing.assert_close(gz, ez)


def test_an_infinite_epilogue_slope_contributes_nothing():
    """√acc at acc = 0 (a point paired with itself) has e' = ∞: the pair contributes 0, the subgradient
    torch.cdist takes at zero distance, where torch's autograd of the formula gives NaN."""
    t = X - Z
    program = kermac.PairwiseProgram(ir.log(1.0 + t * t), "sum", ir.sqrt(ACC))
    assert is_symbolic(program)
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    g = torch.randn(4, 4, dtype=torch.float64)
    (gx,) = torch.autograd.grad(run(program, x, x), (x,), g)
    assert torch.autograd.grad(formula(program, x, x, 0.0), (x,), g)[0].isnan().all()
    xd = x.detach()
    diff = xd[:, None, :] - xd[None, :, :]
    acc = torch.log1p(diff * diff).sum(-1)
    G = torch.where(acc == 0, 0.0, g / (2 * acc.sqrt()))
    slope = 2 * diff / (1 + diff * diff)  # ∂τ/∂x; ∂τ/∂z is its negation
    expected = (G[..., None] * slope).sum(1) - (G[..., None] * slope).sum(0)
    torch.testing.assert_close(gx, expected)


def test_nan_propagates():
    """A NaN epilogue slope (√acc of a negative acc) and a NaN extreme give NaN gradients, never a silent 0."""
    x = torch.tensor([[1.0, 2.0]], dtype=torch.float64, requires_grad=True)
    z = torch.tensor([[3.0, 0.5]], dtype=torch.float64, requires_grad=True)
    negative = kermac.PairwiseProgram(X - Z, "sum", ir.sqrt(ACC))  # acc = −0.5
    gx, gz = torch.autograd.grad(run(negative, x, z).sum(), (x, z))
    assert gx.isnan().all() and gz.isnan().all()
    extreme = kermac.PairwiseProgram(ir.log(X - Z + 1.5), "max", ACC)  # log of a negative: a NaN term
    gx, gz = torch.autograd.grad(run(extreme, x, z).sum(), (x, z))
    assert gx.isnan().all() and gz.isnan().all()


def test_ties_of_an_extreme_share_the_gradient():
    program = kermac.PairwiseProgram(ir.exp(X) * Z * Z, "max", ACC)
    x = torch.zeros(1, 2, dtype=torch.float64, requires_grad=True)
    z = torch.ones(1, 2, dtype=torch.float64, requires_grad=True)
    gx, gz = torch.autograd.grad(kermac.run_program(program, x, z, backend="torch").sum(), (x, z))
    torch.testing.assert_close(gx, torch.full((1, 2), 0.5, dtype=torch.float64))  # e^x z², halved
    torch.testing.assert_close(gz, torch.full((1, 2), 1.0, dtype=torch.float64))  # 2 e^x z, halved


def test_second_derivatives_raise_naming_the_program():
    for reduction in ("sum", "max"):
        program = random_program(4, reduction)
        x = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
        z = torch.randn(4, 2, dtype=torch.float64)
        (gx,) = torch.autograd.grad(run(program, x, z).sum(), x, create_graph=True)
        (plain,) = torch.autograd.grad(run(program, x, z).sum(), x)
        assert torch.equal(gx, plain) and gx.grad_fn is not None
        with pytest.raises(NotImplementedError, match="run_program: second derivatives are implemented") as info:
            torch.autograd.grad(gx.pow(2).sum(), x)
        assert f"program {program.key()} has first derivatives only" in str(info.value)


@pytest.mark.parametrize("reduction", ["sum", "min"])
def test_constant_terms_have_zero_gradient(monkeypatch, reduction):
    """Terms (or an epilogue) constant in an input give it a zero gradient without a contraction, also where the
    upstream gradient is NaN (as torch's autograd: no path from the input to the output)."""
    launched = []
    original = kermac.ops.grad
    monkeypatch.setattr(kermac.ops, "grad", lambda key, *a, **k: launched.append(key) or original(key, *a, **k))
    program = kermac.PairwiseProgram(ir.sign(X - Z) + ir.lt(X, Z), reduction, ir.exp(ACC))
    x = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    z = torch.randn(4, 2, dtype=torch.float64, requires_grad=True)
    gx, gz = torch.autograd.grad(run(program, x, z).sum(), (x, z))
    assert torch.equal(gx, torch.zeros_like(x)) and torch.equal(gz, torch.zeros_like(z))
    assert launched == []
    in_z = kermac.PairwiseProgram(ir.exp(Z) * 0.5 + ir.sign(X), reduction, ir.log(ACC * ACC + 1.0))
    g = torch.randn(3, 4, dtype=torch.float64)
    g[0, 0] = float("nan")
    gx, gz = torch.autograd.grad(run(in_z, x, z), (x, z), g)
    assert torch.equal(gx, torch.zeros_like(x))
    expected = torch.autograd.grad(formula(in_z, x, z, 0.0), (z,), g)[0]
    torch.testing.assert_close(gz, expected, equal_nan=True)
    assert gz.isnan().any()
    assert len(launched) == (1 if reduction == "sum" else 0)


def test_generated_contraction_programs_compile_with_nvrtc(tmp_path, monkeypatch):
    """The gradient kernels of NVRTC (SIMT and tensor-core) compile the generated programs to cubin."""
    pytest.importorskip("cuda.core")
    require_nvrtc_compiler()
    from kermac_backend_nvrtc import compiler, plan
    from kermac_backend_nvrtc.source import kernel_source
    from kermac_backend_nvrtc.tuning import NvrtcTuning

    monkeypatch.setenv("KERMAC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(compiler, "_memo", {})
    tuning = NvrtcTuning(half_powers=False, tensor_core_grad_min_o=1)
    for seed in (0, 1):
        program = random_program(seed, "sum")
        for wrt in ("x", "z"):
            grad = contraction_program(program, wrt)
            hypers = {n: HyperValue(n, 0.7) for n in grad.hypers}
            k, m, d = 21, 19, 11
            problem = grad_problem(
                grad,
                torch.randn(k, m),
                torch.randn(d, k),
                torch.ones(1, k),
                torch.randn(d, m),
                out=None,
                hypers=hypers,
            )
            for tensor_cores in (False, True):
                variant = plan.plan_grad(problem, 80, dataclasses.replace(tuning, tensor_cores=tensor_cores))[0]
                built = compiler.compile_cubin(kernel_source(variant)[0], "sm_80", name="kermac_grad")
                assert built.cubin[:4] == b"\x7fELF"


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["torch", "nvrtc", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_random_programs_on_the_gpu(backend, dtype):
    """Real sizes on CUDA (past the tiles, not multiples of 4, a broadcast batch) against torch's float64 autograd
    of the formula on the CPU; in float32 only sums (the extreme a float32 pass selects may differ from the
    float64 one where two terms are within rounding)."""
    from helpers import assert_close

    require_backend(backend, "cuda", "grad")
    for seed in range(12):
        program = random_program(seed, "sum" if dtype == torch.float32 else None)
        gen = torch.Generator().manual_seed(seed)
        x, z = _points(gen, 2, 133, 37).to(dtype), _points(gen, 70, 37).to(dtype)
        g = torch.randn(2, 133, 70, generator=gen, dtype=torch.float64)
        x64, z64 = (t.detach().double().requires_grad_() for t in (x, z))
        expected = torch.autograd.grad(formula(program, x64, z64, 0.7), (x64, z64), g)
        xc, zc = (t.detach().cuda().requires_grad_() for t in (x, z))
        got = torch.autograd.grad(run(program, xc, zc, backend=backend), (xc, zc), g.to(dtype).cuda())
        for a, b in zip(got, expected, strict=True):
            assert a.dtype == dtype and a.is_cuda
            assert_close(a.cpu(), b, 1e-4 if dtype == torch.float32 else 1e-9)


def test_contraction_programs_are_the_slopes_in_each_operand():
    """`∂τ/∂x` with x → d, z → b; `∂τ/∂z` with z → d, x → b (the operand differentiated is `d`)."""
    program = kermac.PairwiseProgram(ir.exp(X) * Z * Z, "sum", ACC)
    d, b = ir.Var("d"), ir.Var("b")
    assert contraction_program(program, "x").multiply == ir.exp(d) * b * b
    grad_z = contraction_program(program, "z").multiply
    values = {"d": torch.tensor(0.3, dtype=torch.float64), "b": torch.tensor(-0.7, dtype=torch.float64)}
    torch.testing.assert_close(evaluate(grad_z, values, like=values["d"]), 2 * torch.exp(values["b"]) * values["d"])
    with pytest.raises(ValueError, match="wrt: expected 'x' or 'z', got 'y'"):
        contraction_program(program, "y")
