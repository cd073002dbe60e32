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
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "asv.conf.json"
WORKTREES = ROOT / ".asv" / "worktrees"
DEFAULT_FACTOR = 1.05


def asv_command() -> list[str]:
    """asv, run by the interpreter running this script (so ``--python=same`` is this environment)."""
    return [sys.executable, "-m", "asv"]


def tree_pythonpath(tree: Path) -> str:
    """``ASV_PYTHONPATH`` for the packages of ``tree``: every ``packages/*/src``, in name order."""
    return os.pathsep.join(str(p) for p in sorted(tree.glob("packages/*/src")))


def ensure_machine() -> None:
    """asv asks for a description of the machine on first use; take its defaults where none exists.

    An existing ``~/.asv-machine.json`` is kept: its machine name tags stored results."""
    if not Path("~/.asv-machine.json").expanduser().exists():
        subprocess.run([*asv_command(), "machine", "--yes"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)


def run_asv(args: list[str], tree: Path) -> int:
    """``asv ARGS`` from the repository root with ``tree``'s packages on the benchmarks' path."""
    env = {**os.environ, "ASV_PYTHONPATH": tree_pythonpath(tree)}
    return subprocess.run([*asv_command(), "--config", str(CONFIG), *args], cwd=ROOT, env=env).returncode


def quick(extra: list[str]) -> int:
    ensure_machine()
    return run_asv(["run", "--quick", "--python=same", "--dry-run", "--show-stderr", *extra], ROOT)


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


def measure(revision: str, sha: str, machine: str | None, bench: str | None) -> int:
    """Time the suites on the code of ``sha`` and store the results under that commit."""
    tree = WORKTREES / sha
    if not tree.exists():
        git("worktree", "add", "--detach", str(tree), sha)
    try:
        print(f"asv_suites: timing {revision} ({sha[:10]})", flush=True)
        args = ["run", "--python=same", f"--set-commit-hash={sha}", "--show-stderr"]
        args += ["--machine", machine] if machine else []
        args += ["--bench", bench] if bench else []
        return run_asv(args, tree)
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
    args, extra = parser.parse_known_args(argv)
    if args.command == "quick":
        return quick(extra)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if not args.factor > 1:
        parser.error(f"--factor: expected a ratio > 1 (1.05 flags 5 % slowdowns), got {args.factor}")
    return compare(args.base, args.head, args.factor, args.machine, args.bench, not args.no_run)


if __name__ == "__main__":
    sys.exit(main())
