"""`kermac.predictor_gradient`: the gradient of `f(x) = K(x, z) α` at every point, against torch autograd of the
dense float64 predictor (`run_kernel` on the reference backend, then a matmul), for the kernels on Σ (x − z)² and
the other sum-reduced kernels (one gradient product per output column), batches, a 1-D α, empty sizes and user
programs; the refusal of maxima and bad input named."""

from __future__ import annotations

import pytest
import torch
from dense_programs import dense_kernel
from helpers import BACKEND_DEVICES, require_backend

import kermac
from kermac import ir
from kermac.programs import PairwiseProgram
from kermac.testing import SOFT_MIN

F64 = torch.float64
SQUARED = ["gaussian", "laplace_l2", "matern32", "matern52", "cauchy", "l2_distance"]


def _randn(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


def _dense_jacobian(predictor, x: torch.Tensor) -> torch.Tensor:
    """`J[..., m, c, j] = ∂f(x)[..., m, c] / ∂x[..., m, j]` by torch autograd of the dense predictor."""
    x = x.detach().requires_grad_(True)
    out = predictor(x)
    rows = []
    for c in range(out.shape[-1]):
        (g,) = torch.autograd.grad(out[..., c].sum(), x, retain_graph=True)  # rows of x are independent
        rows.append(g)
    return torch.stack(rows, dim=-2)


def _bandwidth(name: str) -> dict:
    return {"bandwidth": 1.3} if kermac.presets.ALL[name].needs_bandwidth else {}


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
@pytest.mark.parametrize("name", SQUARED)
def test_matches_autograd_of_the_dense_predictor(backend: str, device: str, name: str) -> None:
    require_backend(backend, device, "product")
    dtype = F64 if backend == "torch" else torch.float32
    # z offset from x so no distance is 0 (l2's derivative is infinite there; the slope program takes 0)
    x, z, alpha = _randn(37, 5, seed=1), _randn(53, 5, seed=2) + 0.25, _randn(53, 3, seed=3)
    kw = _bandwidth(name)
    want = _dense_jacobian(lambda xx: kermac.run_kernel(name, xx, z, backend="torch", **kw) @ alpha, x)
    got = kermac.predictor_gradient(name, *(t.to(device, dtype) for t in (x, z, alpha)), backend=backend, **kw)
    assert got.shape == (37, 3, 5) and got.dtype == dtype
    tol = 1e-10 if dtype == F64 else 3e-5
    torch.testing.assert_close(got.double().cpu(), want, rtol=tol, atol=tol * want.abs().max().item())


def test_batches_broadcast_and_a_vector_alpha_gives_one_output() -> None:
    x, z, alpha = _randn(2, 6, 4, seed=4), _randn(9, 4, seed=5), _randn(2, 9, 2, seed=6)
    want = _dense_jacobian(lambda xx: kermac.run_kernel("gaussian", xx, z, bandwidth=2.0) @ alpha, x)
    got = kermac.predictor_gradient("gaussian", x, z, alpha, bandwidth=2.0)
    assert got.shape == (2, 6, 2, 4)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    one = kermac.predictor_gradient("gaussian", x, z, alpha[0, :, 0], bandwidth=2.0)  # batch 0's first output
    assert one.shape == (2, 6, 4)
    torch.testing.assert_close(one[0], got[0, :, 0, :], rtol=1e-12, atol=1e-14)


def test_a_batched_bandwidth_and_a_user_program() -> None:
    x, z, alpha = _randn(3, 5, 2, seed=7), _randn(3, 8, 2, seed=8), _randn(3, 8, 1, seed=9)
    sigma = torch.tensor([0.7, 1.0, 2.5], dtype=F64)  # one bandwidth per batch entry
    want = _dense_jacobian(lambda xx: kermac.run_kernel("gaussian", xx, z, bandwidth=sigma) @ alpha, x)
    torch.testing.assert_close(
        kermac.predictor_gradient("gaussian", x, z, alpha, bandwidth=sigma), want, rtol=1e-10, atol=1e-12
    )
    t = ir.Var("x") - ir.Var("z")
    cauchy = PairwiseProgram(t * t, "sum", 1.0 / (1.0 + ir.Hyper("gamma") * ir.Var("acc")))
    want = _dense_jacobian(lambda xx: kermac.run_program(cauchy, xx, z, hypers={"gamma": 0.4}) @ alpha, x)
    torch.testing.assert_close(kermac.predictor_gradient(cauchy, x, z, alpha, gamma=0.4), want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("m", "n", "c", "d"), [(0, 4, 2, 3), (4, 0, 2, 3), (4, 5, 0, 3), (4, 5, 2, 0)])
def test_empty_sizes(m: int, n: int, c: int, d: int) -> None:
    got = kermac.predictor_gradient(
        "gaussian", _randn(m, d, seed=1), _randn(n, d, seed=2), _randn(n, c, seed=3), bandwidth=1.0
    )
    assert got.shape == (m, c, d) and not got.any()


def test_the_result_is_differentiable() -> None:
    x, z = _randn(4, 3, seed=10), _randn(6, 3, seed=11)
    alpha = _randn(6, 2, seed=12).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a: kermac.predictor_gradient("gaussian", x, z, a, bandwidth=1.5), (alpha,))


