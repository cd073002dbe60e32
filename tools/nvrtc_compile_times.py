"""Cold NVRTC compile time of every common variant (``kermac precompile``'s list), one at a time.

No GPU involved, and an empty private JIT cache: each variant goes through the backend's own
``compile_cubin`` to a cubin for ``--arch`` (planned for that architecture: sm_90 variants of
the p = 2 family are wgmma kernels for sm_90a), timed on this process's one thread (what a first
call pays, cache write included).  Each source gets a unique comment, so that a compile cache
below kermac's keyed on the source (cuda.core's program cache, where enabled) cannot answer.
Prints one row per variant with its ptxas resource line, then the median and maximum.

    python tools/nvrtc_compile_times.py [--arch sm_90] [--match substring]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import uuid

os.environ["KERMAC_CACHE_DIR"] = tempfile.mkdtemp(prefix="kermac-compile-times-")  # before kermac reads it

from kermac.problem import GradProblem
from kermac.variants import common_problems
from kermac_backend_nvrtc.compiler import compile_cubin
from kermac_backend_nvrtc.plan import plan_grad, plan_pairwise
from kermac_backend_nvrtc.source import kernel_source
from kermac_backend_nvrtc.tuning import DEFAULT_TUNING
from kermac_backend_nvrtc.variants import arch_capability


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--match", default="")
    args = ap.parse_args()
    capability = arch_capability(args.arch)
    seen: set[str] = set()
    times: list[float] = []
    for problem in common_problems():
        grad = isinstance(problem, GradProblem)
        planner = plan_grad if grad else plan_pairwise
        variant = planner(problem, capability, DEFAULT_TUNING)[0]
        source = kernel_source(variant)[0]
        label = f"{'grad' if grad else 'pairwise'} {problem.program.key()}"
        if source in seen or args.match not in label:
            continue
        seen.add(source)
        arch = variant.target(capability)  # sm_90a for the wgmma kernel
        nonce = f"\n// cold compile {uuid.uuid4()}\n"
        compiled = compile_cubin(source + nonce, arch, name=variant.kernel)
        assert not compiled.hit, "the private cache must start empty"
        times.append(compiled.seconds)
        print(f"{times[-1]:6.2f} s  {arch:7s} {label[:90]:90s}  {compiled.ptxas}", flush=True)
    if times:
        median, worst = statistics.median(times), max(times)
        print(f"\n{len(times)} variants for {args.arch}: median {median:.2f} s, max {worst:.2f} s")


if __name__ == "__main__":
    main()
