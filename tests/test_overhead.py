"""The rows of `benchmarks/profile_overhead.py` (pure functions over the set-ups' results; the runs themselves train
real models and belong to the benchmark, not to the tests)."""

from __future__ import annotations

import pytest

from trainer_benchmarks.profile_overhead import add_ratios, single_row


def test_single_row_of_concurrent_processes_averages_their_steady_epochs():
    results = [{"rows": 500, "epoch_times": [9.0, 2.0, 2.0], "cores_used": 1.0},
               {"rows": 500, "epoch_times": [9.0, 3.0, 3.0], "cores_used": 0.8}]
    row = single_row(results, "feed", 2)
    assert row["setup"] == "feed x2" and row["workers"] == 2
    assert row["epoch_s"] == pytest.approx(2.5)  # the first epoch left out
    assert row["samples_s_per_worker"] == pytest.approx(200.0)
    assert row["cores_used"] == pytest.approx(0.9)
    alone = single_row(results[:1], "plain", 1)
    assert alone["setup"] == "plain" and alone["workers"] == 0 and alone["samples_s_per_worker"] == 250.0


def test_workers_are_compared_with_plain_keras_and_with_as_many_feeds_at_once():
    rows = [{"setup": "plain", "workers": 0, "samples_s_per_worker": 100.0},
            {"setup": "feed", "workers": 0, "samples_s_per_worker": 98.0},
            {"setup": "feed+callback", "workers": 0, "samples_s_per_worker": 50.0},
            {"setup": "feed x2", "workers": 2, "samples_s_per_worker": 90.0},
            {"setup": "workers=1", "workers": 1, "samples_s_per_worker": 88.2},
            {"setup": "workers=2 overlap", "workers": 2, "samples_s_per_worker": 81.0},
            {"setup": "workers=3", "workers": 3, "samples_s_per_worker": 60.0}]
    add_ratios(rows)
    by = {r["setup"]: r for r in rows}
    assert by["workers=1"]["vs_plain"] == pytest.approx(0.882)
    assert by["workers=1"]["vs_feed_alongside"] == pytest.approx(0.9)  # against feed, not feed+callback
    assert by["workers=2 overlap"]["vs_feed_alongside"] == pytest.approx(0.9)  # against feed x2
    assert "vs_feed_alongside" not in by["workers=3"]  # no feed x3 in the run
    assert "vs_feed_alongside" not in by["feed x2"]
