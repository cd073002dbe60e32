"""The "small calls" section of `kermac bench` (`--calls`): the host time of a call of each operation.

For each case of [`kermac.small_calls`][kermac.small_calls] and each way of getting the output
(`given`: `out=` preallocated; `new`: the call allocates it) it times every backend, `auto`, and
PyTorch's own way (new outputs only: it takes no `out`) with
[`per_call_us`][kermac.small_calls.per_call_us], checks each answer against the float64
reference backend, and prints one row per case and output: µs per call of each, and
`auto - fastest`, auto's time minus the fastest backend named in the row (what choosing the
backend costs).  Without `--backends`, a backend that is installed but cannot run here is a
column of n/a cells whose reason `-v` gives.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from kermac import benchmarking as bm
from kermac import small_calls
from kermac.cli._bench_common import (
    AUTO,
    BASELINE,
    REFERENCE_LABEL,
    WRONG_NOTE,
    Progress,
    case_json,
    check_answer,
    cpu_why,
    describe,
    header,
    idle_backends,
    label,
    report_json,
    result_json,
    title,
)
from kermac.cli._format import render_table

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from kermac.registry import BackendStatus

__all__ = ["AUTO", "OUTS", "CallMeasurement", "CallRow", "columns", "defaults", "run"]

OUTS = ("given", "new")
"""The rows of a case: `out=` preallocated, and an output each call allocates."""


@dataclass
class CallMeasurement:
    """One implementation on one row: µs per call of each run, the calls per run, its error, or why it could not run."""

    runs_us: list[float] = field(default_factory=list)
    calls: int = 0
    max_rel_err: float | None = None
    error: str | None = None

    @property
    def best_us(self) -> float | None:
        """The fastest run's µs per call (the other runs include interruptions of the host)."""
        return min(self.runs_us) if self.runs_us else None


@dataclass
class CallRow:
    """One case with one way of getting the output, and every implementation's measurement."""

    case: bm.BenchCase
    out: str
    results: dict[str, CallMeasurement]
    reference_error: str | None = None

    def ok(self, name: str) -> bool:
        err = self.results[name].max_rel_err
        return err is None or err <= bm.tolerance(self.case)

    def fastest(self, named: Sequence[str]) -> str | None:
        """The named backend of least time with a correct answer, or None."""
        timed = [(self.results[n].best_us, n) for n in named if self.results[n].best_us is not None and self.ok(n)]
        return min(timed)[1] if timed else None

    def auto_minus_fastest(self, named: Sequence[str]) -> float | None:
        """µs per call of `auto` minus that of the fastest named backend (None if either is missing)."""
        fastest = self.fastest(named)
        auto = self.results[AUTO].best_us
        if fastest is None or auto is None or not self.ok(AUTO):
            return None
        return auto - self.results[fastest].best_us


@dataclass(frozen=True)
class _Settings:
    device: torch.device
    calls: int
    repeat: int
    warmup: int
    max_seconds: float | None


def defaults(device: torch.device) -> tuple[int, int, int]:
    """`(calls, repeat, warmup)` when not given: 1000 calls per run and 100 warm-up calls on a GPU
    (where a call takes tens of µs), 200 and 10 on the CPU; the best of 5 runs on either."""
    return (1000, 5, 100) if device.type == "cuda" else (200, 5, 10)


def columns(
    backends: list[str], skipped: dict[str, str], statuses: dict[str, BackendStatus], *, named: bool
) -> tuple[list[str], dict[str, str]]:
    """The backends of the table's columns and the reasons of those left out.

    `backends` and `skipped` are what the other sections time and leave out.  Unless the backends
    were `named` with `--backends`, a backend that is installed (its plugin loaded) but unavailable
    here becomes a column too, of n/a cells: the section compares every backend's cost per call.
    """
    if named:
        return list(backends), dict(skipped)
    extra = [n for n, s in statuses.items() if n in skipped and not s.available and not s.broken]
    return [n for n in statuses if n in backends or n in extra], {n: w for n, w in skipped.items() if n not in extra}


