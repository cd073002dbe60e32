"""kermac_linalg.eigh against float64 references, on the CPU and (marked gpu) on CUDA."""

from __future__ import annotations

import pytest
import torch
from linalg_helpers import DEVICES, DTYPES, assert_eigenpairs, symmetric

import kermac_linalg as kl

TOL = {torch.float32: 2e-5, torch.float64: 1e-12}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", [(), (3,), (2, 2)])
def test_eigenpairs_match_float64_reference(device, dtype, batch):
    A = symmetric(*batch, n=45, dtype=dtype, device=device)
    A0 = A.clone()
    W, V, info = kl.eigh(A)
    assert W.shape == (*batch, 45) and V.shape == (*batch, 45, 45)
    assert info.shape == batch and info.dtype == torch.int32 and (info == 0).all()
    assert W.device == A.device and V.dtype == dtype
    assert_eigenpairs(A0, W, V, TOL[dtype])
    assert torch.equal(A, A0)


@pytest.mark.parametrize("device", DEVICES)
def test_reads_only_the_lower_triangle(device):
    A = symmetric(2, n=16, device=device)
    garbage = A.tril() + torch.full_like(A, 7.0).triu(1)
    W, V, _info = kl.eigh(garbage)
    assert_eigenpairs(A, W, V, TOL[torch.float64])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["row-major", "column-major"])
def test_overwrite_a_returns_a_view_of_a(device, layout):
    A = symmetric(3, n=20, device=device)
    if layout == "column-major":
        A = A.mT.contiguous().mT
    A0 = A.clone()
    W, V, _info = kl.eigh(A, overwrite_a=True)
    assert V.data_ptr() == A.data_ptr()
    assert V.stride() == (A.mT if layout == "row-major" else A).stride()
    assert_eigenpairs(A0, W, V, TOL[torch.float64])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("view", ["strided", "expanded"])
def test_views_are_read_and_not_written(device, view):
    if view == "strided":
        big = symmetric(2, n=30, device=device)
        A = big[:, ::3, ::3]
    else:
        A = symmetric(1, n=10, device=device).expand(4, 10, 10)
    A0 = A.clone()
    W, V, _info = kl.eigh(A, overwrite_a=True)
    assert V.data_ptr() != A.data_ptr() and torch.equal(A, A0)
    assert_eigenpairs(A0, W, V, TOL[torch.float64])


@pytest.mark.parametrize("device", DEVICES)
def test_failed_entry_is_nan_and_others_valid(device):
    A = symmetric(3, n=8, device=device)
    A[1] = torch.nan
    W, V, info = kl.eigh(A)
    assert info.tolist() == [0, kl.NONFINITE_INPUT, 0]
    assert torch.isnan(W[1]).all() and torch.isnan(V[1]).all()
    assert_eigenpairs(A[[0, 2]], W[[0, 2]], V[[0, 2]], TOL[torch.float64])
    with pytest.raises(kl.LinalgError, match=r"entry \(1,\): the lower triangle of A holds a NaN or an infinity"):
        kl.eigh(A, check=True)


@pytest.mark.parametrize("device", DEVICES)
def test_tiny_and_empty(device):
    W, V, info = kl.eigh(torch.full((1, 1), 3.0, device=device))
    assert W.tolist() == [3.0] and V.abs().tolist() == [[1.0]] and info.item() == 0
    W, V, info = kl.eigh(torch.empty(0, 5, 5, device=device))
    assert W.shape == (0, 5) and V.shape == (0, 5, 5) and info.shape == (0,)
    W, V, info = kl.eigh(torch.empty(2, 0, 0, device=device))
    assert W.shape == (2, 0) and V.shape == (2, 0, 0) and info.tolist() == [0, 0]


def test_bad_inputs_name_the_argument():
    with pytest.raises(ValueError, match="A must be a square"):
        kl.eigh(torch.zeros(2, 3, 4))
    with pytest.raises(TypeError, match="A must have dtype"):
        kl.eigh(torch.eye(3, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="overwrite_a must be a bool"):
        kl.eigh(torch.eye(3), overwrite_a=None)
