"""Integration: out-of-core shards on a real Spark cluster with real TensorFlow training.

A shard larger than the worker's budget (``Trainer(shard_budget_mb=...)``, the
small memory limit of these tests) is streamed from a spill file in the
executor's local directory and trains as well as in memory: with shared
epochs, with a synchronous algorithm that needs padded, equal shards, and across a
resume from a checkpoint. The killed-executor retry runs on both paths in
``test_faults.py``. The spill file and the shuffle buffer are tested without
Spark in ``test_spill.py``.
"""

from __future__ import annotations

import pytest

from conftest import digits_model
from trainer import ADAG, SyncAveraging, Trainer
from trainer.fit.checkpoints import load_checkpoint
from trainer.spark.cluster_facts import task_memory_bytes

BUDGET_MB = 0.05  # 50 KB: each worker's shard of the 1,500 digits is about 200 KB of Arrow data


def _streamed(history) -> list[dict]:
    assert {w["feed"] for w in history.workers} == {"stream"}, [w["feed"] for w in history.workers]
    for w in history.workers:
        assert w["shard_bytes"] > BUDGET_MB * 1024 * 1024 and w["spill_bytes"] > 0
        assert w["peak_rss_bytes"] is None or w["peak_rss_bytes"] > 0
    return history.workers


@pytest.mark.timeout(300)
def test_out_of_core_shard_larger_than_its_budget_trains(digits):
    train, test = digits
    fitted = Trainer(digits_model(), algorithm=ADAG(window=4), num_workers=2, epochs=8, verbose=False,
                     shard_budget_mb=BUDGET_MB).fit(train)
    workers = _streamed(fitted.history)
    assert fitted.evaluate(test)["accuracy"] >= 0.88
    assert all(w["shared_epochs"] for w in workers)
    for epoch in fitted.history.epochs:  # shared epochs: one pass over all the data, counted by the server
        assert 2 * 24 <= epoch["batches"] <= 2 * 24 + 2 * 4, fitted.history.epochs
    # The default budget (a quarter of the executor's memory per task) keeps these shards in memory.
    small = Trainer(digits_model(), algorithm=ADAG(window=4), num_workers=2, epochs=1, verbose=False).fit(train)
    assert {w["feed"] for w in small.history.workers} == {"memory"}
    assert all(w["spill_bytes"] == 0 for w in small.history.workers)


@pytest.mark.timeout(300)
def test_out_of_core_synchronous_algorithm_pads_streamed_shards_to_equal_batches(digits):
    train, test = digits
    uneven = train.limit(1499)  # 750 and 749 rows: the shorter shard is padded with a repeat
    fitted = Trainer(digits_model(), algorithm=SyncAveraging(every=4), num_workers=2, epochs=6, verbose=False,
                     feed="stream").fit(uneven)
    workers = _streamed(fitted.history)
    assert sorted(w["rows"] for w in workers) == [749, 750]
    assert [w["padded_rows"] for w in workers] == [750, 750]
    assert [[e["batches"] for e in w["epochs"]] for w in workers] == [[24] * 6] * 2  # every round, both
    assert fitted.evaluate(test)["accuracy"] >= 0.88


@pytest.mark.timeout(400)
def test_out_of_core_fit_resumes_from_its_checkpoint(digits, tmp_path):
    train, test = digits

    def trainer(epochs: int) -> Trainer:
        return Trainer(digits_model(), algorithm=ADAG(window=4), num_workers=2, epochs=epochs, verbose=False,
                       feed="stream", checkpoint_dir=tmp_path)

    trainer(3).fit(train)
    assert load_checkpoint(tmp_path).completed_epochs == 3
    fitted = trainer(6).fit(train, resume_from=tmp_path)
    workers = _streamed(fitted.history)
    assert {w["start_epoch"] for w in workers} == {3} and len(fitted.history.epochs) == 3
    assert fitted.evaluate(test)["accuracy"] >= 0.88


def test_task_memory_is_the_executor_memory_per_slot(spark, local_cluster_2):
    # The test cluster's executors: one core each, the LocalCluster's default executor memory.
    assert task_memory_bytes(spark) == local_cluster_2.executor_memory_mb() * 1024 * 1024


def test_bad_feed_arguments_are_named():
    with pytest.raises(ValueError, match="`feed` must be one of 'auto', 'memory', 'stream'. Received: feed='disk'"):
        Trainer(digits_model(), feed="disk")
    with pytest.raises(ValueError, match="`shard_budget_mb` must be a number > 0 or None. Received: "
                                         "shard_budget_mb=0"):
        Trainer(digits_model(), shard_budget_mb=0)
