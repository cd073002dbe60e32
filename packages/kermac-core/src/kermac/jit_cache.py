"""On-disk cache of compiled GPU kernels, shared by every process of a user.

Location: `$KERMAC_CACHE_DIR` if set, else the platform's user cache directory
(`platformdirs.user_cache_dir("kermac")`).  Entries live under a versioned subdirectory
`v<LAYOUT_VERSION>/`, so a change of the on-disk format never reads files of another format:

```text
<root>/v1/<key[:2]>/<key>.bin    header + payload (the compiled cubin, PTX, ...)
<root>/v1/<key[:2]>/<key>.json   metadata sidecar (options, arch, compile time, ...)
```

Keys are content addresses ([`cache_key`][kermac.jit_cache.cache_key]): the SHA-256 of everything that determines the
compiled bytes.  Two processes that compile the same key produce interchangeable payloads, so
concurrent writers need no lock: each writes a private temporary file in the entry's directory,
flushes and fsyncs it, and renames it over the entry with `os.replace` (atomic on POSIX and
Windows).  A reader therefore sees either no entry or a complete one.

Each `.bin` file starts with a fixed header -- magic string, layout version, payload length and
the payload's SHA-256 -- that [`JitCache.get`][kermac.jit_cache.JitCache.get] verifies; a truncated or corrupted entry
counts as a miss, is deleted and reported with `logger.warning`.

Safety: the root, `v1/` and every shard directory are private to the user (created
`0o700`; an existing one must be a real directory owned by the user and not writable by others,
see `kermac.private_dir`).  A root or `v1/` that is not is refused -- kernels are compiled
without the cache, with a warning -- and never replaced by a shared location.  Inside the
cache only regular files are opened (`O_NOFOLLOW`, and `O_NONBLOCK` so a FIFO cannot block);
anything else found where kermac writes (a symbolic link, a FIFO, a directory, a shard that is
not private) is reported, removed and rebuilt, and symbolic links are removed themselves, never
followed.  Sidecars are validated: non-finite numbers read as `None`, and `created`,
`size` and `build_seconds` outside their ranges as unknown.

Size: the cache holds at most [`cache_max_bytes`][kermac.jit_cache.cache_max_bytes] bytes (`$KERMAC_CACHE_MAX_BYTES`, 2
GiB by default).  Every hit sets the entry's modification time to now; after every store the least
recently used entries are deleted until the cache fits.  A reader reads an entry whole and checks
its checksum, so an entry another process evicts meanwhile is a plain miss; temporary files of
live writers are never evicted.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import shutil
import stat
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kermac._version import __version__
from kermac.logs import logger
from kermac.private_dir import UnsafeDirectoryError, ensure_private_dir, private_problem

__all__ = [
    "DEFAULT_MAX_BYTES",
    "ENV_CACHE_DIR",
    "ENV_CACHE_MAX_BYTES",
    "LAYOUT_VERSION",
    "CacheEntry",
    "CacheInfo",
    "JitCache",
    "cache_key",
    "cache_max_bytes",
    "cache_root",
    "default_cache",
]

ENV_CACHE_DIR = "KERMAC_CACHE_DIR"
ENV_CACHE_MAX_BYTES = "KERMAC_CACHE_MAX_BYTES"
DEFAULT_MAX_BYTES = 2 * 1024**3
"""The size cap when `KERMAC_CACHE_MAX_BYTES` is unset: 2 GiB (a cubin is 10 KiB to 1 MiB)."""
LAYOUT_VERSION = 1

_MAGIC = b"KERMACJIT\x00"
# magic (10 bytes) | layout version (uint32) | payload length (uint64) | sha256 of payload (32 bytes)
_HEADER = struct.Struct(f"<{len(_MAGIC)}sIQ32s")
_PAYLOAD_SUFFIX = ".bin"
_META_SUFFIX = ".json"
_TEMP_SUFFIX = ".tmp"
_KEY_CHARS = frozenset("0123456789abcdef")
# Temporary files older than this are left-overs of crashed writers; clear() and eviction remove them.
_STALE_TEMP_SECONDS = 3600.0
# A sidecar larger than this is not kermac's: reading it would only waste memory.
_MAX_META_BYTES = 1 << 20
# Latest `created` time accepted (9999-12-30 UTC): datetime can show it in every time zone.
_MAX_TIMESTAMP = 253402128000.0
# Where earlier kermac versions wrote generated Triton modules; clear() removes it.
_LEGACY_TRITON_DIR = "triton"
# Regular files only: a symbolic link fails to open, a FIFO opens without waiting for a writer.
_OPEN_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_BINARY", 0)
)


def cache_root() -> Path:
    """The cache's root directory: `$KERMAC_CACHE_DIR` or the user cache directory."""
    env = os.environ.get(ENV_CACHE_DIR, "").strip()
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("kermac", appauthor=False))


