"""The k largest (or smallest) eigenpairs of a large symmetric matrix by block subspace iteration.

A direct solver (xsyevd, xsyevdx) first reduces the whole N x N matrix to tridiagonal form, which
costs O(N³) memory-bound work whatever k is. For k ≪ N this module needs matrix products with a
block of `b = 2k + 32` columns instead, a few dozen times, and certifies its answer:

1. Shift. 24 Lanczos steps from a random vector estimate the extreme eigenvalues of `M`
   (`M = S` for the largest pairs, `-S` for the smallest); iterating with `M - σI`, σ the
   lower estimate, makes the wanted eigenvalues the dominant ones.
2. Subspace iteration with Rayleigh–Ritz: `X ← orth(Z)`, `Z ← (M - σI) X`,
   `XᵀZ = U Θ Uᵀ`, `X ← XU`, `Z ← ZU`; the Ritz pair `(θ_i, x_i)` has residual
   `‖z_i - θ_i x_i‖`. Stop when the k wanted residuals are at most
   `tol = ε (λ_max - λ_min) max(8, √N / 8)` (ε of the dtype; about what the direct solver
   reaches), or, once they stop decreasing for 10 steps (rounding), if they are at most 4 tol;
   give up otherwise, or after 100 steps.
3. Certificate: the pairs found are eigenpairs (small residuals), and they must be the k
   *largest*: with τ the smallest of them (plus twice the residual),
   `τI - (M - σI) + V (Θ - τ + ‖M - σI‖) Vᵀ` moves the found eigenvalues ‖M - σI‖ below τ
   and is positive definite exactly when no other eigenvalue exceeds τ. One Cholesky
   factorisation checks it.

Anything that fails returns None (an overflow too), and the caller uses the direct solver.
"""

from __future__ import annotations

import math

import torch

__all__ = ["BLOCK_EXTRA", "MAX_STEPS", "block_size", "extreme_eigenpairs"]

BLOCK_EXTRA = 32
MAX_STEPS = 100
_LANCZOS_STEPS = 24
_STALL_STEPS = 10
_SEED = 0x6B65726D


def block_size(n: int, k: int) -> int:
    """Columns of the iterated block for k wanted pairs: `min(N, 2k + 32)`."""
    return min(n, 2 * k + BLOCK_EXTRA)


def symmetrized(A: torch.Tensor) -> torch.Tensor:
    """`[N, N]` symmetric matrix from A's lower triangle (like torch.linalg.eigh reads it)."""
    n = A.shape[-1]
    index = torch.arange(n, device=A.device)
    return torch.where(index[:, None] >= index[None, :], A, A.mT)


