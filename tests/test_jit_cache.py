"""The on-disk JIT cache: content keys, round trips, corruption, concurrency, location."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import kermac.jit_cache as jc
from kermac.jit_cache import JitCache, cache_key

KEY_ARGS = dict(
    source="__global__ void k() {}",
    headers={"a.h": "#define A 1", "b.h": "#define B 2"},
    options=("-O3", "--use_fast_math"),
    compiler="nvrtc",
    compiler_version="12.8",
    arch="sm_90",
    extra={"ptx_isa": "8.7"},
)


@pytest.fixture(autouse=True)
def _isolated_cache_dir(tmp_path, monkeypatch):
    """Never let a test reach the user's real cache."""
    monkeypatch.setenv(jc.ENV_CACHE_DIR, str(tmp_path / "default-cache"))


@pytest.fixture
def cache(tmp_path) -> JitCache:
    return JitCache(tmp_path / "cache")


def _key(**changes) -> str:
    return cache_key(**{**KEY_ARGS, **changes})


# -- keys -----------------------------------------------------------------------------------


def test_key_is_sha256_hex_and_deterministic():
    k = _key()
    assert len(k) == 64 and all(c in "0123456789abcdef" for c in k)
    assert _key() == k


@pytest.mark.parametrize(
    "change",
    [
        {"source": "__global__ void k() { }"},
        {"headers": {"a.h": "#define A 1", "b.h": "#define B 3"}},
        {"headers": {"a.h": "#define A 1", "c.h": "#define B 2"}},
        {"headers": {"a.h": "#define A 1"}},
        {"options": ("-O3",)},
        {"options": ("--use_fast_math", "-O3")},
        {"compiler": "nvcc"},
        {"compiler_version": "12.9"},
        {"arch": "sm_80"},
        {"extra": {"ptx_isa": "8.8"}},
        {"extra": {}},
    ],
)
def test_key_changes_when_any_input_changes(change):
    assert _key(**change) != _key()


def test_key_changes_with_kermac_version(monkeypatch):
    before = _key()
    monkeypatch.setattr(jc, "__version__", "999.0")
    assert _key() != before


def test_key_ignores_header_insertion_order():
    assert _key(headers={"b.h": "#define B 2", "a.h": "#define A 1"}) == _key()


@pytest.mark.parametrize(
    ("left", "right"),
    [
        ({"source": "ab", "options": ()}, {"source": "a", "options": ("b",)}),
        ({"options": ("-a", "b")}, {"options": ("-a b",)}),
        ({"headers": {"a": "bc"}}, {"headers": {"ab": "c"}}),
        ({"compiler": "nv", "compiler_version": "rtc1"}, {"compiler": "nvrtc", "compiler_version": "1"}),
    ],
)
def test_key_encoding_is_unambiguous(left, right):
    assert _key(**left) != _key(**right)


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"source": b"x"}, "source"),
        ({"arch": 90}, "arch"),
        ({"options": "-O3"}, "options"),
        ({"options": ("-O3", 3)}, "options[1]"),
        ({"headers": {"a.h": b"x"}}, "headers"),
        ({"extra": ["x"]}, "extra"),
    ],
)
def test_key_rejects_bad_types_naming_the_argument(change, needle):
    with pytest.raises(TypeError, match=f"^{re.escape(needle)}:"):
        _key(**change)


# -- round trip, metadata, info, clear ------------------------------------------------------


def test_round_trip_and_metadata(cache):
    key = _key()
    data = os.urandom(4096)
    assert cache.get(key) is None
    cache.put(key, data, {"arch": "sm_90", "options": ["-O3"], "ptxas": "16 registers"})
    assert cache.get(key) == data
    (entry,) = cache.entries()
    assert entry.key == key and entry.size == len(data)
    assert entry.meta["arch"] == "sm_90" and entry.meta["options"] == ["-O3"]
    assert entry.meta["ptxas"] == "16 registers" and entry.meta["size"] == len(data)
    assert abs(entry.meta["created"] - time.time()) < 60
    assert cache.path == cache.root / f"v{jc.LAYOUT_VERSION}"


def test_empty_payload_round_trips(cache):
    cache.put(_key(), b"")
    assert cache.get(_key()) == b""


def test_get_or_build_builds_once(cache, caplog):
    calls = []

    def build() -> bytes:
        calls.append(1)
        return b"cubin-bytes"

    caplog.set_level(logging.DEBUG, logger="kermac")
    key = _key()
    assert cache.get_or_build(key, build, meta={"arch": "sm_90"}) == (b"cubin-bytes", False)
    assert cache.get_or_build(key, build) == (b"cubin-bytes", True)
    assert len(calls) == 1
    (entry,) = cache.entries()
    assert entry.meta["arch"] == "sm_90" and entry.meta["build_seconds"] >= 0
    messages = [r.getMessage() for r in caplog.records if r.name == "kermac"]
    assert any("miss" in m and key in m for m in messages)
    assert any("hit" in m and key in m for m in messages)


