"""kermac_linalg.cholesky against float64 references, on the CPU and (marked gpu) on CUDA."""

from __future__ import annotations

import pytest
import torch
from linalg_helpers import DEVICES, DTYPES, spd

import kermac_linalg as kl

TOL = {torch.float32: 1e-5, torch.float64: 1e-13}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", [(), (4,), (2, 3)])
def test_factor_reproduces_a(device, dtype, batch):
    A = spd(*batch, n=29, dtype=dtype, device=device)
    A0 = A.clone()
    L, info = kl.cholesky(A)
    assert info.shape == batch and info.dtype == torch.int32 and (info == 0).all()
    assert torch.equal(L, L.tril()), "L must be lower triangular with zeros above"
    assert rel(L.double() @ L.double().mT, A0) <= TOL[dtype]
    assert rel(L, torch.linalg.cholesky(A0.double().cpu())) <= 10 * TOL[dtype]
    assert torch.equal(A, A0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_upper(device, dtype):
    A = spd(3, n=17, dtype=dtype, device=device)
    U, info = kl.cholesky(A, upper=True)
    assert (info == 0).all() and torch.equal(U, U.triu())
    assert rel(U.double().mT @ U.double(), A) <= TOL[dtype]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("upper", [False, True])
def test_reads_only_the_lower_triangle_like_torch(device, upper):
    A = spd(2, n=12, device=device)
    garbage = A.tril() + torch.full_like(A, -1e3).triu(1)
    L, info = kl.cholesky(garbage, upper=upper)
    assert (info == 0).all()
    expected = torch.linalg.cholesky(A.cpu(), upper=upper)
    assert rel(L, expected) <= 1e-13


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_failed_entry_matches_lapack_info(device, dtype):
    A = spd(3, n=9, dtype=dtype, device=device)
    A[0, 4, 4] = -50.0  # leading minor of order 5 is not positive definite
    L, info = kl.cholesky(A)
    expected = torch.linalg.cholesky_ex(A.double().cpu()).info
    assert info.tolist() == expected.tolist() == [5, 0, 0]
    assert torch.isnan(L[0]).all()
    assert rel(L[1:].double() @ L[1:].double().mT, A[1:]) <= TOL[dtype]
    with pytest.raises(kl.LinalgError, match=r"entry \(0,\).*order 5"):
        kl.cholesky(A, check=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["row-major", "column-major"])
@pytest.mark.parametrize("upper", [False, True])
def test_overwrite_a_returns_a_itself(device, layout, upper):
    A = spd(2, n=10, device=device)
    if layout == "column-major":
        A = A.mT.contiguous().mT
    A0 = A.clone()
    L, _info = kl.cholesky(A, upper=upper, overwrite_a=True)
    assert L.data_ptr() == A.data_ptr()
    assert (L.mT if upper else L).stride() == A.stride(), "L is A (U is A.mT)"
    factor = L.mT if upper else L
    assert rel(factor @ factor.mT, A0) <= 1e-13


@pytest.mark.parametrize("device", DEVICES)
def test_overwrite_a_copies_when_entries_overlap(device):
    base = spd(1, n=6, device=device)
    base0 = base.clone()
    A = base.expand(3, 6, 6)  # three entries in the same memory: cannot be factored in place
    L, _info = kl.cholesky(A, overwrite_a=True)
    assert L.data_ptr() != A.data_ptr() and torch.equal(base, base0)
    assert rel(L @ L.mT, A) <= 1e-13


@pytest.mark.parametrize("device", DEVICES)
def test_strided_view_and_empty(device):
    big = spd(2, n=24, device=device)
    A = big[:, 1::2, 1::2]  # every other row and column of an SPD matrix: SPD, strided
    L, info = kl.cholesky(A)
    assert (info == 0).all() and rel(L @ L.mT, A) <= 1e-13
    L, info = kl.cholesky(torch.empty(0, 3, 3, device=device))
    assert L.shape == (0, 3, 3) and info.shape == (0,)
    L, info = kl.cholesky(torch.ones(1, 1, device=device) * 4)
    assert L.item() == 2.0 and info.item() == 0


def test_bad_inputs_name_the_argument():
    with pytest.raises(ValueError, match=r"A must be a square .* got shape \(3, 4\)"):
        kl.cholesky(torch.zeros(3, 4))
    with pytest.raises(TypeError, match=r"A must have dtype torch\.float32 or torch\.float64, got torch\.int64"):
        kl.cholesky(torch.eye(3, dtype=torch.int64))
    with pytest.raises(TypeError, match="upper must be a bool"):
        kl.cholesky(torch.eye(3), upper=1)
    with pytest.raises(TypeError, match=r"A must be a torch\.Tensor, got list"):
        kl.cholesky([[1.0]])
