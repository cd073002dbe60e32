"""Kernel products and gradient products with few rows split along the sum over `n` (`kermac.product_split`).

On the CPU the split problems run on the reference backend and the Triton interpreter with small slices and are
checked against an independent float64 dense product (`run_kernel` on the reference backend, then `matmul`):
slices with and without a tail, broadcast batches with a hyperparameter per entry, views of z and v, C = 1 and
C > 1; gradient products against the reference backend's unsplit float64 values.  When a split applies: few row
tiles, many columns, no diagonal in the epilogue, float32/float64.  On the GPU `K @ v` and `predictor_gradient`
with a handful of rows against 2·10⁵ columns take the split through the public operations.
"""

from __future__ import annotations

import logging

import pytest
import torch
from helpers import CPU_BACKENDS, assert_close, require_backend, tolerance

import kermac
from kermac import dispatch, presets, product_split
from kermac.hyperparams import program_hypers
from kermac.problem import product_grad_problem, product_problem
from kermac.reference.backend import ReferenceBackend

F64 = torch.float64


def _problem(x, z, v, name="gaussian", regularized=False, **hypers):
    program = presets.ALL[name].lower(regularized=regularized)
    values = program_hypers(program.hypers, hypers, x.device, False)
    return product_problem(program, x, z, v, out=None, hypers=values)


def _dense(name, x, z, v, **hypers) -> torch.Tensor:
    hypers = {k: h.double().cpu() if isinstance(h, torch.Tensor) else h for k, h in hypers.items()}
    k = kermac.run_kernel(name, x.double().cpu(), z.double().cpu(), backend="torch", **hypers)
    return k @ v.double().cpu()


def _split_product(problem, slices: int, backend: str) -> torch.Tensor:
    parts, workspace = product_split.split_problems(problem, slices)
    assert workspace.shape == (slices + (problem.sizes[1] % slices > 0), *problem.out.shape)
    for part in parts:
        dispatch._run(part, backend, "test", "kernel product problem", "M={} N={} D={} C={}", "program")
    return workspace.sum(0)


def _grad_problem(x, z, v, g, name, **hypers):
    program = presets.ALL[name].lower()
    values = program_hypers(program.hypers, hypers, x.device, False)
    return product_grad_problem(program, x, z, v, g, out=None, hypers=values)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize(
    ("name", "m", "n", "d", "c", "slices"), [("laplace_l1", 3, 41, 4, 2, 4), ("gaussian", 2, 30, 19, 1, 3)]
)
def test_gradient_product_slices_sum_to_the_unsplit_gradient(backend, name, m, n, d, c, slices) -> None:
    """d = 19 takes the Triton kernel's accumulation in `out` (more features than it holds in registers)."""
    require_backend(backend, "cpu", "product_grad")
    dtype = F64 if backend == "torch" else torch.float32
    x, z, v, g = (torch.randn(*s, dtype=dtype) for s in ((2, m, d), (n, d), (n, c), (2, m, c)))
    out = _split_product(_grad_problem(x, z, v, g, name, bandwidth=2.0), slices, backend)
    whole = _grad_problem(*(t.double() for t in (x, z, v, g)), name, bandwidth=2.0)
    ReferenceBackend().product_grad(whole)
    assert_close(out, whole.out, tolerance(dtype))


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize(("m", "n", "c", "slices"), [(3, 40, 1, 4), (5, 43, 3, 4), (1, 17, 2, 5), (2, 9, 1, 9)])
def test_slices_sum_to_the_dense_product(backend: str, m: int, n: int, c: int, slices: int) -> None:
    require_backend(backend, "cpu", "product")
    dtype = F64 if backend == "torch" else torch.float32
    x, z, v = (torch.randn(*s, dtype=dtype) for s in ((m, 4), (n, 4), (n, c)))
    out = _split_product(_problem(x, z, v, bandwidth=1.5), slices, backend)
    assert_close(out, _dense("gaussian", x, z, v, bandwidth=1.5), tolerance(dtype))


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_batches_views_and_a_bandwidth_per_entry(backend: str) -> None:
    require_backend(backend, "cpu", "product")
    dtype = F64 if backend == "torch" else torch.float32
    x = torch.randn(2, 1, 3, 5, dtype=dtype)  # broadcast over the second batch dimension
    z = torch.randn(2, 3, 5, 29, dtype=dtype).mT  # a transposed view [2, 3, 29, 5]
    v = torch.randn(3, 58, 2, dtype=dtype)[:, ::2]  # every other row [3, 29, 2]
    bandwidth = torch.tensor([[1.0], [2.5]], dtype=dtype)  # [2, 1]
    out = _split_product(_problem(x, z, v, name="laplace_l1", bandwidth=bandwidth), 3, backend)
    reference = _dense("laplace_l1", x.expand(2, 3, 3, 5), z, v.expand(2, 3, 29, 2), bandwidth=bandwidth)
    assert_close(out, reference, tolerance(dtype))


