"""Autograd through cdist, run_kernel and run_program (backward = cdist_grad) against float64
autograd of the explicit formulas."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import BACKEND_DEVICES, assert_close, require_backend
from hypothesis import given, settings
from hypothesis import strategies as st

import kermac

GRAD_TOL = 1e-4


def sizes(device: str) -> tuple[int, int, int]:
    """(M, N, D): past the GPU tiles and not multiples of 4 on CUDA; small for the CPU interpreter."""
    return (133, 70, 37) if device == "cuda" else (7, 6, 5)


def ref_grads(x, z, g, p, skip_epilogue=False):
    """∂L/∂x, ∂L/∂z in float64 by autograd of the explicit formula (no kermac code)."""
    x64 = x.detach().double().cpu().requires_grad_()
    z64 = z.detach().double().cpu().requires_grad_()
    s = ((x64[..., :, None, :] - z64[..., None, :, :]).abs() ** p).sum(-1)
    d = s if skip_epilogue else s ** (1.0 / p)
    return torch.autograd.grad(d, (x64, z64), g.double().cpu())


def inputs(device, m, n, dim, dtype=torch.float32):
    x = torch.randn(2, m, dim, device=device, dtype=dtype, requires_grad=True)
    z = torch.randn(1, n, dim, device=device, dtype=dtype, requires_grad=True)  # broadcast over the batch
    return x, z


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
@pytest.mark.parametrize("p", [1.0, 1.5, 2.0, 3.0])
@pytest.mark.parametrize("skip_epilogue", [False, True])
def test_gradients_match_float64_reference(backend, device, p, skip_epilogue):
    require_backend(backend, device, "grad")
    x, z = inputs(device, *sizes(device))
    d = kermac.cdist(x, z, p, skip_epilogue=skip_epilogue, backend=backend)
    assert d.requires_grad and d.shape == (2, x.shape[-2], z.shape[-2])
    g = torch.randn_like(d)
    gx, gz = torch.autograd.grad(d, (x, z), g)
    rx, rz = ref_grads(x, z, g, p, skip_epilogue)
    assert gx.shape == x.shape and gz.shape == z.shape and gx.dtype == x.dtype
    assert_close(gx, rx, GRAD_TOL)
    assert_close(gz, rz, GRAD_TOL)  # summed over the batch z was broadcast across


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
def test_one_input_requiring_grad_and_transposed_views(backend, device):
    require_backend(backend, device, "grad")
    m, n, dim = sizes(device)
    x = torch.randn(dim, m, device=device).mT.requires_grad_()  # column-major view
    z = torch.randn(n, dim, device=device)
    d = kermac.cdist(x, z, 1.5, backend=backend)
    (gx,) = torch.autograd.grad(d.sum(), (x,))
    assert_close(gx, ref_grads(x, z, torch.ones_like(d), 1.5)[0], GRAD_TOL)


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
@pytest.mark.parametrize("p", [1.0, 2.0])
def test_zero_distance_has_zero_subgradient(backend, device, p):
    """Where x[m] == z[n] (d = 0) the pair contributes nothing, as in torch.cdist."""
    require_backend(backend, device, "grad")
    m, n, dim = sizes(device)
    x = torch.randn(m, dim, device=device)
    z = torch.randn(n, dim, device=device)
    z[:3] = x[:3]
    x.requires_grad_()
    z.requires_grad_()
    d = kermac.cdist(x, z, p, backend=backend)
    g = torch.randn_like(d)
    gx, gz = torch.autograd.grad(d, (x, z), g)
    x64, z64 = x.detach().double().cpu().requires_grad_(), z.detach().double().cpu().requires_grad_()
    rx, rz = torch.autograd.grad(torch.cdist(x64, z64, p=p), (x64, z64), g.double().cpu())
    assert torch.isfinite(gx).all() and torch.isfinite(gz).all()
    assert_close(gx, rx, GRAD_TOL)
    assert_close(gz, rz, GRAD_TOL)


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
def test_batched_p_tensor(backend, device):
    require_backend(backend, device, "grad")
    x, z = inputs(device, *sizes(device))
    ps = [1.0, 2.5]
    d = kermac.cdist(x, z, torch.tensor(ps, device=device), backend=backend)
    g = torch.randn_like(d)
    gx, gz = torch.autograd.grad(d, (x, z), g)
    refs = [ref_grads(x[i], z[0], g[i], p) for i, p in enumerate(ps)]
    assert_close(gx, torch.stack([r[0] for r in refs]), GRAD_TOL)
    assert_close(gz, (refs[0][1] + refs[1][1])[None], GRAD_TOL)


def test_gradcheck_float64():
    x = torch.randn(2, 4, 3, dtype=torch.float64, requires_grad=True)
    z = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    for p in (1.5, 2.0, 3.0):
        assert torch.autograd.gradcheck(lambda a, b, p=p: kermac.cdist(a, b, p, backend="torch"), (x, z))


def test_p_zero_has_zero_gradient():
    x = torch.randn(3, 2, requires_grad=True)
    z = torch.randn(4, 2, requires_grad=True)
    gx, gz = torch.autograd.grad(kermac.cdist(x, z, 0.0).sum(), (x, z))
    assert torch.equal(gx, torch.zeros_like(x)) and torch.equal(gz, torch.zeros_like(z))


def test_errors_name_what_autograd_cannot_do():
    x = torch.randn(3, 2, requires_grad=True)
    z = torch.randn(4, 2)
    with pytest.raises(RuntimeError, match="out= is not supported when x or z requires grad"):
        kermac.cdist(x, z, 1.0, out=torch.empty(3, 4))
    with pytest.raises(NotImplementedError, match=r"covers sums of \|x − z\|\^P and x·z; program .*max"):
        kermac.cdist(x, z, math.inf)
    with pytest.raises(ValueError, match="p: gradients with respect to hyperparameters are not supported"):
        kermac.cdist(x, z, torch.tensor([1.5], requires_grad=True))
    with pytest.raises(RuntimeError, match="run_kernel: out= is not supported"):
        kermac.run_kernel("laplace_l1", x, z, bandwidth=1.0, out=torch.empty(3, 4))
    with torch.no_grad():  # no autograd: out= is fine and the result does not require grad
        out = kermac.cdist(x, z, 1.0, out=torch.empty(3, 4))
    assert not out.requires_grad
    assert not kermac.cdist(x.detach(), z, 1.0).requires_grad


KERNELS = {  # name -> (run_kernel arguments, float64 formula of x [M, D], z [N, D])
    "laplace_l1": ({"bandwidth": 1.7}, lambda x, z: torch.exp(-(x[:, None] - z[None]).abs().sum(-1) / 1.7)),
    "gaussian": ({"bandwidth": 1.3}, lambda x, z: torch.exp(-((x[:, None] - z[None]) ** 2).sum(-1) / (2 * 1.3**2))),
    "laplace_l2": ({"bandwidth": 2.0}, lambda x, z: torch.exp(-((x[:, None] - z[None]) ** 2).sum(-1).sqrt() / 2.0)),
    "laplace_lp": (
        {"bandwidth": 1.1, "p": 1.5},
        lambda x, z: torch.exp(-(((x[:, None] - z[None]).abs() ** 1.5).sum(-1) ** (1 / 1.5)) / 1.1),
    ),
    "dot_product": ({}, lambda x, z: x @ z.mT),
}


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_run_kernel_gradients(backend, device, name):
    require_backend(backend, device, "grad")
    m, n, dim = sizes(device)
    kwargs, formula = KERNELS[name]
    x = torch.randn(m, dim, device=device, requires_grad=True)
    z = torch.randn(n, dim, device=device, requires_grad=True)
    k = kermac.run_kernel(name, x, z, regularization=0.5, offset_n=1, backend=backend, **kwargs)
    g = torch.randn_like(k)
    gx, gz = torch.autograd.grad(k, (x, z), g)
    x64, z64 = x.detach().double().cpu().requires_grad_(), z.detach().double().cpu().requires_grad_()
    rx, rz = torch.autograd.grad(formula(x64, z64), (x64, z64), g.double().cpu())  # λ·diag: no gradient
    assert_close(gx, rx, GRAD_TOL)
    assert_close(gz, rz, GRAD_TOL)


def test_run_program_gradient_and_unsupported_programs():
    from kermac import ir

    t = ir.Var("x") - ir.Var("z")
    program = kermac.PairwiseProgram(inner=ir.pow(abs(t), 3.0), reduction="sum", epilogue=ir.log(1.0 + ir.Var("acc")))
    x = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    z = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: kermac.run_program(program, a, b, backend="torch"), (x, z))
    flat = kermac.PairwiseProgram(inner=abs(t), reduction="sum", epilogue=ir.Const(2.0) + 0.0 * ir.Var("diag"))
    gx, gz = torch.autograd.grad(kermac.run_program(flat, x, z, backend="torch").sum(), (x, z))
    assert not gx.any() and not gz.any()  # an epilogue that ignores acc has zero gradient
    dot = kermac.PairwiseProgram(inner=ir.Var("x") * ir.Var("z"), reduction="sum", epilogue=ir.exp(ir.Var("acc")))
    x1 = torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    z1 = torch.tensor([[0.0, 1.0, 0.0]], dtype=torch.float64)
    (g_dot,) = torch.autograd.grad(kermac.run_program(dot, x1, z1, backend="torch").sum(), (x1,))
    assert torch.equal(g_dot, z1)  # acc = x·z = 0, yet d/dx exp(x·z) = z
    odd = kermac.PairwiseProgram(inner=ir.exp(t), reduction="sum", epilogue=ir.Var("acc"))
    with pytest.raises(NotImplementedError, match=r"program .* is not one"):
        kermac.run_program(odd, x, z)
    assert not kermac.run_program(odd, x.detach(), z.detach()).requires_grad


@settings(max_examples=40, deadline=None)
@given(
    bx=st.lists(st.integers(1, 3), max_size=2),
    bz=st.lists(st.integers(1, 3), max_size=2),
    m=st.integers(1, 4),
    n=st.integers(1, 4),
    d=st.integers(1, 3),
    p=st.sampled_from([1.0, 1.5, 2.0, 3.0]),
)
def test_broadcast_batches_sum_gradients_back_like_torch(bx, bz, m, n, d, p):
    """Any broadcastable batch shapes: the gradients match torch.cdist's (float64, reference backend)."""
    x = torch.randn(*bx, m, d, dtype=torch.float64, requires_grad=True)
    z = torch.randn(*bz, n, d, dtype=torch.float64, requires_grad=True)
    try:
        expected = torch.cdist(x, z, p=p)
    except RuntimeError:
        return  # not broadcastable: tests/test_validation.py covers the error
    g = torch.randn_like(expected)
    got = torch.autograd.grad(kermac.cdist(x, z, p, backend="torch"), (x, z), g)
    want = torch.autograd.grad(expected, (x, z), g)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
