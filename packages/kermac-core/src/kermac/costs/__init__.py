"""Measured costs of the backends: what `backend="auto"` ranks by.

A **cost table** is a JSON file per device class (`sm_90.json` for every GPU of compute
capability 9.0, `cpu.json` for the CPU) holding, per **problem class**, the milliseconds each
backend took on the benchmark cases of that class.  Among the backends that are available and
accept a problem, [`kermac.registry.select_backend`][kermac.registry.select_backend] runs the one of lowest cost; a
backend the table does not list for that class ranks after those it lists, by its
[`preference`][kermac.backend.Backend.preference]; with no table for the device, or no entry for the
class, the order is the preference order alone.

Within a class the table can also keep the benchmark **cases** it was made from, each with its
features D (a pairwise problem's D; a gradient's N, the rows of `b` and `d`), its work (multiply-adds:
batch·M·N·D, or batch·M·N·O·K) and its milliseconds per backend.  Where it does, a problem is ranked by the
cases of its class around it: at a measured D by that case, between two measured D by their times
interpolated geometrically in log D, beyond the measured range by the nearest case; of several cases at one
D, the one nearest in work.  So a few-feature problem is ranked by the few-feature cases of its class, not by
a mean over D = 16 and D = 1024 (a gradient with 3 features and many centres runs 2–7× faster on one backend,
with 768 features on the other).  Format 2 kept no features for gradients: its gradient cases are placed by
their work alone.  The class's `ms` — the
geometric mean over its cases — ranks where a class has no cases.

A problem class ([`ProblemClass`][kermac.costs.ProblemClass]) is

* `op`: `"pairwise"` (cdist, kernels, every pairwise program) or `"grad"`;
* `family`: the inner term, which sets a kernel's cost far more than its epilogue: `"l1"`
  (Σ|x − z|), `"l2"` (Σ(x − z)², the tensor-core family: l2, Gaussian, Laplace-L2, Matérn,
  Cauchy), `"lp"` (Σ|x − z|ᵖ for any other p), `"l0"` (count of differences), `"linf"`
  (max |x − z|), `"other"`; for gradients the multiply of p = 1, p = 2 or any other p
  (`"l1"`, `"l2"`, `"lp"`), else `"other"`;
* `dtype`: the inputs' dtype (`"float32"`, ...);
* `size`: `"narrow"` (pairwise with D < [`NARROW_FEATURES`][kermac.costs.NARROW_FEATURES]), `"small"` (work below
  [`SMALL_WORK`][kermac.costs.SMALL_WORK]: batch·M·N·D, or batch·M·N·O·K for gradients, where a call's time is mostly
  host work) or `"large"`.

File format (`format` 3; format 2 is the same with `"features": null` in gradient cases, format 1 without
`cases`; both still read, and a table read from format 2 is written as format 2):

```text
{"format": 3, "device_class": "sm_90", "device": "NVIDIA H100 80GB HBM3",
 "source": "how the numbers were made",
 "costs": [{"op": "pairwise", "family": "l2", "dtype": "float32", "size": "large",
            "ms": {"nvrtc": 0.53, "triton": 0.56},
            "cases": [{"features": 256, "work": 17179869184, "ms": {"nvrtc": 0.53, "triton": 0.54}}, ...]},
           {"op": "grad", "family": "l1", "dtype": "float32", "size": "large",
            "ms": {"nvrtc": 10.2, "triton": 12.1},
            "cases": [{"features": 3, "work": 2457600000, "ms": {"triton": 5.88, "nvrtc": 8.11}}, ...]},
           ...]}
```

Fused kernel products (`kermac.problem.ProductProblem`) and their gradients
(`kermac.problem.ProductGradProblem`) form no class: no table has measured them, so `auto` ranks the
backends that accept one by their preference alone.

[`table_from_bench`][kermac.costs.table_from_bench] makes a table from `kermac bench --json` reports (`kermac bench
--write-costs PATH` does it in one step; `tools/costs_from_bench.py` from saved reports).
"""

from __future__ import annotations

import datetime
import functools
import json
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from kermac.problem import SUPPORTED_DTYPES, GradProblem, ProductGradProblem, ProductProblem

if TYPE_CHECKING:
    from kermac.problem import PairwiseProblem
    from kermac.programs import GradProgram, PairwiseProgram

