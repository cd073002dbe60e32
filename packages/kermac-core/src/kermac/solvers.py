r"""Solvers for the regularised kernel system `(K + λI) α = y`, many right-hand sides at once.

[`solve`][kermac.solvers.solve] takes a square [`KernelOperator`][kermac.operator.KernelOperator] that holds
its regularisation (`KernelOperator(kernel, x, x, ..., regularization=λ)`, so `K @ v` already is
`(K + λI) v`) and right-hand sides `y` `[N]` or `[..., N, C]`:

* `method="cholesky"`: the dense matrix (one pairwise pass, `N²` memory) factored `K + λI = L Lᵀ` and
  solved, batched when the operator is; through [`kermac.linalg.cholesky_solve`][kermac_linalg.cholesky_solve]
  on CUDA when `kermac-linalg` is installed, `torch.linalg` otherwise.
* `method="cg"`: conjugate gradient on the matrix-free operator (one fused product per iteration, memory
  `O(N·(D + C))`), every column with its own step sizes `α_k, β_k` and its own convergence; optionally
  preconditioned by a Nyström approximation ([`NystromPreconditioner`][kermac.preconditioners.NystromPreconditioner])
  or by EigenPro's flattening of the top eigenspace
  ([`EigenProPreconditioner`][kermac.preconditioners.EigenProPreconditioner]).
* `method="auto"`: `"cholesky"` while the dense matrix fits ([`dense_fits`][kermac.solvers.dense_fits]),
  `"cg"` with the Nyström preconditioner beyond.

The host is consulted at documented points only: once before solving (one read of the non-finite check of
`y`, together with a check of a tensor λ), once after a Cholesky factorisation (to raise on a matrix that is
not positive definite), and in CG once every `check_every` iterations (whether any column is still running).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from kermac.logs import debug_enabled, logger
from kermac.operator import KernelOperator
from kermac.preconditioners import EigenProPreconditioner, NystromPreconditioner

__all__ = [
    "DENSE_BUDGET_CPU_BYTES",
    "DENSE_MAX_N",
    "ConvergenceError",
    "Solution",
    "cholesky_solve",
    "dense_fits",
    "solve",
]

DENSE_MAX_N = 20_000
"""Largest N for which `method="auto"` factors the dense matrix."""
DENSE_BUDGET_CPU_BYTES = 4 << 30
"""On the CPU, `method="auto"` factors the dense matrix while it takes at most a quarter of this many bytes."""
_METHODS = ("auto", "cholesky", "cg")
_PRECONDITIONERS = ("auto", "nystrom", "eigenpro", None)


class ConvergenceError(RuntimeError):
    """Raised by [`solve`][kermac.solvers.solve] with `raise_on_failure=True` when a column did not converge;
    `solution` holds the full report."""

    def __init__(self, message: str, solution: Solution) -> None:
        super().__init__(message)
        self.solution = solution


@dataclasses.dataclass(frozen=True)
class Solution:
    """The result of [`solve`][kermac.solvers.solve] and its convergence report.

    Attributes:
        alpha: `[..., N]` or `[..., N, C]`, the shape of `y` broadcast with the operator's batch.
        method: `"cholesky"` or `"cg"` (what ran, also under `method="auto"`).
        iterations: int64 `[...]` or `[..., C]` (one entry per column): CG iterations that changed the column;
            zeros for `"cholesky"`.
        converged: bool, like `iterations`: the column's final relative residual is at most `tol` (for
            `"cholesky"`: the factorisation succeeded and the residual is finite).
        residual: like `iterations`, in `alpha`'s dtype: `‖y − (K + λI) α‖ / ‖y‖` recomputed from `alpha`
            after solving (0 for a zero column of `y`).
        preconditioner: `"nystrom"`, `"eigenpro"` or None.
    """

    alpha: torch.Tensor
    method: str
    iterations: torch.Tensor
    converged: torch.Tensor
    residual: torch.Tensor
    preconditioner: str | None


def dense_fits(n: int, batch: int, dtype: torch.dtype, device: torch.device) -> bool:
    """The rule of `method="auto"`: factor the dense matrix when `n ≤ DENSE_MAX_N` and its `batch·n²` entries
    take at most a quarter of the free memory of the CUDA device (`torch.cuda.mem_get_info`, a driver query that
    does not wait for the stream) or of [`DENSE_BUDGET_CPU_BYTES`][kermac.solvers.DENSE_BUDGET_CPU_BYTES] on the
    CPU."""
    if n > DENSE_MAX_N:
        return False
    size = batch * n * n * torch.empty((), dtype=dtype).element_size()
    budget = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else DENSE_BUDGET_CPU_BYTES
    return 4 * size <= budget


def solve(
    K: KernelOperator,
    y: torch.Tensor,
    *,
    method: str = "auto",
    tol: float = 1e-6,
    max_iter: int | None = None,
    preconditioner: str | None = "auto",
    rank: int | None = None,
    subsample: int | None = None,
    check_every: int = 10,
    seed: int = 0,
    raise_on_failure: bool = False,
    debug: bool = False,
) -> Solution:
    r"""Solve `(K + λI) α = y` for every column of `y`.

    Args:
        K: a square [`KernelOperator`][kermac.operator.KernelOperator] `[..., N, N]` holding its regularisation λ
            (its `regularization` hyperparameter; a batch of λ solves a batch of systems). `K + λI` must be
            symmetric positive definite: `K(x, x)` of a positive-definite kernel with λ > 0.
        y: `[N]` or `[..., N, C]`, K's dtype and device (batch dimensions broadcast with K's); finite.
        method: `"cholesky"`, `"cg"` or `"auto"` (see the module; `debug` logs what it picked).
        tol: CG stops a column when its relative residual `‖r‖/‖y‖` is at most `tol`; every method reports a
            column as converged when its recomputed residual is.
        max_iter: CG iteration limit (default `10·N + 100`).
        preconditioner: for CG: `"nystrom"`, `"eigenpro"`, None, or `"auto"` (`"nystrom"`).
        rank: the Nyström preconditioner's number of inducing points m, or the number q of eigen-directions the
            EigenPro preconditioner flattens (default `min(N, max(100, ⌈√N⌉))`).
        subsample: the EigenPro preconditioner's subsample size s, at least `rank` when both are given (default
            `2·rank`; at most N, and q at most s).
        check_every: CG reads on the host whether any column still runs once every this many iterations (one
            `bool` of a device tensor per check); converged columns stop changing at their own iteration.
        seed: seed of the random choice of the Nyström inducing points or the EigenPro subsample.
        raise_on_failure: raise [`ConvergenceError`][kermac.solvers.ConvergenceError] (one more host read) when a
            column did not converge, instead of only reporting it in the [`Solution`][kermac.solvers.Solution].
        debug: log what `method="auto"` picked and CG's preconditioner and iteration limit (`kermac.logs`).

    Returns:
        A [`Solution`][kermac.solvers.Solution].

    Raises:
        TypeError: `K` is not a KernelOperator or `y` not a tensor.
        ValueError: a non-square K, `y` of the wrong shape, dtype or device, a NaN or infinity in `y`, λ ≤ 0
            where CG or the Nyström preconditioner needs λ > 0, a matrix that is not positive definite for
            `"cholesky"`, or an invalid option.
        ConvergenceError: with `raise_on_failure`, a column that did not converge.
    """
    debug = debug_enabled(debug)
    n, y2, vector = _check_system(K, y)
    method, preconditioner = _check_options(method, tol, max_iter, preconditioner, rank, subsample, check_every)
    lam = _regularization(K)
    batch = math.prod(torch.broadcast_shapes(K.shape[:-2], y2.shape[:-2]))
    if method == "auto":
        method = "cholesky" if dense_fits(n, batch, K.dtype, K.device) else "cg"
        if debug:
            logger.debug(
                "kermac.solvers.solve: method='auto' picked %r (N=%d, batch=%d, %s)", method, n, batch, K.dtype
            )
    needs_lambda = method == "cg"
    _check_finite_and_lambda(y2, lam if needs_lambda else None)
    if method == "cholesky":
        alpha, iterations, ok = _cholesky(K, y2, lam)
        precond = None
    else:
        precond = "nystrom" if preconditioner == "auto" else preconditioner
        if precond == "eigenpro":
            apply = EigenProPreconditioner(K, lam, _rank(rank, n), subsample, seed)
        else:
            apply = NystromPreconditioner(K, lam, _rank(rank, n), seed) if precond else None
        limit = max_iter if max_iter is not None else 10 * n + 100
        alpha, iterations = _cg(K, y2, apply, tol, limit, check_every)
        if debug:
            logger.debug("kermac.solvers.solve: cg with preconditioner %r, up to %d iterations", precond, limit)
        ok = None
    residual = _relative_residual(K, y2, alpha)
    converged = residual <= tol if ok is None else ok & residual.isfinite()
    if vector:
        alpha, iterations, converged, residual = alpha[..., 0], iterations[..., 0], converged[..., 0], residual[..., 0]
    solution = Solution(alpha, method, iterations, converged, residual, precond)
    if raise_on_failure and not bool(converged.all()):
        raise ConvergenceError(
            f"solve: {int((~converged).sum())} of {converged.numel()} columns did not reach tol={tol} with "
            f"method={method!r} (largest relative residual {float(residual.max())}); see error.solution",
            solution,
        )
    return solution


def _check_system(K: object, y: object) -> tuple[int, torch.Tensor, bool]:
    """`(N, y as [..., N, C], whether y was a vector)` after checking types and shapes."""
    if not isinstance(K, KernelOperator):
        raise TypeError(f"K: expected a kermac.KernelOperator, got {type(K).__name__}")
    m, n = K.shape[-2:]
    if m != n:
        raise ValueError(f"K: expected a square operator [..., N, N], got shape {list(K.shape)}")
    if not isinstance(y, torch.Tensor):
        raise TypeError(f"y: expected a torch.Tensor, got {type(y).__name__}")
    if y.dtype != K.dtype or y.device != K.device:
        raise ValueError(f"y: expected dtype {K.dtype} on {K.device} (K's), got {y.dtype} on {y.device}")
    if y.dim() == 0 or y.shape[-1 if y.dim() == 1 else -2] != n:
        raise ValueError(f"y: expected shape [{n}] or [..., {n}, C] (N = {n}, K's size), got {list(y.shape)}")
    try:
        torch.broadcast_shapes(K.shape[:-2], y.shape[:-2] if y.dim() > 1 else ())
    except RuntimeError as exc:
        raise ValueError(
            f"y: batch dimensions {list(y.shape[:-2])} do not broadcast with K's {list(K.shape[:-2])}"
        ) from exc
    return n, (y[:, None] if y.dim() == 1 else y), y.dim() == 1


def _check_options(
    method: object,
    tol: object,
    max_iter: object,
    preconditioner: object,
    rank: object,
    subsample: object,
    check_every: object,
) -> tuple[str, str | None]:
    if method not in _METHODS:
        raise ValueError(f"method: expected one of {list(_METHODS)}, got {method!r}")
    if preconditioner not in _PRECONDITIONERS:
        raise ValueError(f"preconditioner: expected one of {list(_PRECONDITIONERS)}, got {preconditioner!r}")
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not (0 < tol < math.inf):
        raise ValueError(f"tol: expected a positive finite number, got {tol!r}")
    options = (
        ("max_iter", max_iter, 0),
        ("rank", rank, 1),
        ("subsample", subsample, 1),
        ("check_every", check_every, 1),
    )
    for name, value, low in options:
        if value is None and name != "check_every":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(
                f"{name}: expected an int ≥ {low}{' or None' if name != 'check_every' else ''}, got {value!r}"
            )
    if rank is not None and subsample is not None and subsample < rank:
        raise ValueError(
            f"subsample: expected an int ≥ rank = {rank} (the subsample holds the eigenpairs), got {subsample}"
        )
    return method, preconditioner


def _regularization(K: KernelOperator) -> float | torch.Tensor:
    """λ of `K` (0 when it has none): a float, or a tensor `[..., 1, 1]` aligned with K's batch."""
    lam = K.regularization
    if lam is None:
        return 0.0
    if isinstance(lam, float):
        return lam
    return torch.broadcast_to(lam, K.shape[:-2])[..., None, None]


