"""Batch layout for code-generating backends: coalesced batch dimensions and per-tensor strides.

A normalised problem has every operand expanded to a common batch shape `B` (broadcast
dimensions have stride 0).  A GPU kernel walks the batch with one flat index `b` and needs,
for each operand, the element offset of batch entry `b`.  `batch_layout` merges adjacent
batch dimensions wherever every operand's strides allow it, drops size-1 dimensions, and returns
the few dimensions that remain, so kernels decompose `b` with as few divisions as possible:

```text
offset(t, b) = Σ_i ((b // inner_i) % shape_i) · strides[t][i],   inner_i = Π_{j > i} shape_j
```
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from kermac.problem import GradProblem, PairwiseProblem

__all__ = ["BatchLayout", "batch_layout", "grad_operands", "pairwise_operands"]


@dataclass(frozen=True)
class BatchLayout:
    """Coalesced batch dimensions (outermost first) and each operand's strides over them."""

    shape: tuple[int, ...]
    strides: Mapping[str, tuple[int, ...]]

    @property
    def size(self) -> int:
        """Number of batch entries (1 when there are no batch dimensions)."""
        n = 1
        for s in self.shape:
            n *= s
        return n

    def offsets(self, name: str, index: int) -> int:
        """Element offset of batch entry `index` in operand `name` (for tests and CPU use)."""
        off = 0
        for size, stride in zip(reversed(self.shape), reversed(self.strides[name]), strict=True):
            off += (index % size) * stride
            index //= size
        return off


def batch_layout(batch_shape: tuple[int, ...], operands: Mapping[str, torch.Tensor]) -> BatchLayout:
    """Coalesce `batch_shape` over `operands` (each with `batch_shape` as leading dims)."""
    nb = len(batch_shape)
    dims = [(batch_shape[i], {k: t.stride(i) for k, t in operands.items()}) for i in range(nb) if batch_shape[i] != 1]
    merged: list[tuple[int, dict[str, int]]] = []
    for size, strides in dims:
        if merged:
            psize, pstrides = merged[-1]
            if all(pstrides[k] == strides[k] * size for k in operands):
                merged[-1] = (psize * size, strides)
                continue
        merged.append((size, strides))
    if not merged:
        return BatchLayout((), {k: () for k in operands})
    return BatchLayout(tuple(s for s, _ in merged), {k: tuple(st[k] for _, st in merged) for k in operands})


def pairwise_operands(problem: PairwiseProblem) -> dict[str, torch.Tensor]:
    """The batched tensors of a pairwise problem by name: x, z, out and tensor hyperparameters."""
    ops = {"x": problem.x, "z": problem.z, "out": problem.out}
    ops.update({f"hyper_{k}": h.tensor for k, h in problem.hypers.items() if h.tensor is not None})
    return ops


def grad_operands(problem: GradProblem) -> dict[str, torch.Tensor]:
    """The batched tensors of a gradient problem by name: a, b, c, d, out and tensor hyperparameters."""
    ops = {"a": problem.a, "b": problem.b, "c": problem.c, "d": problem.d, "out": problem.out}
    ops.update({f"hyper_{k}": h.tensor for k, h in problem.hypers.items() if h.tensor is not None})
    return ops
