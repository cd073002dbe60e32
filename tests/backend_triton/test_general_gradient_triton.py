"""The Triton backend's general gradient kernel (`kermac_backend_triton.general_gradient`) against independent
float64 formulas written with broadcasting (no kermac code):

- every tile configuration (the interpreter's and each of the GPU's autotuning space), K below, at and past
  whole unrolled steps, O within one and over two `BO` tiles;
- float16 and bfloat16 inputs (computed in float32);
- views: a transposed operand, a strided one, two batch dimensions with a broadcast operand and a per-batch
  (tensor) hyperparameter; M, N or O of 0;
- 64-bit indices;
- NaN and ±inf through a minimum (NaN propagates, as the IR's `min`).
- functions that read fewer operands (a constant multiply, accumulate or epilogue) fill the whole tile.

The general programs' values on every backend, K = 0 and the product-form route are in
tests/test_general_grad_programs.py and the conformance cases `grad_user_*`.
"""

from __future__ import annotations

import pytest
import torch
from helpers import BACKEND_DEVICES, require_backend

import kermac
from kermac import ir
from kermac.hyperparams import HyperValue
from kermac.ir import Hyper, Var
from kermac.problem import grad_problem
from kermac.programs import GradProgram

pytest.importorskip("triton")
launch = pytest.importorskip("kermac_backend_triton.launch")
configs = pytest.importorskip("kermac_backend_triton.configs")
generated = pytest.importorskip("kermac_backend_triton.generated")

TRITON_DEVICES = [p for p in BACKEND_DEVICES if p.values[0] == "triton"]
A, B, C, D, TERM, ACC = (Var(n) for n in ("a", "b", "c", "d", "term", "acc"))
GAMMA = 0.7


