"""When a worker exchanges (trainer.algorithms.cadence) and which cores a task claims (trainer.runtime.cores): pure
logic and real processes, no Spark."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from trainer.algorithms import ADAG, DOWNPOUR, DynSGD, SyncAveraging, get_algorithm
from trainer.algorithms.base import AlgorithmConfigError
from trainer.runtime import cores
from trainer.algorithms.cadence import MIN_WINDOW, WindowCadence, max_auto_window


def test_a_fixed_window_is_due_every_window_batches_and_never_moves():
    cadence = WindowCadence(5)
    assert [cadence.due(n) for n in (4, 5, 6)] == [False, True, True]
    cadence.observe(5, 0.001, 10.0)  # an exchange far dearer than the steps: a fixed window stays
    assert cadence.window == 5 and not WindowCadence(None).due(10**6)  # None: only at epoch ends


def test_an_automatic_window_keeps_the_exchange_near_five_percent_of_the_time():
    cadence = WindowCadence("auto", epoch_batches=100_000, workers=1)
    assert cadence.window == MIN_WINDOW  # nothing measured yet
    cadence.observe(4, 5.0, 0.010)  # the first window holds the compilation: not a step time
    assert cadence.window == MIN_WINDOW and cadence.step_s is None
    cadence.observe(4, 4 * 0.002, 0.010)  # a GPU: 2 ms steps, 10 ms exchanges -> 100 batches
    assert cadence.window == 100
    cadence.observe(100, 100 * 0.030, 0.010)  # steps of a CPU: the smoothed step is 16 ms -> 13 batches
    assert cadence.window == 13
    for _ in range(10):
        cadence.observe(cadence.window, cadence.window * 0.030, 0.010)
    assert cadence.window == 7  # 10 ms is 5 % of 7 steps of 30 ms
    for _ in range(10):
        cadence.observe(cadence.window, cadence.window * 0.300, 0.010)
    assert cadence.window == MIN_WINDOW  # steps of 300 ms: the smallest window
    assert "auto" in cadence.describe()


def test_the_automatic_window_is_bounded_by_the_other_workers_staleness():
    assert [max_auto_window(10_000, n) for n in (1, 2, 3, 4, 8)] == [5_000, 5, 2, 1, 1]
    assert max_auto_window(8, 2) == 4 and max_auto_window(60, 1) == 30  # never more than half an epoch
    cadence = WindowCadence("auto", epoch_batches=10_000, workers=8)
    cadence.observe(1, 1.0, 1.0)
    cadence.observe(1, 0.001, 1.0)
    assert cadence.window == 1 and cadence.due(1)


def test_local_sgd_s_window_warms_up_at_one_step_then_grows_to_its_own_bound_not_the_staleness_one():
    cadence = WindowCadence("auto", epoch_batches=10_000, workers=8, bound=16, warmup=3)
    for _ in range(3):  # rounds carry no staleness: 8 workers still reach the bound, after the warm-up
        assert cadence.window == 1
        cadence.observe(1, 0.01, 1.0)
    for _ in range(3):
        cadence.observe(cadence.window, 0.01 * cadence.window, 1.0)
    assert cadence.window == 16 and WindowCadence(8, warmup=3).window == 8  # a fixed window has no warm-up
    joiner = WindowCadence("auto", bound=16, warmup=3)
    joiner.fit_at(2)
    assert joiner.window == 1
    joiner.fit_at(3)  # a worker that joins a fit past its warm-up starts at the first automatic window
    assert joiner.window == 4 and not joiner.warmup


def test_a_worker_joining_an_asynchronous_fit_exchanges_after_its_first_step_then_at_the_fit_s_window():
    first = WindowCadence("auto", epoch_batches=10_000, workers=3)
    first.fit_at(0)  # the fit's own first workers: nothing to catch up with
    assert first.window == 2 and not first.due(1)
    joiner = WindowCadence("auto", epoch_batches=10_000, workers=3)
    joiner.fit_at(40)
    assert joiner.due(1)  # its first step, the compile with it, then the others' average
    joiner.observe(1, 5.0, 0.01)  # that step is not a step time
    assert joiner.window == 2 and joiner.step_s is None and not joiner.due(1)
    fixed = WindowCadence(5)
    fixed.fit_at(40)
    assert fixed.window == 5  # a window the user set is theirs


def test_auto_windows_belong_to_the_algorithms_whose_math_ignores_the_window():
    assert DOWNPOUR().window == "auto" and get_algorithm("downpour").describe() == "downpour(auto window)"
    assert DynSGD(window="auto").window == "auto"
    for make in (lambda: ADAG(window="auto"), lambda: SyncAveraging(every="auto"), lambda: DOWNPOUR(window="5")):
        with pytest.raises(AlgorithmConfigError, match="window"):
            make()


def _claim(count: int, hint: int, queue, hold, release: bool = False) -> None:
    queue.put(cores.choose_cores(count, hint))
    if release:  # the task ended; its Python worker stays, idle, as Spark keeps it
        cores.release_cores()
        queue.put(sorted(os.sched_getaffinity(0)))
    hold.wait(60)


@pytest.mark.skipif(not cores.enabled() or len(os.sched_getaffinity(0)) < 2, reason="needs CPU affinity, 2 cores")
def test_tasks_claim_different_cores_and_share_them_once_all_are_claimed(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # a lock directory of this test's own
    allowed = sorted(os.sched_getaffinity(0))
    ctx = multiprocessing.get_context("spawn")
    queue, hold = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_claim, args=(1, 0, queue, hold)) for _ in range(len(allowed) + 1)]
    try:
        for proc in procs[:-1]:
            proc.start()
        first = sorted(queue.get(timeout=60)[0] for _ in allowed)
        assert first == allowed  # every task its own core, although every hint was 0
        procs[-1].start()
        extra = queue.get(timeout=60)
        assert len(extra) == 1 and extra[0] in allowed  # all claimed: it shares one, still a single core
    finally:
        hold.set()
        for proc in procs:
            proc.join(30)


@pytest.mark.skipif(not cores.enabled() or len(os.sched_getaffinity(0)) < 2, reason="needs CPU affinity, 2 cores")
def test_an_idle_worker_holds_no_core(tmp_path, monkeypatch):
    """A Python worker whose task ended gives its core back: the next task with the same partition index takes
    that core instead of stepping around it onto a core a sibling task may be using."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    allowed = sorted(os.sched_getaffinity(0))
    ctx = multiprocessing.get_context("spawn")
    queue, hold = ctx.Queue(), ctx.Event()
    idle = ctx.Process(target=_claim, args=(1, 0, queue, hold, True))
    later = ctx.Process(target=_claim, args=(1, 0, queue, hold))
    try:
        idle.start()
        first = queue.get(timeout=60)
        assert first == [allowed[0]] and queue.get(timeout=60) == allowed  # released, and on every core again
        later.start()
        assert queue.get(timeout=60) == first
    finally:
        hold.set()
        for proc in (idle, later):
            proc.join(30)


def test_affinity_can_be_switched_off(monkeypatch):
    monkeypatch.setenv(cores.ENV, "off")
    assert cores.choose_cores(1) is None
