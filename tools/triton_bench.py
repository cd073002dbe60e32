"""Benchmark the Triton backend on the peer table of :mod:`kermac.benchmarking`, optionally every tile configuration.

``python tools/triton_bench.py [--sweep] [--quick] [--rows 2,9] [--log FILE]`` on a CUDA machine.
Every row (an index into :data:`kermac.benchmarking.PEERS_CASES`; ``--quick``: the default GPU
cases of ``kermac bench``) is first checked against a float64 reference on a corner of the output
(:func:`kermac.benchmarking.corner`), then timed with CUDA events (``triton.testing.do_bench``,
median after warm-up) beside the NVRTC backend (when available) and, for p = 2, PyTorch.
``--sweep`` also times every tile configuration of the autotuning space separately.  A table is
printed last.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable

import torch

import kermac
from kermac import benchmarking as bm
from kermac.benchmarking import BenchCase
from kermac.hyperparams import HyperValue
from kermac.problem import GradProblem, PairwiseProblem, grad_problem, pairwise_problem
from kermac_backend_triton import configs, launch

__all__ = ["main"]


def _bench(fn: Callable[[], object]) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=200, return_mode="median"))


def problem(case: BenchCase, inputs: tuple[torch.Tensor, ...], out: torch.Tensor) -> PairwiseProblem | GradProblem:
    """The normalised problem that :func:`kermac.benchmarking.kermac_fn` hands a backend for ``case``."""
    program = case.program
    values = {"p": case.p, "bandwidth": case.bandwidth if case.op == "kernel" else None}
    hypers = {name: HyperValue(name, values[name]) for name in program.hypers}
    if case.op == "grad":
        return grad_problem(program, *inputs, out=out, hypers=hypers)
    return pairwise_problem(program, *inputs, out=out, hypers=hypers)


def _space(pr: PairwiseProblem | GradProblem) -> list:
    if isinstance(pr, GradProblem):
        return configs.GRAD_SPACE
    spec = launch.pairwise_spec(pr)[0]
    if spec.kernel == "tensor_cores":
        return configs.pairwise_tc_space(pr.d)
    return configs.GLUON_PAIRWISE_SPACE if spec.kernel == "gluon" else configs.PAIRWISE_SPACE


def _available(name: str) -> bool:
    return any(s.name == name and s.available for s in kermac.backends())


def _row(case: BenchCase, sweep: bool, nvrtc: bool) -> dict[str, object]:
    case = case.on("cuda")
    inputs = case.make_inputs()
    out = case.make_out()
    pr = problem(case, inputs, out)
    run = launch.run_grad if case.op == "grad" else launch.run_pairwise
    sub, sub_inputs, view = bm.corner(case, inputs, out)
    ref = bm.reference(sub, sub_inputs)
    rec: dict[str, object] = {"row": case.label}
    start = time.perf_counter()
    run(pr)
    torch.cuda.synchronize()
    rec["first_call_s"] = round(time.perf_counter() - start, 2)
    rec["err"] = bm.max_rel_error(view, ref)
    rec["triton_ms"] = _bench(lambda: run(pr))
    if sweep:
        timings = {}
        for j, entry in enumerate(_space(pr)):
            forced = configs.launch_options(entry)
            try:
                run(pr, forced)
                timings[j] = round(_bench(lambda f=forced: run(pr, f)), 3)
            except Exception as exc:  # report and go on: one bad configuration is a finding
                timings[j] = f"{type(exc).__name__}: {str(exc)[:80]}"
        rec["sweep"] = timings
    if nvrtc:
        fn = bm.kermac_fn(case, "nvrtc")
        try:
            fn(*inputs, out)
            rec["nvrtc_err"] = bm.max_rel_error(view, ref)
            rec["nvrtc_ms"] = _bench(lambda: fn(*inputs, out))
        except Exception as exc:
            rec["nvrtc_ms"] = f"{type(exc).__name__}: {str(exc)[:80]}"
    baseline = bm.torch_fn(case) if case.p == 2.0 else None
    if baseline is not None:
        rec["torch_ms"] = _bench(lambda: baseline(*inputs))
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", action="store_true", help="time every tile configuration separately")
    ap.add_argument("--quick", action="store_true", help="only the default GPU cases of kermac bench")
    ap.add_argument("--rows", default="", help="comma-separated indices into the peer table (overrides --quick)")
    ap.add_argument("--log", default="", help="append JSON lines of every measurement here")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    nvrtc = _available("nvrtc")
    cases = bm.PEERS_CASES
    picked = [int(i) for i in args.rows.split(",") if i] or [
        i for i, c in enumerate(cases) if not args.quick or c in bm.GPU_CASES
    ]
    table = []
    for i in picked:
        rec = _row(cases[i], args.sweep, nvrtc)
        print(json.dumps(rec), flush=True)
        if args.log:
            with open(args.log, "a") as f:
                f.write(json.dumps(rec) + "\n")
        table.append(rec)
        torch.cuda.empty_cache()
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}")
    print(f"{'row':38} {'triton ms':>10} {'nvrtc ms':>10} {'torch ms':>10} {'err':>9}  sweep")
    for rec in table:

        def fmt(v: object) -> str:
            return f"{v:10.3f}" if isinstance(v, float) else f"{'-' if v is None else str(v)[:10]:>10}"

        times = f"{fmt(rec['triton_ms'])} {fmt(rec.get('nvrtc_ms'))} {fmt(rec.get('torch_ms'))}"
        print(f"{rec['row']:38} {times} {rec['err']:9.1e}  {rec.get('sweep', '')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
