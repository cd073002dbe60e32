"""kermac's NVRTC backend: CUDA C++ kernels generated from core's expression IR, compiled at run time.

Every kermac operation (pairwise distances, fused kernel matrices, the gradient contraction) is
lowered by :mod:`kermac` into a small expression IR; this package turns it into self-contained
CUDA C++, compiles it with NVRTC through ``cuda-core`` for the GPU's architecture (sm_80 and
newer), stores the binaries in kermac's on-disk JIT cache and launches them on PyTorch's current
CUDA stream.  It registers itself with kermac through the ``kermac.backends`` entry-point group
and is selected with ``backend="nvrtc"`` (or automatically, by priority).
"""
