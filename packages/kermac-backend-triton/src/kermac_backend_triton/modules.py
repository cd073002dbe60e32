"""Turn generated kernel source into `@triton.jit` functions, once per source per process.

Generated source never touches the disk: `load_module` compiles exactly the text it is
given with `compile` and executes it in a fresh module registered in `sys.modules`.
No file is read and no bytecode cache (`__pycache__/*.pyc`) is consulted, so nothing another
user could plant in a cache or temporary directory can run in its place (the import system
prefers an unchecked-hash `.pyc` to the source it was checked against).

`triton.jit` reads a kernel's source with `inspect.getsourcelines`, when it decorates the
function and, under `TRITON_INTERPRET=1`, again when it first runs it; the source is therefore
registered in `linecache.cache` under the pseudo file name `<kermac-triton SHA-256>`
with no modification time.  `linecache.checkcache` never drops such an entry and
`linecache` never looks a `<...>` name up on disk, so the text inspect returns is the
text that was compiled; every `load_module` call registers it again in case something
emptied the cache (`linecache.clearcache`).  Triton's own on-disk cache of compiled
binaries (`~/.triton/cache` or `TRITON_CACHE_DIR`, Triton's to manage) is keyed by the
function's source text and line numbers, not its file, so a second process compiles nothing.
"""

from __future__ import annotations

import hashlib
import linecache
import sys
import threading
import time
from types import ModuleType

from kermac.logs import logger

__all__ = ["load_module"]

_lock = threading.Lock()
_modules: dict[str, ModuleType] = {}


def _register_source(filename: str, source: str) -> None:
    """Make `source` what `inspect` finds for `filename` (never invalidated: mtime None)."""
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)


def load_module(source: str, *, debug: bool = False) -> ModuleType:
    """The module executing `source` (cached per process by the source's SHA-256)."""
    digest = hashlib.sha256(source.encode("utf-8")).hexdigest()
    filename = f"<kermac-triton {digest}>"
    with _lock:
        _register_source(filename, source)
        module = _modules.get(digest)
        if module is not None:
            return module
        start = time.perf_counter()
        name = f"kermac_triton_{digest[:32]}"
        code = compile(source, filename, "exec")
        module = ModuleType(name)
        # Registered before running, as an import would: triton.jit and dataclasses look the
        # defining module up by name while the body executes.
        sys.modules[name] = module
        try:
            exec(code, module.__dict__)
        except BaseException:
            del sys.modules[name]
            raise
        _modules[digest] = module
        if debug:
            logger.debug("kermac triton: generated module %s in %.1f ms", name, 1e3 * (time.perf_counter() - start))
        return module
