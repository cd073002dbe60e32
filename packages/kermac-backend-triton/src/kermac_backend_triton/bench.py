"""Benchmark the Triton backend on the rows of the project's peer table (``shared/PEERS.md``).

``python -m kermac_backend_triton.bench [--sweep] [--quick] [--log FILE]`` on a CUDA machine.
Every row is first checked against a float64 reference (relative Frobenius error on a block of
rows), then timed with CUDA events (``triton.testing.do_bench``, median after warm-up) beside
the NVRTC backend (when available) and torch.  ``--sweep`` also times every tile configuration
of the autotuning space separately.  A table is printed last.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

import kermac
from kermac import presets
from kermac.hyperparams import HyperValue
from kermac.problem import grad_problem, pairwise_problem
from kermac.programs import GradProgram
from kermac_backend_triton import configs, launch

__all__ = ["main"]


@dataclass(frozen=True)
class Row:
    """One benchmark row: ``op`` is 'cdist', a preset name, or 'grad'."""

    op: str
    sizes: tuple[int, ...]
    p: float
    torch_ok: bool  # torch's time is affordable to measure (else PEERS.md's number stands)

    @property
    def label(self) -> str:
        dims = "x".join(map(str, self.sizes))
        return f"{self.op} {dims} p={self.p:g}"


ROWS = [
    Row("cdist", (30000, 30000, 1024), 1.0, False),
    Row("cdist", (30000, 30000, 1024), 1.3, False),
    Row("cdist", (30000, 30000, 1024), 2.0, True),
    Row("cdist", (8192, 8192, 256), 1.0, True),
    Row("cdist", (8192, 8192, 256), 1.3, True),
    Row("cdist", (8192, 8192, 256), 2.0, True),
    Row("cdist", (16384, 16384, 32), 1.0, True),
    Row("cdist", (16384, 16384, 32), 2.0, True),
    Row("laplace_l1", (16384, 16384, 128), 1.0, True),
    Row("laplace_l2", (16384, 16384, 128), 2.0, True),
    Row("grad", (4096, 256, 16, 4096), 1.0, False),
    Row("grad", (4096, 256, 16, 4096), 2.0, True),
    Row("grad", (4096, 256, 16, 4096), 1.5, False),
    Row("grad", (8192, 768, 16, 8192), 1.0, False),
    Row("grad", (8192, 768, 16, 8192), 1.5, False),
]
QUICK = {3, 4, 5, 6, 8, 9, 10, 11, 12}


def _bench(fn: Callable[[], object]) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=200, return_mode="median"))


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    a = a.double()
    if torch.isnan(a).any():
        return math.nan
    return ((a - ref).norm() / ref.norm()).item()


def _grad_program(p: float) -> tuple[GradProgram, dict[str, HyperValue]]:
    from kermac import ir

    t = ir.Var("d") - ir.Var("b")
    if p == 1.0:
        return GradProgram(ir.sign(t), ir.Var("acc")), {}
    if p == 2.0:
        return GradProgram(t, ir.Var("acc")), {}
    general = ir.select(ir.ne(t, 0.0), ir.sign(t) * ir.pow(abs(t), ir.Hyper("p") - 1.0), 0.0)
    return GradProgram(general, ir.Var("acc")), {"p": HyperValue("p", p)}


def _pairwise_case(row: Row, dev: str):
    m, n, d = row.sizes
    x = torch.randn(m, d, device=dev)
    z = torch.randn(n, d, device=dev)
    out = torch.empty(m, n, device=dev)
    if row.op == "cdist":
        desc = {1.0: presets.l1_distance, 2.0: presets.l2_distance}.get(row.p, presets.lp_distance)
        hypers = {} if row.p in (1.0, 2.0) else {"p": HyperValue("p", row.p)}
    else:
        desc = presets.ALL[row.op]
        hypers = {"bandwidth": HyperValue("bandwidth", 1.5)}
    problem = pairwise_problem(desc.lower(), x, z, out=out, hypers=hypers)
    rows = slice(0, 96)
    ref = torch.cdist(x[rows].double(), z.double(), p=row.p)
    if row.op != "cdist":
        ref = torch.exp(-ref / 1.5)

    def torch_fn() -> object:
        r = torch.cdist(x, z, p=row.p)
        return r if row.op == "cdist" else torch.exp(-r / 1.5)

    def nvrtc_fn() -> object:
        if row.op == "cdist":
            return kermac.cdist(x, z, p=row.p, out=out, backend="nvrtc")
        return kermac.run_kernel(row.op, x, z, bandwidth=1.5, out=out, backend="nvrtc")

    return problem, (lambda: out[rows]), ref, torch_fn, nvrtc_fn


def _grad_case(row: Row, dev: str):
    m, n, o, k = row.sizes
    a = torch.randn(k, m, device=dev)
    b = torch.randn(n, k, device=dev)
    c = torch.randn(o, k, device=dev)
    d = torch.randn(n, m, device=dev)
    out = torch.empty(o, n, m, device=dev)
    prog, hypers = _grad_program(row.p)
    problem = grad_problem(prog, a, b, c, d, out=out, hypers=hypers)
    nn = 4
    t = d[:nn, :, None].double() - b[:nn, None, :].double()
    phi = torch.where(t != 0, torch.sign(t) * t.abs().pow(row.p - 1), torch.zeros_like(t))
    ref = torch.einsum("ok,km,nmk->onm", c.double(), a.double(), phi)

    def torch_fn() -> object:  # p = 2 only: Σ_k c[o,k]·a[k,m]·(d[n,m] − b[n,k]) as two matmuls
        return d[None] * (c @ a)[:, None, :] - (b[None] * c[:, None, :]) @ a

    def nvrtc_fn() -> object:
        return kermac.cdist_grad(a, b, c, d, p=row.p, out=out, backend="nvrtc")

    return problem, (lambda: out[:, :nn]), ref, torch_fn, nvrtc_fn


def _available(name: str) -> bool:
    return any(s.name == name and s.available for s in kermac.backends())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", action="store_true", help="time every tile configuration separately")
    ap.add_argument("--quick", action="store_true", help="only the rows that fit a short device run")
    ap.add_argument("--rows", default="", help="comma-separated row indices (overrides --quick)")
    ap.add_argument("--log", default="", help="append JSON lines of every measurement here")
    args = ap.parse_args(argv)
    dev = "cuda"
    torch.manual_seed(0)
    nvrtc = _available("nvrtc")
    everything = [i for i in range(len(ROWS)) if not args.quick or i in QUICK]
    picked = [int(i) for i in args.rows.split(",") if i] or everything
    table = []
    for i in picked:
        row = ROWS[i]
        grad = row.op == "grad"
        problem, got, ref, torch_fn, nvrtc_fn = (_grad_case if grad else _pairwise_case)(row, dev)
        run = launch.run_grad if grad else launch.run_pairwise
        rec: dict[str, object] = {"row": row.label}
        start = time.perf_counter()
        run(problem)
        torch.cuda.synchronize()
        rec["first_call_s"] = round(time.perf_counter() - start, 2)
        rec["err"] = _rel(got(), ref)
        rec["triton_ms"] = _bench(lambda run=run, problem=problem: run(problem))
        if args.sweep:
            if grad:
                space = configs.GRAD_SPACE
            elif (spec := launch.pairwise_spec(problem)[0]).tensor_cores:
                space = configs.pairwise_tc_space(problem.d)
            elif spec.gluon:
                space = configs.GLUON_PAIRWISE_SPACE
            else:
                space = configs.PAIRWISE_SPACE
            sweep = {}
            for j, entry in enumerate(space):
                forced = configs.launch_options(entry)
                try:
                    run(problem, forced)
                    sweep[j] = round(_bench(lambda f=forced, r=run, pr=problem: r(pr, f)), 3)
                except Exception as exc:  # report and go on: one bad configuration is a finding
                    sweep[j] = f"{type(exc).__name__}: {str(exc)[:80]}"
            rec["sweep"] = sweep
        if nvrtc:
            try:
                nvrtc_fn()
                rec["nvrtc_err"] = _rel(got(), ref)
                rec["nvrtc_ms"] = _bench(nvrtc_fn)
            except Exception as exc:
                rec["nvrtc_ms"] = f"{type(exc).__name__}: {str(exc)[:80]}"
        if row.torch_ok and (not grad or row.p == 2.0):
            rec["torch_ms"] = _bench(torch_fn)
        print(json.dumps(rec), flush=True)
        if args.log:
            with open(args.log, "a") as f:
                f.write(json.dumps(rec) + "\n")
        table.append(rec)
        torch.cuda.empty_cache()
    name = torch.cuda.get_device_name()
    print(f"\n{name}, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}")
    print(f"{'row':38} {'triton ms':>10} {'nvrtc ms':>10} {'torch ms':>10} {'err':>9}  sweep")
    for rec in table:

        def fmt(v: object) -> str:
            return f"{v:10.3f}" if isinstance(v, float) else f"{'-' if v is None else str(v)[:10]:>10}"

        sweep = rec.get("sweep", "")
        times = f"{fmt(rec['triton_ms'])} {fmt(rec.get('nvrtc_ms'))} {fmt(rec.get('torch_ms'))}"
        print(f"{rec['row']:38} {times} {rec['err']:9.1e}  {sweep}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
