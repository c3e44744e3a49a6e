"""The center variable of the parameter server and the locks that guard it (numpy only).

Two modes, chosen by the update rule:

* **In place** (the rule has ``server_apply``: DOWNPOUR, ADAG, DynSGD and
  their compressed forms). The arrays are allocated once and updated in
  place, each tensor under its own lock; the server's own lock guards only
  its counters. A commit is a two-phase transaction (`Center.apply`): it
  takes the tensor locks in tensor order, computes each tensor's new value
  into the connection's reply buffer while holding that tensor's lock (the
  rule's ufuncs release the GIL on large arrays) and checks it finite; only
  when every tensor passed does it publish, copying the reply buffer into
  the center one tensor at a time and releasing each tensor's lock right
  after its copy. A refused commit (its result would not be finite) has
  published nothing: the center is exactly as before, and never non-finite.
  The next commit starts on tensor 0 while this one still publishes the
  others, so commits pipeline through the tensors in one order and never
  overtake each other.

  Reading (`Center.read`: PULL, HELLO, ``center()``, ``snapshot()``) goes
  hand over hand in the same order (lock i+1 is taken before lock i is
  released), so a reader can neither overtake a commit nor be overtaken by
  one: it sees every commit before it complete and none after it, which is
  what *consistent* means here without a global lock. A version read under
  the first tensor's lock belongs to that state, because a commit takes its
  version while it holds every tensor's lock.

* **Replaced** (every other rule, and synchronous rounds): the arrays are
  private read-only copies that a rule's result replaces as a whole under
  the server's lock; readers take the list under that lock and need no
  other. Rules that grow the center (optimizer state) work only here.

Lock order, everywhere: the server's callback lock, then the tensor locks in
tensor order, then the server's lock. Nobody waits for a tensor lock while
holding the server's lock.
"""

from __future__ import annotations

import threading
from typing import Callable, Sequence, TypeVar

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

    def __len__(self) -> int:
        return len(self.arrays)

    def buffers(self) -> list[np.ndarray]:
        """Uninitialised arrays shaped and typed like the center: one connection's reply buffer."""
        return [np.empty_like(a) for a in self.arrays]

    # -- in place ----------------------------------------------------------------------

    def read(self, out: Sequence[np.ndarray], first: Callable[[], T]) -> tuple[list[np.ndarray], T]:
        """Copy a consistent state of the center into `out` (hand over hand, see the module docstring).

        `first` runs while tensor 0's lock is held, before anything is copied
        (read the version there); returns ``(out as a list, what first returned)``.
        """
        locks = self.locks
        locks[0].acquire()
        held = 0
        try:
            result = first()
            for i, (o, a) in enumerate(zip(out, self.arrays, strict=True)):
                np.copyto(o, a)
                if i + 1 < len(locks):
                    locks[i + 1].acquire()
                locks[i].release()
                held = i + 1
        finally:
            if held < len(locks):
                locks[held].release()
        return list(out), result

    def apply(self, start: Callable[[], object], step: Callable[[int], str | None], finish: Callable[[], object],
              out: Sequence[np.ndarray]) -> str | None:
        """One commit as a two-phase transaction; returns why it was refused (nothing published) or None.

        `start()` runs under tensor 0's lock (the commit's place in the order:
        read the staleness there); `step(i)` computes tensor i's new value
        into ``out[i]`` under its lock and returns a problem (not finite) or
        None; `finish()` runs with every tensor lock held once every step
        passed (take the version there); then ``out`` is published. An
        exception from a callback releases every lock and publishes nothing.
        """
        locks, arrays = self.locks, self.arrays
        acquired = released = 0
        try:
            locks[0].acquire()
            acquired = 1
            start()
            for i in range(len(arrays)):
                if i:
                    locks[i].acquire()
                    acquired = i + 1
                problem = step(i)
                if problem is not None:
                    return problem
            finish()
            for i, (a, o) in enumerate(zip(arrays, out)):
                np.copyto(a, o)
                locks[i].release()
                released = i + 1
            return None
        finally:
            for lock in locks[released:acquired]:
                lock.release()

