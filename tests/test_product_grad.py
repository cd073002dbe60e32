"""The fused gradient product (`kermac::product_grad`, `kermac.problem.ProductGradProblem`) and the x / z
gradients of kernel products it gives every program not on Σ(x − z)²: values against torch autograd of an
independent dense float64 product (`run_kernel` on the reference backend, or the program evaluated with torch
operations by `dense_programs.dense_kernel`, then `torch.matmul`) for every sum-reduced preset and random fuzz
programs, odd and empty sizes, broadcast batches, batched hyperparameters, regularised diagonals with offsets,
views, NaN in `v`, half inputs and small evaluation blocks; gradcheck in float64; maxima, minima and log-sum-exp
(weighted features, ties, NaN); the refusals (second derivatives, backends without the operation) and bad input
named."""

from __future__ import annotations

import random
import re

import fuzz_programs
import pytest
import torch
from dense_programs import dense_kernel
from helpers import CPU_BACKENDS, PairwiseOnlyBackend, require_backend

import kermac
from kermac import ops, presets, registry, testing
from kermac.api import lower_kernel
from kermac.hyperparams import program_hypers
from kermac.problem import product_grad_problem
from kermac.programs import (
    PairwiseProgram,
    epilogue_slope,
    inner_slope,
    is_squared_difference_sum,
    program_from_key,
    swap_operands,
)
from kermac.reference import backend as reference

F64 = torch.float64
SUMS = [name for name, d in presets.ALL.items() if d.lower().reduction == "sum"]


def _randn(*shape: int, seed: int, dtype: torch.dtype = F64) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64).to(dtype)


def _kw(name: str, batched: bool = False) -> dict:
    d = presets.ALL[name]
    bandwidth = torch.tensor([0.8, 1.7], dtype=F64) if batched else 1.3
    return ({"p": 1.5} if d.needs_p else {}) | ({"bandwidth": bandwidth} if d.needs_bandwidth else {})


def _dense_gradients(kernel, x, z, v, g, **kw) -> tuple[torch.Tensor, torch.Tensor]:
    """`(∂L/∂x, ∂L/∂z)` of `L = Σ g ⊙ (K v)` by torch autograd of the dense float64 kernel of `run_kernel`."""
    x, z = x.detach().requires_grad_(), z.detach().requires_grad_()
    out = kermac.run_kernel(kernel, x, z, backend="torch", **kw) @ v
    return torch.autograd.grad((out * g).sum(), (x, z))


# -- the operation against the dense reference ------------------------------------------------------


@pytest.mark.parametrize("name", SUMS)
def test_every_sum_reduced_preset_matches_the_dense_gradient(name: str) -> None:
    """The x and z gradient products (the latter on the swapped program), odd sizes, a batched bandwidth and a
    regularised diagonal with offsets (the ridge does not depend on the points: no gradient from it)."""
    kw = _kw(name, batched=True) | {"regularization": 0.3, "offset_m": 2, "offset_n": 0}
    x, z = _randn(2, 7, 5, seed=1), _randn(9, 5, seed=2) + 0.05
    v, g = _randn(9, 3, seed=3), _randn(2, 7, 3, seed=4)
    want_x, want_z = _dense_gradients(name, x, z, v, g, **kw)
    key, hypers = lower_kernel(name, x, kw.get("p"), kw.get("bandwidth"), kw["regularization"], False)
    got_x = ops.product_grad(key, x, z, v, g, hypers, offset_m=2, backend="torch")
    swapped = swap_operands(program_from_key(key)).key()
    got_z = ops.product_grad(swapped, z, x, g, v, hypers, offset_n=2, backend="torch").sum(0)
    torch.testing.assert_close(got_x, want_x, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got_z, want_z, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    ("name", "kw"),
    [
        ("laplace_l1", {"bandwidth": 0.9}),
        ("l1_distance", {}),
        ("dot_product", {}),
        ("laplace_lp", {"bandwidth": 1.1, "p": 1.5}),
        ("laplace_lp", {"bandwidth": 1.1, "p": 3.0}),
        ("lp_distance", {"p": 1.5}),
        ("lp_distance", {"p": 3.0}),
    ],
    ids=["laplace_l1", "l1", "dot", "laplace_lp1.5", "laplace_lp3", "lp1.5", "lp3"],
)
def test_gradcheck_v_x_z(name: str, kw: dict) -> None:
    """gradcheck in float64 of K @ v and Kᵀ @ u through kernel_product (x ≠ z everywhere: |·| is smooth there)."""
    x = _randn(2, 4, 3, seed=5).requires_grad_()
    z = (_randn(5, 3, seed=6) + 0.05).requires_grad_()
    v, u = _randn(5, 2, seed=7).requires_grad_(), _randn(2, 4, 2, seed=8).requires_grad_()
    ridge = {"regularization": 0.2, "offset_n": 1} if presets.ALL[name].needs_bandwidth else {}
    assert torch.autograd.gradcheck(
        lambda x, z, v: kermac.kernel_product(name, x, z, v, backend="torch", **kw, **ridge), (x, z, v)
    )
    assert torch.autograd.gradcheck(
        lambda x, z, u: kermac.kernel_product(name, x, z, u, transpose=True, backend="torch", **kw, **ridge), (x, z, u)
    )


