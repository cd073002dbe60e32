"""Load cubins per device and launch kernels on PyTorch's current stream.

A cubin is loaded once per (device, cache key) as a CUDA library (`cuLibraryLoadData`, through
`cuda.bindings`: importing `cuda.core`, which only compiling needs, would add tens of milliseconds
to a process's first call); kernels are looked up by name.  A launch packs the arguments into one
buffer laid out as the kernel's parameter list (each value at its C type's natural alignment:
pointers and `long long` 8 bytes, `int` 4, `km_t` the compute type) and hands it to the driver's
`cuLaunchKernel` directly (`extra` form).  That costs a few microseconds on the host where
`cuda.core.launch`'s per-argument conversion cost tens.  A `PreparedLaunch` packs every argument
of a plan once and, per call, writes only the device addresses into its buffer.  Launching never
synchronises.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache

import torch

from kermac.logs import logger
from kermac_backend_nvrtc.source import Param

__all__ = ["LoadedKernel", "PreparedLaunch", "argument_layout", "load_kernel"]

_lock = threading.Lock()
_kernels: dict[tuple[int, str, str], LoadedKernel] = {}

# cuLaunchKernel's `extra` markers (cuda.h).
_PARAM_BUFFER_POINTER = 1
_PARAM_BUFFER_SIZE = 2
_PARAM_END = 0


@dataclass(frozen=True)
class LoadedKernel:
    """A kernel loaded on one device with its parameter list and argument layout."""

    library: object  # the CUlibrary holding the kernel (never unloaded: the kernel cache lives as long as the process)
    params: tuple[Param, ...]
    compute: str  # "float" or "double"
    device: int
    name: str
    resources: str  # registers, local (spill) memory and static shared memory per the driver
    function: int  # the CUfunction handle in the device's primary context
    context: int  # that context's handle
    packer: struct.Struct  # the argument buffer's layout, in parameter order
    offsets: tuple[int, ...]  # each parameter's byte offset in that buffer
    buffer_size: ctypes.c_size_t  # packer.size, as cuLaunchKernel's `extra` reads it
    shmem: int = 0  # dynamic shared memory per block, bytes

    @classmethod
    def of(
        cls,
        library: object,
        params: Sequence[Param],
        compute: str,
        device: int,
        name: str,
        resources: str,
        function: int,
        context: int,
        shmem: int = 0,
    ) -> LoadedKernel:
        """The loaded kernel with its argument layout derived from `params` (`argument_layout`)."""
        fmt, offsets = _layout(params, compute)
        packer = struct.Struct(fmt)
        return cls(
            library, tuple(params), compute, device, name, resources, function, context, packer, offsets,
            ctypes.c_size_t(packer.size), shmem,
        )  # fmt: skip


def _layout(params: Sequence[Param], compute: str) -> tuple[str, tuple[int, ...]]:
    """The `struct` format of a kernel's argument buffer and each parameter's offset in it."""
    by_type = {"long long": "q", "int": "i", "km_t": "f" if compute == "float" else "d"}
    fmt, offset, offsets = "<", 0, []
    for p in params:
        code = "Q" if p.ctype.endswith("*") else by_type.get(p.ctype)
        if code is None:
            raise AssertionError(f"unknown parameter type {p.ctype!r} of {p.name}")
        size = struct.calcsize("<" + code)
        pad = -offset % size
        fmt += "x" * pad + code
        offsets.append(offset + pad)
        offset += pad + size
    return fmt, tuple(offsets)


def argument_layout(params: Sequence[Param], compute: str) -> struct.Struct:
    """The layout of a kernel's argument buffer: each parameter at its C type's natural alignment
    (pointers and `long long` as 8-byte integers, `int` 4, `km_t` as `compute`).

    Offsets count from the start of the buffer, which the driver copies to the start of the
    kernel's parameter space; that start is only 16-byte aligned (`c[0x0][0x210]` on sm_90), so
    a parameter aligned to more — a 64-byte `CUtensorMap` — would sit 48 bytes further in than
    this layout puts it.  Every type here aligns to 8 at most."""
    return struct.Struct(_layout(params, compute)[0])


@cache
def _driver() -> dict[str, Callable[..., int]]:
    """ctypes entry points of the driver functions a launch uses (from the driver cuda.bindings loaded)."""
    from cuda.bindings import driver

    vp = ctypes.c_void_p
    signatures = {
        # Called with ctypes objects only (built once per plan, see PreparedLaunch): without a
        # prototype ctypes passes them as they are instead of converting 11 Python values per call.
        "cuLaunchKernel": (),
        "cuCtxGetCurrent": (ctypes.POINTER(vp),),
        "cuCtxPushCurrent": (vp,),
        "cuCtxPopCurrent": (ctypes.POINTER(vp),),
        "cuGetErrorName": (ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)),
    }
    found = {}
    flags = driver.CUdriverProcAddress_flags.CU_GET_PROC_ADDRESS_DEFAULT
    for name, argtypes in signatures.items():
        err, address, _ = driver.cuGetProcAddress(name.encode(), 12000, flags)
        if err != driver.CUresult.CUDA_SUCCESS or not address:
            raise RuntimeError(f"the CUDA driver has no {name} (cuGetProcAddress: {err})")
        found[name] = ctypes.CFUNCTYPE(ctypes.c_int, *argtypes)(address)
    return found


def _fail(result: int, what: str) -> None:
    """Raise for the driver's nonzero `result` of `what`, naming the error."""
    name = ctypes.c_char_p()
    _driver()["cuGetErrorName"](result, ctypes.byref(name))
    raise RuntimeError(f"{what} failed: {(name.value or b'CUDA error').decode()} ({result})")


