r"""Predictor gradients of p-norm kernels with many outputs, as blocks of the slope matrix and `cdist_grad`.

For a kernel on `acc = Σ_j |x_j − z_j|^P` (Laplace-L1, the Lp kernels and distances), `K = e(acc)`, the Jacobian
of the predictor `f(x) = K(x, z) α` ([`kermac.jacobians`][kermac.jacobians]) is

$$
J[m, c, j] = P \sum_n \alpha_{n c}\, E_{n m}\, \operatorname{sgn}(x_{m j} - z_{n j})\, |x_{m j} - z_{n j}|^{P - 1},
\qquad E_{n m} = e'(\mathrm{acc}_{n m})
$$

(`E` is 0 where `acc = 0`, where every difference is 0: [`slope_program`][kermac.programs.slope_program]), which is
[`cdist_grad`][kermac.api.cdist_grad]`(E, zᵀ, αᵀ, xᵀ, p=P)` times P: one contraction of all C outputs at once,
where the fused route takes one gradient product per output. With more than one output, or D ≥ 32, building E in
blocks is faster (one H200, N = 10⁵, docs/dev/predictor-gradient-blocked.md): the pairwise kernel writes `E` for
`R = max(1, BLOCK_ELEMENTS // M)` centres into one workspace block (`[R, M]`; the program is symmetric in x and z),
and `cdist_grad` of the block, parallel over all M points, is added to the result
([`BLOCK_ELEMENTS`][kermac.product_blocked.BLOCK_ELEMENTS], as for products).  Blocks of the points instead would
leave `cdist_grad`, which sums over the centres within a program, a few dozen programs per block.

`applies` takes this route for a predictor gradient with `backend="auto"` on a CUDA device, unbatched, float32,
of a program summing `|x − z|^P` with a constant or scalar `P > 0` (not the squared differences: their Jacobian is
one product, [`kermac.product_blocked`][kermac.product_blocked]), at least
[`MIN_ENTRIES`][kermac.product_blocked.MIN_ENTRIES] entries of K, more than one output or at least `MIN_FEATURES`
features, and no input that requires a gradient (the fused route's result is what autograd sees there).

Workspace: one block of `R · M ≤ max(BLOCK_ELEMENTS, M)` entries in `x`'s dtype (1 GiB in float32), never `M · N`,
and one `M × C × D` block's partial result where there is more than one block.
"""

from __future__ import annotations

import torch

from kermac import ops, product_blocked
from kermac.canonical import canonical
from kermac.hyperparams import HyperValue
from kermac.ir import Const, Hyper
from kermac.logs import logger
from kermac.lowering import grad_program
from kermac.programs import (
    LINF_TERM,
    PairwiseProgram,
    canonical_inner,
    inner_difference_power,
    is_squared_difference_sum,
    slope_program,
)

__all__ = ["MIN_FEATURES", "applies", "blocked_jacobian", "difference_exponent", "faster_blocked"]

MIN_FEATURES = 32
"""The fewest features at which one output (C = 1) takes this route (measured faster there; at D = 3 the fused
gradient product is faster with one output)."""


def difference_exponent(program: PairwiseProgram, hypers: dict[str, HyperValue]) -> float | None:
    """P if `program` sums `|x − z|^P` with a constant or scalar hyperparameter `0 < P < ∞`, else None; also None
    for the squared differences (their Jacobian is one product) and for a sum of the l∞ term, which skips NaN
    coordinates where `cdist_grad` carries them."""
    power = inner_difference_power(program)
    if program.reduction != "sum" or is_squared_difference_sum(program):
        return None
    if canonical_inner(program) == _CANONICAL_LINF_TERM:
        return None
    if isinstance(power, Const):
        value = power.value
    elif isinstance(power, Hyper) and power.name in hypers and hypers[power.name].scalar is not None:
        value = hypers[power.name].scalar
    else:
        return None
    return value if 0 < value < float("inf") else None


_CANONICAL_LINF_TERM = canonical(LINF_TERM)


def applies(
    program: PairwiseProgram,
    x: torch.Tensor,
    z: torch.Tensor,
    alpha: torch.Tensor,
    hypers: dict[str, HyperValue],
    backend: str,
) -> bool:
    """Whether the predictor gradient of `program` at `x` `[M, D]`, `z` `[N, D]`, `alpha` `[N, C]` asked of
    `backend` runs in blocks: `backend="auto"` on a CUDA device, and `faster_blocked`."""
    return backend == "auto" and x.device.type == "cuda" and faster_blocked(program, x, z, alpha, hypers)


def faster_blocked(
    program: PairwiseProgram, x: torch.Tensor, z: torch.Tensor, alpha: torch.Tensor, hypers: dict[str, HyperValue]
) -> bool:
    """Whether the program, dtypes and sizes are those the blocked route was measured faster on (the conditions of
    the module documentation but the device and the backend), whatever the device."""
    (m, d), n, c = x.shape[-2:], z.shape[-2], alpha.shape[-1]
    return (
        x.dtype == torch.float32
        and x.dim() == z.dim() == alpha.dim() == 2
        and all(h.tensor is None for h in hypers.values())
        and (c > 1 or (c == 1 and d >= MIN_FEATURES))
        and m * n >= product_blocked.MIN_ENTRIES
        and not (torch.is_grad_enabled() and any(t.requires_grad for t in (x, z, alpha)))
        and difference_exponent(program, hypers) is not None
    )


def blocked_jacobian(
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
    """`J[M, C, D]` (the formula of the module documentation) for an unbatched `program` summing `|x − z|^P`
    (`difference_exponent` not None), from blocks of its slope matrix over the centres and `cdist_grad`."""
    power = difference_exponent(program, hypers)
    if power is None:
        raise ValueError(
            f"program: expected a sum of |x − z|^P with a scalar 0 < P < ∞, not (x − z)², got {program.key()}"
        )
    contraction = grad_program(power)  # cdist_grad's program for this P
    powers = {"p": HyperValue("p", power)} if "p" in contraction.hypers else {}
    slope = slope_program(program)
    used = {name: hypers[name] for name in slope.hypers}
    (m, d), n, c = x.shape, z.shape[0], alpha.shape[1]
    rows = max(1, min(n, product_blocked.BLOCK_ELEMENTS // max(m, 1)))
    out = x.new_empty(m, c, d)
    block = x.new_empty(rows, m)
    part = x.new_empty(m, c, d) if rows < n else out
    xt = x.mT
    if debug:
        logger.debug("%s: %d points against %d centres in %d blocks of the slope matrix and cdist_grad", op, m, n,
                     -(-n // rows))  # fmt: skip
    for start in range(0, n, rows):
        stop = min(n, start + rows)
        # centre start + k is row k here: a slope reading the diagonal finds it at offset_m = start
        e = ops.pairwise(slope.key(), z[start:stop], x, used, out=block[: stop - start], offset_m=start,
                         backend=backend, debug=debug, op=op)  # fmt: skip
        target = out if start == 0 else part  # [M, C, D], written as cdist_grad's [O, N, M] = [C, D, M]
        ops.grad(contraction.key(), e, z[start:stop].mT, alpha[start:stop].mT, xt, powers,
                 out=target.permute(1, 2, 0), backend=backend, debug=debug, op=op)  # fmt: skip
        if start > 0:
            out.add_(part)
    return out.mul_(power) if power != 1.0 else out