def _fuzz_programs(count: int) -> list[tuple[int, PairwiseProgram]]:
    """The first `count` sum-reduced fuzz programs (tests/fuzz_programs.py) not on Σ(x − z)² whose epilogue and inner
    term depend on `acc` and `x` and that are differentiable at the sample points (the dense reference passes
    gradcheck there)."""
    found = []
    for seed in range(1000):
        program = fuzz_programs._pairwise_program(random.Random(seed), fuzz_programs.HYPERS)
        if program.reduction != "sum" or is_squared_difference_sum(program):
            continue  # maxima are refused; Σ(x − z)² takes the slope products (test_product.py)
        if kermac.ir.Const(0.0) in (epilogue_slope(program), inner_slope(program)):
            continue
        if _smooth(program, *_fuzz_inputs(seed)):
            found.append((seed, program))
            if len(found) == count:
                break
    return found


def _smooth(program: PairwiseProgram, x: torch.Tensor, z: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the dense product of `program` is finite and passes gradcheck in `x` and `z` at these points."""
    hypers = _fuzz_hypers(program)

    def dense(x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return dense_kernel(program, x, z, hypers, (1, 0)) @ v

    return bool(torch.isfinite(dense(x, z)).all()) and torch.autograd.gradcheck(dense, (x, z), raise_exception=False)


def _fuzz_inputs(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = (0.5 * _randn(3, 2, seed=seed)).requires_grad_()
    z = (0.5 * _randn(4, 2, seed=seed + 1) + 0.05).requires_grad_()
    return x, z, _randn(4, 2, seed=seed + 2)


def _fuzz_hypers(program: PairwiseProgram) -> dict[str, float]:
    return {name: 0.7 + 0.4 * i for i, name in enumerate(program.hypers)}


FUZZ = _fuzz_programs(10)


@pytest.mark.parametrize(("seed", "program"), FUZZ, ids=[str(s) for s, _ in FUZZ])
def test_random_sum_reduced_programs(seed: int, program: PairwiseProgram) -> None:
    """gradcheck of program_product in v, x, z, and its gradients equal to autograd of the dense program."""
    x, z, v = _fuzz_inputs(seed)
    v.requires_grad_()
    hypers = _fuzz_hypers(program)
    g = _randn(3, 2, seed=seed + 3)

    def f(x, z, v):
        return kermac.program_product(program, x, z, v, offset_m=1, backend="torch", **hypers)

    assert torch.autograd.gradcheck(f, (x, z, v))
    want = torch.autograd.grad(((dense_kernel(program, x, z, hypers, (1, 0)) @ v) * g).sum(), (x, z, v))
    got = torch.autograd.grad((f(x, z, v) * g).sum(), (x, z, v))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_there_are_ten_fuzz_programs() -> None:
    assert len(FUZZ) == 10


# -- shapes, layouts, values ------------------------------------------------------------------------


def test_broadcast_batches_views_and_an_expanded_upstream_gradient() -> None:
    """x [2, 1, M, D] and z [3, N, D] broadcast to batch [2, 3] with one bandwidth per entry of the last batch
    dimension; x and v transposed views; the gradients are summed back to each input's shape."""
    x = _randn(2, 1, 3, 5, seed=9).mT.requires_grad_()  # [2, 1, 5, 3], a view
    z = (_randn(3, 7, 3, seed=10) + 0.05).requires_grad_()
    v = _randn(2, 7, seed=11).mT.requires_grad_()  # [7, 2], a view
    bw = torch.tensor([0.6, 1.0, 2.2], dtype=F64)
    out = kermac.kernel_product("laplace_l1", x, z, v, bandwidth=bw, backend="torch")
    assert out.shape == (2, 3, 5, 2)
    got = torch.autograd.grad(out.sum(), (x, z, v))  # an expanded (stride 0) upstream gradient
    leaves = [t.detach().requires_grad_() for t in (x, z, v)]
    dense = kermac.run_kernel("laplace_l1", *leaves[:2], bandwidth=bw, backend="torch") @ leaves[2]
    want = torch.autograd.grad(dense.sum(), leaves)
    for a, b, leaf in zip(got, want, (x, z, v), strict=True):
        assert a.shape == leaf.shape
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("m", "n", "d", "c"), [(0, 4, 3, 2), (4, 0, 3, 2), (4, 5, 0, 2), (4, 5, 3, 0), (1, 1, 1, 1)])
def test_empty_and_unit_sizes(m: int, n: int, d: int, c: int) -> None:
    x, z = _randn(m, d, seed=1).requires_grad_(), (_randn(n, d, seed=2) + 0.05).requires_grad_()
    v, g = _randn(n, c, seed=3), _randn(m, c, seed=4)
    out = kermac.kernel_product("laplace_l1", x, z, v, bandwidth=1.2, backend="torch")
    got = torch.autograd.grad(out, (x, z), g)
    want = _dense_gradients("laplace_l1", x, z, v, g, bandwidth=1.2)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


