"""Checkpoints of a model-selection run: one file per model per epoch, written atomically.

Layout of a checkpoint directory::

    run.json             what was searched: strategy, workers, seed, metric, configurations
    models/<id>.npz      the model's state after its last completed epoch (weights, then
                         optimizer variables, arrays a0, a1, ...) and its per-epoch history
                         (JSON in the uint8 array "history")
    progress.json        the schedule issued so far and every finished unit of work

Every file is written by ``trainer.checkpoint.atomic_write_bytes`` (a temporary
file, fsync'ed, renamed over the old one): a crash leaves the previous
complete file, never a torn one. A model file is self-contained (its
state and the history of exactly the epochs that state has seen), so resuming
trusts the model files; ``progress.json`` only adds the schedule to replay.
Files are read with ``numpy.load(allow_pickle=False)`` and ``json``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from trainer.checkpoint import json_default, atomic_write_bytes, atomic_write_json
from trainer.errors import CheckpointError

__all__ = ["CheckpointStore"]

FORMAT_VERSION = 1


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
            previous = json.loads(self.run_file.read_text(encoding="utf-8"))
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

    def save_model(self, config_id: str, state: list[np.ndarray], history: list[dict[str, Any]]) -> None:
        """Write the state after ``len(history)`` epochs of ``config_id``."""
        arrays = {f"a{i}": np.asarray(a) for i, a in enumerate(state)}
        arrays["history"] = np.frombuffer(json.dumps(history, default=json_default).encode("utf-8"), np.uint8)
        atomic_write_bytes(self.models_dir / f"{config_id}.npz", lambda fh: np.savez(fh, **arrays))

    def load_models(self, config_ids: list[str]) -> dict[str, tuple[list[np.ndarray], list[dict[str, Any]]]]:
        """``{config_id: (state, history)}`` for every model with a checkpoint."""
        out = {}
        for cid in config_ids:
            path = self.models_dir / f"{cid}.npz"
            if not path.is_file():
                continue
            try:
                with np.load(path, allow_pickle=False) as data:
                    n = sum(1 for k in data.files if k.startswith("a") and k[1:].isdigit())
                    state = [data[f"a{i}"] for i in range(n)]
                    history = json.loads(bytes(data["history"]).decode("utf-8"))
            except (OSError, ValueError, KeyError) as exc:
                raise CheckpointError(
                    f"Cannot read the checkpoint {path}: {exc}. Fix: delete that file to retrain the model "
                    "from scratch, or use a new checkpoint_dir."
                ) from exc
            out[cid] = (state, history)
        return out

    def save_progress(self, progress: dict[str, Any]) -> None:
        atomic_write_json(self.progress_file, progress)

    def load_progress(self) -> dict[str, Any]:
        if not self.progress_file.is_file():
            return {}
        return json.loads(self.progress_file.read_text(encoding="utf-8"))
