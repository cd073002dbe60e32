"""The Jacobian of a fused kernel product with respect to its points, from one product of the slope program.

Shared by the public [`predictor_gradient`][kermac.predictor.predictor_gradient] and the backward of the
product ([`kermac.autograd`][kermac.autograd]); it runs kermac's operations ([`kermac.ops`][kermac.ops]) only, so
autograd can use it without reaching the public operations.
"""

from __future__ import annotations

import torch

from kermac import ops
from kermac.hyperparams import HyperValue
from kermac.programs import PairwiseProgram, slope_program

__all__ = ["product_jacobian"]


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
    """`J[..., m, c, j] = ∂(K(x, z) v)[..., m, c] / ∂x[..., m, j]` for a `program` summing `(x − z)²` (the
    formula of [`kermac.predictor`][kermac.predictor]), `[*B, M, C, D]` in `x`'s dtype (`B` broadcasts the batch
    shapes of `x`, `z`, `v` and the tensor hyperparameters); one fused product of `C + C·D` columns.

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
