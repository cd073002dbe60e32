"""Run the asv suites of ``benchmarks/`` against a source tree, and compare two commits.

    python tools/asv_suites.py quick [ASV_RUN_ARGS...]
        every benchmark once (asv's quick mode) against this working tree, on the device here,
        saving nothing; exit status non-zero if a suite fails to import or any benchmark fails
        (n/a rows -- a backend that is unavailable or refuses the problem -- are not failures).
    python tools/asv_suites.py compare BASE HEAD [--factor 1.05] [--machine NAME] [--bench REGEX] [--no-run]
        time the suites at BASE and at HEAD (any git revisions), store the results in asv's
        results directory under the machine's name, and print ``asv compare``'s table; exit status
        1 if any row is slower at HEAD by more than ``--factor`` (5 % by default) with statistical
        significance, or failed at HEAD but not at BASE.  ``--no-run`` compares stored results only.
    python tools/asv_suites.py history [REV...] [--count 14] [--machine NAME] [--bench REGEX] [--rounds 1]
        time commits of main into the performance history (``perf-history/results/``, kept in git):
        the named revisions, or ``--count`` commits spread evenly over main's first-parent history
        from the first one with both GPU backends to ``HEAD``; commits already stored for the
        machine are skipped, so an interrupted history resumes where it stopped.  The machine name
        defaults to the GPU's (``nvidia-h100-80gb-hbm3``) and tags the results; ``--bench``
        defaults to :data:`HISTORY_ROWS`.  ``--time-limit S`` starts no commit once fewer than the
        longest commit's seconds are left of ``S`` (for machines lent for a limited time).
    python tools/asv_suites.py publish
        build the dashboard of the performance history (``asv publish``) into
        ``docs/performance/dashboard/``, where the documentation site picks it up.

Both run the suites of this working tree (so the two sides of a comparison run the same
benchmarks) on the code of the tree they measure: asv drops ``PYTHONPATH`` from its benchmark
processes, so ``ASV_PYTHONPATH`` puts that tree's ``packages/*/src`` first on ``sys.path``.  A
revision is checked out as a detached git worktree under ``.asv/worktrees/`` (ignored by git) and
removed afterwards.  The environment is the one running this script (``environment_type``
``existing``): torch, the packages' dependencies and their entry points (the installed backends)
must be installed in it, e.g. by ``python3 scripts/dev.py setup``.  The revisions measured must
provide what the suites use (``kermac.benchmarking`` and ``kermac.cli.bench.default_backends``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "asv.conf.json"
HISTORY_CONFIG = ROOT / "perf-history" / "asv.conf.json"
WORKTREES = ROOT / ".asv" / "worktrees"
DEFAULT_FACTOR = 1.05
HISTORY_COUNT = 14
HISTORY_SINCE_PATH = "packages/kermac-backend-triton/src/kermac_backend_triton/plugin.py"
"""The history starts at the commit that added this file: the first with both GPU backends."""

_GPU_ROWS = (
    "cdist 8192x8192x256 p=(1|2)",
    "laplace L2 8192x8192x256",
    "grad M=4096 N=256 O=16 K=4096 p=1",
)
HISTORY_ROWS = rf"\('(nvrtc|triton)', '({'|'.join(_GPU_ROWS)})'\)|\('torch.cdist', 'cdist 8192x8192x256 p=2'\)"
"""The rows the history times at every commit (an asv ``--bench`` expression): distances with p = 1
(SIMT) and p = 2 (tensor cores), a fused kernel matrix and the gradient contraction at the peer
table's sizes through both GPU backends, and PyTorch's cdist p = 2 as a control row (its code does
not change with kermac's commits, so a step in it is the machine, not the project).  asv times each
row in a process of its own that compiles its kernels afresh (about 9 s a row on an H100), so every
row of every suite at a dozen commits would take longer than the GPU machine is lent for."""


def asv_command() -> list[str]:
    """asv, run by the interpreter running this script (so ``--python=same`` is this environment)."""
    return [sys.executable, "-m", "asv"]


def tree_pythonpath(tree: Path) -> str:
    """``ASV_PYTHONPATH`` for the packages of ``tree``: every ``packages/*/src``, in name order, then
    this process's ``PYTHONPATH`` (where an environment keeps packages outside its site-packages)."""
    entries = [str(p) for p in sorted(tree.glob("packages/*/src"))]
    entries += [e for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e]
    return os.pathsep.join(entries)


def ensure_machine(name: str | None = None) -> None:
    """asv asks for a description of the machine on first use; take its defaults where none exists.

    An existing description is kept: its machine name tags stored results.  With ``name``, the
    description of that machine name is made if ``~/.asv-machine.json`` lacks it."""
    path = Path("~/.asv-machine.json").expanduser()
    if name is None and path.exists():
        return
    if name is not None and path.exists() and name in json.loads(path.read_text()):
        return
    cmd = [*asv_command(), "machine", "--yes", *(["--machine", name] if name else [])]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)


