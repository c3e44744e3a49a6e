"""Checkpoints of a model-selection run: one file per model per epoch, written atomically.

Layout of a checkpoint directory::

    run.json             what was searched: strategy, workers, seed, metric, configurations
    models/<id>.npz      the model's state after its last completed epoch (weights, then
                         optimizer variables, arrays a0, a1, ...) and its per-epoch history
                         (JSON in the uint8 array "history")
    progress.json        the schedule issued so far and every finished unit of work

Every file is written by ``trainer.files.atomic_write_bytes`` (a temporary
file, fsync'ed, renamed over the old one, the directory fsync'ed): a crash
leaves the previous complete file, never a torn one. A model file is
self-contained (its state and the history of exactly the epochs that state
has seen), so resuming trusts the model files; ``progress.json`` only adds the
schedule to replay. The previous version of each model file is kept
(``models/<id>.1.npz``): when the newest is damaged, resuming falls back to it
and retrains the epoch it lacks. Files are read with
``numpy.load(allow_pickle=False)`` and ``json``; every damaged file (empty,
truncated, a flipped bit) raises ``CheckpointError`` naming it and what is wrong.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from trainer.errors import CheckpointError
from trainer.files import DEFAULT_KEEP, atomic_write_bytes, atomic_write_json, json_default, read_npz, versions

__all__ = ["CheckpointStore"]

FORMAT_VERSION = 1

log = logging.getLogger("trainer.selection")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError) as exc:
        what = "empty (0 bytes)" if path.is_file() and path.stat().st_size == 0 else f"damaged: {exc}"
        raise CheckpointError(f"Cannot read {path}: it is {what}. Fix: resume from another copy of the checkpoint "
                              "directory, or start afresh with a new checkpoint_dir.") from exc


class CheckpointStore:
    """Read and write the checkpoint directory of one search (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.root = Path(directory)
        self.models_dir = self.root / "models"

    @property
    def run_file(self) -> Path:
        return self.root / "run.json"

    @property
    def progress_file(self) -> Path:
        return self.root / "progress.json"

    def exists(self) -> bool:
        return self.run_file.is_file()

    def open(self, run: dict[str, Any], resume: bool) -> bool:
        """Prepare the directory for ``run``; returns True when a previous run is to be resumed.

        ``run`` describes the search (JSON-able). With ``resume=False`` the
        directory must not hold a run yet; with ``resume=True`` a run found
        there must describe the same search.
        """
        run = json.loads(json.dumps({"format": FORMAT_VERSION, **run}, default=json_default))
        if self.exists():
            if not resume:
                raise CheckpointError(
                    f"The checkpoint directory {self.root} already holds a search (run.json). "
                    "Fix: pass resume=True to continue it, or choose an empty checkpoint_dir."
                )
            previous = _read_json(self.run_file)
            diff = sorted(k for k in set(run) | set(previous) if run.get(k) != previous.get(k))
            if diff:
                shown = "; ".join(f"{k}: checkpoint {previous.get(k)!r:.120} vs now {run.get(k)!r:.120}" for k in diff)
                raise CheckpointError(
                    f"Cannot resume from {self.root}: the search differs from the one checkpointed there ({shown}). "
                    "Fix: resume with the same search, strategy, num_workers, seed and metric, or use a new "
                    "checkpoint_dir."
                )
            return True
        self.root.mkdir(parents=True, exist_ok=True)
        self.models_dir.mkdir(exist_ok=True)
        atomic_write_json(self.run_file, run)
        return False

    def save_model(self, config_id: str, state: list[np.ndarray], history: list[dict[str, Any]],
                   keep: int = DEFAULT_KEEP) -> None:  # fmt: skip
        """Write the state after ``len(history)`` epochs of ``config_id`` (the previous `keep` - 1 versions stay)."""
        arrays = {f"a{i}": np.asarray(a) for i, a in enumerate(state)}
        arrays["history"] = np.frombuffer(json.dumps(history, default=json_default).encode("utf-8"), np.uint8)
        atomic_write_bytes(self.models_dir / f"{config_id}.npz", lambda fh: np.savez(fh, **arrays), keep=keep)

    def load_models(self, config_ids: list[str]) -> dict[str, tuple[list[np.ndarray], list[dict[str, Any]]]]:
        """``{config_id: (state, history)}`` for every model with a checkpoint (its newest readable version)."""
        out = {}
        for cid in config_ids:
            problems = []
            for path in versions(self.models_dir / f"{cid}.npz"):
                try:
                    out[cid] = self._read_model(path)
                except CheckpointError as exc:
                    problems.append(str(exc))
                    continue
                if problems:
                    log.warning("%s; %s resumes from the previous version %s (%d epochs)", "; ".join(problems), cid,
                                path, len(out[cid][1]))
                break
            if problems and cid not in out:
                raise CheckpointError("; ".join(problems) + f". Fix: delete {self.models_dir / cid}*.npz to retrain "
                                      "that model from scratch, or use a new checkpoint_dir.")
        return out

    @staticmethod
    def _read_model(path: Path) -> tuple[list[np.ndarray], list[dict[str, Any]]]:
        data = read_npz(path)
        try:
            n = sum(1 for k in data if k.startswith("a") and k[1:].isdigit())
            state = [data[f"a{i}"] for i in range(n)]
            history = json.loads(bytes(data["history"]).decode("utf-8"))
        except (KeyError, ValueError) as exc:
            raise CheckpointError(f"Checkpoint {path} is damaged: {type(exc).__name__}: {exc}") from exc
        if not isinstance(history, list):
            raise CheckpointError(f"Checkpoint {path} is damaged: its history is not a list")
        return state, history

    def save_progress(self, progress: dict[str, Any]) -> None:
        atomic_write_json(self.progress_file, progress)

    def load_progress(self) -> dict[str, Any]:
        if not self.progress_file.is_file():
            return {}
        return _read_json(self.progress_file)
