"""A dense float64 kernel matrix of any pairwise program, differentiable by torch autograd.

The independent reference of the gradient tests (``test_product_grad.py``, ``test_predictor.py``): the program's
expressions evaluated with torch operations on the whole ``[*B, M, N, D]`` cube (no kermac backend, no symbolic
derivative), so ``torch.autograd`` of ``dense_kernel(...) @ v`` is the exact gradient a fused gradient product
must match, for programs ``run_program`` does not differentiate.
"""

from __future__ import annotations

import torch

from kermac.ir_eval import evaluate
from kermac.programs import PairwiseProgram

_REDUCE = {"sum": torch.sum, "max": torch.amax, "min": torch.amin, "logsumexp": torch.logsumexp}


def dense_kernel(
    program: PairwiseProgram,
    x: torch.Tensor,
    z: torch.Tensor,
    hypers: dict[str, float | torch.Tensor] | None = None,
    offsets: tuple[int, int] = (0, 0),
) -> torch.Tensor:
    """`K[*B, m, n] = epilogue(REDUCE_j inner(x[m, j], z[n, j]), diag)` for float64 `x [*B, M, D]`, `z [*B, N, D]`;
    tensor hyperparameters have one value per batch entry (shape `B`)."""
    hypers = hypers or {}

    def env(trailing: int) -> dict[str, torch.Tensor | float]:
        return {
            k: v.reshape(v.shape + (1,) * trailing) if isinstance(v, torch.Tensor) else v for k, v in hypers.items()
        }

    like = torch.empty((), dtype=x.dtype)
    terms = evaluate(program.inner, {"x": x[..., :, None, :], "z": z[..., None, :, :], **env(3)}, like=like)
    shapes = [h.shape for h in hypers.values() if isinstance(h, torch.Tensor)]
    batch = torch.broadcast_shapes(x.shape[:-2], z.shape[:-2], *shapes)
    terms = terms.expand(batch + (x.shape[-2], z.shape[-2], x.shape[-1]))
    acc = _REDUCE[program.reduction](terms, dim=-1)
    rows = torch.arange(x.shape[-2]) + offsets[0]
    cols = torch.arange(z.shape[-2]) + offsets[1]
    diag = (rows[:, None] == cols[None, :]).to(x.dtype)
    return evaluate(program.epilogue, {"acc": acc, "diag": diag, **env(2)}, like=like).expand(acc.shape)
