r"""Gradients of kernel predictors with respect to their points, without materialising the kernel matrix.

A kernel predictor is `f(x)[m, c] = Σ_n K(x_m, z_n) α[n, c]` (a fused product,
[`kernel_product`][kermac.api.kernel_product]); its Jacobian `J[m, c, j] = ∂f(x)[m, c] / ∂x[m, j]` is what the
average gradient outer product (AGOP) of a Recursive Feature Machine needs, `G = (1/M) Σ_m J[m]ᵀ J[m]`.
[`predictor_gradient`][kermac.predictor.predictor_gradient] computes it by the routes of
[`kermac.jacobians`][kermac.jacobians]: one product of `C + C·D` columns for a kernel on `Σ (x − z)²`, one
gradient product per output column for any other kernel (any reduction over features).
"""

from __future__ import annotations

import torch

from kermac.api import lower_kernel
from kermac.hyperparams import program_hypers
from kermac.jacobians import gradient_product_jacobian, product_jacobian
from kermac.logs import debug_enabled
from kermac.problem import check_tensor
from kermac.programs import PairwiseProgram, is_squared_difference_sum, program_from_key

__all__ = ["predictor_gradient"]


def predictor_gradient(
    kernel: object,
    x: torch.Tensor,
    z: torch.Tensor,
    alpha: torch.Tensor,
    *,
    p: float | torch.Tensor | None = None,
    bandwidth: float | torch.Tensor | None = None,
    backend: str = "auto",
    debug: bool = False,
    **hypers: float | torch.Tensor,
) -> torch.Tensor:
    r"""The gradient of the kernel predictor `f(x) = K(x, z) α` at every point of `x`, never building `K`.

    $$
    \mathrm{out}[\dots, m, c, j] = \frac{\partial}{\partial x_{m j}} \sum_n K(x_m, z_n)\,\alpha[\dots, n, c]
    $$

    Args:
        kernel: a [`KernelDescriptor`][kermac.descriptor.KernelDescriptor], a preset name (as
            [`run_kernel`][kermac.api.run_kernel]) or a [`PairwiseProgram`][kermac.programs.PairwiseProgram] whose
            hyperparameters come as keywords.
        x: `[..., M, D]`, the points where the gradient is taken.
        z: `[..., N, D]`, the centres (training points).
        alpha: `[..., N, C]` coefficients, or `[N]` for one output (the result is then `[..., M, D]`).
        p: as in [`run_kernel`][kermac.api.run_kernel].
        bandwidth: as in [`run_kernel`][kermac.api.run_kernel].
        backend: `"auto"` or a backend that computes fused products.
        debug: as in [`cdist`][kermac.api.cdist].
        **hypers: a program's hyperparameters by name.

    Returns:
        `[..., M, C, D]` (or `[..., M, D]` for a 1-D `alpha`) in `x`'s dtype, computed in its compute dtype.
        Regularisation of the diagonal does not depend on the points and is not an argument.

    Kernels on `Σ (x − z)²` (Gaussian, Laplace-L2, Matérn, Cauchy, l2) take one fused product of `C + C·D`
    columns, and the result is differentiable to any order (it is made of fused products); every other kernel
    (Laplace-L1, the Lp kernels, dot products, the l∞ distance, soft minima, user programs) takes one gradient
    product per output column (`C` passes; [`kermac.jacobians`][kermac.jacobians]; a maximum, minimum or
    log-sum-exp over features weighs each feature by `∂acc/∂τ_j`), and the result has first derivatives only.
    Where the inner term is flat (`∂τ/∂x = 0`, e.g. `|x − z|` at `x = z`), or has no derivative (`|x − z|^P` with
    P < 1 at `x = z`), a pair contributes 0 in that feature, torch.cdist's subgradient.  With `backend="auto"` on a
    CUDA device, large problems with several outputs may run in blocks
    ([`kermac.product_blocked`][kermac.product_blocked], [`kermac.jacobian_blocked`][kermac.jacobian_blocked]); a
    named backend runs its fused kernels.

    Raises the usual `TypeError`/`ValueError` for inputs, naming the argument.
    """
    debug = debug_enabled(debug)
    x = check_tensor("x", x)
    z = check_tensor("z", z)
    if not isinstance(alpha, torch.Tensor):
        raise TypeError(f"alpha: expected a torch.Tensor, got {type(alpha).__name__}")
    vector = alpha.dim() == 1
    alpha = check_tensor("alpha", alpha[:, None] if vector else alpha)
    if isinstance(kernel, PairwiseProgram):
        named = {"p": p, "bandwidth": bandwidth}
        given = {k: v for k, v in named.items() if v is not None} | hypers
        program, hv = kernel, program_hypers(kernel.hypers, given, x.device, debug)
    else:
        if hypers:
            raise TypeError(
                f"predictor_gradient: unexpected keyword arguments {sorted(hypers)} (only a PairwiseProgram takes "
                "its hyperparameters as keywords; a descriptor takes p and bandwidth)"
            )
        key, hv = lower_kernel(kernel, x, p, bandwidth, None, debug, what="kernel")
        program = program_from_key(key)
    if alpha.dtype != x.dtype or alpha.device != x.device:
        raise TypeError(
            f"alpha: expected a tensor of x's dtype and device ({x.dtype} on {x.device}), got {alpha.dtype} on "
            f"{alpha.device}"
        )
    if alpha.shape[-2] != z.shape[-2]:
        raise ValueError(
            f"alpha: expected {z.shape[-2]} rows (N, z.shape[-2]), got shape {list(alpha.shape)} (z: {list(z.shape)})"
        )
    if is_squared_difference_sum(program):
        jacobian = product_jacobian(program, x, z, alpha, hv, backend=backend, debug=debug)
    else:
        jacobian = gradient_product_jacobian(program, x, z, alpha, hv, backend=backend, debug=debug)
    return jacobian[..., 0, :] if vector else jacobian
