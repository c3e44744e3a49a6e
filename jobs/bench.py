"""What `make bench` runs: the MNIST and energy-forecasting scaling jobs, then one summary.

Each job runs as its own process (a Spark driver per process, each on its own
embedded LocalCluster):

* ``jobs/mnist.py`` on the worker counts whose timing is valid on this machine:
  1..cores (on bigger machines 1, 2, 4, ... and the core count);
* ``jobs/forecast.py`` on those counts plus 4 and 8 workers. Where 4 or 8
  workers exceed the cores they are time-shared: their MAPE shows the
  statistical efficiency of training with more workers, their times are
  marked ``timing_valid = False`` and mean nothing. Every set-up runs
  FORECAST_REPEATS times with different seeds (not with ``--quick``): one
  run's MAPE moves by up to a point from seed to seed.

Time to accuracy: both jobs record how long each run took to reach a target
test metric (MNIST 99.0 % accuracy; forecasting the 1-worker MAPE after 4
epochs, with up to FORECAST_MAX_EPOCHS epochs for N > 1 workers), and the
summary has a table of it per job: the time-to-target speed-up where timing
is valid (2 workers here), the epochs and sequential steps (minibatches per
worker) where it is not (4 and 8 time-shared workers).

Every job writes JSON, CSV, markdown and a PNG under ``--out/<job>/`` plus its
console output in ``<job>.log``; ``--out/BENCH.md`` links them and repeats
the tables. Full data is MNIST's 60,000 images for 6 epochs and forecasting
4 epochs with 3 seeds; ``--quick`` is MNIST 6,000 images, 2,000 hours of
demand, 2 epochs and one seed. How long each takes, and what it measured, is
in docs/benchmarks.md.

    python jobs/bench.py --out results
    python jobs/bench.py --quick --skip-mnist
    python jobs/bench.py --dry-run          # print the commands only
    python jobs/bench.py --skip-forecast --mnist-args="--window 10 --overlap"

All-reduce next to the default algorithm: each job runs a second time with
``--algorithm allreduce`` (``trainer.algorithms.allreduce``: the workers form
one group on the Keras backend's collective engine and all-reduce every
step's gradients, no parameter server), under the same backend, on 1, 2 and 4
workers (4 time-shared on a 2-core machine) plus the counts timed above.
``--skip-allreduce`` leaves those runs out; each job's section in BENCH.md
then puts the two side by side.

``--mnist-args`` / ``--forecast-args`` (``make bench MNIST_ARGS=... FORECAST_ARGS=...``)
pass more options to a job (its all-reduce run too), checked by the job's own parser before anything runs.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib
import io
import json
import logging
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.internals import configured_name
from trainer_jobs.support.cli import add_verbose_arg, start_logging
from trainer_jobs.support.published import add_publish_arg, publish
from trainer_jobs.support.report import markdown_table, metric_pivot, run_metadata
from trainer_jobs.support.scaling import step_breakdown_table
from trainer_jobs.support.target import TARGET_COLUMNS, target_table

JOBS_DIR = Path(__file__).resolve().parent

log = logging.getLogger("trainer_jobs.bench")

TIME_SHARED = (4, 8)  # extra forecast worker counts for the statistical-efficiency rows
# One forecast run moves by up to a point of MAPE from seed to seed, as much as the gaps it measures:
# every forecast set-up runs this many times (seeds 0, 1, 2) and the tables show the mean and spread.
FORECAST_REPEATS = 3
FORECAST_MAX_EPOCHS = 8  # N workers may take twice the 1-worker epochs to reach its MAPE
QUICK = {
    "mnist": ["--limit", "6000", "--epochs", "2"],
    "forecast": ["--limit", "2000", "--epochs", "2", "--max-epochs", "4"],
}
JOBS = ("mnist", "forecast")
#: The all-reduce runs: these flags after the job's other arguments, on these worker counts and those timed.
ALLREDUCE = ["--algorithm", "allreduce"]
ALLREDUCE_COUNTS = (1, 2, 4)
SIDE_BY_SIDE = ["model", "workers", "backend", "algorithm", "epoch_time_s", "speedup", "metric_value",
                "time_to_target_s", "target_speedup", "target_epochs", "timing_valid"]
EXAMPLES = {"mnist": "--window 10 --overlap", "forecast": "--algorithm adag"}
TITLES = {"mnist": "MNIST CNN", "forecast": "Energy-demand forecasting (LSTM, GRU)"}
METRICS = {"mnist": "accuracy", "forecast": "MAPE (%)"}
TABLE_COLUMNS = ["model", "mode", "workers", "algorithm", "epoch_time_s", "speedup", "efficiency",
                 "throughput_vs_keras", "throughput_vs_side_by_side", "metric_value", *TARGET_COLUMNS, "updates",
                 "timing_valid"]


@dataclass
class Step:
    """One job run: its name, the command line and where its results go."""

    job: str
    argv: list[str]
    out: Path
    workers: list[int] = field(default_factory=list)
    label: str = ""  # "" for the job's default algorithm, "allreduce" for its all-reduce run

    @property
    def command(self) -> list[str]:
        return [sys.executable, str(JOBS_DIR / f"{self.job}.py"), *self.argv]


def timing_valid_counts(cores: int) -> list[int]:
    """Worker counts of one core each that this machine holds without time-sharing.

    All of 1..cores up to 4 cores; beyond that the powers of two below the
    core count and the core count itself (1, 2, 4, 8, 12 on 12 cores).
    """
    cores = max(1, int(cores))
    if cores <= 4:
        return list(range(1, cores + 1))
    counts = [1]
    while counts[-1] * 2 < cores:
        counts.append(counts[-1] * 2)
    return counts + [cores]


def plan(out: Path, *, quick: bool = False, skip_mnist: bool = False, skip_forecast: bool = False,
         cores: int | None = None, extra: dict[str, list[str]] | None = None, allreduce: bool = True) -> list[Step]:
    """The job runs `make bench` does, in order; ``extra[job]`` is appended to that job's arguments. With
    `allreduce`, each job's run is followed by its all-reduce run (`allreduce_step`)."""
    extra = extra or {}
    cores = cores or os.cpu_count() or 1
    valid = timing_valid_counts(cores)
    steps = []
    if not skip_mnist:
        counts = valid[:2] if quick else valid
        if quick and len(counts) < 2:
            counts = [1, 2]  # a 1-core machine: the 2-worker row is time-shared, still a useful smoke test
        steps.append(Step("mnist", ["--workers", ",".join(map(str, counts)), "--out", str(out / "mnist"),
                                    *(QUICK["mnist"] if quick else []), *extra.get("mnist", [])],
                            out / "mnist", counts))
        if allreduce:
            steps.append(allreduce_step(steps[-1]))
    if not skip_forecast:
        counts = sorted(set(valid[:2] if quick else valid) | set(TIME_SHARED[:1] if quick else TIME_SHARED))
        more = QUICK["forecast"] if quick else ["--repeats", str(FORECAST_REPEATS),
                                                "--max-epochs", str(FORECAST_MAX_EPOCHS)]
        steps.append(Step("forecast", ["--workers", ",".join(map(str, counts)), "--out", str(out / "forecast"),
                                       *more, *extra.get("forecast", [])], out / "forecast", counts))
        if allreduce:
            steps.append(allreduce_step(steps[-1]))
    return steps


