"""kermac: fused GPU kernels for kernel machines, for PyTorch.

Pairwise p-norm distances ([`cdist`][kermac.cdist]), fused kernel matrices ([`run_kernel`][kermac.run_kernel] with a
[`KernelDescriptor`][kermac.KernelDescriptor] or a preset), the gradient contraction behind AGOP
([`cdist_grad`][kermac.cdist_grad]), semiring programs written in [`kermac.ir`][kermac.ir]
([`run_program`][kermac.run_program]) or traced from Python functions ([`program`][kermac.dsl.program], with a zoo
of ready ones in [`kermac.zoo`][kermac.zoo]), fused kernel products that never materialise the kernel matrix
([`kernel_product`][kermac.kernel_product], [`program_product`][kermac.program_product],
[`KernelOperator`][kermac.KernelOperator], the gradient of a kernel predictor at many points
[`predictor_gradient`][kermac.predictor_gradient], and sharded over several GPUs
[`kermac.distributed`][kermac.distributed]), solvers of `(K + λI) α = y` ([`kermac.solvers`][kermac.solvers]) and
scikit-learn-style estimators ([`kermac.models`][kermac.models]), and cuSOLVER linear algebra
([`kermac.linalg`][kermac_linalg], from the `kermac-linalg` package).

Importing kermac is cheap: backends (NVRTC, Triton) load their heavy modules on first use.
"""

from __future__ import annotations

from typing import Any

from kermac import autograd as _autograd  # noqa: F401 (registers the backward of kermac's torch.library operations)
from kermac import dsl, ir, presets
from kermac._version import __version__
from kermac.api import (
    backends,
    cdist,
    cdist_grad,
    kernel_product,
    program_product,
    run_grad_program,
    run_kernel,
    run_program,
)
from kermac.descriptor import KernelDescriptor
from kermac.dsl import gradient_program, program
from kermac.errors import BackendError, BackendUnavailableError, UnsupportedProblemError
from kermac.operator import KernelOperator
from kermac.predictor import predictor_gradient
from kermac.programs import GradProgram, PairwiseProgram

__all__ = [
    "BackendError",
    "BackendUnavailableError",
    "GradProgram",
    "KernelDescriptor",
    "KernelOperator",
    "PairwiseProgram",
    "UnsupportedProblemError",
    "__version__",
    "backends",
    "cdist",
    "cdist_grad",
    "distributed",
    "dsl",
    "gradient_program",
    "ir",
    "kernel_product",
    "linalg",
    "models",
    "predictor_gradient",
    "presets",
    "program",
    "program_product",
    "run_grad_program",
    "run_kernel",
    "run_program",
    "solvers",
    "zoo",
]


def __getattr__(name: str) -> Any:
    if name in ("distributed", "solvers", "models", "zoo"):  # imported when used, not with kermac (import stays cheap)
        import importlib

        return importlib.import_module(f"kermac.{name}")
    if name == "linalg":
        import importlib

        try:
            return importlib.import_module("kermac.linalg")
        except ImportError as exc:
            raise AttributeError(str(exc)) from exc
    raise AttributeError(f"module 'kermac' has no attribute {name!r}")
