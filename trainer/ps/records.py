"""What the parameter server remembers about its updates, in bounded memory.

Every applied commit makes one :class:`UpdateRecord` (handed to the
``on_update`` callbacks). :class:`UpdateLog` keeps the most recent `capacity`
of them in a preallocated numpy ring (about 90 bytes a record instead of
several hundred as Python objects) and exact running totals over all of them:
updates, bytes in and out, staleness mean and max, updates per worker and per
kind. A fit of a million updates keeps its driver's memory flat; the history,
the progress bar and the reports read the totals, the ring only feeds
``TrainingHistory.updates`` and ``to_frame()``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Default number of update records kept (the totals count every update).
DEFAULT_HISTORY_SIZE = 100_000

KINDS = ("commit", "round")
_FIELDS = [("time", "f8"), ("worker", "i4"), ("version", "i8"), ("staleness", "i8"), ("bytes_in", "i8"),
           ("bytes_out", "i8"), ("epoch", "i8"), ("step", "i8"), ("loss", "f8"), ("kind", "u1")]
RECORD_DTYPE = np.dtype(_FIELDS)
_NONE = -1  # epoch and step the worker did not send


@dataclass(frozen=True)
class UpdateRecord:
    """One commit applied to the center (one per worker for synchronous rounds)."""

    time: float
    worker: int
    version: int  # center version right after this update
    staleness: int
    bytes_in: int  # size of the COMMIT frame
    bytes_out: int  # size of the reply frame
    epoch: int | None
    step: int | None
    loss: float | None
    kind: str  # "commit" (asynchronous) or "round" (synchronous)

    @classmethod
    def of(cls, meta: dict[str, Any], **fields: Any) -> "UpdateRecord":
        """A record stamped now, with epoch, step and loss from a COMMIT's meta (None where absent or bad)."""
        return cls(time=time.time(), epoch=_opt_int(meta.get("epoch")), step=_opt_int(meta.get("step")),
                   loss=_opt_float(meta.get("loss")), **fields)


def _opt_int(value: Any) -> int | None:
    return value if type(value) is int else None


def _opt_float(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


class UpdateLog:
    """A ring of the last `capacity` update records plus exact totals over every record (not thread-safe:
    the server appends under its lock)."""

    def __init__(self, capacity: int = DEFAULT_HISTORY_SIZE) -> None:
        if type(capacity) is not int or capacity < 1:
            raise ValueError(f"history_size must be a positive int (update records kept), received {capacity!r}")
        self.capacity = capacity
        self._ring = np.zeros(capacity, RECORD_DTYPE)  # calloc: pages are touched only when written
        self._count = 0
        self._bytes_in = 0
        self._bytes_out = 0
        self._staleness_sum = 0
        self._staleness_max = 0
        self._per_worker: dict[int, int] = {}
        self._per_kind: dict[str, int] = {}
        self._first: float | None = None
        self._last: float | None = None

    def __len__(self) -> int:
        """Records kept (at most `capacity`)."""
        return min(self._count, self.capacity)

    def append(self, r: UpdateRecord) -> None:
        self._ring[self._count % self.capacity] = (
            r.time, r.worker, r.version, r.staleness, r.bytes_in, r.bytes_out,
            _NONE if r.epoch is None else r.epoch, _NONE if r.step is None else r.step,
            np.nan if r.loss is None else r.loss, KINDS.index(r.kind),
        )
        self._count += 1
        self._bytes_in += r.bytes_in
        self._bytes_out += r.bytes_out
        self._staleness_sum += r.staleness
        self._staleness_max = max(self._staleness_max, r.staleness)
        self._per_worker[r.worker] = self._per_worker.get(r.worker, 0) + 1
        self._per_kind[r.kind] = self._per_kind.get(r.kind, 0) + 1
        if self._first is None:
            self._first = r.time
        self._last = r.time

    def totals(self) -> dict[str, Any]:
        """Exact figures over every update, kept or not."""
        n = self._count
        return {
            "updates": n, "bytes_in": self._bytes_in, "bytes_out": self._bytes_out,
            "staleness_mean": self._staleness_sum / n if n else 0.0, "staleness_max": self._staleness_max,
            "per_worker": dict(sorted(self._per_worker.items())), "per_kind": dict(self._per_kind),
            "first_time": self._first, "last_time": self._last,
            "kept": len(self), "dropped": n - len(self),
        }

    def _ordered(self) -> np.ndarray:
        """The kept records, oldest first (a copy)."""
        n, cap = self._count, self.capacity
        if n <= cap:
            return self._ring[:n].copy()
        head = n % cap
        return np.concatenate([self._ring[head:], self._ring[:head]])

    def columns(self) -> dict[str, np.ndarray]:
        """The kept records as one numpy column per field, oldest first: epoch and step -1 where the
        worker sent none, loss NaN, kind as strings."""
        ordered = self._ordered()
        out = {name: ordered[name] for name, _ in _FIELDS}
        out["kind"] = np.asarray(KINDS)[ordered["kind"]]
        return out

    def records(self) -> list[UpdateRecord]:
        """The kept records as UpdateRecord objects, oldest first."""
        return [
            UpdateRecord(time=float(r["time"]), worker=int(r["worker"]), version=int(r["version"]),
                         staleness=int(r["staleness"]), bytes_in=int(r["bytes_in"]), bytes_out=int(r["bytes_out"]),
                         epoch=None if r["epoch"] == _NONE else int(r["epoch"]),
                         step=None if r["step"] == _NONE else int(r["step"]),
                         loss=None if np.isnan(r["loss"]) else float(r["loss"]), kind=KINDS[int(r["kind"])])
            for r in self._ordered()
        ]
