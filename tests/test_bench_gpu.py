"""The worker loop without Spark: its modules import neither pyspark nor a Keras backend, and `make bench-gpu`
(benchmarks/bench_gpu.py) runs the real worker loop and parameter server against plain Keras where pyspark cannot be
imported at all (as on a GPU machine with Keras and a backend but no Spark or Java)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trainer_benchmarks.bench_gpu import algorithm_for, worker_row

REPO = Path(__file__).resolve().parents[1]

# An import hook that makes the named top-level packages unimportable, then runs the given code.
_BLOCKER = textwrap.dedent("""
    import importlib.abc, sys
    BLOCKED = set(sys.argv[1].split(","))
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"{name} is blocked in this test")
            return None
    sys.meta_path.insert(0, Block())
    sys.argv = sys.argv[2:]
""")

WORKER_MODULES = ["trainer.runtime.ps_worker.worker_task",
                  "trainer.runtime.ps_worker.exchange", "trainer.runtime.feeding.feed",
                  "trainer.runtime.feeding.shard", "trainer.backends", "trainer.algorithms.cadence",
                  "trainer.runtime.process", "trainer.ps", "trainer.algorithms", "trainer.fit.progress",
                  "trainer_benchmarks.bench_gpu", "trainer_jobs.support.plain_keras",
                  "trainer_benchmarks.support.worker_loop"]


def _run_blocked(blocked: list[str], code: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _BLOCKER + code, ",".join(blocked)], cwd=REPO, text=True,
                          capture_output=True, timeout=timeout)


def test_the_worker_modules_import_neither_pyspark_nor_a_backend_nor_tqdm():
    code = textwrap.dedent(f"""
        import importlib, sys
        for name in {WORKER_MODULES!r}:
            importlib.import_module(name)
        loaded = sorted({{m.split(".")[0] for m in sys.modules}} & {{"pyspark", "keras", "tensorflow", "jax",
                                                                 "torch", "tqdm", "py4j"}})
        print("LOADED", loaded)
    """)
    done = _run_blocked(["pyspark", "py4j", "keras", "tensorflow", "jax", "torch", "tqdm"], code)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "LOADED []" in done.stdout, done.stdout


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_bench_gpu_runs_the_worker_loop_and_server_where_pyspark_cannot_be_imported(tmp_path):
    out = tmp_path / "bench_gpu"
    code = textwrap.dedent(f"""
        import runpy, sys
        sys.argv = ["bench_gpu", "--backend", "tensorflow", "--quick", "--limit", "1200", "--workers", "1",
                    "--overlap", "off", "--batch-size", "64", "--out", {str(out)!r}]
        runpy.run_module("trainer_benchmarks.bench_gpu", run_name="__main__")
    """)
    done = _run_blocked(["pyspark", "py4j"], code, timeout=850)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads((out / "bench_gpu.json").read_text())
    rows = {r["run"]: r for r in result["rows"]}
    assert set(rows) == {"plain Keras", "1 worker"}  # more workers take the same path: a process each
    assert result["metadata"]["algorithm"] == "1: downpour(auto window)" and result["metadata"]["quick"] is True
    row = rows["1 worker"]
    assert row["commits"] > 0 and row["window"] >= 4 and row["epoch_s"] > 0
    assert 0.5 < row["test_accuracy"] <= 1.0  # the center learned (10 classes: chance is 0.1)
    # one worker is plain Keras with exchanges: the same data, so the same quality within noise
    assert abs(rows["1 worker"]["test_accuracy"] - rows["plain Keras"]["test_accuracy"]) < 0.05
    assert "| 1 worker |" in (out / "bench_gpu.md").read_text()


def test_worker_row_compares_samples_per_second_with_plain_keras():
    results = [{"mode": "worker", "rows": 300, "epoch_times": [9.0, 1.0, 1.0], "commits": 3, "cores_used": 1.0,
                "exchange_s": {"state": 0.03, "payload": 0.0, "round_trip": 0.3, "load": 0.0},
                "window": {"last": 12}},
               {"mode": "worker", "rows": 300, "epoch_times": [9.0, 2.0, 2.0], "commits": 1, "cores_used": 0.5,
                "exchange_s": {"state": 0.01, "payload": 0.0, "round_trip": 0.1, "load": 0.0},
                "window": {"last": 20}},
               {"mode": "server", "cpu_s": 1.0}]
    row = worker_row("jax", "2 workers", 2, results, {"rows": 600, "epoch_s": 1.0}, {"accuracy": 0.9})
    assert row["epoch_s"] == pytest.approx(1.5)
    assert row["per_worker"] == pytest.approx((300 + 150) / 2 / 600)
    assert row["together"] == pytest.approx(450 / 600)
    assert row["round_trip_ms"] == pytest.approx(100.0) and row["state_ms"] == pytest.approx(10.0)
    assert row["window"] == 20 and row["commits"] == 4 and row["test_accuracy"] == 0.9


def test_bench_gpu_runs_what_a_fit_would_choose_there():
    names = {(n, gpu): algorithm_for("default", n, gpu, "auto").name for n in (1, 2) for gpu in (False, True)}
    assert names == {(1, False): "downpour", (1, True): "downpour", (2, False): "downpour", (2, True): "localsgd"}
    assert algorithm_for("localsgd", 2, False, "auto").describe() == \
        "localsgd(averaged every auto <= 16 steps, bf16, outer momentum 0.5)"
    assert algorithm_for("downpour", 2, False, 5).window == 5
