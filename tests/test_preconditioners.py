"""`kermac.preconditioners`: every preconditioner symmetric positive definite (also where λ is below the
rounding of the Gram matrix), cutting CG's iterations, and the same in each of its storage forms."""

from __future__ import annotations

import pytest
import torch
from solver_helpers import F64
from solver_helpers import kernel_operator as _operator
from solver_helpers import reference_solve as _reference
from solver_helpers import seeded_randn as _randn

import kermac
from kermac import preconditioners, solvers
from kermac.kernel_system import KernelSystem


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_nystrom_stays_positive_definite_when_lambda_is_below_the_rounding_of_the_gram_matrix(dtype):
    """λ = 10⁻³ on 400 points whose Gaussian Gram matrix is singular to working precision: the preconditioner
    must still be symmetric positive definite (a Woodbury form `(I − …)/λ` divides rounding by λ and gives NaN
    in float32, an indefinite P⁻¹ in float64) and cut the iterations."""
    x = _randn(400, 3, seed=3).to(dtype)
    K = kermac.KernelOperator("gaussian", x, x, bandwidth=2.0, regularization=1e-3)
    y = _randn(400, 2, seed=5).to(dtype)
    tol = 1e-6 if dtype == F64 else 1e-2
    plain = solvers.solve(K, y, method="cg", preconditioner=None, tol=tol, max_iter=1000)
    nys = solvers.solve(K, y, method="cg", preconditioner="nystrom", tol=tol, rank=100, max_iter=1000)
    assert bool(nys.converged.all()), nys.residual
    speedup = 10 if dtype == F64 else 3  # float32 keeps only the directions its products resolve
    assert int(nys.iterations.max()) * speedup < int(plain.iterations.min())
    apply = preconditioners.NystromPreconditioner(KernelSystem(K), 100, seed=0)
    p_inv = apply(torch.eye(400, dtype=dtype)).double()
    torch.testing.assert_close(p_inv, p_inv.mT, rtol=0, atol=1e-5 * float(p_inv.abs().max()))
    assert float(torch.linalg.eigvalsh((p_inv + p_inv.mT) / 2).min()) > 0


def test_nystrom_dense_and_product_forms_agree(monkeypatch):
    """K_nS kept dense (up to NYSTROM_DENSE_ENTRIES) and applied by fused products give the same P⁻¹, batched."""
    K = _operator("gaussian", 50, torch.tensor([1e-2, 1e-1], dtype=F64), seed=1, batch=(2,))
    r = _randn(2, 50, 3, seed=2)
    dense = preconditioners.NystromPreconditioner(KernelSystem(K), 12, seed=0)
    assert isinstance(dense._nS, torch.Tensor)
    monkeypatch.setattr(preconditioners, "NYSTROM_DENSE_ENTRIES", 0)
    products = preconditioners.NystromPreconditioner(KernelSystem(K), 12, seed=0)
    assert isinstance(products._nS, kermac.KernelOperator)
    torch.testing.assert_close(products(r), dense(r), rtol=1e-10, atol=1e-12)


