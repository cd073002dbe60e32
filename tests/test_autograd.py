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


def test_run_program_gradients():
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
    other = kermac.PairwiseProgram(inner=ir.exp(t), reduction="sum", epilogue=ir.Var("acc"))
    out = kermac.run_program(other, x, z)  # any other program: the symbolic route (tests/test_symbolic_gradients.py)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, (x, z), g)
    expected = torch.autograd.grad(torch.exp(x[:, None] - z[None]).sum(-1), (x, z), g)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b)
    assert not kermac.run_program(other, x.detach(), z.detach()).requires_grad


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


def explicit(name: str, x: torch.Tensor, z: torch.Tensor, **kw) -> torch.Tensor:
    """float64 formulas of the programs with second derivatives, for autograd to differentiate."""
    sq = ((x[..., :, None, :] - z[..., None, :, :]) ** 2).sum(-1)
    sigma, lam = kw.get("bandwidth"), kw.get("regularization", 0.0)
    if isinstance(sigma, torch.Tensor):
        sigma = sigma[..., None, None]
    d = sq.clamp_min(1e-300).sqrt()  # no pair of the tests is at distance 0
    value = {
        "l2_distance": lambda: d,
        "squared_l2_distance": lambda: sq,
        "gaussian": lambda: torch.exp(-sq / (2 * sigma**2)),
        "laplace_l2": lambda: torch.exp(-d / sigma),
        "matern52": lambda: (
            (1 + math.sqrt(5) * d / sigma + 5 * sq / (3 * sigma**2)) * torch.exp(-math.sqrt(5) * d / sigma)
        ),
        "cauchy": lambda: 1 / (1 + sq / sigma**2),
        "dot_product": lambda: x @ z.mT,
    }[name]()
    return value + lam * torch.eye(x.shape[-2], z.shape[-2], dtype=x.dtype)


SECOND_ORDER = {  # run_kernel arguments
    "l2_distance": {},
    "squared_l2_distance": {},
    "gaussian": {"bandwidth": 1.3, "regularization": 0.5},
    "laplace_l2": {"bandwidth": torch.tensor([1.5, 2.5], dtype=torch.float64)},
    "matern52": {"bandwidth": 2.0},
    "cauchy": {"bandwidth": 0.7},
    "dot_product": {"regularization": 0.25},
}


@pytest.mark.parametrize("name", sorted(SECOND_ORDER))
def test_second_derivatives_gradgradcheck(name):
    """Σ (x − z)² and x·z programs are twice differentiable (float64, finite differences of the backward)."""
    kw = SECOND_ORDER[name]
    x = torch.randn(2, 4, 3, dtype=torch.float64, requires_grad=True)
    z = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    fn = lambda a, b: kermac.run_kernel(name, a, b, backend="torch", **kw)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, z))
    assert torch.autograd.gradgradcheck(fn, (x, z))


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
@pytest.mark.parametrize("name", sorted(SECOND_ORDER))
def test_second_derivatives_match_float64_autograd(backend, device, name):
    """A gradient penalty and a Hessian-vector product through kermac equal float64 autograd of the formula;
    first derivatives are the same with and without create_graph."""
    require_backend(backend, device, "grad")
    kw = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in SECOND_ORDER[name].items()}
    m, n, dim = sizes(device)
    x = torch.randn(2, m, dim, dtype=torch.float64, device=device, requires_grad=True)
    z = torch.randn(n, dim, dtype=torch.float64, device=device, requires_grad=True)
    g = torch.randn(2, m, n, dtype=torch.float64, device=device)
    k = kermac.run_kernel(name, x, z, backend=backend, **kw)
    gx, gz = torch.autograd.grad(k, (x, z), g, create_graph=True)
    assert gx.grad_fn is not None and gz.grad_fn is not None
    plain = torch.autograd.grad(kermac.run_kernel(name, x, z, backend=backend, **kw), (x, z), g)
    assert_close(gx, plain[0], 1e-12)  # the same fused computation (a GPU backend may sum in another order)
    assert_close(gz, plain[1], 1e-12)
    ux, uz = torch.randn_like(x), torch.randn_like(z)
    penalty = (gx**2).sum() + (gz * uz).sum() + (gx * ux).sum()
    got = torch.autograd.grad(penalty, (x, z))
    x64, z64 = x.detach().cpu().requires_grad_(), z.detach().cpu().requires_grad_()
    kw64 = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    rx, rz = torch.autograd.grad(explicit(name, x64, z64, **kw64), (x64, z64), g.cpu(), create_graph=True)
    want = torch.autograd.grad((rx**2).sum() + (rz * uz.cpu()).sum() + (rx * ux.cpu()).sum(), (x64, z64))
    for a, b in zip(got, want, strict=True):
        assert_close(a, b, 1e-9)