def test_get_or_build_rejects_non_bytes(cache):
    with pytest.raises(TypeError, match=r"^build"):
        cache.get_or_build(_key(), lambda: "not bytes")


def test_get_or_build_survives_unwritable_cache(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    cache = JitCache(blocker)  # a file where the directory should be: every put fails
    caplog.set_level(logging.WARNING, logger="kermac")
    assert cache.get_or_build(_key(), lambda: b"data") == (b"data", False)
    assert any("could not store" in r.getMessage() for r in caplog.records)


def test_put_rejects_bad_arguments(cache):
    with pytest.raises(ValueError, match=r"^key"):
        cache.put("../../etc/passwd", b"x")
    with pytest.raises(ValueError, match=r"^key"):
        cache.get("ABC")
    with pytest.raises(TypeError, match=r"^data"):
        cache.put(_key(), "text")
    with pytest.raises(TypeError, match=r"^meta"):
        cache.put(_key(), b"x", meta=[1])


def test_info_and_clear(cache):
    assert cache.info().count == 0 and cache.info().total_bytes == 0
    keys = [_key(source=f"s{i}") for i in range(5)]
    for i, k in enumerate(keys):
        cache.put(k, bytes(100 * (i + 1)), {"i": i})
    info = cache.info()
    assert info.path == cache.path and info.count == 5
    on_disk = sum(p.stat().st_size for p in cache.path.rglob("*") if p.is_file())
    assert info.total_bytes == on_disk and on_disk > sum(100 * (i + 1) for i in range(5))
    assert sorted(e.key for e in cache.entries()) == sorted(keys)
    assert {e.key: e.size for e in cache.entries()} == {k: 100 * (i + 1) for i, k in enumerate(keys)}
    assert cache.clear() == 5
    assert cache.info().count == 0 and cache.info().total_bytes == 0
    assert all(cache.get(k) is None for k in keys)
    assert cache.clear() == 0


def test_clear_keeps_fresh_temp_files_and_removes_stale_ones(cache):
    cache.put(_key(), b"x")
    shard = cache._payload_path(_key()).parent
    fresh = shard / ".fresh.tmp"
    stale = shard / ".stale.tmp"
    fresh.write_bytes(b"partial")
    stale.write_bytes(b"partial")
    old = time.time() - 2 * jc._STALE_TEMP_SECONDS
    os.utime(stale, (old, old))
    assert cache.clear() == 1
    assert fresh.exists() and not stale.exists()


def test_unreadable_sidecar_gives_no_metadata(cache):
    cache.put(_key(), b"x", {"a": 1})
    cache._meta_path(_key()).write_text("{not json")
    (entry,) = cache.entries()
    assert entry.meta is None and cache.get(_key()) == b"x"


def test_other_layout_versions_are_not_read(cache, monkeypatch):
    cache.put(_key(), b"old format")
    monkeypatch.setattr(jc, "LAYOUT_VERSION", jc.LAYOUT_VERSION + 1)
    newer = JitCache(cache.root)
    assert newer.path != cache.path
    assert newer.get(_key()) is None and newer.info().count == 0


# -- corruption -----------------------------------------------------------------------------


def _flip(path: Path, offset: int) -> None:
    blob = bytearray(path.read_bytes())
    blob[offset] ^= 0x01
    path.write_bytes(bytes(blob))


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda p: _flip(p, p.stat().st_size - 1), "checksum"),  # last payload byte
        (lambda p: _flip(p, jc._HEADER.size), "checksum"),  # first payload byte
        (lambda p: _flip(p, 0), "magic"),
        (lambda p: _flip(p, len(jc._MAGIC)), "layout version"),
        (lambda p: p.write_bytes(p.read_bytes()[:-1]), "truncated"),
        (lambda p: p.write_bytes(p.read_bytes()[:10]), "truncated"),
        (lambda p: p.write_bytes(b""), "truncated"),
        (lambda p: p.write_bytes(p.read_bytes() + b"\0"), "header says"),
    ],
)
def test_damaged_entry_is_a_logged_miss_and_is_rebuilt(cache, caplog, damage, reason):
    key = _key()
    data = hashlib.sha256(b"seed").digest() * 1000
    cache.put(key, data, {"arch": "sm_90"})
    damage(cache._payload_path(key))
    caplog.set_level(logging.WARNING, logger="kermac")
    rebuilt = []
    result = cache.get_or_build(key, lambda: rebuilt.append(1) or data)
    assert result == (data, False) and rebuilt == [1]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == "kermac"]
    assert len(warnings) == 1 and key in warnings[0] and reason in warnings[0]
    assert cache.get(key) == data  # the rebuilt entry is valid again
    assert cache.entries()[0].meta is not None


