"""Load cubins per device and launch kernels on PyTorch's current stream (``cuda.core``).

A cubin is loaded once per (device, cache key); kernels are looked up by name.  Arguments are
packed from Python values by each parameter's C type (pointers and ``long long`` as 64-bit
integers, ``int`` as 32-bit, ``km_t`` as the compute type).  Launching never synchronises.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from kermac.logs import logger
from kermac_backend_nvrtc.codegen import Param

__all__ = ["LoadedKernel", "launch", "load_kernel"]

_lock = threading.Lock()
_kernels: dict[tuple[int, str, str], LoadedKernel] = {}
_streams: dict[int, object] = {}


@dataclass(frozen=True)
class LoadedKernel:
    """A kernel loaded on one device with its parameter list."""

    kernel: object  # cuda.core Kernel
    params: tuple[Param, ...]
    compute: str  # "float" or "double"
    device: int
    name: str
    resources: str  # registers, local (spill) memory and static shared memory per the driver
    shmem: int = 0  # dynamic shared memory per block, bytes
    converters: tuple[tuple[str, type], ...] = ()  # (parameter name, its C type's constructor), in order


def _allow_dynamic_smem(kernel: object, device: int, nbytes: int) -> None:
    """Raise ``kernel``'s dynamic shared-memory limit to ``nbytes`` (above the default 48 KB)."""
    from cuda.bindings import driver

    attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    handle = kernel.handle
    if isinstance(handle, driver.CUkernel):
        (err,) = driver.cuKernelSetAttribute(attr, nbytes, handle, device)
    else:
        (err,) = driver.cuFuncSetAttribute(handle, attr, nbytes)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"could not allow {nbytes} bytes of dynamic shared memory on cuda:{device}: {err}")


def load_kernel(
    device: int, key: str, cubin: bytes, name: str, params: Sequence[Param], compute: str, shmem: int = 0
) -> LoadedKernel:
    """The kernel ``name`` of ``cubin`` on CUDA device ``device`` (loaded on first use), allowed
    ``shmem`` bytes of dynamic shared memory per block."""
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
    try:
        attrs = kernel.attributes
        resources = (
            f"{attrs.num_regs} registers, {attrs.local_size_bytes} bytes local memory, "
            f"{attrs.shared_size_bytes} bytes static shared memory"
        )
    except Exception as exc:  # attributes are diagnostics only
        resources = f"attributes unavailable: {exc}"
    loaded = LoadedKernel(kernel, tuple(params), compute, device, name, resources, shmem, _converters(params, compute))
    logger.debug("nvrtc: loaded %s on cuda:%d: %s", name, device, resources)
    with _lock:
        _kernels[cache_id] = loaded
    return loaded


def _stream(device: int) -> object:
    from cuda.core import Stream

    handle = torch.cuda.current_stream(device).cuda_stream
    stream = _streams.get(handle)
    if stream is None:
        stream = Stream.from_handle(handle)
        _streams[handle] = stream
    return stream


def _converters(params: Sequence[Param], compute: str) -> tuple[tuple[str, type], ...]:
    """(name, constructor of its C type) of each parameter: pointers and ``long long`` as 64-bit
    integers, ``int`` as 32-bit, ``km_t`` as the compute type."""
    by_type = {"long long": np.int64, "int": np.int32, "km_t": np.float32 if compute == "float" else np.float64}
    out = []
    for p in params:
        kind = np.uint64 if p.ctype.endswith("*") else by_type.get(p.ctype)
        if kind is None:
            raise AssertionError(f"unknown parameter type {p.ctype!r} of {p.name}")
        out.append((p.name, kind))
    return tuple(out)


def launch(k: LoadedKernel, grid: tuple[int, int, int], block: int, values: dict[str, int | float]) -> None:
    """Launch ``k`` on the current stream of its device with parameter ``values`` by name."""
    from cuda.core import LaunchConfig
    from cuda.core import launch as cuda_launch

    args = [kind(values[name]) for name, kind in k.converters]
    with torch.cuda.device(k.device):
        cuda_launch(_stream(k.device), LaunchConfig(grid=grid, block=block, shmem_size=k.shmem), k.kernel, *args)
