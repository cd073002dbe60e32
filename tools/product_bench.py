"""Time the fused kernel product ``K(x, x) @ v`` against the blocked route a user writes without it.

    python tools/product_bench.py [--n 100000] [--d 3,32,128] [--c 1,16] [--kernels gaussian,laplace_l1]
                                  [--backends nvrtc,triton] [--block 16384] [--repeat 5] [--json PATH]
                                  [--gradient]

For every (kernel, D, C), with ``x = randn(N, D)`` (float32) and ``v = randn(N, C)`` on the GPU:

* **blocked**: the fastest a user can do today: ``kermac.run_kernel`` of ``--block`` rows of K into a
  preallocated block (backend ``auto``), then ``torch.matmul`` of the block with ``v`` into the rows
  of a preallocated output, block after block;
* **fused**: ``kermac.kernel_product(kernel, x, x, v, out=out, backend=B)`` for each ``--backends`` B
  that accepts the problem (a refusal is printed, not timed).

Each route is timed with CUDA events (median of ``--repeat`` calls after one warm-up call, which also
compiles), its peak memory beyond the inputs and output is read from
``torch.cuda.max_memory_allocated``, and the fused results are compared with the blocked one (largest
error relative to the largest entry of the blocked result).  ``σ`` is ``√2·D^(1/p)``, the typical
distance of ``randn`` rows (as in :mod:`kermac.benchmarking`).  Without a GPU the same runs on the CPU
at ``--n 512`` and below (a smoke test of the script; the times mean nothing there).

``--gradient`` times the predictor gradient ``J[m, c, j] = ∂(K(x, x) v)[m, c]/∂x[m, j]`` (the Jacobian behind
AGOP) instead, with ``v`` in the role of the coefficients α:

* **blocked**: the route without the fused gradient product: the derivative matrix for ``--block`` columns at
  a time (``run_kernel`` into a preallocated block, scaled in place: ``A = −k/σ = ∂k/∂acc`` for Laplace-L1 with
  ``acc = ‖x − z‖₁``, ``A = −k/σ² = 2·∂k/∂acc`` for the Gaussian with ``acc = ‖x − z‖²``, whose
  ``cdist_grad`` with p = 2 has no factor 2), then ``kermac.cdist_grad(A, xᵀ, vᵀ, xᵀ)`` with p = 1 or 2 into
  the block's columns of a preallocated ``[C, D, M]`` output;
* **fused**: ``kermac.predictor_gradient(kernel, x, x, v, backend=B)``;
* **slope blocks** (the Gaussian only): the Jacobian of a kernel on ``r² = ‖x − z‖²`` is
  ``2(x_m·(E α)[m] − (E [α ⊙ z])[m])`` with ``E = e'(r²) = −k/(2σ²)``, the fused route's one product of ``C + C·D``
  columns; here ``E`` is built ``--block`` rows at a time (``run_kernel`` into a preallocated block, scaled in
  place) and multiplied by the ``C + C·D`` columns with ``torch.matmul`` — the blocked route of a product
  (``kermac.product_blocked``) applied to that one, which the fused kernel computes in programs of at most 64
  columns, each recomputing its K tiles.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable

import torch

import kermac
from kermac import presets
from kermac.benchmarking import time_ms
from kermac.errors import BackendError

__all__ = ["main"]


def _ints(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t]


def blocked(kernel: str, x: torch.Tensor, v: torch.Tensor, out: torch.Tensor, block: int, sigma: float) -> Callable:
    """``out = K(x, x) @ v`` built ``block`` rows at a time into one preallocated block."""
    n = x.shape[0]
    buffer = torch.empty(min(block, n), n, device=x.device, dtype=x.dtype)

    def run() -> None:
        for start in range(0, n, block):
            rows = min(block, n - start)
            k = kermac.run_kernel(kernel, x[start : start + rows], x, out=buffer[:rows], bandwidth=sigma)
            torch.matmul(k, v, out=out[start : start + rows])

    return run


def fused(kernel: str, x: torch.Tensor, v: torch.Tensor, out: torch.Tensor, backend: str, sigma: float) -> Callable:
    def run() -> None:
        kermac.kernel_product(kernel, x, x, v, out=out, bandwidth=sigma, backend=backend)

    return run


SLOPE_BLOCKS = "slope blocks"
"""The name of ``--gradient``'s third route (the Gaussian only), ``slope_blocks_gradient``."""

