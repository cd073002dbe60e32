"""Shared inputs and float64 checks for the kermac_linalg tests (one test file per operation)."""

from __future__ import annotations

import pytest
import torch

DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]
DTYPES = [torch.float32, torch.float64]


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def spd(*batch: int, n: int, dtype=torch.float64, device="cpu", seed=0) -> torch.Tensor:
    """Well-conditioned SPD matrices G Gᵀ / n + I (condition number below about 5)."""
    G = _randn(*batch, n, n, seed=seed)
    return (G @ G.mT / n + torch.eye(n, dtype=torch.float64)).to(dtype=dtype, device=device)


def general(*batch: int, n: int, dtype=torch.float64, device="cpu", seed=0) -> torch.Tensor:
    """Non-symmetric, well-conditioned matrices G / sqrt(n) + 3 I (A and Aᵀ give different solutions)."""
    G = _randn(*batch, n, n, seed=seed)
    return (G / n**0.5 + 3 * torch.eye(n, dtype=torch.float64)).to(dtype=dtype, device=device)


def symmetric(*batch: int, n: int, dtype=torch.float64, device="cpu", seed=0) -> torch.Tensor:
    """Symmetric matrices (G + Gᵀ) / 2 with a spread spectrum of both signs."""
    G = _randn(*batch, n, n, seed=seed)
    return ((G + G.mT) / 2).to(dtype=dtype, device=device)


def rhs(*shape: int, dtype=torch.float64, device="cpu", seed=1) -> torch.Tensor:
    """Right-hand sides of ``shape`` from a fixed seed."""
    return _randn(*shape, seed=seed).to(dtype=dtype, device=device)


def solve_error(A: torch.Tensor, B: torch.Tensor, X: torch.Tensor) -> float:
    """Relative error of X against the float64 solution of A X = B (broadcast)."""
    ref = torch.linalg.solve(A.double().cpu(), B.double().cpu())
    assert X.shape == ref.shape
    return ((X.double().cpu() - ref).norm() / ref.norm()).item()


def assert_solves(A: torch.Tensor, B: torch.Tensor, X: torch.Tensor, tol: float) -> None:
    """X matches the float64 solution of A X = B (broadcast) to relative error ``tol``."""
    err = solve_error(A, B, X)
    assert err <= tol, f"relative error {err:.2e} > {tol:.0e}"


def assert_eigenpairs(A: torch.Tensor, W: torch.Tensor, V: torch.Tensor, tol: float) -> None:
    """Ascending float64-accurate eigenvalues, residual ‖AV − VΛ‖ and orthogonality ‖VᵀV − I‖."""
    A64, W64, V64 = A.double().cpu(), W.double().cpu(), V.double().cpu()
    n = A.shape[-1]
    scale = torch.linalg.matrix_norm(A64, ord=2).clamp(min=1).max()
    ref = torch.linalg.eigvalsh(A64)
    assert (W64.diff(dim=-1) >= 0).all(), "eigenvalues must be ascending"
    assert (W64 - ref).abs().max() <= tol * scale
    assert (A64 @ V64 - V64 * W64[..., None, :]).norm(dim=(-2, -1)).max() <= tol * scale * n**0.5
    eye = torch.eye(n, dtype=torch.float64)
    assert (V64.mT @ V64 - eye).norm(dim=(-2, -1)).max() <= tol * n
