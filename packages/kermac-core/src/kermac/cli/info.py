"""`kermac info`: versions, CUDA GPUs, backends with their availability, cost tables and the JIT cache.

The backend table has a row per backend and a `BROKEN` row per plugin error -- a plugin refused
(a reserved or duplicate name), failed or too slow to load, or a backend whose `priority` or
`availability()` failed -- whose reason names the plugin, its distribution and what went wrong.
"""

from __future__ import annotations

import argparse
import json
import platform
import warnings

from kermac.cli._format import format_bytes, render_table

__all__ = ["collect", "register", "run"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "info",
        help="versions, GPUs, backends and the JIT cache",
        description="Report kermac's and torch's versions, every CUDA GPU, every backend (available or why not), "
        "the cost tables backend='auto' ranks by, and the JIT cache.",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=run)


def collect() -> dict[str, object]:
    """Everything `kermac info` reports, as JSON-ready data."""
    import torch

    import kermac
    from kermac import costs, jit_cache, registry

    gpus: list[dict[str, object]] = []
    gpu_error = None
    try:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        for i in range(count):
            props = torch.cuda.get_device_properties(i)
            gpus.append(
                {
                    "index": i,
                    "name": props.name,
                    "compute_capability": f"{props.major}.{props.minor}",
                    "memory_bytes": props.total_memory,
                }
            )
    except Exception as exc:  # a broken driver must not stop the report
        gpu_error = f"{type(exc).__name__}: {exc}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # broken plugins are listed below instead
        statuses = kermac.backends()
    cache = jit_cache.default_cache()
    cache_info = cache.info()
    tables = {}
    for cls in dict.fromkeys([f"sm_{g['compute_capability'].replace('.', '')}" for g in gpus] + ["cpu"]):
        try:
            table = registry.cost_tables().table(cls)
        except costs.CostTableError as exc:
            tables[cls] = {"error": str(exc)}
            continue
        tables[cls] = None if table is None else {"device": table.device, "source": table.source}
    return {
        "kermac": kermac.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "gpus": gpus,
        "gpu_error": gpu_error,
        "backends": [
            {
                "name": s.name,
                "available": s.available,
                "reason": s.reason,
                "priority": s.priority,
                "plugin": s.plugin,
                "distribution": s.distribution,
                "version": s.version,
                "broken": s.broken,
            }
            for s in statuses
        ],
        "cost_tables": tables,
        "cache": {
            "path": str(cache_info.path),
            "count": cache_info.count,
            "total_bytes": cache_info.total_bytes,
            "max_bytes": cache_info.max_bytes,
            "problems": list(cache_info.problems),
        },
    }


def run(args: argparse.Namespace) -> int:
    data = collect()
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print(f"kermac   {data['kermac']}")
    print(f"python   {data['python']} ({data['platform']})")
    cuda = f"CUDA {data['torch_cuda']}" if data["torch_cuda"] else "CPU-only build"
    print(f"torch    {data['torch']} ({cuda})")
    print()
    gpus = data["gpus"]
    if gpus:
        print("CUDA GPUs:")
        for g in gpus:
            memory = format_bytes(g["memory_bytes"])
            print(f"  cuda:{g['index']}  {g['name']}  compute capability {g['compute_capability']}  {memory}")
    else:
        print("CUDA GPUs: no CUDA GPU" + (f" ({data['gpu_error']})" if data["gpu_error"] else ""))
    print()
    print("Backends (auto takes the cheapest in the cost table of the device, then the highest priority):")
    rows = []
    for b in data["backends"]:
        status = "BROKEN" if b["broken"] else "yes" if b["available"] else "no"
        rows.append([b["name"], status, str(b["priority"]), b["plugin"], b["version"] or "-", b["reason"] or ""])
    if rows:
        print(render_table(["name", "available", "priority", "plugin", "version", "reason"], rows, left=6))
    else:
        print("  none registered (is kermac-core installed, so its entry points exist?)")
    print()
    print("Cost tables (what auto ranks by):")
    for cls, table in data["cost_tables"].items():
        if table is None:
            print(f"  {cls:6}  none: auto ranks by priority")
        elif "error" in table:
            print(f"  {cls:6}  unusable: {table['error']}")
        else:
            print(f"  {cls:6}  {table['device']}: {table['source']}")
    print()
    c = data["cache"]
    print(f"JIT cache: {c['path']}")
    cap = "no size cap" if c["max_bytes"] is None else f"capped at {format_bytes(c['max_bytes'])}"
    print(f"  {c['count']} {'entry' if c['count'] == 1 else 'entries'}, {format_bytes(c['total_bytes'])} ({cap})")
    for problem in c["problems"]:
        print(f"  problem: {problem}")
    return 0
