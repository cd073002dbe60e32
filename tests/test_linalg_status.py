"""Status of every kermac_linalg operation, on the CPU and (marked gpu) on CUDA: ``check=True`` raises
for unbatched and batched failures; NaN and infinities in what an operation reads fail their entry
with ``NONFINITE_INPUT`` (checked before an overwrite); overwrite flags refuse tensors that require grad."""

from __future__ import annotations

import math

import pytest
import torch
from linalg_helpers import DEVICES, DTYPES, assert_eigenpairs, assert_solves, rhs, spd

import kermac_linalg as kl
from kermac_linalg import _eigh_mg
from kermac_linalg._status import raise_for_info

NONFINITE = kl.NONFINITE_INPUT
TOL = {torch.float32: 5e-5, torch.float64: 1e-11}

# Each operation as (A, B, **flags) -> (outputs, info); eigh_range in its three routes.
OPS = {
    "cholesky": lambda A, B, **kw: _split(kl.cholesky(A, **kw)),
    "cholesky_solve": lambda A, B, **kw: _split(kl.cholesky_solve(A, B, **kw)),
    "solve": lambda A, B, **kw: _split(kl.solve(A, B, **kw)),
    "eigh": lambda A, B, **kw: _split(kl.eigh(A, **kw)),
    "eigh_range-index": lambda A, B, **kw: _split(kl.eigh_range(A, il=1, iu=3, **kw)),
    "eigh_range-value": lambda A, B, **kw: _split(kl.eigh_range(A, vl=0.5, vu=math.inf, **kw)),
    "eigh_range-iterative": lambda A, B, **kw: _split(kl.eigh_range(A, top_k=2, method="iterative", **kw)),
}
SOLVES = ("cholesky_solve", "solve")
READS_LOWER = ("cholesky", "cholesky_solve", "eigh", "eigh_range-index", "eigh_range-value", "eigh_range-iterative")
OVERWRITES = [(op, "overwrite_a", "A") for op in sorted(OPS)] + [(s, "overwrite_b", "B") for s in SOLVES]
N = 40  # the iterative method needs 2k + 32 < N


def _split(result: tuple) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    return tuple(result[:-1]), result[-1]


def assert_valid(op: str, A: torch.Tensor, B: torch.Tensor, outputs: tuple[torch.Tensor, ...], tol: float) -> None:
    """The outputs of a successful entry against float64 references."""
    if op in SOLVES:
        assert_solves(A, B, outputs[0], tol)
    elif op == "cholesky":
        L = outputs[0].double().cpu()
        assert ((L @ L.mT - A.double().cpu()).norm() / A.norm().item()).item() <= tol
    elif op == "eigh":
        assert_eigenpairs(A, *outputs, tol)
    else:  # eigh_range: the selected eigenvalues, residuals and orthonormal vectors
        A64, (W, V) = A.double().cpu(), (t.double().cpu() for t in outputs)
        values = torch.linalg.eigvalsh(A64)
        expected = {"index": values[..., 1:4], "value": values[..., :], "iterative": values[..., -2:]}
        assert (values > 0.5).all(), "SPD test matrices: the value range (0.5, inf) holds every eigenvalue"
        scale = torch.linalg.matrix_norm(A64, ord=2).max()
        assert (W - expected[op.split("-")[1]]).abs().max() <= tol * scale
        assert (A64 @ V - V * W[..., None, :]).norm(dim=(-2, -1)).max() <= tol * scale * A.shape[-1] ** 0.5
        eye = torch.eye(W.shape[-1], dtype=torch.float64)
        assert (V.mT @ V - eye).norm(dim=(-2, -1)).max() <= tol * A.shape[-1]


# --- check=True -------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("op", "matrix", "code"),
    [
        ("cholesky", -torch.eye(5, dtype=torch.float64), 1),
        ("cholesky_solve", -torch.eye(5, dtype=torch.float64), 1),
        ("solve", torch.zeros(5, 5, dtype=torch.float64), 1),
        ("eigh", torch.full((5, 5), math.nan, dtype=torch.float64), NONFINITE),
        ("eigh_range-index", torch.full((5, 5), math.nan, dtype=torch.float64), NONFINITE),
        ("eigh_range-value", torch.full((5, 5), math.nan, dtype=torch.float64), NONFINITE),
    ],
)
def test_check_raises_for_an_unbatched_matrix(device, op, matrix, code):
    A, B = matrix.to(device), torch.ones(5, 2, dtype=torch.float64, device=device)
    outputs, info = OPS[op](A.clone(), B)
    assert info.shape == () and int(info) == code
    assert all(t.isnan().all() for t in outputs)
    with pytest.raises(kl.LinalgError, match=r"failed in 1 of 1 batch entries:\n  entry \(\): ") as exc:
        OPS[op](A.clone(), B, check=True)
    assert exc.value.failed == [((), code)]
    assert exc.value.info.shape == () and int(exc.value.info) == code


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", sorted(OPS))
def test_check_passes_a_good_unbatched_matrix_and_raises_in_a_batch(device, op):
    A, B = spd(3, n=N, device=device), rhs(3, N, 2, device=device)
    _outputs, info = OPS[op](A[0], B[0], check=True)
    assert info.shape == () and int(info) == 0
    A[2, 5, 1] = math.nan
    with pytest.raises(kl.LinalgError) as exc:
        OPS[op](A, B, check=True)
    assert exc.value.failed == [((2,), NONFINITE)]


