"""NVRTC backend's calls without a GPU: compiling and loading are stand-ins, and so are the driver's
entry points, which record what they receive: the argument buffer the driver would copy, grid,
stream and context.  A repeated call must launch with its own addresses and otherwise the
planner's arguments; a call that would compile or load under CUDA-graph capture must raise.
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import logging
import sys
from collections.abc import Callable, Iterator
from types import SimpleNamespace

import pytest
import torch

from kermac import presets
from kermac.hyperparams import HyperValue
from kermac.lowering import cdist_program, grad_program
from kermac.problem import GradProblem, grad_problem, pairwise_problem

pytest.importorskip("cuda.core")
from kermac_backend_nvrtc import compiler, launcher, plan
from kermac_backend_nvrtc.backend import NvrtcBackend
from kermac_backend_nvrtc.source import kernel_source
from kermac_backend_nvrtc.tuning import DEFAULT_TUNING

FUNCTION, CONTEXT, OTHER_CONTEXT, STREAM = 0x1000, 0x2000, 0x3000, 0x4000


class Driver:
    """Stand-ins for the driver functions a launch calls; `current` is the thread's current context."""

    def __init__(self) -> None:
        self.current: int | None = CONTEXT
        self.stack: list[int | None] = []
        self.launches: list[dict] = []
        self.compiled: list[str] = []
        self.result = 0
        self.capturing = False

    def entry_points(self) -> dict[str, Callable[..., int]]:
        return {
            "cuLaunchKernel": self.launch,
            "cuCtxGetCurrent": self.get,
            "cuCtxPushCurrent": self.push,
            "cuCtxPopCurrent": self.pop,
            "cuGetErrorName": self.error_name,
        }

    def get(self, ref) -> int:
        ref._obj.value = self.current
        return 0

    def push(self, ctx: int) -> int:
        self.stack.append(self.current)
        self.current = ctx
        return 0

    def pop(self, ref) -> int:
        ref._obj.value, self.current = self.current, self.stack.pop()
        return 0

    def launch(self, function, gx, gy, gz, bx, by, bz, shmem, stream, params, extra) -> int:
        assert params is None and (extra[0], extra[2], extra[4]) == (1, 2, None)  # the `extra` form (NULL reads None)
        size = ctypes.c_size_t.from_address(extra[3]).value
        self.launches.append({
            "function": function.value,
            "grid": (gx.value, gy.value, gz.value),
            "block": (bx.value, by.value, bz.value),
            "shmem": shmem.value,
            "stream": stream.value,
            "context": self.current,
            "data": ctypes.string_at(extra[1], size),
        })  # fmt: skip
        return self.result

    def error_name(self, result: int, ref) -> int:
        ref._obj.value = b"CUDA_ERROR_INVALID_VALUE"
        return 0


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch) -> Driver:
    fake = Driver()
    monkeypatch.setattr(launcher, "_driver", fake.entry_points)
    monkeypatch.setattr(launcher, "_current_stream", lambda index: STREAM + index)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: fake.capturing)

    def compile_cubin(source: str, arch: str, *, name: str) -> SimpleNamespace:
        fake.compiled.append(name)
        return SimpleNamespace(key=f"key{len(fake.compiled)}", cubin=b"", hit=False, ptxas="")

    def load_kernel(device, key, cubin, name, params, compute, shmem=0) -> launcher.LoadedKernel:
        return launcher.LoadedKernel.of(None, params, compute, device, name, "", FUNCTION, CONTEXT, shmem)

    monkeypatch.setattr(compiler, "compile_cubin", compile_cubin)
    monkeypatch.setattr(launcher, "load_kernel", load_kernel)
    return fake


