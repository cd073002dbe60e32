"""Generated Triton modules execute exactly the text kermac generated, and nothing read from disk.

The attacks: a bytecode file (``__pycache__/*.pyc``) planted beside a generated module,
or in the shared ``$TMPDIR/kermac-triton`` the backend used to fall back to, ran in the user's
process while the ``.py`` stayed byte-identical; a corrupted one made every Triton call fail.
Each test plants such a file where the old loader looked and checks it never runs.  The kernel
runs through Triton's CPU interpreter (``TRITON_INTERPRET=1``, set by conftest) here.
"""

from __future__ import annotations

import importlib.util
import inspect
import linecache
import os
import py_compile
import struct
import sys
import tempfile
import uuid
from pathlib import Path

import pytest
import torch

from kermac import jit_cache

modules = pytest.importorskip("kermac_backend_triton.modules")
triton = pytest.importorskip("triton")

KERNEL = '''\
"""A generated module ({tag})."""
import triton
import triton.language as tl


@triton.jit
def add_one(X, OUT, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    tl.store(OUT + i, tl.load(X + i, mask=mask) + 1.0, mask=mask)
'''

PLANTED = """\
from pathlib import Path
Path({marker!r}).write_text("planted code ran")

def add_one(*args, **kwargs):
    raise SystemExit("planted")
"""


@pytest.fixture(autouse=True)
def _isolated_dirs(tmp_path, monkeypatch):
    """A private cache root and a private temporary directory for every test."""
    monkeypatch.setenv(jit_cache.ENV_CACHE_DIR, str(tmp_path / "cache"))
    shared = tmp_path / "shared-tmp"
    shared.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(shared))


def fresh_source() -> str:
    """Kernel source no other test (or earlier run) has loaded in this process."""
    return KERNEL.format(tag=uuid.uuid4().hex)


def old_module_paths(source: str) -> list[Path]:
    """Where kermac used to write the generated module: the cache, then the shared fallback."""
    name = f"kermac_triton_{modules.hashlib.sha256(source.encode()).hexdigest()[:32]}.py"
    return [
        jit_cache.cache_root() / "triton" / name,
        Path(tempfile.gettempdir()) / "kermac-triton" / name,
    ]


def plant(module_path: Path, source: str, pyc_body: bytes | None, marker: Path) -> Path:
    """The verified ``.py`` at ``module_path`` and, beside it, a bytecode file the loader trusts.

    ``pyc_body=None`` plants compiled attacker code as an unchecked-hash pyc (never compared with
    the source); bytes plant a pyc with a valid unchecked-hash header and that (corrupt) body.
    """
    module_path.parent.mkdir(parents=True, exist_ok=True)
    module_path.write_text(source, encoding="utf-8")
    pyc = Path(importlib.util.cache_from_source(str(module_path)))
    pyc.parent.mkdir(parents=True, exist_ok=True)
    if pyc_body is None:
        evil = module_path.parent / "evil_source.py"
        evil.write_text(PLANTED.format(marker=str(marker)), encoding="utf-8")
        py_compile.compile(
            str(evil), cfile=str(pyc), doraise=True, invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH
        )
        evil.unlink()
    else:
        flags = 0b01  # hash-based, check_source off: the loader never compares it with the .py
        header = importlib.util.MAGIC_NUMBER + struct.pack("<I", flags) + b"\0" * 8
        pyc.write_bytes(header + pyc_body)
    return pyc


def run_add_one(module) -> None:
    """Run the module's kernel: on the GPU, or through the interpreter on the CPU."""
    gpu = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
    x = torch.arange(37, dtype=torch.float32, device="cuda" if gpu else "cpu")
    out = torch.full_like(x, float("nan"))
    module.add_one[(triton.cdiv(x.numel(), 16),)](x, out, x.numel(), BLOCK=16)
    torch.testing.assert_close(out, x + 1.0, rtol=0, atol=0)


# -- planted bytecode -----------------------------------------------------------------------


def test_planted_pyc_beside_the_module_does_not_run(tmp_path):
    source = fresh_source()
    marker = tmp_path / "pwned"
    plant(old_module_paths(source)[0], source, None, marker)
    module = modules.load_module(source)
    assert not marker.exists(), "a planted unchecked-hash pyc ran"
    run_add_one(module)
    assert not marker.exists()


