"""The registry's view of a backend and the answers of its hooks: registered, reachable, typed, honest."""

from __future__ import annotations

import torch

import kermac
from kermac import registry
from kermac.backend import Backend
from kermac.problem import GradProblem, PairwiseProblem, ProductProblem
from kermac.testing.cases import PRODUCT_COLUMNS, SAMPLE_CASES

__all__ = ["backend_names", "check_answer", "check_hooks", "check_registry", "unusable_reason"]


def backend_names() -> tuple[str, ...]:
    """Every backend the registry loaded (entry-point group `kermac.backends`), available or not,
    in registration order: the list tests and benchmarks iterate instead of a hard-coded one."""
    return tuple(registry.registered_backends())


def check_registry(backend: str) -> Backend:
    """The registry lists `backend` as a loaded, unbroken backend whose row agrees with its hooks;
    returns it.  `AssertionError` otherwise."""
    rows = {row.name: row for row in kermac.backends()}
    loaded = registry.registered_backends()
    assert backend in loaded, (
        f"backend {backend!r} is not registered (loaded: {sorted(loaded)}; broken plugins: "
        f"{[r.name + ': ' + str(r.reason) for r in rows.values() if r.broken]}); declare it in the entry-point "
        "group 'kermac.backends' and install the package"
    )
    row, found = rows[backend], loaded[backend]
    assert not row.broken, f"backend {backend!r} is listed as broken: {row.reason}"
    assert registry.get_backend(backend) is found
    assert row.priority == found.priority, (
        f"kermac.backends() lists priority {row.priority}, the backend {found.priority}"
    )
    return found


def unusable_reason(backend: str, device: str | torch.device) -> str | None:
    """Why `backend` cannot run on `device` on this machine (unavailable, or the device is absent), or None."""
    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as exc:  # torch raises AssertionError for a build without CUDA
        return f"device {str(device)!r} is not usable here: {exc}"
    status = {row.name: row for row in kermac.backends()}.get(backend)
    if status is not None and not status.available:
        return f"backend {backend!r} is unavailable: {status.reason}"
    return None


def _is_reason(value: object) -> bool:
    """A refusal is a non-empty sentence."""
    return isinstance(value, str) and bool(value.strip())


def check_answer(found: Backend, problem: PairwiseProblem | GradProblem | ProductProblem) -> str | None:
    """The backend's answer to the check hook of `problem` (`check_pairwise`, `check_grad`,
    `check_general_grad` or `check_product`: `problem.hooks`), which must be None (it runs the problem) or the
    reason it refuses, a non-empty str (`AssertionError` otherwise)."""
    hook = problem.hooks[0]
    reason = getattr(found, hook)(problem)
    assert reason is None or _is_reason(reason), (
        f"backend {found.name!r}: {hook} returned {reason!r}; expected None (it runs the problem) or the reason "
        "it refuses (a non-empty str)"
    )
    return reason


def check_hooks(backend: str, device: str | torch.device) -> None:
    """The hooks of `backend` return the documented types ([`kermac.backend.Backend`][kermac.backend.Backend]).

    `name`, `priority`, `availability()` and, on sample problems on `device` (a pairwise, a gradient
    and a product one), `preference()` keep the rules the registry applies
    ([`kermac.registry.contract_violations`][kermac.registry.contract_violations]); besides,
    `description` is a str, an unavailable backend says why (a non-empty str), and for the sample
    problems `check_*` is None or a reason (`check_product` of a backend that predates products refuses
    by default) and, for accepted pairwise and gradient problems, `precompile()` a list of str.
    """
    found = registry.get_backend(backend)
    assert isinstance(found, Backend), f"{backend!r} is a {type(found).__name__}, not a kermac.backend.Backend"
    problems = []
    for case in SAMPLE_CASES:
        operands, hypers = case.inputs(device, torch.float32)
        problems.append(case.problem(operands, hypers, None))
    operands, hypers = SAMPLE_CASES[0].inputs(device, torch.float32)
    v = SAMPLE_CASES[0].vector(operands, PRODUCT_COLUMNS[-1], False, device)
    product = SAMPLE_CASES[0].product_problem(operands, hypers, v, None)
    violations = registry.contract_violations(backend, [*problems, product])
    assert not violations, f"backend {backend!r} breaks the backend contract: {'; '.join(violations)}"
    assert isinstance(found.description, str), f"description: expected a str, got {found.description!r}"
    av = found.availability()
    assert av.available or _is_reason(av.reason), f"availability(): unavailable without a reason: {av!r}"
    for problem in problems:
        if check_answer(found, problem) is None:
            built = found.precompile([problem])
            assert isinstance(built, list) and all(isinstance(b, str) for b in built), (
                f"precompile(): expected a list of str, got {built!r}"
            )
    check_answer(found, product)
