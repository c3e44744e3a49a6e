"""Checkpoints of the parameter server's state, for resuming a run, and the one atomic writer.

`atomic_write_bytes` / `atomic_write_json` write every checkpoint file of the
project (the trainer's and the model selection's): a temporary file in the
same directory, flushed and fsync'ed, renamed over the old one, then the
directory fsync'ed, so a crash at any moment leaves either the old or the new
file, never a torn one. With ``keep=K`` the K - 1 previous versions stay
next to it (``checkpoint.1.npz`` is the one before ``checkpoint.npz``, ...).

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
import re
import tempfile
import threading
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from trainer.errors import CheckpointError
from trainer.ps.epochs import completed_epochs
from trainer.ps.hygiene import non_finite

log = logging.getLogger("trainer.fit.checkpoints")

FILE_NAME = "checkpoint.npz"
#: Versions of a checkpoint kept by default (the newest and the one before).
DEFAULT_KEEP = 2
_META_KEY = "__meta__"

__all__ = ["Checkpoint", "CheckpointError", "Checkpointer", "atomic_write_bytes", "atomic_write_json",
           "checkpoint_files", "has_checkpoint", "json_default", "load_checkpoint", "read_checkpoint", "read_npz",
           "save_checkpoint", "version_path", "versions"]


# -- the atomic writer -------------------------------------------------------------


def version_path(path: str | os.PathLike, index: int) -> Path:
    """The `index`-th older version of `path`: ``checkpoint.npz`` -> ``checkpoint.1.npz`` (0: `path`)."""
    path = Path(path)
    return path if index == 0 else path.with_name(f"{path.stem}.{index}{path.suffix}")


def versions(path: str | os.PathLike) -> list[Path]:
    """The existing versions of `path`, newest first (`path` itself, then ``.1``, ``.2``, ...)."""
    path = Path(path)
    pattern = re.compile(re.escape(path.stem) + r"\.(\d+)" + re.escape(path.suffix) + "$")
    older = []
    if path.parent.is_dir():
        for f in path.parent.iterdir():
            m = pattern.match(f.name)
            if m and f.is_file():
                older.append((int(m.group(1)), f))
    return ([path] if path.is_file() else []) + [f for _, f in sorted(older)]


def atomic_write_bytes(path: str | os.PathLike, write: Callable[[Any], Any], keep: int = 1) -> Path:
    """Call ``write(file)`` on a temporary file next to `path`, then replace `path` with it (durably).

    With ``keep > 1`` the previous versions move down one place first
    (``path`` -> ``.1`` -> ... -> ``.{keep-1}``); the oldest beyond that is replaced.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        for i in range(keep - 1, 0, -1):
            older = version_path(path, i - 1)
            if older.is_file():
                os.replace(older, version_path(path, i))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)
    return path


def _fsync_directory(directory: Path) -> None:
    """Make a rename in `directory` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_json(path: str | os.PathLike, data: Any) -> Path:
    """`atomic_write_bytes` of `data` as indented JSON (numpy scalars and tuples converted)."""
    payload = json.dumps(data, indent=1, default=json_default).encode("utf-8")
    return atomic_write_bytes(path, lambda fh: fh.write(payload))


def json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, tuple):
        return list(obj)
    return str(obj)


# -- reading, with every kind of damage named ------------------------------------------


def read_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every array of the ``.npz`` file at `path` (no pickles); CheckpointError says what is wrong with it."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise CheckpointError(f"Checkpoint {path} cannot be read: {exc}") from exc
    if size == 0:
        raise CheckpointError(f"Checkpoint {path} is empty (0 bytes): it was never written completely")
    with open(path, "rb") as fh:
        if fh.read(4) != b"PK\x03\x04":
            raise CheckpointError(f"Checkpoint {path} is truncated or not a checkpoint archive ({size} bytes): it "
                                  "does not start like a .npz (zip) file")
    try:
        with np.load(path, allow_pickle=False) as data:
            if not isinstance(data, np.lib.npyio.NpzFile):
                raise ValueError("it holds one bare array, not a checkpoint archive")
            return {k: np.array(data[k]) for k in data.files}
    except zipfile.BadZipFile as exc:
        what = ("corrupted: a CRC check failed (a flipped bit)" if "CRC" in str(exc)
                else f"truncated or not a checkpoint archive ({size} bytes)")
        raise CheckpointError(f"Checkpoint {path} is {what}: {exc}") from exc
    except Exception as exc:  # zipfile and numpy raise many kinds for damaged bytes; every one means damage
        raise CheckpointError(f"Checkpoint {path} is damaged ({size} bytes): {type(exc).__name__}: {exc}") from exc


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
