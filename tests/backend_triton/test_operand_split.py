"""The float32 tensor-core kernel product past `PRODUCT_TC_RESIDENT_D` features reads operands split once for
3×TF32 (`kermac_backend_triton.operand_split`).

- the workspace: hi is TF32 (low 13 bits 0), hi + lo is the value to float32 rounding of lo, zeros past D up to
  a multiple of `BK`, norms the float64 ones to float32 accuracy; a batch dimension broadcast in the operand is
  split once and stays broadcast; batch dimensions that do not merge give no workspace;
- the product through it (asserting the workspace was taken) against the float64 dense product: sizes that are
  no tile multiple, D not a multiple of `BK`, one and several columns, broadcast batches with batched
  hyperparameters, transposed and strided views, regularisation on a shifted diagonal, x = z (one workspace),
  near-duplicate rows (the SIMT recompute), ±inf in x and NaN in v propagating as in the dense product, and the
  batch layout without a workspace giving the same values;
- `gpu`: the same at real sizes, tuned and untuned.
"""

from __future__ import annotations

import pytest
import torch
from helpers import assert_close, device_under_test, skip_unless_triton_runs, tolerance

import kermac
from kermac import presets
from kermac.hyperparams import program_hypers
from kermac.problem import product_problem

backend_module = pytest.importorskip("kermac_backend_triton.backend")
launch = pytest.importorskip("kermac_backend_triton.launch")
configs = pytest.importorskip("kermac_backend_triton.configs")
operand_split = pytest.importorskip("kermac_backend_triton.operand_split")
TritonTuning = pytest.importorskip("kermac_backend_triton.tuning").TritonTuning

UNTUNED = TritonTuning(autotune=False)
BK = configs.PRODUCT_TC_SPLIT_BK


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64).float().to(device_under_test())


