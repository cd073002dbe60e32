"""kermac_linalg.cholesky_solve against float64 references, on the CPU and (marked gpu) on CUDA."""

from __future__ import annotations

import pytest
import torch
from linalg_helpers import DEVICES, DTYPES, assert_solves, rhs, spd

import kermac_linalg as kl

TOL = {torch.float32: 2e-5, torch.float64: 1e-12}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "a_batch, b_batch",
    [((), ()), ((3,), (3,)), ((), (4,)), ((2, 1), (3,)), ((5,), ())],
    ids=["single", "batch", "A-broadcast", "both-broadcast", "B-broadcast"],
)
def test_solution_matches_float64_reference(device, dtype, a_batch, b_batch):
    A = spd(*a_batch, n=37, dtype=dtype, device=device)
    B = rhs(*b_batch, 37, 5, dtype=dtype, device=device)
    A0, B0 = A.clone(), B.clone()
    X, info = kl.cholesky_solve(A, B)
    batch = torch.broadcast_shapes(a_batch, b_batch)
    assert info.shape == batch and info.dtype == torch.int32 and info.device == A.device
    assert (info == 0).all()
    assert X.dtype == dtype and X.device == A.device
    assert_solves(A0, B0, X, TOL[dtype])
    assert torch.equal(A, A0) and torch.equal(B, B0), "inputs must be untouched without overwrite"


@pytest.mark.parametrize("device", DEVICES)
def test_reads_only_the_lower_triangle(device):
    A = spd(2, n=20, device=device)
    garbage = A.tril() + torch.full_like(A, 1e3).triu(1)  # A's lower triangle, garbage above
    B = rhs(2, 20, 3, device=device)
    X, info = kl.cholesky_solve(garbage, B)
    assert (info == 0).all()
    assert_solves(A, B, X, TOL[torch.float64])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("view", ["transposed", "strided", "expanded"])
