"""Conformance checks a backend -- kermac's own or a third party's -- must pass.

Every check runs a program on the backend under test into an `out` *poisoned* with NaN, and
compares it with the reference backend (`torch`, whose name no plugin may take) evaluated on
the inputs upcast to float64.  A backend that leaves part of `out` unwritten fails: the poison
shows where the reference has a number.  Entries must agree in their NaN and infinite values and
otherwise within `rtol` relative to the largest finite reference entry ([`TOLERANCE`][kermac.testing.TOLERANCE]
by dtype).

**The suite.** [`conformance_tests`][kermac.testing.conformance_tests] turns a backend name into pytest
tests; a plugin's test file needs two lines (pytest is imported only then):

```text
from kermac.testing import conformance_tests

globals().update(conformance_tests("mybackend", devices=["cpu"]))
```

They check that the registry lists the backend and `backend="mybackend"` (and `KERMAC_BACKEND`)
reaches it, that its hooks return the documented types, and, for every problem of
[`CASES`][kermac.testing.CASES] (every preset, a user program and the gradient programs, on sizes
that are not tile multiples, size-0 and size-1 dimensions, transposed and strided views,
broadcast batches, batched tensor hyperparameters, NaN and infinite inputs), that `check_pairwise`
/ `check_grad` answer honestly: a problem the backend accepts runs and matches the reference, one
it refuses comes with a reason (a non-empty str), which `backend=` quotes in its
`UnsupportedProblemError`, and is skipped with it.  On CUDA the backend also
runs each problem without synchronising with the host (`torch.cuda.set_sync_debug_mode("error")`).
A backend that is unavailable on this machine, or a device that is not, skips its tests with the
reason (fails them, with `required=True`).

**Single checks.** [`assert_pairwise_conforms`][kermac.testing.assert_pairwise_conforms] and
[`assert_grad_conforms`][kermac.testing.assert_grad_conforms] compare one call on given inputs:

```text
from kermac import presets, testing

testing.assert_pairwise_conforms("mybackend", presets.l1_distance.lower(), x, z)
```

The checks synchronise with the host (they are tests, not a hot path).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

import kermac
from kermac import ir, presets, registry
from kermac.backend import Backend
from kermac.benchmarking import REFERENCE_BACKEND
from kermac.errors import UnsupportedProblemError
from kermac.hyperparams import program_hypers
from kermac.lowering import grad_program
from kermac.problem import SUPPORTED_DTYPES, GradProblem, PairwiseProblem, grad_problem, pairwise_problem
from kermac.programs import GradProgram, PairwiseProgram

if TYPE_CHECKING:
    import pytest
    from _pytest.mark.structures import ParameterSet

__all__ = [
    "CASES",
    "GRAD_INF_MAY_BE_NAN",
    "HUBER_GRAD",
    "HYPER_VALUES",
    "LAYOUTS",
    "SOFT_L1",
    "TOLERANCE",
    "Case",
    "assert_grad_conforms",
    "assert_matches_reference",
    "assert_pairwise_conforms",
    "backend_names",
    "check_case",
    "check_hooks",
    "check_registry",
    "conformance_tests",
    "unusable_reason",
]

TOLERANCE: Mapping[torch.dtype, float] = {
    torch.float64: 1e-11,
    torch.float32: 1e-5,
    torch.float16: 2e-3,
    torch.bfloat16: 1.6e-2,
}
"""Default `rtol` per dtype: `max |result − reference| / max |reference|` allowed."""

GRAD_INF_MAY_BE_NAN: frozenset[torch.dtype] = frozenset(SUPPORTED_DTYPES) - {torch.float64}
"""Dtypes whose gradient contraction may give NaN where the reference is ±inf: float32 tensor-core
kernels split each factor into parts (3×TF32), which turns an infinite term into ∞ − ∞, as the
formulas page of the documentation says; narrower types compute in float32."""

Hypers = Mapping[str, float | torch.Tensor] | None


def _wide(hypers: Hypers) -> dict[str, float | torch.Tensor]:
    return {k: v.double() if isinstance(v, torch.Tensor) else v for k, v in (hypers or {}).items()}


def _poisoned(out: torch.Tensor | None, shape: torch.Size, like: torch.Tensor) -> torch.Tensor:
    """`out` (or a new contiguous tensor of `shape` like `like`) filled with NaN."""
    if out is None:
        return torch.full(shape, torch.nan, dtype=like.dtype, device=like.device)
    return out.fill_(torch.nan)


def assert_pairwise_conforms(
    backend: str,
    program: PairwiseProgram,
    x: torch.Tensor,
    z: torch.Tensor,
    *,
    hypers: Hypers = None,
    offset_m: int = 0,
    offset_n: int = 0,
    out: torch.Tensor | None = None,
    rtol: float | None = None,
) -> None:
    """`run_program(program, x, z)` on `backend` matches the float64 reference (`AssertionError` if not).

    `out` (any strides; default a new contiguous tensor) is filled with NaN and passed as the call's `out`."""
    offsets = {"offset_m": offset_m, "offset_n": offset_n}
    ref = kermac.run_program(
        program, x.double(), z.double(), hypers=_wide(hypers), backend=REFERENCE_BACKEND, **offsets
    )
    out = _poisoned(out, ref.shape, x)
    kermac.run_program(program, x, z, hypers=hypers, out=out, backend=backend, **offsets)
    assert_matches_reference(out, ref, rtol=rtol, what=f"backend {backend!r}, pairwise program {program.key()}")


