"""A helper thread per channel that hashes a frame while the channel's own thread moves it through the socket.

A frame's MAC costs about as much CPU as moving its bytes through loopback
(Poly1305: 0.5 ms per 4 MB; one way through the kernel: 0.7 ms). Hashed in
the thread that also sends or receives, the two add up, even piece by piece.
Both release the GIL (the socket calls, and a MAC whose ``releases_gil`` is
true: libcrypto's Poly1305 through ctypes, hashlib's HMAC and BLAKE2b), so a
second thread runs them side by side: `HashBehind` takes the views of one
frame in order, as they are sent or as they arrive, and hashes them on its
thread; `digest` waits for the last one. The bytes are the same and the tag
is the same: only who computes it, and when, changed.

The thread starts with the first frame large enough to be worth it and ends
after `IDLE_SECONDS` without one (the next frame starts it again), so an idle
or closed connection keeps no thread. It needs a core of its own: a process
that may run on fewer than `MIN_CORES` cores hashes in line (`enabled`),
because there the helper only adds threads to the ones the peers already
keep busy (measured on two cores: one client no faster, four and eight
clients' echo 15-22 % slower; docs/benchmarks.md).
"""

from __future__ import annotations

import collections
import os
import threading
from typing import Any

#: A helper thread with nothing to hash for this long ends (the next frame starts another).
IDLE_SECONDS = 30.0
#: Fewest cores this process may run on for frames to be hashed on a helper thread.
MIN_CORES = 4


def enabled() -> bool:
    """Whether this process may run on at least `MIN_CORES` cores."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    return cores >= MIN_CORES


class HashBehind:
    """Hashes, on one helper thread, the views handed to `update`, in the order given.

    One frame at a time (a channel is used by one thread at a time): `update`
    any number of views into one hasher (all of a frame at once when it is
    sent, each piece as it arrives when it is received), then `digest` (or
    `cancel` when the frame broke off). The views must stay valid and
    unchanged until then.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._cond = threading.Condition(threading.Lock())
        self._queue: collections.deque[tuple[Any, Any]] = collections.deque()
        self._busy = False  # the helper is inside an update now
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def update(self, hasher: Any, *views: Any) -> None:
        """Queue `views` to be hashed into `hasher`, in order, after what was queued before them."""
        with self._cond:
            self._queue.append((hasher, views))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            elif not self._busy:
                self._cond.notify_all()

    def digest(self, hasher: Any) -> bytes:
        """`hasher`'s digest once every queued view is hashed; re-raises what the helper raised."""
        self._drain()
        error, self._error = self._error, None
        if error is not None:
            raise error
        return hasher.digest()

    def cancel(self) -> None:
        """Drop the views not hashed yet and wait for the one being hashed (the frame broke off)."""
        with self._cond:
            self._queue.clear()
        self._drain()
        self._error = None

    def _drain(self) -> None:
        with self._cond:
            while self._queue or self._busy:
                self._cond.wait()

    def _run(self) -> None:
        cond, queue = self._cond, self._queue
        while True:
            with cond:
                while not queue:
                    if self._busy:
                        self._busy = False
                        cond.notify_all()
                    if not cond.wait(IDLE_SECONDS) and not queue:
                        self._thread = None
                        return
                hasher, views = queue.popleft()
                self._busy = True
            try:
                for view in views:
                    hasher.update(view)
            except BaseException as exc:  # handed to the channel's thread by digest()
                with cond:
                    self._error = exc
                    queue.clear()
