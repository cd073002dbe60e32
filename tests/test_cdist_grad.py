"""kermac.cdist_grad and kermac.run_grad_program on every backend against a float64 einsum."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import BACKEND_DEVICES, assert_close, randn, ref_grad, require_backend, tolerance

import kermac
from kermac import ir

GRAD_TOL = 1e-4  # the project's bound: gradients to 1e-4 relative in float32


def grad_sizes(device: str) -> tuple[int, int, int, int]:
    """(M, N, O, K): small on the CPU, past the tile sizes on a GPU."""
    return (6, 5, 3, 7) if device == "cpu" else (203, 37, 17, 301)


def operands(
    m: int, n: int, o: int, k: int, *, device: str, dtype: torch.dtype = torch.float32, layout: str = "contiguous"
):
    if layout == "contiguous":
        return (
            randn(k, m, dtype=dtype, device=device),
            randn(n, k, dtype=dtype, device=device),
            randn(o, k, dtype=dtype, device=device),
            randn(n, m, dtype=dtype, device=device),
        )
    if layout == "transposed":
        return (
            randn(m, k, dtype=dtype, device=device).T,
            randn(k, n, dtype=dtype, device=device).T,
            randn(k, o, dtype=dtype, device=device).T,
            randn(m, n, dtype=dtype, device=device).T,
        )
    if layout == "broadcast":
        return (
            randn(2, k, m, dtype=dtype, device=device),
            randn(n, k, dtype=dtype, device=device),
            randn(3, 1, o, k, dtype=dtype, device=device),
            randn(1, n, m, dtype=dtype, device=device),
        )
    raise AssertionError(layout)


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "broadcast"])
@pytest.mark.parametrize("p", [1.0, 2.0, 1.5, 1.3, 3.0, 0.5])
def test_matches_reference(backend: str, device: str, layout: str, p: float) -> None:
    require_backend(backend, device, "grad")
    a, b, c, d = operands(*grad_sizes(device), device=device, layout=layout)
    out = kermac.cdist_grad(a, b, c, d, p=p, backend=backend)
    assert_close(out, ref_grad(a, b, c, d, p), GRAD_TOL)


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
@pytest.mark.parametrize("p", [1.0, 0.5, 1.5])
def test_ties_contribute_zero(backend: str, device: str, p: float) -> None:
    """Where d[n,m] == b[n,k] the term is 0 (sgn(0) = 0), also for p < 1 where |0|^(p-1) is infinite."""
    require_backend(backend, device, "grad")
    m, n, o, k = grad_sizes(device)
    a, b, c, d = operands(m, n, o, k, device=device)
    d[:, : min(m, k)] = b[:, : min(m, k)]  # exact ties on a block of (n, m=k) pairs
    out = kermac.cdist_grad(a, b, c, d, p=p, backend=backend)
    assert torch.isfinite(out).all()
    assert_close(out, ref_grad(a, b, c, d, p), GRAD_TOL)


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
def test_out_poisoned_and_batched_p(backend: str, device: str) -> None:
    require_backend(backend, device, "grad")
    m, n, o, k = grad_sizes(device)
    a, b, c, d = operands(m, n, o, k, device=device)
    ps = [1.0, 1.5, 2.0]
    out = torch.full((3, o, n, m), math.nan, device=device)
    kermac.cdist_grad(a, b, c, d, p=torch.tensor(ps, device=device), out=out, backend=backend)
    assert_close(out, torch.stack([ref_grad(a, b, c, d, p) for p in ps]), GRAD_TOL)


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_dtypes(backend: str, device: str, dtype: torch.dtype) -> None:
    require_backend(backend, device, "grad")
    a, b, c, d = operands(*grad_sizes(device), device=device, dtype=dtype)
    out = kermac.cdist_grad(a, b, c, d, p=1.5, backend=backend)
    assert out.dtype == dtype
    assert_close(out, ref_grad(a, b, c, d, 1.5), max(tolerance(dtype), GRAD_TOL if dtype != torch.float64 else 1e-11))


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
def test_user_grad_program(backend: str, device: str) -> None:
    """mm-kermac's example: scale · Σ_k c·(alpha·(d − b))·a."""
    require_backend(backend, device, "grad")
    a, b, c, d = operands(*grad_sizes(device), device=device)
    prog = kermac.GradProgram(ir.Hyper("alpha") * (ir.Var("d") - ir.Var("b")), ir.Var("acc") * ir.Hyper("scale"))
    out = kermac.run_grad_program(prog, a, b, c, d, hypers={"alpha": 0.25, "scale": 2.0}, backend=backend)
    assert_close(out, 0.5 * ref_grad(a, b, c, d, 2.0), GRAD_TOL)


