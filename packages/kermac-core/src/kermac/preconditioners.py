r"""Preconditioners for conjugate gradient on `(K + λI) α = y`: callables `r ↦ P⁻¹ r` for `r [..., n, C]`,
built from a [`KernelSystem`][kermac.kernel_system.KernelSystem] (a square operator `K + λI` on one device or
sharded over ranks), symmetric positive definite by construction (CG needs that), used by
[`kermac.solvers.solve`][kermac.solvers.solve].  On a sharded system `r` is the rank's rows and so is `P⁻¹ r`.
"""

from __future__ import annotations

import torch

from kermac.kernel_system import KernelSystem

__all__ = ["NYSTROM_DENSE_ENTRIES", "EigenProPreconditioner", "NystromPreconditioner"]

NYSTROM_DENSE_ENTRIES = 1 << 26
"""The Nyström preconditioner keeps `K_nS` (`n × m`) as a dense matrix up to this many entries (256 MiB in
float32); beyond, it applies it by fused kernel products."""
_PRODUCT_CHUNK_ELEMENTS = 1 << 24  # bound on the n × b dense block of K_nS evaluated per step of the Nyström setup


class NystromPreconditioner:
    r"""Randomized-Nyström preconditioner (Frangella, Tropp and Udell, SIAM J. Matrix Anal. Appl. 2023) on
    inducing points, applied as `P⁻¹`.

    `S` are m = `rank` rows of `x` chosen by a seeded random permutation (of the global rows, the same on every
    rank) and `K_nS = K(x, x_S)` (the kernel without λ). The Nyström approximation `K ≈ K_nS K_SS⁺ K_Sn = U Λ̂ Uᵀ`
    (U orthonormal, `n × m`) is never formed: with `K_SS = W S Wᵀ` (eigenvalues raised to at least `δ · mean diag
    K_SS`, `δ = (m · eps(dtype))^{1/2}`), `T = W S^{-1/2}` and `Tᵀ K_Sn K_nS T = V Λ̂ Vᵀ`, `U = K_nS T V Λ̂^{-1/2}`.
    Then

    $$
    P^{-1} = (\hat\lambda_\ell + \lambda)\, U (\hat\Lambda + \lambda I)^{-1} U^T + (I - U U^T)
           = I + K_{nS} Q \,\mathrm{diag}\Big(\frac{\hat\lambda_\ell - \hat\lambda_i}{\hat\lambda_i(\hat\lambda_i
             + \lambda)}\Big)\, Q^T K_{Sn},\qquad Q = T V,
    $$

    where only the eigenvalues `λ̂_i` above `δ · λ̂_max` are kept and `λ̂_ℓ` is the smallest kept one. The
    columns `K_nS q_i` are computed in the kernel's dtype with an error of about `eps · ‖K_nS‖ ‖q_i‖`, which
    for a direction near `δ` is no longer small against its norm `λ̂_i^{1/2}`: keeping it would make `P⁻¹`
    indefinite, so `δ` bounds both floors (about 7·10⁻³ in float32 at m = 400, 3·10⁻⁷ in float64: float32
    preconditions less). `P⁻¹ (K + λI)` has its eigenvalues between about `λ + λ_min(K − U Λ̂ Uᵀ)` and
    `max(λ̂_ℓ + λ, λ + ‖K − U Λ̂ Uᵀ‖)`: a condition number of about the latter over λ; unlike the Woodbury form
    `(I − …)/λ`, nothing is divided by λ, so a small λ does not turn rounding into an indefinite preconditioner.

    Each application costs two products with `K_nS` (`K_Sn r`, `K_nS w`) and two `m × m` matrix products:
    matrix products with `K_nS` kept dense where it has at most
    [`NYSTROM_DENSE_ENTRIES`][kermac.preconditioners.NYSTROM_DENSE_ENTRIES] entries, fused kernel products otherwise.
    Setup: `K_Sn K_nS` by column blocks of `K_nS` (each `n × b` block evaluated, then one product with
    `K_Sn`; blocks bounded to about 16 M entries) and two `m × m` eigendecompositions, in float64 whatever
    the kernel's dtype. Memory: `x_S` (`m·D`), `Q` (`m²`, float64) and one block, or the dense `K_nS`.

    Sharded over ranks, each rank keeps its rows of `K_nS`; `x_S`, `K_Sn K_nS` and every `K_Sn r` are summed over
    the ranks (`all_reduce`s of `m·D`, `m²` and `m·C` numbers) and `Q` comes from the group's first rank (one
    `broadcast`), so every rank applies the same `P⁻¹` to its rows.

    Args:
        system: the square system `K + λI` ([`KernelSystem`][kermac.kernel_system.KernelSystem]), λ > 0.
        rank: m, the number of inducing points (at most N).
        seed: seed of the random choice of the inducing points.
    """

    def __init__(self, system: KernelSystem, rank: int, seed: int) -> None:
        local = system.points.shape[-2]
        xs = system.random_points(rank, seed)
        self._system = system
        self._nS = system.kernel_on(system.points, xs)  # the kernel alone: λ belongs to the system
        resolved = (rank * torch.finfo(system.dtype).eps) ** 0.5  # δ: the smallest relative scale products resolve
        kss = system.kernel_on(xs, xs).to_dense().double()
        s, w = torch.linalg.eigh((kss + kss.mT) / 2)
        floor = resolved * kss.diagonal(dim1=-2, dim2=-1).mean(-1)
        t = w * torch.maximum(s, floor[..., None]).rsqrt()[..., None, :]  # T = W S^{-1/2}
        if local * rank <= NYSTROM_DENSE_ENTRIES:
            # kept dense: K_Sn r has only m rows, too few for the fused product to fill a GPU; the
            # n × m block is bounded by NYSTROM_DENSE_ENTRIES
            self._nS = self._nS.to_dense()
            self._Sn = self._nS.mT
            gram = self._Sn @ self._nS
        else:
            self._Sn = self._nS.T
            gram = torch.empty(kss.shape, dtype=system.dtype, device=system.device)
            block = max(1, _PRODUCT_CHUNK_ELEMENTS // max(local, 1))
            for j in range(0, rank, block):
                columns = self._nS[:, j : j + block].to_dense()
                gram[..., j : j + block] = self._Sn @ columns
        inner = t.mT @ system.sum_ranks(gram).double() @ t
        e, v = torch.linalg.eigh((inner + inner.mT) / 2)  # ascending: λ̂_max is the last
        kept = e > resolved * e[..., -1:]
        smallest = torch.where(kept, e, torch.inf).min(-1, keepdim=True).values if rank else e  # λ̂_ℓ
        lam = system.regularization
        lam64 = lam.double()[..., 0] if isinstance(lam, torch.Tensor) else lam  # a float, or [..., 1]
        safe = torch.where(kept, e, 1.0)
        coefficient = torch.where(kept, (smallest - e) / (safe * (safe + lam64)), 0.0)
        # every rank computed the same factors; its first rank's copy makes them bit-identical, so P⁻¹ is one
        # symmetric operator across ranks
        self._Q = system.broadcast((t @ v).contiguous())
        self._coefficient = system.broadcast(coefficient[..., :, None].contiguous())  # a column [..., m, 1]

    def __call__(self, r: torch.Tensor) -> torch.Tensor:
        """`P⁻¹ r` for `r [..., n, C]` (this rank's rows on a sharded system)."""
        w = self._Q.mT @ self._system.sum_ranks(self._Sn @ r).double()
        return r + self._nS @ (self._Q @ (self._coefficient * w)).to(r.dtype)


class EigenProPreconditioner:
    r"""EigenPro's spectral flattening (Ma and Belkin, *Diving into the shallows*, NeurIPS 2017; EigenPro 2.0,
    2019) of the top-q eigenspace of `K`, estimated on a random subsample, applied as `P⁻¹`.

    `S` are s = `subsample` rows of `x` chosen by a seeded random permutation (default `2 · rank`, at most n),
    and q = `rank` (at most s). The top q + 1 eigenpairs `K_SS v_i = σ_i v_i` of the subsample's kernel matrix
    (float64; [`kermac.linalg.eigh_range`][kermac_linalg.eigh_range] on CUDA when `kermac-linalg` is installed,
    `torch.linalg.eigh` otherwise) extend to all n points by the Nyström extension
    `u_i = (s/n)^{1/2} K_nS v_i / σ_i` (`K_nS = K(x, x_S)`, the kernel without λ), approximate unit eigenvectors
    of `K` with eigenvalues near `(n/s) σ_i`, for the `σ_i` above `δ σ_1`, `δ = eps(dtype)^{1/2}` (zero columns
    otherwise). Over n points they are not orthonormal, and where s is small `(n/s) σ_i` overestimates `K`'s
    eigenvalues (a preconditioner that trusts them turns small eigenvalues of `P⁻¹ (K + λI)` smaller still).
    Both are corrected with `q × q` algebra: `U = [u_1 … u_q]` spans the range of the rank-q Nyström
    approximation `K_q = K_nS V Σ⁻¹ Vᵀ K_Sn ⪯ K`, and since `Uᵀ K_nS V = (n/s)^{1/2} G Σ` with the Gram matrix
    `G = UᵀU = W Γ Wᵀ` (summed in float64; eigenvalues at most `δ Γ_max` dropped), `K_q` in the orthonormal
    basis `U W Γ^{-1/2}` is `(n/s) Γ^{1/2} Wᵀ Σ W Γ^{1/2} = Z Θ Zᵀ`. So `Ũ = U W Γ^{-1/2} Z` (orthonormal) and
    `Θ` are the eigenpairs of `K_q`, Rayleigh–Ritz without another pass over the n points, and

    $$
    P^{-1} = I - \tilde U D \tilde U^T,\qquad D = \mathrm{diag}\Big(\max\Big(0,\ 1 - \frac{\mu}{\theta_i
      + \lambda}\Big)\Big),\qquad \mu = \max\big(\min(\tfrac{n}{s}\sigma_{q+1},\ \theta_\ell),\ \delta\,
      \theta_{\max}\big) + \lambda,
    $$

    with `θ_ℓ` the smallest `θ_i` above `δ θ_max` and `σ_{q+1} = 0` when q = s: EigenPro's level, the next
    eigenvalue, but never above a direction of `Ũ`, so every direction is brought down to μ and the rest is
    left alone. The eigenvalues of `P⁻¹` lie in `[μ / (θ_max + λ), 1]`, at least δ: symmetric positive definite
    by construction however small λ is, with a margin far above the rounding of `Ũ`'s orthonormality (about
    `q · eps`), and the rounding of `r − Ũ D Ũᵀ r` stays about `eps / δ = δ` relative. Where `Ũ` spans the
    range of `K_q` (no direction dropped), the eigenvalues of `P⁻¹ (K + λI)` lie between λ and `μ + ‖K − K_q‖`,
    as for the Nyström preconditioner; with the whole sample (s = n) the top q eigenvalues of `K + λI` become μ
    and the others stay.

    Setup: `K_SS` (`s² · D` kernel evaluations) and its eigendecomposition (`s³`, float64); one fused product
    `K_nS B` (`B = V Σ⁻¹ (s/n)^{1/2}`, `s × q`: `n · s · (D + q)`); the Gram `G` (`n · q²`, float64, by row
    blocks of at most about 16 M entries); two `q × q` eigendecompositions; `Ũ = U (W Γ^{-1/2} Z)` (`n · q²`). No
    `K_Sn K_nS` (`n · s²`, the Nyström setup's largest term). Each application: `r − Ũ (D (Ũᵀ r))`, two dense
    products with `Ũ` (`2 · n · q · C`). Memory: `Ũ` `[..., n, q]` in the kernel's dtype; during the setup
    also `U`, `K_SS` (`s²`, float64) and a float64 row block of `U` (at most about 16 M entries).

    Sharded over ranks, each rank keeps its rows of `Ũ`; `x_S`, `G` and every `Ũᵀ r` are summed over the ranks
    (`all_reduce`s of `s·D`, `q²` and `q·C` numbers) and the `s × q` and `q × q` factors come from the group's
    first rank (`broadcast`s), so every rank applies the same `P⁻¹` to its rows.

    Args:
        system: the square system `K + λI` ([`KernelSystem`][kermac.kernel_system.KernelSystem]), λ > 0.
        rank: q, the number of eigen-directions flattened.
        subsample: s, the subsample size (None: `2 · rank`); clipped to n, and q to s.
        seed: seed of the random choice of the subsample.
    """

    def __init__(self, system: KernelSystem, rank: int, subsample: int | None, seed: int) -> None:
        n, dtype = system.n, system.dtype
        s = min(n, 2 * rank if subsample is None else subsample)
        q = min(rank, s)
        xs = system.random_points(s, seed)
        kss = system.kernel_on(xs, xs).to_dense().double()
        sigma, v = _top_eigenpairs((kss + kss.mT) / 2, min(q + 1, s))  # ascending: σ_1 is the last
        lead, vectors = sigma[..., sigma.shape[-1] - q :], v[..., sigma.shape[-1] - q :]
        beyond = sigma[..., :1] if q < s else torch.zeros_like(sigma[..., :1])  # σ_{q+1}, 0 without one
        resolved = torch.finfo(dtype).eps ** 0.5  # δ
        used = lead > resolved * lead[..., -1:]
        scale = n / max(s, 1)
        b = vectors * torch.where(used, (s / max(n, 1)) ** 0.5 / torch.where(used, lead, 1), 0)[..., None, :]
        # every rank computed the same B; its first rank's copy makes U one basis across ranks
        b = system.broadcast(b.to(dtype).contiguous())
        u = system.kernel_on(system.points, xs) @ b  # U = K_nS B, [..., n, q] (this rank's rows)
        gamma, w = torch.linalg.eigh(system.sum_ranks(_gram64(u)))  # G = W Γ Wᵀ
        kept = gamma > resolved * gamma[..., -1:]
        root = torch.where(kept, gamma, 0).sqrt()
        half = w * root[..., None, :]  # W Γ^{1/2}
        ritz = scale * half.mT @ ((lead * used)[..., :, None] * half)  # K_q in the basis U W Γ^{-1/2}
        theta, z = torch.linalg.eigh((ritz + ritz.mT) / 2)
        lam = system.regularization
        lam64 = lam.double()[..., 0] if isinstance(lam, torch.Tensor) else lam  # a float, or [..., 1]
        floor = resolved * theta[..., -1:]  # δ θ_max (empty when q = 0)
        smallest = torch.where(theta > floor, theta, torch.inf).min(-1, keepdim=True).values if q else theta  # θ_ℓ
        level = torch.maximum(torch.minimum(scale * beyond, smallest), floor) + lam64  # μ
        coefficient = (1 - level / (theta.clamp(min=0) + lam64)).clamp(min=0)
        basis = w * (kept / torch.where(kept, root, 1))[..., None, :]  # W Γ^{-1/2}, dropped directions 0
        rotation = system.broadcast((basis @ z).to(dtype).contiguous())
        self._system = system
        self._U = u @ rotation  # Ũ
        self._coefficient = system.broadcast(coefficient.to(dtype)[..., :, None].contiguous())  # D, [..., q, 1]

    def __call__(self, r: torch.Tensor) -> torch.Tensor:
        """`P⁻¹ r` for `r [..., n, C]` (this rank's rows on a sharded system): one `[..., n, C]` result and a
        `[..., q, C]` workspace."""
        w = self._system.sum_ranks(self._U.mT @ r).mul_(self._coefficient).neg_()
        return (self._U @ w).add_(r)


def _top_eigenpairs(a: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest eigenpairs `(values [..., k] ascending, vectors [..., s, k])` of symmetric `a [..., s, s]`:
    [`kermac.linalg.eigh_range`][kermac_linalg.eigh_range] on CUDA when `kermac-linalg` is installed (cuSOLVER
    computes only those), `torch.linalg.eigh` otherwise."""
    if a.is_cuda and k > 0:
        try:
            import kermac_linalg
        except ImportError:
            pass
        else:
            values, vectors, _ = kermac_linalg.eigh_range(a, top_k=k)
            return values, vectors
    values, vectors = torch.linalg.eigh(a)
    s = a.shape[-1]
    return values[..., s - k :], vectors[..., s - k :]


def _gram64(u: torch.Tensor) -> torch.Tensor:
    """`uᵀu` `[..., q, q]` of `u [..., n, q]` summed in float64 by row blocks of at most about 16 M entries (a
    float32 sum over n rows would lose the orthonormality the preconditioner relies on)."""
    n, q = u.shape[-2:]
    gram = u.new_zeros(u.shape[:-2] + (q, q), dtype=torch.float64)
    rows = max(1, _PRODUCT_CHUNK_ELEMENTS // max(q, 1))
    for i in range(0, n, rows):
        block = u[..., i : i + rows, :].double()
        gram += block.mT @ block
    return gram
