"""First-call times of kernel variants, each in a fresh process: cold (empty caches) and warm (the caches it filled).

For each backend and variant a child process creates the device context and two operands, imports kermac, and times
the first call of the variant (plan, compile or load, autotune, launch, synchronise) and the second. The first child
of a variant gets an empty private directory for kermac's JIT cache and Triton's (`KERMAC_CACHE_DIR`,
`TRITON_CACHE_DIR`, made by `tempfile.mkdtemp`, so private to the user): its first call is the **cold** compile.
`--warm` more children reuse that directory: their first call is what a new process pays once the caches are
filled. Import of kermac (which loads no backend) is reported apart; the first call includes loading the backends
(plugin discovery) and everything a variant needs.

    python tools/first_call_times.py [--backends nvrtc,triton] [--variants p1,p2,p1.3,gaussian,laplace_l1]
                                     [--size 4096x64] [--warm 2] [--device cuda]

A variant is `pP` (`kermac.cdist` with p = P) or a preset name (`kermac.run_kernel`, bandwidth 2):
`kermac.benchmarking.call_variant`; the default list is `FIRST_CALL_VARIANTS`, which the asv suite `bench_first_call`
times too. `--device cpu` runs CPU tensors (the `torch` backend, or Triton under `TRITON_INTERPRET=1`), which the
tests use.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = "--child"


def child(backend: str, variant: str, size: str, device: str) -> dict[str, float]:
    """The times of one fresh process, in seconds (run with `CHILD`): `import kermac` (no backend is loaded yet),
    the first call and the second."""
    import torch

    m, d = (int(v) for v in size.split("x"))

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    x, z = torch.randn(m, d, device=device), torch.randn(m, d, device=device)
    sync()
    start = time.perf_counter()
    import kermac.benchmarking as bm

    imported = time.perf_counter()
    bm.call_variant(variant, x, z, backend)
    sync()
    first = time.perf_counter()
    bm.call_variant(variant, x, z, backend)
    sync()
    second = time.perf_counter()
    return {"import": imported - start, "first": first - imported, "second": second - first}


def run_child(backend: str, variant: str, size: str, device: str, caches: str) -> dict[str, float]:
    """The times of one child process whose caches live under `caches`."""
    env = dict(os.environ)
    env.update(KERMAC_CACHE_DIR=os.path.join(caches, "kermac"), TRITON_CACHE_DIR=os.path.join(caches, "triton"))
    argv = [sys.executable, __file__, CHILD, backend, variant, size, device]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{backend} {variant}: the child failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from kermac.benchmarking import FIRST_CALL_VARIANTS  # here: a child times its own import of kermac

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="nvrtc,triton", help="comma-separated backend names")
    ap.add_argument("--variants", default=",".join(FIRST_CALL_VARIANTS), help="comma-separated: pP or presets")
    ap.add_argument("--size", default="4096x64", help="rows x features of both operands (default 4096x64)")
    ap.add_argument("--warm", type=int, default=2, help="warm processes per variant (default 2)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = ap.parse_args(argv)
    if args.warm < 1:
        ap.error(f"--warm: expected at least 1 warm process, got {args.warm}")
    try:
        m, d = (int(v) for v in args.size.split("x"))
    except ValueError:
        ap.error(f"--size: expected ROWSxFEATURES such as 4096x64, got {args.size!r}")
    if m < 1 or d < 1:
        ap.error(f"--size: expected positive rows and features, got {args.size!r}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    firsts: dict[str, list[float]] = {"cold": [], "warm": []}
    print(f"{'backend':8s} {'variant':12s} {'process':7s} {'import kermac':>13s} {'first call':>11s} {'second':>9s}")
    for backend in args.backends.split(","):
        for variant in args.variants.split(","):
            caches = tempfile.mkdtemp(prefix="kermac-first-call-")
            try:
                for i in range(1 + args.warm):
                    kind = "cold" if i == 0 else "warm"
                    t = run_child(backend, variant, args.size, args.device, caches)
                    firsts[kind].append(t["first"])
                    print(
                        f"{backend:8s} {variant:12s} {kind:7s} {t['import']:11.3f} s {t['first']:9.3f} s "
                        f"{1e3 * t['second']:6.2f} ms",
                        flush=True,
                    )
            finally:
                shutil.rmtree(caches, ignore_errors=True)
    for kind, values in firsts.items():
        print(f"{kind} first call: median {statistics.median(values):.3f} s, max {max(values):.3f} s")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == CHILD:
        print(json.dumps(child(*sys.argv[2:6])))
    else:
        main()
