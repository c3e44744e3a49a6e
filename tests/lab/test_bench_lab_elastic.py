"""compose/bench_lab_elastic.py without Docker: its table from the jobs' results and the kill's and join's times."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from .labtools import REPO


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(REPO / "compose"))  # it imports bench_lab's helpers beside it
    try:
        spec = importlib.util.spec_from_file_location("bench_lab_elastic", REPO / "compose" / "bench_lab_elastic.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(REPO / "compose"))
    return module


def _submit(tmp_path, name: str, fit_s: float, accuracy: float, events: list[dict], rows_by_worker: dict,
            keras: float | None = None, dynamic: bool = False) -> None:
    rows = [{"mode": "distributed", "time_s": fit_s, "metric_value": accuracy, "algorithm": "downpour(auto window)",
             "membership": events, "rows_by_worker": rows_by_worker}]
    if keras is not None:
        rows.append({"mode": "plain keras (1 thread)", "metric_value": keras})
    folder = tmp_path / "runs" / "lab" / name
    folder.mkdir(parents=True)
    (folder / "mnist.json").write_text(json.dumps({"metadata": {"dynamic_allocation": dynamic}, "rows": rows}))


def _joined(t: float, worker: str, ready: float = 5.0) -> dict:
    return {"time": t, "event": "joined", "worker": worker, "ready_s": ready}


def test_the_table_times_the_kill_and_the_join_against_the_same_run_s_undisturbed_fit(bench, tmp_path):
    three = [_joined(100, "a:1"), _joined(101, "b:1"), _joined(102, "c:1")]
    _submit(tmp_path, "run1-undisturbed", 40.0, 0.96, three, {"a:1": 8000, "b:1": 8000, "c:1": 8000}, keras=0.97)
    _submit(tmp_path, "run1-killed", 44.0, 0.965, three + [{"time": 150.3, "event": "left", "worker": "c:1"}],
            {"a:1": 10000, "b:1": 10000, "c:1": 4000})
    _submit(tmp_path, "run1-joined", 38.0, 0.962, three[:2] + [_joined(212, "d:1", ready=4.2)],
            {"a:1": 10000, "b:1": 10000, "d:1": 4000})
    _submit(tmp_path, "run1-dynamic", 50.0, 0.963, [_joined(300, "a:2"), _joined(313, "b:2"), _joined(320, "c:2")],
            {"a:2": 11000, "b:2": 8000, "c:2": 5000}, dynamic=True)
    records = [{"run": 1, "case": "undisturbed", "name": "run1-undisturbed", "status": 0},
               {"run": 1, "case": "killed", "name": "run1-killed", "status": 0, "disturbed_at": 150.0},
               {"run": 1, "case": "joined", "name": "run1-joined", "status": 0, "disturbed_at": 205.0},
               {"run": 1, "case": "dynamic", "name": "run1-dynamic", "status": 0}]
    (tmp_path / "submits.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    rows = {r["case"]: r for r in bench.table_rows(tmp_path)}
    assert rows["killed"]["vs_undisturbed"] == 1.1 and rows["killed"]["noticed_s"] == pytest.approx(0.3)
    assert rows["joined"]["joiner_ready_s"] == 4.2 and rows["joined"]["joiner_rows"] == 4000  # d:1 alone
    assert rows["joined"]["vs_undisturbed"] == 0.95
    assert rows["dynamic"]["first_to_last_join_s"] == 20.0 and rows["dynamic"]["dynamic_allocation"] is True
    assert rows["undisturbed"]["keras_accuracy"] == 0.97 and rows["undisturbed"]["workers_used"] == 3
    text, _ = bench.report(tmp_path, bench.parse_args(["--runs", "1", "--out", str(tmp_path)]))
    assert "| killed | 44.0 | 1.10 | 0.30 |" in text and "plain Keras's test accuracy" in text and "0.970" in text


def test_a_failed_submit_is_a_row_with_its_error_and_the_bench_says_so(bench, tmp_path):
    record = {"run": 1, "case": "killed", "name": "run1-killed", "status": 2, "error": "make: *** [submit] Error 1"}
    (tmp_path / "submits.jsonl").write_text(json.dumps(record) + "\n")
    (row,) = bench.table_rows(tmp_path)
    assert row["error"] == "make: *** [submit] Error 1" and row["fit_s"] is None
    with pytest.raises(SystemExit):
        bench.parse_args(["--runs", "0"])
