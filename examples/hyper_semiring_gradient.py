"""mm-kermac's gradient kernels, each in one line of kermac: a custom gradient semiring with hyperparameters, and
the gradient zoo.

    python examples/hyper_semiring_gradient.py               # on the GPU if there is one
    python examples/hyper_semiring_gradient.py --device cpu --backend triton

A gradient kernel computes, with a [L, K, M], b [L, N, K], c [L, O, K], d [L, N, M] (mm-kermac's
grad_kernel_matrix, x, coefs and z),

    out[l, o, n, m] = epilogue(REDUCE_k accumulate(c[l, o, k], multiply(a[l, k, m], b[l, n, k], d[l, n, m])))

with the sum of c · multiply by default (mm-kermac's accumulate_lambda: c times the multiply's value, added up).

1. mm-kermac's sketch: multiply α·(d − b)·a, epilogue scale·acc, with α = 0.25 and scale = 2.
2. The gradient zoo: NormL1Grad, NormL2Grad and NormLpGrad (p = 1.3, with a floor ε on |d − b|).
3. Another accumulation and reduction: a soft maximum over k, γ·log Σ_k exp(c·(|d − b| − a)/γ).

Each result is checked against a float64 einsum; the exit code is 1 if an error exceeds --tol.
"""

from __future__ import annotations

import argparse
import sys

import torch

import kermac
from kermac import zoo


def reference(a, b, c, d, phi) -> torch.Tensor:
    """Σ_k c[o,k]·a[k,m]·phi(d[n,m] − b[n,k]) in float64."""
    a, b, c, d = (t.double() for t in (a, b, c, d))
    t = d[..., :, :, None] - b[..., :, None, :]  # [L, N, M, K]
    return torch.einsum("...ok,...km,...nmk->...onm", c, a, phi(t))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("-m", type=int, default=20, help="M, columns of a and d (default 20)")
    parser.add_argument("-n", type=int, default=16, help="N, rows of b and d (default 16)")
    parser.add_argument("-o", type=int, default=3, help="O, rows of c (default 3)")
    parser.add_argument("-k", type=int, default=100, help="K, the contracted size (default 100)")
    parser.add_argument("-l", type=int, default=2, help="L, batch entries (default 2)")
    parser.add_argument("--tol", type=float, default=1e-4, help="largest relative error accepted (default 1e-4)")
    parser.add_argument("--backend", default="auto", help="auto, torch, nvrtc or triton (default auto)")
    parser.add_argument("--debug", action="store_true", help="log the backend choice and JIT compilation")
    args = parser.parse_args()
    run = {"backend": args.backend, "debug": args.debug}
    device, L = torch.device(args.device), args.l

    a = torch.randn(L, args.k, args.m, device=device)  # grad_kernel_matrix
    b = torch.randn(L, args.n, args.k, device=device)  # x
    c = torch.randn(L, args.o, args.k, device=device)  # coefs
    d = torch.randn(L, args.n, args.m, device=device)  # z
    ok = True

    def check(what: str, result: torch.Tensor, ref: torch.Tensor) -> None:
        nonlocal ok
        err = ((result.double() - ref).abs().max() / ref.abs().max()).item()
        ok &= err <= args.tol
        print(f"{what}: {list(result.shape)}, max rel error {err:.2e}" + ("" if err <= args.tol else "  TOO LARGE"))

    # 1. The sketch: scale · Σ_k c · (α·(d − b)·a).
    kernel = kermac.gradient_program(
        multiply=lambda a, b, d, alpha: alpha * (d - b) * a, epilogue=lambda acc, scale: scale * acc
    )
    out = kernel(a, b, c, d, alpha=torch.tensor(0.25, device=device), scale=torch.tensor(2.0, device=device), **run)
    check("1. scale * sum c*alpha*(d - b)*a", out, 0.5 * reference(a, b, c, d, lambda t: t))

    # 2. The gradient zoo.
    check("2. NormL1Grad", zoo.NormL1Grad()(a, b, c, d, **run), reference(a, b, c, d, torch.sign))
    check("2. NormL2Grad", zoo.NormL2Grad()(a, b, c, d, **run), reference(a, b, c, d, lambda t: t))
    eps, q = 1e-3, 1.3 - 1.0
    lp = zoo.NormLpGrad(epsilon=eps)(a, b, c, d, p_power_grad=torch.tensor([q], device=device), **run)
    check("2. NormLpGrad p=1.3", lp, reference(a, b, c, d, lambda t: torch.sign(t) * t.abs().clamp_min(eps).pow(q)))

    # 3. A soft maximum over k of c·(|d − b| − a): any accumulation and reduction run the general fused kernel.
    soft = kermac.gradient_program(
        multiply=lambda a, b, d: abs(d - b) - a,
        accumulate=lambda c, term, gamma: c * term / gamma,
        reduce="logsumexp",
        epilogue=lambda acc, gamma: gamma * acc,
    )
    gamma = 0.5
    a64, b64, c64, d64 = (t.double() for t in (a, b, c, d))
    shifted = (d64[..., :, :, None] - b64[..., :, None, :]).abs() - a64.mT[..., None, :, :]  # [L, N, M, K]
    terms = c64[..., :, None, None, :] * shifted[..., None, :, :, :]  # [L, O, N, M, K]
    check("3. soft max_k c*(|d - b| - a)", soft(a, b, c, d, gamma=gamma, **run), gamma * (terms / gamma).logsumexp(-1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
