"""kermac_linalg.eigh_multi_gpu: the block-cyclic layout and argument checks on the CPU; the
cusolverMg solve against float64 references on every visible GPU (marked gpu)."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest
import torch
from linalg_helpers import assert_eigenpairs, symmetric
from test_linalg_eigh import TOL

import kermac_linalg as kl
from kermac_linalg import _eigh_mg
from kermac_linalg._mg_layout import BlockCyclic
from kermac_linalg._mg_worker import run_isolated


@pytest.mark.parametrize(("n", "block", "devices"), [(1, 1, 1), (5, 2, 2), (7, 3, 3), (600, 256, 2), (64, 16, 4)])
def test_block_cyclic_layout_deals_row_blocks_in_turn(n, block, devices):
    layout = BlockCyclic(n, block, devices)
    A = torch.randn(n, n, dtype=torch.float64)
    local = [torch.full((layout.local_rows(g), n), torch.nan, dtype=torch.float64) for g in range(devices)]
    layout.scatter(A, local)
    for b in range(layout.blocks):
        g, i = b % devices, b // devices
        rows = min(block, n - b * block)
        assert torch.equal(local[g][i * block : i * block + rows], A[b * block : b * block + rows])
        assert (local[g][i * block + rows : (i + 1) * block] == 0).all(), "padding rows must be zero"
    assert sum(layout.local_rows(g) for g in range(devices)) == layout.blocks * block
    out = torch.empty_like(A)
    layout.gather(local, out)
    assert torch.equal(out, A)


def test_rejects_bad_arguments_before_touching_a_device():
    with pytest.raises(ValueError, match=r"A must be one matrix \[N, N\].*\(2, 3, 3\)"):
        kl.eigh_multi_gpu(torch.zeros(2, 3, 3))
    with pytest.raises(ValueError, match=r"A must be a square matrix.*\(3, 4\)"):
        kl.eigh_multi_gpu(torch.zeros(3, 4))
    with pytest.raises(TypeError, match=r"A must have dtype torch\.float32 or torch\.float64, got torch\.int64"):
        kl.eigh_multi_gpu(torch.zeros(3, 3, dtype=torch.int64))
    with pytest.raises(TypeError, match="isolate must be a bool, got int"):
        kl.eigh_multi_gpu(torch.zeros(3, 3), isolate=1)
    with pytest.raises(ValueError, match="n must be a positive int, got 0"):
        kl.eigh_multi_gpu_workspace(0)
    with pytest.raises(TypeError, match=r"dtype must be torch\.float32 or torch\.float64, got torch\.float16"):
        kl.eigh_multi_gpu_workspace(4, dtype=torch.float16)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without CUDA devices")
def test_without_cuda_devices_says_so():
    with pytest.raises(RuntimeError, match=r"needs CUDA devices.*device_count\(\) == 0"):
        kl.eigh_multi_gpu(torch.eye(3))


@pytest.fixture
def three_fake_devices(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)


def test_device_list_resolution(three_fake_devices):
    assert _eigh_mg._device_ids(None) == [0, 1, 2]
    assert _eigh_mg._device_ids([2, "cuda:0", torch.device("cuda")]) == [2, 0, 1]
    ids, layout = _eigh_mg._distribution(100, [2, 0, 1], 64)  # two blocks: two devices take part
    assert ids == [2, 0] and layout == BlockCyclic(100, 64, 2)


@pytest.mark.parametrize(
    ("devices", "error", "message"),
    [
        ("cuda:0", TypeError, "devices must be a sequence of CUDA devices, got 'cuda:0'"),
        ([], ValueError, "at least one CUDA device"),
        (["cpu"], ValueError, "devices must be CUDA devices, got cpu"),
        ([3], ValueError, r"cuda:3 does not exist \(3 visible CUDA devices\)"),
        ([0, "cuda:0"], ValueError, r"devices must be distinct, got \[0, 0\]"),
        ([1.5], TypeError, "devices must hold CUDA device indices or names, got 1.5"),
    ],
)
def test_device_list_errors(three_fake_devices, devices, error, message):
    with pytest.raises(error, match=message):
        _eigh_mg._device_ids(devices)


@pytest.mark.parametrize("block_size", [0, -3, 2.0, True])
def test_block_size_must_be_a_positive_int(three_fake_devices, block_size):
    with pytest.raises(ValueError, match="block_size must be a positive int"):
        kl.eigh_multi_gpu(torch.eye(3), block_size=block_size)


def test_worker_failure_surfaces_the_child_traceback():
    with pytest.raises(RuntimeError, match=r"(?s)multi-GPU eigh worker failed: Traceback.*IndexError.*worker stderr"):
        run_isolated([0], [], 4, 4, solve=True)  # no arrays: the child fails inside the solve


def test_worker_without_a_request_reports_an_error(tmp_path):
    result = tmp_path / "r.pkl"
    proc = subprocess.run(
        [sys.executable, "-m", "kermac_linalg._mg_child", str(result)], input=b"", capture_output=True, check=False
    )
    assert proc.returncode == 1
    assert "Traceback" in pickle.loads(result.read_bytes())["error"]


# --- on the GPUs -----------------------------------------------------------------------------

gpu = pytest.mark.gpu


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("n", "block"), [(1, 256), (37, 8), (300, 64), (1000, 256)])
def test_eigenpairs_match_float64_reference(dtype, n, block):
    A = symmetric(n=n, dtype=dtype, device="cuda", seed=n)
    garbage = A.tril() + torch.full_like(A, 7.0).triu(1)  # only the lower triangle may be read
    kept = garbage.clone()
    W, V, info = kl.eigh_multi_gpu(garbage, block_size=block)
    assert W.shape == (n,) and V.shape == (n, n) and info.shape == () and info.dtype == torch.int32
    assert W.device == A.device and V.device == A.device and W.dtype == dtype and int(info) == 0
    assert_eigenpairs(A, W, V, TOL[dtype] * 10)
    assert torch.equal(garbage, kept), "A must be untouched without overwrite_a"


@gpu
def test_cpu_input_and_repeated_isolated_calls_agree():
    A = symmetric(n=257, device="cpu", seed=3)
    first = kl.eigh_multi_gpu(A, block_size=32)
    for _ in range(2):
        W, V, info = kl.eigh_multi_gpu(A, block_size=32)
        assert W.device.type == "cpu" and V.device.type == "cpu" and info.device.type == "cpu"
        torch.testing.assert_close(W, first[0], rtol=0, atol=1e-10)
    assert_eigenpairs(A, W, V, TOL[torch.float64] * 10)


@gpu
def test_overwrite_a_writes_the_eigenvectors_into_a():
    A = symmetric(n=130, device="cuda", seed=5)
    ref = A.clone()
    W, V, _ = kl.eigh_multi_gpu(A, overwrite_a=True, block_size=32)
    assert V.data_ptr() == A.data_ptr() and torch.equal(V, A.mT)
    assert_eigenpairs(ref, W, V, TOL[torch.float64] * 10)


@gpu
def test_each_device_as_the_only_one_and_a_matrix_on_another_device():
    for d in range(torch.cuda.device_count()):
        A = symmetric(n=90, dtype=torch.float32, device=f"cuda:{d}", seed=d)
        W, V, _ = kl.eigh_multi_gpu(A, devices=[torch.cuda.device_count() - 1 - d], block_size=16)
        assert W.device == A.device
        assert_eigenpairs(A, W, V, TOL[torch.float32] * 10)


@gpu
def test_workspace_query_reports_each_device():
    ws = kl.eigh_multi_gpu_workspace(1000, dtype=torch.float64, block_size=128)
    g = torch.cuda.device_count()
    assert ws.devices == tuple(range(g)) and len(ws.matrix_bytes) == g and ws.workspace_bytes > 0
    assert sum(ws.matrix_bytes) == BlockCyclic(1000, 128, g).blocks * 128 * 1000 * 8
    assert ws.total_bytes == tuple(m + ws.workspace_bytes for m in ws.matrix_bytes)


@gpu
def test_in_process_call_once():
    """``isolate=False``: one call in this process (the pytest process makes no other)."""
    A = symmetric(n=200, dtype=torch.float32, device="cuda", seed=9)
    W, V, info = kl.eigh_multi_gpu(A, isolate=False, block_size=64)
    assert int(info) == 0
    assert_eigenpairs(A, W, V, TOL[torch.float32] * 10)
