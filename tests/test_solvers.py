"""`kermac.solvers.solve`: every method against `torch.linalg.solve` in float64 on the reference backend,
Nyström preconditioning on an ill-conditioned system, the convergence report and bad input; every test over
CASES runs each method and CG preconditioner."""

from __future__ import annotations

import logging

import pytest
import torch
from solver_helpers import F64
from solver_helpers import kernel_operator as _operator
from solver_helpers import reference_solve as _reference
from solver_helpers import seeded_randn as _randn

import kermac
from kermac import solvers

CASES = [("cholesky", None), ("cg", None), ("cg", "nystrom"), ("cg", "eigenpro")]


@pytest.mark.parametrize("kernel", ["gaussian", "laplace_l2"])
@pytest.mark.parametrize(("method", "preconditioner"), CASES)
@pytest.mark.parametrize("columns", [None, 3])
def test_solve_matches_torch_linalg(kernel, method, preconditioner, columns):
    K = _operator(kernel, 37, 0.3)
    y = _randn(37, seed=5) if columns is None else _randn(37, columns, seed=5)
    s = solvers.solve(K, y, method=method, preconditioner=preconditioner, tol=1e-11, rank=9, check_every=3)
    expected = _reference(K, y)
    expected = expected[:, 0] if columns is None else expected
    torch.testing.assert_close(s.alpha, expected, rtol=1e-8, atol=1e-9)
    report_shape = () if columns is None else (columns,)
    assert s.converged.shape == s.residual.shape == s.iterations.shape == report_shape
    assert bool(s.converged.all()) and bool((s.residual <= 1e-11).all())
    assert s.method == method and s.preconditioner == preconditioner
    if method == "cg":
        assert bool((s.iterations > 0).all())


@pytest.mark.parametrize(("method", "preconditioner"), CASES)
def test_solve_batched_operator_and_batched_lambda(method, preconditioner):
    lam = torch.tensor([0.5, 0.05], dtype=F64)
    K = _operator("gaussian", 23, lam, batch=(2,))
    y = _randn(23, 2, seed=3)  # broadcast against the operator's batch
    s = solvers.solve(K, y, method=method, preconditioner=preconditioner, tol=1e-11, rank=7, check_every=1)
    assert s.alpha.shape == (2, 23, 2) and s.converged.shape == (2, 2)
    for b in range(2):
        x = K.x[b]
        a = torch.exp(-(torch.cdist(x, x) ** 2) / (2 * 1.3**2)) + lam[b] * torch.eye(23, dtype=F64)
        torch.testing.assert_close(s.alpha[b], torch.linalg.solve(a, y), rtol=1e-8, atol=1e-9)
    assert bool(s.converged.all())


def test_converged_columns_stop_changing():
    """A zero column converges at once (residual 0, α 0), and an easy column stops earlier than a hard one."""
    K = _operator("gaussian", 40, 0.1)
    easy = K @ torch.ones(40, dtype=F64)  # not an eigenvector, but smooth: fewer iterations than noise
    y = torch.stack([torch.zeros(40, dtype=F64), easy, _randn(40, seed=9)], dim=1)
    s = solvers.solve(K, y, method="cg", preconditioner=None, tol=1e-10, check_every=4)
    assert s.iterations[0] == 0 and bool((s.alpha[:, 0] == 0).all()) and s.residual[0] == 0
    assert s.iterations[1] < s.iterations[2]
    assert bool(s.converged.all())


def test_nystrom_reduces_iterations_on_ill_conditioned_system():
    K = _operator("gaussian", 60, 1e-3, seed=2)  # condition number about 2·10⁴: plain CG needs ~170 iterations
    y = _randn(60, 2, seed=4)
    plain = solvers.solve(K, y, method="cg", preconditioner=None, tol=1e-8, max_iter=2000)
    nys = solvers.solve(K, y, method="cg", preconditioner="nystrom", tol=1e-8, rank=20, max_iter=2000)
    assert bool(plain.converged.all()) and bool(nys.converged.all())
    assert int(nys.iterations.max()) * 2 < int(plain.iterations.min())
    torch.testing.assert_close(nys.alpha, _reference(K, y), rtol=1e-5, atol=1e-5)