def test_small_blocks_give_the_same_gradient_within_the_workspace(monkeypatch) -> None:
    """With a tiny CHUNK_ELEMENTS the reference backend walks many row and column blocks (and the diagonal moves
    with each block); the result is the one-block result, and no expression it evaluates (inner terms, their
    derivative, acc, e', the diagonal) has more than CHUNK_ELEMENTS elements."""
    x, z = _randn(2, 13, 4, seed=12), _randn(11, 4, seed=13)
    v, g = _randn(11, 3, seed=14), _randn(2, 13, 3, seed=15)
    key, hypers = lower_kernel("laplace_lp", x, 1.5, 0.9, 0.5, False)
    whole = ops.product_grad(key, x, z, v, g, hypers, offset_n=3, backend="torch")
    monkeypatch.setattr(reference, "CHUNK_ELEMENTS", 120)
    largest = []

    def evaluate(expr, env, *, like):
        value = evaluated(expr, env, like=like)
        largest.append(value.numel())
        return value

    evaluated = reference.evaluate
    monkeypatch.setattr(reference, "evaluate", evaluate)
    torch.testing.assert_close(ops.product_grad(key, x, z, v, g, hypers, offset_n=3, backend="torch"), whole)
    assert reference.tile(13, 11, 2 * (3 * 4 + 4)) == (1, 3)
    assert len(largest) > 13 * 4 and max(largest) <= 120


