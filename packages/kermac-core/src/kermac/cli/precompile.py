"""`kermac precompile`: compile the common kernel variants into the JIT cache ahead of time.

Useful before a job starts (or when building an image): the first call of each common
operation then finds its kernel in the cache.  Without a GPU the problems are described on the
`meta` device and compiled for `--arch` (default sm_80 and sm_90).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from kermac import registry
from kermac.backend import Backend
from kermac.variants import common_problems

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "precompile",
        help="compile the common kernel variants into the JIT cache",
        description="Compile the kernels of the common problems (cdist for p = 0, 1, 2, inf and a fractional "
        "p, every preset kernel, cdist_grad) into the JIT cache ahead of time, so that the first call of each "
        "finds its kernel there: before a job starts, or when building an image. Without a GPU the kernels are "
        "compiled for --arch (default sm_80 and sm_90).",
    )
    p.add_argument("--backends", help="comma-separated backends (default: every backend that compiles ahead of time)")
    p.add_argument(
        "--arch",
        action="append",
        help="target architecture, e.g. sm_90 (repeatable; default: the GPU's, or sm_80 and sm_90 without one)",
    )
    p.add_argument("--dtype", action="append", choices=sorted(DTYPES), help="input dtype (repeatable; default float32)")
    p.set_defaults(run=run)


def _compiles_ahead(backend: Backend) -> bool:
    return type(backend).precompile is not Backend.precompile


def run(args: argparse.Namespace) -> int:
    backends = registry.registered_backends()
    if args.backends:
        names = [n.strip() for n in args.backends.split(",") if n.strip()]
        unknown = [n for n in names if n not in backends]
        if unknown:
            print(f"--backends: unknown {unknown}; registered: {', '.join(sorted(backends))}", file=sys.stderr)
            return 2
    else:
        names = [n for n, b in backends.items() if _compiles_ahead(b)]
    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "meta"
    archs = args.arch or (None if gpu else ["sm_80", "sm_90"])
    dtypes = [DTYPES[d] for d in (args.dtype or ["float32"])]
    problems = common_problems(device, dtypes)
    failed = False
    for name in names:
        start = time.perf_counter()
        try:
            built = backends[name].precompile(problems, archs=archs)
        except Exception as exc:
            print(f"{name}: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            failed = True
            continue
        for line in built:
            print(f"{name}: {line}")
        print(f"{name}: {len(built)} variant(s) in {time.perf_counter() - start:.1f} s")
    if not names:
        print("no registered backend compiles ahead of time", file=sys.stderr)
    return 1 if failed else 0
