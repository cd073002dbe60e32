"""Time kernel products with few rows against many columns, split over slices of the columns and in one launch.

    python tools/product_split_bench.py [--cases gaussian:100:1000000:32:1,...] [--backend auto] [--repeat 7]
                                        [--gradient]

Each case is ``kernel:M:N:D:C``: ``K(x, z) @ v`` with ``x = randn(M, D)``, ``z = randn(N, D)``, ``v = randn(N, C)``
(float32, σ = √D).  **split** is the public operation (``KernelOperator(...) @ v``), which on a CUDA device runs
a product with too few row tiles over slices of the columns (``kermac.product_split``; the slice count ``S`` is
printed); **one launch** is the same call within ``kermac.product_split.disabled()``, as every product ran before
the split.  ``--gradient`` times ``kermac.predictor_gradient(kernel, x, z, v)`` instead (for the Σ (x − z)²
kernels a product of C + C·D columns, for the others one gradient product per column of ``v``; ``S`` is that of
the product, or of each gradient product).  Both routes are timed with CUDA events (median of ``--repeat`` calls
after a warm-up call, which compiles and autotunes) and compared with the float64 result of the reference backend
for the first 50 rows (relative Frobenius error).  Without a GPU the same runs on the CPU, where nothing is split
(a smoke test).
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

import kermac
from kermac import presets, product_split
from kermac.benchmarking import time_ms
from kermac.hyperparams import program_hypers
from kermac.problem import product_grad_problem, product_problem
from kermac.programs import is_squared_difference_sum

__all__ = ["main"]

DEFAULT_CASES = (
    "gaussian:100:1000000:32:1,gaussian:1001:1000000:32:1,laplace_l1:100:1000000:32:1,"
    "gaussian:100:1000000:32:16,gaussian:10:200000:784:10,laplace_l2:1000:1000000:3:1"
)


def _case(text: str) -> tuple[str, int, int, int, int]:
    kernel, *sizes = text.split(":")
    m, n, d, c = (int(s) for s in sizes)
    return kernel, m, n, d, c


def run_case(
    kernel: str, m: int, n: int, d: int, c: int, args: argparse.Namespace, device: torch.device
) -> dict[str, object]:
    gen = torch.Generator(device=device).manual_seed(0)
    x, z, v = (torch.randn(*s, device=device, generator=gen) for s in ((m, d), (n, d), (n, c)))
    sigma = d**0.5
    program = presets.ALL[kernel].lower()
    hypers = program_hypers(program.hypers, {"bandwidth": sigma}, device, False)
    if not args.gradient:
        problem = product_problem(program, x, z, v, out=None, hypers=hypers)
    elif is_squared_difference_sum(program):  # one product of C + C·D columns
        problem = product_problem(program, x, z, v.new_empty(n, c + c * d), out=None, hypers=hypers)
    else:  # gradient products of one column each
        problem = product_grad_problem(program, x, z, v[:, :1], v.new_empty(m, 1), out=None, hypers=hypers)
    slices = product_split.split_count(problem, product_split.multiprocessors(device)) if device.type == "cuda" else 1
    if args.gradient:

        def call(a: torch.Tensor, b: torch.Tensor, w: torch.Tensor, backend: str) -> torch.Tensor:
            return kermac.predictor_gradient(kernel, a, b, w, bandwidth=sigma, backend=backend)

    else:

        def call(a: torch.Tensor, b: torch.Tensor, w: torch.Tensor, backend: str) -> torch.Tensor:
            return kermac.KernelOperator(kernel, a, b, bandwidth=sigma, backend=backend) @ w

    def split() -> torch.Tensor:
        return call(x, z, v, args.backend)

    def one_launch() -> torch.Tensor:
        with product_split.disabled():
            return call(x, z, v, args.backend)

    split_ms = statistics.median(time_ms(split, device=device, warmup=1, repeat=args.repeat))
    one_ms = statistics.median(time_ms(one_launch, device=device, warmup=1, repeat=args.repeat))
    rows = min(m, 50)
    reference = call(*(t.double().cpu() for t in (x[:rows], z, v)), "torch")

    def error(out: torch.Tensor) -> float:
        return float(((out[:rows].double().cpu() - reference).norm() / reference.norm()).item())

    return {
        "case": f"{kernel}:{m}:{n}:{d}:{c}",
        "slices": slices,
        "one_launch_ms": one_ms,
        "split_ms": split_ms,
        "one_launch_err": error(one_launch()),
        "split_err": error(split()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=DEFAULT_CASES, help="kernel:M:N:D:C, comma-separated")
    parser.add_argument("--backend", default="auto", help="the backend of both routes")
    parser.add_argument("--repeat", type=int, default=7, help="timed calls per route")
    parser.add_argument("--gradient", action="store_true", help="time predictor_gradient instead of K @ v")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    what = "predictor_gradient" if args.gradient else "K @ v"
    print(f"{name}, {what}, backend {args.backend}, median of {args.repeat} calls (ms)")
    print("| kernel:M:N:D:C | S | one launch | split | speed-up | error one launch / split |")
    print("|---|---:|---:|---:|---:|---|")
    for text in args.cases.split(","):
        r = run_case(*_case(text), args, device)
        print(
            f"| {r['case']} | {r['slices']} | {r['one_launch_ms']:.3f} | {r['split_ms']:.3f} | "
            f"{r['one_launch_ms'] / r['split_ms']:.1f}× | {r['one_launch_err']:.1e} / {r['split_err']:.1e} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