def test_non_convergence_is_reported_and_raised_on_request():
    K = _operator("gaussian", 50, 1e-3)
    y = _randn(50, 2, seed=1)
    s = solvers.solve(K, y, method="cg", preconditioner=None, tol=1e-10, max_iter=2)
    assert not bool(s.converged.any())
    assert bool((s.iterations == 2).all()) and bool((s.residual > 1e-10).all())
    with pytest.raises(solvers.ConvergenceError, match="2 of 2 columns did not reach tol") as info:
        solvers.solve(K, y, method="cg", preconditioner=None, tol=1e-10, max_iter=2, raise_on_failure=True)
    assert not bool(info.value.solution.converged.any())


def test_auto_picks_cholesky_while_dense_fits(caplog, monkeypatch):
    K = _operator("gaussian", 30, 0.2)
    y = _randn(30, seed=2)
    with caplog.at_level(logging.DEBUG, logger="kermac"):
        s = solvers.solve(K, y, debug=True)
    assert s.method == "cholesky" and "picked 'cholesky'" in caplog.text
    monkeypatch.setattr(solvers, "dense_fits", lambda *args: False)
    with caplog.at_level(logging.DEBUG, logger="kermac"):
        s = solvers.solve(K, y, tol=1e-10, debug=True)
    assert s.method == "cg" and s.preconditioner == "eigenpro" and bool(s.converged)
    assert "cg with preconditioner 'eigenpro'" in caplog.text
    torch.testing.assert_close(s.alpha, _reference(K, y)[:, 0], rtol=1e-8, atol=1e-9)
    asked = []

    def too_large(rows, rank, batch, dtype, device):
        asked.append((rows, rank, batch, dtype, device))
        return False

    monkeypatch.setattr(solvers, "eigenpro_fits", too_large)
    s = solvers.solve(K, y, tol=1e-10)
    assert s.method == "cg" and s.preconditioner == "nystrom" and bool(s.converged)
    assert asked == [(30, 30, 1, F64, torch.device("cpu"))]  # q = min(N, max(100, ⌈√N⌉)) = N here
    torch.testing.assert_close(s.alpha, _reference(K, y)[:, 0], rtol=1e-8, atol=1e-9)
    asked.clear()
    s = solvers.solve(K, y, method="cg", preconditioner="nystrom", tol=1e-10)  # a named one is not asked about
    assert s.preconditioner == "nystrom" and not asked


def test_dense_fits_rule():
    """batch·N² entries within a quarter of the CPU budget of 4 GiB, whatever N."""
    assert solvers.dense_fits(20_000, 1, F64, torch.device("cpu")) is False  # 3.2 GB > a quarter of 4 GiB
    assert solvers.dense_fits(10_000, 1, F64, torch.device("cpu")) is True
    assert solvers.dense_fits(22_000, 1, torch.float16, torch.device("cpu")) is True  # 0.97 GB
    assert solvers.dense_fits(22_000, 1, torch.float32, torch.device("cpu")) is False  # 1.9 GB
    assert solvers.dense_fits(10_000, 3, F64, torch.device("cpu")) is False  # 2.4 GB


def test_auto_factors_in_float64_where_the_float32_factorisation_fails(caplog):
    """A float32 K + λI that is not positive definite in float32 rounding (small λ): a named "cholesky" raises;
    `auto` computes and factors the matrix again in float64, α then agreeing with a float64 solve."""
    x = _randn(200, 3, seed=11).float()
    y = _randn(200, 2, seed=12).float()
    K = kermac.KernelOperator("gaussian", x, x, bandwidth=3.0, regularization=1e-6, backend="torch")
    with pytest.raises(ValueError, match="K \\+ λI is not positive definite"):
        solvers.solve(K, y, method="cholesky")
    with caplog.at_level(logging.DEBUG, logger="kermac"):
        s = solvers.solve(K, y, debug=True)
    assert "the torch.float32 Cholesky factorisation failed; method='auto' factors in float64" in caplog.text
    assert s.method == "cholesky" and s.alpha.dtype == torch.float32 and bool(s.converged.all())
    x64 = x.double()
    d2 = torch.cdist(x64, x64, compute_mode="donot_use_mm_for_euclid_dist") ** 2
    want = torch.linalg.solve(torch.exp(-d2 / 18) + 1e-6 * torch.eye(200, dtype=F64), y.double())
    assert float((s.alpha.double() - want).norm() / want.norm()) < 1e-6


