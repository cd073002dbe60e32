"""Predictor gradients of p-norm kernels as row blocks of the slope matrix and `cdist_grad` (`kermac.jacobian_blocked`).

On the CPU the route is forced (`applies` patched, blocks of a few rows) through `kermac.predictor_gradient` on the
reference backend and the Triton interpreter, and checked against torch autograd of the dense float64 predictor and
against the fused route: Laplace-L1, Laplace-Lp, the l1 and Lp distances (P < 1, 1 < P < 2, P > 2), rows that are
no multiple of the block, one and several outputs, duplicated points (`acc = 0`), NaN in α.  When it applies: the
measured rule (`faster_blocked`) on `meta` tensors, only `backend="auto"` on a CUDA device.  On the GPU `auto` takes
it for Laplace-L1 with several outputs and matches float64.
"""

from __future__ import annotations

import logging

import pytest
import torch
from helpers import CPU_BACKENDS, require_backend
from test_predictor import _dense_jacobian, _randn

import kermac
from kermac import ir, jacobian_blocked, presets, product_blocked
from kermac.hyperparams import program_hypers
from kermac.programs import LINF_TERM, PairwiseProgram

F64 = torch.float64
P_NORMS = [
    ("laplace_l1", {"bandwidth": 1.3}),
    ("l1_distance", {}),
    ("laplace_lp", {"bandwidth": 1.3, "p": 1.5}),
    ("lp_distance", {"p": 0.7}),
    ("lp_distance", {"p": 3.0}),
]


@pytest.fixture
def forced(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every predictor gradient of a p-norm kernel takes the blocked route in blocks of 5 rows; lists the calls' M."""
    calls: list[int] = []
    real = jacobian_blocked.blocked_jacobian

    def spy(program, x, *args, **kwargs):
        calls.append(x.shape[0])
        return real(program, x, *args, **kwargs)

    def forced_applies(program, x, z, alpha, hypers, backend):
        return jacobian_blocked.difference_exponent(program, hypers) is not None

    monkeypatch.setattr(jacobian_blocked, "applies", forced_applies)
    monkeypatch.setattr(jacobian_blocked, "blocked_jacobian", spy)
    monkeypatch.setattr(product_blocked, "BLOCK_ELEMENTS", 5 * 29)
    return calls


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize(("name", "kw"), P_NORMS, ids=[f"{n}-{kw.get('p', '')}" for n, kw in P_NORMS])
@pytest.mark.parametrize("c", [1, 3])
def test_blocks_match_autograd_of_the_dense_predictor(backend: str, name: str, kw: dict, c: int, forced) -> None:
    require_backend(backend, "cpu", "product")
    dtype = F64 if backend == "torch" else torch.float32
    x, z, alpha = _randn(23, 4, seed=1), _randn(29, 4, seed=2) + 0.1, _randn(29, c, seed=3)
    want = _dense_jacobian(lambda xx: kermac.run_kernel(name, xx, z, backend="torch", **kw) @ alpha, x)
    got = kermac.predictor_gradient(name, *(t.to(dtype) for t in (x, z, alpha)), backend=backend, **kw)
    assert got.shape == (23, c, 4) and got.dtype == dtype and forced == [23]
    tol = 1e-10 if dtype == F64 else 3e-5
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * want.abs().max().item())


T = ir.Var("x") - ir.Var("z")
DIAGONAL = PairwiseProgram(abs(T), "sum", ir.exp(-ir.Var("acc")) * (1.0 + ir.Var("diag")))
"""Laplace-L1 with its diagonal doubled: a slope that reads the diagonal, found at each block's centres."""
POWER_Q = PairwiseProgram(ir.pow(abs(T), ir.Hyper("q")), "sum", ir.exp(-ir.Hyper("g") * ir.Var("acc")))
"""A user's `Σ |x − z|^q` whose epilogue reads another hyperparameter."""


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize(
    ("program", "hypers"),
    [(DIAGONAL, {}), (POWER_Q, {"q": 0.6, "g": 0.7}), (POWER_Q, {"q": 2.0, "g": 0.7})],
    ids=["diagonal", "q=0.6", "q=2"],
)
def test_user_programs_in_blocks(backend: str, program: PairwiseProgram, hypers: dict, forced) -> None:
    """User programs: an epilogue reading the diagonal (x and z of one set, so it lies in every block of
    centres), and `|x − z|^q` with a hyperparameter q (2 included: not the squared-difference form)."""
    require_backend(backend, "cpu", "product")
    dtype = F64 if backend == "torch" else torch.float32
    z, alpha = _randn(29, 4, seed=7), _randn(29, 3, seed=8)
    x = z.clone() if program is DIAGONAL else _randn(23, 4, seed=9)
    want = _dense_jacobian(lambda xx: kermac.run_program(program, xx, z, hypers=hypers, backend="torch") @ alpha, x)
    got = kermac.predictor_gradient(program, *(t.to(dtype) for t in (x, z, alpha)), backend=backend, **hypers)
    assert forced == [x.shape[0]]
    tol = 1e-10 if dtype == F64 else 3e-5
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * want.abs().max().item())


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_duplicated_points_and_nan_agree_with_the_fused_route(backend: str, forced, monkeypatch) -> None:
    """Points of `x` that are centres (every difference 0: the pair contributes 0 on both routes), and a NaN in
    one column of α, which makes that output NaN and leaves the others finite, as the fused route does."""
    require_backend(backend, "cpu", "product")
    dtype = F64 if backend == "torch" else torch.float32
    z, alpha = _randn(29, 3, seed=4).to(dtype), _randn(29, 3, seed=5).to(dtype)
    x = torch.cat([z[::4], _randn(11, 3, seed=6).to(dtype)])  # centres of every block of 7 among the points
    alpha[4, 1] = float("nan")
    for name, kw in (("laplace_l1", {"bandwidth": 2.0}), ("laplace_lp", {"bandwidth": 2.0, "p": 1.5})):
        got = kermac.predictor_gradient(name, x, z, alpha, backend=backend, **kw)
        with monkeypatch.context() as m:
            m.setattr(jacobian_blocked, "applies", lambda *args: False)
            fused = kermac.predictor_gradient(name, x, z, alpha, backend=backend, **kw)
        for jacobian in (got, fused):
            assert torch.isnan(jacobian[:, 1]).all() and torch.isfinite(jacobian[:, [0, 2]]).all()
        tol = 1e-10 if dtype == F64 else 3e-5
        finite = fused[:, [0, 2]]
        torch.testing.assert_close(got[:, [0, 2]], finite, rtol=tol, atol=tol * finite.abs().max().item())
    assert forced == [19, 19]


