"""Argument validation and broadcasting of the public operations (backend independent)."""

from __future__ import annotations

import math
import re
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kermac
from kermac import ir

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
    assert kermac.cdist_grad(a.requires_grad_(), b, c, d).requires_grad  # differentiable (tests/test_autograd.py)
    assert kermac.cdist(x.requires_grad_(), z).requires_grad


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


def test_out_sharing_memory_with_an_input_is_refused() -> None:
    """Every tensor an operation reads is checked against ``out``, byte-exactly (not just "same storage")."""
    x, z = torch.randn(4, 4, dtype=torch.float64), torch.randn(4, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match=msg("out:", "shares memory with x")):
        kermac.cdist(x, z, out=x)  # the example
    with pytest.raises(ValueError, match=msg("out:", "shares memory with z")):
        kermac.cdist(x, z, out=z.T)
    buf = torch.randn(40, dtype=torch.float64)
    x3 = buf[:12].view(3, 4)
    with pytest.raises(ValueError, match=msg("out:", "shares memory with x")):
        kermac.cdist(x3, torch.randn(5, 4, dtype=torch.float64), out=buf[11:26].view(3, 5))  # one element in common
    sigma = torch.rand(2, dtype=torch.float64) + 0.5
    out = torch.empty(2, 4, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match=msg("out:", "shares memory with bandwidth")):
        kermac.run_kernel("laplace_l1", x, z, bandwidth=out.view(-1)[:2], out=out)
    with pytest.raises(ValueError, match=msg("out:", "shares memory with p")):
        kermac.cdist(x, z, p=out.view(-1)[30:32], out=out)
    with pytest.raises(ValueError, match=msg("out:", "shares memory with regularization")):
        kermac.run_kernel("laplace_l1", x, z, bandwidth=sigma, regularization=out[1, 3, 2:], out=out)
    prog = kermac.PairwiseProgram(ir.Hyper("beta") * ir.Var("x"), "sum", ir.Var("acc"))
    with pytest.raises(ValueError, match=msg("out:", "shares memory with beta")):
        kermac.run_program(prog, x, z, hypers={"beta": out[:, 0, 0]}, out=out)
    k, m, n, o = 4, 5, 3, 2
    operands = {"a": (k, m), "b": (n, k), "c": (o, k), "d": (n, m)}
    for name in operands:
        store = torch.randn(100, dtype=torch.float64)
        t = {nm: torch.randn(*shape, dtype=torch.float64) for nm, shape in operands.items()}
        t[name] = store[: math.prod(operands[name])].view(operands[name])
        grad_out = store[math.prod(operands[name]) - 1 :][: o * n * m].view(o, n, m)  # shares one element
        with pytest.raises(ValueError, match=msg("out:", f"shares memory with {name}")):
            kermac.cdist_grad(t["a"], t["b"], t["c"], t["d"], out=grad_out)
        gprog = kermac.GradProgram(ir.Var("d") - ir.Var("b"), ir.Var("acc"))
        with pytest.raises(ValueError, match=msg("out:", f"shares memory with {name}")):
            kermac.run_grad_program(gprog, t["a"], t["b"], t["c"], t["d"], out=grad_out)


def test_out_with_overlapping_elements_is_refused() -> None:
    x, z = torch.randn(3, 4), torch.randn(3, 4)
    with pytest.raises(ValueError, match=msg("out:", "without overlapping elements", "strides [1, 1]")):
        kermac.cdist(x, z, out=torch.empty(16).as_strided((3, 3), (1, 1)))  # no zero stride, still overlapping
    with pytest.raises(ValueError, match=msg("out:", "without overlapping elements")):
        kermac.cdist_grad(torch.randn(4, 3), torch.randn(3, 4), torch.randn(2, 4), torch.randn(3, 3),
                          out=torch.empty(40).as_strided((2, 3, 3), (9, 2, 1)))  # fmt: skip


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_out_beside_an_input_in_one_buffer_is_written(backend: str) -> None:
    """Views of one buffer that do not overlap are fine: disjoint halves, interleaved columns."""
    if backend == "triton":
        pytest.importorskip("triton")
    x64, z64 = torch.randn(3, 4, dtype=torch.float64), torch.randn(5, 4, dtype=torch.float64)
    expected = torch.cdist(x64, z64, p=1.0).float()
    halves = torch.full((12 + 15,), math.nan)
    x, out = halves[:12].view(3, 4), halves[12:].view(3, 5)
    x.copy_(x64)
    kermac.cdist(x, z64.float(), p=1.0, out=out, backend=backend)
    torch.testing.assert_close(out, expected)
    rows = torch.full((3, 9), math.nan)
    x, out = rows[:, :4], rows[:, 4:]  # each row: 4 features of x, then 5 outputs
    x.copy_(x64)
    kermac.cdist(x, z64.float(), p=1.0, out=out, backend=backend)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(x, x64.float())


