r"""Solvers for the regularised kernel system `(K + λI) α = y`, many right-hand sides at once.

[`solve`][kermac.solvers.solve] takes a square [`KernelOperator`][kermac.operator.KernelOperator] that holds
its regularisation (`KernelOperator(kernel, x, x, ..., regularization=λ)`, so `K @ v` already is
`(K + λI) v`), or a square [`ShardedKernelOperator`][kermac.distributed.ShardedKernelOperator] whose ranks each
hold a shard of the rows, and right-hand sides `y` `[N]` or `[..., N, C]` (a rank's rows of them when sharded):

* `method="cholesky"`: the dense matrix (one pairwise pass, `N²` memory) factored `K + λI = L Lᵀ` and
  solved, batched when the operator is; through [`kermac.linalg.cholesky_solve`][kermac_linalg.cholesky_solve]
  on CUDA when `kermac-linalg` is installed, `torch.linalg` otherwise.
* `method="cg"`: conjugate gradient on the matrix-free operator (one fused product per iteration, memory
  `O(N·(D + C))`), every column with its own step sizes `α_k, β_k` and its own convergence; optionally
  preconditioned by a Nyström approximation ([`NystromPreconditioner`][kermac.preconditioners.NystromPreconditioner])
  or by EigenPro's flattening of the top eigenspace
  ([`EigenProPreconditioner`][kermac.preconditioners.EigenProPreconditioner]). On a sharded operator each
  iteration is one ring product and two `all_reduce`s of `C` (or `2C`) numbers.
* `method="auto"`: `"cholesky"` while the dense matrix fits ([`dense_fits`][kermac.solvers.dense_fits]) on the
  operator's one device, `"cg"` beyond and for a sharded operator; where a float32 (or half) factorisation fails
  (`K + λI` not positive definite in that rounding, as with a small λ) and the float64 matrix fits too, the
  matrix is computed and factored again in float64.
  CG's `preconditioner="auto"` is EigenPro's while its dense `N × q` basis fits
  ([`eigenpro_fits`][kermac.solvers.eigenpro_fits], on every rank of a sharded operator), Nyström's beyond.

**Mixed precision.** `y` may be wider than the operator (float64 with a float32 or half operator, float32 with
a half one): `α` and the residuals then have `y`'s dtype. `"cholesky"` factors the matrix computed in `y`'s
dtype; `"cg"` refines iteratively — each step solves `(K + λI) δ = r` by CG in the operator's dtype to a
relative residual of [`REFINEMENT_TOL`][kermac.solvers.REFINEMENT_TOL], adds `δ` to `α` in `y`'s dtype and
recomputes `r = y − (K + λI) α` with one product in `y`'s dtype — so a float32 kernel reaches residuals that
float32 arithmetic alone cannot (the products' rounding bounds plain float32 CG at about `eps₃₂ · cond`).

The host is consulted at documented points only: once before solving (one read of the checks of `y` and of a
tensor λ and of whether EigenPro's basis fits, agreed over the ranks of a sharded operator), once after a
Cholesky factorisation (to raise on a matrix that is not positive definite; under `"auto"` once more after a
float64 factorisation that follows a failed narrower one), in CG once every `check_every`
iterations (whether any column is still running), and once per refinement step (whether every column has
converged).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch

from kermac.distributed import ShardedKernelOperator
from kermac.kernel_system import KernelSystem
from kermac.logs import debug_enabled, logger
from kermac.operator import KernelOperator
from kermac.preconditioners import EigenProPreconditioner, NystromPreconditioner

__all__ = [
    "DENSE_BUDGET_CPU_BYTES",
    "MAX_REFINEMENTS",
    "REFINEMENT_TOL",
    "ConvergenceError",
    "Solution",
    "cholesky_solve",
    "dense_fits",
    "eigenpro_fits",
    "solve",
]

DENSE_BUDGET_CPU_BYTES = 4 << 30
"""On the CPU, `method="auto"` factors the dense matrix while it takes at most a quarter of this many bytes."""
REFINEMENT_TOL = 1e-2
"""Mixed-precision CG: the relative residual each refinement step's CG solve reaches in the operator's dtype
(well above what float32 and half CG attain on ill-conditioned systems, so each step makes progress; every step
multiplies the residual by about this factor)."""
MAX_REFINEMENTS = 20
"""Mixed-precision CG: the largest number of refinement steps (a step that improves no column ends the solve
earlier)."""
_METHODS = ("auto", "cholesky", "cg")
_PRECONDITIONERS = ("auto", "nystrom", "eigenpro", None)
_WIDER = {torch.float64: 3, torch.float32: 2, torch.bfloat16: 1, torch.float16: 1}  # y may be wider than K


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
        alpha: `[..., N]` or `[..., N, C]`, the shape of `y` broadcast with the operator's batch, `y`'s dtype
            (this rank's rows for a sharded operator).
        method: `"cholesky"` or `"cg"` (what ran, also under `method="auto"`).
        iterations: int64 `[...]` or `[..., C]` (one entry per column): CG iterations that changed the column
            (summed over the refinement steps); zeros for `"cholesky"`.
        converged: bool, like `iterations`: the column's final relative residual is at most `tol` (for
            `"cholesky"`: the factorisation succeeded and the residual is finite).
        residual: like `iterations`, in `y`'s dtype: `‖y − (K + λI) α‖ / ‖y‖` recomputed from `alpha`
            after solving (0 for a zero column of `y`).
        preconditioner: `"nystrom"`, `"eigenpro"` or None.
        refinements: mixed-precision CG's refinement steps (0 when `y` has the operator's dtype).
    """

    alpha: torch.Tensor
    method: str
    iterations: torch.Tensor
    converged: torch.Tensor
    residual: torch.Tensor
    preconditioner: str | None
    refinements: int = 0


