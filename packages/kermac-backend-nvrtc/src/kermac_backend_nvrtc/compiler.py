"""NVRTC through `cuda.core`: CUDA C++ source → cubin for one architecture, via kermac's JIT cache.

The cache key ([`kermac.jit_cache.cache_key`][kermac.jit_cache.cache_key]) covers the full source, the options, the
NVRTC version and the target architecture, so a new NVRTC or a changed kernel never reuses a
stale binary.  ptxas runs with `-v`; its report (registers, spills, shared memory) is kept in
the entry's metadata and logged at debug level.  Compiling needs no GPU.
"""

from __future__ import annotations

import io
import re
import threading
import time
from dataclasses import dataclass
from functools import cache

from kermac.jit_cache import cache_key, default_cache
from kermac.logs import logger

__all__ = [
    "CUDA_CORE_BINDINGS",
    "INSTALL_HINT",
    "OPTIONS",
    "Compiled",
    "compile_cubin",
    "nvrtc_version",
    "supported_archs",
]

OPTIONS = ("-std=c++17", "-Xptxas=-v")
"""NVRTC options besides the architecture (IEEE division and square root; FMA contraction on)."""

_memo: dict[str, bytes] = {}
_memo_lock = threading.Lock()


@dataclass(frozen=True)
class Compiled:
    """A cubin, whether it came from the cache, and how long getting it took."""

    cubin: bytes
    key: str
    hit: bool
    seconds: float
    ptxas: str


INSTALL_HINT = "install kermac-backend-nvrtc with its [cu13] extra ([cu12] for a CUDA 12 driver; docs/installation.md)"
"""What to do where cuda-core, cuda-bindings or the NVRTC library is missing."""

CUDA_CORE_BINDINGS = ("12", "13")
"""The cuda-bindings major versions cuda-core imports with (it checks them at its import)."""


@cache
def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the NVRTC library that `cuda.bindings` loads (asked once per process)."""
    from cuda.bindings import nvrtc

    err, major, minor = nvrtc.nvrtcVersion()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"nvrtcVersion failed: {err}")
    return major, minor


@cache
def supported_archs() -> tuple[int, ...]:
    """Compute capabilities (e.g. 80, 90) NVRTC can emit cubins for (asked once per process)."""
    from cuda.bindings import nvrtc

    err, _count = nvrtc.nvrtcGetNumSupportedArchs()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"nvrtcGetNumSupportedArchs failed: {err}")
    err, archs = nvrtc.nvrtcGetSupportedArchs()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"nvrtcGetSupportedArchs failed: {err}")
    return tuple(archs)


def _ptxas_summary(log: str) -> str:
    keep = [ln.split(":", 1)[-1].strip() for ln in log.splitlines() if re.search(r"registers|spill|stack frame", ln)]
    return "; ".join(keep)


def _build(source: str, arch: str, name: str, meta: dict) -> bytes:
    try:
        from cuda.core import Program, ProgramOptions
    except ImportError as exc:  # installed (the backend's availability found it) but not importable
        raise RuntimeError(f"compiling {name} needs cuda-core, which failed to import ({exc}); {INSTALL_HINT}") from exc

    options = ProgramOptions(name=name, arch=arch, std="c++17", ptxas_options=["-v"])
    log = io.StringIO()
    try:
        obj = Program(source, "c++", options=options).compile("cubin", logs=log)
    except Exception as exc:
        raise RuntimeError(f"NVRTC failed to compile {name} for {arch}: {exc}\n{log.getvalue()}") from exc
    meta["ptxas"] = _ptxas_summary(log.getvalue().replace("\x00", ""))
    return bytes(obj.code)


def compile_cubin(source: str, arch: str, *, name: str) -> Compiled:
    """The cubin of `source` for `arch` (e.g. `"sm_90"`), from memory, the disk cache or NVRTC."""
    start = time.perf_counter()
    major, minor = nvrtc_version()
    key = cache_key(source=source, options=OPTIONS, compiler="nvrtc", compiler_version=f"{major}.{minor}", arch=arch)
    with _memo_lock:
        cubin = _memo.get(key)
    if cubin is not None:
        return Compiled(cubin, key, True, time.perf_counter() - start, "")
    meta: dict = {"kernel": name, "arch": arch}
    cubin, hit = default_cache().get_or_build(key, lambda: _build(source, arch, name, meta), meta=meta)
    seconds = time.perf_counter() - start
    with _memo_lock:
        _memo[key] = cubin
    ptxas = meta.get("ptxas", "")
    logger.debug(
        "nvrtc: %s for %s: %s in %.1f ms%s",
        name,
        arch,
        "cache hit" if hit else "compiled",
        1e3 * seconds,
        f"; ptxas: {ptxas}" if ptxas else "",
    )
    return Compiled(cubin, key, hit, seconds, ptxas)
