"""The center variable of the parameter server and the locks that guard it (numpy only).

Two modes, chosen by the algorithm:

* **In place** (the algorithm has ``server_apply``: DOWNPOUR, ADAG, DynSGD and
  their compressed forms). Each tensor has its own lock; the server's own
  lock guards only its counters. A commit is a two-phase transaction
  (`Center.apply`): it takes the tensor locks in tensor order, computes each
  tensor's new value into an array of its own while holding that tensor's
  lock (the algorithm's ufuncs release the GIL on large arrays) and checks it
  finite; only when every tensor passed does it publish, one tensor at a
  time, releasing each tensor's lock right after. A refused commit (its
  result would not be finite) has published nothing: the center is exactly
  as before, and never non-finite.

  Publishing swaps (``swap=True``): the commit computed into arrays taken
  from a pool per tensor, they become the center (no copy), the connection
  sends its reply from them, and the old center's arrays go back to the
  pool. A swapped-in array is *in flight* until its connection has sent it
  (`sent`); the pool hands out only arrays that are not, so a reply is never
  changed on its way (a fresh array is made when every spare one is still
  being sent). Compressed replies instead compute into the connection's
  reply buffer and copy it in, because they reuse it as scratch afterwards.
  The next commit starts on tensor 0 while this one still publishes the
  others, so commits pipeline through the tensors in one order and never
  overtake each other.

  Reading (`Center.read`: PULL, HELLO into pool arrays given back with
  `release` once sent; ``center()``, ``snapshot()`` into fresh ones) goes
  hand over hand in the same order (lock i+1 is taken before lock i is
  released), so a reader can neither overtake a commit nor be overtaken by
  one: it sees every commit before it complete and none after it, which is
  what *consistent* means here without a global lock. A version read under
  the first tensor's lock belongs to that state, because a commit takes its
  version while it holds every tensor's lock.

* **Replaced** (every other algorithm, and synchronous rounds): the arrays are
  private read-only copies that an algorithm's result replaces as a whole under
  the server's lock; readers take the list under that lock and need no
  other. Algorithms that grow the center (optimizer state) work only here.

Lock order, everywhere: the server's callback lock, then the tensor locks in
tensor order, then the server's lock. Nobody waits for a tensor lock while
holding the server's lock.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Sequence, TypeVar

import numpy as np

from trainer.ps.hygiene import freeze

T = TypeVar("T")


class Center:
    """The center arrays; `in_place` gives each tensor a lock and keeps the arrays allocated once."""

    def __init__(self, arrays: Sequence[np.ndarray], in_place: bool) -> None:
        frozen = freeze(arrays)
        self.in_place = bool(in_place) and len(frozen) > 0
        if self.in_place:
            for a in frozen:  # private copies already: writable from now on, only under their lock
                a.setflags(write=True)
        self.arrays: list[np.ndarray] = frozen
        self.locks = [threading.Lock() for _ in frozen] if self.in_place else []
        self.nbytes = sum(a.nbytes for a in frozen)
        self._spare: list[list[np.ndarray]] = [[] for _ in frozen]  # per tensor: arrays free to write into
        self._in_flight: set[int] = set()  # ids of swapped-in arrays whose connection is still sending them

    def __len__(self) -> int:
        return len(self.arrays)

    def buffers(self) -> list[np.ndarray]:
        """Uninitialised arrays shaped and typed like the center: one connection's reply buffer."""
        return [np.empty_like(a) for a in self.arrays]

    def sent(self, arrays: Sequence[np.ndarray]) -> None:
        """The connection that swapped `arrays` in has sent them: the pool may hand them out again."""
        for a in arrays:
            self._in_flight.discard(id(a))

    def release(self, arrays: Sequence[np.ndarray]) -> None:
        """Give back the pool arrays a `read` filled, once they are sent (``list.append`` needs no lock)."""
        for spare, a in zip(self._spare, arrays):
            spare.append(a)

    def _take(self, i: int) -> np.ndarray:
        """A spare array of tensor i that nobody is sending, else a fresh one (tensor i's lock held)."""
        spare, in_flight = self._spare[i], self._in_flight
        for j, a in enumerate(spare):
            if id(a) not in in_flight:
                return spare.pop(j)
        return np.empty_like(self.arrays[i])

    # -- in place ----------------------------------------------------------------------

    def read(self, out: list[np.ndarray] | None, first: Callable[[], T]) -> tuple[list[np.ndarray], T]:
        """Copy a consistent state of the center (hand over hand, see the module docstring) into `out`, or
        (None) into arrays of the pool: give those back with `release` once they are sent.

        `first` runs while tensor 0's lock is held, before anything is copied
        (read the version there); returns ``(the arrays, what first returned)``.
        """
        locks, arrays = self.locks, self.arrays
        if out is not None and len(out) != len(arrays):
            raise ValueError(f"read() needs one buffer per center array ({len(arrays)}), received {len(out)}")
        copies: list[np.ndarray] = []
        locks[0].acquire()
        held = 0
        try:
            result = first()
            for i in range(len(arrays)):
                o = self._take(i) if out is None else out[i]
                copies.append(o)
                np.copyto(o, arrays[i])
                if i + 1 < len(locks):
                    locks[i + 1].acquire()
                locks[i].release()
                held = i + 1
        except BaseException:
            if out is None:
                self.release(copies)
            raise
        finally:
            if held < len(locks):
                locks[held].release()
        return copies, result

    def apply(self, start: Callable[[], object], step: Callable[[int], str | None], finish: Callable[[], object],
              out: list[Any], swap: bool = False) -> str | None:
        """One commit as a two-phase transaction; returns why it was refused (nothing published) or None.

        `start()` runs under tensor 0's lock (the commit's place in the order:
        read the staleness there); `step(i)` computes tensor i's new value
        into ``out[i]`` under its lock and returns a problem (not finite) or
        None; `finish()` runs with every tensor lock held once every step
        passed (take the version there); then ``out`` is published. With
        `swap`, ``out[i]`` is first set to an array of the pool, and publishing
        swaps it in as the center: it is in flight until `sent`. Without,
        ``out`` (the caller's arrays) is copied in. An exception from a callback
        releases every lock and publishes nothing.
        """
        locks, arrays = self.locks, self.arrays
        acquired = released = taken = 0
        try:
            locks[0].acquire()
            acquired = 1
            start()
            for i in range(len(arrays)):
                if i:
                    locks[i].acquire()
                    acquired = i + 1
                if swap:
                    out[i] = self._take(i)
                    taken = i + 1
                problem = step(i)
                if problem is not None:
                    return problem
            finish()
            for i in range(len(arrays)):
                if swap:
                    self._in_flight.add(id(out[i]))
                    self._spare[i].append(arrays[i])
                    arrays[i] = out[i]
                else:
                    np.copyto(arrays[i], out[i])
                locks[i].release()
                released = i + 1
            return None
        finally:
            for i in range(released, acquired):
                if i < taken:  # computed, not published: back to the pool
                    self._spare[i].append(out[i])
                locks[i].release()