def test_auto_raises_where_the_float64_factorisation_fails_too(monkeypatch):
    """Only a narrower factorisation is retried: a float64 one that fails raises, as a named "cholesky" does."""
    K = _operator("gaussian", 30, 0.2)
    calls = []

    def failing(a, b):
        calls.append(a.dtype)
        return torch.full_like(b, float("nan")), torch.ones(a.shape[:-2], dtype=torch.int32)

    monkeypatch.setattr(solvers, "cholesky_solve", failing)
    with pytest.raises(ValueError, match="not positive definite"):
        solvers.solve(K, _randn(30, 2, seed=4))
    assert calls == [F64]
    calls.clear()
    with pytest.raises(ValueError, match="not positive definite"):
        solvers.solve(K.to(torch.float32), _randn(30, 2, seed=4).float())
    assert calls == [torch.float32, F64]


def test_eigenpro_fits_rule():
    """U and Ũ, 2·batch·rows·q entries, within a quarter of the CPU budget of 4 GiB."""
    assert solvers.eigenpro_fits(1_000_000, 1000, 1, torch.float32, torch.device("cpu")) is False  # 8 GB
    assert solvers.eigenpro_fits(100_000, 317, 1, F64, torch.device("cpu")) is True  # 0.5 GB
    assert solvers.eigenpro_fits(100_000, 317, 3, F64, torch.device("cpu")) is False  # 1.5 GB


def test_cholesky_solve_picks_torch_on_cpu():
    a = _randn(6, 6, seed=1)
    a = a @ a.mT + torch.eye(6, dtype=F64)
    b = _randn(6, 2, seed=2)
    x, info = solvers.cholesky_solve(a, b)
    torch.testing.assert_close(x, torch.linalg.solve(a, b))
    assert info.shape == () and int(info) == 0


@pytest.mark.gpu
def test_cholesky_solve_uses_kermac_linalg_on_cuda():
    kermac_linalg = pytest.importorskip("kermac_linalg")
    a = _randn(2, 50, 50, seed=1)
    a = (a @ a.mT + torch.eye(50, dtype=F64)).cuda()
    b = _randn(2, 50, 3, seed=2).cuda()
    x, info = solvers.cholesky_solve(a, b)
    expected, _ = kermac_linalg.cholesky_solve(a, b)
    torch.testing.assert_close(x, expected)
    torch.testing.assert_close(x, torch.linalg.solve(a, b))
    assert info.dtype == torch.int32 and not bool(info.any())


@pytest.mark.gpu
@pytest.mark.parametrize(("method", "preconditioner"), CASES)
def test_solve_on_cuda_float32_at_scale(method, preconditioner):
    """N = 6000, a float32 operator on the GPU (condition number about 10⁴) with float64 right-hand sides (mixed
    precision): every method reaches 10⁻⁶, and the residual of α recomputed in float64 from the dense matrix
    agrees."""
    x = _randn(6000, 8, seed=3).float().cuda()
    K = kermac.KernelOperator("gaussian", x, x, bandwidth=2.0, regularization=0.1)
    y = _randn(6000, 4, seed=5).cuda()
    s = solvers.solve(K, y, method=method, preconditioner=preconditioner, tol=1e-6, rank=400)
    assert s.method == method and bool(s.converged.all()), s.residual
    assert s.alpha.dtype == F64 and (s.refinements > 0) == (method == "cg")
    a = K.to(F64).to_dense()
    residual = torch.linalg.vector_norm(y - a @ s.alpha, dim=0) / torch.linalg.vector_norm(y, dim=0)
    assert bool((residual <= 2e-6).all()), residual


