"""The `kermac` command line: `kermac info`, `bench`, `cache info|clear`, `precompile`.

Also reachable as `python -m kermac`.  Each command lives in its own module exposing
`register(subparsers)` (adds its parser) and `run(args) -> int` (the exit code).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kermac._version import __version__

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `kermac` with every sub-command."""
    from kermac.cli import bench, cache, info, precompile

    parser = argparse.ArgumentParser(
        prog="kermac",
        description="Fused GPU kernels for kernel machines: inspect the installation, benchmark the backends, "
        "manage and fill the JIT cache.",
    )
    parser.add_argument("--version", action="version", version=f"kermac {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    info.register(sub)
    bench.register(sub)
    cache.register(sub)
    precompile.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run `kermac` with `argv` (default: `sys.argv[1:]`); returns the exit code.

    Usage errors exit with 2 (argparse's convention); a command's own failures with 1.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `kermac info | head`
        sys.stderr.close()
        return 0