def allreduce_step(step: Step) -> Step:
    """`step` again with ``--algorithm allreduce``, on 1, 2 and 4 workers and the counts `step`
    times (not the 8 time-shared ones: every all-reduce step waits for all workers), under ``<out>/<job>-allreduce``
    (with ``--quick`` too)."""
    counts = sorted({n for n in step.workers if n not in TIME_SHARED[1:]} | set(ALLREDUCE_COUNTS))
    out = step.out.with_name(f"{step.job}-allreduce")
    argv = list(step.argv)
    argv[argv.index("--workers") + 1] = ",".join(map(str, counts))
    argv[argv.index("--out") + 1] = str(out)
    return Step(step.job, [*argv, *ALLREDUCE], out, counts, label="allreduce")


def run_step(step: Step) -> tuple[int, float]:
    """Run one job, echoing its output to the console and to ``<out>/<job>.log``; (exit code, seconds)."""
    step.out.mkdir(parents=True, exist_ok=True)
    log_path = step.out / f"{step.job}.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(step.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        try:
            while chunk := proc.stdout.read1(65536):
                log_file.write(chunk)
                sys.stdout.buffer.write(chunk)
                sys.stdout.buffer.flush()
            rc = proc.wait()
        except BaseException:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
    return rc, time.monotonic() - started


def _load_rows(step: Step) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    path = step.out / f"{step.job}.json"
    if not path.is_file():
        return {}, []
    data = json.loads(path.read_text(encoding="utf-8"))
    return data.get("metadata", {}), data.get("rows", [])


