"""Time kernel products with few rows against many columns, split over slices of the columns and in one launch.

    python tools/product_split_bench.py [--cases gaussian:100:1000000:32:1,...] [--backend auto] [--repeat 7]

Each case is ``kernel:M:N:D:C``: ``K(x, z) @ v`` with ``x = randn(M, D)``, ``z = randn(N, D)``, ``v = randn(N, C)``
(float32, σ = √D).  **split** is the public operation (``KernelOperator(...) @ v``), which on a CUDA device runs
a product with too few row tiles over slices of the columns (``kermac.product_split``; the slice count ``S`` is
printed); **one launch** runs the same problem through the dispatch of one backend call, as every product ran
before the split.  Both are timed with CUDA events (median of ``--repeat`` calls after a warm-up call, which
compiles and autotunes) and compared with the float64 product of the first 50 rows (relative Frobenius error).
Without a GPU the same runs on the CPU, where nothing is split (a smoke test of the script).
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

import kermac
from kermac import dispatch, presets, product_split
from kermac.benchmarking import time_ms
from kermac.hyperparams import program_hypers
from kermac.problem import product_problem

__all__ = ["main"]

DEFAULT_CASES = (
    "gaussian:100:1000000:32:1,gaussian:1001:1000000:32:1,laplace_l1:100:1000000:32:1,"
    "gaussian:100:1000000:32:16,gaussian:10:200000:784:10,laplace_l2:1000:1000000:3:1"
)


def _case(text: str) -> tuple[str, int, int, int, int]:
    kernel, *sizes = text.split(":")
    m, n, d, c = (int(s) for s in sizes)
    return kernel, m, n, d, c


def run_case(kernel: str, m: int, n: int, d: int, c: int, backend: str, repeat: int, device: torch.device) -> dict:
    gen = torch.Generator(device=device).manual_seed(0)
    x, z, v = (torch.randn(*s, device=device, generator=gen) for s in ((m, d), (n, d), (n, c)))
    sigma = d**0.5
    K = kermac.KernelOperator(kernel, x, z, bandwidth=sigma, backend=backend)
    program = presets.ALL[kernel].lower()
    hypers = program_hypers(program.hypers, {"bandwidth": sigma}, device, False)
    problem = product_problem(program, x, z, v, out=None, hypers=hypers)
    slices = product_split.split_count(problem, product_split.multiprocessors(device)) if device.type == "cuda" else 1

    def one_launch() -> None:
        dispatch._run(problem, backend, "one launch", "kernel product problem", "M={} N={} D={} C={}", "program")

    split_ms = statistics.median(time_ms(lambda: K @ v, device=device, warmup=1, repeat=repeat))
    one_ms = statistics.median(time_ms(one_launch, device=device, warmup=1, repeat=repeat))
    rows = min(m, 50)
    reference = kermac.run_kernel(kernel, x[:rows].double(), z.double(), bandwidth=sigma, backend="torch") @ v.double()

    def error(out: torch.Tensor) -> float:
        return float(((out[:rows].double() - reference).norm() / reference.norm()).item())

    return {
        "case": f"{kernel}:{m}:{n}:{d}:{c}",
        "slices": slices,
        "one_launch_ms": one_ms,
        "split_ms": split_ms,
        "one_launch_err": error(problem.out),
        "split_err": error(K @ v),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=DEFAULT_CASES, help="kernel:M:N:D:C, comma-separated")
    parser.add_argument("--backend", default="auto", help="the backend of both routes")
    parser.add_argument("--repeat", type=int, default=7, help="timed calls per route")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"{name}, backend {args.backend}, median of {args.repeat} calls (ms)")
    print("| kernel:M:N:D:C | S | one launch | split | speed-up | error one launch / split |")
    print("|---|---:|---:|---:|---:|---|")
    for text in args.cases.split(","):
        r = run_case(*_case(text), args.backend, args.repeat, device)
        print(
            f"| {r['case']} | {r['slices']} | {r['one_launch_ms']:.3f} | {r['split_ms']:.3f} | "
            f"{r['one_launch_ms'] / r['split_ms']:.1f}× | {r['one_launch_err']:.1e} / {r['split_err']:.1e} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
