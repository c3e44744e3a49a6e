"""Integration: real Spark standalone cluster (2 worker daemons), real TensorFlow training."""

from __future__ import annotations

import time
import warnings

import keras
import numpy as np
import pytest
from pyspark.sql import functions as F

from conftest import digits_model
from trainer import (
    ADAG, DOWNPOUR, ClusterCapacityError, DataValidationError, DynSGD, SingleWorker, SyncAveraging, Trainer,
)
from trainer_benchmarks.bench_quality import CASES as QUALITY_CASES

# The floor of each algorithm's test accuracy: digits, 1,500 rows, 2 workers, batch 32, 8 epochs (chance: 0.1). The
# floors and the worst run of their calibration (20 runs each) are benchmarks/bench_quality.py's CASES; `make
# bench-quality` runs each case 20 times again and writes the spread into docs/benchmarks.md. One fit per
# algorithm here.
ALGORITHMS = [pytest.param(case.algorithm(), case.workers, case.lr, case.floor, id=case.name,
                           marks=[pytest.mark.core] if case.name in ("adag", "sync-every-4") else [])
              for case in QUALITY_CASES]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("algorithm", "workers", "lr", "floor"), ALGORITHMS)
def test_algorithm_trains_digits(digits, algorithm, workers, lr, floor):
    train, test = digits
    fitted = Trainer(digits_model(lr), algorithm=algorithm, num_workers=workers, batch_size=32, epochs=8,
                     verbose=False).fit(train)
    metrics = fitted.evaluate(test)
    assert metrics["accuracy"] >= floor, f"{algorithm.describe()}: {metrics}"
    history = fitted.history
    assert history.num_workers == workers
    assert len(history.epochs) == 8
    assert history.loss[-1] < history.loss[0]
    assert history.num_updates > 0 and history.bytes_moved > 0
    assert {w["worker"] for w in history.workers} == set(range(workers))
    assert all(w["commits"] > 0 and w["bytes_sent"] > 0 for w in history.workers)
    assert history.timings["data_delivery_s"] > 0


@pytest.mark.core
@pytest.mark.timeout(300)
def test_compressed_commits_train_digits_with_a_fraction_of_the_bytes(digits):
    train, test = digits
    fitted = Trainer(digits_model(0.01), algorithm=DynSGD(window=4), compression="topk:0.1", num_workers=2,
                     batch_size=32, epochs=8, verbose=False).fit(train)
    assert fitted.evaluate(test)["accuracy"] >= 0.88
    assert "topk:0.1" in fitted.history.algorithm
    for w in fitted.history.workers:
        assert w["commits"] > 0
        assert w["bytes_sent"] < 0.35 * w["bytes_received"]  # 10 % indices + values up, the dense center down
        assert w["exchange_s"]["round_trip"] > 0 and w["exchange_s"]["payload"] > 0


@pytest.mark.core
@pytest.mark.timeout(300)
def test_transform_evaluate_and_second_fit(digits, spark):
    train, test = digits
    # One epoch each: what is checked is that transform, evaluate and the local model agree, not how well they do.
    fitted = Trainer(digits_model(), algorithm=ADAG(window=4), num_workers=2, epochs=1, verbose=False).fit(train)
    # A second fit in the same driver process, with a builder function this time.
    fitted2 = Trainer(digits_model, algorithm=DOWNPOUR(window=4), num_workers=2, epochs=1, verbose=False).fit(train)
    for model in (fitted, fitted2):
        predicted = model.transform(test.repartition(7))  # more partitions than rows per partition
        rows = predicted.select("label", "prediction").collect()
        assert len(rows) == 297
        probs = np.array([r.prediction for r in rows])
        assert probs.shape == (297, 10)
        np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-3)
        accuracy = float(np.mean(probs.argmax(axis=1) == np.array([r.label for r in rows])))
        metrics = model.evaluate(test)
        assert abs(metrics["accuracy"] - accuracy) < 1e-6
        # local predictions from the fitted Keras model agree with the distributed ones
        sample = test.limit(5).collect()
        x = np.array([r.features for r in sample], np.float32)
        local = model.keras_model.predict(x, verbose=0)
        dist = model.transform(spark.createDataFrame(sample, test.schema).coalesce(1)).select("prediction").collect()
        np.testing.assert_allclose(local, np.array([r.prediction for r in dist]), atol=1e-4)