OTHER_SUMS = [
    ("laplace_l1", {"bandwidth": 1.3}),
    ("l1_distance", {}),
    ("laplace_lp", {"bandwidth": 1.3, "p": 1.5}),
    ("lp_distance", {"p": 3.0}),
    ("dot_product", {}),
]


@pytest.mark.parametrize(("name", "kw"), OTHER_SUMS, ids=[n for n, _ in OTHER_SUMS])
def test_other_sum_reduced_kernels_match_autograd_of_the_dense_predictor(name: str, kw: dict) -> None:
    """Laplace-L1 and the other kernels not on Σ (x − z)²: one gradient product per output column, broadcast batch."""
    x, z, alpha = _randn(2, 7, 4, seed=13), _randn(11, 4, seed=14) + 0.1, _randn(2, 11, 3, seed=15)
    want = _dense_jacobian(lambda xx: kermac.run_kernel(name, xx, z, backend="torch", **kw) @ alpha, x)
    got = kermac.predictor_gradient(name, x, z, alpha, backend="torch", **kw)
    assert got.shape == (2, 7, 3, 4)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    one = kermac.predictor_gradient(name, x, z, alpha[1, :, 2], **kw)  # a 1-D alpha: one output
    assert one.shape == (2, 7, 4)
    torch.testing.assert_close(one[1], got[1, :, 2, :], rtol=1e-12, atol=1e-14)


def test_a_user_program_with_a_batched_hyperparameter_and_no_columns() -> None:
    """A sum of a smooth non-difference term with a per-batch hyperparameter; C = 0 gives an empty Jacobian."""
    x, z, alpha = _randn(2, 5, 3, seed=16), _randn(2, 6, 3, seed=17), _randn(2, 6, 2, seed=18)
    program = PairwiseProgram(ir.log(1.0 + ir.Hyper("s") * (ir.Var("x") - ir.Var("z")) ** 2), "sum", -ir.Var("acc"))
    s = torch.tensor([0.5, 2.0], dtype=F64)
    want = _dense_jacobian(lambda xx: dense_kernel(program, xx, z, {"s": s}) @ alpha, x)
    torch.testing.assert_close(kermac.predictor_gradient(program, x, z, alpha, s=s), want, rtol=1e-10, atol=1e-12)
    empty = kermac.predictor_gradient(program, x, z, alpha[..., :0], s=s)
    assert empty.shape == (2, 5, 0, 3)


