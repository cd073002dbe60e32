"""The gradient contraction kermac.cdist_grad, checked against a float64 PyTorch reference.

    python examples/cdist_grad.py               # p = 1.5, on the GPU if there is one
    python examples/cdist_grad.py -p 1 --device cpu --debug

With a [K, M], b [N, K], c [O, K] and d [N, M] it computes

    out[o, n, m] = Σ_k c[o,k] · a[k,m] · sgn(d[n,m] − b[n,k]) · |d[n,m] − b[n,k]|^(p−1)

(sgn(0) = 0), the contraction in the gradient of a p-norm kernel predictor that AGOP / Recursive
Feature Machines need, without materialising the [N, K, M] tensor of differences. The reference
below does materialise it, so keep the sizes modest.
"""

from __future__ import annotations

import argparse

import torch

import kermac


def reference(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor, p: float) -> torch.Tensor:
    """The contraction in float64 through an explicit [N, K, M] difference tensor."""
    a, b, c, d = (t.double() for t in (a, b, c, d))
    t = d[:, None, :] - b[:, :, None]  # [N, K, M]
    w = torch.sign(t) * t.abs().pow(p - 1.0)
    w = torch.where(t == 0, torch.zeros_like(w), w)  # sgn(0) = 0 also where |0|^(p-1) is inf
    return torch.einsum("ok,km,nkm->onm", c, a, w)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("-m", type=int, default=300, help="M: columns of a and d (default 300)")
    parser.add_argument("-n", type=int, default=40, help="N: rows of b and d (default 40)")
    parser.add_argument("-o", type=int, default=8, help="O: rows of c (default 8)")
    parser.add_argument("-k", type=int, default=200, help="K: the contracted dimension (default 200)")
    parser.add_argument("-p", type=float, default=1.5, help="the norm, > 0 (default 1.5)")
    parser.add_argument("--backend", default="auto", help="auto, torch, nvrtc or triton (default auto)")
    parser.add_argument("--debug", action="store_true", help="log the backend choice and JIT compilation")
    args = parser.parse_args()

    dev = args.device
    a = torch.randn(args.k, args.m, device=dev)
    b = torch.randn(args.n, args.k, device=dev)
    c = torch.randn(args.o, args.k, device=dev)
    d = torch.randn(args.n, args.m, device=dev)

    out = kermac.cdist_grad(a, b, c, d, p=args.p, backend=args.backend, debug=args.debug)
    ref = reference(a, b, c, d, args.p)
    err = ((out.double() - ref).abs().max() / ref.abs().max()).item()
    print(
        f"kermac.cdist_grad p={args.p:g}: a {list(a.shape)}, b {list(b.shape)}, c {list(c.shape)}, "
        f"d {list(d.shape)} -> {list(out.shape)} on {dev}"
    )
    print(f"max relative error vs float64 reference: {err:.3e}")


if __name__ == "__main__":
    main()
