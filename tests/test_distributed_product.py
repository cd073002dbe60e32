"""`kermac.distributed.ShardedKernelOperator`: every rank's rows of `K @ v`, `Kᵀ @ u` and their gradients against
the float64 dense kernel matrix (`run_kernel` on the reference backend) and the unsharded `KernelOperator`.

The ranks are processes started with `torch.multiprocessing` on a gloo group (CPU, `tcp://127.0.0.1` on a free
port); the shards are uneven, one rank's shard of `x` and another's of `z` are empty, so the global diagonal of
the regularisation crosses shard boundaries.  Each spawn runs all its checks in one function (spawning costs
seconds).  The `gpu` test repeats the values and gradients with NCCL on two GPUs.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from distributed_helpers import F64, full, shard, spawn
from helpers import load_script

import kermac
from kermac.distributed import NOT_INITIALISED, ShardedKernelOperator

SHARDS = {2: ((5, 0), (3, 6)), 3: ((4, 0, 7), (6, 5, 0))}
"""Rows of `x` and of `z` per rank, for each world size."""

KW = {"bandwidth": 1.3, "regularization": 0.7}


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    tol = 1e-11 if actual.dtype == F64 else 1e-4
    torch.testing.assert_close(actual.double().cpu(), expected, rtol=tol, atol=tol, equal_nan=True)


def _values(rank: int, world: int, device: torch.device) -> None:
    """K @ v (C = 3, C = 1, 1-D v) and Kᵀ @ u against the dense reference and the unsharded operator."""
    dtype = F64 if device.type == "cpu" else torch.float32
    ms, ns = SHARDS[world]
    x, z = full(sum(ms), 4, 1), full(sum(ns), 4, 2)
    v, u = full(sum(ns), 3, 3), full(sum(ms), 2, 4)
    local = {name: t.to(dtype=dtype, device=device) for name, t in (("x", x), ("z", z), ("v", v), ("u", u))}
    k = ShardedKernelOperator(
        "gaussian", shard(local["x"], ms, rank), shard(local["z"], ns, rank), **KW
    )  # fmt: skip
    dense = kermac.run_kernel("gaussian", x, z, backend="torch", **KW)
    whole = kermac.KernelOperator("gaussian", local["x"], local["z"], **KW)
    assert k.shape == (sum(ms), sum(ns)) and k.T.shape == (sum(ns), sum(ms))
    assert k.dtype == dtype and k.device == device and k.group is dist.group.WORLD
    assert k.row_range == (sum(ms[:rank]), sum(ms[: rank + 1]))
    assert k.column_range == (sum(ns[:rank]), sum(ns[: rank + 1]))
    assert k.T.row_range == k.column_range and k.T.column_range == k.row_range
    v_r = shard(local["v"], ns, rank)
    y = k @ v_r
    assert y.shape == (ms[rank], 3) and y.dtype == dtype
    _close(y, shard(dense @ v, ms, rank))
    _close(y, shard(whole @ local["v"], ms, rank).cpu().double())
    _close(k @ v_r[:, 1:2], shard(dense @ v[:, 1:2], ms, rank))
    _close(k.matmul(v_r[:, 2]), shard(dense @ v[:, 2], ms, rank))
    t = k.T @ shard(local["u"], ms, rank)
    assert t.shape == (ns[rank], 2)
    _close(t, shard(dense.mT @ u, ns, rank))
    _close(k.T.T @ v_r, shard(dense @ v, ms, rank))
    if device.type == "cpu":  # half shards: products in float32, their sum too, rounded to half once
        half = ShardedKernelOperator("gaussian", *(shard(t.half(), s, rank) for t, s in ((x, ms), (z, ns))), **KW)
        y16 = half @ shard(v.half(), ns, rank)
        ref = kermac.run_kernel("gaussian", x.half().double(), z.half().double(), backend="torch", **KW)
        assert y16.dtype == torch.float16
        torch.testing.assert_close(y16.double(), shard(ref @ v.half().double(), ms, rank), rtol=4e-3, atol=4e-3)


def _gradients(rank: int, world: int, device: torch.device) -> None:
    """Gradients of `<w, K v> + <w', Kᵀ u>` in the shards of x, z, v and u against autograd of the dense
    float64 reference."""
    dtype = F64 if device.type == "cpu" else torch.float32
    ms, ns = SHARDS[world]
    tensors = {"x": full(sum(ms), 4, 1), "z": full(sum(ns), 4, 2), "v": full(sum(ns), 3, 3), "u": full(sum(ms), 2, 4)}
    w, w2 = full(sum(ms), 3, 5), full(sum(ns), 2, 6)
    sizes = {"x": ms, "z": ns, "v": ns, "u": ms}
    mine = {
        n: shard(t, sizes[n], rank).to(dtype=dtype, device=device).requires_grad_() for n, t in tensors.items()
    }  # fmt: skip
    k = ShardedKernelOperator("gaussian", mine["x"], mine["z"], **KW)
    loss = ((k @ mine["v"]) * shard(w, ms, rank).to(dtype=dtype, device=device)).sum()
    loss = loss + ((k.T @ mine["u"]) * shard(w2, ns, rank).to(dtype=dtype, device=device)).sum()
    loss.backward()
    ref = {n: t.clone().requires_grad_() for n, t in tensors.items()}
    dense = kermac.run_kernel("gaussian", ref["x"], ref["z"], backend="torch", **KW)
    ((dense @ ref["v"]) * w).sum().add(((dense.mT @ ref["u"]) * w2).sum()).backward()
    for name, t in mine.items():
        _close(t.grad, shard(ref[name].grad, sizes[name], rank))

    # Laplace-L1 and the l∞ distance (a maximum over features): ∂/∂v and ∂/∂x (gradient products) through the
    # ring.
    x_r, z_r = mine["x"].detach().requires_grad_(), mine["z"].detach()
    v = mine["v"].detach().requires_grad_()
    (ShardedKernelOperator("laplace_l1", x_r, z_r, bandwidth=2.0) @ v).sum().backward()
    ref_x = tensors["x"].clone().requires_grad_()
    dense = kermac.run_kernel("laplace_l1", ref_x, tensors["z"], bandwidth=2.0, backend="torch")
    (dense @ tensors["v"]).sum().backward()
    _close(v.grad, shard(dense.detach().mT @ torch.ones(sum(ms), 3, dtype=F64), ns, rank))
    _close(x_r.grad, shard(ref_x.grad, ms, rank))
    x_r.grad = None
    (ShardedKernelOperator("linf_distance", x_r, z_r) @ v).sum().backward()
    ref_x.grad = None
    (kermac.run_kernel("linf_distance", ref_x, tensors["z"], backend="torch") @ tensors["v"]).sum().backward()
    _close(x_r.grad, shard(ref_x.grad, ms, rank))


def _nan(rank: int, world: int, device: torch.device) -> None:
    """A NaN in one rank's v reaches every rank's rows of its column (the Gaussian has no zero entry)."""
    ms, ns = SHARDS[world]
    x, z = shard(full(sum(ms), 4, 1), ms, rank), shard(full(sum(ns), 4, 2), ns, rank)
    k = ShardedKernelOperator("gaussian", x, z, **KW)
    v = shard(full(sum(ns), 2, 3), ns, rank).clone()
    if rank == 0:
        v[0, 1] = float("nan")
    y = k @ v
    assert torch.isnan(y[:, 1]).all() and torch.isfinite(y[:, 0]).all()


def _bad_input(rank: int, world: int, device: torch.device) -> None:
    """Bad input raises on every rank, naming the argument, and never leaves a rank waiting."""
    ms, ns = SHARDS[world]
    x, z = shard(full(sum(ms), 4, 1), ms, rank), shard(full(sum(ns), 4, 2), ns, rank)
    k = ShardedKernelOperator("gaussian", x, z, **KW)
    with pytest.raises(ValueError, match=rf"^v: expected shape \[{ns[rank]}, C\] or \[{ns[rank]}\]"):
        k @ torch.zeros(ns[rank] + 1, 2, dtype=F64)
    with pytest.raises(ValueError, match=r"^v: expected shape"):
        k @ torch.zeros(ns[rank], 2, 1, dtype=F64)
    with pytest.raises(TypeError, match=r"^v: expected dtype torch.float64 \(the dtype of the shards\), got"):
        k @ torch.zeros(ns[rank], 2)
    with pytest.raises(TypeError, match=r"^v: expected a torch.Tensor, got list"):
        k @ [1.0]
    last = world - 1
    with pytest.raises(ValueError, match=r"^x_shard: expected the same number of features D on every rank"):
        ShardedKernelOperator("gaussian", x[:, :3] if rank == last else x, z[:, :3] if rank == last else z, **KW)
    with pytest.raises(TypeError, match=r"^x_shard: expected the same dtype on every rank"):
        ShardedKernelOperator("gaussian", x.float() if rank == 0 else x, z.float() if rank == 0 else z, **KW)
    expected = (TypeError, r"^x_shard: expected a torch.Tensor") if rank == last else (RuntimeError, "rejected")
    with pytest.raises(expected[0], match=expected[1]):
        ShardedKernelOperator("gaussian", "x" if rank == last else x, z, **KW)
    with pytest.raises(ValueError, match=r"^z_shard: expected a 2-D shard"):
        ShardedKernelOperator("gaussian", x, z[None], **KW)
    with pytest.raises(ValueError, match="hyperparameters of one matrix"):
        ShardedKernelOperator("gaussian", x, z, bandwidth=torch.tensor([1.0, 2.0], dtype=F64))
    assert (k @ torch.ones(ns[rank], 1, dtype=F64)).shape == (ms[rank], 1)  # the group still works


def _subgroup(rank: int, world: int, device: torch.device) -> None:
    """On a group of ranks 0 and 2 (of 3) the operator is that of their shards; rank 1 is not a member."""
    sub = dist.new_group([0, 2])  # every rank of the default group creates it
    ms, ns = SHARDS[world]
    x, z, v = full(sum(ms), 4, 1), full(sum(ns), 4, 2), full(sum(ns), 3, 3)
    x_r, z_r, v_r = shard(x, ms, rank), shard(z, ns, rank), shard(v, ns, rank)
    if rank == 1:
        with pytest.raises(ValueError, match=r"^group: expected a process group this process belongs to"):
            ShardedKernelOperator("gaussian", x_r, z_r, group=sub, **KW)
        return
    k = ShardedKernelOperator("gaussian", x_r, z_r, group=sub, **KW)
    assert k.group is sub and k.shape == (ms[0] + ms[2], ns[0] + ns[2])
    keep = [i for i in range(3) if i != 1]
    xs, zs, vs = (torch.cat([shard(t, sizes, i) for i in keep]) for t, sizes in ((x, ms), (z, ns), (v, ns)))
    dense = kermac.run_kernel("gaussian", xs, zs, backend="torch", **KW)
    _close(k @ v_r, shard(dense @ vs, (ms[0], ms[2]), keep.index(rank)))


def _bench(rank: int, world: int, device: torch.device) -> None:
    """tools/sharded_product_bench.py at a tiny size in the running group: rank 0 prints a throughput row."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        result = load_script("sharded_product_bench").main(
            ["--points", "37", "--features", "3", "--columns", "2", "--repeats", "2"]
        )
    assert result["world"] == world and result["median_s"] > 0 and result["entries_per_s"] > 0
    assert ("entries/s" in printed.getvalue()) == (rank == 0)