def _section(step: Step, rc: int, seconds: float, out: Path) -> list[str]:
    rel = step.out.relative_to(out) if step.out.is_relative_to(out) else step.out
    title = TITLES[step.job] + (f": {step.label}" if step.label else "")
    lines = [f"## {title}", "", f"`{shlex.join(['python', f'jobs/{step.job}.py', *step.argv])}`", ""]
    meta, rows = _load_rows(step)
    status = "finished" if rc == 0 else f"**FAILED with exit code {rc}**"
    lines += [f"{status} in {seconds / 60:.1f} min; console output: [{step.job}.log]({rel}/{step.job}.log)", ""]
    if rc != 0 or not rows:
        if rc == 0:
            lines += ["The job wrote no result rows.", ""]
        return lines
    lines += [
        f"Files: [{step.job}.md]({rel}/{step.job}.md), [{step.job}.csv]({rel}/{step.job}.csv), "
        f"[{step.job}.json]({rel}/{step.job}.json)",
        "",
        f"![{title}]({rel}/{step.job}.png)",
        "",
        markdown_table(rows, [c for c in TABLE_COLUMNS if any(c in r for r in rows)]),
        "",
        metric_pivot(rows, METRICS[step.job]),
        "",
    ]
    if any("time_to_target_s" in r for r in rows):
        target = next((r.get("target") for r in rows if r.get("target") is not None), None)
        lines += [f"Time to target ({METRICS[step.job]} {_target_text(step.job, target)}; time and speed-up "
                  "left out where time-shared):", "", target_table(rows), ""]
    if any(r.get("timing_valid") is False for r in rows):
        lines += ["\\* time-shared: more worker threads than cores, so the time is not valid; the metric is.", ""]
    if breakdown := step_breakdown_table(rows):
        lines += ["Per step, in ms: a step in `fit` (`step_ms`) = `compute_ms` (a step of one of N bare Keras "
                  "processes side by side, fed as workers are) + `wait_ms` (waiting in the all-reduce for the slower "
                  "process) + `allreduce_ms` (one all-reduce of the gradients alone, after a barrier) + "
                  "`framework_ms` (the rest: the local-gradients step's own work, Keras's loop); `epoch_end_ms` is "
                  "the epoch's end (validation, the report to the driver) spread over its steps.", "",
                  breakdown.split("\n", 1)[1], ""]
    if meta.get("epochs"):
        lines += [f"Epochs: {meta['epochs']}, batch size {meta.get('batch_size')}, algorithm "
                  f"{meta.get('algorithm')} (window {meta.get('window')}), training rows "
                  f"{meta.get('training_windows') or meta.get('limit') or 'all'}.", ""]
    return lines


def _side_by_side(*steps: Step) -> list[str]:
    """One table of the rows of `steps` (a job's default-algorithm and all-reduce runs), with each run's backend."""
    rows = []
    for step in steps:
        meta, found = _load_rows(step)
        backend = meta.get("backend") or configured_name()
        rows += [{**r, "backend": backend, "algorithm": r.get("algorithm") if r.get("workers") else "plain keras"}
                 for r in found]
    if not rows:
        return []
    return [f"### {TITLES[steps[0].job]}: the default algorithm and all-reduce side by side", "",
            "Each speed-up is against the 1-worker run of the same algorithm and backend; `workers` 0 is plain Keras "
            "under that backend.", "",
            markdown_table(rows, [c for c in SIDE_BY_SIDE if any(c in r for r in rows)]), ""]


def _target_text(job: str, target: float | None) -> str:
    if job == "forecast":
        return "of the 1-worker run after --epochs, per model and seed"
    return "" if target is None else f"{target:g}"


