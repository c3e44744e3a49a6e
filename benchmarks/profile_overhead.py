"""Framework overhead on the MNIST CNN: where a worker's time goes against plain single-process Keras.

Runs the set-ups of ``trainer_jobs.support.plain_keras`` and ``trainer_benchmarks.support.worker_loop`` one after the other
(each in fresh processes with one TensorFlow thread per worker), then splits
the gap between one worker and plain Keras into: the input pipeline (``feed``
- ``plain``), the per-batch callback (``feed+callback`` - ``feed``), the
exchanges with the parameter server (reading the weights, building the
payload, the round trip -- transport and the server's update -- and loading
the reply) and what is left (the server process and the others competing for
the cores). Ratios are taken within the run: ``vs_plain`` is samples/s per
worker against plain Keras; ``vs_feed_alongside`` against as many ``feed``
processes training at once without any exchange (``feed xN``): the share of
the gap that the framework, not the machine, is responsible for.

    python benchmarks/profile_overhead.py --out results/overhead
    python benchmarks/profile_overhead.py --limit 6000 --epochs 3 --workers 1,2 --profile
    python benchmarks/profile_overhead.py --compression bf16
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import numpy as np

import trainer.algorithms as algorithms
from trainer_jobs.support.models import build_cnn
from trainer_jobs.support.datasets import load_mnist
from trainer_jobs.support.plain_keras import run_single
from trainer_benchmarks.support.worker_loop import run_workers, steady
from trainer_jobs.support.report import markdown_row, markdown_table, run_metadata

SINGLE_MODES = ("plain", "feed", "feed+callback")
COLUMNS = ["setup", "workers", "epoch_s", "samples_s_per_worker", "vs_plain", "vs_feed_alongside", "cores_used",
           "commits_per_epoch", "exchange_ms", "state_ms", "payload_ms", "round_trip_ms", "load_ms", "exchange_share",
           "server_cpu_share"]


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, received {text!r}")
    return value


def single_row(results: list[dict], mode: str, copies: int) -> dict:
    """One row for a set-up without exchanges: `copies` processes at once (``feed xN``), or one."""
    epoch = float(np.mean([steady(r["epoch_times"]) for r in results]))
    return {"setup": mode if copies == 1 else f"{mode} x{copies}", "workers": 0 if copies == 1 else copies,
            "epoch_s": epoch, "samples_s_per_worker": float(np.mean([r["rows"] for r in results])) / epoch,
            "cores_used": float(np.mean([r["cores_used"] for r in results]))}


def worker_row(results: list[dict], workers: int, epochs: int, label: str) -> dict:
    """One row for N workers: the mean over workers of the steady epoch and of the exchange parts."""
    ws = [r for r in results if r["mode"] == "worker"]
    server = next(r for r in results if r["mode"] == "server")
    epoch = float(np.mean([steady(r["epoch_times"]) for r in ws]))
    commits = float(np.mean([r["commits"] for r in ws]))
    per = {part: 1000 * float(np.mean([r["exchange_s"][part] for r in ws])) / max(commits, 1)
           for part in ("state", "payload", "round_trip", "load")}
    exchange = 1000 * float(np.mean([r["comm_s"] for r in ws])) / max(commits, 1)
    train = float(np.mean([sum(r["epoch_times"]) for r in ws]))
    return {
        "setup": label, "workers": workers, "epoch_s": epoch,
        "samples_s_per_worker": float(np.mean([r["rows"] for r in ws])) / epoch,
        "commits_per_epoch": commits / epochs, "exchange_ms": exchange,
        **{f"{k}_ms": v for k, v in per.items()},
        "exchange_share": exchange * commits / 1000 / train,
        "cores_used": float(np.mean([r["cores_used"] for r in ws])),
        "server_cpu_share": server["cpu_s"] / train,
    }


def add_ratios(rows: list[dict]) -> None:
    """Add ``vs_plain`` to every row and ``vs_feed_alongside`` to the worker rows that have their ``feed``
    (1 worker) or ``feed xN`` (N workers) set-up in the run."""
    plain = [r["samples_s_per_worker"] for r in rows if r["setup"] == "plain"]
    alongside = {max(r["workers"], 1): r["samples_s_per_worker"] for r in rows
                 if r["setup"] == "feed" or r["setup"].startswith("feed x")}
    for r in rows:
        r["vs_plain"] = r["samples_s_per_worker"] / plain[0] if plain else None
        if r["setup"].startswith("workers") and r["workers"] in alongside:
            r["vs_feed_alongside"] = r["samples_s_per_worker"] / alongside[r["workers"]]


def breakdown(rows: list[dict]) -> list[dict]:
    """The gap between 1 worker and plain Keras, in seconds per epoch and as a share of plain's epoch."""
    by = {r["setup"]: r for r in rows}
    one = next((r for r in rows if r["workers"] == 1 and r["setup"].startswith("workers")), None)
    if one is None or "plain" not in by:
        return []
    plain = by["plain"]["epoch_s"]
    commits = one["commits_per_epoch"]
    parts = []
    if "feed" in by:
        parts.append(("input pipeline (ShardFeed vs Keras's)", by["feed"]["epoch_s"] - plain))
        if "feed+callback" in by:
            parts.append(("a per-batch callback", by["feed+callback"]["epoch_s"] - by["feed"]["epoch_s"]))
    for part, label in (("state", "reading the weights (get_weights)"), ("payload", "building the payload"),
                        ("round_trip", "commit round trip (transport + server update)"),
                        ("load", "loading the reply (set_weights)")):
        parts.append((label, one[f"{part}_ms"] * commits / 1000))
    explained = sum(v for _, v in parts)
    parts.append(("the rest (cores shared with the server, noise)", one["epoch_s"] - plain - explained))
    out = [{"part": label, "s_per_epoch": v, "share_of_plain": v / plain} for label, v in parts]
    out.append({"part": "total: 1 worker - plain Keras", "s_per_epoch": one["epoch_s"] - plain,
                "share_of_plain": (one["epoch_s"] - plain) / plain})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=_positive, default=6000, help="training rows (default 6000)")
    parser.add_argument("--epochs", type=_positive, default=3, help="epochs; the first is left out (default 3)")
    parser.add_argument("--batch-size", type=_positive, default=32, help="minibatch size (default 32)")
    parser.add_argument("--window", type=_positive, default=5, help="DOWNPOUR window in batches (default 5)")
    parser.add_argument("--workers", default="1,2", help="worker counts (default 1,2)")
    parser.add_argument("--compression", default="none", help="none, fp16, bf16 or topk:F (default none)")
    parser.add_argument("--overlap", choices=["off", "on", "both"], default="off",
                        help="workers commit in the background (Trainer overlap=True): off, on, or both one "
                             "after the other (default off)")
    parser.add_argument("--skip-single", action="store_true", help="only the worker set-ups")
    parser.add_argument("--profile", action="store_true", help="cProfile worker 0's last epoch (in the JSON)")
    parser.add_argument("--out", default="results/overhead", help="results directory (default results/overhead)")
    args = parser.parse_args(argv)
    counts = sorted({int(t) for t in args.workers.split(",") if t.strip()})
    algorithm = algorithms.DOWNPOUR(window=args.window)
    if args.compression != "none":
        algorithm = algorithms.with_compression(algorithm, args.compression)
    x, y, _, _ = load_mnist(None, limit=args.limit)
    x = (x[..., None] / 255.0).astype(np.float32)
    builder = functools.partial(build_cnn, True, None)
    rows, profiles = [], {}
    if not args.skip_single:
        setups = [(mode, 1) for mode in SINGLE_MODES] + [("feed", n) for n in counts if n > 1]
        for mode, copies in setups:
            rows.append(single_row(run_single(mode, builder, x, y, epochs=args.epochs, batch_size=args.batch_size,
                                              copies=copies), mode, copies))
            print(markdown_row(rows[-1], COLUMNS), flush=True)
    overlaps = {"off": [False], "on": [True], "both": [False, True]}[args.overlap]
    for n in counts:
        for overlap in overlaps:
            label = f"workers={n}" + (" overlap" if overlap else "")
            results = run_workers(n, builder, algorithm, x, y, epochs=args.epochs, batch_size=args.batch_size,
                                  profile=args.profile, overlap=overlap)
            rows.append(worker_row(results, n, args.epochs, label))
            profiles[label] = next((r["profile"] for r in results if r.get("profile")), "")
            print(markdown_row(rows[-1], COLUMNS), flush=True)
    add_ratios(rows)
    parts = breakdown(rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = run_metadata({"job": "profile_overhead", **vars(args)})
    (out / "overhead.json").write_text(json.dumps({"metadata": meta, "rows": rows, "breakdown": parts,
                                                   "profiles": profiles}, indent=2) + "\n", encoding="utf-8")
    text = (f"# Framework overhead, MNIST CNN\n\n- {meta['timestamp']} on {meta['host']} ({meta['cores']} cores); "
            f"{len(x)} rows, {args.epochs} epochs (first left out), batch {args.batch_size}, "
            f"{algorithm.describe()}\n\n{markdown_table(rows, COLUMNS)}\n\n"
            f"{markdown_table(parts, ['part', 's_per_epoch', 'share_of_plain']) if parts else ''}\n")
    (out / "overhead.md").write_text(text, encoding="utf-8")
    print(text)
    print(f"results: {out / 'overhead.json'}, {out / 'overhead.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
