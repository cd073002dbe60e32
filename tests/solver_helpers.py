"""Shared pieces of the solver and preconditioner tests: seeded float64 data, small kernel systems on the
reference backend and an independent dense solve."""

from __future__ import annotations

import torch

import kermac
from kermac.kernel_system import KernelSystem

F64 = torch.float64


def seeded_randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


def kernel_operator(kernel: str, n: int, lam: float | torch.Tensor, *, seed: int = 0, batch: tuple[int, ...] = ()):
    x = seeded_randn(*batch, n, 3, seed=seed)
    return kermac.KernelOperator(kernel, x, x, bandwidth=1.3, regularization=lam, backend="torch")


def reference_solve(K: kermac.KernelOperator, y: torch.Tensor) -> torch.Tensor:
    """An independent float64 dense solve: the kernel matrix from `torch.cdist`, λ added by hand."""
    x = K.x
    d = torch.cdist(x, x, compute_mode="donot_use_mm_for_euclid_dist")
    k = torch.exp(-d / 1.3) if K._name == "laplace_l2" else torch.exp(-(d**2) / (2 * 1.3**2))
    lam = KernelSystem(K).regularization
    a = k + lam * torch.eye(x.shape[-2], dtype=F64)
    return torch.linalg.solve(a, y if y.dim() > 1 else y[:, None])