def _check_finite_and_lambda(y: torch.Tensor, lam: float | torch.Tensor | None) -> None:
    """The one host read before solving: whether `y` holds a NaN or an infinity and whether a tensor λ has an
    entry ≤ 0 (a Python λ is checked on the host)."""
    flags = [~torch.isfinite(y).all()]
    if isinstance(lam, torch.Tensor):
        flags.append((lam <= 0).any())
    bad_y, *bad_lam = torch.stack(flags).tolist()
    if bad_y:
        raise ValueError("y: expected finite values, got a NaN or an infinity")
    if (bad_lam and bad_lam[0]) or (lam is not None and not isinstance(lam, torch.Tensor) and not lam > 0):
        shown = "an entry ≤ 0" if isinstance(lam, torch.Tensor) else repr(lam)
        raise ValueError(
            f"regularization: conjugate gradient needs λ > 0 on the operator (KernelOperator(..., regularization=λ)) "
            f"for a positive-definite system, got {shown}; use method='cholesky' for λ = 0"
        )


def _rank(rank: int | None, n: int) -> int:
    return min(n, rank if rank is not None else max(100, math.isqrt(n - 1) + 1 if n else 0))


def cholesky_solve(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`(X, info)` for SPD `a [..., N, N]`, `b [..., N, C]`:
    [`kermac.linalg.cholesky_solve`][kermac_linalg.cholesky_solve] on CUDA when `kermac-linalg` is installed
    (cuSOLVER, no host wait), `torch.linalg` otherwise; `info [...]` is non-zero where `a` is not positive
    definite."""
    if a.is_cuda:
        try:
            import kermac_linalg
        except ImportError:
            pass
        else:
            return kermac_linalg.cholesky_solve(a, b)
    factor, info = torch.linalg.cholesky_ex(a)
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    factor = factor.expand(batch + factor.shape[-2:])
    return torch.cholesky_solve(b.expand(batch + b.shape[-2:]), factor), info


def _cholesky(
    K: KernelOperator, y: torch.Tensor, lam: float | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Dense solve; one host read of the factorisation status, to raise on a matrix not positive definite."""
    alpha, info = cholesky_solve(K.to_dense(), y)
    failed = info != 0
    if bool(failed.any()):
        shown = f"λ = {lam!r}" if not isinstance(lam, torch.Tensor) else "the given λ"
        raise ValueError(
            f"regularization: K + λI is not positive definite ({shown}; {int(failed.sum())} of {failed.numel()} "
            "batch entries failed the Cholesky factorisation); increase the regularization"
        )
    iterations = torch.zeros(alpha.shape[:-2] + alpha.shape[-1:], dtype=torch.int64, device=alpha.device)
    return alpha, iterations, ~failed[..., None].expand(iterations.shape)


def _column_norm(t: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(t, dim=-2)


def _relative_residual(K: KernelOperator, y: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """`‖y − K α‖ / ‖y‖` per column (one product), 0 where the column of y is 0 (then α is 0 too)."""
    ynorm = _column_norm(y)
    r = _column_norm(y - K @ alpha)
    return torch.where(ynorm > 0, r / torch.where(ynorm > 0, ynorm, 1), r)


def _cg(
    K: KernelOperator,
    y: torch.Tensor,
    precondition: NystromPreconditioner | EigenProPreconditioner | None,
    tol: float,
    max_iter: int,
    check_every: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Preconditioned conjugate gradient on every column at once: `(α [..., N, C], iterations [..., C])`.

    Per column: `q = K p`, `a = (rᵀz)/(pᵀq)`, `α += a p`, `r −= a q`, `z = P⁻¹ r`, `b = (r'ᵀz')/(rᵀz)`,
    `p = z + b p`; a column whose recursive residual `‖r‖/‖y‖` reaches `tol` gets step 0 from then on (it
    stops changing). The host reads whether any column still runs once every `check_every` iterations.
    Workspace: `r`, `p`, `q = K p` and, with a preconditioner, `z`, each like `α`; updates run in place.
    """
    batch = torch.broadcast_shapes(K.shape[:-2], y.shape[:-2])
    y = y.expand(batch + y.shape[-2:])
    ynorm = _column_norm(y)
    threshold = tol * ynorm
    alpha = torch.zeros_like(y)
    r = y.clone()
    z = precondition(r) if precondition else r
    p = z.clone()
    rz = (r * z).sum(-2)
    active = _column_norm(r) > threshold
    iterations = torch.zeros(active.shape, dtype=torch.int64, device=y.device)
    for i in range(max_iter):
        if i % check_every == 0 and not bool(active.any()):
            break
        q = K @ p
        pq = (p * q).sum(-2)
        step = torch.where(active & (pq > 0), rz / torch.where(pq > 0, pq, 1), 0)
        alpha.addcmul_(step[..., None, :], p)
        r.addcmul_(step[..., None, :], q, value=-1)
        iterations = iterations + active
        active = active & (_column_norm(r) > threshold)
        z = precondition(r) if precondition else r
        rz_next = (r * z).sum(-2)
        beta = torch.where(rz > 0, rz_next / torch.where(rz > 0, rz, 1), 0)
        p.mul_(beta[..., None, :]).add_(z)
        rz = rz_next
    return alpha, iterations
