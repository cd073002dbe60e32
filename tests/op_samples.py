"""One table of sample calls of kermac's `torch.library` operations, shared by every test that
iterates them (opcheck in ``test_ops.py``, ``torch.compile`` in ``test_compile.py``, CUDA graphs in
``test_cuda_graphs.py``), for any backend and device.

Each :class:`Sample` is one public call (``kermac.cdist``, ``run_kernel``, ``cdist_grad``,
``run_program``, ``run_grad_program``, ``kernel_product``, ``program_product``, and the gradient product
``kermac.ops.product_grad`` that the backward of the products calls) on fresh random inputs
whose sizes are not tile multiples, with broadcast batches, views and tensor hyperparameters among them;
:meth:`Sample.op_args` gives the arguments of the operation it lowers to, for ``torch.library.opcheck``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

import kermac
from kermac import ops, presets
from kermac.hyperparams import HyperValue
from kermac.lowering import cdist_program, grad_program
from kermac.programs import GradProgram, PairwiseProgram, swap_operands
from kermac.testing import HUBER_GRAD, SOFT_L1


@dataclass(frozen=True)
class Sample:
    """A public call (`run(*inputs, backend=..., out=None)`) and the operation call it lowers to (`op`,
    `op_args(inputs, backend)`); `inputs` are the operands and then any tensor hyperparameters."""

    name: str
    run: Callable[..., torch.Tensor]
    inputs: tuple[torch.Tensor, ...]
    op: str  # "pairwise", "product", "product_grad" or "grad"
    op_args: Callable[[tuple[torch.Tensor, ...], str], tuple]
    differentiable: bool  # whether the backward of every operand is implemented

    @property
    def operands(self) -> int:
        """How many of `inputs` are operands (the rest are hyperparameters)."""
        return {"pairwise": 2, "product": 3, "product_grad": 4, "grad": 4}[self.op]

    def __call__(self, *inputs: torch.Tensor, backend: str = "auto", out: torch.Tensor | None = None) -> torch.Tensor:
        return self.run(*inputs, backend=backend, out=out)


@dataclass(frozen=True)
class Input:
    """A tensor hyperparameter that is the call's input number `index`."""

    index: int


def _pairwise_args(
    program: PairwiseProgram, hypers: dict, offsets: tuple[int, int] = (0, 0), order: tuple[int, ...] = (0, 1)
) -> Callable:
    """The arguments of `kermac::pairwise` (or, with three or four operands in `order`, `kermac::product` or
    `kermac::product_grad`) for the inputs at the positions `order`."""
    names = ",".join(hypers)
    numbers = [math.nan if isinstance(v, Input) else float(v) for v in hypers.values()]

    def build(inputs: tuple[torch.Tensor, ...], backend: str) -> tuple:
        tensors = [inputs[v.index] if isinstance(v, Input) else None for v in hypers.values()]
        operands = (inputs[i] for i in order)
        return (*operands, program.key(), names, numbers, tensors, *offsets, backend, False, "test")

    return build


def _grad_args(program: GradProgram, hypers: dict) -> Callable:
    names = ",".join(hypers)
    numbers = [float(v) for v in hypers.values()]

    def build(inputs: tuple[torch.Tensor, ...], backend: str) -> tuple:
        return (*inputs, program.key(), names, numbers, [None] * len(hypers), backend, False, "test")

    return build


def _laplace_hypers(bandwidth: torch.Tensor) -> dict[str, HyperValue]:
    """The hyperparameters of the product_grad sample: a batched bandwidth and a scalar regularisation."""
    return {"bandwidth": HyperValue("bandwidth", None, bandwidth), "regularization": HyperValue("regularization", 0.1)}


