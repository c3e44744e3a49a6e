"""AllReduce: N barrier tasks as ONE group on the Keras backend's own collective engine, all-reducing every
step's gradients: JAX's distributed runtime, TensorFlow's collective ops, torch.distributed (gloo on CPU).

The tests marked ``backend`` run once per Keras backend in `make test` (TensorFlow in the main run, JAX and
torch beside it), on the real LocalCluster (the ``spark`` fixture) with the backend's real collective runtime:
the weights after k steps equal plain Keras's on the same global batches, validation, the learning-rate
schedule and a driver-side callback behave as in plain Keras, and a killed executor fails the stage, whose
retry resumes from the last epoch end. The collective loop itself also runs without Spark (two processes and a
real parameter server), with the learning rate scaled for the global batch.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import threading
import time
import types

import numpy as np
import pytest

from collective_processes import run_processes
from conftest import digits_model
from spark_processes import executor_pids
from trainer import Trainer
from trainer.algorithms import (
    ALGORITHMS, AlgorithmConfigError, AllReduce, CollectiveAlgorithm, ParameterServerAlgorithm, get_algorithm,
)
from trainer.algorithms.reported import ReportedState
from trainer.fit.kinds import fit_kind
from trainer.fit.plan import plan_fit
from trainer.runtime.feeding.arrow import pad_shard
from trainer.runtime.collective.group import gpu_identities, shares_gpu
from trainer.runtime.collective.loop import epoch_order
from trainer.runtime.collective.collective_task import equal_rows
from trainer.spark.cluster_facts import FitCluster


# --------------------------------------------------------------------------- the algorithm, pure


def test_allreduce_is_a_named_collective_algorithm():
    algorithm = get_algorithm("allreduce")
    assert isinstance(algorithm, AllReduce) and ALGORITHMS["allreduce"] is AllReduce
    assert algorithm.fit_kind == "collective" and algorithm.exchanges_optimizer_state
    assert algorithm.describe() == "allreduce(every step)"
    # it implements the collective contract, and poses as no parameter-server algorithm: it has none of its functions
    assert isinstance(algorithm, CollectiveAlgorithm) and not isinstance(algorithm, ParameterServerAlgorithm)
    assert not any(hasattr(algorithm, f) for f in ("server_commit", "server_round", "worker_payload", "worker_apply"))
    assert algorithm.cadence().period == 1 and algorithm.learning_rate_factor(4) == 4.0
    endpoint = ReportedState()  # the collective fit's once-per-epoch endpoint
    state = [np.arange(3.0), np.ones((2, 2))]
    center, reply = endpoint.server_commit([np.zeros(3), np.zeros((2, 2))], state, staleness=0)
    assert center[0] is state[0] and reply == []  # the center is task 0's state; nothing goes back


def test_keras_estimator_and_its_saved_params_take_allreduce():
    from trainer.ml import KerasEstimator
    from trainer.ml.params import algorithm_from_json, algorithm_to_json

    estimator = KerasEstimator(model=digits_model, algorithm="allreduce", numWorkers=2)
    assert isinstance(estimator.trainer().algorithm, AllReduce)
    assert algorithm_to_json(AllReduce()) == {"name": "allreduce", "params": {"lr_scaling": "linear", "period": 1,
                                                                               "max_period": 16, "wire": "fp32",
                                                                               "outer_momentum": 0.0}}
    assert algorithm_from_json({"name": "allreduce", "params": {}}) == AllReduce()  # saved before lr_scaling
    assert algorithm_from_json(algorithm_to_json(AllReduce(lr_scaling="none"))) == AllReduce(lr_scaling="none")
    with pytest.raises(AlgorithmConfigError, match="allreduce takes the hyper-parameters lr_scaling, period, "
                                                   "max_period, wire, outer_momentum. Received: window=5"):
        get_algorithm("allreduce", window=5)


def test_every_keras_backend_has_a_collective_path_and_another_is_named_with_the_fix():
    from trainer.backends import NAMES

    # the backends' rooms say which have a collective path (tests/test_backend_rooms.py tests the rooms)
    for backend in NAMES:
        AllReduce().check_backend(backend)
    with pytest.raises(AlgorithmConfigError, match=r"exists for jax, tensorflow, torch. Received: backend='numpy'"):
        AllReduce().check_backend("numpy")


def test_the_learning_rate_follows_the_global_batch_unless_told_otherwise():
    assert [AllReduce().learning_rate_factor(n) for n in (1, 2, 8)] == [1.0, 2.0, 8.0]
    assert AllReduce(lr_scaling="sqrt").learning_rate_factor(4) == 2.0
    assert AllReduce(lr_scaling="none").learning_rate_factor(8) == 1.0
    assert AllReduce(lr_scaling="none").describe() == "allreduce(every step), lr_scaling=none"
    with pytest.raises(AlgorithmConfigError, match=r"Received: lr_scaling='cubic'. Fix: "):
        AllReduce(lr_scaling="cubic")


def test_shards_are_padded_to_the_largest_and_too_uneven_ones_refused():
    assert equal_rows([750, 750], 32) == 750
    assert equal_rows([605, 604, 604], 32) == 605
    with pytest.raises(ValueError, match=r"\[100, 300\] rows: too uneven .*Fix: "):
        equal_rows([100, 300], 32)
    with pytest.raises(ValueError, match="too uneven"):
        equal_rows([0, 10], 4)


def test_every_process_feeds_the_same_permutation_each_epoch():
    first = epoch_order(10, seed=3, epoch=0)
    assert sorted(first) == list(range(10))
    np.testing.assert_array_equal(first, epoch_order(10, seed=3, epoch=0))
    assert not np.array_equal(first, epoch_order(10, seed=3, epoch=1))


def test_processes_share_a_gpu_when_their_gpus_have_one_identity_in_common(monkeypatch):
    """NCCL takes one process per GPU: the tasks find out who shares one from the identities they gather (UUIDs
    where nvidia-smi answers, else the host's name and the address, as here with no nvidia-smi on the PATH)."""
    monkeypatch.setenv("PATH", "")
    host = socket.gethostname()
    assert gpu_identities(None) == [] and gpu_identities(["0", "2"]) == [f"{host}:0", f"{host}:2"]
    assert [shares_gpu([["a"], ["b"]], i) for i in range(2)] == [False, False]
    assert [shares_gpu([["a", "b"], ["c"], ["b"]], i) for i in range(3)] == [True, False, True]
    assert [shares_gpu([[], []], i) for i in range(2)] == [False, False]  # CPU tasks share nothing


def test_jax_refuses_an_all_reduce_every_step_between_processes_sharing_a_gpu_with_the_fix():
    from trainer.runtime.collective.jax_group import BackendGroup

    job = types.SimpleNamespace(shared_gpu=True, cadence=AllReduce().cadence())
    with pytest.raises(ValueError, match="share a GPU cannot all-reduce every step.*LocalSGD"):
        BackendGroup.join(job)


# --------------------------------------------------------------------------- plain Keras on the global batch


def _plain_global_batches(shards: list[tuple[np.ndarray, np.ndarray]], batch_size: int, seed: int, epoch: int):
    """The rows plain Keras sees in `epoch` with batch ``len(shards) * batch_size``: step k's global batch is
    every process's k-th local batch of its shard in `epoch_order`, in process order."""
    rows = len(shards[0][0])
    order = epoch_order(rows, seed, epoch)
    xs, ys = [], []
    for start in range(0, rows, batch_size):
        for x, y in shards:
            xs.append(x[order[start:start + batch_size]])
            ys.append(y[order[start:start + batch_size]])
    return np.concatenate(xs), np.concatenate(ys)


def _constant_rate_model(rate: float):
    """digits_model with Adam at a constant `rate`."""
    import keras

    model = digits_model()
    model.compile(optimizer=keras.optimizers.Adam(rate), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def _schedule_model():
    """digits_model with Adam on a step-decayed rate: the schedule reads the optimizer's iteration count."""
    import keras

    model = digits_model()
    schedule = keras.optimizers.schedules.ExponentialDecay(0.01, decay_steps=20, decay_rate=0.7)
    model.compile(optimizer=keras.optimizers.Adam(schedule), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


@pytest.mark.timeout(600)
@pytest.mark.parametrize("size", [1, pytest.param(2, marks=pytest.mark.backend)])
def test_collective_processes_without_spark_take_plain_keras_steps(size):
    """The loop's mechanics alone, under this session's backend: two processes joined by the backend's
    collective runtime and a real parameter server (task 0 reports there), no Spark; the state task 0 reports
    equals plain Keras's at twice the compiled rate (the default linear scaling for 2 workers), and carries the
    compiled rate itself: under every backend (`make test`'s backend runs), where each engine differs. One process
    alone joins no engine and takes Keras's own step (the same check at the compiled rate): the main run only, as
    that path holds nothing of a backend's but the state it reads and writes, which every fit under each backend
    does (tests/test_backends.py)."""
    import keras

    backend = keras.backend.backend()
    rng = np.random.default_rng(0)
    x = rng.random((96, 64), dtype=np.float32)
    y = rng.integers(0, 10, 96).astype(np.int32)
    shards = [(x[i::size], y[i::size]) for i in range(size)]  # 2 x 48 rows: 3 steps of 16 an epoch
    rows = len(shards[0][0])
    model = _constant_rate_model(0.005)
    model.optimizer.build(model.trainable_variables)
    start = [w.copy() for w in model.get_weights()]
    records, center = run_processes(model, shards, AllReduce(), batch_size=16, epochs=2, seed=5)
    plain = _constant_rate_model(0.005 * size)  # plain Keras at the global batch, at the scaled rate
    plain.set_weights(start)
    for epoch in range(2):
        gx, gy = _plain_global_batches(shards, 16, seed=5, epoch=epoch)
        logs = plain.fit(gx, gy, batch_size=16 * size, epochs=1, shuffle=False, verbose=0).history
        assert records[0]["epochs"][epoch]["logs"]["loss"] == pytest.approx(logs["loss"][0], rel=1e-5)
    weights = len(plain.weights)
    # atol 1e-5: the all-reduce sums the two halves' gradients in another order than plain Keras's one batch, and
    # Adam's division by a tiny second moment magnifies that rounding (torch once: 1 of 2,048 weights 4.9e-6 off);
    # a wrong rate or a missed step moves the weights by 1e-3 or more
    for got, want in zip(center[:weights], plain.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    state = dict(zip([v.path for v in model.optimizer.variables], center[weights:]))
    steps = 2 * math.ceil(rows / 16)
    assert int(state[model.optimizer.iterations.path]) == steps  # 2 epochs of global steps came along
    assert float(state[model.optimizer._learning_rate.path]) == pytest.approx(0.005)  # the compiled rate kept
    assert [r["steps"] for r in records] == [steps] * size
    assert [r["commits"] for r in records] == [2] + [0] * (size - 1)
    assert {r["learning_rate_factor"] for r in records} == {float(size)}
    if size == 1:
        assert records[0]["train_step"] == "the model's own"
        assert records[0]["collective"] == "none (one process)"
        return
    assert {r["train_step"] for r in records} == {"local gradients"}
    assert records[0]["ring_bytes_per_step"] == 4 * model.count_params()  # 2 (N - 1) / N of the gradient, N = 2
    # make bench's step breakdown: every epoch's time in fit and, but under JAX (inside the compiled step), in
    # the all-reduce, and one all-reduce alone
    assert all(e["fit_s"] > 0 for r in records for e in r["epochs"])
    if backend == "jax":
        assert {r["allreduce_ms"] for r in records} == {None}
    else:
        assert all(0 <= e["collective_s"] < e["fit_s"] for r in records for e in r["epochs"])
        assert all(r["allreduce_ms"] > 0 for r in records)


# --------------------------------------------------------------------------- on Spark, per backend


def _shards_of(trainer: Trainer, df, validation) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each task's training rows, in the order the task receives them: the trainer's own plan, dealt by the
    same repartition the stage runs (Spark sorts before a round-robin repartition, so it is deterministic)."""
    import pyarrow as pa
    from pyspark.sql.types import IntegerType, StructField, StructType

    from trainer.data.columns import FEATURES, LABEL, VALIDATION_FLAG

    cluster = FitCluster(df.sparkSession, trainer.gpus_per_worker)
    frame = plan_fit(trainer, fit_kind(trainer, trainer.algorithm), df, cluster, None, validation).frame.repartition(
        trainer.num_workers)

    def tag(batches):
        from pyspark import TaskContext

        part = TaskContext.get().partitionId()
        for batch in batches:
            yield batch.append_column("part", pa.array([part] * batch.num_rows, pa.int32()))

    schema = StructType(frame.schema.fields + [StructField("part", IntegerType())])
    rows = frame.mapInArrow(tag, schema).toPandas()
    rows = rows[~rows[VALIDATION_FLAG]]
    return [(np.stack(rows[rows.part == p][FEATURES].to_numpy()).astype(np.float32),
             rows[rows.part == p][LABEL].to_numpy().astype(np.int32)) for p in range(trainer.num_workers)]


@pytest.mark.spark
@pytest.mark.backend
@pytest.mark.timeout(900)
def test_two_workers_train_as_plain_keras_on_the_global_batch(spark, digits):
    """2 workers x batch 16: the weights after every step equal plain Keras's at batch 32 on the same rows in
    the same order; validation, the learning-rate schedule (by step) and a driver-side EarlyStopping (it
    stops after the second epoch, so the weights are those of 2 x 48 steps) behave as in plain Keras. The rate
    is the compiled one (lr_scaling="none"): plain Keras at that batch takes it."""
    import keras

    train, test = digits
    backend = keras.backend.backend()
    model = _schedule_model()
    start = [w.copy() for w in model.get_weights()]

    def stopper():  # improves only at the first epoch: plain Keras stops after the second
        return keras.callbacks.EarlyStopping(monitor="val_loss", min_delta=1.0, patience=1)

    trainer = Trainer(model, algorithm=AllReduce(lr_scaling="none"), num_workers=2, batch_size=16, epochs=4,
                      seed=7, verbose=False)
    shards = _shards_of(trainer, train, test)
    # Validation rows are dealt with the training rows, so the training shards differ by a few rows: each
    # task pads its own with repeats of its rows (seeded seed + worker), as the stage does.
    size = max(len(x) for x, _ in shards)
    assert size - min(len(x) for x, _ in shards) <= 30
    shards = [pad_shard(x, y, size, seed=7 + worker) for worker, (x, y) in enumerate(shards)]
    fitted = trainer.fit(train, validation=test, callbacks=[stopper()])

    held_out = test.toPandas()
    vx = np.stack(held_out["features"].to_numpy()).astype(np.float32)
    vy = held_out["label"].to_numpy()
    plain = _schedule_model()
    plain.set_weights(start)
    plain_stopper, plain_logs = stopper(), []
    plain_stopper.set_model(plain)
    plain_stopper.on_train_begin()
    for epoch in range(4):
        gx, gy = _plain_global_batches(shards, 16, seed=7, epoch=epoch)
        logs = {k: v[0] for k, v in plain.fit(gx, gy, batch_size=32, epochs=1, shuffle=False, verbose=0,
                                             validation_data=(vx, vy)).history.items()}
        plain_logs.append(logs)
        plain_stopper.on_epoch_end(epoch, logs)
        if plain.stop_training:
            break
    assert len(plain_logs) == 2
    assert [e["epoch"] for e in fitted.history.epochs] == [0, 1]
    assert any(e.get("event") == "stopped_by_callback" for e in fitted.history.events)
    for got, want in zip(fitted.history.epochs, plain_logs):
        for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
            assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-5), key
    for got, want in zip(fitted.keras_model.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert int(keras.ops.convert_to_numpy(fitted.keras_model.optimizer.iterations)) == 2 * math.ceil(size / 16)
    workers = fitted.history.workers
    assert [w["worker"] for w in workers] == [0, 1] and all(w["backend"] == backend for w in workers)
    assert {w["train_step"] for w in workers} == {"local gradients"}
    if backend == "jax":  # one distribution over both processes' devices
        assert {w["devices"] for w in workers} == {2}
    assert all(len(w["pinned_cores"]) == 1 for w in workers)  # each process on its task's one core


@pytest.mark.spark
@pytest.mark.timeout(900)
def test_a_killed_executor_fails_the_stage_and_the_retry_resumes_from_the_last_epoch_end(
        local_cluster_2, spark, digits, tmp_path):
    """The retry is the driver's (a new stage, new processes that join a new group as the first attempt's did):
    under the main run's backend only; each backend's group forming and training is the exactness test's."""
    from trainer.fit.checkpoints import load_checkpoint

    train, test = digits
    executors = executor_pids(local_cluster_2, spark.sparkContext.applicationId)
    assert len(executors) == 2
    reported, killed = [], threading.Event()

    def slow_epochs(record) -> None:
        # An epoch of digits trains in a fraction of a second: until the kill, every epoch's report waits
        # on the driver, so that the kill lands while both processes are still training.
        reported.append(record.epoch)
        if not killed.is_set():
            time.sleep(1.0)

    def kill_one() -> None:  # during epoch 1's report: epoch 0 is done, so the retry starts at 1 or 2
        deadline = time.monotonic() + 400
        while max(reported, default=-1) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(executors[0], signal.SIGKILL)
        killed.set()

    killer = threading.Thread(target=kill_one, daemon=True)
    killer.start()
    fitted = Trainer(digits_model(), algorithm="allreduce", num_workers=2, epochs=4, max_retries=2, verbose=False,
                     checkpoint_dir=str(tmp_path), on_update=slow_epochs).fit(train)
    killer.join()
    failures = [e for e in fitted.history.events if e.get("event") == "attempt_failed"]
    assert failures and failures[0]["retry"], fitted.history.events
    final = max(w["attempt"] for w in fitted.history.workers)
    retried = [w for w in fitted.history.workers if w["attempt"] == final]
    assert final >= 1 and len(retried) == 2
    assert {w["start_epoch"] for w in retried} == {retried[0]["start_epoch"]} and retried[0]["start_epoch"] >= 1, \
        "both processes resumed after the epochs task 0 had reported, not from scratch"
    assert [e["epoch"] for e in fitted.history.epochs] == list(range(retried[0]["start_epoch"], 4))
    assert load_checkpoint(tmp_path).completed_epochs == 4
    assert fitted.evaluate(test)["accuracy"] >= 0.88
