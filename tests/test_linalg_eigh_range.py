"""kermac_linalg.eigh_range (index, value and top-k selections) against float64 references."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from linalg_helpers import DEVICES, DTYPES

import kermac_linalg as kl

TOL = {torch.float32: 2e-5, torch.float64: 1e-12}


def with_spectrum(values: torch.Tensor, dtype=torch.float64, device="cpu", seed=0) -> torch.Tensor:
    """Q diag(values) Qᵀ for random orthogonal Q; ``values [..., N]`` sets every entry's spectrum."""
    g = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(*values.shape, values.shape[-1], generator=g, dtype=torch.float64))
    A = (Q * values.double()[..., None, :]) @ Q.mT
    return ((A + A.mT) / 2).to(dtype=dtype, device=device)


def kernel_matrix(n: int, dtype=torch.float64, device="cpu") -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(n, 5, generator=g, dtype=torch.float64)
    return torch.exp(-torch.cdist(x, x)).to(dtype=dtype, device=device)


def assert_pairs(A: torch.Tensor, W: torch.Tensor, V: torch.Tensor, expected: torch.Tensor, tol: float) -> None:
    """W equals the expected eigenvalues; V's columns are orthonormal eigenvectors of A."""
    A64, W64, V64 = A.double().cpu(), W.double().cpu(), V.double().cpu()
    scale = torch.linalg.matrix_norm(A64, ord=2).clamp(min=1).max()
    assert W.shape == expected.shape and V.shape == (*expected.shape[:-1], A.shape[-1], expected.shape[-1])
    assert (W64 - expected).abs().max() <= tol * scale
    n = A.shape[-1]
    assert (A64 @ V64 - V64 * W64[..., None, :]).norm(dim=(-2, -1)).max() <= tol * scale * n**0.5
    eye = torch.eye(W.shape[-1], dtype=torch.float64)
    assert (V64.mT @ V64 - eye).norm(dim=(-2, -1)).max() <= tol * n


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("il, iu", [(0, 0), (3, 9), (0, 39), (39, 39)])
def test_index_range(device, dtype, il, iu):
    A = with_spectrum(torch.randn(2, 40), dtype=dtype, device=device)
    A0 = A.clone()
    W, V, info = kl.eigh_range(A, il=il, iu=iu)
    expected = torch.linalg.eigvalsh(A0.double().cpu())[..., il : iu + 1]
    assert info.shape == (2,) and (info == 0).all()
    assert_pairs(A0, W, V, expected, TOL[dtype])
    assert torch.equal(A, A0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_top_k_of_a_kernel_matrix(device, dtype):
    K = kernel_matrix(120, dtype=dtype, device=device)
    W, V, _info = kl.eigh_range(K, top_k=8)
    expected = torch.linalg.eigvalsh(K.double().cpu())[-8:]
    assert_pairs(K, W, V, expected, TOL[dtype])
    assert W[-1] == W.max(), "ascending: the largest eigenvalue last"


@pytest.mark.parametrize("device", DEVICES)
def test_one_sided_index_ranges(device):
    A = with_spectrum(torch.arange(10.0), device=device)
    W, _, _ = kl.eigh_range(A, il=7)
    assert torch.allclose(W.cpu(), torch.tensor([7.0, 8.0, 9.0], dtype=torch.float64), atol=1e-12)
    W, _, _ = kl.eigh_range(A, iu=1)
    assert torch.allclose(W.cpu(), torch.tensor([0.0, 1.0], dtype=torch.float64), atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_value_range_is_half_open_and_padded(device, dtype):
    spectra = torch.tensor(
        [[-3.0, -1.0, 0.5, 1.0, 1.75, 4.0], [-2.0, -0.5, 1.5, 5.0, 6.0, 7.0], [3.0, 3.5, 5.5, 6.0, 7.0, 8.0]]
    )
    A = with_spectrum(spectra, dtype=dtype, device=device)
    W, V, info = kl.eigh_range(A, vl=0.0, vu=2.0)  # in (0, 2]: three | one | none
    assert (info == 0).all() and W.shape == (3, 3) and V.shape == (3, 6, 3)
    expected = torch.tensor([[0.5, 1.0, 1.75], [1.5, math.nan, math.nan], [math.nan] * 3], dtype=torch.float64)
    assert torch.equal(W.isnan().cpu(), expected.isnan()) and torch.equal(V.isnan().all(-2).cpu(), expected.isnan())
    assert (W.double().cpu() - expected).nan_to_num().abs().max() <= 1e-5
    assert_pairs(A[0], W[0], V[0], expected[0], TOL[dtype])
    assert_pairs(A[1], W[1, :1], V[1, :, :1], expected[1, :1], TOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
def test_value_range_excludes_vl_and_includes_vu(device):
    A = torch.diag(torch.tensor([0.0, 1.0, 2.0, 3.0], dtype=torch.float64)).to(device)
    W, _, _ = kl.eigh_range(A, vl=1.0, vu=2.0)
    assert W.shape == (1,) and abs(W.item() - 2.0) <= 1e-12


@pytest.mark.parametrize("device", DEVICES)
def test_value_range_with_open_sides(device):
    A = with_spectrum(torch.tensor([-2.0, -1.0, 1.0, 3.0]), device=device)
    W, _, _ = kl.eigh_range(A, vl=0.0)
    assert torch.allclose(W.cpu(), torch.tensor([1.0, 3.0], dtype=torch.float64), atol=1e-12)
    W, _, _ = kl.eigh_range(A, vu=-0.5)
    assert torch.allclose(W.cpu(), torch.tensor([-2.0, -1.0], dtype=torch.float64), atol=1e-12)
    W, V, info = kl.eigh_range(A, vl=10.0, vu=11.0)
    assert W.shape == (0,) and V.shape == (4, 0) and info.item() == 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["row-major", "column-major"])
def test_overwrite_a_returns_a_view_of_a(device, layout):
    A = with_spectrum(torch.randn(2, 12), device=device)
    if layout == "column-major":
        A = A.mT.contiguous().mT
    A0 = A.clone()
    W, V, _info = kl.eigh_range(A, top_k=3, overwrite_a=True)
    assert V.data_ptr() == A.data_ptr()
    assert_pairs(A0, W, V, torch.linalg.eigvalsh(A0.cpu())[..., -3:], TOL[torch.float64])


@pytest.mark.parametrize("device", DEVICES)
def test_result_is_compact_without_overwrite(device):
    A = with_spectrum(torch.randn(50), device=device)
    _W, V, _ = kl.eigh_range(A, top_k=2)
    assert V.untyped_storage().nbytes() == 50 * 2 * 8, "no reference to the N x N working copy"
    assert V.stride() == (1, 50)


@pytest.mark.parametrize("device", DEVICES)
def test_failed_entry_is_nan_and_others_valid(device):
    A = with_spectrum(torch.randn(3, 7), device=device)
    A[2] = torch.nan
    W, V, info = kl.eigh_range(A, il=1, iu=3)
    assert (info[:2] == 0).all()
    failed = info != 0
    assert torch.isnan(W[failed]).all() and torch.isnan(V[failed]).all()
    expected = torch.linalg.eigvalsh(A[:2].cpu())[..., 1:4]
    assert_pairs(A[:2], W[:2], V[:2], expected, TOL[torch.float64])


def test_bad_selections_name_the_argument():
    A = torch.eye(5)
    cases = [
        ({}, ValueError, "needs exactly one selection.*got none"),
        ({"il": 0, "vl": 1.0}, ValueError, "got il/iu, vl/vu"),
        ({"top_k": 2, "iu": 3}, ValueError, "got il/iu, top_k"),
        ({"il": 3, "iu": 1}, ValueError, "il must be <= iu.*il=3, iu=1"),
        ({"il": -1}, ValueError, r"il must be in \[0, N\)"),
        ({"iu": 5}, ValueError, r"iu must be in \[0, N\) with N = 5, got 5"),
        ({"il": 1.0}, TypeError, "il must be an int, got float"),
        ({"iu": True}, TypeError, "iu must be an int, got bool"),
        ({"top_k": 0}, ValueError, r"top_k must be in \[1, N\]"),
        ({"top_k": 6}, ValueError, r"top_k must be in \[1, N\]"),
        ({"vl": 2.0, "vu": 1.0}, ValueError, "vl must be < vu"),
        ({"vl": "0"}, TypeError, "vl must be a real number, got str"),
        ({"vu": math.nan}, ValueError, "vu must not be NaN"),
        ({"top_k": 2, "check": 1}, TypeError, "check must be a bool"),
    ]
    for kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            kl.eigh_range(A, **kwargs)
    with pytest.raises(ValueError, match="A must be a square"):
        kl.eigh_range(torch.zeros(3, 2), top_k=1)


def not_certified(caplog) -> bool:
    return any("not certified" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("end", ["top", "bottom"])
def test_iterative_method_matches_the_direct_one(device, dtype, end, caplog):
    K = kernel_matrix(700, dtype=dtype, device=device)
    A = K if end == "top" else -K  # the bottom of -K is well separated, like the top of K
    A0 = A.clone()
    selection = {"top_k": 6} if end == "top" else {"il": 0, "iu": 5}
    with caplog.at_level(logging.DEBUG, logger="kermac.linalg"):
        W, V, info = kl.eigh_range(A, method="iterative", **selection)
    assert not not_certified(caplog), "this case converges: the iterative result must be used"
    all_values = torch.linalg.eigvalsh(A0.double().cpu())
    expected = all_values[-6:] if end == "top" else all_values[:6]
    assert info.item() == 0 and torch.equal(A, A0)
    assert_pairs(A0, W, V, expected, TOL[dtype])
    assert V.stride() == (1, 700)


@pytest.mark.parametrize("device", DEVICES)
def test_iterative_method_finds_the_algebraically_largest(device, caplog):
    """60 eigenvalues of larger magnitude are negative: the top 3 are still the largest values."""
    top = torch.tensor([200.0, 205.0, 210.0])
    values = torch.cat([torch.linspace(-80.0, -60.0, 60), torch.linspace(0.0, 0.05, 300), top])
    A = with_spectrum(values, device=device)
    with caplog.at_level(logging.DEBUG, logger="kermac.linalg"):
        W, V, _ = kl.eigh_range(A, top_k=3, method="iterative")
    assert not not_certified(caplog)
    assert_pairs(A, W, V, top.double(), TOL[torch.float64])


@pytest.mark.parametrize("device", DEVICES)
def test_iterative_method_falls_back_when_it_cannot_certify(device, caplog):
    """Evenly spaced eigenvalues converge too slowly (0.75 per step here): direct solver."""
    A = with_spectrum(torch.linspace(-1.0, 1.0, 150), device=device)
    with caplog.at_level(logging.DEBUG, logger="kermac.linalg"):
        W, V, info = kl.eigh_range(A, top_k=4, method="iterative")
    assert not_certified(caplog)
    assert info.item() == 0
    assert_pairs(A, W, V, torch.linalg.eigvalsh(A.cpu())[-4:], TOL[torch.float64])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("dtype", "scale"), [(torch.float64, 1e300), (torch.float32, 1e25)])
def test_iterative_method_falls_back_when_its_steps_overflow(device, dtype, scale, caplog):
    """Entries past ~1e154 (float64) overflow the Lanczos norms: the direct solver answers."""
    A = kernel_matrix(300, dtype=dtype, device=device) * scale
    with caplog.at_level(logging.DEBUG, logger="kermac.linalg"):
        W, V, info = kl.eigh_range(A, top_k=3, method="iterative")
    assert not_certified(caplog)
    W_direct, V_direct, info_direct = kl.eigh_range(A, top_k=3, method="direct")
    assert torch.equal(info, info_direct)
    torch.testing.assert_close(W, W_direct, equal_nan=True)
    torch.testing.assert_close(V.abs(), V_direct.abs(), equal_nan=True)  # up to each vector's sign
    if device == "cpu":  # LAPACK scales the matrix: the pairs are accurate
        expected = torch.linalg.eigvalsh(A.double().cpu() / scale)[-3:]
        assert info.item() == 0
        assert_pairs(A / scale, W / scale, V, expected, TOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
def test_iterative_method_in_a_batch_with_overwrite(device, caplog):
    K = kernel_matrix(500, device=device)
    A = torch.stack([K, 2 * K + 1e-3 * torch.eye(500, dtype=K.dtype, device=device)])
    A0 = A.clone()
    with caplog.at_level(logging.DEBUG, logger="kermac.linalg"):
        W, V, info = kl.eigh_range(A, top_k=6, method="iterative", overwrite_a=True)
    assert not not_certified(caplog)
    assert V.data_ptr() == A.data_ptr() and (info == 0).all()
    assert_pairs(A0, W, V, torch.linalg.eigvalsh(A0.cpu())[..., -6:], TOL[torch.float64])


def test_certificate_rejects_a_set_that_misses_a_larger_eigenvalue():
    from kermac_linalg._subspace import _certify

    A = with_spectrum(torch.arange(1.0, 51.0))
    W, V = torch.linalg.eigh(A)
    tol, norm = 1e-10, 50.0
    right = _certify(A.clone(), 1.0, 0.0, W[-3:], V[:, -3:], tol, norm, lambda C: torch.linalg.cholesky_ex(C).info)
    wrong = _certify(A.clone(), 1.0, 0.0, W[-4:-1], V[:, -4:-1], tol, norm, lambda C: torch.linalg.cholesky_ex(C).info)
    assert right and not wrong


def test_method_is_checked():
    A = torch.eye(300)
    with pytest.raises(ValueError, match="method must be one of auto, direct, iterative; got 'lanczos'"):
        kl.eigh_range(A, top_k=2, method="lanczos")
    with pytest.raises(TypeError, match="method must be a str"):
        kl.eigh_range(A, top_k=2, method=None)
    with pytest.raises(ValueError, match="method='iterative' needs an index range at one end"):
        kl.eigh_range(A, il=3, iu=5, method="iterative")
    with pytest.raises(ValueError, match="method='iterative' needs an index range at one end"):
        kl.eigh_range(A, vl=0.5, method="iterative")
    with pytest.raises(ValueError, match="method='iterative' needs an index range at one end"):
        kl.eigh_range(A, top_k=150, method="iterative")
