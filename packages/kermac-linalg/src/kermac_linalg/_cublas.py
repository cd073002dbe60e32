"""cuBLAS through nvmath-python: one handle per thread and device, and the typed calls linalg makes.

A handle is bound to torch's current stream each time `handle` hands it out (as torch does
with its own cuBLAS handle), so the calls queue behind the cuSOLVER work already joined back to
that stream.  cuBLAS requires the handle's device to be the current one at every call: each caller
makes its operands' device current around its calls (the caller's may be another).
Its math mode is cuBLAS's default: full float32/float64 products, never TF32.
"""

from __future__ import annotations

import functools
import sys
import threading
from types import SimpleNamespace

import torch

__all__ = ["calls", "handle", "transpose_copy"]

_local = threading.local()
_SCALARS = {dtype: torch.tensor([1.0, -1.0, 0.0], dtype=dtype) for dtype in (torch.float32, torch.float64)}


class _Handle:
    """A cuBLAS handle created on `device`; destroyed with the thread's handle table."""

    def __init__(self, device: torch.device):
        from nvmath.bindings import cublas

        self.device = device
        self._cublas = cublas
        with torch.cuda.device(device):
            self.value = cublas.create()

    def __del__(self) -> None:
        if sys.is_finalizing():
            return
        try:
            with torch.cuda.device(self.device):
                self._cublas.destroy(self.value)
        except Exception:
            pass


def handle(device: torch.device) -> int:
    """This thread's cuBLAS handle on `device`, bound to torch's current stream there."""
    from nvmath.bindings import cublas

    handles = getattr(_local, "handles", None)
    if handles is None:
        handles = _local.handles = {}
    holder = handles.get(device.index)
    if holder is None:
        holder = handles[device.index] = _Handle(device)
    cublas.set_stream(holder.value, torch.cuda.current_stream(device).cuda_stream)
    return holder.value


@functools.cache
def calls(dtype: torch.dtype) -> SimpleNamespace:
    """`dtype`'s cuBLAS routines and constants (built once per dtype).

    Fields: `gemm_batched`, `trsm_batched`, `geam` (cuBLAS's s* or d* routine); `one`,
    `minus_one`, `zero` (host pointers to scalars of `dtype`); the enum values `lower`,
    `upper`, `no_trans`, `trans`, `left`, `non_unit`, `unit`.
    """
    from nvmath.bindings import cublas

    prefix = "s" if dtype == torch.float32 else "d"
    scalars = _SCALARS[dtype]
    size = scalars.element_size()
    return SimpleNamespace(
        gemm_batched=getattr(cublas, f"{prefix}gemm_batched"),
        trsm_batched=getattr(cublas, f"{prefix}trsm_batched"),
        geam=getattr(cublas, f"{prefix}geam"),
        one=scalars.data_ptr(),
        minus_one=scalars.data_ptr() + size,
        zero=scalars.data_ptr() + 2 * size,
        lower=int(cublas.FillMode.LOWER),
        upper=int(cublas.FillMode.UPPER),
        no_trans=int(cublas.Operation.N),
        trans=int(cublas.Operation.T),
        left=int(cublas.SideMode.LEFT),
        non_unit=int(cublas.DiagType.NON_UNIT),
        unit=int(cublas.DiagType.UNIT),
    )


def transpose_copy(
    dst: list[int], src: list[int], rows: int, cols: int, ld_src: int, dtype: torch.dtype, device: torch.device
) -> None:
    """Copy row-major `rows × cols` matrices (row stride `ld_src`) into column-major ones (ld `rows`).

    One `geam` (`C = Aᵀ` of the column-major view) per matrix, on torch's current stream: cuBLAS's
    tiled transpose reads and writes coalesced, where a strided elementwise copy does not
    (docs/linalg.md has the measurement).
    """
    with torch.cuda.device(device):  # a cuBLAS call needs its handle's device current
        h, b = handle(device), calls(dtype)
        ld = max(1, rows)
        for d, s in zip(dst, src, strict=True):
            b.geam(h, b.trans, b.no_trans, rows, cols, b.one, s, ld_src, b.zero, d, ld, d, ld)
