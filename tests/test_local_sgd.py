"""Periodic averaging over the all-reduce group (``AllReduce(period=H)``, ``LocalSGD``): the algorithm, the average,
the period sized by time, and the collective loop under each Keras backend.

The pure parts run without Spark or a backend. The loop runs as two real collective processes on the backend's
own engine with a real parameter server (no Spark), in `make test`'s backend runs (TensorFlow in the main run,
JAX and torch beside it): the state process 0 reports equals two plain Keras replicas that take the same local
steps and average their deltas, in bfloat16 with the rounding carried, every 2 steps and at every epoch end.
A fit on Spark with ``algorithm="localsgd"`` (the time-sized period) is in tests/test_defaults.py's battery.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from collective_processes import run_processes
from conftest import digits_model
from trainer.algorithms import ALGORITHMS, AlgorithmConfigError, AllReduce, LocalSGD, get_algorithm
from trainer.algorithms.cadence import PeriodCadence, choose_period
from trainer.runtime.collective.averaging import Averager
from trainer.runtime.collective.loop import epoch_order


# --------------------------------------------------------------------------- the algorithm and the average, pure


def test_localsgd_is_allreduce_with_a_time_sized_period_and_bfloat16_on_the_wire():
    algorithm = get_algorithm("localsgd")
    assert ALGORITHMS["localsgd"] is LocalSGD and isinstance(algorithm, AllReduce)
    assert algorithm.fit_kind == "collective"
    assert (algorithm.period, algorithm.max_period, algorithm.wire, algorithm.lr_scaling, algorithm.outer_momentum) \
        == ("auto", 16, "bf16", "linear", 0.5)
    assert algorithm.periodic and not AllReduce().periodic
    assert algorithm.describe() == "localsgd(averaged every auto <= 16 steps, bf16, outer momentum 0.5)"
    assert AllReduce(period=8).describe() == "allreduce(averaged every 8 steps)"
    assert get_algorithm("localsgd", period=4, wire="fp32", outer_momentum=0).describe() == \
        "localsgd(averaged every 4 steps)"
    assert AllReduce().cadence() == PeriodCadence(period=1, max_period=16, wire="fp32", outer_momentum=0.0)
    assert not AllReduce().cadence().periodic and LocalSGD().cadence().periodic


@pytest.mark.parametrize("kwargs, message", [
    ({"period": 0}, "period is an integer >= 1 or 'auto'. Received: period=0"),
    ({"period": "8"}, "Received: period='8'"),
    ({"max_period": 0}, "max_period is an integer >= 1. Received: max_period=0"),
    ({"wire": "fp16"}, "wire is one of 'fp32', 'bf16'. Received: wire='fp16'"),
    ({"period": 1, "wire": "bf16"}, "wire='bf16' applies to periodic averaging"),
    ({"period": 4, "outer_momentum": 1.0}, "outer_momentum is a number in \\[0, 1\\). Received: outer_momentum=1.0"),
    ({"period": 4, "outer_momentum": "0.5"}, "Received: outer_momentum='0.5'"),
    ({"period": 1, "outer_momentum": 0.5}, "outer_momentum=0.5 applies to periodic averaging"),
])
def test_a_cadence_that_cannot_work_is_refused_with_the_fix(kwargs, message):
    with pytest.raises(AlgorithmConfigError, match=message):
        AllReduce(**kwargs)


def test_the_average_of_float32_deltas_is_the_mean_of_the_weights():
    anchor = np.array([1.0, -2.0, 0.5], np.float32)
    weights = [anchor + np.array([0.1, 0.2, -0.3], np.float32), anchor + np.array([0.3, -0.2, 0.1], np.float32)]
    averagers = [Averager(anchor, 2, "fp32") for _ in weights]
    sent = [w - anchor for w in weights]
    out = [a.average(w, lambda _: sent[0] + sent[1]) for a, w in zip(averagers, weights)]
    np.testing.assert_allclose(out[0], (weights[0] + weights[1]) / 2, rtol=1e-6)
    np.testing.assert_array_equal(out[0], out[1])
    assert averagers[0].bytes_per_average == 12 and Averager(anchor, 2, "bf16").bytes_per_average == 6


def test_bfloat16_deltas_carry_their_rounding_into_the_next_average():
    """One process alone (the sum is its own delta): in bfloat16 each average rounds the delta, and what was
    dropped goes with the next one, so after many averages the weights are where float32 ones are."""
    rng = np.random.default_rng(0)
    anchor = rng.normal(size=1000).astype(np.float32)
    steps = [rng.normal(scale=1e-3, size=1000).astype(np.float32) for _ in range(50)]
    bf16, fp32 = Averager(anchor, 1, "bf16"), Averager(anchor, 1, "fp32")
    sent_dtypes = set()

    def sums(sent):
        sent_dtypes.add(sent.dtype)
        return sent

    for step in steps:
        bf16.average(bf16.anchor + step, sums)
        fp32.average(fp32.anchor + step, lambda sent: sent)
    assert sent_dtypes == {np.dtype(ml_dtypes.bfloat16)}
    drift = np.abs(bf16.anchor - fp32.anchor).max()
    assert drift < 1e-4  # within one delta's rounding: 50 rounded deltas without the carry would drift further
    assert np.abs(bf16.residual).max() < 1e-5


def test_an_outer_momentum_moves_the_trained_weights_by_nesterov_steps_over_the_averages():
    """Momentum m: v = m v + d, the trained weights move by d + m v; the untrained ones (a statistic) by d."""
    anchor = np.zeros(2, np.float32)
    averager = Averager(anchor, 2, "fp32", momentum=0.5, trained=np.array([True, False]))
    deltas = [np.array([2.0, 2.0], np.float32), np.array([4.0, 4.0], np.float32)]  # the group's sums
    first = averager.average(averager.anchor, lambda _: deltas[0]).copy()  # d = 1: v = 1, moves 1.5
    np.testing.assert_allclose(first, [1.5, 1.0])
    second = averager.average(averager.anchor, lambda _: deltas[1])  # d = 2: v = 2.5, moves 3.25
    np.testing.assert_allclose(second, [4.75, 3.0])


@pytest.mark.parametrize("step_ms, average_ms, expected", [
    (30.0, 1.0, 1),      # an average under 5 % of one step: every step
    (30.0, 6.0, 4),      # 6 ms against 5 % of 30 ms = 1.5 ms: every 4 steps
    (1.5, 40.0, 16),     # a GPU step on a slow link: the bound
    (0.0, 5.0, 16),      # no step time measured: the bound
])
def test_the_period_is_the_smallest_that_keeps_the_average_under_five_percent(step_ms, average_ms, expected):
    assert choose_period(step_ms / 1000, average_ms / 1000, max_period=16) == expected
    assert choose_period(step_ms / 1000, average_ms / 1000, max_period=3) == min(expected, 3)


# --------------------------------------------------------------------------- the loop, per backend, no Spark


def _reference(start, shards, rate: float, batch_size: int, epochs: int, seed: int, period: int, momentum: float):
    """Two plain Keras replicas at `rate`, each taking its shard's batches in `epoch_order`, their float32 weights
    averaged every `period` steps and at every epoch end through bfloat16 deltas with the rounding carried (the
    sum of two bfloat16 deltas rounded once, as the engines add them), the averaged delta applied as a Nesterov
    step with `momentum`."""
    replicas = []
    for _ in shards:
        model = digits_model(rate)
        model.set_weights(start)
        replicas.append(model)
    sizes = [w.size for w in start]
    flat = lambda model: np.concatenate([w.reshape(-1) for w in model.get_weights()]).astype(np.float32)
    anchor = flat(replicas[0])
    residuals = [np.zeros_like(anchor) for _ in shards]
    velocity = np.zeros_like(anchor)

    def average():
        nonlocal anchor, velocity
        sent = []
        for i, model in enumerate(replicas):
            delta = flat(model) - anchor + residuals[i]
            rounded = delta.astype(ml_dtypes.bfloat16)
            residuals[i] = delta - rounded.astype(np.float32)
            sent.append(rounded)
        total = (sent[0].astype(np.float32) + sent[1].astype(np.float32)).astype(ml_dtypes.bfloat16)
        delta = total.astype(np.float32) / len(shards)
        velocity = momentum * velocity + delta
        anchor = anchor + delta + momentum * velocity
        pieces = np.split(anchor, np.cumsum(sizes)[:-1])
        for model in replicas:
            model.set_weights([p.reshape(w.shape) for p, w in zip(pieces, start)])

    rows = len(shards[0][0])
    since = 0
    for epoch in range(epochs):
        order = epoch_order(rows, seed, epoch)
        for begin in range(0, rows, batch_size):
            for model, (x, y) in zip(replicas, shards):
                batch = order[begin:begin + batch_size]
                model.train_on_batch(x[batch], y[batch])
            since += 1
            if since == period:
                average()
                since = 0
        if since:
            average()
            since = 0
    return replicas[0]


@pytest.mark.backend
@pytest.mark.timeout(600)
def test_two_collective_processes_average_their_replicas_every_period_in_bfloat16():
    """Two collective processes, ``AllReduce(period=2, wire="bf16", outer_momentum=0.5)``, 2 epochs of 3 steps:
    process 0's reported weights equal the two-replica reference's (``_reference``) after 6 local steps and 4
    averages (every 2 steps and at each epoch end, each a Nesterov step), at twice the compiled rate (linear
    scaling for 2 workers); its optimizer counted its own 6 steps. The jobs say the processes share a GPU, as
    ``make bench-gpu``'s do on one: on CPUs that changes nothing but the group's devices under JAX (its CPUs, as
    here anyway), so the weights must still be the reference's."""
    algorithm = AllReduce(period=2, wire="bf16", outer_momentum=0.5)
    rng = np.random.default_rng(1)
    x = rng.random((96, 64), dtype=np.float32)
    y = rng.integers(0, 10, 96).astype(np.int32)
    shards = [(x[i::2], y[i::2]) for i in range(2)]  # 2 x 48 rows: 3 steps of 16 an epoch
    rows = len(shards[0][0])
    model = digits_model(0.005)
    model.optimizer.build(model.trainable_variables)
    start = [w.copy() for w in model.get_weights()]
    records, center = run_processes(model, shards, algorithm, batch_size=16, epochs=2, seed=5, shared_gpu=True)
    reference = _reference(start, shards, 0.005 * 2, 16, 2, seed=5, period=2, momentum=0.5)
    weights = len(reference.weights)
    for got, want in zip(center[:weights], reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    state = dict(zip([v.path for v in model.optimizer.variables], center[weights:]))
    steps = 2 * math.ceil(rows / 16)
    assert int(state[model.optimizer.iterations.path]) == steps
    assert float(state[model.optimizer._learning_rate.path]) == pytest.approx(0.005)  # the compiled rate kept
    assert {r["train_step"] for r in records} == {"the model's own, replicas averaged periodically"}
    assert [r["shared_gpu"] for r in records] == [True, True]
    assert [r["averages"] for r in records] == [4, 4]
    assert {(r["period"], r["wire"], r["outer_momentum"], r["average_bytes"]) for r in records} == {
        (2, "bf16", 0.5, 2 * model.count_params())}
    # the ring's bytes per step are the averages' amortized over the steps (2 (N - 1) / N = 1 at N = 2)
    assert [r["ring_bytes_per_step"] for r in records] == [pytest.approx(2 * model.count_params() * 4 / steps)] * 2
    # the logs reported are both processes' own, averaged: a finite loss for each epoch
    assert all(math.isfinite(e["logs"]["loss"]) for e in records[0]["epochs"])


# --------------------------------------------------------------------------- the default's choice, pure


@pytest.mark.parametrize("facts, algorithm, why", [
    (dict(workers=1, hosts=3), "downpour", "one worker"),
    (dict(workers=3, hosts=4), "localsgd", "3 workers on 4 hosts"),
    (dict(workers=2, gpus_per_worker=1, hosts=1), "localsgd", "2 workers on GPUs"),
    (dict(workers=2, hosts=1), "downpour", "2 CPU workers on one host"),
    (dict(workers=2, hosts=None), "downpour", "2 CPU workers on hosts not known"),
    (dict(workers=4, hosts=4, ps_options=("compression",)), "downpour", "compression asked for the parameter server"),
])
def test_with_no_algorithm_named_the_fit_chooses_from_what_it_runs_on(facts, algorithm, why):
    from trainer.algorithms.choice import FitFacts, choose_algorithm

    choice = choose_algorithm(FitFacts(**facts))
    assert choice.algorithm.name == algorithm and why in choice.reason
    assert choice.line().startswith(f"algorithm: {choice.algorithm.describe()} (chosen: ")
    assert choice.record()["facts"]["workers"] == facts["workers"]


def test_the_trainer_keeps_auto_across_changed_options_and_a_named_algorithm_is_not_chosen():
    from trainer import DOWNPOUR, Trainer

    trainer = Trainer(digits_model, num_workers=2)
    assert trainer.algorithm == DOWNPOUR() and trainer.options.algorithm_choice is not None  # no hosts known yet
    trainer.epochs = 3  # the options are checked again: still chosen per fit
    assert trainer.options.algorithm_choice is not None and trainer.options.given("algorithm") == "auto"
    assert trainer.options.facts(hosts=2).hosts == 2
    named = Trainer(digits_model, num_workers=2, algorithm="downpour")
    assert named.options.algorithm_choice is None and named.options.given("algorithm") == DOWNPOUR()
    compressed = Trainer(digits_model, num_workers=2, compression="bf16")
    assert compressed.options.facts(hosts=3).ps_options == ("compression",)
    plain = Trainer(digits_model, num_workers=2, compression="none")  # as the jobs pass it: no compression
    assert plain.options.facts(hosts=3).ps_options == ()


def test_the_measured_period_joins_the_choice_in_the_history():
    from trainer.algorithms.choice import FitFacts, choose_algorithm, measured_choice, measured_line

    choice = choose_algorithm(FitFacts(workers=2, hosts=2))
    records = [{"worker": 1, "period": 8}, {"worker": 0, "period": 8, "wire": "bf16", "probe_step_ms": 31.0,
                                            "probe_average_ms": 12.0, "average_bytes": 2_000_000, "rows": 5}]
    measured = measured_choice(choice, records).record()["measured"]
    assert measured == {"period": 8, "wire": "bf16", "probe_step_ms": 31.0, "probe_average_ms": 12.0,
                        "average_bytes": 2_000_000}
    assert measured_line(measured) == "averaged every 8 steps, bf16: one average 12.0 ms, a step 31.0 ms"


def test_local_sgd_retries_on_the_workers_left_and_a_per_step_all_reduce_waits_for_all():
    from trainer import Trainer
    from trainer.fit.kinds import CollectiveFit

    local = Trainer(digits_model, num_workers=3, algorithm="localsgd", min_workers=2)
    assert CollectiveFit(local, local.algorithm).retry_policy().min_workers == 2
    every_step = Trainer(digits_model, num_workers=3, algorithm="allreduce")
    assert CollectiveFit(every_step, every_step.algorithm).retry_policy().min_workers is None