def run(
    args: argparse.Namespace,
    device: torch.device,
    backends: list[str],
    skipped: dict[str, str],
    statuses: dict[str, BackendStatus],
) -> int:
    """Run the section with the options of `args`; print the table (or JSON); return the exit code."""
    named, skipped = columns(backends, skipped, statuses, named=bool(args.backends))
    calls, repeat, warmup = defaults(device)
    s = _Settings(
        device,
        args.calls or calls,
        args.repeat or repeat,
        warmup if args.warmup is None else args.warmup,
        args.max_seconds or None,
    )
    cases = small_calls.call_cases(device)
    per_case = 1 + sum(len(named) + 1 + (out == "new") for out in OUTS)
    progress = Progress(len(cases) * per_case, sys.stderr)
    try:
        rows = [row for case in cases for row in _run_case(case, named, statuses, s, progress)]
    finally:
        progress.close()
    head = {**header(device, s.warmup, s.repeat, _note(device)), "section": "calls", "calls_per_run": s.calls}
    if args.json:
        print(json.dumps(_to_json(head, named, skipped, rows), indent=2))
    else:
        print(_report(head, named, skipped, rows, verbose=args.verbose))
    code = 1 if any(not r.ok(n) for r in rows for n in r.results) else 0
    if args.backends:
        timed = [r.results for r in rows]
        for name, why in idle_backends(named, timed, lambda m: m.best_us is not None, "call").items():
            print(f"kermac bench: backend {name!r} ran none of the calls: {why}", file=sys.stderr)
            code = 1
    return code


def _note(device: torch.device) -> str | None:
    if device.type == "cuda":
        return None
    m, n, d = small_calls.CPU_CALL_SIZES
    return f"{cpu_why()}: {m}x{n}x{d} problems on the CPU; the GPU backends' host time needs a CUDA GPU"


def _run_case(
    case: bm.BenchCase, named: list[str], statuses: dict[str, BackendStatus], s: _Settings, progress: Progress
) -> list[CallRow]:
    """The rows of `case`: every backend, `auto` and PyTorch's way, with `out=` and without."""
    progress.step(f"{case.label}: inputs and float64 reference")
    inputs = case.make_inputs()
    try:
        ref, ref_error = bm.reference(case, inputs), None
    except Exception as exc:
        ref, ref_error = None, describe(exc)
    rows = []
    for out_kind in OUTS:
        out = case.make_out() if out_kind == "given" else None
        row = CallRow(case, out_kind, {}, ref_error)
        for name in [*named, AUTO]:
            progress.step(f"{case.label}, out {out_kind}: {label(name)}")
            if name != AUTO and not statuses[name].available:
                row.results[name] = CallMeasurement(error=f"backend unavailable: {statuses[name].reason}")
                continue
            row.results[name] = _measure(bm.kermac_fn(case, name), (*inputs, out), ref, s, out=out)
        if out_kind == "new":  # every call case has a PyTorch equivalent (`torch_fn`), which allocates
            progress.step(f"{case.label}, out new: {BASELINE}")
            row.results[BASELINE] = _measure(bm.torch_fn(case), inputs, ref, s, out=None)
        rows.append(row)
    return rows


def _measure(
    fn: Callable[..., torch.Tensor],
    args: Sequence[object],
    ref: torch.Tensor | None,
    s: _Settings,
    *,
    out: torch.Tensor | None,
) -> CallMeasurement:
    """Time `fn(*args)` per call, then check its answer (`out` poisoned first)."""
    try:
        runs, calls = small_calls.per_call_us(
            fn, args, device=s.device, calls=s.calls, repeat=s.repeat, warmup=s.warmup, max_seconds=s.max_seconds
        )
        err = check_answer(fn, args, ref, out=out)
    except Exception as exc:
        return CallMeasurement(error=describe(exc))
    return CallMeasurement(runs, calls, err)


