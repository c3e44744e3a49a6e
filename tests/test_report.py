"""Results files, speed-up arithmetic, Markdown tables (empty columns left out), the speed-up and timeline plots and
MAPE."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

from trainer_jobs.support.report import (COLUMNS, against_plain_keras, is_empty, mape, markdown_row, markdown_table, metric_pivot,
                                         plot_speedup, speedup_figure, speedup_rows, write_results)
from trainer_jobs.support.timeline import plot_timelines, throughput

pytestmark = pytest.mark.timeout(60)


def _rows():
    # seed 000 Table 1 times (LSTM/GRU, 1/2/4 executors) as a realistic example
    return [
        {"model": "lstm", "workers": 1, "time_s": 381.8, "epoch_time_s": 95.45, "metric_name": "mape",
         "metric_value": 3.80, "updates": 1000, "bytes": 12_345_678, "timing_valid": True},
        {"model": "lstm", "workers": 2, "time_s": 223.0, "epoch_time_s": 55.75, "metric_name": "mape",
         "metric_value": 4.64, "updates": 1000, "bytes": 12_345_678, "timing_valid": True},
        {"model": "lstm", "workers": 4, "time_s": 151.9, "epoch_time_s": 37.98, "metric_name": "mape",
         "metric_value": 5.25, "updates": 1000, "bytes": 12_345_678, "timing_valid": False},
        {"model": "gru", "workers": 1, "time_s": 341.3, "epoch_time_s": 85.3, "metric_name": "mape",
         "metric_value": 3.38, "updates": 900, "bytes": 9_000_000, "timing_valid": True},
        {"model": "gru", "workers": 2, "time_s": 188.9, "epoch_time_s": 47.2, "metric_name": "mape",
         "metric_value": 3.37, "updates": 900, "bytes": 9_000_000, "timing_valid": True, "algorithm": "adag"},
        {"model": "gru", "workers": 4, "time_s": 127.2, "epoch_time_s": 31.8, "metric_name": "mape",
         "metric_value": float("nan"), "updates": 900, "bytes": 9_000_000, "timing_valid": False},
    ]


def test_speedup_and_efficiency_arithmetic():
    rows = speedup_rows(_rows())
    by = {(r["model"], r["workers"]): r for r in rows}
    assert by["lstm", 1]["speedup"] == 1.0 and by["lstm", 1]["efficiency"] == 1.0
    assert by["lstm", 4]["speedup"] == pytest.approx(381.8 / 151.9)
    assert by["lstm", 4]["efficiency"] == pytest.approx(381.8 / 151.9 / 4)
    assert by["gru", 2]["speedup"] == pytest.approx(341.3 / 188.9)
    assert by["gru", 2]["efficiency"] == pytest.approx(341.3 / 188.9 / 2)
    assert "speedup" not in _rows()[0]  # inputs are not modified


def test_speedup_groups_by_run_and_averages_repeats():
    rows = [
        {"run": "a", "model": "m", "workers": 1, "time_s": 10.0},
        {"run": "a", "model": "m", "workers": 1, "time_s": 12.0},
        {"run": "a", "model": "m", "workers": 2, "time_s": 5.5},
        {"run": "b", "model": "m", "workers": 2, "time_s": 5.0},  # no 1-worker row in run b
        {"run": "a", "model": "m", "workers": 3, "time_s": None},
    ]
    out = speedup_rows(rows)
    assert out[2]["speedup"] == pytest.approx(2.0) and out[2]["efficiency"] == pytest.approx(1.0)
    assert out[3]["speedup"] is None and out[3]["efficiency"] is None
    assert out[4]["speedup"] is None


def test_write_results_files_are_parseable(tmp_path):
    paths = write_results(_rows(), tmp_path / "out", "forecast", metadata={"spark_master": "local[2]"})
    assert set(paths) == {"json", "csv", "md"}
    data = json.loads(paths["json"].read_text())  # strict JSON: NaN became null
    meta = data["metadata"]
    assert meta["cores"] >= 1 and meta["usable_cores"] >= 1 and meta["host"]
    assert meta["versions"]["numpy"] == np.__version__
    assert "pyspark" in meta["versions"] and meta["timestamp"].endswith("+00:00")
    assert meta["spark_master"] == "local[2]"
    assert len(data["rows"]) == 6 and data["rows"][5]["metric_value"] is None
    assert data["rows"][2]["speedup"] == pytest.approx(381.8 / 151.9)

    with open(paths["csv"], newline="") as f:
        reader = csv.DictReader(f)
        table = list(reader)
    assert reader.fieldnames[: len(COLUMNS)] == COLUMNS and reader.fieldnames[-1] == "algorithm"
    assert len(table) == 6
    assert table[2]["model"] == "lstm" and int(table[2]["workers"]) == 4
    assert float(table[2]["efficiency"]) == pytest.approx(381.8 / 151.9 / 4)
    assert table[2]["timing_valid"] == "False" and table[0]["algorithm"] == ""
    assert table[5]["metric_value"] == ""

    md = paths["md"].read_text()
    assert md.startswith("# forecast")
    assert "spark_master: local[2]" in md
    assert "| model | workers | time_s |" in md
    assert "| lstm | 4 | 151.9 | 37.98 | 2.51 | 0.6284 | mape | 5.25 | 1000 | 12,345,678 | no |" in md


def test_markdown_table_columns_and_alignment():
    rows = [{"model": "cnn", "workers": 2, "acc": 0.98971, "note": "a|b"}, {"model": "mlp", "workers": 1}]
    text = markdown_table(rows, ["model", "workers", "acc", "note"])
    lines = text.splitlines()
    assert lines[0] == "| model | workers | acc | note |"
    assert lines[1] == "|---|---:|---:|---|"
    assert lines[2] == "| cnn | 2 | 0.9897 | a\\|b |"
    assert lines[3] == "| mlp | 1 |  |  |"
    assert markdown_table(rows).splitlines()[0] == "| model | workers | acc | note |"


def _header(table: str) -> list[str]:
    return [c.strip() for c in table.splitlines()[0].strip("|").split("|")]


def test_markdown_table_leaves_out_columns_empty_in_every_row():
    # A --no-baseline run whose target was never reached: None, NaN, "" or no key at all in every row.
    rows = [
        {"mode": "distributed", "workers": 1, "speedup": 1.0, "throughput_vs_keras": None,
         "time_to_target_s": float("nan"), "note": "", "bytes": 10},
        {"mode": "distributed", "workers": 2, "speedup": 1.6, "throughput_vs_keras": None,
         "time_to_target_s": np.float64("nan"), "note": "", "bytes": None},
    ]
    asked = ["mode", "workers", "speedup", "throughput_vs_keras", "time_to_target_s", "target_steps", "note", "bytes"]
    text = markdown_table(rows, asked)
    assert _header(text) == ["mode", "workers", "speedup", "bytes"]  # asked for or not, empty columns go
    assert text.splitlines()[1] == "|---|---:|---:|---:|"
    assert text.splitlines()[3] == "| distributed | 2 | 1.60 |  |"  # one empty cell keeps its column
    assert _header(markdown_table(rows)) == ["workers", "speedup", "bytes", "mode"]  # COLUMNS first, then extras
    # a column with a value in one row only stays; its NaN cells still read nan
    rows[0]["time_to_target_s"] = 12.5
    assert "time_to_target_s" in _header(markdown_table(rows, asked))
    assert markdown_table(rows, asked).splitlines()[3] == "| distributed | 2 | 1.60 | nan |  |"
    # nothing to show at all, and no rows at all
    assert markdown_table([{"a": None, "b": ""}], ["a", "b"]) == ""
    assert markdown_table([], ["a", "b"]).splitlines()[0] == "| a | b |"


def test_is_empty_and_markdown_row_keeps_every_column():
    assert [is_empty(v) for v in (None, "", float("nan"), np.float32("nan"))] == [True] * 4
    assert not any(is_empty(v) for v in (0, 0.0, False, " ", "0", [], float("inf")))
    # printed under a header of all the columns, as the benchmarks stream their rows
    assert markdown_row({"a": 1, "c": 0.5}, ["a", "b", "c"]) == "| 1 |  | 0.5000 |"
    assert markdown_row({"loss": 0.00046765}, ["loss"]) == "| 0.0004677 |"  # a small loss keeps its digits


def test_written_markdown_leaves_out_empty_columns_and_csv_json_keep_them(tmp_path):
    rows = [dict(r, target_speedup=None, time_to_target_s=float("nan")) for r in _rows()]
    paths = write_results(rows, tmp_path, "forecast")
    md_header = next(line for line in paths["md"].read_text().splitlines() if line.startswith("| model |"))
    assert "target_speedup" not in md_header and "time_to_target_s" not in md_header
    with open(paths["csv"], newline="") as f:
        reader = csv.DictReader(f)
        table = list(reader)
    assert {"target_speedup", "time_to_target_s"} <= set(reader.fieldnames)
    assert table[0]["target_speedup"] == "" and table[0]["time_to_target_s"] == ""
    assert all("target_speedup" in r for r in json.loads(paths["json"].read_text())["rows"])


def test_plot_speedup_writes_png(tmp_path):
    out = plot_speedup(_rows(), tmp_path / "plots" / "speedup.png", "mape", title="forecast")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    with pytest.raises(ValueError, match="no result rows"):
        plot_speedup([], tmp_path / "empty.png", "mape")


def test_the_plot_labels_plain_keras_as_plain_keras_and_shows_the_spread_over_seeds():
    rows = [{"model": "cnn", "mode": "plain keras (1 thread)", "workers": 0, "metric_name": "accuracy",
             "metric_value": v, "time_s": 30.0} for v in (0.985, 0.988)]
    rows += [{"model": "cnn", "mode": "distributed", "workers": n, "metric_name": "accuracy", "metric_value": v,
              "time_s": 30.0 / n, "seed": seed} for n in (1, 2) for seed, v in enumerate((0.984, 0.989))]
    speed, metric = speedup_figure(rows, "accuracy").axes
    for ax in (speed, metric):
        assert list(ax.get_xticks()) == [1, 2], "plain Keras is not a worker count"
    assert metric.get_legend_handles_labels()[1] == ["cnn", "plain Keras, 2 runs"]
    spreads = [line.get_ydata() for line in metric.get_lines() if line.get_linewidth() == 4]
    assert [tuple(map(float, y)) for y in spreads] == [(0.984, 0.989)] * 2  # one bar per worker count


def test_mape_percent_in_original_units():
    assert mape([100.0, 200.0], [110.0, 180.0]) == pytest.approx(10.0)
    assert mape(np.array([[4.0], [5.0]]), np.array([5.0, 5.0])) == pytest.approx(12.5)  # (n,1) vs (n,)
    assert math.isclose(mape([-2.0], [-1.0]), 50.0)
    with pytest.raises(ValueError, match="zero value"):
        mape([0.0, 1.0], [0.1, 1.0])
    with pytest.raises(ValueError, match="shape"):
        mape([1.0, 2.0, 3.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="finite"):
        mape([1.0], [float("nan")])


def test_metric_pivot_shows_the_mean_and_spread_of_repeated_runs():
    rows = [
        {"model": "lstm", "workers": 0, "metric_value": 2.5, "timing_valid": True},
        {"model": "lstm", "workers": 1, "metric_value": 2.0, "timing_valid": True},
        {"model": "lstm", "workers": 1, "metric_value": 3.0, "timing_valid": True},
        {"model": "lstm", "workers": 8, "metric_value": 4.0, "timing_valid": False},
        {"model": "gru", "workers": 1, "metric_value": 0.9912, "timing_valid": True},
    ]
    text = metric_pivot(rows, "MAPE (%)")
    assert text.startswith("MAPE (%) on the test set:")
    header, _, lstm, gru = text.splitlines()[2:]
    assert [c.strip() for c in header.strip("|").split("|")] == ["model", "plain Keras", "1 worker", "8 workers"]
    assert [c.strip() for c in lstm.strip("|").split("|")] == ["lstm", "2.50", "2.50 ± 0.71 (2 runs)", "4.00 *"]
    assert [c.strip() for c in gru.strip("|").split("|")] == ["gru", "", "0.9912", ""]


def test_each_worker_count_is_told_whether_it_reaches_plain_keras_and_what_to_change():
    rows = [{"model": "cnn", "mode": "plain keras (1 thread)", "workers": 0, "metric_value": v} for v in (0.93, 0.95)]
    rows += [{"model": "cnn", "mode": "distributed", "workers": 1, "metric_value": 0.938},
             {"model": "cnn", "mode": "distributed", "workers": 3, "metric_value": 0.79}]
    one, three = against_plain_keras(rows, "accuracy", higher_is_better=True, tolerance=0.005, advice="more epochs")
    assert one == "cnn, 1 worker: accuracy 0.938, plain Keras 0.94: reaches plain Keras's."
    assert three.startswith("cnn, 3 workers: accuracy 0.79, plain Keras 0.94: not yet.") and three.endswith("more epochs.")
    mape_rows = [{"model": "gru", "workers": 0, "mode": "plain keras (1 thread)", "metric_value": 3.0},
                 {"model": "gru", "workers": 2, "mode": "distributed", "metric_value": 3.2}]
    assert "reaches" in against_plain_keras(mape_rows, "MAPE", higher_is_better=False, tolerance=0.3, advice="x")[0]
    assert against_plain_keras(rows[2:], "accuracy", higher_is_better=True, tolerance=0.005, advice="x") == []


def test_the_mnist_verdict_states_its_tolerance_and_allows_for_the_run_to_run_spread():
    import importlib

    mnist = importlib.import_module("trainer_jobs.mnist")
    tolerance, spread = mnist.verdict_tolerance(12_000)  # make demo's size
    assert (tolerance, mnist.verdict_tolerance(60_000)[0]) == (0.01, 0.005)
    plain = [{"model": "cnn", "mode": "plain keras (1 thread)", "workers": 0, "metric_value": 0.967}]

    def verdict(accuracy: float) -> list[str]:
        two = {"model": "cnn", "mode": "distributed", "workers": 2, "metric_value": accuracy}
        return against_plain_keras(plain + [two], "test accuracy", higher_is_better=True, tolerance=tolerance,
                                   advice="train more epochs", spread=spread)

    rule = ("Reaching plain Keras's test accuracy: within 0.01 of it (one fit of 6,000-12,000 images moves "
            "0.007-0.013 between runs).")
    for accuracy in (0.961, 0.962, 0.9645):  # demo runs of the same code, which flipped at a tolerance of 0.005
        assert verdict(accuracy) == [rule, f"cnn, 2 workers: test accuracy {accuracy:.4g}, plain Keras 0.967: "
                                           "reaches plain Keras's."]
    first, behind = verdict(0.95)
    assert first == rule and behind.endswith("train more epochs.")
    assert behind.startswith("cnn, 2 workers: test accuracy 0.95, plain Keras 0.967: not yet, 0.017 behind. Each of")
    assert against_plain_keras(plain, "test accuracy", higher_is_better=True, tolerance=tolerance, advice="x",
                               spread=spread) == []  # no worker count: no rule either


def test_the_plot_shades_plain_keras_s_tolerance_band_and_spans_at_least_that_band():
    rows = [{"model": "cnn", "mode": "plain keras (1 thread)", "workers": 0, "metric_name": "accuracy",
             "metric_value": 0.967, "time_s": 60.0}]
    rows += [{"model": "cnn", "mode": "distributed", "workers": n, "metric_name": "accuracy", "metric_value": v,
              "time_s": 60.0 / n} for n, v in ((1, 0.9665), (2, 0.962))]
    _, plain_only = speedup_figure(rows, "accuracy").axes
    assert plain_only.get_legend_handles_labels()[1] == ["cnn", "plain Keras"]  # no band without a tolerance
    _, metric = speedup_figure(rows, "accuracy", tolerance=0.01).axes
    assert metric.get_legend_handles_labels()[1] == ["cnn", "plain Keras", "plain Keras ± 0.01 (run-to-run spread)"]
    low, high = metric.get_ylim()
    assert low <= 0.957 and high >= 0.977  # not zoomed on the half point between the runs


def test_the_timeline_spreads_each_task_over_its_span_and_draws_one_column_per_fit(tmp_path):
    tasks = [{"t0": 0.5, "t1": 2.5, "rows": 100}, {"t0": 1.0, "t1": 2.0, "rows": 30},
             {"t0": 3.0, "t1": 3.0, "rows": 9}]  # the last spans no time: left out
    starts, rate = throughput(tasks, wall_s=4.0)
    assert list(starts) == [0.0, 1.0, 2.0, 3.0] and rate.tolist() == pytest.approx([25.0, 80.0, 25.0, 0.0])
    fit = {"wall_s": 4.0, "disturbed_s": 1.5, "tasks": tasks,
           "membership": [{"t": 0.2, "workers": 1, "event": "joined"}, {"t": 0.4, "workers": 2, "event": "joined"},
                          {"t": 1.6, "workers": 1, "event": "left"}]}
    out = plot_timelines({"killed": fit, "joined": fit}, tmp_path / "timeline.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="no fits"):
        plot_timelines({}, tmp_path / "empty.png")