def cache_max_bytes() -> int | None:
    """The cache's size cap in bytes from `$KERMAC_CACHE_MAX_BYTES`; `None` means no cap.

    The variable holds a whole number of bytes (`_` separators allowed); `0` switches the cap
    off; unset or empty gives [`DEFAULT_MAX_BYTES`][kermac.jit_cache.DEFAULT_MAX_BYTES].  Anything else is reported once
    with `logger.warning` and the default applies.
    """
    raw = os.environ.get(ENV_CACHE_MAX_BYTES, "").strip()
    if not raw:
        return DEFAULT_MAX_BYTES
    digits = raw.replace("_", "")
    if not digits.isascii() or not digits.isdigit():
        _warn_once(
            f"kermac JIT cache: {ENV_CACHE_MAX_BYTES}={raw!r} is not a whole number of bytes "
            f"(e.g. {DEFAULT_MAX_BYTES} for 2 GiB, 0 for no limit); using the default, {DEFAULT_MAX_BYTES}"
        )
        return DEFAULT_MAX_BYTES
    return int(digits) or None


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

    It is the SHA-256 of a canonical encoding of: the kernel `source`; every included header
    (name -> contents; order-independent); the compiler `options` (order matters, as it does for
    compilers); the `compiler` name and `compiler_version`; the target `arch`; any `extra`
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
    """One cached compilation: its key, payload size in bytes and metadata (`None` if unreadable).

    The metadata is the validated sidecar: JSON values only, no NaN or infinity, and `created`
    (Unix time), `size` and `build_seconds` either valid or `None`.
    """

    key: str
    size: int
    meta: Mapping[str, object] | None


@dataclass(frozen=True)
class CacheInfo:
    """Summary of a cache.

    `path` is its directory, `count` the number of entries, `total_bytes` the bytes its files
    use on disk (including what earlier kermac versions left, see [`JitCache.clear`][kermac.jit_cache.JitCache.clear]),
    `max_bytes` its size cap (`None`: no cap) and `problems` one line per thing found that
    kermac did not write or does not trust (a symbolic link, a FIFO, a directory that is not
    private); [`JitCache.get`][kermac.jit_cache.JitCache.get] and [`JitCache.clear`][kermac.jit_cache.JitCache.clear]
    remove them.
    """

    path: Path
    count: int
    total_bytes: int
    max_bytes: int | None = None
    problems: tuple[str, ...] = ()


@dataclass
class _Entry:
    """The files of one key found by a scan, for eviction: their bytes and modification times."""

    paths: list[Path] = field(default_factory=list)
    size: int = 0
    payload_mtime: float | None = None
    sidecar_mtime: float = 0.0

    @property
    def last_used(self) -> float:
        """When the entry was last used: its payload's mtime (set by every hit), else its sidecar's."""
        return self.sidecar_mtime if self.payload_mtime is None else self.payload_mtime