def test_raise_for_info_reads_a_0d_status():
    raise_for_info("eigh", torch.tensor(0, dtype=torch.int32))
    with pytest.raises(kl.LinalgError, match=r"entry \(\): the eigensolver did not converge \(info = 3\)"):
        raise_for_info("eigh", torch.tensor(3, dtype=torch.int32))
    with pytest.raises(kl.LinalgError, match=r"entry \(\): argument 4 of the solver call was invalid"):
        raise_for_info("solve", torch.tensor(-4, dtype=torch.int32))
    with pytest.raises(kl.LinalgError, match=r"entry \(0, 1\): A or the right-hand sides B hold a NaN"):
        raise_for_info("solve", torch.tensor([[0, NONFINITE]], dtype=torch.int32))
    raise_for_info("cholesky", torch.zeros(0, 3, dtype=torch.int32))


def test_the_nonfinite_code_collides_with_no_lapack_code():
    assert NONFINITE == torch.iinfo(torch.int32).min
    assert torch.tensor(NONFINITE, dtype=torch.int32).item() == NONFINITE


# --- NaN and infinities in the inputs ----------------------------------------------------------


def _plant(op: str, where: str, value: float, device: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of three SPD matrices and right-hand sides; entry 1 holds ``value`` at ``where``."""
    A, B = spd(3, n=N, dtype=dtype, device=device), rhs(3, N, 2, dtype=dtype, device=device)
    if where == "B":
        B[1, 7, 1] = value
    else:
        A[1, {"diagonal": (6, 6), "below": (9, 2), "above": (2, 9), "last": (N - 1, N - 2)}[where]] = value
    return A, B


WHERE = {op: ["diagonal", "below", "last"] + (["above"] if op == "solve" else []) for op in OPS}
for _op in SOLVES:
    WHERE[_op].append("B")
CASES = [(op, where) for op in sorted(OPS) for where in WHERE[op]]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize(("op", "where"), CASES)
def test_nonfinite_input_fails_its_entry_only(device, dtype, value, op, where):
    A, B = _plant(op, where, value, device, dtype)
    A0, B0 = A.clone(), B.clone()
    outputs, info = OPS[op](A, B)
    assert info.tolist() == [0, NONFINITE, 0] and info.dtype == torch.int32 and info.device == A.device
    for out in outputs:
        assert out[1].isnan().all(), "the failed entry's outputs are NaN"
    keep = [0, 2]
    assert_valid(op, A0[keep], B0[keep], tuple(t[keep] for t in outputs), TOL[dtype])
    assert torch.equal(A.nan_to_num(), A0.nan_to_num()) and torch.equal(B.nan_to_num(), B0.nan_to_num())
    meaning = "A or the right-hand sides B" if op == "solve" else "the lower triangle of A"
    with pytest.raises(kl.LinalgError, match=rf"entry \(1,\): {meaning}.* hold.? a NaN or an infinity") as exc:
        OPS[op](A, B, check=True)
    assert exc.value.failed == [((1,), NONFINITE)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", READS_LOWER)
def test_the_unread_upper_triangle_may_hold_anything(device, op):
    A, B = spd(2, n=N, device=device), rhs(2, N, 2, device=device)
    garbage = A.clone()
    garbage[1] = torch.where(torch.ones(N, N, dtype=torch.bool, device=device).triu(1), math.nan, A[1])
    garbage[0, 0, N - 1] = math.inf
    outputs, info = OPS[op](garbage, B, check=True)
    assert info.tolist() == [0, 0]
    assert_valid(op, A, B, outputs, TOL[torch.float64])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["cholesky", "cholesky_solve", "solve"])
def test_nonfinite_input_takes_precedence_over_a_numerical_failure(device, op):
    A, B = spd(2, n=8, device=device), rhs(2, 8, 1, device=device)
    A[:, 3] = 0.0  # a zero row: neither positive definite nor invertible
    A[:, :, 3] = 0.0
    A[1, 6, 0] = math.nan
    _outputs, info = OPS[op](A, B)
    assert info[0] > 0 and info[1] == NONFINITE


@pytest.mark.parametrize("device", DEVICES)
def test_right_hand_sides_broadcast_against_a(device):
    A, B = spd(2, 1, n=12, device=device), rhs(3, 12, 2, device=device)
    A[1, 0, 4, 4] = math.inf
    B[2, 11, 0] = math.nan
    for op in SOLVES:
        outputs, info = OPS[op](A, B)
        assert info.tolist() == [[0, 0, NONFINITE], [NONFINITE] * 3]
        assert outputs[0][0, :2].isfinite().all() and outputs[0][1].isnan().all() and outputs[0][0, 2].isnan().all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("op", "flag", "_target"), OVERWRITES)
def test_overwritten_inputs_are_checked_before_they_are_written(device, op, flag, _target):
    A, B = spd(3, n=N, device=device), rhs(3, 2, N, device=device).mT  # column-major: B can take X
    if flag == "overwrite_a":
        A = A.mT.contiguous().mT  # column-major: factored in place on either device
        A[1, 3, 1] = math.nan
    else:
        B[1, 0, 0] = math.inf
    A0, B0 = A.clone(), B.clone()
    outputs, info = OPS[op](A, B, **{flag: True})
    assert info.tolist() == [0, NONFINITE, 0]
    assert all(t[1].isnan().all() for t in outputs)
    assert_valid(op, A0[[0, 2]], B0[[0, 2]], tuple(t[[0, 2]] for t in outputs), TOL[torch.float64])
    if flag == "overwrite_b":
        assert outputs[0].data_ptr() == B.data_ptr(), "X is written over B"


def test_multi_gpu_eigh_reports_a_nonfinite_matrix_without_calling_cusolvermg(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(_eigh_mg, "_solve", lambda *a, **k: pytest.fail("cusolverMg called on a NaN matrix"))
    A = spd(n=9)
    A[4, 2] = math.nan
    W, V, info = kl.eigh_multi_gpu(A, block_size=4)
    assert int(info) == NONFINITE and W.isnan().all() and V.isnan().all()
    with pytest.raises(kl.LinalgError, match=r"entry \(\): the lower triangle of A holds a NaN") as exc:
        kl.eigh_multi_gpu(A, check=True)
    assert exc.value.failed == [((), NONFINITE)]


@pytest.mark.gpu
def test_multi_gpu_eigh_on_the_gpus_checks_only_the_lower_triangle():
    A = spd(n=70, device="cuda")
    garbage = torch.where(torch.ones(70, 70, dtype=torch.bool, device="cuda").triu(1), math.nan, A)
    W, V, info = kl.eigh_multi_gpu(garbage, block_size=16, check=True)
    assert int(info) == 0
    assert_eigenpairs(A, W, V, 1e-10)
    garbage[69, 0] = -math.inf
    with pytest.raises(kl.LinalgError, match=r"entry \(\): the lower triangle of A holds a NaN"):
        kl.eigh_multi_gpu(garbage, block_size=16, check=True)


# --- overwrite flags and autograd --------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("leaf", [True, False], ids=["leaf", "non-leaf"])
@pytest.mark.parametrize(("op", "flag", "target"), OVERWRITES)
def test_overwrite_refuses_a_tensor_that_requires_grad(device, leaf, op, flag, target):
    A = spd(2, n=N, device=device).mT.contiguous().mT  # column-major: in place on either device
    B = rhs(2, 2, N, device=device).mT
    tracked = (A if target == "A" else B).clone().requires_grad_()
    if not leaf:
        tracked = tracked * 1.0
    kept = tracked.detach().clone()
    args = (tracked, B) if target == "A" else (A, tracked)
    message = rf"{flag}=True would write over {target}, which requires grad .* pass {flag}=False"
    with pytest.raises(ValueError, match=message):
        OPS[op](*args, **{flag: True})
    with torch.no_grad(), pytest.raises(ValueError, match=message):
        OPS[op](*args, **{flag: True})
    assert torch.equal(tracked.detach(), kept), "nothing was written"
    _outputs, info = OPS[op](*args)  # without the flag the call goes ahead
    assert (info == 0).all()


def test_multi_gpu_eigh_refuses_to_overwrite_a_tensor_that_requires_grad():
    A = torch.eye(3, requires_grad=True)
    with pytest.raises(ValueError, match=r"overwrite_a=True would write over A, which requires grad"):
        kl.eigh_multi_gpu(A, overwrite_a=True)