__all__ = [
    "DIRECTORY",
    "FORMAT",
    "NARROW_FEATURES",
    "SMALL_WORK",
    "CostTable",
    "CostTableError",
    "CostTables",
    "MeasuredCase",
    "ProblemClass",
    "classify",
    "device_class",
    "problem_class",
    "problem_shape",
    "shape_of",
    "table_from_bench",
]

FORMAT = 3
"""The version of the file format this module writes; it reads this one, format 2 (gradient cases without
features) and format 1 (no `cases`)."""
READS = (1, 2, 3)
DIRECTORY = Path(__file__).resolve().parent
"""Where the shipped tables live (package data of kermac core)."""
NARROW_FEATURES = 16
"""Pairwise problems with fewer features than this form their own size class: tensor-core kernels
need a few k-steps of 8 to pay off, so a measurement at D = 256 says little about D = 8.
"""
SMALL_WORK = 2**27
"""Work (multiply-adds) below which a problem is "small": about where a GPU kernel's time stops
being the host's per-call work (checks, planning, the launch).
"""

OPS = ("pairwise", "grad")
FAMILIES = {"pairwise": ("l1", "l2", "lp", "l0", "linf", "other"), "grad": ("l1", "l2", "lp", "other")}
SIZES = {"pairwise": ("narrow", "small", "large"), "grad": ("small", "large")}
DTYPES = tuple(str(d).removeprefix("torch.") for d in SUPPORTED_DTYPES)


class CostTableError(ValueError):
    """A cost table that cannot be used: the message names the file and what is wrong."""


@dataclass(frozen=True)
class ProblemClass:
    """The class of problems one cost-table entry covers (see the module documentation)."""

    op: str
    family: str
    dtype: str
    size: str

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"op: expected one of {', '.join(OPS)}, got {self.op!r}")
        for name, allowed in (("family", FAMILIES[self.op]), ("dtype", DTYPES), ("size", SIZES[self.op])):
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"{name}: expected one of {', '.join(allowed)} for op {self.op!r}, got {value!r}")


@dataclass(frozen=True)
class MeasuredCase:
    """One benchmark case of a class: its features D (a gradient's N; None for a gradient of a format 2 table), its
    work in multiply-adds, and the milliseconds of each backend that ran it with a correct answer."""

    features: int | None
    work: int
    ms: Mapping[str, float]

    @property
    def position(self) -> int:
        """Where the case sits on its class's axis: D, or the work for a gradient case without features."""
        return self.work if self.features is None else self.features


# -- classifying problems -----------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def _family(program: PairwiseProgram | GradProgram) -> str:
    from kermac.ir import Const
    from kermac.lowering import grad_program
    from kermac.programs import PairwiseProgram, difference_power

    if not isinstance(program, PairwiseProgram):
        kinds = {grad_program(1.0): "l1", grad_program(2.0): "l2", grad_program(None): "lp"}
        return kinds.get(program, "other")
    power = difference_power(program.inner)
    if power is None:
        return "other"
    if program.reduction == "max":
        return "linf" if power == Const(1.0) else "other"
    if program.reduction != "sum":
        return "other"
    return {Const(0.0): "l0", Const(1.0): "l1", Const(2.0): "l2"}.get(power, "lp")


def _size(op: str, work: int, features: int) -> str:
    """The size class of a problem of `op` (`"pairwise"` or `"grad"`, which has no narrow class), `work`
    multiply-adds and `features`."""
    if op == "pairwise" and features < NARROW_FEATURES:
        return "narrow"
    return "small" if work < SMALL_WORK else "large"


def classify(
    program: PairwiseProgram | GradProgram, dtype: torch.dtype, sizes: Sequence[int], batch: int = 1
) -> ProblemClass:
    """The class of a problem: `sizes` is (M, N, D) for a pairwise program, (M, N, O, K) for a gradient."""
    features, work = shape_of(sizes, batch)
    return _problem_class(program, dtype, _size(_op(program), work, features))


def shape_of(sizes: Sequence[int], batch: int = 1) -> tuple[int, int]:
    """The features (D of (M, N, D); N of a gradient's (M, N, O, K)) and the work in multiply-adds of a problem of
    `sizes` and `batch` entries, as [`MeasuredCase`][kermac.costs.MeasuredCase] records them."""
    return (sizes[2] if len(sizes) == 3 else sizes[1]), batch * math.prod(sizes)