def test_coincident_points_take_the_subgradient_and_nan_in_v_propagates() -> None:
    """At x_m = z_n the flat inner term contributes 0 (Laplace-L2's e' is infinite there, |x − z|'s sign is 0),
    as torch.cdist's subgradient; a NaN in v reaches every row of x's gradient, as in the dense product."""
    x = _randn(4, 3, seed=16)
    z = torch.cat([x[1:3], _randn(3, 3, seed=17)])
    v, g = _randn(5, 2, seed=18), _randn(4, 2, seed=19)
    for name in ("laplace_l1", "l1_distance", "lp_distance"):  # the last: e' = (1/p) acc^(1/p − 1) is infinite
        kw = ({"bandwidth": 0.7} if presets.ALL[name].needs_bandwidth else {}) | (
            {"p": 1.5} if presets.ALL[name].needs_p else {}
        )
        leaves = [t.clone().requires_grad_() for t in (x, z)]
        got = torch.autograd.grad(kermac.kernel_product(name, *leaves, v, backend="torch", **kw), leaves, g)
        want = _dense_gradients(name, x, z, v, g, **kw)
        for a, b in zip(got, want, strict=True):
            assert torch.isfinite(a).all()
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    key, hypers = lower_kernel("laplace_l1", x, None, 0.7, None, False)
    nan_v = v.clone()
    nan_v[3, 1] = float("nan")
    assert ops.product_grad(key, x, z, nan_v, g, hypers, backend="torch").isnan().all()


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_a_power_below_one_takes_zero_at_coordinate_ties(backend: str) -> None:
    """|x − z|^P with P < 1 (here a hyperparameter, Laplace-Lp, and a constant, a user program): where one coordinate
    of x equals that of a centre, P·sgn(t)·|t|^(P−1) is 0·∞; the x and z gradients take 0 there, as the dense
    product's autograd (cdist_grad's convention), finite everywhere."""
    require_backend(backend, "cpu", "product")
    dtype = F64 if backend == "torch" else torch.float32
    z, v, g = _randn(13, 3, seed=26), _randn(13, 2, seed=27), _randn(7, 2, seed=28)
    x = _randn(7, 3, seed=29)
    rows = torch.arange(7)
    x[rows, rows % 3] = z[rows, rows % 3]
    user = PairwiseProgram(kermac.ir.pow(abs(kermac.ir.Var("x") - kermac.ir.Var("z")), 0.5), "sum",
                           kermac.ir.exp(-kermac.ir.Var("acc")))  # fmt: skip
    for run, dense in (
        (lambda a, b: kermac.kernel_product("laplace_lp", a, b, v.to(dtype), bandwidth=1.3, p=0.6, backend=backend),
         lambda a, b: kermac.run_kernel("laplace_lp", a, b, bandwidth=1.3, p=0.6, backend="torch") @ v),
        (lambda a, b: kermac.program_product(user, a, b, v.to(dtype), backend=backend),
         lambda a, b: kermac.run_program(user, a, b, backend="torch") @ v),
    ):  # fmt: skip
        leaves = [t.to(dtype).requires_grad_() for t in (x, z)]
        got = torch.autograd.grad(run(*leaves), leaves, g.to(dtype))
        exact = [t.clone().requires_grad_() for t in (x, z)]
        want = torch.autograd.grad(dense(*exact), exact, g)
        tol = 1e-12 if dtype == F64 else 3e-5
        for a, b in zip(got, want, strict=True):
            assert torch.isfinite(b).all() and torch.isfinite(a).all()
            torch.testing.assert_close(a.double(), b, rtol=tol, atol=tol * b.abs().max().item())


def test_acc_zero_keeps_the_slope_where_the_inner_term_is_not_flat() -> None:
    """For x·z, acc = 0 (orthogonal points) does not make the inner derivative 0: the term keeps e'(0)·z, as torch
    autograd of the dense program gives (the 0-at-acc-0 convention of slope_program holds for Σ(x − z)² only)."""
    program = PairwiseProgram(kermac.ir.Var("x") * kermac.ir.Var("z"), "sum", kermac.ir.exp(kermac.ir.Var("acc")))
    x = torch.tensor([[1.0, 0.0], [0.5, 2.0]], dtype=F64, requires_grad=True)
    z = torch.tensor([[0.0, 3.0], [1.0, 1.0], [-2.0, 0.5]], dtype=F64, requires_grad=True)  # acc[0, 0] = acc[1, 2] = 0
    v, g = _randn(3, 2, seed=24), _randn(2, 2, seed=25)
    got = torch.autograd.grad(kermac.program_product(program, x, z, v, backend="torch"), (x, z), g)
    want = torch.autograd.grad(dense_kernel(program, x, z) @ v, (x, z), g)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_narrow_inputs_are_computed_in_float32(dtype: torch.dtype) -> None:
    x, z = _randn(6, 4, seed=20, dtype=dtype), _randn(8, 4, seed=21, dtype=dtype)
    v, g = _randn(8, 2, seed=22, dtype=dtype), _randn(6, 2, seed=23, dtype=dtype)
    key, hypers = lower_kernel("laplace_l1", x, None, 1.5, None, False)
    got = ops.product_grad(key, x, z, v, g, hypers, backend="torch")
    want = _dense_gradients("laplace_l1", *(t.double() for t in (x, z, v, g)), bandwidth=1.5)[0]
    assert got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * want.abs().max().item())


