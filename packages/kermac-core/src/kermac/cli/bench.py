"""`kermac bench`: time kermac's backends against PyTorch and check every answer.

For each case of `kermac.benchmarking` it times every selected kermac backend (writing into
a preallocated `out`) and PyTorch's own way (`torch.cdist`; then `exp` for kernels; two
matrix products for the p = 2 gradient), checks each result against the float64 answer of the
reference backend, and prints one row per case: the median time of each implementation, the
speed-up of the fastest kermac backend over PyTorch, and each implementation's max-norm relative
error.  Where every backend `auto` can choose is timed (two or more; the reference aside) and
`KERMAC_BACKEND` is not set, `backend="auto"` is timed too, in a column of its own beside `auto / best` (its
time over the fastest backend's: what `auto`'s choice costs); `auto` is never the `best` of a row and never
enters a cost table.  An error above the tolerance is flagged with `!` and makes the exit code 1.

The table calls kermac's reference backend (`backend="torch"`) `reference`: it is the
correctness oracle, never the `best` of a row.  `--write-costs PATH` turns the run into a cost
table for `auto` ([`kermac.costs`][kermac.costs]).  `--calls` runs the small-calls section
instead: the host time per call of each operation (`kermac.cli.bench_calls`); `--fit` the fit section, the
time each solver takes to a residual (`kermac.cli.bench_fit`); `--programs` the programs section, presets beside
the same kernels written as lambdas (`kermac.cli.bench_programs`); `--first-call` the first-call section, what a
fresh process pays for its first call of each kernel variant, cold and warm (`kermac.cli.bench_first_call`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

import kermac
from kermac import benchmarking as bm
from kermac import costs, registry
from kermac.cli import bench_calls, bench_first_call, bench_fit, bench_programs
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

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="time the backends against torch.cdist and check their results",
        description=(
            "Time every available kermac backend and torch.cdist on a few cases, check each result against "
            "the float64 reference, and print a table. Without a CUDA GPU it runs small cases on the CPU."
        ),
    )
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda if a CUDA GPU is visible, else cpu)")
    p.add_argument("--backends", help="comma-separated kermac backends to time (default: every available one)")
    p.add_argument(
        "--repeat",
        type=_positive_int,
        help="timed calls per measurement (default 10 on GPU, 5 on CPU; 3 with --quick); "
        "with --calls, runs of N calls, of which the best is shown (default 5)",
    )
    p.add_argument(
        "--warmup",
        type=_nonnegative_int,
        help="untimed calls first, including JIT compilation (default 2 on GPU, 1 on CPU; with --calls 100 and 10)",
    )
    p.add_argument(
        "--max-seconds",
        type=_nonnegative_float,
        default=2.0,
        help="lower --repeat (to no fewer than 3), with --calls N (to no fewer than 10), so one measurement takes "
        "about this long (default 2; 0 disables)",
    )
    p.add_argument(
        "--no-rotate", action="store_true", help="reuse one input set even when it fits in the GPU's L2 cache"
    )
    sizes = p.add_mutually_exclusive_group()
    sizes.add_argument(
        "--full",
        action="store_true",
        help="needs a CUDA GPU: every case of the peer table, other systems' published timings (several minutes)",
    )
    sizes.add_argument("--quick", action="store_true", help="fewer, smaller cases and fewer repeats")
    sizes.add_argument(
        "--small",
        action="store_true",
        help="256x256x32 problems: on a GPU their time is mostly each call's host work (checks, planning, launch)",
    )
    sizes.add_argument(
        "--calls",
        nargs="?",
        const=0,  # a bare --calls: the device's default number (bench_calls.defaults); N itself is >= 1
        type=_positive_int,
        metavar="N",
        help="the small-calls section: host time per call of each operation at 300x200x40 (30x20x4 on the CPU), "
        "with out= and without, for every backend and auto; N back-to-back calls per run "
        "(default 1000 on GPU, 200 on CPU)",
    )
    sizes.add_argument(
        "--fit",
        nargs="?",
        const=[],  # a bare --fit: the device's default sizes (bench_fit.default_sizes)
        type=_sizes,
        metavar="N,N,...",
        help="the fit section: time to --fit-tol of each solver (cholesky, cg, cg + nystrom) on a Gaussian kernel "
        "ridge system of N points in 32 dimensions (default 20000,100000 on GPU, 300,1000 on CPU)",
    )
    sizes.add_argument(
        "--programs",
        nargs="?",
        const=(),  # a bare --programs: the device's default size (bench_programs.default_sizes)
        type=_mnd,
        metavar="M,N,D",
        help="the programs section: the gaussian, laplace_l1 and laplace_l2 presets beside the same kernels written "
        "as lambdas (kermac.zoo), on every backend (default 16384,16384,128 on GPU, 256,256,32 on CPU)",
    )
    sizes.add_argument(
        "--first-call",
        nargs="?",
        const=0,  # a bare --first-call: bench_first_call.DEFAULT_WARM warm processes; N itself is >= 1
        type=_positive_int,
        metavar="N",
        help="the first-call section: each kernel variant's first call in fresh processes, one on empty JIT caches "
        "(cold) and N on the caches it filled (warm; default 2), with import and backend loading apart",
    )
    p.add_argument(
        "--fit-lambda", type=_positive_float, default=1e-3, help="with --fit: the regularisation λ (default 1e-3)"
    )
    p.add_argument(
        "--fit-tol",
        type=_positive_float,
        default=1e-4,
        help="with --fit: the relative residual to reach (default 1e-4)",
    )
    p.add_argument(
        "--cases",
        metavar="TEXT;TEXT...",
        help="only the cases whose name contains one of these ';'-separated texts, e.g. 'cdist 30000;grad M=8192' "
        "(a long run in parts: tools/costs_from_bench.py merges the parts' --json reports into one cost table; "
        "--write-costs writes the part's own)",
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    p.add_argument("-v", "--verbose", action="store_true", help="explain every n/a cell")
    p.add_argument(
        "--write-costs",
        metavar="PATH",
        help="also write the timings as a cost table for backend='auto' (see kermac.costs), e.g. sm_90.json",
    )
    p.set_defaults(run=run)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def _sizes(text: str) -> list[int]:
    try:
        values = [int(t) for t in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers of points >= 1, got {text!r}")
    return values


def _mnd(text: str) -> tuple[int, int, int]:
    try:
        values = tuple(int(t) for t in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 3 or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected three comma-separated sizes M,N,D >= 1, got {text!r}")
    return values


def _nonnegative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
    return value


def _nonnegative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text}")
    return value


@dataclass
class Measurement:
    """One implementation on one case: its timings and error, or why it could not run."""

    times_ms: list[float] = field(default_factory=list)
    max_rel_err: float | None = None
    error: str | None = None

    @property
    def median_ms(self) -> float | None:
        return statistics.median(self.times_ms) if self.times_ms else None


@dataclass
class CaseResult:
    case: bm.BenchCase
    results: dict[str, Measurement]
    reference_error: str | None = None

    def best(self, backends: list[str]) -> str | None:
        """The fastest kermac backend whose answer passed the check; never the reference backend
        (the float64 oracle, timed only to show what it costs) and never `auto` (not in `backends`)."""
        timed = [
            (self.results[b].median_ms, b)
            for b in backends
            if b != bm.REFERENCE_BACKEND and self.results[b].median_ms is not None and self.ok(b)
        ]
        return min(timed)[1] if timed else None

    def ok(self, name: str) -> bool:
        err = self.results[name].max_rel_err
        return err is None or err <= bm.tolerance(self.case)

    def speedup(self, backends: list[str]) -> float | None:
        best = self.best(backends)
        base = self.results[BASELINE].median_ms
        if best is None or base is None:
            return None
        return base / self.results[best].median_ms

    def auto_over_best(self, backends: list[str]) -> float | None:
        """`auto`'s time over the fastest backend's (None where `auto` was not timed, failed or was wrong)."""
        best = self.best(backends)
        auto = self.results.get(AUTO)
        if best is None or auto is None or auto.median_ms is None or not self.ok(AUTO):
            return None
        return auto.median_ms / self.results[best].median_ms


def run(args: argparse.Namespace) -> int:
    device = _resolve_device(args.device)
    if isinstance(device, str):
        print(f"kermac bench: {device}", file=sys.stderr)
        return 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # broken plugins are reported below
        statuses = {s.name: s for s in kermac.backends()}
    if args.backends:
        # "reference" (the name the table prints) selects the reference backend, whose registry name is torch.
        names = [b.strip() for b in args.backends.split(",") if b.strip()]
        backends = [bm.REFERENCE_BACKEND if b == REFERENCE_LABEL else b for b in names]
        unknown = [b for b in backends if b not in statuses or statuses[b].broken]
        if unknown:
            known = ", ".join(n for n, s in statuses.items() if not s.broken) or "none"
            print(f"kermac bench: --backends: unknown backend(s) {', '.join(unknown)}; known: {known}", file=sys.stderr)
            return 2
        skipped = {
            n: "not in --backends" if s.available else s.reason or "unavailable"
            for n, s in statuses.items()
            if n not in backends
        }
    else:
        backends, skipped = default_backends(list(statuses.values()), device)

    refused = _refusal(args, device, backends, statuses)
    if refused:
        print(f"kermac bench: {refused}", file=sys.stderr)
        return 2
    if args.calls is not None:
        return bench_calls.run(args, device, backends, skipped, statuses)
    if args.fit is not None:
        return bench_fit.run(args, device)
    if args.first_call is not None:
        return bench_first_call.run(args, device, backends)
    gpu = device.type == "cuda"
    warmup = args.warmup if args.warmup is not None else 1 if args.quick or not gpu else 2
    repeat = args.repeat if args.repeat is not None else 3 if args.quick else 10 if gpu else 5
    if args.programs is not None:
        return bench_programs.run(args, device, backends, warmup, repeat, args.max_seconds)
    cases = bm.cases_for(device, full=args.full, quick=args.quick, small=args.small)
    if args.cases is not None:
        cases = _chosen(cases, args.cases)
        if isinstance(cases, str):
            print(f"kermac bench: --cases: {cases}", file=sys.stderr)
            return 2
    settings = _Settings(device, warmup, repeat, args.max_seconds or None, not args.no_rotate)
    timed = [*backends, *([AUTO] if times_auto(backends, statuses) else [])]

    progress = Progress(len(cases) * (len(timed) + 2), sys.stderr)
    try:
        results = [_run_case(case, timed, statuses, settings, progress) for case in cases]
    finally:
        progress.close()

    head = header(device, warmup, repeat, _note(device, args.small))
    if args.json:
        print(json.dumps(_to_json(head, backends, skipped, results), indent=2))
    else:
        print(_report(head, backends, skipped, results, verbose=args.verbose))
    code = 1 if any(not r.ok(name) for r in results for name in r.results) else 0
    if args.backends:
        timed = [r.results for r in results]
        for name, why in idle_backends(backends, timed, lambda m: m.median_ms is not None, "case").items():
            print(f"kermac bench: backend {name!r} ran none of the cases: {why}", file=sys.stderr)
            code = 1
    if args.write_costs:
        try:
            table = costs.table_from_bench([_to_json(head, backends, skipped, results)])
            table.write(args.write_costs)
        except (OSError, costs.CostTableError) as exc:
            print(f"kermac bench: --write-costs: {exc}", file=sys.stderr)
            return 1
        print(
            f"kermac bench: cost table written to {args.write_costs} ({len(table.costs)} problem classes; "
            f"auto reads it as {table.device_class}.json in {costs.DIRECTORY})",
            file=sys.stderr,
        )
    return code


def times_auto(backends: list[str], statuses: dict[str, BackendStatus]) -> bool:
    """Whether `auto` gets a column: it chooses among every available backend (opt-in ones and the reference
    aside), not only the timed ones, and follows `KERMAC_BACKEND`; so only where no override is set, every such
    backend is timed and there are two or more of them (with one, `auto` could only repeat it)."""
    choices = [name for name, s in statuses.items() if _selectable(s) and name != bm.REFERENCE_BACKEND]
    overridden = registry.requested_backend(AUTO) != AUTO
    return not overridden and len(choices) >= 2 and set(choices) <= set(backends)


def _refusal(
    args: argparse.Namespace, device: torch.device, backends: list[str], statuses: dict[str, BackendStatus]
) -> str | None:
    """Why the run cannot give what was asked (a named backend unavailable, --full off a GPU), or None."""
    if args.programs is not None and args.write_costs:
        return "--write-costs: a cost table is made from the timed cases, not from the programs section"
    if args.calls is not None and args.write_costs:
        return "--write-costs: a cost table is made from the timed cases, not from the host time of --calls"
    if args.first_call is not None and args.write_costs:
        return "--write-costs: a cost table is made from the timed cases, not from the first calls of --first-call"
    if args.fit is not None and (args.write_costs or args.backends):
        option = "--write-costs" if args.write_costs else "--backends"
        return f"{option}: --fit times the solvers as a user runs them (backend auto); it takes no {option}"
    sections = {"--programs": args.programs, "--calls": args.calls, "--fit": args.fit, "--first-call": args.first_call}
    section = next((name for name, value in sections.items() if value is not None), None)
    if args.cases is not None and section is not None:
        return f"--cases chooses among the timed cases, not the cases of {section}"
    if args.full and device.type != "cuda":
        why = "no CUDA GPU is visible" if not torch.cuda.is_available() else "--device cpu was given"
        return f"--full: the peer-table cases need a CUDA GPU ({why}); without --full it runs small cases on {device}"
    if args.backends:
        for name in backends:
            if not statuses[name].available:
                return f"backend {name!r} is unavailable here: {statuses[name].reason}"
    return None


def _chosen(cases: list[bm.BenchCase], texts: str) -> list[bm.BenchCase] | str:
    """The cases whose label contains one of the ';'-separated `texts`, or why there are none."""
    wanted = [t.strip() for t in texts.split(";") if t.strip()]
    chosen = [c for c in cases if any(t in c.label for t in wanted)]
    if chosen:
        return chosen
    return f"no case of this run's section matches {texts!r}; its cases are: " + "; ".join(c.label for c in cases)


def _selectable(status: BackendStatus) -> bool:
    """Available, loaded and not opt-in (priority ≥ 0): what a default run times and `auto` chooses among."""
    return status.available and not status.broken and status.priority >= 0


def default_backends(statuses: list[BackendStatus], device: torch.device) -> tuple[list[str], dict[str, str]]:
    """The backends to time when `--backends` is not given, and why each other one is not.

    Every available backend except opt-in ones (negative priority, e.g. Triton's CPU interpreter);
    but on a GPU, where another backend is available, the reference
    backend is only the oracle of the err column (it is slow there; `--backends` can add it).
    """
    backends = [s.name for s in statuses if _selectable(s)]
    skipped = {
        s.name: (s.reason or "unavailable")
        if not s.available or s.broken
        else "opt-in backend (negative priority): name it with --backends"
        for s in statuses
        if s.name not in backends
    }
    if device.type == "cuda" and bm.REFERENCE_BACKEND in backends and len(backends) > 1:
        backends.remove(bm.REFERENCE_BACKEND)
        why = f"it computes the float64 reference; time it with --backends {REFERENCE_LABEL},..."
        skipped[bm.REFERENCE_BACKEND] = why
    return backends, skipped


def _resolve_device(text: str | None) -> torch.device | str:
    """The device to run on, or an error message."""
    if text is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        return f"--device: expected cpu, cuda or cuda:N, got {text!r}"
    if device.type not in ("cpu", "cuda"):
        return f"--device: expected cpu, cuda or cuda:N, got {text!r}"
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return f"--device: {text} requested but no CUDA GPU is visible to torch {torch.__version__}"
        if device.index is not None and device.index >= torch.cuda.device_count():
            return f"--device: {text} requested but only {torch.cuda.device_count()} CUDA device(s) are visible"
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    return device


@dataclass(frozen=True)
class _Settings:
    device: torch.device
    warmup: int
    repeat: int
    max_seconds: float | None
    rotate: bool


def _run_case(
    case: bm.BenchCase, backends: list[str], statuses: dict[str, BackendStatus], s: _Settings, progress: Progress
) -> CaseResult:
    """Time every backend and the baseline on `case`, checking each answer against the reference."""
    result = CaseResult(case, {})
    progress.step(f"{case.label}: inputs and float64 reference")
    try:
        sets = bm.input_sets(case, rotate=s.rotate)
        out = case.make_out()
    except Exception as exc:  # e.g. out of memory: the whole row is n/a
        why = f"could not allocate the inputs: {describe(exc)}"
        result.results = {name: Measurement(error=why) for name in [*backends, BASELINE]}
        progress.done += len(backends) + 1
        return result
    part = None
    try:
        ref, part = bm.checked_part(case, sets[0])
    except Exception as exc:
        ref = None
        result.reference_error = describe(exc)
    for name in backends:
        progress.step(f"{case.label}: {label(name)}")
        status = statuses.get(name)  # none for auto
        if status is not None and not status.available:
            result.results[name] = Measurement(error=f"backend unavailable: {status.reason}")
            continue
        fn = bm.kermac_fn(case, name)
        result.results[name] = _measure(lambda *a, fn=fn, out=out: fn(*a, out), sets, (ref, part), s, out=out)
    progress.step(f"{case.label}: {BASELINE}")
    baseline = bm.torch_fn(case)
    if baseline is None:
        why = (
            "no half-precision kernel for p != 2"
            if case.dtype != "float32"
            else "no memory-bounded equivalent (p != 2)"
        )
        result.results[BASELINE] = Measurement(error=f"PyTorch has {why}")
    else:
        result.results[BASELINE] = _measure(baseline, sets, (ref, part), s, out=None)
    del sets, ref, out
    if s.device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def _measure(
    fn: Callable[..., torch.Tensor],
    sets: Sequence[tuple[torch.Tensor, ...]],
    checked: tuple[torch.Tensor | None, Callable[[torch.Tensor], torch.Tensor] | None],
    s: _Settings,
    *,
    out: torch.Tensor | None,
) -> Measurement:
    """Time `fn` over the input sets, then check its answer on the first set (`out` poisoned first) against the
    reference of the part `bm.checked_part` gave."""
    ref, part = checked
    try:
        times = bm.time_ms(fn, device=s.device, warmup=s.warmup, repeat=s.repeat, args=sets, max_seconds=s.max_seconds)
        err = check_answer(fn, sets[0], ref, out=out, part=part)
    except Exception as exc:
        return Measurement(error=describe(exc))
    return Measurement(times, err)


# -- output -------------------------------------------------------------------------------------


def _note(device: torch.device, small: bool) -> str | None:
    """The header's note on what the numbers of the cases say on `device`."""
    if device.type == "cuda":
        return "--small: kernels of a few microseconds; the times are mostly each call's host work" if small else None
    return f"{cpu_why()}: small cases on the CPU; the GPU backends and the peer-table sizes need a CUDA GPU"


def _fmt_ms(m: Measurement) -> str:
    ms = m.median_ms
    if ms is None:
        return "n/a"
    return f"{ms:.3g}" if ms < 100 else f"{ms:.0f}"


def _fmt_err(case: bm.BenchCase, m: Measurement) -> str:
    if m.max_rel_err is None:
        return "-" if m.error is None else "n/a"
    flag = "" if m.max_rel_err <= bm.tolerance(case) else " !"
    return f"{m.max_rel_err:.1e}{flag}" if not math.isnan(m.max_rel_err) else "nan !"


def _report(
    head: dict, backends: list[str], skipped: dict[str, str], results: list[CaseResult], *, verbose: bool
) -> str:
    auto = any(AUTO in r.results for r in results)
    impls = [*backends, *([AUTO] if auto else []), BASELINE]
    lines = title("kermac bench", head)
    lines.append(
        f"median ms over up to {head['repeat']} calls after {head['warmup']} warm-up call(s); "
        "err = max|y - ref| / max|ref| against the float64 reference backend"
    )
    if any(bm.checked_on_corner(r.case) for r in results):
        lines.append(
            f"cases past 2^{bm.CORNER_WORK.bit_length() - 1} multiply-adds are checked on a corner: 256 rows x "
            "256 columns of a distance, 8 x 256 of each gradient output, each with its whole reduction"
        )
    lines.append("")
    targets = any(r.case.target_ms is not None for r in results)
    floors = any(r.case.floor_ms is not None for r in results)
    headers = (
        ["case", *(f"{label(n)} ms" for n in impls), "speed-up", "best"]
        + (["auto / best"] if auto else [])
        + (["target ms"] if targets else [])
        + (["floor ms", "best / floor"] if floors else [])
        + [f"{label(n)} err" for n in impls]
    )
    rows = []
    for r in results:
        sp = r.speedup(backends)
        row = [
            r.case.label,
            *(_fmt_ms(r.results[n]) for n in impls),
            f"{sp:.3g}x" if sp else "-",
            r.best(backends) or "-",
        ]
        if auto:
            ratio = r.auto_over_best(backends)
            row.append(f"{ratio:.3f}" if ratio is not None else "-")
        if targets:
            row.append(f"{r.case.target_ms:g}" if r.case.target_ms is not None else "-")
        if floors:
            row += _floor_cells(r, backends)
        row += [_fmt_err(r.case, r.results[n]) for n in impls]
        rows.append(row)
    lines.append(render_table(headers, rows))
    lines.append("")
    lines.append(
        f"speed-up = {BASELINE} / best, the fastest correct kermac backend; the {BASELINE} column is "
        "torch.cdist, then exp for kernels, and two matmuls for the p=2 gradient"
    )
    if bm.REFERENCE_BACKEND in backends:
        lines.append(
            f"{REFERENCE_LABEL} = kermac's pure-PyTorch reference backend (backend='{bm.REFERENCE_BACKEND}'), "
            "whose float64 answers check the others; it is never 'best'"
        )
    if targets:
        lines.append("targets are the project's goals on an NVIDIA H100")
    if floors:
        lines.append(
            "floors are an NVIDIA H100's (bytes or instructions at its peak rate); best / floor is meaningful there"
        )
    if any(not r.ok(n) for r in results for n in r.results):
        lines.append(WRONG_NOTE)
    if skipped:
        lines.append("not timed: " + "; ".join(f"{label(n)} ({why})" for n, why in skipped.items()))
    reasons = [(r.case.label, label(n), m.error) for r in results for n, m in r.results.items() if m.error]
    reasons += [(r.case.label, "float64 reference", r.reference_error) for r in results if r.reference_error]
    if reasons and verbose:
        lines.append("n/a cells:")
        lines += [f"  {where} / {name}: {why}" for where, name, why in reasons]
    elif reasons:
        lines.append(f"{len(reasons)} cell(s) n/a: run with -v for the reasons")
    return "\n".join(lines)


def _floor_cells(r: CaseResult, backends: list[str]) -> list[str]:
    """The case's floor and the fastest correct kermac backend's time over it ('-' where either is missing)."""
    if r.case.floor_ms is None:
        return ["-", "-"]
    best = r.best(backends)
    ratio = f"{r.results[best].median_ms / r.case.floor_ms:.2f}x" if best else "-"
    return [f"{r.case.floor_ms:.3g}", ratio]


def _to_json(head: dict, backends: list[str], skipped: dict[str, str], results: list[CaseResult]) -> dict[str, object]:
    cases = [
        {
            **case_json(r.case, r.reference_error),
            "problem_class": dataclasses.asdict(r.case.problem_class),
            "checked": "corner" if bm.checked_on_corner(r.case) else "whole",
            "peers_ms": dict(r.case.peers),
            "floor_ms": r.case.floor_ms,
            "target_ms": r.case.target_ms,
            "results": {
                name: result_json(
                    {"median_ms": m.median_ms, "times_ms": m.times_ms}, m.max_rel_err, r.ok(name), m.error
                )
                for name, m in r.results.items()
            },
            "best": r.best(backends),
            "speedup": r.speedup(backends),
            "auto_over_best": r.auto_over_best(backends),
        }
        for r in results
    ]
    return report_json(head, backends, skipped, "cases", cases)
