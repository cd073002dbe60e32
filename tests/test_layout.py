"""Batch-dimension coalescing for code-generating backends."""

from __future__ import annotations

import itertools

import torch

from kermac.layout import batch_layout


def brute_offset(t: torch.Tensor, batch: tuple[int, ...], flat: int) -> int:
    idx = []
    for size in reversed(batch):
        idx.append(flat % size)
        flat //= size
    return sum(i * s for i, s in zip(reversed(idx), t.stride()[: len(batch)], strict=True))


def test_offsets_match_strides_for_broadcast_and_views() -> None:
    batch = (4, 2, 3)
    ops = {
        "x": torch.randn(2, 3, 5, 4).expand(4, 2, 3, 5, 4),
        "z": torch.randn(4, 3, 2, 6, 4).transpose(1, 2),
        "out": torch.empty(4, 2, 3, 5, 6),
    }
    layout = batch_layout(batch, ops)
    assert layout.size == 24 and len(layout.shape) <= 3
    for name, t in ops.items():
        for b in range(24):
            assert layout.offsets(name, b) == brute_offset(t, batch, b), (name, b)


def test_contiguous_batches_merge_and_unit_dims_vanish() -> None:
    ops = {"x": torch.randn(2, 3, 1, 5, 4), "out": torch.empty(2, 3, 1, 5, 5)}
    layout = batch_layout((2, 3, 1), ops)
    assert layout.shape == (6,) and layout.strides == {"x": (20,), "out": (25,)}
    assert batch_layout((), {"x": torch.randn(3, 3)}).shape == ()
    assert all(
        batch_layout(s, {"x": torch.randn(*s, 2, 2)}).shape in ((), (6,)) for s in itertools.permutations((1, 6))
    )
