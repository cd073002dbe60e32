"""Time to fit `(K + λI) α = y` by conjugate gradient on a `ShardedKernelOperator` over the ranks of `torchrun`,
for the scaling of `kermac.solvers.solve` over GPUs (or CPU processes).

    torchrun --nproc-per-node 1 tools/sharded_fit_bench.py [--points 200000] [--preconditioners none,nystrom]
    torchrun --nproc-per-node 2 tools/sharded_fit_bench.py [--points 200000] [--preconditioners none,nystrom]

The system is that of `kermac bench --fit`: the Gaussian kernel of `x = randn(N, 32)` (bandwidth √D), λ =
`--lam`, `y = sin(x u) + 0.1·noise` for a fixed unit vector `u`; every rank builds the same global `x` and `y`
on the CPU (seeded) and keeps its rows, so one GPU and P GPUs solve the same system.  The operator is float32
with float64 `y` (mixed precision) by default.  After one untimed solve of a small system (compilation, NCCL
set-up), each preconditioner's solve to `--tol` (at most `--max-iter` iterations) is timed from a barrier to a
barrier after it, set-up included; rank 0 prints the time, the iterations, the residual recomputed from `α`, and
the refinement steps.  The ratio of two runs' times (one GPU over P) is the scaling.  On CUDA the group is NCCL
and each rank uses the GPU of its `LOCAL_RANK`; `--device cpu` runs gloo (tiny sizes: a smoke test).
"""

from __future__ import annotations

import argparse
import math
import os
import time

import torch
import torch.distributed as dist

from kermac import solvers
from kermac.distributed import ShardedKernelOperator

FEATURES = 32


def _system(n: int, lam: float, dtype: torch.dtype, device: torch.device, rank: int, world: int):
    """This rank's rows of the global system (the same on every rank count)."""
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(n, FEATURES, generator=gen, dtype=torch.float64)
    u = torch.randn(FEATURES, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    y = torch.sin(x @ (u / u.norm())) + 0.1 * torch.randn(n, generator=gen, dtype=torch.float64)
    start, stop = n * rank // world, n * (rank + 1) // world
    x_r = x[start:stop].to(device, dtype)
    K = ShardedKernelOperator("gaussian", x_r, x_r, bandwidth=math.sqrt(FEATURES), regularization=lam)
    return K, y[start:stop].to(device)


def main(argv: list[str] | None = None) -> list[dict[str, object]]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=200_000, help="N")
    ap.add_argument("--lam", type=float, default=1e-3, help="λ")
    ap.add_argument("--tol", type=float, default=1e-4, help="relative residual to reach")
    ap.add_argument("--max-iter", type=int, default=1000)
    ap.add_argument("--preconditioners", default="none,nystrom,eigenpro", help="comma-separated; none = plain CG")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"], help="the operator's dtype")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    args = ap.parse_args(argv)

    if args.device == "cuda" and "LOCAL_RANK" in os.environ:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    if not dist.is_initialized():
        dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    device = torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" else torch.device("cpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    dtype = getattr(torch, args.dtype)
    names = [None if p == "none" else p for p in args.preconditioners.split(",")]

    small, y_small = _system(256, args.lam, dtype, device, rank, world)
    for p in names:
        solvers.solve(small, y_small, preconditioner=p, tol=1e-2, max_iter=2)
    K, y = _system(args.points, args.lam, dtype, device, rank, world)
    results = []
    for p in names:
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        s = solvers.solve(K, y, preconditioner=p, tol=args.tol, max_iter=args.max_iter)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dist.barrier()
        seconds = time.perf_counter() - start
        row = {
            "world": world,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "n": args.points,
            "preconditioner": p or "none",
            "seconds": seconds,
            "iterations": int(s.iterations.max()),
            "residual": float(s.residual.max()),
            "refinements": s.refinements,
        }
        results.append(row)
        if rank == 0:
            print(
                f"{world} rank(s) on {row['device']} | N {args.points} D {FEATURES} λ {args.lam} {args.dtype} "
                f"kernels, float64 y | cg + {row['preconditioner']}: {seconds:.2f} s, {row['iterations']} "
                f"iterations, residual {row['residual']:.2e}, {row['refinements']} refinements",
                flush=True,
            )
    return results


if __name__ == "__main__":
    main()
    dist.destroy_process_group()