_GRADIENT_KERNELS = {"laplace_l1": (1.0, 1), "gaussian": (2.0, 2)}
"""The kernels of ``--gradient``: (p of their ``cdist_grad``, power of σ in ``∂k/∂acc``)."""


def blocked_gradient(kernel: str, x: torch.Tensor, v: torch.Tensor, out: torch.Tensor, block: int, sigma: float):
    """``out[c, j, m] = J[m, c, j]`` from the derivative matrix built ``block`` columns at a time."""
    n = x.shape[0]
    p, power = _GRADIENT_KERNELS[kernel]
    buffer = torch.empty(n, min(block, n), device=x.device, dtype=x.dtype)
    xt, vt = x.mT, v.mT

    def run() -> None:
        for start in range(0, n, block):
            cols = min(block, n - start)
            a = kermac.run_kernel(kernel, x, x[start : start + cols], out=buffer[:, :cols], bandwidth=sigma)
            a.mul_(-1.0 / sigma**power)
            kermac.cdist_grad(a, xt, vt, xt[:, start : start + cols], p=p, out=out[..., start : start + cols])

    return run


def slope_blocks_gradient(x: torch.Tensor, v: torch.Tensor, out: torch.Tensor, block: int, sigma: float) -> Callable:
    """``out[m, c, j] = J[m, c, j]`` of the Gaussian from blocks of rows of ``E = −k/(2σ²)`` times ``[α, α ⊙ x]``."""
    n, d = x.shape
    c = v.shape[1]
    rows = min(block, n)
    buffer = torch.empty(rows, n, device=x.device, dtype=x.dtype)
    columns = torch.cat([v, (v[:, :, None] * x[:, None, :]).reshape(n, c * d)], dim=1)  # [N, C + C·D]
    product = torch.empty(rows, c + c * d, device=x.device, dtype=x.dtype)

    def run() -> None:
        for start in range(0, n, block):
            count = min(block, n - start)
            e = kermac.run_kernel("gaussian", x[start : start + count], x, out=buffer[:count], bandwidth=sigma)
            e.mul_(-1.0 / (2 * sigma**2))
            torch.matmul(e, columns, out=product[:count])
            ev, ew = product[:count, :c], product[:count, c:].view(count, c, d)
            torch.sub(x[start : start + count, None, :] * ev[:, :, None], ew, out=out[start : start + count])
            out[start : start + count].mul_(2)

    return run


def fused_gradient(kernel: str, x: torch.Tensor, v: torch.Tensor, out: torch.Tensor, backend: str, sigma: float):
    """``out = predictor_gradient(...)`` (``[M, C, D]``); the tool compares it with ``blocked_gradient``'s."""

    def run() -> None:
        out.copy_(kermac.predictor_gradient(kernel, x, x, v, bandwidth=sigma, backend=backend))

    return run


