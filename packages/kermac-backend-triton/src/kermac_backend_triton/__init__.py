"""kermac's Triton backend: the fused kernel-machine operations written as Triton kernels.

It implements the operations that `kermac` lowers into its expression IR (pairwise
distances, fused kernel matrices, the gradient contraction) with Triton, compiled by Triton's own
JIT for the GPU in use and launched on PyTorch's current CUDA stream.  It registers itself with
kermac through the `kermac.backends` entry-point group and is selected with
`backend="triton"` (or by `auto`: the cost table of `kermac.costs`, then preference).  Without a
GPU, its kernels run under `TRITON_INTERPRET=1` for testing.
"""