def _sized(m: int, n: int, c: int, dtype=torch.float32, batch=(), **kw):
    x, z, v = torch.zeros(*batch, m, 2, dtype=dtype), torch.zeros(n, 2, dtype=dtype), torch.zeros(n, c, dtype=dtype)
    return _problem(x, z, v, **kw)


def test_when_a_product_is_split() -> None:
    """Few row tiles and many columns: enough slices for two programs per multiprocessor, each slice of at least
    `MIN_SLICE` columns; never with the diagonal, half dtypes, enough rows, or too few columns."""
    count = product_split.split_count
    assert count(_sized(100, 10**6, 1, bandwidth=1.0), 132) == 10**6 // product_split.MIN_SLICE  # 2 row tiles: 132
    assert count(_sized(100, 10**7, 1, bandwidth=1.0), 132) == 132  # 2 row tiles: 2·132 programs in 132 slices
    assert count(_sized(1001, 10**6, 1, bandwidth=1.0), 132) == 17  # 16 row tiles
    assert count(_sized(100, 5 * product_split.MIN_SLICE, 1, bandwidth=1.0), 132) == 5  # slices of MIN_SLICE
    assert count(_sized(100, 10**6, 200, bandwidth=1.0), 132) == 33  # 2 × 4 tiles with 200 columns of v
    assert count(_sized(100, 10**6, 1, batch=(60,), bandwidth=1.0), 132) == 3  # 120 tiles over the batch
    assert count(_sized(100, 10**6, 1, batch=(70,), bandwidth=1.0), 132) == 1  # 140 tiles over the batch
    assert count(_sized(64 * 132, 10**6, 1, bandwidth=1.0), 132) == 1  # a tile per multiprocessor already
    assert count(_sized(100, product_split.MIN_SLICE, 1, bandwidth=1.0), 132) == 1  # one slice's worth
    assert count(_sized(100, 10**6, 1, regularized=True, bandwidth=1.0, regularization=0.1), 132) == 1
    assert count(_sized(100, 10**6, 1, dtype=torch.float16, bandwidth=1.0), 132) == 1
    assert count(_sized(100, 10**7, 1, dtype=F64, bandwidth=1.0), 132) == 132
    assert count(_sized(0, 10**6, 1, bandwidth=1.0), 132) == 1
    x, z, v = torch.zeros(100, 2), torch.zeros(10**7, 2), torch.zeros(10**7, 200)
    gradient = _grad_problem(x, z, v, torch.zeros(100, 200), "gaussian", bandwidth=1.0)
    assert count(gradient, 132) == 132  # each program takes every column of v: 2 row tiles
    with product_split.disabled():
        assert count(gradient, 132) == 1
        with product_split.disabled():
            pass
        assert count(gradient, 132) == 1  # a nested block leaves the outer one as it was
    assert count(gradient, 132) == 132


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["nvrtc", "triton"])
@pytest.mark.parametrize(("m", "c"), [(5, 1), (77, 16)])
def test_few_rows_on_the_gpu(backend: str, m: int, c: int, caplog: pytest.LogCaptureFixture) -> None:
    """`K @ v` with a handful of rows against 2·10⁵ + 3 columns (a tail) through the public operation."""
    require_backend(backend, "cuda", "product")
    x, z, v = (torch.randn(*s, dtype=F64).float().cuda() for s in ((m, 8), (200_003, 8), (200_003, c)))
    K = kermac.KernelOperator("laplace_l2", x, z, bandwidth=3.0, backend=backend, debug=True)
    assert product_split.split_count(_problem(x, z, v, name="laplace_l2", bandwidth=3.0), 132) > 1
    with caplog.at_level(logging.DEBUG, logger="kermac"):
        out = K @ v
    assert "slices of the columns" in caplog.text
    assert_close(out, _dense("laplace_l2", x, z, v, bandwidth=3.0), tolerance(torch.float32))


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["laplace_l2", "laplace_l1"])
@pytest.mark.parametrize("d", [8, 40])
def test_few_rows_predictor_gradient_on_the_gpu(kernel: str, d: int, caplog: pytest.LogCaptureFixture) -> None:
    """`predictor_gradient` at 50 points against 2·10⁵ + 3 centres (a tail): Laplace-L2 as one product of
    C + C·D columns, Laplace-L1 as gradient products (D = 40 accumulating in `out`)."""
    require_backend("triton", "cuda", "product_grad")
    x, z, alpha = (torch.randn(*s, dtype=F64).float().cuda() for s in ((50, d), (200_003, d), (200_003, 3)))
    with caplog.at_level(logging.DEBUG, logger="kermac"):
        out = kermac.predictor_gradient(kernel, x, z, alpha, bandwidth=3.0, debug=True)
    assert "slices of the columns" in caplog.text
    reference = kermac.predictor_gradient(kernel, *(t.double().cpu() for t in (x, z, alpha)), bandwidth=3.0)
    assert_close(out, reference, tolerance(torch.float32))
