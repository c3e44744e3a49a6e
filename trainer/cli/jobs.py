"""``train mnist|forecast``, ``select mnist|forecast``, ``bench`` and ``bench NAME``: the bundled jobs and
benchmarks, flags passed through.

The jobs and benchmarks live outside the library (``jobs/`` and ``benchmarks/`` in
the repository, installed as ``trainer_jobs`` and ``trainer_benchmarks``), so this
room imports them by name when one runs and never at import time: the library does
not depend on them. Each parses its own flags, ``--help`` included.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

PROG = "spark-keras-trainer"

#: (command, job) -> (module, one line for the help listing).
JOBS: dict[tuple[str, str], tuple[str, str]] = {
    ("train", "mnist"): ("trainer_jobs.mnist",
                         "the MNIST CNN on N workers for each N in --workers; speed-up and accuracy"),
    ("train", "forecast"): ("trainer_jobs.forecast",
                            "energy-demand forecasting (LSTM/GRU) on N workers; speed-up and MAPE"),
    ("select", "mnist"): ("trainer_jobs.select_mnist",
                          "8 MNIST configurations: model hopper vs task parallel vs sequential"),
    ("select", "forecast"): ("trainer_jobs.select_forecast",
                             "forecasting configurations: model hopper vs the baselines"),
    ("bench", ""): ("trainer_jobs.bench", "the MNIST and forecasting benchmarks; results and BENCH.md under --out"),
    ("bench", "defaults"): ("trainer_benchmarks.bench_defaults", "the defaults (or allreduce) against plain Keras"),
    ("bench", "quality"): ("trainer_benchmarks.bench_quality", "the spread behind the tests' quality floors"),
    ("bench", "staleness"): ("trainer_benchmarks.bench_staleness", "the staleness bound, workers committing in turn"),
    ("bench", "out-of-core"): ("trainer_benchmarks.bench_out_of_core", "a shard in memory vs streamed from disk"),
    ("bench", "ps"): ("trainer_benchmarks.bench_ps", "the parameter server vs raw loopback and an echo"),
    ("bench", "elastic"): ("trainer_benchmarks.bench_elastic", "elastic vs fixed fits losing or gaining a worker"),
    ("bench", "elastic-search"): ("trainer_benchmarks.bench_elastic_search",
                                  "elastic vs fixed model-selection searches losing or gaining a worker"),
    ("bench", "compression"): ("trainer_benchmarks.bench_compression", "compressed commits and replies"),
    ("bench", "security"): ("trainer_benchmarks.bench_security", "what authentication and TLS cost a fit"),
    ("bench", "gpu"): ("trainer_benchmarks.bench_gpu", "the worker loop vs plain Keras on a GPU, no Spark"),
    ("bench", "ring"): ("trainer_benchmarks.bench_ring", "the all-reduce's hop time and bandwidth here"),
    ("bench", "overhead"): ("trainer_benchmarks.profile_overhead", "where a worker's time goes vs plain Keras"),
    ("bench", "scale-model"): ("trainer_benchmarks.scale_model", "the queueing model of speed-up vs workers"),
}


def find_job(argv: Sequence[str]) -> tuple[str, list[str], str] | None:
    """(module, the job's own arguments, its prog name) when `argv` names a bundled job or benchmark."""
    if len(argv) >= 2 and (argv[0], argv[1]) in JOBS:
        return JOBS[(argv[0], argv[1])][0], list(argv[2:]), f"{PROG} {argv[0]} {argv[1]}"
    if len(argv) >= 1 and (argv[0], "") in JOBS:
        return JOBS[(argv[0], "")][0], list(argv[1:]), f"{PROG} {argv[0]}"
    return None


def run_job(module: str, args: list[str], prog: str) -> int:
    """Run ``<module>.main(args)`` with `prog` in its usage lines; returns its exit code."""
    job = importlib.import_module(module)
    saved = sys.argv[0]
    sys.argv[0] = prog  # argparse names the program after argv[0]
    try:
        return int(job.main(args) or 0)
    finally:
        sys.argv[0] = saved


def add_job_parsers(command: str, actions) -> None:
    """List the bundled jobs of `command` under its subparsers (their flags are the jobs' own)."""
    for (name, job), (module, summary) in JOBS.items():
        if name == command and job:
            actions.add_parser(job, help=summary, add_help=False,
                               description=f"{summary}. Flags: `{PROG} {command} {job} --help`.")


def add_bench_parser(sub) -> None:
    module, summary = JOBS[("bench", "")]
    names = ", ".join(job for name, job in JOBS if name == "bench" and job)
    summary += f"; `bench NAME --help`, NAME one of: {names}"
    sub.add_parser("bench", help=summary, add_help=False, description=summary)


def add_select_parser(sub) -> None:
    select = sub.add_parser(
        "select", help="model selection jobs: model hopper parallelism against task parallelism",
        description="Run a bundled model-selection job; every flag after the job's name is the job's own "
                    f"(`{PROG} select mnist --help`).", formatter_class=argparse.RawDescriptionHelpFormatter)
    add_job_parsers("select", select.add_subparsers(dest="job", required=True, metavar="JOB"))
