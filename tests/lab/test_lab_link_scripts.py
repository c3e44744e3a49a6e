"""The shaped lab's scripts without Docker: shape-links.sh's checks, bench_lab.py's plan and tables."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from .labtools import REPO

SHAPE = REPO / "compose" / "shape-links.sh"


@pytest.fixture(scope="module")
def bench_lab():
    spec = importlib.util.spec_from_file_location("bench_lab", REPO / "compose" / "bench_lab.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_lab"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def shape(*args: str, path: str | None = None) -> subprocess.CompletedProcess:
    env = None if path is None else {"PATH": path}
    return subprocess.run(["/bin/bash", str(SHAPE), *args], capture_output=True, text=True, env=env)


@pytest.mark.parametrize("args,message", [
    (("check", "100mbits"), "bad rate '100mbits': expected a number and a tc unit"),
    (("check", "1gbit", "1 ms"), "bad delay '1 ms'"),
    (("apply", "lab", "fast"), "bad rate 'fast'"),
    (("wobble",), "expected check, apply, clear, show or follow; received 'wobble'"),
])
def test_shape_links_refuses_bad_values_before_touching_anything(args, message):
    proc = shape(*args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def fake_tools(tmp_path, *names: str, uid: int = 0) -> str:
    for name in names:
        tool = tmp_path / name
        tool.write_text("#!/bin/bash\n" + (f"echo {uid}\n" if name == "id" else "exit 0\n"))
        tool.chmod(0o755)
    return str(tmp_path)


@pytest.mark.parametrize("tools,uid,message", [
    (("id", "nsenter"), 0, "tc is missing on this host: apt-get install iproute2"),
    (("id", "tc"), 0, "nsenter is missing on this host: apt-get install util-linux"),
    (("id", "tc", "nsenter"), 1000, "needs root; received uid 1000: run it with sudo"),
])
def test_shape_links_names_what_the_host_lacks(tmp_path, tools, uid, message):
    proc = shape("check", "1gbit", "1ms", path=fake_tools(tmp_path, *tools, uid=uid))
    assert proc.returncode == 1 and message in proc.stderr, proc.stderr


def test_bench_lab_plans_the_defaults_then_each_algorithm_at_each_link(bench_lab):
    args = bench_lab.parse_args(["--links", "unshaped,100mbit", "--workers", "2 1", "--runs", "3",
                                 "--algorithms", "allreduce localsgd", "--jobs", "mnist"])
    submits = bench_lab.plan(args)
    assert [(s.link, s.asked, s.runs, s.baseline) for s in submits] == [
        ("unshaped", "default", 3, True), ("unshaped", "allreduce", 1, False), ("unshaped", "localsgd", 1, False),
        ("100mbit", "default", 3, False), ("100mbit", "allreduce", 1, False), ("100mbit", "localsgd", 1, False)]
    assert submits[0].job_args("--epochs 2") == ["--workers", "1,2", "--epochs", "2", "--out",
                                                 "/results/bench-lab/unshaped-mnist-default", "--repeats", "3"]
    assert submits[-1].job_args("")[:2] == ["--workers", "2"]  # an algorithm where there is something to exchange
    assert submits[-1].job_args("")[-3:] == ["--algorithm", "localsgd", "--no-baseline"]
    with pytest.raises(SystemExit):
        bench_lab.parse_args(["--jobs", "mnist,cifar"])


def test_bench_lab_tables_time_to_keras_and_record_a_failed_algorithm(bench_lab, tmp_path):
    def job_json(name: str, rows: list[dict]) -> None:
        folder = tmp_path / "runs" / "lab" / name
        folder.mkdir(parents=True)
        (folder / "mnist.json").write_text(json.dumps({"metadata": {}, "rows": rows}))

    def run(n: int, epoch_times: list[float], scores: list[float]) -> dict:
        return {"model": "cnn", "workers": n, "seed": 0, "algorithm": "downpour", "metric_name": "accuracy",
                "metric_value": scores[-1], "metric_by_epoch": scores, "epoch_times_s": epoch_times,
                "epoch_time_s": epoch_times[-1], "bytes": 10}

    keras = {"model": "cnn", "workers": 0, "metric_name": "accuracy", "metric_value": 0.95, "epoch_time_s": 5.0}
    job_json("unshaped-mnist-default", [keras, run(2, [6.0, 4.0], [0.94, 0.96])])
    job_json("100mbit-mnist-default", [{**run(2, [9.0, 8.0], [0.90, 0.93]), "period": 16, "average_ms": 180.5}])
    base = {"job": "mnist", "workers": [2], "runs": 1, "baseline": False}
    journal = [{**base, "link": "unshaped", "asked": "default", "name": "unshaped-mnist-default", "status": 0,
                "error": ""},
               {**base, "link": "100mbit", "asked": "default", "name": "100mbit-mnist-default", "status": 0,
                "error": ""},
               {**base, "link": "100mbit", "asked": "localsgd", "name": "100mbit-mnist-localsgd", "status": 2,
                "error": "ValueError: unknown algorithm 'localsgd'"}]
    (tmp_path / "submits.jsonl").write_text("".join(json.dumps(r) + "\n" for r in journal))
    text = bench_lab.report(tmp_path)
    rows = list(__import__("csv").DictReader((tmp_path / "bench-lab.csv").open()))
    assert [(r["link"], r["asked"], r["time_to_keras_s"], r["error"]) for r in rows] == [
        ("unshaped", "default", "10.0", ""), ("100mbit", "default", "", ""),
        ("100mbit", "localsgd", "", "ValueError: unknown algorithm 'localsgd'")]
    assert [(r["period"], r["average_ms"]) for r in rows[:2]] == [("", ""), ("16", "180.5")]  # local SGD's cadence
    assert ("| mnist | cnn | 100mbit | default | downpour | 2 | 1 | 8.00 | 2.00 | not reached (0 of 1) | 0.9300 |  |"
            in text)
    assert "unknown algorithm 'localsgd'" in (tmp_path / "bench-lab.md").read_text()
