"""Checkpoints of the parameter server's state, for resuming a run.

Written by the one atomic writer (`trainer.files.atomic_write_bytes`), so a
crash leaves the old file or the new one, with ``keep`` previous versions
beside it (``checkpoint.1.npz`` is the one before ``checkpoint.npz``, ...).

A trainer checkpoint is ONE file, ``<dir>/checkpoint.npz``: the center arrays
(model weights, followed by averaged optimizer state when the algorithm keeps
it on the server) plus a JSON record (version, epochs each worker finished,
the algorithm, the time, a SHA-256 digest of the arrays) stored as a uint8
array. It is read with ``allow_pickle=False``. Every way a file can be
damaged (empty, truncated, a flipped bit, another format) raises
`CheckpointError` naming the file and what is wrong; `load_checkpoint` then
falls back to the previous version, newest first. A center with NaN or inf is
never written.

`Checkpointer` decides when to write: every `every` server updates, whenever
all workers have finished one more epoch, and once more when training stops
(normally, on error or on Ctrl-C). The periodic saves take a consistent
snapshot of the server (under its lock) on the connection thread and leave
the writing to one background thread, so that no worker waits for a disk;
the final save is synchronous and never raises (`finish` reports a failure).
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trainer.errors import CheckpointError
from trainer.files import DEFAULT_KEEP, atomic_write_bytes, read_npz, versions
from trainer.ps.epochs import completed_epochs
from trainer.ps.hygiene import non_finite

log = logging.getLogger("trainer.fit.checkpoints")

FILE_NAME = "checkpoint.npz"
_META_KEY = "__meta__"

__all__ = ["Checkpoint", "CheckpointError", "Checkpointer", "checkpoint_files", "has_checkpoint", "load_checkpoint",
           "read_checkpoint", "save_checkpoint"]


def array_digest(arrays: list[np.ndarray]) -> str:
    """SHA-256 over the dtypes, shapes and bytes of `arrays`."""
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(memoryview(a.reshape(-1).view(np.uint8)))
    return h.hexdigest()


@dataclass
class Checkpoint:
    center: list[np.ndarray]
    version: int
    epochs_done: dict[int, dict[str, Any]]
    meta: dict[str, Any] = field(default_factory=dict)
    #: The file it was read from (None for one not read from disk).
    path: Path | None = None

    @property
    def completed_epochs(self) -> int:
        """Epochs every worker finished (0 when some worker finished none)."""
        return completed_epochs(self.epochs_done, int(self.meta.get("num_workers", 1)))


def save_checkpoint(directory: str | os.PathLike, checkpoint: Checkpoint, keep: int = DEFAULT_KEEP) -> Path:
    """Write `checkpoint` atomically to ``<directory>/checkpoint.npz``, keeping `keep` versions.

    Raises CheckpointError (and writes nothing) when a center array holds NaN or inf.
    """
    for i, a in enumerate(checkpoint.center):
        bad = non_finite(np.asarray(a))
        if bad is not None:
            raise CheckpointError(f"Refusing to checkpoint a center whose array #{i} holds {bad[0]} NaN and {bad[1]} "
                                  f"inf values: the previous checkpoint in {directory} stays the newest")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    center = [np.asarray(a) for a in checkpoint.center]
    record = {
        "version": checkpoint.version,
        "epochs_done": {str(k): v for k, v in checkpoint.epochs_done.items()},
        "meta": checkpoint.meta,
        "saved_at": time.time(),
        "digest": array_digest(center),
    }
    arrays = {f"a{i:05d}": a for i, a in enumerate(center)}
    arrays[_META_KEY] = np.frombuffer(json.dumps(record).encode(), dtype=np.uint8)
    return atomic_write_bytes(out / FILE_NAME, lambda fh: np.savez(fh, **arrays), keep=keep)


def read_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read one checkpoint file (raises CheckpointError naming it and what is wrong)."""
    path = Path(path)
    data = read_npz(path)
    try:
        record = json.loads(bytes(data.pop(_META_KEY)).decode("utf-8"))
        center = [data[k] for k in sorted(data)]
        epochs_done = {int(k): dict(v) for k, v in record["epochs_done"].items()}
        version, meta = int(record["version"]), dict(record["meta"])
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"Checkpoint {path} has no valid record ({type(exc).__name__}: {exc}): it is damaged "
                              "or was not written by this trainer") from exc
    if "digest" in record and record["digest"] != array_digest(center):
        raise CheckpointError(f"Checkpoint {path} is corrupted: its arrays do not match the digest saved with them")
    return Checkpoint(center=center, version=version, epochs_done=epochs_done, meta=meta, path=path)


def checkpoint_files(directory: str | os.PathLike) -> list[Path]:
    """The checkpoint files in `directory`, newest first."""
    return versions(Path(directory) / FILE_NAME)


