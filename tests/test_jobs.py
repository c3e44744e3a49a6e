"""End-to-end tests of the benchmark jobs: jobs/mnist.py, jobs/forecast.py and jobs/bench.py.

Each job is its own Spark driver, and Spark allows one SparkContext per
process, so the jobs run as SUBPROCESSES. They cannot share ``local_cluster_2``
with this process: the session-scoped ``spark`` fixture holds every core of
that cluster (``spark.cores.max`` = all of them), and a second application on
the same standalone master gets no executor until the first one stops. The
``--master`` runs therefore go to ``drivers_cluster``, the session's second
cluster (3 workers, tests/conftest.py), each asking for the cores of its largest
run. The demo's command uses no ``--master``: the job starts its own embedded
cluster, as ``make demo`` does.

The job runs log at ``TRAINER_LOG=info``, where the driver JVM's WARN lines
show: the jobs read Parquet with ``spark.read.parquet``, so Spark never warns
of "a task of very large size" (it did when the jobs shipped their arrays in
task closures; `test_a_large_task_is_reported_at_info_level` shows the
warning does reach the output when it happens).

Flag checks, the bench plan and the BENCH.md summary need no Spark.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from trainer_jobs.support.cli import trainer_options
from trainer_jobs.support.scaling import timing_valid, with_ratios
from trainer.fit.checkpoints import load_checkpoint
from trainer_jobs.support.report import write_results

JOBS = Path(__file__).resolve().parents[1] / "jobs"
JOB_TIMEOUT_S = 1500  # the machine running the tests may be heavily loaded
TEST_TIMEOUT_S = 1800
LARGE_TASK = "task of very large size"  # Spark's TaskSetManager warning, logged by the driver JVM


def _rate(optimizer) -> float:
    """The optimizer's learning rate as a float (Keras before 3.1 has no float() of a Variable)."""
    import keras  # deferred, as in the jobs

    return float(keras.ops.convert_to_numpy(optimizer.learning_rate))


def _load_job(name: str):
    """The job jobs/<name>.py, imported as the module trainer_jobs.<name>."""
    return importlib.import_module(f"trainer_jobs.{name}")


@pytest.fixture(scope="module")
def forecast_job():
    return _load_job("forecast")


@pytest.fixture(scope="module")
def bench_job():
    return _load_job("bench")


def run_job(name: str, args: list[str], out: Path, log_level: str | None = "info") -> dict:
    """Run jobs/<name>.py with `args` and ``--out out`` at TRAINER_LOG=`log_level` (None: the default, quiet);
    return its JSON results (metadata, rows) after checking that Spark never warned of a large task."""
    log_path = out.parent / f"{out.name}.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TRAINER_DATA_DIR": str(out.parent / "data")}
    env.pop("TRAINER_LOG", None)
    if log_level:
        env["TRAINER_LOG"] = log_level
    with open(log_path, "w") as log:
        proc = subprocess.run(
            [sys.executable, str(JOBS / f"{name}.py"), *args, "--out", str(out)],
            stdout=log, stderr=subprocess.STDOUT, env=env, timeout=JOB_TIMEOUT_S, cwd=JOBS.parent,
        )
    text = log_path.read_text(errors="replace")
    assert proc.returncode == 0, f"{name} exited with {proc.returncode}; last output:\n{text[-6000:]}"
    assert LARGE_TASK not in text, [line for line in text.splitlines() if LARGE_TASK in line]
    for suffix in ("json", "csv", "md", "png"):
        path = out / f"{name}.{suffix}"
        assert path.is_file() and path.stat().st_size > 0, f"{path} was not written"
    assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| mode |" in text  # the markdown table is printed
    return json.loads((out / f"{name}.json").read_text())


def _check_distributed_rows(rows: list[dict], counts: list[int]) -> None:
    assert sorted(r["workers"] for r in rows if r["mode"] == "distributed") == counts
    for r in rows:
        if r["mode"] != "distributed":
            continue
        assert r["updates"] > 0 and r["bytes"] > 0
        assert {"time_to_target_s", "target_epochs", "target_steps", "target_speedup", "target"} <= set(r)
        assert len(r["metric_by_epoch"]) == r["epochs_trained"] >= r["epochs"]
        assert r["epoch_time_s"] > 0 and r["time_s"] > 0
        assert r["algorithm"]
        if r["workers"] == 1:
            assert r["speedup"] == pytest.approx(1.0)
        else:
            assert r["speedup"] is not None and r["speedup"] > 0
            assert r["efficiency"] == pytest.approx(r["speedup"] / r["workers"])


# ---------------------------------------------------------------- flags (no Spark)


