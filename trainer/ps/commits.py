"""Asynchronous commits of the parameter server: in place under the tensor locks, or replaced under its lock.

`AsynchronousCommits` is a part of ``ParameterServer`` (a mixin, like
``trainer.ps.rounds``): it uses the server's lock, counters, center,
directives and records.

* In place (the algorithm has ``server_apply``): `_commit_in_place` runs the
  two-phase transaction of ``trainer.ps.center``. Under tensor 0's lock it
  reads the staleness (the commit's place in the order), then computes every
  tensor's new value into arrays of the center's pool and checks it finite;
  with every tensor lock held it takes the next version and counts the
  epoch's batches under the server's lock, then publishes by swapping those
  arrays in as the center (no copy; ``Center.apply(swap=True)``). The reply
  is encoded from them (no copy either) and sent after every lock is
  released; they are in flight until then (``Center.sent``). The payload's
  values are not checked on their own: a NaN or inf in them makes the result
  non-finite, and the refusal then names the payload's array as before. With
  compressed replies (``Compressed(replies=True)``) the reply is instead the
  change of the center since what the connection's worker holds (the
  codec's ``encode_change``), encoded after every lock is released, with
  meta ``reply: "change"``; it is computed into the connection's reply
  buffer, copied in, and the buffer is then the encoding's scratch.
* Replaced (any other asynchronous algorithm): ``server_commit`` under the
  server's lock, its result frozen and checked, then swapped in.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from trainer.ps.hygiene import center_problem, check_center, freeze
from trainer.ps.records import UpdateRecord
from trainer.transport.wire import Frame, Msg, encode, frame_size

log = logging.getLogger("trainer.ps")


class AsynchronousCommits:
    """COMMITs of asynchronous algorithms (see the module docstring)."""

    def _counted(self: Any, conn: Any, frame: Frame) -> tuple[bool, str | None]:
        """(does this COMMIT count batches of an epoch, why its counts are malformed or None)."""
        epoch, batches = frame.meta.get("epoch"), frame.meta.get("batches")
        if batches is None:
            return False, None
        if type(batches) is int and batches >= 0 and type(epoch) is int and epoch >= 0:
            return True, None
        return True, (f"a COMMIT that counts 'batches' needs 'epoch' and 'batches' as ints >= 0, received "
                      f"epoch={epoch!r:.20} and batches={batches!r:.20}")

    def _commit_fields(self: Any, conn: Any, frame: Frame) -> tuple[bool, int, str | None]:
        """(does it count batches, its unseen commits, why its meta is malformed or None) of a COMMIT."""
        counted, malformed = self._counted(conn, frame)
        unseen, bad_unseen = self._unseen(conn, frame)
        return counted, unseen, malformed or bad_unseen

    def _unseen(self: Any, conn: Any, frame: Frame) -> tuple[int, str | None]:
        """(commits of the others that the payload's base has not seen beyond the connection's last
        reply, why the field is malformed or None).

        A worker that overlaps its commits (``Trainer(overlap=True)``) computes a payload on the center
        of the reply before last: the commits between that reply and its last one count toward its
        staleness too. It says how many in ``meta["unseen"]`` (0 when absent), counted on shard 0's
        versions when the center is sharded: hence capped at this connection's version, not refused.
        """
        unseen = frame.meta.get("unseen", 0)
        if type(unseen) is int and unseen >= 0:
            return min(unseen, conn.last_version), None
        return 0, f"a COMMIT's 'unseen' must be an int >= 0, received {unseen!r:.20}"

    def _commit_meta_locked(self: Any, conn: Any, frame: Frame, counted: bool, version: int,
                            staleness: int) -> dict[str, Any]:  # fmt: skip
        meta = {"version": version, "staleness": staleness, **self._directives}
        if counted:
            meta["epoch_batches"] = self._epoch_batches[(conn.attempt, frame.meta["epoch"])] + frame.meta["batches"]
        return meta

    def _applied_locked(self: Any, conn: Any, frame: Frame, meta: dict[str, Any], buffers: list) -> UpdateRecord:
        """Count an applied commit (caller holds the lock): version, epoch batches, the update record."""
        self._version = conn.last_version = meta["version"]
        if "epoch_batches" in meta:
            self._epoch_batches[(conn.attempt, frame.meta["epoch"])] = meta["epoch_batches"]
            self._count_batches_locked(frame.meta["epoch"], conn.worker, frame.meta["batches"])
        return self._record(conn, frame, meta["version"], meta["staleness"], frame_size(buffers), "commit")

    def _commit_in_place(self: Any, conn: Any, frame: Frame) -> None:
        """Apply a commit in place (``trainer.ps.center``: two-phase over the tensor locks) and reply from
        what was published after every lock is released."""
        counted, unseen, malformed = self._commit_fields(conn, frame)
        codec = self._reply_codec
        if malformed is None and codec is not None and conn.held is None:
            malformed = "with compressed replies a worker sends HELLO before its first COMMIT"
        if malformed is not None:
            self._reply_error(conn, malformed)
            return
        # Swapped in: arrays of the center's pool (no copy); compressed replies: the connection's own, copied in.
        out = [None] * len(self._center) if codec is None else self._reply_buffer(conn)
        payload, per = frame.arrays, self._payload_arrays
        center, apply = self._center.arrays, self._algorithm.server_apply
        staleness = 0
        buffers: list = []
        published: list[np.ndarray] = []  # the arrays swapped in as the center: the reply sends them
        meta: dict[str, Any] = {}
        record: UpdateRecord | None = None

        def start() -> None:
            nonlocal staleness
            with self._lock:
                staleness = self._version - conn.last_version + unseen

        def step(i: int) -> str | None:
            apply(center[i:i + 1], payload[per * i:per * (i + 1)], staleness, out[i:i + 1])
            return center_problem(i, out[i], self._names)

        def finish() -> None:
            nonlocal buffers, meta, record, published
            if codec is None:
                published = list(out)
            with self._lock:
                meta = self._commit_meta_locked(conn, frame, counted, self._version + 1, staleness)
                if codec is not None:
                    meta["reply"] = "change"
                # A compressed reply is encoded once the locks are released; a template of its arrays
                # (the same shapes and dtypes) gives the record its size.
                buffers = encode(Msg.OK, meta, out if codec is None else self._reply_template)
                record = self._applied_locked(conn, frame, meta, buffers)

        try:
            with np.errstate(over="ignore", invalid="ignore"):  # an overflow is refused below, not printed
                refused = self._center.apply(start, step, finish, out, swap=codec is None)
        except Exception as exc:
            log.exception("parameter server: server_apply failed")
            self._send(conn, encode(Msg.ERROR, {"error": f"server_apply failed: {type(exc).__name__}: {exc}"}))
            return
        if refused is not None:  # a non-finite payload is named as such, an overflow by the center array
            self._refuse_commit(conn, frame, *(self._check_commit(frame) or (refused, True)))
            return
        assert record is not None
        if codec is not None:
            buffers = encode(Msg.OK, meta, codec.encode_change(out, conn.held, overwrite=True))  # out: scratch now
        try:
            self._notify(record)
            self._send(conn, buffers)
        finally:
            self._center.sent(published)

    def _commit_async(self: Any, conn: Any, frame: Frame) -> None:
        """An algorithm without ``server_apply``: ``server_commit`` under the server's lock; the center is replaced."""
        counted, unseen, malformed = self._commit_fields(conn, frame)
        if malformed is not None:
            self._reply_error(conn, malformed)
            return
        with self._lock:
            staleness = self._version - conn.last_version + unseen
            record = refused = None
            try:
                new_center, reply = self._algorithm.server_commit(list(self._center.arrays), frame.arrays, staleness)
                new_center = freeze(new_center)
                refused = check_center(new_center, self._names)
                meta = self._commit_meta_locked(conn, frame, counted, self._version + 1, staleness)
                buffers = encode(Msg.OK, meta, reply)
            except Exception as exc:
                log.exception("parameter server: server_commit failed")
                buffers = encode(Msg.ERROR, {"error": f"server_commit failed: {type(exc).__name__}: {exc}"})
            else:
                if refused is None:
                    self._center.arrays = new_center
                    record = self._applied_locked(conn, frame, meta, buffers)
        if refused is not None:
            self._refuse_commit(conn, frame, refused, diverged=True)
            return
        if record is not None:
            self._notify(record)
        self._send(conn, buffers)
