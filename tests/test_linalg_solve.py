"""kermac_linalg.solve (LU) against float64 references, on the CPU and (marked gpu) on CUDA."""

from __future__ import annotations

import pytest
import torch
from linalg_helpers import DEVICES, DTYPES, assert_solves, general, rhs

import kermac_linalg as kl

TOL = {torch.float32: 5e-5, torch.float64: 1e-11}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "a_batch, b_batch",
    [((), ()), ((3,), (3,)), ((), (4,)), ((2, 1), (3,)), ((5,), ())],
    ids=["single", "batch", "A-broadcast", "both-broadcast", "B-broadcast"],
)
def test_solution_matches_float64_reference(device, dtype, a_batch, b_batch):
    A = general(*a_batch, n=33, dtype=dtype, device=device)
    B = rhs(*b_batch, 33, 6, dtype=dtype, device=device)
    A0, B0 = A.clone(), B.clone()
    X, info = kl.solve(A, B)
    batch = torch.broadcast_shapes(a_batch, b_batch)
    assert info.shape == batch and info.dtype == torch.int32 and info.device == A.device
    assert (info == 0).all()
    assert_solves(A0, B0, X, TOL[dtype])
    assert torch.equal(A, A0) and torch.equal(B, B0), "inputs must be untouched without overwrite"


@pytest.mark.parametrize("device", DEVICES)
def test_solves_a_not_its_transpose(device):
    A = general(n=6, device=device)
    B = rhs(6, 2, device=device)
    X, _ = kl.solve(A, B)
    wrong = torch.linalg.solve(A.mT.cpu(), B.cpu())
    assert (X.cpu() - wrong).norm() > 1e-3 * wrong.norm()
    assert (A.cpu() @ X.cpu() - B.cpu()).norm() <= 1e-12 * B.norm().cpu()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("view", ["transposed", "strided", "expanded"])