def _driver_call(result: tuple, what: str) -> object:
    """The value of a `cuda.bindings.driver` call's `(CUresult, value)` (None for `(CUresult,)`); raises naming
    `what` and the error where the call failed."""
    from cuda.bindings import driver

    err, *values = result
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what} failed: {getattr(err, 'name', err)} ({int(err)})")
    return values[0] if values else None


@cache
def _primary_context(device: int) -> tuple[object, object]:
    """`(CUdevice, its primary context)` for CUDA device `device`, retained once per process (torch keeps it for
    the process too)."""
    from cuda.bindings import driver

    _driver_call(driver.cuInit(0), "cuInit")  # torch initialised the driver already: a no-op then
    dev = _driver_call(driver.cuDeviceGet(device), f"cuDeviceGet({device})")
    return dev, _driver_call(driver.cuDevicePrimaryCtxRetain(dev), f"cuDevicePrimaryCtxRetain(cuda:{device})")


def _load_library(device: int, cubin: bytes, name: str, shmem: int) -> tuple[object, int, str]:
    """Load `cubin` as a library and find its kernel `name` for CUDA device `device`, whose primary context it
    makes current (the one torch uses), allowing `shmem` bytes of dynamic shared memory per block (above the
    default 48 KB); `(library, the CUfunction in that context, a description of its resources)`."""
    from cuda.bindings import driver

    dev, context = _primary_context(device)
    _driver_call(driver.cuCtxSetCurrent(context), f"cuCtxSetCurrent(cuda:{device})")
    library = _driver_call(
        driver.cuLibraryLoadData(cubin, None, None, 0, None, None, 0), f"cuLibraryLoadData of {name} on cuda:{device}"
    )
    kernel = _driver_call(driver.cuLibraryGetKernel(library, name.encode()), f"cuLibraryGetKernel({name})")
    attr = driver.CUfunction_attribute
    if shmem > 48 * 1024:
        _driver_call(
            driver.cuKernelSetAttribute(attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shmem, kernel, dev),
            f"allowing {shmem} bytes of dynamic shared memory to {name} on cuda:{device}",
        )
    function = _driver_call(driver.cuKernelGetFunction(kernel), f"cuKernelGetFunction({name})")
    try:
        regs, local, shared = (
            _driver_call(driver.cuKernelGetAttribute(a, kernel, dev), "cuKernelGetAttribute")
            for a in (attr.CU_FUNC_ATTRIBUTE_NUM_REGS, attr.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
                      attr.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
        )  # fmt: skip
        resources = f"{regs} registers, {local} bytes local memory, {shared} bytes static shared memory"
    except Exception as exc:  # attributes are diagnostics only
        resources = f"attributes unavailable: {exc}"
    return library, int(function), resources


def _current_context() -> int:
    ctx = ctypes.c_void_p()
    result = _driver()["cuCtxGetCurrent"](ctypes.byref(ctx))
    if result:
        _fail(result, "cuCtxGetCurrent")
    return ctx.value or 0


def load_kernel(
    device: int, key: str, cubin: bytes, name: str, params: Sequence[Param], compute: str, shmem: int = 0
) -> LoadedKernel:
    """The kernel `name` of `cubin` on CUDA device `device` (loaded on first use), allowed
    `shmem` bytes of dynamic shared memory per block."""
    cache_id = (device, key, name)
    with _lock:
        found = _kernels.get(cache_id)
    if found is not None:
        return found
    with torch.cuda.device(device):
        library, function, resources = _load_library(device, cubin, name, shmem)
        context = _current_context()
    loaded = LoadedKernel.of(library, params, compute, device, name, resources, function, context, shmem)
    with _lock:
        kept = _kernels.setdefault(cache_id, loaded)
    if kept is not loaded:  # another thread loaded the same kernel meanwhile: one library stays
        from cuda.bindings import driver

        _driver_call(driver.cuLibraryUnload(library), f"cuLibraryUnload of {name} on cuda:{device}")
        return kept
    logger.debug("nvrtc: loaded %s on cuda:%d: %s", name, device, resources)
    return loaded


_current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
    lambda index: torch.cuda.current_stream(index).cuda_stream
)
"""The raw handle of a device's current stream (what torch.cuda.current_stream(i).cuda_stream
returns, without building a Stream object; Triton's launcher reads it the same way).
"""