@pytest.mark.parametrize("argv, message", [
    (["--workers", "0"], "--workers expects"),
    (["--models", "lstm,cnn"], "--models expects"),
    (["--limit", "100"], "--limit must be at least"),
    (["--algorithm", "sgd"], "Unknown algorithm"),
    (["--epochs", "0"], "positive integer"),
    (["--batch-size", "x"], "positive integer"),
    (["--learning-rate", "0"], "positive number"),
    (["--learning-rate", "fast"], "positive number"),
    (["--lr-scaling", "cubic"], "invalid choice"),
    (["--loss", "huber"], "invalid choice"),
    (["--repeats", "0"], "positive integer"),
    (["--resume"], "--resume needs --checkpoint-dir"),
    (["--epochs", "3", "--max-epochs", "2"], "--max-epochs must be at least --epochs (3)"),
    (["--target-mape", "0"], "positive number"),
    (["--compression", "gzip"], "Unknown compression"),
    (["--compression", "topk:2"], "fraction in (0, 1]"),
    (["--algorithm", "sync", "--compression", "bf16"], "commit deltas"),
    (["--algorithm", "dynsgd", "--compress-replies"], "compress_replies=True needs a compression"),
])
def test_forecast_rejects_bad_flags(forecast_job, capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        forecast_job.parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_the_security_benchmark_flags_and_its_update_rows(tmp_path, capsys):
    bench = importlib.import_module("trainer_benchmarks.bench_security")
    args = bench.parse_args(["--modes", "plain,tls", "--updates", "2"])
    assert args.mode_list == ["plain", "tls"] and args.workers == 2
    with pytest.raises(SystemExit):
        bench.parse_args(["--modes", "plain,fast"])
    assert "--modes: expected" in capsys.readouterr().err
    rows = bench.bench_updates(["plain", "mac"], updates=2)
    assert [r["mode"] for r in rows] == ["plain", "mac"] and rows[0]["vs_plain"] == 1.0
    assert all(r["ms_per_update"] > 0 for r in rows)


def test_forecast_flags_and_defaults(forecast_job, capsys):
    args = forecast_job.parse_args([])
    assert (args.algorithm, args.window, args.epochs, args.batch_size) == ("sync", None, 4, 32)
    # Averaging every 5 batches up to 2 workers, then 10 // N (8 models drifting for 5 batches lose MAPE).
    assert [forecast_job.window_for(args, n) for n in (1, 2, 3, 4, 5, 8)] == [5, 5, 3, 2, 2, 1]
    assert forecast_job.window_for(forecast_job.parse_args(["--window", "7"]), 8) == 7
    assert (args.learning_rate, args.lr_schedule, args.lr_scaling) == (2e-3, "cosine", "linear")
    assert args.worker_counts == [1, 2] and args.model_names == ["lstm", "gru"]
    args = forecast_job.parse_args(["--models", "GRU,gru", "--workers", "4,1,2", "--limit", "600"])
    assert args.model_names == ["gru"] and args.worker_counts == [1, 2, 4] and args.limit == 600
    assert trainer_options(args, "gru", 2) == (
        {"retry_timeout": 60.0, "share_epochs": True, "seed": 0, "compression": "none", "compress_replies": False,
         "tls": False, "frame_mac": True, "overlap": False}, {})
    assert trainer_options(forecast_job.parse_args(["--algorithm", "dynsgd", "--overlap"]), "gru", 2)[0]["overlap"]
    with pytest.raises(SystemExit):  # averaging waits for every worker at every round: nothing to overlap
        forecast_job.parse_args(["--overlap"])
    assert "--overlap needs a delta algorithm with a window" in capsys.readouterr().err
    assert trainer_options(forecast_job.parse_args(["--algorithm", "dynsgd", "--compression", "TopK:0.01"]), "gru",
                           2)[0]["compression"] == "topk:0.01"
    both = forecast_job.parse_args(["--algorithm", "dynsgd", "--compression", "bf16", "--compress-replies"])
    assert trainer_options(both, "gru", 2)[0]["compress_replies"] is True
    with pytest.raises(SystemExit):  # the default, averaging, sends whole models: nothing to compress
        forecast_job.parse_args(["--compression", "bf16"])
    assert "commit deltas (downpour, adag, dynsgd)" in capsys.readouterr().err
    assert trainer_options(forecast_job.parse_args(["--seed", "3"]), "gru", 2)[0]["seed"] == 3
    assert trainer_options(forecast_job.parse_args(["--fixed-epochs"]), "gru", 2)[0]["share_epochs"] is False
    assert args.repeats == 1 and forecast_job.parse_args(["--repeats", "3"]).repeats == 3
    assert (args.max_epochs, args.target_mape) == (4, None)
    assert forecast_job.parse_args(["--max-epochs", "8"]).max_epochs == 8


def test_mnist_time_to_target_flags(capsys):
    mnist_job = _load_job("mnist")
    args = mnist_job.parse_args([])
    assert (args.max_epochs, args.target_accuracy, args.repeats) == (6, 0.99, 1)
    assert mnist_job.parse_args(["--epochs", "2", "--max-epochs", "5"]).max_epochs == 5
    assert mnist_job.parse_args(["--repeats", "5"]).repeats == 5
    for argv, message in ((["--max-epochs", "3"], "--max-epochs must be at least --epochs (6)"),
                          (["--target-accuracy", "99"], "--target-accuracy must be in (0, 1]")):
        with pytest.raises(SystemExit):
            mnist_job.parse_args(argv)
        assert message in capsys.readouterr().err


def test_an_algorithm_is_named_with_its_own_arguments(capsys):
    """--algorithm NAME:KEY=VALUE,... passes the algorithm's own arguments; a wrong one stops the job at parse time."""
    from trainer_jobs.support.cli import algorithm_from_args

    assert algorithm_from_args("localsgd:outer_momentum=0,wire=fp32", 16).describe() == \
        "localsgd(averaged every 16 steps)"
    assert algorithm_from_args("downpour:window=3", "auto").describe() == "downpour(every 3 batches)"
    mnist_job = _load_job("mnist")
    for argv, message in ((["--algorithm", "localsgd:outer_momentum"], "NAME:KEY=VALUE"),
                          (["--algorithm", "localsgd:outer_momentum=1"], "outer_momentum is a number in [0, 1)"),
                          (["--algorithm", "localsgd:speed=2"], "Received: speed=2"),
                          (["--algorithm", "auto:x=1"], "--algorithm auto takes no options")):
        with pytest.raises(SystemExit):
            mnist_job.parse_args(argv)
        assert message in capsys.readouterr().err


def test_repeated_runs_get_their_own_seed_and_checkpoint_folder(forecast_job, tmp_path):
    args = forecast_job.parse_args(["--seed", "5", "--checkpoint-dir", str(tmp_path)])
    assert trainer_options(args, "gru", 2) == trainer_options(args, "gru", 2, seed=5)
    first, _ = trainer_options(args, "gru", 2, seed=5)
    second, _ = trainer_options(args, "gru", 2, seed=6)
    assert (first["seed"], second["seed"]) == (5, 6)
    assert (first["checkpoint_dir"], second["checkpoint_dir"]) == (str(tmp_path / "gru-2w"),
                                                                   str(tmp_path / "gru-2w-seed6"))


def test_ratios_compare_with_the_mean_of_repeated_baselines():
    def row(workers, epoch_time, samples):
        return {"model": "gru", "workers": workers, "epoch_time_s": epoch_time, "samples_per_s_per_worker": samples}

    rows = with_ratios([row(0, 1.0, 100.0), row(0, 1.0, 300.0), row(1, 4.0, 150.0), row(1, 2.0, 150.0),
                        row(2, 1.5, 100.0)])
    two = rows[-1]
    assert two["speedup"] == pytest.approx(2.0) and two["efficiency"] == pytest.approx(1.0)  # mean of 4 s and 2 s
    assert two["throughput_vs_keras"] == pytest.approx(0.5)  # the plain rows average 200 samples/s
    assert rows[0]["speedup"] is None
    assert not any("throughput_vs_side_by_side" in r for r in rows)  # no side-by-side baseline in this run


def test_the_quality_benchmark_writes_its_table_between_the_markers_and_its_cases_are_the_tests(tmp_path, capsys):
    quality = importlib.import_module("trainer_benchmarks.bench_quality")
    rows = [quality.summary(quality.CASES[0], [0.9, 0.95, 0.79])]
    assert rows[0]["below_floor"] == 1 and rows[0]["worst"] == 0.79 and rows[0]["median"] == 0.9
    page = tmp_path / "benchmarks.md"
    page.write_text(f"# B\n\n{quality.BEGIN}\nold\n{quality.END}\n\nafter\n")
    quality.write_docs(quality.docs_table(rows, "a run"), page)
    text = page.read_text()
    assert "old" not in text and "| downpour | downpour(every 4 batches) | 2 | 0.005 | 3 | 0.790 |" in text
    assert text.endswith(f"{quality.END}\n\nafter\n")
    assert quality.BEGIN in (JOBS.parent / "docs" / "benchmarks.md").read_text()
    assert all(case.worst > case.floor for case in quality.CASES), "a floor sits below its calibration's worst run"
    with pytest.raises(SystemExit):
        quality.main(["--cases", "hogwild"])
    assert "unknown case(s) ['hogwild']" in capsys.readouterr().err


def test_a_run_with_more_worker_cores_than_the_machine_has_is_marked_time_shared():
    from trainer_jobs.support.scaling import timing_valid

    cores = os.cpu_count() or 1
    assert timing_valid(cores, 1, None) and not timing_valid(cores + 1, 1, None)
    assert not timing_valid(2, cores, None)  # 2 workers x all cores, as a resumed run once had
    assert timing_valid(8, 4, "spark://elsewhere:7077")  # an external master: the job cannot tell, so it trusts it


def test_workers_are_compared_with_as_many_plain_processes_side_by_side():
    rows = with_ratios([
        {"model": "cnn", "workers": 0, "epoch_time_s": 10.0, "samples_per_s_per_worker": 200.0},
        {"model": "cnn", "workers": 1, "epoch_time_s": 11.0, "samples_per_s_per_worker": 190.0},
        {"model": "cnn", "workers": 2, "epoch_time_s": 6.0, "samples_per_s_per_worker": 171.0,
         "side_by_side_samples_per_s": 180.0},
        {"model": "gru", "workers": 0, "epoch_time_s": 1.0, "samples_per_s_per_worker": 100.0},
        {"model": "gru", "workers": 1, "epoch_time_s": 1.0, "samples_per_s_per_worker": 90.0},
    ])
    by = {(r["model"], r["workers"]): r for r in rows}
    assert by["cnn", 2]["throughput_vs_keras"] == pytest.approx(0.855)
    assert by["cnn", 2]["throughput_vs_side_by_side"] == pytest.approx(0.95)  # the machine's share set apart
    assert by["cnn", 1]["throughput_vs_side_by_side"] == pytest.approx(0.95)  # one process: plain Keras alone
    assert "throughput_vs_side_by_side" not in by["gru", 1]  # its model ran no side-by-side baseline
    assert "throughput_vs_side_by_side" not in by["cnn", 0]


def test_an_allreduce_step_is_broken_down_against_the_side_by_side_limit():
    from types import SimpleNamespace

    from trainer_jobs.support.scaling import collective_parts, step_breakdown_table

    # Two processes, 2 epochs of 10 steps of 32 rows each; past the first (tracing) epoch, 40 ms a step in fit,
    # 12 of them in the all-reduce, of which 4 reducing alone; bare processes side by side run 1,280 samples/s
    # each (25 ms a step).
    epochs = [{"batches": 10, "fit_s": 3.0, "collective_s": 2.0}, {"batches": 10, "fit_s": 0.4, "collective_s": 0.12}]
    records = [{"fit_s": 3.4, "steps": 20, "padded_rows": 320, "epochs": epochs, "allreduce_ms": 4.0}
               for _ in range(2)]
    history = SimpleNamespace(workers=records)
    parts = collective_parts(history)
    assert parts == pytest.approx({"step_ms": 40.0, "step_rows": 32.0, "steps_per_epoch": 10.0,
                                   "in_allreduce_ms": 12.0, "allreduce_ms": 4.0})
    row = {"model": "cnn", "workers": 2, "epoch_time_s": 0.45, "samples_per_s_per_worker": 711.0,
           "side_by_side_samples_per_s": 1280.0, **parts}
    by = with_ratios([row])[0]
    assert by["compute_ms"] == pytest.approx(25.0) and by["wait_ms"] == pytest.approx(8.0)
    assert by["framework_ms"] == pytest.approx(3.0)  # 40 - 12 - 25
    assert by["epoch_end_ms"] == pytest.approx(5.0)  # 450 ms an epoch over 10 steps, 40 of them in fit
    assert "| cnn | 2 | 40.00 | 25.00 | 8.00 | 4.00 | 3.00 | 5.00 |" in step_breakdown_table([by])
    # JAX measures no all-reduce time: compute and the epoch's end only; other algorithms: nothing
    jax = collective_parts(SimpleNamespace(workers=[{**r, "allreduce_ms": None} for r in records]))
    assert set(jax) == {"step_ms", "step_rows", "steps_per_epoch"}
    assert collective_parts(SimpleNamespace(workers=[{"commits": 3}])) == {}
    # local SGD: one average's time and how many an epoch took, not a per-step all-reduce
    local = collective_parts(SimpleNamespace(workers=[{**r, "averages": 4, "average_s": 0.2} for r in records]))
    assert local == pytest.approx({"step_ms": 40.0, "step_rows": 32.0, "steps_per_epoch": 10.0, "average_ms": 50.0,
                                   "averages_per_epoch": 2.0})
    assert step_breakdown_table([{"model": "cnn", "workers": 2}]) == ""


def test_mnist_cnn_is_the_seed_s_with_optional_dropout():
    mnist_job = _load_job("mnist")
    for dropout in (True, False):
        model = mnist_job.build_cnn(dropout=dropout)
        assert model.count_params() == 1_048_853
        kinds = [layer.__class__.__name__ for layer in model.layers]
        assert kinds.count("Dropout") == (2 if dropout else 0)
        assert [k for k in kinds if k != "Dropout"] == ["Conv2D", "Conv2D", "MaxPooling2D", "Flatten", "Dense", "Dense"]
    assert mnist_job.parse_args(["--no-dropout"]).no_dropout is True


def test_mnist_learning_rate_decays_over_one_worker_s_steps():
    mnist_job = _load_job("mnist")
    assert _rate(mnist_job.build_cnn().optimizer) == pytest.approx(1e-3)  # no steps: constant
    schedule = mnist_job.build_cnn(steps=1000).optimizer._learning_rate
    assert float(schedule(0)) == pytest.approx(1e-3) and float(schedule(100)) == pytest.approx(1e-3)
    assert float(schedule(550)) == pytest.approx(5.5e-4) and float(schedule(1000)) == pytest.approx(1e-4)
    assert mnist_job.parse_args([]).lr_schedule == "cosine"
    assert mnist_job.parse_args(["--lr-schedule", "constant"]).lr_schedule == "constant"


def test_forecast_models_match_the_seed(forecast_job):
    for name, builder in forecast_job.MODELS.items():
        model = builder()
        assert model.input_shape == (None, 24, 2) and model.output_shape == (None, 1)
        assert model.layers[0].__class__.__name__.lower() == name and model.layers[0].units == 128
        assert model.loss == "mae"
    args = forecast_job.parse_args(["--loss", "mse"])
    assert forecast_job.model_builder("gru", args, 8616, 2)().loss == "mse"


def test_forecast_cosine_schedule_warms_up_and_decays_over_one_workers_steps(forecast_job):
    args = forecast_job.parse_args(["--lr-schedule", "cosine", "--epochs", "4", "--batch-size", "32",
                                    "--lr-scaling", "sqrt"])
    for workers, steps in ((1, 4 * 270), (8, 4 * 34)):  # ceil(8616 / workers / 32) steps per epoch
        model = forecast_job.model_builder("gru", args, 8616, workers)()
        schedule = model.optimizer._learning_rate  # the public property gives the current value only
        peak = 2e-3 * workers ** 0.5
        assert float(schedule(0)) == pytest.approx(2e-3)
        assert float(schedule(round(steps / 10))) == pytest.approx(peak)
        assert float(schedule(steps)) == pytest.approx(peak / 10)


def test_forecast_learning_rate_and_scaling_reach_the_optimizer(forecast_job):
    constant = ["--lr-schedule", "constant", "--learning-rate", "0.004"]
    args = forecast_job.parse_args([*constant, "--lr-scaling", "none"])
    model = forecast_job.model_builder("lstm", args, 8616, 2)()
    assert _rate(model.optimizer) == pytest.approx(0.004)
    args = forecast_job.parse_args([*constant, "--lr-scaling", "linear"])
    assert _rate(forecast_job.model_builder("lstm", args, 8616, 2)().optimizer) == pytest.approx(0.008)
    args = forecast_job.parse_args(["--learning-rate", "0.004"])  # the default: warm-up from the base rate
    schedule = forecast_job.model_builder("gru", args, 8616, 4)().optimizer._learning_rate
    assert float(schedule(0)) == pytest.approx(0.004) and float(schedule(27)) == pytest.approx(0.016)


def test_forecast_series_too_short_for_workers(forecast_job):
    args = forecast_job.parse_args(["--limit", "300", "--workers", "1,8"])
    with pytest.raises(ValueError, match="8 workers x batch 32 need at least 256"):
        forecast_job.load_series(args)
    pdf = forecast_job.load_series(forecast_job.parse_args(["--limit", "600"]))
    assert len(pdf) == 600 and list(pdf.columns) == ["time", "load", "temperature"]
    assert pdf["time"].iloc[-1] == forecast_job.load_elecdemand()["time"].iloc[-1]  # the LAST hours


def test_forecast_reads_a_nyiso_like_csv(forecast_job, tmp_path):
    import numpy as np
    import pandas as pd

    hours = pd.date_range("2016-02-01", periods=400, freq="h")
    csv = tmp_path / "nyc.csv"
    pd.DataFrame({"Time Stamp": hours.strftime("%m/%d/%Y %H:%M:%S"), "Integrated Load": 5000 + np.arange(400.0),
                  "Temp": 30.0}).to_csv(csv, index=False)
    pdf = forecast_job.load_series(forecast_job.parse_args(["--data", str(csv), "--limit", "300"]))
    assert len(pdf) == 300 and pdf["load"].iloc[-1] == 5399.0


# ------------------------------------------------------------- bench (no Spark)


def test_bench_worker_counts(bench_job):
    assert bench_job.timing_valid_counts(1) == [1]
    assert bench_job.timing_valid_counts(2) == [1, 2]
    assert bench_job.timing_valid_counts(4) == [1, 2, 3, 4]
    assert bench_job.timing_valid_counts(12) == [1, 2, 4, 8, 12]


def test_bench_plan(bench_job, tmp_path):
    mnist, _, forecast, _ = bench_job.plan(tmp_path, cores=2)
    assert mnist.job == "mnist" and mnist.workers == [1, 2]
    assert forecast.job == "forecast" and forecast.workers == [1, 2, 4, 8]
    assert forecast.argv[forecast.argv.index("--out") + 1] == str(tmp_path / "forecast")
    assert "--limit" not in mnist.argv + forecast.argv
    assert forecast.argv[forecast.argv.index("--repeats") + 1] == "3" and "--repeats" not in mnist.argv
    assert forecast.argv[forecast.argv.index("--max-epochs") + 1] == "8"  # N workers may need more epochs
    quick = bench_job.plan(tmp_path, quick=True, skip_mnist=True, cores=2, allreduce=False)
    assert [s.job for s in quick] == ["forecast"] and quick[0].workers == [1, 2, 4]
    assert "--limit" in quick[0].argv and "--epochs" in quick[0].argv and "--repeats" not in quick[0].argv
    assert bench_job.plan(tmp_path, cores=16)[0].workers == [1, 2, 4, 8, 16]
    assert bench_job.plan(tmp_path, cores=16)[2].workers == [1, 2, 4, 8, 16]


def test_bench_runs_each_job_again_with_allreduce_next_to_the_default_algorithm(bench_job, tmp_path):
    steps = bench_job.plan(tmp_path, cores=2, extra={"forecast": ["--models", "gru"]})
    assert [(s.job, s.label) for s in steps] == [("mnist", ""), ("mnist", "allreduce"), ("forecast", ""),
                                                ("forecast", "allreduce")]
    for default, allreduce in (steps[:2], steps[2:]):
        assert allreduce.workers == [1, 2, 4]  # 4 time-shared here; not the 8 the default forecast algorithm runs
        assert allreduce.argv[-2:] == ["--algorithm", "allreduce"]
        assert allreduce.argv[allreduce.argv.index("--out") + 1] == str(tmp_path / f"{default.job}-allreduce")
        assert {a for a in default.argv if a.startswith("--")} == {a for a in allreduce.argv[:-2]
                                                                   if a.startswith("--")}
    assert "--models" in steps[3].argv and "--repeats" in steps[3].argv
    assert [s.workers for s in bench_job.plan(tmp_path, cores=2, quick=True)[1::2]] == [[1, 2, 4], [1, 2, 4]]


def test_bench_passes_more_job_arguments_and_checks_them_before_running(bench_job, tmp_path, capsys):
    args = bench_job.parse_args(["--mnist-args=--window 10 --overlap", "--forecast-args", "--algorithm adag",
                                 "--skip-allreduce"])
    assert args.extra == {"mnist": ["--window", "10", "--overlap"], "forecast": ["--algorithm", "adag"]}
    mnist, forecast = bench_job.plan(tmp_path, cores=2, extra=args.extra, allreduce=False)
    assert mnist.argv[-3:] == ["--window", "10", "--overlap"] and "--overlap" not in forecast.argv
    assert forecast.argv[-2:] == ["--algorithm", "adag"] and "--repeats" in forecast.argv
    refusals = {"--window 0": "jobs/mnist.py refused --mnist-args '--window 0': argument --window",
                "--workers 3": "may not set --workers", "--out=elsewhere": "may not set --out",
                "--epochs '2": "No closing quotation",
                "--overlap": "refused --mnist-args '--overlap' in its all-reduce run (--algorithm allreduce; "
                             "or --skip-allreduce): --overlap needs a delta algorithm"}
    for text, message in refusals.items():
        with pytest.raises(SystemExit):
            bench_job.parse_args([f"--mnist-args={text}"])
        err = capsys.readouterr().err
        assert message in err and err.count("usage:") == 1, err  # only the benchmark's usage, then the reason


def test_bench_rejects_skipping_everything(bench_job, capsys):
    with pytest.raises(SystemExit):
        bench_job.parse_args(["--skip-mnist", "--skip-forecast"])
    assert "nothing to run" in capsys.readouterr().err


def test_bench_summary(bench_job, tmp_path):
    mnist, forecast = bench_job.plan(tmp_path, cores=2, allreduce=False)
    rows = [
        {"model": "gru", "mode": "plain keras (1 thread)", "workers": 0, "epoch_time_s": 10.0,
         "metric_name": "mape", "metric_value": 3.3, "updates": 0, "timing_valid": True},
        {"model": "gru", "mode": "distributed", "workers": 1, "epoch_time_s": 10.0, "metric_name": "mape",
         "metric_value": 3.4, "updates": 100, "timing_valid": True, "target": 3.4, "time_to_target_s": 40.0,
         "target_speedup": 1.0, "target_epochs": 4, "target_steps": 1080},
        {"model": "gru", "mode": "distributed", "workers": 8, "epoch_time_s": 9.0, "metric_name": "mape",
         "metric_value": 4.8, "updates": 800, "timing_valid": False, "target": 3.4, "time_to_target_s": 70.0,
         "target_speedup": 0.57, "target_epochs": 7, "target_steps": 237},
    ]
    write_results(rows, forecast.out, "forecast", metadata={"epochs": 4, "batch_size": 32, "algorithm": "adag",
                                                             "window": 5, "training_windows": 8616})
    path = bench_job.write_summary(tmp_path, [(mnist, 3, 60.0), (forecast, 0, 120.0)],
                                   bench_job.dt.datetime.now(bench_job.dt.timezone.utc), quick=False)
    text = path.read_text()
    assert path == tmp_path / "BENCH.md"
    assert "FAILED with exit code 3" in text and "[mnist.log](mnist/mnist.log)" in text
    assert "![Energy-demand forecasting (LSTM, GRU)](forecast/forecast.png)" in text
    assert "[forecast.md](forecast/forecast.md)" in text
    assert "| 4.80 * |" in text and "time-shared" in text  # the MAPE pivot marks the 8-worker run
    assert "8616" in text
    assert "Time to target (MAPE (%) of the 1-worker run after --epochs" in text
    assert "| gru | 8 * | 3.40 | 1 of 1 |" in text and "| 237" in text  # epochs and steps, not the time


def test_bench_summary_puts_the_default_algorithm_and_allreduce_side_by_side(bench_job, tmp_path):
    mnist, mnist_allreduce = bench_job.plan(tmp_path, cores=2, skip_forecast=True)
    for step, backend, algorithm, time_s in ((mnist, None, "downpour(auto window)", 30.0),
                                            (mnist_allreduce, "jax", "allreduce(every step)", 12.0)):
        rows = [{"model": "cnn", "mode": "plain keras (1 thread)", "workers": 0, "algorithm": "none",
                 "epoch_time_s": 10.0, "metric_name": "accuracy", "metric_value": 0.99, "timing_valid": True},
                {"model": "cnn", "mode": "distributed", "workers": 2, "algorithm": algorithm, "epoch_time_s": time_s,
                 "speedup": 1.5, "metric_name": "accuracy", "metric_value": 0.98, "timing_valid": True}]
        write_results(rows, step.out, "mnist", metadata={"backend": backend, "epochs": 2})
    text = bench_job.write_summary(tmp_path, [(mnist, 0, 60.0), (mnist_allreduce, 0, 60.0)],
                                   bench_job.dt.datetime.now(bench_job.dt.timezone.utc), quick=False).read_text()
    assert "## MNIST CNN: allreduce" in text and "[mnist.log](mnist-allreduce/mnist.log)" in text
    table = text.split("### MNIST CNN: the default algorithm and all-reduce side by side")[1]
    assert "| cnn | 2 | jax | allreduce(every step) | 12.0" in table
    assert "| cnn | 0 | jax | plain keras |" in table and "| downpour(auto window) |" in table


# ------------------------------------------------------- end to end (real Spark)


def _table_after(text: str, header: str) -> list[str]:
    """The Markdown table of `text` whose header line starts with `header`: its lines, header first."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[start:end]


def _empty_columns(table: list[str]) -> list[str]:
    """The columns of a Markdown table (as `_table_after` gives it) with no cell filled in."""
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in table]
    header, body = cells[0], cells[2:]
    return [name for i, name in enumerate(header) if not any(row[i] for row in body)]


# What `make demo` must never show: Spark's log lines, TensorFlow's and absl's banners, py4j's chatter.
CHATTER = re.compile(r"\b(WARN|INFO|DEBUG)\b|oneDNN|cpu_feature_guard|This TensorFlow binary|absl::|"
                     r"py4j|Using Spark's default log4j|NativeCodeLoader|W0000|I0000")


@pytest.mark.spark
@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_the_demo_s_mnist_job_is_quiet_and_reports_every_run(tmp_path):
    """The demo's command (``make demo``: no --master, the job starts its own embedded cluster) at the default
    log level, on fewer images and with a reachable target: cluster up, progress, the result table and where
    the files went, not one line of Spark, TensorFlow or py4j chatter; and every row the MNIST job reports (the
    plain Keras baseline, 1 and 2 workers, the side-by-side comparison, time to target). The job on a standalone
    master (--master) under another backend, at TRAINER_LOG=info: the forecasting job's test."""
    out = tmp_path / "demo"
    result = run_job("mnist", ["--workers", "1,2", "--limit", "1000", "--epochs", "1", "--max-epochs", "2",
                               "--target-accuracy", "0.5", "--fixed-epochs"], out, log_level=None)
    text = (tmp_path / "demo.log").read_text(errors="replace")
    noise = [line for line in text.splitlines() if CHATTER.search(line)]
    assert not noise, "\n".join(noise[:20])
    assert str(out) in text  # says where the results are
    assert len(text.splitlines()) < 60, text  # one screen
    for table in (_table_after(text, "| mode |"), _table_after((out / "mnist.md").read_text(), "| model |")):
        assert not _empty_columns(table), "\n".join(table)

    rows = result["rows"]
    assert result["metadata"]["job"] == "mnist" and not result["metadata"]["master"]
    import keras  # the job's backend is this session's (KERAS_BACKEND): TensorFlow in the main run

    assert result["metadata"]["keras_backend"] == keras.backend.backend()
    assert result["metadata"]["fixed_epochs"] is True
    files = result["metadata"]["data_files"]  # Spark reads the images from Parquet
    assert files["train"] and files["test"] and all(f.endswith(".parquet") for f in files["train"] + files["test"])
    _check_distributed_rows(rows, [1, 2])
    for r in (r for r in rows if r["mode"] == "distributed"):
        # 1,000 images for 2 epochs: 50 % test accuracy comes within the first epoch (0.77-0.83 there in two runs)
        assert r["target"] == 0.5 and r["target_epochs"] == 1 and r["epochs_trained"] == 2
        assert 0 < r["time_to_target_s"] < r["time_s"] and r["target_steps"] == pytest.approx(32 / r["workers"], abs=2)
        assert r["target_speedup"] > 0 and r["final_metric_value"] > 0.5
    assert [r["workers"] for r in rows if r["mode"] != "distributed"] == [0]  # the plain Keras baseline
    one, two = sorted((r for r in rows if r["mode"] == "distributed"), key=lambda r: r["workers"])
    for r in rows:
        assert r["metric_name"] == "accuracy" and 0.1 < r["metric_value"] <= 1.0
        # an embedded cluster: valid while its worker cores fit in this machine's
        assert r["timing_valid"] is timing_valid(r["workers"], 1, None)
        # every epoch's time is kept; s/epoch leaves the first (tracing) out when there are several
        times = r["epoch_times_s"]
        assert len(times) == (2 if r["mode"] == "distributed" else 1)
        assert r["epoch_time_s"] == pytest.approx(times[-1])
    if two["timing_valid"]:  # 2 cores or more (this project's machines): 2 plain Keras processes trained side by
        # side on the 2 workers' halves, and the 2-worker row compared with them
        assert two["side_by_side_samples_per_s"] > 0
        assert two["throughput_vs_side_by_side"] == pytest.approx(
            two["samples_per_s_per_worker"] / two["side_by_side_samples_per_s"])
    assert one["throughput_vs_side_by_side"] == pytest.approx(one["throughput_vs_keras"])


@pytest.mark.spark
@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_forecast_job_on_a_standalone_master_under_the_backend_it_is_given(drivers_cluster, forecast_job, tmp_path):
    """A job on a standalone master (--master: an external cluster, whose timing the job trusts), at
    TRAINER_LOG=info with no large task (`run_job`), under the Keras backend its --backend flag gives the driver,
    which every task of the job uses: the job is a process of its own, so this TensorFlow session runs it under
    torch (that every task uses the driver's backend, under each backend: tests/test_backends.py). Its tables
    leave out the columns no row fills (tests/test_report.py); the MNIST job's rows: the demo's test."""
    pytest.importorskip("torch")
    out, checkpoints = tmp_path / "forecast", tmp_path / "checkpoints"
    result = run_job("forecast", ["--master", drivers_cluster.master_url, "--backend", "torch", "--workers", "1,2",
                                  "--limit", "600", "--epochs", "1", "--max-epochs", "2", "--models", "gru",
                                  "--checkpoint-dir", str(checkpoints)], out)
    meta, rows = result["metadata"], result["rows"]
    assert meta["job"] == "forecast" and meta["hourly_rows"] == 600
    assert meta["keras_backend"] == "torch" and meta["master"] == drivers_cluster.master_url
    assert meta["data_files"] and all(f.endswith(".parquet") for f in meta["data_files"])
    assert meta["training_windows"] == 600 - 24 - 120 and meta["test_windows"] == 120
    for model in ("gru",):  # one model: the LSTM takes the same path (its layers: test_forecast_models_match_the_seed)
        mine = [r for r in rows if r["model"] == model]
        assert sorted(r["workers"] for r in mine) == [0, 1, 2]
        _check_distributed_rows(mine, [1, 2])
        one, two = sorted((r for r in mine if r["workers"] > 0), key=lambda r: r["workers"])
        # The 1-worker run trains --epochs and sets the target: its own MAPE there, reached by then.
        assert one["epochs_trained"] == 1 and one["target"] == pytest.approx(one["metric_by_epoch"][0])
        assert one["target_epochs"] == 1 and one["time_to_target_s"] > 0 and one["target_speedup"] == 1.0
        # The 2-worker run may train --max-epochs for it; reached or not, the fields say which.
        assert two["epochs_trained"] == 2 and two["target"] == one["target"]
        reached = [e for e, v in enumerate(two["metric_by_epoch"]) if v <= one["target"]]
        assert two["target_epochs"] == (reached[0] + 1 if reached else None)
    for r in rows:
        assert r["metric_name"] == "mape" and math.isfinite(r["metric_value"])
        assert 0 < r["metric_value"] < 100  # percent, in original units (scaled values would blow up)
        assert r["timing_valid"] is True and r["window"] == 5 and r["epochs"] == 1
    assert sorted(p.name for p in checkpoints.iterdir()) == ["gru-1w", "gru-2w"]
    # --resume: a later run of the job resumes each model from the checkpoint this run wrote (a repeat's own seed
    # and folder: test_repeated_runs_get_their_own_seed_and_checkpoint_folder; a resumed fit trains only the
    # epochs left: tests/test_backends.py and tests/test_faults.py).
    assert load_checkpoint(checkpoints / "gru-2w").completed_epochs == 2
    again = forecast_job.parse_args(["--checkpoint-dir", str(checkpoints), "--resume", "--models", "gru"])
    assert trainer_options(again, "gru", 2)[1] == {"resume_from": str(checkpoints / "gru-2w")}
    assert trainer_options(again, "gru", 3)[1] == {}  # no checkpoint of 3 workers: that run starts afresh


@pytest.mark.spark
@pytest.mark.timeout(600)
def test_a_large_task_is_reported_at_info_level(tmp_path):
    """The control for the jobs' check: a DataFrame built from a local list ships its rows in the task,
    and at TRAINER_LOG=info Spark's warning reaches the driver's output."""
    script = ("from trainer import spark_session\n"
              "spark = spark_session('local[1]', 'large-task')\n"
              "print(spark.createDataFrame([(i, [0.5] * 100) for i in range(3000)], 'id int, x array<double>').count())\n"
              "spark.stop()\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=500,
                          env={**os.environ, "TRAINER_LOG": "info"}, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "3000" in done.stdout and LARGE_TASK in done.stdout + done.stderr
