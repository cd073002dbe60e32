"""A Recursive Feature Machine learns the one direction a target depends on, where kernel ridge cannot.

    python examples/rfm_synthetic.py                   # n = 20000 on the GPU if there is one, else 400 (seconds)
    python examples/rfm_synthetic.py -n 100000 -d 32   # large, on a GPU
    python examples/rfm_synthetic.py --plain-torch     # also time an RFM in plain torch and compare

x ~ N(0, I) in D dimensions and y = sin(3·⟨x, u⟩) + 0.01·noise for a random unit vector u. The RFM's learned
feature matrix M (the average gradient outer product of its predictor) concentrates on u: the example prints
|cos| between u and M's top eigenvector, and the test R² of the RFM against a kernel ridge with the same kernel,
bandwidth and regularisation. `--plain-torch` also fits the same RFM written in plain torch (dense `torch.cdist`,
`torch.linalg.solve`, einsum AGOP; n² memory) and prints both fit times (each after a warm-up fit on 2000 points
that compiles kermac's kernels; autotuning at the timed sizes stays in kermac's time) and the difference of the
learned M.
"""

from __future__ import annotations

import argparse
import time

import torch

from kermac.models import KernelRidge, RecursiveFeatureMachine


def plain_torch_rfm(x: torch.Tensor, y: torch.Tensor, bandwidth: float, lam: float, iterations: int) -> torch.Tensor:
    """The Laplace-L2 RFM with dense matrices: returns M after `iterations` AGOP updates (and fits the final ridge,
    as `RecursiveFeatureMachine.fit` does)."""
    n, d = x.shape
    M = torch.eye(d, dtype=x.dtype, device=x.device)
    for step in range(iterations + 1):
        w, V = torch.linalg.eigh(M)
        L = (V * w.clamp(min=0).sqrt()) @ V.T
        f = x @ L
        dist = torch.cdist(f, f)
        K = torch.exp(-dist / bandwidth)
        alpha = torch.linalg.solve(K + lam * torch.eye(n, dtype=x.dtype, device=x.device), y)
        if step == iterations:
            return M
        # ∇_f f(f_m) = Σ_n α_n ∂k/∂f_m = Σ_n W_mn (f_m − f_n), W_mn = −α_n k_mn / (σ ‖f_m − f_n‖) (0 where f_m = f_n)
        W = torch.where(dist > 0, -K / (bandwidth * torch.where(dist > 0, dist, 1)), 0) * alpha[None, :]
        J = (f * W.sum(1, keepdim=True) - W @ f) @ L.T
        M = torch.einsum("md,me->de", J, J) / n
    return M


def _timed(fn, device: str) -> tuple[object, float]:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("-n", type=int, default=None, help="training points (default 20000 on CUDA, 400 on the CPU)")
    parser.add_argument("-d", type=int, default=8, help="features (default 8)")
    parser.add_argument("--iterations", type=int, default=3, help="AGOP updates (default 3)")
    parser.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    parser.add_argument("--backend", default="auto", help="auto or a kermac backend (default auto)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plain-torch", action="store_true", help="also fit and time an RFM in plain torch")
    args = parser.parse_args()
    if args.n is None:
        args.n = 20000 if args.device.startswith("cuda") else 400

    generator = torch.Generator().manual_seed(args.seed)
    dtype = getattr(torch, args.dtype)
    u = torch.randn(args.d, generator=generator, dtype=torch.float64)
    u /= u.norm()

    def sample(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(n, args.d, generator=generator, dtype=torch.float64)
        y = torch.sin(3 * x @ u) + 0.01 * torch.randn(n, generator=generator, dtype=torch.float64)
        return x.to(args.device, dtype), y.to(args.device, dtype)

    x, y = sample(args.n)
    x_test, y_test = sample(max(args.n // 4, 1))
    hyper = {"bandwidth": 10.0, "regularization": 1e-3, "backend": args.backend}

    if args.plain_torch:  # compile kermac's kernels and warm both libraries up before timing either
        warm = slice(0, min(args.n, 2000))
        RecursiveFeatureMachine(iterations=1, **hyper).fit(x[warm], y[warm])
        plain_torch_rfm(x[warm], y[warm], 10.0, 1e-3, 1)
    rfm, elapsed = _timed(lambda: RecursiveFeatureMachine(iterations=args.iterations, **hyper).fit(x, y), args.device)
    ridge = KernelRidge(**hyper).fit(x, y)

    top = torch.linalg.eigh(rfm.M_.double())[1][:, -1].cpu()
    print(f"RFM on {args.n} points, D = {args.d}, {args.iterations} iterations, {args.dtype} on {args.device}")
    print(f"fit time: {elapsed:.2f} s (solver {rfm.ridge_.solution_.method!r}); training R² per ridge: "
          f"{', '.join(f'{r:.4f}' for r in rfm.history_)}")  # fmt: skip
    print(f"|cos(u, top eigenvector of M)| = {abs(float(top @ u)):.4f}")
    print(f"test R²: RFM {rfm.score(x_test, y_test):.4f}, kernel ridge {ridge.score(x_test, y_test):.4f}")
    if args.plain_torch:
        M, plain = _timed(lambda: plain_torch_rfm(x, y, 10.0, 1e-3, args.iterations), args.device)
        difference = float((rfm.M_ - M).abs().max() / M.abs().max())
        print(f"plain torch RFM (torch.cdist, torch.linalg.solve, einsum AGOP): fit time {plain:.2f} s")
        print(f"kermac speed-up {plain / elapsed:.2f}x; max |M_kermac - M_plain| / max |M_plain| = {difference:.2e}")


if __name__ == "__main__":
    main()
