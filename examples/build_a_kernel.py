"""Build kernels in one line each with kermac.program, and check every one against float64 PyTorch.

    python examples/build_a_kernel.py               # on the GPU if there is one
    python examples/build_a_kernel.py --device cpu --backend triton --debug

kermac's original build_a_kernel.py combined descriptor fields (inner power, outer power, kernel function);
here each combination is a program written as Python functions: the term of one feature pair (`inner`), the
reduction over the features, and the function of the reduced value (`epilogue`).  Hyperparameters are the
functions' other parameters, given by keyword when the kernel is called.  Every kernel is compiled once per
process and backend (and kept in the JIT cache across processes); the first run takes a few seconds per kernel.

Each line prints the kernel, its maximum relative error against the float64 reference, and whether it runs the
same kernel as a preset (its program's normal form, kermac.dsl.canonical_key, is the preset's).  The exit code
is 1 if an error exceeds --tol.
"""

from __future__ import annotations

import argparse
import sys

import torch

import kermac
from kermac import dsl, presets


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("-m", type=int, default=300, help="rows of x (default 300)")
    parser.add_argument("-n", type=int, default=200, help="rows of z (default 200)")
    parser.add_argument("-d", type=int, default=16, help="features (default 16)")
    parser.add_argument("-p", type=float, default=1.3, help="the fractional p (default 1.3)")
    parser.add_argument("--tol", type=float, default=1e-4, help="largest relative error accepted (default 1e-4)")
    parser.add_argument("--backend", default="auto", help="auto, torch, nvrtc or triton (default auto)")
    parser.add_argument("--debug", action="store_true", help="log the backend choice and JIT compilation")
    args = parser.parse_args()

    x = torch.randn(args.m, args.d, device=args.device)
    z = torch.randn(args.n, args.d, device=args.device)
    t = x.double()[:, None, :] - z.double()[None, :, :]  # [M, N, D] differences for the references
    p, sigma = args.p, float(args.d) ** 0.5

    # (name, kernel, hyperparameters, float64 reference, preset it matches or None)
    kernels = [
        ("sum |x-z|", kermac.program(lambda x, z: abs(x - z)), {}, t.abs().sum(-1), presets.l1_distance),
        ("sum (x-z)^2", kermac.program(lambda x, z: (x - z) ** 2), {}, t.square().sum(-1), presets.squared_l2_distance),
        (
            "sqrt(sum (x-z)^2)",
            kermac.program(lambda x, z: (x - z) ** 2, epilogue=lambda acc: dsl.sqrt(acc)),
            {},
            t.square().sum(-1).sqrt(),
            presets.l2_distance,
        ),
        (
            "(sum |x-z|^p)^(1/p)",
            kermac.program(lambda x, z, p: abs(x - z) ** p, epilogue=lambda acc, p: acc ** (1 / p)),
            {"p": p},
            t.abs().pow(p).sum(-1).pow(1 / p),
            None,
        ),
        ("max |x-z|", kermac.program(lambda x, z: abs(x - z), reduce="max"), {}, t.abs().amax(-1), None),
        ("min |x-z|", kermac.program(lambda x, z: abs(x - z), reduce="min"), {}, t.abs().amin(-1), None),
        ("sum x*z", kermac.program(lambda x, z: x * z), {}, x.double() @ z.double().T, presets.dot_product),
        (
            "laplace l1",
            kermac.program(lambda x, z: abs(x - z), epilogue=lambda acc, bandwidth: dsl.exp(-(acc / bandwidth))),
            {"bandwidth": sigma * sigma},
            torch.exp(-t.abs().sum(-1) / sigma**2),
            presets.laplace_l1,
        ),
        (
            "laplace l2",
            kermac.program(
                lambda x, z: (x - z) ** 2, epilogue=lambda acc, bandwidth: dsl.exp(-(dsl.sqrt(acc) / bandwidth))
            ),
            {"bandwidth": sigma},
            torch.exp(-t.square().sum(-1).sqrt() / sigma),
            presets.laplace_l2,
        ),
        (
            "laplace lp",
            kermac.program(
                lambda x, z, p: abs(x - z) ** p,
                epilogue=lambda acc, p, bandwidth: dsl.exp(-(acc ** (1 / p)) / bandwidth),
            ),
            {"p": p, "bandwidth": sigma},
            torch.exp(-t.abs().pow(p).sum(-1).pow(1 / p) / sigma),
            None,
        ),
        (
            "gaussian",
            kermac.program(
                lambda x, z: (x - z) ** 2,
                epilogue=lambda acc, bandwidth: dsl.exp(-(acc / (2 * (bandwidth * bandwidth)))),
            ),
            {"bandwidth": sigma},
            torch.exp(-t.square().sum(-1) / (2 * sigma**2)),
            presets.gaussian,
        ),
        (
            "cauchy",
            kermac.program(lambda x, z: (x - z) ** 2, epilogue=lambda acc, bandwidth: 1 / (1 + acc / bandwidth**2)),
            {"bandwidth": sigma},
            1 / (1 + t.square().sum(-1) / sigma**2),
            presets.cauchy,
        ),
        (
            "clipped |x-z| (where)",
            kermac.program(lambda x, z, clip: dsl.where(abs(x - z) < clip, abs(x - z), clip)),
            {"clip": 1.0},
            t.abs().clamp_max(1.0).sum(-1),
            None,
        ),
    ]
    failed = 0
    for name, kernel, hypers, ref, preset in kernels:
        out = kernel(x, z, backend=args.backend, debug=args.debug, **hypers)
        err = ((out.double() - ref).abs().max() / ref.abs().max()).item()
        same = preset is not None and dsl.canonical_key(kernel.program) == dsl.canonical_key(preset.lower())
        flag = "ok" if err <= args.tol else "TOO LARGE"
        failed += err > args.tol
        print(f"{name:24s} {list(out.shape)}  max rel error {err:.2e} {flag}" + ("  (preset's kernel)" if same else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