# -- output -------------------------------------------------------------------------------------


def _fmt_us(row: CallRow, name: str) -> str:
    m = row.results.get(name)
    if m is None:
        return "-"
    if m.best_us is None:
        return "n/a"
    text = f"{m.best_us:.1f}" if m.best_us < 1000 else f"{m.best_us:.0f}"
    return text if row.ok(name) else text + " !"


def _report(head: dict, named: list[str], skipped: dict[str, str], rows: list[CallRow], *, verbose: bool) -> str:
    impls = [*named, AUTO, BASELINE]
    lines = title("kermac bench --calls", head)
    lines.append(
        f"host time per call in µs: the best of {head['repeat']} runs of up to {head['calls_per_run']} "
        f"back-to-back calls and one synchronisation, after {head['warmup']} warm-up call(s)"
    )
    lines.append("")
    table_head = ["call", "out", *(f"{label(n)} µs" for n in impls[:-1]), "auto - fastest µs", f"{BASELINE} µs"]
    table = []
    for r in rows:
        diff = r.auto_minus_fastest(named)
        cells = [_fmt_us(r, n) for n in impls]
        table.append([r.case.label, r.out, *cells[:-1], "-" if diff is None else f"{diff:+.1f}", cells[-1]])
    lines.append(render_table(table_head, table))
    lines.append("")
    lines.append(
        "out: given = out= preallocated, new = each call allocates its output; auto - fastest = auto's time "
        "minus the fastest backend's of the row"
    )
    lines.append(
        f"the {BASELINE} column is PyTorch's own way: torch.cdist, then exp for kernels and the Cauchy kernel's "
        "arithmetic for the program, two matmuls for the p=2 gradient (it takes no out=)"
    )
    if bm.REFERENCE_BACKEND in named:
        lines.append(f"{REFERENCE_LABEL} = kermac's pure-PyTorch reference backend (backend='{bm.REFERENCE_BACKEND}')")
    if any(not r.ok(n) for r in rows for n in r.results):
        lines.append(WRONG_NOTE)
    if skipped:
        lines.append("not timed: " + "; ".join(f"{label(n)} ({why})" for n, why in skipped.items()))
    cells = [(label(n), m.error, f"{r.case.label}, out {r.out}") for r in rows for n, m in r.results.items() if m.error]
    failed = {r.case.label: r.reference_error for r in rows if r.reference_error}
    if cells and verbose:
        lines.append("n/a cells:")
        lines += [f"  {name}: {why} ({where})" for (name, why), where in _group(cells, len(rows)).items()]
    elif cells:
        lines.append(f"{len(cells)} cell(s) n/a: run with -v for the reasons")
    lines += [f"float64 reference of {where} failed: {why}" for where, why in failed.items()]
    return "\n".join(lines)


def _group(cells: list[tuple[str, str, str]], n_rows: int) -> dict[tuple[str, str], str]:
    """The rows of each (implementation, reason) of `cells`, given as `(name, why, row)`: "every row"
    where the reason holds for all `n_rows` (an unavailable backend), else the rows' names."""
    rows: dict[tuple[str, str], list[str]] = {}
    for name, why, where in cells:
        rows.setdefault((name, why), []).append(where)
    return {key: "every row" if len(found) == n_rows else "; ".join(found) for key, found in rows.items()}


def _to_json(head: dict, named: list[str], skipped: dict[str, str], rows: list[CallRow]) -> dict[str, object]:
    calls = [
        {
            **case_json(r.case, r.reference_error),
            "out": r.out,
            "results": {
                name: result_json(
                    {"us_per_call": m.best_us, "runs_us": m.runs_us, "calls": m.calls},
                    m.max_rel_err,
                    r.ok(name),
                    m.error,
                )
                for name, m in r.results.items()
            },
            "fastest": r.fastest(named),
            "auto_minus_fastest_us": r.auto_minus_fastest(named),
        }
        for r in rows
    ]
    return report_json(head, named, skipped, "calls", calls)
