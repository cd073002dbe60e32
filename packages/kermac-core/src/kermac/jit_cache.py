"""On-disk cache of compiled GPU kernels, shared by every process of a user.

Location: ``$KERMAC_CACHE_DIR`` if set, else the platform's user cache directory
(``platformdirs.user_cache_dir("kermac")``).  Entries live under a versioned subdirectory
``v<LAYOUT_VERSION>/``, so a change of the on-disk format never reads files of another format::

    <root>/v1/<key[:2]>/<key>.bin    header + payload (the compiled cubin, PTX, ...)
    <root>/v1/<key[:2]>/<key>.json   metadata sidecar (options, arch, compile time, ...)

Keys are content addresses (:func:`cache_key`): the SHA-256 of everything that determines the
compiled bytes.  Two processes that compile the same key produce interchangeable payloads, so
concurrent writers need no lock: each writes a private temporary file in the entry's directory,
flushes and fsyncs it, and renames it over the entry with :func:`os.replace` (atomic on POSIX and
Windows).  A reader therefore sees either no entry or a complete one.

Each ``.bin`` file starts with a fixed header -- magic string, layout version, payload length and
the payload's SHA-256 -- that :meth:`JitCache.get` verifies; a truncated or corrupted entry counts
as a miss, is deleted and reported with ``logger.warning``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kermac._version import __version__
from kermac.logs import logger

__all__ = [
    "ENV_CACHE_DIR",
    "LAYOUT_VERSION",
    "CacheEntry",
    "CacheInfo",
    "JitCache",
    "cache_key",
    "cache_root",
    "default_cache",
]

ENV_CACHE_DIR = "KERMAC_CACHE_DIR"
LAYOUT_VERSION = 1

_MAGIC = b"KERMACJIT\x00"
# magic (10 bytes) | layout version (uint32) | payload length (uint64) | sha256 of payload (32 bytes)
_HEADER = struct.Struct(f"<{len(_MAGIC)}sIQ32s")
_PAYLOAD_SUFFIX = ".bin"
_META_SUFFIX = ".json"
_TEMP_SUFFIX = ".tmp"
_KEY_CHARS = frozenset("0123456789abcdef")
# Temporary files older than this are left-overs of crashed writers; clear() removes them.
_STALE_TEMP_SECONDS = 3600.0


def cache_root() -> Path:
    """The cache's root directory: ``$KERMAC_CACHE_DIR`` or the user cache directory."""
    env = os.environ.get(ENV_CACHE_DIR, "").strip()
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("kermac", appauthor=False))


