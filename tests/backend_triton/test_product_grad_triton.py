"""The Triton backend's fused gradient product `kermac::product_grad` (`TritonBackend.product_grad`).

Every value is checked against two references: the reference backend's `product_grad` on float64 copies of the
inputs, and torch autograd of the independent dense float64 product (`dense_programs.dense_kernel`, the program
evaluated with torch operations, then `@ v`; no symbolic derivative).  On the CPU the kernel runs in Triton's
interpreter with tiles (8 rows, 4 columns, 4 features per step) far smaller than the sizes below; the `gpu`
tests run the same at real sizes, tuned and untuned.

- Laplace-L1, Laplace-Lp with one p per batch entry, a user program whose epilogue's slope reads the diagonal
  (regularised, with offsets), a Gaussian; sizes beyond one tile in M, N and D, C = 1 and 5,
  float32 and float64;
- every size 0, transposed and strided views of every operand and of `out`, broadcast batches, 64-bit indices,
  each with D held in registers and with D accumulated in `out` (read-modify-write);
- half inputs computed in float32 (through a float32 workspace where D is accumulated in `out`); NaN and ±inf
  in `g` and `v`, coincident points (flat inner terms where `e'` is infinite), as the reference backend;
- gradcheck of `program_product` in float64 on `backend="triton"` for x, z and v;
- every reduction (a section of its own): maxima (the l∞ distance, a user program), a minimum whose slope reads
  the diagonal and the soft minimum (log-sum-exp) against both references, in registers and in `out`, ties on an
  integer grid (1/k of the gradient each), NaN and ±inf terms, broadcast batches with γ per entry, half inputs,
  size 0, gradcheck in x and z; the generated module of a sum program pinned by digests;
- `check_product_grad`'s refusals, and the generated kernel compiling to cubins (sm_80, sm_90) in a clean process.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
from cubin_jobs import assert_compiled, compile_in_clean_process
from dense_programs import dense_kernel
from helpers import assert_close, device_under_test, skip_unless_triton_runs, tolerance

import kermac
from kermac import ir, presets, registry, testing
from kermac.hyperparams import program_hypers
from kermac.ir_eval import evaluate
from kermac.problem import ProductGradProblem, product_grad_problem
from kermac.programs import PairwiseProgram
from kermac.reductions import ALL as REDUCTIONS
from kermac.reference.backend import ReferenceBackend

backend_module = pytest.importorskip("kermac_backend_triton.backend")
launch = pytest.importorskip("kermac_backend_triton.launch")
configs = pytest.importorskip("kermac_backend_triton.configs")
generated = pytest.importorskip("kermac_backend_triton.generated")
TritonTuning = pytest.importorskip("kermac_backend_triton.tuning").TritonTuning

F64 = torch.float64
UNTUNED = TritonTuning(autotune=False)


def _randn(*shape: int, dtype: torch.dtype = torch.float32, device: str | None = None) -> torch.Tensor:
    return torch.randn(*shape, dtype=F64).to(dtype=dtype, device=device or device_under_test())


def _preset(name: str) -> PairwiseProgram:
    return presets.ALL[name].lower(regularized=True)


def _diag_program() -> PairwiseProgram:
    """A user program: (1 + μ·diag)·exp(−Σ_k sqrt((x − z)² + ε) / h) + λ·diag (e' reads the diagonal)."""
    t, acc, diag = ir.Var("x") - ir.Var("z"), ir.Var("acc"), ir.Var("diag")
    epilogue = (1.0 + ir.Hyper("mu") * diag) * ir.exp(-acc / ir.Hyper("h")) + ir.select(diag, ir.Hyper("lam"), 0.0)
    return PairwiseProgram(ir.sqrt(t * t + ir.Hyper("eps")), "sum", epilogue)


def _problem(program, x, z, v, g, hypers, *, out=None, offset_m=0, offset_n=0) -> ProductGradProblem:
    hv = program_hypers(program.hypers, hypers, x.device, False)
    return product_grad_problem(program, x, z, v, g, out=out, hypers=hv, offset_m=offset_m, offset_n=offset_n)


def _triton(program, x, z, v, g, hypers, *, tuning=UNTUNED, **kw) -> torch.Tensor:
    problem = _problem(program, x, z, v, g, hypers, **kw)
    backend = backend_module.TritonBackend(tuning)
    assert backend.check_product_grad(problem) is None
    backend.product_grad(problem)
    return problem.out


def _f64(hypers: dict) -> dict:
    return {k: h.double().cpu() if isinstance(h, torch.Tensor) else h for k, h in hypers.items()}


def _reference(program, x, z, v, g, hypers, **offsets) -> torch.Tensor:
    """The reference backend's gradient product on float64 copies."""
    args = [t.double().cpu() for t in (x, z, v, g)]
    problem = _problem(program, *args, _f64(hypers), **offsets)
    ReferenceBackend().product_grad(problem)
    return problem.out


def _dense(program, x, z, v, g, hypers, offset_m=0, offset_n=0) -> torch.Tensor:
    """∂/∂x of Σ g ⊙ (K v) by torch autograd of the dense float64 kernel, per entry of the broadcast batch."""
    tensors = [h for h in hypers.values() if isinstance(h, torch.Tensor)]
    batch = torch.broadcast_shapes(*(t.shape[:-2] for t in (x, z, v, g)), *(h.shape for h in tensors))
    x64 = x.double().cpu().expand(batch + x.shape[-2:]).clone().requires_grad_()
    z64, v64, g64 = (t.double().cpu() for t in (z, v, g))
    out = dense_kernel(program, x64, z64, _f64(hypers), (offset_m, offset_n)) @ v64
    (grad,) = torch.autograd.grad((out * g64).sum(), x64)
    return grad


def _check(program, x, z, v, g, hypers, *, tuning=UNTUNED, **offsets) -> torch.Tensor:
    """Triton's value within `tolerance` of both references (float64: within 1e-10 of the reference backend)."""
    got = _triton(program, x, z, v, g, hypers, tuning=tuning, **offsets)
    assert got.dtype == x.dtype
    ref = _reference(program, x, z, v, g, hypers, **offsets)
    assert_close(got, ref, 1e-10 if x.dtype == F64 else tolerance(x.dtype))
    assert_close(got, _dense(program, x, z, v, g, hypers, **offsets), 1e-9 if x.dtype == F64 else tolerance(x.dtype))
    return got


# --- values against the reference backend and the dense gradient -----------------------------------

CASES = {  # program, hypers, offsets
    "laplace_l1": (_preset("laplace_l1"), {"bandwidth": 1.7, "regularization": 0.3}, {"offset_m": 2}),
    "gaussian": (_preset("gaussian"), {"bandwidth": 1.9, "regularization": 0.1}, {"offset_n": 1}),
    "diag_user": (_diag_program(), {"mu": 0.8, "h": 2.5, "lam": 0.4, "eps": 0.3}, {"offset_n": 3}),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize(("m", "n", "d", "c"), [(19, 11, 5, 1), (13, 17, 19, 5)])
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_programs_match_both_references(case: str, m: int, n: int, d: int, c: int, dtype: torch.dtype) -> None:
    """Sizes beyond one tile in M, N and D (D = 19: past the 16 features held in registers, accumulated in `out`
    16 features per step)."""
    device = device_under_test()
    skip_unless_triton_runs(device)
    program, hypers, offsets = CASES[case]
    x, z = _randn(m, d, dtype=dtype), _randn(n, d, dtype=dtype)
    v, g = _randn(n, c, dtype=dtype), _randn(m, c, dtype=dtype)
    _check(program, x, z, v, g, hypers, **offsets)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_laplace_lp_with_one_p_per_batch_entry(dtype: torch.dtype) -> None:
    """Tensor (batched) hyperparameters: p and the bandwidth per entry of a batch of 3, the diagonal shifted."""
    device = device_under_test()
    skip_unless_triton_runs(device)
    hypers = {
        "p": torch.tensor([1.3, 2.0, 3.5], dtype=dtype, device=device),
        "bandwidth": torch.tensor([0.9, 1.5, 2.2], dtype=dtype, device=device),
        "regularization": 0.2,
    }
    x, z = _randn(3, 10, 6, dtype=dtype), _randn(3, 9, 6, dtype=dtype)
    v, g = _randn(3, 9, 2, dtype=dtype), _randn(3, 10, 2, dtype=dtype)
    _check(_preset("laplace_lp"), x, z, v, g, hypers, offset_m=1)


def test_the_dot_product_keeps_its_slope_where_acc_is_zero() -> None:
    """exp(Σ x·z) at orthogonal points: acc = 0 does not zero the term (∂τ/∂x = z ≠ 0)."""
    device = device_under_test()
    skip_unless_triton_runs(device)
    program = PairwiseProgram(ir.Var("x") * ir.Var("z"), "sum", ir.exp(ir.Var("acc")))
    x = torch.tensor([[1.0, 0.0], [0.5, 2.0]], dtype=F64, device=device)
    z = torch.tensor([[0.0, 3.0], [1.0, 1.0], [-2.0, 0.5]], dtype=F64, device=device)
    _check(program, x, z, _randn(3, 2, dtype=F64), _randn(2, 2, dtype=F64), {})


@pytest.mark.parametrize("d", [7, 18])
def test_broadcast_batches_and_views(d: int) -> None:
    """x [2, 1, M, D] against z [3, N, D] (batch [2, 3], a bandwidth per entry of its last dimension); x, v and g
    transposed views, z a strided slice, `out` a transposed view poisoned with NaN: every element is written."""
    device = device_under_test()
    skip_unless_triton_runs(device)
    x = _randn(2, 1, d, 9).mT  # [2, 1, 9, D]
    z = _randn(3, 22, 2 * d)[:, ::2, ::2]  # [3, 11, D]
    v = _randn(2, 11).t()  # [11, 2]
    g = _randn(2, 3, 2, 9).mT  # [2, 3, 9, 2]
    hypers = {"bandwidth": torch.tensor([0.7, 1.1, 2.4], device=device), "regularization": 0.5}
    out = torch.full((2, 3, d, 9), float("nan"), device=device).mT
    program = _preset("laplace_l1")
    got = _triton(program, x, z, v, g, hypers, out=out, offset_n=2)
    assert got is out
    assert_close(out, _reference(program, x, z, v, g, hypers, offset_n=2), tolerance(torch.float32))
    assert_close(out, _dense(program, x, z, v, g, hypers, offset_n=2), tolerance(torch.float32))


def test_size_zero_dimensions() -> None:
    """N = 0 writes zeros (an empty sum, also where D is accumulated in `out`); M, D, C = 0 and an empty batch give
    what the references give."""
    device = device_under_test()
    skip_unless_triton_runs(device)
    program, hypers = _preset("laplace_l1"), {"bandwidth": 1.3, "regularization": 0.2}
    for d in (3, 20):
        out = torch.full((5, d), float("nan"), device=device)
        _triton(program, _randn(5, d), _randn(0, d), _randn(0, 2), _randn(5, 2), hypers, out=out)
        assert torch.equal(out, torch.zeros(5, d, device=device))
    for m, n, d, c, b in [(0, 6, 3, 2, ()), (5, 6, 0, 2, ()), (5, 6, 3, 0, ()), (5, 6, 3, 2, (0,))]:
        x, z, v, g = _randn(*b, m, d), _randn(n, d), _randn(n, c), _randn(*b, m, c)
        got = _triton(program, x, z, v, g, hypers)
        assert got.shape == (*b, m, d)
        torch.testing.assert_close(got.double().cpu(), _reference(program, x, z, v, g, hypers), rtol=0, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_nan_and_inf_propagate_as_in_the_reference_backend(dtype: torch.dtype) -> None:
    """A NaN in v reaches every row (each row meets every n); ±inf in g makes its row NaN, or −inf where every
    term has one sign (row 4's first feature: x beyond every z there, v's second column positive); the rows
    without them stay exact."""
    device = device_under_test()
    skip_unless_triton_runs(device)
    program, hypers = _preset("laplace_l1"), {"bandwidth": 1.3, "regularization": 0.0}
    x, z = _randn(10, 3, dtype=dtype), _randn(9, 3, dtype=dtype)
    v, g = _randn(9, 2, dtype=dtype), _randn(10, 2, dtype=dtype)
    x[4, 0] = 10.0
    v[:, 1] = v[:, 1].abs() + 0.1
    g[4, 1] = float("inf")
    g[7, 0], g[7, 1] = float("inf"), float("-inf")
    got = _triton(program, x, z, v, g, hypers)
    ref = _reference(program, x, z, v, g, hypers)
    assert torch.equal(torch.isnan(got).cpu(), torch.isnan(ref)) and torch.isnan(ref[7]).all()
    assert torch.equal(torch.isinf(got).cpu(), torch.isinf(ref)) and ref[4, 0] == float("-inf")
    assert torch.equal(got.cpu()[torch.isinf(ref)], ref[torch.isinf(ref)].to(dtype))
    rows = [0, 1, 2, 3, 5, 6, 8, 9]
    assert_close(got[rows], ref[rows], 1e-10 if dtype == F64 else tolerance(dtype))
    v[3, 0] = float("nan")
    assert _triton(program, x, z, v, g, hypers).isnan().all()


@pytest.mark.parametrize(("name", "hypers"), [("laplace_l1", {"bandwidth": 0.7}), ("lp_distance", {"p": 1.5})])
def test_coincident_points_take_the_subgradient(name: str, hypers: dict) -> None:
    """At x_m = z_n the inner term is flat (|x − z|'s derivative, sign(0) = 0; |t|^p's): its bracket is 0 even where
    e' is infinite (the lp distance's (1/p)·acc^(1/p − 1) at acc = 0), as in the reference backend."""
    device = device_under_test()
    skip_unless_triton_runs(device)
    program = presets.ALL[name].lower()
    x = _randn(6, 3, dtype=F64)
    z = torch.cat([x[1:4], _randn(4, 3, dtype=F64)])
    v, g = _randn(7, 2, dtype=F64), _randn(6, 2, dtype=F64)
    got = _triton(program, x, z, v, g, hypers)
    assert torch.isfinite(got).all()  # torch autograd of the dense lp distance gives NaN there (∞·0)
    assert_close(got, _reference(program, x, z, v, g, hypers), 1e-10)


@pytest.mark.parametrize("d", [5, 17])
def test_64_bit_indices(monkeypatch: pytest.MonkeyPatch, d: int) -> None:
    """The variant with 64-bit indices (chosen for operands past 2³¹ elements) computes the same values; forced
    here on small, batched operands."""
    device = device_under_test()
    skip_unless_triton_runs(device)
    monkeypatch.setattr(launch, "_families", {})
    monkeypatch.setattr(launch, "_needs_int64", lambda tensors, programs: True)
    program, hypers, offsets = CASES["diag_user"]
    x, z, v, g = _randn(2, 12, d), _randn(2, 10, d), _randn(10, 3), _randn(2, 12, 3)
    _check(program, x, z, v, g, hypers, **offsets)


def test_repeated_calls_reuse_their_launcher_with_new_values() -> None:
    device = device_under_test()
    skip_unless_triton_runs(device)
    program, hypers, _ = CASES["laplace_l1"]
    for _ in range(2):
        _check(program, _randn(10, 3), _randn(9, 3), _randn(9, 2), _randn(10, 2), hypers)


# --- autograd through the fused gradient product ------------------------------------------------------


def test_gradcheck_of_program_product_on_triton() -> None:
    """gradcheck in float64 of K @ v for the user program with a diagonal in its slope (x ≠ z everywhere): the x and
    z gradients are Triton's gradient products (z's on the swapped program), v's Triton's transposed product."""
    device = device_under_test()
    skip_unless_triton_runs(device)
    program, hypers, _ = CASES["diag_user"]
    x = _randn(2, 5, 3, dtype=F64).requires_grad_()
    z = (_randn(6, 3, dtype=F64) + 0.05).requires_grad_()
    v = _randn(6, 2, dtype=F64).requires_grad_()

    def f(x, z, v):
        return kermac.program_product(program, x, z, v, offset_m=1, backend="triton", **hypers)

    assert torch.autograd.gradcheck(f, (x, z, v))


def test_kernel_product_gradients_on_triton_equal_the_reference_backends() -> None:
    """Laplace-L1's x and z gradients through `kernel_product(backend="triton")` equal the reference backend's."""
    device = device_under_test()
    skip_unless_triton_runs(device)
    x, z, v, u = _randn(2, 9, 4), _randn(13, 4), _randn(13, 3), _randn(2, 9, 3)
    grads = []
    for backend in ("triton", "torch"):
        leaves = [t.clone().requires_grad_() for t in (x, z)]
        out = kermac.kernel_product("laplace_l1", *leaves, v, bandwidth=1.4, regularization=0.1, backend=backend)
        grads.append(torch.autograd.grad(out, leaves, u))
    for a, b in zip(*grads, strict=True):
        assert_close(a, b, tolerance(torch.float32))


# --- every reduction: maxima, minima and log-sum-exp over features --------------------------------------

_X, _Z, _ACC = ir.Var("x"), ir.Var("z"), ir.Var("acc")


def _min_diag_program() -> PairwiseProgram:
    """A user program: (1 + μ·diag)·exp(−min_k (x − z)²) (a minimum over features; e' reads the diagonal)."""
    return PairwiseProgram((_X - _Z) * (_X - _Z), "min", (1.0 + ir.Hyper("mu") * ir.Var("diag")) * ir.exp(-_ACC))


WEIGHTED = {  # program, hypers, offsets: one per reduction whose terms carry weights ∂acc/∂τ_j other than 1
    "linf_distance": (presets.ALL["linf_distance"].lower(), {}, {}),
    "max_user": (PairwiseProgram(abs(_X - 0.5 * _Z), "max", 1.0 / (1.0 + _ACC)), {}, {}),
    "min_diag": (_min_diag_program(), {"mu": 0.6}, {"offset_m": 2}),
    "soft_min": (testing.SOFT_MIN, {"gamma": 0.7}, {"offset_n": 1}),
}


def test_every_reduction_is_accepted() -> None:
    """The gradient product covers every reduction of `kermac.reductions` (it refused all but the sum)."""
    x = torch.zeros(3, 2)
    backend = backend_module.TritonBackend(UNTUNED)
    for reduction in REDUCTIONS:
        program = PairwiseProgram(abs(_X - _Z), reduction, ir.exp(-_ACC))
        assert backend.check_product_grad(_problem(program, x, x, x, x, {})) is None, reduction


def test_the_module_of_a_sum_is_unchanged() -> None:
    """The generated module of a sum program is pinned: the one of the weighted reductions' change, with
    `REDUCTION='sum'` and `weight=None` passed explicitly (Triton 3.6 refused them as defaults; 3.9 takes them):
    digests of Laplace-L1, Laplace-Lp and the Gaussian, in float32 and in float64 with batches, a tensor
    hyperparameter and 64-bit indices.  A deliberate change of the sum's generated source updates them (Laplace-Lp's
    last: the derivative of |t|^p taken as 0 at a tie, `kermac.programs.inner_slope`)."""
    want = {
        ("laplace_l1", "float32"): "2b5edcee7899ecb418ebdd40b712a98bf1f5cde708f2d1ae2020898354a4b7ee",
        ("laplace_l1", "float64"): "189eed57538f1534924a6ea7d5eafc23ebeed92ba0caa4257125ef7d1a3917f4",
        ("laplace_lp", "float32"): "44bf5cb0ab1dc520f1c693ba7a2371cc77f97c66320164e47aed54315c0ece3e",
        ("laplace_lp", "float64"): "8163987d60394906eacc556026ad88bf3cdd70eb4cd314e830860fa6cf7983bf",
        ("gaussian", "float32"): "a26b302e682587a50699f3f8eb03fce184f99fb73ac81ae682d2cb0f92b4a0aa",
        ("gaussian", "float64"): "e4ce2d5dbb52cbfa3fe3bfd5fc6808f1c820def749c16c6cf9104fc2cee344dc",
    }
    for (name, compute), digest in want.items():
        batched = compute == "float64"
        spec = generated.ProductGradSpec(
            _preset(name), compute, 2 if batched else 0, frozenset({"bandwidth"} if batched else ()), batched
        )
        assert hashlib.sha256(generated.kernel_source(spec).encode()).hexdigest() == digest, (name, compute)


def test_a_weighted_module_names_its_reduction_and_weight() -> None:
    """A maximum's module has its `weight` (1 where a term attains the extreme) and passes it with the reduction's
    name to the tile function."""
    spec = generated.ProductGradSpec(WEIGHTED["max_user"][0], "float32", 0, frozenset(), False)
    source = generated.kernel_source(spec)
    assert "def weight(acc, t):\n    return (t == acc).to(tl.float32)\n" in source
    assert "INT64=False, REDUCTION='max', weight=weight," in source


@pytest.mark.parametrize("case", sorted(WEIGHTED))
@pytest.mark.parametrize(("m", "n", "d", "c"), [(19, 11, 5, 1), (13, 17, 19, 5)])
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_weighted_reductions_match_both_references(case: str, m: int, n: int, d: int, c: int, dtype) -> None:
    """Maxima, minima and log-sum-exp: sizes beyond one tile in M, N and D (D = 5 held in registers, D = 19 past
    the 16 features held there, accumulated in `out`), C = 1 and 5, against the reference backend and torch
    autograd of the dense program (`torch.amax`, `torch.amin`, `torch.logsumexp` over the features)."""
    device = device_under_test()
    skip_unless_triton_runs(device)
    program, hypers, offsets = WEIGHTED[case]
    x, z = _randn(m, d, dtype=dtype), _randn(n, d, dtype=dtype)
    v, g = _randn(n, c, dtype=dtype), _randn(m, c, dtype=dtype)
    _check(program, x, z, v, g, hypers, **offsets)


@pytest.mark.parametrize("case", ["linf_distance", "max_user", "min_diag"])
@pytest.mark.parametrize("d", [6, 19])
def test_tied_extremes_share_the_gradient(case: str, d: int) -> None:
    """Points on the integer grid {−2, …, 2}^D: many pairs have several features tied for the maximum or minimum,
    each taking 1/k of the gradient (as torch.amax / torch.amin's backward)."""
    device = device_under_test()
    skip_unless_triton_runs(device)
    program, hypers, offsets = WEIGHTED[case]
    grid = torch.Generator().manual_seed(d)
    x, z = (torch.randint(-2, 3, (rows, d), generator=grid, dtype=F64) for rows in (11, 9))
    terms = evaluate(program.inner, {"x": x[:, None, :], "z": z[None, :, :]}, like=x)
    extreme = terms.amax(-1, keepdim=True) if program.reduction == "max" else terms.amin(-1, keepdim=True)
    assert ((terms == extreme).sum(-1) > 1).float().mean() > 0.25  # the ties the test is about
    x, z = x.to(device), z.to(device)
    v, g = _randn(9, 3, dtype=F64), _randn(11, 3, dtype=F64)
    _check(program, x, z, v, g, hypers, **offsets)


@pytest.mark.parametrize("d", [4, 18])
def test_nan_and_inf_terms_give_the_reference_backends_values(d: int) -> None:
    """A NaN coordinate makes its pairs' extreme NaN and their weights NaN (0/0): every feature with a slope gets
    NaN; an infinite coordinate gives an infinite log-sum-exp (x·z terms, +∞) whose weights are NaN, as
    torch.logsumexp's backward, or a −∞ term that weighs 0.  NaN where the reference has NaN, ±inf where it has
    them, and the other values within the tolerance."""
    device = device_under_test()
    skip_unless_triton_runs(device)
    programs = [
        (WEIGHTED["max_user"][0], {}),
        (WEIGHTED["min_diag"][0], {"mu": 0.6}),
        (testing.SOFT_MIN, {"gamma": 0.7}),
        (PairwiseProgram(_X * _Z, "logsumexp", ir.exp(-0.1 * _ACC)), {}),
    ]
    for program, hypers in programs:
        x, z = _randn(10, d, dtype=F64), _randn(9, d, dtype=F64)
        v, g = _randn(9, 2, dtype=F64), _randn(10, 2, dtype=F64)
        x[1, 0] = float("nan")
        x[3, 1], z[4, 2] = float("inf"), float("-inf")
        got, ref = _triton(program, x, z, v, g, hypers).cpu(), _reference(program, x, z, v, g, hypers)
        assert torch.isnan(ref).any(), program.key()
        assert torch.equal(torch.isnan(got), torch.isnan(ref)), program.key()
        assert torch.equal(got[torch.isinf(ref)], ref[torch.isinf(ref)]), program.key()
        finite = torch.isfinite(ref)
        torch.testing.assert_close(got[finite], ref[finite], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("d", [7, 12, 18])
def test_weighted_broadcast_batches_and_a_gamma_per_entry(d: int) -> None:
    """The soft minimum with γ a tensor (one per entry of the batch's last dimension), x [2, 1, M, D] against
    z [3, N, D], views of x and z, a maximum on the same batch; float64: D in registers (7) and accumulated in `out`
    (12, past the 8 features a weighted reduction holds in registers in float64, and 18)."""
    device = device_under_test()
    skip_unless_triton_runs(device)
    x = _randn(2, 1, d, 9, dtype=F64).mT  # [2, 1, 9, D]
    z = _randn(3, 22, 2 * d, dtype=F64)[:, ::2, ::2]  # [3, 11, D]
    v, g = _randn(11, 2, dtype=F64), _randn(2, 3, 9, 2, dtype=F64)
    gamma = torch.tensor([0.4, 0.9, 1.7], dtype=F64, device=device)
    _check(testing.SOFT_MIN, x, z, v, g, {"gamma": gamma}, offset_m=1)
    _check(WEIGHTED["max_user"][0], x, z, v, g, {})


@pytest.mark.parametrize("case", ["laplace_l1", "max_user", "soft_min"])  # a sum, and two weighted reductions
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [5, 18])
def test_half_inputs_compute_in_float32(case: str, dtype: torch.dtype, d: int) -> None:
    device = device_under_test()
    skip_unless_triton_runs(device)
    x, z = _randn(11, d, dtype=dtype), _randn(9, d, dtype=dtype)
    v, g = _randn(9, 2, dtype=dtype), _randn(11, 2, dtype=dtype)
    if case == "laplace_l1":
        program, hypers = _preset("laplace_l1"), {"bandwidth": 2.0, "regularization": 0.1}
    else:
        program, hypers, _ = WEIGHTED[case]
    got = _triton(program, x, z, v, g, hypers)
    assert got.dtype == dtype
    # computed in float32 from the half values (the terms and their ties exactly): the stored rounding alone
    assert_close(got, _reference(program, x, z, v, g, hypers), 1e-2)
    assert_close(got, _dense(program, x, z, v, g, hypers), 1e-2)


def test_weighted_size_zero_dimensions() -> None:
    """N = 0 writes zeros; C = 0 (G = 0), M = 0, D = 0 and an empty batch give what the reference gives."""
    device = device_under_test()
    skip_unless_triton_runs(device)
    for case in ("max_user", "soft_min"):
        program, hypers, _ = WEIGHTED[case]
        for d in (3, 20):
            out = torch.full((5, d), float("nan"), device=device)
            _triton(program, _randn(5, d), _randn(0, d), _randn(0, 2), _randn(5, 2), hypers, out=out)
            assert torch.equal(out, torch.zeros(5, d, device=device))
        for m, n, d, c, b in [
            (0, 6, 3, 2, ()),
            (5, 6, 0, 2, ()),
            (5, 6, 3, 0, ()),
            (5, 6, 17, 0, ()),
            (5, 6, 3, 2, (0,)),
        ]:
            x, z, v, g = _randn(*b, m, d), _randn(n, d), _randn(n, c), _randn(*b, m, c)
            got = _triton(program, x, z, v, g, hypers)
            assert got.shape == (*b, m, d)
            torch.testing.assert_close(got.double().cpu(), _reference(program, x, z, v, g, hypers), rtol=0, atol=0)


@pytest.mark.parametrize("d", [5, 17])
def test_weighted_64_bit_indices(monkeypatch: pytest.MonkeyPatch, d: int) -> None:
    """The variant with 64-bit indices of a minimum and of a soft minimum, forced on small batched operands."""
    device = device_under_test()
    skip_unless_triton_runs(device)
    monkeypatch.setattr(launch, "_families", {})
    monkeypatch.setattr(launch, "_needs_int64", lambda tensors, programs: True)
    x, z, v, g = _randn(2, 12, d), _randn(2, 10, d), _randn(10, 3), _randn(2, 12, 3)
    for case in ("min_diag", "soft_min"):
        program, hypers, offsets = WEIGHTED[case]
        _check(program, x, z, v, g, hypers, **offsets)


@pytest.mark.parametrize("case", ["max_user", "min_diag", "soft_min"])
def test_gradcheck_of_weighted_program_products_on_triton(case: str) -> None:
    """gradcheck in float64 of K @ v in x and z (Triton's gradient products; z's on the swapped program) for a
    maximum, a minimum and a soft minimum over features (distinct terms: no tie within gradcheck's steps).  Fast mode
    (one random projection of each Jacobian): the interpreter folds these reductions' combine element by element."""
    device = device_under_test()
    skip_unless_triton_runs(device)
    program, hypers, offsets = WEIGHTED[case]
    x = _randn(2, 5, 4, dtype=F64).requires_grad_()
    z = (_randn(6, 4, dtype=F64) + 0.05).requires_grad_()
    v = _randn(6, 2, dtype=F64)

    def f(x, z):
        return kermac.program_product(program, x, z, v, backend="triton", **offsets, **hypers)

    assert torch.autograd.gradcheck(f, (x, z), fast_mode=True)


# --- refusals -----------------------------------------------------------------------------------------


def test_check_product_grad_refuses_other_devices_with_a_sentence() -> None:
    x = torch.zeros(3, 2, device="meta")
    problem = _problem(_preset("gaussian"), x, x, x, x, {"bandwidth": 1.0, "regularization": 0.0})
    reason = backend_module.TritonBackend(UNTUNED).check_product_grad(problem)
    assert isinstance(reason, str) and "meta" in reason


def test_check_product_grad_refuses_a_grid_beyond_cudas_limit() -> None:
    """Shapes alone decide (stride-0 views, nothing allocated): 2³¹ rows fit (2²⁵ row tiles), 2⁴⁰ rows do not."""
    device = device_under_test()
    skip_unless_triton_runs(device)
    backend = backend_module.TritonBackend(UNTUNED)
    program = presets.ALL["laplace_l1"].lower()
    for m, d, fits in [(2**31, 16, True), (2**40, 1024, False)]:
        x, z = torch.zeros(1, 1, device=device).expand(m, d), torch.zeros(1, 1, device=device).expand(3, d)
        v, g = torch.zeros(3, 1, device=device), torch.zeros(1, 1, device=device).expand(m, 1)
        out = torch.zeros(1, 1, device=device).expand(m, d)
        reason = backend.check_product_grad(ProductGradProblem(program, x, z, v, g, out, {}, 0, 0, ()))
        assert (reason is None) if fits else ("thread blocks" in reason), reason


# --- the generated kernel compiles for the GPU -----------------------------------------------------------


def _compile_jobs() -> dict[str, dict]:
    """The default tiles for Laplace-L1, Laplace-Lp, the Gaussian and the user program (sm_90, float32, 16 features
    in registers, 8 per step accumulated in `out`), 4 features, batched float64 variants with 64-bit indices and
    tensor hyperparameters, and sm_80; the same for a maximum, a minimum and log-sum-exp (`WEIGHTED`) on sm_90 and
    sm_80."""
    meta, warps, _, _ = configs.PRODUCT_GRAD_SPACE[0]
    base = dict(spec={}, meta=meta | {"BD": 16, "RMW": False}, warps=warps, arch=90, dtype="float32")
    rmw = meta | {"BD": configs.PRODUCT_GRAD_RMW_BD, "RMW": True}
    batched = {"nbatch": 2, "tensor_hypers": ["bandwidth", "p"], "int64": True}
    keys = {name: _preset(name).key() for name in ("laplace_l1", "laplace_lp", "gaussian")} | {
        "diag_user": _diag_program().key()
    }
    jobs = {f"{name}-sm90": base | dict(program=key) for name, key in keys.items()}
    jobs |= {f"{name}-rmw-sm90": base | dict(program=key, meta=rmw) for name, key in keys.items()}
    jobs["laplace_l1-bd4-sm90"] = base | dict(program=keys["laplace_l1"], meta=meta | {"BD": 4, "RMW": False})
    lp = keys["laplace_lp"]
    jobs["laplace_lp-float64-batched-int64-sm90"] = base | dict(program=lp, dtype="float64", spec=batched)
    jobs["laplace_lp-float64-batched-int64-rmw-sm90"] = base | dict(program=lp, dtype="float64", spec=batched, meta=rmw)
    jobs["gaussian-sm80"] = base | dict(program=keys["gaussian"], arch=80)
    jobs["gaussian-rmw-sm80"] = base | dict(program=keys["gaussian"], arch=80, meta=rmw)
    # the weighted reductions: float32 as the sum; float64 (batched, every hyperparameter a tensor, 64-bit indices)
    # with the fewer features in registers of PRODUCT_GRAD_WEIGHTED_F64_MAX_BD, and accumulated in `out`
    f64_reg, f64_rmw = meta | {"BD": configs.PRODUCT_GRAD_WEIGHTED_F64_MAX_BD, "RMW": False}, rmw
    for name, (program, _, _) in WEIGHTED.items():
        f64 = base | dict(program=program.key(), dtype="float64")
        f64["spec"] = {"nbatch": 2, "tensor_hypers": list(program.hypers), "int64": True}
        for arch in (90, 80):
            jobs[f"{name}-sm{arch}"] = base | dict(program=program.key(), arch=arch)
            jobs[f"{name}-rmw-sm{arch}"] = base | dict(program=program.key(), arch=arch, meta=rmw)
            jobs[f"{name}-float64-batched-int64-sm{arch}"] = f64 | dict(arch=arch, meta=f64_reg)
            jobs[f"{name}-float64-batched-int64-rmw-sm{arch}"] = f64 | dict(arch=arch, meta=f64_rmw)
    return {key: job | {"id": key} for key, job in jobs.items()}


@pytest.fixture(scope="module")
def compile_reports() -> dict[str, str]:
    """`cuobjdump -res-usage` of every job, compiled in one clean process (product_grad_compile.py)."""
    pytest.importorskip("triton")
    return compile_in_clean_process(Path(__file__).with_name("product_grad_compile.py"), list(_compile_jobs().values()))


SPILLS_OUTSIDE_LOOPS = {"laplace_lp-sm90", "laplace_lp-float64-batched-int64-sm90"}
"""Jobs whose stack frame holds values only outside the loops: Laplace-Lp's 16 features in registers (sm_90), whose
per-pair root and its derivative (`kernel_math.pow_nonneg`, the exponent split off and rounding errors carried) keep
more registers live in the n loop: ptxas stores 4 values before the loops and loads them after (cuobjdump -sass,
Triton 3.9: 4 `STL`, 4 `LDL`, none in a loop).  In float64 with batches, tensor hyperparameters and 64-bit indices the
same kernel used 254 of 255 registers; the select that takes the derivative of |t|^p as 0 at a tie for a run-time p
(`kermac.programs.inner_slope`) leaves it a 112-byte stack frame, none of it in an innermost loop (Triton 3.9)."""


@pytest.mark.parametrize("job", sorted(_compile_jobs()))
def test_the_gradient_product_compiles_without_spills(job: str, compile_reports: dict[str, str]) -> None:
    """Each variant compiles to a cubin without a GPU; the default tiles do not spill (those of
    `SPILLS_OUTSIDE_LOOPS` not in a loop)."""
    assert_compiled(compile_reports[job], outside_hot_loops=job in SPILLS_OUTSIDE_LOOPS)


# --- real sizes on the GPU --------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("tuning", [TritonTuning(), UNTUNED], ids=["tuned", "untuned"])
@pytest.mark.parametrize(
    ("case", "d", "c"),
    [("laplace_l1", 3, 1), ("gaussian", 37, 16), ("diag_user", 130, 5)]
    + [("max_user", 3, 1), ("linf_distance", 13, 2), ("soft_min", 37, 16), ("min_diag", 130, 5)],
)
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_real_sizes_on_the_gpu(tuning: TritonTuning, case: str, d: int, c: int, dtype: torch.dtype) -> None:
    """Sums (`CASES`), and maxima, minima and log-sum-exp (`WEIGHTED`: D in registers at 3, and at 13 in float32;
    accumulated in `out` at 13 in float64, past the 8 features a weighted reduction holds there, 37 and 130)."""
    program, hypers, offsets = (CASES | WEIGHTED)[case]
    x, z = _randn(1001, d, dtype=dtype), _randn(1203, d, dtype=dtype)
    v, g = _randn(1203, c, dtype=dtype), _randn(1001, c, dtype=dtype)
    got = _triton(program, x, z, v, g, hypers, tuning=tuning, **offsets)
    assert_close(got, _reference(program, x, z, v, g, hypers, **offsets), 1e-10 if dtype == F64 else tolerance(dtype))


@pytest.mark.gpu
def test_gpu_batches_views_half_inputs_and_batched_p() -> None:
    hypers = {"p": torch.tensor([1.5, 3.0], device="cuda"), "bandwidth": 4.0, "regularization": 0.1}
    x, z = _randn(2, 40, 700).mT[..., :33], _randn(2, 900, 33)
    v, g = _randn(1, 3, 900).mT, _randn(2, 700, 3)
    program = _preset("laplace_lp")
    got = _triton(program, x, z, v, g, hypers, offset_n=7)
    assert_close(got, _reference(program, x, z, v, g, hypers, offset_n=7), tolerance(torch.float32))
    for dtype in (torch.float16, torch.bfloat16):
        args = [t.to(dtype) for t in (x[0], z[0], v[0], g[0])]
        got = _triton(_preset("laplace_l1"), *args, {"bandwidth": 4.0, "regularization": 0.1})
        assert_close(got, _reference(_preset("laplace_l1"), *args, {"bandwidth": 4.0, "regularization": 0.1}), 1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("d", [8, 40])
def test_gpu_memory_stays_that_of_the_operands(d: int) -> None:
    """M = 16,384 rows against N = 10⁶ (K would take 65 GB in float32): the gradient product runs into a given
    float32 `out` without allocating anything (D in registers, and D accumulated in `out`), and its first rows
    match the reference backend."""
    program, hypers = _preset("laplace_l1"), {"bandwidth": 4.0 * d, "regularization": 0.1}
    x, z, v, g = _randn(2**14, d), _randn(10**6, d), _randn(10**6, 2), _randn(2**14, 2)
    out = torch.empty(2**14, d, device="cuda")
    _triton(program, x, z, v, g, hypers, out=out)  # compiles and loads the variant
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    _triton(program, x, z, v, g, hypers, out=out)
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() == before
    rows = 16
    want = _reference(program, x[:rows], z, v, g[:rows], hypers)
    assert_close(out[:rows], want, tolerance(torch.float32))


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(WEIGHTED))
def test_auto_runs_weighted_gradient_products_on_triton(case: str) -> None:
    """On CUDA `auto` now runs the gradient product of a maximum, minimum or log-sum-exp on Triton (it fell back to
    the reference backend's torch blocks), and `kernel_product`'s x and z gradients equal the reference backend's."""
    program, hypers, _ = WEIGHTED[case]
    x, z, v, u = _randn(700, 9), _randn(900, 9), _randn(900, 3), _randn(700, 3)
    problem = _problem(program, x, z, v, u, hypers)
    chosen = registry.select_backend("auto", problem, lambda b, p: b.check_product_grad(p), "gradient product")
    assert chosen.name == "triton"
    grads = []
    for backend in ("auto", "torch"):
        leaves = [t.clone().requires_grad_() for t in (x, z)]
        out = kermac.program_product(program, *leaves, v, backend=backend, **hypers)
        grads.append(torch.autograd.grad(out, leaves, u))
    for a, b in zip(*grads, strict=True):
        assert_close(a, b, tolerance(torch.float32))