def _cpu_checks(rank: int, world: int, device: torch.device) -> None:
    for checks in (_values, _gradients, _nan, _bad_input, _bench, *((_subgroup,) if world == 3 else ())):
        checks(rank, world, device)


@pytest.mark.parametrize("world", [2, 3])
def test_sharded_operator_over_gloo(world: int) -> None:
    spawn(world, _cpu_checks)


def _gpu_checks(rank: int, world: int, device: torch.device) -> None:
    for checks in (_values, _gradients, _bench):
        checks(rank, world, device)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_sharded_operator_over_nccl_on_two_gpus() -> None:
    spawn(2, _gpu_checks, "cuda")


def test_without_a_process_group() -> None:
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match=f"^{NOT_INITIALISED}$"):
        ShardedKernelOperator("gaussian", torch.zeros(2, 3), torch.zeros(2, 3))
    with pytest.raises(RuntimeError, match="not initialised"):  # before any check of the shards
        ShardedKernelOperator("gaussian", "x", None)


def test_import_kermac_leaves_torch_distributed_alone() -> None:
    """`import kermac` imports no part of the sharded operator; `kermac.distributed` loads it on first use."""
    code = (
        "import sys, kermac; assert 'kermac.distributed' not in sys.modules, 'imported'; "
        "assert kermac.distributed.ShardedKernelOperator.__module__ == 'kermac.distributed'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)})
