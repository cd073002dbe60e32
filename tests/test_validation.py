"""Argument validation and broadcasting of the public operations (backend independent)."""

from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kermac

small_batch = st.lists(st.integers(1, 3), min_size=0, max_size=3)


@settings(max_examples=60, deadline=None)
@given(bx=small_batch, bz=small_batch, m=st.integers(1, 4), n=st.integers(1, 4), d=st.integers(1, 3))
def test_batch_broadcasting_follows_torch(bx: list[int], bz: list[int], m: int, n: int, d: int) -> None:
    """Shapes broadcast exactly as torch.cdist's do; non-broadcastable batches raise ValueError."""
    x = torch.randn(*bx, m, d, dtype=torch.float64)
    z = torch.randn(*bz, n, d, dtype=torch.float64)
    try:
        expected = torch.cdist(x, z, p=1.0)
    except RuntimeError:
        with pytest.raises(ValueError, match="batch dimensions do not broadcast"):
            kermac.cdist(x, z, p=1.0)
        return
    out = kermac.cdist(x, z, p=1.0)
    assert out.shape == expected.shape
    torch.testing.assert_close(out, expected)


@settings(max_examples=40, deadline=None)
@given(bx=small_batch, hp=st.lists(st.integers(1, 3), min_size=0, max_size=2))
def test_hyperparameter_shapes_broadcast_with_batch(bx: list[int], hp: list[int]) -> None:
    x = torch.randn(tuple(bx) + (3, 2), dtype=torch.float64)
    z = torch.randn(4, 2, dtype=torch.float64)
    sigma = torch.rand(tuple(hp), dtype=torch.float64) + 0.5
    try:
        batch = torch.broadcast_shapes(tuple(bx), tuple(hp))
    except RuntimeError:
        with pytest.raises(ValueError, match="batch dimensions do not broadcast"):
            kermac.run_kernel("laplace_l1", x, z, bandwidth=sigma)
        return
    out = kermac.run_kernel("laplace_l1", x, z, bandwidth=sigma)
    assert out.shape == (*batch, 3, 4)
    expected = torch.exp(-torch.cdist(x, z, p=1.0) / sigma[..., None, None])
    torch.testing.assert_close(out, expected.expand(out.shape))


def msg(*parts: str) -> str:
    return ".*".join(re.escape(p) for p in parts)


def test_bad_tensors() -> None:
    x, z = torch.randn(3, 4), torch.randn(5, 4)
    with pytest.raises(TypeError, match=msg("x:", "torch.Tensor", "list")):
        kermac.cdist([[1.0]], z)
    with pytest.raises(TypeError, match=msg("x:", "dtype", "torch.int64")):
        kermac.cdist(torch.ones(3, 4, dtype=torch.int64), z)
    with pytest.raises(TypeError, match=msg("z:", "torch.float32", "torch.float64")):
        kermac.cdist(x, z.double())
    with pytest.raises(ValueError, match=msg("x:", "at least 2 dimensions", "[4]")):
        kermac.cdist(torch.randn(4), z)
    with pytest.raises(ValueError, match=msg("z:", "4 features", "[5, 3]")):
        kermac.cdist(x, torch.randn(5, 3))
    a, b, c, d = torch.randn(5, 3), torch.randn(4, 5), torch.randn(2, 5), torch.randn(4, 3)
    with pytest.raises(ValueError, match=msg("a:", "requires grad", "not differentiable")):
        kermac.cdist_grad(a.requires_grad_(), b, c, d)
    assert kermac.cdist(x.requires_grad_(), z).requires_grad  # pairwise ops are (tests/test_autograd.py)