def has_checkpoint(directory: str | os.PathLike) -> bool:
    return bool(checkpoint_files(directory))


def load_checkpoint(directory: str | os.PathLike) -> Checkpoint:
    """Read the newest readable checkpoint in `directory`, falling back to older versions when it is damaged.

    Raises CheckpointError when there is none, or when every version is damaged (each named with its problem).
    """
    files = checkpoint_files(directory)
    if not files:
        raise CheckpointError(
            f"No checkpoint at {Path(directory) / FILE_NAME}. Pass the directory given as checkpoint_dir= (or "
            "--checkpoint-dir) to the run you want to resume."
        )
    problems = []
    for path in files:
        try:
            checkpoint = read_checkpoint(path)
        except CheckpointError as exc:
            problems.append(str(exc))
            continue
        if problems:
            log.warning("%s; resuming from the previous checkpoint %s (version %d) instead", "; ".join(problems),
                        path, checkpoint.version)
        return checkpoint
    raise CheckpointError("Every checkpoint in " + str(directory) + " is damaged: " + "; ".join(problems)
                          + ". Fix: start afresh without resume_from, or restore the directory from a backup.")


# -- when to write ---------------------------------------------------------------------


class Checkpointer:
    """Writes the server's state to `directory` every `every` updates and at each completed epoch.

    `on_update` / `on_epoch_done` run on the server's connection threads: they
    take a snapshot and hand it to a background writer (the newest snapshot
    wins when the disk is slower than the updates). `finish` writes the last
    state synchronously and reports a failure instead of raising.
    """

    def __init__(self, directory: str | os.PathLike, server, every: int, meta: dict[str, Any],
                 keep: int = DEFAULT_KEEP) -> None:  # fmt: skip
        if type(keep) is not int or keep < 1:
            raise ValueError(f"checkpoint_keep must be a positive int, received {keep!r}")
        self.directory = Path(directory)
        self.server = server
        self.every = every
        self.meta = meta
        self.keep = keep
        self.saved = 0
        self.errors: list[str] = []
        self._write_lock = threading.Lock()  # one write at a time, in order
        self._cond = threading.Condition()
        self._pending: Checkpoint | None = None
        self._closing = False
        self._thread: threading.Thread | None = None
        self._last_epochs = -1

    def on_update(self, record) -> None:
        if self.every and record.version % self.every == 0:
            self.request()

    def on_epoch_done(self, worker: int, epoch: int) -> None:
        if completed_epochs(self.server.epochs_done, self.server.num_workers) - 1 > self._last_epochs:
            self.request()

    def snapshot(self) -> Checkpoint:
        center, version, epochs_done = self.server.snapshot()  # consistent: taken under the server's lock
        # The server may serve fewer workers than it started with (a retry on fewer slots).
        checkpoint = Checkpoint(center, version, epochs_done, {**self.meta, "num_workers": self.server.num_workers})
        self._last_epochs = max(self._last_epochs, checkpoint.completed_epochs - 1)
        return checkpoint

    def request(self) -> None:
        """Snapshot now, write in the background."""
        checkpoint = self.snapshot()
        with self._cond:
            if self._closing:
                return
            self._pending = checkpoint
            if self._thread is None:
                self._thread = threading.Thread(target=self._writer, name="trainer-checkpoint", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _writer(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._closing:
                    self._cond.wait()
                checkpoint, self._pending = self._pending, None
            if checkpoint is None:
                return
            problem = self._write(checkpoint)
            if problem is not None:
                log.warning("%s (training goes on; the next save tries again)", problem)

    def _write(self, checkpoint: Checkpoint) -> str | None:
        with self._write_lock:
            try:
                save_checkpoint(self.directory, checkpoint, keep=self.keep)
            except (OSError, CheckpointError) as exc:
                reason = "the disk is full" if getattr(exc, "errno", None) == errno.ENOSPC else str(exc)
                problem = f"Could not write the checkpoint of version {checkpoint.version} to {self.directory}: {reason}"
                self.errors.append(problem)
                return problem
            self.saved += 1
            log.debug("checkpoint %d saved at version %d", self.saved, checkpoint.version)
            return None

    def save(self) -> None:
        """Write the current state now, in this thread (raises on failure)."""
        with self._write_lock:
            save_checkpoint(self.directory, self.snapshot(), keep=self.keep)
            self.saved += 1

    def finish(self) -> str | None:
        """Stop the background writer and write the final state; returns what went wrong (None: saved).

        Never raises: a failed final save must neither lose a successful fit nor hide the error of a failed one.
        """
        with self._cond:
            self._closing = True
            self._pending = None
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join()
        try:
            problem = self._write(self.snapshot())
        except Exception as exc:  # reported, never raised: see the docstring
            problem = f"Could not write the final checkpoint to {self.directory}: {type(exc).__name__}: {exc}"
        if problem is not None:
            log.warning("%s", problem)
        return problem
