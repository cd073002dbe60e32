"""kermac_linalg._finite.nonfinite: which batch entries hold NaN or ±inf (in the lower triangle alone
when asked), on strided views, against a brute-force reference, on the CPU and (marked gpu) on CUDA."""

from __future__ import annotations

import math

import pytest
import torch
from linalg_helpers import DEVICES, DTYPES

from kermac_linalg._finite import _lower_cover, nonfinite

SIZES = [1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 31, 32, 33]
VALUES = [math.nan, math.inf, -math.inf]


def reference(A: torch.Tensor, lower: bool) -> torch.Tensor:
    """True where an entry of A (its lower triangle if ``lower``) is not finite, elementwise on the CPU."""
    bad = ~torch.isfinite(A.cpu())
    if lower:
        bad &= torch.ones(A.shape[-2:], dtype=torch.bool).tril()
    return bad.flatten(-2).any(-1)


def embedded(values: torch.Tensor, layout: str, device: str) -> torch.Tensor:
    """``values [E, R, C]`` as a view of a larger NaN-filled buffer: a read outside the view is seen."""
    e, r, c = values.shape
    if layout == "row-major":
        view = torch.full((e, 2 * r + 1, 2 * c), math.nan, dtype=values.dtype, device=device)[:, 1::2, ::2]
    elif layout == "column-major":
        view = torch.full((e, 2 * c, r + 3), math.nan, dtype=values.dtype, device=device)[:, ::2, 3:].mT
    else:  # contiguous
        view = torch.empty_like(values, device=device)
    return view.copy_(values)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["contiguous", "row-major", "column-major"])
@pytest.mark.parametrize("n", SIZES)
def test_every_lower_element_is_read_and_no_other(device, dtype, layout, n):
    """Entry t holds one non-finite value at the t-th lower position; every entry's upper triangle is
    NaN and its other lower elements are the largest finite numbers (a sum would overflow)."""
    rows, cols = torch.tril_indices(n, n)
    big = torch.finfo(dtype).max
    values = torch.full((rows.numel() + 1, n, n), big, dtype=dtype)
    values[:, ::2] = -big
    values.masked_fill_(torch.ones(n, n, dtype=torch.bool).triu(1), math.nan)
    entries = torch.arange(rows.numel())
    values[entries, rows, cols] = torch.tensor(VALUES, dtype=dtype)[entries % 3]
    A = embedded(values, layout, device)
    bad = nonfinite(A, lower=True)
    assert bad.shape == (rows.numel() + 1,) and bad.dtype == torch.bool and bad.device == A.device
    assert bad[:-1].all(), f"lower positions not read: {[(int(rows[t]), int(cols[t])) for t in (~bad[:-1]).nonzero()]}"
    assert not bad[-1], "an element of the upper triangle (or outside the view) was read"
    assert torch.equal(bad.cpu(), reference(values, lower=True))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["contiguous", "row-major", "column-major"])
@pytest.mark.parametrize(("rows", "cols"), [(1, 1), (5, 5), (7, 3), (3, 8)])
def test_whole_matrix_every_element_is_read(device, layout, rows, cols):
    size = rows * cols
    values = torch.randn(size + 1, rows, cols, dtype=torch.float64)
    planted = torch.tensor(VALUES, dtype=torch.float64).repeat(size)[:size]
    values.view(size + 1, size)[torch.arange(size), torch.arange(size)] = planted  # entry t: element t
    A = embedded(values, layout, device)
    bad = nonfinite(A)
    assert bad[:-1].all() and not bad[-1]
    assert torch.equal(bad.cpu(), reference(values, lower=False))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [255, 256, 257, 1000])
def test_large_matrices_at_the_corners(device, n):
    positions = [(0, 0), (n - 1, 0), (n - 1, n - 1), (n // 2, n // 2 - 1), (n - 1, n - 2), (n // 2 + 1, 3)]
    values = torch.randn(len(positions) + 1, n, n, dtype=torch.float32)
    values.masked_fill_(torch.ones(n, n, dtype=torch.bool).triu(1), math.inf)
    for t, (i, j) in enumerate(positions):
        values[t, i, j] = math.nan
    bad = nonfinite(values.to(device), lower=True)
    assert bad.tolist() == [True] * len(positions) + [False]


@pytest.mark.parametrize("device", DEVICES)
def test_batch_shapes_views_and_empty_sizes(device):
    A = torch.randn(2, 3, 6, 6, dtype=torch.float64, device=device)
    A[1, 2, 5, 0] = math.inf
    A[0, 1, 0, 4] = math.nan  # upper: read only by the whole-matrix test
    assert nonfinite(A, lower=True).tolist() == [[False, False, False], [False, False, True]]
    assert nonfinite(A).tolist() == [[False, True, False], [False, False, True]]
    expanded = A[1:, 2:].expand(4, 5, 6, 6)  # one entry read 20 times, stride 0
    assert nonfinite(expanded, lower=True).shape == (4, 5) and nonfinite(expanded, lower=True).all()
    assert nonfinite(A.mT, lower=True)[0, 1], "the transpose holds the NaN in its lower triangle"
    for shape in [(0, 4, 4), (3, 0, 0), (2, 4, 0), (2, 0, 3)]:
        empty = torch.empty(shape, device=device)
        assert nonfinite(empty, lower=shape[-1] == shape[-2]).tolist() == [False] * shape[0]
    leaf = torch.eye(3, device=device, requires_grad=True)
    assert nonfinite(leaf, lower=True).item() is False and nonfinite(leaf).item() is False


@pytest.mark.parametrize("n", [1, 2, 3, 100, 1023, 1024, 1025, 2**20 + 1])
def test_the_cover_needs_few_reductions(n):
    views = _lower_cover(torch.empty(n, n, device="meta"))
    assert len(views) <= n.bit_length() + 1  # floor(log2 n) + 2
    read = sum(v.numel() for v in views)
    assert n * (n + 1) // 2 <= read <= n * n + n