def _op(program: PairwiseProgram | GradProgram) -> str:
    from kermac.programs import PairwiseProgram

    return "pairwise" if isinstance(program, PairwiseProgram) else "grad"


@functools.lru_cache(maxsize=1024)
def _problem_class(program: PairwiseProgram | GradProgram, dtype: torch.dtype, size: str) -> ProblemClass:
    return ProblemClass(_op(program), _family(program), str(dtype).removeprefix("torch."), size)


def problem_class(problem: PairwiseProblem | GradProblem) -> ProblemClass:
    """[`classify`][kermac.costs.classify] of a normalised problem (`auto` asks this on every call: kept cheap)."""
    return _class_of(problem, *problem_shape(problem))


def _class_of(problem: PairwiseProblem | GradProblem, features: int, work: int) -> ProblemClass:
    grad = isinstance(problem, GradProblem)
    dtype = problem.a.dtype if grad else problem.x.dtype
    return _problem_class(problem.program, dtype, _size("grad" if grad else "pairwise", work, features))


def problem_shape(problem: PairwiseProblem | GradProblem) -> tuple[int, int]:
    """[`shape_of`][kermac.costs.shape_of] a normalised problem."""
    batch = math.prod(problem.batch_shape)
    if isinstance(problem, GradProblem):
        return shape_of(problem.sizes, batch)
    return shape_of((problem.x.shape[-2], problem.z.shape[-2], problem.x.shape[-1]), batch)


