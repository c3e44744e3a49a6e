"""Predict speed-up against 1-64 workers from measured costs; check it against measured runs; plot it.

The model is ``trainer_benchmarks.support.queueing_model`` (mean-value analysis of
the workers and the server's CPU and link; for all-reduce, a ring over every
worker's own link). Its inputs, measured on this
project's machine (defaults: the faster machine's, 2026-11-25, see
docs/benchmarks.md; override them, or read them from result files):

* ``--batch-ms``: one batch of the MNIST CNN in plain Keras, one thread
  (10.8 ms; the first machine's was 41.9 s/epoch / 1,875 batches = 22.3 ms, issue 17);
* ``--worker-ms``: a worker's own exchange work per commit (reading its
  weights, the payload, loading the reply: ``benchmarks/profile_overhead.py``);
* ``--server-ms``: the server's CPU per commit: 1 / the most commits/s
  `make bench-ps` reached with 1M parameters (``--bench-ps`` reads it);
  ``--replies-server-ms`` the same with compressed replies (its ``+replies``
  rows);
* ``--hop-us``: all-reduce's latency per ring hop (2(N - 1) hops a step; on a
  LAN gloo's and TCP's per-message cost); each worker sends 2(N - 1)/N of the
  gradient's bytes per step over its own link.

The plot has one panel per link speed (1, 10 and 100 GbE; the parameter
server's curves are the driver's link, all-reduce's each worker's), with the
parameter server's scenarios and all-reduce side by side, and a panel that
checks both against runs on this machine: all-reduce's 1 and 2 workers from
``--bench-allreduce`` (a ``make bench`` ``mnist-allreduce/mnist.json``; its
speed-up is against plain Keras under JAX), whose 2-worker run also sets
``--hop-us`` for this machine's loopback when given.

It writes the predictions (JSON, CSV), the knees, a validation table against
measured runs, and the plot (default ``docs/scale_model.png``). The runs it
is checked against: issue 17's 1 and 2 workers (built in), the lab's 2 and 3
with the defaults (``--bench-lab``: local SGD, on 2 shared cores), the
``profile_overhead`` run the inputs came from (``--overhead``), and the 1- and
2-worker rows of a ``make bench`` MNIST result (``--bench-mnist``:
the whole Spark job, per-epoch costs included).

    python benchmarks/scale_model.py --out results/scale_model
    python benchmarks/scale_model.py --bench-ps results/bench_ps/bench_ps.json --overhead results/overhead/overhead.json \
        --bench-mnist results/mnist/mnist.json --bench-allreduce results/mnist-allreduce/mnist.json
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from trainer_jobs.support.published import add_publish_arg, publish
from trainer_jobs.support.report import markdown_table
from trainer_benchmarks.support.queueing_model import (
    Cluster,
    Workload,
    curve,
    knee,
    predict,
    predict_allreduce,
    predict_local_sgd,
    with_codec,
)

PARAMS = 1_048_853
COUNTS = list(range(1, 65))
LINKS = (1.0, 10.0, 100.0)  # Gbit/s
HOP_US = 50.0  # all-reduce's latency per ring hop on a LAN (gloo over TCP), microseconds
GPU_BATCH_MS = 1.5  # one batch of the MNIST CNN on an H100/H200 (1.3-1.7 ms measured with make bench-gpu)
# A local-SGD worker's own work per average on the host (reading its 1M weights, the bf16 delta, writing them back).
HOST_MS = 3.0
# The default's targets (16 workers): efficiency at 10 GbE with CPU and GPU steps; on 1 GbE faster than today's
# parameter-server default at 8 workers.
TARGETS = {"cpu_10gbe_16": 0.75, "gpu_10gbe_16": 0.6}
# This machine's loopback as all-reduce meets it (two processes, one core each; measured, see docs/benchmarks.md).
HERE_HOP_US = 1300.0  # benchmarks/bench_ring.py, 2 processes, 2026-11-26 19:00 (1,296; earlier on a busy machine 1,000-1,800)
HERE_GBIT = 6.7  # the same run (earlier: 4.8-9.4)
HERE_JAX_BATCH_MS = 54.8  # one batch of the MNIST CNN in plain Keras under JAX, one core (jobs/bench.py --quick, 19:18)
# The lab's links as two workers measured them (docs/lab.md), Gbit/s of TCP payload, and its MNIST epoch in batches
# of one worker (make bench-lab: 6,000 images, batch 32).
LAB_GBIT = {"unshaped": 10.0, "1gbit": 0.915, "100mbit": 0.095}
LAB_BATCHES = 6000 / 32
LAB_HOP_US = 200.0  # the Docker bridge's per-message cost as a ring hop meets it (between loopback and a LAN)
# Measured runs to check the model against: (where, workers, speed-up against what, value).
MEASURED = [
    ("issue 17, 2 cores (the first machine: plain 41.9, 1 worker 48.8, 2 workers 24.2 s/epoch)", 1, "plain",
     41.9 / 48.8),
    ("issue 17, 2 cores (the first machine: plain 41.9, 1 worker 48.8, 2 workers 24.2 s/epoch)", 2, "plain",
     41.9 / 24.2),
]
# The runs the default inputs came from (the faster machine, 2026-11-25), unless --overhead / --bench-mnist give
# their files.
OVERHEAD_RUN = [("profile_overhead, 2 cores (the faster machine, 2026-11-25: the inputs' run)", n, "plain", v)
                for n, v in ((1, 0.85), (2, 1.66))]
BENCH_RUN = [("make bench, 2 cores (the faster machine, 2026-11-25: the whole Spark job)", n, "plain", v)
             for n, v in ((1, 0.83), (2, 1.49))]
# How the plot marks each kind of measured run: (a word of its label, marker, colour, legend).
STYLES = [
    ("allreduce", "*", "black", "measured: all-reduce (x plain Keras under JAX)"),
    ("issue", "s", "tab:red", "measured: issue 17 (the first machine)"),
    ("bench", "D", "tab:purple", "measured: make bench (--bench-mnist)"),
    ("overhead", "^", "tab:green", "measured: profile_overhead (the inputs' run)"),
]
# Measured all-reduce runs: (where, workers, speed-up against plain Keras under JAX); --bench-allreduce adds more.
MEASURED_ALLREDUCE: list[tuple[str, int, float]] = [
    ("allreduce: jobs/bench.py --quick, 2 cores, 2026-11-26 19:18 (6,000 images, 2 epochs)", n, v)
    for n, v in ((1, 1.07), (2, 2 * 0.699))]


def lab_checks(path: str, hop_s: float, host_s: float) -> list[dict]:
    """The model's local SGD against ``make bench-lab``'s MNIST runs with the defaults (local SGD on the lab's
    hosts): the speed-up of N workers over 1 at each link, the model's on this machine's 2 cores at the link's
    measured rate (`LAB_GBIT`), its step from the 1-worker run's epoch over `LAB_BATCHES`; 3 workers on the 2
    cores move at the pace of the core two of them share (``queueing_model.crowding``)."""
    times: dict[tuple[str, int], list[float]] = {}
    with open(path, encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f):
            if (row["job"], row["asked"]) == ("mnist", "default") and row["epoch_time_s"] and not row["error"]:
                times.setdefault((row["link"], int(row["workers"])), []).append(float(row["epoch_time_s"]))
    checks = []
    for (link, n), runs in sorted(times.items()):
        one = times.get((link, 1))
        if n < 2 or not one or link not in LAB_GBIT:
            continue
        work = Workload(PARAMS, statistics.mean(one) / LAB_BATCHES, 1, 0.0, 0.0)
        model = predict_local_sgd(work, Cluster(link_gbit=LAB_GBIT[link], cores=2), n, hop_s, host_s)
        measured = statistics.mean(one) / statistics.mean(runs)
        ratio = model["speedup"] / measured
        checks.append({"run": f"make bench-lab, {link} ({len(runs)} runs)", "workers": n, "against": "1 worker",
                       "measured": measured, "model": model["speedup"], "model_vs_measured": ratio,
                       "within_1_25": 1 / 1.25 <= ratio <= 1.25})
    return checks


def _measured_inputs(args) -> None:
    """Fill --server-ms / --worker-ms / --batch-ms from result files when given, and the runs to check against."""
    args.measured += [] if args.overhead else OVERHEAD_RUN
    args.measured += [] if args.bench_mnist else BENCH_RUN
    if args.bench_ps:
        rows = json.loads(Path(args.bench_ps).read_text(encoding="utf-8"))["rows"]
        best = max((r for r in rows if r["compression"] == "none" and r["params"] < 2_000_000  # as fits run it:
                    and r.get("shards", 1) == 1 and r.get("mac", "on") == "on"),  # one endpoint, the MAC on
                   key=lambda r: r["ps_per_s"])
        args.server_ms = 1000.0 / best["ps_per_s"]
        replies = [r for r in rows if str(r["compression"]).endswith("+replies") and r["params"] < 2_000_000
                   and r.get("shards", 1) == 1 and r.get("mac", "on") == "on"]
        if replies:  # the server's passes over a compressed reply: the slowest codec's, as fits would meet it
            args.replies_server_ms = 1000.0 / min(r["ps_per_s"] for r in replies)
    if args.overhead:
        data = json.loads(Path(args.overhead).read_text(encoding="utf-8"))
        rows = {r["setup"]: r for r in data["rows"]}
        if "workers=1" in rows:
            one = rows["workers=1"]
            args.worker_ms = one["state_ms"] + one["payload_ms"] + one["load_ms"]
        if "plain" in rows:
            batches = -(-data["metadata"]["limit"] // data["metadata"]["batch_size"])
            args.batch_ms = 1000.0 * rows["plain"]["epoch_s"] / batches
            for n in (1, 2):
                if f"workers={n}" in rows and rows[f"workers={n}"].get("vs_plain"):
                    args.measured.append((f"profile_overhead, 2 cores ({Path(args.overhead).name}, the inputs' run)",
                                          n, "plain", n * rows[f"workers={n}"]["vs_plain"]))
    if args.bench_allreduce:
        data = json.loads(Path(args.bench_allreduce).read_text(encoding="utf-8"))
        rows = data["rows"]
        plain = [r for r in rows if r.get("workers") == 0 and r.get("samples_per_s_per_worker")]
        if plain:  # the run's own plain Keras under JAX
            batch = data.get("metadata", {}).get("batch_size", 32)
            args.jax_batch_ms = 1000.0 * batch / plain[0]["samples_per_s_per_worker"]
        for row in rows:
            if row.get("workers") in (1, 2) and row.get("timing_valid") and row.get("throughput_vs_keras"):
                args.measured_allreduce.append((f"allreduce: make bench, 2 cores ({Path(args.bench_allreduce).name})",
                                                row["workers"], row["workers"] * row["throughput_vs_keras"]))
    if args.bench_mnist:
        rows = json.loads(Path(args.bench_mnist).read_text(encoding="utf-8"))["rows"]
        for row in rows:
            if row.get("workers") in (1, 2) and row.get("timing_valid") and row.get("throughput_vs_keras"):
                args.measured.append((f"make bench, 2 cores ({Path(args.bench_mnist).name}: the whole Spark job)",
                                      row["workers"], "plain", row["workers"] * row["throughput_vs_keras"]))


def scenarios(base: Workload, fast_server_ms: float, replies_server_ms: float) -> dict[str, tuple[Workload, int]]:
    """Named (workload, shards) variants: the measured server, codecs (compressed replies cost the server
    `replies_server_ms` per commit), window, a faster server, shards."""
    fast = replace(base, server_s=fast_server_ms / 1000)
    replying = replace(base, server_s=replies_server_ms / 1000)
    return {
        f"as measured (window {base.window})": (base, 1),
        "bf16 commits": (with_codec(base, "bf16"), 1),
        "bf16 commits and replies": (with_codec(replying, "bf16", replies=True), 1),
        "topk:0.01 commits and replies": (with_codec(replying, "topk:0.01", replies=True), 1),
        "window 20": (replace(base, window=20), 1),
        f"a {fast_server_ms:g} ms/commit server": (fast, 1),
        f"a {fast_server_ms:g} ms/commit server, 4 shards": (fast, 4),
    }


def plot(base: Workload, variants, png: Path, measured, hop_s: float, here: Cluster, here_hop_s: float,
         measured_allreduce, jax_base: Workload, gpu_batch_s: float, host_s: float) -> None:
    import matplotlib  # deferred: only the plot needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred, as matplotlib

    fig, axes = plt.subplots(1, len(LINKS) + 1, figsize=(21, 5.2))
    for ax, gbit in zip(axes[:-1], LINKS):
        for name, (work, shards) in variants.items():
            ys = [p["speedup"] for p in curve(work, Cluster(link_gbit=gbit, shards=shards), COUNTS)]
            line, = ax.plot(COUNTS, ys, label=f"PS: {name}", linewidth=1.0)
            k = knee(work, Cluster(link_gbit=gbit, shards=shards))
            if k <= COUNTS[-1]:
                ax.axvline(k, color=line.get_color(), linestyle=":", linewidth=0.8)
        ys = [predict_allreduce(base, Cluster(link_gbit=gbit), n, hop_s)["speedup"] for n in COUNTS]
        ax.plot(COUNTS, ys, color="black", linewidth=2.4, label=f"all-reduce (ring, {hop_s * 1e6:g} us per hop)")
        for step_s, style, what in ((base.batch_s, "-", "CPU"), (gpu_batch_s, "-.", "GPU")):
            ys = [predict_local_sgd(replace(base, batch_s=step_s), Cluster(link_gbit=gbit), n, hop_s, host_s)["speedup"]
                  for n in COUNTS]
            ax.plot(COUNTS, ys, color="darkcyan", linestyle=style, linewidth=2.4,
                    label=f"local SGD, bf16, period by time: {what} steps ({step_s * 1000:g} ms)")
        ax.plot(COUNTS, COUNTS, color="grey", linestyle="--", linewidth=0.8, label="ideal")
        ax.set(title=f"{gbit:g} GbE (PS: the driver's link; all-reduce: each worker's)", xlabel="workers",
               ylabel="speed-up vs plain Keras", xlim=(1, 64), ylim=(0, 64))
        ax.legend(fontsize=6.5, loc="upper left")
    ax = axes[-1]
    ns = [1, 2, 3, 4]
    ax.plot(ns, [predict(base, Cluster(link_gbit=None, cores=2), n)["speedup"] for n in ns], marker="o",
            label="model, PS: 2 cores, loopback")
    ax.plot(ns, [predict_allreduce(jax_base, here, n, here_hop_s)["speedup"] for n in ns], marker="o",
            color="black", label=f"model, all-reduce: 2 cores, loopback, JAX ({jax_base.batch_s * 1000:.0f} ms/batch)")
    shown = set()
    points = [(w, n, a, v) for w, n, a, v in measured] + [(w, n, "plain", v) for w, n, v in measured_allreduce]
    for where, n, against, value in points:
        scale = predict(base, Cluster(link_gbit=None, cores=2), 1)["speedup"] if against == "1 worker" else 1.0
        word, marker, color, label = next((s for s in STYLES if s[0] in where), STYLES[-1])
        ax.scatter([n], [value * scale], marker=marker, color=color, zorder=3, s=60 if marker == "*" else 30,
                   label=None if word in shown else label)
        shown.add(word)
    ax.set(title="validation: this 2-core machine", xlabel="workers", ylabel="speed-up vs plain Keras",
           xticks=ns)
    ax.legend(fontsize=6.5, loc="upper left")
    fig.suptitle(f"Scale model: MNIST CNN ({base.params:,} parameters), batch {base.batch_s * 1000:.1f} ms; parameter "
                 f"server (window {base.window}): worker {base.worker_s * 1000:.1f} ms and server "
                 f"{base.server_s * 1000:.1f} ms per commit; all-reduce: 2(N-1)/N of 4.2 MB per worker per step")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)


def local_sgd_table(base: Workload, gpu_batch_s: float, hop_s: float, host_s: float) -> dict:
    """The default (local SGD, bf16, its period chosen by time) at 1-64 workers on each link with CPU and GPU
    steps, today's parameter-server default beside it (DOWNPOUR, window 1 from 6 workers: the staleness bound),
    and whether the targets hold (`TARGETS`)."""
    rows = []
    for gbit in LINKS:
        for what, step_s in (("CPU", base.batch_s), ("GPU", gpu_batch_s)):
            work = replace(base, batch_s=step_s)
            for n in (1, 2, 3, 4, 8, 16, 32, 64):
                p = predict_local_sgd(work, Cluster(link_gbit=gbit), n, hop_s, host_s)
                ps = predict(replace(work, window=max(1, 5 // max(1, n - 1)) if n > 1 else 5), Cluster(link_gbit=gbit), n)
                rows.append({"link": f"{gbit:g} GbE", "steps": f"{what} {step_s * 1000:g} ms", "workers": n,
                             "period": p["period"], "speedup": p["speedup"], "efficiency": p["efficiency"],
                             "ps_default_speedup": ps["speedup"]})
    at = {(r["link"], r["steps"].split()[0], r["workers"]): r for r in rows}
    targets = {
        "16 workers, 10 GbE, CPU steps >= 0.75 N": at[("10 GbE", "CPU", 16)]["efficiency"] >= TARGETS["cpu_10gbe_16"],
        "16 workers, 10 GbE, GPU steps >= 0.6 N": at[("10 GbE", "GPU", 16)]["efficiency"] >= TARGETS["gpu_10gbe_16"],
        "16 workers, 1 GbE, faster than today's default at 8": all(
            at[("1 GbE", kind, 16)]["speedup"] > at[("1 GbE", kind, 8)]["ps_default_speedup"] for kind in ("CPU", "GPU")),
    }
    # the figures the page quotes beside the table: the targets' efficiencies and one bf16 average's megabytes
    return {"rows": rows, "targets": targets, "target_efficiency": dict(TARGETS), "average_mb": base.params * 2 / 1e6}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-ms", type=float, default=10.8, help="plain Keras ms per batch (default 10.8)")
    parser.add_argument("--worker-ms", type=float, default=2.3,
                        help="worker's exchange work per commit (ms, default 2.3)")
    parser.add_argument("--server-ms", type=float, default=1000 / 312.0,
                        help="server CPU per commit (ms, default 1000/312: the commits/s bench-ps reached)")
    parser.add_argument("--fast-server-ms", type=float, default=1.0,
                        help="server CPU per commit of the faster server to plot (ms, default 1)")
    parser.add_argument("--replies-server-ms", type=float, default=4.8,
                        help="server CPU per commit with compressed replies (ms; --bench-ps reads it from its "
                             "+replies rows)")
    parser.add_argument("--window", type=int, default=5, help="batches per commit (default 5)")
    parser.add_argument("--bench-ps", default=None, help="bench_ps.json to read --server-ms from")
    parser.add_argument("--overhead", default=None, help="overhead.json to read --worker-ms and --batch-ms from")
    parser.add_argument("--bench-mnist", default=None, help="a make bench mnist.json to check the model against")
    parser.add_argument("--hop-us", type=float, default=HOP_US,
                        help=f"all-reduce's latency per ring hop on a LAN, microseconds (default {HOP_US:g})")
    parser.add_argument("--here-hop-us", type=float, default=HERE_HOP_US,
                        help="the same on this machine's loopback, for the validation panel (default "
                             f"{HERE_HOP_US:g}, measured)")
    parser.add_argument("--here-gbit", type=float, default=HERE_GBIT,
                        help=f"this machine's loopback bandwidth for all-reduce, Gbit/s (default {HERE_GBIT:g}, "
                             "measured)")
    parser.add_argument("--jax-batch-ms", type=float, default=HERE_JAX_BATCH_MS,
                        help="plain Keras ms per batch under JAX on this machine, for the all-reduce check (default "
                             f"{HERE_JAX_BATCH_MS:g}; --bench-allreduce reads it from its plain Keras row)")
    parser.add_argument("--bench-allreduce", default=None,
                        help="a make bench mnist-allreduce/mnist.json (its 1- and 2-worker rows) to check the "
                             "all-reduce model against")
    parser.add_argument("--gpu-batch-ms", type=float, default=GPU_BATCH_MS,
                        help=f"one batch on a GPU, for local SGD's GPU curves (ms, default {GPU_BATCH_MS:g})")
    parser.add_argument("--host-ms", type=float, default=HOST_MS,
                        help=f"a local-SGD worker's own work per average (ms, default {HOST_MS:g})")
    parser.add_argument("--bench-lab", default=None,
                        help="a make bench-lab bench-lab.csv: check local SGD's model against its MNIST default runs")
    parser.add_argument("--png", default="docs/scale_model.png", help="plot path (default docs/scale_model.png)")
    parser.add_argument("--out", default="results/scale_model", help="results directory")
    add_publish_arg(parser, "scale-model")
    args = parser.parse_args(argv)
    args.measured = list(MEASURED)
    args.measured_allreduce = [] if args.bench_allreduce else list(MEASURED_ALLREDUCE)
    _measured_inputs(args)
    base = Workload(PARAMS, args.batch_ms / 1000, args.window, args.worker_ms / 1000, args.server_ms / 1000)
    variants = scenarios(base, args.fast_server_ms, args.replies_server_ms)
    rows, knees = [], []
    hop_s = args.hop_us / 1e6
    for gbit in LINKS:
        for name, (work, shards) in variants.items():
            cluster = Cluster(link_gbit=gbit, shards=shards)
            k = knee(work, cluster)
            at64 = predict(work, cluster, 64)
            knees.append({"link": f"{gbit:g} GbE", "scenario": name, "knee_workers": k,
                          "speedup_at_16": predict(work, cluster, 16)["speedup"], "speedup_at_64": at64["speedup"],
                          "bottleneck": at64["bottleneck"]})
            rows += [{"link_gbit": gbit, "scenario": name, **p} for p in curve(work, cluster, COUNTS)]
        ring = Cluster(link_gbit=gbit)
        knees.append({"link": f"{gbit:g} GbE", "scenario": f"all-reduce ({args.hop_us:g} us per hop)",
                      "knee_workers": float("inf"),
                      "speedup_at_16": predict_allreduce(base, ring, 16, hop_s)["speedup"],
                      "speedup_at_64": predict_allreduce(base, ring, 64, hop_s)["speedup"],
                      "bottleneck": "each worker's link and the hops"})
        rows += [{"link_gbit": gbit, "scenario": "all-reduce", **predict_allreduce(base, ring, n, hop_s)}
                 for n in COUNTS]
    here = Cluster(link_gbit=None, cores=2)
    one = predict(base, here, 1)["speedup"]
    checks = []
    for where, n, against, value in args.measured:
        model = predict(base, here, n)["speedup"] / (one if against == "1 worker" else 1.0)
        checks.append({"run": where, "workers": n, "against": against, "measured": value, "model": model,
                       "model_vs_measured": model / value})
    ring_here = Cluster(link_gbit=args.here_gbit, cores=2)
    jax_base = replace(base, batch_s=args.jax_batch_ms / 1000)  # the measured all-reduce runs train under JAX
    for where, n, value in args.measured_allreduce:
        model = predict_allreduce(jax_base, ring_here, n, args.here_hop_us / 1e6)["speedup"]
        checks.append({"run": where, "workers": n, "against": "plain (JAX)", "measured": value, "model": model,
                       "model_vs_measured": model / value})
    if args.bench_lab:
        checks += lab_checks(args.bench_lab, LAB_HOP_US / 1e6, args.host_ms / 1000)
    local = local_sgd_table(base, args.gpu_batch_ms / 1000, hop_s, args.host_ms / 1000)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    inputs = {"params": PARAMS, "batch_ms": args.batch_ms, "worker_ms": args.worker_ms, "server_ms": args.server_ms,
              "window": args.window, "fast_server_ms": args.fast_server_ms,
              "replies_server_ms": args.replies_server_ms, "hop_us": args.hop_us, "here_hop_us": args.here_hop_us,
              "here_gbit": args.here_gbit, "jax_batch_ms": args.jax_batch_ms}
    (out / "scale_model.json").write_text(json.dumps({"inputs": inputs, "knees": knees, "validation": checks,
                                                      "local_sgd": local, "predictions": rows}, indent=2) + "\n",
                                         encoding="utf-8")
    with open(out / "scale_model.csv", "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        writer.writeheader()
        writer.writerows(rows)
    plot(base, variants, Path(args.png), args.measured, hop_s, ring_here, args.here_hop_us / 1e6,
         args.measured_allreduce, jax_base, args.gpu_batch_ms / 1000, args.host_ms / 1000)
    print("inputs:", ", ".join(f"{k} {v:.4g}" for k, v in inputs.items()))
    print(markdown_table(knees, list(knees[0])))
    print()
    print(markdown_table(checks, list(dict.fromkeys(k for c in checks for k in c))))
    print()
    print(markdown_table(local["rows"], list(local["rows"][0])))
    print("targets:", ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in local["targets"].items()))
    print(f"results: {out / 'scale_model.json'}, {out / 'scale_model.csv'}, {args.png}")
    publish(args.publish, "scale-model", {"inputs": inputs, "knees": knees, "validation": checks, "local_sgd": local})
    return 0


if __name__ == "__main__":
    sys.exit(main())
