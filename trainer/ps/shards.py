"""A parameter server sharded over S endpoints in the driver (``Trainer(ps_shards=S)``).

``trainer.ps.layout`` cuts the model into S parts of equal bytes (one large
tensor too). `ShardedParameterServer` runs one `ParameterServer` per part, each with its
own socket, accept and connection threads, tensor locks, counters and
version, over its pieces (1-D arrays); every shard runs the same algorithm,
which is element-wise. Workers connect to every shard
(``trainer.ps.shard_client``) and send the S parts of a commit at once.
Shard 0 is the one the driver listens to: it counts the epochs (EPOCH_DONE
goes to shard 0 only) and the epoch batches, its replies carry the
directives, its update records are the fit's (one per commit, passed to
``on_update``), and its version is the server's. The others serve their
pieces and count their own updates (``update_history()[1]["shard_updates"]``).

Consistency. Each shard is consistent on its own (``trainer.ps.center``);
across shards a worker's commit arrives at slightly different times, so
``center()`` and ``snapshot()`` (shard after shard) may hold a commit's
part on one shard and not yet on another, and a commit refused by one shard
(non-finite) may have been applied by another. The center stays finite
either way, and a refusal stops the fit. For the additive algorithms this is the
asynchrony they already have (DistBelief's shards are independent the same
way); algorithms that keep optimizer state on the server cannot be sharded.

When it helps: shards divide the server's per-commit work (receiving,
checking the MAC, applying, replying) over S threads, so commits that would
queue behind one connection's work run side by side. That takes cores: on
the driver's host S shards need S free cores and a link faster than one
core's copy and MAC rate (see docs/benchmarks.md); on a 2-core machine they
only add threads.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

from trainer.ps.layout import check_shards, cut, join_parts, shard_layout
from trainer.ps.records import DEFAULT_HISTORY_SIZE
from trainer.ps.server import ParameterServer
from trainer.transport.endpoint import Service
from trainer.transport.tls import TlsIdentity


class ShardedParameterServer(Service):
    """S `ParameterServer` shards in this process; the same interface as one (see the module docstring).

    Takes `ParameterServer`'s arguments, plus `shards`. A `port` other than 0
    gives the shards ``port, port + 1, ...``; `on_update` and
    `on_epoch_done` are shard 0's.
    """

    def __init__(self, algorithm: Any, center: Sequence[np.ndarray], num_workers: int, secret: bytes, *,
                 shards: int, host: str = "127.0.0.1", port: int = 0, weight_names: Sequence[str] | None = None,
                 tls: bool | TlsIdentity = False, on_update: Any = None, on_epoch_done: Any = None,
                 history_size: int = DEFAULT_HISTORY_SIZE, **options: Any) -> None:  # fmt: skip
        check_shards(shards, algorithm)
        arrays = [np.asarray(a) for a in center]
        self.layout = shard_layout(arrays, shards)
        identity = TlsIdentity.generate() if tls is True else tls  # one certificate: one fingerprint to pin
        shapes = [list(a.shape) for a in arrays]
        self._shapes = [tuple(shape) for shape in shapes]
        self.shards: list[ParameterServer] = []
        for s, (pieces, part) in enumerate(zip(self.layout, cut(arrays, self.layout))):
            names = None if weight_names is None else [
                str(weight_names[t]) if (start, stop) == (0, arrays[t].size) else f"{weight_names[t]}[{start}:{stop}]"
                for t, start, stop in pieces]
            meta = {"shard": {"index": s, "count": shards, "pieces": [list(p) for p in pieces], "shapes": shapes}}
            self.shards.append(ParameterServer(
                algorithm, part, num_workers, secret, host=host, port=port + s if port else 0, weight_names=names,
                tls=identity, on_update=on_update if s == 0 else None,
                on_epoch_done=on_epoch_done if s == 0 else None,
                history_size=history_size if s == 0 else 1, hello_meta=meta, **options))

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> tuple[str, int]:
        """Start every shard; returns shard 0's ``(host, port)`` (`addresses` has them all)."""
        try:
            for shard in self.shards:
                shard.start()
        except BaseException:
            self.stop()
            raise
        return self.shards[0].address

    def stop(self) -> None:
        for shard in self.shards:
            shard.stop()

    @property
    def address(self) -> tuple[str, int]:
        return self.shards[0].address

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [shard.address for shard in self.shards]

    @property
    def credentials(self):
        return self.shards[0].credentials  # the same secret, MAC and certificate on every shard

    # -- what every shard does ------------------------------------------------------------

    def resize(self, num_workers: int) -> None:
        for shard in self.shards:
            shard.resize(num_workers)

    def start_attempt(self, attempt: int) -> None:
        for shard in self.shards:
            shard.start_attempt(attempt)

    def direct(self, **directives: Any) -> None:
        for shard in self.shards:  # every shard: a stop must release the rounds of all of them
            shard.direct(**directives)

    # -- state ------------------------------------------------------------------------------

    def center(self) -> list[np.ndarray]:
        """The joined center, each shard's part consistent (see the module docstring)."""
        return self._join([shard.center() for shard in self.shards])

    def snapshot(self) -> tuple[list[np.ndarray], int, dict[int, dict[str, Any]]]:
        """(joined center, shard 0's version, epochs done): shard 0 first, then the others."""
        center, version, done = self.shards[0].snapshot()
        return self._join([center] + [shard.center() for shard in self.shards[1:]]), version, done

    def _join(self, parts: list[list[np.ndarray]]) -> list[np.ndarray]:
        return join_parts(parts, self.layout, self._shapes)

    @property
    def version(self) -> int:
        return self.shards[0].version

    @property
    def num_workers(self) -> int:
        return self.shards[0].num_workers

    @property
    def max_body(self) -> int:
        return max(shard.max_body for shard in self.shards)

    @property
    def attempt(self) -> int:
        return self.shards[0].attempt

    @property
    def epochs_done(self) -> dict[int, dict[str, Any]]:
        return self.shards[0].epochs_done

    @property
    def pending_workers(self) -> list[int]:
        return self.shards[0].pending_workers

    @property
    def updates(self):
        return self.shards[0].updates

    def update_history(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Shard 0's records (one per commit) and totals, with the bytes of every shard and each shard's
        count of updates (``shard_updates``)."""
        columns, totals = self.shards[0].update_history()
        others = [shard.update_history()[1] for shard in self.shards[1:]]
        totals["bytes_in"] += sum(o["bytes_in"] for o in others)
        totals["bytes_out"] += sum(o["bytes_out"] for o in others)
        totals["shard_updates"] = [totals["updates"]] + [o["updates"] for o in others]
        return columns, totals

    @property
    def failure(self) -> str | None:
        return next((shard.failure for shard in self.shards if shard.failure is not None), None)

    @property
    def events(self) -> list[dict[str, Any]]:
        """Every shard's events, oldest first, each with its ``shard``."""
        merged = [{**e, "shard": s} for s, shard in enumerate(self.shards) for e in shard.events]
        return sorted(merged, key=lambda e: e.get("time", time.time()))

    @property
    def num_connections(self) -> int:
        return sum(shard.num_connections for shard in self.shards)

    @property
    def num_authenticated(self) -> int:
        return sum(shard.num_authenticated for shard in self.shards)

    @property
    def bytes_received(self) -> int:
        return sum(shard.bytes_received for shard in self.shards)

    @property
    def bytes_sent(self) -> int:
        return sum(shard.bytes_sent for shard in self.shards)
