"""cuSOLVER through nvmath-python, imported on first GPU use, and per-thread solver slots.

A `Slot` is one CUDA stream of a device with a cusolverDn handle (and default params)
bound to it for its whole life; the handle is never switched to another stream, so no two
streams ever share a handle's internal state. Slots belong to the thread that created them
(cusolverDn handles are not safe to use from two threads at once) and to one device.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from types import SimpleNamespace

import torch

__all__ = ["Slot", "api", "data_type", "lower_uplo", "query", "thread_slots"]

_api: SimpleNamespace | None = None
_api_lock = threading.Lock()


def api() -> SimpleNamespace:
    """The cusolverDn bindings and the enum values the operations need (imported once)."""
    global _api
    if _api is None:
        with _api_lock:
            if _api is None:
                _api = _load()
    return _api


def _load() -> SimpleNamespace:
    try:
        import nvmath
        from nvmath.bindings import cublas, cusolver, cusolverDn
    except ImportError as err:
        raise ImportError(
            "kermac_linalg needs nvmath-python for CUDA tensors "
            "(install kermac-linalg with its [cu13] or [cu12] extra, docs/installation.md); "
            "CPU tensors work without it"
        ) from err
    return SimpleNamespace(
        dn=cusolverDn,
        dtypes={
            torch.float32: int(nvmath.CudaDataType.CUDA_R_32F),
            torch.float64: int(nvmath.CudaDataType.CUDA_R_64F),
        },
        lower=int(cublas.FillMode.LOWER),
        upper=int(cublas.FillMode.UPPER),
        no_trans=int(cublas.Operation.N),
        trans=int(cublas.Operation.T),
        vectors=int(cusolver.EigMode.VECTOR),
        range_index=int(cusolver.EigRange.I),
        range_value=int(cusolver.EigRange.V),
    )


def data_type(dtype: torch.dtype) -> int:
    """cudaDataType of a float32/float64 torch dtype."""
    return api().dtypes[dtype]


def lower_uplo(transposed: bool) -> int:
    """The cuSOLVER fill mode that reads torch's lower triangle of a matrix entry.

    cuSOLVER sees a row-major (`transposed`) entry as its transpose, whose upper triangle is
    torch's lower one.
    """
    return api().upper if transposed else api().lower


class Slot:
    """A stream of `device` with a cusolverDn handle and params bound to it, plus host workspace."""

    def __init__(self, device: torch.device):
        dn = api().dn
        self.device = device
        self.stream = torch.cuda.Stream(device=device)
        with torch.cuda.device(device):
            self.handle = dn.create()
            dn.set_stream(self.handle, self.stream.cuda_stream)
            self.params = dn.create_params()
        self._host = torch.empty(0, dtype=torch.uint8)

    def host_workspace(self, nbytes: int) -> int:
        """Pointer to at least `nbytes` of host workspace owned by this slot (0 if none needed).

        Kept across calls: work queued on the slot's stream may still use it, and the next user
        of the same slot is ordered after that work by the stream.
        """
        if nbytes == 0:
            return 0
        if self._host.numel() < nbytes:
            self._host = torch.empty(nbytes, dtype=torch.uint8)
        return self._host.data_ptr()

    def __del__(self) -> None:
        if sys.is_finalizing() or _api is None:
            return
        try:
            with torch.cuda.device(self.device):
                _api.dn.destroy_params(self.params)
                _api.dn.destroy(self.handle)
        except Exception:
            pass


_local = threading.local()


def thread_slots(device: torch.device, count: int) -> list[Slot]:
    """The first `count` slots of this thread on `device`, created on first use."""
    per_device = getattr(_local, "slots", None)
    if per_device is None:
        per_device = _local.slots = {}
    slots = per_device.setdefault(device.index, [])
    while len(slots) < count:
        slots.append(Slot(device))
    return slots[:count]


def query(device: torch.device, ask: Callable[[int, int], tuple[int, int]]) -> tuple[int, int]:
    """Run a `*_buffer_size` query `ask(handle, params)` on this thread's first slot of `device`.

    Returns `(device_bytes, host_bytes)`.
    """
    with torch.cuda.device(device):
        slot = thread_slots(device, 1)[0]
        device_bytes, host_bytes = ask(slot.handle, slot.params)
    return int(device_bytes), int(host_bytes)
