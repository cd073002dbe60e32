"""GPU check + timing of the nvrtc backend on the benchmark cases, and A/B runs of its settings (GPU machine).

The rows are the peer table of :mod:`kermac.benchmarking` (the one table of benchmark cases) and a
few more cases that probe particular kernels.  For every row: a float64 check of a corner of the
output (:func:`kermac.benchmarking.corner`: a block of rows and columns, the full reduction), then
CUDA-event timings (:func:`kermac.benchmarking.time_ms`, warm-up first, median of repeats) of nvrtc
and, for p = 2, of PyTorch.  Prints a table last; writes the same table and the full log under
$OUT if set.

    python tools/nvrtc_bench.py [--rows substr,...] [--reps N]
    python tools/nvrtc_bench.py --rows "grad M=4096 N=256 O=16 K=4096 p=2;grad M=8192"   (; separates where given)
    python tools/nvrtc_bench.py --rows "p=1.3" --knob power_table_pairs=28,32,36 [--knob power_table=0,1]

``--knob NAME=V1,V2`` runs an A/B in one process instead: the selected base rows under every
combination of the listed settings, alternating ``--alternations`` times (compiled kernels are
forgotten between settings), each row labelled with its setting.  NAME is a field of
``kermac_backend_nvrtc.NvrtcTuning`` (``power_table_pairs``: the rows run on an NVRTC backend of
that tuning, registered as ``nvrtc`` for the run), an attribute of a module of the backend
(``tiles.DEEP_K_LOADS_AT``), or a field of a dataclass held there
(``tiles.TC_GRAD_CONFIG.k_group=1,2``, ``tiles.TC_CONFIG.min_blocks=1,2``); values take the
type of what they replace (0/1 for booleans).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import sys
import time

import torch

from kermac import benchmarking as bm
from kermac.benchmarking import BenchCase

#: Cases beyond the peer table: the Gaussian kernel, and exponents that are multiples of 1/2
#: (NVRTC's square-root powers) beside the general power's p = 1.6.
EXTRA_CASES = (
    BenchCase("kernel", (16384, 16384, 128), 2.0, "gaussian"),
    BenchCase("cdist", (8192, 8192, 256), 0.5),
    BenchCase("cdist", (8192, 8192, 256), 1.5),
    BenchCase("cdist", (8192, 8192, 256), 3.0),
    BenchCase("grad", (4096, 256, 16, 4096), 1.6),
    BenchCase("grad", (8192, 768, 16, 8192), 1.6),
)


def measure(case: BenchCase, reps: int, *, near: bool = False) -> dict:
    """Check and time ``case`` on the nvrtc backend (and PyTorch for p = 2) on the GPU.

    ``near``: z is x plus 1e-4 noise (near-duplicate rows: the tensor-core cancellation guard's
    recompute path), pairwise cases only.
    """
    case = case.on("cuda")
    inputs = case.make_inputs()
    if near:
        x = inputs[0]
        inputs = (x, x + 1e-4 * torch.randn_like(x))
    out = case.make_out()
    fn = bm.kermac_fn(case, "nvrtc")
    start = time.perf_counter()
    fn(*inputs, out)
    torch.cuda.synchronize()
    first = time.perf_counter() - start
    sub, sub_inputs, view = bm.corner(case, inputs, out)
    err = bm.max_rel_error(view, bm.reference(sub, sub_inputs))
    ms = statistics.median(bm.time_ms(lambda: fn(*inputs, out), device="cuda", warmup=1, repeat=reps, max_seconds=2.0))
    baseline = bm.torch_fn(case) if case.p == 2.0 else None
    torch_ms = None
    if baseline is not None:
        torch_ms = statistics.median(
            bm.time_ms(lambda: baseline(*inputs), device="cuda", warmup=1, repeat=reps, max_seconds=2.0)
        )
    return {"ms": ms, "torch_ms": torch_ms, "max_rel": err, "first_call_s": first}


def row_filters(rows: str) -> list[str]:
    """``--rows`` → the substrings a row name must contain one of: separated by ';' where the
    argument has one (gradient rows are named ``grad M,N,O,K p=..``), else by ','."""
    return [w for w in rows.split(";" if ";" in rows else ",") if w]


def _fmt(v: float | None) -> str:
    return "—" if v is None else f"{v:.3g}"


def _knob_target(name: str) -> tuple[object, str, str | None]:
    """``NAME`` (a tuning field), ``module.NAME`` or ``module.NAME.field`` → (what holds the setting:
    the default tuning or a backend module, attribute, dataclass field)."""
    import importlib

    from kermac_backend_nvrtc import DEFAULT_TUNING

    parts = name.split(".")
    if len(parts) == 1:
        if name not in {f.name for f in dataclasses.fields(DEFAULT_TUNING)}:
            raise SystemExit(
                "--knob: expected NAME (a field of kermac_backend_nvrtc.NvrtcTuning), module.NAME or "
                f"module.NAME.field (a dataclass field), got {name!r}"
            )
        return DEFAULT_TUNING, name, None
    module_name, rest = parts[0], parts[1:]
    try:
        module = importlib.import_module(f"kermac_backend_nvrtc.{module_name}")
    except ImportError:
        module = None
    attr, field = rest[0], (rest[1] if len(rest) == 2 else None)
    value = getattr(module, attr, None) if module is not None and len(rest) <= 2 else None
    if value is None or (field is not None and not (dataclasses.is_dataclass(value) and hasattr(value, field))):
        raise SystemExit(
            "--knob: expected NAME (a field of kermac_backend_nvrtc.NvrtcTuning), module.NAME or "
            f"module.NAME.field (a dataclass field), got {name!r}"
        )
    return module, attr, field


def _knob_settings(knobs: list[str]) -> list[tuple[str, dict]]:
    """``--knob NAME=V1,V2`` arguments → (label, {NAME: value}) for every combination."""
    import itertools

    axes = []
    for knob in knobs:
        name, sep, values = knob.partition("=")
        if not sep or not values:
            raise SystemExit(f"--knob: expected NAME=V1,V2, got {knob!r}")
        holder, attr, field = _knob_target(name)
        current = getattr(holder, attr) if field is None else getattr(getattr(holder, attr), field)
        kind = type(current)
        convert = (lambda v: bool(int(v))) if kind is bool else kind
        axes.append([(name, convert(v)) for v in values.split(",")])
    combos = [dict(c) for c in itertools.product(*axes)]
    return [(" ".join(f"{k}={v}" for k, v in c.items()), c) for c in combos]


def with_settings(settings: dict, fn):
    """``fn`` under backend settings ({NAME: value}, NAME as for ``--knob``): tuning fields on an NVRTC
    backend of that tuning, registered as ``nvrtc`` for the run; module attributes set for the run and
    restored afterwards.  The backend's loaded kernels and plans are forgotten before and after."""

    def run() -> dict:
        from kermac.registry import get_backend
        from kermac_backend_nvrtc import DEFAULT_TUNING, NvrtcBackend
        from kermac_backend_nvrtc.tuned import registered

        tuning = {name: value for name, value in settings.items() if "." not in name}
        saved = []
        try:
            for name, value in settings.items():
                if "." in name:
                    module, attr, field = _knob_target(name)
                    old = getattr(module, attr)
                    saved.append((module, attr, old))
                    setattr(module, attr, value if field is None else dataclasses.replace(old, **{field: value}))
            backend = NvrtcBackend(dataclasses.replace(DEFAULT_TUNING, **tuning))
            with registered(backend) if tuning else contextlib.nullcontext():
                get_backend("nvrtc").forget()
                return fn()
        finally:
            for module, attr, old in reversed(saved):
                setattr(module, attr, old)
            get_backend("nvrtc").forget()

    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--rows", default="", help="substrings of the rows to run, separated by , (or ; where names hold commas)"
    )
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument(
        "--split",
        default="",
        help="fractional-p ex2-polynomial variants to add, PAIRS:FTZ,... (the tuning's ex2_polynomial_pairs and "
        "flush_subnormals; power table off)",
    )
    ap.add_argument(
        "--knob",
        action="append",
        default=[],
        metavar="NAME=V1,V2",
        help="A/B of a setting: a tuning field NAME, module.NAME or module.NAME.field (repeatable)",
    )
    ap.add_argument("--alternations", type=int, default=2, help="rounds of the --knob A/B")
    args = ap.parse_args()
    want = row_filters(args.rows)
    print(torch.cuda.get_device_name(), "torch", torch.__version__, time.strftime("%Y-%m-%d %H:%M"), flush=True)
    plan = [(case.label, lambda case=case: measure(case, args.reps)) for case in (*bm.PEERS_CASES, *EXTRA_CASES)]
    by_label = {case.label: case for case in (*bm.PEERS_CASES, *EXTRA_CASES)}

    def row(label: str, **kwargs):
        case = by_label[label]
        return lambda: measure(case, args.reps, **kwargs)

    def with_split(pairs: int, ftz: bool, fn):
        return with_settings({"ex2_polynomial_pairs": pairs, "flush_subnormals": ftz, "power_table": False}, fn)

    base_rows = list(plan)

    for item in filter(None, args.split.split(",")):  # ex2 of `pairs` of 64 pairs on the FMA pipe
        pairs, ftz = (int(v) for v in item.split(":"))
        tag = f"poly={pairs} ftz={ftz}"
        for label in ("cdist 8192x8192x256 p=1.3", "cdist 30000x30000x1024 p=1.3"):
            plan.append((f"{label} {tag}", with_split(pairs, bool(ftz), row(label))))

    def simt(fn):  # the same row on the SIMT kernels (p = 2 family of cdist, float32 gradients)
        return with_settings({"tensor_cores": False}, fn)

    def one_block(fn):  # the tensor-core kernel at 1 block/SM (no register cap: ~200 registers, no spills)
        return with_settings({"tiles.TC_CONFIG.min_blocks": 1}, fn)

    tensor_core_rows = ("cdist 30000x30000x1024 p=2", "cdist 16384x16384x32 p=2", "laplace L2 16384x16384x128")
    plan += [(f"{label} tc-1block", one_block(row(label))) for label in tensor_core_rows]
    simt_rows = (
        *tensor_core_rows,
        "cdist 8192x8192x256 p=2",
        *(c.label for c in bm.PEERS_CASES if c.op == "grad"),
    )
    plan += [(f"{label} simt", simt(row(label))) for label in simt_rows]
    plan.append(("cdist 8192x8192x256 p=2 near-duplicates", row("cdist 8192x8192x256 p=2", near=True)))
    if args.knob:
        modes = _knob_settings(args.knob)
        plan = [
            (f"{name} [{label}] #{round_ + 1}", with_settings(settings, fn))
            for round_ in range(args.alternations)
            for name, fn in base_rows
            for label, settings in modes
        ]
    results = {}
    for name, fn in plan:
        if want and not any(w in name for w in want):
            continue
        try:
            results[name] = fn()
        except Exception as exc:  # keep measuring the other rows
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
        print(name, json.dumps(results[name]), flush=True)
        torch.cuda.empty_cache()
    lines = [
        "| row | nvrtc ms | torch ms | kermac 0.1.2 | mm-kermac 1.0.0 | target | max rel err |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        case = next((c for c in bm.PEERS_CASES if name.startswith(c.label)), None)
        peers = case.peers if case else {}
        target = case.target_ms if case else None
        if "error" in r:
            lines.append(f"| {name} | error: {r['error'][:60]} | | | | | |")
            continue
        cells = [f"{r['ms']:.3f}", _fmt(r["torch_ms"]), _fmt(peers.get("kermac 0.1.2"))]
        cells += [_fmt(peers.get("mm-kermac 1.0.0")), _fmt(target), f"{r['max_rel']:.1e}"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    print(table)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "nvrtc_bench.md"), "w") as fh:
            fh.write(table + "\n")
        with open(os.path.join(os.environ["OUT"], "nvrtc_bench.json"), "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    sys.exit(main())