def _stalling_float32_system() -> tuple[kermac.KernelOperator, torch.Tensor]:
    """A float32 Gaussian system (condition number about 10⁵) on which float32 CG's true residual stalls near
    10⁻³ while its recursive residual reaches 10⁻⁶."""
    x = _randn(200, 3, seed=1).float()
    return kermac.KernelOperator("gaussian", x, x, bandwidth=1.0, regularization=1e-3, backend="torch"), _randn(
        200, 2, seed=2
    )


def test_mixed_precision_cg_reaches_what_float32_cannot():
    K, y = _stalling_float32_system()
    options = {"method": "cg", "preconditioner": "nystrom", "rank": 60, "tol": 1e-6, "max_iter": 400}
    narrow = solvers.solve(K, y.float(), **options)
    assert narrow.refinements == 0 and not bool(narrow.converged.any()) and float(narrow.residual.min()) > 1e-4
    mixed = solvers.solve(K, y, **options)
    assert mixed.alpha.dtype == F64 and mixed.residual.dtype == F64 and mixed.refinements >= 2
    assert bool(mixed.converged.all()) and float(mixed.residual.max()) <= 1e-6, mixed.residual
    # against an independent solve of the float64 system whose kernel is that of the float32 points
    x64 = K.x.double()
    d = torch.cdist(x64, x64, compute_mode="donot_use_mm_for_euclid_dist")
    a = torch.exp(-(d**2) / 2) + 1e-3 * torch.eye(200, dtype=F64)
    torch.testing.assert_close(
        mixed.alpha, torch.linalg.solve(a, y), rtol=1e-4, atol=1e-4 * float(mixed.alpha.abs().max())
    )
    residual = torch.linalg.vector_norm(y - a @ mixed.alpha, dim=0) / torch.linalg.vector_norm(y, dim=0)
    assert float(residual.max()) <= 2e-6


def test_mixed_precision_cholesky_factors_the_wide_matrix():
    K, y = _stalling_float32_system()
    narrow = solvers.solve(K, y.float(), method="cholesky")
    wide = solvers.solve(K, y[:, 0], method="cholesky")
    assert float(narrow.residual.max()) > 1e-5 and wide.alpha.dtype == F64 and wide.alpha.shape == (200,)
    assert float(wide.residual) <= 1e-10 and bool(wide.converged) and wide.refinements == 0


def test_mixed_precision_refinement_ends_with_its_budget(monkeypatch):
    """The iteration limit counts every step's CG iterations; MAX_REFINEMENTS bounds the steps."""
    K, y = _stalling_float32_system()
    s = solvers.solve(K, y, method="cg", preconditioner=None, tol=1e-6, max_iter=3, check_every=1)
    assert s.refinements == 1 and s.iterations.tolist() == [3, 3] and not bool(s.converged.any())
    monkeypatch.setattr(solvers, "MAX_REFINEMENTS", 1)
    s = solvers.solve(K, y, method="cg", preconditioner="nystrom", rank=60, tol=1e-6)
    assert s.refinements == 1 and not bool(s.converged.any()) and float(s.residual.max()) <= 1e-2


