"""``cluster up``: an embedded Spark standalone cluster (``LocalCluster``) until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from typing import Any

from trainer.errors import ClusterError
from trainer.spark.local_cluster import LocalCluster
from trainer.verbosity import configure_logging

log = logging.getLogger("trainer.cli")


def add_parser(sub) -> None:
    cluster = sub.add_parser("cluster", help="run an embedded Spark standalone cluster",
                             description="Run a Spark standalone cluster (master + workers) from the installed "
                                         "pyspark on this machine.")
    actions = cluster.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = actions.add_parser(
        "up", help="start a cluster and keep it running until Ctrl-C / SIGTERM",
        description="Start a Spark master and workers, print the master URL, block until Ctrl-C or SIGTERM.",
    )
    up.add_argument("--workers", type=int, default=2, help="number of worker daemons (default: 2)")
    up.add_argument("--cores-per-worker", type=int, default=1, help="cores each worker offers (default: 1)")
    up.add_argument("--worker-memory", default="2g", help="memory each worker offers, e.g. 2g (default: 2g)")
    up.add_argument("--host", default="127.0.0.1", help="address to bind master and workers (default: 127.0.0.1)")
    up.add_argument("--master-port", type=int, default=None, help="master RPC port (default: a free port)")
    up.add_argument("--ui-port", type=int, default=None, help="master web UI port (default: a free port)")
    up.add_argument("--start-timeout", type=float, default=90.0,
                    help="seconds to wait for all workers to be ALIVE (default: 90)")
    up.add_argument("--log-dir", default=None, help="directory for daemon logs (default: a temporary directory)")
    up.add_argument("--keep-logs", action="store_true", help="keep the log directory after stopping")
    up.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    up.set_defaults(run=cluster_up)


def cluster_up(args: argparse.Namespace) -> int:
    """Start a LocalCluster, print where it is, block until a signal or a dead daemon; returns the exit code."""
    configure_logging(args.verbose)
    stop_requested = threading.Event()
    received: list[int] = []
    starting = True

    def on_signal(signum: int, _frame: Any) -> None:
        received.append(signum)
        stop_requested.set()
        if starting:  # abort start(); it stops whatever it launched
            raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)

    cluster = LocalCluster(
        workers=args.workers, cores_per_worker=args.cores_per_worker, worker_memory=args.worker_memory,
        host=args.host, master_port=args.master_port, ui_port=args.ui_port, start_timeout=args.start_timeout,
        log_dir=args.log_dir, keep_logs=args.keep_logs,
    )
    try:
        cluster.start()
    except (ClusterError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        cluster.stop()
        return 1
    except KeyboardInterrupt:
        cluster.stop()
        print("interrupted while starting; cluster stopped", file=sys.stderr, flush=True)
        return 130
    finally:
        starting = False
    exit_code = 0
    try:
        print(
            f"Spark standalone cluster is up ({cluster.workers} worker(s) x {cluster.cores_per_worker} "
            f"core(s), {cluster.worker_memory} each, started in {cluster.start_seconds:.1f}s)\n"
            f"  master URL     : {cluster.master_url}\n"
            f"  web UI         : {cluster.ui_url}\n"
            f"  logs           : {cluster.log_dir}\n"
            f"  process groups : {' '.join(str(g) for g in cluster.process_groups())}\n"
            f"Press Ctrl-C to stop.",
            flush=True,
        )
        while not stop_requested.wait(1.0):
            dead = cluster.dead_daemons()
            if dead:
                print("error: a cluster daemon died:\n" + "\n".join(dead), file=sys.stderr, flush=True)
                exit_code = 1
                break
        if received:
            log.info("received %s, stopping", signal.Signals(received[0]).name)
    finally:
        cluster.stop()
    print("cluster stopped", flush=True)
    return exit_code