# -- refusals ---------------------------------------------------------------------------------------


_X, _Z, _ACC = kermac.ir.Var("x"), kermac.ir.Var("z"), kermac.ir.Var("acc")
WEIGHTED = {
    "min": PairwiseProgram((_X - _Z) * (_X - _Z), "min", kermac.ir.exp(-_ACC)),
    "max": PairwiseProgram(abs(_X - 0.5 * _Z), "max", 1.0 / (1.0 + _ACC)),
    "logsumexp": testing.SOFT_MIN,
}
"""Programs whose reduction weighs each feature's derivative by `∂acc/∂τ_j` (not all 1)."""


def _dense_program_gradients(program, x, z, v, g, hypers) -> tuple[torch.Tensor, torch.Tensor]:
    """`(∂L/∂x, ∂L/∂z)` of `L = Σ g ⊙ (K v)` by torch autograd of the program evaluated densely in float64
    (`torch.amax`, `torch.amin`, `torch.logsumexp` over the features: ties share a maximum's gradient equally)."""
    x, z = x.detach().requires_grad_(), z.detach().requires_grad_()
    out = dense_kernel(program, x, z, hypers) @ v
    return torch.autograd.grad((out * g).sum(), (x, z))


@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
@pytest.mark.parametrize("reduction", sorted(WEIGHTED))
def test_every_reduction_differentiates_in_x_and_z(reduction: str, ties: bool) -> None:
    """A maximum, minimum or log-sum-exp over features: the gradient product weighs each feature by the
    reduction's `∂acc/∂τ_j` (1/k on k tied extremes, the softmax for log-sum-exp), on the reference backend, in
    small blocks too; odd sizes and a broadcast batch."""
    program = WEIGHTED[reduction]
    hypers = {"gamma": 0.7} if reduction == "logsumexp" else {}
    x, z = _randn(2, 7, 5, seed=1), _randn(9, 5, seed=2)
    if ties:  # a coarse grid: many features tie for the extreme of a pair
        x, z = x.mul(2).round(), z.mul(2).round()
    v, g = _randn(9, 3, seed=3), _randn(2, 7, 3, seed=4)
    want_x, want_z = _dense_program_gradients(program, x, z, v, g, hypers)
    xr, zr = x.clone().requires_grad_(), z.clone().requires_grad_()
    out = kermac.program_product(program, xr, zr, v, backend="torch", **hypers)
    got_x, got_z = torch.autograd.grad((out * g).sum(), (xr, zr))
    torch.testing.assert_close(got_x, want_x, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got_z, want_z, rtol=1e-10, atol=1e-12)
    direct = ops.product_grad(program.key(), x, z, v, g, _hypers(program, hypers), backend="torch")
    torch.testing.assert_close(direct, want_x, rtol=1e-10, atol=1e-12)


def test_weighted_reductions_in_small_blocks_and_by_gradcheck(monkeypatch) -> None:
    """The same sums when every block holds one pair, and `gradcheck` of the product in x and z in float64."""
    program, hypers = testing.SOFT_MIN, {"gamma": 0.4}
    x, z, v, g = _randn(5, 3, seed=5), _randn(4, 3, seed=6), _randn(4, 2, seed=7), _randn(5, 2, seed=8)
    want = ops.product_grad(program.key(), x, z, v, g, _hypers(program, hypers), backend="torch")
    monkeypatch.setattr(reference, "CHUNK_ELEMENTS", 1)
    got = ops.product_grad(program.key(), x, z, v, g, _hypers(program, hypers), backend="torch")
    torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-14)
    monkeypatch.undo()
    for reduction in ("max", "logsumexp"):
        p = WEIGHTED[reduction]
        h = {"gamma": 0.4} if reduction == "logsumexp" else {}
        assert torch.autograd.gradcheck(
            lambda xx, zz, p=p, h=h: kermac.program_product(p, xx, zz, v, backend="torch", **h),
            (x.clone().requires_grad_(), z.clone().requires_grad_()),
        )