def assert_grad_conforms(
    backend: str,
    program: GradProgram,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    d: torch.Tensor,
    *,
    hypers: Hypers = None,
    out: torch.Tensor | None = None,
    rtol: float | None = None,
) -> None:
    """`run_grad_program(program, a, b, c, d)` on `backend` matches the float64 reference (`out` as in
    [`assert_pairwise_conforms`][kermac.testing.assert_pairwise_conforms])."""
    wide = (t.double() for t in (a, b, c, d))
    ref = kermac.run_grad_program(program, *wide, hypers=_wide(hypers), backend=REFERENCE_BACKEND)
    out = _poisoned(out, ref.shape, a)
    kermac.run_grad_program(program, a, b, c, d, hypers=hypers, out=out, backend=backend)
    what = f"backend {backend!r}, gradient program {program.key()}"
    assert_matches_reference(out, ref, rtol=rtol, what=what, inf_may_be_nan=a.dtype in GRAD_INF_MAY_BE_NAN)


def assert_matches_reference(
    result: torch.Tensor, ref: torch.Tensor, *, rtol: float | None, what: str, inf_may_be_nan: bool = False
) -> None:
    """`result` equals `ref` (float64) in NaN and infinite entries, and elsewhere within `rtol`.

    `rtol` (default [`TOLERANCE`][kermac.testing.TOLERANCE] of `result`'s dtype) bounds `|result − ref|` divided by
    the largest finite `|ref|` (1 if there is none).  `inf_may_be_nan` accepts NaN where `ref` is
    infinite (what float32 gradients may give, see [`GRAD_INF_MAY_BE_NAN`][kermac.testing.GRAD_INF_MAY_BE_NAN]).
    The error names `what`, how many entries differ and the first one.
    """
    if result.shape != ref.shape:
        raise AssertionError(f"{what}: shape {list(result.shape)}, expected {list(ref.shape)}")
    rtol = TOLERANCE[result.dtype] if rtol is None else rtol
    got, want = result.detach().double().cpu(), ref.detach().double().cpu()
    finite = torch.isfinite(got) & torch.isfinite(want)
    scale = want[torch.isfinite(want)].abs().max().item() if torch.isfinite(want).any() else 0.0
    err = torch.where(finite, (got - want).abs(), 0.0) / (scale or 1.0)
    special = (torch.isnan(got) != torch.isnan(want)) | (~finite & ~torch.isnan(want) & (got != want))
    if inf_may_be_nan:
        special &= ~(torch.isnan(got) & torch.isinf(want))
    bad = special | (err > rtol)
    if bad.any():
        first = tuple(int(i) for i in bad.nonzero()[0])
        hint = " (NaN where the reference has a number: out was left unwritten)" if got[first].isnan() else ""
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.numel()} entries differ from the reference (rtol {rtol:g}); "
            f"first at {list(first)}: got {got[first].item()!r}, expected {want[first].item()!r}{hint}"
        )


