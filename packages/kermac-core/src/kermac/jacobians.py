r"""Jacobians of fused kernel products with respect to their points, without materialising the kernel matrix.

For the product `f(x)[m, c] = Σ_n K(x_m, z_n) α[n, c]` (a fused product,
[`kernel_product`][kermac.api.kernel_product]; a kernel predictor, [`kermac.predictor`][kermac.predictor]) and a
kernel on `r² = Σ_j (x_j − z_j)²`, `K = e(r²)`,

$$
J[m, c, j] = \frac{\partial f(x)[m, c]}{\partial x_{m j}}
= 2\Big(x_{m j} \sum_n E_{m n}\,\alpha_{n c} - \sum_n E_{m n}\,\alpha_{n c}\, z_{n j}\Big),
\qquad E_{m n} = e'(r^2_{m n})
$$

that is one product of the slope program ([`slope_program`][kermac.programs.slope_program]) with the
`C + C·D` columns `[α, α ⊙ z]`. This Jacobian is what the average gradient outer product (AGOP) of a
Recursive Feature Machine needs, `G = (1/M) Σ_m J[m]ᵀ J[m]`; the backward of the product with respect to
`x` ([`kermac.autograd`][kermac.autograd]) is its contraction with the incoming gradient.

For any other kernel, `K = e(acc)`, `acc = ⊕_j τ(x_j, z_j)` its reduction over features with weights
`w_j = ∂acc/∂τ_j` ([`term_weights`][kermac.reductions.term_weights]: 1 for a sum),

$$
J[m, c, j] = \sum_n \alpha_{n c}\, e'(\mathrm{acc}_{m n})\, w_j(m, n)\,
\frac{\partial \tau}{\partial x}(x_{m j}, z_{n j}),
$$

the gradient product (`kermac.problem.ProductGradProblem`) with `v = α[:, c]` and the upstream
gradient `g = 1` on every row of `x`: one fused pass per output column, so `C` passes over the `M × N` pairs (the
squared-difference route takes one pass with `C + C·D` columns).  Each pass reads its own column of α only, so a
NaN in one column of α makes that output NaN and no other (a one-hot `g` against all of `α` would multiply the
other columns' NaN by 0).
"""

from __future__ import annotations

import torch

from kermac import jacobian_blocked, ops
from kermac.hyperparams import HyperValue
from kermac.programs import PairwiseProgram, slope_program

__all__ = ["gradient_product_jacobian", "product_jacobian"]


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
    (the first formula of the module docstring), `[*B, M, C, D]` in `x`'s dtype (`B` broadcasts the batch shapes
    of `x`, `z`, `v` and the tensor hyperparameters); one fused product of `C + C·D` columns.

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


def gradient_product_jacobian(
    program: PairwiseProgram,
    x: torch.Tensor,
    z: torch.Tensor,
    alpha: torch.Tensor,
    hypers: dict[str, HyperValue],
    *,
    backend: str = "auto",
    debug: bool = False,
    op: str = "predictor_gradient",
) -> torch.Tensor:
    """`J[*B, M, C, D]` (as [`product_jacobian`][kermac.jacobians.product_jacobian]) for any `program` (the second
    formula of the module docstring): one gradient product per output column `c`, `v = α[..., c:c + 1]` and `g` a
    column of ones broadcast over the rows of `x` (a view of one per-call element); with
    `backend="auto"` a large p-norm problem with several outputs (or one and D ≥ 32) runs as blocks of its slope
    matrix over the centres and `cdist_grad` instead ([`kermac.jacobian_blocked`][kermac.jacobian_blocked])."""
    (m, d), c = x.shape[-2:], alpha.shape[-1]
    if c == 0:
        shapes = [x.shape[:-2], z.shape[:-2], alpha.shape[:-2]]
        shapes += [h.tensor.shape for h in hypers.values() if h.tensor is not None]
        return x.new_zeros(torch.broadcast_shapes(*shapes) + (m, 0, d))
    if jacobian_blocked.applies(program, x, z, alpha, hypers, backend):
        return jacobian_blocked.blocked_jacobian(program, x, z, alpha, hypers, backend=backend, debug=debug, op=op)
    key, ones = program.key(), x.new_ones(1, 1).expand(m, 1)
    columns = [
        ops.product_grad(key, x, z, alpha[..., i : i + 1], ones, hypers, backend=backend, debug=debug, op=op)
        for i in range(c)
    ]
    return torch.stack(columns, dim=-2)
