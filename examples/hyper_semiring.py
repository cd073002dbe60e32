"""mm-kermac's "hyper semiring" examples, each in one line of kermac: custom semirings with named
hyperparameters, and the zoo.

    python examples/hyper_semiring.py               # on the GPU if there is one
    python examples/hyper_semiring.py --device cpu --backend triton

1. mm-kermac's custom kernel sketch: the multiply β·(z − x), the sum, the epilogue γ·acc, with β and γ
   hyperparameters given as 0-d tensors (β = 0.5, γ = 2 gives Σ_k (z − x)).
2. Its quickstart: `Gemm`, `NormL2` and `NormLp` (fractional p through `p_inner` and `p_outer`) from
   kermac.zoo, writing into a preallocated `out`.
3. A length-L hyperparameter: three values of β at once (one kernel matrix each).

Each result is checked against a float64 PyTorch reference; the exit code is 1 if an error exceeds --tol.
"""

from __future__ import annotations

import argparse
import sys

import torch

import kermac
from kermac import zoo


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("-m", type=int, default=1024, help="rows of x (default 1024)")
    parser.add_argument("-n", type=int, default=2048, help="rows of z (default 2048)")
    parser.add_argument("-k", type=int, default=256, help="features (default 256)")
    parser.add_argument("-p", type=float, default=1.3, help="the fractional p of NormLp (default 1.3)")
    parser.add_argument("--tol", type=float, default=1e-4, help="largest relative error accepted (default 1e-4)")
    parser.add_argument("--backend", default="auto", help="auto, torch, nvrtc or triton (default auto)")
    parser.add_argument("--debug", action="store_true", help="log the backend choice and JIT compilation")
    args = parser.parse_args()
    run = {"backend": args.backend, "debug": args.debug}
    device = torch.device(args.device)

    x = torch.randn(args.m, args.k, device=device)
    z = torch.randn(args.n, args.k, device=device)
    out = torch.empty((args.m, args.n), device=device)
    x64, z64 = x.double(), z.double()
    ok = True

    def check(what: str, result: torch.Tensor, ref: torch.Tensor) -> None:
        nonlocal ok
        err = ((result.double() - ref).abs().max() / ref.abs().max()).item()
        ok &= err <= args.tol
        print(f"{what}: {list(result.shape)}, max rel error {err:.2e}" + ("" if err <= args.tol else "  TOO LARGE"))

    # 1. The custom semiring: multiply β·(z − x), sum, epilogue γ·acc.
    kernel = kermac.program(inner=lambda x, z, beta: beta * (z - x), epilogue=lambda acc, gamma: gamma * acc)
    beta, gamma = torch.tensor(0.5, device=device), torch.tensor(2.0, device=device)
    kernel(x, z, beta=beta, gamma=gamma, out=out, **run)
    check("1. gamma * sum beta*(z - x)", out, z64.sum(-1)[None, :] - x64.sum(-1)[:, None])

    # 2. The zoo, as in mm-kermac's quickstart.
    zoo.Gemm()(x=x, z=z, out=out, **run)
    check("2. Gemm", out, x64 @ z64.T)
    zoo.NormL2()(x=x, z=z, out=out, **run)
    check("2. NormL2", out, torch.cdist(x64, z64, compute_mode="donot_use_mm_for_euclid_dist"))
    p = args.p
    p_inner, p_outer = torch.tensor(p, device=device), torch.tensor(1.0 / p, device=device)
    zoo.NormLp(epsilon=0.0)(x=x, z=z, p_inner=p_inner, p_outer=p_outer, out=out, **run)
    check(f"2. NormLp p={p:g}", out, torch.cdist(x64, z64, p))

    # 3. Three values of β in one launch: the hyperparameter's length is the batch.
    betas = torch.tensor([0.25, 0.5, 1.0], device=device)
    batched = kernel(x, z, beta=betas, gamma=1.0, **run)
    check("3. beta [3]", batched, betas.double()[:, None, None] * (z64.sum(-1)[None, :] - x64.sum(-1)[:, None]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
