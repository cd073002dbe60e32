"""The pytest entry point: [`conformance_tests`][kermac.testing.conformance_tests] turns a backend name into
test functions (pytest is imported only when it is called)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING

import torch

import kermac
from kermac import registry
from kermac.problem import GradProblem, PairwiseProblem, ProductProblem
from kermac.testing.case_check import check_case, check_product_case
from kermac.testing.cases import CASES, PRODUCT_CASES, PRODUCT_COLUMNS, SAMPLE_CASES, TRANSPOSED_PRODUCT_CASE, Case
from kermac.testing.hooks import check_answer, check_hooks, check_registry, unusable_reason

if TYPE_CHECKING:
    import pytest
    from _pytest.mark.structures import ParameterSet

__all__ = ["conformance_tests"]


def _samples(device: str | torch.device) -> list[tuple[PairwiseProblem | GradProblem | ProductProblem, Callable]]:
    """The sample problems on `device` (a pairwise, a gradient and a product one), each with the call that
    runs it: `call(**kwargs)` passes `kwargs` (e.g. `backend=`) to kermac's entry point."""
    samples = []
    for case in SAMPLE_CASES:
        operands, hypers = case.inputs(device, torch.float32)
        run = kermac.run_program if case.op == "pairwise" else kermac.run_grad_program
        call = partial(run, case.program, *operands, hypers=hypers)
        samples.append((case.problem(operands, hypers, None), call))
    case = SAMPLE_CASES[0]
    operands, hypers = case.inputs(device, torch.float32)
    v = case.vector(operands, PRODUCT_COLUMNS[-1], False, device)
    call = partial(kermac.program_product, case.program, *operands, v, **hypers)
    samples.append((case.product_problem(operands, hypers, v, None), call))
    return samples


def _reaches(backend: str, device: str | torch.device, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """`backend=NAME` and `KERMAC_BACKEND=NAME` run the backend's own `pairwise`, `grad` and `product`
    hooks, for a sample problem of each that the backend accepts; returns the hooks so checked."""
    found = registry.get_backend(backend)
    checked = []
    for problem, call in _samples(device):
        if check_answer(found, problem) is not None:
            continue
        hook = problem.hooks[1]
        calls = []
        original = getattr(found, hook)

        def spy(problem: object, original: Callable = original, calls: list = calls) -> None:
            calls.append(problem)
            original(problem)

        monkeypatch.setattr(found, hook, spy)
        call(backend=backend)
        assert len(calls) == 1, f"backend={backend!r} ran its {hook} hook {len(calls)} times, expected once"
        with monkeypatch.context() as env:
            env.setenv(registry.ENV_BACKEND, backend)
            call()
        assert len(calls) == 2, f"{registry.ENV_BACKEND}={backend} did not run the backend's {hook} hook"
        checked.append(hook)
    return checked


def _dtype_id(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def conformance_tests(
    backend: str,
    *,
    devices: Sequence[str | ParameterSet] = ("cpu",),
    dtypes: Sequence[torch.dtype] = (torch.float32, torch.float64),
    cases: Sequence[Case] = CASES,
    products: Sequence[Case] = PRODUCT_CASES,
    required: bool = False,
) -> dict[str, Callable[..., None]]:
    """The conformance suite of `backend` as pytest test functions, by name, for a test module's globals.

    `devices` are torch device strings (or `pytest.param(device, marks=...)`); `dtypes` the dtypes
    every case runs in; `cases` the problems (all of [`CASES`][kermac.testing.CASES] unless a runner
    has reason to leave some out, e.g. the largest ones where kernels are interpreted); `products` the
    pairwise cases also checked as kernel products (default [`PRODUCT_CASES`][kermac.testing.PRODUCT_CASES]).
    The tests, each parametrised by device:

    - `test_<backend>_registry`: [`check_registry`][kermac.testing.check_registry];
    - `test_<backend>_hooks`: [`check_hooks`][kermac.testing.check_hooks];
    - `test_<backend>_reached`: `backend=` and `KERMAC_BACKEND` run the backend's hooks;
    - `test_<backend>_values`: [`check_case`][kermac.testing.check_case] for every case and dtype,
      skipped with the backend's reason where it refuses;
    - `test_<backend>_products`: [`check_product_case`][kermac.testing.check_product_case] for every
      product case, dtype and number of columns of [`PRODUCT_COLUMNS`][kermac.testing.PRODUCT_COLUMNS],
      skipped with the backend's reason where it refuses (every product, by default, for a backend that
      predates them);
    - `test_<backend>_transposed_product`: the same for `Kᵀ @ u` of
      [`TRANSPOSED_PRODUCT_CASE`][kermac.testing.TRANSPOSED_PRODUCT_CASE] in every dtype.

    All but the registry test skip with the reason where the backend or device is unusable here
    ([`unusable_reason`][kermac.testing.unusable_reason]), or fail if `required`.
    """
    import pytest

    ident = re.sub(r"\W", "_", backend)
    on_devices = pytest.mark.parametrize("device", list(devices))

    def usable(device: str) -> None:
        check_registry(backend)
        reason = unusable_reason(backend, device)
        if reason is not None:
            (pytest.fail if required else pytest.skip)(reason)

    @on_devices
    def test_registry(device: str) -> None:
        check_registry(backend)

    @on_devices
    def test_hooks(device: str) -> None:
        usable(device)
        check_hooks(backend, device)

    @on_devices
    def test_reached(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
        usable(device)
        if not _reaches(backend, device, monkeypatch):
            pytest.skip(f"backend {backend!r} refuses the sample problems on {device}")

    @on_devices
    @pytest.mark.parametrize("dtype", list(dtypes), ids=_dtype_id)
    @pytest.mark.parametrize("case", list(cases), ids=lambda case: case.name)
    def test_values(device: str, dtype: torch.dtype, case: Case) -> None:
        usable(device)
        reason = check_case(backend, case, device, dtype)
        if reason is not None:
            pytest.skip(f"backend {backend!r} refuses {case.name} ({_dtype_id(dtype)} on {device}): {reason}")

    @on_devices
    @pytest.mark.parametrize("dtype", list(dtypes), ids=_dtype_id)
    @pytest.mark.parametrize("columns", list(PRODUCT_COLUMNS), ids=lambda columns: f"C{columns}")
    @pytest.mark.parametrize("case", list(products), ids=lambda case: case.name)
    def test_products(device: str, dtype: torch.dtype, case: Case, columns: int) -> None:
        usable(device)
        reason = check_product_case(backend, case, device, dtype, columns)
        if reason is not None:
            where = f"C = {columns}, {_dtype_id(dtype)} on {device}"
            pytest.skip(f"backend {backend!r} refuses the product of {case.name} ({where}): {reason}")

    @on_devices
    @pytest.mark.parametrize("dtype", list(dtypes), ids=_dtype_id)
    def test_transposed_product(device: str, dtype: torch.dtype) -> None:
        usable(device)
        case = TRANSPOSED_PRODUCT_CASE
        reason = check_product_case(backend, case, device, dtype, PRODUCT_COLUMNS[-1], transpose=True)
        if reason is not None:
            where = f"{_dtype_id(dtype)} on {device}"
            pytest.skip(f"backend {backend!r} refuses the transposed product of {case.name} ({where}): {reason}")

    tests = {
        "registry": test_registry,
        "hooks": test_hooks,
        "reached": test_reached,
        "values": test_values,
        "products": test_products,
        "transposed_product": test_transposed_product,
    }
    return {f"test_{ident}_{check}": test for check, test in tests.items()}
