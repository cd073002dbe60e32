"""The "programs" section of `kermac bench` (`--programs`): presets rewritten as user lambdas, timed beside them.

A program written with [`kermac.program`][kermac.dsl.program] runs the kernel of the built-in preset that computes
the same thing when its normal form is the preset's ([`canonical_key`][kermac.dsl.canonical_key]).  For three
presets, `gaussian`, `laplace_l1` and `laplace_l2`, and their rewritings as Python lambdas
([`kermac.zoo`][kermac.zoo]'s `Gaussian`, `LaplaceL1` and `LaplaceL2`, whose inner term is written `(x - z) ** 2`
where the preset's is `(x - z)·(x - z)`), it times both on every backend with `out=` preallocated
([`time_ms`][kermac.benchmarking.time_ms]), checks both against the float64 reference backend, and prints one row
per preset and backend: the median ms of each, program / preset, their errors, and whether the two programs have
the same canonical key.  The cases are the `kernel` cases of [`kermac.benchmarking`][kermac.benchmarking]
(bandwidth √2·D^(1/p)) at `--programs M,N,D` (default 16384x16384x128 on a GPU, the peer table's kernel size;
256x256x32 on the CPU).  A wrong answer makes the exit code 1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass, field

import torch

from kermac import benchmarking as bm
from kermac import zoo
from kermac.cli._bench_common import (
    WRONG_NOTE,
    Progress,
    check_answer,
    cpu_why,
    describe,
    finite_or_none,
    header,
    label,
    title,
)
from kermac.cli._format import render_table
from kermac.dsl import Kernel, canonical_key

__all__ = ["IMPLEMENTATIONS", "ProgramRow", "cases", "default_sizes", "run"]

IMPLEMENTATIONS = ("preset", "program")
"""The two columns of a row: `run_kernel` with the preset, and the zoo's lambda program."""


def cases(sizes: tuple[int, int, int], device: torch.device) -> list[tuple[bm.BenchCase, Kernel]]:
    """The section's cases at `sizes` on `device`: each preset's benchmark case and its lambda rewriting."""
    return [
        (bm.BenchCase("kernel", sizes, 2.0, "gaussian", str(device)), zoo.Gaussian()),
        (bm.BenchCase("kernel", sizes, 1.0, "laplace", str(device)), zoo.LaplaceL1()),
        (bm.BenchCase("kernel", sizes, 2.0, "laplace", str(device)), zoo.LaplaceL2()),
    ]


def default_sizes(device: torch.device) -> tuple[int, int, int]:
    """`(M, N, D)` when `--programs` names none: the peer table's kernel size on a GPU, 256x256x32 on the CPU."""
    return (16384, 16384, 128) if device.type == "cuda" else (256, 256, 32)


@dataclass
class ProgramRow:
    """One preset on one backend: the times and errors of the preset and of its lambda program."""

    case: bm.BenchCase
    backend: str
    same_kernel: bool
    times_ms: dict[str, list[float]] = field(default_factory=dict)
    errors: dict[str, float | None] = field(default_factory=dict)
    why: dict[str, str] = field(default_factory=dict)

    def median(self, name: str) -> float | None:
        times = self.times_ms.get(name)
        return statistics.median(times) if times else None

    def ratio(self) -> float | None:
        preset, program = self.median("preset"), self.median("program")
        return None if preset is None or program is None else program / preset

    def ok(self) -> bool:
        return all(e is None or e <= bm.tolerance(self.case) for e in self.errors.values())


