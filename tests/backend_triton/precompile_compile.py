"""Run `TritonBackend.precompile` in a clean process without a GPU (`test_precompile_triton.py`).

Run as ``python tests/backend_triton/precompile_compile.py`` with a JSON list of jobs on stdin; prints a JSON
object mapping each job's ``id`` to a JSON report (or ``"error: ..."``).  A separate process because compiling for a
GPU needs ``TRITON_INTERPRET`` unset before Triton is imported, and because Triton reads its cache directory from
the environment: one job per process.

A job: ``{"id", "cache": Triton's cache directory, "archs", "cases": [[op, p, m, n, d], ...]}`` with ``op``
``"cdist"`` (x ``[m, d]``, z ``[n, d]``) or ``"grad"`` (a ``[d, m]``, b ``[n, d]``, c ``[1, d]``, d ``[n, m]``),
problems on the ``meta`` device.  The report: ``{"lines": precompile's lines, "entries": the cache's entries
after it, "device_caches": how many of the compiled kernels still hold per-device caches}``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for cubin_jobs

from cubin_jobs import serve


def _problem(op: str, p: float, m: int, n: int, d: int):
    import torch

    from kermac.hyperparams import HyperValue
    from kermac.lowering import cdist_program, grad_program
    from kermac.problem import grad_problem, pairwise_problem

    def empty(*shape):
        return torch.empty(*shape, device="meta")

    program = cdist_program(p) if op == "cdist" else grad_program(p)
    hypers = {name: HyperValue(name, p) for name in program.hypers}
    if op == "cdist":
        return pairwise_problem(program, empty(m, d), empty(n, d), out=None, hypers=hypers)
    return grad_problem(program, empty(d, m), empty(n, d), empty(1, d), empty(n, m), out=None, hypers=hypers)


def run_job(job: dict) -> str:
    os.environ["TRITON_CACHE_DIR"] = job["cache"]  # before Triton first reads it
    from kermac_backend_triton import launch
    from kermac_backend_triton.backend import TritonBackend
    from kermac_backend_triton.precompile import _jit_function

    problems = [_problem(*case) for case in job["cases"]]
    lines = TritonBackend().precompile(problems, archs=job["archs"])
    held = sum(bool(_jit_function(kernel).device_caches) for kernel in launch._kernels.values())
    return json.dumps({"lines": lines, "entries": sorted(os.listdir(job["cache"])), "device_caches": held})


if __name__ == "__main__":
    serve(run_job)
