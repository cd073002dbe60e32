"""The stored performance history (``perf-history/``) is whole and matches the suites that publish it.

asv leaves a result out of the dashboard, silently, when its benchmark's ``version`` differs from
the suites' (``benchmarks.json``) or its commit is not on the branch; these checks fail instead.
"""

from __future__ import annotations

import importlib
import itertools
import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "perf-history" / "results"
GPU_MACHINE = "nvidia-h100-80gb-hbm3"
MIN_COMMITS = 12


def _result_files() -> list[Path]:
    return sorted(p for p in RESULTS.glob("*/*.json") if p.name != "machine.json")


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _suite_version(name: str) -> str:
    """The ``version`` attribute of ``module.Class.method`` in ``benchmarks/``."""
    module, cls, _ = name.split(".")
    return str(getattr(importlib.import_module(f"benchmarks.{module}"), cls).version)


def test_the_gpu_history_has_a_dozen_commits() -> None:
    commits = {_load(p)["commit_hash"] for p in (RESULTS / GPU_MACHINE).glob("*-*.json")}
    assert len(commits) >= MIN_COMMITS, f"{len(commits)} commits stored for {GPU_MACHINE}"


@pytest.mark.parametrize("path", _result_files(), ids=lambda p: f"{p.parent.name}/{p.name[:8]}")
def test_each_result_is_of_its_machine_and_of_a_commit_of_main(path: Path) -> None:
    result = _load(path)
    assert result["params"]["machine"] == path.parent.name
    assert _load(path.parent / "machine.json")["machine"] == path.parent.name
    sha = result["commit_hash"]
    assert path.name.startswith(sha[:8])
    inside = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True, text=True)
    if inside.returncode != 0 or inside.stdout.strip() == "true":
        pytest.skip("not a full git clone: the commits of main cannot be checked")
    first_parents = subprocess.run(
        ["git", "rev-list", "--first-parent", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert sha in first_parents, f"{sha[:10]} is not a commit of main's first-parent history"


@pytest.mark.parametrize("path", _result_files(), ids=lambda p: f"{p.parent.name}/{p.name[:8]}")
def test_each_row_is_shown_by_the_dashboard(path: Path) -> None:
    """Every stored row has the suites' current version and parameters the published layout knows."""
    suites = _load(RESULTS / "benchmarks.json")
    result = _load(path)
    columns = result["result_columns"]
    for name, values in result["results"].items():
        row = dict(zip(columns, values, strict=False))
        assert name in suites, f"{name} is not a benchmark of the published suites"
        assert row["version"] == suites[name]["version"] == _suite_version(name), name
        known = set(itertools.product(*suites[name]["params"]))
        timed = [c for c, v in zip(itertools.product(*row["params"]), row["result"], strict=True) if v is not None]
        assert timed and set(timed) <= known, f"{name}: rows the dashboard does not lay out"
