"""What the frame MAC and TLS cost, measured in one run: the MAC options, one update, the MNIST CNN at 2 workers.

1. The MAC: MB/s of each option (Poly1305 with a one-time key per frame, the
   default; HMAC-SHA256, keyed BLAKE2b, and for reference HMAC-SHA512 and
   keyed BLAKE2s) over frames of 4, 16 and 40 MB, fed buffer by buffer as
   ``trainer.transport.frame_auth`` does.
2. One update: a DOWNPOUR COMMIT of one million float32 (the size of the MNIST
   CNN, 4.2 MB) and its 4.2 MB reply, between a real ParameterServer and
   PSClient over loopback, --updates times per mode.
3. The MNIST job's CNN trained on --workers (2) Spark workers once per mode
   (modes interleaved, --repeats rounds): seconds per epoch and the workers'
   own communication time per update (``comm_s / commits``).

Modes: ``plain`` (no frame MAC: only the handshake is authenticated), ``mac``
(the default, Poly1305), ``hmac`` (HMAC-SHA256 instead), ``tls`` (TLS and the
default MAC), ``tls-only`` (TLS without the MAC).
Every ratio compares a mode with ``plain`` measured in the same run. Rows go
to ``<out>/security.{json,csv,md}``; the table is printed.

    python benchmarks/bench_security.py --out results/security
    python benchmarks/bench_security.py --mac-only --out results/security
    python benchmarks/bench_security.py --limit 3000 --epochs 2 --updates 10 --out results/security-small
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import hmac
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from trainer import Trainer
from trainer.data.prep import scale_pixels
from trainer.lr_schedules import planned_steps
from trainer.internals import OneTimePoly1305, ParameterServer, PSClient, new_secret
from trainer_jobs.support.models import build_cnn
from trainer_jobs.support.cli import add_verbose_arg, algorithm_from_args, positive_int, start_logging
from trainer_jobs.support.datasets import data_dir, load_mnist, parquet_images
from trainer_jobs.support.report import markdown_table, write_results
from trainer_jobs.support.scaling import cluster_session, steady_epoch_time, timing_valid

MODES = {"plain": {"frame_mac": False}, "mac": {}, "hmac": {"frame_mac": "hmac-sha256"}, "tls": {"tls": True},
         "tls-only": {"tls": True, "frame_mac": False}}
FRAME_MB = (4, 16, 40)
CNN_PARAMETERS = 1_048_853
COLUMNS = ["part", "mode", "size_mb", "mb_per_s", "ms_per_update", "epoch_time_s", "comm_ms_per_update",
           "vs_plain", "metric_value", "timing_valid"]


def _macs(key: bytes) -> dict[str, Any]:
    return {
        "poly1305": lambda: OneTimePoly1305(key, 0),
        "hmac-sha256": lambda: hmac.new(key, b"seq", hashlib.sha256),
        "blake2b": lambda: hashlib.blake2b(b"seq", key=key, digest_size=32),
        "hmac-sha512": lambda: hmac.new(key, b"seq", hashlib.sha512),
        "blake2s": lambda: hashlib.blake2s(b"seq", key=key),
    }


def bench_macs(repeats: int = 5) -> list[dict[str, Any]]:
    """Part 1: MB/s of each MAC over frames of several sizes (best of `repeats`, a frame in 1 MB arrays)."""
    rows, key = [], new_secret()
    for mb in FRAME_MB:
        buffers = [memoryview(np.random.default_rng(mb).bytes(1 << 20)) for _ in range(mb)]
        for name, make in _macs(key).items():
            best = float("inf")
            for _ in range(repeats):
                start = time.perf_counter()
                h = make()
                for b in buffers:
                    h.update(b)
                h.digest()
                best = min(best, time.perf_counter() - start)
            rows.append({"part": "mac", "mode": name, "size_mb": mb, "mb_per_s": mb / best,
                         "ms_per_update": 1000 * best})
    return rows


class _Downpour:
    """The server side of DOWNPOUR (center += delta, reply the center), enough to move real-sized frames."""

    name = "downpour"
    synchronous = False
    exchanges_optimizer_state = False

    def server_commit(self, center, payload, staleness):
        new = [c + p for c, p in zip(center, payload)]
        return new, new


def bench_updates(modes: list[str], updates: int) -> list[dict[str, Any]]:
    """Part 2: ms per COMMIT round trip of a CNN-sized model over loopback, per mode (median)."""
    rows = []
    center = [np.zeros(CNN_PARAMETERS, "f4")]
    delta = [np.full(CNN_PARAMETERS, 1e-6, "f4")]
    for mode in modes:
        options = MODES[mode]
        with ParameterServer(_Downpour(), center, 1, new_secret(), frame_mac=options.get("frame_mac", True),
                             tls=options.get("tls", False)) as ps:
            with PSClient(*ps.address, ps.credentials, 0, timeout=60) as client:
                client.commit(delta, {"step": 0})  # warm-up
                times = []
                for step in range(updates):
                    start = time.perf_counter()
                    client.commit(delta, {"step": step + 1})
                    times.append(time.perf_counter() - start)
        rows.append({"part": "update", "mode": mode, "size_mb": 4 * CNN_PARAMETERS / 2**20,
                     "ms_per_update": 1000 * statistics.median(times)})
    return _vs_plain(rows, "ms_per_update")


def bench_mnist(args, modes: list[str]) -> list[dict[str, Any]]:
    """Part 3: the MNIST CNN at --workers workers, once per mode and round, modes interleaved."""
    x_train, y_train, x_test, y_test = load_mnist(args.data, limit=args.limit)
    steps = planned_steps(len(x_train), args.workers, args.batch_size, args.epochs)
    rows = []
    with cluster_session(args.master, args.workers, 1, "bench-security") as spark:
        folder = data_dir(args.data_dir)
        train = scale_pixels(parquet_images(spark, folder, "mnist-train", x_train, y_train)).cache()
        test = scale_pixels(parquet_images(spark, folder, "mnist-test", x_test, y_test)).cache()
        train.count(), test.count()
        for round_ in range(args.repeats):
            for mode in modes:
                fitted = Trainer(functools.partial(build_cnn, True, steps), algorithm=algorithm_from_args("downpour", 5),
                                 num_workers=args.workers, batch_size=args.batch_size, epochs=args.epochs,
                                 seed=args.seed, verbose=False, **MODES[mode]).fit(train)
                history = fitted.history
                final = [w for w in history.workers if w["attempt"] == max(x["attempt"] for x in history.workers)]
                comm = sum(w["comm_s"] for w in final) / max(1, sum(w["commits"] for w in final))
                rows.append({"part": "mnist", "mode": mode, "round": round_, "workers": args.workers,
                             "epoch_time_s": steady_epoch_time([e["time_s"] for e in history.epochs]),
                             "comm_ms_per_update": 1000 * comm, "updates": history.num_updates,
                             "bytes": history.bytes_moved, "metric_name": "accuracy",
                             "metric_value": fitted.evaluate(test)["accuracy"],
                             "timing_valid": timing_valid(args.workers, 1, args.master)})
                print(f"mnist {mode:8s} round {round_}: {rows[-1]['epoch_time_s']:.2f} s/epoch, "
                      f"{rows[-1]['comm_ms_per_update']:.1f} ms of communication per update", flush=True)
    return _vs_plain(rows, "epoch_time_s")


def _vs_plain(rows: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """Each row's `key` over the mean of the plain rows of the same run (None without plain rows)."""
    plain = [r[key] for r in rows if r["mode"] == "plain"]
    base = sum(plain) / len(plain) if plain else None
    for r in rows:
        r["vs_plain"] = r[key] / base if base else None
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {','.join(MODES)}")
    parser.add_argument("--mac-only", action="store_true", help="measure the MAC algorithms only (part 1)")
    parser.add_argument("--no-mnist", action="store_true", help="skip part 3 (no Spark, no training)")
    parser.add_argument("--updates", type=positive_int, default=30, help="round trips per mode in part 2 (default 30)")
    parser.add_argument("--master", default=None, help="Spark master URL; default: an embedded LocalCluster")
    parser.add_argument("--workers", type=positive_int, default=2, help="Spark workers in part 3 (default 2)")
    parser.add_argument("--epochs", type=positive_int, default=3, help="epochs per MNIST run (default 3)")
    parser.add_argument("--batch-size", type=positive_int, default=32, help="minibatch per worker (default 32)")
    parser.add_argument("--limit", type=positive_int, default=12_000, help="training images (default 12000)")
    parser.add_argument("--repeats", type=positive_int, default=1, help="rounds of all modes in part 3 (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", default=None, help="folder with the MNIST idx files, or a Parquet/CSV file")
    parser.add_argument("--data-dir", default=None, help="where the images are written once as Parquet")
    parser.add_argument("--out", default="results/security", help="results directory (default results/security)")
    add_verbose_arg(parser)
    args = parser.parse_args(argv)
    args.mode_list = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not args.mode_list or any(m not in MODES for m in args.mode_list):
        parser.error(f"--modes: expected a comma-separated subset of {','.join(MODES)}, got {args.modes!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start_logging(args)
    rows = bench_macs()
    if not args.mac_only:
        rows += bench_updates(args.mode_list, args.updates)
        if not args.no_mnist:
            rows += bench_mnist(args, args.mode_list)
    for r in rows:
        r.setdefault("speedup", None)  # not a scaling run
    paths = write_results(rows, Path(args.out), "security",
                          metadata={"job": "bench_security", "cpu_count": os.cpu_count(), **vars(args)})
    print(markdown_table(rows, COLUMNS))
    print(f"results: {', '.join(str(p) for p in paths.values())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