def test_damaged_entry_is_deleted_by_get(cache):
    key = _key()
    cache.put(key, b"payload", {"a": 1})
    _flip(cache._payload_path(key), jc._HEADER.size)
    assert cache.get(key) is None
    assert not cache._payload_path(key).exists() and not cache._meta_path(key).exists()


# -- performance ----------------------------------------------------------------------------


def test_hit_of_a_1mb_entry_is_fast(cache):
    key = _key()
    data = os.urandom(1 << 20)
    cache.put(key, data)
    times = []
    for _ in range(21):
        start = time.perf_counter()
        got, hit = cache.get_or_build(key, lambda: b"")
        times.append(time.perf_counter() - start)
        assert hit and got == data
    # Target 5 ms (measured ~1 ms on a laptop-class CPU); generous here for loaded CI machines.
    assert statistics.median(times) < 0.025


# -- location -------------------------------------------------------------------------------


def test_env_var_sets_location(tmp_path, monkeypatch):
    monkeypatch.setenv(jc.ENV_CACHE_DIR, str(tmp_path / "one"))
    first = jc.default_cache()
    assert first.root == tmp_path / "one" and jc.default_cache() is first
    first.put(_key(), b"x")
    assert (tmp_path / "one" / f"v{jc.LAYOUT_VERSION}").is_dir()
    monkeypatch.setenv(jc.ENV_CACHE_DIR, str(tmp_path / "two"))
    second = jc.default_cache()
    assert second.root == tmp_path / "two" and second.get(_key()) is None
    assert JitCache().root == tmp_path / "two"


def test_without_env_var_uses_platform_cache_dir(monkeypatch):
    import platformdirs

    monkeypatch.delenv(jc.ENV_CACHE_DIR, raising=False)
    assert jc.cache_root() == Path(platformdirs.user_cache_dir("kermac", appauthor=False))


# -- concurrency ----------------------------------------------------------------------------

_WORKER = textwrap.dedent(
    """
    import hashlib, logging, sys, time
    from kermac.jit_cache import JitCache
    from kermac.logs import logger

    role, root, key, index, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])

    def payload(i):
        return hashlib.sha256(str(i).encode()).digest() * (2000 + 97 * i)

    class Fail(logging.Handler):
        def emit(self, record):
            print("WARNING LOGGED:", record.getMessage(), flush=True)
            sys.exit(3)

    logger.addHandler(Fail(logging.WARNING))
    cache = JitCache(root)
    valid = {payload(i) for i in range(8)}
    seen = 0
    if role == "writer":
        for _ in range(rounds):
            cache.put(key, payload(index), {"writer": index})
            got = cache.get(key)
            if got not in valid:
                print("writer read an invalid entry", flush=True)
                sys.exit(1)
    else:
        done = __import__("pathlib").Path(root) / "writers-done"
        deadline = time.monotonic() + 120
        while not done.exists() and time.monotonic() < deadline:
            got = cache.get(key)
            if got is None:
                if seen:
                    print("entry vanished after being seen", flush=True)
                    sys.exit(1)
                continue
            if got not in valid:
                print("reader saw an invalid entry", flush=True)
                sys.exit(1)
            seen += 1
    print("ok", seen, flush=True)
    """
)


def test_concurrent_writers_and_readers_always_see_a_valid_entry(tmp_path):
    root = tmp_path / "shared"
    root.mkdir()
    key = _key()
    src = str(Path(jc.__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}

    def spawn(role: str, index: int) -> subprocess.Popen:
        argv = [sys.executable, "-c", _WORKER, role, str(root), key, str(index), "60"]
        return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    readers = [spawn("reader", 0) for _ in range(2)]
    writers = [spawn("writer", i) for i in range(4)]
    writer_out = [p.communicate(timeout=180)[0] for p in writers]
    (root / "writers-done").touch()
    reader_out = [p.communicate(timeout=180)[0] for p in readers]
    for p, out in zip(writers + readers, writer_out + reader_out, strict=True):
        assert p.returncode == 0 and out.startswith("ok"), out
    assert all(int(out.split()[1]) > 0 for out in reader_out)  # every reader saw the entry
    cache = JitCache(root)
    assert cache.get(key) in {hashlib.sha256(str(i).encode()).digest() * (2000 + 97 * i) for i in range(4)}
    assert cache.info().count == 1
    leftovers = [p.name for p in cache.path.rglob("*.tmp")]
    assert leftovers == []