def run(
    args: argparse.Namespace, device: torch.device, backends: list[str], warmup: int, repeat: int, max_seconds: float
) -> int:
    """Run the section with the options of `args` on `backends`; print the table (or JSON); return the exit code."""
    sizes = tuple(args.programs) if args.programs else default_sizes(device)
    chosen = cases(sizes, device)
    progress = Progress(len(chosen) * (1 + 2 * len(backends)), sys.stderr)
    rows = []
    try:
        for case, kernel in chosen:
            progress.step(f"{case.label}: inputs and float64 reference")
            inputs = case.make_inputs()
            out = case.make_out()
            ref = bm.reference(case, inputs)
            same = canonical_key(kernel.program) == canonical_key(case.program)
            for backend in backends:
                row = ProgramRow(case, backend, same)
                fns = {
                    "preset": bm.kermac_fn(case, backend),
                    "program": lambda x, z, out, kernel=kernel, backend=backend, sigma=case.bandwidth: kernel(
                        x, z, out=out, bandwidth=sigma, backend=backend
                    ),
                }
                for name, fn in fns.items():
                    progress.step(f"{case.label}: {label(backend)} {name}")
                    try:
                        row.times_ms[name] = bm.time_ms(
                            fn, device=device, warmup=warmup, repeat=repeat, args=[(*inputs, out)],
                            max_seconds=max_seconds or None,
                        )  # fmt: skip
                        row.errors[name] = check_answer(fn, (*inputs, out), ref, out=out)
                    except Exception as exc:  # a cell of the report, not a crash of the section
                        row.why[name] = describe(exc)
                rows.append(row)
            del inputs, out, ref
    finally:
        progress.close()
    head = {
        **header(device, warmup, repeat, None if device.type == "cuda" else f"{cpu_why()}: small cases on the CPU"),
        "section": "programs",
        "sizes": list(sizes),
    }
    if args.json:
        print(json.dumps({"header": head, "rows": [_row_json(r) for r in rows]}, indent=2))
    else:
        print(_report(head, rows))
    return 0 if all(r.ok() for r in rows) else 1


def _row_json(r: ProgramRow) -> dict[str, object]:
    return {
        "label": r.case.label,
        "preset": r.case.program.key(),
        "backend": r.backend,
        "same_kernel": r.same_kernel,
        "median_ms": {n: r.median(n) for n in IMPLEMENTATIONS},
        "times_ms": r.times_ms,
        "ratio": r.ratio(),
        "max_rel_err": {n: finite_or_none(e) for n, e in r.errors.items()},
        "ok": r.ok(),
        "error": r.why,
    }


def _ms(ms: float | None) -> str:
    return "n/a" if ms is None else f"{ms:.3g}" if ms < 100 else f"{ms:.0f}"


def _err(r: ProgramRow, name: str) -> str:
    e = r.errors.get(name)
    if e is None:
        return "n/a" if name in r.why else "-"
    return f"{e:.1e}" + ("" if e <= bm.tolerance(r.case) else " !")


def _report(head: dict[str, object], rows: list[ProgramRow]) -> str:
    lines = title("kermac bench --programs", head)
    lines.append(
        f"presets beside the same kernels written as lambdas (kermac.zoo); median ms over up to {head['repeat']} "
        f"calls after {head['warmup']} warm-up call(s); err = max|y - ref| / max|ref| against the float64 reference"
    )
    lines.append("")
    cells = [
        [
            r.case.label,
            label(r.backend),
            _ms(r.median("preset")),
            _ms(r.median("program")),
            "-" if r.ratio() is None else f"{r.ratio():.2f}",
            "yes" if r.same_kernel else "no",
            _err(r, "preset"),
            _err(r, "program"),
        ]
        for r in rows
    ]
    headers = [
        "case",
        "backend",
        "preset ms",
        "program ms",
        "program/preset",
        "same kernel",
        "preset err",
        "program err",
    ]
    lines.append(render_table(headers, cells))
    lines.append("")
    lines.append("same kernel = the program's normal form is the preset's (kermac.dsl.canonical_key)")
    if not all(r.ok() for r in rows):
        lines.append(WRONG_NOTE)
    reasons = [(r.case.label, r.backend, n, why) for r in rows for n, why in r.why.items()]
    lines += [f"n/a: {where} / {label(b)} {n}: {why}" for where, b, n, why in reasons]
    return "\n".join(lines)
