"""``train mnist|forecast``, ``select mnist|forecast`` and ``bench``: the bundled jobs, flags passed through.

The jobs live outside the library (``jobs/`` in the repository, installed as
``trainer_jobs``), so this room imports them by name when one runs and never at
import time: the library does not depend on them. Each job parses its own flags,
``--help`` included.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

PROG = "spark-keras-trainer"

#: (command, job) -> (module of trainer_jobs, one line for the help listing).
JOBS: dict[tuple[str, str], tuple[str, str]] = {
    ("train", "mnist"): ("mnist", "the MNIST CNN on N workers for each N in --workers; speed-up and accuracy"),
    ("train", "forecast"): ("forecast", "energy-demand forecasting (LSTM/GRU) on N workers; speed-up and MAPE"),
    ("select", "mnist"): ("select_mnist", "8 MNIST configurations: model hopper vs task parallel vs sequential"),
    ("select", "forecast"): ("select_forecast", "forecasting configurations: model hopper vs the baselines"),
    ("bench", ""): ("bench", "the MNIST and forecasting benchmarks; results and BENCH.md under --out"),
}


def find_job(argv: Sequence[str]) -> tuple[str, list[str], str] | None:
    """(trainer_jobs module, the job's own arguments, its prog name) when `argv` names a bundled job."""
    if len(argv) >= 1 and (argv[0], "") in JOBS:
        return JOBS[(argv[0], "")][0], list(argv[1:]), f"{PROG} {argv[0]}"
    if len(argv) >= 2 and (argv[0], argv[1]) in JOBS:
        return JOBS[(argv[0], argv[1])][0], list(argv[2:]), f"{PROG} {argv[0]} {argv[1]}"
    return None


def run_job(module: str, args: list[str], prog: str) -> int:
    """Run ``trainer_jobs.<module>.main(args)`` with `prog` in its usage lines; returns its exit code."""
    job = importlib.import_module(f"trainer_jobs.{module}")
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
    sub.add_parser("bench", help=summary, add_help=False, description=summary)


def add_select_parser(sub) -> None:
    select = sub.add_parser(
        "select", help="model selection jobs: model hopper parallelism against task parallelism",
        description="Run a bundled model-selection job; every flag after the job's name is the job's own "
                    f"(`{PROG} select mnist --help`).", formatter_class=argparse.RawDescriptionHelpFormatter)
    add_job_parsers("select", select.add_subparsers(dest="job", required=True, metavar="JOB"))
