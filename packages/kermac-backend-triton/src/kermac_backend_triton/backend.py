"""The `triton` backend: every pairwise and gradient program compiled from core's IR by Triton.

Available where triton imports and a CUDA GPU of compute capability ≥ 8.0 is visible, or where
`TRITON_INTERPRET=1` is set: then kernels run in Triton's CPU interpreter (for tests), CPU
tensors are accepted, and the backend ranks below the reference backend so `auto` never picks
the slow interpreter.  Inputs may be float32, float16, bfloat16 (computed in float32) or float64.
Besides the pairwise and gradient operations it computes the fused kernel product `K(x, z) @ v`
of every pairwise program (`check_product`, `product`; `kermac_backend_triton.product`) and its gradient in
the points, whatever the program's reduction over features (`check_product_grad`, `product_grad`;
`kermac_backend_triton.product_gradient`).
Its choices of kernel and autotuning are a `TritonTuning`
(`TritonBackend(tuning=...)`; the registered backend takes the defaults).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch

from kermac.backend import Availability, Backend
from kermac.problem import PairwiseProblem, ProductGradProblem, ProductProblem
from kermac_backend_triton.interpreter import interpreting
from kermac_backend_triton.tuning import DEFAULT_TUNING, TritonTuning

if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import ModuleType

    from kermac.problem import GradProblem

__all__ = ["MIN_CAPABILITY", "NARROW_PRODUCT_MAX_D", "TENSOR_CORE_PREFERENCE", "TritonBackend"]

MIN_CAPABILITY = (8, 0)
TENSOR_CORE_PREFERENCE = 25
"""`auto`'s fallback preference (used where no cost table decides, `kermac.costs`) for the float32
p = 2 family on Triton's tensor-core kernel: above NVRTC's priority, because it measured faster than
NVRTC's `mma.sync` kernel (docs/dev/triton-kernels.md), and for the products whose K tiles come from it,
which measured as fast as NVRTC's SIMT product or up to 1.8× faster (docs/dev/triton-product.md).
Also for float32 products on SIMT K tiles with at most `NARROW_PRODUCT_MAX_D` features.  Everything else
keeps the priority (10).
"""
NARROW_PRODUCT_MAX_D = 32
"""The most features for which a float32 kernel product on Triton's SIMT K tiles is preferred to NVRTC's: its
one-column path and its tiles measured faster than NVRTC's SIMT product at D = 3 and 32 for one and sixteen
columns, and slower at D = 128 (docs/dev/triton-product.md)."""


@functools.cache
def _launch() -> ModuleType:
    """`kermac_backend_triton.launch`, imported by the first method that needs it: it imports Triton and its Gluon
    dialect, which loading the backend (plugin discovery, a call that names another backend) does not pay for."""
    from kermac_backend_triton import launch

    return launch


@functools.cache
def _too_old(index: int) -> str | None:
    """Why CUDA device `index` cannot run Triton's compiled kernels, or `None` (asked once per device)."""
    cc = torch.cuda.get_device_capability(index)
    if cc < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(index)
        return f"{name} (cuda:{index}) has compute capability {cc[0]}.{cc[1]}; Triton needs 8.0 or newer"
    return None


