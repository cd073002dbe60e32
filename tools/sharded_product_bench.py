"""Throughput of the sharded kernel product `K @ v` (`kermac.distributed.ShardedKernelOperator`) on the ranks of
`torchrun`, for the scaling over GPUs (or CPU processes).

    torchrun --nproc-per-node 1 tools/sharded_product_bench.py [--points 1000000] [--features 32] [--columns 16]
    torchrun --nproc-per-node 2 tools/sharded_product_bench.py [--points 1000000] [--features 32] [--columns 16]

Each rank holds about N / P rows of `x = z` (the Gaussian kernel `K(x, x)`, bandwidth √D, standard normal
points) and of `v` `[N, C]`.  After one warm-up product (compilation, NCCL set-up), each of `--repeats` products
is timed from a barrier to a barrier after it (the device synchronised first), so a time covers the slowest
rank; rank 0 prints the median and the throughput in kernel entries per second (`N² / time`).  The ratio of
two runs' throughputs (P GPUs over one) is the scaling.  On CUDA the group is NCCL and each rank uses the GPU
of its `LOCAL_RANK`; `--device cpu` runs gloo (tiny sizes: a smoke test).  In a process that already has a
process group, `main` runs on it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

from kermac.distributed import ShardedKernelOperator


def main(argv: list[str] | None = None) -> dict[str, object]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=1_000_000, help="N: rows of x = z and of v")
    ap.add_argument("--features", type=int, default=32, help="D")
    ap.add_argument("--columns", type=int, default=16, help="C: columns of v")
    ap.add_argument("--kernel", default="gaussian", help="a preset name")
    ap.add_argument("--dtype", default="float32", choices=["float16", "bfloat16", "float32", "float64"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    ap.add_argument("--backend", default="auto", help="the kermac backend of the local products")
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args(argv)

    if args.device == "cuda" and "LOCAL_RANK" in os.environ:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    if not dist.is_initialized():
        dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    device = torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" else torch.device("cpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = args.points * (rank + 1) // world - args.points * rank // world
    dtype = getattr(torch, args.dtype)
    g = torch.Generator(device=device).manual_seed(rank)
    x = torch.randn(rows, args.features, generator=g, device=device).to(dtype)
    v = torch.randn(rows, args.columns, generator=g, device=device).to(dtype)
    k = ShardedKernelOperator(args.kernel, x, x, bandwidth=args.features**0.5, backend=args.backend)

    def product() -> float:
        dist.barrier()
        start = time.perf_counter()
        k @ v
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dist.barrier()
        return time.perf_counter() - start

    product()
    times = [product() for _ in range(args.repeats)]
    median = statistics.median(times)
    result = {
        "world": world,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "n": args.points,
        "d": args.features,
        "c": args.columns,
        "kernel": args.kernel,
        "dtype": args.dtype,
        "median_s": median,
        "entries_per_s": args.points**2 / median,
    }
    if rank == 0:
        print(
            f"{world} rank(s) on {result['device']} | N {args.points} D {args.features} C {args.columns} {args.kernel} "
            f"{args.dtype} | "
            f"median {median * 1e3:.2f} ms over {args.repeats} | {result['entries_per_s']:.3e} entries/s",
            flush=True,
        )
    return result


if __name__ == "__main__":
    main()
    dist.destroy_process_group()