def test_non_contiguous_inputs(device, view):
    n = 24
    base = spd(3, n=n, device=device)
    if view == "transposed":
        A = base.mT.contiguous().mT  # column-major entries
        B = rhs(3, 4, n, device=device).mT
    elif view == "strided":
        big = torch.zeros(3, 2 * n, 2 * n, dtype=base.dtype, device=device)
        big[:, ::2, ::2] = base
        A = big[:, ::2, ::2]
        B = rhs(3, n, 8, device=device)[..., ::2]
    else:
        A = base[:1].expand(3, n, n)
        B = rhs(1, n, 2, device=device).expand(3, n, 2)
    X, info = kl.cholesky_solve(A, B)
    assert (info == 0).all()
    assert_solves(A, B, X, TOL[torch.float64])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_failed_entry_is_reported_and_leaves_others_valid(device, dtype):
    A = spd(4, n=16, dtype=dtype, device=device)
    A[2] = -A[2]  # not positive definite: the leading minor of order 1 is negative
    B = rhs(4, 16, 3, dtype=dtype, device=device)
    X, info = kl.cholesky_solve(A, B)
    assert info.tolist() == [0, 0, 1, 0]
    assert torch.isnan(X[2]).all()
    keep = [0, 1, 3]
    assert_solves(A[keep], B[keep], X[keep], TOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
def test_check_raises_listing_failed_entries(device):
    A = spd(2, 3, n=8, device=device)
    A[1, 2, 5, 5] = -100.0  # leading minor of order 6 fails
    B = rhs(2, 3, 8, 1, device=device)
    with pytest.raises(kl.LinalgError) as exc:
        kl.cholesky_solve(A, B, check=True)
    assert exc.value.failed == [((1, 2), 6)]
    assert "(1, 2)" in str(exc.value) and "order 6" in str(exc.value)
    assert isinstance(exc.value, torch.linalg.LinAlgError)
    kl.cholesky_solve(spd(2, n=8, device=device), rhs(2, 8, 1, device=device), check=True)


@pytest.mark.parametrize("device", DEVICES)
def test_overwrite_b_aliases_column_major_b(device):
    A = spd(3, n=12, device=device)
    B = rhs(3, 2, 12, device=device).mT  # column-major entries: X can be written in place
    B0 = B.clone()
    X, _info = kl.cholesky_solve(A, B, overwrite_b=True)
    assert X.data_ptr() == B.data_ptr() and X.stride() == B.stride()
    assert_solves(A, B0, B, TOL[torch.float64])


@pytest.mark.parametrize("device", DEVICES)
def test_overwrite_b_copies_row_major_b(device):
    A = spd(3, n=12, device=device)
    B = rhs(3, 12, 2, device=device)  # row-major: cuSOLVER needs column-major, so X is new
    B0 = B.clone()
    X, _ = kl.cholesky_solve(A, B, overwrite_b=True)
    assert X.data_ptr() != B.data_ptr() and torch.equal(B, B0)
    assert_solves(A, B0, X, TOL[torch.float64])


@pytest.mark.parametrize("device", DEVICES)
def test_single_column_and_tiny_sizes(device):
    for n, k in [(1, 1), (1, 3), (2, 1), (9, 1), (9, 2)]:
        A, B = spd(2, n=n, device=device), rhs(2, n, k, device=device)
        X, info = kl.cholesky_solve(A, B)
        assert (info == 0).all()
        assert_solves(A, B, X, TOL[torch.float64])


@pytest.mark.parametrize("device", DEVICES)
def test_overwrite_b_aliases_a_single_column(device):
    A, B = spd(n=9, device=device), rhs(9, 1, device=device)  # [N, 1]: column-major as it is
    B0 = B.clone()
    X, _ = kl.cholesky_solve(A, B, overwrite_b=True)
    assert X.data_ptr() == B.data_ptr()
    assert_solves(A, B0, B, TOL[torch.float64])


@pytest.mark.parametrize("device", DEVICES)
def test_empty_problems(device):
    X, info = kl.cholesky_solve(spd(0, n=4, device=device), rhs(0, 4, 2, device=device))
    assert X.shape == (0, 4, 2) and info.shape == (0,)
    X, info = kl.cholesky_solve(torch.empty(2, 0, 0, device=device), torch.empty(2, 0, 3, device=device))
    assert X.shape == (2, 0, 3) and info.tolist() == [0, 0]
    X, info = kl.cholesky_solve(spd(2, n=3, device=device), rhs(2, 3, 0, device=device))
    assert X.shape == (2, 3, 0) and info.tolist() == [0, 0]


def test_bad_inputs_name_the_argument():
    A, B = spd(2, n=4), rhs(2, 4, 3)
    cases = [
        ((A[..., :3], B), {}, ValueError, "A must be a square"),
        ((A, rhs(2, 5, 3)), {}, ValueError, "B must have shape"),
        ((A, rhs(2, 4)), {}, ValueError, "B.unsqueeze"),
        ((A, rhs(3, 4, 3)), {}, ValueError, "must broadcast"),
        ((A.float(), B), {}, TypeError, "B must have the same dtype"),
        ((A.int(), B), {}, TypeError, "A must have dtype"),
        ((A.numpy(), B), {}, TypeError, "A must be a torch.Tensor"),
        ((A, B.tolist()), {}, TypeError, "B must be a torch.Tensor"),
        ((A, B), {"overwrite_b": 1}, TypeError, "overwrite_b must be a bool"),
        ((A, B), {"check": None}, TypeError, "check must be a bool"),
        ((A.to("meta"), B), {}, ValueError, "A must be on a CPU or CUDA device"),
    ]
    for args, kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            kl.cholesky_solve(*args, **kwargs)


@pytest.mark.gpu
def test_device_mismatch():
    with pytest.raises(ValueError, match="B must be on the same device as A"):
        kl.cholesky_solve(spd(n=4, device="cuda"), rhs(4, 2))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_overwrite_a_factors_in_place(dtype):
    A = spd(3, n=40, dtype=dtype, device="cuda")
    A0 = A.clone()
    B = rhs(3, 40, 4, dtype=dtype, device="cuda")
    X, info = kl.cholesky_solve(A, B, overwrite_a=True)
    assert (info == 0).all()
    assert_solves(A0, B, X, TOL[dtype])
    L = torch.linalg.cholesky(A0.double())
    assert torch.allclose(A.tril().double(), L, atol=TOL[dtype] * 40, rtol=0), "A must hold its factor"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block", [8, 16, 256])
@pytest.mark.parametrize("storage", ["copy", "in-place-row-major", "in-place-column-major"])
def test_gpu_blocked_substitution(monkeypatch, dtype, block, storage):
    """Several diagonal blocks (the last one partial), both stored triangles, broadcast batches."""
    from kermac_linalg import _trsolve

    monkeypatch.setattr(_trsolve, "block_size", lambda n: block)
    n = 37 if block < 256 else 549
    A0 = spd(2, 1, n=n, dtype=dtype, device="cuda")
    B = rhs(3, n, 5, dtype=dtype, device="cuda")
    A = A0.clone() if storage == "in-place-row-major" else A0.mT.contiguous().mT
    X, info = kl.cholesky_solve(A, B, overwrite_a=storage != "copy")
    assert info.shape == (2, 3) and (info == 0).all()
    assert_solves(A0, B, X, TOL[dtype])


@pytest.mark.gpu
@pytest.mark.parametrize("block", [8, 256])
def test_gpu_failure_in_a_later_block_poisons_only_its_entry(monkeypatch, block):
    from kermac_linalg import _trsolve

    monkeypatch.setattr(_trsolve, "block_size", lambda n: block)
    n = 40 if block < 256 else 300
    A = spd(3, n=n, device="cuda", dtype=torch.float32)
    A[1, n - 3, n - 3] = -1e3  # the leading minor of order n - 2 fails, in the last block
    B = rhs(3, n, 2, device="cuda", dtype=torch.float32)
    X, info = kl.cholesky_solve(A, B)
    assert info.tolist() == [0, n - 2, 0]
    assert torch.isnan(X[1]).all()
    assert_solves(A[[0, 2]], B[[0, 2]], X[[0, 2]], TOL[torch.float32])


@pytest.mark.gpu
def test_gpu_many_right_hand_sides_and_one_column():
    A = spd(n=300, device="cuda", dtype=torch.float32)
    for k in (1, 300):
        B = rhs(2, 300, k, device="cuda", dtype=torch.float32)
        X, info = kl.cholesky_solve(A, B)
        assert (info == 0).all()
        assert_solves(A, B, X, TOL[torch.float32])
