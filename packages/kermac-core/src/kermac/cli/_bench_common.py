"""What the sections of `kermac bench` share: names in the tables, the report's header, progress
lines, the check of an answer against the float64 reference, and the common fields of the JSON report."""

from __future__ import annotations

import datetime
import math
import platform
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO

import torch

import kermac
from kermac import benchmarking as bm
from kermac import costs

__all__ = [
    "AUTO",
    "BASELINE",
    "REFERENCE_LABEL",
    "WRONG_NOTE",
    "Progress",
    "case_json",
    "check_answer",
    "cpu_why",
    "describe",
    "finite_or_none",
    "header",
    "idle_backends",
    "label",
    "report_json",
    "result_json",
    "title",
]

AUTO = "auto"
"""The backend name that lets the registry choose (timed beside the backends it chooses among)."""
BASELINE = "torch.cdist"
REFERENCE_LABEL = "reference"
"""What the table calls the reference backend (its name, `torch`, reads as PyTorch itself)."""
WRONG_NOTE = (
    "! = error above tolerance (1e-4; 1e-3 for gradients; 4x the output's rounding for half outputs): "
    "that result is WRONG"
)
"""The table's note on the `!` of a wrong answer (the tolerances of `kermac.benchmarking.tolerance`)."""


def label(name: str) -> str:
    """What the table calls an implementation: the reference backend is `reference`."""
    return REFERENCE_LABEL if name == bm.REFERENCE_BACKEND else name


def describe(exc: BaseException) -> str:
    """`Type: first line of the message`, for an n/a cell's reason."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def finite_or_none(x: float | None) -> float | None:
    """`x`, or None where it is not finite (JSON has no NaN)."""
    return x if x is None or math.isfinite(x) else None


def case_json(case: bm.BenchCase, reference_error: str | None) -> dict[str, object]:
    """The fields of a case every section's JSON row has (a section adds its own after them)."""
    return {
        "label": case.label,
        "op": case.op,
        "sizes": list(case.sizes),
        "p": case.p,
        "kernel": case.kernel,
        "tolerance": bm.tolerance(case),
        "reference_error": reference_error,
    }


def result_json(timing: dict[str, object], max_rel_err: float | None, ok: bool, error: str | None) -> dict[str, object]:
    """One backend's result in a JSON row: the section's `timing` fields, then the answer's check."""
    return {**timing, "max_rel_err": finite_or_none(max_rel_err), "ok": ok, "error": error}


def report_json(
    head: Mapping[str, object], backends: list[str], skipped: dict[str, str], rows_key: str, rows: list[dict]
) -> dict[str, object]:
    """A section's JSON report: the header, the backends timed and skipped, and its rows under `rows_key`."""
    return {
        **head,
        "backends": backends,
        "reference_backend": bm.REFERENCE_BACKEND,
        "baseline": BASELINE,
        "skipped": skipped,
        rows_key: rows,
    }


def check_answer(
    fn: Callable[..., torch.Tensor],
    args: Sequence[object],
    ref: torch.Tensor | None,
    *,
    out: torch.Tensor | None,
    part: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> float | None:
    """`fn(*args)` once more and its max-norm relative error against `ref` (None without a reference).

    With `out` (one of `args`, written by `fn`), `out` is filled with NaN first and is the answer.  With `part`,
    `ref` is the reference of `part(answer)` only (`kermac.benchmarking.checked_part`).
    """
    if out is not None:
        out.fill_(math.nan)  # a backend that leaves out unwritten must not pass the check
    answer = fn(*args)
    if out is not None:
        answer = out
    if part is not None:
        answer = part(answer)
    return None if ref is None else bm.max_rel_error(answer, ref)


def cpu_why() -> str:
    """Why a run is on the CPU, for the header's note."""
    return "no CUDA GPU visible" if not torch.cuda.is_available() else "--device cpu"


def idle_backends(
    names: Sequence[str], results: Sequence[Mapping[str, Any]], timed: Callable[[Any], bool], what: str
) -> dict[str, str]:
    """Each of `names` that no row of `results` (implementation → measurement with an `error`)
    timed, with the first reason met; `what` names a row ("case", "call") in the default reason."""
    idle = {}
    for name in names:
        found = [row[name] for row in results]
        if not any(timed(m) for m in found):
            idle[name] = next((m.error for m in found if m.error), f"no {what} was timed")
    return idle


def header(device: torch.device, warmup: int, repeat: int, note: str | None) -> dict[str, object]:
    """The fields every report starts with: date, versions, device, `note`, warm-up and repeats."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = platform.processor() or platform.machine() or "CPU"
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "kermac": kermac.__version__,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "device": str(device),
        "device_name": name,
        "device_class": costs.device_class(device),
        "note": note,
        "warmup": warmup,
        "repeat": repeat,
    }


def title(what: str, head: dict[str, object]) -> list[str]:
    """The first lines of a table report: `what`, date, versions, device and the note."""
    lines = [
        f"{what}  {head['date']}  kermac {head['kermac']}, torch {head['torch']}"
        + (f" (CUDA {head['torch_cuda']})" if head["torch_cuda"] else ""),
        f"device: {head['device']} ({head['device_name']})",
    ]
    if head["note"]:
        lines.append(f"note: {head['note']}")
    return lines


class Progress:
    """One status line on `stream`: rewritten in place with `\\r` on a terminal, else one line per step."""

    def __init__(self, total: int, stream: TextIO) -> None:
        self.total = total
        self.done = 0
        self.stream = stream
        self.tty = stream.isatty()
        self._width = 0

    def step(self, what: str) -> None:
        self.done += 1
        text = f"[{self.done}/{self.total}] {what}"
        if self.tty:
            self.stream.write("\r" + text.ljust(self._width))
            self._width = len(text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