def _aligned(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A fresh random tensor starting on a 256-byte boundary (fresh ones of one shape share a plan)."""
    n = 1
    for s in shape:
        n *= s
    storage = torch.randn(n + 256, dtype=torch.float64).to(dtype)
    start = -storage.data_ptr() % 256 // storage.element_size()
    return storage[start : start + n].view(shape)


def _hypers(**values: float | torch.Tensor) -> dict[str, HyperValue]:
    return {k: HyperValue(k, v) if isinstance(v, float) else HyperValue(k, None, v) for k, v in values.items()}


def _cdist_p1() -> object:
    return pairwise_problem(cdist_program(1.0), _aligned(37, 16), _aligned(29, 16), out=_aligned(37, 29), hypers={})


def _laplace_batched_bandwidth() -> object:
    program = presets.laplace_l2.lower(regularized=True)
    hypers = _hypers(bandwidth=_aligned(3).abs_().add_(1), regularization=0.5)
    return pairwise_problem(program, _aligned(3, 37, 24), _aligned(29, 24), out=_aligned(3, 37, 29), hypers=hypers)


def _grad_p15() -> object:
    a, b, c, d = _aligned(21, 19), _aligned(11, 21), _aligned(3, 21), _aligned(11, 19)
    return grad_problem(grad_program(None), a, b, c, d, out=_aligned(3, 11, 19), hypers=_hypers(p=1.5))


def _grad_batched_p() -> object:
    a, b, c, d = _aligned(2, 21, 19), _aligned(11, 21), _aligned(9, 21), _aligned(11, 19)
    hypers = _hypers(p=_aligned(2).abs_().add_(1))
    return grad_problem(grad_program(None), a, b, c, d, out=_aligned(2, 9, 11, 19), hypers=hypers)


def _run(backend: NvrtcBackend, problem: object) -> None:
    (backend.grad if isinstance(problem, GradProblem) else backend.pairwise)(problem)


def _expected(problem: object) -> list[dict]:
    """What the driver must receive for `problem`: the planner's launches, arguments packed in
    the kernel's parameter order."""
    planner = plan.plan_grad if isinstance(problem, GradProblem) else plan.plan_pairwise
    variant, launch = planner(problem, None, DEFAULT_TUNING)
    params = kernel_source(variant)[1]
    packer = launcher.argument_layout(params, variant.compute)
    return [
        {
            "function": FUNCTION,
            "grid": (launch.grid_x, 1, gz),
            "block": (launch.block, 1, 1),
            "shmem": variant.dynamic_smem,
            "stream": STREAM,
            "context": CONTEXT,
            "data": packer.pack(*[(launch.args | {"zbase": zbase})[p.name] for p in params]),
        }
        for zbase, gz in launch.chunks()
    ]


@pytest.mark.parametrize("build", [_cdist_p1, _laplace_batched_bandwidth, _grad_p15, _grad_batched_p])
def test_repeated_calls_launch_with_their_own_addresses(driver: Driver, build: Callable[[], object]) -> None:
    """Calls of one plan (fresh tensors, tensor hyperparameters among them) compile once, plan
    once, and each launches with the planner's arguments for its own tensors."""
    backend = NvrtcBackend()
    problems = [build() for _ in range(3)]
    assert len({plan.call_key(p)[0] for p in problems}) == 1  # one plan, or the test shows nothing
    for problem in problems:
        _run(backend, problem)
    assert len(driver.compiled) == 1 and len(backend._plans) == 1
    assert driver.launches == [launch for p in problems for launch in _expected(p)]
    assert len({launch["data"] for launch in driver.launches}) == 3


def test_a_batch_beyond_the_grid_launches_in_chunks(driver: Driver) -> None:
    """70000 z-blocks: two launches (zbase 0 and 65535), each with the call's addresses."""
    backend = NvrtcBackend()
    problems = [
        pairwise_problem(cdist_program(1.0), _aligned(70000, 2, 4), _aligned(70000, 3, 4), out=None, hypers={})
        for _ in range(2)
    ]
    for problem in problems:
        backend.pairwise(problem)
    expected = [launch for p in problems for launch in _expected(p)]
    assert [launch["grid"][2] for launch in expected] == [65535, 4465, 65535, 4465]
    assert driver.launches == expected


@pytest.mark.parametrize("current", [OTHER_CONTEXT, None])
def test_another_or_no_current_context_is_pushed_and_restored(driver: Driver, current: int | None) -> None:
    backend = NvrtcBackend()
    problem = _cdist_p1()
    backend.pairwise(problem)
    driver.current = current
    backend.pairwise(problem)
    assert [launch["context"] for launch in driver.launches] == [CONTEXT, CONTEXT]
    assert driver.current == current and driver.stack == []


def test_a_failing_launch_names_the_kernel_and_restores_the_context(driver: Driver) -> None:
    backend = NvrtcBackend()
    problem = _cdist_p1()
    driver.current, driver.result = OTHER_CONTEXT, 1
    with pytest.raises(
        RuntimeError, match=r"launching kermac_pairwise on cuda:0 failed: CUDA_ERROR_INVALID_VALUE \(1\)"
    ):
        backend.pairwise(problem)
    assert driver.current == OTHER_CONTEXT and driver.stack == []


def test_debug_plans_and_logs_every_call(driver: Driver, caplog: pytest.LogCaptureFixture) -> None:
    backend = NvrtcBackend()
    problem = pairwise_problem(cdist_program(1.0), _aligned(37, 16), _aligned(29, 16), out=None, hypers={}, debug=True)
    with caplog.at_level(logging.DEBUG, logger="kermac"):
        backend.pairwise(problem)
        backend.pairwise(problem)
    assert caplog.text.count("launch grid") == 2 and not backend._plans
    assert driver.launches == _expected(problem) * 2


def test_a_launch_without_addresses_packs_the_values_given(driver: Driver) -> None:
    problem = _cdist_p1()
    variant, launch = plan.plan_pairwise(problem, None, DEFAULT_TUNING)
    params = kernel_source(variant)[1]
    kernel = launcher.LoadedKernel.of(None, params, variant.compute, 0, variant.kernel, "", FUNCTION, CONTEXT)
    launcher.PreparedLaunch(kernel, launch.block, [((launch.grid_x, 1, 1), launch.args | {"zbase": 0})]).run(())
    assert driver.launches == _expected(problem)


def test_prepared_launch_refreshes_exactly_the_pointer_parameters(driver: Driver) -> None:
    problem = _cdist_p1()
    variant, launch = plan.plan_pairwise(problem, None, DEFAULT_TUNING)
    kernel = launcher.LoadedKernel.of(None, kernel_source(variant)[1], variant.compute, 0, "k", "", FUNCTION, CONTEXT)
    steps = [((1, 1, 1), launch.args | {"zbase": 0})]
    for names in (("x", "z"), ("x", "z", "out", "M"), ("x", "x", "z", "out")):
        with pytest.raises(AssertionError, match="pointer parameters"):
            launcher.PreparedLaunch(kernel, launch.block, steps, names)
    prepared = launcher.PreparedLaunch(kernel, launch.block, steps, ("out", "z", "x"))  # any order
    prepared.run((3, 2, 1))
    values = kernel.packer.unpack(driver.launches[0]["data"])
    assert [values[i] for i, p in enumerate(kernel.params) if p.name in ("x", "z", "out")] == [1, 2, 3]


def test_compiling_under_graph_capture_raises_and_says_what_to_do(driver: Driver) -> None:
    """Cold under capture: a RuntimeError naming the kernel and the remedy, before compiling or
    launching anything.  Warmed up, the same call launches under capture, and so does a new plan
    of a loaded kernel (planning is host work); another kernel still raises."""
    backend = NvrtcBackend()
    driver.capturing = True
    remedy = r"kermac_pairwise kernel .* on cuda:0, which this backend has not loaded .* run the same call once"
    with pytest.raises(RuntimeError, match=remedy):
        backend.pairwise(_cdist_p1())
    assert driver.compiled == [] and driver.launches == [] and not backend._plans
    driver.capturing = False
    backend.pairwise(_cdist_p1())
    driver.capturing = True
    backend.pairwise(_cdist_p1())
    bigger = pairwise_problem(cdist_program(1.0), _aligned(45, 16), _aligned(29, 16), out=_aligned(45, 29), hypers={})
    backend.pairwise(bigger)
    assert len(driver.compiled) == 1 and len(driver.launches) == 3 and len(backend._plans) == 2
    with pytest.raises(RuntimeError, match="before capturing"):
        backend.grad(_grad_p15())
    assert len(driver.compiled) == 1


class LibraryDriver:
    """A stand-in for the `cuda.bindings.driver` calls that load a cubin as a library, recording them; `fail` names
    a call that returns an error (an enum member, as the bindings return)."""

    CUresult = enum.IntEnum("CUresult", {"CUDA_SUCCESS": 0, "CUDA_ERROR_INVALID_IMAGE": 200})
    CUfunction_attribute = SimpleNamespace(
        CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES="max dynamic shared",
        CU_FUNC_ATTRIBUTE_NUM_REGS="registers",
        CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES="local",
        CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES="static shared",
    )

    def __init__(self, fail: str | None = None) -> None:
        self.calls: list[tuple] = []
        self.fail = fail

    def __getattr__(self, name: str) -> Callable[..., tuple]:
        values = {
            "cuInit": (),
            "cuDeviceGet": ("device",),
            "cuDevicePrimaryCtxRetain": ("context",),
            "cuCtxSetCurrent": (),
            "cuLibraryLoadData": ("library",),
            "cuLibraryGetKernel": ("kernel",),
            "cuKernelSetAttribute": (),
            "cuKernelGetFunction": (FUNCTION,),
            "cuLibraryUnload": (),
        }
        ok = self.CUresult.CUDA_SUCCESS

        def call(*args: object) -> tuple:
            self.calls.append((name, *args))
            if name == self.fail:
                return (self.CUresult.CUDA_ERROR_INVALID_IMAGE,)
            if name == "cuKernelGetAttribute":
                return (ok, {"registers": 40, "local": 0, "static shared": 1024}[args[0]])
            return (ok, *values[name])

        if not name.startswith("cu"):
            raise AttributeError(name)
        return call

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]


