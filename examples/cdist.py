"""Pairwise p-norm distances with kermac.cdist, checked against torch.cdist in float64.

    python examples/cdist.py                    # p = 2, on the GPU if there is one
    python examples/cdist.py -p 1.3 --batch 4   # a batch of 4 distance matrices
    python examples/cdist.py -p inf --device cpu --backend torch --debug

x [B, M, D] and z [B, N, D] (no batch dimension without --batch) give [B, M, N] with
out[b, m, n] = (Σ_k |x[b,m,k] − z[b,n,k]|^p)^(1/p); p = 0 counts differing coordinates and
p = inf takes the largest one.
"""

from __future__ import annotations

import argparse
import time

import torch

import kermac


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("-m", type=int, default=1000, help="rows of x (default 1000)")
    parser.add_argument("-n", type=int, default=800, help="rows of z (default 800)")
    parser.add_argument("-d", type=int, default=64, help="features (default 64)")
    parser.add_argument("-p", type=float, default=2.0, help="the norm, in [0, inf] (default 2)")
    parser.add_argument("--batch", type=int, default=None, help="batch size (default: no batch dimension)")
    parser.add_argument("--backend", default="auto", help="auto, torch, nvrtc or triton (default auto)")
    parser.add_argument("--debug", action="store_true", help="log the backend choice and JIT compilation")
    args = parser.parse_args()

    batch = () if args.batch is None else (args.batch,)
    x = torch.randn(*batch, args.m, args.d, device=args.device)
    z = torch.randn(*batch, args.n, args.d, device=args.device)
    out = torch.empty(*batch, args.m, args.n, device=args.device)

    kermac.cdist(x, z, args.p, out=out, backend=args.backend, debug=args.debug)  # first call: JIT compile
    if out.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    kermac.cdist(x, z, args.p, out=out, backend=args.backend, debug=args.debug)
    if out.is_cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start

    ref = torch.cdist(x.double(), z.double(), args.p)
    err = ((out.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-300)).item()
    print(f"kermac.cdist {list(x.shape)} x {list(z.shape)} -> {list(out.shape)}, p={args.p:g}, on {args.device}")
    print(f"time (second call): {1e3 * elapsed:.2f} ms")
    print(f"max relative error vs torch.cdist in float64: {err:.3e}")


if __name__ == "__main__":
    main()