@pytest.mark.timeout(300)
def test_transform_handles_empty_partitions(digits, spark):
    train, _ = digits
    fitted = Trainer(digits_model(), num_workers=2, epochs=1, verbose=False).fit(train)
    few = train.limit(3).repartition(6)  # at least 3 empty partitions
    assert few.rdd.glom().map(len).collect().count(0) >= 3
    assert fitted.transform(few).count() == 3
    scalar = spark.createDataFrame([([1.0, 2.0],), ([3.0, 4.0],)], "features array<float>")
    regressor = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    regressor.compile(optimizer="sgd", loss="mse")
    reg_df = spark.createDataFrame([([1.0, 2.0], 3.0), ([3.0, 4.0], 7.0)], "features array<float>, label double")
    fitted_reg = Trainer(regressor, num_workers=2, batch_size=1, epochs=1, verbose=False).fit(reg_df)
    values = [r.prediction for r in fitted_reg.transform(scalar).collect()]
    assert all(isinstance(v, float) for v in values)


class _SlowOnWorker1(keras.layers.Layer):
    """Identity layer that sleeps on every batch in worker task 1 (eager mode runs it each step). A quarter of a
    second: under a loaded machine's CPU share (CI once ran the other worker's eager steps slower than a 0.1 s
    sleep, and the sleeper did more batches), worker 0's step must stay the faster one by a wide margin."""

    def call(self, x):
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is not None and context.partitionId() == 1:
            time.sleep(0.25)
        return x


