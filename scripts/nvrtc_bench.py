"""GPU check + timing of the nvrtc backend on the PEERS.md rows (run on the GPU machine).

For every row: a float64 check of a slice of the output (rows/columns subset, full reduction),
then CUDA-event timings (warm-up first, median of repeats) of nvrtc and, where affordable,
torch.  Prints a table last; writes the same table and the full log under $OUT if set.

    python scripts/nvrtc_bench.py [--rows substr,...] [--reps N]
    python scripts/nvrtc_bench.py --rows "grad 4096,256,16,4096 p=2;grad 8192"   (; where names hold commas)
    python scripts/nvrtc_bench.py --rows "p=1.3" --knob power_table_pairs=28,32,36 [--knob power_table=0,1]

``--knob NAME=V1,V2`` runs an A/B in one process instead: the selected base rows under every
combination of the listed settings, alternating ``--alternations`` times (compiled kernels are
forgotten between settings), each row labelled with its setting.  NAME is a field of
``kermac_backend_nvrtc.NvrtcTuning`` (``power_table_pairs``: the rows run on an NVRTC backend of
that tuning, registered as ``nvrtc`` for the run), an attribute of a module of the backend
(``codegen.LONG_K_LOADS_AT``), or a field of a dataclass held there
(``tc_grad.TC_GRAD_CONFIG.k_group=1,2``, ``codegen.TC_CONFIG.min_blocks=1,2``); values take the
type of what they replace (0/1 for booleans).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import statistics
import sys
import time

import torch

import kermac
from kermac.benchmarking import time_ms

PEERS = {  # row -> (kermac, mm-kermac, target) from PEERS.md (ms)
    "cdist 30000x30000x1024 p=1": (73.5, 77.8, 64),
    "cdist 30000x30000x1024 p=1.3": (449, 453, 300),
    "cdist 30000x30000x1024 p=2": (74.5, 78.1, 25),
    "cdist 8192x8192x256 p=1": (1.80, 1.74, 1.5),
    "cdist 8192x8192x256 p=1.3": (9.19, 8.97, 6.5),
    "cdist 8192x8192x256 p=2": (1.77, 1.66, 1.0),
    "cdist 16384x16384x32 p=1": (1.12, 1.12, 0.8),
    "cdist 16384x16384x32 p=2": (1.13, 1.17, 0.8),
    "laplace_l1 16384x16384x128": (3.33, None, 2.6),
    "laplace_l2 16384x16384x128": (3.32, None, 1.5),
    "grad 4096,256,16,4096 p=1": (6.38, 6.31, 3.0),
    "grad 4096,256,16,4096 p=2": (6.12, 6.03, 3.0),
    "grad 4096,256,16,4096 p=1.5": (7.38, 7.42, 3.5),
    "grad 8192,768,16,8192 p=1": (74.2, 73.3, 30),
    "grad 8192,768,16,8192 p=1.5": (None, 84.4, 35),
}


def timeit(fn, reps: int, budget_s: float = 2.0) -> float:
    """Median ms of ``fn`` over up to ``reps`` calls (fewer where they would take over ``budget_s``),
    each bracketed by CUDA events without a host synchronisation in between (as ``kermac bench``
    times), so a call's host work overlaps the previous call's kernel instead of being counted."""
    times = time_ms(fn, device="cuda", warmup=1, repeat=reps, max_seconds=budget_s)
    return statistics.median(times)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    if torch.isnan(a).any():
        return math.nan
    return ((a - b).norm() / b.norm()).item()


def cdist_row(m: int, d: int, p: float, reps: int, with_torch: bool, near: bool = False) -> dict:
    x = torch.randn(m, d, device="cuda")
    z = x + 1e-4 * torch.randn(m, d, device="cuda") if near else torch.randn(m, d, device="cuda")
    out = torch.empty(m, m, device="cuda")
    t0 = time.perf_counter()
    kermac.cdist(x, z, p=p, out=out, backend="nvrtc")
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    s = 256
    ref = torch.cdist(x[:s].double(), z[-s:].double(), p=p)
    err = rel(out[:s, -s:], ref)
    max_rel = ((out[:s, -s:].double() - ref).abs() / ref).max().item()
    ms = timeit(lambda: kermac.cdist(x, z, p=p, out=out, backend="nvrtc"), reps)
    tms = timeit(lambda: torch.cdist(x, z, p=p), reps) if with_torch else None
    return {"ms": ms, "torch_ms": tms, "err": err, "max_rel": max_rel, "first_call_s": first}


def kernel_row(name: str, m: int, d: int, reps: int) -> dict:
    x = torch.randn(m, d, device="cuda")
    z = torch.randn(m, d, device="cuda")
    out = torch.empty(m, m, device="cuda")
    desc = kermac.presets.ALL[name]
    bw = 10.0
    kermac.run_kernel(desc, x, z, bandwidth=bw, out=out, backend="nvrtc")
    s = 256
    p = 1.0 if name == "laplace_l1" else 2.0
    torch_fn = (
        (lambda: torch.exp(-(torch.cdist(x, z) ** 2) / (2 * bw**2)))
        if name == "gaussian"
        else (lambda: torch.exp(-torch.cdist(x, z, p=p) / bw))
    )
    dist = torch.cdist(x[:s].double(), z[-s:].double(), p=p)
    ref = torch.exp(-(dist**2) / (2 * bw**2)) if name == "gaussian" else torch.exp(-dist / bw)
    err = rel(out[:s, -s:], ref)
    ms = timeit(lambda: kermac.run_kernel(desc, x, z, bandwidth=bw, out=out, backend="nvrtc"), reps)
    tms = timeit(torch_fn, reps) if p == 2.0 else None
    return {"ms": ms, "torch_ms": tms, "err": err}


def grad_row(m: int, n: int, o: int, k: int, p: float, reps: int) -> dict:
    a = torch.randn(k, m, device="cuda")
    b = torch.randn(n, k, device="cuda")
    c = torch.randn(o, k, device="cuda")
    d = torch.randn(n, m, device="cuda")
    out = torch.empty(o, n, m, device="cuda")
    kermac.cdist_grad(a, b, c, d, p=p, out=out, backend="nvrtc")
    ns, ms_ = 8, 128
    t = d[:ns, :ms_, None].double() - b[:ns, None, :].double()
    phi = torch.where(t != 0, torch.sign(t) * t.abs().pow(p - 1), torch.zeros_like(t))
    ref = torch.einsum("ok,km,nmk->onm", c.double(), a[:, :ms_].double(), phi)
    err = rel(out[:, :ns, :ms_], ref)
    ms = timeit(lambda: kermac.cdist_grad(a, b, c, d, p=p, out=out, backend="nvrtc"), reps)
    tms = None
    if p == 2.0:
        tms = timeit(lambda: torch.einsum("ok,km,nm->onm", c, a, d) - torch.einsum("ok,km,nk->onm", c, a, b), reps)
    return {"ms": ms, "torch_ms": tms, "err": err}


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
    plan = [
        ("cdist 16384x16384x32 p=1", lambda: cdist_row(16384, 32, 1.0, args.reps, False)),
        ("cdist 16384x16384x32 p=2", lambda: cdist_row(16384, 32, 2.0, args.reps, True)),
        ("cdist 8192x8192x256 p=1", lambda: cdist_row(8192, 256, 1.0, args.reps, True)),
        ("cdist 8192x8192x256 p=1.3", lambda: cdist_row(8192, 256, 1.3, args.reps, False)),
        ("cdist 8192x8192x256 p=2", lambda: cdist_row(8192, 256, 2.0, args.reps, True)),
        ("laplace_l1 16384x16384x128", lambda: kernel_row("laplace_l1", 16384, 128, args.reps)),
        ("laplace_l2 16384x16384x128", lambda: kernel_row("laplace_l2", 16384, 128, args.reps)),
        ("grad 4096,256,16,4096 p=1", lambda: grad_row(4096, 256, 16, 4096, 1.0, args.reps)),
        ("grad 4096,256,16,4096 p=2", lambda: grad_row(4096, 256, 16, 4096, 2.0, args.reps)),
        ("grad 4096,256,16,4096 p=1.5", lambda: grad_row(4096, 256, 16, 4096, 1.5, args.reps)),
        ("grad 8192,768,16,8192 p=1", lambda: grad_row(8192, 768, 16, 8192, 1.0, 5)),
        ("grad 8192,768,16,8192 p=1.5", lambda: grad_row(8192, 768, 16, 8192, 1.5, 5)),
        ("cdist 30000x30000x1024 p=1", lambda: cdist_row(30000, 1024, 1.0, 5, False)),
        ("cdist 30000x30000x1024 p=2", lambda: cdist_row(30000, 1024, 2.0, 5, True)),
        ("cdist 30000x30000x1024 p=1.3", lambda: cdist_row(30000, 1024, 1.3, 3, False)),
        # Exponents that are multiples of 1/2 (the tuning's half_powers) beside the general power's p = 1.6.
        ("cdist 8192x8192x256 p=0.5", lambda: cdist_row(8192, 256, 0.5, args.reps, False)),
        ("cdist 8192x8192x256 p=1.5", lambda: cdist_row(8192, 256, 1.5, args.reps, False)),
        ("cdist 8192x8192x256 p=3", lambda: cdist_row(8192, 256, 3.0, args.reps, False)),
        ("grad 4096,256,16,4096 p=1.6", lambda: grad_row(4096, 256, 16, 4096, 1.6, args.reps)),
        ("grad 8192,768,16,8192 p=1.6", lambda: grad_row(8192, 768, 16, 8192, 1.6, 5)),
    ]

    def with_split(pairs: int, ftz: bool, fn):
        return with_settings({"ex2_polynomial_pairs": pairs, "flush_subnormals": ftz, "power_table": False}, fn)

    base_rows = list(plan)

    for item in filter(None, args.split.split(",")):  # ex2 of `pairs` of 64 pairs on the FMA pipe
        pairs, ftz = (int(v) for v in item.split(":"))
        tag = f"poly={pairs} ftz={ftz}"
        plan.append(
            (
                f"cdist 8192x8192x256 p=1.3 {tag}",
                with_split(pairs, bool(ftz), lambda: cdist_row(8192, 256, 1.3, args.reps, False)),
            )
        )
        plan.append(
            (
                f"cdist 30000x30000x1024 p=1.3 {tag}",
                with_split(pairs, bool(ftz), lambda: cdist_row(30000, 1024, 1.3, 3, False)),
            )
        )

    def simt(fn):  # the same row on the SIMT kernels (p = 2 family of cdist, float32 gradients)
        return with_settings({"tensor_cores": False}, fn)

    def one_block(fn):  # the tensor-core kernel at 1 block/SM (no register cap: ~200 registers, no spills)
        return with_settings({"codegen.TC_CONFIG.min_blocks": 1}, fn)

    plan += [
        ("cdist 30000x30000x1024 p=2 tc-1block", one_block(lambda: cdist_row(30000, 1024, 2.0, 5, False))),
        ("cdist 16384x16384x32 p=2 tc-1block", one_block(lambda: cdist_row(16384, 32, 2.0, args.reps, False))),
        ("laplace_l2 16384x16384x128 tc-1block", one_block(lambda: kernel_row("laplace_l2", 16384, 128, args.reps))),
        ("cdist 16384x16384x32 p=2 simt", simt(lambda: cdist_row(16384, 32, 2.0, args.reps, False))),
        ("cdist 8192x8192x256 p=2 simt", simt(lambda: cdist_row(8192, 256, 2.0, args.reps, False))),
        ("laplace_l2 16384x16384x128 simt", simt(lambda: kernel_row("laplace_l2", 16384, 128, args.reps))),
        ("gaussian 16384x16384x128", lambda: kernel_row("gaussian", 16384, 128, args.reps)),
        ("cdist 30000x30000x1024 p=2 simt", simt(lambda: cdist_row(30000, 1024, 2.0, 5, False))),
        ("cdist 8192x8192x256 p=2 near-duplicates", lambda: cdist_row(8192, 256, 2.0, args.reps, False, near=True)),
        ("grad 4096,256,16,4096 p=1 simt", simt(lambda: grad_row(4096, 256, 16, 4096, 1.0, args.reps))),
        ("grad 4096,256,16,4096 p=2 simt", simt(lambda: grad_row(4096, 256, 16, 4096, 2.0, args.reps))),
        ("grad 4096,256,16,4096 p=1.5 simt", simt(lambda: grad_row(4096, 256, 16, 4096, 1.5, args.reps))),
        ("grad 8192,768,16,8192 p=1 simt", simt(lambda: grad_row(8192, 768, 16, 8192, 1.0, 5))),
        ("grad 8192,768,16,8192 p=1.5 simt", simt(lambda: grad_row(8192, 768, 16, 8192, 1.5, 5))),
    ]
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
        "| row | nvrtc ms | torch ms | kermac | mm-kermac | target | rel err | max rel |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        km, mm, tgt = PEERS.get(name, (None, None, None))
        if "error" in r:
            lines.append(f"| {name} | error: {r['error'][:60]} | | | | | | |")
            continue
        cells = [f"{r['ms']:.3f}", _fmt(r["torch_ms"]), _fmt(km), _fmt(mm), _fmt(tgt), f"{r['err']:.1e}"]
        cells.append(f"{r['max_rel']:.1e}" if "max_rel" in r else "—")
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
