"""Accuracy of an l1 distance of float16 inputs summed in packed half arithmetic, against today's float32 sum.

    python tools/half_packed_accuracy.py [--features 32,256] [--points 256] [--lane-terms 1,2,4,8,16] [--seed 0]

A float16 l1 distance ``Σ_k |x[k] − z[k]|`` rounded to a float16 output.  Today's kernels convert the inputs to
float32, where every difference of two float16 values is exact, and sum in float32: the output is the correctly
rounded float16 of the exact sum (at most 0.5 ulp of float16).  Packed half arithmetic (`half2`: two features per
instruction) would round each difference to float16 and add ``T`` of them per lane in float16 before adding the
partial sums to a float32 accumulator; it saves issue slots only if ``T`` is large:

    float32, per term: a difference and an add of its absolute value                2 instructions
    half2, per term:   (a difference and an add of its absolute value) / 2           1 instruction
                       + per T terms of each of the 2 lanes, 2 conversions and 2 adds  2 / T instructions

so ``2 / (1 + 2/T)`` fewer issue slots: 1.33× at ``T`` = 4, 1.6× at 8, 1.78× at 16 (an absolute value that takes an
instruction of its own instead of an operand modifier adds 0.5 per term).  This tool emulates that arithmetic on the
CPU (each float16 operation rounded to float16, as torch computes float16 on the CPU: in float32, then rounded)
for ``x``, ``z`` ~ N(0, 1) (and shifted or scaled copies, where differences are exact) and prints, per ``T``, the
error of the float16 outputs in ulps of the correctly rounded output: largest, and the share above 0.5 and 1 ulp.
"""

from __future__ import annotations

import argparse

import torch

__all__ = ["errors_in_ulps", "main", "packed_half_l1", "ulps"]


def ulps(out: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """``|out − exact|`` in units of the last place of ``exact`` rounded to float16 (float64)."""
    rounded = exact.to(torch.float16)
    spacing = torch.nextafter(rounded.abs(), torch.tensor(torch.inf, dtype=torch.float16)) - rounded.abs()
    return (out.double() - exact).abs() / spacing.double()


def packed_half_l1(x: torch.Tensor, z: torch.Tensor, lane_terms: int) -> torch.Tensor:
    """``Σ_k |x[m, k] − z[n, k]|`` of float16 ``x`` ``[M, D]`` and ``z`` ``[N, D]`` as packed half arithmetic would
    sum it: each difference and partial sum rounded to float16, features ``k`` and ``k + 1`` in the two lanes of a
    ``half2``, ``lane_terms`` terms per lane added in float16 before both lanes go into a float32 accumulator; the
    float16 output ``[M, N]``."""
    d = x.shape[1]
    diffs = (x[:, None, :] - z[None, :, :]).abs()  # float16: each rounded
    acc = torch.zeros(diffs.shape[:2], dtype=torch.float32)
    chunk = 2 * lane_terms
    for start in range(0, d, chunk):
        for lane in (0, 1):
            part = torch.zeros(diffs.shape[:2], dtype=torch.float16)
            for k in range(start + lane, min(d, start + chunk), 2):
                part = part + diffs[:, :, k]
            acc = acc + part.float()
    return acc.to(torch.float16)


def float32_l1(x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """Today's kernels: exact float32 differences of the float16 inputs, summed in float32 in feature order."""
    diffs = (x.float()[:, None, :] - z.float()[None, :, :]).abs()
    acc = torch.zeros(diffs.shape[:2], dtype=torch.float32)
    for k in range(x.shape[1]):
        acc = acc + diffs[:, :, k]
    return acc.to(torch.float16)


def errors_in_ulps(x: torch.Tensor, z: torch.Tensor, lane_terms: list[int]) -> dict[str, tuple[float, float, float]]:
    """Per summation (today's float32, then packed half with each ``lane_terms``): the largest error in float16 ulps
    of the correctly rounded output and the shares (%) of outputs above 0.5 ulp and above 1 ulp."""
    exact = (x.double()[:, None, :] - z.double()[None, :, :]).abs().sum(-1)
    sums = {"float32 (today)": float32_l1(x, z)}
    sums |= {f"half2, {t} term(s) per lane": packed_half_l1(x, z, t) for t in lane_terms}
    rows = {}
    for name, out in sums.items():
        u = ulps(out, exact)
        rows[name] = (u.max().item(), 100 * (u > 0.5).double().mean().item(), 100 * (u > 1).double().mean().item())
    return rows


def _ints(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--features", default="32,256", help="comma-separated feature counts D (default 32,256)")
    ap.add_argument("--points", type=int, default=256, help="rows of x and of z (default 256)")
    ap.add_argument("--lane-terms", default="1,2,4,8,16", help="terms per lane summed in float16 (default 1,2,4,8,16)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    features, lane_terms = _ints(args.features), _ints(args.lane_terms)
    if not features or min(features) < 1 or args.points < 1 or not lane_terms or min(lane_terms) < 1:
        ap.error(
            f"expected positive --features, --points and --lane-terms, got {args.features!r}, {args.points}, "
            f"{args.lane_terms!r}"
        )
    g = torch.Generator().manual_seed(args.seed)
    inputs = {"N(0, 1)": (1.0, 0.0), "N(8, 1)": (1.0, 8.0), "N(1, 0.01²)": (0.01, 1.0)}
    print("| D | inputs | summation | largest error (ulp) | > 0.5 ulp | > 1 ulp |")
    print("|---:|---|---|---:|---:|---:|")
    for d in features:
        for label, (scale, shift) in inputs.items():
            x = (torch.randn(args.points, d, generator=g, dtype=torch.float64) * scale + shift).half()
            z = (torch.randn(args.points, d, generator=g, dtype=torch.float64) * scale + shift).half()
            for name, (largest, half_ulp, one_ulp) in errors_in_ulps(x, z, lane_terms).items():
                print(f"| {d} | {label} | {name} | {largest:.2f} | {half_ulp:.2f} % | {one_ulp:.3f} % |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
