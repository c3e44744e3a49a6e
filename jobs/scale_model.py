"""Predict speed-up against 1-64 workers from measured costs; check it against measured runs; plot it.

The model is ``trainer_jobs.support.scale_model`` (mean-value analysis of
the workers and the server's CPU and link). Its inputs, measured on this
project's machine (defaults; override them, or read them from result files):

* ``--batch-ms``: one batch of the MNIST CNN in plain Keras, one thread
  (41.9 s/epoch / 1,875 batches = 22.3 ms, issue 17);
* ``--worker-ms``: a worker's own exchange work per commit (reading its
  weights, the payload, loading the reply: ``jobs/profile_overhead.py``);
* ``--server-ms``: the server's CPU per commit: 1 / the most commits/s
  `make bench-ps` reached with 1M parameters (``--bench-ps`` reads it);
  ``--replies-server-ms`` the same with compressed replies (its ``+replies``
  rows).

It writes the predictions (JSON, CSV), the knees, a validation table against
measured runs, and the plot (default ``docs/scale_model.png``). The runs it
is checked against: issue 17's 1 and 2 workers and the lab's 2 and 3 (built
in), the ``profile_overhead`` run the inputs came from (``--overhead``), and
the 1- and 2-worker rows of a ``make bench`` MNIST result (``--bench-mnist``:
the whole Spark job, per-epoch costs included).

    python jobs/scale_model.py --out results/scale_model
    python jobs/scale_model.py --bench-ps results/bench_ps/bench_ps.json --overhead results/overhead/overhead.json \
        --bench-mnist results/mnist/mnist.json
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from dataclasses import replace
from pathlib import Path

from trainer_jobs.support.report import markdown_table
from trainer_jobs.support.scale_model import Cluster, Workload, curve, knee, predict, with_codec

PARAMS = 1_048_853
COUNTS = list(range(1, 65))
# Measured runs to check the model against: (where, workers, speed-up against what, value).
MEASURED = [
    ("issue 17, 2 cores (the first machine: plain 41.9, 1 worker 48.8, 2 workers 24.2 s/epoch)", 1, "plain",
     41.9 / 48.8),
    ("issue 17, 2 cores (the first machine: plain 41.9, 1 worker 48.8, 2 workers 24.2 s/epoch)", 2, "plain",
     41.9 / 24.2),
    ("lab, 2 cores (docs/lab.md: 6,000 images, 2 epochs)", 2, "1 worker", 1.32),
    ("lab, 2 cores (docs/lab.md: 6,000 images, 2 epochs)", 3, "1 worker", 0.93),
]
# How the plot marks each kind of measured run: (a word of its label, marker, colour, legend).
STYLES = [
    ("lab", "x", "black", "measured in the lab (x 1-worker model)"),
    ("issue", "s", "tab:red", "measured: issue 17 (the first machine)"),
    ("bench", "D", "tab:purple", "measured: make bench (--bench-mnist)"),
    ("overhead", "^", "tab:green", "measured: profile_overhead (the inputs' run)"),
]


def _measured_inputs(args) -> None:
    """Fill --server-ms / --worker-ms / --batch-ms from result files when given."""
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


def plot(base: Workload, variants, png: Path, measured) -> None:
    import matplotlib  # deferred: only the plot needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred, as matplotlib

    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    for ax, (title, gbit) in zip(axes[:2], (("1 GbE driver link", 1.0), ("10 GbE driver link", 10.0))):
        for name, (work, shards) in variants.items():
            ys = [p["speedup"] for p in curve(work, Cluster(link_gbit=gbit, shards=shards), COUNTS)]
            line, = ax.plot(COUNTS, ys, label=name)
            k = knee(work, Cluster(link_gbit=gbit, shards=shards))
            if k <= COUNTS[-1]:
                ax.axvline(k, color=line.get_color(), linestyle=":", linewidth=0.8)
        ax.plot(COUNTS, COUNTS, color="grey", linestyle="--", linewidth=0.8, label="ideal")
        ax.set(title=title, xlabel="workers", ylabel="speed-up vs plain Keras", xlim=(1, 64), ylim=(0, 64))
        ax.legend(fontsize=7, loc="upper left")
    ax = axes[2]
    here = Cluster(link_gbit=None, cores=2)
    ns = [1, 2, 3, 4]
    ax.plot(ns, [predict(base, here, n)["speedup"] for n in ns], marker="o", label="model: 2 cores, loopback")
    shown = set()
    for where, n, against, value in measured:
        scale = predict(base, here, 1)["speedup"] if against == "1 worker" else 1.0
        word, marker, color, label = next((s for s in STYLES if s[0] in where), STYLES[-1])
        ax.scatter([n], [value * scale], marker=marker, color=color, zorder=3,
                   label=None if word in shown else label)
        shown.add(word)
    ax.set(title="validation: this 2-core machine", xlabel="workers", ylabel="speed-up vs plain Keras",
           xticks=ns)
    ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(f"Scale model: MNIST CNN ({base.params:,} parameters), batch {base.batch_s * 1000:.1f} ms, "
                 f"worker {base.worker_s * 1000:.1f} ms and server {base.server_s * 1000:.1f} ms per commit")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-ms", type=float, default=41.9 / 1875 * 1000, help="plain Keras ms per batch")
    parser.add_argument("--worker-ms", type=float, default=10.0, help="worker's exchange work per commit (ms)")
    parser.add_argument("--server-ms", type=float, default=1000 / 144.0, help="server CPU per commit (ms)")
    parser.add_argument("--fast-server-ms", type=float, default=1.0,
                        help="server CPU per commit of the faster server to plot (ms, default 1)")
    parser.add_argument("--replies-server-ms", type=float, default=1000 / 209.0,
                        help="server CPU per commit with compressed replies (ms; --bench-ps reads it from its "
                             "+replies rows)")
    parser.add_argument("--window", type=int, default=5, help="batches per commit (default 5)")
    parser.add_argument("--bench-ps", default=None, help="bench_ps.json to read --server-ms from")
    parser.add_argument("--overhead", default=None, help="overhead.json to read --worker-ms and --batch-ms from")
    parser.add_argument("--bench-mnist", default=None, help="a make bench mnist.json to check the model against")
    parser.add_argument("--png", default="docs/scale_model.png", help="plot path (default docs/scale_model.png)")
    parser.add_argument("--out", default="results/scale_model", help="results directory")
    args = parser.parse_args(argv)
    args.measured = list(MEASURED)
    _measured_inputs(args)
    base = Workload(PARAMS, args.batch_ms / 1000, args.window, args.worker_ms / 1000, args.server_ms / 1000)
    variants = scenarios(base, args.fast_server_ms, args.replies_server_ms)
    rows, knees = [], []
    for gbit in (1.0, 10.0):
        for name, (work, shards) in variants.items():
            cluster = Cluster(link_gbit=gbit, shards=shards)
            k = knee(work, cluster)
            at64 = predict(work, cluster, 64)
            knees.append({"link": f"{gbit:g} GbE", "scenario": name, "knee_workers": k,
                          "speedup_at_16": predict(work, cluster, 16)["speedup"], "speedup_at_64": at64["speedup"],
                          "bottleneck": at64["bottleneck"]})
            rows += [{"link_gbit": gbit, "scenario": name, **p} for p in curve(work, cluster, COUNTS)]
    here = Cluster(link_gbit=None, cores=2)
    one = predict(base, here, 1)["speedup"]
    checks = []
    for where, n, against, value in args.measured:
        model = predict(base, here, n)["speedup"] / (one if against == "1 worker" else 1.0)
        checks.append({"run": where, "workers": n, "against": against, "measured": value, "model": model,
                       "model_vs_measured": model / value})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    inputs = {"params": PARAMS, "batch_ms": args.batch_ms, "worker_ms": args.worker_ms, "server_ms": args.server_ms,
              "window": args.window, "fast_server_ms": args.fast_server_ms,
              "replies_server_ms": args.replies_server_ms}
    (out / "scale_model.json").write_text(json.dumps({"inputs": inputs, "knees": knees, "validation": checks,
                                                      "predictions": rows}, indent=2) + "\n", encoding="utf-8")
    with open(out / "scale_model.csv", "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(base, variants, Path(args.png), args.measured)
    print("inputs:", ", ".join(f"{k} {v:.4g}" for k, v in inputs.items()))
    print(markdown_table(knees, list(knees[0])))
    print()
    print(markdown_table(checks, list(checks[0])))
    print(f"results: {out / 'scale_model.json'}, {out / 'scale_model.csv'}, {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
