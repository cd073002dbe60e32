"""Batched and broadcast hyperparameters of a kernel written in one line.

    python examples/broadcast_kernel.py               # on the GPU if there is one
    python examples/broadcast_kernel.py --device cpu --backend triton

A hyperparameter is a number, or a tensor whose shape broadcasts against the inputs' batch dimensions (torch's
rules): the output's batch shape is the broadcast of all of them, and one launch computes every batch entry.
The Laplace kernel on the p-norm, exp(−‖x − z‖_p / σ), written with kermac.program, is run

1. with one σ per batch entry on a batch of inputs x [L, M, D] and shared z [N, D];
2. with p [L, 1] and σ [1, S] on inputs of no batch: an [L, S] grid of kernel matrices;
3. with p [L] and σ [L], each batch entry its own pair;

and each is checked against a float64 PyTorch reference.  The exit code is 1 if an error exceeds --tol.
"""

from __future__ import annotations

import argparse
import sys

import torch

import kermac
from kermac import dsl

LAPLACE_LP = kermac.program(
    inner=lambda x, z, p: abs(x - z) ** p,
    epilogue=lambda acc, p, bandwidth: dsl.exp(-(acc ** (1 / p)) / bandwidth),
)


def reference(x: torch.Tensor, z: torch.Tensor, p: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """exp(−‖x − z‖_p / σ) in float64, `p` and `sigma` broadcasting against the batch like kermac's."""
    t = (x.double()[..., :, None, :] - z.double()[..., None, :, :]).abs()  # [..., M, N, D]
    p, sigma = p.double()[..., None, None, None], sigma.double()[..., None, None]
    return torch.exp(-t.pow(p).sum(-1).pow(1 / p[..., 0]) / sigma)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("-l", type=int, default=4, help="batch entries (default 4)")
    parser.add_argument("-m", type=int, default=200, help="rows of x (default 200)")
    parser.add_argument("-n", type=int, default=150, help="rows of z (default 150)")
    parser.add_argument("-d", type=int, default=16, help="features (default 16)")
    parser.add_argument("--tol", type=float, default=1e-4, help="largest relative error accepted (default 1e-4)")
    parser.add_argument("--backend", default="auto", help="auto, torch, nvrtc or triton (default auto)")
    parser.add_argument("--debug", action="store_true", help="log the backend choice and JIT compilation")
    args = parser.parse_args()
    run = {"backend": args.backend, "debug": args.debug}
    dev, L = args.device, args.l

    def check(what: str, out: torch.Tensor, ref: torch.Tensor) -> bool:
        err = ((out.double() - ref).abs().max() / ref.abs().max()).item()
        print(f"{what}: {list(out.shape)}, max rel error {err:.2e}" + ("" if err <= args.tol else "  TOO LARGE"))
        return err <= args.tol

    ok = True
    # 1. σ per batch entry, x batched, z shared
    x = torch.randn(L, args.m, args.d, device=dev)
    z = torch.randn(args.n, args.d, device=dev)
    sigma = torch.linspace(0.5, 2.0, L, device=dev) * args.d**0.5
    out = LAPLACE_LP(x, z, p=1.5, bandwidth=sigma, **run)
    ok &= check("1. sigma [L], x [L, M, D], z [N, D]", out, reference(x, z, torch.tensor(1.5), sigma))

    # 2. p [L, 1] × σ [1, S]: a grid of kernel matrices from unbatched inputs
    x2, z2 = x[0], z
    p = torch.linspace(1.0, 2.0, L, device=dev)[:, None]
    sigma2 = torch.tensor([0.5, 1.0, 2.0], device=dev)[None, :] * args.d**0.5
    out = LAPLACE_LP(x2, z2, p=p, bandwidth=sigma2, **run)
    ok &= check("2. p [L, 1] x sigma [1, 3], x [M, D], z [N, D]", out, reference(x2, z2, p, sigma2))

    # 3. p [L] and σ [L] pairwise, with batched x and z
    z3 = torch.randn(L, args.n, args.d, device=dev)
    p3 = torch.linspace(0.8, 3.0, L, device=dev)
    out = LAPLACE_LP(x, z3, p=p3, bandwidth=sigma, **run)
    ok &= check("3. p [L], sigma [L], x [L, M, D], z [L, N, D]", out, reference(x, z3, p3, sigma))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
