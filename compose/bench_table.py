#!/usr/bin/env python3
"""Speed-up table of `make bench-cluster`: one mnist run per lab size.

Reads DIR/workers-N/mnist.json for each N given (written by jobs/mnist.py in the lab) and
DIR/../bench-cluster.csv (wall time of each submit, measured by make), and
prints a markdown table: the job's own epoch time (what training costs) next to
the submit's wall time (JVM, data loading and executor start-up included).

Usage: python3 compose/bench_table.py results/lab/bench-cluster 1 2 3  (stdlib only)
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not all(a.isdigit() for a in argv[1:]):
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    root, counts = Path(argv[0]), [int(a) for a in argv[1:]]
    wall = {}
    wall_csv = root.parent / "bench-cluster.csv"
    if wall_csv.exists():
        wall = {int(r["workers"]): float(r["seconds"]) for r in csv.DictReader(wall_csv.open())}
    rows = []
    for n in counts:
        path = root / f"workers-{n}" / "mnist.json"
        if not path.exists():
            print(f"{path}: missing (did the run for {n} workers fail?)", file=sys.stderr)
            continue
        dist = [r for r in json.loads(path.read_text())["rows"] if r.get("mode") == "distributed" and r.get("workers") == n]
        if not dist:
            print(f"{path}: no distributed row for {n} workers", file=sys.stderr)
            continue
        rows.append((n, dist[0], wall.get(n)))
    if not rows:
        print(f"no results under {root}", file=sys.stderr)
        return 1
    # Speed-up relative to the smallest lab measured (the first N given).
    first_n, first_time = rows[0][0], rows[0][1]["epoch_time_s"]
    print("| lab workers | epoch time (s) | speed-up | efficiency | accuracy | submit wall time (s) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n, row, seconds in rows:
        speedup = first_time / row["epoch_time_s"]
        print(f"| {n} | {row['epoch_time_s']:.2f} | {speedup:.2f}x | {100 * speedup * first_n / n:.0f}% "
              f"| {row['metric_value']:.4f} | {'' if seconds is None else f'{seconds:.0f}'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
