"""What `make bench-ps` runs: parameter-server throughput against a raw loopback ping-pong, in one run.

For each model size (--params, default 1M and 10M float32 parameters shaped
like the MNIST CNN) and each number of client PROCESSES (--clients, default
1, 2, 4, 8), K clients commit a DOWNPOUR update in a loop for --seconds
against a real ParameterServer in this process, and, right before, against a
raw TCP echo server that moves the same bytes (one COMMIT frame in, one reply
out). --compression adds rows for encoded commits (bf16 halves the bytes in;
the reply, the center, stays dense; ``bf16+replies`` halves both, the reply
then being the change of the center through the codec); --shards (default 1,2) runs the server
as S shards in this process, each client sending the S parts of a commit at
once; --mac lists the frame MACs to measure (default on, the default MAC,
Poly1305; off, or an algorithm such as hmac-sha256): rows with it off tell
the server's own cost from the MAC's (every frame hashed on both ends).

Columns: ``raw_per_s`` and ``ps_per_s`` (round trips and commits per second,
all clients together), ``echo_per_s`` (round trips of an *authenticated*
echo: the same frames sealed and verified with the row's MAC by the
transport's ``Channel`` on both ends, and no server work; empty with the MAC
off), ``ps_gb_s`` (bytes in + out), ``vs_raw`` (PS / raw at the same K),
``echo_vs_raw`` (the authenticated echo / raw: the most ``vs_raw`` any server
that checks every frame with that MAC can reach on this machine), ``vs_echo``
(PS / the authenticated echo: what the server's own work costs),
``vs_raw_1`` (PS / raw with 1 client), ``vs_1_client`` (PS at K / PS at 1
client, same shards and MAC), ``extra_ms`` (what a commit costs beyond the
raw round trip with 1 client) and ``rule_ms`` (the algorithm alone, one
thread). Targets of issue 17: ``vs_raw`` >= 0.8 with 1 client;
``vs_1_client`` >= 0.8 at 4.

It imports only the package's public API and none of the jobs' helpers, so
it also runs against older trees (the "before" numbers were taken on main's
``trainer/`` before issue 17). Results: ``bench_ps.json``, ``bench_ps.csv`` and ``bench_ps.md`` under --out.

    python benchmarks/bench_ps.py --out results/bench_ps
    python benchmarks/bench_ps.py --seconds 2 --params 1M --clients 1,2 --compression none,bf16,bf16+replies
    python benchmarks/bench_ps.py --shards 1 --mac on,off
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import trainer.algorithms as algorithms
from trainer.internals import MAC_ALGORITHMS
from trainer_benchmarks.support.ps_bench import (REPLIES, frame_bytes, measure_echo, measure_ps, measure_raw, model_layout,
                                           rule_seconds)
from trainer_jobs.support.published import add_publish_arg, publish
from trainer_jobs.support.report import markdown_row, markdown_table, run_metadata

COLUMNS = ["params", "compression", "shards", "mac", "clients", "mb_in", "mb_out", "raw_per_s", "echo_per_s",
           "ps_per_s", "ps_gb_s", "vs_raw", "echo_vs_raw", "vs_echo", "vs_raw_1", "vs_1_client", "extra_ms", "rule_ms"]


def parse_params(text: str) -> list[int]:
    """'1M,10M,250k' -> [1000000, 10000000, 250000]."""
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        scale = {"k": 1_000, "m": 1_000_000}.get(part[-1:], 1)
        try:
            value = int(float(part[:-1] if scale > 1 else part) * scale)
        except ValueError:
            value = 0
        if value < 10_000:
            raise argparse.ArgumentTypeError(f"--params expects sizes of at least 10k like 1M,10M; received {text!r}")
        out.append(value)
    return out


def parse_counts(text: str, flag: str = "--clients", example: str = "1,2,4,8") -> list[int]:
    """'1,2,4' -> [1, 2, 4]."""
    try:
        counts = sorted({int(t) for t in text.split(",") if t.strip()})
    except ValueError:
        counts = []
    if not counts or counts[0] < 1:
        raise argparse.ArgumentTypeError(f"{flag} expects positive integers like {example}; received {text!r}")
    return counts


def parse_clients(text: str) -> list[int]:
    return parse_counts(text)


def parse_shards(text: str) -> list[int]:
    return parse_counts(text, "--shards", "1,2")


def parse_macs(text: str) -> list[bool | str]:
    """'on,off' -> [True, False]; an algorithm name (hmac-sha256, ...) measures that MAC instead of the default."""
    values: dict[str, bool | str] = {"on": True, "off": False, **{name: name for name in MAC_ALGORITHMS}}
    names = [t.strip().lower() for t in text.split(",") if t.strip()]
    if not names or any(n not in values for n in names):
        raise argparse.ArgumentTypeError(f"--mac expects a list of {', '.join(values)}; received {text!r}")
    return [values[n] for n in dict.fromkeys(names)]


def parse_codecs(text: str) -> list[str]:
    names = [t.strip().lower() for t in text.split(",") if t.strip()]
    try:
        for name in names:
            if name != "none":  # older trees (the "before" runs) have no codecs
                algorithms.parse_compression(name.removesuffix(REPLIES))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return names or ["none"]


def run(params: list[int], clients: list[int], seconds: float, codecs: list[str], shards: list[int] = (1,),
        macs: list[bool | str] = (True,)) -> list[dict]:  # fmt: skip
    """Raw, then the server in every (shards, MAC) set-up, for each client count: each raw cell is next to its
    PS cells in time. Rows come out grouped by (params, codec, shards, MAC)."""
    rows = []
    for p in params:
        shapes = model_layout(p)
        for codec in codecs:
            bytes_in, bytes_out = frame_bytes(shapes, codec)
            rule_ms = 1000 * rule_seconds(shapes, codec)
            raw_1: float | None = None
            first: dict = {}
            cells = []
            for k in clients:
                raw = measure_raw(bytes_in, bytes_out, k, seconds)
                raw_1 = raw if raw_1 is None else raw_1
                echo = {mac: measure_echo(shapes, k, seconds, codec, frame_mac=mac) for mac in macs}
                for s in shards:
                    for mac in macs:
                        ps = measure_ps(shapes, k, seconds, codec, shards=s, frame_mac=mac)
                        first.setdefault((s, mac), ps)
                        row = {
                            "params": p, "compression": codec, "shards": s, "mac": {True: "on", False: "off"}.get(mac, mac),
                            "clients": k, "mb_in": bytes_in / 1e6, "mb_out": bytes_out / 1e6, "raw_per_s": raw,
                            "echo_per_s": echo[mac], "ps_per_s": ps, "ps_gb_s": ps * (bytes_in + bytes_out) / 1e9,
                            "vs_raw": ps / raw, "echo_vs_raw": None if echo[mac] is None else echo[mac] / raw,
                            "vs_echo": None if echo[mac] is None else ps / echo[mac],
                            "vs_raw_1": ps / raw_1, "vs_1_client": ps / first[(s, mac)],
                            "extra_ms": 1000 * (1 / first[(s, mac)] - 1 / raw_1), "rule_ms": rule_ms,
                        }
                        cells.append(row)
                        print(markdown_row(row, COLUMNS), flush=True)
            rows += sorted(cells, key=lambda r: (r["shards"], r["mac"] == "off", r["clients"]))
    return rows


def write(rows: list[dict], out: Path, metadata: dict) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    meta = run_metadata(metadata)
    paths = [out / "bench_ps.json", out / "bench_ps.csv", out / "bench_ps.md"]
    paths[0].write_text(json.dumps({"metadata": meta, "rows": rows}, indent=2) + "\n", encoding="utf-8")
    with open(paths[1], "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    paths[2].write_text(
        f"# Parameter server vs raw loopback\n\n- produced {meta['timestamp']} on {meta['host']} "
        f"({meta['cores']} cores), {metadata['seconds']} s per cell\n\n{markdown_table(rows, COLUMNS)}\n",
        encoding="utf-8")
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", type=parse_params, default=[1_000_000, 10_000_000],
                        help="model sizes in float32 parameters (default 1M,10M)")
    parser.add_argument("--clients", type=parse_clients, default=[1, 2, 4, 8],
                        help="numbers of client processes (default 1,2,4,8)")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per measurement (default 5)")
    parser.add_argument("--compression", type=parse_codecs, default=["none"],
                        help="comma-separated codecs to measure: none, fp16, bf16, topk:F (default none)")
    parser.add_argument("--shards", type=parse_shards, default=[1, 2],
                        help="parameter-server shards to measure (default 1,2)")
    parser.add_argument("--mac", type=parse_macs, default=[True],
                        help="frame MACs to measure: on (the default, poly1305), off, or an algorithm such as "
                             "hmac-sha256; comma-separated (default on)")
    parser.add_argument("--out", default="results/bench_ps", help="results directory (default results/bench_ps)")
    add_publish_arg(parser, "bench-ps")
    args = parser.parse_args(argv)
    if not args.seconds > 0:
        parser.error(f"--seconds must be a positive number, received {args.seconds}")
    print("| " + " | ".join(COLUMNS) + " |", flush=True)
    rows = run(args.params, args.clients, args.seconds, args.compression, args.shards, args.mac)
    paths = write(rows, Path(args.out), {"job": "bench_ps", "seconds": args.seconds, "params": args.params,
                                         "clients": args.clients, "compression": args.compression,
                                         "shards": args.shards, "mac": args.mac})
    print(markdown_table(rows, COLUMNS))
    print(f"results: {', '.join(map(str, paths))}")
    publish(args.publish, "bench-ps", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
