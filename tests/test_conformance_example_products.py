"""The example plugin of examples/kermac-backend-numpy computes kernel products (registered in-process as in
tests/test_example_plugin.py, whose fixture this module uses): by blocks of rows, each contracted with `v`."""

from __future__ import annotations

import pytest
import torch
from test_example_plugin import example_plugin  # noqa: F401  (autouse: the example registered per test)

import kermac
from kermac import presets, testing
from kermac.errors import UnsupportedProblemError


def test_products_by_blocks_of_rows_keep_the_diagonal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Several blocks of rows, each multiplied by `v` into its own rows of `out`, with the shifted diagonal
    of a regularised kernel on the right rows of every block; batched, transposed and strided inputs."""
    from kermac_backend_numpy import backend

    monkeypatch.setattr(backend, "BLOCK_ELEMENTS", 3 * 2 * 11 * 5)  # 3 rows of a [2, rows, 11, 5] block
    x, z = torch.randn(2, 13, 5, dtype=torch.float64), torch.randn(5, 11, dtype=torch.float64).mT
    v = torch.randn(2, 11, 6, dtype=torch.float64)[..., ::2]
    program = presets.matern52.lower(regularized=True)
    hypers = {"bandwidth": 1.3, "regularization": 0.5}
    for offsets in ({"offset_m": 0, "offset_n": 4}, {"offset_m": 6, "offset_n": 0}):
        testing.assert_product_conforms("numpy", program, x, z, v, hypers=hypers, **offsets)
        u = torch.randn(13, 2, dtype=torch.float64)
        testing.assert_product_conforms("numpy", program, x, z, u, hypers=hypers, transpose=True, **offsets)


def test_the_operator_runs_on_it() -> None:
    x, z, v = torch.randn(9, 4), torch.randn(7, 4), torch.randn(7, 3)
    k = kermac.KernelOperator("gaussian", x, z, bandwidth=1.5, backend="numpy")
    expected = kermac.run_kernel("gaussian", x.double(), z.double(), bandwidth=1.5) @ v.double()
    torch.testing.assert_close((k @ v).double(), expected, rtol=1e-5, atol=1e-6)


def test_half_products_are_refused_with_a_reason() -> None:
    x = torch.randn(4, 3, dtype=torch.float16)
    v = torch.randn(4, 2, dtype=torch.float16)
    with pytest.raises(UnsupportedProblemError, match=r"float32 and float64 only, got torch\.float16"):
        kermac.kernel_product("gaussian", x, x, v, bandwidth=1.0, backend="numpy")