def _pointer_runs(k: LoadedKernel, names: Sequence[str]) -> tuple[tuple[struct.Struct, int, int, int], ...]:
    """How `PreparedLaunch.run` writes the addresses of parameters `names` (in that order) into
    `k`'s argument buffer: `(packer, offset, start, stop)` packs `names[start:stop]` at `offset`,
    one entry per stretch of them that lie next to each other both in the buffer and in `names`."""
    pointers = {p.name: offset for p, offset in zip(k.params, k.offsets, strict=True) if p.ctype.endswith("*")}
    if (names and set(names) != set(pointers)) or len(set(names)) != len(names):
        raise AssertionError(f"{k.name}: addresses given per call {list(names)}, pointer parameters {list(pointers)}")
    runs: list[list[int]] = []  # [offset, start, stop]
    for i, name in enumerate(names):
        offset = pointers[name]
        if runs and runs[-1][2] == i and runs[-1][0] + 8 * (i - runs[-1][1]) == offset:
            runs[-1][2] = i + 1
        else:
            runs.append([offset, i, i + 1])
    return tuple((struct.Struct("<" + "Q" * (stop - start)), offset, start, stop) for offset, start, stop in runs)


class PreparedLaunch:
    """The launches of one plan of kernel `k`, every argument packed but the device addresses.

    `steps` holds each launch's grid and parameter values by name; `pointers` names the
    parameters whose values change per call (every pointer parameter of the kernel, or none),
    in the order `run` receives them (with none, `steps` give every value).  Each launch keeps
    its argument buffer, the `extra` array pointing to it and its dimensions as ctypes objects;
    `run` writes the addresses into the buffers (under a lock, as two threads may run one plan)
    and launches, converting only the stream handle.  The driver copies the arguments before
    `cuLaunchKernel` returns (also into a graph being captured), so the next call may write the
    buffers again.
    """

    __slots__ = ("_ctx", "_ctx_ref", "_get", "_launch", "_lock", "_pop", "_push", "_runs", "_steps", "kernel")

    def __init__(
        self,
        k: LoadedKernel,
        block: int,
        steps: Sequence[tuple[tuple[int, int, int], dict[str, int | float]]],
        pointers: Sequence[str] = (),
    ) -> None:
        self.kernel = k
        self._runs = _pointer_runs(k, pointers)
        launches = []
        for grid, values in steps:
            buffer = ctypes.create_string_buffer(k.packer.pack(*[values[p.name] for p in k.params]), k.packer.size)
            extra = (ctypes.c_void_p * 5)(
                _PARAM_BUFFER_POINTER, ctypes.addressof(buffer), _PARAM_BUFFER_SIZE,
                ctypes.addressof(k.buffer_size), _PARAM_END,
            )  # fmt: skip
            dims = (ctypes.c_uint(v) for v in (*grid, block, 1, 1, k.shmem))
            launches.append((buffer, extra, (ctypes.c_void_p(k.function), *dims)))
        self._steps = tuple(launches)
        self._ctx = ctypes.c_void_p()
        self._ctx_ref = ctypes.byref(self._ctx)
        self._lock = threading.Lock()
        driver = _driver()
        self._launch, self._get = driver["cuLaunchKernel"], driver["cuCtxGetCurrent"]
        self._push, self._pop = driver["cuCtxPushCurrent"], driver["cuCtxPopCurrent"]

    def run(self, pointers: Sequence[int]) -> None:
        """Launch on the current stream of the kernel's device with these addresses (the values
        of the parameters named at construction, in that order).

        The kernel runs in its device's primary context: where another context is current on
        this thread (another device's, or none yet), the kernel's is pushed for the launch and
        popped after."""
        k = self.kernel
        with self._lock:
            result = self._get(self._ctx_ref)
            if result:
                _fail(result, "cuCtxGetCurrent")
            pushed = (self._ctx.value or 0) != k.context
            if pushed:
                result = self._push(k.context)
                if result:
                    _fail(result, f"making cuda:{k.device}'s context current")
            try:
                stream = _current_stream(k.device)
                for buffer, extra, args in self._steps:
                    for packer, offset, start, stop in self._runs:
                        packer.pack_into(buffer, offset, *pointers[start:stop])
                    result = self._launch(*args, ctypes.c_void_p(stream), None, extra)
                    if result:
                        _fail(result, f"launching {k.name} on cuda:{k.device}")
            finally:
                if pushed:
                    self._pop(self._ctx_ref)