@pytest.fixture
def library_driver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., LibraryDriver]]:
    import cuda.bindings

    def install(fail: str | None = None) -> LibraryDriver:
        fake = LibraryDriver(fail)
        monkeypatch.setattr(cuda.bindings, "driver", fake, raising=False)
        monkeypatch.setitem(sys.modules, "cuda.bindings.driver", fake)
        launcher._primary_context.cache_clear()
        return fake

    yield install
    launcher._primary_context.cache_clear()


@pytest.mark.parametrize("shmem", [0, 48 * 1024, 48 * 1024 + 16])
def test_a_cubin_loads_as_a_library_in_the_primary_context(library_driver, shmem: int) -> None:
    fake = library_driver()
    library, function, resources = launcher._load_library(3, b"cubin", "kermac_pairwise", shmem)
    assert (library, function) == ("library", FUNCTION)
    assert resources == "40 registers, 0 bytes local memory, 1024 bytes static shared memory"
    assert fake.names()[:6] == ["cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent",
                                "cuLibraryLoadData", "cuLibraryGetKernel"]  # fmt: skip
    assert fake.calls[1][1] == 3 and fake.calls[3][1] == "context" and fake.calls[4][1] == b"cubin"
    assert fake.calls[5][1:] == ("library", b"kermac_pairwise")
    raised = [c for c in fake.calls if c[0] == "cuKernelSetAttribute"]
    assert raised == ([("cuKernelSetAttribute", "max dynamic shared", shmem, "kernel", "device")] if shmem > 48 * 1024
                      else [])  # fmt: skip
    launcher._load_library(3, b"cubin", "other", 0)  # the primary context is retained once, made current each time
    assert fake.names().count("cuDevicePrimaryCtxRetain") == 1 and fake.names().count("cuCtxSetCurrent") == 2


