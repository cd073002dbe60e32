"""The reductions over features as semirings (`kermac.reductions`): the registry's facts checked against torch,
and log-sum-exp programs on the backends that run here (the reference and Triton's interpreter) against
independent float64 formulas built on an explicit `[..., M, N, D]` tensor of terms; their kernel products and
gradients likewise.  NVRTC compiles its log-sum-exp variants in `test_nvrtc_codegen.py` / `test_nvrtc_product.py`;
every backend runs the conformance cases of `kermac.testing` (`SOFT_MIN`)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from helpers import BACKEND_DEVICES, require_backend

import kermac
from kermac import ir, reductions
from kermac.ir_eval import evaluate
from kermac.programs import REDUCTIONS, PairwiseProgram, is_squared_difference_sum
from kermac.testing import SOFT_MIN, assert_matches_reference

INF, NAN = math.inf, math.nan
SPECIAL = torch.tensor([-INF, -50.0, -1.5, -0.0, 0.0, 1e-3, 2.0, 30.0, INF, NAN], dtype=torch.float64)
"""Terms with every kind of special value."""
X, Z, ACC = ir.Var("x"), ir.Var("z"), ir.Var("acc")


def _combine(name: str, acc: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    shape = torch.broadcast_shapes(acc.shape, t.shape)
    return evaluate(reductions.ALL[name].combine, {"acc": acc, "t": t}, like=acc).expand(shape)


def _fold(name: str, terms: torch.Tensor) -> torch.Tensor:
    """The reduction of `terms` over their last dimension, one combine at a time from the identity."""
    acc = torch.full(terms.shape[:-1], reductions.ALL[name].identity, dtype=terms.dtype)
    for j in range(terms.shape[-1]):
        acc = _combine(name, acc, terms[..., j])
    return acc


def _same(a: torch.Tensor, b: torch.Tensor, rtol: float = 0.0) -> bool:
    """Equal NaN and infinite entries, finite ones within `rtol` (relative to the larger magnitude, or 1)."""
    infinities = (torch.where(t.isinf(), t, 0.0) for t in (a, b))
    if not torch.equal(a.isnan(), b.isnan()) or not torch.equal(*infinities):
        return False
    finite = a.isfinite() & b.isfinite()
    if not torch.equal(finite, a.isfinite()):
        return False
    scale = torch.maximum(a.abs(), b.abs()).clamp(min=1.0)
    return bool(((a - b).abs() <= rtol * scale)[finite].all())


def test_programs_accept_every_registered_reduction() -> None:
    """`kermac.programs.REDUCTIONS` is the registry's names with their identities; another name is refused,
    naming them."""
    assert dict(REDUCTIONS) == {"sum": 0.0, "max": -INF, "min": INF, "logsumexp": -INF}
    assert PairwiseProgram(X - Z, "logsumexp", ACC).identity == -INF
    with pytest.raises(ValueError, match=r"reduction: expected one of \['logsumexp', 'max', 'min', 'sum'\], got 'lse'"):
        PairwiseProgram(X - Z, "lse", ACC)


def test_a_reduction_reads_only_acc_and_a_term() -> None:
    with pytest.raises(ValueError, match=r"combine: may use variables \['acc', 't'\], got unknown \['x'\]"):
        reductions.Reduction("bad", "bad", 0.0, ACC + X, torch.sum, ir.Const(1.0), normalized=False, nonnegative=True)
    with pytest.raises(ValueError, match=r"weight: may not read hyperparameters, got \['h'\]"):
        reductions.Reduction("bad", "bad", 0.0, ACC, torch.sum, ir.Hyper("h"), normalized=False, nonnegative=True)
    with pytest.raises(TypeError, match=r"combine: expected a kermac\.ir\.Expr, got str"):
        reductions.Reduction("bad", "bad", 0.0, "acc + t", torch.sum, ir.Const(1.0), normalized=False, nonnegative=True)


@pytest.mark.parametrize("name", sorted(reductions.ALL))
def test_the_identity_is_neutral(name: str) -> None:
    identity = torch.full_like(SPECIAL, reductions.ALL[name].identity)
    assert _same(_combine(name, identity, SPECIAL), SPECIAL)
    assert _same(_combine(name, SPECIAL, identity), SPECIAL)


@pytest.mark.parametrize("name", sorted(reductions.ALL))
def test_the_combine_is_commutative_and_associative(name: str) -> None:
    """What lets a backend reduce blocks of features in any order (Triton reduces a chunk as a tree)."""
    values = torch.cat([SPECIAL, torch.randn(6, dtype=torch.float64) * 3])
    a, b, c = (t.reshape(-1) for t in torch.meshgrid(values, values, values, indexing="ij"))
    assert _same(_combine(name, a, b), _combine(name, b, a))
    assert _same(_combine(name, _combine(name, a, b), c), _combine(name, a, _combine(name, b, c)), rtol=1e-14)


@pytest.mark.parametrize("name", sorted(reductions.ALL))
def test_folding_the_combine_gives_the_reference(name: str) -> None:
    """The combine folded term by term equals the torch function the reference backend reduces with, special
    values included: rows of one kind of special value, with and without finite terms, and an empty row."""
    terms = torch.randn(40, 13, dtype=torch.float64) * 4
    rows = [[-INF], [INF], [NAN], [-INF, INF], [NAN, INF], [NAN, -INF], [INF, INF], [-INF, -INF]]
    for i, row in enumerate(rows):
        terms[2 * i, : len(row)] = torch.tensor(row)  # with finite terms
        terms[2 * i + 1, :] = row[-1]  # every term the same special value
        terms[2 * i + 1, : len(row)] = torch.tensor(row)
    spec = reductions.ALL[name]
    assert _same(_fold(name, terms), spec.reference(terms, -1), rtol=1e-13)
    assert _fold(name, terms[:, :0]).eq(spec.identity).all()


def test_logsumexp_is_torch_logsumexp_and_stable() -> None:
    """Terms far beyond exp's range (±1e4) combine without overflow, as log Σ exp in exact arithmetic."""
    terms = torch.tensor([[1e4, 1e4 - 1.0, -1e4], [-1e4, -1e4, -1e4 - 2.0]], dtype=torch.float64)
    exact = [1e4 + math.log1p(math.exp(-1.0)), -1e4 + math.log(2.0 + math.exp(-2.0))]
    expected = torch.tensor(exact, dtype=torch.float64)
    torch.testing.assert_close(_fold("logsumexp", terms), expected, rtol=1e-15, atol=0)
    torch.testing.assert_close(_fold("logsumexp", terms.float()), expected.float(), rtol=1e-6, atol=0)


