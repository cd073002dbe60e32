"""`kermac.preconditioners`: every preconditioner symmetric positive definite (also where λ is below the
rounding of the Gram matrix), cutting CG's iterations, and the same in each of its storage forms."""

from __future__ import annotations

import pytest
import torch
from solver_helpers import F64
from solver_helpers import kernel_operator as _operator
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