def test_second_derivative_with_respect_to_the_upstream_gradient_and_third_order():
    """d(∂L/∂x)/dg (g itself depends on parameters) and a third derivative of the Gaussian kernel."""
    x = torch.randn(4, 2, dtype=torch.float64, requires_grad=True)
    z = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)

    def first(a, b, weights):
        k = kermac.run_kernel("gaussian", a, b, bandwidth=0.9, backend="torch")
        return torch.autograd.grad(k, (a, b), weights, create_graph=True)

    assert torch.autograd.gradcheck(lambda a, b, c: first(a, b, c), (x, z, w))
    assert torch.autograd.gradgradcheck(lambda a, b, c: first(a, b, c), (x, z, w))


@pytest.mark.parametrize(
    ("call", "what"),
    [
        (lambda x, z: kermac.cdist(x, z, 1.0), "cdist"),
        (lambda x, z: kermac.cdist(x, z, 1.5), "cdist"),
        (lambda x, z: kermac.cdist(x, z, torch.tensor([2.0, 3.0], dtype=x.dtype)), "cdist"),
        (lambda x, z: kermac.cdist(x, z, math.inf), "cdist"),
        (lambda x, z: kermac.run_kernel("laplace_l1", x, z, bandwidth=1.0), "run_kernel"),
    ],
)
def test_unsupported_second_derivatives_raise(call, what):
    """Where kermac has no second derivative, asking for one raises instead of giving zeros."""
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    z = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    out = call(x, z)
    (gx,) = torch.autograd.grad(out.sum(), x, create_graph=True)
    (plain,) = torch.autograd.grad(call(x, z).sum(), x)
    assert torch.equal(gx, plain) and gx.grad_fn is not None
    with pytest.raises(NotImplementedError, match=f"{what}: second derivatives are implemented for programs summing"):
        torch.autograd.grad(gx.pow(2).sum(), x)


def test_p_zero_second_derivative_is_zero():
    """A count is piecewise constant: its derivatives of every order are 0 (not an error)."""
    x = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    (gx,) = torch.autograd.grad(
        kermac.cdist(x, torch.randn(4, 2, dtype=torch.float64), 0.0).sum(), x, create_graph=True
    )
    assert not gx.any()


LINF = {  # name -> (descriptor, run_kernel arguments)
    "cdist_inf": (kermac.presets.linf_distance, {}),
    "laplace_linf": (kermac.presets.linf_distance.replace(kernel="laplace"), {"bandwidth": 1.7}),
    "max_pow": (kermac.KernelDescriptor(power="pow", reduction="max", outer="root"), {"p": 2.5}),
    "min_square": (kermac.KernelDescriptor(power="square", reduction="min"), {}),
}


@pytest.mark.parametrize("name", sorted(LINF))
def test_max_and_min_gradients_gradcheck(name, monkeypatch):
    """p = ∞ (and any max/min of |x − z|^P) is differentiable: gradcheck away from ties, over several chunks."""
    import kermac.reference.backend as reference

    monkeypatch.setattr(reference, "CHUNK_ELEMENTS", 24)  # blocks of a few pairs: the chunk loop runs
    desc, kw = LINF[name]
    x = torch.randn(2, 5, 4, dtype=torch.float64, requires_grad=True)
    z = torch.randn(1, 6, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: kermac.run_kernel(desc, a, b, backend="torch", **kw), (x, z))


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
def test_p_inf_gradient_matches_torch_cdist(backend, device):
    """Forward and backward of p = ∞ with requires_grad inputs, against torch.cdist's gradient (no ties)."""
    require_backend(backend, device, "grad")
    x, z = inputs(device, *sizes(device))
    d = kermac.cdist(x, z, math.inf, backend=backend)
    g = torch.randn_like(d)
    gx, gz = torch.autograd.grad(d, (x, z), g)
    x64, z64 = x.detach().double().cpu().requires_grad_(), z.detach().double().cpu().requires_grad_()
    ref = torch.cdist(x64, z64, p=math.inf)
    rx, rz = torch.autograd.grad(ref, (x64, z64), g.double().cpu())
    assert_close(d, ref, 1e-6)
    assert_close(gx, rx, GRAD_TOL)
    assert_close(gz, rz, GRAD_TOL)