SPECIALS = [0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5, 3.0, math.inf, -math.inf, math.nan, 1e-3, -1e3]


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
@pytest.mark.parametrize("q", [0.5, 1.5, 1.0, 0.0, -0.5, math.inf])
def test_signed_power_on_special_values(backend: str, device: str, q: float) -> None:
    """sgn(t)·|t|^q (0 where t = 0) with a hyperparameter q, on IEEE special values of t = d − b.

    Every k sees the same t, so out = K·φ(t): the k loop runs its full steps (with the runtime
    choice between the select-free form for 0 < q < ∞ and the general one) and the masked tail.
    Where φ(t) is infinite the output is only required to be non-finite (tensor-core backends
    split w into hi + lo, and inf − inf is NaN).
    """
    require_backend(backend, device, "grad")
    n, m, k = len(SPECIALS), 3, 70
    d = torch.tensor(SPECIALS, device=device)[:, None].expand(n, m).contiguous()
    a, b, c = torch.ones(k, m, device=device), torch.zeros(n, k, device=device), torch.ones(1, k, device=device)
    t = ir.Var("d") - ir.Var("b")
    prog = kermac.GradProgram(ir.select(ir.ne(t, 0.0), ir.sign(t) * ir.pow(abs(t), ir.Hyper("q")), 0.0), ir.Var("acc"))
    out = kermac.run_grad_program(prog, a, b, c, d, hypers={"q": q}, backend=backend)[0].cpu().double()
    v = d.cpu().double()
    phi = torch.where(v != 0, torch.where(v.isnan(), v, v.sign()) * v.abs().pow(q), torch.zeros_like(v))
    finite = phi.isfinite()
    assert not out[~finite].isfinite().any(), f"q={q}: {out.tolist()}"
    assert torch.allclose(out[finite], k * phi[finite], rtol=1e-5, atol=0.0), f"q={q}: {out.tolist()}"


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
def test_invalid_tensor_p_gives_nan_batch_entries(backend: str, device: str) -> None:
    """A tensor p outside (0, ∞) makes its whole batch entry NaN, also where every d − b is 0 or ±1
    (terms 0 and pow(1, NaN) = 1 would hide it); debug raises."""
    require_backend(backend, device, "grad")
    m, n, o, k = grad_sizes(device)
    p = torch.tensor([1.5, -1.0, 0.0, math.inf, math.nan], device=device)
    a, b, c, d = operands(m, n, o, k, device=device)
    b = torch.randint(-1, 2, (n, k), device=device).float()  # d − b in {−1, 0, 1}
    out = kermac.cdist_grad(a, b, c, torch.zeros(n, m, device=device), p=p, backend=backend).cpu()
    assert out[1:].isnan().all()
    assert_close(out[0], ref_grad(a, b, c, torch.zeros(n, m), 1.5), GRAD_TOL)
    out = kermac.cdist_grad(a, b, c, d, p=p, backend=backend).cpu()
    assert out[1:].isnan().all()
    assert_close(out[0], ref_grad(a, b, c, d, 1.5), GRAD_TOL)
    with pytest.raises(ValueError, match="p: expected a finite number > 0"):
        kermac.cdist_grad(a, b, c, d, p=p, backend=backend, debug=True)