@dataclass
class _Scan:
    """Regular files under `v1/` as `(path, lstat)`, and the problems found on the way."""

    files: list[tuple[Path, os.stat_result]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


class JitCache:
    """A directory of compiled kernels addressed by [`cache_key`][kermac.jit_cache.cache_key].

    `root` defaults to [`cache_root`][kermac.jit_cache.cache_root]; entries go to `root / f"v{LAYOUT_VERSION}"`
    (`path`).  Directories are created on the first [`put`][kermac.jit_cache.JitCache.put].  `max_bytes` caps the
    cache's size (`0`: no cap); `None` reads [`cache_max_bytes`][kermac.jit_cache.cache_max_bytes] at every store.
    """

    def __init__(self, root: str | os.PathLike[str] | None = None, *, max_bytes: int | None = None) -> None:
        if max_bytes is not None and (not isinstance(max_bytes, int) or isinstance(max_bytes, bool)):
            raise TypeError(f"max_bytes: expected an int or None, got {type(max_bytes).__name__}")
        if max_bytes is not None and max_bytes < 0:
            raise ValueError(f"max_bytes: expected a number of bytes >= 0 (0: no cap), got {max_bytes}")
        self.root = cache_root() if root is None else Path(root)
        self.path = self.root / f"v{LAYOUT_VERSION}"
        self._max_bytes = max_bytes

    def __repr__(self) -> str:
        return f"JitCache({str(self.root)!r})"

    @property
    def max_bytes(self) -> int | None:
        """The size cap in bytes now in force (`None`: no cap)."""
        if self._max_bytes is None:
            return cache_max_bytes()
        return self._max_bytes or None

    # -- entries ----------------------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        """The payload stored under `key`, or `None` if absent, truncated or corrupted.

        A damaged entry, or anything but a regular file in its place, is deleted (with its
        metadata) and reported through `logger.warning`.  A hit marks the entry as used now.
        """
        payload_path = self._payload_path(key)
        try:
            self._check_dirs(payload_path.parent, create=False)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except UnsafeDirectoryError as exc:
            _warn_once(f"kermac JIT cache: {exc}; compiling without the cache")
            return None
        except OSError as exc:
            logger.warning("kermac JIT cache: cannot use %s: %s", self.path, exc)
            return None
        try:
            blob = _read_regular(payload_path, touch=True)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except _NotRegularError as exc:
            logger.warning("kermac JIT cache: entry %s at %s is %s; removing it and rebuilding", key, payload_path, exc)
            self._discard(key)
            return None
        except OSError as exc:  # unreadable cache: compile instead of failing
            logger.warning("kermac JIT cache: cannot read entry %s at %s: %s", key, payload_path, exc)
            return None
        problem = _verify(blob)
        if problem is None:
            return blob[_HEADER.size :]
        logger.warning("kermac JIT cache: entry %s at %s is %s; deleting it and rebuilding", key, payload_path, problem)
        self._discard(key)
        return None

    def put(self, key: str, data: bytes, meta: Mapping[str, object] | None = None) -> None:
        """Store `data` under `key` atomically, with `meta` as a JSON sidecar, then enforce the cap.

        The sidecar also records `key`, `size` and `created` (Unix time).  Values of `meta`
        that JSON cannot encode are stored as their `str`; NaN and infinities as `null`.
        Raises `UnsafeDirectoryError` if the cache directory is not
        private to the user, and `OSError` if it cannot be written.
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"data: expected bytes, got {type(data).__name__}")
        if meta is not None and not isinstance(meta, Mapping):
            raise TypeError(f"meta: expected a mapping or None, got {type(meta).__name__}")
        data = bytes(data)
        payload_path = self._payload_path(key)
        self._check_dirs(payload_path.parent, create=True)
        header = _HEADER.pack(_MAGIC, LAYOUT_VERSION, len(data), hashlib.sha256(data).digest())
        document = _jsonable({**(meta or {}), "key": key, "size": len(data), "created": time.time()})
        sidecar = json.dumps(document, sort_keys=True, indent=1, default=str, allow_nan=False).encode("utf-8")
        _atomic_write(payload_path, (header, data))
        _atomic_write(self._meta_path(key), (sidecar,))
        self._enforce_cap()

    def get_or_build(
        self, key: str, build: Callable[[], bytes], *, meta: Mapping[str, object] | None = None
    ) -> tuple[bytes, bool]:
        """`(payload, hit)`: the cached payload, or `build()`'s result stored under `key`.

        On a miss the metadata gains `build_seconds`.  A failure to store (read-only or full
        disk, a directory that is not private) is logged as a warning and the freshly built
        payload is still returned.
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
        except UnsafeDirectoryError as exc:
            _warn_once(f"kermac JIT cache: {exc}; compiling without the cache")
        except OSError as exc:
            logger.warning("kermac JIT cache: could not store entry %s in %s: %s", key, self.path, exc)
        return data, False

    def entries(self) -> list[CacheEntry]:
        """Every entry of this cache (key, payload size, validated metadata), sorted by key.

        Empty if the cache directory cannot be used ([`info`][kermac.jit_cache.JitCache.info] says why).
        """
        try:
            files = self._scan().files
        except OSError:
            return []
        out = []
        for path, st in files:
            key = _key_of(path.name, _PAYLOAD_SUFFIX)
            if key is not None:
                out.append(CacheEntry(key, max(st.st_size - _HEADER.size, 0), self._read_meta(key)))
        return sorted(out, key=lambda e: e.key)

    def info(self) -> CacheInfo:
        """Directory, entries, bytes on disk, size cap and problems; never raises for a bad directory."""
        try:
            scan = self._scan()
        except OSError as exc:  # e.g. a root that is not private: say so instead of failing
            return CacheInfo(self.path, 0, 0, self.max_bytes, (str(exc),))
        count = sum(_key_of(p.name, _PAYLOAD_SUFFIX) is not None for p, _ in scan.files)
        total = sum(st.st_size for _, st in scan.files) + self._legacy_bytes()
        return CacheInfo(self.path, count, total, self.max_bytes, tuple(scan.problems))

    def clear(self) -> int:
        """Delete every entry, stale temporary files and the cache's debris; returns the entries removed.

        Temporary files younger than an hour are kept: they may belong to a writer that is about
        to rename them into place.  Anything that is not a regular file where kermac writes (a
        symbolic link, a FIFO, a directory, a shard directory that is not private) is removed
        and reported -- a symbolic link itself, never what it points to.  The generated Triton
        modules that earlier kermac versions wrote to `<root>/triton/` are removed too.
        Raises `UnsafeDirectoryError` if the root or `path` is not
        private to the user: kermac deletes nothing in a directory it does not trust.
        """
        scan = self._scan(repair=True)
        removed = 0
        now = time.time()
        for p, st in scan.files:
            if p.name.endswith(_TEMP_SUFFIX) and now - st.st_mtime < _STALE_TEMP_SECONDS:
                continue
            try:
                p.unlink()
            except FileNotFoundError:
                continue
            removed += _key_of(p.name, _PAYLOAD_SUFFIX) is not None
        if self.path.is_dir():
            for d in self.path.iterdir():
                with contextlib.suppress(OSError):  # not empty (a live temp file) or already gone
                    d.rmdir()
        self._clear_legacy()
        return removed

    # -- paths ------------------------------------------------------------------------------

    def _payload_path(self, key: str) -> Path:
        _check_key(key)
        return self.path / key[:2] / (key + _PAYLOAD_SUFFIX)

    def _meta_path(self, key: str) -> Path:
        _check_key(key)
        return self.path / key[:2] / (key + _META_SUFFIX)

    def _check_dirs(self, shard: Path, *, create: bool) -> None:
        """Make sure the root, `path` and `shard` are private (creating them if `create`).

        A shard that is not private lies inside the user's own private directory, so it is debris:
        it is reported and removed (and recreated if `create`; else FileNotFoundError, a miss).
        """
        ensure_private_dir(self.root, create=create)
        ensure_private_dir(self.path, create=create)
        try:
            ensure_private_dir(shard, create=create)
        except (UnsafeDirectoryError, NotADirectoryError) as exc:
            problem = exc.problem if isinstance(exc, UnsafeDirectoryError) else "is not a directory"
            logger.warning("kermac JIT cache: %s %s; removing it", shard, problem)
            _remove_any(shard)
            if not create:
                raise FileNotFoundError(errno.ENOENT, "removed an unsafe shard directory", str(shard)) from exc
            ensure_private_dir(shard, create=True)

    def _discard(self, key: str) -> None:
        """Remove `key`'s payload and sidecar, whatever kind of file they are."""
        for p in (self._payload_path(key), self._meta_path(key)):
            _remove_any(p)

    def _scan(self, *, repair: bool = False) -> _Scan:
        """The regular files in the shards of `path`, and what else was found there.

        Nothing is followed: a shard that is a symbolic link or not private, and anything in a
        shard that is not a regular file, is listed in `problems` -- and, if `repair`,
        removed (a shard its owner cannot open gets its permissions back instead).  Raises
        `UnsafeDirectoryError` if the root or `path` is not
        private.
        """
        scan = _Scan()
        try:
            ensure_private_dir(self.root, create=False)
            ensure_private_dir(self.path, create=False)
        except FileNotFoundError:
            return scan
        for shard in _listdir(self.path):
            if len(shard.name) != 2 or not _KEY_CHARS.issuperset(shard.name):
                continue  # not kermac's: left alone
            st = _lstat(shard)
            if st is None:  # removed by a concurrent clear()
                continue
            problem = private_problem(st)
            if problem is not None:
                scan.problems.append(f"{shard} {problem}")
                if repair:
                    logger.warning("kermac JIT cache: %s %s; removing it (not what it points to)", shard, problem)
                    _remove_any(shard)
                continue
            try:
                if repair:
                    ensure_private_dir(shard, create=False)  # restores a shard its owner cannot open
                children = _listdir(shard)
            except FileNotFoundError:
                continue
            except OSError as exc:
                scan.problems.append(f"{shard} cannot be listed: {exc.strerror}")
                continue
            for p in children:
                try:
                    st = p.lstat()
                except FileNotFoundError:  # removed by a concurrent clear() or eviction
                    continue
                if stat.S_ISREG(st.st_mode):
                    scan.files.append((p, st))
                    continue
                scan.problems.append(f"{p} is {_kind(st.st_mode)}, not a regular file")
                if repair:
                    logger.warning("kermac JIT cache: %s is %s; removing it", p, _kind(st.st_mode))
                    _remove_any(p)
        return scan

    def _enforce_cap(self) -> None:
        """Delete least recently used entries (and stale temporary files) until the cache fits its cap.

        Temporary files of live writers are neither counted nor touched.  An entry used again
        between the scan and its deletion (a newer modification time) is kept.
        """
        cap = self.max_bytes
        if cap is None:
            return
        try:
            scan = self._scan()
        except OSError as exc:  # the entry is stored; the cap is enforced by the next store
            logger.warning("kermac JIT cache: could not scan %s to enforce its size cap: %s", self.path, exc)
            return
        now = time.time()
        stale: list[tuple[Path, int]] = []
        entries: dict[str, _Entry] = {}
        for p, st in scan.files:
            if p.name.endswith(_TEMP_SUFFIX):
                if now - st.st_mtime >= _STALE_TEMP_SECONDS:
                    stale.append((p, st.st_size))
                continue
            payload_key = _key_of(p.name, _PAYLOAD_SUFFIX)
            key = payload_key or _key_of(p.name, _META_SUFFIX)
            if key is None:
                continue  # not kermac's: neither counted nor deleted
            entry = entries.setdefault(key, _Entry())
            entry.paths.append(p)
            entry.size += st.st_size
            if payload_key is None:
                entry.sidecar_mtime = st.st_mtime
            else:
                entry.payload_mtime = st.st_mtime
        total = sum(e.size for e in entries.values()) + sum(size for _, size in stale)
        if total <= cap:
            return
        for p, size in stale:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
            total -= size
        evicted = freed = 0
        for key, entry in sorted(entries.items(), key=lambda item: (item[1].last_used, item[0])):
            if total <= cap:
                break
            if entry.payload_mtime is not None and _mtime(self._payload_path(key)) not in (entry.payload_mtime, None):
                continue  # a hit or a rewrite since the scan: no longer the least recently used
            for p in sorted(entry.paths, key=lambda q: not q.name.endswith(_PAYLOAD_SUFFIX)):  # payload first
                with contextlib.suppress(FileNotFoundError, PermissionError):  # Windows: open elsewhere
                    p.unlink()
            total -= entry.size
            freed += entry.size
            evicted += 1
        logger.debug("kermac JIT cache: evicted %d entries (%d bytes) to stay under %d bytes", evicted, freed, cap)

    def _read_meta(self, key: str) -> Mapping[str, object] | None:
        try:
            raw = _read_regular(self._meta_path(key), limit=_MAX_META_BYTES)
            document = json.loads(raw.decode("utf-8"), parse_float=_finite_float, parse_constant=lambda _: None)
        except (OSError, _NotRegularError, ValueError, RecursionError):
            return None
        return _clean_meta(document) if isinstance(document, dict) else None

    # -- what earlier kermac versions wrote --------------------------------------------------

    def _legacy_bytes(self) -> int:
        legacy = self.root / _LEGACY_TRITON_DIR
        st = _lstat(legacy)
        if st is None or not stat.S_ISDIR(st.st_mode):  # lstat: a symbolic link is not counted
            return 0
        total = 0
        for directory, _, names in os.walk(legacy):  # does not follow symbolic links
            for name in names:
                with contextlib.suppress(OSError):
                    st = os.lstat(os.path.join(directory, name))
                    total += st.st_size if stat.S_ISREG(st.st_mode) else 0
        return total

    def _clear_legacy(self) -> None:
        legacy = self.root / _LEGACY_TRITON_DIR
        if os.path.lexists(legacy):
            _remove_any(legacy)


