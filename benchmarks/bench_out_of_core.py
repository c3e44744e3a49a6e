"""Out-of-core benchmark: the MNIST CNN on one worker, its shard in memory or streamed from a spill file.

For every scale K in --scales the training images are read from Parquet and
repeated K times in Spark (a cross join, nothing is copied on the driver):
one worker receives the whole shard (K x 60,000 images, about K x 188 MB of
Arrow data). Each scale trains once per feed (``Trainer(feed="memory")`` and
``feed="stream"``), in-memory only up to --memory-max-scale (its peak holds
the shard about four times). Every fit is a fresh Python worker
(``spark.python.worker.reuse`` off), so its peak RSS (``VmHWM`` from /proc,
``peak_rss_bytes`` in the history) is its own.

What it shows, from one run:

* ``epoch_time_s``, and ``vs_memory``: the streamed s/epoch over the
  in-memory one at the same scale (target: within 5 %, i.e. <= 1.05);
* ``peak_rss_mb`` and ``shard_over_rss``: the shard's size over the worker's
  peak RSS. ``spark.executor.pyspark.memory`` cannot be the limit here:
  it caps the worker's address space, and TensorFlow alone maps about 2.5 GB
  of it for this model (1.4 GB at import). So the limit is the worker's
  own peak RSS: the largest scale streams a shard several times larger than
  the whole worker ever holds, where the in-memory path would need about four
  times the shard.

The first scale runs --epochs epochs (its s/epoch leaves the first one out:
graph tracing); larger scales run --large-epochs. Defaults (scales 1, 4, 16,
2 epochs at scale 1): about half an hour on 2 cores.

    python benchmarks/bench_out_of_core.py --out results/out_of_core
    python benchmarks/bench_out_of_core.py --limit 6000 --scales 1,4 --out /tmp/ooc   # a quick look
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainer import DOWNPOUR, LocalCluster, Trainer
from trainer.data.prep import scale_pixels
from trainer_jobs.support.models import build_cnn
from trainer_jobs.support.cli import add_verbose_arg, positive_int, start_logging
from trainer_jobs.support.datasets import data_dir, load_mnist, parquet_images
from trainer_jobs.support.published import add_publish_arg, publish
from trainer_jobs.support.report import markdown_table, write_results
from trainer_jobs.support.scaling import steady_epoch_time

COLUMNS = ["scale", "rows", "shard_mb", "feed", "epochs", "epoch_time_s", "vs_memory", "peak_rss_mb",
           "shard_over_rss", "data_delivery_s", "accuracy"]


def parse_scales(text: str) -> list[int]:
    try:
        scales = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        scales = []
    if not scales or scales[0] < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1 such as 1,4,16; received {text!r}")
    return scales


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scales", type=parse_scales, default=[1, 4, 16],
                        help="how many times the training images are repeated in the shard (default 1,4,16)")
    parser.add_argument("--memory-max-scale", type=positive_int, default=4,
                        help="the largest scale also trained in memory (default 4)")
    parser.add_argument("--epochs", type=positive_int, default=2, help="epochs at the first scale (default 2)")
    parser.add_argument("--large-epochs", type=positive_int, default=1, help="epochs at larger scales (default 1)")
    parser.add_argument("--batch-size", type=positive_int, default=32, help="minibatch size (default 32)")
    parser.add_argument("--limit", type=positive_int, default=None, help="use only the first N training images")
    parser.add_argument("--data-dir", default=None, help="where the Parquet copy of MNIST goes (default ./data)")
    parser.add_argument("--out", default="results/out_of_core", help="results directory")
    add_publish_arg(parser, "out-of-core")
    add_verbose_arg(parser)
    return parser.parse_args(argv)


def run(frame, rows: int, scale: int, feed: str, epochs: int, batch_size: int, test) -> dict:
    """One fit on one worker; its result row."""
    fitted = Trainer(build_cnn, algorithm=DOWNPOUR(window=5), num_workers=1, batch_size=batch_size,
                     epochs=epochs, feed=feed, check_data=False, verbose=False).fit(frame)
    worker = fitted.history.workers[-1]
    rss = worker.get("peak_rss_bytes")
    accuracy = fitted.evaluate(test)["accuracy"] if test is not None else None
    row = {
        "scale": scale, "rows": rows, "shard_mb": worker["shard_bytes"] / 2**20, "feed": worker["feed"],
        "spill_mb": worker["spill_bytes"] / 2**20, "epochs": epochs,
        "epoch_time_s": steady_epoch_time([e["time_s"] for e in fitted.history.epochs]),
        "peak_rss_mb": rss / 2**20 if rss else None,
        "shard_over_rss": worker["shard_bytes"] / rss if rss else None,
        "data_delivery_s": fitted.history.timings["data_delivery_s"], "accuracy": accuracy,
        "workers": 1, "speedup": None,  # one worker: write_results has no speed-up to fill in
    }
    print(f"scale {scale} ({rows} rows, {row['shard_mb']:.0f} MB) {feed}: {row['epoch_time_s']:.1f} s/epoch, "
          f"peak RSS {row['peak_rss_mb'] or float('nan'):.0f} MB, data delivery {row['data_delivery_s']:.1f} s"
          + (f", test accuracy {accuracy:.4f}" if accuracy is not None else ""), flush=True)
    return row


def with_ratios(rows: list[dict]) -> list[dict]:
    """``vs_memory``: each streamed row's s/epoch over the in-memory row's at the same scale."""
    memory = {r["scale"]: r["epoch_time_s"] for r in rows if r["feed"] == "memory"}
    for r in rows:
        base = memory.get(r["scale"])
        r["vs_memory"] = r["epoch_time_s"] / base if base and r["feed"] == "stream" else None
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start_logging(args)
    x_train, y_train, x_test, y_test = load_mnist(None, limit=args.limit)
    rows = []
    with LocalCluster(workers=2, cores_per_worker=1) as cluster:
        # A fresh Python worker per fit, so that each peak RSS is that fit's own.
        spark = cluster.session("out-of-core", **{"spark.python.worker.reuse": "false"})
        folder = data_dir(args.data_dir)
        train = scale_pixels(parquet_images(spark, folder, "mnist-train", x_train, y_train))
        test = scale_pixels(parquet_images(spark, folder, "mnist-test", x_test, y_test)).cache()
        for scale in args.scales:
            frame = train if scale == 1 else train.crossJoin(spark.range(scale).hint("broadcast")).drop("id")
            epochs = args.epochs if scale == args.scales[0] else args.large_epochs
            for feed in ("memory", "stream"):
                if feed == "memory" and scale > args.memory_max_scale:
                    continue
                rows.append(run(frame, len(x_train) * scale, scale, feed, epochs, args.batch_size,
                                test if scale == args.scales[0] else None))
    rows = with_ratios(rows)
    out = Path(args.out)
    paths = write_results(rows, out, "out_of_core", metadata={"job": "bench_out_of_core", **vars(args)})
    print(markdown_table(rows, COLUMNS))
    print(f"results: {', '.join(str(p) for p in paths.values())}")
    publish(args.publish, "out-of-core", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