def run_asv(args: list[str], tree: Path, config: Path = CONFIG) -> int:
    """``asv ARGS`` under ``config`` with ``tree``'s packages on the benchmarks' path."""
    env = {**os.environ, "ASV_PYTHONPATH": tree_pythonpath(tree)}
    return subprocess.run([*asv_command(), "--config", str(config), *args], cwd=ROOT, env=env).returncode


def quick(extra: list[str]) -> int:
    ensure_machine()
    return run_asv(["run", "--quick", "--python=same", "--dry-run", "--show-stderr", *extra], ROOT)


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


def measure(
    revision: str,
    sha: str,
    machine: str | None,
    bench: str | None,
    config: Path = CONFIG,
    extra: Sequence[str] = (),
) -> int:
    """Time the suites on the code of ``sha`` and store the results under that commit."""
    tree = WORKTREES / sha
    if not tree.exists():
        git("worktree", "add", "--detach", str(tree), sha)
    try:
        print(f"asv_suites: timing {revision} ({sha[:10]})", flush=True)
        args = ["run", "--python=same", f"--set-commit-hash={sha}", "--show-stderr", *extra]
        args += ["--machine", machine] if machine else []
        args += ["--bench", bench] if bench else []
        return run_asv(args, tree, config)
    finally:
        git("worktree", "remove", "--force", str(tree))


def compare(base: str, head: str, factor: float, machine: str | None, bench: str | None, run: bool) -> int:
    """Exit status: 0 if no row got slower by more than ``factor`` (or failed anew), else 1."""
    shas = {rev: git("rev-parse", "--verify", f"{rev}^{{commit}}") for rev in (base, head)}
    if run:
        ensure_machine()
        for rev, sha in shas.items():
            # A failing benchmark is recorded as failed and shown by the comparison; keep going.
            measure(rev, sha, machine, bench)
    from asv import util
    from asv.commands.compare import Compare
    from asv.config import Config
    from asv.machine import iter_machine_files

    os.chdir(ROOT)  # the configuration's paths (repo, results) are relative to the repository root
    conf = Config.load(str(CONFIG))
    if machine is None:
        stored = sorted({util.load_json(path)["machine"] for path in iter_machine_files(conf.results_dir)})
        if len(stored) != 1:
            found = ", ".join(stored) or "none"
            print(f"asv_suites: --machine: name the machine whose results to compare (found: {found})", file=sys.stderr)
            return 2
        machine = stored[0]
    # Compare.run prints the same table but returns nothing; print_table returns whether a row got worse.
    worsened, _ = Compare.print_table(conf, shas[base], shas[head], factor=factor, split=True, machine=machine)
    if worsened:
        print(f"asv_suites: rows slower by more than {factor:g}x (or failing anew) at {head}: marked + or !")
    return 1 if worsened else 0


def history_commits(count: int, branch: str = "main") -> list[str]:
    """``count`` commits of ``branch``'s first-parent history, oldest first, spread evenly from the
    first commit with both GPU backends (:data:`HISTORY_SINCE_PATH`) to the branch's head."""
    shas = git("rev-list", "--first-parent", "--reverse", branch).split()
    touched = set(git("log", "--first-parent", "--format=%H", branch, "--", HISTORY_SINCE_PATH).split())
    start = next((i for i, sha in enumerate(shas) if sha in touched), None)
    if start is None:
        raise SystemExit(f"asv_suites: no commit of {branch} adds {HISTORY_SINCE_PATH}")
    shas = shas[start:]
    if count >= len(shas):
        return shas
    last = len(shas) - 1
    return [shas[round(i * last / (count - 1))] for i in range(count)] if count > 1 else [shas[-1]]


def machine_name() -> str:
    """The GPU's name as asv machine name (``NVIDIA H100 80GB HBM3`` → ``nvidia-h100-80gb-hbm3``), else the host's."""
    import torch

    name = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.node()
    return re.sub(r"[^a-z0-9.]+", "-", name.lower()).strip("-")


