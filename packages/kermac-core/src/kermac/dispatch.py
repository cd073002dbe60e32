"""Running normalised problems on a backend: what the public operations and autograd share.

[`kermac.api`][kermac.api] (the public operations) and [`kermac.autograd`][kermac.autograd] (their backward) both run
problems through here, so neither needs the other's internals: this module imports neither.

* `run_pairwise` / `run_grad` pick a backend ([`kermac.registry`][kermac.registry]) for a problem of
  `kermac.problem`, log the choice under `debug` and let the backend write `problem.out`.
* `grad_contraction` is the contraction behind [`kermac.cdist_grad`][kermac.cdist_grad]: `p` lowered to
  its program, validated and run.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kermac import registry
from kermac.backend import Backend
from kermac.errors import BackendError
from kermac.hyperparams import HyperValue, positive_finite, prepare_hypers
from kermac.logs import logger
from kermac.lowering import grad_program
from kermac.problem import GradProblem, PairwiseProblem, grad_problem

__all__ = ["grad_contraction", "run_grad", "run_pairwise"]


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


def grad_contraction(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    d: torch.Tensor,
    *,
    p: float | torch.Tensor,
    out: torch.Tensor | None,
    backend: str,
    debug: bool,
    op: str,
) -> torch.Tensor:
    """`out[o, n, m] = Σ_k c[o, k] a[k, m] sgn(d[n, m] − b[n, k]) |d[n, m] − b[n, k]|^(p − 1)`, the
    contraction of [`kermac.cdist_grad`][kermac.cdist_grad] (which documents the arguments); `a` a tensor.

    `p` must be > 0 and finite: a number is checked at once; an invalid tensor value makes its
    batch entry NaN, or raises with `debug`."""
    hypers: dict[str, HyperValue] = prepare_hypers({"p": (p, positive_finite)}, a.device, debug)
    program = grad_program(hypers["p"].scalar)
    if "p" not in program.hypers:
        hypers = {}
    return run_grad(grad_problem(program, a, b, c, d, out=out, hypers=hypers, debug=debug), backend, op)


def _run_backend(backend: Backend, method: Callable[[object], None], problem: PairwiseProblem | GradProblem) -> None:
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