def dense_fits(n: int, batch: int, dtype: torch.dtype, device: torch.device) -> bool:
    """The rule of `method="auto"` on one device: factor the dense matrix when its `batch·n²` entries take at
    most a quarter of the free memory of the CUDA device (`torch.cuda.mem_get_info`, a driver query that does not
    wait for the stream) or of [`DENSE_BUDGET_CPU_BYTES`][kermac.solvers.DENSE_BUDGET_CPU_BYTES] on the CPU.

    Memory is the only limit: wherever the matrix fits, its `n³/3` factorisation took less time than
    preconditioned CG's hundreds of `n²` products where measured (docs/dev/dense-or-cg.md)."""
    return _fits(batch * n * n, dtype, device)


def _fits(entries: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether `entries` of `dtype` take at most a quarter of the free memory of the CUDA device
    (`torch.cuda.mem_get_info`, a driver query that does not wait for the stream) or of
    [`DENSE_BUDGET_CPU_BYTES`][kermac.solvers.DENSE_BUDGET_CPU_BYTES] on the CPU."""
    size = entries * torch.empty((), dtype=dtype).element_size()
    budget = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else DENSE_BUDGET_CPU_BYTES
    return 4 * size <= budget


def eigenpro_fits(rows: int, rank: int, batch: int, dtype: torch.dtype, device: torch.device) -> bool:
    """The rule of `preconditioner="auto"`: the EigenPro preconditioner when its basis `Ũ` and the extension `U`
    it is computed from (`2·batch·rows·rank` entries of `dtype`, `rows` this process's rows, `batch` the operator's
    batch entries) take at most a quarter of the free memory of the CUDA device or of
    [`DENSE_BUDGET_CPU_BYTES`][kermac.solvers.DENSE_BUDGET_CPU_BYTES] on the CPU; the Nyström preconditioner
    otherwise.

    EigenPro took fewer iterations than Nyström at about the same cost per iteration where measured
    (docs/dev/eigenpro-preconditioner.md); its price is the dense basis, `N·q` entries where Nyström keeps `q²`
    (`q = max(100, ⌈√N⌉)` by default: 4 GB in float32 at N = 10⁶, 126 GB at 10⁷)."""
    return _fits(2 * batch * rows * rank, dtype, device)


def solve(
    K: KernelOperator | ShardedKernelOperator,
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
            (its `regularization` hyperparameter; a batch of λ solves a batch of systems), or a square
            [`ShardedKernelOperator`][kermac.distributed.ShardedKernelOperator] built with the same tensor as
            `x_shard` and `z_shard` on every rank. `K + λI` must be symmetric positive definite: `K(x, x)` of a
            positive-definite kernel with λ > 0.
        y: `[N]` or `[..., N, C]` (batch dimensions broadcast with K's; for a sharded operator this rank's rows,
            `[N_r]` or `[N_r, C]`), on K's device, finite, of K's dtype or a wider one (mixed precision: see
            the module).
        method: `"cholesky"`, `"cg"` or `"auto"` (see the module; `debug` logs what it picked). A sharded
            operator solves by `"cg"`.
        tol: CG stops a column when its relative residual `‖r‖/‖y‖` is at most `tol`; every method reports a
            column as converged when its recomputed residual is.
        max_iter: CG iteration limit (default `10·N + 100`), over all refinement steps together.
        preconditioner: for CG: `"nystrom"`, `"eigenpro"`, None, or `"auto"` (`"eigenpro"` where
            [`eigenpro_fits`][kermac.solvers.eigenpro_fits] on every rank, else `"nystrom"`).
        rank: the Nyström preconditioner's number of inducing points m, or the number q of eigen-directions the
            EigenPro preconditioner flattens (default `min(N, max(100, ⌈√N⌉))`).
        subsample: the EigenPro preconditioner's subsample size s, at least `rank` when both are given (default
            `2·rank`; at most N, and q at most s).
        check_every: CG reads on the host whether any column still runs once every this many iterations (one
            `bool` of a device tensor per check); converged columns stop changing at their own iteration.
        seed: seed of the random choice of the Nyström inducing points or the EigenPro subsample (the same on
            every rank).
        raise_on_failure: raise [`ConvergenceError`][kermac.solvers.ConvergenceError] (one more host read) when a
            column did not converge, instead of only reporting it in the [`Solution`][kermac.solvers.Solution].
        debug: log what `method="auto"` picked and CG's preconditioner (also under `"auto"`) and iteration limit
            (`kermac.logs`).

    Every rank of a sharded operator calls `solve` with the same arguments (but its own rows of `y`), as for
    any collective; the checks of `y` are agreed over the ranks before any rank raises.

    Returns:
        A [`Solution`][kermac.solvers.Solution].

    Raises:
        TypeError: `K` is not a kernel operator or `y` not a tensor.
        ValueError: a non-square K, `y` of the wrong shape, dtype or device, a NaN or infinity in `y`, λ ≤ 0
            where CG or the Nyström preconditioner needs λ > 0, a matrix that is not positive definite for
            `"cholesky"`, `"cholesky"` on a sharded operator, or an invalid option.
        RuntimeError: on a sharded operator, another rank's `y` was refused (that rank raises the reason).
        ConvergenceError: with `raise_on_failure`, a column that did not converge.
    """
    debug = debug_enabled(debug)
    system = _system(K)
    method, preconditioner = _check_options(method, tol, max_iter, preconditioner, rank, subsample, check_every)
    if system.group is not None and method == "cholesky":
        raise ValueError(
            "method: 'cholesky' needs the dense matrix on one device; a ShardedKernelOperator solves by 'cg' "
            "(or 'auto')"
        )
    n = system.n
    y2, vector, error = _check_rhs(system, y)
    batch = math.prod(torch.broadcast_shapes(system.batch, y2.shape[:-2])) if error is None else 1
    picked = method == "auto"
    if picked:
        dense = system.group is None and dense_fits(n, batch, y2.dtype, system.device)
        method = "cholesky" if dense else "cg"
        if debug:
            logger.debug(
                "kermac.solvers.solve: method='auto' picked %r (N=%d, batch=%d, %s%s)", method, n, batch, y2.dtype,
                ", sharded" if system.group is not None else "",
            )  # fmt: skip
    lam = system.regularization
    q = _rank(rank, n)
    fits = None
    if method == "cg" and preconditioner == "auto":
        fits = eigenpro_fits(system.points.shape[-2], q, math.prod(system.batch), system.dtype, system.device)
    declined = _check_agreed(system, y2, error, lam if method == "cg" else None, fits)
    wide = system.to(y2.dtype)
    refinements = 0
    if method == "cholesky":
        retry = picked and wide.dtype != torch.float64 and dense_fits(n, batch, torch.float64, system.device)
        factored = _cholesky(wide, y2, fall_back=retry)
        if factored is None:  # not positive definite in y's rounding (a small λ): the float64 factor
            if debug:
                logger.debug("kermac.solvers.solve: the %s Cholesky factorisation failed; method='auto' factors in "
                             "float64", wide.dtype)  # fmt: skip
            alpha, iterations, ok = _cholesky(wide.to(torch.float64), y2.to(torch.float64))
            alpha = alpha.to(y2.dtype)
        else:
            alpha, iterations, ok = factored
        precond = None
    else:
        precond = ("nystrom" if declined else "eigenpro") if preconditioner == "auto" else preconditioner
        if precond == "eigenpro":
            apply = EigenProPreconditioner(system, q, subsample, seed)
        else:
            apply = NystromPreconditioner(system, q, seed) if precond else None
        limit = max_iter if max_iter is not None else 10 * n + 100
        if debug:
            logger.debug("kermac.solvers.solve: cg with preconditioner %r, up to %d iterations", precond, limit)
        if wide is system:
            alpha, iterations = _cg(system, y2, apply, tol, limit, check_every)
        else:
            alpha, iterations, refinements = _refined_cg(system, wide, y2, apply, tol, limit, check_every)
        ok = None
    residual = _relative_residual(wide, y2, alpha)
    converged = residual <= tol if ok is None else ok & residual.isfinite()
    if vector:
        alpha, iterations, converged, residual = alpha[..., 0], iterations[..., 0], converged[..., 0], residual[..., 0]
    solution = Solution(alpha, method, iterations, converged, residual, precond, refinements)
    if raise_on_failure and not bool(converged.all()):
        raise ConvergenceError(
            f"solve: {int((~converged).sum())} of {converged.numel()} columns did not reach tol={tol} with "
            f"method={method!r} (largest relative residual {float(residual.max())}); see error.solution",
            solution,
        )
    return solution


def _system(K: object) -> KernelSystem:
    """The [`KernelSystem`][kermac.kernel_system.KernelSystem] of a square operator (the checks every rank
    decides alike: the type and the global shape)."""
    if not isinstance(K, (KernelOperator, ShardedKernelOperator)):
        raise TypeError(f"K: expected a kermac.KernelOperator or ShardedKernelOperator, got {type(K).__name__}")
    m, n = K.shape[-2:]
    if m != n:
        raise ValueError(f"K: expected a square operator [..., N, N], got shape {list(K.shape)}")
    return KernelSystem(K)


def _check_rhs(system: KernelSystem, y: object) -> tuple[torch.Tensor | None, bool, Exception | None]:
    """`(y as [..., N, C], whether y was a vector, None)` after checking type, dtype, device and shape, or
    `(None, False, the error)` (raised after the ranks agree)."""
    n = system.points.shape[-2] if system.group is not None else system.n
    what = f"this rank's {n} of the {system.n} rows" if system.group is not None else f"N = {n}, K's size"
    try:
        if system.group is not None and not _same_tensor(system.operator.local_rows, system.operator.local_columns):
            raise ValueError(
                "K: expected a sharded operator built with the same tensor as x_shard and z_shard on every rank "
                "(the square system K(x, x)), got different row and column shards on this rank"
            )
        if not isinstance(y, torch.Tensor):
            raise TypeError(f"y: expected a torch.Tensor, got {type(y).__name__}")
        dtype = system.dtype
        if y.device != system.device or _WIDER.get(y.dtype, 0) < _WIDER[dtype]:
            raise ValueError(
                f"y: expected dtype {dtype} or a wider floating dtype on {system.device} (K's), got {y.dtype} on "
                f"{y.device}"
            )
        if y.dim() == 0 or y.shape[-1 if y.dim() == 1 else -2] != n:
            raise ValueError(f"y: expected shape [{n}] or [..., {n}, C] ({what}), got {list(y.shape)}")
        batch = y.shape[:-2] if y.dim() > 1 else ()
        if system.group is not None and batch:
            raise ValueError(f"y: expected [{n}] or [{n}, C] for a sharded operator, got {list(y.shape)}")
        try:
            torch.broadcast_shapes(system.batch, batch)
        except RuntimeError as exc:
            raise ValueError(
                f"y: batch dimensions {list(batch)} do not broadcast with K's {list(system.batch)}"
            ) from exc
    except (TypeError, ValueError) as exc:
        if system.group is None:
            raise
        return None, False, exc
    return (y[:, None] if y.dim() == 1 else y), y.dim() == 1, None


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether `a` and `b` are views of the same elements (the same memory, shape and strides)."""
    return a is b or (
        a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype
    )


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


def _check_agreed(
    system: KernelSystem,
    y: torch.Tensor | None,
    error: Exception | None,
    lam: float | torch.Tensor | None,
    eigenpro_fits: bool | None,
) -> bool:
    """The one host read before solving: whether `y` was refused, holds a NaN or an infinity, has another number
    of columns than on the other ranks, and whether a tensor λ has an entry ≤ 0 (a Python λ is checked on the
    host) — OR-ed over the ranks of a sharded operator, so that every rank raises or none does.  Returns whether
    some rank's EigenPro basis does not fit (`eigenpro_fits` False on a rank; None: not asked), which every rank
    then decides alike."""
    device = system.device
    flags = torch.zeros(5, dtype=torch.int64, device=device)  # refused, non-finite y, λ ≤ 0, too large, columns (±)
    flags[3] = eigenpro_fits is False
    if error is not None:
        flags[0] = 1
    else:
        flags[1] = ~torch.isfinite(y).all()
        columns = y.shape[-1]
        flags[4] = columns
        if isinstance(lam, torch.Tensor):
            flags[2] = (lam <= 0).any()
    if system.group is not None:
        flags = torch.cat([flags, -flags[4:]])  # the largest and the smallest number of columns
    refused, bad_y, bad_lam, declined, *columns = system.any_rank(flags).tolist()
    if error is not None:
        raise error
    if refused:
        raise RuntimeError("solve: another rank's y was refused (that rank's error names the reason)")
    if system.group is not None and columns[0] != -columns[1]:
        raise ValueError(
            f"y: expected the same number of columns C on every rank, got between {-columns[1]} and {columns[0]}"
        )
    if bad_y:
        raise ValueError("y: expected finite values, got a NaN or an infinity")
    if bad_lam or (lam is not None and not isinstance(lam, torch.Tensor) and not lam > 0):
        shown = "an entry ≤ 0" if isinstance(lam, torch.Tensor) else repr(lam)
        raise ValueError(
            f"regularization: conjugate gradient needs λ > 0 on the operator (KernelOperator(..., regularization=λ)) "
            f"for a positive-definite system, got {shown}; use method='cholesky' for λ = 0"
        )
    return bool(declined)


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
    system: KernelSystem, y: torch.Tensor, *, fall_back: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Dense solve; one host read of the factorisation status, to raise on a matrix not positive definite (None
    instead with `fall_back`, for `method="auto"` to factor it in float64)."""
    alpha, info = cholesky_solve(system.operator.to_dense(), y)
    failed = info != 0
    if bool(failed.any()):
        if fall_back:
            return None
        lam = system.regularization
        shown = f"λ = {lam!r}" if not isinstance(lam, torch.Tensor) else "the given λ"
        raise ValueError(
            f"regularization: K + λI is not positive definite ({shown}; {int(failed.sum())} of {failed.numel()} "
            "batch entries failed the Cholesky factorisation); increase the regularization"
        )
    iterations = torch.zeros(alpha.shape[:-2] + alpha.shape[-1:], dtype=torch.int64, device=alpha.device)
    return alpha, iterations, ~failed[..., None].expand(iterations.shape)


def _relative_residual(system: KernelSystem, y: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """`‖y − K α‖ / ‖y‖` per column (one product), 0 where the column of y is 0 (then α is 0 too)."""
    ynorm = system.column_norm(y)
    r = system.column_norm(y - system @ alpha)
    return torch.where(ynorm > 0, r / torch.where(ynorm > 0, ynorm, 1), r)


def _cg(
    system: KernelSystem,
    y: torch.Tensor,
    precondition: Callable[[torch.Tensor], torch.Tensor] | None,
    tol: float,
    max_iter: int,
    check_every: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Preconditioned conjugate gradient on every column at once: `(α [..., N, C], iterations [..., C])`.

    Per column: `q = K p`, `a = (rᵀz)/(pᵀq)`, `α += a p`, `r −= a q`, `z = P⁻¹ r`, `b = (r'ᵀz')/(rᵀz)`,
    `p = z + b p`; a column whose recursive residual `‖r‖/‖y‖` reaches `tol` gets step 0 from then on (it
    stops changing). The host reads whether any column still runs once every `check_every` iterations.
    Workspace: `r`, `p`, `q = K p` and, with a preconditioner, `z`, each like `α`; updates run in place. On a
    sharded system the sums over rows are `all_reduce`s: `pᵀq`, then `‖r‖²` and `rᵀz` together.
    """
    y = y.expand(torch.broadcast_shapes(system.batch, y.shape[:-2]) + y.shape[-2:])
    threshold = tol * system.column_norm(y)
    alpha = torch.zeros_like(y)
    r = y.clone()
    z = precondition(r) if precondition else r
    p = z.clone()
    rz = system.row_sum(r * z)
    active = system.column_norm(r) > threshold
    iterations = torch.zeros(active.shape, dtype=torch.int64, device=y.device)
    columns = y.shape[-1]
    for i in range(max_iter):
        if i % check_every == 0 and not bool(active.any()):
            break
        q = system @ p
        pq = system.row_sum(p * q)
        step = torch.where(active & (pq > 0), rz / torch.where(pq > 0, pq, 1), 0)
        alpha.addcmul_(step[..., None, :], p)
        r.addcmul_(step[..., None, :], q, value=-1)
        iterations = iterations + active
        z = precondition(r) if precondition else r
        sums = system.row_sum(torch.cat([r * r, r * z], dim=-1))  # one reduction for both
        active = active & (sums[..., :columns].sqrt() > threshold)
        rz_next = sums[..., columns:]
        beta = torch.where(rz > 0, rz_next / torch.where(rz > 0, rz, 1), 0)
        p.mul_(beta[..., None, :]).add_(z)
        rz = rz_next
    return alpha, iterations


def _refined_cg(
    system: KernelSystem,
    wide: KernelSystem,
    y: torch.Tensor,
    precondition: Callable[[torch.Tensor], torch.Tensor] | None,
    tol: float,
    max_iter: int,
    check_every: int,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    r"""Mixed-precision CG by iterative refinement: `(α, iterations, refinement steps)`, α in `y`'s dtype.

    Step: `δ = CG(system, r / ‖r‖)` in the system's (narrower) dtype to
    [`REFINEMENT_TOL`][kermac.solvers.REFINEMENT_TOL] (converged columns get `r = 0`, on which CG does nothing),
    `α += ‖r‖ δ`, `r = y − (K + λI) α` by one product of `wide` (the system in `y`'s dtype). Ends when no column
    still above `tol` halved its residual in the last step (so also when every column has converged), after
    [`MAX_REFINEMENTS`][kermac.solvers.MAX_REFINEMENTS] steps, or when the iteration budget is spent; one host
    read per step. Workspace: `α` and `r` in `y`'s dtype and CG's in the narrow dtype.
    """
    y = y.expand(torch.broadcast_shapes(system.batch, y.shape[:-2]) + y.shape[-2:])
    ynorm = wide.column_norm(y)
    threshold = tol * ynorm
    alpha, r, rnorm = torch.zeros_like(y), y, ynorm
    iterations = torch.zeros(ynorm.shape, dtype=torch.int64, device=y.device)
    improved = rnorm > threshold  # before the first step: every column still running
    steps = 0
    while steps < MAX_REFINEMENTS:
        spent = torch.cat([iterations.flatten(), iterations.new_zeros(1)]).max()
        go, spent = torch.stack([improved.any().long(), spent]).tolist()  # the step's one host read
        if not go or spent >= max_iter:
            break
        running = rnorm > threshold
        scale = torch.where(running, rnorm, 0)[..., None, :]
        unit = torch.where(scale > 0, r / torch.where(scale > 0, scale, 1), 0).to(system.dtype)
        delta, used = _cg(system, unit, precondition, REFINEMENT_TOL, max_iter - spent, check_every)
        alpha = alpha + scale * delta.to(y.dtype)
        iterations = iterations + used
        r = y - wide @ alpha
        previous, rnorm = rnorm, wide.column_norm(r)
        improved = running & (rnorm > threshold) & (rnorm <= previous / 2)  # still running, and progressing
        steps += 1
    return alpha, iterations, steps
