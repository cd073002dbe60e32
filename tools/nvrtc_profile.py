"""Nsight Compute profile of one NVRTC kernel launch, summarised (run on the GPU machine).

Wraps itself in ``ncu`` (found on PATH or in /usr/local/cuda/bin): the child process runs the
operation twice — compile and warm-up, then the profiled launch — and ncu collects the
speed-of-light, scheduler, warp-state and source-counter sections of that second ``kermac_*``
launch.  Prints the figures that tell what limits a kernel: duration and SM clock (ncu locks the
clock to base by default), issue-slot use, eligible warps, registers and shared memory per block,
executed instructions, shared-memory wavefronts, and the warp-stall samples by reason — all
samples and those of cycles where no warp issued — largest first.  The full ncu report goes to
``--report`` if given.

    python tools/nvrtc_profile.py cdist:8192:1024:1.3        # cdist, M = N = 8192, D = 1024, p
    python tools/nvrtc_profile.py kernel:laplace_l1:16384:128  # a preset kernel, σ = 10
    python tools/nvrtc_profile.py grad:4096:256:16:4096:1.5   # cdist_grad (M, N, O, K), p

    python tools/nvrtc_profile.py cdist:8192:1024:1.3 --tuning power_table_pairs=36 --tuning power_table=1

``--tuning FIELD=VALUE`` profiles an NVRTC backend whose tuning (``kermac_backend_nvrtc.NvrtcTuning``)
differs from the defaults in that field (0/1 for switches), registered as ``nvrtc`` in the child.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys

SECTIONS = (
    "SpeedOfLight",
    "ComputeWorkloadAnalysis",
    "SchedulerStats",
    "WarpStateStats",
    "SourceCounters",
    "LaunchStats",
    "Occupancy",
)
SUMMARY = (
    "Duration",
    "SM Frequency",
    "Issue Slots Busy",
    "Executed Ipc Active",
    "No Eligible",
    "Eligible Warps Per Scheduler",
    "Registers Per Thread",
    "Static Shared Memory Per Block",
    "Dynamic Shared Memory Per Block",
    "Achieved Occupancy",
    "Executed Instructions",
    "L1 Wavefronts Shared",
    "L1 Wavefronts Shared Excessive",
)
_METRIC = re.compile(r"^\s{4}(\S.*?)\s{2,}(\S.*?)?\s{2,}(\S+)\s*$")
_STALL = re.compile(
    r"Warp Stall Sampling \((All|Not-issued) Samples\) \(smsp__pcsamp_warps_issue_stalled_(\w+?)(?:_not_issued)?\)"
)


def tuning_of(assignments: list[str]) -> object:
    """``--tuning FIELD=VALUE`` arguments → the default ``NvrtcTuning`` with those fields replaced."""
    import dataclasses

    from kermac_backend_nvrtc import DEFAULT_TUNING

    fields = {f.name for f in dataclasses.fields(DEFAULT_TUNING)}
    changes: dict[str, object] = {}
    for item in assignments:
        name, sep, text = item.partition("=")
        if not sep or name not in fields or not text.strip().isdigit():
            raise SystemExit(f"--tuning: expected FIELD=VALUE, FIELD one of {', '.join(sorted(fields))}, got {item!r}")
        changes[name] = bool(int(text)) if isinstance(getattr(DEFAULT_TUNING, name), bool) else int(text)
    return dataclasses.replace(DEFAULT_TUNING, **changes)


def run_operation(spec: str, tuning: list[str] | None = None) -> None:
    """The operation ``spec`` names, twice (the second call is the one profiled), on an NVRTC backend
    of the tuning that ``tuning`` (``--tuning`` arguments) describes."""
    import contextlib

    from kermac_backend_nvrtc import NvrtcBackend
    from kermac_backend_nvrtc.tuned import registered

    changed = tuning_of(tuning or [])
    with registered(NvrtcBackend(changed)) if tuning else contextlib.nullcontext():
        _run_twice(spec)


def _run_twice(spec: str) -> None:
    import torch

    import kermac

    kind, *fields = spec.split(":")
    for _ in range(2):
        if kind == "cdist":
            m, d, p = int(fields[0]), int(fields[1]), float(fields[2])
            x, z = torch.randn(m, d, device="cuda"), torch.randn(m, d, device="cuda")
            kermac.cdist(x, z, p=p, out=torch.empty(m, m, device="cuda"), backend="nvrtc")
        elif kind == "kernel":
            name, m, d = fields[0], int(fields[1]), int(fields[2])
            x, z = torch.randn(m, d, device="cuda"), torch.randn(m, d, device="cuda")
            out = torch.empty(m, m, device="cuda")
            kermac.run_kernel(kermac.presets.ALL[name], x, z, bandwidth=10.0, out=out, backend="nvrtc")
        elif kind == "grad":  # the shapes of tools/nvrtc_bench.py's gradient rows
            (m, n, o, k), p = (int(v) for v in fields[:4]), float(fields[4])
            a, b = torch.randn(k, m, device="cuda"), torch.randn(n, k, device="cuda")
            c, d = torch.randn(o, k, device="cuda"), torch.randn(n, m, device="cuda")
            kermac.cdist_grad(a, b, c, d, p=p, out=torch.empty(o, n, m, device="cuda"), backend="nvrtc")
        else:
            raise SystemExit(f"operation: expected cdist:M:D:p, kernel:NAME:M:D or grad:M:N:O:K:p, got {spec!r}")
    torch.cuda.synchronize()


def summarise(report: str) -> str:
    """The SUMMARY metrics (first occurrence each) and the stall samples of an ncu text report."""
    values: dict[str, str] = {}
    stalls: dict[str, dict[str, int]] = {"All": {}, "Not-issued": {}}
    for line in report.splitlines():
        stall = _STALL.search(line)
        if stall:
            stalls[stall.group(1)][stall.group(2)] = int(line.split()[-1].replace(",", ""))
            continue
        metric = _METRIC.match(line)
        if metric and metric.group(1) in SUMMARY and metric.group(1) not in values:
            values[metric.group(1)] = f"{metric.group(3)} {metric.group(2) or ''}".strip()
    lines = [f"{name:34s} {values[name]}" for name in SUMMARY if name in values]
    for which, samples in stalls.items():
        top = sorted(((v, k) for k, v in samples.items() if v), reverse=True)
        if top:
            lines.append(f"stall samples ({which.lower()}): " + ", ".join(f"{k} {v}" for v, k in top))
    return "\n".join(lines) if lines else "no kermac kernel launch was profiled (see the ncu report)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("operation", help="cdist:M:D:p | kernel:NAME:M:D | grad:M:N:O:K:p")
    ap.add_argument("--report", help="write the full ncu text report here")
    ap.add_argument("--tuning", action="append", default=[], metavar="FIELD=VALUE", help="a tuning field to change")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        run_operation(args.operation, args.tuning)
        return
    tuning_of(args.tuning)  # refused here, before ncu starts
    ncu = shutil.which("ncu") or shutil.which("ncu", path="/usr/local/cuda/bin")
    if ncu is None:
        raise SystemExit("ncu (Nsight Compute) not found on PATH or in /usr/local/cuda/bin")
    command = [ncu, "-k", "regex:kermac_", "--launch-skip", "1", "--launch-count", "1", "--print-details", "all"]
    for section in SECTIONS:
        command += ["--section", section]
    command += [sys.executable, os.path.abspath(__file__), "--child", args.operation]
    command += [f"--tuning={item}" for item in args.tuning]
    done = subprocess.run(command, capture_output=True, text=True)
    report = done.stdout + done.stderr
    if args.report:
        with open(args.report, "w") as f:
            f.write(report)
    if done.returncode != 0:
        raise SystemExit(f"ncu failed (exit {done.returncode}):\n{report[-4000:]}")
    print(args.operation)
    print(summarise(report))


if __name__ == "__main__":
    main()
