"""Host time per call: the harness of the "small calls" section of `kermac bench` (`--calls`).

On a GPU, a 300 × 200 × 40 problem takes its kernel a few microseconds, so what a call costs is
the host's work between the Python call and the launch: argument checks, choosing the backend,
finding the compiled variant, packing the arguments, the launch itself.  Many small problems
(batched Gaussian processes, tree-based models) pay it on every call.

`call_cases` gives one [`BenchCase`][kermac.benchmarking.BenchCase] per public operation at that
size (`CALL_SIZES`; `CPU_CALL_SIZES` without a GPU, where the reference backend computes on the host
and a large problem would time the arithmetic instead): `cdist` p = 1 and p = 2,
`run_kernel("laplace_l2")`, `cdist_grad` with one output row (O = 1) and `run_program` of
[`user_program`][kermac.benchmarking.user_program].  `per_call_us` times `calls` back-to-back calls
followed by one synchronisation, so the host never waits for the device inside the measurement:
where the host is slower than the kernels, the wall time per call is the host time.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence

import torch

from kermac.benchmarking import BenchCase

__all__ = ["CALL_SIZES", "CPU_CALL_SIZES", "MIN_CALLS", "call_cases", "per_call_us"]

CALL_SIZES = (300, 200, 40)
"""`(M, N, D)` of the pairwise calls on a GPU; the gradient is `(M, N, O, K) = (300, 40, 1, 200)`:
300 points, 40 features, one output, 200 centres."""
CPU_CALL_SIZES = (30, 20, 4)
"""`CALL_SIZES` divided by ten, for the CPU (gradient `(30, 4, 1, 20)`)."""
MIN_CALLS = 10
"""The fewest calls per run `per_call_us` lowers `calls` to under `max_seconds`."""


def _cases(m: int, n: int, d: int, device: str) -> list[BenchCase]:
    return [
        BenchCase("cdist", (m, n, d), 1.0, device=device),
        BenchCase("cdist", (m, n, d), 2.0, device=device),
        BenchCase("kernel", (m, n, d), 2.0, "laplace", device=device),
        BenchCase("grad", (m, d, 1, n), 2.0, device=device),
        BenchCase("program", (m, n, d), 2.0, device=device),
    ]


def call_cases(device: str | torch.device) -> list[BenchCase]:
    """The small-call cases on `device`: `CALL_SIZES` on CUDA, `CPU_CALL_SIZES` elsewhere."""
    device = torch.device(device)
    return _cases(*(CALL_SIZES if device.type == "cuda" else CPU_CALL_SIZES), device=str(device))


def per_call_us(
    fn: Callable[..., object],
    args: Sequence[object],
    *,
    device: str | torch.device,
    calls: int,
    repeat: int,
    warmup: int,
    max_seconds: float | None = None,
) -> tuple[list[float], int]:
    """Microseconds per call of `fn(*args)`, once per run: `repeat` runs of `calls` back-to-back calls.

    `warmup` untimed calls come first (the first one compiles what needs compiling).  Each run
    is the wall time of `calls` calls and one synchronisation of `device` (none on the CPU),
    divided by `calls`, with Python's garbage collector off as in `timeit`.  With `max_seconds`
    and at least two warm-up calls, the warm-up calls after the first estimate the cost of a call
    and `calls` is lowered (to no fewer than `MIN_CALLS`) so all runs together take about
    `max_seconds`.  Report the smallest value: the others include interruptions of the host.

    Returns:
        (µs per call of each run, the number of calls per run).
    """
    if calls < 1 or repeat < 1 or warmup < 0:
        raise ValueError(
            f"calls, repeat, warmup: expected calls >= 1, repeat >= 1 and warmup >= 0, "
            f"got calls={calls}, repeat={repeat}, warmup={warmup}"
        )
    device = torch.device(device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    if warmup:
        fn(*args)
        sync()
    start = time.perf_counter()
    for _ in range(warmup - 1):
        fn(*args)
    sync()
    if max_seconds is not None and warmup > 1:
        estimate = (time.perf_counter() - start) / (warmup - 1)
        if estimate > 0:
            calls = max(min(calls, MIN_CALLS), min(calls, int(max_seconds / (repeat * estimate))))
    runs = []
    collecting = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeat):
            start = time.perf_counter()
            for _ in range(calls):
                fn(*args)
            sync()
            runs.append(1e6 * (time.perf_counter() - start) / calls)
    finally:
        if collecting:
            gc.enable()
    return runs, calls