def extreme_eigenpairs(A: torch.Tensor, k: int, largest: bool, cholesky) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The k largest (or smallest) eigenpairs of the symmetric `A [N, N]` (lower triangle read).

    Returns `(W [k] ascending, V [N, k])` or None when not converged or not certified.
    `cholesky(C) -> info` factors C in place and returns its status (a 0-d tensor).
    """
    n = A.shape[-1]
    b = block_size(n, k)
    if b >= n:
        return None
    S = symmetrized(A)
    sign = 1.0 if largest else -1.0
    gen = torch.Generator(device=A.device).manual_seed(_SEED)
    lower, upper = _lanczos_bounds(S, sign, gen)
    spread = upper - lower  # about the norm of M - σI
    if not math.isfinite(spread):
        return None
    if spread == 0.0:
        W = torch.full((k,), sign * lower, dtype=A.dtype, device=A.device)
        return W, torch.eye(n, k, dtype=A.dtype, device=A.device)
    tol = torch.finfo(A.dtype).eps * spread * max(8.0, math.sqrt(n) / 8.0)
    found = _iterate(S, sign, lower, k, b, tol, gen)
    if found is None:
        return None
    theta, V, residual = found  # eigenvalues of M - σI, ascending, their vectors, max residual
    if not _certify(S, sign, lower, theta, V, residual, spread, cholesky):
        return None
    W = sign * (theta + lower)
    if not largest:
        W, V = W.flip(0), V.flip(1)
    return W.to(device=A.device, dtype=A.dtype), V


def _matmul(S: torch.Tensor, sign: float, X: torch.Tensor, shift: float) -> torch.Tensor:
    """`(sign·S - shift·I) X`."""
    Z = S @ X
    if sign < 0:
        Z.neg_()
    return Z.sub_(X, alpha=shift) if shift else Z


def _lanczos_bounds(S: torch.Tensor, sign: float, gen: torch.Generator) -> tuple[float, float]:
    """Estimates of the smallest and largest eigenvalue of `sign·S` from a few Lanczos steps.

    Each estimate is widened by its Ritz residual `|β_m s_m|`, a bound that holds for the
    eigenvalue the Ritz value approximates (usually the extreme one). NaN for both when the
    steps do not stay finite (the norms overflow for a large S; LAPACK would refuse T).
    """
    n = S.shape[-1]
    q = torch.randn(n, 1, dtype=S.dtype, device=S.device, generator=gen)
    q /= q.norm()
    q_prev = torch.zeros_like(q)
    beta = torch.zeros((), dtype=S.dtype, device=S.device)
    alphas, betas = [], []
    for _ in range(min(_LANCZOS_STEPS, n)):
        w = _matmul(S, sign, q, 0.0)
        alpha = (q * w).sum()
        w = w - alpha * q - beta * q_prev
        beta = w.norm()
        q_prev, q = q, w / beta.clamp_min(torch.finfo(S.dtype).tiny)
        alphas.append(alpha)
        betas.append(beta)
    a = torch.stack(alphas).double().cpu()
    bs = torch.stack(betas).double().cpu()
    if not (a.isfinite().all() and bs.isfinite().all()):  # torch's 2-norm squares: inf past ~1e154 (float64)
        return math.nan, math.nan
    T = torch.diag(a) + torch.diag(bs[:-1], 1) + torch.diag(bs[:-1], -1)
    values, vectors = torch.linalg.eigh(T)
    spread = (bs[-1] * vectors[-1]).abs()
    return float(values[0] - spread[0]), float(values[-1] + spread[-1])


def _iterate(
    S: torch.Tensor, sign: float, shift: float, k: int, b: int, tol: float, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, float] | None:
    """Subspace iteration with Rayleigh–Ritz on `sign·S - shift·I`.

    Returns the k dominant Ritz values (ascending, on the CPU), their vectors and their largest
    residual, or None.
    """
    n = S.shape[-1]
    X, _ = torch.linalg.qr(torch.randn(n, b, dtype=S.dtype, device=S.device, generator=gen))
    Z = _matmul(S, sign, X, shift)
    best, since_best = math.inf, 0
    for _ in range(MAX_STEPS):
        H = (X.mT @ Z).double().cpu()
        theta, U = torch.linalg.eigh((H + H.mT) / 2)
        U = U.to(device=S.device, dtype=S.dtype)
        X, Z = X @ U, Z @ U
        theta_dev = theta.to(device=S.device, dtype=S.dtype)
        residual = (Z[:, -k:] - X[:, -k:] * theta_dev[-k:]).norm(dim=0).max().item()
        if not math.isfinite(residual):
            return None
        if residual <= tol:
            return theta[-k:], X[:, -k:], residual
        if residual < 0.9 * best:
            best, since_best = residual, 0
        else:
            since_best += 1
            if since_best >= _STALL_STEPS:
                return (theta[-k:], X[:, -k:], residual) if residual <= 4.0 * tol else None
        X, _ = torch.linalg.qr(Z)
        Z = _matmul(S, sign, X, shift)
    return None


def _certify(
    S: torch.Tensor,
    sign: float,
    shift: float,
    theta: torch.Tensor,
    V: torch.Tensor,
    residual: float,
    norm: float,
    cholesky,
) -> bool:
    """True if no eigenvalue of `sign·S - shift·I` but the found ones exceeds `min(θ) + 2 residual`.

    Builds `C = τI - (sign·S - shift·I) + V (Θ - τ + norm) Vᵀ` in S's memory (S is not used
    afterwards): the found eigenvalues move to `τ - norm`, so C is positive definite exactly when
    every other eigenvalue is below τ.
    """
    tau = float(theta.min()) + 2.0 * residual
    C = S.mul_(-sign)
    C.diagonal().add_(tau + shift)
    weights = (theta - tau + norm).to(device=S.device, dtype=S.dtype)
    C.addmm_(V * weights, V.mT)
    return int(cholesky(C)) == 0
