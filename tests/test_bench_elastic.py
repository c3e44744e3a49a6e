"""The elastic bench's figures of a join and the MNIST job's published accuracy summary: pure functions of records."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from trainer_benchmarks.bench_elastic import join_figures
from trainer_jobs.mnist import published_figures


def _fitted(joined_at: float, joiner: str = "b:2") -> SimpleNamespace:
    history = SimpleNamespace(
        membership=[{"event": "joined", "time": 0.0, "worker": "a:1"},
                    {"event": "joined", "time": joined_at, "worker": joiner}],
        workers=[{"epoch": 0, "chunk": 0, "member": "a:1"}, {"epoch": 0, "chunk": 1, "member": "a:1"},
                 {"epoch": 0, "chunk": 2, "member": joiner, "first_in_process": True, "model_built": joined_at,
                  "first_step_end": joined_at + 0.25}])
    return SimpleNamespace(history=history)


def test_join_figures_compare_the_others_rate_while_the_joiner_starts_with_their_rate_before():
    # chunks 0 and 1 commit every second from t=1; the join is asked at t=5, the joiner is ready at t=9, its first
    # step is done at 9.25 and its chunk 2 commits first at t=9.5. While it starts the others commit at half their
    # rate (one of the two stops).
    before = [(float(t), 0, chunk) for t in range(1, 5) for chunk in (0, 1)]
    starting = [(float(t), 0, 0) for t in range(5, 9)]
    after = [(9.5, 0, 2), (10.0, 0, 0)]
    figures = join_figures(_fitted(9.0), 5.0, before + starting + after)
    assert figures["others_rate"] == pytest.approx((4 / 4) / (8 / 4))
    assert figures["first_step_s"] == pytest.approx(0.25)
    assert figures["first_average_s"] == pytest.approx(0.25)
    assert figures["period_s"] == pytest.approx(1.0)


def test_join_figures_without_a_join_are_empty():
    fitted = _fitted(1.0)
    assert join_figures(fitted, 5.0, [(1.0, 0, 0), (2.0, 0, 0)]) == {
        "others_rate": None, "first_step_s": None, "first_average_s": None, "period_s": None}


def test_published_figures_summarize_each_worker_count_over_its_runs():
    rows = [{"mode": "plain keras", "workers": 0, "algorithm": "none", "seed": s, "epoch_time_s": 5.0,
             "metric_value": v, "speedup": None, "updates": 0} for s, v in enumerate((0.96, 0.98))]
    rows.append({"mode": "elastic", "workers": 3, "algorithm": "downpour", "seed": 0, "epoch_time_s": 6.0,
                 "metric_value": 0.97})
    figures = published_figures(rows)
    assert [r["seed"] for r in figures["rows"]] == [0, 1, 0] and "updates" not in figures["rows"][0]
    assert figures["rows"][0]["speedup"] is None and figures["rows"][2]["efficiency"] is None
    keras, elastic = figures["accuracy"]
    assert (keras["workers"], keras["runs"], keras["min"], keras["max"]) == (0, 2, 0.96, 0.98)
    assert keras["mean"] == pytest.approx(0.97) and keras["sd"] == pytest.approx(0.0141421, abs=1e-6)
    assert (elastic["runs"], elastic["sd"]) == (1, 0.0)