def _straggler_model():
    model = keras.Sequential([keras.Input((64,)), _SlowOnWorker1(), keras.layers.Dense(10, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"], run_eagerly=True)
    return model


@pytest.mark.timeout(300)
def test_shared_epochs_let_the_fast_worker_do_the_straggler_s_batches(digits):
    train, test = digits
    budget = 2 * 24  # 1,500 rows: 750 per worker, 24 batches of 32 each, per epoch
    runs = {}
    for share, epochs in ((True, 3), (False, 2)):
        fitted = Trainer(_straggler_model, algorithm=DOWNPOUR(window=2), num_workers=2, batch_size=32, epochs=epochs,
                         verbose=False, share_epochs=share,
                         custom_objects={"_SlowOnWorker1": _SlowOnWorker1}).fit(train)
        runs[share] = fitted
    assert runs[True].evaluate(test)["accuracy"] >= 0.85  # the fast worker's extra batches train the model
    shared, fixed = runs[True].history, runs[False].history
    for epoch in shared.epochs:  # the epoch ends at the first exchange past one pass over all the data
        assert budget <= epoch["batches"] <= budget + 2 * 2, shared.epochs
    per_worker = {w["worker"]: [e["batches"] for e in w["epochs"]] for w in shared.workers}
    assert sum(per_worker[0]) > sum(per_worker[1]), per_worker  # the straggler did fewer batches
    assert all(w["shared_epochs"] for w in shared.workers)
    assert [e["batches"] for w in fixed.workers for e in w["epochs"]] == [24] * 4  # one pass each, every epoch
    assert not any(w["shared_epochs"] for w in fixed.workers)


@pytest.mark.timeout(300)
def test_a_sharded_parameter_server_trains_and_every_shard_applies_every_commit(digits):
    train, test = digits
    updates = []
    fitted = Trainer(digits_model(0.005), algorithm=DOWNPOUR(window=4), num_workers=2, batch_size=32, epochs=4,
                     verbose=False, ps_shards=2, on_update=updates.append).fit(train)
    history = fitted.history
    assert all(np.isfinite(w).all() for w in fitted.keras_model.get_weights())
    assert fitted.evaluate(test)["accuracy"] >= 0.80  # DOWNPOUR at 0.005: the floor of ALGORITHMS' downpour
    commits = sum(w["commits"] for w in history.workers)
    assert commits > 0 and history.num_updates == commits == len(updates)  # shard 0's records: one per commit
    assert history.update_totals["shard_updates"] == [commits, commits]  # every shard applied every part
    assert sorted({r.version for r in updates}) == list(range(1, commits + 1))
    assert len(history.epochs) == 4 and history.loss[-1] < history.loss[0]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("algorithm", "lr", "options"), [
    # Not DOWNPOUR: a window of extra staleness on top of adding every commit whole made its run at
    # 0.005 end at 0.85 once (it swings at 0.01 without overlap, see ALGORITHMS).
    pytest.param(ADAG(window=4), 0.01, {}, id="adag"),
    pytest.param(DynSGD(window=4), 0.005, {"compression": "topk:0.1", "ps_shards": 2}, id="dynsgd-topk-2-shards"),
])
def test_overlapped_commits_train_digits_and_count_every_commit(digits, algorithm, lr, options):
    """overlap=True: each commit's round trip runs while the next window trains, its reply folded in later."""
    train, test = digits
    updates = []
    fitted = Trainer(digits_model(lr), algorithm=algorithm, num_workers=2, batch_size=32, epochs=4,
                     verbose=False, overlap=True, on_update=updates.append, **options).fit(train)
    history = fitted.history
    assert fitted.evaluate(test)["accuracy"] >= 0.88
    assert len(history.epochs) == 4 and history.loss[-1] < history.loss[0]
    commits = sum(w["commits"] for w in history.workers)
    assert commits > 0 and history.num_updates == commits == len(updates)  # every reply waited for
    budget = 2 * 24  # 1,500 rows, 2 workers, batch 32
    for epoch in history.epochs:  # the end of a shared epoch is seen one window late
        assert budget <= epoch["batches"] <= budget + 2 * 2 * 4, history.epochs


# -- bad input: a clear error within seconds, before any training job -------------

def _fails_fast(df, match, **kwargs):
    updates = []
    trainer = Trainer(kwargs.pop("model", None) or digits_model(), verbose=False, epochs=10_000,
                      on_update=updates.append, **kwargs)
    started = time.monotonic()
    with pytest.raises((DataValidationError, ClusterCapacityError), match=match):
        trainer.fit(df)
    elapsed = time.monotonic() - started
    # Before any training: no worker ever committed, and well within the time 10,000 epochs would take (an
    # error in the stage would come after minutes of training; 60 s leaves room for a loaded machine).
    assert not updates, f"training started before the error: {len(updates)} updates"
    assert elapsed < 60, f"error took {elapsed:.1f} s"


@pytest.mark.timeout(120)
def test_bad_input_fails_fast(digits, spark):
    train, _ = digits
    _fails_fast(train.withColumnRenamed("features", "feature"), "Did you mean 'feature'")
    _fails_fast(train, "not in the DataFrame", label_col="labels")
    _fails_fast(train.withColumn("features", F.slice("features", 1, 60)), "60 values but the model's input shape is \\(64\\)")
    nan = train.withColumn("features", F.when(F.col("label") == 3, F.array_repeat(F.lit(float("nan")), 64)).otherwise(F.col("features")))
    _fails_fast(nan, "NaN or infinite feature values")
    inf = train.withColumn("features", F.when(F.col("label") == 4, F.array_repeat(F.lit(float("inf")), 64)).otherwise(F.col("features")))
    _fails_fast(inf, "NaN or infinite feature values")
    inf_label = train.withColumn("label", F.when(F.col("label") == 4, F.lit(float("inf"))).otherwise(F.col("label").cast("double")))
    _fails_fast(inf_label, "NaN or infinite label")
    _fails_fast(train.withColumn("features", F.col("features").cast("array<string>")), "type array<string>")
    _fails_fast(train.withColumn("features", F.create_map(F.lit("a"), F.lit(1.0))), "type map<string,double>")
    _fails_fast(train.filter("label > 99"), "empty")
    _fails_fast(train.withColumn("label", F.col("label") + 5), "Labels range from 5 to 14")
    _fails_fast(train.withColumn("label", F.col("label").cast("string")), "type string")
    _fails_fast(train, "needs 3 task slots .* offers 2", num_workers=3, slot_timeout=2)
    _fails_fast(train.limit(1), "1 rows but at least 2", num_workers=2)
    uncompiled = keras.Sequential([keras.Input((64,)), keras.layers.Dense(10)])
    _fails_fast(train, "not compiled", model=uncompiled)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="num_workers"):
        Trainer(digits_model(), num_workers=0)
    with pytest.raises(ValueError, match="exactly one worker"):
        Trainer(digits_model(), algorithm=SingleWorker(), num_workers=2)
    with pytest.raises(ValueError, match="Unknown algorithm 'hogwild'"):
        Trainer(digits_model(), algorithm="hogwild")
    with pytest.raises(TypeError, match="compiled keras.Model"):
        Trainer("model.h5")
    with pytest.raises(ValueError, match="ps_shards` must be a positive integer"):
        Trainer(digits_model(), ps_shards=0)
    with pytest.raises(ValueError, match="overlap=True` needs a delta algorithm with a window"):
        Trainer(digits_model(), algorithm=SyncAveraging(every=4), overlap=True)
    with pytest.raises(ValueError, match="cannot be sharded"):
        Trainer(digits_model(), algorithm=SyncAveraging(average_optimizer_state=True), ps_shards=2)


def test_adag_at_the_default_rate_of_one_process_is_warned_about():
    from trainer.fit.plan import warn_slow_choice

    model = digits_model(lr=1e-3)  # Adam at its default rate
    with pytest.warns(UserWarning, match=r"ADAG divides every commit by its window \(5\).*raise the learning rate"):
        warn_slow_choice(ADAG(window=5), model)
    model.optimizer.learning_rate = 0.01  # raised for the window: no advice
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_slow_choice(ADAG(window=5), model)
        warn_slow_choice(DOWNPOUR(), digits_model())


@pytest.mark.timeout(120)
def test_a_bad_shard_option_fails_before_any_training_job(digits):
    train, _ = digits
    tiny = keras.Sequential([keras.Input((64,)), keras.layers.Dense(1)])
    tiny.compile(optimizer="adam", loss="mse")
    with pytest.raises(ValueError, match="cannot be cut into 80 parameter-server shards"):
        Trainer(tiny, num_workers=2, ps_shards=80, verbose=False).fit(train)
    with pytest.raises(ValueError, match="cannot start a range of 4 ports"):
        Trainer(digits_model(), num_workers=2, ps_shards=4, ps_port=65534, verbose=False).fit(train)


def test_error_summary_names_the_root_cause():
    from trainer.spark.launch import error_summary

    python_error = ("An error occurred while calling o12.collectToPython.\nTraceback (most recent call last):\n"
                    '  File "worker.py", line 3, in f\nValueError: bad shape (3,)\n\tat org.apache.spark')
    assert error_summary(Exception(python_error)) == "ValueError: bad shape (3,)"
    lost = ("An error occurred while calling o448.collectToPython.\n: org.apache.spark.SparkException: Job aborted "
            "due to stage failure: Could not recover from a failed barrier ResultStage.\nExecutorLostFailure "
            "(executor 1 exited unrelated to the running tasks) Reason: worker lost\n\tat org.apache")
    assert error_summary(Exception(lost)).startswith("ExecutorLostFailure (executor 1 exited")
    assert error_summary(Exception("")) == "Exception"
