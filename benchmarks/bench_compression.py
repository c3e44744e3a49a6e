"""The accuracy effect of compressed commits: the MNIST and forecasting jobs once per codec, one table.

Runs ``jobs/mnist.py`` and ``jobs/forecast.py`` (each its own process and
embedded cluster, as ``make bench`` does) with ``--compression`` none, bf16,
fp16 and top-k, and ``bf16+replies`` (a codec, then ``--compress-replies``:
the server's replies go through it too), and collects each run's test
metric, epoch time and bytes moved from the jobs' JSON results into
``compression.{json,md}`` under --out.
The metric moves from run to run (a point of MAPE from seed to seed): judge
a codec against ``none`` over several seeds (``--seeds``), not one run.

    python benchmarks/bench_compression.py --quick --out results/compression       # small: a smoke test
    python benchmarks/bench_compression.py --seeds 0,1,2 --out results/compression  # the full measurement
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from trainer_benchmarks.support.ps_bench import REPLIES  # the codec names' suffix bench-ps reads too
from trainer_jobs.support.published import add_publish_arg, publish
from trainer_jobs.support.report import markdown_row, write_report

JOBS_DIR = Path(__file__).resolve().parent
CODECS = ["none", "bf16", "bf16+replies", "fp16", "topk:0.01"]
FULL = {"mnist": ["--workers", "2", "--no-baseline"],
        "forecast": ["--workers", "2", "--no-baseline", "--algorithm", "dynsgd"]}  # codecs need a delta algorithm
QUICK = {"mnist": ["--workers", "2", "--no-baseline", "--limit", "3000", "--epochs", "1"],
         "forecast": ["--workers", "2", "--no-baseline", "--algorithm", "dynsgd", "--limit", "1500", "--epochs", "1",
                      "--models", "lstm"]}
COLUMNS = ["job", "model", "compression", "seed", "workers", "metric_name", "metric_value", "vs_none",
           "epoch_time_s", "bytes", "bytes_vs_none", "seconds"]


def run_job(job: str, argv: list[str], out: Path) -> tuple[int, float, list[dict]]:
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(out / f"{job}.log", "wb") as log_file:
        rc = subprocess.call([sys.executable, str(JOBS_DIR / f"{job}.py"), *argv, "--out", str(out)],
                             stdout=log_file, stderr=subprocess.STDOUT)
    path = out / f"{job}.json"
    rows = json.loads(path.read_text(encoding="utf-8"))["rows"] if rc == 0 and path.is_file() else []
    return rc, time.monotonic() - started, rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--codecs", default=",".join(CODECS), help=f"codecs to compare (default {','.join(CODECS)})")
    parser.add_argument("--jobs", default="mnist,forecast", help="jobs to run (default mnist,forecast)")
    parser.add_argument("--seeds", default="0", help="seeds, one run each (default 0)")
    parser.add_argument("--quick", action="store_true", help="small data and one epoch: a smoke test, not a result")
    parser.add_argument("--out", default="results/compression", help="results directory")
    add_publish_arg(parser, "compression")
    args = parser.parse_args(argv)
    codecs = [c.strip() for c in args.codecs.split(",") if c.strip()]
    jobs = [j.strip() for j in args.jobs.split(",") if j.strip()]
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    if "none" not in codecs:
        codecs.insert(0, "none")  # the reference every codec is compared with
    out = Path(args.out)
    rows, failed = [], []
    for job in jobs:
        for seed in seeds:
            reference: dict = {}
            for codec in codecs:
                folder = out / job / f"{codec.replace(':', '-').replace('+', '-')}-seed{seed}"
                extra = (QUICK if args.quick else FULL)[job] + ["--compression", codec.removesuffix(REPLIES),
                                                                "--seed", str(seed)]
                if codec.endswith(REPLIES):
                    extra.append("--compress-replies")
                rc, seconds, results = run_job(job, extra, folder)
                if rc != 0:
                    failed.append(f"{job} {codec} seed {seed} (see {folder / (job + '.log')})")
                for r in results:
                    if r.get("workers", 0) == 0:
                        continue
                    row = {"job": job, "model": r["model"], "compression": codec, "seed": seed,
                           "workers": r["workers"], "metric_name": r["metric_name"],
                           "metric_value": r["metric_value"], "epoch_time_s": r["epoch_time_s"],
                           "bytes": r["bytes"], "seconds": seconds}
                    key = (r["model"], r["workers"])
                    if codec == "none":
                        reference[key] = row
                    ref = reference.get(key)
                    row["vs_none"] = row["metric_value"] - ref["metric_value"] if ref else None
                    row["bytes_vs_none"] = row["bytes"] / ref["bytes"] if ref and ref["bytes"] else None
                    rows.append(row)
                    print(markdown_row(row, COLUMNS), flush=True)
    out.mkdir(parents=True, exist_ok=True)
    text = write_report(out, "compression", "Compressed commits and replies: accuracy and bytes",
                        f"{'--quick: a smoke test; ' if args.quick else ''}`vs_none` is the metric minus the "
                        "uncompressed run's (accuracy: higher is better, MAPE: lower)", rows, COLUMNS,
                        {"job": "bench_compression", **vars(args)}, failed=failed)
    print(text)
    if not failed and not args.quick:
        publish(args.publish, "compression", rows)
    if failed:
        print("failed: " + "; ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
