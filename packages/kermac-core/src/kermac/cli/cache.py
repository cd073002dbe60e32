"""`kermac cache info|clear`: inspect or empty the JIT cache of compiled kernels.

The cache is everything kermac writes to disk (generated Triton modules stay in memory);
Triton's own cache of compiled binaries (`~/.triton/cache` or `TRITON_CACHE_DIR`) is
Triton's, and neither counted nor cleared here.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys

from kermac import jit_cache
from kermac.cli._format import format_bytes, render_table

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "cache",
        help="inspect or clear the JIT cache of compiled kernels",
        description=f"The on-disk cache of compiled kernels (location: ${jit_cache.ENV_CACHE_DIR} "
        f"or the user cache directory; size cap: ${jit_cache.ENV_CACHE_MAX_BYTES}, "
        f"default {format_bytes(jit_cache.DEFAULT_MAX_BYTES)}).",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    info = actions.add_parser("info", help="location, number of entries and size (-v lists the entries)")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.add_argument("-v", "--verbose", action="store_true", help="list every entry with its metadata")
    clear = actions.add_parser("clear", help="delete every cached kernel")
    clear.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    cache = jit_cache.default_cache()
    if args.action == "clear":
        before = cache.info()
        try:
            removed = cache.clear()
        except OSError as exc:  # a cache directory kermac does not trust: it deletes nothing there
            print(f"kermac cache clear: {exc}", file=sys.stderr)
            return 1
        freed = before.total_bytes - cache.info().total_bytes
        if args.json:
            print(json.dumps({"path": str(cache.path), "removed": removed, "freed_bytes": freed}))
        else:
            print(
                f"Removed {removed} {'entry' if removed == 1 else 'entries'} ({format_bytes(freed)}) from {cache.path}"
            )
        return 0
    info = cache.info()
    entries = cache.entries() if args.verbose or args.json else []
    if args.json:
        document = {
            "path": str(info.path),
            "count": info.count,
            "total_bytes": info.total_bytes,
            "max_bytes": info.max_bytes,
            "problems": list(info.problems),
            "entries": [{"key": e.key, "size": e.size, "meta": e.meta} for e in entries],
        }
        # Entry metadata is validated JSON (no NaN or infinity): the output is strict JSON.
        print(json.dumps(document, indent=2, allow_nan=False))
        return 0
    cap = "no size limit" if info.max_bytes is None else f"limit {format_bytes(info.max_bytes)}"
    print(f"JIT cache: {info.path}")
    print(f"{info.count} {'entry' if info.count == 1 else 'entries'}, {format_bytes(info.total_bytes)} on disk ({cap})")
    for problem in info.problems:
        print(f"problem: {problem}")
    if entries:
        rows = [_entry_row(e) for e in entries]
        print(render_table(["key", "size", "compiler", "arch", "built", "created"], rows, left=1))
    return 0


def _entry_row(entry: jit_cache.CacheEntry) -> list[str]:
    meta = entry.meta or {}
    created = meta.get("created")  # validated: None or a Unix time datetime can show
    when = datetime.datetime.fromtimestamp(created).strftime("%Y-%m-%d %H:%M") if created is not None else "?"
    built = meta.get("build_seconds")  # validated: None or a finite number >= 0
    return [
        entry.key[:16],
        format_bytes(entry.size),
        str(meta.get("compiler", "?")),
        str(meta.get("arch", "?")),
        f"{built:.2f} s" if built is not None else "?",
        when,
    ]
