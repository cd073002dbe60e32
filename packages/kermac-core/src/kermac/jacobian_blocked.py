r"""Predictor gradients of p-norm kernels with many outputs, as row blocks of the slope matrix and `cdist_grad`.

For a kernel on `acc = Σ_j |x_j − z_j|^P` (Laplace-L1, the Lp kernels and distances), `K = e(acc)`, the Jacobian
of the predictor `f(x) = K(x, z) α` ([`kermac.jacobians`][kermac.jacobians]) is

$$
J[m, c, j] = P \sum_n \alpha_{n c}\, E_{n m}\, \operatorname{sgn}(x_{m j} - z_{n j})\, |x_{m j} - z_{n j}|^{P - 1},
\qquad E_{n m} = e'(\mathrm{acc}_{n m})
$$

(`E` is 0 where `acc = 0`, where every difference is 0: [`slope_program`][kermac.programs.slope_program]), which is
[`cdist_grad`][kermac.api.cdist_grad]`(E, zᵀ, αᵀ, xᵀ, p=P)` times P: one contraction of all C outputs at once,
where the fused route takes one gradient product per output. With more than one output, or D ≥ 32, building E in
row blocks is faster (one H200, N = 5·10⁴ and 10⁵, docs/dev/predictor-gradient-blocked.md): the pairwise kernel
writes `E` for `R = max(1, BLOCK_ELEMENTS // N)` rows of `x` into one workspace block (`[N, R]`; the program is
symmetric in x and z), `cdist_grad` writes those rows of the result
([`BLOCK_ELEMENTS`][kermac.product_blocked.BLOCK_ELEMENTS], as for products).

`applies` takes this route for a predictor gradient with `backend="auto"` on a CUDA device, unbatched, float32,
of a program summing `|x − z|^P` with a constant or scalar `P > 0` (not the squared differences: their Jacobian is
one product, [`kermac.product_blocked`][kermac.product_blocked]), at least
[`MIN_ENTRIES`][kermac.product_blocked.MIN_ENTRIES] entries of K, more than one output or at least `MIN_FEATURES`
features, and no input that requires a gradient (the fused route's result is what autograd sees there).

Workspace: one block of `R · N ≤ max(BLOCK_ELEMENTS, N)` entries in `x`'s dtype (1 GiB in float32), never `M · N`.
"""

from __future__ import annotations

import torch

from kermac import ops, product_blocked
from kermac.hyperparams import HyperValue
from kermac.ir import Const, Hyper
from kermac.logs import logger
from kermac.programs import PairwiseProgram, inner_difference_power, slope_program

__all__ = ["MIN_FEATURES", "applies", "blocked_jacobian", "difference_exponent", "faster_blocked"]

MIN_FEATURES = 32
"""The fewest features at which one output (C = 1) takes this route (measured faster there; at D = 3 the fused
gradient product is faster with one output)."""


def difference_exponent(program: PairwiseProgram, hypers: dict[str, HyperValue]) -> float | None:
    """P if `program` sums `|x − z|^P` with a constant or scalar hyperparameter `P > 0` other than 2, else None."""
    power = inner_difference_power(program)
    if program.reduction != "sum":
        return None
    if isinstance(power, Const):
        value = power.value
    elif isinstance(power, Hyper) and power.name in hypers and hypers[power.name].scalar is not None:
        value = hypers[power.name].scalar
    else:
        return None
    return value if value > 0 and value != 2.0 and value < float("inf") else None


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
    tensors = (x, z, alpha, *(h.tensor for h in hypers.values() if h.tensor is not None))
    return (
        x.dtype == torch.float32
        and x.dim() == z.dim() == alpha.dim() == 2
        and all(h.tensor is None for h in hypers.values())
        and (c > 1 or (c == 1 and d >= MIN_FEATURES))
        and m * n >= product_blocked.MIN_ENTRIES
        and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))
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
    (`difference_exponent` not None), from row blocks of its slope matrix and `cdist_grad`."""
    from kermac.api import cdist_grad  # kermac.api imports the modules that import this one

    power = difference_exponent(program, hypers)
    if power is None:
        raise ValueError(f"program: expected a sum of |x − z|^P with a scalar P > 0 other than 2, got {program.key()}")
    slope = slope_program(program)
    used = {name: hypers[name] for name in slope.hypers}
    (m, d), n, c = x.shape, z.shape[0], alpha.shape[1]
    out = x.new_empty(m, c, d)
    rows = max(1, min(m, product_blocked.BLOCK_ELEMENTS // max(n, 1)))
    block = x.new_empty(n, rows)
    zt, at = z.mT, alpha.mT
    if debug:
        logger.debug("%s: %d rows against %d centres as %d blocks of the slope matrix and cdist_grad", op, m, n,
                     -(-m // rows))  # fmt: skip
    for start in range(0, m, rows):
        stop = min(m, start + rows)
        e = ops.pairwise(
            slope.key(), z, x[start:stop], used, out=block[:, : stop - start], backend=backend, debug=debug, op=op
        )
        part = out[start:stop].permute(1, 2, 0)  # [C, D, rows]: cdist_grad's [O, N, M]
        cdist_grad(e, zt, at, x[start:stop].mT, p=power, out=part, backend=backend, debug=debug)
    return out.mul_(power) if power != 1.0 else out
