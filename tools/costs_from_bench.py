"""Convert saved ``kermac bench --json`` reports into a cost table for ``backend="auto"``.

    kermac bench --full --json > full.json            # on the GPU machine
    kermac bench --small --json > small.json
    python tools/costs_from_bench.py full.json small.json -o packages/kermac-core/src/kermac/costs/sm_90.json

The same conversion as ``kermac bench --write-costs PATH`` (:func:`kermac.costs.table_from_bench`),
for reports saved earlier or several runs of one device class merged into one table.
"""

from __future__ import annotations

import argparse
import json
import sys

from kermac.costs import CostTableError, table_from_bench


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reports", nargs="+", help="files holding the output of kermac bench --json")
    ap.add_argument("-o", "--output", required=True, help="the cost table to write, named <device class>.json")
    args = ap.parse_args(argv)
    reports = []
    for path in args.reports:
        try:
            with open(path, encoding="utf-8") as f:
                reports.append(json.load(f))
        except (OSError, json.JSONDecodeError) as exc:
            print(f"costs_from_bench: {path}: {exc}", file=sys.stderr)
            return 1
    try:
        table = table_from_bench(reports)
    except (CostTableError, KeyError, TypeError) as exc:
        print(f"costs_from_bench: {exc!r}", file=sys.stderr)
        return 1
    table.write(args.output)
    print(f"{args.output}: {len(table.costs)} problem classes on {table.device} ({table.device_class})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