class TritonBackend(Backend):
    """Triton kernels generated per semiring program; autotuned tiles keyed on the shape."""

    name = "triton"
    description = "Triton kernels generated from kermac's IR (CUDA sm_80+; the CPU interpreter with TRITON_INTERPRET=1)"

    def __init__(self, tuning: TritonTuning = DEFAULT_TUNING) -> None:
        if not isinstance(tuning, TritonTuning):
            raise TypeError(f"tuning: expected a TritonTuning, got {type(tuning).__name__}")
        self.tuning = tuning

    @property
    def priority(self) -> int:  # type: ignore[override]
        """10 on a GPU (below NVRTC's, above the reference); −10 under the interpreter."""
        return -10 if interpreting() else 10

    def availability(self) -> Availability:
        try:
            import triton
        except Exception as exc:
            return Availability.no(f"triton is not importable ({type(exc).__name__}: {exc}); pip install triton")
        if interpreting():
            return Availability.yes(f"{triton.__version__} (interpreter, TRITON_INTERPRET=1)")
        import torch

        if not torch.cuda.is_available():
            return Availability.no("no CUDA GPU is visible to torch (TRITON_INTERPRET=1 runs the kernels on the CPU)")
        best = max(torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count()))
        if best < MIN_CAPABILITY:
            name = torch.cuda.get_device_name()
            return Availability.no(f"{name} has compute capability {best[0]}.{best[1]}; Triton needs 8.0 or newer")
        return Availability.yes(triton.__version__)

    def _check_device(self, device) -> str | None:
        if device.type == "cuda":
            old = _too_old(device.index)
            return None if old is None or interpreting() else old  # the interpreter runs on any device
        if device.type == "cpu" and interpreting():
            return None
        return f"the Triton backend runs CUDA tensors (CPU ones under TRITON_INTERPRET=1); got tensors on {device}"

    def check_pairwise(self, problem: PairwiseProblem) -> str | None:
        return self._check_device(problem.device) or _launch().grid_size_problem(problem)

    def check_grad(self, problem: GradProblem) -> str | None:
        """As `check_pairwise`; the grid is that of the kernel this backend's tuning chooses (the affine
        gradient's tiles where `grad_tensor_cores` is on)."""
        return self._check_device(problem.device) or _launch().grid_size_problem(problem, self.tuning)

    def check_general_grad(self, problem: GradProblem) -> str | None:
        """As `check_grad`: the general gradient kernel runs every program in the general form."""
        return self.check_grad(problem)

    def check_product(self, problem: ProductProblem) -> str | None:
        """`None` if `product` can run `problem` (every pairwise program, reduction and dtype is
        supported), else why not: the device, or a launch grid beyond CUDA's limit."""
        return self._check_device(problem.device) or _launch().grid_size_problem(problem)

    def check_product_grad(self, problem: ProductGradProblem) -> str | None:
        """`None` if `product_grad` can run `problem` (every pairwise program, reduction and dtype is supported),
        else why not: the device, or a launch grid beyond CUDA's limit."""
        return self._check_device(problem.device) or _launch().grid_size_problem(problem)

    def preference(self, problem: PairwiseProblem | GradProblem | ProductProblem | ProductGradProblem) -> int:
        """`TENSOR_CORE_PREFERENCE` where a pairwise or product problem runs on a tensor-core kernel on a GPU, or
        a float32 product has at most `NARROW_PRODUCT_MAX_D` features, else the priority."""
        if isinstance(problem, PairwiseProblem):
            preferred = _launch().pairwise_kernel(problem, self.tuning) == "tensor_cores"
        elif isinstance(problem, ProductProblem):
            narrow = problem.x.dtype == torch.float32 and problem.sizes[2] <= NARROW_PRODUCT_MAX_D
            preferred = narrow or _launch().product_kernel(problem, self.tuning) == "tensor_cores"
        else:
            preferred = False
        if preferred and not interpreting():
            return TENSOR_CORE_PREFERENCE
        return self.priority

    def pairwise(self, problem: PairwiseProblem) -> None:
        _launch().run_pairwise(problem, tuning=self.tuning)

    def precompile(
        self, problems: list[PairwiseProblem | GradProblem], *, archs: Sequence[str] | None = None
    ) -> list[str]:
        """Compile into Triton's cache the kernels the first launches of `problems` (pairwise and gradient) would
        compile, every configuration the autotuner would try (`kermac_backend_triton.precompile`).

        `archs` (e.g. `["sm_90"]`) are the targets; by default each problem's CUDA device (problems on the
        `meta` device, as `kermac precompile` builds without a GPU, then need `archs`).  A later first call
        compiles nothing where its kernels are these: the same program, dtype, batch layout and per-batch
        hyperparameters, the same operand alignment and sizes and strides that are multiples of 16 where these
        are, on the same side of the kernels' feature thresholds (8; the tensor-core space's 64) and, for a
        gradient, the same block of outputs (`BO`), with the same Triton, cache directory and cache-invalidating
        environment variables; it then autotunes on the compiled configurations.  Returns one line per distinct
        kernel, dtype and architecture; nothing under the interpreter.
        """
        from kermac_backend_triton.precompile import precompile

        return precompile(problems, archs=archs, tuning=self.tuning)

    def grad(self, problem: GradProblem) -> None:
        _launch().run_grad(problem, tuning=self.tuning)

    def general_grad(self, problem: GradProblem) -> None:
        _launch().run_grad(problem, tuning=self.tuning)

    def product(self, problem: ProductProblem) -> None:
        """`problem.out[*B, M, C] = K[*B, M, N] @ v[*B, N, C]` with K the pairwise program's matrix,
        computed tile by tile and never stored (`kermac_backend_triton.product`), on the current stream."""
        _launch().run_product(problem, tuning=self.tuning)

    def product_grad(self, problem: ProductGradProblem) -> None:
        """`problem.out[*B, M, D]`, the gradient in x of `Σ g·(K v)` (`kermac.problem.ProductGradProblem`), with K
        and its derivative computed tile by tile and never stored (`kermac_backend_triton.product_gradient`), on
        the current stream.  Its one workspace: a float32 tensor of `out`'s shape where `out` is float16 or bfloat16
        and D exceeds the features held in registers (`kermac_backend_triton.launch.run_product_grad`)."""
        _launch().run_product_grad(problem, tuning=self.tuning)