def cache_key(
    *,
    source: str,
    headers: Mapping[str, str] | None = None,
    options: Sequence[str] = (),
    compiler: str,
    compiler_version: str,
    arch: str,
    extra: Mapping[str, str] | None = None,
) -> str:
    """The content address (64 lowercase hex digits) of one compilation.

    It is the SHA-256 of a canonical encoding of: the kernel ``source``; every included header
    (name -> contents; order-independent); the compiler ``options`` (order matters, as it does for
    compilers); the ``compiler`` name and ``compiler_version``; the target ``arch``; any ``extra``
    string pairs a backend needs (e.g. the driver's PTX ISA); kermac's version and the cache
    layout version.  The encoding is JSON with sorted keys, so no two different inputs can
    produce the same byte string.
    """
    headers = {} if headers is None else headers
    extra = {} if extra is None else extra
    _check_str("source", source)
    _check_str("compiler", compiler)
    _check_str("compiler_version", compiler_version)
    _check_str("arch", arch)
    _check_str_mapping("headers", headers)
    _check_str_mapping("extra", extra)
    if isinstance(options, (str, bytes)) or not isinstance(options, Sequence):
        raise TypeError(f"options: expected a sequence of str, got {type(options).__name__}")
    for i, opt in enumerate(options):
        _check_str(f"options[{i}]", opt)
    document = {
        "arch": arch,
        "compiler": compiler,
        "compiler_version": compiler_version,
        "extra": dict(extra),
        "headers": dict(headers),
        "kermac": __version__,
        "layout": LAYOUT_VERSION,
        "options": list(options),
        "source": source,
    }
    encoded = json.dumps(document, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(encoded.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class CacheEntry:
    """One cached compilation: its key, payload size in bytes and metadata (``None`` if unreadable)."""

    key: str
    size: int
    meta: Mapping[str, object] | None


@dataclass(frozen=True)
class CacheInfo:
    """Summary of a cache: its directory, number of entries and bytes used on disk (all files)."""

    path: Path
    count: int
    total_bytes: int


class JitCache:
    """A directory of compiled kernels addressed by :func:`cache_key`.

    ``root`` defaults to :func:`cache_root`; entries go to ``root / f"v{LAYOUT_VERSION}"``
    (:attr:`path`).  Directories are created on the first :meth:`put`.
    """

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = cache_root() if root is None else Path(root)
        self.path = self.root / f"v{LAYOUT_VERSION}"

    def __repr__(self) -> str:
        return f"JitCache({str(self.root)!r})"

    # -- entries ----------------------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        """The payload stored under ``key``, or ``None`` if absent, truncated or corrupted.

        A damaged entry is deleted (with its metadata) and reported through ``logger.warning``.
        """
        payload_path = self._payload_path(key)
        try:
            with open(payload_path, "rb") as f:
                blob = f.read()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:  # unreadable cache: compile instead of failing
            logger.warning("kermac JIT cache: cannot read entry %s at %s: %s", key, payload_path, exc)
            return None
        problem = _verify(blob)
        if problem is None:
            return blob[_HEADER.size :]
        logger.warning("kermac JIT cache: entry %s at %s is %s; deleting it and rebuilding", key, payload_path, problem)
        for p in (payload_path, self._meta_path(key)):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
        return None

    def put(self, key: str, data: bytes, meta: Mapping[str, object] | None = None) -> None:
        """Store ``data`` under ``key`` atomically, with ``meta`` as a JSON sidecar.

        The sidecar also records ``key``, ``size`` and ``created`` (Unix time).  Values of ``meta``
        that JSON cannot encode are stored as their ``str``.
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"data: expected bytes, got {type(data).__name__}")
        if meta is not None and not isinstance(meta, Mapping):
            raise TypeError(f"meta: expected a mapping or None, got {type(meta).__name__}")
        data = bytes(data)
        payload_path = self._payload_path(key)
        payload_path.parent.mkdir(parents=True, exist_ok=True)
        header = _HEADER.pack(_MAGIC, LAYOUT_VERSION, len(data), hashlib.sha256(data).digest())
        document = {**(meta or {}), "key": key, "size": len(data), "created": time.time()}
        sidecar = json.dumps(document, sort_keys=True, indent=1, default=str).encode("utf-8")
        _atomic_write(payload_path, (header, data))
        _atomic_write(self._meta_path(key), (sidecar,))

    def get_or_build(
        self, key: str, build: Callable[[], bytes], *, meta: Mapping[str, object] | None = None
    ) -> tuple[bytes, bool]:
        """``(payload, hit)``: the cached payload, or ``build()``'s result stored under ``key``.

        On a miss the metadata gains ``build_seconds``.  A failure to store (read-only or full
        disk) is logged as a warning and the freshly built payload is still returned.
        """
        start = time.perf_counter()
        data = self.get(key)
        if data is not None:
            logger.debug(
                "kermac JIT cache: hit %s (%d bytes, %.2f ms)", key, len(data), 1e3 * (time.perf_counter() - start)
            )
            return data, True
        start = time.perf_counter()
        data = build()
        seconds = time.perf_counter() - start
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"build: expected a callable returning bytes, it returned {type(data).__name__}")
        data = bytes(data)
        logger.debug("kermac JIT cache: miss %s, built %d bytes in %.3f s", key, len(data), seconds)
        try:
            self.put(key, data, {**(meta or {}), "build_seconds": seconds})
        except OSError as exc:
            logger.warning("kermac JIT cache: could not store entry %s in %s: %s", key, self.path, exc)
        return data, False

    def entries(self) -> list[CacheEntry]:
        """Every entry of this cache (key, payload size, metadata), sorted by key."""
        out = []
        for payload_path in self._payload_files():
            key = payload_path.name[: -len(_PAYLOAD_SUFFIX)]
            try:
                size = payload_path.stat().st_size - _HEADER.size
            except FileNotFoundError:  # removed by a concurrent clear()
                continue
            out.append(CacheEntry(key, max(size, 0), self._read_meta(key)))
        return out

    def info(self) -> CacheInfo:
        """Directory, number of entries and bytes used by all files under :attr:`path`."""
        count = 0
        total = 0
        for p in self._all_files():
            try:
                total += p.stat().st_size
            except FileNotFoundError:
                continue
            count += p.name.endswith(_PAYLOAD_SUFFIX)
        return CacheInfo(self.path, count, total)

    def clear(self) -> int:
        """Delete every entry (and stale temporary files); returns the number of entries removed.

        Temporary files younger than an hour are kept: they may belong to a writer that is about
        to rename them into place.
        """
        removed = 0
        now = time.time()
        for p in self._all_files():
            try:
                if p.name.endswith(_TEMP_SUFFIX) and now - p.stat().st_mtime < _STALE_TEMP_SECONDS:
                    continue
                p.unlink()
            except FileNotFoundError:
                continue
            removed += p.name.endswith(_PAYLOAD_SUFFIX)
        if self.path.is_dir():
            for d in self.path.iterdir():
                with contextlib.suppress(OSError):  # not empty (a live temp file) or already gone
                    d.rmdir()
        return removed

    # -- paths ------------------------------------------------------------------------------

    def _payload_path(self, key: str) -> Path:
        _check_key(key)
        return self.path / key[:2] / (key + _PAYLOAD_SUFFIX)

    def _meta_path(self, key: str) -> Path:
        _check_key(key)
        return self.path / key[:2] / (key + _META_SUFFIX)

    def _shards(self) -> list[Path]:
        if not self.path.is_dir():
            return []
        return sorted(d for d in self.path.iterdir() if d.is_dir() and len(d.name) == 2)

    def _all_files(self) -> list[Path]:
        return [p for d in self._shards() for p in sorted(d.iterdir()) if p.is_file()]

    def _payload_files(self) -> list[Path]:
        return [
            p
            for p in self._all_files()
            if p.name.endswith(_PAYLOAD_SUFFIX) and _is_key(p.name[: -len(_PAYLOAD_SUFFIX)])
        ]

    def _read_meta(self, key: str) -> Mapping[str, object] | None:
        try:
            document = json.loads(self._meta_path(key).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return document if isinstance(document, dict) else None


_default_lock = threading.Lock()
_default: JitCache | None = None


def default_cache() -> JitCache:
    """The process-wide cache at :func:`cache_root` (a new one if ``KERMAC_CACHE_DIR`` changed)."""
    global _default
    root = cache_root()
    with _default_lock:
        if _default is None or _default.root != root:
            _default = JitCache(root)
        return _default


def _verify(blob: bytes) -> str | None:
    """``None`` if ``blob`` is a well-formed entry, else what is wrong with it."""
    if len(blob) < _HEADER.size:
        return f"truncated ({len(blob)} bytes, shorter than the {_HEADER.size}-byte header)"
    magic, version, length, digest = _HEADER.unpack_from(blob)
    if magic != _MAGIC:
        return "not a kermac cache entry (bad magic)"
    if version != LAYOUT_VERSION:
        return f"of layout version {version}, expected {LAYOUT_VERSION}"
    if len(blob) - _HEADER.size != length:
        return f"truncated (payload of {len(blob) - _HEADER.size} bytes, header says {length})"
    if hashlib.sha256(memoryview(blob)[_HEADER.size :]).digest() != digest:
        return "corrupted (payload checksum mismatch)"
    return None


def _atomic_write(path: Path, chunks: Sequence[bytes]) -> None:
    """Write ``chunks`` to ``path`` so that readers see the old file or the complete new one."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=_TEMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.replace(tmp, path)
        except PermissionError:
            # Windows refuses to replace a file another process holds open.  Entries are
            # content-addressed, so the file already there is an equivalent one: keep it.
            if not path.is_file():
                raise
            os.unlink(tmp)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    """Make a rename durable (POSIX); a no-op where directories cannot be opened (Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _is_key(key: object) -> bool:
    return isinstance(key, str) and len(key) == 64 and _KEY_CHARS.issuperset(key)


def _check_key(key: object) -> None:
    if not _is_key(key):
        raise ValueError(f"key: expected 64 lowercase hex digits (from kermac.jit_cache.cache_key), got {key!r}")


def _check_str(name: str, value: object) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected a str, got {type(value).__name__}")


def _check_str_mapping(name: str, value: object) -> None:
    if not isinstance(value, Mapping):
        raise TypeError(f"{name}: expected a mapping of str to str, got {type(value).__name__}")
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(
                f"{name}: expected a mapping of str to str, got an item {type(k).__name__}: {type(v).__name__}"
            )