@pytest.mark.parametrize(
    ("fail", "message"),
    [
        ("cuLibraryLoadData", "cuLibraryLoadData of kermac_pairwise on cuda:0 failed: CUDA_ERROR_INVALID_IMAGE (200)"),
        ("cuLibraryGetKernel", "cuLibraryGetKernel(kermac_pairwise) failed: CUDA_ERROR_INVALID_IMAGE (200)"),
        ("cuKernelSetAttribute", "allowing 65536 bytes of dynamic shared memory to kermac_pairwise on cuda:0 failed"),
    ],
)
def test_a_failed_load_names_the_call_and_the_error(library_driver, fail: str, message: str) -> None:
    library_driver(fail)
    with pytest.raises(RuntimeError) as raised:
        launcher._load_library(0, b"cubin", "kermac_pairwise", 64 * 1024)
    assert str(raised.value).startswith(message)


def test_kernel_attributes_that_fail_only_change_the_description(library_driver) -> None:
    library_driver("cuKernelGetAttribute")
    _, function, resources = launcher._load_library(0, b"cubin", "kermac_pairwise", 0)
    assert function == FUNCTION and resources.startswith("attributes unavailable: cuKernelGetAttribute failed")


def test_a_kernel_loaded_twice_at_once_keeps_one_library(library_driver, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two threads loading one kernel: the second to finish gets the first's kernel and unloads its library."""
    fake = library_driver()
    first = launcher.LoadedKernel.of("first library", [], "float", 0, "k", "", FUNCTION, CONTEXT)

    def load_while_another_thread_finishes(device, cubin, name, shmem):
        launcher._kernels[(device, "key", name)] = first  # the other thread's load lands meanwhile
        return "second library", FUNCTION, ""

    monkeypatch.setattr(launcher, "_load_library", load_while_another_thread_finishes)
    monkeypatch.setattr(launcher, "_current_context", lambda: CONTEXT)
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(launcher, "_kernels", {})
    assert launcher.load_kernel(0, "key", b"cubin", "k", [], "float") is first
    assert fake.calls == [("cuLibraryUnload", "second library")]
