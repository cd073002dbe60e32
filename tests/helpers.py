"""Shared test helpers: the backend × device matrix and independent float64 references.

The references below are written from the formulas in ``docs/formulas.md`` with plain
broadcasting in float64 on the CPU; they share no code with kermac.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

from kermac.backend import Availability, Backend
from kermac.testing import TOLERANCE

BACKENDS = ("torch", "nvrtc", "triton")

#: (backend, device) pairs; CUDA ones carry the ``gpu`` mark (run with ``pytest -m gpu``).
#: Backends that can run CPU tensors (Triton only through its interpreter, TRITON_INTERPRET=1).
CPU_BACKENDS = ("torch", "triton")

BACKEND_DEVICES = [
    pytest.param(b, dev, id=f"{b}-{dev}", marks=[pytest.mark.gpu] if dev == "cuda" else [])
    for b in BACKENDS
    for dev in ("cpu", "cuda")
    if dev == "cuda" or b in CPU_BACKENDS
]

#: Backends that must be available (comma-separated in KERMAC_REQUIRE_BACKENDS): on the GPU
#: machine an unavailable required backend fails instead of skipping.
REQUIRED = {b for b in os.environ.get("KERMAC_REQUIRE_BACKENDS", "").split(",") if b}

#: Operations a required backend refuses by design, so their tests skip for it instead of failing: NVRTC has no
#: fused kernel for the first-order gradient of a general product (`kermac::product_grad`); on CUDA the Triton
#: backend computes it (and the tests run it there).
REFUSED_BY_DESIGN = {("nvrtc", "product_grad")}


def require_backend(name: str, device: str, op: str = "pairwise") -> None:
    """Skip (or fail, if required) unless backend ``name`` can run ``op`` (``"pairwise"``, ``"product"``,
    ``"product_grad"`` or ``"grad"``) on ``device``."""
    import kermac
    from kermac import registry

    def give_up(reason: str) -> None:
        if name in REQUIRED and device == "cuda" and (name, op) not in REFUSED_BY_DESIGN:
            pytest.fail(f"required backend {name!r} cannot run on {device}: {reason}")
        pytest.skip(f"backend {name!r} on {device}: {reason}")

    if name not in registry.registered_backends():
        give_up("not installed")
    status = {s.name: s for s in kermac.backends()}[name]
    if not status.available:
        give_up(status.reason or "unavailable")
    backend = registry.get_backend(name)
    from kermac.problem import grad_problem, pairwise_problem, product_grad_problem, product_problem

    if op == "pairwise":
        x = torch.zeros(2, 3, device=device)
        reason = backend.check_pairwise(pairwise_problem(kermac.presets.l1_distance.lower(), x, x, out=None, hypers={}))
    elif op == "product":
        x, v = torch.zeros(2, 3, device=device), torch.zeros(2, 1, device=device)
        problem = product_problem(kermac.presets.l1_distance.lower(), x, x, v, out=None, hypers={})
        reason = backend.check_product(problem)
    elif op == "product_grad":
        x, v = torch.zeros(2, 3, device=device), torch.zeros(2, 1, device=device)
        problem = product_grad_problem(kermac.presets.l1_distance.lower(), x, x, v, v, out=None, hypers={})
        reason = backend.check_product_grad(problem)
    else:
        prog = kermac.GradProgram(kermac.ir.Var("d") - kermac.ir.Var("b"), kermac.ir.Var("acc"))
        a, b, c, d = (torch.zeros(s, device=device) for s in ((3, 2), (2, 3), (2, 3), (2, 2)))  # K=3, M=2, N=2, O=2
        reason = backend.check_grad(grad_problem(prog, a, b, c, d, out=None, hypers={}))
    if reason is not None:
        give_up(reason)


def device_under_test() -> str:
    """Where a backend's tests put their tensors: the GPU where there is one, else the CPU."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def skip_unless_triton_runs(device: str) -> None:
    """Skip the test unless the Triton backend can run tensors on `device` (the CPU only under its interpreter,
    ``TRITON_INTERPRET=1``, which tests/conftest.py sets where there is no GPU)."""
    from kermac_backend_triton.launch import interpreting

    if device == "cpu" and not interpreting():
        pytest.skip("the Triton backend runs CPU tensors only under TRITON_INTERPRET=1")


def tolerance(dtype: torch.dtype) -> float:
    """Relative Frobenius tolerance of an output in ``dtype`` (fp32: the project's accuracy bound, 1e-4 relative)."""
    return TOLERANCE[dtype]


def rel_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """‖actual − expected‖_F / ‖expected‖_F in float64 (NaN if ``actual`` has a NaN)."""
    a, e = actual.detach().double().cpu(), expected.double().cpu()
    if torch.isnan(a).any() and not torch.isnan(e).any():
        return math.nan
    denom = e.norm().item() or 1.0
    return (a - e).norm().item() / denom


def assert_close(actual: torch.Tensor, expected: torch.Tensor, tol: float) -> None:
    assert actual.shape == expected.shape, f"shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    err = rel_error(actual, expected)
    assert err <= tol, f"relative error {err:.3e} > {tol:.1e}"


