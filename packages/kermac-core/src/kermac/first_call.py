"""What a new process pays before its kernels run: a kernel variant's first call, timed in a fresh process.

[`time_first_call`][kermac.first_call.time_first_call] runs one child Python process that creates the device
context and two operands, then times, in turn: `import kermac` (which loads no backend); loading the backend
(plugin discovery and its `availability()`, asked once per process:
[`kermac.registry.availability`][kermac.registry.availability]); the variant's first call (plan, compile or load
from the disk cache, autotune, launch, synchronise; `kermac.benchmarking.call_variant`); and its
second call.  The child's JIT caches (kermac's, `KERMAC_CACHE_DIR`, and Triton's, `TRITON_CACHE_DIR`) live in a
directory the caller names, so a first child on an empty directory times the cold compile and later children on
the same directory the warm first call.  [`private_caches`][kermac.first_call.private_caches] makes such a
directory (`tempfile.mkdtemp`: private to the user) and removes it afterwards;
[`precompile_into`][kermac.first_call.precompile_into] fills one with `kermac precompile`.
`kermac bench --first-call` and `tools/first_call_times.py` are built on these.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["FirstCallTimes", "precompile_into", "private_caches", "time_first_call"]

_CHILD = """
import json, sys, time
import torch
backend, variant, size, device = sys.argv[1:5]
m, d = (int(v) for v in size.split("x"))
def sync():
    if device.startswith("cuda"):
        torch.cuda.synchronize()
x, z = torch.randn(m, d, device=device), torch.randn(m, d, device=device)
sync()
start = time.perf_counter()
import kermac.benchmarking as bm
imported = time.perf_counter()
from kermac import registry
registry.availability(backend)
loaded = time.perf_counter()
bm.call_variant(variant, x, z, backend)
sync()
first = time.perf_counter()
bm.call_variant(variant, x, z, backend)
sync()
second = time.perf_counter()
print(json.dumps({"import_s": imported - start, "load_s": loaded - imported, "first_s": first - loaded,
                  "second_s": second - first}))
"""
"""The child's program: it imports kermac inside its own timer (argv: backend, variant, MxD, device)."""


@dataclass(frozen=True)
class FirstCallTimes:
    """One fresh process's times, in seconds: `import kermac`, loading the backend, the variant's first call after
    that, and its second call."""

    import_s: float
    load_s: float
    first_s: float
    second_s: float


def _environment(caches: str) -> dict[str, str]:
    """This process's environment with kermac's and Triton's JIT caches under `caches`."""
    return dict(
        os.environ, KERMAC_CACHE_DIR=os.path.join(caches, "kermac"), TRITON_CACHE_DIR=os.path.join(caches, "triton")
    )


def time_first_call(backend: str, variant: str, size: tuple[int, int], device: str, caches: str) -> FirstCallTimes:
    """The times of one fresh process calling `variant` (a `FIRST_CALL_VARIANTS` name) on `backend` with two
    operands of `size` = `(rows, features)` on `device`, its JIT caches under `caches`; `RuntimeError` with the
    child's error where it fails."""
    m, d = size
    argv = [sys.executable, "-c", _CHILD, backend, variant, f"{m}x{d}", device]
    done = subprocess.run(argv, env=_environment(caches), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{backend} {variant}: the child process failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return FirstCallTimes(**json.loads(done.stdout.strip().splitlines()[-1]))


def precompile_into(backend: str, caches: str) -> float:
    """Run `kermac precompile --backends backend` with its JIT caches under `caches`; the seconds it took."""
    start = time.perf_counter()
    argv = [sys.executable, "-m", "kermac", "precompile", "--backends", backend]
    done = subprocess.run(argv, env=_environment(caches), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{backend}: kermac precompile failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return time.perf_counter() - start


@contextlib.contextmanager
def private_caches(copy_of: str | None = None) -> Iterator[str]:
    """A new directory private to the user (`tempfile.mkdtemp`) for a child's JIT caches, holding a copy of
    `copy_of`'s contents if given; removed afterwards."""
    where = tempfile.mkdtemp(prefix="kermac-first-call-")
    try:
        if copy_of is not None:
            shutil.copytree(copy_of, where, dirs_exist_ok=True)
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)
