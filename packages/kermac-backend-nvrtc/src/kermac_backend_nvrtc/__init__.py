"""kermac's NVRTC backend: CUDA C++ kernels generated from core's expression IR, compiled at run time.

Every kermac operation (pairwise distances, fused kernel matrices, the gradient contraction, the fused
kernel product K @ v) is lowered by `kermac` into a small expression IR; this package turns it into
self-contained CUDA C++, compiles it with NVRTC through `cuda-core` for the GPU's architecture (sm_80 and
newer), stores the binaries in kermac's on-disk JIT cache and launches them on PyTorch's current
CUDA stream.  It registers itself with kermac through the `kermac.backends` entry-point group
and is selected with `backend="nvrtc"` (or by `auto`: the cost table of `kermac.costs`, then preference).

`NvrtcTuning` holds the backend's choices among equivalent kernels; `NvrtcBackend(tuning=...)`
builds a backend with other choices for A/B comparisons.
"""

from kermac_backend_nvrtc.backend import NvrtcBackend
from kermac_backend_nvrtc.tuning import DEFAULT_TUNING, NvrtcTuning

__all__ = ["DEFAULT_TUNING", "NvrtcBackend", "NvrtcTuning"]
