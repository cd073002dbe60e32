"""scripts/dev.py: what it says about its command line (no set-up is run), and the parts of ``compile-floor`` that
need no installation: its stamp, the test modules it runs and the plugin that keeps their cubin tests."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import cubin_only
import pytest

DEV = Path(__file__).resolve().parents[1] / "scripts" / "dev.py"


def dev(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(DEV), *argv], capture_output=True, text=True, timeout=60)


def test_an_unknown_command_is_named_with_the_expected_ones() -> None:
    result = dev("tset")
    assert result.returncode == 2 and result.stdout == ""
    assert (
        "unknown command 'tset'; expected one of setup, test, bench, docs, wheels, compile-floor, torch"
        in result.stderr
    )


@pytest.mark.parametrize("argv", [(), ("--help",), ("-h",)])
def test_help_prints_the_usage(argv: tuple[str, ...]) -> None:
    result = dev(*argv)
    assert result.returncode == 0 and "python3 scripts/dev.py setup [--force]" in result.stdout


def _dev_module():
    spec = importlib.util.spec_from_file_location("kermac_dev_script", DEV)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_floor_triton_is_reused_while_its_stamp_holds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stamped directory is not installed again; a stale stamp (another Triton) reinstalls into a cleared one."""
    dev_script = _dev_module()
    floor = tmp_path / ".venv-triton-floor"
    floor.mkdir()
    monkeypatch.setattr(dev_script, "ROOT", tmp_path)
    monkeypatch.setattr(dev_script, "FLOOR_DIR", floor)
    monkeypatch.setattr(dev_script, "FLOOR_STAMP", floor / "stamp")
    installs = []

    def pip_install(cmd: list[str], what: str) -> None:
        installs.append(cmd)
        floor.mkdir()  # as pip --target does

    monkeypatch.setattr(dev_script, "run", pip_install)
    (floor / "stamp").write_text(dev_script.floor_stamp())
    dev_script.install_floor_triton(Path("python"))
    assert installs == []
    (floor / "stamp").write_text(dev_script.floor_stamp().replace(dev_script.TRITON_FLOOR, "3.2.0"))
    (floor / "leftover").write_text("")
    dev_script.install_floor_triton(Path("python"))
    assert len(installs) == 1 and installs[0][-3:] == ["--target", str(floor), f"triton=={dev_script.TRITON_FLOOR}"]
    assert (floor / "stamp").read_text() == dev_script.floor_stamp() and not (floor / "leftover").exists()


def test_the_floor_triton_is_the_packages_floor() -> None:
    """The Triton compile-floor installs is the oldest kermac-backend-triton accepts."""
    pyproject = DEV.parents[1] / "packages" / "kermac-backend-triton" / "pyproject.toml"
    assert f'"triton>={_dev_module().TRITON_FLOOR.rsplit(".", 1)[0]};' in pyproject.read_text()


def test_compile_floor_runs_every_module_that_compiles_cubins() -> None:
    dev_script = _dev_module()
    files = dev_script.cubin_test_files()
    assert "tests/backend_triton/test_product_triton.py" in files and "tests/test_triton_codegen.py" in files
    assert "tests/test_dev_script.py" not in files
    assert dev_script.CUBIN_CALL == cubin_only.CALL  # the script reads the tests as text, the plugin imports them
    assert all(dev_script.CUBIN_CALL in (DEV.parents[1] / f).read_text() for f in files)


CUBIN_MODULE = """
import pytest
from cubin_jobs import CALL


@pytest.fixture
def reports():
    return CALL(None, [])


@pytest.fixture
def through(reports):
    return reports


def test_uses_the_fixture(reports): ...
def test_through_another_fixture(through): ...
def test_calls_it_itself(): CALL
def test_interpreted(): ...
"""


def test_the_cubin_plugin_keeps_the_tests_that_compile(tmp_path: Path) -> None:
    """``-p cubin_only`` keeps the tests that call the compiling function (themselves or through fixtures).  The
    sample names it through ``CUBIN_CALL`` so that this module is not one compile-floor runs."""
    (tmp_path / "test_sample.py").write_text(CUBIN_MODULE.replace("CALL", _dev_module().CUBIN_CALL))
    tests = str(DEV.parents[1] / "tests")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "pytest", "-p", "cubin_only", "-p", "no:cacheprovider", "--collect-only", "-q"]
    done = subprocess.run([*cmd, "test_sample.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    kept = sorted(line.split("::")[1] for line in done.stdout.splitlines() if "::" in line)
    assert kept == ["test_calls_it_itself", "test_through_another_fixture", "test_uses_the_fixture"], done.stdout
    assert "3/4 tests collected (1 deselected)" in done.stdout, done.stdout