def _meta(name: str, m: int, n: int, d: int, c: int, dtype=torch.float32, grad=False, **hypers):
    program = presets.ALL[name].lower()
    given = ({"bandwidth": 2.0} if "bandwidth" in program.hypers else {}) | hypers
    hv = program_hypers(program.hypers, given, torch.device("meta"), False)
    x = torch.empty(m, d, dtype=dtype, device="meta", requires_grad=grad)
    z, alpha = torch.empty(n, d, dtype=dtype, device="meta"), torch.empty(n, c, dtype=dtype, device="meta")
    return program, x, z, alpha, hv


def test_the_measured_rule() -> None:
    big = 1 << 15
    faster = jacobian_blocked.faster_blocked
    assert faster(*_meta("laplace_l1", big, big, 3, 2))  # several outputs
    assert faster(*_meta("laplace_l1", big, big, 32, 1))  # or many features
    assert not faster(*_meta("laplace_l1", big, big, 3, 1))  # one output, few features: fused is faster
    assert faster(*_meta("laplace_lp", big, big, 8, 16, p=1.5))
    assert faster(*_meta("lp_distance", big, big, 8, 16, p=0.5))
    assert faster(*_meta("laplace_lp", big, big, 8, 16, p=2.0))  # a hyperparameter p = 2: not the (x − z)² form
    assert not faster(*_meta("gaussian", big, big, 8, 16))  # squared differences: one product
    assert not faster(*_meta("linf_distance", big, big, 8, 16))  # a maximum over features
    assert not faster(*_meta("l0_distance", big, big, 8, 16))  # a count: P = 0
    program, *tensors, hv = _meta("laplace_l1", big, big, 8, 16)
    assert not faster(PairwiseProgram(LINF_TERM, "sum", program.epilogue), *tensors, hv)  # skips NaN coordinates
    assert not faster(*_meta("laplace_l1", big, big, 8, 16, F64))
    assert not faster(*_meta("laplace_l1", big, big, 8, 16, grad=True))  # the fused route's result for autograd
    assert not faster(*_meta("laplace_l1", 1000, 1000, 8, 16))  # small
    assert not faster(*_meta("laplace_l1", big, big, 8, 0))  # no output
    batched = _meta("laplace_lp", big, big, 8, 16, p=torch.tensor([1.5], device="meta"))
    assert not faster(*batched)  # a tensor P


def test_only_auto_on_a_cuda_device() -> None:
    meta = _meta("laplace_l1", 1 << 15, 1 << 15, 3, 4)
    assert jacobian_blocked.faster_blocked(*meta) and not jacobian_blocked.applies(*meta, "auto")
    program, *_, hv = _meta("laplace_l1", 4, 4, 3, 4)
    cpu = (program, torch.randn(600, 3), torch.randn(600, 3), torch.randn(600, 4), hv)
    assert not jacobian_blocked.applies(*cpu, "auto")


def test_a_program_that_is_no_p_norm_is_refused() -> None:
    program, x, z, alpha, hv = _meta("gaussian", 4, 4, 3, 2)
    with pytest.raises(ValueError, match="program: expected a sum of"):
        jacobian_blocked.blocked_jacobian(program, x, z, alpha, hv)


@pytest.mark.gpu
@pytest.mark.parametrize(("name", "kw"), [("laplace_l1", {"bandwidth": 30.0}), ("laplace_lp", {"bandwidth": 30.0,
                                                                                               "p": 1.5})])  # fmt: skip
def test_auto_takes_blocks_on_the_gpu(name: str, kw: dict, caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    m, n, d, c = 1 << 14, (1 << 14) + 3, 8, 4
    x, z, alpha = torch.randn(m, d, device="cuda"), torch.randn(n, d, device="cuda"), torch.randn(n, c, device="cuda")
    with caplog.at_level(logging.DEBUG, logger="kermac"):
        got = kermac.predictor_gradient(name, x, z, alpha, debug=True, **kw)
    assert "blocks of the slope matrix and cdist_grad" in caplog.text
    rows = torch.cat([torch.arange(20), torch.arange(m - 20, m)]).cuda()
    zc, ac = z.double().cpu(), alpha.double().cpu()
    want = _dense_jacobian(
        lambda xx: kermac.run_kernel(name, xx, zc, backend="torch", **kw) @ ac, x[rows].double().cpu()
    )
    torch.testing.assert_close(got[rows].double().cpu(), want, rtol=3e-5, atol=3e-5 * want.abs().max().item())