@pytest.mark.parametrize("name", sorted(reductions.ALL))
def test_term_weights_are_the_derivatives(name: str) -> None:
    """`term_weights` is the gradient torch's autograd gives the reference function: 1 for a sum, the softmax for
    log-sum-exp, the gradient shared equally among tied extremes for max and min."""
    terms = (torch.randn(30, 11, dtype=torch.float64) * 2).round()  # ties
    terms.requires_grad_(True)
    (expected,) = torch.autograd.grad(reductions.ALL[name].reference(terms, -1).sum(), terms)
    torch.testing.assert_close(reductions.term_weights(name, terms.detach()), expected, rtol=1e-14, atol=0)


@pytest.mark.parametrize("name", sorted(reductions.ALL))
def test_nonnegative_is_what_nonnegative_terms_give(name: str) -> None:
    """`nonnegative`: every reduction of non-negative terms, the empty one included, is ≥ 0 exactly when it says so."""
    terms = torch.cat([SPECIAL[SPECIAL >= 0], torch.rand(5, dtype=torch.float64)])
    pairs = torch.tensor(list(itertools.product(terms.tolist(), repeat=2)), dtype=torch.float64)
    reduced = torch.cat([_fold(name, pairs), _fold(name, pairs[:1, :0])])
    assert reductions.ALL[name].nonnegative == bool((reduced >= 0).all())


