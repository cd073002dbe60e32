"""Multi-GPU symmetric eigendecomposition (cusolverMgSyevd) of one large matrix.

The matrix is dealt to the devices in column blocks (`._mg_layout`), decomposed in place by
cusolverMg (`._cusolvermg`) — by default in a fresh process (`._mg_worker`), because
cusolverMg cannot be called twice in one CUDA context — and the eigenvectors are gathered back.
"""

from __future__ import annotations

import logging
import numbers
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from . import _cusolvermg
from ._finite import nonfinite
from ._mg_layout import BlockCyclic
from ._mg_worker import run_isolated
from ._status import finish, poison_failed, raise_for_info
from ._validate import DTYPES, check_flag, check_matrix, check_overwrite

logger = logging.getLogger("kermac.linalg")

__all__ = ["MultiGpuWorkspace", "eigh_multi_gpu", "eigh_multi_gpu_workspace"]

DEFAULT_BLOCK = 256

DeviceList = Sequence[int | str | torch.device] | None


def eigh_multi_gpu(
    A: torch.Tensor,
    *,
    devices: DeviceList = None,
    block_size: int = DEFAULT_BLOCK,
    isolate: bool = True,
    overwrite_a: bool = False,
    check: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """All eigenpairs `A = V diag(L) Vᵀ` of one symmetric matrix, computed on several GPUs.

    cuSOLVER's multi-GPU `cusolverMgSyevd`: the matrix is split into column blocks of
    `block_size` dealt to `devices` in turn (each device holds `≈ N²/G` elements plus its
    workspace, see [`eigh_multi_gpu_workspace`][kermac_linalg._eigh_mg.eigh_multi_gpu_workspace]), and the devices work
    together over NVLink or PCIe. Use it for matrices too large or too slow for [`eigh`][kermac_linalg.eigh] on one GPU.

    Unlike the other operations this one **waits on the host** (cusolverMg is synchronous and
    returns eigenvalues and status in host memory).

    Args:
        A: `[N, N]` float32/float64 on the CPU or any CUDA device (not necessarily one of
            `devices`); only the lower triangle is read, like `torch.linalg.eigh`.
        devices: CUDA devices to use (indices, `"cuda:1"` or `torch.device`), distinct; default
            every visible device. Only the first `ceil(N / block_size)` take part (each needs a
            block).
        block_size: columns per block of the block-cyclic distribution.
        isolate: run cusolverMg in a fresh child process (default). cusolverMg's handle cannot be
            reused within one CUDA context, and a second call in the same process can fail or
            return wrong results; `isolate=False` calls it in this process, which is safe for
            the first call of a process only. The child shares the matrix blocks with this
            process through CUDA IPC (no host copy); it costs about a second of start-up.
        overwrite_a: write the eigenvectors into A's memory (`V` is then `A.mT`) when A is
            contiguous, saving an `N²` output allocation; otherwise A is untouched. Refused
            (ValueError) for an A that requires grad.
        check: raise [`LinalgError`][kermac_linalg.LinalgError] if the solver did not converge or A's
            lower triangle is not finite.

    Returns:
        `(L, V, info)` on A's device: eigenvalues `L [N]` ascending, orthonormal eigenvectors
        in the columns of `V [N, N]` (column-major, like `torch.linalg.eigh`), and `info`,
        a 0-d int32 status (non-zero: L and V are NaN; `i > 0`: not converged,
        `NONFINITE_INPUT`: A's lower triangle holds a NaN or an infinity, found before
        cusolverMg is called, which then is not).
    """
    n = check_matrix("A", A)
    if A.dim() != 2:
        raise ValueError(f"A must be one matrix [N, N] for eigh_multi_gpu, got shape {tuple(A.shape)}")
    check_flag("isolate", isolate)
    check_overwrite("overwrite_a", overwrite_a, "A", A)
    check_flag("check", check)
    ids, layout = _distribution(n, devices, block_size)
    W = torch.empty(n, dtype=A.dtype, device=A.device)
    vt = A if overwrite_a and A.is_contiguous() else torch.empty((n, n), dtype=A.dtype, device=A.device)
    if n == 0:
        return W, vt.mT, torch.zeros((), dtype=torch.int32, device=A.device)
    bad = nonfinite(A, lower=True)
    if bad.item():  # this call waits on the host anyway: cusolverMg is never given NaN or inf
        return W, vt.mT, finish("eigh", torch.zeros((), dtype=torch.int32, device=A.device), bad, (W, vt.mT), check)
    local = _local_arrays(layout, ids, A.dtype)
    layout.scatter(A.mT, local)  # columns of A, so that cuSOLVER reads A's lower triangle
    _synchronize(ids, A.device)
    start = time.perf_counter()
    result = _solve(ids, local, layout, isolate=isolate, solve=True)
    elapsed = time.perf_counter() - start
    layout.gather(local, vt)
    del local
    W.copy_(result.eigenvalues)
    info = torch.full((), result.info, dtype=torch.int32).to(A.device)
    V = vt.mT
    poison_failed(info, W, V)
    _synchronize(ids, A.device)
    logger.debug(
        "eigh_multi_gpu: N=%d %s on devices %s, block %d, isolate=%s: %.3f s; per device %s",
        *(n, A.dtype, ids, layout.block, isolate, elapsed),
        _describe(layout, ids, result.workspace_elements * A.element_size(), A.element_size()),
    )
    if check:
        raise_for_info("eigh", info)
    return W, V, info


@dataclass(frozen=True)
class MultiGpuWorkspace:
    """Device memory one [`eigh_multi_gpu`][kermac_linalg._eigh_mg.eigh_multi_gpu] call allocates, per device.

    Attributes:
        devices: the device indices taking part, in distribution order.
        block_size: columns per block.
        matrix_bytes: bytes of each device's share of the matrix (whole blocks, padding included).
        workspace_bytes: cuSOLVER's workspace, the same on every device.
        total_bytes: `matrix_bytes[g] + workspace_bytes` for each device.
    """

    devices: tuple[int, ...]
    block_size: int
    matrix_bytes: tuple[int, ...]
    workspace_bytes: int

    @property
    def total_bytes(self) -> tuple[int, ...]:
        return tuple(m + self.workspace_bytes for m in self.matrix_bytes)


def eigh_multi_gpu_workspace(
    n: int,
    *,
    dtype: torch.dtype = torch.float32,
    devices: DeviceList = None,
    block_size: int = DEFAULT_BLOCK,
    isolate: bool = True,
) -> MultiGpuWorkspace:
    """What [`eigh_multi_gpu`][kermac_linalg._eigh_mg.eigh_multi_gpu] allocates per device for an `N × N` matrix (asks
    cusolverMg).

    The outputs (`L`, and `V` unless `overwrite_a`) and A itself come on top, on A's device.
    `isolate` as for [`eigh_multi_gpu`][kermac_linalg._eigh_mg.eigh_multi_gpu] (the query creates a cusolverMg handle
    too).
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    if dtype not in DTYPES:
        raise TypeError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    check_flag("isolate", isolate)
    ids, layout = _distribution(int(n), devices, block_size)
    probes = [torch.empty(1, int(n), dtype=dtype, device=g) for g in ids]  # addresses only
    _synchronize(ids, None)
    lwork = _solve(ids, probes, layout, isolate=isolate, solve=False).workspace_elements
    itemsize = probes[0].element_size()
    matrix = tuple(layout.local_rows(g) * int(n) * itemsize for g in range(len(ids)))
    return MultiGpuWorkspace(tuple(ids), layout.block, matrix, lwork * itemsize)


def _distribution(n: int, devices: DeviceList, block_size: object) -> tuple[list[int], BlockCyclic]:
    """The devices that get at least one block (the first `ceil(n / block)`) and their layout."""
    ids = _device_ids(devices)
    block = _block_size(block_size)
    ids = ids[: max(1, -(-n // block))]
    return ids, BlockCyclic(n, block, len(ids))


def _solve(
    ids: list[int], local: list[torch.Tensor], layout: BlockCyclic, *, isolate: bool, solve: bool
) -> _cusolvermg.MgResult:
    if isolate:
        return run_isolated(ids, local, layout.n, layout.block, solve=solve)
    op = _cusolvermg.syevd if solve else _cusolvermg.query
    return op(ids, local, layout.n, layout.block)


def _local_arrays(layout: BlockCyclic, ids: list[int], dtype: torch.dtype) -> list[torch.Tensor]:
    return [torch.empty((layout.local_rows(g), layout.n), dtype=dtype, device=d) for g, d in enumerate(ids)]


def _synchronize(ids: list[int], extra: torch.device | None) -> None:
    for g in ids:
        torch.cuda.synchronize(g)
    if extra is not None and extra.type == "cuda" and extra.index not in ids:
        torch.cuda.synchronize(extra)


def _describe(layout: BlockCyclic, ids: list[int], workspace: int, itemsize: int) -> str:
    mib = 1 << 20
    shares = [layout.local_rows(g) * layout.n * itemsize / mib for g in range(len(ids))]
    parts = zip(ids, shares, strict=True)
    return ", ".join(f"cuda:{d} {m:.1f} MiB matrix + {workspace / mib:.1f} MiB workspace" for d, m in parts)


def _device_ids(devices: DeviceList) -> list[int]:
    """Distinct CUDA device indices from `devices` (default: all visible)."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise RuntimeError("eigh_multi_gpu needs CUDA devices, but torch sees none (torch.cuda.device_count() == 0)")
    if devices is None:
        return list(range(count))
    if isinstance(devices, (str, torch.device, numbers.Integral)):
        raise TypeError(f"devices must be a sequence of CUDA devices, got {devices!r}; wrap one device in a list")
    ids = []
    for d in devices:
        dev = torch.device("cuda", d) if isinstance(d, numbers.Integral) and not isinstance(d, bool) else d
        try:
            dev = torch.device(dev)
        except (TypeError, RuntimeError) as err:
            raise TypeError(f"devices must hold CUDA device indices or names, got {d!r}") from err
        if dev.type != "cuda":
            raise ValueError(f"devices must be CUDA devices, got {dev}")
        index = torch.cuda.current_device() if dev.index is None else dev.index
        if not 0 <= index < count:
            raise ValueError(f"devices: cuda:{index} does not exist ({count} visible CUDA devices)")
        ids.append(index)
    if not ids:
        raise ValueError("devices must name at least one CUDA device, got an empty sequence")
    if len(set(ids)) != len(ids):
        raise ValueError(f"devices must be distinct, got {ids}")
    return ids


def _block_size(block_size: object) -> int:
    if isinstance(block_size, bool) or not isinstance(block_size, numbers.Integral) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    return int(block_size)
