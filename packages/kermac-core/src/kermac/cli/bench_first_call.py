"""The "first call" section of `kermac bench` (`--first-call [N]`): what a new process pays before its kernels run.

For every backend and every variant of [`FIRST_CALL_VARIANTS`][kermac.benchmarking.FIRST_CALL_VARIANTS] (a `cdist`
p or a preset), fresh Python processes ([`kermac.first_call`][kermac.first_call]) time `import kermac`, loading
the backend (plugin discovery and its `availability()`), the variant's first call and its second: one **cold**
process on empty private JIT caches (its first call compiles, and on Triton autotunes), then N **warm** processes
(default 2) on the caches it filled, whose first call is what every later process pays.  Operands are 4096 × 64
on a GPU, 64 × 8 on the CPU.  A row per backend and variant: the cold first call, the median warm first call and
loading, the median `import kermac`, the second call.  A process that fails is a cell of the report (its first
line) and makes the exit code 1.  `tools/first_call_times.py` prints every process and adds processes after
`kermac precompile`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass, field

import torch

from kermac import benchmarking as bm
from kermac.cli._bench_common import Progress, describe, header, label, title
from kermac.cli._format import render_table
from kermac.first_call import FirstCallTimes, private_caches, time_first_call

__all__ = ["DEFAULT_WARM", "FirstCallRow", "run", "size_for"]

DEFAULT_WARM = 2
"""Warm processes per variant when `--first-call` names no number."""


def size_for(device: torch.device) -> tuple[int, int]:
    """Rows and features of both operands: 4096 × 64 on a GPU (the size the goals were set at), 64 × 8 on the CPU."""
    return (4096, 64) if device.type == "cuda" else (64, 8)


@dataclass
class FirstCallRow:
    """One variant on one backend: the cold process's times and the warm ones' (or why they failed)."""

    backend: str
    variant: str
    cold: FirstCallTimes | None = None
    warm: list[FirstCallTimes] = field(default_factory=list)
    why: str | None = None

    def warm_median(self, part: str) -> float | None:
        """The median of the warm processes' `part` (`import_s`, `load_s`, `first_s`, `second_s`), seconds."""
        return statistics.median(getattr(t, part) for t in self.warm) if self.warm else None


def run(args: argparse.Namespace, device: torch.device, backends: list[str]) -> int:
    """Run the section on `backends` (`args.first_call` warm processes per variant, 0 for `DEFAULT_WARM`); print
    the table (or JSON with `args.json`); return the exit code."""
    warm = args.first_call or DEFAULT_WARM
    size = size_for(device)
    variants = list(bm.FIRST_CALL_VARIANTS)
    progress = Progress(len(backends) * len(variants) * (1 + warm), sys.stderr)
    rows = []
    try:
        for backend in backends:
            for variant in variants:
                row = FirstCallRow(backend, variant)
                with private_caches() as caches:
                    try:
                        progress.step(f"{label(backend)} {variant}: cold process")
                        row.cold = time_first_call(backend, variant, size, str(device), caches)
                        for i in range(warm):
                            progress.step(f"{label(backend)} {variant}: warm process {i + 1}")
                            row.warm.append(time_first_call(backend, variant, size, str(device), caches))
                    except RuntimeError as exc:  # a cell of the report, not a crash of the section
                        row.why = describe(exc)
                rows.append(row)
    finally:
        progress.close()
    note = None if device.type == "cuda" else "no CUDA GPU: tiny CPU operands"
    head = {
        **{k: v for k, v in header(device, 0, 0, note).items() if k not in ("warmup", "repeat")},  # no repeats here
        "section": "first-call",
        "size": list(size),
        "warm_processes": warm,
    }
    if args.json:
        print(json.dumps({"header": head, "rows": [_row_json(r) for r in rows]}, indent=2))
    else:
        print(_report(head, rows))
    return 0 if all(r.why is None for r in rows) else 1


def _row_json(r: FirstCallRow) -> dict[str, object]:
    return {
        "backend": r.backend,
        "variant": r.variant,
        "cold_s": None if r.cold is None else vars(r.cold),
        "warm_s": [vars(t) for t in r.warm],
        "error": r.why,
    }


def _s(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds:.3f}"


def _report(head: dict[str, object], rows: list[FirstCallRow]) -> str:
    lines = title("kermac bench --first-call", head)
    m, d = head["size"]
    lines.append(
        f"seconds in fresh processes, operands {m} x {d}, after the device context: cold = empty private JIT caches; "
        f"warm = the median of {head['warm_processes']} later process(es) on the caches the cold one filled; "
        "load = plugin discovery and the backend's availability, paid once per process before its first call"
    )
    lines.append("")
    cells = [
        [
            label(r.backend),
            r.variant,
            _s(None if r.cold is None else r.cold.first_s),
            _s(r.warm_median("first_s")),
            _s(r.warm_median("load_s")),
            _s(r.warm_median("import_s")),
            "n/a" if not r.warm else f"{1e3 * r.warm_median('second_s'):.2f}",
        ]
        for r in rows
    ]
    headers = ["backend", "variant", "cold first", "warm first", "warm load", "import kermac", "second ms"]
    lines.append(render_table(headers, cells))
    lines += [f"n/a: {label(r.backend)} {r.variant}: {r.why}" for r in rows if r.why is not None]
    return "\n".join(lines)