@pytest.mark.parametrize("kernel", ["linf_distance", "soft_min"])
def test_maxima_and_log_sum_exps_over_features(kernel: str) -> None:
    """The l∞ distance and a soft minimum (a maximum and a log-sum-exp over features): the Jacobian of the dense
    float64 predictor, through the gradient product's weighted features."""
    x, z, alpha = _randn(4, 3, seed=1), _randn(6, 3, seed=3), _randn(6, 2, seed=2)
    if kernel == "soft_min":
        program, hypers = SOFT_MIN, {"gamma": 0.5}
        got = kermac.predictor_gradient(SOFT_MIN, x, z, alpha, **hypers)
    else:
        program, hypers = kermac.presets.ALL["linf_distance"].lower(), {}
        got = kermac.predictor_gradient("linf_distance", x, z, alpha)
    want = _dense_jacobian(lambda xx: dense_kernel(program, xx, z, hypers) @ alpha, x)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    ("alpha", "kw", "error", "message"),
    [
        (_randn(5, 2, seed=3), {}, ValueError, r"alpha: expected 4 rows \(N, z.shape\[-2\]\), got shape \[5, 2\]"),
        (_randn(4, 2, seed=3).float(), {}, TypeError, "alpha: expected a tensor of x's dtype and device"),
        ([1.0, 2.0], {}, TypeError, "alpha: expected a torch.Tensor, got list"),
        (_randn(4, 2, seed=3), {"gamma": 1.0}, TypeError, r"unexpected keyword arguments \['gamma'\]"),
        (_randn(4, 2, seed=3), {"bandwidth": None}, ValueError, "bandwidth: required by descriptor"),
    ],
)
def test_bad_input_is_named(alpha: object, kw: dict, error: type, message: str) -> None:
    x = _randn(4, 3, seed=1)
    kw = {"bandwidth": 1.0} | kw
    if kw["bandwidth"] is None:
        del kw["bandwidth"]
    with pytest.raises(error, match=message):
        kermac.predictor_gradient("gaussian", x, x, alpha, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize(("name", "kw"), OTHER_SUMS, ids=[n for n, _ in OTHER_SUMS])
def test_other_sum_reduced_kernels_on_cuda(name: str, kw: dict) -> None:
    """float32 on CUDA with `auto` (the gradient products run where a backend accepts them: the reference backend
    while the GPU backends refuse them) against the float64 dense Jacobian."""
    x, z, alpha = _randn(67, 9, seed=19), _randn(131, 9, seed=20) + 0.1, _randn(131, 2, seed=21)
    want = _dense_jacobian(lambda xx: kermac.run_kernel(name, xx, z, backend="torch", **kw) @ alpha, x)
    got = kermac.predictor_gradient(name, *(t.to("cuda", torch.float32) for t in (x, z, alpha)), **kw)
    assert got.shape == (67, 2, 9) and got.dtype == torch.float32
    torch.testing.assert_close(got.double().cpu(), want, rtol=3e-5, atol=3e-5 * want.abs().max().item())


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
@pytest.mark.parametrize(("name", "kw"), [("laplace_lp", {"bandwidth": 1.3, "p": 0.6}), ("lp_distance", {"p": 0.5})])
def test_a_power_below_one_at_coordinate_ties(backend: str, device: str, name: str, kw: dict) -> None:
    """|x − z|^P with P < 1 has no derivative where a coordinate of x equals that of a centre; as `cdist_grad` and
    the dense predictor's autograd, the fused gradient takes 0 there (not ∞·0 = NaN): one coordinate per point tied."""
    require_backend(backend, device, "product")
    dtype = F64 if backend == "torch" else torch.float32
    z, alpha = _randn(13, 3, seed=22), _randn(13, 2, seed=23)
    x = _randn(7, 3, seed=24)
    x[torch.arange(7), torch.arange(7) % 3] = z[torch.arange(7), torch.arange(7) % 3]
    want = _dense_jacobian(lambda xx: kermac.run_kernel(name, xx, z, backend="torch", **kw) @ alpha, x)
    assert torch.isfinite(want).all()
    got = kermac.predictor_gradient(name, *(t.to(device, dtype) for t in (x, z, alpha)), backend=backend, **kw)
    tol = 1e-10 if dtype == F64 else 3e-5
    torch.testing.assert_close(got.double().cpu(), want, rtol=tol, atol=tol * want.abs().max().item())