def test_hyperparameter_tensor_requiring_grad_is_refused_in_every_form() -> None:
    """A 0-d CPU tensor follows the rule of every other tensor (it used to be read as a number)."""
    x = torch.randn(2, 3)
    for value in (torch.tensor(1.5, requires_grad=True), torch.tensor([1.5], requires_grad=True)):
        with pytest.raises(ValueError, match=msg("p:", "gradients with respect to hyperparameters", "p.detach()")):
            kermac.cdist(x, x, p=value)
        with pytest.raises(ValueError, match=msg("bandwidth:", "not supported", "bandwidth.detach()")):
            kermac.run_kernel("laplace_l1", x, x, bandwidth=value)
        with pytest.raises(ValueError, match=msg("p:", "not supported", "p.detach()")):
            kermac.cdist_grad(torch.randn(3, 2), torch.randn(2, 3), torch.randn(1, 3), torch.randn(2, 2), p=value)
        with torch.no_grad():  # nothing records: the value is just a number
            assert kermac.cdist(x, x, p=value).shape == (*value.shape, 2, 2)


def test_numpy_and_other_real_numbers() -> None:
    """Any real scalar is a number (numpy's included); bool, numpy bool, complex and arrays are refused."""
    np = pytest.importorskip("numpy")
    from fractions import Fraction

    x, z = torch.randn(3, 2, dtype=torch.float64), torch.randn(4, 2, dtype=torch.float64)
    expected = torch.exp(-torch.cdist(x, z, p=1.0) / 1.5) + 0.25 * torch.eye(3, 4, dtype=torch.float64)
    for sigma, lam in [
        (np.float32(1.5), np.float16(0.25)),
        (np.float64(1.5), np.int64(0) + 0.25),
        (Fraction(3, 2), 0.25),
    ]:
        out = kermac.run_kernel("laplace_l1", x, z, bandwidth=sigma, regularization=lam)
        torch.testing.assert_close(out, expected)
    torch.testing.assert_close(kermac.cdist(x, z, p=np.int32(1)), torch.cdist(x, z, p=1.0))
    for bad, name in [(np.bool_(True), "bool"), (True, "bool"), (1.5 + 0j, "complex"), (np.array(1.5), "ndarray")]:
        with pytest.raises(TypeError, match=msg("bandwidth:", "real number", name)):
            kermac.run_kernel("laplace_l1", x, z, bandwidth=bad)
    with pytest.raises(ValueError, match=msg("bandwidth:", "not NaN", "nan")):
        kermac.run_kernel("laplace_l1", x, z, bandwidth=np.float32("nan"))
    with pytest.raises(ValueError, match=msg("bandwidth:", "finite number > 0", "inf")):
        kermac.run_kernel("laplace_l1", x, z, bandwidth=10**400)  # beyond float: inf, not an OverflowError


def test_offsets_range_and_types() -> None:
    np = pytest.importorskip("numpy")
    x = torch.randn(4, 2, dtype=torch.float64)
    for big in (2**70, -(2**63) - 1, 2**63):
        with pytest.raises(ValueError, match=msg("offset_m:", "[-2**63, 2**63 - 1]", str(big))):
            kermac.run_kernel("l1_distance", x, x, regularization=1.0, offset_m=big)
        with pytest.raises(ValueError, match=msg("offset_n:", "int64", str(big))):
            kermac.run_kernel("l1_distance", x, x, regularization=1.0, offset_n=big)
    d = torch.cdist(x, x, p=1.0)
    extremes = [(2**63 - 1, 2**63 - 2), (-(2**63), -(2**63) + 1), (2**63 - 1, -(2**63)), (np.int64(5), np.int16(4))]
    for om, on in extremes:
        out = kermac.run_kernel("l1_distance", x, x, regularization=1.0, offset_m=om, offset_n=on)
        shift = int(om) - int(on)  # entry (i, j) is on the diagonal iff j − i = shift
        eye = torch.ones(4, 4, dtype=torch.float64).diagonal(shift) if -4 < shift < 4 else None
        expected = d + (torch.diag_embed(eye, shift) if eye is not None else 0)
        torch.testing.assert_close(out, expected)
    with pytest.raises(TypeError, match=msg("offset_n:", "int", "bool")):
        kermac.run_kernel("l1_distance", x, x, regularization=1.0, offset_n=True)


