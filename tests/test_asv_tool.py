"""``tools/asv_suites.py``: quick mode fails on a broken suite, compare flags a > 5 % slowdown between commits,
history stores commits of main once each, publish builds the dashboard from them.

Each test builds a small git repository of its own (an asv configuration like the project's, one
package under ``packages/*/src`` and one benchmark) with the tool copied into it, and runs the
tool there as a user would, through asv itself.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("asv")

BENCH = """
    import time

    import slowmod


    class Sleep:
        number = 1
        repeat = (20, 20, 10.0)  # enough samples for asv to call a difference significant
        warmup_time = 0.0

        def time_sleep(self):
            time.sleep(slowmod.DELAY)
"""


def _git(repo: Path, *args: str) -> str:
    ident = ["-c", "user.name=test", "-c", "user.email=test@example.com"]
    return subprocess.run(["git", *ident, *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def _commit(repo: Path, delay: float, message: str) -> str:
    (repo / "packages" / "slow" / "src" / "slowmod.py").write_text(f"DELAY = {delay}\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", message)
    return _git(repo, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository like kermac's for asv: the project's asv.conf.json, the tool, a sleep benchmark."""
    root = tmp_path / "repo"
    (root / "tools").mkdir(parents=True)
    shutil.copy(ROOT / "tools" / "asv_suites.py", root / "tools")
    shutil.copy(ROOT / "asv.conf.json", root)
    (root / "perf-history").mkdir()
    shutil.copy(ROOT / "perf-history" / "asv.conf.json", root / "perf-history")
    (root / "benchmarks").mkdir()
    (root / "benchmarks" / "__init__.py").write_text("")
    (root / "benchmarks" / "bench_sleep.py").write_text(textwrap.dedent(BENCH))
    (root / "packages" / "slow" / "src").mkdir(parents=True)
    (root / ".gitignore").write_text(".asv/\ndocs/performance/dashboard/\n")
    _git(root, "init", "-q", "-b", "main")
    return root


def _tool(repo: Path, *args: str) -> subprocess.CompletedProcess:
    # asv keeps its machine description in ~/.asv-machine.json: a home of the test's own leaves the user's alone.
    home = repo.parent / "home"
    home.mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, str(repo / "tools" / "asv_suites.py"), *args],
        cwd=repo,
        env={**os.environ, "HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_compare_flags_a_slowdown_and_passes_a_speed_up(repo: Path) -> None:
    fast = _commit(repo, 0.002, "fast")
    slow = _commit(repo, 0.004, "slow")
    done = _tool(repo, "compare", fast, slow)
    assert done.returncode == 1, done.stdout + done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("|") and "time_sleep" in line]
    assert len(rows) == 1 and rows[0].startswith("| +"), done.stdout  # asv's mark of a slower row
    assert "slower by more than 1.05x" in done.stdout
    assert not (repo / ".asv" / "worktrees" / fast).exists()  # the checkouts are removed
    assert (repo.parent / "home" / ".asv-machine.json").exists()  # asv's defaults, taken without asking
    again = _tool(repo, "compare", slow, fast, "--no-run")  # stored results only: a speed-up
    assert again.returncode == 0, again.stdout + again.stderr
    rows = [line for line in again.stdout.splitlines() if line.startswith("|") and "time_sleep" in line]
    assert len(rows) == 1 and rows[0].startswith("| -"), again.stdout  # asv's mark of a faster row


def test_quick_fails_on_a_failing_benchmark(repo: Path) -> None:
    _commit(repo, 0.0, "no delay")
    # slowmod is importable only from the tree's packages/*/src; asv run's own options pass through.
    assert _tool(repo, "quick", "-b", "Sleep").returncode == 0
    (repo / "benchmarks" / "bench_sleep.py").write_text("def time_broken():\n    raise ValueError('broken')\n")
    done = _tool(repo, "quick")
    assert done.returncode != 0 and "broken" in done.stdout + done.stderr


def test_factor_must_exceed_one(repo: Path) -> None:
    done = _tool(repo, "compare", "HEAD", "HEAD", "--factor", "0.95")
    assert done.returncode == 2 and "--factor: expected a ratio > 1" in done.stderr


def _stored(repo: Path, machine: str) -> list[str]:
    return sorted(p.name[:8] for p in (repo / "perf-history" / "results" / machine).glob("*-*.json"))


def test_history_times_each_commit_once_and_publish_builds_the_dashboard(repo: Path) -> None:
    first = _commit(repo, 0.0, "first")
    second = _commit(repo, 0.001, "second")
    assert _tool(repo, "publish").returncode == 2  # nothing stored yet: said, not an empty dashboard
    done = _tool(repo, "history", first, second, "--machine", "gpu-test", "-b", "time_sleep")
    assert done.returncode == 0, done.stdout + done.stderr
    assert _stored(repo, "gpu-test") == sorted([first[:8], second[:8]])
    assert (repo / "perf-history" / "results" / "benchmarks.json").exists()
    again = _tool(repo, "history", first, second, "--machine", "gpu-test", "-b", "time_sleep")
    assert again.returncode == 0 and "2 stored, 0 to time" in again.stdout, again.stdout + again.stderr
    published = _tool(repo, "publish")
    assert published.returncode == 0, published.stdout + published.stderr
    graphs = repo / "docs" / "performance" / "dashboard" / "graphs"
    assert (graphs.parent / "index.html").exists()
    assert any("time_sleep" in p.name for p in graphs.rglob("*.json"))


def test_history_spreads_count_commits_from_the_first_with_both_backends(repo: Path) -> None:
    _commit(repo, 3e-4, "before the backends")
    plugin = repo / "packages" / "kermac-backend-triton" / "src" / "kermac_backend_triton" / "plugin.py"
    plugin.parent.mkdir(parents=True)
    plugin.write_text("")
    shas = [_commit(repo, delay, message) for delay, message in ((0.0, "backends"), (1e-4, "middle"), (2e-4, "head"))]
    done = _tool(repo, "history", "--count", "2", "--machine", "gpu-test", "--bench", "time_sleep")
    assert done.returncode == 0, done.stdout + done.stderr
    assert _stored(repo, "gpu-test") == sorted([shas[0][:8], shas[2][:8]])  # first and last, not before


def test_history_starts_no_commit_past_its_time_limit(repo: Path) -> None:
    shas = [_commit(repo, 0.0, "one"), _commit(repo, 1e-4, "two")]
    done = _tool(repo, "history", *shas, "--machine", "gpu-test", "-b", "time_sleep", "--time-limit", "0.001")
    assert done.returncode == 0 and "stopping (run again to go on)" in done.stdout, done.stdout + done.stderr
    assert _stored(repo, "gpu-test") == [shas[0][:8]]  # the first always runs; the second would not finish