_default_lock = threading.Lock()
_default: JitCache | None = None
_warned: set[str] = set()
_warned_lock = threading.Lock()


def default_cache() -> JitCache:
    """The process-wide cache at [`cache_root`][kermac.jit_cache.cache_root] (a new one if `KERMAC_CACHE_DIR`
    changed)."""
    global _default
    root = cache_root()
    with _default_lock:
        if _default is None or _default.root != root:
            _default = JitCache(root)
        return _default


class _NotRegularError(Exception):
    """A path in the cache is not a regular file; the message says what it is instead."""


def _kind(mode: int) -> str:
    kinds = [
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ]
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def _read_regular(path: Path, *, touch: bool = False, limit: int | None = None) -> bytes:
    """The whole content of the regular file `path`, read through one descriptor.

    Raises `_NotRegularError` for anything else (never following a symbolic link, never
    waiting on a FIFO), `ValueError` if it is longer than `limit`.  `touch` sets its
    access and modification times to now (its last use, for eviction) where the file allows.
    """
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        raise
    except OSError:
        st = _lstat(path)
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise _NotRegularError(_kind(st.st_mode)) from None
        raise
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _NotRegularError(_kind(st.st_mode))
        if limit is not None and st.st_size > limit:
            raise ValueError(f"{path} has {st.st_size} bytes, more than {limit}")
        data = f.read()
        if touch:
            with contextlib.suppress(OSError):  # a read-only cache still serves hits
                os.utime(fd if os.utime in os.supports_fd else path)
    return data


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def _mtime(path: Path) -> float | None:
    st = _lstat(path)
    return None if st is None else st.st_mtime


