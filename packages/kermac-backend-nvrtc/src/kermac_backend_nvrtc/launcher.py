"""Load cubins per device and launch kernels on PyTorch's current stream.

A cubin is loaded once per (device, cache key) through `cuda.core`; kernels are looked up by
name.  A launch packs the arguments into one buffer laid out as the kernel's parameter list
(each value at its C type's natural alignment: pointers and `long long` 8 bytes, `int` 4,
`km_t` the compute type) and hands it to the driver's `cuLaunchKernel` directly (`extra`
form).  That costs a few microseconds on the host where `cuda.core.launch`'s per-argument
conversion cost tens.  Launching never synchronises.
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

__all__ = ["LoadedKernel", "argument_layout", "launch", "load_kernel"]

_lock = threading.Lock()
_kernels: dict[tuple[int, str, str], LoadedKernel] = {}

# cuLaunchKernel's `extra` markers (cuda.h).
_PARAM_BUFFER_POINTER = 1
_PARAM_BUFFER_SIZE = 2
_PARAM_END = 0


@dataclass(frozen=True)
class LoadedKernel:
    """A kernel loaded on one device with its parameter list and argument layout."""

    kernel: object  # cuda.core Kernel (keeps the module loaded)
    params: tuple[Param, ...]
    compute: str  # "float" or "double"
    device: int
    name: str
    resources: str  # registers, local (spill) memory and static shared memory per the driver
    function: int  # the CUfunction handle in the device's primary context
    context: int  # that context's handle
    packer: struct.Struct  # the argument buffer's layout, in parameter order
    buffer_size: ctypes.c_size_t  # packer.size, as cuLaunchKernel's `extra` reads it
    shmem: int = 0  # dynamic shared memory per block, bytes


def argument_layout(params: Sequence[Param], compute: str) -> struct.Struct:
    """The layout of a kernel's argument buffer: each parameter at its C type's natural alignment
    (pointers and `long long` as 8-byte integers, `int` 4, `km_t` as `compute`).

    Offsets count from the start of the buffer, which the driver copies to the start of the
    kernel's parameter space; that start is only 16-byte aligned (`c[0x0][0x210]` on sm_90), so
    a parameter aligned to more — a 64-byte `CUtensorMap` — would sit 48 bytes further in than
    this layout puts it.  Every type here aligns to 8 at most."""
    by_type = {"long long": "q", "int": "i", "km_t": "f" if compute == "float" else "d"}
    fmt, offset = "<", 0
    for p in params:
        code = "Q" if p.ctype.endswith("*") else by_type.get(p.ctype)
        if code is None:
            raise AssertionError(f"unknown parameter type {p.ctype!r} of {p.name}")
        size = struct.calcsize("<" + code)
        pad = -offset % size
        fmt += "x" * pad + code
        offset += pad + size
    return struct.Struct(fmt)


@cache
def _driver() -> dict[str, Callable[..., int]]:
    """ctypes entry points of the driver functions a launch uses (from the driver cuda.bindings loaded)."""
    from cuda.bindings import driver

    vp, uint = ctypes.c_void_p, ctypes.c_uint
    signatures = {
        "cuLaunchKernel": (vp, uint, uint, uint, uint, uint, uint, uint, vp, vp, vp),
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


def _check(result: int, what: str) -> None:
    if result:
        name = ctypes.c_char_p()
        _driver()["cuGetErrorName"](result, ctypes.byref(name))
        raise RuntimeError(f"{what} failed: {(name.value or b'CUDA error').decode()} ({result})")


def _allow_dynamic_smem(kernel: object, device: int, nbytes: int) -> None:
    """Raise `kernel`'s dynamic shared-memory limit to `nbytes` (above the default 48 KB)."""
    from cuda.bindings import driver

    attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    handle = kernel.handle
    if isinstance(handle, driver.CUkernel):
        (err,) = driver.cuKernelSetAttribute(attr, nbytes, handle, device)
    else:
        (err,) = driver.cuFuncSetAttribute(handle, attr, nbytes)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"could not allow {nbytes} bytes of dynamic shared memory on cuda:{device}: {err}")


def _function(kernel: object) -> int:
    """The CUfunction of a cuda.core kernel in the current context (a library kernel is resolved)."""
    from cuda.bindings import driver

    handle = kernel.handle
    if isinstance(handle, driver.CUkernel):
        err, handle = driver.cuKernelGetFunction(handle)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuKernelGetFunction failed: {err}")
    return int(handle)


def _current_context() -> int:
    ctx = ctypes.c_void_p()
    _check(_driver()["cuCtxGetCurrent"](ctypes.byref(ctx)), "cuCtxGetCurrent")
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
    from cuda.core import Device, ObjectCode

    with torch.cuda.device(device):
        Device(device).set_current()
        kernel = ObjectCode.from_cubin(cubin).get_kernel(name)
        if shmem > 48 * 1024:
            _allow_dynamic_smem(kernel, device, shmem)
        function, context = _function(kernel), _current_context()
    try:
        attrs = kernel.attributes
        resources = (
            f"{attrs.num_regs} registers, {attrs.local_size_bytes} bytes local memory, "
            f"{attrs.shared_size_bytes} bytes static shared memory"
        )
    except Exception as exc:  # attributes are diagnostics only
        resources = f"attributes unavailable: {exc}"
    packer = argument_layout(params, compute)
    loaded = LoadedKernel(
        kernel, tuple(params), compute, device, name, resources, function, context, packer,
        ctypes.c_size_t(packer.size), shmem,
    )  # fmt: skip
    logger.debug("nvrtc: loaded %s on cuda:%d: %s", name, device, resources)
    with _lock:
        _kernels[cache_id] = loaded
    return loaded


_current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
    lambda index: torch.cuda.current_stream(index).cuda_stream
)
"""The raw handle of a device's current stream (what torch.cuda.current_stream(i).cuda_stream
returns, without building a Stream object; Triton's launcher reads it the same way).
"""


def launch(k: LoadedKernel, grid: tuple[int, int, int], block: int, values: dict[str, int | float]) -> None:
    """Launch `k` on the current stream of its device with parameter `values` by name.

    The kernel runs in its device's primary context: where another context is current on this
    thread (another device's, or none yet), the kernel's is pushed for the launch and popped after."""
    data = k.packer.pack(*[values[p.name] for p in k.params])
    extra = (ctypes.c_void_p * 5)(
        _PARAM_BUFFER_POINTER, ctypes.cast(data, ctypes.c_void_p), _PARAM_BUFFER_SIZE,
        ctypes.addressof(k.buffer_size), _PARAM_END,
    )  # fmt: skip
    driver = _driver()
    pushed = _current_context() != k.context
    if pushed:
        _check(driver["cuCtxPushCurrent"](k.context), f"making cuda:{k.device}'s context current")
    try:
        stream = _current_stream(k.device)
        result = driver["cuLaunchKernel"](k.function, *grid, block, 1, 1, k.shmem, stream, None, extra)
        _check(result, f"launching {k.name} on cuda:{k.device}")
    finally:
        if pushed:
            driver["cuCtxPopCurrent"](ctypes.byref(ctypes.c_void_p()))
