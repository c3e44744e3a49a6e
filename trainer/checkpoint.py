"""Atomic checkpoints of the parameter server's state, for resuming a run, and the one atomic writer.

`atomic_write_bytes` / `atomic_write_json` write every checkpoint file of the
project (the trainer's and the model selection's): a temporary file in the
same directory, flushed and fsync'ed, renamed over the old one, then the
directory fsync'ed, so a crash at any moment leaves either the old or the new
file, never a torn one.

A trainer checkpoint is ONE file, ``<dir>/checkpoint.npz``: the center arrays
(model weights, followed by averaged optimizer state when the algorithm keeps
it on the server) plus a JSON record (version, epochs each worker finished,
the algorithm, the time) stored as a uint8 array. It is read with
``allow_pickle=False``.

`Checkpointer` decides when to write: every `every` server updates, whenever
all workers have finished one more epoch, and once more when training stops
(normally, on error or on Ctrl-C).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from trainer.errors import CheckpointError
from trainer.ps.server import completed_epochs

log = logging.getLogger("trainer.checkpoint")

FILE_NAME = "checkpoint.npz"
_META_KEY = "__meta__"

__all__ = ["Checkpoint", "CheckpointError", "Checkpointer", "atomic_write_bytes", "atomic_write_json", "json_default",
           "load_checkpoint", "save_checkpoint"]


def atomic_write_bytes(path: str | os.PathLike, write: Callable[[Any], Any]) -> Path:
    """Call ``write(file)`` on a temporary file next to `path`, then replace `path` with it (durably)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
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


@dataclass
class Checkpoint:
    center: list[np.ndarray]
    version: int
    epochs_done: dict[int, dict[str, Any]]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def completed_epochs(self) -> int:
        """Epochs every worker finished (0 when some worker finished none)."""
        return completed_epochs(self.epochs_done, int(self.meta.get("num_workers", 1)))


def save_checkpoint(directory: str | os.PathLike, checkpoint: Checkpoint) -> Path:
    """Write `checkpoint` atomically to ``<directory>/checkpoint.npz``."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "version": checkpoint.version,
        "epochs_done": {str(k): v for k, v in checkpoint.epochs_done.items()},
        "meta": checkpoint.meta,
        "saved_at": time.time(),
    }
    arrays = {f"a{i:05d}": np.asarray(a) for i, a in enumerate(checkpoint.center)}
    arrays[_META_KEY] = np.frombuffer(json.dumps(record).encode(), dtype=np.uint8)
    return atomic_write_bytes(out / FILE_NAME, lambda fh: np.savez(fh, **arrays))


def load_checkpoint(directory: str | os.PathLike) -> Checkpoint:
    """Read the checkpoint in `directory` (raises CheckpointError with the reason)."""
    path = Path(directory) / FILE_NAME
    if not path.is_file():
        raise CheckpointError(
            f"No checkpoint at {path}. Pass the directory given as checkpoint_dir= (or --checkpoint-dir) "
            "to the run you want to resume."
        )
    try:
        with np.load(path, allow_pickle=False) as data:
            record = json.loads(bytes(data[_META_KEY]).decode())
            keys = sorted(k for k in data.files if k != _META_KEY)
            center = [np.array(data[k]) for k in keys]
    except (OSError, ValueError, KeyError) as exc:
        raise CheckpointError(f"Checkpoint {path} is unreadable: {exc}") from exc
    epochs_done = {int(k): v for k, v in record["epochs_done"].items()}
    return Checkpoint(center=center, version=int(record["version"]), epochs_done=epochs_done, meta=record["meta"])


class Checkpointer:
    """Writes the server's state to `directory` every `every` updates and at each completed epoch."""

    def __init__(self, directory: str | os.PathLike, server, every: int, meta: dict[str, Any]) -> None:
        self.directory = Path(directory)
        self.server = server
        self.every = every
        self.meta = meta
        self.saved = 0
        self._lock = threading.Lock()
        self._last_epochs = -1

    def on_update(self, record) -> None:
        if self.every and record.version % self.every == 0:
            self.save()

    def on_epoch_done(self, worker: int, epoch: int) -> None:
        if completed_epochs(self.server.epochs_done, self.server.num_workers) - 1 > self._last_epochs:
            self.save()

    def save(self) -> None:
        with self._lock:
            center, version, epochs_done = self.server.snapshot()
            # The server may serve fewer workers than it started with (a retry on fewer slots).
            checkpoint = Checkpoint(center, version, epochs_done, {**self.meta, "num_workers": self.server.num_workers})
            save_checkpoint(self.directory, checkpoint)
            self._last_epochs = max(self._last_epochs, checkpoint.completed_epochs - 1)
            self.saved += 1
            log.debug("checkpoint %d saved at version %d", self.saved, version)