def test_planted_pyc_in_the_shared_fallback_directory_does_not_run(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-directory"
    blocker.write_bytes(b"")
    monkeypatch.setenv(jit_cache.ENV_CACHE_DIR, str(blocker / "cache"))  # the cache cannot be written
    source = fresh_source()
    marker = tmp_path / "pwned"
    plant(old_module_paths(source)[1], source, None, marker)
    module = modules.load_module(source)
    assert not marker.exists(), "a pyc planted in the shared temporary directory ran"
    run_add_one(module)


@pytest.mark.parametrize("body", [b"", b"\xff" * 64, b"\xe3garbage"], ids=["empty", "junk", "bad-marshal"])
def test_a_corrupted_pyc_does_not_break_triton_calls(tmp_path, body):
    source = fresh_source()
    for path in old_module_paths(source):
        plant(path, source, body, tmp_path / "unused")
    run_add_one(modules.load_module(source))


def test_nothing_is_written_to_disk(tmp_path):
    module = modules.load_module(fresh_source())
    run_add_one(module)
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.name != "shared-tmp")
    assert written == [], "generated source must not be written where others (or a loader) could reach it"


def test_the_module_executes_exactly_the_verified_text(monkeypatch):
    source = fresh_source()
    compiled = []
    real_compile = compile

    def spy(text, filename, mode, *args, **kwargs):
        compiled.append((text, filename, mode))
        return real_compile(text, filename, mode, *args, **kwargs)

    monkeypatch.setattr(modules, "compile", spy, raising=False)
    module = modules.load_module(source)
    assert [(t, m) for t, _, m in compiled] == [(source, "exec")]
    assert module.__name__ in sys.modules and sys.modules[module.__name__] is module
    assert not hasattr(module, "__cached__") or module.__cached__ is None
    assert modules.load_module(source) is module  # once per source per process


# -- inspect / linecache: what triton.jit reads -------------------------------------------------


def test_getsource_works_and_survives_linecache_maintenance():
    source = fresh_source()
    module = modules.load_module(source)
    fn = module.add_one.fn
    filename = fn.__code__.co_filename
    assert filename.startswith("<") and filename.endswith(">")  # never looked up on disk
    assert "".join(inspect.getsourcelines(fn)[0]) in source
    assert inspect.getmodule(fn) is module
    linecache.checkcache()  # drops entries whose file changed on disk; ours has none
    assert "".join(linecache.getlines(filename)) == source
    linecache.clearcache()  # e.g. a debugger or a traceback helper: the next load registers it again
    assert modules.load_module(source) is module
    assert "".join(linecache.getlines(filename)) == source
    run_add_one(module)


def test_a_file_named_like_the_module_in_the_working_directory_is_never_read(tmp_path, monkeypatch):
    source = fresh_source()
    module = modules.load_module(source)
    filename = module.add_one.fn.__code__.co_filename
    monkeypatch.chdir(tmp_path)
    (tmp_path / filename).write_text("def add_one(X, OUT, n, BLOCK):\n    import os; os._exit(9)\n")
    linecache.checkcache()
    linecache.clearcache()
    modules.load_module(source)
    assert inspect.getsource(module.add_one.fn) in source
    run_add_one(module)


def test_compiled_triton_function_keys_match_a_module_on_disk(tmp_path, monkeypatch):
    """Triton's binary cache key depends on the text, not the file: ~/.triton/cache still hits."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # real triton.jit functions (compiling needs no GPU here)
    source = fresh_source()
    generated = modules.load_module(source).add_one
    assert isinstance(generated, triton.runtime.JITFunction)
    reference_path = tmp_path / "reference_kernel_module.py"
    reference_path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("reference_kernel_module", reference_path)
    reference = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = reference
    try:
        spec.loader.exec_module(reference)
    finally:
        del sys.modules[spec.name]
    assert generated.src == reference.add_one.src
    assert generated.cache_key == reference.add_one.cache_key


def test_loading_needs_no_writable_directory(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    monkeypatch.setenv(jit_cache.ENV_CACHE_DIR, str(blocker / "cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(blocker / "tmp"))
    run_add_one(modules.load_module(fresh_source()))
    assert sorted(os.listdir(tmp_path)) == ["file", "shared-tmp"]
