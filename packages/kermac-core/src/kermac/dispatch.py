"""Running normalised problems on a backend: what the public operations and autograd share.

The operations of [`kermac.ops`][kermac.ops] run their problems through here: `run_pairwise` /
`run_grad` / `run_product` / `run_product_grad` pick a backend ([`kermac.registry`][kermac.registry]) for a problem of
`kermac.problem`, log the choice under `debug` and let the backend write `problem.out`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kermac import product_blocked, product_split, registry
from kermac.backend import Backend
from kermac.errors import BackendError
from kermac.logs import logger
from kermac.problem import GradProblem, PairwiseProblem, ProductGradProblem, ProductProblem

__all__ = ["run_grad", "run_pairwise", "run_product", "run_product_grad"]


Problem = PairwiseProblem | GradProblem | ProductProblem | ProductGradProblem


def run_pairwise(problem: PairwiseProblem, backend: str, op: str) -> torch.Tensor:
    """`problem.out` written by the backend `backend` (a name or `"auto"`) chooses; `op`
    names the public operation in log messages.  Empty and `meta` outputs are returned as they are."""
    return _run(problem, backend, op, "pairwise problem", "M={} N={} D={}", "program")


def run_grad(problem: GradProblem, backend: str, op: str) -> torch.Tensor:
    """As `run_pairwise`, for a gradient problem (in either form: `problem.hooks`)."""
    return _run(problem, backend, op, "gradient problem", "M={} N={} O={} K={}", "program")


def run_product(problem: ProductProblem, backend: str, op: str) -> torch.Tensor:
    """As `run_pairwise`, for a fused kernel product.  With `N = 0` the sum over `n` is empty: `out` is
    filled with zeros here, without asking a backend (as an empty output is returned without one).  On a CUDA
    device a product with too few rows to fill it runs as products over slices of `n`
    ([`kermac.product_split`][kermac.product_split]), and with `backend="auto"` one whose fused kernels are slower
    than writing K runs as row blocks of K and matrix products ([`kermac.product_blocked`][kermac.product_blocked])."""
    what = "kernel product problem"
    slices = _slice_count(problem)
    if slices == 1 and product_blocked.applies(problem, backend):
        return _run_blocked(problem, backend, op)
    return _run_split(problem, backend, op, what, "program", slices)


def run_product_grad(problem: ProductGradProblem, backend: str, op: str) -> torch.Tensor:
    """As `run_product`, for the gradient product of a fused kernel product (with `N = 0` the sum is empty: zeros;
    few rows: split as the product is)."""
    what = "kernel product gradient problem"
    return _run_split(problem, backend, op, what, "gradient of program", _slice_count(problem))


def _slice_count(problem: ProductProblem | ProductGradProblem) -> int:
    """The slices of `n` a product or gradient product runs as (1: unsplit; `kermac.product_split`)."""
    if problem.device.type == "cuda" and problem.out.numel() > 0:
        return product_split.split_count(problem, product_split.multiprocessors(problem.device))
    return 1


def _run_blocked(problem: ProductProblem, backend: str, op: str) -> torch.Tensor:
    """`problem.out` as row blocks of K (`run_pairwise` into one workspace block) times `v`
    ([`kermac.product_blocked`][kermac.product_blocked])."""
    blocks = product_blocked.block_problems(problem)
    if problem.debug:
        m, n = problem.sizes[:2]
        logger.debug("%s: %d rows of K against %d columns in %d blocks and matrix products", op, m, n, len(blocks))
    for pairwise, rows in blocks:
        torch.mm(run_pairwise(pairwise, backend, op), problem.v, out=problem.out[rows])
    return problem.out


def _run_split(
    problem: ProductProblem | ProductGradProblem, backend: str, op: str, what: str, of: str, slices: int
) -> torch.Tensor:
    """`_run`, or (`slices` > 1: a problem on a CUDA device with too few rows to fill it) `_run` of its `slices`
    slices of `n` and their partial results summed into `problem.out`."""
    sizes = "M={} N={} D={} C={}"
    if slices == 1:
        return _run(problem, backend, op, what, sizes, of)
    parts, workspace = product_split.split_problems(problem, slices)
    if problem.debug:
        logger.debug("%s: %d rows and %d columns of K as %d slices of the columns", op, *problem.sizes[:2], slices)
    for part in parts:
        _run(part, backend, op, what, sizes, of)
    return torch.sum(workspace, dim=0, out=problem.out)


def _run(problem: Problem, backend: str, op: str, what: str, sizes: str, of: str) -> torch.Tensor:
    """The one path of every operation: nothing to do for an empty or `meta` output, zeros for a product's empty
    sum, else the backend the registry selects by the problem's check hook runs its run hook (`problem.hooks`),
    logged under `debug` (`sizes` a format of the problem's sizes, filled only then: this path runs for every
    call)."""
    check, run = problem.hooks
    if problem.out.numel() == 0 or problem.device.type == "meta":
        return problem.out
    if isinstance(problem, (ProductProblem, ProductGradProblem)) and problem.sizes[1] == 0:
        return problem.out.zero_()
    chosen = registry.select_backend(backend, problem, lambda b, pr: getattr(b, check)(pr), what)
    if problem.debug:
        shape = (problem.m, problem.n, problem.d) if isinstance(problem, PairwiseProblem) else problem.sizes
        logger.debug(
            "%s: backend %s; batch %s, %s, %s on %s; %s %s",
            op,
            chosen.name,
            list(problem.batch_shape),
            sizes.format(*shape),
            problem.dtype,
            problem.device,
            of,
            problem.program.key(),
        )
    _run_backend(chosen, getattr(chosen, run), problem)
    return problem.out


def _run_backend(backend: Backend, method: Callable[[object], None], problem: Problem) -> None:
    """`method(problem)`; a plugin's `SystemExit` (or another non-`Exception` but
    `KeyboardInterrupt`) becomes a [`BackendError`][kermac.errors.BackendError] naming the backend, so
    a backend cannot end the user's process.  Ordinary exceptions propagate as they are."""
    try:
        method(problem)
    except (Exception, KeyboardInterrupt):
        raise
    except BaseException as exc:
        raise BackendError(
            f"backend {backend.name!r} raised {type(exc).__name__}({exc}) while running; a backend must not "
            "end the process (report it to the backend's authors, or pass another backend=)"
        ) from exc