@functools.lru_cache(maxsize=64)
def device_class(device: torch.device) -> str | None:
    """`"sm_90"` for a CUDA device of compute capability 9.0, `"cpu"`; `None` for other devices."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"sm_{major}{minor}"
    return "cpu" if device.type == "cpu" else None


# -- tables -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CostTable:
    """The measured costs on one device class: `costs[problem class][backend name]` in ms, and the cases each
    class was measured on (`cases[problem class]`; empty where a table does not keep them)."""

    device_class: str
    device: str
    source: str
    costs: Mapping[ProblemClass, Mapping[str, float]]
    cases: Mapping[ProblemClass, Sequence[MeasuredCase]] = field(default_factory=dict)

    def ms(self, cls: ProblemClass, features: int, work: int) -> Mapping[str, float]:
        """Milliseconds per backend for a problem of class `cls`, `features` and `work`, from the class's cases
        around it where it has cases (see the module documentation), else the class's (empty where the class
        was not measured).  Between two cases, only the backends both list."""
        cases = self.cases.get(cls)
        if not cases:
            return self.costs.get(cls, {})
        at = max(1, work if cases[0].features is None else features)  # format 2's gradient cases: by work
        below = _nearest([c for c in cases if c.position <= at], at, work)
        above = _nearest([c for c in cases if c.position >= at], at, work)
        if below is None or above is None or below.position == above.position:  # beyond the cases, or at one
            return (below or above).ms
        w = math.log(at / below.position) / math.log(above.position / below.position)
        ms = {b: t ** (1 - w) * above.ms[b] ** w for b, t in below.ms.items() if b in above.ms}
        return dict(sorted(ms.items(), key=lambda kv: kv[1]))

    def to_json(self) -> dict[str, object]:
        """The file content (see the module documentation)."""
        entries = []
        for c, ms in self.costs.items():
            entry = {"op": c.op, "family": c.family, "dtype": c.dtype, "size": c.size, "ms": dict(ms)}
            if self.cases.get(c):
                entry["cases"] = [
                    {"features": case.features, "work": case.work, "ms": dict(case.ms)} for case in self.cases[c]
                ]
            entries.append(entry)
        without_features = any(c.features is None for cases in self.cases.values() for c in cases)
        return {
            "format": 2 if without_features else FORMAT,  # format 2's gradient cases have no features
            "device_class": self.device_class,
            "device": self.device,
            "source": self.source,
            "costs": entries,
        }

    def write(self, path: str | Path) -> None:
        """Write the table as JSON to `path`."""
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n", encoding="utf-8")

    @classmethod
    def from_json(cls, data: object, origin: str) -> CostTable:
        """Validate parsed JSON; [`CostTableError`][kermac.costs.CostTableError] naming `origin` and the fault
        otherwise."""

        def fail(what: str) -> CostTableError:
            return CostTableError(f"cost table {origin}: {what}")

        if not isinstance(data, dict):
            raise fail(f"expected a JSON object, got {type(data).__name__}")
        if data.get("format") not in READS:
            raise fail(f"format: expected one of {', '.join(map(str, READS))}, got {data.get('format')!r}")
        for key in ("device_class", "device", "source"):
            if not isinstance(data.get(key), str):
                raise fail(f"{key}: expected a string, got {data.get(key)!r}")
        entries = data.get("costs")
        if not isinstance(entries, list):
            raise fail(f"costs: expected a list of entries, got {type(entries).__name__}")
        costs: dict[ProblemClass, dict[str, float]] = {}
        cases: dict[ProblemClass, tuple[MeasuredCase, ...]] = {}
        for i, entry in enumerate(entries):
            where = f"costs[{i}]"
            if not isinstance(entry, dict):
                raise fail(f"{where}: expected an object, got {type(entry).__name__}")
            try:
                key = ProblemClass(*(entry.get(k) for k in ("op", "family", "dtype", "size")))
            except (ValueError, KeyError) as exc:
                raise fail(f"{where}.{exc}") from None
            if key in costs:
                raise fail(f"{where}: a second entry for {key}")
            costs[key] = _milliseconds(entry.get("ms"), f"{where}.ms", fail)
            measured = entry.get("cases", [])
            if data["format"] == 1 and "cases" in entry:
                raise fail(f"{where}.cases: a format 1 table has no cases (they came with format 2)")
            if not isinstance(measured, list):
                raise fail(f"{where}.cases: expected a list of cases, got {type(measured).__name__}")
            with_features = key.op == "pairwise" or data["format"] >= 3
            cases[key] = tuple(
                _case(case, f"{where}.cases[{j}]", with_features, fail) for j, case in enumerate(measured)
            )
        return cls(data["device_class"], data["device"], data["source"], costs, cases)

    @classmethod
    def load(cls, path: str | Path) -> CostTable:
        """Read and validate the table in `path`."""
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CostTableError(f"cost table {path}: cannot be read: {exc}") from exc
        return cls.from_json(data, str(path))


def _milliseconds(ms: object, where: str, fail: Callable[[str], CostTableError]) -> dict[str, float]:
    """A validated `ms` object: backend name to positive finite milliseconds."""
    if not isinstance(ms, dict) or not ms:
        raise fail(f"{where}: expected a non-empty object of backend name to milliseconds, got {ms!r}")
    for name, value in ms.items():
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not (number and math.isfinite(value) and value > 0):
            raise fail(f"{where}[{name!r}]: expected a positive finite number (ms), got {value!r}")
    return {name: float(value) for name, value in ms.items()}


def _case(case: object, where: str, with_features: bool, fail: Callable[[str], CostTableError]) -> MeasuredCase:
    """A validated entry of a class's `cases`, with its features (`with_features`: pairwise classes, and gradient
    classes from format 3 on) or null ones (gradient classes of format 2)."""
    if not isinstance(case, dict):
        raise fail(f"{where}: expected an object, got {type(case).__name__}")
    features, work = case.get("features"), case.get("work")
    if with_features and not (_positive_int(features)):
        raise fail(
            f"{where}.features: expected a positive integer (D of a pairwise class, N of a gradient), got {features!r}"
        )
    if not with_features and features is not None:
        raise fail(f"{where}.features: expected null for a gradient class of a format 2 table, got {features!r}")
    if not _positive_int(work):
        raise fail(f"{where}.work: expected a positive integer (multiply-adds), got {work!r}")
    return MeasuredCase(features, work, _milliseconds(case.get("ms"), f"{where}.ms", fail))


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _nearest(cases: Sequence[MeasuredCase], at: int, work: int) -> MeasuredCase | None:
    """Of `cases`, the one nearest to position `at` (in octaves), then to `work`; None for no cases."""
    if not cases:
        return None
    return min(cases, key=lambda c: (abs(math.log2(at / c.position)), abs(math.log2(max(work, 1) / c.work))))


class CostTables:
    """The tables of one directory (`<device class>.json`), each read on first use."""

    def __init__(self, directory: str | Path = DIRECTORY) -> None:
        self.directory = Path(directory)
        self._tables: dict[str, CostTable | None] = {}
        self._lock = threading.Lock()

    def table(self, device_cls: str) -> CostTable | None:
        """The table of `device_cls`, `None` if there is none; [`CostTableError`][kermac.costs.CostTableError] if it
        is malformed."""
        try:
            return self._tables[device_cls]
        except KeyError:
            pass
        path = self.directory / f"{device_cls}.json"
        table = CostTable.load(path) if path.is_file() else None
        if table is not None and table.device_class != device_cls:
            raise CostTableError(f"cost table {path}: device_class {table.device_class!r} does not match the file name")
        with self._lock:
            self._tables[device_cls] = table
        return table

    def costs(
        self, problem: PairwiseProblem | GradProblem | ProductProblem | ProductGradProblem
    ) -> Mapping[str, float]:
        """Milliseconds per backend for `problem` on its device ([`CostTable.ms`][kermac.costs.CostTable.ms]);
        empty where nothing was measured (always for a fused product or its gradient, which have no class)."""
        if isinstance(problem, (ProductProblem, ProductGradProblem)):
            return {}
        cls = device_class(problem.device)
        table = None if cls is None else self.table(cls)
        if table is None:
            return {}
        features, work = problem_shape(problem)
        return table.ms(_class_of(problem, features, work), features, work)


# -- tables from benchmark runs ------------------------------------------------------------------


def table_from_bench(reports: Sequence[Mapping[str, object]]) -> CostTable:
    """A table from `kermac bench --json` reports of one device class.

    Per problem class, a backend's cost is the geometric mean of its median times over the class's
    cases; a backend enters a class only if it ran each of its cases with an answer within the
    tolerance (a failed or wrong run says nothing about its speed).  Each case is kept too
    ([`MeasuredCase`][kermac.costs.MeasuredCase], with the backends that ran it correctly; a case
    timed in several reports by the geometric mean of those that ran it in each).  The baseline
    (`torch.cdist`) is not a kermac backend and is left out.
    """
    if not reports:
        raise CostTableError("cost table from kermac bench: expected at least one report, got none")
    classes = {r.get("device_class") for r in reports}
    if len(classes) != 1 or None in classes:
        raise CostTableError(f"cost table from kermac bench: expected reports of one device class, got {classes}")
    times: dict[ProblemClass, dict[str, list[float | None]]] = {}
    shapes: dict[ProblemClass, dict[tuple[int | None, int], dict[str, list[float | None]]]] = {}
    for report in reports:
        for case in report["cases"]:
            key = ProblemClass(**case["problem_class"])
            shape = shape_of([int(s) for s in case["sizes"]])
            per_backend = times.setdefault(key, {})
            per_case = shapes.setdefault(key, {}).setdefault(shape, {})
            for name in report["backends"]:
                r = case["results"].get(name, {})
                ok = r.get("ok") and r.get("median_ms") and not r.get("error")
                per_backend.setdefault(name, []).append(r["median_ms"] if ok else None)
                per_case.setdefault(name, []).append(r["median_ms"] if ok else None)
    costs = {key: ms for key, per_backend in times.items() if (ms := _geometric_means(per_backend))}
    cases = {
        key: tuple(
            MeasuredCase(features, work, ms)
            for (features, work), per_backend in sorted(shapes[key].items(), key=lambda kv: (kv[0][0] or 0, kv[0][1]))
            if (ms := _geometric_means(per_backend))
        )
        for key in costs
    }
    first = reports[0]
    stamp = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    dates = sorted({str(r.get("date")) for r in reports})
    source = (
        f"kermac bench --json ({len(reports)} report(s) of {', '.join(dates)}; kermac {first.get('kermac')}, "
        f"torch {first.get('torch')}); converted {stamp}"
    )
    return CostTable(str(first["device_class"]), str(first.get("device_name")), source, costs, cases)


def _geometric_means(per_backend: Mapping[str, list[float | None]]) -> dict[str, float]:
    """Per backend that has a time for every measurement (as many as the most-measured backend), the geometric
    mean of its times, cheapest first."""
    most = max(map(len, per_backend.values()), default=0)
    ms = {
        name: math.prod(values) ** (1 / len(values))
        for name, values in per_backend.items()
        if len(values) == most and None not in values
    }
    return dict(sorted(ms.items(), key=lambda kv: kv[1]))