@pytest.mark.parametrize(("om", "on"), [(2**31 - 1, -(2**31)), (2**31 - 2, 2**31), (2**40, 2**40 + 1), (3, 2**62)])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_large_offsets_place_the_diagonal_exactly(backend: str, om: int, on: int) -> None:
    """Offsets near and past 2^31: the diagonal lands where m + offset_m == n + offset_n, on every backend."""
    if backend == "triton":
        pytest.importorskip("triton")
    x, z = torch.zeros(4, 2), torch.zeros(5, 2)
    out = kermac.run_kernel("l1_distance", x, z, regularization=1.0, offset_m=om, offset_n=on, backend=backend)
    rows, cols = torch.arange(4)[:, None] + om, torch.arange(5)[None, :] + on
    assert torch.equal(out, (rows == cols).float())


def test_meta_tensors_return_at_once() -> None:
    """Every operation on meta inputs returns a meta result of the right shape and dtype at once, whatever
    the sizes (the reference backend's chunk loop used to run for minutes: it never starts now)."""

    def calls(big: int) -> dict:
        x = torch.empty(3, big, 64, device="meta", dtype=torch.float16)
        z = torch.empty(big, 64, device="meta", dtype=torch.float16)
        sigma = torch.empty(3, device="meta", dtype=torch.float16)
        a, b = torch.empty(big, big, device="meta"), torch.empty(64, big, device="meta")
        c, d = torch.empty(2, big, device="meta"), torch.empty(64, big, device="meta")
        prog = kermac.PairwiseProgram(ir.Var("x") * ir.Var("z"), "max", ir.Var("acc"))
        gprog = kermac.GradProgram(ir.Var("d") - ir.Var("b"), ir.Var("acc"))
        return {
            "cdist": (lambda: kermac.cdist(x, z, p=1.5), (3, big, big), torch.float16),
            "run_kernel": (
                lambda: kermac.run_kernel("gaussian", x, z, bandwidth=sigma, regularization=1.0, debug=True),
                (3, big, big),
                torch.float16,
            ),
            "run_program": (lambda: kermac.run_program(prog, x, z), (3, big, big), torch.float16),
            "cdist_grad": (
                lambda: kermac.cdist_grad(a, b, c, d, p=torch.empty(1, device="meta")),
                (1, 2, 64, big),
                None,
            ),
            "run_grad_program": (lambda: kermac.run_grad_program(gprog, a, b, c, d), (2, 64, big), None),
        }

    for call, _, _ in calls(2).values():  # torch imports parts of itself on the first meta operations
        call()
    for name, (call, shape, dtype) in calls(1 << 20).items():
        start = time.perf_counter()
        out = call()
        assert time.perf_counter() - start < 0.5, name
        assert out.device.type == "meta" and out.shape == shape and out.dtype == (dtype or torch.float32), name


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_tensors_kernels_cannot_address_are_refused(backend: str) -> None:
    """Kernels read memory at strides: a negative-bit view (c.conj().imag holds −values in memory) or a
    sparse tensor is refused by name instead of being read with the wrong sign."""
    if backend == "triton":
        pytest.importorskip("triton")
    neg = lambda *shape: torch.randn(*shape, dtype=torch.complex64).conj().imag  # noqa: E731
    x, z = torch.randn(3, 4), torch.randn(5, 4)
    bandwidth = torch.complex(torch.zeros(2), -1 - torch.rand(2)).conj().imag  # values in (1, 2), negative bit
    assert neg(3, 4).is_neg() and bandwidth.is_neg() and (bandwidth > 1).all()
    for call, name in [
        (lambda: kermac.cdist(neg(3, 4), z, backend=backend), "x"),
        (lambda: kermac.cdist(x, neg(5, 4), backend=backend), "z"),
        (lambda: kermac.cdist(x, z, out=neg(3, 5), backend=backend), "out"),
        (lambda: kermac.run_kernel("laplace_l1", x, z, bandwidth=bandwidth, backend=backend, debug=True), "bandwidth"),
        (lambda: kermac.cdist_grad(x, neg(2, 3), torch.randn(1, 3), torch.randn(2, 4), backend=backend), "b"),
    ]:
        with pytest.raises(ValueError, match=msg(f"{name}:", "negative bit", f"{name}.resolve_neg()")):
            call()
    with pytest.raises(TypeError, match=msg("x:", "dense (strided)", "sparse")):
        kermac.cdist(x.to_sparse(), z, backend=backend)
    # Without debug a tensor hyperparameter is read through its range-checked copy, which holds the values.
    got = kermac.run_kernel("laplace_l1", x, z, bandwidth=bandwidth, backend=backend)
    expected = kermac.run_kernel("laplace_l1", x, z, bandwidth=bandwidth.resolve_neg(), backend=backend)
    torch.testing.assert_close(got, expected)
