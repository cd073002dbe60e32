"""kermac.cdist on every backend and device against independent float64 references."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import BACKEND_DEVICES, assert_close, randn, ref_cdist, ref_distance_sum, require_backend, tolerance

import kermac

PS = [0.0, 0.5, 1.0, 1.3, 2.0, 3.0, math.inf]


def sizes(device: str) -> tuple[int, int, int]:
    """(M, N, D): small on the CPU (the Triton interpreter is slow), past every tile size on a GPU."""
    return (7, 5, 9) if device == "cpu" else (131, 67, 259)


def make_layout(
    layout: str, m: int, n: int, d: int, dtype: torch.dtype, device: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Operands with the given memory layout; values are fresh standard normals."""
    if layout == "contiguous":
        return randn(m, d, dtype=dtype, device=device), randn(n, d, dtype=dtype, device=device)
    if layout == "broadcast":
        return randn(2, 1, m, d, dtype=dtype, device=device), randn(3, n, d, dtype=dtype, device=device)
    if layout == "transposed":
        return randn(d, m, dtype=dtype, device=device).T, randn(d, n, dtype=dtype, device=device).T
    if layout == "sliced":
        return randn(2 * m, d + 3, dtype=dtype, device=device)[::2, 1 : d + 1], randn(
            n, 2 * d, dtype=dtype, device=device
        )[:, ::2]
    if layout == "ones":
        return randn(1, 1, dtype=dtype, device=device), randn(1, 1, dtype=dtype, device=device)
    raise AssertionError(layout)


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
@pytest.mark.parametrize("layout", ["contiguous", "broadcast", "transposed", "sliced", "ones"])
@pytest.mark.parametrize("p", PS)
def test_matches_reference(backend: str, device: str, layout: str, p: float) -> None:
    require_backend(backend, device)
    x, z = make_layout(layout, *sizes(device), torch.float32, device)
    out = kermac.cdist(x, z, p=p, backend=backend)
    assert out.dtype == torch.float32 and out.device.type == device
    assert_close(out, ref_cdist(x, z, p), tolerance(torch.float32))


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
@pytest.mark.parametrize("p", [0.5, 1.0, 2.0, 3.0])
def test_skip_epilogue_returns_inner_sum(backend: str, device: str, p: float) -> None:
    require_backend(backend, device)
    x, z = make_layout("contiguous", *sizes(device), torch.float32, device)
    out = kermac.cdist(x, z, p=p, skip_epilogue=True, backend=backend)
    assert_close(out, ref_distance_sum(x, z, p), tolerance(torch.float32))


