"""Checkpoint files: round trip, torn writes, damaged files and the fallback, versions kept, background saves,
a full disk, and the model selection's store."""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from trainer.fit.checkpoints import (
    FILE_NAME, Checkpoint, CheckpointError, Checkpointer, checkpoint_files, has_checkpoint, load_checkpoint,
    read_checkpoint, save_checkpoint,
)
from trainer.selection.engine.search_checkpoints import CheckpointStore


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


# -- damage, versions, fallback ---------------------------------------------------------------


def _damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "empty":
        data = bytearray()
    elif how == "truncated":
        data = data[: len(data) // 2]
    elif how == "bit-flipped":  # one bit inside the weights' bytes
        at = data.find(np.float32(7.0).tobytes() * 4)
        assert at > 0
        data[at + 1] ^= 0x10
    path.write_bytes(bytes(data))


def _with_sevens(version: int) -> Checkpoint:
    checkpoint = _checkpoint(version)
    checkpoint.center[0] = np.full((2, 3), 7.0, np.float32)
    return checkpoint


@pytest.mark.parametrize("how, says", [
    ("empty", "is empty (0 bytes)"),
    ("truncated", "is truncated or not a checkpoint archive"),
    ("bit-flipped", "is corrupted"),
])
def test_damaged_files_raise_checkpoint_error_and_resume_falls_back_to_the_previous_one(tmp_path, how, says, caplog):
    save_checkpoint(tmp_path, _with_sevens(1))
    save_checkpoint(tmp_path, _with_sevens(2))
    newest = tmp_path / FILE_NAME
    _damage(newest, how)
    with pytest.raises(CheckpointError, match=re.escape(f"Checkpoint {newest} {says}")):
        read_checkpoint(newest)
    with caplog.at_level(logging.WARNING, logger="trainer.fit.checkpoints"):
        loaded = load_checkpoint(tmp_path)
    assert loaded.version == 1 and loaded.path == tmp_path / "checkpoint.1.npz"
    assert str(newest) in caplog.text and "resuming from the previous checkpoint" in caplog.text
    _damage(tmp_path / "checkpoint.1.npz", "truncated")
    with pytest.raises(CheckpointError, match="Every checkpoint in .* is damaged: .*checkpoint.npz.*checkpoint.1.npz"):
        load_checkpoint(tmp_path)


def test_the_last_k_versions_are_kept(tmp_path):
    for version in range(1, 6):
        save_checkpoint(tmp_path, _checkpoint(version), keep=3)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint.1.npz", "checkpoint.2.npz", FILE_NAME]
    assert [read_checkpoint(p).version for p in checkpoint_files(tmp_path)] == [5, 4, 3]
    assert has_checkpoint(tmp_path) and not has_checkpoint(tmp_path / "elsewhere")


def test_a_non_finite_center_is_never_written(tmp_path):
    save_checkpoint(tmp_path, _checkpoint(1))
    bad = _checkpoint(2)
    bad.center[0][0, 0] = np.nan
    with pytest.raises(CheckpointError, match="Refusing to checkpoint a center whose array #0 holds 1 NaN"):
        save_checkpoint(tmp_path, bad)
    assert load_checkpoint(tmp_path).version == 1 and sorted(os.listdir(tmp_path)) == [FILE_NAME]


class _Center:
    """The part of a ParameterServer a Checkpointer reads."""

    num_workers = 1
    epochs_done: dict = {}

    def __init__(self) -> None:
        self.version = 0

    def snapshot(self):
        return [np.full(3, float(self.version), np.float32)], self.version, {}


def test_periodic_saves_are_written_in_the_background(tmp_path, monkeypatch):
    import trainer.fit.checkpoints as ckpt

    real_save, writers, disk = ckpt.save_checkpoint, [], threading.Event()

    def held_disk(*args, **kwargs):  # a disk that answers only once the test lets it
        writers.append(threading.current_thread().name)
        assert disk.wait(60), "the test never released the disk"
        return real_save(*args, **kwargs)

    monkeypatch.setattr(ckpt, "save_checkpoint", held_disk)
    center = _Center()
    checkpointer = Checkpointer(tmp_path, center, every=1, meta={})

    def updates() -> None:
        for version in range(1, 4):
            center.version = version
            checkpointer.on_update(type("Record", (), {"version": version})())

    # The connection thread must not wait for the disk: the three updates return while the disk holds the
    # first save (an on_update that saved in place would block here until the 60 s above ran out).
    connection = threading.Thread(target=updates)
    connection.start()
    connection.join(30)
    assert not connection.is_alive() and not disk.is_set(), "on_update waited for the disk"
    for _ in range(1200):  # the writer thread reaches the held disk (on a busy machine it may take a while)
        if writers:
            break
        time.sleep(0.05)
    assert writers == ["trainer-checkpoint"], writers
    disk.set()
    center.version = 4
    assert checkpointer.finish() is None
    assert "trainer-checkpoint" in writers and writers[-1] == threading.current_thread().name
    assert load_checkpoint(tmp_path).version == 4, "the final save is the last state"
    assert 2 <= checkpointer.saved <= 4, "the newest snapshot wins when the disk is slower than the updates"


def test_a_full_disk_is_reported_by_finish_not_raised(full_disk, caplog):
    directory, mounted = full_disk
    center = _Center()
    checkpointer = Checkpointer(directory / "run", center, every=1, meta={})
    with caplog.at_level(logging.WARNING, logger="trainer.fit.checkpoints"):
        problem = checkpointer.finish()
    assert problem is not None and "the disk is full" in problem and str(directory / "run") in problem
    assert str(directory / "run") in caplog.text
    assert not [p for p in (directory / "run").iterdir()], "no temporary file is left behind"


# -- the model selection's store --------------------------------------------------------------


def test_the_selection_store_names_damaged_files_and_falls_back_per_model(tmp_path, caplog):
    store = CheckpointStore(tmp_path)
    store.open({"search": "grid"}, resume=False)
    store.save_model("c0", [np.full(4, 7.0, np.float32)], [{"epoch": 0}])
    store.save_model("c0", [np.full(4, 7.0, np.float32)], [{"epoch": 0}, {"epoch": 1}])
    newest = tmp_path / "models" / "c0.npz"
    _damage(newest, "bit-flipped")
    with caplog.at_level(logging.WARNING, logger="trainer.selection"):
        state, history = store.load_models(["c0"])["c0"]
    assert len(history) == 1, "the previous version: one epoch less, retrained on resume"
    assert "CRC" in caplog.text or "corrupted" in caplog.text
    _damage(tmp_path / "models" / "c0.1.npz", "empty")
    with pytest.raises(CheckpointError, match=r"c0.1.npz is empty.*Fix: delete"):
        store.load_models(["c0"])
    (tmp_path / "run.json").write_bytes(b'{"search": "gr')
    with pytest.raises(CheckpointError, match=r"Cannot read .*run.json: it is damaged"):
        store.open({"search": "grid"}, resume=True)