def ref_distance_sum(x: torch.Tensor, z: torch.Tensor, p: float) -> torch.Tensor:
    """Σ_k |x_mk − z_nk|^p in float64 (p = 0: count of non-zeros; p = inf: the max)."""
    diff = (x.double().cpu()[..., :, None, :] - z.double().cpu()[..., None, :, :]).abs()
    if p == 0:
        return (diff != 0).double().sum(-1)
    if p == math.inf:
        return diff.amax(-1) if diff.shape[-1] else diff.sum(-1)
    return diff.pow(p).sum(-1)


def ref_cdist(x: torch.Tensor, z: torch.Tensor, p: float) -> torch.Tensor:
    """(Σ_k |x_mk − z_nk|^p)^(1/p) in float64."""
    s = ref_distance_sum(x, z, p)
    return s if p in (0, 1, math.inf) else s.pow(1.0 / p)


def ref_grad(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor, p: float) -> torch.Tensor:
    """Σ_k c[o,k]·a[k,m]·sgn(d[n,m]−b[n,k])·|d[n,m]−b[n,k]|^(p−1), with 0 where d = b."""
    a, b, c, d = (t.double().cpu() for t in (a, b, c, d))
    t = d[..., :, :, None] - b[..., :, None, :]  # [..., N, M, K]
    phi = torch.where(t != 0, torch.sign(t) * t.abs().pow(p - 1), torch.zeros_like(t))
    return torch.einsum("...ok,...km,...nmk->...onm", c, a, phi)


def randn(*shape: int, dtype: torch.dtype = torch.float32, device: str = "cpu") -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64).to(dtype=dtype, device=device)


def load_script(name: str) -> ModuleType:
    """The module ``tools/<name>.py`` of this repository (development tools are not an installed package)."""
    path = Path(__file__).resolve().parents[1] / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # as an import would: dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def nvrtc_tuning(**changes: object) -> Iterator:
    """Inside the block, ``backend="nvrtc"`` is an NVRTC backend planning with the default tuning but
    ``changes`` (fields of ``NvrtcTuning``), registered in place of the installed one; yields it."""
    from kermac_backend_nvrtc import DEFAULT_TUNING, NvrtcBackend
    from kermac_backend_nvrtc.tuned import registered

    backend = NvrtcBackend(dataclasses.replace(DEFAULT_TUNING, **changes))
    with registered(backend):
        yield backend


def require_nvrtc_compiler(*, module_level: bool = False) -> None:
    """Skip (the whole module with `module_level`) unless the NVRTC backend and cuda.core import and the NVRTC
    library loads: what compiling kernels to cubin needs, with or without a GPU."""
    pytest.importorskip("kermac_backend_nvrtc.source")
    pytest.importorskip("cuda.core")
    from kermac_backend_nvrtc import compiler

    try:
        compiler.nvrtc_version()
    except Exception as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"NVRTC library not loadable: {exc}", allow_module_level=module_level)


@contextlib.contextmanager
def plugin_beside_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, source: str, entry: str
) -> Iterator[None]:
    """Inside the block, kermac's backends are the reference backend and those of a plugin module `module`
    (written from `source` into `tmp_path`, put on `sys.path`), registered under the entry point `entry`;
    `KERMAC_BACKEND` is unset.  The registry is rebuilt from the installed plugins afterwards."""
    from importlib import metadata

    from kermac import registry

    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("KERMAC_BACKEND", raising=False)
    group = "kermac.backends"
    registry.reset(
        [
            metadata.EntryPoint(name="torch", value="kermac.reference.plugin", group=group),
            metadata.EntryPoint(name=entry, value=module, group=group),
        ]
    )
    try:
        yield
    finally:
        registry.reset()


def older_backend_source(class_name: str, name: str) -> str:
    """The source of a plugin module's backend class `class_name` (backend `name`, priority 50) written before the
    fused products and the general gradient form: it runs pairwise problems and product-form gradients on the
    reference backend and overrides no other hook.  The module imports `Availability`, `Backend`, `hookimpl` and
    `ReferenceBackend`; append its other classes and its `kermac_backends` hook."""
    return f"""
from kermac.backend import Availability, Backend
from kermac.hookspecs import hookimpl
from kermac.reference.backend import ReferenceBackend

_REF = ReferenceBackend()


class {class_name}(Backend):
    name = "{name}"
    priority = 50

    def availability(self):
        return Availability.yes()

    def check_pairwise(self, problem):
        return None

    def pairwise(self, problem):
        _REF.pairwise(problem)

    def check_grad(self, problem):
        return None

    def grad(self, problem):
        _REF.grad(problem)
"""


class PairwiseOnlyBackend(Backend):
    """A backend written before the fused products, named "old": it computes pairwise problems and gradients
    (never called) and overrides no product hook, so the defaults' refusals show."""

    name = "old"

    def availability(self) -> Availability:
        return Availability.yes()

    def check_pairwise(self, problem):
        return None

    def pairwise(self, problem):
        raise AssertionError("not called")

    def check_grad(self, problem):
        return None

    def grad(self, problem):
        raise AssertionError("not called")
