"""One case of the table on one backend -- as its own operation, or a pairwise case as a kernel product:
check_* honesty, the values, and no host synchronisation."""

from __future__ import annotations

from collections.abc import Callable

import torch

import kermac
from kermac import registry
from kermac.backend import Backend
from kermac.errors import UnsupportedProblemError
from kermac.problem import GradProblem, PairwiseProblem, ProductProblem
from kermac.testing.cases import Case
from kermac.testing.hooks import check_answer
from kermac.testing.values import assert_grad_conforms, assert_pairwise_conforms, assert_product_conforms

__all__ = ["check_case", "check_product_case"]


def check_case(backend: str, case: Case, device: str | torch.device, dtype: torch.dtype) -> str | None:
    """Run `case` on `backend`: None if the backend accepted it and its NaN-poisoned `out` matches the
    reference, the backend's reason if it refused (`AssertionError` for a wrong answer of either kind).

    A refused problem must make `backend=NAME` raise `UnsupportedProblemError` quoting the reason.
    A problem with an empty output is never handed to a backend (kermac returns it as it is): only
    its shape is checked.  On CUDA the accepted problem is run once more, straight through the
    backend's hook, under `torch.cuda.set_sync_debug_mode("error")`: the backend must not
    synchronise with the host.
    """
    found = registry.get_backend(backend)
    operands, hypers = case.inputs(device, dtype)
    shape = case.problem(operands, hypers, None).out.shape
    out = case.out(shape, operands[0])
    problem = case.problem(operands, hypers, out)
    reason = check_answer(found, problem) if out.numel() else None
    m, n = case.offsets
    if reason is not None:
        if case.op == "pairwise":
            offsets = {"offset_m": m, "offset_n": n}
            run = kermac.run_program
            _assert_refused(backend, case.name, reason, run, case.program, *operands, hypers=hypers, **offsets)
        else:
            run = kermac.run_grad_program
            _assert_refused(backend, case.name, reason, run, case.program, *operands, hypers=hypers)
        return reason
    if case.op == "pairwise":
        assert_pairwise_conforms(backend, case.program, *operands, hypers=hypers, offset_m=m, offset_n=n, out=out)
    else:
        assert_grad_conforms(backend, case.program, *operands, hypers=hypers, out=out)
    if torch.device(device).type == "cuda" and out.numel():
        _assert_no_sync(found, problem)
    return None


def check_product_case(
    backend: str, case: Case, device: str | torch.device, dtype: torch.dtype, columns: int, transpose: bool = False
) -> str | None:
    """Run the kernel product `K @ v` of the pairwise `case` on `backend`, `v` of `columns` columns
    ([`Case.vector`][kermac.testing.Case.vector]; `Kᵀ @ v` with `transpose`): as
    [`check_case`][kermac.testing.check_case], with `check_product` / `product` and the values of
    [`assert_product_conforms`][kermac.testing.assert_product_conforms].

    A product with an empty output or an empty sum (N = 0: zeros) is never handed to a backend.  A
    backend that claims the problem and then raises fails.
    """
    if case.op != "pairwise":
        raise ValueError(f"case: expected a pairwise case, got {case.name!r} ({case.op})")
    found = registry.get_backend(backend)
    operands, hypers = case.inputs(device, dtype)
    v = case.vector(operands, columns, transpose, device)
    shape = case.product_problem(operands, hypers, v, None, transpose).out.shape
    out = case.out(shape, operands[0])
    problem = case.product_problem(operands, hypers, v, out, transpose)
    handed = bool(out.numel() and problem.sizes[1])
    reason = check_answer(found, problem) if handed else None
    offsets = {"offset_m": case.offsets[0], "offset_n": case.offsets[1], "transpose": transpose}
    if reason is not None:
        what = f"the {'transposed ' * transpose}product of {case.name}"
        _assert_refused(backend, what, reason, kermac.program_product, case.program, *operands, v, **offsets, **hypers)
        return reason
    assert_product_conforms(backend, case.program, *operands, v, hypers=hypers, out=out, **offsets)
    if torch.device(device).type == "cuda" and handed:
        _assert_no_sync(found, problem)
    return None


def _assert_refused(backend: str, what: str, reason: str, call: Callable[..., object], *args, **kwargs) -> None:
    """`call(*args, backend=NAME, **kwargs)` on `what`, a problem the backend refuses, raises
    `UnsupportedProblemError` with `reason`."""
    try:
        call(*args, backend=backend, **kwargs)
    except UnsupportedProblemError as exc:
        assert reason in str(exc), f"UnsupportedProblemError does not quote the reason {reason!r}: {exc}"
    else:
        raise AssertionError(f"backend {backend!r} refused {what} ({reason!r}) but backend= ran it")


def _assert_no_sync(found: Backend, problem: PairwiseProblem | GradProblem | ProductProblem) -> None:
    run = getattr(found, problem.hooks[1])
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        run(problem)
    except RuntimeError as exc:
        if "synchroniz" in str(exc):
            raise AssertionError(f"backend {found.name!r} synchronised with the host: {exc}") from exc
        raise
    finally:
        torch.cuda.set_sync_debug_mode(previous)