def test_only_the_sum_takes_its_fast_paths() -> None:
    """A sum of (x − z)² under another reduction is not the (x − z)² sum the tensor cores expand."""
    squares = (X - Z) * (X - Z)
    assert [n for n, r in reductions.ALL.items() if r.sum_fast_paths] == ["sum"]
    assert is_squared_difference_sum(PairwiseProgram(squares, "sum", ACC))
    assert not is_squared_difference_sum(PairwiseProgram(squares, "logsumexp", ACC))


# --- log-sum-exp programs against explicit float64 formulas ------------------------------------------------


def _soft_min(x: torch.Tensor, z: torch.Tensor, gamma: float | torch.Tensor) -> torch.Tensor:
    """SOFT_MIN in float64 from the formula: −γ·logsumexp_k(−|x − z|/γ) over an explicit [..., M, N, D] tensor
    (a tensor γ has the batch dimensions)."""
    g = torch.as_tensor(gamma, device=x.device).double()[..., None, None]  # [..., 1, 1]
    terms = -(x.double()[..., :, None, :] - z.double()[..., None, :, :]).abs() / g[..., None]
    return -g * torch.logsumexp(terms, dim=-1)


def _inputs(
    shape_x: tuple[int, ...], shape_z: tuple[int, ...], dtype: torch.dtype, device: str, special: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(shape_x, dtype=torch.float64)
    z = torch.randn(shape_z, dtype=torch.float64)
    if special and x.shape[-1]:
        x[..., -1, :] = INF  # a row of +inf: every term −inf
        x[..., 0, 0] = NAN
        z[..., 2, -1] = -INF  # one infinite coordinate: no term
    return x.to(dtype=dtype, device=device), z.to(dtype=dtype, device=device)


SHAPES = {
    "odd": ((2, 7, 13), (9, 13)),
    "d0": ((7, 0), (9, 0)),
    "d1": ((7, 1), (9, 1)),
    "m1": ((1, 19), (29, 19)),
    "broadcast": ((2, 1, 5, 6), (3, 9, 6)),
}


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("special", [False, True], ids=["finite", "nan-inf"])
def test_soft_min_matches_the_formula(backend: str, device: str, dtype: torch.dtype, shape: str, special: bool) -> None:
    """No feature gives +∞ (−γ times the identity −∞); a NaN coordinate NaN; a row of +∞ every term −∞, so +∞."""
    require_backend(backend, device)
    x, z = _inputs(*SHAPES[shape], dtype, device, special and shape != "d0")
    got = kermac.run_program(SOFT_MIN, x, z, hypers={"gamma": 0.5}, backend=backend)
    rtol = 1e-13 if dtype == torch.float64 else 2e-6
    assert_matches_reference(got, _soft_min(x, z, 0.5), rtol=rtol, what=f"{backend} {shape}")
    if shape == "d0":
        assert got.eq(INF).all()


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["torch", "nvrtc", "triton"])
def test_soft_min_at_real_sizes(backend: str) -> None:
    """Sizes beyond every tile and a multiple of none, float32, against the float64 formula."""
    require_backend(backend, "cuda")
    x, z = _inputs((517, 131), (389, 131), torch.float32, "cuda", special=True)
    got = kermac.run_program(SOFT_MIN, x, z, hypers={"gamma": 0.5}, backend=backend)
    assert_matches_reference(got, _soft_min(x, z, 0.5), rtol=1e-5, what=backend)


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
def test_soft_min_of_views_with_batched_gamma(backend: str, device: str) -> None:
    """Transposed operands and a per-batch-entry γ broadcast against the batch (and half inputs, computed in
    float32)."""
    require_backend(backend, device)
    x = torch.randn(3, 1, 6, 7, dtype=torch.float64, device=device).mT  # [3, 1, 7, 6], transposed
    z = torch.randn(2, 6, 9, dtype=torch.float64, device=device).mT  # [2, 9, 6]
    gamma = torch.tensor([[0.25], [1.0], [4.0]], dtype=torch.float64, device=device)
    got = kermac.run_program(SOFT_MIN, x, z, hypers={"gamma": gamma}, backend=backend)
    assert_matches_reference(got, _soft_min(x, z, gamma), rtol=1e-13, what=backend)
    half = kermac.run_program(SOFT_MIN, x.half(), z.half(), hypers={"gamma": gamma.half()}, backend=backend)
    assert_matches_reference(half, _soft_min(x.half(), z.half(), gamma.half()), rtol=2e-3, what=f"{backend} half")


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
def test_soft_min_tends_to_the_minimum(backend: str, device: str) -> None:
    """0 ≤ min_k |x − z| − softmin_γ ≤ γ·log D: the soft minimum is a smooth lower bound of the minimum."""
    require_backend(backend, device)
    x, z = _inputs((11, 9), (13, 9), torch.float64, device)
    hard = (x[:, None, :] - z[None, :, :]).abs().amin(-1)
    for gamma in (1.0, 0.1, 0.01):
        gap = hard - kermac.run_program(SOFT_MIN, x, z, hypers={"gamma": gamma}, backend=backend)
        assert gap.min() >= -1e-12 and gap.max() <= gamma * math.log(9) + 1e-12