def _preconditioned_spectrum(p_inv: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """The eigenvalues of `P⁻¹ A` (ascending, float64), through the similar `Lᵀ A L` with `P⁻¹ = L Lᵀ`."""
    factor = torch.linalg.cholesky((p_inv + p_inv.mT) / 2)
    return torch.linalg.eigvalsh(factor.mT @ a @ factor)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("subsample", [50, 100])
def test_eigenpro_stays_positive_definite_when_lambda_is_below_the_rounding_of_the_gram_matrix(dtype, subsample):
    """The system of the Nyström test (400 points, λ = 10⁻³, a Gram matrix singular to working precision), q = 50
    directions from a subsample of 50 or 100: P⁻¹ symmetric positive definite, CG's iterations cut, and the
    condition number of `P⁻¹ (K + λI)` far below that of `K + λI`. Without the orthonormalisation of the
    extended eigenvectors P⁻¹ is indefinite here (eigenvalues down to −418); trusting the subsample's eigenvalues
    `(n/s) σ_i` without the Rayleigh–Ritz step raises that condition number (to 10⁷ in float64, above the
    2·10⁵ of `K + λI`; to 7·10³ in float32)."""
    x = _randn(400, 3, seed=3).to(dtype)
    K = kermac.KernelOperator("gaussian", x, x, bandwidth=2.0, regularization=1e-3)
    y = _randn(400, 2, seed=5).to(dtype)
    tol = 1e-6 if dtype == F64 else 3e-2  # float32: the recomputed residual stays near 10⁻² (rounding of K α)
    plain = solvers.solve(K, y, method="cg", preconditioner=None, tol=tol, max_iter=1000)
    ep = solvers.solve(
        K, y, method="cg", preconditioner="eigenpro", tol=tol, rank=50, subsample=subsample, max_iter=1000
    )
    assert ep.preconditioner == "eigenpro" and bool(ep.converged.all()), ep.residual
    speedup = 8 if dtype == F64 else 3  # float32 flattens down to δ = eps^{1/2} of the top eigenvalue only
    assert int(ep.iterations.max()) * speedup < int(plain.iterations.min())
    apply = preconditioners.EigenProPreconditioner(KernelSystem(K), 50, subsample, seed=0)
    p_inv = apply(torch.eye(400, dtype=dtype)).double()
    torch.testing.assert_close(p_inv, p_inv.mT, rtol=0, atol=1e-6 * float(p_inv.abs().max()))
    assert float(torch.linalg.eigvalsh((p_inv + p_inv.mT) / 2).min()) > 0
    a = K.to_dense().double()
    plain_condition = torch.linalg.cond(a)
    spectrum = _preconditioned_spectrum(p_inv, a)
    assert float(spectrum[-1] / spectrum[0]) * (1000 if dtype == F64 else 100) < float(plain_condition)


def test_eigenpro_with_the_whole_sample_flattens_the_top_eigenvalues_to_the_next():
    """s = n: the extension is exact, so `P⁻¹ (K + λI)` has the eigenvalue `λ_{q+1} + λ` q times and keeps
    `λ_j + λ` for j > q (float64, against `torch.linalg.eigvalsh` of the dense matrix)."""
    K = _operator("laplace_l2", 60, 1e-2, seed=4)
    a = K.to_dense()
    eigenvalues = torch.linalg.eigvalsh(a)  # ascending, λ included
    q = 10
    apply = preconditioners.EigenProPreconditioner(KernelSystem(K), q, 60, seed=1)
    expected = torch.cat([eigenvalues[: 60 - q], eigenvalues[59 - q].expand(q)]).sort().values
    torch.testing.assert_close(_preconditioned_spectrum(apply(torch.eye(60, dtype=F64)), a), expected)


def test_eigenpro_reduces_iterations_and_matches_the_reference_solve():
    """Condition number 10⁵: plain CG needs about 600 iterations, EigenPro (q = 100, s = 200) about 30; α
    agrees with the float64 dense solve."""
    K = _operator("gaussian", 300, 1e-3, seed=2)
    y = _randn(300, 3, seed=4)
    plain = solvers.solve(K, y, method="cg", preconditioner=None, tol=1e-10, max_iter=3000)
    ep = solvers.solve(K, y, method="cg", preconditioner="eigenpro", tol=1e-10, rank=100, max_iter=3000)
    assert bool(plain.converged.all()) and bool(ep.converged.all())
    assert int(ep.iterations.max()) * 10 < int(plain.iterations.min())
    expected = _reference(K, y)
    torch.testing.assert_close(ep.alpha, expected, rtol=1e-7, atol=1e-9 * float(expected.abs().max()))


def test_eigenpro_batched_operator_and_lambda_match_each_entry():
    """A batch of operators with a batch of λ: each entry's P⁻¹ is the one built from that entry alone."""
    lam = torch.tensor([1e-3, 1e-1], dtype=F64)
    K = _operator("gaussian", 40, lam, seed=1, batch=(2,))
    r = _randn(2, 40, 3, seed=2)
    batched = preconditioners.EigenProPreconditioner(KernelSystem(K), 6, 15, seed=3)
    for b in range(2):
        alone = kermac.KernelOperator("gaussian", K.x[b], K.x[b], bandwidth=1.3, regularization=float(lam[b]))
        single = preconditioners.EigenProPreconditioner(KernelSystem(alone), 6, 15, seed=3)
        torch.testing.assert_close(batched(r)[b], single(r[b]), rtol=1e-10, atol=1e-12)


def test_eigenpro_clips_the_subsample_and_the_rank_to_n():
    """subsample > n and rank > n use all n points; the default subsample is 2·rank, clipped too."""
    K = _operator("gaussian", 30, 0.1, seed=5)
    r = _randn(30, 2, seed=6)
    whole = preconditioners.EigenProPreconditioner(KernelSystem(K), 30, 30, seed=0)
    torch.testing.assert_close(preconditioners.EigenProPreconditioner(KernelSystem(K), 100, 500, seed=0)(r), whole(r))
    torch.testing.assert_close(preconditioners.EigenProPreconditioner(KernelSystem(K), 30, None, seed=0)(r), whole(r))
    default = preconditioners.EigenProPreconditioner(KernelSystem(K), 6, None, seed=0)
    assert default._U.shape == (30, 6)
    torch.testing.assert_close(default(r), preconditioners.EigenProPreconditioner(KernelSystem(K), 6, 12, seed=0)(r))


@pytest.mark.gpu
def test_top_eigenpairs_use_eigh_range_on_cuda():
    """On CUDA the subsample's eigenpairs come from `kermac.linalg.eigh_range` (only the k largest)."""
    kermac_linalg = pytest.importorskip("kermac_linalg")
    a = _randn(2, 80, 80, seed=1)
    a = (a @ a.mT).cuda()
    values, vectors = preconditioners._top_eigenpairs(a, 7)
    expected, _, _ = kermac_linalg.eigh_range(a, top_k=7)
    torch.testing.assert_close(values, expected)
    torch.testing.assert_close(values, torch.linalg.eigvalsh(a)[..., -7:])
    torch.testing.assert_close(a @ vectors, vectors * values[..., None, :])
