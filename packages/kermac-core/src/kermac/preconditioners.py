r"""Preconditioners for conjugate gradient on `(K + λI) α = y`: callables `r ↦ P⁻¹ r` for `r [..., n, C]`,
built from a [`KernelSystem`][kermac.kernel_system.KernelSystem] (a square operator `K + λI` on one device or
sharded over ranks), symmetric positive definite by construction (CG needs that), used by
[`kermac.solvers.solve`][kermac.solvers.solve].  On a sharded system `r` is the rank's rows and so is `P⁻¹ r`.
"""

from __future__ import annotations

import torch

from kermac.kernel_system import KernelSystem

__all__ = ["NYSTROM_DENSE_ENTRIES", "NystromPreconditioner"]

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
        n, local = system.n, system.points.shape[-2]
        index = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:rank].to(system.device)
        xs = system.gather_points(index)
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
