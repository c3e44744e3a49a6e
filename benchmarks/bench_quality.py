"""The quality floors of the tests, recomputed: each calibrated fit of the test suite run many times.

A test that checks "this algorithm learns" with one fit needs a floor below the worst
case of many runs, or it flips now and then. The floors live here (`CASES`),
the tests import them (`tests/test_trainer.py`), and this command measures the
spread they were set from: every case trained --runs times (20 by default) on
an embedded 2-worker cluster, as the test trains it once (the sklearn digits,
1,500 training and 297 test rows, batch 32, 8 epochs), and a table of the
worst, median and best test accuracy against the floor. ``--write-docs``
replaces the table between the markers of docs/benchmarks.md.

    python benchmarks/bench_quality.py --runs 20 --out results/quality --write-docs
    python benchmarks/bench_quality.py --runs 3 --cases downpour,adag      # a quick look

It takes about 10 minutes per 20 runs of every case on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainer_jobs.support.published import add_publish_arg, publish

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs" / "benchmarks.md"
BEGIN, END = "<!-- bench-quality:begin -->", "<!-- bench-quality:end -->"


@dataclass(frozen=True)
class QualityCase:
    """One calibrated fit: an algorithm on `workers` workers at Adam's rate `lr`, and the test's floor."""

    name: str
    algorithm_name: str  # a get_algorithm name
    params: tuple[tuple[str, object], ...]
    workers: int
    lr: float
    floor: float
    worst: float  # the worst test accuracy of the calibration the floor was set from (20 runs, 2026-11-26)

    def algorithm(self):
        from trainer.algorithms import get_algorithm

        return get_algorithm(self.algorithm_name, **dict(self.params))


#: The floors of tests/test_trainer.py's `test_algorithm_trains_digits`: each sits below its case's worst run by
#: a margin. DOWNPOUR at Adam 0.005 adds every commit whole, so two workers move the center about twice as far,
#: and now and then the loss swings back up mid-run: its worst runs were 0.865, 0.906, 0.929.
CASES = (
    QualityCase("downpour", "downpour", (("window", 4),), 2, 0.005, 0.80, 0.865),
    QualityCase("adag", "adag", (("window", 4),), 2, 0.01, 0.88, 0.949),
    QualityCase("dynsgd", "dynsgd", (("window", 4),), 2, 0.01, 0.88, 0.956),
    QualityCase("aeasgd", "aeasgd", (("window", 4), ("rho", 2.0), ("lr", 0.1)), 2, 0.01, 0.88, 0.956),
    QualityCase("easgd", "easgd", (("window", 4),), 2, 0.01, 0.88, 0.956),
    QualityCase("sync-every-4", "sync", (("every", 4),), 2, 0.01, 0.88, 0.956),
    QualityCase("sync-epoch-optimizer-state", "sync", (("average_optimizer_state", True),), 2, 0.01, 0.88, 0.956),
    QualityCase("single", "single", (), 1, 0.01, 0.88, 0.956),
)
EPOCHS, BATCH = 8, 32


def digits_model(lr: float):
    """The tests' digits MLP (tests/conftest.py: Dense(32) relu, softmax over 10)."""
    import keras

    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(lr), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def digits_frames(spark):
    """The tests' digits split: 1,500 training and 297 test rows in a fixed shuffled order (tests/conftest.py)."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    order = np.random.default_rng(0).permutation(len(x))
    rows = [(x[i].tolist(), int(data.target[i])) for i in order]
    schema = "features array<float>, label int"
    return spark.createDataFrame(rows[:1500], schema).cache(), spark.createDataFrame(rows[1500:], schema).cache()


def summary(case: QualityCase, accuracies: list[float]) -> dict:
    """A table row: the spread of `accuracies` against the case's floor."""
    return {"case": case.name, "algorithm": case.algorithm().describe(), "workers": case.workers, "lr": case.lr,
            "runs": len(accuracies), "worst": min(accuracies), "median": statistics.median(accuracies),
            "best": max(accuracies), "floor": case.floor, "margin": min(accuracies) - case.floor,
            "below_floor": sum(a < case.floor for a in accuracies)}


def docs_table(rows: list[dict], meta: str) -> str:
    lines = [meta, "", "| case | algorithm | workers | Adam rate | runs | worst | median | best | floor | below floor |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['case']} | {r['algorithm']} | {r['workers']} | {r['lr']:g} | {r['runs']} | {r['worst']:.3f} | "
              f"{r['median']:.3f} | {r['best']:.3f} | {r['floor']:.2f} | {r['below_floor']} |" for r in rows]
    return "\n".join(lines)


def write_docs(table: str, path: Path = DOCS) -> None:
    """Replace the text between the bench-quality markers of `path` with `table`."""
    text = path.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise ValueError(f"{path} has no {BEGIN} ... {END} markers to write the table between")
    path.write_text(pattern.sub(lambda _: f"{BEGIN}\n{table}\n{END}", text), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20, help="fits of every case (default 20)")
    parser.add_argument("--cases", default=",".join(c.name for c in CASES),
                        help="comma-separated cases (default all: " + ", ".join(c.name for c in CASES) + ")")
    parser.add_argument("--out", default="results/quality", help="results directory (default results/quality)")
    parser.add_argument("--write-docs", action="store_true", help="write the table into docs/benchmarks.md")
    add_publish_arg(parser, "quality")
    args = parser.parse_args(argv)
    by_name = {c.name: c for c in CASES}
    names = [n.strip() for n in args.cases.split(",") if n.strip()]
    unknown = [n for n in names if n not in by_name]
    if unknown or args.runs < 1:
        parser.error(f"unknown case(s) {unknown}; expected some of {sorted(by_name)}" if unknown
                     else f"--runs must be at least 1; received {args.runs}")
    from trainer import LocalCluster, Trainer
    from trainer.internals import import_keras_quietly

    import_keras_quietly()
    rows, started = [], time.time()
    with LocalCluster(workers=2, cores_per_worker=1) as cluster:
        train, test = digits_frames(cluster.session("bench-quality"))
        for name in names:
            case = by_name[name]
            accuracies = []
            for run in range(args.runs):
                fitted = Trainer(digits_model(case.lr), algorithm=case.algorithm(), num_workers=case.workers,
                                 batch_size=BATCH, epochs=EPOCHS, seed=run, verbose=False).fit(train)
                accuracies.append(float(fitted.evaluate(test)["accuracy"]))
            rows.append(summary(case, accuracies))
            print(f"{name}: worst {rows[-1]['worst']:.3f}, median {rows[-1]['median']:.3f} over {args.runs} runs "
                  f"(floor {case.floor})", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = (f"`make bench-quality` ({args.runs} runs of each case, {time.strftime('%Y-%m-%d')}, "
            f"{(time.time() - started) / 60:.0f} minutes): the digits, 2 workers, batch {BATCH}, {EPOCHS} epochs")
    table = docs_table(rows, meta)
    (out / "quality.json").write_text(json.dumps({"runs": args.runs, "rows": rows}, indent=2) + "\n")
    (out / "quality.md").write_text(table + "\n", encoding="utf-8")
    publish(args.publish, "quality", {"runs": args.runs, "rows": rows})
    print(table)
    if args.write_docs:
        write_docs(table)
        print(f"written into {DOCS}")
    return 1 if any(r["below_floor"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