def stored(machine: str, sha: str) -> bool:
    """Whether the history holds results of ``sha`` on ``machine`` (asv names them ``<sha[:8]>-<env>.json``)."""
    return any((HISTORY_CONFIG.parent / "results" / machine).glob(f"{sha[:8]}-*.json"))


def history(revisions: list[str], count: int, machine: str | None, bench: str, rounds: int, time_limit: float) -> int:
    """Time each commit not stored yet, oldest first, starting none after ``time_limit`` seconds less
    the longest a commit has taken; exit status 1 if asv failed to run any of them."""
    shas = [git("rev-parse", "--verify", f"{rev}^{{commit}}") for rev in revisions] or history_commits(count)
    machine = machine or machine_name()
    ensure_machine(machine)
    todo = [sha for sha in shas if not stored(machine, sha)]
    print(f"asv_suites: {len(shas)} commits on {machine}: {len(shas) - len(todo)} stored, {len(todo)} to time")
    rounds_arg = ("--attribute", f"rounds={rounds}")
    failed, start, longest = [], time.monotonic(), 0.0
    for sha in todo:
        left = time_limit - (time.monotonic() - start)
        if left < longest:  # a commit cut short would be stored half-timed, and then skipped as done
            print(f"asv_suites: {left:.0f} s left, a commit took {longest:.0f} s: stopping (run again to go on)")
            break
        began = time.monotonic()
        if measure(sha, sha, machine, bench, HISTORY_CONFIG, rounds_arg):
            failed.append(sha)
        longest = max(longest, time.monotonic() - began)
    if failed:
        print(f"asv_suites: asv failed at {', '.join(sha[:10] for sha in failed)}", file=sys.stderr)
    return 1 if failed else 0


def publish() -> int:
    """``asv publish`` of the stored history into the documentation's ``performance/dashboard``."""
    results = HISTORY_CONFIG.parent / "results"
    if not (results / "benchmarks.json").exists():
        print(f"asv_suites: publish: no results in {results.relative_to(ROOT)} (run history first)", file=sys.stderr)
        return 2
    return subprocess.run([*asv_command(), "--config", str(HISTORY_CONFIG), "publish"], cwd=ROOT).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    q = sub.add_parser("quick", help="every benchmark once against this working tree; fails on any error")
    q.epilog = "Further arguments go to asv run, e.g. -b bench_cdist."
    c = sub.add_parser("compare", help="time BASE and HEAD and flag rows slower by more than --factor")
    c.add_argument("base")
    c.add_argument("head")
    c.add_argument("--factor", type=float, default=DEFAULT_FACTOR, help="ratio that counts as a change (1.05)")
    c.add_argument("--machine", help="asv machine name of the stored results (default: asv's, the host name)")
    c.add_argument("--bench", "-b", help="regular expression selecting benchmarks")
    c.add_argument("--no-run", action="store_true", help="compare stored results without timing anything")
    h = sub.add_parser("history", help="time commits of main into perf-history/results/ (kept in git)")
    h.add_argument("revisions", nargs="*", help="commits to time (default: --count commits spread over main)")
    h.add_argument("--count", type=int, default=HISTORY_COUNT, help=f"commits of main to time ({HISTORY_COUNT})")
    h.add_argument("--machine", help="asv machine name tagging the results (default: the GPU's name)")
    h.add_argument("--bench", "-b", default=HISTORY_ROWS, help="regular expression selecting rows")
    h.add_argument("--rounds", type=int, default=1, help="asv rounds: processes per row and commit (1)")
    h.add_argument("--time-limit", type=float, default=float("inf"), help="seconds after which no commit starts")
    sub.add_parser("publish", help="build the dashboard of perf-history/ into docs/performance/dashboard/")
    args, extra = parser.parse_known_args(argv)
    if args.command == "quick":
        return quick(extra)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "publish":
        return publish()
    if args.command == "history":
        if args.count < 1 or args.rounds < 1:
            parser.error(f"--count and --rounds: expected integers >= 1, got {args.count} and {args.rounds}")
        return history(args.revisions, args.count, args.machine, args.bench, args.rounds, args.time_limit)
    if not args.factor > 1:
        parser.error(f"--factor: expected a ratio > 1 (1.05 flags 5 % slowdowns), got {args.factor}")
    return compare(args.base, args.head, args.factor, args.machine, args.bench, not args.no_run)


if __name__ == "__main__":
    sys.exit(main())