def test_a_nan_extreme_gives_nan_and_a_weightless_term_with_an_infinite_slope_gives_zero() -> None:
    """A NaN feature makes its pair's maximum NaN and the gradient NaN (torch's); a feature the maximum passes
    over contributes 0 even where the epilogue's slope is infinite (√acc at acc = 0)."""
    program = PairwiseProgram(abs(_X - _Z), "max", kermac.ir.sqrt(_ACC))
    x = torch.tensor([[0.0, 1.0], [float("nan"), 0.0]], dtype=F64)
    z = torch.tensor([[0.0, 3.0]], dtype=F64)
    v, g = torch.ones(1, 1, dtype=F64), torch.ones(2, 1, dtype=F64)
    got = ops.product_grad(program.key(), x, z, v, g, {}, backend="torch")
    assert bool(got[1].isnan().any())
    want_x, _ = _dense_program_gradients(program, x[:1], z, v, g[:1], {})
    torch.testing.assert_close(got[:1], want_x, rtol=1e-12, atol=0)
    x0 = torch.tensor([[0.0, 3.0]], dtype=F64)  # x = z: acc = 0, every term flat or weightless
    assert torch.equal(
        ops.product_grad(program.key(), x0, z, v, g[:1], {}, backend="torch"), torch.zeros(1, 2, dtype=F64)
    )


def _hypers(program: PairwiseProgram, values: dict) -> dict:
    return program_hypers(program.hypers, values, torch.device("cpu"), False)


def test_second_derivatives_are_refused_naming_the_program() -> None:
    x, z = _randn(3, 2, seed=1).requires_grad_(), _randn(4, 2, seed=2).requires_grad_()
    out = kermac.kernel_product("laplace_l1", x, z, _randn(4, 1, seed=3), bandwidth=1.0, backend="torch")
    (gx,) = torch.autograd.grad(out.sum(), x, create_graph=True)
    key = re.escape(presets.ALL["laplace_l1"].lower().key())
    with pytest.raises(NotImplementedError, match=rf"kernel_product: second derivatives .* program {key} has first"):
        torch.autograd.grad(gx.sum(), x)


def test_a_backend_without_the_operation_refuses_with_a_sentence() -> None:
    x = torch.zeros(3, 2)
    problem = product_grad_problem(presets.ALL["laplace_l1"].lower(), x, x, x, x, out=None, hypers={})
    assert (
        PairwiseOnlyBackend().check_product_grad(problem)
        == "backend 'old' does not compute gradients of fused kernel products"
    )
    with pytest.raises(NotImplementedError, match="backend 'old' does not compute gradients of fused kernel products"):
        PairwiseOnlyBackend().product_grad(problem)


# -- bad input --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"g": _randn(4, 2, seed=1)}, ValueError, r"g: expected sizes \[3, 2\] in the last two dimensions .* \[4, 2\]"),
        (
            {"g": _randn(3, 1, seed=1)},
            ValueError,
            r"g: expected sizes \[3, 2\] .*C \(v.shape\[-1\]\), got shape \[3, 1\]",
        ),
        ({"g": _randn(3, 2, seed=1).float()}, TypeError, r"g: expected dtype torch.float64 \(the dtype of x\)"),
        ({"v": _randn(5, 2, seed=1)}, ValueError, r"v: expected size 4 in dimension -2 to match N"),
        ({"z": _randn(4, 3, seed=1)}, ValueError, "z: expected 2 features"),
        ({"g": _randn(2, 3, 2, seed=1), "v": _randn(3, 4, 2, seed=2)}, ValueError, "batch dimensions do not broadcast"),
    ],
)
def test_bad_input_is_named(change: dict, error: type, message: str) -> None:
    args = {"x": _randn(3, 2, seed=1), "z": _randn(4, 2, seed=2), "v": _randn(4, 2, seed=3), "g": _randn(3, 2, seed=4)}
    args |= change
    key = presets.ALL["l1_distance"].lower().key()
    with pytest.raises(error, match=message):
        ops.product_grad(key, args["x"], args["z"], args["v"], args["g"], {}, backend="torch")