def samples(device: str, dtype: torch.dtype = torch.float64, seed: int = 0) -> list[Sample]:
    """The sample calls on `device` in `dtype`, from `seed`."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=dtype).to(device)

    x, z = randn(7, 5), randn(2, 9, 5)  # broadcast batch: x has none
    xt = randn(5, 6).mT  # a transposed view
    bw = torch.tensor([0.7, 1.9], dtype=dtype, device=device)
    a, b, c, d = randn(9, 7), randn(5, 9), randn(2, 9), randn(5, 7)
    kernel = presets.ALL["matern52"].lower(regularized=True)
    v, u = randn(3, 9).mT, randn(7, 2)  # v: a transposed view; u: the operand of Kᵀ @ u
    gaussian = presets.ALL["gaussian"].lower(regularized=True)
    laplace_l1 = presets.ALL["laplace_l1"].lower(regularized=True)
    g = randn(2, 7, 3)  # the upstream gradient of K @ v
    return [
        Sample(
            "cdist_p1.5",
            lambda x, z, backend, out=None: kermac.cdist(x, z, 1.5, backend=backend, out=out),
            (x, z),
            "pairwise",
            _pairwise_args(cdist_program(1.5, dtype=dtype), {"p": 1.5}),
            True,
        ),
        Sample(
            "cdist_p2_view",
            lambda x, z, backend, out=None: kermac.cdist(x, z, backend=backend, out=out),
            (xt, z[0]),
            "pairwise",
            _pairwise_args(cdist_program(2.0, dtype=dtype), {}),
            True,
        ),
        Sample(
            "matern52_batched_bandwidth_ridge",
            lambda x, z, bw, backend, out=None: kermac.run_kernel(
                "matern52", x, z, bandwidth=bw, regularization=0.1, offset_n=1, backend=backend, out=out
            ),
            (x, z, bw),
            "pairwise",
            _pairwise_args(kernel, {"bandwidth": Input(2), "regularization": 0.1}, (0, 1)),
            True,
        ),
        Sample(
            "run_program_user",
            lambda x, z, backend, out=None: kermac.run_program(
                SOFT_L1, x, z, hypers={"eps": 0.25}, backend=backend, out=out
            ),
            (x, z),
            "pairwise",
            _pairwise_args(SOFT_L1, {"eps": 0.25}),
            False,
        ),
        Sample(
            "kernel_product_gaussian_batched_ridge",
            lambda x, z, v, bw, backend, out=None: kermac.kernel_product(
                "gaussian", x, z, v, bandwidth=bw, regularization=0.1, offset_n=1, backend=backend, out=out
            ),
            (x, z, v, bw),
            "product",
            _pairwise_args(gaussian, {"bandwidth": Input(3), "regularization": 0.1}, (0, 1), (0, 1, 2)),
            True,
        ),
        Sample(
            "program_product_transposed_user",
            lambda x, z, u, backend, out=None: kermac.program_product(
                SOFT_L1, x, z, u, transpose=True, offset_m=2, backend=backend, out=out, eps=0.25
            ),
            (x, z, u),
            "product",
            _pairwise_args(swap_operands(SOFT_L1), {"eps": 0.25}, (0, 2), (1, 0, 2)),
            False,
        ),
        Sample(
            "product_grad_laplace_l1_batched_ridge",
            lambda x, z, v, g, bw, backend, out=None: ops.product_grad(
                laplace_l1.key(), x, z, v, g, _laplace_hypers(bw), out=out, offset_n=1, backend=backend
            ),
            (x, z, v, g, bw),
            "product_grad",
            _pairwise_args(laplace_l1, {"bandwidth": Input(4), "regularization": 0.1}, (0, 1), (0, 1, 2, 3)),
            False,
        ),
        Sample(
            "cdist_grad_p2",
            lambda a, b, c, d, backend, out=None: kermac.cdist_grad(a, b, c, d, p=2.0, backend=backend, out=out),
            (a, b, c, d),
            "grad",
            _grad_args(grad_program(2.0), {}),
            True,
        ),
        Sample(
            "cdist_grad_p1.5",
            lambda a, b, c, d, backend, out=None: kermac.cdist_grad(a, b, c, d, p=1.5, backend=backend, out=out),
            (a, b, c, d),
            "grad",
            _grad_args(grad_program(1.5), {"p": 1.5}),
            False,
        ),
        Sample(
            "run_grad_program_user",
            lambda a, b, c, d, backend, out=None: kermac.run_grad_program(
                HUBER_GRAD, a, b, c, d, backend=backend, out=out
            ),
            (a, b, c, d),
            "grad",
            _grad_args(HUBER_GRAD, {}),
            False,
        ),
    ]
