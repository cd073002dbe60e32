"""`torch.compile` of code calling kermac: one graph (no break, no warning), the eager results and
gradients, dynamic shapes, and no recompilation per call; on every backend (the GPU ones with
`pytest -m gpu`, `mode="reduce-overhead"` there)."""

from __future__ import annotations

import warnings

import pytest
import torch
from helpers import BACKEND_DEVICES, require_backend
from op_samples import SOFT_L1

import kermac


def model(x: torch.Tensor, z: torch.Tensor, bandwidth: torch.Tensor, backend: str) -> torch.Tensor:
    """A small model: distances, a kernel matrix with batched bandwidths, a user program and the
    gradient contraction, mixed with torch operations."""
    k = kermac.run_kernel("gaussian", x, z, bandwidth=bandwidth, regularization=1e-3, backend=backend)
    d = kermac.cdist(x, z, 1.0, backend=backend)
    s = kermac.run_program(SOFT_L1, x, z, hypers={"eps": 0.5}, backend=backend)
    agop = kermac.cdist_grad(
        k[0, 0].mT, z.mT, torch.ones(1, z.shape[0], dtype=x.dtype, device=x.device), x.mT, p=2.0, backend=backend
    )
    return (k * d).sum() + s.detach().sum() + agop.sum()


def _inputs(device: str, dtype: torch.dtype, m: int = 13) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(m)
    x = torch.randn(m, 5, generator=gen, dtype=dtype).to(device).requires_grad_()
    z = torch.randn(9, 5, generator=gen, dtype=dtype).to(device).requires_grad_()
    return x, z, torch.tensor([0.8, 2.0], dtype=dtype, device=device)[:, None, None]


def _dtype(backend: str) -> torch.dtype:
    return torch.float64 if backend == "torch" else torch.float32


def _check_against_eager(compiled, backend: str, device: str, m: int = 13) -> None:
    x, z, bw = _inputs(device, _dtype(backend), m)
    value = compiled(x, z, bw, backend)
    gx, gz = torch.autograd.grad(value, (x, z))
    expected = model(x, z, bw, backend)
    ex, ez = torch.autograd.grad(expected, (x, z))
    tol = 1e-10 if backend == "torch" else 1e-4
    for got, want in ((value, expected), (gx, ex), (gz, ez)):
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
def test_fullgraph_no_break_no_warning(backend: str, device: str) -> None:
    require_backend(backend, device)
    x, z, bw = _inputs(device, _dtype(backend))
    explained = torch._dynamo.explain(model)(x, z, bw, backend)
    assert explained.graph_break_count == 0, explained.break_reasons
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _check_against_eager(torch.compile(model, fullgraph=True, backend="aot_eager"), backend, device)
    ours = [str(w.message) for w in caught if "kermac" in str(w.message) or "Dynamo" in str(w.message)]
    assert not ours


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
def test_dynamic_shapes_compile_once(backend: str, device: str) -> None:
    require_backend(backend, device)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager", dynamic=True)
    _check_against_eager(compiled, backend, device, m=13)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for m in (7, 21, 13):
            _check_against_eager(compiled, backend, device, m=m)


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
def test_repeated_calls_do_not_recompile(backend: str, device: str) -> None:
    require_backend(backend, device)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    _check_against_eager(compiled, backend, device)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(3):
            _check_against_eager(compiled, backend, device)


def test_inductor_on_the_cpu() -> None:
    """The default compiler (inductor) around the reference backend, forward only."""

    def f(x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return kermac.run_kernel("laplace_l1", x, z, bandwidth=2.0).exp() * 2 + kermac.cdist(x, z, 1.5)

    x, z = torch.randn(11, 4, dtype=torch.float64), torch.randn(6, 4, dtype=torch.float64)
    torch.testing.assert_close(torch.compile(f, fullgraph=True)(x, z), f(x, z))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["nvrtc", "triton"])
def test_reduce_overhead_mode(backend: str) -> None:
    """`mode="reduce-overhead"` (inductor with CUDA graphs) around kermac calls: replays give the
    eager values for new inputs."""
    require_backend(backend, "cuda")

    def f(x: torch.Tensor, z: torch.Tensor, bw: torch.Tensor) -> torch.Tensor:
        k = kermac.run_kernel("laplace_l2", x, z, bandwidth=bw, backend=backend)
        return k.sum(-1) + kermac.cdist(x, z, 1.0, backend=backend).mean(-1)

    compiled = torch.compile(f, mode="reduce-overhead", fullgraph=True)
    bw = torch.tensor([1.0, 3.0], device="cuda")[:, None, None]
    for seed in range(4):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        x = torch.randn(300, 40, device="cuda", generator=gen)
        z = torch.randn(200, 40, device="cuda", generator=gen)
        bw.mul_(1.5)
        torch.testing.assert_close(compiled(x, z, bw).clone(), f(x, z, bw), rtol=1e-5, atol=1e-5)
