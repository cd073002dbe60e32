"""Batches over streams and threads: set_max_streams, ordering against torch's current stream,
no host synchronisation, concurrent callers (GPU tests marked gpu)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from linalg_helpers import rhs, solve_error, spd

import kermac_linalg as kl


def eigen_residual(A: torch.Tensor, W: torch.Tensor, V: torch.Tensor) -> float:
    A, W, V = A.double().cpu(), W.double().cpu(), V.double().cpu()
    return ((A @ V - V * W[..., None, :]).norm() / A.norm()).item()


OPS = {
    "cholesky_solve": lambda A, B: solve_error(A, B, kl.cholesky_solve(A, B)[0]),
    "solve": lambda A, B: solve_error(A, B, kl.solve(A, B)[0]),
    "cholesky": lambda A, B: (lambda L: ((L @ L.mT - A).norm() / A.norm()).item())(kl.cholesky(A)[0]),
    "eigh": lambda A, B: eigen_residual(A, *kl.eigh(A)[:2]),
    "eigh_range": lambda A, B: eigen_residual(A, *kl.eigh_range(A, top_k=3)[:2]),
}


def test_set_max_streams_checks_its_argument():
    before = kl.max_streams()
    with pytest.raises(TypeError, match="count must be an int"):
        kl.set_max_streams(2.0)
    with pytest.raises(ValueError, match="count must be >= 1, got 0"):
        kl.set_max_streams(0)
    kl.set_max_streams(3)
    assert kl.max_streams() == 3
    kl.set_max_streams(before)


@pytest.mark.gpu
@pytest.mark.parametrize("streams", [1, 3, 16])
@pytest.mark.parametrize("op", sorted(OPS))
def test_batches_larger_and_smaller_than_the_pool(op, streams):
    before = kl.max_streams()
    kl.set_max_streams(streams)
    try:
        A, B = spd(10, n=48, device="cuda"), rhs(10, 48, 3, device="cuda")
        assert OPS[op](A, B) <= 1e-12
    finally:
        kl.set_max_streams(before)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["cholesky_solve", "solve", "eigh", "eigh_range"])
def test_inputs_written_just_before_are_seen_and_results_are_ordered(op):
    """Inputs written on a busy current stream are read after those writes; results consumed
    on it right away (no synchronisation) are complete."""
    A_ref, B_ref = spd(4, n=64, device="cuda"), rhs(4, 64, 2, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        A, B = torch.zeros_like(A_ref), torch.zeros_like(B_ref)
        torch.cuda._sleep(100_000_000)
        A.copy_(A_ref)
        B.copy_(B_ref)
        if op in ("cholesky_solve", "solve"):
            X, info = getattr(kl, op)(A, B)
            check = A @ X - B
        else:
            W, V, info = kl.eigh(A) if op == "eigh" else kl.eigh_range(A, top_k=5)
            check = A @ V - V * W[..., None, :]
        check = check.clone()
        info = info.clone()
    stream.synchronize()
    assert (info == 0).all()
    assert check.abs().max().item() <= 1e-10


def _returned_while_gpu_busy(call) -> bool:
    """Whether ``call``, queued behind ~0.3 s of GPU sleep, returned to the host before that sleep ended.

    The call runs under ``torch.cuda.set_sync_debug_mode("error")``: a synchronising torch
    operation inside it raises.  The event recorded right after the sleep is still pending when the
    call returns unless the call waited for the GPU somewhere (a stream or event synchronisation,
    which the debug mode does not see, included).
    """
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(500_000_000)
        asleep = torch.cuda.Event()
        asleep.record(stream)
        torch.cuda.set_sync_debug_mode("error")
        try:
            call()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        returned_early = not asleep.query()
    stream.synchronize()
    return returned_early


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["cholesky_solve", "solve", "cholesky"])
def test_no_host_synchronisation(op):
    A = spd(6, n=256, device="cuda", dtype=torch.float32)
    B = rhs(6, 256, 4, device="cuda", dtype=torch.float32)
    call = {
        "cholesky_solve": lambda: kl.cholesky_solve(A, B),
        "solve": lambda: kl.solve(A, B),
        "cholesky": lambda: kl.cholesky(A),
    }[op]
    call()  # handles, streams and workspaces exist after a first call
    torch.cuda.synchronize()
    assert _returned_while_gpu_busy(call), "the call waited for the GPU"


@pytest.mark.gpu
def test_threads_at_once():
    """Several threads, each on its own stream, each with its own handles, at the same time."""

    def work(seed: int) -> float:
        stream = torch.cuda.Stream()
        worst = 0.0
        with torch.cuda.stream(stream):
            for i in range(4):
                A, B = spd(3, n=40 + seed, device="cuda", seed=seed * 10 + i), rhs(3, 40 + seed, 2, device="cuda")
                X1, _ = kl.cholesky_solve(A, B)
                X2, _ = kl.solve(A, B)
                W, V, _ = kl.eigh(A)
                stream.synchronize()
                worst = max(worst, solve_error(A, B, X1), solve_error(A, B, X2), eigen_residual(A, W, V))
        return worst

    with ThreadPoolExecutor(6) as pool:
        errors = list(pool.map(work, range(6)))
    assert max(errors) <= 1e-12


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_second_device():
    A, B = spd(3, n=32, device="cuda:1"), rhs(3, 32, 2, device="cuda:1")
    X, info = kl.cholesky_solve(A, B)
    assert X.device == A.device == info.device
    assert solve_error(A, B, X) <= 1e-12
    W, V, info = kl.eigh(A)
    assert eigen_residual(A, W, V) <= 1e-12