def _pieces(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """`a[k, m]`, `b[n, k]`, `c[o, k]`, `d[n, m]` (with any batch) broadcast to `[..., o, n, m, k]`."""
    return a.mT[..., None, None, :, :], b[..., None, :, None, :], c[..., :, None, None, :], d[..., None, :, :, None]


# name → (program, float64 formula of out[..., o, n, m] from the broadcast pieces and gamma)
PROGRAMS = {
    "max": (
        GradProgram(abs(D - B) - A, ACC, TERM * C, "max"),
        lambda a, b, c, d, g: (c * ((d - b).abs() - a)).amax(-1),
    ),
    "min": (GradProgram(A * B - D, ACC, TERM - C, "min"), lambda a, b, c, d, g: (a * b - d - c).amin(-1)),
    "logsumexp": (
        GradProgram(A * (D - B) / Hyper("gamma"), Hyper("gamma") * ACC, C * TERM, "logsumexp"),
        lambda a, b, c, d, g: g * torch.logsumexp(c * a * (d - b) / g, -1),
    ),
    "sum": (
        GradProgram(A + (D - B) * (D - B), ir.exp(-ACC / Hyper("gamma")), ir.exp(C) * TERM),
        lambda a, b, c, d, g: torch.exp(-(torch.exp(c) * (a + (d - b) ** 2)).sum(-1) / g),
    ),
}


def _operands(k: int, m: int, n: int, o: int, seed: int, batch: tuple[int, ...] = ()) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shapes = ((*batch, k, m), (*batch, n, k), (*batch, o, k), (*batch, n, m))
    return [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]


def _reference(name: str, a, b, c, d, gamma=GAMMA) -> torch.Tensor:
    return PROGRAMS[name][1](*_pieces(*(t.double().cpu() for t in (a, b, c, d))), gamma)


def _close(out: torch.Tensor, ref: torch.Tensor, rtol: float, what: str) -> None:
    """Relative to the largest magnitude of the reference."""
    assert out.shape == ref.shape, what
    error = ((out.double().cpu() - ref).abs() / ref.abs().max().clamp_min(1e-300)).max().item()
    assert error <= rtol, f"{what}: relative error {error:.3g} > {rtol}"


def test_general_programs_take_the_general_kernel() -> None:
    for program, _ in PROGRAMS.values():
        assert generated.grad_kernel(program) == "grad_general"


@pytest.mark.parametrize(("backend", "device"), TRITON_DEVICES)
@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_every_configuration(backend: str, device: str, name: str, dtype: torch.dtype) -> None:
    """Each tile configuration forced (`run_grad(meta=…)`): K below, at and past whole steps of `BK`, O = 17 over
    two `BO` tiles, odd M and N (clamped rows, masked stores)."""
    require_backend(backend, device, "grad")
    program = PROGRAMS[name][0]
    if launch.interpreting():
        metas = [dict(configs.INTERPRET_GENERAL_GRAD)] + [dict(meta) for meta, *_ in configs.GENERAL_GRAD_SPACE]
    else:
        metas = [configs.launch_options(entry) for entry in configs.GENERAL_GRAD_SPACE]
    hypers = {"gamma": HyperValue("gamma", GAMMA)} if program.hypers else {}
    for k, o in ((3, 2), (8, 17), (13, 1)):
        a, b, c, d = (t.to(device, dtype) for t in _operands(k, 37, 19, o, seed=k))
        ref = _reference(name, a, b, c, d)
        for meta in metas:
            problem = grad_problem(program, a, b, c, d, out=None, hypers=hypers)
            problem.out.fill_(torch.nan)
            launch.run_grad(problem, meta)
            _close(problem.out, ref, 1e-12 if dtype == torch.float64 else 2e-5, f"K={k} O={o} {meta}")


@pytest.mark.parametrize(("backend", "device"), TRITON_DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_half_inputs_compute_in_float32(backend: str, device: str, dtype: torch.dtype) -> None:
    """Half inputs give a half output, computed in float32: the formula on the rounded inputs, rounded once."""
    require_backend(backend, device, "grad")
    program = PROGRAMS["logsumexp"][0]
    a, b, c, d = (t.to(device, dtype) for t in _operands(21, 13, 11, 3, seed=5))
    out = kermac.run_grad_program(program, a, b, c, d, hypers={"gamma": GAMMA}, backend=backend)
    assert out.dtype == dtype
    ref = _reference("logsumexp", a, b, c, d)
    _close(out, ref, 2 * torch.finfo(dtype).eps, str(dtype))


@pytest.mark.parametrize(("backend", "device"), TRITON_DEVICES)
def test_views_batches_and_tensor_hyperparameters(backend: str, device: str) -> None:
    """A transposed `a`, a strided `c`, batch `[2, 3]` with `b` broadcast over its first dimension, and one gamma
    per row of the batch (a `[2, 1]` tensor); then M, N and O of 0."""
    require_backend(backend, device, "grad")
    program = PROGRAMS["logsumexp"][0]
    a, _, c, d = _operands(10, 9, 7, 5, seed=7, batch=(2, 3))
    (b,) = _operands(10, 9, 7, 5, seed=8, batch=(1, 3))[1:2]
    gamma = torch.tensor([[0.5], [2.0]], dtype=torch.float64)
    a_t = a.mT.contiguous().mT  # its rows are contiguous
    c_s = torch.cat([c, c], -1)[..., ::2].copy_(c)  # every other column of a wider tensor
    assert not a_t.is_contiguous() and c_s.stride(-1) == 2
    ap, bp, cp, dp = _pieces(a, b, c, d)
    g = gamma[..., None, None, None]
    ref = g * torch.logsumexp(cp * ap * (dp - bp) / g[..., None], -1)
    operands = (t.to(device) for t in (a_t, b.expand(2, 3, 7, 10), c_s, d))
    out = kermac.run_grad_program(program, *operands, hypers={"gamma": gamma.to(device)}, backend=backend)
    assert out.shape == (2, 3, 5, 7, 9)
    _close(out, ref, 1e-12, "views")
    for k, m, n, o in ((4, 0, 3, 2), (4, 5, 0, 2), (4, 5, 3, 0)):
        empty = _operands(k, m, n, o, seed=9)
        assert kermac.run_grad_program(program, *empty, hypers={"gamma": 1.0}, backend=backend).shape == (o, n, m)


@pytest.mark.parametrize(("backend", "device"), TRITON_DEVICES)
def test_64_bit_indices(backend: str, device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The 64-bit index variant (taken past 2³¹ elements) computes the same values."""
    require_backend(backend, device, "grad")
    specs = []
    real = launch._kernel
    monkeypatch.setattr(launch, "_kernel", lambda spec, a, d: specs.append(spec) or real(spec, a, d))
    monkeypatch.setattr(launch, "_needs_int64", lambda tensors, programs: True)
    a, b, c, d = (t.to(device) for t in _operands(11, 10, 6, 3, seed=3, batch=(2,)))
    out = kermac.run_grad_program(PROGRAMS["max"][0], a, b, c, d, backend=backend)
    assert specs and all(s.int64 for s in specs)
    _close(out, _reference("max", a, b, c, d), 1e-12, "64-bit indices")


@pytest.mark.parametrize(("backend", "device"), TRITON_DEVICES)
def test_a_minimum_propagates_nan_and_infinities(backend: str, device: str) -> None:
    """NaN in a term makes its minimum NaN; −∞ (and no NaN) makes it −∞; +∞ terms lose to finite ones."""
    require_backend(backend, device, "grad")
    a, b, c, d = _operands(9, 6, 5, 2, seed=4)
    b[0, 1] = torch.nan
    b[2, 3] = torch.inf  # a·b − d − c = −∞ where a < 0, +∞ where a > 0
    a[4, :] = torch.inf
    ref = _reference("min", a, b, c, d)
    out = kermac.run_grad_program(PROGRAMS["min"][0], *(t.to(device) for t in (a, b, c, d)), backend=backend).cpu()
    assert ref.isnan().any() and ref.isneginf().any()
    assert torch.equal(out.isnan(), ref.isnan())
    special = ~ref.isfinite() & ~ref.isnan()
    assert torch.equal(out[special], ref[special])
    torch.testing.assert_close(out[ref.isfinite()], ref[ref.isfinite()], rtol=1e-12, atol=0)


@pytest.mark.parametrize(("backend", "device"), TRITON_DEVICES)
def test_functions_of_fewer_operands_broadcast(backend: str, device: str) -> None:
    """A constant multiply (`max_k c`), an accumulate without `c` (`Σ_k (a + b)`) and one of neither operand
    (`Σ_k 1 = K`), a constant epilogue: each fills the whole `[o, n, m]` tile."""
    require_backend(backend, device, "grad")
    a, b, c, d = _operands(7, 5, 4, 3, seed=6)
    ap, bp, _, _ = _pieces(a, b, c, d)
    cases = [
        (GradProgram(ir.Const(2.0), ACC, C, "max"), c.amax(-1)[:, None, None].expand(3, 4, 5)),
        (GradProgram(A + B, ACC, TERM), (ap + bp).sum(-1).expand(3, 4, 5)),
        (GradProgram(A + B, ACC, ir.Const(1.0)), torch.full((3, 4, 5), 7.0, dtype=torch.float64)),
        (GradProgram(A * B - D, ir.Const(3.0), TERM - C, "min"), torch.full((3, 4, 5), 3.0, dtype=torch.float64)),
    ]
    for program, ref in cases:
        out = kermac.run_grad_program(program, *(t.to(device) for t in (a, b, c, d)), backend=backend)
        _close(out, ref, 1e-12, program.key())
