"""One case of the table on one backend: check_* honesty, the values, and no host synchronisation."""

from __future__ import annotations

import torch

import kermac
from kermac import registry
from kermac.backend import Backend
from kermac.errors import UnsupportedProblemError
from kermac.problem import GradProblem, PairwiseProblem
from kermac.testing.cases import Case
from kermac.testing.hooks import check_answer
from kermac.testing.values import assert_grad_conforms, assert_pairwise_conforms

__all__ = ["check_case"]


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
    if reason is not None:
        _assert_refused(backend, case, operands, hypers, reason)
        return reason
    if case.op == "pairwise":
        m, n = case.offsets
        assert_pairwise_conforms(backend, case.program, *operands, hypers=hypers, offset_m=m, offset_n=n, out=out)
    else:
        assert_grad_conforms(backend, case.program, *operands, hypers=hypers, out=out)
    if torch.device(device).type == "cuda" and out.numel():
        _assert_no_sync(found, problem)
    return None


def _assert_refused(backend: str, case: Case, operands: tuple[torch.Tensor, ...], hypers: dict, reason: str) -> None:
    """`backend=NAME` on a problem the backend refuses raises `UnsupportedProblemError` with `reason`."""
    try:
        if case.op == "pairwise":
            m, n = case.offsets
            kermac.run_program(case.program, *operands, hypers=hypers, offset_m=m, offset_n=n, backend=backend)
        else:
            kermac.run_grad_program(case.program, *operands, hypers=hypers, backend=backend)
    except UnsupportedProblemError as exc:
        assert reason in str(exc), f"UnsupportedProblemError does not quote the reason {reason!r}: {exc}"
    else:
        raise AssertionError(f"backend {backend!r} refused {case.name} ({reason!r}) but backend= ran it")


def _assert_no_sync(found: Backend, problem: PairwiseProblem | GradProblem) -> None:
    run = found.pairwise if isinstance(problem, PairwiseProblem) else found.grad
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