# --- products and gradients ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("transpose", [False, True])
def test_kernel_product_of_a_logsumexp_kernel(backend: str, device: str, dtype: torch.dtype, transpose: bool) -> None:
    """`K @ v` (`Kᵀ @ u`) of a log-sum-exp kernel, never materialised, against the explicit K in float64."""
    require_backend(backend, device, "product")
    program = PairwiseProgram(abs(X - Z) / ir.Hyper("gamma"), "logsumexp", ir.exp(-0.5 * ir.Hyper("gamma") * ACC))
    x, z = _inputs((2, 13, 5), (11, 5), dtype, device)
    v = torch.randn(2, 13 if transpose else 11, 3, dtype=torch.float64).to(dtype=dtype, device=device)
    terms = (x.double()[..., :, None, :] - z.double()[..., None, :, :]).abs() / 1.5
    k = torch.exp(-0.75 * torch.logsumexp(terms, dim=-1))
    expected = (k.mT if transpose else k) @ v.double()
    got = kermac.program_product(program, x, z, v, transpose=transpose, backend=backend, gamma=1.5)
    rtol = 1e-13 if dtype == torch.float64 else 2e-6
    assert_matches_reference(got, expected, rtol=rtol, what=backend)


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
def test_gradient_of_a_logsumexp_of_powered_differences(backend: str, device: str) -> None:
    """∂/∂x and ∂/∂z of e(logsumexp_k |x − z|^p) weigh each coordinate by its softmax weight
    (`kermac.reductions.term_weights`): equal to torch's autograd of the explicit float64 formula."""
    require_backend(backend, device)
    program = PairwiseProgram(ir.pow(abs(X - Z), ir.Hyper("p")), "logsumexp", ir.exp(-0.3 * ACC))
    x, z = (t.requires_grad_(True) for t in _inputs((2, 7, 5), (9, 5), torch.float64, device))
    g = torch.randn(2, 7, 9, dtype=torch.float64, device=device)
    got = torch.autograd.grad(kermac.run_program(program, x, z, hypers={"p": 1.5}, backend=backend), (x, z), g)
    formula = torch.exp(-0.3 * torch.logsumexp((x[..., :, None, :] - z[..., None, :, :]).abs() ** 1.5, -1))
    expected = torch.autograd.grad(formula, (x, z), g)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-13)


def test_a_logsumexp_product_differentiates_in_v_x_and_z() -> None:
    """∂L/∂v = Kᵀ g (the transposed product) and ∂L/∂x, ∂L/∂z by the gradient product weighing each feature by
    the softmax of the pair's terms, against autograd of the formula."""
    x, z = (t.requires_grad_(True) for t in _inputs((6, 4), (5, 4), torch.float64, "cpu"))
    v = torch.randn(5, 2, dtype=torch.float64, requires_grad=True)
    g = torch.randn(6, 2, dtype=torch.float64)
    out = kermac.program_product(SOFT_MIN, x, z, v, backend="torch", gamma=0.5)
    got = torch.autograd.grad(out, (x, z, v), g)
    expected = torch.autograd.grad(_soft_min(x, z, 0.5) @ v, (x, z, v), g)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-13)