def _listdir(directory: Path) -> list[Path]:
    """The entries of `directory`, sorted by name."""
    with os.scandir(directory) as it:
        return sorted(Path(e.path) for e in it)


def _remove_any(path: Path) -> None:
    """Remove `path` whatever it is; a symbolic link itself, a directory with what it holds
    (`shutil.rmtree` does not follow links inside it).  Failures are logged, not raised."""
    try:
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        logger.warning("kermac JIT cache: could not remove %s: %s", path, exc)


def _key_of(name: str, suffix: str) -> str | None:
    """The key in a file name `<key><suffix>`, or `None` if `name` is not one."""
    if not name.endswith(suffix):
        return None
    key = name[: -len(suffix)]
    return key if _is_key(key) else None


def _finite_float(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None


def _jsonable(value: object) -> object:
    """`value` with NaN and infinities (anywhere in dicts, lists and tuples) replaced by `None`."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k if isinstance(k, str) else str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _clean_meta(document: dict[str, object]) -> dict[str, object]:
    """A sidecar with its fields that kermac interprets made `None` when out of range."""
    checks: dict[str, Callable[[object], bool]] = {
        "created": lambda v: _real(v) and 0 <= v <= _MAX_TIMESTAMP,
        "build_seconds": lambda v: _real(v) and 0 <= v < math.inf,
        "size": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
    }
    return {k: (v if k not in checks or checks[k](v) else None) for k, v in document.items()}


def _warn_once(message: str) -> None:
    """`logger.warning(message)`, once per process (a bad setting would otherwise repeat per kernel)."""
    with _warned_lock:
        if message in _warned:
            return
        _warned.add(message)
    logger.warning("%s", message)


def _verify(blob: bytes) -> str | None:
    """`None` if `blob` is a well-formed entry, else what is wrong with it."""
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
    """Write `chunks` to `path` so that readers see the old file or the complete new one.

    A directory in the way (which `os.replace` cannot replace) is reported and removed.
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=_TEMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.replace(tmp, path)
        except IsADirectoryError:
            logger.warning("kermac JIT cache: %s is a directory, not a regular file; replacing it", path)
            _remove_any(path)
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
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_DIRECTORY", 0))
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