def make_out(layout: str, m: int, n: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A NaN-poisoned ``out`` view [m, n] with the given layout, and the whole buffer behind it.

    "padded": rows 16-byte aligned with a stride past n (vector stores, a ragged last group);
    "shifted": the same rows one element off alignment (scalar stores); "transposed".
    """
    if layout == "transposed":
        base = torch.full((n, m), math.nan, device=device)
        return base.T, base
    width = -(-(n + 1) // 16) * 16
    base = torch.full((m, width), math.nan, device=device)
    return (base[:, :n] if layout == "padded" else base[:, 1 : n + 1]), base


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
@pytest.mark.parametrize("layout", ["transposed", "padded", "shifted"])
@pytest.mark.parametrize("p", [1.0, 1.3, 2.0])
def test_out_is_written_everywhere(backend: str, device: str, layout: str, p: float) -> None:
    """A NaN-poisoned ``out`` view is overwritten exactly where it lies, and returned."""
    require_backend(backend, device)
    m, n, d = sizes(device)
    x, z = make_layout("contiguous", m, n, d, torch.float32, device)
    out, base = make_out(layout, m, n, device)
    result = kermac.cdist(x, z, p=p, out=out, backend=backend)
    assert result.data_ptr() == out.data_ptr()
    assert not torch.isnan(out).any()
    assert torch.isnan(base).sum() == base.numel() - out.numel()  # nothing written outside the view
    assert_close(out, ref_cdist(x, z, p), tolerance(torch.float32))


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
def test_batched_p_one_launch_per_batch(backend: str, device: str) -> None:
    """A tensor p with 2-d inputs gives a batch of matrices; with batched inputs it pairs up."""
    require_backend(backend, device)
    m, n, d = sizes(device)
    ps = [0.7, 1.0, 1.5, 2.0, 3.1]
    p = torch.tensor(ps, device=device)
    x, z = make_layout("contiguous", m, n, d, torch.float32, device)
    out = kermac.cdist(x, z, p=p, backend=backend)
    assert_close(out, torch.stack([ref_cdist(x, z, q) for q in ps]), tolerance(torch.float32))
    xb = randn(len(ps), m, d, device=device)
    out = kermac.cdist(xb, z, p=p, backend=backend)
    assert_close(out, torch.stack([ref_cdist(xb[i], z, q) for i, q in enumerate(ps)]), tolerance(torch.float32))


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
def test_near_duplicate_rows_p2_stay_exact(backend: str, device: str) -> None:
    """p = 2 is computed from differences: tiny distances between near-duplicates keep 1e-5 relative accuracy."""
    require_backend(backend, device)
    m, _, d = sizes(device)
    x = randn(m, d, device=device) * 10
    z = x + 1e-4 * randn(m, d, device=device)
    out = kermac.cdist(x, z, p=2.0, backend=backend)
    ref = ref_cdist(x, z, 2.0)
    assert_close(out.diagonal(), ref.diagonal(), 1e-5)
    assert_close(out, ref, 1e-5)


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("p", [1.0, 1.3, 2.0])
def test_other_dtypes(backend: str, device: str, dtype: torch.dtype, p: float) -> None:
    """Half types accumulate in float32 and return their own dtype; float64 stays float64."""
    require_backend(backend, device)
    x, z = make_layout("contiguous", *sizes(device), dtype, device)
    out = kermac.cdist(x, z, p=p, backend=backend)
    assert out.dtype == dtype
    assert_close(out, ref_cdist(x, z, p), tolerance(dtype))


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
@pytest.mark.parametrize("p", PS)
def test_nan_input_propagates(backend: str, device: str, p: float) -> None:
    """A NaN coordinate gives NaN exactly where torch.cdist does: every distance of its row, but for
    p = ∞, whose maximum skips NaN differences (docs/formulas.md, "Special values")."""
    require_backend(backend, device)
    x, z = make_layout("contiguous", *sizes(device), torch.float32, device)
    x[1, 2] = math.nan
    out = kermac.cdist(x, z, p=p, backend=backend).cpu()
    expected = torch.cdist(x.cpu(), z.cpu(), p=p)
    assert torch.equal(out.isnan(), expected.isnan())
    assert out[1].isnan().all() == (p != math.inf)


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
def test_empty_and_featureless(backend: str, device: str) -> None:
    require_backend(backend, device)
    x = randn(0, 4, device=device)
    assert kermac.cdist(x, randn(3, 4, device=device), backend=backend).shape == (0, 3)
    for p in PS:
        out = kermac.cdist(randn(3, 0, device=device), randn(2, 0, device=device), p=p, backend="torch")
        assert torch.equal(out.cpu(), torch.zeros(3, 2)), p


def test_equals_torch_cdist_on_cpu() -> None:
    """The issue's acceptance check: equal to torch.cdist to 1e-6 on batched, broadcast, transposed inputs."""
    x = torch.randn(2, 1, 9, 33).transpose(-1, -2)  # [2, 1, 33, 9], transposed view
    z = torch.randn(3, 17, 9)
    for p in PS:
        expected = torch.cdist(x, z, p=p, compute_mode="donot_use_mm_for_euclid_dist")
        assert_close(kermac.cdist(x, z, p=p), expected, 1e-6)


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
@pytest.mark.parametrize("skip_epilogue", [False, True])
def test_invalid_tensor_p_gives_nan_batch_entries(backend: str, device: str, skip_epilogue: bool) -> None:
    """A tensor p outside (0, plain_power_limit] (3.96 for float32) makes every distance of its batch
    entry NaN (no host sync; debug raises), also where pow(|x − z|, NaN) would be 1 (|x − z| = 1,
    D = 1) and for D = 0."""
    require_backend(backend, device)
    p = torch.tensor([2.5, -1.0, 0.0, math.inf, math.nan, 4.0], device=device)
    cases = [
        make_layout("contiguous", *sizes(device), torch.float32, device),
        (torch.zeros(2, 1, device=device), torch.tensor([[1.0], [-1.0], [1.0]], device=device)),
        (torch.zeros(2, 3, device=device), torch.ones(3, 3, device=device)),
        (torch.zeros(2, 0, device=device), torch.zeros(3, 0, device=device)),
    ]
    for x, z in cases:
        out = kermac.cdist(x, z, p=p, skip_epilogue=skip_epilogue, backend=backend).cpu()
        assert out[1:].isnan().all(), (x.shape, out)
        ref = ref_distance_sum(x, z, 2.5) if skip_epilogue else ref_cdist(x, z, 2.5)
        assert_close(out[0], ref, tolerance(torch.float32))
    with pytest.raises(ValueError, match=r"p: expected a number > 0 and <= 3\.958.* torch\.float32"):
        kermac.cdist(x, z, p=p, skip_epilogue=skip_epilogue, backend=backend, debug=True)
