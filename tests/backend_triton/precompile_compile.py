"""Run `TritonBackend.precompile` in a clean process without a GPU (`test_precompile_triton.py`).

Run as ``python tests/backend_triton/precompile_compile.py`` with a JSON list of jobs on stdin; prints a JSON
object mapping each job's ``id`` to a JSON report (or ``"error: ..."``).  A separate process because compiling for a
GPU needs ``TRITON_INTERPRET`` unset before Triton is imported, and because Triton reads its cache directory from
the environment: one job per process.

A job: ``{"id", "cache": Triton's cache directory, "archs", "cases": [[op, p, m, n, d], ...]}`` with ``op``
``"cdist"`` (x ``[m, d]``, z ``[n, d]``) or ``"grad"`` (a ``[d, m]``, b ``[n, d]``, c ``[1, d]``, d ``[n, m]``),
problems on the ``meta`` device.  The report: ``{"lines": precompile's lines, "entries": the cache's entries
after it, "device_caches": how many of the compiled kernels still hold per-device caches}``.

A job ``{"id", "cache", "keys": true}`` compiles nothing: Triton's compilation step is replaced by one that records the
disk-cache key ``triton.compile`` would look up, and the common problems (`kermac.variants.common_problems`, float32
and float16) go once through ``precompile`` for sm_90 and once through the backend's launch path (``kernel[grid]``,
the autotuner timing every configuration) under a driver that names sm_90 and times nothing.  The report:
``{"precompile": [keys], "launch": [keys]}``, each sorted.
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
    if job.get("keys"):
        return json.dumps(cache_keys())
    from kermac_backend_triton import launch
    from kermac_backend_triton.backend import TritonBackend

    problems = [_problem(*case) for case in job["cases"]]
    lines = TritonBackend().precompile(problems, archs=job["archs"])
    held = sum(bool(launch.jit_function(kernel).device_caches) for kernel in launch._kernels.values())
    return json.dumps({"lines": lines, "entries": sorted(os.listdir(job["cache"])), "device_caches": held})


class _NotCompiled:
    """What the recording compilation step returns: a kernel whose launch does nothing."""

    function = packed_metadata = None

    def launch_metadata(self, *args: object) -> None:
        return None

    def run(self, *args: object) -> None:
        return None


def cache_keys() -> dict[str, list[str]]:
    """Triton's disk-cache keys of the common problems' kernels: by `precompile`, and by the launch path."""
    import hashlib

    import torch
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.compiler.compiler import get_cache_key
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction

    from kermac.variants import common_problems
    from kermac_backend_triton import launch
    from kermac_backend_triton.backend import TritonBackend
    from kermac_backend_triton.precompile import _TargetDriver

    keys: list[str] = []

    def record(self, key, signature, device, constexprs, options, attrs, warmup):
        backend = self.device_caches[device][3]
        source = self.ASTSource(self, signature, constexprs, attrs)
        text = get_cache_key(source, backend, options, env_vars=get_cache_invalidating_env_vars())
        keys.append(hashlib.sha256(text.encode()).hexdigest())
        self.device_caches[device][0][key] = kernel = _NotCompiled()
        return kernel

    class TimesNothing(_TargetDriver):
        def get_benchmarker(self):
            return lambda fn, quantiles: (fn(), [1.0, 1.0, 1.0])[1]

    JITFunction._do_compile = record
    problems = common_problems("meta", [torch.float32, torch.float16])
    backend = TritonBackend()
    backend.precompile(problems, archs=["sm_90"])
    by_precompile, keys[:] = sorted(set(keys)), []
    driver.set_active(TimesNothing(90))
    launch.make_launcher = lambda *args, **kwargs: None  # a `_NotCompiled` kernel has nothing to launch later
    for problem in problems:
        (backend.pairwise if hasattr(problem, "x") else backend.grad)(problem)
    return {"precompile": by_precompile, "launch": sorted(set(keys))}


if __name__ == "__main__":
    serve(run_job)
