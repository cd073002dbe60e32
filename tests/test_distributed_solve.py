"""`kermac.solvers.solve` on a `ShardedKernelOperator`: every rank's rows of α against an independent float64
dense solve, the preconditioners on shards equal to the one-device ones, mixed precision, and
input errors agreed over the ranks (every rank raises, none is left waiting).

The ranks are processes on a gloo group (tests/distributed_helpers.py); the shards are uneven and one rank's is
empty.  The `gpu` test repeats the solve with NCCL on two GPUs.
"""

from __future__ import annotations

import pytest
import torch
from distributed_helpers import F64, full, shard, spawn

import kermac
from kermac import solvers
from kermac.distributed import ShardedKernelOperator
from kermac.kernel_system import KernelSystem
from kermac.preconditioners import EigenProPreconditioner, NystromPreconditioner

SHARDS = {2: (70, 50), 3: (45, 0, 75)}
"""Rows per rank, for each world size (120 points)."""

BANDWIDTH, LAMBDA = 1.0, 1e-3


def _reference(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The float64 solve of the dense system, the kernel matrix from `torch.cdist`."""
    d = torch.cdist(x, x, compute_mode="donot_use_mm_for_euclid_dist")
    a = torch.exp(-(d**2) / (2 * BANDWIDTH**2)) + LAMBDA * torch.eye(x.shape[0], dtype=F64)
    return torch.linalg.solve(a, y)


def _problem(world: int, rank: int, device: torch.device, dtype: torch.dtype):
    sizes = SHARDS[world]
    x, y = full(sum(sizes), 3, 1), full(sum(sizes), 2, 2)
    x_r = shard(x, sizes, rank).to(device=device, dtype=dtype)
    K = ShardedKernelOperator("gaussian", x_r, x_r, bandwidth=BANDWIDTH, regularization=LAMBDA)
    return K, x, y, shard(y, sizes, rank).to(device)


def _solves(rank: int, world: int, device: torch.device) -> None:
    """On the CPU float64 throughout (and the iterations of the one-device solve); on GPUs a float32 operator
    with float64 right-hand sides (mixed precision)."""
    sizes = SHARDS[world]
    dtype = F64 if device.type == "cpu" else torch.float32
    K, x, y, y_r = _problem(world, rank, device, dtype)
    points = x.to(dtype).double()  # the points the operator holds
    reference = _reference(points, y)
    expected, scale = shard(reference, sizes, rank), float(reference.abs().max())
    tol = 1e-10 if dtype == F64 else 1e-6
    for preconditioner in (None, "nystrom", "eigenpro"):
        s = solvers.solve(K, y_r, method="auto", preconditioner=preconditioner, rank=30, tol=tol)
        assert s.method == "cg" and s.preconditioner == preconditioner and s.alpha.shape == (sizes[rank], 2)
        assert bool(s.converged.all()) and float(s.residual.max()) <= tol, s.residual
        assert s.alpha.dtype == F64 and (s.refinements > 0) == (dtype != F64)
        torch.testing.assert_close(s.alpha.cpu(), expected, rtol=1e-5, atol=1e-6 * scale)
        if dtype == F64:
            one = solvers.solve(
                kermac.KernelOperator("gaussian", x, x, bandwidth=BANDWIDTH, regularization=LAMBDA, backend="torch"),
                y, method="cg", preconditioner=preconditioner, rank=30, tol=tol,
            )  # fmt: skip
            assert abs(int(s.iterations.max()) - int(one.iterations.max())) <= 2  # the same, up to rounding
    vector = solvers.solve(K, y_r[:, 0], tol=tol)
    assert vector.alpha.shape == (sizes[rank],) and vector.converged.shape == ()
    assert vector.preconditioner == "eigenpro"  # "auto", where its basis fits on every rank
    # one rank without room for EigenPro's basis: every rank takes Nyström's
    fits = solvers.eigenpro_fits
    solvers.eigenpro_fits = lambda *args: rank != world - 1 and fits(*args)
    try:
        declined = solvers.solve(K, y_r, tol=tol)
    finally:
        solvers.eigenpro_fits = fits
    assert declined.preconditioner == "nystrom" and bool(declined.converged.all())
    # mixed precision on the CPU too: float32 shards, float64 right-hand sides
    K32 = K.to(torch.float32)
    mixed = solvers.solve(K32, y_r, preconditioner="nystrom", rank=60, tol=1e-8)
    assert mixed.alpha.dtype == F64 and mixed.refinements >= 1 and bool(mixed.converged.all()), mixed.residual
    x32 = x.float().double()
    torch.testing.assert_close(mixed.alpha.cpu(), shard(_reference(x32, y), sizes, rank), rtol=1e-5, atol=1e-3)


def _preconditioners(rank: int, world: int, device: torch.device) -> None:
    """P⁻¹ r on shards is the rank's rows of the one-device P⁻¹ r, for each preconditioner."""
    sizes = SHARDS[world]
    K, x, _, _ = _problem(world, rank, device, F64)
    r = full(sum(sizes), 3, 7)
    one = KernelSystem(kermac.KernelOperator("gaussian", x, x, bandwidth=BANDWIDTH, regularization=LAMBDA))
    for make in (lambda system: NystromPreconditioner(system, 25, seed=3),
                 lambda system: EigenProPreconditioner(system, 20, 50, seed=3)):  # fmt: skip
        expected = make(one)(r)
        got = make(KernelSystem(K))(shard(r, sizes, rank))
        torch.testing.assert_close(got, shard(expected, sizes, rank), rtol=1e-9, atol=1e-9)


def _errors(rank: int, world: int, device: torch.device) -> None:
    """Every rank raises, with the same decision, whatever rank's input is wrong."""
    sizes = SHARDS[world]
    K, _, _, y_r = _problem(world, rank, device, F64)
    with pytest.raises(ValueError, match="'cholesky' needs the dense matrix on one device"):
        solvers.solve(K, y_r, method="cholesky")
    first_row = torch.arange(sizes[rank], device=y_r.device)[:, None] == 0
    bad = torch.where(first_row, torch.nan, y_r) if rank == world - 1 else y_r
    with pytest.raises(ValueError, match="y: expected finite values"):
        solvers.solve(K, bad)
    if rank == 0:
        with pytest.raises(ValueError, match=rf"y: expected shape \[{sizes[0]}\] or \[\.\.\., {sizes[0]}, C\]"):
            solvers.solve(K, y_r[1:])
    else:
        with pytest.raises(RuntimeError, match="another rank's y was refused"):
            solvers.solve(K, y_r)
    with pytest.raises(ValueError, match="y: expected the same number of columns C on every rank"):
        solvers.solve(K, y_r if rank else y_r[:, :1])
    with pytest.raises(ValueError, match="regularization: conjugate gradient needs λ > 0"):
        x_r = K.local_rows
        solvers.solve(ShardedKernelOperator("gaussian", x_r, x_r, bandwidth=BANDWIDTH), y_r)
    other = K.local_rows.clone() if rank == 0 else K.local_rows  # equal values, but not the same tensor
    expected = (
        (ValueError, "K: expected a sharded operator built with the same tensor")
        if rank == 0
        else (RuntimeError, "another rank's y was refused")
    )
    with pytest.raises(expected[0], match=expected[1]):
        solvers.solve(ShardedKernelOperator("gaussian", K.local_rows, other, bandwidth=1.0, regularization=1.0), y_r)
    uneven = shard(full(sum(sizes), 3, 1), sizes[::-1], rank).to(K.local_rows)
    with pytest.raises(ValueError, match="K: expected a square operator"):  # 2 ranks: 70 + 50 rows, 50 + 70 columns
        solvers.solve(ShardedKernelOperator("gaussian", K.local_rows, uneven[:1], bandwidth=1.0), y_r)
    # the solve still works after every refusal: nobody was left inside a collective
    assert bool(solvers.solve(K, y_r, tol=1e-8).converged.all())


def _cpu_checks(rank: int, world: int, device: torch.device) -> None:
    _solves(rank, world, device)
    _preconditioners(rank, world, device)
    _errors(rank, world, device)


@pytest.mark.parametrize("world", [2, 3])
def test_sharded_solve_over_gloo(world: int) -> None:
    spawn(world, _cpu_checks)


def _gpu_checks(rank: int, world: int, device: torch.device) -> None:
    _solves(rank, world, device)
    _errors(rank, world, device)


@pytest.mark.gpu
def test_sharded_solve_over_nccl_on_two_gpus() -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs")
    spawn(2, _gpu_checks, "cuda")
