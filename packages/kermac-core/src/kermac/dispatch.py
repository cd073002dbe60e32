"""Running normalised problems on a backend: what the public operations and autograd share.

The operations of [`kermac.ops`][kermac.ops] run their problems through here: `run_pairwise` /
`run_grad` / `run_product` / `run_product_grad` pick a backend ([`kermac.registry`][kermac.registry]) for a problem of
`kermac.problem`, log the choice under `debug` and let the backend write `problem.out`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kermac import registry
from kermac.backend import Backend
from kermac.errors import BackendError
from kermac.logs import logger
from kermac.problem import GradProblem, PairwiseProblem, ProductGradProblem, ProductProblem

__all__ = ["run_grad", "run_pairwise", "run_product", "run_product_grad"]


def run_pairwise(problem: PairwiseProblem, backend: str, op: str) -> torch.Tensor:
    """`problem.out` written by the backend `backend` (a name or `"auto"`) chooses; `op`
    names the public operation in log messages.  Empty and `meta` outputs are returned as they are."""
    if problem.out.numel() == 0 or problem.device.type == "meta":
        return problem.out
    chosen = registry.select_backend(backend, problem, lambda b, pr: b.check_pairwise(pr), "pairwise problem")
    if problem.debug:
        logger.debug(
            "%s: backend %s; batch %s, M=%d N=%d D=%d, %s on %s; program %s",
            op,
            chosen.name,
            list(problem.batch_shape),
            problem.m,
            problem.n,
            problem.d,
            problem.dtype,
            problem.device,
            problem.program.key(),
        )
    _run_backend(chosen, chosen.pairwise, problem)
    return problem.out


def run_grad(problem: GradProblem, backend: str, op: str) -> torch.Tensor:
    """As `run_pairwise`, for a gradient problem."""
    if problem.out.numel() == 0 or problem.device.type == "meta":
        return problem.out
    chosen = registry.select_backend(backend, problem, lambda b, pr: b.check_grad(pr), "gradient problem")
    if problem.debug:
        m, n, o, k = problem.sizes
        logger.debug(
            "%s: backend %s; batch %s, M=%d N=%d O=%d K=%d, %s on %s; program %s",
            op,
            chosen.name,
            list(problem.batch_shape),
            m,
            n,
            o,
            k,
            problem.dtype,
            problem.device,
            problem.program.key(),
        )
    _run_backend(chosen, chosen.grad, problem)
    return problem.out


def run_product(problem: ProductProblem, backend: str, op: str) -> torch.Tensor:
    """As `run_pairwise`, for a fused kernel product.  With `N = 0` the sum over `n` is empty: `out` is
    filled with zeros here, without asking a backend (as an empty output is returned without one)."""
    if problem.out.numel() == 0 or problem.device.type == "meta":
        return problem.out
    m, n, d, c = problem.sizes
    if n == 0:
        return problem.out.zero_()
    chosen = registry.select_backend(backend, problem, lambda b, pr: b.check_product(pr), "kernel product problem")
    if problem.debug:
        logger.debug(
            "%s: backend %s; batch %s, M=%d N=%d D=%d C=%d, %s on %s; program %s",
            op,
            chosen.name,
            list(problem.batch_shape),
            m,
            n,
            d,
            c,
            problem.dtype,
            problem.device,
            problem.program.key(),
        )
    _run_backend(chosen, chosen.product, problem)
    return problem.out


def run_product_grad(problem: ProductGradProblem, backend: str, op: str) -> torch.Tensor:
    """As `run_product`, for the gradient product of a fused kernel product (with `N = 0` the sum is empty: zeros)."""
    if problem.out.numel() == 0 or problem.device.type == "meta":
        return problem.out
    m, n, d, c = problem.sizes
    if n == 0:
        return problem.out.zero_()
    chosen = registry.select_backend(
        backend, problem, lambda b, pr: b.check_product_grad(pr), "kernel product gradient problem"
    )
    if problem.debug:
        logger.debug(
            "%s: backend %s; batch %s, M=%d N=%d D=%d C=%d, %s on %s; gradient of program %s",
            op,
            chosen.name,
            list(problem.batch_shape),
            m,
            n,
            d,
            c,
            problem.dtype,
            problem.device,
            problem.program.key(),
        )
    _run_backend(chosen, chosen.product_grad, problem)
    return problem.out


def _run_backend(
    backend: Backend,
    method: Callable[[object], None],
    problem: PairwiseProblem | GradProblem | ProductProblem | ProductGradProblem,
) -> None:
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
