"""trainer.lr_schedules: the learning rate of N workers, scaled, warmed up and decayed (real Keras schedules)."""

import math

import pytest

from trainer.lr_schedules import SCALING, planned_steps, scaled_rate, warmup_cosine, worker_learning_rate


@pytest.mark.parametrize("scaling, eight", [("none", 1e-3), ("sqrt", 1e-3 * math.sqrt(8)), ("linear", 8e-3)])
def test_scaled_rate_multiplies_the_one_worker_rate(scaling, eight):
    assert scaled_rate(1e-3, 1, scaling) == pytest.approx(1e-3)
    assert scaled_rate(1e-3, 8, scaling) == pytest.approx(eight)


@pytest.mark.parametrize("base, workers, scaling, message", [
    (1e-3, 2, "cubic", "one of"),
    (1e-3, 0, "sqrt", "workers must be a positive integer"),
    (1e-3, True, "sqrt", "workers must be a positive integer"),
    (0.0, 2, "sqrt", "base learning rate"),
    (float("nan"), 2, "sqrt", "base learning rate"),
])
def test_scaled_rate_rejects_bad_input(base, workers, scaling, message):
    with pytest.raises(ValueError, match=message):
        scaled_rate(base, workers, scaling)


def test_warmup_cosine_warms_up_to_the_scaled_peak_then_decays_to_the_floor():
    schedule = warmup_cosine(1e-3, 4, 100, scaling="sqrt", warmup=0.1, decay_floor=0.1)
    rates = [float(schedule(step)) for step in range(0, 131)]
    assert rates[0] == pytest.approx(1e-3)
    assert rates[5] == pytest.approx(1.5e-3)  # halfway up the warm-up
    assert rates[10] == pytest.approx(2e-3) == max(rates)
    assert all(a >= b - 1e-12 for a, b in zip(rates[10:], rates[11:]))  # then never rises
    assert rates[100] == pytest.approx(2e-4) and rates[130] == pytest.approx(2e-4)  # a fast worker keeps a rate


def test_warmup_cosine_for_one_worker_starts_at_the_base_rate():
    schedule = warmup_cosine(2e-3, 1, 50, scaling="linear", warmup=0.0, decay_floor=0.0)
    assert float(schedule(0)) == pytest.approx(2e-3)
    assert float(schedule(25)) == pytest.approx(1e-3)
    assert float(schedule(50)) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("kwargs, message", [
    ({"steps": 0}, "steps must be a positive integer"),
    ({"warmup": 1.0}, "warmup must be a fraction"),
    ({"decay_floor": -0.1}, "decay_floor must be a fraction"),
    ({"scaling": "cubic"}, "one of"),
])
def test_warmup_cosine_rejects_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        warmup_cosine(1e-3, 2, **{"steps": 10, **kwargs})


def test_scaling_names():
    assert sorted(SCALING) == ["linear", "none", "sqrt"]


def test_planned_steps_count_one_workers_padded_shard():
    assert planned_steps(8616, 1, 32, 4) == 4 * 270
    assert planned_steps(8616, 8, 32, 4) == 4 * 34  # shards of 1,077 rows
    assert planned_steps(10, 3, 4) == 1


def test_worker_learning_rate_is_constant_without_steps():
    assert worker_learning_rate(1e-3, 4, scaling="linear") == pytest.approx(4e-3)
    schedule = worker_learning_rate(1e-3, 4, scaling="linear", steps=100)
    assert float(schedule(0)) == pytest.approx(1e-3) and float(schedule(10)) == pytest.approx(4e-3)
