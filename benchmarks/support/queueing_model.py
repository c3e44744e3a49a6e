"""A scale model of asynchronous data-parallel training with one parameter server: speed-up against N workers.

Pure arithmetic (exact mean-value analysis of a closed queueing network).
Each of N workers loops: `window` batches of compute (``batch_s`` each), its
own exchange work (``worker_s``: reading its weights, building the payload,
loading the reply), then one commit that must pass three shared stations of
the server side, each serving one commit at a time:

* the server's CPU (``server_s`` per commit: decoding, the algorithm under
  its lock, copying and encoding the reply);
* the driver link inbound (the COMMIT frame: ``4 * params * compression``
  bytes) and outbound (the reply: the dense center, ``4 * params`` bytes, or
  with compressed replies the change of the center through the same codec,
  ``4 * params * reply_compression``); full duplex, so the two directions
  are separate stations.

With ``shards`` server endpoints on as many hosts, each station's work per
commit is divided by ``shards`` (every endpoint holds 1/S of the center and
has its own link and lock). With ``cores`` set, workers and server share that
many cores (this development machine: 2), so compute slows down once the
workers and the server's CPU exceed them; None gives every worker its own
machine.

``speedup`` is against plain single-process Keras (one worker with nothing to
exchange trains at ``1 / batch_s`` batches per second), so it includes the
framework overhead at N = 1. The knee ``N* = (Z + sum D) / max D`` is where
the workers' demand meets the busiest station's capacity (Z: a worker's own
time per commit, D: each station's time per commit): below it speed-up grows
nearly linearly, past it it flattens at ``window * batch_s / max D``.

All-reduce (`allreduce_step_s`, `predict_allreduce`): no server; every step,
each of the N workers computes its batch, then the workers sum the gradient
in a ring: 2(N - 1) hops, each sending 1/N of the gradient to the next
worker over that worker's OWN link, so every worker sends (and receives)
``2 (N - 1) / N`` of the gradient's bytes per step whatever N is, and each
hop pays a latency (``hop_s``: the network's and the collective's per-message
cost). A step takes ``batch_s + 2 (N - 1) / N * 4 * params / link +
2 (N - 1) * hop_s`` (no overlap of compute and communication: XLA on CPUs
runs the all-reduce after the backward pass); the N workers train N batches
in it, against plain Keras's one in ``batch_s``. Nothing crosses a shared
station, so the curve has no knee; its efficiency falls to
``batch_s / (batch_s + 8 * params / link)`` for large N, and the hop latency
grows with N.

Local SGD (`local_sgd_period`, `predict_local_sgd`: ``LocalSGD``, all-reduce's
periodic cadence): each worker takes ``period`` batches of its own, then ONE
ring all-reduce averages the weights' deltas (``2 (N - 1) / N`` of
``wire_bytes * params`` per worker, bfloat16: 2 bytes a parameter) plus
``host_s`` of the worker's own work per average (reading and writing its
weights on the host). The period is the one the trainer chooses: the smallest
that keeps the average under ``overhead`` of the steps between two, at most
``max_period``. A period's N workers train ``N * period`` batches against
plain Keras's ``period``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

GBIT = 1e9 / 8  # bytes per second of one Gbit/s


@dataclass(frozen=True)
class Workload:
    """What one worker does per commit."""

    params: int  # float32 parameters of the model
    batch_s: float  # compute of one batch (plain Keras, one worker's cores)
    window: int = 5  # batches per commit
    worker_s: float = 0.0  # the worker's own exchange work per commit
    server_s: float = 0.0  # server CPU per commit (serialized)
    compression: float = 1.0  # bytes of a commit per dense float32 byte (bf16 0.5, topk:F 2F)
    reply_compression: float = 1.0  # the same for a reply (1: the dense center)

    @property
    def bytes_in(self) -> float:
        return 4.0 * self.params * self.compression

    @property
    def bytes_out(self) -> float:
        return 4.0 * self.params * self.reply_compression


@dataclass(frozen=True)
class Cluster:
    """Where it runs: the driver's link, the server endpoints, shared cores."""

    link_gbit: float | None = 10.0  # None: loopback (no link station)
    shards: int = 1
    cores: int | None = None
    latency_s: float = 0.0  # per round trip (network and scheduling)


def demands(work: Workload, cluster: Cluster) -> dict[str, float]:
    """Seconds each shared station spends on one commit."""
    s = max(1, int(cluster.shards))
    out = {"server cpu": work.server_s / s}
    if cluster.link_gbit is not None:
        rate = cluster.link_gbit * GBIT * s
        out["link in"] = work.bytes_in / rate
        out["link out"] = work.bytes_out / rate
    return out


def _mva(n: int, think_s: float, stations: dict[str, float]) -> tuple[float, dict[str, float]]:
    """Exact MVA for `n` customers: (throughput, residence time per station)."""
    queue = {k: 0.0 for k in stations}
    x, residence = 0.0, dict(queue)
    for m in range(1, n + 1):
        residence = {k: d * (1.0 + queue[k]) for k, d in stations.items()}
        x = m / (think_s + sum(residence.values()))
        queue = {k: x * r for k, r in residence.items()}
    return x, residence


def predict(work: Workload, cluster: Cluster, n: int) -> dict[str, float | str]:
    """Commits/s, speed-up against plain Keras, efficiency and the bottleneck at `n` workers."""
    if n < 1:
        raise ValueError(f"n must be a positive number of workers, received {n}")
    stations = demands(work, cluster)
    slow, x = 1.0, 0.0
    for _ in range(50):  # fixed point: compute slows when workers + server CPU exceed the shared cores
        think = work.window * work.batch_s * slow + work.worker_s + cluster.latency_s
        x, _ = _mva(n, think, stations)
        if cluster.cores is None:
            break
        slow_next = max(1.0, (n + x * work.server_s) / cluster.cores)  # every worker keeps a core busy
        if abs(slow_next - slow) < 1e-9:
            break
        slow = 0.5 * (slow + slow_next)
    speedup = x * work.window * work.batch_s
    bottleneck = max(stations, key=stations.get) if stations else "none"
    return {"workers": n, "commits_per_s": x, "speedup": speedup, "efficiency": speedup / n,
            "bottleneck": bottleneck, "compute_slowdown": slow}


