"""First-call times of kernel variants, each in a fresh process: cold (empty caches) and warm (the caches it filled).

For each backend and variant a child process creates the device context and two operands, imports kermac, loads the
backend (plugin discovery and the backend's `availability()`), and times the first call of the variant (plan, compile
or load, autotune, launch, synchronise) and the second. The first child
of a variant gets an empty private directory for kermac's JIT cache and Triton's (`KERMAC_CACHE_DIR`,
`TRITON_CACHE_DIR`, made by `tempfile.mkdtemp`, so private to the user): its first call is the **cold** compile.
`--warm` more children reuse that directory: their first call is what a new process pays once the caches are
filled. With `--precompiled`, `kermac precompile --backends B` fills one more private directory per backend once
(its time is printed), and each variant gets a **precompiled** child too, on a copy of it: its first call is what a
new process pays after `kermac precompile` (which compiles the common problems at 256 × 256, so sizes whose layout
differs from theirs still compile). Import of kermac (which loads no backend) and loading the backend, which a
process pays once whatever it calls, are reported apart from the first call, which is everything the variant
itself needs.

    python tools/first_call_times.py [--backends nvrtc,triton] [--variants p1,p2,p1.3,gaussian,laplace_l1]
                                     [--size 4096x64] [--warm 2] [--precompiled] [--device cuda]

A variant is `pP` (`kermac.cdist` with p = P) or a preset name (`kermac.run_kernel`, bandwidth 2):
`kermac.benchmarking.call_variant`; the default list is `FIRST_CALL_VARIANTS`, which the asv suite `bench_first_call`
times too. `--device cpu` runs CPU tensors (the `torch` backend, or Triton under `TRITON_INTERPRET=1`), which the
tests use. The children are `kermac.first_call`'s, which `kermac bench --first-call` runs too (cold and warm
processes of every variant, as a table); this tool adds `--precompiled` and prints every process.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics

from kermac.first_call import FirstCallTimes, precompile_into, private_caches, time_first_call


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from kermac.benchmarking import FIRST_CALL_VARIANTS  # here: a child times its own import of kermac

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="nvrtc,triton", help="comma-separated backend names")
    ap.add_argument("--variants", default=",".join(FIRST_CALL_VARIANTS), help="comma-separated: pP or presets")
    ap.add_argument("--size", default="4096x64", help="rows x features of both operands (default 4096x64)")
    ap.add_argument("--warm", type=int, default=2, help="warm processes per variant (default 2)")
    ap.add_argument("--precompiled", action="store_true", help="a process after `kermac precompile` per variant too")
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
    size = tuple(int(v) for v in args.size.split("x"))
    kinds = ("cold", "warm", "precompiled") if args.precompiled else ("cold", "warm")
    times: dict[str, list[FirstCallTimes]] = {kind: [] for kind in kinds}
    print(
        f"{'backend':8s} {'variant':12s} {'process':11s} {'import kermac':>13s} {'load backend':>12s} "
        f"{'first call':>11s} {'second':>9s}"
    )
    for backend in args.backends.split(","):
        with private_caches() if args.precompiled else contextlib.nullcontext() as ahead:
            if ahead is not None:
                print(f"{backend}: kermac precompile took {precompile_into(backend, ahead):.1f} s", flush=True)
            for variant in args.variants.split(","):
                runs = [("cold", None)] + [("warm", None)] * args.warm + ([("precompiled", ahead)] if ahead else [])
                with private_caches() as caches:
                    for kind, start_from in runs:
                        # a copy: the precompiled caches serve every variant unchanged
                        own = contextlib.nullcontext(caches) if start_from is None else private_caches(start_from)
                        with own as where:
                            t = time_first_call(backend, variant, size, args.device, where)
                        times[kind].append(t)
                        print(
                            f"{backend:8s} {variant:12s} {kind:11s} {t.import_s:11.3f} s {t.load_s:10.3f} s "
                            f"{t.first_s:9.3f} s {1e3 * t.second_s:6.2f} ms",
                            flush=True,
                        )
    for kind, runs in times.items():
        firsts = [t.first_s for t in runs]
        print(
            f"{kind} first call: median {statistics.median(firsts):.3f} s, max {max(firsts):.3f} s; "
            f"loading the backend before it: median {statistics.median(t.load_s for t in runs):.3f} s"
        )


if __name__ == "__main__":
    main()
