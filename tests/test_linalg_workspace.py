"""kermac_linalg.workspace_size: argument checks here, cuSOLVER's answers on the GPU."""

from __future__ import annotations

import pytest
import torch

import kermac_linalg as kl


def test_bad_arguments_name_the_argument():
    cases = [
        (("svd", (4, 4)), {}, ValueError, "op must be one of"),
        (("eigh", (4, 5)), {}, ValueError, r"A must have shape \[..., N, N\]"),
        (("eigh", (4,)), {}, ValueError, r"A must have shape \[..., N, N\]"),
        (("eigh", "44"), {}, TypeError, "A must be a tensor or a shape"),
        (("eigh", (4, -4)), {}, TypeError, "A must be a tensor or a shape"),
        (("eigh", (4, 4)), {"dtype": torch.int32}, TypeError, "dtype must be torch.float32 or torch.float64"),
        (("eigh", (4, 4)), {"device": "cpu"}, ValueError, "device must be a CUDA device, got cpu"),
        (("eigh", torch.eye(4)), {}, ValueError, "device must be a CUDA device, got cpu"),
        (("eigh", torch.eye(4)), {"dtype": torch.float64}, TypeError, "taken from A"),
        (("solve", (4, 4)), {"top_k": 2}, ValueError, "select eigenpairs for eigh_range"),
        (("cholesky_solve", (4, 4)), {"k": -1}, ValueError, "k must be a non-negative int"),
    ]
    for args, kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            kl.workspace_size(*args, **kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["cholesky", "cholesky_solve", "solve", "eigh", "eigh_range"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sizes_add_up(op, dtype):
    sel = {"top_k": 8} if op == "eigh_range" else {}
    ws = kl.workspace_size(op, (5, 300, 300), dtype=dtype, **sel)
    itemsize = torch.empty((), dtype=dtype).element_size()
    assert ws.op == op and ws.entries == 5 and ws.streams == min(5, kl.max_streams())
    assert ws.device_bytes_per_entry > 0 and ws.host_bytes_per_entry >= 0
    pivots = 12 * 300 * 5 if op == "solve" else 0
    # substitution: two diagonal blocks of 256² per triangle of each factor, Y [300 x 1] per entry, pointer arrays
    triangles = {"cholesky_solve": 1, "solve": 2}.get(op, 0)
    blocks = triangles * 5 * 2
    scratch = itemsize * (blocks * 256 * 256 + 5 * 300) + 8 * (2 * blocks + 12 * 2 * 5) if triangles else 0
    # The NaN/inf check: a norm and a bool per view of A (10 views cover the lower triangle of a
    # 300 x 300 matrix, 1 reads all of it for solve) and the result; solves check B (one view) too.
    views = 1 if op == "solve" else 10
    finite = 5 * (views * (itemsize + 1) + 1 + (itemsize + 3 if triangles else 0))
    assert ws.device_bytes == ws.streams * ws.device_bytes_per_entry + pivots + scratch + 4 * 5 + finite
    assert ws.host_bytes == ws.streams * ws.host_bytes_per_entry
    assert ws.copy_bytes == 5 * 300 * 300 * itemsize
    same = kl.workspace_size(op, torch.empty(5, 300, 300, dtype=dtype, device="cuda"), **sel)
    assert same == ws


@pytest.mark.gpu
def test_sizes_grow_with_n_and_eigh_range_needs_a_selection():
    small = kl.workspace_size("eigh", (256, 256))
    large = kl.workspace_size("eigh", (2048, 2048))
    assert large.device_bytes_per_entry > small.device_bytes_per_entry
    with pytest.raises(ValueError, match="needs exactly one selection"):
        kl.workspace_size("eigh_range", (64, 64))
    empty = kl.workspace_size("cholesky", (0, 64, 64))
    assert empty.entries == 0 and empty.device_bytes == 0
