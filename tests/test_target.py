"""Time to accuracy (trainer_jobs.support.target) and the epoch-end hook behind it, without Spark."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from trainer.ps.epoch_end import EpochEnds
from trainer_jobs.support.target import (
    EpochSnapshots, score_epochs, target_table, time_to_target, with_target_speedup,
)


def history(workers: int = 2, epochs: int = 4, seconds: float = 10.0, batches: int = 24):
    """A TrainingHistory's fields as `fit` records them: per-worker epoch times, per-epoch batches."""
    records = [{"worker": w, "attempt": 0, "epochs": [
        {"epoch": e, "start": 100.0 + e * seconds + w, "end": 100.0 + (e + 1) * seconds + w} for e in range(epochs)
    ]} for w in range(workers)]
    return SimpleNamespace(workers=records, num_workers=workers,
                           epochs=[{"epoch": e, "batches": batches * workers} for e in range(epochs)])


def test_time_to_target_is_the_end_of_the_first_epoch_that_reaches_it():
    scores = {0: 0.97, 1: 0.985, 2: 0.991, 3: 0.989}
    reached = time_to_target(history(), scores, 0.99, higher_is_better=True)
    # Training starts at 100 (worker 0's first epoch), epoch 2 ends at 131 (worker 1's end).
    assert reached == {"time_to_target_s": pytest.approx(31.0), "target_epochs": 3, "target_steps": 72.0}
    assert time_to_target(history(), {0: 3.1, 1: 2.6, 2: 2.4}, 2.5, higher_is_better=False)["target_epochs"] == 3
    missed = time_to_target(history(), scores, 0.995, higher_is_better=True)
    assert missed == {"time_to_target_s": None, "target_epochs": None, "target_steps": None}
    assert time_to_target(history(), scores, None, True)["time_to_target_s"] is None
    assert time_to_target(history(), {0: float("nan")}, 5.0, False)["target_epochs"] is None


def test_time_to_target_counts_the_last_attempt_only():
    h = history()
    h.workers = [dict(w, attempt=0, epochs=w["epochs"][:1]) for w in h.workers] + [dict(w, attempt=1) for w in
                                                                                 h.workers]
    assert time_to_target(h, {1: 0.99}, 0.99, True)["time_to_target_s"] == pytest.approx(21.0)


def test_target_speedup_compares_with_one_worker_of_the_same_model_and_seed():
    rows = [
        {"model": "gru", "seed": 0, "workers": 0, "time_to_target_s": None},
        {"model": "gru", "seed": 0, "workers": 1, "time_to_target_s": 40.0},
        {"model": "gru", "seed": 0, "workers": 2, "time_to_target_s": 25.0},
        {"model": "gru", "seed": 1, "workers": 1, "time_to_target_s": 30.0},
        {"model": "gru", "seed": 1, "workers": 2, "time_to_target_s": None},
    ]
    with_target_speedup(rows)
    assert [r.get("target_speedup") for r in rows] == [None, 1.0, 1.6, 1.0, None]


def test_target_table_marks_time_shared_rows_and_counts_the_runs_that_reached_it():
    rows = [
        {"model": "lstm", "workers": 1, "target": 2.5, "time_to_target_s": 40.0, "target_speedup": 1.0,
         "target_epochs": 4, "target_steps": 1080, "timing_valid": True},
        {"model": "lstm", "workers": 8, "target": 2.5, "time_to_target_s": 90.0, "target_speedup": 0.4,
         "target_epochs": 7, "target_steps": 238, "timing_valid": False},
        {"model": "lstm", "workers": 8, "target": 2.4, "time_to_target_s": None, "timing_valid": False},
    ]
    table = target_table(rows)
    assert "| 8 * |" in table and "1 of 2" in table and "238" in table
    assert "90" not in table  # a time-shared time is left out


def test_epoch_ends_calls_the_hook_once_per_epoch_every_worker_finished():
    calls = []
    server = SimpleNamespace(num_workers=2, epochs_done={}, center=lambda: [np.zeros(2)])
    ends = EpochEnds(lambda epoch, center, at: calls.append(epoch))
    ends.bind(server)
    for worker, epoch in [(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (1, 2)]:
        server.epochs_done[worker] = {"epoch": epoch}
        ends.on_epoch_done(worker, epoch)
    assert calls == [0, 1, 2]
    resumed = EpochEnds(lambda epoch, center, at: calls.append(("resumed", epoch)))
    resumed.bind(server)  # the server already counts 3 epochs done: only later ones are reported
    server.epochs_done = {0: {"epoch": 3}, 1: {"epoch": 3}}
    resumed.on_epoch_done(1, 3)
    assert calls[-1] == ("resumed", 3)


def test_snapshots_are_scored_with_the_model_s_weights_only():
    snapshots = EpochSnapshots()
    for epoch in range(3):
        snapshots(epoch, [np.full(2, float(epoch)), np.ones(5)], at=0.0)  # a model weight, then optimizer state
    model = SimpleNamespace(weights=[None], set_weights=lambda w: setattr(model, "w", w))
    assert score_epochs(snapshots, model, lambda m: float(m.w[0][0]) / 10) == {0: 0.0, 1: 0.1, 2: 0.2}


def test_the_mnist_job_names_its_target_only_when_reached_or_chased():
    import importlib

    mnist = importlib.import_module("trainer_jobs.mnist")
    missing = {"time_to_target_s": None, "target_epochs": None, "target_steps": None}
    fitted = SimpleNamespace(history=SimpleNamespace(epochs=[{}] * 2))
    demo = mnist.parse_args(["--workers", "1,2", "--epochs", "2", "--limit", "12000"])  # make demo's arguments
    assert mnist._target_note(demo, missing, fitted) == ""  # 99 % is out of reach there: no line that always fails
    reached = {"time_to_target_s": 31.04, "target_epochs": 2, "target_steps": 375.0}
    assert mnist._target_note(demo, reached, fitted) == ", 0.990 reached in 31.0 s (epoch 2)"
    chased = mnist.parse_args(["--epochs", "2", "--max-epochs", "4"])
    fitted.history.epochs = [{}] * 4
    assert mnist._target_note(chased, missing, fitted) == ", 0.990 not reached in 4 epochs"