def measure(fn: Callable[[], object], device: torch.device, repeat: int) -> tuple[float, int]:
    """(median ms, peak bytes allocated beyond what was allocated before) of ``fn``."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    times = time_ms(fn, device=device, warmup=1, repeat=repeat)  # the warm-up call compiles and autotunes
    peak = torch.cuda.max_memory_allocated() - base if device.type == "cuda" else 0
    return statistics.median(times), peak


def run_case(kernel: str, n: int, d: int, c: int, args: argparse.Namespace, device: torch.device) -> dict:
    p = 1.0 if presets.ALL[kernel].power == "abs" else 2.0
    sigma = math.sqrt(2.0) * d ** (1.0 / p)
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(n, d, device=device, generator=gen)
    v = torch.randn(n, c, device=device, generator=gen)
    row: dict = {"kernel": kernel, "n": n, "d": d, "c": c, "routes": {}}
    if args.gradient:
        reference = torch.empty(c, d, n, device=device)  # [C, D, M], cdist_grad's layout
        slow, fast, shape = blocked_gradient, fused_gradient, (n, c, d)
    else:
        reference = torch.empty(n, c, device=device)
        slow, fast, shape = blocked, fused, (n, c)
    ms, peak = measure(slow(kernel, x, v, reference, args.block, sigma), device, args.repeat)
    row["routes"]["blocked"] = {"ms": ms, "peak_mb": peak / 2**20}
    if args.gradient:
        reference = reference.permute(2, 0, 1)  # J[m, c, j]
    scale = reference.abs().max().clamp_min(torch.finfo(reference.dtype).tiny)
    if args.gradient and kernel == "gaussian":
        out = torch.empty(shape, device=device)
        ms, peak = measure(slope_blocks_gradient(x, v, out, args.block, sigma), device, args.repeat)
        err = float(((out - reference).abs().max() / scale).item())
        row["routes"][SLOPE_BLOCKS] = {"ms": ms, "peak_mb": peak / 2**20, "rel_err": err}
    for backend in args.backends:
        out = torch.empty(shape, device=device)
        try:
            ms, peak = measure(fast(kernel, x, v, out, backend, sigma), device, args.repeat)
        except BackendError as exc:
            row["routes"][backend] = {"refused": str(exc)}
            continue
        err = float(((out - reference).abs().max() / scale).item())  # after timing: one sync per route
        row["routes"][backend] = {"ms": ms, "peak_mb": peak / 2**20, "rel_err": err}
    return row


def table(rows: list[dict], backends: list[str]) -> str:
    routes = ([SLOPE_BLOCKS] if any(SLOPE_BLOCKS in r["routes"] for r in rows) else []) + backends
    head = "| kernel | N | D | C | blocked ms | " + " | ".join(f"{b} ms (×, err)" for b in routes) + " |"
    lines = [head, "|" + "---|" * (5 + len(routes))]
    for r in rows:
        base = r["routes"]["blocked"]["ms"]
        cells = []
        for b in routes:
            got = r["routes"].get(b)
            if got is None:
                cells.append("-")
            elif "refused" in got:
                cells.append("refused")
            else:
                cells.append(f"{got['ms']:.2f} ({base / got['ms']:.1f}×, {got['rel_err']:.1e})")
        lines.append(f"| {r['kernel']} | {r['n']} | {r['d']} | {r['c']} | {base:.2f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000, help="points (rows of x)")
    parser.add_argument("--d", type=_ints, default=[3, 32, 128], help="features, comma-separated")
    parser.add_argument("--c", type=_ints, default=[1, 16], help="columns of v, comma-separated")
    parser.add_argument("--kernels", default="gaussian,laplace_l1", help="presets, comma-separated")
    parser.add_argument("--backends", default="nvrtc,triton", help="backends of the fused product")
    parser.add_argument("--block", type=int, default=16384, help="rows of K per block of the blocked route")
    parser.add_argument("--repeat", type=int, default=5, help="timed calls per route")
    parser.add_argument("--json", help="also write the rows as JSON to this file")
    parser.add_argument(
        "--gradient", action="store_true", help="time the predictor gradient against the derivative matrix + cdist_grad"
    )
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    kernels = [k for k in args.kernels.split(",") if k]
    unknown = [k for k in kernels if k not in presets.ALL]
    if unknown:
        parser.error(f"--kernels: unknown preset(s) {', '.join(unknown)}; known: {', '.join(presets.ALL)}")
    if args.gradient and set(kernels) - set(_GRADIENT_KERNELS):
        other = sorted(set(kernels) - set(_GRADIENT_KERNELS))
        parser.error(f"--kernels: --gradient times {', '.join(_GRADIENT_KERNELS)} only, got {', '.join(other)}")
    args.backends = [b for b in args.backends.split(",") if b]
    if device.type == "cpu" and args.n > 512:
        parser.error(f"--n: without a CUDA GPU at most 512 points (a smoke test), got {args.n}")
    if min(args.n, args.block, args.repeat, *args.d, *args.c) < 1:
        parser.error("--n, --block, --repeat, --d and --c: expected positive integers")
    rows = [run_case(k, args.n, d, c, args, device) for k in kernels for d in args.d for c in args.c]
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    what = "∂(K(x, x) v)/∂x (predictor gradient)" if args.gradient else "K(x, x) @ v"
    print(f"{what}, float32, {name}, torch {torch.__version__}, kermac {kermac.__version__}")
    print(table(rows, args.backends))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
