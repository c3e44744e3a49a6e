"""Durable files shared by every room: the one atomic writer and the reading of what it wrote.

`atomic_write_bytes` / `atomic_write_json` write every checkpoint file of the
project (the trainer's, `trainer.fit.checkpoints`, and the model selection's,
`trainer.selection.engine.search_checkpoints`) and the selection's results: a
temporary file in the same directory, flushed and fsync'ed, renamed over the
old one, then the directory fsync'ed, so a crash at any moment leaves either
the old or the new file, never a torn one. With ``keep=K`` the K - 1 previous
versions stay next to it (``checkpoint.1.npz`` is the one before
``checkpoint.npz``, ...; `versions` lists them newest first). `read_npz` reads
an ``.npz`` without pickles and names every kind of damage in a
`CheckpointError`. The standard library, numpy and `trainer.errors` only.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

from trainer.errors import CheckpointError

#: Versions of a checkpoint file kept by default (the newest and the one before).
DEFAULT_KEEP = 2

__all__ = ["DEFAULT_KEEP", "atomic_write_bytes", "atomic_write_json", "json_default", "read_npz", "version_path",
           "versions"]


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
