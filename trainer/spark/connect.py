"""Spark Connect sessions: telling them apart, and the driver-side calls that differ there.

With ``SparkSession.builder.remote("sc://host:port")`` this process is a
client: the driver runs in the Connect server, and the client has no
``SparkContext`` (no ``sparkContext``, ``_jsc``, broadcast, job groups or
``setLogLevel``). The trainer keeps its parameter server (and the model
hopper's server) in THIS process, so executors must be able to open TCP
connections back to the client (``TRAINER_PS_HOST`` names the address they
use; see ``docs/clusters.md``). Everything else on the driver path uses calls
that both kinds of session have (``spark.conf``, job tags, ``mapInArrow``
with a barrier and a ResourceProfile); what only a classic session can do
lives here with its Connect counterpart:

* `client_address`: the default address executors reach this process at;
* `probe_slots`: whether N tasks of a profile can run at once, by running a
  tiny barrier stage (a classic session asks the scheduler instead);
* `share_with_tasks`: a read-only copy of driver data for every task, a
  broadcast on classic sessions, the task closure on Connect (bounded);
* `require_classic`: the one clear error for what Connect lacks.
"""

from __future__ import annotations

import logging
import pickle
import socket
import threading
import uuid
from dataclasses import dataclass
from typing import Any

from trainer.errors import ClusterCapacityError, ConnectUnsupportedError

log = logging.getLogger("trainer.spark")

__all__ = ["is_connect", "remote_session", "require_classic", "client_address", "probe_slots",
           "share_with_tasks", "MAX_INLINE_BYTES"]

#: Largest copy `share_with_tasks` ships in a Spark Connect task closure: the whole plan
#: travels in one gRPC message (``spark.connect.grpc.maxInboundMessageSize``, 128 MiB by default).
MAX_INLINE_BYTES = 64 << 20


def is_connect(spark: Any) -> bool:
    """True for a Spark Connect session (``SparkSession.builder.remote(...)``)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def remote_session(url: str):
    """The Spark Connect session for ``sc://host:port``; a clear error when the client extras are missing."""
    try:
        import grpc  # noqa: F401  # deferred: only Connect clients need it
    except ImportError as exc:
        raise ImportError(
            f"Connecting to {url} needs the Spark Connect client (grpcio, grpcio-status, googleapis-common-protos, "
            "zstandard). Fix: pip install '.[connect]' in the checkout (or the wheel with [connect], or "
            "pip install 'pyspark[connect]')."
        ) from exc
    from pyspark.sql import SparkSession

    return SparkSession.builder.remote(url).getOrCreate()


def require_classic(spark: Any, what: str, why: str, fix: str) -> None:
    """Raise ConnectUnsupportedError naming `what` needs a classic session, `why`, and the `fix`."""
    if is_connect(spark):
        raise ConnectUnsupportedError(f"{what} does not work with a Spark Connect session: {why}. Fix: {fix}.")


def client_address(spark: Any) -> str:
    """The address of this machine on the route to the Connect server (executors are usually near it)."""
    endpoint = getattr(getattr(spark.client, "_builder", None), "endpoint", None) or f"{spark.client.host}:15002"
    host, _, port = endpoint.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((host, int(port)))  # UDP: chooses the route, sends nothing
            return probe.getsockname()[0]
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def probe_slots(spark: Any, needed: int, profile: Any, timeout: float) -> bool:
    """Whether a barrier stage of `needed` tasks with `profile` starts within `timeout` s (Connect sessions).

    A Connect client cannot ask the scheduler how many tasks fit; a barrier
    stage of empty tasks either runs at once (the slots are there) or waits
    for slots, and then it is interrupted (job tags) after `timeout` s.
    """
    import pyarrow as pa  # deferred: only needed when a probe runs

    def empty(batches):
        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict({"ok": [1]}, schema=pa.schema([("ok", pa.int32())]))

    tag = f"trainer-probe-{uuid.uuid4().hex[:12]}"
    outcome: dict[str, Any] = {}

    def target() -> None:
        spark.addTag(tag)
        try:
            frame = spark.range(needed, numPartitions=needed)
            options = {} if profile is None else {"profile": profile}
            outcome["rows"] = frame.mapInArrow(empty, "ok int", barrier=True, **options).collect()
        except BaseException as exc:  # read by the calling thread
            outcome["error"] = exc
        finally:
            spark.removeTag(tag)

    thread = threading.Thread(target=target, name=tag, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        spark.interruptTag(tag)
        thread.join(10)
        return False
    if "error" in outcome:
        error = outcome["error"]
        if "SPARK-24819" in str(error):  # the server's own check: fewer slots in the cluster than tasks
            return False
        raise ClusterCapacityError(
            f"Checking that {needed} tasks can run at once failed on the Spark Connect server: "
            f"{str(error).splitlines()[0][:500]}"
        ) from error
    return len(outcome["rows"]) == needed


@dataclass(frozen=True)
class _InlineCopy:
    """What a task reads instead of a Broadcast on Connect: ``.value``, shipped in the closure."""

    value: Any

    def destroy(self) -> None:
        pass


def share_with_tasks(spark: Any, value: Any, what: str):
    """A read-only copy of `value` for every task (``.value``, ``.destroy()``): a broadcast on classic sessions.

    Spark Connect has no broadcast variables; the copy travels in the task
    closure instead, which Connect sends in one gRPC message, so copies over
    `MAX_INLINE_BYTES` fail at once with ConnectUnsupportedError.
    """
    if not is_connect(spark):
        return spark.sparkContext.broadcast(value)
    size = len(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
    if size > MAX_INLINE_BYTES:
        raise ConnectUnsupportedError(
            f"{what} gives every task a full copy of the data ({size / 2**20:.1f} MiB). Spark Connect has no "
            f"broadcast variables, so the copy would travel inside the plan, which the server receives in one "
            f"gRPC message (128 MiB at most by default); the trainer sends at most {MAX_INLINE_BYTES >> 20} MiB "
            "that way. Fix: use strategy='mop' (each task holds only its shard), fewer rows, or a classic "
            "SparkSession."
        )
    log.info("%s: Spark Connect has no broadcast; the %.1f MiB copy travels in the task closure", what, size / 2**20)
    return _InlineCopy(value)
