"""Turn generated kernel source into ``@triton.jit`` functions, once per source per process.

``triton.jit`` reads a kernel's source with :func:`inspect.getsource`, so generated source must
live in a real file.  Each module is written to ``<kermac cache root>/triton/`` (see
:func:`kermac.jit_cache.cache_root`) under a name derived from the SHA-256 of its text, atomically
(temporary file + rename, so concurrent processes never read half a file), and imported from
there.  Triton keeps its own on-disk cache of the compiled binaries (``~/.triton/cache`` or
``TRITON_CACHE_DIR``), keyed by the source, so a second process compiles nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import ModuleType

from kermac.jit_cache import cache_root
from kermac.logs import logger

__all__ = ["load_module", "source_dir"]

_lock = threading.Lock()
_modules: dict[str, ModuleType] = {}


def source_dir() -> Path:
    """Directory of the generated Triton modules."""
    return cache_root() / "triton"


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _materialise(name: str, source: str) -> Path:
    """A file holding ``source``: in the cache directory, or a temporary one if that is read-only."""
    for directory in (source_dir(), Path(tempfile.gettempdir()) / "kermac-triton"):
        path = directory / f"{name}.py"
        try:
            if not (path.is_file() and path.read_text(encoding="utf-8") == source):
                _write_atomic(path, source)
            return path
        except OSError as exc:
            logger.warning("kermac triton: cannot write generated kernel source to %s: %s", directory, exc)
    raise OSError(f"kermac triton: no writable directory for generated kernel source {name}")


def load_module(source: str, *, debug: bool = False) -> ModuleType:
    """The module executing ``source`` (cached per process by the source's hash)."""
    digest = hashlib.sha256(source.encode("utf-8")).hexdigest()
    with _lock:
        module = _modules.get(digest)
        if module is not None:
            return module
        start = time.perf_counter()
        name = f"kermac_triton_{digest[:32]}"
        path = _materialise(name, source)
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        _modules[digest] = module
        if debug:
            logger.debug("kermac triton: generated module %s in %.1f ms", path, 1e3 * (time.perf_counter() - start))
        return module