def test_p_inf_ties_share_the_gradient_and_nan_is_skipped():
    """Tied coordinates share the gradient equally (a subgradient; torch.cdist gives each the whole of it);
    a pair at distance 0 contributes nothing; a NaN coordinate, which the maximum skips (as torch.cdist's
    forward does), does not change the distance and gets no gradient (torch.cdist's backward gives NaN)."""
    x = torch.tensor([[1.0, -1.0, 0.0], [0.0, 0.0, 0.5], [math.nan, 2.0, 0.0]], dtype=torch.float64)
    z = torch.tensor([[0.0, 0.0, 0.5]], dtype=torch.float64)
    x.requires_grad_()
    gx = torch.autograd.grad(kermac.cdist(x, z, math.inf).sum(), x)[0]
    expected = torch.tensor([[0.5, -0.5, 0.0], [0.0, 0.0, 0.0], [0.0, 1.0, 0.0]], dtype=torch.float64)
    assert torch.equal(gx, expected)


def test_meta_tensors_differentiate_at_once():
    """Forward and backward on meta tensors: shapes only, no chunk loop."""
    x = torch.empty(1 << 20, 32, device="meta", requires_grad=True)
    z = torch.empty(1 << 19, 32, device="meta", requires_grad=True)
    for call in (lambda: kermac.cdist(x, z, math.inf), lambda: kermac.run_kernel("gaussian", x, z, bandwidth=1.0)):
        gx, gz = torch.autograd.grad(call().sum(), (x, z))
        assert gx.shape == x.shape and gz.shape == z.shape and gx.device.type == "meta"


def test_hyperparameter_changed_in_place_before_backward():
    """The backward reads the forward's hyperparameters: one changed in place in between is an error (as
    for any saved tensor), not a gradient of another function; a checked copy (no debug) is private."""
    from kermac import ir

    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    z = torch.randn(5, 3, dtype=torch.float64)
    sigma = torch.tensor([1.5], dtype=torch.float64)
    expected = torch.autograd.grad(kermac.run_kernel("laplace_l1", x, z, bandwidth=1.5).sum(), x)[0]
    k = kermac.run_kernel("laplace_l1", x, z, bandwidth=sigma)
    sigma.mul_(2)
    torch.testing.assert_close(torch.autograd.grad(k.sum(), x)[0], expected)
    k = kermac.run_kernel("laplace_l1", x, z, bandwidth=sigma, debug=True)  # debug: sigma itself is read
    sigma.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(k.sum(), x)
    beta = torch.tensor([2.0], dtype=torch.float64)
    prog = kermac.PairwiseProgram(abs(ir.Var("x") - ir.Var("z")), "sum", ir.exp(-ir.Var("acc") * ir.Hyper("beta")))
    k = kermac.run_program(prog, x, z, hypers={"beta": beta})
    beta.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(k.sum(), x)


def test_diagonal_in_the_epilogue_with_extreme_offsets():
    """e'(acc) reads the diagonal at the forward's place, for offsets at the ends of the int64 range."""
    np = pytest.importorskip("numpy")
    from kermac import ir

    t = ir.Var("x") - ir.Var("z")
    prog = kermac.PairwiseProgram(t * t, "sum", ir.exp(-ir.Var("acc")) * (1.0 + ir.Var("diag")))
    x = torch.randn(4, 2, dtype=torch.float64, requires_grad=True)
    z = torch.randn(5, 2, dtype=torch.float64, requires_grad=True)
    offsets = [(np.int64(2**63 - 1), np.int64(2**63 - 2)), (-(2**63), -(2**63) + 2), (2**63 - 1, -(2**63)), (-3, 0)]
    for om, on in offsets:
        got = torch.autograd.grad(kermac.run_program(prog, x, z, offset_m=om, offset_n=on).sum(), (x, z))
        shift = max(min(int(om) - int(on), 5), -4)  # (i, j) is on the diagonal iff j − i = om − on
        diag = (torch.arange(4)[:, None] + shift == torch.arange(5)[None, :]).double()
        sq = ((x[:, None] - z[None]) ** 2).sum(-1)
        want = torch.autograd.grad((torch.exp(-sq) * (1 + diag)).sum(), (x, z))
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b)
