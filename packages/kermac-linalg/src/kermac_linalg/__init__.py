"""kermac.linalg: batched solves and eigensolvers on cuSOLVER without host synchronisation.

Every operation takes float32/float64 matrices `A [..., N, N]` (right-hand sides `B [..., N, K]`)
on a CUDA device, where it calls cuSOLVER through nvmath-python (imported on first use), or on
the CPU, where it calls `torch.linalg` with the same semantics. Each returns a per-batch-entry
int32 status tensor `info` on the inputs' device instead of raising: a failed entry is NaN and
leaves the others valid; an entry whose input holds a NaN or an infinity where the operation
reads it fails with `info == NONFINITE_INPUT`; `check=True` synchronises and raises
[`LinalgError`][kermac_linalg.LinalgError] listing the failed entries. Batches run one cuSOLVER call per entry on a
bounded pool of streams ([`set_max_streams`][kermac_linalg.set_max_streams]) joined back to torch's current stream;
nothing else waits on the host.

* [`cholesky_solve`][kermac_linalg.cholesky_solve], [`solve`][kermac_linalg.solve] solve `A X = B` (Cholesky for SPD A,
  LU otherwise);
* [`cholesky`][kermac_linalg.cholesky] factors `A = L Lᵀ`;
* [`eigh`][kermac_linalg.eigh] and [`eigh_range`][kermac_linalg.eigh_range] compute all eigenpairs or those in an
  index/value range;
* [`workspace_size`][kermac_linalg.workspace_size] reports what a call allocates;
* [`eigh_multi_gpu`][kermac_linalg.eigh_multi_gpu] decomposes one large matrix on several GPUs (cusolverMg; this one
  waits on the host), [`eigh_multi_gpu_workspace`][kermac_linalg.eigh_multi_gpu_workspace] reports its memory per
  device.
"""

from __future__ import annotations

from ._cholesky import cholesky, cholesky_solve
from ._dispatch import max_streams, set_max_streams
from ._eigh import eigh, eigh_range
from ._eigh_mg import MultiGpuWorkspace, eigh_multi_gpu, eigh_multi_gpu_workspace
from ._lu import solve
from ._status import NONFINITE_INPUT, LinalgError
from ._workspace import WorkspaceSize, workspace_size

__all__ = [
    "NONFINITE_INPUT",
    "LinalgError",
    "MultiGpuWorkspace",
    "WorkspaceSize",
    "cholesky",
    "cholesky_solve",
    "eigh",
    "eigh_multi_gpu",
    "eigh_multi_gpu_workspace",
    "eigh_range",
    "max_streams",
    "set_max_streams",
    "solve",
    "workspace_size",
]
