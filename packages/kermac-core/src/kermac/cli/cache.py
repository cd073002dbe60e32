"""``kermac cache info|clear``: inspect or empty the JIT cache of compiled kernels."""

from __future__ import annotations

import argparse
import datetime
import json

from kermac import jit_cache
from kermac.cli._format import format_bytes, render_table

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "cache",
        help="inspect or clear the JIT cache of compiled kernels",
        description=f"The on-disk cache of compiled kernels (location: ${jit_cache.ENV_CACHE_DIR} "
        "or the user cache directory).",
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
        removed = cache.clear()
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
            "entries": [{"key": e.key, "size": e.size, "meta": e.meta} for e in entries],
        }
        print(json.dumps(document, indent=2, default=str))
        return 0
    print(f"JIT cache: {info.path}")
    print(f"{info.count} {'entry' if info.count == 1 else 'entries'}, {format_bytes(info.total_bytes)} on disk")
    if entries:
        rows = [_entry_row(e) for e in entries]
        print(render_table(["key", "size", "compiler", "arch", "built", "created"], rows, left=1))
    return 0


def _entry_row(entry: jit_cache.CacheEntry) -> list[str]:
    meta = entry.meta or {}
    created = meta.get("created")
    when = (
        datetime.datetime.fromtimestamp(created).strftime("%Y-%m-%d %H:%M")
        if isinstance(created, (int, float))
        else "?"
    )
    built = meta.get("build_seconds")
    return [
        entry.key[:16],
        format_bytes(entry.size),
        str(meta.get("compiler", "?")),
        str(meta.get("arch", "?")),
        f"{built:.2f} s" if isinstance(built, (int, float)) else "?",
        when,
    ]
