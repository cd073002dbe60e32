r"""Gradients of kernel predictors with respect to their points, without materialising the kernel matrix.

A kernel predictor is `f(x)[m, c] = Σ_n K(x_m, z_n) α[n, c]` (a fused product,
[`kernel_product`][kermac.api.kernel_product]). For a kernel on `r² = Σ_j (x_j − z_j)²`, `K = e(r²)`,

$$
J[m, c, j] = \frac{\partial f(x)[m, c]}{\partial x_{m j}}
= 2\Big(x_{m j} \sum_n E_{m n}\,\alpha_{n c} - \sum_n E_{m n}\,\alpha_{n c}\, z_{n j}\Big),
\qquad E_{m n} = e'(r^2_{m n})
$$

that is one product of the slope program ([`slope_program`][kermac.programs.slope_program]) with the
`C + C·D` columns `[α, α ⊙ z]`. This Jacobian is what the average gradient outer product (AGOP) of a
Recursive Feature Machine needs, `G = (1/M) Σ_m J[m]ᵀ J[m]`; the backward of the product with respect to
`x` ([`kermac.autograd`][kermac.autograd]) is its contraction with the incoming gradient.

For any other kernel whose reduction over features is a sum, `K = e(acc)`, `acc = Σ_j τ(x_j, z_j)`,

$$
J[m, c, j] = \sum_n \alpha_{n c}\, e'(\mathrm{acc}_{m n})\, \frac{\partial \tau}{\partial x}(x_{m j}, z_{n j}),
$$

the gradient product (`kermac.problem.ProductGradProblem`) with `v = α` and the upstream
gradient `g = e_c`, the one-hot row of output `c` on every row of `x`: one fused pass per output column, so
`C` passes over the `M × N` pairs (the squared-difference route takes one pass with `C + C·D` columns).
"""

from __future__ import annotations

import torch

from kermac import ops
from kermac.api import lower_kernel
from kermac.hyperparams import HyperValue, program_hypers
from kermac.logs import debug_enabled
from kermac.problem import check_tensor
from kermac.programs import PairwiseProgram, is_squared_difference_sum, program_from_key, slope_program

_NOT_SUMS = (
    "predictor_gradient: implemented for kernels whose reduction over features is a sum (every preset but the "
    "l∞ distance, and user programs of that shape); program {key} takes the {reduction}imum"
)

__all__ = ["predictor_gradient", "product_jacobian"]


def product_jacobian(
    program: PairwiseProgram,
    x: torch.Tensor,
    z: torch.Tensor,
    v: torch.Tensor,
    hypers: dict[str, HyperValue],
    *,
    offset_m: int = 0,
    offset_n: int = 0,
    backend: str = "auto",
    debug: bool = False,
    op: str = "predictor_gradient",
) -> torch.Tensor:
    """`J[..., m, c, j] = ∂(K(x, z) v)[..., m, c] / ∂x[..., m, j]` for a `program` summing `(x − z)²`
    (module docstring), `[*B, M, C, D]` in `x`'s dtype (`B` broadcasts the batch shapes of `x`, `z`, `v` and
    the tensor hyperparameters); one fused product of `C + C·D` columns.

    The caller checks the program's shape; inputs broadcast as in a product.
    """
    slope = slope_program(program)
    used = {n: hypers[n] for n in slope.hypers}
    shapes = [
        x.shape[:-2],
        z.shape[:-2],
        v.shape[:-2],
        *(h.tensor.shape for h in used.values() if h.tensor is not None),
    ]
    batch = torch.broadcast_shapes(*shapes)  # a batched hyperparameter's shape is a batch shape too
    (m, d), n, c = x.shape[-2:], z.shape[-2], v.shape[-1]
    zb, vb = z.expand(batch + (n, d)), v.expand(batch + (n, c))
    columns = torch.cat([vb, (vb[..., :, :, None] * zb[..., :, None, :]).reshape(batch + (n, c * d))], dim=-1)
    e = ops.product(
        slope.key(), x, z, columns, used, offset_m=offset_m, offset_n=offset_n, backend=backend, debug=debug, op=op
    )
    ev, ew = e[..., :c], e[..., c:].reshape(batch + (m, c, d))
    return 2 * (x.expand(batch + (m, d))[..., :, None, :] * ev[..., :, :, None] - ew)


def _columns_jacobian(
    program: PairwiseProgram,
    x: torch.Tensor,
    z: torch.Tensor,
    alpha: torch.Tensor,
    hypers: dict[str, HyperValue],
    *,
    backend: str,
    debug: bool,
    op: str = "predictor_gradient",
) -> torch.Tensor:
    """`J[*B, M, C, D]` for a sum-reduced `program` (module docstring): one gradient product per output column,
    `g` the column's one-hot row broadcast over the rows of `x` (views of one `C × C` identity, a per-call
    tensor)."""
    (m, d), c = x.shape[-2:], alpha.shape[-1]
    if c == 0:
        shapes = [x.shape[:-2], z.shape[:-2], alpha.shape[:-2]]
        shapes += [h.tensor.shape for h in hypers.values() if h.tensor is not None]
        return x.new_zeros(torch.broadcast_shapes(*shapes) + (m, 0, d))
    key, onehot = program.key(), torch.eye(c, dtype=x.dtype, device=x.device)
    columns = [
        ops.product_grad(key, x, z, alpha, onehot[i].expand(m, c), hypers, backend=backend, debug=debug, op=op)
        for i in range(c)
    ]
    return torch.stack(columns, dim=-2)


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
            hyperparameters come as keywords; its reduction over features must be a sum (every preset but the
            l∞ distance, and user programs of that shape).
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
    columns, and the result is differentiable to any order (it is made of fused products); every other
    sum-reduced kernel (Laplace-L1, the Lp kernels, dot products, user programs) takes one gradient product
    per output column (`C` passes; module docstring), and the result has first derivatives only.  Where the
    inner term is flat (`∂τ/∂x = 0`, e.g. `|x − z|` at `x = z`) a pair contributes 0, torch.cdist's subgradient.

    Raises `NotImplementedError` for a kernel that takes a maximum or minimum over features (the l∞
    distance), naming it; the usual `TypeError`/`ValueError` for inputs, naming the argument.
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
    if program.reduction != "sum":
        raise NotImplementedError(_NOT_SUMS.format(key=program.key(), reduction=program.reduction))
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
        jacobian = _columns_jacobian(program, x, z, alpha, hv, backend=backend, debug=debug)
    return jacobian[..., 0, :] if vector else jacobian