# ---------------------------------------------------------------------------------------------
# The suite: a table of problems and the checks run on each.

HYPER_VALUES: Mapping[str, float] = {"bandwidth": 1.3, "p": 1.5, "regularization": 0.1, "eps": 0.25}
"""The number each hyperparameter of a case takes unless the case gives it (a tensor, say)."""

_X, _Z = ir.Var("x"), ir.Var("z")
SOFT_L1 = PairwiseProgram(ir.sqrt((_X - _Z) * (_X - _Z) + ir.Hyper("eps")), "sum", ir.exp(-ir.Var("acc")))
"""A user program: Σ √((x − z)² + ε), then e^−acc."""
HUBER_GRAD = GradProgram(ir.minimum(ir.maximum(ir.Var("d") - ir.Var("b"), -1.0), 1.0), ir.Var("acc"))
"""A user gradient program: Σ c·a·clip(d − b, −1, 1)."""


LAYOUTS = ("contiguous", "transposed", "strided")
"""The memory layouts a [`Case`][kermac.testing.Case] gives its operands."""


def _draw(shape: tuple[int, ...], gen: torch.Generator, device: str | torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Standard normal entries drawn in float64 on the CPU (the same on every device), then converted."""
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype=dtype, device=device)


@dataclass(frozen=True)
class Case:
    """One problem of the suite: `op` (`"pairwise"` or `"grad"`) of `program` on random operands of
    `shapes` (`x, z` or `a, b, c, d`).

    `hypers` gives a hyperparameter a number, or nested lists of numbers: a tensor (in the operands'
    dtype) broadcast against the batch; the others take [`HYPER_VALUES`][kermac.testing.HYPER_VALUES].
    `layout` is `"transposed"` (every operand, and `out`, a transposed view) or `"strided"`
    (every operand every other column of a wider tensor).  `special` puts NaN, +inf and −inf
    among the first two operands' entries.  `offsets` are the pairwise `offset_m, offset_n`.
    """

    name: str
    op: str
    program: PairwiseProgram | GradProgram
    shapes: tuple[tuple[int, ...], ...]
    hypers: Mapping[str, float | list] = field(default_factory=dict)
    layout: str = "contiguous"
    special: bool = False
    offsets: tuple[int, int] = (0, 0)

    def __post_init__(self) -> None:
        if self.op not in ("pairwise", "grad"):
            raise ValueError(f"op: expected 'pairwise' or 'grad', got {self.op!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout: expected one of {LAYOUTS}, got {self.layout!r}")

    def inputs(self, device: str | torch.device, dtype: torch.dtype) -> tuple[tuple[torch.Tensor, ...], dict]:
        """The operands and hyperparameters on `device` in `dtype`, the same on every call."""
        gen = torch.Generator().manual_seed(zlib.crc32(self.name.encode()))
        operands = tuple(self._operand(shape, gen, device, dtype) for shape in self.shapes)
        if self.special:
            first, second = operands[0], operands[1]
            first[..., 0, 0], first[..., -1, -1], second[..., -1, 0] = torch.nan, -torch.inf, torch.inf
        hypers = {
            name: self._hyper(self.hypers.get(name, HYPER_VALUES.get(name)), device, dtype)
            for name in self.program.hypers
        }
        return operands, hypers

    def _operand(
        self, shape: tuple[int, ...], gen: torch.Generator, device: str | torch.device, dtype: torch.dtype
    ) -> torch.Tensor:
        *batch, rows, cols = shape
        if self.layout == "transposed":
            return _draw((*batch, cols, rows), gen, device, dtype).mT
        if self.layout == "strided":
            return _draw((*batch, rows, 2 * cols), gen, device, dtype)[..., ::2]
        return _draw(shape, gen, device, dtype)

    @staticmethod
    def _hyper(value: float | list, device: str | torch.device, dtype: torch.dtype) -> float | torch.Tensor:
        return torch.tensor(value, dtype=dtype, device=device) if isinstance(value, list) else value

    def out(self, shape: torch.Size, like: torch.Tensor) -> torch.Tensor:
        """An output of `shape` for this case: transposed where the operands are."""
        if self.layout != "transposed" or len(shape) < 2:
            return torch.empty(shape, dtype=like.dtype, device=like.device)
        return torch.empty((*shape[:-2], shape[-1], shape[-2]), dtype=like.dtype, device=like.device).mT


_ODD = ((37, 19), (29, 19))  # no size is a multiple of a tile or of a vector width
_GRAD_ODD = ((37, 29), (19, 37), (3, 37), (19, 29))  # a [K, M], b [N, K], c [O, K], d [N, M]: K 37, M 29, N 19, O 3
_L1, _L2 = presets.l1_distance.lower(), presets.l2_distance.lower()
_GAUSSIAN, _LP = presets.gaussian.lower(), presets.lp_distance.lower()
_G1, _G2, _GP = grad_program(1.0), grad_program(2.0), grad_program(1.5)


def _grad_shapes(k: int, m: int, n: int, o: int, batch: tuple[int, ...] = ()) -> tuple[tuple[int, ...], ...]:
    return ((*batch, k, m), (*batch, n, k), (*batch, o, k), (*batch, n, m))


CASES: tuple[Case, ...] = (
    *(Case(name, "pairwise", preset.lower(), _ODD) for name, preset in presets.ALL.items()),
    Case("matern52_ridge_diagonal", "pairwise", presets.matern52.lower(regularized=True), _ODD, offsets=(0, 3)),
    Case("user_soft_l1", "pairwise", SOFT_L1, ((37, 5), (29, 5))),  # e^-acc of 19 features underflows float16
    Case("l1_multi_tile", "pairwise", _L1, ((133, 21), (67, 21))),
    Case("l2_multi_tile", "pairwise", _L2, ((133, 21), (67, 21))),
    Case("l1_m0", "pairwise", _L1, ((0, 5), (9, 5))),
    Case("l1_n0", "pairwise", _L1, ((7, 5), (0, 5))),
    Case("gaussian_d0", "pairwise", _GAUSSIAN, ((7, 0), (9, 0))),
    Case("l1_batch0", "pairwise", _L1, ((0, 7, 5), (9, 5))),
    Case("gaussian_all_size1", "pairwise", _GAUSSIAN, ((1, 1), (1, 1))),
    Case("l2_m1_n1", "pairwise", _L2, ((1, 19), (29, 19))),
    Case("l1_transposed", "pairwise", _L1, _ODD, layout="transposed"),
    Case("l2_transposed", "pairwise", _L2, _ODD, layout="transposed"),
    Case("l2_strided", "pairwise", _L2, _ODD, layout="strided"),
    Case("l2_broadcast_batch", "pairwise", _L2, ((7, 19), (2, 9, 19))),
    Case("l1_broadcast_batch_2d", "pairwise", _L1, ((3, 1, 7, 5), (4, 9, 5))),
    Case("gaussian_batched_bandwidth", "pairwise", _GAUSSIAN, ((2, 7, 5), (9, 5)), {"bandwidth": [0.7, 1.9]}),
    Case("lp_batched_p", "pairwise", _LP, ((3, 1, 7, 5), (4, 9, 5)), {"p": [[1.5], [3.0], [0.8]]}),
    Case(
        "matern52_batched_ridge",
        "pairwise",
        presets.matern52.lower(regularized=True),
        ((3, 1, 7, 5), (4, 9, 5)),
        {"regularization": [[0.1], [0.5], [2.0]], "bandwidth": [0.7, 1.3, 1.9, 2.5]},
        offsets=(2, 0),
    ),
    *(
        Case(f"{name}_nan_inf", "pairwise", presets.ALL[name].lower(), _ODD, special=True)
        for name in ("l1_distance", "l2_distance", "linf_distance", "gaussian", "dot_product")
    ),
    Case("grad_p1", "grad", _G1, _GRAD_ODD),
    Case("grad_p2", "grad", _G2, _GRAD_ODD),
    Case("grad_p1.5", "grad", _GP, _GRAD_ODD),
    Case("grad_user_huber", "grad", HUBER_GRAD, _GRAD_ODD),
    Case("grad_p2_multi_tile", "grad", _G2, _grad_shapes(133, 67, 21, 2)),
    Case("grad_p2_k0", "grad", _G2, _grad_shapes(0, 29, 19, 3)),
    Case("grad_p2_m0", "grad", _G2, _grad_shapes(37, 0, 19, 3)),
    Case("grad_p2_batch0", "grad", _G2, _grad_shapes(37, 29, 19, 3, (0,))),
    Case("grad_p2_all_size1", "grad", _G2, _grad_shapes(1, 1, 1, 1)),
    Case("grad_p2_transposed", "grad", _G2, _GRAD_ODD, layout="transposed"),
    Case("grad_p1_strided", "grad", _G1, _GRAD_ODD, layout="strided"),
    Case("grad_p2_broadcast_batch", "grad", _G2, ((2, 37, 29), *_GRAD_ODD[1:])),
    Case("grad_batched_p", "grad", _GP, _grad_shapes(37, 29, 19, 3, (2,)), {"p": [1.5, 3.0]}),
    Case("grad_p2_nan_inf", "grad", _G2, _GRAD_ODD, special=True),
    Case("grad_p1_nan_inf", "grad", _G1, _GRAD_ODD, special=True),
)
"""The problems every backend is checked on (each also in each dtype the suite is given)."""


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


def _problem(
    case: Case, operands: tuple[torch.Tensor, ...], hypers: dict, out: torch.Tensor | None
) -> PairwiseProblem | GradProblem:
    """The problem kermac builds for `case` and hands to a backend."""
    hv = program_hypers(case.program.hypers, hypers, operands[0].device, False)
    if case.op == "pairwise":
        m, n = case.offsets
        return pairwise_problem(case.program, *operands, out=out, hypers=hv, offset_m=m, offset_n=n)
    return grad_problem(case.program, *operands, out=out, hypers=hv)


def _check(found: Backend, problem: PairwiseProblem | GradProblem) -> str | None:
    """The backend's answer to `check_pairwise` / `check_grad`, which must be None or a non-empty str."""
    hook = "check_pairwise" if isinstance(problem, PairwiseProblem) else "check_grad"
    reason = getattr(found, hook)(problem)
    assert reason is None or _is_reason(reason), (
        f"backend {found.name!r}: {hook} returned {reason!r}; expected None (it runs the problem) or the reason "
        "it refuses (a non-empty str)"
    )
    return reason


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
    shape = _problem(case, operands, hypers, None).out.shape
    out = case.out(shape, operands[0])
    problem = _problem(case, operands, hypers, out)
    reason = _check(found, problem) if out.numel() else None
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


def check_hooks(backend: str, device: str | torch.device) -> None:
    """The hooks of `backend` return the documented types ([`kermac.backend.Backend`][kermac.backend.Backend]):
    `name` is its registry name, `priority` an int, `description` a str, `availability()` an
    `Availability` (with a reason when unavailable), and on sample problems on `device` (a pairwise
    and a gradient one) `check_*` None or a reason, `preference()` an int and, for accepted problems,
    `precompile()` a list of str."""
    found = registry.get_backend(backend)
    assert isinstance(found, Backend), f"{backend!r} is a {type(found).__name__}, not a kermac.backend.Backend"
    assert found.name == backend, f"backend registered as {backend!r} is named {found.name!r}"
    assert registry._is_int(found.priority), f"priority: expected an int, got {found.priority!r}"
    assert isinstance(found.description, str), f"description: expected a str, got {found.description!r}"
    av = found.availability()
    assert registry._is_availability(av), f"availability(): expected an Availability of bool/str fields, got {av!r}"
    assert av.available or _is_reason(av.reason), f"availability(): unavailable without a reason: {av!r}"
    for case in (CASES[0], next(c for c in CASES if c.op == "grad")):
        operands, hypers = case.inputs(device, torch.float32)
        problem = _problem(case, operands, hypers, None)
        preference = found.preference(problem)
        assert registry._is_int(preference), f"preference(): expected an int, got {preference!r}"
        if _check(found, problem) is None:
            built = found.precompile([problem])
            assert isinstance(built, list) and all(isinstance(b, str) for b in built), (
                f"precompile(): expected a list of str, got {built!r}"
            )


def _reaches(backend: str, device: str | torch.device, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """`backend=NAME` and `KERMAC_BACKEND=NAME` run the backend's own `pairwise` and `grad` hooks,
    for a sample problem of each that the backend accepts; returns the hooks so checked."""
    found = registry.get_backend(backend)
    checked = []
    for case in (CASES[0], next(c for c in CASES if c.op == "grad")):
        operands, hypers = case.inputs(device, torch.float32)
        if _check(found, _problem(case, operands, hypers, None)) is not None:
            continue
        hook = "pairwise" if case.op == "pairwise" else "grad"
        calls = []
        original = getattr(found, hook)

        def spy(problem: PairwiseProblem | GradProblem, original: Callable = original, calls: list = calls) -> None:
            calls.append(problem)
            original(problem)

        monkeypatch.setattr(found, hook, spy)
        run = kermac.run_program if case.op == "pairwise" else kermac.run_grad_program
        run(case.program, *operands, hypers=hypers, backend=backend)
        assert len(calls) == 1, f"backend={backend!r} ran its {hook} hook {len(calls)} times, expected once"
        with monkeypatch.context() as env:
            env.setenv(registry.ENV_BACKEND, backend)
            run(case.program, *operands, hypers=hypers)
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
    required: bool = False,
) -> dict[str, Callable[..., None]]:
    """The conformance suite of `backend` as pytest test functions, by name, for a test module's globals.

    `devices` are torch device strings (or `pytest.param(device, marks=...)`); `dtypes` the dtypes
    every case runs in.  The tests, each parametrised by device:

    - `test_<backend>_registry`: [`check_registry`][kermac.testing.check_registry];
    - `test_<backend>_hooks`: [`check_hooks`][kermac.testing.check_hooks];
    - `test_<backend>_reached`: `backend=` and `KERMAC_BACKEND` run the backend's hooks;
    - `test_<backend>_values`: [`check_case`][kermac.testing.check_case] for every case of
      [`CASES`][kermac.testing.CASES] and dtype, skipped with the backend's reason where it refuses.

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
    @pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
    def test_values(device: str, dtype: torch.dtype, case: Case) -> None:
        usable(device)
        reason = check_case(backend, case, device, dtype)
        if reason is not None:
            pytest.skip(f"backend {backend!r} refuses {case.name} ({_dtype_id(dtype)} on {device}): {reason}")

    tests = {"registry": test_registry, "hooks": test_hooks, "reached": test_reached, "values": test_values}
    return {f"test_{ident}_{check}": test for check, test in tests.items()}