def test_bad_input():
    K = _operator("gaussian", 10, 0.1)
    y = _randn(10, seed=0)
    with pytest.raises(ValueError, match="y: expected finite"):
        solvers.solve(K, torch.where(torch.arange(10) == 3, torch.nan, y))
    with pytest.raises(ValueError, match="y: expected finite"):
        solvers.solve(K, torch.where(torch.arange(10) == 3, torch.inf, y), method="cholesky")
    with pytest.raises(ValueError, match=r"y: expected shape \[10\]"):
        solvers.solve(K, _randn(9, seed=0))
    with pytest.raises(ValueError, match=r"y: expected shape"):
        solvers.solve(K, _randn(10, 2, seed=0).mT)
    with pytest.raises(ValueError, match=r"y: expected dtype torch\.float64 or a wider floating dtype"):
        solvers.solve(K, y.float())  # narrower than the operator
    with pytest.raises(ValueError, match=r"y: expected dtype torch\.float32 or a wider"):
        solvers.solve(K.to(torch.float32), y.to(torch.int64))
    with pytest.raises(TypeError, match=r"y: expected a torch\.Tensor"):
        solvers.solve(K, y.numpy())
    with pytest.raises(TypeError, match=r"K: expected a kermac\.KernelOperator or ShardedKernelOperator"):
        solvers.solve(K.to_dense(), y)
    with pytest.raises(ValueError, match="K: expected a square"):
        solvers.solve(K[:5], y)
    for lam in (0.0, -1.0):
        with pytest.raises(ValueError, match="regularization: conjugate gradient needs λ > 0"):
            solvers.solve(_operator("gaussian", 10, lam), y, method="cg", preconditioner=None)
    unregularised = kermac.KernelOperator("gaussian", K.x, K.x, bandwidth=1.0)
    with pytest.raises(ValueError, match="regularization: conjugate gradient needs λ > 0"):
        solvers.solve(unregularised, y, method="cg")
    with pytest.raises(ValueError, match="regularization: conjugate gradient needs λ > 0"):
        solvers.solve(_operator("gaussian", 10, torch.tensor([0.1, -0.1], dtype=F64), batch=(2,)), y, method="cg")
    with pytest.raises(ValueError, match="regularization: K \\+ λI is not positive definite"):
        solvers.solve(_operator("gaussian", 10, -5.0), y, method="cholesky")
    with pytest.raises(ValueError, match="method: expected one of"):
        solvers.solve(K, y, method="lu")
    with pytest.raises(ValueError, match="preconditioner: expected one of"):
        solvers.solve(K, y, preconditioner="jacobi")
    with pytest.raises(ValueError, match="tol: expected a positive finite"):
        solvers.solve(K, y, tol=0)
    with pytest.raises(ValueError, match="check_every: expected an int ≥ 1"):
        solvers.solve(K, y, check_every=0)
    with pytest.raises(ValueError, match="rank: expected an int ≥ 1"):
        solvers.solve(K, y, rank=0)
    for subsample in (0, 2.5, True):
        with pytest.raises(ValueError, match="subsample: expected an int ≥ 1 or None"):
            solvers.solve(K, y, method="cg", preconditioner="eigenpro", subsample=subsample)
    with pytest.raises(ValueError, match="subsample: expected an int ≥ rank = 5"):
        solvers.solve(K, y, method="cg", preconditioner="eigenpro", rank=5, subsample=4)


@pytest.mark.parametrize(("method", "preconditioner"), CASES)
@pytest.mark.parametrize(("n", "columns"), [(1, None), (1, 2), (0, None), (0, 2), (5, 0)])
def test_size_zero_and_one(method, preconditioner, n, columns):
    K = _operator("gaussian", n, 0.5)
    y = _randn(n, seed=1) if columns is None else _randn(n, columns, seed=1)
    s = solvers.solve(K, y, method=method, preconditioner=preconditioner)
    assert s.alpha.shape == y.shape and s.residual.shape == y.shape[1:] and bool(s.converged.all())
    torch.testing.assert_close(s.alpha, y / 1.5)  # exp(0) + λ on the only diagonal entry (n = 1)


@pytest.mark.parametrize(("method", "preconditioner"), CASES)
def test_views_and_batched_right_hand_sides(method, preconditioner):
    K = _operator("laplace_l2", 21, 0.2)
    y = _randn(2, 3, 21, seed=4).mT  # [2, 21, 3], a transposed view, batched over an unbatched operator
    s = solvers.solve(K, y, method=method, preconditioner=preconditioner, tol=1e-11, rank=5)
    assert s.alpha.shape == (2, 21, 3) and s.converged.shape == (2, 3)
    torch.testing.assert_close(s.alpha, _reference(K, y), rtol=1e-8, atol=1e-9)