def test_out_and_meta_tensors() -> None:
    """`out=` receives the result; meta tensors give a meta result of the output's shape without a backend."""
    x, z, v, g = _randn(3, 2, seed=1), _randn(4, 2, seed=2), _randn(4, 2, seed=3), _randn(3, 2, seed=4)
    key = presets.ALL["l1_distance"].lower().key()
    out = torch.full((2, 3), float("nan"), dtype=F64).mT
    assert ops.product_grad(key, x, z, v, g, {}, out=out, backend="torch") is out
    torch.testing.assert_close(out, ops.product_grad(key, x, z, v, g, {}, backend="torch"))
    meta = ops.product_grad(key, *(t.to("meta") for t in (x, z, v, g)), {})
    assert meta.is_meta and meta.shape == (3, 2)
    with pytest.raises(ValueError, match=r"out: expected shape \[3, 2\], got \[2, 3\]"):
        ops.product_grad(key, x, z, v, g, {}, out=torch.empty(2, 3, dtype=F64), backend="torch")


def test_compile_fullgraph_forward_and_backward() -> None:
    """One graph around a Laplace-L1 product and its backward (which calls kermac::product_grad), matching eager."""

    def f(x, z, v, bw):
        return kermac.kernel_product("laplace_l1", x, z, v, bandwidth=bw, regularization=0.1, backend="torch")

    x, z, v = _randn(6, 3, seed=1), _randn(8, 3, seed=2), _randn(8, 2, seed=3)
    bw = torch.tensor([1.2], dtype=F64)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    eager_in = [t.clone().requires_grad_() for t in (x, z, v)]
    compiled_in = [t.clone().requires_grad_() for t in (x, z, v)]
    expected, got = f(*eager_in, bw), compiled(*compiled_in, bw)
    torch.testing.assert_close(got, expected)
    expected.square().sum().backward()
    got.square().sum().backward()
    for a, b in zip(compiled_in, eager_in, strict=True):
        torch.testing.assert_close(a.grad, b.grad)


# -- on the GPU (`pytest -m gpu`) -------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["laplace_l1", "laplace_lp", "dot_product"])
def test_auto_computes_the_cuda_gradient_on_the_triton_backend(name: str) -> None:
    """On CUDA float32, `auto` runs the gradient product on the Triton backend (NVRTC refuses it; Triton ranks above
    the reference backend): x and z gradients against the float64 dense ones."""
    kw = _kw(name) | ({"regularization": 0.1} if presets.ALL[name].needs_bandwidth else {})
    x, z = _randn(2, 301, 17, seed=1), _randn(517, 17, seed=2)
    v, g = _randn(517, 5, seed=3), _randn(2, 301, 5, seed=4)
    want = _dense_gradients(name, x, z, v, g, **kw)
    xs, zs, vs, gs = (t.to("cuda", torch.float32) for t in (x, z, v, g))
    key, hypers = lower_kernel(name, xs, kw.get("p"), kw.get("bandwidth"), kw.get("regularization"), False)
    problem = product_grad_problem(program_from_key(key), xs, zs, vs, gs, out=None, hypers=hypers)
    chosen = registry.select_backend("auto", problem, lambda b, pr: b.check_product_grad(pr), "gradient product")
    assert chosen.name == "triton"
    leaves = [xs.requires_grad_(), zs.requires_grad_()]
    out = kermac.kernel_product(name, *leaves, vs, **kw)
    got = torch.autograd.grad(out, leaves, gs)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a.double().cpu(), b, rtol=1e-4, atol=1e-4 * b.abs().max().item())


@pytest.mark.gpu
def test_the_cuda_gradient_product_never_holds_the_kernel_matrix() -> None:
    """M = N = 20,000: K alone would take 1.6 GB in float32; the gradient product's peak stays within its
    documented workspace (the blocks of at most CHUNK_ELEMENTS elements) plus O((M + N)(D + C)) tensors."""
    m, n, d, c = 20_000, 20_000, 8, 2
    gen = torch.Generator(device="cuda").manual_seed(0)
    x, z = (torch.randn(s, d, device="cuda", generator=gen) for s in (m, n))
    v, g = torch.randn(n, c, device="cuda", generator=gen), torch.randn(m, c, device="cuda", generator=gen)
    key, hypers = lower_kernel("laplace_l1", x, None, 2.0, None, False)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = ops.product_grad(key, x, z, v, g, hypers)
    torch.cuda.synchronize()
    assert out.shape == (m, d) and torch.isfinite(out).all()
    assert torch.cuda.max_memory_allocated() - base < 16 * reference.CHUNK_ELEMENTS * 4 + 16 * (m + n) * (d + c) * 4
