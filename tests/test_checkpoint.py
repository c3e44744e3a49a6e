"""Atomic checkpoint files: round trip, torn writes, wrong models."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from trainer.checkpoint import FILE_NAME, Checkpoint, CheckpointError, load_checkpoint, save_checkpoint


def _checkpoint(version: int = 7) -> Checkpoint:
    center = [np.arange(6, dtype=np.float32).reshape(2, 3), np.array(5, np.int64)]
    done = {0: {"epoch": 2, "logs": {"loss": 0.5}, "time": 1.0}, 1: {"epoch": 1, "logs": {}, "time": 2.0}}
    return Checkpoint(center, version, done, {"num_workers": 2, "algorithm": "adag(every 4 batches)"})


def test_round_trip(tmp_path):
    save_checkpoint(tmp_path, _checkpoint())
    loaded = load_checkpoint(tmp_path)
    assert loaded.version == 7
    assert loaded.completed_epochs == 2  # both workers finished epochs 0 and 1
    assert loaded.epochs_done[0]["logs"] == {"loss": 0.5}
    assert [a.dtype for a in loaded.center] == [np.float32, np.int64]
    np.testing.assert_array_equal(loaded.center[0], np.arange(6).reshape(2, 3))
    assert sorted(os.listdir(tmp_path)) == [FILE_NAME], "no temporary file may be left behind"


def test_a_torn_write_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    save_checkpoint(tmp_path, _checkpoint(version=1))

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", crash)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, _checkpoint(version=2))
    assert load_checkpoint(tmp_path).version == 1
    assert sorted(os.listdir(tmp_path)) == [FILE_NAME]


def test_missing_and_corrupt_checkpoints_are_named(tmp_path):
    with pytest.raises(CheckpointError, match="No checkpoint at"):
        load_checkpoint(tmp_path)
    (Path(tmp_path) / FILE_NAME).write_bytes(b"not a zip file")
    with pytest.raises(CheckpointError, match="truncated or not a checkpoint archive"):
        load_checkpoint(tmp_path)


def test_completed_epochs_needs_every_worker(tmp_path):
    checkpoint = _checkpoint()
    checkpoint.epochs_done.pop(1)
    assert checkpoint.completed_epochs == 0