@pytest.fixture
def splits(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """The shapes of the operands split by the launches of the test (the real split runs)."""
    seen: list[tuple[int, ...]] = []
    real = operand_split.split_operand

    def spy(t: torch.Tensor, block_k: int):
        seen.append(tuple(t.shape))
        return real(t, block_k)

    monkeypatch.setattr(operand_split, "split_operand", spy)
    return seen


def _product(name, x, z, v, hypers, *, tuning=UNTUNED, out=None, regularized=False, **offsets) -> torch.Tensor:
    program = presets.ALL[name].lower(regularized=regularized)
    hv = program_hypers(program.hypers, hypers, x.device, False)
    problem = product_problem(program, x, z, v, out=out, hypers=hv, **offsets)
    backend_module.TritonBackend(tuning).product(problem)
    return problem.out


def _reference(name, x, z, v, hypers, *, regularized=False, **offsets) -> torch.Tensor:
    program = presets.ALL[name].lower(regularized=regularized)
    h64 = {k: val.double() if isinstance(val, torch.Tensor) else val for k, val in hypers.items()}
    return kermac.run_program(program, x.double(), z.double(), hypers=h64, backend="torch", **offsets) @ v.double()


def _check(name, x, z, v, hypers, **kw) -> torch.Tensor:
    out = _product(name, x, z, v, hypers, **kw)
    kw.pop("tuning", None)
    kw.pop("out", None)
    assert_close(out, _reference(name, x, z, v, hypers, **kw), tolerance(torch.float32))
    return out


# --- the workspace -----------------------------------------------------------------------------------


def test_the_workspace_holds_the_split_rows_their_padding_and_norms() -> None:
    device = device_under_test()
    skip_unless_triton_runs(device)
    x = _randn(37, 45) * 1e3
    ws = operand_split.split_operand(x, BK)
    assert ws.hi.shape == ws.lo.shape == (37, 64) and ws.norm.shape == (37,)
    bits = ws.hi.view(torch.int32)
    assert ((bits & 0x1FFF) == 0).all()  # TF32: 10 significant bits
    assert ((ws.lo.view(torch.int32) & 0x1FFF) == 0).all()
    recon = ws.hi[:, :45].double() + ws.lo[:, :45].double()
    assert ((recon - x.double()).abs() <= 2.0**-21 * x.double().abs()).all()
    assert (ws.hi[:, 45:] == 0).all() and (ws.lo[:, 45:] == 0).all()
    assert_close(ws.norm, (x.double() ** 2).sum(1), 1e-6)


def test_a_broadcast_batch_dimension_is_split_once_and_stays_broadcast() -> None:
    device = device_under_test()
    skip_unless_triton_runs(device)
    x = _randn(1, 3, 9, 40).expand(4, 3, 9, 40)
    ws = operand_split.split_operand(x, BK)
    assert ws.hi.shape == (4, 3, 9, 64) and ws.hi.stride(0) == 0 and ws.norm.stride(0) == 0
    single = operand_split.split_operand(x[0, 2], BK)
    assert torch.equal(ws.hi[3, 2], single.hi) and torch.equal(ws.lo[1, 2], single.lo)
    assert torch.equal(ws.norm[2, 2], single.norm)


def test_batch_dimensions_that_do_not_merge_give_no_workspace() -> None:
    device = device_under_test()
    skip_unless_triton_runs(device)
    x = _randn(3, 5, 7, 40)[:, :4]  # [3, 4, 7, 40]: dimension 0 steps over 5 rows of dimension 1
    assert operand_split.split_operand(x, BK) is None
    assert operand_split.split_operand(x[:, :1], BK) is not None  # size-1 dimensions merge with any


def test_batches_past_the_grid_limit_take_several_launches(monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA's second grid dimension holds at most 65 535 batch entries: more are split in launches of that many
    (here 2, against one launch)."""
    device = device_under_test()
    skip_unless_triton_runs(device)
    x = _randn(5, 1, 6, 40).expand(5, 3, 6, 40)
    whole = operand_split.split_operand(x, BK)
    monkeypatch.setattr(operand_split, "MAX_GRID_Y", 2)
    chunked = operand_split.split_operand(x, BK)
    for name in ("hi", "lo", "norm"):
        assert torch.equal(getattr(chunked, name), getattr(whole, name)), name


# --- the product through it ---------------------------------------------------------------------------


@pytest.mark.parametrize(("m", "n", "d", "c"), [(21, 40, 33, 1), (37, 19, 70, 3), (17, 23, 64, 17)])
def test_sizes_against_the_dense_product(m, n, d, c, splits) -> None:
    device = device_under_test()
    skip_unless_triton_runs(device)
    for name in ("gaussian", "laplace_l2"):
        _check(name, _randn(m, d), _randn(n, d), _randn(n, c), {"bandwidth": d**0.5})
    assert splits == [(m, d), (n, d)] * 2


def test_x_is_z_is_split_once_and_regularised_on_a_shifted_diagonal(splits) -> None:
    device = device_under_test()
    skip_unless_triton_runs(device)
    x = _randn(30, 41)
    hypers = {"bandwidth": 9.0, "regularization": 0.5}
    for offsets in ({}, {"offset_m": 3}, {"offset_n": 5}):
        for c in (1, 4):
            _check("gaussian", x, x, _randn(30, c), hypers, regularized=True, **offsets)
    assert splits == [(30, 41)] * 6


def test_broadcast_batches_views_and_batched_hyperparameters(splits) -> None:
    device = device_under_test()
    skip_unless_triton_runs(device)
    x = _randn(2, 1, 50, 17).mT[..., :13, :]  # [2, 1, 13, 50], transposed
    z = _randn(3, 40, 100)[:, ::2, ::2]  # [3, 20, 50], strided
    v = _randn(1, 2, 20).mT  # [1, 20, 2]
    hypers = {"bandwidth": torch.tensor([6.0, 7.0, 9.0], device=device), "regularization": 0.25}
    out = _check("gaussian", x, z, v, hypers, regularized=True, offset_m=2)
    assert out.shape == (2, 3, 13, 2)
    _check("gaussian", x, z, v[..., :1], hypers, regularized=True, offset_m=2)
    assert len(splits) == 4


def test_near_duplicate_rows_are_recomputed_and_specials_propagate() -> None:
    device = device_under_test()
    skip_unless_triton_runs(device)
    x = _randn(20, 40) * 30.0 + 100.0  # large norms: the expansion cancels badly near d = 0
    z = torch.cat([x[:13], _randn(7, 40) * 30.0 + 100.0])
    for c in (1, 2):
        _check("laplace_l2", x, z, _randn(20, c), {"bandwidth": 60.0})
    x, z, v = _randn(9, 36), _randn(11, 36), _randn(11, 3)
    x[2, 5] = float("inf")
    v[4, 1] = float("nan")
    for cols in (slice(0, 3), slice(1, 2)):
        got = _product("laplace_l2", x, z, v[:, cols], {"bandwidth": 5.0}).double()
        ref = _reference("laplace_l2", x, z, v[:, cols], {"bandwidth": 5.0})
        assert torch.equal(torch.isnan(got), torch.isnan(ref))
        finite = torch.isfinite(ref)
        assert_close(got[finite], ref[finite], tolerance(torch.float32))


def test_batches_that_do_not_merge_compute_the_same_without_a_workspace(splits) -> None:
    device = device_under_test()
    skip_unless_triton_runs(device)
    x = _randn(3, 5, 7, 40)[:, :4]
    z, v = _randn(3, 1, 11, 40), _randn(11, 2)
    _check("gaussian", x, z, v, {"bandwidth": 8.0})
    assert splits == [(3, 4, 7, 40)]  # x gave no workspace: neither operand is read from one


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_operands_on_a_second_gpu_are_split_there(splits) -> None:
    """Device 0 current, operands on device 1: the split runs on device 1 (and its current stream)."""
    x, z, v = (t.to("cuda:1") for t in (_randn(300, 100), _randn(200, 100), _randn(200, 4)))
    with torch.cuda.device(0):
        _check("gaussian", x, z, v, {"bandwidth": 7.0})
    assert splits == [(300, 100), (200, 100)]


# --- real sizes on the GPU ------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("tuning", [TritonTuning(), UNTUNED], ids=["tuned", "untuned"])
@pytest.mark.parametrize(("d", "c"), [(33, 1), (128, 16), (300, 1), (784, 10)])
def test_real_sizes_on_the_gpu(tuning, d, c, splits) -> None:
    x, z, v = _randn(3001, d), _randn(4099, d), _randn(4099, c)
    _check("gaussian", x, z, v, {"bandwidth": (2 * d) ** 0.5, "regularization": 1e-2}, regularized=True, tuning=tuning)
    _check("laplace_l2", x, x[:2000], v[:2000], {"bandwidth": d**0.5}, tuning=tuning)
    if torch.cuda.get_device_capability()[0] == 9:
        assert splits == [(3001, d), (4099, d), (3001, d), (2000, d)]
    else:
        assert splits == []
