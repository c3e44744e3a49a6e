"""Worker-side client of a sharded parameter server (``trainer.ps.shards``), and `connect_ps` for either kind.

`ShardedPSClient` holds one `PSClient` per shard and offers the same calls.
HELLO goes to every shard, and each tells which pieces of the model it
holds (``trainer.ps.layout``). A COMMIT is cut into the shards' parts (the
algorithm's ``split_payload``: flat views of a dense payload) and the S requests
go out at once, shard 0's on the calling thread and the others' on a small
thread pool (sockets, the MAC and the numpy work release the GIL); the
replies are joined into whole tensors. Tensors that one shard holds whole
are views of its reply; a tensor cut between shards is copied into a buffer
reused once nothing of an earlier reply in it is alive (as the replies
themselves, see ``trainer.transport.wire.RecvPool``). The meta of a reply
(version, staleness, epoch batches, directives) is shard 0's; EPOCH_DONE
goes to shard 0 only.

An ERROR from any shard raises its ``RemoteError``; a broken connection to
any shard closes them all. Not thread-safe: one per worker thread.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

import numpy as np

from trainer.ps.ps_client import PSClient
from trainer.ps.layout import Piece, cut, cut_tensors, join_parts
from trainer.transport.handshake import Credentials
from trainer.transport.wire import ProtocolError, RecvPool

Split = Callable[[Sequence[np.ndarray], Sequence[Sequence[Piece]]], list[list[np.ndarray]]]


class ShardedPSClient:
    """One worker's connections to the S shards of a parameter server (see the module docstring).

    `addresses`: ``(host, port)`` of each shard, shard 0 first. `split`: the
    algorithm's ``split_payload`` (default `~trainer.ps.layout.cut`: dense
    payloads, one array per weight).
    """

    def __init__(self, addresses: Sequence[tuple[str, int]], secret: bytes | Credentials, worker: int,
                 attempt: int = 0, timeout: float = 600.0, *, split: Split | None = None,
                 max_body: int | None = None, connect_timeout: float = 60.0,
                 reply_codec: Any = None) -> None:  # fmt: skip
        if len(addresses) < 1:
            raise ValueError("ShardedPSClient needs the address of at least one shard")
        self.clients = [PSClient(host, port, secret, worker, attempt, timeout, max_body=max_body,
                                 connect_timeout=connect_timeout, reply_codec=reply_codec) for host, port in addresses]
        self.worker, self.attempt, self.timeout = worker, attempt, float(timeout)
        self._split = split or cut
        self._layout: list[list[Piece]] | None = None
        self._shapes: list[tuple[int, ...]] = []
        self._joined: dict[int, RecvPool] = {}  # per cut tensor: buffers for its joined copies
        self._pool: ThreadPoolExecutor | None = None

    # -- connection -------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return all(c.connected for c in self.clients)

    def connect(self):
        """Connect and authenticate to every shard; returns self."""
        try:
            for c in self.clients:
                c.connect()
        except BaseException:
            self.close()
            raise
        if len(self.clients) > 1 and self._pool is None:
            self._pool = ThreadPoolExecutor(len(self.clients) - 1, thread_name_prefix=f"ps-shards-w{self.worker}")
        return self

    def close(self) -> None:
        """Say BYE to every shard (idempotent, never raises)."""
        for c in self.clients:
            c.close()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def __enter__(self):
        return self.connect()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def version(self) -> int | None:
        return self.clients[0].version

    @property
    def num_workers(self) -> int | None:
        return self.clients[0].num_workers

    @property
    def bytes_sent(self) -> int:
        return sum(c.bytes_sent for c in self.clients)

    @property
    def bytes_received(self) -> int:
        return sum(c.bytes_received for c in self.clients)

    # -- requests ---------------------------------------------------------------------

    def hello(self) -> tuple[list[np.ndarray], dict[str, Any]]:
        """HELLO to every shard; returns the joined center and shard 0's meta (the server's
        ``version``, ``start_epoch``, ``num_workers``)."""
        replies = self._each(lambda c, _: c.hello(), [None] * len(self.clients))
        layout = []
        for s, (_, meta) in enumerate(replies):
            shard = meta.get("shard") or {}
            if shard.get("index") != s or shard.get("count") != len(self.clients):
                raise ProtocolError(f"the parameter server at {self.clients[s].host}:{self.clients[s].port} is not "
                                    f"shard {s} of {len(self.clients)} (it says {shard or 'it is not sharded'})")
            layout.append([tuple(p) for p in shard["pieces"]])
            self._shapes = [tuple(shape) for shape in shard["shapes"]]
        self._layout = layout  # type: ignore[assignment]
        self._joined = {t: self._joined.get(t) or RecvPool() for t in cut_tensors(layout)}
        meta = {k: v for k, v in replies[0][1].items() if k != "shard"}
        return self._join([arrays for arrays, _ in replies]), meta

    def pull(self) -> tuple[list[np.ndarray], int]:
        """The joined center and shard 0's version."""
        replies = self._each(lambda c, _: c.pull(), [None] * len(self.clients))
        return self._join([arrays for arrays, _ in replies]), replies[0][1]

    def commit(self, payload: Sequence[np.ndarray], meta: dict[str, Any] | None = None
               ) -> tuple[list[np.ndarray], dict[str, Any]]:  # fmt: skip
        """Send each shard its part of `payload` at once; returns the joined reply and shard 0's meta (a
        reply without arrays, a synchronous round the driver stopped, stays empty)."""
        parts = self._split(payload, self._need_layout())
        replies = self._each(lambda c, part: c.commit(part, meta), parts)
        arrays = [a for a, _ in replies]
        return (self._join(arrays) if all(arrays) else []), replies[0][1]

    def epoch_done(self, epoch: int, logs: dict[str, Any] | None = None) -> dict[str, Any]:
        """EPOCH_DONE to shard 0, which counts the epochs; returns its reply's meta (the directives)."""
        return self.clients[0].epoch_done(epoch, logs)

    # -- helpers ----------------------------------------------------------------------

    def _need_layout(self) -> list[list[Piece]]:
        if self._layout is None:
            raise ProtocolError("a sharded client learns which shard holds what from HELLO: call hello() first")
        return self._layout

    def _each(self, call: Callable[[PSClient, Any], Any], args: Sequence[Any]) -> list[Any]:
        """`call(client, arg)` for every shard at once; the first error (in shard order) is raised."""
        if self._pool is None:
            return [call(c, a) for c, a in zip(self.clients, args)]
        futures = [self._pool.submit(call, c, a) for c, a in zip(self.clients[1:], args[1:])]
        results: list[Any] = []
        error: BaseException | None = None
        try:
            results.append(call(self.clients[0], args[0]))
        except BaseException as exc:
            error = exc
        for f in futures:
            try:
                results.append(f.result())
            except BaseException as exc:
                error = error or exc
        if error is not None:
            if not all(c.connected for c in self.clients):  # one connection broke: the worker's task fails
                for c in self.clients:
                    c.close()
            raise error
        return results

    def _join(self, parts: list[list[np.ndarray]]) -> list[np.ndarray]:
        return join_parts(parts, self._need_layout(), self._shapes, lambda t, n: self._joined[t].view(n))


def connect_ps(addresses: Sequence[tuple[str, int]], secret: bytes | Credentials, worker: int, attempt: int = 0,
               timeout: float = 600.0, *, split: Split | None = None,
               reply_codec: Any = None) -> PSClient | ShardedPSClient:
    """A connected client of the parameter server at `addresses`: a `PSClient` for one endpoint, a
    `ShardedPSClient` for the shards of a sharded one (`split`: the algorithm's ``split_payload``;
    `reply_codec`: its ``reply_codec``, for compressed replies)."""
    if len(addresses) == 1:
        return PSClient(*addresses[0], secret, worker, attempt=attempt, timeout=timeout,
                        reply_codec=reply_codec).connect()
    return ShardedPSClient(addresses, secret, worker, attempt, timeout, split=split, reply_codec=reply_codec).connect()
