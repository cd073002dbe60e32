"""`kermac.KernelOperator`: products, transpose, diagonal, dense form and lazy slices against the float64
kernel matrix of `run_kernel` / `run_program` on the reference backend."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import BACKEND_DEVICES, require_backend

import kermac
from kermac import ir

F64 = torch.float64


def _randn(*shape: int, dtype: torch.dtype = F64, seed: int = 0, device: str = "cpu") -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64).to(dtype=dtype, device=device)


def _dtype(backend: str) -> torch.dtype:
    return F64 if backend == "torch" else torch.float32


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    tol = 1e-11 if actual.dtype == F64 else 2e-5
    torch.testing.assert_close(actual.double().cpu(), expected.double().cpu(), rtol=tol, atol=tol)


def _operands(dtype: torch.dtype, device: str = "cpu"):
    x, z = _randn(2, 9, 4, dtype=dtype, seed=1, device=device), _randn(12, 4, dtype=dtype, seed=2, device=device)
    bw = torch.tensor([0.8, 1.9], dtype=dtype, device=device)
    return x, z, bw


KW = {"regularization": 0.5, "offset_m": 1, "offset_n": 3}


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
def test_products_transpose_and_dense(backend: str, device: str) -> None:
    require_backend(backend, device, "product")
    dtype = _dtype(backend)
    x, z, bw = _operands(dtype, device)
    k = kermac.KernelOperator("laplace_l2", x, z, bandwidth=bw, backend=backend, **KW)
    x64, z64, bw64 = (t.double().cpu() for t in (x, z, bw))
    dense = kermac.run_kernel("laplace_l2", x64, z64, bandwidth=bw64, backend="torch", **KW)
    assert k.shape == torch.Size([2, 9, 12]) and k.dtype == dtype and k.device == x.device
    assert k.T.shape == torch.Size([2, 12, 9]) and k.mT.shape == k.T.shape
    _close(k.to_dense(), dense)
    v, v1 = _randn(12, 3, dtype=dtype, device=device, seed=3), _randn(12, dtype=dtype, device=device, seed=4)
    _close(k @ v, dense @ v.double().cpu())
    _close(k.matmul(v1), dense @ v1.double().cpu())
    assert (k @ v1).shape == (2, 9)
    u = _randn(2, 9, 2, dtype=dtype, device=device, seed=5)
    _close(k.T @ u, dense.mT @ u.double().cpu())
    _close(k.T.T @ v, dense @ v.double().cpu())
    _close(k.T.to_dense(), dense.mT)
    w = _randn(2, 9, dtype=dtype, device=device, seed=6)
    _close(w[:, None, :] @ k, w.double().cpu()[:, None, :] @ dense)  # u @ K


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
@pytest.mark.parametrize(("m", "n", "offsets"), [(9, 12, (0, 0)), (9, 12, (2, 2)), (12, 9, (0, 1)), (5, 5, (3, 0))])
def test_diagonal(backend: str, device: str, m: int, n: int, offsets: tuple[int, int]) -> None:
    """`K[..., i, i]` over min(M, N), regularisation included exactly where `offset_m == offset_n`."""
    require_backend(backend, device, "pairwise")
    dtype = _dtype(backend)
    x, z = _randn(2, m, 4, dtype=dtype, device=device, seed=1), _randn(n, 4, dtype=dtype, device=device, seed=2)
    bw = torch.tensor([0.8, 1.9], dtype=dtype, device=device)
    kw = {"bandwidth": bw, "regularization": torch.tensor([0.5, -2.0], dtype=dtype, device=device)}
    om, on = offsets
    k = kermac.KernelOperator("gaussian", x, z, offset_m=om, offset_n=on, backend=backend, **kw)
    kw64 = {name: value.double().cpu() for name, value in kw.items()}
    x64, z64 = x.double().cpu(), z.double().cpu()
    dense = kermac.run_kernel("gaussian", x64, z64, offset_m=om, offset_n=on, backend="torch", **kw64)
    diag = k.diagonal()
    assert diag.shape == (2, min(m, n))
    _close(diag, torch.diagonal(dense, dim1=-2, dim2=-1))
    _close(k.T.diagonal(), diag)


def test_slices_stay_lazy_and_keep_the_global_diagonal() -> None:
    x, z, bw = _operands(F64)
    k = kermac.KernelOperator("matern52", x, z, bandwidth=bw, **KW)
    dense = k.to_dense()
    cases = [
        ((slice(2, 7),), (slice(2, 7), slice(None))),
        ((slice(None), slice(4, 11)), (slice(None), slice(4, 11))),
        ((slice(3, 8), slice(1, 6)), (slice(3, 8), slice(1, 6))),
        ((slice(-4, None), slice(None, -2)), (slice(-4, None), slice(None, -2))),
        ((slice(5, 2),), (slice(5, 2), slice(None))),
    ]
    for key, (rows, cols) in cases:
        part = k[key if len(key) == 2 else key[0]]
        assert isinstance(part, kermac.KernelOperator)
        expected = dense[..., rows, cols]
        assert part.shape == expected.shape
        _close(part.to_dense(), expected)
        v = _randn(expected.shape[-1], 2, seed=7)
        _close(part @ v, expected @ v)
        _close(part.diagonal(), torch.diagonal(expected, dim1=-2, dim2=-1))
        _close(part.T @ _randn(expected.shape[-2], 1, seed=8), expected.mT @ _randn(expected.shape[-2], 1, seed=8))
    assert k[2:5].x.data_ptr() == x[..., 2:5, :].data_ptr()  # a view of x: nothing copied


def test_a_program_with_hyperparameters_as_keywords() -> None:
    xv, zv, s = ir.Var("x"), ir.Var("z"), ir.Hyper("scale")
    program = kermac.PairwiseProgram(
        abs(xv - zv) * s, "max", ir.exp(-ir.Var("acc")) + ir.select(ir.Var("diag"), 1.0, 0.0)
    )
    x, z = _randn(3, 7, 2, seed=1), _randn(3, 7, 2, seed=2)
    scale = torch.tensor([0.5, 1.0, 2.0], dtype=F64)
    k = kermac.KernelOperator(program, x, z, scale=scale)
    dense = kermac.run_program(program, x, z, hypers={"scale": scale}, backend="torch")
    _close(k.to_dense(), dense)
    _close(k.diagonal(), torch.diagonal(dense, dim1=-2, dim2=-1))
    v = _randn(7, 3, seed=3)
    _close(k @ v, dense @ v)
    assert "KernelOperator('program', shape=[3, 7, 7]" in repr(k)


def test_gradients_flow_through_products() -> None:
    x, z, bw = _operands(F64)
    x, z = x.clone().requires_grad_(), z.clone().requires_grad_()
    v = _randn(12, 2, seed=3).requires_grad_()

    def f(x, z, v):
        return kermac.KernelOperator("gaussian", x, z, bandwidth=bw, **KW) @ v

    assert torch.autograd.gradcheck(f, (x, z, v))


def test_repr_and_shape_of_an_empty_operator() -> None:
    k = kermac.KernelOperator("laplace_l1", torch.empty(0, 3), torch.empty(4, 3), bandwidth=1.0, offset_n=2)
    assert repr(k) == (
        "KernelOperator('laplace_l1', shape=[0, 4], dtype=torch.float32, device=cpu, offset_m=0, offset_n=2, "
        "backend='auto')"
    )
    assert (k @ torch.ones(4, 2)).shape == (0, 2) and k.diagonal().shape == (0,)
    k2 = kermac.KernelOperator("laplace_l1", torch.ones(3, 2), torch.empty(0, 2), bandwidth=1.0)
    assert torch.equal(k2 @ torch.empty(0, 2), torch.zeros(3, 2))


def test_bad_input_is_named() -> None:
    x, z = _randn(4, 3), _randn(6, 3)
    with pytest.raises(ValueError, match=r"z: expected 3 features in the last dimension \(as x\)"):
        kermac.KernelOperator("gaussian", x, _randn(6, 2), bandwidth=1.0)
    with pytest.raises(TypeError, match=r"z: expected dtype torch\.float64 \(the dtype of x\), got torch\.float32"):
        kermac.KernelOperator("gaussian", x, z.float(), bandwidth=1.0)
    with pytest.raises(ValueError, match="batch dimensions do not broadcast"):
        kermac.KernelOperator("gaussian", _randn(2, 4, 3), _randn(3, 6, 3), bandwidth=1.0)
    with pytest.raises(ValueError, match="bandwidth: required by descriptor"):
        kermac.KernelOperator("gaussian", x, z)
    with pytest.raises(ValueError, match="kernel: expected a KernelDescriptor or a preset name"):
        kermac.KernelOperator("nope", x, z)
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['scale'\]"):
        kermac.KernelOperator("gaussian", x, z, bandwidth=1.0, scale=2.0)
    k = kermac.KernelOperator("gaussian", x, z, bandwidth=1.0)
    with pytest.raises(ValueError, match=r"v: expected size 6 in dimension -2 to match N"):
        k @ _randn(4, 2)
    with pytest.raises(TypeError, match=r"v: expected dtype torch\.float64 \(the dtype of x\), got torch\.float32"):
        k @ torch.ones(6, 2)
    with pytest.raises(TypeError, match="key: expected slices of rows"):
        k[1]
    with pytest.raises(TypeError, match="key: expected slices of columns"):
        k[:, 1]
    with pytest.raises(ValueError, match="key: expected a slice of rows with step 1, got step 2"):
        k[::2]
    with pytest.raises(IndexError, match=r"key: expected a row slice or \(row slice, column slice\), got 3 indices"):
        k[:, :, :]


def test_batched_hyperparameters_set_the_batch_shape() -> None:
    k = kermac.KernelOperator(
        "gaussian", _randn(5, 2), _randn(3, 2), bandwidth=torch.tensor([1.0, 2.0, 3.0], dtype=F64)
    )
    assert k.shape == (3, 5, 3)
    assert k.diagonal().shape == (3, 3)
    expected = torch.stack(
        [kermac.run_kernel("gaussian", _randn(5, 2), _randn(3, 2), bandwidth=b) for b in (1.0, 2.0, 3.0)]
    )
    _close(k.diagonal(), torch.diagonal(expected, dim1=-2, dim2=-1))
    assert math.isclose(float(k.diagonal()[0, 0]), 1.0)


def test_an_operator_built_outside_compile_traces_into_one_graph() -> None:
    """Products, transposes, slices and the diagonal of a held operator under `torch.compile(fullgraph=True)`."""
    x, z, bw = _operands(F64)
    k = kermac.KernelOperator("gaussian", x, z, bandwidth=bw, **KW)
    v = _randn(12, 2, seed=3)

    def f(k, v):
        y = k.matmul(v)
        return y, k.T.matmul(y), k[1:3, 2:].diagonal(), k[:, 1:4].T.matmul(y)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    for got, expected in zip(compiled(k, v), f(k, v), strict=True):
        _close(got, expected)


def test_regularization_is_the_checked_lambda() -> None:
    x = torch.randn(5, 3, dtype=torch.float64)
    assert kermac.KernelOperator("gaussian", x, x, bandwidth=1.0).regularization is None
    assert kermac.KernelOperator("gaussian", x, x, bandwidth=1.0, regularization=0.5).regularization == 0.5
    lam = torch.tensor([0.1, 0.2], dtype=torch.float64)
    got = kermac.KernelOperator("gaussian", x, x, bandwidth=1.0, regularization=lam).regularization
    assert isinstance(got, torch.Tensor) and torch.equal(got, lam)


def test_kernel_on_other_points_drops_the_diagonal_term() -> None:
    x, s = torch.randn(7, 3, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)
    K = kermac.KernelOperator("laplace_l2", x, x, bandwidth=1.5, regularization=10.0, offset_m=2, offset_n=2)
    for a, b in ((x, s), (s, s), (x, x)):
        block = K.kernel_on(a, b)
        assert block.shape == (a.shape[0], b.shape[0])
        want = kermac.run_kernel("laplace_l2", a, b, bandwidth=1.5)  # no λ anywhere
        torch.testing.assert_close(block.to_dense(), want, rtol=1e-12, atol=0)
    with pytest.raises(ValueError, match="z: expected 3 features"):
        K.kernel_on(x, torch.randn(4, 2, dtype=torch.float64))
