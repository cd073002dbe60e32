"""Kernel products run as row blocks of K and matrix products (`kermac.product_blocked`).

On the CPU the route is forced (`applies` patched, blocks of a few rows) through `kermac.kernel_product` on the
reference backend and the Triton interpreter and checked against an independent float64 dense product: rows that
are no multiple of the block, one and several columns, a regularised diagonal with either offset, a transposed
`out`, NaN in `v`, the Gaussian's predictor gradient.  When it applies: the measured rule (`faster_blocked`) on
`meta` problems, only `backend="auto"` on a CUDA device.  On the GPU `auto` takes it for a Laplace-L1 product with
128 features and a Gaussian one with 80 columns, and matches float64.
"""

from __future__ import annotations

import logging

import pytest
import torch
from helpers import CPU_BACKENDS, assert_close, require_backend, tolerance

import kermac
from kermac import presets, product_blocked
from kermac.hyperparams import program_hypers
from kermac.problem import product_problem

F64 = torch.float64


def _dense(name, x, z, v, **kw) -> torch.Tensor:
    k = kermac.run_kernel(name, x.double().cpu(), z.double().cpu(), backend="torch", **kw)
    return k @ v.double().cpu()


@pytest.fixture
def forced(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every product takes the blocked route, in blocks of 7 rows' worth of entries; the block counts are listed."""
    counts: list[int] = []
    real = product_blocked.block_problems

    def spy(problem):
        blocks = real(problem)
        counts.append(len(blocks))
        return blocks

    monkeypatch.setattr(product_blocked, "applies", lambda problem, backend: True)
    monkeypatch.setattr(product_blocked, "block_problems", spy)
    monkeypatch.setattr(product_blocked, "BLOCK_ELEMENTS", 7 * 23)
    return counts


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize(("m", "c"), [(30, 1), (19, 3), (5, 2)])
def test_blocks_match_the_dense_product(backend: str, m: int, c: int, forced: list[int]) -> None:
    require_backend(backend, "cpu", "product")
    dtype = F64 if backend == "torch" else torch.float32
    x, z, v = torch.randn(m, 40, dtype=dtype), torch.randn(23, 40, dtype=dtype), torch.randn(23, c, dtype=dtype)
    got = kermac.kernel_product("laplace_l1", x, z, v, bandwidth=9.0, backend=backend)
    assert_close(got, _dense("laplace_l1", x, z, v, bandwidth=9.0), tolerance(dtype))
    assert forced == [-(-m // 7)]


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_a_shifted_diagonal_a_transposed_out_and_nan(backend: str, forced: list[int]) -> None:
    require_backend(backend, "cpu", "product")
    dtype = F64 if backend == "torch" else torch.float32
    x, v = torch.randn(23, 33, dtype=dtype), torch.randn(23, 3, dtype=dtype)
    hypers = {"bandwidth": 7.0, "regularization": 0.5}
    for offsets in ({"offset_m": 4}, {"offset_n": 9}):
        out = torch.full((3, 23), float("nan"), dtype=dtype).t()
        got = kermac.kernel_product("laplace_l1", x, x, v, out=out, backend=backend, **hypers,
                                    **offsets)  # fmt: skip
        assert got is out
        assert_close(out, _dense("laplace_l1", x, x, v, **hypers, **offsets), tolerance(dtype))
    v[5, 1] = float("nan")
    got = kermac.kernel_product("laplace_l1", x, x, v, bandwidth=7.0, backend=backend)
    assert torch.isnan(got[:, 1]).all() and torch.isfinite(got[:, [0, 2]]).all()
    assert forced == [4, 4, 4]


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_a_predictor_gradient_in_blocks(backend: str, forced: list[int]) -> None:
    """The Gaussian's predictor gradient is one product of `C·(D + 1)` columns; in blocks it matches float64."""
    require_backend(backend, "cpu", "product")
    dtype = F64 if backend == "torch" else torch.float32
    x, z, alpha = torch.randn(19, 4, dtype=dtype), torch.randn(23, 4, dtype=dtype), torch.randn(23, 3, dtype=dtype)
    got = kermac.predictor_gradient("gaussian", x, z, alpha, bandwidth=2.5, backend=backend)
    xd = x.double().requires_grad_()
    f = kermac.run_kernel("gaussian", xd, z.double(), bandwidth=2.5, backend="torch") @ alpha.double()
    want = torch.stack([torch.autograd.grad(f[:, i].sum(), xd, retain_graph=True)[0] for i in range(3)], dim=1)
    assert_close(got, want, tolerance(dtype))
    assert forced == [-(-19 // 7)]


def _meta_problem(name: str, m: int, n: int, d: int, c: int, dtype=torch.float32, batch=()):
    program = presets.ALL[name].lower()
    x = torch.empty(*batch, m, d, dtype=dtype, device="meta")
    z = torch.empty(*batch, n, d, dtype=dtype, device="meta")
    v = torch.empty(*batch, n, c, dtype=dtype, device="meta")
    return product_problem(
        program, x, z, v, out=None, hypers=program_hypers(program.hypers, {"bandwidth": 2.0}, x.device, False)
    )


def test_the_measured_rule() -> None:
    big = 1 << 15
    assert product_blocked.faster_blocked(_meta_problem("laplace_l1", big, big, 128, 1))
    assert product_blocked.faster_blocked(_meta_problem("laplace_l1", big, big, 32, 16))
    assert not product_blocked.faster_blocked(_meta_problem("laplace_l1", big, big, 32, 1))  # fused is faster
    assert not product_blocked.faster_blocked(_meta_problem("laplace_l1", big, big, 16, 16))
    assert not product_blocked.faster_blocked(_meta_problem("gaussian", big, big, 784, 16))  # tensor cores
    assert product_blocked.faster_blocked(_meta_problem("gaussian", big, big, 3, 65))  # ... with many columns
    assert product_blocked.faster_blocked(_meta_problem("laplace_l2", big, big, 128, 528))
    assert not product_blocked.faster_blocked(_meta_problem("gaussian", big, big, 128, 64))
    assert not product_blocked.faster_blocked(_meta_problem("gaussian", big, big, 3, 65, F64))  # SIMT in float64
    assert not product_blocked.faster_blocked(_meta_problem("gaussian", 1000, 1000, 3, 65))  # small
    assert not product_blocked.faster_blocked(_meta_problem("laplace_l1", big, big, 128, 1, F64))
    assert not product_blocked.faster_blocked(_meta_problem("laplace_l1", 2, big, 128, 1, batch=(2,)))
    assert not product_blocked.faster_blocked(_meta_problem("laplace_l1", 1000, 1000, 128, 1))  # small
    assert not product_blocked.faster_blocked(_meta_problem("laplace_l1", big, big, 128, 0))  # nothing to compute
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")  # TF32 would round K in the product with v
        assert not product_blocked.faster_blocked(_meta_problem("laplace_l1", big, big, 128, 1))
    finally:
        torch.set_float32_matmul_precision(previous)


def test_only_auto_on_a_cuda_device() -> None:
    problem = _meta_problem("laplace_l1", 1 << 15, 1 << 15, 128, 1)
    assert product_blocked.faster_blocked(problem)
    assert not product_blocked.applies(problem, "auto")  # a meta device
    x = torch.randn(600, 128)
    program = presets.ALL["laplace_l1"].lower()
    hypers = program_hypers(program.hypers, {"bandwidth": 2.0}, x.device, False)
    cpu = product_problem(program, x, x, x[:, :1], out=None, hypers=hypers)
    assert not product_blocked.applies(cpu, "auto")


@pytest.mark.gpu
def test_auto_takes_blocks_on_the_gpu(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    m, n, d = 1 << 14, (1 << 14) + 3, 128
    x, z, v = torch.randn(m, d, device="cuda"), torch.randn(n, d, device="cuda"), torch.rand(n, 1, device="cuda")
    with caplog.at_level(logging.DEBUG, logger="kermac"):
        got = kermac.kernel_product("laplace_l1", x, z, v, bandwidth=100.0, debug=True)
    assert "blocks and matrix products" in caplog.text
    rows = torch.cat([torch.arange(40), torch.arange(m - 40, m)]).cuda()
    assert_close(got[rows], _dense("laplace_l1", x[rows], z, v, bandwidth=100.0), tolerance(torch.float32))


@pytest.mark.gpu
def test_auto_takes_blocks_for_many_columns_of_a_tensor_core_program(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    m, n, d, c = 1 << 14, (1 << 14) + 3, 32, 80
    x, z, v = torch.randn(m, d, device="cuda"), torch.randn(n, d, device="cuda"), torch.randn(n, c, device="cuda")
    with caplog.at_level(logging.DEBUG, logger="kermac"):
        got = kermac.kernel_product("gaussian", x, z, v, bandwidth=8.0, debug=True)
    assert "blocks and matrix products" in caplog.text
    rows = torch.cat([torch.arange(40), torch.arange(m - 40, m)]).cuda()
    assert_close(got[rows], _dense("gaussian", x[rows], z, v, bandwidth=8.0), tolerance(torch.float32))
