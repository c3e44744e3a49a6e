"""What one all-reduce costs on this machine: N JAX processes, one core each, sum a scalar and a gradient.

The inputs of the scale model's all-reduce curve here (``benchmarks/scale_model.py --here-hop-us --here-gbit``):
N processes join JAX's distributed runtime as an `AllReduce` fit's do (gloo between CPUs), each pinned to
one core, and time ``--repeats`` sums of one float (the latency of a step's ring: 2(N - 1) hops) and of
``--params`` float32 values (the MNIST CNN's gradient by default: the ring's bytes, 2(N - 1)/N of it per
process). It prints and writes (``--out``, JSON) the median of each, the hop latency and the bandwidth
they imply::

    python benchmarks/bench_ring.py --processes 2 --out results/bench_ring
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

PARAMS = 1_048_853


def child(process_id: int, processes: int, port: int, params: int, repeats: int) -> dict:
    """One process: pinned to a core, joined to the others, timing its sums (process 0's are reported)."""
    if hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[process_id % len(cores)]})
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import multihost_utils

    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=processes, process_id=process_id)
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("p",))
    spec = jax.sharding.PartitionSpec("p")
    summed = jax.jit(lambda x: jnp.sum(x, axis=0), out_shardings=jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec()))

    def timed(size: int) -> float:
        local = np.ones((1, size), np.float32)
        x = jax.make_array_from_process_local_data(jax.sharding.NamedSharding(mesh, spec), local)
        summed(x).block_until_ready()  # compile, and the first connection
        times = []
        for _ in range(repeats):
            multihost_utils.sync_global_devices("step")
            start = time.perf_counter()
            summed(x).block_until_ready()
            times.append(time.perf_counter() - start)
        return float(np.median(times))

    result = {"scalar_s": timed(1), "gradient_s": timed(params)}
    jax.distributed.shutdown()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, default=2, help="processes in the ring (default 2)")
    parser.add_argument("--params", type=int, default=PARAMS, help=f"float32 values summed (default {PARAMS:,})")
    parser.add_argument("--repeats", type=int, default=50, help="sums timed of each size (default 50)")
    parser.add_argument("--out", default="results/bench_ring", help="results directory")
    parser.add_argument("--child", nargs=2, type=int, default=None, help=argparse.SUPPRESS)  # process id, port
    args = parser.parse_args(argv)
    if args.child is not None:
        result = child(args.child[0], args.processes, args.child[1], args.params, args.repeats)
        if args.child[0] == 0:
            print(json.dumps(result), flush=True)
        return 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    base = [sys.executable, __file__, "--processes", str(args.processes), "--params", str(args.params),
            "--repeats", str(args.repeats)]
    procs = [subprocess.Popen([*base, "--child", str(i), str(port)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True) for i in range(args.processes)]
    outputs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"a process of the ring failed: exit codes {[p.returncode for p in procs]}")
    result = json.loads(outputs[0].strip().splitlines()[-1])
    n = args.processes
    hops = 2 * (n - 1)
    ring_bytes = 2.0 * (n - 1) / n * 4 * args.params
    result.update(processes=n, params=args.params, hop_us=1e6 * result["scalar_s"] / hops,
                  gbit=ring_bytes * 8 / 1e9 / max(result["gradient_s"] - result["scalar_s"], 1e-9))
    print(f"{n} processes: a scalar in {1e3 * result['scalar_s']:.3f} ms ({result['hop_us']:.0f} us per hop), "
          f"{args.params:,} floats in {1e3 * result['gradient_s']:.2f} ms ({result['gbit']:.1f} Gbit/s of ring "
          "bytes per process)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_ring.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
