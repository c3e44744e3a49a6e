"""The ``spark-keras-trainer`` command (= ``python -m trainer``): every subcommand's --help, and bad input.

These start no cluster. A real run of ``train model`` from the installed wheel, on a
2-worker embedded cluster, is in tests/test_wheel.py; ``cluster up`` is run in
tests/test_cluster.py.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from trainer.cli import jobs, main
from trainer.cli.train import load_model_spec

HELP = [
    ([], "cluster"),
    (["cluster"], "up"),
    (["cluster", "up"], "--workers"),
    (["train"], "model"),
    (["train", "model"], "--model"),
    (["train", "mnist"], "--lr-schedule"),
    (["train", "forecast"], "--repeats"),
    (["select"], "mnist"),
    (["select", "mnist"], "--max-configs"),
    (["select", "forecast"], "--val-hours"),
    (["bench"], "--quick"),
    (["bench", "ps"], "--clients"),
]


@pytest.mark.parametrize(("words", "expected"), HELP, ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_help_of_every_subcommand(words, expected):
    proc = subprocess.run([sys.executable, "-m", "trainer", *words, "--help"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"usage: spark-keras-trainer {' '.join(words)}".strip() in proc.stdout, proc.stdout[:500]
    assert expected in proc.stdout


def test_every_bundled_job_and_benchmark_is_listed_and_importable():
    import importlib
    from pathlib import Path

    for module, _ in jobs.JOBS.values():
        assert callable(importlib.import_module(module).main), module
    benchmarks = Path(__file__).resolve().parents[1] / "benchmarks"
    listed = {module for module, _ in jobs.JOBS.values()}
    assert {f"trainer_benchmarks.{p.stem}" for p in benchmarks.glob("*.py") if p.stem != "__init__"} <= listed
    assert jobs.find_job(["train", "mnist", "--epochs", "1"]) == ("trainer_jobs.mnist", ["--epochs", "1"],
                                                                   "spark-keras-trainer train mnist")
    assert jobs.find_job(["bench"]) == ("trainer_jobs.bench", [], "spark-keras-trainer bench")
    assert jobs.find_job(["bench", "--quick"]) == ("trainer_jobs.bench", ["--quick"], "spark-keras-trainer bench")
    assert jobs.find_job(["bench", "ps", "--seconds", "1"]) == ("trainer_benchmarks.bench_ps", ["--seconds", "1"],
                                                                 "spark-keras-trainer bench ps")
    assert jobs.find_job(["train", "model", "--model", "x:y"]) is None


@pytest.mark.parametrize(("args", "message"), [
    (["--model", "nocolon", "--data", "."], "Expected --model as MODULE:FUNCTION"),
    (["--model", "no_such_module_xyz:build", "--data", "."], "cannot import 'no_such_module_xyz'"),
    (["--model", "json:no_such_function", "--data", "."], "has no function 'no_such_function'"),
    (["--model", "missing.keras", "--data", "."], "is not a file"),
    (["--model", "json:dumps", "--data", "/no/such/data.parquet"], "--data '/no/such/data.parquet' does not exist"),
    (["--model", "json:dumps", "--data", ".", "--workers", "0"],
     "--workers: `num_workers` must be a positive integer. Received: num_workers=0"),
    (["--model", "json:dumps", "--data", ".", "--algorithm", "nope"], "Unknown algorithm 'nope'"),
    (["--model", "json:dumps", "--data", ".", "--resume"], "--resume needs --checkpoint-dir"),
    (["--model", "json:dumps", "--data", ".", "--conf", "executor.memory"], "--conf 'executor.memory': expected"),
])
def test_train_model_rejects_bad_input_before_any_cluster_work(args, message, capsys):
    try:
        code = main(["train", "model", *args])
    except Exception as exc:  # errors of the library itself (the algorithm name) come as exceptions
        assert message in str(exc)
        return
    assert code == 2
    assert message in capsys.readouterr().err


def test_train_model_passes_each_conf_to_the_session():
    from trainer.cli.train import spark_conf

    assert spark_conf(["spark.dynamicAllocation.enabled=false", "spark.executor.memory = 2g"]) == {
        "spark.dynamicAllocation.enabled": "false", "spark.executor.memory": "2g"}


def test_model_spec_from_a_file_ships_by_value(tmp_path):
    path = tmp_path / "my_models.py"
    path.write_text("def build():\n    return 'a model'\n")
    builder = load_model_spec(f"{path}:build")
    assert builder() == "a model"
    assert builder.__module__ in sys.modules  # cloudpickle finds the module and ships it whole