def knee(work: Workload, cluster: Cluster) -> float:
    """N* = (Z + sum D) / max D: the worker count where demand meets the busiest station."""
    stations = demands(work, cluster)
    busiest = max(stations.values())
    if busiest <= 0:
        return float("inf")
    think = work.window * work.batch_s + work.worker_s + cluster.latency_s
    return (think + sum(stations.values())) / busiest


def curve(work: Workload, cluster: Cluster, counts) -> list[dict[str, float | str]]:
    return [predict(work, cluster, n) for n in counts]


def with_codec(work: Workload, codec: str, replies: bool = False) -> Workload:
    """`work` with the commit bytes (and with `replies` the reply bytes) of a codec name: none, fp16, bf16
    or topk:F."""
    name = codec.strip().lower()
    if name in ("none", ""):
        fraction = 1.0
    elif name in ("fp16", "bf16"):
        fraction = 0.5
    elif name.startswith("topk:"):
        fraction = min(1.0, 2.0 * float(name[5:]))
    else:
        raise ValueError(f"unknown codec {codec!r}; expected none, fp16, bf16 or topk:F")
    return replace(work, compression=fraction, reply_compression=fraction if replies else 1.0)


def crowding(n: int, cores: int | None) -> float:
    """How much slower a step of `n` synchronous workers is on `cores` shared cores than on a core each.

    The group waits for its slowest process at every average (and every
    epoch end), and Linux's scheduler cannot split N > cores processes evenly:
    its per-core run queues hold ceil(N / cores) of them on the busiest core
    (3 workers on 2 cores: two share one core, the third has the other), so
    the group moves at that core's pace. Measured in the embedded cluster
    (MNIST, 3 workers on 2 cores, averaging every 1,000 steps): one process
    at 100 % of a core and two at about 50 %, a step 1.87x the 2 workers'
    (ceil: 2x; an even share, N / cores: 1.5x).
    """
    return float(max(1, -(-n // cores))) if cores else 1.0


def allreduce_step_s(work: Workload, cluster: Cluster, n: int, hop_s: float = 0.0) -> float:
    """Seconds of one synchronous all-reduce step of `n` workers (the module docstring): the batch (slower
    when `n` workers share fewer `cluster.cores`), the ring's bytes over each worker's link (none on
    loopback, ``link_gbit=None``) and its 2(n - 1) hops of `hop_s`."""
    if n < 1:
        raise ValueError(f"n must be a positive number of workers, received {n}")
    compute = work.batch_s * crowding(n, cluster.cores)
    if n == 1:
        return compute  # one process: nothing to reduce
    ring = 2.0 * (n - 1) / n * 4.0 * work.params
    transfer = 0.0 if cluster.link_gbit is None else ring / (cluster.link_gbit * GBIT)
    return compute + transfer + 2 * (n - 1) * hop_s + cluster.latency_s


def predict_allreduce(work: Workload, cluster: Cluster, n: int, hop_s: float = 0.0) -> dict[str, float]:
    """Speed-up against plain Keras (N batches per step against one per ``batch_s``), efficiency, and the ring's
    bytes each worker sends per step, at `n` workers."""
    step = allreduce_step_s(work, cluster, n, hop_s)
    speedup = n * work.batch_s / step
    return {"workers": n, "step_s": step, "speedup": speedup, "efficiency": speedup / n,
            "ring_bytes_per_worker": 2.0 * (n - 1) / n * 4.0 * work.params}


def local_sgd_average_s(work: Workload, cluster: Cluster, n: int, hop_s: float = 0.0, host_s: float = 0.0,
                        wire_bytes: float = 2.0) -> float:
    """Seconds of one average of `n` workers' weights (the module docstring)."""
    if n == 1:
        return 0.0
    ring = 2.0 * (n - 1) / n * wire_bytes * work.params
    transfer = 0.0 if cluster.link_gbit is None else ring / (cluster.link_gbit * GBIT)
    return transfer + 2 * (n - 1) * hop_s + host_s + cluster.latency_s


def local_sgd_period(step_s: float, average_s: float, max_period: int = 16, overhead: float = 0.05) -> int:
    """The period the trainer chooses for these times (``trainer.runtime.collective.averaging.choose_period``'s
    algorithm, restated here: the scale model imports nothing of the package)."""
    if average_s <= 0:
        return 1
    return int(min(max_period, max(1, -(-average_s // (overhead * step_s)))))


def predict_local_sgd(work: Workload, cluster: Cluster, n: int, hop_s: float = 0.0, host_s: float = 0.0,
                      max_period: int = 16, wire_bytes: float = 2.0) -> dict[str, float]:
    """Speed-up against plain Keras of local SGD at `n` workers with the period it chooses."""
    compute = work.batch_s * crowding(n, cluster.cores)
    average = local_sgd_average_s(work, cluster, n, hop_s, host_s, wire_bytes)
    period = local_sgd_period(compute, average, max_period)
    cycle = period * compute + average
    speedup = n * period * work.batch_s / cycle
    return {"workers": n, "period": period, "average_s": average, "speedup": speedup, "efficiency": speedup / n,
            "bytes_per_worker_per_batch": 2.0 * (n - 1) / n * wire_bytes * work.params / period}
