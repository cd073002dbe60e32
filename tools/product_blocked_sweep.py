"""Time `auto`'s blocked route of the kernel product (`kermac.product_blocked`) at several block sizes.

    python tools/product_blocked_sweep.py [--cases 100000:32:16,100000:128:1,...] [--kernel laplace_l1]
                                          [--exponents 26,27,28,29] [--repeat 3] [--force]

For every case `N:D:C` (`x = randn(N, D)`, `v = randn(N, C)`, float32, `K(x, x) @ v`) it prints the user's
blocked route (`run_kernel` of 16 384-row blocks into a preallocated block, then `torch.matmul`) and
`kermac.kernel_product(..., backend="auto")` with `product_blocked.BLOCK_ELEMENTS = 2^e` for each exponent e
(median of `--repeat` calls after one warm-up, CUDA events; ms).  On the GPU the route is taken where
`product_blocked.applies` says so; with `--force` it is taken for every case (tensor-core programs too), and the
line ends with `auto` with the route switched off (the fused product), timed in the same process.  Without a GPU
the same runs on the CPU at the sizes given, with the route forced (a smoke test of the script; the times mean
nothing there).
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch
from product_bench import blocked  # the user's blocked route, as tools/product_bench.py times it

import kermac
from kermac import product_blocked
from kermac.benchmarking import time_ms

__all__ = ["main"]


def _case(text: str) -> tuple[int, int, int]:
    n, d, c = (int(t) for t in text.split(":"))
    return n, d, c


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="100000:32:16,100000:128:1,100000:128:16,50000:784:1")
    parser.add_argument("--kernel", default="laplace_l1")
    parser.add_argument("--exponents", default="26,27,28,29")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--force", action="store_true", help="take the route for every case; time the fused too")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    default, applies = product_blocked.BLOCK_ELEMENTS, product_blocked.applies
    if device == "cpu" or args.force:
        product_blocked.applies = _forced
    print(torch.cuda.get_device_name() if device == "cuda" else "cpu (smoke test)")
    try:
        for n, d, c in map(_case, args.cases.split(",")):
            exponents = [int(e) for e in args.exponents.split(",")]
            row = _sweep(args.kernel, n, d, c, exponents, args.repeat, device, fused=args.force)
            if row is None:
                return 1
            print(row, flush=True)
    finally:
        product_blocked.BLOCK_ELEMENTS, product_blocked.applies = default, applies
    return 0


def _forced(problem, backend: str) -> bool:
    return backend == "auto"


def _sweep(
    kernel: str, n: int, d: int, c: int, exponents: list[int], repeat: int, device: str, *, fused: bool
) -> str | None:
    """One case's line: the user's blocks, then `auto` at each block size, then (`fused`) `auto` without the
    route (None, and a message, if `auto`'s values differ from the user's)."""
    x = torch.randn(n, d, device=device)
    v = torch.randn(n, c, device=device)
    out = torch.empty(n, c, device=device)
    sigma = 2.0 * d
    user = blocked(kernel, x, v, out, 16384, sigma)

    def auto() -> None:
        kermac.kernel_product(kernel, x, x, v, out=out, bandwidth=sigma)

    def ms(fn) -> float:
        return statistics.median(time_ms(fn, device=device, warmup=1, repeat=repeat))

    row = [f"N={n} D={d} C={c}: user 16384-row blocks {ms(user):.2f}"]
    expected = out.clone()
    runs = [(f"2^{e}", 1 << e) for e in exponents] + ([("fused", None)] if fused else [])
    forced = product_blocked.applies
    for name, elements in runs:
        if elements is None:
            product_blocked.applies = lambda problem, backend: False
        else:
            product_blocked.BLOCK_ELEMENTS = elements
        taken = product_blocked.applies(_problem(kernel, x, v, out, sigma), "auto")
        row.append(f"{name}{' (fused)' if not taken and elements else ''}: {ms(auto):.2f}")
        product_blocked.applies = forced
        error = ((out - expected).abs().max() / expected.abs().max()).item()
        if not error <= 1e-4:
            print(f"{name}: relative error {error:.2e} against the user's route", file=sys.stderr)
            return None
    return "; ".join(row)


def _problem(kernel: str, x: torch.Tensor, v: torch.Tensor, out: torch.Tensor, sigma: float):
    from kermac import presets
    from kermac.hyperparams import program_hypers
    from kermac.problem import product_problem

    program = presets.ALL[kernel].lower()
    hypers = program_hypers(program.hypers, {"bandwidth": sigma}, x.device, False)
    return product_problem(program, x, x, v, out=out, hypers=hypers)


if __name__ == "__main__":
    sys.exit(main())