def test_non_contiguous_inputs(device, view):
    n = 21
    base = general(3, n=n, device=device)
    if view == "transposed":
        A = base.mT  # column-major entries of the transpose: still solve with this A
        B = rhs(3, 4, n, device=device).mT
    elif view == "strided":
        big = torch.zeros(3, 2 * n, 3 * n, dtype=base.dtype, device=device)
        big[:, ::2, ::3] = base
        A = big[:, ::2, ::3]
        B = rhs(3, n, 8, device=device)[..., 1::2]
    else:
        A = base[:1].expand(3, n, n)
        B = rhs(1, n, 2, device=device).expand(3, n, 2)
    X, info = kl.solve(A, B)
    assert (info == 0).all()
    assert_solves(A, B, X, TOL[torch.float64])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_singular_entry_is_reported_and_leaves_others_valid(device, dtype):
    A = general(4, n=10, dtype=dtype, device=device)
    A[1] = 0.0
    A[1, :, 0] = 1.0  # rank one: the second pivot of its LU is exactly zero
    B = rhs(4, 10, 3, dtype=dtype, device=device)
    X, info = kl.solve(A, B)
    assert info[[0, 2, 3]].tolist() == [0, 0, 0]
    assert info[1].item() == 2
    assert torch.isnan(X[1]).all()
    keep = [0, 2, 3]
    assert_solves(A[keep], B[keep], X[keep], TOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
def test_check_raises_listing_failed_entries(device):
    A = general(3, n=5, device=device)
    A[0] = 0.0
    with pytest.raises(kl.LinalgError) as exc:
        kl.solve(A, rhs(3, 5, 1, device=device), check=True)
    assert exc.value.failed == [((0,), 1)]
    assert "singular" in str(exc.value)


@pytest.mark.parametrize("device", DEVICES)
def test_overwrite_b_aliases_column_major_b(device):
    A = general(2, 3, n=11, device=device)
    B = rhs(2, 3, 4, 11, device=device).mT
    B0 = B.clone()
    X, _ = kl.solve(A, B, overwrite_b=True)
    assert X.data_ptr() == B.data_ptr()
    assert_solves(A, B0, B, TOL[torch.float64])


@pytest.mark.parametrize("device", DEVICES)
def test_overwrite_b_with_broadcast_b_makes_a_new_x(device):
    A = general(3, n=11, device=device)
    B = rhs(4, 11, device=device).mT  # one column-major entry, broadcast over A's batch
    B0 = B.clone()
    X, _ = kl.solve(A, B, overwrite_b=True)
    assert X.shape == (3, 11, 4) and X.data_ptr() != B.data_ptr() and torch.equal(B, B0)
    assert_solves(A, B0, X, TOL[torch.float64])


@pytest.mark.parametrize("device", DEVICES)
def test_empty_problems(device):
    X, info = kl.solve(general(0, n=4, device=device), rhs(0, 4, 2, device=device))
    assert X.shape == (0, 4, 2) and info.shape == (0,)
    X, info = kl.solve(torch.empty(0, 0, device=device), torch.empty(0, 3, device=device))
    assert X.shape == (0, 3) and info.shape == () and info.item() == 0
    X, info = kl.solve(general(2, n=3, device=device), rhs(2, 3, 0, device=device))
    assert X.shape == (2, 3, 0) and info.tolist() == [0, 0]


def test_bad_inputs_name_the_argument():
    A, B = general(2, n=4), rhs(2, 4, 3)
    cases = [
        ((torch.zeros(4), B), {}, ValueError, "A must be a square"),
        ((A, rhs(2, 3, 3)), {}, ValueError, "B must have shape"),
        ((A, rhs(2, 4)), {}, ValueError, "B.unsqueeze"),
        ((A, rhs(5, 3, 4, 3)), {}, ValueError, "must broadcast"),
        ((A, B.float()), {}, TypeError, "B must have the same dtype"),
        ((A.to(torch.complex128), B), {}, TypeError, "A must have dtype"),
        ((A.half(), B.half()), {}, TypeError, "A must have dtype"),
        ((A, B), {"overwrite_a": "yes"}, TypeError, "overwrite_a must be a bool"),
    ]
    for args, kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            kl.solve(*args, **kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["row-major", "column-major"])
def test_gpu_overwrite_a_factors_in_place(dtype, layout):
    A = general(3, n=30, dtype=dtype, device="cuda")
    if layout == "column-major":
        A = A.mT.contiguous().mT
    A0 = A.clone()
    B = rhs(3, 30, 2, dtype=dtype, device="cuda")
    X, info = kl.solve(A, B, overwrite_a=True)
    assert (info == 0).all()
    assert_solves(A0, B, X, TOL[dtype])
    assert not torch.equal(A, A0), "A must hold its LU factors"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block", [8, 16, 256])
@pytest.mark.parametrize("storage", ["copy", "in-place-row-major", "in-place-column-major"])
def test_gpu_blocked_substitution_with_row_interchanges(monkeypatch, dtype, block, storage):
    """Several diagonal blocks (the last one partial), pivoting rows, broadcast batches."""
    from kermac_linalg import _trsolve

    monkeypatch.setattr(_trsolve, "block_size", lambda n: block)
    n = 37 if block < 256 else 549
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(3))
    A0 = general(2, 1, n=n, dtype=dtype, device="cuda")[..., perm, :]  # rows out of order: pivots swap
    B = rhs(3, n, 5, dtype=dtype, device="cuda")
    A = A0.clone() if storage == "in-place-row-major" else A0.mT.contiguous().mT
    X, info = kl.solve(A, B, overwrite_a=storage != "copy")
    assert info.shape == (2, 3) and (info == 0).all()
    assert_solves(A0, B, X, TOL[dtype])


@pytest.mark.gpu
def test_gpu_singular_entry_poisons_only_its_solutions():
    A = general(3, n=300, device="cuda", dtype=torch.float32)
    A[1, :, 290] = 0.0  # a zero column: singular, found in the last diagonal block
    B = rhs(2, 3, 300, 4, device="cuda", dtype=torch.float32)
    X, info = kl.solve(A, B)
    assert info[:, 0].eq(0).all() and info[:, 2].eq(0).all() and info[:, 1].gt(0).all()
    assert torch.isnan(X[:, 1]).all()
    assert_solves(A[[0, 2]], B[:, [0, 2]], X[:, [0, 2]], TOL[torch.float32])
