"""cusolverMg through ctypes: the multi-GPU symmetric eigensolver `cusolverMgSyevd`.

nvmath-python binds cusolverDn but not cusolverMg, so this module loads `libcusolverMg` (shipped
in the nvidia-cusolver wheel) through cuda-pathfinder and declares the few entry points it needs.
Every call here is synchronous: cusolverMg takes host eigenvalue and status buffers and returns
when the devices are done.

cusolverMg's handle has a known defect: a second `cusolverMgSyevd` in the same CUDA context can
fail or return garbage, even with a fresh handle (see seed 003 of the project).  Callers that need
more than one call per process run each call in a fresh process (`._mg_worker`).
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass

import torch

__all__ = ["MgResult", "library", "query", "syevd"]

# Enum values from cusolverMg.h, cublas_api.h, cusolver_common.h and library_types.h.
_GRID_MAPPING_COL_MAJOR = 0
_FILL_LOWER = 0  # cusolverMgSyevd accepts only the lower triangle (INVALID_VALUE otherwise)
_EIG_MODE_VECTOR = 1
_DATA_TYPES = {torch.float32: 0, torch.float64: 1}  # CUDA_R_32F, CUDA_R_64F
_STATUS = {
    0: "CUSOLVER_STATUS_SUCCESS",
    1: "CUSOLVER_STATUS_NOT_INITIALIZED",
    2: "CUSOLVER_STATUS_ALLOC_FAILED",
    3: "CUSOLVER_STATUS_INVALID_VALUE",
    4: "CUSOLVER_STATUS_ARCH_MISMATCH",
    5: "CUSOLVER_STATUS_MAPPING_ERROR",
    6: "CUSOLVER_STATUS_EXECUTION_FAILED",
    7: "CUSOLVER_STATUS_INTERNAL_ERROR",
    8: "CUSOLVER_STATUS_MATRIX_TYPE_NOT_SUPPORTED",
    9: "CUSOLVER_STATUS_NOT_SUPPORTED",
}

_lib: ctypes.CDLL | None = None
_lock = threading.Lock()
_vp = ctypes.c_void_p


def library() -> ctypes.CDLL:
    """`libcusolverMg` with the prototypes declared (loaded once)."""
    global _lib
    if _lib is None:
        with _lock:
            if _lib is None:
                _lib = _load()
    return _lib


def _load() -> ctypes.CDLL:
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib
    except ImportError as err:  # pragma: no cover - a dependency of kermac-linalg
        raise ImportError("multi-GPU eigh needs cuda-pathfinder to find libcusolverMg") from err
    try:
        lib = ctypes.CDLL(load_nvidia_dynamic_lib("cusolverMg").abs_path)
    except Exception as err:
        raise ImportError(
            "multi-GPU eigh needs libcusolverMg from the nvidia-cusolver wheel "
            f"(install kermac-linalg with its [cu13] or [cu12] extra, docs/installation.md): {err}"
        ) from err
    i32, i64 = ctypes.c_int32, ctypes.c_int64
    arr = ctypes.POINTER(_vp)
    signatures = {
        "cusolverMgCreate": [ctypes.POINTER(_vp)],
        "cusolverMgDestroy": [_vp],
        "cusolverMgDeviceSelect": [_vp, ctypes.c_int, ctypes.POINTER(ctypes.c_int)],
        "cusolverMgCreateDeviceGrid": [ctypes.POINTER(_vp), i32, i32, ctypes.POINTER(i32), ctypes.c_int],
        "cusolverMgDestroyGrid": [_vp],
        "cusolverMgCreateMatrixDesc": [ctypes.POINTER(_vp), i64, i64, i64, i64, ctypes.c_int, _vp],
        "cusolverMgDestroyMatrixDesc": [_vp],
        "cusolverMgSyevd_bufferSize": [
            *(_vp, ctypes.c_int, ctypes.c_int, ctypes.c_int, arr, ctypes.c_int, ctypes.c_int, _vp),
            *(_vp, ctypes.c_int, ctypes.c_int, ctypes.POINTER(i64)),
        ],
        "cusolverMgSyevd": [
            *(_vp, ctypes.c_int, ctypes.c_int, ctypes.c_int, arr, ctypes.c_int, ctypes.c_int, _vp),
            *(_vp, ctypes.c_int, ctypes.c_int, arr, i64, ctypes.POINTER(ctypes.c_int)),
        ],
    }
    for name, argtypes in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int
    return lib


def _check(call: str, status: int) -> None:
    if status != 0:
        raise RuntimeError(f"{call} failed with {_STATUS.get(status, 'status')} ({status})")


@dataclass(frozen=True)
class MgResult:
    """What one `cusolverMgSyevd` returned: eigenvalues (host), status and workspace size."""

    eigenvalues: torch.Tensor
    info: int
    workspace_elements: int


class _Session:
    """A cusolverMg handle, device grid and matrix descriptor, destroyed on exit."""

    def __init__(self, device_ids: list[int], n: int, block: int, dtype: torch.dtype):
        self.lib = library()
        self.handle, self.grid, self.desc = _vp(), _vp(), _vp()
        ids = (ctypes.c_int * len(device_ids))(*device_ids)
        ids32 = (ctypes.c_int32 * len(device_ids))(*device_ids)
        _check("cusolverMgCreate", self.lib.cusolverMgCreate(ctypes.byref(self.handle)))
        try:
            _check("cusolverMgDeviceSelect", self.lib.cusolverMgDeviceSelect(self.handle, len(device_ids), ids))
            _check(
                "cusolverMgCreateDeviceGrid",
                self.lib.cusolverMgCreateDeviceGrid(
                    ctypes.byref(self.grid), 1, len(device_ids), ids32, _GRID_MAPPING_COL_MAJOR
                ),
            )
            _check(
                "cusolverMgCreateMatrixDesc",
                self.lib.cusolverMgCreateMatrixDesc(
                    ctypes.byref(self.desc), n, n, n, block, _DATA_TYPES[dtype], self.grid
                ),
            )
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.desc:
            self.lib.cusolverMgDestroyMatrixDesc(self.desc)
            self.desc = _vp()
        if self.grid:
            self.lib.cusolverMgDestroyGrid(self.grid)
            self.grid = _vp()
        if self.handle:
            self.lib.cusolverMgDestroy(self.handle)
            self.handle = _vp()

    def __enter__(self) -> _Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _pointers(tensors: list[torch.Tensor]) -> ctypes.Array:
    return (_vp * len(tensors))(*(t.data_ptr() for t in tensors))


def _enable_peer_access(device_ids: list[int]) -> None:
    """Let every selected device reach every other one's memory, as cusolverMg's samples do."""
    from cuda.bindings import runtime as cudart

    current = torch.cuda.current_device()
    try:
        for i in device_ids:
            for j in device_ids:
                err, can = cudart.cudaDeviceCanAccessPeer(i, j)
                if i == j or err != cudart.cudaError_t.cudaSuccess or not can:
                    continue
                cudart.cudaSetDevice(i)
                (err,) = cudart.cudaDeviceEnablePeerAccess(j, 0)
                if err != cudart.cudaError_t.cudaSuccess:
                    cudart.cudaGetLastError()  # already enabled: clear the error so it is not reported later
    finally:
        torch.cuda.set_device(current)


def _synchronize(device_ids: list[int]) -> None:
    for g in device_ids:
        torch.cuda.synchronize(g)


def query(device_ids: list[int], local: list[torch.Tensor], n: int, block: int) -> MgResult:
    """`cusolverMgSyevd_bufferSize` alone: the workspace elements (of the matrix dtype) per device.

    `local` are the devices' arrays as for `syevd`; only their addresses are passed. The
    result's eigenvalues are NaN.
    """
    return _run(device_ids, local, n, block, solve=False)


def syevd(device_ids: list[int], local: list[torch.Tensor], n: int, block: int) -> MgResult:
    """Eigen-decompose the block-cyclic matrix held in `local` (one tensor per device) in place.

    `local[g]` is device `device_ids[g]`'s `[rows, n]` row-major array (see
    `BlockCyclic`); cuSOLVER reads the lower triangle of the
    column-major matrix they form and overwrites it with eigenvectors, one per column.  Allocates the
    workspace on each device, waits for the devices, and returns the eigenvalues on the host.
    """
    return _run(device_ids, local, n, block, solve=True)


def _run(device_ids: list[int], local: list[torch.Tensor], n: int, block: int, *, solve: bool) -> MgResult:
    dtype = local[0].dtype
    eigenvalues = torch.full((n,), float("nan"), dtype=dtype)
    info, lwork = ctypes.c_int(0), ctypes.c_int64(0)
    if solve:
        _synchronize(device_ids)
        _enable_peer_access(device_ids)
    with _Session(device_ids, n, block, dtype) as s:
        head = (s.handle, _EIG_MODE_VECTOR, _FILL_LOWER, n, _pointers(local), 1, 1, s.desc)
        tail = (_vp(eigenvalues.data_ptr()), _DATA_TYPES[dtype], _DATA_TYPES[dtype])
        _check("cusolverMgSyevd_bufferSize", s.lib.cusolverMgSyevd_bufferSize(*head, *tail, ctypes.byref(lwork)))
        if solve:
            work = [torch.empty(max(1, lwork.value), dtype=dtype, device=g) for g in device_ids]
            _synchronize(device_ids)
            _check(
                "cusolverMgSyevd",
                s.lib.cusolverMgSyevd(*head, *tail, _pointers(work), lwork.value, ctypes.byref(info)),
            )
            _synchronize(device_ids)
    return MgResult(eigenvalues, int(info.value), int(lwork.value))