def write_summary(out: Path, results: list[tuple[Step, int, float]], started: dt.datetime,
                  quick: bool) -> Path:
    """Write ``out/BENCH.md`` from the jobs' JSON results; returns its path."""
    meta = run_metadata()
    total = sum(seconds for _, _, seconds in results)
    lines = [
        "# Benchmarks: speed-up against the number of workers",
        "",
        f"- produced: {meta['timestamp']} on {meta['host']} ({meta['cores']} cores, {meta['usable_cores']} usable), "
        f"started {started.isoformat(timespec='seconds')}, {total / 60:.1f} min in all"
        f"{' (--quick: data subsets, 2 epochs)' if quick else ''}",
        f"- python {meta['python']}; " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()),
        "- `workers` 0 is plain single-process Keras with the same number of threads as one worker "
        "(the framework-overhead baseline); `speedup` = epoch time of 1 worker / epoch time of N "
        "(first epoch left out when there are several); `efficiency` = speedup / N; "
        "`throughput_vs_keras` = samples/s per worker relative to plain Keras; `throughput_vs_side_by_side` "
        "(MNIST) = the same relative to N Keras processes training side by side on the N workers' shares, fed "
        "as workers are, with no exchange: the gap left is the framework's, the rest the machine's.",
        "- `time_to_target_s`: training time until the test metric first reaches the target at an epoch end; "
        "`target_speedup` = that time of 1 worker / that of N; `target_epochs` and `target_steps` (minibatches "
        "per worker) = how far N workers trained to get there. Empty: not reached within the epochs trained.",
        "- `timing_valid` no: the run had more worker threads than this machine has cores "
        "(time-shared), so its times are not comparable; its test metric still shows how "
        "the number of workers affects the model (statistical efficiency).",
        "",
    ]
    for step, rc, seconds in results:
        lines += _section(step, rc, seconds, out)
        default = next((s for s, code, _ in results if s.job == step.job and not s.label and code == 0), None)
        if step.label and rc == 0 and default is not None:
            lines += _side_by_side(default, step)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "BENCH.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results", help="results directory (default results)")
    parser.add_argument("--quick", action="store_true",
                        help="short version: MNIST 6,000 images and forecast 2,000 hours, 2 epochs, fewer workers")
    parser.add_argument("--skip-mnist", action="store_true", help="do not run jobs/mnist.py")
    parser.add_argument("--skip-forecast", action="store_true", help="do not run jobs/forecast.py")
    parser.add_argument("--skip-allreduce", action="store_true",
                        help="do not run the jobs a second time with --algorithm allreduce")
    for job in JOBS:
        parser.add_argument(f"--{job}-args", default="", metavar="ARGS",
                            help=f"more arguments for jobs/{job}.py in one string, e.g. --{job}-args=\"{EXAMPLES[job]}\" "
                                 "(with '=': the string starts with a dash); the workers and the output folder are "
                                 "the benchmark's")
    parser.add_argument("--dry-run", action="store_true", help="print the job commands and exit")
    add_publish_arg(parser, "bench (--quick: bench-quick)")
    add_verbose_arg(parser)
    args = parser.parse_args(argv)
    if args.skip_mnist and args.skip_forecast:
        parser.error("--skip-mnist and --skip-forecast together leave nothing to run.")
    args.extra = {job: _job_args(parser, job, getattr(args, f"{job}_args"),
                                 [] if args.skip_allreduce else ALLREDUCE) for job in JOBS}
    return args


def _job_args(parser: argparse.ArgumentParser, job: str, text: str, allreduce: list[str]) -> list[str]:
    """`text` split as a shell would, checked by the job's own parser now rather than minutes into the run,
    alone and followed by `allreduce` (the flags of the job's all-reduce run, when it has one)."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        parser.error(f"--{job}-args {text!r}: {exc}")
    taken = sorted({w.split("=")[0] for w in words} & {"--workers", "--out"})
    if taken:
        parser.error(f"--{job}-args may not set {', '.join(taken)}: the benchmark picks the worker counts this "
                     "machine can time and writes under --out. Fix: drop them; run the job itself for other "
                     "worker counts.")
    if not words:
        return words
    job_parser = importlib.import_module(f"trainer_jobs.{job}").parse_args
    for more in ([], allreduce) if allreduce else ([],):
        said = io.StringIO()
        try:
            with contextlib.redirect_stderr(said):
                job_parser([*words, *more])
        except SystemExit:  # argparse's usage and "prog: error: ..." went to `said`; keep the error
            refusal = said.getvalue().strip().splitlines()[-1:] or ["(no message)"]
            run = f" in its all-reduce run ({shlex.join(more)}; or --skip-allreduce)" if more else ""
            parser.error(f"jobs/{job}.py refused --{job}-args {text!r}{run}: {refusal[0].partition('error: ')[2]}")
    return words


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start_logging(args, keras=False)  # it only starts the jobs
    out = Path(args.out)
    steps = plan(out, quick=args.quick, skip_mnist=args.skip_mnist, skip_forecast=args.skip_forecast,
                 extra=args.extra, allreduce=not args.skip_allreduce)
    if args.dry_run:
        for step in steps:
            print(shlex.join(step.command))
        return 0
    started = dt.datetime.now(dt.timezone.utc)
    results: list[tuple[Step, int, float]] = []
    for step in steps:
        print(f"running {shlex.join(step.command)}", flush=True)
        rc, seconds = run_step(step)
        print(f"{step.job} finished with exit code {rc} in {seconds / 60:.1f} min", flush=True)
        results.append((step, rc, seconds))
    path = write_summary(out, results, started, args.quick)
    print(f"summary: {path}")
    failed = [step.job for step, rc, _ in results if rc != 0]
    if failed:
        log.error("failed: %s (see %s)", ", ".join(failed), path)
        return 1
    published = publish(args.publish, "bench-quick" if args.quick else "bench",
                        {_step_key(step): _load_rows(step)[1] for step, _, _ in results})
    if published is not None:
        print(f"results file: {published}")
    return 0


def _step_key(step: Step) -> str:
    return step.job + (f" {step.label}" if step.label else "")


if __name__ == "__main__":
    sys.exit(main())