def test_bad_out() -> None:
    x, z = torch.randn(3, 4), torch.randn(5, 4)
    with pytest.raises(ValueError, match=msg("out:", "shape [3, 5]", "[5, 3]")):
        kermac.cdist(x, z, out=torch.empty(5, 3))
    with pytest.raises(TypeError, match=msg("out:", "torch.float32", "torch.float64")):
        kermac.cdist(x, z, out=torch.empty(3, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match=msg("out:", "overlapping")):
        kermac.cdist(x, z, out=torch.empty(1, 5).expand(3, 5))
    with pytest.raises(TypeError, match=msg("out:", "torch.Tensor")):
        kermac.cdist(x, z, out=3)


@pytest.mark.parametrize("bad", [-1.0, math.nan, -math.inf])
def test_bad_p_for_cdist(bad: float) -> None:
    with pytest.raises(ValueError, match=msg("p:", "expected", repr(bad))):
        kermac.cdist(torch.randn(2, 2), torch.randn(2, 2), p=bad)


def test_bad_hyperparameter_types_and_devices() -> None:
    x = torch.randn(2, 3)
    with pytest.raises(TypeError, match=msg("p:", "bool")):
        kermac.cdist(x, x, p=True)
    with pytest.raises(TypeError, match=msg("p:", "floating-point tensor", "torch.int64")):
        kermac.cdist(x, x, p=torch.tensor([1, 2]))
    with pytest.raises(TypeError, match=msg("bandwidth:", "number", "str")):
        kermac.run_kernel("laplace_l1", x, x, bandwidth="wide")
    with pytest.raises(ValueError, match=msg("bandwidth:", "finite number > 0", "0.0")):
        kermac.run_kernel("laplace_l1", x, x, bandwidth=0.0)
    with pytest.raises(ValueError, match=msg("bandwidth:", "not NaN", "nan")):
        kermac.run_kernel("laplace_l1", x, x, bandwidth=torch.tensor(math.nan))
    with pytest.raises(ValueError, match=msg("regularization:", "finite", "inf")):
        kermac.run_kernel("laplace_l1", x, x, bandwidth=1.0, regularization=math.inf)
    with pytest.raises(ValueError, match=msg("batch dimensions do not broadcast", "x [3]", "bandwidth [2]")):
        kermac.run_kernel("laplace_l1", torch.randn(3, 2, 3), x, bandwidth=torch.ones(2))
    with pytest.raises(ValueError, match=msg("p:", "> 0", "-1.0")):
        kermac.cdist(x, x, p=torch.tensor([1.0, -1.0]), debug=True)  # tensor values checked in debug mode only


def test_descriptor_hyperparameters_required_and_refused() -> None:
    x = torch.randn(2, 3)
    with pytest.raises(ValueError, match=msg("bandwidth:", "required")):
        kermac.run_kernel("gaussian", x, x)
    with pytest.raises(ValueError, match=msg("p:", "does not use p")):
        kermac.run_kernel("gaussian", x, x, p=2.0, bandwidth=1.0)
    with pytest.raises(ValueError, match=msg("p:", "required")):
        kermac.run_kernel("lp_distance", x, x)
    with pytest.raises(ValueError, match=msg("descriptor:", "preset name", "'nope'")):
        kermac.run_kernel("nope", x, x)
    with pytest.raises(TypeError, match=msg("offset_m:", "int", "float")):
        kermac.run_kernel("l1_distance", x, x, regularization=1.0, offset_m=1.5)


def test_grad_shape_errors() -> None:
    k, m, n, o = 4, 5, 3, 2
    a, b, c, d = torch.randn(k, m), torch.randn(n, k), torch.randn(o, k), torch.randn(n, m)
    assert kermac.cdist_grad(a, b, c, d).shape == (o, n, m)
    with pytest.raises(ValueError, match=msg("b:", "size 4", "K (a.shape[-2])", "[3, 5]")):
        kermac.cdist_grad(a, torch.randn(n, k + 1), c, d)
    with pytest.raises(ValueError, match=msg("d:", "size 5", "M (a.shape[-1])")):
        kermac.cdist_grad(a, b, c, torch.randn(n, m + 1))
    with pytest.raises(ValueError, match=msg("d:", "size 3", "N (b.shape[-2])")):
        kermac.cdist_grad(a, b, c, torch.randn(n + 1, m))
    with pytest.raises(ValueError, match=msg("p:", "finite number > 0", "0.0")):
        kermac.cdist_grad(a, b, c, d, p=0.0)


def test_program_hypers_must_match() -> None:
    from kermac import ir

    prog = kermac.PairwiseProgram(ir.Hyper("beta") * ir.Var("x"), "sum", ir.Var("acc"))
    x = torch.randn(2, 3)
    with pytest.raises(ValueError, match=msg("hypers:", "['beta']", "missing ['beta']")):
        kermac.run_program(prog, x, x)
    with pytest.raises(ValueError, match=msg("unknown ['gamma']")):
        kermac.run_program(prog, x, x, hypers={"beta": 1.0, "gamma": 2.0})
    with pytest.raises(TypeError, match=msg("program:", "PairwiseProgram")):
        kermac.run_program("sum", x, x)


def test_backend_argument() -> None:
    x = torch.randn(2, 3)
    with pytest.raises(ValueError, match=msg("backend:", "'auto' or one of", "'cuda'")):
        kermac.cdist(x, x, backend="cuda")
    with pytest.raises(TypeError, match=msg("backend:", "str")):
        kermac.cdist(x, x, backend=1)
