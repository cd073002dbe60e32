"""scripts/dev.py ``wheels --check`` installs the example plugin with its README's one pip command, runs its
tests from its directory and requires ``kermac info`` to list its backend (commands recorded, not run)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def dev(monkeypatch: pytest.MonkeyPatch) -> object:
    """scripts/dev.py as a module, its commands recorded instead of run."""
    spec = importlib.util.spec_from_file_location("kermac_dev_script", ROOT / "scripts" / "dev.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.ran = []
    monkeypatch.setattr(module, "run", lambda cmd, what, cwd=module.ROOT: module.ran.append((cmd, cwd)))
    return module


def _info(monkeypatch: pytest.MonkeyPatch, dev: object, backends: list[dict]) -> None:
    """`kermac info --json` answers with `backends`."""
    answer = subprocess.CompletedProcess([], 0, json.dumps({"backends": backends}), "")
    monkeypatch.setattr(dev.subprocess, "run", lambda cmd, **kwargs: answer)


NUMPY_ROW = {"name": "numpy", "available": True, "broken": False, "distribution": "kermac-backend-numpy"}


def test_the_readme_command_installs_the_example_and_its_tests_run_from_its_directory(
    dev: object, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _info(monkeypatch, dev, [NUMPY_ROW])
    env_py, env_bin = tmp_path / "bin" / "python", tmp_path / "bin"
    dev.check_example_plugin(Path("/dev-venv/bin/python"), env_py, env_bin)
    (install, install_cwd), (tests, tests_cwd) = dev.ran
    assert install[:5] == ["/dev-venv/bin/python", "-m", "pip", "--python", str(env_py)] and install_cwd == ROOT
    readme = (dev.EXAMPLE_PLUGIN / "README.md").read_text()
    package = install[-1]
    assert f"pip install {package} " in readme and install[5:-1] == ["install", "--no-deps", "--ignore-installed"]
    assert (ROOT / package).resolve() == dev.EXAMPLE_PLUGIN
    assert tests[:3] == [str(env_py), "-m", "pytest"] and tests[-1] == "tests" and tests_cwd == dev.EXAMPLE_PLUGIN
    assert 'conformance_tests("numpy"' in (dev.EXAMPLE_PLUGIN / "tests" / "test_conformance.py").read_text()


@pytest.mark.parametrize(
    "rows", [[], [dict(NUMPY_ROW, available=False)], [dict(NUMPY_ROW, broken=True)], [dict(NUMPY_ROW, name="np")]]
)
def test_kermac_info_must_list_the_backend_available(
    dev: object, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, rows: list[dict], capsys: pytest.CaptureFixture
) -> None:
    _info(monkeypatch, dev, rows)
    with pytest.raises(SystemExit):
        dev.check_example_plugin(Path("python"), tmp_path / "python", tmp_path)
    assert "does not list the example's backend 'numpy' as available" in capsys.readouterr().err
